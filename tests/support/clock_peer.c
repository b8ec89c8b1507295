/*
 * clock_peer.c - hkv-clock-peer URI TOKEN_FILE: a hatchkv client for
 * tests/test_clock.c to run under libfaketime (another clock): commands on
 * stdin, one answer line each:
 *   set KEY TTL -> ok | err N        add KEY TTL -> ok | exists | err N
 *   get KEY     -> hit | miss | err N time -> hkv_time() and time(NULL)
 * Linked without jemalloc (tests/CMakeLists.txt): jemalloc reads the clock
 * while it initializes, from libstdc++'s constructor, before libfaketime's
 * own; libfaketime's first call then allocates from inside jemalloc's
 * initialization and the process deadlocks.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hatchkv.h"

int main(int argc, char **argv)
{
	struct hkv_config *c = hkv_config_new();
	struct hkv_client *h;
	char line[512], key[256], val[64];
	int ttl, ret;

	if (argc != 3 || !c || hkv_config_add_server(c, argv[1]) ||
	    hkv_config_set_token_file(c, argv[2]) || hkv_open(c, &h)) {
		printf("err open\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		struct hkv_write_opts o = {0};
		size_t vlen = 0;

		if (sscanf(line, "set %255s %d", key, &ttl) == 2) {
			o.exptime = ttl;
			ret = hkv_set(h, key, strlen(key), "skewed", 6, &o);
			printf(ret ? "err %d\n" : "ok\n", ret);
		} else if (sscanf(line, "add %255s %d", key, &ttl) == 2) {
			o.exptime = ttl;
			ret = hkv_add(h, key, strlen(key), "skewed", 6, &o);
			printf(ret == HKV_EEXISTS ? "exists\n" : ret ? "err %d\n" : "ok\n", ret);
		} else if (sscanf(line, "get %255s", key) == 1) {
			ret = hkv_get(h, key, strlen(key), val, sizeof(val), &vlen, NULL);
			printf(ret == HKV_ENOTFOUND ? "miss\n" : ret ? "err %d\n" : "hit\n", ret);
		} else if (!strncmp(line, "time", 4)) {
			printf("%u %lld\n", hkv_time(h), (long long)time(NULL));
		} else {
			printf("err what\n");
		}
	}
	hkv_close(h);
	hkv_config_free(c);
	return 0;
}
