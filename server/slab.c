/*
 * slab.c - the server's side of the shared pools: carving segments into
 * size classes, moving a segment from one class to another (memcached's
 * slab mover), reclaiming abandoned held blocks, and rebuilding the
 * bitmaps exactly at a warm restart. See docs/design.md, "Memory that
 * flows".
 *
 * The sweep also takes back what a disconnected client left: blocks it had
 * retired (its id is in the OBSOLETE meta) and kept for its next write, or
 * whose free it had not posted yet. A move also takes back, from the
 * segment it empties, what a disconnected writer wrote and never published
 * and inserts left uncommitted past their lease (left_behind()).
 *
 * None of this runs per operation: a CARVE request comes once per segment's
 * worth of memory that changes class, and the sweep looks at a few segments
 * every HKV_SLAB_TICK_MS. The server writes the segment table alone; it
 * evicts with the atomics a client's delete uses (mark the block's meta,
 * then swing the slot), so clients working meanwhile are safe.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "common/hkv_alloc.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/transport_int.h"
#include "server/store.h"

#define DRAIN_MAX_NS   (3000ull * 1000000ull) /* a move that does not finish is undone */
#define RECLAIM_NS     ((uint64_t)HKV_HOLD_RECLAIM_MS * 1000000ull)
#define SWEEP_SEGS     8 /* segments looked at per tick */
#define VICTIM_SAMPLES 16

