/* cluster_map.c - the cluster's records in etcd and rendezvous placement. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>
#include <sodium.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "hatchkv_err.h"

int hkv_cluster_id_valid(const char *s)
{
	size_t n = 0;

	if (!s)
		return 0;
	for (; s[n]; n++) {
		char ch = s[n];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return 0;
	}
	return n > 0 && n < HKV_CLUSTER_ID_MAX;
}

static int get_string(json_object *o, const char *name, char *dst, size_t cap)
{
	json_object *v;
	const char *s;

	if (!json_object_object_get_ex(o, name, &v) || !json_object_is_type(v, json_type_string))
		return -EPROTO;
	s = json_object_get_string(v);
	if (strlen(s) >= cap)
		return -EPROTO;
	strcpy(dst, s);
	return 0;
}

/* A non-negative integer, sent as a JSON number or (etcd style) a string. */
static int get_u64(json_object *o, const char *name, uint64_t *out)
{
	json_object *v;
	const char *s;
	char *end;

	if (!json_object_object_get_ex(o, name, &v))
		return -EPROTO;
	if (json_object_is_type(v, json_type_int)) {
		int64_t x = json_object_get_int64(v);

		if (x < 0)
			return -EPROTO;
		*out = (uint64_t)x;
		return 0;
	}
	if (!json_object_is_type(v, json_type_string))
		return -EPROTO;
	s = json_object_get_string(v);
	errno = 0;
	*out = strtoull(s, &end, 10);
	return end == s || *end || errno || *s == '-' ? -EPROTO : 0;
}

static json_object *parse(const char *json, size_t len)
{
	json_tokener *tok = json_tokener_new();
	json_object *o;

	if (!tok || len > (64u << 20))
		return json_tokener_free(tok), NULL;
	o = json_tokener_parse_ex(tok, json, (int)len);
	if (o && tok->char_offset != (int)len) { /* trailing bytes: not ours */
		json_object_put(o);
		o = NULL;
	}
	json_tokener_free(tok);
	if (o && !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		o = NULL;
	}
	return o;
}

static char *dup_json(json_object *o)
{
	char *s = o ? hkv_strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) : NULL;

	json_object_put(o);
	if (!s)
		errno = ENOMEM;
	return s;
}

int hkv_cmember_parse(const char *json, size_t len, struct hkv_cmember *m)
{
	json_object *o = parse(json, len);
	int ret;

	if (!o)
		return -EPROTO;
	memset(m, 0, sizeof(*m));
	ret = get_string(o, "id", m->id, sizeof(m->id));
	if (!ret)
		ret = get_string(o, "endpoint", m->endpoint, sizeof(m->endpoint));
	if (!ret)
		ret = get_string(o, "transport", m->transport, sizeof(m->transport));
	if (!ret)
		ret = get_u64(o, "region_bytes", &m->region_bytes);
	if (!ret && (!hkv_cluster_id_valid(m->id) ||
		     (strncmp(m->endpoint, "shm:", 4) && strncmp(m->endpoint, "verbs://", 8))))
		ret = -EPROTO;
	json_object_put(o);
	return ret;
}

char *hkv_cmember_format(const struct hkv_cmember *m)
{
	json_object *o = json_object_new_object();

	if (!o)
		return errno = ENOMEM, NULL;
	json_object_object_add(o, "id", json_object_new_string(m->id));
	json_object_object_add(o, "endpoint", json_object_new_string(m->endpoint));
	json_object_object_add(o, "transport", json_object_new_string(m->transport));
	json_object_object_add(o, "region_bytes", json_object_new_int64((int64_t)m->region_bytes));
	return dup_json(o);
}

void hkv_cmap_free(struct hkv_cmap *map)
{
	hkv_free(map->names);
	hkv_free(map->repl);
	hkv_free(map->len);
	map->names = NULL;
	map->repl = NULL;
	map->len = NULL;
	map->nnames = 0;
}

