/*
 * test_sim.c - the trace reader and the exact simulators (bench/trace.h,
 * bench/sim.h): tiny traces whose hits are worked out by hand below, the
 * CSV reader on good and malformed input and on tests/data/trace_small.csv,
 * and LRU and LFU checked request by request against trivial O(n) models;
 * cache mode's own policy (common/cache_policy.h): its choice, its regret
 * and its window by hand, and in the simulator on the four families.
 *
 * Every item here costs 100 bytes: key_size 2 + value_size VAL +
 * HKV_SIM_ITEM_OVERHEAD, so a capacity of n * 100 holds n items.
 *
 *   test_sim [FIXTURE.csv]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sim.h"
#include "bench/trace.h"
#include "common/cache_policy.h"
#include "hkv_test.h"

HKV_TEST_MAIN_DEFS;

static const char *fixture = "tests/data/trace_small.csv";

#define VAL (100 - 2 - HKV_SIM_ITEM_OVERHEAD) /* a value that makes a 100-byte item */

/* Look-aside gets of the keys in `seq` (one letter or digit a key): the hits. */
static uint64_t replay(struct hkv_sim *s, const char *seq)
{
	uint64_t hits = 0;

	for (; *seq; seq++) {
		struct hkv_trace_req r = {.key = (uint32_t)(uint8_t)*seq, .key_size = 2,
					  .value_size = VAL, .op = HKV_TRACE_GET};

		hits += (uint64_t)hkv_sim_request(s, &r);
	}
	return hits;
}

static struct hkv_sim *sim(enum hkv_sim_policy p, unsigned items)
{
	struct hkv_sim_config cfg = {.policy = p, .cap_bytes = items * 100ull, .nkeys = 256};

	return hkv_sim_create(&cfg);
}

/*
 * LRU holding 2 items, gets A B A C B A:
 *   A miss [A]; B miss [B A]; A hit [A B]; C miss, B out [C A];
 *   B miss, A out [B C]; A miss, C out [A B]   -> 1 hit, A and B cached.
 */
static void test_lru_two_items(void)
{
	struct hkv_sim *s = sim(HKV_SIM_LRU, 2);
	struct hkv_sim_stats st;

	CHECK(s);
	CHECK(replay(s, "ABACBA") == 1);
	CHECK(hkv_sim_cached(s, 'A') && hkv_sim_cached(s, 'B') && !hkv_sim_cached(s, 'C'));
	hkv_sim_stats(s, &st);
	CHECK(st.gets == 6 && st.hits == 1 && st.items == 2 && st.bytes == 200);
	CHECK(st.evictions == 3);
	hkv_sim_destroy(s);
}

/*
 * 3 items; A A A, then a scan 1 2 3 4 5, then A.
 * LFU: A counts 3. 1, 2 fit; 3 evicts 1 (count 1, older than 2), 4
 * evicts 2, 5 evicts 3: ties go to the least recent. A hits at the end:
 * 2 + 1 = 3 hits; 4 and 5 cached, 3 not.
 * LRU: after 1 2 it holds [2 1 A]; 3 evicts A; the final A misses: 2 hits.
 */
static void test_lfu_keeps_frequent(void)
{
	struct hkv_sim *lfu = sim(HKV_SIM_LFU, 3), *lru = sim(HKV_SIM_LRU, 3);

	CHECK(lfu && lru);
	CHECK(replay(lfu, "AAA12345A") == 3);
	CHECK(hkv_sim_cached(lfu, '4') && hkv_sim_cached(lfu, '5') && !hkv_sim_cached(lfu, '3'));
	CHECK(replay(lru, "AAA12345A") == 2);
	hkv_sim_destroy(lfu);
	hkv_sim_destroy(lru);
}

