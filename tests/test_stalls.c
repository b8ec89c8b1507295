/*
 * test_stalls.c - issue 27's stall matrix: one party stopped at a named
 * point between a check and the write that check allows, for 0.2 s, 2 s
 * and 10 s, while other clients write, delete and read; then every other
 * client's acknowledged item must read back byte for byte, and the
 * histories of two shared keys must be linearizable.
 *
 * The stopped party is, in turn:
 *   - a client (a "writer" handle) at each of the library's named points
 *     (hkv_test_hook, HKV_TP_* in client/client_int.h) - its claim's stamps,
 *     its first WRITE of a held block, an update's or delete's CASes after
 *     its view was found fresh, an insert's slot CAS and its commit, a
 *     cold update's publish, a read-modify-write's publish, a free, a
 *     give-back, a GET's atime CAS and an eviction's marks (the last two
 *     in cache mode);
 *   - the server (its one thread: sweep, mover and control plane alike) at
 *     each failpoint of its sweep and mover (HKV_STALL, common/failpoint.h):
 *     a take-back's CAS, a store move's claimed targets, its copies written
 *     and not published, its old blocks marked and not swung, the carve of
 *     a moved segment. (A cache move's evictions, "move-evict", are not in
 *     the matrix: this workload's cache moves rarely find a LIVE item in
 *     the segment they take, so the point is not reached reliably.)
 * Both in store and cache mode. The others ("workers") own their keys and
 * know each one's last acknowledged value; value sizes shift every 0.7 s
 * between 40-600 B and 1000-3000 B, so segments keep moving between
 * classes in a 4 MB region while the stop lasts; a process that leaves
 * without giving back what it holds gives the sweep work. In store mode a
 * worker's key reads back exactly as last acknowledged (both values are
 * accepted when the worker's own operation failed in a way that leaves its
 * effect unknown); in cache mode it may be missing (evicted) but is never
 * another value. The stopped writer's own items are not checked: the rule
 * lets a stall cost the stalled party's own operation.
 *
 *   test_stalls shm|verbs [short|long|server]
 * short: each client point alone, 0.2 s and 2 s; long: every client point
 * at once (a writer each), 10 s; server: each server point, 0.2 s, 2 s and
 * (some) 10 s. On verbs a subset of each (the Soft-RoCE guest is slow).
 */
#include <errno.h>
#include <pthread.h>
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
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/lincheck.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static const struct {
	enum hkv_test_point p;
	const char *name;
	int cache_only;
} client_points[] = {
	{HKV_TP_CLAIM_STAMP, "claim-stamp", 0},   {HKV_TP_HOLD_WRITE, "hold-write", 0},
	{HKV_TP_VIEW_POST, "view-post", 0},       {HKV_TP_INSERT_SLOT, "insert-slot", 0},
	{HKV_TP_INSERT_COMMIT, "insert-commit", 0}, {HKV_TP_STORE_PUBLISH, "store-publish", 0},
	{HKV_TP_MODIFY_PUBLISH, "modify-publish", 0}, {HKV_TP_FREE, "free", 0},
	{HKV_TP_GIVE_BACK, "give-back", 0},       {HKV_TP_ATIME_CAS, "atime-cas", 1},
	{HKV_TP_EVICT_MARK, "evict-mark", 1},     {HKV_TP_REMOVE_SLOT, "remove-slot", 0},
};
#define NCPOINTS ((int)(sizeof(client_points) / sizeof(client_points[0])))

/* ---- the run ----------------------------------------------------------------------- */

#define WORKERS  3
#define WKEYS    300
#define WRITERS  NCPOINTS
#define XKEYS    120
#define VMAX     3000
#define PHASE_MS 700
#define LINKEYS  2
#define LINOPS   12000
#define LIN_GAP_MS 2 /* a worker's operations on the shared keys: one per 2 ms at most */

struct worker {
	int t;
	struct hkv_client *h;
	uint32_t ver[WKEYS], alt[WKEYS]; /* last acknowledged version (0: absent);
					  * alt: also possible (an unknown outcome) */
	uint16_t len[WKEYS], alt_len[WKEYS];
	uint8_t unsure[WKEYS];
	int ops, unknown, bad, misses;
	uint64_t lin_ms;
	pthread_t th;
};

