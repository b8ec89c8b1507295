/*
 * replica.c - replicated writes over a fixed list of servers
 * (hkv_config_set_replicas): R0, the primary, is the only one read; the
 * last, Rk, decides between racing writes. docs/design.md, "Replicas", has
 * the argument; in short:
 *
 * Each replica keeps its own index, allocator and blocks; a write is the
 * same logical write everywhere - one write id (wid), one pred (the wid it
 * replaced, 0 for none; a delete leaves a tombstone, never an empty slot) -
 * and moves every replica's entry of the key from pred to wid with a
 * single-server STORE_EXACT step (write.c), which holds only while the
 * entry is still exactly pred. The steps run Rk first, R0 last:
 *
 *   read R0 (its entry: wid a)  ->  Rk: a -> w (the decision)
 *                               ->  R(k-1): a -> w ... R0: a -> w (takes effect)
 *
 * So on every replica a key's history is a sequence of distinct write ids,
 * R0's a prefix of R1's ... a prefix of Rk's, Rk at most one write ahead:
 * a write is decided only from the wid R0 holds, and R0 only ever takes a
 * decided write. A writer that lost on Rk and finds there a write whose
 * pred is R0's entry finishes it (copies it, same wid and pred, onto
 * R(k-1) .. R0) after it stood HKV_HELP_MS, then tries again. A step that
 * finds its replica already past a (EVERSION) needs nothing: someone
 * finished this write there.
 */
#include <errno.h>
#include <string.h>

#include <sodium.h>

#include "client/client_int.h"
#include "client/copy.h"
#include "client/ops_int.h"
#include "client/replica.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

struct hkv_repl {
	int r;
	int owned; /* the replicas' handles are ours to close (not a router's) */
	struct hkv_client *h[HKV_MAX_REPLICAS]; /* [0] primary .. [r - 1] decider */
	struct hkv_config *sub[HKV_MAX_REPLICAS]; /* one server each: its own location cache */
	uint8_t *cur, *dec, *chk; /* block copies: R0's entry, the decider's, a check's */
	size_t cap;
	/* an insert step's check (decider_holds): the key, the write stepped */
	const void *chk_key;
	size_t chk_klen;
	uint64_t chk_wid;
	int chk_err, chk_refused;
	uint64_t pend_wid, pend_ns; /* a write seen pending on the decider, since when */
	uint64_t route_end_ns; /* a router's: its view's route lease ends (coarse clock) */
};

/* What a replica holds for a key: nothing, or an entry (its block in buf). */
struct rstate {
	int present;
	uint64_t wid, pred; /* pred with HKV_PRED_TOMB */
	struct item it;
};

static int is_transport_err(int ret)
{
	return ret == HKV_EDISCONNECTED || ret == HKV_ETIMEDOUT || ret == HKV_EREMOTE_ACCESS ||
	       ret == HKV_EREMOTE_INVAL || ret == HKV_EFLUSHED || ret == HKV_ETRANSPORT;
}

/* Read the key's entry on h (any state: live, expired, a tombstone) into st,
 * its block copied to buf. cold: ask the index, not the location cache. */
static int read_state(struct hkv_repl *rp, struct hkv_client *h, const void *key, size_t klen,
		      uint8_t *buf, struct rstate *st, int cold)
{
	const struct hkv_block_hdr *hd;
	struct view v;
	struct key k;
	size_t len;
	int ret = hkv_key_ready(h, &k, key, klen);

	memset(st, 0, sizeof(*st));
	if (ret)
		return ret;
	ret = cold ? hkv_find_cold(h, &k, &st->it, &v, NULL, 0) : hkv_find(h, &k, &st->it, &v);
	if (ret == HKV_ENOTFOUND)
		return 0;
	if (ret)
		return ret;
	hd = hkv_item_hdr(&st->it);
	len = HKV_BLOCK_HDR + (size_t)hd->klen + hd->vlen;
	if (len > rp->cap)
		return HKV_ETOOBIG; /* (every replica's blocks fit every handle: see open) */
	memcpy(buf, st->it.blk, len);
	st->it.blk = buf;
	st->present = 1;
	st->wid = hd->wid;
	st->pred = hd->pred;
	return 0;
}

