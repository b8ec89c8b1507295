/*
 * evict.c - cache mode: access times, eviction (sampled LRU, expired
 * first), the victim slot of an insert into two full buckets, moving one of
 * our segments to another class; and taking back the blocks a dead client
 * wrote but never published.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/log.h"
#include "common/transport_int.h"

/* cache mode (EVICT_BATCH: client/ops_int.h) */
#define ATIME_STEP_MS  1  /* a block's access time is refreshed at most this often */
#define EVICT_SAMPLES  64 /* blocks sampled per eviction round */
#define EVICT_READ     320 /* header + the longest key, 64 B aligned */
#define ATIME_FRESH_NS (10ull * 1000000ull) /* a GET's atime CAS only this soon after its READ */

/* ---- cache mode: recency and eviction ------------------------------------------ */

/*
 * Record an access in the block's atime, off the critical path: one CAS on
 * the exptime|atime word that expects exactly what we read, posted
 * unsignaled - nothing waits for it. If the block was retired and reused
 * meanwhile, the word differs and the CAS does nothing.
 */
void hkv_touch_atime(struct hkv_client *c, const struct item *it)
{
	const struct hkv_block_hdr *h = hkv_item_hdr(it);
	uint32_t now;
	uint64_t was, now_word;
	struct hkv_wr wr;

	/* The CAS expects exactly the word read at seen_ns; posted only soon
	 * after, so the block is still the one read (docs/design.md, "Cache mode") */
	if (!hkv_cache_mode(c) || c->readonly || hkv_now_ns() - it->seen_ns > ATIME_FRESH_NS)
		return;
	now = hkv_now_ms32();
	if ((int32_t)(now - h->atime) < ATIME_STEP_MS)
		return;
	was = (uint64_t)h->exptime | (uint64_t)h->atime << 32;
	now_word = (uint64_t)h->exptime | (uint64_t)now << 32;
	wr = hkv_wr_cas(c, &c->atom[6], it->blk_off + offsetof(struct hkv_block_hdr, exptime), was,
			now_word);
	wr.flags = HKV_WR_F_NO_COMPLETION;
	(void)hkv_conn_post(c->conn, &wr, 1); /* the transport keeps room for it */
}

/* Eviction order: expired first, then least recently used. */
static int64_t evict_score(const struct hkv_block_hdr *h, uint32_t now_ms, uint32_t now_s)
{
	if (h->exptime && h->exptime <= now_s)
		return INT64_MIN;
	return (int32_t)(h->atime - now_ms);
}

struct victim {
	uint64_t off;
	int64_t score;
	uint8_t *hdr; /* header + key, in rblk */
	uint64_t seen_ns; /* when that READ was posted */
};

static int cmp_victim(const void *a, const void *b)
{
	const struct victim *x = a, *y = b;

	return x->score < y->score ? -1 : x->score > y->score;
}

/* Remove up to EVICT_BATCH of the victims v[0..nv) (their headers and keys
 * read): one chain of bucket READs, one chain of [CAS meta, CAS slot] pairs.
 * The winner of a mark frees the block. Returns how many were evicted. */
