/*
 * cluster.c - a member's side of the cluster in etcd (see cluster.h): its
 * lease and the keepalive thread, registering (again), fencing, the check
 * of the map's revision after a rejoin, one round's read of PREFIX/, the
 * round loop, start/stop and the public API; server/cluster_int.h names the
 * other files.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "hatchkv_err.h"
#include "server/cluster.h"
#include "server/cluster_int.h"
#include "server/filler.h"
#include "server/mover.h"

#define REJOIN_READING (-1) /* registered again; the map not read yet */

/* CLOCK_BOOTTIME: it keeps counting through a suspend, as etcd's lease does. */
uint64_t hkv_cl_boot_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int hkv_cluster_fenced(struct hkv_cluster *cl)
{
	uint64_t limit = (uint64_t)cl->ttl_s * 1000000000ull - HKV_CLUSTER_GUARD_MS * 1000000ull;

	return atomic_load(&cl->removed) || atomic_load(&cl->lease_gone) ||
	       atomic_load(&cl->rejoin) || atomic_load(&cl->move_fence) ||
	       atomic_load(&cl->settle) ||
	       hkv_cl_boot_ns() - atomic_load(&cl->ok_sent_ns) >= limit;
}

const char *hkv_cluster_fence_reason(struct hkv_cluster *cl)
{
	if (atomic_load(&cl->removed))
		return "removed by an operator";
	if (atomic_load(&cl->move_fence))
		return "giving up partitions (a move)";
	if (atomic_load(&cl->settle))
		return "settling its region with the map";
	if (atomic_load(&cl->lease_gone) || atomic_load(&cl->rejoin))
		return "the cluster lease is gone";
	return "cannot renew the cluster lease in time";
}

int64_t hkv_cluster_fill_rev(struct hkv_cluster *cl)
{
	return atomic_load(&cl->fill_live);
}

int hkv_cluster_rejoined(struct hkv_cluster *cl)
{
	int r = atomic_load(&cl->rejoin);

	if (r == REJOIN_READING || !atomic_compare_exchange_strong(&cl->rejoin, &r, 0))
		return 0;
	return r;
}

/* Is the lease surely alive now (see hkv_cluster_fenced)? */
static int lease_alive(struct hkv_cluster *cl)
{
	uint64_t limit = (uint64_t)cl->ttl_s * 1000000000ull - HKV_CLUSTER_GUARD_MS * 1000000ull;

	return !atomic_load(&cl->lease_gone) && !atomic_load(&cl->rejoin) &&
	       hkv_cl_boot_ns() - atomic_load(&cl->ok_sent_ns) < limit;
}

int hkv_cluster_removed(struct hkv_cluster *cl)
{
	return atomic_load(&cl->removed);
}

const char *hkv_cluster_id(const struct hkv_cluster *cl)
{
	return cl->id;
}

int hkv_cluster_store_mode(const struct hkv_cluster *cl)
{
	return cl->store_mode;
}

void hkv_cluster_job_free(struct hkv_cluster_job *job)
{
	if (!job)
		return;
	if (job->map)
		hkv_cmap_free(job->map);
	if (job->cur)
		hkv_cmap_free(job->cur);
	hkv_free(job->map);
	hkv_free(job->cur);
	hkv_free(job->homes);
	hkv_free(job->tag);
	hkv_free(job);
}

struct hkv_cluster_job *hkv_cluster_take_job(struct hkv_cluster *cl)
{
	struct hkv_cluster_job *j;

	pthread_mutex_lock(&cl->lock);
	j = cl->job;
	cl->job = NULL;
	pthread_mutex_unlock(&cl->lock);
	return j;
}

void hkv_cluster_job_done(struct hkv_cluster *cl, const struct hkv_cluster_job *job, int ret)
{
	pthread_mutex_lock(&cl->lock);
	atomic_store(&cl->copying, ret == HKV_JOB_PENDING);
	if (ret == HKV_JOB_PENDING) { /* taken over: the real answer comes later */
		pthread_mutex_unlock(&cl->lock);
		return;
	}
	cl->done = 1;
	cl->done_kind = (int)job->kind;
	cl->done_rev = job->rev;
	cl->done_gen = job->gen;
	cl->done_ret = ret;
	pthread_cond_broadcast(&cl->wake); /* act on it at once */
	pthread_mutex_unlock(&cl->lock);
}

int hkv_cluster_copy_void(struct hkv_cluster *cl, const struct hkv_cluster_job *job)
{
	return atomic_load(&cl->next_live) != job->rev || atomic_load(&cl->gen_live) != job->gen;
}

void hkv_cluster_copy_attach(struct hkv_cluster *cl, struct hkv_move *mv)
{
	cl->move = mv;
}

