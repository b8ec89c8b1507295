/*
 * cluster_map.h - what a hatchkv cluster keeps in etcd, and how a key finds
 * its memory server. Shared by the server (registration, the coordinator),
 * hatchkv-admin and the client library.
 *
 * Keys under the cluster's PREFIX (etcd://HOST:PORT/PREFIX):
 *
 *   PREFIX/servers/NAME   a member, under the server's own etcd lease:
 *                         {"id":"a","endpoint":"verbs://10.0.0.1:7700",
 *                          "transport":"verbs","region_bytes":1073741824}
 *   PREFIX/drain/NAME     an operator asked that NAME hold no partition
 *   PREFIX/removed/NAME   an operator removed NAME: it must not come back
 *   PREFIX/coordinator    NAME of the one server that recomputes the map,
 *                         under that server's lease (leadership)
 *   PREFIX/identity       {"partitions":64,"hash_key":"<32 hex>",
 *                          "mode":"cache"|"store","replicas":2}, written
 *                         once: every map is made from it; every server
 *                         runs the mode. replicas (store mode; 1 if
 *                         absent): each partition's copies (client/replica.c)
 *   PREFIX/map            the partition map:
 *                         {"partitions":64,"replicas":1,"hash_key":"<32 hex>",
 *                          "map":[["a"],["b"],...],"route_lease_ms":500}
 *                         (route_lease_ms only when not the default)
 *
 * The map's epoch is etcd's mod_revision of PREFIX/map; it changes only
 * through a transaction that compares the revision the writer read. The
 * number of partitions is fixed when the map is first written. Each
 * partition has an ordered replica list of 1..replicas distinct servers:
 * the first is the primary (read), the last the decider (written first);
 * shorter than replicas only after a server was lost (hkv_cmap_drop).
 *
 * Placement is rendezvous hashing (highest random weight): partition p goes
 * to the eligible servers with the highest weights h(hash_key, p, name). A
 * server that joins takes exactly the partitions where it now weighs most
 * (about 1/(N+1) of them); a server that leaves gives up only its own.
 *
 * Routing: partition = hkv_cmap_partition(map, key) - SipHash-2-4 of the
 * key under the cluster's hash_key, bits 22-53 reduced by multiply-shift.
 * A cluster's servers key their regions' hash with the same secret, so the
 * one hash also gives the buckets (bits 0-25, and 17-57 mixed) and the
 * fingerprint (bits 54-63), which these bits barely touch: the keys of one
 * server still spread over all its buckets and fingerprints.
 */
#ifndef HKV_CLUSTER_MAP_H
#define HKV_CLUSTER_MAP_H

#include <stddef.h>
#include <stdint.h>

#define HKV_CLUSTER_ID_MAX     64   /* server names: [A-Za-z0-9._-], 1..63 bytes */
#define HKV_CLUSTER_MAX_PARTS  65536
#define HKV_CLUSTER_MAX_SERVERS 1024
#define HKV_CLUSTER_MAX_REPLICAS 3
/* A client routes to a server only on a view of the map and the members
 * read (etcd answered) less than this long ago; the coordinator gives the
 * partitions of a server that left away only after it has been gone for
 * longer. So a server that stopped (its CPU frozen, its NIC still serving)
 * takes no write after its partitions have a new home. */
#define HKV_CLUSTER_ROUTE_LEASE_MS 1500 /* the default: the map may say another */
#define HKV_CLUSTER_ROUTE_LEASE_MIN 200
#define HKV_CLUSTER_ROUTE_LEASE_MAX 60000

struct hkv_cmember {
	char id[HKV_CLUSTER_ID_MAX];
	char endpoint[256]; /* the URI a client gives hkv_config_add_server() */
	char transport[8];
	uint64_t region_bytes;
};

struct hkv_cmap {
	uint32_t partitions, replicas;
	uint8_t hash_key[16];
	uint32_t nnames;
	char (*names)[HKV_CLUSTER_ID_MAX]; /* the servers the map names */
	uint16_t *repl; /* partitions x replicas indexes into names */
	uint8_t *len;   /* each partition's list length (NULL: all `replicas` long) */
	int64_t epoch;  /* etcd mod_revision of PREFIX/map (0: not stored yet) */
	uint32_t route_lease_ms; /* clients route on a view this young ("route_lease_ms"
				  * in the map; 0 or absent: HKV_CLUSTER_ROUTE_LEASE_MS) */
};

/* 1 if s is a valid server name. */
int hkv_cluster_id_valid(const char *s);

