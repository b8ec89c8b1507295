/*
 * trace.h - request traces for the hit-ratio tools: read from a CSV file or
 * generated from a seeded synthetic family.
 *
 * A trace is an array of requests over dense key ids [0, nkeys): the reader
 * interns each distinct key string to an id, the generators draw ids and name
 * them "user" + FNV-1a-64 of the id (ycsb_key), so every consumer - the exact
 * simulators, a hatchkv-server, a memcached over TCP - sees the same requests.
 *
 *   CSV (the public Twitter cache traces' layout), one request a line:
 *
 *     timestamp,key,key_size,value_size,client_id,op,ttl
 *
 *   op: get gets | set | add | replace cas append prepend incr decr | delete.
 *   A header line (first non-blank line whose timestamp is not a number) and
 *   blank lines are skipped; the key is what lies between the first comma
 *   and the fifth from the right, so a key may hold commas. ttl is read and
 *   ignored (the tools replay without expiry). A get whose value_size is 0
 *   takes the key's last non-zero size seen before it (traces record a miss
 *   with size 0; the look-aside fill needs a size).
 *
 *   Families (every request a get; look-aside replay fills each miss):
 *     zipf   Zipfian(theta) over `keys`, rank -> key by a fixed FNV shuffle
 *            (the draw hatchkv-hitratio always made, request for request).
 *     scan   zipf, and after every `scan_every` Zipf requests a one-pass scan
 *            of `scan_len` cold keys never requested before or after.
 *     shift  zipf over a window of `keys` ids that moves by `shift_by` ids
 *            every `shift_every` requests: part of the hot set goes cold,
 *            new keys turn hot.
 *     loop   each request is, with probability loop_frac, the next key of a
 *            cycle over `loop_keys` keys (ids after the Zipf ones), else zipf.
 *   Each key's value size is fixed, log-uniform over [value, value_max]
 *   (value_max 0: all `value`), as hatchkv-hitratio has always drawn them.
 *
 * Single-threaded; a trace owns its memory until hkv_trace_free.
 */
#ifndef HKV_BENCH_TRACE_H
#define HKV_BENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a request does to the cache, the trace's op folded into five kinds. */
enum hkv_trace_op {
	HKV_TRACE_GET,    /* get, gets */
	HKV_TRACE_SET,    /* set: store unconditionally */
	HKV_TRACE_ADD,    /* add: store if absent */
	HKV_TRACE_UPDATE, /* replace cas append prepend incr decr: only if present */
	HKV_TRACE_DELETE, /* delete */
};

struct hkv_trace_req {
	uint32_t key;        /* dense id */
	uint32_t value_size; /* bytes */
	uint16_t key_size;   /* bytes, as the trace says (CSV keys are anonymised) */
	uint8_t op;          /* enum hkv_trace_op */
};

struct hkv_trace {
	struct hkv_trace_req *req;
	uint64_t n, cap;
	uint32_t nkeys;
	/* CSV: the interned key strings (id -> offset into names); NULL when
	 * generated (names are ycsb_key(id)) */
	char *names;
	uint64_t *name_off, names_len, names_cap;
	uint32_t *ht; /* CSV reading: open-addressed id + 1 per slot, 0 = empty */
	uint64_t ht_mask;
};

enum hkv_trace_family_kind { HKV_FAMILY_ZIPF, HKV_FAMILY_SCAN, HKV_FAMILY_SHIFT, HKV_FAMILY_LOOP };

struct hkv_trace_family {
	enum hkv_trace_family_kind kind;
	uint64_t seed, keys, requests;
	uint32_t value, value_max;
	double theta;
	uint64_t scan_every, scan_len;
	uint64_t shift_every, shift_by;
	uint64_t loop_keys;
	double loop_frac;
};

/* Family name ("zipf", "scan", "shift", "loop") -> kind; -1 if unknown. */
int hkv_trace_family_parse(const char *name);
const char *hkv_trace_family_name(enum hkv_trace_family_kind k);
/* Defaults for a family over `keys` keys and `requests` requests (fields a
 * caller sets to 0 before calling are filled; see trace.c for the values). */
void hkv_trace_family_defaults(struct hkv_trace_family *f);

/*
 * Read a CSV trace from f into t (zeroed by the call). Returns 0, or -1 with
 * a message naming `name` and the line number in err (malformed line, key
 * over 65535 bytes, out of memory). t must be freed either way.
 */
int hkv_trace_read_csv(struct hkv_trace *t, FILE *f, const char *name, char *err, size_t errlen);
/* The same from a file path. */
int hkv_trace_load_csv(struct hkv_trace *t, const char *path, char *err, size_t errlen);

/* Generate a family into t (zeroed by the call). 0, or -1 (bad parameters
 * or out of memory; errno EINVAL or ENOMEM). */
int hkv_trace_generate(struct hkv_trace *t, const struct hkv_trace_family *f);

/* Key id's string into buf (not terminated); returns its length, 0 if it
 * does not fit in cap. */
size_t hkv_trace_key(const struct hkv_trace *t, uint32_t key, char *buf, size_t cap);

/* The fixed per-key value size the families use (log-uniform over
 * [value, value_max]). */
uint32_t hkv_trace_value_size(uint64_t key, uint32_t value, uint32_t value_max);

/* Bytes the ids [0, n) of family f cost at item_overhead bytes per item
 * beyond key and value (the simulators charge HKV_SIM_ITEM_OVERHEAD). */
uint64_t hkv_trace_family_bytes(const struct hkv_trace_family *f, uint64_t n,
				uint32_t item_overhead);
/* The loop family's default cycle, slightly more than fits: 1.1x the items
 * cap_bytes holds at f's mean item (f->keys keys, item_overhead each). */
uint64_t hkv_trace_loop_keys_for(const struct hkv_trace_family *f, uint64_t cap_bytes,
				 uint32_t item_overhead);

void hkv_trace_free(struct hkv_trace *t);

#endif
