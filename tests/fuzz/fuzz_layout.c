/*
 * fuzz_layout.c - libFuzzer target: the decoders of remote memory
 * (common/layout.c, client/client_int.h) on garbage, the way a client meets
 * a region written by a buggy or hostile peer.
 *
 * Input (read front to back; missing bytes read as 0):
 *
 *   mode u8   bit 0: raw header bytes, else one built by hkv_geometry_init
 *                    from fuzzed sizes and then patched field by field
 *             bit 1: keep the header's sum as given (else it is resealed,
 *                    so the checks behind the sum are reached)
 *             bit 2: copy the key into the block, bit 3: seal its sum
 *   header    raw: sizeof(struct hkv_geometry) bytes, then region_len u64;
 *             built: total u64, seg shift u8, index slots u64, patch count
 *             u8, patches (field u8, value u64)
 *   probes    4 hashes, 4 slots, 4 (off, len) pairs, a class request
 *   block     avail u16, klen u8, key bytes, then the block's bytes
 *
 * Aborts when a header that passes hkv_geometry_check has parts that stray
 * outside total_size or the region, overlap, or are misaligned for the
 * atomics on them; when buckets, classes or slot ranges derived from such a
 * header leave their area; when hkv_geometry_init's own output fails the
 * check; or when hkv_block_check accepts a block whose lengths, class, sum
 * or key do not hold. The block sits in an exact-size heap buffer of
 * `avail` bytes, so any read beyond what the caller said is there is an
 * ASan report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"
#include "common/layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                         \
	do {                                                                              \
		if (!(c)) {                                                               \
			fprintf(stderr, "fuzz_layout: invariant broken: %s (line %d)\n", #c, \
				__LINE__);                                                \
			abort();                                                          \
		}                                                                         \
	} while (0)

struct input {
	const uint8_t *p;
	size_t left;
};

static void take(struct input *in, void *out, size_t n)
{
	size_t k = n < in->left ? n : in->left;

	memset(out, 0, n);
	memcpy(out, in->p, k);
	in->p += k;
	in->left -= k;
}

static uint64_t take_u64(struct input *in)
{
	uint64_t v;

	take(in, &v, sizeof(v));
	return v;
}

static uint8_t take_u8(struct input *in)
{
	uint8_t v;

	take(in, &v, 1);
	return v;
}

/* Overwrite one field of g (by number) with v, truncated to its width. */
static void patch(struct hkv_geometry *g, uint8_t field, uint64_t v)
{
	uint64_t *u64s[] = {&g->total_size, &g->seg_table_off, &g->bitmap_off,
			    &g->index_off,  &g->data_off,      &g->nbuckets};
	uint32_t *u32s[] = {&g->nsegs, &g->seg_size, &g->bitmap_bytes, &g->nclasses,
			    &g->version};

	if (field < 6)
		*u64s[field] = v;
	else if (field < 11)
		*u32s[field - 6] = (uint32_t)v;
	else
		g->class_size[(field - 11) % HKV_NCLASSES_MAX] = (uint32_t)v;
}

typedef unsigned __int128 u128;

