/*
 * mc_server.c - hatchkv-memcached: threads, connections and one process_*
 * function per memcached command (see mc_server.h).
 */
#include "client/memcached/mc_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <event2/util.h>

#include "client/memcached/mc_metrics.h"
#include "client/memcached/mc_proto.h"
#include "common/cli.h"
#include "common/fdlimit.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "hatchkv.h"

#define MC_BATCH 64                   /* requests per read callback */
#define MC_OUT_HIGH (4u << 20)        /* pause reading above this much output; a
				       * multi-get stops there and goes on once it drained */
#define MC_COUNT_EVERY 5              /* stats walks the index at most every 5 s */
#define MC_CAS_RETRIES 64             /* incr/decr read-modify-write attempts */
#define MC_REL_EXPTIME_MAX (60 * 60 * 24 * 30)

struct mc_server;
struct conn;

/* A value buffer and a multi-get's: the worker's (depth 1) or a lane's. */
struct bufs {
	char *vbuf;                 /* one value (max_value + 1 bytes) */
	char *mbuf;                 /* a multi-get's values: MC_MGET_BUF bytes */
};

struct worker {
	struct mc_server *srv;
	int id;
	pthread_t thread;
	struct event_base *base;
	struct event *notify;       /* new connections queued */
	pthread_mutex_t lock;       /* guards queue and snap */
	int *queue;                 /* fds handed over by the accept thread */
	size_t nqueue, qcap;
	struct conn *conns;         /* this worker's connections (list) */
	struct hkv_client *hkv;     /* NULL after a lost server, until reopened */
	struct bufs own;            /* depth 1: requests run on hkv with these */
	size_t vcap;
	/* depth > 1: connections' passes run as pipe calls, each on a lane (its
	 * own handle, and lane_bufs[lane]); pump drives the pipe */
	struct hkv_pipe *pipe;
	struct bufs *lane_bufs;
	struct event *pump;
	struct conn *wait_head, *wait_tail; /* passes the pipe had no room for */
	int pipe_peak;              /* published hkv_pipe_peak() (stats: relaxed) */
	struct event *flush_ev;     /* this worker's delayed flush_all (see process_flush) */
	uint64_t flush_gen;         /* the pending flush it was armed for */
	struct mc_counters ctr;
	struct hkv_client_stats snap;   /* published copy of the handle's counters */
	struct hkv_client_stats closed; /* handles closed before */
};

struct mc_server {
	struct mc_options o;
	struct hkv_config *cfg;
	struct event_base *base;    /* accept thread */
	struct evconnlistener *lis;
	struct event *resume; /* accepting again after an accept error */
	struct hkv_metrics *metrics; /* --metrics, on the accept thread's loop */
	struct worker *workers;
	int nworkers;
	unsigned next;              /* round-robin */
	time_t started;
	uint32_t max_value;
	uint64_t curr_conns, total_conns, rejected_conns;
	uint64_t flush_seq, flush_pending; /* the one pending delayed flush_all (0: none) */
	pthread_mutex_t count_lock;        /* the last walk of the index (stats) */
	pthread_mutex_t walk_lock;         /* held by the one walking it */
	time_t counted_at;
	uint64_t items, bytes, walks;
	/* --metrics: a thread of its own walks the index every MC_COUNT_BG s,
	 * so the items gauge is current without a `stats` (issue 30) */
	pthread_t counter;
	struct hkv_client *counter_h; /* its handle, opened before we listen */
	int counter_started, counter_stop; /* counter_stop under count_lock */
	pthread_cond_t counter_wake;
	char **opt_values; /* the options as last read (hkv_cli_values; SIGHUP) */
};

struct conn {
	struct worker *w;
	struct bufferevent *bev;
	struct event *resume;       /* continue after a full batch */
	struct evbuffer *stage;     /* replies of this pass, written straight to the socket */
	struct conn *prev, *next;
	size_t swallow;             /* bytes of a refused data block still to drop */
	size_t need;                /* input length at which parsing can progress */
	size_t get_pos;             /* a multi-get stopped at the output bound: keys done */
	int closing, paused;
	int eof;                    /* peer finished sending: close when answered */
	/* depth > 1: a pass of this connection as a pipe call (keyed by the
	 * connection, so its passes run one after another) */
	struct hkv_pipe_op op;
	int busy;                   /* submitted, not yet handed back by the pipe */
	int again;                  /* an event came while busy: another pass after */
	int dead;                   /* freed while busy: free once handed back */
	int waiting;                /* on the worker's wait list */
	struct conn *wait_next;
	int lane;                   /* the lane running its pass (-1: none) */
	struct hkv_client *lane_h;  /* and its handle */
	struct conn *self;          /* its own address: the bytes of its pipe key */
};

/* What a process_* function works with. */
struct ctx {
	struct worker *w;
	struct conn *c;
	struct evbuffer *out;
	const struct mc_req *r;
	struct hkv_client *lane_h;  /* in a pipe call: the lane's handle (else NULL) */
	struct bufs *b;             /* value buffers to use */
};

static volatile sig_atomic_t stopping;

static uint32_t region_now(const struct ctx *x);

static void count(uint64_t *ctr, uint64_t n)
{
	__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

static uint64_t load(const uint64_t *v)
{
	return __atomic_load_n(v, __ATOMIC_RELAXED);
}

/* ---- replies -------------------------------------------------------------- */

static void reply(struct ctx *x, const char *line)
{
	if (!x->r->noreply)
		evbuffer_add_printf(x->out, "%s\r\n", line);
}

/* Errors of meta commands are never suppressed by 'q'. */
static void reply_error(struct ctx *x, const char *line)
{
	count(line[0] == 'C' ? &x->w->ctr.err_client
			     : line[0] == 'S' ? &x->w->ctr.err_server : &x->w->ctr.err_error, 1);
	if (!x->r->noreply || x->r->cmd >= MC_CMD_MG)
		evbuffer_add_printf(x->out, "%s\r\n", line);
}

static void reply_hkv_error(struct ctx *x, int rc)
{
	char line[160];

	switch (rc) {
	case HKV_ETOOBIG: reply_error(x, "SERVER_ERROR object too large for cache"); return;
	case HKV_EFULL: reply_error(x, "SERVER_ERROR out of memory storing object"); return;
	case HKV_ENOTNUM:
		reply_error(x, "CLIENT_ERROR cannot increment or decrement non-numeric value");
		return;
	default: break;
	}
	snprintf(line, sizeof(line), "SERVER_ERROR %s", hkv_strerror(rc));
	reply_error(x, line);
}

/* ---- the worker's handle -------------------------------------------------- */

static void stats_add(struct hkv_client_stats *a, const struct hkv_client_stats *b)
{
	uint64_t *pa = (uint64_t *)a;
	const uint64_t *pb = (const uint64_t *)b;

	for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++)
		pa[i] += pb[i];
}

static void publish_stats(struct worker *w)
{
	struct hkv_client_stats st = {0}, lanes;

	if (w->hkv)
		hkv_client_stats(w->hkv, &st);
	if (w->pipe) {
		hkv_pipe_stats(w->pipe, &lanes);
		stats_add(&st, &lanes);
		__atomic_store_n(&w->pipe_peak, hkv_pipe_peak(w->pipe), __ATOMIC_RELAXED);
	}
	pthread_mutex_lock(&w->lock);
	w->snap = st;
	pthread_mutex_unlock(&w->lock);
}

static int open_handle(struct worker *w)
{
	int rc = hkv_open(w->srv->cfg, &w->hkv);

	if (rc) {
		w->hkv = NULL;
		hkv_warn("worker %d: cannot open a hatchkv handle to %s: %s", w->id,
			 w->srv->o.server_uri, hkv_strerror(rc));
	}
	return rc;
}

/* The handle, reopened if it was lost; NULL after replying the error. */
static struct hkv_client *handle(struct ctx *x)
{
	int rc;

	if (x->lane_h)
		return x->lane_h;
	if (x->w->hkv)
		return x->w->hkv;
	rc = open_handle(x->w);
	if (rc) {
		reply_hkv_error(x, rc);
		return NULL;
	}
	hkv_info("worker %d: reconnected to %s", x->w->id, x->w->srv->o.server_uri);
	return x->w->hkv;
}

/* Pass a library result through; a lost server drops the handle. */
static int checked(struct ctx *x, int rc)
{
	struct worker *w = x->w;

	if (x->lane_h) { /* a lane's handle reconnects itself at its next operation */
		if (rc == HKV_EDISCONNECTED || rc == HKV_ETIMEDOUT)
			count(&w->ctr.hkv_errors, 1);
		return rc;
	}
	if ((rc != HKV_EDISCONNECTED && rc != HKV_ETIMEDOUT) || !w->hkv)
		return rc;
	hkv_warn("worker %d: hatchkv server lost (%s); will reconnect", w->id, hkv_strerror(rc));
	count(&w->ctr.hkv_errors, 1);
	pthread_mutex_lock(&w->lock);
	hkv_client_stats(w->hkv, &w->snap);
	stats_add(&w->closed, &w->snap);
	memset(&w->snap, 0, sizeof(w->snap));
	pthread_mutex_unlock(&w->lock);
	hkv_close(w->hkv);
	w->hkv = NULL;
	return rc;
}

/* ---- retrieval ------------------------------------------------------------ */

