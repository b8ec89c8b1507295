/*
 * evict.c - cache mode: access times and counts, eviction (sampled;
 * expired first, then recency or frequency, whichever regrets less:
 * common/cache_policy.h) and the victim slot of an insert into two full
 * buckets. Moving a segment between classes is the server's (CARVE,
 * server/store.c).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/cache_policy.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

/* cache mode (EVICT_BATCH: client/ops_int.h) */
#define ATIME_STEP_MS  1  /* a block's access time is refreshed at most this often */
#define EVICT_SAMPLES  64 /* blocks sampled per eviction round */
#define EVICT_BATCH_BYTES (256u << 10) /* ... and evicted per round, at most */
#define EVICT_READ     320 /* header + the longest key, 64 B aligned */
#define ATIME_FRESH_NS (10ull * 1000000ull) /* a GET's atime CAS only this soon after its READ */

/* ---- cache mode: recency, frequency and eviction ------------------------------- */

/* The handle's policy state, made on first use (NULL: no memory; the
 * choice is then recency's). */
struct hkv_cpol *hkv_pol(struct hkv_client *c)
{
	if (!c->pol && (c->pol = hkv_calloc(1, sizeof(*c->pol)))) {
		hkv_cpol_init(c->pol, (uint64_t)c->g.nsegs * c->g.seg_size);
		c->pol_owner = c;
	}
	return c->pol;
}

/* c follows from's policy (plain handles of one cache, used by one thread). */
void hkv_pol_share(struct hkv_client *c, struct hkv_client *from)
{
	if (c->router || c->repl || from->router || from->repl || !hkv_cache_mode(c) ||
	    c->pol || !hkv_pol(from))
		return;
	c->pol = from->pol;
	c->pol_owner = from;
}

/* A GET of key hash h, hit or miss: the policy learns (a handle has one
 * only in cache mode, once it evicted or shares a lane's). */
void hkv_pol_access(struct hkv_client *c, uint64_t h)
{
	if (c->pol)
		hkv_cpol_accessed(c->pol, h);
}

/*
 * Record an access in the block's atime and count, off the critical path:
 * one CAS on the atime|freq word that expects exactly what we read, posted
 * unsignaled - nothing waits for it. If the block was retired and reused
 * meanwhile, the word differs and the CAS does nothing. The word holds no
 * summed byte: on verbs an RDMA atomic is not atomic against a WRITE on
 * another queue pair, so a CAS stopped until the block is rewritten can
 * land inside that WRITE - and then changes only the new item's atime.
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
	now = hkv_region_ms32(c);
	if ((int32_t)(now - h->atime) < ATIME_STEP_MS)
		return;
	was = (uint64_t)h->atime | (uint64_t)h->freq << 32;
	now_word = (uint64_t)now | (uint64_t)hkv_freq_touched(h->freq) << 32;
	wr = hkv_wr_cas(c, &c->atom[6], it->blk_off + offsetof(struct hkv_block_hdr, atime), was,
			now_word);
	wr.flags = HKV_WR_F_NO_COMPLETION;
	hkv_test_at(c, HKV_TP_ATIME_CAS);
	(void)hkv_conn_post(c->conn, &wr, 1); /* the transport keeps room for it */
}

struct victim {
	uint64_t off;
	uint8_t *hdr; /* header + key, in rblk */
	uint64_t seen_ns; /* when that READ was posted */
};

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
	hkv_test_at(c, HKV_TP_EVICT_MARK);
	if ((ret = hkv_exec(c, wrs, 2 * n)))
		return ret;
	for (int i = 0; i < n; i++) { /* replaced or removed meanwhile: not an eviction */
		int ok = hkv_retire_outcome(c, &it[i], &c->atom[8 + 2 * i], 0, 1) == 0;

		evicted += ok;
		if (ok && c->op_key && key[own[i]].len == c->op_klen &&
		    !memcmp(key[own[i]].p, c->op_key, c->op_klen))
			c->op_key_evicted = 1; /* we evicted the very key we are writing */
	}
	c->stats.evictions += (uint64_t)evicted;
	return evicted;
}

