/* filler.c - a replicated store's repair (see filler.h). */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "client/copy.h"
#include "common/cluster_map.h"
#include "common/hkv_alloc.h"
#include "common/layout.h"
#include "common/log.h"
#include "hatchkv.h"
#include "server/cluster.h"
#include "server/filler.h"
#include "server/store.h"

#define FILL_TIMEOUT_MS 5000

/* What a gainer holds of one key: the write id copied there. */
struct entry {
	uint8_t *key; /* NULL: a free cell */
	uint64_t h, wid;
	uint32_t pass; /* the last pass that saw the key on A */
	uint16_t klen, g; /* g: the gainer (index into target->names) */
};

struct hkv_fill {
	int64_t rev;
	char *tag;
	struct entry *t;
	uint64_t cap, n;
	uint8_t hkey[crypto_shorthash_KEYBYTES];
	uint32_t pass;
	atomic_int cancel;
	struct hkv_client **h; /* per name of the target, opened on first use */
	uint32_t nh;
};

struct hkv_fill *hkv_fill_new(int64_t rev, const char *tag)
{
	struct hkv_fill *f = hkv_calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->rev = rev;
	f->tag = hkv_strdup(tag);
	f->cap = 1024;
	f->t = hkv_calloc(f->cap, sizeof(*f->t));
	if (!f->tag || !f->t) {
		hkv_free(f->tag);
		hkv_free(f->t);
		hkv_free(f);
		return NULL;
	}
	randombytes_buf(f->hkey, sizeof(f->hkey));
	return f;
}

void hkv_fill_free(struct hkv_fill *f)
{
	if (!f)
		return;
	for (uint64_t i = 0; i < f->cap; i++)
		hkv_free(f->t[i].key);
	for (uint32_t i = 0; i < f->nh; i++)
		if (f->h[i])
			hkv_close(f->h[i]); /* our blocks there stay: they hold the copies */
	hkv_free(f->h);
	hkv_free(f->t);
	hkv_free(f->tag);
	hkv_free(f);
}

int hkv_fill_is(const struct hkv_fill *f, int64_t rev, const char *tag)
{
	return f && f->rev == rev && !strcmp(f->tag, tag);
}

void hkv_fill_cancel(struct hkv_fill *f)
{
	atomic_store(&f->cancel, 1);
}

static uint64_t hash_of(const struct hkv_fill *f, const uint8_t *key, uint16_t klen, uint16_t g)
{
	uint64_t h;

	crypto_shorthash((unsigned char *)&h, key, klen, f->hkey);
	return h ^ ((uint64_t)g * 0x9e3779b97f4a7c15ull);
}

/* The cell of (key, g): its entry, or the free cell it would take. */
static struct entry *cell(struct hkv_fill *f, const uint8_t *key, uint16_t klen, uint16_t g,
			  uint64_t h)
{
	for (uint64_t i = h & (f->cap - 1);; i = (i + 1) & (f->cap - 1)) {
		struct entry *e = &f->t[i];

		if (!e->key || (e->h == h && e->g == g && e->klen == klen && !memcmp(e->key, key, klen)))
			return e;
	}
}