/*
 * Progress records (cluster.h): written by the copy's or the pass's thread,
 * read by any. rev is stored last when one begins and first when it ends,
 * so a reader that finds rev set finds the figures of that run (or of the
 * next, if it began meanwhile).
 */
static struct progress_rec {
	_Atomic int64_t rev;
	_Atomic uint32_t pass;
	atomic_int final;
	_Atomic uint64_t started_ms, bytes, items, bytes_total, items_total;
} progress[HKV_PROGRESS_KINDS];

static uint64_t unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void hkv_cluster_progress_begin(enum hkv_progress_kind k, int64_t rev, uint32_t pass, int final)
{
	struct progress_rec *p = &progress[k];

	atomic_store(&p->rev, 0);
	atomic_store(&p->pass, pass);
	atomic_store(&p->final, final);
	atomic_store(&p->started_ms, unix_ms());
	atomic_store(&p->bytes, 0);
	atomic_store(&p->items, 0);
	atomic_store(&p->bytes_total, HKV_PROGRESS_UNKNOWN);
	atomic_store(&p->items_total, HKV_PROGRESS_UNKNOWN);
	atomic_store(&p->rev, rev ? rev : -1);
}

void hkv_cluster_progress_total(enum hkv_progress_kind k, uint64_t bytes, uint64_t items)
{
	atomic_store_explicit(&progress[k].bytes_total, bytes, memory_order_relaxed);
	atomic_store_explicit(&progress[k].items_total, items, memory_order_relaxed);
}

void hkv_cluster_progress_add(enum hkv_progress_kind k, uint64_t bytes, uint64_t items)
{
	/* (one writer: a load and a store, no locked add) */
	atomic_store_explicit(&progress[k].bytes,
			      atomic_load_explicit(&progress[k].bytes, memory_order_relaxed) + bytes,
			      memory_order_relaxed);
	atomic_store_explicit(&progress[k].items,
			      atomic_load_explicit(&progress[k].items, memory_order_relaxed) + items,
			      memory_order_relaxed);
}

void hkv_cluster_progress_end(enum hkv_progress_kind k)
{
	atomic_store(&progress[k].rev, 0);
}

void hkv_cluster_progress_read(enum hkv_progress_kind k, struct hkv_progress *out)
{
	const struct progress_rec *p = &progress[k];

	memset(out, 0, sizeof(*out));
	out->rev = atomic_load(&p->rev);
	if (!out->rev)
		return;
	out->pass = atomic_load(&p->pass);
	out->final = atomic_load(&p->final);
	out->started = (double)atomic_load(&p->started_ms) / 1e3;
	out->bytes = atomic_load_explicit(&p->bytes, memory_order_relaxed);
	out->items = atomic_load_explicit(&p->items, memory_order_relaxed);
	out->bytes_total = atomic_load_explicit(&p->bytes_total, memory_order_relaxed);
	out->items_total = atomic_load_explicit(&p->items_total, memory_order_relaxed);
}

/* Sleep up to ms, or until stop / a purge / a lost lease wakes us. */
static void nap(struct hkv_cluster *cl, int ms)
{
	struct timespec until;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	until.tv_sec += ms / 1000 + until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&cl->lock);
	if (!cl->stop)
		pthread_cond_timedwait(&cl->wake, &cl->lock, &until);
	pthread_mutex_unlock(&cl->lock);
}

static int stopping(struct hkv_cluster *cl)
{
	int s;

	pthread_mutex_lock(&cl->lock);
	s = cl->stop;
	pthread_mutex_unlock(&cl->lock);
	return s;
}

static void etcd_trouble(uint64_t *log_ns, const char *what, int err)
{
	uint64_t now = hkv_cl_boot_ns();

	if (now - *log_ns < 5000000000ull)
		return;
	*log_ns = now;
	hkv_warn("cluster: %s: %s", what, hkv_strerror(err));
}

static int snap_read(struct hkv_cluster *cl, struct snap *sn, int64_t *rev)
{
	char key[300];

	snprintf(key, sizeof(key), "%s/", cl->prefix);
	return hkv_etcd_range(cl->e, key, 1, &sn->kvs, &sn->n, rev);
}

static void snap_free(struct snap *sn)
{
	hkv_etcd_kvs_free(sn->kvs, sn->n);
	sn->kvs = NULL;
	sn->n = 0;
}

void hkv_cl_key_of(const struct hkv_cluster *cl, char *key, size_t cap, const char *dir,
		   const char *id)
{
	if (id)
		snprintf(key, cap, "%s/%s/%s", cl->prefix, dir, id);
	else
		snprintf(key, cap, "%s/%s", cl->prefix, dir);
}