static int evict_group(struct hkv_client *c, uint32_t cls, const struct victim *v, int nv)
{
	uint64_t *bkts = (uint64_t *)(c->rblk + (size_t)EVICT_SAMPLES * EVICT_READ);
	struct hkv_wr wrs[2 * EVICT_BATCH];
	struct item it[EVICT_BATCH];
	struct key key[EVICT_BATCH];
	int n = 0, ret, evicted = 0, own[EVICT_BATCH];

	for (int i = 0; i < nv; i++) {
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[i].hdr;

		if (hkv_key_init(c, &key[i], v[i].hdr + HKV_BLOCK_HDR, h->klen))
			return 0; /* not a key: evict_offs checked the length */
		hkv_append_bucket_reads(c, wrs, 2 * i, &key[i], bkts + i * 2 * HKV_BUCKET_SLOTS);
	}
	if (nv && (ret = hkv_exec(c, wrs, 2 * nv)))
		return ret;
	for (int i = 0; i < nv; i++) {
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[i].hdr;
		const uint64_t *sl = bkts + i * 2 * HKV_BUCKET_SLOTS;

		for (int p = 0; p < CANON_SLOTS; p++) {
			if (!sl[p] || hkv_slot_off(sl[p]) != v[i].off ||
			    hkv_slot_ver(sl[p]) != (hkv_meta_gen(h->meta) & 0x7ff))
				continue;
			it[n] = (struct item){.slot_off = hkv_slot_off_of(c, &key[i], p),
					      .slot = sl[p], .blk_off = v[i].off, .cls = cls,
					      .gen = hkv_meta_gen(h->meta), .seen_ns = v[i].seen_ns};
			hkv_cache_drop(c->cache, key[i].h);
			hkv_append_retire(c, wrs, 2 * n, &it[n], 0, &c->atom[8 + 2 * n]);
			own[n++] = i;
			break;
		}
	}
	if (!n || !hkv_view_fresh(c, v[0].seen_ns)) /* headers and buckets: one view */
		return 0;
	if ((ret = hkv_exec(c, wrs, 2 * n)))
		return ret;
	for (int i = 0; i < n; i++) { /* replaced or removed meanwhile: not an eviction */
		int ok = hkv_retire_outcome(c, &it[i], &c->atom[8 + 2 * i], 0) == 0;

		evicted += ok;
		if (ok && c->op_key && key[own[i]].len == c->op_klen &&
		    !memcmp(key[own[i]].p, c->op_key, c->op_klen))
			c->op_key_evicted = 1; /* we evicted the very key we are writing */
	}
	c->stats.evictions += (uint64_t)evicted;
	return evicted;
}

/*
 * Read header + key of the blocks at v[0..n).off (one chain) and evict the
 * `max` oldest LIVE ones (expired first), EVICT_BATCH per group. Returns how
 * many were evicted, or <0.
 */
static int evict_offs(struct hkv_client *c, uint32_t cls, struct victim *v, int n, int max)
{
	uint32_t sz = c->g.class_size[cls], rd = sz < EVICT_READ ? sz : EVICT_READ;
	uint32_t now_ms = hkv_now_ms32(), now_s = hkv_now_unix();
	struct hkv_wr wrs[EVICT_SAMPLES];
	int nv = 0, ret, evicted = 0;
	uint64_t t = hkv_coarse_ns();

	for (int i = 0; i < n; i++) {
		v[i].hdr = c->rblk + (size_t)i * EVICT_READ;
		v[i].seen_ns = t;
		wrs[i] = hkv_wr_read(c, v[i].hdr, v[i].off, rd);
	}
	if (n && (ret = hkv_exec(c, wrs, n)))
		return ret;
	for (int i = 0; i < n; i++) {
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[i].hdr;

		if (hkv_meta_state(h->meta) != HKV_BLK_LIVE || hkv_meta_class(h->meta) != cls ||
		    h->klen == 0 || (uint32_t)HKV_BLOCK_HDR + h->klen > rd ||
		    v[i].off == c->protect_off) /* the item being rewritten */
			continue;
		v[i].score = evict_score(h, now_ms, now_s);
		v[nv++] = v[i];
	}
	qsort(v, (size_t)nv, sizeof(v[0]), cmp_victim);
	if (nv > max)
		nv = max;
	for (int first = 0; first < nv; first += EVICT_BATCH) {
		ret = evict_group(c, cls, v + first, nv - first < EVICT_BATCH ? nv - first
									  : EVICT_BATCH);
		if (ret < 0)
			return ret;
		evicted += ret;
	}
	return evicted;
}

/*
 * Blocks of a segment we just adopted from a dead client that are allocated
 * (bit clear) and LIVE or PENDING: n candidates at offs[] (class cls) whose
 * meta words were metas[]. Those no slot names were written but never
 * published (an insert or update that died before its slot CAS) and would
 * leak: nobody else can publish or free them, since only a block's writer
 * ever makes a slot name it, and the writer's queue pair is gone. They are
 * taken back the way every block is retired: whoever's CAS takes the meta
 * from LIVE/PENDING to OBSOLETE frees it. The buckets are read before that
 * CAS: a slot removal that came before the read had marked the meta first
 * (or its remover's repair mark will fail against ours), so exactly one
 * CAS wins and nothing is freed twice; after the read no slot can come to
 * name the block. Any slot with the block's offset counts as naming it.
 * 3 round trips per batch of up to EVICT_SAMPLES. Returns how many were
 * taken back, or <0.
 */
