/*
 * ops.c - the key-value operations, each a few chains of one-sided work
 * requests. docs/design.md has the round-trip table and the concurrency
 * argument; the short version:
 *
 *  find   warm: READ block (cached location)            1 RT, valid if LIVE+gen
 *         cold: READ b1,b2 | READ candidate block(s)    2 RT
 *  update [WRITE new block, CAS old meta LIVE->OBSOLETE, CAS slot old->new]
 *                                                        1 RT (+ find if cold)
 *  insert [WRITE new block, CAS empty slot 0->new, READ b1,b2 again]
 *                                                        1 RT after the cold find
 *  delete [CAS old meta LIVE->OBSOLETE, CAS slot old->0] 1 RT (+ find if cold)
 *
 * A block is written out of place and never changes while its generation
 * stands; a reader that sees it LIVE with the generation it expects knows
 * the slot still pointed at it when its READ ran, because every writer marks
 * the old block OBSOLETE before (same queue pair, in order) it swings the
 * slot away.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client/client_int.h"
#include "common/log.h"
#include "common/transport_int.h"

#define MAX_CANDIDATES 4
#define CANON_SLOTS    (2 * HKV_BUCKET_SLOTS)
#define REL_EXPTIME_MAX (60 * 60 * 24 * 30) /* memcached: up to 30 days is relative */

/* cache mode */
#define ATIME_STEP_MS  1  /* a block's access time is refreshed at most this often */
#define EVICT_SAMPLES  64 /* blocks sampled per eviction round */
#define EVICT_BATCH    8  /* the oldest this many of them are evicted */
#define EVICT_READ     320 /* header + the longest key, 64 B aligned */
#define ATIME_FRESH_NS (10ull * 1000000ull) /* a GET's atime CAS only this soon after its READ */

void (*hkv_test_hook)(struct hkv_client *c, enum hkv_test_point point);

static void test_point(struct hkv_client *c, enum hkv_test_point point)
{
	if (hkv_test_hook)
		hkv_test_hook(c, point);
}

/* Internal outcomes (> 0; errors are < 0). */
#define CONFLICT 1 /* lost a race, look again */
#define NO_CACHE 2 /* no usable cache entry, nothing was sent */
#define YIELDED  3 /* our new block was withdrawn (and freed): start over with a fresh one */
#define STALE    4 /* a view grew too old to act on, or a stale write was undone: look again */

/* ---- work request helpers --------------------------------------------------- */

struct hkv_wr hkv_wr_read(struct hkv_client *c, void *local, uint64_t off, uint32_t len)
{
	return (struct hkv_wr){.opcode = HKV_WR_READ, .local = local, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->rkey, .length = len};
}

/* We only ever WRITE into segments we own; with memory windows each has its
 * own rkey (the base rkey carries no WRITE right and would fail at the NIC). */
struct hkv_wr hkv_wr_write(struct hkv_client *c, const void *local, uint64_t off, uint32_t len)
{
	uint32_t rkey = c->rkey;

	if (c->wkeys && off >= c->g.data_off &&
	    (off - c->g.data_off) / c->g.seg_size < c->g.nsegs)
		rkey = c->wkeys[(off - c->g.data_off) / c->g.seg_size];
	return (struct hkv_wr){.opcode = HKV_WR_WRITE, .local = (void *)local, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = rkey, .length = len};
}

struct hkv_wr hkv_wr_cas(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t expect,
			 uint64_t swap)
{
	return (struct hkv_wr){.opcode = HKV_WR_CAS, .local = res, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->akey,
			       .compare_add = expect, .swap = swap};
}

struct hkv_wr hkv_wr_faa(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t add)
{
	return (struct hkv_wr){.opcode = HKV_WR_FAA, .local = res, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->akey, .compare_add = add};
}

