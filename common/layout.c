/* layout.c - geometry, size classes, hashing and block validation; see layout.h. */
#include "common/layout.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <sodium.h>

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
	fixed = HKV_HEADER_SIZE + ALIGN_UP(nb * HKV_BUCKET_SIZE, 4096) + 3 * 4096;
	per_seg = (uint64_t)seg_size + 8 + g->bitmap_bytes;
	if (total < fixed + per_seg)
		return -EINVAL;
	g->nsegs = (uint32_t)((total - fixed) / per_seg);
	for (;;) { /* alignment padding may cost a segment */
		g->seg_table_off = HKV_HEADER_SIZE;
		g->bitmap_off = ALIGN_UP(g->seg_table_off + (uint64_t)g->nsegs * 8, 4096);
		g->index_off = ALIGN_UP(g->bitmap_off + (uint64_t)g->nsegs * g->bitmap_bytes, 4096);
		g->data_off = ALIGN_UP(g->index_off + nb * HKV_BUCKET_SIZE, 4096);
		avail = g->data_off + (uint64_t)g->nsegs * seg_size;
		if (avail <= total || g->nsegs == 0)
			break;
		g->nsegs--;
	}
	if (!g->nsegs)
		return -EINVAL;
	g->nclasses = build_classes(g->class_size, seg_size, growth);
	return 0;
}

void hkv_geometry_seal(struct hkv_geometry *g)
{
	g->crc = hkv_crc32c(0, g, offsetof(struct hkv_geometry, crc));
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

	return (g->seg_table_off | g->bitmap_off | g->index_off | g->data_off) % 4096 == 0 &&
	       g->seg_table_off >= HKV_HEADER_SIZE && table_end <= g->bitmap_off &&
	       bitmap_end <= g->index_off && index_end <= g->data_off &&
	       data_end <= g->total_size && (data_end / HKV_BLOCK_ALIGN) >> HKV_SLOT_OFF_BITS == 0;
}