static int grow(struct hkv_fill *f)
{
	struct entry *old = f->t;
	uint64_t ocap = f->cap;

	f->t = hkv_calloc(ocap * 2, sizeof(*f->t));
	if (!f->t) {
		f->t = old;
		return -ENOMEM;
	}
	f->cap = ocap * 2;
	for (uint64_t i = 0; i < ocap; i++)
		if (old[i].key)
			*cell(f, old[i].key, old[i].klen, old[i].g, old[i].h) = old[i];
	hkv_free(old);
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int gainer_handle(struct hkv_fill *f, const struct hkv_cmember *homes, uint32_t i,
			 const char *token, uint64_t max_value, struct hkv_client **out)
{
	struct hkv_config *cfg;
	int ret;

	if (i >= f->nh) {
		struct hkv_client **h = hkv_realloc(f->h, (i + 1) * sizeof(*h));

		if (!h)
			return -ENOMEM;
		memset(h + f->nh, 0, (i + 1 - f->nh) * sizeof(*h));
		f->h = h;
		f->nh = i + 1;
	}
	if (f->h[i]) {
		*out = f->h[i];
		return 0;
	}
	if (!homes[i].endpoint[0])
		return -ENOENT;
	cfg = hkv_config_new();
	if (!cfg)
		return -ENOMEM;
	ret = hkv_config_add_server(cfg, homes[i].endpoint);
	if (!ret)
		ret = hkv_config_set_token(cfg, token);
	if (!ret)
		ret = hkv_config_set_timeout_ms(cfg, FILL_TIMEOUT_MS);
	if (!ret)
		ret = hkv_config_set_max_value(cfg, max_value);
	/* a new replica says it is ready a moment before its event loop
	 * serves again (it polls the cluster every 100 ms): a second or so */
	for (int tries = 0; !ret; tries++) {
		ret = hkv_open(cfg, &f->h[i]);
		if ((ret != HKV_EDISCONNECTED && ret != HKV_EUNAVAILABLE) || tries == 10 ||
		    atomic_load(&f->cancel))
			break;
		nanosleep(&(struct timespec){0, 100000000}, NULL);
	}
	hkv_config_free(cfg);
	if (ret) {
		hkv_err("cluster: cannot reach %s (%s) to fill it: %s", homes[i].id, homes[i].endpoint,
			hkv_strerror(ret));
		return ret;
	}
	*out = f->h[i];
	return 0;
}

/* Does A (self) fill partition p into someone: self is cur's primary and
 * target's list is longer? */
static int filled_here(const struct hkv_cmap *cur, const struct hkv_cmap *target, uint32_t p,
		       const char *self)
{
	return !strcmp(hkv_cmap_server(cur, p, 0), self) && hkv_cmap_grows(cur, target, p);
}

int hkv_fill_source(const struct hkv_cmap *cur, const struct hkv_cmap *target, const char *self)
{
	for (uint32_t p = 0; p < cur->partitions && p < target->partitions; p++)
		if (filled_here(cur, target, p, self))
			return 1;
	return 0;
}

struct pass {
	struct hkv_fill *f;
	const struct hkv_cmap *cur, *target;
	const struct hkv_cmember *homes;
	const char *self, *token;
	uint64_t max_value;
	int (*halt)(void *);
	void *halt_arg;
	struct hkv_fill_stats *st;
};

static int halted(const struct pass *ps)
{
	return atomic_load(&ps->f->cancel) || (ps->halt && ps->halt(ps->halt_arg));
}

/* Copy one present entry of A (a stable copy) to the gainers of its
 * partition that lack its write, each only from what this fill put there. */
static int fill_item(struct pass *ps, const struct hkv_block_hdr *h)
{
	struct hkv_fill *f = ps->f;
	const uint8_t *key = (const uint8_t *)(h + 1);
	uint32_t p = hkv_cmap_partition(ps->target, key, h->klen);

	if (!filled_here(ps->cur, ps->target, p, ps->self))
		return 0;
	ps->st->seen++;
	for (uint32_t r = 0; r < hkv_cmap_len(ps->target, p); r++) {
		uint16_t g = ps->target->repl[(size_t)p * ps->target->replicas + r];
		uint64_t hh;
		struct entry *e;
		struct hkv_client *c;
		int ret;

		if (hkv_cmap_holds(ps->cur, p, ps->target->names[g]))
			continue;
		hh = hash_of(f, key, h->klen, g);
		e = cell(f, key, h->klen, g, hh);
		if (e->key && e->wid == h->wid) {
			e->pass = f->pass;
			continue;
		}
		if (halted(ps))
			return -ECANCELED;
		ret = gainer_handle(f, ps->homes, g, ps->token, ps->max_value, &c);
		if (!ret)
			ret = hkv_put_exact(c, key, h->klen, key + h->klen, h->vlen, h->flags,
					    h->exptime, h->wid, h->pred, e->key ? e->wid : 0);
		if (ret == HKV_EVERSION)
			hkv_err("cluster: filling %s: it holds a write of a key this fill did not put "
				"there", ps->target->names[g]);
		else if (ret)
			hkv_err("cluster: filling %s: %s", ps->target->names[g], hkv_strerror(ret));
		if (ret)
			return ret;
		if (!e->key) {
			e->key = hkv_malloc(h->klen);
			if (!e->key)
				return -ENOMEM;
			memcpy(e->key, key, h->klen);
			e->klen = h->klen;
			e->g = g;
			e->h = hh;
			if (++f->n * 2 > f->cap && (ret = grow(f)))
				return ret;
			e = cell(f, key, h->klen, g, hh); /* (grow moved it) */
		}
		e->wid = h->wid;
		e->pass = f->pass;
		ps->st->items++;
		ps->st->bytes += (uint64_t)h->klen + h->vlen;
		hkv_cluster_progress_add(HKV_PROGRESS_REPAIR, (uint64_t)h->klen + h->vlen, 1);
	}
	return 0;
}

/*
 * What a pass is to copy, counted before it copies (its progress's total):
 * the keys and values of the filled partitions' present entries whose
 * write id a gainer lacks. Online, clients write meanwhile: an estimate
 * (nothing is copied here, a block torn under the read is counted as it
 * reads).
 */
static void count(struct pass *ps, struct hkv_store *s, uint64_t *bytes, uint64_t *items)
{
	const struct hkv_geometry *g = s->geom;
	uint8_t *base = s->region.base;
	const uint64_t *slots = (const uint64_t *)(base + g->index_off);
	uint64_t nslots = g->nbuckets * HKV_BUCKET_SLOTS;
	uint64_t data_end = g->data_off + (uint64_t)g->nsegs * g->seg_size;

	*bytes = *items = 0;
	for (uint64_t i = 0; i < nslots; i++) {
		uint64_t sl = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE), off, rel;
		const struct hkv_block_hdr *h;
		uint16_t klen;
		uint32_t cls, vlen, p;

		if (!sl)
			continue;
		if (!(i & 4095) && halted(ps))
			return;
		off = hkv_slot_off(sl);
		cls = hkv_slot_class(sl);
		if (cls >= g->nclasses || off < g->data_off || off >= data_end)
			continue;
		rel = off - g->data_off;
		if (rel % g->seg_size + g->class_size[cls] > g->seg_size ||
		    (rel % g->seg_size) % g->class_size[cls])
			continue;
		h = (const struct hkv_block_hdr *)(base + off);
		klen = __atomic_load_n(&h->klen, __ATOMIC_RELAXED);
		vlen = __atomic_load_n(&h->vlen, __ATOMIC_RELAXED);
		if (!klen || klen > HKV_MAX_KEY ||
		    (uint64_t)HKV_BLOCK_HDR + klen + vlen > g->class_size[cls])
			continue;
		p = hkv_cmap_partition(ps->target, (const uint8_t *)(h + 1), klen);
		if (!filled_here(ps->cur, ps->target, p, ps->self))
			continue;
		for (uint32_t r = 0; r < hkv_cmap_len(ps->target, p); r++) {
			uint16_t gi = ps->target->repl[(size_t)p * ps->target->replicas + r];
			const struct entry *e;

			if (hkv_cmap_holds(ps->cur, p, ps->target->names[gi]))
				continue;
			e = cell(ps->f, (const uint8_t *)(h + 1), klen, gi,
				 hash_of(ps->f, (const uint8_t *)(h + 1), klen, gi));
			if (e->key && e->wid == __atomic_load_n(&h->wid, __ATOMIC_RELAXED))
				continue;
			*bytes += (uint64_t)klen + vlen;
			(*items)++;
		}
	}
}

