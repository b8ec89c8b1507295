/*
 * hatchkv.h - client library of hatchkv, a remote-memory key-value store.
 *
 * A client handle connects to a memory server and then does every
 * operation itself with one-sided RDMA (or the same-host shm transport):
 * lookups are RDMA Reads, writes are an RDMA Write of a new block published
 * by a compare-and-swap on an 8-byte index slot. The server's CPU is not
 * involved. Operations are linearizable per key.
 *
 *   struct hkv_config *cfg = hkv_config_new();
 *   hkv_config_set_server(cfg, "verbs://192.0.2.1:7700");   or "shm:/tmp/hatchkv.sock"
 *   hkv_config_set_token_file(cfg, "hatchkv.token");
 *   struct hkv_client *c;
 *   if (hkv_open(cfg, &c) == 0) {
 *           hkv_set(c, "k", 1, "v", 1, NULL);
 *           ...
 *           hkv_close(c);
 *   }
 *   hkv_config_free(cfg);
 *
 * Threads: a handle is used by one thread at a time (one handle per thread
 * is the model; open as many as you like per process). Configs are
 * read-only after hkv_open() and may be shared.
 *
 * Read-only clients (authenticated with the server's read-only token) may
 * only read: their rkey permits RDMA Read alone, and writes return -EPERM.
 *
 * A handle that loses its server (HKV_EDISCONNECTED, HKV_ETIMEDOUT) connects
 * again by itself on a later operation, at most every 200 ms; until it
 * succeeds, operations fail at once with HKV_EDISCONNECTED.
 *
 * Errors: int functions return 0 or a negative code (hatchkv_err.h);
 * hkv_strerror() names it. Keys are 1..250 bytes of any value; values up to
 * the server's largest block (1 MiB by default; hkv_config_set_max_value()
 * lowers the limit).
 */
#ifndef HATCHKV_H
#define HATCHKV_H

#include <stddef.h>
#include <stdint.h>

#include "hatchkv_err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HKV_VERSION_NUMBER 0x000100 /* 0.1.0: major << 16 | minor << 8 | patch */

/* "0.1.0"; static storage. */
HKV_EXPORT const char *hkv_version(void);

/* ---- configuration -------------------------------------------------------- */

struct hkv_config;

/* New config with defaults (timeout 5000 ms, location cache 262144 entries). NULL + errno. */
HKV_EXPORT struct hkv_config *hkv_config_new(void);
HKV_EXPORT void hkv_config_free(struct hkv_config *cfg);
/*
 * Add a memory server: "shm:/path/to/control.sock" or "verbs://host:port"
 * (port = the server's control port), or a cluster of them kept in etcd:
 * "etcd://HOST:PORT/PREFIX" (the handle reads the partition map there,
 * follows its changes, and opens a connection per server when a key first
 * needs it; every per-key operation is the single-server protocol on the
 * key's server). One entry per config (hkv_open fails with -ENOTSUP for
 * more), except with hkv_config_set_replicas(). The string is copied.
 */
HKV_EXPORT int hkv_config_add_server(struct hkv_config *cfg, const char *uri);
/*
 * Replicate every write on the servers added, r of them (2 or 3; 1, the
 * default, is no replication), in the order added: the first is the
 * primary, the only one read; the others are backups, the last the one
 * that decides between racing writes. A write returns once it holds on
 * every server, so losing any r - 1 of them loses no acknowledged write. A
 * GET is still one RDMA READ of the primary. Membership is fixed: while a
 * server is unreachable, writes fail - HKV_EUNKNOWN once one may have taken
 * effect (it is finished by the next write of its key) - and, if it is the
 * primary, reads too. Store-mode servers only. hkv_flush_all is not
 * supported (-ENOTSUP). docs/design.md, "Replicas".
 */
HKV_EXPORT int hkv_config_set_replicas(struct hkv_config *cfg, int r);
/* The shared secret, directly or from a file (read at hkv_open). Copied. */
HKV_EXPORT int hkv_config_set_token(struct hkv_config *cfg, const char *token);
HKV_EXPORT int hkv_config_set_token_file(struct hkv_config *cfg, const char *path);
/*
 * How to reach the etcd of a cluster (an "etcd://" server): name is an
 * option of the programs without its "--etcd-": "cacert" (TLS, etcd's
 * certificate verified with this PEM CA), "cert" and "key" (a client
 * certificate), "user" and "password-file" (etcd's authentication; the
 * client role needs only read access under the cluster's prefix), or
 * "insecure" (value NULL or "1": allow etcd without TLS and a user, logged).
 * Without TLS and a user and without "insecure", hkv_open of a cluster
 * fails with -EPERM. Copied. 0 or -EINVAL / -ENOMEM.
 */