/*
 * 10 items (S's share: 10 % = 1 item); hot set A B C read twice, then a
 * one-pass scan of 12 new keys (a-l), then A B C again.
 * S3-FIFO: A B C miss into S; A B C hit (counts 1). a-g fill S to 10 items.
 * h: room from S (S holds >= 10 %): its tail A was hit -> M (count
 * cleared), B, C likewise, then a (count 0) out to the ghost. i, j, k, l:
 * b, c, d, e out the same way (the ghost keeps at most M's 3 entries).
 * A B C hit in M: 3 + 3 = 6 hits.
 * LRU: 3 hits in the warm-up; h, i, j evict A, B, C; A B C miss: 3 hits.
 */
static void test_s3fifo_scan_resistant(void)
{
	const char *trace = "ABCABC" "abcdefghijkl" "ABC";
	struct hkv_sim *s3 = sim(HKV_SIM_S3FIFO, 10), *lru = sim(HKV_SIM_LRU, 10);
	struct hkv_sim_stats st;

	CHECK(s3 && lru);
	CHECK(replay(s3, trace) == 6);
	CHECK(replay(lru, trace) == 3);
	hkv_sim_stats(s3, &st);
	CHECK(st.items == 10 && st.bytes == 1000 && st.evictions == 5);
	CHECK(!hkv_sim_cached(s3, 'a') && hkv_sim_cached(s3, 'f'));
	hkv_sim_destroy(s3);
	hkv_sim_destroy(lru);
}

/*
 * The ghost: 10 items, S3-FIFO. a-j fill S (counts 0); k evicts a to the
 * ghost - but M is empty, so the ghost (at most M's size) drops it at once.
 * Warm M first: A B C read twice, then a-g fill S; h moves A B C to M and
 * sends a to the ghost (M holds 3). Then a again: a miss, and, being a ghost
 * entry, it goes to M, not S: a later scan through S leaves it cached.
 */
static void test_s3fifo_ghost(void)
{
	struct hkv_sim *s3 = sim(HKV_SIM_S3FIFO, 10);

	CHECK(s3);
	CHECK(replay(s3, "ABCABC" "abcdefgh") == 3);
	CHECK(!hkv_sim_cached(s3, 'a'));
	/* a comes back from the ghost into M; 10 new keys pass through S and
	 * push out S's items, while M (A B C a, all in M) stays */
	CHECK(replay(s3, "a") == 0);
	CHECK(replay(s3, "0123456789") == 0);
	CHECK(hkv_sim_cached(s3, 'a') && hkv_sim_cached(s3, 'A'));
	hkv_sim_destroy(s3);
}

/* Writes and deletes: set stores, an update changes the bytes charged,
 * delete removes; an item larger than the cache is never stored. */
static void test_writes(void)
{
	for (int p = 0; p < HKV_SIM_NPOLICIES; p++) {
		struct hkv_sim *s = sim((enum hkv_sim_policy)p, 4);
		struct hkv_sim_stats st;

		CHECK(s);
		hkv_sim_set(s, 1, 100 - HKV_SIM_ITEM_OVERHEAD);
		hkv_sim_set(s, 2, 100 - HKV_SIM_ITEM_OVERHEAD);
		hkv_sim_set(s, 1, 200 - HKV_SIM_ITEM_OVERHEAD); /* now 200 bytes */
		hkv_sim_stats(s, &st);
		CHECK(st.items == 2 && st.bytes == 300);
		hkv_sim_delete(s, 2);
		hkv_sim_set(s, 3, 1000); /* over 400: not stored */
		hkv_sim_stats(s, &st);
		CHECK(st.items == 1 && st.bytes == 200 && !hkv_sim_cached(s, 3));
		CHECK(hkv_sim_get(s, 1) == 1 && hkv_sim_get(s, 2) == 0);
		hkv_sim_destroy(s);
	}
}

/* ---- against trivial models ---- */

#define MODEL_KEYS 40

struct model {
	int lfu;
	uint64_t cap, bytes, clock;
	int in[MODEL_KEYS];
	uint64_t size[MODEL_KEYS], freq[MODEL_KEYS], last[MODEL_KEYS];
};

/* The victim by a full scan: least recent (LRU), least frequent then
 * least recent (LFU). */
