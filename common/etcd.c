/*
 * etcd.c - see etcd.h. Every call is one HTTP/1.1 POST on a connection of
 * its own, run to completion on the handle's private event_base:
 *
 *   build the request (json-c) -> call_run(): connection, request, deadline
 *   timer; loop until call_done() / call_chunk() / call_deadline() says done;
 *   free the connection (which cancels whatever is still in flight) ->
 *   parse the reply (json-c; base64 by libsodium) -> 0 or -errno
 *
 * No connection is kept between calls (requests say "Connection: close"):
 * a kept-alive one that the server closed while idle fails the next
 * request, and retrying that is not safe for a txn. One TCP connect per
 * control-plane call is cheap.
 *
 * Streamed replies are framed by JSON object, never by HTTP chunk: a watch
 * reads objects until the first with events. A keepalive's body is one
 * object and then ends, so it is an ordinary call.
 *
 * evhttp's failure reports: a failed connect calls the request's callback
 * with the request and response code 0 and skips the error callback; any
 * later failure calls the error callback (EOF, timeout...) and then the
 * request's callback with NULL. call_done() tells refused from broken so.
 */
#include "common/etcd.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <json-c/json.h>
#include <sodium.h>

#include "common/hkv_alloc.h"

#define ETCD_HOST_MAX   256
#define ETCD_PREFIX_MAX 512
#define B64             sodium_base64_VARIANT_ORIGINAL
#define JSON_OUT        (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

struct etcd_ep {
	int port;
	char host[ETCD_HOST_MAX];
	char host_hdr[ETCD_HOST_MAX + 16]; /* "host:port", IPv6 in brackets */
};

/*
 * Several endpoints (etcd://H1:P1,H2:P2/PREFIX, issue 29): calls go to the
 * current one; a refused connection (nothing was sent) tries the next at
 * once, a timeout or a broken exchange makes the next call go to the next
 * (the caller retries as it does on any etcd error: a write that may have
 * landed is never sent twice by this layer).
 */
struct hkv_etcd {
	struct event_base *base;
	int timeout_ms;
	struct etcd_ep ep[HKV_ETCD_MAX_ENDPOINTS];
	int nep, cur;
	char prefix[ETCD_PREFIX_MAX];
};

struct etcd_call;
/* A streamed reply's step per JSON object: 0 = read on, 1 = answered, <0 = error. */
typedef int (*etcd_obj_fn)(struct etcd_call *c, json_object *obj);

/* One exchange in flight; lives on the caller's stack. */
struct etcd_call {
	struct evbuffer *body; /* the whole body (a stream's only when not 200) */
	json_tokener *tok;     /* set for a stream: frames the body into objects */
	etcd_obj_fn on_obj;
	void *arg;
	int status; /* HTTP status; 0 = no reply */
	int err;    /* 0 or -errno, valid once done */
	int done;
	int http_failed;  /* evhttp's error callback ran (after a connect) */
	int http_timeout; /* ... and said its socket timed out */
};

/* ---- URIs and handles ---- */

static int parse_port(const char *p, int *port, const char **end)
{
	long v = 0;
	int n = 0;

	while (p[n] >= '0' && p[n] <= '9' && n < 6)
		v = v * 10 + (p[n++] - '0');
	if (n == 0 || n > 5 || v < 1 || v > 65535)
		return -EINVAL;
	*port = (int)v;
	*end = p + n;
	return 0;
}

static int copy_part(char *dst, size_t cap, const char *src, size_t n)
{
	if (n >= cap)
		return -EINVAL;
	memcpy(dst, src, n);
	dst[n] = 0;
	return 0;
}

int hkv_etcd_parse_uri(const char *uri, char *host, size_t hostlen, int *port, char *prefix,
                       size_t prefixlen)
{
	const char *h, *hend, *p, *path;
	size_t plen;

	if (!uri || strncmp(uri, "etcd://", 7))
		return -EINVAL;
	h = uri + 7;
	if (*h == '[') { /* [v6addr]:port */
		if (!(hend = strchr(++h, ']')))
			return -EINVAL;
		p = hend + 1;
	} else {
		hend = h + strcspn(h, ":/");
		p = hend;
	}
	if (hend == h || *p != ':' || parse_port(p + 1, port, &path))
		return -EINVAL;
	if (*path && *path != '/')
		return -EINVAL;
	plen = strlen(path);
	while (plen > 0 && path[plen - 1] == '/') /* "/" and "" both give "" */
		plen--;
	if (copy_part(host, hostlen, h, (size_t)(hend - h)))
		return -EINVAL;
	return copy_part(prefix, prefixlen, path, plen);
}

/* Each comma-separated endpoint of uri's authority as its own
 * etcd://HOST:PORT/PREFIX, parsed as one; 0 or -EINVAL. */
