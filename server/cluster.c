/* cluster.c - membership, fencing and coordination in etcd (see cluster.h). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "hatchkv_err.h"
#include "server/cluster.h"
#include "server/filler.h"

/* A loser that left (its lease ended) is given up on only once clients
 * that saw it a member can no longer route to it (their route lease). */


struct gone {
	char id[HKV_CLUSTER_ID_MAX];
	uint64_t since_ns; /* first round of this term that found it no member */
};

#define REJOIN_READING (-1) /* registered again; the map not read yet */

struct hkv_cluster {
	struct hkv_etcd *e;  /* the coordination thread's */
	struct hkv_etcd *ke; /* the keepalive thread's */
	char prefix[256], id[HKV_CLUSTER_ID_MAX];
	char member_key[512], removed_key[512];
	char *member_json;
	int ttl_s;
	uint32_t partitions, replicas;
	uint32_t route_lease_ms; /* for the first map (--route-lease-ms) */
	uint32_t map_lease_ms;   /* the route lease of the last map we read */
	uint32_t first_n;  /* replicated: members seen before the first map, since */
	uint64_t first_ns;
	pthread_t thr, kthr;
	int kthr_started;
	pthread_mutex_t lock;
	pthread_cond_t wake; /* CLOCK_MONOTONIC */
	int stop;            /* under lock */
	_Atomic int64_t lease;
	_Atomic uint64_t ok_sent_ns; /* CLOCK_BOOTTIME: sending time of the last answered keepalive */
	atomic_int lease_gone, rejoin, removed;
	int store_mode;
	/* Moves (cluster.h): while PREFIX/next takes partitions from us we are
	 * fenced. Store mode: also until the region holds only what the map
	 * places on us (settle: after each registration, after each move). */
	atomic_int move_fence, settle;
	_Atomic int64_t fill_live; /* PREFIX/fill's revision as last read (0: none) */
	/* Jobs for the loop, one at a time (cluster.h): job is issued and not
	 * yet taken, done_* the loop's answer (all under lock). */
	struct hkv_cluster_job *job;
	int done, done_kind, done_ret;
	uint32_t done_gen;
	int64_t done_rev;
	/* the coordination thread's */
	int leader;
	int job_out;      /* a job issued, no answer yet */
	uint32_t reg_gen; /* registrations: answers to jobs of an older one are void */
	int settle_issued;
	int64_t acked_rev, fence_rev, purged_rev, copied_rev, intaken_rev, ready_rev;
	int copy_failures;
	uint64_t fence_ns;
	char *copy_crs; /* store mode: the registrations of the new homes a copy went to */
	int64_t next_seen_rev;
	uint64_t next_seen_ns, log_ns;
	/* the map's revision as last read while the lease was surely alive:
	 * a re-registration that finds the same one lost nothing (0: none) */
	int64_t served_map_rev;
	struct gone *gone;
	uint32_t ngone;
	/* repair (PREFIX/fill): as a primary that copies, the fill's revision,
	 * how far its passes are, failed passes; as a new replica, the fill we
	 * took in and said ready for, and its map (the move that ends it keeps
	 * what came in) */
	int64_t fill_rev, fill_in_rev;
	int fill_state; /* FILL_* */
	int fill_failures;
	struct hkv_cmap *fill_in_map;
	uint64_t fill_after_ns; /* the coordinator's: no new fill before (a failed one) */
	char fill_failed[HKV_CLUSTER_ID_MAX]; /* the new replica of the last failed fill */
	/* the keepalive thread's */
	uint64_t klog_ns;
};

/* CLOCK_BOOTTIME: it keeps counting through a suspend, as etcd's lease does. */
static uint64_t boot_ns(void)
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
	       boot_ns() - atomic_load(&cl->ok_sent_ns) >= limit;
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
	       boot_ns() - atomic_load(&cl->ok_sent_ns) < limit;
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
	cl->done = 1;
	cl->done_kind = (int)job->kind;
	cl->done_rev = job->rev;
	cl->done_gen = job->gen;
	cl->done_ret = ret;
	pthread_cond_broadcast(&cl->wake); /* act on it at once */
	pthread_mutex_unlock(&cl->lock);
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
	uint64_t now = boot_ns();

	if (now - *log_ns < 5000000000ull)
		return;
	*log_ns = now;
	hkv_warn("cluster: %s: %s", what, hkv_strerror(err));
}

/* Does id hold, in a, a partition that b does not place on it? Or, in a
 * replicated store, one whose list b grows (a repair: every server on the
 * old list fences for its final pass, docs/design.md "Repair")? */
static int loses(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id)
{
	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		if (hkv_cmap_holds(a, p, id) &&
		    (!hkv_cmap_holds(b, p, id) || (a->replicas > 1 && hkv_cmap_grows(a, b, p))))
			return 1;
	return 0;
}

/* Does b place on id a partition that a does not? */
static int gains(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id)
{
	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		if (hkv_cmap_holds(b, p, id) && !hkv_cmap_holds(a, p, id))
			return 1;
	return 0;
}

/* Make name the primary of partition p (one replica per partition). */
static int set_primary(struct hkv_cmap *m, uint32_t p, const char *name)
{
	uint32_t i;

	for (i = 0; i < m->nnames && strcmp(m->names[i], name); i++)
		;
	if (i == m->nnames) {
		char (*n)[HKV_CLUSTER_ID_MAX] = hkv_realloc(m->names, (i + 1) * sizeof(*n));

		if (!n)
			return -ENOMEM;
		m->names = n;
		snprintf(n[i], sizeof(n[i]), "%s", name);
		m->nnames++;
	}
	m->repl[p * m->replicas] = (uint16_t)i;
	return 0;
}

/*
 * One round's view of the cluster: a single range over PREFIX/ (members,
 * drains, removals, the identity, the map, a pending move, acks, the
 * coordinator), so a round costs etcd one request however many questions it
 * answers.
 */
struct snap {
	struct hkv_etcd_kv *kvs;
	int n;
};

enum { FILL_COPYING, FILL_CONVERGED, FILL_SAID };

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

static void key_of(const struct hkv_cluster *cl, char *key, size_t cap, const char *dir,
		   const char *id)
{
	if (id)
		snprintf(key, cap, "%s/%s/%s", cl->prefix, dir, id);
	else
		snprintf(key, cap, "%s/%s", cl->prefix, dir);
}

/* PREFIX/dir/id (id NULL: PREFIX/dir), or NULL. */
static const struct hkv_etcd_kv *snap_get(const struct hkv_cluster *cl, const struct snap *sn,
					  const char *dir, const char *id)
{
	char key[512];

	key_of(cl, key, sizeof(key), dir, id);
	for (int i = 0; i < sn->n; i++)
		if (!strcmp(sn->kvs[i].key, key))
			return &sn->kvs[i];
	return NULL;
}

