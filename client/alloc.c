/*
 * alloc.c - block allocation from shared per-class pools, without the
 * server's CPU per operation.
 *
 * The server carves segments into size classes (CARVE, a rare control-plane
 * request: server/store.c); from then on every writer allocates in every
 * segment of a class. A set bit in a segment's bitmap is a free block.
 *
 * Claim: one chain [CAS bitmap word w -> w & ~B; READ the segment's table
 * entry; READ the first 24 bytes of each block in B]. RC executes the READs
 * after the CAS, so a won CAS hands us blocks that were free, their metas
 * (and so their generations) as of after the claim. We then stamp each one
 * HELD(id, seq) (bytes 16..23, unsignaled WRITEs) and hold it: only we
 * write it, with generation + 1. A block that was freed (not fresh from a
 * carve) rests HKV_QUARANTINE_NS after the claim completed, hence after its
 * free executed (the ABA horizon, docs/design.md).
 *
 * A held block is ours until we write it or give it back, at any age: the
 * server takes back a held block only from a holder it has fenced (queue
 * pair destroyed, or our shm gate shut: hkv_listener_fence) - a move that
 * needs it fences us first - so no stop of ours between a check and a
 * doorbell can land a write on a block someone else got (issue 27); we
 * notice the fence at our next operation and connect again (hkv_revive). We hand a held
 * block out only within HOLD_USE_NS of posting its claim (fresh blocks,
 * small holds) and give back what waited longer: the freed stamp over our
 * HELD one, then the bit's FAA, one unsignaled chain. A stopped but
 * connected client keeps what it holds - at most HOLD_BYTES of a class,
 * 16 KiB per claim - until it runs again or goes.
 *
 * Freeing is as before: the writer that retired a block (its mark CAS took
 * it LIVE -> OBSOLETE) sets its bit with an unsignaled FAA.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

/* Held blocks are handed out only this soon after their claim; older ones
 * go back (at any age: see the top). */
#define HOLD_USE_NS  (250ull * 1000000ull)
/* Bytes of one class a claim takes at once (at least one block, at most 16). */
#define CLAIM_BYTES 16384
#define CLAIM_MAX   16
#define CLAIM_RAMP_NS (20ull * 1000000ull)
#define CLAIM_START 4
#define HOLD_BYTES  65536
#define MAX_HINTS   64
#define TABLE_MAX_AGE_NS (100ull * 1000000ull)
#define SURVEY_EVERY_NS  (1000ull * 1000000ull)

uint64_t hkv_rand(struct hkv_client *c)
{
	uint64_t x = c->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return c->rng = x;
}

int hkv_alloc_init(struct hkv_client *c)
{
	c->classes = hkv_calloc(c->g.nclasses, sizeof(*c->classes));
	c->table = hkv_calloc(c->g.nsegs, sizeof(*c->table));
	c->table_ns = 0;
	c->table_free = UINT32_MAX;
	memset(&c->cur, 0, sizeof(c->cur));
	return c->classes && c->table ? 0 : -ENOMEM;
}

void hkv_alloc_fini(struct hkv_client *c)
{
	for (uint32_t i = 0; c->classes && i < c->g.nclasses; i++) {
		hkv_free(c->classes[i].held);
		hkv_free(c->classes[i].hints);
	}
	hkv_free(c->classes);
	hkv_free(c->table);
	c->classes = NULL;
	c->table = NULL;
}

static uint64_t seg_base(const struct hkv_client *c, uint32_t seg)
{
	return c->g.data_off + (uint64_t)seg * c->g.seg_size;
}

static uint64_t bitmap_word(const struct hkv_client *c, uint32_t seg, uint32_t word)
{
	return c->g.bitmap_off + (uint64_t)seg * c->g.bitmap_bytes + (uint64_t)word * 8;
}

static uint32_t seg_blocks(const struct hkv_client *c, uint32_t cls)
{
	return c->g.seg_size / c->g.class_size[cls];
}

/* The bits of word w that name blocks (the last word may be partial). */
static uint64_t word_mask(uint32_t nblocks, uint32_t w)
{
	uint32_t left = nblocks - w * 64;

	return left >= 64 ? ~0ull : (1ull << left) - 1;
}

/* Segment and block index of the block of class cls at region offset off. */
static void block_pos(const struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t *seg,
		      uint32_t *blk)
{
	*seg = (uint32_t)((off - c->g.data_off) / c->g.seg_size);
	*blk = (uint32_t)((off - c->g.data_off) % c->g.seg_size / c->g.class_size[cls]);
}

/* The unsignaled FAA that sets the bit of block off (class cls): a free. */
static struct hkv_wr free_bit(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg, blk;
	struct hkv_wr wr;

	block_pos(c, off, cls, &seg, &blk);
	wr = hkv_wr_faa(c, &c->atom[63], bitmap_word(c, seg, blk / 64), 1ull << (blk % 64));
	wr.flags = HKV_WR_F_NO_COMPLETION;
	return wr;
}

