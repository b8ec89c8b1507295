/* metrics.c - see metrics.h; the names and meanings are in docs/metrics.md. */
#include "server/metrics.h"

#include <stdio.h>

#include <event2/buffer.h>

#include "common/metrics.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "server/cluster.h"

static const char *const refusal_names[HKV_REFUSED_NKINDS] = {
	[HKV_REFUSED_TOKEN] = "wrong_token",     [HKV_REFUSED_MAX_CLIENTS] = "max_clients",
	[HKV_REFUSED_FENCED] = "fenced",         [HKV_REFUSED_TICKET] = "bad_ticket",
	[HKV_REFUSED_MALFORMED] = "malformed",   [HKV_REFUSED_TOO_SLOW] = "too_slow",
	[HKV_REFUSED_CONN_CAP] = "connection_cap",
};

static const char *const seg_names[3] = {
	[HKV_SEG_FREE] = "free", [HKV_SEG_SHARED] = "shared", [HKV_SEG_DRAINING] = "draining"};

static const char *const job_names[HKV_JOB_FILL + 1] = {
	[HKV_JOB_PURGE] = "purge", [HKV_JOB_COPY] = "copy", [HKV_JOB_INTAKE] = "intake",
	[HKV_JOB_FILL] = "repair_pass"};

/* A family of two samples: name{label="a"} va, name{label="bn"} vb. */
static void pair(struct evbuffer *b, const char *name, const char *type, const char *help,
		 const char *label, const char *a, uint64_t va, const char *bn, uint64_t vb)
{
	char lab[64];

	hkv_metrics_family(b, name, type, help);
	snprintf(lab, sizeof(lab), "%s=\"%s\"", label, a);
	hkv_metrics_sample(b, name, lab, va);
	snprintf(lab, sizeof(lab), "%s=\"%s\"", label, bn);
	hkv_metrics_sample(b, name, lab, vb);
}

/* The member: its lease, its view of etcd, its coordination. */
static void page_membership(struct evbuffer *b, const struct hkv_cluster_status *c)
{
	hkv_metrics_gauge(b, "hatchkv_cluster_lease_seconds_left",
			  "Seconds the member's etcd lease has left as its keepalive thread knows "
			  "it (the TTL from the sending of the last answered keepalive); 0 once "
			  "lost. It fences at 1 s.", c->lease_left_s);
	hkv_metrics_gauge(b, "hatchkv_cluster_lease_ttl_seconds", "The lease's TTL (--lease-ttl).",
			  c->lease_ttl_s);
	hkv_metrics_counter(b, "hatchkv_cluster_leases_lost_total",
			    "Times etcd said the member's lease was gone.", c->leases_lost);
	hkv_metrics_counter(b, "hatchkv_cluster_registrations_total",
			    "Registrations (a new lease and member key): 1 at start, 1 more after "
			    "each lost lease.", c->registrations);
	hkv_metrics_gauge(b, "hatchkv_cluster_view_age_seconds",
			  "Seconds since the member last read the cluster from etcd (the cluster "
			  "figures are that old); -1 before the first read.", c->view_age_s);
	hkv_metrics_gauge(b, "hatchkv_cluster_coordinator",
			  "1 while this member coordinates (holds PREFIX/coordinator).",
			  c->coordinator);
	hkv_metrics_gauge(b, "hatchkv_cluster_coordinator_term",
			  "etcd create revision of PREFIX/coordinator: changes when a coordinator's "
			  "term begins; 0 when none.", (double)c->term);
	hkv_metrics_gauge(b, "hatchkv_cluster_members", "Members registered in etcd.",
			  c->members);
}

