/*
 * alloc.c - block allocation without the server's CPU.
 *
 * Memory is split into segments (geometry.seg_size); a client takes whole
 * segments by CAS on the segment table (FREE -> OWNED, or ORPHAN -> OWNED
 * when adopting the segments of a client that disconnected) and carves
 * each into blocks of one size class. Only the owner allocates from a
 * segment, so it alone chooses - and remembers - every block's generation.
 *
 * Freeing: the writer that retired a block (its mark CAS took it LIVE ->
 * OBSOLETE; see hkv_publish_replace in publish.c) sets the block's bit in its segment's free
 * bitmap with a FAA, posted
 * unsignaled at once (no round trip). The owner harvests its bitmaps when it
 * runs short: bits it has not taken yet go to a FIFO where each block rests
 * HKV_QUARANTINE_NS (200 us) before reuse (docs/design.md: the ABA argument). A bit is
 * cleared only when its block is reused, by a FAA in the very chain that
 * writes the block, before the block is published. So the bitmap always
 * names every free block except those a client is writing this moment.
 *
 * Hence a dead client loses at most the block it was writing (and blocks
 * it wrote but never published, held for reuse): the server
 * orphans its segments when its connection goes, and the next client short
 * of memory adopts them: free = bit set or never written. An orphan whose
 * blocks are all free is re-carved into whatever class the adopter needs.
 *
 * Ownership is a lease: we allocate in a segment only within
 * HKV_SEG_LEASE_MS of posting the CAS that last renewed its entry (one
 * CAS per segment per HKV_SEG_RENEW_MS, and only while we allocate
 * there). A segment we stop allocating in goes IDLE by the server's tick,
 * and a client short of memory adopts it like an orphan (its unpublished
 * blocks stay: their writer lives). Taking it back, or finding it gone,
 * happens at our next renewal (hkv_alloc_hold).
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

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
	if (c->windows)
		c->wkeys = hkv_calloc(c->g.nsegs, sizeof(*c->wkeys));
	return c->owned && c->classes && (c->wkeys || !c->windows) ? 0 : -ENOMEM;
}

void hkv_alloc_fini(struct hkv_client *c)
{
	if (c->classes) {
		for (uint32_t i = 0; i < c->g.nclasses; i++) {
			struct hkv_seg_own *so = c->classes[i].segs;

			while (so) {
				struct hkv_seg_own *next = so->next;

				hkv_free(so->gen);
				hkv_free(so->held);
				hkv_free(so);
				so = next;
			}
			hkv_free(c->classes[i].fifo);
		}
	}
	hkv_free(c->classes);
	hkv_free(c->owned);
	hkv_free(c->wkeys);
	c->classes = NULL;
	c->owned = NULL;
	c->wkeys = NULL;
}

static uint64_t seg_base(const struct hkv_client *c, uint32_t seg)
{
	return c->g.data_off + (uint64_t)seg * c->g.seg_size;
}

static uint64_t bitmap_word(const struct hkv_client *c, uint32_t seg, uint32_t blk)
{
	return c->g.bitmap_off + (uint64_t)seg * c->g.bitmap_bytes + (uint64_t)(blk / 64) * 8;
}

static int fifo_push(struct hkv_class_alloc *ca, uint32_t seg, uint32_t blk, uint32_t bit_set,
		     uint64_t ready)
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
	ca->fifo[ca->tail++ & (ca->cap - 1)] = (struct hkv_free_block){seg, blk, bit_set, ready};
	return 0;
}

/*
 * With memory windows: WRITE rights to segment idx, which our CAS on its
 * table entry just made ours (the server checks the table says so). Asked
 * for before anything is written there.
 */
static int grant_write(struct hkv_client *c, uint32_t idx)
{
	return c->windows && !c->wkeys[idx] ? hkv_grant(c, idx, &c->wkeys[idx]) : 0;
}

static uint64_t table_off(const struct hkv_client *c, uint32_t idx)
{
	return c->g.seg_table_off + (uint64_t)idx * 8;
}

static void seg_own_free(struct hkv_seg_own *so)
{
	hkv_free(so->gen);
	hkv_free(so->held);
	hkv_free(so);
}

static void set_bit(struct hkv_client *c, uint32_t seg, uint32_t blk);

/*
 * Take so off its class's list (0, or -EINVAL if it was not on it) and its
 * blocks out of the class's FIFO. Blocks held with their bit already
 * cleared get it back when `give_back` (the segment is still ours), and are
 * dropped otherwise.
 */
static int seg_unlist(struct hkv_client *c, struct hkv_seg_own *so, int give_back)
{
	struct hkv_class_alloc *ca = &c->classes[so->cls];
	struct hkv_seg_own **pp = &ca->segs;
	uint32_t keep = ca->head;
	int found;

	while (*pp && *pp != so)
		pp = &(*pp)->next;
	found = *pp != NULL;
	if (found)
		*pp = so->next;
	so->next = NULL;
	for (uint32_t i = ca->head; i != ca->tail; i++) {
		struct hkv_free_block fb = ca->fifo[i & (ca->cap - 1)];

		if (fb.seg != so->idx)
			ca->fifo[keep++ & (ca->cap - 1)] = fb;
		else if (!fb.bit_set && give_back)
			set_bit(c, fb.seg, fb.blk);
	}
	ca->tail = keep;
	return found ? 0 : -EINVAL;
}

