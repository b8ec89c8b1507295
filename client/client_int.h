/*
 * client_int.h - inside a hatchkv client handle. Not installed.
 *
 * A handle = one transport connection + one registered scratch arena +
 * the location cache (cache.c) + the block allocator (alloc.c). Operations
 * (api.c and its rooms, client/ops_int.h) build chains of work requests over
 * these; every chain posted and waited for is one round trip.
 *
 * Scratch arena (registered once, carved at open):
 *   bkt   4 x 128 B   bucket reads: [b1, b2] and the re-read after an insert
 *   atom  64 x 8 B    atomic results
 *   rblk  read_cap    block reads (cold candidates, warm reads, mget)
 *   wblk  max_block   the block being written
 *   scr   scr_cap     segment table / bitmap / adoption reads
 */
#ifndef HKV_CLIENT_INT_H
#define HKV_CLIENT_INT_H

#include <pthread.h>
#include <stdint.h>

#include "common/ctl_proto.h"
#include "common/etcd.h"
#include "common/layout.h"
#include "common/transport.h"
#include "hatchkv.h"

/*
 * ABA horizon (docs/design.md, "Views"): a block address comes back with the
 * same 11-bit ver only after 2048 reuses, each after >= HKV_QUARANTINE_NS of
 * rest, so two incarnations with one ver are >= 2047 x 200 us = 409 ms
 * apart. A view - a slot value and the generation of the block it names -
 * is acted on only while it is younger than HKV_VIEW_MAX_NS, counted from the
 * posting of the round trip that saw it to right before the posting of the
 * one that acts on it (a view made of two round trips, bucket READ then
 * block READ, is kept only if the second completed within the bound too).
 */
/* (HKV_QUARANTINE_NS, 200 us, is in common/layout.h: the server rests too) */
#define HKV_VIEW_MAX_NS      (250ull * 1000000ull)     /* a write acts on a view this young */
#define HKV_MAX_RETRIES      100000 /* besides the timeout, a hard bound */
/* (HKV_PENDING_LEASE_MS too: the server aborts such inserts in a move) */
#define HKV_MAX_SERVERS     8
#define HKV_REVIVE_INTERVAL_MS 200 /* a lost connection is retried at most this often */

struct hkv_config {
	pthread_mutex_t lock;     /* guards the lazily created caches */
	struct hkv_cache *cache;  /* shared by every handle opened from this config */
	struct hkv_caches *cluster_caches; /* cluster: one per server, shared alike */
	char *servers[HKV_MAX_SERVERS];
	int nservers;
	char *token, *token_file;
	int timeout_ms;
	size_t max_value;
	size_t cache_entries;
	int replicas; /* hkv_config_set_replicas (0, 1: none) */
	int retry_ms; /* cluster: a dead server's keys fail fast this long (hkv_config_set_retry_ms) */
	struct hkv_etcd_sec etcd; /* hkv_config_set_etcd */
	struct hkv_config *repl_sub[HKV_MAX_SERVERS]; /* each server's own (replica.c) */
};

/* ---- location cache (cache.c), shared by the handles of one config ---- */

/* Keys up to this long are kept in their entry, so a write can confirm that
 * the entry is its key's (longer keys: reads only; writes READ the block). */
#define HKV_CACHE_KEY_INLINE 72
#define HKV_CACHE_WORDS      15 /* 5 words + klen + 72 key bytes: 128 B with seq */

struct hkv_loc {
	uint64_t hash;      /* full key hash; 0 = empty entry */
	uint64_t slot_addr; /* region offset of the index slot */
	uint64_t slot;      /* slot value when last seen */
	uint32_t gen;       /* generation of the block it points to */
	uint32_t blen;      /* header + key + value bytes of that block */
	uint64_t stamp_ns;  /* when the round trip that saw it was posted (<= when it ran) */
	/* out of hkv_cache_find: the entry holds exactly the key asked for */
	int key_ok;
};