/*
 * A free's chain, both unsignaled: WRITE the freed stamp over bytes 16..23
 * (layout.h, hkv_freed_stamp: what tells the sweep this block was freed, so
 * that a claimer stopped before its own stamps is never taken for a gone
 * retirer; ours and counted, so that no two frees of a block leave the
 * same), then FAA the bit. RC runs them in order. The stamp comes from
 * atom[59], which holds nothing else (atom[48..56) are the claims' stamps,
 * read by their unsignaled WRITEs until they execute).
 */
static void freed_stamp(struct hkv_client *c, uint64_t off, uint32_t cls, struct hkv_wr *wr)
{
	/* (inline: the WRITE takes the value when posted) */
	c->atom[59] = hkv_freed_stamp(c->client_id, ++c->free_seq);
	wr[0] = hkv_wr_write(c, &c->atom[59], off + 16, 8);
	wr[0].flags = HKV_WR_F_NO_COMPLETION;
	wr[1] = free_bit(c, off, cls);
}

int hkv_alloc_table(struct hkv_client *c, uint64_t max_age_ns)
{
	struct hkv_wr wr;
	int ret;

	if (c->table_ns && max_age_ns && hkv_now_ns() - c->table_ns < max_age_ns)
		return 0;
	wr = hkv_wr_read(c, c->scr, c->g.seg_table_off, c->g.nsegs * 8);
	c->table_ns = hkv_now_ns();
	ret = hkv_exec(c, &wr, 1);
	if (ret)
		return ret;
	memcpy(c->table, c->scr, (size_t)c->g.nsegs * 8);
	c->table_free = 0;
	for (uint32_t i = 0; i < c->g.nsegs; i++)
		c->table_free += hkv_seg_state(c->table[i]) == HKV_SEG_FREE;
	return 0;
}

int hkv_alloc_any_free(const struct hkv_client *c)
{
	return c->table_free > 0;
}

uint32_t hkv_alloc_class_segs(const struct hkv_client *c, uint32_t cls)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < c->g.nsegs; i++)
		n += hkv_seg_state(c->table[i]) == HKV_SEG_SHARED && hkv_seg_class(c->table[i]) == cls;
	return n;
}

static int push_held(struct hkv_class_alloc *ca, const struct hkv_held *h)
{
	if (ca->head && ca->n == ca->cap) { /* slide the live part down */
		memmove(ca->held, ca->held + ca->head, (ca->n - ca->head) * sizeof(*h));
		ca->n -= ca->head;
		ca->head = 0;
	}
	if (ca->n == ca->cap) {
		uint32_t cap = ca->cap ? 2 * ca->cap : 32;
		void *p = hkv_realloc(ca->held, cap * sizeof(*h));

		if (!p)
			return -ENOMEM;
		ca->held = p;
		ca->cap = cap;
	}
	ca->held[ca->n++] = *h;
	return 0;
}

static int push_hint(struct hkv_class_alloc *ca, uint32_t seg, uint32_t word, uint64_t bits)
{
	if (ca->nhints == ca->caphints) {
		uint32_t cap = ca->caphints ? 2 * ca->caphints : 16;
		void *p = hkv_realloc(ca->hints, cap * sizeof(*ca->hints));

		if (!p)
			return -ENOMEM;
		ca->hints = p;
		ca->caphints = cap;
	}
	ca->hints[ca->nhints++] = (struct hkv_hint){seg, word, bits};
	return 0;
}

/*
 * Look for free blocks of class cls: the table, then the bitmaps of every
 * segment of the class (chains of up to 64 segments' bitmaps: one round
 * trip each). Up to MAX_HINTS words with free bits become hints, taken from
 * a random starting segment so that writers spread out. Returns how many.
 */
static int survey(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint32_t nb = seg_blocks(c, cls), nwords = (nb + 63) / 64;
	uint32_t per = (uint32_t)(c->scr_cap / c->g.bitmap_bytes), start, segs[64];
	uint64_t nfree = 0, total = 0;
	int ret;

	if ((ret = hkv_alloc_table(c, TABLE_MAX_AGE_NS / 10)))
		return ret;
	ca->nhints = 0;
	if (per > 64)
		per = 64;
	start = (uint32_t)(hkv_rand(c) % c->g.nsegs);
	for (uint32_t k = 0; k < c->g.nsegs;) {
		struct hkv_wr wrs[64];
		uint32_t n = 0;

		for (; k < c->g.nsegs && n < per; k++) {
			uint32_t i = (start + k) % c->g.nsegs;
			uint64_t e = c->table[i];

			if (hkv_seg_state(e) != HKV_SEG_SHARED || hkv_seg_class(e) != cls)
				continue;
			segs[n] = i;
			wrs[n] = hkv_wr_read(c, c->scr + (size_t)n * c->g.bitmap_bytes,
					     bitmap_word(c, i, 0), nwords * 8);
			n++;
		}
		if (!n)
			break;
		if ((ret = hkv_exec(c, wrs, (int)n)))
			return ret;
		for (uint32_t j = 0; j < n; j++) {
			const uint64_t *w = (const uint64_t *)(c->scr + (size_t)j * c->g.bitmap_bytes);

			total += nb;
			for (uint32_t x = 0; x < nwords; x++) {
				uint64_t bits = w[x] & word_mask(nb, x);

				nfree += (uint64_t)__builtin_popcountll(bits);
				if (bits && ca->nhints < MAX_HINTS &&
				    (ret = push_hint(ca, segs[j], x, w[x])))
					return ret;
			}
		}
	}
	/* short: under 1/8 of the class free, and no FREE segment left to
	 * carve (a dense class in a store with room is not short: its writers
	 * hold and claim as usual instead of waiting on their few blocks' rest) */
	ca->scarce = nfree * 8 < total && !hkv_alloc_any_free(c);
	ca->survey_ns = hkv_now_ns();
	c->stats.surveys++;
	if (!ca->nhints)
		ca->empty_survey_ns = hkv_now_ns();
	return (int)ca->nhints;
}