int hkv_exec(struct hkv_client *c, struct hkv_wr *wrs, int n)
{
	int ret = hkv_conn_exec(c->conn, wrs, n);

	/* -EAGAIN (room held by signaled work nobody waits for) cannot happen
	 * here; if it did, it must not be an answer: fail the connection, so the
	 * next operation connects again (hkv_revive) */
	if (ret == -EAGAIN)
		ret = c->conn->error = HKV_ETRANSPORT;
	return ret;
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

/* May a write still act on what was seen at seen_ns? Checked right before
 * the post that acts on it (docs/design.md, "Views"). */
uint64_t hkv_test_view_max_ns;

static int view_fresh(struct hkv_client *c, uint64_t seen_ns)
{
	if (hkv_now_ns() - seen_ns <= (hkv_test_view_max_ns ? hkv_test_view_max_ns
							    : HKV_VIEW_MAX_NS))
		return 1;
	c->stats.stale_views++;
	return 0;
}

static int key_init(struct hkv_client *c, struct key *k, const void *key, size_t klen)
{
	if (!key || klen == 0 || klen > HKV_MAX_KEY)
		return klen > HKV_MAX_KEY ? HKV_ETOOBIG : -EINVAL;
	k->p = key;
	k->len = (uint16_t)klen;
	k->h = c->pre_key == key ? c->pre_hash : hkv_key_hash(&c->g, key, klen);
	c->pre_key = NULL;
	k->h += !k->h; /* 0 marks an empty cache entry */
	k->fp = hkv_fp_of(k->h);
	hkv_buckets_of(&c->g, k->h, &k->b[0], &k->b[1]);
	return 0;
}

static uint64_t slot_off_of(const struct hkv_client *c, const struct key *k, int pos)
{
	return c->g.index_off + k->b[pos / HKV_BUCKET_SLOTS] * HKV_BUCKET_SIZE +
	       (uint64_t)(pos % HKV_BUCKET_SLOTS) * 8;
}

/* READs of the key's two buckets into dst (2 * HKV_BUCKET_SIZE bytes, in the
 * handle's registered memory), appended to wrs[n]; returns the new n. */
static int append_bucket_reads(struct hkv_client *c, struct hkv_wr *wrs, int n,
			       const struct key *k, void *dst)
{
	wrs[n++] = hkv_wr_read(c, dst, slot_off_of(c, k, 0), HKV_BUCKET_SIZE);
	wrs[n++] = hkv_wr_read(c, (uint8_t *)dst + HKV_BUCKET_SIZE,
			       slot_off_of(c, k, HKV_BUCKET_SLOTS), HKV_BUCKET_SIZE);
	return n;
}

static uint32_t now_unix(void)
{
	return (uint32_t)time(NULL);
}

/* memcached's exptime rules -> absolute Unix seconds (0 = never). */
static uint32_t abs_exptime(int64_t exptime)
{
	if (exptime == 0)
		return 0;
	if (exptime < 0)
		return 1; /* long past: expired at once */
	if (exptime <= REL_EXPTIME_MAX)
		return now_unix() + (uint32_t)exptime;
	return exptime > UINT32_MAX ? UINT32_MAX : (uint32_t)exptime;
}

static const struct hkv_block_hdr *item_hdr(const struct item *it)
{
	return (const struct hkv_block_hdr *)it->blk;
}

static int item_expired(const struct item *it)
{
	uint32_t e = item_hdr(it)->exptime;

	return e && e <= now_unix();
}

static uint64_t item_version(const struct item *it)
{
	return (it->blk_off / HKV_BLOCK_ALIGN) << 28 | (it->gen & 0xfffffff);
}

static uint64_t meta_live(const struct item *it)
{
	return hkv_meta_make(HKV_BLK_LIVE, it->cls, it->gen);
}

/*
 * A cached location: any age for reads (they read the block and compare the
 * key); for a write that acts on it without reading the block, only an entry
 * that holds the key itself (never another key's with the same hash) and is
 * young enough to act on.
 */
static struct hkv_loc *cache_get(struct hkv_client *c, const struct key *k, struct hkv_loc *tmp,
				 int for_write)
{
	if (!for_write) /* reads validate fully: any age will do, no clock needed */
		return hkv_cache_find(c->cache, k->h, k->p, k->len, 0, UINT64_MAX, tmp) ? tmp
											: NULL;
	if (!hkv_cache_find(c->cache, k->h, k->p, k->len, hkv_now_ns(), HKV_VIEW_MAX_NS, tmp))
		return NULL;
	return tmp->key_ok == 1 ? tmp : NULL;
}

static void remember(struct hkv_client *c, const struct key *k, const struct item *it)
{
	struct hkv_loc loc = {.hash = k->h, .slot_addr = it->slot_off, .slot = it->slot,
			      .gen = it->gen, .blen = it->blen, .stamp_ns = it->seen_ns};

	hkv_cache_put(c->cache, &loc, k->p, k->len);
}

/* Does a slot point at a plausible block? Garbage never leads to a bad READ. */
static int slot_sane(const struct hkv_client *c, uint64_t s)
{
	uint32_t cls = hkv_slot_class(s);

	return cls < c->g.nclasses &&
	       hkv_block_range_ok(&c->g, hkv_slot_off(s), c->g.class_size[cls]);
}

/* A write acts on a cached slot without reading the block: the entry must
 * name one of the key's 32 slots, holding the key's fingerprint. */
static int loc_fits_key(const struct hkv_client *c, const struct hkv_loc *loc,
			const struct key *k)
{
	for (int b = 0; b < 2; b++) {
		uint64_t first = c->g.index_off + k->b[b] * HKV_BUCKET_SIZE;

		if (loc->slot_addr >= first && loc->slot_addr < first + HKV_BUCKET_SIZE &&
		    loc->slot_addr % 8 == 0)
			return hkv_slot_fp(loc->slot) == k->fp && slot_sane(c, loc->slot);
	}
	return 0;
}

/* ---- finding a key ---------------------------------------------------------- */

/* Fill it from a validated block copy at blk (avail bytes), seen at seen_ns. */
static void item_from_block(struct item *it, uint8_t *blk, uint64_t slot_off, uint64_t slot,
			    int pos, uint64_t seen_ns)
{
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;

	it->slot_off = slot_off;
	it->slot = slot;
	it->blk_off = hkv_slot_off(slot);
	it->cls = hkv_slot_class(slot);
	it->gen = hkv_meta_gen(h->meta);
	it->state = hkv_meta_state(h->meta);
	it->blk = blk;
	it->blen = HKV_BLOCK_HDR + h->klen + h->vlen;
	it->pos = pos;
	it->seen_ns = seen_ns;
}

/*
 * A block read through a cached location (loc->blen bytes at blk) is still
 * the key's current value iff it is LIVE with the cached generation and
 * class, holds the key, and its CRC and length check out (invariant 2 in
 * docs/design.md).
 */
static int loc_block_current(const struct hkv_client *c, const struct hkv_loc *loc,
			     const uint8_t *blk, const void *key, uint16_t klen)
{
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;

	return hkv_meta_state(h->meta) == HKV_BLK_LIVE && hkv_meta_gen(h->meta) == loc->gen &&
	       hkv_meta_class(h->meta) == hkv_slot_class(loc->slot) &&
	       !hkv_block_check(&c->g, blk, loc->blen, key, klen) &&
	       HKV_BLOCK_HDR + h->klen + h->vlen == loc->blen;
}

/* Warm find: one READ of the cached block. 0 found, 1 not usable, <0 error. */
static int find_warm(struct hkv_client *c, const struct key *k, struct item *it)
{
	struct hkv_loc lc, *loc = cache_get(c, k, &lc, 0);
	struct hkv_wr wr;
	uint64_t t0;
	int ret;

	if (!loc) {
		c->stats.cache_misses++;
		return 1;
	}
	if (!slot_sane(c, loc->slot) || loc->blen > c->g.class_size[hkv_slot_class(loc->slot)] ||
	    loc->blen > c->read_cap) {
		hkv_cache_drop(c->cache, k->h);
		return 1;
	}
	wr = hkv_wr_read(c, c->rblk, hkv_slot_off(loc->slot), loc->blen);
	t0 = hkv_coarse_ns(); /* <= when the READ ran: the view's age */
	ret = hkv_exec(c, &wr, 1);
	if (ret)
		return ret;
	if (!loc_block_current(c, loc, c->rblk, k->p, k->len)) {
		hkv_cache_drop(c->cache, k->h); /* replaced, reused or torn: ask the index */
		c->stats.cache_misses++;
		return 1;
	}
	item_from_block(it, c->rblk, loc->slot_addr, loc->slot, -1, t0);
	/* confirmed at t0: young again (rarely written; never over a newer entry) */
	if (t0 - loc->stamp_ns > HKV_VIEW_MAX_NS / 8 && t0 > loc->stamp_ns)
		hkv_cache_refresh(c->cache, loc, t0);
	c->stats.cache_hits++;
	return 0;
}

/*
 * Retrying after a lost race. Contenders back off for a random while that
 * grows with the attempts, in units of how long one attempt took (a round
 * trip is 2 us on a NIC, 100+ us under emulation), so they spread out instead
 * of colliding in lock step. An operation gives up (HKV_EAGAIN) only when it
 * has been losing for the whole configured timeout.
 */
struct retry {
	uint64_t start, last;
	int attempt, stale;
};

static void retry_begin(struct retry *r)
{
	r->start = r->last = hkv_now_ns();
	r->attempt = r->stale = 0;
}

/* Wait before the next attempt; 0 to go on, HKV_EAGAIN when time is up. */
static int retry_wait(struct hkv_client *c, struct retry *r)
{
	uint64_t now, unit, until;
	/* (growth capped at 32 units: an unbounded backoff starves the loser
	 * while fresh winners come back at once - seen as HKV_EAGAIN under six
	 * threads' incr on two emulated CPUs) */
	int shift = r->attempt < 5 ? r->attempt : 5;

	test_point(c, HKV_TP_RETRY);
	now = hkv_now_ns();
	unit = now - r->last;

	if (now - r->start > (uint64_t)c->timeout_ms * 1000000ull || r->attempt >= HKV_MAX_RETRIES)
		return HKV_EAGAIN;
	if (unit < 1000)
		unit = 1000;
	until = now + hkv_rand(c) % (unit << shift);
	while (hkv_now_ns() < until)
		if (until - hkv_now_ns() > 20000)
			sched_yield(); /* a long wait: let the contenders run */
	r->attempt++;
	r->last = hkv_now_ns();
	return 0;
}

/*
 * A view went stale (STALE): this thread was stopped, not beaten by other
 * writers. Look again at once, and do not count the stall against the
 * timeout - three times; then as a lost race.
 */
static int retry_stale(struct hkv_client *c, struct retry *r)
{
	if (r->stale++ >= 3)
		return retry_wait(c, r);
	r->start = r->last = hkv_now_ns();
	return 0;
}

/*
 * Read the blocks of the candidate slots (canonical order, batches that fit
 * the read area) and take the first that holds the key with the generation
 * its slot names. 0 found; HKV_ENOTFOUND, with the slot values of candidates
 * that failed validation (replaced and reused since the bucket READ, or
 * garbage) in torn[*ntorn]. Blocks of a class larger than this handle's read
 * area are never read (*too_big counts them).
 */
static int check_candidates(struct hkv_client *c, const struct key *k, struct item *it,
			    const struct view *v, const int *cand, int ncand, uint64_t *torn,
			    int *ntorn, int *too_big)
{
	/* A slot (read at v->seen_ns) and the generation of the block read now
	 * are one incarnation only within the ABA horizon: past the bound, STALE. */
	for (int first = 0; first < ncand;) {
		struct hkv_wr wrs[MAX_CANDIDATES];
		size_t used = 0;
		int n = 0, ret;

		while (first + n < ncand && n < MAX_CANDIDATES) {
			uint32_t sz = c->g.class_size[hkv_slot_class(v->slot[cand[first + n]])];

			if (sz > c->read_cap) { /* larger than this handle reads: never READ it */
				if (n)
					break;
				(*too_big)++;
				first++;
				continue;
			}
			if (n && used + sz > c->read_cap)
				break;
			wrs[n] = hkv_wr_read(c, c->rblk + used, hkv_slot_off(v->slot[cand[first + n]]), sz);
			used += sz;
			n++;
		}
		if (!n)
			continue;
		ret = hkv_exec(c, wrs, n);
		if (ret)
			return ret;
		if (!view_fresh(c, v->seen_ns))
			return STALE;
		used = 0;
		for (int i = first; i < first + n; i++) {
			uint64_t s = v->slot[cand[i]];
			uint8_t *blk = c->rblk + used;
			const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
			uint32_t sz = c->g.class_size[hkv_slot_class(s)];
			int chk = hkv_block_check(&c->g, blk, sz, k->p, k->len);

			used += sz;
			if (chk == HKV_ECORRUPT || (hkv_meta_gen(h->meta) & 0x7ff) != hkv_slot_ver(s) ||
			    hkv_meta_class(h->meta) != hkv_slot_class(s)) {
				/* torn, or no longer the block the slot named: it was
				 * replaced and its memory reused, perhaps by another key */
				torn[(*ntorn)++] = s;
				continue;
			}
			if (chk == HKV_ENOTFOUND)
				continue; /* the block the slot names holds another key */
			if (hkv_meta_state(h->meta) == HKV_BLK_PENDING || (h->meta & HKV_META_ABORTED))
				continue; /* an insert not (or never) committed: absent */
			item_from_block(it, blk, slot_off_of(c, k, cand[i]), s, cand[i], v->seen_ns);
			if (it->state == HKV_BLK_LIVE)
				remember(c, k, it);
			return 0;
		}
		first += n;
	}
	return HKV_ENOTFOUND;
}

/* Were all of cur[] also torn in the previous attempt? */
static int same_torn(const uint64_t *cur, int ncur, const uint64_t *prev, int nprev)
{
	if (ncur != nprev)
		return 0;
	for (int i = 0; i < ncur; i++)
		if (cur[i] != prev[i])
			return 0;
	return 1;
}

/*
 * Cold find: READ both buckets (after any `lead` requests, e.g. the WRITE of
 * a new block), then the candidate blocks (check_candidates). Fills *v with
 * what the buckets held. 0 found, HKV_ENOTFOUND.
 *
 * A candidate that fails validation was replaced (and its block reused)
 * between our two READs: look again. Only a slot that still holds the same
 * value and still fails, three times over, is garbage - a published block
 * cannot change while its slot names it - and is taken as another key's.
 * Losing to writers for the whole timeout gives HKV_EAGAIN, never a miss.
 */
static int find_cold(struct hkv_client *c, const struct key *k, struct item *it, struct view *v,
		     struct hkv_wr *lead, int nlead)
{
	uint64_t torn[CANON_SLOTS], prev[CANON_SLOTS];
	int nprev = -1, stuck = 0;
	struct retry rt;

	retry_begin(&rt);
	for (;;) {
		struct hkv_wr wrs[4];
		int cand[CANON_SLOTS], ncand = 0, n = 0, ntorn = 0, too_big = 0, ret;

		for (int i = 0; i < nlead; i++)
			wrs[n++] = lead[i];
		nlead = 0; /* the lead requests go out once */
		n = append_bucket_reads(c, wrs, n, k, c->bkt);
		v->seen_ns = hkv_coarse_ns();
		ret = hkv_exec(c, wrs, n);
		if (ret)
			return ret;
		memcpy(v->slot, c->bkt, sizeof(v->slot));
		for (int p = 0; p < CANON_SLOTS; p++)
			if (v->slot[p] && hkv_slot_fp(v->slot[p]) == k->fp && slot_sane(c, v->slot[p]))
				cand[ncand++] = p;
		ret = check_candidates(c, k, it, v, cand, ncand, torn, &ntorn, &too_big);
		if (ret == STALE) { /* stalled between the two READs: look again */
			if (retry_stale(c, &rt))
				return HKV_EAGAIN;
			continue;
		}
		if (ret == HKV_ENOTFOUND && !ntorn && too_big)
			return HKV_ETOOBIG; /* perhaps ours, but larger than this handle's max value */
		if (ret != HKV_ENOTFOUND || !ntorn)
			return ret;
		stuck = same_torn(torn, ntorn, prev, nprev) ? stuck + 1 : 0;
		if (stuck >= 3) {
			c->stats.corrupt_reads += (uint64_t)ntorn;
			return HKV_ENOTFOUND;
		}
		memcpy(prev, torn, (size_t)ntorn * sizeof(torn[0]));
		nprev = ntorn;
		c->stats.op[HKV_OP_GET].retries++;
		if (retry_wait(c, &rt))
			return HKV_EAGAIN;
	}
}

static int find(struct hkv_client *c, const struct key *k, struct item *it, struct view *v)
{
	int ret = find_warm(c, k, it);

	return ret <= 0 ? ret : find_cold(c, k, it, v, NULL, 0);
}

/* ---- publishing --------------------------------------------------------------- */


/* Our block's meta word (from the copy in wblk) in state st. */
static uint64_t our_meta(const struct hkv_client *c, enum hkv_block_state st)
{
	uint64_t m = ((const struct hkv_block_hdr *)c->wblk)->meta;

	return hkv_meta_make(st, hkv_meta_class(m), hkv_meta_gen(m));
}

/* WRITE of the block just built, with its bitmap-bit clear if it was reused. */
static int append_block_write(struct hkv_client *c, struct hkv_wr *wrs, int n, uint64_t slot,
			      uint32_t blen)
{
	wrs[n++] = hkv_wr_write(c, c->wblk, hkv_slot_off(slot), blen);
	return hkv_wr_alloc_clear(c, wrs, n);
}

/* WRITE of just our block's meta word in state st (8 bytes, from atom[4 + st % 2]). */
static struct hkv_wr wr_our_meta(struct hkv_client *c, uint64_t slot, enum hkv_block_state st)
{
	uint64_t *src = &c->atom[4 + (st == HKV_BLK_PENDING)];

	*src = our_meta(c, st);
	return hkv_wr_write(c, src, hkv_slot_off(slot), 8);
}

/*
 * Retiring the entry `old` names: [CAS old meta LIVE->OBSOLETE, CAS slot
 * old->new], results in res[0] and res[1]. Appended to wrs[n]; returns the
 * new n.
 */
static int append_retire(struct hkv_client *c, struct hkv_wr *wrs, int n, const struct item *old,
			 uint64_t new_slot, uint64_t *res)
{
	wrs[n++] = hkv_wr_cas(c, &res[0], old->blk_off, meta_live(old),
			      hkv_meta_make(HKV_BLK_OBSOLETE, old->cls, old->gen));
	wrs[n++] = hkv_wr_cas(c, &res[1], old->slot_off, old->slot, new_slot);
	return n;
}

/*
 * Our slot CAS won although the view was stale: the block the view named
 * had been reused (its meta holds another generation), and the slot had
 * come back to the very value we expected (ABA, after 2048 reuses of the
 * address: only when this thread stopped for longer than the horizon inside
 * the post, after view_fresh). We acted on an entry we never saw: the
 * incarnation g' the slot named (`seen`, what our mark found) is now named
 * by no slot, and our block N is. Undo:
 *
 *  1. Take g' out of everyone's hands: LIVE g' -> CAS its mark (OBSOLETE);
 *     PENDING g' (an insert not yet committed) -> CAS it aborted, so its
 *     inserter's commit fails and it retries. Whoever wins frees g'.
 *  2. A LIVE g' goes back as a copy, whether or not our mark won (its bytes
 *     are g''s while the generation and CRC32C say so): [WRITE copy C, a new
 *     block of ours; CAS slot N -> C]. Never g' itself: a writer with a
 *     current view of g' may have marked it and be about to free it, or -
 *     if we made it LIVE again after putting the slot back - may have swung
 *     the slot on from it as an ordinary race, leaving it named by nobody.
 *  3. No copy (g' not LIVE, rewritten already, no block to be had, or the
 *     slot moved on): N is removed as a delete removes, [CAS N's meta LIVE
 *     -> OBSOLETE|aborted, CAS slot N -> 0], N freed on a won mark. The
 *     key then reads as absent (a spurious delete, never a slot naming a
 *     freed block nor a wrong value).
 *
 * The caller then withdraws N: its CAS finds N already aborted (step 3) or
 * frees N, which no slot names once C is in (step 2).
 */
static int undo_copy(struct hkv_client *c, const struct item *old, uint64_t new_slot,
		     uint64_t seen);
static void withdraw_ours(struct hkv_client *c, uint64_t new_slot, enum hkv_block_state st);

static void undo_stale(struct hkv_client *c, const struct item *old, uint64_t new_slot,
		       uint64_t seen)
{
	struct hkv_block_hdr *w = (struct hkv_block_hdr *)c->wblk;
	uint64_t ours = w->meta, gone = (seen & ~3ull) | HKV_BLK_OBSOLETE;
	enum hkv_block_state st = hkv_meta_state(seen);
	int ours_g = 0, restored = 0;
	struct hkv_wr wrs[2];

	c->stats.stale_undone++;
	hkv_warn("client %u: a write acted on a view older than the ABA horizon (slot 0x%llx); "
		 "undoing it", c->client_id, (unsigned long long)old->slot_off);
	test_point(c, HKV_TP_UNDO_STALE);
	if (hkv_meta_class(seen) < c->g.nclasses &&
	    (hkv_meta_gen(seen) & 0x7ff) == hkv_slot_ver(old->slot) &&
	    (st == HKV_BLK_LIVE || st == HKV_BLK_PENDING)) {
		if (st == HKV_BLK_PENDING)
			gone |= HKV_META_ABORTED;
		wrs[0] = hkv_wr_cas(c, &c->atom[2], old->blk_off, seen, gone);
		if (hkv_exec(c, wrs, 1))
			return;
		ours_g = c->atom[2] == seen;
		if (st == HKV_BLK_LIVE)
			restored = undo_copy(c, old, new_slot, seen);
		if (ours_g)
			hkv_free_block(c, old->blk_off, hkv_meta_class(seen));
	}
	if (!restored && new_slot) { /* step 3: the key goes (N is LIVE, or PENDING for an insert) */
		uint64_t live = hkv_meta_make(HKV_BLK_LIVE, hkv_meta_class(ours), hkv_meta_gen(ours));
		uint64_t pend = hkv_meta_make(HKV_BLK_PENDING, hkv_meta_class(ours), hkv_meta_gen(ours));
		uint64_t dead = (live & ~3ull) | HKV_BLK_OBSOLETE | HKV_META_ABORTED;
		struct hkv_wr rm[3];

		rm[0] = hkv_wr_cas(c, &c->atom[2], hkv_slot_off(new_slot), live, dead);
		rm[1] = hkv_wr_cas(c, &c->atom[3], hkv_slot_off(new_slot), pend, dead);
		rm[2] = hkv_wr_cas(c, &c->atom[6], old->slot_off, new_slot, 0);
		if (!hkv_exec(c, rm, 3) && (c->atom[2] == live || c->atom[3] == pend))
			hkv_free_block(c, hkv_slot_off(new_slot), hkv_slot_class(new_slot));
	}
	w->meta = ours; /* the caller withdraws its own block by this meta */
}

/* Step 2 of undo_stale: 1 if the slot now names a copy of g'. */
static int undo_copy(struct hkv_client *c, const struct item *old, uint64_t new_slot,
		     uint64_t seen)
{
	uint32_t cls = hkv_meta_class(seen), len = c->g.class_size[cls], gen = 0;
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)c->rblk;
	struct hkv_block_hdr *w = (struct hkv_block_hdr *)c->wblk;
	uint64_t copy, off = 0;
	struct hkv_wr wrs[3];
	int n = 0;

	if (!new_slot || len > c->read_cap || len > c->max_block)
		return 0;
	/* (the block for C first: allocating may read into rblk) */
	if (hkv_alloc_block(c, cls, &off, &gen))
		return 0;
	wrs[0] = hkv_wr_read(c, c->rblk, old->blk_off, len);
	if (hkv_exec(c, wrs, 1) || hkv_meta_gen(h->meta) != hkv_meta_gen(seen) ||
	    (h->meta & HKV_META_ABORTED) ||
	    hkv_block_check(&c->g, c->rblk, len, c->rblk + HKV_BLOCK_HDR, h->klen)) {
		hkv_unalloc_block(c, off, cls); /* g' rewritten already: no copy to make */
		return 0;
	}
	memcpy(c->wblk, c->rblk, HKV_BLOCK_HDR + (size_t)h->klen + h->vlen);
	w->meta = hkv_meta_make(HKV_BLK_LIVE, cls, gen);
	w->crc = hkv_block_crc(w, c->wblk + HKV_BLOCK_HDR);
	copy = hkv_slot_make(hkv_slot_fp(old->slot), cls, gen, off);
	wrs[n++] = hkv_wr_write(c, c->wblk, off, HKV_BLOCK_HDR + h->klen + h->vlen);
	n = hkv_wr_alloc_clear(c, wrs, n);
	wrs[n++] = hkv_wr_cas(c, &c->atom[3], old->slot_off, new_slot, copy);
	if (hkv_exec(c, wrs, n))
		return 0;
	if (c->atom[3] == new_slot)
		return 1;
	withdraw_ours(c, copy, HKV_BLK_LIVE); /* the slot moved on: C goes */
	return 0;
}

