/*
 * api.c - the public operations (include/hatchkv.h): each checks its key
 * and the connection, counts its round trips and bytes, and runs the
 * protocol of its room; multi-get (rounds of one chain each: cached keys'
 * blocks and cold keys' buckets, with the candidates of the cold keys of
 * the round before; in two halves for a cluster handle), flush_all and
 * count_items (index walks).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "client/client_int.h"
#include "client/copy.h"
#include "client/ops_int.h"
#include "client/replica.h"
#include "common/hkv_alloc.h"
#include "common/transport_int.h"

#define REL_EXPTIME_MAX (60 * 60 * 24 * 30) /* memcached: up to 30 days is relative */

/* memcached's exptime rules -> absolute Unix seconds (0 = never). */
static uint32_t abs_exptime(const struct hkv_client *c, int64_t exptime)
{
	if (exptime == 0)
		return 0;
	if (exptime < 0)
		return 1; /* long past: expired at once */
	if (exptime <= REL_EXPTIME_MAX)
		return hkv_region_s(c) + (uint32_t)exptime;
	return exptime > UINT32_MAX ? UINT32_MAX : (uint32_t)exptime;
}

/* ---- read-modify-write: the new values (hkv_modify in write.c) ---------------- */

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
	const struct hkv_block_hdr *h = hkv_item_hdr(old);
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
	const uint64_t *version; /* only if the item's version is this (hkv_append_if) */
};

static int append_fn(struct hkv_client *c, const struct item *old, struct value *v, void *arg)
{
	struct append_arg *a = arg;
	const struct hkv_block_hdr *h = hkv_item_hdr(old);
	const uint8_t *oldv = old->blk + HKV_BLOCK_HDR + h->klen;

	if (a->version && h->wid != *a->version)
		return HKV_EVERSION; /* (the publish CASes exactly this item: no gap) */
	*v = (struct value){.flags = h->flags, .exptime = h->exptime};
	v->p1 = a->prepend ? a->data : oldv;
	v->l1 = a->prepend ? a->len : h->vlen;
	v->p2 = a->prepend ? oldv : a->data;
	v->l2 = a->prepend ? h->vlen : a->len;
	return 0;
}

static int touch_fn(struct hkv_client *c, const struct item *old, struct value *v, void *arg)
{
	const struct hkv_block_hdr *h = hkv_item_hdr(old);

	*v = (struct value){.p1 = old->blk + HKV_BLOCK_HDR + h->klen, .l1 = h->vlen,
			    .flags = h->flags, .exptime = *(uint32_t *)arg,
			    .wid = h->wid}; /* the same write, later expiry: cas tokens still match */
	return 0;
}

/* ---- public operations ---------------------------------------------------------- */

static void op_begin(struct hkv_client *c, struct op_scope *s, enum hkv_op op)
{
	s->before = c->conn->stats;
	s->op = op;
}

static int op_end(struct hkv_client *c, const struct op_scope *s, int ret)
{
	struct hkv_op_stats *o = &c->stats.op[s->op];
	const struct hkv_conn_stats *now = &c->conn->stats;

	hkv_alloc_tidy(c);
	o->count++;
	o->round_trips += now->round_trips - s->before.round_trips;
	o->bytes_read += now->bytes_read - s->before.bytes_read;
	o->bytes_written += now->bytes_written - s->before.bytes_written;
	return ret;
}

HKV_EXPORT uint32_t hkv_time(struct hkv_client *c)
{
	if (c->router)
		return hkv_router_time(c);
	if (c->repl)
		return hkv_repl_time(c);
	if (!c->conn->error)
		(void)hkv_clock_keep(c); /* (failed: the offset we had) */
	return hkv_region_s(c);
}

static void fill_info(const struct item *it, struct hkv_item_info *info)
{
	if (!info)
		return;
	info->version = hkv_item_version(it);
	info->flags = hkv_item_hdr(it)->flags;
	info->exptime = hkv_item_hdr(it)->exptime;
}

/* A GET's item, found and live (the rest of a GET: copy or point). */
static int get_item(struct hkv_client *c, const struct key *k, struct item *it)
{
	struct view view;
	int ret = hkv_find(c, k, it, &view);

	hkv_pol_access(c, k->h);
	if (!ret && hkv_block_tomb(hkv_item_hdr(it))) {
		ret = HKV_ENOTFOUND; /* a replicated delete */
	} else if (!ret && hkv_item_expired(c, it)) {
		/* a miss; reclaim its memory now (one round trip, expired hits only;
		 * never on a replica, which only replicated writes change) */
		if (!c->readonly && !c->repl_member && it->state == HKV_BLK_LIVE &&
		    !(hkv_item_hdr(it)->pred & HKV_PRED_REPL) &&
		    hkv_publish_remove(c, it, NULL) == 0)
			c->stats.expired_reclaimed++;
		hkv_cache_drop(c->cache, k->h);
		ret = HKV_ENOTFOUND;
	} else if (!ret) {
		hkv_touch_atime(c, it);
	}
	return ret;
}

HKV_EXPORT int hkv_get_view(struct hkv_client *c, const void *key, size_t klen, const void **val,
			    size_t *vlen, struct hkv_item_info *info)
{
	HKV_ROUTE_READ(c, key, klen, hkv_get_view(c, key, klen, val, vlen, info));
	if (c->repl)
		c = hkv_repl_primary(c); /* the one replica read */
	struct op_scope sc;
	struct item it;
	struct key k;
	int ret = hkv_key_ready(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, HKV_OP_GET);
	ret = get_item(c, &k, &it);
	if (!ret) {
		const struct hkv_block_hdr *h = hkv_item_hdr(&it);

		*vlen = h->vlen;
		*val = it.blk + HKV_BLOCK_HDR + h->klen; /* in the handle's read buffer */
		fill_info(&it, info);
	}
	return op_end(c, &sc, ret);
}

