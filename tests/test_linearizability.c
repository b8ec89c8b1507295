/*
 * test_linearizability.c - the store under contention, checked for
 * linearizability against a real hatchkv-server process:
 *
 *   test_linearizability shm           (unit tier)
 *   test_linearizability verbs         (rdma tier, Soft-RoCE guest)
 *   test_linearizability shm --quick   (fewer ops: the ThreadSanitizer run)
 *
 * One server with a small region (4 MiB, 64 KiB segments) and values of
 * about 3 KiB, so every client's segments fill and blocks are reused all
 * the time. Worker processes are this binary run again (fork + exec of
 * /proc/self/exe with a hidden "--worker" mode: RDMA state never crosses a
 * fork), each with several threads, each thread with its own handle.
 *
 *  1. The checker checks itself: hand-made histories, good and bad, and
 *     random highly concurrent ones, linearizable by construction, then
 *     with one result made impossible.
 *  2. Mixed: every thread runs get / set / cas / delete on the hot keys
 *     r0..r2 and get / incr / decr on the counter c0. Each thread records
 *     every op (times from CLOCK_MONOTONIC, shared by all processes of a
 *     host) to a file; the parent merges them and checks each key's
 *     history (register or counter model, tests/support/lincheck.h).
 *     Every written value is unique and self-describing, so a get names the
 *     write it saw, and a torn or stale block cannot pass as a value.
 *     Several rounds, each with fresh processes (which adopt the segments
 *     the last ones left) and a history of a few hundred ops per key; the
 *     parent reads each key between rounds, while nothing runs, for the
 *     next round's initial state.
 *  3. Exact count: every thread only does incr(cnt, 1); the final value
 *     must be procs x threads x N and the values incr returned must be
 *     exactly 1..total, each once.
 *  4. Reuse pressure: the mixed workload again on a server of its own with
 *     a tinier index, while one more thread per worker churns other keys
 *     with values of 2-28 KiB (sets and deletes, four size classes), so
 *     blocks, slots and segments (left wholly free at the end of a round,
 *     re-carved into other classes by the server) are reused all the time
 *     under the contended keys. The churner checks every value it reads
 *     back; no get anywhere may return bytes nobody wrote.
 *  5. Memory that flows (issue 13): the reuse workload on a cache-mode
 *     server of its own, the churners' sizes shifting between small and
 *     large classes (so writers ask the server to carve, and it empties
 *     segments of another class: its slab mover), plus one more process per
 *     round that churns many classes and is SIGKILLed while it holds
 *     claimed blocks (the server takes them back). Every write that
 *     succeeds logs the (block offset, generation) it wrote; no pair may
 *     be written twice, by any process, in any round.
 *
 * Any error other than "not found" (and "version" from cas) fails the test.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/lincheck.h"

HKV_TEST_MAIN_DEFS;

#define MAX_PROCS   4
#define MAX_THREADS 8
#define NKEYS       4 /* r0, r1, r2: registers; c0: a counter */
#define COUNTER_KEY 3
#define VALUE_CAP   4096
#define READY_FD    3 /* a worker writes one byte here once its handles are open */

static const char *const key_names[NKEYS] = {"r0", "r1", "r2", "c0"};

struct params {
	int rounds; /* of the mixed workload, each with fresh processes */
	int reuse_rounds; /* of the mixed workload under reuse pressure */
	int flow_rounds;  /* of it in cache mode, class shifts, a process killed */
	int procs, threads;
	int mix_ops;   /* ops per thread, mixed workload */
	int count_ops; /* incr per thread, exact count */
};

/* The Soft-RoCE guest is slow (TCG); the ThreadSanitizer run is short. */
static const struct params shm_params = {
	.rounds = 20, .reuse_rounds = 12, .flow_rounds = 4, .procs = 2, .threads = 3, .mix_ops = 300,
	.count_ops = 2000};
static const struct params quick_params = {
	.rounds = 8, .reuse_rounds = 4, .flow_rounds = 2, .procs = 2, .threads = 3, .mix_ops = 300,
	.count_ops = 500};
static const struct params verbs_params = {
	.rounds = 30, .reuse_rounds = 10, .flow_rounds = 3, .procs = 2, .threads = 3, .mix_ops = 300,
	.count_ops = 1000};

static struct params prm;
static int race_verbs; /* the verbs transport (every test's servers) */
static struct hkvserver server;
static int server_up;

static int flow_mode; /* "flow" rounds (cache mode, class shifts, a process killed) */
/* flow rounds in a store: the victim only in every other round (its churn
 * makes many times the moves, and rounds last longer), and its keys are
 * deleted once it is killed (a cache evicts them; a store would keep up to
 * 1.8 MB of them and refuse the hot keys' writes as full) */
static int flow_store;

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- values: unique, self-describing, ~3 KiB or tiny --------------------------- */

/*
 * A write's id, unique over the whole run: round << 56 | (proc + 1) << 48 |
 * (thread + 1) << 32 | seq. Violation reports print register values as
 * these, in hex.
 */
static uint64_t value_id(unsigned round, unsigned proc, unsigned thread, unsigned seq)
{
	return (uint64_t)round << 56 | (uint64_t)(proc + 1) << 48 | (uint64_t)(thread + 1) << 32 |
	       seq;
}

/* "w<round>.<proc>.<thread>.<seq>:" and a filler that depends on the id. */
static size_t make_value(uint64_t id, char *buf)
{
	uint64_t h = (id * 0x9e3779b97f4a7c15ull) >> 32;
	size_t len = (size_t)sprintf(buf, "w%u.%u.%u.%u:", (unsigned)(id >> 56),
				     (unsigned)(id >> 48 & 0xff) - 1, (unsigned)(id >> 32 & 0xffff) - 1,
				     (unsigned)id);
	size_t want = h % 4 == 0 ? len + h % 12 : 3000 + h % 150;

	if (flow_mode) /* many blocks to a segment: no class of theirs runs short */
		want = len + h % 120;

	for (size_t i = len; i < want; i++)
		buf[i] = (char)('a' + (h + i) % 26);
	return want;
}

/* The id of the write whose value buf holds, or LC_GARBAGE. buf[len] is writable. */
static uint64_t parse_value(char *buf, size_t len, char *scratch)
{
	unsigned r, p, t, seq;
	int used = 0;
	uint64_t id;

	buf[len] = 0;
	if (sscanf(buf, "w%u.%u.%u.%u:%n", &r, &p, &t, &seq, &used) != 4 || !used)
		return LC_GARBAGE;
	id = value_id(r, p, t, seq);
	return make_value(id, scratch) == len && !memcmp(buf, scratch, len) ? id : LC_GARBAGE;
}

static uint64_t parse_counter(const char *buf, size_t len)
{
	uint64_t v = 0;

	while (len && buf[len - 1] == ' ')
		len--;
	if (!len || len > 19)
		return LC_GARBAGE;
	for (size_t i = 0; i < len; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			return LC_GARBAGE;
		v = v * 10 + (uint64_t)(buf[i] - '0');
	}
	return v;
}

/* ---- worker threads -------------------------------------------------------- */

struct rec {
	int key;
	struct lc_op op;
};

static pthread_barrier_t start_line; /* a worker's threads start together */

struct wthread {
	pthread_t tid;
	struct hkv_client *c;
	int round, proc, thread, nops, errors;
	unsigned seed, seq;
	struct rec *recs;  /* mixed workload */
	uint64_t *results; /* exact count: what each incr returned */
	size_t n;
	struct hkv_client_stats st; /* as of its close (mixed workload) */
	int have[NKEYS];      /* a get of the key succeeded: */
	uint64_t ver[NKEYS];  /* its version */
	uint64_t seen[NKEYS]; /* and value */
	char wbuf[VALUE_CAP + 1], rbuf[VALUE_CAP + 1], scratch[VALUE_CAP + 1];
};

static int issue(struct wthread *t, int key, struct lc_op *op, size_t wlen, uint64_t version,
		 size_t *vlen, struct hkv_item_info *info)
{
	const char *k = key_names[key];
	size_t kl = strlen(k);

	switch (op->kind) {
	case LC_GET:
		return hkv_get(t->c, k, kl, t->rbuf, VALUE_CAP, vlen, info);
	case LC_SET:
		return hkv_set(t->c, k, kl, t->wbuf, wlen, NULL);
	case LC_CAS:
		return hkv_cas(t->c, k, kl, t->wbuf, wlen, version, NULL);
	case LC_DELETE:
		return hkv_delete(t->c, k, kl);
	case LC_ADD:
		return hkv_add(t->c, k, kl, t->wbuf, wlen, NULL);
	case LC_INCR:
		return hkv_incr(t->c, k, kl, op->arg, &op->out);
	case LC_DECR:
		return hkv_decr(t->c, k, kl, op->arg, &op->out);
	default:
		return -EINVAL;
	}
}

/* What a return code means for the history; -1 if it is an error. */
static int classify(int rc, enum lc_kind kind, enum lc_status *st)
{
	if (rc == 0)
		*st = LC_OK;
	else if (rc == HKV_ENOTFOUND)
		*st = LC_NOTFOUND;
	else if (rc == HKV_EVERSION && kind == LC_CAS)
		*st = LC_VERSION;
	else if (rc == HKV_EEXISTS && kind == LC_ADD)
		*st = LC_EXISTS;
	else
		return -1;
	return 0;
}

/* A successful get: what it read, and the version for a later cas. */
static void got_value(struct wthread *t, int key, struct lc_op *op, size_t vlen,
		      const struct hkv_item_info *info)
{
	if (key == COUNTER_KEY) {
		op->out = parse_counter(t->rbuf, vlen);
		return;
	}
	op->out = parse_value(t->rbuf, vlen, t->scratch);
	t->have[key] = 1;
	t->ver[key] = info->version;
	t->seen[key] = op->out;
}