static int is_member(struct hkv_cluster *cl, const struct snap *sn, const char *id)
{
	return snap_get(cl, sn, "servers", id) != NULL;
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
	uint64_t t_sent = boot_ns();
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
	cl->ngone = 0;   /* (measures of an earlier term are void) */
	cl->job_out = 0; /* (an answer from before is void: see reg_gen) */
	cl->settle_issued = 0;
	if (cl->store_mode) /* what we hold may be partitions we no longer have */
		atomic_store(&cl->settle, 1);
	return 0;
}

/* The members not draining, in key order. */
static int read_members(struct hkv_cluster *cl, const struct snap *sn,
			char (**ids)[HKV_CLUSTER_ID_MAX], uint32_t *n)
{
	char dir[300];
	size_t dl;

	key_of(cl, dir, sizeof(dir), "servers", "");
	dl = strlen(dir);
	*n = 0;
	*ids = hkv_calloc((size_t)sn->n + 1, sizeof(**ids));
	if (!*ids)
		return -ENOMEM;
	for (int i = 0; i < sn->n; i++) {
		struct hkv_cmember m;

		if (strncmp(sn->kvs[i].key, dir, dl) ||
		    hkv_cmember_parse(sn->kvs[i].value, sn->kvs[i].vlen, &m))
			continue; /* not a member record: never placed */
		if (!snap_get(cl, sn, "drain", m.id))
			memcpy((*ids)[(*n)++], m.id, HKV_CLUSTER_ID_MAX);
	}
	return 0;
}

/* Forget the left-at times of servers that are members again. */
static void gone_prune(struct hkv_cluster *cl, const struct snap *sn)
{
	for (uint32_t i = 0; i < cl->ngone;)
		if (is_member(cl, sn, cl->gone[i].id))
			cl->gone[i] = cl->gone[--cl->ngone];
		else
			i++;
}

/* A server gone this long is routed to by no client: the map's route lease
 * (the longest of the last map seen and ours) and a margin. */
static uint64_t gone_wait_ns(const struct hkv_cluster *cl)
{
	uint32_t ms = cl->map_lease_ms > cl->route_lease_ms ? cl->map_lease_ms
							    : cl->route_lease_ms;

	return ((uint64_t)ms + 500) * 1000000ull;
}

/* Has id, no member now, been no member for gone_wait_ns()? (From the first
 * round that saw it so: no earlier than its lease really ended.) */
static int gone_long_enough(struct hkv_cluster *cl, const char *id)
{
	uint64_t now = boot_ns();
	struct gone *g;

	for (uint32_t i = 0; i < cl->ngone; i++)
		if (!strcmp(cl->gone[i].id, id))
			return now - cl->gone[i].since_ns >= gone_wait_ns(cl);
	g = hkv_realloc(cl->gone, (cl->ngone + 1) * sizeof(*g));
	if (!g)
		return 0;
	cl->gone = g;
	snprintf(g[cl->ngone].id, sizeof(g[cl->ngone].id), "%s", id);
	g[cl->ngone++].since_ns = now;
	return 0;
}

static int same_placement(const struct hkv_cmap *a, const struct hkv_cmap *b)
{
	if (a->partitions != b->partitions || a->replicas != b->replicas)
		return 0;
	for (uint32_t p = 0; p < a->partitions; p++) {
		if (hkv_cmap_len(a, p) != hkv_cmap_len(b, p))
			return 0;
		for (uint32_t r = 0; r < hkv_cmap_len(a, p); r++)
			if (strcmp(hkv_cmap_server(a, p, r), hkv_cmap_server(b, p, r)))
				return 0;
	}
	return 1;
}

/* PREFIX/next is {"base":"<map revision>","map":<map>}: built by hand, it
 * is the map's own JSON behind a fixed head. */
static char *next_format(const struct hkv_cmap *map, int64_t base)
{
	char *mj = hkv_cmap_format(map), *out;
	size_t n;

	if (!mj)
		return NULL;
	n = strlen(mj) + 64;
	out = hkv_malloc(n);
	if (out)
		snprintf(out, n, "{\"base\":\"%lld\",\"map\":%s}", (long long)base, mj);
	hkv_free(mj);
	return out;
}

static int next_parse(const struct hkv_etcd_kv *kv, struct hkv_cmap *map, int64_t *base)
{
	const char *p = kv->value, *end = kv->value + kv->vlen;
	char *num_end;

	if (kv->vlen < 9 || strncmp(p, "{\"base\":\"", 9))
		return -EPROTO;
	*base = strtoll(p + 9, &num_end, 10);
	if (end - num_end < 10 || strncmp(num_end, "\",\"map\":", 8) || end[-1] != '}')
		return -EPROTO;
	p = num_end + 8;
	if (hkv_cmap_parse(p, (size_t)(end - 1 - p), map))
		return -EPROTO;
	map->epoch = kv->mod_rev;
	return 0;
}

static int has_acked(struct hkv_cluster *cl, const struct snap *sn, const char *id, int64_t rev)
{
	const struct hkv_etcd_kv *kv = snap_get(cl, sn, "ack", id);

	return kv && strtoll(kv->value, NULL, 10) == rev;
}

/*
 * Write `want` as PREFIX/map in one transaction that holds only if, since
 * this round's view: the map is unchanged (rev; 0: still absent), we still
 * lead (the coordinator key under our lease), and every server of cur that
 * gives up partitions is the same registration (create_revision; 0: still
 * no member) - a server that came back meanwhile may serve again and must
 * be asked (a move) first. Store mode: so is every server that gains (the
 * registration the losers copied into). del_next: the move it commits.
 */
static int commit_map(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		      const struct hkv_cmap *want, int64_t rev, int del_next)
{
	uint32_t nl = (cur ? cur->nnames : 0) + want->nnames, k = 0;
	struct hkv_etcd_cmp *cmps = hkv_calloc(nl + 2, sizeof(*cmps));
	char (*keys)[512] = hkv_calloc(nl + 3, sizeof(*keys));
	char *json = hkv_cmap_format(want);
	int64_t new_rev = 0;
	int ret = -ENOMEM;

	if (!cmps || !keys || !json)
		goto out;
	key_of(cl, keys[0], sizeof(keys[0]), "map", NULL);
	cmps[k++] = (struct hkv_etcd_cmp){keys[0], rev ? HKV_ETCD_CMP_MOD : HKV_ETCD_CMP_CREATE,
					  rev};
	key_of(cl, keys[1], sizeof(keys[1]), "coordinator", NULL);
	cmps[k++] = (struct hkv_etcd_cmp){keys[1], HKV_ETCD_CMP_LEASE, atomic_load(&cl->lease)};
	for (uint32_t i = 0; i < nl; i++) {
		const char *id = i < nl - want->nnames ? cur->names[i]
						       : want->names[i - (nl - want->nnames)];
		const struct hkv_etcd_kv *m;

		if (i < nl - want->nnames ? !loses(cur, want, id)
					  : !cl->store_mode || !cur || !gains(cur, want, id))
			continue;
		m = snap_get(cl, sn, "servers", id);
		key_of(cl, keys[k], sizeof(keys[k]), "servers", id);
		cmps[k] = (struct hkv_etcd_cmp){keys[k], HKV_ETCD_CMP_CREATE, m ? m->create_rev : 0};
		k++;
	}
	key_of(cl, keys[nl + 2], sizeof(keys[nl + 2]), "next", NULL);
	ret = hkv_etcd_txn_put(cl->e, cmps, (int)k, keys[0], json, strlen(json), 0,
			       del_next ? keys[nl + 2] : NULL, &new_rev);
	if (!ret)
		hkv_info("cluster: map epoch %lld: %u partitions on %u servers, %u moved",
			 (long long)new_rev, want->partitions, want->nnames,
			 cur ? hkv_cmap_moved(cur, want) : want->partitions);
	else if (ret == -ECANCELED)
		ret = 0; /* the view is out of date: the next round decides again */
out:
	hkv_free(cmps);
	hkv_free(keys);
	hkv_free(json);
	return ret;
}