/*
 * A block we freed: its word becomes a hint (or its hint learns the bit),
 * so we reuse what we free, as memcached's slabs do. A word we had no hint
 * for goes to the front, tried last: its other bits are a guess (0), so its
 * claim CAS most likely fails once and returns the word as it is.
 */
static void note_free(struct hkv_client *c, uint32_t cls, uint32_t seg, uint32_t blk)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint32_t word = blk / 64;

	for (uint32_t i = 0; i < ca->nhints; i++)
		if (ca->hints[i].seg == seg && ca->hints[i].word == word) {
			ca->hints[i].bits |= 1ull << (blk % 64);
			return;
		}
	if (ca->nhints >= MAX_HINTS || push_hint(ca, seg, word, 0))
		return;
	memmove(ca->hints + 1, ca->hints, (ca->nhints - 1) * sizeof(*ca->hints));
	ca->hints[0] = (struct hkv_hint){seg, word, 1ull << (blk % 64)};
}

/* The most a pressed class's reserve may be: 64 KiB worth, 4 to 64
 * blocks - but within 256 KiB (a large class's 4 could be 4 whole segments
 * kept from the items), at least 1. */
#define PRESSED_HOLD_BYTES (4 * HOLD_BYTES)

static uint32_t pressed_max(const struct hkv_client *c, uint32_t cls)
{
	uint32_t size = c->g.class_size[cls], n = HOLD_BYTES / size;

	n = n > 64 ? 64 : n < 4 ? 4 : n;
	if ((uint64_t)n * size > PRESSED_HOLD_BYTES)
		n = PRESSED_HOLD_BYTES / size;
	return n < 1 ? 1 : n;
}

/* Blocks of class cls we may hold at once (claimed or kept): 64 KiB worth,
 * at least 1, at most 64 - enough for a rotation of small blocks resting
 * 200 us each between a writer's updates; 2 while a survey finds it scarce.
 * While the class is pressed (hkv_class_pressed), what the writer refills
 * ahead rests here: its reserve - at first 16 KiB worth, less in a small
 * cache (1/4096 of the region: what each writer keeps out of every class
 * is room the items lack), at least 4 (refilled at 2: fewer made a
 * mixed-size cache's sets cost over a round trip more); grown while its
 * writes still wait (a class written faster than its reserve rests:
 * update_reserve), up to pressed_max(). */
uint32_t hkv_alloc_hold_cap(const struct hkv_client *c, uint32_t cls)
{
	const struct hkv_class_alloc *ca = &c->classes[cls];
	uint32_t n = HOLD_BYTES / c->g.class_size[cls];

	if (hkv_class_pressed(ca, hkv_coarse_ns())) {
		uint64_t bytes = (uint64_t)c->g.nsegs * c->g.seg_size / 4096;
		uint32_t max = n;

		n = (uint32_t)((bytes < CLAIM_BYTES ? bytes : CLAIM_BYTES) / c->g.class_size[cls]);
		n = ca->reserve > n ? ca->reserve : n;
		n = n > max ? max : n;
		n = n < 4 ? 4 : n;
		n = n > pressed_max(c, cls) ? pressed_max(c, cls) : n;
	} else if (ca->scarce) { /* memory is short: take little out of the pool */
		n = n < 2 ? n : 2;
	}
	return n < 1 ? 1 : n > 64 ? 64 : n;
}

/* A write took a held block of class cls; `waited`: the class was pressed
 * and no block it held had rested. The reserve doubles on a wait and
 * halves after a second without one; what the reserves of all classes
 * grew by stays within 1/1024 of the region (one busy class grows, a
 * mixed-size cache's many classes would lose items to them). */
static void decay_reserve(struct hkv_client *c, uint32_t cls, uint64_t now)
{
	struct hkv_class_alloc *ca = &c->classes[cls];

	if (ca->reserve && now - ca->reserve_ns > 1000000000ull) {
		c->reserve_bytes -= (uint64_t)(ca->reserve - ca->reserve / 2) * c->g.class_size[cls];
		ca->reserve /= 2;
		ca->reserve_ns = now;
	}
}

static void update_reserve(struct hkv_client *c, uint32_t cls, uint64_t now, int waited)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint64_t budget = (uint64_t)c->g.nsegs * c->g.seg_size / 1024, size = c->g.class_size[cls];
	uint32_t max = pressed_max(c, cls), from, to;

	if (!waited) {
		decay_reserve(c, cls, now);
		return;
	}
	ca->reserve_ns = now;
	from = hkv_alloc_hold_cap(c, cls);
	to = 2 * from < max ? 2 * from : max;
	if (ca->reserve < from) { /* (growth counts from the cap it had) */
		c->reserve_bytes += (from - ca->reserve) * size;
		ca->reserve = from;
	}
	if (to > ca->reserve && c->reserve_bytes + (to - ca->reserve) * size <= budget) {
		c->reserve_bytes += (to - ca->reserve) * size;
		ca->reserve = to;
	}
}

