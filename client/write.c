/*
 * write.c - writing a key: building its new block (making room in cache
 * mode), the stores (set, add, replace, cas: warm through the location
 * cache, else a cold find that carries the block's WRITE) and
 * read-modify-write.
 */
#include <stdint.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"

/* ---- building blocks ---------------------------------------------------------- */

/*
 * Fill the new block in wblk, then allocate it; sets *slot (to publish) and
 * *blen. The value is copied before allocating: in cache mode a full class
 * evicts (hkv_evict() reads into rblk, where a modify's old value may live).
 */
static int fill_block(struct hkv_client *c, const struct key *k, const struct value *v,
		      uint64_t *slot, uint32_t *blen)
{
	struct hkv_block_hdr *h = (struct hkv_block_hdr *)c->wblk;
	size_t vlen = v->l1 + v->l2, total = HKV_BLOCK_HDR + k->len + vlen;
	uint64_t off;
	uint32_t gen;
	int cls, ret;

	if (vlen > c->value_cap || total > c->max_block)
		return HKV_ETOOBIG;
	cls = hkv_class_for(&c->g, (uint32_t)total);
	if (cls < 0)
		return HKV_ETOOBIG;
	memset(h, 0, sizeof(*h));
	h->vlen = (uint32_t)vlen;
	h->flags = v->flags;
	h->klen = k->len;
	h->exptime = v->exptime;
	h->owner = (uint16_t)c->client_id;
	h->wid = v->wid ? v->wid : hkv_next_wid(c);
	h->pred = v->pred;
	memcpy(c->wblk + HKV_BLOCK_HDR, k->p, k->len);
	if (v->l1)
		memmove(c->wblk + HKV_BLOCK_HDR + k->len, v->p1, v->l1);
	if (v->l2)
		memmove(c->wblk + HKV_BLOCK_HDR + k->len + v->l1, v->p2, v->l2);
	/*
	 * A full cache refills ahead: a block freed a moment ago rests 200 us
	 * before it is written (the ABA horizon), so a write of a pressed class
	 * takes the oldest rested block it holds and, once it holds half its
	 * hold cap or less, first takes more - a claim from its hints (what its
	 * last eviction freed beyond the cap, resting since), else an eviction
	 * (8 items; it keeps their blocks up to the cap) - for the writes after,
	 * by which time they have rested. (Evicting only when nothing was held,
	 * each such write waited out the rest of the blocks it had just freed:
	 * 76 % of the client's time on a full cache.)
	 */
	if (hkv_cache_mode(c)) {
		struct hkv_class_alloc *ca = &c->classes[cls];

		if (hkv_class_pressed(ca, hkv_coarse_ns()) &&
		    ca->n - ca->head <= hkv_alloc_hold_cap(c, (uint32_t)cls) / 2) {
			ret = hkv_alloc_refill(c, (uint32_t)cls);
			if (!ret)
				ret = hkv_evict(c, (uint32_t)cls, 1);
			if (ret < 0)
				return ret;
		}
	}
	/*
	 * Nothing free in the class: the server first (a FREE segment, or a
	 * wholly free one of another class: free memory is never left while
	 * items are evicted); then, in a full cache, evict in the class, or if
	 * the class has no segment at all, or eviction in it found nothing
	 * live (idle handles hold every block it has), the server empties one
	 * for it: a cache never answers "full" while it holds items.
	 */
	for (int carves = 0, starved = 0;; carves++) {
		uint32_t nseg;

		ret = hkv_alloc_block(c, (uint32_t)cls, &off, &gen);
		if (ret != HKV_EFULL)
			break;
		if ((ret = hkv_alloc_table(c, 0)))
			break;
		nseg = hkv_alloc_class_segs(c, (uint32_t)cls);
		ret = carves < 4 ? hkv_alloc_carve(c, (uint32_t)cls,
						   hkv_cache_mode(c) && (!nseg || starved))
				 : HKV_EFULL;
		if (ret != HKV_EFULL) {
			if (ret)
				break;
			continue;
		}
		if (!hkv_cache_mode(c) || !nseg)
			break;
		c->classes[cls].pressure_ns = hkv_coarse_ns();
		for (int round = 0, empty = 0; round < 64 && empty < 4; round++) {
			int n = hkv_evict(c, (uint32_t)cls, 0);

			if (n < 0)
				return n;
			empty = n ? 0 : empty + 1;
			ret = hkv_alloc_block(c, (uint32_t)cls, &off, &gen);
			if (ret != HKV_EFULL)
				break;
			starved = empty >= 4;
		}
		if (ret != HKV_EFULL || carves >= 4)
			break;
	}
	if (ret)
		return ret;
	h->meta = hkv_meta_make(HKV_BLK_LIVE, (uint32_t)cls, gen);
	h->atime = hkv_region_ms32(c);
	h->sum = hkv_block_sum(h, c->wblk + HKV_BLOCK_HDR);
	*slot = hkv_slot_make(k->fp, (uint32_t)cls, gen, off);
	*blen = (uint32_t)total;
	return 0;
}

