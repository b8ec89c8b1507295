/*
 * getpath.c - where a warm GET's time goes beyond its one RDMA READ (issue
 * 16): a real hatchkv-server, one handle, one key whose location is cached,
 * then side by side in alternating rounds:
 *
 *   get    hkv_get() of the key, as an application calls it
 *   read   one READ of the same block through the same connection
 *          (hkv_conn_exec: the transport's floor for this GET)
 *   view   hkv_get_view(): the same GET without the copy out
 *
 * both timed per iteration with the TSC (as perftest does), medians over
 * the rounds; and the client work of a GET, each piece timed in a loop of
 * its own on the same data: the key's hash (SipHash), the location-cache
 * lookup, the block check (header, key compare, XXH64 sum), the copy into the
 * caller's buffer, the operation's counters and clock reads. What the
 * pieces do not explain is posting, polling and the rest of the call.
 *
 *   hkv-get-breakdown [--transport verbs|shm] [--value B] [--iters N] [--rounds R]
 *
 * Output: a table, then one line for scripts:
 *   get_breakdown transport=.. value=.. get_p50_us=.. read_p50_us=.. ratio=..
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <x86intrin.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/transport.h"
#include "common/transport_int.h"
#include "hatchkv.h"
#include "tests/support/hkvserver.h"

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* ns per call of a piece of client work, over `loops` calls */
#define PIECE(loops, stmt)                                                                 \
	({                                                                                 \
		double t0_ = now_us();                                                     \
		for (unsigned i_ = 0; i_ < (loops); i_++) {                                \
			stmt;                                                              \
			__asm__ volatile("" ::: "memory");                                 \
		}                                                                          \
		(now_us() - t0_) * 1e3 / (double)(loops);                                  \
	})

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"transport", required_argument, NULL, 't'},
					     {"value", required_argument, NULL, 'v'},
					     {"iters", required_argument, NULL, 'n'},
					     {"rounds", required_argument, NULL, 'r'},
					     {NULL, 0, NULL, 0}};
	const char *key = "user6284781860667377211"; /* a YCSB key: 23 bytes */
	int verbs = hkv_verbs_available(), opt, ret;
	unsigned vsize = 1000, iters = 2000, rounds = 5;
	double *get_lat, *read_lat, get_med[16], read_med[16], view_med[16], cyc_per_us, us0;
	double pieces = 0;
	struct hkvserver s;
	struct hkv_client *c;
	struct hkv_loc lc, *loc;
	struct hkv_wr wr;
	struct key k;
	uint64_t tsc0, h = 0;
	char *val, *buf;
	size_t vlen;

	while ((opt = getopt_long(argc, argv, "t:v:n:r:", opts, NULL)) != -1) {
		if (opt == 't')
			verbs = hkv_transport_parse(optarg) == HKV_TRANSPORT_VERBS;
		else if (opt == 'v')
			vsize = (unsigned)strtoul(optarg, NULL, 0);
		else if (opt == 'n')
			iters = (unsigned)strtoul(optarg, NULL, 0);
		else if (opt == 'r')
			rounds = (unsigned)strtoul(optarg, NULL, 0);
		if (opt == '?' || !iters || !rounds || rounds > 16 || vsize > (1u << 20)) {
			fprintf(stderr, "usage: %s [--transport verbs|shm] [--value B<=1MiB] "
					"[--iters N] [--rounds R<=16]\n", argv[0]);
			return 2;
		}
	}
	val = malloc(vsize + 1);
	buf = malloc(vsize + 1);
	get_lat = calloc(iters, sizeof(double));
	read_lat = calloc(iters, sizeof(double));
	if (!val || !buf || !get_lat || !read_lat)
		return 1;
	memset(val, 'v', vsize);
	if (hkvserver_start(&s, verbs, "64M", vsize > (500u << 10) ? "4M" : "1M", NULL)) {
		fprintf(stderr, "cannot start hatchkv-server\n");
		return 1;
	}
	c = hkvserver_client(&s);
	ret = hkv_set(c, key, strlen(key), val, vsize, NULL);
	if (!ret)
		ret = hkv_get(c, key, strlen(key), buf, vsize + 1, &vlen, NULL); /* now cached */
	if (!ret)
		ret = hkv_key_init(c, &k, key, strlen(key));
	loc = ret ? NULL : hkv_cached_loc(c, &k, &lc, 0);
	if (!loc) {
		fprintf(stderr, "setup failed: %s\n", ret ? hkv_strerror(ret) : "key not cached");
		return 1;
	}
	wr = hkv_wr_read(c, c->rblk, hkv_slot_off(loc->slot), loc->blen);

	us0 = now_us();
	tsc0 = __rdtsc();
	for (unsigned r = 0; r < rounds; r++) {
		for (unsigned i = 0; i < iters / 10; i++) /* warm up this round */
			(void)hkv_get(c, key, strlen(key), buf, vsize + 1, &vlen, NULL);
		for (unsigned i = 0; i < iters; i++) {
			uint64_t t0 = __rdtsc();

			ret |= hkv_get(c, key, strlen(key), buf, vsize + 1, &vlen, NULL);
			get_lat[i] = (double)(__rdtsc() - t0);
		}
		for (unsigned i = 0; i < iters; i++) {
			uint64_t t0 = __rdtsc();

			ret |= hkv_conn_exec(c->conn, &wr, 1);
			read_lat[i] = (double)(__rdtsc() - t0);
		}
		get_med[r] = median(get_lat, iters);
		read_med[r] = median(read_lat, iters);
		for (unsigned i = 0; i < iters; i++) {
			const void *vp;
			uint64_t t0 = __rdtsc();

			ret |= hkv_get_view(c, key, strlen(key), &vp, &vlen, NULL);
			read_lat[i] = (double)(__rdtsc() - t0);
		}
		view_med[r] = median(read_lat, iters);
	}
	cyc_per_us = (double)(__rdtsc() - tsc0) / (now_us() - us0);
	if (ret) {
		fprintf(stderr, "a GET or READ failed\n");
		return 1;
	}
	{
		unsigned loops = 200000;
		double t_hash, t_cache, t_check, t_copy, t_clock, t_stats;
		struct hkv_client_stats st;

		t_hash = PIECE(loops, h += hkv_key_hash(&c->g, key, strlen(key)));
		t_cache = PIECE(loops, h += (uintptr_t)hkv_cached_loc(c, &k, &lc, 0));
		t_check = PIECE(loops, h += (uint64_t)hkv_loc_block_current(c, &lc, c->rblk, key,
									    (uint16_t)strlen(key)));
		t_copy = PIECE(loops, memcpy(buf, c->rblk + HKV_BLOCK_HDR + strlen(key), vsize));
		t_clock = PIECE(loops, h += hkv_coarse_ns() + hkv_now_ns());
		t_stats = PIECE(loops, hkv_client_stats(c, &st));
		pieces = t_hash + t_cache + t_check + t_copy + t_clock;
		for (unsigned r = 0; r < rounds; r++) {
			get_med[r] /= cyc_per_us;
			read_med[r] /= cyc_per_us;
			view_med[r] /= cyc_per_us;
		}
		{
			double g = median(get_med, rounds), rd = median(read_med, rounds);
			double gv = median(view_med, rounds);

			printf("warm GET of a %u-byte value (%u-byte block), %s, %u rounds x %u:\n",
			       vsize, loc->blen, verbs ? "verbs" : "shm", rounds, iters);
			printf("  hkv_get p50                 %8.2f us\n", g);
			printf("  its READ alone p50          %8.2f us   (GET / READ = %.2f)\n", rd,
			       g / rd);
			printf("  hkv_get_view p50 (no copy)  %8.2f us   (view / copy = %.2f)\n", gv,
			       gv / g);
			printf("  difference GET - READ       %8.0f ns\n", (g - rd) * 1e3);
			printf("  client work, timed alone:\n");
			printf("    key hash (SipHash-2-4)    %8.0f ns\n", t_hash);
			printf("    location-cache lookup     %8.0f ns\n", t_cache);
			printf("    block check (key, XXH64)  %8.0f ns\n", t_check);
			printf("    value copy                %8.0f ns\n", t_copy);
			printf("    clock reads (coarse+fine) %8.0f ns\n", t_clock);
			printf("    sum                       %8.0f ns\n", pieces);
			printf("  the rest (post, poll, call) %8.0f ns\n", (g - rd) * 1e3 - pieces);
			printf("  (a stats snapshot, hkv_client_stats: %.0f ns, not on the GET path)\n",
			       t_stats);
			printf("get_breakdown transport=%s value=%u get_p50_us=%.3f read_p50_us=%.3f "
			       "ratio=%.3f view_p50_us=%.3f hash_ns=%.0f cache_ns=%.0f check_ns=%.0f copy_ns=%.0f "
			       "clock_ns=%.0f rest_ns=%.0f sink=%llu\n",
			       verbs ? "verbs" : "shm", vsize, g, rd, g / rd, gv, t_hash, t_cache, t_check,
			       t_copy, t_clock, (g - rd) * 1e3 - pieces, (unsigned long long)(h & 1));
		}
	}
	hkv_close(c);
	hkvserver_stop(&s);
	free(val);
	free(buf);
	free(get_lat);
	free(read_lat);
	return 0;
}
