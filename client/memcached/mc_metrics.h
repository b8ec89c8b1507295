/*
 * mc_metrics.h - hatchkv-memcached's counters and its metrics page
 * (--metrics ADDR:PORT, served by common/metrics.h on the accept thread's
 * event loop). Every metric, its type and meaning: docs/metrics.md.
 *
 * A worker writes its own struct mc_counters alone (relaxed atomic
 * stores); a scrape sums every worker's with relaxed atomic loads, and the
 * library's handle counters from each worker's mutex-guarded copy
 * (mc_server.c, publish_stats), so a scrape races with nothing and costs
 * O(workers). Item and byte counts come only from the last `stats` walk of
 * the index (at most one every 5 s, by a `stats` command), with its time:
 * a scrape never walks the index.
 */
#ifndef HKV_MC_METRICS_H
#define HKV_MC_METRICS_H

#include <stdint.h>
#include <time.h>

#include "client/memcached/mc_proto.h"
#include "hatchkv.h"

struct evbuffer;

#define MC_NCMDS (MC_CMD_MN + 1) /* commands by enum mc_cmd */

/* memcached-style counters of one worker (written by it alone), all
 * uint64_t: they are summed as an array. */
struct mc_counters {
	uint64_t cmd_get, cmd_set, cmd_touch, cmd_flush, get_hits, get_misses;
	uint64_t get_expired, delete_hits, delete_misses, incr_hits, incr_misses;
	uint64_t decr_hits, decr_misses, cas_hits, cas_misses, cas_badval;
	uint64_t touch_hits, touch_misses, bytes_read, bytes_written, hkv_errors;
	/* replies "ERROR", "CLIENT_ERROR ...", "SERVER_ERROR ..." */
	uint64_t err_error, err_client, err_server;
	uint64_t cmds[MC_NCMDS]; /* requests by command (a multi-key get is one) */
};

/* What a scrape shows, gathered by mc_server.c. */
struct mc_metrics_snap {
	struct mc_counters c;      /* summed over the workers */
	struct hkv_client_stats h; /* the library's, summed over every handle */
	uint64_t curr_conns, total_conns, rejected_conns;
	int workers, depth, max_conns, in_flight_peak;
	time_t started;
	/* the last `stats` walk of the index; counted_at 0: none yet */
	uint64_t items, bytes;
	time_t counted_at;
};

/* The page: appends every family of s to out. */
void mc_metrics_page(struct evbuffer *out, const struct mc_metrics_snap *s);

#endif /* HKV_MC_METRICS_H */
