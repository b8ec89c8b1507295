/*
 * test_pipe.c - operations in flight (include/hatchkv.h, hkv_pipe_*) against
 * a real hatchkv-server:
 *
 *   test_pipe shm     (unit tier)
 *   test_pipe verbs   (rdma tier, Soft-RoCE guest)
 *
 *   test_semantics      every kind of operation through a pipe returns what
 *                       the blocking call returns, in a store used before
 *   test_key_order      300 operations on one key submitted at once: each
 *                       get sees the set submitted just before it
 *   test_linearizable   3 threads, each a pipe of depth 8, set/delete/get on
 *                       24 keys: every key's history linearizable (call =
 *                       submission, return = when poll handed it back)
 *   test_in_flight      64 gets at depth 16: on verbs, about 16 round trips'
 *                       time for 64 (the lanes' chains overlap), measured
 *                       against depth 1 in the same run (printed)
 *   test_server_lost    the server killed under 64 queued operations: every
 *                       one comes back, with an error, none hangs
 *   test_call           the caller's own steps as one operation (CALL): 200
 *                       read-modify-writes (get, then cas) over 4 counters at
 *                       depth 8: every counter ends at its count, each call
 *                       ran on a lane in range, and calls with one key ran
 *                       in submission order
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/lincheck.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;
static struct hkvserver srv;

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct hkv_pipe *pipe_on(const struct hkvserver *s, int depth)
{
	struct hkv_config *cfg = hkvserver_config(s);
	struct hkv_pipe *p = NULL;
	int ret = hkv_pipe_open(cfg, depth, &p);

	hkv_config_free(cfg);
	if (ret)
		fprintf(stderr, "hkv_pipe_open: %s\n", hkv_strerror(ret));
	return p;
}

static void drain(struct hkv_pipe *p)
{
	struct hkv_pipe_op *done[16];

	while (hkv_pipe_poll(p, done, 16) > 0)
		;
}

static void test_semantics(void)
{
	struct hkv_pipe *p = pipe_on(&srv, 8);
	struct hkv_client *c = hkvserver_client(&srv);
	struct hkv_pipe_op op[16];
	char buf[8][64];
	struct hkv_item_info info;
	size_t vlen;

	CHECK(p && c);
	if (!p || !c)
		return;
	memset(op, 0, sizeof(op));
	CHECK_RC(hkv_set(c, "s:old", 5, "before", 6, NULL), 0);
	CHECK_RC(hkv_set(c, "s:n", 3, "41", 2, NULL), 0);
	CHECK_RC(hkv_get(c, "s:old", 5, buf[0], sizeof(buf[0]), &vlen, &info), 0);
	op[0] = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = "s:a", .klen = 3, .val = "alpha",
				     .vlen = 5};
	op[1] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = "s:a", .klen = 3, .buf = buf[1],
				     .cap = sizeof(buf[1])};
	op[2] = (struct hkv_pipe_op){.kind = HKV_PIPE_ADD, .key = "s:a", .klen = 3, .val = "x",
				     .vlen = 1};
	op[3] = (struct hkv_pipe_op){.kind = HKV_PIPE_REPLACE, .key = "s:none", .klen = 6,
				     .val = "x", .vlen = 1};
	op[4] = (struct hkv_pipe_op){.kind = HKV_PIPE_CAS, .key = "s:old", .klen = 5,
				     .val = "after", .vlen = 5, .version = info.version};
	op[5] = (struct hkv_pipe_op){.kind = HKV_PIPE_INCR, .key = "s:n", .klen = 3, .delta = 1};
	op[6] = (struct hkv_pipe_op){.kind = HKV_PIPE_DECR, .key = "s:n", .klen = 3, .delta = 50};
	op[7] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = "s:none", .klen = 6,
				     .buf = buf[2], .cap = sizeof(buf[2])};
	op[8] = (struct hkv_pipe_op){.kind = HKV_PIPE_TOUCH, .key = "s:a", .klen = 3,
				     .opts = {.exptime = 1000}};
	op[9] = (struct hkv_pipe_op){.kind = HKV_PIPE_DELETE, .key = "s:old", .klen = 5};
	op[10] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = "s:old", .klen = 5,
				      .buf = buf[3], .cap = sizeof(buf[3])};
	op[11] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = "s:a", .klen = 3, .buf = buf[4],
				      .cap = 2}; /* too small */
	for (int i = 0; i < 12; i++)
		CHECK_RC(hkv_pipe_submit(p, &op[i]), 0);
	CHECK(hkv_pipe_pending(p) == 12);
	drain(p);
	CHECK(hkv_pipe_pending(p) == 0);
	CHECK_RC(op[0].status, 0);
	CHECK(op[1].status == 0 && op[1].out_vlen == 5 && !memcmp(buf[1], "alpha", 5));
	CHECK_RC(op[2].status, HKV_EEXISTS);
	CHECK_RC(op[3].status, HKV_ENOTFOUND);
	CHECK_RC(op[4].status, 0);
	CHECK(op[5].status == 0 && op[5].number == 42);
	CHECK(op[6].status == 0 && op[6].number == 0);
	CHECK_RC(op[7].status, HKV_ENOTFOUND);
	CHECK_RC(op[8].status, 0);
	CHECK_RC(op[9].status, 0);
	CHECK_RC(op[10].status, HKV_ENOTFOUND);
	CHECK(op[11].status == -ENOSPC && op[11].out_vlen == 5);
	/* what the pipe wrote, the blocking API reads */
	CHECK_RC(hkv_get(c, "s:a", 3, buf[5], sizeof(buf[5]), &vlen, &info), 0);
	CHECK(vlen == 5 && info.exptime != 0);
	CHECK_RC(hkv_get(c, "s:n", 3, buf[5], sizeof(buf[5]), &vlen, NULL), 0);
	CHECK(vlen == 1 && buf[5][0] == '0');
	hkv_close(c);
	hkv_pipe_close(p);
}