/* Where every successful write logs the block it wrote ("blk OFF GEN"): one
 * write(2) per line on an O_APPEND file, so a SIGKILL loses no line. -1: off. */
static int blk_fd = -1;

/* The block handle c's last write published, as (offset, generation): the
 * handle's allocator remembers the block it handed out last (a test may
 * look inside). No API names a block's offset (hkv_item_info.version is the
 * write id). */
static void log_block(struct hkv_client *c)
{
	char line[64];
	int n;

	if (blk_fd < 0 || !c->cur.off)
		return;
	n = snprintf(line, sizeof(line), "blk %llu %u\n", (unsigned long long)c->cur.off,
		     c->cur.gen + 1 ? c->cur.gen + 1 : 1);
	if (write(blk_fd, line, (size_t)n) != n)
		fprintf(stderr, "cannot log a block\n");
}

/* Run op (kind, arg, expect filled in) on key and record it; -1 on an error. */

static int run_op(struct wthread *t, int key, struct lc_op *op, uint64_t version)
{
	struct hkv_item_info info = {0};
	size_t wlen = 0, vlen = 0;
	int rc;

	if (op->kind == LC_SET || op->kind == LC_CAS || op->kind == LC_ADD)
		wlen = make_value(op->arg, t->wbuf);
	op->client = t->proc * MAX_THREADS + t->thread;
	op->call = now_ns();
	rc = issue(t, key, op, wlen, version, &vlen, &info);
	op->ret = now_ns();
	if (!rc && op->kind != LC_GET && op->kind != LC_DELETE)
		log_block(t->c);
	if (flow_mode && rc == HKV_EFULL && op->kind != LC_GET) {
		/* flow rounds, cache mode: making room evicted the very key
		 * written (write.c says "full" then). No effect: unknown, which
		 * the checker may place anywhere or nowhere; counted, reported */
		op->status = LC_UNKNOWN;
		op->ret = INT64_MAX;
		op->out = 1; /* (marks it for the count) */
		t->recs[t->n++] = (struct rec){key, *op};
		return 0;
	}
	if (classify(rc, op->kind, &op->status)) {
		fprintf(stderr, "worker %d.%d: %s %s failed after %zu ops: %s\n", t->proc,
			t->thread, lc_kind_name(op->kind), key_names[key], t->n, hkv_strerror(rc));
		op->status = LC_UNKNOWN; /* it may or may not have happened */
		op->ret = INT64_MAX;
		t->errors++;
	} else if (op->kind == LC_GET && op->status == LC_OK) {
		got_value(t, key, op, vlen, &info);
	}
	t->recs[t->n++] = (struct rec){key, *op};
	return op->status == LC_UNKNOWN ? -1 : 0;
}

static uint64_t next_value(struct wthread *t)
{
	return value_id((unsigned)t->round, (unsigned)t->proc, (unsigned)t->thread, ++t->seq);
}

/* One op of lincheck.h's mix on a register key (a cas with the version of
 * the thread's last get of it). */
static int register_op(struct wthread *t, int key)
{
	struct lc_op op = {0};
	int get_first;
	unsigned r = lc_mix_roll(&t->seed, t->have[key], &get_first);

	if (get_first) {
		struct lc_op get = {.kind = LC_GET};

		if (run_op(t, key, &get, 0))
			return -1;
	}
	op.kind = lc_mix_kind(r, t->have[key]);
	if (op.kind == LC_SET || op.kind == LC_CAS || op.kind == LC_ADD)
		op.arg = next_value(t);
	if (op.kind == LC_CAS)
		op.expect = t->seen[key];
	return run_op(t, key, &op, t->ver[key]);
}

/* One op of lincheck.h's counter mix. */
static int counter_op(struct wthread *t)
{
	struct lc_op op = {0};

	op.kind = lc_counter_mix(&t->seed, &op.arg);
	return run_op(t, COUNTER_KEY, &op, 0);
}


static void *mix_thread(void *arg)
{
	struct wthread *t = arg;

	pthread_barrier_wait(&start_line);
	for (int i = 0; i < t->nops; i++) {
		int key = (int)((unsigned)rand_r(&t->seed) % NKEYS);

		if (rand_r(&t->seed) % 8 == 0)
			sched_yield(); /* more threads than CPUs: mix their ops up */
		if (key == COUNTER_KEY ? counter_op(t) : register_op(t, key))
			break;
	}
	/* Done: the handle goes now, not when the process ends. A connected
	 * handle gives back the blocks it kept (replaced, for its next write)
	 * only from its own operations: an idle one's would stop a store's
	 * move of their segment until it is undone, 3 s later - while a
	 * sibling thread waits on that move (docs/design.md, "A store moves
	 * live items instead"). */
	hkv_client_stats(t->c, &t->st);
	hkv_close(t->c);
	t->c = NULL;
	return NULL;
}

/* ---- reuse pressure: a churner per worker, on keys of its own -------------------- */

#define CHURN_KEYS 32
#define CHURN_MAX  (28u << 10)
/* four size classes: a store mode region this small cannot give every client
 * a segment of thirty classes (issue 13); the hot keys must always fit */
static const size_t churn_sizes[] = {2u << 10, 6u << 10, 14u << 10, CHURN_MAX};

struct churner {
	pthread_t tid;
	struct hkv_client *c;
	int proc, round, errors;
	unsigned seed;
	atomic_int *stop;
	int victim; /* the process to be killed: no start line, notes what it holds */
	uint64_t sets, deletes, gets, full, garbage;
	char *wbuf, *rbuf;
	const char *prefix; /* of its keys: "z" (a worker's), "v" (the victim's) */
};

/* Value of churn key k, version seq: "z<proc>.<k>.<seq>:" and a filler. */
static size_t churn_value(const struct churner *ch, int k, unsigned seq, char *buf)
{
	uint64_t h = ((uint64_t)seq * 2654435761u ^ (uint64_t)k << 20) * 0x9e3779b97f4a7c15ull;
	size_t len = (size_t)sprintf(buf, "z%d.%d.%u:", ch->proc, k, seq);
	size_t want = churn_sizes[(h >> 40) % 4] - (size_t)(h >> 50) % 512;

	/* flow rounds: many classes, small and large by turns of 64 writes -
	 * none of the hot keys' (tiny, ~3 KiB): writers evict in their own class */
	if (flow_mode)
		want = seq >> 6 & 1 ? (6u << 10) + (size_t)(h >> 40) % (22u << 10)
				    : 200 + (size_t)(h >> 40) % 1300;

	for (size_t i = len; i < want; i++)
		buf[i] = (char)('A' + (h >> 3 ^ i) % 26);
	return want;
}

/* Is buf (vlen bytes) a value churn_value wrote for key k? */
static int churn_valid(const struct churner *ch, int k, const char *buf, size_t vlen,
		       char *scratch)
{
	int p, kk, used = 0;
	unsigned seq;

	if (vlen > CHURN_MAX || sscanf(buf, "z%d.%d.%u:%n", &p, &kk, &seq, &used) != 3 || !used ||
	    p != ch->proc || kk != k)
		return 0;
	return churn_value(ch, k, seq, scratch) == vlen && !memcmp(buf, scratch, vlen);
}

/* The victim, after each set: how many claimed blocks it holds now (it is
 * killed at any moment: the parent reads the last line). */
static void victim_note(const struct churner *ch)
{
	const struct hkv_client *c = ch->c;
	uint64_t held = 0;
	char line[96];
	int n;

	for (uint32_t i = 0; i < c->g.nclasses; i++)
		held += c->classes[i].n - c->classes[i].head;
	n = snprintf(line, sizeof(line), "held %d %llu %llu %llu\n", ch->proc - 10,
		     (unsigned long long)held,
		     (unsigned long long)c->stats.claims, (unsigned long long)c->stats.carves);
	if (write(blk_fd, line, (size_t)n) != n)
		fprintf(stderr, "cannot log a note\n");
}

static void *churn_thread(void *arg)
{
	struct churner *ch = arg;
	char *scratch = malloc(CHURN_MAX + 1);
	unsigned seq = 0;

	if (!ch->victim)
		pthread_barrier_wait(&start_line);
	while (scratch && !atomic_load(ch->stop)) {
		int k = (int)((unsigned)rand_r(&ch->seed) % CHURN_KEYS), r = rand_r(&ch->seed) % 10;
		char key[32];
		size_t kl = (size_t)snprintf(key, sizeof(key), "%s%d.%d", ch->prefix, ch->proc, k);
		size_t vlen = 0;
		int rc;

		if (r < 6) {
			rc = hkv_set(ch->c, key, kl, ch->wbuf,
				     churn_value(ch, k, (unsigned)ch->round << 20 | ++seq, ch->wbuf),
				     NULL);
			if (!rc)
				log_block(ch->c);
			if (ch->victim)
				victim_note(ch);
			ch->sets += !rc;
			ch->full += rc == HKV_EFULL; /* a small region: fine, deletes free it */
			rc = rc == HKV_EFULL ? 0 : rc;
		} else if (r < 8) {
			rc = hkv_delete(ch->c, key, kl);
			ch->deletes += !rc;
			rc = rc == HKV_ENOTFOUND ? 0 : rc;
		} else {
			rc = hkv_get(ch->c, key, kl, ch->rbuf, CHURN_MAX, &vlen, NULL);
			if (!rc && !churn_valid(ch, k, ch->rbuf, vlen, scratch)) {
				ch->garbage++;
				fprintf(stderr, "churner %d: get %s returned a value nobody wrote\n",
					ch->proc, key);
			}
			ch->gets += !rc;
			rc = rc == HKV_ENOTFOUND ? 0 : rc;
		}
		if (rc) {
			fprintf(stderr, "churner %d: %s\n", ch->proc, hkv_strerror(rc));
			ch->errors++;
			break;
		}
	}
	/* leave nothing: the next round finds wholly free segments */
	for (int k = 0; k < CHURN_KEYS; k++) {
		char key[32];
		int rc = hkv_delete(ch->c, key, (size_t)snprintf(key, sizeof(key), "%s%d.%d",
								 ch->prefix, ch->proc, k));

		ch->errors += rc && rc != HKV_ENOTFOUND;
	}
	free(scratch);
	return NULL;
}