/* Store mode: may the move from cur to next still commit? Every server it
 * touches must be a member, and every loser's ack ("REV a=12 b=40") must
 * name the registrations (create_revision) of its new homes we see now:
 * a new home that registered again since may have dropped the copy. */
static int store_move_sound(struct hkv_cluster *cl, const struct snap *sn,
			    const struct hkv_cmap *cur, const struct hkv_cmap *next, int64_t rev)
{
	for (uint32_t i = 0; i < cur->nnames + next->nnames; i++) {
		const char *id = i < cur->nnames ? cur->names[i] : next->names[i - cur->nnames];

		if ((loses(cur, next, id) || gains(cur, next, id)) && !is_member(cl, sn, id)) {
			hkv_warn("cluster: %s left during a move: the move is dropped", id);
			return 0;
		}
	}
	for (uint32_t i = 0; i < cur->nnames; i++) {
		const struct hkv_etcd_kv *ak = snap_get(cl, sn, "ack", cur->names[i]);
		char *p, *end, name[HKV_CLUSTER_ID_MAX];

		if (!loses(cur, next, cur->names[i]) || !ak || strtoll(ak->value, &p, 10) != rev)
			continue;
		if (!strncmp(p, " failed", 7)) {
			hkv_warn("cluster: %s could not copy its items to their new homes: the move is "
				 "dropped", cur->names[i]);
			return 0;
		}
		while (*p == ' ') {
			const struct hkv_etcd_kv *m;
			size_t n = strcspn(++p, "=");
			long long cr;

			if (!n || n >= sizeof(name) || p[n] != '=')
				break;
			memcpy(name, p, n);
			name[n] = 0;
			cr = strtoll(p + n + 1, &end, 10);
			p = end;
			m = snap_get(cl, sn, "servers", name);
			if (!m || m->create_rev != cr) {
				hkv_warn("cluster: %s registered again after %s copied into it: "
					 "the move is dropped", name, cur->names[i]);
				return 0;
			}
		}
	}
	return 1;
}

/* Leader, a move under way: commit PREFIX/next once every live server that
 * gives up partitions has purged them and acked, and those that left have
 * been gone long enough. */
static int drive_move(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *nk,
		      const struct hkv_cmap *cur, int64_t cur_rev)
{
	char key[512];
	struct hkv_cmap next = {0};
	int64_t base = 0;
	int ret;

	key_of(cl, key, sizeof(key), "next", NULL);
	if (next_parse(nk, &next, &base) || base != cur_rev) {
		hkv_cmap_free(&next);
		hkv_etcd_delete_if(cl->e, key, nk->mod_rev); /* stale or garbage: start over */
		return 0;
	}
	if (cl->store_mode && !store_move_sound(cl, sn, cur, &next, nk->mod_rev)) {
		hkv_cmap_free(&next);
		hkv_etcd_delete_if(cl->e, key, nk->mod_rev); /* its losers serve on */
		return 0;
	}
	for (uint32_t i = 0; i < cur->nnames; i++) {
		const char *id = cur->names[i];

		if (!loses(cur, &next, id))
			continue;
		if (is_member(cl, sn, id) ? has_acked(cl, sn, id, nk->mod_rev)
					  : gone_long_enough(cl, id))
			continue;
		if (cl->next_seen_rev != nk->mod_rev) {
			cl->next_seen_rev = nk->mod_rev;
			cl->next_seen_ns = boot_ns();
		} else if (boot_ns() - cl->next_seen_ns > 5000000000ull) {
			hkv_warn("cluster: move to map %lld waits for %s", (long long)nk->mod_rev, id);
			cl->next_seen_ns = boot_ns();
		}
		hkv_cmap_free(&next);
		return 0;
	}
	ret = commit_map(cl, sn, cur, &next, cur_rev, 1);
	hkv_cmap_free(&next);
	return ret;
}

/* PREFIX/identity: the partition count and routing hash key, written once;
 * every map is made from it, so a lost or rewritten map cannot change where
 * keys go. 0 and *id filled, 1 when it was just created (decide next round),
 * or an error. */
static int identity(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *mk,
		    struct hkv_cmap *id)
{
	const struct hkv_etcd_kv *ik = snap_get(cl, sn, "identity", NULL);
	char key[512], *json;
	int ret;

	memset(id, 0, sizeof(*id));
	if (ik) {
		int store = 0;

		ret = hkv_cmap_identity_parse(ik->value, ik->vlen, &id->partitions, id->hash_key,
					      &store, &id->replicas);
		if (ret)
			hkv_err("cluster: %s/identity is garbage; not touching the map", cl->prefix);
		else if (store != cl->store_mode)
			hkv_err("cluster: %s/identity says %s mode, we run %s; not touching the map",
				cl->prefix, store ? "store" : "cache", cl->store_mode ? "store" : "cache"),
				ret = -EPROTO;
		return ret;
	}
	if (mk) { /* a map from before identities: adopt its hash */
		struct hkv_cmap m;

		if (hkv_cmap_parse(mk->value, mk->vlen, &m))
			return -EPROTO;
		id->partitions = m.partitions;
		memcpy(id->hash_key, m.hash_key, sizeof(id->hash_key));
		hkv_cmap_free(&m);
	} else {
		id->partitions = cl->partitions;
		randombytes_buf(id->hash_key, sizeof(id->hash_key));
	}
	json = hkv_cmap_identity_format(id->partitions, id->hash_key, cl->store_mode, cl->replicas);
	if (!json)
		return -ENOMEM;
	key_of(cl, key, sizeof(key), "identity", NULL);
	ret = hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL);
	hkv_free(json);
	return ret && ret != -ECANCELED ? ret : 1;
}

/*
 * Store mode: a server that left keeps its partitions - its items wait for
 * it on its --memory-file, and its keys fail with HKV_EUNAVAILABLE - unless
 * an operator removed it. And a server that would both gain and give up
 * partitions keeps what it would give up for now (a loser is fenced, a
 * gainer must serve the copies coming in): the next move takes them.
 */