struct writer {
	struct hkv_client *h;
	int point; /* index into client_points; -1: none */
	_Atomic int armed, fired; /* fired: stops begun */
	uint64_t armed_ms, fired_ms, woke_ms, last_ms; /* woke: from the last stop */
	int ops, errors;
	pthread_t th;
};

static struct {
	int cache;
	const unsigned *stall_ms; /* the stops, in order, at the same point */
	int nstops;
	struct hkv_config *cfg;
	uint64_t t0;
	_Atomic int stop, writers_stop;
	struct worker w[WORKERS];
	struct writer x[WRITERS];
	int nx;
	/* the shared keys' histories (lincheck) */
	pthread_mutex_t lock;
	struct lc_op ops[LINKEYS][LINOPS];
	size_t nops[LINKEYS];
	uint64_t lin_seq;
} run;

static size_t cur_len(uint64_t rs)
{
	int big = (now_ms() - run.t0) / PHASE_MS % 2;

	return big ? 1000 + (size_t)(rs >> 40) % (VMAX - 1000) : 40 + (size_t)(rs >> 40) % 560;
}

static void wvalue(uint8_t *v, size_t len, int t, int k, uint32_t ver)
{
	for (size_t i = 0; i < len; i++)
		v[i] = (uint8_t)(t * 131 + k * 7 + ver * 13 + i * 3);
}

/* Does what was read match version ver of worker t's key k (len bytes)? */
static int wmatch(const uint8_t *got, size_t n, int t, int k, uint32_t ver, size_t len)
{
	uint8_t want[VMAX];

	if (n != len)
		return 0;
	wvalue(want, len, t, k, ver);
	return !memcmp(got, want, n);
}

/* Is an answer one that leaves a write's effect unknown? */
static int unknown_rc(int rc)
{
	return rc && rc != HKV_ENOTFOUND && rc != HKV_EFULL && rc != HKV_EEXISTS &&
	       rc != HKV_EVERSION && rc != HKV_EAGAIN;
}

static void lin_record(int key, const struct lc_op *op)
{
	pthread_mutex_lock(&run.lock);
	if (run.nops[key] < LINOPS)
		run.ops[key][run.nops[key]++] = *op;
	pthread_mutex_unlock(&run.lock);
}

/* One operation on a shared key: set (a new id), get or delete. */
static void lin_op(struct worker *w, uint64_t rs)
{
	static const char *const names[LINKEYS] = {"lin0", "lin1"};
	int key = (int)((rs >> 17) % LINKEYS), r = (int)((rs >> 23) % 10), rc;
	struct lc_op op = {.client = w->t};
	char buf[VMAX + 1];
	size_t vlen = 0, len;

	if (r < 4) {
		pthread_mutex_lock(&run.lock);
		op.arg = ++run.lin_seq;
		pthread_mutex_unlock(&run.lock);
		len = cur_len(rs) < 17 ? 17 : cur_len(rs);
		memset(buf, 'x', len);
		snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)op.arg);
		buf[16] = '.';
		op.kind = LC_SET;
		op.call = now_ns();
		rc = hkv_set(w->h, names[key], 4, buf, len, NULL);
		op.ret = now_ns();
		op.status = rc ? LC_UNKNOWN : LC_OK;
	} else if (r < 8) {
		op.kind = LC_GET;
		op.call = now_ns();
		rc = hkv_get(w->h, names[key], 4, buf, sizeof(buf) - 1, &vlen, NULL);
		op.ret = now_ns();
		if (rc == HKV_ENOTFOUND && run.cache)
			return; /* (a miss in a cache says nothing: it may be an eviction) */
		if (rc == HKV_ENOTFOUND) {
			op.status = LC_NOTFOUND;
		} else if (rc) {
			return; /* (a read that failed: no effect) */
		} else {
			buf[vlen < 17 ? vlen : 16] = 0;
			op.status = LC_OK;
			op.out = vlen >= 17 ? strtoull(buf, NULL, 16) : LC_GARBAGE;
		}
	} else {
		op.kind = LC_DELETE;
		op.call = now_ns();
		rc = hkv_delete(w->h, names[key], 4);
		op.ret = now_ns();
		if (rc == HKV_ENOTFOUND && run.cache)
			return; /* (absent, maybe evicted: no effect either way) */
		op.status = !rc ? LC_OK : rc == HKV_ENOTFOUND ? LC_NOTFOUND : LC_UNKNOWN;
	}
	if (op.status == LC_UNKNOWN)
		op.ret = INT64_MAX;
	lin_record(key, &op);
}

