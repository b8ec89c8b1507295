/*
 * test_threads.c - many threads of one process, each with its own handle but
 * all opened from ONE config, so they share its location cache (the case a
 * service with a thread pool has). Every thread owns some keys it updates and
 * reads back, and reads everybody's keys; a value read must be one of the
 * values its owner wrote (values name key and sequence). Run under TSan too.
 *
 *   test_threads shm|verbs
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/transport.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"

HKV_TEST_MAIN_DEFS;

#define THREADS 4
#define KEYS_PER_THREAD 16
#define ROUNDS 400

static struct hkv_config *cfg;
static int last_seq[THREADS][KEYS_PER_THREAD]; /* written by the owner only */

struct tresult {
	long bad, errors, reads;
};

static void *worker(void *arg)
{
	int me = (int)(long)arg;
	struct tresult *r = calloc(1, sizeof(*r));
	struct hkv_client *c;
	char key[32], val[64], got[64];

	if (hkv_open(cfg, &c)) {
		r->errors++;
		return r;
	}
	for (int round = 0; round < ROUNDS; round++) {
		int k = round % KEYS_PER_THREAD, t = (round * 7 + me) % THREADS, kk = round % 5;
		size_t vlen;
		int owner, okey, seq;

		snprintf(key, sizeof(key), "t%d-k%d", me, k);
		snprintf(val, sizeof(val), "t%d-k%d-s%d", me, k, round);
		if (hkv_set(c, key, strlen(key), val, strlen(val), NULL))
			r->errors++;
		__atomic_store_n(&last_seq[me][k], round, __ATOMIC_RELEASE);
		snprintf(key, sizeof(key), "t%d-k%d", t, kk);
		int ret = hkv_get(c, key, strlen(key), got, sizeof(got) - 1, &vlen, NULL);

		if (ret == HKV_ENOTFOUND)
			continue;
		if (ret) {
			r->errors++;
			continue;
		}
		got[vlen] = 0;
		r->reads++;
		if (sscanf(got, "t%d-k%d-s%d", &owner, &okey, &seq) != 3 || owner != t || okey != kk ||
		    seq % KEYS_PER_THREAD != kk)
			r->bad++;
	}
	hkv_close(c);
	return r;
}

static void test_shared_cache_threads(int verbs)
{
	struct hkvserver s;
	pthread_t th[THREADS];
	long bad = 0, errors = 0, reads = 0;

	CHECK(hkvserver_start(&s, verbs, "16M", "64K", NULL) == 0);
	cfg = hkvserver_config(&s);
	CHECK(cfg != NULL);
	for (long i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)i);
	for (int i = 0; i < THREADS; i++) {
		struct tresult *r;

		pthread_join(th[i], (void **)&r);
		bad += r->bad;
		errors += r->errors;
		reads += r->reads;
		free(r);
	}
	hkv_config_free(cfg);
	hkvserver_stop(&s);
	printf("# %d threads sharing one config: %ld reads, %ld bad values, %ld errors\n", THREADS,
	       reads, bad, errors);
	CHECK(bad == 0 && errors == 0 && reads > 0);
}

int main(int argc, char **argv)
{
	int verbs = hkvserver_want_verbs(argc, argv);

	if (verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	test_shared_cache_threads(verbs);
	printf("%s - test_shared_cache_threads\n", hkv_test_failures ? "not ok" : "ok");
	return hkv_test_finish();
}