static int store_placement(struct hkv_cluster *cl, const struct snap *sn,
			   const struct hkv_cmap *cur, struct hkv_cmap *want)
{
	int ret = 0;

	for (uint32_t p = 0; p < cur->partitions && !ret; p++) {
		const char *o = hkv_cmap_server(cur, p, 0);

		if (!is_member(cl, sn, o) && !snap_get(cl, sn, "removed", o))
			ret = set_primary(want, p, o);
	}
	for (uint32_t i = 0; i < cur->nnames && !ret; i++) {
		const char *id = cur->names[i];

		if (!loses(cur, want, id) || !gains(cur, want, id))
			continue;
		for (uint32_t p = 0; p < cur->partitions && !ret; p++)
			if (!strcmp(hkv_cmap_server(cur, p, 0), id))
				ret = set_primary(want, p, id);
	}
	return ret;
}

/* Can partition p of m take id as a new replica? (Short, id not on it,
 * every server on it a member: the primary copies, all of them fence.) */
static int can_admit(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *m,
		     uint32_t p, const char *id)
{
	if (hkv_cmap_len(m, p) >= m->replicas || hkv_cmap_holds(m, p, id))
		return 0;
	for (uint32_t r = 0; r < hkv_cmap_len(m, p); r++)
		if (!is_member(cl, sn, hkv_cmap_server(m, p, r)))
			return 0; /* (dropped first, then repaired) */
	return 1;
}

/*
 * Leader, a replicated store: one member - of those that can take a
 * short partition, the one holding fewest - is admitted right behind the
 * primary of every short partition it is not on; the primaries copy them
 * there while serving (PREFIX/fill = {"base":"<map revision>","map":<the
 * map to be>}). One new replica per fill, so it is never also on a list
 * the fill grows (it would have to fence and fill at once); the next fill
 * takes what is still short.
 */
static int plan_fill(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		     struct hkv_cmap *want, char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n)
{
	uint32_t best = n, best_load = 0, grown = 0;
	char key[512], *json;
	int ret = 0;

	if (boot_ns() < cl->fill_after_ns)
		return 0; /* the last one failed: not at once again */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t load = 0, can = 0;

		for (uint32_t p = 0; p < cur->partitions; p++) {
			load += hkv_cmap_holds(cur, p, ids[i]);
			can |= can_admit(cl, sn, cur, p, ids[i]);
		}
		if (can && !strcmp(ids[i], cl->fill_failed) && n > 1)
			load += 1u << 30; /* its last fill failed: anyone else first */
		if (can && (best == n || load < best_load)) {
			best = i;
			best_load = load;
		}
	}
	if (best == n)
		return 0; /* nothing short, or nobody to put there */
	for (uint32_t p = 0; p < want->partitions && !ret; p++)
		if (can_admit(cl, sn, cur, p, ids[best])) {
			ret = hkv_cmap_admit(want, p, ids[best]);
			grown++;
		}
	if (ret || !grown)
		return ret;
	json = next_format(want, cur->epoch);
	key_of(cl, key, sizeof(key), "fill", NULL);
	ret = json ? hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL) : -ENOMEM;
	hkv_free(json);
	if (!ret)
		hkv_info("cluster: repairing %u partitions short of %u replicas onto %s (map %lld -> "
			 "fill)", grown, want->replicas, ids[best], (long long)cur->epoch);
	return ret == -ECANCELED ? 0 : ret;
}

/*
 * Leader, a fill under way: once every primary that copies has said its
 * passes converged (PREFIX/filled/ID = the fill's revision), turn the fill
 * into a move (PREFIX/next, the same map; PREFIX/fill deleted in the same
 * transaction): every server on the old lists fences, the primaries run
 * the final pass, and drive_move commits. A fill on an old map, or one
 * whose servers left, is dropped.
 */
static int drive_fill(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *fk,
		      const struct hkv_cmap *cur, int64_t cur_rev)
{
	char fkey[512], nkey[512], mkey[512], ckey[512], *json = NULL;
	struct hkv_cmap target = {0};
	int64_t base = 0;
	int ret = 0;

	key_of(cl, fkey, sizeof(fkey), "fill", NULL);
	if (next_parse(fk, &target, &base) || base != cur_rev ||
	    target.partitions != cur->partitions) {
		hkv_cmap_free(&target);
		hkv_etcd_delete_if(cl->e, fkey, fk->mod_rev); /* stale or garbage: plan again */
		return 0;
	}
	for (uint32_t i = 0; i < target.nnames; i++) {
		const char *id = target.names[i];
		const struct hkv_etcd_kv *dk;

		if (!gains(cur, &target, id) && !loses(cur, &target, id))
			continue; /* (loses: on a list that grows) */
		if (!is_member(cl, sn, id)) {
			hkv_warn("cluster: %s left during a repair: the fill is dropped", id);
			goto drop;
		}
		if (!hkv_fill_source(cur, &target, id))
			continue;
		dk = snap_get(cl, sn, "filled", id);
		if (dk && strtoll(dk->value, NULL, 10) == fk->mod_rev && strstr(dk->value, "failed")) {
			hkv_warn("cluster: %s could not fill the new replicas: the fill is dropped, "
				 "the next in 10 s", id);
			cl->fill_after_ns = boot_ns() + 10000000000ull;
			for (uint32_t j = 0; j < target.nnames; j++)
				if (gains(cur, &target, target.names[j]))
					snprintf(cl->fill_failed, sizeof(cl->fill_failed), "%s",
						 target.names[j]);
			goto drop;
		}
		if (!dk || strtoll(dk->value, NULL, 10) != fk->mod_rev)
			goto out; /* still copying */
	}
	json = next_format(&target, cur_rev);
	if (!json) {
		ret = -ENOMEM;
		goto out;
	}
	key_of(cl, nkey, sizeof(nkey), "next", NULL);
	key_of(cl, mkey, sizeof(mkey), "map", NULL);
	key_of(cl, ckey, sizeof(ckey), "coordinator", NULL);
	{
		struct hkv_etcd_cmp cmps[] = {
			{mkey, HKV_ETCD_CMP_MOD, cur_rev},
			{fkey, HKV_ETCD_CMP_MOD, fk->mod_rev},
			{nkey, HKV_ETCD_CMP_CREATE, 0},
			{ckey, HKV_ETCD_CMP_LEASE, atomic_load(&cl->lease)},
		};

		ret = hkv_etcd_txn_put(cl->e, cmps, 4, nkey, json, strlen(json), 0, fkey, NULL);
	}
	if (!ret)
		hkv_info("cluster: repair filled: the final pass fences the lists (map %lld -> next)",
			 (long long)cur_rev);
	if (ret == -ECANCELED)
		ret = 0;
	goto out;
drop:
	hkv_etcd_delete_if(cl->e, fkey, fk->mod_rev);
out:
	hkv_free(json);
	hkv_cmap_free(&target);
	return ret;
}