/*
 * fill_block() for a write of key k. Making room never takes the block at
 * `keep` (the item the write rewrites: 0 when unknown) nor moves its
 * segment; if it evicts k itself, c->op_key_evicted says so (hkv_store_value() then
 * answers out of memory, not "not found").
 */
static int build_block(struct hkv_client *c, const struct key *k, const struct value *v,
		       uint64_t keep, uint64_t *slot, uint32_t *blen)
{
	int ret;

	c->op_key = k->p;
	c->op_klen = k->len;
	c->protect_off = keep;
	ret = fill_block(c, k, v, slot, blen);
	c->op_key = NULL;
	c->protect_off = 0;
	return ret;
}

static void unbuild_block(struct hkv_client *c, uint64_t slot)
{
	hkv_unalloc_block(c, hkv_slot_off(slot), hkv_slot_class(slot));
}

/* ---- stores ------------------------------------------------------------------ */

/*
 * Where to insert: the first empty slot of the emptier of the two buckets
 * (two-choice balancing keeps the index loadable past 90%). Duplicates from
 * concurrent inserts are resolved by canonical order, not by this choice.
 */
static int pick_empty(const struct view *v)
{
	int free[2] = {0, 0}, first[2] = {-1, -1}, b;

	for (int p = 0; p < CANON_SLOTS; p++) {
		if (v->slot[p])
			continue;
		b = p / HKV_BUCKET_SLOTS;
		if (first[b] < 0)
			first[b] = p;
		free[b]++;
	}
	b = free[1] > free[0] ? 1 : 0;
	return first[b];
}

/* The item a cached location names (no block copy: for writes that CAS it). */
struct item hkv_item_of_loc(const struct hkv_loc *loc)
{
	return (struct item){.slot_off = loc->slot_addr, .slot = loc->slot,
			     .blk_off = hkv_slot_off(loc->slot), .cls = hkv_slot_class(loc->slot),
			     .gen = loc->gen, .seen_ns = loc->stamp_ns};
}

/* A blind update through the location cache: one round trip when it holds
 * (an entry of this very key, young enough to act on). */
static int store_warm(struct hkv_client *c, const struct key *k, uint64_t slot, uint32_t blen,
		      uint64_t *slot_off)
{
	struct hkv_loc lc, *loc = hkv_cached_loc(c, k, &lc, 1);
	struct item old;
	int ret;

	if (!loc || !hkv_loc_fits_key(c, loc, k))
		return NO_CACHE;
	old = hkv_item_of_loc(loc);
	*slot_off = loc->slot_addr;
	ret = hkv_publish_replace(c, &old, slot, blen, 1);
	if (ret > 0)
		hkv_cache_drop(c->cache, k->h);
	return ret;
}

/* The new block is in the index at slot_off (since the chain posted at
 * c->pub_ns): remember where. */
