/*
 * router.c - a handle on a cluster (hkv_config_add_server("etcd://...")):
 * routes each key to its partition's server and runs the single-server
 * protocol there, on a handle of its own per server, opened lazily.
 *
 * The router knows the partition map and the members (common/cluster_map.h),
 * never slots or blocks; the per-server handles know nothing of the cluster.
 *
 * Freshness. A watcher thread (its own etcd connection) waits on PREFIX/map
 * and raises `dirty`; the next operation reloads the map (one etcd range, in
 * the caller's thread) before it routes. A member whose connection failed is
 * not reconnected before the map is read again: a server closes every
 * connection before it gives up partitions (fencing, moves; docs/design.md
 * "Cluster"), so a client that finds its server gone learns the new map
 * before it can write to the old home again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "client/client_int.h"
#include "client/replica.h"
#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

/* Every router clock is hkv_coarse_ns() (a few ms coarse, a few ns to read):
 * it only ages views and connections by milliseconds to seconds. */
#define ROUTER_RETRY_NS  50000000ull /* a member that failed to open: try again after */
#define ROUTER_WATCH_MS  500

struct rmember {
	int same_hash; /* its region hashes keys with the cluster's secret */
	int refused; /* its last open found nobody there (not: refused while fenced) */
	uint64_t used_ns; /* when an operation was last routed to it */
	char id[HKV_CLUSTER_ID_MAX];
	char endpoint[256]; /* "" when the map names a server with no member record */
	struct hkv_config *cfg; /* its own: its own location cache */
	struct hkv_client *h;
	uint64_t retry_ns;
	uint64_t down_until_ns; /* found dead: its keys fail fast until then (0: not) */
};

struct hkv_caches {
	pthread_mutex_t lock;
	atomic_int refs;
	size_t entries;
	struct {
		char endpoint[256];
		struct hkv_cache *cache;
	} *v;
	uint32_t n;
};

static struct hkv_caches *caches_ref(struct hkv_caches *cs)
{
	atomic_fetch_add(&cs->refs, 1);
	return cs;
}

void hkv_caches_unref(struct hkv_caches *cs)
{
	if (!cs || atomic_fetch_sub(&cs->refs, 1) != 1)
		return;
	for (uint32_t i = 0; i < cs->n; i++)
		hkv_cache_unref(cs->v[i].cache);
	hkv_free(cs->v);
	pthread_mutex_destroy(&cs->lock);
	hkv_free(cs);
}

/* The config's table, made by its first cluster handle (one reference). */
static struct hkv_caches *caches_of(const struct hkv_config *cfg_in)
{
	struct hkv_config *cfg = (struct hkv_config *)cfg_in;
	struct hkv_caches *cs;

	pthread_mutex_lock(&cfg->lock);
	if (!cfg->cluster_caches && (cs = hkv_calloc(1, sizeof(*cs)))) {
		pthread_mutex_init(&cs->lock, NULL);
		atomic_init(&cs->refs, 1);
		cs->entries = cfg->cache_entries;
		cfg->cluster_caches = cs;
	}
	cs = cfg->cluster_caches ? caches_ref(cfg->cluster_caches) : NULL;
	pthread_mutex_unlock(&cfg->lock);
	return cs;
}

/* A new reference to endpoint's cache, made on first use; NULL: ENOMEM. */
static struct hkv_cache *cache_for(struct hkv_caches *cs, const char *endpoint)
{
	struct hkv_cache *c = NULL;

	pthread_mutex_lock(&cs->lock);
	for (uint32_t i = 0; i < cs->n && !c; i++)
		if (!strcmp(cs->v[i].endpoint, endpoint))
			c = hkv_cache_ref(cs->v[i].cache);
	if (!c) {
		void *v = hkv_realloc(cs->v, (cs->n + 1) * sizeof(*cs->v));

		if (v) {
			cs->v = v;
			c = hkv_cache_new(cs->entries);
		}
		if (c) {
			snprintf(cs->v[cs->n].endpoint, sizeof(cs->v[cs->n].endpoint), "%s",
				 endpoint);
			cs->v[cs->n++].cache = c;
			c = hkv_cache_ref(c);
		}
	}
	pthread_mutex_unlock(&cs->lock);
	return c;
}

struct hkv_router {
	struct hkv_caches *caches;
	struct hkv_etcd *e; /* the operations' thread */
	char map_key[300], servers_key[300];
	struct hkv_cmap map;
	struct rmember *m;
	uint32_t nm;
	uint32_t *part; /* partition -> member index */
	/* a replicated store (map replicas > 1): one replicated handle per
	 * replica list in use, over the members' handles (replica.c) */
	struct rset {
		uint16_t idx[HKV_MAX_REPLICAS];
		uint32_t n;
		struct hkv_client *h;
	} *sets;
	uint32_t nsets;
	struct hkv_client_stats sets_gone; /* the counters of sets closed */
	uint64_t reload_ns; /* last reload after a failed member */
	uint64_t fail_ns;   /* a dead server's keys fail fast this long (config retry_ms) */
	const struct hkv_config *tmpl; /* a private copy of the user's config */