/*
 * Leader, a replicated store (identity replicas > 1): the first map places
 * each partition on `replicas` members, once that many have joined; after
 * that, a member gone past GONE_WAIT (its lease expired, and no client
 * routes to it any more) is dropped from every list that has another
 * server, the order of the rest kept - so a backup becomes the primary
 * with every write the old primary held (docs/design.md, "Replicas"). The
 * drop needs no fence: the dropped member is no member (the transaction
 * checks its key is still absent). A list shorter than `replicas` is
 * repaired: a fill (plan_fill, drive_fill) copies its partitions onto a
 * member not on it, then a move (PREFIX/next, every server on the old list
 * fenced for the final pass) admits that member behind the primary.
 */
static int recompute_replicated(struct hkv_cluster *cl, const struct snap *sn,
				const struct hkv_etcd_kv *mk, struct hkv_cmap *want,
				char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n)
{
	const struct hkv_etcd_kv *nk = snap_get(cl, sn, "next", NULL);
	const struct hkv_etcd_kv *fk = snap_get(cl, sn, "fill", NULL);
	struct hkv_cmap cur = {0};
	int ret, changed = 0;

	if (!mk) {
		/* the first map: once `replicas` servers have joined and no other
		 * joined for a lease TTL (servers started together all get lists,
		 * on a slow host too) */
		if (n != cl->first_n) {
			cl->first_n = n;
			cl->first_ns = boot_ns();
		}
		if (n < want->replicas) {
			if (boot_ns() - cl->log_ns > 5000000000ull) {
				cl->log_ns = boot_ns();
				hkv_info("cluster: %u of %u servers have joined; the map waits for all",
					 n, want->replicas);
			}
			return 0;
		}
		if (boot_ns() - cl->first_ns < (uint64_t)cl->ttl_s * 1000000000ull)
			return 0;
		ret = hkv_cmap_place(want, (const char (*)[HKV_CLUSTER_ID_MAX])ids, n);
		want->route_lease_ms = cl->route_lease_ms;
		return ret ? ret : commit_map(cl, sn, NULL, want, 0, 0);
	}
	ret = hkv_cmap_parse(mk->value, mk->vlen, &cur);
	if (!ret && (cur.partitions != want->partitions ||
		     memcmp(cur.hash_key, want->hash_key, sizeof(want->hash_key))))
		ret = -EPROTO;
	if (!ret)
		ret = hkv_cmap_parse(mk->value, mk->vlen, want);
	if (ret) {
		hkv_err("cluster: %s/map is not this cluster's partition map; leaving it alone",
			cl->prefix);
		hkv_cmap_free(&cur);
		return ret;
	}
	cl->map_lease_ms = hkv_cmap_route_lease(&cur);
	cur.epoch = mk->mod_rev;
	if (nk) { /* a repair's final pass (a server lost meanwhile drops it) */
		ret = drive_move(cl, sn, nk, &cur, mk->mod_rev);
		hkv_cmap_free(&cur);
		return ret;
	}
	for (uint32_t i = 0; i < cur.nnames; i++) {
		const char *id = cur.names[i];

		if (is_member(cl, sn, id) || !gone_long_enough(cl, id))
			continue;
		if (hkv_cmap_drop(want, id)) {
			hkv_warn("cluster: %s is gone: dropped from its partitions' replica lists", id);
			changed = 1;
		}
	}
	if (changed)
		ret = commit_map(cl, sn, &cur, want, mk->mod_rev, 0);
	else if (fk)
		ret = drive_fill(cl, sn, fk, &cur, mk->mod_rev);
	else
		ret = plan_fill(cl, sn, &cur, want, ids, n);
	hkv_cmap_free(&cur);
	return ret;
}

/* Leader: make PREFIX/map place every partition on the members. */
static int recompute_map(struct hkv_cluster *cl, const struct snap *sn)
{
	char (*ids)[HKV_CLUSTER_ID_MAX] = NULL;
	const struct hkv_etcd_kv *mk = snap_get(cl, sn, "map", NULL);
	const struct hkv_etcd_kv *nk = snap_get(cl, sn, "next", NULL);
	struct hkv_cmap cur = {0}, want = {0};
	uint32_t n;
	int ret, two_phase = 0;
	int64_t rev = 0;

	ret = identity(cl, sn, mk, &want);
	if (ret)
		return ret > 0 ? 0 : ret;
	ret = read_members(cl, sn, &ids, &n);
	if (ret || !n)
		goto out;
	if (want.replicas > 1) {
		ret = recompute_replicated(cl, sn, mk, &want, ids, n);
		goto out;
	}
	if (mk) {
		ret = hkv_cmap_parse(mk->value, mk->vlen, &cur);
		if (!ret && (cur.partitions != want.partitions ||
			     memcmp(cur.hash_key, want.hash_key, sizeof(want.hash_key))))
			ret = -EPROTO;
		if (ret) {
			hkv_err("cluster: %s/map is not this cluster's partition map; leaving it alone",
				cl->prefix);
			goto out;
		}
		rev = mk->mod_rev;
		cur.epoch = rev;
		cl->map_lease_ms = hkv_cmap_route_lease(&cur);
		if (nk) {
			ret = drive_move(cl, sn, nk, &cur, rev);
			goto out;
		}
	}
	ret = hkv_cmap_place(&want, (const char (*)[HKV_CLUSTER_ID_MAX])ids, n);
	want.route_lease_ms = mk ? cur.route_lease_ms : cl->route_lease_ms; /* (fixed by the first) */
	if (!ret && mk && cl->store_mode)
		ret = store_placement(cl, sn, &cur, &want);
	if (ret || (mk && same_placement(&cur, &want)))
		goto out;
	for (uint32_t i = 0; mk && i < cur.nnames; i++) {
		if (!loses(&cur, &want, cur.names[i]))
			continue;
		if (is_member(cl, sn, cur.names[i]))
			two_phase = 1;
		else if (!gone_long_enough(cl, cur.names[i]))
			goto out; /* clients may still route to it: wait */
	}
	if (two_phase) { /* live losers purge first: the map waits in next */
		char key[512], *json = next_format(&want, rev);

		key_of(cl, key, sizeof(key), "next", NULL);
		ret = json ? hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL) : -ENOMEM;
		hkv_free(json);
		if (!ret)
			hkv_info("cluster: moving %u partitions (map %lld -> next)",
				 hkv_cmap_moved(&cur, &want), (long long)rev);
		if (ret == -ECANCELED)
			ret = 0;
		goto out;
	}
	ret = commit_map(cl, sn, mk ? &cur : NULL, &want, rev, 0);
out:
	hkv_cmap_free(&cur);
	hkv_cmap_free(&want);
	hkv_free(ids);
	return ret;
}

/* PREFIX/dir/ID = text, under our lease (our acks and readiness go with it). */
static int put_ours(struct hkv_cluster *cl, const char *dir, const char *text)
{
	char key[512];

	key_of(cl, key, sizeof(key), dir, cl->id);
	return hkv_etcd_put(cl->e, key, text, strlen(text), atomic_load(&cl->lease), NULL);
}

