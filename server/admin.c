/*
 * hatchkv-admin - look at and steer a hatchkv cluster kept in etcd
 * (common/cluster_map.h). Talks to etcd only, never to the servers.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "common/cli.h"
#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "server/admin_status.h"
#include "hatchkv_err.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hatchkv-admin --cluster etcd://HOST:PORT[,HOST:PORT...]/PREFIX COMMAND\n"
		"       hatchkv-admin --server shm:PATH|verbs://HOST:PORT [--token-file F] status|health\n"
		"  status             a report: members, partitions by role, moves and repairs\n"
		"                     under way with each copy's bytes done, what is wrong; exit\n"
		"                     0 healthy, 1 degraded, 2 down (a standalone server: its\n"
		"                     region, reached with a token or read-only token)\n"
		"  health             the same verdict in one line\n"
		"  members            the servers, their endpoints, partitions and state\n"
		"  map                the partition map: epoch, then each partition's replicas\n"
		"  drain NAME         move NAME's partitions to the others (it stays a member);\n"
		"                     waits up to --wait seconds (default 30) for the map\n"
		"  undrain NAME       let NAME hold partitions again\n"
		"  remove NAME        NAME leaves for good: its server shuts down, its\n"
		"                     partitions move; the name cannot register again.\n"
		"                     A store-mode cluster drains a live NAME first (its\n"
		"                     items move); a dead one that still holds partitions\n"
		"                     is refused unless --force (its items are lost)\n"
		"  admit NAME         undo remove (and drain) for NAME\n"
		"options: --wait SECONDS, --force, --json (status, health, members, map),\n"
		"  --token-file F (with --server; default hatchkv.token), -h/--help\n"
		HKV_CONFIG_USAGE
		"etcd (the operator role's user, over TLS; or --etcd-insecure):\n" HKV_ETCD_USAGE);
}

struct admin {
	struct hkv_etcd *e;
	const char *prefix;
};

static int load_map(struct admin *a, struct hkv_cmap *map)
{
	char key[512];
	struct hkv_etcd_kv *kvs;
	int n, ret;

	snprintf(key, sizeof(key), "%s/map", a->prefix);
	ret = hkv_etcd_range(a->e, key, 0, &kvs, &n, NULL);
	if (ret)
		return ret;
	if (!n)
		return -ENOENT;
	ret = hkv_cmap_parse(kvs[0].value, kvs[0].vlen, map);
	if (!ret)
		map->epoch = kvs[0].mod_rev;
	hkv_etcd_kvs_free(kvs, n);
	return ret;
}

static uint32_t primaries_of(const struct hkv_cmap *map, const char *id)
{
	uint32_t n = 0;

	for (uint32_t p = 0; map->names && p < map->partitions; p++)
		n += !strcmp(hkv_cmap_server(map, p, 0), id);
	return n;
}

static int has_key(struct admin *a, const char *dir, const char *id)
{
	char key[512];
	struct hkv_etcd_kv *kvs;
	int n;

	snprintf(key, sizeof(key), "%s/%s/%s", a->prefix, dir, id);
	if (hkv_etcd_range(a->e, key, 0, &kvs, &n, NULL))
		return 0;
	hkv_etcd_kvs_free(kvs, n);
	return n > 0;
}

static void human(uint64_t b, char *out, size_t cap)
{
	if (b >= (1ull << 30) && !(b & ((1ull << 30) - 1)))
		snprintf(out, cap, "%llu GiB", (unsigned long long)(b >> 30));
	else
		snprintf(out, cap, "%llu MiB", (unsigned long long)(b >> 20));
}

/* Servers that refused to join (PREFIX/refused/ID: {"why", "at"}), with why. */
static void print_refused(struct admin *a)
{
	char key[512];
	struct hkv_etcd_kv *kvs;
	int n;

	snprintf(key, sizeof(key), "%s/refused/", a->prefix);
	if (hkv_etcd_range(a->e, key, 1, &kvs, &n, NULL))
		return;
	for (int i = 0; i < n; i++) {
		const char *why = strstr(kvs[i].value, "\"why\":\""), *end;
		int len = 0;

		if (why) {
			why += 7;
			end = strchr(why, '"');
			len = end ? (int)(end - why) : 0;
		}
		printf("%-16s refused to join: %.*s\n", kvs[i].key + strlen(key), len,
		       len ? why : "(no reason recorded)");
	}
	hkv_etcd_kvs_free(kvs, n);
}