/*
 * Stop tracking so, a segment that is no longer ours (adopted while idle):
 * off its class's list and FIFO, and forgotten. Blocks in our FIFO whose
 * bits we had cleared stay so (a never-written one may be the adopter's by
 * now: setting its bit could free its live block); they leak, and only
 * blocks we un-allocated after a failed write are ever held that way.
 */
void hkv_alloc_forget(struct hkv_client *c, struct hkv_seg_own *so)
{
	seg_unlist(c, so, 0);
	if (c->owned[so->idx] == so)
		c->owned[so->idx] = NULL;
	if (c->wkeys)
		c->wkeys[so->idx] = 0;
	hkv_debug("client %u: segment %u (class %u) is no longer ours", c->client_id, so->idx,
		  so->cls);
	seg_own_free(so);
}

/*
 * May we allocate in so? Yes while the lease from our last renewal holds;
 * from HKV_SEG_RENEW_MS on, renew it first (one CAS, epoch + 1; an IDLE
 * entry still naming us is taken back the same way). 0: allocate; 1: the
 * segment is someone else's now (the caller forgets it); <0: error.
 */
int hkv_alloc_hold(struct hkv_client *c, struct hkv_seg_own *so)
{
	uint32_t me = c->client_id & 0xffff, was = hkv_seg_epoch(so->entry);

	for (int tries = 0; tries < 3; tries++) {
		uint64_t now = hkv_now_ns(), want = so->entry, next;
		struct hkv_wr wr;
		int ret;

		if (so->lease_ns && now - so->lease_ns < HKV_SEG_RENEW_MS * 1000000ull)
			return 0;
		next = hkv_seg_make(HKV_SEG_OWNED, so->cls, me, hkv_seg_epoch(want) + 1);
		wr = hkv_wr_cas(c, &c->atom[0], table_off(c, so->idx), want, next);
		ret = hkv_exec(c, &wr, 1);
		if (ret)
			return ret;
		if (c->atom[0] == want) {
			so->entry = next;
			so->lease_ns = now; /* posted after now: the lease runs from before */
			c->stats.segments_renewed++;
			/* back from IDLE, which someone took and gave back (the sweep's
			 * own bump is one epoch): that adopter's GRANT may have cost us
			 * our window: ask again (rare) */
			if (hkv_seg_state(want) == HKV_SEG_IDLE && hkv_seg_epoch(want) != was + 1 &&
			    c->wkeys) {
				c->wkeys[so->idx] = 0;
				if (grant_write(c, so->idx))
					break;
			}
			return 0;
		}
		want = c->atom[0];
		/* IDLE (the server saw us stop) or put back by the server's sweep:
		 * still naming us in our class, so nobody else allocated there */
		if ((hkv_seg_state(want) != HKV_SEG_IDLE && hkv_seg_state(want) != HKV_SEG_OWNED) ||
		    hkv_seg_owner(want) != me || hkv_seg_class(want) != so->cls)
			break;
		so->entry = want;
		so->lease_ns = 0;
	}
	c->stats.segments_lost++;
	return 1;
}

/* We own segment idx now (and may write it): track it. NULL on -ENOMEM.
 * entry: the table entry our CAS set, posted at lease_ns. */
static struct hkv_seg_own *seg_own_new(struct hkv_client *c, uint32_t idx, uint32_t cls,
				       uint64_t entry, uint64_t lease_ns, int *err)
{
	struct hkv_seg_own *so;

	if (c->owned[idx]) /* ours once, lost, and back: start from the table */
		hkv_alloc_forget(c, c->owned[idx]);
	*err = -ENOMEM;
	so = hkv_calloc(1, sizeof(*so));
	if (!so)
		return NULL;
	so->idx = idx;
	so->cls = cls;
	so->nblocks = c->g.seg_size / c->g.class_size[cls];
	so->gen = hkv_calloc(so->nblocks, sizeof(*so->gen));
	so->held = hkv_calloc((so->nblocks + 63) / 64, 8);
	if (!so->gen || !so->held) {
		hkv_free(so->gen);
		hkv_free(so->held);
		hkv_free(so);
		return NULL;
	}
	so->entry = entry;
	so->lease_ns = lease_ns;
	so->next = c->classes[cls].segs;
	c->classes[cls].segs = so;
	c->owned[idx] = so;
	*err = 0;
	return so;
}

/* Read the words of `nblocks` bits of a segment's bitmap into dst (1 RT). */
static int read_bitmap(struct hkv_client *c, uint32_t seg, uint32_t nblocks, uint64_t *dst)
{
	struct hkv_wr wr = hkv_wr_read(c, dst, bitmap_word(c, seg, 0), (nblocks + 63) / 64 * 8);

	return hkv_exec(c, &wr, 1);
}

static int harvest_words(struct hkv_class_alloc *ca, struct hkv_seg_own *so,
			 const uint64_t *words, uint64_t ready);