	pthread_t watcher;
	int watching;
	struct hkv_etcd *we; /* the watcher's */
	atomic_int dirty, stop;
	_Atomic int64_t seen_rev;   /* etcd's revision when the view was read */
	_Atomic uint64_t valid_ns;  /* the view is known current as of then */
	atomic_uint lease_ms;       /* the map's route lease (the watcher reads it) */
	char dir_key[300];
};

static void nap_10ms(void)
{
	struct timespec ts = {0, 10000000L};
	uint64_t end;

	if (!hkv_conn_idle.fn) {
		nanosleep(&ts, NULL);
		return;
	}
	/* a pipe's lane (hatchkv-memcached's connections): the other lanes run
	 * meanwhile, instead of the whole thread sleeping */
	end = hkv_coarse_ns() + 10000000ull;
	while (hkv_coarse_ns() < end)
		hkv_conn_idle.fn(hkv_conn_idle.arg);
}

static int member_index(struct hkv_router *r, const char *id)
{
	for (uint32_t i = 0; i < r->nm; i++)
		if (!strcmp(r->m[i].id, id))
			return (int)i;
	return -1;
}

static void member_close(struct rmember *m)
{
	hkv_close(m->h);
	hkv_config_free(m->cfg);
	m->h = NULL;
	m->cfg = NULL;
}

static void stats_add(struct hkv_client_stats *dst, const struct hkv_client_stats *src)
{
	uint64_t *d = (uint64_t *)dst;
	const uint64_t *s = (const uint64_t *)src;

	for (size_t k = 0; k < sizeof(*dst) / sizeof(uint64_t); k++)
		d[k] += s[k];
}

static void sets_free(struct hkv_router *r)
{
	for (uint32_t i = 0; i < r->nsets; i++) {
		stats_add(&r->sets_gone, &r->sets[i].h->stats); /* (its writes' counters) */
		hkv_repl_close(r->sets[i].h);
	}
	hkv_free(r->sets);
	r->sets = NULL;
	r->nsets = 0;
}

/* Read the members and point each server the map names at its endpoint. */
static int load_members(struct hkv_router *r, const struct hkv_cmap *map)
{
	struct hkv_etcd_kv *kvs;
	struct rmember *nm;
	int n, ret = hkv_etcd_range(r->e, r->servers_key, 1, &kvs, &n, NULL);

	if (ret)
		return ret;
	nm = hkv_calloc(map->nnames ? map->nnames : 1, sizeof(*nm));
	if (!nm) {
		hkv_etcd_kvs_free(kvs, n);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < map->nnames; i++) {
		struct rmember *m = &nm[i];
		int old;

		snprintf(m->id, sizeof(m->id), "%s", map->names[i]);
		for (int k = 0; k < n; k++) {
			struct hkv_cmember rec;

			if (!hkv_cmember_parse(kvs[k].value, kvs[k].vlen, &rec) &&
			    !strcmp(rec.id, m->id))
				memcpy(m->endpoint, rec.endpoint, sizeof(m->endpoint));
		}
		old = member_index(r, m->id);
		if (old >= 0 && !strcmp(r->m[old].endpoint, m->endpoint)) {
			*m = r->m[old]; /* keep its handle */
			r->m[old].h = NULL;
			r->m[old].cfg = NULL;
		}
	}
	for (uint32_t i = 0; i < r->nm; i++)
		member_close(&r->m[i]);
	hkv_free(r->m);
	r->m = nm;
	r->nm = map->nnames;
	hkv_etcd_kvs_free(kvs, n);
	return 0;
}

/*
 * Read the map and the members again. 0 on a usable view (it is then valid
 * for HKV_CLUSTER_ROUTE_LEASE_MS from the moment the first request left);
 * otherwise the last good map stays and the error says why: etcd's error,
 * HKV_EDISCONNECTED (no map yet: no server has joined), HKV_EPROTO (the map
 * in etcd is not usable).
 */
