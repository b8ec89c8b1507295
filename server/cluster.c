/* cluster.c - membership, fencing and coordination in etcd (see cluster.h). */
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "hatchkv_err.h"
#include "server/cluster.h"

struct hkv_cluster {
	struct hkv_etcd *e; /* the thread's; hkv_cluster_start's before it runs */
	char prefix[256], id[HKV_CLUSTER_ID_MAX];
	char member_key[512], removed_key[512];
	char *member_json;
	int ttl_s;
	uint32_t partitions;
	pthread_t thr;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	int stop;               /* under lock */
	int64_t lease;          /* the thread's */
	int leader;             /* the thread's */
	uint64_t etcd_log_ns;   /* the thread's: last "cannot reach etcd" line */
	_Atomic uint64_t ok_sent_ns; /* sending time of the last answered keepalive */
	atomic_int lease_gone, rejoin, removed;
	/* Moves (cluster.h): while PREFIX/next takes partitions from us we are
	 * fenced; the loop purges them (purge_map, under lock) and says so in
	 * purged_rev; the thread then acks. */
	atomic_int move_fence;
	struct hkv_cmap *purge_map; /* under lock: handed to the loop */
	_Atomic int64_t purged_rev;
	int64_t acked_rev, fence_rev; /* the thread's */
	uint64_t last_keepalive_ns; /* the thread's */
	uint64_t next_seen_ns; int64_t next_seen_rev; /* the thread's (coordinator) */
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int hkv_cluster_fenced(struct hkv_cluster *cl)
{
	uint64_t limit = (uint64_t)cl->ttl_s * 1000000000ull - HKV_CLUSTER_GUARD_MS * 1000000ull;

	return atomic_load(&cl->removed) || atomic_load(&cl->lease_gone) ||
	       atomic_load(&cl->rejoin) || atomic_load(&cl->move_fence) || mono_ns() - atomic_load(&cl->ok_sent_ns) >= limit;
}

const char *hkv_cluster_fence_reason(struct hkv_cluster *cl)
{
	if (atomic_load(&cl->removed))
		return "removed by an operator";
	if (atomic_load(&cl->move_fence))
		return "giving up partitions (a move)";
	if (atomic_load(&cl->lease_gone) || atomic_load(&cl->rejoin))
		return "the cluster lease is gone";
	return "cannot renew the cluster lease in time";
}

int hkv_cluster_rejoined(struct hkv_cluster *cl)
{
	return atomic_exchange(&cl->rejoin, 0);
}

int hkv_cluster_removed(struct hkv_cluster *cl)
{
	return atomic_load(&cl->removed);
}

const char *hkv_cluster_id(const struct hkv_cluster *cl)
{
	return cl->id;
}

struct hkv_cmap *hkv_cluster_take_purge(struct hkv_cluster *cl)
{
	struct hkv_cmap *m;