/* The map the member serves, as it read it last. */
static void page_map(struct evbuffer *b, const struct hkv_cluster_status *c)
{
	hkv_metrics_gauge(b, "hatchkv_cluster_map_revision",
			  "etcd mod revision of PREFIX/map, the map's epoch; 0 when none.",
			  (double)c->map_rev);
	hkv_metrics_gauge(b, "hatchkv_cluster_map_partitions", "Partitions of the map.",
			  c->partitions);
	hkv_metrics_gauge(b, "hatchkv_cluster_map_replicas",
			  "Servers each partition's list should have.", c->replicas);
	pair(b, "hatchkv_cluster_partitions", "gauge",
	     "Partitions this member holds in the map, by role: primary (first on the list) or "
	     "replica (further down).", "role", "primary", c->primary, "replica", c->backup);
	hkv_metrics_gauge(b, "hatchkv_cluster_partitions_under_replicated",
			  "Partitions whose list is shorter than the map's replicas.",
			  c->under_replicated);
	hkv_metrics_gauge(b, "hatchkv_cluster_partitions_unavailable",
			  "Partitions no member on whose list is registered: their keys fail.",
			  c->unavailable);
	hkv_metrics_gauge(b, "hatchkv_cluster_map_servers", "Servers the map names.",
			  c->map_servers);
	hkv_metrics_gauge(b, "hatchkv_cluster_map_servers_down",
			  "Servers the map names that are no member (their lease ended).",
			  c->map_servers_down);
}

/* Moves (PREFIX/next) and repairs (PREFIX/fill), under way and done. */
static void page_moves(struct evbuffer *b, const struct hkv_cluster_status *c)
{
	char lab[64];

	hkv_metrics_gauge(b, "hatchkv_cluster_moves_in_progress",
			  "1 while a move is under way (PREFIX/next).", c->move);
	hkv_metrics_gauge(b, "hatchkv_cluster_move_seconds",
			  "Seconds since this member first saw the move under way; 0 when none.",
			  c->move_s);
	hkv_metrics_gauge(b, "hatchkv_cluster_move_partitions",
			  "Partitions whose list the move under way changes.", c->move_partitions);
	pair(b, "hatchkv_cluster_move_servers", "gauge",
	     "Servers that give partitions up in the move under way (or are on a list a repair "
	     "grows), by state: acked, or waiting (fencing, purging, copying; or gone, until the "
	     "coordinator stops waiting for them).", "state", "acked", c->move_acked, "waiting",
	     c->move_servers - c->move_acked);
	hkv_metrics_gauge(b, "hatchkv_cluster_repairs_in_progress",
			  "1 while a repair fills new replicas (PREFIX/fill).", c->repair);
	hkv_metrics_gauge(b, "hatchkv_cluster_repair_seconds",
			  "Seconds since this member first saw the repair under way; 0 when none.",
			  c->repair_s);
	hkv_metrics_gauge(b, "hatchkv_cluster_repair_partitions",
			  "Partitions whose list the repair under way grows.", c->repair_partitions);
	pair(b, "hatchkv_cluster_repair_servers", "gauge",
	     "Primaries that copy in the repair under way, by state: filled (their passes "
	     "converged) or copying.", "state", "filled", c->repair_filled, "copying",
	     c->repair_servers - c->repair_filled);
	pair(b, "hatchkv_cluster_moves_total", "counter",
	     "Moves this member, as coordinator, committed or dropped.", "result", "committed",
	     c->moves_committed, "dropped", c->moves_dropped);
	pair(b, "hatchkv_cluster_repairs_total", "counter",
	     "Repairs this member, as coordinator, turned into their final move (filled) or "
	     "dropped.", "result", "filled", c->repairs_filled, "dropped", c->repairs_dropped);
	hkv_metrics_family(b, "hatchkv_cluster_jobs_total", "counter",
			   "Work the cluster asked of this member's region (jobs), by kind and result.");
	for (int k = HKV_JOB_PURGE; k <= HKV_JOB_FILL; k++)
		for (int r = HKV_JOB_OK; r <= HKV_JOB_FAILED; r++) {
			snprintf(lab, sizeof(lab), "kind=\"%s\",result=\"%s\"", job_names[k],
				 r == HKV_JOB_OK ? "done" : "failed");
			hkv_metrics_sample(b, "hatchkv_cluster_jobs_total", lab, c->jobs[k][r]);
		}
}