/* A GET is a view, copied out (the block is already in our read buffer). */
HKV_EXPORT int hkv_get(struct hkv_client *c, const void *key, size_t klen, void *buf, size_t cap,
		       size_t *vlen, struct hkv_item_info *info)
{
	const void *val;
	int ret = hkv_get_view(c, key, klen, &val, vlen, info);

	if (!ret && *vlen > cap)
		ret = -ENOSPC;
	else if (!ret && *vlen)
		memcpy(buf, val, *vlen);
	return ret;
}

/* Start of every write: the key is valid and this handle may write. */
static int write_key(struct hkv_client *c, struct key *k, const void *key, size_t klen)
{
	int ret = hkv_key_ready(c, k, key, klen);

	return ret ? ret : c->readonly ? -EPERM : 0;
}

/* A write of value v to key, counted as op (after routing). */
static int store_value_op(struct hkv_client *c, const void *key, size_t klen, struct value *v,
			  enum store_mode mode, uint64_t version, enum hkv_op op)
{
	struct op_scope sc;
	struct key k;
	int ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	if (v->l1 && !v->p1)
		return -EINVAL;
	op_begin(c, &sc, op);
	return op_end(c, &sc, hkv_store_value(c, &k, mode, v, version));
}

static int store_op(struct hkv_client *c, const void *key, size_t klen, const void *val,
		    size_t vlen, const struct hkv_write_opts *opts, enum store_mode mode,
		    uint64_t version, enum hkv_op op)
{
	HKV_ROUTE(c, key, klen, store_op(c, key, klen, val, vlen, opts, mode, version, op));
	struct value v = {.p1 = val, .l1 = vlen};

	if (opts) {
		v.flags = opts->flags;
		v.exptime = abs_exptime(c, opts->exptime);
	}
	if (c->repl) {
		struct repl_op rop = {.kind = REPL_STORE, .op = op, .mode = mode,
				      .version = version, .v = &v};

		return vlen && !val ? -EINVAL : hkv_repl_write(c, key, klen, &rop);
	}
	return store_value_op(c, key, klen, &v, mode, version, op);
}

/*
 * The server's copy of an item into its new home (server/mover.c) or a new
 * replica (server/filler.c): a store that keeps the item's write id (so a
 * version read before the move still matches) and pred. exptime is
 * absolute, as in the block. Not routed: c is a per-server handle.
 */
static int put_block(struct hkv_client *c, const void *key, size_t klen, const void *val,
		     size_t vlen, uint32_t flags, uint32_t exptime, uint64_t wid, uint64_t pred,
		     enum store_mode mode, uint64_t version)
{
	struct value v = {.p1 = val, .l1 = vlen, .flags = flags, .exptime = exptime, .wid = wid,
			  .pred = pred};

	return store_value_op(c, key, klen, &v, mode, version, HKV_OP_SET);
}

int hkv_put_copy(struct hkv_client *c, const void *key, size_t klen, const void *val,
		 size_t vlen, uint32_t flags, uint32_t exptime, uint64_t wid, uint64_t pred)
{
	return put_block(c, key, klen, val, vlen, flags, exptime, wid, pred, STORE_SET, 0);
}

int hkv_put_exact(struct hkv_client *c, const void *key, size_t klen, const void *val,
		  size_t vlen, uint32_t flags, uint32_t exptime, uint64_t wid, uint64_t pred,
		  uint64_t from)
{
	return put_block(c, key, klen, val, vlen, flags, exptime, wid, pred, STORE_EXACT, from);
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
	int ret;

	if (c->repl) {
		struct repl_op rop = {.kind = REPL_MODIFY, .op = op, .fn = fn, .arg = arg};

		return hkv_repl_write(c, key, klen, &rop);
	}
	ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, op);
	return op_end(c, &sc, hkv_modify(c, &k, fn, arg, op));
}

HKV_EXPORT int hkv_append(struct hkv_client *c, const void *key, size_t klen, const void *val,
			  size_t vlen, int prepend)
{
	struct append_arg a = {.data = val, .len = vlen, .prepend = prepend};

	if (vlen && !val)
		return -EINVAL;
	return modify_op(c, key, klen, append_fn, &a, HKV_OP_APPEND);
}

HKV_EXPORT int hkv_append_if(struct hkv_client *c, const void *key, size_t klen, const void *val,
			     size_t vlen, int prepend, uint64_t version)
{
	struct append_arg a = {.data = val, .len = vlen, .prepend = prepend, .version = &version};

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
	uint32_t e = abs_exptime(c, exptime);

	return modify_op(c, key, klen, touch_fn, &e, HKV_OP_TOUCH);
}