struct hkv_cache_entry {
	uint64_t seq; /* seqlock: odd while being written */
	uint64_t w[HKV_CACHE_WORDS];
};

struct hkv_cache {
	uint64_t refs; /* the config and each handle hold one */
	struct hkv_cache_entry *e;
	uint64_t mask; /* entries - 1; e == NULL when disabled */
};

struct hkv_cache *hkv_cache_new(size_t entries);
struct hkv_cache *hkv_cache_ref(struct hkv_cache *lc);
/* Drop a reference; the last one frees. NULL is fine. */
void hkv_cache_unref(struct hkv_cache *lc);
/*
 * Copy the entry for (hash, key) into *out if present and at most max_age
 * old; 1 if so. An entry of another key with the same hash is not returned
 * when its key is inline; out->key_ok says whether the key was compared.
 */
int hkv_cache_find(struct hkv_cache *lc, uint64_t hash, const void *key, uint16_t klen,
		   uint64_t now, uint64_t max_age, struct hkv_loc *out);
/* Remember loc for key (whose hash is loc->hash). */
void hkv_cache_put(struct hkv_cache *lc, const struct hkv_loc *loc, const void *key,
		   uint16_t klen);
/* Move the stamp of the entry *loc describes to stamp_ns, only if the entry
 * is still exactly that one and older (a newer observation is never aged). */
void hkv_cache_refresh(struct hkv_cache *lc, const struct hkv_loc *loc, uint64_t stamp_ns);
void hkv_cache_drop(struct hkv_cache *lc, uint64_t hash);

/* ---- allocator (alloc.c) ------------------------------------------------------ */


#define HKV_FREED_SLOTS 1024 /* struct hkv_client's freed[]: a power of two */

/* A free block this handle claimed (its bit cleared by our CAS, stamped HELD). */
struct hkv_held {
	uint64_t off;
	uint32_t gen;      /* generation in its meta when claimed: we write gen + 1 */
	uint64_t stamp;    /* our HELD stamp in its bytes 16..23 (0: a kept block, none) */
	uint64_t claim_ns; /* clock read before the claim (or re-stamp) was posted */
	uint64_t ready_ns; /* not written before: the rest after its free */
};

/* A bitmap word of a segment of the class, as last seen, with free bits. */
struct hkv_hint {
	uint32_t seg, word;
	uint64_t bits;
};

struct hkv_class_alloc {
	struct hkv_held *held; /* FIFO: [head, n) */
	uint32_t head, n, cap;
	struct hkv_hint *hints;
	uint32_t nhints, caphints;
	uint32_t scarce;        /* the last survey found under 1/8 of the class free */
	/* cache mode: when this class last found nothing free and evicted to
	 * make room (0: never); for HKV_PRESSURE_NS after, its writes refill
	 * ahead (hkv_class_pressed, client/write.c) */
	uint64_t pressure_ns;
	/* ... and how far ahead it refills (blocks; 0: the hold cap's floor):
	 * doubled when a write still waited out a rest, halved after a second
	 * without one (alloc.c, update_reserve) */
	uint32_t reserve;
	uint64_t reserve_ns;
	uint64_t empty_survey_ns; /* the last survey found nothing to claim */
	uint64_t survey_ns;       /* the last survey */
	uint64_t last_claim_ns;
	uint64_t no_carve_until_ns; /* the server had no memory for us lately */
	uint64_t no_move_until_ns;  /* ... nor a segment to empty for us */
	uint32_t batch;           /* blocks the last claim asked for */
};

/* The block allocated for the write in progress. */
struct hkv_cur_alloc {
	uint64_t off;      /* 0: none */
	uint64_t claim_ns;
	uint32_t cls, gen; /* gen: as claimed (the block is written with gen + 1) */
	int written;       /* a chain that writes it was posted */
	uint64_t stamp;    /* as held (0: a kept block) */
};

