/*
 * test_views.c - a write never commits from a view it cannot prove current,
 * however long its thread was stopped (issue 11, item 2), against a real
 * hatchkv-server:
 *
 *   test_views shm     (unit tier)
 *   test_views verbs   (rdma tier, Soft-RoCE guest)
 *
 * A writer is stopped between its find and its publish (the library's
 * test-only hook, hkv_test_hook, at HKV_TP_MODIFY_PUBLISH and
 * HKV_TP_STORE_PUBLISH) while another client rewrites the key until the
 * block the writer saw has been reused past a whole cycle of the slot's
 * 11-bit version and the key's slot holds, bit for bit, the value the
 * writer saw: the ABA case. Then the writer goes on. Its write must act on
 * the key as it is now (incr adds to the current number, cas fails on the
 * changed version), and the history must be linearizable.
 *
 *   test_stuck_obsolete: an insert never clears a slot naming an OBSOLETE
 *   entry of its key, even one it saw under the same slot value before.
 *   test_flush_obsolete: flush_all removes such an entry (a dead writer's).
 *
 * Values are 18 KB (a digit string padded with spaces, which incr accepts
 * as memcached does): blocks of the 18560-byte class, so a 64 KiB segment
 * holds three and one address comes back every few writes: the 2048 reuses
 * take ~6000 sets.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/lincheck.h"

HKV_TEST_MAIN_DEFS;

#define VLEN      (18u << 10)
#define MAX_CHURN 200000
#define KEY       "stale-view"


static int use_verbs;

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The number n as a VLEN-byte value: digits, then spaces. */
static char *number_value(uint64_t n)
{
	static char v[VLEN];

	memset(v, ' ', sizeof(v));
	v[snprintf(v, 32, "%llu", (unsigned long long)n)] = ' ';
	return v;
}

/* The test's state, shared with the hook (which runs in the writer's thread). */
static struct {
	struct hkv_client *writer, *churner;
	enum hkv_test_point at;
	uint64_t off0, gen0; /* the writer's view of the key's block */
	uint64_t next;       /* the churner's next number */
	int fired, churned, aba;
	struct lc_op *ops;
	size_t nops;
} st;

static void record(enum lc_kind kind, enum lc_status status, uint64_t arg, uint64_t out,
		   int64_t call, int client)
{
	st.ops[st.nops++] = (struct lc_op){.kind = kind, .status = status, .client = client,
					   .arg = arg, .out = out, .call = call, .ret = now_ns()};
}

/* The writer is stopped here: rewrite the key until its block address is
 * back with a generation that has the same low 11 bits as the one the
 * writer saw (so the key's slot holds exactly the value it saw). */
static void churn_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c != st.writer || point != st.at || st.fired)
		return;
	st.fired = 1;
	for (int i = 0; i < MAX_CHURN; i++) {
		struct hkv_item_info info;
		char buf[64];
		size_t vlen;
		int64_t t = now_ns();
		uint64_t off, gen;
		int ret = hkv_set(st.churner, KEY, strlen(KEY), number_value(st.next), VLEN, NULL);

		if (ret) {
			fprintf(stderr, "churner: set: %s\n", hkv_strerror(ret));
			return;
		}
		record(LC_SET, LC_OK, st.next++, 0, t, 1);
		st.churned++;
		ret = hkv_get(st.churner, KEY, strlen(KEY), buf, sizeof(buf), &vlen, &info);
		if (ret != -ENOSPC) { /* a 64-byte buffer: only the version is wanted */
			fprintf(stderr, "churner: get: %s\n", hkv_strerror(ret));
			return;
		}
		hkvserver_block_of(st.churner, KEY, &off, &gen);
		if (off == st.off0 && gen != st.gen0 && (gen & 0x7ff) == (st.gen0 & 0x7ff)) {
			st.aba = 1;
			return;
		}
	}
}

/*
 * Memory is shared by every writer, so make the key's class tight: fill the
 * store with values of its size until it is full, then delete nfree of them
 * (room for the key, the writers' new blocks, a copy, and a few for the
 * churner to turn over).
 * The churner's sets then take turns on those few blocks (a claim takes one
 * block at a time when the class is scarce), so one address comes back
 * quickly - as one segment per client did before memory was shared.
 */
static void tighten(struct hkv_client *c, int nfree)
{
	char key[32], *v = calloc(1, VLEN);
	int n = 0, ret;

	CHECK(v != NULL);
	/* (a small value's class first: an incr's result is short) */
	CHECK_RC(hkv_set(c, "small", 5, "1", 1, NULL), 0);
	CHECK_RC(hkv_delete(c, "small", 5), 0);
	while ((ret = hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "fill%d", n), v, VLEN,
			      NULL)) == 0)
		n++;
	CHECK_RC(ret, HKV_EFULL);
	CHECK(n > nfree);
	for (int i = 0; i < nfree; i++)
		CHECK_RC(hkv_delete(c, key, (size_t)snprintf(key, sizeof(key), "fill%d", i)), 0);
	free(v);
}