/* PREFIX/dir/id (id NULL: PREFIX/dir), or NULL. */
const struct hkv_etcd_kv *hkv_cl_snap_get(const struct hkv_cluster *cl, const struct snap *sn,
					  const char *dir, const char *id)
{
	char key[512];

	hkv_cl_key_of(cl, key, sizeof(key), dir, id);
	for (int i = 0; i < sn->n; i++)
		if (!strcmp(sn->kvs[i].key, key))
			return &sn->kvs[i];
	return NULL;
}

int hkv_cl_is_member(struct hkv_cluster *cl, const struct snap *sn, const char *id)
{
	return hkv_cl_snap_get(cl, sn, "servers", id) != NULL;
}

static int is_removed(struct hkv_cluster *cl)
{
	struct hkv_etcd_kv *kvs;
	int n, ret = hkv_etcd_range(cl->e, cl->removed_key, 0, &kvs, &n, NULL);

	if (ret)
		return ret;
	hkv_etcd_kvs_free(kvs, n);
	return n > 0;
}

/* A new lease and our member key under it. 0, -EEXIST (a live member has
 * our ID), -EPERM (removed by an operator) or etcd's error. Whatever this
 * server had acked or fenced for belonged to its old lease. */
static int do_register(struct hkv_cluster *cl)
{
	uint64_t t_sent = hkv_cl_boot_ns();
	int64_t lease, rev;
	int ret;

	ret = is_removed(cl);
	if (ret)
		return ret < 0 ? ret : -EPERM;
	ret = hkv_etcd_lease_grant(cl->e, cl->ttl_s, &lease);
	if (ret)
		return ret;
	ret = hkv_etcd_put_if(cl->e, cl->member_key, cl->member_json, strlen(cl->member_json), 0,
			      lease, &rev);
	if (ret) {
		hkv_etcd_lease_revoke(cl->e, lease);
		return ret == -ECANCELED ? -EEXIST : ret;
	}
	atomic_store(&cl->ok_sent_ns, t_sent);
	atomic_store(&cl->lease, lease);
	cl->leader = 0;
	cl->acked_rev = cl->fence_rev = cl->next_seen_rev = 0;
	cl->purged_rev = cl->copied_rev = cl->intaken_rev = cl->ready_rev = 0;
	cl->fill_rev = cl->fill_in_rev = 0;
	cl->fill_state = FILL_COPYING;
	if (cl->fill_in_map) {
		hkv_cmap_free(cl->fill_in_map);
		hkv_free(cl->fill_in_map);
		cl->fill_in_map = NULL;
	}
	cl->reg_gen++;
	atomic_store(&cl->gen_live, cl->reg_gen);
	cl->registrations++;
	cl->ngone = 0;   /* (measures of an earlier term are void) */
	cl->job_out = 0; /* (an answer from before is void: see reg_gen) */
	cl->settle_issued = 0;
	if (cl->store_mode) /* what we hold may be partitions we no longer have */
		atomic_store(&cl->settle, 1);
	return 0;
}

/* A keepalive that etcd could not answer (electing a leader, a member that
 * stopped answering) is tried again this soon, not a period later: the
 * fence comes TTL - 1 s after the last answered one and ends with the next,
 * which a full period's nap would put off. */
#define KEEPALIVE_RETRY_MS 100

/* The lease, on a thread and an etcd connection of its own, so that no
 * slow coordination request delays a keepalive. */
static void *keepalive_thread(void *arg)
{
	struct hkv_cluster *cl = arg;
	int period_ms = cl->ttl_s * 1000 / 3;

	while (!stopping(cl)) {
		int64_t lease = atomic_load(&cl->lease);
		uint64_t t_sent = hkv_cl_boot_ns();
		int ret = 0, ttl = 0;

		if (lease && !atomic_load(&cl->lease_gone)) {
			ret = hkv_etcd_lease_keepalive(cl->ke, lease, &ttl);
			if (atomic_load(&cl->lease) != lease)
				continue; /* registered anew meanwhile */
			if (!ret && ttl > 0) {
				atomic_store(&cl->ok_sent_ns, t_sent);
			} else if (ret == -ENOENT || (!ret && ttl <= 0)) {
				hkv_warn("cluster: lease of %s is gone: fenced until registered again",
					 cl->id);
				atomic_store(&cl->lease_gone, 1);
				atomic_fetch_add(&cl->leases_lost, 1);
				pthread_mutex_lock(&cl->lock);
				pthread_cond_broadcast(&cl->wake);
				pthread_mutex_unlock(&cl->lock);
			} else {
				etcd_trouble(&cl->klog_ns, "lease keepalive", ret);
			}
		}
		nap(cl, ret == -ETIMEDOUT || ret == -EIO || ret == -ECONNREFUSED ? KEEPALIVE_RETRY_MS
										 : period_ms);
	}
	return NULL;
}