/* ---- the handle ---------------------------------------------------------- */

struct hkv_origin;

struct hkv_client {
	struct hkv_conn *conn;
	struct hkv_origin *origin; /* how to connect again (connect.c); owned */
	const struct hkv_origin *via; /* the origin this connection came from (grants) */
	uint64_t revive_ns;        /* last reconnect attempt */
	struct hkv_geometry g; /* validated copy of the region header */
	uint64_t base;         /* remote address of region offset 0 */
	uint32_t rkey;  /* READs (and, without windows, everything) */
	uint32_t akey;  /* atomics: with windows a second window, past the header */
	uint32_t client_id;
	uint8_t req_key[32]; /* our session's request key: MACs our GRANTs, CARVEs */
	uint64_t req_seq;    /* the last request's sequence number */
	int readonly; /* granted RDMA Read rights only: writes fail with -EPERM */
	int windows;  /* memory windows: rkey READs, akey atomics, wkey WRITEs */
	uint32_t wkey; /* windows: the WRITE window over the data area */
	int timeout_ms;
	size_t max_value;   /* a value any key may have (one of 250 bytes too) */
	size_t value_cap;   /* a value a short key may have: the configured cap, and
			     * header + key + value within max_block */
	uint32_t max_block; /* largest block this handle writes or reads */

	uint8_t *arena;
	size_t arena_len;
	struct hkv_mr *mr;
	uint8_t *bkt;
	uint64_t *atom;
	uint8_t *rblk, *wblk, *scr;
	size_t read_cap, scr_cap;

	struct hkv_cache *cache; /* the config's, shared (one reference) */
	struct hkv_class_alloc *classes;
	uint64_t *table;    /* the segment table as last read */
	uint64_t table_ns;  /* when (0: never) */
	uint32_t table_free; /* FREE segments in it (UINT32_MAX: not read yet) */
	uint32_t hold_seq;  /* claims posted: each stamps HELD(id, seq) */
	uint32_t free_seq;  /* frees posted: each stamps freed(id, seq) */
	/* blocks this handle freed lately after winning their mark (a table by
	 * address, a later free taking an earlier one's place): the address,
	 * the generation retired, and a clock read after the mark completed.
	 * A claim that gets one back at that generation (nobody wrote it
	 * since) counts its rest from then (alloc.c, rest_from) */
	struct hkv_freed {
		uint64_t off, ns;
		uint32_t gen;
	} freed[HKV_FREED_SLOTS];
	uint64_t tidy_ns;   /* last pass over every class's held blocks */
	uint64_t tidy_coarse_ns; /* ... by the coarse clock (hkv_alloc_tidy) */
	struct hkv_cur_alloc cur;
	uint64_t rng;
	uint64_t wid_next; /* the next write id (hkv_next_wid) */
	uint64_t last_version; /* the write id the last successful write stored */
	uint64_t stuck_slot_off, stuck_slot, stuck_since_ns; /* see find_rival() */
	uint32_t stuck_gen;
	uint64_t reserve_bytes; /* what the classes' reserves add up to (alloc.c) */
	uint64_t pub_ns; /* when the last chain that published a block of ours was posted */
	/* the region's clock (ops_int.h, hkv_region_ns): region ns - our coarse
	 * monotonic ns, learned at clock_at_ns (coarse; 0: never) */
	uint64_t clock_off_ns, clock_at_ns;
	/* The write in progress: its key (evicting it to make room must not turn
	 * into "not found": op_key_evicted), and the block a read-modify-write
	 * read, which no eviction or segment move of its own may take. */
	const void *op_key;
	uint16_t op_klen;
	int op_key_evicted;
	uint64_t protect_off;