	pthread_mutex_lock(&cl->lock);
	m = cl->purge_map;
	cl->purge_map = NULL;
	pthread_mutex_unlock(&cl->lock);
	return m;
}

void hkv_cluster_purged(struct hkv_cluster *cl, struct hkv_cmap *map)
{
	atomic_store(&cl->purged_rev, map->epoch);
	pthread_mutex_lock(&cl->lock);
	pthread_cond_signal(&cl->wake); /* ack at once */
	pthread_mutex_unlock(&cl->lock);
	hkv_cmap_free(map);
	hkv_free(map);
}

/* Does id hold, in a, the primary of a partition that b gives to another? */
static int loses(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id)
{
	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		if (!strcmp(hkv_cmap_server(a, p, 0), id) && strcmp(hkv_cmap_server(b, p, 0), id))
			return 1;
	return 0;
}

/*
 * One round's view of the cluster: a single range over PREFIX/ (members,
 * drains, removals, the map, a pending move, acks, the coordinator), so a
 * round costs etcd one request however many questions it answers.
 */
struct snap {
	struct hkv_etcd_kv *kvs;
	int n;
};

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

/* PREFIX/dir/id (id NULL: PREFIX/dir), or NULL. */
static const struct hkv_etcd_kv *snap_get(const struct hkv_cluster *cl, const struct snap *sn,
					  const char *dir, const char *id)
{
	char key[512];

	if (id)
		snprintf(key, sizeof(key), "%s/%s/%s", cl->prefix, dir, id);
	else
		snprintf(key, sizeof(key), "%s/%s", cl->prefix, dir);
	for (int i = 0; i < sn->n; i++)
		if (!strcmp(sn->kvs[i].key, key))
			return &sn->kvs[i];
	return NULL;
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
 * our ID), -EPERM (removed by an operator) or etcd's error. */
static int do_register(struct hkv_cluster *cl)
{
	uint64_t t_sent = mono_ns();
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
	cl->lease = lease;
	cl->leader = 0;
	atomic_store(&cl->ok_sent_ns, t_sent);
	return 0;
}

static void etcd_trouble(struct hkv_cluster *cl, const char *what, int err)
{
	uint64_t now = mono_ns();

	if (now - cl->etcd_log_ns < 5000000000ull)
		return;
	cl->etcd_log_ns = now;
	hkv_warn("cluster: %s: %s", what, hkv_strerror(err));
}

/* The members not draining, in key order. */
static int read_members(struct hkv_cluster *cl, const struct snap *sn,
			char (**ids)[HKV_CLUSTER_ID_MAX], uint32_t *n)
{
	char dir[300];
	size_t dl;

	snprintf(dir, sizeof(dir), "%s/servers/", cl->prefix);
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

static int same_placement(const struct hkv_cmap *a, const struct hkv_cmap *b)
{
	if (a->partitions != b->partitions || a->replicas != b->replicas)
		return 0;
	for (uint32_t p = 0; p < a->partitions; p++)
		for (uint32_t r = 0; r < a->replicas; r++)
			if (strcmp(hkv_cmap_server(a, p, r), hkv_cmap_server(b, p, r)))
				return 0;
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

	if (strncmp(p, "{\"base\":\"", 9))
		return -EPROTO;
	*base = strtoll(p + 9, &num_end, 10);
	if (strncmp(num_end, "\",\"map\":", 8) || end - num_end < 10 || end[-1] != '}')
		return -EPROTO;
	p = num_end + 8;
	if (hkv_cmap_parse(p, (size_t)(end - 1 - p), map))
		return -EPROTO;
	map->epoch = kv->mod_rev;
	return 0;
}

static int is_member(struct hkv_cluster *cl, const struct snap *sn, const char *id)
{
	return snap_get(cl, sn, "servers", id) != NULL;
}

static int has_acked(struct hkv_cluster *cl, const struct snap *sn, const char *id, int64_t rev)
{
	const struct hkv_etcd_kv *kv = snap_get(cl, sn, "ack", id);

	return kv && strtoll(kv->value, NULL, 10) == rev;
}

/* Leader, a move under way: commit PREFIX/next once every live server
 * that gives up partitions has purged them and acked. */
static int drive_move(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *nk,
		      const struct hkv_cmap *cur, int64_t cur_rev)
{
	char key[512], *json;
	struct hkv_cmap next;
	int64_t base, rev;
	int ret;

	snprintf(key, sizeof(key), "%s/next", cl->prefix);
	if (next_parse(nk, &next, &base) || base != cur_rev) {
		hkv_etcd_delete_if(cl->e, key, nk->mod_rev); /* stale or garbage: start over */
		return 0;
	}
	for (uint32_t i = 0; i < cur->nnames; i++) {
		const char *id = cur->names[i];

		if (loses(cur, &next, id) && is_member(cl, sn, id) &&
		    !has_acked(cl, sn, id, nk->mod_rev)) {
			if (cl->next_seen_rev != nk->mod_rev) {
				cl->next_seen_rev = nk->mod_rev;
				cl->next_seen_ns = mono_ns();
			} else if (mono_ns() - cl->next_seen_ns > 5000000000ull) {
				hkv_warn("cluster: move to map %lld waits for %s to ack",
					 (long long)nk->mod_rev, id);
				cl->next_seen_ns = mono_ns();
			}
			hkv_cmap_free(&next);
			return 0;
		}
	}
	json = hkv_cmap_format(&next);
	ret = json ? 0 : -ENOMEM;
	snprintf(key, sizeof(key), "%s/map", cl->prefix);
	if (!ret)
		ret = hkv_etcd_put_if(cl->e, key, json, strlen(json), cur_rev, 0, &rev);
	hkv_free(json);
	if (!ret) {
		hkv_info("cluster: map epoch %lld: %u partitions on %u servers, %u moved",
			 (long long)rev, next.partitions, next.nnames, hkv_cmap_moved(cur, &next));
		snprintf(key, sizeof(key), "%s/next", cl->prefix);
		hkv_etcd_delete_if(cl->e, key, nk->mod_rev);
	}
	hkv_cmap_free(&next);
	return ret == -ECANCELED ? 0 : ret;
}

/* Leader: make PREFIX/map place every partition on the members. */
static int recompute_map(struct hkv_cluster *cl, const struct snap *sn)
{
	char key[512], *json;
	char (*ids)[HKV_CLUSTER_ID_MAX] = NULL;
	const struct hkv_etcd_kv *mk = snap_get(cl, sn, "map", NULL);
	const struct hkv_etcd_kv *nk = snap_get(cl, sn, "next", NULL);
	struct hkv_cmap cur = {0}, want = {0};
	uint32_t n;
	int ret, two_phase = 0;
	int64_t rev = 0;

	ret = read_members(cl, sn, &ids, &n);
	if (ret || !n)
		goto out;
	snprintf(key, sizeof(key), "%s/map", cl->prefix);
	if (mk) {
		ret = hkv_cmap_parse(mk->value, mk->vlen, &cur);
		if (ret) {
			hkv_err("cluster: %s is not a partition map; leaving it alone", key);
			goto out;
		}
		rev = mk->mod_rev;
		cur.epoch = rev;
		if (nk) {
			ret = drive_move(cl, sn, nk, &cur, rev);
			goto out;
		}
		want.partitions = cur.partitions;
		want.replicas = cur.replicas;
		memcpy(want.hash_key, cur.hash_key, sizeof(want.hash_key));
	} else {
		want.partitions = cl->partitions;
		want.replicas = 1;
		randombytes_buf(want.hash_key, sizeof(want.hash_key));
	}
	ret = hkv_cmap_place(&want, (const char (*)[HKV_CLUSTER_ID_MAX])ids, n);
	if (ret || (mk && same_placement(&cur, &want)))
		goto out;
	/* A live server that gives up partitions must purge them first: the
	 * map waits in PREFIX/next until it acks (drive_move). */
	for (uint32_t i = 0; mk && i < cur.nnames && !two_phase; i++)
		two_phase = loses(&cur, &want, cur.names[i]) && is_member(cl, sn, cur.names[i]);
	if (two_phase) {
		json = next_format(&want, rev);
		snprintf(key, sizeof(key), "%s/next", cl->prefix);
		ret = json ? hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL) : -ENOMEM;
		hkv_free(json);
		if (!ret)
			hkv_info("cluster: moving %u partitions (map %lld -> next)",
				 hkv_cmap_moved(&cur, &want), (long long)rev);
		if (ret == -ECANCELED)
			ret = 0;
		goto out;
	}
	json = hkv_cmap_format(&want);
	if (!json) {
		ret = -ENOMEM;
		goto out;
	}
	ret = hkv_etcd_put_if(cl->e, key, json, strlen(json), rev, 0, &want.epoch);
	hkv_free(json);
	if (!ret)
		hkv_info("cluster: map epoch %lld: %u partitions on %u servers, %u moved",
			 (long long)want.epoch, want.partitions, n,
			 mk ? hkv_cmap_moved(&cur, &want) : want.partitions);
	else if (ret == -ECANCELED)
		ret = 0; /* someone else wrote it: look again next round */
out:
	hkv_cmap_free(&cur);
	hkv_cmap_free(&want);
	hkv_free(ids);
	return ret;
}

/* Every member: does a pending move take partitions from us? Then fence,
 * have the loop purge them, ack; unfence once the move is over. */
static int follow_move(struct hkv_cluster *cl, const struct snap *sn)
{
	char key[512], val[32];
	const struct hkv_etcd_kv *nk = snap_get(cl, sn, "next", NULL);
	const struct hkv_etcd_kv *mk = snap_get(cl, sn, "map", NULL);
	struct hkv_cmap cur = {0}, *next = NULL;
	int64_t base;
	int ret = 0;

	if (!nk) { /* no move (any more): committed or dropped */
		if (atomic_load(&cl->move_fence)) {
			hkv_info("cluster: move over, %s serves again", cl->id);
			atomic_store(&cl->move_fence, 0);
		}
		goto out;
	}
	if (cl->acked_rev == nk->mod_rev || cl->fence_rev == nk->mod_rev) {
		if (cl->acked_rev != nk->mod_rev &&
		    atomic_load(&cl->purged_rev) == nk->mod_rev) {
			snprintf(key, sizeof(key), "%s/ack/%s", cl->prefix, cl->id);
			snprintf(val, sizeof(val), "%lld", (long long)nk->mod_rev);
			ret = hkv_etcd_put(cl->e, key, val, strlen(val), cl->lease, NULL);
			if (!ret)
				cl->acked_rev = nk->mod_rev;
		}
		goto out;
	}
	next = hkv_calloc(1, sizeof(*next));
	if (!next)
		return -ENOMEM;
	if (!mk || hkv_cmap_parse(mk->value, mk->vlen, &cur) || next_parse(nk, next, &base) ||
	    base != mk->mod_rev)
		goto out; /* nothing we can act on: the coordinator cleans up */
	if (loses(&cur, next, cl->id)) {
		hkv_info("cluster: %s gives up %u partitions: fenced to purge them", cl->id,
			 hkv_cmap_moved(&cur, next));
		cl->fence_rev = nk->mod_rev;
		atomic_store(&cl->move_fence, 1);
		pthread_mutex_lock(&cl->lock);
		if (cl->purge_map) {
			hkv_cmap_free(cl->purge_map);
			hkv_free(cl->purge_map);
		}
		cl->purge_map = next;
		pthread_mutex_unlock(&cl->lock);
		next = NULL;
	}
out:
	if (next) {
		hkv_cmap_free(next);
		hkv_free(next);
	}
	hkv_cmap_free(&cur);
	return ret;
}

static int coordinate(struct hkv_cluster *cl, const struct snap *sn)
{
	const struct hkv_etcd_kv *ck = snap_get(cl, sn, "coordinator", NULL);
	char key[512];
	int64_t rev;
	int ret, was = cl->leader;

	if (!ck) {
		snprintf(key, sizeof(key), "%s/coordinator", cl->prefix);
		ret = hkv_etcd_put_if(cl->e, key, cl->id, strlen(cl->id), 0, cl->lease, &rev);
		return ret == -ECANCELED ? 0 : ret; /* the next round's view says who won */
	}
	cl->leader = ck->lease == cl->lease;
	if (cl->leader && !was)
		hkv_info("cluster: %s coordinates", cl->id);
	return cl->leader ? recompute_map(cl, sn) : 0;
}

/* Sleep up to ms, or until hkv_cluster_stop / hkv_cluster_purged wake us. */
static void nap(struct hkv_cluster *cl, int ms)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	until.tv_sec += ms / 1000 + until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&cl->lock);
	if (!cl->stop)
		pthread_cond_timedwait(&cl->wake, &cl->lock, &until);
	pthread_mutex_unlock(&cl->lock);
}