/*
 * How many blocks one claim takes: CLAIM_START after a pause, doubling with
 * every claim that follows the last one of the class within CLAIM_RAMP_NS
 * (a busy writer), up to CLAIM_BYTES' worth (at most CLAIM_MAX); one once
 * a survey saw the class scarce. So a writer that stops holds little, and a
 * busy one pays a claim's round trip per up to 16 writes. A store with no
 * segment left to carve starts at one after a pause: what many occasional
 * writers hold at once is what a full store's last writes cannot have.
 */
static uint32_t claim_batch(struct hkv_client *c, uint32_t cls, uint64_t now)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint32_t max = CLAIM_BYTES / c->g.class_size[cls];

	if (max > CLAIM_MAX)
		max = CLAIM_MAX;
	if (ca->scarce || max < 1)
		ca->batch = 1;
	else if (now - ca->last_claim_ns > CLAIM_RAMP_NS)
		ca->batch = !(c->g.flags & HKV_GEOM_F_CACHE) && !c->table_free ? 1
			    : max < CLAIM_START ? max : CLAIM_START;
	else if (ca->batch < max)
		ca->batch = 2 * ca->batch < max ? 2 * ca->batch : max;
	ca->last_claim_ns = now;
	return ca->batch ? ca->batch : 1;
}

/* Give back held block h (only within the hold: see the top): its stamp is
 * cleared first (the same QP runs the FAA after the WRITE), so a free block
 * never carries a HELD stamp and an unchanged stamp means one unbroken hold.
 * (The zero comes from atom[59]: atom[48..56) are the claims' stamps, whose
 * unsignaled WRITEs may not have read them yet.) */
static void give_back(struct hkv_client *c, uint32_t cls, const struct hkv_held *h)
{
	struct hkv_wr wr[2];

	freed_stamp(c, h->off, cls, wr);
	if (hkv_test_hook)
		hkv_test_hook(c, HKV_TP_GIVE_BACK);
	(void)hkv_conn_post(c->conn, wr, 2);
	c->stats.blocks_given_back++;
}

/*
 * When a freed block we claimed may be written: HKV_QUARANTINE_NS after the
 * claim completed (t_done: after its free executed, so after the slot
 * stopped naming the incarnation it retired). If we freed it ourselves at
 * this very generation - retired by us, nobody wrote it since - our note of
 * the time, read after our mark and swing completed, is after that too and
 * bounds the same rest: consecutive incarnations stay >= HKV_QUARANTINE_NS
 * apart after their views could be taken (the ABA horizon, docs/design.md;
 * a kept block rests from the same moment, hkv_free_or_keep). Only a note
 * younger than a second counts (a generation cannot come round in that
 * time). A set into a full cache claims back what its own eviction freed
 * a moment before: without the note each waited 200 us.
 */
static uint64_t rest_from(struct hkv_client *c, uint64_t off, uint64_t meta, uint64_t t_done)
{
	struct hkv_freed *f = &c->freed[off / HKV_BLOCK_ALIGN % HKV_FREED_SLOTS];
	uint64_t full = t_done + HKV_QUARANTINE_NS;

	if (f->off != off || f->gen != hkv_meta_gen(meta) ||
	    hkv_meta_state(meta) != HKV_BLK_OBSOLETE || hkv_meta_retired_by(meta) != c->client_id ||
	    t_done - f->ns > 1000000000ull)
		return full;
	f->off = 0;
	return f->ns + HKV_QUARANTINE_NS < full ? f->ns + HKV_QUARANTINE_NS : full;
}

/* An unsignaled WRITE of *src over our claim-intent record (layout.h). */
static struct hkv_wr intent_write(struct hkv_client *c, uint64_t *src)
{
	struct hkv_wr wr = hkv_wr_write(c, src, hkv_intent_rec(&c->g, c->client_id), 8);

	wr.flags = HKV_WR_F_NO_COMPLETION;
	return wr;
}

/*
 * Post wrs[0..n) (a claim's stamps, or nothing) and then a WRITE of 0 over
 * our intent record: RC lands it after them, so once the record no longer
 * names the word, every block we took from it is stamped. A post that fails
 * breaks the connection: the server fences us, so nothing of this claim
 * lands later, and the sweep may take its blocks back.
 */
static void intent_clear(struct hkv_client *c, struct hkv_wr *wrs, int n)
{
	if (c->g.nintents) {
		c->atom[25] = 0;
		wrs[n++] = intent_write(c, &c->atom[25]);
	}
	if (n && hkv_conn_post(c->conn, wrs, n) && !c->conn->error)
		c->conn->error = HKV_ETRANSPORT;
}

/*
 * Give back the blocks a won claim took from a segment that is no longer
 * SHARED in class cls: the server is moving it (DRAINING), or carved it for
 * another class since our survey (the word had come back to what we saw).
 * In the class its entry names now, a free block gets our freed stamp first,
 * as a free does (so that none comes back to a free bit under the stamp it
 * had when the claim took it: server/slab.c, reclaim_unstamped) - read
 * there first if that is not the class we read - then the bits' FAA, then
 * our intent record emptied. In a FREE segment or under a garbage entry,
 * the FAA alone (a carve sets every bit anyway). 0 or <0.
 */