/* Blocks freed in our segments of class cls whose bits we have not taken
 * yet: their bitmaps read in chains of up to 64 segments (one round trip
 * each, not one per segment). */
static int harvest(struct hkv_client *c, uint32_t cls)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	uint64_t ready = hkv_now_ns() + HKV_QUARANTINE_NS;
	uint32_t per = (uint32_t)(c->scr_cap / c->g.bitmap_bytes);
	struct hkv_seg_own *batch[64], *next = ca->segs;
	int got = 0, ret;

	ca->last_harvest_ns = hkv_now_ns();
	ca->evict_pending = 0; /* their bits are set by now: this pass takes them */
	if (per > 64)
		per = 64;
	while (next) {
		struct hkv_wr wrs[64];
		uint32_t n = 0;

		for (; next && n < per; next = next->next, n++) {
			batch[n] = next;
			wrs[n] = hkv_wr_read(c, c->scr + (size_t)n * c->g.bitmap_bytes,
					     bitmap_word(c, next->idx, 0),
					     (next->nblocks + 63) / 64 * 8);
		}
		ret = hkv_exec(c, wrs, (int)n);
		if (ret)
			return ret;
		for (uint32_t i = 0; i < n; i++) {
			ret = harvest_words(ca, batch[i],
					    (const uint64_t *)(c->scr + (size_t)i * c->g.bitmap_bytes),
					    ready);
			if (ret < 0)
				return ret;
			got += ret;
		}
	}
	c->stats.blocks_harvested += (uint64_t)got;
	return got;
}

/* The free bits of one segment's bitmap (as read) not yet in our FIFO go there. */
static int harvest_words(struct hkv_class_alloc *ca, struct hkv_seg_own *so,
			 const uint64_t *words, uint64_t ready)
{
	uint32_t nwords = (so->nblocks + 63) / 64;
	int got = 0;

	for (uint32_t w = 0; w < nwords; w++) {
		uint64_t fresh = words[w] & ~so->held[w];

		if (w == nwords - 1 && so->nblocks % 64)
			fresh &= (1ull << (so->nblocks % 64)) - 1; /* garbage guard */
		so->held[w] |= fresh;
		for (; fresh; fresh &= fresh - 1) {
			if (fifo_push(ca, so->idx, w * 64 + (uint32_t)__builtin_ctzll(fresh), 1, ready))
				return -ENOMEM;
			got++;
		}
	}
	return got;
}

struct scan {
	uint32_t nblocks, nfree, max_gen;
	uint64_t *bits;    /* bitmap words as read */
	uint64_t *meta;    /* per block: its meta word as read */
	uint8_t *unused;   /* per block: never written and no bit */
	uint32_t *gen;
};

/* Read an orphan's bitmap and every block's meta word (generations, never-used). */
static int scan_segment(struct hkv_client *c, uint32_t idx, uint32_t cls, struct scan *sc)
{
	uint32_t csize = c->g.class_size[cls], per_chain = (uint32_t)(c->read_cap / 8);
	int ret;

	sc->nblocks = c->g.seg_size / csize;
	sc->nfree = sc->max_gen = 0;
	sc->bits = hkv_calloc((sc->nblocks + 63) / 64, 8);
	sc->unused = hkv_calloc(sc->nblocks, 1);
	sc->gen = hkv_calloc(sc->nblocks, sizeof(uint32_t));
	sc->meta = hkv_calloc(sc->nblocks, sizeof(uint64_t));
	if (!sc->bits || !sc->unused || !sc->gen || !sc->meta)
		return -ENOMEM;
	ret = read_bitmap(c, idx, sc->nblocks, (uint64_t *)c->scr);
	memcpy(sc->bits, c->scr, (sc->nblocks + 63) / 64 * 8);
	if (per_chain > 128)
		per_chain = 128;
	for (uint32_t first = 0; !ret && first < sc->nblocks; first += per_chain) {
		uint32_t cnt = sc->nblocks - first < per_chain ? sc->nblocks - first : per_chain;
		struct hkv_wr wrs[128];

		for (uint32_t i = 0; i < cnt; i++) /* 8 bytes per block, one chain */
			wrs[i] = hkv_wr_read(c, c->rblk + (size_t)i * 8,
					     seg_base(c, idx) + (uint64_t)(first + i) * csize, 8);
		ret = hkv_exec(c, wrs, (int)cnt);
		for (uint32_t i = 0; !ret && i < cnt; i++) {
			uint32_t b = first + i;
			uint64_t meta;
			int bit = (int)(sc->bits[b / 64] >> (b % 64) & 1);

			memcpy(&meta, c->rblk + (size_t)i * 8, 8);
			sc->meta[b] = meta;
			sc->gen[b] = hkv_meta_gen(meta);
			if (sc->gen[b] > sc->max_gen)
				sc->max_gen = sc->gen[b];
			sc->unused[b] = hkv_meta_state(meta) == HKV_BLK_UNUSED && !bit;
			sc->nfree += bit || sc->unused[b];
		}
	}
	return ret;
}

static void scan_free(struct scan *sc)
{
	hkv_free(sc->bits);
	hkv_free(sc->unused);
	hkv_free(sc->gen);
	hkv_free(sc->meta);
}