/* name{state="done"} and {state="total"}: 0 and 0 when nothing runs, a
 * total of -1 while it is being counted. */
static void progress_pair(struct evbuffer *b, const char *name, const char *help,
			  const struct hkv_progress *pg, uint64_t done, uint64_t total)
{
	hkv_metrics_family(b, name, "gauge", help);
	hkv_metrics_sample(b, name, "state=\"done\"", pg->rev ? done : 0);
	hkv_metrics_sample_f(b, name, "state=\"total\"",
			     !pg->rev                       ? 0.0
			     : total == HKV_PROGRESS_UNKNOWN ? -1.0
							     : (double)total);
}

/* This member's copy and repair pass under way (cluster.h hkv_progress). */
static void page_progress(struct evbuffer *b)
{
	struct hkv_progress cp, rp;

	hkv_cluster_progress_read(HKV_PROGRESS_COPY, &cp);
	hkv_cluster_progress_read(HKV_PROGRESS_REPAIR, &rp);
	progress_pair(b, "hatchkv_cluster_move_bytes",
		      "This member's copy for the store move under way: bytes (keys + values) "
		      "copied (done) and to copy (total, counted first; -1 while counting); 0 "
		      "when it copies nothing.", &cp, cp.bytes, cp.bytes_total);
	progress_pair(b, "hatchkv_cluster_move_items",
		      "This member's copy for the store move under way: items copied (done) and "
		      "to copy (total; -1 while counting); 0 when it copies nothing.", &cp, cp.items,
		      cp.items_total);
	progress_pair(b, "hatchkv_cluster_repair_bytes",
		      "This member's repair pass under way: bytes (keys + values) copied (done) "
		      "and to copy (total, counted first, an estimate: clients write meanwhile; -1 "
		      "while counting or in the final pass); 0 when none runs.", &rp, rp.bytes,
		      rp.bytes_total);
	progress_pair(b, "hatchkv_cluster_repair_items",
		      "This member's repair pass under way: items copied (done) and to copy "
		      "(total; -1 while counting or in the final pass); 0 when none runs.", &rp,
		      rp.items, rp.items_total);
	hkv_metrics_gauge(b, "hatchkv_cluster_repair_pass",
			  "The repair pass this member runs (1, 2, ...; the final one too); 0 when "
			  "none runs.", rp.rev ? rp.pass : 0);
}