static int cmd_members(struct admin *a)
{
	char key[512], coord[HKV_CLUSTER_ID_MAX] = "";
	struct hkv_etcd_kv *kvs, *ck;
	struct hkv_cmap map = {0};
	int n, nc, ret, w = 8;

	snprintf(key, sizeof(key), "%s/coordinator", a->prefix);
	if (!hkv_etcd_range(a->e, key, 0, &ck, &nc, NULL)) {
		if (nc)
			snprintf(coord, sizeof(coord), "%s", ck[0].value);
		hkv_etcd_kvs_free(ck, nc);
	}
	ret = load_map(a, &map);
	if (ret && ret != -ENOENT)
		return fprintf(stderr, "hatchkv-admin: map: %s\n", hkv_strerror(ret)), ret;
	snprintf(key, sizeof(key), "%s/servers/", a->prefix);
	ret = hkv_etcd_range(a->e, key, 1, &kvs, &n, NULL);
	if (ret)
		return fprintf(stderr, "hatchkv-admin: members: %s\n", hkv_strerror(ret)), ret;
	for (int i = 0; i < n; i++) { /* the endpoint column as wide as its longest */
		struct hkv_cmember m;

		if (!hkv_cmember_parse(kvs[i].value, kvs[i].vlen, &m) && (int)strlen(m.endpoint) > w)
			w = (int)strlen(m.endpoint);
	}
	printf("%-16s %-*s %-9s %-9s %-10s %s\n", "NAME", w, "ENDPOINT", "TRANSPORT", "REGION",
	       "PARTITIONS", "STATE");
	for (int i = 0; i < n; i++) {
		struct hkv_cmember m;
		char region[32];

		if (hkv_cmember_parse(kvs[i].value, kvs[i].vlen, &m)) {
			printf("%-16s (not a member record)\n", kvs[i].key + strlen(key));
			continue;
		}
		human(m.region_bytes, region, sizeof(region));
		printf("%-16s %-*s %-9s %-9s %-10u %s%s\n", m.id, w, m.endpoint, m.transport, region,
		       primaries_of(&map, m.id), has_key(a, "drain", m.id) ? "draining" : "serving",
		       strcmp(coord, m.id) ? "" : ", coordinator");
	}
	if (!n)
		printf("(no members)\n");
	printf("map epoch %lld, %u partitions\n", (long long)map.epoch, map.partitions);
	hkv_etcd_kvs_free(kvs, n);
	hkv_cmap_free(&map);
	print_refused(a);
	return 0;
}

static int cmd_map(struct admin *a)
{
	struct hkv_cmap map;
	int ret = load_map(a, &map);

	if (ret)
		return fprintf(stderr, "hatchkv-admin: map: %s\n",
			       ret == -ENOENT ? "no map yet (no server has joined)"
					      : hkv_strerror(ret)), ret;
	printf("map epoch %lld: %u partitions, %u replica%s each\n", (long long)map.epoch,
	       map.partitions, map.replicas, map.replicas > 1 ? "s" : "");
	printf("%-10s %s\n", "PARTITION", "REPLICAS (primary first)");
	for (uint32_t p = 0; p < map.partitions; p++) {
		printf("%-10u", p);
		for (uint32_t r = 0; r < hkv_cmap_len(&map, p); r++)
			printf(" %s", hkv_cmap_server(&map, p, r));
		printf("\n");
	}
	hkv_cmap_free(&map);
	return 0;
}

static int cmd_map_json(struct admin *a)
{
	struct hkv_cmap map;
	json_object *o, *lists;
	int ret = load_map(a, &map);

	if (ret)
		return fprintf(stderr, "hatchkv-admin: map: %s\n",
			       ret == -ENOENT ? "no map yet (no server has joined)"
					      : hkv_strerror(ret)), ret;
	o = json_object_new_object();
	lists = json_object_new_array();
	json_object_object_add(o, "epoch", json_object_new_int64(map.epoch));
	json_object_object_add(o, "partitions", json_object_new_int((int)map.partitions));
	json_object_object_add(o, "replicas", json_object_new_int((int)map.replicas));
	for (uint32_t p = 0; p < map.partitions; p++) {
		json_object *l = json_object_new_array();

		for (uint32_t r = 0; r < hkv_cmap_len(&map, p); r++)
			json_object_array_add(l, json_object_new_string(hkv_cmap_server(&map, p, r)));
		json_object_array_add(lists, l);
	}
	json_object_object_add(o, "lists", lists);
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	hkv_cmap_free(&map);
	return 0;
}