int hkv_geometry_check(const struct hkv_geometry *g, uint64_t region_len)
{
	if (g->magic != HKV_LAYOUT_MAGIC)
		return HKV_ECORRUPT;
	if (g->crc != hkv_crc32c(0, g, offsetof(struct hkv_geometry, crc)))
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

static inline uint64_t mix64(uint64_t a, uint64_t b)
{
	__uint128_t r = (__uint128_t)a * b;

	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

uint64_t hkv_hash64(const void *key, size_t len)
{
	const uint8_t *p = key;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (len * 0xff51afd7ed558ccdull), w;

	for (; len >= 8; p += 8, len -= 8) {
		memcpy(&w, p, 8);
		h = mix64(h ^ w, 0xc4ceb9fe1a85ec53ull);
	}
	w = 0;
	memcpy(&w, p, len);
	h = mix64(h ^ w ^ (uint64_t)len << 56, 0xd6e8feb86659fd93ull);
	return mix64(h, 0x94d049bb133111ebull) ^ h;
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

/* CRC32C: SSE4.2 instruction when present, else a table. */
static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] =
				(crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t crc_soft(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len--)
		crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
	return crc;
}

/*
 * SSE4.2's crc32 instruction has a latency of 3 cycles and a throughput of
 * one per cycle, so one chain of them runs at a third of its speed: long
 * buffers are cut into three streams of CRC_STREAM bytes run side by side,
 * and their registers joined by shifting each over the bytes after it
 * (crc_shift1/2: the register times x^(8 * CRC_STREAM) and x^(16 *
 * CRC_STREAM) modulo the polynomial, by four table lookups).
 */
#define CRC_STREAM 128
static uint32_t crc_shift1[4][256], crc_shift2[4][256];

/* The register after n zero bytes, from register c (the CRC's linear part). */
static uint32_t crc_zeros(uint32_t c, size_t n)
{
	while (n--)
		c = (c >> 8) ^ crc_table[0][c & 0xff];
	return c;
}

static void crc_shift_init(uint32_t t[4][256], size_t n)
{
	uint32_t col[32];

	for (int b = 0; b < 32; b++)
		col[b] = crc_zeros(1u << b, n);
	for (int j = 0; j < 4; j++)
		for (uint32_t v = 0; v < 256; v++) {
			uint32_t x = 0;

			for (int b = 0; b < 8; b++)
				if (v >> b & 1)
					x ^= col[8 * j + b];
			t[j][v] = x;
		}
}

static inline uint32_t crc_shift(const uint32_t t[4][256], uint32_t c)
{
	return t[0][c & 0xff] ^ t[1][c >> 8 & 0xff] ^ t[2][c >> 16 & 0xff] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
							  size_t len)
{
	uint64_t c = crc, w;

	for (; len >= 3 * CRC_STREAM; p += 3 * CRC_STREAM, len -= 3 * CRC_STREAM) {
		uint64_t c1 = 0, c2 = 0, w1, w2;

		for (size_t i = 0; i < CRC_STREAM; i += 8) {
			memcpy(&w, p + i, 8);
			memcpy(&w1, p + CRC_STREAM + i, 8);
			memcpy(&w2, p + 2 * CRC_STREAM + i, 8);
			c = __builtin_ia32_crc32di(c, w);
			c1 = __builtin_ia32_crc32di(c1, w1);
			c2 = __builtin_ia32_crc32di(c2, w2);
		}
		c = crc_shift(crc_shift2, (uint32_t)c) ^ crc_shift(crc_shift1, (uint32_t)c1) ^
		    (uint32_t)c2;
	}
	for (; len >= 8; p += 8, len -= 8) {
		memcpy(&w, p, 8);
		c = __builtin_ia32_crc32di(c, w);
	}
	crc = (uint32_t)c;
	while (len--)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	return crc;
}

/* Slicing by 8: eight table lookups per 8 bytes, no carried dependency
 * between them but the register (little-endian loads). */
static uint32_t crc_slice8(uint32_t crc, const uint8_t *p, size_t len)
{
	for (; len >= 8; p += 8, len -= 8) {
		uint32_t lo, hi;

		memcpy(&lo, p, 4);
		memcpy(&hi, p + 4, 4);
		lo ^= crc;
		crc = crc_table[7][lo & 0xff] ^ crc_table[6][lo >> 8 & 0xff] ^
		      crc_table[5][lo >> 16 & 0xff] ^ crc_table[4][lo >> 24] ^
		      crc_table[3][hi & 0xff] ^ crc_table[2][hi >> 8 & 0xff] ^
		      crc_table[1][hi >> 16 & 0xff] ^ crc_table[0][hi >> 24];
	}
	return crc_soft(crc, p, len);
}

static int crc_use_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/*
 * Which is faster here, the instruction or the tables? On any real x86-64
 * the instruction, by 5-10x; but an emulator (QEMU's TCG, where the
 * Soft-RoCE tests run) computes each crc32 instruction bit by bit, and
 * there the tables win. Timed once, over 4 KiB, best of 5 each.
 */
static uint64_t crc_time_ns(int hw)
{
	static uint8_t buf[4096];
	uint64_t best = UINT64_MAX;
	volatile uint32_t sink = 0;

	for (int r = 0; r < 5; r++) {
		struct timespec a, b;
		uint64_t ns;

		clock_gettime(CLOCK_MONOTONIC, &a);
		sink ^= hw ? crc_hw(~0u, buf, sizeof(buf)) : crc_slice8(~0u, buf, sizeof(buf));
		clock_gettime(CLOCK_MONOTONIC, &b);
		ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec -
		     (uint64_t)a.tv_nsec;
		best = ns < best ? ns : best;
	}
	(void)sink;
	return best;
}

static void crc_init(void)
{
	__builtin_cpu_init();
	crc_table_init();
	if (__builtin_cpu_supports("sse4.2")) {
		crc_shift_init(crc_shift1, CRC_STREAM);
		crc_shift_init(crc_shift2, 2 * CRC_STREAM);
		crc_use_hw = crc_time_ns(1) <= crc_time_ns(0);
	}
}

const char *hkv_crc32c_impl(void)
{
	pthread_once(&crc_once, crc_init);
	return crc_use_hw ? "sse4.2" : "slice8";
}

uint32_t hkv_crc32c_with(int impl, uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	if (impl == 2 && !__builtin_cpu_supports("sse4.2"))
		impl = 1;
	crc = ~crc;
	crc = impl == 2 ? crc_hw(crc, buf, len) : impl == 1 ? crc_slice8(crc, buf, len)
							  : crc_soft(crc, buf, len);
	return ~crc;
}

uint32_t hkv_crc32c_table(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_soft(~crc, buf, len);
}

uint32_t hkv_crc32c(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	crc = crc_use_hw ? crc_hw(crc, buf, len) : crc_slice8(crc, buf, len);
	return ~crc;
}

/* ---- blocks ----------------------------------------------------------------- */

uint32_t hkv_block_crc(const struct hkv_block_hdr *h, const void *kv)
{
	uint32_t gen = hkv_meta_gen(h->meta);
	uint32_t crc = hkv_crc32c(0, &gen, 4);

	crc = hkv_crc32c(crc, &h->vlen, 16); /* vlen, flags, klen, owner, exptime */
	crc = hkv_crc32c(crc, &h->wid, 16); /* wid, pred */
	return hkv_crc32c(crc, kv, (size_t)h->klen + h->vlen);
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
	if (h->crc != hkv_block_crc(h, (const uint8_t *)blk + HKV_BLOCK_HDR))
		return HKV_ECORRUPT;
	if (h->klen != klen || memcmp((const uint8_t *)blk + HKV_BLOCK_HDR, key, klen))
		return HKV_ENOTFOUND;
	return 0;
}