static void *count_thread(void *arg)
{
	struct wthread *t = arg;

	pthread_barrier_wait(&start_line);
	for (int i = 0; i < t->nops; i++) {
		int rc = hkv_incr(t->c, "cnt", 3, 1, &t->results[t->n]);

		if (rc) {
			fprintf(stderr, "worker %d.%d: incr cnt failed after %zu: %s\n", t->proc,
				t->thread, t->n, hkv_strerror(rc));
			t->errors++;
			break;
		}
		t->n++;
	}
	return NULL;
}

/* -- worker processes: --worker MODE URI TOKEN_FILE ROUND PROC THREADS OPS HISTORY -- */

static void write_history(FILE *f, const struct wthread *t)
{
	struct hkv_client_stats st;

	for (size_t i = 0; t->recs && i < t->n; i++) {
		const struct rec *r = &t->recs[i];

		fprintf(f, "op %d %d %d %d %llu %llu %llu %lld %lld\n", r->key, r->op.kind,
			r->op.status, r->op.client, (unsigned long long)r->op.arg,
			(unsigned long long)r->op.expect, (unsigned long long)r->op.out,
			(long long)r->op.call, (long long)r->op.ret);
	}
	for (size_t i = 0; t->results && i < t->n; i++)
		fprintf(f, "res %llu\n", (unsigned long long)t->results[i]);
	if (t->c)
		hkv_client_stats(t->c, &st);
	else /* (closed when done) */
		st = t->st;
	fprintf(f, "stats %llu %llu %llu %d %llu %llu\n", (unsigned long long)st.blocks_freed,
		(unsigned long long)st.claims, (unsigned long long)st.op[HKV_OP_INCR].retries,
		t->errors, (unsigned long long)st.carves, (unsigned long long)st.blocks_claimed);
}

/* Open the handles, report ready, wait until the parent closes our stdin. */
static struct wthread *worker_setup(const struct hkvserver *s, int round, int proc,
				    int nthreads, int nops, int count_mode)
{
	struct wthread *ts = calloc((size_t)nthreads, sizeof(*ts));
	char c;

	for (int i = 0; ts && i < nthreads; i++) {
		struct wthread *t = &ts[i];

		*t = (struct wthread){.round = round, .proc = proc, .thread = i, .nops = nops,
				      .seed = (unsigned)(round * 15485863 + proc * 7919 +
							 i * 104729 + 1)};
		if (count_mode)
			t->results = calloc((size_t)nops, sizeof(*t->results));
		else
			t->recs = calloc(2 * (size_t)nops, sizeof(*t->recs));
		if (!t->results && !t->recs)
			return NULL;
		t->c = hkvserver_client(s);
	}
	if (!ts || write(READY_FD, "r", 1) != 1)
		return NULL;
	close(READY_FD);
	while (read(0, &c, 1) > 0)
		;
	return ts;
}

/* A store: the killed victim's keys go (its churners' "v<proc>.<k>"). 0 or -1. */
static int victim_keys_delete(void)
{
	struct hkv_client *c = hkvserver_client(&server);
	int ret = 0;

	for (int i = 0; i < prm.procs; i++) /* (victim_main's nthreads) */
		for (int k = 0; k < CHURN_KEYS; k++) {
			char key[32];
			int rc = hkv_delete(c, key, (size_t)snprintf(key, sizeof(key), "v%d.%d",
								     10 + i, k));

			if (rc && rc != HKV_ENOTFOUND) {
				fprintf(stderr, "flow: deleting the victim's %s: %s\n", key,
					hkv_strerror(rc));
				ret = -1;
			}
		}
	hkv_close(c);
	return ret;
}

/*
 * The flow rounds' victim: nthreads churners of many classes on keys of its
 * own, from when the parent starts the round until it kills us (SIGKILL,
 * mid-round, while we hold claimed blocks). Logs to HISTORY.blk only.
 */
static int victim_main(const struct hkvserver *s, int round, int nthreads, const char *hist)
{
	struct churner ch[MAX_THREADS];
	atomic_int stop = 0;
	char path[256], c;

	snprintf(path, sizeof(path), "%s.blk", hist);
	blk_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
	if (blk_fd < 0 || nthreads > MAX_THREADS)
		return 4;
	for (int i = 0; i < nthreads; i++) {
		ch[i] = (struct churner){.proc = 10 + i, .round = round, .stop = &stop, .victim = 1,
					 .seed = (unsigned)(round * 977 + i + 3), .prefix = "v",
					 .wbuf = malloc(CHURN_MAX + 1), .rbuf = malloc(CHURN_MAX + 1)};
		if (!ch[i].wbuf || !ch[i].rbuf)
			return 3;
		ch[i].c = hkvserver_client(s);
	}
	if (write(READY_FD, "r", 1) != 1)
		return 3;
	close(READY_FD);
	while (read(0, &c, 1) > 0)
		;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&ch[i].tid, NULL, churn_thread, &ch[i]);
	sleep(30); /* killed long before */
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(ch[i].tid, NULL);
		hkv_close(ch[i].c);
	}
	return 5; /* not killed: the parent counts that as a failure */
}

static int worker_main(int argc, char **argv)
{
	struct hkvserver s = {0};
	int count_mode, reuse, round, proc, nthreads, nops, errors = 0;
	struct churner ch = {0};
	struct hkv_client_stats ch_st = {0};
	atomic_int stop = 0;
	struct wthread *ts;
	FILE *f;

	if (argc != 10)
		return 2;
	count_mode = !strcmp(argv[2], "count");
	reuse = !strcmp(argv[2], "reuse") || !strcmp(argv[2], "flow");
	flow_mode = !strcmp(argv[2], "flow") || !strcmp(argv[2], "victim");
	snprintf(s.uri, sizeof(s.uri), "%s", argv[3]);
	snprintf(s.token_file, sizeof(s.token_file), "%s", argv[4]);
	round = atoi(argv[5]);
	proc = atoi(argv[6]);
	nthreads = atoi(argv[7]);
	nops = atoi(argv[8]);
	if (!strcmp(argv[2], "victim"))
		return victim_main(&s, round, nthreads, argv[9]);
	if (flow_mode) {
		char path[256];

		snprintf(path, sizeof(path), "%s.blk", argv[9]);
		blk_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
		if (blk_fd < 0)
			return 4;
	}
	if (reuse) { /* before worker_setup reports ready */
		ch = (struct churner){.proc = proc, .round = round, .stop = &stop, .prefix = "z",
				      .seed = (unsigned)(round * 31 + proc + 7),
				      .wbuf = malloc(CHURN_MAX + 1), .rbuf = malloc(CHURN_MAX + 1)};
		if (!ch.wbuf || !ch.rbuf)
			return 3;
		ch.c = hkvserver_client(&s);
	}
	ts = worker_setup(&s, round, proc, nthreads, nops, count_mode);
	if (!ts)
		return 3;
	pthread_barrier_init(&start_line, NULL, (unsigned)(nthreads + reuse));
	if (reuse)
		pthread_create(&ch.tid, NULL, churn_thread, &ch);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&ts[i].tid, NULL, count_mode ? count_thread : mix_thread, &ts[i]);
	for (int i = 0; i < nthreads; i++)
		pthread_join(ts[i].tid, NULL);
	if (reuse) {
		atomic_store(&stop, 1);
		pthread_join(ch.tid, NULL);
		printf("# churner %d: %llu sets (%llu refused: full), %llu deletes, %llu gets, %llu "
		       "values nobody wrote\n", proc, (unsigned long long)ch.sets,
		       (unsigned long long)ch.full, (unsigned long long)ch.deletes,
		       (unsigned long long)ch.gets, (unsigned long long)ch.garbage);
		errors += ch.errors + (int)ch.garbage;
		hkv_client_stats(ch.c, &ch_st);
		hkv_close(ch.c);
		free(ch.wbuf);
		free(ch.rbuf);
	}
	f = fopen(argv[9], "w");
	if (!f)
		return 4;
	if (reuse) /* the churner's allocation counts (its ops are not in the history) */
		fprintf(f, "stats %llu %llu 0 0 %llu %llu\n", (unsigned long long)ch_st.blocks_freed,
			(unsigned long long)ch_st.claims, (unsigned long long)ch_st.carves,
			(unsigned long long)ch_st.blocks_claimed);
	for (int i = 0; i < nthreads; i++) {
		write_history(f, &ts[i]);
		errors += ts[i].errors;
		hkv_close(ts[i].c);
		free(ts[i].results);
		free(ts[i].recs);
	}
	free(ts);
	pthread_barrier_destroy(&start_line);
	return fclose(f) || errors ? 1 : 0;
}

/* ---- the parent: a crew of worker processes ------------------------------------- */

struct history {
	struct lc_op *ops[NKEYS];
	size_t n[NKEYS], cap[NKEYS];
	uint64_t *results;
	size_t nres, capres;
	uint64_t freed, claims, incr_retries; /* blocks freed, claim chains won */
	uint64_t carves, claimed;             /* CARVE requests, blocks claimed */
	uint64_t min_claims;                  /* of one process (handles + churner) */
	int min_claims_set, errors;
};

struct crew {
	int n;
	pid_t pid[MAX_PROCS];
	char hist[MAX_PROCS][200];
	pid_t victim; /* flow rounds: the process killed mid-round; else 0 */
	char victim_hist[200];
	int go_fd, ready_fd;
};

/* fd `from` becomes `to` in a child about to exec (close-on-exec cleared). */
static void move_fd(int from, int to)
{
	if (from == to)
		fcntl(to, F_SETFD, 0);
	else
		dup2(from, to);
}