static int get_one(struct ctx *x, struct hkv_client *h, const char *key, size_t klen,
		   size_t *vlen, struct hkv_item_info *info)
{
	int rc = checked(x, hkv_get(h, key, klen, x->b->vbuf, x->w->vcap, vlen, info));

	return rc == -ENOSPC ? HKV_ETOOBIG : rc;
}

static void add_value(struct evbuffer *b, const char *key, size_t klen, const char *v,
		      size_t vlen, const struct hkv_item_info *info, int with_cas)
{
	evbuffer_add_printf(b, "VALUE %.*s %" PRIu32 " %zu", (int)klen, key, info->flags, vlen);
	if (with_cas)
		evbuffer_add_printf(b, " %" PRIu64, info->version);
	evbuffer_add(b, "\r\n", 2);
	evbuffer_add(b, v, vlen);
	evbuffer_add(b, "\r\n", 2);
}

/* Output this connection holds: the pass's replies and what the socket has
 * not taken yet. */
static size_t conn_output(const struct ctx *x)
{
	return evbuffer_get_length(x->out) +
	       evbuffer_get_length(bufferevent_get_output(x->c->bev));
}

/*
 * get/gets/gat/gats. Values are added to the output as they are read; once
 * the connection holds MC_OUT_HIGH bytes of output the get stops (the keys
 * done are remembered in get_pos, the request stays in the input) and goes on
 * when the peer has read most of it: a line naming thousands of big items
 * never holds more than a few MiB here. As memcached does, values already
 * written stay written if a later key fails.
 */
/*
 * get/gets of several keys: MC_MGET_KEYS at a time through hkv_mget (one
 * round trip for keys whose location the handle knows, two for the others,
 * instead of one or two per key). The batch shares MC_MGET_BUF bytes (4 KiB
 * a key at 64 keys, 2 KiB at 128); a value larger than its share is read
 * again alone. Keys in order; the same output and counters as one by one.
 */
#define MC_MGET_KEYS 128
#define MC_MGET_BUF  (256u << 10)

static void process_get_many(struct ctx *x, struct hkv_client *h, const char *p, const char *end)
{
	const struct mc_req *r = x->r;
	int with_cas = r->cmd == MC_CMD_GETS;
	struct hkv_mget_item it[MC_MGET_KEYS];
	const char *after[MC_MGET_KEYS];
	struct worker *w = x->w;

	while (p < end) {
		int n = 0, rc = 0;
		const char *key;
		size_t klen, share;

		while (n < MC_MGET_KEYS && mc_key_next(&p, end, &key, &klen)) {
			it[n].key = key;
			it[n].klen = klen;
			after[n++] = p;
		}
		if (!n)
			break;
		share = MC_MGET_BUF / (size_t)n & ~(size_t)63;
		for (int i = 0; i < n; i++) {
			it[i].buf = x->b->mbuf + (size_t)i * share;
			it[i].cap = share;
		}
		rc = checked(x, hkv_mget(h, it, (size_t)n));
		for (int i = 0; i < n && !rc; i++) {
			const char *v = it[i].buf;
			size_t vlen = it[i].vlen;

			rc = it[i].status;
			if (rc == -ENOSPC) { /* bigger than a multi-get slot: alone */
				rc = get_one(x, h, it[i].key, it[i].klen, &vlen, &it[i].info);
				v = x->b->vbuf;
			} else {
				rc = checked(x, rc);
			}
			count(&w->ctr.cmd_get, 1);
			if (rc == HKV_ENOTFOUND) {
				count(&w->ctr.get_misses, 1);
				rc = 0;
				continue;
			}
			if (rc)
				break;
			count(&w->ctr.get_hits, 1);
			add_value(x->out, it[i].key, it[i].klen, v, vlen, &it[i].info, with_cas);
			if (conn_output(x) > MC_OUT_HIGH && after[i] < end) {
				x->c->get_pos = (size_t)(after[i] - r->keys); /* more when it drained */
				return;
			}
		}
		if (rc) {
			reply_hkv_error(x, rc);
			return;
		}
	}
	evbuffer_add(x->out, "END\r\n", 5);
}

static void process_get(struct ctx *x)
{
	const struct mc_req *r = x->r;
	int touch = r->cmd == MC_CMD_GAT || r->cmd == MC_CMD_GATS;
	int with_cas = r->cmd == MC_CMD_GETS || r->cmd == MC_CMD_GATS;
	const char *p = r->keys + x->c->get_pos, *end = r->keys + r->keys_len, *key;
	struct hkv_client *h = handle(x);
	struct worker *w = x->w;
	size_t klen;

	x->c->get_pos = 0;
	if (!h)
		return;
	if (!touch && x->b->mbuf) {
		const char *q = p, *k2;
		size_t l2;

		if (mc_key_next(&q, end, &k2, &l2) && mc_key_next(&q, end, &k2, &l2)) {
			process_get_many(x, h, p, end); /* two keys or more */
			return;
		}
	}
	while (mc_key_next(&p, end, &key, &klen)) {
		struct hkv_item_info info;
		const void *v = x->b->vbuf;
		size_t vlen;
		int rc;

		/* a get copies the value once, from where its READ landed (a view:
		 * taken before the handle does anything else); a gat's touch comes
		 * between, so it reads into vbuf */
		if (touch)
			rc = get_one(x, h, key, klen, &vlen, &info);
		else
			rc = checked(x, hkv_get_view(h, key, klen, &v, &vlen, &info));
		/* memcached fetches, then sets the new TTL (a gat -1 still returns it) */
		if (!rc && touch)
			rc = checked(x, hkv_touch(h, key, klen, r->exptime));
		count(touch ? &w->ctr.cmd_touch : &w->ctr.cmd_get, 1);
		if (rc == HKV_ENOTFOUND) {
			count(touch ? &w->ctr.touch_misses : &w->ctr.get_misses, 1);
			continue;
		}
		if (rc) {
			reply_hkv_error(x, rc);
			return;
		}
		count(touch ? &w->ctr.touch_hits : &w->ctr.get_hits, 1);
		add_value(x->out, key, klen, v, vlen, &info, with_cas);
		if (conn_output(x) > MC_OUT_HIGH && p < end) {
			x->c->get_pos = (size_t)(p - r->keys); /* more when it drained */
			return;
		}
	}
	evbuffer_add(x->out, "END\r\n", 5);
}

/* ---- storage -------------------------------------------------------------- */

static int store(struct ctx *x, struct hkv_client *h)
{
	const struct mc_req *r = x->r;
	struct hkv_write_opts o = {.flags = r->flags, .exptime = r->exptime};

	if (r->dlen > x->w->srv->max_value)
		return HKV_ETOOBIG;
	switch (r->cmd) {
	case MC_CMD_SET: return hkv_set(h, r->key, r->klen, r->data, r->dlen, &o);
	case MC_CMD_ADD: return hkv_add(h, r->key, r->klen, r->data, r->dlen, &o);
	case MC_CMD_REPLACE: return hkv_replace(h, r->key, r->klen, r->data, r->dlen, &o);
	case MC_CMD_APPEND: return hkv_append(h, r->key, r->klen, r->data, r->dlen, 0);
	case MC_CMD_PREPEND: return hkv_append(h, r->key, r->klen, r->data, r->dlen, 1);
	case MC_CMD_CAS: return hkv_cas(h, r->key, r->klen, r->data, r->dlen, r->cas, &o);
	default: return -EINVAL;
	}
}

/*
 * A set refused as too big drops the old value, as memcached's does: a
 * client that set a new value never reads the old one back. Refused here
 * (over -I: process_too_large) or by the server (over the region's
 * largest class: a small region's segment, under -I).
 */
static void drop_refused(struct ctx *x, struct hkv_client *h)
{
	int rc = checked(x, hkv_delete(h, x->r->key, x->r->klen));

	if (rc && rc != HKV_ENOTFOUND)
		hkv_debug("a refused set's old value stays: %s", hkv_strerror(rc));
}

static void process_store(struct ctx *x)
{
	struct hkv_client *h = handle(x);
	int rc, is_cas = x->r->cmd == MC_CMD_CAS;

	if (!h)
		return;
	count(&x->w->ctr.cmd_set, 1);
	rc = checked(x, store(x, h));
	if (is_cas)
		count(rc == 0 ? &x->w->ctr.cas_hits : rc == HKV_EVERSION ? &x->w->ctr.cas_badval
			      : &x->w->ctr.cas_misses, 1);
	if (rc == HKV_ETOOBIG && x->r->cmd == MC_CMD_SET)
		drop_refused(x, h);
	switch (rc) {
	case 0: reply(x, "STORED"); break;
	case HKV_EEXISTS: reply(x, "NOT_STORED"); break;
	case HKV_ENOTFOUND: reply(x, is_cas ? "NOT_FOUND" : "NOT_STORED"); break;
	case HKV_EVERSION: reply(x, "EXISTS"); break;
	default: reply_hkv_error(x, rc); break;
	}
}

/*
 * memcached drops the old value when a set's new one is refused as too big;
 * for ms it does so in every mode (append, add, ... too: 1.6.18's mset
 * unlinks without looking at the mode).
 */
static void process_too_large(struct ctx *x)
{
	const struct mc_req *r = x->r;
	int is_set = r->cmd == MC_CMD_SET || r->cmd == MC_CMD_MS;
	struct hkv_client *h;

	if (is_set && (h = handle(x)) != NULL)
		drop_refused(x, h);
	reply_error(x, mc_strerror(r->err));
}

/* ---- incr / decr: read, compute, compare-and-swap ------------------------- */