/* atime's clock: Unix ms mod 2^32, as clients stamp it */
static uint32_t now_ms32(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

static uint8_t *base(const struct hkv_store *s)
{
	return s->region.base;
}

static uint64_t *table(const struct hkv_store *s)
{
	return (uint64_t *)(base(s) + s->geom->seg_table_off);
}

static uint64_t *bitmap(const struct hkv_store *s, uint32_t seg)
{
	return (uint64_t *)(base(s) + s->geom->bitmap_off + (uint64_t)seg * s->geom->bitmap_bytes);
}

static uint64_t seg_off(const struct hkv_store *s, uint32_t seg)
{
	return s->geom->data_off + (uint64_t)seg * s->geom->seg_size;
}

static struct hkv_block_hdr *block(const struct hkv_store *s, uint32_t seg, uint32_t cls,
				   uint32_t b)
{
	return (struct hkv_block_hdr *)(base(s) + seg_off(s, seg) +
					(uint64_t)b * s->geom->class_size[cls]);
}

static uint32_t nblocks(const struct hkv_store *s, uint32_t cls)
{
	return s->geom->seg_size / s->geom->class_size[cls];
}

static uint64_t word_mask(uint32_t nb, uint32_t w)
{
	uint32_t left = nb - w * 64;

	return left >= 64 ? ~0ull : (1ull << left) - 1;
}

/* Block b of segment seg is free again: set its bit (through the NIC on
 * verbs, as every atomic of ours on a word clients CAS or FAA: atomics.h). */
static void set_free(struct hkv_store *s, uint32_t seg, uint32_t b)
{
	hkv_satom_or1(&s->atom, &bitmap(s, seg)[b / 64], 1ull << (b % 64));
}

/* CAS *w from expect to swap through the store's atomics; 1 if it won. */
static int cas(struct hkv_store *s, uint64_t *w, uint64_t expect, uint64_t swap)
{
	return hkv_satom_cas(&s->atom, w, expect, swap) == expect;
}

static uint64_t load(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static uint64_t *stamp_word(struct hkv_block_hdr *h)
{
	return (uint64_t *)((uint8_t *)h + 16);
}

/* The server's next freed stamp (freer 0): no two frees of a block leave
 * the same stamp, as no two of a client's do (reclaim_unstamped). */
static uint64_t next_freed_stamp(struct hkv_store *s)
{
	return hkv_freed_stamp(0, ++s->slab.free_seq);
}

/* Block h, ours to free (we won its meta CAS, or claimed it), gets a freed
 * stamp of ours before its bit is set. A plain store: no client CASes these
 * bytes, and nobody else may write a block whose bit is clear and whose
 * meta we own. */
static void stamp_freed(struct hkv_store *s, struct hkv_block_hdr *h)
{
	__atomic_store_n(stamp_word(h), next_freed_stamp(s), __ATOMIC_RELEASE);
}

/* The 32 slots of the key in block h (class cls), canonical order; -1 if
 * the header does not hold a key (nothing may be done with the block). */
static int key_slots(const struct hkv_store *s, const struct hkv_block_hdr *h, uint32_t cls,
		     uint64_t **slot)
{
	const struct hkv_geometry *g = s->geom;
	uint64_t *slots = (uint64_t *)(base(s) + g->index_off), kh, b1, b2;
	uint32_t klen = h->klen;
	uint8_t key[HKV_MAX_KEY];

	if (klen == 0 || klen > HKV_MAX_KEY || HKV_BLOCK_HDR + klen > g->class_size[cls])
		return -1;
	memcpy(key, h + 1, klen);
	kh = hkv_key_hash(g, key, klen);
	hkv_buckets_of(g, kh, &b1, &b2);
	for (int p = 0; p < 2 * HKV_BUCKET_SLOTS; p++)
		slot[p] = &slots[(p < HKV_BUCKET_SLOTS ? b1 : b2) * HKV_BUCKET_SLOTS +
				 (uint64_t)(p % HKV_BUCKET_SLOTS)];
	return 0;
}

/*
 * Does a slot of the key in block h name the block (at any generation)? 1
 * also when the key cannot be read (then nothing may be done with it).
 */
static int named(const struct hkv_store *s, struct hkv_block_hdr *h, uint32_t cls)
{
	uint64_t off = (uint64_t)((uint8_t *)h - base(s)), *slot[2 * HKV_BUCKET_SLOTS];

	if (key_slots(s, h, cls, slot))
		return 1;
	for (int p = 0; p < 2 * HKV_BUCKET_SLOTS; p++) {
		uint64_t sl = load(slot[p]);

		if (sl && hkv_slot_off(sl) == off)
			return 1;
	}
	return 0;
}

/*
 * Is h (its bit clear) a free block someone may have left behind: held
 * under a HELD stamp (1), retired by a client that has disconnected
 * since and so will never post its free or write it (2), or claimed and
 * not stamped (5: a freed stamp or a carve's zero; reclaim_unstamped)? With `for_move`
 * (a cache's move), also a block retired by a connected client (2): one it
 * keeps for its next write (a replace's or an eviction's, client/alloc.c
 * hkv_free_or_keep), or whose free it has not posted yet - taken back only
 * once that client is fenced (reclaim_held), as a holder's. (Not in a
 * store's move: there it also fenced busy writers - for which of their
 * retired blocks is not yet known - and their next operation failed;
 * test_linearizability test_flow_store, 3 runs in 8.) 0 otherwise. A retired block a
 * slot still names (its retirer died or stopped between its meta CAS and
 * its slot CAS) is left alone: freeing it would leave the slot naming a
 * reused block.
 */
static int held_free(const struct hkv_store *s, struct hkv_block_hdr *h, uint32_t cls,
		     uint64_t *meta, uint64_t *stamp, int for_move)
{
	enum hkv_block_state st;
	uint32_t by;

	*meta = load(&h->meta);
	*stamp = load(stamp_word(h));
	st = hkv_meta_state(*meta);
	if (st != HKV_BLK_UNUSED && st != HKV_BLK_OBSOLETE)
		return 0;
	if (hkv_held_is(*stamp)) /* (holder 0: freed, then claimed and not stamped yet) */
		return hkv_held_by_one(*stamp)			       ? 1
		       : s->geom->nintents && hkv_meta_class(*meta) == cls ? 5
									     : 0;
	if (st == HKV_BLK_UNUSED && !*stamp) /* (as carved, claimed and not stamped) */
		return s->geom->nintents && hkv_meta_class(*meta) == cls ? 5 : 0;
	by = hkv_meta_retired_by(*meta);
	return st == HKV_BLK_OBSOLETE && by && by <= HKV_MAX_CLIENTS &&
			       (for_move || !s->clients[by].connected) && !named(s, h, cls)
		       ? 2
		       : 0;
}

/*
 * Kind 5: a block whose bit a claim cleared and nobody stamped since, seen
 * unchanged (bit clear, freed stamp s or a carve's 0, meta) long enough.
 * Its owner is the claimer, or - a free cut between its stamp and its FAA -
 * the freer s names. In order: (1) that freer is not connected: fenced, so
 * its FAA either landed already or never will; (2) the bit is still clear
 * and the block as seen; (3) no connected writer's intent record names the
 * word (layout.h): a claimer's record names it from before its CAS until
 * it empties the record, which it posts after this claim's stamps - so
 * either the claimer is fenced, or it has stamped the block, or it never
 * will (a garbage block it left alone); (4) CAS the stamp s -> a server freed
 * stamp, which fails if anyone stamped or freed the block since (every stamp
 * is new: HELD stamps by holder and seq, freed ones by freer and count); (5) set
 * the bit. Between (2) and (5) nobody else can set the bit: its only owner
 * is fenced, or would have changed the stamp first. 1 if taken.
 */
static int reclaim_unstamped(struct hkv_store *s, uint32_t seg, uint32_t b, struct hkv_block_hdr *h,
			     uint64_t stamp, uint64_t meta)
{
	uint64_t *w = &bitmap(s, seg)[b / 64], bit = 1ull << (b % 64);
	uint32_t freer = hkv_freed_is(stamp) ? hkv_freed_by(stamp) : 0;

	if (freer && s->clients[freer].connected)
		return 0;
	if ((load(w) & bit) || load(stamp_word(h)) != stamp || load(&h->meta) != meta)
		return 0;
	if (hkv_store_intent_covers(s, (uint64_t)((uint8_t *)w - base(s))))
		return 0;
	hkv_failpoint("take-back");
	if (!cas(s, stamp_word(h), stamp, next_freed_stamp(s)))
		return 0;
	set_free(s, seg, b);
	s->slab.held_reclaimed++;
	s->slab.unstamped_reclaimed++;
	hkv_info("slab: took back block %u of segment %u, claimed and never stamped by a "
		 "writer that is gone", b, seg);
	return 1;
}

/*
 * Take back a block left behind, once it has stood unchanged long enough
 * (see the top): a HELD stamp is CASed away, or its retirer's name in the
 * meta, so that exactly one take-back wins; then its bit is set. 1 if
 * taken.
 */
static int reclaim_held(struct hkv_store *s, uint32_t seg, uint32_t b, struct hkv_block_hdr *h,
			uint64_t stamp, uint64_t meta, int kind, int may_fence)
{
	uint32_t holder = kind == 1 ? hkv_held_holder(stamp) : hkv_meta_retired_by(meta);

	if (kind == 5)
		return reclaim_unstamped(s, seg, b, h, stamp, meta);
	/* A connected holder may still write the block it holds, however long
	 * ago it claimed it (stopped between its hold check and its post), and
	 * a connected retirer the block it keeps, or post its free: the block
	 * comes back only once they are fenced - when a move needs it. */
	if (holder <= HKV_MAX_CLIENTS && s->clients[holder].connected) {
		if (!may_fence || hkv_store_fence(s, holder))
			return 0;
		/* Fenced: nothing of it lands from now on - but what we saw, we
		 * saw before. A keeper may have given the block back meanwhile
		 * (its stamp and bit change; a kept block's meta, which our CAS
		 * expects, does not) and another client claimed it since: look
		 * again. (A stamp CAS needs no look: a give-back changes it.) */
		if (kind == 2 && (load(&bitmap(s, seg)[b / 64]) >> (b % 64) & 1 ||
				  load(stamp_word(h)) != stamp || load(&h->meta) != meta))
			return 0;
	}
	hkv_failpoint("take-back");
	if (kind == 2 ? !cas(s, &h->meta, meta, meta & ~hkv_meta_retirer(0xffff))
		      : !cas(s, stamp_word(h), stamp, next_freed_stamp(s)))
		return 0;
	if (kind == 2)
		stamp_freed(s, h);
	set_free(s, seg, b);
	s->slab.held_reclaimed++;
	return 1;
}

static uint64_t *naming_slot(const struct hkv_store *s, struct hkv_block_hdr *h, uint32_t cls,
			     uint32_t gen, uint64_t *sl);

/*
 * What a move would otherwise wait for until it is undone: blocks of the
 * segment being moved (bit clear, LIVE or PENDING in its class) that
 *
 *  3: no slot names, written by a client (its id in `owner`) that is not
 *     connected. Its queue pair went first (store.c; shm: its socket, as
 *     for a retirer), so nothing it posted can land any more: no late meta
 *     WRITE, slot CAS or give-back. And nobody else makes a slot name a
 *     block they did not write: a slot CAS writes the writer's own new
 *     block, 0, or a copy (a stale swing's undo) - never another's block.
 *     So it stays unnamed and unwritten. Its writer's id given to a client
 *     connected since only delays this.
 *  4: an insert not committed that a slot names (its writer, alive or
 *     not, stalled or died between its slot CAS and its commit): once past
 *     its lease, aborted as a client's find_rival does (abort_stale_pending,
 *     client/publish.c), whose meta CAS makes the commit fail.
 *
 * 0 otherwise. Only for the segment being moved: in the sweep it would hash
 * the key of every live item a gone writer wrote, on every pass. Sets *meta,
 * *stamp (the sighting's: bytes 16..23 with atime folded in, so that a
 * touch counts as a change), and for 4 the slot (*slot = *sl).
 */
static int left_behind(const struct hkv_store *s, struct hkv_block_hdr *h, uint32_t cls,
		       uint64_t *meta, uint64_t *stamp, uint64_t **slot, uint64_t *sl)
{
	enum hkv_block_state st;
	uint32_t atime, owner;

	*meta = load(&h->meta);
	st = hkv_meta_state(*meta);
	if ((st != HKV_BLK_LIVE && st != HKV_BLK_PENDING) || hkv_meta_class(*meta) != cls)
		return 0;
	*stamp = load(stamp_word(h));
	atime = __atomic_load_n(&h->atime, __ATOMIC_RELAXED);
	owner = (uint32_t)(*stamp >> 48); /* (owner: bytes 22..23) */
	*stamp ^= atime;
	if (st == HKV_BLK_PENDING && (*slot = naming_slot(s, h, cls, hkv_meta_gen(*meta), sl)))
		return 4;
	return owner && !s->clients[owner].connected && !named(s, h, cls) ? 3 : 0;
}

/* Is block h whole as seen with meta: lengths within class cls, its CRC
 * right? (A write in progress, or torn by a writer stopped in it, is not
 * taken.) The header is read once, so a writer cannot make us read past
 * the block. */
static int whole(const struct hkv_store *s, const struct hkv_block_hdr *h, uint32_t cls,
		 uint64_t meta)
{
	struct hkv_block_hdr c;

	memcpy(&c, h, sizeof(c));
	return c.meta == meta && c.klen && c.klen <= HKV_MAX_KEY &&
	       (uint64_t)HKV_BLOCK_HDR + c.klen + c.vlen <= s->geom->class_size[cls] &&
	       c.sum == hkv_block_sum(&c, h + 1);
}

/*
 * Take back a block left_behind() found, once it has stood unchanged for
 * RECLAIM_NS (4: and its lease is over, by the writer's clock too): CAS its
 * meta to OBSOLETE|aborted with no retirer - the one arbiter against the
 * writer's own CASes (commit, withdraw) and a client aborting it: only the
 * winner frees - then, for 4, the slot to 0 (whatever that CAS finds, the
 * slot no longer names the block after it), then its bit. 1 if taken.
 */
static int reclaim_left(struct hkv_store *s, uint32_t seg, uint32_t b, struct hkv_block_hdr *h,
			uint32_t cls, uint64_t meta, int kind, uint64_t *slot, uint64_t sl)
{
	int32_t age_ms = (int32_t)(now_ms32() - __atomic_load_n(&h->atime, __ATOMIC_RELAXED));

	if ((kind == 4 && age_ms <= HKV_PENDING_LEASE_MS) || !whole(s, h, cls, meta))
		return 0;
	hkv_failpoint("take-left");
	if (!cas(s, &h->meta, meta,
		 hkv_meta_make(HKV_BLK_OBSOLETE, cls, hkv_meta_gen(meta)) | HKV_META_ABORTED))
		return 0;
	if (kind == 4 && hkv_satom_run(&s->atom, &(struct hkv_satom_op){slot, sl, 0, 0, HKV_WR_CAS},
				       1))
		return 0; /* (not known done: the block stays out, named maybe; leaked) */
	stamp_freed(s, h);
	set_free(s, seg, b);
	s->slab.held_reclaimed++;
	hkv_debug("slab: segment %u block %u: %s taken back", seg, b,
		  kind == 4 ? "an insert past its lease" : "a gone writer's unpublished block");
	return 1;
}

/* ---- sightings of held blocks ------------------------------------------------- */

/* When a held block was first seen under this stamp and meta, by `seen`
 * (sorted by offset), or UINT64_MAX. */
static uint64_t first_seen(const struct hkv_sightings *seen, uint64_t off, uint64_t stamp,
			   uint64_t meta)
{
	uint32_t lo = 0, hi = seen->n;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if (seen->v[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < seen->n && seen->v[lo].off == off && seen->v[lo].stamp == stamp &&
			       seen->v[lo].meta == meta
		       ? seen->v[lo].first_ns
		       : UINT64_MAX;
}

/* Record a held block seen now; returns when it was first seen under the
 * same stamp and meta (in `prev`, or at `since` if earlier), or now. */
static uint64_t sighting(struct hkv_sightings *cur, const struct hkv_sightings *prev,
			 uint64_t off, uint64_t stamp, uint64_t meta, uint64_t now, uint64_t since)
{
	uint64_t first = first_seen(prev, off, stamp, meta);

	first = since < first ? since : first;
	first = now < first ? now : first;
	if (cur->n == cur->cap) {
		uint32_t cap = cur->cap ? 2 * cur->cap : 64;
		void *p = hkv_realloc(cur->v, cap * sizeof(*cur->v));

		if (!p)
			return now; /* forget it: seen again next time */
		cur->v = p;
		cur->cap = cap;
	}
	cur->v[cur->n++] = (struct hkv_sighting){off, stamp, meta, first};
	return first;
}

static void sightings_swap(struct hkv_sightings *a, struct hkv_sightings *b)
{
	struct hkv_sightings t = *a;

	*a = *b;
	*b = t;
	b->n = 0;
}

/* Held blocks of SHARED segment seg whose stamp has stood RECLAIM_NS. */
static void sweep_segment(struct hkv_store *s, uint32_t seg, uint64_t now)
{
	uint64_t e = load(&table(s)[seg]);
	uint32_t cls = hkv_seg_class(e), nb;
	uint64_t *bits = bitmap(s, seg);

	if (hkv_seg_state(e) != HKV_SEG_SHARED || cls >= s->geom->nclasses)
		return;
	nb = nblocks(s, cls);
	for (uint32_t w = 0; w * 64 < nb; w++) {
		uint64_t clear = ~load(&bits[w]) & word_mask(nb, w);

		for (; clear; clear &= clear - 1) {
			uint32_t b = w * 64 + (uint32_t)__builtin_ctzll(clear);
			struct hkv_block_hdr *h = block(s, seg, cls, b);
			uint64_t meta, stamp, off = (uint64_t)((uint8_t *)h - base(s));
			int kind = held_free(s, h, cls, &meta, &stamp, 0);

			if (!kind)
				continue;
			if (now - sighting(&s->slab.cur, &s->slab.prev, off, stamp, meta, now,
					   UINT64_MAX) >= RECLAIM_NS)
				reclaim_held(s, seg, b, h, stamp, meta, kind, 0);
		}
	}
}

/* ---- carving ------------------------------------------------------------------- */

/* Set every bit of the nb blocks' words bits[] (a chain per 32 words). */
static void set_words(struct hkv_store *s, uint64_t *bits, uint32_t nb)
{
	uint64_t *w[HKV_SATOM_CHAIN], m[HKV_SATOM_CHAIN];
	uint32_t n = 0;

	for (uint32_t i = 0; i * 64 < nb; i++) {
		w[n] = &bits[i];
		m[n++] = word_mask(nb, i);
		if (n == HKV_SATOM_CHAIN || (i + 1) * 64 >= nb) {
			hkv_satom_or(&s->atom, w, m, (int)n);
			n = 0;
		}
	}
}

/* Segment seg (nobody claims in it: FREE, or DRAINING with every bit
 * cleared by us) becomes SHARED in class cls: every block's first 24 bytes
 * say UNUSED with generation floor, then the entry, then the bits. The
 * headers are plain stores: no client's CAS on them can succeed meanwhile
 * (every block is free, unheld and named by no slot, so a stale CAS finds
 * neither the LIVE meta nor the HELD stamp it expects, and a failed RDMA
 * CAS writes nothing), so none can be lost between a NIC's read and write. */
static void carve(struct hkv_store *s, uint32_t seg, uint32_t cls, uint32_t floor, uint64_t was)
{
	uint32_t nb = nblocks(s, cls);
	uint64_t *bits = bitmap(s, seg);

	for (uint32_t b = 0; b < nb; b++) {
		struct hkv_block_hdr *h = block(s, seg, cls, b);

		__atomic_store_n(&h->meta, hkv_meta_make(HKV_BLK_UNUSED, cls, floor),
				 __ATOMIC_RELAXED);
		__atomic_store_n((uint64_t *)&h->sum, 0, __ATOMIC_RELAXED); /* sum, vlen */
		__atomic_store_n(stamp_word(h), 0, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&table(s)[seg], hkv_seg_make(HKV_SEG_SHARED, cls, hkv_seg_epoch(was) + 1),
			 __ATOMIC_RELEASE);
	if (hkv_seg_state(was) != HKV_SEG_FREE && !s->slab.moved_in)
		s->slab.moved_in = hkv_calloc(s->geom->nsegs, sizeof(*s->slab.moved_in));
	if (hkv_seg_state(was) != HKV_SEG_FREE && s->slab.moved_in) /* a move's re-carve */
		s->slab.moved_in[seg] = (struct hkv_moved_in){hkv_now_ns(), hkv_seg_class(was)};
	set_words(s, bits, nb);
	s->slab.carved++;
}

/* Are all of SHARED segment seg's blocks free (every bit set)? */
static int wholly_free(const struct hkv_store *s, uint32_t seg, uint32_t cls)
{
	uint32_t nb = nblocks(s, cls);

	for (uint32_t w = 0; w * 64 < nb; w++)
		if ((load(&bitmap(s, seg)[w]) & word_mask(nb, w)) != word_mask(nb, w))
			return 0;
	return 1;
}

/* Free blocks in SHARED segment seg, as counted now. */
static uint32_t free_blocks(const struct hkv_store *s, uint32_t seg, uint32_t cls)
{
	uint32_t nb = nblocks(s, cls), n = 0;

	for (uint32_t w = 0; w * 64 < nb; w++)
		n += (uint32_t)__builtin_popcountll(load(&bitmap(s, seg)[w]) & word_mask(nb, w));
	return n;
}

/* ---- eviction by the server (cache mode, a segment being moved) ------------------ */

/* The slot of h's key that names h (LIVE, generation gen) as of now, or NULL. */
static uint64_t *naming_slot(const struct hkv_store *s, struct hkv_block_hdr *h, uint32_t cls,
			     uint32_t gen, uint64_t *sl)
{
	uint64_t off = (uint64_t)((uint8_t *)h - base(s)), *slots[2 * HKV_BUCKET_SLOTS];

	if (key_slots(s, h, cls, slots))
		return NULL;
	for (int p = 0; p < 2 * HKV_BUCKET_SLOTS; p++) {
		*sl = load(slots[p]);
		if (*sl && hkv_slot_off(*sl) == off && hkv_slot_class(*sl) == cls &&
		    hkv_slot_ver(*sl) == (gen & 0x7ff))
			return slots[p];
	}
	return NULL;
}

/* A LIVE item the index names, to be evicted. */
struct eviction {
	struct hkv_block_hdr *h;
	uint64_t *slot, sl, meta;
	uint32_t b;
};

/*
 * Remove ev[0..n) (n <= HKV_SATOM_CHAIN; LIVE items of seg, class cls, each
 * named by its slot) as a client's delete does: mark each meta LIVE ->
 * OBSOLETE, then swing the slot that names it to 0, then set its bit; a
 * chain for each step. An item someone else retires first is theirs to
 * free. How many were evicted.
 */
static uint32_t evict_batch(struct hkv_store *s, uint32_t seg, uint32_t cls,
			    struct eviction *ev, int n)
{
	struct hkv_satom_op op[HKV_SATOM_CHAIN];
	uint64_t *w[HKV_SATOM_CHAIN], m[HKV_SATOM_CHAIN];
	int k = 0;

	hkv_failpoint("move-evict");
	for (int i = 0; i < n; i++)
		op[i] = (struct hkv_satom_op){&ev[i].h->meta, ev[i].meta,
					      hkv_meta_make(HKV_BLK_OBSOLETE, cls,
							    hkv_meta_gen(ev[i].meta)),
					      0, HKV_WR_CAS};
	if (hkv_satom_run(&s->atom, op, n))
		return 0;
	for (int i = 0; i < n; i++)
		if (op[i].old == ev[i].meta)
			ev[k++] = ev[i];
	for (int i = 0; i < k; i++)
		op[i] = (struct hkv_satom_op){ev[i].slot, ev[i].sl, 0, 0, HKV_WR_CAS};
	/* (a slot CAS lost to a writer's, after our mark: the block is out of
	 * the index either way, and we won the mark, so we free it - unless the
	 * chain failed: then not known, and the blocks stay out) */
	if (hkv_satom_run(&s->atom, op, k))
		return 0;
	for (int i = 0; i < k; i++) {
		stamp_freed(s, ev[i].h);
		w[i] = &bitmap(s, seg)[ev[i].b / 64];
		m[i] = 1ull << (ev[i].b % 64);
	}
	hkv_satom_or(&s->atom, w, m, k);
	s->slab.evicted += (uint64_t)k;
	return (uint32_t)k;
}

/* Cache mode, a segment being moved: evict every LIVE item of it that a
 * slot names (an unpublished block is left to its writer). */
static void evict_live(struct hkv_store *s, uint32_t seg, uint32_t cls)
{
	struct eviction ev[HKV_SATOM_CHAIN];
	uint64_t *bits = bitmap(s, seg);
	uint32_t nb = nblocks(s, cls);
	int n = 0;

	for (uint32_t w = 0; w * 64 < nb; w++) {
		uint64_t clear = ~load(&bits[w]) & word_mask(nb, w);

		for (; clear; clear &= clear - 1) {
			struct eviction *e = &ev[n];

			e->b = w * 64 + (uint32_t)__builtin_ctzll(clear);
			e->h = block(s, seg, cls, e->b);
			e->meta = load(&e->h->meta);
			if (hkv_meta_state(e->meta) != HKV_BLK_LIVE ||
			    !(e->slot = naming_slot(s, e->h, cls, hkv_meta_gen(e->meta), &e->sl)))
				continue;
			if (++n == HKV_SATOM_CHAIN) {
				evict_batch(s, seg, cls, ev, n);
				n = 0;
			}
		}
	}
	if (n)
		evict_batch(s, seg, cls, ev, n);
}

/* ---- moving live items (store mode, a segment being moved) -------------------- */

#define UP_MAX (64u << 10) /* items move up only to blocks this large (or their own) */
/* a segment that left class c this lately does not go back to c: a block
 * start of c does not come back within a view's age at a floored generation */
#define RECARVE_NS (300ull * 1000000ull)

/* A LIVE item of the segment being moved and the block it goes to. */
struct relocation {
	struct hkv_block_hdr *from, *to;
	uint32_t from_b, to_seg, to_b, to_cls;
	uint64_t *slot, sl, meta, to_meta, new_meta;
	int step;      /* how far its publication got (relocate_batch) */
	int published; /* the target's meta is new_meta (our CAS won) */
	int free_old;  /* the old block is ours to free (the slot no longer names it) */
};

/* Blocks of one class a move claimed a word at a time: the rest of the
 * last word claimed (bits of segment seg's word w), and where to look on. */
struct claims {
	uint32_t cursor, wnext; /* the next word to look at: segment, word */
	uint32_t seg, w;
	uint64_t bits;
};

/* Claim every free bit of the next word of class tc (outside segment skip)
 * that has any: one CAS. 0 if the class has none left. */
static int claim_word(struct hkv_store *s, uint32_t tc, uint32_t skip, struct claims *c)
{
	const struct hkv_geometry *g = s->geom;
	uint32_t nb = nblocks(s, tc);

	for (; c->cursor < g->nsegs; c->cursor++, c->wnext = 0) {
		uint32_t i = c->cursor;
		uint64_t e = load(&table(s)[i]), *bits = bitmap(s, i);

		if (i == skip || hkv_seg_state(e) != HKV_SEG_SHARED || hkv_seg_class(e) != tc)
			continue;
		for (; c->wnext * 64 < nb; c->wnext++) {
			uint32_t w = c->wnext;
			uint64_t v = load(&bits[w]), was;

			/* (stray bits past the last block stay as they are) */
			while (v & word_mask(nb, w)) {
				was = hkv_satom_cas(&s->atom, &bits[w], v, v & ~word_mask(nb, w));
				if (was == v) {
					*c = (struct claims){i, w + 1, i, w, v & word_mask(nb, w)};
					return 1;
				}
				v = was; /* a client got in: again, on what it left */
			}
		}
	}
	return 0;
}

/*
 * A free block of class tc outside segment skip, claimed (its bit clear)
 * with claim_word. Blocks whose free bit was set but whose meta is not free
 * (garbage, a hostile writer's bit) are left claimed and unused, as a
 * client's claim leaves them. NULL if the class has none.
 */
static struct hkv_block_hdr *claim_free(struct hkv_store *s, uint32_t tc, uint32_t skip,
					struct claims *c, uint32_t *tseg, uint32_t *tb,
					uint64_t *tmeta)
{
	for (;;) {
		while (c->bits) {
			uint32_t b = c->w * 64 + (uint32_t)__builtin_ctzll(c->bits);
			struct hkv_block_hdr *h = block(s, c->seg, tc, b);
			enum hkv_block_state st;

			c->bits &= c->bits - 1;
			*tmeta = load(&h->meta);
			st = hkv_meta_state(*tmeta);
			if ((st == HKV_BLK_UNUSED || st == HKV_BLK_OBSOLETE) &&
			    hkv_meta_class(*tmeta) == tc && hkv_meta_gen(*tmeta) < UINT32_MAX - 2) {
				*tseg = c->seg;
				*tb = b;
				return h;
			}
			hkv_warn("slab: free bit of a block that is not free (segment %u block %u, "
				 "meta 0x%llx); not used", c->seg, b, (unsigned long long)*tmeta);
		}
		if (!claim_word(s, tc, skip, c))
			return NULL;
	}
}

/* Give back what claim_word claimed and claim_free did not hand out. */
static void claims_return(struct hkv_store *s, struct claims *c, uint32_t ncls)
{
	for (uint32_t i = 0; i < ncls; i++)
		if (c[i].bits) {
			hkv_satom_or1(&s->atom, &bitmap(s, c[i].seg)[c[i].w], c[i].bits);
			c[i].bits = 0;
		}
}

/* The smallest class that holds block h's item (its own class if garbage). */
static uint32_t item_class(const struct hkv_geometry *g, const struct hkv_block_hdr *h,
			   uint32_t cls)
{
	uint64_t item = HKV_BLOCK_HDR + h->klen + (uint64_t)h->vlen;
	int c = item > g->class_size[cls] ? -1 : hkv_class_for(g, (uint32_t)item);

	return c >= 0 && (uint32_t)c < cls ? (uint32_t)c : cls;
}

/*
 * Prepare r: check the old block on one private copy (buf) and write the
 * copy (its block's generation + 1, its own class and CRC) into the target,
 * all but the meta (r->new_meta). 0 (publish it next), 1 (changed since we
 * looked, or garbage: left where it is, the target withdrawn) or -1 (the
 * target is not as we claimed it - a check against an atomic of another
 * agent that did not see ours: let be).
 */
static int relocation_write(struct hkv_store *s, uint32_t cls, struct relocation *r, uint8_t *buf)
{
	const struct hkv_geometry *g = s->geom;
	struct hkv_block_hdr nh, *oh = (struct hkv_block_hdr *)buf;
	uint64_t item;
	uint64_t *tbits = &bitmap(s, r->to_seg)[r->to_b / 64], tbit = 1ull << (r->to_b % 64);

	/* (what a writer changes in shared memory meanwhile - a kept block
	 * rewritten, garbage - cannot make us read or write out of bounds) */
	memcpy(buf, r->from, g->class_size[cls]);
	item = (uint64_t)HKV_BLOCK_HDR + oh->klen + (uint64_t)oh->vlen;
	if (oh->meta != r->meta || oh->klen == 0 || oh->klen > HKV_MAX_KEY ||
	    item > g->class_size[cls] || item > g->class_size[r->to_cls] ||
	    oh->sum != hkv_block_sum(oh, buf + HKV_BLOCK_HDR))
		return 1;
	if ((load(tbits) & tbit) || hkv_held_by_one(load(stamp_word(r->to))) ||
	    load(&r->to->meta) != r->to_meta)
		return -1;
	memcpy(&nh, oh, sizeof(nh));
	nh.meta = hkv_meta_make(HKV_BLK_LIVE, r->to_cls, hkv_meta_gen(r->to_meta) + 1);
	nh.owner = 0; /* the server's copy (the wid, the item's version, is kept) */
	nh.sum = hkv_block_sum(&nh, buf + HKV_BLOCK_HDR);
	memcpy(r->to + 1, buf + HKV_BLOCK_HDR, (size_t)item - HKV_BLOCK_HDR);
	memcpy((uint8_t *)r->to + 8, (uint8_t *)&nh + 8, sizeof(nh) - 8);
	r->new_meta = nh.meta;
	return 0;
}

enum { R_PUBLISH, R_MARK, R_SWING, R_DONE, R_WITHDRAW, R_SKIP };

/* The CAS of r's next step (r->step). */
static struct hkv_satom_op relocation_op(const struct hkv_store *s, uint32_t cls,
					 const struct relocation *r)
{
	switch (r->step) {
	case R_PUBLISH:
		return (struct hkv_satom_op){&r->to->meta, r->to_meta, r->new_meta, 0, HKV_WR_CAS};
	case R_MARK:
		return (struct hkv_satom_op){&r->from->meta, r->meta,
					     hkv_meta_make(HKV_BLK_OBSOLETE, cls,
							   hkv_meta_gen(r->meta)),
					     0, HKV_WR_CAS};
	case R_SWING:
		return (struct hkv_satom_op){r->slot, r->sl,
					     hkv_slot_make(hkv_slot_fp(r->sl), r->to_cls,
							   hkv_meta_gen(r->new_meta),
							   (uint64_t)((uint8_t *)r->to - base(s))),
					     0, HKV_WR_CAS};
	default: /* R_WITHDRAW: from the meta it has (published or as claimed) */
		return (struct hkv_satom_op){&r->to->meta, r->published ? r->new_meta : r->to_meta,
					     hkv_meta_make(HKV_BLK_OBSOLETE, r->to_cls,
							   hkv_meta_gen(r->to_meta) + 1) |
						     HKV_META_ABORTED,
					     0, HKV_WR_CAS};
	}
}

/*
 * Move rv[0..n) (n <= HKV_SATOM_CHAIN; old blocks in segment seg, class
 * cls) as a client's update publishes: each copy written whole, its meta
 * published (a CAS on the meta we claimed it under), then the old block's
 * meta LIVE -> OBSOLETE, then the slot old -> copy, then the old block's
 * bit - one chain per step over the batch. A writer that retires an item
 * first (its mark wins) keeps it; a writer whose slot CAS beat ours (its
 * mark lost to ours) leaves the old block ours to free. Either way our copy
 * is withdrawn: OBSOLETE, aborted, by a CAS on the meta it has, its bit set.
 * A chain that fails leaves its blocks as they are (out of use: leaked,
 * never doubled). How many items moved.
 */
static uint32_t relocate_batch(struct hkv_store *s, uint32_t seg, uint32_t cls,
			       struct relocation *rv, int n, uint8_t *buf)
{
	struct hkv_satom_op op[HKV_SATOM_CHAIN];
	struct relocation *at[HKV_SATOM_CHAIN];
	uint64_t *w[2 * HKV_SATOM_CHAIN], m[2 * HKV_SATOM_CHAIN];
	uint32_t moved = 0;
	int nw = 0;

	for (int i = 0; i < n; i++) {
		int ret = relocation_write(s, cls, &rv[i], buf);

		rv[i].published = rv[i].free_old = 0;
		rv[i].step = ret < 0 ? R_SKIP : ret ? R_WITHDRAW : R_PUBLISH;
	}
	for (int step = R_PUBLISH; step <= R_WITHDRAW; step++) {
		int k = 0;

		if (step == R_DONE)
			continue;
		for (int i = 0; i < n; i++)
			if (rv[i].step == step)
				at[k++] = &rv[i];
		if (!k)
			continue;
		if (step == R_PUBLISH)
			hkv_failpoint("move-publish"); /* (the copies written) */
		else if (step == R_SWING)
			hkv_failpoint("move-swing"); /* (the old blocks marked) */
		for (int i = 0; i < k; i++)
			op[i] = relocation_op(s, cls, at[i]);
		if (hkv_satom_run(&s->atom, op, k))
			return moved; /* (not known done: left as they are) */
		for (int i = 0; i < k; i++) {
			struct relocation *r = at[i];
			int won = op[i].old == op[i].cmp_add;

			switch (step) {
			case R_PUBLISH:
				r->published = won;
				r->step = won ? R_MARK : R_SKIP;
				break;
			case R_MARK:
				r->step = won ? R_SWING : R_WITHDRAW;
				break;
			case R_SWING:
				r->free_old = 1;
				r->step = won ? R_DONE : R_WITHDRAW;
				moved += (uint32_t)won;
				break;
			default: /* R_WITHDRAW */
				if (won) {
					stamp_freed(s, r->to);
					w[nw] = &bitmap(s, r->to_seg)[r->to_b / 64];
					m[nw++] = 1ull << (r->to_b % 64);
				}
				r->step = R_DONE;
				break;
			}
		}
	}
	for (int i = 0; i < n; i++)
		if (rv[i].free_old) {
			stamp_freed(s, rv[i].from);
			w[nw] = &bitmap(s, seg)[rv[i].from_b / 64];
			m[nw++] = 1ull << (rv[i].from_b % 64);
		}
	hkv_satom_or(&s->atom, w, m, nw);
	return moved;
}

/*
 * The largest class an item of class cls may move up to: one every handle
 * can read in one go (a handle reads blocks up to 64 KiB, or twice its
 * largest value's; client/connect.c), or its own.
 */
static uint32_t up_limit(const struct hkv_geometry *g, uint32_t cls)
{
	uint32_t lim = cls;

	while (lim + 1 < g->nclasses &&
	       g->class_size[lim + 1] <= (g->class_size[cls] > UP_MAX ? g->class_size[cls] : UP_MAX))
		lim++;
	return lim;
}

/*
 * Store mode: move every LIVE item the index names out of segment seg
 * (class cls, being moved) into free blocks of its class, or of a larger
 * one, elsewhere. All targets are claimed first; if any was freed before,
 * we rest HKV_QUARANTINE_NS once before writing them (the ABA horizon holds
 * for our reuse as for a client's). -1 if the others have no room (nothing
 * is moved then), else how many items moved.
 */
static int relocate_live(struct hkv_store *s, uint32_t seg, uint32_t cls)
{
	const struct hkv_geometry *g = s->geom;
	uint32_t nb = nblocks(s, cls), n = 0, moved = 0;
	struct claims *cursor = hkv_calloc(g->nclasses, sizeof(*cursor));
	struct relocation *rv = hkv_calloc(nb, sizeof(*rv));
	uint8_t *buf = hkv_malloc(g->class_size[cls]);
	uint64_t *bits = bitmap(s, seg);
	uint32_t top = s->slab.drain_up ? up_limit(g, cls) : cls;
	int rest = 0;

	if (!cursor || !rv || !buf) {
		hkv_free(cursor);
		hkv_free(rv);
		hkv_free(buf);
		return 0;
	}
	for (uint32_t b = 0; b < nb; b++) {
		struct relocation *r = &rv[n];
		struct hkv_block_hdr *h = block(s, seg, cls, b);
		uint32_t tc;

		if (load(&bits[b / 64]) & (1ull << (b % 64)))
			continue;
		r->meta = load(&h->meta);
		if (hkv_meta_state(r->meta) != HKV_BLK_LIVE || hkv_meta_class(r->meta) != cls ||
		    !(r->slot = naming_slot(s, h, cls, hkv_meta_gen(r->meta), &r->sl)))
			continue; /* (unpublished yet, or being retired: the drain waits) */
		/* (from the class the item needs: one moved up before may come back down) */
		r->to = NULL;
		for (tc = item_class(g, h, cls); tc <= top; tc++)
			if ((r->to = claim_free(s, tc, seg, &cursor[tc], &r->to_seg, &r->to_b,
						&r->to_meta)))
				break;
		if (!r->to) { /* no room: give back what we claimed */
			for (uint32_t i = 0; i < n; i++) {
				stamp_freed(s, rv[i].to);
				set_free(s, rv[i].to_seg, rv[i].to_b);
			}
			claims_return(s, cursor, g->nclasses);
			hkv_free(cursor);
			hkv_free(rv);
			hkv_free(buf);
			return -1;
		}
		r->from = h;
		r->from_b = b;
		r->to_cls = tc;
		rest |= hkv_meta_state(r->to_meta) == HKV_BLK_OBSOLETE;
		n++;
	}
	if (rest) {
		struct timespec ts = {0, (long)HKV_QUARANTINE_NS};

		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	claims_return(s, cursor, g->nclasses);
	if (n)
		hkv_failpoint("move-claimed"); /* (targets claimed, nothing written) */
	for (uint32_t i = 0; i < n; i += HKV_SATOM_CHAIN)
		moved += relocate_batch(s, seg, cls, rv + i,
					(int)(n - i < HKV_SATOM_CHAIN ? n - i : HKV_SATOM_CHAIN), buf);
	s->slab.relocated += moved;
	s->slab.drain_items += moved;
	hkv_free(cursor);
	hkv_free(rv);
	hkv_free(buf);
	return (int)moved;
}

/* ---- moving a segment ------------------------------------------------------------ */

/* Start moving seg (whose entry was e, validated: SHARED, a real class) to
 * class to; 0, or -EAGAIN if the entry changed meanwhile (garbage CASed by
 * a hostile writer: nothing is started). */
static int drain_start(struct hkv_store *s, uint32_t seg, uint64_t e, uint32_t to, int up)
{
	uint64_t d = hkv_seg_make(HKV_SEG_DRAINING, hkv_seg_class(e), hkv_seg_epoch(e) + 1);

	if (!__atomic_compare_exchange_n(&table(s)[seg], &e, d, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return -EAGAIN;
	s->slab.drain_seg = (int64_t)seg;
	s->slab.drain_from = hkv_seg_class(e);
	s->slab.drain_to = to;
	s->slab.drain_up = up;
	s->slab.drain_items = 0;
	s->slab.drain_entry = d;
	s->slab.drain_start_ns = hkv_now_ns();
	s->slab.dcur.n = s->slab.dprev.n = 0;
	return 0;
}

static void drain_end(struct hkv_store *s)
{
	s->slab.drain_seg = -1;
}

/* Undo the move: the segment serves its own class again, as it is. */
static void drain_abort(struct hkv_store *s, const char *why)
{
	uint32_t seg = (uint32_t)s->slab.drain_seg;

	__atomic_store_n(&table(s)[seg],
			 hkv_seg_make(HKV_SEG_SHARED, s->slab.drain_from,
				      hkv_seg_epoch(s->slab.drain_entry) + 1),
			 __ATOMIC_RELEASE);
	s->slab.drains_aborted++;
	s->slab.undone_seg = seg; /* not picked again for a while */
	s->slab.undone_ns = hkv_now_ns();
	hkv_info("slab: moving segment %u from class %u to %u %s; undone", seg,
		 s->slab.drain_from, s->slab.drain_to, why);
	drain_end(s);
}

/*
 * One step of the move in progress: evict what the index names (cache
 * mode) or move it to free blocks elsewhere (store mode), take back
 * abandoned holds and what gone writers and stalled inserts left
 * (left_behind()), and once every bit is set clear them
 * all (CAS each full word to 0: a claimer that got in first makes it fail,
 * and we look again) and carve the segment into its new class, generations
 * continuing above the highest its old blocks had. 0 when carved,
 * -EINPROGRESS, HKV_EFULL when undone.
 */
static int drain_step(struct hkv_store *s)
{
	uint32_t seg = (uint32_t)s->slab.drain_seg, cls = s->slab.drain_from, nb = nblocks(s, cls);
	uint64_t *bits = bitmap(s, seg), now = hkv_now_ns();
	int all = 1, cache = s->geom->flags & HKV_GEOM_F_CACHE;
	uint32_t floor = 0, w;

	if (!cache && relocate_live(s, seg, cls) < 0) {
		drain_abort(s, "found no room for its items"); /* (the others filled meanwhile) */
		return HKV_EFULL;
	}
	if (cache)
		evict_live(s, seg, cls);
	for (w = 0; w * 64 < nb; w++) {
		uint64_t clear = ~load(&bits[w]) & word_mask(nb, w);

		for (; clear; clear &= clear - 1) {
			uint32_t b = w * 64 + (uint32_t)__builtin_ctzll(clear);
			struct hkv_block_hdr *h = block(s, seg, cls, b);
			uint64_t meta = load(&h->meta), stamp, off, since, cur, sl = 0;
			uint64_t *slot = NULL;
			int kind;

			all = 0;
			if (!(kind = held_free(s, h, cls, &meta, &stamp, cache)) &&
			    !(kind = left_behind(s, h, cls, &meta, &stamp, &slot, &sl)))
				continue;
			off = (uint64_t)((uint8_t *)h - base(s));
			/* (seen by the sweep already: it counts from then) */
			since = first_seen(&s->slab.prev, off, stamp, meta);
			cur = first_seen(&s->slab.cur, off, stamp, meta);
			since = cur < since ? cur : since;
			if (now - sighting(&s->slab.dcur, &s->slab.dprev, off, stamp, meta, now,
					   since) < RECLAIM_NS)
				continue;
			if (kind <= 2 || kind == 5)
				reclaim_held(s, seg, b, h, stamp, meta, kind, 1);
			else
				reclaim_left(s, seg, b, h, cls, meta, kind, slot, sl);
		}
	}
	sightings_swap(&s->slab.dprev, &s->slab.dcur);
	if (!all) {
		if (now - s->slab.drain_start_ns > DRAIN_MAX_NS) {
			drain_abort(s, "did not finish in 3 s");
			return HKV_EFULL;
		}
		return -EINPROGRESS;
	}
	for (w = 0; w * 64 < nb; w++) {
		/* (the word as it is: stray bits past the last block, garbage, go too) */
		uint64_t v = load(&bits[w]);

		if ((v & word_mask(nb, w)) != word_mask(nb, w) || !cas(s, &bits[w], v, 0)) {
			set_words(s, bits, w * 64); /* a claimer got in: the words we
						     * cleared come back; again later */
			if (now - s->slab.drain_start_ns > DRAIN_MAX_NS) {
				drain_abort(s, "did not finish in 3 s");
				return HKV_EFULL;
			}
			return -EINPROGRESS;
		}
	}
	for (uint32_t b = 0; b < nb; b++) {
		uint32_t gen = hkv_meta_gen(load(&block(s, seg, cls, b)->meta));

		if (gen > floor)
			floor = gen;
	}
	if (floor >= UINT32_MAX - 2) { /* garbage: never wrap a generation */
		set_words(s, bits, nb);
		drain_abort(s, "found generations near their end (garbage)");
		return HKV_EFULL;
	}
	/* (a block written at gen floor anywhere in the segment: the new blocks
	 * start above it, so no address sees a generation twice) */
	hkv_failpoint("move-carve"); /* (every bit ours, cleared) */
	carve(s, seg, s->slab.drain_to, floor + 1, s->slab.drain_entry);
	s->slab.moved++;
	if (s->slab.drain_items)
		hkv_info("slab: segment %u moved from class %u to class %u; %u live items moved "
			 "to other segments", seg, cls, s->slab.drain_to, s->slab.drain_items);
	else
		hkv_info("slab: segment %u moved from class %u to class %u", seg, cls,
			 s->slab.drain_to);
	drain_end(s);
	return 0;
}

/* Mean age (ms) of the LIVE items sampled in seg; empty segments are oldest. */
static uint64_t segment_age(const struct hkv_store *s, uint32_t seg, uint32_t cls, uint32_t now)
{
	uint32_t nb = nblocks(s, cls), live = 0;
	uint64_t sum = 0;

	for (uint32_t i = 0; i < VICTIM_SAMPLES; i++) {
		struct hkv_block_hdr *h = block(s, seg, cls, (uint32_t)((uint64_t)i * nb / VICTIM_SAMPLES));

		if (hkv_meta_state(load(&h->meta)) != HKV_BLK_LIVE)
			continue;
		sum += (uint32_t)(now - __atomic_load_n(&h->atime, __ATOMIC_RELAXED));
		live++;
	}
	return live ? sum / live : UINT64_MAX;
}

/*
 * Cache mode: the segment to empty for class cls - of another class, not
 * holding keep_off, from a class with two or more segments if there is one,
 * and of those the one whose sampled items are oldest. -1 if none.
 */
static int64_t pick_victim(const struct hkv_store *s, uint32_t cls, uint64_t keep_off)
{
	const struct hkv_geometry *g = s->geom;
	uint32_t *count = hkv_calloc(g->nclasses, sizeof(*count)), now = now_ms32();
	int64_t best = -1;
	uint64_t best_age = 0;
	int best_multi = 0;

	if (!count)
		return -1;
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = load(&table(s)[i]);

		if (hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) < g->nclasses)
			count[hkv_seg_class(e)]++;
	}
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = load(&table(s)[i]), age;
		uint32_t c = hkv_seg_class(e);
		int multi;

		if (hkv_seg_state(e) != HKV_SEG_SHARED || c >= g->nclasses || c == cls ||
		    (keep_off >= seg_off(s, i) && keep_off < seg_off(s, i) + g->seg_size) ||
		    (s->slab.undone_ns && i == s->slab.undone_seg &&
		     hkv_now_ns() - s->slab.undone_ns < 10 * DRAIN_MAX_NS))
			continue; /* (a move of it was undone lately: something holds it) */
		multi = count[c] >= 2;
		age = segment_age(s, i, c, now);
		if (best < 0 || multi > best_multi || (multi == best_multi && age > best_age)) {
			best = i;
			best_age = age;
			best_multi = multi;
		}
	}
	hkv_free(count);
	return best;
}

/*
 * Blocks of SHARED segment seg (class cls) that a move would wait for: bit
 * clear but not LIVE - held (a HELD stamp), kept by a replace, an insert
 * not committed yet. A move waits until they are written, given back or
 * reclaimed.
 */
static uint32_t blocked_blocks(const struct hkv_store *s, uint32_t seg, uint32_t cls)
{
	uint32_t nb = nblocks(s, cls), n = 0;

	for (uint32_t w = 0; w * 64 < nb; w++) {
		uint64_t clear = ~load(&bitmap(s, seg)[w]) & word_mask(nb, w);

		for (; clear; clear &= clear - 1) {
			struct hkv_block_hdr *h =
				block(s, seg, cls, w * 64 + (uint32_t)__builtin_ctzll(clear));

			n += hkv_meta_state(load(&h->meta)) != HKV_BLK_LIVE;
		}
	}
	return n;
}

#define RELOCATE_LOOK 64 /* candidates looked at closely */

/*
 * Store mode: the segment to empty for class cls by moving its items - of
 * another class, not holding keep_off, whose items the free blocks of its
 * class elsewhere can take, or if there is none (*up = 1), of its class and
 * larger ones up to up_limit (the items then lose the difference to
 * rounding). Of the RELOCATE_LOOK with the fewest bytes to copy, the one
 * with the fewest blocks a move would wait for (none: it finishes at
 * once), the cheapest of those. -1 if none (the store is full).
 */
static int64_t pick_to_relocate(const struct hkv_store *s, uint32_t cls, uint64_t keep_off,
				int *up)
{
	const struct hkv_geometry *g = s->geom;
	uint64_t *room = hkv_calloc(g->nclasses + 1, sizeof(*room)), now = hkv_now_ns();
	uint32_t *nfree = hkv_calloc(g->nsegs, sizeof(*nfree));
	struct {
		uint64_t cost;
		uint32_t seg;
	} look[RELOCATE_LOOK];
	uint32_t nlook = 0;
	int64_t best = -1;

	if (!room || !nfree)
		goto out;
	/* room[c]: free blocks of the classes below c (prefix sums) */
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = load(&table(s)[i]);

		if (hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) < g->nclasses)
			room[hkv_seg_class(e) + 1] += nfree[i] = free_blocks(s, i, hkv_seg_class(e));
	}
	for (uint32_t c = 1; c <= g->nclasses; c++)
		room[c] += room[c - 1];
	for (*up = 0; *up < 2 && !nlook; ++*up) {
		for (uint32_t i = 0; i < g->nsegs; i++) {
			uint64_t e = load(&table(s)[i]), live, cost, fits;
			uint32_t c = hkv_seg_class(e), at;

			if (hkv_seg_state(e) != HKV_SEG_SHARED || c >= g->nclasses || c == cls ||
			    (keep_off >= seg_off(s, i) && keep_off < seg_off(s, i) + g->seg_size) ||
			    (s->slab.undone_ns && i == s->slab.undone_seg &&
			     now - s->slab.undone_ns < 10 * DRAIN_MAX_NS) ||
			    (s->slab.moved_in && s->slab.moved_in[i].from == cls &&
			     now - s->slab.moved_in[i].ns < RECARVE_NS))
				continue; /* (it left cls lately: not back within a view's age) */
			live = nblocks(s, c) - nfree[i];
			cost = live * g->class_size[c];
			/* free blocks of its class (up: to up_limit) elsewhere; ours counted in */
			fits = room[(*up ? up_limit(g, c) : c) + 1] - room[c];
			if (fits < (uint64_t)nfree[i] + live)
				continue;
			/* keep the cheapest RELOCATE_LOOK, sorted by cost */
			if (nlook == RELOCATE_LOOK && cost >= look[nlook - 1].cost)
				continue;
			at = nlook < RELOCATE_LOOK ? nlook++ : nlook - 1;
			for (; at > 0 && look[at - 1].cost > cost; at--)
				look[at] = look[at - 1];
			look[at].cost = cost;
			look[at].seg = i;
		}
	}
	--*up; /* (the pass that found them) */
	/* the cheapest with the fewest blocks to wait for */
	for (uint32_t k = 0, fewest = UINT32_MAX; k < nlook && fewest; k++) {
		uint32_t b = blocked_blocks(s, look[k].seg,
					    hkv_seg_class(load(&table(s)[look[k].seg])));

		if (b < fewest) {
			fewest = b;
			best = look[k].seg;
		}
	}
out:
	hkv_free(room);
	hkv_free(nfree);
	return best;
}

int hkv_slab_carve(struct hkv_store *s, uint32_t cls, uint64_t keep_off, int move,
		   uint32_t *seg)
{
	const struct hkv_geometry *g = s->geom;
	int64_t victim = -1;
	int ret, up = 0;

	if (cls >= g->nclasses)
		return -EINVAL;
	if (s->slab.drain_seg >= 0) {
		uint32_t d = (uint32_t)s->slab.drain_seg, to = s->slab.drain_to;

		ret = drain_step(s);
		if (ret == -EINPROGRESS)
			return ret;
		if (ret == 0 && to == cls) {
			*seg = d;
			return 0;
		}
	}
	/* memory another request just gave the class (an eighth of a segment free) */
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = load(&table(s)[i]);

		if (hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) == cls &&
		    free_blocks(s, i, cls) * 8 >= nblocks(s, cls)) {
			*seg = i;
			return 0;
		}
	}
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = load(&table(s)[i]);

		if (hkv_seg_state(e) == HKV_SEG_FREE) {
			carve(s, i, cls, hkv_meta_gen(load(&block(s, i, cls, 0)->meta)), e);
			hkv_debug("slab: segment %u carved into class %u", i, cls);
			*seg = i;
			return 0;
		}
	}
	/*
	 * A wholly free segment of another class (deleted, flushed, expired).
	 * A full cache empties segments of large classes all the time by
	 * evicting: there, take one only for a class with no segment, or when
	 * a sixteenth of memory lies wholly free (after a flush), so that
	 * eviction, not the order of requests, shares memory out.
	 */
	{
		uint32_t nfree = 0;
		int64_t first = -1;

		for (uint32_t i = 0; i < g->nsegs; i++) {
			uint64_t e = load(&table(s)[i]);

			if (hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) != cls &&
			    hkv_seg_class(e) < g->nclasses && wholly_free(s, i, hkv_seg_class(e))) {
				nfree++;
				if (first < 0)
					first = i;
			}
		}
		if (!(g->flags & HKV_GEOM_F_CACHE) || move || (uint64_t)nfree * 16 >= g->nsegs)
			victim = first;
	}
	if (victim < 0 && (g->flags & HKV_GEOM_F_CACHE) && move)
		victim = pick_victim(s, cls, keep_off);
	if (victim < 0 && !(g->flags & HKV_GEOM_F_CACHE))
		victim = pick_to_relocate(s, cls, keep_off, &up);
	if (victim < 0)
		return HKV_EFULL;
	{
		uint64_t e = load(&table(s)[victim]);

		if (hkv_seg_state(e) != HKV_SEG_SHARED || hkv_seg_class(e) >= g->nclasses ||
		    hkv_seg_class(e) == cls || drain_start(s, (uint32_t)victim, e, cls, up))
			return -EINPROGRESS; /* changed under us: look again */
	}
	ret = drain_step(s);
	if (ret == 0)
		*seg = (uint32_t)victim;
	return ret;
}

