/*
 * store.h - the memory server's side of the store: it owns the region, lays
 * out its header (common/layout.h), hands out client ids and one-time data
 * plane tickets, carves segments into size classes when a client asks
 * (server/slab.c), and takes back blocks held past their time.
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
#include "server/atomics.h"

struct hkv_store_opts {
	uint64_t memory;     /* region bytes */
	uint32_t seg_size;   /* segment bytes (power of two); 0: hkv_seg_size_for(memory) */
	uint64_t index_slots;/* 0: derived from memory */
	int cache_mode;      /* evict instead of failing when full */
	uint32_t growth;     /* size classes' growth factor x 1000; 0: the mode's default */
	uint32_t max_clients;     /* connected + admitted at once; 0 = HKV_MAX_CLIENTS */
	const char *memory_file; /* NULL: anonymous memfd */
	/* the key hash's secret; NULL: random. A cluster's servers share the
	 * cluster's (its identity), so a client hashes a key once to find both
	 * its partition and its buckets (client/router.c). */
	const uint8_t *hash_key;
};

struct hkv_client_rec {
	uint8_t ticket[HKV_TICKET_LEN]; /* until redeemed on the data plane */
	uint8_t req_key[32]; /* its session's request key (GRANT, CARVE) */
	uint64_t req_seq;    /* the last request's sequence number */
	uint64_t ticket_expiry_ns; /* 0: redeemed or unused */
	int connected;
	int readonly; /* its rkey permits RDMA Read only */
	uint64_t source; /* while its ticket is pending: who asked (server/ctl.c source_key) */
};

/* Pending tickets by source (issue 28, item 6): a source's unredeemed
 * tickets are capped, so no one source holds every --max-clients place. */
#define HKV_PEND_SOURCES 1024
#define HKV_PEND_PROBES  16
struct hkv_pend_src {
	uint64_t key;
	uint32_t n;
};

/* A held block seen by the sweep (server/slab.c). */
struct hkv_sighting {
	uint64_t off, stamp, meta, first_ns;
};

struct hkv_sightings {
	struct hkv_sighting *v;
	uint32_t n, cap;
};

struct hkv_moved_in {
	uint64_t ns;
	uint32_t from;
};

/* The slab mover and the sweep of held blocks (server/slab.c). */
struct hkv_slab {
	int64_t drain_seg; /* the segment being moved, or -1 */
	uint32_t drain_from, drain_to;
	int drain_up; /* store mode: items may move to larger classes */
	uint32_t drain_items; /* store mode: live items moved out so far */
	uint64_t drain_entry, drain_start_ns;
	uint32_t undone_seg; /* the last move undone, and when (not picked again soon) */
	uint64_t undone_ns;
	struct hkv_sightings dprev, dcur; /* held blocks of the segment being moved */
	uint32_t sweep_next; /* next segment the sweep looks at */
	struct hkv_sightings prev, cur; /* held blocks of the last and this pass */
	uint64_t *named; /* warm restart: blocks a slot names, one bit per 64 B */
	struct hkv_moved_in *moved_in; /* per segment: its last move, when and from which class */
	uint64_t carved, moved, drains_aborted, evicted, held_reclaimed, relocated;
	uint64_t unstamped_reclaimed; /* of held_reclaimed: claims nobody stamped (kind 5) */
	uint32_t free_seq; /* the count in the freed stamps the server writes */
	/* the region's fill, summed by the sweep as it passes each segment and
	 * published when a pass ends (fill_ns: CLOCK_REALTIME then, 0: none yet) */
	struct hkv_slab_fill {
		uint64_t used_bytes; /* blocks not free in the bitmaps, x class size */
		uint32_t segs[3];    /* by enum hkv_seg_state */
		uint64_t start_ns;   /* CLOCK_REALTIME when the pass began */
	} fill_pass, fill;
	uint64_t fill_ns;
};

/*
 * What the server counts for its metrics (server/metrics.h): control-plane
 * refusals (server/ctl.c), grants and carves, the data plane's bad tickets
 * and keepalive drops. Event loop only, like the rest of the store.
 */
enum hkv_refusal {
	HKV_REFUSED_TOKEN,       /* AUTH with a wrong token */
	HKV_REFUSED_MAX_CLIENTS, /* AUTH at --max-clients */
	HKV_REFUSED_FENCED,      /* AUTH while fenced (cluster) */
	HKV_REFUSED_TICKET,      /* a data connection with a bad or stale ticket */
	HKV_REFUSED_MALFORMED,   /* a control request that does not decode */
	HKV_REFUSED_TOO_SLOW,    /* a control request not whole within its deadline */
	HKV_REFUSED_CONN_CAP,    /* a control connection over the caps (ctl.h) */
	HKV_REFUSED_NKINDS
};

struct hkv_store_stats {
	uint64_t refused[HKV_REFUSED_NKINDS];
	uint64_t rate_limited;   /* control requests answered "rate limited" */
	uint64_t admitted;       /* AUTHs answered WELCOME */
	uint64_t grants, grants_refused;
	uint64_t carves, carves_full, carves_refused;
	uint64_t keepalive_drops; /* connections the data plane's keepalives closed */
};

