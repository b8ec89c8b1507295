/*
 * publish.c - publishing and retiring blocks: replace and remove (mark the
 * old block OBSOLETE, swing its slot), insert (tentative: PENDING, look for
 * a rival, commit), and what a stale swing, an abandoned insert or a dead
 * writer's half-retired entry leave behind.
 */
#include <stdint.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/log.h"
#include "common/transport_int.h"

/* ---- publishing --------------------------------------------------------------- */

/* Our block's meta word (from the copy in wblk) in state st. */
static uint64_t our_meta(const struct hkv_client *c, enum hkv_block_state st)
{
	uint64_t m = ((const struct hkv_block_hdr *)c->wblk)->meta;

	return hkv_meta_make(st, hkv_meta_class(m), hkv_meta_gen(m));
}

/* WRITE of the block just built; -1 if our hold on it is too old for its
 * first write (hkv_alloc_write_ok: the caller builds a new block). */
int hkv_append_block_write(struct hkv_client *c, struct hkv_wr *wrs, int n, uint64_t slot,
			   uint32_t blen)
{
	if (hkv_alloc_write_ok(c, hkv_slot_off(slot)))
		return -1;
	if (hkv_test_hook)
		hkv_test_hook(c, HKV_TP_HOLD_WRITE);
	wrs[n++] = hkv_wr_write(c, c->wblk, hkv_slot_off(slot), blen);
	return n;
}

/* WRITE of just our block's meta word in state st (8 bytes, from atom[4 + st % 2]). */
static struct hkv_wr wr_our_meta(struct hkv_client *c, uint64_t slot, enum hkv_block_state st)
{
	uint64_t *src = &c->atom[4 + (st == HKV_BLK_PENDING)];

	*src = our_meta(c, st);
	return hkv_wr_write(c, src, hkv_slot_off(slot), 8);
}

/* The mark that retires the entry `old` names: CAS its meta LIVE ->
 * OBSOLETE with our id as retirer, the meta found into *res. */
static struct hkv_wr wr_mark(struct hkv_client *c, const struct item *old, uint64_t *res)
{
	return hkv_wr_cas(c, res, old->blk_off, hkv_meta_live(old),
			  hkv_meta_make(HKV_BLK_OBSOLETE, old->cls, old->gen) |
				  hkv_meta_retirer(c->client_id));
}

/*
 * Retiring the entry `old` names: [CAS old meta LIVE->OBSOLETE, CAS slot
 * old->new], results in res[0] and res[1]. Appended to wrs[n]; returns the
 * new n.
 */
int hkv_append_retire(struct hkv_client *c, struct hkv_wr *wrs, int n, const struct item *old,
		      uint64_t new_slot, uint64_t *res)
{
	wrs[n++] = wr_mark(c, old, &res[0]);
	wrs[n++] = hkv_wr_cas(c, &res[1], old->slot_off, old->slot, new_slot);
	return n;
}

/*
 * Our slot CAS won although the view was stale: the block the view named
 * had been reused (its meta holds another generation), and the slot had
 * come back to the very value we expected (ABA, after 2048 reuses of the
 * address: only when this thread stopped for longer than the horizon inside
 * the post, after hkv_view_fresh). We acted on an entry we never saw: the
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
	uint64_t ours = w->meta;
	uint64_t gone = (seen & ~3ull & ~hkv_meta_retirer(0xffff)) | HKV_BLK_OBSOLETE |
			hkv_meta_retirer(c->client_id);
	enum hkv_block_state st = hkv_meta_state(seen);
	int ours_g = 0, restored = 0;
	struct hkv_wr wrs[2];

	c->stats.stale_undone++;
	hkv_warn("client %u: a write acted on a view older than the ABA horizon (slot 0x%llx); "
		 "undoing it", c->client_id, (unsigned long long)old->slot_off);
	hkv_test_at(c, HKV_TP_UNDO_STALE);
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
		uint64_t dead = (live & ~3ull) | HKV_BLK_OBSOLETE | HKV_META_ABORTED |
				hkv_meta_retirer(c->client_id);
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
	w->owner = (uint16_t)c->client_id; /* ours until published; the wid stays g' write's */
	w->sum = hkv_block_sum(w, c->wblk + HKV_BLOCK_HDR);
	copy = hkv_slot_make(hkv_slot_fp(old->slot), cls, gen, off);
	if (hkv_alloc_write_ok(c, off))
		return 0; /* held too long: abandoned */
	wrs[n++] = hkv_wr_write(c, c->wblk, off, HKV_BLOCK_HDR + h->klen + h->vlen);
	wrs[n++] = hkv_wr_cas(c, &c->atom[3], old->slot_off, new_slot, copy);
	if (hkv_exec(c, wrs, n))
		return 0;
	if (c->atom[3] == new_slot)
		return 1;
	withdraw_ours(c, copy, HKV_BLK_LIVE); /* the slot moved on: C goes */
	return 0;
}

