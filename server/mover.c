/* mover.c - a store-mode move's copy, in slices of the event loop (see mover.h). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <sodium.h>

#include "client/copy.h"
#include "common/cluster_map.h"
#include "common/hkv_alloc.h"
#include "common/layout.h"
#include "common/log.h"
#include "hatchkv.h"
#include "server/cluster.h"
#include "server/mover.h"
#include "server/store.h"

#define MOVE_TIMEOUT_MS 5000
/* One slice's bounds. Measured on shm (2 busy cores, 4000-byte values): a
 * copy of 256 KiB takes 2-8 ms; a count slice (64 Ki slots, headers and
 * keys read, nothing copied) under 2 ms. */
#define SLICE_SLOTS (64u * 1024)
#define SLICE_ITEMS 256u
#define SLICE_BYTES (256u << 10)

enum phase { COUNT, COPY };

struct hkv_move {
	struct event *ev;
	struct hkv_store *s;
	struct hkv_cluster *cl;
	struct hkv_cluster_job job; /* taken over: maps, homes; kind, rev, gen */
	const char *self;
	char *token;
	uint64_t max_value;
	struct hkv_client **h; /* per name of job.map, opened on first use */
	uint32_t now;          /* expiry is judged at this one time, count and copy */
	enum phase phase;
	uint64_t slot, nslots; /* the walk's cursor */
	struct hkv_move_stats st, total;
	uint64_t t0, t_counted, slices;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int home_handle(struct hkv_move *mv, uint32_t i, struct hkv_client **out)
{
	const struct hkv_cmember *home = &mv->job.homes[i];
	struct hkv_config *cfg;
	int ret;

	if (mv->h[i]) {
		*out = mv->h[i];
		return 0;
	}
	if (!home->endpoint[0])
		return -ENOENT; /* (a name we hold no member record of) */
	cfg = hkv_config_new();
	if (!cfg)
		return -ENOMEM;
	ret = hkv_config_add_server(cfg, home->endpoint);
	if (!ret)
		ret = hkv_config_set_token(cfg, mv->token);
	if (!ret)
		ret = hkv_config_set_timeout_ms(cfg, MOVE_TIMEOUT_MS);
	if (!ret)
		ret = hkv_config_set_max_value(cfg, mv->max_value);
	if (!ret)
		ret = hkv_open(cfg, &mv->h[i]);
	hkv_config_free(cfg);
	if (ret) {
		hkv_err("cluster: cannot reach new home %s (%s) to copy into: %s", home->id,
			home->endpoint, hkv_strerror(ret));
		return ret;
	}
	*out = mv->h[i];
	return 0;
}

/* The live block slot i names, if any (hkv_store_walk's checks; LIVE only:
 * a PENDING insert the fence cut off was never acknowledged). */
static struct hkv_block_hdr *live_block(const struct hkv_store *s, uint64_t i)
{
	const struct hkv_geometry *g = s->geom;
	uint8_t *base = s->region.base;
	const uint64_t *slots = (const uint64_t *)(base + g->index_off);
	uint64_t data_end = g->data_off + (uint64_t)g->nsegs * g->seg_size;
	uint64_t sl = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE), off, rel, meta;
	struct hkv_block_hdr *h;
	uint32_t cls, len;

	if (!sl)
		return NULL;
	off = hkv_slot_off(sl);
	cls = hkv_slot_class(sl);
	if (cls >= g->nclasses || off < g->data_off || off >= data_end)
		return NULL; /* garbage: readers ignore it too */
	len = g->class_size[cls];
	rel = off - g->data_off;
	if (rel % g->seg_size + len > g->seg_size || (rel % g->seg_size) % len)
		return NULL;
	h = (struct hkv_block_hdr *)(base + off);
	meta = __atomic_load_n(&h->meta, __ATOMIC_ACQUIRE);
	if (hkv_meta_state(meta) != HKV_BLK_LIVE || hkv_meta_class(meta) != cls ||
	    sizeof(*h) + h->klen + (uint64_t)h->vlen > len)
		return NULL;
	return h;
}

enum fate { STAYS, MOVES, EXPIRED };