static void issue(struct hkv_cluster *cl, struct hkv_cluster_job *job)
{
	job->gen = cl->reg_gen;
	pthread_mutex_lock(&cl->lock);
	hkv_cluster_job_free(cl->job);
	cl->job = job;
	pthread_mutex_unlock(&cl->lock);
	cl->job_out = 1;
}

static struct hkv_cluster_job *job_new(enum hkv_cluster_job_kind kind, int64_t rev)
{
	struct hkv_cluster_job *j = hkv_calloc(1, sizeof(*j));

	if (j) {
		j->kind = kind;
		j->rev = rev;
	}
	return j;
}

static const char *job_name(int kind)
{
	return kind == HKV_JOB_COPY ? "copy" : kind == HKV_JOB_INTAKE ? "intake" :
	       kind == HKV_JOB_FILL ? "repair pass" : "purge";
}

/* The loop's answer to our job, if any. */
static void collect_done(struct hkv_cluster *cl)
{
	int done, kind, ret;
	uint32_t gen;
	int64_t rev;

	pthread_mutex_lock(&cl->lock);
	done = cl->done;
	kind = cl->done_kind;
	ret = cl->done_ret;
	rev = cl->done_rev;
	gen = cl->done_gen;
	cl->done = 0;
	pthread_mutex_unlock(&cl->lock);
	if (!done || gen != cl->reg_gen)
		return; /* nothing, or for a registration of ours that is over */
	cl->job_out = 0;
	if (kind == HKV_JOB_FILL) {
		if (rev != cl->fill_rev)
			return;
		if (ret < 0) {
			hkv_warn("cluster: repair pass for fill %lld failed (%s)", (long long)rev,
				 hkv_strerror(ret));
			cl->fill_failures++;
		} else if (ret > 0) {
			cl->fill_state = FILL_CONVERGED;
		}
		return;
	}
	if (ret) {
		hkv_warn("cluster: %s for move %lld failed (%s)", job_name(kind), (long long)rev,
			 hkv_strerror(ret));
		cl->settle_issued = 0;
		if (kind == HKV_JOB_COPY && rev == cl->fence_rev)
			cl->copy_failures++;
		return;
	}
	if (rev < 0)
		return; /* a gainer's tidy-up */
	if (kind == HKV_JOB_PURGE && !rev) {
		if (cl->settle_issued) {
			atomic_store(&cl->settle, 0);
			hkv_info("cluster: %s holds only its partitions: serves", cl->id);
		}
	} else if (kind == HKV_JOB_PURGE) {
		cl->purged_rev = rev;
	} else if (kind == HKV_JOB_COPY) {
		cl->copied_rev = rev;
	} else {
		cl->intaken_rev = rev;
	}
}

static struct hkv_cmap *map_of(const struct hkv_etcd_kv *kv)
{
	struct hkv_cmap *m = hkv_calloc(1, sizeof(*m));

	if (m && kv && hkv_cmap_parse(kv->value, kv->vlen, m)) {
		hkv_free(m);
		return NULL;
	}
	if (m && kv)
		m->epoch = kv->mod_rev;
	return m; /* (no kv: no map, an empty one - nothing placed on us) */
}

/*
 * Store mode, a loser: are all new homes of our partitions members that
 * have emptied them (ready/NAME is this move's revision)? Then "a=12 b=40"
 * (their registrations) in *crs and their member records in homes[]
 * (indexed like next->names). 1 if so, 0 if not yet, or an error.
 */
static int homes_ready(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		       const struct hkv_cmap *next, int64_t rev, char **crs,
		       struct hkv_cmember *homes)
{
	size_t cap = (size_t)next->nnames * (HKV_CLUSTER_ID_MAX + 24) + 1, len = 0;
	char *out = hkv_calloc(1, cap);

	if (!out)
		return -ENOMEM;
	for (uint32_t i = 0; i < next->nnames; i++) {
		const char *g = next->names[i];
		const struct hkv_etcd_kv *m, *rk;
		int to_g = 0;

		if (!strcmp(g, cl->id))
			continue;
		for (uint32_t p = 0; p < cur->partitions && !to_g; p++)
			to_g = !strcmp(hkv_cmap_server(cur, p, 0), cl->id) &&
			       hkv_cmap_holds(next, p, g) && !hkv_cmap_holds(cur, p, g);
		if (!to_g)
			continue;
		m = snap_get(cl, sn, "servers", g);
		rk = snap_get(cl, sn, "ready", g);
		if (!m || !rk || strtoll(rk->value, NULL, 10) != rev ||
		    (homes && hkv_cmember_parse(m->value, m->vlen, &homes[i]))) {
			hkv_free(out);
			return 0;
		}
		len += (size_t)snprintf(out + len, cap - len, " %s=%lld", g, (long long)m->create_rev);
	}
	*crs = out;
	return 1;
}

/*
 * A gainer's step in a move or a repair (rev): have the loop empty what
 * *map gives us and *cur does not (left by one that never committed; the
 * job takes both maps), then say ready/ID = rev. 1 once said, 0 for now
 * (a job issued), or an error.
 */
static int intake_or_ready(struct hkv_cluster *cl, int64_t rev, struct hkv_cmap **map,
			   struct hkv_cmap **cur)
{
	struct hkv_cluster_job *job;
	char small[48];
	int ret;

	if (cl->intaken_rev != rev) {
		if (!(job = job_new(HKV_JOB_INTAKE, rev)))
			return -ENOMEM;
		job->map = *map;
		job->cur = *cur;
		*map = *cur = NULL;
		issue(cl, job);
		return 0;
	}
	snprintf(small, sizeof(small), "%lld", (long long)rev);
	ret = put_ours(cl, "ready", small);
	return ret ? ret : 1;
}

static void map_drop(struct hkv_cmap **m)
{
	if (*m) {
		hkv_cmap_free(*m);
		hkv_free(*m);
		*m = NULL;
	}
}

/*
 * Every member of a replicated store, each round with no move pending:
 * follow a repair (PREFIX/fill). A new replica empties what it gains (an
 * INTAKE) and says ready/ID; a primary that copies runs online passes
 * (FILL jobs) until one converges, then says filled/ID. A new replica
 * whose fill was dropped drops what came in.
 */