/*
 * After an append_retire() pair ran (new_slot is what the slot CAS wrote):
 * the writer whose mark took the block LIVE -> OBSOLETE frees it. 0 when
 * the slot swung from a current view; CONFLICT when it did not swing; STALE
 * when it swung from a stale view and was undone (undo_stale).
 *
 * The slot CAS can win without our mark in two ways, told apart exactly by
 * the meta word the mark saw: the same generation (another writer marked the
 * same incarnation first and its slot CAS lost to ours: our view was
 * current, the block is theirs to free), or another generation (the block
 * was freed and reused, so the slot had left the incarnation we saw and came
 * back to the same value: our view was stale, whatever it names now is not
 * what we saw).
 */
static int retire_outcome(struct hkv_client *c, const struct item *old, const uint64_t *res,
			  uint64_t new_slot)
{
	int marked = res[0] == meta_live(old);

	if (marked)
		hkv_free_block(c, old->blk_off, old->cls);
	if (res[1] != old->slot)
		return CONFLICT;
	if (!marked && hkv_meta_gen(res[0]) != old->gen) {
		undo_stale(c, old, new_slot, res[0]);
		return STALE;
	}
	return 0;
}

/* Withdraw our new block (published nowhere: its slot CAS lost or was
 * undone): meta -> OBSOLETE|aborted, the winner of that CAS frees it. */