/* A router's replicated handle acts only within its view's route lease: a
 * write that has not decided by then is done again on a fresh view
 * (HKV_EDISCONNECTED: nothing was done), so nothing acts on a list the
 * coordinator may have changed since (it waits the lease + 0.5 s). */
static int route_over(const struct hkv_repl *rp)
{
	return rp->route_end_ns && hkv_coarse_ns() >= rp->route_end_ns;
}

void hkv_repl_route_end(struct hkv_client *c, uint64_t end_ns)
{
	c->repl->route_end_ns = end_ns;
}

/* The insert step's check (c->insert_check, publish.c): not 0 unless the
 * decider holds exactly the write being stepped. */
static int decider_holds(void *arg)
{
	struct hkv_repl *rp = arg;
	struct rstate st;
	int ret = read_state(rp, rp->h[rp->r - 1], rp->chk_key, rp->chk_klen, rp->chk, &st, 0);

	rp->chk_err = ret;
	rp->chk_refused = !ret && (!st.present || st.wid != rp->chk_wid);
	return ret || rp->chk_refused;
}

/* Replica i's step: the key's entry there from write id `from` (0: none)
 * to the write nv. 0, HKV_EVERSION (the entry is not `from`, or - an insert
 * step below the decider - the decider no longer holds nv: rp->chk_refused)
 * or <0. */
static int apply(struct hkv_repl *rp, int i, const void *key, size_t klen, uint64_t from,
		 const struct value *nv, const struct item *at)
{
	struct hkv_client *h = rp->h[i];
	uint64_t was = h->stats.reconnects;
	int check = !from && i < rp->r - 1;
	struct key k;
	int ret = hkv_key_ready(h, &k, key, klen);

	rp->chk_refused = 0;
	if (!ret && h->readonly)
		ret = -EPERM;
	if (ret)
		return ret;
	/*
	 * An insert step (from none) below the decider commits only while the
	 * decider holds the write: else one stalled past the write's later
	 * history - overwritten, deleted, its tombstone reclaimed, so the key
	 * is absent here again - would bring the old value back.
	 */
	if (check) {
		rp->chk_key = key;
		rp->chk_klen = klen;
		rp->chk_wid = nv->wid;
		rp->chk_err = 0;
		h->insert_check = decider_holds;
		h->insert_check_arg = rp;
	}
	/* (at: the caller's view of the entry, if of this connection) */
	ret = hkv_store_value_at(h, &k, STORE_EXACT, nv, from, h->stats.reconnects == was ? at : NULL);
	if (check) {
		h->insert_check = NULL;
		if (ret == HKV_EVERSION && rp->chk_err)
			ret = rp->chk_err;
	}
	return ret;
}

/* Replica i's entry of the key removed if it is write t (a tombstone):
 * 0 (removed, or none there), HKV_EVERSION (another write's) or <0. */
static int remove_on(struct hkv_repl *rp, int i, const void *key, size_t klen, uint64_t t)
{
	int ret = hkv_remove_copy(rp->h[i], key, klen, t);

	return ret == HKV_ENOTFOUND ? 0 : ret;
}

/* Finish the reclamation of tombstone t decided on the decider: take it
 * off R(from) .. R0 wherever it still is, going past a replica only while
 * it holds nothing or a write from absent (after the reclamation: below it
 * t can only be left over); one holding another write (a cluster's new
 * decider that took a write from t after the old decider was dropped)
 * ends it, t below it being that write's pred. 0 or <0. */
