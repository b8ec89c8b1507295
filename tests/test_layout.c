/*
 * test_layout.c - the region's formats, without a server (unit tier):
 *
 *   test_crc32c   the published check value; each implementation (the
 *                 SSE4.2 path: three streams joined by shift tables; slicing
 *                 by 8; the one hkv_crc32c picked by timing them) against the
 *                 bytewise table for every length 0..2100 at every start
 *                 offset 0..7, and chained calls.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/layout.h"
#include "tests/hkv_test.h"

HKV_TEST_MAIN_DEFS;

static void test_crc32c(void)
{
	static uint8_t buf[2200];
	int bad = 0;

	CHECK(hkv_crc32c(0, "123456789", 9) == 0xe3069283u); /* CRC-32C's check value */
	CHECK(hkv_crc32c_table(0, "123456789", 9) == 0xe3069283u);
	srand(7);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)rand();
	printf("# hkv_crc32c uses %s here\n", hkv_crc32c_impl());
	for (int impl = 1; impl <= 3; impl++)
		for (size_t off = 0; off < 8; off++)
			for (size_t len = 0; len + off <= 2100; len++) {
				uint32_t want = hkv_crc32c_table(0x1234u, buf + off, len);
				uint32_t got = impl == 3 ? hkv_crc32c(0x1234u, buf + off, len)
							 : hkv_crc32c_with(impl, 0x1234u, buf + off, len);

				if (got != want && bad++ < 5)
					fprintf(stderr, "crc32c (%d) differs: offset %zu, length %zu\n",
						impl, off, len);
			}
	CHECK(bad == 0);
	/* a CRC continued over a second piece is the CRC of the whole */
	CHECK(hkv_crc32c(hkv_crc32c(0, buf, 1000), buf + 1000, 1100) == hkv_crc32c(0, buf, 2100));
}

int main(void)
{
	RUN_TEST(test_crc32c);
	return hkv_test_finish();
}
