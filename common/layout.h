/*
 * layout.h - the remote region's format: what server and clients agree on.
 *
 * Region (one registered memory region, offsets from its base, each part
 * 4 KiB aligned; sizes from struct hkv_geometry in the header):
 *
 *   +----------------+ 0
 *   | header 4 KiB   |  magic, layout version, geometry, hash key, checksum
 *   +----------------+ seg_table_off
 *   | segment table  |  nsegs x 8 B: each segment's class (the server's word)
 *   +----------------+ bitmap_off
 *   | free bitmaps   |  nsegs x bitmap_bytes: bit i = block i free (FAA sets,
 *   |                |  a writer's claim CAS clears)
 *   +----------------+ index_off
 *   | hash index     |  nbuckets x 128 B buckets of 16 slots
 *   +----------------+ data_off
 *   | segments       |  nsegs x seg_size, each carved into one size class
 *   +----------------+ intent_off (0: a region made before claim intents)
 *   | claim intents  |  nintents x 8 B: a writer's claims name their bitmap word
 *   +----------------+ total_size
 *
 * Slot (8 B, the CAS word of the index; 0 = empty):
 *   63        54 53     47 46       36 35                           0
 *   +-----------+---------+-----------+-----------------------------+
 *   | fp (10)   | class(7)| ver (11)  | block offset / 64 (36)      |
 *   +-----------+---------+-----------+-----------------------------+
 *   fp: key hash fingerprint; class: block size class (how much a cold GET
 *   reads); ver: low bits of the block's generation (ABA guard);
 *   offset: block address in 64 B units from the region base.
 *
 * Block (64 B aligned, class size bytes):
 *   0  u64 meta     state(2) | class(7) | aborted(1) | retirer(16) | rsv(6) | gen(32)
 *                   -- CAS word; retirer: in an OBSOLETE meta, the client whose
 *                   CAS retired the block (it frees it, or keeps it to reuse)
 *   8  u32 sum      XXH64 of gen, bytes 12..27, wid, pred and key+value,
 *                   folded to 32 bits (hkv_block_sum)
 *   12 u32 vlen
 *   16 u32 flags    client flags (memcached)
 *   20 u16 klen
 *   22 u16 owner    the writing client's id (0: unknown); a held free block:
 *                   bytes 16..23 are its HELD stamp
 *   24 u32 exptime  absolute Unix seconds (the region's clock), 0 = never
 *   28 u32 pad      0
 *   32 u64 wid      write id: fresh (never 0, below 2^62) for each logical
 *                   write, kept when the item is copied or moved; the item's
 *                   cas version
 *   40 u64 pred     replicated writes (client/replica.c): bits 0..61 the wid
 *                   of the write this one replaced (0: the key was absent);
 *                   bit 62 (HKV_PRED_REPL): written by a replicated write
 *                   (a read never removes it when expired: replicas change
 *                   only together); bit 63 (HKV_PRED_TOMB): a tombstone,
 *                   the key deleted (readers see a miss). 0 in an
 *                   unreplicated store.
 *   -- summed above; the word below is not (a GET CASes it on what it read)
 *   48 u32 atime    the region's clock in ms, mod 2^32: when written, then
 *                   the last access a GET recorded (cache mode)
 *   52 u32 freq     bits 0..7: accesses GETs recorded since written,
 *                   saturating at 255 (cache mode's eviction: common/
 *                   cache_policy.h); bits 8..31: 0
 *   56 key bytes, then value bytes
 *   state: 0 never used, 1 live, 2 obsolete (removed from the index, or
 *   about to be by the writer that marked it), 3 pending (an insert not yet
 *   committed; aborted ones become obsolete with the aborted bit). gen: bumped by the
 *   writer that claimed the block each time the address is reused; never
 *   repeats for an address.
 *
 * Segment table entry (8 B, written by the server only):
 *   state(8) | class(8) | rsv(16) | epoch(32)
 *   state: 0 free (never carved), 1 shared (carved into one class; any
 *   writer claims its free blocks), 2 draining (the server is moving it to
 *   another class: nobody claims there).
 */