static void withdraw_ours(struct hkv_client *c, uint64_t new_slot, enum hkv_block_state st)
{
	uint64_t was = our_meta(c, st);
	struct hkv_wr wr = hkv_wr_cas(c, &c->atom[2], hkv_slot_off(new_slot), was,
				      our_meta(c, HKV_BLK_OBSOLETE) | HKV_META_ABORTED);

	if (!hkv_exec(c, &wr, 1) && c->atom[2] == was)
		hkv_free_block(c, hkv_slot_off(new_slot), hkv_slot_class(new_slot));
}

/*
 * [WRITE new block | WRITE its meta LIVE, CAS old meta LIVE->OBSOLETE, CAS
 * slot old->new]; new_slot 0 (and no write) removes. 0 when the slot swung,
 * CONFLICT (our block is still ours, unreferenced), STALE (the view was too
 * old to act on: nothing was posted; or a stale swing was undone, and then
 * our block is withdrawn: YIELDED), or <0. Without with_write the block went
 * out earlier (with a cold find) and may have been left PENDING by an insert
 * attempt: its meta is set LIVE first, in the same chain, before the slot
 * can name it.
 *
 * Who frees the old block: the one whose mark CAS took it LIVE -> OBSOLETE,
 * exactly one writer per incarnation. It is out of the index either way: our
 * slot CAS removed it, or - if ours failed - the slot no longer names it (a
 * slot naming a block is a function of that block's incarnation, and the
 * view pairs slot and incarnation: docs/design.md, "Views"). A slot that
 * pointed at a block that was not LIVE (garbage, or a block someone else
 * retires) never leads to a free, so nothing is freed twice.
 */
static int publish_replace(struct hkv_client *c, const struct item *old, uint64_t new_slot,
			   uint32_t blen, int with_write)
{
	struct hkv_wr wrs[8];
	int n = 0, ret;

	if (!view_fresh(c, old->seen_ns))
		return STALE;
	if (with_write)
		n = append_block_write(c, wrs, n, new_slot, blen);
	else if (new_slot)
		wrs[n++] = wr_our_meta(c, new_slot, HKV_BLK_LIVE);
	n = append_retire(c, wrs, n, old, new_slot, c->atom);
	c->pub_ns = hkv_coarse_ns();
	ret = hkv_exec(c, wrs, n);
	if (ret)
		return ret;
	ret = retire_outcome(c, old, c->atom, new_slot);
	if (ret == STALE && new_slot) {
		withdraw_ours(c, new_slot, HKV_BLK_LIVE);
		return YIELDED;
	}
	return ret;
}

/*
 * [READ header?, CAS meta LIVE->OBSOLETE, CAS slot old->0]: 0, CONFLICT,
 * STALE or <0. With hdr, the old block's header is read into it first, in
 * the same chain: what was removed, if the removal won.
 */
static int publish_remove(struct hkv_client *c, const struct item *old,
			  struct hkv_block_hdr *hdr)
{
	struct hkv_wr wrs[3];
	int n = 0, ret;

	if (!view_fresh(c, old->seen_ns))
		return STALE;
	if (hdr)
		wrs[n++] = hkv_wr_read(c, hdr, old->blk_off, HKV_BLOCK_HDR);
	n = append_retire(c, wrs, n, old, 0, c->atom);
	ret = hkv_exec(c, wrs, n);
	return ret ? ret : retire_outcome(c, old, c->atom, 0);
}