static int parse_endpoints(const char *uri, struct hkv_etcd *e)
{
	const char *auth, *path, *p;
	char one[ETCD_HOST_MAX + ETCD_PREFIX_MAX + 32];
	char prefix[ETCD_PREFIX_MAX];

	if (!uri || strncmp(uri, "etcd://", 7))
		return -EINVAL;
	auth = uri + 7;
	path = auth + strcspn(auth, "/");
	for (p = auth; p < path;) {
		const char *comma = memchr(p, ',', (size_t)(path - p));
		size_t n = (size_t)((comma ? comma : path) - p);
		struct etcd_ep *ep = &e->ep[e->nep];

		if (!n || e->nep == HKV_ETCD_MAX_ENDPOINTS ||
		    (size_t)snprintf(one, sizeof(one), "etcd://%.*s%s", (int)n, p, path) >=
			    sizeof(one) ||
		    hkv_etcd_parse_uri(one, ep->host, sizeof(ep->host), &ep->port, prefix,
				       sizeof(prefix)))
			return -EINVAL;
		snprintf(ep->host_hdr, sizeof(ep->host_hdr),
			 strchr(ep->host, ':') ? "[%s]:%d" : "%s:%d", ep->host, ep->port);
		e->nep++;
		if (!comma)
			break;
		p = comma + 1;
		if (p == path)
			return -EINVAL; /* a trailing comma */
	}
	if (!e->nep)
		return -EINVAL;
	return copy_part(e->prefix, sizeof(e->prefix), prefix, strlen(prefix));
}

struct hkv_etcd *hkv_etcd_open(const char *uri, int timeout_ms)
{
	struct hkv_etcd *e;
	int rc = -EINVAL;

	if (timeout_ms <= 0) {
		errno = EINVAL;
		return NULL;
	}
	if (!(e = hkv_calloc(1, sizeof(*e)))) {
		errno = ENOMEM;
		return NULL;
	}
	if (parse_endpoints(uri, e))
		goto free_handle;
	e->timeout_ms = timeout_ms;
	rc = -ENOMEM;
	if (!(e->base = event_base_new()))
		goto free_handle;
	return e;

free_handle:
	hkv_free(e);
	errno = -rc;
	return NULL;
}

void hkv_etcd_close(struct hkv_etcd *e)
{
	if (!e)
		return;
	event_base_free(e->base);
	hkv_free(e);
}

const char *hkv_etcd_prefix(const struct hkv_etcd *e)
{
	return e->prefix;
}

/* ---- one HTTP exchange ---- */

static struct timeval ms_tv(int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	return tv;
}

/* A connection whose own idle timeout is a second past the call's deadline,
 * so the deadline timer decides; no reconnect attempts (a refusal is final). */
static struct evhttp_connection *conn_new(struct hkv_etcd *e, int timeout_ms)
{
	struct evhttp_connection *conn;
	struct timeval tv = ms_tv(timeout_ms > INT_MAX - 1000 ? INT_MAX : timeout_ms + 1000);

	conn = evhttp_connection_base_new(e->base, NULL, e->ep[e->cur].host,
					  (ev_uint16_t)e->ep[e->cur].port);
	if (!conn)
		return NULL;
	evhttp_connection_set_timeout_tv(conn, &tv);
	evhttp_connection_set_retries(conn, 0);
	return conn;
}

static void call_finish(struct etcd_call *c, int err)
{
	if (!c->done) {
		c->done = 1;
		c->err = err;
	}
}

static void call_done(struct evhttp_request *req, void *arg)
{
	struct etcd_call *c = arg;

	if (c->done)
		return;
	if (!req || !(c->status = evhttp_request_get_response_code(req))) {
		call_finish(c, c->http_timeout  ? -ETIMEDOUT
		               : c->http_failed ? -EIO
		                                : -ECONNREFUSED);
		return;
	}
	if (evbuffer_add_buffer(c->body, evhttp_request_get_input_buffer(req))) {
		call_finish(c, -ENOMEM);
		return;
	}
	/* a stream that ends without its answer: etcd went away under it */
	call_finish(c, c->tok && c->status == 200 ? -EIO : 0);
}

static void call_error(enum evhttp_request_error what, void *arg)
{
	struct etcd_call *c = arg;

	c->http_failed = 1;
	c->http_timeout = what == EVREQ_HTTP_TIMEOUT;
}

static void call_deadline(evutil_socket_t fd, short what, void *arg)
{
	call_finish(arg, -ETIMEDOUT);
}

/* Feed a stream's bytes to the tokener; each complete object goes to on_obj. */
static int stream_feed(struct etcd_call *c, const char *p, size_t n)
{
	while (n > 0) {
		int len = n > INT_MAX ? INT_MAX : (int)n;
		json_object *obj = json_tokener_parse_ex(c->tok, p, len);
		enum json_tokener_error je = json_tokener_get_error(c->tok);
		size_t used = json_tokener_get_parse_end(c->tok);
		int rc;

		if (je == json_tokener_continue) { /* all taken; the object goes on */
			p += len;
			n -= (size_t)len;
			continue;
		}
		if (je != json_tokener_success || !obj || used == 0) {
			json_object_put(obj);
			return -EPROTO;
		}
		json_tokener_reset(c->tok);
		rc = c->on_obj(c, obj);
		json_object_put(obj);
		if (rc)
			return rc;
		p += used;
		n -= used;
	}
	return 0;
}