#ifndef HKV_LAYOUT_H
#define HKV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define HKV_LAYOUT_MAGIC   0x564b484354414821ull /* "!HATCHKV" */
#define HKV_LAYOUT_VERSION 7 /* 7: atime in a word of its own; 6: XXH64 sums (were CRC32C); 5: pred (replication) in blocks; 4: write id in blocks; 3: shared per-class pools; 2: keyed key hash */
#define HKV_HEADER_SIZE    4096
#define HKV_BUCKET_SLOTS   16
#define HKV_BUCKET_SIZE    128
#define HKV_BLOCK_ALIGN    64
#define HKV_BLOCK_HDR      56
#define HKV_MAX_KEY        250
#define HKV_NCLASSES_MAX   128
#define HKV_MAX_CLIENTS    65535

/*
 * The region's clock (issue 27, "one clock per region"): Unix milliseconds
 * of the server's CLOCK_REALTIME, a u64 in the header past the geometry
 * (not in its sum), stored by the server every HKV_CLOCK_TICK_MS. Every
 * rule that compares times of two parties - TTLs and expiry, cache-mode
 * atime, the PENDING lease - uses it: a client learns it as an offset from
 * its own monotonic clock (client/chain.c), so no client's wall clock is
 * compared with another host's. 0: a server from before it (clients then
 * use their own clock).
 */
#define HKV_CLOCK_OFF     (HKV_HEADER_SIZE - 64)
#define HKV_CLOCK_TICK_MS 10

/* ---- geometry (in the header; every client validates it) ----------------- */

struct hkv_geometry {
	uint64_t magic;
	uint32_t version;
	uint32_t flags; /* HKV_GEOM_F_* */
	uint64_t total_size;
	uint64_t seg_table_off;
	uint64_t bitmap_off;
	uint64_t index_off;
	uint64_t data_off;
	uint64_t nbuckets; /* power of two */
	uint32_t nsegs;
	uint32_t seg_size; /* power of two, >= 64 KiB */
	uint32_t bitmap_bytes; /* per segment */
	uint32_t nclasses;
	uint64_t boot_id;   /* random per server start */
	/* Claim intents (since 2026-12, layout 7; 0 in older regions: none):
	 * nintents 8-byte records at intent_off, after the last segment and
	 * inside every writer's WRITE window. Record id % nintents is the
	 * writer's (the server gives no two connected writers one record); a
	 * claim WRITEs there the offset of the bitmap word it CASes, before
	 * the CAS (hkv_intent_rec; docs/design.md, "Memory that flows"). */
	uint64_t intent_off;
	/* SipHash-2-4 key of this region's key hash (hkv_key_hash): random when
	 * the region is made, kept across warm restarts. Only clients that
	 * passed AUTH can read it, so nobody else can aim keys at a bucket. */
	uint8_t hash_key[16];
	uint32_t nintents; /* a power of two, or 0 with intent_off 0 */
	uint32_t rsv32;
	uint64_t reserved[2];
	uint32_t class_size[HKV_NCLASSES_MAX];
	uint32_t pad;
	uint32_t sum; /* XXH64 of everything above, folded to 32 bits */
};

#define HKV_GEOM_F_CACHE 0x1 /* cache mode: evict instead of failing when full */
_Static_assert(sizeof(struct hkv_geometry) <= HKV_CLOCK_OFF, "the clock word is past the geometry");

/*
 * Lay out a region of `total` bytes; 0 or -EINVAL if too small. growth: each
 * size class this many thousandths of the one below (1001..4000), 0 for the
 * mode's default: HKV_GROWTH_CACHE (memcached's 1.25) in cache mode,
 * HKV_GROWTH_STORE in a store, whose server moves live items to free whole
 * segments, so that fine classes cost little there (docs/design.md).
 */
#define HKV_GROWTH_CACHE 1250
#define HKV_GROWTH_STORE 1125
int hkv_geometry_init(struct hkv_geometry *g, uint64_t total, uint32_t seg_size,
		      uint64_t index_slots, uint32_t flags, uint32_t growth);