static int delete_once(struct hkv_client *c, const struct key *k, int warm,
		       const uint64_t *version)
{
	/* (versioned: never blind - the version is checked in the block READ
	 * the find makes, and the mark CASes exactly that item) */
	struct hkv_loc lc, *loc = warm && !version ? hkv_cached_loc(c, k, &lc, 1) : NULL;
	struct item it;
	struct view view;
	int ret, expired;

	if (loc && hkv_loc_fits_key(c, loc, k)) {
		struct hkv_block_hdr *h = (struct hkv_block_hdr *)c->rblk;

		/* an entry of this very key: the header read just before the mark is
		 * the removed item's, so its expiry decides the answer (when the
		 * mark was ours; else the marker's removal is the one that counts) */
		it = hkv_item_of_loc(loc);
		hkv_cache_drop(c->cache, k->h);
		ret = hkv_publish_remove(c, &it, h);
		if (ret || c->atom[0] != hkv_meta_live(&it))
			return ret;
		return h->exptime && h->exptime <= hkv_region_s(c) ? HKV_ENOTFOUND : 0;
	}
	/* no entry to act on blind: find the key (its block READ confirms it) */
	ret = warm ? hkv_find(c, k, &it, &view) : hkv_find_cold(c, k, &it, &view, NULL, 0);
	if (ret)
		return ret;
	expired = hkv_item_expired(c, &it);
	if (version && !expired && hkv_item_version(&it) != *version)
		return HKV_EVERSION;
	hkv_cache_drop(c->cache, k->h);
	ret = hkv_publish_remove(c, &it, NULL);
	return ret == 0 && expired ? HKV_ENOTFOUND : ret;
}

static int delete_op(struct hkv_client *c, const void *key, size_t klen, const uint64_t *version)
{
	HKV_ROUTE(c, key, klen, delete_op(c, key, klen, version));
	struct retry rt;
	struct op_scope sc;
	struct key k;
	int ret;

	if (c->repl) {
		struct repl_op rop = {.kind = REPL_DELETE, .op = HKV_OP_DELETE,
				      .version = version ? *version : 0, .has_version = !!version};

		return hkv_repl_write(c, key, klen, &rop);
	}
	ret = write_key(c, &k, key, klen);

	if (ret)
		return ret;
	op_begin(c, &sc, HKV_OP_DELETE);
	hkv_retry_begin(&rt);
	ret = delete_once(c, &k, 1, version);
	while (ret == CONFLICT || ret == STALE) {
		c->stats.op[HKV_OP_DELETE].retries++;
		if ((ret = ret == STALE ? hkv_retry_stale(c, &rt) : hkv_retry_wait(c, &rt)))
			break;
		ret = delete_once(c, &k, 0, version);
	}
	return op_end(c, &sc, ret);
}

/*
 * Remove the key's entry on the single-server handle c only if it is the
 * write wid (expired or not, a tombstone or not): a replicated store's
 * reclamation of a tombstone (replica.c) and a repair taking back a copy
 * of one (server/filler.c). 0 removed by us, HKV_ENOTFOUND (no entry),
 * HKV_EVERSION (another write's), or an error.
 */
static int remove_exact(struct hkv_client *c, const struct key *k, uint64_t wid)
{
	struct retry rt;

	/* Right after this handle stored wid (a delete's step): where that store
	 * put it, no READ to confirm it - the mark CAS expects exactly that
	 * incarnation, LIVE, and a write id is one block's. (Not from the
	 * location cache: handles of one config share it, and its stamps are
	 * coarse: another's entry of the key could pass for ours.) */
	if (c->last_version == wid && c->last_stored.slot_off) {
		struct item it = {.slot_off = c->last_stored.slot_off, .slot = c->last_stored.slot,
				  .blk_off = c->last_stored.blk_off, .cls = c->last_stored.cls,
				  .gen = c->last_stored.gen, .seen_ns = c->last_stored.seen_ns};
		int ret;

		c->last_stored.slot_off = 0;
		hkv_cache_drop(c->cache, k->h);
		if ((ret = hkv_publish_remove(c, &it, NULL)) <= 0)
			return ret;
	}
	hkv_retry_begin(&rt);
	for (int attempt = 0;; attempt++) {
		struct item it;
		struct view view;
		int ret = attempt ? hkv_find_cold(c, k, &it, &view, NULL, 0) : hkv_find(c, k, &it, &view);

		if (ret)
			return ret;
		if (hkv_item_version(&it) != wid)
			return HKV_EVERSION;
		hkv_cache_drop(c->cache, k->h);
		ret = hkv_publish_remove(c, &it, NULL);
		if (ret <= 0)
			return ret;
		c->stats.op[HKV_OP_DELETE].retries++;
		if (ret == STALE ? hkv_retry_stale(c, &rt) : hkv_retry_wait(c, &rt))
			return HKV_EAGAIN;
	}
}

int hkv_remove_copy(struct hkv_client *c, const void *key, size_t klen, uint64_t wid)
{
	struct key k;
	int ret = write_key(c, &k, key, klen);

	return ret ? ret : remove_exact(c, &k, wid);
}

HKV_EXPORT int hkv_delete(struct hkv_client *c, const void *key, size_t klen)
{
	return delete_op(c, key, klen, NULL);
}

HKV_EXPORT int hkv_delete_if(struct hkv_client *c, const void *key, size_t klen, uint64_t version)
{
	return delete_op(c, key, klen, &version);
}

/* ---- multi-get ------------------------------------------------------------------ */

/* A multi-get item found: copy its value out (or say why not), as hkv_get
 * does: an expired item is a miss (and its cache entry goes; its memory is
 * left to the next single-key read or eviction), a live one is touched
 * (cache mode: LRU). */
static void mget_found(struct hkv_client *c, struct hkv_mget_item *m, const struct item *it,
		       const uint8_t *blk)
{
	const struct hkv_block_hdr *h = (const struct hkv_block_hdr *)blk;
	int gone = hkv_item_expired(c, it) || hkv_block_tomb(h);
	struct key k;
	/* (the key's hash only when something needs it: no hash per found
	 * item in a store) */
	int keyed = (gone || c->pol) && !hkv_key_init(c, &k, m->key, m->klen);

	if (keyed)
		hkv_pol_access(c, k.h);
	if (gone) {
		if (keyed)
			hkv_cache_drop(c->cache, k.h);
		m->status = HKV_ENOTFOUND;
		return;
	}
	hkv_touch_atime(c, it);
	m->vlen = h->vlen;
	m->status = h->vlen > m->cap ? -ENOSPC : 0;
	if (!m->status)
		memcpy(m->buf, blk + HKV_BLOCK_HDR + h->klen, h->vlen);
	fill_info(it, &m->info);
}

