/* sim.c - see sim.h. */
#include "bench/sim.h"
#include "bench/ycsb.h"
#include "common/cache_policy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define S3_FREQ_MAX 3
#define S3_SMALL_PERCENT 10
#define HKV_SAMPLES 64 /* client/evict.c's EVICT_SAMPLES and EVICT_BATCH */
#define HKV_BATCH   8

enum where { W_NONE, W_CACHED, W_SMALL, W_MAIN, W_GHOST };

struct ent {
	uint32_t prev, next; /* in the list of `where` (LFU: of its bucket) */
	uint32_t size;       /* bytes charged while cached */
	uint32_t bucket;     /* LFU: index of its bucket */
	uint8_t where;
	uint8_t freq;        /* S3-FIFO: 0..3 */
	uint32_t ridx;       /* hkv: place in res[] */
	uint32_t atime, hfreq; /* hkv: the block's atime|freq word */
};

struct list {
	uint32_t head, tail; /* head = newest */
	uint64_t count, bytes;
};

/* LFU: all cached items with one count, and its neighbours by count. */
struct bucket {
	uint64_t count;
	uint32_t prev, next;
	struct list items;
};

struct hkv_sim {
	struct hkv_sim_config cfg;
	struct ent *e;
	uint64_t bytes, items, evictions, gets, hits;
	struct list lru;             /* LRU */
	struct list small, main, ghost; /* S3-FIFO */
	uint64_t small_cap;
	struct bucket *b;            /* LFU: pool of buckets */
	uint32_t nb, b_free, b_head; /* pool size, free list, lowest count */
	uint32_t *res, nres;         /* hkv: the cached keys, to sample */
	uint32_t clock;              /* hkv: requests so far, as the region's ms */
	struct ycsb_rng rng;         /* hkv: its samples */
	struct hkv_cpol pol;
};

static const char *const policy_names[] = {"lru", "lfu", "s3fifo", "hkv"};

int hkv_sim_policy_parse(const char *name)
{
	for (int i = 0; i < HKV_SIM_NPOLICIES; i++)
		if (!strcmp(name, policy_names[i]))
			return i;
	return -1;
}

const char *hkv_sim_policy_name(enum hkv_sim_policy p)
{
	return (unsigned)p < HKV_SIM_NPOLICIES ? policy_names[p] : "?";
}

/* ---- intrusive lists through s->e ---- */

static void list_init(struct list *l)
{
	*l = (struct list){.head = NIL, .tail = NIL};
}

static void list_push(struct hkv_sim *s, struct list *l, uint32_t k)
{
	struct ent *e = &s->e[k];

	e->prev = NIL;
	e->next = l->head;
	if (l->head != NIL)
		s->e[l->head].prev = k;
	l->head = k;
	if (l->tail == NIL)
		l->tail = k;
	l->count++;
	l->bytes += e->size;
}

static void list_unlink(struct hkv_sim *s, struct list *l, uint32_t k)
{
	struct ent *e = &s->e[k];

	if (e->prev != NIL)
		s->e[e->prev].next = e->next;
	else
		l->head = e->next;
	if (e->next != NIL)
		s->e[e->next].prev = e->prev;
	else
		l->tail = e->prev;
	l->count--;
	l->bytes -= e->size;
}

/* ---- LFU buckets ---- */

static uint32_t bucket_new(struct hkv_sim *s, uint64_t count)
{
	uint32_t i;

	if (s->b_free != NIL) {
		i = s->b_free;
		s->b_free = s->b[i].next;
	} else {
		/* at most one bucket per cached item, plus the one being made */
		uint32_t cap = s->nb ? 2 * s->nb : 16;
		struct bucket *p = realloc(s->b, (size_t)cap * sizeof(*p));

		if (!p)
			abort(); /* a simulator out of memory has no answer to give */
		s->b = p;
		for (uint32_t j = cap - 1; j > s->nb; j--) {
			s->b[j].next = s->b_free;
			s->b_free = j;
		}
		i = s->nb;
		s->nb = cap;
	}
	s->b[i].count = count;
	s->b[i].prev = s->b[i].next = NIL;
	list_init(&s->b[i].items);
	return i;
}

/* Link bucket i after `after` (NIL: at the head). */
static void bucket_link(struct hkv_sim *s, uint32_t i, uint32_t after)
{
	uint32_t next = after == NIL ? s->b_head : s->b[after].next;

	s->b[i].prev = after;
	s->b[i].next = next;
	if (next != NIL)
		s->b[next].prev = i;
	if (after == NIL)
		s->b_head = i;
	else
		s->b[after].next = i;
}

