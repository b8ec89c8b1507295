/*
 * ops_int.h - the key-value operations, each a few chains of one-sided work
 * requests: what their rooms share. Not installed. docs/design.md has the
 * round-trip table and the concurrency argument; the short version:
 *
 *  find   warm: READ block (cached location)            1 RT, valid if LIVE+gen
 *         cold: READ b1,b2 | READ candidate block(s)    2 RT
 *  update [WRITE new block, CAS old meta LIVE->OBSOLETE, CAS slot old->new]
 *                                                        1 RT (+ find if cold)
 *  insert [WRITE meta PENDING, CAS empty slot 0->new, READ b1,b2 again] |
 *         [CAS meta PENDING->LIVE]                       2 RT after the cold find
 *                                                        (which carried the WRITE)
 *  delete [CAS old meta LIVE->OBSOLETE, CAS slot old->0] 1 RT (+ find if cold)
 *
 * A block is written out of place and never changes while its generation
 * stands; a reader that sees it LIVE with the generation it expects knows
 * the slot still pointed at it when its READ ran, because every writer marks
 * the old block OBSOLETE before (same queue pair, in order) it swings the
 * slot away.
 *
 * The rooms, each calling only the ones above it:
 *
 *   chain.c    work requests, hkv_exec (one chain, one round trip), how old
 *              a view may be to act on, backing off after a lost race
 *   lookup.c   keys, cached locations, finding a key (warm and cold)
 *   publish.c  publishing and retiring blocks: replace, remove, insert
 *              (tentative, PENDING -> LIVE), undoing a stale swing
 *   evict.c    cache mode: atime, eviction, moving a segment to another
 *              class, taking back a dead client's unpublished blocks
 *   write.c    building a block, stores (set/add/replace/cas), modify
 *   api.c      the public operations, multi-get, index walks
 */
#ifndef HKV_OPS_INT_H
#define HKV_OPS_INT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "client/client_int.h"
#include "common/transport_int.h"

#define CANON_SLOTS    (2 * HKV_BUCKET_SLOTS)
#define EVICT_BATCH    8  /* cache mode: the oldest this many of a sample are evicted */

/* Internal outcomes (> 0; errors are < 0). */
#define CONFLICT 1 /* lost a race, look again */
#define NO_CACHE 2 /* no usable cache entry, nothing was sent */
#define YIELDED  3 /* our new block was withdrawn (and freed): start over with a fresh one */
#define STALE    4 /* a view grew too old to act on, or a stale write was undone: look again */
#define TORN     5 /* a block read through a slot is torn, or no longer the slot's */
#define REFUSED  6 /* an insert step withdrawn by c->insert_check (its block freed) */

static inline void hkv_test_at(struct hkv_client *c, enum hkv_test_point point)
{
	if (hkv_test_hook)
		hkv_test_hook(c, point);
}

/* ---- keys, items, time ------------------------------------------------------- */

struct key {
	const void *p;
	uint16_t len;
	uint64_t h, b[2];
	uint32_t fp;
};

struct item {
	uint64_t slot_off; /* region offset of the index slot */
	uint64_t slot;     /* slot value as read */
	uint64_t blk_off;
	uint32_t cls, gen;
	uint8_t *blk; /* local copy */
	uint32_t blen;
	int pos; /* canonical position in the two buckets; -1 from the cache */
	enum hkv_block_state state;
	uint64_t seen_ns; /* when the round trip that saw slot and gen was posted */
};

/* What the last cold find saw of the two buckets: slots in canonical order. */
struct view {
	uint64_t slot[CANON_SLOTS];
	uint64_t seen_ns; /* when their READ was posted */
};

/* A value to write: its bytes, and its header fields. */
struct value {
	const void *p1, *p2; /* value = p1 . p2 */
	size_t l1, l2;
	uint32_t flags, exptime;
	uint64_t wid; /* 0: a new write (a fresh id); else the write this value keeps */
	uint64_t pred; /* the block's pred word (replicated writes; else 0) */
};

static inline uint64_t hkv_slot_off_of(const struct hkv_client *c, const struct key *k, int pos)
{
	return c->g.index_off + k->b[pos / HKV_BUCKET_SLOTS] * HKV_BUCKET_SIZE +
	       (uint64_t)(pos % HKV_BUCKET_SLOTS) * 8;
}

/*
 * The region's clock (common/layout.h, HKV_CLOCK_OFF): the server's, as
 * this handle learned it - our coarse monotonic clock plus an offset
 * refreshed at least every second (client/chain.c). TTLs, expiry, atime
 * and the PENDING lease all use it, never this host's wall clock.
 */
static inline uint64_t hkv_region_ns(const struct hkv_client *c)
{
	/* (a replicated handle: its members' clock; servers are NTP-close) */
	return hkv_coarse_ns() + (c->repl ? hkv_repl_clock_off(c) : c->clock_off_ns);
}

