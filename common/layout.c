/* layout.c - geometry, size classes, hashing and block validation; see layout.h. */
#include "common/layout.h"

#include <errno.h>
#include <string.h>

#include <sodium.h>
#define XXH_INLINE_ALL /* the library's own code, inlined: no call per block */
#include <xxhash.h>

#include "hatchkv_err.h"

#define ALIGN_UP(x, a) (((x) + (a)-1) & ~((uint64_t)(a)-1))

/*
 * Each class `growth` thousandths of the one below, on the 64-byte block
 * grid, up to one block per segment. At 1250 (memcached's default factor):
 * 64, 128, 192, 256, 320, 448, 576, 768, 960, 1216, ...: <= 25 % of a block
 * lost to rounding, ~11 % on average. At 1125 (a store's default), ~6 %. Since
 * layout 3 a class costs one partly used segment for everyone (not one per
 * client), and a store moves live items to empty segments (server/slab.c),
 * so fine classes are cheap there. A factor that would need more than
 * HKV_NCLASSES_MAX classes grows until the table fits.
 */
static uint32_t build_classes(uint32_t *sizes, uint32_t max, uint32_t growth)
{
	for (;; growth += 10) {
		uint32_t n = 0;
		uint64_t s = HKV_BLOCK_ALIGN;

		for (; s <= max && n < HKV_NCLASSES_MAX;) {
			uint64_t next = ALIGN_UP(s * growth / 1000, HKV_BLOCK_ALIGN);

			sizes[n++] = (uint32_t)s;
			s = next > s + HKV_BLOCK_ALIGN ? next : s + HKV_BLOCK_ALIGN;
		}
		if (sizes[n - 1] == max)
			return n;
		if (n < HKV_NCLASSES_MAX) {
			sizes[n++] = max; /* one block per segment */
			return n;
		}
	}
}

uint32_t hkv_seg_size_for(uint64_t total)
{
	uint32_t seg = HKV_SEG_SIZE_DEFAULT;

	while (seg > (64u << 10) && total / seg < HKV_SEGS_MIN)
		seg >>= 1;
	return seg;
}

int hkv_geometry_init(struct hkv_geometry *g, uint64_t total, uint32_t seg_size,
		      uint64_t index_slots, uint32_t flags, uint32_t growth)
{
	uint64_t fixed, per_seg, nb = 1, avail;

	memset(g, 0, sizeof(*g));
	if (seg_size < (64u << 10) || (seg_size & (seg_size - 1)))
		return -EINVAL;
	if (!growth)
		growth = flags & HKV_GEOM_F_CACHE ? HKV_GROWTH_CACHE : HKV_GROWTH_STORE;
	if (growth <= 1000 || growth > 4000)
		return -EINVAL;
	if (!index_slots)
		index_slots = total / 256;
	while (nb * HKV_BUCKET_SLOTS < index_slots)
		nb <<= 1;
	if (nb < 2)
		nb = 2;
	g->magic = HKV_LAYOUT_MAGIC;
	g->version = HKV_LAYOUT_VERSION;
	g->flags = flags;
	g->total_size = total;
	g->seg_size = seg_size;
	g->nbuckets = nb;
	g->bitmap_bytes = (uint32_t)ALIGN_UP(seg_size / HKV_BLOCK_ALIGN / 8, 8);
	fixed = HKV_HEADER_SIZE + ALIGN_UP(nb * HKV_BUCKET_SIZE, 4096) + 3 * 4096 +
		HKV_NINTENTS * 8;
	per_seg = (uint64_t)seg_size + 8 + g->bitmap_bytes;
	if (total < fixed + per_seg)
		return -EINVAL;
	g->nsegs = (uint32_t)((total - fixed) / per_seg);
	for (;;) { /* alignment padding may cost a segment */
		g->seg_table_off = HKV_HEADER_SIZE;
		g->bitmap_off = ALIGN_UP(g->seg_table_off + (uint64_t)g->nsegs * 8, 4096);
		g->index_off = ALIGN_UP(g->bitmap_off + (uint64_t)g->nsegs * g->bitmap_bytes, 4096);
		g->data_off = ALIGN_UP(g->index_off + nb * HKV_BUCKET_SIZE, 4096);
		avail = g->data_off + (uint64_t)g->nsegs * seg_size + HKV_NINTENTS * 8;
		if (avail <= total || g->nsegs == 0)
			break;
		g->nsegs--;
	}
	if (!g->nsegs)
		return -EINVAL;
	g->intent_off = g->data_off + (uint64_t)g->nsegs * seg_size; /* (past the last segment) */
	g->nintents = HKV_NINTENTS;
	g->nclasses = build_classes(g->class_size, seg_size, growth);
	return 0;
}

static uint32_t geometry_sum(const struct hkv_geometry *g)
{
	uint64_t x = XXH64(g, offsetof(struct hkv_geometry, sum), 0);

	return (uint32_t)(x ^ x >> 32);
}

void hkv_geometry_seal(struct hkv_geometry *g)
{
	g->sum = geometry_sum(g);
}

/*
 * Every part 4 KiB aligned, in the order of the region map, not overlapping,
 * and inside total_size, computed without wrapping; the data area addressable
 * by a slot's 36-bit block offset.
 */