static int give_back_claim(struct hkv_client *c, uint32_t seg, uint32_t word, uint64_t mask,
			   uint32_t cls, const uint32_t *blks, uint32_t nblk, struct hkv_wr *wrs)
{
	uint64_t e = c->atom[61];
	uint32_t ec = hkv_seg_class(e), n = 0;
	int stamped = (hkv_seg_state(e) == HKV_SEG_SHARED || hkv_seg_state(e) == HKV_SEG_DRAINING) &&
		      ec < c->g.nclasses;
	uint32_t esize = stamped ? c->g.class_size[ec] : 0, enb = stamped ? seg_blocks(c, ec) : 0;
	int ret;

	if (stamped && ec != cls) { /* (what we read is at the other class's offsets) */
		for (uint32_t i = 0; i < nblk; i++)
			if (blks[i] < enb) /* (stray bits past its last block: no block) */
				wrs[n++] = hkv_wr_read(c, c->scr + (size_t)i * 32,
						       seg_base(c, seg) + (uint64_t)blks[i] * esize,
						       24);
		if (n && (ret = hkv_exec(c, wrs, (int)n)))
			return ret;
		n = 0;
	}
	if (stamped) {
		c->atom[59] = hkv_freed_stamp(c->client_id, ++c->free_seq);
		for (uint32_t i = 0; i < nblk; i++) {
			uint64_t meta;

			memcpy(&meta, c->scr + (size_t)i * 32, 8);
			if (blks[i] >= enb ||
			    (hkv_meta_state(meta) != HKV_BLK_UNUSED &&
			     hkv_meta_state(meta) != HKV_BLK_OBSOLETE) ||
			    hkv_meta_class(meta) != ec)
				continue; /* (garbage: its bit back, its bytes as they are) */
			wrs[n] = hkv_wr_write(c, &c->atom[59],
					      seg_base(c, seg) + (uint64_t)blks[i] * esize + 16, 8);
			wrs[n++].flags = HKV_WR_F_NO_COMPLETION;
		}
	}
	wrs[n] = hkv_wr_faa(c, &c->atom[62], bitmap_word(c, seg, word), mask);
	wrs[n++].flags = HKV_WR_F_NO_COMPLETION;
	intent_clear(c, wrs, (int)n);
	return 0;
}

/*
 * One claim from the class's last hint. 1: blocks are held now; 0: the
 * hint was stale (try again); <0: error.
 */