static int name_index(struct hkv_cmap *map, const char *id, uint32_t cap)
{
	for (uint32_t i = 0; i < map->nnames; i++)
		if (!strcmp(map->names[i], id))
			return (int)i;
	if (map->nnames == cap || !hkv_cluster_id_valid(id))
		return -1;
	strcpy(map->names[map->nnames], id);
	return (int)map->nnames++;
}

static int hex_key(const char *hex, uint8_t key[16])
{
	size_t bin_len;

	if (strlen(hex) != 32 || sodium_hex2bin(key, 16, hex, 32, NULL, &bin_len, NULL) ||
	    bin_len != 16)
		return -EPROTO;
	return 0;
}

int hkv_cmap_identity_parse(const char *json, size_t len, uint32_t *partitions,
			    uint8_t hash_key[16], int *store_mode, uint32_t *replicas)
{
	json_object *o = parse(json, len);
	uint64_t parts = 0, repl = 1; /* (identities from before replicas: 1) */
	char hex[40], mode[8] = "cache"; /* (identities from before modes: cache) */
	int ret = -EPROTO;

	if (o && json_object_object_get_ex(o, "mode", NULL) &&
	    get_string(o, "mode", mode, sizeof(mode)))
		mode[0] = 0;
	if (o && !get_u64(o, "partitions", &parts) && parts && parts <= HKV_CLUSTER_MAX_PARTS &&
	    !get_string(o, "hash_key", hex, sizeof(hex)) && !hex_key(hex, hash_key) &&
	    (!strcmp(mode, "cache") || !strcmp(mode, "store")) &&
	    (!json_object_object_get_ex(o, "replicas", NULL) ||
	     (!get_u64(o, "replicas", &repl) && repl >= 1 && repl <= HKV_CLUSTER_MAX_REPLICAS)) &&
	    (repl == 1 || !strcmp(mode, "store"))) {
		*partitions = (uint32_t)parts;
		*store_mode = !strcmp(mode, "store");
		if (replicas)
			*replicas = (uint32_t)repl;
		ret = 0;
	}
	json_object_put(o);
	return ret;
}

char *hkv_cmap_identity_format(uint32_t partitions, const uint8_t hash_key[16], int store_mode,
			       uint32_t replicas)
{
	json_object *o = json_object_new_object();
	char hex[33];

	if (!o)
		return errno = ENOMEM, NULL;
	sodium_bin2hex(hex, sizeof(hex), hash_key, 16);
	json_object_object_add(o, "partitions", json_object_new_int64(partitions));
	json_object_object_add(o, "hash_key", json_object_new_string(hex));
	json_object_object_add(o, "mode", json_object_new_string(store_mode ? "store" : "cache"));
	if (replicas > 1)
		json_object_object_add(o, "replicas", json_object_new_int64(replicas));
	return dup_json(o);
}

