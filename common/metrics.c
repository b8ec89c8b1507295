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

#include <netdb.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/hkv_alloc.h"
#include "common/log.h"
#include "hatchkv.h"

#define METRICS_DEADLINE_S  5    /* accept to the answer's last byte */
#define METRICS_HEADERS_MAX 8192
#define METRICS_LINE_MAX    1024 /* the request line we look at */
#define METRICS_CONNS_MAX   64   /* scrapers are few */

struct hkv_metrics {
	struct evconnlistener *lis;
	struct event *resume; /* accepting again after an accept error */
	struct mconn *conns;
	unsigned nconns;
	uint64_t refused, dropped_slow;
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

/*
 * The endpoint is a small HTTP/1.1 responder of its own (not evhttp, whose
 * 2.1 API can neither cap connections nor bound the time a request's
 * headers take: a peer sending a byte every few seconds kept a descriptor
 * forever). Every connection: at most METRICS_CONNS_MAX at once (more are
 * closed at accept), one request, answered with Connection: close, and
 * METRICS_DEADLINE_S from accept to the last byte of the answer, whatever
 * the peer sends meanwhile. An accept error (out of descriptors) pauses
 * accepting for 100 ms and logs at most once a second.
 */
struct mconn {
	struct hkv_metrics *m;
	struct mconn *prev, *next; /* m->conns */
	struct bufferevent *bev;
	struct event *deadline;
	int answered;
};

static void mconn_free(struct mconn *c)
{
	c->m->nconns--;
	if (c->prev)
		c->prev->next = c->next;
	else
		c->m->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	bufferevent_free(c->bev);
	event_free(c->deadline);
	hkv_free(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct mconn *c = arg;

	c->m->dropped_slow++;
	mconn_free(c);
}

static void on_written(struct bufferevent *bev, void *arg)
{
	struct mconn *c = arg;

	if (c->answered && !evbuffer_get_length(bufferevent_get_output(bev)))
		mconn_free(c);
}

static void on_mevent(struct bufferevent *bev, short what, void *arg)
{
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		mconn_free(arg);
}

/* Answer with status and body (HEAD: the headers only), then close. */
static void answer(struct mconn *c, int head, const char *status, const char *ctype,
		   const char *extra, struct evbuffer *body)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	size_t len = body ? evbuffer_get_length(body) : 0;

	evbuffer_add_printf(out, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			    "%sConnection: close\r\n\r\n", status, ctype, len, extra ? extra : "");
	if (body && !head)
		evbuffer_add_buffer(out, body);
	c->answered = 1;
	bufferevent_disable(c->bev, EV_READ);
	bufferevent_enable(c->bev, EV_WRITE);
}

static void answer_text(struct mconn *c, int head, const char *status, const char *extra,
			const char *text)
{
	struct evbuffer *b = evbuffer_new();

	if (b)
		evbuffer_add_printf(b, "%s\n", text);
	answer(c, head, status, "text/plain; charset=utf-8", extra, b);
	if (b)
		evbuffer_free(b);
}

static void serve_page(struct mconn *c, int head)
{
	struct hkv_metrics *m = c->m;
	struct evbuffer *out = evbuffer_new();
	double t0;

	if (!out) {
		answer_text(c, head, "503 Service Unavailable", NULL, "out of memory");
		return;
	}
	t0 = mono_s();
	m->page(out, m->arg);
	hkv_metrics_counter(out, "hatchkv_metrics_connections_refused_total",
			    "Connections to this endpoint closed at accept: 64 were open.",
			    m->refused);
	hkv_metrics_counter(out, "hatchkv_metrics_connections_dropped_total",
			    "Connections to this endpoint dropped unanswered, 5 s after accept.",
			    m->dropped_slow);
	hkv_metrics_gauge(out, "hatchkv_metrics_page_seconds",
			  "Seconds the previous scrape's page took to build (its cost to the "
			  "serving thread).",
			  m->last_page_s);
	m->last_page_s = mono_s() - t0;
	answer(c, head, "200 OK", HKV_METRICS_CONTENT_TYPE, NULL, out);
	evbuffer_free(out);
}

/* The request line once the headers are whole: METHOD SP TARGET SP HTTP/1.x */
static void on_mread(struct bufferevent *bev, void *arg)
{
	struct mconn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
	char line[METRICS_LINE_MAX + 1], *sp, *target, *q;
	size_t n;
	int head;

	if (c->answered)
		return;
	if (end.pos < 0) {
		end = evbuffer_search(in, "\n\n", 2, NULL); /* (bare LF, as some tools send) */
		if (end.pos < 0) {
			if (evbuffer_get_length(in) > METRICS_HEADERS_MAX)
				answer_text(c, 0, "431 Request Header Fields Too Large", NULL,
					    "request headers over 8 KiB");
			return;
		}
	}
	n = evbuffer_copyout(in, line, sizeof(line) - 1);
	line[n] = 0;
	line[strcspn(line, "\r\n")] = 0;
	sp = strchr(line, ' ');
	target = sp ? sp + 1 : NULL;
	q = target ? strchr(target, ' ') : NULL;
	if (!sp || !q || strncmp(q + 1, "HTTP/1.", 7)) {
		answer_text(c, 0, "400 Bad Request", NULL, "not an HTTP/1 request line");
		return;
	}
	*sp = *q = 0;
	head = !strcmp(line, "HEAD");
	if (strcmp(line, "GET") && !head) {
		answer_text(c, 0, "405 Method Not Allowed", "Allow: GET, HEAD\r\n",
			    "only GET and HEAD");
		return;
	}
	target[strcspn(target, "?#")] = 0; /* (a query string is ignored) */
	if (strcmp(target, "/metrics")) {
		answer_text(c, head, "404 Not Found", NULL, "the metrics are at /metrics");
		return;
	}
	serve_page(c, head);
}

static void on_maccept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		       int salen, void *arg)
{
	struct hkv_metrics *m = arg;
	struct event_base *base = evconnlistener_get_base(l);
	struct timeval tmo = {METRICS_DEADLINE_S, 0};
	struct mconn *c;

	if (m->nconns >= METRICS_CONNS_MAX) {
		m->refused++;
		hkv_warn_limited("metrics: %d connections open; refusing more", METRICS_CONNS_MAX);
		evutil_closesocket(fd);
		return;
	}
	c = hkv_calloc(1, sizeof(*c));
	if (!c) {
		evutil_closesocket(fd);
		return;
	}
	c->m = m;
	c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
	c->deadline = evtimer_new(base, on_deadline, c);
	if (!c->bev || !c->deadline || evtimer_add(c->deadline, &tmo)) {
		if (c->bev)
			bufferevent_free(c->bev);
		else
			evutil_closesocket(fd);
		if (c->deadline)
			event_free(c->deadline);
		hkv_free(c);
		return;
	}
	m->nconns++;
	c->next = m->conns;
	if (m->conns)
		m->conns->prev = c;
	m->conns = c;
	bufferevent_setcb(c->bev, on_mread, on_written, on_mevent, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, METRICS_HEADERS_MAX + 2);
	bufferevent_enable(c->bev, EV_READ);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(((struct hkv_metrics *)arg)->lis);
}