static void bucket_drop_if_empty(struct hkv_sim *s, uint32_t i)
{
	struct bucket *b = &s->b[i];

	if (b->items.count)
		return;
	if (b->prev != NIL)
		s->b[b->prev].next = b->next;
	else
		s->b_head = b->next;
	if (b->next != NIL)
		s->b[b->next].prev = b->prev;
	b->next = s->b_free;
	s->b_free = i;
}

/* Into the bucket of `count`, which follows `after` if it exists. */
static void lfu_place(struct hkv_sim *s, uint32_t k, uint64_t count, uint32_t after)
{
	uint32_t next = after == NIL ? s->b_head : s->b[after].next, i;

	if (next != NIL && s->b[next].count == count) {
		i = next;
	} else {
		i = bucket_new(s, count);
		bucket_link(s, i, after);
	}
	s->e[k].bucket = i;
	list_push(s, &s->b[i].items, k);
}

static void lfu_touch(struct hkv_sim *s, uint32_t k)
{
	uint32_t from = s->e[k].bucket;

	list_unlink(s, &s->b[from].items, k);
	lfu_place(s, k, s->b[from].count + 1, from);
	bucket_drop_if_empty(s, from);
}

static void lfu_remove(struct hkv_sim *s, uint32_t k)
{
	uint32_t from = s->e[k].bucket;

	list_unlink(s, &s->b[from].items, k);
	bucket_drop_if_empty(s, from);
}

/* ---- S3-FIFO ---- */

static void ghost_trim(struct hkv_sim *s)
{
	while (s->ghost.count > s->main.count) {
		uint32_t k = s->ghost.tail;

		list_unlink(s, &s->ghost, k);
		s->e[k].where = W_NONE;
	}
}

static void gone(struct hkv_sim *s, uint32_t k)
{
	s->bytes -= s->e[k].size;
	s->items--;
	s->evictions++;
}

/* S's tail out: to M if it was hit while in S, else to the ghost; until
 * one item has left the cache or S is empty. */
static void s3_evict_small(struct hkv_sim *s)
{
	unsigned promote = s->cfg.s3_promote ? s->cfg.s3_promote : 1;

	while (s->small.count) {
		uint32_t k = s->small.tail;
		struct ent *e = &s->e[k];

		list_unlink(s, &s->small, k);
		if (e->freq >= promote) {
			e->freq = 0;
			e->where = W_MAIN;
			list_push(s, &s->main, k);
			continue;
		}
		gone(s, k);
		e->where = W_GHOST;
		e->size = 0; /* a ghost holds no bytes */
		list_push(s, &s->ghost, k);
		ghost_trim(s);
		return;
	}
}

/* M's tail out, reinserting those with a count (one less each time). */
static void s3_evict_main(struct hkv_sim *s)
{
	while (s->main.count) {
		uint32_t k = s->main.tail;
		struct ent *e = &s->e[k];

		list_unlink(s, &s->main, k);
		if (e->freq) {
			e->freq--;
			list_push(s, &s->main, k);
			continue;
		}
		gone(s, k);
		e->where = W_NONE;
		ghost_trim(s);
		return;
	}
}

/* ---- hkv: cache mode's own policy (common/cache_policy.h), sampled ---- */

/* A key's hash as the policy sees it (a client's is the key's SipHash). */
static uint64_t key_hash(uint32_t k)
{
	return hkv_hash64(&k, sizeof(k));
}

static void res_add(struct hkv_sim *s, uint32_t k)
{
	s->e[k].ridx = s->nres;
	s->res[s->nres++] = k;
}

static void res_del(struct hkv_sim *s, uint32_t k)
{
	uint32_t i = s->e[k].ridx, last = s->res[--s->nres];

	s->res[i] = last;
	s->e[last].ridx = i;
}

/* As client/evict.c: sample HKV_SAMPLES cached items, evict the expert's
 * HKV_BATCH lowest (fewer if the sample repeats one). */