/*
 * After an hkv_append_retire() pair ran (new_slot is what the slot CAS wrote):
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
int hkv_retire_outcome(struct hkv_client *c, const struct item *old, const uint64_t *res,
		       uint64_t new_slot, int keep)
{
	int marked = res[0] == hkv_meta_live(old);

	/* (kept by a replace and an eviction, which go on writing blocks of
	 * the class; a delete frees) */
	if (marked && keep)
		hkv_free_or_keep(c, old->blk_off, old->cls, old->gen);
	else if (marked)
		hkv_free_retired(c, old->blk_off, old->cls, old->gen);
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
				      our_meta(c, HKV_BLK_OBSOLETE) | HKV_META_ABORTED |
					      hkv_meta_retirer(c->client_id));

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
int hkv_publish_replace(struct hkv_client *c, const struct item *old, uint64_t new_slot,
			uint32_t blen, int with_write)
{
	struct hkv_wr wrs[8];
	int n = 0, ret;

	if (!hkv_view_fresh(c, old->seen_ns))
		return STALE;
	if (with_write && (n = hkv_append_block_write(c, wrs, n, new_slot, blen)) < 0)
		return YIELDED; /* our block is abandoned: build another */
	else if (new_slot)
		wrs[n++] = wr_our_meta(c, new_slot, HKV_BLK_LIVE);
	n = hkv_append_retire(c, wrs, n, old, new_slot, c->atom);
	c->pub_ns = hkv_coarse_ns();
	ret = hkv_exec(c, wrs, n);
	if (ret)
		return ret;
	ret = hkv_retire_outcome(c, old, c->atom, new_slot, new_slot != 0);
	if (ret == STALE && new_slot) {
		withdraw_ours(c, new_slot, HKV_BLK_LIVE);
		return YIELDED;
	}
	return ret;
}

/*
 * A remove, in two steps: [READ header?, CAS meta LIVE->OBSOLETE], then -
 * only if that mark won - [CAS slot old->0]. 0, CONFLICT, STALE or <0.
 * With hdr, the old block's header is read into it first, in the first
 * chain: what was removed, if the removal won. c->atom[0] is what the mark
 * found, c->atom[1] what the slot CAS found.
 *
 * Why not one chain [mark, swing], as a replace posts it: a remover stopped
 * after hkv_view_fresh for longer than the ABA horizon, while the slot came
 * back to the value it read under a later incarnation g', would swing that
 * slot to 0 with its mark lost - and with no block of its own to put back,
 * the undo (undo_stale) could not restore g': a later acknowledged value
 * gone (or, after a fingerprint collision in the bucket, another key's),
 * and a delete_if or a GET's reclaim of an expired item remove what their
 * condition never saw. Here the slot CAS is posted only under our mark: a
 * marked block is not freed until its marker frees it, so its slot value
 * cannot come back before our swing - the swing removes exactly the
 * incarnation the mark names, however long we stopped in between. A lost
 * mark of another generation is a stale view: nothing was done (STALE).
 * One more round trip per delete (docs/design.md, "Operations").
 *
 * A lost mark of the same generation: another writer retires this very
 * incarnation. If it is LIVE-marked (OBSOLETE, not aborted) and still
 * named, that writer is between its mark and its swing (or died there):
 * every find takes the entry as present, so a delete removes it by its
 * slot alone (the block stays its marker's to free), from a view checked
 * fresh again - the same CAS the one-chain remove posted in that case.
 */
