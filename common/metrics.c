/* metrics.c - see metrics.h. */
#include "common/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "common/hkv_alloc.h"
#include "hatchkv.h"

#define METRICS_TIMEOUT_S   5
#define METRICS_HEADERS_MAX 8192
#define METRICS_BODY_MAX    1024 /* a GET has none */

struct hkv_metrics {
	struct evhttp *http;
	uint16_t port;
	char url[300];
	hkv_metrics_page_fn page;
	void *arg;
	double last_page_s; /* what the previous page took to build */
};

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double hkv_metrics_unix_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the writer ---------------------------------------------------------------- */

void hkv_metrics_family(struct evbuffer *out, const char *name, const char *type,
			const char *help)
{
	evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void hkv_metrics_sample(struct evbuffer *out, const char *name, const char *labels, uint64_t v)
{
	if (labels)
		evbuffer_add_printf(out, "%s{%s} %" PRIu64 "\n", name, labels, v);
	else
		evbuffer_add_printf(out, "%s %" PRIu64 "\n", name, v);
}

void hkv_metrics_sample_f(struct evbuffer *out, const char *name, const char *labels, double v)
{
	char num[40];

	/* the format's spellings of the special values */
	if (isnan(v))
		snprintf(num, sizeof(num), "NaN");
	else if (isinf(v))
		snprintf(num, sizeof(num), v > 0 ? "+Inf" : "-Inf");
	else
		snprintf(num, sizeof(num), "%.17g", v);
	if (labels)
		evbuffer_add_printf(out, "%s{%s} %s\n", name, labels, num);
	else
		evbuffer_add_printf(out, "%s %s\n", name, num);
}

void hkv_metrics_counter(struct evbuffer *out, const char *name, const char *help, uint64_t v)
{
	hkv_metrics_family(out, name, "counter", help);
	hkv_metrics_sample(out, name, NULL, v);
}

void hkv_metrics_gauge(struct evbuffer *out, const char *name, const char *help, double v)
{
	hkv_metrics_family(out, name, "gauge", help);
	hkv_metrics_sample_f(out, name, NULL, v);
}

/* ---- the endpoint -------------------------------------------------------------- */

int hkv_metrics_parse_addr(const char *spec, char *host, size_t hostlen, uint16_t *port)
{
	const char *colon, *h = spec;
	size_t hlen;
	char *end;
	unsigned long p;

	if (!spec || !(colon = strrchr(spec, ':')))
		return -EINVAL;
	hlen = (size_t)(colon - spec);
	if (spec[0] == '[') { /* [ADDR6]:PORT */
		if (hlen < 3 || spec[hlen - 1] != ']')
			return -EINVAL;
		h = spec + 1;
		hlen -= 2;
	} else if (memchr(spec, ':', hlen)) {
		return -EINVAL; /* a bare IPv6 address: which colon is the port's? */
	}
	p = strtoul(colon + 1, &end, 10);
	if (!hlen || hlen >= hostlen || end == colon + 1 || *end || p > 65535)
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	*port = (uint16_t)p;
	return 0;
}

int hkv_metrics_addr_ok(const char *spec)
{
	char host[256];
	uint16_t port;

	return !hkv_metrics_parse_addr(spec, host, sizeof(host), &port);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct hkv_metrics *m = arg;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	struct evbuffer *out;
	double t0;

	if (!path || strcmp(path, "/metrics")) {
		evhttp_send_error(req, HTTP_NOTFOUND, "the metrics are at /metrics");
		return;
	}
	out = evbuffer_new();
	if (!out) {
		evhttp_send_error(req, HTTP_SERVUNAVAIL, NULL);
		return;
	}
	t0 = mono_s();
	m->page(out, m->arg);
	hkv_metrics_gauge(out, "hatchkv_metrics_page_seconds",
			  "Seconds the previous scrape's page took to build (its cost to the "
			  "serving thread).",
			  m->last_page_s);
	m->last_page_s = mono_s() - t0;
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  HKV_METRICS_CONTENT_TYPE);
	evhttp_send_reply(req, HTTP_OK, "OK", out);
	evbuffer_free(out);
}

static uint16_t bound_port(struct evhttp_bound_socket *bs)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &len))
		return 0;
	return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					       : ((struct sockaddr_in *)&ss)->sin_port);
}

struct hkv_metrics *hkv_metrics_start(struct event_base *base, const char *spec,
				      hkv_metrics_page_fn page, void *arg)
{
	struct evhttp_bound_socket *bs;
	struct hkv_metrics *m;
	char host[256];
	uint16_t port;
	int err;

	if (hkv_metrics_parse_addr(spec, host, sizeof(host), &port)) {
		errno = EINVAL;
		return NULL;
	}
	m = hkv_calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->page = page;
	m->arg = arg;
	m->http = evhttp_new(base);
	if (!m->http)
		goto free_m;
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_timeout(m->http, METRICS_TIMEOUT_S);
	evhttp_set_max_headers_size(m->http, METRICS_HEADERS_MAX);
	evhttp_set_max_body_size(m->http, METRICS_BODY_MAX);
	evhttp_set_gencb(m->http, on_request, m);
	errno = 0;
	bs = evhttp_bind_socket_with_handle(m->http, host, port);
	if (!bs)
		goto free_http;
	m->port = bound_port(bs);
	snprintf(m->url, sizeof(m->url), strchr(host, ':') ? "http://[%s]:%u/metrics"
							    : "http://%s:%u/metrics",
		 host, (unsigned)m->port);
	return m;
free_http:
	err = errno ? errno : EADDRNOTAVAIL;
	evhttp_free(m->http);
	errno = err;
free_m:
	err = errno ? errno : ENOMEM;
	hkv_free(m);
	errno = err;
	return NULL;
}