static uint32_t now_ms32(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

/*
 * A PENDING entry whose writer stamped it more than the lease ago is
 * abandoned (its writer died between publishing and committing, or stalled):
 * abort it - CAS meta PENDING -> OBSOLETE|ABORTED, so its commit can never
 * land - then take its slot back, and only then, with no slot naming it,
 * free it (the abort's winner frees). The slot value s was read at seen_ns.
 * 0 or <0.
 */
static int abort_stale_pending(struct hkv_client *c, uint64_t slot_off, uint64_t s,
			       const struct hkv_block_hdr *h, uint64_t seen_ns)
{
	uint64_t pend = h->meta, dead = hkv_meta_make(HKV_BLK_OBSOLETE, hkv_meta_class(pend),
						    hkv_meta_gen(pend)) | HKV_META_ABORTED;
	struct hkv_wr wr;
	int ret;

	if (!view_fresh(c, seen_ns))
		return 0; /* look again */
	wr = hkv_wr_cas(c, &c->atom[2], hkv_slot_off(s), pend, dead);
	ret = hkv_exec(c, &wr, 1);
	if (ret || c->atom[2] != pend)
		return ret; /* committed or aborted meanwhile: look again */
	hkv_warn("client %u: aborted an abandoned insert at 0x%llx", c->client_id,
		 (unsigned long long)hkv_slot_off(s));
	test_point(c, HKV_TP_ABORT_SLOT);
	/* Whatever this CAS finds, the slot no longer names the block after it:
	 * the block's insert can neither commit nor publish it anywhere else. */
	wr = hkv_wr_cas(c, &c->atom[2], slot_off, s, 0);
	ret = hkv_exec(c, &wr, 1);
	if (!ret)
		hkv_free_block(c, hkv_slot_off(s), hkv_meta_class(pend));
	return ret;
}

/*
 * The same OBSOLETE entry of our key under an unchanged slot, seen again
 * after the lease: its writer died between marking and swinging the slot
 * (or the region was vandalised). 1 if so.
 */
static int stuck_obsolete(struct hkv_client *c, uint64_t slot_off, uint64_t s)
{
	uint64_t now = hkv_coarse_ns();

	if (c->stuck_slot_off != slot_off || c->stuck_slot != s) {
		c->stuck_slot_off = slot_off;
		c->stuck_slot = s;
		c->stuck_since_ns = now;
		return 0;
	}
	return now - c->stuck_since_ns > (uint64_t)HKV_PENDING_LEASE_MS * 1000000u;
}

/*
 * After our PENDING entry went in at `pos` (and the buckets were re-read into
 * re[]): is there another entry of the key that is, or may still become, its
 * value? A LIVE one, a PENDING one of another inserter, or one being
 * replaced (OBSOLETE, not aborted, its slot unchanged) is a rival; aborted
 * entries, other keys' blocks and garbage under an unchanged slot are not.
 * A slot that changed under us is looked at again. Stale PENDING entries are
 * aborted and stale OBSOLETE ones removed, so a dead writer blocks nobody
 * for longer than the lease. Sets *rival; 0 or <0.
 */
static int find_rival(struct hkv_client *c, const struct key *k, int pos, const uint64_t *re,
		      uint64_t re_seen, int *rival)
{
	uint8_t *blk = c->rblk;

	*rival = 0;
	for (int p = 0; p < CANON_SLOTS; p++) {
		uint64_t s = re[p], soff = slot_off_of(c, k, p), s_seen = re_seen;
		int tries;

		for (tries = 0; tries < 8; tries++) {
			const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
			struct hkv_wr wr;
			uint32_t sz;
			int ret, chk, ours_key;

			if (p == pos || !s || hkv_slot_fp(s) != k->fp || !slot_sane(c, s))
				break;
			sz = c->g.class_size[hkv_slot_class(s)];
			if (sz > c->read_cap)
				sz = (uint32_t)(HKV_BLOCK_HDR + k->len); /* header and key suffice */
			wr = hkv_wr_read(c, blk, hkv_slot_off(s), sz);
			if ((ret = hkv_exec(c, &wr, 1)))
				return ret;
			if (sz == c->g.class_size[hkv_slot_class(s)])
				chk = hkv_block_check(&c->g, blk, sz, k->p, k->len);
			else
				chk = h->klen == k->len && !memcmp(blk + HKV_BLOCK_HDR, k->p, k->len)
					      ? 0 : HKV_ENOTFOUND;
			ours_key = chk == 0 && (hkv_meta_gen(h->meta) & 0x7ff) == hkv_slot_ver(s) &&
				   hkv_meta_class(h->meta) == hkv_slot_class(s);
			if (chk == HKV_ENOTFOUND && (hkv_meta_gen(h->meta) & 0x7ff) == hkv_slot_ver(s))
				break; /* another key's block */
			if (ours_key && hkv_meta_state(h->meta) == HKV_BLK_LIVE) {
				*rival = 1;
				return 0;
			}
			if (ours_key && hkv_meta_state(h->meta) == HKV_BLK_PENDING) {
				if ((int32_t)(now_ms32() - h->atime) <= HKV_PENDING_LEASE_MS) {
					*rival = 1;
					return 0;
				}
				if ((ret = abort_stale_pending(c, soff, s, h, s_seen)))
					return ret;
			}
			/* OBSOLETE, aborted, torn, reused or garbage: the slot decides */
			wr = hkv_wr_read(c, &c->atom[3], soff, 8);
			s_seen = hkv_coarse_ns();
			if ((ret = hkv_exec(c, &wr, 1)))
				return ret;
			if (c->atom[3] != s) {
				s = c->atom[3];
				continue;
			}
			if (ours_key && hkv_meta_state(h->meta) == HKV_BLK_OBSOLETE &&
			    !(h->meta & HKV_META_ABORTED)) {
				if (!stuck_obsolete(c, soff, s)) {
					*rival = 1; /* being replaced or removed right now */
					return 0;
				}
				wr = hkv_wr_cas(c, &c->atom[3], soff, s, 0);
				if ((ret = hkv_exec(c, &wr, 1)))
					return ret;
				s = c->atom[3] == s ? 0 : c->atom[3];
				continue;
			}
			/* An aborted insert whose slot stays: its aborter stopped or
			 * died before taking the slot back. Take the slot (only the
			 * slot: the aborter frees the block once its own slot CAS has
			 * run, whatever it finds; if it died, the block is lost). */
			if (ours_key && (h->meta & HKV_META_ABORTED) && stuck_obsolete(c, soff, s)) {
				wr = hkv_wr_cas(c, &c->atom[3], soff, s, 0);
				if ((ret = hkv_exec(c, &wr, 1)))
					return ret;
			}
			break; /* an unchanged slot naming a dead block: no value of anyone's */
		}
		if (tries == 8) { /* it keeps changing: someone is busy with the key */
			*rival = 1;
			return 0;
		}
	}
	return 0;
}

/*
 * Insert: [WRITE our meta PENDING, CAS empty slot 0->new, READ b1, READ b2],
 * then find_rival over the re-read, then [CAS our meta PENDING->LIVE]: the
 * commit, this insert's linearization point. Until it, readers take the
 * entry as absent. Two inserters of one key cannot both commit: the later of
 * the two slot CASes is followed by a re-read that sees the earlier entry
 * (PENDING or LIVE), so that inserter yields. With a rival we withdraw
 * ([CAS slot new->0, CAS meta PENDING->OBSOLETE|ABORTED]) and the caller
 * starts over with a fresh block.
 *
 * 0 committed, CONFLICT (the slot was taken: look again; our block is still
 * ours, unreferenced), YIELDED (our block is withdrawn and freed), <0.
 */
static int publish_insert(struct hkv_client *c, const struct key *k, int pos, uint64_t new_slot,
			  const struct item *victim)
{
	uint64_t *re = (uint64_t *)(c->bkt + 2 * HKV_BUCKET_SIZE);
	uint64_t soff = slot_off_of(c, k, pos), pend = our_meta(c, HKV_BLK_PENDING);
	uint64_t dead = our_meta(c, HKV_BLK_OBSOLETE) | HKV_META_ABORTED;
	uint64_t expect = victim ? victim->slot : 0, re_seen;
	struct hkv_wr wrs[5];
	int ret, rival, n = 0;

	if (victim && !view_fresh(c, victim->seen_ns))
		return STALE;
	wrs[n++] = wr_our_meta(c, new_slot, HKV_BLK_PENDING);
	if (victim) /* cache mode, both buckets full: take over an evicted entry's slot */
		n = append_retire(c, wrs, n, victim, new_slot, c->atom);
	else
		wrs[n++] = hkv_wr_cas(c, &c->atom[1], soff, 0, new_slot);
	n = append_bucket_reads(c, wrs, n, k, re);
	c->pub_ns = re_seen = hkv_coarse_ns();
	if ((ret = hkv_exec(c, wrs, n)))
		return ret;
	if (victim) {
		int marked = c->atom[0] == meta_live(victim);

		ret = retire_outcome(c, victim, c->atom, new_slot);
		if (ret == STALE) { /* undone: our PENDING block is named nowhere */
			withdraw_ours(c, new_slot, HKV_BLK_PENDING);
			return YIELDED;
		}
		if (!ret && marked)
			c->stats.evictions++;
	}
	if (c->atom[1] != expect)
		return CONFLICT;
	if ((ret = find_rival(c, k, pos, re, re_seen, &rival)))
		return ret;
	if (!rival) {
		wrs[0] = hkv_wr_cas(c, &c->atom[0], hkv_slot_off(new_slot), pend,
				    our_meta(c, HKV_BLK_LIVE));
		if ((ret = hkv_exec(c, wrs, 1)))
			return ret;
		if (c->atom[0] == pend)
			return 0;
		/* aborted as abandoned (we stalled past the lease): the aborter
		 * frees the block and takes the slot back */
		return YIELDED;
	}
	wrs[0] = hkv_wr_cas(c, &c->atom[1], soff, new_slot, 0);
	wrs[1] = hkv_wr_cas(c, &c->atom[0], hkv_slot_off(new_slot), pend, dead);
	if ((ret = hkv_exec(c, wrs, 2)))
		return ret;
	if (c->atom[0] == pend)
		hkv_free_block(c, hkv_slot_off(new_slot), hkv_slot_class(new_slot));
	return YIELDED;
}

/* ---- building blocks ---------------------------------------------------------- */

struct value {
	const void *p1, *p2; /* value = p1 . p2 */
	size_t l1, l2;
	uint32_t flags, exptime;
};

static int evict(struct hkv_client *c, uint32_t cls);
static int reassign_segment(struct hkv_client *c, uint32_t cls);

static int cache_mode(const struct hkv_client *c)
{
	return !!(c->g.flags & HKV_GEOM_F_CACHE);
}

/*
 * Fill the new block in wblk, then allocate it; sets *slot (to publish) and
 * *blen. The value is copied before allocating: in cache mode a full class
 * evicts (evict() reads into rblk, where a modify's old value may live).
 */
static int fill_block(struct hkv_client *c, const struct key *k, const struct value *v,
		      uint64_t *slot, uint32_t *blen)
{
	struct hkv_block_hdr *h = (struct hkv_block_hdr *)c->wblk;
	size_t vlen = v->l1 + v->l2, total = HKV_BLOCK_HDR + k->len + vlen;
	uint64_t off;
	uint32_t gen;
	int cls, ret;

	if (vlen > c->max_value || total > c->max_block)
		return HKV_ETOOBIG;
	cls = hkv_class_for(&c->g, (uint32_t)total);
	if (cls < 0)
		return HKV_ETOOBIG;
	memset(h, 0, sizeof(*h));
	h->vlen = (uint32_t)vlen;
	h->flags = v->flags;
	h->klen = k->len;
	h->exptime = v->exptime;
	memcpy(c->wblk + HKV_BLOCK_HDR, k->p, k->len);
	if (v->l1)
		memmove(c->wblk + HKV_BLOCK_HDR + k->len, v->p1, v->l1);
	if (v->l2)
		memmove(c->wblk + HKV_BLOCK_HDR + k->len + v->l1, v->p2, v->l2);
	for (int waits = 0;; waits++) {
		ret = hkv_alloc_block(c, (uint32_t)cls, &off, &gen);
		for (int round = 0, empty = 0; ret == HKV_EFULL && cache_mode(c) && round < 64;
		     round++) {
			int n = evict(c, (uint32_t)cls);

			if (n < 0)
				return n;
			empty = n ? 0 : empty + 1;
			if (empty >= 4) { /* nothing of ours in this class to evict */
				if ((ret = reassign_segment(c, (uint32_t)cls)))
					break;
				empty = 0;
			}
			ret = hkv_alloc_block(c, (uint32_t)cls, &off, &gen);
		}
		if (ret != HKV_EFULL || waits == 8)
			break;
		/* store mode: a wholly free segment of ours in another class */
		if (!cache_mode(c) && (ret = hkv_alloc_take_free_own(c, (uint32_t)cls)) != HKV_EFULL) {
			if (ret)
				break;
			continue;
		}
		/* nothing of ours to use: wait for other clients' segments to go idle */
		if ((ret = hkv_alloc_wait_idle(c)))
			break;
	}
	if (ret)
		return ret;
	if (cache_mode(c)) {
		struct hkv_class_alloc *ca = &c->classes[cls];

		/* evict ahead: blocks freed now are out of quarantine when needed */
		if (ca->pressure && ca->tail - ca->head + ca->evict_pending < 2 * EVICT_BATCH &&
		    (ret = evict(c, (uint32_t)cls)) < 0) {
			hkv_unalloc_block(c, off, (uint32_t)cls);
			return ret;
		}
	}
	h->meta = hkv_meta_make(HKV_BLK_LIVE, (uint32_t)cls, gen);
	h->atime = now_ms32();
	h->crc = hkv_block_crc(h, c->wblk + HKV_BLOCK_HDR);
	*slot = hkv_slot_make(k->fp, (uint32_t)cls, gen, off);
	*blen = (uint32_t)total;
	return 0;
}

/*
 * fill_block() for a write of key k. Making room never takes the block at
 * `keep` (the item the write rewrites: 0 when unknown) nor moves its
 * segment; if it evicts k itself, c->op_key_evicted says so (store() then
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


/* ---- cache mode: recency and eviction ------------------------------------------ */

/*
 * Record an access in the block's atime, off the critical path: one CAS on
 * the exptime|atime word that expects exactly what we read, posted
 * unsignaled - nothing waits for it. If the block was retired and reused
 * meanwhile, the word differs and the CAS does nothing.
 */
static void touch_atime(struct hkv_client *c, const struct item *it)
{
	const struct hkv_block_hdr *h = item_hdr(it);
	uint32_t now;
	uint64_t was, now_word;
	struct hkv_wr wr;

	/* The CAS expects exactly the word read at seen_ns; posted only soon
	 * after, so the block is still the one read (docs/design.md, "Cache mode") */
	if (!cache_mode(c) || c->readonly || hkv_now_ns() - it->seen_ns > ATIME_FRESH_NS)
		return;
	now = now_ms32();
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

		if (key_init(c, &key[i], v[i].hdr + HKV_BLOCK_HDR, h->klen))
			return 0; /* not a key: evict_offs checked the length */
		append_bucket_reads(c, wrs, 2 * i, &key[i], bkts + i * 2 * HKV_BUCKET_SLOTS);
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
			it[n] = (struct item){.slot_off = slot_off_of(c, &key[i], p), .slot = sl[p],
					      .blk_off = v[i].off, .cls = cls,
					      .gen = hkv_meta_gen(h->meta), .seen_ns = v[i].seen_ns};
			hkv_cache_drop(c->cache, key[i].h);
			append_retire(c, wrs, 2 * n, &it[n], 0, &c->atom[8 + 2 * n]);
			own[n++] = i;
			break;
		}
	}
	if (!n || !view_fresh(c, v[0].seen_ns)) /* headers and buckets: one view */
		return 0;
	if ((ret = hkv_exec(c, wrs, 2 * n)))
		return ret;
	for (int i = 0; i < n; i++) { /* replaced or removed meanwhile: not an eviction */
		int ok = retire_outcome(c, &it[i], &c->atom[8 + 2 * i], 0) == 0;

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
	uint32_t now_ms = now_ms32(), now_s = now_unix();
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
		key_init(c, &key[nk], c->rblk + (size_t)i * EVICT_READ + HKV_BLOCK_HDR, h->klen);
		append_bucket_reads(c, wrs, 2 * nk, &key[nk], bkts + nk * 2 * HKV_BUCKET_SLOTS);
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
static int evict(struct hkv_client *c, uint32_t cls)
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
static int reassign_segment(struct hkv_client *c, uint32_t cls)
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
static int pick_victim_slot(struct hkv_client *c, const struct key *k, const struct view *view,
			    struct item *victim)
{
	uint32_t now_ms = now_ms32(), now_s = now_unix();
	struct hkv_wr wrs[CANON_SLOTS];
	int pos[CANON_SLOTS], n = 0, best = -1;
	int64_t best_score = INT64_MAX;

	for (int p = 0; p < CANON_SLOTS; p++) {
		/* never an entry that may be this key's own (an ADD must not evict
		 * the rival it races with and then commit beside it) */
		if (!slot_sane(c, view->slot[p]) || hkv_slot_fp(view->slot[p]) == k->fp)
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
	*victim = (struct item){.slot_off = slot_off_of(c, k, pos[best]),
				.slot = view->slot[pos[best]],
				.blk_off = hkv_slot_off(view->slot[pos[best]]),
				.cls = hkv_slot_class(view->slot[pos[best]]),
				.gen = hkv_meta_gen(((const struct hkv_block_hdr *)(c->rblk +
										 (size_t)best * 64))->meta),
				.seen_ns = view->seen_ns};
	return pos[best];
}

/* ---- stores ------------------------------------------------------------------ */

enum store_mode { STORE_SET, STORE_ADD, STORE_REPLACE, STORE_CAS };

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
static struct item item_of_loc(const struct hkv_loc *loc)
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
	struct hkv_loc lc, *loc = cache_get(c, k, &lc, 1);
	struct item old;
	int ret;

	if (!loc || !loc_fits_key(c, loc, k))
		return NO_CACHE;
	old = item_of_loc(loc);
	*slot_off = loc->slot_addr;
	ret = publish_replace(c, &old, slot, blen, 1);
	if (ret > 0)
		hkv_cache_drop(c->cache, k->h);
	return ret;
}

/* The new block is in the index at slot_off (since the chain posted at
 * c->pub_ns): remember where. */
static void stored(struct hkv_client *c, const struct key *k, uint64_t slot, uint64_t slot_off)
{
	struct item it;

	item_from_block(&it, c->wblk, slot_off, slot, -1, c->pub_ns);
	remember(c, k, &it);
}

/* One attempt of the cold path; sets *slot_off on success. */
static int store_cold(struct hkv_client *c, const struct key *k, enum store_mode mode,
		      uint64_t version, uint64_t slot, uint32_t blen, int *written,
		      uint64_t *slot_off)
{
	struct hkv_wr lead[2];
	struct item it;
	struct view view;
	int ret, pos, nlead = *written ? 0 : append_block_write(c, lead, 0, slot, blen);

	ret = find_cold(c, k, &it, &view, lead, nlead);
	*written = 1; /* the new block went out with the bucket reads */
	if (ret && ret != HKV_ENOTFOUND)
		return ret;
	if (!ret && !item_expired(&it)) {
		/* there again: a later absence is someone's delete, not our eviction */
		c->op_key_evicted = 0;
		if (mode == STORE_ADD)
			return HKV_EEXISTS;
		if (mode == STORE_CAS && item_version(&it) != version)
			return HKV_EVERSION;
		*slot_off = it.slot_off;
		test_point(c, HKV_TP_STORE_PUBLISH);
		return publish_replace(c, &it, slot, blen, 0);
	}
	if (mode == STORE_REPLACE || mode == STORE_CAS)
		return HKV_ENOTFOUND;
	if (!ret) { /* expired: take its place */
		*slot_off = it.slot_off;
		return publish_replace(c, &it, slot, blen, 0);
	}
	pos = pick_empty(&view);
	if (pos < 0 && cache_mode(c)) {
		struct item victim;

		pos = pick_victim_slot(c, k, &view, &victim);
		if (pos >= 0) {
			*slot_off = slot_off_of(c, k, pos);
			return publish_insert(c, k, pos, slot, &victim);
		}
	}
	if (pos < 0)
		return HKV_EFULL;
	*slot_off = slot_off_of(c, k, pos);
	return publish_insert(c, k, pos, slot, NULL);
}

static int store(struct hkv_client *c, const struct key *k, enum store_mode mode,
		 const struct value *v, uint64_t version)
{
	uint64_t slot, slot_off = 0, keep = 0;
	struct hkv_loc lc;
	struct retry rt;
	uint32_t blen;
	int ret, written = 0;

	if ((mode == STORE_CAS || mode == STORE_REPLACE) && cache_get(c, k, &lc, 0) &&
	    lc.key_ok == 1)
		keep = hkv_slot_off(lc.slot); /* keep the item it acts on */
	c->op_key_evicted = 0;
	ret = build_block(c, k, v, keep, &slot, &blen);
	if (ret)
		return ret;
	ret = mode == STORE_SET ? store_warm(c, k, slot, blen, &slot_off) : NO_CACHE;
	if (ret == NO_CACHE && mode == STORE_SET) {
		struct item it;

		/* An old cache entry, or one whose key is too long to keep in it, is
		 * confirmed by one block READ (LIVE with its generation and our key
		 * means the slot holds exactly that value now), which is cheaper
		 * than a cold find. */
		if (find_warm(c, k, &it) == 0) {
			slot_off = it.slot_off;
			ret = publish_replace(c, &it, slot, blen, 1);
			if (ret > 0)
				hkv_cache_drop(c->cache, k->h);
		}
	}
	written = ret == CONFLICT;
	retry_begin(&rt);
	while (ret > 0) {
		if (ret == CONFLICT || ret == YIELDED || ret == STALE) {
			c->stats.op[mode == STORE_SET ? HKV_OP_SET : HKV_OP_ADD].retries++;
			/* (YIELDED: a stale swing undone - a stall, like STALE) */
			if (ret == STALE || ret == YIELDED ? retry_stale(c, &rt) : retry_wait(c, &rt)) {
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

/* Builds the new value of an item from the old one into *v (may use scratch). */
typedef int (*rmw_fn)(struct hkv_client *c, const struct item *old, struct value *v, void *arg);

/* Find the key, derive its new value, publish it in place of the old; retry on races. */
static int modify(struct hkv_client *c, const struct key *k, rmw_fn fn, void *arg,
		  enum hkv_op op)
{
	struct retry rt;

	retry_begin(&rt);
	for (int attempt = 0;; attempt++) {
		struct value v;
		struct item it;
		struct view view;
		uint64_t slot;
		uint32_t blen;
		int ret = attempt ? find_cold(c, k, &it, &view, NULL, 0) : find(c, k, &it, &view);

		if (ret)
			return ret;
		if (item_expired(&it))
			return HKV_ENOTFOUND;
		ret = fn(c, &it, &v, arg);
		if (!ret) /* making room never takes the item itself */
			ret = build_block(c, k, &v, it.blk_off, &slot, &blen);
		if (ret)
			return ret;
		/* However long the building took (allocation, eviction) or this
		 * thread was stopped, publish_replace acts on the view only while
		 * it is young (STALE: nothing posted, find again). */
		test_point(c, HKV_TP_MODIFY_PUBLISH);
		ret = publish_replace(c, &it, slot, blen, 1);
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
		if (ret == STALE || ret == YIELDED ? retry_stale(c, &rt) : retry_wait(c, &rt))
			return HKV_EAGAIN;
	}
}

struct incr_arg {
	uint64_t delta, result;
	int decr;
	char digits[24];
};

static int parse_u64(const uint8_t *p, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;

	while (len && p[len - 1] == ' ') /* memcached may pad a decremented value */
		len--;
	if (!len || len > 20)
		return HKV_ENOTNUM;
	for (; i < len; i++) {
		if (p[i] < '0' || p[i] > '9' || v > (UINT64_MAX - (uint64_t)(p[i] - '0')) / 10)
			return HKV_ENOTNUM;
		v = v * 10 + (uint64_t)(p[i] - '0');
	}
	*out = v;
	return 0;
}

static int incr_fn(struct hkv_client *c, const struct item *old, struct value *v, void *arg)
{
	struct incr_arg *a = arg;
	const struct hkv_block_hdr *h = item_hdr(old);
	uint64_t cur;
	int ret = parse_u64(old->blk + HKV_BLOCK_HDR + h->klen, h->vlen, &cur);

	if (ret)
		return ret;
	if (a->decr)
		a->result = a->delta > cur ? 0 : cur - a->delta;
	else
		a->result = cur + a->delta; /* wraps at 2^64, as memcached does */
	*v = (struct value){.p1 = a->digits, .flags = h->flags, .exptime = h->exptime};
	v->l1 = (size_t)snprintf(a->digits, sizeof(a->digits), "%llu",
				 (unsigned long long)a->result);
	return 0;
}

struct append_arg {
	const void *data;
	size_t len;
	int prepend;
};

static int append_fn(struct hkv_client *c, const struct item *old, struct value *v, void *arg)
{
	struct append_arg *a = arg;
	const struct hkv_block_hdr *h = item_hdr(old);
	const uint8_t *oldv = old->blk + HKV_BLOCK_HDR + h->klen;

	*v = (struct value){.flags = h->flags, .exptime = h->exptime};
	v->p1 = a->prepend ? a->data : oldv;
	v->l1 = a->prepend ? a->len : h->vlen;
	v->p2 = a->prepend ? oldv : a->data;
	v->l2 = a->prepend ? h->vlen : a->len;
	return 0;
}

static int touch_fn(struct hkv_client *c, const struct item *old, struct value *v, void *arg)
{
	const struct hkv_block_hdr *h = item_hdr(old);

	*v = (struct value){.p1 = old->blk + HKV_BLOCK_HDR + h->klen, .l1 = h->vlen,
			    .flags = h->flags, .exptime = *(uint32_t *)arg};
	return 0;
}

/* ---- public operations ---------------------------------------------------------- */

/* Start of every operation: the key is valid and the handle connected; its
 * hash is the region's (a reconnect may have found another region). */
static int key_ready(struct hkv_client *c, struct key *k, const void *key, size_t klen)
{
	uint64_t was = c->stats.reconnects;
	int ret = key_init(c, k, key, klen);

	if (!ret)
		ret = hkv_revive(c);
	if (!ret && c->stats.reconnects != was)
		ret = key_init(c, k, key, klen);
	return ret;
}

static void op_begin(struct hkv_client *c, struct op_scope *s, enum hkv_op op)
{
	s->before = c->conn->stats;
	s->op = op;
}

static int op_end(struct hkv_client *c, const struct op_scope *s, int ret)
{
	struct hkv_op_stats *o = &c->stats.op[s->op];
	const struct hkv_conn_stats *now = &c->conn->stats;

	o->count++;
	o->round_trips += now->round_trips - s->before.round_trips;
	o->bytes_read += now->bytes_read - s->before.bytes_read;
	o->bytes_written += now->bytes_written - s->before.bytes_written;
	return ret;
}

static void fill_info(const struct item *it, struct hkv_item_info *info)
{
	if (!info)
		return;
	info->version = item_version(it);
	info->flags = item_hdr(it)->flags;
	info->exptime = item_hdr(it)->exptime;
}

HKV_EXPORT int hkv_get(struct hkv_client *c, const void *key, size_t klen, void *buf, size_t cap,
		       size_t *vlen, struct hkv_item_info *info)
{
	HKV_ROUTE_READ(c, key, klen, hkv_get(c, key, klen, buf, cap, vlen, info));
	struct op_scope sc;
	struct item it;
	struct view view;
	struct key k;
	int ret = key_ready(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, HKV_OP_GET);
	ret = find(c, &k, &it, &view);
	if (!ret && item_expired(&it)) {
		/* a miss; reclaim its memory now (one round trip, expired hits only) */
		if (!c->readonly && it.state == HKV_BLK_LIVE && publish_remove(c, &it, NULL) == 0)
			c->stats.expired_reclaimed++;
		hkv_cache_drop(c->cache, k.h);
		ret = HKV_ENOTFOUND;
	} else if (!ret) {
		touch_atime(c, &it);
	}
	if (!ret) {
		const struct hkv_block_hdr *h = item_hdr(&it);

		*vlen = h->vlen;
		if (h->vlen > cap)
			ret = -ENOSPC;
		else if (h->vlen)
			memcpy(buf, it.blk + HKV_BLOCK_HDR + h->klen, h->vlen);
		fill_info(&it, info);
	}
	return op_end(c, &sc, ret);
}

/* Start of every write: the key is valid and this handle may write. */
static int write_key(struct hkv_client *c, struct key *k, const void *key, size_t klen)
{
	int ret = key_ready(c, k, key, klen);

	return ret ? ret : c->readonly ? -EPERM : 0;
}

static int store_op(struct hkv_client *c, const void *key, size_t klen, const void *val,
		    size_t vlen, const struct hkv_write_opts *opts, enum store_mode mode,
		    uint64_t version, enum hkv_op op)
{
	HKV_ROUTE(c, key, klen, store_op(c, key, klen, val, vlen, opts, mode, version, op));
	struct value v = {.p1 = val, .l1 = vlen};
	struct op_scope sc;
	struct key k;
	int ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	if (vlen && !val)
		return -EINVAL;
	if (opts) {
		v.flags = opts->flags;
		v.exptime = abs_exptime(opts->exptime);
	}
	op_begin(c, &sc, op);
	return op_end(c, &sc, store(c, &k, mode, &v, version));
}

HKV_EXPORT int hkv_set(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, const struct hkv_write_opts *opts)
{
	return store_op(c, key, klen, val, vlen, opts, STORE_SET, 0, HKV_OP_SET);
}

HKV_EXPORT int hkv_add(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, const struct hkv_write_opts *opts)
{
	return store_op(c, key, klen, val, vlen, opts, STORE_ADD, 0, HKV_OP_ADD);
}

HKV_EXPORT int hkv_replace(struct hkv_client *c, const void *key, size_t klen, const void *val,
			   size_t vlen, const struct hkv_write_opts *opts)
{
	return store_op(c, key, klen, val, vlen, opts, STORE_REPLACE, 0, HKV_OP_REPLACE);
}

HKV_EXPORT int hkv_cas(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, uint64_t version, const struct hkv_write_opts *opts)
{
	return store_op(c, key, klen, val, vlen, opts, STORE_CAS, version, HKV_OP_CAS);
}

static int modify_op(struct hkv_client *c, const void *key, size_t klen, rmw_fn fn, void *arg,
		     enum hkv_op op)
{
	HKV_ROUTE(c, key, klen, modify_op(c, key, klen, fn, arg, op));
	struct op_scope sc;
	struct key k;
	int ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, op);
	return op_end(c, &sc, modify(c, &k, fn, arg, op));
}

HKV_EXPORT int hkv_append(struct hkv_client *c, const void *key, size_t klen, const void *val,
			  size_t vlen, int prepend)
{
	struct append_arg a = {.data = val, .len = vlen, .prepend = prepend};

	if (vlen && !val)
		return -EINVAL;
	return modify_op(c, key, klen, append_fn, &a, HKV_OP_APPEND);
}

static int incr_op(struct hkv_client *c, const void *key, size_t klen, uint64_t delta,
		   uint64_t *result, int decr)
{
	struct incr_arg a = {.delta = delta, .decr = decr};
	int ret = modify_op(c, key, klen, incr_fn, &a, HKV_OP_INCR);

	if (!ret && result)
		*result = a.result;
	return ret;
}

HKV_EXPORT int hkv_incr(struct hkv_client *c, const void *key, size_t klen, uint64_t delta,
			uint64_t *result)
{
	return incr_op(c, key, klen, delta, result, 0);
}

HKV_EXPORT int hkv_decr(struct hkv_client *c, const void *key, size_t klen, uint64_t delta,
			uint64_t *result)
{
	return incr_op(c, key, klen, delta, result, 1);
}

HKV_EXPORT int hkv_touch(struct hkv_client *c, const void *key, size_t klen, int64_t exptime)
{
	uint32_t e = abs_exptime(exptime);

	return modify_op(c, key, klen, touch_fn, &e, HKV_OP_TOUCH);
}

static int delete_once(struct hkv_client *c, const struct key *k, int warm)
{
	struct hkv_loc lc, *loc = warm ? cache_get(c, k, &lc, 1) : NULL;
	struct item it;
	struct view view;
	int ret, expired;

	if (loc && loc_fits_key(c, loc, k)) {
		struct hkv_block_hdr *h = (struct hkv_block_hdr *)c->rblk;

		/* an entry of this very key: the header read just before the mark is
		 * the removed item's, so its expiry decides the answer (when the
		 * mark was ours; else the marker's removal is the one that counts) */
		it = item_of_loc(loc);
		hkv_cache_drop(c->cache, k->h);
		ret = publish_remove(c, &it, h);
		if (ret || c->atom[0] != meta_live(&it))
			return ret;
		return h->exptime && h->exptime <= now_unix() ? HKV_ENOTFOUND : 0;
	}
	/* no entry to act on blind: find the key (its block READ confirms it) */
	ret = warm ? find(c, k, &it, &view) : find_cold(c, k, &it, &view, NULL, 0);
	if (ret)
		return ret;
	expired = item_expired(&it);
	hkv_cache_drop(c->cache, k->h);
	ret = publish_remove(c, &it, NULL);
	return ret == 0 && expired ? HKV_ENOTFOUND : ret;
}

HKV_EXPORT int hkv_delete(struct hkv_client *c, const void *key, size_t klen)
{
	HKV_ROUTE(c, key, klen, hkv_delete(c, key, klen));
	struct retry rt;
	struct op_scope sc;
	struct key k;
	int ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, HKV_OP_DELETE);
	retry_begin(&rt);
	ret = delete_once(c, &k, 1);
	while (ret == CONFLICT || ret == STALE) {
		c->stats.op[HKV_OP_DELETE].retries++;
		if ((ret = ret == STALE ? retry_stale(c, &rt) : retry_wait(c, &rt)))
			break;
		ret = delete_once(c, &k, 0);
	}
	return op_end(c, &sc, ret);
}

/* A block read for a multi-get item: keep it if it is still the key's. */
static void mget_take(struct hkv_client *c, struct hkv_mget_item *m, const struct hkv_loc *loc,
		      uint8_t *blk)
{
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
	struct item it;

	if (!loc_block_current(c, loc, blk, m->key, (uint16_t)m->klen))
		return; /* stale: the single-key path will find it */
	item_from_block(&it, blk, loc->slot_addr, loc->slot, -1, 0);
	m->vlen = h->vlen;
	m->status = item_expired(&it) ? HKV_ENOTFOUND : h->vlen > m->cap ? -ENOSPC : 0;
	if (!m->status)
		memcpy(m->buf, blk + HKV_BLOCK_HDR + h->klen, h->vlen);
	fill_info(&it, &m->info);
}

/*
 * Multi-get: the keys with a usable cached location are read in one chain
 * (one round trip for all of them); the rest, and any whose block turned out
 * stale, take the single-key path.
 */
/* Build the chain for the items from *i on (statuses set: CONFLICT = to
 * read, by this chain or, if not in it, by a single get afterwards). */
static void mget_build(struct hkv_client *c, struct hkv_mget_item *items, size_t n, size_t *i,
		       struct mget_chain *ch)
{
	size_t used = 0;

	ch->nw = 0;
	ch->first = *i;
	for (; *i < n && ch->nw < 32; (*i)++) {
		struct hkv_loc *loc = &ch->locs[ch->nw];
		struct key k;

		items[*i].status = key_init(c, &k, items[*i].key, items[*i].klen);
		if (items[*i].status)
			continue;
		items[*i].status = CONFLICT; /* not read yet */
		if (!cache_get(c, &k, loc, 0) || !slot_sane(c, loc->slot) || loc->blen > c->read_cap)
			continue;
		if (ch->nw && used + loc->blen + 64 > c->read_cap)
			break;
		ch->idx[ch->nw] = *i;
		ch->offs[ch->nw] = used;
		ch->wrs[ch->nw] = hkv_wr_read(c, c->rblk + used, hkv_slot_off(loc->slot), loc->blen);
		used += (loc->blen + 63) & ~(size_t)63; /* keep headers aligned */
		ch->nw++;
	}
	ch->end = *i;
}

/* The chain's READs have completed: take what they read; the rest one by one. */
static void mget_take_chain(struct hkv_client *c, struct hkv_mget_item *items,
			    const struct mget_chain *ch)
{
	for (int w = 0; w < ch->nw; w++)
		mget_take(c, &items[ch->idx[w]], &ch->locs[w], c->rblk + ch->offs[w]);
	for (size_t j = ch->first; j < ch->end; j++)
		if (items[j].status == CONFLICT)
			items[j].status = hkv_get(c, items[j].key, items[j].klen, items[j].buf,
						  items[j].cap, &items[j].vlen, &items[j].info);
}

/* The chains after the first, one round trip each, then the counters. */
static int mget_rest(struct hkv_client *c, struct hkv_mget_item *items, size_t n, size_t i,
		     struct op_scope *sc)
{
	while (i < n) {
		struct mget_chain ch;
		int ret;

		mget_build(c, items, n, &i, &ch);
		ret = ch.nw ? hkv_exec(c, ch.wrs, ch.nw) : 0;
		if (ret)
			return op_end(c, sc, ret);
		mget_take_chain(c, items, &ch);
	}
	return op_end(c, sc, 0);
}

/*
 * A multi-get in two halves, so that a cluster handle posts every server's
 * first chain before it waits for any (client/router.c): start builds and
 * posts the first chain (up to 32 cached keys), finish waits for it and does
 * the rest. n must be the same for both; between them the handle does
 * nothing else.
 */
int hkv_mget_start(struct hkv_client *c, struct hkv_mget_item *items, size_t n,
		   struct hkv_mget_pending *pd)
{
	struct mget_chain *ch = &pd->chain;
	size_t i = 0;
	int ret = hkv_revive(c);

	pd->posted = 0;
	if (ret)
		return ret;
	op_begin(c, &pd->sc, HKV_OP_MGET);
	mget_build(c, items, n, &i, ch);
	if (!ch->nw)
		return 0;
	ret = hkv_conn_post(c->conn, ch->wrs, ch->nw);
	if (ret == -EAGAIN)
		ret = c->conn->error = HKV_ETRANSPORT;
	if (ret)
		return op_end(c, &pd->sc, ret);
	pd->posted = 1;
	return 0;
}

int hkv_mget_finish(struct hkv_client *c, struct hkv_mget_item *items, size_t n,
		    struct hkv_mget_pending *pd)
{
	struct mget_chain *ch = &pd->chain;
	int ret;

	if (pd->posted) {
		ret = hkv_conn_wait(c->conn, NULL, 1); /* (a chain of READs: one completion) */
		if (ret)
			return op_end(c, &pd->sc, ret);
	}
	mget_take_chain(c, items, ch);
	return mget_rest(c, items, n, ch->end, &pd->sc);
}

HKV_EXPORT int hkv_mget(struct hkv_client *c, struct hkv_mget_item *items, size_t n)
{
	struct op_scope sc;
	int rv;

	if (c->router)
		return hkv_router_mget(c, items, n);
	rv = hkv_revive(c);
	if (rv)
		return rv;
	op_begin(c, &sc, HKV_OP_MGET);
	return mget_rest(c, items, n, 0, &sc);
}

/*
 * flush_all: walk the index 1024 slots at a time. Per chunk: one READ of
 * the slots, one chain of 8-byte READs of the metas they name, then each
 * entry whose block is LIVE with the slot's generation is removed exactly as
 * delete removes it ([CAS meta, CAS slot], the mark's winner frees).
 */
#define INDEX_CHUNK 1024

/* Index walks (flush_all, count): READ slots [first, first + *chunk) into
 * slots, at most INDEX_CHUNK of them; one round trip. */
static int read_index_chunk(struct hkv_client *c, uint64_t first, uint64_t *slots, int *chunk)
{
	uint64_t nslots = c->g.nbuckets * HKV_BUCKET_SLOTS;
	struct hkv_wr wr;

	*chunk = nslots - first < INDEX_CHUNK ? (int)(nslots - first) : INDEX_CHUNK;
	wr = hkv_wr_read(c, slots, c->g.index_off + first * 8, (uint32_t)*chunk * 8);
	return hkv_exec(c, &wr, 1);
}

static int flush_all(struct hkv_client *c)
{
	uint64_t nslots = c->g.nbuckets * HKV_BUCKET_SLOTS;
	uint64_t *slots = (uint64_t *)c->rblk, *metas = slots + INDEX_CHUNK;
	uint64_t *again = metas + INDEX_CHUNK;
	struct op_scope sc;

	op_begin(c, &sc, HKV_OP_DELETE);
	for (uint64_t first = 0; first < nslots; first += INDEX_CHUNK) {
		uint64_t base = c->g.index_off + first * 8;
		struct hkv_wr wrs[64];
		int idx[32], chunk, ret;

		if ((ret = read_index_chunk(c, first, slots, &chunk)))
			return op_end(c, &sc, ret);
		test_point(c, HKV_TP_FLUSH_METAS);
		for (int i = 0, batch = 0, stalls = 0; i < chunk;) {
			uint64_t seen;
			int n = 0;

			batch = i;
			/* [READ meta, READ slot again] per entry, one chain: the meta's
			 * generation and the slot value are one view (docs/design.md,
			 * "Views"), not a slot from the chunk READ paired with a
			 * generation read many round trips later */
			for (; i < chunk && n < 32; i++) {
				if (!slots[i] || !slot_sane(c, slots[i]))
					continue;
				idx[n] = i;
				wrs[2 * n] = hkv_wr_read(c, &metas[i], hkv_slot_off(slots[i]), 8);
				wrs[2 * n + 1] = hkv_wr_read(c, &again[i], base + (uint64_t)i * 8, 8);
				n++;
			}
			seen = hkv_coarse_ns();
			if (n && (ret = hkv_exec(c, wrs, 2 * n)))
				return op_end(c, &sc, ret);
			if (n && !view_fresh(c, seen)) { /* stalled between the two: again */
				if (++stalls > 100)
					return op_end(c, &sc, HKV_EAGAIN);
				i = batch;
				continue;
			}
			for (int j = 0; j < n; j++) {
				uint64_t s = again[idx[j]], m = metas[idx[j]];
				struct item it = {.slot_off = base + (uint64_t)idx[j] * 8, .slot = s,
						  .blk_off = hkv_slot_off(s), .cls = hkv_slot_class(s),
						  .gen = hkv_meta_gen(m), .seen_ns = seen};

				if (s != slots[idx[j]] || hkv_meta_state(m) != HKV_BLK_LIVE ||
				    hkv_meta_class(m) != it.cls || (it.gen & 0x7ff) != hkv_slot_ver(s))
					continue; /* not a live entry (changed, being replaced, or garbage) */
				ret = publish_remove(c, &it, NULL);
				if (ret < 0)
					return op_end(c, &sc, ret);
			}
		}
	}
	return op_end(c, &sc, 0);
}

HKV_EXPORT int hkv_flush_all(struct hkv_client *c)
{
	int ret;

	if (c->router)
		return hkv_router_flush_all(c);
	ret = hkv_revive(c);
	if (ret)
		return ret;
	return c->readonly ? -EPERM : flush_all(c);
}

HKV_EXPORT int hkv_count_items(struct hkv_client *c, uint64_t *items, uint64_t *bytes)
{
	uint64_t nslots = 0, *slots;
	int ret;

	if (c->router)
		return hkv_router_count_items(c, items, bytes);
	ret = hkv_revive(c);

	*items = *bytes = 0;
	if (ret)
		return ret;
	nslots = c->g.nbuckets * HKV_BUCKET_SLOTS;
	slots = (uint64_t *)c->rblk;
	for (uint64_t first = 0; first < nslots; first += INDEX_CHUNK) {
		int chunk;

		if ((ret = read_index_chunk(c, first, slots, &chunk)))
			return ret;
		for (int i = 0; i < chunk; i++) {
			if (!slots[i] || !slot_sane(c, slots[i]))
				continue;
			(*items)++;
			*bytes += c->g.class_size[hkv_slot_class(slots[i])];
		}
	}
	return 0;
}