static int finish_reclaim(struct hkv_client *c, const void *key, size_t klen, uint64_t t,
			  int from)
{
	struct hkv_repl *rp = c->repl;

	for (int i = from; i >= 0; i--) {
		struct rstate st;
		int ret;

		if (route_over(rp))
			return 0;
		ret = remove_on(rp, i, key, klen, t);
		if (ret != HKV_EVERSION) {
			if (ret)
				return ret;
			continue;
		}
		if ((ret = read_state(rp, rp->h[i], key, klen, rp->chk, &st, 1)))
			return ret;
		if (st.present && (st.pred & HKV_WID_MASK))
			return 0;
	}
	return 0;
}

/*
 * A step from none (a write decided from absent) found replica i holding
 * an entry: if it is a tombstone t and the decider, read after it, holds
 * an entry written from absent, t's reclamation was decided (the decider
 * went from t to absent: only a reclamation takes an entry away, and only
 * a tombstone every replica held) and not finished on i: finish it there.
 * 1 if it did, or i holds nothing now (step again), 0 if not, <0.
 */
static int cleared_tomb(struct hkv_client *c, const void *key, size_t klen, int i)
{
	struct hkv_repl *rp = c->repl;
	struct rstate st, d;
	int ret = read_state(rp, rp->h[i], key, klen, rp->chk, &st, 1);

	if (!ret && !st.present)
		return 1; /* (finished there since) */
	if (ret || !(st.pred & HKV_PRED_TOMB))
		return ret;
	ret = read_state(rp, rp->h[rp->r - 1], key, klen, rp->chk, &d, 1);
	if (ret || !d.present || (d.pred & HKV_WID_MASK))
		return ret;
	ret = remove_on(rp, i, key, klen, st.wid);
	return ret ? (ret == HKV_EVERSION ? 0 : ret) : 1;
}

/* Replica i's step (apply); one from absent that finds there a tombstone
 * whose reclamation was decided finishes it and steps again. */
static int step(struct hkv_client *c, int i, const void *key, size_t klen, uint64_t from,
		const struct value *nv, const struct item *at)
{
	struct hkv_repl *rp = c->repl;
	int ret = apply(rp, i, key, klen, from, nv, at), cl;

	if (ret != HKV_EVERSION || from || rp->chk_refused)
		return ret;
	cl = cleared_tomb(c, key, klen, i);
	return cl < 0 ? cl : cl ? apply(rp, i, key, klen, 0, nv, NULL) : ret;
}

/* A delete that holds on every replica takes its tombstone t away again:
 * the decider first - the reclamation's decision, a slot CAS expecting t
 * as a racing write's decision does, so exactly one of them wins - then
 * R(k-1) .. R0. Best effort: what it leaves, the next writer of the key
 * finishes (write_once, cleared_tomb). */
static void reclaim(struct hkv_client *c, const void *key, size_t klen, uint64_t t)
{
	struct hkv_repl *rp = c->repl;

	if (route_over(rp) || remove_on(rp, rp->r - 1, key, klen, t))
		return;
	hkv_test_at(c, HKV_TP_REPL_RECLAIM);
	if (!finish_reclaim(c, key, klen, t, rp->r - 2))
		c->stats.repl_reclaimed++;
}

/* The write held in st (a block copy) as a value to copy: same wid and pred. */
static struct value value_of(const struct rstate *st)
{
	const struct hkv_block_hdr *h = hkv_item_hdr(&st->it);

	return (struct value){.p1 = st->it.blk + HKV_BLOCK_HDR + h->klen, .l1 = h->vlen,
			      .flags = h->flags, .exptime = h->exptime, .wid = h->wid,
			      .pred = h->pred};
}

/* Finish the write d found decided on the decider: copy it onto every
 * other replica still at its pred, the primary last. 0 or <0. */