static void test_key_order(void)
{
	struct hkv_pipe *p = pipe_on(&srv, 16);
	static struct hkv_pipe_op op[300];
	static char vals[300][16], bufs[300][16];
	int wrong = 0, n = 0;

	CHECK(p);
	if (!p)
		return;
	for (int i = 0; i < 300; i++) {
		if (i % 3 == 0) {
			snprintf(vals[i], sizeof(vals[i]), "v%d", i);
			op[i] = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = "order", .klen = 5,
						     .val = vals[i], .vlen = strlen(vals[i])};
		} else {
			op[i] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = "order", .klen = 5,
						     .buf = bufs[i], .cap = sizeof(bufs[i])};
		}
		/* the queue holds 4 x depth: poll when it is full */
		while (hkv_pipe_submit(p, &op[i]) == -EAGAIN) {
			struct hkv_pipe_op *done[16];

			n += hkv_pipe_poll(p, done, 16);
		}
	}
	drain(p);
	for (int i = 0; i < 300; i++) {
		char want[16];

		if (i % 3 == 0)
			continue;
		snprintf(want, sizeof(want), "v%d", i - i % 3);
		if (op[i].status || op[i].out_vlen != strlen(want) ||
		    memcmp(bufs[i], want, strlen(want)))
			wrong++;
	}
	printf("# 300 operations on one key through a depth-16 pipe: %d gets saw another "
	       "than the set before them\n", wrong);
	CHECK(wrong == 0);
	hkv_pipe_close(p);
}

/* ---- linearizability at depth 8 ---- */

#define LK_KEYS    24
#define LK_THREADS 3
#define LK_DEPTH   8

struct lk_hist {
	pthread_mutex_t mu;
	struct lc_op *ops;
	size_t n, cap;
};

static struct lk_hist lk[LK_KEYS];
static int lk_ms = 1500;

struct lk_slot {
	struct hkv_pipe_op op;
	struct lc_op rec;
	int k;
	char key[16], val[24], buf[32];
};

static void lk_add(int k, const struct lc_op *op)
{
	pthread_mutex_lock(&lk[k].mu);
	if (lk[k].n == lk[k].cap) {
		lk[k].cap = lk[k].cap ? 2 * lk[k].cap : 1024;
		lk[k].ops = realloc(lk[k].ops, lk[k].cap * sizeof(*lk[k].ops));
	}
	if (lk[k].ops)
		lk[k].ops[lk[k].n++] = *op;
	pthread_mutex_unlock(&lk[k].mu);
}