static void stored(struct hkv_client *c, const struct key *k, uint64_t slot, uint64_t slot_off)
{
	struct item it;

	hkv_item_from_block(&it, c->wblk, slot_off, slot, -1, c->pub_ns);
	hkv_remember_loc(c, k, &it);
	c->last_version = ((const struct hkv_block_hdr *)c->wblk)->wid;
	/* (this handle's own: the location cache is shared) */
	c->last_stored.slot_off = it.slot_off;
	c->last_stored.slot = it.slot;
	c->last_stored.blk_off = it.blk_off;
	c->last_stored.seen_ns = it.seen_ns;
	c->last_stored.cls = it.cls;
	c->last_stored.gen = it.gen;
}

/* One attempt of the cold path; sets *slot_off on success. */
static int store_cold(struct hkv_client *c, const struct key *k, enum store_mode mode,
		      uint64_t version, uint64_t slot, uint32_t blen, int *written,
		      uint64_t *slot_off)
{
	struct hkv_wr lead[2];
	struct item it;
	struct view view;
	int ret, pos, nlead = *written ? 0 : hkv_append_block_write(c, lead, 0, slot, blen);

	if (nlead < 0)
		return YIELDED; /* our block is abandoned (held too long): build another */
	ret = hkv_find_cold(c, k, &it, &view, lead, nlead);
	*written = 1; /* the new block went out with the bucket reads */
	if (ret && ret != HKV_ENOTFOUND)
		return ret;
	if (mode == STORE_EXACT && (ret ? version != 0 : hkv_item_version(&it) != version))
		return HKV_EVERSION;
	if (!ret && (mode == STORE_EXACT || !hkv_item_expired(c, &it))) {
		/* there again: a later absence is someone's delete, not our eviction */
		c->op_key_evicted = 0;
		if (mode == STORE_ADD)
			return HKV_EEXISTS;
		if (mode == STORE_CAS && hkv_item_version(&it) != version)
			return HKV_EVERSION;
		*slot_off = it.slot_off;
		hkv_test_at(c, HKV_TP_STORE_PUBLISH);
		return hkv_publish_replace(c, &it, slot, blen, 0);
	}
	if (mode == STORE_REPLACE || mode == STORE_CAS)
		return HKV_ENOTFOUND;
	if (!ret) { /* expired: take its place */
		*slot_off = it.slot_off;
		return hkv_publish_replace(c, &it, slot, blen, 0);
	}
	pos = pick_empty(&view);
	if (pos < 0 && hkv_cache_mode(c)) {
		struct item victim;

		pos = hkv_pick_victim_slot(c, k, &view, &victim);
		if (pos >= 0) {
			*slot_off = hkv_slot_off_of(c, k, pos);
			return hkv_publish_insert(c, k, pos, slot, &victim);
		}
	}
	if (pos < 0)
		return HKV_EFULL;
	*slot_off = hkv_slot_off_of(c, k, pos);
	return hkv_publish_insert(c, k, pos, slot, NULL);
}

int hkv_store_value(struct hkv_client *c, const struct key *k, enum store_mode mode,
		    const struct value *v, uint64_t version)
{
	return hkv_store_value_at(c, k, mode, v, version, NULL);
}