static void *worker_thread(void *arg)
{
	struct worker *w = arg;
	uint64_t rs = 0x9e3779b97f4a7c15ull * (uint64_t)(w->t + 7);
	uint8_t v[VMAX], got[VMAX + 64];
	char key[24];

	while (!atomic_load(&run.stop)) {
		int k, rc, r;
		size_t len, n = 0;

		rs = rs * 6364136223846793005ull + 1442695040888963407ull;
		k = (int)((rs >> 33) % WKEYS);
		r = (int)((rs >> 27) % 20);
		snprintf(key, sizeof(key), "o%d-%d", w->t, k);
		w->ops++;
		if (r < 2) {
			if (now_ms() - w->lin_ms < LIN_GAP_MS)
				continue;
			w->lin_ms = now_ms();
			lin_op(w, rs);
		} else if (r < 5) { /* delete */
			rc = hkv_delete(w->h, key, strlen(key));
			if (!rc || rc == HKV_ENOTFOUND) {
				w->ver[k] = 0;
				w->unsure[k] = 0;
			} else if (unknown_rc(rc)) {
				w->alt[k] = 0;
				w->unsure[k] = 1;
				w->unknown++;
			}
		} else if (r < 12) { /* set */
			uint32_t nv = (w->ver[k] > w->alt[k] ? w->ver[k] : w->alt[k]) + 1;

			len = cur_len(rs);
			wvalue(v, len, w->t, k, nv);
			rc = hkv_set(w->h, key, strlen(key), v, len, NULL);
			if (!rc) {
				w->ver[k] = nv;
				w->len[k] = (uint16_t)len;
				w->unsure[k] = 0;
			} else if (unknown_rc(rc)) {
				w->alt[k] = nv;
				w->alt_len[k] = (uint16_t)len;
				w->unsure[k] = 1;
				w->unknown++;
			}
		} else { /* get: exactly the last acknowledged value */
			rc = hkv_get(w->h, key, strlen(key), got, sizeof(got), &n, NULL);
			if (rc && rc != HKV_ENOTFOUND)
				continue; /* (a read that failed says nothing) */
			if (rc == HKV_ENOTFOUND) {
				if (!w->ver[k] || (w->unsure[k] && !w->alt[k]))
					continue;
				if (run.cache) {
					w->misses++;
					continue;
				}
			} else if (w->ver[k] && wmatch(got, n, w->t, k, w->ver[k], w->len[k])) {
				continue;
			} else if (w->unsure[k] && w->alt[k] &&
				   wmatch(got, n, w->t, k, w->alt[k], w->alt_len[k])) {
				w->ver[k] = w->alt[k]; /* (the unknown write took effect) */
				w->len[k] = w->alt_len[k];
				w->unsure[k] = 0;
				continue;
			}
			if (w->bad++ < 5)
				fprintf(stderr, "worker %d: get %s: %s, %zu B; want version %u (%u B)%s\n",
					w->t, key, hkv_strerror(rc), n, w->ver[k], w->len[k],
					w->unsure[k] ? " or the unknown write's" : "");
		}
	}
	return NULL;
}

/* The stalled writers' hook: once armed, writer i stops at its point for
 * each of run.stall_ms in turn (each time it gets there again). */
static void stall_hook(struct hkv_client *c, enum hkv_test_point point)
{
	for (int i = 0; i < run.nx; i++) {
		struct writer *x = &run.x[i];
		int f;

		if (x->h != c || x->point < 0 || client_points[x->point].p != point ||
		    !atomic_load(&x->armed))
			continue;
		f = atomic_load(&x->fired);
		if (f >= run.nstops || !atomic_compare_exchange_strong(&x->fired, &f, f + 1))
			return;
		if (!f)
			x->fired_ms = now_ms();
		sleep_ms(run.stall_ms[f]);
		x->last_ms = now_ms();
		if (f + 1 == run.nstops)
			x->woke_ms = x->last_ms;
		return;
	}
}

