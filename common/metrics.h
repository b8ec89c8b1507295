/*
 * metrics.h - a Prometheus endpoint: the text exposition format (0.0.4) on
 * an optional HTTP port, served on the caller's event loop by a small
 * HTTP/1.1 responder of its own (metrics.c says why not evhttp). Shared by hatchkv-server and hatchkv-memcached (docs/metrics.md).
 *
 *   GET /metrics  ->  200, Content-Type: text/plain; version=0.0.4
 *
 *     # HELP hatchkv_clients_connected Clients connected to the data plane.
 *     # TYPE hatchkv_clients_connected gauge
 *     hatchkv_clients_connected 3
 *     # HELP hatchkv_segments Segments of the region by state.
 *     # TYPE hatchkv_segments gauge
 *     hatchkv_segments{state="free"} 12
 *     hatchkv_segments{state="shared"} 50
 *
 * Anything else is 404; methods other than GET and HEAD are refused (405),
 * a request's headers are capped at 8 KiB, a connection lives 5 s at most
 * from accept to the answer's last byte (one request each, Connection:
 * close), at most 64 are open at once (more are closed at accept), and an
 * accept error pauses accepting for 100 ms.
 * There is no authentication: bind it to loopback or a trusted network.
 *
 * The page is built by the owner's callback, on the loop thread, once per
 * scrape: it must be cheap (counters it keeps, a figure sampled earlier with
 * the time it was sampled) and never walk the index. The writer functions
 * append one family each; a name must match [a-zA-Z_:][a-zA-Z0-9_:]*, a
 * counter's end in _total, help text hold no newline or backslash, and
 * labels come preformatted (`state="free"`, values without quotes or
 * backslashes). Every page ends with hatchkv_metrics_page_seconds, what the
 * previous scrape's page took to build.
 *
 * Threading: hkv_metrics_start/stop and the callback run on the loop's
 * thread; the writer functions touch only the buffer they are given.
 */
#ifndef HKV_METRICS_H
#define HKV_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct event_base;
struct hkv_metrics;

#define HKV_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Appends the page's families to out (see above). */
typedef void (*hkv_metrics_page_fn)(struct evbuffer *out, void *arg);

/*
 * Parse "ADDR:PORT" (IPv4 or a host name) or "[ADDR6]:PORT"; PORT 0 binds
 * any free port. 0, or -EINVAL with nothing written.
 */
int hkv_metrics_parse_addr(const char *spec, char *host, size_t hostlen, uint16_t *port);
/* Is spec a good --metrics ADDR:PORT? (A daemon's option check.) */
int hkv_metrics_addr_ok(const char *spec);

/*
 * Serve page(out, arg) at spec (as hkv_metrics_parse_addr) on base's loop.
 * arg must stay valid until hkv_metrics_stop. Returns the endpoint, or NULL
 * with errno set (EINVAL: a bad spec; else the bind's error).
 */
struct hkv_metrics *hkv_metrics_start(struct event_base *base, const char *spec,
				      hkv_metrics_page_fn page, void *arg);
/* The port bound (the one the kernel chose, for PORT 0), and the page's
 * URL, "http://ADDR:PORT/metrics" (valid until hkv_metrics_stop). */
uint16_t hkv_metrics_port(const struct hkv_metrics *m);
const char *hkv_metrics_url(const struct hkv_metrics *m);
/* Close the port; requests in flight are dropped. NULL is a no-op. */
void hkv_metrics_stop(struct hkv_metrics *m);
/* Connections closed at accept (the cap), and dropped at the deadline. */
void hkv_metrics_endpoint_stats(const struct hkv_metrics *m, uint64_t *refused,
				uint64_t *dropped_slow);

/* One family's # HELP and # TYPE lines; type "counter" or "gauge". */
void hkv_metrics_family(struct evbuffer *out, const char *name, const char *type,
			const char *help);
/* A sample of the family just begun: name{labels} v (labels NULL: none). */
void hkv_metrics_sample(struct evbuffer *out, const char *name, const char *labels, uint64_t v);
void hkv_metrics_sample_f(struct evbuffer *out, const char *name, const char *labels, double v);
/* A family of one unlabelled sample. */
void hkv_metrics_counter(struct evbuffer *out, const char *name, const char *help, uint64_t v);
void hkv_metrics_gauge(struct evbuffer *out, const char *name, const char *help, double v);

/* The client library's counters (struct hkv_client_stats) of n sets, the
 * k-th with labels[k] ("system=\"a\",workload=\"A\""; labels NULL or n 1
 * with no labels: unlabelled): hatchkv_client_* families (docs/metrics.md). */
struct hkv_client_stats;
void hkv_metrics_client(struct evbuffer *out, const struct hkv_client_stats *h, int n,
			const char *const *labels);

/* Unix time now, in seconds (for *_timestamp_seconds gauges). */
double hkv_metrics_unix_now(void);

#endif /* HKV_METRICS_H */