static int put_flag(struct admin *a, const char *dir, const char *id)
{
	char key[512];

	snprintf(key, sizeof(key), "%s/%s/%s", a->prefix, dir, id);
	return hkv_etcd_put(a->e, key, "1", 1, 0, NULL);
}

static int del_key(struct admin *a, const char *dir, const char *id)
{
	char key[512];

	snprintf(key, sizeof(key), "%s/%s/%s", a->prefix, dir, id);
	return hkv_etcd_delete(a->e, key, 0, NULL);
}

/* Delete dir/id; *was: whether it was there. */
static int del_key_was(struct admin *a, const char *dir, const char *id, int *was)
{
	char key[512];
	int64_t n = 0;
	int ret;

	snprintf(key, sizeof(key), "%s/%s/%s", a->prefix, dir, id);
	ret = hkv_etcd_delete(a->e, key, 0, &n);
	*was = n > 0;
	return ret;
}

/* Is there a cluster at the prefix (an identity)? 0, or -ENOENT said. */
static int cluster_there(struct admin *a)
{
	char key[512];
	struct hkv_etcd_kv *kvs;
	int n, ret;

	snprintf(key, sizeof(key), "%s/identity", a->prefix);
	ret = hkv_etcd_range(a->e, key, 0, &kvs, &n, NULL);
	if (ret)
		return ret;
	hkv_etcd_kvs_free(kvs, n);
	if (n)
		return 0;
	fprintf(stderr, "hatchkv-admin: no cluster at prefix '%s' in this etcd (no %s): is the "
			"prefix right?\n", a->prefix, key);
	return -ENOENT;
}

/* Does the cluster know id (a member now, or a name in the map)? Else say
 * so: a ban on a mistyped name would sit in etcd, shown nowhere. */
static int known_name(struct admin *a, const char *id, int force)
{
	struct hkv_cmap map;
	int in_map = 0;

	if (force || has_key(a, "servers", id))
		return 0;
	if (!load_map(a, &map)) {
		for (uint32_t i = 0; i < map.nnames; i++)
			in_map |= !strcmp(map.names[i], id);
		hkv_cmap_free(&map);
	}
	if (in_map)
		return 0;
	fprintf(stderr, "hatchkv-admin: no member and no map entry is named '%s' (see "
			"`hatchkv-admin members`); pass --force to act on the name anyway\n", id);
	return -ENOENT;
}

/* Is the cluster a store (its identity says so)? 1, 0, or an error; and
 * its replicas (if repl is not NULL). */
static int store_mode_r(struct admin *a, uint32_t *repl)
{
	char key[512];
	struct hkv_etcd_kv *kvs;
	uint32_t parts;
	uint8_t hk[16];
	int n, ret, store = 0;

	snprintf(key, sizeof(key), "%s/identity", a->prefix);
	ret = hkv_etcd_range(a->e, key, 0, &kvs, &n, NULL);
	if (ret)
		return ret;
	if (n)
		ret = hkv_cmap_identity_parse(kvs[0].value, kvs[0].vlen, &parts, hk, &store, repl);
	hkv_etcd_kvs_free(kvs, n);
	return ret ? ret : store;
}

static int store_mode(struct admin *a)
{
	return store_mode_r(a, NULL);
}

/* A replicated store cannot move partitions yet (filling a new replica is
 * not built): 1 if the cluster is one. */
static int replicated(struct admin *a)
{
	uint32_t repl = 1;

	return store_mode_r(a, &repl) > 0 && repl > 1;
}

static int wait_off(struct admin *a, const char *id, int wait_s);

/* Store mode: a partition's items exist only on its server, so a live one
 * is drained (its items move) before it goes; a dead one that still holds
 * partitions would take them along: only with --force. */