/*
 * Read header + key of the blocks at v[0..n).off (one chain) and evict
 * `max` (<= EVICT_BATCH) of the LIVE ones: the expert this round follows
 * picks them (expired first); what both experts nominated goes to the
 * policy's ghost. Returns how many were evicted, or <0.
 */
static int evict_offs(struct hkv_client *c, uint32_t cls, struct victim *v, int n, int max,
		      int ahead)
{
	uint32_t sz = c->g.class_size[cls], rd = sz < EVICT_READ ? sz : EVICT_READ;
	uint32_t now_ms = hkv_region_ms32(c), now_s = hkv_region_s(c);
	struct hkv_wr wrs[EVICT_SAMPLES];
	int64_t score[HKV_NEXPERTS][EVICT_SAMPLES];
	const int64_t *scp[HKV_NEXPERTS];
	int pick[HKV_NEXPERTS * EVICT_BATCH];
	unsigned masks[HKV_NEXPERTS * EVICT_BATCH];
	struct victim chosen[EVICT_BATCH];
	struct hkv_cpol *pol;
	int nv = 0, ret, evicted = 0, got;
	uint64_t t = hkv_coarse_ns();

	for (int i = 0; i < n; i++) {
		v[i].hdr = c->rblk + (size_t)i * EVICT_READ;
		v[i].seen_ns = t;
		wrs[i] = hkv_wr_read(c, v[i].hdr, v[i].off, rd);
	}
	if (n && (ret = hkv_exec(c, wrs, n)))
		return ret;
	if (ahead) { /* a quarter of the sample free: room after all (deletes, a flush) */
		int nfree = 0;

		for (int i = 0; i < n; i++) {
			const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[i].hdr;
			uint64_t w16;

			memcpy(&w16, v[i].hdr + 16, 8);
			nfree += hkv_meta_state(h->meta) != HKV_BLK_LIVE && hkv_freed_is(w16);
		}
		if (nfree * 4 >= n) {
			c->classes[cls].pressure_ns = 0;
			c->classes[cls].survey_ns = 0; /* (the next allocation looks) */
			c->classes[cls].empty_survey_ns = 0;
			c->stats.evictions_spared++;
			return 0;
		}
	}
	for (int i = 0; i < n; i++) {
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[i].hdr;

		if (hkv_meta_state(h->meta) != HKV_BLK_LIVE || hkv_meta_class(h->meta) != cls ||
		    h->klen == 0 || (uint32_t)HKV_BLOCK_HDR + h->klen > rd ||
		    v[i].off == c->protect_off) /* the item being rewritten */
			continue;
		for (int e = 0; e < HKV_NEXPERTS; e++)
			score[e][nv] = hkv_expert_score(e, h->atime, h->freq, h->exptime, now_ms,
							now_s);
		v[nv++] = v[i];
	}
	for (int e = 0; e < HKV_NEXPERTS; e++)
		scp[e] = score[e];
	pol = hkv_pol(c);
	got = hkv_cpol_choose(scp, nv, max, pol ? hkv_cpol_pick(pol) : HKV_EXPERT_LRU, pick,
			      masks, &nv);
	for (int i = 0; i < got && pol; i++) { /* what each expert nominated, for regret */
		const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)v[pick[i]].hdr;
		struct key k;

		if (!hkv_key_init(c, &k, v[pick[i]].hdr + HKV_BLOCK_HDR, h->klen))
			hkv_cpol_nominated(pol, k.h, masks[i], i < nv ? sz : 0);
	}
	for (int i = 0; i < nv; i++)
		chosen[i] = v[pick[i]];
	v = chosen;
	for (int first = 0; first < nv; first += EVICT_BATCH) {
		ret = evict_group(c, cls, v + first, nv - first < EVICT_BATCH ? nv - first
									  : EVICT_BATCH);
		if (ret < 0)
			return ret;
		evicted += ret;
	}
	return evicted;
}

