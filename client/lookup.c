/*
 * lookup.c - finding a key: its hash and buckets, its cached location,
 * the warm find (one READ of the cached block) and the cold find (both
 * buckets, then the candidate blocks, looking again past torn reads).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/transport_int.h"

#define MAX_CANDIDATES 4

/* ---- keys and cached locations ------------------------------------------------ */

int hkv_key_ready(struct hkv_client *c, struct key *k, const void *key, size_t klen)
{
	uint64_t was = c->stats.reconnects;
	int ret = hkv_key_init(c, k, key, klen);

	if (!ret)
		ret = hkv_revive(c);
	if (!ret && c->stats.reconnects != was)
		ret = hkv_key_init(c, k, key, klen);
	return ret;
}

int hkv_key_init(struct hkv_client *c, struct key *k, const void *key, size_t klen)
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

/* READs of the key's two buckets into dst (2 * HKV_BUCKET_SIZE bytes, in the
 * handle's registered memory), appended to wrs[n]; returns the new n. */
int hkv_append_bucket_reads(struct hkv_client *c, struct hkv_wr *wrs, int n,
			    const struct key *k, void *dst)
{
	wrs[n++] = hkv_wr_read(c, dst, hkv_slot_off_of(c, k, 0), HKV_BUCKET_SIZE);
	wrs[n++] = hkv_wr_read(c, (uint8_t *)dst + HKV_BUCKET_SIZE,
			       hkv_slot_off_of(c, k, HKV_BUCKET_SLOTS), HKV_BUCKET_SIZE);
	return n;
}

/*
 * A cached location: any age for reads (they read the block and compare the
 * key); for a write that acts on it without reading the block, only an entry
 * that holds the key itself (never another key's with the same hash) and is
 * young enough to act on.
 */
struct hkv_loc *hkv_cached_loc(struct hkv_client *c, const struct key *k, struct hkv_loc *tmp,
			       int for_write)
{
	if (!for_write) /* reads validate fully: any age will do, no clock needed */
		return hkv_cache_find(c->cache, k->h, k->p, k->len, 0, UINT64_MAX, tmp) ? tmp
											: NULL;
	if (!hkv_cache_find(c->cache, k->h, k->p, k->len, hkv_now_ns(), HKV_VIEW_MAX_NS, tmp))
		return NULL;
	return tmp->key_ok == 1 ? tmp : NULL;
}

void hkv_remember_loc(struct hkv_client *c, const struct key *k, const struct item *it)
{
	struct hkv_loc loc = {.hash = k->h, .slot_addr = it->slot_off, .slot = it->slot,
			      .gen = it->gen, .blen = it->blen, .stamp_ns = it->seen_ns};

	hkv_cache_put(c->cache, &loc, k->p, k->len);
}

/* A write acts on a cached slot without reading the block: the entry must
 * name one of the key's 32 slots, holding the key's fingerprint. */
int hkv_loc_fits_key(const struct hkv_client *c, const struct hkv_loc *loc,
		     const struct key *k)
{
	for (int b = 0; b < 2; b++) {
		uint64_t first = c->g.index_off + k->b[b] * HKV_BUCKET_SIZE;

		if (loc->slot_addr >= first && loc->slot_addr < first + HKV_BUCKET_SIZE &&
		    loc->slot_addr % 8 == 0)
			return hkv_slot_fp(loc->slot) == k->fp && hkv_slot_sane(c, loc->slot);
	}
	return 0;
}

/* ---- finding a key ---------------------------------------------------------- */