static void call_chunk(struct evhttp_request *req, void *arg)
{
	struct etcd_call *c = arg;
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t n = evbuffer_get_length(in);
	const char *p;
	int rc;

	if (c->done || n == 0)
		return;
	c->status = evhttp_request_get_response_code(req);
	if (c->status != 200) { /* an error reply: keep it whole for reply_error() */
		if (evbuffer_add_buffer(c->body, in))
			call_finish(c, -ENOMEM);
		return;
	}
	p = (const char *)evbuffer_pullup(in, -1);
	rc = p ? stream_feed(c, p, n) : -ENOMEM;
	if (rc)
		call_finish(c, rc < 0 ? rc : 0);
}

/*
 * evhttp writes with writev(), so a peer gone mid-request would raise
 * SIGPIPE: block it on this thread while the loop runs, then swallow one
 * that became pending (if it was not blocked before us).
 */
static void sigpipe_block(sigset_t *old)
{
	sigset_t pipe;

	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, old);
}

static void sigpipe_restore(const sigset_t *old)
{
	struct timespec zero = {0, 0};
	sigset_t pipe, pending;

	if (sigismember(old, SIGPIPE))
		return;
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
		while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
			;
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

static struct evhttp_request *request_new(struct hkv_etcd *e, struct etcd_call *c, const char *body,
                                          size_t len)
{
	struct evhttp_request *req = evhttp_request_new(call_done, c);
	struct evkeyvalq *hdrs;

	if (!req)
		return NULL;
	evhttp_request_set_error_cb(req, call_error);
	if (c->tok)
		evhttp_request_set_chunked_cb(req, call_chunk);
	hdrs = evhttp_request_get_output_headers(req);
	if (evhttp_add_header(hdrs, "Host", e->ep[e->cur].host_hdr) ||
	    evhttp_add_header(hdrs, "Content-Type", "application/json") ||
	    evhttp_add_header(hdrs, "Connection", "close") ||
	    evbuffer_add(evhttp_request_get_output_buffer(req), body, len)) {
		evhttp_request_free(req);
		return NULL;
	}
	return req;
}

static int call_run_once(struct hkv_etcd *e, const char *path, const char *body, size_t len,
			 struct etcd_call *c, int timeout_ms);

/* Does ep refuse a TCP connection now (within 200 ms)? Tells a refused
 * connect from an exchange broken after the request may have gone out. */
static int ep_refuses(const struct etcd_ep *ep)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	char port[8];
	int fd, refused = 0, err = 0;
	socklen_t elen = sizeof(err);

	snprintf(port, sizeof(port), "%d", ep->port);
	if (getaddrinfo(ep->host, port, &hints, &ai))
		return 1; /* no such host: nothing can have been sent */
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) {
			refused = 0;
		} else if (errno == EINPROGRESS) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};

			if (poll(&p, 1, 200) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen))
				refused = err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH;
		} else {
			refused = errno == ECONNREFUSED || errno == EHOSTUNREACH || errno == ENETUNREACH;
		}
		close(fd);
	}
	freeaddrinfo(ai);
	return refused;
}

/* POST body to path on a new connection to the current endpoint; run the
 * loop until the call is done or timeout_ms passes. 0 (then see c->status,
 * c->body) or -errno. With several endpoints: see struct hkv_etcd. */
static int call_run(struct hkv_etcd *e, const char *path, const char *body, size_t len,
                    struct etcd_call *c, int timeout_ms)
{
	int rc = 0;

	for (int tried = 0; tried < e->nep; tried++) {
		struct etcd_call fresh = *c; /* (untouched: a refusal changed nothing) */

		rc = call_run_once(e, path, body, len, c, timeout_ms);
		if (e->nep == 1)
			return rc;
		if (rc == -ECONNREFUSED || (rc == -EIO && ep_refuses(&e->ep[e->cur]))) {
			/* refused (evhttp says -EIO for that too): nothing was
			 * sent, so the next endpoint, now */
			e->cur = (e->cur + 1) % e->nep;
			*c = fresh;
			continue;
		}
		if (rc == -ETIMEDOUT || rc == -EIO || (!rc && c->status == 503))
			e->cur = (e->cur + 1) % e->nep; /* the next call goes elsewhere */
		return rc;
	}
	return rc;
}

static int call_run_once(struct hkv_etcd *e, const char *path, const char *body, size_t len,
			 struct etcd_call *c, int timeout_ms)
{
	struct timeval tv = ms_tv(timeout_ms);
	struct evhttp_connection *conn;
	struct evhttp_request *req;
	struct event *deadline;
	sigset_t old;