/* Start a server and the two clients; the key holds 1000. */
static void setup(struct hkvserver *s, struct hkv_config **cfg)
{
	struct hkv_item_info info;
	char buf[64];
	size_t vlen;

	memset(&st, 0, sizeof(st));
	st.ops = calloc(MAX_CHURN + 16, sizeof(*st.ops));
	CHECK(st.ops != NULL);
	CHECK(hkvserver_start(s, use_verbs, "16M", "64K", NULL) == 0);
	cfg[0] = hkvserver_config(s);
	cfg[1] = hkvserver_config(s);
	CHECK_RC(hkv_open(cfg[0], &st.writer), 0);
	CHECK_RC(hkv_open(cfg[1], &st.churner), 0);
	CHECK_PASSES(tighten(st.churner, 8));
	CHECK_RC(hkv_set(st.churner, KEY, strlen(KEY), number_value(1000), VLEN, NULL), 0);
	st.next = 2000;
	CHECK_RC(hkv_get(st.writer, KEY, strlen(KEY), buf, sizeof(buf), &vlen, &info), -ENOSPC);
	hkvserver_block_of(st.writer, KEY, &st.off0, &st.gen0);
}

static void teardown(struct hkvserver *s, struct hkv_config **cfg)
{
	hkv_test_hook = NULL;
	hkv_close(st.writer);
	hkv_close(st.churner);
	hkv_config_free(cfg[0]);
	hkv_config_free(cfg[1]);
	hkvserver_stop(s);
	free(st.ops);
}

/* incr stopped between its find and its publish while the key turns over. */
static void test_stale_incr(void)
{
	struct hkv_client_stats ws;
	struct hkv_config *cfg[2];
	struct hkvserver s;
	struct lc_report rep;
	char buf[64];
	uint64_t result = 0, now;
	size_t vlen;
	int64_t t;
	int ret;

	CHECK_PASSES(setup(&s, cfg));
	st.at = HKV_TP_MODIFY_PUBLISH;
	hkv_test_hook = churn_hook;
	t = now_ns();
	ret = hkv_incr(st.writer, KEY, strlen(KEY), 1, &result);
	hkv_test_hook = NULL;
	record(LC_INCR, ret ? LC_UNKNOWN : LC_OK, 1, result, t, 0);
	if (ret)
		st.ops[st.nops - 1].ret = INT64_MAX;
	t = now_ns();
	{
		char *v = malloc(VLEN);

		CHECK(v != NULL);
		CHECK_RC(hkv_get(st.churner, KEY, strlen(KEY), v, VLEN, &vlen, NULL), 0);
		memcpy(buf, v, vlen < 20 ? vlen : 20);
		buf[vlen < 20 ? vlen : 20] = 0;
		free(v);
	}
	now = strtoull(buf, NULL, 10);
	record(LC_GET, LC_OK, 0, now, t, 1);
	hkv_client_stats(st.writer, &ws);
	printf("# incr held while the key was set %d times (block reused to the same slot value: "
	       "%s): returned %s %llu, key now %llu (last set %llu); views refused as stale %llu, "
	       "stale swings undone %llu\n", st.churned, st.aba ? "yes" : "no", hkv_strerror(ret),
	       (unsigned long long)result, (unsigned long long)now,
	       (unsigned long long)st.next - 1, (unsigned long long)ws.stale_views,
	       (unsigned long long)ws.stale_undone);
	CHECK(st.aba);
	CHECK_RC(ret, 0);
	CHECK(result == st.next); /* the last set's number + 1 */
	CHECK(now == st.next);
	CHECK(ws.stale_views + ws.stale_undone >= 1);
	{
		struct lc_limits lim = {.max_seconds = 60};

		CHECK(lc_check(LC_COUNTER, 1000, st.ops, st.nops, &lim, &rep) == LC_LINEARIZABLE);
	}
	if (rep.result != LC_LINEARIZABLE)
		lc_print_report(stderr, st.ops, st.nops, &rep);
	lc_report_free(&rep);
	teardown(&s, cfg);
}

/* cas stopped between its find (which saw its version current) and its
 * publish: by then the key was set thousands of times; the cas must fail. */