static void hkv_evict_round(struct hkv_sim *s)
{
	int64_t sc[HKV_NEXPERTS][HKV_SAMPLES];
	const int64_t *scp[HKV_NEXPERTS];
	uint32_t cand[HKV_SAMPLES];
	int n = 0, out[HKV_NEXPERTS * HKV_BATCH], pick, got, nv;
	unsigned masks[HKV_NEXPERTS * HKV_BATCH];

	for (int i = 0; i < HKV_SAMPLES; i++) {
		uint32_t k = s->res[ycsb_rand(&s->rng) % s->nres];
		int dup = 0;

		for (int j = 0; j < n && !dup; j++)
			dup = cand[j] == k;
		if (dup)
			continue;
		cand[n] = k;
		for (int e = 0; e < HKV_NEXPERTS; e++)
			sc[e][n] = hkv_expert_score(e, s->e[k].atime, s->e[k].hfreq, 0, s->clock, 0);
		n++;
	}
	for (int e = 0; e < HKV_NEXPERTS; e++)
		scp[e] = sc[e];
	pick = hkv_cpol_pick(&s->pol);
	got = hkv_cpol_choose(scp, n, HKV_BATCH, pick, out, masks, &nv);
	for (int i = 0; i < got; i++) {
		uint32_t k = cand[out[i]];

		hkv_cpol_nominated(&s->pol, key_hash(k), masks[i], i < nv ? s->e[k].size : 0);
		if (i >= nv)
			continue;
		res_del(s, k);
		s->e[k].where = W_NONE;
		gone(s, k);
	}
}

/* ---- the policies behind one face ---- */

static void evict_one(struct hkv_sim *s)
{
	uint32_t k;

	switch (s->cfg.policy) {
	case HKV_SIM_LRU:
		k = s->lru.tail;
		list_unlink(s, &s->lru, k);
		break;
	case HKV_SIM_LFU:
		k = s->b[s->b_head].items.tail;
		lfu_remove(s, k);
		break;
	case HKV_SIM_HKV:
		hkv_evict_round(s);
		return;
	default:
		if (s->small.count && (s->small.bytes >= s->small_cap || !s->main.count))
			s3_evict_small(s);
		else
			s3_evict_main(s);
		return;
	}
	s->e[k].where = W_NONE;
	gone(s, k);
}

static void make_room(struct hkv_sim *s, uint64_t need)
{
	while (s->items && s->bytes + need > s->cfg.cap_bytes)
		evict_one(s);
}

static int cached(const struct ent *e)
{
	return e->where != W_NONE && e->where != W_GHOST;
}

static void touch(struct hkv_sim *s, uint32_t k)
{
	struct ent *e = &s->e[k];

	switch (s->cfg.policy) {
	case HKV_SIM_LRU:
		list_unlink(s, &s->lru, k);
		list_push(s, &s->lru, k);
		break;
	case HKV_SIM_LFU:
		lfu_touch(s, k);
		break;
	case HKV_SIM_HKV:
		e->atime = s->clock;
		e->hfreq = hkv_freq_touched(e->hfreq);
		break;
	default:
		if (e->freq < S3_FREQ_MAX)
			e->freq++;
	}
}

static struct list *s3_list(struct hkv_sim *s, uint32_t k)
{
	switch (s->e[k].where) {
	case W_SMALL: return &s->small;
	case W_MAIN: return &s->main;
	default: return &s->ghost;
	}
}

static void remove_key(struct hkv_sim *s, uint32_t k)
{
	struct ent *e = &s->e[k];

	if (e->where == W_NONE)
		return;
	if (s->cfg.policy == HKV_SIM_LRU)
		list_unlink(s, &s->lru, k);
	else if (s->cfg.policy == HKV_SIM_LFU)
		lfu_remove(s, k);
	else if (s->cfg.policy == HKV_SIM_HKV)
		res_del(s, k);
	else
		list_unlink(s, s3_list(s, k), k);
	if (e->where != W_GHOST) {
		s->bytes -= e->size;
		s->items--;
	}
	e->where = W_NONE;
}

static void insert(struct hkv_sim *s, uint32_t k, uint64_t size)
{
	struct ent *e = &s->e[k];
	int was_ghost = e->where == W_GHOST;

	if (size > s->cfg.cap_bytes)
		return;
	make_room(s, size);
	if (e->where == W_GHOST) /* still there: making room did not trim it */
		list_unlink(s, &s->ghost, k);
	e->size = (uint32_t)size;
	e->freq = 0;
	switch (s->cfg.policy) {
	case HKV_SIM_LRU:
		e->where = W_CACHED;
		list_push(s, &s->lru, k);
		break;
	case HKV_SIM_LFU:
		e->where = W_CACHED;
		lfu_place(s, k, 1, NIL);
		break;
	case HKV_SIM_HKV:
		e->where = W_CACHED;
		e->atime = s->clock;
		e->hfreq = 0;
		res_add(s, k);
		break;
	default:
		e->where = was_ghost ? W_MAIN : W_SMALL;
		list_push(s, was_ghost ? &s->main : &s->small, k);
	}
	s->bytes += size;
	s->items++;
}