struct arith {
	uint64_t delta;
	int decr;
	int has_cas;           /* only if the item's version is `cas` */
	uint64_t cas;
	int has_ttl;           /* new exptime instead of the item's */
	int64_t ttl;
	uint64_t result;       /* out: the new number */
	struct hkv_item_info info; /* out: the item as read (flags, exptime) */
};

/*
 * Exactly memcached's arithmetic: the number is read like strtoull; a result
 * shorter than the stored value is padded with spaces to the old length
 * (memcached rewrites such an item in place), a longer one grows the value.
 */
static int arith_once(struct ctx *x, struct hkv_client *h, const char *key, size_t klen,
		      struct arith *a)
{
	struct hkv_write_opts o;
	char digits[24], *v = x->b->vbuf;
	size_t vlen, n;
	uint64_t cur;
	int rc = get_one(x, h, key, klen, &vlen, &a->info);

	if (rc)
		return rc;
	if (a->has_cas && a->info.version != a->cas)
		return HKV_EVERSION;
	v[vlen] = '\0';
	if (!mc_value_number(v, vlen, &cur))
		return HKV_ENOTNUM;
	a->result = a->decr ? (a->delta > cur ? 0 : cur - a->delta) : cur + a->delta;
	n = (size_t)snprintf(digits, sizeof(digits), "%" PRIu64, a->result);
	if (n < vlen)
		memset(v + n, ' ', vlen - n);
	memcpy(v, digits, n);
	o.flags = a->info.flags;
	o.exptime = a->has_ttl ? a->ttl : a->info.exptime;
	return checked(x, hkv_cas(h, key, klen, v, n < vlen ? vlen : n, a->info.version, &o));
}

static int arith(struct ctx *x, struct hkv_client *h, const char *key, size_t klen,
		 struct arith *a)
{
	for (int i = 0; i < MC_CAS_RETRIES; i++) {
		int rc = arith_once(x, h, key, klen, a);

		if (rc != HKV_EVERSION || a->has_cas)
			return rc;
	}
	return HKV_EAGAIN;
}

static void process_arith(struct ctx *x)
{
	const struct mc_req *r = x->r;
	struct arith a = {.delta = r->delta, .decr = r->cmd == MC_CMD_DECR};
	struct hkv_client *h = handle(x);
	char num[24];
	int rc;

	if (!h)
		return;
	rc = arith(x, h, r->key, r->klen, &a);
	if (rc == 0 || rc == HKV_ENOTFOUND)
		count(a.decr ? (rc ? &x->w->ctr.decr_misses : &x->w->ctr.decr_hits)
			     : (rc ? &x->w->ctr.incr_misses : &x->w->ctr.incr_hits), 1);
	if (rc == HKV_ENOTFOUND)
		return reply(x, "NOT_FOUND");
	if (rc)
		return reply_hkv_error(x, rc);
	snprintf(num, sizeof(num), "%" PRIu64, a.result);
	reply(x, num);
}

/* ---- delete, touch, flush_all, small commands ----------------------------- */

static void process_delete(struct ctx *x)
{
	struct hkv_client *h = handle(x);
	int rc;

	if (!h)
		return;
	rc = checked(x, hkv_delete(h, x->r->key, x->r->klen));
	if (rc == 0 || rc == HKV_ENOTFOUND)
		count(rc ? &x->w->ctr.delete_misses : &x->w->ctr.delete_hits, 1);
	if (rc == 0)
		reply(x, "DELETED");
	else if (rc == HKV_ENOTFOUND)
		reply(x, "NOT_FOUND");
	else
		reply_hkv_error(x, rc);
}

static void process_touch(struct ctx *x)
{
	struct hkv_client *h = handle(x);
	int rc;

	if (!h)
		return;
	count(&x->w->ctr.cmd_touch, 1);
	rc = checked(x, hkv_touch(h, x->r->key, x->r->klen, x->r->exptime));
	if (rc == 0 || rc == HKV_ENOTFOUND)
		count(rc ? &x->w->ctr.touch_misses : &x->w->ctr.touch_hits, 1);
	if (rc == 0)
		reply(x, "TOUCHED");
	else if (rc == HKV_ENOTFOUND)
		reply(x, "NOT_FOUND");
	else
		reply_hkv_error(x, rc);
}

static void flush_now(struct worker *w)
{
	int rc;

	if (!w->hkv && open_handle(w))
		return;
	rc = hkv_flush_all(w->hkv);
	if (rc)
		hkv_warn("worker %d: flush_all: %s", w->id, hkv_strerror(rc));
}

/* A worker's delayed flush fires: it runs only if it is still the pending
 * one (a later flush_all, delayed or not, replaced it). */
static void on_flush_timer(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	uint64_t gen = w->flush_gen;

	if (__atomic_compare_exchange_n(&w->srv->flush_pending, &gen, 0, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_RELAXED))
		flush_now(w);
}

/*
 * flush_all [delay]. As memcached keeps one "oldest live" time, one delayed
 * flush is pending at a time, whoever asked: a new one replaces it, an
 * immediate one cancels it. Each worker has one timer (re-armed, never
 * more), so no number of requests arms more than one timer per worker.
 */
static void process_flush(struct ctx *x)
{
	struct mc_server *s = x->w->srv;
	int64_t delay = x->r->exptime;
	struct hkv_client *h;
	int rc;

	count(&x->w->ctr.cmd_flush, 1);
	if (s->o.no_flush)
		return reply(x, "CLIENT_ERROR flush_all not allowed");
	if (delay > MC_REL_EXPTIME_MAX)
		delay -= (int64_t)region_now(x); /* an absolute time is on the region's clock */
	if (x->r->has_exptime && delay > 0) {
		struct timeval tv = {.tv_sec = delay};

		x->w->flush_gen = __atomic_add_fetch(&s->flush_seq, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&s->flush_pending, x->w->flush_gen, __ATOMIC_RELEASE);
		evtimer_del(x->w->flush_ev);
		evtimer_add(x->w->flush_ev, &tv);
		return reply(x, "OK");
	}
	__atomic_store_n(&s->flush_pending, 0, __ATOMIC_RELEASE);
	if (!(h = handle(x)))
		return;
	rc = checked(x, hkv_flush_all(h));
	if (rc)
		return reply_hkv_error(x, rc);
	reply(x, "OK");
}

static void process_version(struct ctx *x)
{
	evbuffer_add_printf(x->out, "VERSION 1.6.18-hatchkv-%s\r\n", hkv_version());
}

/* ---- stats ---------------------------------------------------------------- */

static const char *const op_names[HKV_OP_NTYPES] = {
	"get", "set", "add", "replace", "cas", "append", "delete", "incr", "touch", "mget"};

static void sum_workers(struct mc_server *s, struct mc_counters *c, struct hkv_client_stats *h)
{
	memset(c, 0, sizeof(*c));
	memset(h, 0, sizeof(*h));
	for (int i = 0; i < s->nworkers; i++) {
		struct worker *w = &s->workers[i];
		const uint64_t *src = (const uint64_t *)&w->ctr;
		uint64_t *dst = (uint64_t *)c;

		for (size_t k = 0; k < sizeof(*c) / sizeof(uint64_t); k++)
			dst[k] += load(&src[k]);
		pthread_mutex_lock(&w->lock);
		stats_add(h, &w->snap);
		stats_add(h, &w->closed);
		pthread_mutex_unlock(&w->lock);
	}
}

/* Requests in flight at once on one worker, at most so far. */
static int in_flight_peak(struct mc_server *s)
{
	int peak = 1;

	for (int i = 0; i < s->nworkers; i++) {
		int p = __atomic_load_n(&s->workers[i].pipe_peak, __ATOMIC_RELAXED);

		peak = p > peak ? p : peak;
	}
	return peak;
}

#define STAT_U(name, v) evbuffer_add_printf(b, "STAT %s %" PRIu64 "\r\n", name, (uint64_t)(v))