/* Adopt as it is: its free blocks (bit set, or never written) join our FIFO. */
static int adopt_as_is(struct hkv_client *c, struct hkv_seg_own *so, const struct scan *sc)
{
	uint64_t ready = hkv_now_ns() + HKV_QUARANTINE_NS;

	memcpy(so->gen, sc->gen, sc->nblocks * sizeof(uint32_t));
	so->carved = so->nblocks;
	for (uint32_t b = 0; b < so->nblocks; b++) {
		int bit = (int)(sc->bits[b / 64] >> (b % 64) & 1);

		if (!bit && !sc->unused[b])
			continue;
		if (bit)
			so->held[b / 64] |= 1ull << (b % 64);
		if (fifo_push(&c->classes[so->cls], so->idx, b, (uint32_t)bit, ready))
			return -ENOMEM;
	}
	return 0;
}

/*
 * After re-carving, the new block starts hold old payload bytes. Write an
 * UNUSED meta carrying the generation floor at each, so that a later
 * adopter's scan reads what is true there.
 */
static int stamp_unused(struct hkv_client *c, const struct hkv_seg_own *so, uint32_t gen)
{
	uint64_t *meta = &c->atom[60]; /* registered: no inline support needed */
	struct hkv_wr wrs[128];
	int n = 0, ret = 0;

	*meta = hkv_meta_make(HKV_BLK_UNUSED, so->cls, gen);
	for (uint32_t b = 0; b < so->nblocks && !ret; b++) {
		wrs[n++] = hkv_wr_write(c, meta, seg_base(c, so->idx) +
						 (uint64_t)b * c->g.class_size[so->cls], 8);
		if (n == 128 || b == so->nblocks - 1) {
			ret = hkv_exec(c, wrs, n);
			n = 0;
		}
	}
	return ret;
}

/*
 * Every block is free: clear the old layout's bits and carve the segment
 * into class cls. Generations continue above the highest one seen, so no
 * block address ever repeats one.
 */
static int recarve(struct hkv_client *c, uint32_t idx, uint64_t entry, uint32_t cls,
		   const struct scan *sc)
{
	struct hkv_wr wrs[64];
	uint64_t mine = hkv_seg_make(HKV_SEG_OWNED, cls, c->client_id, hkv_seg_epoch(entry) + 1);
	struct hkv_seg_own *so;
	uint64_t t_post;
	int n = 0, ret;

	for (uint32_t w = 0; w < (sc->nblocks + 63) / 64; w++) {
		if (!sc->bits[w])
			continue;
		wrs[n++] = hkv_wr_faa(c, &c->atom[62], bitmap_word(c, idx, w * 64), -sc->bits[w]);
		if (n == 64 && (ret = hkv_exec(c, wrs, n)))
			return ret;
		n %= 64;
	}
	wrs[n++] = hkv_wr_cas(c, &c->atom[0], table_off(c, idx), entry, mine);
	t_post = hkv_now_ns();
	ret = hkv_exec(c, wrs, n);
	if (ret)
		return ret;
	if (c->atom[0] != entry)
		return HKV_ECORRUPT; /* only we may change an entry we own */
	so = seg_own_new(c, idx, cls, mine, t_post, &ret);
	if (!so)
		return ret;
	for (uint32_t b = 0; b < so->nblocks; b++)
		so->gen[b] = sc->max_gen;
	c->stats.segments_adopted++;
	return stamp_unused(c, so, sc->max_gen);
}

/* An adopted orphan's allocated LIVE/PENDING blocks: take back those no
 * slot names (hkv_reclaim_unpublished, 64 at a time). */
static int reclaim(struct hkv_client *c, const struct hkv_seg_own *so, const struct scan *sc)
{
	uint64_t offs[64], metas[64];
	int n = 0, ret = 0;

	for (uint32_t b = 0; b < sc->nblocks && ret >= 0; b++) {
		enum hkv_block_state st = hkv_meta_state(sc->meta[b]);

		if (!(sc->bits[b / 64] >> (b % 64) & 1) && hkv_meta_class(sc->meta[b]) == so->cls &&
		    (st == HKV_BLK_LIVE || st == HKV_BLK_PENDING)) {
			offs[n] = seg_base(c, so->idx) + (uint64_t)b * c->g.class_size[so->cls];
			metas[n++] = sc->meta[b];
		}
		if (n == 64 || (b == sc->nblocks - 1 && n)) {
			ret = hkv_reclaim_unpublished(c, so->cls, offs, metas, n);
			n = 0;
		}
	}
	return ret < 0 ? ret : 0;
}

#define ADOPTED_OTHER 1 /* adopt(): a segment of another class, not re-carved */

/* Adopt an orphan or idle segment we just took (entry: ours, set at
 * t_post): as it is, or re-carved when wholly free. An orphan's unpublished
 * blocks are taken back; an idle one's owner lives, and publishes or frees
 * its own. */