/* A block read through a multi-get item's cached location: taken (1) if it
 * is still the key's current value, else 0 (replaced, reused or torn). */
static int mget_take(struct hkv_client *c, struct hkv_mget_item *m, const struct hkv_loc *loc,
		     uint8_t *blk, uint64_t seen_ns)
{
	struct item it;

	if (!hkv_loc_block_current(c, loc, blk, m->key, (uint16_t)m->klen))
		return 0;
	c->stats.cache_hits++;
	hkv_item_from_block(&it, blk, loc->slot_addr, loc->slot, -1, seen_ns);
	mget_found(c, m, &it, blk);
	return 1;
}

/* May a cached location be read through (as hkv_find_warm asks)? */
static int mget_loc_ok(const struct hkv_client *c, const struct hkv_loc *loc)
{
	return hkv_slot_sane(c, loc->slot) && loc->blen <= c->read_cap &&
	       loc->blen <= c->g.class_size[hkv_slot_class(loc->slot)];
}

/*
 * Multi-get in rounds, each one chain and one round trip. A round READs
 * first the candidate blocks of the cold keys whose buckets the round
 * before read, then, in the room left, looks at keys not seen yet: a key
 * with a usable cached location has its block read, any other its two
 * buckets. So warm keys take one round trip and cold ones two, however
 * many there are, as long as a round's READs fit: the room of a round is
 * the send queue's (the connection's sq_depth, 1024 work requests: one
 * warm key takes 1, a cold key 2 and then 1 per candidate, usually 1) and
 * the read buffer's (read_cap: a bucket pair is 256 B, a block its class).
 * A larger batch takes one more round trip per round it overflows into
 * (the candidates of one round ride with the buckets of the next).
 *
 * A cold key's view (its buckets, and when their READs were posted) is
 * checked as the single-key path checks it: its candidates' READs must
 * complete while it is fresh (hkv_view_fresh); a view too old is read
 * again in a later round. A cached block found stale sends its key to its
 * buckets. After MG_TRIES looks at one key, or a candidate read torn, or
 * candidates that never fit a round, the key takes the single-key path.
 */
#define MG_TRIES 3
#define MG_STACK_WORDS 1536 /* a small batch's state on the stack (12 KiB: ~12 keys) */

enum { MG_WARM, MG_BUCKETS, MG_CAND };

/* A cold key between its buckets' READs and its candidates' (item SIZE_MAX:
 * nothing left to check). */
struct mg_cold {
	size_t item;
	struct key k;
	struct view v; /* v.seen_ns: when the round with its buckets' READs was posted */
};

/* What one READ of a round brings (a bucket pair: one entry), and where in rblk. */
struct mg_read {
	uint8_t kind;
	int8_t pos;  /* MG_CAND: the candidate's canonical position */
	size_t ref;  /* MG_WARM: the item; else its place in the cold ring */
	size_t off;
};

struct mget_run {
	struct hkv_mget_item *items;
	size_t n, next;       /* items [next, n) not looked at yet */
	uint8_t *tries;       /* per item: looks so far */
	size_t *again;        /* ring of n: items to look at again, by their buckets */
	size_t again_head, again_n;
	struct mg_cold *cold; /* ring: [cold_head, cold_tail) wait for their candidates */
	size_t cold_cap, cold_head, cold_tail;
	struct hkv_wr *wrs;   /* one round: up to max_wr work requests */
	struct mg_read *rd;   /* ... and nrd reads */
	struct hkv_loc *locs; /* MG_WARM reads: the location read through */
	int max_wr, nrd;
	void *mem;
};

/* A multi-get's state, in buf (buf_len bytes, 8-aligned) if it fits, else
 * allocated (r->mem, freed by mget_run_fini). */
static int mget_run_init(struct hkv_client *c, struct mget_run *r, struct hkv_mget_item *items,
			 size_t n, void *buf, size_t buf_len)
{
	size_t max_wr = (size_t)c->conn->sq_depth, len;
	uint8_t *p;

	memset(r, 0, sizeof(*r));
	r->items = items;
	r->n = n;
	if (!n)
		return 0;
	if (n > SIZE_MAX / 1024)
		return -ENOMEM;
	/* a round holds at most every key's first READs, or one key's candidates */
	if (max_wr > 2 * n + CANON_SLOTS)
		max_wr = 2 * n + CANON_SLOTS;
	r->max_wr = (int)max_wr;
	r->cold_cap = n < max_wr + 32 ? n : max_wr + 32;
	len = max_wr * (sizeof(*r->wrs) + sizeof(*r->rd) + sizeof(*r->locs)) +
	      r->cold_cap * sizeof(*r->cold) + n * (sizeof(*r->again) + 1);
	p = buf;
	if (len > buf_len && !(r->mem = p = hkv_malloc(len)))
		return -ENOMEM;
	r->wrs = (struct hkv_wr *)p;
	p += max_wr * sizeof(*r->wrs);
	r->rd = (struct mg_read *)p;
	p += max_wr * sizeof(*r->rd);
	r->locs = (struct hkv_loc *)p;
	p += max_wr * sizeof(*r->locs);
	r->cold = (struct mg_cold *)p;
	p += r->cold_cap * sizeof(*r->cold);
	r->again = (size_t *)p;
	p += n * sizeof(*r->again);
	r->tries = p;
	memset(r->tries, 0, n);
	return 0;
}

