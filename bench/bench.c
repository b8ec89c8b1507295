/*
 * hatchkv-bench - YCSB core workloads against hatchkv and, side by side in
 * the same invocation, memcached over TCP.
 *
 *   hatchkv-bench --compare [--quick] [--json FILE]     start servers, run all
 *   hatchkv-bench --compare --replicas 2|3 ...  also hatchkv-rN: a replicated
 *                 handle over N more (fresh, store-mode) servers, side by side
 *   hatchkv-bench --system hatchkv --server URI --token-file F -w A ...
 *   hatchkv-bench --server URI0,URI1[,URI2] --token-file F ...  (hatchkv-rN:
 *                 replicated over those servers, sharing the token file F)
 *   hatchkv-bench --system memcached --memcached HOST:PORT -w B ...
 *   hatchkv-bench --compare --cache --memory MB --family scan|--trace FILE
 *                 replay a request trace (workload T) against a cache-mode
 *                 hatchkv-server and memcached -m MB: throughput and hit ratio
 *
 * A run = load phase (records inserted, split over threads) then run phase
 * per workload: operations chosen by the workload's mix and key chooser,
 * each timed (read-modify-write as one operation) into per-thread log-linear
 * histograms, merged at the end. Output: YCSB's text report, optional JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "bench/drivers.h"
#include "bench/hist.h"
#include "bench/sim.h" /* (HKV_SIM_ITEM_OVERHEAD: what the simulators charge an item) */
#include "bench/trace.h"
#include "bench/ycsb.h"
#include "common/cli.h"
#include "common/etcd.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/support/hkvserver.h"

#define MAX_THREADS 64

struct opts {
	const char *workloads;
	uint64_t records, operations, warmup;
	int no_load; /* the records are there already (an earlier run loaded them) */
	double duration, target;
	int threads;
	size_t fieldcount, fieldlength;
	const char *system, *uri, *token_file, *memcached, *json;
	const char *metrics_file; /* --metrics-file: Prometheus text of the runs */
	const char *hkv_memcached; /* hatchkv-memcached's HOST:PORT (system "hkv-memcached") */
	int compare, quick, verbs;
	int via_memcached;         /* --compare also runs hatchkv-memcached */
	int processes;             /* client processes per run phase */
	int batch;                 /* operations in flight per thread (reads batched) */
	int depth;                 /* hatchkv: operations in flight per thread (hkv_pipe) */
	int pidx;                  /* this process's index (children: >= 1) */
	int replicas;              /* --replicas N: also run hatchkv-rN (0: not) */
	const char *repl_uris;     /* --compare: hatchkv-rN's servers, comma-separated */
	const char *child_result;  /* child mode: write the phase's result here */
	int gate_ready, gate_go;   /* child mode: the start gate's pipe ends (-1: none) */
	pid_t server_pid;
	struct hkv_etcd_sec etcd;  /* --etcd-*: a cluster's etcd */
	/* workload T: a trace replayed (--trace FILE or --family NAME) */
	const char *trace_file;
	int family;                 /* enum hkv_trace_family_kind, -1: none */
	struct hkv_trace_family f;  /* its parameters (seed, values, family options) */
	int cache;                  /* --compare: hatchkv-server --cache */
	uint64_t memory_mb;         /* --compare: both servers' memory (0: sized to the records) */
};

struct result {
	char system[16], workload, transport[8];
	int replicas; /* hatchkv: copies of each item its handles wrote (0: not hatchkv) */
	double runtime_ms, throughput, server_cpu;
	/* the work's own time (CLOCK_MONOTONIC, one clock for every process of
	 * the host): the start all workers were released at, the last one's end */
	uint64_t start_ns, end_ns, ops;
	struct hist h[YOP_N];
	uint64_t ok[YOP_N], notfound[YOP_N], err[YOP_N];
	struct drv_counters cnt[YOP_N];
	struct hkv_client_stats stats; /* hatchkv: the library's counters, summed */
	int has_stats;
	/* workload T: deletes (done, of absent keys) and requests not replayed
	 * (a key or value the systems refuse) */
	uint64_t deletes, deletes_nf, skipped;
};

struct run;

struct worker {
	struct run *run;
	int id;
	pthread_t tid;
	struct driver *drv;
	struct ycsb_rng rng;
	struct ycsb_chooser chooser;
	struct hist h[YOP_N];
	uint64_t ok[YOP_N], notfound[YOP_N], err[YOP_N];
	struct drv_counters cnt[YOP_N];
	uint8_t *val, *buf;
	struct hkv_pipe *pipe; /* --depth: opened before the clock starts */
	uint64_t end_ns;       /* when this worker's last operation ended */
	int failed;
	uint64_t deletes, deletes_nf, skipped; /* workload T */
};

struct run {
	const struct opts *o;
	const struct ycsb_workload *w; /* NULL: load phase */
	const char *system;
	size_t vlen;
	atomic_uint_fast64_t next_insert; /* key numbers handed to inserts */
	uint64_t insert_base;             /* this process's first insert key number */
	atomic_uint_fast64_t done;
	uint64_t ops_per_thread;
	/* Workers start together: each waits at `ready` once connected and warm,
	 * the main thread then opens the processes' gate, takes start_ns and
	 * meets them at `go`. The run time is the last worker's end_ns minus
	 * start_ns, whatever the main thread does meanwhile (the progress line). */
	pthread_barrier_t ready, go;
	uint64_t start_ns;
	atomic_int finished; /* workers past their last operation */
	struct worker wk[MAX_THREADS];
};

static volatile sig_atomic_t stop_requested;
/* Workload T: the trace every worker replays its share of, and its
 * largest value replayed (larger ones are skipped). */
static const struct ycsb_workload trace_workload = {.name = 'T'};
static struct hkv_trace trace;
static uint32_t trace_vmax;
#define TRACE_VALUE_MAX (1u << 20) /* memcached's default item size limit */
#define TRACE_KEY_MAX   250        /* memcached's key limit, and hatchkv's */
static struct hkv_config *hkv_cfg; /* the hatchkv run's shared config */
/* --compare --replicas: hatchkv-rN's servers, whose CPU use is summed */
static pid_t repl_pids[3];
static int nrepl_pids;

/* "hatchkv" (one server) or "hatchkv-rN" (replicated over N servers) */
static int is_hkv(const char *system)
{
	return !strncmp(system, "hatchkv", 7);
}

static int is_repl(const char *system)
{
	return !strncmp(system, "hatchkv-r", 9);
}

/* Workload T: a trace is replayed (--trace or --family) instead of A-F. */
static int replays(const struct opts *o)
{
	return o->trace_file || o->family >= 0;
}

/* A workload by letter: A-F, or T (the trace). */
static const struct ycsb_workload *workload_of(char name)
{
	return name == 'T' ? &trace_workload : ycsb_workload(name);
}

/* The server URI(s) a hatchkv system runs on: hatchkv-rN's list in
 * --compare, else --server (a child's or the user's, maybe a list). */
