/*
 * sim.h - exact cache simulators by bytes: LRU, LFU and S3-FIFO, to replay a
 * trace (bench/trace.h) and say what hit ratio each policy would give.
 *
 * An item costs key size + value size + HKV_SIM_ITEM_OVERHEAD bytes
 * (hatchkv's block header, HKV_BLOCK_HDR, and its 8-byte index slot;
 * memcached's item header is 48-56 bytes), and the items held never cost more than the
 * capacity. An item bigger than the whole capacity is never cached.
 *
 * Keys are the trace's dense ids [0, nkeys): a per-key array is the hash
 * table, and each policy's order is kept in intrusive doubly linked lists
 * threaded through it, so a request is O(1) (S3-FIFO: amortised O(1) - an
 * item is passed over by eviction at most once per hit it took, the counter
 * being capped at 3).
 *
 *   LRU      one list, most recent at the head; evict the tail.
 *   LFU      frequency counted while cached (forgotten on eviction);
 *            buckets of equal count in ascending order, each an LRU list:
 *            evict the least recently used of the least frequent
 *
 *              bucket(1) <-> bucket(2) <-> bucket(5) ...
 *                 |             |             |
 *               items         items         items   (head = most recent)
 *
 *   S3-FIFO  (Yang et al., SOSP'23) small FIFO S (10 % of the bytes),
 *            main FIFO M, ghost FIFO G of evicted ids (no bytes; at most as
 *            many entries as M holds items). A hit adds 1 to the item's
 *            counter, capped at 3; nothing moves. A miss inserts into S, or
 *            into M if the id is in G. Room is made from S while S holds
 *            >= 10 % of the capacity (or M is empty), else from M:
 *              S's tail: counter >= promote -> to M's head, counter
 *                        cleared; else out, its id to G's head.
 *              M's tail: counter > 0 -> back to M's head, counter - 1;
 *                        else out.
 *            promote defaults to 1 ("accessed while in S", libCacheSim's
 *            S3FIFO.c); the paper's listing and s3fifo.com say "more than
 *            once" (2). We take 1 because a look-aside fill is a set after
 *            the miss, not an access, so one hit inside S's short window
 *            is already reuse; 2 demotes most second-time keys to the ghost
 *            and leaves them to come back through it (--s3fifo-promote 2
 *            measures that variant).
 *
 * Look-aside replay (hkv_sim_request): a get that misses is followed by a
 * set of the key with the request's value size. set stores (an access if
 * present), add stores only if absent, replace/cas/append/prepend/incr/decr
 * store only if present (an access), delete removes. A write to a cached
 * item counts as an access for the policy; only gets count in hit ratios.
 *
 * One simulator per thread; nothing shared.
 */
#ifndef HKV_BENCH_SIM_H
#define HKV_BENCH_SIM_H

#include <stdint.h>

#include "bench/trace.h"
#include "common/layout.h"

#define HKV_SIM_ITEM_OVERHEAD (HKV_BLOCK_HDR + 8)

enum hkv_sim_policy { HKV_SIM_LRU, HKV_SIM_LFU, HKV_SIM_S3FIFO, HKV_SIM_HKV, HKV_SIM_NPOLICIES };

struct hkv_sim_config {
	enum hkv_sim_policy policy;
	uint64_t cap_bytes;
	uint32_t nkeys;      /* ids are < nkeys */
	unsigned s3_promote; /* S3-FIFO: counter needed to move S -> M; 0 = 1 */
	/* per key, what its item costs (overhead included) instead of key +
	 * value + HKV_SIM_ITEM_OVERHEAD: a real server's block sizes; NULL: none */
	const uint64_t *item_bytes;
};

struct hkv_sim_stats {
	uint64_t gets, hits; /* look-aside gets replayed, and the hits among them */
	uint64_t items, bytes, evictions;
};

struct hkv_sim;

/* Policy name ("lru", "lfu", "s3fifo") -> policy; -1 if unknown. */
int hkv_sim_policy_parse(const char *name);
const char *hkv_sim_policy_name(enum hkv_sim_policy p);

/* NULL with errno ENOMEM or EINVAL. */
struct hkv_sim *hkv_sim_create(const struct hkv_sim_config *cfg);
void hkv_sim_destroy(struct hkv_sim *s);

/* Replay one request (look-aside for gets): 1 if it was a get that hit. */
int hkv_sim_request(struct hkv_sim *s, const struct hkv_trace_req *r);

/* The pieces, for tests: a get (1 hit, 0 miss; nothing inserted), a set of
 * `bytes` (overhead added here), a delete, and whether key is cached. */
int hkv_sim_get(struct hkv_sim *s, uint32_t key);
void hkv_sim_set(struct hkv_sim *s, uint32_t key, uint64_t bytes);
void hkv_sim_delete(struct hkv_sim *s, uint32_t key);
int hkv_sim_cached(const struct hkv_sim *s, uint32_t key);

void hkv_sim_stats(const struct hkv_sim *s, struct hkv_sim_stats *st);

#endif
