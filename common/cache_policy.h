/*
 * cache_policy.h - cache mode's eviction choice: two experts (recency and
 * frequency) over a sample of blocks, weighted by the regret each one's
 * past choices caused (docs/design.md, "Cache mode: eviction that adapts").
 *
 * What a block carries (its atime|freq word at offset 48, which a GET
 * CASes on what it read, at most once per ms per client; not in the sum):
 *   atime  the region's clock in ms, mod 2^32, of the last access recorded
 *   freq   bits 0..7: accesses recorded since written (saturating at 255);
 *          bits 8..31: 0
 *
 * What a client keeps (struct hkv_cpol, one per handle, nothing shared):
 * a ghost of the keys each expert nominated lately for eviction - each
 * key's hash with which expert(s) put it among their picks, evicted or not
 * - and each expert's regret: how many of its nominations were asked for
 * again while in the ghost (a miss if it was evicted, a hit if the other
 * expert's choice kept it). Both experts are judged on every round, the one
 * followed and the one not, so no round is spent exploring: each round
 * follows the expert with less regret lately (halved as it accrues).
 * "Again" means soon: within the next items/16 nominations, items being
 * what the cache holds (estimated from the memory and the sizes evicted);
 * a longer window counts the re-use every kept item sees eventually and
 * cannot tell the experts apart (bench/sim.c measured 1/4 .. 1/64). The
 * table is two entries per nomination in the window, at most 2^20 (8 MiB).
 *
 * The same code runs in the client (client/evict.c) and in the simulator
 * (bench/sim.c, policy "hkv"), so what the simulator says is this policy's.
 */
#ifndef HKV_CACHE_POLICY_H
#define HKV_CACHE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define HKV_FREQ_MAX 255u

enum { HKV_EXPERT_LRU, HKV_EXPERT_LFU, HKV_NEXPERTS };

/* The freq word after one more recorded access. */
static inline uint32_t hkv_freq_touched(uint32_t freq)
{
	uint32_t f = freq & 0xff;

	return f < HKV_FREQ_MAX ? (freq & ~0xffu) | (f + 1) : freq;
}

static inline uint32_t hkv_freq_count(uint32_t freq)
{
	return freq & 0xff;
}

/*
 * An expert's eviction score of a block: lower goes first. Expired blocks
 * first for both; recency: the oldest access; frequency: the fewest
 * recorded accesses, the oldest among equals.
 */
static inline int64_t hkv_expert_score(int expert, uint32_t atime, uint32_t freq,
				       uint32_t exptime, uint32_t now_ms, uint32_t now_s)
{
	int64_t age = (int32_t)(atime - now_ms); /* <= 0 */

	if (exptime && exptime <= now_s)
		return INT64_MIN;
	if (expert == HKV_EXPERT_LFU)
		return (int64_t)hkv_freq_count(freq) * ((int64_t)1 << 32) + age;
	return age;
}

struct hkv_cpol {
	double regret[HKV_NEXPERTS]; /* decayed */
	/* the ghost: direct-mapped by hash, each entry (hash's high 32 bits) << 32
	 * | nomination number (30 bits) << 2 | experts that nominated it; valid
	 * while fewer than `window` nominations followed it */
	uint64_t *ghost;
	uint64_t ghost_mask;
	uint32_t seq, window;
	double mean_bytes;  /* of the blocks evicted (moving mean) */
	uint64_t mem_bytes; /* the cache's memory */
	/* counted: rounds each expert was followed, regrets each took */
	uint64_t rounds[HKV_NEXPERTS], regrets[HKV_NEXPERTS];
};

/* For a cache of mem_bytes. No memory is taken until the first eviction. */
void hkv_cpol_init(struct hkv_cpol *p, uint64_t mem_bytes);
void hkv_cpol_fini(struct hkv_cpol *p);
/* The expert with fewer recent regrets (recency on a tie). */
int hkv_cpol_favoured(const struct hkv_cpol *p);
/* The expert this round follows: the favoured one, counted. */
int hkv_cpol_pick(struct hkv_cpol *p);
/* A key (hash h) nominated; mask: bit e set if expert e nominated it;
 * evicted_bytes: its block's size if it was evicted, else 0. */
void hkv_cpol_nominated(struct hkv_cpol *p, uint64_t h, unsigned mask, uint32_t evicted_bytes);
/* A get of key hash h, hit or miss: if the ghost has it, the experts that
 * alone nominated it take a regret. Returns 1 if it was in the ghost. */
int hkv_cpol_accessed(struct hkv_cpol *p, uint64_t h);

/*
 * Of n candidates (n <= 256), each expert nominates its k lowest of
 * score[e][]. Into out[] and masks[]: first the nominations of expert
 * `pick`, lowest first (the victims: *nvictims of them), then the other
 * experts' that pick did not nominate; masks[i]: the experts that
 * nominated out[i]. Returns how many entries out[] has.
 */
int hkv_cpol_choose(const int64_t *const score[HKV_NEXPERTS], int n, int k, int pick,
		    int *out, unsigned *masks, int *nvictims);

#endif