static int model_victim(const struct model *m)
{
	int v = -1;

	for (int k = 0; k < MODEL_KEYS; k++) {
		if (!m->in[k])
			continue;
		if (v < 0 || (m->lfu && m->freq[k] != m->freq[v] ? m->freq[k] < m->freq[v]
								: m->last[k] < m->last[v]))
			v = k;
	}
	return v;
}

static int model_get(struct model *m, int k, uint64_t size)
{
	m->clock++;
	if (m->in[k]) {
		m->freq[k]++;
		m->last[k] = m->clock;
		return 1;
	}
	if (size > m->cap)
		return 0;
	while (m->bytes + size > m->cap) {
		int v = model_victim(m);

		m->in[v] = 0;
		m->bytes -= m->size[v];
	}
	m->in[k] = 1;
	m->size[k] = size;
	m->freq[k] = 1;
	m->last[k] = m->clock;
	m->bytes += size;
	return 0;
}

static void model_run(enum hkv_sim_policy p)
{
	struct hkv_sim_config cfg = {.policy = p, .cap_bytes = 5000, .nkeys = MODEL_KEYS};
	struct hkv_sim *s = hkv_sim_create(&cfg);
	struct model m = {.lfu = p == HKV_SIM_LFU, .cap = 5000};
	uint64_t seed = 12345, hits = 0;

	CHECK(s);
	for (int i = 0; i < 200000; i++) {
		struct hkv_trace_req r = {.key_size = 2, .op = HKV_TRACE_GET};
		int want;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		/* skewed keys: the low ones more often; a fixed size per key */
		r.key = (uint32_t)((seed >> 33) % MODEL_KEYS * ((seed >> 20) % MODEL_KEYS) /
				   MODEL_KEYS);
		r.value_size = 50 + r.key * 37;
		if ((seed >> 10) % 50 == 0) {
			r.op = HKV_TRACE_DELETE;
			if (m.in[r.key]) {
				m.in[r.key] = 0;
				m.bytes -= m.size[r.key];
			}
			hkv_sim_request(s, &r);
			continue;
		}
		want = model_get(&m, (int)r.key, 2 + r.value_size + HKV_SIM_ITEM_OVERHEAD);
		if (hkv_sim_request(s, &r) != want) {
			fprintf(stderr, "%s: request %d (key %u) differs from the model\n",
				hkv_sim_policy_name(p), i, r.key);
			CHECK(0);
		}
		hits += (uint64_t)want;
	}
	CHECK(hits > 1000); /* the trace is not all misses */
	hkv_sim_destroy(s);
}

static void test_lru_model(void)
{
	model_run(HKV_SIM_LRU);
}

static void test_lfu_model(void)
{
	model_run(HKV_SIM_LFU);
}

/* S3-FIFO has no simple model here: its invariants under the same load. */
static void test_s3fifo_bounds(void)
{
	struct hkv_sim_config cfg = {.policy = HKV_SIM_S3FIFO, .cap_bytes = 5000,
				     .nkeys = MODEL_KEYS};
	struct hkv_sim *s = hkv_sim_create(&cfg);
	struct hkv_sim_stats st;
	uint64_t seed = 99, items;

	CHECK(s);
	for (int i = 0; i < 200000; i++) {
		struct hkv_trace_req r = {.key_size = 2, .op = HKV_TRACE_GET};

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		r.key = (uint32_t)((seed >> 33) % MODEL_KEYS * ((seed >> 20) % MODEL_KEYS) /
				   MODEL_KEYS);
		r.value_size = 50 + (uint32_t)((seed >> 45) % 400); /* sizes change: updates */
		r.op = (seed >> 10) % 20 == 0 ? HKV_TRACE_DELETE
		       : (seed >> 10) % 20 == 1 ? HKV_TRACE_SET : HKV_TRACE_GET;
		hkv_sim_request(s, &r);
		hkv_sim_stats(s, &st);
		CHECK(st.bytes <= 5000);
		items = 0;
		for (uint32_t k = 0; k < MODEL_KEYS; k++)
			items += (uint64_t)hkv_sim_cached(s, k);
		CHECK(items == st.items);
	}
	hkv_sim_destroy(s);
}