static void mget_run_fini(struct mget_run *r)
{
	hkv_free(r->mem);
}

/* Look at item i again, by its buckets; after MG_TRIES looks it stays
 * CONFLICT: the single-key path. */
static void mget_again(struct mget_run *r, size_t i)
{
	if (r->tries[i] < MG_TRIES)
		r->again[(r->again_head + r->again_n++) % r->n] = i;
}

/* A key's cached block turned out stale: forget the entry, ask the index
 * (as hkv_find_warm does). */
static void mget_stale_block(struct hkv_client *c, struct mget_run *r, size_t i)
{
	struct key k;

	if (!hkv_key_init(c, &k, r->items[i].key, r->items[i].klen))
		hkv_cache_drop(c->cache, k.h);
	c->stats.cache_misses++;
	mget_again(r, i);
}

/* Item i (key k) waits for its candidates in the cold ring (a place is free). */
static struct mg_cold *mget_cold_add(struct mget_run *r, size_t i, const struct key *k)
{
	struct mg_cold *e = &r->cold[r->cold_tail++ % r->cold_cap];

	e->item = i;
	e->k = *k;
	return e;
}

/* Is a view seen at seen_ns still fresh? One clock read for the keys of one
 * round (they share seen_ns); a stale one is counted once. */
static int mget_fresh(struct hkv_client *c, uint64_t seen_ns, uint64_t *last_seen, int *last)
{
	if (seen_ns != *last_seen) {
		*last_seen = seen_ns;
		*last = hkv_view_fresh(c, seen_ns);
	}
	return *last;
}

/* Candidates of the waiting cold keys, into the round (r->wrs from *nwr,
 * rblk from *used). Returns the end of the cold keys it is done with this
 * round; *deferred if some wait for the next. */
static size_t mget_round_cands(struct hkv_client *c, struct mget_run *r, int room, int *nwr,
			       size_t *used, int *deferred, int *progress)
{
	uint64_t last_seen = 0;
	int fresh = 0;
	size_t q;

	for (q = r->cold_head; q != r->cold_tail; q++) {
		struct mg_cold *e = &r->cold[q % r->cold_cap];
		int cand[CANON_SLOTS], nc = 0;
		size_t need = 0;

		for (int p = 0; p < CANON_SLOTS; p++) {
			uint64_t s = e->v.slot[p];

			if (!s || hkv_slot_fp(s) != e->k.fp || !hkv_slot_sane(c, s))
				continue;
			cand[nc++] = p;
			need += (c->g.class_size[hkv_slot_class(s)] + 63) & ~(size_t)63;
		}
		if (!nc || !mget_fresh(c, e->v.seen_ns, &last_seen, &fresh)) {
			if (!nc) { /* no candidate when the buckets were read: absent */
				r->items[e->item].status = HKV_ENOTFOUND;
				hkv_pol_access(c, e->k.h);
			}
			else /* too old to pair with a block: the buckets again */
				mget_again(r, e->item);
			e->item = SIZE_MAX;
			*progress = 1;
			continue;
		}
		if (*nwr + nc > room || *used + need > c->read_cap) {
			if (*nwr) { /* the next round has room for them */
				*deferred = 1;
				break;
			}
			e->item = SIZE_MAX; /* never fits a round: the single-key path */
			*progress = 1;
			continue;
		}
		for (int j = 0; j < nc; j++) {
			uint64_t s = e->v.slot[cand[j]];
			uint32_t sz = c->g.class_size[hkv_slot_class(s)];

			r->rd[r->nrd++] = (struct mg_read){.kind = MG_CAND, .pos = (int8_t)cand[j],
							   .ref = q, .off = *used};
			r->wrs[(*nwr)++] = hkv_wr_read(c, c->rblk + *used, hkv_slot_off(s), sz);
			*used += (sz + 63) & ~(size_t)63;
		}
	}
	return q;
}

/* Build one round: the waiting candidates, then first looks at more keys
 * in the room left (none while candidates wait for room). Returns its
 * length; *cand_end as mget_round_cands. */
static int mget_round(struct hkv_client *c, struct mget_run *r, size_t *cand_end, int *progress)
{
	int room = hkv_room(c), nwr = 0, deferred = 0;
	size_t used = 0;

	if (room > r->max_wr)
		room = r->max_wr;
	r->nrd = 0;
	*cand_end = mget_round_cands(c, r, room, &nwr, &used, &deferred, progress);
	while (!deferred && nwr < room && (r->again_n || r->next < r->n)) {
		int again = r->again_n > 0;
		size_t i = again ? r->again[r->again_head % r->n] : r->next;
		struct hkv_mget_item *m = &r->items[i];
		struct hkv_loc *loc = &r->locs[r->nrd]; /* (nrd <= nwr < room) */
		struct key k;

		if (!again) {
			m->status = hkv_key_init(c, &k, m->key, m->klen);
			if (m->status) { /* a bad key: its answer */
				r->next++;
				*progress = 1;
				continue;
			}
			m->status = CONFLICT; /* being read */
		} else {
			(void)hkv_key_init(c, &k, m->key, m->klen); /* (it was fine before) */
		}
		if (!again && hkv_cached_loc(c, &k, loc, 0) && mget_loc_ok(c, loc)) { /* a block */
			size_t sz = (loc->blen + 63) & ~(size_t)63; /* keep headers aligned */
			uint64_t off = hkv_slot_off(loc->slot);

			if (nwr + 1 > room || used + sz > c->read_cap)
				break;
			r->rd[r->nrd++] = (struct mg_read){.kind = MG_WARM, .ref = i, .off = used};
			r->wrs[nwr++] = hkv_wr_read(c, c->rblk + used, off, loc->blen);
			used += sz;
		} else { /* its buckets */
			if (nwr + 2 > room || used + CANON_SLOTS * 8 > c->read_cap ||
			    r->cold_tail - r->cold_head == r->cold_cap)
				break;
			if (!again)
				c->stats.cache_misses++;
			r->rd[r->nrd++] = (struct mg_read){.kind = MG_BUCKETS, .ref = r->cold_tail,
							   .off = used};
			mget_cold_add(r, i, &k);
			nwr = hkv_append_bucket_reads(c, r->wrs, nwr, &k, c->rblk + used);
			used += CANON_SLOTS * 8;
		}
		r->tries[i]++;
		if (again) {
			r->again_head++;
			r->again_n--;
		} else {
			r->next++;
		}
	}
	return nwr;
}