static const char *system_uris(const struct opts *o, const char *system)
{
	return is_repl(system) && o->repl_uris ? o->repl_uris : o->uri;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct driver *open_driver(const struct opts *o, const char *system)
{
	if (!strcmp(system, "memcached"))
		return driver_open_memcached(o->memcached);
	if (!strcmp(system, "hkv-memcached")) /* the same text-protocol driver */
		return driver_open_memcached(o->hkv_memcached);
	return driver_open_hatchkv(hkv_cfg);
}

/* ---- one operation ----------------------------------------------------------- */

static void account(struct worker *w, enum ycsb_op op, int ret)
{
	if (!ret)
		w->ok[op]++;
	else if (ret == HKV_ENOTFOUND)
		w->notfound[op]++;
	else if (w->err[op]++ == 0)
		fprintf(stderr, "hatchkv-bench: %s failed: %s\n", ycsb_op_names[op], hkv_strerror(ret));
}

/* One timed operation of kind op done: its latency since t0, the transport
 * counters it moved since c0, its outcome. */
static void record(struct worker *w, enum ycsb_op op, uint64_t t0,
		   const struct drv_counters *c0, int ret)
{
	struct drv_counters c1;

	hist_add(&w->h[op], now_ns() - t0);
	w->drv->ops->counters(w->drv, &c1);
	drv_counters_add(&w->cnt[op], &c1, c0);
	account(w, op, ret);
}

static int do_write(struct worker *w, uint64_t keynum)
{
	char key[32];
	size_t klen = ycsb_key(keynum, key, sizeof(key));
	size_t field = ycsb_rand(&w->rng) % w->run->o->fieldcount, fl = w->run->o->fieldlength;

	/* an update rewrites one field; the store is value-opaque, so the whole
	 * record goes out, as YCSB's key-value bindings do */
	for (size_t i = 0; i < fl; i += 8) {
		uint64_t r = ycsb_rand(&w->rng);

		for (size_t j = 0; j < 8 && i + j < fl; j++)
			w->val[field * fl + i + j] = (uint8_t)(' ' + (r >> (8 * j)) % 95);
	}
	return w->drv->ops->write(w->drv, key, klen, w->val, w->run->vlen);
}

static int do_read(struct worker *w, uint64_t keynum)
{
	char key[32];
	size_t klen = ycsb_key(keynum, key, sizeof(key)), vlen;

	return w->drv->ops->read(w->drv, key, klen, w->buf, w->run->vlen + 64, &vlen);
}

static void one_op(struct worker *w, int measure)
{
	struct run *r = w->run;
	enum ycsb_op op = ycsb_next_op(r->w, &w->rng);
	uint64_t latest = atomic_load(&r->next_insert), key, t0;
	struct drv_counters c0;
	int ret;

	if (op == YOP_INSERT) {
		key = atomic_fetch_add(&r->next_insert, 1);
	} else {
		/* choose among the loaded records and this process's own inserts */
		key = ycsb_choose(&w->chooser, &w->rng, r->o->records + (latest - r->insert_base));
		if (key >= r->o->records)
			key = r->insert_base + (key - r->o->records);
	}
	w->drv->ops->counters(w->drv, &c0);
	t0 = now_ns();
	switch (op) {
	case YOP_READ:
		ret = do_read(w, key);
		break;
	case YOP_RMW:
		ret = do_read(w, key);
		if (!ret)
			ret = do_write(w, key);
		break;
	default:
		ret = do_write(w, key);
		break;
	}
	if (measure)
		record(w, op, t0, &c0, ret);
}

/* ---- phases ------------------------------------------------------------------ */

/* A worker's wait for the start: all workers of all processes leave it
 * together; returns the run's start time. */
static uint64_t start_together(struct run *r)
{
	pthread_barrier_wait(&r->ready);
	pthread_barrier_wait(&r->go);
	return r->start_ns;
}

static void *worker_done(struct worker *w)
{
	w->end_ns = now_ns();
	atomic_fetch_add(&w->run->finished, 1);
	return NULL;
}

/*
 * Workload T: one request of the trace. A get is look-aside, as a service
 * in front of a database does: on a miss the value (the trace's size) is
 * set. Gets time as reads (a hit is OK, a miss NOT_FOUND), sets and fills
 * as updates, add's store as an insert, replace/cas/append/incr-like
 * requests (only if present) as read-modify-writes.
 */
static void trace_op(struct worker *w, const struct hkv_trace_req *q)
{
	const struct driver_ops *d = w->drv->ops;
	char key[TRACE_KEY_MAX + 1];
	size_t klen = hkv_trace_key(&trace, q->key, key, sizeof(key) - 1), vlen;
	struct drv_counters c0;
	enum ycsb_op op = YOP_READ;
	uint64_t t0;
	int ret;

	for (size_t i = 0; i < klen; i++)
		if ((unsigned char)key[i] <= ' ' || key[i] == 0x7f)
			klen = 0; /* (the text protocol cannot carry it) */
	if (!klen || q->value_size > trace_vmax) {
		w->skipped++;
		return;
	}
	d->counters(w->drv, &c0);
	t0 = now_ns();
	switch (q->op) {
	case HKV_TRACE_GET:
		ret = d->read(w->drv, key, klen, w->buf, trace_vmax + 64, &vlen);
		record(w, YOP_READ, t0, &c0, ret);
		if (ret != HKV_ENOTFOUND)
			return;
		d->counters(w->drv, &c0); /* the fill */
		t0 = now_ns();
		ret = d->write(w->drv, key, klen, w->val, q->value_size);
		op = YOP_UPDATE;
		break;
	case HKV_TRACE_SET:
		ret = d->write(w->drv, key, klen, w->val, q->value_size);
		op = YOP_UPDATE;
		break;
	case HKV_TRACE_ADD: /* store if absent */
		ret = d->read(w->drv, key, klen, w->buf, trace_vmax + 64, &vlen);
		if (ret == HKV_ENOTFOUND)
			ret = d->write(w->drv, key, klen, w->val, q->value_size);
		else if (!ret)
			ret = HKV_ENOTFOUND; /* (not stored: it was there) */
		op = YOP_INSERT;
		break;
	case HKV_TRACE_UPDATE: /* only if present */
		ret = d->read(w->drv, key, klen, w->buf, trace_vmax + 64, &vlen);
		if (!ret)
			ret = d->write(w->drv, key, klen, w->val, q->value_size);
		op = YOP_RMW;
		break;
	default: /* HKV_TRACE_DELETE */
		ret = d->del(w->drv, key, klen);
		w->deletes++;
		if (ret == HKV_ENOTFOUND)
			w->deletes_nf++;
		else if (ret && w->err[YOP_UPDATE]++ == 0)
			fprintf(stderr, "hatchkv-bench: delete failed: %s\n", hkv_strerror(ret));
		return;
	}
	record(w, op, t0, &c0, ret);
}

/* Workload T: this worker's share of the trace, in trace order - request i
 * goes to worker i mod (threads x processes) - until it ends (or --duration). */
static void trace_run(struct worker *w, uint64_t end)
{
	const struct opts *o = w->run->o;
	uint64_t stride = (uint64_t)o->threads * (uint64_t)o->processes;

	for (uint64_t i = (uint64_t)o->pidx * (uint64_t)o->threads + (uint64_t)w->id;
	     i < trace.n && !stop_requested; i += stride) {
		if (end && now_ns() >= end)
			break;
		trace_op(w, &trace.req[i]);
		atomic_fetch_add(&w->run->done, 1);
	}
}

static void *load_main(void *arg)
{
	struct worker *w = arg;
	const struct opts *o = w->run->o;

	start_together(w->run);
	for (uint64_t k = (uint64_t)w->id; k < o->records && !stop_requested; k += (uint64_t)o->threads) {
		int ret = do_write(w, k);

		if (ret) {
			fprintf(stderr, "hatchkv-bench: load of record %llu failed: %s\n",
				(unsigned long long)k, hkv_strerror(ret));
			w->failed = 1;
			break;
		}
		atomic_fetch_add(&w->run->done, 1);
	}
	return worker_done(w);
}

/*
 * --batch N: N operations in flight per thread. The reads among them go out
 * as one multi-get (hatchkv: one chain of READs; memcached: one "get k1 k2
 * ..."), each read timed as the batch; the other operations run one by one.
 */
#define MAX_BATCH 64

static void batch_ops(struct worker *w, int n)
{
	struct run *r = w->run;
	char keys[MAX_BATCH][32];
	const char *kp[MAX_BATCH];
	size_t kl[MAX_BATCH];
	uint8_t *bufs[MAX_BATCH];
	int status[MAX_BATCH], nr = 0;
	struct drv_counters c0, c1;
	uint64_t t0, dt;

	for (int i = 0; i < n; i++) {
		struct ycsb_rng peek = w->rng;

		if (ycsb_next_op(r->w, &peek) != YOP_READ) {
			one_op(w, 1);
			continue;
		}
		w->rng = peek;
		kl[nr] = ycsb_key(ycsb_choose(&w->chooser, &w->rng, atomic_load(&r->next_insert) -
							  r->insert_base + r->o->records),
				  keys[nr], sizeof(keys[nr]));
		kp[nr] = keys[nr];
		bufs[nr] = w->buf + (size_t)nr * (r->vlen + 64);
		nr++;
	}
	if (!nr)
		return;
	w->drv->ops->counters(w->drv, &c0);
	t0 = now_ns();
	w->drv->ops->mread(w->drv, kp, kl, nr, bufs, r->vlen + 64, status);
	dt = now_ns() - t0;
	w->drv->ops->counters(w->drv, &c1);
	for (int i = 0; i < nr; i++) {
		hist_add(&w->h[YOP_READ], dt);
		account(w, YOP_READ, status[i]);
	}
	drv_counters_add(&w->cnt[YOP_READ], &c1, &c0);
}

/*
 * --depth D (hatchkv): D operations in flight per thread through an
 * hkv_pipe; each is timed from its submission to its completion. A
 * read-modify-write is a GET, then (when it is back) a SET of the key.
 * Round trips per op: the pipe's GET round trips go to reads, its SET ones
 * to updates and inserts (the lanes' counters).
 */
#define MAX_DEPTH 64

struct dslot {
	struct hkv_pipe_op op;
	enum ycsb_op kind;
	uint64_t t0;
	char key[32];
	uint8_t *buf;
};

static void depth_submit(struct worker *w, struct hkv_pipe *p, struct dslot *s)
{
	struct run *r = w->run;
	uint64_t latest = atomic_load(&r->next_insert), key;
	size_t klen;

	s->kind = ycsb_next_op(r->w, &w->rng);
	if (s->kind == YOP_INSERT) {
		key = atomic_fetch_add(&r->next_insert, 1);
	} else {
		key = ycsb_choose(&w->chooser, &w->rng, r->o->records + (latest - r->insert_base));
		if (key >= r->o->records)
			key = r->insert_base + (key - r->o->records);
	}
	klen = ycsb_key(key, s->key, sizeof(s->key));
	if (s->kind == YOP_READ || s->kind == YOP_RMW)
		s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_GET, .key = s->key, .klen = klen,
					     .buf = s->buf, .cap = r->vlen + 64, .user = s};
	else
		s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = s->key, .klen = klen,
					     .val = w->val, .vlen = r->vlen, .user = s};
	s->t0 = now_ns();
	(void)hkv_pipe_submit(p, &s->op); /* (never more than depth at once) */
}