/*
 * The map read by the round just done: as the map served under while the
 * lease is surely alive; right after a re-registration, the answer to
 * "did anything move while we were away?" (issue 29: an etcd stall, or a
 * stall of ours, that ends with the same map costs no item). A map read
 * after the lease ended could already have re-homed our partitions; it is
 * never recorded, because the lease was not surely alive then.
 */
static void map_after_rejoin(struct hkv_cluster *cl, const struct snap *sn)
{
	const struct hkv_etcd_kv *mk = hkv_cl_snap_get(cl, sn, "map", NULL);
	int64_t rev = mk ? mk->mod_rev : 0;
	int r = REJOIN_READING;

	if (atomic_load(&cl->rejoin) == REJOIN_READING) {
		int keep = rev && rev == cl->served_map_rev;

		hkv_info("cluster: %s: the map is %s it served under (revision %lld): %s", cl->id,
			 keep ? "the one" : "not the one", (long long)rev,
			 keep ? "keeping its items" : "its items may be stale");
		atomic_compare_exchange_strong(&cl->rejoin, &r,
					       keep ? HKV_REJOIN_KEEP : HKV_REJOIN_EMPTY);
		return;
	}
	if (lease_alive(cl))
		cl->served_map_rev = rev;
}

/*
 * The figures the metrics page shows (cluster.h hkv_cluster_status), worked
 * out by the coordination thread after each round from that round's read.
 * The map, a move's and a repair's are parsed again only when their etcd
 * revision changes, and who gives up partitions or copies them only then:
 * a round with nothing new costs a pass over the map's lists (partitions x
 * replicas, a byte looked up each) and a look-up of each server it names
 * and of each loser's ack. Everything here is the coordination thread's;
 * the result goes to cl->shown under the lock.
 */
struct kept_map {
	struct hkv_cmap m;
	int64_t rev;  /* the etcd key's mod_revision; 0: absent */
	int64_t base; /* PREFIX/next, PREFIX/fill: the map revision it was made on */
	int ok;       /* parsed */
};

struct cl_watch {
	struct kept_map map, next, fill;
	uint8_t *live;       /* map.names[i] is a member (this round) */
	uint8_t *loser;      /* map.names[i] gives partitions up in next */
	uint8_t *source;     /* map.names[i] copies partitions in fill */
	int64_t losers_of[2], sources_of[2]; /* {map rev, next/fill rev} loser/source are for */
	uint32_t move_partitions, repair_partitions;
	uint64_t next_ns, fill_ns; /* when next, fill were first seen */
};

/* Keep k parsed from kv (wrapped: PREFIX/next's and PREFIX/fill's
 * {"base":...,"map":...}); 1 if it changed. */
static int keep_map(struct kept_map *k, const struct hkv_etcd_kv *kv, int wrapped)
{
	if ((kv ? kv->mod_rev : 0) == k->rev)
		return 0;
	hkv_cmap_free(&k->m);
	memset(k, 0, sizeof(*k));
	if (!kv)
		return 1;
	k->rev = kv->mod_rev;
	k->ok = !(wrapped ? hkv_cl_next_parse(kv, &k->m, &k->base)
			  : hkv_cmap_parse(kv->value, kv->vlen, &k->m));
	if (!k->ok) {
		hkv_cmap_free(&k->m);
		memset(&k->m, 0, sizeof(k->m));
	}
	return 1;
}

static void watch_free(struct cl_watch *w)
{
	if (!w)
		return;
	keep_map(&w->map, NULL, 0);
	keep_map(&w->next, NULL, 1);
	keep_map(&w->fill, NULL, 1);
	hkv_free(w->live);
	hkv_free(w->loser);
	hkv_free(w->source);
	hkv_free(w);
}

static int lists_differ(const struct hkv_cmap *a, const struct hkv_cmap *b, uint32_t p)
{
	if (hkv_cmap_len(a, p) != hkv_cmap_len(b, p))
		return 1;
	for (uint32_t r = 0; r < hkv_cmap_len(a, p); r++)
		if (strcmp(hkv_cmap_server(a, p, r), hkv_cmap_server(b, p, r)))
			return 1;
	return 0;
}

/* The map's figures, with w->live (who of its names is a member) set. */
static void count_map(struct hkv_cluster *cl, const struct snap *sn, struct cl_watch *w,
		      struct hkv_cluster_status *st)
{
	const struct hkv_cmap *m = &w->map.m;
	uint32_t self = m->nnames;

