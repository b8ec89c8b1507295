/*
 * cluster.h - a memory server's membership in a cluster kept in etcd
 * (common/cluster_map.h says what lives where).
 *
 * A thread of its own talks to etcd (blocking calls, never in the server's
 * event loop):
 *
 *  - Membership: an etcd lease of ttl seconds, PREFIX/servers/ID under it,
 *    one keepalive POST every ttl/3. Deleted (lease revoked) on clean stop.
 *  - Fencing: hkv_cluster_fenced() turns true as soon as the lease may be
 *    near its end - ttl minus HKV_CLUSTER_GUARD_MS after the *sending* of
 *    the last keepalive that etcd answered (etcd restarted the TTL no
 *    earlier than that), or at once when etcd says the lease is gone. The
 *    server's event loop polls it every 100 ms and then stops serving: it
 *    closes every client's data connection (their rkeys and windows die
 *    with the queue pairs) and refuses new ones. So by the time etcd can
 *    expire the lease, and anyone can give this server's partitions away,
 *    no client can reach its memory. A fenced server whose lease is gone
 *    registers again with a new lease and reads the map: if it is the map
 *    it last read while its lease was alive (the same etcd revision), no
 *    partition moved meanwhile and it keeps its items (an etcd stall is not
 *    a loss); otherwise hkv_cluster_rejoined() tells the loop to empty the
 *    region first (cache mode; a store settles).
 *  - Terms: what a coordinator measures in memory ("gone since" times)
 *    is valid only in the term that measured it: a member that becomes
 *    coordinator, or registers again, starts its measures afresh.
 *  - Coordination: every member tries to hold PREFIX/coordinator under its
 *    lease; the holder recomputes PREFIX/map (rendezvous placement over the
 *    members not draining) whenever membership changes, by a transaction
 *    that compares the map's revision. Creates the map on first run with
 *    opts->partitions partitions and a random hash key.
 *  - Moves: a map change that takes partitions from a live server is
 *    two-phase. The coordinator writes the new map to PREFIX/next; each
 *    live server that gives partitions up fences itself (closes every
 *    client connection) and, in cache mode, purges the items of those
 *    partitions; in store mode it copies them into their new homes once
 *    those have emptied what they gain (PREFIX/ready/ID), and drops them
 *    only after the commit. It writes PREFIX/ack/ID; once all have, the
 *    coordinator commits PREFIX/map (compare on its revision and on the
 *    registrations of the servers involved) and deletes PREFIX/next, and
 *    they serve again. A client can thus never write into a partition's
 *    old home after its new home took writes: it must reconnect, and the
 *    router reads the map before it reconnects (client/router.c).
 *  - A replicated store (identity replicas > 1) drops a lost server from
 *    its lists, then repairs a short list: PREFIX/fill names the map to
 *    be (a member admitted behind the primary); the primary copies the
 *    partition into it online (HKV_JOB_FILL passes) and says filled/ID;
 *    the coordinator turns the fill into a move (PREFIX/next), for which
 *    every server on a list that grows fences while the primary runs the
 *    final pass (docs/design.md "Repair").
 *  - Store mode: a server that left keeps its partitions (clients get
 *    HKV_EUNAVAILABLE) until it is back on its --memory-file or removed.
 *  - An operator's `hatchkv-admin remove ID` (PREFIX/removed/ID) makes the
 *    server fence for good and hkv_cluster_removed() turn true.
 */
#ifndef HKV_SERVER_CLUSTER_H
#define HKV_SERVER_CLUSTER_H

#include <stdint.h>

struct hkv_cmap;
struct hkv_etcd_sec;

#define HKV_CLUSTER_GUARD_MS 1000 /* fence this long before the lease can end */

struct hkv_cluster_opts {
	const char *uri;      /* etcd://HOST:PORT/PREFIX */
	const struct hkv_etcd_sec *etcd; /* TLS and user (common/etcd.h) */
	const char *id;       /* this server's name */
	const char *endpoint; /* what clients connect to (verbs://... or shm:...) */
	const char *transport;
	uint64_t region_bytes;
	int ttl_s;            /* lease TTL (>= 2: etcd's minimum) */
	uint32_t partitions;  /* used if this server creates the map */
	uint32_t replicas;    /* the cluster's (its identity's) */
	uint32_t route_lease_ms; /* for the first map: clients route on views this young */
	int store_mode;       /* the cluster's mode (its identity's) */
};

struct hkv_cluster;

/* Registers (blocking, up to a few seconds) and starts the thread. NULL
 * and errno when etcd cannot be reached or the ID is taken by a live
 * member or was removed. */