static void test_stale_cas(void)
{
	struct hkv_item_info info;
	struct hkv_config *cfg[2];
	struct hkvserver s;
	char buf[64];
	size_t vlen;
	int ret;

	CHECK_PASSES(setup(&s, cfg));
	CHECK_RC(hkv_get(st.writer, KEY, strlen(KEY), buf, sizeof(buf), &vlen, &info), -ENOSPC);
	st.at = HKV_TP_STORE_PUBLISH;
	hkv_test_hook = churn_hook;
	ret = hkv_cas(st.writer, KEY, strlen(KEY), number_value(1), VLEN, info.version, NULL);
	hkv_test_hook = NULL;
	{
		char *v = malloc(VLEN);

		CHECK(v != NULL);
		CHECK_RC(hkv_get(st.churner, KEY, strlen(KEY), v, VLEN, &vlen, NULL), 0);
		memcpy(buf, v, 20);
		buf[20] = 0;
		free(v);
	}
	printf("# cas held while the key was set %d times (same slot value: %s): %s; key now "
	       "%llu\n", st.churned, st.aba ? "yes" : "no", hkv_strerror(ret),
	       (unsigned long long)strtoull(buf, NULL, 10));
	CHECK(st.aba);
	CHECK_RC(ret, HKV_EVERSION);
	CHECK(strtoull(buf, NULL, 10) == st.next - 1);
	teardown(&s, cfg);
}

/* flush_all stopped after it read the index and before it read the metas:
 * K1 moves off the block X it saw, and K2 (inserted after the index READ)
 * is set until its block is X again with the same low 11 bits of
 * generation (issue 11, item 3). */
static void flush_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c != st.writer || point != HKV_TP_FLUSH_METAS || st.fired)
		return;
	st.fired = 1;
	if (hkv_set(st.churner, "flush-k1", 8, number_value(1), VLEN, NULL))
		return;
	for (int i = 0; i < MAX_CHURN; i++) {
		struct hkv_item_info info;
		char buf[64];
		size_t vlen;
		uint64_t off, gen;

		if (hkv_set(st.churner, "flush-k2", 8, number_value(st.next++), VLEN, NULL) ||
		    hkv_get(st.churner, "flush-k2", 8, buf, sizeof(buf), &vlen, &info) != -ENOSPC)
			return;
		st.churned++;
		hkvserver_block_of(st.churner, "flush-k2", &off, &gen);
		if (off == st.off0 && gen != st.gen0 && (gen & 0x7ff) == (st.gen0 & 0x7ff)) {
			st.aba = 1;
			return;
		}
	}
}

/* Is the free bit of the block at off (class of a VLEN value) set? (READ
 * through the churner's handle.) */
static int block_freed(uint64_t off)
{
	struct hkv_client *c = st.churner;
	int cls = hkv_class_for(&c->g, HKV_BLOCK_HDR + 8 + VLEN);
	uint64_t rel = off - c->g.data_off, word;
	uint32_t seg = (uint32_t)(rel / c->g.seg_size);
	uint32_t blk = (uint32_t)(rel % c->g.seg_size / c->g.class_size[cls]);
	struct hkv_wr wr = hkv_wr_read(c, c->scr, c->g.bitmap_off +
						  (uint64_t)seg * c->g.bitmap_bytes +
						  (uint64_t)(blk / 64) * 8, 8);

	if (hkv_exec(c, &wr, 1))
		return -1;
	memcpy(&word, c->scr, 8);
	return (int)(word >> (blk % 64) & 1);
}

/*
 * flush_all pairs each slot with the generation of the block it names from
 * one chain (meta READ, slot READ again), never a slot from its index READ
 * with a generation read later: else it removes K2's live block X - its
 * mark wins, the slot CAS on K1's old slot fails - and frees X while K2's
 * slot still names it.
 */