	st->map_rev = w->map.rev;
	st->partitions = m->partitions;
	st->replicas = m->replicas;
	st->map_servers = m->nnames;
	for (uint32_t i = 0; i < m->nnames; i++) {
		w->live[i] = hkv_cl_is_member(cl, sn, m->names[i]);
		st->map_servers_down += !w->live[i];
		if (!strcmp(m->names[i], cl->id))
			self = i;
	}
	for (uint32_t p = 0; p < m->partitions; p++) {
		const uint16_t *list = &m->repl[(size_t)p * m->replicas];
		uint32_t len = hkv_cmap_len(m, p), alive = 0;

		for (uint32_t r = 0; r < len; r++) {
			alive += w->live[list[r]];
			if (list[r] == self && r == 0)
				st->primary++;
			else if (list[r] == self)
				st->backup++;
		}
		st->under_replicated += len < m->replicas;
		st->unavailable += !alive;
	}
}

/* A move under way on the map we read: which lists change, who gives
 * partitions up (once per move), and who of them acked it (each round). */
static void count_move(struct hkv_cluster *cl, const struct snap *sn, struct cl_watch *w,
		       struct hkv_cluster_status *st)
{
	const struct hkv_cmap *m = &w->map.m, *n = &w->next.m;

	if (w->losers_of[0] != w->map.rev || w->losers_of[1] != w->next.rev) {
		w->move_partitions = 0;
		for (uint32_t p = 0; p < m->partitions && p < n->partitions; p++)
			w->move_partitions += lists_differ(m, n, p);
		for (uint32_t i = 0; i < m->nnames; i++)
			w->loser[i] = (uint8_t)hkv_cl_loses(m, n, m->names[i]);
		w->losers_of[0] = w->map.rev;
		w->losers_of[1] = w->next.rev;
	}
	st->move_partitions = w->move_partitions;
	for (uint32_t i = 0; i < m->nnames; i++) {
		const struct hkv_etcd_kv *ak;

		if (!w->loser[i])
			continue;
		st->move_servers++;
		ak = hkv_cl_snap_get(cl, sn, "ack", m->names[i]);
		st->move_acked += ak && strtoll(ak->value, NULL, 10) == w->next.rev;
	}
}

/* A repair under way on the map we read: which lists grow, which primaries
 * copy (once per repair), and which of them said their passes converged. */
static void count_repair(struct hkv_cluster *cl, const struct snap *sn, struct cl_watch *w,
			 struct hkv_cluster_status *st)
{
	const struct hkv_cmap *m = &w->map.m, *f = &w->fill.m;

	if (w->sources_of[0] != w->map.rev || w->sources_of[1] != w->fill.rev) {
		w->repair_partitions = 0;
		for (uint32_t p = 0; p < m->partitions && p < f->partitions; p++)
			w->repair_partitions += hkv_cmap_grows(m, f, p);
		for (uint32_t i = 0; i < m->nnames; i++)
			w->source[i] = (uint8_t)hkv_fill_source(m, f, m->names[i]);
		w->sources_of[0] = w->map.rev;
		w->sources_of[1] = w->fill.rev;
	}
	st->repair_partitions = w->repair_partitions;
	for (uint32_t i = 0; i < m->nnames; i++) {
		const struct hkv_etcd_kv *dk;

		if (!w->source[i])
			continue;
		st->repair_servers++;
		dk = hkv_cl_snap_get(cl, sn, "filled", m->names[i]);
		st->repair_filled += dk && strtoll(dk->value, NULL, 10) == w->fill.rev &&
				     !strstr(dk->value, "failed");
	}
}

/* (Re)size the per-name arrays after the map changed; 0 or -ENOMEM. */
static int watch_names(struct cl_watch *w)
{
	size_t n = (size_t)w->map.m.nnames + 1;

	hkv_free(w->live);
	hkv_free(w->loser);
	hkv_free(w->source);
	w->live = hkv_calloc(n, 1);
	w->loser = hkv_calloc(n, 1);
	w->source = hkv_calloc(n, 1);
	w->losers_of[0] = w->losers_of[1] = w->sources_of[0] = w->sources_of[1] = -1;
	return w->live && w->loser && w->source ? 0 : -ENOMEM;
}