static void stats_general(struct ctx *x, struct evbuffer *b)
{
	struct mc_server *s = x->w->srv;
	struct mc_counters c;
	struct hkv_client_stats h;
	struct hkv_server_info si = {0};
	uint64_t items = 0, bytes = 0;
	time_t now = time(NULL), sampled = 0;
	uint64_t walks = 0;

	struct hkv_client *hh = x->lane_h ? x->lane_h : x->w->hkv;

	publish_stats(x->w);
	sum_workers(s, &c, &h);
	if (hh) {
		uint64_t n_items, n_bytes;
		int due;

		hkv_server_info(hh, &si);
		/* A walk of the shared index (every daemon on the store sees the same
		 * numbers; a count kept here would know only this daemon's writes),
		 * at most every MC_COUNT_EVERY s whatever the number of stats
		 * requests: the figures say when they were taken (hkv_items_sampled).
		 * One walker at a time (walk_lock; in a pipe call the walk lets other
		 * lanes of this thread run, so they only try it); the figures under
		 * count_lock, never held across a wait. */
		pthread_mutex_lock(&s->count_lock);
		due = now - s->counted_at >= MC_COUNT_EVERY;
		pthread_mutex_unlock(&s->count_lock);
		if (due && !pthread_mutex_trylock(&s->walk_lock)) {
			if (!checked(x, hkv_count_items(hh, &n_items, &n_bytes))) {
				pthread_mutex_lock(&s->count_lock);
				s->items = n_items;
				s->bytes = n_bytes;
				s->counted_at = now;
				s->walks++;
				pthread_mutex_unlock(&s->count_lock);
			}
			pthread_mutex_unlock(&s->walk_lock);
		}
		pthread_mutex_lock(&s->count_lock);
		walks = s->walks;
		items = s->items;
		bytes = s->bytes;
		sampled = s->counted_at;
		pthread_mutex_unlock(&s->count_lock);
	}
	STAT_U("pid", getpid());
	STAT_U("uptime", now - s->started);
	STAT_U("time", now);
	evbuffer_add_printf(b, "STAT version 1.6.18-hatchkv-%s\r\n", hkv_version());
	evbuffer_add_printf(b, "STAT libevent %s\r\n", event_get_version());
	STAT_U("pointer_size", 8 * sizeof(void *));
	STAT_U("curr_connections", load(&s->curr_conns));
	STAT_U("total_connections", load(&s->total_conns));
	STAT_U("rejected_connections", load(&s->rejected_conns));
	STAT_U("cmd_get", c.cmd_get);
	STAT_U("cmd_set", c.cmd_set);
	STAT_U("cmd_flush", c.cmd_flush);
	STAT_U("cmd_touch", c.cmd_touch);
	STAT_U("get_hits", c.get_hits);
	STAT_U("get_misses", c.get_misses);
	STAT_U("get_expired", c.get_expired);
	STAT_U("delete_misses", c.delete_misses);
	STAT_U("delete_hits", c.delete_hits);
	STAT_U("incr_misses", c.incr_misses);
	STAT_U("incr_hits", c.incr_hits);
	STAT_U("decr_misses", c.decr_misses);
	STAT_U("decr_hits", c.decr_hits);
	STAT_U("cas_misses", c.cas_misses);
	STAT_U("cas_hits", c.cas_hits);
	STAT_U("cas_badval", c.cas_badval);
	STAT_U("touch_hits", c.touch_hits);
	STAT_U("touch_misses", c.touch_misses);
	STAT_U("threads", s->nworkers);
	STAT_U("limit_maxbytes", si.value_bytes);
	STAT_U("item_size_max", s->o.item_max);
	STAT_U("curr_items", items);
	STAT_U("bytes", bytes);
	STAT_U("hkv_items_sampled", sampled);
	STAT_U("hkv_index_walks", walks);
	STAT_U("evictions", h.evictions);
	STAT_U("expired_unfetched", 0);
	STAT_U("reclaimed", h.expired_reclaimed);
	STAT_U("hkv_cache_mode", si.cache_mode);
	STAT_U("hkv_max_value", si.max_value);
	STAT_U("hkv_index_slots", si.index_slots);
	STAT_U("hkv_read_round_trips", h.op[HKV_OP_GET].round_trips + h.op[HKV_OP_MGET].round_trips);
	STAT_U("hkv_cache_hits", h.cache_hits);
	STAT_U("hkv_cache_misses", h.cache_misses);
	STAT_U("hkv_corrupt_reads", h.corrupt_reads);
	STAT_U("hkv_lost_server", c.hkv_errors);
	STAT_U("hkv_in_flight_peak", in_flight_peak(s));
	for (int i = 0; i < HKV_OP_NTYPES; i++) {
		const struct hkv_op_stats *o = &h.op[i];

		evbuffer_add_printf(b, "STAT hkv_ops_%s %" PRIu64 "\r\n", op_names[i], o->count);
		evbuffer_add_printf(b, "STAT hkv_rt_%s %.3f\r\n", op_names[i],
				    o->count ? (double)o->round_trips / (double)o->count : 0.0);
	}
}

static void process_stats(struct ctx *x)
{
	const struct mc_req *r = x->r;

	if (r->arg_len == 0) {
		stats_general(x, x->out);
		evbuffer_add(x->out, "END\r\n", 5);
	} else if (r->arg_len == 5 && !memcmp(r->arg, "reset", 5)) {
		evbuffer_add(x->out, "RESET\r\n", 7);
	} else if ((r->arg_len == 8 && !memcmp(r->arg, "settings", 8))) {
		evbuffer_add_printf(x->out, "STAT maxconns %d\r\nSTAT tcpport %d\r\n"
				    "STAT num_threads %d\r\nSTAT item_size_max %zu\r\nEND\r\n",
				    x->w->srv->o.max_conns, x->w->srv->o.port, x->w->srv->nworkers,
				    x->w->srv->o.item_max);
	} else if ((r->arg_len == 5 && !memcmp(r->arg, "items", 5)) ||
		   (r->arg_len == 5 && !memcmp(r->arg, "slabs", 5)) ||
		   (r->arg_len == 5 && !memcmp(r->arg, "sizes", 5)) ||
		   (r->arg_len == 5 && !memcmp(r->arg, "conns", 5))) {
		evbuffer_add(x->out, "END\r\n", 5);
	} else {
		evbuffer_add(x->out, "ERROR\r\n", 7);
	}
}

/* ---- metrics (--metrics) ------------------------------------------------- */

/* The page (mc_metrics.h), on the accept thread: every worker's counters
 * summed as `stats` sums them, the index walk only as `stats` last did it. */
static void metrics_page(struct evbuffer *out, void *arg)
{
	struct mc_server *s = arg;
	struct mc_metrics_snap m = {.workers = s->nworkers, .depth = s->o.depth,
				    .max_conns = s->o.max_conns, .started = s->started};

	sum_workers(s, &m.c, &m.h);
	m.curr_conns = load(&s->curr_conns);
	m.total_conns = load(&s->total_conns);
	m.rejected_conns = load(&s->rejected_conns);
	m.in_flight_peak = in_flight_peak(s);
	pthread_mutex_lock(&s->count_lock);
	m.items = s->items;
	m.bytes = s->bytes;
	m.counted_at = s->counted_at;
	pthread_mutex_unlock(&s->count_lock);
	mc_metrics_page(out, &m);
}

static int start_metrics(struct mc_server *s)
{
	s->metrics = hkv_metrics_start(s->base, s->o.metrics, metrics_page, s);
	if (!s->metrics) {
		hkv_err("cannot serve metrics on %s: %s", s->o.metrics, strerror(errno));
		return -1;
	}
	hkv_info("metrics at %s", hkv_metrics_url(s->metrics));
	return 0;
}

/* ---- meta commands -------------------------------------------------------- */

static int has(const struct mc_req *r, char f)
{
	return (r->meta.flags & MC_META_BIT(f)) != 0;
}

/* The region's clock (hkv_time): what every exptime is on, never ours. */
static uint32_t region_now(const struct ctx *x)
{
	struct hkv_client *h = x->lane_h ? x->lane_h : x->w->hkv;

	return h ? hkv_time(h) : (uint32_t)time(NULL);
}

/* memcached's exptime rules, as the library applies them. */
static uint32_t abs_exptime(const struct ctx *x, int64_t e)
{
	if (e == 0)
		return 0;
	if (e < 0)
		return 1;
	return e <= MC_REL_EXPTIME_MAX ? (uint32_t)(region_now(x) + e) : (uint32_t)e;
}

static int64_t ttl_left(const struct ctx *x, uint32_t exptime)
{
	int64_t left = (int64_t)exptime - (int64_t)region_now(x);

	return exptime == 0 ? -1 : left < 0 ? 0 : left;
}

/* Return flags, in request order; `which` lists the ones this reply carries. */
static void meta_flags(struct ctx *x, const char *which, const struct hkv_item_info *info,
		       size_t vlen)
{
	const struct mc_req *r = x->r;

	for (int i = 0; i < r->meta.norder; i++) {
		char f = r->meta.order[i];

		if (!strchr(which, f))
			continue;
		switch (f) {
		case 'O':
			evbuffer_add_printf(x->out, " O%.*s", (int)r->meta.opaque_len, r->meta.opaque);
			break;
		case 'k': evbuffer_add_printf(x->out, " k%.*s", (int)r->klen, r->key); break;
		case 'c': evbuffer_add_printf(x->out, " c%" PRIu64, info->version); break;
		case 'f': evbuffer_add_printf(x->out, " f%" PRIu32, info->flags); break;
		case 's': evbuffer_add_printf(x->out, " s%zu", vlen); break;
		case 't': evbuffer_add_printf(x->out, " t%" PRId64, ttl_left(x, info->exptime)); break;
		default: break;
		}
	}
}

/* A status-only meta reply: code, then O and k (and c for ms: 0 on failure). */
static void meta_status(struct ctx *x, const char *code, const struct hkv_item_info *info,
			int quiet)
{
	static const struct hkv_item_info none;

	if (quiet)
		return;
	evbuffer_add(x->out, code, 2);
	meta_flags(x, x->r->cmd == MC_CMD_MS ? "Okc" : "Ok", info ? info : &none, 0);
	evbuffer_add(x->out, "\r\n", 2);
}

static void process_mg(struct ctx *x)
{
	const struct mc_req *r = x->r;
	struct hkv_client *h = handle(x);
	struct hkv_item_info info;
	size_t vlen;
	int rc = 0;

	if (!h)
		return;
	count(&x->w->ctr.cmd_get, 1);
	rc = get_one(x, h, r->key, r->klen, &vlen, &info);
	if (!rc && has(r, 'T')) {
		const char *t = memchr(r->meta.order, 't', (size_t)r->meta.norder);
		const char *T = memchr(r->meta.order, 'T', (size_t)r->meta.norder);

		rc = checked(x, hkv_touch(h, r->key, r->klen, r->meta.ttl));
		if (!t || T < t) /* memcached applies flags in order: t before T is the old TTL */
			info.exptime = abs_exptime(x, r->meta.ttl);
	}
	if (rc == HKV_ENOTFOUND) {
		count(&x->w->ctr.get_misses, 1);
		return meta_status(x, "EN", NULL, has(r, 'q'));
	}
	if (rc)
		return reply_hkv_error(x, rc);
	count(&x->w->ctr.get_hits, 1);
	if (has(r, 'v'))
		evbuffer_add_printf(x->out, "VA %zu", vlen);
	else
		evbuffer_add(x->out, "HD", 2);
	meta_flags(x, "Okcfst", &info, vlen);
	evbuffer_add(x->out, "\r\n", 2);
	if (has(r, 'v')) {
		evbuffer_add(x->out, x->b->vbuf, vlen);
		evbuffer_add(x->out, "\r\n", 2);
	}
}