/* ... in Unix seconds (exptime's unit) */
static inline uint32_t hkv_region_s(const struct hkv_client *c)
{
	return (uint32_t)(hkv_region_ns(c) / 1000000000u);
}

/* ... in Unix ms mod 2^32 (atime's unit) */
static inline uint32_t hkv_region_ms32(const struct hkv_client *c)
{
	return (uint32_t)(hkv_region_ns(c) / 1000000u);
}

static inline const struct hkv_block_hdr *hkv_item_hdr(const struct item *it)
{
	return (const struct hkv_block_hdr *)it->blk;
}

static inline int hkv_item_expired(const struct hkv_client *c, const struct item *it)
{
	uint32_t e = hkv_item_hdr(it)->exptime;

	return e && e <= hkv_region_s(c);
}

static inline uint64_t hkv_item_version(const struct item *it)
{
	return hkv_item_hdr(it)->wid;
}

static inline uint64_t hkv_meta_live(const struct item *it)
{
	return hkv_meta_make(HKV_BLK_LIVE, it->cls, it->gen);
}

/* Does a slot point at a plausible block? Garbage never leads to a bad READ. */
static inline int hkv_slot_sane(const struct hkv_client *c, uint64_t s)
{
	uint32_t cls = hkv_slot_class(s);

	return cls < c->g.nclasses &&
	       hkv_block_range_ok(&c->g, hkv_slot_off(s), c->g.class_size[cls]);
}

static inline int hkv_cache_mode(const struct hkv_client *c)
{
	return !!(c->g.flags & HKV_GEOM_F_CACHE);
}

/* ---- round trips, views, retries (chain.c) ------------------------------------ */

/* May a write still act on what was seen at seen_ns? Checked right before
 * the post that acts on it (docs/design.md, "Views"). 0 counts a stale view. */
int hkv_view_fresh(struct hkv_client *c, uint64_t seen_ns);

/* Retrying after a lost race (chain.c has the backoff). */
struct retry {
	uint64_t start, last;
	int attempt, stale;
};
void hkv_retry_begin(struct retry *r);
/* Wait before the next attempt; 0 to go on, HKV_EAGAIN when time is up. */
int hkv_retry_wait(struct hkv_client *c, struct retry *r);
/* After STALE (a stall, not a lost race): at once, three times; then as hkv_retry_wait. */
int hkv_retry_stale(struct hkv_client *c, struct retry *r);

/* ---- finding a key (lookup.c) ------------------------------------------------- */

/* k from key: length checked, hash, fingerprint, buckets. 0 or <0. */
int hkv_key_init(struct hkv_client *c, struct key *k, const void *key, size_t klen);
/* Start of every operation: k from key and the handle connected; its hash
 * is the region's (a reconnect may have found another region). */
int hkv_key_ready(struct hkv_client *c, struct key *k, const void *key, size_t klen);
/* READs of the key's two buckets into dst (2 * HKV_BUCKET_SIZE bytes, in the
 * handle's registered memory), appended to wrs[n]; returns the new n. */
int hkv_append_bucket_reads(struct hkv_client *c, struct hkv_wr *wrs, int n, const struct key *k,
			    void *dst);
/* The key's cached location in *tmp (returned), or NULL: any age for reads;
 * for_write: only an entry of the key itself, young enough to act on. */
struct hkv_loc *hkv_cached_loc(struct hkv_client *c, const struct key *k, struct hkv_loc *tmp,
			       int for_write);
/* Remember where it (an item of k) is. */
void hkv_remember_loc(struct hkv_client *c, const struct key *k, const struct item *it);
/* May a write act on the cached slot loc of k without reading the block? */
int hkv_loc_fits_key(const struct hkv_client *c, const struct hkv_loc *loc, const struct key *k);
/* Fill it from a validated block copy at blk, seen at seen_ns. */
void hkv_item_from_block(struct item *it, uint8_t *blk, uint64_t slot_off, uint64_t slot, int pos,
			 uint64_t seen_ns);
/* Is the block read through loc (loc->blen bytes at blk) still key's current value? */
int hkv_loc_block_current(const struct hkv_client *c, const struct hkv_loc *loc,
			  const uint8_t *blk, const void *key, uint16_t klen);
/* Warm find: one READ of the cached block. 0 found, 1 not usable, <0 error. */
int hkv_find_warm(struct hkv_client *c, const struct key *k, struct item *it);
/* A candidate's block (blk: class-size bytes read, after the view v, from
 * the block v->slot[pos] names): 0 and *it when it is k's (remembered when
 * LIVE), HKV_ENOTFOUND (another key's, or an insert never committed), or
 * TORN. The caller has checked that v is still fresh. */