uint16_t hkv_metrics_port(const struct hkv_metrics *m)
{
	return m->port;
}

const char *hkv_metrics_url(const struct hkv_metrics *m)
{
	return m->url;
}

void hkv_metrics_stop(struct hkv_metrics *m)
{
	if (!m)
		return;
	evhttp_free(m->http);
	hkv_free(m);
}

/* ---- the client library's counters ---- */

static const char *const op_names[HKV_OP_NTYPES] = {
	"get", "set", "add", "replace", "cas", "append", "delete", "incr", "touch", "mget"};

/* The library's handle counters that are plain totals, one counter each
 * (evictions: hatchkv_memcached_evictions_total). */
struct client_total {
	const char *name, *help;
	size_t off; /* in struct hkv_client_stats */
};

#define CT(field, metric, text) {"hatchkv_client_" metric "_total", text, \
				 offsetof(struct hkv_client_stats, field)}
static const struct client_total client_totals[] = {
	CT(cache_hits, "location_cache_hits", "Lookups the handles' location cache answered."),
	CT(cache_misses, "location_cache_misses", "Lookups the location cache could not answer."),
	CT(claims, "claims", "Claim chains won (free blocks taken from the shared pools)."),
	CT(claims_lost, "claims_lost", "Claim chains lost to another writer."),
	CT(blocks_claimed, "blocks_claimed", "Blocks the claims took."),
	CT(blocks_freed, "blocks_freed", "Blocks freed."),
	CT(blocks_kept, "blocks_kept", "Freed blocks kept for the handle's own next write."),
	CT(surveys, "surveys", "Bitmap surveys (looking for free blocks)."),
	CT(carves, "carves", "CARVE requests sent to the server."),
	CT(blocks_given_back, "blocks_given_back", "Held blocks given back unused."),
	CT(blocks_abandoned, "blocks_abandoned", "Held blocks left for the server to reclaim."),
	CT(corrupt_reads, "corrupt_reads", "Blocks read that failed validation."),
	CT(reconnects, "reconnects", "Times a handle connected again after losing the server."),
	CT(expired_reclaimed, "expired_reclaimed", "Expired items the handles removed."),
	CT(grants, "grants", "Memory windows the server bound for the handles (verbs)."),
	CT(stale_undone, "stale_undone", "Writes whose view went stale inside the post: undone "
	   "and retried."),
	CT(stale_views, "stale_views", "Writes that re-read their key (view older than the "
	   "bound)."),
	CT(repl_helps, "repl_helps", "Decided replicated writes of others a handle finished."),
	CT(repl_unknown, "repl_unknown", "Replicated writes that returned HKV_EUNKNOWN."),
	CT(repl_superseded, "repl_superseded", "Writes decided after a lost replica was "
	   "replaced, done again on the new map."),
};

/* "a=1,b=2" and "op=..." joined: the labels of one sample. */
static void join_labels(char *out, size_t cap, const char *const *labels, int k,
			const char *more)
{
	const char *l = labels ? labels[k] : NULL;

	snprintf(out, cap, "%s%s%s", l ? l : "", l && *l && more ? "," : "", more ? more : "");
}

/* A labelled counter family over the library's operations. */
static void op_family(struct evbuffer *b, const struct hkv_client_stats *h, int n,
		      const char *const *labels, const char *name, const char *help, size_t off)
{
	char op[32], lab[512];

	hkv_metrics_family(b, name, "counter", help);
	for (int k = 0; k < n; k++)
		for (int i = 0; i < HKV_OP_NTYPES; i++) {
			snprintf(op, sizeof(op), "op=\"%s\"", op_names[i]);
			join_labels(lab, sizeof(lab), labels, k, op);
			hkv_metrics_sample(b, name, lab,
					   *(const uint64_t *)((const char *)&h[k].op[i] + off));
		}
}

void hkv_metrics_client(struct evbuffer *b, const struct hkv_client_stats *h, int n,
			const char *const *labels)
{
	char lab[512];

	op_family(b, h, n, labels, "hatchkv_client_ops_total", "Library operations, by kind.",
		  offsetof(struct hkv_op_stats, count));
	op_family(b, h, n, labels, "hatchkv_client_round_trips_total",
		  "Network round trips, by operation.", offsetof(struct hkv_op_stats, round_trips));
	op_family(b, h, n, labels, "hatchkv_client_read_bytes_total",
		  "Bytes the operations read (RDMA).", offsetof(struct hkv_op_stats, bytes_read));
	op_family(b, h, n, labels, "hatchkv_client_written_bytes_total",
		  "Bytes the operations wrote (RDMA).", offsetof(struct hkv_op_stats, bytes_written));
	op_family(b, h, n, labels, "hatchkv_client_retries_total",
		  "Operations restarted after a conflict or a torn read.",
		  offsetof(struct hkv_op_stats, retries));
	for (size_t i = 0; i < sizeof(client_totals) / sizeof(client_totals[0]); i++) {
		hkv_metrics_family(b, client_totals[i].name, "counter", client_totals[i].help);
		for (int k = 0; k < n; k++) {
			join_labels(lab, sizeof(lab), labels, k, NULL);
			hkv_metrics_sample(b, client_totals[i].name, lab[0] ? lab : NULL,
					   *(const uint64_t *)((const char *)&h[k] +
							       client_totals[i].off));
		}
	}
}