int hkv_cmap_parse(const char *json, size_t len, struct hkv_cmap *map)
{
	json_object *o = parse(json, len), *arr;
	uint64_t parts = 0, repl = 0;
	char hex[40];
	int ret = -EPROTO;

	memset(map, 0, sizeof(*map));
	if (!o)
		return -EPROTO;
	if (get_u64(o, "partitions", &parts) || get_u64(o, "replicas", &repl) || !parts ||
	    parts > HKV_CLUSTER_MAX_PARTS || !repl || repl > HKV_CLUSTER_MAX_REPLICAS ||
	    get_string(o, "hash_key", hex, sizeof(hex)) || hex_key(hex, map->hash_key) ||
	    !json_object_object_get_ex(o, "map", &arr) ||
	    !json_object_is_type(arr, json_type_array) || json_object_array_length(arr) != parts)
		goto out;
	map->partitions = (uint32_t)parts;
	map->replicas = (uint32_t)repl;
	if (json_object_object_get_ex(o, "route_lease_ms", NULL)) {
		uint64_t ms;

		if (get_u64(o, "route_lease_ms", &ms) || ms < HKV_CLUSTER_ROUTE_LEASE_MIN ||
		    ms > HKV_CLUSTER_ROUTE_LEASE_MAX)
			goto out;
		map->route_lease_ms = (uint32_t)ms;
	}
	map->names = hkv_calloc(HKV_CLUSTER_MAX_SERVERS, sizeof(*map->names));
	map->repl = hkv_calloc(parts * repl, sizeof(*map->repl));
	map->len = hkv_calloc(parts, 1);
	if (!map->names || !map->repl || !map->len) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t p = 0; p < parts; p++) {
		json_object *list = json_object_array_get_idx(arr, p);

		size_t llen;

		/* (shorter than `replicas` while a replica is lost: at least one) */
		if (!json_object_is_type(list, json_type_array) ||
		    (llen = json_object_array_length(list)) < 1 || llen > repl)
			goto out;
		map->len[p] = (uint8_t)llen;
		for (uint32_t r = 0; r < llen; r++) {
			json_object *s = json_object_array_get_idx(list, r);
			int idx;

			if (!json_object_is_type(s, json_type_string))
				goto out;
			idx = name_index(map, json_object_get_string(s), HKV_CLUSTER_MAX_SERVERS);
			if (idx < 0)
				goto out;
			for (uint32_t q = 0; q < r; q++)
				if (map->repl[p * repl + q] == idx)
					goto out; /* one server twice in a list */
			map->repl[p * repl + r] = (uint16_t)idx;
		}
	}
	ret = 0;
out:
	json_object_put(o);
	if (ret)
		hkv_cmap_free(map);
	return ret;
}

char *hkv_cmap_format(const struct hkv_cmap *map)
{
	json_object *o = json_object_new_object(), *arr = json_object_new_array();
	char hex[33];

	if (!o || !arr) {
		json_object_put(o);
		json_object_put(arr);
		return errno = ENOMEM, NULL;
	}
	sodium_bin2hex(hex, sizeof(hex), map->hash_key, 16);
	json_object_object_add(o, "partitions", json_object_new_int64(map->partitions));
	json_object_object_add(o, "replicas", json_object_new_int64(map->replicas));
	if (map->route_lease_ms && map->route_lease_ms != HKV_CLUSTER_ROUTE_LEASE_MS)
		json_object_object_add(o, "route_lease_ms",
				       json_object_new_int64(map->route_lease_ms));
	json_object_object_add(o, "hash_key", json_object_new_string(hex));
	for (uint32_t p = 0; p < map->partitions; p++) {
		json_object *list = json_object_new_array();

		for (uint32_t r = 0; r < hkv_cmap_len(map, p); r++)
			json_object_array_add(list, json_object_new_string(
						map->names[map->repl[p * map->replicas + r]]));
		json_object_array_add(arr, list);
	}
	json_object_object_add(o, "map", arr);
	return dup_json(o);
}

static uint64_t weight(const struct hkv_cmap *map, uint32_t p, const char *id)
{
	unsigned char buf[4 + HKV_CLUSTER_ID_MAX];
	uint64_t h;
	size_t n = strlen(id);

	memcpy(buf, &p, 4);
	memcpy(buf + 4, id, n);
	crypto_shorthash((unsigned char *)&h, buf, 4 + n, map->hash_key);
	return h;
}