static void depth_run(struct worker *w, uint64_t start, uint64_t end)
{
	const struct opts *o = w->run->o;
	struct dslot slots[MAX_DEPTH];
	struct hkv_client_stats st;
	struct hkv_pipe *p = w->pipe;
	uint64_t submitted = 0;

	(void)start;
	for (int i = 0; i < o->depth; i++) {
		slots[i].buf = w->buf + (size_t)i * (w->run->vlen + 64);
		depth_submit(w, p, &slots[i]);
		submitted++;
	}
	while (hkv_pipe_pending(p)) {
		struct hkv_pipe_op *done[MAX_DEPTH];
		int n = hkv_pipe_poll(p, done, MAX_DEPTH);

		for (int i = 0; i < n; i++) {
			struct dslot *s = done[i]->user;

			if (s->kind == YOP_RMW && s->op.kind == HKV_PIPE_GET && !s->op.status) {
				s->op = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = s->key,
							     .klen = s->op.klen, .val = w->val,
							     .vlen = w->run->vlen, .user = s};
				(void)hkv_pipe_submit(p, &s->op);
				continue;
			}
			hist_add(&w->h[s->kind], now_ns() - s->t0);
			account(w, s->kind, s->op.status);
			atomic_fetch_add(&w->run->done, 1);
			if (!stop_requested &&
			    (end ? now_ns() < end : submitted < w->run->ops_per_thread)) {
				depth_submit(w, p, s);
				submitted++;
			}
		}
	}
	hkv_pipe_stats(p, &st);
	w->cnt[YOP_READ].round_trips += st.op[HKV_OP_GET].round_trips;
	w->cnt[YOP_READ].bytes_read += st.op[HKV_OP_GET].bytes_read;
	w->cnt[YOP_UPDATE].round_trips += st.op[HKV_OP_SET].round_trips;
	w->cnt[YOP_UPDATE].bytes_written += st.op[HKV_OP_SET].bytes_written;
}

static void *run_main(void *arg)
{
	struct worker *w = arg;
	const struct opts *o = w->run->o;
	double per_thread_rate = o->target > 0 ? o->target / o->threads / o->processes : 0;
	uint64_t start, end;

	for (uint64_t i = 0; w->run->w != &trace_workload && i < o->warmup; i++)
		one_op(w, 0);
	start = start_together(w->run);
	end = o->duration > 0 ? start + (uint64_t)(o->duration * 1e9) : 0;
	if (w->run->w == &trace_workload) {
		trace_run(w, end);
		return worker_done(w);
	}
	if (w->pipe) {
		depth_run(w, start, end);
		return worker_done(w);
	}
	for (uint64_t i = 0; !stop_requested; i++) {
		if (end ? now_ns() >= end : i >= w->run->ops_per_thread)
			break;
		if (per_thread_rate > 0) /* open-loop pacing to the target rate */
			while (now_ns() < start + (uint64_t)((double)i * 1e9 / per_thread_rate))
				;
		if (o->batch > 1) {
			batch_ops(w, o->batch);
			atomic_fetch_add(&w->run->done, (uint64_t)o->batch);
			i += (uint64_t)o->batch - 1;
			continue;
		}
		one_op(w, 1);
		atomic_fetch_add(&w->run->done, 1);
	}
	return worker_done(w);
}

static void progress(struct run *r, uint64_t total, uint64_t t0)
{
	uint64_t done = atomic_load(&r->done);
	double secs = (double)(now_ns() - t0) / 1e9, rate = secs > 0 ? (double)done / secs : 0;

	fprintf(stdout, "\r  %s %c: %llu ops, %.0f ops/s, ETA %.0f s   ", r->system,
		r->w ? r->w->name : 'L', (unsigned long long)done, rate,
		rate > 0 && total > done ? (double)(total - done) / rate : 0.0);
	fflush(stdout);
}

static uint64_t proc_cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return 0;
	return ut + st;
}

/* The server's CPU ticks; hatchkv-rN's: the sum over its servers. */
static uint64_t server_ticks(const char *system, pid_t server_pid)
{
	uint64_t t = 0;

	if (server_pid <= 0 || !is_repl(system) || !nrepl_pids)
		return proc_cpu_ticks(server_pid);
	for (int i = 0; i < nrepl_pids; i++)
		t += proc_cpu_ticks(repl_pids[i]);
	return t;
}

/* Add a worker's library counters (its handle's, and its pipe's) to res:
 * every field of hkv_client_stats is a uint64_t count. */
static void add_stats(struct result *res, struct worker *wk)
{
	struct hkv_client_stats st[2];
	uint64_t *sum = (uint64_t *)&res->stats;

	_Static_assert(sizeof(st[0]) % sizeof(uint64_t) == 0, "hkv_client_stats: uint64_t only");
	memset(st, 0, sizeof(st));
	if (wk->drv->ops->stats)
		wk->drv->ops->stats(wk->drv, &st[0]);
	if (wk->pipe)
		hkv_pipe_stats(wk->pipe, &st[1]);
	for (size_t i = 0; i < sizeof(st[0]) / sizeof(uint64_t); i++)
		sum[i] += ((const uint64_t *)&st[0])[i] + ((const uint64_t *)&st[1])[i];
	res->has_stats = 1;
}

/*
 * The processes' start gate (-p N): every child, once its workers are
 * connected and warm, writes one byte on the ready pipe and reads the go
 * pipe; the parent, once its own workers are ready too, reads a byte from
 * each child and closes the go pipe. End of file is "go"; a byte before it
 * is "abort" (the parent failed). One process alone has no gate.
 */
static int gate_ready_r = -1, gate_go_w = -1, gate_kids; /* the parent's ends */

/* Pass this process's gate; -1 if the run must not start. */
static int gate_pass(const struct opts *o)
{
	char c;
	ssize_t n;

	if (o->gate_ready >= 0) { /* a child */
		n = write(o->gate_ready, "r", 1);
		close(o->gate_ready);
		while ((n = read(o->gate_go, &c, 1)) < 0 && errno == EINTR)
			;
		close(o->gate_go);
		return n == 0 ? 0 : -1;
	}
	for (int i = 0; i < gate_kids; i++) {
		while ((n = read(gate_ready_r, &c, 1)) < 0 && errno == EINTR)
			;
		if (n != 1) {
			fprintf(stderr, "hatchkv-bench: a client process ended before the start\n");
			return -1;
		}
	}
	if (gate_go_w >= 0)
		close(gate_go_w); /* go */
	gate_go_w = -1;
	return 0;
}

/* The run time and rate of a phase from its work's own start and end. */
static void set_rate(struct result *res)
{
	double secs = (double)(res->end_ns - res->start_ns) / 1e9;

	res->runtime_ms = secs * 1e3;
	res->throughput = secs > 0 ? (double)res->ops / secs : 0;
}

/* Run one phase with o->threads workers; fills res for run phases. */
static int phase(const struct opts *o, const char *system, const struct ycsb_workload *w,
		 struct result *res, pid_t server_pid)
{
	static struct run r; /* big: per-thread histograms */
	uint64_t total, cpu0, cpu1, shown, seen, end = 0;
	int failed = 0, tty = isatty(1) && !o->child_result;