	struct hkv_client_stats stats;
	/* cache mode: the eviction policy's state (common/cache_policy.h), made
	 * at the first eviction; a pipe's lanes use their first lane's */
	struct hkv_cpol *pol;
	struct hkv_client *pol_owner; /* whose pol it is: this handle's if c */
	struct hkv_router *router; /* a cluster handle (router.c): the rest is unused */
	struct hkv_repl *repl;     /* a replicated handle (replica.c): the rest, but for the
				    * op counters and the write ids, is unused */
	int repl_member;           /* one replica's handle: never removes an expired item
				    * on a read (replicas change only by replicated writes) */
	/* set by replica.c around an insert step onto a replica that is not the
	 * decider: asked between the rival check and the commit; not 0 = the
	 * write is no longer the decider's, withdraw (publish.c) */
	int (*insert_check)(void *arg);
	void *insert_check_arg;
	/* where this handle's last store (write id last_version) went: its
	 * slot, the slot's value and its block's incarnation, seen when */
	struct {
		uint64_t slot_off, slot, blk_off, seen_ns;
		uint32_t cls, gen;
	} last_stored;
	/* set by the router for the operation it hands this handle: key's hash
	 * under the cluster's secret, which is this region's too (one SipHash) */
	const void *pre_key;
	uint64_t pre_hash;
};

/* ---- one operation's counters, a multi-get in two halves (api.c) ---- */

struct op_scope {
	struct hkv_conn_stats before;
	enum hkv_op op;
};

struct mget_run;
struct hkv_mget_pending {
	struct op_scope sc;
	struct mget_run *run; /* the rounds' state (api.c) */
	size_t cand_end;      /* the first round's cold keys */
	uint64_t seen_ns;     /* when it was posted */
	int want;             /* its completions; 0: nothing posted */
};
/* hkv_mget in two halves: start posts the first round (no wait), finish
 * waits for it and reads the rest. The router posts every server's first
 * round before it waits for any. Nothing else on the handle in between; no
 * finish after a failed start. 0 or the error (finish: as hkv_mget). */
int hkv_mget_start(struct hkv_client *c, struct hkv_mget_item *items, size_t n,
		   struct hkv_mget_pending *pd);
int hkv_mget_finish(struct hkv_client *c, struct hkv_mget_pending *pd);

/* ---- cluster routing (router.c) ---- */
/* The location caches of a cluster's servers, by endpoint, shared by every
 * cluster handle of one config (refcounted: handles outlive configs). */
struct hkv_caches;
void hkv_caches_unref(struct hkv_caches *cs);
struct hkv_router;
/* cfg->servers[0] is etcd://HOST:PORT/PREFIX. */
int hkv_router_open(const struct hkv_config *cfg, struct hkv_client **out);
void hkv_router_close(struct hkv_client *c);
/*
 * A per-key operation on a cluster handle c: HKV_ROUTE(c, key, klen, call)
 * sets c to the key's server's handle and returns what `call` (the same
 * operation, now on that handle) returns - trying again on a fresh route
 * while the server could not be reached and nothing was posted.
 */
struct hkv_route_try {
	int read_only; /* changes nothing: may be tried again whatever it posted */
	uint64_t t0_ns;
	const struct hkv_conn *conn;
	uint64_t posts;
	int probe; /* routes to a server found dead: one try, no waiting */
};
int hkv_route_begin(struct hkv_client *rc, struct hkv_route_try *t, const void *key, size_t klen,
		    struct hkv_client **out);
int hkv_route_again(struct hkv_client *rc, struct hkv_route_try *t, struct hkv_client *h, int ret);
#define HKV_ROUTE(c, key, klen, call) HKV_ROUTE_(c, key, klen, call, 0)
#define HKV_ROUTE_READ(c, key, klen, call) HKV_ROUTE_(c, key, klen, call, 1)
#define HKV_ROUTE_(c, key, klen, call, ro)                                                 \
	do {                                                                               \
		if ((c)->router) {                                                         \
			struct hkv_client *router_ = (c);                                  \
			struct hkv_route_try try_ = {.read_only = (ro)};                   \
			int route_ret_;                                                    \
			do {                                                               \
				route_ret_ = hkv_route_begin(router_, &try_, (key), (klen), &(c)); \
				if (route_ret_)                                            \
					return route_ret_;                                 \
				route_ret_ = (call);                                       \
			} while (hkv_route_again(router_, &try_, (c), route_ret_));        \
			return route_ret_;                                                 \
		}                                                                          \
	} while (0)
