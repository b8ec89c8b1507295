/*
 * test_collisions.c - keys whose hashes collide never touch each other's
 * items (issue 11, item 1), against a real hatchkv-server:
 *
 *   test_collisions shm     (unit tier)
 *   test_collisions verbs   (rdma tier, Soft-RoCE guest)
 *
 * The key hash is SipHash-2-4 keyed with a per-region secret that only
 * authenticated clients read. A test may reach the secret: the server's
 * region file is given the test secret (tests/support/rekey.h) before any
 * key is stored, and the pairs below were found under it with
 * tests/support/find_collision.c (a parallel collision search, ~2^33
 * hashes): each pair has the same whole 64-bit hash, so the same buckets,
 * the same slot fingerprint and the same location-cache entry.
 *
 * What a user would check: every operation on one key of a pair (set, add,
 * replace, cas, incr/decr, append/prepend, touch, delete, get), through
 * handles sharing one location cache and through handles that do not,
 * leaves the other key exactly as it was; and, for hash flooding, keys an
 * attacker aims at one victim's 32 candidate slots fill them only when the
 * attacker knows the secret.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_int.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/rekey.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;

/* Full 64-bit collisions under hkv_test_secret (find_collision output). */
static const char *const pairs[][2] = {
	{"ce5c1eedf490ca315", "c596d0db041d313cf"},
	{"c2c522ae6f4a96da5", "c8090d41a9baa88ec"},
};
#define NPAIRS ((int)(sizeof(pairs) / sizeof(pairs[0])))

/* A server whose region has the test secret: start it on a region file,
 * kill it, re-key the file, start it again warm (nothing stored yet). */
static int start_rekeyed(struct hkvserver *s, const char *const *mode)
{
	static char path[300];
	const char *extra[8] = {"--memory-file", path, "--index-slots", "1024"};
	int n = 4, ret;

	for (int i = 0; mode && mode[i] && n < 7; i++)
		extra[n++] = mode[i];
	extra[n] = NULL;
	snprintf(path, sizeof(path), "/tmp/hkv-coll-%d.region", (int)getpid());
	hkv_test_unlink_region(path);
	if ((ret = hkvserver_start(s, use_verbs, "16M", "64K", extra)))
		return ret;
	hkvserver_kill(s);
	if ((ret = hkv_test_rekey(path, hkv_test_secret)))
		return ret;
	return hkvserver_restart(s, "16M", "64K", extra);
}

static void stop_rekeyed(struct hkvserver *s)
{
	char path[300];

	snprintf(path, sizeof(path), "/tmp/hkv-coll-%d.region", (int)getpid());
	hkvserver_stop(s);
	hkv_test_unlink_region(path);
}

/* Every handle reads key as want (NULL: absent). */
static int all_read(struct hkv_client **h, int nh, const char *key, const char *want)
{
	char buf[128];

	for (int i = 0; i < nh; i++) {
		int ret = get_str(h[i], key, buf, sizeof(buf), NULL);

		if (want ? ret != 0 || strcmp(buf, want) : ret != HKV_ENOTFOUND) {
			fprintf(stderr, "handle %d: get(%s) = %d '%s', wanted %s\n", i, key, ret,
				ret ? "" : buf, want ? want : "absent");
			return 0;
		}
	}
	return 1;
}

static void test_pairs_collide(void)
{
	struct hkvserver s;
	struct hkv_client *c;

	CHECK(start_rekeyed(&s, NULL) == 0);
	c = hkvserver_client(&s);
	for (int p = 0; p < NPAIRS; p++) {
		uint64_t a = hkv_key_hash(&c->g, pairs[p][0], strlen(pairs[p][0]));
		uint64_t b = hkv_key_hash(&c->g, pairs[p][1], strlen(pairs[p][1]));

		printf("# %s %s: %016llx %016llx\n", pairs[p][0], pairs[p][1],
		       (unsigned long long)a, (unsigned long long)b);
		CHECK(a == b && strcmp(pairs[p][0], pairs[p][1]));
	}
	hkv_close(c);
	stop_rekeyed(&s);
}

/* One pair (a, b) through handles h[0..2]: h[0], h[1] share a location cache
 * (as hatchkv-memcached's workers do), h[2] has its own. */