int hkv_reclaim_unpublished(struct hkv_client *c, uint32_t cls, const uint64_t *offs,
			    const uint64_t *metas, int n)
{
	uint32_t sz = c->g.class_size[cls], rd = sz < EVICT_READ ? sz : EVICT_READ;
	uint64_t *bkts = (uint64_t *)(c->rblk + (size_t)EVICT_SAMPLES * EVICT_READ);
	uint64_t *res = bkts + EVICT_SAMPLES * 2 * HKV_BUCKET_SLOTS;
	struct hkv_wr wrs[2 * EVICT_SAMPLES];
	struct key key[EVICT_SAMPLES];
	int idx[EVICT_SAMPLES], nk = 0, nc = 0, ret, got = 0;

	if (n > EVICT_SAMPLES || (size_t)EVICT_SAMPLES * EVICT_READ +
					 (size_t)EVICT_SAMPLES * (2 * HKV_BUCKET_SIZE + 8) > c->read_cap)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		wrs[i] = hkv_wr_read(c, c->rblk + (size_t)i * EVICT_READ, offs[i], rd);
	if (n && (ret = hkv_exec(c, wrs, n)))
		return ret;
	for (int i = 0; i < n; i++) { /* a block that names its key, as read in the scan */
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)(c->rblk +
									       (size_t)i * EVICT_READ);

		if (h->meta != metas[i] || h->klen == 0 || h->klen > HKV_MAX_KEY ||
		    (uint32_t)HKV_BLOCK_HDR + h->klen > rd)
			continue; /* changed, or garbage: leave it */
		hkv_key_init(c, &key[nk], c->rblk + (size_t)i * EVICT_READ + HKV_BLOCK_HDR,
			     h->klen);
		hkv_append_bucket_reads(c, wrs, 2 * nk, &key[nk], bkts + nk * 2 * HKV_BUCKET_SLOTS);
		idx[nk++] = i;
	}
	if (nk && (ret = hkv_exec(c, wrs, 2 * nk)))
		return ret;
	for (int k = 0; k < nk; k++) {
		const uint64_t *sl = bkts + k * 2 * HKV_BUCKET_SLOTS;
		uint64_t m = metas[idx[k]], dead;
		int named = 0;

		for (int p = 0; p < CANON_SLOTS; p++)
			named |= sl[p] && hkv_slot_off(sl[p]) == offs[idx[k]];
		if (named)
			continue;
		dead = hkv_meta_make(HKV_BLK_OBSOLETE, hkv_meta_class(m), hkv_meta_gen(m)) |
		       (hkv_meta_state(m) == HKV_BLK_PENDING ? HKV_META_ABORTED : 0);
		wrs[nc] = hkv_wr_cas(c, &res[nc], offs[idx[k]], m, dead);
		idx[nc++] = idx[k];
	}
	if (nc && (ret = hkv_exec(c, wrs, nc)))
		return ret;
	for (int k = 0; k < nc; k++) {
		if (res[k] != metas[idx[k]])
			continue; /* someone else's mark won: theirs to free */
		hkv_free_block(c, offs[idx[k]], cls);
		got++;
	}
	c->stats.blocks_reclaimed += (uint64_t)got;
	if (got)
		hkv_info("client %u: took back %d unpublished block(s) of a dead client", c->client_id,
			 got);
	return got;
}

/* Region offset of block b of our segment so. */
static uint64_t own_block_off(const struct hkv_client *c, const struct hkv_seg_own *so, uint64_t b)
{
	return c->g.data_off + (uint64_t)so->idx * c->g.seg_size + b * c->g.class_size[so->cls];
}

/*
 * Memory is full in class cls (cache mode): evict some of our own items of
 * that class. Samples EVICT_SAMPLES of our carved blocks and evicts the
 * EVICT_BATCH oldest (3 round trips); the freed blocks come back through our
 * bitmap after the quarantine. Returns how many were evicted, or <0.
 */
int hkv_evict(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	struct victim v[EVICT_SAMPLES];
	uint64_t total = 0;
	int n = 0;

	for (struct hkv_seg_own *so = ca->segs; so; so = so->next)
		total += so->carved;
	if (!total || (size_t)EVICT_SAMPLES * EVICT_READ + EVICT_BATCH * 2 * HKV_BUCKET_SIZE >
			      c->read_cap)
		return 0;
	for (int i = 0; i < EVICT_SAMPLES; i++) {
		uint64_t pick = hkv_rand(c) % total;
		struct hkv_seg_own *so = ca->segs;

		while (pick >= so->carved) {
			pick -= so->carved;
			so = so->next;
		}
		if (so->held[pick / 64] & 1ull << (pick % 64))
			continue; /* free already, waiting in our FIFO */
		v[n++].off = own_block_off(c, so, pick);
	}
	n = evict_offs(c, cls, v, n, EVICT_BATCH);
	if (n > 0) {
		ca->pressure = 1;
		ca->evict_pending += (uint32_t)n;
	}
	return n;
}