/* One key's candidates read (r->rd[x, end)): the first that is the key's
 * is the answer (the view still fresh); none: absent, unless one read torn
 * (the single-key path looks again). */
static void mget_settle_cands(struct hkv_client *c, struct mget_run *r, int x, int end,
			      uint64_t *last_seen, int *fresh)
{
	struct mg_cold *e = &r->cold[r->rd[x].ref % r->cold_cap];
	struct hkv_mget_item *m = &r->items[e->item];
	int torn = 0;

	if (!mget_fresh(c, e->v.seen_ns, last_seen, fresh)) { /* its buckets, read again */
		mget_again(r, e->item);
		return;
	}
	for (; x < end; x++) {
		struct item it;
		uint8_t *blk = c->rblk + r->rd[x].off;
		int chk = hkv_candidate_check(c, &e->k, &it, &e->v, r->rd[x].pos, blk);

		torn |= chk == TORN;
		if (!chk) {
			mget_found(c, m, &it, blk);
			return;
		}
	}
	if (!torn) {
		m->status = HKV_ENOTFOUND;
		hkv_pol_access(c, e->k.h);
	}
}

/* A round's READs have completed (posted at seen_ns): take what they read. */
static void mget_settle(struct hkv_client *c, struct mget_run *r, uint64_t seen_ns,
			size_t cand_end)
{
	uint64_t last_seen = 0;
	int fresh = 0;

	for (int x = 0; x < r->nrd;) {
		const struct mg_read *d = &r->rd[x];
		uint8_t *blk = c->rblk + d->off;
		int end = x + 1;

		if (d->kind == MG_WARM) {
			if (!mget_take(c, &r->items[d->ref], &r->locs[x], blk, seen_ns))
				mget_stale_block(c, r, d->ref);
		} else if (d->kind == MG_BUCKETS) {
			struct mg_cold *e = &r->cold[d->ref % r->cold_cap];

			memcpy(e->v.slot, blk, sizeof(e->v.slot));
			e->v.seen_ns = seen_ns;
		} else { /* a key's candidates, in a row */
			while (end < r->nrd && r->rd[end].kind == MG_CAND &&
			       r->rd[end].ref == d->ref)
				end++;
			mget_settle_cands(c, r, x, end, &last_seen, &fresh);
		}
		x = end;
	}
	r->cold_head = cand_end;
}

/* Every key not answered yet gets ret (an error: nothing more is read). */
static void mget_fail(struct mget_run *r, int ret)
{
	for (size_t i = 0; i < r->n; i++)
		if (i >= r->next || r->items[i].status == CONFLICT)
			r->items[i].status = ret;
}

/* The rounds, then the single-key path for the keys still unanswered. 0
 * (see the statuses) or an error. */
static int mget_run(struct hkv_client *c, struct mget_run *r)
{
	for (;;) {
		size_t cand_end;
		int progress = 0, nwr = mget_round(c, r, &cand_end, &progress), ret;
		uint64_t seen = hkv_coarse_ns(); /* <= when the READs run: the views' age */

		if (!nwr) {
			r->cold_head = cand_end;
			if (progress)
				continue;
			break; /* nothing left, or nothing fits (the single-key path) */
		}
		ret = hkv_exec(c, r->wrs, nwr);
		if (ret) {
			mget_fail(r, ret);
			return ret;
		}
		mget_settle(c, r, seen, cand_end);
	}
	for (; r->next < r->n; r->next++)
		r->items[r->next].status = CONFLICT;
	for (size_t i = 0; i < r->n; i++)
		if (r->items[i].status == CONFLICT)
			r->items[i].status = hkv_get(c, r->items[i].key, r->items[i].klen,
						     r->items[i].buf, r->items[i].cap,
						     &r->items[i].vlen, &r->items[i].info);
	return 0;
}

/*
 * A multi-get in two halves, so that a cluster handle posts every server's
 * first round before it waits for any (client/router.c): start builds and
 * posts the first round (as hkv_mget's: every key that fits the send queue
 * and the read buffer), finish waits for it and does the rest of the rounds
 * (the first round's cold keys' candidates ride in the second). Between
 * them the handle does nothing else; after a failed start there is no
 * finish.
 */
int hkv_mget_start(struct hkv_client *c, struct hkv_mget_item *items, size_t n,
		   struct hkv_mget_pending *pd)
{
	struct mget_run *r;
	int ret = hkv_revive(c);