static int claim(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	struct hkv_hint *h = &ca->hints[ca->nhints - 1];
	uint32_t nb = seg_blocks(c, cls), csize = c->g.class_size[cls];
	uint32_t want = claim_batch(c, cls, hkv_now_ns()), nblk = 0, blks[CLAIM_MAX];
	uint64_t bits = h->bits & word_mask(nb, h->word), mask = 0, t_post, t_done;
	uint64_t *stamp = &c->atom[48 + (c->hold_seq & 7)];
	struct hkv_wr wrs[3 + CLAIM_MAX];
	struct hkv_held hbs[CLAIM_MAX];
	int ret, got = 0, pre = 0;

	if (h->seg >= c->g.nsegs || h->word * 64 >= nb || !bits) {
		ca->nhints--;
		return 0;
	}
	/* free bits from a random place on, so that writers on one word collide less */
	{
		uint32_t start = (uint32_t)(hkv_rand(c) % 64);
		uint64_t rot = start ? bits >> start | bits << (64 - start) : bits;

		for (; rot && nblk < want; rot &= rot - 1) {
			uint32_t x = ((uint32_t)__builtin_ctzll(rot) + start) % 64;

			mask |= 1ull << x;
			blks[nblk++] = h->word * 64 + x;
		}
	}
	/* [WRITE our intent record, CAS, READ the entry, READ the headers]: the
	 * record names the word before the CAS can win (layout.h) */
	if (c->g.nintents) {
		c->atom[24] = bitmap_word(c, h->seg, h->word);
		wrs[pre++] = intent_write(c, &c->atom[24]);
	}
	wrs[pre] = hkv_wr_cas(c, &c->atom[60], bitmap_word(c, h->seg, h->word), h->bits,
			      h->bits & ~mask);
	wrs[pre + 1] = hkv_wr_read(c, &c->atom[61], c->g.seg_table_off + (uint64_t)h->seg * 8, 8);
	for (uint32_t i = 0; i < nblk; i++)
		wrs[pre + 2 + i] = hkv_wr_read(c, c->scr + (size_t)i * 32,
					       seg_base(c, h->seg) + (uint64_t)blks[i] * csize, 24);
	t_post = hkv_now_ns();
	ret = hkv_exec(c, wrs, pre + 2 + (int)nblk);
	if (ret)
		return ret;
	t_done = hkv_now_ns();
	if (c->atom[60] != h->bits) { /* lost: go on from the word as it is */
		h->bits = c->atom[60];
		c->stats.claims_lost++;
		if (!(h->bits & word_mask(nb, h->word)))
			ca->nhints--;
		intent_clear(c, wrs, 0);
		return 0;
	}
	h->bits &= ~mask;
	if (hkv_seg_state(c->atom[61]) != HKV_SEG_SHARED || hkv_seg_class(c->atom[61]) != cls) {
		/* the server is moving the segment, or carved it for another
		 * class since our survey: give the blocks back, forget its hints */
		ret = give_back_claim(c, h->seg, h->word, mask, cls, blks, nblk, wrs);
		for (uint32_t i = 0; i < ca->nhints;)
			if (ca->hints[i].seg == h->seg)
				ca->hints[i] = ca->hints[--ca->nhints];
			else
				i++;
		c->table_ns = 0;
		return ret;
	}
	c->hold_seq++;
	*stamp = hkv_held_make(c->client_id, c->hold_seq);
	for (uint32_t i = 0; i < nblk; i++) {
		uint64_t meta, off;
		enum hkv_block_state st;

		memcpy(&meta, c->scr + (size_t)i * 32, 8);
		st = hkv_meta_state(meta);
		if ((st != HKV_BLK_UNUSED && st != HKV_BLK_OBSOLETE) || hkv_meta_class(meta) != cls) {
			/* a free bit on a block that is not free: garbage; leave it be */
			c->stats.corrupt_reads++;
			hkv_warn("client %u: free bit of a block that is not free (segment %u block "
				 "%u, meta 0x%llx); not used", c->client_id, h->seg, blks[i],
				 (unsigned long long)meta);
			continue;
		}
		off = seg_base(c, h->seg) + (uint64_t)blks[i] * csize;
		hbs[got] = (struct hkv_held){.off = off, .gen = hkv_meta_gen(meta), .stamp = *stamp,
					     .claim_ns = t_post,
					     .ready_ns = st == HKV_BLK_UNUSED
								 ? 0
								 : rest_from(c, off, meta, t_done)};
		wrs[got] = hkv_wr_write(c, stamp, off + 16, 8);
		wrs[got].flags = HKV_WR_F_NO_COMPLETION;
		got++;
	}
	if (hkv_test_hook)
		hkv_test_hook(c, HKV_TP_CLAIM_STAMP);
	/* the stamps, then our intent record emptied (RC: after the stamps) -
	 * posted whatever follows: an unstamped block we held could be taken
	 * back while we write it (a failed post breaks the connection, which
	 * fences us) */
	intent_clear(c, wrs, got);
	for (int i = 0; i < got; i++)
		if (push_held(ca, &hbs[i]))
			return -ENOMEM; /* (stamped ours: back when we disconnect) */
	if (!(h->bits & word_mask(nb, h->word)))
		ca->nhints--;
	c->stats.claims++;
	c->stats.blocks_claimed += (uint64_t)got;
	return got > 0;
}

/* Refill ahead (cache mode, client/write.c): claims from the class's hints
 * while it has some, up to 4 chains, until one brings blocks. 1 if it did,
 * 0 if not (no hints, or every claim lost), <0 on error. */
int hkv_alloc_refill(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];

	for (int i = 0; i < 4 && ca->nhints; i++) {
		int ret = claim(c, cls);

		if (ret)
			return ret;
	}
	return 0;
}

/*
 * The held blocks of class cls that waited HOLD_USE_NS go back (give_back),
 * or with `all` every one of them: claimed (stamped) or kept, at any age -
 * the server takes back only a fenced holder's blocks, so nothing can have
 * set their bits meanwhile.
 */
static void drop_class(struct hkv_client *c, uint32_t cls, uint64_t now, int all)
{
	struct hkv_class_alloc *ca = &c->classes[cls];

	while (ca->head < ca->n && (all || now - ca->held[ca->head].claim_ns >= HOLD_USE_NS))
		give_back(c, cls, &ca->held[ca->head++]);
	if (ca->head == ca->n)
		ca->head = ca->n = 0;
}

/* Every 50 ms (from every operation's end, and allocation): held blocks of
 * every class that have waited long go, and the reserve of a class no
 * longer written halves each second (else it kept the growth budget from
 * the classes written now). */
static void tidy(struct hkv_client *c, uint64_t now)
{
	if (now - c->tidy_ns < 50ull * 1000000ull)
		return;
	c->tidy_ns = now;
	for (uint32_t cls = 0; cls < c->g.nclasses; cls++) {
		drop_class(c, cls, now, 0);
		decay_reserve(c, cls, now);
	}
}

/* From every operation's end: the coarse clock says whether a pass is due
 * (a fine clock read costs ~25 ns on x86-64, ~1 us in the TCG guest whose
 * clock source is an emulated HPET; most operations need none), the fine
 * one times the holds. */
void hkv_alloc_tidy(struct hkv_client *c)
{
	uint64_t coarse;

	if (!c->classes || c->readonly || c->conn->error)
		return;
	coarse = hkv_coarse_ns();
	if (coarse - c->tidy_coarse_ns < 50ull * 1000000ull)
		return;
	c->tidy_coarse_ns = coarse;
	tidy(c, hkv_now_ns());
}