/* ---- the CSV reader ---- */

static int read_str(struct hkv_trace *t, const char *text, char *err, size_t errlen)
{
	FILE *f = fmemopen((void *)text, strlen(text), "r");
	int ret;

	if (!f)
		return -2;
	ret = hkv_trace_read_csv(t, f, "mem", err, errlen);
	fclose(f);
	return ret;
}

static void test_csv_good(void)
{
	const char *text = "timestamp,key,key_size,value_size,client_id,op,ttl\n"
			   "0,k1,2,100,1,get,0\n"
			   "\n"
			   "1,k2,2,200,1,set,3600\r\n"
			   "2,k1,2,0,2,gets,0\n"
			   "3,a,b,3,50,1,delete,-1\n"
			   "4.5,k2,2,300,1,incr,0";
	struct hkv_trace t;
	char err[256] = "", key[16];

	CHECK(read_str(&t, text, err, sizeof(err)) == 0);
	CHECK(t.n == 5 && t.nkeys == 3);
	CHECK(t.req[0].op == HKV_TRACE_GET && t.req[0].value_size == 100 && t.req[0].key_size == 2);
	CHECK(t.req[1].op == HKV_TRACE_SET && t.req[1].key == 1);
	/* a get with no size takes the key's last one */
	CHECK(t.req[2].key == 0 && t.req[2].value_size == 100);
	/* a key with a comma in it */
	CHECK(t.req[3].op == HKV_TRACE_DELETE && t.req[3].key == 2);
	CHECK(hkv_trace_key(&t, 2, key, sizeof(key)) == 3 && !memcmp(key, "a,b", 3));
	CHECK(t.req[4].op == HKV_TRACE_UPDATE && t.req[4].value_size == 300);
	hkv_trace_free(&t);
}

static void csv_bad(const char *text, const char *want)
{
	struct hkv_trace t;
	char err[256] = "";

	CHECK(read_str(&t, text, err, sizeof(err)) == -1);
	hkv_trace_free(&t);
	if (!strstr(err, want)) {
		fprintf(stderr, "error '%s' does not say '%s'\n", err, want);
		CHECK(0);
	}
}

static void test_csv_malformed(void)
{
	const char *good = "0,k1,2,100,1,get,0\n";
	char text[256];

	snprintf(text, sizeof(text), "%s%s", good, "1,k2,x,100,1,get,0\n");
	CHECK_PASSES(csv_bad(text, "mem:2: key_size"));
	snprintf(text, sizeof(text), "%s\n%s", good, "1,k2,2,100,1,fetch,0\n");
	CHECK_PASSES(csv_bad(text, "mem:3: unknown op"));
	snprintf(text, sizeof(text), "%s%s%s", good, good, "1,k2,2,100,get\n");
	CHECK_PASSES(csv_bad(text, "mem:3: expected 7 fields"));
	/* a header is taken only as the first line */
	snprintf(text, sizeof(text), "%s%s", good, "timestamp,key,key_size,value_size,client_id,op,ttl\n");
	CHECK_PASSES(csv_bad(text, "mem:2: timestamp"));
	CHECK_PASSES(csv_bad("0,,2,100,1,get,0\n", "mem:1: empty key"));
	CHECK_PASSES(csv_bad("0,k,2,100,1,get,\n", "mem:1: client_id or ttl"));
}

/*
 * tests/data/trace_small.csv through LRU with room for everything:
 *   get A miss (fill 12+300+overhead); set A; gets A (size 0 -> 300) hit;
 *   get B miss (fill); add B (present: nothing); incr, decr u:1 (absent:
 *   nothing); get B (size 0 -> 2048) hit; delete A; replace A (absent:
 *   nothing); cas, append, prepend B (present: its size becomes 10+10+overhead).
 *   4 gets, 2 hits; only B cached, 20 + HKV_SIM_ITEM_OVERHEAD bytes.
 */