/* Fill slot s with a random operation and submit it. */
static void lk_submit(struct hkv_pipe *p, struct lk_slot *s, int id, uint64_t *rnd, uint64_t *seq)
{
	int what;

	*rnd = *rnd * 6364136223846793005ull + 1442695040888963407ull;
	s->k = (int)((*rnd >> 33) % LK_KEYS);
	what = (int)((*rnd >> 20) % 10);
	snprintf(s->key, sizeof(s->key), "lk:%d", s->k);
	memset(&s->rec, 0, sizeof(s->rec));
	s->rec.client = id;
	if (what < 4) {
		s->rec.kind = LC_SET;
		s->rec.arg = ((uint64_t)(id + 1) << 40) | (*seq)++;
		snprintf(s->val, sizeof(s->val), "%llu", (unsigned long long)s->rec.arg);
		s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = s->key,
					     .klen = strlen(s->key), .val = s->val,
					     .vlen = strlen(s->val)};
	} else if (what < 5) {
		s->rec.kind = LC_DELETE;
		s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_DELETE, .key = s->key,
					     .klen = strlen(s->key)};
	} else {
		s->rec.kind = LC_GET;
		s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = s->key,
					     .klen = strlen(s->key), .buf = s->buf,
					     .cap = sizeof(s->buf) - 1};
	}
	s->op.user = s;
	s->rec.call = now_ns();
	if (hkv_pipe_submit(p, &s->op))
		abort(); /* (never more than depth at once here) */
}

static void lk_record(struct lk_slot *s)
{
	int rc = s->op.status;

	s->rec.ret = now_ns();
	switch (s->rec.kind) {
	case LC_SET:
		s->rec.status = rc ? LC_UNKNOWN : LC_OK;
		break;
	case LC_DELETE:
		s->rec.status = !rc ? LC_OK : rc == HKV_ENOTFOUND ? LC_NOTFOUND : LC_UNKNOWN;
		break;
	default:
		if (rc && rc != HKV_ENOTFOUND)
			return; /* a failed read did nothing */
		s->rec.status = rc ? LC_NOTFOUND : LC_OK;
		s->buf[rc ? 0 : s->op.out_vlen] = 0;
		s->rec.out = rc ? 0 : strtoull(s->buf, NULL, 10);
	}
	if (s->rec.status == LC_UNKNOWN)
		s->rec.ret = INT64_MAX;
	lk_add(s->k, &s->rec);
}

static void *lk_thread(void *arg)
{
	int id = (int)(intptr_t)arg;
	struct hkv_pipe *p = pipe_on(&srv, LK_DEPTH);
	struct lk_slot slots[LK_DEPTH];
	uint64_t rnd = (uint64_t)id * 0x9e3779b97f4a7c15ull + 7, seq = 1;
	int64_t end = now_ns() + (int64_t)lk_ms * 1000000;
	long budget = 20000; /* ops per thread: histories the checker decides */

	if (!p)
		return NULL;
	for (int i = 0; i < LK_DEPTH; i++)
		lk_submit(p, &slots[i], id, &rnd, &seq);
	while (hkv_pipe_pending(p)) {
		struct hkv_pipe_op *done[LK_DEPTH];
		int n = hkv_pipe_poll(p, done, LK_DEPTH);

		for (int i = 0; i < n; i++) {
			struct lk_slot *s = done[i]->user;

			lk_record(s);
			if (now_ns() < end && --budget > 0)
				lk_submit(p, s, id, &rnd, &seq);
		}
	}
	hkv_pipe_close(p);
	return NULL;
}

static void test_linearizable(void)
{
	pthread_t thr[LK_THREADS];
	/* (a hard history, seen once in a few dozen runs under load, gave up
	 * within seconds - the 1 GB memo, not the time limit: undecided, not a
	 * violation) */
	struct lc_limits lim = {.max_seconds = 60, .max_memo_mb = 3072};
	size_t total = 0;
	int bad = 0, undecided = 0;

	for (int k = 0; k < LK_KEYS; k++)
		pthread_mutex_init(&lk[k].mu, NULL);
	for (int t = 0; t < LK_THREADS; t++)
		pthread_create(&thr[t], NULL, lk_thread, (void *)(intptr_t)t);
	for (int t = 0; t < LK_THREADS; t++)
		pthread_join(thr[t], NULL);
	for (int k = 0; k < LK_KEYS; k++) {
		struct lc_report rep;
		enum lc_result r = lc_check(LC_REGISTER, LC_ABSENT, lk[k].ops, lk[k].n, &lim, &rep);

		total += lk[k].n;
		if (r == LC_VIOLATION) {
			fprintf(stderr, "lk:%d: not linearizable\n", k);
			lc_print_report(stderr, lk[k].ops, lk[k].n, &rep);
		}
		bad += r == LC_VIOLATION;
		undecided += r == LC_GAVE_UP;
		lc_report_free(&rep);
		free(lk[k].ops);
	}
	printf("# %d threads x depth %d: %zu operations on %d keys, %d histories not "
	       "linearizable, %d undecided\n", LK_THREADS, LK_DEPTH, total, LK_KEYS, bad,
	       undecided);
	CHECK(bad == 0 && undecided == 0 && total > 300);
}

