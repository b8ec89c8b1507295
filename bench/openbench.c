/*
 * openbench.c - hkv-open-bench: what it costs a client to start working:
 * hkv_open() (control plane AUTH, data-plane connect, with memory windows
 * the base-window GRANT, header READ), then its first set (which claims a
 * segment: with windows one more GRANT), then hkv_close(). Repeated N times
 * against a running server; prints the median and mean of each part.
 *
 *   hkv-open-bench URI TOKEN_FILE [N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hatchkv.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void report(const char *what, double *v, int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++)
		sum += v[i];
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	printf("%s: p50 %.3f ms, mean %.3f ms, min %.3f ms, max %.3f ms\n", what, v[n / 2],
	       sum / n, v[0], v[n - 1]);
}

int main(int argc, char **argv)
{
	int n = argc > 3 ? atoi(argv[3]) : 50;
	double *open_ms, *set_ms, *close_ms;
	struct hkv_config *cfg;

	if (argc < 3 || n <= 0) {
		fprintf(stderr, "usage: hkv-open-bench URI TOKEN_FILE [N]\n");
		return 2;
	}
	cfg = hkv_config_new();
	open_ms = calloc((size_t)n, sizeof(double));
	set_ms = calloc((size_t)n, sizeof(double));
	close_ms = calloc((size_t)n, sizeof(double));
	if (!cfg || !open_ms || !set_ms || !close_ms || hkv_config_add_server(cfg, argv[1]) ||
	    hkv_config_set_token_file(cfg, argv[2])) {
		fprintf(stderr, "hkv-open-bench: bad configuration\n");
		return 2;
	}
	for (int i = 0; i < n; i++) {
		struct hkv_client *c;
		char key[32];
		double t0 = now_ms(), t1, t2;
		int ret = hkv_open(cfg, &c);

		if (ret) {
			fprintf(stderr, "hkv-open-bench: hkv_open: %s\n", hkv_strerror(ret));
			return 1;
		}
		t1 = now_ms();
		snprintf(key, sizeof(key), "open-bench-%d", i);
		ret = hkv_set(c, key, strlen(key), "v", 1, NULL);
		t2 = now_ms();
		if (ret) {
			fprintf(stderr, "hkv-open-bench: first set: %s\n", hkv_strerror(ret));
			return 1;
		}
		hkv_close(c);
		open_ms[i] = t1 - t0;
		set_ms[i] = t2 - t1;
		close_ms[i] = now_ms() - t2;
	}
	report("open", open_ms, n);
	report("first set (claims a segment)", set_ms, n);
	report("close", close_ms, n);
	hkv_config_free(cfg);
	free(open_ms);
	free(set_ms);
	free(close_ms);
	return 0;
}