/* An item of a partition cur places on us and map elsewhere MOVES (or is
 * left behind, EXPIRED); any other STAYS (or is a stray: not ours to hand
 * on). Its partition in *p. */
static enum fate fate_of(const struct hkv_move *mv, const struct hkv_block_hdr *h, uint32_t *p)
{
	const uint8_t *key = (const uint8_t *)(h + 1);

	*p = hkv_cmap_partition(mv->job.map, key, h->klen);
	if (!strcmp(hkv_cmap_server(mv->job.map, *p, 0), mv->self) ||
	    strcmp(hkv_cmap_server(mv->job.cur, *p, 0), mv->self))
		return STAYS;
	return h->exptime && h->exptime <= mv->now ? EXPIRED : MOVES;
}

static int copy_one(struct hkv_move *mv, const struct hkv_block_hdr *h, uint32_t p)
{
	const uint8_t *key = (const uint8_t *)(h + 1);
	uint32_t i = mv->job.map->repl[(size_t)p * mv->job.map->replicas];
	struct hkv_client *c;
	int ret;

	if (h->sum != hkv_block_sum(h, key)) {
		hkv_err("cluster: a live item fails its CRC during a move's copy");
		return HKV_ECORRUPT;
	}
	ret = home_handle(mv, i, &c);
	if (!ret)
		ret = hkv_put_copy(c, key, h->klen, key + h->klen, h->vlen, h->flags, h->exptime,
				   h->wid, h->pred); /* a cas token from before the move still matches */
	if (ret) {
		hkv_err("cluster: copying an item to %s: %s", mv->job.map->names[i],
			hkv_strerror(ret));
		return ret;
	}
	mv->st.items++;
	mv->st.bytes += (uint64_t)h->klen + h->vlen;
	hkv_cluster_progress_add(HKV_PROGRESS_COPY, (uint64_t)h->klen + h->vlen, 1);
	return 0;
}

/* One slice of the walk; 1: more to do, 0: the walk is over, or an error. */
static int slice(struct hkv_move *mv)
{
	uint64_t end = mv->slot + SLICE_SLOTS < mv->nslots ? mv->slot + SLICE_SLOTS : mv->nslots;
	uint64_t items0 = mv->st.items, bytes0 = mv->st.bytes;

	for (; mv->slot < end; mv->slot++) {
		struct hkv_block_hdr *h = live_block(mv->s, mv->slot);
		uint32_t p;
		int ret;

		if (!h)
			continue;
		switch (fate_of(mv, h, &p)) {
		case STAYS:
			continue;
		case EXPIRED:
			mv->st.expired += mv->phase == COPY;
			continue;
		case MOVES:
			break;
		}
		if (mv->phase == COUNT) {
			mv->total.items++;
			mv->total.bytes += (uint64_t)h->klen + h->vlen;
			continue;
		}
		ret = copy_one(mv, h, p);
		if (ret)
			return ret;
		if (mv->st.items - items0 >= SLICE_ITEMS || mv->st.bytes - bytes0 >= SLICE_BYTES) {
			mv->slot++;
			break;
		}
	}
	return mv->slot < mv->nslots;
}

static void move_free(struct hkv_move *mv)
{
	for (uint32_t i = 0; mv->h && i < mv->job.map->nnames; i++)
		if (mv->h[i])
			hkv_close(mv->h[i]); /* our blocks there stay: they hold the copies */
	hkv_free(mv->h);
	if (mv->ev)
		event_free(mv->ev);
	if (mv->token) {
		sodium_memzero(mv->token, strlen(mv->token));
		hkv_free(mv->token);
	}
	hkv_cmap_free(mv->job.map);
	hkv_cmap_free(mv->job.cur);
	hkv_free(mv->job.map);
	hkv_free(mv->job.cur);
	hkv_free(mv->job.homes);
	hkv_free(mv->job.tag);
	hkv_free(mv);
}

