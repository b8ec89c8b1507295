/*
 * admin_status.c - `hatchkv-admin status` and `health` (issue 30, item 3):
 * what an operator checks first, as `etcdctl endpoint health` or
 * `redis-cli --cluster check` answer it, for a cluster (from etcd) or a
 * standalone server (by connecting to it with a token). Exit status: 0
 * healthy, 1 degraded (serving everything, but something needs a look),
 * 2 down (some keys cannot be served, or nothing can be asked).
 *
 * A cluster is judged from one consistent read of PREFIX/ (etcd's range at
 * one revision): every server the map names should be a member (its lease
 * alive), every partition's list as long as the map's replicas, no move or
 * repair under way, a coordinator, nobody draining or refused. A partition
 * whose every listed server is no member is down. The same read gives each
 * copy and repair pass under way with its bytes done, as its member
 * publishes it (PREFIX/progress/NAME, at most a second old).
 */
#include "server/admin_status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "hatchkv.h"

enum health { HEALTHY = 0, DEGRADED = 1, DOWN = 2 };

static const char *const health_name[] = {"healthy", "degraded", "down"};

struct problems {
	enum health state;
	json_object *list; /* array of strings */
};

static void problem(struct problems *p, enum health h, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void problem(struct problems *p, enum health h, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (h > p->state)
		p->state = h;
	json_object_array_add(p->list, json_object_new_string(buf));
}

/* The value of PREFIX/dir/id (id NULL: PREFIX/dir) in a snapshot, or NULL. */
static const struct hkv_etcd_kv *snap_get(const struct hkv_etcd_kv *kvs, int n,
					  const char *prefix, const char *dir, const char *id)
{
	char key[512];

	if (id)
		snprintf(key, sizeof(key), "%s/%s/%s", prefix, dir, id);
	else
		snprintf(key, sizeof(key), "%s/%s", prefix, dir);
	for (int i = 0; i < n; i++)
		if (!strcmp(kvs[i].key, key))
			return &kvs[i];
	return NULL;
}

/*
 * PREFIX/progress/NAME (server/cluster.c publish_progress): a member's copy
 * for a move, or its repair pass, under way - {"kind","rev","pass","final",
 * "started","at","bytes","bytes_total","items","items_total"}, put at most
 * once a second under its lease, deleted when it ends. Each becomes an entry
 * of "progress": the member, what it is part of ("move": a store move's
 * copy or a repair's final pass; "repair": an online pass), and its figures
 * (totals null while unknown).
 */
static void add_progress(json_object *st, const struct hkv_etcd_kv *kvs, int n,
			 const char *prefix)
{
	json_object *list = json_object_new_array();
	char dir[512];
	size_t dl;

	snprintf(dir, sizeof(dir), "%s/progress/", prefix);
	dl = strlen(dir);
	for (int i = 0; i < n; i++) {
		json_object *in, *out, *v;
		int repair, final;

		if (strncmp(kvs[i].key, dir, dl) || !(in = json_tokener_parse(kvs[i].value)))
			continue;
		if (!json_object_object_get_ex(in, "kind", &v) ||
		    !json_object_object_get_ex(in, "bytes", &v)) {
			json_object_put(in);
			continue;
		}
		repair = !strcmp(json_object_get_string(json_object_object_get(in, "kind")),
				 "repair");
		final = json_object_get_boolean(json_object_object_get(in, "final"));
		out = json_object_new_object();
		json_object_object_add(out, "server", json_object_new_string(kvs[i].key + dl));
		json_object_object_add(out, "of", json_object_new_string(repair && !final ? "repair"
										   : "move"));
		json_object_object_add(out, "kind", json_object_new_string(
						     !repair ? "copy" : final ? "final pass" : "pass"));
		json_object_object_foreach(in, key, val)
			if (strcmp(key, "kind"))
				json_object_object_add(out, key, json_object_get(val));
		json_object_put(in);
		json_object_array_add(list, out);
	}
	json_object_object_add(st, "progress", list);
}

static void print_progress(json_object *list)
{
	for (size_t i = 0; list && i < json_object_array_length(list); i++) {
		json_object *g = json_object_array_get_idx(list, i), *bt, *it;
		double bytes = json_object_get_double(json_object_object_get(g, "bytes"));
		double now = json_object_get_double(json_object_object_get(g, "at"));
		double t0 = json_object_get_double(json_object_object_get(g, "started"));
		const char *kind;
		char total[96], what[32];

		bt = json_object_object_get(g, "bytes_total");
		it = json_object_object_get(g, "items_total");
		if (bt && it && json_object_get_double(bt) > 0)
			snprintf(total, sizeof(total), "of %.1f MB (%.0f %%), %lld of %lld items",
				 json_object_get_double(bt) / 1e6,
				 100.0 * bytes / json_object_get_double(bt),
				 (long long)json_object_get_int64(json_object_object_get(g, "items")),
				 (long long)json_object_get_int64(it));
		else
			snprintf(total, sizeof(total), "of an unknown total, %lld items",
				 (long long)json_object_get_int64(json_object_object_get(g, "items")));
		kind = json_object_get_string(json_object_object_get(g, "kind"));
		if (!strcmp(kind, "pass"))
			snprintf(what, sizeof(what), "pass %d",
				 json_object_get_int(json_object_object_get(g, "pass")));
		else
			snprintf(what, sizeof(what), "%s", strcmp(kind, "copy") ? kind : "copying");
		printf("  %s under way, %s %s: %.1f MB %s, for %.1f s\n",
		       json_object_get_string(json_object_object_get(g, "of")),
		       json_object_get_string(json_object_object_get(g, "server")), what,
		       bytes / 1e6, total, now - t0);
	}
}

static void print_text(json_object *st, int terse)
{
	json_object *v, *probs = json_object_object_get(st, "problems");
	size_t np = probs ? json_object_array_length(probs) : 0;

	if (terse) {
		printf("%s", json_object_get_string(json_object_object_get(st, "state")));
		for (size_t i = 0; i < np; i++)
			printf("%s %s", i ? ";" : ":",
			       json_object_get_string(json_object_array_get_idx(probs, i)));
		printf("\n");
		return;
	}
	printf("%s: %s\n", json_object_get_string(json_object_object_get(st, "target")),
	       json_object_get_string(json_object_object_get(st, "state")));
	if (json_object_object_get_ex(st, "map", &v))
		printf("  map epoch %lld: %d partitions, %d replica(s) each; coordinator %s\n",
		       (long long)json_object_get_int64(json_object_object_get(v, "epoch")),
		       json_object_get_int(json_object_object_get(v, "partitions")),
		       json_object_get_int(json_object_object_get(v, "replicas")),
		       json_object_object_get(st, "coordinator")
			       ? json_object_get_string(json_object_object_get(st, "coordinator"))
			       : "(none)");
	if (json_object_object_get_ex(st, "members", &v))
		for (size_t i = 0; i < json_object_array_length(v); i++) {
			json_object *m = json_object_array_get_idx(v, i);

			printf("  %-16s %-9s primary of %d, replica of %d partitions\n",
			       json_object_get_string(json_object_object_get(m, "name")),
			       json_object_get_string(json_object_object_get(m, "state")),
			       json_object_get_int(json_object_object_get(m, "primaries")),
			       json_object_get_int(json_object_object_get(m, "replicas")));
		}
	if (json_object_object_get_ex(st, "progress", &v))
		print_progress(v);
	if (json_object_object_get_ex(st, "region_bytes", &v))
		printf("  region %lld bytes, %lld index slots, %s mode\n",
		       (long long)json_object_get_int64(v),
		       (long long)json_object_get_int64(json_object_object_get(st, "index_slots")),
		       json_object_get_string(json_object_object_get(st, "mode")));
	for (size_t i = 0; i < np; i++)
		printf("  - %s\n", json_object_get_string(json_object_array_get_idx(probs, i)));
}

static int finish(json_object *st, struct problems *p, int json, int terse)
{
	int rc = (int)p->state;

	json_object_object_add(st, "state", json_object_new_string(health_name[p->state]));
	json_object_object_add(st, "problems", p->list);
	if (json)
		printf("%s\n", json_object_to_json_string_ext(st, JSON_C_TO_STRING_PRETTY |
								JSON_C_TO_STRING_NOSLASHESCAPE));
	else
		print_text(st, terse);
	json_object_put(st);
	return rc;
}

int hkv_admin_status_cluster(struct hkv_etcd *e, const char *uri, int json, int terse)
{
	const char *prefix = hkv_etcd_prefix(e);
	struct problems p = {HEALTHY, json_object_new_array()};
	json_object *st = json_object_new_object(), *members = json_object_new_array();
	struct hkv_etcd_kv *kvs = NULL;
	const struct hkv_etcd_kv *mk, *ck;
	struct hkv_cmap map = {0};
	char dir[512];
	int n = 0, ret, have_map = 0;
	uint32_t under = 0, unavailable = 0, *prim = NULL, *repl = NULL;
	uint8_t *live = NULL;

	json_object_object_add(st, "target", json_object_new_string(uri));
	snprintf(dir, sizeof(dir), "%s/", prefix);
	ret = hkv_etcd_range(e, dir, 1, &kvs, &n, NULL);
	if (ret) {
		problem(&p, DOWN, "etcd cannot be read: %s", hkv_strerror(ret));
		json_object_put(members);
		return finish(st, &p, json, terse);
	}
	mk = snap_get(kvs, n, prefix, "map", NULL);
	if (!mk) {
		problem(&p, DOWN, "no partition map yet (no server has joined, or the first map "
				  "waits for --replicas servers)");
	} else if (hkv_cmap_parse(mk->value, mk->vlen, &map)) {
		problem(&p, DOWN, "%s/map is not a usable partition map", prefix);
	} else {
		json_object *mo = json_object_new_object();

		have_map = 1;
		map.epoch = mk->mod_rev;
		json_object_object_add(mo, "epoch", json_object_new_int64(map.epoch));
		json_object_object_add(mo, "partitions", json_object_new_int((int)map.partitions));
		json_object_object_add(mo, "replicas", json_object_new_int((int)map.replicas));
		json_object_object_add(st, "map", mo);
	}
	if ((ck = snap_get(kvs, n, prefix, "coordinator", NULL)))
		json_object_object_add(st, "coordinator", json_object_new_string(ck->value));
	else
		problem(&p, DEGRADED, "no coordinator (no member holds %s/coordinator: moves and "
				      "repairs wait)", prefix);
	if (have_map) {
		prim = hkv_calloc(map.nnames + 1, sizeof(*prim));
		repl = hkv_calloc(map.nnames + 1, sizeof(*repl));
		live = hkv_calloc(map.nnames + 1, 1);
		if (!prim || !repl || !live) {
			problem(&p, DOWN, "out of memory");
			goto out;
		}
		for (uint32_t i = 0; i < map.nnames; i++) {
			live[i] = snap_get(kvs, n, prefix, "servers", map.names[i]) != NULL;
			if (!live[i])
				problem(&p, DEGRADED, "%s is on the map but no member (its lease "
						      "ended: stopped, dead or cut off from etcd)",
					map.names[i]);
		}
		for (uint32_t q = 0; q < map.partitions; q++) {
			uint32_t len = hkv_cmap_len(&map, q), alive = 0;

			for (uint32_t r = 0; r < len; r++) {
				uint32_t idx = map.repl[(size_t)q * map.replicas + r];

				alive += live[idx];
				if (r == 0)
					prim[idx]++;
				else
					repl[idx]++;
			}
			under += len < map.replicas;
			unavailable += alive == 0;
		}
		if (unavailable)
			problem(&p, DOWN, "%u partitions have no live server: their keys fail until "
					  "one is back or the map moves them", unavailable);
		if (under)
			problem(&p, DEGRADED, "%u partitions have fewer than %u replicas", under,
				map.replicas);
	}
	json_object_object_add(st, "under_replicated", json_object_new_int((int)under));
	json_object_object_add(st, "unavailable", json_object_new_int((int)unavailable));
	/* members: as etcd has them now, with their roles in the map */
	for (int i = 0; i < n; i++) {
		struct hkv_cmember m;
		json_object *mo;
		uint32_t np = 0, nr = 0;

		snprintf(dir, sizeof(dir), "%s/servers/", prefix);
		if (strncmp(kvs[i].key, dir, strlen(dir)) ||
		    hkv_cmember_parse(kvs[i].value, kvs[i].vlen, &m))
			continue;
		for (uint32_t k = 0; have_map && k < map.nnames; k++)
			if (!strcmp(map.names[k], m.id)) {
				np = prim[k];
				nr = repl[k];
			}
		mo = json_object_new_object();
		json_object_object_add(mo, "name", json_object_new_string(m.id));
		json_object_object_add(mo, "endpoint", json_object_new_string(m.endpoint));
		json_object_object_add(mo, "transport", json_object_new_string(m.transport));
		json_object_object_add(mo, "region_bytes", json_object_new_int64((int64_t)m.region_bytes));
		json_object_object_add(mo, "primaries", json_object_new_int((int)np));
		json_object_object_add(mo, "replicas", json_object_new_int((int)nr));
		json_object_object_add(mo, "state",
				       json_object_new_string(snap_get(kvs, n, prefix, "drain", m.id)
								      ? "draining"
								      : "serving"));
		json_object_array_add(members, mo);
		if (snap_get(kvs, n, prefix, "drain", m.id))
			problem(&p, DEGRADED, "%s is draining", m.id);
	}
	json_object_object_add(st, "members", members);
	members = NULL;
	if (!json_object_array_length(json_object_object_get(st, "members")))
		problem(&p, DOWN, "no members");
	if (snap_get(kvs, n, prefix, "next", NULL))
		problem(&p, DEGRADED, "a move is under way (%s/next)", prefix);
	if (snap_get(kvs, n, prefix, "fill", NULL))
		problem(&p, DEGRADED, "a repair is under way (%s/fill: a new replica is filled)",
			prefix);
	add_progress(st, kvs, n, prefix);
	snprintf(dir, sizeof(dir), "%s/refused/", prefix);
	for (int i = 0; i < n; i++)
		if (!strncmp(kvs[i].key, dir, strlen(dir)))
			problem(&p, DEGRADED, "%s refused to join (hatchkv-admin members says why)",
				kvs[i].key + strlen(dir));
out:
	json_object_put(members);
	hkv_free(prim);
	hkv_free(repl);
	hkv_free(live);
	if (have_map)
		hkv_cmap_free(&map);
	hkv_etcd_kvs_free(kvs, n);
	return finish(st, &p, json, terse);
}

int hkv_admin_status_server(const char *uri, const char *token_file, int json, int terse)
{
	struct problems p = {HEALTHY, json_object_new_array()};
	json_object *st = json_object_new_object();
	struct hkv_config *cfg = hkv_config_new();
	struct hkv_client *c = NULL;
	int ret;

	json_object_object_add(st, "target", json_object_new_string(uri));
	ret = !cfg ? -ENOMEM
	      : hkv_config_add_server(cfg, uri) ? -EINVAL
	      : token_file && hkv_config_set_token_file(cfg, token_file) ? -ENOMEM
		                                                         : hkv_open(cfg, &c);
	if (ret) {
		problem(&p, DOWN, "cannot connect: %s", hkv_strerror(ret));
	} else {
		struct hkv_server_info si;

		hkv_server_info(c, &si);
		json_object_object_add(st, "region_bytes", json_object_new_int64((int64_t)si.region_bytes));
		json_object_object_add(st, "index_slots", json_object_new_int64((int64_t)si.index_slots));
		json_object_object_add(st, "value_bytes", json_object_new_int64((int64_t)si.value_bytes));
		json_object_object_add(st, "mode", json_object_new_string(si.cache_mode ? "cache"
										     : "store"));
		json_object_object_add(st, "server_time", json_object_new_int64(hkv_time(c)));
		hkv_close(c);
	}
	hkv_config_free(cfg);
	return finish(st, &p, json, terse);
}