/* Everything a client relies on in a header that passed the check. */
static void check_geometry(const struct hkv_geometry *g, uint64_t region_len)
{
	u128 table_end = (u128)g->seg_table_off + (u128)g->nsegs * 8;
	u128 bitmap_end = (u128)g->bitmap_off + (u128)g->nsegs * g->bitmap_bytes;
	u128 index_end = (u128)g->index_off + (u128)g->nbuckets * HKV_BUCKET_SIZE;
	u128 data_end = (u128)g->data_off + (u128)g->nsegs * g->seg_size;

	ASSERT(g->total_size <= region_len);
	ASSERT(g->seg_table_off >= HKV_HEADER_SIZE && table_end <= g->bitmap_off);
	ASSERT(bitmap_end <= g->index_off && index_end <= g->data_off);
	ASSERT(data_end <= g->total_size && data_end / HKV_BLOCK_ALIGN >> HKV_SLOT_OFF_BITS == 0);
	/* CAS/FAA words need 8-byte alignment, blocks 64 */
	ASSERT(g->seg_table_off % 8 == 0 && g->bitmap_off % 8 == 0 && g->bitmap_bytes % 8 == 0);
	ASSERT(g->index_off % 8 == 0 && g->data_off % HKV_BLOCK_ALIGN == 0);
	ASSERT(g->seg_size % HKV_BLOCK_ALIGN == 0 && g->nsegs > 0);
	ASSERT(g->nbuckets >= 2 && (g->nbuckets & (g->nbuckets - 1)) == 0);
	ASSERT((u128)g->bitmap_bytes * 8 >= g->seg_size / HKV_BLOCK_ALIGN);
	ASSERT(g->nclasses >= 1 && g->nclasses <= HKV_NCLASSES_MAX);
	for (uint32_t i = 0; i < g->nclasses; i++) {
		ASSERT(g->class_size[i] >= HKV_BLOCK_ALIGN && g->class_size[i] % HKV_BLOCK_ALIGN == 0);
		ASSERT(g->class_size[i] <= g->seg_size);
		ASSERT(i == 0 || g->class_size[i] > g->class_size[i - 1]);
	}
}

static void probe_buckets(const struct hkv_geometry *g, uint64_t h)
{
	uint64_t b1, b2;

	hkv_buckets_of(g, h, &b1, &b2);
	ASSERT(b1 < g->nbuckets && b2 < g->nbuckets && b1 != b2);
	ASSERT((u128)g->index_off + (u128)(b2 + 1) * HKV_BUCKET_SIZE <= g->data_off);
	ASSERT((u128)g->index_off + (u128)(b1 + 1) * HKV_BUCKET_SIZE <= g->data_off);
}

/* A range hkv_block_range_ok accepts is a 64-aligned run inside one segment. */
static void probe_range(const struct hkv_geometry *g, uint64_t off, uint64_t len)
{
	u128 data_end = (u128)g->data_off + (u128)g->nsegs * g->seg_size;

	if (!hkv_block_range_ok(g, off, len))
		return;
	ASSERT(off >= g->data_off && off % HKV_BLOCK_ALIGN == 0);
	ASSERT((u128)off + len <= data_end && (u128)off + len <= g->total_size);
	ASSERT(len == 0 || (off - g->data_off) / g->seg_size ==
				   (off + len - 1 - g->data_off) / g->seg_size);
}

/* What a client does with an index slot read from remote memory. */
static void probe_slot(const struct hkv_geometry *g, uint64_t s)
{
	uint32_t cls = hkv_slot_class(s);

	if (cls < g->nclasses)
		probe_range(g, hkv_slot_off(s), g->class_size[cls]);
	ASSERT(hkv_slot_off(s) % HKV_BLOCK_ALIGN == 0);
}

static void probe_class(const struct hkv_geometry *g, uint32_t bytes)
{
	int cls = hkv_class_for(g, bytes);

	if (cls < 0) {
		ASSERT(g->class_size[g->nclasses - 1] < bytes);
		return;
	}
	ASSERT((uint32_t)cls < g->nclasses && g->class_size[cls] >= bytes);
	ASSERT(cls == 0 || g->class_size[cls - 1] < bytes);
}