/* ms C with append/prepend: append only to the item of that version. */
static int ms_versioned_append(struct ctx *x, struct hkv_client *h, int prepend)
{
	const struct mc_req *r = x->r;

	return checked(x, hkv_append_if(h, r->key, r->klen, r->data, r->dlen, prepend,
					r->meta.cas));
}

static int ms_store(struct ctx *x, struct hkv_client *h)
{
	const struct mc_req *r = x->r;
	struct hkv_write_opts o = {.flags = r->flags, .exptime = r->exptime};
	int cas = has(r, 'C');

	if (r->dlen > x->w->srv->max_value)
		return HKV_ETOOBIG;
	switch (r->meta.mode) {
	case 'E': return hkv_add(h, r->key, r->klen, r->data, r->dlen, &o);
	case 'R':
		if (cas)
			break;
		return hkv_replace(h, r->key, r->klen, r->data, r->dlen, &o);
	case 'A': case 'P':
		if (cas)
			return ms_versioned_append(x, h, r->meta.mode == 'P');
		return hkv_append(h, r->key, r->klen, r->data, r->dlen, r->meta.mode == 'P');
	default:
		if (!cas)
			return hkv_set(h, r->key, r->klen, r->data, r->dlen, &o);
		break;
	}
	return hkv_cas(h, r->key, r->klen, r->data, r->dlen, r->meta.cas, &o);
}

static void process_ms(struct ctx *x)
{
	const struct mc_req *r = x->r;
	struct hkv_client *h = handle(x);
	struct hkv_item_info info = {0};
	int rc;

	if (!h)
		return;
	count(&x->w->ctr.cmd_set, 1);
	rc = checked(x, ms_store(x, h));
	if (rc == 0) /* c: the version this write stored (a get could see a later one) */
		info.version = hkv_last_version(h);
	if (rc == HKV_ETOOBIG) /* (in every mode, as process_too_large) */
		drop_refused(x, h);
	switch (rc) {
	case 0: meta_status(x, "HD", &info, has(r, 'q')); break;
	case HKV_EEXISTS: meta_status(x, "NS", NULL, 0); break;
	case HKV_ENOTFOUND: /* NF: cas-set or cas-replace of a missing key */
		meta_status(x, has(r, 'C') && strchr("SR", r->meta.mode) ? "NF" : "NS", NULL, 0);
		break;
	case HKV_EVERSION: meta_status(x, "EX", NULL, 0); break;
	default: reply_hkv_error(x, rc); break;
	}
}

/* md [C]: with C, delete only the item of that version (one atomic step). */
static void process_md(struct ctx *x)
{
	const struct mc_req *r = x->r;
	struct hkv_client *h = handle(x);
	int rc;

	if (!h)
		return;
	rc = checked(x, has(r, 'C') ? hkv_delete_if(h, r->key, r->klen, r->meta.cas)
				    : hkv_delete(h, r->key, r->klen));
	switch (rc) {
	case 0: meta_status(x, "HD", NULL, has(r, 'q')); break;
	case HKV_ENOTFOUND: meta_status(x, "NF", NULL, 0); break;
	case HKV_EVERSION: meta_status(x, "EX", NULL, 0); break;
	default: reply_hkv_error(x, rc); break;
	}
}

/* ma N: create the counter with the initial value J (no delta applied). */
static int ma_vivify(struct ctx *x, struct hkv_client *h, struct arith *a)
{
	const struct mc_req *r = x->r;
	struct hkv_write_opts o = {.exptime = r->meta.vivify_ttl};
	char num[24];
	int n = snprintf(num, sizeof(num), "%" PRIu64, r->meta.initial);
	int rc = checked(x, hkv_add(h, r->key, r->klen, num, (size_t)n, &o));

	a->result = r->meta.initial;
	return rc;
}

static void ma_reply(struct ctx *x, struct hkv_client *h, struct arith *a, int created)
{
	const struct mc_req *r = x->r;
	char num[24];
	size_t vlen;
	int n = snprintf(num, sizeof(num), "%" PRIu64, a->result);

	/* q hides a success, also its value (memcached 1.6.18 skips the whole
	 * response); a vivified item is still reported. */
	if (has(r, 'q') && !created)
		return;
	if (has(r, 't'))
		get_one(x, h, r->key, r->klen, &vlen, &a->info);
	a->info.version = hkv_last_version(h); /* c: this write's, not a later one's */
	if (has(r, 'v'))
		evbuffer_add_printf(x->out, "VA %d", n);
	else
		evbuffer_add(x->out, "HD", 2);
	meta_flags(x, "Oktc", &a->info, 0);
	evbuffer_add(x->out, "\r\n", 2);
	if (has(r, 'v'))
		evbuffer_add_printf(x->out, "%s\r\n", num);
}

static void process_ma(struct ctx *x)
{
	const struct mc_req *r = x->r;
	struct arith a = {.delta = r->meta.delta, .decr = r->meta.mode == 'D',
			  .has_cas = has(r, 'C'), .cas = r->meta.cas,
			  .has_ttl = has(r, 'T'), .ttl = r->meta.ttl};
	struct hkv_client *h = handle(x);
	int rc, created = 0;

	if (!h)
		return;
	rc = arith(x, h, r->key, r->klen, &a);
	for (int i = 0; rc == HKV_ENOTFOUND && has(r, 'N') && i < MC_CAS_RETRIES; i++) {
		rc = ma_vivify(x, h, &a);
		created = rc == 0;
		if (rc == HKV_EEXISTS)
			rc = arith(x, h, r->key, r->klen, &a);
	}
	switch (rc) {
	case 0: ma_reply(x, h, &a, created); break;
	case HKV_ENOTFOUND: meta_status(x, "NF", NULL, 0); break;
	case HKV_EEXISTS: meta_status(x, "NS", NULL, 0); break;
	case HKV_EVERSION: meta_status(x, "EX", NULL, 0); break;
	default: reply_hkv_error(x, rc); break;
	}
}

/* ---- dispatch ------------------------------------------------------------- */

static void execute(struct ctx *x)
{
	const struct mc_req *r = x->r;

	if (r->err == MC_E_TOO_LARGE)
		return process_too_large(x);
	if (r->err == MC_E_HTTP) { /* as memcached: close at once, unsent replies dropped */
		struct evbuffer *out = bufferevent_get_output(x->c->bev);

		evbuffer_drain(x->out, evbuffer_get_length(x->out));
		evbuffer_drain(out, evbuffer_get_length(out));
		x->c->closing = 1;
		return;
	}
	if (r->err != MC_OK)
		return reply_error(x, mc_strerror(r->err));
	switch (r->cmd) {
	case MC_CMD_GET: case MC_CMD_GETS: case MC_CMD_GAT: case MC_CMD_GATS:
		return process_get(x);
	case MC_CMD_SET: case MC_CMD_ADD: case MC_CMD_REPLACE: case MC_CMD_APPEND:
	case MC_CMD_PREPEND: case MC_CMD_CAS:
		return process_store(x);
	case MC_CMD_INCR: case MC_CMD_DECR: return process_arith(x);
	case MC_CMD_DELETE: return process_delete(x);
	case MC_CMD_TOUCH: return process_touch(x);
	case MC_CMD_FLUSH_ALL: return process_flush(x);
	case MC_CMD_VERSION: return process_version(x);
	case MC_CMD_VERBOSITY: return reply(x, "OK");
	case MC_CMD_STATS: return process_stats(x);
	case MC_CMD_MG: return process_mg(x);
	case MC_CMD_MS: return process_ms(x);
	case MC_CMD_MD: return process_md(x);
	case MC_CMD_MA: return process_ma(x);
	case MC_CMD_MN: evbuffer_add(x->out, "MN\r\n", 4); return;
	case MC_CMD_QUIT: x->c->closing = 1; return;
	default: return reply_error(x, "ERROR");
	}
}

/* ---- connections ---------------------------------------------------------- */