	memset(pd, 0, sizeof(*pd));
	if (ret)
		return ret;
	if (!(r = pd->run = hkv_malloc(sizeof(*r))))
		return -ENOMEM;
	op_begin(c, &pd->sc, HKV_OP_MGET);
	ret = mget_run_init(c, r, items, n, NULL, 0);
	while (!ret) {
		int progress = 0, nwr = mget_round(c, r, &pd->cand_end, &progress);

		if (!nwr) {
			r->cold_head = pd->cand_end;
			if (progress)
				continue;
			return 0; /* nothing to read: finish takes the single-key path */
		}
		pd->seen_ns = hkv_coarse_ns(); /* <= when the READs run: the views' age */
		ret = hkv_post(c, r->wrs, nwr, &pd->want);
		if (!ret)
			return 0;
		pd->want = 0;
		mget_fail(r, ret);
	}
	mget_run_fini(r);
	hkv_free(r);
	pd->run = NULL;
	return op_end(c, &pd->sc, ret);
}

int hkv_mget_finish(struct hkv_client *c, struct hkv_mget_pending *pd)
{
	struct mget_run *r = pd->run;
	int ret = pd->want ? hkv_conn_wait(c->conn, NULL, pd->want) : 0;

	if (ret) {
		mget_fail(r, ret);
	} else {
		if (pd->want)
			mget_settle(c, r, pd->seen_ns, pd->cand_end);
		ret = mget_run(c, r);
	}
	mget_run_fini(r);
	hkv_free(r);
	pd->run = NULL;
	return op_end(c, &pd->sc, ret);
}

HKV_EXPORT int hkv_mget(struct hkv_client *c, struct hkv_mget_item *items, size_t n)
{
	uint64_t mem[MG_STACK_WORDS];
	struct op_scope sc;
	struct mget_run r;
	int ret;

	if (c->router)
		return hkv_router_mget(c, items, n);
	if (c->repl)
		return hkv_mget(hkv_repl_primary(c), items, n);
	ret = hkv_revive(c);
	if (ret) { /* every item says why, as after a failed chain */
		for (size_t j = 0; j < n; j++)
			items[j].status = ret;
		return ret;
	}
	op_begin(c, &sc, HKV_OP_MGET);
	ret = mget_run_init(c, &r, items, n, mem, sizeof(mem));
	if (ret) {
		for (size_t j = 0; j < n; j++)
			items[j].status = ret;
		return op_end(c, &sc, ret);
	}
	ret = mget_run(c, &r);
	mget_run_fini(&r);
	return op_end(c, &sc, ret);
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
		hkv_test_at(c, HKV_TP_FLUSH_METAS);
		for (int i = 0, batch = 0, stalls = 0; i < chunk;) {
			uint64_t seen;
			int n = 0;

			batch = i;
			/* [READ meta, READ slot again] per entry, one chain: the meta's
			 * generation and the slot value are one view (docs/design.md,
			 * "Views"), not a slot from the chunk READ paired with a
			 * generation read many round trips later */
			for (; i < chunk && n < 32; i++) {
				if (!slots[i] || !hkv_slot_sane(c, slots[i]))
					continue;
				idx[n] = i;
				wrs[2 * n] = hkv_wr_read(c, &metas[i], hkv_slot_off(slots[i]), 8);
				wrs[2 * n + 1] = hkv_wr_read(c, &again[i], base + (uint64_t)i * 8, 8);
				n++;
			}
			seen = hkv_coarse_ns();
			if (n && (ret = hkv_exec(c, wrs, 2 * n)))
				return op_end(c, &sc, ret);
			if (n && !hkv_view_fresh(c, seen)) { /* stalled between the two: again */
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

				if (s != slots[idx[j]] || hkv_meta_class(m) != it.cls ||
				    (it.gen & 0x7ff) != hkv_slot_ver(s))
					continue; /* changed since, or garbage */
				if (hkv_meta_state(m) == HKV_BLK_OBSOLETE && !(m & HKV_META_ABORTED)) {
					/* a write between its mark and its slot CAS, or one that
					 * died there: every find takes the entry as present (its
					 * value), so it goes too. Only the slot: the block is its
					 * retirer's (whose own slot CAS now fails), or the
					 * sweep's once that client is gone. No mark goes with
					 * this CAS, so only from a young view (as the LIVE path's
					 * remove: a stale one is passed over). */
					struct hkv_wr wr = hkv_wr_cas(c, &c->atom[3], it.slot_off, s, 0);

					if (!hkv_view_fresh(c, seen))
						continue;
					if ((ret = hkv_exec(c, &wr, 1)))
						return op_end(c, &sc, ret);
					continue;
				}
				if (hkv_meta_state(m) != HKV_BLK_LIVE)
					continue; /* an insert not committed, or aborted: no value */
				ret = hkv_publish_remove(c, &it, NULL);
				if (ret < 0)
					return op_end(c, &sc, ret);
			}
		}
	}
	return op_end(c, &sc, 0);
}

/*
 * A replicated store's walks (replica.h): every entry h holds that readers
 * take as present - a LIVE block, or one retired by a write cut between its
 * mark and its slot CAS; never a tombstone (a replicated delete), an insert
 * not committed, or an entry changed under the walk - and that mine (if
 * set) says to take, is handed to visit with its key and block size. Per
 * index chunk: one READ of the slots, then chains of READs of each entry's
 * header and key (one round trip per up to WALK_BATCH entries). The slots
 * and a batch's keys are copied out first, so visit may use h's buffers (a
 * delete through a handle that shares them).
 */
#define WALK_BATCH 128
#define WALK_READ  320 /* a header and the longest key, 64-aligned */

struct walk_buf {
	uint64_t slots[INDEX_CHUNK];
	uint8_t keys[WALK_BATCH][HKV_MAX_KEY];
	uint16_t klen[WALK_BATCH];
	uint32_t bytes[WALK_BATCH];
};

