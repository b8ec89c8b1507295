/*
 * cache.c - key -> location cache of a handle: direct-mapped by key hash,
 * so bounded and O(1). An entry remembers the slot it was found in, the
 * slot's value and the block's generation and length, which lets a GET read
 * just the block (one round trip) and an update CAS the slot directly.
 * Entries are hints: every use is validated against remote memory, and an
 * entry older than HKV_CACHE_MAX_AGE_NS is not used at all (see the ABA
 * argument in docs/design.md).
 */
#include <errno.h>
#include <string.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"

int hkv_cache_init(struct hkv_cache *lc, size_t entries)
{
	size_t n = 1;

	lc->e = NULL;
	lc->mask = 0;
	if (!entries)
		return 0;
	while (n < entries)
		n <<= 1;
	lc->e = hkv_calloc(n, sizeof(*lc->e));
	if (!lc->e)
		return -ENOMEM;
	lc->mask = n - 1;
	return 0;
}

void hkv_cache_fini(struct hkv_cache *lc)
{
	hkv_free(lc->e);
	lc->e = NULL;
}

struct hkv_loc *hkv_cache_find(struct hkv_cache *lc, uint64_t hash, uint64_t now)
{
	struct hkv_loc *e;

	if (!lc->e)
		return NULL;
	e = &lc->e[hash & lc->mask];
	if (e->hash != hash || now - e->stamp_ns > HKV_CACHE_MAX_AGE_NS)
		return NULL;
	return e;
}

void hkv_cache_put(struct hkv_cache *lc, const struct hkv_loc *loc)
{
	if (lc->e)
		lc->e[loc->hash & lc->mask] = *loc;
}

void hkv_cache_drop(struct hkv_cache *lc, uint64_t hash)
{
	struct hkv_loc *e;

	if (!lc->e)
		return;
	e = &lc->e[hash & lc->mask];
	if (e->hash == hash)
		memset(e, 0, sizeof(*e));
}