	memset(&r, 0, sizeof(r));
	r.o = o;
	r.w = w;
	r.system = system;
	r.vlen = w == &trace_workload ? trace_vmax : o->fieldcount * o->fieldlength;
	/* processes insert into disjoint key ranges */
	r.insert_base = o->records + (uint64_t)o->pidx * (o->operations + 1);
	atomic_store(&r.next_insert, r.insert_base);
	r.ops_per_thread = o->operations / (uint64_t)o->processes / (uint64_t)o->threads;
	total = w ? (o->duration > 0 ? 0 : r.ops_per_thread * (uint64_t)o->threads) : o->records;
	if (w == &trace_workload)
		total = o->duration > 0 ? 0 : trace.n / (uint64_t)o->processes;
	for (int i = 0; i < o->threads; i++) {
		struct worker *wk = &r.wk[i];

		wk->run = &r;
		wk->id = i;
		ycsb_rng_seed(&wk->rng, 0x5eed0000ull + (uint64_t)i * 7919 + (w ? (uint64_t)w->name : 0));
		if (w)
			ycsb_chooser_init(&wk->chooser, w->dist, o->records);
		for (int k = 0; k < YOP_N; k++)
			hist_init(&wk->h[k]);
		wk->val = malloc(r.vlen + 64);
		wk->buf = malloc((r.vlen + 64) * (size_t)(o->batch > 1	? o->batch
							  : o->depth > 1 ? o->depth
									 : 1));
		ycsb_fill_record(wk->val, r.vlen, &wk->rng);
		wk->drv = open_driver(o, system);
		if (!wk->drv)
			return -1;
		wk->pipe = NULL;
		if (w && w != &trace_workload && o->depth > 1 && is_hkv(system)) {
			/* (others, and traces: one at a time) */
			int ret = hkv_pipe_open(hkv_cfg, o->depth, &wk->pipe);

			if (ret) {
				fprintf(stderr, "hatchkv-bench: hkv_pipe_open: %s\n", hkv_strerror(ret));
				return -1;
			}
		}
	}
	pthread_barrier_init(&r.ready, NULL, (unsigned)o->threads + 1);
	pthread_barrier_init(&r.go, NULL, (unsigned)o->threads + 1);
	for (int i = 0; i < o->threads; i++)
		pthread_create(&r.wk[i].tid, NULL, w ? run_main : load_main, &r.wk[i]);
	pthread_barrier_wait(&r.ready);
	if (gate_pass(o)) {
		stop_requested = 1; /* (the workers stop at once) */
		failed = 1;
	}
	cpu0 = server_ticks(system, server_pid);
	r.start_ns = now_ns();
	pthread_barrier_wait(&r.go);
	/* the display only: the run time comes from the workers' own ends */
	for (shown = r.start_ns; atomic_load(&r.finished) < o->threads;) {
		usleep(10000);
		if (tty && now_ns() - shown >= 200000000ull) {
			progress(&r, total, r.start_ns);
			shown = now_ns();
		}
	}
	seen = now_ns();
	cpu1 = server_ticks(system, server_pid);
	for (int i = 0; i < o->threads; i++) {
		pthread_join(r.wk[i].tid, NULL);
		if (r.wk[i].end_ns > end)
			end = r.wk[i].end_ns;
	}
	pthread_barrier_destroy(&r.ready);
	pthread_barrier_destroy(&r.go);
	if (tty)
		printf("\r%70s\r", "");
	if (res) {
		memset(res, 0, sizeof(*res));
		snprintf(res->system, sizeof(res->system), "%s", system);
		res->workload = w ? w->name : 'L';
		snprintf(res->transport, sizeof(res->transport), "%s",
			 !is_hkv(system) ? "tcp" : o->verbs ? "verbs" : "shm");
		res->replicas = is_hkv(system) ? (int)driver_hatchkv_replicas_seen : 0;
		res->start_ns = r.start_ns;
		res->end_ns = end > r.start_ns ? end : r.start_ns;
		res->ops = atomic_load(&r.done);
		set_rate(res);
		/* (over the main thread's window: the server's ticks are 10 ms) */
		res->server_cpu = server_pid > 0 ? 100.0 * (double)(cpu1 - cpu0) /
							   (double)sysconf(_SC_CLK_TCK) /
							   ((double)(seen - r.start_ns) / 1e9)
						 : -1;
		for (int k = 0; k < YOP_N; k++)
			hist_init(&res->h[k]);
	}
	for (int i = 0; i < o->threads; i++) {
		struct worker *wk = &r.wk[i];

		failed |= wk->failed;
		if (res) {
			res->deletes += wk->deletes;
			res->deletes_nf += wk->deletes_nf;
			res->skipped += wk->skipped;
		}
		for (int k = 0; res && k < YOP_N; k++) {
			hist_merge(&res->h[k], &wk->h[k]);
			res->ok[k] += wk->ok[k];
			res->notfound[k] += wk->notfound[k];
			res->err[k] += wk->err[k];
			drv_counters_add(&res->cnt[k], &wk->cnt[k], &(struct drv_counters){0});
		}
		if (res && (wk->pipe || wk->drv->ops->stats))
			add_stats(res, wk);
		hkv_pipe_close(wk->pipe); /* (NULL: none) */
		wk->drv->ops->close(wk->drv);
		free(wk->val);
		free(wk->buf);
	}
	return failed ? -1 : 0;
}

/* ---- reports ------------------------------------------------------------------ */

static double us(uint64_t ns)
{
	return (double)ns / 1e3;
}

/* Workload T: the gets replayed (a hit is OK, a miss NOT_FOUND), and the
 * hits among them in percent. */
static uint64_t trace_gets(const struct result *r)
{
	return r->ok[YOP_READ] + r->notfound[YOP_READ];
}

static double hit_ratio(const struct result *r)
{
	uint64_t gets = trace_gets(r);

	return gets ? 100.0 * (double)r->ok[YOP_READ] / (double)gets : 0;
}

static void report_text(const struct result *r)
{
	printf("# %s, workload %c, transport %s\n", r->system, r->workload, r->transport);
	printf("[OVERALL], RunTime(ms), %.0f\n", r->runtime_ms);
	printf("[OVERALL], Throughput(ops/sec), %.1f\n", r->throughput);
	if (r->server_cpu >= 0)
		printf("[OVERALL], ServerCPU(%%), %.2f\n", r->server_cpu);
	for (int k = 0; k < YOP_N; k++) {
		const struct hist *h = &r->h[k];
		const char *n = ycsb_op_names[k];

		if (!h->count)
			continue;
		printf("[%s], Operations, %llu\n", n, (unsigned long long)h->count);
		printf("[%s], AverageLatency(us), %.2f\n", n, us(h->sum_ns) / (double)h->count);
		printf("[%s], MinLatency(us), %.2f\n", n, us(h->min_ns));
		printf("[%s], MaxLatency(us), %.2f\n", n, us(h->max_ns));
		printf("[%s], 50thPercentileLatency(us), %.2f\n", n, us(hist_quantile(h, 0.50)));
		printf("[%s], 95thPercentileLatency(us), %.2f\n", n, us(hist_quantile(h, 0.95)));
		printf("[%s], 99thPercentileLatency(us), %.2f\n", n, us(hist_quantile(h, 0.99)));
		printf("[%s], 99.9thPercentileLatency(us), %.2f\n", n, us(hist_quantile(h, 0.999)));
		if (r->cnt[k].round_trips)
			printf("[%s], RoundTripsPerOp, %.3f\n", n,
			       (double)r->cnt[k].round_trips / (double)h->count);
		if (r->cnt[k].wrs) { /* (one at a time: a pipe's are not split by op) */
			printf("[%s], WorkRequestsPerOp, %.3f\n", n,
			       (double)r->cnt[k].wrs / (double)h->count);
			printf("[%s], AtomicsPerOp, %.3f\n", n,
			       (double)r->cnt[k].atomics / (double)h->count);
			printf("[%s], SignaledPerOp, %.3f\n", n,
			       (double)r->cnt[k].signaled / (double)h->count);
		}
		printf("[%s], Return=OK, %llu\n", n, (unsigned long long)r->ok[k]);
		if (r->notfound[k])
			printf("[%s], Return=NOT_FOUND, %llu\n", n, (unsigned long long)r->notfound[k]);
		if (r->err[k])
			printf("[%s], Return=ERROR, %llu\n", n, (unsigned long long)r->err[k]);
	}
	if (r->workload != 'T')
		return;
	if (r->deletes)
		printf("[DELETE], Operations, %llu\n[DELETE], Return=NOT_FOUND, %llu\n",
		       (unsigned long long)r->deletes, (unsigned long long)r->deletes_nf);
	printf("[TRACE], Gets, %llu\n", (unsigned long long)trace_gets(r));
	printf("[TRACE], HitRatio(%%), %.2f\n", hit_ratio(r));
	if (r->skipped)
		printf("[TRACE], Skipped, %llu\n", (unsigned long long)r->skipped);
}

static void json_op(FILE *f, const struct result *r, int k, int *first)
{
	static const char *const keys[YOP_N] = {"read", "update", "insert", "scan", "rmw"};
	const struct hist *h = &r->h[k];
	double n = (double)h->count;

	if (!h->count)
		return;
	fprintf(f, "%s\n      \"%s\": {\"count\": %llu, \"avg_us\": %.3f, \"min_us\": %.3f, "
		   "\"max_us\": %.3f, \"p50_us\": %.3f, \"p95_us\": %.3f, \"p99_us\": %.3f, "
		   "\"p999_us\": %.3f, \"round_trips_per_op\": %.4f, \"bytes_read_per_op\": %.1f, "
		   "\"bytes_written_per_op\": %.1f, \"wrs_per_op\": %.3f, \"atomics_per_op\": %.3f, "
		   "\"signaled_per_op\": %.3f, \"not_found\": %llu, \"errors\": %llu, \"cdf\": [",
		*first ? "" : ",", keys[k], (unsigned long long)h->count, us(h->sum_ns) / n,
		us(h->min_ns), us(h->max_ns), us(hist_quantile(h, 0.5)), us(hist_quantile(h, 0.95)),
		us(hist_quantile(h, 0.99)), us(hist_quantile(h, 0.999)),
		(double)r->cnt[k].round_trips / n, (double)r->cnt[k].bytes_read / n,
		(double)r->cnt[k].bytes_written / n, (double)r->cnt[k].wrs / n,
		(double)r->cnt[k].atomics / n, (double)r->cnt[k].signaled / n,
		(unsigned long long)r->notfound[k],
		(unsigned long long)r->err[k]);
	for (int q = 1; q <= 100; q++) {
		double frac = q < 100 ? q / 100.0 : 0.999;

		fprintf(f, "%s[%.3f, %.3f]", q > 1 ? ", " : "", us(hist_quantile(h, frac)), frac);
	}
	fprintf(f, "]}");
	*first = 0;
}

/*
 * The runs as Prometheus text (for node_exporter's textfile collector, or a
 * push): each run's throughput, and hatchkv's library counters
 * (hatchkv_client_*, docs/metrics.md), labelled by system, workload and
 * transport.
 */
