/*
 * alloc.c - block allocation without the server's CPU.
 *
 * Memory is split into segments (geometry.seg_size); a client takes whole
 * segments by CAS on the segment table (FREE -> OWNED, or ORPHAN -> OWNED
 * when adopting the segments of a client that disconnected) and carves
 * each into blocks of one size class. Only the owner allocates from a
 * segment, so it alone chooses - and remembers - every block's generation.
 *
 * Freeing: whoever unlinks a block from the index (the winner of the slot
 * CAS) sets the block's bit in its segment's free bitmap with a FAA - one
 * unsignaled work request appended to that client's next write chain. The
 * owner harvests its bitmaps when it runs short (READ the words, FAA to clear
 * exactly the bits it saw) and puts the blocks in a FIFO where each rests
 * HKV_QUARANTINE_NS before reuse (docs/design.md: the ABA argument).
 *
 * A client that dies loses only blocks it had harvested but not yet used
 * and blocks it was writing; its segments are orphaned by the server when
 * its connection goes, and the next client short of memory adopts them.
 */
#include <errno.h>
#include <string.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

#define CHAIN_MAX 128

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
	c->owned = hkv_calloc(c->g.nsegs, sizeof(*c->owned));
	c->classes = hkv_calloc(c->g.nclasses, sizeof(*c->classes));
	return c->owned && c->classes ? 0 : -ENOMEM;
}

void hkv_alloc_fini(struct hkv_client *c)
{
	if (c->classes) {
		for (uint32_t i = 0; i < c->g.nclasses; i++) {
			struct hkv_seg_own *so = c->classes[i].segs;

			while (so) {
				struct hkv_seg_own *next = so->next;

				hkv_free(so->gen);
				hkv_free(so);
				so = next;
			}
			hkv_free(c->classes[i].fifo);
		}
	}
	hkv_free(c->classes);
	hkv_free(c->owned);
	c->classes = NULL;
	c->owned = NULL;
}

static uint64_t seg_base(const struct hkv_client *c, uint32_t seg)
{
	return c->g.data_off + (uint64_t)seg * c->g.seg_size;
}

static uint64_t bitmap_word(const struct hkv_client *c, uint32_t seg, uint32_t blk)
{
	return c->g.bitmap_off + (uint64_t)seg * c->g.bitmap_bytes + (uint64_t)(blk / 64) * 8;
}

