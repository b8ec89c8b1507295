/*
 * hatchkv-memcached - memcached's text protocol in front of a hatchkv server.
 * Command line like memcached's where it makes sense; see --help.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/memcached/mc_server.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/paths.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hatchkv-memcached --server URI [options]\n"
		"  -S, --server URI        hatchkv server: shm:/path/ctl.sock or verbs://host:port,\n"
		"                          or a cluster: etcd://HOST:PORT[,HOST:PORT...]/PREFIX\n"
		"                          (default: shm: and hatchkv-server's default socket,\n"
		"                          /run/hatchkv/hatchkv.sock as root)\n"
		"  -k, --token-file PATH   the server's shared secret (default hatchkv.token)\n"
		"  -p, --port PORT         TCP port (default 11211; 0 = any free port, logged)\n"
		"  -l, --listen ADDR       address to listen on (default 127.0.0.1)\n"
		"  -t, --threads N         worker threads, one hatchkv handle each (default 4)\n"
		"  -c, --conn-limit N      max simultaneous connections (default 1024, capped\n"
		"                          below the descriptor limit)\n"
		"      --depth N           requests in flight per worker (1..64; default 1 on\n"
		"                          shm:, where a round trip is CPU work, else 8): above 1\n"
		"                          a worker runs its connections' requests on N lanes\n"
		"                          (hkv_pipe: N more handles), so one connection's round\n"
		"                          trips overlap another's; a connection's own requests\n"
		"                          still run in order\n"
		"  -I, --max-item-size S   largest item, e.g. 1m, 512k (default 1m)\n"
		"  -U, --udp-port N        accepted for compatibility; only 0 (UDP off)\n"
		"  -F, --disable-flush-all flush_all answers CLIENT_ERROR (as memcached -F)\n"
		"      --metrics ADDR:PORT serve Prometheus metrics at http://ADDR:PORT/metrics\n"
		"                          (e.g. 127.0.0.1:9741; port 0: any, logged; default\n"
		"                          off; no authentication; docs/metrics.md)\n"
		"      --retry-ms MS       cluster: once a server is found dead its keys fail at\n"
		"                          once (SERVER_ERROR) for MS, then one request tries it\n"
		"                          again (default 250; 0: each waits up to a second)\n"
		"  -v, --verbose           debug logs\n"
		HKV_CONFIG_USAGE
		"a cluster's etcd (the client role's user over TLS, or --etcd-insecure):\n"
		HKV_ETCD_USAGE
		"  -h, --help\n");
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	default: break;
	}
	if (end == s || *end || v < 1024 || v > (1ull << 30))
		return -1;
	*out = (size_t)v;
	return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct mc_options *o)
{
	static const struct option opts[] = {
		{"server", required_argument, NULL, 'S'},   {"token-file", required_argument, NULL, 'k'},
		{"port", required_argument, NULL, 'p'},     {"listen", required_argument, NULL, 'l'},
		{"threads", required_argument, NULL, 't'},  {"conn-limit", required_argument, NULL, 'c'},
		{"max-item-size", required_argument, NULL, 'I'},
		{"udp-port", required_argument, NULL, 'U'}, {"verbose", no_argument, NULL, 'v'},
		{"disable-flush-all", no_argument, NULL, 'F'},
		{"depth", required_argument, NULL, 256},
		{"metrics", required_argument, NULL, 257},
		{"retry-ms", required_argument, NULL, 258},
		{"version", no_argument, NULL, 'V'},
		HKV_ETCD_LONGOPTS,
		{"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
	int c, r, udp;

	if (hkv_cli_config(&argc, &argv, opts, "hatchkv-memcached"))
		return -1;
	while ((c = getopt_long(argc, argv, "S:k:p:l:t:c:I:U:vFVh", opts, NULL)) != -1) {
		switch (c) {
		case 'F': o->no_flush = 1; break;
		case 'V': hkv_print_version(stdout, "hatchkv-memcached"); exit(0);
		case 256:
			if (parse_int(optarg, 1, 64, &o->depth))
				return fprintf(stderr, "bad --depth '%s' (1..64)\n", optarg), -1;
			break;
		case 257:
			if (!hkv_metrics_addr_ok(optarg))
				return fprintf(stderr, "bad --metrics '%s' (ADDR:PORT)\n", optarg), -1;
			o->metrics = optarg;
			break;
		case 258:
			if (parse_int(optarg, 0, 3600000, &o->retry_ms))
				return fprintf(stderr, "bad --retry-ms '%s' (0..3600000)\n", optarg), -1;
			break;
		case 'S': o->server_uri = optarg; break;
		case 'k': o->token_file = optarg; break;
		case 'l': o->listen_addr = optarg; break;
		case 'p':
			if (parse_int(optarg, 0, 65535, &o->port))
				return fprintf(stderr, "bad --port '%s'\n", optarg), -1;
			break;
		case 't':
			if (parse_int(optarg, 1, 256, &o->threads))
				return fprintf(stderr, "bad --threads '%s'\n", optarg), -1;
			break;
		case 'c':
			if (parse_int(optarg, 1, 1 << 20, &o->max_conns))
				return fprintf(stderr, "bad --conn-limit '%s'\n", optarg), -1;
			break;
		case 'I':
			if (parse_size(optarg, &o->item_max))
				return fprintf(stderr, "bad --max-item-size '%s' (1k..1024m)\n", optarg), -1;
			break;
		case 'U':
			if (parse_int(optarg, 0, 0, &udp))
				return fprintf(stderr, "UDP is not supported (-U 0 only)\n"), -1;
			break;
		case 'v':
			o->verbose = 1;
			hkv_log_set_level(HKV_LOG_DEBUG);
			break;
		case 'h': usage(stdout); exit(0);
		default:
			if ((r = hkv_etcd_sec_opt(&o->etcd, c, optarg)) > 0)
				break;
			if (r < 0)
				fprintf(stderr, "bad value '%s'\n", optarg);
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc)
		return usage(stderr), -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct mc_options o = {
		.listen_addr = "127.0.0.1",
		.port = 11211,
		.threads = 4,
		.depth = 0, /* by transport: see mc_server_run */
		.max_conns = 0, /* 1024, or what the descriptor limit allows */
		.item_max = 1u << 20,
		.server_uri = NULL,
		.token_file = "hatchkv.token",
		.retry_ms = -1,
	};
	char uri[320];

	hkv_log_set_prog("hatchkv-memcached");
	if (parse_args(argc, argv, &o))
		return 2;
	if (!o.server_uri) { /* the server's default socket */
		memcpy(uri, "shm:", 4);
		if (hkv_default_socket(uri + 4, sizeof(uri) - 4, 0))
			return 2;
		o.server_uri = uri;
	}
	return mc_server_run(&o);
}
