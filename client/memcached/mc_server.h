/*
 * mc_server.h - hatchkv-memcached's daemon: memcached text protocol in front
 * of libhatchkv.
 *
 *                 accept thread (event_base + evconnlistener, signals)
 *                     | fd, round-robin: queue + event_active()
 *        +------------+------------+
 *     worker 0     worker 1   ...  worker N-1
 *     event_base   event_base      event_base     each owns ONE hkv_client
 *     conns        conns           conns          (the library's rule: one
 *     hkv_client   hkv_client      hkv_client      handle per thread)
 *
 * A connection lives on one worker for its whole life. Its read callback
 * parses every complete request in the input (mc_proto.h), executes it with
 * the worker's handle and appends the reply, so pipelined replies stay in
 * order; at most MC_BATCH requests per callback (then it re-arms itself) and
 * reading pauses while the output holds more than MC_OUT_HIGH bytes.
 * A handle that loses its server (HKV_EDISCONNECTED / HKV_ETIMEDOUT) is
 * closed; the next request on that worker opens a new one.
 *
 * --depth N > 1: a connection's pass (the parse-and-execute loop above) runs
 * as an HKV_PIPE_CALL on one of the worker's N lanes (hkv_pipe: a handle
 * each, with its own value buffers), keyed by the connection so its passes
 * run one after another; a lane waiting for the network lets the others
 * run. A zero-timeout timer (the pump) polls the pipe while anything is in
 * flight, between looks at the sockets. A connection freed while its pass
 * is in a lane is freed when the pipe hands the pass back.
 *
 * Counters are written by their worker only and read by any worker for
 * `stats`, and by the accept thread for a --metrics scrape (relaxed atomics;
 * handle counters through a mutex-guarded copy; mc_metrics.h).
 */
#ifndef HKV_MC_SERVER_H
#define HKV_MC_SERVER_H

#include <stddef.h>

#include "common/etcd.h"

struct mc_options {
	const char *listen_addr; /* default 127.0.0.1 */
	int port;                /* default 11211; 0 = any free port (logged) */
	int threads;             /* workers (default 4) */
	int depth;               /* requests in flight per worker (0: 1 on shm, else 8) */
	int max_conns;           /* 0: 1024, or what the descriptor limit allows */
	size_t item_max;         /* -I (default 1 MiB) */
	int verbose;
	int no_flush;            /* -F: flush_all refused, as memcached's -F */
	const char *server_uri;  /* hatchkv server: shm:PATH or verbs://host:port */
	const char *token_file;
	const char *metrics;     /* --metrics ADDR:PORT (Prometheus), NULL: off */
	struct hkv_etcd_sec etcd; /* --etcd-*: a cluster's etcd (common/etcd.h) */
	int retry_ms;            /* --retry-ms (cluster: a dead server's keys fail fast); -1: default */
};

/*
 * Open one handle per worker (failing fast if the hatchkv server cannot be
 * reached), listen, and serve until SIGINT or SIGTERM. Returns the exit
 * status for main(): 0 after a clean shutdown, 1 on a startup failure.
 */
int mc_server_run(const struct mc_options *opts);

#endif /* HKV_MC_SERVER_H */
