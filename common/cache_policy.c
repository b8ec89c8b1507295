/* cache_policy.c - see cache_policy.h. */
#include "common/cache_policy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Regrets are halved each time the two experts' sum reaches CPOL_WINDOW:
 * the choice follows the last few thousand nominations asked for again. */
#define CPOL_WINDOW 128.0

#define CPOL_WINDOW_DIV 16 /* the ghost's window: items / 16 nominations */
#define SEQ_MASK        ((1u << 30) - 1)
#define WINDOW_MAX      (1u << 19) /* a table of at most 2^20 entries, 8 MiB */

void hkv_cpol_init(struct hkv_cpol *p, uint64_t mem_bytes)
{
	memset(p, 0, sizeof(*p));
	p->mem_bytes = mem_bytes;
}

void hkv_cpol_fini(struct hkv_cpol *p)
{
	free(p->ghost);
	p->ghost = NULL;
}

/* The window from the items the memory holds at the mean size evicted; the
 * table (two entries per nomination in the window) follows it when it is
 * off by 4x, forgetting what it had. A failed allocation keeps the old. */
static void ghost_size(struct hkv_cpol *p)
{
	double items = p->mean_bytes > 0 ? (double)p->mem_bytes / p->mean_bytes : 0;
	uint64_t w = (uint64_t)(items / CPOL_WINDOW_DIV), n = 64;
	uint64_t *g;

	if (w < 32)
		w = 32;
	if (w > WINDOW_MAX)
		w = WINDOW_MAX;
	p->window = (uint32_t)w;
	while (n < 2 * w)
		n <<= 1;
	if (p->ghost && n <= 4 * (p->ghost_mask + 1) && 4 * n >= p->ghost_mask + 1)
		return;
	if (!(g = calloc(n, sizeof(*g))))
		return;
	free(p->ghost);
	p->ghost = g;
	p->ghost_mask = n - 1;
}

int hkv_cpol_favoured(const struct hkv_cpol *p)
{
	return p->regret[HKV_EXPERT_LFU] < p->regret[HKV_EXPERT_LRU] ? HKV_EXPERT_LFU
								    : HKV_EXPERT_LRU;
}

int hkv_cpol_pick(struct hkv_cpol *p)
{
	int e = hkv_cpol_favoured(p);

	p->rounds[e]++;
	return e;
}

/* The ghost's place of a hash. */
static uint64_t *ghost_at(struct hkv_cpol *p, uint64_t h)
{
	return &p->ghost[(h ^ h >> 29) & p->ghost_mask];
}

void hkv_cpol_nominated(struct hkv_cpol *p, uint64_t h, unsigned mask, uint32_t evicted_bytes)
{
	if (evicted_bytes) {
		int first = p->mean_bytes == 0;

		p->mean_bytes = first ? evicted_bytes : 0.999 * p->mean_bytes + 0.001 * evicted_bytes;
		if (first || !(p->seq & 1023))
			ghost_size(p);
	}
	if (!p->ghost || !(mask & 3))
		return;
	p->seq = (p->seq + 1) & SEQ_MASK;
	*ghost_at(p, h) = (h >> 32 << 32) | (uint64_t)p->seq << 2 | (mask & 3);
}

int hkv_cpol_accessed(struct hkv_cpol *p, uint64_t h)
{
	uint64_t *g, v;
	unsigned mask;

	if (!p->ghost)
		return 0;
	g = ghost_at(p, h);
	v = *g;
	if (!v || v >> 32 != h >> 32)
		return 0;
	*g = 0; /* one regret per nomination */
	if (((p->seq - (uint32_t)(v >> 2)) & SEQ_MASK) >= p->window)
		return 0; /* nominated too long ago */
	mask = (unsigned)(v & 3);
	if (mask == 3) /* both nominated it: neither learns anything */
		return 1;
	for (int e = 0; e < HKV_NEXPERTS; e++)
		if (mask & 1u << e) {
			p->regret[e] += 1;
			p->regrets[e]++;
		}
	if (p->regret[0] + p->regret[1] >= CPOL_WINDOW)
		for (int e = 0; e < HKV_NEXPERTS; e++)
			p->regret[e] /= 2;
	return 1;
}

/* Indices of the k lowest of s[0..n), lowest first, into idx. */
static int lowest(const int64_t *s, int n, int k, int *idx)
{
	int m = 0;

	if (k <= 0)
		return 0;
	for (int i = 0; i < n; i++) {
		int j;

		if (m == k && s[i] >= s[idx[m - 1]])
			continue;
		j = m < k ? m++ : m - 1;
		while (j > 0 && s[idx[j - 1]] > s[i]) {
			idx[j] = idx[j - 1];
			j--;
		}
		idx[j] = i;
	}
	return m;
}

int hkv_cpol_choose(const int64_t *const score[HKV_NEXPERTS], int n, int k, int pick,
		    int *out, unsigned *masks, int *nvictims)
{
	int top[HKV_NEXPERTS][256], m[HKV_NEXPERTS], got = 0;

	if (n > 256)
		n = 256;
	if (k > n)
		k = n;
	for (int e = 0; e < HKV_NEXPERTS; e++)
		m[e] = lowest(score[e], n, k, top[e]);
	for (int e = pick, round = 0; round < HKV_NEXPERTS;
	     round++, e = (e + 1) % HKV_NEXPERTS) {
		for (int j = 0; j < m[e]; j++) {
			int i = top[e][j], seen = 0;

			for (int x = 0; x < got && !seen; x++)
				seen = out[x] == i;
			if (seen)
				continue;
			out[got] = i;
			masks[got] = 0;
			for (int f = 0; f < HKV_NEXPERTS; f++)
				for (int y = 0; y < m[f]; y++)
					if (top[f][y] == i)
						masks[got] |= 1u << f;
			got++;
		}
		if (e == pick)
			*nvictims = got;
	}
	return got;
}