static int reload(struct hkv_router *r)
{
	struct hkv_etcd_kv *kvs;
	struct hkv_cmap map;
	uint32_t *part;
	uint64_t t_sent = hkv_coarse_ns();
	int64_t hdr = 0;
	int n, ret = hkv_etcd_range(r->e, r->map_key, 0, &kvs, &n, &hdr);

	if (ret)
		return ret;
	if (!n) {
		hkv_etcd_kvs_free(kvs, n);
		return HKV_EDISCONNECTED;
	}
	if (kvs[0].mod_rev == r->map.epoch) { /* same map; members may have changed */
		hkv_etcd_kvs_free(kvs, n);
		ret = load_members(r, &r->map);
		goto valid;
	}
	ret = hkv_cmap_parse(kvs[0].value, kvs[0].vlen, &map);
	if (ret) {
		hkv_warn("client: %s is not a usable partition map; keeping epoch %lld",
			 r->map_key, (long long)r->map.epoch);
		hkv_etcd_kvs_free(kvs, n);
		return HKV_EPROTO;
	}
	map.epoch = kvs[0].mod_rev;
	hkv_etcd_kvs_free(kvs, n);
	part = hkv_calloc(map.partitions, sizeof(*part));
	if (!part || (ret = load_members(r, &map))) {
		hkv_free(part);
		hkv_cmap_free(&map);
		return part ? ret : -ENOMEM;
	}
	for (uint32_t p = 0; p < map.partitions; p++)
		part[p] = map.repl[(size_t)p * map.replicas]; /* primaries; names == members */
	hkv_free(r->part);
	r->part = part;
	sets_free(r); /* (member indexes changed) */
	hkv_cmap_free(&r->map);
	r->map = map;
	for (uint32_t i = 0; i < r->nm; i++) /* a new map: no server is known dead in it */
		r->m[i].down_until_ns = 0;
	atomic_store(&r->lease_ms, hkv_cmap_route_lease(&map));
	hkv_debug("client: map epoch %lld, %u partitions on %u servers", (long long)map.epoch,
		  map.partitions, map.nnames);
valid:
	if (!ret) {
		atomic_store(&r->seen_rev, hdr);
		atomic_store(&r->valid_ns, t_sent);
	}
	return ret;
}

/*
 * The watcher: waits on PREFIX/ (members, the map, a move) and raises dirty
 * on any change, so the next operation reads the view again. While nothing
 * changes it proves so every ROUTER_WATCH_MS - a read whose revision is
 * still the one the operations' view was read at - and extends that view's
 * route lease (valid_ns); an operation on a view older than the lease reads
 * it again itself, and fails if etcd cannot be reached.
 */
static void *watch_thread(void *arg)
{
	struct hkv_router *r = arg;
	int64_t rev = atomic_load(&r->seen_rev);

	while (!atomic_load(&r->stop)) {
		int64_t got = 0, hdr = 0, seen = atomic_load(&r->seen_rev);
		/* (proves the view at least three times per route lease) */
		int n, ret, wait_ms = (int)atomic_load(&r->lease_ms) / 3;
		uint64_t t_sent;
		struct hkv_etcd_kv *kvs;

		if (seen > rev)
			rev = seen;
		if (!wait_ms || wait_ms > ROUTER_WATCH_MS)
			wait_ms = ROUTER_WATCH_MS;
		ret = hkv_etcd_watch_wait(r->we, r->dir_key, 1, rev, wait_ms, &got);
		if (!ret) {
			rev = got;
			atomic_store(&r->dirty, 1);
			continue;
		}
		if (ret != -ETIMEDOUT) {
			struct timespec ts = {0, 200000000L};

			nanosleep(&ts, NULL); /* etcd away: the view ages out */
			continue;
		}
		t_sent = hkv_coarse_ns();
		if (hkv_etcd_range(r->we, r->map_key, 0, &kvs, &n, &hdr))
			continue;
		hkv_etcd_kvs_free(kvs, n);
		if (hdr == atomic_load(&r->seen_rev))
			atomic_store(&r->valid_ns, t_sent); /* nothing changed since the view */
		else
			atomic_store(&r->dirty, 1);
	}
	return NULL;
}

/* A new config with src's secret, timeout and limits; server (may be NULL)
 * its one server. NULL and errno on failure. */
static struct hkv_config *config_like(const struct hkv_config *src, const char *server)
{
	struct hkv_config *cfg = hkv_config_new();

	if (!cfg)
		return NULL;
	if ((server && hkv_config_add_server(cfg, server)) ||
	    (src->token && hkv_config_set_token(cfg, src->token)) ||
	    (src->token_file && hkv_config_set_token_file(cfg, src->token_file))) {
		hkv_config_free(cfg);
		errno = EINVAL;
		return NULL;
	}
	cfg->timeout_ms = src->timeout_ms;
	cfg->max_value = src->max_value;
	cfg->cache_entries = src->cache_entries;
	cfg->retry_ms = src->retry_ms;
	return cfg;
}

static struct hkv_config *member_cfg(struct hkv_router *r, const char *endpoint)
{
	struct hkv_config *cfg = config_like(r->tmpl, endpoint);