HKV_EXPORT int hkv_config_set_etcd(struct hkv_config *cfg, const char *name, const char *value);
/*
 * Cluster: once a server is found dead (nobody answers where etcd says it
 * is, or it is no member any more, for up to a second), operations on its
 * partitions fail at once with HKV_EUNAVAILABLE for ms milliseconds; then
 * one operation tries it again (a probe, no waiting) - as memcached
 * clients' retry timeout. A new map ends it at once. Default 250; 0: every
 * operation waits up to the second again.
 */
#define HKV_RETRY_MS_DEFAULT 250
HKV_EXPORT int hkv_config_set_retry_ms(struct hkv_config *cfg, int ms);
/* How long any one remote wait may take before HKV_ETIMEDOUT. */
HKV_EXPORT int hkv_config_set_timeout_ms(struct hkv_config *cfg, int ms);
/* Largest value this handle writes or reads (<= the server's limit). */
HKV_EXPORT int hkv_config_set_max_value(struct hkv_config *cfg, size_t bytes);
/* Entries of the key -> location cache (0 disables it; rounded to 2^n). The cache
 * is shared by every handle opened from this config, across threads. */
HKV_EXPORT int hkv_config_set_cache_entries(struct hkv_config *cfg, size_t n);

/* ---- handles ---------------------------------------------------------------- */

struct hkv_client;

/*
 * Connect: authenticate on the control plane, open the data connection,
 * read and validate the region header. Returns 0 and *out, or an error:
 * HKV_EAUTH (token refused), HKV_EPROTO (version mismatch), HKV_ECORRUPT
 * (region header fails validation), HKV_EDISCONNECTED, -ECONNREFUSED, ...
 */
HKV_EXPORT int hkv_open(const struct hkv_config *cfg, struct hkv_client **out);
/* Return unused memory to the server's free lists and disconnect. */
HKV_EXPORT void hkv_close(struct hkv_client *c);

/* ---- operations ----------------------------------------------------------- */

struct hkv_item_info {
	uint64_t version; /* for hkv_cas(): new with every write of the key; kept by a touch
			   * (not on a replicated handle, where a touch is a write like
			   * any other) and when a server moves the item */
	uint32_t flags;   /* opaque client flags stored with the value */
	uint32_t exptime; /* absolute Unix time it expires, 0 = never */
};

struct hkv_write_opts {
	uint32_t flags;  /* stored with the value */
	int64_t exptime; /* memcached rules: 0 never, <= 30 days relative seconds,
			    else absolute Unix time; negative: already expired */
};

/*
 * Read key. Copies the value into buf (cap bytes) and sets *vlen to its
 * length. If cap is too small, copies nothing, sets *vlen and returns
 * -ENOSPC. info may be NULL. HKV_ENOTFOUND when absent or expired.
 */
HKV_EXPORT int hkv_get(struct hkv_client *c, const void *key, size_t klen, void *buf, size_t cap,
		       size_t *vlen, struct hkv_item_info *info);

/*
 * Read key without copying: *val points at the value inside the handle's
 * registered read buffer, where its READ landed; valid until the handle's
 * next operation (any), never to be written. Otherwise as hkv_get (a value
 * is never too big for it: HKV_ETOOBIG if larger than the handle reads).
 */
HKV_EXPORT int hkv_get_view(struct hkv_client *c, const void *key, size_t klen, const void **val,
			    size_t *vlen, struct hkv_item_info *info);

/* Store unconditionally. opts may be NULL. */
HKV_EXPORT int hkv_set(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, const struct hkv_write_opts *opts);
/* Store only if absent (else HKV_EEXISTS). */
HKV_EXPORT int hkv_add(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, const struct hkv_write_opts *opts);
/* Store only if present (else HKV_ENOTFOUND). */
HKV_EXPORT int hkv_replace(struct hkv_client *c, const void *key, size_t klen, const void *val,
			   size_t vlen, const struct hkv_write_opts *opts);