/* A writer's mix on its own keys: every kind of write the points sit in. */
static void *writer_thread(void *arg)
{
	struct writer *x = arg;
	uint64_t rs = 0x2545f4914f6cdd1dull * (uint64_t)(x - run.x + 3);
	uint8_t v[VMAX], got[VMAX + 64];
	char key[24];
	int me = (int)(x - run.x);

	while (!atomic_load(&run.writers_stop)) {
		int k, rc = 0, r;
		size_t len, n;
		struct hkv_item_info info;
		uint64_t res;

		rs = rs * 6364136223846793005ull + 1442695040888963407ull;
		k = (int)((rs >> 33) % (run.cache ? 8 * XKEYS : XKEYS));
		r = (int)((rs >> 27) % 16);
		snprintf(key, sizeof(key), "x%d-%d", me, k);
		len = cur_len(rs);
		wvalue(v, len, 100 + me, k, (uint32_t)x->ops);
		switch (r) {
		case 0: case 1: case 2: case 3:
			rc = hkv_set(x->h, key, strlen(key), v, len, NULL);
			break;
		case 4: case 5:
			rc = hkv_replace(x->h, key, strlen(key), v, len, NULL);
			break;
		case 6: case 7: case 8:
			rc = hkv_delete(x->h, key, strlen(key));
			break;
		case 9: case 10: case 11:
			rc = hkv_get(x->h, key, strlen(key), got, sizeof(got), &n, NULL);
			break;
		case 12:
			rc = hkv_incr(x->h, "ctr", 3, 1, &res);
			if (rc == HKV_ENOTFOUND || rc == HKV_ENOTNUM)
				rc = hkv_set(x->h, "ctr", 3, "1", 1, NULL);
			break;
		case 13:
			rc = hkv_append(x->h, key, strlen(key), "+", 1, 0);
			break;
		default:
			rc = hkv_get(x->h, key, strlen(key), got, sizeof(got), &n, &info);
			if (!rc)
				rc = hkv_cas(x->h, key, strlen(key), v, len, info.version, NULL);
			break;
		}
		x->ops++;
		x->errors += unknown_rc(rc) && rc != HKV_ENOTNUM && rc != -ENOSPC;
		/* (a handle whose connection was fenced comes back by itself) */
		if (client_points[x->point].p == HKV_TP_GIVE_BACK && atomic_load(&x->armed) &&
		    atomic_load(&x->fired) < run.nstops && now_ms() - x->last_ms > 300) {
			/* holds go back at close at the latest */
			hkv_close(x->h);
			if (hkv_open(run.cfg, &x->h)) {
				fprintf(stderr, "writer %d: cannot open again\n", me);
				x->h = NULL;
				break;
			}
		}
	}
	return NULL;
}

/* `test_stalls leaver URI TOKEN store|cache`: write and leave without
 * giving back what it holds. */
static int leaver_main(char **argv)
{
	struct hkv_config *cfg = hkv_config_new();
	struct hkv_client *c;
	static uint8_t v[24576];
	char key[24];
	int cache = !strcmp(argv[4], "cache");

	if (!cfg || hkv_config_add_server(cfg, argv[2]) || hkv_config_set_token_file(cfg, argv[3]) ||
	    hkv_open(cfg, &c)) {
		fprintf(stderr, "leaver: cannot open a handle\n");
		return 1;
	}
	for (int i = 0; i < 400; i++) {
		/* (in a cache, classes nobody else uses, the last one larger
		 * than any: the moves they need evict) */
		size_t len = !cache ? 40 + (size_t)(i * 37) % 2900
			     : i < 300 ? 5000 + (size_t)(i * 37) % 1000
				       : 20000 + (size_t)i % 4000;

		snprintf(key, sizeof(key), "leaver-%d", i % 60);
		memset(v, 'L', len);
		(void)hkv_set(c, key, strlen(key), v, len, NULL);
	}
	_exit(0); /* (no hkv_close: its holds stay behind for the sweep) */
}

/* Run a leaver process (exec'd at once: a child of a process with RDMA
 * memory registered must not run on in the copy fork made). 0 if it did
 * its work. */