struct hkv_cluster *hkv_cluster_start(const struct hkv_cluster_opts *o);
/* Deregisters (revokes the lease) and joins the thread. */
void hkv_cluster_stop(struct hkv_cluster *cl);

/* Event-loop side, thread-safe. */
int hkv_cluster_fenced(struct hkv_cluster *cl);
/* Why hkv_cluster_fenced() is true, for the log. */
const char *hkv_cluster_fence_reason(struct hkv_cluster *cl);
/* PREFIX/fill's revision as the cluster thread last read it (0: none): a
 * repair pass for another stops. */
int64_t hkv_cluster_fill_rev(struct hkv_cluster *cl);
/* Once after each re-registration that followed a lost lease, when the
 * map has been read: HKV_REJOIN_EMPTY (the map changed meanwhile: what the
 * region holds may be stale) or HKV_REJOIN_KEEP (the same map: keep it);
 * 0 otherwise (also while it is still reading: fenced meanwhile). */
#define HKV_REJOIN_EMPTY 1
#define HKV_REJOIN_KEEP  2
int hkv_cluster_rejoined(struct hkv_cluster *cl);
int hkv_cluster_removed(struct hkv_cluster *cl);
const char *hkv_cluster_id(const struct hkv_cluster *cl);
int hkv_cluster_store_mode(const struct hkv_cluster *cl);

/*
 * Work the cluster asks of the event loop, which owns the region. The loop
 * takes a job (hkv_cluster_take_job: NULL if none), does it, says how it
 * went with hkv_cluster_job_done() and frees it with hkv_cluster_job_free().
 *
 *  PURGE   drop every item `map` does not place on us. Cache mode: a
 *          loser's purge before it acks a move (rev > 0). Store mode: on
 *          (re)registration and when a move that fenced us is over, before
 *          serving (rev 0: settle); and, serving, on a gainer once the move
 *          it took copies for is over (rev -1: a dropped move's copies go).
 *  COPY    store mode, a loser (fenced): copy every live item `cur` places
 *          on us and `map` elsewhere to its new home (homes[], indexed like
 *          map.names) with the client library; drop nothing (that waits for
 *          the commit). Three failures: the loser acks "failed" and the
 *          coordinator drops the move.
 *          A replicated store's COPY is a fill's final pass (fill_rev, tag:
 *          the fill it ends; server/filler.h).
 *  INTAKE  store mode, a gainer: drop what we hold of the partitions `map`
 *          gives us and `cur` does not (left by a move that never
 *          committed), before the losers copy them in.
 *  FILL    a replicated store, the primary of partitions `map` (the fill's
 *          target) adds a replica to: one online pass copying their items
 *          into the new replicas (homes[]), serving on; rev is the fill's
 *          (PREFIX/fill) and tag names the new replicas' registrations.
 *          Answer 1: converged, 0: another pass is worth it. The loop runs
 *          it on a thread of its own.
 */
enum hkv_cluster_job_kind { HKV_JOB_PURGE = 1, HKV_JOB_COPY, HKV_JOB_INTAKE, HKV_JOB_FILL };

struct hkv_cmember;
struct hkv_cluster_job {
	enum hkv_cluster_job_kind kind;
	int64_t rev;          /* PREFIX/next's revision; 0, -1: see PURGE */
	struct hkv_cmap *map; /* the keeping map (see above) */
	struct hkv_cmap *cur; /* INTAKE, COPY: the map in force */
	struct hkv_cmember *homes;
	int64_t fill_rev;     /* COPY: the fill this final pass ends (0: none) */
	char *tag;            /* FILL, COPY of a fill: the new replicas' registrations */
	const char *self;     /* (the loop's) */
	uint32_t gen;         /* (the cluster thread's) */
};

struct hkv_cluster_job *hkv_cluster_take_job(struct hkv_cluster *cl);
/*
 * ret: 0 or an error; a FILL's 1 or 0 (above). HKV_JOB_PENDING: the job was
 * taken over by whoever runs it over several turns of the loop (a store
 * move's copy, server/mover.c), which answers again with the result when
 * it ends; until then the cluster issues no job and takes no step of a
 * move (it stays fenced, as it was).
 */
#define HKV_JOB_PENDING 0x7e57
void hkv_cluster_job_done(struct hkv_cluster *cl, const struct hkv_cluster_job *job, int ret);
void hkv_cluster_job_free(struct hkv_cluster_job *job);
/* Is the copy for job (a COPY taken over, see HKV_JOB_PENDING) void: its
 * move gone from etcd, or our registration over? (any thread) */
int hkv_cluster_copy_void(struct hkv_cluster *cl, const struct hkv_cluster_job *job);
/* The copy under way (server/mover.h; NULL: none), which hkv_cluster_stop
 * aborts if it still runs. The event loop's thread only. */