/* Items one round evicts: EVICT_BATCH, or as many blocks of the class as
 * make EVICT_BATCH_BYTES (>= 1): a write of one 1 MiB item once evicted
 * 8 MiB - most of a small cache's items of that size - to keep one. */
static int evict_batch(const struct hkv_client *c, uint32_t cls)
{
	uint32_t n = EVICT_BATCH_BYTES / c->g.class_size[cls];

	return n < 1 ? 1 : n > EVICT_BATCH ? EVICT_BATCH : (int)n;
}

/*
 * Memory is full in class cls (cache mode): evict some items of that class,
 * whoever wrote them. Samples EVICT_SAMPLES blocks of the class's segments
 * (the table as read at most 100 ms ago) and evicts the EVICT_BATCH oldest
 * (fewer of blocks over 32 KiB: evict_batch) (3 round trips). The blocks it retires are kept for our own next writes
 * of the class (resting, hkv_free_or_keep) up to the hold cap; the rest
 * are freed, their words our hints (so our next claim takes them back).
 * Returns how many were evicted, or <0.
 */
int hkv_evict(struct hkv_client *c, uint32_t cls, int ahead)
{
	struct victim v[EVICT_SAMPLES];
	uint32_t segs[EVICT_SAMPLES], nseg = 0, nb = c->g.seg_size / c->g.class_size[cls];
	uint32_t start;
	int n = 0, ret;

	if ((size_t)EVICT_SAMPLES * EVICT_READ + EVICT_BATCH * 2 * HKV_BUCKET_SIZE > c->read_cap)
		return 0;
	if ((ret = hkv_alloc_table(c, 100ull * 1000000ull)))
		return ret;
	start = (uint32_t)(hkv_rand(c) % c->g.nsegs);
	for (uint32_t k = 0; k < c->g.nsegs && nseg < EVICT_SAMPLES; k++) {
		uint32_t i = (start + k) % c->g.nsegs;

		if (hkv_seg_state(c->table[i]) == HKV_SEG_SHARED && hkv_seg_class(c->table[i]) == cls)
			segs[nseg++] = i;
	}
	if (!nseg)
		return 0;
	for (int i = 0; i < EVICT_SAMPLES; i++) {
		uint32_t seg = segs[hkv_rand(c) % nseg], b = (uint32_t)(hkv_rand(c) % nb);

		v[n++].off = c->g.data_off + (uint64_t)seg * c->g.seg_size +
			     (uint64_t)b * c->g.class_size[cls];
	}
	n = evict_offs(c, cls, v, n, evict_batch(c, cls), ahead);
	if (n > 0) /* (what we did not keep went to the pool) */
		c->classes[cls].empty_survey_ns = 0;
	return n;
}

/*
 * Both buckets are full (cache mode): choose a slot to take over - an
 * expired item's, else the lowest of the 32 by the expert the policy
 * follows now (recency or frequency) - by reading the
 * headers of the blocks they name (one chain). -1 if none qualifies;
 * *victim describes the entry to evict.
 */
int hkv_pick_victim_slot(struct hkv_client *c, const struct key *k, const struct view *view,
			 struct item *victim)
{
	uint32_t now_ms = hkv_region_ms32(c), now_s = hkv_region_s(c);
	struct hkv_wr wrs[CANON_SLOTS];
	int pos[CANON_SLOTS], n = 0, best = -1;
	int64_t best_score = INT64_MAX;
	int expert = c->pol ? hkv_cpol_favoured(c->pol) : HKV_EXPERT_LRU;

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
		score = hkv_expert_score(expert, h->atime, h->freq, h->exptime, now_ms, now_s);
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