static int follow_fill(struct hkv_cluster *cl, const struct snap *sn,
		       const struct hkv_etcd_kv *mk)
{
	const struct hkv_etcd_kv *fk = snap_get(cl, sn, "fill", NULL);
	struct hkv_cmap *cur = NULL, *target = NULL;
	struct hkv_cluster_job *job;
	struct hkv_cmember *homes = NULL;
	char *crs = NULL, small[64];
	int64_t base, rev = fk ? fk->mod_rev : 0;
	int ret = 0;

	if (cl->fill_in_rev && cl->fill_in_rev != rev && mk) {
		/* the fill we took copies for is gone without a move: what came in
		 * is no partition of ours (no client routes those keys here) */
		hkv_info("cluster: repair %lld dropped: %s drops what it took in",
			 (long long)cl->fill_in_rev, cl->id);
		cl->fill_in_rev = 0;
		map_drop(&cl->fill_in_map);
		if (!(cur = map_of(mk)) || !(job = job_new(HKV_JOB_PURGE, -1)))
			goto nomem;
		job->map = cur;
		issue(cl, job);
		return 0;
	}
	if (!fk || !mk)
		return 0;
	if (!(cur = map_of(mk)) || !(target = hkv_calloc(1, sizeof(*target))))
		goto nomem;
	if (next_parse(fk, target, &base) || base != mk->mod_rev ||
	    target->partitions != cur->partitions)
		goto out; /* the coordinator drops it */
	if (gains(cur, target, cl->id) && cl->fill_in_rev != rev) {
		if (hkv_cluster_fenced(cl))
			goto out; /* (copies need our data plane up) */
		ret = intake_or_ready(cl, rev, &target, &cur);
		if (ret == 1) {
			ret = 0;
			hkv_info("cluster: %s ready to take a repair's copies", cl->id);
			cl->fill_in_rev = rev;
			map_drop(&cl->fill_in_map);
			cl->fill_in_map = target;
			target = NULL;
		}
		goto out;
	}
	if (!hkv_fill_source(cur, target, cl->id))
		goto out;
	if (cl->fill_rev != rev) {
		cl->fill_rev = rev;
		cl->fill_state = FILL_COPYING;
		cl->fill_failures = 0;
		hkv_info("cluster: %s fills new replicas of its partitions, serving on", cl->id);
	}
	if (cl->fill_state == FILL_SAID)
		goto out;
	if (cl->fill_state == FILL_CONVERGED || cl->fill_failures >= 3) {
		snprintf(small, sizeof(small), "%lld%s", (long long)rev,
			 cl->fill_state == FILL_CONVERGED ? "" : " failed");
		ret = put_ours(cl, "filled", small);
		if (!ret)
			cl->fill_state = FILL_SAID;
		goto out;
	}
	if (!(homes = hkv_calloc(target->nnames + 1, sizeof(*homes))))
		goto nomem;
	ret = homes_ready(cl, sn, cur, target, rev, &crs, homes);
	if (ret <= 0 || !(job = job_new(HKV_JOB_FILL, rev))) {
		ret = ret < 0 ? ret : 0;
		goto out;
	}
	job->map = target;
	job->cur = cur;
	job->homes = homes;
	job->tag = crs;
	target = cur = NULL;
	homes = NULL;
	crs = NULL;
	issue(cl, job);
	ret = 0;
	goto out;
nomem:
	ret = -ENOMEM;
out:
	map_drop(&cur);
	map_drop(&target);
	hkv_free(homes);
	hkv_free(crs);
	return ret;
}

/*
 * Every member, each round: follow a pending move (PREFIX/next).
 * Cache mode, a loser: fence, have the loop purge what we give up, ack.
 * Store mode, a gainer: have the loop empty what we gain (left by a move
 * that never committed), then say ready/ID. Store mode, a loser: fence;
 * once every new home is ready, have the loop copy our items of the moving
 * partitions to them; ack with the new homes' registrations, and drop the
 * items only once the move is over and the map says they are gone
 * (settle). Unfence when the move is over.
 */
static int follow_move(struct hkv_cluster *cl, const struct snap *sn)
{
	char *val = NULL, *crs = NULL;
	const struct hkv_etcd_kv *nk = snap_get(cl, sn, "next", NULL);
	const struct hkv_etcd_kv *mk = snap_get(cl, sn, "map", NULL);
	struct hkv_cmap *cur = NULL, *next = NULL;
	struct hkv_cluster_job *job;
	const struct hkv_etcd_kv *fk = snap_get(cl, sn, "fill", NULL);
	int64_t base, rev = nk ? nk->mod_rev : 0;
	int ret = 0;

	atomic_store(&cl->fill_live, fk ? fk->mod_rev : 0);
	collect_done(cl);
	if (cl->job_out)
		return 0; /* one job at a time */
	if (atomic_load(&cl->settle)) { /* store mode: drop what the map does not place on us */
		if (!mk)
			return 0; /* none yet (the coordinator makes it): fenced, nothing dropped */
		if (!(cur = map_of(mk))) {
			hkv_err("cluster: %s/map does not parse: %s stays fenced", cl->prefix, cl->id);
			return 0;
		}
		if (!(job = job_new(HKV_JOB_PURGE, 0)))
			goto nomem;
		job->map = cur;
		issue(cl, job);
		cl->settle_issued = 1;
		return 0;
	}
	if (atomic_load(&cl->move_fence) && cl->fence_rev != rev) {
		/* the move that fenced us is over (committed or dropped; another
		 * may have followed it at once) */
		if (cl->store_mode) /* drop what moved before serving */
			atomic_store(&cl->settle, 1);
		else
			hkv_info("cluster: move over, %s serves again", cl->id);
		atomic_store(&cl->move_fence, 0);
		return 0;
	}
	if (cl->store_mode && cl->ready_rev && cl->ready_rev != rev && mk) {
		/* a move we took copies for is over: if it was dropped, what was
		 * copied in is no partition of ours; drop it (serving on: no client
		 * routes those keys here) */
		cl->ready_rev = 0;
		if (!(cur = map_of(mk)) || !(job = job_new(HKV_JOB_PURGE, -1)))
			goto nomem;
		job->map = cur;
		cur = NULL;
		issue(cl, job);
		return 0;
	}
	if (!nk) /* no move; a replicated store's repair, if any */
		return follow_fill(cl, sn, mk);
	if (!(cur = map_of(mk)) || !mk || !(next = hkv_calloc(1, sizeof(*next))) ||
	    next_parse(nk, next, &base) || base != mk->mod_rev)
		goto out; /* nothing we can act on: the coordinator cleans up */
	if (loses(cur, next, cl->id)) {
		if (cl->fence_rev != rev) {
			if (cur->replicas > 1)
				hkv_info("cluster: %s is on lists a repair grows: fenced for its final "
					 "pass", cl->id);
			else
				hkv_info("cluster: %s gives up %u partitions: fenced to %s them", cl->id,
					 hkv_cmap_moved(cur, next), cl->store_mode ? "copy" : "purge");
			cl->fence_rev = rev;
			cl->fence_ns = boot_ns();
			cl->copy_failures = 0;
			atomic_store(&cl->move_fence, 1);
			if (cl->store_mode)
				goto out;
			if (!(job = job_new(HKV_JOB_PURGE, rev)))
				goto nomem;
			job->map = next;
			next = NULL;
			issue(cl, job);
			goto out;
		}
		if (cl->acked_rev == rev)
			goto out;
		if (!cl->store_mode) {
			if (cl->purged_rev != rev)
				goto out;
			crs = hkv_calloc(1, 1); /* the ack: "REV" */
		} else if (cl->copied_rev != rev && cl->copy_failures >= 3) {
			/* the new homes refuse our items (full, gone, a smaller item
			 * limit): say so, and the coordinator drops the move */
			crs = hkv_malloc(sizeof(" failed"));
			if (crs)
				memcpy(crs, " failed", sizeof(" failed"));
		} else if (cl->copied_rev != rev) {
			struct hkv_cmember *homes;

			/* the loop closes our clients within 100 ms of the fence */
			if (boot_ns() - cl->fence_ns < 200000000ull)
				goto out;
			homes = hkv_calloc(next->nnames + 1, sizeof(*homes));
			if (!homes)
				goto nomem;
			ret = homes_ready(cl, sn, cur, next, rev, &crs, homes);
			if (ret <= 0 || !(job = job_new(HKV_JOB_COPY, rev))) {
				hkv_free(homes);
				ret = ret < 0 ? ret : 0;
				goto out;
			}
			if (cur->replicas > 1) { /* a repair's final pass */
				job->fill_rev = cl->fill_rev;
				job->tag = hkv_strdup(crs);
				if (!job->tag) {
					hkv_cluster_job_free(job);
					hkv_free(homes);
					goto nomem;
				}
			}
			job->map = next;
			job->cur = cur;
			job->homes = homes;
			next = cur = NULL;
			hkv_free(cl->copy_crs);
			cl->copy_crs = crs;
			crs = NULL;
			issue(cl, job);
			ret = 0; /* (homes_ready's 1) */
			goto out;
		} else {
			/* copied: the new homes must be the registrations copied into */
			ret = homes_ready(cl, sn, cur, next, rev, &crs, NULL);
			if (ret <= 0 || strcmp(crs, cl->copy_crs ? cl->copy_crs : "")) {
				if (ret >= 0)
					hkv_warn("cluster: a new home changed while %s copied: copying again",
						 cl->id);
				cl->copied_rev = 0;
				ret = ret < 0 ? ret : 0;
				goto out;
			}
		}
		/* the ack: "REV", "REV failed" or "REV a=12 b=40" (the new homes copied into) */
		if (!crs || !(val = hkv_malloc(strlen(crs) + 32)))
			goto nomem;
		snprintf(val, strlen(crs) + 32, "%lld%s", (long long)rev, crs);
		ret = put_ours(cl, "ack", val);
		if (!ret)
			cl->acked_rev = rev;
	} else if (cl->store_mode && gains(cur, next, cl->id) && cl->ready_rev != rev &&
		   !hkv_cluster_fenced(cl)) { /* (copies need our data plane up) */
		if (cl->intaken_rev != rev && cl->fill_in_map &&
		    same_placement(cl->fill_in_map, next)) {
			/* the move that ends the repair we took copies for: keep them */
			cl->intaken_rev = rev;
			cl->fill_in_rev = 0;
			map_drop(&cl->fill_in_map);
		}
		ret = intake_or_ready(cl, rev, &next, &cur);
		if (ret == 1) {
			ret = 0;
			cl->ready_rev = rev;
		}
	}
	goto out;
nomem:
	ret = -ENOMEM;
out:
	if (next)
		hkv_cmap_free(next);
	if (cur)
		hkv_cmap_free(cur);
	hkv_free(next);
	hkv_free(cur);
	hkv_free(val);
	hkv_free(crs);
	return ret;
}

