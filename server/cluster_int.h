/*
 * cluster_int.h - what the cluster code's rooms share (cluster.h is the
 * public side). Not installed.
 *
 *   cluster.c      membership: lease, keepalive thread, registering, fencing,
 *                  the rejoin check, the round loop, start/stop, public API,
 *                  each round's figures for the metrics page (hkv_cluster_status)
 *   coordinator.c  terms, gone-since times, identity, the map, plans, commits
 *   moves.c        PREFIX/next and PREFIX/fill: driving and following moves
 *                  and repairs, the loop's jobs, acks, settling
 */
#ifndef HKV_SERVER_CLUSTER_INT_H
#define HKV_SERVER_CLUSTER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "server/cluster.h"

/* A loser that left (its lease ended) is given up on only once clients
 * that saw it a member can no longer route to it (their route lease). */


struct gone {
	char id[HKV_CLUSTER_ID_MAX];
	uint64_t since_ns; /* first round of this term that found it no member */
};

struct hkv_cluster {
	struct hkv_etcd *e;  /* the coordination thread's */
	struct hkv_etcd *ke; /* the keepalive thread's */
	char prefix[256], id[HKV_CLUSTER_ID_MAX];
	char member_key[512], removed_key[512];
	char *member_json;
	int ttl_s;
	uint32_t partitions, replicas;
	uint32_t route_lease_ms; /* for the first map (--route-lease-ms) */
	uint32_t map_lease_ms;   /* the route lease of the last map we read */
	uint32_t first_n;  /* replicated: members seen before the first map, since */
	uint64_t first_ns;
	pthread_t thr, kthr;
	int kthr_started;
	pthread_mutex_t lock;
	pthread_cond_t wake; /* CLOCK_MONOTONIC */
	int stop;            /* under lock */
	_Atomic int64_t lease;
	_Atomic uint64_t ok_sent_ns; /* CLOCK_BOOTTIME: sending time of the last answered keepalive */
	atomic_int lease_gone, rejoin, removed;
	int store_mode;
	/* Moves (cluster.h): while PREFIX/next takes partitions from us we are
	 * fenced. Store mode: also until the region holds only what the map
	 * places on us (settle: after each registration, after each move). */
	atomic_int move_fence, settle;
	_Atomic int64_t fill_live; /* PREFIX/fill's revision as last read (0: none) */
	/* Jobs for the loop, one at a time (cluster.h): job is issued and not
	 * yet taken, done_* the loop's answer (all under lock). */
	struct hkv_cluster_job *job;
	int done, done_kind, done_ret;
	/* a COPY taken over (HKV_JOB_PENDING) runs: no job, no step of a move */
	atomic_int copying;
	struct hkv_move *move; /* that copy (the loop's) */
	_Atomic int64_t next_live; /* PREFIX/next's revision as last read (0: none) */
	_Atomic uint32_t gen_live; /* reg_gen, for other threads */
	uint32_t done_gen;
	int64_t done_rev;
	/* the coordination thread's */
	int leader;
	int job_out;      /* a job issued, no answer yet */
	uint32_t reg_gen; /* registrations: answers to jobs of an older one are void */
	int settle_issued;
	int64_t acked_rev, fence_rev, purged_rev, copied_rev, intaken_rev, ready_rev;
	int copy_failures;
	uint64_t fence_ns;
	char *copy_crs; /* store mode: the registrations of the new homes a copy went to */
	int64_t next_seen_rev;
	uint64_t next_seen_ns, log_ns;
	/* the map's revision as last read while the lease was surely alive:
	 * a re-registration that finds the same one lost nothing (0: none) */
	int64_t served_map_rev;
	struct gone *gone;
	uint32_t ngone;
	/* repair (PREFIX/fill): as a primary that copies, the fill's revision,
	 * how far its passes are, failed passes; as a new replica, the fill we
	 * took in and said ready for, and its map (the move that ends it keeps
	 * what came in) */
	int64_t fill_rev, fill_in_rev;
	int fill_state; /* FILL_* */
	int fill_failures;
	struct hkv_cmap *fill_in_map;
	uint64_t fill_after_ns; /* the coordinator's: no new fill before (a failed one) */
	char fill_failed[HKV_CLUSTER_ID_MAX]; /* the new replica of the last failed fill */
	/* PREFIX/progress/ID (cluster.h hkv_cluster_progress_*): put, when */
	int progress_put;
	uint64_t progress_ns;
	/* the keepalive thread's */
	uint64_t klog_ns;
	_Atomic uint64_t leases_lost;
	/* what the metrics page shows (cluster.h hkv_cluster_status): `shown` and
	 * the *_ns stamps (CLOCK_BOOTTIME) under lock, written once a round by
	 * the coordination thread from its own `watch` */
	struct hkv_cluster_status shown;
	uint64_t shown_view_ns, shown_move_ns, shown_fill_ns;
	struct cl_watch *watch;
	/* the coordination thread's counters, copied into `shown` */
	uint64_t moves_committed, moves_dropped, repairs_filled, repairs_dropped;
	uint64_t jobs[HKV_JOB_FILL + 1][2], registrations;
};

/*
 * One round's view of the cluster: a single range over PREFIX/ (members,
 * drains, removals, the identity, the map, a pending move, acks, the
 * coordinator), so a round costs etcd one request however many questions it
 * answers.
 */
struct snap {
	struct hkv_etcd_kv *kvs;
	int n;
};

enum { FILL_COPYING, FILL_CONVERGED, FILL_SAID };

/* cluster.c */
uint64_t hkv_cl_boot_ns(void);
void hkv_cl_key_of(const struct hkv_cluster *cl, char *key, size_t cap, const char *dir,
		   const char *id);
const struct hkv_etcd_kv *hkv_cl_snap_get(const struct hkv_cluster *cl, const struct snap *sn,
					  const char *dir, const char *id);
int hkv_cl_is_member(struct hkv_cluster *cl, const struct snap *sn, const char *id);

/* coordinator.c */
int hkv_cl_gone_long_enough(struct hkv_cluster *cl, const char *id);
int hkv_cl_same_placement(const struct hkv_cmap *a, const struct hkv_cmap *b);
int hkv_cl_commit_map(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		      const struct hkv_cmap *want, int64_t rev, int del_next);
int hkv_cl_coordinate(struct hkv_cluster *cl, const struct snap *sn);

/* moves.c */
int hkv_cl_loses(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id);
int hkv_cl_gains(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id);
char *hkv_cl_next_format(const struct hkv_cmap *map, int64_t base);
int hkv_cl_next_parse(const struct hkv_etcd_kv *kv, struct hkv_cmap *map, int64_t *base);
int hkv_cl_drive_move(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *nk,
		      const struct hkv_cmap *cur, int64_t cur_rev);
int hkv_cl_drive_fill(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *fk,
		      const struct hkv_cmap *cur, int64_t cur_rev);
int hkv_cl_follow_move(struct hkv_cluster *cl, const struct snap *sn);

#endif