static void probe_block(const struct hkv_geometry *g, struct input *in, uint8_t mode)
{
	uint16_t avail;
	uint8_t klen = take_u8(in), key[256], *blk;
	struct hkv_block_hdr h;
	int ret;

	take(in, &avail, sizeof(avail));
	take(in, key, klen);
	blk = malloc(avail ? avail : 1);
	if (!blk)
		return;
	take(in, blk, avail);
	if ((mode & 4) && avail >= HKV_BLOCK_HDR) {
		memcpy(&h, blk, sizeof(h));
		h.klen = klen;
		memcpy(blk, &h, sizeof(h));
		memcpy(blk + HKV_BLOCK_HDR, key,
		       klen < avail - HKV_BLOCK_HDR ? klen : avail - HKV_BLOCK_HDR);
	}
	if ((mode & 8) && avail >= HKV_BLOCK_HDR) {
		memcpy(&h, blk, sizeof(h));
		if ((uint64_t)HKV_BLOCK_HDR + h.klen + h.vlen <= avail) {
			h.sum = hkv_block_sum(&h, blk + HKV_BLOCK_HDR);
			memcpy(blk, &h, sizeof(h));
		}
	}
	ret = hkv_block_check(g, blk, avail, key, klen);
	ASSERT(ret == 0 || ret == HKV_ENOTFOUND || ret == HKV_ECORRUPT);
	if (ret != HKV_ECORRUPT) {
		uint32_t cls;

		ASSERT(avail >= HKV_BLOCK_HDR);
		memcpy(&h, blk, sizeof(h));
		cls = hkv_meta_class(h.meta);
		ASSERT(hkv_meta_state(h.meta) != HKV_BLK_UNUSED && cls < g->nclasses);
		ASSERT(h.klen >= 1 && h.klen <= HKV_MAX_KEY);
		ASSERT((uint64_t)HKV_BLOCK_HDR + h.klen + h.vlen <= avail);
		ASSERT((uint64_t)HKV_BLOCK_HDR + h.klen + h.vlen <= g->class_size[cls]);
		ASSERT(h.sum == hkv_block_sum(&h, blk + HKV_BLOCK_HDR));
		if (ret == 0)
			ASSERT(h.klen == klen && !memcmp(blk + HKV_BLOCK_HDR, key, klen));
		else
			ASSERT(h.klen != klen || memcmp(blk + HKV_BLOCK_HDR, key, klen));
	}
	free(blk);
}

/* A header from init and fuzzed patches; 1 if it is init's output untouched. */
static int build_header(struct input *in, struct hkv_geometry *g, uint64_t *region_len)
{
	uint64_t total = take_u64(in) % (1ull << 42);
	uint32_t seg = 1u << (16 + take_u8(in) % 12);
	uint64_t slots = take_u64(in) % (1ull << 30);
	uint8_t npatch = take_u8(in) % 8;

	if (hkv_geometry_init(g, total, seg, slots, 0, 0))
		return -1;
	hkv_geometry_seal(g);
	*region_len = total;
	for (uint8_t i = 0; i < npatch; i++) {
		uint8_t field = take_u8(in);

		patch(g, field, take_u64(in));
	}
	return npatch == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = {data, size};
	uint8_t mode = take_u8(&in);
	struct hkv_geometry g;
	uint64_t region_len = 0, probes[12];
	uint32_t bytes;
	int pristine = 0, ret;

	if (mode & 1) {
		take(&in, &g, sizeof(g));
		region_len = take_u64(&in);
	} else if ((pristine = build_header(&in, &g, &region_len)) < 0) {
		return 0;
	}
	if (!(mode & 2))
		hkv_geometry_seal(&g);
	ret = hkv_geometry_check(&g, region_len);
	ASSERT(ret == 0 || ret == HKV_ECORRUPT || ret == HKV_EPROTO);
	if (pristine)
		ASSERT(ret == 0); /* the server's own layout must pass the client's check */
	if (ret)
		return 0;
	check_geometry(&g, region_len);
	take(&in, probes, sizeof(probes));
	take(&in, &bytes, sizeof(bytes));
	for (int i = 0; i < 4; i++) {
		probe_buckets(&g, probes[i]);
		probe_slot(&g, probes[4 + i]);
	}
	/* offsets a slot can name (36 bits x 64): hkv_block_range_ok's off + len
	 * wraps for offsets near 2^64, which no caller passes */
	probe_range(&g, probes[8] % (1ull << 42), probes[9]);
	probe_range(&g, probes[10] % (1ull << 42), probes[11] % (2ull * g.seg_size));
	probe_class(&g, bytes);
	probe_block(&g, &in, mode);
	return 0;
}