static void test_stale_flush(void)
{
	/* one chunk of index: the flush reads it whole before the hook */
	static const char *const one_seg[] = {"--index-slots", "1024", NULL};
	struct hkv_item_info info;
	struct hkv_config *cfg[2];
	struct hkvserver s;
	char *v = malloc(VLEN), buf[64];
	size_t vlen;
	int ret, found, freed = -1;

	CHECK(v != NULL);
	memset(&st, 0, sizeof(st));
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", one_seg) == 0);
	cfg[0] = hkvserver_config(&s);
	cfg[1] = hkvserver_config(&s);
	CHECK_RC(hkv_open(cfg[0], &st.writer), 0);
	CHECK_RC(hkv_open(cfg[1], &st.churner), 0);
	st.ops = calloc(1, sizeof(*st.ops));
	CHECK_PASSES(tighten(st.churner, 4));
	CHECK_RC(hkv_set(st.churner, "flush-k1", 8, number_value(0), VLEN, NULL), 0);
	CHECK_RC(hkv_get(st.churner, "flush-k1", 8, buf, sizeof(buf), &vlen, &info), -ENOSPC);
	hkvserver_block_of(st.churner, "flush-k1", &st.off0, &st.gen0);
	st.next = 5000;
	hkv_test_hook = flush_hook;
	ret = hkv_flush_all(st.writer);
	hkv_test_hook = NULL;
	CHECK_RC(ret, 0);
	printf("# k1 after the flush: %s\n",
	       hkv_strerror(hkv_get(st.churner, "flush-k1", 8, v, VLEN, &vlen, NULL)));
	found = hkv_get(st.churner, "flush-k2", 8, v, VLEN, &vlen, &info);
	if (!found) {
		uint64_t off, gen;

		hkvserver_block_of(st.churner, "flush-k2", &off, &gen);
		freed = off == UINT64_MAX ? -1 : block_freed(off);
	}
	printf("# flush held after its index READ while k2 was set %d times (its block back at "
	       "k1's old address, same low bits: %s): k2 %s, its block's free bit %s\n",
	       st.churned, st.aba ? "yes" : "no", found ? hkv_strerror(found) : "survived",
	       freed < 0 ? "-" : freed ? "SET (freed while named)" : "clear");
	CHECK(st.aba);
	CHECK(found == 0 || found == HKV_ENOTFOUND);
	if (!found) { /* stored during the walk: it may stay, whole */
		CHECK(freed == 0);
		CHECK(strtoull(v, NULL, 10) == st.next - 1);
		for (int i = 0; i < 20; i++) { /* reuse whatever is free */
			CHECK_RC(hkv_set(st.churner, "flush-k3", 8, number_value(9), VLEN, NULL), 0);
			CHECK_RC(hkv_delete(st.churner, "flush-k3", 8), 0);
		}
		CHECK_RC(hkv_get(st.writer, "flush-k2", 8, v, VLEN, &vlen, NULL), 0);
		CHECK(strtoull(v, NULL, 10) == st.next - 1);
	}
	hkv_close(st.writer);
	hkv_close(st.churner);
	hkv_config_free(cfg[0]);
	hkv_config_free(cfg[1]);
	hkvserver_stop(&s);
	free(st.ops);
	free(v);
}

/*
 * The stale swing's undo (issue 11, item 2; found by a review after the
 * fact). A cas's view is stale (the age check is lifted:
 * hkv_test_view_max_ns models a stop after it, inside the post) and its
 * slot CAS wins on the ABA value, displacing incarnation g' of the key.
 *
 *   with_w = 0: nobody else is there. The undo holds g''s mark, puts the
 *               slot back, makes g' LIVE again.
 *   with_w = 1: another client W, which read g' before the swing,
 *               publishes a set over it: its mark of g' wins, its slot CAS
 *               loses to ours, it frees g' and stops at its retry - and
 *               only then does the cas undo its swing. Putting the old slot
 *               value back would name the freed g' (the key then reads as
 *               absent though nobody deleted it, and the slot dangles); the
 *               undo gives the key a copy of g' instead.
 *
 * Either way the cas fails (the key changed since its version was read),
 * the key reads as the churner's last value right after the undo, never
 * "not found", and then W's set lands.
 */
static struct {
	struct hkv_client *w;
	pthread_t tid;
	_Atomic int w_ready, w_go, w_retrying, writer_done, w_ret;
	int with_w, seen_ret;
	uint64_t seen_val;
} un;

static int wait_flag(_Atomic int *flag, int ms)
{
	for (int i = 0; i < ms && !atomic_load(flag); i++)
		usleep(1000);
	return atomic_load(flag);
}

static void *w_main(void *arg)
{
	(void)arg;
	atomic_store(&un.w_ret, hkv_set(un.w, KEY, strlen(KEY), number_value(777), VLEN, NULL));
	return NULL;
}

/* What a reader gets for the key now (into un.seen_*): after the undo. */
static void look(void)
{
	static char v[VLEN];
	size_t vlen = 0;

	un.seen_ret = hkv_get(st.churner, KEY, strlen(KEY), v, VLEN, &vlen, NULL);
	un.seen_val = un.seen_ret ? 0 : strtoull(v, NULL, 10);
}

static void undo_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c == st.writer && point == HKV_TP_STORE_PUBLISH && !st.fired) {
		churn_hook(c, point); /* the key turns over until the ABA value is back */
		/* W reads g' now and stops before its publish */
		if (st.aba && un.with_w && pthread_create(&un.tid, NULL, w_main, NULL) == 0)
			wait_flag(&un.w_ready, 10000);
	} else if (c == un.w && point == HKV_TP_STORE_PUBLISH && !atomic_load(&un.w_ready)) {
		atomic_store(&un.w_ready, 1);
		wait_flag(&un.w_go, 10000);
	} else if (c == st.writer && point == HKV_TP_UNDO_STALE && un.with_w) {
		atomic_store(&un.w_go, 1); /* W marks g', loses its slot CAS, frees g' */
		wait_flag(&un.w_retrying, 10000);
	} else if (c == un.w && point == HKV_TP_RETRY && !atomic_load(&un.w_retrying)) {
		atomic_store(&un.w_retrying, 1);
		wait_flag(&un.writer_done, 10000); /* the undo goes first */
	}
}