static int adopt(struct hkv_client *c, uint32_t idx, uint64_t entry, uint64_t t_post,
		 uint32_t want_cls, int orphan)
{
	uint32_t cls = hkv_seg_class(entry);
	struct hkv_seg_own *so;
	struct scan sc;
	int ret = scan_segment(c, idx, cls, &sc);

	if (!ret && sc.nfree == sc.nblocks && cls != want_cls) {
		ret = recarve(c, idx, entry, want_cls, &sc);
	} else if (!ret) {
		so = seg_own_new(c, idx, cls, entry, t_post, &ret);
		if (so)
			ret = adopt_as_is(c, so, &sc);
		if (so && !ret && orphan)
			ret = reclaim(c, so, &sc);
		c->stats.segments_adopted++;
		if (!ret && cls != want_cls)
			ret = ADOPTED_OTHER; /* kept in its own class: no use to this write yet */
	}
	scan_free(&sc);
	hkv_debug("client %u: adopted segment %u (class %u, wanted %u): %s", c->client_id, idx,
		  cls, want_cls, hkv_strerror(ret));
	return ret;
}

/* CAS a segment table entry from e to owned-by-us (class cls); 1 if we got
 * it. *t_post: when the CAS was posted (our lease runs from then). */
static int take_entry(struct hkv_client *c, uint32_t i, uint64_t e, uint32_t cls,
		      uint64_t *t_post, int *err)
{
	uint64_t mine = hkv_seg_make(HKV_SEG_OWNED, cls, c->client_id, hkv_seg_epoch(e) + 1);
	struct hkv_wr wr = hkv_wr_cas(c, &c->atom[0], table_off(c, i), e, mine);

	*t_post = hkv_now_ns();
	*err = hkv_exec(c, &wr, 1);
	return !*err && c->atom[0] == e;
}

/* A FREE or ORPHAN segment we took (its entry was e, we made it ours in class
 * cls) but cannot use: back to what it was, one epoch on. Its window, if we
 * got one, is the server's to revoke (its sweep sees the table). */
static void give_back(struct hkv_client *c, uint32_t i, uint64_t e, uint32_t cls)
{
	uint64_t mine = hkv_seg_make(HKV_SEG_OWNED, cls, c->client_id, hkv_seg_epoch(e) + 1);
	/* (an IDLE entry keeps its owner, who may take it back) */
	struct hkv_wr wr = hkv_wr_cas(c, &c->atom[0], table_off(c, i), mine,
				      hkv_seg_make(hkv_seg_state(e), hkv_seg_class(e),
						   hkv_seg_state(e) == HKV_SEG_IDLE
							   ? hkv_seg_owner(e) : 0,
						   hkv_seg_epoch(e) + 2));

	if (c->wkeys)
		c->wkeys[i] = 0;
	hkv_exec(c, &wr, 1); /* if this fails too, the server orphans it when we go */
}

/*
 * More memory for class cls, in this order: a FREE segment; an ORPHAN, then
 * an IDLE segment (another client's, which it stopped allocating in) of
 * class cls; any ORPHAN, then any IDLE one (re-carved if wholly free, else
 * kept in its own class and we look again).
 */
enum { PASS_FREE, PASS_ORPHAN_CLS, PASS_IDLE_CLS, PASS_ORPHAN_ANY, PASS_IDLE_ANY, NPASS };

static int pass_wants(const struct hkv_client *c, int pass, uint64_t e, uint32_t idx,
		      uint32_t cls)
{
	enum hkv_seg_state st = hkv_seg_state(e);
	uint32_t ecls = hkv_seg_class(e);

	if (pass == PASS_FREE)
		return st == HKV_SEG_FREE;
	if (ecls >= c->g.nclasses)
		return 0;
	if ((pass == PASS_ORPHAN_CLS || pass == PASS_IDLE_CLS) && ecls != cls)
		return 0;
	if (pass == PASS_ORPHAN_CLS || pass == PASS_ORPHAN_ANY)
		return st == HKV_SEG_ORPHAN;
	return st == HKV_SEG_IDLE && !c->owned[idx]; /* our own: hkv_alloc_hold takes it back */
}

static int claim_segment(struct hkv_client *c, uint32_t cls)
{
	uint64_t *table = (uint64_t *)c->scr;
	uint32_t n = c->g.nsegs, start;
	struct hkv_wr wr;
	int ret;

	if (c->g.max_client_segs) { /* the server's limit per client */
		uint64_t mine = 0;

		for (uint32_t i = 0; i < c->g.nclasses; i++)
			for (struct hkv_seg_own *so = c->classes[i].segs; so; so = so->next)
				mine++;
		if (mine >= c->g.max_client_segs)
			return HKV_EFULL;
	}
	wr = hkv_wr_read(c, table, c->g.seg_table_off, n * 8);
	ret = hkv_exec(c, &wr, 1);
	if (ret)
		return ret;
	start = (uint32_t)(hkv_rand(c) % n);
	for (int pass = 0; pass < NPASS; pass++) {
		for (uint32_t k = 0; k < n; k++) {
			uint32_t i = (start + k) % n;
			uint64_t e = table[i], t_post;
			uint32_t ecls = hkv_seg_class(e);

			if (!pass_wants(c, pass, e, i, cls))
				continue;
			if (!take_entry(c, i, e, pass ? ecls : cls, &t_post, &ret)) {
				if (ret)
					return ret;
				continue; /* somebody was faster */
			}
			/* ours once, lost, back: its old tracking and window key go */
			if (c->owned[i])
				hkv_alloc_forget(c, c->owned[i]);
			ret = grant_write(c, i);
			if (ret) { /* not ours to write after all: give it back */
				give_back(c, i, e, pass ? ecls : cls);
				return ret;
			}
			if (pass == PASS_FREE) {
				c->stats.segments_claimed++;
				if (!seg_own_new(c, i, cls, hkv_seg_make(HKV_SEG_OWNED, cls,
									  c->client_id,
									  hkv_seg_epoch(e) + 1),
						 t_post, &ret))
					give_back(c, i, e, cls);
				return ret;
			}
			if (hkv_seg_state(e) == HKV_SEG_IDLE)
				c->stats.segments_taken_idle++;
			e = hkv_seg_make(HKV_SEG_OWNED, ecls, c->client_id, hkv_seg_epoch(e) + 1);
			return adopt(c, i, e, t_post, cls, pass == PASS_ORPHAN_CLS ||
								pass == PASS_ORPHAN_ANY);
		}
	}
	return HKV_EFULL;
}

