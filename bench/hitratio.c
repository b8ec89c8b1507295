/*
 * hatchkv-hitratio - eviction quality of cache mode against exact LRU.
 *
 * One trace of requests over `keys` keys drawn from a Zipfian distribution
 * (theta 0.99 by default; YCSB's generator over exactly the keys) is replayed, look-aside style (get; on a
 * miss, set), against a hatchkv-server started with --cache and sized so its
 * value area is `fraction` of the keys' footprint. The same trace is run
 * through an exact LRU cache holding as many items as the server has blocks
 * of the items' class. Both hit ratios are printed side by side, over the
 * whole trace and after the first `keys` requests (warm).
 *
 *   hatchkv-hitratio [--keys N] [--requests N] [--value BYTES] [--fraction F]
 *                    [--theta T] [--verbs] [--seed S] [--max-gap POINTS]
 *                    [--value-max BYTES]
 *
 * With --value-max each key has its own value size, drawn log-uniformly from
 * [--value, --value-max] (fixed per key): the items fall in many size
 * classes, and exact LRU gets the same memory in bytes (the value area),
 * each item charged its block (its size rounded up to its class) - so the
 * difference is what splitting memory by class and moving segments between
 * classes costs.
 *
 * With --max-gap it exits 1 if hatchkv's hit ratio is more than POINTS below
 * exact LRU's (a check, not a timing: the ratios do not depend on speed).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/ycsb.h"
#include "common/layout.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/support/hkvserver.h"

struct hr_opts {
	uint64_t keys, requests, seed;
	uint32_t value, value_max;
	double fraction, theta, max_gap;
	int verbs;
};

/* Exact LRU over key numbers: arrays as a doubly linked list, O(1) per request. */
struct lru {
	uint64_t cap, size; /* in bytes */
	const uint64_t *isz; /* per key: its item's bytes */
	int64_t *prev, *next; /* -1 = none */
	uint8_t *in;
	int64_t head, tail;   /* head = most recent */
};

static int lru_init(struct lru *l, uint64_t keys, uint64_t cap, const uint64_t *isz)
{
	*l = (struct lru){.cap = cap, .isz = isz, .head = -1, .tail = -1};
	l->prev = malloc(keys * sizeof(int64_t));
	l->next = malloc(keys * sizeof(int64_t));
	l->in = calloc(keys, 1);
	return l->prev && l->next && l->in ? 0 : -1;
}

static void lru_unlink(struct lru *l, int64_t k)
{
	if (l->prev[k] >= 0)
		l->next[l->prev[k]] = l->next[k];
	else
		l->head = l->next[k];
	if (l->next[k] >= 0)
		l->prev[l->next[k]] = l->prev[k];
	else
		l->tail = l->prev[k];
}

static void lru_push(struct lru *l, int64_t k)
{
	l->prev[k] = -1;
	l->next[k] = l->head;
	if (l->head >= 0)
		l->prev[l->head] = k;
	l->head = k;
	if (l->tail < 0)
		l->tail = k;
}

/* One request: 1 on a hit; a miss inserts the key, evicting the LRU one. */
static int lru_access(struct lru *l, int64_t k)
{
	if (l->in[k]) {
		lru_unlink(l, k);
		lru_push(l, k);
		return 1;
	}
	while (l->size + l->isz[k] > l->cap && l->tail >= 0) {
		int64_t victim = l->tail;

		lru_unlink(l, victim);
		l->in[victim] = 0;
		l->size -= l->isz[victim];
	}
	lru_push(l, k);
	l->in[k] = 1;
	l->size += l->isz[k];
	return 0;
}

static void lru_free(struct lru *l)
{
	free(l->prev);
	free(l->next);
	free(l->in);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: hatchkv-hitratio [--keys N] [--requests N] [--value BYTES] "
		   "[--fraction F] [--theta T] [--seed S] [--verbs] [--max-gap POINTS]\n"
		   "       [--value-max BYTES]\n"
		   "  defaults: 100000 keys, 2000000 requests, 1000-byte values, cache = 0.10 of\n"
		   "  the footprint, Zipfian theta 0.99, shm transport\n");
}