static void conn_free(struct conn *c)
{
	struct worker *w = c->w;

	if (c->busy) { /* its pass is in the pipe: freed once handed back */
		c->dead = 1;
		bufferevent_disable(c->bev, EV_READ | EV_WRITE);
		bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
		event_del(c->resume);
		return;
	}
	if (c->waiting) { /* off the wait list */
		struct conn **pp = &w->wait_head, *prev = NULL;

		while (*pp != c)
			prev = *pp, pp = &(*pp)->wait_next;
		*pp = c->wait_next;
		if (w->wait_tail == c)
			w->wait_tail = prev;
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		w->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	event_free(c->resume);
	if (c->stage)
		evbuffer_free(c->stage);
	bufferevent_free(c->bev);
	free(c);
	__atomic_fetch_sub(&w->srv->curr_conns, 1, __ATOMIC_RELAXED);
}

/* Drop bytes of a refused data block; 0 while more must come. */
static int conn_swallow(struct conn *c, struct evbuffer *in)
{
	size_t len = evbuffer_get_length(in), n = len < c->swallow ? len : c->swallow;

	evbuffer_drain(in, n);
	c->swallow -= n;
	return c->swallow == 0;
}

/* Parse and execute what is complete, at most MC_BATCH requests. 1: closed. */
/*
 * Send the replies of a pass: straight to the socket when nothing is queued
 * before them (one writev, and the bufferevent never has to watch for
 * writability: no epoll_ctl pair and no extra epoll_wait per request), the
 * rest - what the socket did not take - through the bufferevent's queue.
 */
static void flush_stage(struct conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	if (!evbuffer_get_length(c->stage))
		return;
	count(&c->w->ctr.bytes_written, evbuffer_get_length(c->stage));
	if (!evbuffer_get_length(out)) {
		evutil_socket_t fd = bufferevent_getfd(c->bev);

		while (evbuffer_get_length(c->stage) && evbuffer_write(c->stage, fd) > 0)
			;
	}
	if (evbuffer_get_length(c->stage))
		evbuffer_add_buffer(out, c->stage);
}

static int conn_process(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev), *out = bufferevent_get_output(c->bev);
	struct worker *w = c->w;
	int more = 0;

	for (int done = 0; !c->closing; done++) {
		struct ctx x = {.w = w, .c = c, .out = c->stage, .b = &w->own};
		size_t len;
		struct mc_req req;
		int n;

		if (c->swallow && !conn_swallow(c, in))
			break;
		len = evbuffer_get_length(in);
		if (!len || len < c->need)
			break;
		if (done == MC_BATCH) {
			event_active(c->resume, EV_TIMEOUT, 0);
			more = 1;
			break;
		}
		if (evbuffer_get_length(out) + evbuffer_get_length(c->stage) > MC_OUT_HIGH) {
			bufferevent_disable(c->bev, EV_READ);
			c->paused = more = 1;
			break;
		}
		n = mc_parse((const char *)evbuffer_pullup(in, -1), len, w->srv->o.item_max, &req);
		if (n < 0) {
			hkv_debug("worker %d: request line too long, closing", w->id);
			conn_free(c);
			return 1;
		}
		if (n == 0) {
			c->need = req.need;
			break;
		}
		c->need = 0;
		x.r = &req;
		if (c->lane >= 0) { /* a pipe call: the lane's handle and buffers */
			x.lane_h = c->lane_h;
			x.b = &w->lane_bufs[c->lane];
		}
		if (!c->get_pos) { /* (a multi-get going on is counted once) */
			count(&w->ctr.bytes_read, (uint64_t)n + req.swallow);
			if (req.err == MC_OK)
				count(&w->ctr.cmds[req.cmd], 1);
		}
		execute(&x);
		if (c->get_pos) { /* a multi-get stopped at the output bound */
			bufferevent_disable(c->bev, EV_READ);
			c->paused = more = 1;
			break;
		}
		evbuffer_drain(in, (size_t)n);
		c->swallow = req.swallow;
	}
	flush_stage(c);
	if (c->paused && !evbuffer_get_length(out)) { /* the socket took it all: go on */
		c->paused = 0;
		bufferevent_enable(c->bev, EV_READ);
		event_active(c->resume, EV_TIMEOUT, 0);
	}
	publish_stats(w);
	if (c->eof && !more)
		c->closing = 1;
	if (c->closing) {
		bufferevent_disable(c->bev, EV_READ);
		if (!evbuffer_get_length(out)) {
			conn_free(c);
			return 1;
		}
		bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	}
	return 0;
}

/* ---- depth > 1: a connection's passes as pipe calls ---------------------- */

static int conn_call(struct hkv_client *h, int lane, void *arg)
{
	struct conn *c = arg;

	c->lane = lane;
	c->lane_h = h;
	conn_process(c); /* (may mark it dead: conn_free waits for us) */
	c->lane = -1;
	c->lane_h = NULL;
	return 0;
}

static void pump_arm(struct worker *w)
{
	static const struct timeval now;

	if (!evtimer_pending(w->pump, NULL))
		evtimer_add(w->pump, &now); /* after the next look at the sockets */
}

/* Submit c's pass; 0, or -EAGAIN when the pipe is full (it waits its turn). */
static int conn_submit(struct conn *c)
{
	c->self = c; /* the pipe's key: these bytes, the connection's address */
	c->op = (struct hkv_pipe_op){.kind = HKV_PIPE_CALL, .key = &c->self, .klen = sizeof(c->self),
				     .call = conn_call, .user = c};
	if (hkv_pipe_submit(c->w->pipe, &c->op))
		return -EAGAIN;
	c->busy = 1;
	return 0;
}

/* Run a pass of c: at once at depth 1; else queue it in the pipe. */
static void conn_schedule(struct conn *c)
{
	struct worker *w = c->w;

	if (!w->pipe) {
		conn_process(c);
		return;
	}
	if (c->busy || c->waiting) {
		c->again = 1;
		return;
	}
	if (w->wait_head || conn_submit(c)) {
		c->waiting = 1;
		c->wait_next = NULL;
		if (w->wait_tail)
			w->wait_tail->wait_next = c;
		else
			w->wait_head = c;
		w->wait_tail = c;
	}
	pump_arm(w);
}

/* Run the pipe until a pass is done; hand back what finished; go on later. */
static void on_pump(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct hkv_pipe_op *done[64];
	int n = hkv_pipe_poll(w->pipe, done, 64);

	for (int i = 0; i < n; i++) {
		struct conn *c = done[i]->user;

		c->busy = 0;
		if (c->dead) {
			conn_free(c);
		} else if (c->again) {
			c->again = 0;
			conn_schedule(c);
		}
	}
	while (w->wait_head && !conn_submit(w->wait_head)) {
		struct conn *c = w->wait_head;

		w->wait_head = c->wait_next;
		if (!w->wait_head)
			w->wait_tail = NULL;
		c->waiting = 0;
		c->again = 0;
	}
	if (hkv_pipe_pending(w->pipe) || w->wait_head)
		pump_arm(w);
}

static void on_read(struct bufferevent *bev, void *arg)
{
	conn_schedule(arg);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
	conn_schedule(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (c->closing) {
		if (!evbuffer_get_length(bufferevent_get_output(bev)))
			conn_free(c);
		return;
	}
	if (c->paused) {
		c->paused = 0;
		bufferevent_enable(bev, EV_READ);
		conn_schedule(c);
	}
}

/* EOF: answer what was read, then close once the replies are out. */
static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;

	if (what & BEV_EVENT_ERROR)
		return conn_free(c);
	if (what & BEV_EVENT_EOF) {
		c->eof = 1;
		conn_schedule(c);
	}
}

static void conn_new(struct worker *w, int fd)
{
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		goto fail;
	c->w = w;
	c->lane = -1;
	/* replies go out when written, as memcached's do (no Nagle delay; a
	 * unix-socket or IPv6 peer simply ignores or refuses it) */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
	c->bev = bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev)
		goto free_conn;
	c->resume = event_new(w->base, -1, 0, on_resume, c);
	if (!c->resume)
		goto free_bev;
	c->stage = evbuffer_new();
	if (!c->stage) {
		event_free(c->resume);
		goto free_bev;
	}
	bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
	bufferevent_setwatermark(c->bev, EV_WRITE, MC_OUT_HIGH / 4, 0);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->next = w->conns;
	if (w->conns)
		w->conns->prev = c;
	w->conns = c;
	return;
free_bev:
	bufferevent_free(c->bev);
	fd = -1;
free_conn:
	free(c);
fail:
	if (fd >= 0)
		close(fd);
	__atomic_fetch_sub(&w->srv->curr_conns, 1, __ATOMIC_RELAXED);
	hkv_warn("worker %d: out of memory for a connection", w->id);
}

/* ---- workers -------------------------------------------------------------- */

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	int fds[64];
	size_t n;

	pthread_mutex_lock(&w->lock);
	n = w->nqueue < 64 ? w->nqueue : 64;
	memcpy(fds, w->queue, n * sizeof(int));
	memmove(w->queue, w->queue + n, (w->nqueue - n) * sizeof(int));
	w->nqueue -= n;
	if (w->nqueue)
		event_active(w->notify, EV_TIMEOUT, 0);
	pthread_mutex_unlock(&w->lock);
	for (size_t i = 0; i < n; i++)
		conn_new(w, fds[i]);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
	while (w->pipe && hkv_pipe_pending(w->pipe)) /* passes in flight end first */
		on_pump(-1, 0, w);
	while (w->conns) {
		w->conns->waiting = 0; /* (the wait list goes with them) */
		conn_free(w->conns);
	}
	w->wait_head = w->wait_tail = NULL;
	return NULL;
}