static void stale_undo(int with_w)
{
	struct hkv_client_stats ws;
	struct hkv_item_info info;
	struct hkv_config *cfg[2], *wcfg;
	struct hkvserver s;
	char *v = malloc(VLEN), buf[64];
	uint64_t now = 0;
	size_t vlen = 0;
	int ret, got;

	CHECK(v != NULL);
	memset(&un, 0, sizeof(un));
	un.with_w = with_w;
	CHECK_PASSES(setup(&s, cfg));
	wcfg = hkvserver_config(&s);
	CHECK(wcfg != NULL);
	hkv_config_set_timeout_ms(wcfg, 30000);
	CHECK_RC(hkv_open(wcfg, &un.w), 0);
	CHECK_RC(hkv_get(st.writer, KEY, strlen(KEY), buf, sizeof(buf), &vlen, &info), -ENOSPC);
	st.at = HKV_TP_STORE_PUBLISH;
	hkv_test_view_max_ns = UINT64_MAX;
	hkv_test_hook = undo_hook;
	ret = hkv_cas(st.writer, KEY, strlen(KEY), number_value(1), VLEN, info.version, NULL);
	hkv_test_hook = NULL;
	hkv_test_view_max_ns = 0;
	/* the undo is done; W (if any) still waits at its retry. The churner
	 * writes another key a few times: its freed blocks - g', if W freed it -
	 * are reused, so a slot still naming g' would now name another key */
	for (int i = 0; i < 6; i++) {
		usleep(1000); /* past the free's quarantine */
		CHECK_RC(hkv_set(st.churner, "undo-other", 10, number_value((uint64_t)i), VLEN,
				 NULL), 0);
	}
	look();
	atomic_store(&un.writer_done, 1);
	if (atomic_load(&un.w_ready))
		pthread_join(un.tid, NULL);
	got = hkv_get(st.churner, KEY, strlen(KEY), v, VLEN, &vlen, NULL);
	if (!got)
		now = strtoull(v, NULL, 10);
	hkv_client_stats(st.writer, &ws);
	printf("# stale cas swung the key%s (ABA: %s%s): cas %s; right after the undo the key "
	       "read %s %llu (the churner's last: %llu)%s%s, then %s %llu; stale swings undone "
	       "%llu\n", with_w ? " while W's set over the displaced block won its mark and "
	       "freed it" : ", nobody else there", st.aba ? "yes" : "no",
	       with_w ? (atomic_load(&un.w_retrying) ? "; W stopped at its retry: yes"
						      : "; W stopped at its retry: NO") : "",
	       hkv_strerror(ret), hkv_strerror(un.seen_ret), (unsigned long long)un.seen_val,
	       (unsigned long long)st.next - 1, with_w ? "; W's set " : "",
	       with_w ? hkv_strerror(atomic_load(&un.w_ret)) : "", hkv_strerror(got),
	       (unsigned long long)now, (unsigned long long)ws.stale_undone);
	CHECK(st.aba);
	CHECK(ws.stale_undone == 1);
	CHECK_RC(ret, HKV_EVERSION);  /* the key changed after the version was read */
	CHECK_RC(un.seen_ret, 0);     /* never absent: nobody deleted it */
	CHECK(un.seen_val == st.next - 1);
	CHECK_RC(got, 0);
	if (with_w) {
		CHECK(atomic_load(&un.w_retrying));
		CHECK_RC(atomic_load(&un.w_ret), 0);
		CHECK(now == 777); /* W's set came last */
	} else {
		CHECK(now == st.next - 1);
	}
	hkv_close(un.w);
	hkv_config_free(wcfg);
	teardown(&s, cfg);
	free(v);
}

static void test_stale_undo(void)
{
	stale_undo(0);
}

static void test_stale_undo_raced(void)
{
	stale_undo(1);
}

/*
 * A remove stopped after its view was found fresh (HKV_TP_VIEW_POST, the
 * age check lifted: a stop inside the post) while the key is set again and
 * again until its block is back at the same address with the same low 11
 * bits of generation - the very slot value the remove read (issue 27, an
 * adversarial review). Posted as one chain [mark, swing], its mark lost and
 * its swing won on that ABA value: the undo had no block to put back, so
 * the churner's last acknowledged set was gone.
 *
 *   reclaim = 0: a plain delete. It may remove the later value (it ends
 *                after that set), but then it must say so: it said "not
 *                found" - the history (register model) is checked.
 *   reclaim = 1: a GET that found the item expired (1 s TTL) and removes
 *                it, a remove conditional on what it read: the churner's
 *                last set (no TTL) must survive whole.
 */
