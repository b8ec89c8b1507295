/*
 * find_collision - find two printable keys whose whole 64-bit hatchkv key
 * hash (libsodium crypto_shorthash, SipHash-2-4) is equal under a given
 * 16-byte secret. Used once, offline, to make the colliding pairs that
 * tests/test_collisions.c uses with the test secret (the tests reach the
 * secret by re-keying their region: tests/support/rekey.c).
 *
 * Parallel collision search with distinguished points (van Oorschot and
 * Wiener): walk x -> H(key(x)) from random starts until a point whose low
 * DP_BITS bits are zero; two walks ending at one point merged somewhere:
 * walk them again in step from their starts to find where. About 2^33
 * hashes in all: a few minutes on two cores.
 *
 *   find_collision [SECRET_HEX32] [THREADS]   (default secret 000102...0f)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define DP_BITS 22
#define MAX_DP  (1u << 16)
#define MAX_WALK (1ull << (DP_BITS + 5))

static unsigned char secret[crypto_shorthash_KEYBYTES];

/* The key for point x: "c" and 16 lowercase hex digits (a memcached key). */
static void key_of(uint64_t x, char out[18])
{
	static const char hex[] = "0123456789abcdef";

	out[0] = 'c';
	for (int i = 0; i < 16; i++)
		out[1 + i] = hex[(x >> (60 - 4 * i)) & 15];
	out[17] = 0;
}

static uint64_t step(uint64_t x)
{
	char k[18];
	uint64_t h;

	key_of(x, k);
	crypto_shorthash((unsigned char *)&h, (const unsigned char *)k, 17, secret);
	return h;
}

struct dp {
	uint64_t start, end, len;
};

static struct dp dps[MAX_DP];
static unsigned ndp;
static int done;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Walk a from sa (la steps to the DP) and b from sb (lb steps) to the merge. */
static int resolve(uint64_t a, uint64_t la, uint64_t b, uint64_t lb)
{
	while (la > lb) {
		a = step(a);
		la--;
	}
	while (lb > la) {
		b = step(b);
		lb--;
	}
	if (a == b)
		return 0; /* one walk was inside the other: no collision */
	for (uint64_t i = 0; i < la; i++) {
		uint64_t na = step(a), nb = step(b);

		if (na == nb) {
			char ka[18], kb[18];

			key_of(a, ka);
			key_of(b, kb);
			printf("%s %s %016llx\n", ka, kb, (unsigned long long)na);
			fflush(stdout);
			return 1;
		}
		a = na;
		b = nb;
	}
	return 0;
}

static void *worker(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull ^ randombytes_random();

	while (!__atomic_load_n(&done, __ATOMIC_RELAXED)) {
		uint64_t start = seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t x = start, len = 0;

		while ((x & ((1ull << DP_BITS) - 1)) && len < MAX_WALK) {
			x = step(x);
			len++;
		}
		if (len >= MAX_WALK)
			continue; /* a cycle without a distinguished point */
		pthread_mutex_lock(&lock);
		for (unsigned i = 0; i < ndp; i++) {
			if (dps[i].end != x || dps[i].start == start)
				continue;
			struct dp d = dps[i];

			pthread_mutex_unlock(&lock);
			if (resolve(d.start, d.len, start, len))
				__atomic_store_n(&done, 1, __ATOMIC_RELAXED);
			pthread_mutex_lock(&lock);
			break;
		}
		if (ndp < MAX_DP)
			dps[ndp++] = (struct dp){start, x, len};
		pthread_mutex_unlock(&lock);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 2 ? atoi(argv[2]) : 2;
	pthread_t t[16];

	if (sodium_init() < 0)
		return 1;
	for (int i = 0; i < (int)sizeof(secret); i++)
		secret[i] = (unsigned char)i;
	if (argc > 1 && sodium_hex2bin(secret, sizeof(secret), argv[1], strlen(argv[1]), NULL,
				       NULL, NULL))
		return 2;
	if (nthreads < 1 || nthreads > 16)
		nthreads = 2;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	return 0;
}