/*
 * No block of class cls to be had, not even by evicting in it: take one of
 * our segments of another class (of the class we hold most segments of),
 * evict everything in it and re-carve it into cls (what memcached's slab
 * rebalancer does). 0 when cls has a new segment, HKV_EFULL, or <0.
 */
int hkv_reassign_segment(struct hkv_client *c, uint32_t cls)
{
	struct hkv_seg_own *so;
	struct victim v[EVICT_SAMPLES];
	uint32_t ocls;
	int ret;

	while ((so = hkv_alloc_donor(c, cls))) { /* one still ours (hkv_alloc_hold) */
		ret = hkv_alloc_hold(c, so);
		if (ret <= 0)
			break;
		hkv_alloc_forget(c, so);
	}
	if (!so)
		return HKV_EFULL;
	if (ret < 0)
		return ret;
	ocls = so->cls;
	if ((ret = hkv_alloc_detach(c, so)))
		return ret;
	for (uint32_t first = 0; first < so->carved; first += EVICT_SAMPLES) {
		int n = 0;

		for (uint32_t b = first; b < so->carved && n < EVICT_SAMPLES; b++)
			v[n++].off = own_block_off(c, so, b);
		ret = evict_offs(c, ocls, v, n, n);
		if (ret < 0)
			return ret;
	}
	ret = hkv_alloc_recarve_own(c, so, cls);
	hkv_debug("client %u: segment %u from class %u to class %u: %s", c->client_id, so->idx,
		  ocls, cls, hkv_strerror(ret));
	return ret;
}

/*
 * Both buckets are full (cache mode): choose a slot to take over - an
 * expired item's, else the least recently used of the 32 - by reading the
 * headers of the blocks they name (one chain). -1 if none qualifies;
 * *victim describes the entry to evict.
 */
int hkv_pick_victim_slot(struct hkv_client *c, const struct key *k, const struct view *view,
			 struct item *victim)
{
	uint32_t now_ms = hkv_now_ms32(), now_s = hkv_now_unix();
	struct hkv_wr wrs[CANON_SLOTS];
	int pos[CANON_SLOTS], n = 0, best = -1;
	int64_t best_score = INT64_MAX;

	for (int p = 0; p < CANON_SLOTS; p++) {
		/* never an entry that may be this key's own (an ADD must not evict
		 * the rival it races with and then commit beside it) */
		if (!hkv_slot_sane(c, view->slot[p]) || hkv_slot_fp(view->slot[p]) == k->fp)
			continue;
		pos[n] = p;
		wrs[n] = hkv_wr_read(c, c->rblk + (size_t)n * 64, hkv_slot_off(view->slot[p]),
				     HKV_BLOCK_HDR);
		n++;
	}
	if (!n || hkv_exec(c, wrs, n))
		return -1;
	for (int i = 0; i < n; i++) {
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)(c->rblk + (size_t)i * 64);
		uint64_t s = view->slot[pos[i]];
		int64_t score;

		if (hkv_meta_state(h->meta) != HKV_BLK_LIVE ||
		    hkv_meta_class(h->meta) != hkv_slot_class(s) ||
		    (hkv_meta_gen(h->meta) & 0x7ff) != hkv_slot_ver(s))
			continue;
		score = evict_score(h, now_ms, now_s);
		if (score < best_score) {
			best_score = score;
			best = i;
		}
	}
	if (best < 0)
		return -1;
	*victim = (struct item){.slot_off = hkv_slot_off_of(c, k, pos[best]),
				.slot = view->slot[pos[best]],
				.blk_off = hkv_slot_off(view->slot[pos[best]]),
				.cls = hkv_slot_class(view->slot[pos[best]]),
				.gen = hkv_meta_gen(((const struct hkv_block_hdr *)(c->rblk +
										 (size_t)best * 64))->meta),
				.seen_ns = view->seen_ns};
	return pos[best];
}