/* ---- metrics -------------------------------------------------------------------- */

static uint64_t real_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The sweep passing seg: its part of the region's fill (struct hkv_slab_fill). */
static void fill_add(struct hkv_store *s, uint32_t seg)
{
	uint64_t e = load(&table(s)[seg]);
	uint32_t st = hkv_seg_state(e), cls = hkv_seg_class(e);

	if (seg == 0)
		s->slab.fill_pass.start_ns = real_ns();
	if (st > HKV_SEG_DRAINING)
		return; /* garbage a hostile writer put there: not a segment we serve */
	s->slab.fill_pass.segs[st]++;
	if (st != HKV_SEG_FREE && cls < s->geom->nclasses)
		s->slab.fill_pass.used_bytes += (uint64_t)(nblocks(s, cls) - free_blocks(s, seg, cls)) *
						s->geom->class_size[cls];
}

/* A pass is over: its sums are the region's fill as last sampled. */
static void fill_publish(struct hkv_store *s)
{
	s->slab.fill = s->slab.fill_pass;
	s->slab.fill_ns = real_ns();
	memset(&s->slab.fill_pass, 0, sizeof(s->slab.fill_pass));
}

void hkv_slab_seg_counts(const struct hkv_store *s, uint32_t out[3])
{
	out[0] = out[1] = out[2] = 0;
	for (uint32_t i = 0; i < s->geom->nsegs; i++) {
		uint32_t st = hkv_seg_state(load(&table(s)[i]));

		if (st <= HKV_SEG_DRAINING)
			out[st]++;
	}
}