int hkv_store_value_at(struct hkv_client *c, const struct key *k, enum store_mode mode,
		       const struct value *v, uint64_t version, const struct item *at)
{
	uint64_t slot, slot_off = 0, keep = 0;
	struct hkv_loc lc;
	struct retry rt;
	uint32_t blen;
	int ret, written = 0;

	if ((mode == STORE_CAS || mode == STORE_REPLACE || mode == STORE_EXACT) &&
	    hkv_cached_loc(c, k, &lc, 0) &&
	    lc.key_ok == 1)
		keep = hkv_slot_off(lc.slot); /* keep the item it acts on */
	c->op_key_evicted = 0;
	ret = build_block(c, k, v, keep, &slot, &blen);
	if (ret)
		return ret;
	ret = NO_CACHE;
	if (at && mode == STORE_EXACT && version && hkv_item_version(at) == version) {
		/* the caller's own view of the entry (checked fresh in the post) */
		slot_off = at->slot_off;
		ret = hkv_publish_replace(c, at, slot, blen, 1);
		if (ret > 0)
			hkv_cache_drop(c->cache, k->h);
	} else if (mode == STORE_SET) {
		ret = store_warm(c, k, slot, blen, &slot_off);
	}
	if (ret == NO_CACHE && (mode == STORE_SET || (mode == STORE_EXACT && version))) {
		struct item it;

		/* An old cache entry, or one whose key is too long to keep in it, is
		 * confirmed by one block READ (LIVE with its generation and our key
		 * means the slot holds exactly that value now), which is cheaper
		 * than a cold find. */
		if (hkv_find_warm(c, k, &it) == 0) {
			slot_off = it.slot_off;
			ret = mode == STORE_EXACT && hkv_item_version(&it) != version
				      ? HKV_EVERSION
				      : hkv_publish_replace(c, &it, slot, blen, 1);
			if (ret > 0)
				hkv_cache_drop(c->cache, k->h);
		}
	}
	written = ret == CONFLICT;
	hkv_retry_begin(&rt);
	while (ret > 0) {
		if (ret == REFUSED)
			return HKV_EVERSION; /* (our block is withdrawn and freed) */
		if (ret == CONFLICT || ret == YIELDED || ret == STALE) {
			c->stats.op[mode == STORE_SET ? HKV_OP_SET : HKV_OP_ADD].retries++;
			/* (YIELDED: a stale swing undone - a stall, like STALE) */
			if (ret == STALE || ret == YIELDED ? hkv_retry_stale(c, &rt)
							    : hkv_retry_wait(c, &rt)) {
				if (ret == YIELDED)
					return HKV_EAGAIN; /* our block is already withdrawn and freed */
				ret = HKV_EAGAIN;
				break;
			}
		}
		if (ret == YIELDED) { /* withdrawn and freed: a fresh block, freshly stamped */
			if ((ret = build_block(c, k, v, keep, &slot, &blen)))
				return ret;
			written = 0;
		}
		ret = store_cold(c, k, mode, version, slot, blen, &written, &slot_off);
	}
	if (ret) {
		unbuild_block(c, slot);
		/* the key is absent because making room for its new value evicted
		 * it: that is running out of memory, not a miss */
		return ret == HKV_ENOTFOUND && c->op_key_evicted ? HKV_EFULL : ret;
	}
	stored(c, k, slot, slot_off);
	return 0;
}

/* ---- read-modify-write --------------------------------------------------------- */

/* Find the key, derive its new value, publish it in place of the old; retry on races. */
int hkv_modify(struct hkv_client *c, const struct key *k, rmw_fn fn, void *arg,
	       enum hkv_op op)
{
	struct retry rt;

	hkv_retry_begin(&rt);
	for (int attempt = 0;; attempt++) {
		struct value v;
		struct item it;
		struct view view;
		uint64_t slot;
		uint32_t blen;
		int ret = attempt ? hkv_find_cold(c, k, &it, &view, NULL, 0)
				  : hkv_find(c, k, &it, &view);

		if (ret)
			return ret;
		if (hkv_item_expired(c, &it))
			return HKV_ENOTFOUND;
		ret = fn(c, &it, &v, arg);
		if (!ret) /* making room never takes the item itself */
			ret = build_block(c, k, &v, it.blk_off, &slot, &blen);
		if (ret)
			return ret;
		/* However long the building took (allocation, eviction) or this
		 * thread was stopped, hkv_publish_replace acts on the view only while
		 * it is young (STALE: nothing posted, find again). */
		hkv_test_at(c, HKV_TP_MODIFY_PUBLISH);
		ret = hkv_publish_replace(c, &it, slot, blen, 1);
		if (ret <= 0) {
			if (ret)
				unbuild_block(c, slot);
			else
				stored(c, k, slot, it.slot_off);
			return ret;
		}
		if (ret != YIELDED) /* (withdrawn and freed already) */
			unbuild_block(c, slot);
		hkv_cache_drop(c->cache, k->h);
		c->stats.op[op].retries++;
		if (ret == STALE || ret == YIELDED ? hkv_retry_stale(c, &rt)
						    : hkv_retry_wait(c, &rt))
			return HKV_EAGAIN;
	}
}