int hkv_cmember_parse(const char *json, size_t len, struct hkv_cmember *m);
/* hkv_malloc'd JSON text, or NULL (errno). */
char *hkv_cmember_format(const struct hkv_cmember *m);

/* (replicas may be NULL) */
int hkv_cmap_identity_parse(const char *json, size_t len, uint32_t *partitions,
			    uint8_t hash_key[16], int *store_mode, uint32_t *replicas);
char *hkv_cmap_identity_format(uint32_t partitions, const uint8_t hash_key[16], int store_mode,
			       uint32_t replicas);

/* Parse PREFIX/map; every check a client relies on is made here (counts in
 * range, each list 1..`replicas` distinct known names). 0, -EPROTO
 * (not a map), -ENOMEM. Free with hkv_cmap_free. */
int hkv_cmap_parse(const char *json, size_t len, struct hkv_cmap *map);
char *hkv_cmap_format(const struct hkv_cmap *map);
void hkv_cmap_free(struct hkv_cmap *map);

/* Place every partition on the servers ids[0..n) (rendezvous hashing) with
 * map->partitions, ->replicas and ->hash_key already set; replaces names
 * and repl. With fewer than `replicas` servers, lists are shorter: the
 * map's replicas field is lowered to n. 0, -EINVAL (n == 0), -ENOMEM. */
int hkv_cmap_place(struct hkv_cmap *map, const char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n);

/* Partitions whose primary differs between a and b (same partition count). */
uint32_t hkv_cmap_moved(const struct hkv_cmap *a, const struct hkv_cmap *b);

uint32_t hkv_cmap_partition(const struct hkv_cmap *map, const void *key, size_t klen);
uint64_t hkv_cmap_hash(const struct hkv_cmap *map, const void *key, size_t klen);
static inline uint32_t hkv_cmap_partition_of(const struct hkv_cmap *map, uint64_t h)
{
	return (uint32_t)((((h >> 22) & 0xffffffffull) * map->partitions) >> 32);
}
struct hkv_etcd;
/*
 * Members share the cluster's token (issue 28, item 4): PREFIX/token_check
 * holds {"salt": 16 random bytes, "mac": HMAC-SHA-256 keyed by the token
 * over "hatchkv cluster token" || salt} (hex). Absent, it is made from our
 * token (the first member of a cluster, or the first started after an
 * upgrade). 0 if our token matches, HKV_EAUTH if it does not, or the etcd
 * error. The record lets a guess of the token be tested offline, which
 * takes guessing all of it (16 random bytes).
 */
int hkv_cmap_token_check(struct hkv_etcd *e, const void *token, size_t token_len);
/* Read PREFIX/identity, writing it first if absent (partitions, a new
 * random key, the mode). 0 and *partitions, hash_key, *store_mode filled,
 * or an error. */
struct hkv_etcd;
int hkv_cmap_identity_get(struct hkv_etcd *e, uint32_t partitions_if_new, int store_if_new,
			  uint32_t replicas_if_new, uint32_t *partitions, uint8_t hash_key[16],
			  int *store_mode, uint32_t *replicas);
/* The name of partition p's replica r (r < hkv_cmap_len). */
const char *hkv_cmap_server(const struct hkv_cmap *map, uint32_t p, uint32_t r);
static inline uint32_t hkv_cmap_len(const struct hkv_cmap *map, uint32_t p)
{
	return map->len ? map->len[p] : map->replicas;
}
/* How young a view must be to route on (ms). */
static inline uint32_t hkv_cmap_route_lease(const struct hkv_cmap *map)
{
	return map->route_lease_ms ? map->route_lease_ms : HKV_CLUSTER_ROUTE_LEASE_MS;
}
/* Is id on partition p's list (any position)? */
int hkv_cmap_holds(const struct hkv_cmap *map, uint32_t p, const char *id);
/* Take id off every list that has another server, keeping the order of the
 * rest (a lost replica). How many lists changed. */
int hkv_cmap_drop(struct hkv_cmap *map, const char *id);
/* Put id on partition p's list right behind the primary (a filled replica:
 * docs/design.md "Repair"). 0, -EEXIST (on it already), -ENOSPC (the list
 * is full) or -ENOMEM. */
int hkv_cmap_admit(struct hkv_cmap *map, uint32_t p, const char *id);
/* Does b's list of partition p name a server that a's does not? */
int hkv_cmap_grows(const struct hkv_cmap *a, const struct hkv_cmap *b, uint32_t p);

#endif /* HKV_CLUSTER_MAP_H */