static int parse(int argc, char **argv, struct hr_opts *o)
{
	static const struct option lo[] = {
		{"keys", required_argument, NULL, 'k'},   {"requests", required_argument, NULL, 'r'},
		{"value", required_argument, NULL, 'v'},  {"fraction", required_argument, NULL, 'f'},
		{"theta", required_argument, NULL, 't'},  {"seed", required_argument, NULL, 's'},
		{"verbs", no_argument, NULL, 'V'},        {"help", no_argument, NULL, 'h'},
		{"max-gap", required_argument, NULL, 'g'}, {"value-max", required_argument, NULL, 'x'},
		{NULL, 0, NULL, 0}};
	int ch;

	*o = (struct hr_opts){.keys = 100000, .requests = 2000000, .value = 1000, .fraction = 0.10,
			      .theta = 0.99, .seed = 42};
	while ((ch = getopt_long(argc, argv, "k:r:v:f:t:s:Vhg:x:", lo, NULL)) != -1) {
		switch (ch) {
		case 'k': o->keys = strtoull(optarg, NULL, 10); break;
		case 'r': o->requests = strtoull(optarg, NULL, 10); break;
		case 'v': o->value = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'f': o->fraction = strtod(optarg, NULL); break;
		case 't': o->theta = strtod(optarg, NULL); break;
		case 's': o->seed = strtoull(optarg, NULL, 10); break;
		case 'V': o->verbs = 1; break;
		case 'g': o->max_gap = strtod(optarg, NULL); break;
		case 'x': o->value_max = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (o->keys < 100 || !o->requests || o->fraction <= 0 || o->fraction >= 1 ||
	    o->theta <= 0 || o->theta >= 1 || o->value == 0 || o->value > 60000 ||
	    (o->value_max && (o->value_max < o->value || o->value_max > 60000))) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/*
 * The smallest region (in KiB) whose value area holds `want` bytes, with
 * 64 KiB segments and an index of `slots` slots: found with the same
 * geometry code the server uses.
 */
static uint64_t region_kib_for(uint64_t want, uint64_t slots)
{
	struct hkv_geometry g;

	for (uint64_t kib = (want >> 10) + 1024;; kib += 64)
		if (!hkv_geometry_init(&g, kib << 10, 64u << 10, slots, HKV_GEOM_F_CACHE, 0) &&
		    (uint64_t)g.nsegs * g.seg_size >= want)
			return kib;
}

int main(int argc, char **argv)
{
	struct hr_opts o;
	struct ycsb_zipf z;
	struct ycsb_rng rng;
	struct hkv_server_info si;
	struct hkv_client_stats st;
	struct hkvserver srv;
	struct hkv_geometry g;
	struct hkv_client *c;
	struct lru lru;
	uint64_t *trace, hits_lru = 0, hits_hkv = 0, warm_lru = 0, warm_hkv = 0, errors = 0;
	uint64_t item, footprint = 0, slots, cap, gets_rt = 0, *isz;
	uint32_t *vsz, vmax;
	char kib[32], slots_arg[32], key[64];
	const char *extra[] = {"--cache", "--index-slots", slots_arg, NULL};
	uint8_t *val, *buf;
	double t0, secs;
	int cls;

	if (parse(argc, argv, &o))
		return 2;
	if (o.verbs && !hkv_verbs_available()) {
		fprintf(stderr, "hatchkv-hitratio: no RDMA device\n");
		return 1;
	}
	/* one item's block: header + "user..." key (<= 24 B) + value, rounded to its class */
	hkv_geometry_init(&g, 64ull << 20, 64u << 10, 0, HKV_GEOM_F_CACHE, 0);
	vmax = o.value_max ? o.value_max : o.value;
	vsz = malloc(o.keys * sizeof(*vsz));
	isz = malloc(o.keys * sizeof(*isz));
	if (!vsz || !isz)
		return fprintf(stderr, "hatchkv-hitratio: out of memory\n"), 1;
	for (uint64_t k = 0; k < o.keys; k++) {
		/* fixed per key; log-uniform over [value, value_max] */
		double u = (double)(ycsb_fnv64(k ^ 0x5bd1e995ull) % 1000000) / 1e6;

		vsz[k] = o.value_max ? (uint32_t)((double)o.value *
						  exp(u * log((double)vmax / (double)o.value)))
				     : o.value;
		cls = hkv_class_for(&g, (uint32_t)(HKV_BLOCK_HDR + 24 + vsz[k]));
		if (cls < 0)
			return fprintf(stderr, "hatchkv-hitratio: value too large\n"), 1;
		isz[k] = g.class_size[cls];
		footprint += isz[k];
	}
	item = isz[0];
	slots = 1;
	while (slots < 4 * (uint64_t)(o.fraction * (double)o.keys) + 64)
		slots <<= 1; /* the index is never what evicts */
	snprintf(slots_arg, sizeof(slots_arg), "%llu", (unsigned long long)slots);
	snprintf(kib, sizeof(kib), "%lluK",
		 (unsigned long long)region_kib_for((uint64_t)(o.fraction * (double)footprint), slots));
	if (hkvserver_start(&srv, o.verbs, kib, "64K", extra)) {
		fprintf(stderr, "hatchkv-hitratio: cannot start hatchkv-server\n");
		return 1;
	}
	c = hkvserver_client(&srv);
	hkv_server_info(c, &si);
	/* exact LRU's memory: as many blocks as the server's segments hold (one
	 * size), or the value area's bytes (many sizes) */
	cap = o.value_max ? si.value_bytes
			  : si.value_bytes / si.segment_bytes * (si.segment_bytes / item) * item;

	trace = malloc(o.requests * sizeof(*trace));
	val = malloc(vmax);
	buf = malloc(vmax + 64);
	if (!trace || !val || !buf || lru_init(&lru, o.keys, cap, isz)) {
		fprintf(stderr, "hatchkv-hitratio: out of memory\n");
		return 1;
	}
	ycsb_rng_seed(&rng, o.seed);
	ycsb_zipf_init(&z, o.keys, o.theta, 0);
	for (uint64_t i = 0; i < o.requests; i++) /* rank r -> key number: a fixed shuffle */
		trace[i] = ycsb_fnv64(ycsb_zipf_next(&z, &rng, o.keys)) % o.keys;
	memset(val, 'v', vmax);

	for (uint64_t i = 0; i < o.requests; i++) {
		int hit = lru_access(&lru, (int64_t)trace[i]);

		hits_lru += (uint64_t)hit;
		warm_lru += i >= o.keys ? (uint64_t)hit : 0;
	}
	t0 = now_s();
	for (uint64_t i = 0; i < o.requests; i++) {
		size_t klen = ycsb_key(trace[i], key, sizeof(key)), vlen;
		int ret = hkv_get(c, key, klen, buf, vmax + 64, &vlen, NULL);

		if (ret == 0) {
			hits_hkv++;
			warm_hkv += i >= o.keys;
			continue;
		}
		if (ret != HKV_ENOTFOUND || hkv_set(c, key, klen, val, vsz[trace[i]], NULL))
			errors++;
	}
	secs = now_s() - t0;
	hkv_client_stats(c, &st);
	gets_rt = st.op[HKV_OP_GET].round_trips;
	if (o.value_max)
		printf("hit ratio, Zipfian theta %.2f over %llu keys, %llu requests (get; set on a "
		       "miss), values of %u-%u bytes, log-uniform, fixed per key\n",
		       o.theta, (unsigned long long)o.keys, (unsigned long long)o.requests, o.value,
		       o.value_max);
	else
		printf("hit ratio, Zipfian theta %.2f over %llu keys, %llu requests (get; set on a "
		       "miss), %u-byte values (%llu-byte blocks)\n",
		       o.theta, (unsigned long long)o.keys, (unsigned long long)o.requests,
		       o.value, (unsigned long long)item);
	printf("cache: %.1f%% of the %.1f MiB footprint = %.1f MiB for exact LRU (hatchkv-server "
	       "--cache --memory %s: %llu segments of 64 KiB)\n",
	       100.0 * (double)cap / (double)footprint, (double)footprint / 1048576.0,
	       (double)cap / 1048576.0, kib,
	       (unsigned long long)(si.value_bytes / si.segment_bytes));
	printf("%-24s %10s %16s\n", "", "all", "after 1st pass");
	printf("%-24s %9.2f%% %15.2f%%\n", "exact LRU", 100.0 * (double)hits_lru / (double)o.requests,
	       100.0 * (double)warm_lru / (double)(o.requests - o.keys));
	printf("%-24s %9.2f%% %15.2f%%\n", "hatchkv (sampled LRU)",
	       100.0 * (double)hits_hkv / (double)o.requests,
	       100.0 * (double)warm_hkv / (double)(o.requests - o.keys));
	printf("difference: %.2f points (warm: %.2f); hatchkv: %llu evictions, %.3f round trips "
	       "per get, %.0f requests/s, %llu errors\n",
	       100.0 * ((double)hits_lru - (double)hits_hkv) / (double)o.requests,
	       100.0 * ((double)warm_lru - (double)warm_hkv) / (double)(o.requests - o.keys),
	       (unsigned long long)st.evictions, (double)gets_rt / (double)o.requests,
	       (double)o.requests / secs, (unsigned long long)errors);
	/* what moving memory between classes costs: CARVE requests (the server
	 * carves or moves a segment) happen inside the sets that needed them */
	printf("sets: %llu, %.3f round trips each; %llu CARVE request(s) (one per %.0f sets), "
	       "%llu claims (%llu lost), %llu surveys, %llu blocks kept, %llu given back\n",
	       (unsigned long long)st.op[HKV_OP_SET].count,
	       st.op[HKV_OP_SET].count ? (double)st.op[HKV_OP_SET].round_trips /
					 (double)st.op[HKV_OP_SET].count : 0.0,
	       (unsigned long long)st.carves,
	       st.carves ? (double)st.op[HKV_OP_SET].count / (double)st.carves : 0.0,
	       (unsigned long long)st.claims, (unsigned long long)st.claims_lost,
	       (unsigned long long)st.surveys, (unsigned long long)st.blocks_kept,
	       (unsigned long long)st.blocks_given_back);
	hkv_close(c);
	hkvserver_stop(&srv);
	lru_free(&lru);
	free(vsz);
	free(isz);
	free(trace);
	free(val);
	free(buf);
	if (o.max_gap > 0 && 100.0 * ((double)hits_lru - (double)hits_hkv) / (double)o.requests >
				    o.max_gap) {
		printf("FAIL: more than %.1f points below exact LRU\n", o.max_gap);
		return 1;
	}
	return errors ? 1 : 0;
}