typedef int (*walk_visit)(void *arg, const uint8_t *key, uint16_t klen, uint32_t bytes);

static int walk_present(struct hkv_client *h, int (*mine)(void *arg, const void *key, size_t klen),
			void *marg, walk_visit visit, void *varg)
{
	uint64_t nslots = h->g.nbuckets * HKV_BUCKET_SLOTS;
	struct walk_buf *w = hkv_malloc(sizeof(*w));
	int ret = w ? hkv_revive(h) : -ENOMEM;

	for (uint64_t first = 0; !ret && first < nslots; first += INDEX_CHUNK) {
		int chunk, i = 0;

		if ((ret = read_index_chunk(h, first, (uint64_t *)h->rblk, &chunk)))
			break;
		memcpy(w->slots, h->rblk, (size_t)chunk * sizeof(uint64_t));
		while (!ret && i < chunk) {
			int room = hkv_room(h), n = 0, got = 0;
			struct hkv_wr wrs[WALK_BATCH];
			int idx[WALK_BATCH];

			if (room > WALK_BATCH)
				room = WALK_BATCH;
			if (room < 1) /* (the post waits for the transport's quiet work) */
				room = 1;
			for (; i < chunk && n < room; i++) {
				uint64_t s = w->slots[i];
				uint32_t len = HKV_BLOCK_HDR + HKV_MAX_KEY, cls;

				if (!s || !hkv_slot_sane(h, s))
					continue;
				cls = hkv_slot_class(s);
				if (len > h->g.class_size[cls])
					len = h->g.class_size[cls];
				idx[n] = i;
				wrs[n] = hkv_wr_read(h, h->rblk + (size_t)n * WALK_READ, hkv_slot_off(s),
						     len);
				n++;
			}
			if (!n || (ret = hkv_exec(h, wrs, n)))
				break;
			for (int j = 0; j < n; j++) {
				const struct hkv_block_hdr *bh =
					(const struct hkv_block_hdr *)(h->rblk + (size_t)j * WALK_READ);
				uint64_t s = w->slots[idx[j]], m = bh->meta;
				uint32_t cls = hkv_slot_class(s);
				int present = hkv_meta_state(m) == HKV_BLK_LIVE ||
					      (hkv_meta_state(m) == HKV_BLK_OBSOLETE &&
					       !(m & HKV_META_ABORTED));

				if (!present || hkv_meta_class(m) != cls ||
				    (hkv_meta_gen(m) & 0x7ff) != hkv_slot_ver(s) || hkv_block_tomb(bh) ||
				    !bh->klen || bh->klen > HKV_MAX_KEY ||
				    HKV_BLOCK_HDR + (uint32_t)bh->klen > h->g.class_size[cls])
					continue; /* (torn or garbage: a bad key only misses) */
				if (mine && !mine(marg, (const uint8_t *)bh + HKV_BLOCK_HDR, bh->klen))
					continue;
				memcpy(w->keys[got], (const uint8_t *)bh + HKV_BLOCK_HDR, bh->klen);
				w->klen[got] = bh->klen;
				w->bytes[got++] = h->g.class_size[cls];
			}
			for (int j = 0; j < got && !ret; j++)
				ret = visit(varg, w->keys[j], w->klen[j], w->bytes[j]);
		}
	}
	hkv_free(w);
	return ret;
}

/* flush_all's visit: a replicated delete through the handle arg. */
static int flush_one(void *arg, const uint8_t *key, uint16_t klen, uint32_t bytes)
{
	int ret = hkv_delete(arg, key, klen);

	(void)bytes;
	return ret == HKV_ENOTFOUND || ret == -EINVAL ? 0 : ret;
}

/*
 * A replicated store's flush_all: every key h holds (and, with a filter,
 * that it says to) is deleted through del - a replicated write each, which
 * leaves tombstones; an index walk of each replica would change one replica
 * behind the others' backs. Keys written meanwhile may survive, as with any
 * flush.
 */
int hkv_flush_by_deletes(struct hkv_client *h, struct hkv_client *del,
			 int (*mine)(void *arg, const void *key, size_t klen), void *arg)
{
	return walk_present(h, mine, arg, flush_one, del);
}

struct count_sum {
	uint64_t items, bytes;
};

static int count_one(void *arg, const uint8_t *key, uint16_t klen, uint32_t bytes)
{
	struct count_sum *t = arg;

	(void)key;
	(void)klen;
	t->items++;
	t->bytes += bytes;
	return 0;
}

/* A replicated store's count: what h holds that readers take as present. */
int hkv_count_present(struct hkv_client *h, int (*mine)(void *arg, const void *key, size_t klen),
		      void *arg, uint64_t *items, uint64_t *bytes)
{
	struct count_sum t = {0, 0};
	int ret = walk_present(h, mine, arg, count_one, &t);

	*items = t.items;
	*bytes = t.bytes;
	return ret;
}

HKV_EXPORT int hkv_flush_all(struct hkv_client *c)
{
	int ret;

	if (c->router)
		return hkv_router_flush_all(c);
	if (c->repl)
		return hkv_flush_by_deletes(hkv_repl_primary(c), c, NULL, NULL);
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
	if (c->repl) /* what its primary holds, but tombstones */
		return hkv_count_present(hkv_repl_primary(c), NULL, NULL, items, bytes);
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
			if (!slots[i] || !hkv_slot_sane(c, slots[i]))
				continue;
			(*items)++;
			*bytes += c->g.class_size[hkv_slot_class(slots[i])];
		}
	}
	return 0;
}