int hkv_alloc_block(struct hkv_client *c, uint32_t cls, uint64_t *off, uint32_t *gen)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	int ret;

	for (int tries = 0; tries < 64; tries++) {
		uint64_t now = hkv_now_ns();

		tidy(c, now);
		drop_class(c, cls, now, 0); /* expired holds first */
		/* the first held block that has rested; if none has, and we hold
		 * less than hold_cap, claim more (a never-used block needs no
		 * rest) rather than wait; else wait for the first (<= 200 us) */
		{
			uint32_t pick = ca->n, first = ca->n;
			int pressed = hkv_class_pressed(ca, hkv_coarse_ns());

			for (uint32_t i = ca->head; i < ca->n; i++) {
				if (now - ca->held[i].claim_ns >= HOLD_USE_NS)
					continue;
				if (first == ca->n || ca->held[i].ready_ns < ca->held[first].ready_ns)
					first = i;
				if (ca->held[i].ready_ns <= now) {
					pick = i;
					break;
				}
			}
			/* (pressed: what is held is what we refilled ahead, resting;
			 * a claim would only bring blocks that rest as long) */
			if (pick == ca->n && first != ca->n &&
			    (ca->n - ca->head >= hkv_alloc_hold_cap(c, cls) || tries || pressed)) {
				while (hkv_now_ns() < ca->held[first].ready_ns)
					;
				pick = first;
			}
			if (pick != ca->n)
				update_reserve(c, cls, now, pressed && ca->held[pick].ready_ns > now);
			if (pick != ca->n) {
				struct hkv_held hb = ca->held[pick];

				ca->held[pick] = ca->held[ca->head++];
				if (ca->head == ca->n)
					ca->head = ca->n = 0;
				*off = hb.off;
				*gen = hb.gen + 1 ? hb.gen + 1 : 1;
				c->cur = (struct hkv_cur_alloc){hb.off, hb.claim_ns, cls, hb.gen, 0,
								hb.stamp};
				return 0;
			}
		}
		/* down to the last hint: look at the whole class again now and
		 * then, for blocks freed elsewhere since */
		if (ca->nhints == 1 && now - ca->survey_ns > SURVEY_EVERY_NS) {
			ret = survey(c, cls);
			if (ret < 0)
				return ret;
		}
		if (!ca->nhints) {
			/* nothing free a moment ago: frees may land any time, but do not
			 * survey more than every 200 us for nothing */
			if (ca->empty_survey_ns && now - ca->empty_survey_ns < HKV_QUARANTINE_NS &&
			    tries)
				return HKV_EFULL;
			ret = survey(c, cls);
			if (ret < 0)
				return ret;
			if (!ret)
				return HKV_EFULL;
		}
		ret = claim(c, cls);
		if (ret < 0)
			return ret;
	}
	return HKV_EFULL;
}

int hkv_alloc_write_ok(struct hkv_client *c, uint64_t off)
{
	if (c->cur.off != off || c->cur.written)
		return 0;
	c->cur.written = 1; /* (ours at any age: the server takes back only a fenced holder's) */
	return 0;
}

/*
 * Never published: held again. If a chain wrote it, it is stamped again
 * (meta OBSOLETE with the generation we claimed it at, HELD(id, new seq)),
 * which starts a new hold; else its claim's stamp and hold still stand.
 */
void hkv_unalloc_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	struct hkv_held hb = {.off = off, .stamp = c->cur.stamp, .claim_ns = hkv_now_ns()};

	if (cls >= c->g.nclasses || c->cur.off != off)
		return; /* not the block we allocated last: leave it to the server */
	hb.gen = c->cur.gen;
	if (c->cur.written) {
		uint64_t *hdr = &c->atom[56]; /* 24 bytes: meta, sum|vlen, stamp */
		struct hkv_wr wr;

		/* (gen + 1 was written: the meta says so, and the next write is + 2) */
		hb.gen = c->cur.gen + 1 ? c->cur.gen + 1 : 1;
		c->hold_seq++;
		hdr[0] = hkv_meta_make(HKV_BLK_OBSOLETE, cls, hb.gen);
		hdr[1] = 0;
		hdr[2] = hkv_held_make(c->client_id, c->hold_seq);
		hb.stamp = hdr[2];
		wr = hkv_wr_write(c, hdr, off, 24);
		if (hkv_exec(c, &wr, 1)) /* (the next one overwrites these words) */
			return;
	} else {
		hb.claim_ns = c->cur.claim_ns;
	}
	c->cur.off = 0;
	push_held(&c->classes[cls], &hb);
}

void hkv_free_retired(struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t gen)
{
	c->freed[off / HKV_BLOCK_ALIGN % HKV_FREED_SLOTS] =
		(struct hkv_freed){.off = off, .ns = hkv_now_ns(), .gen = gen};
	hkv_free_block(c, off, cls);
}

void hkv_free_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg, blk;
	struct hkv_wr wr[2];

	if (cls >= c->g.nclasses || !hkv_block_range_ok(&c->g, off, c->g.class_size[cls]))
		return; /* not a block we could have validated: never touch it */
	block_pos(c, off, cls, &seg, &blk);
	freed_stamp(c, off, cls, wr);
	if (hkv_test_hook)
		hkv_test_hook(c, HKV_TP_FREE);
	/* the transport keeps room for it (signaling now and then); if the
	 * connection failed, the free is lost with it (docs/design.md, Known gaps) */
	(void)hkv_conn_post(c->conn, wr, 2);
	c->stats.blocks_freed++;
	note_free(c, cls, seg, blk);
}