static pid_t spawn_worker(const char *mode, int round, int proc, int nops, const char *hist,
			  int go, int ready)
{
	char sround[16], sproc[16], sthreads[16], sops[16];
	char *argv[] = {"/proc/self/exe", "--worker", (char *)mode, server.uri, server.token_file,
			sround, sproc, sthreads, sops, (char *)hist, NULL};
	pid_t pid;

	snprintf(sround, sizeof(sround), "%d", round);
	snprintf(sproc, sizeof(sproc), "%d", proc);
	snprintf(sthreads, sizeof(sthreads), "%d", prm.threads);
	snprintf(sops, sizeof(sops), "%d", nops);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		move_fd(go, 0);
		move_fd(ready, READY_FD);
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static int crew_spawn(struct crew *w, const char *mode, int round, int nops)
{
	int go[2], ready[2];

	*w = (struct crew){.go_fd = -1, .ready_fd = -1};
	if (pipe2(go, O_CLOEXEC))
		return -1;
	if (pipe2(ready, O_CLOEXEC)) {
		close(go[0]);
		close(go[1]);
		return -1;
	}
	for (int p = 0; p < prm.procs; p++) {
		snprintf(w->hist[p], sizeof(w->hist[p]), "%s/%s-%d.hist", server.dir, mode, p);
		w->pid[p] = spawn_worker(mode, round, p, nops, w->hist[p], go[0], ready[1]);
		if (w->pid[p] < 0)
			break;
		w->n++;
	}
	if (!strcmp(mode, "flow") && w->n == prm.procs && (!flow_store || round % 2 == 0)) {
		snprintf(w->victim_hist, sizeof(w->victim_hist), "%s/victim.hist", server.dir);
		w->victim = spawn_worker("victim", round, prm.procs, nops, w->victim_hist, go[0],
					 ready[1]);
	}
	close(go[0]);
	close(ready[1]);
	w->go_fd = go[1];
	w->ready_fd = ready[0];
	return w->n == prm.procs && w->victim >= 0 ? 0 : -1;
}

/* Every worker has its handles open (one byte each), within two minutes. */
static int crew_ready(struct crew *w)
{
	int got = 0;
	char buf[MAX_PROCS + 1];

	while (got < w->n + (w->victim > 0)) {
		struct pollfd pfd = {.fd = w->ready_fd, .events = POLLIN};
		ssize_t r;

		if (poll(&pfd, 1, 120000) != 1)
			return -1;
		r = read(w->ready_fd, buf, sizeof(buf));
		if (r <= 0)
			return -1;
		got += (int)r;
	}
	return 0;
}

/* Wait for all; 0 if each exited 0. kill_first: stop them first. */
static int crew_reap(struct crew *w, int kill_first)
{
	int bad = 0;

	if (w->go_fd >= 0)
		close(w->go_fd);
	close(w->ready_fd);
	if (w->victim > 0) { /* (killed already, unless something failed first) */
		kill(w->victim, SIGKILL);
		waitpid(w->victim, NULL, 0);
		w->victim = 0;
	}
	for (int p = 0; p < w->n; p++) {
		int status;

		if (kill_first)
			kill(w->pid[p], SIGKILL);
		if (waitpid(w->pid[p], &status, 0) != w->pid[p])
			status = -1;
		if (status && !kill_first)
			fprintf(stderr, "worker %d (pid %d) failed: %s %d\n", p, (int)w->pid[p],
				WIFSIGNALED(status) ? "signal" : "exit status",
				WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		bad += status != 0;
	}
	return bad ? -1 : 0;
}

static int add_op(struct history *h, int key, const struct lc_op *op)
{
	if (key < 0 || key >= NKEYS)
		return -1;
	if (h->n[key] == h->cap[key]) {
		size_t cap = h->cap[key] ? 2 * h->cap[key] : 256;
		struct lc_op *p = realloc(h->ops[key], cap * sizeof(*p));

		if (!p)
			return -1;
		h->ops[key] = p;
		h->cap[key] = cap;
	}
	h->ops[key][h->n[key]++] = *op;
	return 0;
}

static int add_result(struct history *h, uint64_t v)
{
	if (h->nres == h->capres) {
		size_t cap = h->capres ? 2 * h->capres : 1024;
		uint64_t *p = realloc(h->results, cap * sizeof(*p));

		if (!p)
			return -1;
		h->results = p;
		h->capres = cap;
	}
	h->results[h->nres++] = v;
	return 0;
}

static int parse_line(struct history *h, const char *line)
{
	unsigned long long a, b, c, d, e;
	long long call, ret;
	int key, kind, status, client, errors;
	struct lc_op op;

	if (sscanf(line, "op %d %d %d %d %llu %llu %llu %lld %lld", &key, &kind, &status, &client,
		   &a, &b, &c, &call, &ret) == 9) {
		if (kind < 0 || kind >= LC_NKINDS || status < 0 || status > LC_EXISTS)
			return -1;
		op = (struct lc_op){(enum lc_kind)kind, (enum lc_status)status, client, a, b, c,
				    call, ret};
		return add_op(h, key, &op);
	}
	if (sscanf(line, "res %llu", &a) == 1)
		return add_result(h, a);
	if (sscanf(line, "stats %llu %llu %llu %d %llu %llu", &a, &b, &c, &errors, &d, &e) == 6) {
		h->freed += a;
		h->claims += b;
		h->incr_retries += c;
		h->carves += d;
		h->claimed += e;
		h->errors += errors;
		return 0;
	}
	return -1;
}

static int load_history(struct history *h, const char *path)
{
	char line[256];
	FILE *f = fopen(path, "r");
	int ret = f ? 0 : -1;
	uint64_t claims = h->claims;

	while (!ret && f && fgets(line, sizeof(line), f))
		ret = parse_line(h, line);
	claims = h->claims - claims;
	if (!h->min_claims_set || claims < h->min_claims)
		h->min_claims = claims;
	h->min_claims_set = 1;
	if (f)
		fclose(f);
	if (!getenv("HKV_TEST_KEEP"))
		unlink(path);
	if (ret)
		fprintf(stderr, "cannot read history %s\n", path);
	return ret;
}

static void history_free(struct history *h)
{
	for (int k = 0; k < NKEYS; k++)
		free(h->ops[k]);
	free(h->results);
}

/* Every (block offset, generation) a flow round's process wrote, over all
 * the flow rounds; and what the victims held when killed. */
static uint64_t *blks;
static size_t nblks, capblks;
static uint64_t victims_holding, victim_held, victim_claims, victim_carves;

/* Read HIST.blk: "blk OFF GEN" lines, and the victim's "held N CLAIMS CARVES". */
static int load_blocks(const char *hist, int victim)
{
	unsigned long long a, b, c, held[MAX_THREADS] = {0}, claims[MAX_THREADS] = {0};
	unsigned long long carves[MAX_THREADS] = {0};
	char path[256], line[128];
	FILE *f;
	int ret = 0, t;

	snprintf(path, sizeof(path), "%s.blk", hist);
	if (!(f = fopen(path, "r"))) {
		fprintf(stderr, "cannot read %s\n", path);
		return -1;
	}
	while (!ret && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "blk %llu %llu", &a, &b) == 2) {
			if (nblks == capblks) {
				size_t cap = capblks ? 2 * capblks : 4096;
				uint64_t *p = realloc(blks, cap * sizeof(*p));

				if (!p) {
					ret = -1;
					break;
				}
				blks = p;
				capblks = cap;
			}
			/* offsets are 64 B aligned and the region is small: one word */
			blks[nblks++] = (a / 64) << 32 | (b & 0xffffffffull);
		} else if (sscanf(line, "held %d %llu %llu %llu", &t, &a, &b, &c) == 4 && t >= 0 &&
			   t < MAX_THREADS) { /* a victim thread's last line counts */
			held[t] = a;
			claims[t] = b;
			carves[t] = c;
		} else if (strchr(line, '\n')) { /* (a line the kill cut short is no error) */
			ret = -1;
		}
	}
	fclose(f);
	if (!getenv("HKV_TEST_KEEP"))
		unlink(path);
	if (victim) {
		uint64_t sum = 0;

		for (t = 0; t < MAX_THREADS; t++) {
			sum += held[t];
			victim_claims += claims[t];
			victim_carves += carves[t];
		}
		victims_holding += sum > 0;
		victim_held += sum;
	}
	return ret;
}

/* Does the victim hold claimed blocks, by the last "held" line of each of
 * its threads in HIST.blk? (Read while it is stopped: the lines stand.) */
static int victim_holds(const char *hist)
{
	unsigned long long held[MAX_THREADS] = {0}, a, b, c;
	char path[256], line[128];
	FILE *f;
	int t, any = 0;

	snprintf(path, sizeof(path), "%s.blk", hist);
	if (!(f = fopen(path, "r")))
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "held %d %llu %llu %llu", &t, &a, &b, &c) == 4 && t >= 0 &&
		    t < MAX_THREADS)
			held[t] = a;
	fclose(f);
	for (t = 0; t < MAX_THREADS; t++)
		any |= held[t] > 0;
	return any;
}

/*
 * Kill the victim mid-round, while it holds claimed blocks: after 100-500
 * ms, stop it; if its notes say it holds none, let it run 20-50 ms more and
 * look again (up to ~10 s). A kill that found nothing held tests nothing,
 * and a random moment alone found it holding in only one of two rounds
 * under the sanitizers.
 */
static int kill_victim(const char *mode, pid_t victim, const char *hist)
{
	int status = 0;

	usleep(100000 + (useconds_t)(random() % 400) * 1000);
	for (int tries = 0; tries < 200; tries++) {
		if (kill(victim, SIGSTOP) || waitpid(victim, &status, WUNTRACED) != victim ||
		    !WIFSTOPPED(status))
			break; /* (it died: the check below says so) */
		if (victim_holds(hist))
			break;
		kill(victim, SIGCONT);
		usleep(20000 + (useconds_t)(random() % 30) * 1000);
	}
	kill(victim, SIGKILL);
	if (waitpid(victim, &status, 0) != victim || !WIFSIGNALED(status) ||
	    WTERMSIG(status) != SIGKILL) {
		fprintf(stderr, "%s: the victim was not killed mid-round (status %d)\n", mode,
			status);
		return -1;
	}
	return 0;
}

