/* mc_metrics.c - see mc_metrics.h; the names and meanings are in docs/metrics.md. */
#include "client/memcached/mc_metrics.h"

#include <stddef.h>
#include <stdio.h>

#include <event2/buffer.h>

#include "common/metrics.h"

static const char *const cmd_names[MC_NCMDS] = {
	[MC_CMD_GET] = "get",         [MC_CMD_GETS] = "gets",       [MC_CMD_GAT] = "gat",
	[MC_CMD_GATS] = "gats",       [MC_CMD_SET] = "set",         [MC_CMD_ADD] = "add",
	[MC_CMD_REPLACE] = "replace", [MC_CMD_APPEND] = "append",   [MC_CMD_PREPEND] = "prepend",
	[MC_CMD_CAS] = "cas",         [MC_CMD_DELETE] = "delete",   [MC_CMD_INCR] = "incr",
	[MC_CMD_DECR] = "decr",       [MC_CMD_TOUCH] = "touch",     [MC_CMD_FLUSH_ALL] = "flush_all",
	[MC_CMD_VERSION] = "version", [MC_CMD_VERBOSITY] = "verbosity",
	[MC_CMD_STATS] = "stats",     [MC_CMD_QUIT] = "quit",       [MC_CMD_MG] = "mg",
	[MC_CMD_MS] = "ms",           [MC_CMD_MD] = "md",           [MC_CMD_MA] = "ma",
	[MC_CMD_MN] = "mn",
};

/* Hits and misses of the commands that have them, one family each. */
static void page_hits(struct evbuffer *b, const struct mc_counters *c)
{
	static const char *const what[] = {"get", "delete", "incr", "decr", "cas", "touch"};
	const uint64_t hits[] = {c->get_hits, c->delete_hits, c->incr_hits,
				 c->decr_hits, c->cas_hits, c->touch_hits};
	const uint64_t misses[] = {c->get_misses, c->delete_misses, c->incr_misses,
				   c->decr_misses, c->cas_misses, c->touch_misses};
	char lab[32];

	hkv_metrics_family(b, "hatchkv_memcached_hits_total", "counter",
			   "Keys found, by command (get: every key of get/gets/mg; touch: "
			   "touch and gat/gats).");
	for (size_t i = 0; i < sizeof(what) / sizeof(what[0]); i++) {
		snprintf(lab, sizeof(lab), "command=\"%s\"", what[i]);
		hkv_metrics_sample(b, "hatchkv_memcached_hits_total", lab, hits[i]);
	}
	hkv_metrics_family(b, "hatchkv_memcached_misses_total", "counter",
			   "Keys not found, by command (as hatchkv_memcached_hits_total).");
	for (size_t i = 0; i < sizeof(what) / sizeof(what[0]); i++) {
		snprintf(lab, sizeof(lab), "command=\"%s\"", what[i]);
		hkv_metrics_sample(b, "hatchkv_memcached_misses_total", lab, misses[i]);
	}
	hkv_metrics_counter(b, "hatchkv_memcached_cas_badval_total",
			    "cas refused: the item's version had changed (EXISTS).", c->cas_badval);
	hkv_metrics_counter(b, "hatchkv_memcached_get_keys_total",
			    "Keys looked up by retrieval commands (memcached's cmd_get).",
			    c->cmd_get);
}