static int fifo_push(struct hkv_class_alloc *ca, uint32_t seg, uint32_t blk, uint64_t ready)
{
	if (ca->tail - ca->head == ca->cap) {
		uint32_t ncap = ca->cap ? 2 * ca->cap : 64;
		struct hkv_free_block *n = hkv_malloc(ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		for (uint32_t i = 0; i < ca->cap; i++)
			n[i] = ca->fifo[(ca->head + i) & (ca->cap - 1)];
		hkv_free(ca->fifo);
		ca->fifo = n;
		ca->tail = ca->cap;
		ca->head = 0;
		ca->cap = ncap;
	}
	ca->fifo[ca->tail++ & (ca->cap - 1)] = (struct hkv_free_block){seg, blk, ready};
	return 0;
}

static struct hkv_seg_own *seg_own_new(struct hkv_client *c, uint32_t idx, uint32_t cls)
{
	struct hkv_seg_own *so = hkv_calloc(1, sizeof(*so));

	if (!so)
		return NULL;
	so->idx = idx;
	so->cls = cls;
	so->nblocks = c->g.seg_size / c->g.class_size[cls];
	so->gen = hkv_calloc(so->nblocks, sizeof(*so->gen));
	if (!so->gen) {
		hkv_free(so);
		return NULL;
	}
	so->next = c->classes[cls].segs;
	c->classes[cls].segs = so;
	c->owned[idx] = so;
	return so;
}

/* Read the words of `nblocks` bits of a segment's bitmap into dst (1 RT). */
static int read_bitmap(struct hkv_client *c, uint32_t seg, uint32_t nblocks, uint64_t *dst)
{
	struct hkv_wr wr = hkv_wr_read(c, dst, bitmap_word(c, seg, 0), (nblocks + 63) / 64 * 8);

	return hkv_exec(c, &wr, 1);
}

/* Clear exactly the bits seen (FAA of minus the word); others may set more. */
static int clear_bits(struct hkv_client *c, uint32_t seg, const uint64_t *words, uint32_t nwords)
{
	struct hkv_wr wrs[CHAIN_MAX];
	int n = 0, ret = 0;

	for (uint32_t w = 0; w < nwords && !ret; w++) {
		if (!words[w])
			continue;
		wrs[n++] = hkv_wr_faa(c, &c->atom[63], bitmap_word(c, seg, w * 64), -words[w]);
		if (n == CHAIN_MAX) {
			ret = hkv_exec(c, wrs, n);
			n = 0;
		}
	}
	return ret || !n ? ret : hkv_exec(c, wrs, n);
}

/* Collect blocks others (or we) freed in our segments of class cls. */
static int harvest(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint64_t *words = (uint64_t *)c->scr, ready = hkv_now_ns() + HKV_QUARANTINE_NS;
	int got = 0, ret;

	ca->last_harvest_ns = hkv_now_ns();
	for (struct hkv_seg_own *so = ca->segs; so; so = so->next) {
		uint32_t nwords = (so->nblocks + 63) / 64;

		ret = read_bitmap(c, so->idx, so->nblocks, words);
		if (ret)
			return ret;
		for (uint32_t w = 0; w < nwords; w++) {
			if (w == nwords - 1 && so->nblocks % 64)
				words[w] &= (1ull << (so->nblocks % 64)) - 1; /* garbage guard */
			for (uint64_t bits = words[w]; bits; bits &= bits - 1) {
				if (fifo_push(ca, so->idx, w * 64 + (uint32_t)__builtin_ctzll(bits), ready))
					return -ENOMEM;
				got++;
			}
		}
		ret = clear_bits(c, so->idx, words, nwords);
		if (ret)
			return ret;
	}
	c->stats.blocks_harvested += (uint64_t)got;
	return got;
}

/*
 * Adopt an orphaned segment: its free blocks are the bits in its bitmap
 * plus the blocks never written (meta 0); the generations of all blocks are
 * read from their headers so ours continue theirs.
 */
static int adopt(struct hkv_client *c, struct hkv_seg_own *so)
{
	struct hkv_class_alloc *ca = &c->classes[so->cls];
	uint32_t csize = c->g.class_size[so->cls], nwords = (so->nblocks + 63) / 64;
	uint64_t *words = (uint64_t *)c->scr, ready = hkv_now_ns() + HKV_QUARANTINE_NS;
	uint32_t per_chunk = (uint32_t)(c->read_cap / csize);
	int ret = read_bitmap(c, so->idx, so->nblocks, words);

	for (uint32_t first = 0; !ret && first < so->nblocks; first += per_chunk) {
		uint32_t cnt = so->nblocks - first < per_chunk ? so->nblocks - first : per_chunk;
		struct hkv_wr wr = hkv_wr_read(c, c->rblk, seg_base(c, so->idx) + (uint64_t)first * csize,
					       cnt * csize);

		ret = hkv_exec(c, &wr, 1);
		for (uint32_t i = 0; !ret && i < cnt; i++) {
			uint64_t meta;
			uint32_t b = first + i;

			memcpy(&meta, c->rblk + (size_t)i * csize, 8);
			so->gen[b] = hkv_meta_gen(meta);
			if (hkv_meta_state(meta) == HKV_BLK_UNUSED && !(words[b / 64] >> (b % 64) & 1) &&
			    fifo_push(ca, so->idx, b, ready))
				ret = -ENOMEM;
		}
	}
	for (uint32_t w = 0; !ret && w < nwords; w++) {
		if (w == nwords - 1 && so->nblocks % 64)
			words[w] &= (1ull << (so->nblocks % 64)) - 1;
		for (uint64_t bits = words[w]; bits && !ret; bits &= bits - 1)
			ret = fifo_push(ca, so->idx, w * 64 + (uint32_t)__builtin_ctzll(bits), ready);
	}
	if (!ret)
		ret = clear_bits(c, so->idx, words, nwords);
	so->carved = so->nblocks;
	c->stats.segments_adopted++;
	hkv_debug("client %u: adopted segment %u (class %u)", c->client_id, so->idx, so->cls);
	return ret;
}

/* Take a FREE segment (or adopt an ORPHAN one of class cls) by CAS. */
static int claim_segment(struct hkv_client *c, uint32_t cls)
{
	uint64_t *table = (uint64_t *)c->scr;
	uint32_t n = c->g.nsegs, start;
	struct hkv_wr wr;
	int ret;

	for (int round = 0; round < 4; round++) {
		wr = hkv_wr_read(c, table, c->g.seg_table_off, n * 8);
		ret = hkv_exec(c, &wr, 1);
		if (ret)
			return ret;
		start = (uint32_t)(hkv_rand(c) % n);
		for (int pass = 0; pass < 2; pass++) {
			enum hkv_seg_state want = pass ? HKV_SEG_ORPHAN : HKV_SEG_FREE;

			for (uint32_t k = 0; k < n; k++) {
				uint32_t i = (start + k) % n;
				uint64_t e = table[i], mine;
				struct hkv_seg_own *so;

				if (hkv_seg_state(e) != want || (pass && hkv_seg_class(e) != cls) ||
				    (pass && hkv_seg_class(e) >= c->g.nclasses))
					continue;
				mine = hkv_seg_make(HKV_SEG_OWNED, cls, c->client_id, hkv_seg_epoch(e) + 1);
				wr = hkv_wr_cas(c, &c->atom[0], c->g.seg_table_off + (uint64_t)i * 8, e, mine);
				ret = hkv_exec(c, &wr, 1);
				if (ret)
					return ret;
				if (c->atom[0] != e) {
					table[i] = c->atom[0];
					continue; /* somebody was faster */
				}
				so = seg_own_new(c, i, cls);
				if (!so)
					return -ENOMEM;
				if (pass)
					return adopt(c, so);
				c->stats.segments_claimed++;
				return 0;
			}
		}
		if (round == 0)
			break; /* nothing FREE or adoptable in a fresh read: full */
	}
	return HKV_EFULL;
}

static int take_ready(struct hkv_client *c, struct hkv_class_alloc *ca, uint64_t now,
		      uint64_t *off, uint32_t *gen)
{
	struct hkv_free_block fb;
	struct hkv_seg_own *so;

	if (ca->head == ca->tail || ca->fifo[ca->head & (ca->cap - 1)].ready_ns > now)
		return 0;
	fb = ca->fifo[ca->head++ & (ca->cap - 1)];
	so = c->owned[fb.seg];
	if (!so || fb.blk >= so->nblocks)
		return 0;
	*gen = ++so->gen[fb.blk] ? so->gen[fb.blk] : ++so->gen[fb.blk];
	*off = seg_base(c, fb.seg) + (uint64_t)fb.blk * c->g.class_size[so->cls];
	return 1;
}

/* Keep the next batch resting: harvest ahead once the ready supply runs low. */
#define HARVEST_AHEAD 32

int hkv_alloc_block(struct hkv_client *c, uint32_t cls, uint64_t *off, uint32_t *gen)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	int waited = 0, ret;

	for (;;) {
		uint64_t now = hkv_now_ns();
		struct hkv_seg_own *so = ca->segs;
		int harvest_due = ca->segs && now - ca->last_harvest_ns > HKV_QUARANTINE_NS;

		if (take_ready(c, ca, now, off, gen)) {
			if (harvest_due && ca->tail - ca->head < HARVEST_AHEAD)
				harvest(c, cls); /* errors show up on the next round trip */
			return 0;
		}
		if (so && so->carved < so->nblocks) {
			uint32_t b = so->carved++;

			*gen = ++so->gen[b];
			*off = seg_base(c, so->idx) + (uint64_t)b * c->g.class_size[cls];
			return 0;
		}
		if (harvest_due && ca->head == ca->tail) {
			ret = harvest(c, cls);
			if (ret < 0)
				return ret;
			if (ret > 0)
				continue;
		}
		/* Nothing ready: take more memory while freed blocks rest... */
		ret = claim_segment(c, cls);
		if (ret != HKV_EFULL) {
			if (ret)
				return ret;
			continue;
		}
		/* ...and when there is none, wait for them. */
		if (ca->head != ca->tail)
			continue;
		if (waited || !ca->segs)
			return HKV_EFULL;
		/* Full: frees may still be in flight from other clients; look once more. */
		waited = 1;
		ca->last_harvest_ns = 0;
		while (hkv_now_ns() - now < 2 * HKV_QUARANTINE_NS)
			;
	}
}