/* After a round that read PREFIX/: work out and publish its figures. */
static void watch_round(struct hkv_cluster *cl, const struct snap *sn)
{
	struct hkv_cluster_status st = {0};
	const struct hkv_etcd_kv *ck = hkv_cl_snap_get(cl, sn, "coordinator", NULL);
	struct cl_watch *w = cl->watch;
	uint64_t now = hkv_cl_boot_ns();
	char dir[300];
	size_t dl;

	if (!w && !(w = cl->watch = hkv_calloc(1, sizeof(*w))))
		return;
	if (keep_map(&w->map, hkv_cl_snap_get(cl, sn, "map", NULL), 0) && watch_names(w)) {
		keep_map(&w->map, NULL, 0); /* (no memory: read it again next round) */
		return;
	}
	if (keep_map(&w->next, hkv_cl_snap_get(cl, sn, "next", NULL), 1))
		w->next_ns = now;
	if (keep_map(&w->fill, hkv_cl_snap_get(cl, sn, "fill", NULL), 1))
		w->fill_ns = now;
	st.coordinator = cl->leader;
	st.term = ck ? ck->create_rev : 0;
	hkv_cl_key_of(cl, dir, sizeof(dir), "servers", "");
	dl = strlen(dir);
	for (int i = 0; i < sn->n; i++)
		st.members += !strncmp(sn->kvs[i].key, dir, dl);
	if (w->map.ok)
		count_map(cl, sn, w, &st);
	st.move = w->next.rev != 0;
	if (st.move && w->map.ok && w->next.ok && w->next.base == w->map.rev)
		count_move(cl, sn, w, &st);
	st.repair = w->fill.rev != 0;
	if (st.repair && w->map.ok && w->fill.ok && w->fill.base == w->map.rev)
		count_repair(cl, sn, w, &st);
	st.moves_committed = cl->moves_committed;
	st.moves_dropped = cl->moves_dropped;
	st.repairs_filled = cl->repairs_filled;
	st.repairs_dropped = cl->repairs_dropped;
	memcpy(st.jobs, cl->jobs, sizeof(st.jobs));
	st.registrations = cl->registrations;
	pthread_mutex_lock(&cl->lock);
	cl->shown = st;
	cl->shown_view_ns = now;
	cl->shown_move_ns = w->next_ns;
	cl->shown_fill_ns = w->fill_ns;
	pthread_mutex_unlock(&cl->lock);
}

/* Seconds, to the millisecond (what a page shows). */
static double ms_of(uint64_t ns)
{
	return (double)(ns / 1000000) / 1e3;
}

void hkv_cluster_status(struct hkv_cluster *cl, struct hkv_cluster_status *st)
{
	uint64_t view_ns, move_ns, fill_ns, now, since;
	uint64_t ttl_ns = (uint64_t)cl->ttl_s * 1000000000ull;

	pthread_mutex_lock(&cl->lock);
	*st = cl->shown;
	view_ns = cl->shown_view_ns;
	move_ns = cl->shown_move_ns;
	fill_ns = cl->shown_fill_ns;
	pthread_mutex_unlock(&cl->lock);
	now = hkv_cl_boot_ns();
	st->view_age_s = view_ns ? ms_of(now - view_ns) : -1;
	st->move_s = st->move ? ms_of(now - move_ns) : 0;
	st->repair_s = st->repair ? ms_of(now - fill_ns) : 0;
	since = now - atomic_load(&cl->ok_sent_ns);
	st->lease_ttl_s = cl->ttl_s;
	st->lease_left_s = atomic_load(&cl->lease_gone) || since >= ttl_ns ? 0 : ms_of(ttl_ns - since);
	st->leases_lost = atomic_load(&cl->leases_lost);
	if (atomic_load(&cl->lease_gone))
		st->coordinator = 0; /* (its key went with the lease; no round says so yet) */
}

/*
 * PREFIX/progress/ID: what a copy or a repair pass of ours has done, for
 * `hatchkv-admin status` (which reads etcd only). Put under our lease when
 * one begins and then at most once a second while it runs (a copy's or a
 * pass's round looks every 20 ms: job_out), deleted once none runs. Each put
 * wakes every member's and client's watch of PREFIX/ (one read each), so it
 * is kept to that rate. A copy and a pass never run at once on one member
 * (a store has no repairs; a replicated store's copy is a pass); were they
 * to, the copy is shown.
 */