static int report_metrics(const char *path, const struct result *rs, int n)
{
	struct evbuffer *b = evbuffer_new();
	struct hkv_client_stats *hs = calloc((size_t)n + 1, sizeof(*hs));
	char (*lab)[128] = calloc((size_t)n + 1, sizeof(*lab));
	const char **labels = calloc((size_t)n + 1, sizeof(*labels));
	FILE *f = NULL;
	int m = 0, ret = -1;

	if (!b || !hs || !lab || !labels)
		goto out;
	for (int i = 0; i < n; i++)
		snprintf(lab[i], sizeof(lab[i]), "system=\"%s\",workload=\"%c\",transport=\"%s\"",
			 rs[i].system, rs[i].workload, rs[i].transport);
	hkv_metrics_family(b, "hatchkv_bench_throughput_ops_per_second", "gauge",
			   "A run's throughput (YCSB operations a second).");
	for (int i = 0; i < n; i++)
		hkv_metrics_sample_f(b, "hatchkv_bench_throughput_ops_per_second", lab[i],
				     rs[i].throughput);
	hkv_metrics_family(b, "hatchkv_bench_runtime_seconds", "gauge", "A run's duration.");
	for (int i = 0; i < n; i++)
		hkv_metrics_sample_f(b, "hatchkv_bench_runtime_seconds", lab[i],
				     rs[i].runtime_ms / 1e3);
	for (int i = 0; i < n; i++)
		if (rs[i].has_stats) {
			hs[m] = rs[i].stats;
			labels[m++] = lab[i];
		}
	if (m)
		hkv_metrics_client(b, hs, m, labels);
	f = fopen(path, "w");
	if (f && fwrite(evbuffer_pullup(b, -1), 1, evbuffer_get_length(b), f) ==
			 evbuffer_get_length(b))
		ret = 0;
	if (f && fclose(f))
		ret = -1;
	if (ret)
		fprintf(stderr, "hatchkv-bench: cannot write %s: %s\n", path, strerror(errno));
out:
	if (b)
		evbuffer_free(b);
	free(hs);
	free(lab);
	free(labels);
	return ret;
}

static int report_json(const char *path, const struct result *rs, int n, const struct opts *o)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "hatchkv-bench: cannot write %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(f, "[");
	for (int i = 0; i < n; i++) {
		const struct result *r = &rs[i];
		int first = 1;

		fprintf(f, "%s\n  {\"system\": \"%s\", \"workload\": \"%c\", \"transport\": \"%s\", "
			   "\"replicas\": %d, "
			   "\"threads\": %d, \"records\": %llu, \"record_bytes\": %zu, "
			   "\"runtime_ms\": %.1f, \"throughput_ops_per_sec\": %.1f, "
			   "\"server_cpu_percent\": %.3f,\n    \"ops\": {",
			i ? "," : "", r->system, r->workload, r->transport,
			r->replicas ? r->replicas
			: is_repl(r->system) ? atoi(r->system + 9) : is_hkv(r->system) ? 1 : 0,
			o->threads,
			(unsigned long long)o->records, o->fieldcount * o->fieldlength, r->runtime_ms,
			r->throughput, r->server_cpu);
		for (int k = 0; k < YOP_N; k++)
			json_op(f, r, k, &first);
		fprintf(f, "}");
		if (r->workload == 'T')
			fprintf(f, ",\n    \"trace\": {\"gets\": %llu, \"hit_ratio_percent\": %.2f, "
				   "\"deletes\": %llu, \"skipped\": %llu}",
				(unsigned long long)trace_gets(r),
				hit_ratio(r), (unsigned long long)r->deletes,
				(unsigned long long)r->skipped);
		fprintf(f, "}");
	}
	fprintf(f, "\n]\n");
	return fclose(f) ? -1 : 0;
}

/* ---- orchestration ------------------------------------------------------------ */

/* ---- several client processes -------------------------------------------------- */

static char *const *saved_argv;

/* This program's path, or with `sibling` the program of that name beside it. */
static int exe_path(char *buf, size_t cap, const char *sibling)
{
	ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
	char *slash;

	if (n <= 0)
		return -1;
	buf[n] = 0;
	if (!sibling)
		return 0;
	slash = strrchr(buf, '/');
	if (!slash || (size_t)(slash + 1 - buf) + strlen(sibling) >= cap)
		return -1;
	strcpy(slash + 1, sibling);
	return 0;
}

/* Start process `pidx` of a run phase: this program again, in child mode. */
static pid_t spawn_child(const struct opts *o, const char *system, char workload, int pidx,
			 const char *result_file, int ready_w, int go_r)
{
	char exe[4096], wl[2] = {workload, 0}, idx[16], gate[32], *args[64];
	int a = 0;
	pid_t pid;

	if (exe_path(exe, sizeof(exe), NULL))
		return -1;
	snprintf(idx, sizeof(idx), "%d", pidx);
	for (int i = 0; saved_argv[i] && a < 50; i++)
		args[a++] = saved_argv[i];
	args[a++] = "--system";
	args[a++] = (char *)system;
	args[a++] = "--workloads";
	args[a++] = wl;
	args[a++] = "--child-index";
	args[a++] = idx;
	args[a++] = "--child-result";
	args[a++] = (char *)result_file;
	snprintf(gate, sizeof(gate), "%d,%d", ready_w, go_r);
	args[a++] = "--child-gate";
	args[a++] = gate;
	args[a] = NULL;
	if (is_hkv(system) && system_uris(o, system)) { /* (a list for hatchkv-rN) */
		args[a++] = "--server";
		args[a++] = (char *)system_uris(o, system);
		args[a++] = "--token-file";
		args[a++] = (char *)o->token_file;
		args[a] = NULL;
	}
	if (o->memcached) {
		args[a++] = "--memcached";
		args[a++] = (char *)o->memcached;
		args[a] = NULL;
	}
	if (o->hkv_memcached) {
		args[a++] = "--hkv-memcached";
		args[a++] = (char *)o->hkv_memcached;
		args[a] = NULL;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		/* the gate's two ends stay open across exec; every other end,
		 * the go pipe's write end above all, closes */
		fcntl(ready_w, F_SETFD, 0);
		fcntl(go_r, F_SETFD, 0);
		execv(exe, args);
		_exit(127);
	}
	return pid;
}

/* Wait for a child's phase and fold its result into r. */
static int merge_child(pid_t pid, const char *file, struct result *r)
{
	static struct result cr;
	int status, ok;
	FILE *f;

	waitpid(pid, &status, 0);
	f = fopen(file, "rb");
	ok = f && fread(&cr, sizeof(cr), 1, f) == 1 && WIFEXITED(status) && !WEXITSTATUS(status);
	if (f)
		fclose(f);
	unlink(file);
	if (!ok)
		return -1;
	for (int k = 0; k < YOP_N; k++) {
		hist_merge(&r->h[k], &cr.h[k]);
		r->ok[k] += cr.ok[k];
		r->notfound[k] += cr.notfound[k];
		r->err[k] += cr.err[k];
		drv_counters_add(&r->cnt[k], &cr.cnt[k], &(struct drv_counters){0});
	}
	/* one clock for the host's processes: the run spans the first start
	 * to the last end */
	if (cr.start_ns < r->start_ns)
		r->start_ns = cr.start_ns;
	if (cr.end_ns > r->end_ns)
		r->end_ns = cr.end_ns;
	r->ops += cr.ops;
	r->deletes += cr.deletes;
	r->deletes_nf += cr.deletes_nf;
	r->skipped += cr.skipped;
	set_rate(r);
	return 0;
}

/* A run phase over o->processes processes (this one included). */
static int run_phase(const struct opts *o, const char *system, const struct ycsb_workload *w,
		     struct result *r, pid_t server_pid)
{
	pid_t kids[16];
	char files[16][64];
	int ready[2], go[2], ret;

	if (o->processes > 1) {
		if (pipe2(ready, O_CLOEXEC))
			return -1;
		if (pipe2(go, O_CLOEXEC)) {
			close(ready[0]);
			close(ready[1]);
			return -1;
		}
		gate_ready_r = ready[0];
		gate_go_w = go[1];
	}
	gate_kids = 0;
	for (int i = 1; i < o->processes; i++) {
		snprintf(files[i], sizeof(files[i]), "/tmp/hkvbench-%d-%d.res", (int)getpid(), i);
		kids[i] = spawn_child(o, system, w->name, i, files[i], ready[1], go[0]);
		gate_kids += kids[i] > 0;
	}
	if (o->processes > 1) {
		close(ready[1]); /* (a child that dies closes its copy: end of file) */
		close(go[0]);
	}
	ret = phase(o, system, w, r, server_pid);
	if (gate_go_w >= 0) { /* never passed the gate: the children abort */
		ssize_t n = write(gate_go_w, "x", 1);

		(void)n;
		close(gate_go_w);
		gate_go_w = -1;
	}
	if (gate_ready_r >= 0)
		close(gate_ready_r);
	gate_ready_r = -1;
	gate_kids = 0;
	for (int i = 1; i < o->processes; i++)
		if (kids[i] < 0 || merge_child(kids[i], files[i], r))
			ret = -1;
	return ret;
}

/* Child mode: one run phase, its result to a file for the parent. */
static int child_main(const struct opts *o)
{
	static struct result r;
	FILE *f;
	int ret;

	if (is_hkv(o->system) &&
	    !(hkv_cfg = driver_hatchkv_config(o->uri, o->token_file, o->records * 2, &o->etcd)))
		return 1;
	ret = phase(o, o->system, workload_of(o->workloads[0]), &r, 0);
	hkv_config_free(hkv_cfg);
	f = fopen(o->child_result, "wb");
	if (ret || !f || fwrite(&r, sizeof(r), 1, f) != 1) {
		if (f)
			fclose(f);
		return 1;
	}
	return fclose(f) ? 1 : 0;
}

static int run_system(const struct opts *o, const char *system, pid_t server_pid,
		      struct result *out, int *nout)
{
	struct result load;
	int ret = -1;

