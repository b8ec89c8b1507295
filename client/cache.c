/*
 * cache.c - key -> location cache: direct-mapped by key hash, bounded and
 * O(1), shared by all handles opened from one config (so threads warm it
 * for each other; reference counted, so either may be freed first). Each entry is a seqlock: a reader copies it and keeps
 * the copy only if the sequence did not move; a writer that finds the entry
 * busy skips its update (it is only a cache).
 *
 * An entry remembers the slot a key was found in, the slot's value and the
 * block's generation and length, which lets a GET read just the block (one
 * round trip) and an update CAS the slot directly. Entries are hints: every
 * use is validated against remote memory. Reads may use an entry of any age
 * (a block's 32-bit generation never repeats for its address, and the block
 * read holds the key to compare); a write acts on an entry without reading
 * the block only if the entry holds the key itself (keys up to
 * HKV_CACHE_KEY_INLINE bytes) and is younger than HKV_VIEW_MAX_NS (the ABA
 * argument in docs/design.md). A 64-bit hash collides by chance at scale:
 * two keys with one hash share an entry's place, never its identity.
 */
#include <errno.h>
#include <string.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"

struct hkv_cache *hkv_cache_new(size_t entries)
{
	struct hkv_cache *lc = hkv_calloc(1, sizeof(*lc));
	size_t n = 1;

	if (!lc)
		return NULL;
	lc->refs = 1;
	if (!entries)
		return lc;
	while (n < entries || n < 2)
		n <<= 1;
	lc->e = hkv_calloc(n, sizeof(*lc->e));
	if (!lc->e) {
		hkv_free(lc);
		return NULL;
	}
	lc->mask = n - 1;
	return lc;
}

struct hkv_cache *hkv_cache_ref(struct hkv_cache *lc)
{
	__atomic_fetch_add(&lc->refs, 1, __ATOMIC_RELAXED);
	return lc;
}

void hkv_cache_unref(struct hkv_cache *lc)
{
	if (!lc || __atomic_sub_fetch(&lc->refs, 1, __ATOMIC_ACQ_REL))
		return;
	hkv_free(lc->e);
	hkv_free(lc);
}

static void unpack(const uint64_t *w, struct hkv_loc *l)
{
	l->hash = w[0];
	l->slot_addr = w[1];
	l->slot = w[2];
	l->gen = (uint32_t)w[3];
	l->blen = (uint32_t)(w[3] >> 32);
	l->stamp_ns = w[4];
}

/* Copy entry e if it is stable and holds hash; its sequence in *seq; 1 if so. */
static int read_entry(struct hkv_cache_entry *e, uint64_t hash, uint64_t *w, uint64_t *seq)
{
	uint64_t s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE), s2;

	if (s1 & 1)
		return 0;
	/* acquire loads keep the second read of seq after the data (no fence:
	 * ThreadSanitizer does not model fences); of the key, only its words */
	for (int i = 0; i < 6; i++)
		w[i] = __atomic_load_n(&e->w[i], __ATOMIC_ACQUIRE);
	for (int i = 6; i < HKV_CACHE_WORDS && (uint64_t)(i - 6) * 8 < w[5]; i++)
		w[i] = __atomic_load_n(&e->w[i], __ATOMIC_ACQUIRE);
	s2 = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
	*seq = s1;
	return s1 == s2 && w[0] == hash;
}

/* Does the copied entry w belong to key? 1 yes (compared), 0 unknown (a key
 * too long to keep inline, of the same length), -1 another key. */
static int entry_key(const uint64_t *w, const void *key, uint16_t klen)
{
	if (w[5] != klen)
		return -1;
	if (klen > HKV_CACHE_KEY_INLINE)
		return 0;
	return memcmp(&w[6], key, klen) ? -1 : 1;
}

/* Two-way set associative: a key may sit in either entry of its pair. */
static struct hkv_cache_entry *set_of(struct hkv_cache *lc, uint64_t hash)
{
	return &lc->e[hash & lc->mask & ~1ull];
}