struct hkv_move;
void hkv_cluster_copy_attach(struct hkv_cluster *cl, struct hkv_move *mv);

/*
 * Progress of the copy or the repair pass this server runs (docs/metrics.md
 * hatchkv_cluster_move_bytes and _repair_bytes; PREFIX/progress/ID in etcd).
 * Written by whoever runs it - a store move's copy in the event loop's
 * slices (server/mover.c), a repair's passes on the fill thread and its
 * final pass on the loop (server/filler.c) - and read by the metrics page
 * and the coordination thread, which publishes it in etcd (at most once a
 * second, under the lease; deleted when it ends). One record of each kind
 * per process (a process is one server). Relaxed atomics: a reader may see
 * "done" from one moment and "total" from the next.
 */
enum hkv_progress_kind { HKV_PROGRESS_COPY, HKV_PROGRESS_REPAIR, HKV_PROGRESS_KINDS };
#define HKV_PROGRESS_UNKNOWN UINT64_MAX

struct hkv_progress {
	int64_t rev;         /* the move's (PREFIX/next) or fill's (PREFIX/fill) revision;
			      * 0: none runs */
	uint32_t pass;       /* a repair's pass (1, 2, ...); 0 for a copy */
	int final;           /* a repair's final pass (fenced) */
	double started;      /* Unix time it started */
	uint64_t bytes, items; /* done: copied so far (keys + values) */
	uint64_t bytes_total, items_total; /* to copy, as counted before the copy began
					    * (online: an estimate); HKV_PROGRESS_UNKNOWN
					    * while it is being counted */
};

void hkv_cluster_progress_begin(enum hkv_progress_kind k, int64_t rev, uint32_t pass, int final);
void hkv_cluster_progress_total(enum hkv_progress_kind k, uint64_t bytes, uint64_t items);
void hkv_cluster_progress_add(enum hkv_progress_kind k, uint64_t bytes, uint64_t items);
void hkv_cluster_progress_end(enum hkv_progress_kind k);
/* *out (rev 0: none runs). Any thread. */
void hkv_cluster_progress_read(enum hkv_progress_kind k, struct hkv_progress *out);

/*
 * What the metrics page shows of the cluster (docs/metrics.md, "Cluster").
 * The cluster thread works the figures out after each round from that
 * round's one read of PREFIX/ and publishes them under its lock, so a copy
 * holds one round's figures together; the lease's are read from the
 * keepalive thread's atomics at the call. The map and the members are as
 * this member last read them: view_age_s says how long ago.
 */
enum hkv_cluster_job_result { HKV_JOB_OK, HKV_JOB_FAILED };

struct hkv_cluster_status {
	double lease_left_s;      /* its lease's time left as the keepalive thread knows it
				   * (TTL from the sending of the last answered keepalive);
				   * 0 once etcd said it is gone */
	int lease_ttl_s;
	double view_age_s;        /* since the last read of PREFIX/ (-1: none yet) */
	int coordinator;          /* this member holds PREFIX/coordinator */
	int64_t term;             /* PREFIX/coordinator's create_revision (0: none) */
	int64_t map_rev;          /* PREFIX/map's mod_revision: the map's epoch (0: none) */
	uint32_t partitions, replicas; /* the map's */
	uint32_t primary, backup; /* partitions this member is first on, on further down */
	uint32_t under_replicated; /* lists shorter than replicas */
	uint32_t unavailable;     /* lists with no member on them */
	uint32_t members;         /* PREFIX/servers/ records */
	uint32_t map_servers, map_servers_down; /* named by the map; of them, no member */
	/* a move (PREFIX/next) and a repair (PREFIX/fill) under way, if any */
	int move, repair;
	double move_s, repair_s;  /* since this member first saw it */
	uint32_t move_partitions;  /* lists the move changes */
	uint32_t move_servers, move_acked; /* servers that give partitions up (or are on a
					    * list that grows); of them, acked */
	uint32_t repair_partitions; /* lists the repair grows */
	uint32_t repair_servers, repair_filled; /* primaries that copy; of them, converged */
	/* counters since the start */
	uint64_t moves_committed, moves_dropped;     /* as coordinator */
	uint64_t repairs_filled, repairs_dropped;    /* as coordinator */
	uint64_t jobs[HKV_JOB_FILL + 1][2];          /* [kind][hkv_cluster_job_result] */
	uint64_t leases_lost, registrations;
};

/* Fill *st (thread-safe; a copy under the cluster's lock). */
void hkv_cluster_status(struct hkv_cluster *cl, struct hkv_cluster_status *st);

#endif /* HKV_SERVER_CLUSTER_H */