	if (cfg && !(cfg->cache = cache_for(r->caches, endpoint))) { /* shared, per server */
		hkv_config_free(cfg);
		errno = ENOMEM;
		return NULL;
	}
	return cfg;
}

/* The handle of member i, opened if need be. */
static int member_handle(struct hkv_router *r, uint32_t i, struct hkv_client **out)
{
	struct rmember *m = &r->m[i];
	uint64_t now;
	int ret;

	if (m->h) {
		*out = m->h;
		return 0;
	}
	now = hkv_coarse_ns();
	if (!m->endpoint[0]) { /* no member (any more): out of service */
		m->refused = 1;
		return HKV_EUNAVAILABLE;
	}
	if (now < m->retry_ns)
		return HKV_EDISCONNECTED; /* it just failed */
	if (!m->cfg && !(m->cfg = member_cfg(r, m->endpoint)))
		return -errno;
	ret = hkv_open(m->cfg, &m->h);
	m->refused = ret == -ECONNREFUSED || ret == -ENOENT || ret == -EHOSTUNREACH;
	m->same_hash = !ret && !memcmp(m->h->g.hash_key, r->map.hash_key, sizeof(r->map.hash_key));
	if (ret) {
		m->retry_ns = now + ROUTER_RETRY_NS;
		hkv_debug("client: cannot open %s (%s): %s", m->id, m->endpoint, hkv_strerror(ret));
		return ret == -ECONNREFUSED || ret == -ENOENT ? HKV_EDISCONNECTED : ret;
	}
	*out = m->h;
	return 0;
}

/*
 * Find key's server's handle, connected (hkv_route_begin). Nothing has been
 * posted yet, so a server that cannot be reached is tried again, the map
 * read first: for up to the handle's timeout while it answers but refuses
 * (fenced for a move: a few hundred milliseconds, seconds on a slow host),
 * for up to ROUTER_GONE_MS when nobody answers or it is no member (a dead
 * server: its keys fail fast until the map re-homes them, or in store mode
 * until it is back; one registering again: it is back within that): then
 * HKV_EUNAVAILABLE (nothing was done). Other failures: HKV_EDISCONNECTED.
 *
 * Every connection made here is followed by a read of the map before its
 * first use: a server serves again after a move only once the move is
 * committed, so a connection to it that exists is younger than the commit,
 * and the map read after it names the partition's new home. (A read before
 * connecting could predate the commit.) Without etcd that read fails, and
 * so does the operation: no write on a map we cannot check.
 */
#define ROUTER_GONE_MS 1000
#define ROUTER_IDLE_CHECK_NS 1000000ull


/* Is the view within its route lease? Read it again if it is not (or the
 * watcher saw a change). 0, or why not. */
static int view_fresh(struct hkv_router *r, uint64_t now)
{
	uint64_t lease = hkv_cmap_route_lease(&r->map) * 1000000ull;
	uint64_t age = now - atomic_load_explicit(&r->valid_ns, memory_order_relaxed);

	if ((atomic_load_explicit(&r->dirty, memory_order_relaxed) &&
	     atomic_exchange(&r->dirty, 0)) ||
	    age > lease / 2) {
		reload(r); /* on failure the last good map stays, while its lease lasts */
		now = hkv_coarse_ns();
	}
	if (!r->part)
		return HKV_EDISCONNECTED;
	return now - atomic_load(&r->valid_ns) > lease ? HKV_EDISCONNECTED : 0;
}

/* Member i's handle, connected: 0 and *h, 1 (connected just now: read the
 * view again before using it), or why not. */
static int member_ready(struct hkv_router *r, uint32_t i, uint64_t now, struct hkv_client **h)
{
	int fresh = !r->m[i].h, ret = member_handle(r, i, h);

	if (!ret)
		r->m[i].down_until_ns = 0;

	/* idle a while: ask whether its server closed us (a move's fence)
	 * before posting; a busy handle finds out from its completions */
	if (!ret && !(*h)->conn->error && now - r->m[i].used_ns > ROUTER_IDLE_CHECK_NS)
		hkv_conn_check((*h)->conn);
	r->m[i].used_ns = now;
	if (!ret && (*h)->conn->error) {
		fresh = 1;
		ret = hkv_revive(*h);
		if (ret) { /* open it anew next time: its error says more */
			hkv_close(*h);
			r->m[i].h = NULL;
		}
	}
	return ret ? ret : fresh;
}

/* The replicated handle over partition p's replica list, its members'
 * handles connected (*bad: the member that is not, on an error). */