static int geometry_parts_fit(const struct hkv_geometry *g)
{
	typedef unsigned __int128 u128;
	u128 table_end = (u128)g->seg_table_off + (u128)g->nsegs * 8;
	u128 bitmap_end = (u128)g->bitmap_off + (u128)g->nsegs * g->bitmap_bytes;
	u128 index_end = (u128)g->index_off + (u128)g->nbuckets * HKV_BUCKET_SIZE;
	u128 data_end = (u128)g->data_off + (u128)g->nsegs * g->seg_size;

	u128 intent_end = (u128)g->intent_off + (u128)g->nintents * 8;

	if (g->intent_off ? (g->nintents & (g->nintents - 1)) || !g->nintents ||
				    g->intent_off % 8 || g->intent_off < data_end ||
				    intent_end > g->total_size
			  : g->nintents != 0)
		return 0; /* (intents: none in a region made before them) */
	return (g->seg_table_off | g->bitmap_off | g->index_off | g->data_off) % 4096 == 0 &&
	       g->seg_table_off >= HKV_HEADER_SIZE && table_end <= g->bitmap_off &&
	       bitmap_end <= g->index_off && index_end <= g->data_off &&
	       data_end <= g->total_size && (data_end / HKV_BLOCK_ALIGN) >> HKV_SLOT_OFF_BITS == 0;
}

int hkv_geometry_check(const struct hkv_geometry *g, uint64_t region_len)
{
	if (g->magic != HKV_LAYOUT_MAGIC)
		return HKV_ECORRUPT;
	if (g->sum != geometry_sum(g))
		return HKV_ECORRUPT;
	if (g->version != HKV_LAYOUT_VERSION)
		return HKV_EPROTO;
	/* two distinct buckets per key (hkv_buckets_of) need nbuckets >= 2 */
	if (g->total_size > region_len || !g->nsegs || g->nbuckets < 2 ||
	    (g->nbuckets & (g->nbuckets - 1)) || g->nclasses == 0 ||
	    g->nclasses > HKV_NCLASSES_MAX || g->seg_size < (64u << 10) ||
	    (g->seg_size & (g->seg_size - 1)) || g->bitmap_bytes % 8 ||
	    g->bitmap_bytes * 8ull < g->seg_size / HKV_BLOCK_ALIGN || !geometry_parts_fit(g))
		return HKV_ECORRUPT;
	for (uint32_t i = 0; i < g->nclasses; i++)
		if (g->class_size[i] % HKV_BLOCK_ALIGN || g->class_size[i] > g->seg_size ||
		    g->class_size[i] <= (i ? g->class_size[i - 1] : 0))
			return HKV_ECORRUPT;
	return 0;
}

int hkv_class_for(const struct hkv_geometry *g, uint32_t bytes)
{
	uint32_t lo = 0, hi = g->nclasses;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if (g->class_size[mid] < bytes)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < g->nclasses ? (int)lo : -1;
}

/* ---- hashing ------------------------------------------------------------------ */

uint64_t hkv_hash64(const void *key, size_t len)
{
	return XXH64(key, len, 0);
}

_Static_assert(crypto_shorthash_KEYBYTES == sizeof(((struct hkv_geometry *)0)->hash_key),
	       "hash_key is a SipHash key");
_Static_assert(crypto_shorthash_BYTES == 8, "a 64-bit key hash");

uint64_t hkv_key_hash(const struct hkv_geometry *g, const void *key, size_t len)
{
	uint64_t h;

	crypto_shorthash((unsigned char *)&h, key, len, g->hash_key);
	return h;
}

/* ---- blocks ----------------------------------------------------------------- */

/*
 * The block's sum: XXH64 (Debian's libxxhash, inlined) of what a reader must
 * see whole: the generation, vlen..exptime, wid and pred (the header less
 * meta's state, the sum itself and atime, which change under a live block),
 * then the key and the value, folded to 32 bits. As fast as the SSE4.2
 * crc32 instruction was on x86-64 (~70 ns a KiB), and plain 64-bit
 * multiplies, so ~12x faster than the crc32 instruction or its tables under
 * QEMU's TCG, where the Soft-RoCE tests run.
 */
uint32_t hkv_block_sum(const struct hkv_block_hdr *h, const void *kv)
{
	struct {
		uint32_t gen, vlen, flags;
		uint16_t klen, owner;
		uint32_t exptime, pad;
		uint64_t wid, pred;
	} in = {hkv_meta_gen(h->meta), h->vlen, h->flags, h->klen, h->owner, h->exptime, h->pad,
		h->wid, h->pred};
	uint64_t x = XXH64(kv, (size_t)h->klen + h->vlen, XXH64(&in, sizeof(in), 0));

	return (uint32_t)(x ^ x >> 32);
}

int hkv_block_check(const struct hkv_geometry *g, const void *blk, uint32_t avail,
		    const void *key, uint16_t klen)
{
	const struct hkv_block_hdr *h = blk;
	uint32_t cls;

	if (avail < HKV_BLOCK_HDR)
		return HKV_ECORRUPT; /* not even a header: read nothing */
	cls = hkv_meta_class(h->meta);
	if (hkv_meta_state(h->meta) == HKV_BLK_UNUSED || cls >= g->nclasses ||
	    h->klen == 0 || h->klen > HKV_MAX_KEY ||
	    (uint64_t)HKV_BLOCK_HDR + h->klen + h->vlen > avail ||
	    (uint64_t)HKV_BLOCK_HDR + h->klen + h->vlen > g->class_size[cls])
		return HKV_ECORRUPT;
	if (h->sum != hkv_block_sum(h, (const uint8_t *)blk + HKV_BLOCK_HDR))
		return HKV_ECORRUPT;
	if (h->klen != klen || memcmp((const uint8_t *)blk + HKV_BLOCK_HDR, key, klen))
		return HKV_ENOTFOUND;
	return 0;
}