/* The next rested block of the FIFO: 1 (taken), 0 (none ready), <0. */
static int take_ready(struct hkv_client *c, struct hkv_class_alloc *ca, uint64_t now,
		      uint64_t *off, uint32_t *gen)
{
	struct hkv_free_block fb;
	struct hkv_seg_own *so;
	int ret;

	for (;;) {
		if (ca->head == ca->tail || ca->fifo[ca->head & (ca->cap - 1)].ready_ns > now)
			return 0;
		fb = ca->fifo[ca->head & (ca->cap - 1)];
		so = c->owned[fb.seg];
		if (!so || fb.blk >= so->nblocks) {
			ca->head++;
			continue;
		}
		ret = hkv_alloc_hold(c, so);
		if (ret < 0)
			return ret;
		if (ret == 0)
			break;
		hkv_alloc_forget(c, so); /* adopted while we were not allocating there */
	}
	ca->head++;
	*gen = ++so->gen[fb.blk] ? so->gen[fb.blk] : ++so->gen[fb.blk];
	*off = seg_base(c, fb.seg) + (uint64_t)fb.blk * c->g.class_size[so->cls];
	if (fb.bit_set) /* its bit stays set, and held, until the write chain clears it */
		c->alloc_clear = (struct hkv_bit_clear){bitmap_word(c, fb.seg, fb.blk),
							1ull << (fb.blk % 64), fb.seg, fb.blk};
	return 1;
}

/* Called right before the chain that writes the new block is executed, so no
 * harvest can see the bit still set yet not held. */
int hkv_wr_alloc_clear(struct hkv_client *c, struct hkv_wr *wrs, int n)
{
	struct hkv_bit_clear *bc = &c->alloc_clear;
	struct hkv_seg_own *so;

	if (!bc->word_off)
		return n;
	wrs[n++] = hkv_wr_faa(c, &c->atom[61], bc->word_off, -bc->bit);
	so = c->owned[bc->seg];
	if (so)
		so->held[bc->blk / 64] &= ~(1ull << (bc->blk % 64));
	bc->word_off = 0;
	return n;
}

/* Keep the next batch resting: harvest ahead once the ready supply runs low. */
#define HARVEST_AHEAD 32