static int set_ready(struct hkv_router *r, uint32_t p, uint64_t now, struct hkv_client **out,
		     uint32_t *bad)
{
	const uint16_t *list = r->map.repl + (size_t)p * r->map.replicas;
	struct hkv_client *hs[HKV_MAX_REPLICAS];
	uint32_t n = hkv_cmap_len(&r->map, p), k;
	int fresh = 0;

	for (uint32_t j = 0; j < n; j++) {
		int ret = member_ready(r, list[j], now, &hs[j]);

		if (ret < 0) {
			*bad = list[j];
			return ret;
		}
		fresh |= ret;
		hs[j]->repl_member = 1;
	}
	if (fresh)
		return 1;
	for (k = 0; k < r->nsets; k++)
		if (r->sets[k].n == n && !memcmp(r->sets[k].idx, list, n * sizeof(*list)))
			break;
	if (k == r->nsets) {
		struct rset *v = hkv_realloc(r->sets, (r->nsets + 1) * sizeof(*v));
		int ret;

		if (!v)
			return -ENOMEM;
		r->sets = v;
		ret = hkv_repl_wrap(hs, (int)n, r->tmpl->timeout_ms, r->tmpl->max_value,
				    &v[k].h);
		if (ret)
			return ret;
		memcpy(v[k].idx, list, n * sizeof(*list));
		v[k].n = n;
		r->nsets++;
	}
	hkv_repl_members(r->sets[k].h, hs);
	hkv_repl_route_end(r->sets[k].h, atomic_load(&r->valid_ns) +
						 hkv_cmap_route_lease(&r->map) * 1000000ull);
	*out = r->sets[k].h;
	return 0;
}

/*
 * Fail fast (issue 30): is a server partition p's operation needs (its
 * primary; every one of its list for a replicated write) known dead? 1:
 * fail at once; 0 (and *probe if its retry interval is over: this one
 * operation tries it, without waiting).
 */
static int route_down(struct hkv_router *r, uint32_t p, int all, uint64_t now, int *probe)
{
	const uint16_t *list = r->map.repl + (size_t)p * r->map.replicas;
	uint32_t n = all ? hkv_cmap_len(&r->map, p) : 1;

	for (uint32_t j = 0; j < n; j++) {
		uint64_t until = r->m[list[j]].down_until_ns;

		if (!until)
			continue;
		if (now < until)
			return 1;
		*probe = 1;
	}
	return 0;
}

int hkv_route_begin(struct hkv_client *rc, struct hkv_route_try *t, const void *key, size_t klen,
		    struct hkv_client **out)
{
	struct hkv_router *r = rc->router;
	int ret;

	if (!key)
		return -EINVAL;
	for (;;) {
		struct hkv_client *h = NULL;
		uint64_t now = hkv_coarse_ns(), kh; /* the one clock read of a routed op */
		uint32_t i, p;

		if (!t->t0_ns)
			t->t0_ns = now;
		ret = view_fresh(r, now);
		if (ret)
			return ret; /* no view of the cluster we can trust */
		kh = hkv_cmap_hash(&r->map, key, klen);
		p = hkv_cmap_partition_of(&r->map, kh);
		i = r->part[p];
		if (route_down(r, p, r->map.replicas > 1 && !t->read_only, now, &t->probe)) {
			rc->stats.fail_fast++;
			return HKV_EUNAVAILABLE; /* nothing was posted */
		}
		if (r->map.replicas > 1 && !t->read_only) {
			ret = set_ready(r, p, now, &h, &i);
		} else {
			ret = member_ready(r, i, now, &h); /* (a read: the primary alone) */
			if (!ret && r->map.replicas > 1)
				h->repl_member = 1;
		}
		if (ret > 0) {
			/* read the view again after connecting, then route on it (the
			 * handle may be another one by then, or closed) */
			ret = reload(r);
			if (ret)
				return ret < 0 ? HKV_EDISCONNECTED : ret;
			continue;
		}
		if (!ret) {
			t->conn = h->conn; /* (NULL: a replicated handle) */
			t->posts = h->conn ? h->conn->stats.posts : 0;
			if (r->m[i].same_hash && !h->repl) { /* the operation hashes no more */
				h->pre_key = key;
				h->pre_hash = kh;
			}
			*out = h;
			return 0;
		}
		now = hkv_coarse_ns();
		if ((ret != HKV_EDISCONNECTED && ret != HKV_EUNAVAILABLE) ||
		    now - t->t0_ns > (uint64_t)rc->timeout_ms * 1000000ull)
			return ret;
		/* a server that is no member, or refuses: perhaps it is just
		 * registering again (the view may be a moment older than it);
		 * after that (or a probe's one try) it is dead: its keys fail
		 * fast for the retry interval */
		if (r->m[i].refused &&
		    (t->probe || now - t->t0_ns > ROUTER_GONE_MS * 1000000ull)) {
			if (r->fail_ns)
				r->m[i].down_until_ns = now + r->fail_ns;
			return HKV_EUNAVAILABLE; /* nothing was posted */
		}
		if (now - r->reload_ns >= 50000000ull) { /* the map may have moved */
			r->reload_ns = now;
			atomic_store(&r->dirty, 1);
		}
		nap_10ms();
	}
}

