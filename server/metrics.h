/*
 * metrics.h - hatchkv-server's metrics page (--metrics ADDR:PORT), served
 * by common/metrics.h on the server's event loop. Every metric, its type and
 * meaning: docs/metrics.md.
 *
 * What a scrape costs: counters the store keeps (struct hkv_store_stats,
 * the slab's), the region's fill as the sweep last summed it (it passes
 * SWEEP_SEGS segments every HKV_SLAB_TICK_MS, so a pass over nsegs segments
 * takes nsegs/80 s; hatchkv_region_fill_sampled_timestamp_seconds says
 * when it ended), and one walk of the segment table for the segments by
 * state: 8 bytes a segment (nsegs is region/segment size: 1024 for 1 GiB
 * at the default 1 MiB, 16384 at 64 KiB; a million segments, 64 GiB at
 * 64 KiB, is an 8 MB read, about a millisecond) - the walk every CARVE does
 * too. Nothing reads the index or the bitmaps. A cluster member's figures
 * are a copy, under the cluster's lock, of what its coordination thread
 * worked out from its last read of etcd (hkv_cluster_status): a scrape
 * asks etcd nothing.
 */
#ifndef HKV_SERVER_METRICS_H
#define HKV_SERVER_METRICS_H

#include "server/store.h"

struct evbuffer;
struct hkv_cluster;

struct hkv_server_metrics {
	const struct hkv_store *store; /* its data listener: none while fenced */
	const char *transport;         /* "shm" or "verbs" */
	int cluster;                   /* a cluster member (--cluster) */
	struct hkv_cluster *cl;        /* its membership once started, else NULL */
	double started;                /* Unix time the server started */
};

/* hkv_metrics_page_fn: arg is a struct hkv_server_metrics. */
void hkv_server_metrics_page(struct evbuffer *out, void *arg);

#endif /* HKV_SERVER_METRICS_H */