/* Fill it from a validated block copy at blk (avail bytes), seen at seen_ns. */
void hkv_item_from_block(struct item *it, uint8_t *blk, uint64_t slot_off, uint64_t slot,
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
int hkv_loc_block_current(const struct hkv_client *c, const struct hkv_loc *loc,
			  const uint8_t *blk, const void *key, uint16_t klen)
{
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;

	return hkv_meta_state(h->meta) == HKV_BLK_LIVE && hkv_meta_gen(h->meta) == loc->gen &&
	       hkv_meta_class(h->meta) == hkv_slot_class(loc->slot) &&
	       !hkv_block_check(&c->g, blk, loc->blen, key, klen) &&
	       HKV_BLOCK_HDR + h->klen + h->vlen == loc->blen;
}

/* Warm find: one READ of the cached block. 0 found, 1 not usable, <0 error. */
int hkv_find_warm(struct hkv_client *c, const struct key *k, struct item *it)
{
	struct hkv_loc lc, *loc = hkv_cached_loc(c, k, &lc, 0);
	struct hkv_wr wr;
	uint64_t t0;
	int ret;

	if (!loc) {
		c->stats.cache_misses++;
		return 1;
	}
	if (!hkv_slot_sane(c, loc->slot) ||
	    loc->blen > c->g.class_size[hkv_slot_class(loc->slot)] || loc->blen > c->read_cap) {
		hkv_cache_drop(c->cache, k->h);
		return 1;
	}
	wr = hkv_wr_read(c, c->rblk, hkv_slot_off(loc->slot), loc->blen);
	t0 = hkv_coarse_ns(); /* <= when the READ ran: the view's age */
	ret = hkv_exec(c, &wr, 1);
	if (ret)
		return ret;
	if (!hkv_loc_block_current(c, loc, c->rblk, k->p, k->len)) {
		hkv_cache_drop(c->cache, k->h); /* replaced, reused or torn: ask the index */
		c->stats.cache_misses++;
		return 1;
	}
	hkv_item_from_block(it, c->rblk, loc->slot_addr, loc->slot, -1, t0);
	/* confirmed at t0: young again (rarely written; never over a newer entry) */
	if (t0 - loc->stamp_ns > HKV_VIEW_MAX_NS / 8 && t0 > loc->stamp_ns)
		hkv_cache_refresh(c->cache, loc, t0);
	c->stats.cache_hits++;
	return 0;
}

int hkv_candidate_check(struct hkv_client *c, const struct key *k, struct item *it,
			const struct view *v, int pos, uint8_t *blk)
{
	uint64_t s = v->slot[pos];
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
	int chk = hkv_block_check(&c->g, blk, c->g.class_size[hkv_slot_class(s)], k->p, k->len);

	if (chk == HKV_ECORRUPT || (hkv_meta_gen(h->meta) & 0x7ff) != hkv_slot_ver(s) ||
	    hkv_meta_class(h->meta) != hkv_slot_class(s))
		return TORN; /* torn, or no longer the block the slot named: it was
			      * replaced and its memory reused, perhaps by another key */
	if (chk == HKV_ENOTFOUND)
		return chk; /* the block the slot names holds another key */
	if (hkv_meta_state(h->meta) == HKV_BLK_PENDING || (h->meta & HKV_META_ABORTED))
		return HKV_ENOTFOUND; /* an insert not (or never) committed: absent */
	hkv_item_from_block(it, blk, hkv_slot_off_of(c, k, pos), s, pos, v->seen_ns);
	if (it->state == HKV_BLK_LIVE)
		hkv_remember_loc(c, k, it);
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
		if (!hkv_view_fresh(c, v->seen_ns))
			return STALE;
		used = 0;
		for (int i = first; i < first + n; i++) {
			uint64_t s = v->slot[cand[i]];
			int chk = hkv_candidate_check(c, k, it, v, cand[i], c->rblk + used);

			used += c->g.class_size[hkv_slot_class(s)];
			if (chk == TORN)
				torn[(*ntorn)++] = s;
			else if (!chk)
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
int hkv_find_cold(struct hkv_client *c, const struct key *k, struct item *it, struct view *v,
		  struct hkv_wr *lead, int nlead)
{
	uint64_t torn[CANON_SLOTS], prev[CANON_SLOTS];
	int nprev = -1, stuck = 0;
	struct retry rt;

	hkv_retry_begin(&rt);
	for (;;) {
		struct hkv_wr wrs[4];
		int cand[CANON_SLOTS], ncand = 0, n = 0, ntorn = 0, too_big = 0, ret;

		for (int i = 0; i < nlead; i++)
			wrs[n++] = lead[i];
		nlead = 0; /* the lead requests go out once */
		n = hkv_append_bucket_reads(c, wrs, n, k, c->bkt);
		v->seen_ns = hkv_coarse_ns();
		ret = hkv_exec(c, wrs, n);
		if (ret)
			return ret;
		memcpy(v->slot, c->bkt, sizeof(v->slot));
		for (int p = 0; p < CANON_SLOTS; p++)
			if (v->slot[p] && hkv_slot_fp(v->slot[p]) == k->fp &&
			    hkv_slot_sane(c, v->slot[p]))
				cand[ncand++] = p;
		ret = check_candidates(c, k, it, v, cand, ncand, torn, &ntorn, &too_big);
		if (ret == STALE) { /* stalled between the two READs: look again */
			if (hkv_retry_stale(c, &rt))
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
		if (hkv_retry_wait(c, &rt))
			return HKV_EAGAIN;
	}
}

int hkv_find(struct hkv_client *c, const struct key *k, struct item *it, struct view *v)
{
	int ret = hkv_find_warm(c, k, it);

	return ret <= 0 ? ret : hkv_find_cold(c, k, it, v, NULL, 0);
}