int hkv_route_again(struct hkv_client *rc, struct hkv_route_try *t, struct hkv_client *h, int ret)
{
	uint64_t now;

	rc->last_version = h->last_version; /* (hkv_last_version on the cluster handle) */
	if (ret != HKV_EDISCONNECTED)
		return 0; /* (the common case: no clock read) */
	now = hkv_coarse_ns();

	/* A read is tried again whatever it posted; any other operation only
	 * if it posted nothing (its connection found gone at its first post):
	 * then its outcome is known. A replicated write that returns
	 * HKV_EDISCONNECTED decided nothing (else: HKV_EUNKNOWN). */
	if (h->repl) {
		if (now - t->t0_ns > (uint64_t)rc->timeout_ms * 1000000ull)
			return 0;
		atomic_store(&rc->router->dirty, 1);
		nap_10ms();
		return 1;
	}
	if (ret != HKV_EDISCONNECTED || h->conn != t->conn ||
	    (!t->read_only && h->conn->stats.posts != t->posts) ||
	    now - t->t0_ns > (uint64_t)rc->timeout_ms * 1000000ull)
		return 0;
	atomic_store(&rc->router->dirty, 1);
	return 1;
}

int hkv_router_open(const struct hkv_config *cfg, struct hkv_client **out)
{
	struct hkv_client *c = hkv_calloc(1, sizeof(*c));
	struct hkv_router *r = hkv_calloc(1, sizeof(*r));
	struct hkv_config *tmpl = config_like(cfg, NULL);
	const char *uri = cfg->servers[0];
	int ret = -ENOMEM;

	*out = NULL;
	if (!c || !r || !tmpl)
		goto fail;
	r->tmpl = tmpl;
	r->fail_ns = (uint64_t)cfg->retry_ms * 1000000ull;
	r->caches = caches_of(cfg);
	if (!r->caches)
		goto fail;
	/* (no TLS and user without "insecure": -EPERM, and etcd.c says why) */
	if (!(r->e = hkv_etcd_open_sec(uri, &cfg->etcd, cfg->timeout_ms)) ||
	    !(r->we = hkv_etcd_open_sec(uri, &cfg->etcd, cfg->timeout_ms + 2 * ROUTER_WATCH_MS))) {
		ret = errno ? -errno : -EINVAL;
		goto fail;
	}
	snprintf(r->map_key, sizeof(r->map_key), "%s/map", hkv_etcd_prefix(r->e));
	snprintf(r->servers_key, sizeof(r->servers_key), "%s/servers/", hkv_etcd_prefix(r->e));
	snprintf(r->dir_key, sizeof(r->dir_key), "%s/", hkv_etcd_prefix(r->e));
	ret = reload(r);
	if (ret) {
		hkv_warn("client: cluster %s: no usable partition map: %s", uri, hkv_strerror(ret));
		goto fail;
	}
	ret = -pthread_create(&r->watcher, NULL, watch_thread, r);
	if (ret)
		goto fail;
	r->watching = 1;
	c->router = r;
	c->timeout_ms = cfg->timeout_ms;
	c->max_value = cfg->max_value;
	*out = c;
	return 0;
fail:
	if (r && c) {
		r->tmpl = tmpl;
		c->router = r;
		hkv_router_close(c);
	} else {
		hkv_free(r);
		hkv_config_free(tmpl);
	}
	hkv_free(c);
	return ret;
}

void hkv_router_close(struct hkv_client *c)
{
	struct hkv_router *r = c->router;

	if (r->watching) {
		atomic_store(&r->stop, 1);
		pthread_join(r->watcher, NULL); /* within one watch timeout */
	}
	sets_free(r);
	for (uint32_t i = 0; i < r->nm; i++)
		member_close(&r->m[i]);
	hkv_free(r->m);
	hkv_free(r->part);
	hkv_cmap_free(&r->map);
	hkv_etcd_close(r->e);
	hkv_etcd_close(r->we);
	hkv_config_free((struct hkv_config *)r->tmpl);
	hkv_caches_unref(r->caches);
	hkv_free(r);
	c->router = NULL;
}

/* Every member's handle (and its id), opened if need be (flush_all,
 * counts): the first error, after trying them all. */