int hkv_router_mget(struct hkv_client *c, struct hkv_mget_item *items, size_t n);
int hkv_router_flush_all(struct hkv_client *c);
int hkv_router_count_items(struct hkv_client *c, uint64_t *items, uint64_t *bytes);
void hkv_router_server_info(const struct hkv_client *c, struct hkv_server_info *out);
void hkv_router_stats(const struct hkv_client *c, struct hkv_client_stats *out);
void hkv_router_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum);
uint32_t hkv_router_time(struct hkv_client *c);
/* sum += the transport counters of c's connection(s): a cluster's or a
 * replicated handle's summed over its members */
void hkv_client_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum);

static inline uint64_t hkv_raddr(const struct hkv_client *c, uint64_t off)
{
	return c->base + off;
}

/* Is [off, off+len) a whole block inside one segment of the data area? */
/*
 * A write id for a new logical write: 62 random bits at open, then counting,
 * never 0 (0 is "none" to callers). Two writes of one key share an id only if
 * two handles' counters meet: about 2^-62 per comparison.
 */
static inline uint64_t hkv_next_wid(struct hkv_client *c)
{
	c->wid_next = (c->wid_next + 1) & HKV_WID_MASK; /* (a pred's top bit is the tombstone's) */
	if (!c->wid_next)
		c->wid_next = 1;
	return c->wid_next;
}

static inline int hkv_block_range_ok(const struct hkv_geometry *g, uint64_t off, uint64_t len)
{
	uint64_t end = g->data_off + (uint64_t)g->nsegs * g->seg_size;

	return off >= g->data_off && off % HKV_BLOCK_ALIGN == 0 && len <= g->seg_size &&
	       off <= end && len <= end - off && (off - g->data_off) % g->seg_size + len <= g->seg_size;
}

/* Run a chain and wait: one round trip. Fails the handle's connection on error. */
int hkv_exec(struct hkv_client *c, struct hkv_wr *wrs, int n);
/* The same chain posted without waiting: wait for *want completions. */
int hkv_post(struct hkv_client *c, struct hkv_wr *wrs, int n, int *want);
/* How many WRs a chain may have now (nothing of ours in flight). */
int hkv_room(const struct hkv_client *c);
struct hkv_wr hkv_wr_read(struct hkv_client *c, void *local, uint64_t off, uint32_t len);
struct hkv_wr hkv_wr_write(struct hkv_client *c, const void *local, uint64_t off, uint32_t len);
struct hkv_wr hkv_wr_cas(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t expect,
			 uint64_t swap);
struct hkv_wr hkv_wr_faa(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t add);

/*
 * Allocate a block of class cls from the shared pool: its region offset and
 * the generation to write. HKV_EFULL when no segment of the class has a
 * free block to claim (the caller evicts, or asks the server to carve).
 */
int hkv_alloc_block(struct hkv_client *c, uint32_t cls, uint64_t *off, uint32_t *gen);
/* Ask the server for a segment of class cls (control plane; rare): a FREE
 * one, a wholly free one of another class, or with `move` (cache mode, the
 * class has no segment) one it empties. 0 (the class has new memory),
 * HKV_EFULL (also without asking, for 100 ms after a refusal), <0. */
int hkv_alloc_carve(struct hkv_client *c, uint32_t cls, int move);
/* Before posting the first chain that writes the block just allocated:
 * marks it written; 0. (It returned -1 for a hold past 500 ms, when the
 * sweep took back a connected holder's blocks by time; a held block is ours
 * at any age now: docs/design.md, "Memory that flows".) */