static int help(struct hkv_client *c, const void *key, size_t klen, const struct rstate *d)
{
	struct hkv_repl *rp = c->repl;
	struct value v = value_of(d);

	for (int i = rp->r - 2; i >= 0; i--) {
		struct rstate st;
		int ret = step(c, i, key, klen, d->pred & HKV_WID_MASK, &v, NULL);

		if (ret && ret != HKV_EVERSION)
			return ret;
		/* refused: done there already - or, after a cluster dropped a
		 * decider, that replica took another write from the same pred
		 * (d was superseded): then never on the replicas below it */
		if (ret && (read_state(rp, rp->h[i], key, klen, rp->cur, &st, 1) || !st.present ||
			    st.wid != d->wid))
			return 0;
	}
	c->stats.repl_helps++;
	return 0;
}

/* The op's new value from the primary's entry cur, or its answer (<0). */
static int next_value(struct hkv_client *c, const struct repl_op *op, const struct rstate *cur,
		      struct value *nv, int *tomb)
{
	int live = cur->present && !(cur->pred & HKV_PRED_TOMB) && !hkv_item_expired(c, &cur->it);

	*tomb = 0;
	switch (op->kind) {
	case REPL_STORE:
		if (op->mode == STORE_ADD && live)
			return HKV_EEXISTS;
		if ((op->mode == STORE_REPLACE || op->mode == STORE_CAS) && !live)
			return HKV_ENOTFOUND;
		if (op->mode == STORE_CAS && cur->wid != op->version)
			return HKV_EVERSION;
		*nv = *op->v;
		return 0;
	case REPL_MODIFY:
		if (!live)
			return HKV_ENOTFOUND;
		return op->fn(c->repl->h[0], &cur->it, nv, op->arg);
	case REPL_DELETE:
		if (!live)
			return HKV_ENOTFOUND;
		if (op->has_version && cur->wid != op->version)
			return HKV_EVERSION;
		*nv = (struct value){0};
		*tomb = 1;
		return 0;
	}
	return -EINVAL;
}

/*
 * A step after the decision found replica i no longer at a: 0 if our write
 * w holds there (a helper finished it), or if it must have (a fixed list:
 * nothing else can pass a decided write, and the key is absent there only
 * after w was taken, overwritten, deleted and reclaimed); a cluster's list
 * may have lost the decider meanwhile, and a write decided anew from a on
 * the rest: HKV_EDISCONNECTED if the replica's entry replaced a (not
 * absent: a reclamation makes "from absent" recur) and is not w (w was
 * superseded, and takes effect nowhere: nothing was done, the router tries
 * again on the map of now), HKV_EUNKNOWN if we cannot tell.
 */
static int settled(struct hkv_client *c, const void *key, size_t klen, int i, uint64_t a,
		   uint64_t w)
{
	struct hkv_repl *rp = c->repl;
	struct rstate st;
	int ret = read_state(rp, rp->h[i], key, klen, rp->dec, &st, 1);

	if (ret)
		return HKV_EUNKNOWN;
	if (st.present && st.wid == w)
		return 0;
	if (!st.present) {
		/* absent: our write was taken, overwritten, deleted and its
		 * tombstone reclaimed - unless the decider still holds it (then
		 * that replica lost data) */
		struct rstate d;

		if (!rp->owned || read_state(rp, rp->h[rp->r - 1], key, klen, rp->chk, &d, 1) ||
		    (d.present && d.wid == w))
			return HKV_EUNKNOWN;
		return 0;
	}
	/* (a = 0: a later write from absent after a reclamation looks the same) */
	if (!rp->owned && a && (st.pred & HKV_WID_MASK) == a) {
		c->stats.repl_superseded++;
		return HKV_EDISCONNECTED;
	}
	return rp->owned ? 0 : HKV_EUNKNOWN;
}

static uint64_t conn_posts(const struct hkv_client *h)
{
	return h->conn->stats.posts;
}

static int write_once(struct hkv_client *c, const void *key, size_t klen, const struct repl_op *op);