/*
 * Spawn the workers, let init() prepare the keys once they are connected,
 * start them together, wait for them and merge their histories into *h.
 */
static int run_crew(const char *mode, int round, int nops, int (*init)(struct hkv_client *),
		    struct history *h)
{
	struct crew w;
	struct hkv_client *c;
	int ret = 0;

	if (crew_spawn(&w, mode, round, nops) || crew_ready(&w)) {
		fprintf(stderr, "%s: workers did not start\n", mode);
		crew_reap(&w, 1);
		return -1;
	}
	c = hkvserver_client(&server); /* after the forks: no RDMA state is forked */
	ret = init(c);
	hkv_close(c);
	if (ret) {
		fprintf(stderr, "%s: init failed: %s\n", mode, hkv_strerror(ret));
		crew_reap(&w, 1);
		return -1;
	}
	if (w.victim > 0) {
		close(w.go_fd); /* start them */
		w.go_fd = -1;
		/* the victim claims blocks all the time, and holds some
		 * between its claims and its writes */
		ret = kill_victim(mode, w.victim, w.victim_hist);
		w.victim = 0;
		ret |= load_blocks(w.victim_hist, 1);
		if (flow_store)
			ret |= victim_keys_delete();
	}
	ret |= crew_reap(&w, 0); /* closing go starts them */
	for (int p = 0; p < w.n; p++) {
		ret |= load_history(h, w.hist[p]);
		if (!strcmp(mode, "flow"))
			ret |= load_blocks(w.hist[p], 0);
	}
	return ret;
}

/* ---- 1. the checker checks itself ------------------------------------------------- */

/* An op of a hand-made history (client 0). */
#define OP(kind, st, arg, expect, out, call, ret)                                          \
	{(kind), (st), 0, (arg), (expect), (out), (call), (ret)}

static enum lc_result check_hand(enum lc_model m, const struct lc_op *ops, size_t n,
				 uint64_t max_steps)
{
	struct lc_limits lim = {.max_steps = max_steps, .max_seconds = 10};
	struct lc_report rep;
	enum lc_result r = lc_check(m, m == LC_REGISTER ? LC_ABSENT : 0, ops, n, &lim, &rep);

	lc_report_free(&rep);
	return r;
}

#define CHECK_HISTORY(m, ops, want)                                                         \
	CHECK(check_hand((m), (ops), sizeof(ops) / sizeof((ops)[0]), 0) == (want))

static void test_checker_hand(void)
{
	/* Linearizable only in an order that differs from invocation order. */
	static const struct lc_op reg_ok[] = {
		OP(LC_SET, LC_OK, 1, 0, 0, 0, 10),
		OP(LC_GET, LC_OK, 0, 0, 2, 1, 4),  /* sees the set inside it */
		OP(LC_SET, LC_OK, 2, 0, 0, 2, 3),
		OP(LC_GET, LC_OK, 0, 0, 1, 11, 12), /* so set(1) went last */
		OP(LC_CAS, LC_OK, 3, 1, 0, 13, 14),
		OP(LC_CAS, LC_VERSION, 4, 1, 0, 15, 16),
		OP(LC_GET, LC_OK, 0, 0, 3, 15, 17),
		OP(LC_DELETE, LC_OK, 0, 0, 0, 18, 19),
		OP(LC_GET, LC_NOTFOUND, 0, 0, 0, 20, 21),
		OP(LC_CAS, LC_NOTFOUND, 5, 3, 0, 20, 22),
		OP(LC_DELETE, LC_NOTFOUND, 0, 0, 0, 21, 23),
		OP(LC_SET, LC_UNKNOWN, 6, 0, 0, 24, INT64_MAX), /* may apply, or not */
		OP(LC_GET, LC_NOTFOUND, 0, 0, 0, 25, 26),
		OP(LC_GET, LC_OK, 0, 0, 6, 27, 28),
	};
	static const struct lc_op stale_read[] = {
		OP(LC_SET, LC_OK, 1, 0, 0, 0, 1),
		OP(LC_SET, LC_OK, 2, 0, 0, 2, 3),
		OP(LC_GET, LC_OK, 0, 0, 1, 4, 5),
	};
	static const struct lc_op bad_cas[] = {
		OP(LC_SET, LC_OK, 1, 0, 0, 0, 1),
		OP(LC_SET, LC_OK, 2, 0, 0, 2, 3),
		OP(LC_CAS, LC_OK, 3, 1, 0, 4, 5), /* its version is of value 1: must fail */
	};
	/* Two readers see the two writes in opposite orders. */
	static const struct lc_op crossed[] = {
		OP(LC_SET, LC_OK, 1, 0, 0, 0, 100), OP(LC_SET, LC_OK, 2, 0, 0, 0, 100),
		OP(LC_GET, LC_OK, 0, 0, 1, 10, 20), OP(LC_GET, LC_OK, 0, 0, 2, 30, 40),
		OP(LC_GET, LC_OK, 0, 0, 2, 10, 20), OP(LC_GET, LC_OK, 0, 0, 1, 30, 40),
	};
	static const struct lc_op cnt_ok[] = {
		OP(LC_INCR, LC_OK, 2, 0, 2, 0, 10),
		OP(LC_INCR, LC_OK, 3, 0, 5, 1, 5), /* returns first, yet goes after incr 2 */
		OP(LC_GET, LC_OK, 0, 0, 5, 11, 12),
		OP(LC_DECR, LC_OK, 10, 0, 0, 13, 14), /* stops at 0 */
		OP(LC_INCR, LC_OK, 1, 0, 1, 15, 16),
	};
	static const struct lc_op lost_update[] = {
		OP(LC_INCR, LC_OK, 1, 0, 1, 0, 2),
		OP(LC_INCR, LC_OK, 1, 0, 1, 1, 3),
	};
	/* Four concurrent writes, then a read of a value none of them wrote. */
	static const struct lc_op wide[] = {
		OP(LC_SET, LC_OK, 1, 0, 0, 0, 50), OP(LC_SET, LC_OK, 2, 0, 0, 0, 50),
		OP(LC_SET, LC_OK, 3, 0, 0, 0, 50), OP(LC_SET, LC_OK, 4, 0, 0, 0, 50),
		OP(LC_GET, LC_OK, 0, 0, 9, 60, 61),
	};

	/* Two concurrent adds on an absent key: exactly one may succeed. */
	static const struct lc_op add_ok[] = {
		OP(LC_ADD, LC_OK, 1, 0, 0, 0, 10), OP(LC_ADD, LC_EXISTS, 2, 0, 0, 1, 11),
		OP(LC_GET, LC_OK, 0, 0, 1, 12, 13),
	};
	static const struct lc_op add_twice[] = {
		OP(LC_ADD, LC_OK, 1, 0, 0, 0, 10), OP(LC_ADD, LC_OK, 2, 0, 0, 1, 11),
	};
	/* The add that failed was seen by a reader: it did happen. */
	static const struct lc_op add_seen[] = {
		OP(LC_ADD, LC_EXISTS, 1, 0, 0, 0, 10), OP(LC_GET, LC_OK, 0, 0, 1, 1, 2),
		OP(LC_ADD, LC_OK, 2, 0, 0, 3, 11), OP(LC_GET, LC_OK, 0, 0, 2, 12, 13),
	};

	CHECK_HISTORY(LC_REGISTER, reg_ok, LC_LINEARIZABLE);
	CHECK_HISTORY(LC_REGISTER, add_ok, LC_LINEARIZABLE);
	CHECK_HISTORY(LC_REGISTER, add_twice, LC_VIOLATION);
	CHECK_HISTORY(LC_REGISTER, add_seen, LC_VIOLATION);
	CHECK_HISTORY(LC_REGISTER, stale_read, LC_VIOLATION);
	CHECK_HISTORY(LC_REGISTER, bad_cas, LC_VIOLATION);
	CHECK_HISTORY(LC_REGISTER, crossed, LC_VIOLATION);
	CHECK_HISTORY(LC_COUNTER, cnt_ok, LC_LINEARIZABLE);
	CHECK_HISTORY(LC_COUNTER, lost_update, LC_VIOLATION);
	CHECK_HISTORY(LC_REGISTER, wide, LC_VIOLATION);
	/* a budget too small to decide is reported as such, never as a pass */
	CHECK(check_hand(LC_REGISTER, wide, 5, 10) == LC_GAVE_UP);
}

/*
 * Random histories, linearizable by construction: op i, of a random client,
 * takes effect at time 100 i + 50, which its interval contains; a client's
 * intervals do not overlap; results come from running the ops in index
 * order on a model written here, independently of lincheck.c.
 */
#define RH_CLIENTS 6
#define RH_OPS     400

static void random_times(struct lc_op *ops, size_t n, unsigned *seed)
{
	size_t next[RH_OPS], last[RH_CLIENTS];
	int64_t prev_ret[RH_CLIENTS];

	for (int c = 0; c < RH_CLIENTS; c++) {
		last[c] = n;
		prev_ret[c] = -1;
	}
	for (size_t i = 0; i < n; i++)
		ops[i].client = rand_r(seed) % RH_CLIENTS;
	for (size_t i = n; i-- > 0;) {
		next[i] = last[ops[i].client];
		last[ops[i].client] = i;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t p = 100 * (int64_t)i + 50, prev = prev_ret[ops[i].client];
		int64_t np = next[i] < n ? 100 * (int64_t)next[i] + 50 : p + 1000;

		ops[i].call = prev + 1 + rand_r(seed) % (p - prev);
		ops[i].ret = p + rand_r(seed) % (np - p);
		prev_ret[ops[i].client] = ops[i].ret;
	}
}