int hkv_alloc_write_ok(struct hkv_client *c, uint64_t off);
/* The block at off (class cls) is no longer referenced: set its bitmap bit
 * (one unsignaled FAA, posted now, no round trip). */
void hkv_free_block(struct hkv_client *c, uint64_t off, uint32_t cls);
/* The same for a block whose mark (LIVE gen -> OBSOLETE gen) we won: noted,
 * so that our own claim of it rests from now rather than from the claim. */
void hkv_free_retired(struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t gen);
/* The same for a block whose mark CAS we won at generation gen: kept for
 * our own next write of the class (no claim), or freed if we hold enough. */
void hkv_free_or_keep(struct hkv_client *c, uint64_t off, uint32_t cls, uint32_t gen);
/* A block allocated (perhaps written) but never published: held again. */
void hkv_unalloc_block(struct hkv_client *c, uint64_t off, uint32_t cls);
int hkv_alloc_init(struct hkv_client *c);
/* How many blocks of class cls a handle holds at most (claimed or kept);
 * in cache mode also how far eviction runs ahead of allocation. */
uint32_t hkv_alloc_hold_cap(const struct hkv_client *c, uint32_t cls);
int hkv_alloc_refill(struct hkv_client *c, uint32_t cls);
/* A class stays pressed this long after it last had to evict with nothing
 * free (then a write finds nothing held, nothing in the pool, and renews it) */
#define HKV_PRESSURE_NS (1000ull * 1000000ull)
static inline int hkv_class_pressed(const struct hkv_class_alloc *ca, uint64_t coarse_ns)
{
	return ca->pressure_ns && coarse_ns - ca->pressure_ns < HKV_PRESSURE_NS;
}
/* Held blocks that waited long go back (cheap unless 50 ms passed). */
void hkv_alloc_tidy(struct hkv_client *c);
/* Give every block this handle holds back to the shared pool (at close). */
void hkv_alloc_release(struct hkv_client *c);
void hkv_alloc_fini(struct hkv_client *c);
/* From the table as last read: is any segment FREE; how many are SHARED in cls. */
int hkv_alloc_any_free(const struct hkv_client *c);
uint32_t hkv_alloc_class_segs(const struct hkv_client *c, uint32_t cls);
/* The segment table as the handle last read it, refreshed if older than
 * max_age_ns (0: always). */
int hkv_alloc_table(struct hkv_client *c, uint64_t max_age_ns);

uint64_t hkv_rand(struct hkv_client *c);
/* cache mode's eviction policy (client/evict.c): the handle's state (made
 * on first use; NULL without memory), a GET's hit or miss of key hash h,
 * and a handle following another's state (a pipe's lanes) */
struct hkv_cpol *hkv_pol(struct hkv_client *c);
void hkv_pol_access(struct hkv_client *c, uint64_t h);
void hkv_pol_share(struct hkv_client *c, struct hkv_client *from);