/* The version (hkv_item_info.version) of the value this handle's last
 * successful set, add, replace, cas, append, prepend, incr, decr or touch
 * stored - what a get right after it would say, without the round trip
 * (memcached's meta "c" flag). Undefined after any other operation. */
HKV_EXPORT uint64_t hkv_last_version(const struct hkv_client *c);
/* Store only if the item's version is still `version` (else HKV_EVERSION). */
HKV_EXPORT int hkv_cas(struct hkv_client *c, const void *key, size_t klen, const void *val,
		       size_t vlen, uint64_t version, const struct hkv_write_opts *opts);
/* Append / prepend to an existing value (HKV_ENOTFOUND if absent). */
HKV_EXPORT int hkv_append(struct hkv_client *c, const void *key, size_t klen, const void *val,
			  size_t vlen, int prepend);
/* hkv_append only if the item's version is still `version`, atomically:
 * HKV_EVERSION otherwise. */
HKV_EXPORT int hkv_append_if(struct hkv_client *c, const void *key, size_t klen, const void *val,
			     size_t vlen, int prepend, uint64_t version);
/* Remove (HKV_ENOTFOUND if absent). */
HKV_EXPORT int hkv_delete(struct hkv_client *c, const void *key, size_t klen);
/* Only if the item's version is still `version`, as one atomic step (the
 * remove CASes exactly the item whose version was checked): 0,
 * HKV_EVERSION, HKV_ENOTFOUND. */
HKV_EXPORT int hkv_delete_if(struct hkv_client *c, const void *key, size_t klen,
			     uint64_t version);
/*
 * Add delta to a value that is a decimal unsigned 64-bit number (memcached
 * rules: incr wraps at 2^64, decr stops at 0). *result gets the new value.
 * HKV_ENOTFOUND if absent, HKV_ENOTNUM if not a number.
 */
HKV_EXPORT int hkv_incr(struct hkv_client *c, const void *key, size_t klen, uint64_t delta,
			uint64_t *result);
HKV_EXPORT int hkv_decr(struct hkv_client *c, const void *key, size_t klen, uint64_t delta,
			uint64_t *result);
/* Change only the expiry time (HKV_ENOTFOUND if absent). */
HKV_EXPORT int hkv_touch(struct hkv_client *c, const void *key, size_t klen, int64_t exptime);

/*
 * Invalidate every item stored now (memcached flush_all): walks the whole
 * index with batched reads and removes each entry it finds, like delete.
 * Items stored concurrently with the walk may survive. Rare and slow (the
 * index size / 64 KiB round trips); not for the data path.
 */
HKV_EXPORT int hkv_flush_all(struct hkv_client *c);

/*
 * Count the entries of the index (*items) and the bytes of the blocks they
 * name (*bytes: block sizes, header and class rounding included). Walks the
 * whole index (index size / 8 KiB round trips): for stats, not the data
 * path. Entries being inserted or removed at that moment may be off by one.
 * Through a replicated handle or cluster it counts keys: each once (on its
 * primary), and not a deleted one, whose tombstones stay in the replicas'
 * indexes; that walk also reads each entry's header and key (one more round
 * trip per 128 entries).
 */
HKV_EXPORT int hkv_count_items(struct hkv_client *c, uint64_t *items, uint64_t *bytes);

/* What the server announced: limits and mode. */
struct hkv_server_info {
	uint64_t region_bytes;   /* whole registered region */
	uint64_t index_slots;    /* 8-byte slots in the hash index */
	uint64_t value_bytes;    /* bytes of the value area (segments) */
	uint64_t segment_bytes;  /* one segment */
	uint32_t max_value;      /* largest value this handle accepts for any key */
	uint32_t max_item;       /* a shorter key leaves room for a longer value: a
				  * value fits if 48 (the block header) + key +
				  * value <= max_item and value <= the configured
				  * max value (hkv_config_set_max_value) */
	int cache_mode;          /* 1: writers evict when full; 0: HKV_EFULL */
	uint32_t replicas;       /* copies of each item: 1; a replicated handle's
				  * servers; a cluster's map's replicas */
};
HKV_EXPORT void hkv_server_info(const struct hkv_client *c, struct hkv_server_info *out);