/*
 * Walk A's index. Clients write it meanwhile (online passes), so each
 * block is copied out and taken only if it is the key's entry as a reader
 * takes it - LIVE, or retired by a replace that was cut off before its
 * slot CAS (OBSOLETE, not an aborted insert: present until the key's next
 * write) - with the slot's generation, passes its CRC, and the slot still
 * names it afterwards.
 */
static int walk(struct pass *ps, struct hkv_store *s, uint8_t *buf)
{
	const struct hkv_geometry *g = s->geom;
	uint8_t *base = s->region.base;
	uint64_t *slots = (uint64_t *)(base + g->index_off);
	uint64_t nslots = g->nbuckets * HKV_BUCKET_SLOTS;
	uint64_t data_end = g->data_off + (uint64_t)g->nsegs * g->seg_size;
	struct hkv_block_hdr *h = (struct hkv_block_hdr *)buf;

	for (uint64_t i = 0; i < nslots; i++) {
		uint64_t sl = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE), off, rel, meta;
		const uint8_t *blk;
		uint32_t cls, len;
		int ret;

		if (!sl)
			continue;
		if (!(i & 4095) && halted(ps))
			return -ECANCELED;
		off = hkv_slot_off(sl);
		cls = hkv_slot_class(sl);
		if (cls >= g->nclasses || off < g->data_off || off >= data_end)
			continue;
		len = g->class_size[cls];
		rel = off - g->data_off;
		if (rel % g->seg_size + len > g->seg_size || (rel % g->seg_size) % len)
			continue;
		blk = base + off;
		meta = __atomic_load_n((const uint64_t *)blk, __ATOMIC_ACQUIRE);
		if ((hkv_meta_state(meta) != HKV_BLK_LIVE &&
		     (hkv_meta_state(meta) != HKV_BLK_OBSOLETE || (meta & HKV_META_ABORTED))) ||
		    hkv_meta_class(meta) != cls || (hkv_meta_gen(meta) & 0x7ff) != hkv_slot_ver(sl))
			continue; /* pending (never acknowledged), or changing */
		memcpy(buf, blk, HKV_BLOCK_HDR);
		if (!h->klen || h->klen > HKV_MAX_KEY ||
		    (uint64_t)HKV_BLOCK_HDR + h->klen + h->vlen > len) {
			ps->st->skipped++;
			continue;
		}
		memcpy(buf + HKV_BLOCK_HDR, blk + HKV_BLOCK_HDR, (size_t)h->klen + h->vlen);
#ifndef __SANITIZE_THREAD__ /* (TSan has no fences; the CRC still catches a torn copy) */
		__atomic_thread_fence(__ATOMIC_ACQUIRE); /* the copy before the re-reads */
#endif
		if (__atomic_load_n((const uint64_t *)blk, __ATOMIC_ACQUIRE) != meta ||
		    __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE) != sl ||
		    h->meta != meta || h->sum != hkv_block_sum(h, buf + HKV_BLOCK_HDR)) {
			ps->st->skipped++; /* rewritten under us */
			continue;
		}
		ret = fill_item(ps, h);
		if (ret)
			return ret;
	}
	return 0;
}