/* Tests only: called at named points of an operation (NULL in production). */
enum hkv_test_point {
	HKV_TP_MODIFY_PUBLISH = 1, /* a read-modify-write between its find and its publish */
	HKV_TP_STORE_PUBLISH,      /* add/replace/cas/set between the cold find and the publish */
	HKV_TP_ABORT_SLOT,         /* aborting a stale insert: meta aborted, slot not yet taken */
	HKV_TP_FLUSH_METAS,        /* flush_all: a chunk of the index read, its metas not yet */
	HKV_TP_UNDO_STALE,         /* a stale swing found: the slot is ours, not yet undone */
	HKV_TP_RETRY,              /* an operation lost a race and is about to try again */
	HKV_TP_REPL_DECIDED,       /* a replicated write won on the deciding replica (the
				    * last), not yet on the others (c: the replicated handle) */
	HKV_TP_REPL_STEP,          /* ... and holds on one more replica, not yet the primary */
	HKV_TP_CLAIM_STAMP,        /* a claim CAS won, its HELD stamps not yet posted */
	HKV_TP_INSERT_COMMIT,      /* an insert's slot taken (PENDING), not yet committed */
	HKV_TP_HOLD_WRITE,         /* a held block's hold checked, its first WRITE not posted */
	HKV_TP_VIEW_POST,          /* a view found fresh, the CASes that act on it not posted
				    * (an update's or delete's retire, a slot taken over) */
	HKV_TP_INSERT_SLOT,        /* an insert's block written, its slot CAS (0 -> ours) not posted */
	HKV_TP_FREE,               /* a block we retired: its free (stamp, FAA) not posted */
	HKV_TP_GIVE_BACK,          /* a held block's give-back not posted */
	HKV_TP_ATIME_CAS,          /* a GET's block read and found fresh, its atime CAS not posted */
	HKV_TP_EVICT_MARK,         /* eviction: victims' headers and buckets read as one fresh
				    * view, their mark CASes not posted */
	HKV_TP_REMOVE_SLOT,        /* a remove's mark won (or found a retire in progress), its
				    * slot CAS not posted */
	HKV_TP_CARVE,              /* a CARVE request about to go out on the control plane */
	HKV_TP_REPL_RECLAIM,       /* a tombstone reclaimed on the decider, not yet on the
				    * others (c: the replicated handle) */
	HKV_TP_COUNT
};
extern void (*hkv_test_hook)(struct hkv_client *c, enum hkv_test_point point);
/* Tests only: the view age bound instead of HKV_VIEW_MAX_NS when not 0 (a
 * huge one models a stop after the age check, inside the post). */
extern uint64_t hkv_test_view_max_ns;
/* Control plane: ask for a segment of class cls (CARVE); *seg on success. */
/* The control plane's mutual authentication on a connected fd (connect.c;
 * common/ctl_proto.h): fills *w with the ticket in clear and rk (may be
 * NULL) with the session's request key; HKV_ESERVERAUTH if the server fails
 * to prove it holds token (nothing but a nonce sent). */
struct hkv_ctl_welcome;
int hkv_ctl_handshake(int fd, const char *token, int timeout_ms, struct hkv_ctl_welcome *w,
		      uint8_t rk[32]);
int hkv_ctl_carve(struct hkv_client *c, uint32_t cls, uint64_t keep_off, uint32_t flags,
		  uint32_t *seg);
/* Memory windows: the base grant (READ rkey, and a writer's ATOMIC and
 * WRITE rkeys). */
int hkv_grant_base(struct hkv_client *c);
/* Before an operation: 0 if the connection is up or was re-established;
 * HKV_EDISCONNECTED (or the reconnect's error) if not. */
int hkv_revive(struct hkv_client *c);
/* A replicated handle's region clock offset: its first member's that knows
 * one (client/replica.c). */
uint64_t hkv_repl_clock_off(const struct hkv_client *c);
/* Learn the region's clock now: one READ of its word (a round trip). */
int hkv_clock_refresh(struct hkv_client *c);
/* ... only if it is HKV_CLOCK_MAX_AGE_NS old or our clock went back; 0 or
 * the READ's error. Before an operation (hkv_revive) and in hkv_time(). */
int hkv_clock_keep(struct hkv_client *c);
/* This host's wall clock less its coarse monotonic one: a handle's clock
 * offset where no region clock is known. */
uint64_t hkv_wall_off_ns(void);
/* The region's clock is refreshed riding on a chain once older than this,
 * and by a round trip of its own before an operation once older than
 * HKV_CLOCK_MAX_AGE_NS (or when our monotonic clock went back). */
#define HKV_CLOCK_RIDE_NS    (500ull * 1000000ull)
#define HKV_CLOCK_MAX_AGE_NS (1000ull * 1000000ull)

#endif /* HKV_CLIENT_INT_H */
