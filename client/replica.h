/*
 * replica.h - replicated writes over a fixed list of servers
 * (hkv_config_set_replicas; client/replica.c). Not installed.
 */
#ifndef HKV_REPLICA_H
#define HKV_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "client/ops_int.h"

#define HKV_MAX_REPLICAS 3
/* A write found decided on the decider but not yet on the primary is
 * finished by the next writer once it has stood this long (its own writer
 * normally gets there in microseconds). */
#define HKV_HELP_MS 50

/* One replicated write: what it does to the primary's current entry. */
enum repl_kind { REPL_STORE, REPL_MODIFY, REPL_DELETE };

struct repl_op {
	enum repl_kind kind;
	enum hkv_op op;             /* counted as */
	enum store_mode mode;       /* REPL_STORE: SET, ADD, REPLACE or CAS */
	uint64_t version;           /* STORE_CAS; REPL_DELETE with has_version */
	int has_version;
	const struct value *v;      /* REPL_STORE: the new value (wid, pred: ours to set) */
	rmw_fn fn;                  /* REPL_MODIFY: the new value from the old */
	void *arg;
};

int hkv_repl_open(const struct hkv_config *cfg, struct hkv_client **out);
/* Close it (and, if hkv_repl_open made them, the replicas' handles). */
void hkv_repl_close(struct hkv_client *c);
/* A replicated handle over n handles someone else owns (a router's), in
 * list order; hkv_repl_members points it at them again (reopened). */
int hkv_repl_wrap(struct hkv_client *const *hs, int n, int timeout_ms, size_t max_value,
		  struct hkv_client **out);
void hkv_repl_members(struct hkv_client *c, struct hkv_client *const *hs);
/* A router's: the route lease of the view it routed on ends at end_ns
 * (hkv_coarse_ns); past it the handle decides and helps nothing. */
void hkv_repl_route_end(struct hkv_client *c, uint64_t end_ns);
/* The replicated write op of key on the replicated handle c. 0 or <0, as the
 * unreplicated operation returns; also HKV_EUNKNOWN (hatchkv_err.h). */
int hkv_repl_write(struct hkv_client *c, const void *key, size_t klen, const struct repl_op *op);
/* The primary's handle (reads go there). */
struct hkv_client *hkv_repl_primary(const struct hkv_client *c);
/* How many replicas the handle writes. */
int hkv_repl_count(const struct hkv_client *c);
/* flush_all by replicated deletes of the keys h holds present (api.c, the
 * walk count takes too): mine filters. */
int hkv_flush_by_deletes(struct hkv_client *h, struct hkv_client *del,
			 int (*mine)(void *arg, const void *key, size_t klen), void *arg);
/* A replicated store's count of what h holds (api.c): entries readers take
 * as present, not tombstones, that mine (if set) says to count. */
int hkv_count_present(struct hkv_client *h, int (*mine)(void *arg, const void *key, size_t klen),
		      void *arg, uint64_t *items, uint64_t *bytes);
void hkv_repl_stats(const struct hkv_client *c, struct hkv_client_stats *out);
void hkv_repl_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum);
uint32_t hkv_repl_time(struct hkv_client *c);

#endif /* HKV_REPLICA_H */