int hkv_fill_pass(struct hkv_fill *f, struct hkv_store *s, const struct hkv_cmap *cur,
		  const struct hkv_cmap *target, const struct hkv_cmember *homes, const char *self,
		  const char *token, uint64_t max_value, int final, int (*halt)(void *),
		  void *halt_arg, struct hkv_fill_stats *st)
{
	struct pass ps = {f, cur, target, homes, self, token, max_value, halt, halt_arg, st};
	uint64_t t0 = now_ns();
	uint8_t *buf;
	int ret;

	memset(st, 0, sizeof(*st));
	if (!hkv_fill_source(cur, target, self))
		return 1; /* (a server on the lists that fills nothing: fenced only) */
	buf = hkv_malloc(s->geom->class_size[s->geom->nclasses - 1]);
	if (!buf)
		return -ENOMEM;
	f->pass++;
	hkv_cluster_progress_begin(HKV_PROGRESS_REPAIR, f->rev, f->pass, final);
	if (!final) { /* (fenced, the final pass copies little: not counted first) */
		uint64_t bytes, items;

		count(&ps, s, &bytes, &items);
		hkv_cluster_progress_total(HKV_PROGRESS_REPAIR, bytes, items);
	}
	ret = walk(&ps, s, buf);
	hkv_cluster_progress_end(HKV_PROGRESS_REPAIR);
	hkv_free(buf);
	if (ret)
		return ret;
	if (final) {
		/* fenced, A's keys stay put. A key copied before and gone now
		 * had its tombstone reclaimed (a delete's, taken off every
		 * replica again: only that takes a key away): take the copy off
		 * the gainer too, exactly that write. One changing, or a gainer
		 * holding another write, means the final pass cannot vouch for
		 * the gainers; fail, so the move is dropped rather than
		 * committed */
		for (uint64_t i = 0; i < f->cap && !st->skipped; i++) {
			struct entry *e = &f->t[i];
			struct hkv_client *c;

			if (!e->key || e->pass == f->pass)
				continue;
			ret = gainer_handle(f, homes, e->g, token, max_value, &c);
			if (!ret)
				ret = hkv_remove_copy(c, e->key, e->klen, e->wid);
			if (ret && ret != HKV_ENOTFOUND) {
				st->unseen++;
				continue;
			}
			e->pass = f->pass;
			st->taken_back++;
		}
		if (st->skipped || st->unseen) {
			hkv_err("cluster: a repair's final pass found %llu items changing and %llu "
				"copied before gone, fenced: the repair fails",
				(unsigned long long)st->skipped, (unsigned long long)st->unseen);
			return -EAGAIN;
		}
		return 1;
	}
	return st->items * 100 <= st->seen || now_ns() - t0 < 200000000ull;
}