	if (!(conn = conn_new(e, timeout_ms)))
		return -ENOMEM;
	if (!(deadline = evtimer_new(e->base, call_deadline, c)))
		goto free_conn;
	if (!(req = request_new(e, c, body, len)))
		goto free_deadline;
	sigpipe_block(&old);
	evtimer_add(deadline, &tv);
	/* may already call call_done() (a local refusal is reported at once) */
	if (evhttp_make_request(conn, req, EVHTTP_REQ_POST, path))
		call_finish(c, -EIO);
	while (!c->done)
		if (event_base_loop(e->base, EVLOOP_ONCE) != 0)
			call_finish(c, -EIO);
	event_free(deadline);
	evhttp_connection_free(conn); /* and a request still in flight: cancelled */
	sigpipe_restore(&old);
	return c->err;

free_deadline:
	event_free(deadline);
free_conn:
	evhttp_connection_free(conn);
	return -ENOMEM;
}

/* ---- JSON in and out ---- */

static int json_add(json_object *obj, const char *name, json_object *v)
{
	if (!v || json_object_object_add(obj, name, v)) {
		json_object_put(v);
		return -ENOMEM;
	}
	return 0;
}

/* 64-bit numbers travel as strings (lease IDs exceed 2^53). */
static int json_add_i64(json_object *obj, const char *name, int64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%lld", (long long)v);
	return json_add(obj, name, json_object_new_string(s));
}

static int json_add_b64(json_object *obj, const char *name, const void *p, size_t n)
{
	size_t cap;
	char *s;
	int rc;

	if (n > INT_MAX / 2)
		return -EINVAL;
	cap = sodium_base64_ENCODED_LEN(n, B64);
	if (!(s = hkv_malloc(cap)))
		return -ENOMEM;
	sodium_bin2base64(s, cap, p, n, B64);
	rc = json_add(obj, name, json_object_new_string_len(s, (int)strlen(s)));
	hkv_free(s);
	return rc;
}

/*
 * "key" and, for a prefix, "range_end": the prefix with its last byte plus
 * one after dropping trailing 0xff bytes; "\0" (every key from key on) when
 * nothing is left. The empty prefix is key "\0" to "\0": the whole keyspace.
 */
static int json_add_key(json_object *obj, const char *key, int prefix)
{
	size_t klen = strlen(key), n = klen;
	char *end;
	int rc;

	if (klen == 0 && !prefix)
		return -EINVAL; /* etcd: "key is not provided" */
	if (!prefix)
		return json_add_b64(obj, "key", key, klen);
	if ((rc = json_add_b64(obj, "key", klen ? key : "", klen ? klen : 1)))
		return rc;
	if (!(end = hkv_malloc(klen + 1)))
		return -ENOMEM;
	memcpy(end, key, klen);
	while (n > 0 && (unsigned char)end[n - 1] == 0xff)
		n--;
	if (n > 0)
		end[n - 1]++;
	else
		end[n++] = 0;
	rc = json_add_b64(obj, "range_end", end, n);
	hkv_free(end);
	return rc;
}

/* A 64-bit field: absent is 0 (proto3); a string (etcd's way) or a number. */
static int json_i64(json_object *obj, const char *name, int64_t *v)
{
	json_object *f;
	const char *s;
	char *end;

	*v = 0;
	if (!json_object_object_get_ex(obj, name, &f))
		return 0;
	if (json_object_is_type(f, json_type_int)) {
		*v = json_object_get_int64(f);
		return 0;
	}
	if (!json_object_is_type(f, json_type_string))
		return -EPROTO;
	s = json_object_get_string(f);
	errno = 0;
	*v = strtoll(s, &end, 10);
	return errno || end == s || *end ? -EPROTO : 0;
}

static int json_true(json_object *obj, const char *name)
{
	json_object *f;

	return json_object_object_get_ex(obj, name, &f) && json_object_get_boolean(f);
}

/* A child object, or NULL (absent, or not an object). */
static json_object *json_child(json_object *obj, const char *name)
{
	json_object *f;

	if (!json_object_object_get_ex(obj, name, &f) || !json_object_is_type(f, json_type_object))
		return NULL;
	return f;
}

/* Every KV reply has a header, and the store's revision is at least 1. */
static int header_rev(json_object *reply, int64_t *rev)
{
	int64_t v;

	if (json_i64(json_child(reply, "header"), "revision", &v) || v <= 0)
		return -EPROTO;
	if (rev)
		*rev = v;
	return 0;
}

/* A base64 field, decoded into a fresh NUL-terminated buffer ("" when absent). */
static int json_b64(json_object *obj, const char *name, char **out, size_t *outlen)
{
	json_object *f;
	const char *s = "", *end;
	size_t n = 0, len = 0;

	if (json_object_object_get_ex(obj, name, &f)) {
		if (!json_object_is_type(f, json_type_string))
			return -EPROTO;
		s = json_object_get_string(f);
		n = (size_t)json_object_get_string_len(f);
	}
	if (!(*out = hkv_malloc(n / 4 * 3 + 3 + 1)))
		return -ENOMEM;
	if (n &&
	    (sodium_base642bin((unsigned char *)*out, n / 4 * 3 + 3, s, n, NULL, &len, &end, B64) ||
	     end != s + n)) {
		hkv_free(*out);
		*out = NULL;
		return -EPROTO;
	}
	(*out)[len] = 0;
	if (outlen)
		*outlen = len;
	return 0;
}