static void page_daemon(struct evbuffer *b, const struct mc_metrics_snap *s)
{
	const struct mc_counters *c = &s->c;
	char lab[48];

	hkv_metrics_family(b, "hatchkv_memcached_commands_total", "counter",
			   "Requests by command (a multi-key get is one; bad requests are "
			   "counted in hatchkv_memcached_errors_total instead).");
	for (int i = MC_CMD_GET; i < MC_NCMDS; i++) {
		snprintf(lab, sizeof(lab), "command=\"%s\"", cmd_names[i]);
		hkv_metrics_sample(b, "hatchkv_memcached_commands_total", lab, c->cmds[i]);
	}
	page_hits(b, c);
	hkv_metrics_family(b, "hatchkv_memcached_errors_total", "counter",
			   "Error replies, by kind: error (ERROR), client_error (CLIENT_ERROR), "
			   "server_error (SERVER_ERROR, the hatchkv server's failures among them).");
	hkv_metrics_sample(b, "hatchkv_memcached_errors_total", "kind=\"error\"", c->err_error);
	hkv_metrics_sample(b, "hatchkv_memcached_errors_total", "kind=\"client_error\"",
			   c->err_client);
	hkv_metrics_sample(b, "hatchkv_memcached_errors_total", "kind=\"server_error\"",
			   c->err_server);
	hkv_metrics_counter(b, "hatchkv_memcached_server_lost_total",
			    "Times a worker lost its hatchkv server (handle dropped, reopened at "
			    "the next request).", c->hkv_errors);
	hkv_metrics_counter(b, "hatchkv_memcached_evictions_total",
			    "Live items evicted by this daemon's handles to make room (cache mode; "
			    "the server's own are hatchkv_server_evictions_total).", s->h.evictions);
	hkv_metrics_counter(b, "hatchkv_memcached_read_bytes_total",
			    "Bytes of requests read from memcached clients.", c->bytes_read);
	hkv_metrics_counter(b, "hatchkv_memcached_written_bytes_total",
			    "Bytes of replies written to memcached clients.", c->bytes_written);
	hkv_metrics_gauge(b, "hatchkv_memcached_connections", "Client connections open.",
			  (double)s->curr_conns);
	hkv_metrics_counter(b, "hatchkv_memcached_connections_total",
			    "Client connections accepted.", s->total_conns);
	hkv_metrics_counter(b, "hatchkv_memcached_connections_rejected_total",
			    "Client connections refused at --conn-limit.", s->rejected_conns);
	hkv_metrics_gauge(b, "hatchkv_memcached_connections_max",
			  "Client connections at once, at most (--conn-limit).", s->max_conns);
}

void mc_metrics_page(struct evbuffer *b, const struct mc_metrics_snap *s)
{
	double now = hkv_metrics_unix_now();
	char lab[96];

	snprintf(lab, sizeof(lab), "version=\"%s\"", hkv_version());
	hkv_metrics_family(b, "hatchkv_memcached_build_info", "gauge",
			   "Always 1; the labels say which daemon this is.");
	hkv_metrics_sample(b, "hatchkv_memcached_build_info", lab, 1);
	hkv_metrics_gauge(b, "hatchkv_memcached_start_time_seconds",
			  "Unix time the daemon started.", (double)s->started);
	hkv_metrics_gauge(b, "hatchkv_memcached_uptime_seconds", "Seconds since the daemon "
			  "started.", now - (double)s->started);
	hkv_metrics_gauge(b, "hatchkv_memcached_workers", "Worker threads (--threads).",
			  s->workers);
	hkv_metrics_gauge(b, "hatchkv_memcached_depth", "Requests in flight per worker, at most "
			  "(--depth).", s->depth);
	hkv_metrics_gauge(b, "hatchkv_memcached_in_flight_peak",
			  "Requests in flight at once on one worker, at most so far.",
			  s->in_flight_peak);
	page_daemon(b, s);
	hkv_metrics_gauge(b, "hatchkv_memcached_items",
			  "Items in the store, as the last walk of the index counted (with "
			  "--metrics one every 10 s, and at most every 5 s for `stats`).",
			  (double)s->items);
	hkv_metrics_gauge(b, "hatchkv_memcached_item_bytes",
			  "Bytes of those items, as the last walk counted.",
			  (double)s->bytes);
	hkv_metrics_gauge(b, "hatchkv_memcached_items_sampled_timestamp_seconds",
			  "Unix time of that walk (0: none yet; a scrape never walks).",
			  (double)s->counted_at);
	hkv_metrics_client(b, &s->h, 1, NULL);
}