static void stale_remove(int reclaim)
{
	struct hkv_config *cfg[2];
	struct hkv_client_stats ws;
	struct hkvserver s;
	struct lc_report rep;
	char *v = malloc(VLEN), buf[64];
	size_t vlen = 0;
	int64_t t;
	int ret, got;
	uint64_t now = 0;

	CHECK(v != NULL);
	CHECK_PASSES(setup(&s, cfg));
	record(LC_SET, LC_OK, 1000, 0, now_ns(), 1);
	if (reclaim) {
		struct hkv_write_opts o = {.exptime = 1};

		t = now_ns();
		CHECK_RC(hkv_set(st.churner, KEY, strlen(KEY), number_value(1001), VLEN, &o), 0);
		record(LC_SET, LC_OK, 1001, 0, t, 1);
		/* the writer's location cache names the item with the TTL */
		CHECK_RC(hkv_get(st.writer, KEY, strlen(KEY), buf, sizeof(buf), &vlen, NULL),
			 -ENOSPC);
		hkvserver_block_of(st.writer, KEY, &st.off0, &st.gen0);
		usleep(2200 * 1000);
	}
	st.at = HKV_TP_VIEW_POST;
	hkv_test_view_max_ns = UINT64_MAX;
	hkv_test_hook = churn_hook;
	t = now_ns();
	ret = reclaim ? hkv_get(st.writer, KEY, strlen(KEY), v, VLEN, &vlen, NULL)
		      : hkv_delete(st.writer, KEY, strlen(KEY));
	hkv_test_hook = NULL;
	hkv_test_view_max_ns = 0;
	if (!reclaim)
		record(LC_DELETE, ret == 0 ? LC_OK : ret == HKV_ENOTFOUND ? LC_NOTFOUND : LC_UNKNOWN,
		       0, 0, t, 0);
	t = now_ns();
	got = hkv_get(st.churner, KEY, strlen(KEY), v, VLEN, &vlen, NULL);
	if (!got)
		now = strtoull(v, NULL, 10);
	record(LC_GET, got ? LC_NOTFOUND : LC_OK, 0, got ? LC_ABSENT : now, t, 1);
	hkv_client_stats(st.writer, &ws);
	printf("# %s stopped after its view while the key was set %d times (same slot value: "
	       "%s): %s; then the key reads %s %llu (the churner's last: %llu); stale views %llu, "
	       "stale swings undone %llu\n", reclaim ? "a GET reclaiming an expired item"
	       : "a delete", st.churned, st.aba ? "yes" : "no", hkv_strerror(ret),
	       hkv_strerror(got), (unsigned long long)now, (unsigned long long)st.next - 1,
	       (unsigned long long)ws.stale_views, (unsigned long long)ws.stale_undone);
	CHECK(st.aba);
	if (reclaim) {
		CHECK_RC(ret, HKV_ENOTFOUND); /* it was expired when read */
		CHECK_RC(got, 0);
		CHECK(now == st.next - 1);
	} else {
		struct lc_limits lim = {.max_seconds = 60};

		CHECK_RC(ret, 0); /* it removed the churner's last value */
		CHECK_RC(got, HKV_ENOTFOUND);
		CHECK(lc_check(LC_REGISTER, LC_ABSENT, st.ops, st.nops, &lim, &rep) ==
		      LC_LINEARIZABLE);
		if (rep.result != LC_LINEARIZABLE)
			lc_print_report(stderr, st.ops, st.nops, &rep);
		lc_report_free(&rep);
	}
	CHECK(ws.stale_undone == 0); /* no swing from a stale view to undo */
	teardown(&s, cfg);
	free(v);
}

static void test_stale_delete(void)
{
	stale_remove(0);
}

static void test_stale_reclaim(void)
{
	stale_remove(1);
}

#define RK "rival-key"

static struct hkv_client *H, *F, *G; /* test_stuck_obsolete */
static uint64_t soffX, SX, swap_from; /* hook: CAS soffX swap_from -> SX */
static int hook_fired;

static void rival_item(struct hkv_client *c, struct item *it)
{
	struct key k;
	struct view v;

	CHECK(!hkv_key_init(c, &k, RK, strlen(RK)));
	CHECK_RC(hkv_find(c, &k, it, &v), 0);
}

static uint64_t raw_cas(struct hkv_client *c, uint64_t off, uint64_t exp, uint64_t sw)
{
	struct hkv_wr wr = hkv_wr_cas(c, &c->atom[0], off, exp, sw);

	if (hkv_exec(c, &wr, 1))
		return ~0ull;
	return c->atom[0];
}