/* Parse the whole body as one JSON object (whitespace may follow it). */
static int body_json(struct evbuffer *body, json_object **out)
{
	size_t n = evbuffer_get_length(body), used;
	const char *p = (const char *)evbuffer_pullup(body, -1);
	json_tokener *tok;
	json_object *obj;

	*out = NULL;
	if (n == 0 || n > INT_MAX)
		return -EPROTO;
	if (!p)
		return -ENOMEM;
	if (!(tok = json_tokener_new()))
		return -ENOMEM;
	obj = json_tokener_parse_ex(tok, p, (int)n);
	used = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	while (obj && used < n && p[used] && strchr(" \t\r\n", p[used]))
		used++;
	if (!obj || used != n || !json_object_is_type(obj, json_type_object)) {
		json_object_put(obj);
		return -EPROTO;
	}
	*out = obj;
	return 0;
}

/* etcd's error object {"error":"...","code":N}: N is a gRPC status code. */
static int grpc_error(json_object *obj)
{
	json_object *code;

	if (!json_object_object_get_ex(obj, "code", &code) && /* a stream's error says grpc_code */
	    !json_object_object_get_ex(obj, "grpc_code", &code))
		return -EPROTO;
	if (!json_object_is_type(code, json_type_int))
		return -EPROTO;
	switch (json_object_get_int(code)) {
	case 3: /* InvalidArgument (also "request is too large") */
		return -EINVAL;
	case 4: /* DeadlineExceeded */
		return -ETIMEDOUT;
	case 5: /* NotFound: "requested lease not found" */
		return -ENOENT;
	case 8:  /* ResourceExhausted */
	case 14: /* Unavailable: no leader, stopping */
		return -EIO;
	default:
		return -EPROTO;
	}
}

/* A reply other than 200: its error object if it has one, else -EPROTO. */
static int reply_error(struct etcd_call *c)
{
	json_object *obj;
	int rc;

	if (body_json(c->body, &obj))
		return -EPROTO;
	rc = grpc_error(obj);
	json_object_put(obj);
	return rc;
}

/* ---- unary calls ---- */

/* POST req (consumed) to path; *reply is the 200 reply's object
 * (json_object_put it). */
static int etcd_call(struct hkv_etcd *e, const char *path, json_object *req, json_object **reply)
{
	struct etcd_call c = {0};
	const char *s;
	size_t len;
	int rc = -ENOMEM;

	*reply = NULL;
	if (!(s = json_object_to_json_string_length(req, JSON_OUT, &len)))
		goto put_req;
	if (!(c.body = evbuffer_new()))
		goto put_req;
	rc = call_run(e, path, s, len, &c, e->timeout_ms);
	if (!rc)
		rc = c.status == 200 ? body_json(c.body, reply) : reply_error(&c);
	evbuffer_free(c.body);
put_req:
	json_object_put(req);
	return rc;
}

/* A request object with "key" (and "range_end"); NULL on failure, *rc says why. */
static json_object *key_request(const char *key, int prefix, int *rc)
{
	json_object *req = json_object_new_object();

	*rc = -ENOMEM;
	if (req && !(*rc = json_add_key(req, key, prefix)))
		return req;
	json_object_put(req);
	return NULL;
}

static int kv_parse(json_object *obj, struct hkv_etcd_kv *kv)
{
	int rc;

	if (!json_object_is_type(obj, json_type_object))
		return -EPROTO;
	if ((rc = json_b64(obj, "key", &kv->key, NULL)) ||
	    (rc = json_b64(obj, "value", &kv->value, &kv->vlen)))
		return rc;
	if (json_i64(obj, "create_revision", &kv->create_rev) ||
	    json_i64(obj, "mod_revision", &kv->mod_rev) || json_i64(obj, "version", &kv->version) ||
	    json_i64(obj, "lease", &kv->lease))
		return -EPROTO;
	return 0;
}

/* The "kvs" of a range reply (absent: none). */
static int kvs_parse(json_object *reply, struct hkv_etcd_kv **kvs, int *n)
{
	json_object *arr;
	size_t len;
	int rc = 0;

	*kvs = NULL;
	*n = 0;
	if (!json_object_object_get_ex(reply, "kvs", &arr))
		return 0;
	if (!json_object_is_type(arr, json_type_array))
		return -EPROTO;
	if ((len = json_object_array_length(arr)) == 0)
		return 0;
	if (len > INT_MAX || !(*kvs = hkv_calloc(len, sizeof(**kvs))))
		return -ENOMEM;
	for (size_t i = 0; i < len && !rc; i++) {
		rc = kv_parse(json_object_array_get_idx(arr, i), &(*kvs)[i]);
		*n = (int)i + 1; /* the failed one too: kvs_free frees what it holds */
	}
	if (rc) {
		hkv_etcd_kvs_free(*kvs, *n);
		*kvs = NULL;
		*n = 0;
	}
	return rc;
}