/* 64 gets of warm keys, at depth d: microseconds and round trips. */
static double gets_at(int depth, uint64_t *rts, int *failed)
{
	struct hkv_pipe *p = pipe_on(&srv, depth);
	static struct hkv_pipe_op op[64];
	static char keys[64][16], bufs[64][64];
	struct hkv_client_stats st;
	int64_t t0 = 0, t1 = 0;

	if (!p)
		return -1;
	for (int round = 0; round < 2; round++) { /* the first warms the lanes' caches */
		t0 = now_ns();
		for (int i = 0, sub = 0; i < 64 || hkv_pipe_pending(p);) {
			struct hkv_pipe_op *done[64];

			while (sub < 64) {
				snprintf(keys[sub], sizeof(keys[sub]), "f:%d", sub);
				op[sub] = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = keys[sub],
							       .klen = strlen(keys[sub]),
							       .buf = bufs[sub], .cap = 64};
				if (hkv_pipe_submit(p, &op[sub]))
					break;
				sub++;
			}
			i += hkv_pipe_poll(p, done, 64);
			if (i >= 64 && !hkv_pipe_pending(p))
				break;
		}
		t1 = now_ns();
		if (round == 0)
			hkv_pipe_stats(p, &st), *rts = st.op[HKV_OP_GET].round_trips;
	}
	hkv_pipe_stats(p, &st);
	*rts = st.op[HKV_OP_GET].round_trips - *rts;
	for (int i = 0; i < 64; i++)
		*failed += op[i].status != 0;
	hkv_pipe_close(p);
	return (double)(t1 - t0) / 1e3;
}

static void test_in_flight(void)
{
	struct hkv_client *c = hkvserver_client(&srv);
	uint64_t rt1 = 0, rt16 = 0;
	double us1, us16;
	int failed = 0;

	for (int i = 0; i < 64; i++) {
		char k[16];

		snprintf(k, sizeof(k), "f:%d", i);
		CHECK_RC(hkv_set(c, k, strlen(k), "value", 5, NULL), 0);
	}
	hkv_close(c);
	us1 = gets_at(1, &rt1, &failed);
	us16 = gets_at(16, &rt16, &failed);
	printf("# 64 warm gets: depth 1 %.0f us (%llu round trips), depth 16 %.0f us "
	       "(%llu round trips): %.1fx\n", us1, (unsigned long long)rt1, us16,
	       (unsigned long long)rt16, us1 / us16);
	CHECK(failed == 0);
	CHECK(rt1 == 64 && rt16 == 64); /* one READ each, whatever the depth */
}

struct bump {
	struct hkv_pipe_op op;
	char key[16];
	int seq, lane, seen; /* seen: the counter's value this call read */
};

static int ncalls_lanes_bad;

/* get, then cas the number one up; again on a lost race */
static int bump(struct hkv_client *h, int lane, void *arg)
{
	struct bump *b = arg;
	char buf[32];

	b->lane = lane;
	for (;;) {
		struct hkv_item_info info;
		size_t vlen;
		int ret = hkv_get(h, b->key, strlen(b->key), buf, sizeof(buf) - 1, &vlen, &info);
		int n;

		if (ret)
			return ret;
		buf[vlen] = 0;
		b->seen = atoi(buf);
		n = snprintf(buf, sizeof(buf), "%d", b->seen + 1);
		ret = hkv_cas(h, b->key, strlen(b->key), buf, (size_t)n, info.version, NULL);
		if (ret != HKV_EVERSION)
			return ret;
	}
}