	if (is_hkv(system) &&
	    !(hkv_cfg = driver_hatchkv_config(system_uris(o, system), o->token_file, o->records * 2,
							&o->etcd)))
		return -1;
	if (replays(o)) { /* (it starts from an empty cache) */
		printf("== %s: a trace replayed by %d process(es) x %d threads (no load phase)\n",
		       system, o->processes, o->threads);
	} else {
		printf("== %s: loading %llu records of %zu bytes with %d threads; runs with %d "
		       "process(es) x %d threads\n", system, (unsigned long long)o->records,
		       o->fieldcount * o->fieldlength, o->threads, o->processes, o->threads);
		fflush(stdout);
		if (o->no_load)
			printf("   (not loaded: --no-load)\n");
		else if (phase(o, system, NULL, &load, server_pid))
			goto out;
		else
			printf("   loaded in %.0f ms (%.0f inserts/s)\n", load.runtime_ms,
			       load.throughput);
	}
	fflush(stdout);
	for (const char *p = o->workloads; *p; p++) {
		const struct ycsb_workload *w = workload_of(*p);
		struct result *r = &out[(*nout)++];

		if (run_phase(o, system, w, r, server_pid))
			goto out;
		report_text(r);
		fflush(stdout);
	}
	ret = 0;
out:
	hkv_config_free(hkv_cfg);
	hkv_cfg = NULL;
	return ret;
}

/* A text-protocol server just started as pid on 127.0.0.1:port: pid once it
 * answers (within 5 s), else -1. */
static pid_t wait_text_protocol(pid_t pid, const char *port)
{
	for (int i = 0; pid > 0 && i < 200; i++) {
		char hp[32];
		struct driver *d;

		snprintf(hp, sizeof(hp), "127.0.0.1:%s", port);
		usleep(25000);
		if ((d = driver_open_memcached(hp))) {
			d->ops->close(d);
			return pid;
		}
	}
	return -1;
}

static pid_t start_memcached(const char *port, int threads, uint64_t mb)
{
	char t[8], m[24];
	pid_t pid;

	snprintf(t, sizeof(t), "%d", threads);
	snprintf(m, sizeof(m), "%llu", (unsigned long long)(mb ? mb : 2048));
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the bench */
		execlp("memcached", "memcached", "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", m,
		       "-t", t, "-u", "root", (char *)NULL);
		_exit(127);
	}
	return wait_text_protocol(pid, port);
}

/* hatchkv-memcached (beside this program) in front of the server at uri. */
static pid_t start_hkv_memcached(const char *port, int threads, const char *uri,
				 const char *token_file)
{
	char exe[4096], t[8];
	pid_t pid;

	if (exe_path(exe, sizeof(exe), "hatchkv-memcached"))
		return -1;
	snprintf(t, sizeof(t), "%d", threads);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execl(exe, exe, "--server", uri, "--token-file", token_file, "-l", "127.0.0.1", "-p",
		      port, "-t", t, (char *)NULL);
		_exit(127);
	}
	return wait_text_protocol(pid, port);
}

static const struct result *find_result(const struct result *rs, int n, const char *sys, char w)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(rs[i].system, sys) && rs[i].workload == w)
			return &rs[i];
	return NULL;
}

static void compare_table(const struct result *rs, int n, const char *workloads, const char *sys)
{
	printf("\n== %s vs memcached (same workload, keys, values, client threads)\n",
	       !strcmp(sys, "hatchkv") ? "hatchkv (libhatchkv)"
				      : "hatchkv-memcached (memcached text protocol, libhatchkv behind)");
	printf("%-8s %14s %14s %8s %12s %12s %8s %10s %8s\n", "workload",
	       !strcmp(sys, "hatchkv") ? "hatchkv ops/s" : "hkv-mc ops/s", "memcached ops/s",
	       "ratio", "hkv GET p50", "mc GET p50", "ratio",
	       !strcmp(sys, "hatchkv") ? "hkv RT/GET" : "", /* the proxy's handles are not ours */
	       !strcmp(sys, "hatchkv") ? "srv CPU%" : "proxy CPU%");
	for (const char *p = workloads; *p; p++) {
		const struct result *h = find_result(rs, n, sys, *p);
		const struct result *m = find_result(rs, n, "memcached", *p);
		double hp50, mp50;

		if (!h || !m)
			continue;
		hp50 = us(hist_quantile(&h->h[YOP_READ], 0.5));
		mp50 = us(hist_quantile(&m->h[YOP_READ], 0.5));
		printf("%-8c %14.0f %14.0f %8.2f %10.2fus %10.2fus %8.3f ", *p, h->throughput,
		       m->throughput, h->throughput / m->throughput, hp50, mp50,
		       mp50 > 0 ? hp50 / mp50 : 0);
		if (!strcmp(sys, "hatchkv"))
			printf("%10.3f", h->h[YOP_READ].count ? (double)h->cnt[YOP_READ].round_trips /
									(double)h->h[YOP_READ].count
							      : 0);
		else
			printf("%10s", "");
		printf(" %8.2f\n", h->server_cpu);
		if (*p == 'T')
			printf("%-8s hit ratio %.2f %% (memcached %.2f %%), %llu gets each\n", "",
			       hit_ratio(h), hit_ratio(m),
			       (unsigned long long)trace_gets(h));
	}
}

/* Per-op round trips of kind k ("-": no such op). */
static void rt_cell(const struct result *r, int k)
{
	if (r && r->h[k].count)
		printf(" %10.2f", (double)r->cnt[k].round_trips / (double)r->h[k].count);
	else
		printf(" %10s", "-");
}

/* Median update latency ("-": no updates). */
static void p50_cell(const struct result *r)
{
	if (r->h[YOP_UPDATE].count)
		printf(" %10.2fus", us(hist_quantile(&r->h[YOP_UPDATE], 0.5)));
	else
		printf(" %12s", "-");
}

/* hatchkv r = 1 vs hatchkv-rN, per workload: throughput, round trips per
 * op of each kind (the transport's counters, summed over the replicas'
 * connections) and update latency. */
static void replicas_table(const struct result *rs, int n, const char *workloads, int replicas)
{
	static const int kinds[] = {YOP_READ, YOP_UPDATE, YOP_INSERT, YOP_RMW};
	static const char *const kname[] = {"read", "upd", "ins", "rmw"};
	char sys[24], col[32];

	snprintf(sys, sizeof(sys), "hatchkv-r%d", replicas);
	printf("\n== hatchkv r=1 vs %s (every write on all %d replicas; same workload, keys, "
	       "values, client threads; RT = round trips per op)\n", sys, replicas);
	snprintf(col, sizeof(col), "r=%d ops/s", replicas);
	printf("%-8s %12s %12s %7s", "workload", "r=1 ops/s", col, "ratio");
	for (int i = 0; i < 4; i++) {
		snprintf(col, sizeof(col), "RT%s r=1", kname[i]);
		printf(" %10s", col);
		snprintf(col, sizeof(col), "RT%s r=%d", kname[i], replicas);
		printf(" %10s", col);
	}
	snprintf(col, sizeof(col), "upd p50 r=%d", replicas);
	printf(" %12s %12s\n", "upd p50 r=1", col);
	for (const char *p = workloads; *p; p++) {
		const struct result *a = find_result(rs, n, "hatchkv", *p);
		const struct result *b = find_result(rs, n, sys, *p);

		if (!a || !b)
			continue;
		printf("%-8c %12.0f %12.0f %7.3f", *p, a->throughput, b->throughput,
		       a->throughput > 0 ? b->throughput / a->throughput : 0);
		for (int i = 0; i < 4; i++) {
			rt_cell(a, kinds[i]);
			rt_cell(b, kinds[i]);
		}
		p50_cell(a);
		p50_cell(b);
		printf("\n");
	}
}

/*
 * --replicas N: N more store-mode servers (same transport and memory as the
 * first), fresh, so they hold only what hatchkv-rN writes. Every one takes
 * the first server's token file (a replicated config has one token), so
 * readiness is waited for without a client (hkvserver_start would wait for a
 * token file of its own). Their URIs, comma-separated, go to uris.
 */
static int start_replicas(const struct opts *o, const struct hkvserver *first, const char *mem,
			  struct hkvserver *rsrv, char *uris, size_t cap)
{
	const char *extra[] = {"--token-file", first->token_file, NULL};
	size_t off = 0;

	uris[0] = 0;
	for (int i = 0; i < o->replicas; i++) {
		int ret = hkvserver_start_noclient(&rsrv[i], o->verbs, mem, "1M", extra);

		if (ret) {
			fprintf(stderr, "hatchkv-bench: cannot start replica server %d: %s\n", i,
				hkv_strerror(ret));
			for (int j = 0; j < i; j++)
				hkvserver_stop(&rsrv[j]);
			nrepl_pids = 0;
			return -1;
		}
		repl_pids[i] = rsrv[i].pid;
		nrepl_pids = i + 1;
		off += (size_t)snprintf(uris + off, cap - off, "%s%s", i ? "," : "", rsrv[i].uri);
	}
	return off < cap ? 0 : -1;
}

