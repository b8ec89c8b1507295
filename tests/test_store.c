/*
 * test_store.c - the store through its public API against a real
 * hatchkv-server process:
 *
 *   test_store shm     (unit tier)
 *   test_store verbs   (rdma tier, Soft-RoCE guest)
 *
 * Semantics of every operation and its error codes, expiry, round trips per
 * operation read from the counters (a multi-get of cold keys: 2), a long random operation sequence checked
 * against an in-memory reference model in a region small enough that blocks
 * are reused all the time, the index load factor when it first fills, and
 * memory coming back from a client that closed.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;

static uint64_t now_ms_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Set keys prefix0, prefix1, ... to val until a set fails or max are stored;
 * *stored = how many were. Returns the error that stopped it (0: max). */
static int fill(struct hkv_client *c, const char *prefix, const void *val, size_t vlen, int max,
		int *stored)
{
	char key[64];
	int ret = 0;

	for (*stored = 0; *stored < max; (*stored)++)
		if ((ret = hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "%s%d", prefix, *stored),
				   val, vlen, NULL)))
			break;
	return ret;
}

static void test_semantics(void)
{
	struct hkvserver s;
	struct hkv_client *c;
	struct hkv_item_info info, info2;
	char buf[256], big[300];
	uint64_t n;
	size_t vlen;

	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(get_str(c, "nope", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(set_str(c, "a", "1"), 0);
	CHECK_RC(get_str(c, "a", buf, sizeof(buf), &info), 0);
	CHECK(!strcmp(buf, "1"));
	CHECK_RC(set_str(c, "a", "two"), 0);
	CHECK_RC(get_str(c, "a", buf, sizeof(buf), &info2), 0);
	CHECK(!strcmp(buf, "two") && info2.version != info.version);
	/* add / replace */
	CHECK_RC(hkv_add(c, "a", 1, "x", 1, NULL), HKV_EEXISTS);
	CHECK_RC(hkv_add(c, "b", 1, "bee", 3, NULL), 0);
	CHECK_RC(hkv_replace(c, "zz", 2, "x", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(c, "b", 1, "B", 1, NULL), 0);
	CHECK_RC(get_str(c, "b", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "B"));
	/* cas against the version of a get */
	CHECK_RC(get_str(c, "a", buf, sizeof(buf), &info), 0);
	CHECK_RC(hkv_cas(c, "a", 1, "three", 5, info.version, NULL), 0);
	CHECK_RC(hkv_cas(c, "a", 1, "four", 4, info.version, NULL), HKV_EVERSION);
	CHECK_RC(hkv_cas(c, "none", 4, "x", 1, info.version, NULL), HKV_ENOTFOUND);
	CHECK_RC(get_str(c, "a", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "three"));
	/* incr / decr, memcached rules */
	CHECK_RC(set_str(c, "n", "10"), 0);
	CHECK_RC(hkv_incr(c, "n", 1, 5, &n), 0);
	CHECK(n == 15);
	CHECK_RC(hkv_decr(c, "n", 1, 100, &n), 0);
	CHECK(n == 0);
	CHECK_RC(set_str(c, "n", "18446744073709551615"), 0);
	CHECK_RC(hkv_incr(c, "n", 1, 2, &n), 0);
	CHECK(n == 1);
	CHECK_RC(hkv_incr(c, "a", 1, 1, &n), HKV_ENOTNUM);
	CHECK_RC(hkv_incr(c, "missing", 7, 1, &n), HKV_ENOTFOUND);
	/* append / prepend keep flags */
	{
		struct hkv_write_opts o = {.flags = 0xabcd};

		CHECK_RC(hkv_set(c, "ap", 2, "mid", 3, &o), 0);
	}
	CHECK_RC(hkv_append(c, "ap", 2, "-end", 4, 0), 0);
	CHECK_RC(hkv_append(c, "ap", 2, "start-", 6, 1), 0);
	CHECK_RC(get_str(c, "ap", buf, sizeof(buf), &info), 0);
	CHECK(!strcmp(buf, "start-mid-end") && info.flags == 0xabcd);
	CHECK_RC(hkv_append(c, "nokey", 5, "x", 1, 0), HKV_ENOTFOUND);
	/* delete */
	CHECK_RC(hkv_delete(c, "b", 1), 0);
	CHECK_RC(hkv_delete(c, "b", 1), HKV_ENOTFOUND);
	CHECK_RC(get_str(c, "b", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	/* limits and bad input */
	memset(big, 'k', sizeof(big));
	CHECK_RC(hkv_set(c, big, 251, "v", 1, NULL), HKV_ETOOBIG);
	CHECK_RC(hkv_set(c, big, 250, "v", 1, NULL), 0);
	CHECK_RC(hkv_get(c, big, 250, buf, sizeof(buf), &vlen, NULL), 0);
	CHECK_RC(hkv_set(c, "", 0, "v", 1, NULL), -EINVAL);
	{
		size_t huge = 128 << 10; /* > a 64 KiB segment */
		char *v = calloc(1, huge);

		CHECK_RC(hkv_set(c, "huge", 4, v, huge, NULL), HKV_ETOOBIG);
		free(v);
	}
	CHECK_RC(hkv_get(c, "ap", 2, buf, 3, &vlen, NULL), -ENOSPC);
	CHECK(vlen == strlen("start-mid-end"));
	/* binary keys and values, empty value */
	{
		const uint8_t bk[4] = {0, 1, 0xff, '\n'}, bv[5] = {0, 0, 7, 0, 0xfe};
		uint8_t out[8];

		CHECK_RC(hkv_set(c, bk, 4, bv, 5, NULL), 0);
		CHECK_RC(hkv_get(c, bk, 4, out, sizeof(out), &vlen, NULL), 0);
		CHECK(vlen == 5 && !memcmp(out, bv, 5));
		CHECK_RC(hkv_set(c, "empty", 5, NULL, 0, NULL), 0);
		CHECK_RC(hkv_get(c, "empty", 5, out, sizeof(out), &vlen, NULL), 0);
		CHECK(vlen == 0);
	}
	/* a view: the value where its READ landed, no copy */
	{
		const void *vp = NULL;
		size_t vl = 0;
		struct hkv_item_info vi;

		CHECK_RC(hkv_set(c, "view", 4, "seen in place", 13, NULL), 0);
		CHECK_RC(hkv_get_view(c, "view", 4, &vp, &vl, &vi), 0);
		CHECK(vp && vl == 13 && !memcmp(vp, "seen in place", 13) && vi.version);
		CHECK_RC(hkv_get_view(c, "noview", 6, &vp, &vl, NULL), HKV_ENOTFOUND);
	}
	/* multi-get */
	{
		struct hkv_mget_item it[4] = {0};
		char b0[16], b1[16], b2[16], b3[16];
		const char *keys[4] = {"a", "nokey", "ap", "n"};
		char *bufs[4] = {b0, b1, b2, b3};

		for (int i = 0; i < 4; i++)
			it[i] = (struct hkv_mget_item){.key = keys[i], .klen = strlen(keys[i]),
						       .buf = bufs[i], .cap = 16};
		CHECK_RC(hkv_mget(c, it, 4), 0);
		CHECK(it[0].status == 0 && it[0].vlen == 5 && !memcmp(b0, "three", 5));
		CHECK(it[1].status == HKV_ENOTFOUND);
		CHECK(it[2].status == 0 && it[2].vlen == 13);
		CHECK(it[3].status == 0 && it[3].vlen == 1 && b3[0] == '1');
	}
	hkv_close(c);
	hkvserver_stop(&s);
}

static void test_expiry(void)
{
	struct hkvserver s;
	struct hkv_client *c;
	/* TTLs count whole seconds of the clock (memcached's rule): a TTL of 1 set
	 * just before a second ticks is gone a moment later; "soon" uses 2 */
	struct hkv_write_opts past = {.exptime = -1}, soon = {.exptime = 2}, later = {.exptime = 100};
	struct hkv_item_info info;
	char buf[64];

	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(hkv_set(c, "gone", 4, "x", 1, &past), 0);
	CHECK_RC(get_str(c, "gone", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(c, "gone", 4, "back", 4, NULL), 0); /* expired counts as absent */
	CHECK_RC(hkv_set(c, "soon", 4, "x", 1, &soon), 0);
	CHECK_RC(hkv_set(c, "later", 5, "y", 1, &later), 0);
	CHECK_RC(get_str(c, "later", buf, sizeof(buf), &info), 0);
	CHECK(info.exptime >= (uint32_t)time(NULL) + 98);
	CHECK_RC(get_str(c, "soon", buf, sizeof(buf), NULL), 0);
	CHECK_RC(hkv_set(c, "dexp", 4, "x", 1, NULL), 0);
	CHECK_RC(hkv_touch(c, "dexp", 4, -1), 0); /* expired, its location freshly cached */
	CHECK_RC(hkv_delete(c, "dexp", 4), HKV_ENOTFOUND); /* so there was nothing to delete */
	sleep(3);
	CHECK_RC(get_str(c, "soon", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(c, "soon", 4, "z", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_touch(c, "later", 5, -1), 0);
	CHECK_RC(get_str(c, "later", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	hkv_close(c);
	hkvserver_stop(&s);
}

static uint64_t rt_of(struct hkv_client *c, enum hkv_op op, uint64_t *bytes_read)
{
	struct hkv_client_stats st;

	hkv_client_stats(c, &st);
	if (bytes_read)
		*bytes_read = st.op[op].bytes_read;
	return st.op[op].round_trips;
}

/* Multi-get of keys no location cache knows: the first READs of a batch
 * (buckets of the cold keys, blocks of the cached ones) go out in one
 * chain, then every candidate block in one more: 2 round trips for as many
 * cold keys as one chain holds (one at a time they take 2 each); then
 * warm, 1. A larger batch: the candidates of one chain ride with the
 * buckets of the next. Values of many sizes, some keys absent, some larger
 * than the caller's buffer, each checked; candidates that overflow a small
 * handle's read buffer; views that went stale. And with a writer replacing
 * and deleting the keys meanwhile, every value a cold multi-get returns is
 * one its key had (its own name, a generation, the pad that generation
 * wrote). */
#define MG_KEYS 200

static int mg_fmt(char *out, size_t cap, int key, unsigned gen)
{
	int n = snprintf(out, cap, "mg:%d:%u:", key, gen);
	int pad = (int)((key * 37u + gen * 101u) % 3000u);

	if (n + pad > (int)cap)
		pad = (int)cap - n;
	memset(out + n, 'a' + (int)(gen % 26), (size_t)pad);
	return n + pad;
}

/* Is v (len bytes) a value key had? */
static int mg_valid(const char *v, size_t len, int key)
{
	char want[3200], head[32];
	unsigned gen;
	int n = snprintf(head, sizeof(head), "mg:%d:", key);

	if (len < (size_t)n || memcmp(v, head, (size_t)n) || sscanf(v + n, "%u", &gen) != 1)
		return 0;
	return (size_t)mg_fmt(want, sizeof(want), key, gen) == len && !memcmp(v, want, len);
}

struct mg_writer {
	struct hkv_client *c;
	atomic_int stop;
	unsigned gens;
};

static void *mg_write(void *arg)
{
	struct mg_writer *w = arg;
	char k[32], v[3200];

	for (unsigned gen = 1; !atomic_load(&w->stop); gen++, w->gens++) {
		int key = (int)((gen * 7919u) % 64u);
		int n = mg_fmt(v, sizeof(v), key, gen);

		snprintf(k, sizeof(k), "mg:%d", key);
		if (gen % 7 == 0)
			hkv_delete(w->c, k, strlen(k));
		else
			hkv_set(w->c, k, strlen(k), v, (size_t)n, NULL);
	}
	return NULL;
}

/* Did a multi-get answer key i (as first set: generation 0) right? Every
 * fifth key is absent; a buffer too small gives -ENOSPC and the length. */
static int mg_right(const struct hkv_mget_item *m, int i)
{
	char v[3200];
	int n = mg_fmt(v, sizeof(v), i, 0);

	if (i % 5 == 4)
		return m->status == HKV_ENOTFOUND;
	if ((size_t)n > m->cap)
		return m->status == -ENOSPC && m->vlen == (size_t)n;
	return m->status == 0 && m->vlen == (size_t)n && !memcmp(m->buf, v, (size_t)n);
}

/* How many of it[0, n) (keys first .. first + n - 1) were answered wrong. */
static int mg_wrong(const struct hkv_mget_item *it, int first, int n)
{
	int wrong = 0;

	for (int i = 0; i < n; i++)
		if (!mg_right(&it[i], first + i) && wrong++ < 5)
			fprintf(stderr, "mg:%d: status %d, %zu bytes\n", first + i, it[i].status,
				it[i].vlen);
	return wrong;
}

static uint64_t ops_of(struct hkv_client *c, enum hkv_op op)
{
	struct hkv_client_stats st;

	hkv_client_stats(c, &st);
	return st.op[op].count;
}

static void test_mget_cold(void)
{
	static char bufs[MG_KEYS][3200], big[100000];
	static struct hkv_mget_item it[MG_KEYS], it2[MG_KEYS];
	struct hkvserver s;
	struct hkv_client *c, *cold, *mix, *small, *nocache;
	struct hkv_client_stats st;
	struct hkv_config *cfg;
	struct mg_writer w = {0};
	pthread_t thr;
	char k[MG_KEYS][32], v[3200];
	uint64_t rt0, rt1, g0, stale0;
	int bad = 0, rounds = 0, found = 0, enospc = 0, expect, n2;

	CHECK(hkvserver_start(&s, use_verbs, "64M", "256K", NULL) == 0);
	c = hkvserver_client(&s);
	for (int i = 0; i < MG_KEYS; i++) {
		int n = mg_fmt(v, sizeof(v), i, 0);

		snprintf(k[i], sizeof(k[i]), "mg:%d", i);
		if (i % 5 != 4) /* every fifth key absent */
			CHECK_RC(hkv_set(c, k[i], strlen(k[i]), v, (size_t)n, NULL), 0);
		it[i] = (struct hkv_mget_item){.key = k[i], .klen = strlen(k[i]), .buf = bufs[i],
					       .cap = sizeof(bufs[i])};
	}
	cold = hkvserver_client(&s); /* a config of its own: an empty location cache */
	rt0 = rt_of(cold, HKV_OP_MGET, NULL);
	CHECK_RC(hkv_mget(cold, it, 32), 0);
	rt1 = rt_of(cold, HKV_OP_MGET, NULL);
	printf("# multi-get of 32 cold keys: %llu round trips\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 2);
	CHECK(mg_wrong(it, 0, 32) == 0);
	rt0 = rt1;
	CHECK_RC(hkv_mget(cold, it, 32), 0); /* now warm (the absent keys: their buckets) */
	rt1 = rt_of(cold, HKV_OP_MGET, NULL);
	printf("# the same 32 keys again: %llu round trip(s)\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 1);
	/* 168 cold keys: their 336 bucket READs fit one chain if the send queue
	 * holds them; with 256 places, 128 keys' go in the first chain, the
	 * rest with those keys' candidates in the second, theirs in a third */
	rt0 = rt1;
	g0 = ops_of(cold, HKV_OP_GET);
	CHECK_RC(hkv_mget(cold, it + 32, MG_KEYS - 32), 0);
	rt1 = rt_of(cold, HKV_OP_MGET, NULL);
	expect = 2 * (MG_KEYS - 32) <= cold->conn->sq_depth ? 2 : 3;
	printf("# multi-get of %d cold keys: %llu round trips (send queue %d)\n", MG_KEYS - 32,
	       (unsigned long long)(rt1 - rt0), cold->conn->sq_depth);
	CHECK(rt1 - rt0 == (uint64_t)expect);
	CHECK(mg_wrong(it + 32, 32, MG_KEYS - 32) == 0);
	CHECK(ops_of(cold, HKV_OP_GET) == g0); /* none took the single-key path */

	/* warm and cold keys in one batch, some buffers too small: 48 cached
	 * blocks and 72 bucket pairs in one chain, the candidates in one more */
	mix = hkvserver_client(&s);
	CHECK_RC(hkv_mget(mix, it, 60), 0); /* caches the 48 present keys of 0..59 */
	for (int i = 0; i < 120; i++)
		if (i % 7 == 3)
			it[i].cap = 8;
	rt0 = rt_of(mix, HKV_OP_MGET, NULL);
	CHECK_RC(hkv_mget(mix, it, 120), 0);
	rt1 = rt_of(mix, HKV_OP_MGET, NULL);
	for (int i = 0; i < 120; i++)
		enospc += it[i].status == -ENOSPC;
	printf("# multi-get of 48 warm and 72 cold keys (%d buffers too small): %llu round trips\n",
	       enospc, (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 2);
	CHECK(mg_wrong(it, 0, 120) == 0);
	CHECK(enospc > 10);
	for (int i = 0; i < MG_KEYS; i++)
		it[i].cap = sizeof(bufs[i]);

	/* candidates that overflow the read buffer (a handle with 4 KB values:
	 * 64 KiB) wait for the next chains; a value larger than the handle
	 * takes the single-key path (HKV_ETOOBIG), no other key does */
	cfg = hkvserver_config(&s);
	hkv_config_set_max_value(cfg, 4096);
	CHECK_RC(hkv_open(cfg, &small), 0);
	hkv_config_free(cfg);
	memset(big, 'b', sizeof(big));
	CHECK_RC(hkv_set(c, "mg:big", 6, big, sizeof(big), NULL), 0);
	n2 = MG_KEYS - 32;
	memcpy(it2, it + 32, (size_t)n2 * sizeof(it2[0]));
	it2[n2++] = (struct hkv_mget_item){.key = "mg:big", .klen = 6, .buf = v, .cap = sizeof(v)};
	g0 = ops_of(small, HKV_OP_GET);
	rt0 = rt_of(small, HKV_OP_MGET, NULL);
	CHECK_RC(hkv_mget(small, it2, (size_t)n2), 0);
	rt1 = rt_of(small, HKV_OP_MGET, NULL);
	printf("# multi-get of %d cold keys through a %zu KiB read buffer: %llu round trips "
	       "(%llu of them the single-key path's)\n", n2, small->read_cap >> 10,
	       (unsigned long long)(rt1 - rt0), (unsigned long long)rt_of(small, HKV_OP_GET, NULL));
	CHECK(small->read_cap < 128 * 1024);
	CHECK(rt1 - rt0 > 3 && rt1 - rt0 <= 12);
	CHECK(mg_wrong(it2, 32, MG_KEYS - 32) == 0);
	CHECK(it2[n2 - 1].status == HKV_ETOOBIG);
	CHECK(ops_of(small, HKV_OP_GET) == g0 + 1);

	/* every view stale (the bound made 1 ns): no key is answered from one;
	 * each key's buckets are read again a few times, then the single-key
	 * path gives up (HKV_EAGAIN; an absent key: no candidate, a miss) */
	cfg = hkvserver_config(&s);
	hkv_config_set_cache_entries(cfg, 0);
	hkv_config_set_timeout_ms(cfg, 300);
	CHECK_RC(hkv_open(cfg, &nocache), 0);
	hkv_config_free(cfg);
	hkv_client_stats(nocache, &st);
	stale0 = st.stale_views;
	hkv_test_view_max_ns = 1;
	CHECK_RC(hkv_mget(nocache, it + 3, 2), 0); /* mg:3 is there, mg:4 is not */
	hkv_test_view_max_ns = 0;
	hkv_client_stats(nocache, &st);
	printf("# multi-get of 2 keys with every view stale: %llu stale views, %llu round trips, "
	       "answers %s, %s\n", (unsigned long long)(st.stale_views - stale0),
	       (unsigned long long)st.op[HKV_OP_MGET].round_trips, hkv_strerror(it[3].status),
	       hkv_strerror(it[4].status));
	CHECK(it[3].status == HKV_EAGAIN);
	CHECK(it[4].status == HKV_ENOTFOUND || it[4].status == HKV_EAGAIN);
	CHECK(st.stale_views > stale0);
	hkv_close(nocache);

/* under a writer: a handle without a location cache (every key cold) */
	cfg = hkvserver_config(&s);
	hkv_config_set_cache_entries(cfg, 0);
	CHECK_RC(hkv_open(cfg, &nocache), 0);
	hkv_config_free(cfg);
	w.c = c;
	pthread_create(&thr, NULL, mg_write, &w);
	for (uint64_t t0 = now_ms_mono(); now_ms_mono() - t0 < 2000; rounds++) {
		CHECK_RC(hkv_mget(nocache, it, MG_KEYS), 0);
		for (int i = 0; i < MG_KEYS; i++) {
			if (it[i].status == HKV_ENOTFOUND)
				continue;
			found++;
			if (it[i].status || !mg_valid(bufs[i], it[i].vlen, i)) {
				if (bad++ < 5)
					fprintf(stderr, "mg:%d: status %d, %zu bytes: not a value it had\n",
						i, it[i].status, it[i].vlen);
			}
		}
	}
	atomic_store(&w.stop, 1);
	pthread_join(thr, NULL);
	printf("# %d cold multi-gets of %d keys beside %u writes: %d values read, %d wrong\n",
	       rounds, MG_KEYS, w.gens, found, bad);
	CHECK(bad == 0 && found > 0 && w.gens > 0);
	hkv_close(nocache);
	hkv_close(small);
	hkv_close(mix);
	hkv_close(cold);
	hkv_close(c);
	hkvserver_stop(&s);
}

/* The round-trip budget of each operation, from the transport counters. */
/* hkv_delete_if / hkv_append_if act only on the item of the version given;
 * hkv_last_version says what a write stored. */
static void test_versioned(void)
{
	struct hkvserver s;
	struct hkv_client *c, *c2;
	struct hkv_item_info info;
	char buf[64];
	uint64_t v1;

	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	c2 = hkvserver_client(&s);
	CHECK_RC(set_str(c, "vk", "one"), 0);
	v1 = hkv_last_version(c);
	CHECK_RC(get_str(c2, "vk", buf, sizeof(buf), &info), 0);
	CHECK(info.version == v1);
	CHECK_RC(hkv_append_if(c2, "vk", 2, "+", 1, 0, v1 + 1), HKV_EVERSION);
	CHECK_RC(hkv_delete_if(c2, "vk", 2, v1 + 1), HKV_EVERSION);
	CHECK_RC(get_str(c, "vk", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "one"));
	CHECK_RC(hkv_append_if(c2, "vk", 2, "+", 1, 0, v1), 0);
	CHECK(hkv_last_version(c2) != v1);
	CHECK_RC(hkv_append_if(c, "vk", 2, "-", 1, 1, v1), HKV_EVERSION); /* v1 is gone */
	CHECK_RC(get_str(c, "vk", buf, sizeof(buf), &info), 0);
	CHECK(!strcmp(buf, "one+") && info.version == hkv_last_version(c2));
	CHECK_RC(hkv_append_if(c, "vk", 2, "-", 1, 1, info.version), 0); /* prepend */
	CHECK_RC(set_str(c2, "vk", "-one+"), 0); /* the same bytes, a new write */
	CHECK_RC(hkv_delete_if(c, "vk", 2, hkv_last_version(c)), HKV_EVERSION);
	CHECK_RC(hkv_delete_if(c, "vk", 2, hkv_last_version(c2)), 0);
	CHECK_RC(get_str(c, "vk", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_delete_if(c, "vk", 2, v1), HKV_ENOTFOUND);
	CHECK_RC(hkv_append_if(c, "vk", 2, "x", 1, 0, v1), HKV_ENOTFOUND);
	hkv_close(c);
	hkv_close(c2);
	hkvserver_stop(&s);
}

static void test_round_trips(void)
{
	struct hkvserver s;
	struct hkv_client *c, *c2;
	char val[1000], buf[1100];
	uint64_t rt0, rt1, b0, b1;
	size_t vlen;

	memset(val, 'v', sizeof(val));
	CHECK(hkvserver_start(&s, use_verbs, "32M", "256K", NULL) == 0);
	c = hkvserver_client(&s);
	c2 = hkvserver_client(&s);
	CHECK_RC(hkv_set(c, "warm-up", 7, val, sizeof(val), NULL), 0); /* claims a segment */
	rt0 = rt_of(c, HKV_OP_SET, NULL);
	CHECK_RC(hkv_set(c, "key", 3, val, sizeof(val), NULL), 0); /* cold insert */
	rt1 = rt_of(c, HKV_OP_SET, NULL);
	printf("# insert: %llu round trips\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 <= 3);
	rt0 = rt1;
	CHECK_RC(hkv_set(c, "key", 3, val, sizeof(val), NULL), 0); /* warm update */
	rt1 = rt_of(c, HKV_OP_SET, NULL);
	printf("# warm update: %llu round trips\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 1);
	rt0 = rt_of(c, HKV_OP_GET, &b0);
	CHECK_RC(hkv_get(c, "key", 3, buf, sizeof(buf), &vlen, NULL), 0); /* warm get */
	rt1 = rt_of(c, HKV_OP_GET, &b1);
	printf("# warm get: %llu round trips, %llu bytes read for a %zu-byte block\n",
	       (unsigned long long)(rt1 - rt0), (unsigned long long)(b1 - b0), HKV_BLOCK_HDR + 3 + vlen);
	CHECK(rt1 - rt0 == 1);
	CHECK(b1 - b0 <= HKV_BLOCK_HDR + 3 + vlen + 64);
	rt0 = rt_of(c2, HKV_OP_GET, NULL);
	CHECK_RC(hkv_get(c2, "key", 3, buf, sizeof(buf), &vlen, NULL), 0); /* cold get */
	rt1 = rt_of(c2, HKV_OP_GET, NULL);
	printf("# cold get: %llu round trips\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 2);
	CHECK(vlen == sizeof(val) && !memcmp(buf, val, vlen));
	rt0 = rt_of(c, HKV_OP_DELETE, NULL);
	CHECK_RC(hkv_delete(c, "key", 3), 0); /* warm delete */
	rt1 = rt_of(c, HKV_OP_DELETE, NULL);
	printf("# warm delete: %llu round trips\n", (unsigned long long)(rt1 - rt0));
	CHECK(rt1 - rt0 == 2); /* [READ header, CAS meta] | [CAS slot]: the mark first */
	CHECK_RC(hkv_get(c2, "key", 3, buf, sizeof(buf), &vlen, NULL), HKV_ENOTFOUND);
	hkv_close(c2);
	hkv_close(c);
	hkvserver_stop(&s);
}

#define FUZZ_KEYS 300
#define FUZZ_OPS  30000

struct model {
	int present;
	uint32_t len;
	uint32_t seed;
};

static void make_value(uint8_t *v, uint32_t len, uint32_t seed)
{
	for (uint32_t i = 0; i < len; i++)
		v[i] = (uint8_t)(seed * 2654435761u >> (i % 24)) ^ (uint8_t)i;
}

/* Random operations by one client, checked against a trivial map. */
static void test_reference_fuzz(void)
{
	static struct model m[FUZZ_KEYS];
	static uint8_t val[9000], got[9000];
	struct hkvserver s;
	struct hkv_client *c;
	char key[32];
	unsigned seed = 12345;

	CHECK(hkvserver_start(&s, use_verbs, "6M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	memset(m, 0, sizeof(m));
	for (int i = 0; i < FUZZ_OPS; i++) {
		int kid = (int)(rand_r(&seed) % FUZZ_KEYS), op = (int)(rand_r(&seed) % 10), ret;
		size_t klen = (size_t)snprintf(key, sizeof(key), "key-%d", kid), vlen;
		uint32_t len = (uint32_t)(rand_r(&seed) % 4 == 0 ? rand_r(&seed) % 9000
								 : rand_r(&seed) % 200);
		uint32_t vs = (uint32_t)rand_r(&seed);

		make_value(val, len, vs);
		if (op < 4) {
			ret = hkv_get(c, key, klen, got, sizeof(got), &vlen, NULL);
			if (m[kid].present) {
				CHECK_RC(ret, 0);
				make_value(val, m[kid].len, m[kid].seed);
				CHECK(vlen == m[kid].len && !memcmp(got, val, vlen));
			} else {
				CHECK_RC(ret, HKV_ENOTFOUND);
			}
		} else if (op < 7) {
			CHECK_RC(hkv_set(c, key, klen, val, len, NULL), 0);
			m[kid] = (struct model){1, len, vs};
		} else if (op == 7) {
			ret = hkv_add(c, key, klen, val, len, NULL);
			CHECK_RC(ret, m[kid].present ? HKV_EEXISTS : 0);
			if (!ret)
				m[kid] = (struct model){1, len, vs};
		} else if (op == 8) {
			ret = hkv_replace(c, key, klen, val, len, NULL);
			CHECK_RC(ret, m[kid].present ? 0 : HKV_ENOTFOUND);
			if (!ret)
				m[kid] = (struct model){1, len, vs};
		} else {
			CHECK_RC(hkv_delete(c, key, klen), m[kid].present ? 0 : HKV_ENOTFOUND);
			m[kid].present = 0;
		}
	}
	{
		struct hkv_client_stats st;

		hkv_client_stats(c, &st);
		printf("# fuzz: %d ops, %llu blocks freed, %llu claimed in %llu claims, %llu carves\n",
		       FUZZ_OPS, (unsigned long long)st.blocks_freed,
		       (unsigned long long)st.blocks_claimed, (unsigned long long)st.claims,
		       (unsigned long long)st.carves);
		CHECK(st.blocks_freed > 0 && st.blocks_claimed > 0);
	}
	hkv_close(c);
	hkvserver_stop(&s);
}

/* Insert until the index refuses: how full is it then? */
static void test_load_factor(void)
{
	const char *extra[] = {"--index-slots", "8192", NULL};
	struct hkvserver s;
	struct hkv_client *c;
	char key[32];
	int n = 0, ret = 0;

	CHECK(hkvserver_start(&s, use_verbs, "32M", "256K", extra) == 0);
	c = hkvserver_client(&s);
	while (n < 20000) {
		size_t klen = (size_t)snprintf(key, sizeof(key), "lf-%d", n);

		ret = hkv_set(c, key, klen, "v", 1, NULL);
		if (ret)
			break;
		n++;
	}
	printf("# index of 8192 slots: first insert failure after %d items (%.1f%% full): %s\n", n,
	       100.0 * n / 8192, hkv_strerror(ret));
	CHECK_RC(ret, HKV_EFULL);
	CHECK(n >= 0.85 * 8192);
	hkv_close(c);
	hkvserver_stop(&s);
}

/* A client fills the store and closes; its memory serves the next client. */
static void test_memory_returns(void)
{
	struct hkvserver s;
	struct hkv_client *c;
	char key[32], val[2000];
	int n1 = 0, n2 = 0;

	memset(val, 'm', sizeof(val));
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(fill(c, "a-", val, sizeof(val), INT_MAX, &n1), HKV_EFULL);
	for (int i = 0; i < n1; i++)
		CHECK_RC(hkv_delete(c, key, (size_t)snprintf(key, sizeof(key), "a-%d", i)), 0);
	hkv_close(c);
	c = hkvserver_client(&s);
	(void)fill(c, "b-", val, sizeof(val), INT_MAX, &n2);
	printf("# first client stored %d items, the next one %d after the first left\n", n1, n2);
	CHECK(n2 >= n1 * 9 / 10);
	hkv_close(c);
	hkvserver_stop(&s);
}

/*
 * flush_all: every item stored before it reads as missing, through a warm
 * location cache too (another handle of the same config), and the memory
 * and slots come back: the blocks' owner fills the store to about the same
 * count again.
 */
static void test_flush_all(void)
{
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c, *c2;
	char key[32], val[2000], buf[2100];
	int n1 = 0, n2 = 0;

	memset(val, 'f', sizeof(val));
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	cfg = hkvserver_config(&s);
	CHECK_RC(hkv_open(cfg, &c), 0);
	CHECK_RC(hkv_open(cfg, &c2), 0);
	CHECK_RC(fill(c, "f-", val, sizeof(val), INT_MAX, &n1), HKV_EFULL);
	for (int i = 0; i < n1; i++) /* warm c2's cache */
		CHECK_RC(hkv_get(c2, key, (size_t)snprintf(key, sizeof(key), "f-%d", i), buf,
				 sizeof(buf), &(size_t){0}, NULL),
			 0);
	{
		uint64_t items, bytes;

		CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
		CHECK(items == (uint64_t)n1);
		/* block bytes: header, key and value, rounded up to a class (<= 1.25x) */
		CHECK(bytes >= items * (sizeof(val) + HKV_BLOCK_HDR) &&
		      bytes <= items * (sizeof(val) + HKV_BLOCK_HDR + 16) * 5 / 4 + items * 64);
		CHECK_RC(hkv_flush_all(c), 0);
		CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
		CHECK(items == 0 && bytes == 0);
	}
	for (int i = 0; i < n1; i++)
		CHECK_RC(hkv_get(c2, key, (size_t)snprintf(key, sizeof(key), "f-%d", i), buf,
				 sizeof(buf), &(size_t){0}, NULL),
			 HKV_ENOTFOUND);
	(void)fill(c, "g-", val, sizeof(val), INT_MAX, &n2);
	printf("# %d items before flush_all, %d stored after it\n", n1, n2);
	CHECK(n2 >= n1 * 9 / 10);
	hkv_close(c2);
	hkv_close(c);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/*
 * Cache mode (--cache): a full store evicts instead of failing. Writing
 * three times what fits never fails; every read returns the value written or
 * a miss; keys read all along (hot) survive while the untouched ones go,
 * i.e. eviction follows recency; a full index evicts too; an expired item
 * found by a get is reclaimed.
 */
static void test_cache_mode(void)
{
	static const char *const cache[] = {"--cache", NULL};
	static const char *const cache_tiny_index[] = {"--cache", "--index-slots", "64", NULL};
	struct hkv_write_opts soon = {.exptime = 1};
	struct hkv_client_stats st;
	struct hkv_server_info si;
	struct hkvserver s;
	struct hkv_client *c;
	char key[32], val[1000], buf[1100];
	int n = 0, fits, hot_kept = 0, cold_kept = 0, wrong = 0, errors = 0, ret;
	size_t vlen;

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", cache) == 0);
	c = hkvserver_client(&s);
	hkv_server_info(c, &si);
	CHECK(si.cache_mode == 1);
	fits = (int)(si.value_bytes / 1088); /* 1000 B value + key + header: the 1088 B class */
	/* keys 0..99 are hot: read back after every 10th write */
	for (n = 0; n < 3 * fits; n++) {
		memset(val, 'a' + n % 26, sizeof(val));
		ret = hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "k%d", n), val, sizeof(val),
			      NULL);
		errors += ret != 0;
		if (n % 10 == 0 && n >= 100)
			for (int h = 0; h < 100; h += 7)
				(void)hkv_get(c, key, (size_t)snprintf(key, sizeof(key), "k%d", h), buf,
					      sizeof(buf), &vlen, NULL);
	}
	for (int i = 0; i < n; i++) {
		ret = hkv_get(c, key, (size_t)snprintf(key, sizeof(key), "k%d", i), buf, sizeof(buf),
			      &vlen, NULL);
		if (ret == HKV_ENOTFOUND)
			continue;
		if (ret) {
			errors++;
			continue;
		}
		for (size_t j = 0; j < vlen; j++)
			wrong += buf[j] != 'a' + i % 26;
		wrong += vlen != sizeof(val);
		if (i < 100 && i % 7 == 0)
			hot_kept++;
		else if (i >= 100 && i < fits)
			cold_kept++;
	}
	hkv_client_stats(c, &st);
	printf("# cache mode: %d sets of 1000 B into room for ~%d: %d errors, %llu evictions; "
	       "hot keys kept %d/15, old untouched keys kept %d/%d, %d wrong bytes\n",
	       n, fits, errors, (unsigned long long)st.evictions, hot_kept, cold_kept, fits - 100,
	       wrong);
	CHECK(errors == 0);
	CHECK(wrong == 0);
	CHECK(st.evictions > 0);
	CHECK(hot_kept >= 13);
	CHECK(cold_kept < (fits - 100) / 4);
	/* the same with the hot keys read only by multi-get: it keeps them warm too */
	{
		struct hkv_mget_item it[15];
		char hk[15][16], hb[15][1100];
		int kept = 0;

		for (int h = 0; h < 15; h++) {
			snprintf(hk[h], sizeof(hk[h]), "hot%d", h);
			CHECK_RC(hkv_set(c, hk[h], strlen(hk[h]), val, sizeof(val), NULL), 0);
			it[h] = (struct hkv_mget_item){.key = hk[h], .klen = strlen(hk[h]),
						       .buf = hb[h], .cap = sizeof(hb[h])};
		}
		for (int i = 0; i < 3 * fits; i++) {
			(void)hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "m%d", i), val,
				      sizeof(val), NULL);
			if (i % 10 == 0)
				(void)hkv_mget(c, it, 15);
		}
		CHECK_RC(hkv_mget(c, it, 15), 0);
		for (int h = 0; h < 15; h++)
			kept += it[h].status == 0;
		printf("# cache mode: hot keys read only by multi-get kept %d/15\n", kept);
		CHECK(kept >= 13);
	}
	/* an expired item a get finds is reclaimed */
	CHECK_RC(hkv_set(c, "ttl", 3, "x", 1, &soon), 0);
	sleep(2);
	CHECK_RC(hkv_get(c, "ttl", 3, buf, sizeof(buf), &vlen, NULL), HKV_ENOTFOUND);
	hkv_client_stats(c, &st);
	CHECK(st.expired_reclaimed == 1);
	hkv_close(c);
	hkvserver_stop(&s);

	/* a full index (64 slots) evicts too */
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", cache_tiny_index) == 0);
	c = hkvserver_client(&s);
	errors = 0;
	for (n = 0; n < 500; n++)
		errors += hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "i%d", n), "v", 1,
				  NULL) != 0;
	ret = hkv_get(c, "i499", 4, buf, sizeof(buf), &vlen, NULL);
	hkv_client_stats(c, &st);
	printf("# cache mode, 64-slot index: 500 sets, %d errors, %llu evictions, last key %s\n",
	       errors, (unsigned long long)st.evictions, ret ? hkv_strerror(ret) : "present");
	CHECK(errors == 0);
	CHECK(st.evictions >= 500 - 64);
	CHECK_RC(ret, 0);
	hkv_close(c);
	hkvserver_stop(&s);
}

/*
 * The server is SIGKILLed and started again on the same memory file: the
 * handle's operations fail quickly and clearly while it is away, and the same
 * handle connects again by itself once it is back, finding every item
 * committed before the kill.
 */
static void test_reconnect(void)
{
	char file[128], key[32], buf[64];
	const char *extra[] = {"--memory-file", file, NULL};
	struct hkv_client_stats st;
	struct hkvserver s;
	struct hkv_client *c;
	uint64_t t0, worst_ms = 0;
	int ret = 0, down_errors = 0, found = 0;
	size_t vlen;

	snprintf(file, sizeof(file), "/tmp/hkv-reconnect-%d.region", (int)getpid());
	hkv_test_unlink_region(file);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	for (int i = 0; i < 100; i++) {
		size_t kl = (size_t)snprintf(key, sizeof(key), "r%d", i);

		CHECK_RC(hkv_set(c, key, kl, key, kl, NULL), 0); /* the value is the key */
	}
	hkvserver_kill(&s);
	for (int i = 0; i < 50; i++) { /* while it is away: errors, and quick ones */
		t0 = now_ms_mono();
		ret = hkv_get(c, "r1", 2, buf, sizeof(buf), &vlen, NULL);
		if (now_ms_mono() - t0 > worst_ms)
			worst_ms = now_ms_mono() - t0;
		down_errors += ret == HKV_EDISCONNECTED || ret == HKV_ETIMEDOUT;
		usleep(2000);
	}
	printf("# server killed: %d of 50 gets failed with a lost-server error, the slowest "
	       "took %llu ms\n", down_errors, (unsigned long long)worst_ms);
	CHECK(down_errors >= 45); /* the first few may still be served from nothing */
	CHECK(worst_ms < 5000 + 1000);
	CHECK(hkvserver_restart(&s, "16M", "64K", extra) == 0);
	t0 = now_ms_mono();
	do { /* the same handle, no hkv_open */
		ret = hkv_get(c, "r0", 2, buf, sizeof(buf), &vlen, NULL);
		if (ret)
			usleep(50000);
	} while (ret && now_ms_mono() - t0 < 10000);
	CHECK_RC(ret, 0);
	for (int i = 0; i < 100; i++) {
		size_t kl = (size_t)snprintf(key, sizeof(key), "r%d", i);

		ret = hkv_get(c, key, kl, buf, sizeof(buf), &vlen, NULL);
		found += ret == 0 && vlen == kl && !memcmp(buf, key, kl);
	}
	CHECK_RC(hkv_set(c, "after", 5, "yes", 3, NULL), 0);
	hkv_client_stats(c, &st);
	printf("# server back: the handle reconnected %llu time(s) after %llu ms and found %d of "
	       "100 items\n", (unsigned long long)st.reconnects,
	       (unsigned long long)(now_ms_mono() - t0), found);
	CHECK(found == 100);
	CHECK(st.reconnects >= 1);
	hkv_close(c);
	hkvserver_stop(&s);
	hkv_test_unlink_region(file);
}

/*
 * Server limits: --max-clients refuses the client beyond it with a clear
 * error and admits one again when another leaves.
 */
static void test_limits(void)
{
	static const char *const lim[] = {"--max-clients", "3", NULL};
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c[4] = {0};
	char val[1000];
	int n1 = 0, n2 = 0, ret;

	memset(val, 'l', sizeof(val));
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", lim) == 0);
	cfg = hkvserver_config(&s);
	for (int i = 0; i < 3; i++)
		CHECK_RC(hkv_open(cfg, &c[i]), 0);
	ret = hkv_open(cfg, &c[3]);
	printf("# --max-clients 3: a 4th client gets: %s\n", hkv_strerror(ret));
	CHECK_RC(ret, -EUSERS);
	hkv_close(c[2]);
	c[2] = NULL;
	for (int i = 0; i < 100 && (ret = hkv_open(cfg, &c[2])) == -EUSERS; i++)
		usleep(20000); /* the server sees the disconnect */
	CHECK_RC(ret, 0);
	/* memory is shared: the first client fills the store, the others then
	 * get HKV_EFULL too, and after its deletes they store again */
	CHECK_RC(fill(c[0], "a", val, sizeof(val), INT_MAX, &n1), HKV_EFULL);
	CHECK_RC(fill(c[1], "b", val, sizeof(val), 10, &n2), HKV_EFULL);
	for (int i = 0; i < n1; i++) {
		char key[32];

		CHECK_RC(hkv_delete(c[0], key, (size_t)snprintf(key, sizeof(key), "a%d", i)), 0);
	}
	n2 = 0;
	(void)fill(c[1], "b", val, sizeof(val), n1, &n2);
	printf("# one client filled the store with %d items of 1000 B; another then got "
	       "HKV_EFULL, and after the deletes stored %d\n", n1, n2);
	CHECK(n1 > 0 && n2 == n1);
	for (int i = 0; i < 3; i++)
		hkv_close(c[i]);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/* Overwrite len bytes of file at off. */
static int patch_file(const char *file, long off, const void *bytes, size_t len)
{
	FILE *f = fopen(file, "r+b");
	int ret = -1;

	if (f && !fseek(f, off, SEEK_SET) && fwrite(bytes, 1, len, f) == len)
		ret = 0;
	if (f && fclose(f))
		ret = -1;
	return ret;
}

/* The region file's header, read or written whole. */
static int header_io(const char *file, struct hkv_geometry *g, int write)
{
	FILE *f = fopen(file, write ? "r+b" : "rb");
	int ret = -1;

	if (f && (write ? fwrite(g, sizeof(*g), 1, f) : fread(g, sizeof(*g), 1, f)) == 1)
		ret = 0;
	if (f && fclose(f))
		ret = -1;
	return ret;
}

/* A header that validates but is not the server's: another hash key, sealed. */
static int forge_hash_key(const char *file)
{
	struct hkv_geometry g;

	if (header_io(file, &g, 0))
		return -1;
	g.hash_key[0] ^= 0xff;
	hkv_geometry_seal(&g);
	return header_io(file, &g, 1);
}

/* The header sealed again with layout version v. */
static int forge_version(const char *file, uint32_t v)
{
	struct hkv_geometry g;

	if (header_io(file, &g, 0))
		return -1;
	g.version = v;
	hkv_geometry_seal(&g);
	return header_io(file, &g, 1);
}

static uint64_t saved_slot, saved_index_off;

/* The first index slot made to point into the header (the header must
 * validate: read before it is torn); put_back_slot() undoes it. */
static int stray_slot(const char *file)
{
	struct hkv_geometry g;
	uint64_t bad = hkv_slot_make(1, 0, 0, HKV_HEADER_SIZE);
	FILE *f;
	int ret = -1;

	if (header_io(file, &g, 0) || hkv_geometry_check(&g, g.total_size))
		return -1;
	saved_index_off = g.index_off;
	if (!(f = fopen(file, "r+b")))
		return -1;
	if (!fseek(f, (long)g.index_off, SEEK_SET) && fread(&saved_slot, 8, 1, f) == 1 &&
	    !fseek(f, (long)g.index_off, SEEK_SET) && fwrite(&bad, 8, 1, f) == 1)
		ret = 0;
	if (fclose(f))
		ret = -1;
	return ret;
}

static int put_back_slot(const char *file)
{
	return patch_file(file, (long)saved_index_off, &saved_slot, 8);
}

/*
 * --memory-file: the server is SIGKILLed and started again on the same file;
 * every committed item is there, deletes stay deleted, new writes work.
 * The header is only a copy for clients (issue 28): a torn one is rebuilt
 * from FILE.geom, the server's own record, when the segment table and the
 * index fit it; a forged one that validates is overruled; a torn one with a
 * slot that makes no sense, or without the record, is refused.
 */
static void test_warm_restart(void)
{
	char file[128], geom[160], key[32], val[600], buf[700];
	const char *extra[] = {"--memory-file", file, NULL};
	struct hkvserver s;
	struct hkv_client *c;
	size_t vlen;

	snprintf(file, sizeof(file), "/tmp/hkv-warm-%d.region", (int)getpid());
	hkv_test_unlink_region(file);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	for (int i = 0; i < 300; i++) {
		memset(val, 'a' + i % 26, sizeof(val));
		CHECK_RC(hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "w%d", i), val,
				 (size_t)(i * 7) % sizeof(val), NULL), 0);
	}
	for (int i = 0; i < 300; i += 3)
		CHECK_RC(hkv_delete(c, key, (size_t)snprintf(key, sizeof(key), "w%d", i)), 0);
	hkvserver_kill(&s); /* no clean shutdown */
	hkv_close(c);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	for (int i = 0; i < 300; i++) {
		int ret = hkv_get(c, key, (size_t)snprintf(key, sizeof(key), "w%d", i), buf,
				  sizeof(buf), &vlen, NULL);

		memset(val, 'a' + i % 26, sizeof(val));
		if (i % 3 == 0) {
			CHECK_RC(ret, HKV_ENOTFOUND);
		} else {
			CHECK_RC(ret, 0);
			CHECK(vlen == (size_t)(i * 7) % sizeof(val) && !memcmp(buf, val, vlen));
		}
	}
	CHECK_RC(set_str(c, "after", "restart"), 0);
	CHECK_RC(get_str(c, "after", buf, sizeof(buf), NULL), 0);
	hkv_close(c);
	hkvserver_stop(&s);
	printf("# warm restart after SIGKILL: 200 items back, 100 deletes kept\n");
	/* a writer's bytes over the header, then the server killed before its
	 * tick put them back: rebuilt from FILE.geom, the items still there */
	CHECK(patch_file(file, 40, "\x5a", 1) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	CHECK(c != NULL);
	CHECK_RC(get_str(c, "after", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "restart"));
	CHECK_RC(hkv_get(c, "w1", 2, buf, sizeof(buf), &vlen, NULL), 0);
	hkv_close(c);
	hkvserver_stop(&s);
	/* a forged header that validates (another hash key, sealed): the
	 * server's record wins, every key is where it was */
	CHECK(forge_hash_key(file) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	CHECK(c != NULL);
	CHECK_RC(get_str(c, "after", buf, sizeof(buf), NULL), 0);
	hkv_close(c);
	hkvserver_stop(&s);
	/* a memory file of the layout before this one (6: atime in exptime's
	 * word): refused, saying so; served again once it is this layout */
	CHECK(forge_version(file, HKV_LAYOUT_VERSION - 1) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) != 0);
	{
		char what[96];

		snprintf(what, sizeof(what), "has region layout version %u; this server writes "
			 "version %u", HKV_LAYOUT_VERSION - 1, HKV_LAYOUT_VERSION);
		CHECK(hkvserver_log_count(&s, what) == 1);
	}
	CHECK(forge_version(file, HKV_LAYOUT_VERSION) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(get_str(c, "after", buf, sizeof(buf), NULL), 0);
	hkv_close(c);
	hkvserver_stop(&s);
	/* a torn header and a slot pointing out of the data area: refused */
	CHECK(stray_slot(file) == 0);
	CHECK(patch_file(file, 40, "\x5a", 1) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) != 0);
	/* a torn header and no record of the geometry: refused, not served */
	CHECK(put_back_slot(file) == 0);
	snprintf(geom, sizeof(geom), "%s.geom", file);
	CHECK(unlink(geom) == 0);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) != 0);
	printf("# a torn header rebuilt from the server's record, a forged one overruled; "
	       "refused with a stray slot or without the record\n");
	hkv_test_unlink_region(file);
}

/*
 * A client that authenticates with the read-only token can read; writes are
 * refused by the library (-EPERM) and, underneath, by the NIC: its rkey does
 * not permit RDMA Write (the shm backend maps the region read-only).
 */
static void test_readonly_client(void)
{
	char ro_file[160], buf[16];
	const char *extra[] = {"--ro-token-file", ro_file, NULL};
	struct hkv_client *rw, *ro;
	struct hkv_config *cfg;
	struct hkvserver s;
	struct hkv_wr wr;
	size_t vlen;
	int ret;

	snprintf(ro_file, sizeof(ro_file), "/tmp/hkv-ro-%d.token", (int)getpid());
	unlink(ro_file);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", extra) == 0);
	rw = hkvserver_client(&s);
	CHECK_RC(set_str(rw, "shared", "value"), 0);
	cfg = hkvserver_config(&s);
	CHECK(cfg && hkv_config_set_token_file(cfg, ro_file) == 0);
	CHECK_RC(hkv_open(cfg, &ro), 0);
	hkv_config_free(cfg);
	CHECK_RC(hkv_get(ro, "shared", 6, buf, sizeof(buf), &vlen, NULL), 0);
	CHECK(vlen == 5 && !memcmp(buf, "value", 5));
	CHECK_RC(set_str(ro, "shared", "evil"), -EPERM);
	CHECK_RC(hkv_delete(ro, "shared", 6), -EPERM);
	CHECK_RC(hkv_incr(ro, "shared", 6, 1, NULL), -EPERM);
	/* below the library: a raw RDMA Write with the read-only rkey */
	wr = (struct hkv_wr){.opcode = HKV_WR_WRITE, .local = buf, .length = 8,
			     .remote_addr = ro->base + ro->g.data_off, .rkey = ro->rkey};
	ret = hkv_conn_exec(ro->conn, &wr, 1);
	printf("# read-only client: raw RDMA WRITE -> %s\n", hkv_strerror(ret));
	CHECK_RC(ret, HKV_EREMOTE_ACCESS);
	CHECK_RC(get_str(rw, "shared", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "value"));
	hkv_close(ro);
	hkv_close(rw);
	hkvserver_stop(&s);
	unlink(ro_file);
}

/*
 * Handles with a small max value next to big items: a GET of an item larger
 * than the handle reads is HKV_ETOOBIG (no READ past its buffers, the
 * connection stays usable), and adopting an orphan of a class larger than
 * the handle reads terminates.
 */
static void test_small_handle(void)
{
	struct hkv_client *big, *small;
	struct hkv_config *cfg;
	struct hkvserver s;
	size_t vlen, bigsz = 200u << 10;
	char *v = calloc(1, bigsz), key[32], buf[64];
	int n = 0, ret = 0;

	CHECK(v != NULL);
	CHECK(hkvserver_start(&s, use_verbs, "8M", "256K", NULL) == 0);
	big = hkvserver_client(&s);
	CHECK_RC(hkv_set(big, "huge", 4, v, bigsz, NULL), 0);
	CHECK_RC(hkv_set(big, "huge2", 5, v, bigsz, NULL), 0);
	cfg = hkvserver_config(&s);
	CHECK(cfg && hkv_config_set_max_value(cfg, 1000) == 0);
	CHECK_RC(hkv_open(cfg, &small), 0);
	hkv_config_free(cfg);
	CHECK_RC(hkv_get(small, "huge", 4, buf, sizeof(buf), &vlen, NULL), HKV_ETOOBIG);
	CHECK_RC(set_str(small, "tiny", "ok"), 0);
	CHECK_RC(get_str(small, "tiny", buf, sizeof(buf), NULL), 0);
	/* the big client's segments become orphans; the small one adopts them */
	CHECK_RC(hkv_delete(big, "huge", 4), 0);
	CHECK_RC(hkv_delete(big, "huge2", 5), 0);
	hkv_close(big);
	while (!ret && n < 100000)
		ret = hkv_set(small, key, (size_t)snprintf(key, sizeof(key), "f%d", n++), v, 900, NULL);
	printf("# small handle filled the store with %d items, then: %s\n", n - 1, hkv_strerror(ret));
	CHECK_RC(ret, HKV_EFULL);
	hkv_close(small);
	hkvserver_stop(&s);
	free(v);
}

/* The server dies: operations fail with a clear error, quickly, and stay failed. */
static void test_lost_server(void)
{
	struct hkvserver s;
	struct hkv_client *c;
	char buf[64];
	int ret = 0;

	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(set_str(c, "k", "v"), 0);
	hkvserver_kill(&s);
	for (int i = 0; i < 2000 && !ret; i++) { /* detection takes a few ms on shm */
		ret = get_str(c, "k", buf, sizeof(buf), NULL);
		usleep(1000);
	}
	printf("# after the server was killed: %s\n", hkv_strerror(ret));
	CHECK(ret == HKV_EDISCONNECTED || ret == HKV_ETIMEDOUT);
	CHECK(set_str(c, "k", "w") < 0);
	hkv_close(c);
	hkvserver_stop(&s);
}

/*
 * A read-modify-write whose new value needs another size class (issue 13,
 * item 2): incr "9" -> "10" and decr "10" -> "9" for every key length that
 * puts the two values in different classes, append across a class, in a
 * fresh cache-mode store and in one filled with many sizes and flushed. The
 * key is there: the answer is the new value, or an honest out-of-memory
 * error, never "not found".
 */
static int rmw_boundaries(struct hkv_client *c, int *misses, int *full)
{
	char key[260], buf[64];
	uint64_t n;
	int walked = 0;

	for (int klen = 1; klen <= 250; klen++) {
		int rc;

		/* header + key + value: 1 -> 2 digits crosses a 64 B class at
		 * HKV_BLOCK_HDR + klen + 1 == 64k; only test where the class changes */
		if ((HKV_BLOCK_HDR + klen + 1) % 64 != 0)
			continue;
		memset(key, 'a' + klen % 26, (size_t)klen);
		key[klen] = 0;
		walked++;
		if (set_str(c, key, "9"))
			return -1;
		rc = hkv_incr(c, key, (size_t)klen, 1, &n);
		*misses += rc == HKV_ENOTFOUND;
		*full += rc == HKV_EFULL;
		if (!rc && (get_str(c, key, buf, sizeof(buf), NULL) || strcmp(buf, "10")))
			return -1;
		rc = hkv_decr(c, key, (size_t)klen, 1, &n); /* and back down a class */
		*misses += rc == HKV_ENOTFOUND;
		*full += rc == HKV_EFULL;
		rc = hkv_append(c, key, (size_t)klen, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
				64, 0);
		*misses += rc == HKV_ENOTFOUND;
		*full += rc == HKV_EFULL;
	}
	return walked;
}

static void test_rmw_class_boundaries(void)
{
	const char *const cache[] = {"--cache", NULL};
	struct hkvserver s;
	struct hkv_client *c, *h, *g;
	char *big = calloc(1, 64 << 10), key[64];
	int misses[3] = {0, 0, 0}, full[3] = {0, 0, 0}, walked[2], rc;
	uint64_t n;

	CHECK(big != NULL);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", cache) == 0);
	c = hkvserver_client(&s);
	walked[0] = rmw_boundaries(c, &misses[0], &full[0]);
	/* many sizes, the store written past its size, then emptied */
	for (int i = 0; i < 4000; i++) {
		snprintf(key, sizeof(key), "fill-%d", i);
		CHECK_RC(hkv_set(c, key, strlen(key), big, (size_t)(64 + (i * 997) % 60000), NULL), 0);
	}
	CHECK_RC(hkv_flush_all(c), 0);
	walked[1] = rmw_boundaries(c, &misses[1], &full[1]);
	hkv_close(c);
	hkvserver_stop(&s);

	/* a handle whose only segment holds the key, the rest of memory another
	 * handle's: its incr needs a block of another class, and the only
	 * memory it could move is the key's own segment */
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", cache) == 0);
	h = hkvserver_client(&s);
	g = hkvserver_client(&s);
	memset(key, 'k', 31);
	key[31] = 0;
	CHECK_RC(set_str(h, key, "9"), 0);
	for (int i = 0; i < 2000; i++) {
		char k2[32];

		snprintf(k2, sizeof(k2), "g-%d", i);
		CHECK_RC(hkv_set(g, k2, strlen(k2), big, 8000, NULL), 0);
	}
	rc = hkv_incr(h, key, 31, 1, &n);
	misses[2] += rc == HKV_ENOTFOUND;
	full[2] += rc == HKV_EFULL;
	{ /* the key is still there; a cas to the longer value (hatchkv-memcached's
	   * incr) is out of memory too, never "not found" */
		struct hkv_item_info info;
		char buf[16];
		int rc2;

		CHECK_RC(get_str(h, key, buf, sizeof(buf), &info), 0);
		rc2 = hkv_cas(h, key, 31, "10", 2, info.version, NULL);
		CHECK(rc2 == 0 || rc2 == HKV_EFULL);
		misses[2] += rc2 == HKV_ENOTFOUND;
	}
	printf("# read-modify-writes across a class: %d key lengths in a fresh store (%d not "
	       "found, %d out of memory), %d in one filled and flushed (%d not found, %d out of "
	       "memory); with memory held by another handle: %s\n", walked[0], misses[0], full[0],
	       walked[1], misses[1], full[1], rc ? hkv_strerror(rc) : "incremented");
	CHECK(walked[0] > 0 && walked[1] > 0);
	CHECK(misses[0] == 0 && misses[1] == 0 && misses[2] == 0);
	hkv_close(h);
	hkv_close(g);
	hkvserver_stop(&s);
	free(big);
}

int main(int argc, char **argv)
{
	use_verbs = hkvserver_want_verbs(argc, argv);
	if (use_verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	RUN_TEST(test_semantics);
	RUN_TEST(test_mget_cold);
	RUN_TEST(test_expiry);
	RUN_TEST(test_round_trips);
	RUN_TEST(test_reference_fuzz);
	RUN_TEST(test_load_factor);
	RUN_TEST(test_memory_returns);
	RUN_TEST(test_flush_all);
	RUN_TEST(test_cache_mode);
	RUN_TEST(test_rmw_class_boundaries);
	RUN_TEST(test_lost_server);
	RUN_TEST(test_reconnect);
	RUN_TEST(test_limits);
	RUN_TEST(test_warm_restart);
	RUN_TEST(test_readonly_client);
	RUN_TEST(test_small_handle);
	RUN_TEST(test_versioned);
	return hkv_test_finish();
}