static void test_call(void)
{
	enum { NB = 200, NK = 4, DEPTH = 8 };
	struct hkv_client *c = hkvserver_client(&srv);
	struct hkv_pipe *p = pipe_on(&srv, DEPTH);
	static struct bump b[NB];
	int submitted = 0, back = 0, last[NK], bad_order = 0, failed = 0;
	char buf[32];

	CHECK(p != NULL);
	if (!p)
		return;
	for (int k = 0; k < NK; k++) {
		char key[16];

		snprintf(key, sizeof(key), "ctr:%d", k);
		CHECK_RC(set_str(c, key, "0"), 0);
		last[k] = -1;
	}
	while (back < NB) {
		struct hkv_pipe_op *done[16];
		int n;

		for (; submitted < NB; submitted++) {
			struct bump *x = &b[submitted];

			snprintf(x->key, sizeof(x->key), "ctr:%d", submitted % NK);
			x->seq = submitted / NK;
			x->op = (struct hkv_pipe_op){.kind = HKV_PIPE_CALL, .key = x->key,
						     .klen = strlen(x->key), .call = bump, .user = x};
			if (hkv_pipe_submit(p, &x->op))
				break;
		}
		n = hkv_pipe_poll(p, done, 16);
		for (int i = 0; i < n; i++) {
			struct bump *x = done[i]->user;
			int k = atoi(x->key + 4);

			failed += done[i]->status != 0;
			ncalls_lanes_bad += x->lane < 0 || x->lane >= DEPTH;
			/* one key's calls one after another: each read what the one before wrote */
			bad_order += x->seq != last[k] + 1 || x->seen != x->seq;
			last[k] = x->seq;
		}
		back += n;
	}
	for (int k = 0; k < NK; k++) {
		char key[16];

		snprintf(key, sizeof(key), "ctr:%d", k);
		CHECK_RC(get_str(c, key, buf, sizeof(buf), NULL), 0);
		CHECK(atoi(buf) == NB / NK);
	}
	printf("# %d calls (get + cas each) at depth %d: %d failed, %d out of order, %d on a bad "
	       "lane\n", NB, DEPTH, failed, bad_order, ncalls_lanes_bad);
	CHECK(failed == 0 && bad_order == 0 && ncalls_lanes_bad == 0);
	hkv_pipe_close(p);
	hkv_close(c);
}

static void test_server_lost(void)
{
	struct hkv_pipe *p = pipe_on(&srv, 16);
	static struct hkv_pipe_op op[64];
	static char keys[64][16], bufs[64][64];
	int back = 0, failed = 0;
	int64_t t0;

	CHECK(p);
	if (!p)
		return;
	hkvserver_kill(&srv);
	t0 = now_ns();
	for (int i = 0; i < 64; i++) {
		snprintf(keys[i], sizeof(keys[i]), "f:%d", i);
		op[i] = (struct hkv_pipe_op){.kind = i % 2 ? HKV_PIPE_GET : HKV_PIPE_SET,
					     .key = keys[i], .klen = strlen(keys[i]),
					     .val = "x", .vlen = 1, .buf = bufs[i], .cap = 64};
		CHECK_RC(hkv_pipe_submit(p, &op[i]), 0);
	}
	while (hkv_pipe_pending(p)) {
		struct hkv_pipe_op *done[64];
		int n = hkv_pipe_poll(p, done, 64);

		for (int i = 0; i < n; i++)
			failed += done[i]->status != 0;
		back += n;
	}
	printf("# server killed: %d of 64 operations came back (%d with an error) in %.0f ms\n",
	       back, failed, (double)(now_ns() - t0) / 1e6);
	CHECK(back == 64 && failed == 64);
	hkv_pipe_close(p);
}

int main(int argc, char **argv)
{
	use_verbs = hkvserver_want_verbs(argc, argv);
	if (hkvserver_start(&srv, use_verbs, "64M", "1M", NULL)) {
		fprintf(stderr, "FAIL: cannot start hatchkv-server\n");
		return 1;
	}
	if (use_verbs)
		lk_ms = 4000;
	RUN_TEST(test_semantics);
	RUN_TEST(test_key_order);
	RUN_TEST(test_linearizable);
	RUN_TEST(test_in_flight);
	RUN_TEST(test_call);
	RUN_TEST(test_server_lost);
	hkvserver_stop(&srv);
	return hkv_test_finish();
}
