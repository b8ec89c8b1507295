/*
 * test_layout.c - the region's formats, without a server (unit tier):
 *
 *   test_block_sum   a sealed block checks; one byte changed anywhere the
 *                    sum covers (gen, lengths, flags, owner, exptime, pad,
 *                    wid, pred, key, value) is caught, one changed where it
 *                    must not look (meta's state/retirer bits, the
 *                    atime|freq word that readers CAS) is not; a block torn at any 64-byte
 *                    line between two whole versions is caught; the sum is
 *                    the XXH64 that clients and servers of other builds use.
 *   test_geometry    a sealed geometry checks; one byte changed is caught.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/layout.h"
#include "hatchkv_err.h"
#include "tests/hkv_test.h"

HKV_TEST_MAIN_DEFS;

#define BLK 1088 /* a 1 KiB-class block: header, a 23-byte key, 1000 bytes of value */

static struct hkv_geometry geo;

static void make_block(uint8_t *blk, uint32_t gen, uint64_t wid, uint8_t fill)
{
	struct hkv_block_hdr *h = (struct hkv_block_hdr *)blk;
	int cls = hkv_class_for(&geo, BLK);

	memset(blk, 0, BLK);
	h->meta = hkv_meta_make(HKV_BLK_LIVE, (uint32_t)cls, gen);
	h->vlen = 1000;
	h->flags = 0xf1a9;
	h->klen = 23;
	h->owner = 7;
	h->exptime = 1900000000u;
	h->atime = 12345;
	h->wid = wid;
	h->pred = wid - 1;
	memcpy(blk + HKV_BLOCK_HDR, "user:000000000000000042", 23);
	memset(blk + HKV_BLOCK_HDR + 23, fill, 1000);
	h->sum = hkv_block_sum(h, blk + HKV_BLOCK_HDR);
}

static int check(const uint8_t *blk)
{
	return hkv_block_check(&geo, blk, BLK, "user:000000000000000042", 23);
}

static void test_block_sum(void)
{
	static uint8_t blk[BLK], v2[BLK], torn[BLK];
	size_t end = HKV_BLOCK_HDR + 23 + 1000;
	int missed = 0, cuts = 0;

	CHECK_RC(hkv_geometry_init(&geo, 64ull << 20, 1u << 20, 1u << 16, 0, HKV_GROWTH_STORE), 0);
	CHECK(hkv_class_for(&geo, BLK) >= 0);
	make_block(blk, 9, 1000, 'a');
	CHECK_RC(check(blk), 0);
	/* every covered byte: bytes 4..7 (gen), 12..47, the key and value */
	for (size_t i = 4; i < end; i++) {
		int covered = (i >= 4 && i < 8) || (i >= 12 && i < 48) || i >= HKV_BLOCK_HDR;

		if (!covered)
			continue;
		blk[i] ^= 0x20;
		if (check(blk) != HKV_ECORRUPT && missed++ < 5)
			fprintf(stderr, "byte %zu changed, block still checks\n", i);
		blk[i] ^= 0x20;
	}
	CHECK(missed == 0);
	/* what changes under a live block: atime|freq (readers' CAS), meta's low word */
	blk[48] ^= 0xff;
	blk[55] ^= 0x01;
	CHECK_RC(check(blk), 0);
	((struct hkv_block_hdr *)blk)->meta |= HKV_META_ABORTED | hkv_meta_retirer(99);
	CHECK_RC(check(blk), 0);
	/* torn: the first k lines of one version, the rest of the next (same
	 * key and lengths, a new value and write id; the same generation, as
	 * a block rewritten in place would have) */
	make_block(blk, 9, 1000, 'a');
	make_block(v2, 9, 1001, 'b');
	for (size_t k = 64; k < end; k += 64) {
		memcpy(torn, blk, k);
		memcpy(torn + k, v2 + k, BLK - k);
		cuts++;
		if (check(torn) != HKV_ECORRUPT && missed++ < 5)
			fprintf(stderr, "torn at %zu, block still checks\n", k);
	}
	CHECK(missed == 0 && cuts == 16);
	/* the sum is XXH64's (the published value for no input, seed 0), so
	 * every build agrees on it */
	CHECK(hkv_hash64("", 0) == 0xef46db3751d8e999ull);
	printf("# block sum: %d one-byte changes and %d torn cuts caught\n",
	       (int)(4 + 36 + (end - HKV_BLOCK_HDR)), cuts);
}

static void test_geometry(void)
{
	struct hkv_geometry g;
	uint8_t *p = (uint8_t *)&g;
	int missed = 0;

	CHECK_RC(hkv_geometry_init(&g, 64ull << 20, 1u << 20, 1u << 16, 0, HKV_GROWTH_CACHE), 0);
	hkv_geometry_seal(&g);
	CHECK_RC(hkv_geometry_check(&g, 64ull << 20), 0);
	for (size_t i = 0; i < offsetof(struct hkv_geometry, sum); i++) {
		p[i] ^= 0x04;
		missed += hkv_geometry_check(&g, 64ull << 20) == 0;
		p[i] ^= 0x04;
	}
	CHECK(missed == 0);
}

/* The default segment size keeps >= 32 segments down to 64 KiB, and every
 * size it picks lays out a region that holds at least one segment per
 * class a value of 100 B - 8 KB may need. */
static void test_seg_size_for(void)
{
	static const struct {
		uint64_t total;
		uint32_t seg;
	} want[] = {{1ull << 30, 1u << 20}, {64ull << 20, 1u << 20}, {32ull << 20, 1u << 20},
		    {16ull << 20, 512u << 10}, {8ull << 20, 256u << 10},
		    {2ull << 20, 64u << 10},   {1ull << 20, 64u << 10}};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct hkv_geometry g;
		uint32_t seg = hkv_seg_size_for(want[i].total);

		CHECK(seg == want[i].seg);
		if (want[i].total < (4ull << 20))
			continue;
		CHECK_RC(hkv_geometry_init(&g, want[i].total, seg, 0, HKV_GEOM_F_CACHE,
					   HKV_GROWTH_CACHE), 0);
		CHECK(g.nsegs >= 24 && g.nsegs >= (uint32_t)(hkv_class_for(&g, 8192 + 64) -
							     hkv_class_for(&g, 100 + 64)));
	}
}

int main(void)
{
	RUN_TEST(test_block_sum);
	RUN_TEST(test_geometry);
	RUN_TEST(test_seg_size_for);
	return hkv_test_finish();
}