static void page_clients(struct evbuffer *b, const struct hkv_store *s)
{
	const struct hkv_store_stats *st = &s->stats;
	char lab[48];

	hkv_metrics_gauge(b, "hatchkv_clients_connected", "Clients connected to the data plane.",
			  s->nconnected);
	hkv_metrics_gauge(b, "hatchkv_clients_pending",
			  "Clients admitted (a ticket handed out) and not connected yet.", s->npending);
	hkv_metrics_gauge(b, "hatchkv_clients_max", "Clients connected at once, at most "
			  "(--max-clients).", s->max_clients ? s->max_clients : HKV_MAX_CLIENTS);
	hkv_metrics_counter(b, "hatchkv_clients_admitted_total",
			    "Control requests (AUTH) answered with a welcome.", st->admitted);
	hkv_metrics_family(b, "hatchkv_clients_refused_total", "counter",
			   "Clients and control requests refused, by reason.");
	for (int i = 0; i < HKV_REFUSED_NKINDS; i++) {
		snprintf(lab, sizeof(lab), "reason=\"%s\"", refusal_names[i]);
		hkv_metrics_sample(b, "hatchkv_clients_refused_total", lab, st->refused[i]);
	}
	hkv_metrics_counter(b, "hatchkv_rate_limited_total",
			    "Control requests answered \"rate limited\" (their source sent too many "
			    "bad ones).", st->rate_limited);
	hkv_metrics_counter(b, "hatchkv_keepalive_drops_total",
			    "Data connections closed because the peer did not answer keepalives "
			    "(verbs).", st->keepalive_drops);
	hkv_metrics_counter(b, "hatchkv_header_restores_total",
			    "Times the region header differed from the server's own geometry (a "
			    "writer overwrote it: shm, verbs --no-windows) and was put back.",
			    s->header_restores);
	hkv_metrics_family(b, "hatchkv_grants_total", "counter",
			   "GRANT requests (memory windows, verbs), by result.");
	hkv_metrics_sample(b, "hatchkv_grants_total", "result=\"granted\"", st->grants);
	hkv_metrics_sample(b, "hatchkv_grants_total", "result=\"refused\"", st->grants_refused);
	hkv_metrics_family(b, "hatchkv_carves_total", "counter",
			   "CARVE requests (memory for a size class), by result.");
	hkv_metrics_sample(b, "hatchkv_carves_total", "result=\"carved\"", st->carves);
	hkv_metrics_sample(b, "hatchkv_carves_total", "result=\"full\"", st->carves_full);
	hkv_metrics_sample(b, "hatchkv_carves_total", "result=\"refused\"", st->carves_refused);
	hkv_metrics_gauge(b, "hatchkv_data_connections",
			  "Data plane connections established (0 while fenced).",
			  s->data ? hkv_listener_nconns(s->data) : 0);
	hkv_metrics_gauge(b, "hatchkv_memory_windows",
			  "Memory windows bound, over all connections (verbs).",
			  s->data ? hkv_listener_nwindows(s->data) : 0);
}

