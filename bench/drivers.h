/*
 * drivers.h - the systems hatchkv-bench measures, behind one small interface:
 *   hatchkv    the client library (one handle per thread; over a list of
 *              servers, a replicated handle: "hatchkv-rN")
 *   memcached  the memcached text protocol over TCP (Debian's memcached, or
 *              hatchkv-memcached later), one connection per thread
 * Every call is synchronous and returns 0, HKV_ENOTFOUND or another error.
 */
#ifndef HKV_BENCH_DRIVERS_H
#define HKV_BENCH_DRIVERS_H

#include <stddef.h>
#include <stdint.h>

struct drv_counters {
	uint64_t round_trips, bytes_read, bytes_written; /* hatchkv only */
	uint64_t wrs, atomics, signaled; /* work requests, CAS + FAA, completions */
};

/* a += b - c: what happened between two readings, added up */
static inline void drv_counters_add(struct drv_counters *a, const struct drv_counters *b,
				    const struct drv_counters *c)
{
	a->round_trips += b->round_trips - c->round_trips;
	a->bytes_read += b->bytes_read - c->bytes_read;
	a->bytes_written += b->bytes_written - c->bytes_written;
	a->wrs += b->wrs - c->wrs;
	a->atomics += b->atomics - c->atomics;
	a->signaled += b->signaled - c->signaled;
}

struct driver;
struct hkv_client_stats;

struct driver_ops {
	const char *name;
	int (*read)(struct driver *d, const char *key, size_t klen, uint8_t *buf, size_t cap,
		    size_t *vlen);
	int (*write)(struct driver *d, const char *key, size_t klen, const uint8_t *val,
		     size_t vlen);
	/* Remove a key: 0, or HKV_ENOTFOUND if it was not there. */
	int (*del)(struct driver *d, const char *key, size_t klen);
	/* Read n keys in one batch (status[i] per key); values land in bufs[i]. */
	int (*mread)(struct driver *d, const char *const *keys, const size_t *klens, int n,
		     uint8_t *const *bufs, size_t cap, int *status);
	void (*counters)(struct driver *d, struct drv_counters *out);
	/* hatchkv: the handle's counters (hkv_client_stats); NULL for others */
	void (*stats)(struct driver *d, struct hkv_client_stats *out);
	void (*close)(struct driver *d);
};

struct driver {
	const struct driver_ops *ops;
};

struct hkv_config;

/*
 * One config per system run, shared by every thread's handle, so they share
 * the location cache (the loader warms it for the readers), as threads of one
 * service would. NULL + message on failure.
 */
struct hkv_etcd_sec;
/* The replicas the last hatchkv handle opened writes (hkv_server_info:
 * a cluster's map's, a replicated handle's list). */
extern _Atomic unsigned driver_hatchkv_replicas_seen;
/* uris: one server, a cluster (etcd://..., reached as etcd says), or a
 * comma-separated list of replicas. */
struct hkv_config *driver_hatchkv_config(const char *uris, const char *token_file, size_t keys,
					  const struct hkv_etcd_sec *etcd);
/*
 * uris is one server's URI or a comma-separated list of 2 or 3 store-mode
 * servers, which the config replicates over (hkv_config_set_replicas), in
 * the order given: the first is the primary (the only one read), the last
 * the decider; every server takes the one token file. The number of URIs.
 */
int driver_hatchkv_replicas(const char *uris);
struct driver *driver_open_hatchkv(const struct hkv_config *cfg);
/* hostport: "127.0.0.1:11211". NULL + message on failure. */
struct driver *driver_open_memcached(const char *hostport);

#endif