static int coordinate(struct hkv_cluster *cl, const struct snap *sn)
{
	const struct hkv_etcd_kv *ck = snap_get(cl, sn, "coordinator", NULL);
	char key[512];
	int was = cl->leader, ret;

	if (!ck) {
		key_of(cl, key, sizeof(key), "coordinator", NULL);
		ret = hkv_etcd_put_if(cl->e, key, cl->id, strlen(cl->id), 0,
				      atomic_load(&cl->lease), NULL);
		return ret == -ECANCELED ? 0 : ret; /* the next round's view says who won */
	}
	cl->leader = ck->lease == atomic_load(&cl->lease);
	if (cl->leader && !was)
		hkv_info("cluster: %s coordinates", cl->id);
	if (!cl->leader || !was)
		cl->ngone = 0; /* a new term measures absences afresh (issue 29) */
	if (!cl->leader)
		return 0;
	gone_prune(cl, sn);
	return recompute_map(cl, sn);
}

/* The lease, on a thread and an etcd connection of its own, so that no
 * slow coordination request delays a keepalive. */
static void *keepalive_thread(void *arg)
{
	struct hkv_cluster *cl = arg;
	int period_ms = cl->ttl_s * 1000 / 3;

	while (!stopping(cl)) {
		int64_t lease = atomic_load(&cl->lease);
		uint64_t t_sent = boot_ns();
		int ret, ttl = 0;

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
				pthread_mutex_lock(&cl->lock);
				pthread_cond_broadcast(&cl->wake);
				pthread_mutex_unlock(&cl->lock);
			} else {
				etcd_trouble(&cl->klog_ns, "lease keepalive", ret);
			}
		}
		nap(cl, period_ms);
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
	const struct hkv_etcd_kv *mk = snap_get(cl, sn, "map", NULL);
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

			ret = snap_read(cl, &sn, &rev);
			if (!ret)
				map_after_rejoin(cl, &sn);
			if (ret) {
				etcd_trouble(&cl->log_ns, "reading the cluster", ret);
				rev = 0;
			} else if (snap_get(cl, &sn, "removed", cl->id)) {
				hkv_warn("cluster: %s was removed by an operator", cl->id);
				atomic_store(&cl->removed, 1);
			} else if ((ret = follow_move(cl, &sn))) {
				etcd_trouble(&cl->log_ns, "following a move", ret);
			} else if ((ret = coordinate(cl, &sn))) {
				etcd_trouble(&cl->log_ns, "coordination", ret);
			}
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
	key_of(cl, cl->member_key, sizeof(cl->member_key), "servers", o->id);
	key_of(cl, cl->removed_key, sizeof(cl->removed_key), "removed", o->id);
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
	for (uint64_t t0 = boot_ns(); ret == -EEXIST &&
				      boot_ns() - t0 < (uint64_t)(o->ttl_s + 2) * 1000000000ull;) {
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
	/* the member key, our acks and our coordinator key go with the lease */
	if (!atomic_load(&cl->lease_gone) &&
	    hkv_etcd_lease_revoke(cl->e, atomic_load(&cl->lease)) == 0)
		hkv_info("cluster: %s left the cluster", cl->id);
	pthread_cond_destroy(&cl->wake);
	pthread_mutex_destroy(&cl->lock);
	hkv_cluster_job_free(cl->job);
	hkv_free(cl->copy_crs);
	hkv_free(cl->gone);
	hkv_free(cl->member_json);
	hkv_etcd_close(cl->ke);
	hkv_etcd_close(cl->e);
	hkv_free(cl);
}