/*
 * Each round: the keepalive when due, registration if the lease is gone,
 * then one read of PREFIX/ that every decision of the round works from.
 * Between rounds it waits on an etcd watch of PREFIX/ (a member joining or
 * leaving, an ack, a map) until the next keepalive is due, so it reacts at
 * once and costs etcd nothing while nothing changes; while a purge of ours
 * is to be acked it looks every 20 ms instead.
 */
static void *cluster_thread(void *arg)
{
	struct hkv_cluster *cl = arg;
	uint64_t keepalive_ns = (uint64_t)cl->ttl_s * 1000000000ull / 3;
	char dir[300];

	snprintf(dir, sizeof(dir), "%s/", cl->prefix);
	for (;;) {
		uint64_t t_sent = mono_ns(), due;
		int64_t rev = 0, got;
		int ret, ttl = 0, wait_ms;

		pthread_mutex_lock(&cl->lock);
		if (cl->stop) {
			pthread_mutex_unlock(&cl->lock);
			break;
		}
		pthread_mutex_unlock(&cl->lock);

		if (!atomic_load(&cl->lease_gone) && t_sent - cl->last_keepalive_ns >= keepalive_ns) {
			cl->last_keepalive_ns = t_sent;
			ret = hkv_etcd_lease_keepalive(cl->e, cl->lease, &ttl);
			if (!ret && ttl > 0) {
				atomic_store(&cl->ok_sent_ns, t_sent);
			} else if (ret == -ENOENT || (!ret && ttl <= 0)) {
				hkv_warn("cluster: lease of %s is gone: fenced until registered again",
					 cl->id);
				atomic_store(&cl->lease_gone, 1);
			} else {
				etcd_trouble(cl, "lease keepalive", ret);
			}
		}
		if (atomic_load(&cl->lease_gone) && !atomic_load(&cl->removed)) {
			ret = do_register(cl);
			if (!ret) {
				hkv_info("cluster: %s registered again", cl->id);
				atomic_store(&cl->rejoin, 1);
				atomic_store(&cl->lease_gone, 0);
			} else if (ret == -EPERM) {
				hkv_warn("cluster: %s was removed by an operator", cl->id);
				atomic_store(&cl->removed, 1);
			} else {
				etcd_trouble(cl, "register", ret);
			}
		}
		if (!atomic_load(&cl->lease_gone)) {
			struct snap sn = {0};

			ret = snap_read(cl, &sn, &rev);
			if (ret) {
				etcd_trouble(cl, "reading the cluster", ret);
				rev = 0;
			} else if (snap_get(cl, &sn, "removed", cl->id)) {
				hkv_warn("cluster: %s was removed by an operator", cl->id);
				atomic_store(&cl->removed, 1);
			} else if ((ret = follow_move(cl, &sn))) {
				etcd_trouble(cl, "following a move", ret);
			} else if ((ret = coordinate(cl, &sn))) {
				etcd_trouble(cl, "coordination", ret);
			}
			snap_free(&sn);
		}
		due = cl->last_keepalive_ns + keepalive_ns;
		t_sent = mono_ns();
		wait_ms = due > t_sent ? (int)((due - t_sent) / 1000000ull) : 0;
		if (wait_ms > 1000)
			wait_ms = 1000;
		if (cl->fence_rev && cl->acked_rev != cl->fence_rev && atomic_load(&cl->move_fence))
			nap(cl, wait_ms < 20 ? wait_ms : 20); /* our purge: ack it soon */
		else if (rev && wait_ms >= 20 && !atomic_load(&cl->removed))
			hkv_etcd_watch_wait(cl->e, dir, 1, rev, wait_ms, &got);
		else
			nap(cl, wait_ms < 200 ? (wait_ms > 10 ? wait_ms : 10) : 200);
	}
	return NULL;
}