void hkv_unalloc_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg = (uint32_t)((off - c->g.data_off) / c->g.seg_size);
	uint32_t blk = (uint32_t)((off - c->g.data_off) % c->g.seg_size / c->g.class_size[cls]);

	fifo_push(&c->classes[cls], seg, blk, 0);
}

void hkv_free_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg, blk;

	if (cls >= c->g.nclasses || !hkv_block_range_ok(&c->g, off, c->g.class_size[cls]))
		return; /* not a block we could have validated: never touch it */
	seg = (uint32_t)((off - c->g.data_off) / c->g.seg_size);
	blk = (uint32_t)((off - c->g.data_off) % c->g.seg_size / c->g.class_size[cls]);
	if (c->npending == HKV_PENDING_FREES)
		hkv_flush_frees(c);
	if (c->npending == HKV_PENDING_FREES)
		return; /* connection failed: the block leaks, nothing is corrupted */
	c->pending[c->npending++] = (struct hkv_pending_free){bitmap_word(c, seg, blk),
							      1ull << (blk % 64)};
	c->stats.blocks_freed++;
}

int hkv_take_frees(struct hkv_client *c, struct hkv_wr *wrs, int max)
{
	int n = c->npending < max ? c->npending : max;

	for (int i = 0; i < n; i++) {
		struct hkv_pending_free *p = &c->pending[--c->npending];

		wrs[i] = hkv_wr_faa(c, &c->atom[63], p->word_addr, p->bit);
	}
	return n;
}

int hkv_flush_frees(struct hkv_client *c)
{
	struct hkv_wr wrs[HKV_PENDING_FREES];
	int n = hkv_take_frees(c, wrs, HKV_PENDING_FREES);

	return n ? hkv_exec(c, wrs, n) : 0;
}

/* At close: every free block we hold goes back into its bitmap. */
void hkv_alloc_release(struct hkv_client *c)
{
	for (uint32_t cls = 0; cls < c->g.nclasses; cls++) {
		struct hkv_class_alloc *ca = &c->classes[cls];

		while (ca->head != ca->tail) {
			struct hkv_free_block fb = ca->fifo[ca->head++ & (ca->cap - 1)];

			hkv_free_block(c, seg_base(c, fb.seg) + (uint64_t)fb.blk * c->g.class_size[cls],
				       cls);
		}
	}
	hkv_flush_frees(c);
}