static void finish(struct hkv_move *mv, int ret)
{
	double ms = (double)(mono_ns() - mv->t0) / 1e6;

	if (!ret)
		hkv_info("server: copied %llu items (%llu bytes) to their new homes in %.0f ms (%llu "
			 "expired left behind; counted in %.0f ms, %llu slices)",
			 (unsigned long long)mv->st.items, (unsigned long long)mv->st.bytes, ms,
			 (unsigned long long)mv->st.expired,
			 (double)(mv->t_counted - mv->t0) / 1e6, (unsigned long long)mv->slices);
	else
		hkv_warn("server: a move's copy stopped after %llu of %llu items (%llu of %llu bytes) "
			 "and %.0f ms: %s", (unsigned long long)mv->st.items,
			 (unsigned long long)mv->total.items, (unsigned long long)mv->st.bytes,
			 (unsigned long long)mv->total.bytes, ms, hkv_strerror(ret));
	hkv_cluster_progress_end(HKV_PROGRESS_COPY);
	hkv_cluster_copy_attach(mv->cl, NULL);
	hkv_cluster_job_done(mv->cl, &mv->job, ret);
	move_free(mv);
}

static void on_slice(evutil_socket_t fd, short what, void *arg)
{
	struct hkv_move *mv = arg;
	int ret;

	(void)fd;
	(void)what;
	mv->slices++;
	if (!mv->s->fenced) {
		hkv_err("server: serving while a move's copy runs: the copy fails");
		ret = -EBUSY; /* (cannot happen: see mover.h) */
	} else if (hkv_cluster_copy_void(mv->cl, &mv->job)) {
		ret = -ECANCELED; /* the move is over, or our registration */
	} else {
		ret = slice(mv);
	}
	if (!ret && mv->phase == COUNT) {
		mv->phase = COPY;
		mv->slot = 0;
		mv->t_counted = mono_ns();
		hkv_cluster_progress_total(HKV_PROGRESS_COPY, mv->total.bytes, mv->total.items);
		hkv_info("server: copying %llu items (%llu bytes) to their new homes (counted in "
			 "%.0f ms)", (unsigned long long)mv->total.items,
			 (unsigned long long)mv->total.bytes, (double)(mv->t_counted - mv->t0) / 1e6);
		ret = 1;
	}
	if (ret == 1) {
		event_add(mv->ev, &(struct timeval){0, 0});
		return;
	}
	finish(mv, ret);
}

int hkv_move_start(struct event_base *base, struct hkv_store *s, struct hkv_cluster *cl,
		   struct hkv_cluster_job *job, const char *self, const char *token,
		   uint64_t max_value)
{
	struct hkv_move *mv = hkv_calloc(1, sizeof(*mv));

	if (!mv)
		return -ENOMEM;
	mv->h = hkv_calloc(job->map->nnames + 1, sizeof(*mv->h));
	mv->token = hkv_strdup(token);
	mv->ev = evtimer_new(base, on_slice, mv);
	if (!mv->h || !mv->token || !mv->ev || event_add(mv->ev, &(struct timeval){0, 0})) {
		if (mv->ev)
			event_free(mv->ev);
		hkv_free(mv->token);
		hkv_free(mv->h);
		hkv_free(mv);
		return -ENOMEM;
	}
	mv->s = s;
	mv->cl = cl;
	mv->job = *job; /* its maps, homes (and tag) are ours now */
	job->map = job->cur = NULL;
	job->homes = NULL;
	job->tag = NULL;
	mv->self = self;
	mv->max_value = max_value;
	mv->now = (uint32_t)time(NULL);
	mv->nslots = s->geom->nbuckets * HKV_BUCKET_SLOTS;
	mv->phase = COUNT;
	mv->t0 = mono_ns();
	hkv_cluster_progress_begin(HKV_PROGRESS_COPY, job->rev, 0, 0);
	hkv_cluster_copy_attach(cl, mv);
	return HKV_JOB_PENDING;
}

void hkv_move_abort(struct hkv_move *mv)
{
	if (!mv)
		return;
	hkv_warn("server: a move's copy stopped at shutdown (%llu of %llu items copied)",
		 (unsigned long long)mv->st.items, (unsigned long long)mv->total.items);
	hkv_cluster_progress_end(HKV_PROGRESS_COPY);
	move_free(mv);
}