static void pair_ops(struct hkv_client **h, const char *a, const char *b)
{
	struct hkv_item_info ia, ib;
	char buf[128];
	uint64_t n;

	/* a stored, b never: nothing done to b reaches a */
	CHECK_RC(set_str(h[0], a, "a-first"), 0);
	CHECK(all_read(h, 3, a, "a-first"));
	CHECK(all_read(h, 3, b, NULL));
	CHECK_RC(hkv_delete(h[1], b, strlen(b)), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(h[0], b, strlen(b), "x", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(get_str(h[0], a, buf, sizeof(buf), &ia), 0);
	CHECK_RC(hkv_cas(h[1], b, strlen(b), "x", 1, ia.version, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_append(h[0], b, strlen(b), "x", 1, 0), HKV_ENOTFOUND);
	CHECK_RC(hkv_append(h[1], b, strlen(b), "x", 1, 1), HKV_ENOTFOUND);
	CHECK_RC(hkv_touch(h[0], b, strlen(b), 100), HKV_ENOTFOUND);
	CHECK(all_read(h, 3, a, "a-first"));
	CHECK_RC(set_str(h[2], a, "7"), 0);
	CHECK_RC(hkv_incr(h[0], b, strlen(b), 1, &n), HKV_ENOTFOUND);
	CHECK_RC(hkv_decr(h[1], b, strlen(b), 1, &n), HKV_ENOTFOUND);
	CHECK(all_read(h, 3, a, "7"));
	CHECK(all_read(h, 3, b, NULL));

	/* both stored: each keeps its own */
	CHECK_RC(hkv_add(h[1], b, strlen(b), "b-first", 7, NULL), 0);
	CHECK(all_read(h, 3, a, "7"));
	CHECK(all_read(h, 3, b, "b-first"));
	CHECK_RC(hkv_add(h[0], a, strlen(a), "x", 1, NULL), HKV_EEXISTS);
	CHECK_RC(hkv_add(h[2], b, strlen(b), "x", 1, NULL), HKV_EEXISTS);
	for (int i = 0; i < 60; i++) { /* warm updates from every handle, interleaved */
		char va[32], vb[32];

		snprintf(va, sizeof(va), "a-%d", i);
		snprintf(vb, sizeof(vb), "b-%d", i);
		CHECK_RC(set_str(h[i % 3], a, va), 0);
		CHECK_RC(set_str(h[(i + 1) % 3], b, vb), 0);
		if (i % 10 == 9) {
			CHECK(all_read(h, 3, a, va));
			CHECK(all_read(h, 3, b, vb));
		}
	}
	CHECK_RC(hkv_replace(h[2], a, strlen(a), "100", 3, NULL), 0);
	CHECK_RC(hkv_replace(h[0], b, strlen(b), "200", 3, NULL), 0);
	for (int i = 0; i < 30; i++) {
		CHECK_RC(hkv_incr(h[i % 3], a, strlen(a), 1, &n), 0);
		CHECK(n == 101 + (uint64_t)i);
		CHECK_RC(hkv_incr(h[(i + 2) % 3], b, strlen(b), 2, &n), 0);
		CHECK(n == 202 + 2 * (uint64_t)i);
	}
	CHECK(all_read(h, 3, a, "130"));
	CHECK(all_read(h, 3, b, "260"));
	CHECK_RC(hkv_decr(h[1], b, strlen(b), 60, &n), 0);
	CHECK(n == 200);
	CHECK_RC(hkv_append(h[0], a, strlen(a), "+", 1, 0), 0);
	CHECK_RC(hkv_append(h[2], b, strlen(b), "-", 1, 1), 0);
	CHECK(all_read(h, 3, a, "130+"));
	CHECK(all_read(h, 3, b, "-200"));
	/* cas: the other key's version never passes for ours */
	CHECK_RC(get_str(h[0], a, buf, sizeof(buf), &ia), 0);
	CHECK_RC(get_str(h[1], b, buf, sizeof(buf), &ib), 0);
	CHECK(ia.version != ib.version);
	CHECK_RC(hkv_cas(h[2], b, strlen(b), "x", 1, ia.version, NULL), HKV_EVERSION);
	CHECK_RC(hkv_cas(h[1], a, strlen(a), "a-cas", 5, ia.version, NULL), 0);
	CHECK_RC(hkv_touch(h[0], b, strlen(b), 3600), 0);
	CHECK(all_read(h, 3, a, "a-cas"));
	CHECK(all_read(h, 3, b, "-200"));
	/* deletes remove exactly one entry, and no older value comes back */
	CHECK_RC(hkv_delete(h[0], a, strlen(a)), 0);
	CHECK(all_read(h, 3, a, NULL));
	CHECK(all_read(h, 3, b, "-200"));
	CHECK_RC(hkv_delete(h[2], b, strlen(b)), 0);
	CHECK(all_read(h, 3, b, NULL));
	CHECK_RC(hkv_delete(h[1], b, strlen(b)), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(h[1], a, strlen(a), "x", 1, NULL), HKV_ENOTFOUND);
	/* and again the other way round, from cold handles' caches */
	CHECK_RC(set_str(h[2], b, "b-again"), 0);
	CHECK_RC(hkv_delete(h[0], a, strlen(a)), HKV_ENOTFOUND);
	CHECK(all_read(h, 3, b, "b-again"));
	CHECK_RC(hkv_delete(h[1], b, strlen(b)), 0);
	CHECK(all_read(h, 3, a, NULL) && all_read(h, 3, b, NULL));
}

static void pairs_on(const char *const *mode)
{
	struct hkv_config *c1, *c2;
	struct hkv_client *h[3];
	struct hkvserver s;
	uint64_t items, bytes;

	CHECK(start_rekeyed(&s, mode) == 0);
	c1 = hkvserver_config(&s);
	c2 = hkvserver_config(&s);
	CHECK_RC(hkv_open(c1, &h[0]), 0);
	CHECK_RC(hkv_open(c1, &h[1]), 0);
	CHECK_RC(hkv_open(c2, &h[2]), 0);
	for (int p = 0; p < NPAIRS; p++) {
		CHECK_PASSES(pair_ops(h, pairs[p][0], pairs[p][1]));
		CHECK_PASSES(pair_ops(h, pairs[p][1], pairs[p][0]));
	}
	CHECK_RC(hkv_count_items(h[0], &items, &bytes), 0);
	printf("# %s: items left %llu\n", mode ? mode[0] : "store mode",
	       (unsigned long long)items);
	CHECK(items == 0);
	for (int i = 0; i < 3; i++)
		hkv_close(h[i]);
	hkv_config_free(c1);
	hkv_config_free(c2);
	stop_rekeyed(&s);
}

static void test_pairs_never_cross(void)
{
	pairs_on(NULL);
}

static void test_pairs_never_cross_cache_mode(void)
{
	const char *const cache[] = {"--cache", NULL};

	pairs_on(cache);
}

/* 32 keys "aimed" (under the test secret, with g's index size) at the two
 * buckets of victim: they fill its 32 candidate slots. */
static void aim_keys(const struct hkv_geometry *g, const char *victim, char keys[32][24])
{
	struct hkv_geometry t = *g;
	uint64_t vb[2], b[2];
	int n = 0;

	memcpy(t.hash_key, hkv_test_secret, sizeof(t.hash_key));
	hkv_buckets_of(&t, hkv_key_hash(&t, victim, strlen(victim)), &vb[0], &vb[1]);
	for (uint64_t i = 0; n < 32; i++) {
		char k[24];

		snprintf(k, sizeof(k), "aim%llx", (unsigned long long)i);
		hkv_buckets_of(&t, hkv_key_hash(&t, k, strlen(k)), &b[0], &b[1]);
		if (b[0] == vb[0] && b[1] == vb[1])
			memcpy(keys[n++], k, sizeof(k));
	}
}

/*
 * Hash flooding: an attacker who knew the secret could aim 32 keys at a
 * victim key's candidate slots and make its insert fail (store mode). The
 * same 32 keys against a region with its own random secret land anywhere,
 * and the victim is stored.
 */
static void test_outsider_cannot_aim(void)
{
	static char keys[32][24];
	struct hkvserver s;
	struct hkv_client *c;
	uint64_t vb[2], b[2];
	int in_victims = 0;

	CHECK(start_rekeyed(&s, NULL) == 0); /* the secret known: the attack works */
	c = hkvserver_client(&s);
	aim_keys(&c->g, "victim", keys);
	for (int i = 0; i < 32; i++)
		CHECK_RC(set_str(c, keys[i], "x"), 0);
	CHECK_RC(set_str(c, "victim", "v"), HKV_EFULL);
	hkv_close(c);
	stop_rekeyed(&s);

	{
		const char *const small[] = {"--index-slots", "1024", NULL};

		CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", small) == 0);
	}
	c = hkvserver_client(&s); /* its own random secret */
	CHECK(memcmp(c->g.hash_key, hkv_test_secret, 16) != 0);
	hkv_buckets_of(&c->g, hkv_key_hash(&c->g, "victim", 6), &vb[0], &vb[1]);
	for (int i = 0; i < 32; i++) {
		CHECK_RC(set_str(c, keys[i], "x"), 0);
		hkv_buckets_of(&c->g, hkv_key_hash(&c->g, keys[i], strlen(keys[i])), &b[0], &b[1]);
		in_victims += b[0] == vb[0] || b[0] == vb[1] || b[1] == vb[0] || b[1] == vb[1];
	}
	CHECK_RC(set_str(c, "victim", "v"), 0);
	printf("# aimed keys: 32 of 32 in the victim's buckets with the secret known, %d of 32 "
	       "touch them under the region's own secret (%llu buckets)\n", in_victims,
	       (unsigned long long)c->g.nbuckets);
	CHECK(in_victims < 16);
	hkv_close(c);
	hkvserver_stop(&s);
}

int main(int argc, char **argv)
{
	use_verbs = hkvserver_want_verbs(argc, argv);
	printf("# transport %s\n", use_verbs ? "verbs" : "shm");
	RUN_TEST(test_pairs_collide);
	RUN_TEST(test_pairs_never_cross);
	RUN_TEST(test_pairs_never_cross_cache_mode);
	RUN_TEST(test_outsider_cannot_aim);
	return hkv_test_finish();
}