static int compare(struct opts *o)
{
	static struct result rs[32]; /* (workloads x 4 systems) */
	struct hkvserver srv, rsrv[3];
	static char repl_uris[1024];
	char repl_sys[24];
	char port[16];
	pid_t mc;
	int n = 0, ret;
	char mem[32];
	const char *cache_args[] = {"--cache", NULL}, *const *extra = o->cache ? cache_args : NULL;
	int trace_run = replays(o);

	snprintf(mem, sizeof(mem), "%lluM",
		 (unsigned long long)(o->memory_mb ? o->memory_mb
			: o->records * (o->fieldcount * o->fieldlength + 200) * 3 / 1000000 + 64));
	printf("== starting hatchkv-server (%s, %s%s) and memcached (loopback TCP, -m %s)\n",
	       o->verbs ? "verbs" : "shm", mem, o->cache ? ", cache mode" : "",
	       o->memory_mb ? mem : "2048M");
	if (hkvserver_start(&srv, o->verbs, mem, "1M", extra)) {
		fprintf(stderr, "hatchkv-bench: cannot start hatchkv-server\n");
		return 1;
	}
	snprintf(port, sizeof(port), "%d", 21000 + (int)(getpid() % 20000));
	if (o->replicas) {
		printf("== starting %d more hatchkv-servers (%s, %s, store mode) for hatchkv-r%d\n",
		       o->replicas, o->verbs ? "verbs" : "shm", mem, o->replicas);
		fflush(stdout);
		if (start_replicas(o, &srv, mem, rsrv, repl_uris, sizeof(repl_uris))) {
			hkvserver_stop(&srv);
			return 1;
		}
		o->repl_uris = repl_uris;
	}
	mc = start_memcached(port, o->threads, o->memory_mb);
	if (mc < 0) {
		fprintf(stderr, "hatchkv-bench: cannot start memcached (apt-get install memcached)\n");
		for (int i = 0; i < nrepl_pids; i++)
			hkvserver_stop(&rsrv[i]);
		hkvserver_stop(&srv);
		return 1;
	}
	o->uri = srv.uri;
	o->token_file = srv.token_file;
	static char hp[32];
	snprintf(hp, sizeof(hp), "127.0.0.1:%s", port);
	o->memcached = hp;
	snprintf(repl_sys, sizeof(repl_sys), "hatchkv-r%d", o->replicas);
	ret = run_system(o, "hatchkv", srv.pid, rs, &n);
	if (!ret && o->replicas)
		ret = run_system(o, repl_sys, repl_pids[0], rs, &n);
	if (!ret)
		ret = run_system(o, "memcached", mc, rs, &n);
	if (!ret && o->via_memcached) {
		static char hp2[32];
		pid_t hm;

		snprintf(port, sizeof(port), "%d", 21001 + (int)(getpid() % 20000));
		/* a trace starts from an empty cache: a fresh server, not the one
		 * hatchkv's run filled */
		if (trace_run && hkvserver_restart(&srv, mem, "1M", extra)) {
			fprintf(stderr, "hatchkv-bench: cannot restart hatchkv-server\n");
			ret = -1;
			goto stop;
		}
		hm = start_hkv_memcached(port, o->threads, srv.uri, srv.token_file);
		if (hm < 0) {
			fprintf(stderr, "hatchkv-bench: cannot start hatchkv-memcached\n");
			ret = -1;
		} else {
			snprintf(hp2, sizeof(hp2), "127.0.0.1:%s", port);
			o->hkv_memcached = hp2;
			ret = run_system(o, "hkv-memcached", hm, rs, &n);
			kill(hm, SIGTERM);
			waitpid(hm, NULL, 0);
		}
	}
stop:
	kill(mc, SIGTERM);
	waitpid(mc, NULL, 0);
	for (int i = 0; i < nrepl_pids; i++)
		hkvserver_stop(&rsrv[i]);
	hkvserver_stop(&srv);
	if (ret)
		return 1;
	compare_table(rs, n, o->workloads, "hatchkv");
	if (o->via_memcached)
		compare_table(rs, n, o->workloads, "hkv-memcached");
	if (o->replicas)
		replicas_table(rs, n, o->workloads, o->replicas);
	if (o->metrics_file && report_metrics(o->metrics_file, rs, n))
		return 1;
	return o->json && report_json(o->json, rs, n, o) ? 1 : 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hatchkv-bench [options]\n"
		"  --compare              start hatchkv-server and memcached, run both\n"
		"  --via-memcached        with --compare: also run hatchkv-memcached (the memcached\n"
		"                         text protocol in front of hatchkv) with memcached's driver\n"
		"  --hkv-memcached HOST:PORT  a running hatchkv-memcached (system hkv-memcached)\n"
		"  --replicas N           with --compare (N = 2 or 3): also start N more\n"
		"                         hatchkv-servers (fresh, store mode, same transport and\n"
		"                         memory) and run system hatchkv-rN, a replicated handle\n"
		"                         over them (first = primary, last = decider); then a\n"
		"                         table of r=1 vs r=N throughput and round trips per op\n"
		"  --quick                small sizes (finishes in well under 3 minutes)\n"
		"  -w, --workloads ABCDF  YCSB core workloads to run (E needs range scans: refused)\n"
		"  -s, --system hatchkv|memcached|hkv-memcached\n"
		"  --server URI           hatchkv server (shm:/path or verbs://host:port) or\n"
		"                         cluster (etcd://HOST:PORT/PREFIX); a comma-separated\n"
		"                         list of 2 or 3 store-mode servers (all with the one\n"
		"                         --token-file): replicated over them (hatchkv-rN)\n"
		"  --token-file PATH      hatchkv token file\n"
		"  --memcached HOST:PORT  memcached text protocol endpoint\n"
		"  --transport shm|verbs  for --compare (default: verbs if an RDMA device exists)\n"
		"  -r, --records N        records loaded (default 100000)\n"
		"  -n, --operations N     operations per workload (default 200000)\n"
		"  -d, --duration SECS    run each workload this long instead of -n\n"
		"  -t, --threads N        client threads per process (default 2)\n"
		"  -p, --processes N      client processes, each with --threads (default 1)\n"
		"  --batch N              operations in flight per thread: reads go out as\n"
		"                         one multi-get (default 1: one at a time)\n"
		"  --depth D              hatchkv: D operations in flight per thread (an\n"
		"                         hkv_pipe; each timed from submission to completion;\n"
		"                         other systems run one at a time)\n"
		"  --warmup N             unmeasured operations per thread first (default 1000)\n"
		"  --no-load              skip the load phase: the records are there already\n"
		"                         (reads of missing ones count as not_found)\n"
		"  --target OPS           aggregate target rate (default: as fast as possible)\n"
		"  --fieldcount N --fieldlength B   record shape (default 10 x 100)\n"
		"  --server-pid PID       report this process's CPU use as server_cpu_percent\n"
		"  --json FILE            write results as JSON\n"
		"  --metrics-file FILE    write the runs' throughput and hatchkv's library\n"
		"                         counters as Prometheus text (docs/metrics.md)\n"
		"workload T, a request trace replayed (instead of A-F; no load phase):\n"
		"  --trace FILE           CSV timestamp,key,key_size,value_size,client_id,op,ttl\n"
		"                         (the public Twitter cache traces' layout)\n"
		"  --family zipf|scan|shift|loop  a synthetic family over --records keys,\n"
		"                         --operations requests (hatchkv-hitratio's, request\n"
		"                         for request): --seed S (42) --value B (1000)\n"
		"                         --value-max B (sizes log-uniform) --loop-keys N\n"
		"                         (default 1.1x the items --memory holds, else keys/10)\n"
		"  a get is look-aside (a miss sets the value); request i goes to worker\n"
		"  i mod (threads x processes); the report adds the hit ratio\n"
		"  --cache                with --compare: hatchkv-server in cache mode\n"
		"  --memory MB            with --compare: hatchkv-server --memory MB and\n"
		"                         memcached -m MB (default: sized to the records)\n"
		HKV_CONFIG_USAGE
		"a cluster's etcd (the client role's user over TLS, or --etcd-insecure):\n"
		HKV_ETCD_USAGE);
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"compare", no_argument, NULL, 'C'},      {"quick", no_argument, NULL, 'Q'},
		{"workloads", required_argument, NULL, 'w'}, {"system", required_argument, NULL, 's'},
		{"server", required_argument, NULL, 'S'}, {"token-file", required_argument, NULL, 'k'},
		{"memcached", required_argument, NULL, 'm'}, {"transport", required_argument, NULL, 'T'},
		{"records", required_argument, NULL, 'r'}, {"operations", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'd'}, {"threads", required_argument, NULL, 't'},
		{"warmup", required_argument, NULL, 'W'}, {"target", required_argument, NULL, 'R'},
		{"fieldcount", required_argument, NULL, 'F'}, {"fieldlength", required_argument, NULL, 'L'},
		{"server-pid", required_argument, NULL, 'P'}, {"json", required_argument, NULL, 'j'},
		{"processes", required_argument, NULL, 'p'},
		{"batch", required_argument, NULL, 'B'},
		{"depth", required_argument, NULL, 'D'},
		{"no-load", no_argument, NULL, 'N'},
		{"via-memcached", no_argument, NULL, 'V'},
		{"replicas", required_argument, NULL, 'e'},
		{"hkv-memcached", required_argument, NULL, 'H'},
		{"child-index", required_argument, NULL, 'I'},
		{"child-result", required_argument, NULL, 'O'},
		{"child-gate", required_argument, NULL, 'G'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 258},
		{"metrics-file", required_argument, NULL, 'M'},
		{"trace", required_argument, NULL, 259},
		{"family", required_argument, NULL, 260},
		{"seed", required_argument, NULL, 261},
		{"value", required_argument, NULL, 262},
		{"value-max", required_argument, NULL, 263},
		{"loop-keys", required_argument, NULL, 264},
		{"cache", no_argument, NULL, 265},
		{"memory", required_argument, NULL, 266}, HKV_ETCD_LONGOPTS,
		{NULL, 0, NULL, 0}};
	int c;

	if (hkv_cli_config(&argc, &argv, lo, "hatchkv-bench"))
		return -1;
	while ((c = getopt_long(argc, argv, "w:s:r:n:d:t:p:h", lo, NULL)) != -1) {
		switch (c) {
		case 258: hkv_print_version(stdout, "hatchkv-bench"); exit(0);
		case 'C': o->compare = 1; break;
		case 'Q': o->quick = 1; break;
		case 'w': o->workloads = optarg; break;
		case 's': o->system = optarg; break;
		case 'S': o->uri = optarg; break;
		case 'k': o->token_file = optarg; break;
		case 'm': o->memcached = optarg; break;
		case 'T': o->verbs = hkv_transport_parse(optarg) == HKV_TRANSPORT_VERBS; break;
		case 'r': o->records = strtoull(optarg, NULL, 10); break;
		case 'n': o->operations = strtoull(optarg, NULL, 10); break;
		case 'd': o->duration = atof(optarg); break;
		case 't': o->threads = atoi(optarg); break;
		case 'W': o->warmup = strtoull(optarg, NULL, 10); break;
		case 'R': o->target = atof(optarg); break;
		case 'F': o->fieldcount = strtoul(optarg, NULL, 10); break;
		case 'L': o->fieldlength = strtoul(optarg, NULL, 10); break;
		case 'P': o->server_pid = atoi(optarg); break;
		case 'j': o->json = optarg; break;
		case 'M': o->metrics_file = optarg; break;
		case 'p': o->processes = atoi(optarg); break;
		case 'B': o->batch = atoi(optarg); break;
		case 'D': o->depth = atoi(optarg); break;
		case 'N': o->no_load = 1; break;
		case 'V': o->via_memcached = 1; break;
		case 'e': o->replicas = atoi(optarg); break;
		case 'H': o->hkv_memcached = optarg; break;
		case 'I': o->pidx = atoi(optarg); break;
		case 'O': o->child_result = optarg; break;
		case 'G':
			if (sscanf(optarg, "%d,%d", &o->gate_ready, &o->gate_go) != 2)
				return -1;
			break;
		case 259: o->trace_file = optarg; break;
		case 260:
			if ((o->family = hkv_trace_family_parse(optarg)) < 0) {
				fprintf(stderr, "hatchkv-bench: unknown family '%s' (zipf, scan, "
						"shift or loop)\n", optarg);
				return -1;
			}
			break;
		case 261: o->f.seed = strtoull(optarg, NULL, 10); break;
		case 262: o->f.value = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 263: o->f.value_max = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 264: o->f.loop_keys = strtoull(optarg, NULL, 10); break;
		case 265: o->cache = 1; break;
		case 266: o->memory_mb = strtoull(optarg, NULL, 10); break;
		case 'h': usage(stdout); exit(0);
		default:
			if (hkv_etcd_sec_opt(&o->etcd, c, optarg) > 0)
				break;
			usage(stderr);
			return -1;
		}
	}
	if (o->quick) {
		o->records = 20000;
		o->operations = 40000;
	}
	if (o->trace_file && o->family >= 0) {
		fprintf(stderr, "hatchkv-bench: --trace or --family, not both\n");
		return -1;
	}
	if (o->f.value > TRACE_VALUE_MAX || (o->f.value_max && o->f.value_max < o->f.value) ||
	    o->f.value_max > TRACE_VALUE_MAX) {
		fprintf(stderr, "hatchkv-bench: --value/--value-max: 1..%u bytes, max >= min\n",
			TRACE_VALUE_MAX);
		return -1;
	}
	if (replays(o)) {
		if (o->batch > 1 || o->depth > 1 || o->replicas) {
			fprintf(stderr, "hatchkv-bench: a trace replays one request at a time "
					"(no --batch, --depth or --replicas)\n");
			return -1;
		}
		o->workloads = "T";
	}
	for (const char *p = o->workloads; *p; p++) {
		if (*p == 'T' && replays(o))
			continue;
		if (*p == 'E' || *p == 'e') {
			fprintf(stderr, "hatchkv-bench: workload E needs range scans, which a hash "
					"index cannot serve; run A, B, C, D or F\n");
			return -1;
		}
		if (!ycsb_workload(*p)) {
			fprintf(stderr, "hatchkv-bench: unknown workload '%c'\n", *p);
			return -1;
		}
	}
	if (o->replicas && (o->replicas < 2 || o->replicas > 3)) {
		fprintf(stderr, "hatchkv-bench: --replicas takes 2 or 3\n");
		return -1;
	}
	/* a server list (not in a child: its --system names it already) */
	if (!o->compare && !o->child_result && !strcmp(o->system, "hatchkv") && o->uri &&
	    strchr(o->uri, ',')) {
		static char name[24];
		int nr = driver_hatchkv_replicas(o->uri);

		if (nr < 2 || nr > 3 || (o->replicas && o->replicas != nr)) {
			fprintf(stderr, "hatchkv-bench: --server lists %d servers; replication takes "
					"2 or 3%s\n", nr, o->replicas ? " (and --replicas as many)" : "");
			return -1;
		}
		snprintf(name, sizeof(name), "hatchkv-r%d", nr);
		o->system = name;
	}
	if (o->batch < 0 || o->batch > MAX_BATCH || o->depth < 0 || o->depth > MAX_DEPTH ||
	    (o->depth > 1 && o->batch > 1) || o->processes < 1 || o->processes > 16 || o->threads < 1 || o->threads > MAX_THREADS ||
	    !o->records || !o->fieldcount ||
	    !o->fieldlength || (!o->compare && is_hkv(o->system) &&
				(!o->uri || !o->token_file)) ||
	    (!o->compare && !strcmp(o->system, "memcached") && !o->memcached) ||
	    (!o->compare && !strcmp(o->system, "hkv-memcached") && !o->hkv_memcached)) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Workload T's trace into `trace` (every process of a run makes the same). */
