/* ycsb.c - see ycsb.h. Constants are YCSB's (ZipfianGenerator.java). */
#include "bench/ycsb.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define YCSB_ZIPF_THETA    0.99
#define YCSB_ITEM_COUNT    10000000000ull       /* ScrambledZipfian's item space */
#define YCSB_ZETAN_10E10   26.46902820178302    /* zeta(10^10, 0.99), precomputed by YCSB */

const char *const ycsb_op_names[YOP_N] = {"READ", "UPDATE", "INSERT", "SCAN",
					  "READ-MODIFY-WRITE"};

static const struct ycsb_workload workloads[] = {
	{'A', {0.50, 0.50, 0, 0, 0}, YDIST_ZIPFIAN},
	{'B', {0.95, 0.05, 0, 0, 0}, YDIST_ZIPFIAN},
	{'C', {1.00, 0, 0, 0, 0}, YDIST_ZIPFIAN},
	{'D', {0.95, 0, 0.05, 0, 0}, YDIST_LATEST},
	{'E', {0, 0, 0.05, 0.95, 0}, YDIST_ZIPFIAN},
	{'F', {0.50, 0, 0, 0, 0.50}, YDIST_ZIPFIAN},
};

const struct ycsb_workload *ycsb_workload(char name)
{
	for (size_t i = 0; i < sizeof(workloads) / sizeof(workloads[0]); i++)
		if (workloads[i].name == name || workloads[i].name == name - 'a' + 'A')
			return &workloads[i];
	return NULL;
}

/* FNV-1a 64 over the 8 bytes of v, least significant first; then Java's Math.abs. */
uint64_t ycsb_fnv64(uint64_t v)
{
	int64_t h = (int64_t)0xCBF29CE484222325ull;

	for (int i = 0; i < 8; i++) {
		h ^= (int64_t)(v & 0xff);
		h = (int64_t)((uint64_t)h * 1099511628211ull);
		v >>= 8;
	}
	return h < 0 ? (uint64_t)(-(h + 1)) + 1 : (uint64_t)h; /* Math.abs, MIN_VALUE stays */
}

size_t ycsb_key(uint64_t keynum, char *buf, size_t cap)
{
	char digits[20];
	uint64_t v = ycsb_fnv64(keynum);
	size_t n = 0, len;

	do { /* by hand: snprintf would cost as much as a hatchkv GET */
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	len = 4 + n;
	if (len + 1 > cap)
		return 0;
	memcpy(buf, "user", 4);
	for (size_t i = 0; i < n; i++)
		buf[4 + i] = digits[n - 1 - i];
	buf[len] = 0;
	return len;
}

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed)
{
	r->s[0] = seed * 0x9E3779B97F4A7C15ull + 1;
	r->s[1] = (seed ^ 0xD1B54A32D192ED03ull) * 0xBF58476D1CE4E5B9ull + 3;
	for (int i = 0; i < 8; i++)
		ycsb_rand(r);
}

uint64_t ycsb_rand(struct ycsb_rng *r)
{
	uint64_t s0 = r->s[0], s1 = r->s[1], res = s0 + s1;

	s1 ^= s0;
	r->s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
	r->s[1] = (s1 << 37) | (s1 >> 27);
	return res;
}

double ycsb_rand01(struct ycsb_rng *r)
{
	return (double)(ycsb_rand(r) >> 11) * 0x1.0p-53;
}

static double zeta_range(uint64_t from, uint64_t to, double theta, double acc)
{
	for (uint64_t i = from; i < to; i++)
		acc += 1.0 / pow((double)(i + 1), theta);
	return acc;
}

static void zipf_derive(struct ycsb_zipf *z)
{
	z->eta = (1 - pow(2.0 / (double)z->items, 1 - z->theta)) / (1 - z->zeta2 / z->zetan);
}

void ycsb_zipf_init(struct ycsb_zipf *z, uint64_t items, double theta, double zetan)
{
	z->items = items;
	z->theta = theta;
	z->alpha = 1.0 / (1.0 - theta);
	z->zeta2 = zeta_range(0, 2, theta, 0);
	z->zetan = zetan > 0 ? zetan : zeta_range(0, items, theta, 0);
	zipf_derive(z);
}

uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t items)
{
	double u, uz;

	if (items > z->items) { /* the item space grew (workload D): extend zeta */
		z->zetan = zeta_range(z->items, items, z->theta, z->zetan);
		z->items = items;
		zipf_derive(z);
	}
	u = ycsb_rand01(r);
	uz = u * z->zetan;
	if (uz < 1.0)
		return 0;
	if (uz < 1.0 + pow(0.5, z->theta))
		return 1;
	return (uint64_t)((double)z->items * pow(z->eta * u - z->eta + 1, z->alpha));
}

void ycsb_chooser_init(struct ycsb_chooser *c, enum ycsb_dist d, uint64_t records)
{
	c->dist = d;
	c->records = records;
	if (d == YDIST_ZIPFIAN)
		ycsb_zipf_init(&c->z, YCSB_ITEM_COUNT, YCSB_ZIPF_THETA, YCSB_ZETAN_10E10);
	else if (d == YDIST_LATEST)
		ycsb_zipf_init(&c->z, records, YCSB_ZIPF_THETA, 0);
}

uint64_t ycsb_choose(struct ycsb_chooser *c, struct ycsb_rng *r, uint64_t latest)
{
	uint64_t v;

	switch (c->dist) {
	case YDIST_ZIPFIAN: /* ScrambledZipfianGenerator */
		v = ycsb_zipf_next(&c->z, r, YCSB_ITEM_COUNT);
		return ycsb_fnv64(v) % c->records;
	case YDIST_LATEST: /* SkewedLatestGenerator: last inserted minus a Zipfian draw */
		v = ycsb_zipf_next(&c->z, r, latest);
		return latest - 1 - (v < latest ? v : latest - 1);
	default:
		return ycsb_rand(r) % latest;
	}
}

enum ycsb_op ycsb_next_op(const struct ycsb_workload *w, struct ycsb_rng *r)
{
	double u = ycsb_rand01(r), acc = 0;

	for (int i = 0; i < YOP_N; i++) {
		acc += w->p[i];
		if (u < acc)
			return (enum ycsb_op)i;
	}
	return YOP_READ;
}

void ycsb_fill_record(uint8_t *buf, size_t len, struct ycsb_rng *r)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(' ' + ycsb_rand(r) % 95);
}
