/*
 * hatchkv-server - the memory server: registers one region with the NIC,
 * announces it to authenticated clients, and stays out of the data path.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <sodium.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/paths.h"
#include "common/cli.h"
#include "common/fdlimit.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "common/region.h"
#include "common/token.h"
#include "common/transport.h"
#include "server/cluster.h"
#include "server/ctl.h"
#include "server/filler.h"
#include "server/metrics.h"
#include "server/mover.h"
#include "server/store.h"

struct server_opts {
	enum hkv_transport_kind kind;
	const char *host, *port, *socket_path, *token_file, *ro_token_file;
	struct hkv_store_opts store;
	int no_windows;
	int force; /* --force: a region larger than the memory available */
	int verbose;
	int keepalive_ms;
	char data_port[16], data_path[128];
	struct hkv_cluster_opts cluster; /* cluster.uri NULL: standalone */
	struct hkv_etcd_sec etcd;        /* --etcd-*: how to reach it */
	const char *metrics; /* --metrics ADDR:PORT, NULL: off */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hatchkv-server [options]\n"
		"  -t, --transport shm|verbs  data plane (default: verbs if an RDMA device exists)\n"
		"  -l, --listen ADDR          verbs: address to serve on (default 0.0.0.0)\n"
		"  -p, --port PORT            verbs: control TCP port; rdma_cm uses PORT+1 (7700)\n"
		"  -s, --socket PATH          shm: control socket; data socket is PATH.data\n"
		"                             (default /run/hatchkv/hatchkv.sock as root, else\n"
		"                             $XDG_RUNTIME_DIR/hatchkv.sock or\n"
		"                             /tmp/hatchkv-UID/hatchkv.sock)\n"
		"  -m, --memory SIZE          region size, e.g. 512M, 4G (default 1G)\n"
		"  -S, --segment-size SIZE    allocation segment, power of two >= 64K (default 1M,\n"
		"                             halved below 32 MiB of memory to keep >= 32 segments);\n"
		"                             the largest item is one segment\n"
		"  -F, --growth-factor F      each size class F x the one below (default 1.25 with\n"
		"                             --cache as memcached's -f, else 1.125; a store moves\n"
		"                             live items so fine classes cost little)\n"
		"  -i, --index-slots N        index slots (default memory/256)\n"
		"  -k, --token-file PATH      shared secret; created if missing (hatchkv.token)\n"
		"  -r, --ro-token-file PATH   a second secret for read-only clients (RDMA Read\n"
		"                             rights only); created if missing\n"
		"  -f, --memory-file PATH     keep the region in this file: a restart (even after\n"
		"                             SIGKILL) serves every committed item again\n"
		"  -c, --cache                cache mode: evict when full instead of failing\n"
		"  -C, --max-clients N        clients connected at once (default 1024; writers at\n"
		"                             most 4096, one claim-intent record each); more get\n"
		"                             ERROR \"too many clients\"\n"
		"  -K, --keepalive-ms MS      verbs: probe every client this often (a zero-length\n"
		"                             RDMA WRITE); one that does not answer for ~15-20 s\n"
		"                             is dropped (default 2000; 0: never)\n"
		"  -W, --no-windows           verbs: hand every client one rkey for the whole\n"
		"                             region instead of memory windows bound to its own\n"
		"                             connection (default: windows if the device has\n"
		"                             type-2B windows: writers may WRITE only into the\n"
		"                             data area, never the header, segment table,\n"
		"                             bitmaps or index; keys die with the connection)\n"
		"      --metrics ADDR:PORT    serve Prometheus metrics at http://ADDR:PORT/metrics\n"
		"                             (e.g. 127.0.0.1:9740; port 0: any, logged; default\n"
		"                             off; no authentication: keep it on a trusted\n"
		"                             network; docs/metrics.md)\n"
		"      --force                start even if --memory is more than the memory\n"
		"                             available (MemAvailable, the cgroup's memory.max)\n"
		"  -v, --verbose              debug logs (HKV_LOG=debug does the same)\n"
		"  -V, --version              version, region layout, control protocol, git revision\n"
		HKV_CONFIG_USAGE
		"cluster (docs/design.md \"Cluster\"):\n"
		"  -E, --cluster URI          join the cluster kept in etcd at\n"
		"                             etcd://HOST:PORT[,HOST:PORT...]/PREFIX (needs\n"
		"                             --id; the cluster's mode: --cache, or a store\n"
		"                             with --memory-file)\n"
		"  -I, --id NAME              this server's name in the cluster\n"
		"  -A, --advertise URI        the URI clients connect to (default shm:SOCKET,\n"
		"                             or verbs://LISTEN:PORT when --listen is an address)\n"
		"  -L, --lease-ttl SECONDS    etcd lease; the server fences itself (drops every\n"
		"                             client) 1 s before it could expire (default 5, >= 2)\n"
		"  -P, --partitions N         partitions, if this server creates the map (default 64)\n"
		"  -T, --route-lease-ms MS    if this server creates the map: clients route on a\n"
		"                             view of it confirmed this recently, and a lost server\n"
		"                             is given up 0.5 s after that (default 1500; 200..60000)\n"
		"  -R, --replicas N           store mode, if this server creates the map: keep each\n"
		"                             partition on N servers (1..3, default 1); the map is\n"
		"                             made once N have joined and none joined for a lease\n"
		"                             TTL; a lost server is dropped\n"
		"                             from its lists (docs/design.md, \"Replicas\")\n"
		"etcd (needs TLS and a user, or --etcd-insecure; docs/operating.md):\n"
		HKV_ETCD_USAGE
		"  -h, --help\n");
}

/* A size option's value, or a message that says what is wrong with it. */
static int size_arg(const char *opt, const char *s, uint64_t *out)
{
	const char *why;

	if (!hkv_parse_size(s, out, &why))
		return 0;
	fprintf(stderr, "bad %s '%s': %s\n", opt, s, why);
	return -1;
}