static void page_region(struct evbuffer *b, const struct hkv_store *s)
{
	const struct hkv_geometry *g = s->geom;
	const struct hkv_slab *sl = &s->slab;
	uint64_t data_bytes = (uint64_t)g->nsegs * g->seg_size;
	uint32_t segs[3];
	char lab[32];

	hkv_metrics_gauge(b, "hatchkv_region_bytes", "Bytes of the region (header, index, "
			  "segments).", (double)s->region.length);
	hkv_metrics_gauge(b, "hatchkv_region_data_bytes", "Bytes of the region's segments.",
			  (double)data_bytes);
	hkv_metrics_gauge(b, "hatchkv_segment_bytes", "Bytes of one segment (--segment-size).",
			  g->seg_size);
	hkv_metrics_gauge(b, "hatchkv_index_slots", "Slots of the index.",
			  (double)g->nbuckets * HKV_BUCKET_SLOTS);
	hkv_slab_seg_counts(s, segs); /* the table walk metrics.h accounts for */
	hkv_metrics_family(b, "hatchkv_segments", "gauge",
			   "Segments by state now: free (never carved), shared (carved into a "
			   "size class; any writer claims its blocks), draining (being moved to "
			   "another class).");
	for (int i = 0; i < 3; i++) {
		snprintf(lab, sizeof(lab), "state=\"%s\"", seg_names[i]);
		hkv_metrics_sample(b, "hatchkv_segments", lab, segs[i]);
	}
	hkv_metrics_gauge(b, "hatchkv_region_used_bytes",
			  "Bytes of blocks not free in the bitmaps (live items, items being "
			  "written, blocks held or not freed yet), as last sampled.",
			  (double)sl->fill.used_bytes);
	hkv_metrics_gauge(b, "hatchkv_region_fill_ratio",
			  "hatchkv_region_used_bytes over hatchkv_region_data_bytes, as last "
			  "sampled.", sl->fill_ns ? (double)sl->fill.used_bytes / (double)data_bytes : 0);
	hkv_metrics_gauge(b, "hatchkv_region_fill_sampled_timestamp_seconds",
			  "Unix time the sweep's last whole pass over the segments ended (the "
			  "time of hatchkv_region_used_bytes); 0: no pass yet.",
			  (double)sl->fill_ns / 1e9);
	hkv_metrics_gauge(b, "hatchkv_region_fill_sample_seconds",
			  "Seconds that pass took: each segment was looked at once between "
			  "the timestamp minus this and the timestamp.",
			  sl->fill_ns ? (double)(sl->fill_ns - sl->fill.start_ns) / 1e9 : 0);
	hkv_metrics_counter(b, "hatchkv_segments_carved_total",
			    "Segments carved into a size class (new, or after a move).", sl->carved);
	hkv_metrics_counter(b, "hatchkv_segments_moved_total",
			    "Segments moved from one size class to another.", sl->moved);
	hkv_metrics_counter(b, "hatchkv_segment_moves_undone_total",
			    "Segment moves undone (no room for their items, or too slow).",
			    sl->drains_aborted);
	hkv_metrics_counter(b, "hatchkv_server_evictions_total",
			    "Live items the server evicted to move a segment (cache mode).",
			    sl->evicted);
	hkv_metrics_counter(b, "hatchkv_items_relocated_total",
			    "Live items the server moved out of a segment being moved (store mode).",
			    sl->relocated);
	hkv_metrics_counter(b, "hatchkv_held_blocks_reclaimed_total",
			    "Blocks that disconnected or fenced clients held or left, taken back.",
			    sl->held_reclaimed);
	hkv_metrics_counter(b, "hatchkv_clients_fenced_total",
			    "Clients fenced (queue pair destroyed, or shm gate shut) because a "
			    "segment move needed blocks they held unchanged for 1.5 s; each "
			    "connects again at its next operation.", s->fences);
	pair(b, "hatchkv_server_atomics_total", "counter",
	     "The server's CAS/FAA on words clients reach with atomics, on verbs: through "
	     "the NIC (its loopback queue pair), or with the CPU while no loopback is up "
	     "(which the NIC may not see as atomic: should stay 0). Both 0 on shm.",
	     "path", "nic", s->atom.nic, "cpu", s->atom.cpu);
}

void hkv_server_metrics_page(struct evbuffer *b, void *arg)
{
	const struct hkv_server_metrics *m = arg;
	const struct hkv_store *s = m->store;
	double now = hkv_metrics_unix_now();
	char lab[128];

	snprintf(lab, sizeof(lab), "version=\"%s\",transport=\"%s\",layout=\"%u\"",
		 hkv_version(), m->transport, (unsigned)HKV_LAYOUT_VERSION);
	hkv_metrics_family(b, "hatchkv_build_info", "gauge",
			   "Always 1; the labels say which server this is.");
	hkv_metrics_sample(b, "hatchkv_build_info", lab, 1);
	hkv_metrics_gauge(b, "hatchkv_start_time_seconds", "Unix time the server started.",
			  m->started);
	hkv_metrics_gauge(b, "hatchkv_uptime_seconds", "Seconds since the server started.",
			  now - m->started);
	hkv_metrics_gauge(b, "hatchkv_cluster_member", "1 if the server is a cluster member.",
			  m->cluster);
	hkv_metrics_gauge(b, "hatchkv_fenced",
			  "1 while the server serves nobody (cluster: settling, moving partitions, "
			  "or lease in doubt).", s->fenced);
	hkv_metrics_gauge(b, "hatchkv_cache_mode", "1 in cache mode (--cache).",
			  !!(s->geom->flags & HKV_GEOM_F_CACHE));
	if (m->cl) {
		struct hkv_cluster_status c;

		hkv_cluster_status(m->cl, &c);
		page_membership(b, &c);
		page_map(b, &c);
		page_moves(b, &c);
		page_progress(b);
	}
	page_clients(b, s);
	page_region(b, s);
}