static int leaver(const struct hkvserver *s)
{
	char *const args[] = {"test_stalls", "leaver", (char *)s->uri, (char *)s->token_file,
			      run.cache ? "cache" : "store", NULL};
	int status = -1;
	pid_t pid = fork();

	if (pid == 0) {
		execv("/proc/self/exe", args);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Check the shared keys' histories. */
static int lin_check(void)
{
	int bad = 0;

	for (int k = 0; k < LINKEYS; k++) {
		struct lc_report rep;
		struct lc_limits lim = {.max_seconds = 10};
		enum lc_result r;

		r = lc_check(LC_REGISTER, LC_ABSENT, run.ops[k], run.nops[k], &lim, &rep);
		if (r == LC_VIOLATION) {
			fprintf(stderr, "lin%d: %zu operations NOT linearizable\n", k, run.nops[k]);
			lc_print_report(stderr, run.ops[k], run.nops[k], &rep);
			bad++;
		} else if (r == LC_GAVE_UP) {
			printf("# lin%d: checker gave up on %zu operations\n", k, run.nops[k]);
		}
		lc_report_free(&rep);
	}
	return bad;
}

/*
 * One run: a server (store or cache; with server_point, HKV_STALL stops it
 * there for each of stall_ms[0..nstops) in turn), WORKERS workers, and a
 * writer for each client point in pts[0..npts), armed after a warm-up,
 * that stops there for each of them in turn. 0 when every check passed.
 */
static int stall_run(int cache, const unsigned *stall_ms, int nstops, const int *pts, int npts,
		     const char *server_point)
{
	const char *const cache_args[] = {"--cache", NULL};
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *probe;
	char env[160], key[24], desc[48];
	uint8_t got[VMAX + 64];
	int ret, fails = 0, checked = 0, missing = 0, unknown = 0, ops = 0, xops = 0, xerr = 0;
	int fired_srv = 0, lin_bad, left = 0;
	uint64_t deadline, stall_sum = 0;

	memset(&run, 0, sizeof(run));
	pthread_mutex_init(&run.lock, NULL);
	run.cache = cache;
	run.stall_ms = stall_ms;
	run.nstops = nstops;
	env[0] = desc[0] = 0;
	for (int i = 0; i < nstops; i++) {
		stall_sum += stall_ms[i];
		snprintf(env + strlen(env), sizeof(env) - strlen(env), "%s%s:%u", i ? "," : "",
			 server_point, stall_ms[i]);
		snprintf(desc + strlen(desc), sizeof(desc) - strlen(desc), "%s%u", i ? "+" : "",
			 stall_ms[i]);
	}
	if (server_point)
		setenv("HKV_STALL", env, 1);
	ret = hkvserver_start(&s, use_verbs, getenv("HKV_STALL_MEM") ? getenv("HKV_STALL_MEM") : "2M",
			      "64K", cache ? cache_args : NULL);
	unsetenv("HKV_STALL");
	if (ret) {
		fprintf(stderr, "server did not start: %s\n", strerror(-ret));
		return -1;
	}
	cfg = run.cfg = hkvserver_config(&s);
	run.t0 = now_ms();
	for (int t = 0; t < WORKERS; t++) {
		run.w[t].t = t;
		if (hkv_open(cfg, &run.w[t].h) ||
		    pthread_create(&run.w[t].th, NULL, worker_thread, &run.w[t])) {
			fprintf(stderr, "worker %d did not start\n", t);
			exit(1);
		}
	}
	run.nx = npts;
	for (int i = 0; i < npts; i++) {
		run.x[i].point = pts[i];
		if (hkv_open(cfg, &run.x[i].h) ||
		    pthread_create(&run.x[i].th, NULL, writer_thread, &run.x[i])) {
			fprintf(stderr, "writer %d did not start\n", i);
			exit(1);
		}
	}
	hkv_test_hook = npts ? stall_hook : NULL;
	sleep_ms(use_verbs ? 1500 : 600); /* warm up: classes carved, blocks reused */
	left += leaver(&s) == 0;
	for (int i = 0; i < npts; i++) {
		run.x[i].armed_ms = run.x[i].last_ms = now_ms();
		atomic_store(&run.x[i].armed, 1);
	}
	/* until every writer has stopped and woken (or the server's stall is
	 * over), then a little more, while the workers go on */
	deadline = now_ms() + stall_sum + (use_verbs ? 30000 : 15000);
	for (uint64_t last = now_ms();;) {
		int pending = 0;

		if (server_point && now_ms() - last > 2000) {
			left += leaver(&s) == 0; /* (more for the sweep; in a cache, moves) */
			last = now_ms();
		}

		for (int i = 0; i < npts; i++)
			pending += !run.x[i].woke_ms;
		if (server_point) {
			char what[64];

			snprintf(what, sizeof(what), "stall: %s over", server_point);
			fired_srv = hkvserver_log_count(&s, what) >= nstops;
			pending += !fired_srv;
		}
		if (!pending || now_ms() > deadline)
			break;
		sleep_ms(20);
	}
	sleep_ms(300);
	atomic_store(&run.writers_stop, 1);
	for (int i = 0; i < npts; i++) {
		pthread_join(run.x[i].th, NULL);
		xops += run.x[i].ops;
		xerr += run.x[i].errors;
		if (run.x[i].h)
			hkv_close(run.x[i].h);
		run.x[i].h = NULL;
	}
	sleep_ms(200);
	atomic_store(&run.stop, 1);
	hkv_test_hook = NULL;
	for (int t = 0; t < WORKERS; t++) {
		pthread_join(run.w[t].th, NULL);
		ops += run.w[t].ops;
		unknown += run.w[t].unknown;
		fails += run.w[t].bad;
		missing += run.w[t].misses;
		hkv_close(run.w[t].h);
	}
	/* every worker's key from a fresh handle */
	if (hkv_open(cfg, &probe)) {
		fprintf(stderr, "probe: cannot open\n");
		fails++;
		probe = NULL;
	}
	for (int t = 0; probe && t < WORKERS; t++)
		for (int k = 0; k < WKEYS; k++) {
			struct worker *w = &run.w[t];
			size_t n = 0;
			int rc;

			snprintf(key, sizeof(key), "o%d-%d", t, k);
			rc = hkv_get(probe, key, strlen(key), got, sizeof(got), &n, NULL);
			if (rc == HKV_ENOTFOUND &&
			    (!w->ver[k] || (w->unsure[k] && !w->alt[k]) || cache)) {
				missing += cache && w->ver[k];
				continue;
			}
			if (!rc && ((w->ver[k] && wmatch(got, n, t, k, w->ver[k], w->len[k])) ||
				    (w->unsure[k] && w->alt[k] &&
				     wmatch(got, n, t, k, w->alt[k], w->alt_len[k])))) {
				checked++;
				continue;
			}
			if (fails++ < 10)
				fprintf(stderr, "after: %s: %s, %zu B; want version %u (%u B)%s\n", key,
					hkv_strerror(rc), n, w->ver[k], w->len[k],
					w->unsure[k] ? " or the unknown write's" : "");
		}
	if (probe)
		hkv_close(probe);
	lin_bad = lin_check();
	for (int i = 0; i < npts; i++)
		if (!run.x[i].woke_ms) {
			fprintf(stderr, "writer never reached %s\n", client_points[pts[i]].name);
			fails++;
		}
	if (!left) {
		fprintf(stderr, "no leaver process did its work\n");
		fails++;
	}
	if (server_point && !fired_srv) {
		fprintf(stderr, "the server never reached %s\n", server_point);
		fails++;
	}
	{
		uint64_t reach = 0;

		for (int i = 0; i < npts; i++)
			if (run.x[i].fired_ms && run.x[i].fired_ms - run.x[i].armed_ms > reach)
				reach = run.x[i].fired_ms - run.x[i].armed_ms;
		printf("# reached after %llu ms; run %llu ms\n", (unsigned long long)reach,
		       (unsigned long long)(now_ms() - run.t0));
	}
	printf("# %s, %s ms at %s%s%s: %d worker ops (%d unknown), %d items read back whole, "
	       "%d missing (evicted), %d wrong; writers %d ops, %d errors; lin0 %zu, lin1 %zu ops%s; "
	       "%d moves\n",
	       cache ? "cache" : "store", desc, server_point ? "server " : "",
	       server_point ? server_point : npts == 1 ? client_points[pts[0]].name : "every point",
	       npts > 1 ? " (a writer each)" : "", ops, unknown, checked,
	       missing, fails, xops, xerr, run.nops[0], run.nops[1],
	       lin_bad ? " NOT LINEARIZABLE" : "", hkvserver_log_count(&s, "moved from class"));
	fflush(stdout);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
	pthread_mutex_destroy(&run.lock);
	return fails || lin_bad || checked == 0 ? -1 : 0;
}

/* ---- the matrix -------------------------------------------------------------------- */

static const char *mode_arg; /* short, long, server; NULL: all */

static int want(const char *what)
{
	return !mode_arg || !strcmp(mode_arg, what);
}

/* Each client point alone, stopped 0.2 s and then 2 s in one run (verbs: 2 s,
 * a few points). */
static void test_client_points_short(void)
{
	static const unsigned ms[] = {200, 2000};
	int failed = 0;

	if (!want("short"))
		return;
	for (int cache = 0; cache < 2; cache++)
		for (int p = 0; p < NCPOINTS; p++) {
			if (client_points[p].cache_only && !cache)
				continue;
			if (getenv("HKV_STALL_ONLY") &&
			    strcmp(getenv("HKV_STALL_ONLY"), client_points[p].name))
				continue;
			if (use_verbs && client_points[p].p != HKV_TP_CLAIM_STAMP &&
			    client_points[p].p != HKV_TP_VIEW_POST &&
			    client_points[p].p != HKV_TP_INSERT_COMMIT &&
			    client_points[p].p != HKV_TP_EVICT_MARK)
				continue;
			if (stall_run(cache, ms + use_verbs, 2 - use_verbs, &p, 1, NULL)) {
				fprintf(stderr, "FAILED: %s, %s stopped\n",
					cache ? "cache" : "store", client_points[p].name);
				failed++;
			}
		}
	CHECK(failed == 0);
}

/* Every client point at once, a writer each, 10 s (verbs: 2 s). */
static void test_client_points_long(void)
{
	static const unsigned ms[] = {2000, 10000};
	int pts[NCPOINTS], n, failed = 0;

	if (!want("long"))
		return;
	for (int cache = 0; cache < 2; cache++) {
		n = 0;
		for (int p = 0; p < NCPOINTS; p++)
			if (!client_points[p].cache_only || cache)
				pts[n++] = p;
		if (stall_run(cache, use_verbs ? &ms[0] : &ms[1], 1, pts, n, NULL)) {
			fprintf(stderr, "FAILED: %s, every point at once\n", cache ? "cache" : "store");
			failed++;
		}
	}
	CHECK(failed == 0);
}

/* The server stopped at each of its points. */
static void test_server_points(void)
{
	static const struct {
		const char *name;
		int store, cache, long_too;
	} sp[] = {
		{"take-back", 1, 1, 1},    {"move-claimed", 1, 0, 0}, {"move-publish", 1, 0, 1},
		{"move-swing", 1, 0, 1},   {"move-carve", 1, 1, 0},
	};
	static const unsigned ms[] = {200, 2000, 10000};
	int failed = 0;

	if (!want("server"))
		return;
	for (int cache = 0; cache < 2; cache++)
		for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]); i++)
			for (int d = 0; d < 2; d++) { /* 0.2 s then 2 s in one run; 10 s */
				if (!(cache ? sp[i].cache : sp[i].store) || (d == 1 && !sp[i].long_too) ||
				    (d == 1 && use_verbs))
					continue;
				/* (verbs, cache, take-back: not in the guest's subset. A
				 * take-back needs a leaver that exits holding blocks, and in
				 * 1 of 3 guest runs none came within 32 s - a run that
				 * proves nothing. Why is not known yet; the cache's leavers
				 * write scarce classes, where a claim takes one block. shm
				 * runs it at every length.) */
				if (use_verbs && cache && !strcmp(sp[i].name, "take-back"))
					continue;
				if (getenv("HKV_STALL_ONLY") && strcmp(getenv("HKV_STALL_ONLY"), sp[i].name))
					continue;
				if (stall_run(cache, d ? ms + 2 : ms + use_verbs, d ? 1 : 2 - use_verbs,
					      NULL, 0, sp[i].name)) {
					fprintf(stderr, "FAILED: %s, server stopped at %s%s\n",
						cache ? "cache" : "store", sp[i].name, d ? " (10 s)" : "");
					failed++;
				}
			}
	CHECK(failed == 0);
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "leaver"))
		return leaver_main(argv);
	use_verbs = hkvserver_want_verbs(argc, argv);
	mode_arg = argc > 2 ? argv[2] : NULL;
	printf("# transport %s\n", use_verbs ? "verbs" : "shm");
	RUN_TEST(test_client_points_short);
	RUN_TEST(test_client_points_long);
	RUN_TEST(test_server_points);
	return hkv_test_finish();
}