void hkv_etcd_kvs_free(struct hkv_etcd_kv *kvs, int n)
{
	for (int i = 0; kvs && i < n; i++) {
		hkv_free(kvs[i].key);
		hkv_free(kvs[i].value);
	}
	hkv_free(kvs);
}

int hkv_etcd_range(struct hkv_etcd *e, const char *key, int prefix, struct hkv_etcd_kv **kvs,
                   int *n, int64_t *rev)
{
	json_object *req, *reply;
	int rc;

	*kvs = NULL;
	*n = 0;
	if (!(req = key_request(key, prefix, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/kv/range", req, &reply)))
		return rc;
	if (!(rc = header_rev(reply, rev)))
		rc = kvs_parse(reply, kvs, n);
	json_object_put(reply);
	return rc;
}

/* A put's fields: "key", "value", and "lease" unless 0. */
static json_object *put_request(const char *key, const void *value, size_t vlen, int64_t lease,
                                int *rc)
{
	json_object *req = key_request(key, 0, rc);

	if (req && !(*rc = json_add_b64(req, "value", value, vlen)) &&
	    (!lease || !(*rc = json_add_i64(req, "lease", lease))))
		return req;
	json_object_put(req);
	return NULL;
}

int hkv_etcd_put(struct hkv_etcd *e, const char *key, const void *value, size_t vlen, int64_t lease,
                 int64_t *rev)
{
	json_object *req, *reply;
	int rc;

	if (!(req = put_request(key, value, vlen, lease, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/kv/put", req, &reply)))
		return rc;
	rc = header_rev(reply, rev);
	json_object_put(reply);
	return rc;
}

int hkv_etcd_delete(struct hkv_etcd *e, const char *key, int prefix, int64_t *deleted)
{
	json_object *req, *reply;
	int64_t n;
	int rc;

	if (!(req = key_request(key, prefix, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/kv/deleterange", req, &reply)))
		return rc;
	if (!(rc = header_rev(reply, NULL)) && !(rc = json_i64(reply, "deleted", &n)) && deleted)
		*deleted = n;
	json_object_put(reply);
	return rc;
}

/* ---- transactions ---- */

/* [{"target":"MOD","key":..,"mod_revision":"N","result":"EQUAL"}], or for
 * expect_rev 0 the CREATE revision == 0 (the key does not exist). */
static json_object *compare_rev(const char *key, int64_t expect_rev, int *rc)
{
	json_object *cmp = key_request(key, 0, rc), *arr = NULL;
	int absent = expect_rev == 0;

	if (!cmp)
		return NULL;
	*rc = -ENOMEM;
	if (json_add(cmp, "target", json_object_new_string(absent ? "CREATE" : "MOD")) ||
	    json_add_i64(cmp, absent ? "create_revision" : "mod_revision", expect_rev) ||
	    json_add(cmp, "result", json_object_new_string("EQUAL")) ||
	    !(arr = json_object_new_array()) || json_object_array_add(arr, cmp)) {
		json_object_put(cmp);
		json_object_put(arr);
		return NULL;
	}
	*rc = 0;
	return arr;
}

/* A one-element array [{name: op}] (op consumed); NULL on failure. */
static json_object *txn_ops(const char *name, json_object *op)
{
	json_object *wrap, *arr;

	if (!op)
		return NULL;
	if (!(wrap = json_object_new_object()) || json_add(wrap, name, op)) {
		json_object_put(wrap ? NULL : op); /* json_add puts op when it fails */
		json_object_put(wrap);
		return NULL;
	}
	if (!(arr = json_object_new_array()) || json_object_array_add(arr, wrap)) {
		json_object_put(wrap);
		json_object_put(arr);
		return NULL;
	}
	return arr;
}

/* Run {"compare":cmp,"success":ok,"failure":fail} (all consumed; fail NULL:
 * none); *succeeded and *reply (json_object_put it) on 0. */
static int txn_run(struct hkv_etcd *e, json_object *cmp, json_object *ok, json_object *fail,
                   int *succeeded, json_object **reply)
{
	json_object *req = json_object_new_object();
	int rc;

	if (!req) {
		json_object_put(cmp);
		json_object_put(ok);
		json_object_put(fail);
		return -ENOMEM;
	}
	/* add all three whatever happens: each add consumes its part */
	rc = json_add(req, "compare", cmp);
	rc |= json_add(req, "success", ok);
	if (fail)
		rc |= json_add(req, "failure", fail);
	if (rc) {
		json_object_put(req);
		return -ENOMEM;
	}
	if ((rc = etcd_call(e, "/v3/kv/txn", req, reply)))
		return rc;
	if ((rc = header_rev(*reply, NULL))) {
		json_object_put(*reply);
		return rc;
	}
	*succeeded = json_true(*reply, "succeeded");
	return 0;
}

/* The mod_revision in a failed put_if's response_range (0: key absent). */
static int failed_put_rev(json_object *reply, int64_t *rev)
{
	json_object *arr, *range = NULL;
	struct hkv_etcd_kv *kvs;
	int n, rc;

	if (json_object_object_get_ex(reply, "responses", &arr) &&
	    json_object_is_type(arr, json_type_array) && json_object_array_length(arr) > 0)
		range = json_child(json_object_array_get_idx(arr, 0), "response_range");
	if (!range)
		return -EPROTO;
	if ((rc = kvs_parse(range, &kvs, &n)))
		return rc;
	if (rev)
		*rev = n > 0 ? kvs[0].mod_rev : 0;
	hkv_etcd_kvs_free(kvs, n);
	return 0;
}

int hkv_etcd_put_if(struct hkv_etcd *e, const char *key, const void *value, size_t vlen,
                    int64_t expect_rev, int64_t lease, int64_t *rev)
{
	json_object *cmp, *ok = NULL, *fail = NULL, *reply;
	int rc, succeeded;

	if (expect_rev < 0)
		return -EINVAL;
	cmp = compare_rev(key, expect_rev, &rc);
	if (!rc)
		ok = txn_ops("request_put", put_request(key, value, vlen, lease, &rc));
	if (!rc)
		fail = txn_ops("request_range", key_request(key, 0, &rc));
	if (!rc && (!ok || !fail))
		rc = -ENOMEM;
	if (rc) {
		json_object_put(cmp);
		json_object_put(ok);
		json_object_put(fail);
		return rc;
	}
	if ((rc = txn_run(e, cmp, ok, fail, &succeeded, &reply)))
		return rc;
	if (succeeded)
		rc = header_rev(reply, rev);
	else if (!(rc = failed_put_rev(reply, rev)))
		rc = -ECANCELED;
	json_object_put(reply);
	return rc;
}

/* One compare of a hkv_etcd_txn_put, appended to arr. */
static int compare_add(json_object *arr, const struct hkv_etcd_cmp *c)
{
	static const char *const target[] = {"MOD", "CREATE", "LEASE"};
	static const char *const field[] = {"mod_revision", "create_revision", "lease"};
	int rc;
	json_object *cmp;

	if ((unsigned)c->what > HKV_ETCD_CMP_LEASE)
		return -EINVAL;
	cmp = key_request(c->key, 0, &rc);
	if (!cmp)
		return rc;
	if (json_add(cmp, "target", json_object_new_string(target[c->what])) ||
	    json_add_i64(cmp, field[c->what], c->value) ||
	    json_add(cmp, "result", json_object_new_string("EQUAL")) ||
	    json_object_array_add(arr, cmp)) {
		json_object_put(cmp);
		return -ENOMEM;
	}
	return 0;
}

int hkv_etcd_txn_put(struct hkv_etcd *e, const struct hkv_etcd_cmp *cmps, int ncmp,
		     const char *put_key, const void *value, size_t vlen, int64_t lease,
		     const char *del_key, int64_t *rev)
{
	json_object *arr = json_object_new_array(), *ok = json_object_new_array(), *reply;
	int rc = arr && ok ? 0 : -ENOMEM, succeeded;

	for (int i = 0; !rc && i < ncmp; i++)
		rc = compare_add(arr, &cmps[i]);
	if (!rc) {
		json_object *put = txn_ops("request_put", put_request(put_key, value, vlen, lease, &rc));

		if (!rc && (!put || json_object_array_add(ok, json_object_get(
					   json_object_array_get_idx(put, 0)))))
			rc = -ENOMEM;
		json_object_put(put);
	}
	if (!rc && del_key) {
		json_object *del = txn_ops("request_delete_range", key_request(del_key, 0, &rc));

		if (!rc && (!del || json_object_array_add(ok, json_object_get(
					   json_object_array_get_idx(del, 0)))))
			rc = -ENOMEM;
		json_object_put(del);
	}
	if (rc) {
		json_object_put(arr);
		json_object_put(ok);
		return rc;
	}
	if ((rc = txn_run(e, arr, ok, NULL, &succeeded, &reply)))
		return rc;
	if (succeeded)
		rc = header_rev(reply, rev);
	json_object_put(reply);
	return rc ? rc : succeeded ? 0 : -ECANCELED;
}

int hkv_etcd_delete_if(struct hkv_etcd *e, const char *key, int64_t expect_rev)
{
	json_object *cmp, *ok = NULL, *reply;
	int rc, succeeded;

	if (expect_rev < 0)
		return -EINVAL;
	cmp = compare_rev(key, expect_rev, &rc);
	if (!rc && !(ok = txn_ops("request_delete_range", key_request(key, 0, &rc))))
		rc = rc ? rc : -ENOMEM;
	if (rc) {
		json_object_put(cmp);
		return rc;
	}
	if ((rc = txn_run(e, cmp, ok, NULL, &succeeded, &reply)))
		return rc;
	json_object_put(reply);
	return succeeded ? 0 : -ECANCELED;
}

/* ---- leases ---- */

static json_object *lease_request(const char *name, int64_t v, int *rc)
{
	json_object *req = json_object_new_object();

	*rc = -ENOMEM;
	if (req && !(*rc = json_add_i64(req, name, v)))
		return req;
	json_object_put(req);
	return NULL;
}

int hkv_etcd_lease_grant(struct hkv_etcd *e, int ttl_s, int64_t *id)
{
	json_object *req, *reply;
	int64_t v;
	int rc;

	if (ttl_s <= 0)
		return -EINVAL;
	if (!(req = lease_request("TTL", ttl_s, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/lease/grant", req, &reply)))
		return rc;
	rc = json_i64(reply, "ID", &v);
	if (!rc && v == 0) /* LeaseGrantResponse.error says why */
		rc = -EPROTO;
	if (!rc)
		*id = v;
	json_object_put(reply);
	return rc;
}

/* One POST to the keepalive stream: its body is one {"result":{...,"TTL":"N"}}
 * (TTL absent or <= 0: the lease is gone) and then ends. */
int hkv_etcd_lease_keepalive(struct hkv_etcd *e, int64_t id, int *ttl_s)
{
	json_object *req, *reply, *res;
	int64_t ttl = 0;
	int rc;

	if (!(req = lease_request("ID", id, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/lease/keepalive", req, &reply)))
		return rc;
	if (!(res = json_child(reply, "result")))
		rc = json_child(reply, "error") ? grpc_error(json_child(reply, "error")) : -EPROTO;
	else if (!(rc = json_i64(res, "TTL", &ttl)) && ttl <= 0)
		rc = -ENOENT;
	if (!rc && ttl_s)
		*ttl_s = ttl > INT_MAX ? INT_MAX : (int)ttl;
	json_object_put(reply);
	return rc;
}

int hkv_etcd_lease_revoke(struct hkv_etcd *e, int64_t id)
{
	json_object *req, *reply;
	int rc;

	if (!(req = lease_request("ID", id, &rc)))
		return rc;
	if ((rc = etcd_call(e, "/v3/lease/revoke", req, &reply)))
		return rc;
	rc = json_child(reply, "header") ? 0 : -EPROTO;
	json_object_put(reply);
	return rc;
}

/* ---- watch ---- */

/* The revision an event happened at: its kv's mod_revision (a delete's too). */
static int event_rev(json_object *result, json_object *ev, int64_t *rev)
{
	if (!json_object_is_type(ev, json_type_object) ||
	    json_i64(json_child(ev, "kv"), "mod_revision", rev))
		return -EPROTO;
	return *rev ? 0 : header_rev(result, rev);
}

/*
 * One object of the watch stream: {"result":{...}} or {"error":{...}}.
 * Skip "created" (and progress notifications) until one carries events. A
 * watch etcd cancels because after_rev was compacted away answers with the
 * compaction revision: changes may have happened, the caller re-reads.
 */
static int watch_obj(struct etcd_call *c, json_object *obj)
{
	json_object *res = json_child(obj, "result"), *evs;
	int64_t *rev = c->arg;

	if (!res)
		return json_child(obj, "error") ? grpc_error(json_child(obj, "error")) : -EPROTO;
	if (json_true(res, "canceled")) {
		if (json_i64(res, "compact_revision", rev) || *rev <= 0)
			return -EIO;
		return 1;
	}
	if (!json_object_object_get_ex(res, "events", &evs))
		return 0;
	if (!json_object_is_type(evs, json_type_array))
		return -EPROTO;
	if (json_object_array_length(evs) == 0)
		return 0;
	if (event_rev(res, json_object_array_get_idx(evs, 0), rev))
		return -EPROTO;
	return 1;
}

static json_object *watch_request(const char *key, int prefix, int64_t after_rev, int *rc)
{
	json_object *create = key_request(key, prefix, rc), *req = NULL;

	if (!create)
		return NULL;
	if ((*rc = json_add_i64(create, "start_revision", after_rev + 1)) ||
	    !(req = json_object_new_object())) {
		json_object_put(create);
		*rc = -ENOMEM;
		return NULL;
	}
	if ((*rc = json_add(req, "create_request", create))) { /* create is gone too */
		json_object_put(req);
		return NULL;
	}
	return req;
}

int hkv_etcd_watch_wait(struct hkv_etcd *e, const char *key, int prefix, int64_t after_rev,
                        int timeout_ms, int64_t *rev)
{
	struct etcd_call c = {.on_obj = watch_obj};
	json_object *req;
	int64_t got = 0;
	const char *s;
	size_t len;
	int rc;

	if (after_rev < 0 || after_rev == INT64_MAX || timeout_ms <= 0)
		return -EINVAL;
	if (!(req = watch_request(key, prefix, after_rev, &rc)))
		return rc;
	rc = -ENOMEM;
	c.arg = &got;
	if (!(s = json_object_to_json_string_length(req, JSON_OUT, &len)) ||
	    !(c.body = evbuffer_new()) || !(c.tok = json_tokener_new()))
		goto free_call;
	rc = call_run(e, "/v3/watch", s, len, &c, timeout_ms);
	if (!rc && c.status != 200)
		rc = reply_error(&c);
	if (!rc && rev)
		*rev = got;
free_call:
	if (c.tok)
		json_tokener_free(c.tok);
	if (c.body)
		evbuffer_free(c.body);
	json_object_put(req);
	return rc;
}