static void random_register_ops(struct lc_op *ops, size_t n, unsigned *seed)
{
	uint64_t st = LC_ABSENT, written = 0;

	for (size_t i = 0; i < n; i++) {
		struct lc_op *op = &ops[i];

		op->kind = (enum lc_kind)(rand_r(seed) % 4); /* get, set, cas, delete */
		op->status = st ? LC_OK : LC_NOTFOUND;
		if (op->kind == LC_GET)
			op->out = st;
		if (op->kind == LC_CAS) {
			op->expect = st && rand_r(seed) % 2 ? st : 1 + rand_r(seed) % (written + 1);
			op->status = !st ? LC_NOTFOUND : st == op->expect ? LC_OK : LC_VERSION;
		}
		if (op->kind == LC_SET || op->kind == LC_CAS)
			op->arg = ++written;
		if (op->kind == LC_SET || (op->kind == LC_CAS && op->status == LC_OK))
			st = op->arg;
		if (op->kind == LC_SET)
			op->status = LC_OK;
		if (op->kind == LC_DELETE)
			st = LC_ABSENT;
	}
}

static void random_counter_ops(struct lc_op *ops, size_t n, unsigned *seed)
{
	uint64_t st = 0;

	for (size_t i = 0; i < n; i++) {
		struct lc_op *op = &ops[i];
		unsigned r = rand_r(seed) % 3;

		op->kind = r == 0 ? LC_GET : r == 1 ? LC_INCR : LC_DECR;
		op->arg = op->kind == LC_INCR ? 1 + rand_r(seed) % 5 : 1 + rand_r(seed) % 3;
		if (op->kind == LC_INCR)
			st += op->arg;
		else if (op->kind == LC_DECR)
			st = op->arg > st ? 0 : st - op->arg;
		op->status = LC_OK;
		op->out = st;
	}
}

/* Make a get in the middle return a value first written after it returned. */
static int mutate_future_read(struct lc_op *ops, size_t n)
{
	for (size_t i = n / 2; i < n; i++) {
		if (ops[i].kind != LC_GET)
			continue;
		for (size_t j = i + 1; j < n; j++) {
			if (ops[j].kind == LC_SET && ops[j].call > ops[i].ret) {
				ops[i].status = LC_OK;
				ops[i].out = ops[j].arg;
				return 1;
			}
		}
	}
	return 0;
}

/* Make an incr in the middle return more than all the deltas add up to. */
static int mutate_counter(struct lc_op *ops, size_t n)
{
	for (size_t i = n / 2; i < n; i++) {
		if (ops[i].kind == LC_INCR) {
			ops[i].out += 1000000;
			return 1;
		}
	}
	return 0;
}

static void check_random(enum lc_model m, unsigned seed)
{
	static struct lc_op ops[RH_OPS];
	struct lc_limits lim = {.max_seconds = 60};
	struct lc_report ok, bad;

	memset(ops, 0, sizeof(ops));
	random_times(ops, RH_OPS, &seed);
	if (m == LC_REGISTER)
		random_register_ops(ops, RH_OPS, &seed);
	else
		random_counter_ops(ops, RH_OPS, &seed);
	lc_check(m, m == LC_REGISTER ? LC_ABSENT : 0, ops, RH_OPS, &lim, &ok);
	CHECK(m == LC_REGISTER ? mutate_future_read(ops, RH_OPS) : mutate_counter(ops, RH_OPS));
	lc_check(m, m == LC_REGISTER ? LC_ABSENT : 0, ops, RH_OPS, &lim, &bad);
	printf("# random %s history of %d ops, %d clients: %s (%llu steps); mutated: %s "
	       "(%llu steps, %.3f s)\n",
	       m == LC_REGISTER ? "register" : "counter", RH_OPS, RH_CLIENTS,
	       lc_result_name(ok.result), (unsigned long long)ok.steps, lc_result_name(bad.result),
	       (unsigned long long)bad.steps, bad.seconds);
	lc_report_free(&ok);
	lc_report_free(&bad);
	CHECK(ok.result == LC_LINEARIZABLE);
	CHECK(bad.result == LC_VIOLATION);
}

static void test_checker_random(void)
{
	for (unsigned seed = 1; seed <= 3; seed++) {
		check_random(LC_REGISTER, seed);
		check_random(LC_COUNTER, seed);
	}
}

/* ---- 2. mixed workload on r0..r2 and c0 --------------------------------------------- */

/* Per key, over all rounds. */
struct tally {
	size_t ops, kinds[LC_NKINDS], found, cas_ok, add_ok, overlapped;
	uint64_t steps;
	double seconds;
	enum lc_result worst;
};

static struct tally tallies[NKEYS];
static uint64_t init_state[NKEYS]; /* each key's state when a round starts */
static int mixed_round;

/* The state of a key while no worker runs, in the terms of the models. */
static int read_state(struct hkv_client *c, int key, uint64_t *st)
{
	static char buf[VALUE_CAP + 1], scratch[VALUE_CAP + 1];
	const char *k = key_names[key];
	size_t vlen = 0;
	int rc = hkv_get(c, k, strlen(k), buf, VALUE_CAP, &vlen, NULL);

	if (rc == HKV_ENOTFOUND && key != COUNTER_KEY) {
		*st = LC_ABSENT;
		return 0;
	}
	if (!rc)
		*st = key == COUNTER_KEY ? parse_counter(buf, vlen) : parse_value(buf, vlen, scratch);
	return rc;
}

static int init_mixed(struct hkv_client *c)
{
	int rc = mixed_round ? 0 : hkv_set(c, "c0", 2, "0", 1, NULL);

	for (int k = 0; k < NKEYS && !rc; k++)
		rc = read_state(c, k, &init_state[k]);
	return rc;
}

static int cmp_call(const void *a, const void *b)
{
	const struct lc_op *x = a, *y = b;

	return x->call < y->call ? -1 : x->call > y->call;
}

/* Sort ops by invocation; how many of them overlap another op in time? */
static size_t sort_and_count_overlapped(struct lc_op *ops, size_t n)
{
	int64_t reach = INT64_MIN; /* latest return of the ops before i */
	size_t count = 0;

	qsort(ops, n, sizeof(*ops), cmp_call);
	for (size_t i = 0; i < n; i++) {
		count += ops[i].call <= reach || (i + 1 < n && ops[i + 1].call <= ops[i].ret);
		reach = ops[i].ret > reach ? ops[i].ret : reach;
	}
	return count;
}

static void tally_add(struct tally *t, const struct lc_op *ops, size_t n,
		      const struct lc_report *rep)
{
	for (size_t i = 0; i < n; i++) {
		t->kinds[ops[i].kind]++;
		t->cas_ok += ops[i].kind == LC_CAS && ops[i].status == LC_OK;
		t->add_ok += ops[i].kind == LC_ADD && ops[i].status == LC_OK;
		t->found += ops[i].kind == LC_GET && ops[i].status == LC_OK;
	}
	t->ops += n;
	t->steps += rep->steps;
	t->seconds += rep->seconds;
	if (rep->result != LC_LINEARIZABLE)
		t->worst = rep->result;
}

static void print_tally(int key, const struct tally *t)
{
	printf("# %s: %zu ops checked (get %zu [%zu found], ", key_names[key], t->ops,
	       t->kinds[LC_GET], t->found);
	if (key == COUNTER_KEY)
		printf("incr %zu, decr %zu", t->kinds[LC_INCR], t->kinds[LC_DECR]);
	else
		printf("set %zu, add %zu [%zu ok], cas %zu [%zu ok], delete %zu", t->kinds[LC_SET],
		       t->kinds[LC_ADD], t->add_ok, t->kinds[LC_CAS], t->cas_ok, t->kinds[LC_DELETE]);
	printf("), %zu%% overlapping another: %s (%llu search steps, %.3f s)\n",
	       t->ops ? 100 * t->overlapped / t->ops : 0, lc_result_name(t->worst),
	       (unsigned long long)t->steps, t->seconds);
}

/* Segments the flow rounds' server logged it moved between classes, moves
 * it undid, and blocks its moves took back from dead writers and inserts. */
static int server_moves, server_relocations, server_undone, server_taken;

static void check_key(int key, struct lc_op *ops, size_t n)
{
	struct lc_limits lim = {.max_steps = 500000000, .max_seconds = 120, .max_memo_mb = 512};
	enum lc_model m = key == COUNTER_KEY ? LC_COUNTER : LC_REGISTER;
	struct lc_report rep;

	tallies[key].overlapped += sort_and_count_overlapped(ops, n);
	lc_check(m, init_state[key], ops, n, &lim, &rep);
	tally_add(&tallies[key], ops, n, &rep);
	if (rep.result != LC_LINEARIZABLE) {
		printf(m == LC_COUNTER ? "# %s, round %d (initial value %llu):\n"
				       : "# %s, round %d (initial value %#llx, 0 = absent):\n",
		       key_names[key], mixed_round, (unsigned long long)init_state[key]);
		lc_print_report(stdout, ops, n, &rep);
		hkv_test_failures++;
	}
	lc_report_free(&rep);
}

/* Over the rounds run so far: CARVE requests, and the fewest claims one
 * process made in a round. */
static uint64_t rounds_carves, rounds_min_claims, rounds_refused;
#define EVICTIONS_MAX 4

