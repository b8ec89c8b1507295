/*
 * rekey.h - tests only: give a stopped server's region file the key-hash
 * secret a test chose (the secret is random per region and only
 * authenticated clients can read it; a test that must build colliding keys
 * reaches it this way, before any key is stored).
 */
#ifndef HKV_TEST_REKEY_H
#define HKV_TEST_REKEY_H

#include <stdint.h>

/* Set hash_key in the header of the region file at path (its header must
 * validate) and re-seal it. 0 or -errno / HKV_E*. */
int hkv_test_rekey(const char *path, const uint8_t key[16]);

/* The secret the colliding pairs in tests/test_collisions.c were found
 * under (tests/support/find_collision.c): bytes 00 01 02 ... 0f. */
extern const uint8_t hkv_test_secret[16];

#endif