/*
 * A block whose mark CAS we won (LIVE gen -> OBSOLETE gen: out of the
 * index, and nobody else will free it) is ours already: keep it for our
 * next write of the class, as a claim would (resting, held under the same
 * time bounds), up to hold_cap() per class; else free it. Updates and
 * evictions then reuse blocks without a claim's round trip. It is not
 * stamped (its bytes stay as they were until it is written: an undo may
 * still copy them), so if we die holding it, it is lost until a warm
 * restart, like a free won and not yet posted.
 */
void hkv_free_or_keep(struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t gen)
{
	struct hkv_class_alloc *ca;
	uint32_t max;
	uint64_t now = hkv_now_ns();
	struct hkv_held hb;

	if (cls >= c->g.nclasses || !hkv_block_range_ok(&c->g, off, c->g.class_size[cls]) ||
	    (off - c->g.data_off) % c->g.seg_size % c->g.class_size[cls])
		return; /* not a block we could have validated: never touch it */
	ca = &c->classes[cls];
	max = hkv_alloc_hold_cap(c, cls);
	if (c->table_ns) {
		/* its segment being moved (as the table last read says): a block
		 * kept there would only be evicted again, or hold up the move */
		uint32_t seg, blk;

		block_pos(c, off, cls, &seg, &blk);
		if (hkv_seg_state(c->table[seg]) != HKV_SEG_SHARED ||
		    hkv_seg_class(c->table[seg]) != cls)
			max = 0;
	}
	if (ca->n - ca->head >= max) {
		hkv_free_retired(c, off, cls, gen); /* (ours: its rest counts from now) */
		return;
	}
	hb = (struct hkv_held){.off = off, .gen = gen, .claim_ns = now,
			       .ready_ns = now + HKV_QUARANTINE_NS};
	if (push_held(ca, &hb)) {
		hkv_free_retired(c, off, cls, gen); /* (ours: its rest counts from now) */
		return;
	}
	c->stats.blocks_freed++;
	c->stats.blocks_kept++;
}

/* At close: every block we hold and may still give back goes back. */
void hkv_alloc_release(struct hkv_client *c)
{
	uint64_t now = hkv_now_ns();
	struct hkv_wr wr;

	for (uint32_t cls = 0; cls < c->g.nclasses; cls++)
		drop_class(c, cls, now, 1);
	wr = hkv_wr_read(c, c->atom, c->g.seg_table_off, 8); /* drain: one signaled wait */
	hkv_exec(c, &wr, 1);
}

/*
 * No free block of class cls anywhere: ask the server for a segment of it
 * (control plane), or with `move` (a cache) for one emptied for it. After
 * a refusal, no plain carve for the class for 100 ms (a cache: 1 s), so a
 * full store stays quick to say so and a full cache evicts without asking.
 */
int hkv_alloc_carve(struct hkv_client *c, uint32_t cls, int move)
{
	uint64_t now = hkv_now_ns();
	uint32_t seg = 0;
	int ret;

	/* (a refused plain carve holds back plain ones; a move is a different
	 * question - empty a segment for us - held back only by its own
	 * refusal: a class that just lost its only segment must not wait) */
	if (now < (move ? c->classes[cls].no_move_until_ns : c->classes[cls].no_carve_until_ns))
		return HKV_EFULL;
	/* what we hold of other classes goes back first: a block of ours must
	 * not keep a segment from being wholly free */
	for (uint32_t k = 0; k < c->g.nclasses; k++)
		if (k != cls)
			drop_class(c, k, now, 1);
	if (hkv_test_hook)
		hkv_test_hook(c, HKV_TP_CARVE);
	ret = hkv_ctl_carve(c, cls, c->protect_off, move ? HKV_CARVE_F_MOVE : 0, &seg);
	c->stats.carves++;
	if (ret == HKV_EAUTH) {
		/* the server no longer knows our id: it fenced or dropped this
		 * connection since the operation began (revive looked then). Say
		 * so if the data path agrees - the next operation connects again -
		 * not "authentication refused" */
		struct hkv_wr wr = hkv_wr_read(c, c->atom, c->g.seg_table_off, 8);

		if (hkv_exec(c, &wr, 1))
			return HKV_EDISCONNECTED;
	}
	if (ret == -EINPROGRESS || ret == HKV_ETIMEDOUT)
		ret = HKV_EAGAIN; /* a segment move that would not finish: try later */
	if (ret == HKV_EFULL && move) /* (nothing to empty: rare) */
		c->classes[cls].no_move_until_ns = hkv_now_ns() + 100ull * 1000000ull;
	else if (ret == HKV_EFULL) /* (a full cache evicts meanwhile) */
		c->classes[cls].no_carve_until_ns =
			hkv_now_ns() + (c->g.flags & HKV_GEOM_F_CACHE ? 1000ull : 100ull) * 1000000ull;
	if (ret)
		return ret;
	c->table_ns = 0;
	c->classes[cls].nhints = 0;
	c->classes[cls].empty_survey_ns = 0;
	return 0;
}