struct hkv_store {
	struct hkv_region region;
	/* The server's own geometry (issue 28): everything it divides by, loops
	 * over or indexes with comes from here, never from the region, whose
	 * header a writer can overwrite (shm, verbs --no-windows). The header
	 * is a copy for clients, put back by hkv_store_clock if it differs. */
	const struct hkv_geometry *geom; /* = &geom_own */
	struct hkv_geometry geom_own;
	uint64_t header_restores; /* times the header differed and was put back */
	uint64_t header_log_ns;
	struct hkv_client_rec *clients; /* indexed by client id (1..HKV_MAX_CLIENTS) */
	/* the writer given each claim-intent record last (client id, 0: none);
	 * no two writers with a ticket or a connection share one (layout.h) */
	uint16_t intent_owner[HKV_NINTENTS];
	uint32_t next_id;
	uint32_t nconnected;
	uint32_t npending; /* tickets handed out, not yet redeemed or expired by the tick */
	uint32_t npending_ro; /* ... of them to read-only clients */
	struct hkv_pend_src pend_src[HKV_PEND_SOURCES];
	uint32_t max_clients;
	struct hkv_listener *data; /* set once the data plane is up: grants bind on it */
	struct hkv_slab slab;
	struct hkv_satom atom; /* the server's atomics on client-reachable words */
	uint64_t fences;       /* clients fenced to take back their holds */
	int fenced; /* cluster: lease in doubt, serve nobody (server/cluster.h) */
	struct hkv_store_stats stats;
};

int hkv_store_init(struct hkv_store *s, const struct hkv_store_opts *o);
void hkv_store_fini(struct hkv_store *s);

/* Control plane: a client authenticated from source (server/ctl.c
 * source_key); fill its welcome (id + ticket, valid HKV_TICKET_TTL_S).
 * -EUSERS at the client limit, when the source already holds its share of
 * pending tickets (a quarter of --max-clients, at least 8), or read-only
 * clients theirs (a quarter, at least 2); HKV_EDISCONNECTED while fenced. */
#define HKV_TICKET_TTL_S 5
int hkv_store_admit(struct hkv_store *s, struct hkv_ctl_welcome *w, int readonly,
		    uint64_t source, const uint8_t req_key[32]);
/* Does a connected writer's claim-intent record name bitmap word word_off
 * (its region offset)? 1 too in a region without intents (layout.h). */
int hkv_store_intent_covers(const struct hkv_store *s, uint64_t word_off);
/* Is body (a GRANT or CARVE of client id) from the session we welcomed it
 * in - its MAC by that session's request key matches - and newer than any
 * before (seq above the last: a request seen on the way cannot be sent
 * again)? 1 (and seq is now the last), or 0. */
int hkv_store_request_ok(struct hkv_store *s, uint32_t id, uint64_t seq, uint16_t type,
			 const void *body, size_t len);

/* Transport callbacks (arg = the store). */
int hkv_store_on_connect(void *arg, const void *hello, size_t len, struct hkv_accept_info *out);
void hkv_store_on_disconnect(void *arg, uint64_t cookie);

/*
 * Control plane, memory windows: a connected client asks for its rights
 * (see struct hkv_ctl_grant, checked by hkv_store_request_ok first): READ
 * over the region and, for writers, ATOMIC past the header (atomic_rkey)
 * and WRITE over the data area (write_rkey).
 * Fills *out; returns 0, HKV_EAUTH (not a connected client),
 * -EINVAL, -EOPNOTSUPP (no windows), -EINPROGRESS (ask again), or the
 * bind's error. *why is for the ERROR reply.
 */
int hkv_store_grant(struct hkv_store *s, const struct hkv_ctl_grant *g,
		    struct hkv_ctl_granted *out, const char **why);
/* Control plane: a connected writer asks for a segment of class cls
 * (struct hkv_ctl_carve): 0 with *out filled, HKV_EFULL, -EINPROGRESS (a
 * segment is being moved: ask again), HKV_EAUTH, -EPERM, -EINVAL. */
int hkv_store_carve(struct hkv_store *s, const struct hkv_ctl_carve *req,
		    struct hkv_ctl_carved *out, const char **why);

/*
 * Fence client id (server/slab.c, before it takes back a block the client
 * holds): once this returns 0 nothing the client posts can land any more
 * (hkv_listener_fence) and it is disconnected; it connects again at its
 * next operation, without the blocks it held. 0, or -EINPROGRESS (shm: a
 * chain of it is in flight, maybe stopped there: ask again later).
 */
int hkv_store_fence(struct hkv_store *s, uint32_t id);

/* Expire tickets not redeemed in time; called from a 1 s timer. */
void hkv_store_tick(struct hkv_store *s);
/* Store the region's clock word: this server's Unix time in ms (layout.h,
 * HKV_CLOCK_OFF); and put the header's geometry back from the server's own
 * copy if a writer changed it (a memcmp of its few hundred bytes). Every
 * HKV_CLOCK_TICK_MS, and before the first client. */
void hkv_store_clock(struct hkv_store *s);

/* server/slab.c. Carve a segment for class cls (see hkv_store_carve). */
int hkv_slab_carve(struct hkv_store *s, uint32_t cls, uint64_t keep_off, int move,
		   uint32_t *seg);
/* A step of a move in progress, and a few segments' held blocks looked at;
 * every HKV_SLAB_TICK_MS. */
#define HKV_SLAB_TICK_MS 100
void hkv_slab_tick(struct hkv_store *s);
/* Segments by state now (out[enum hkv_seg_state]): a walk of the segment
 * table, 8 bytes a segment (no bitmap, no index); invalid entries left out. */
void hkv_slab_seg_counts(const struct hkv_store *s, uint32_t out[3]);
/* Warm restart, before any client: exact bitmaps, moves undone. */
int hkv_slab_rebuild(struct hkv_store *s);
void hkv_slab_fini(struct hkv_store *s);

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