static void publish_progress(struct hkv_cluster *cl)
{
	struct hkv_progress pg;
	char key[512], val[512], total[64], items_total[64];
	uint64_t now = hkv_cl_boot_ns();
	int k, ret;

	for (k = 0; k < HKV_PROGRESS_KINDS; k++) {
		hkv_cluster_progress_read((enum hkv_progress_kind)k, &pg);
		if (pg.rev)
			break;
	}
	hkv_cl_key_of(cl, key, sizeof(key), "progress", cl->id);
	if (k == HKV_PROGRESS_KINDS) {
		if (cl->progress_put && !(ret = hkv_etcd_delete(cl->e, key, 0, NULL)))
			cl->progress_put = 0;
		return;
	}
	if (cl->progress_put && now - cl->progress_ns < 1000000000ull)
		return;
	snprintf(total, sizeof(total), "%llu", (unsigned long long)pg.bytes_total);
	snprintf(items_total, sizeof(items_total), "%llu", (unsigned long long)pg.items_total);
	snprintf(val, sizeof(val),
		 "{\"kind\":\"%s\",\"rev\":%lld,\"pass\":%u,\"final\":%s,\"started\":%.3f,"
		 "\"at\":%.3f,\"bytes\":%llu,\"bytes_total\":%s,\"items\":%llu,"
		 "\"items_total\":%s}",
		 k == HKV_PROGRESS_COPY ? "copy" : "repair", (long long)pg.rev, pg.pass,
		 pg.final ? "true" : "false", pg.started, (double)unix_ms() / 1e3,
		 (unsigned long long)pg.bytes,
		 pg.bytes_total == HKV_PROGRESS_UNKNOWN ? "null" : total,
		 (unsigned long long)pg.items,
		 pg.items_total == HKV_PROGRESS_UNKNOWN ? "null" : items_total);
	ret = hkv_etcd_put(cl->e, key, val, strlen(val), atomic_load(&cl->lease), NULL);
	if (ret) {
		etcd_trouble(&cl->log_ns, "publishing progress", ret);
		return;
	}
	cl->progress_put = 1;
	cl->progress_ns = now;
}

/*
 * Each round: registration if the lease is gone, then one read of PREFIX/
 * that every decision of the round works from. Between rounds it waits on
 * an etcd watch of PREFIX/ (a member joining or leaving, an ack, a map), so
 * it reacts at once; while nothing changes the watch ends after 300 ms and
 * the round runs anyway (a lost lease the keepalive thread noticed, a
 * coordinator's waits: acted on within that, at a read and a watch of
 * PREFIX/ per member every 300 ms); while a purge of ours is to be acked
 * it looks every 20 ms instead.
 */
static void *cluster_thread(void *arg)
{
	struct hkv_cluster *cl = arg;
	char dir[300];

	snprintf(dir, sizeof(dir), "%s/", cl->prefix);
	while (!stopping(cl)) {
		int64_t rev = 0, got;
		int ret;

		if (atomic_load(&cl->lease_gone) && !atomic_load(&cl->removed)) {
			ret = do_register(cl);
			if (!ret) {
				hkv_info("cluster: %s registered again", cl->id);
				atomic_store(&cl->rejoin, REJOIN_READING);
				atomic_store(&cl->lease_gone, 0);
			} else if (ret == -EPERM) {
				hkv_warn("cluster: %s was removed by an operator", cl->id);
				atomic_store(&cl->removed, 1);
			} else {
				etcd_trouble(&cl->log_ns, "register", ret);
			}
		}
		if (!atomic_load(&cl->lease_gone)) {
			struct snap sn = {0};
			int read_ok;

			ret = snap_read(cl, &sn, &rev);
			if (!ret)
				map_after_rejoin(cl, &sn);
			read_ok = !ret;
			if (ret) {
				etcd_trouble(&cl->log_ns, "reading the cluster", ret);
				rev = 0;
			} else if (hkv_cl_snap_get(cl, &sn, "removed", cl->id)) {
				hkv_warn("cluster: %s was removed by an operator", cl->id);
				atomic_store(&cl->removed, 1);
			} else if ((ret = hkv_cl_follow_move(cl, &sn))) {
				etcd_trouble(&cl->log_ns, "following a move", ret);
			} else if ((ret = hkv_cl_coordinate(cl, &sn))) {
				etcd_trouble(&cl->log_ns, "coordination", ret);
			}
			if (read_ok)
				watch_round(cl, &sn);
			if (read_ok && !atomic_load(&cl->removed))
				publish_progress(cl);
			snap_free(&sn);
		}
		if (cl->job_out || atomic_load(&cl->settle) ||
		    (atomic_load(&cl->move_fence) && cl->acked_rev != cl->fence_rev))
			nap(cl, 20); /* our job, our ack: act on them soon */
		else if (rev && !atomic_load(&cl->removed) && !atomic_load(&cl->lease_gone))
			/* (300 ms: a lost lease, noticed by the keepalive thread,
			 * is acted on within that; so is a member gone) */
			hkv_etcd_watch_wait(cl->e, dir, 1, rev, 300, &got);
		else
			nap(cl, 200);
	}
	return NULL;
}

struct hkv_cluster *hkv_cluster_start(const struct hkv_cluster_opts *o)
{
	struct hkv_cluster *cl;
	struct hkv_cmember m = {0};
	pthread_condattr_t ca;
	int ret;