/* One key of a multi-get: in key/klen/buf/cap; out vlen/status/info. */
struct hkv_mget_item {
	const void *key;
	size_t klen;
	void *buf;
	size_t cap;
	size_t vlen;
	int status; /* as hkv_get() returns */
	struct hkv_item_info info;
};

/* Read n keys with batched round trips. Returns 0 (see each status) or an error. */
HKV_EXPORT int hkv_mget(struct hkv_client *c, struct hkv_mget_item *items, size_t n);

/* ---- counters --------------------------------------------------------------- */

enum hkv_op {
	HKV_OP_GET,
	HKV_OP_SET,
	HKV_OP_ADD,
	HKV_OP_REPLACE,
	HKV_OP_CAS,
	HKV_OP_APPEND,
	HKV_OP_DELETE,
	HKV_OP_INCR,
	HKV_OP_TOUCH,
	HKV_OP_MGET,
	HKV_OP_NTYPES
};

struct hkv_op_stats {
	uint64_t count;
	uint64_t round_trips;
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t retries; /* restarts after a conflict or a torn read */
};

struct hkv_client_stats {
	struct hkv_op_stats op[HKV_OP_NTYPES];
	uint64_t cache_hits, cache_misses; /* location cache */
	/* shared pools (docs/design.md, "Memory that flows"): claim chains won
	 * and lost, blocks they took, blocks freed, bitmap surveys, CARVE
	 * requests to the server, held blocks given back; blocks_abandoned stays
	 * 0 (held blocks go back at any age since the server fences a holder
	 * before it takes any back; the field stays for the ABI) */
	uint64_t claims, claims_lost, blocks_claimed, blocks_freed;
	uint64_t surveys, carves, blocks_given_back, blocks_abandoned;
	uint64_t blocks_kept; /* of the freed: kept for our own next write, no claim */
	uint64_t corrupt_reads; /* blocks that failed validation */
	uint64_t evictions;     /* live items this handle evicted (cache mode) */
	uint64_t reconnects;    /* times the handle connected again after losing the server */
	uint64_t expired_reclaimed; /* expired items this handle removed */
	uint64_t grants; /* memory windows the server bound for it */
	/* writes whose view went stale past the ABA horizon inside the post
	 * (docs/design.md): detected after the fact, undone, retried; never a success */
	uint64_t stale_undone;
	uint64_t stale_views; /* writes that re-read the key: view older than the bound */
	/* replicas (hkv_config_set_replicas, or a replicated cluster): decided
	 * writes of others this handle finished, its own writes that returned
	 * HKV_EUNKNOWN, and those a write decided after a lost replica replaced
	 * (done again on the new map) */
	uint64_t repl_helps, repl_unknown, repl_superseded;
	/* cluster: operations failed at once (HKV_EUNAVAILABLE) on a server
	 * found dead, within its retry interval (hkv_config_set_retry_ms) */
	uint64_t fail_fast;
	/* cache mode: refills ahead that evicted nothing because a quarter of
	 * the blocks sampled were free (another client's flush or deletes) */
	uint64_t evictions_spared;
	/* replicas: tombstones this handle's deletes took off every replica
	 * again (docs/design.md, "Tombstones are reclaimed") */
	uint64_t repl_reclaimed;
};

/* Counters of this handle since hkv_open(). */
HKV_EXPORT void hkv_client_stats(const struct hkv_client *c, struct hkv_client_stats *out);
/*
 * The region's clock, Unix seconds: the server's, as this handle knows it
 * (refreshed at least every second it is used). Every TTL and expiry is on
 * this clock, never the caller's: an absolute exptime means this clock's
 * time; hkv_item_info.exptime is on it too, so a TTL left is
 * exptime - hkv_time(). A cluster's: one reachable member's (servers are
 * assumed NTP-close); with none reachable, this host's.
 */
HKV_EXPORT uint32_t hkv_time(struct hkv_client *c);
/* Work requests posted since hkv_open() (a cluster's or replicated handle's:
 * summed over its members): all of them, the atomics among them (CAS and
 * fetch-and-add), and the signaled ones (a completion each to reap). */
HKV_EXPORT void hkv_client_wrs(const struct hkv_client *c, uint64_t *wrs, uint64_t *atomics,
			       uint64_t *signaled);