/* A replicated write, counted as op: its round trips over every replica. */
int hkv_repl_write(struct hkv_client *c, const void *key, size_t klen, const struct repl_op *op)
{
	struct hkv_op_stats *o = &c->stats.op[op->op];
	struct hkv_conn_stats s0 = {0}, s1 = {0};
	int ret;

	hkv_repl_conn_totals(c, &s0);
	ret = write_once(c, key, klen, op);
	hkv_repl_conn_totals(c, &s1);
	o->count++;
	if (s1.round_trips >= s0.round_trips && s1.bytes_read >= s0.bytes_read &&
	    s1.bytes_written >= s0.bytes_written) { /* (not across a reconnect) */
		o->round_trips += s1.round_trips - s0.round_trips;
		o->bytes_read += s1.bytes_read - s0.bytes_read;
		o->bytes_written += s1.bytes_written - s0.bytes_written;
	}
	return ret;
}

static int write_once(struct hkv_client *c, const void *key, size_t klen, const struct repl_op *op)
{
	struct hkv_repl *rp = c->repl;
	struct hkv_client *hk = rp->h[rp->r - 1];
	struct rstate cur, dec;
	struct retry rt;
	struct value nv;
	uint64_t posts;
	int ret, tomb;

	hkv_retry_begin(&rt);
	for (int attempt = 0;; attempt++) {
		ret = read_state(rp, rp->h[0], key, klen, rp->cur, &cur, attempt > 0);
		if (!ret)
			ret = next_value(c, op, &cur, &nv, &tomb);
		if (ret)
			return ret;
		if (route_over(rp))
			return HKV_EDISCONNECTED; /* (nothing decided: the router routes again) */
		nv.wid = hkv_next_wid(c); /* (a touch too: every write its own id) */
		nv.pred = cur.wid | HKV_PRED_REPL | (tomb ? HKV_PRED_TOMB : 0);
		posts = conn_posts(hk);
		ret = apply(rp, rp->r - 1, key, klen, cur.wid, &nv, NULL);
		if (!ret)
			break;
		if (ret != HKV_EVERSION)
			/* a CAS may have gone out and been applied: then the write
			 * is decided, and the next writer finishes it */
			return is_transport_err(ret) && conn_posts(hk) != posts ? HKV_EUNKNOWN : ret;
		/* Lost on the decider: to a write decided from what the primary
		 * holds (not there yet: finish it once it stood HKV_HELP_MS), or
		 * the primary moved on since we read it (look again). */
		ret = read_state(rp, hk, key, klen, rp->dec, &dec, 1);
		if (ret)
			return ret;
		/* The primary's tombstone is off the decider (read after it), which
		 * holds nothing or a write from absent: its reclamation was decided
		 * (only a reclamation takes an entry away). Finish it; then the key
		 * is absent here too. */
		if (cur.present && (cur.pred & HKV_PRED_TOMB) && !route_over(rp) &&
		    (!dec.present || ((dec.pred & HKV_WID_MASK) == 0 && dec.wid != cur.wid))) {
			if ((ret = finish_reclaim(c, key, klen, cur.wid, rp->r - 2)))
				return ret;
		} else if (dec.present && dec.wid != cur.wid && (dec.pred & HKV_WID_MASK) == cur.wid) {
			uint64_t now = hkv_now_ns();

			if (rp->pend_wid != dec.wid) {
				rp->pend_wid = dec.wid;
				rp->pend_ns = now;
			} else if (now - rp->pend_ns >= HKV_HELP_MS * 1000000ull && !route_over(rp)) {
				if ((ret = help(c, key, klen, &dec)))
					return ret;
				rp->pend_wid = 0;
			}
		}
		c->stats.op[op->op].retries++;
		hkv_test_at(c, HKV_TP_RETRY);
		if (hkv_retry_wait(rp->h[0], &rt))
			return HKV_EAGAIN;
	}
	hkv_test_at(c, HKV_TP_REPL_DECIDED);
	for (int i = rp->r - 2; i >= 0; i--) {
		ret = step(c, i, key, klen, cur.wid, &nv, i ? NULL : (cur.present ? &cur.it : NULL));
		if (ret == HKV_EVERSION && rp->chk_refused)
			/* the decider moved on from our write: on a fixed list only
			 * after the primary took it (it was overwritten since, deleted
			 * and reclaimed); on a cluster's, perhaps superseded */
			ret = rp->owned ? 0 : HKV_EUNKNOWN;
		else if (ret == HKV_EVERSION)
			ret = settled(c, key, klen, i, cur.wid, nv.wid);
		else if (ret) /* decided: the next write of the key finishes it */
			ret = HKV_EUNKNOWN;
		if (ret) {
			if (ret == HKV_EUNKNOWN)
				c->stats.repl_unknown++;
			return ret;
		}
		if (i)
			hkv_test_at(c, HKV_TP_REPL_STEP);
	}
	c->last_version = nv.wid;
	if (tomb)
		reclaim(c, key, klen, nv.wid);
	return 0;
}