/* One crew of workers on the hot keys; returns the blocks freed for reuse. */
static uint64_t mixed_round_run(const char *mode)
{
	struct history h = {0};
	int64_t t0 = now_ns();
	uint64_t freed;
	size_t total = 0;

	if (run_crew(mode, mixed_round, prm.mix_ops, init_mixed, &h))
		hkv_test_failures++;
	for (int k = 0; k < NKEYS; k++) {
		total += h.n[k];
		for (size_t i = 0; i < h.n[k]; i++)
			rounds_refused += h.ops[k][i].status == LC_UNKNOWN && h.ops[k][i].out == 1 &&
					  h.ops[k][i].kind != LC_INCR && h.ops[k][i].kind != LC_DECR;
	}
	/* cache mode: an item may be evicted at any moment - as if deleted by
	 * someone at an unknown time; up to EVICTIONS_MAX such per key and round */
	for (int k = 0; !strcmp(mode, "flow") && k < COUNTER_KEY; k++)
		for (int e = 0; e < EVICTIONS_MAX; e++) {
			struct lc_op op = {.kind = LC_DELETE, .status = LC_UNKNOWN,
					   .client = MAX_PROCS * MAX_THREADS + e, .call = t0,
					   .ret = INT64_MAX};

			if (add_op(&h, k, &op))
				hkv_test_failures++;
		}
	printf("# round %d: %zu ops in %.2f s, %d errors; %llu blocks freed for reuse, %llu "
	       "claimed in %llu claims (at least %llu by each process), %llu carve requests\n",
	       mixed_round, total, (double)(now_ns() - t0) / 1e9, h.errors,
	       (unsigned long long)h.freed, (unsigned long long)h.claimed,
	       (unsigned long long)h.claims, (unsigned long long)h.min_claims,
	       (unsigned long long)h.carves);
	rounds_carves += h.carves;
	if (!mixed_round || h.min_claims < rounds_min_claims)
		rounds_min_claims = h.min_claims;
	for (int k = 0; k < NKEYS; k++)
		check_key(k, h.ops[k], h.n[k]);
	if (h.errors)
		hkv_test_failures++;
	freed = h.freed;
	history_free(&h);
	return freed;
}

static void test_mixed(void)
{
	uint64_t freed = 0;

	CHECK(server_up);
	printf("# mixed: %d rounds of %d processes x %d threads x %d ops\n", prm.rounds,
	       prm.procs, prm.threads, prm.mix_ops);
	for (mixed_round = 0; mixed_round < prm.rounds; mixed_round++)
		freed += mixed_round_run("mix");
	for (int k = 0; k < NKEYS; k++)
		print_tally(k, &tallies[k]);
	CHECK(freed > 0); /* the region is small: blocks were reused */
}

/* The mixed workload in `mode` for `rounds` rounds on a tiny server of its
 * own (4 MB, 64 KiB segments, 512 index slots; cache mode if `cache`); the
 * blocks freed for reuse. */
/* The rounds' server: a store with a tiny index (0), a cache (1), a store (2). */
static uint64_t own_server_rounds(const char *mode, int rounds, int cache)
{
	static const char *const tiny[] = {"--index-slots", "512", NULL};
	/* (cache mode: an index that never runs out, so no insert evicts a hot key) */
	static const char *const tiny_cache[] = {"--cache", "-v", NULL};
	static const char *const store[] = {"-v", NULL}; /* (-v: a move's take-backs) */
	struct hkvserver main_server = server;
	uint64_t freed = 0;
	int up;

	memset(tallies, 0, sizeof(tallies));
	rounds_carves = rounds_min_claims = rounds_refused = 0;
	up = hkvserver_start(&server, race_verbs, "4M", "64K",
			     cache == 1 ? tiny_cache : cache == 2 ? store : tiny) == 0;
	if (!up) {
		fprintf(stderr, "%s:%d: the %s rounds' server did not start\n", __FILE__, __LINE__,
			mode);
		hkv_test_failures++;
		server = main_server;
		return 0;
	}
	if (cache == 2) {
		/*
		 * A store with no FREE segment and none wholly free: 2 KB items
		 * until it is full, then every other one deleted. Every segment
		 * a round's class needs is then emptied by moving live items.
		 */
		struct hkv_client *c = hkvserver_client(&server);
		static char v[2000];
		char key[32];
		int n = 0;

		memset(v, 'f', sizeof(v));
		for (; c && n < 100000; n++) {
			snprintf(key, sizeof(key), "filler-%d", n);
			if (hkv_set(c, key, strlen(key), v, sizeof(v), NULL))
				break;
		}
		for (int i = 0; c && i < n; i += 2) {
			snprintf(key, sizeof(key), "filler-%d", i);
			hkv_delete(c, key, strlen(key));
		}
		if (c)
			hkv_close(c);
		printf("# store filled with %d items of 2000 B, every other one deleted\n", n);
	}
	for (mixed_round = 0; mixed_round < rounds; mixed_round++)
		freed += mixed_round_run(mode);
	for (int k = 0; k < NKEYS; k++)
		print_tally(k, &tallies[k]);
	server_moves = hkvserver_log_count(&server, "moved from class");
	server_relocations = hkvserver_log_count(&server, "live items moved");
	server_undone = hkvserver_log_count(&server, "; undone");
	server_taken = hkvserver_log_count(&server, " taken back"); /* (debug lines: -v) */
	hkvserver_stop(&server);
	server = main_server;
	return freed;
}

/* 4. The mixed workload under reuse pressure, on a server of its own. */
static void test_mixed_reuse(void)
{
	printf("# reuse pressure: %d rounds of %d processes x (%d threads x %d ops + a churner "
	       "of 2-28 KiB values)\n", prm.reuse_rounds, prm.procs, prm.threads, prm.mix_ops);
	CHECK(own_server_rounds("reuse", prm.reuse_rounds, 0) > 0);
}

static int cmp_u64(const void *a, const void *b);

/*
 * 5. Memory that flows (issue 13): the reuse workload on a cache-mode
 * server, the churners' values shifting between small and large classes by
 * turns, so writers run out of blocks of a class and ask for a CARVE, which
 * takes a segment of another class (wholly free, or emptied by the server's
 * slab mover). A victim process churns many classes too and is SIGKILLed
 * mid-round while it holds claimed blocks; the server takes them back. Every
 * key's history must stay linearizable, and no (block offset, generation)
 * may be written twice by anyone: a block's generation never repeats for an
 * address, whoever reuses it.
 */
static void flow_rounds(int store)
{
	uint64_t freed, dups = 0;

	nblks = 0;
	victims_holding = victim_held = victim_claims = victim_carves = 0;
	flow_mode = 1; /* (the parent parses values too) */
	printf("# memory that flows: %d rounds of %d processes x (%d threads x %d ops + a "
	       "churner of 0.2-1.5 KiB and 6-28 KiB values by turns; hot values < 200 B) + a victim of %d churners killed "
	       "mid-round, %s\n", prm.flow_rounds, prm.procs, prm.threads, prm.mix_ops,
	       prm.threads,
	       store ? "store mode (the server moves live items; the victim in every other round)"
		     : "cache mode");
	flow_store = store;
	freed = own_server_rounds("flow", prm.flow_rounds, store ? 2 : 1);
	flow_mode = 0;
	flow_store = 0;
	qsort(blks, nblks, sizeof(*blks), cmp_u64);
	for (size_t i = 1; i < nblks; i++)
		if (blks[i] == blks[i - 1] && dups++ < 5)
			fprintf(stderr, "block at offset %llu written twice with generation %llu\n",
				(unsigned long long)(blks[i] >> 32) * 64,
				(unsigned long long)(blks[i] & 0xffffffffull));
	printf("# flow: %zu block writes logged (offset, generation), %llu pairs written twice; "
	       "%llu carve requests by the workers, %llu by the victims; fewest claims of a "
	       "worker process in a round %llu; victims: %llu claims, holding blocks when killed "
	       "in %llu of %d rounds (%llu blocks); segments the server moved: %d; hot-key "
	       "writes refused as full: %llu\n", nblks,
	       (unsigned long long)dups, (unsigned long long)rounds_carves,
	       (unsigned long long)victim_carves, (unsigned long long)rounds_min_claims,
	       (unsigned long long)victim_claims, (unsigned long long)victims_holding,
	       prm.flow_rounds, (unsigned long long)victim_held, server_moves,
	       (unsigned long long)rounds_refused);
	CHECK(freed > 0);
	CHECK(nblks > 0);
	CHECK(dups == 0);
	CHECK(rounds_min_claims > 0);      /* every process claimed blocks */
	CHECK(rounds_carves + victim_carves > 0); /* classes shifted: CARVE requests */
	CHECK(victims_holding > 0); /* killed while holding claims */
	CHECK(victim_claims > 0);
	printf("# flow: segments emptied by moving their live items: %d; moves undone: %d; "
	       "blocks a dead writer left or an insert past its lease taken back by moves: %d\n",
	       server_relocations, server_undone, server_taken);
	if (store) /* segments emptied by moving live items while the checker watched */
		CHECK(server_relocations > 0);
}

static void test_flow_reuse(void)
{
	flow_rounds(0);
}

/*
 * 6. The same in store mode: a class that needs a segment gets one the
 * server empties by moving its live items - copy, mark, slot CAS, as a
 * client's update - into free blocks elsewhere (server/slab.c), while
 * everyone reads and writes them.
 */
static void test_flow_store(void)
{
	flow_rounds(1);
}

/* ---- 3. exact count --------------------------------------------------------------- */