void hkv_slab_tick(struct hkv_store *s)
{
	uint64_t now = hkv_now_ns();

	if (s->slab.drain_seg >= 0)
		drain_step(s);
	for (uint32_t k = 0; k < SWEEP_SEGS && k < s->geom->nsegs; k++) {
		fill_add(s, s->slab.sweep_next);
		sweep_segment(s, s->slab.sweep_next, now);
		if (++s->slab.sweep_next == s->geom->nsegs) { /* a pass is over */
			s->slab.sweep_next = 0;
			sightings_swap(&s->slab.prev, &s->slab.cur);
			fill_publish(s);
		}
	}
}

/* ---- warm restart --------------------------------------------------------------- */

static int mark_named(void *arg, uint64_t *slot, uint64_t sl, struct hkv_block_hdr *h,
		      uint64_t meta)
{
	struct hkv_store *s = arg;
	uint64_t u = (hkv_slot_off(sl) - s->geom->data_off) / HKV_BLOCK_ALIGN;

	(void)slot;
	(void)h;
	(void)meta;
	s->slab.named[u / 64] |= 1ull << (u % 64);
	return 0;
}

/*
 * No client is connected yet: every block of a SHARED segment is free
 * unless a slot names it. So the bitmaps are rebuilt exactly - what dead
 * clients held, wrote but never published, or freed without posting the
 * bit comes back - and a move the old process left half done is undone.
 */