static void test_csv_fixture(void)
{
	struct hkv_trace t;
	struct hkv_sim_config cfg = {.policy = HKV_SIM_LRU, .cap_bytes = 1 << 20};
	struct hkv_sim *s;
	struct hkv_sim_stats st;
	char err[256] = "";

	CHECK(hkv_trace_load_csv(&t, fixture, err, sizeof(err)) == 0);
	CHECK(t.n == 13 && t.nkeys == 3);
	CHECK(t.req[2].value_size == 300 && t.req[7].value_size == 2048);
	cfg.nkeys = t.nkeys;
	s = hkv_sim_create(&cfg);
	CHECK(s);
	for (uint64_t i = 0; i < t.n; i++)
		hkv_sim_request(s, &t.req[i]);
	hkv_sim_stats(s, &st);
	CHECK(st.gets == 4 && st.hits == 2 && st.items == 1 &&
	      st.bytes == 20 + HKV_SIM_ITEM_OVERHEAD);
	CHECK(hkv_sim_cached(s, 1) && !hkv_sim_cached(s, 0));
	hkv_sim_destroy(s);
	hkv_trace_free(&t);
}

/* A family is the same trace for the same seed, another for another. */
static void test_families_seeded(void)
{
	for (int k = 0; k < 4; k++) {
		struct hkv_trace_family f = {.kind = (enum hkv_trace_family_kind)k, .seed = 7,
					     .keys = 1000, .requests = 20000, .value = 100,
					     .value_max = 8192, .loop_keys = 300};
		struct hkv_trace a, b;

		hkv_trace_family_defaults(&f);
		CHECK(hkv_trace_generate(&a, &f) == 0);
		CHECK(hkv_trace_generate(&b, &f) == 0);
		CHECK(a.n == 20000 && !memcmp(a.req, b.req, a.n * sizeof(*a.req)));
		for (uint64_t i = 0; i < a.n; i++)
			CHECK(a.req[i].key < a.nkeys && a.req[i].value_size >= 100 &&
			      a.req[i].value_size <= 8192);
		hkv_trace_free(&b);
		f.seed = 8;
		CHECK(hkv_trace_generate(&b, &f) == 0);
		CHECK(memcmp(a.req, b.req, a.n * sizeof(*a.req)));
		hkv_trace_free(&a);
		hkv_trace_free(&b);
	}
}

/*
 * Four candidates, each expert nominating 2:
 *   recency   5 1 3 2  -> 1, 3
 *   frequency 0 9 9 1  -> 0, 3
 * Following recency: victims 1 and 3 (in that order), then 0 (frequency's
 * alone); 1 is recency's alone, 3 both's.
 */
static void test_cpol_choose(void)
{
	const int64_t lru[] = {5, 1, 3, 2}, lfu[] = {0, 9, 9, 1};
	const int64_t *const sc[HKV_NEXPERTS] = {lru, lfu};
	int out[4], nv = -1, got;
	unsigned m[4];

	got = hkv_cpol_choose(sc, 4, 2, HKV_EXPERT_LRU, out, m, &nv);
	CHECK(got == 3 && nv == 2);
	CHECK(out[0] == 1 && m[0] == 1 && out[1] == 3 && m[1] == 3 && out[2] == 0 && m[2] == 2);
	got = hkv_cpol_choose(sc, 4, 2, HKV_EXPERT_LFU, out, m, &nv);
	CHECK(got == 3 && nv == 2);
	CHECK(out[0] == 0 && m[0] == 2 && out[1] == 3 && m[1] == 3 && out[2] == 1 && m[2] == 1);
	got = hkv_cpol_choose(sc, 4, 8, HKV_EXPERT_LRU, out, m, &nv); /* k > n */
	CHECK(got == 4 && nv == 4 && out[0] == 1 && out[3] == 0 && m[3] == 3);
	got = hkv_cpol_choose(sc, 0, 2, HKV_EXPERT_LRU, out, m, &nv);
	CHECK(got == 0 && nv == 0);
	got = hkv_cpol_choose(sc, 4, 0, HKV_EXPERT_LFU, out, m, &nv); /* nothing wanted */
	CHECK(got == 0 && nv == 0);
	/* the count saturates; the other 24 bits stay */
	CHECK(hkv_freq_touched(0) == 1 && hkv_freq_touched(0x1ff) == 0x1ff &&
	      hkv_freq_touched(0x100) == 0x101);
	/* expired first for both; frequency breaks ties by age */
	CHECK(hkv_expert_score(HKV_EXPERT_LFU, 0, 200, 5, 1000, 6) == INT64_MIN);
	CHECK(hkv_expert_score(HKV_EXPERT_LFU, 900, 1, 0, 1000, 6) <
	      hkv_expert_score(HKV_EXPERT_LFU, 999, 2, 0, 1000, 6));
	CHECK(hkv_expert_score(HKV_EXPERT_LFU, 900, 1, 0, 1000, 6) <
	      hkv_expert_score(HKV_EXPERT_LFU, 950, 1, 0, 1000, 6));
	CHECK(hkv_expert_score(HKV_EXPERT_LRU, 900, 9, 0, 1000, 6) <
	      hkv_expert_score(HKV_EXPERT_LRU, 950, 1, 0, 1000, 6));
}