static int init_count(struct hkv_client *c)
{
	return hkv_set(c, "cnt", 3, "0", 1, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
	/* (also sorts the flow rounds' blocks) */
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Did the n successful incr return 1..n, each once? */
static int results_exact(uint64_t *res, size_t n)
{
	qsort(res, n, sizeof(*res), cmp_u64);
	for (size_t i = 0; i < n; i++)
		if (res[i] != i + 1)
			return 0;
	return 1;
}

static void test_exact_count(void)
{
	uint64_t want = (uint64_t)prm.procs * (uint64_t)prm.threads * (uint64_t)prm.count_ops;
	struct history h = {0};
	struct hkv_client *c;
	int64_t t0 = now_ns();
	char buf[32];
	size_t vlen = 0;
	int exact, ret;

	CHECK(server_up);
	if (run_crew("count", 0, prm.count_ops, init_count, &h))
		hkv_test_failures++;
	c = hkvserver_client(&server);
	ret = hkv_get(c, "cnt", 3, buf, sizeof(buf) - 1, &vlen, NULL);
	hkv_close(c);
	buf[ret ? 0 : vlen] = 0;
	exact = results_exact(h.results, h.nres);
	printf("# exact count: %d processes x %d threads x %d incr = %llu in %.2f s "
	       "(%llu retries): %zu succeeded, final value %s, results %s\n",
	       prm.procs, prm.threads, prm.count_ops, (unsigned long long)want,
	       (double)(now_ns() - t0) / 1e9, (unsigned long long)h.incr_retries, h.nres,
	       ret ? hkv_strerror(ret) : buf, exact ? "1..n each once" : "NOT 1..n each once");
	CHECK(h.errors == 0);
	CHECK_RC(ret, 0);
	CHECK(h.nres == want);
	CHECK(parse_counter(buf, vlen) == want);
	CHECK(exact);
	history_free(&h);
}

/* ---- 4. racing adds --------------------------------------------------------------- */

/*
 * Adds of one absent key race each other in every round while a reader
 * spins on get and a noise thread inserts and deletes other keys. The index
 * has 4 buckets, so the noise keeps changing which slots are empty and the
 * racing adders see different buckets. Each round: exactly one add may
 * succeed, and the reader may only ever see the value of the add that did
 * (a losing add's value must never be visible). The value names its round
 * and adder.
 */
#define RACE_ADDERS 2 /* one per core here: both truly run at once */

struct race {
	struct hkvserver *srv;
	int rounds;
	atomic_uint arrived; /* spin barrier: adders start a round within ~100 ns */
	atomic_uint phase;
	atomic_int stop;
	atomic_int reader_ready; /* the reader has done a get: the rounds may start */
	int cache;            /* cache mode: the noise keeps every bucket full */
	int ok[RACE_ADDERS];  /* per adder: adds that succeeded */
	uint8_t *won;         /* per round: bitmask of adders whose add succeeded */
	uint64_t *seen;       /* values the reader read */
	size_t nseen, cap, errors;
};

static struct race race;

static void race_barrier(void)
{
	unsigned ph = atomic_load(&race.phase);

	if (atomic_fetch_add(&race.arrived, 1) + 1 == RACE_ADDERS) {
		atomic_store(&race.arrived, 0);
		atomic_store(&race.phase, ph + 1);
		return;
	}
	for (unsigned spins = 0; atomic_load(&race.phase) == ph; spins++)
		if (spins > 1000)
			sched_yield();
}

static void *race_adder(void *arg)
{
	int id = (int)(intptr_t)arg;
	struct hkv_client *c = hkvserver_client(race.srv);

	/* (under TSan on a loaded machine the rounds could all pass before the
	 * reader's first get, and it would see nothing: a run once did) */
	while (!atomic_load(&race.reader_ready))
		sched_yield();
	for (int r = 0; r < race.rounds; r++) {
		char v[32];
		int rc, n = snprintf(v, sizeof(v), "%d.%d", r, id);

		race_barrier();
		rc = hkv_add(c, "K", 1, v, (size_t)n, NULL);
		if (rc == 0)
			__atomic_fetch_or(&race.won[r], (uint8_t)(1u << id), __ATOMIC_RELAXED);
		else if (rc != HKV_EEXISTS)
			__atomic_fetch_add(&race.errors, 1, __ATOMIC_RELAXED);
		race_barrier();
		if (id == 0) {
			rc = hkv_delete(c, "K", 1);
			if (rc && rc != HKV_ENOTFOUND)
				__atomic_fetch_add(&race.errors, 1, __ATOMIC_RELAXED);
			for (int j = 0; race.cache && j < 4; j++) { /* refill the buckets */
				char k[16];
				int kn = snprintf(k, sizeof(k), "n%d", (r * 4 + j) % 96);

				(void)hkv_set(c, k, (size_t)kn, "x", 1, NULL);
			}
		}
	}
	hkv_close(c);
	return NULL;
}

static void *race_reader(void *arg)
{
	struct hkv_client *c = hkvserver_client(race.srv);

	while (!atomic_load(&race.stop) && race.nseen < race.cap) {
		char buf[64];
		size_t vlen = 0;
		unsigned r, a;
		int rc = hkv_get(c, "K", 1, buf, sizeof(buf) - 1, &vlen, NULL);

		atomic_store(&race.reader_ready, 1);
		if (rc == HKV_ENOTFOUND)
			continue;
		buf[rc ? 0 : vlen] = 0;
		if (rc || sscanf(buf, "%u.%u", &r, &a) != 2) {
			__atomic_fetch_add(&race.errors, 1, __ATOMIC_RELAXED);
			continue;
		}
		race.seen[race.nseen++] = (uint64_t)r << 8 | a;
	}
	hkv_close(c);
	return NULL;
}

static void *race_noise(void *arg)
{
	struct hkv_client *c = hkvserver_client(race.srv);
	unsigned seed = 7;

	while (!atomic_load(&race.stop)) {
		char k[16];
		int n = snprintf(k, sizeof(k), "n%u", (unsigned)rand_r(&seed) % 24);

		if (rand_r(&seed) % 2)
			(void)hkv_set(c, k, (size_t)n, "x", 1, NULL);
		else
			(void)hkv_delete(c, k, (size_t)n);
	}
	hkv_close(c);
	return NULL;
}

static int race_rounds;

/*
 * Concurrent adds of one key: exactly one wins each round, and no reader
 * ever sees a losing add's value. In cache mode all 64 slots are kept full
 * (96 keys set before, and refilled between rounds, with no noise writer
 * during a round: nothing but the adders can remove K), so the adds evict
 * to get a slot: an add must never evict the rival entry it races with and
 * then commit beside it (issue 11, item 6).
 */
static void add_race(int cache)
{
	int verbs = race_verbs;

	static const char *const tiny_index[] = {"--index-slots", "64", NULL};
	static const char *const tiny_cache[] = {"--index-slots", "64", "--cache", NULL};
	pthread_t adders[RACE_ADDERS], reader, noise;
	struct hkvserver s;
	size_t bad_seen = 0;
	int rounds_one = 0, rounds_many = 0, rounds_none = 0;

	CHECK(hkvserver_start(&s, verbs, "4M", "64K", cache ? tiny_cache : tiny_index) == 0);
	race = (struct race){.srv = &s, .rounds = race_rounds, .cap = 1u << 20, .cache = cache};
	race.won = calloc((size_t)race.rounds, 1);
	race.seen = calloc(race.cap, sizeof(uint64_t));
	CHECK(race.won && race.seen);
	if (cache) {
		struct hkv_client *c = hkvserver_client(&s);

		for (int j = 0; j < 96; j++) {
			char k[16];
			int kn = snprintf(k, sizeof(k), "n%d", j);

			CHECK_RC(hkv_set(c, k, (size_t)kn, "x", 1, NULL), 0);
		}
		hkv_close(c);
	}
	pthread_create(&reader, NULL, race_reader, NULL);
	if (!cache)
		pthread_create(&noise, NULL, race_noise, NULL);
	for (int i = 0; i < RACE_ADDERS; i++)
		pthread_create(&adders[i], NULL, race_adder, (void *)(intptr_t)i);
	for (int i = 0; i < RACE_ADDERS; i++)
		pthread_join(adders[i], NULL);
	atomic_store(&race.stop, 1);
	pthread_join(reader, NULL);
	if (!cache)
		pthread_join(noise, NULL);
	for (int r = 0; r < race.rounds; r++) {
		int n = __builtin_popcount(race.won[r]);

		rounds_one += n == 1;
		rounds_many += n > 1;
		rounds_none += n == 0;
	}
	for (size_t i = 0; i < race.nseen; i++) {
		uint64_t r = race.seen[i] >> 8, a = race.seen[i] & 0xff;

		bad_seen += r >= (uint64_t)race.rounds || a >= RACE_ADDERS ||
			    !(race.won[r] & (1u << a));
	}
	printf("# add race%s: %d rounds x %d adders (4-bucket index, %s): %d with one "
	       "winner, %d with several, %d with none; reader saw %zu values, %zu of a losing "
	       "add; %zu errors\n", cache ? " (cache mode)" : "", race.rounds, RACE_ADDERS,
	       cache ? "buckets kept full" : "noise writer", rounds_one, rounds_many, rounds_none, race.nseen,
	       bad_seen, race.errors);
	CHECK(rounds_one == race.rounds);
	CHECK(bad_seen == 0);
	CHECK(race.errors == 0);
	CHECK(race.nseen > 0);
	free(race.won);
	free(race.seen);
	hkvserver_stop(&s);
}

static void test_add_race(void)
{
	add_race(0);
}

static void test_add_race_cache(void)
{
	add_race(1);
}

int main(int argc, char **argv)
{
	int verbs = hkvserver_want_verbs(argc, argv);

	if (argc > 1 && !strcmp(argv[1], "--worker"))
		return worker_main(argc, argv);
	if (verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	prm = verbs ? verbs_params
	      : argc > 2 && !strcmp(argv[2], "--quick") ? quick_params : shm_params;
	RUN_TEST(test_checker_hand);
	RUN_TEST(test_checker_random);
	server_up = hkvserver_start(&server, verbs, "4M", "64K", NULL) == 0;
	if (!server_up)
		fprintf(stderr, "cannot start hatchkv-server\n");
	race_verbs = verbs;
	RUN_TEST(test_mixed);
	RUN_TEST(test_exact_count);
	RUN_TEST(test_mixed_reuse);
	RUN_TEST(test_flow_reuse);
	RUN_TEST(test_flow_store);
	race_rounds = verbs ? 300 : argc > 2 && !strcmp(argv[2], "--quick") ? 300 : 20000;
	RUN_TEST(test_add_race);
	RUN_TEST(test_add_race_cache);
	if (server_up)
		hkvserver_stop(&server);
	return hkv_test_finish();
}