	if (!hkv_cluster_id_valid(o->id) || o->ttl_s < 2 || !o->partitions ||
	    o->partitions > HKV_CLUSTER_MAX_PARTS || strlen(o->endpoint) >= sizeof(m.endpoint)) {
		errno = EINVAL;
		return NULL;
	}
	cl = hkv_calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->e = hkv_etcd_open_sec(o->uri, o->etcd, 3000);
	/* a keepalive that takes longer than a third of the TTL is as good as lost */
	cl->ke = hkv_etcd_open_sec(o->uri, o->etcd, o->ttl_s * 1000 / 3);
	if (!cl->e || !cl->ke) {
		ret = -errno;
		goto close_etcd;
	}
	snprintf(cl->prefix, sizeof(cl->prefix), "%s", hkv_etcd_prefix(cl->e));
	snprintf(cl->id, sizeof(cl->id), "%s", o->id);
	hkv_cl_key_of(cl, cl->member_key, sizeof(cl->member_key), "servers", o->id);
	hkv_cl_key_of(cl, cl->removed_key, sizeof(cl->removed_key), "removed", o->id);
	cl->ttl_s = o->ttl_s;
	cl->partitions = o->partitions;
	cl->replicas = o->replicas ? o->replicas : 1;
	cl->route_lease_ms = o->route_lease_ms ? o->route_lease_ms : HKV_CLUSTER_ROUTE_LEASE_MS;
	cl->store_mode = o->store_mode;
	snprintf(m.id, sizeof(m.id), "%s", o->id);
	snprintf(m.endpoint, sizeof(m.endpoint), "%s", o->endpoint);
	snprintf(m.transport, sizeof(m.transport), "%s", o->transport);
	m.region_bytes = o->region_bytes;
	cl->member_json = hkv_cmember_format(&m);
	if (!cl->member_json) {
		ret = -ENOMEM;
		goto close_etcd;
	}
	ret = do_register(cl);
	/* our name is held: by our own earlier life (killed, restarted within
	 * its lease: it ends within a TTL), or by another live server (its
	 * keepalives go on). Wait out one lease, then say which it was. */
	if (ret == -EEXIST)
		hkv_info("cluster: %s is still registered (an earlier run of ours?): waiting up "
			 "to %d s for that lease to end", o->id, o->ttl_s + 2);
	for (uint64_t t0 = hkv_cl_boot_ns();
	     ret == -EEXIST && hkv_cl_boot_ns() - t0 < (uint64_t)(o->ttl_s + 2) * 1000000000ull;) {
		struct timespec quarter = {0, 250000000L};

		nanosleep(&quarter, NULL);
		ret = do_register(cl);
	}
	if (ret)
		goto free_json;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cl->wake, &ca);
	pthread_condattr_destroy(&ca);
	ret = -pthread_create(&cl->kthr, NULL, keepalive_thread, cl);
	if (ret)
		goto destroy_sync;
	cl->kthr_started = 1;
	ret = -pthread_create(&cl->thr, NULL, cluster_thread, cl);
	if (ret)
		goto join_keepalive;
	hkv_info("cluster: %s registered in %s (lease %d s)", o->id, o->uri, o->ttl_s);
	return cl;

join_keepalive:
	pthread_mutex_lock(&cl->lock);
	cl->stop = 1;
	pthread_cond_broadcast(&cl->wake);
	pthread_mutex_unlock(&cl->lock);
	pthread_join(cl->kthr, NULL);
destroy_sync:
	pthread_cond_destroy(&cl->wake);
	pthread_mutex_destroy(&cl->lock);
	hkv_etcd_lease_revoke(cl->e, atomic_load(&cl->lease));
free_json:
	hkv_free(cl->member_json);
close_etcd:
	hkv_etcd_close(cl->ke);
	hkv_etcd_close(cl->e);
	hkv_free(cl);
	errno = -ret;
	return NULL;
}

void hkv_cluster_stop(struct hkv_cluster *cl)
{
	if (!cl)
		return;
	pthread_mutex_lock(&cl->lock);
	cl->stop = 1;
	pthread_cond_broadcast(&cl->wake);
	pthread_mutex_unlock(&cl->lock);
	pthread_join(cl->thr, NULL); /* within one watch (1 s) or etcd call */
	pthread_join(cl->kthr, NULL);
	hkv_move_abort(cl->move); /* (the loop has stopped: its slices with it) */
	/* the member key, our acks and our coordinator key go with the lease */
	if (!atomic_load(&cl->lease_gone) &&
	    hkv_etcd_lease_revoke(cl->e, atomic_load(&cl->lease)) == 0)
		hkv_info("cluster: %s left the cluster", cl->id);
	pthread_cond_destroy(&cl->wake);
	pthread_mutex_destroy(&cl->lock);
	hkv_cluster_job_free(cl->job);
	watch_free(cl->watch);
	hkv_free(cl->copy_crs);
	hkv_free(cl->gone);
	hkv_free(cl->member_json);
	hkv_etcd_close(cl->ke);
	hkv_etcd_close(cl->e);
	hkv_free(cl);
}