int hkv_publish_remove(struct hkv_client *c, const struct item *old,
		       struct hkv_block_hdr *hdr)
{
	uint64_t live = hkv_meta_live(old);
	struct hkv_wr wrs[2];
	int n = 0, ret;

	if (!hkv_view_fresh(c, old->seen_ns))
		return STALE;
	if (hdr)
		wrs[n++] = hkv_wr_read(c, hdr, old->blk_off, HKV_BLOCK_HDR);
	wrs[n++] = wr_mark(c, old, &c->atom[0]);
	c->atom[1] = 0;
	if ((ret = hkv_exec(c, wrs, n)))
		return ret;
	if (c->atom[0] != live) {
		uint64_t m = c->atom[0];

		if (hkv_meta_gen(m) != old->gen || hkv_meta_class(m) != old->cls) {
			c->stats.stale_views++; /* reused since the view: nothing done */
			return STALE;
		}
		if (hkv_meta_state(m) != HKV_BLK_OBSOLETE || (m & HKV_META_ABORTED) ||
		    !hkv_view_fresh(c, old->seen_ns))
			return CONFLICT;
	}
	hkv_test_at(c, HKV_TP_REMOVE_SLOT);
	wrs[0] = hkv_wr_cas(c, &c->atom[1], old->slot_off, old->slot, 0);
	if ((ret = hkv_exec(c, wrs, 1)))
		return ret; /* (our marked block: the sweep's once no slot names it) */
	if (c->atom[0] == live) /* out of the index either way */
		hkv_free_retired(c, old->blk_off, old->cls, old->gen);
	return c->atom[1] == old->slot ? 0 : CONFLICT;
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
						    hkv_meta_gen(pend)) | HKV_META_ABORTED |
					 hkv_meta_retirer(c->client_id);
	struct hkv_wr wr;
	int ret;

	if (!hkv_view_fresh(c, seen_ns))
		return 0; /* look again */
	wr = hkv_wr_cas(c, &c->atom[2], hkv_slot_off(s), pend, dead);
	ret = hkv_exec(c, &wr, 1);
	if (ret || c->atom[2] != pend)
		return ret; /* committed or aborted meanwhile: look again */
	hkv_warn("client %u: aborted an abandoned insert at 0x%llx", c->client_id,
		 (unsigned long long)hkv_slot_off(s));
	hkv_test_at(c, HKV_TP_ABORT_SLOT);
	/* Whatever this CAS finds, the slot no longer names the block after it:
	 * the block's insert can neither commit nor publish it anywhere else. */
	wr = hkv_wr_cas(c, &c->atom[2], slot_off, s, 0);
	ret = hkv_exec(c, &wr, 1);
	if (!ret)
		hkv_free_block(c, hkv_slot_off(s), hkv_meta_class(pend));
	return ret;
}

/*
 * The same aborted entry of our key (slot, and block generation: a
 * generation never repeats for an address, so a slot value that came back
 * with a reused block is not the same entry) seen again after the lease:
 * its aborter died before taking the slot back. 1 if so.
 */