static int load_trace(struct opts *o)
{
	struct hkv_trace_family *f = &o->f;
	char err[256];

	if (o->trace_file) {
		if (hkv_trace_load_csv(&trace, o->trace_file, err, sizeof(err)))
			return fprintf(stderr, "hatchkv-bench: %s\n", err), -1;
	} else {
		f->kind = (enum hkv_trace_family_kind)o->family;
		f->keys = o->records;
		f->requests = o->operations;
		hkv_trace_family_defaults(f);
		if (f->kind == HKV_FAMILY_LOOP && !f->loop_keys) /* (as hatchkv-hitratio's) */
			f->loop_keys = o->memory_mb ? hkv_trace_loop_keys_for(f, o->memory_mb << 20,
									      HKV_SIM_ITEM_OVERHEAD)
						    : f->keys / 10 + 1;
		if (hkv_trace_generate(&trace, f))
			return fprintf(stderr, "hatchkv-bench: cannot generate the %s family: %s\n",
				       hkv_trace_family_name(f->kind), strerror(errno)), -1;
	}
	if (!trace.n)
		return fprintf(stderr, "hatchkv-bench: the trace has no requests\n"), -1;
	trace_vmax = 1;
	for (uint64_t i = 0; i < trace.n; i++)
		if (trace.req[i].value_size > trace_vmax && trace.req[i].value_size <= TRACE_VALUE_MAX)
			trace_vmax = trace.req[i].value_size;
	if (!o->child_result)
		printf("== trace: %s, %llu requests over %u keys, values up to %u B\n",
		       o->trace_file ? o->trace_file : hkv_trace_family_name(f->kind),
		       (unsigned long long)trace.n, trace.nkeys, trace_vmax);
	return 0;
}

static void on_sigint(int sig)
{
	stop_requested = 1;
}

int main(int argc, char **argv)
{
	static struct result rs[8];
	struct opts o = {.workloads = "ABCFD", .records = 100000, .operations = 200000,
			 .threads = 2, .fieldcount = 10, .fieldlength = 100, .system = "hatchkv",
			 .warmup = 1000, .processes = 1, .gate_ready = -1, .gate_go = -1,
			 .family = -1, .f = {.seed = 42}};
	int n = 0;

	hkv_log_set_prog("hatchkv-bench");
	o.verbs = hkv_verbs_available();
	signal(SIGINT, on_sigint);
	signal(SIGTERM, on_sigint);
	signal(SIGPIPE, SIG_IGN);
	saved_argv = argv;
	if (parse(argc, argv, &o))
		return 2;
	if (replays(&o) && load_trace(&o))
		return 1;
	if (o.child_result)
		return child_main(&o);
	if (o.compare)
		return compare(&o);
	if (run_system(&o, o.system, o.server_pid, rs, &n))
		return 1;
	if (o.metrics_file && report_metrics(o.metrics_file, rs, n))
		return 1;
	return o.json && report_json(o.json, rs, n, &o) ? 1 : 0;
}