int hkv_cmap_place(struct hkv_cmap *map, const char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n)
{
	uint32_t r = map->replicas < n ? map->replicas : n;
	char (*names)[HKV_CLUSTER_ID_MAX];
	uint16_t *repl;
	uint8_t *len;

	if (!n || n > HKV_CLUSTER_MAX_SERVERS || !map->partitions || !r)
		return -EINVAL;
	names = hkv_calloc(n, sizeof(*names));
	repl = hkv_calloc((size_t)map->partitions * r, sizeof(*repl));
	len = hkv_calloc(map->partitions, 1);
	if (!names || !repl || !len) {
		hkv_free(names);
		hkv_free(repl);
		hkv_free(len);
		return -ENOMEM;
	}
	memset(len, (int)r, map->partitions);
	for (uint32_t i = 0; i < n; i++)
		memcpy(names[i], ids[i], HKV_CLUSTER_ID_MAX);
	for (uint32_t p = 0; p < map->partitions; p++) {
		uint16_t *list = repl + (size_t)p * r;

		/* the r highest weights, in descending order (r <= 3: selection) */
		for (uint32_t k = 0; k < r; k++) {
			uint64_t best = 0;
			int bi = -1;

			for (uint32_t i = 0; i < n; i++) {
				uint64_t w = weight(map, p, names[i]);
				int taken = 0;

				for (uint32_t q = 0; q < k; q++)
					taken |= list[q] == i;
				if (!taken && (bi < 0 || w > best ||
					       (w == best && strcmp(names[i], names[bi]) < 0))) {
					best = w;
					bi = (int)i;
				}
			}
			list[k] = (uint16_t)bi;
		}
	}
	hkv_cmap_free(map);
	map->names = names;
	map->nnames = n;
	map->repl = repl;
	map->len = len;
	map->replicas = r;
	return 0;
}

int hkv_cmap_holds(const struct hkv_cmap *map, uint32_t p, const char *id)
{
	for (uint32_t r = 0; r < hkv_cmap_len(map, p); r++)
		if (!strcmp(hkv_cmap_server(map, p, r), id))
			return 1;
	return 0;
}

int hkv_cmap_drop(struct hkv_cmap *map, const char *id)
{
	int dropped = 0;

	for (uint32_t p = 0; p < map->partitions; p++) {
		uint16_t *list = map->repl + (size_t)p * map->replicas;
		uint32_t n = hkv_cmap_len(map, p), k = 0;

		if (n < 2 || !map->len)
			continue; /* (a partition's last replica stays: unavailable, not lost) */
		for (uint32_t r = 0; r < n; r++)
			if (strcmp(map->names[list[r]], id))
				list[k++] = list[r];
		dropped += k != n;
		map->len[p] = (uint8_t)k;
	}
	return dropped;
}

int hkv_cmap_admit(struct hkv_cmap *map, uint32_t p, const char *id)
{
	uint16_t *list = map->repl + (size_t)p * map->replicas;
	uint32_t n = hkv_cmap_len(map, p), i;

	if (hkv_cmap_holds(map, p, id))
		return -EEXIST;
	if (!map->len || !n || n >= map->replicas)
		return -ENOSPC;
	for (i = 0; i < map->nnames && strcmp(map->names[i], id); i++)
		;
	if (i == map->nnames) {
		char (*nm)[HKV_CLUSTER_ID_MAX];

		if (i >= HKV_CLUSTER_MAX_SERVERS)
			return -ENOSPC;
		nm = hkv_realloc(map->names, (i + 1) * sizeof(*nm));
		if (!nm)
			return -ENOMEM;
		map->names = nm;
		snprintf(nm[i], sizeof(nm[i]), "%s", id);
		map->nnames++;
	}
	memmove(list + 2, list + 1, (n - 1) * sizeof(*list));
	list[1] = (uint16_t)i;
	map->len[p] = (uint8_t)(n + 1);
	return 0;
}

int hkv_cmap_grows(const struct hkv_cmap *a, const struct hkv_cmap *b, uint32_t p)
{
	for (uint32_t r = 0; r < hkv_cmap_len(b, p); r++)
		if (!hkv_cmap_holds(a, p, hkv_cmap_server(b, p, r)))
			return 1;
	return 0;
}

const char *hkv_cmap_server(const struct hkv_cmap *map, uint32_t p, uint32_t r)
{
	return map->names[map->repl[(size_t)p * map->replicas + r]];
}

uint32_t hkv_cmap_moved(const struct hkv_cmap *a, const struct hkv_cmap *b)
{
	uint32_t moved = 0;

	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		moved += strcmp(hkv_cmap_server(a, p, 0), hkv_cmap_server(b, p, 0)) != 0;
	return moved;
}

uint64_t hkv_cmap_hash(const struct hkv_cmap *map, const void *key, size_t klen)
{
	uint64_t h;

	crypto_shorthash((unsigned char *)&h, key, klen, map->hash_key);
	return h;
}