static int each_member(struct hkv_client *c,
		       int (*fn)(struct hkv_client *h, const char *id, void *arg), void *arg)
{
	struct hkv_router *r = c->router;
	int first = view_fresh(r, hkv_coarse_ns());

	if (first)
		return first;
	for (uint32_t i = 0; i < r->nm; i++) {
		struct hkv_client *h = NULL; /* (set when member_handle succeeds) */
		int ret = member_handle(r, i, &h);

		if (!ret)
			ret = fn(h, r->m[i].id, arg);
		if (ret && !first)
			first = ret;
	}
	return first;
}

static int flush_one(struct hkv_client *h, const char *id, void *arg)
{
	return hkv_flush_all(h);
}

struct primary_of {
	struct hkv_router *r;
	char id[HKV_CLUSTER_ID_MAX]; /* a member */
};

/* Is the member the primary of key's partition (in the map of now: the
 * deletes may read a new one)? */
static int is_primary(void *arg, const void *key, size_t klen)
{
	struct primary_of *po = arg;

	return !strcmp(hkv_cmap_server(&po->r->map, hkv_cmap_partition(&po->r->map, key, klen), 0),
		       po->id);
}

static int flush_replicated(struct hkv_client *c)
{
	struct hkv_router *r = c->router;
	int first = view_fresh(r, hkv_coarse_ns());

	if (first)
		return first;
	for (uint32_t i = 0; i < r->nm; i++) {
		struct primary_of po = {.r = r};
		struct hkv_config *cfg = NULL;
		struct hkv_client *h = NULL;
		int ret;

		snprintf(po.id, sizeof(po.id), "%s", r->m[i].id);
		/* the walk on a handle of its own (the deletes route, and may
		 * reopen the members'); each key through its primary's walk */
		if (!r->m[i].endpoint[0])
			ret = HKV_EUNAVAILABLE;
		else if (!(cfg = config_like(r->tmpl, r->m[i].endpoint)))
			ret = -errno;
		else if (!(ret = hkv_open(cfg, &h)))
			ret = hkv_flush_by_deletes(h, c, is_primary, &po);
		hkv_close(h);
		hkv_config_free(cfg);
		if (ret && !first)
			first = ret;
	}
	return first;
}

int hkv_router_flush_all(struct hkv_client *c)
{
	if (c->router->map.replicas > 1)
		return flush_replicated(c); /* replicated deletes, key by key */
	return each_member(c, flush_one, NULL);
}

struct counts {
	struct hkv_router *r;
	uint64_t items, bytes;
};

/* A member's count. In a replicated cluster a member holds its primaries'
 * keys, its backups' copies and tombstones: each key is counted once, on
 * its primary's walk, and a tombstone never. */
static int count_one(struct hkv_client *h, const char *id, void *arg)
{
	struct counts *t = arg;
	struct primary_of po = {.r = t->r};
	uint64_t items, bytes;
	int ret;

	snprintf(po.id, sizeof(po.id), "%s", id);
	ret = t->r->map.replicas > 1 ? hkv_count_present(h, is_primary, &po, &items, &bytes)
				     : hkv_count_items(h, &items, &bytes);
	if (!ret) {
		t->items += items;
		t->bytes += bytes;
	}
	return ret;
}

int hkv_router_count_items(struct hkv_client *c, uint64_t *items, uint64_t *bytes)
{
	struct counts t = {.r = c->router};
	int ret = each_member(c, count_one, &t);

	*items = t.items;
	*bytes = t.bytes;
	return ret;
}

static int info_one(struct hkv_client *h, const char *id, void *arg)
{
	struct hkv_server_info *t = arg, one;

	hkv_server_info(h, &one);
	t->region_bytes += one.region_bytes;
	t->index_slots += one.index_slots;
	t->value_bytes += one.value_bytes;
	t->segment_bytes = one.segment_bytes;
	t->max_value = one.max_value;
	t->max_item = one.max_item;
	t->cache_mode = one.cache_mode;
	return 0;
}

void hkv_router_server_info(const struct hkv_client *c, struct hkv_server_info *out)
{
	memset(out, 0, sizeof(*out));
	each_member((struct hkv_client *)c, info_one, out);
	out->replicas = c->router->map.replicas ? c->router->map.replicas : 1;
}

/* Sums over the members' handles (those opened so far). */
void hkv_router_stats(const struct hkv_client *c, struct hkv_client_stats *out)
{
	const struct hkv_router *r = c->router;

	*out = r->sets_gone; /* replicated writes are counted by the sets */
	out->fail_fast += c->stats.fail_fast; /* (the router's own) */
	for (uint32_t i = 0; i < r->nsets; i++)
		stats_add(out, &r->sets[i].h->stats);
	for (uint32_t i = 0; i < r->nm; i++)
		if (r->m[i].h)
			stats_add(out, &r->m[i].h->stats);
}