int hkv_slab_rebuild(struct hkv_store *s)
{
	const struct hkv_geometry *g = s->geom;
	uint64_t units = (uint64_t)g->nsegs * g->seg_size / HKV_BLOCK_ALIGN, freed = 0;

	s->slab.named = hkv_calloc((units + 63) / 64, 8);
	if (!s->slab.named)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = table(s)[i];

		if (hkv_seg_state(e) == HKV_SEG_DRAINING)
			table(s)[i] = hkv_seg_make(HKV_SEG_SHARED, hkv_seg_class(e),
						   hkv_seg_epoch(e) + 1);
		else if (hkv_seg_state(e) != HKV_SEG_SHARED && hkv_seg_state(e) != HKV_SEG_FREE)
			table(s)[i] = hkv_seg_make(HKV_SEG_FREE, 0, hkv_seg_epoch(e) + 1);
	}
	hkv_store_walk(s, mark_named, s);
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t e = table(s)[i];
		uint32_t cls = hkv_seg_class(e), nb;

		if (hkv_seg_state(e) != HKV_SEG_SHARED)
			continue;
		if (cls >= g->nclasses) { /* garbage: the segment is lost, not served */
			hkv_warn("store: segment %u has class %u; left out", i, cls);
			continue;
		}
		nb = nblocks(s, cls);
		for (uint32_t w = 0; w * 64 < nb; w++) {
			uint64_t bits = 0;

			for (uint32_t b = w * 64; b < nb && b < w * 64 + 64; b++) {
				struct hkv_block_hdr *h = block(s, i, cls, b);
				uint64_t u = ((uint64_t)((uint8_t *)h - base(s)) - g->data_off) /
					     HKV_BLOCK_ALIGN;
				enum hkv_block_state st = hkv_meta_state(h->meta);

				if (s->slab.named[u / 64] >> (u % 64) & 1)
					continue;
				if (st == HKV_BLK_LIVE || st == HKV_BLK_PENDING)
					h->meta = hkv_meta_make(HKV_BLK_OBSOLETE, cls,
								hkv_meta_gen(h->meta)) |
						  (st == HKV_BLK_PENDING ? HKV_META_ABORTED : 0);
				if (st != HKV_BLK_UNUSED) /* free, as a client's free leaves it */
					*stamp_word(h) = next_freed_stamp(s);
				else if (hkv_held_is(*stamp_word(h)))
					*stamp_word(h) = 0;
				bits |= 1ull << (b % 64);
			}
			freed += (uint64_t)__builtin_popcountll(bits & ~bitmap(s, i)[w]);
			bitmap(s, i)[w] = bits;
		}
	}
	hkv_free(s->slab.named);
	s->slab.named = NULL;
	if (freed)
		hkv_info("store: warm restart: %llu block(s) no slot names were free again",
			 (unsigned long long)freed);
	return 0;
}

void hkv_slab_fini(struct hkv_store *s)
{
	hkv_free(s->slab.prev.v);
	hkv_free(s->slab.cur.v);
	hkv_free(s->slab.dprev.v);
	hkv_free(s->slab.dcur.v);
	hkv_free(s->slab.named);
	hkv_free(s->slab.moved_in);
	memset(&s->slab, 0, sizeof(s->slab));
	s->slab.drain_seg = -1;
}