struct hkv_client *hkv_repl_primary(const struct hkv_client *c)
{
	return c->repl->h[0];
}

int hkv_repl_count(const struct hkv_client *c)
{
	return c->repl->r;
}

/* A config for one of cfg's servers, with cfg's settings (made once, kept
 * by cfg: its location cache is that server's for every handle of cfg). */
static struct hkv_config *sub_config(const struct hkv_config *cfg_in, int i, int *ret)
{
	struct hkv_config *cfg = (struct hkv_config *)cfg_in, *s;

	pthread_mutex_lock(&cfg->lock);
	s = cfg->repl_sub[i];
	if (!s && (s = hkv_config_new())) {
		*ret = hkv_config_add_server(s, cfg->servers[i]);
		if (!*ret && cfg->token)
			*ret = hkv_config_set_token(s, cfg->token);
		if (!*ret && cfg->token_file)
			*ret = hkv_config_set_token_file(s, cfg->token_file);
		s->timeout_ms = cfg->timeout_ms;
		s->max_value = cfg->max_value;
		s->cache_entries = cfg->cache_entries;
		if (*ret) {
			hkv_config_free(s);
			s = NULL;
		} else {
			cfg->repl_sub[i] = s;
		}
	} else if (!s) {
		*ret = -ENOMEM;
	}
	pthread_mutex_unlock(&cfg->lock);
	return s;
}

/* A replicated handle: its buffers hold any block of max_value. */
static struct hkv_client *repl_new(int r, int timeout_ms, size_t max_value)
{
	struct hkv_client *c = hkv_calloc(1, sizeof(*c));
	struct hkv_repl *rp = hkv_calloc(1, sizeof(*rp));

	if (!c || !rp) {
		hkv_free(c);
		hkv_free(rp);
		return NULL;
	}
	c->repl = rp;
	c->timeout_ms = timeout_ms;
	c->max_value = max_value;
	c->rng = hkv_now_ns() ^ (uint64_t)(uintptr_t)c;
	randombytes_buf(&c->wid_next, sizeof(c->wid_next));
	rp->r = r;
	rp->cap = HKV_BLOCK_HDR + HKV_MAX_KEY + max_value;
	rp->cur = hkv_malloc(rp->cap);
	rp->dec = hkv_malloc(rp->cap);
	rp->chk = hkv_malloc(rp->cap);
	if (!rp->cur || !rp->dec || !rp->chk) {
		hkv_repl_close(c);
		return NULL;
	}
	return c;
}

int hkv_repl_wrap(struct hkv_client *const *hs, int n, int timeout_ms, size_t max_value,
		  struct hkv_client **out)
{
	struct hkv_client *c = repl_new(n, timeout_ms, max_value);

	if (!c)
		return -ENOMEM;
	hkv_repl_members(c, hs);
	*out = c;
	return 0;
}