static int stuck_obsolete(struct hkv_client *c, uint64_t slot_off, uint64_t s, uint32_t gen)
{
	uint64_t now = hkv_coarse_ns();

	if (c->stuck_slot_off != slot_off || c->stuck_slot != s || c->stuck_gen != gen) {
		c->stuck_slot_off = slot_off;
		c->stuck_slot = s;
		c->stuck_gen = gen;
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
		uint64_t s = re[p], soff = hkv_slot_off_of(c, k, p), s_seen = re_seen;
		int tries;

		for (tries = 0; tries < 8; tries++) {
			const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
			struct hkv_wr wr;
			uint32_t sz;
			int ret, chk, ours_key;

			if (p == pos || !s || hkv_slot_fp(s) != k->fp || !hkv_slot_sane(c, s))
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
				if ((int32_t)(hkv_region_ms32(c) - h->atime) <= HKV_PENDING_LEASE_MS) {
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
			/*
			 * Being replaced or removed (OBSOLETE, not aborted): a rival,
			 * however long it stays. Every find takes it as present (its
			 * value is the key's until the slot moves), so clearing the
			 * slot would make the key absent, neither value; and a writer
			 * that seems dead may only be slow (a retransmitted CAS), and
			 * its slot CAS can still land.
			 */
			if (ours_key && hkv_meta_state(h->meta) == HKV_BLK_OBSOLETE &&
			    !(h->meta & HKV_META_ABORTED)) {
				*rival = 1;
				return 0;
			}
			/* An aborted insert whose slot stays: its aborter stopped or
			 * died before taking the slot back. Take the slot (only the
			 * slot: the aborter frees the block once its own slot CAS has
			 * run, whatever it finds; if it died, the block is lost). */
			if (ours_key && (h->meta & HKV_META_ABORTED) &&
			    stuck_obsolete(c, soff, s, hkv_meta_gen(h->meta))) {
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
 * ([CAS meta PENDING->OBSOLETE|ABORTED], then, if it won, [CAS slot
 * new->0] and the free) and the caller starts over with a fresh block.
 *
 * 0 committed, CONFLICT (the slot was taken: look again; our block is still
 * ours, unreferenced), YIELDED (our block is withdrawn and freed), REFUSED
 * (withdrawn and freed because c->insert_check said no), <0.
 */
int hkv_publish_insert(struct hkv_client *c, const struct key *k, int pos, uint64_t new_slot,
		       const struct item *victim)
{
	uint64_t *re = (uint64_t *)(c->bkt + 2 * HKV_BUCKET_SIZE);
	uint64_t soff = hkv_slot_off_of(c, k, pos), pend = our_meta(c, HKV_BLK_PENDING);
	uint64_t dead = our_meta(c, HKV_BLK_OBSOLETE) | HKV_META_ABORTED |
			hkv_meta_retirer(c->client_id);
	uint64_t expect = victim ? victim->slot : 0, re_seen;
	struct hkv_wr wrs[5];
	int ret, rival, refused = 0, n = 0;

	if (victim && !hkv_view_fresh(c, victim->seen_ns))
		return STALE;
	wrs[n++] = wr_our_meta(c, new_slot, HKV_BLK_PENDING);
	if (victim) /* cache mode, both buckets full: take over an evicted entry's slot */
		n = hkv_append_retire(c, wrs, n, victim, new_slot, c->atom);
	else
		wrs[n++] = hkv_wr_cas(c, &c->atom[1], soff, 0, new_slot);
	n = hkv_append_bucket_reads(c, wrs, n, k, re);
	if (!victim)
		hkv_test_at(c, HKV_TP_INSERT_SLOT);
	c->pub_ns = re_seen = hkv_coarse_ns();
	if ((ret = hkv_exec(c, wrs, n)))
		return ret;
	if (victim) {
		int marked = c->atom[0] == hkv_meta_live(victim);

		ret = hkv_retire_outcome(c, victim, c->atom, new_slot, new_slot != 0);
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
	/* A replicated store's insert step onto a replica that is not the
	 * decider: commit only if the decider still holds the write (asked now,
	 * after our PENDING entry is in: until it is aborted or committed the
	 * key cannot move on here; replica.c, "stale insert steps") */
	if (!rival && c->insert_check && c->insert_check(c->insert_check_arg))
		refused = rival = 1;
	if (!rival) {
		if (hkv_test_hook)
			hkv_test_hook(c, HKV_TP_INSERT_COMMIT);
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
	/* a rival: withdraw ours, the meta first (PENDING -> aborted). Only if
	 * that CAS won do we clear the slot: our block is then freed by nobody
	 * but us, so the slot's value cannot come back meanwhile, however long
	 * we stop (both in one chain once let a withdraw stopped past the lease
	 * clear an entry whose block had been aborted by another, freed and
	 * reused). An aborter that beat us takes the slot back and frees. */
	wrs[0] = hkv_wr_cas(c, &c->atom[0], hkv_slot_off(new_slot), pend, dead);
	if ((ret = hkv_exec(c, wrs, 1)))
		return ret;
	if (c->atom[0] != pend)
		return refused ? REFUSED : YIELDED;
	wrs[0] = hkv_wr_cas(c, &c->atom[1], soff, new_slot, 0);
	if ((ret = hkv_exec(c, wrs, 1)))
		return ret; /* (our aborted block stays named: find_rival takes such slots back) */
	hkv_free_block(c, hkv_slot_off(new_slot), hkv_slot_class(new_slot));
	return refused ? REFUSED : YIELDED;
}