int hkv_cache_find(struct hkv_cache *lc, uint64_t hash, const void *key, uint16_t klen,
		   uint64_t now, uint64_t max_age, struct hkv_loc *out)
{
	uint64_t w[HKV_CACHE_WORDS], seq;

	if (!lc->e)
		return 0;
	for (int way = 0; way < 2; way++) {
		int kk;

		if (!read_entry(&set_of(lc, hash)[way], hash, w, &seq) ||
		    (kk = entry_key(w, key, klen)) < 0)
			continue;
		if (max_age == UINT64_MAX || now - w[4] <= max_age) {
			unpack(w, out);
			out->key_ok = kk;
			return 1;
		}
	}
	return 0;
}

/* Write the words [first, first + n) of e under its seqlock, if its sequence
 * is still seq (any even one when seq is odd); else skip (it is a cache). */
static void write_entry(struct hkv_cache_entry *e, uint64_t seq, int first, int n,
			const uint64_t *w)
{
	uint64_t s = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);

	if ((s & 1) || (!(seq & 1) && s != seq) ||
	    !__atomic_compare_exchange_n(&e->seq, &s, s + 1, 0, __ATOMIC_ACQUIRE,
					 __ATOMIC_RELAXED))
		return;
	/* release stores: no data word becomes visible before the odd sequence
	 * (readers load the words with acquire, then the sequence again) */
	for (int i = first; i < first + n; i++)
		__atomic_store_n(&e->w[i], w[i], __ATOMIC_RELEASE);
	__atomic_store_n(&e->seq, s + 2, __ATOMIC_RELEASE);
}

/* The way holding hash, else (for a put) the one confirmed longer ago. */
static struct hkv_cache_entry *way_for(struct hkv_cache *lc, uint64_t hash, int for_put)
{
	struct hkv_cache_entry *set = set_of(lc, hash);
	uint64_t w0 = __atomic_load_n(&set[0].w[0], __ATOMIC_RELAXED);
	uint64_t w1 = __atomic_load_n(&set[1].w[0], __ATOMIC_RELAXED);

	if (w0 == hash || w1 == hash)
		return &set[w0 == hash ? 0 : 1];
	if (!for_put)
		return NULL;
	return __atomic_load_n(&set[0].w[4], __ATOMIC_RELAXED) <=
			       __atomic_load_n(&set[1].w[4], __ATOMIC_RELAXED)
		       ? &set[0]
		       : &set[1];
}

void hkv_cache_put(struct hkv_cache *lc, const struct hkv_loc *l, const void *key,
		   uint16_t klen)
{
	uint64_t w[HKV_CACHE_WORDS] = {l->hash, l->slot_addr, l->slot,
				       l->gen | (uint64_t)l->blen << 32, l->stamp_ns, klen};

	if (!lc->e)
		return;
	if (klen <= HKV_CACHE_KEY_INLINE)
		memcpy(&w[6], key, klen);
	write_entry(way_for(lc, l->hash, 1), 1, 0, HKV_CACHE_WORDS, w);
}

void hkv_cache_refresh(struct hkv_cache *lc, const struct hkv_loc *l, uint64_t stamp_ns)
{
	struct hkv_cache_entry *e = lc->e ? way_for(lc, l->hash, 0) : NULL;
	uint64_t w[HKV_CACHE_WORDS], seq;

	if (!e || !read_entry(e, l->hash, w, &seq) || w[1] != l->slot_addr || w[2] != l->slot ||
	    (uint32_t)w[3] != l->gen || w[4] >= stamp_ns)
		return;
	w[4] = stamp_ns;
	write_entry(e, seq, 4, 1, w);
}

void hkv_cache_drop(struct hkv_cache *lc, uint64_t hash)
{
	static const uint64_t zero[HKV_CACHE_WORDS];
	struct hkv_cache_entry *e = lc->e ? way_for(lc, hash, 0) : NULL;

	if (e) /* a racing put of another key may be lost: harmless */
		write_entry(e, 1, 0, HKV_CACHE_WORDS, zero);
}