void hkv_repl_members(struct hkv_client *c, struct hkv_client *const *hs)
{
	for (int i = 0; i < c->repl->r; i++)
		c->repl->h[i] = hs[i];
}

int hkv_repl_open(const struct hkv_config *cfg, struct hkv_client **out)
{
	struct hkv_client *c;
	struct hkv_repl *rp;
	int ret = 0;

	*out = NULL;
	if (cfg->replicas != cfg->nservers || cfg->replicas > HKV_MAX_REPLICAS)
		return -EINVAL;
	for (int i = 0; i < cfg->nservers; i++)
		if (!strncmp(cfg->servers[i], "etcd://", 7))
			return -ENOTSUP; /* (a cluster's replicas come from its map: not yet) */
	c = repl_new(cfg->replicas, cfg->timeout_ms, cfg->max_value);
	if (!c)
		return -ENOMEM;
	rp = c->repl;
	rp->owned = 1;
	for (int i = 0; i < rp->r && !ret; i++) {
		struct hkv_config *s = sub_config(cfg, i, &ret);

		if (s)
			ret = hkv_open(s, &rp->h[i]);
		if (ret)
			break;
		rp->h[i]->repl_member = 1;
		if (hkv_cache_mode(rp->h[i])) {
			hkv_warn("replicas: %s is a cache; replicas need store-mode servers",
				 cfg->servers[i]);
			ret = -ENOTSUP; /* a cache evicts on its own: replicas would differ */
		}
	}
	if (ret) {
		hkv_repl_close(c);
		return ret;
	}
	*out = c;
	return 0;
}

void hkv_repl_close(struct hkv_client *c)
{
	struct hkv_repl *rp = c->repl;

	for (int i = 0; rp->owned && i < rp->r; i++)
		hkv_close(rp->h[i]);
	hkv_free(rp->cur);
	hkv_free(rp->dec);
	hkv_free(rp->chk);
	hkv_free(rp);
	c->repl = NULL;
	hkv_free(c);
}

/* Writes are counted by the replicated handle, reads by the primary's;
 * the location cache and reconnects, summed over the replicas' handles. */
void hkv_repl_stats(const struct hkv_client *c, struct hkv_client_stats *out)
{
	const struct hkv_repl *rp = c->repl;

	*out = c->stats;
	for (int i = 0; i < rp->r; i++) {
		const struct hkv_client_stats *s = &rp->h[i]->stats;

		if (i == 0) { /* reads: the primary's own */
			out->op[HKV_OP_GET] = s->op[HKV_OP_GET];
			out->op[HKV_OP_MGET] = s->op[HKV_OP_MGET];
		}
		out->cache_hits += s->cache_hits;
		out->cache_misses += s->cache_misses;
		out->reconnects += s->reconnects;
	}
}

uint64_t hkv_repl_clock_off(const struct hkv_client *c)
{
	const struct hkv_repl *rp = c->repl;

	for (int i = 0; i < rp->r; i++)
		if (rp->h[i] && rp->h[i]->clock_at_ns)
			return rp->h[i]->clock_off_ns;
	return hkv_wall_off_ns(); /* none connected yet: our own wall clock */
}

uint32_t hkv_repl_time(struct hkv_client *c)
{
	const struct hkv_repl *rp = c->repl;

	for (int i = 0; i < rp->r; i++)
		if (rp->h[i] && rp->h[i]->conn && !rp->h[i]->conn->error)
			return hkv_time(rp->h[i]);
	return (uint32_t)time(NULL); /* no replica reachable: ours, for display only */
}

void hkv_repl_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum)
{
	const struct hkv_repl *rp = c->repl;

	for (int i = 0; i < rp->r; i++)
		if (rp->h[i] && rp->h[i]->conn)
			hkv_conn_stats_add(sum, &rp->h[i]->conn->stats);
}