static void rival_hook(struct hkv_client *c, enum hkv_test_point p)
{
	if (c != H || p != HKV_TP_ABORT_SLOT)
		return;
	hook_fired++;
	printf("# hook: H aborted the stale PENDING; F puts SX back into its slot: %s\n",
	       raw_cas(F, soffX, swap_from, SX) == swap_from ? "done" : "FAILED");
}

/* Make the block of it a PENDING insert stamped 5 s ago (an abandoned insert). */
static void make_stale_pending(struct hkv_client *c, const struct item *it)
{
	uint64_t live = hkv_meta_make(HKV_BLK_LIVE, it->cls, it->gen);
	uint32_t *at = (uint32_t *)&c->atom[1];
	struct hkv_wr wr;

	CHECK(raw_cas(c, it->blk_off, live, hkv_meta_make(HKV_BLK_PENDING, it->cls, it->gen)) == live);
	*at = hkv_region_ms32(c) - 5000;
	wr = hkv_wr_write(c, at, it->blk_off + offsetof(struct hkv_block_hdr, atime), 4);
	CHECK_RC(hkv_exec(c, &wr, 1), 0);
}

/*
 * An insert's rival check must never clear a slot naming an OBSOLETE entry of
 * its key (a writer between its mark and its slot CAS, or dead there): every
 * find takes that entry as present. An earlier version cleared it once the
 * same handle had seen the same slot value for the lease - and a slot value
 * comes back when the block's address is reused 2048 generations on (ABA):
 * phase 1 arms that record (H's add aborts a stale insert, then meets an
 * OBSOLETE entry: EEXISTS), phase 2 (1.2 s later) shows H an OBSOLETE entry
 * at gen + 2048 under the same slot value. Its add must say EEXISTS again
 * (it said success: the key was absent for a moment, neither value).
 * (Found by a review; the forging is by raw verbs on the handles.)
 */