int hkv_alloc_block(struct hkv_client *c, uint32_t cls, uint64_t *off, uint32_t *gen)
{
	struct hkv_class_alloc *ca = &c->classes[cls];
	int waited = 0, others = 0, ret;

	for (;;) {
		uint64_t now = hkv_now_ns();
		struct hkv_seg_own *so;
		int harvest_due = ca->segs && now - ca->last_harvest_ns > HKV_QUARANTINE_NS;

		ret = take_ready(c, ca, now, off, gen);
		if (ret < 0)
			return ret;
		if (ret) {
			if (harvest_due && ca->tail - ca->head < HARVEST_AHEAD)
				harvest(c, cls); /* errors show up on the next round trip */
			return 0;
		}
		so = ca->segs; /* (after take_ready, which may have forgotten some) */
		if (so && so->carved < so->nblocks) {
			uint32_t b;

			ret = hkv_alloc_hold(c, so);
			if (ret < 0)
				return ret;
			if (ret) {
				hkv_alloc_forget(c, so);
				continue;
			}
			b = so->carved++;

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
		/* Blocks resting in quarantine are ready within 200 us: wait for
		 * them rather than take memory other clients may need. */
		if (ca->head != ca->tail)
			continue;
		/* (at most two segments of other classes adopted per allocation: each
		 * costs a scan and strands its owner; in cache mode they are what
		 * hkv_reassign_segment (evict.c) re-carves next) */
		ret = others < 2 ? claim_segment(c, cls) : HKV_EFULL;
		others += ret == ADOPTED_OTHER;
		if (ret != HKV_EFULL) {
			if (ret < 0)
				return ret;
			continue;
		}
		if (waited || !ca->segs || (c->g.flags & HKV_GEOM_F_CACHE))
			return HKV_EFULL; /* (cache mode evicts instead of waiting) */
		/* Full: frees may still be in flight from other clients; look once more. */
		waited = 1;
		ca->last_harvest_ns = 0;
		while (hkv_now_ns() - now < 2 * HKV_QUARANTINE_NS)
			;
	}
}

/*
 * Nothing to allocate, evict or re-carve for us: if other connected
 * clients own segments, some may go IDLE soon (their owners stopped
 * allocating there; the server marks them within HKV_SEG_IDLE_MS +
 * HKV_SEG_SWEEP_MS). Look again every 10 ms (one READ of the table) until
 * one is IDLE, FREE or ORPHAN (0: try again) or that time is over
 * (HKV_EFULL; then no such wait for a second, so a full store stays quick
 * to say so).
 */
int hkv_alloc_wait_idle(struct hkv_client *c)
{
	uint64_t *table = (uint64_t *)c->scr, t0 = hkv_now_ns();
	uint64_t limit = (HKV_SEG_IDLE_MS + 3 * HKV_SEG_SWEEP_MS) * 1000000ull;
	struct hkv_wr wr;
	int ret;

	if ((uint64_t)c->timeout_ms * 1000000ull < limit)
		limit = (uint64_t)c->timeout_ms * 1000000ull;
	if (t0 < c->idle_wait_until_ns)
		return HKV_EFULL;
	for (;;) {
		uint32_t others = 0;

		wr = hkv_wr_read(c, table, c->g.seg_table_off, c->g.nsegs * 8);
		ret = hkv_exec(c, &wr, 1);
		if (ret)
			return ret;
		for (uint32_t i = 0; i < c->g.nsegs; i++) {
			enum hkv_seg_state st = hkv_seg_state(table[i]);

			if (st == HKV_SEG_FREE || st == HKV_SEG_ORPHAN ||
			    (st == HKV_SEG_IDLE && !c->owned[i]))
				return 0;
			others += st == HKV_SEG_OWNED && !c->owned[i];
		}
		if (!others)
			return HKV_EFULL;
		if (hkv_now_ns() - t0 > limit) {
			c->idle_wait_until_ns = hkv_now_ns() + 1000000000ull;
			return HKV_EFULL;
		}
		usleep(10000);
	}
}

/* Segment and block index of the block of class cls at region offset off. */
static void block_pos(const struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t *seg,
		      uint32_t *blk)
{
	*seg = (uint32_t)((off - c->g.data_off) / c->g.seg_size);
	*blk = (uint32_t)((off - c->g.data_off) % c->g.seg_size / c->g.class_size[cls]);
}

void hkv_unalloc_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg, blk;

	block_pos(c, off, cls, &seg, &blk);
	/* If the WRITE (and with it the bit clear) never went out, the bit is
	 * still set and held: the block goes back as it came. */
	uint32_t bit_set = c->alloc_clear.word_off != 0;
	struct hkv_seg_own *so = c->owned[seg];

	/* Never published, so nobody can know its generation: give it back too,
	 * so that a client retrying on one block does not race its generation
	 * (and the slot's 11-bit ver) around. */
	if (so && blk < so->nblocks && so->gen[blk] > 1)
		so->gen[blk]--;
	c->alloc_clear.word_off = 0;
	fifo_push(&c->classes[cls], seg, blk, bit_set, 0);
}

static void set_bit(struct hkv_client *c, uint32_t seg, uint32_t blk)
{
	struct hkv_wr wr = hkv_wr_faa(c, &c->atom[63], bitmap_word(c, seg, blk), 1ull << (blk % 64));

	wr.flags = HKV_WR_F_NO_COMPLETION;
	/* the transport keeps room for it (signaling now and then); if the
	 * connection failed, the free is lost with it (docs/design.md, Known gaps) */
	(void)hkv_conn_post(c->conn, &wr, 1);
}

void hkv_free_block(struct hkv_client *c, uint64_t off, uint32_t cls)
{
	uint32_t seg, blk;

	if (cls >= c->g.nclasses || !hkv_block_range_ok(&c->g, off, c->g.class_size[cls]))
		return; /* not a block we could have validated: never touch it */
	block_pos(c, off, cls, &seg, &blk);
	set_bit(c, seg, blk);
	c->stats.blocks_freed++;
}

/* At close: blocks in our FIFOs whose bits we already cleared get them back. */
void hkv_alloc_release(struct hkv_client *c)
{
	struct hkv_wr wr;

	for (uint32_t cls = 0; cls < c->g.nclasses; cls++) {
		struct hkv_class_alloc *ca = &c->classes[cls];

		while (ca->head != ca->tail) {
			struct hkv_free_block fb = ca->fifo[ca->head++ & (ca->cap - 1)];

			/* (only in a segment still ours: see hkv_alloc_forget) */
			if (!fb.bit_set && c->owned[fb.seg] && fb.blk < c->owned[fb.seg]->nblocks &&
			    hkv_alloc_hold(c, c->owned[fb.seg]) == 0)
				set_bit(c, fb.seg, fb.blk);
		}
	}
	wr = hkv_wr_read(c, c->atom, c->g.seg_table_off, 8); /* drain: one signaled wait */
	hkv_exec(c, &wr, 1);
}