static int remove_safely(struct admin *a, const char *id, int wait_s, int force)
{
	struct hkv_cmap map;
	uint32_t held = 0;
	int ret = store_mode(a);

	if (ret <= 0)
		return ret;
	if (replicated(a)) {
		/* its partitions' other replicas serve on; unless it is the last */
		if (!load_map(a, &map)) {
			for (uint32_t p = 0; p < map.partitions; p++)
				held += hkv_cmap_len(&map, p) == 1 && hkv_cmap_holds(&map, p, id);
			hkv_cmap_free(&map);
		}
		if (!held || force)
			return 0;
		fprintf(stderr, "hatchkv-admin: %s is the last replica of %u partitions; their "
				"items live only there (pass --force to give them up)\n", id, held);
		return -EBUSY;
	}
	if (!load_map(a, &map)) {
		held = primaries_of(&map, id);
		hkv_cmap_free(&map);
	}
	if (!held || force)
		return 0;
	if (has_key(a, "servers", id)) {
		printf("%s holds %u partitions of a store-mode cluster: draining it first\n", id,
		       held);
		ret = put_flag(a, "drain", id);
		return ret ? ret : wait_off(a, id, wait_s);
	}
	fprintf(stderr, "hatchkv-admin: %s is down and still holds %u partitions of a "
			"store-mode cluster; their items live only there. Start it again "
			"(its --memory-file) and remove it then, or pass --force to give its "
			"partitions away without their items\n", id, held);
	return -EBUSY;
}