uint32_t hkv_cmap_partition(const struct hkv_cmap *map, const void *key, size_t klen)
{
	return hkv_cmap_partition_of(map, hkv_cmap_hash(map, key, klen));
}

int hkv_cmap_identity_get(struct hkv_etcd *e, uint32_t partitions_if_new, int store_if_new,
			  uint32_t replicas_if_new, uint32_t *partitions, uint8_t hash_key[16],
			  int *store_mode, uint32_t *replicas)
{
	char key[300], *json;
	struct hkv_etcd_kv *kvs;
	uint8_t fresh[16];
	int n, ret;

	snprintf(key, sizeof(key), "%s/identity", hkv_etcd_prefix(e));
	for (int tries = 0; tries < 2; tries++) {
		ret = hkv_etcd_range(e, key, 0, &kvs, &n, NULL);
		if (ret)
			return ret;
		if (n) {
			ret = hkv_cmap_identity_parse(kvs[0].value, kvs[0].vlen, partitions, hash_key,
						      store_mode, replicas);
			hkv_etcd_kvs_free(kvs, n);
			return ret;
		}
		randombytes_buf(fresh, sizeof(fresh));
		json = hkv_cmap_identity_format(partitions_if_new, fresh, store_if_new,
						replicas_if_new);
		if (!json)
			return -ENOMEM;
		ret = hkv_etcd_put_if(e, key, json, strlen(json), 0, 0, NULL);
		hkv_free(json);
		if (ret && ret != -ECANCELED)
			return ret;
	}
	return -EAGAIN;
}

static void token_mac(uint8_t mac[32], const void *token, size_t token_len, const uint8_t salt[16])
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, token, token_len);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"hatchkv cluster token", 21);
	crypto_auth_hmacsha256_update(&st, salt, 16);
	crypto_auth_hmacsha256_final(&st, mac);
}

int hkv_cmap_token_check(struct hkv_etcd *e, const void *token, size_t token_len)
{
	char key[300], hex_salt[40], hex_mac[80], json[200];
	uint8_t salt[16], mac[32], want[32];
	struct hkv_etcd_kv *kvs;
	int n, ret;

	snprintf(key, sizeof(key), "%s/token_check", hkv_etcd_prefix(e));
	for (int tries = 0; tries < 2; tries++) {
		json_object *o;

		if ((ret = hkv_etcd_range(e, key, 0, &kvs, &n, NULL)))
			return ret;
		if (n) {
			o = parse(kvs[0].value, kvs[0].vlen);
			hkv_etcd_kvs_free(kvs, n);
			ret = !o || get_string(o, "salt", hex_salt, sizeof(hex_salt)) ||
			      get_string(o, "mac", hex_mac, sizeof(hex_mac)) ||
			      sodium_hex2bin(salt, sizeof(salt), hex_salt, strlen(hex_salt), NULL, NULL,
					     NULL) || sodium_hex2bin(want, sizeof(want), hex_mac,
								     strlen(hex_mac), NULL, NULL, NULL)
				      ? -EPROTO : 0;
			json_object_put(o);
			if (ret)
				return ret;
			token_mac(mac, token, token_len, salt);
			return sodium_memcmp(mac, want, sizeof(mac)) ? HKV_EAUTH : 0;
		}
		randombytes_buf(salt, sizeof(salt));
		token_mac(mac, token, token_len, salt);
		sodium_bin2hex(hex_salt, sizeof(hex_salt), salt, sizeof(salt));
		sodium_bin2hex(hex_mac, sizeof(hex_mac), mac, sizeof(mac));
		snprintf(json, sizeof(json), "{\"salt\":\"%s\",\"mac\":\"%s\"}", hex_salt, hex_mac);
		ret = hkv_etcd_put_if(e, key, json, strlen(json), 0, 0, NULL);
		if (ret && ret != -ECANCELED)
			return ret;
		if (!ret)
			return 0;
	}
	return -EAGAIN;
}