/*
 * A cache of 64 items of 1000 B: a window of 32 nominations (the floor).
 * A get of a key one expert alone nominated is that expert's regret, and
 * the next round follows the other; once only (the entry goes); a key both
 * nominated teaches nothing; one nominated more than the window ago, nothing.
 */
static void test_cpol_regret(void)
{
	struct hkv_cpol p;

	hkv_cpol_init(&p, 64 * 1000);
	CHECK(hkv_cpol_accessed(&p, 7) == 0); /* no ghost before an eviction */
	CHECK(hkv_cpol_pick(&p) == HKV_EXPERT_LRU); /* even: recency */
	hkv_cpol_nominated(&p, 1, 1u << HKV_EXPERT_LRU, 1000);
	CHECK(p.window == 32 && p.ghost);
	CHECK(hkv_cpol_accessed(&p, 1) == 1 && p.regrets[HKV_EXPERT_LRU] == 1);
	CHECK(hkv_cpol_pick(&p) == HKV_EXPERT_LFU);
	CHECK(hkv_cpol_accessed(&p, 1) == 0 && p.regrets[HKV_EXPERT_LRU] == 1);
	hkv_cpol_nominated(&p, 2, 3, 1000);
	CHECK(hkv_cpol_accessed(&p, 2) == 1 && p.regrets[0] == 1 && p.regrets[1] == 0);
	hkv_cpol_nominated(&p, 5, 1u << HKV_EXPERT_LFU, 0);
	for (uint64_t h = 6; h < 6 + 40; h++) /* ghost places h % 64: none is 5's */
		hkv_cpol_nominated(&p, h, 1u << HKV_EXPERT_LRU, 0);
	CHECK(hkv_cpol_accessed(&p, 5) == 0 && p.regrets[HKV_EXPERT_LFU] == 0);
	hkv_cpol_nominated(&p, 3, 1u << HKV_EXPERT_LFU, 0);
	hkv_cpol_nominated(&p, 4, 1u << HKV_EXPERT_LFU, 0);
	CHECK(hkv_cpol_accessed(&p, 3) == 1 && hkv_cpol_accessed(&p, 4) == 1);
	CHECK(p.regrets[HKV_EXPERT_LFU] == 2 && hkv_cpol_pick(&p) == HKV_EXPERT_LRU);
	/* another hash in the same place is not the nominated key */
	hkv_cpol_nominated(&p, 9, 1u << HKV_EXPERT_LFU, 0);
	CHECK(hkv_cpol_accessed(&p, 9 + (1ull << 40)) == 0);
	hkv_cpol_fini(&p);
}