/* Wait until the map places nothing on id. */
static int wait_off(struct admin *a, const char *id, int wait_s)
{
	struct timespec t0, t;
	struct hkv_cmap map;
	uint32_t before = 0;
	int first = 1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		uint32_t left = 0;
		double ms;

		if (!load_map(a, &map)) {
			left = primaries_of(&map, id);
			hkv_cmap_free(&map);
		}
		if (first)
			before = left;
		first = 0;
		clock_gettime(CLOCK_MONOTONIC, &t);
		ms = (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6;
		if (!left) {
			printf("%s holds no partition (%u moved off it, %.0f ms)\n", id, before, ms);
			return 0;
		}
		if (ms > wait_s * 1000.0) {
			fprintf(stderr, "hatchkv-admin: %s still holds %u partitions after %d s "
					"(is a coordinator running?)\n", id, left, wait_s);
			return -ETIMEDOUT;
		}
		usleep(100000);
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
					      {"wait", required_argument, NULL, 'w'},
					      {"force", no_argument, NULL, 'f'},
					      {"help", no_argument, NULL, 'h'},
					      {"version", no_argument, NULL, 'V'},
					      {"json", no_argument, NULL, 'j'},
					      {"server", required_argument, NULL, 'S'},
					      {"token-file", required_argument, NULL, 'k'},
					      HKV_ETCD_LONGOPTS,
					      {NULL, 0, NULL, 0}};
	const char *uri = getenv("HATCHKV_CLUSTER"), *cmd, *id = NULL;
	const char *server = NULL, *token_file = "hatchkv.token";
	struct hkv_etcd_sec sec = {0};
	struct admin a;
	int wait_s = 30, force = 0, json = 0, status, c, ret;

	hkv_log_set_prog("hatchkv-admin");
	if (hkv_cli_config(&argc, &argv, opts, "hatchkv-admin"))
		return 2;
	while ((c = getopt_long(argc, argv, "c:w:fVh", opts, NULL)) != -1) {
		switch (c) {
		case 'f': force = 1; break;
		case 'c': uri = optarg; break;
		case 'w': wait_s = atoi(optarg); break;
		case 'j': json = 1; break;
		case 'S': server = optarg; break;
		case 'k': token_file = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'V': hkv_print_version(stdout, "hatchkv-admin"); return 0;
		default:
			if ((ret = hkv_etcd_sec_opt(&sec, c, optarg)) > 0)
				break;
			if (ret < 0)
				fprintf(stderr, "hatchkv-admin: bad value '%s'\n", optarg);
			usage(stderr);
			return 2;
		}
	}
	if ((!uri && !server) || optind >= argc)
		return usage(stderr), 2;
	cmd = argv[optind++];
	if (optind < argc)
		id = argv[optind++];
	status = !strcmp(cmd, "status") || !strcmp(cmd, "health");
	if (optind != argc ||
	    ((!strcmp(cmd, "members") || !strcmp(cmd, "map") || status) == !!id) ||
	    (id && !hkv_cluster_id_valid(id)))
		return usage(stderr), 2;
	if (server) { /* a standalone server: only its status */
		if (!status) {
			fprintf(stderr, "hatchkv-admin: --server takes status or health; the other "
					"commands are a cluster's (--cluster)\n");
			return 2;
		}
		hkv_etcd_sec_free(&sec);
		return hkv_admin_status_server(server, token_file, json, !strcmp(cmd, "health"));
	}
	a.e = hkv_etcd_open_sec(uri, &sec, 5000);
	ret = errno;
	hkv_etcd_sec_free(&sec);
	if (!a.e) {
		if (ret == EINVAL)
			fprintf(stderr, "hatchkv-admin: bad cluster URI '%s' "
					"(etcd://HOST:PORT[,HOST:PORT...]/PREFIX)\n", uri);
		else /* (etcd.c said why) */
			fprintf(stderr, "hatchkv-admin: cannot use etcd at %s: %s\n", uri,
				strerror(ret));
		return 2;
	}
	a.prefix = hkv_etcd_prefix(a.e);
	if (status || (json && (!strcmp(cmd, "members")))) {
		/* (a report on any etcd answer: no cluster there is "down") */
		ret = hkv_admin_status_cluster(a.e, uri, json, !strcmp(cmd, "health"));
		hkv_etcd_close(a.e);
		return ret;
	}
	if (json && !strcmp(cmd, "map")) {
		ret = cmd_map_json(&a);
		hkv_etcd_close(a.e);
		return ret ? 1 : 0;
	}
	ret = cluster_there(&a);
	if (!ret && id && (!strcmp(cmd, "drain") || !strcmp(cmd, "remove")))
		ret = known_name(&a, id, force);
	if (ret) {
		if (ret != -ENOENT)
			fprintf(stderr, "hatchkv-admin: %s: %s\n", cmd, hkv_strerror(ret));
		hkv_etcd_close(a.e);
		return 1;
	}
	if (!strcmp(cmd, "members")) {
		ret = cmd_members(&a);
	} else if (!strcmp(cmd, "map")) {
		ret = cmd_map(&a);
	} else if (!strcmp(cmd, "drain") && replicated(&a)) {
		fprintf(stderr, "hatchkv-admin: a replicated store cannot drain a live server yet "
				"(filling a new replica is not built); `remove` drops it from its "
				"partitions' lists instead\n");
		ret = -ENOTSUP;
	} else if (!strcmp(cmd, "drain")) {
		ret = put_flag(&a, "drain", id);
		if (!ret)
			ret = wait_off(&a, id, wait_s);
	} else if (!strcmp(cmd, "undrain")) {
		int was = 0;

		ret = del_key_was(&a, "drain", id, &was);
		if (!ret)
			printf(was ? "%s: drain lifted; it may take partitions again\n"
				   : "%s was not draining\n", id);
	} else if (!strcmp(cmd, "remove")) {
		ret = remove_safely(&a, id, wait_s, force);
		if (!ret)
			ret = put_flag(&a, "removed", id);
		if (!ret)
			ret = put_flag(&a, "drain", id);
		if (!ret)
			ret = del_key(&a, "servers", id);
		if (!ret)
			ret = wait_off(&a, id, wait_s);
	} else if (!strcmp(cmd, "admit")) {
		int was = 0, drained = 0;

		ret = del_key_was(&a, "removed", id, &was);
		if (!ret)
			ret = del_key_was(&a, "drain", id, &drained);
		if (!ret)
			printf(was ? "%s: admitted again; it may register and take partitions\n"
				   : "%s was not removed\n", id);
	} else {
		usage(stderr);
		ret = -EINVAL;
	}
	if (ret && ret != -ETIMEDOUT && ret != -EINVAL && ret != -ENOENT && ret != -EBUSY)
		fprintf(stderr, "hatchkv-admin: %s: %s\n", cmd, hkv_strerror(ret));
	hkv_etcd_close(a.e);
	return ret ? 1 : 0;
}