struct hkv_cluster *hkv_cluster_start(const struct hkv_cluster_opts *o)
{
	struct hkv_cluster *cl;
	struct hkv_cmember m = {0};
	int ret;

	if (!hkv_cluster_id_valid(o->id) || o->ttl_s < 2 || !o->partitions ||
	    o->partitions > HKV_CLUSTER_MAX_PARTS || strlen(o->endpoint) >= sizeof(m.endpoint)) {
		errno = EINVAL;
		return NULL;
	}
	cl = hkv_calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->e = hkv_etcd_open(o->uri, 3000);
	if (!cl->e) {
		ret = -errno;
		goto free_cl;
	}
	snprintf(cl->prefix, sizeof(cl->prefix), "%s", hkv_etcd_prefix(cl->e));
	snprintf(cl->id, sizeof(cl->id), "%s", o->id);
	snprintf(cl->member_key, sizeof(cl->member_key), "%s/servers/%s", cl->prefix, o->id);
	snprintf(cl->removed_key, sizeof(cl->removed_key), "%s/removed/%s", cl->prefix, o->id);
	cl->ttl_s = o->ttl_s;
	cl->partitions = o->partitions;
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
	if (ret)
		goto free_json;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->wake, NULL);
	ret = -pthread_create(&cl->thr, NULL, cluster_thread, cl);
	if (ret)
		goto destroy_sync;
	hkv_info("cluster: %s registered in %s (lease %d s)", o->id, o->uri, o->ttl_s);
	return cl;

destroy_sync:
	pthread_cond_destroy(&cl->wake);
	pthread_mutex_destroy(&cl->lock);
	hkv_etcd_lease_revoke(cl->e, cl->lease);
free_json:
	hkv_free(cl->member_json);
close_etcd:
	hkv_etcd_close(cl->e);
free_cl:
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
	pthread_cond_signal(&cl->wake);
	pthread_mutex_unlock(&cl->lock);
	pthread_join(cl->thr, NULL);
	/* the member key and our coordinator key go with the lease */
	if (!atomic_load(&cl->lease_gone) && hkv_etcd_lease_revoke(cl->e, cl->lease) == 0)
		hkv_info("cluster: %s left the cluster", cl->id);
	pthread_cond_destroy(&cl->wake);
	pthread_mutex_destroy(&cl->lock);
	if (cl->purge_map) {
		hkv_cmap_free(cl->purge_map);
		hkv_free(cl->purge_map);
	}
	hkv_free(cl->member_json);
	hkv_etcd_close(cl->e);
	hkv_free(cl);
}