/*
 * The segment size a region of `total` bytes gets unless told: 1 MiB (the
 * largest item), halved down to 64 KiB while the region would hold fewer
 * than HKV_SEGS_MIN segments. Every size class in use needs a segment of
 * its own, and a value range of 100 B - 8 KB uses about 20: a 16 MB cache
 * of 1 MiB segments cannot give each one even one (hatchkv-hitratio, Zipf:
 * 63 % against 83 % with 512 KiB; docs/design.md, "Segments").
 */
#define HKV_SEG_SIZE_DEFAULT (1u << 20)
#define HKV_SEGS_MIN         32
uint32_t hkv_seg_size_for(uint64_t total);
/* Seal (compute sum) / check a geometry read from a region. 0 or HKV_ECORRUPT/EPROTO. */
void hkv_geometry_seal(struct hkv_geometry *g);
int hkv_geometry_check(const struct hkv_geometry *g, uint64_t region_len);
/* Smallest class whose size holds `bytes`, or -1 if none. */
int hkv_class_for(const struct hkv_geometry *g, uint32_t bytes);

/* ---- slot ------------------------------------------------------------------ */

#define HKV_SLOT_FP_BITS    10
#define HKV_SLOT_CLASS_BITS 7
#define HKV_SLOT_VER_BITS   11
#define HKV_SLOT_OFF_BITS   36

static inline uint64_t hkv_slot_make(uint32_t fp, uint32_t cls, uint32_t gen, uint64_t off)
{
	return (uint64_t)(fp & 0x3ff) << 54 | (uint64_t)(cls & 0x7f) << 47 |
	       (uint64_t)(gen & 0x7ff) << 36 | ((off / HKV_BLOCK_ALIGN) & 0xfffffffffull);
}

static inline uint32_t hkv_slot_fp(uint64_t s)
{
	return (uint32_t)(s >> 54);
}

static inline uint32_t hkv_slot_class(uint64_t s)
{
	return (uint32_t)(s >> 47) & 0x7f;
}

static inline uint32_t hkv_slot_ver(uint64_t s)
{
	return (uint32_t)(s >> 36) & 0x7ff;
}

static inline uint64_t hkv_slot_off(uint64_t s)
{
	return (s & 0xfffffffffull) * HKV_BLOCK_ALIGN;
}

/* ---- block ----------------------------------------------------------------- */

enum hkv_block_state {
	HKV_BLK_UNUSED = 0,
	HKV_BLK_LIVE = 1,
	HKV_BLK_OBSOLETE = 2,
	HKV_BLK_PENDING = 3, /* inserted, not yet committed: readers take it as absent */
};

/* In an OBSOLETE meta: it was PENDING and never committed (never a value). */
#define HKV_META_ABORTED (1ull << 9)

/* In an OBSOLETE meta: the client whose CAS retired the block, so owes its
 * free (or reuses it). If that client disconnects first, the server frees
 * the block (server/slab.c). 0: a server-side retire (freed at once). */
static inline uint64_t hkv_meta_retirer(uint32_t client_id)
{
	return (uint64_t)(client_id & 0xffff) << 10;
}

static inline uint32_t hkv_meta_retired_by(uint64_t m)
{
	return (uint32_t)(m >> 10) & 0xffff;
}

struct hkv_block_hdr {
	uint64_t meta;
	uint32_t sum;
	uint32_t vlen;
	uint32_t flags;
	uint16_t klen;
	uint16_t owner;
	uint32_t exptime;
	uint32_t pad;   /* 0 (in the sum): exptime's word is never CASed */
	uint64_t wid;
	uint64_t pred;
	uint32_t atime; /* not in the sum: a GET's CAS word (atime | freq), */
	uint32_t freq;  /* so a stale CAS can change no summed byte */
};
_Static_assert(sizeof(struct hkv_block_hdr) == HKV_BLOCK_HDR, "block header size");