static int worker_init(struct mc_server *s, struct worker *w, int id)
{
	w->srv = s;
	w->id = id;
	pthread_mutex_init(&w->lock, NULL);
	if (open_handle(w))
		return -1;
	w->vcap = s->max_value;
	w->own.vbuf = malloc(w->vcap + 1);
	w->own.mbuf = malloc(MC_MGET_BUF); /* (NULL: one key at a time) */
	w->base = event_base_new();
	if (!w->own.vbuf || !w->base)
		return -1;
	if (s->o.depth > 1) {
		int rc = hkv_pipe_open(s->cfg, s->o.depth, &w->pipe);

		if (rc) {
			hkv_warn("worker %d: cannot open a pipe of depth %d: %s", id, s->o.depth,
				 hkv_strerror(rc));
			return -1;
		}
		w->lane_bufs = calloc((size_t)s->o.depth, sizeof(*w->lane_bufs));
		if (!w->lane_bufs)
			return -1;
		for (int i = 0; i < s->o.depth; i++) {
			w->lane_bufs[i].vbuf = malloc(w->vcap + 1);
			w->lane_bufs[i].mbuf = malloc(MC_MGET_BUF);
			if (!w->lane_bufs[i].vbuf)
				return -1;
		}
		w->pump = evtimer_new(w->base, on_pump, w);
		if (!w->pump)
			return -1;
	}
	w->flush_ev = evtimer_new(w->base, on_flush_timer, w);
	w->notify = event_new(w->base, -1, EV_PERSIST, on_notify, w);
	return w->notify && w->flush_ev ? 0 : -1;
}

static void worker_destroy(struct worker *w)
{
	if (w->notify)
		event_free(w->notify);
	if (w->flush_ev)
		event_free(w->flush_ev);
	if (w->pump)
		event_free(w->pump);
	if (w->base)
		event_base_free(w->base);
	free(w->own.vbuf);
	free(w->own.mbuf);
	for (int i = 0; w->lane_bufs && i < w->srv->o.depth; i++) {
		free(w->lane_bufs[i].vbuf);
		free(w->lane_bufs[i].mbuf);
	}
	free(w->lane_bufs);
	hkv_pipe_close(w->pipe);
	free(w->queue);
	if (w->hkv)
		hkv_close(w->hkv);
	pthread_mutex_destroy(&w->lock);
}

static int worker_enqueue(struct worker *w, int fd)
{
	int rc = 0;

	pthread_mutex_lock(&w->lock);
	if (w->nqueue == w->qcap) {
		size_t cap = w->qcap ? w->qcap * 2 : 16;
		int *q = realloc(w->queue, cap * sizeof(int));

		if (q) {
			w->queue = q;
			w->qcap = cap;
		}
	}
	if (w->nqueue < w->qcap)
		w->queue[w->nqueue++] = fd;
	else
		rc = -ENOMEM;
	pthread_mutex_unlock(&w->lock);
	if (!rc)
		event_active(w->notify, EV_TIMEOUT, 0);
	return rc;
}

/* ---- accept thread -------------------------------------------------------- */

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	static const char busy[] = "ERROR Too many open connections\r\n";
	struct mc_server *s = arg;
	struct worker *w;

	if (load(&s->curr_conns) >= (uint64_t)s->o.max_conns) {
		ssize_t ignored = write(fd, busy, sizeof(busy) - 1);

		(void)ignored;
		close(fd);
		__atomic_fetch_add(&s->rejected_conns, 1, __ATOMIC_RELAXED);
		return;
	}
	evutil_make_socket_nonblocking(fd);
	__atomic_fetch_add(&s->curr_conns, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->total_conns, 1, __ATOMIC_RELAXED);
	w = &s->workers[s->next++ % (unsigned)s->nworkers];
	if (worker_enqueue(w, fd)) {
		close(fd);
		__atomic_fetch_sub(&s->curr_conns, 1, __ATOMIC_RELAXED);
	}
}

/*
 * The descriptor budget (issue 28, item 6): the soft limit raised to the
 * hard one; of it, HANDLE_FDS per worker's hatchkv handle and a reserve for
 * the listeners, metrics and logs; --conn-limit (default 1024) capped
 * below what is left, so that a flood of connections is refused at
 * --conn-limit with a line, never by running out of descriptors.
 */
#define HANDLE_FDS  16
#define FD_RESERVE  (64 + 64) /* listeners, metrics (64 connections), logs, libevent */

static void size_conns(struct mc_server *s)
{
	long lim = hkv_fd_limit_raise("hatchkv-memcached");
	long room = lim - FD_RESERVE - (long)s->nworkers * HANDLE_FDS;

	if (room < 16)
		room = 16;
	if (!s->o.max_conns) {
		s->o.max_conns = room < 1024 ? (int)room : 1024;
	} else if (s->o.max_conns > room) {
		hkv_warn("--conn-limit %d is more than %ld descriptors allow (%ld in all); "
			 "using %ld", s->o.max_conns, room, lim, room);
		s->o.max_conns = (int)room;
	}
}

/* accept() failed (out of descriptors, say): one line a second at most, and
 * a 100 ms pause instead of spinning on a readable socket. */
static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(((struct mc_server *)arg)->lis);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	struct mc_server *s = arg;
	struct timeval pause = {0, 100000};

	hkv_warn_limited("accept: %s; pausing 100 ms",
			 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	evconnlistener_disable(l);
	evtimer_add(s->resume, &pause);
}

/* SIGUSR1, SIGUSR2: logged, the daemon goes on (before, each killed it). */
static void on_ignored_signal(evutil_socket_t sig, short what, void *arg)
{
	hkv_info("%s ignored", strsignal((int)sig));
}

/* What SIGHUP applies: the log level, and etcd's credentials and
 * certificates (a cluster's); every other option needs a restart. */
static int live_option(const char *name)
{
	return !strcmp(name, "verbose") ||
	       (!strncmp(name, "etcd-", 5) && strcmp(name, "etcd-insecure"));
}

/* etcd's files as v names them now, for every handle opened with s->o.etcd
 * (the library's, in every worker: common/etcd.h, hkv_etcd_reload). */
static void reload_etcd(struct mc_server *s, char *const *v, char *buf, size_t cap)
{
	static const char *const names[] = {"cacert", "cert", "key", "user", "password-file"};
	struct hkv_etcd_sec now = {0};
	char opt[32];

	buf[0] = 0;
	if (strncmp(s->o.server_uri, "etcd://", 7))
		return;
	for (int i = 0; i < 5; i++) {
		snprintf(opt, sizeof(opt), "etcd-%s", names[i]);
		if (hkv_cli_value(v, opt) && hkv_etcd_sec_set(&now, names[i], hkv_cli_value(v, opt))) {
			snprintf(buf, cap, "; etcd: out of memory, nothing reloaded");
			goto free_sec;
		}
	}
	memcpy(buf, "; ", 3);
	hkv_etcd_reload(&s->o.etcd, &now, buf + 2, cap - 2);
free_sec:
	hkv_etcd_sec_free(&now);
}

/*
 * SIGHUP (issue 30): the --config file read again; the log level and a
 * cluster's etcd credentials and certificates change at once. The token
 * file needs no reload: the library reads it whenever a handle opens (at
 * start, and after a lost server: see mc_server.h). One line says what was
 * read and what changed; one more per option that needs a restart.
 */
static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	struct mc_server *s = arg;
	enum hkv_log_level was = hkv_log_get_level(), lvl;
	const char *file = hkv_cli_config_file();
	char level[64], etcd[220], **now;

	if (!(now = hkv_cli_values())) {
		hkv_err("SIGHUP: %s has errors (the lines before say which): nothing changed",
			file ? file : "the command line");
		return;
	}
	hkv_cli_values_diff(s->opt_values, now, live_option, "hatchkv-memcached");
	lvl = hkv_cli_value(now, "verbose") ? HKV_LOG_DEBUG : hkv_log_env_level();
	hkv_log_set_level(lvl);
	s->o.verbose = lvl == HKV_LOG_DEBUG;
	if (lvl == was)
		snprintf(level, sizeof(level), "log level %s", hkv_log_level_name(lvl));
	else
		snprintf(level, sizeof(level), "log level %s -> %s", hkv_log_level_name(was),
			 hkv_log_level_name(lvl));
	reload_etcd(s, now, etcd, sizeof(etcd));
	hkv_info("SIGHUP: re-read %s%s; %s; token file: read when a handle opens%s",
		 file ? file : "no --config file", file ? "" : " (options as started)", level,
		 etcd);
	hkv_cli_values_free(s->opt_values);
	s->opt_values = now;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct mc_server *s = arg;

	hkv_info("%s, shutting down", strsignal((int)sig));
	hkv_notify_stopping();
	stopping = 1;
	event_base_loopbreak(s->base);
}

static int start_listener(struct mc_server *s)
{
	struct sockaddr_storage ss;
	int sslen = sizeof(ss);
	char spec[300];
	socklen_t alen = sizeof(ss);

	snprintf(spec, sizeof(spec), strchr(s->o.listen_addr, ':') ? "[%s]" : "%s",
		 s->o.listen_addr);
	if (evutil_parse_sockaddr_port(spec, (struct sockaddr *)&ss, &sslen)) {
		hkv_err("cannot parse listen address %s", spec);
		return -1;
	}
	if (ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)s->o.port);
	else
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)s->o.port);
	s->lis = evconnlistener_new_bind(s->base, on_accept, s,
					 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
					 (struct sockaddr *)&ss, sslen);
	if (!s->lis) {
		hkv_err("cannot listen on %s port %d: %s", spec, s->o.port, strerror(errno));
		return -1;
	}
	s->resume = evtimer_new(s->base, on_accept_resume, s);
	if (!s->resume)
		return -1;
	evconnlistener_set_error_cb(s->lis, on_accept_error);
	getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&ss, &alen);
	s->o.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						    : ((struct sockaddr_in *)&ss)->sin_port);
	hkv_info("listening on %s:%d (memcached text protocol), %d workers x %d requests in "
		 "flight, hatchkv server %s, item size max %zu, connections max %d",
		 s->o.listen_addr, s->o.port, s->nworkers, s->o.depth, s->o.server_uri,
		 s->o.item_max, s->o.max_conns);
	hkv_notify_ready("serving");
	return 0;
}

