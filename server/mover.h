/*
 * mover.h - a store-mode move's copy (docs/design.md "Store mode: items
 * follow their partitions"): the losing server's CPU, fenced, copies every
 * live item the new map places elsewhere into its new home, as a client of
 * that home (the client library's hkv_put_copy: the new home's CPU stays
 * off the data path).
 *
 * The copy runs on the server's event loop in slices, so that the loop
 * answers its metrics page, its control socket and its timers while a
 * large copy goes on (STYLE.md 9: nothing O(n) in one callback):
 *
 *   start ──> COUNT slices ──> COPY slices ──> answer the job, free
 *             (bytes and items to copy: the progress's total)
 *
 * Each slice walks at most SLICE_SLOTS index slots and copies at most
 * SLICE_ITEMS items or SLICE_BYTES bytes, then reschedules itself with a
 * zero-timeout timer (libevent polls for I/O before it fires). The cursor
 * is a slot index: nothing moves an item to another slot while the server
 * is fenced (a segment move that relocates it between slices keeps its
 * slot), so every item is seen exactly once.
 *
 * Why a slice boundary lets no client write what is being copied: the copy
 * runs only while the region is fenced (s->fenced: no data connection, no
 * admission; checked at every slice, a copy that finds the server serving
 * fails), and the loser unfences only once the cluster thread has seen the
 * move end - which it does not even look at while a copy is out
 * (HKV_JOB_PENDING, cluster.h) - so the fence holds from before the first
 * slice until after the last. The cluster issues no other job meanwhile (a
 * purge could drop what is being copied). A copy whose move left etcd, or
 * whose registration ended (a lost lease), stops at its next slice.
 *
 * Progress (done, and the total counted first) goes to the cluster's
 * progress record (cluster.h hkv_cluster_progress_*): the metrics page and
 * PREFIX/progress/ID show it. Event-loop only.
 */
#ifndef HKV_SERVER_MOVER_H
#define HKV_SERVER_MOVER_H

#include <stdint.h>

struct event_base;
struct hkv_store;
struct hkv_cluster;
struct hkv_cluster_job;
struct hkv_move;

struct hkv_move_stats {
	uint64_t items, bytes; /* copied (keys + values) */
	uint64_t expired;      /* left behind: expired already */
};

/*
 * Start the copy a store-mode HKV_JOB_COPY asks for: the live, unexpired
 * items job->cur places on us (self) and job->map does not, to their new
 * primaries (job->homes, indexed like job->map->names), with `token` (copied
 * here). Takes job's maps and homes over (job keeps only its kind, revision
 * and generation); the caller still frees job. max_value: the largest value
 * to expect. Returns HKV_JOB_PENDING (cluster.h): the copy answers the job
 * itself (hkv_cluster_job_done) when it ends - 0, or its first error;
 * nothing is dropped here, the settle does that once the move committed. Or
 * a negative error, nothing started (job untouched).
 */
int hkv_move_start(struct event_base *base, struct hkv_store *s, struct hkv_cluster *cl,
		   struct hkv_cluster_job *job, const char *self, const char *token,
		   uint64_t max_value);

/* Stop a copy under way without answering its job (shutdown: the cluster
 * is being stopped); frees it. NULL: nothing. */
void hkv_move_abort(struct hkv_move *mv);

#endif /* HKV_SERVER_MOVER_H */