static int parse_args(int argc, char **argv, struct server_opts *o)
{
	static const struct option opts[] = {
		{"transport", required_argument, NULL, 't'}, {"listen", required_argument, NULL, 'l'},
		{"port", required_argument, NULL, 'p'},      {"socket", required_argument, NULL, 's'},
		{"memory", required_argument, NULL, 'm'},    {"segment-size", required_argument, NULL, 'S'},
		{"index-slots", required_argument, NULL, 'i'},
		{"growth-factor", required_argument, NULL, 'F'}, {"token-file", required_argument, NULL, 'k'},
		{"cache", no_argument, NULL, 'c'},           {"verbose", no_argument, NULL, 'v'},
		{"memory-file", required_argument, NULL, 'f'},
		{"ro-token-file", required_argument, NULL, 'r'},
		{"max-clients", required_argument, NULL, 'C'},
		{"no-windows", no_argument, NULL, 'W'},
		{"keepalive-ms", required_argument, NULL, 'K'},
		{"cluster", required_argument, NULL, 'E'},   {"id", required_argument, NULL, 'I'},
		{"advertise", required_argument, NULL, 'A'},
		{"lease-ttl", required_argument, NULL, 'L'},
		{"partitions", required_argument, NULL, 'P'},
		{"replicas", required_argument, NULL, 'R'},
		{"route-lease-ms", required_argument, NULL, 'T'},
		{"metrics", required_argument, NULL, 256},
		{"force", no_argument, NULL, 257},
		{"version", no_argument, NULL, 'V'},
		HKV_ETCD_LONGOPTS,
		{"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0}};
	uint64_t v;
	int c, r;

	if (hkv_cli_config(&argc, &argv, opts, "hatchkv-server"))
		return -1;
	while ((c = getopt_long(argc, argv, "t:l:p:s:m:S:F:i:k:f:r:cC:WK:E:I:A:L:P:R:T:vVh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (!(o->kind = hkv_transport_parse(optarg)))
				return fprintf(stderr, "unknown transport '%s'\n", optarg), -1;
			break;
		case 'l': o->host = optarg; break;
		case 'p': o->port = optarg; break;
		case 's': o->socket_path = optarg; break;
		case 'm':
			if (size_arg("--memory", optarg, &o->store.memory))
				return -1;
			break;
		case 'S':
			if (size_arg("--segment-size", optarg, &v))
				return -1;
			if (v > (1u << 30))
				return fprintf(stderr, "bad --segment-size '%s': over 1G\n", optarg), -1;
			o->store.seg_size = (uint32_t)v;
			break;
		case 'F': {
			char *end;
			double f = strtod(optarg, &end);

			if (*end || !(f > 1.0009 && f <= 4.0))
				return fprintf(stderr, "bad --growth-factor '%s' (1.001 to 4)\n", optarg), -1;
			o->store.growth = (uint32_t)(f * 1000 + 0.5);
			break;
		}
		case 'i':
			if (size_arg("--index-slots", optarg, &o->store.index_slots))
				return -1;
			break;
		case 'k': o->token_file = optarg; break;
		case 'f': o->store.memory_file = optarg; break;
		case 'r': o->ro_token_file = optarg; break;
		case 'c': o->store.cache_mode = 1; break;
		case 'C':
			o->store.max_clients = (uint32_t)strtoul(optarg, NULL, 10);
			if (!o->store.max_clients || o->store.max_clients > HKV_MAX_CLIENTS)
				return fprintf(stderr, "bad --max-clients '%s'\n", optarg), -1;
			break;
		case 'W': o->no_windows = 1; break;
		case 'K': {
			char *end;
			long ka = strtol(optarg, &end, 10);

			if (end == optarg || *end || ka < 0 || ka > 3600000)
				return fprintf(stderr, "bad --keepalive-ms '%s'\n", optarg), -1;
			o->keepalive_ms = (int)ka;
			break;
		}
		case 'E': o->cluster.uri = optarg; break;
		case 'I': o->cluster.id = optarg; break;
		case 'A': o->cluster.endpoint = optarg; break;
		case 'L':
			o->cluster.ttl_s = atoi(optarg);
			if (o->cluster.ttl_s < 2 || o->cluster.ttl_s > 3600)
				return fprintf(stderr, "bad --lease-ttl '%s' (2..3600)\n", optarg), -1;
			break;
		case 'P':
			o->cluster.partitions = (uint32_t)strtoul(optarg, NULL, 10);
			if (!o->cluster.partitions || o->cluster.partitions > HKV_CLUSTER_MAX_PARTS)
				return fprintf(stderr, "bad --partitions '%s'\n", optarg), -1;
			break;
		case 'R':
			o->cluster.replicas = (uint32_t)strtoul(optarg, NULL, 10);
			if (o->cluster.replicas < 1 || o->cluster.replicas > HKV_CLUSTER_MAX_REPLICAS)
				return fprintf(stderr, "bad --replicas '%s' (1..3)\n", optarg), -1;
			break;
		case 'T':
			o->cluster.route_lease_ms = (uint32_t)strtoul(optarg, NULL, 10);
			if (o->cluster.route_lease_ms < HKV_CLUSTER_ROUTE_LEASE_MIN ||
			    o->cluster.route_lease_ms > HKV_CLUSTER_ROUTE_LEASE_MAX)
				return fprintf(stderr, "bad --route-lease-ms '%s' (200..60000)\n",
					       optarg), -1;
			break;
		case 256:
			if (!hkv_metrics_addr_ok(optarg))
				return fprintf(stderr, "bad --metrics '%s' (ADDR:PORT)\n", optarg), -1;
			o->metrics = optarg;
			break;
		case 257: o->force = 1; break;
		case 'v': o->verbose = 1; break;
		case 'V': hkv_print_version(stdout, "hatchkv-server"); exit(0);
		case 'h': usage(stdout); exit(0);
		default:
			if ((r = hkv_etcd_sec_opt(&o->etcd, c, optarg)) > 0)
				break;
			if (r < 0)
				return fprintf(stderr, "bad --etcd option value '%s'\n", optarg), -1;
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc)
		return usage(stderr), -1;
	if (o->verbose)
		hkv_log_set_level(HKV_LOG_DEBUG);
	if (!o->force) {
		const char *from;
		uint64_t avail = hkv_memory_available(&from);

		if (avail && o->store.memory > avail)
			return fprintf(stderr, "--memory %.1f GiB is more than this machine has for it "
					       "(%s: %.1f GiB); use less, or --force\n",
				       o->store.memory / 1073741824.0, from, avail / 1073741824.0), -1;
	}
	if (o->cluster.replicas > 1 && o->store.cache_mode)
		return fprintf(stderr, "--replicas needs a store (a cache evicts on its own)\n"), -1;
	if (o->cluster.uri) {
		if (!o->cluster.id || !hkv_cluster_id_valid(o->cluster.id))
			return fprintf(stderr, "--cluster needs --id NAME ([A-Za-z0-9._-], < 64)\n"), -1;
		if (!o->store.cache_mode && !o->store.memory_file)
			return fprintf(stderr, "--cluster without --cache (a store) needs "
					       "--memory-file: a server that restarts must come back "
					       "with its items\n"), -1;
		if (o->store.cache_mode && o->store.memory_file)
			return fprintf(stderr, "--cluster --cache and --memory-file do not go "
					       "together: a cache server that lost its lease comes "
					       "back empty\n"), -1;
	}
	return 0;
}

struct server {
	struct event_base *base;
	struct hkv_store store;
	struct hkv_listener *data;
	struct event *ev_data;
	struct hkv_ctl *ctl;
	struct server_opts *o;
	struct hkv_cluster *cluster;
	struct hkv_metrics *metrics; /* --metrics, or NULL */
	struct hkv_cmap *repurge; /* shm: purge again before serving after a move */
	const char *token;
	char *tok_buf, *ro_buf;   /* the tokens the control plane uses (SIGHUP rewrites) */
	char **opt_values;        /* the options as last read (hkv_cli_values; SIGHUP) */
	size_t tok_len, ro_len;
	uint64_t fenced_ns;       /* when the data plane last stopped */
	int rc;
	/* a replicated store's repair (server/filler.h): the fill we source,
	 * its online passes on fill_thr while fill_busy */
	struct hkv_fill *fill;
	struct hkv_cluster_job *fill_job;
	pthread_t fill_thr;
	int fill_thr_started;
	atomic_int fill_busy;
};

static void on_data_event(evutil_socket_t fd, short what, void *arg)
{
	hkv_listener_dispatch(((struct server *)arg)->data);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	hkv_info("server: %s, shutting down", strsignal((int)sig));
	event_base_loopbreak(((struct server *)arg)->base);
}

/* One token file read again for SIGHUP into buf; its length, or -1 (the
 * old token stays: a missing file is not made anew here). */
static int reload_token(const char *path, char *buf, size_t cap)
{
	char fresh[HKV_TOKEN_MAX + 1];
	int n;

	if (access(path, F_OK)) {
		hkv_err("server: SIGHUP: token file %s: %s; keeping the token in use", path,
			strerror(errno));
		return -1;
	}
	n = hkv_token_load(path, fresh, sizeof(fresh), 1); /* (checks owner and mode) */
	if (n < 0) {
		hkv_err("server: SIGHUP: token file %s: %s; keeping the token in use", path,
			hkv_strerror(n));
		return -1;
	}
	memcpy(buf, fresh, (size_t)n + 1);
	if ((size_t)n + 1 < cap)
		memset(buf + n + 1, 0, cap - (size_t)n - 1);
	sodium_memzero(fresh, sizeof(fresh));
	return n;
}

/* What SIGHUP applies (docs/operating.md, "Stop, restart, what survives"):
 * the log level and etcd's credentials and certificates. Every other option
 * changed in the --config file needs a restart (a line each says so). */
static int live_option(const char *name)
{
	return !strcmp(name, "verbose") ||
	       (!strncmp(name, "etcd-", 5) && strcmp(name, "etcd-insecure"));
}

/* The log level v asks for: debug with verbose, else HKV_LOG's (the
 * environment is the start's). "info" or "info -> debug" in buf. */
static void reload_level(char *const *v, char *buf, size_t cap)
{
	enum hkv_log_level was = hkv_log_get_level();
	enum hkv_log_level now = hkv_cli_value(v, "verbose") ? HKV_LOG_DEBUG : hkv_log_env_level();

	hkv_log_set_level(now);
	if (now == was)
		snprintf(buf, cap, "log level %s", hkv_log_level_name(now));
	else
		snprintf(buf, cap, "log level %s -> %s", hkv_log_level_name(was),
			 hkv_log_level_name(now));
}

/* The token files again (standalone): "token file changed" etc. in buf. */
static void reload_tokens(struct server *sv, char *buf, size_t cap)
{
	char old[HKV_TOKEN_MAX + 1];
	int n, ro = 0, changed;

	memcpy(old, sv->tok_buf, sizeof(old));
	n = reload_token(sv->o->token_file, sv->tok_buf, HKV_TOKEN_MAX + 1);
	if (n < 0) {
		snprintf(buf, cap, "token file kept (see above)");
		goto zero;
	}
	changed = (size_t)n != sv->tok_len || sodium_memcmp(old, sv->tok_buf, (size_t)n);
	sv->tok_len = (size_t)n;
	if (sv->o->ro_token_file) {
		memcpy(old, sv->ro_buf, sizeof(old));
		if ((ro = reload_token(sv->o->ro_token_file, sv->ro_buf, HKV_TOKEN_MAX + 1)) > 0) {
			changed |= (size_t)ro != sv->ro_len ||
				   sodium_memcmp(old, sv->ro_buf, (size_t)ro);
			sv->ro_len = (size_t)ro;
		}
	}
	hkv_ctl_set_tokens(sv->ctl, sv->tok_buf, sv->tok_len, sv->ro_len ? sv->ro_buf : NULL,
			   sv->ro_len);
	snprintf(buf, cap, "token file%s read again: %s%s (new clients authenticate with %s, "
		 "connected ones stay)", sv->o->ro_token_file ? "s" : "",
		 changed ? "changed" : "unchanged",
		 ro < 0 ? ", read-only token kept (see above)" : "",
		 sv->o->ro_token_file ? "them" : "it");
zero:
	sodium_memzero(old, sizeof(old));
}

/* etcd's credentials and certificates as v names them now. */
static void reload_etcd(struct server *sv, char *const *v, char *buf, size_t cap)
{
	static const char *const names[] = {"cacert", "cert", "key", "user", "password-file"};
	struct hkv_etcd_sec now = {0};
	char opt[32];

	for (int i = 0; i < 5; i++) {
		snprintf(opt, sizeof(opt), "etcd-%s", names[i]);
		if (hkv_cli_value(v, opt) && hkv_etcd_sec_set(&now, names[i], hkv_cli_value(v, opt))) {
			snprintf(buf, cap, "etcd: out of memory, nothing reloaded");
			goto free_sec;
		}
	}
	hkv_etcd_reload(&sv->o->etcd, &now, buf, cap);
free_sec:
	hkv_etcd_sec_free(&now);
}

/*
 * SIGHUP (issue 30): the --config file read again, and what can change
 * live applied - the log level; a standalone server's token files
 * (authentications from now on use them, connected clients keep their
 * connections); a member's etcd credentials and certificates (its token is
 * the cluster's and changes with it: docs/operating.md). One line says what
 * was read and what changed; one more per option that needs a restart.
 * SIGUSR1 and SIGUSR2 are logged and ignored (before, either killed the
 * server).
 */
static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	struct server *sv = arg;
	char level[64], tokens[200], etcd[200], **now;
	const char *file = hkv_cli_config_file();

	if (sig != SIGHUP) {
		hkv_info("server: %s ignored", strsignal((int)sig));
		return;
	}
	if (!(now = hkv_cli_values())) {
		hkv_err("server: SIGHUP: %s has errors (the lines before say which): nothing "
			"changed", file ? file : "the command line");
		return;
	}
	hkv_cli_values_diff(sv->opt_values, now, live_option, "server");
	reload_level(now, level, sizeof(level));
	if (sv->o->cluster.uri)
		snprintf(tokens, sizeof(tokens), "token: the cluster's, unchanged");
	else
		reload_tokens(sv, tokens, sizeof(tokens));
	if (sv->o->cluster.uri)
		reload_etcd(sv, now, etcd, sizeof(etcd));
	else
		etcd[0] = 0;
	hkv_info("server: SIGHUP: re-read %s%s; %s; %s%s%s", file ? file : "no --config file",
		 file ? "" : " (options as started)", level, tokens, etcd[0] ? "; " : "", etcd);
	hkv_cli_values_free(sv->opt_values);
	sv->opt_values = now;
}

static int start_data_plane(struct server *sv, struct server_opts *o);

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct server *sv = arg;

	hkv_store_tick(&sv->store);
	if (sv->data) { /* (none while fenced) */
		int dropped = hkv_listener_tick(sv->data);

		if (dropped > 0)
			sv->store.stats.keepalive_drops += (uint64_t)dropped;
	}
}

/* The region's clock word (common/layout.h, HKV_CLOCK_OFF). */
static void on_clock(evutil_socket_t fd, short what, void *arg)
{
	hkv_store_clock(&((struct server *)arg)->store);
}

static void on_slab_tick(evutil_socket_t fd, short what, void *arg)
{
	hkv_slab_tick(&((struct server *)arg)->store);
}

static int start_data_plane(struct server *sv, struct server_opts *o)
{
	struct hkv_listener_cfg lc = {
		.kind = o->kind,
		.host = o->host,
		.region = sv->store.region.base,
		.region_len = sv->store.region.length,
		.region_fd = sv->store.region.fd,
		.on_connect = hkv_store_on_connect,
		.on_disconnect = hkv_store_on_disconnect,
		.arg = &sv->store,
		.windows = !o->no_windows,
		.keepalive_ms = o->keepalive_ms,
	};

	snprintf(o->data_port, sizeof(o->data_port), "%d", atoi(o->port) + 1);
	snprintf(o->data_path, sizeof(o->data_path), "%s.data", o->socket_path);
	lc.port = o->data_port;
	lc.path = o->data_path;
	sv->data = hkv_listener_create(&lc);
	if (!sv->data) {
		int err = errno;

		if (o->kind == HKV_TRANSPORT_SHM)
			hkv_err("server: cannot start the shm data plane at %s: %s%s", o->data_path,
				hkv_strerror(-err),
				err == ENOENT ? " (does the --socket directory exist?)" : "");
		else
			hkv_err("server: cannot start the verbs data plane on %s port %s: %s",
				o->host, o->data_port, hkv_strerror(-err));
		return -1;
	}
	sv->store.data = sv->data;
	hkv_satom_attach(&sv->store.atom, sv->data); /* verbs: the server's atomics via the NIC */
	sv->ev_data = event_new(sv->base, hkv_listener_fd(sv->data), EV_READ | EV_PERSIST,
				on_data_event, sv);
	if (!sv->ev_data || event_add(sv->ev_data, NULL)) {
		hkv_satom_detach(&sv->store.atom);
		hkv_listener_destroy(sv->data);
		sv->data = sv->store.data = NULL;
		return -1;
	}
	return 0;
}

static void stop_data_plane(struct server *sv)
{
	if (sv->ev_data)
		event_free(sv->ev_data);
	sv->ev_data = NULL;
	hkv_satom_detach(&sv->store.atom);
	hkv_listener_destroy(sv->data); /* every client's connection closes here */
	sv->data = sv->store.data = NULL;
}

struct keep_arg {
	const struct hkv_cmap *map;
	const char *id;
};

static int keep_key(void *arg, const void *key, size_t klen)
{
	const struct keep_arg *k = arg;

	return hkv_cmap_holds(k->map, hkv_cmap_partition(k->map, key, klen), k->id);
}

static void drop_map(struct hkv_cmap **map)
{
	if (*map) {
		hkv_cmap_free(*map);
		hkv_free(*map);
	}
	*map = NULL;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int keep_gained(void *arg, const void *key, size_t klen)
{
	const struct hkv_cluster_job *j = arg;
	uint32_t p = hkv_cmap_partition(j->map, key, klen);

	return !(hkv_cmap_holds(j->map, p, j->self) && !hkv_cmap_holds(j->cur, p, j->self));
}

static uint64_t largest_value(const struct server *sv)
{
	return sv->store.geom->class_size[sv->store.geom->nclasses - 1];
}

static void log_fill(const char *what, const struct hkv_fill_stats *st, uint64_t t0, int ret)
{
	double ms = (double)(mono_ns() - t0) / 1e6;

	if (ret < 0)
		hkv_warn("server: repair %s failed after %.0f ms: %s", what, ms, hkv_strerror(ret));
	else
		hkv_info("server: repair %s: %llu items (%llu bytes, %.1f MB/s) copied of %llu seen, "
			 "%llu changing, %llu gone, %llu reclaimed copies taken back, %.0f ms", what,
			 (unsigned long long)st->items, (unsigned long long)st->bytes,
			 ms > 0 ? (double)st->bytes / 1e3 / ms : 0.0, (unsigned long long)st->seen,
			 (unsigned long long)st->skipped, (unsigned long long)st->unseen,
			 (unsigned long long)st->taken_back, ms);
}

/* Wait for the fill thread to end (it has, or was told to); its state and
 * handles are the loop's again. */
static void join_fill(struct server *sv)
{
	if (sv->fill_thr_started) {
		pthread_join(sv->fill_thr, NULL);
		sv->fill_thr_started = 0;
	}
}

/* shm: a client notices a closed socket at its next liveness check
 * (1-4 ms); let such late writes land before a fenced copy reads. */
static void let_late_writes_land(const struct server *sv)
{
	while (mono_ns() - sv->fenced_ns < 100000000ull)
		nanosleep(&(struct timespec){0, 10000000}, NULL);
}

/* An online pass stops once we are fenced (a lost lease, a move) or its
 * fill is gone: a stale source must not go on writing into a new replica. */
static int fill_halt(void *arg)
{
	struct server *sv = arg;

	return hkv_cluster_fenced(sv->cluster) ||
	       hkv_cluster_fill_rev(sv->cluster) != sv->fill_job->rev;
}

/* A repair's online pass, on a thread of its own: the loop serves on. */
static void *fill_thread(void *arg)
{
	struct server *sv = arg;
	struct hkv_cluster_job *job = sv->fill_job;
	struct hkv_fill_stats st;
	uint64_t t0 = mono_ns();
	int ret = hkv_fill_pass(sv->fill, &sv->store, job->cur, job->map, job->homes,
				hkv_cluster_id(sv->cluster), sv->token, largest_value(sv), 0,
				fill_halt, sv, &st);

	log_fill("pass", &st, t0, ret);
	sv->fill_job = NULL;
	hkv_cluster_job_done(sv->cluster, job, ret);
	hkv_cluster_job_free(job);
	atomic_store(&sv->fill_busy, 0);
	return NULL;
}

/* Start a repair's online pass (cluster.h HKV_JOB_FILL); 0 or an error. */
static int start_fill(struct server *sv, struct hkv_cluster_job *job)
{
	join_fill(sv);
	if (!hkv_fill_is(sv->fill, job->rev, job->tag)) { /* another fill: start over */
		hkv_fill_free(sv->fill);
		sv->fill = hkv_fill_new(job->rev, job->tag);
		if (!sv->fill)
			return -ENOMEM;
	}
	sv->fill_job = job;
	atomic_store(&sv->fill_busy, 1);
	if (pthread_create(&sv->fill_thr, NULL, fill_thread, sv)) {
		atomic_store(&sv->fill_busy, 0);
		sv->fill_job = NULL;
		return -EAGAIN;
	}
	sv->fill_thr_started = 1;
	return 0;
}

static void stop_fill(struct server *sv)
{
	if (atomic_load(&sv->fill_busy))
		hkv_fill_cancel(sv->fill);
	join_fill(sv);
	hkv_fill_free(sv->fill);
	sv->fill = NULL;
}

/* A replicated store's move is a repair's final pass, fenced: what changed
 * since the online passes goes to the new replicas. */
static int final_fill(struct server *sv, struct hkv_cluster_job *job)
{
	const char *id = hkv_cluster_id(sv->cluster);
	struct hkv_fill_stats st;
	uint64_t t0;
	int ret;

	if (!hkv_fill_source(job->cur, job->map, id))
		return 0; /* on a list that grows, copying nothing: fenced only */
	join_fill(sv); /* (done: fill_busy was 0) - its handles are ours now */
	if (!hkv_fill_is(sv->fill, job->fill_rev, job->tag ? job->tag : "")) {
		hkv_warn("server: the repair's final pass finds no online passes of fill %lld to "
			 "finish", (long long)job->fill_rev);
		return -ESTALE;
	}
	let_late_writes_land(sv);
	t0 = mono_ns();
	ret = hkv_fill_pass(sv->fill, &sv->store, job->cur, job->map, job->homes, id, sv->token,
			    largest_value(sv), 1, NULL, NULL, &st);
	log_fill("final pass (fenced)", &st, t0, ret);
	return ret < 0 ? ret : 0;
}

/* What the cluster asks of the region (cluster.h); 0 or an error. */
static int run_job(struct server *sv, struct hkv_cluster_job *job)
{
	const char *id = hkv_cluster_id(sv->cluster);
	struct keep_arg k = {job->map, id};
	uint64_t t0 = mono_ns(), n;

	switch (job->kind) {
	case HKV_JOB_PURGE:
		n = hkv_store_purge(&sv->store, keep_key, &k);
		hkv_info("server: purged %llu items of partitions not ours (%.0f ms)",
			 (unsigned long long)n, (double)(mono_ns() - t0) / 1e6);
		if (job->rev > 0 && !hkv_cluster_store_mode(sv->cluster) &&
		    sv->o->kind == HKV_TRANSPORT_SHM) { /* cache mode: again before serving */
			drop_map(&sv->repurge);
			sv->repurge = job->map;
			job->map = NULL;
		}
		return 0;
	case HKV_JOB_INTAKE:
		job->self = id;
		n = hkv_store_purge(&sv->store, keep_gained, job);
		if (n)
			hkv_warn("server: dropped %llu items left by a move that never committed",
				 (unsigned long long)n);
		return 0;
	case HKV_JOB_COPY:
		if (job->cur && job->cur->replicas > 1)
			return final_fill(sv, job);
		let_late_writes_land(sv);
		/* in slices of this loop; it answers the job itself (server/mover.h) */
		return hkv_move_start(sv->base, &sv->store, sv->cluster, job, id, sv->token,
				      largest_value(sv));
	case HKV_JOB_FILL: /* (on_cluster starts it on a thread) */
		break;
	}
	return -EINVAL;
}

/* Cluster: every 100 ms, fence or unfence as the lease says, and do what
 * the cluster asks of the region (cluster.h). */
static void on_cluster(evutil_socket_t fd, short what, void *arg)
{
	struct server *sv = arg;
	struct hkv_cluster_job *job;
	int fenced;

	if (hkv_cluster_removed(sv->cluster)) {
		hkv_warn("server: removed from the cluster, shutting down");
		stop_data_plane(sv); /* serve nobody before the lease is given back */
		sv->store.fenced = 1;
		event_base_loopbreak(sv->base);
		return;
	}
	fenced = hkv_cluster_fenced(sv->cluster);
	if (fenced && !sv->store.fenced) {
		hkv_warn("server: fenced (%s): closing %d client connections",
			 hkv_cluster_fence_reason(sv->cluster), hkv_listener_nconns(sv->data));
		hkv_notify_status("fenced: %s", hkv_cluster_fence_reason(sv->cluster));
		stop_data_plane(sv);
		sv->store.fenced = 1;
		sv->fenced_ns = mono_ns();
	}
	if (hkv_cluster_rejoined(sv->cluster) == HKV_REJOIN_EMPTY &&
	    !hkv_cluster_store_mode(sv->cluster)) {
		/* the map changed while our lease was gone: our partitions may
		 * have moved meanwhile and what we hold may be stale, so come back
		 * empty (store mode settles instead: it drops what the map no
		 * longer places on it). The same map: nothing moved, keep it. */
		struct hkv_store_stats stats = sv->store.stats; /* the metrics count on */

		hkv_store_fini(&sv->store);
		if (hkv_store_init(&sv->store, &sv->o->store)) {
			hkv_err("server: cannot make the region again");
			sv->rc = 1;
			event_base_loopbreak(sv->base);
			return;
		}
		sv->store.stats = stats;
		sv->store.fenced = 1;
		hkv_info("server: region emptied after the lost lease");
	}
	if (!atomic_load(&sv->fill_busy) && (job = hkv_cluster_take_job(sv->cluster))) {
		int ret;

		if (job->kind == HKV_JOB_FILL) {
			if (!(ret = start_fill(sv, job)))
				return; /* the thread answers */
			hkv_cluster_job_done(sv->cluster, job, ret);
			hkv_cluster_job_free(job);
			return;
		}
		hkv_cluster_job_done(sv->cluster, job, run_job(sv, job));
		hkv_cluster_job_free(job);
		return; /* (the fence may have changed meanwhile) */
	}
	if (fenced)
		return;
	if (sv->store.fenced && sv->repurge) {
		/* shm: a client maps the region and notices a closed socket only
		 * at its next liveness check (1-4 ms); what such a late write put
		 * into a partition we gave up goes now, before anyone is served */
		struct keep_arg k = {sv->repurge, hkv_cluster_id(sv->cluster)};
		uint64_t n = hkv_store_purge(&sv->store, keep_key, &k);

		if (n)
			hkv_warn("server: purged %llu late items of the partitions it gave up",
				 (unsigned long long)n);
		drop_map(&sv->repurge);
	}
	if (sv->store.fenced && !start_data_plane(sv, sv->o)) {
		sv->store.fenced = 0;
		hkv_info("server: serving again");
		hkv_notify_status("serving");
	}
}

/*
 * A member's region hashes keys into buckets with a key of its own (issue
 * 28, item 2): HMAC-SHA-256 keyed by the cluster's token over "hatchkv
 * region key" || the identity's hash key, cut to 16 bytes. Etcd holds only
 * the partition hash key: reading it lets one aim keys at a partition (a
 * server), not at a bucket. Every member on the token derives the same key;
 * clients read it from the header after they authenticate. A region keeps
 * the key it was made with (its header, FILE.geom), so rotating the token
 * re-homes nothing.
 */
static void region_key(const uint8_t cluster_key[16], const char *token, size_t tlen,
		       uint8_t out[16])
{
	crypto_auth_hmacsha256_state st;
	uint8_t mac[crypto_auth_hmacsha256_BYTES];

	crypto_auth_hmacsha256_init(&st, (const uint8_t *)token, tlen);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"hatchkv region key", 18);
	crypto_auth_hmacsha256_update(&st, cluster_key, 16);
	crypto_auth_hmacsha256_final(&st, mac);
	memcpy(out, mac, 16);
	sodium_memzero(mac, sizeof(mac));
}

/* Does a process accept connections at the unix socket path? (A second
 * server on one --socket would unlink and take over the first's sockets:
 * the first kept its data, unreachable, and lost them when the second
 * exited and deleted the files.) */
static int socket_live(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd, live;

	if (strlen(path) >= sizeof(sun.sun_path))
		return 0; /* (the control plane says it is too long) */
	memcpy(sun.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	live = !connect(fd, (struct sockaddr *)&sun, sizeof(sun));
	close(fd);
	return live;
}

/*
 * A member joins only on the cluster's token (issue 28, item 4). A token the
 * package made up on this host by itself (TOKEN.package beside it) is
 * refused: the package cannot know a cluster will be configured. A token
 * whose check differs from PREFIX/token_check is refused and recorded in
 * PREFIX/refused/ID for hatchkv-admin members. 0, or the exit status
 * (EXIT_CONFIG: the member unit does not restart it).
 */
#define EXIT_CONFIG 78

static int member_token_ok(struct hkv_etcd *e, const struct server_opts *o, const char *token,
			   size_t tlen)
{
	char marker[4096], key[400], why[300];
	int ret;

	snprintf(marker, sizeof(marker), "%s.package", o->token_file);
	if (!access(marker, F_OK)) {
		hkv_err("server: %s was made up by the package on this host (%s says so); a cluster "
			"member needs the cluster's token: copy it from a member to %s (0600, the "
			"server's user) and delete %s on every host (docs/operating.md, \"One token "
			"for a cluster\")", o->token_file, marker, o->token_file, marker);
		snprintf(why, sizeof(why), "{\"why\":\"its token was made by the package on its "
			 "host\",\"at\":%lld}", (long long)time(NULL));
		ret = HKV_EAUTH;
	} else {
		ret = hkv_cmap_token_check(e, token, tlen);
		if (ret && ret != HKV_EAUTH) {
			hkv_err("server: cannot check the cluster's token at %s: %s", o->cluster.uri,
				hkv_strerror(ret));
			return 1;
		}
		if (ret)
			hkv_err("server: %s is not the cluster's token (it fails %s/token_check): "
				"refusing to join; copy the token of a member to every host "
				"(docs/operating.md, \"One token for a cluster\")", o->token_file,
				hkv_etcd_prefix(e));
		snprintf(why, sizeof(why), "{\"why\":\"its token is not the cluster's\",\"at\":%lld}",
			 (long long)time(NULL));
	}
	snprintf(key, sizeof(key), "%s/refused/%s", hkv_etcd_prefix(e), o->cluster.id);
	if (!ret) {
		hkv_etcd_delete(e, key, 0, NULL); /* (a refusal of before is over) */
		return 0;
	}
	hkv_etcd_put(e, key, why, strlen(why), 0, NULL);
	return EXIT_CONFIG;
}

/*
 * The descriptor budget (issue 28, item 6): the soft limit raised to the
 * hard one. On shm every connected client holds a descriptor (its data
 * socket), so --max-clients is capped below what is left after the control
 * plane's 256 connections, the metrics endpoint's 64 and a reserve; a
 * flood is then refused at the caps with a line, never by running out.
 */
static void size_clients(struct server_opts *o)
{
	long lim = hkv_fd_limit_raise("hatchkv-server");
	long room = lim - HKV_CTL_MAX_CONNS - 64 - 128;

	if (o->kind != HKV_TRANSPORT_SHM)
		return;
	if (room < 8)
		room = 8;
	if (!o->store.max_clients || o->store.max_clients > room) {
		hkv_warn("server: --max-clients %u is more than %ld descriptors allow on shm (%ld "
			 "in all); using %ld", o->store.max_clients, room, lim, room);
		o->store.max_clients = (uint32_t)room;
	}
}

int main(int argc, char **argv)
{
	struct server_opts o = {
		.keepalive_ms = HKV_PROBE_INTERVAL_MS,
		.cluster = {.ttl_s = 5, .partitions = 64, .replicas = 1},
		.host = "0.0.0.0",
		.port = "7700",
		.socket_path = NULL, /* hkv_default_socket() */
		.token_file = "hatchkv.token",
		.store = {.memory = 1ull << 30, .max_clients = 1024}, /* seg_size 0: by memory */
	};
	struct hkv_ctl_opts co;
	struct server sv = {0};
	struct hkv_server_metrics sm = {.started = hkv_metrics_unix_now()};
	struct event *ev_int, *ev_term, *ev_tick, *ev_idle, *ev_clock, *ev_cluster = NULL;
	struct event *ev_hup, *ev_usr1, *ev_usr2;
	struct timeval clock_tick = {0, HKV_CLOCK_TICK_MS * 1000};
	struct timeval one_sec = {1, 0};
	struct timeval sweep = {0, HKV_SLAB_TICK_MS * 1000};
	struct timeval cluster_poll = {0, 100 * 1000};
	char endpoint[300];
	char token[HKV_TOKEN_MAX + 1], ro_token[HKV_TOKEN_MAX + 1], default_socket[300];
	uint8_t cluster_key[16], region_hash_key[16];
	int tlen, ro_len = 0, rc = 1;

	hkv_log_set_prog("hatchkv-server");
	signal(SIGPIPE, SIG_IGN);
	if (parse_args(argc, argv, &o))
		return 2;
	if (!o.kind)
		o.kind = hkv_verbs_available() ? HKV_TRANSPORT_VERBS : HKV_TRANSPORT_SHM;
	size_clients(&o);
	if (!o.socket_path) {
		if (hkv_default_socket(default_socket, sizeof(default_socket),
				       o.kind == HKV_TRANSPORT_SHM))
			return 1;
		o.socket_path = default_socket;
	}
	tlen = hkv_token_load(o.token_file, token, sizeof(token), 1);
	if (tlen < 0) {
		hkv_err("server: token file %s: %s", o.token_file, hkv_strerror(tlen));
		return 1;
	}
	if (o.ro_token_file &&
	    (ro_len = hkv_token_load(o.ro_token_file, ro_token, sizeof(ro_token), 1)) < 0) {
		hkv_err("server: read-only token file %s: %s", o.ro_token_file, hkv_strerror(ro_len));
		return 1;
	}
	if (o.cluster.uri) { /* the cluster's key hash secret, for our region too */
		struct hkv_etcd *e = hkv_etcd_open_sec(o.cluster.uri, &o.etcd, 3000);
		uint32_t parts;
		int store_mode = 0;
		int ret = e ? hkv_cmap_identity_get(e, o.cluster.partitions, !o.store.cache_mode,
						    o.cluster.replicas, &parts, cluster_key, &store_mode,
						    &o.cluster.replicas)
			    : -errno;

		if (!ret && (ret = member_token_ok(e, &o, token, (size_t)tlen))) {
			hkv_etcd_close(e);
			return ret;
		}
		hkv_etcd_close(e);
		if (ret) {
			hkv_err("server: cannot read the cluster's identity at %s: %s", o.cluster.uri,
				hkv_strerror(ret));
			return 1;
		}
		if (store_mode == o.store.cache_mode) {
			hkv_err("server: the cluster at %s runs in %s mode: start this server %s",
				o.cluster.uri, store_mode ? "store" : "cache",
				store_mode ? "without --cache" : "with --cache");
			return 1;
		}
		o.cluster.store_mode = store_mode;
		region_key(cluster_key, token, (size_t)tlen, region_hash_key);
		o.store.hash_key = region_hash_key;
	}
	if (o.kind == HKV_TRANSPORT_SHM && socket_live(o.socket_path)) {
		hkv_err("server: another server is serving at %s; not taking it over (stop it "
			"first, or give this one another --socket)", o.socket_path);
		return 1;
	}
	hkv_region_set_progress(hkv_notify_region_progress, "hatchkv-server");
	if (hkv_store_init(&sv.store, &o.store))
		return 1;
	sv.o = &o;
	sv.base = event_base_new();
	sv.token = token;
	sv.store.fenced = o.cluster.uri && o.cluster.store_mode; /* serves once settled */
	if (!sv.base || (!sv.store.fenced && start_data_plane(&sv, &o)))
		goto out;
	co = (struct hkv_ctl_opts){.kind = o.kind, .host = o.host, .port = o.port,
				   .path = o.socket_path, .token = token, .token_len = (size_t)tlen,
				   .ro_token = ro_len > 0 ? ro_token : NULL, .ro_token_len = (size_t)ro_len,
				   .data_endpoint = o.kind == HKV_TRANSPORT_SHM ? o.data_path : o.data_port};
	sv.ctl = hkv_ctl_create(sv.base, &sv.store, &co);
	if (!sv.ctl) {
		hkv_err("server: cannot listen for control connections: %s", strerror(errno));
		goto out;
	}
	if (o.metrics) {
		sm.store = &sv.store;
		sm.transport = o.kind == HKV_TRANSPORT_SHM ? "shm" : "verbs";
		sm.cluster = o.cluster.uri != NULL;
		sv.metrics = hkv_metrics_start(sv.base, o.metrics, hkv_server_metrics_page, &sm);
		if (!sv.metrics) {
			hkv_err("server: cannot serve metrics on %s: %s", o.metrics, strerror(errno));
			goto out;
		}
		hkv_info("server: metrics at %s", hkv_metrics_url(sv.metrics));
	}
	if (o.cluster.uri) {
		if (!o.cluster.endpoint) {
			if (o.kind == HKV_TRANSPORT_SHM)
				snprintf(endpoint, sizeof(endpoint), "shm:%s", o.socket_path);
			else if (strcmp(o.host, "0.0.0.0"))
				snprintf(endpoint, sizeof(endpoint), "verbs://%s:%s", o.host, o.port);
			else {
				hkv_err("server: --cluster over verbs needs --advertise or --listen ADDR");
				goto out;
			}
			o.cluster.endpoint = endpoint;
		}
		o.cluster.etcd = &o.etcd;
		o.cluster.transport = o.kind == HKV_TRANSPORT_SHM ? "shm" : "verbs";
		o.cluster.region_bytes = sv.store.region.length;
		sv.cluster = hkv_cluster_start(&o.cluster);
		if (!sv.cluster) {
			int err = errno;

			hkv_err("server: cannot join the cluster at %s as %s: %s", o.cluster.uri,
				o.cluster.id, err == EEXIST ? "a live member has that name"
					      : err == EPERM ? "that name was removed by an operator "
							       "(hatchkv-admin admit NAME undoes it)"
					      : err == EACCES ? "etcd refuses this user what a member "
								"writes (its role)"
							      : hkv_strerror(-err));
			/* a removed name or a role that cannot write: starting again
			 * changes nothing, so the member unit must not restart it */
			if (err == EPERM || err == EACCES || err == EKEYREJECTED)
				rc = EXIT_CONFIG;
			goto out;
		}
		sm.cl = sv.cluster; /* (its figures on the metrics page) */
		ev_cluster = event_new(sv.base, -1, EV_PERSIST, on_cluster, &sv);
		event_add(ev_cluster, &cluster_poll);
	}
	ev_int = evsignal_new(sv.base, SIGINT, on_signal, &sv);
	ev_term = evsignal_new(sv.base, SIGTERM, on_signal, &sv);
	ev_hup = evsignal_new(sv.base, SIGHUP, on_hup, &sv);
	ev_usr1 = evsignal_new(sv.base, SIGUSR1, on_hup, &sv);
	ev_usr2 = evsignal_new(sv.base, SIGUSR2, on_hup, &sv);
	sv.tok_buf = token;
	sv.tok_len = (size_t)tlen;
	sv.ro_buf = ro_token;
	sv.ro_len = ro_len > 0 ? (size_t)ro_len : 0;
	sv.opt_values = hkv_cli_values(); /* (what a SIGHUP compares with; NULL: all new) */
	event_add(ev_hup, NULL);
	event_add(ev_usr1, NULL);
	event_add(ev_usr2, NULL);
	ev_tick = event_new(sv.base, -1, EV_PERSIST, on_tick, &sv);
	ev_idle = event_new(sv.base, -1, EV_PERSIST, on_slab_tick, &sv);
	ev_clock = event_new(sv.base, -1, EV_PERSIST, on_clock, &sv);
	hkv_store_clock(&sv.store);
	event_add(ev_clock, &clock_tick);
	event_add(ev_int, NULL);
	event_add(ev_term, NULL);
	event_add(ev_tick, &one_sec);
	event_add(ev_idle, &sweep);
	if (o.kind == HKV_TRANSPORT_SHM)
		hkv_info("server: ready, transport shm, control socket %s", o.socket_path);
	else
		hkv_info("server: ready, transport verbs, control %s:%s, rdma_cm port %s", o.host,
			 o.port, o.data_port);
	hkv_notify_ready(o.cluster.uri ? "serving (a cluster member)" : "serving");
	event_base_dispatch(sv.base);
	hkv_notify_stopping();
	if (ev_cluster)
		event_free(ev_cluster);
	event_free(ev_idle);
	event_free(ev_clock);
	event_free(ev_tick);
	event_free(ev_term);
	event_free(ev_int);
	event_free(ev_hup);
	event_free(ev_usr1);
	event_free(ev_usr2);
	rc = sv.rc;
out:
	/* clients first: only a server that serves nobody gives its lease back
	 * (after which its partitions may move at once) */
	stop_data_plane(&sv);
	sv.store.fenced = 1;
	stop_fill(&sv);
	hkv_cluster_stop(sv.cluster);
	drop_map(&sv.repurge);
	hkv_metrics_stop(sv.metrics);
	hkv_ctl_destroy(sv.ctl);
	if (sv.base)
		event_base_free(sv.base);
	hkv_store_fini(&sv.store);
	hkv_cli_values_free(sv.opt_values);
	hkv_etcd_sec_free(&o.etcd);
	return rc;
}