/* The segment of the block the write in progress rewrites (c->protect_off),
 * which making room never moves; UINT64_MAX when there is none. */
static uint64_t protected_seg(const struct hkv_client *c)
{
	return c->protect_off >= c->g.data_off ? (c->protect_off - c->g.data_off) / c->g.seg_size
					       : UINT64_MAX;
}

/*
 * Store mode has nothing to evict: a class short of memory takes one of our
 * segments of another class whose blocks are all free (deleted, flushed),
 * re-carved. One scan per candidate; at most one pass a second, so a full
 * store stays quick to say so. 0 (cls has it), HKV_EFULL, <0.
 */
int hkv_alloc_take_free_own(struct hkv_client *c, uint32_t cls)
{
	uint64_t now = hkv_now_ns(), keep = protected_seg(c);

	if (now < c->free_own_until_ns)
		return HKV_EFULL;
	for (uint32_t k = 0; k < c->g.nclasses; k++) {
		for (struct hkv_seg_own *so = c->classes[k].segs; k != cls && so; so = so->next) {
			struct scan sc;
			int ret, whole;

			if (so->idx == keep)
				continue;
			ret = scan_segment(c, so->idx, so->cls, &sc);
			whole = !ret && sc.nfree == sc.nblocks;
			scan_free(&sc);
			if (ret)
				return ret;
			if (!whole)
				continue;
			if ((ret = hkv_alloc_detach(c, so)))
				return ret;
			return hkv_alloc_recarve_own(c, so, cls);
		}
	}
	c->free_own_until_ns = now + 1000000000ull;
	return HKV_EFULL;
}

/* ---- moving a segment between classes (cache mode) -------------------------- */

/* One of our segments of another class than cls: the oldest of the class we
 * hold most segments of (two or more preferred). NULL if we hold none. */
struct hkv_seg_own *hkv_alloc_donor(struct hkv_client *c, uint32_t cls)
{
	struct hkv_seg_own *best = NULL;
	uint32_t best_n = 0;
	uint64_t keep = protected_seg(c);

	for (uint32_t i = 0; i < c->g.nclasses; i++) {
		struct hkv_seg_own *so = c->classes[i].segs, *last = NULL;
		uint32_t n = 0;

		if (i == cls)
			continue;
		for (; so; so = so->next)
			if (so->idx != keep) { /* not the segment of the item being rewritten */
				last = so;
				n++;
			}
		if (n > best_n) {
			best_n = n;
			best = last;
		}
	}
	return best;
}

/*
 * Stop allocating from so: take it off its class's list and FIFO. Free
 * blocks of it we held with their bit already cleared get the bit back, so
 * that the bitmap names every free block of the segment again.
 */
int hkv_alloc_detach(struct hkv_client *c, struct hkv_seg_own *so)
{
	if (seg_unlist(c, so, 1))
		return -EINVAL;
	memset(so->held, 0, (so->nblocks + 63) / 64 * 8);
	return 0;
}

/*
 * so (detached, everything in it evicted) becomes a segment of class cls:
 * once every block of it is free - bit set or never written; frees other
 * clients posted may still be landing, so it looks a few times - it is
 * re-carved like a wholly free orphan. If it never gets there it goes back
 * to its class. 0 or HKV_EFULL (gave it back, or it is no longer ours), <0.
 */
int hkv_alloc_recarve_own(struct hkv_client *c, struct hkv_seg_own *so, uint32_t cls)
{
	struct scan sc;
	uint64_t entry;
	int ret = hkv_alloc_hold(c, so), tries;

	if (ret == 1)
		hkv_alloc_forget(c, so); /* detached already: forgetting frees it */
	if (ret)
		return ret == 1 ? HKV_EFULL : ret;
	for (tries = 0; tries < 50; tries++) {
		uint64_t t0 = hkv_now_ns();

		ret = scan_segment(c, so->idx, so->cls, &sc);
		if (!ret && sc.nfree == sc.nblocks)
			break;
		scan_free(&sc);
		if (ret)
			break;
		while (hkv_now_ns() - t0 < HKV_QUARANTINE_NS)
			;
	}
	if (!ret && tries < 50) { /* sc holds the scan of a wholly free segment */
		/* (the scans may have outlasted the lease: hold again, and re-carve
		 * from the entry as that left it) */
		ret = hkv_alloc_hold(c, so);
		if (ret == 1) {
			scan_free(&sc);
			hkv_alloc_forget(c, so);
			return HKV_EFULL;
		}
		entry = so->entry;
		if (!ret) {
			c->owned[so->idx] = NULL;
			ret = recarve(c, so->idx, entry, cls, &sc);
			if (!ret)
				seg_own_free(so);
		}
		scan_free(&sc);
		if (ret && !c->owned[so->idx]) {
			c->owned[so->idx] = so;
		} else if (!ret) {
			return 0;
		}
	}
	/* give it back to its class: harvesting finds its free blocks again */
	so->next = c->classes[so->cls].segs;
	c->classes[so->cls].segs = so;
	c->classes[so->cls].last_harvest_ns = 0;
	return ret ? ret : HKV_EFULL;
}