static void test_stuck_obsolete(void)
{
	struct hkvserver s;
	struct hkv_config *cfg;
	struct item x, y, z;
	char big[500], buf[600];
	size_t vlen;
	uint8_t xcopy[256];
	struct hkv_wr wr;
	int rc;

	memset(big, 'h', sizeof(big));
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	cfg = hkvserver_config(&s);
	CHECK_RC(hkv_open(cfg, &H), 0);
	CHECK_RC(hkv_open(cfg, &F), 0);
	CHECK_RC(hkv_open(cfg, &G), 0);
	/* X: K's block, then retired by F's update (OBSOLETE, retirer F, not aborted) */
	CHECK_RC(hkv_set(F, RK, strlen(RK), "v1", 2, NULL), 0);
	CHECK_PASSES(rival_item(F, &x));
	soffX = x.slot_off;
	SX = x.slot;
	CHECK_RC(hkv_set(F, RK, strlen(RK), "v2", 2, NULL), 0);
	CHECK_PASSES(rival_item(F, &y));
	CHECK(y.slot_off == soffX && y.blk_off != x.blk_off);
	wr = hkv_wr_read(F, F->rblk, x.blk_off, 64);
	CHECK_RC(hkv_exec(F, &wr, 1), 0);
	memcpy(xcopy, F->rblk, 64);
	printf("# X at 0x%llx gen %u: state %d retirer %u\n", (unsigned long long)x.blk_off, x.gen,
	       (int)hkv_meta_state(*(uint64_t *)xcopy), hkv_meta_retired_by(*(uint64_t *)xcopy));
	/* phase 1: Y made an abandoned insert; H's add aborts it, then sees SX (X OBSOLETE) */
	CHECK_PASSES(make_stale_pending(F, &y));
	swap_from = y.slot;
	hkv_test_hook = rival_hook;
	rc = hkv_add(H, RK, strlen(RK), big, sizeof(big), NULL);
	hkv_test_hook = NULL;
	printf("# phase 1: add -> %s (hook fired %d), H's record: slot 0x%llx value 0x%llx\n",
	       hkv_strerror(rc), hook_fired, (unsigned long long)H->stuck_slot_off,
	       (unsigned long long)H->stuck_slot);
	CHECK_RC(rc, HKV_EEXISTS);
	/* the key goes (a delete), time passes, X's address is reused: an incarnation
	 * 2048 generations on, same slot value (ABA), OBSOLETE: a writer mid-update */
	CHECK(raw_cas(F, soffX, SX, 0) == SX);
	usleep(1200 * 1000);
	CHECK_RC(hkv_set(G, RK, strlen(RK), big, sizeof(big), NULL), 0);
	CHECK_PASSES(rival_item(G, &z));
	if (z.slot_off != soffX) { /* (put Z's slot value where X's was) */
		CHECK(raw_cas(G, z.slot_off, z.slot, 0) == z.slot);
		CHECK(raw_cas(G, soffX, 0, z.slot) == 0);
		z.slot_off = soffX;
	}
	{
		struct hkv_block_hdr *h = (struct hkv_block_hdr *)F->wblk;
		uint64_t m = *(uint64_t *)xcopy;

		memcpy(F->wblk, xcopy, 64);
		h->meta = (m & 0xffffffffull) | (uint64_t)(hkv_meta_gen(m) + 2048) << 32;
		h->sum = hkv_block_sum(h, F->wblk + HKV_BLOCK_HDR);
		SX = hkv_slot_make(hkv_slot_fp(SX), hkv_slot_class(SX), hkv_meta_gen(h->meta),
				   hkv_slot_off(SX));
		wr = hkv_wr_write(F, F->wblk, x.blk_off, HKV_BLOCK_HDR + h->klen + h->vlen);
		CHECK_RC(hkv_exec(F, &wr, 1), 0);
		printf("# X' (gen %u): slot value 0x%llx, same as the record: %s\n",
		       hkv_meta_gen(h->meta), (unsigned long long)SX,
		       SX == H->stuck_slot ? "yes" : "no");
	}
	CHECK_PASSES(make_stale_pending(G, &z));
	swap_from = z.slot;
	hook_fired = 0;
	hkv_test_hook = rival_hook;
	rc = hkv_add(H, RK, strlen(RK), big, sizeof(big), NULL);
	hkv_test_hook = NULL;
	printf("# phase 2: add -> %s (hook fired %d); X' OBSOLETE was present (a cold get "
	       "would return it): add must say EXISTS\n", hkv_strerror(rc), hook_fired);
	{
		int rc2 = hkv_get(F, RK, strlen(RK), buf, sizeof(buf), &vlen, NULL);

		printf("# get after: %s, %zu bytes, first '%c'\n", hkv_strerror(rc2),
		       rc2 ? 0 : vlen, rc2 ? '-' : buf[0]);
	}
	CHECK_RC(rc, HKV_EEXISTS);
	hkv_close(H);
	hkv_close(F);
	hkv_close(G);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/*
 * flush_all removes an entry whose writer marked it OBSOLETE and died before
 * swinging the slot: every find takes it as present (a cold get returns its
 * value), so after a flush it must be gone too (it was skipped: the key
 * survived the flush).
 */
static void test_flush_obsolete(void)
{
	struct hkvserver s;
	struct hkv_config *cfg;
	struct item x;
	char buf[16];
	size_t vlen;
	uint64_t live, dead;

	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", NULL) == 0);
	cfg = hkvserver_config(&s);
	CHECK_RC(hkv_open(cfg, &H), 0);
	CHECK_RC(hkv_open(cfg, &F), 0);
	CHECK_RC(hkv_set(F, RK, strlen(RK), "v1", 2, NULL), 0);
	CHECK_PASSES(rival_item(F, &x));
	live = hkv_meta_make(HKV_BLK_LIVE, x.cls, x.gen);
	dead = hkv_meta_make(HKV_BLK_OBSOLETE, x.cls, x.gen) | hkv_meta_retirer(777);
	CHECK(raw_cas(F, x.blk_off, live, dead) == live); /* client 777 marked it, then died */
	CHECK_RC(hkv_get(H, RK, strlen(RK), buf, sizeof(buf), &vlen, NULL), 0);
	CHECK(vlen == 2 && !memcmp(buf, "v1", 2));
	CHECK_RC(hkv_flush_all(H), 0);
	CHECK_RC(hkv_get(H, RK, strlen(RK), buf, sizeof(buf), &vlen, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_get(F, RK, strlen(RK), buf, sizeof(buf), &vlen, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(F, RK, strlen(RK), "v2", 2, NULL), 0);
	printf("# an entry marked by a dead writer: present before flush_all, gone after it\n");
	hkv_close(H);
	hkv_close(F);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

int main(int argc, char **argv)
{
	use_verbs = hkvserver_want_verbs(argc, argv);
	printf("# transport %s\n", use_verbs ? "verbs" : "shm");
	RUN_TEST(test_stale_incr);
	RUN_TEST(test_stale_cas);
	RUN_TEST(test_stale_flush);
	RUN_TEST(test_stale_undo);
	RUN_TEST(test_stale_undo_raced);
	RUN_TEST(test_stale_delete);
	RUN_TEST(test_stale_reclaim);
	RUN_TEST(test_stuck_obsolete);
	RUN_TEST(test_flush_obsolete);
	return hkv_test_finish();
}