static int make_config(struct mc_server *s)
{
	const struct hkv_etcd_sec *e = &s->o.etcd;

	s->cfg = hkv_config_new();
	if (!s->cfg)
		return -1;
	if (hkv_config_add_server(s->cfg, s->o.server_uri) ||
	    (s->o.token_file && hkv_config_set_token_file(s->cfg, s->o.token_file)) ||
	    (e->cacert && hkv_config_set_etcd(s->cfg, "cacert", e->cacert)) ||
	    (e->cert && hkv_config_set_etcd(s->cfg, "cert", e->cert)) ||
	    (e->key && hkv_config_set_etcd(s->cfg, "key", e->key)) ||
	    (e->user && hkv_config_set_etcd(s->cfg, "user", e->user)) ||
	    (e->password_file && hkv_config_set_etcd(s->cfg, "password-file", e->password_file)) ||
	    (e->insecure && hkv_config_set_etcd(s->cfg, "insecure", NULL)) ||
	    (s->o.retry_ms >= 0 && hkv_config_set_retry_ms(s->cfg, s->o.retry_ms)) ||
	    hkv_config_set_max_value(s->cfg, s->o.item_max)) {
		hkv_err("bad hatchkv client configuration (server %s)", s->o.server_uri);
		return -1;
	}
	return 0;
}

/* The largest value: -I, capped by what the server's handle accepts. */
static void learn_limits(struct mc_server *s)
{
	struct hkv_server_info si;
	struct hkv_client *h;

	s->max_value = (uint32_t)s->o.item_max;
	if (hkv_open(s->cfg, &h))
		return;
	/* a cluster's servers may refuse for a moment (settling on a new map):
	 * none answered means nothing learnt, never a limit of 0 */
	for (int tries = 0;; tries++) {
		struct timespec ts = {0, 100000000L};

		hkv_server_info(h, &si);
		if (si.max_value || tries == 50)
			break;
		nanosleep(&ts, NULL);
	}
	if (!si.max_value) {
		hkv_warn("no hatchkv server answered yet: values up to -I %zu bytes",
			 s->o.item_max);
		hkv_close(h);
		return;
	}
	/* -I bounds an item (memcached: its header, key and value), as the
	 * server's largest block bounds ours: a value fits when the block
	 * header (HKV_BLOCK_HDR, 56) + key + value <= max_item, so short keys
	 * take values as long as memcached's at the same -I (the library
	 * refuses the rest: "object too large") */
	{
		uint32_t short_max = si.max_item > HKV_BLOCK_HDR + 1
					     ? si.max_item - HKV_BLOCK_HDR - 1
					     : si.max_value;

		if (short_max < s->max_value)
			s->max_value = short_max;
		if (si.max_item && si.max_item < s->o.item_max)
			hkv_warn("the hatchkv server's largest item is %u bytes (its segment size; "
				 "< -I %zu): larger ones are refused", si.max_item, s->o.item_max);
	}
	hkv_info("hatchkv server: %" PRIu64 " MiB of values, %" PRIu64 " index slots, %s mode",
		 si.value_bytes >> 20, si.index_slots, si.cache_mode ? "cache" : "store");
	hkv_close(h);
}

/*
 * The items gauge's walk, off the workers' loops: a handle of its own,
 * one walk every MC_COUNT_BG s (skipped if a `stats` walk is running).
 * A walk READs every index slot and each entry's header and key: on shm
 * ~10 ms for 10^5 items; over RDMA the index's bytes every MC_COUNT_BG s.
 */
#define MC_COUNT_BG 10
static void *counter_main(void *arg)
{
	struct mc_server *s = arg;
	struct hkv_client *h = s->counter_h;

	pthread_mutex_lock(&s->count_lock);
	while (!s->counter_stop) {
		struct timespec until;
		uint64_t n_items, n_bytes;

		pthread_mutex_unlock(&s->count_lock);
		if (!h && hkv_open(s->cfg, &h))
			h = NULL;
		if (h && !pthread_mutex_trylock(&s->walk_lock)) {
			int rc = hkv_count_items(h, &n_items, &n_bytes);

			if (!rc) {
				pthread_mutex_lock(&s->count_lock);
				s->items = n_items;
				s->bytes = n_bytes;
				s->counted_at = time(NULL);
				s->walks++;
				pthread_mutex_unlock(&s->count_lock);
			} else if (rc == HKV_EDISCONNECTED || rc == HKV_ETIMEDOUT) {
				hkv_close(h); /* (opened again next time) */
				h = NULL;
			}
			pthread_mutex_unlock(&s->walk_lock);
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += MC_COUNT_BG;
		pthread_mutex_lock(&s->count_lock);
		if (!s->counter_stop)
			pthread_cond_timedwait(&s->counter_wake, &s->count_lock, &until);
	}
	pthread_mutex_unlock(&s->count_lock);
	hkv_close(h);
	return NULL;
}

static int start_workers(struct mc_server *s)
{
	s->workers = calloc((size_t)s->nworkers, sizeof(*s->workers));
	if (!s->workers)
		return -1;
	for (int i = 0; i < s->nworkers; i++) {
		if (worker_init(s, &s->workers[i], i))
			return -1;
	}
	for (int i = 0; i < s->nworkers; i++) {
		if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i])) {
			s->nworkers = i;
			return -1;
		}
	}
	return 0;
}

static void stop_workers(struct mc_server *s, int started)
{
	/* loopexit, not loopbreak: a break asked before a worker's loop has
	 * started is lost (event_base_loop clears it as it starts), and a
	 * SIGTERM right after READY then waited for ever in the join; the
	 * exit is a timer the loop runs whenever it starts */
	for (int i = 0; i < started; i++)
		event_base_loopexit(s->workers[i].base, NULL);
	for (int i = 0; i < started; i++)
		pthread_join(s->workers[i].thread, NULL);
}

int mc_server_run(const struct mc_options *opts)
{
	struct mc_server s = {.o = *opts, .nworkers = opts->threads};
	struct event *ev_int = NULL, *ev_term = NULL, *ev_quiet[3] = {NULL, NULL, NULL};
	const int quiet[3] = {SIGHUP, SIGUSR1, SIGUSR2};
	event_callback_fn on_quiet[3] = {on_hup, on_ignored_signal, on_ignored_signal};
	int rc = 1, started = 0;

	signal(SIGPIPE, SIG_IGN);
	if (!s.o.depth) /* shm: a round trip is our own CPU's work, nothing to overlap */
		s.o.depth = strncmp(s.o.server_uri, "shm:", 4) ? 8 : 1;
	s.started = time(NULL);
	size_conns(&s);
	pthread_mutex_init(&s.count_lock, NULL);
	pthread_mutex_init(&s.walk_lock, NULL);
	pthread_cond_init(&s.counter_wake, NULL);
	if (evthread_use_pthreads() || make_config(&s))
		goto free_config;
	learn_limits(&s);
	s.base = event_base_new();
	if (!s.base)
		goto free_config;
	if (start_workers(&s)) {
		hkv_err("cannot start the workers (is the hatchkv server at %s running?)",
			s.o.server_uri);
		started = s.workers ? s.nworkers : 0;
		goto free_workers;
	}
	started = s.nworkers;
	s.opt_values = hkv_cli_values(); /* (what a SIGHUP compares with) */
	ev_int = evsignal_new(s.base, SIGINT, on_signal, &s);
	ev_term = evsignal_new(s.base, SIGTERM, on_signal, &s);
	for (int i = 0; i < 3; i++)
		if ((ev_quiet[i] = evsignal_new(s.base, quiet[i], on_quiet[i], &s)))
			event_add(ev_quiet[i], NULL);
	if (s.o.metrics && hkv_open(s.cfg, &s.counter_h)) /* (it tries again later) */
		s.counter_h = NULL;
	if (!ev_int || !ev_term || event_add(ev_int, NULL) || event_add(ev_term, NULL) ||
	    start_listener(&s) || (s.o.metrics && start_metrics(&s)))
		goto free_listener;
	if (s.o.metrics)
		s.counter_started = !pthread_create(&s.counter, NULL, counter_main, &s);
	event_base_dispatch(s.base);
	rc = stopping ? 0 : 1;
free_listener:
	if (s.counter_started) {
		pthread_mutex_lock(&s.count_lock);
		s.counter_stop = 1;
		pthread_cond_broadcast(&s.counter_wake);
		pthread_mutex_unlock(&s.count_lock);
		pthread_join(s.counter, NULL);
	} else {
		hkv_close(s.counter_h);
	}
	hkv_metrics_stop(s.metrics);
	if (s.lis)
		evconnlistener_free(s.lis);
	if (s.resume)
		event_free(s.resume);
	if (ev_int)
		event_free(ev_int);
	if (ev_term)
		event_free(ev_term);
	for (int i = 0; i < 3; i++)
		if (ev_quiet[i])
			event_free(ev_quiet[i]);
free_workers:
	stop_workers(&s, started);
	for (int i = 0; s.workers && i < opts->threads; i++)
		worker_destroy(&s.workers[i]);
	free(s.workers);
	event_base_free(s.base);
	hkv_info("stopped");
free_config:
	hkv_cli_values_free(s.opt_values);
	hkv_config_free(s.cfg);
	return rc;
}