uint32_t hkv_router_time(struct hkv_client *c)
{
	const struct hkv_router *r = c->router;

	for (uint32_t i = 0; i < r->nm; i++)
		if (r->m[i].h && !r->m[i].h->conn->error)
			return hkv_time(r->m[i].h);
	return (uint32_t)time(NULL); /* no member reachable: ours, for display only */
}

void hkv_router_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum)
{
	const struct hkv_router *r = c->router;

	for (uint32_t i = 0; i < r->nm; i++)
		if (r->m[i].h)
			hkv_client_conn_totals(r->m[i].h, sum);
}

/*
 * Multi-get: the items grouped by server; every server's first round (as
 * many keys as its send queue and read buffer hold) is posted before any is
 * waited for, so warm keys spread over the servers take one round trip of
 * wall time, cold ones two. A group whose server
 * closed us is read again on a fresh route (reads are safe to repeat), up
 * to 3 rounds.
 */
int hkv_router_mget(struct hkv_client *c, struct hkv_mget_item *items, size_t n)
{
	struct hkv_router *r = c->router;
	struct hkv_mget_item *group = hkv_malloc((n ? n : 1) * sizeof(*group));
	size_t *idx = hkv_malloc((n ? n : 1) * sizeof(*idx));
	uint8_t *pending = hkv_malloc(n ? n : 1);
	struct hkv_mget_pending *pd = NULL;
	size_t *start = NULL, *count = NULL;
	int *state = NULL, first = 0;

	if (!group || !idx || !pending) {
		first = -ENOMEM;
		goto out;
	}
	for (size_t j = 0; j < n; j++) {
		pending[j] = items[j].key != NULL;
		if (!items[j].key)
			items[j].status = -EINVAL;
	}
	for (int round = 0; round < 3; round++) {
		size_t k = 0;
		int again = 0;

		if (round)
			nap_10ms();
		if (view_fresh(r, hkv_coarse_ns()))
			break;
		hkv_free(pd);
		hkv_free(start);
		hkv_free(count);
		hkv_free(state);
		pd = hkv_calloc(r->nm ? r->nm : 1, sizeof(*pd));
		start = hkv_calloc(r->nm ? r->nm : 1, sizeof(*start));
		count = hkv_calloc(r->nm ? r->nm : 1, sizeof(*count));
		state = hkv_calloc(r->nm ? r->nm : 1, sizeof(*state));
		if (!pd || !start || !count || !state) {
			first = -ENOMEM;
			goto out;
		}
		for (uint32_t mi = 0; mi < r->nm; mi++) { /* the groups, side by side */
			start[mi] = k;
			for (size_t j = 0; j < n; j++) {
				if (!pending[j] || r->part[hkv_cmap_partition(&r->map, items[j].key,
									      items[j].klen)] != mi)
					continue;
				idx[k] = j;
				group[k++] = items[j];
			}
			count[mi] = k - start[mi];
		}
		for (uint32_t mi = 0; mi < r->nm; mi++) { /* post every first round */
			struct hkv_client *h;
			int ret;

			if (!count[mi])
				continue;
			ret = member_handle(r, mi, &h);
			if (!ret && (h->conn->error || hkv_conn_check(h->conn))) {
				/* reconnect, then read the view before using it */
				ret = hkv_revive(h);
				if (!ret)
					ret = HKV_EDISCONNECTED;
			}
			if (!ret)
				ret = hkv_mget_start(h, group + start[mi], count[mi], &pd[mi]);
			state[mi] = ret ? ret : 1;
		}
		for (uint32_t mi = 0; mi < r->nm; mi++) { /* then wait for them */
			int ret = state[mi];

			if (!count[mi])
				continue;
			if (ret == 1)
				ret = hkv_mget_finish(r->m[mi].h, &pd[mi]);
			if (ret == HKV_EDISCONNECTED) {
				again = 1;
				atomic_store(&r->dirty, 1);
				continue;
			}
			for (size_t j = start[mi]; j < start[mi] + count[mi]; j++) {
				items[idx[j]] = group[j];
				pending[idx[j]] = 0;
				if (ret)
					items[idx[j]].status = ret;
			}
			if (ret && !first)
				first = ret;
		}
		if (!again)
			break;
	}
	for (size_t j = 0; j < n; j++)
		if (pending[j]) {
			items[j].status = HKV_EDISCONNECTED;
			if (!first)
				first = HKV_EDISCONNECTED;
		}
out:
	hkv_free(group);
	hkv_free(idx);
	hkv_free(pending);
	hkv_free(pd);
	hkv_free(start);
	hkv_free(count);
	hkv_free(state);
	return first;
}