/* The footprint of a trace's distinct keys, and how many it has. */
static uint64_t footprint(const struct hkv_trace *t, uint64_t *distinct)
{
	uint8_t *seen = calloc(t->nkeys, 1);
	uint64_t foot = 0;

	*distinct = 0;
	for (uint64_t i = 0; i < t->n && seen; i++)
		if (!seen[t->req[i].key]) {
			seen[t->req[i].key] = 1;
			foot += t->req[i].key_size + t->req[i].value_size + HKV_SIM_ITEM_OVERHEAD;
			++*distinct;
		}
	free(seen);
	return foot;
}

/*
 * Look-aside replay of a generated family (20 000 keys, 400 000 requests,
 * values 100 B-8 KB) through one policy, at 10 % of the Zipf family's
 * footprint (the loop: 1.1x the items that fit): hit %, or -1.
 */
static double family_ratio(enum hkv_trace_family_kind kind, enum hkv_sim_policy pol)
{
	struct hkv_trace_family f = {.kind = HKV_FAMILY_ZIPF, .seed = 42, .keys = 20000,
				     .requests = 400000, .value = 100, .value_max = 8192};
	struct hkv_sim_config cfg = {.policy = pol};
	struct hkv_sim_stats st;
	struct hkv_trace t;
	struct hkv_sim *s;
	uint64_t foot, distinct;

	hkv_trace_family_defaults(&f);
	if (hkv_trace_generate(&t, &f))
		return -1;
	foot = footprint(&t, &distinct);
	hkv_trace_free(&t);
	cfg.cap_bytes = foot / 10;
	f.kind = kind;
	f.loop_keys = distinct ? 11 * cfg.cap_bytes / (10 * (foot / distinct)) : 0;
	if (hkv_trace_generate(&t, &f))
		return -1;
	cfg.nkeys = t.nkeys;
	s = hkv_sim_create(&cfg);
	for (uint64_t i = 0; i < t.n && s; i++)
		hkv_sim_request(s, &t.req[i]);
	if (s)
		hkv_sim_stats(s, &st);
	hkv_sim_destroy(s);
	hkv_trace_free(&t);
	return s ? 100.0 * (double)st.hits / (double)st.gets : -1;
}

/*
 * Issue 32's goal for the policy itself, in the simulator: LRU's hit ratio
 * on every family, and 3 points more on scan and loop (where LRU is known
 * to lose). Where recency is the better expert (shift) the policy follows
 * it, and then only sampling separates it from exact LRU (0.2-0.4 points,
 * docs/benchmarks.md): half a point is allowed there. The same code evicts
 * in cache mode (client/evict.c).
 */
static void test_hkv_families(void)
{
	for (int k = 0; k < 4; k++) {
		double lru = family_ratio((enum hkv_trace_family_kind)k, HKV_SIM_LRU);
		double hkv = family_ratio((enum hkv_trace_family_kind)k, HKV_SIM_HKV);
		double need = k == HKV_FAMILY_SCAN || k == HKV_FAMILY_LOOP ? 3
			      : k == HKV_FAMILY_SHIFT			  ? -0.5
									  : 0;

		fprintf(stderr, "  %-5s lru %.2f%% hkv %.2f%%\n",
		       hkv_trace_family_name((enum hkv_trace_family_kind)k), lru, hkv);
		CHECK(lru > 0 && hkv >= lru + need);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1)
		fixture = argv[1];
	RUN_TEST(test_lru_two_items);
	RUN_TEST(test_lfu_keeps_frequent);
	RUN_TEST(test_s3fifo_scan_resistant);
	RUN_TEST(test_s3fifo_ghost);
	RUN_TEST(test_writes);
	RUN_TEST(test_lru_model);
	RUN_TEST(test_lfu_model);
	RUN_TEST(test_s3fifo_bounds);
	RUN_TEST(test_csv_good);
	RUN_TEST(test_csv_malformed);
	RUN_TEST(test_csv_fixture);
	RUN_TEST(test_families_seeded);
	RUN_TEST(test_cpol_choose);
	RUN_TEST(test_cpol_regret);
	RUN_TEST(test_hkv_families);
	return hkv_test_finish();
}