/* A write to a cached item: an access, then its new size. */
static void update(struct hkv_sim *s, uint32_t k, uint64_t size)
{
	struct ent *e = &s->e[k];
	struct list *l;

	touch(s, k);
	if (size == e->size)
		return;
	if (size > s->cfg.cap_bytes) {
		remove_key(s, k);
		return;
	}
	if (s->cfg.policy == HKV_SIM_LRU)
		l = &s->lru;
	else if (s->cfg.policy == HKV_SIM_LFU)
		l = &s->b[e->bucket].items;
	else if (s->cfg.policy == HKV_SIM_HKV)
		l = NULL;
	else
		l = s3_list(s, k);
	if (l)
		l->bytes = l->bytes - e->size + size;
	s->bytes = s->bytes - e->size + size;
	e->size = (uint32_t)size;
	make_room(s, 0); /* may take this item too: the policy's choice */
}

int hkv_sim_get(struct hkv_sim *s, uint32_t key)
{
	s->gets++;
	s->clock++;
	if (s->cfg.policy == HKV_SIM_HKV)
		hkv_cpol_accessed(&s->pol, key_hash(key));
	if (!cached(&s->e[key]))
		return 0;
	touch(s, key);
	s->hits++;
	return 1;
}

/* A set of an item costing `size` bytes, overhead included. */
static void set_sized(struct hkv_sim *s, uint32_t key, uint64_t size)
{
	if (cached(&s->e[key]))
		update(s, key, size);
	else
		insert(s, key, size);
}

void hkv_sim_set(struct hkv_sim *s, uint32_t key, uint64_t bytes)
{
	set_sized(s, key, bytes + HKV_SIM_ITEM_OVERHEAD);
}

void hkv_sim_delete(struct hkv_sim *s, uint32_t key)
{
	remove_key(s, key);
}

int hkv_sim_cached(const struct hkv_sim *s, uint32_t key)
{
	return cached(&s->e[key]);
}

int hkv_sim_request(struct hkv_sim *s, const struct hkv_trace_req *r)
{
	uint64_t size = s->cfg.item_bytes ? s->cfg.item_bytes[r->key]
					  : (uint64_t)r->key_size + r->value_size +
						    HKV_SIM_ITEM_OVERHEAD;

	switch (r->op) {
	case HKV_TRACE_GET:
		if (hkv_sim_get(s, r->key))
			return 1;
		set_sized(s, r->key, size); /* look-aside: fill the miss */
		return 0;
	case HKV_TRACE_SET:
		set_sized(s, r->key, size);
		return 0;
	case HKV_TRACE_ADD:
		if (!cached(&s->e[r->key]))
			set_sized(s, r->key, size);
		return 0;
	case HKV_TRACE_UPDATE:
		if (cached(&s->e[r->key]))
			set_sized(s, r->key, size);
		return 0;
	default:
		hkv_sim_delete(s, r->key);
		return 0;
	}
}

struct hkv_sim *hkv_sim_create(const struct hkv_sim_config *cfg)
{
	struct hkv_sim *s;

	if (cfg->policy >= HKV_SIM_NPOLICIES || !cfg->nkeys || !cfg->cap_bytes)
		return errno = EINVAL, NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return errno = ENOMEM, NULL;
	s->cfg = *cfg;
	s->e = calloc(cfg->nkeys, sizeof(*s->e)); /* where = W_NONE */
	if (!s->e) {
		free(s);
		return errno = ENOMEM, NULL;
	}
	list_init(&s->lru);
	list_init(&s->small);
	list_init(&s->main);
	list_init(&s->ghost);
	s->small_cap = cfg->cap_bytes * S3_SMALL_PERCENT / 100;
	s->b_free = s->b_head = NIL;
	ycsb_rng_seed(&s->rng, 42);
	hkv_cpol_init(&s->pol, cfg->cap_bytes);
	if (cfg->policy == HKV_SIM_HKV &&
	    !(s->res = malloc((size_t)cfg->nkeys * sizeof(*s->res)))) {
		hkv_sim_destroy(s);
		return errno = ENOMEM, NULL;
	}
	return s;
}

void hkv_sim_destroy(struct hkv_sim *s)
{
	if (!s)
		return;
	hkv_cpol_fini(&s->pol);
	free(s->res);
	free(s->b);
	free(s->e);
	free(s);
}

void hkv_sim_stats(const struct hkv_sim *s, struct hkv_sim_stats *st)
{
	*st = (struct hkv_sim_stats){.gets = s->gets, .hits = s->hits, .items = s->items,
				     .bytes = s->bytes, .evictions = s->evictions};
}