int hkv_candidate_check(struct hkv_client *c, const struct key *k, struct item *it,
			const struct view *v, int pos, uint8_t *blk);
/* Cold find: READ both buckets (after the `lead` requests), then the
 * candidate blocks; fills *v. 0 found, HKV_ENOTFOUND, or <0. */
int hkv_find_cold(struct hkv_client *c, const struct key *k, struct item *it, struct view *v,
		  struct hkv_wr *lead, int nlead);
/* Warm, else cold. */
int hkv_find(struct hkv_client *c, const struct key *k, struct item *it, struct view *v);

/* ---- publishing and retiring (publish.c) -------------------------------------- */

/* WRITE of the block just built (in wblk), with its bitmap-bit clear if it
 * was reused, appended to wrs[n]; returns the new n. */
int hkv_append_block_write(struct hkv_client *c, struct hkv_wr *wrs, int n, uint64_t slot,
			   uint32_t blen);
/* [CAS old meta LIVE->OBSOLETE, CAS slot old->new] appended to wrs[n],
 * results in res[0] and res[1]; returns the new n. */
int hkv_append_retire(struct hkv_client *c, struct hkv_wr *wrs, int n, const struct item *old,
		      uint64_t new_slot, uint64_t *res);
/* After an hkv_append_retire() pair ran: 0 (swung), CONFLICT or STALE; frees
 * the old block if our mark won, or with `keep` holds it for our next write
 * of its class (hkv_free_or_keep). */
int hkv_retire_outcome(struct hkv_client *c, const struct item *old, const uint64_t *res,
		       uint64_t new_slot, int keep);
/* Publish our block in old's place (new_slot 0: remove). 0, CONFLICT, STALE,
 * YIELDED or <0. */
int hkv_publish_replace(struct hkv_client *c, const struct item *old, uint64_t new_slot,
			uint32_t blen, int with_write);
/* Remove old (reading its header into hdr first, if given). 0, CONFLICT, STALE or <0. */
int hkv_publish_remove(struct hkv_client *c, const struct item *old, struct hkv_block_hdr *hdr);
/* Insert at pos (over victim's entry, if given). 0 committed, CONFLICT, YIELDED,
 * STALE, REFUSED (c->insert_check) or <0. */
int hkv_publish_insert(struct hkv_client *c, const struct key *k, int pos, uint64_t new_slot,
		       const struct item *victim);

/* ---- cache mode: recency and eviction (evict.c) ------------------------------- */

/* Record an access in the block's atime and count (one unsignaled CAS, no round trip). */
void hkv_touch_atime(struct hkv_client *c, const struct item *it);
/* Evict some items of class cls (whoever wrote them). How many, or <0.
 * `ahead` (a refill ahead): evict nothing if a quarter of the sampled
 * blocks are free - the class has room again: its pressure ends. */
int hkv_evict(struct hkv_client *c, uint32_t cls, int ahead);
/* Move one of our segments of another class to cls. 0, HKV_EFULL or <0. */
/* Both buckets full: the position of a slot to take over (*victim), or -1. */
int hkv_pick_victim_slot(struct hkv_client *c, const struct key *k, const struct view *view,
			 struct item *victim);

/* ---- stores and read-modify-write (write.c) ----------------------------------- */

/* STORE_EXACT (one replica's step of a replicated write, client/replica.c):
 * only if the key's entry - expired or not, a tombstone or not - has write
 * id `version`, or with version 0 only if the key has no entry at all; else
 * HKV_EVERSION. */
enum store_mode { STORE_SET, STORE_ADD, STORE_REPLACE, STORE_CAS, STORE_EXACT };

/* Store v under k (mode; version for STORE_CAS and STORE_EXACT), retrying on
 * races. 0 or <0. */
int hkv_store_value(struct hkv_client *c, const struct key *k, enum store_mode mode,
		    const struct value *v, uint64_t version);
/* The same, STORE_EXACT first trying to replace the item `at` (a view of the
 * key's entry the caller read; NULL: none). */
int hkv_store_value_at(struct hkv_client *c, const struct key *k, enum store_mode mode,
		       const struct value *v, uint64_t version, const struct item *at);

/* Builds the new value of an item from the old one into *v (may use scratch). */
typedef int (*rmw_fn)(struct hkv_client *c, const struct item *old, struct value *v, void *arg);

/* Find the key, derive its new value, publish it in place of the old; retry on races. */
int hkv_modify(struct hkv_client *c, const struct key *k, rmw_fn fn, void *arg, enum hkv_op op);

/* The item a cached location names (no block copy: for writes that CAS it). */
struct item hkv_item_of_loc(const struct hkv_loc *loc);

#endif /* HKV_OPS_INT_H */