#define HKV_PRED_TOMB (1ull << 63) /* in pred: this block is a tombstone */
#define HKV_PRED_REPL (1ull << 62) /* in pred: written by a replicated write */
#define HKV_WID_MASK  (HKV_PRED_REPL - 1) /* write ids, and pred's */

static inline int hkv_block_tomb(const struct hkv_block_hdr *h)
{
	return !!(h->pred & HKV_PRED_TOMB);
}

static inline uint64_t hkv_meta_make(enum hkv_block_state st, uint32_t cls, uint32_t gen)
{
	return (uint64_t)st | (uint64_t)(cls & 0x7f) << 2 | (uint64_t)gen << 32;
}

static inline enum hkv_block_state hkv_meta_state(uint64_t m)
{
	return (enum hkv_block_state)(m & 3);
}

static inline uint32_t hkv_meta_class(uint64_t m)
{
	return (uint32_t)(m >> 2) & 0x7f;
}

static inline uint32_t hkv_meta_gen(uint64_t m)
{
	return (uint32_t)(m >> 32);
}

/* The block's sum over gen, lengths, flags, owner, exptime, wid, pred, key
 * and value: what tells a torn or reused block from a whole one. */
uint32_t hkv_block_sum(const struct hkv_block_hdr *h, const void *kv);

/*
 * Validate a block read from remote memory against what the reader expects:
 * returns 0 if its header is sane, lengths fit `avail` bytes and the class,
 * the sum matches, and the key equals key/klen; HKV_ENOTFOUND if it is a
 * valid block of another key; HKV_ECORRUPT otherwise (torn, reused, garbage).
 */
int hkv_block_check(const struct hkv_geometry *g, const void *blk, uint32_t avail,
		    const void *key, uint16_t klen);

/* ---- segment table --------------------------------------------------------- */

/*
 * FREE: never carved. SHARED: carved into one class; its free blocks (bits
 * set) are any writer's to claim. DRAINING: the server is emptying it to
 * carve it into another class (its slab mover); a claim that finds this
 * state gives its blocks back. Only the server's CPU writes the table.
 */
enum hkv_seg_state { HKV_SEG_FREE = 0, HKV_SEG_SHARED = 1, HKV_SEG_DRAINING = 2 };

static inline uint64_t hkv_seg_make(enum hkv_seg_state st, uint32_t cls, uint32_t epoch)
{
	return (uint64_t)st | (uint64_t)(cls & 0xff) << 8 | (uint64_t)epoch << 32;
}

static inline enum hkv_seg_state hkv_seg_state(uint64_t e)
{
	return (enum hkv_seg_state)(e & 0xff);
}

static inline uint32_t hkv_seg_class(uint64_t e)
{
	return (uint32_t)(e >> 8) & 0xff;
}

static inline uint32_t hkv_seg_epoch(uint64_t e)
{
	return (uint32_t)(e >> 32);
}

/*
 * Held blocks. A writer claims free blocks by CAS on their bitmap word and
 * stamps each one it holds: bytes 16..23 (flags | klen | rsv) become
 * seq | 0xFFFF | holder id, a klen no written block has. A held block is
 * its holder's until the holder writes it or gives it back (freed stamp,
 * then bit set), at any age (client/alloc.c): the server takes one back
 * only from a holder that is fenced - disconnected, its queue pair gone or
 * its shm gate shut (hkv_listener_fence), so nothing it posts can land any
 * more - once the block has stayed clear under one unchanged stamp for
 * HKV_HOLD_RECLAIM_MS (server/slab.c). The sweep takes back what
 * disconnected holders held; a move that needs a connected holder's block
 * fences that holder first (it connects again at its next operation). A
 * stopped but connected holder costs what it holds, nobody's data.
 */
#define HKV_HOLD_RECLAIM_MS 1500
/* A freed block rests this long between its free and its next write, by
 * whoever claims it, a client or the server moving an item (the ABA
 * horizon: client/client_int.h, docs/design.md "Views"). */