static void on_maccept_error(struct evconnlistener *l, void *arg)
{
	struct hkv_metrics *m = arg;
	struct timeval pause = {0, 100000};

	hkv_warn_limited("metrics: accept: %s; pausing 100 ms",
			 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	evconnlistener_disable(l);
	evtimer_add(m->resume, &pause);
}

static uint16_t bound_port(evutil_socket_t fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len))
		return 0;
	return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					       : ((struct sockaddr_in *)&ss)->sin_port);
}

struct hkv_metrics *hkv_metrics_start(struct event_base *base, const char *spec,
				      hkv_metrics_page_fn page, void *arg)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
	struct hkv_metrics *m;
	char host[256], port_s[8];
	uint16_t port;
	int err;

	if (hkv_metrics_parse_addr(spec, host, sizeof(host), &port)) {
		errno = EINVAL;
		return NULL;
	}
	snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
	if (getaddrinfo(host, port_s, &hints, &ai)) {
		errno = EADDRNOTAVAIL;
		return NULL;
	}
	m = hkv_calloc(1, sizeof(*m));
	if (!m) {
		freeaddrinfo(ai);
		return NULL;
	}
	m->page = page;
	m->arg = arg;
	errno = 0;
	m->lis = evconnlistener_new_bind(base, on_maccept, m,
					 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
						 LEV_OPT_REUSEABLE,
					 64, ai->ai_addr, (int)ai->ai_addrlen);
	freeaddrinfo(ai);
	m->resume = m->lis ? evtimer_new(base, on_resume, m) : NULL;
	if (!m->resume) {
		err = errno ? errno : EADDRNOTAVAIL;
		if (m->lis)
			evconnlistener_free(m->lis);
		hkv_free(m);
		errno = err;
		return NULL;
	}
	evconnlistener_set_error_cb(m->lis, on_maccept_error);
	m->port = bound_port(evconnlistener_get_fd(m->lis));
	snprintf(m->url, sizeof(m->url), strchr(host, ':') ? "http://[%s]:%u/metrics"
							    : "http://%s:%u/metrics",
		 host, (unsigned)m->port);
	return m;
}

uint16_t hkv_metrics_port(const struct hkv_metrics *m)
{
	return m->port;
}

const char *hkv_metrics_url(const struct hkv_metrics *m)
{
	return m->url;
}

void hkv_metrics_endpoint_stats(const struct hkv_metrics *m, uint64_t *refused,
				uint64_t *dropped_slow)
{
	*refused = m ? m->refused : 0;
	*dropped_slow = m ? m->dropped_slow : 0;
}

void hkv_metrics_stop(struct hkv_metrics *m)
{
	if (!m)
		return;
	while (m->conns)
		mconn_free(m->conns);
	evconnlistener_free(m->lis);
	event_free(m->resume);
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
	CT(blocks_abandoned, "blocks_abandoned",
	   "Held blocks left for the server to reclaim (0: they go back at any age)."),
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
	CT(fail_fast, "fail_fast", "Cluster operations failed at once on a server found dead "
	   "(within its retry interval)."),
	CT(evictions_spared, "evictions_spared", "Refills ahead that evicted nothing: a quarter "
	   "of the blocks sampled were free (another client's flush or deletes)."),
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

