/*
 * store.h - the memory server's side of the store: it owns the region, lays
 * out its header (common/layout.h), hands out client ids and one-time data
 * plane tickets, and when a client's data connection is gone marks that
 * client's segments orphaned so other clients can adopt them.
 *
 * It never touches keys or values: every key-value operation is done by
 * clients with one-sided RDMA. Its work is per connection, never per op.
 * Single-threaded: called from the server's event loop only.
 */
#ifndef HKV_SERVER_STORE_H
#define HKV_SERVER_STORE_H

#include <stdint.h>

#include "common/ctl_proto.h"
#include "common/layout.h"
#include "common/region.h"
#include "common/transport.h"

struct hkv_store_opts {
	uint64_t memory;     /* region bytes */
	uint32_t seg_size;   /* segment bytes (power of two) */
	uint64_t index_slots;/* 0: derived from memory */
	int cache_mode;      /* evict instead of failing when full */
	uint32_t max_clients;     /* connected + admitted at once; 0 = HKV_MAX_CLIENTS */
	uint32_t max_client_segs; /* announced in the header; clients keep to it (0: none) */
	const char *memory_file; /* NULL: anonymous memfd */
	/* the key hash's secret; NULL: random. A cluster's servers share the
	 * cluster's (its identity), so a client hashes a key once to find both
	 * its partition and its buckets (client/router.c). */
	const uint8_t *hash_key;
};

struct hkv_client_rec {
	uint8_t ticket[HKV_TICKET_LEN]; /* while connected: its secret for GRANT */
	uint64_t ticket_expiry_ns; /* 0: redeemed or unused */
	int connected;
	int readonly; /* its rkey permits RDMA Read only */
	uint32_t *grants; /* memory windows: segments it has WRITE windows on */
	uint32_t ngrants, capgrants;
};

struct hkv_store {
	struct hkv_region region;
	struct hkv_geometry *geom; /* in the region, offset 0 */
	struct hkv_client_rec *clients; /* indexed by client id (1..HKV_MAX_CLIENTS) */
	uint32_t next_id;
	uint64_t orphaned_segments;
	uint32_t nconnected;
	uint32_t npending; /* tickets handed out, not yet redeemed or expired by the tick */
	uint32_t max_clients;
	struct hkv_listener *data; /* set once the data plane is up: grants bind on it */
	/* Memory windows: who holds each segment's WRITE window, as the server
	 * granted it (0: nobody), and the holder's table entry as last seen.
	 * The table is CASable by every writer, so it is not proof of ownership:
	 * a granted segment is its holder's until the holder disconnects. */
	uint32_t *holder;
	uint64_t *held_entry;
	uint64_t restored; /* table entries of granted segments put back */
	/* Idle segments: each entry as the tick last saw it change, and when
	 * (entries of connected owners unchanged for HKV_SEG_IDLE_MS go IDLE) */
	uint64_t *seen_entry, *seen_ns;
	uint64_t idled;       /* entries the server marked IDLE */
	uint64_t transferred; /* granted segments an adopter took while IDLE */
	int fenced; /* cluster: lease in doubt, serve nobody (server/cluster.h) */
};

int hkv_store_init(struct hkv_store *s, const struct hkv_store_opts *o);
void hkv_store_fini(struct hkv_store *s);

/* Control plane: a client authenticated; fill its welcome (id + ticket).
 * -EUSERS at the client limit, HKV_EDISCONNECTED while fenced. */
int hkv_store_admit(struct hkv_store *s, struct hkv_ctl_welcome *w, int readonly);

/* Transport callbacks (arg = the store). */
int hkv_store_on_connect(void *arg, const void *hello, size_t len, struct hkv_accept_info *out);
void hkv_store_on_disconnect(void *arg, uint64_t cookie);

/*
 * Control plane, memory windows: a connected client asks for rights (see
 * struct hkv_ctl_grant). Base rights: READ over the region and, for
 * writers, ATOMIC past the header (a second window, in atomic_rkey). A
 * segment: WRITE over it, only while the segment table says the client
 * owns it and no other connected client holds its window, and at most
 * --max-segments-per-client of them. Fills *out;
 * returns 0, HKV_EAUTH (unknown client or wrong ticket), -EPERM (not its
 * segment, or a read-only client), HKV_EFULL (at its segment limit),
 * -EINVAL, -EOPNOTSUPP (no windows), or the bind's error. *why is for the
 * ERROR reply.
 */
int hkv_store_grant(struct hkv_store *s, const struct hkv_ctl_grant *g,
		    struct hkv_ctl_granted *out, const char **why);

/* Expire tickets not redeemed in time; put back the table entry of any
 * granted segment that another client changed (sweep); called from a 1 s
 * timer. */
void hkv_store_tick(struct hkv_store *s);
/* Mark IDLE the OWNED segments of connected clients that stopped renewing
 * them (HKV_SEG_IDLE_MS); run every HKV_SEG_SWEEP_MS. */
void hkv_store_idle_sweep(struct hkv_store *s);

/* Cluster: every sane LIVE or PENDING item of the index, until fn answers
 * non-zero (which is returned). */
struct hkv_block_hdr;
typedef int (*hkv_store_visit_fn)(void *arg, uint64_t *slot, uint64_t sl, struct hkv_block_hdr *h,
				  uint64_t meta);
int hkv_store_walk(struct hkv_store *s, hkv_store_visit_fn fn, void *arg);
/* Cluster: remove every live item whose key keep() returns 0 for (the
 * partitions this server gives up). Only while no client can reach them.
 * Returns how many were removed. */
uint64_t hkv_store_purge(struct hkv_store *s, int (*keep)(void *arg, const void *key, size_t klen),
			 void *arg);

#endif /* HKV_SERVER_STORE_H */
