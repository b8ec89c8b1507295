/*
 * transport_bench.c - RDMA READ latency through hatchkv's transport, measured
 * the way perftest's ib_read_lat measures it: one outstanding READ, busy
 * polling, per-iteration timestamps from the TSC (as perftest's get_cycles;
 * clock_gettime would add its own cost to every sample), converted to us by
 * the TSC rate measured over the whole run; prints median and p99.
 *
 *   hkv-transport-bench [--transport verbs|shm] [--size B] [--iters N]
 *
 * It starts its own bare server (tests/support/rawserve). Output, one line:
 *   hkv_read_lat size=<B> iters=<N> median_us=<x> p99_us=<y> round_trips=<N>
 * scripts/bench-transport runs it next to ib_read_lat in one guest and prints
 * the ratio.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <x86intrin.h>

#include "common/transport.h"
#include "tests/support/rawserve.h"

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

int main(int argc, char **argv)
{
	enum hkv_transport_kind kind = hkv_verbs_available() ? HKV_TRANSPORT_VERBS : HKV_TRANSPORT_SHM;
	static const struct option opts[] = {{"transport", required_argument, NULL, 't'},
					     {"size", required_argument, NULL, 's'},
					     {"iters", required_argument, NULL, 'n'},
					     {NULL, 0, NULL, 0}};
	unsigned size = 64, iters = 2000, warmup;
	struct hkv_conn_cfg cfg;
	struct rawserve rs;
	struct hkv_conn *c;
	struct hkv_mr *mr;
	struct hkv_wr wr;
	double *lat;
	void *buf;
	int opt, ret = 0;

	while ((opt = getopt_long(argc, argv, "t:s:n:", opts, NULL)) != -1) {
		if (opt == 't' && !(kind = hkv_transport_parse(optarg)))
			opt = '?';
		if (opt == 's')
			size = (unsigned)strtoul(optarg, NULL, 0);
		if (opt == 'n')
			iters = (unsigned)strtoul(optarg, NULL, 0);
		if (opt == '?' || !size || size > (1u << 20) || !iters) {
			fprintf(stderr, "usage: %s [--transport verbs|shm] [--size B<=1MiB] "
					"[--iters N]\n", argv[0]);
			return 2;
		}
	}
	warmup = iters / 10 + 10;
	if (rawserve_start(&rs, kind, 4u << 20)) {
		fprintf(stderr, "cannot start server\n");
		return 1;
	}
	rawserve_conn_cfg(&rs, &cfg);
	c = hkv_conn_open(&cfg, NULL, NULL);
	if (!c) {
		fprintf(stderr, "connect: %s\n", hkv_strerror(-errno));
		rawserve_stop(&rs);
		return 1;
	}
	buf = aligned_alloc(4096, (size + 4095) & ~4095u);
	lat = calloc(iters, sizeof(*lat));
	mr = hkv_conn_reg(c, buf, (size + 4095) & ~4095u);
	if (!buf || !lat || !mr) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	wr = (struct hkv_wr){.opcode = HKV_WR_READ, .local = buf, .mr = mr, .length = size,
			     .remote_addr = hkv_conn_region(c)->base + 4096,
			     .rkey = hkv_conn_region(c)->rkey};
	{
		double us0 = now_us(), cycles_per_us;
		uint64_t tsc0 = __rdtsc();

		for (unsigned i = 0; i < warmup + iters && !ret; i++) {
			uint64_t t0 = __rdtsc();

			ret = hkv_conn_exec(c, &wr, 1);
			if (i >= warmup)
				lat[i - warmup] = (double)(__rdtsc() - t0);
		}
		cycles_per_us = (double)(__rdtsc() - tsc0) / (now_us() - us0);
		for (unsigned i = 0; i < iters; i++)
			lat[i] /= cycles_per_us;
	}
	if (ret) {
		fprintf(stderr, "READ failed: %s\n", hkv_strerror(ret));
	} else {
		qsort(lat, iters, sizeof(*lat), cmp_double);
		printf("hkv_read_lat transport=%s size=%u iters=%u median_us=%.2f p99_us=%.2f "
		       "round_trips=%llu\n",
		       c->ops->name, size, iters, lat[iters / 2], lat[(size_t)(iters * 0.99)],
		       (unsigned long long)c->stats.round_trips);
	}
	hkv_conn_dereg(c, mr);
	hkv_conn_close(c);
	rawserve_stop(&rs);
	free(lat);
	free(buf);
	return ret ? 1 : 0;
}