/* Just the transport totals since hkv_open() (cheap enough to call per op). */
HKV_EXPORT void hkv_client_totals(const struct hkv_client *c, uint64_t *round_trips,
				  uint64_t *bytes_read, uint64_t *bytes_written);

/* ---- operations in flight -------------------------------------------------- */

/*
 * A pipe keeps up to `depth` operations in flight from one thread. Submit
 * operations (they are queued, not run), then poll: polling runs them, each
 * on a lane of its own (a handle with its own connection, opened from the
 * config, in a coroutine), switching to another lane whenever one waits for
 * the network, and hands back finished operations. Operations on different
 * keys proceed at once; operations on one key complete in submission
 * order. Each behaves exactly as the blocking call of the same name (same
 * results and errors; a lane whose server is lost fails its operation, and
 * every later one reconnects or fails likewise: none is left hanging).
 * Rare waits inside an operation (back-off after contention, waiting for
 * memory to free up) still sleep the whole thread. Not thread-safe: one
 * thread per pipe, as a handle.
 */
struct hkv_pipe;

enum hkv_pipe_kind {
	HKV_PIPE_GET, HKV_PIPE_SET, HKV_PIPE_ADD, HKV_PIPE_REPLACE, HKV_PIPE_CAS,
	HKV_PIPE_DELETE, HKV_PIPE_INCR, HKV_PIPE_DECR, HKV_PIPE_TOUCH,
	/*
	 * The caller's own function, status = call(h, lane, user): it may make
	 * any blocking calls on h, the lane's handle (and on nothing that would
	 * block elsewhere), and yields to the other lanes whenever h waits for
	 * the network - several steps (a get, then a cas) as one operation in
	 * flight. lane (0..depth-1) names the lane, for per-lane buffers. key
	 * orders it as for the others: calls with the same key bytes (any
	 * bytes, e.g. a connection's address) run one after another, in
	 * submission order; klen 0 orders it after every other keyless op.
	 */
	HKV_PIPE_CALL
};

struct hkv_pipe_op {
	/* in: what to do (the memory stays the caller's until the op is done) */
	enum hkv_pipe_kind kind;
	const void *key;
	size_t klen;
	const void *val;              /* SET/ADD/REPLACE/CAS */
	size_t vlen;
	struct hkv_write_opts opts;   /* SET/ADD/REPLACE/CAS; TOUCH: opts.exptime */
	uint64_t version;             /* CAS */
	uint64_t delta;               /* INCR/DECR */
	void *buf;                    /* GET: where the value goes */
	size_t cap;
	void *user;                   /* the caller's */
	int (*call)(struct hkv_client *h, int lane, void *user); /* CALL */
	/* out, once hkv_pipe_poll() returned it */
	int status;                   /* what the blocking call returns */
	size_t out_vlen;              /* GET */
	struct hkv_item_info info;    /* GET */
	uint64_t number;              /* INCR/DECR: the new value */
};

/* Open depth (1..64) lanes from cfg. 0, or hkv_open's error. */
HKV_EXPORT int hkv_pipe_open(const struct hkv_config *cfg, int depth, struct hkv_pipe **out);
/* Finish every operation submitted (their results are dropped), close. */
HKV_EXPORT void hkv_pipe_close(struct hkv_pipe *p);
/* Queue op. 0, or -EAGAIN when 4 x depth operations are queued or in
 * flight and not yet returned by hkv_pipe_poll (poll first). */
HKV_EXPORT int hkv_pipe_submit(struct hkv_pipe *p, struct hkv_pipe_op *op);
/* Run the operations until at least one is done (or none is pending) and
 * return up to max of the finished ones in done[]: how many. */
HKV_EXPORT int hkv_pipe_poll(struct hkv_pipe *p, struct hkv_pipe_op **done, int max);
/* Submitted and not yet returned by hkv_pipe_poll(). */
HKV_EXPORT int hkv_pipe_pending(const struct hkv_pipe *p);
/* The most operations that were running on lanes at once since open
 * (how deep the pipe really got: operations on one key run one by one). */
HKV_EXPORT int hkv_pipe_peak(const struct hkv_pipe *p);
/* The lanes' counters, added up. */
HKV_EXPORT void hkv_pipe_stats(const struct hkv_pipe *p, struct hkv_client_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* HATCHKV_H */