#define HKV_QUARANTINE_NS   (200ull * 1000ull)
/* An uncommitted insert older than this (its atime, ms) is abandoned. */
#define HKV_PENDING_LEASE_MS 1000
#define HKV_HELD_KLEN       0xffffu

static inline uint64_t hkv_held_make(uint32_t holder, uint32_t seq)
{
	return (uint64_t)seq | (uint64_t)HKV_HELD_KLEN << 32 | (uint64_t)(holder & 0xffff) << 48;
}

static inline int hkv_held_is(uint64_t word16)
{
	return (uint32_t)(word16 >> 32 & 0xffff) == HKV_HELD_KLEN;
}

static inline uint32_t hkv_held_holder(uint64_t word16)
{
	return (uint32_t)(word16 >> 48);
}

/* A HELD stamp naming a holder (not hkv_freed_stamp's "nobody"). */
static inline int hkv_held_by_one(uint64_t word16)
{
	return hkv_held_is(word16) && hkv_held_holder(word16);
}

/*
 * Bytes 16..23 of a block whose free (or give-back) a client posted: HELD
 * form with no holder and, as its seq, the freer's id and a count of its
 * frees (so that two frees of one block leave different stamps), WRITTEN
 * just before the bit's FAA. The sweep takes
 * back a retired block whose retirer left (its free never posted) only
 * when these bytes are not HELD form; a block freed and then claimed by a
 * writer not yet stamping it keeps this, so a stopped claimer's blocks are
 * never mistaken for a gone retirer's (issue 27). No holder: never taken as
 * held either.
 */
static inline uint64_t hkv_freed_stamp(uint32_t freer, uint32_t n)
{
	return hkv_held_make(0, (freer & 0xffff) << 16 | (n & 0xffff));
}

static inline int hkv_freed_is(uint64_t word16)
{
	return hkv_held_is(word16) && !hkv_held_holder(word16);
}

/* Who posted the free a freed stamp records (0: the server). */
static inline uint32_t hkv_freed_by(uint64_t word16)
{
	return (uint32_t)(word16 >> 16) & 0xffff;
}

/*
 * Claim intents. A claim's chain is [WRITE the bitmap word's offset into
 * the claimer's intent record, CAS the word, ...]: RC runs the WRITE first,
 * so whenever a claim's CAS has won, the record names its word until the
 * claimer empties it - which it posts only after the stamps of this claim,
 * on the same queue pair. A block with its bit clear under a freed stamp
 * (or a fresh carve's zero) is thus a claim not yet stamped by a writer
 * whose record names the word, or one whose claimer (or freer, for a free
 * cut between its stamp and its FAA) is fenced: the sweep takes it back
 * only then (server/slab.c, kind 5).
 */
#define HKV_NINTENTS 4096u

static inline uint64_t hkv_intent_rec(const struct hkv_geometry *g, uint32_t client_id)
{
	return g->intent_off + (uint64_t)(client_id & (g->nintents - 1)) * 8;
}

/* ---- hashing ----------------------------------------------------------------- */

/* Unkeyed 64-bit hash for the server's own tables (not for keys). */
uint64_t hkv_hash64(const void *key, size_t len);
/*
 * The key hash everything about a key's place derives from: its buckets, its
 * slot fingerprint, its location-cache entry. SipHash-2-4 (libsodium's
 * crypto_shorthash) keyed with the region's secret g->hash_key.
 */
uint64_t hkv_key_hash(const struct hkv_geometry *g, const void *key, size_t len);
/* The two candidate buckets and the fingerprint of a key hash. */
static inline void hkv_buckets_of(const struct hkv_geometry *g, uint64_t h, uint64_t *b1,
				  uint64_t *b2)
{
	uint64_t mask = g->nbuckets - 1;

	*b1 = h & mask;
	*b2 = (h >> 32 ^ h >> 17) & mask;
	if (*b2 == *b1)
		*b2 = *b1 ^ 1;
}

static inline uint32_t hkv_fp_of(uint64_t h)
{
	return (uint32_t)(h >> 54);
}

#endif /* HKV_LAYOUT_H */
