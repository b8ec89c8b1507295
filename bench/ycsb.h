/*
 * ycsb.h - YCSB's core workload definitions, faithful to CoreWorkload.java:
 * operation mixes of workloads A-F, key names "user" + FNV-1a-64 of the key
 * number, ScrambledZipfian (theta 0.99 over 10^10 items, then hashed into
 * the record count), SkewedLatest for D, uniform, and records of
 * fieldcount x fieldlength bytes.
 */
#ifndef HKV_BENCH_YCSB_H
#define HKV_BENCH_YCSB_H

#include <stddef.h>
#include <stdint.h>

enum ycsb_op { YOP_READ, YOP_UPDATE, YOP_INSERT, YOP_SCAN, YOP_RMW, YOP_N };
enum ycsb_dist { YDIST_ZIPFIAN, YDIST_LATEST, YDIST_UNIFORM };

struct ycsb_workload {
	char name;             /* 'A'..'F' */
	double p[YOP_N];       /* operation proportions */
	enum ycsb_dist dist;
};

extern const char *const ycsb_op_names[YOP_N];

/* The definition of workload A-F; NULL for an unknown letter. */
const struct ycsb_workload *ycsb_workload(char name);

uint64_t ycsb_fnv64(uint64_t v);
/* "user<hash>" into buf; returns its length. */
size_t ycsb_key(uint64_t keynum, char *buf, size_t cap);

/* Per-thread random source (xoshiro-style; never shared). */
struct ycsb_rng {
	uint64_t s[2];
};

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed);
uint64_t ycsb_rand(struct ycsb_rng *r);
double ycsb_rand01(struct ycsb_rng *r);

/* Gray et al. Zipfian over [0, items), with incremental zeta for growth. */
struct ycsb_zipf {
	uint64_t items;
	double theta, alpha, zetan, eta, zeta2;
};

void ycsb_zipf_init(struct ycsb_zipf *z, uint64_t items, double theta, double zetan);
uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t items);

/* Key chooser for the run phase: which existing record an op touches. */
struct ycsb_chooser {
	enum ycsb_dist dist;
	uint64_t records;
	struct ycsb_zipf z;
};

void ycsb_chooser_init(struct ycsb_chooser *c, enum ycsb_dist d, uint64_t records);
/* `latest` = number of records inserted so far (D grows it). */
uint64_t ycsb_choose(struct ycsb_chooser *c, struct ycsb_rng *r, uint64_t latest);
enum ycsb_op ycsb_next_op(const struct ycsb_workload *w, struct ycsb_rng *r);
/* Fill a record value: fieldcount fields of fieldlength random printable bytes. */
void ycsb_fill_record(uint8_t *buf, size_t len, struct ycsb_rng *r);

#endif
