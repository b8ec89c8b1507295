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
 *
 * TLS (hkv_etcd_open_sec with a CA): the same evhttp connection over an
 * OpenSSL bufferevent, as libevent's https client does it; a handshake that
 * fails looks to evhttp like a failed connect, so call_done() asks the
 * bufferevent whether OpenSSL failed before it calls that a refusal.
 * etcd's authentication: call_auth() below.
 */
#include "common/etcd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <json-c/json.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sodium.h>

#include "common/hkv_alloc.h"
#include "common/log.h"

#define ETCD_HOST_MAX   256
#define ETCD_PREFIX_MAX 512
#define B64             sodium_base64_VARIANT_ORIGINAL
#define JSON_OUT        (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

struct etcd_ep {
	int port;
	char host[ETCD_HOST_MAX];
	char host_hdr[ETCD_HOST_MAX + 16]; /* "host:port", IPv6 in brackets */
};

struct etcd_creds; /* (credentials that change live: below) */

/*
 * Several endpoints (etcd://H1:P1,H2:P2/PREFIX, issue 29): calls go to the
 * current one; a refused connection (nothing was sent) tries the next at
 * once, a timeout or a broken exchange makes the next call go to the next
 * (the caller retries as it does on any etcd error: a write that may have
 * landed is never sent twice by this layer). A read (a range, a keepalive)
 * may be sent again, so it gives each endpoint only its share of the
 * deadline and moves on within it: a member that stopped answering (SIGSTOP,
 * a hung host: the kernel still takes the connection) costs it a share, not
 * the whole deadline. A watch that etcd answered ("created") and that then
 * saw no change is no failure: the handle stays where it is.
 */
struct hkv_etcd {
	struct event_base *base;
	int timeout_ms;
	struct etcd_ep ep[HKV_ETCD_MAX_ENDPOINTS];
	int nep, cur;
	char prefix[ETCD_PREFIX_MAX];
	SSL_CTX *tls;            /* NULL: plain HTTP (a reference to creds->tls) */
	char *user, *password;   /* NULL: no etcd authentication (creds' copies) */
	struct etcd_creds *creds; /* NULL: opened without TLS and user */
	unsigned creds_gen;      /* the creds->gen tls, user and password are from */
	char token[1024];        /* etcd's auth token ("": none yet) */
	int token_ep;            /* the endpoint that issued it; -1: none */
	int answered;            /* some call has had an answer (for call_log's hints) */
	struct hkv_log_limit log_limit;
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
	int no_auth;      /* send no Authorization header (auth/authenticate) */
	int resend;       /* a read: may be sent again, to the next endpoint */
	int heard;        /* a stream's endpoint has sent something (200) */
	struct bufferevent *bev; /* a TLS call's bufferevent (evhttp owns it) */
	char why[200];    /* etcd's or OpenSSL's words for a failure ("" if none) */
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

/* ---- security options ---- */

static int sec_str(char **dst, const char *v)
{
	char *c;

	if (!v || !*v)
		return -EINVAL;
	if (!(c = hkv_strdup(v)))
		return -ENOMEM;
	hkv_free(*dst);
	*dst = c;
	return 0;
}

int hkv_etcd_sec_set(struct hkv_etcd_sec *s, const char *name, const char *value)
{
	if (!s || !name)
		return -EINVAL;
	if (!strcmp(name, "cacert"))
		return sec_str(&s->cacert, value);
	if (!strcmp(name, "cert"))
		return sec_str(&s->cert, value);
	if (!strcmp(name, "key"))
		return sec_str(&s->key, value);
	if (!strcmp(name, "user"))
		return sec_str(&s->user, value);
	if (!strcmp(name, "password-file"))
		return sec_str(&s->password_file, value);
	if (strcmp(name, "insecure"))
		return -EINVAL;
	if (!value || !strcmp(value, "1") || !strcmp(value, "yes") || !strcmp(value, "true"))
		s->insecure = 1;
	else if (!strcmp(value, "0") || !strcmp(value, "no") || !strcmp(value, "false"))
		s->insecure = 0;
	else
		return -EINVAL;
	return 0;
}

void hkv_etcd_sec_free(struct hkv_etcd_sec *s)
{
	if (!s)
		return;
	hkv_free(s->cacert);
	hkv_free(s->cert);
	hkv_free(s->key);
	hkv_free(s->user);
	hkv_free(s->password_file);
	memset(s, 0, sizeof(*s));
}

int hkv_etcd_sec_copy(struct hkv_etcd_sec *dst, const struct hkv_etcd_sec *src)
{
	const char *names[] = {"cacert", "cert", "key", "user", "password-file"};
	const char *vals[] = {src->cacert, src->cert, src->key, src->user, src->password_file};

	hkv_etcd_sec_free(dst);
	for (int i = 0; i < 5; i++)
		if (vals[i] && hkv_etcd_sec_set(dst, names[i], vals[i])) {
			hkv_etcd_sec_free(dst);
			return -ENOMEM;
		}
	dst->insecure = src->insecure;
	return 0;
}

void hkv_etcd_sec_argv(const struct hkv_etcd_sec *s, const char **argv, int *argc)
{
	const char *opts[] = {"--etcd-cacert", "--etcd-cert", "--etcd-key", "--etcd-user",
			      "--etcd-password-file"};
	const char *vals[] = {s->cacert, s->cert, s->key, s->user, s->password_file};

	for (int i = 0; i < 5; i++)
		if (vals[i]) {
			argv[(*argc)++] = opts[i];
			argv[(*argc)++] = vals[i];
		}
	if (s->insecure)
		argv[(*argc)++] = "--etcd-insecure";
}

int hkv_etcd_sec_opt(struct hkv_etcd_sec *s, int opt, const char *arg)
{
	static const char *const names[] = {"cacert", "cert", "key", "user", "password-file",
					    "insecure"};
	int i = opt - HKV_ETCD_OPT_BASE;

	if (i < 0 || i > 5)
		return 0;
	return hkv_etcd_sec_set(s, names[i], i == 5 ? NULL : arg) ? -EINVAL : 1;
}

/* The password: the file's first line (without its newline), never empty. */
static int read_password(const char *path, char **out)
{
	char buf[512];
	struct stat st;
	size_t n;
	FILE *f = fopen(path, "re");

	if (!f) {
		int err = errno;

		hkv_err("etcd: cannot read the password file %s: %s", path, strerror(err));
		return -err;
	}
	if (!fstat(fileno(f), &st) && (st.st_mode & 0044))
		hkv_warn("etcd: the password file %s can be read by others (chmod 600 it)", path);
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	n = strcspn(buf, "\r\n");
	buf[n] = 0;
	if (!n) {
		hkv_err("etcd: the password file %s has no password on its first line", path);
		return -EINVAL;
	}
	*out = hkv_strdup(buf);
	sodium_memzero(buf, sizeof(buf));
	return *out ? 0 : -ENOMEM;
}

/* OpenSSL's last error as text, for a line naming what failed. */
static const char *ssl_err_text(char *buf, size_t cap)
{
	unsigned long err = ERR_peek_last_error();

	if (!err)
		return "no detail";
	ERR_error_string_n(err, buf, cap);
	ERR_clear_error();
	return buf;
}

/* The client side of TLS: etcd's certificate verified against the CA
 * (host name or IP checked per connection, conn_new), TLS 1.2 or later, a
 * client certificate if given. NULL and -errno with a line naming the file. */
static SSL_CTX *tls_ctx(const struct hkv_etcd_sec *s, int *rc)
{
	const char *key = s->key ? s->key : s->cert;
	char why[256];
	SSL_CTX *ctx;

	*rc = -EINVAL;
	if ((s->cert == NULL) != (s->key == NULL) && !s->cert) {
		hkv_err("etcd: --etcd-key needs --etcd-cert");
		return NULL;
	}
	for (const char *f = s->cacert; f; f = f == s->cacert ? s->cert : f == s->cert ? key : NULL)
		if (access(f, R_OK)) {
			*rc = -errno;
			hkv_err("etcd: cannot read %s: %s", f, strerror(errno));
			return NULL;
		}
	if (!(ctx = SSL_CTX_new(TLS_client_method()))) {
		*rc = -ENOMEM;
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	if (SSL_CTX_load_verify_locations(ctx, s->cacert, NULL) != 1) {
		hkv_err("etcd: %s is not a PEM CA certificate: %s", s->cacert,
			ssl_err_text(why, sizeof(why)));
		goto free_ctx;
	}
	if (s->cert && (SSL_CTX_use_certificate_chain_file(ctx, s->cert) != 1 ||
			SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
			SSL_CTX_check_private_key(ctx) != 1)) {
		hkv_err("etcd: client certificate %s with key %s: %s", s->cert, key,
			ssl_err_text(why, sizeof(why)));
		goto free_ctx;
	}
	return ctx;

free_ctx:
	SSL_CTX_free(ctx);
	return NULL;
}

/* ---- credentials that change live ---- */

/*
 * Issue 30 (SIGHUP re-reads credentials and certificates): the handles
 * opened with the same files and user share one entry, which holds the TLS
 * context built from the files and the password read from its file, as
 * last loaded. The first open loads them; later opens take the entry's;
 * hkv_etcd_reload() loads them again and bumps gen, and each handle takes
 * the new context and password at the start of its next call
 * (creds_refresh; a handle is used by one thread at a time, so only that
 * thread touches its copies). OpenSSL counts an SSL_CTX's references: the
 * entry holds one, each handle one, each connection (SSL_new) one, so the
 * old context goes with the last connection that uses it. Entries live as
 * long as the process (one per set of files: a handful).
 */
struct etcd_creds {
	struct etcd_creds *next;
	struct hkv_etcd_sec opened; /* the files and user handles were opened with */
	SSL_CTX *tls;               /* (creds_lock) NULL: plain HTTP */
	char *user, *password;      /* (creds_lock) NULL: no etcd authentication */
	unsigned char tls_sum[32];  /* the TLS files' bytes as loaded: a change? */
	atomic_uint gen;            /* bumped by a reload that changed something */
};
static struct etcd_creds *creds_list;
static pthread_mutex_t creds_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_str(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

static int same_files(const struct hkv_etcd_sec *a, const struct hkv_etcd_sec *b)
{
	return same_str(a->cacert, b->cacert) && same_str(a->cert, b->cert) &&
	       same_str(a->key, b->key) && same_str(a->user, b->user) &&
	       same_str(a->password_file, b->password_file);
}

/* A hash of the bytes of the CA, certificate and key files s names. */
static void tls_files_sum(const struct hkv_etcd_sec *s, unsigned char out[32])
{
	const char *files[3] = {s->cacert, s->cert, s->key ? s->key : s->cert};
	crypto_generichash_state st;
	unsigned char buf[4096];
	size_t n;

	crypto_generichash_init(&st, NULL, 0, 32);
	for (int i = 0; i < 3; i++) {
		FILE *f = files[i] ? fopen(files[i], "re") : NULL;

		while (f && (n = fread(buf, 1, sizeof(buf), f)) > 0)
			crypto_generichash_update(&st, buf, n);
		if (f)
			fclose(f);
		crypto_generichash_update(&st, (const unsigned char *)"", 1); /* (a boundary) */
	}
	crypto_generichash_final(&st, out, 32);
	sodium_memzero(buf, sizeof(buf)); /* (a private key went through it) */
}

static void password_free(char **p)
{
	if (*p) {
		sodium_memzero(*p, strlen(*p));
		hkv_free(*p);
		*p = NULL;
	}
}

static void creds_free(struct etcd_creds *c)
{
	if (c->tls)
		SSL_CTX_free(c->tls);
	password_free(&c->password);
	hkv_free(c->user);
	hkv_etcd_sec_free(&c->opened);
	hkv_free(c);
}

/* The entry for s's files (creds_lock held), loaded now if there is none;
 * NULL and *rc with a line naming the file that failed. */
static struct etcd_creds *creds_get(const struct hkv_etcd_sec *s, int *rc)
{
	struct etcd_creds *c;

	for (c = creds_list; c; c = c->next)
		if (same_files(&c->opened, s))
			return c;
	*rc = -ENOMEM;
	if (!(c = hkv_calloc(1, sizeof(*c))) || hkv_etcd_sec_copy(&c->opened, s))
		goto free_creds;
	if (s->cacert) {
		if (!(c->tls = tls_ctx(s, rc)))
			goto free_creds;
		tls_files_sum(s, c->tls_sum);
	}
	if (s->user && ((*rc = -ENOMEM, !(c->user = hkv_strdup(s->user))) ||
			(*rc = read_password(s->password_file, &c->password))))
		goto free_creds;
	c->next = creds_list;
	creds_list = c;
	return c;

free_creds:
	if (c)
		creds_free(c);
	return NULL;
}

/* e takes c's context, user and password (creds_lock held). 0 or -ENOMEM
 * (then e keeps what it had and tries again at its next call). */
static int creds_take(struct hkv_etcd *e, struct etcd_creds *c)
{
	char *user = NULL, *password = NULL;

	if (c->user && (!(user = hkv_strdup(c->user)) || !(password = hkv_strdup(c->password)))) {
		hkv_free(user);
		return -ENOMEM;
	}
	if (e->tls != c->tls) {
		SSL_CTX_up_ref(c->tls);
		if (e->tls)
			SSL_CTX_free(e->tls); /* (its connections hold their own reference) */
		e->tls = c->tls;
	}
	hkv_free(e->user);
	password_free(&e->password);
	e->user = user;
	e->password = password;
	e->creds_gen = atomic_load(&c->gen);
	return 0;
}

/* At the start of each call: what a reload changed since e's last call. */
static void creds_refresh(struct hkv_etcd *e)
{
	if (!e->creds || atomic_load(&e->creds->gen) == e->creds_gen)
		return;
	pthread_mutex_lock(&creds_lock);
	creds_take(e, e->creds);
	pthread_mutex_unlock(&creds_lock);
}

/* The TLS part of a reload (creds_lock held): 1 changed, 0 not, <0 kept
 * the context in use (a line says why). */
static int reload_tls(struct etcd_creds *c, const struct hkv_etcd_sec *now)
{
	unsigned char sum[32];
	SSL_CTX *ctx;
	int rc;

	if (!c->opened.cacert != !now->cacert) {
		hkv_warn("etcd: SIGHUP: turning TLS to etcd %s needs a restart; keeping it %s",
			 now->cacert ? "on" : "off", now->cacert ? "off" : "on");
		return -EINVAL;
	}
	if (!c->tls)
		return 0;
	if (!(ctx = tls_ctx(now, &rc))) {
		hkv_err("etcd: SIGHUP: the TLS files did not load (the line before says which "
			"and why): new connections keep the TLS context in use");
		return rc;
	}
	tls_files_sum(now, sum);
	if (!sodium_memcmp(sum, c->tls_sum, sizeof(sum))) {
		SSL_CTX_free(ctx);
		return 0;
	}
	SSL_CTX_free(c->tls); /* (the handles' and connections' references stay) */
	c->tls = ctx;
	memcpy(c->tls_sum, sum, sizeof(sum));
	return 1;
}

/* The user and password part (creds_lock held): as reload_tls. */
static int reload_password(struct etcd_creds *c, const struct hkv_etcd_sec *now)
{
	char *password = NULL, *user;
	int rc;

	if (!c->opened.user != !now->user) {
		hkv_warn("etcd: SIGHUP: %s an etcd user needs a restart; keeping %s",
			 now->user ? "adding" : "dropping", c->user ? c->user : "none");
		return -EINVAL;
	}
	if (!c->user)
		return 0;
	if (!now->password_file) {
		hkv_err("etcd: SIGHUP: --etcd-user %s without --etcd-password-file; keeping the "
			"password in use", now->user);
		return -EINVAL;
	}
	if ((rc = read_password(now->password_file, &password))) {
		hkv_err("etcd: SIGHUP: keeping the password in use for %s", c->user);
		return rc;
	}
	if (!strcmp(c->user, now->user) && !strcmp(c->password, password)) {
		password_free(&password);
		return 0;
	}
	if (!(user = hkv_strdup(now->user))) {
		password_free(&password);
		return -ENOMEM;
	}
	hkv_free(c->user);
	password_free(&c->password);
	c->user = user;
	c->password = password;
	return 1;
}

static const char *reload_said(int r)
{
	return r > 0 ? "changed" : !r ? "unchanged" : "kept (see above)";
}

int hkv_etcd_reload(const struct hkv_etcd_sec *opened, const struct hkv_etcd_sec *now,
		    char *what, size_t cap)
{
	struct etcd_creds *c;
	int tls = 0, pw = 0;

	if (!opened->cacert && !opened->user) {
		snprintf(what, cap, "etcd: no TLS, no user");
		return 0;
	}
	pthread_mutex_lock(&creds_lock);
	for (c = creds_list; c && !same_files(&c->opened, opened); c = c->next)
		;
	if (c) {
		tls = reload_tls(c, now);
		pw = reload_password(c, now);
		if (tls > 0 || pw > 0)
			atomic_fetch_add(&c->gen, 1);
	}
	pthread_mutex_unlock(&creds_lock);
	if (!c) {
		snprintf(what, cap, "etcd: not connected yet");
		return 0;
	}
	snprintf(what, cap, "etcd TLS files %s, etcd password %s",
		 opened->cacert ? reload_said(tls) : "(none)",
		 opened->user ? reload_said(pw) : "(none)");
	return tls < 0 ? tls : pw < 0 ? pw : 0;
}

struct hkv_etcd *hkv_etcd_open_sec(const char *uri, const struct hkv_etcd_sec *s, int timeout_ms)
{
	static atomic_int warned;
	struct hkv_etcd *e;
	int rc = -EINVAL;

	if (timeout_ms <= 0) {
		errno = EINVAL;
		return NULL;
	}
	if (s && !s->insecure && (!s->cacert || !s->user)) {
		hkv_err("etcd: %s without %s: whoever reaches etcd could read and rewrite the "
			"cluster; give --etcd-cacert and --etcd-user/--etcd-password-file "
			"(docs/operating.md, \"etcd with TLS and roles\"), or --etcd-insecure to "
			"run so anyway", uri ? uri : "(no URI)",
			!s->cacert && !s->user ? "TLS and a user" : !s->cacert ? "TLS" : "a user");
		errno = EPERM;
		return NULL;
	}
	if (s && s->user && !s->password_file) {
		hkv_err("etcd: --etcd-user %s needs --etcd-password-file", s->user);
		errno = EINVAL;
		return NULL;
	}
	if (!(e = hkv_calloc(1, sizeof(*e)))) {
		errno = ENOMEM;
		return NULL;
	}
	e->token_ep = -1;
	if (parse_endpoints(uri, e))
		goto free_handle;
	e->timeout_ms = timeout_ms;
	if (s && (s->cacert || s->user)) {
		pthread_mutex_lock(&creds_lock);
		if ((e->creds = creds_get(s, &rc)))
			rc = creds_take(e, e->creds);
		pthread_mutex_unlock(&creds_lock);
		if (!e->creds || rc)
			goto free_handle;
	}
	if (s && s->insecure && (!s->cacert || !s->user) && !atomic_exchange(&warned, 1))
		hkv_warn("etcd: talking to %s without %s (--etcd-insecure): whoever reaches etcd "
			 "can read and rewrite the cluster", uri,
			 !s->cacert && !s->user ? "TLS and a user" : !s->cacert ? "TLS" : "a user");
	rc = -ENOMEM;
	if (!(e->base = event_base_new()))
		goto free_handle;
	return e;

free_handle:
	hkv_etcd_close(e);
	errno = -rc;
	return NULL;
}

struct hkv_etcd *hkv_etcd_open(const char *uri, int timeout_ms)
{
	return hkv_etcd_open_sec(uri, NULL, timeout_ms);
}

void hkv_etcd_close(struct hkv_etcd *e)
{
	if (!e)
		return;
	if (e->base)
		event_base_free(e->base);
	if (e->tls)
		SSL_CTX_free(e->tls);
	password_free(&e->password);
	hkv_free(e->user);
	sodium_memzero(e->token, sizeof(e->token));
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

/* TLS puts a request's headers and body in records of their own: without
 * this, Nagle holds the second until the first is acked (a delayed ACK, 40
 * ms on Linux) on every call. */
static void nodelay(evutil_socket_t fd)
{
	int one = 1;

	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* A TLS bufferevent for the current endpoint: SNI and the certificate's
 * host name, or its IP address, checked against what the URI names. */
static struct bufferevent *tls_bev(struct hkv_etcd *e)
{
	const char *host = e->ep[e->cur].host;
	unsigned char addr[16];
	struct bufferevent *bev;
	SSL *ssl = SSL_new(e->tls);
	int ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;

	if (!ssl)
		return NULL;
	if (ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1
	       : SSL_set_tlsext_host_name(ssl, host) != 1 || SSL_set1_host(ssl, host) != 1) {
		SSL_free(ssl);
		return NULL;
	}
	bev = bufferevent_openssl_socket_new(e->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
					     BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	if (!bev) {
		SSL_free(ssl);
		return NULL;
	}
	/* "Connection: close": etcd may close without a TLS close_notify */
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	return bev;
}

/* A connection whose own idle timeout is a second past the call's deadline,
 * so the deadline timer decides; no reconnect attempts (a refusal is final). */
static struct evhttp_connection *conn_new(struct hkv_etcd *e, struct etcd_call *c, int timeout_ms)
{
	struct evhttp_connection *conn;
	struct timeval tv = ms_tv(timeout_ms > INT_MAX - 1000 ? INT_MAX : timeout_ms + 1000);

	c->bev = NULL;
	if (e->tls) {
		if (!(c->bev = tls_bev(e)))
			return NULL;
		conn = evhttp_connection_base_bufferevent_new(e->base, NULL, c->bev,
							      e->ep[e->cur].host,
							      (ev_uint16_t)e->ep[e->cur].port);
		if (!conn)
			bufferevent_free(c->bev);
	} else {
		conn = evhttp_connection_base_new(e->base, NULL, e->ep[e->cur].host,
						  (ev_uint16_t)e->ep[e->cur].port);
	}
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

/* After a failure on a TLS connection: did OpenSSL fail (the certificate's
 * verification, or an error the bufferevent kept)? 1 and c->why if so. */
static int tls_failed(struct etcd_call *c)
{
	unsigned long err, last = 0;
	char buf[160];
	SSL *ssl;
	long vr;

	if (!c->bev)
		return 0;
	while ((err = bufferevent_get_openssl_error(c->bev)))
		last = err;
	ssl = bufferevent_openssl_get_ssl(c->bev);
	if (ssl && (vr = SSL_get_verify_result(ssl)) != X509_V_OK) {
		snprintf(c->why, sizeof(c->why), "TLS: etcd's certificate does not verify: %s",
			 X509_verify_cert_error_string(vr));
		return 1;
	}
	if (!last)
		return 0;
	if (!ERR_reason_error_string(last)) { /* (libevent's SSL_ERROR_SYSCALL, ...) */
		snprintf(c->why, sizeof(c->why), "TLS: the handshake broke off (does etcd "
			 "serve TLS on this port?)");
		return 1;
	}
	ERR_error_string_n(last, buf, sizeof(buf));
	snprintf(c->why, sizeof(c->why), "TLS: %s", buf);
	return 1;
}

static void call_done(struct evhttp_request *req, void *arg)
{
	struct etcd_call *c = arg;

	if (c->done)
		return;
	if (!req || !(c->status = evhttp_request_get_response_code(req))) {
		call_finish(c, c->http_timeout  ? -ETIMEDOUT
		               : tls_failed(c)  ? -EIO /* (to evhttp, a failed connect) */
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
	c->heard = 1;
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
	    (!c->no_auth && e->token[0] && evhttp_add_header(hdrs, "Authorization", e->token)) ||
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

static long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* POST body to path on a new connection to the current endpoint; run the
 * loop until the call is done or timeout_ms passes. 0 (then see c->status,
 * c->body) or -errno. With several endpoints: see struct hkv_etcd. */
static int call_run(struct hkv_etcd *e, const char *path, const char *body, size_t len,
                    struct etcd_call *c, int timeout_ms)
{
	long end = mono_ms() + timeout_ms;
	int rc = 0;

	for (int tried = 0; tried < e->nep; tried++) {
		struct etcd_call fresh = *c; /* (untouched: a refusal changed nothing) */
		long left = end - mono_ms();
		/* a read leaves the endpoints after this one their shares */
		int share = c->resend ? (int)(left / (e->nep - tried)) : (int)left;

		if (tried && left <= 0)
			return rc;
		rc = call_run_once(e, path, body, len, c, share > 0 ? share : 1);
		if (e->nep == 1)
			return rc;
		if (rc == -ECONNREFUSED || (rc == -EIO && ep_refuses(&e->ep[e->cur]))) {
			/* refused (evhttp says -EIO for that too): nothing was
			 * sent, so the next endpoint, now */
			e->cur = (e->cur + 1) % e->nep;
			*c = fresh;
			continue;
		}
		/* (a watch's timeout after etcd answered is its "no change") */
		if ((rc == -ETIMEDOUT && !c->heard) || rc == -EIO || (!rc && c->status == 503))
			e->cur = (e->cur + 1) % e->nep; /* the next call goes elsewhere */
		if (c->resend && (rc == -ETIMEDOUT || rc == -EIO)) {
			evbuffer_drain(c->body, evbuffer_get_length(c->body));
			*c = fresh; /* a read: the next endpoint, within the deadline */
			continue;
		}
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

	if (!(conn = conn_new(e, c, timeout_ms)))
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
	else if (c->bev) /* (connecting now) */
		nodelay(bufferevent_getfd(c->bev));
	while (!c->done)
		if (event_base_loop(e->base, EVLOOP_ONCE) != 0)
			call_finish(c, -EIO);
	event_free(deadline);
	evhttp_connection_free(conn); /* and a request still in flight: cancelled */
	c->bev = NULL;                /* (it went with conn) */
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

/*
 * etcd's error object {"error":"...","code":N,"message":"..."}: N is a gRPC
 * status code; c->why keeps the message. Authentication's: Unauthenticated
 * (16, the token lapsed or is another member's) and "auth store is old"
 * give -EKEYEXPIRED, which call_auth() answers by authenticating again;
 * PermissionDenied (7) and "user name is empty" (no token sent to an etcd
 * with auth on) -EACCES; "authentication failed" -EKEYREJECTED.
 */
static int grpc_error(struct etcd_call *c, json_object *obj)
{
	json_object *code, *msg;
	const char *m = "";

	if (!json_object_object_get_ex(obj, "code", &code) && /* a stream's error says grpc_code */
	    !json_object_object_get_ex(obj, "grpc_code", &code))
		return -EPROTO;
	if (!json_object_is_type(code, json_type_int))
		return -EPROTO;
	if ((json_object_object_get_ex(obj, "message", &msg) ||
	     json_object_object_get_ex(obj, "error", &msg)) &&
	    json_object_is_type(msg, json_type_string))
		m = json_object_get_string(msg);
	snprintf(c->why, sizeof(c->why), "%s", m);
	if (strstr(m, "auth store is old"))
		return -EKEYEXPIRED;
	if (strstr(m, "user name is empty"))
		return -EACCES;
	if (strstr(m, "authentication failed"))
		return -EKEYREJECTED;
	switch (json_object_get_int(code)) {
	case 7: /* PermissionDenied */
		return -EACCES;
	case 16: /* Unauthenticated */
		return -EKEYEXPIRED;
	case 9: /* FailedPrecondition: "authentication is not enabled" */
		return strstr(m, "not enabled") ? -ENOTSUP : -EPROTO;
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

	if (body_json(c->body, &obj)) {
		if (c->status == 400 && !c->why[0]) /* Go's answer to HTTP on its TLS port */
			snprintf(c->why, sizeof(c->why), "HTTP 400 and no etcd error: "
				 "does etcd want TLS (--etcd-cacert)?");
		return -EPROTO;
	}
	rc = grpc_error(c, obj);
	json_object_put(obj);
	return rc;
}

/* ---- authentication ---- */

/*
 * Tokens shared by the handles of a process: one per (endpoint, user,
 * password), so that a client with many handles (hatchkv-memcached: two per
 * lane) authenticates once per endpoint, not once per handle - each
 * authenticate costs etcd a bcrypt. A token that lapses is dropped by the
 * first handle that hears so, and that handle fetches the next.
 */
#define TOKEN_CACHE 16
static struct {
	char ep[ETCD_HOST_MAX + 16];
	unsigned char who[32]; /* hash of user and password */
	char token[1024];
} token_cache[TOKEN_CACHE];
static unsigned token_next;
static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;

static void token_who(const struct hkv_etcd *e, unsigned char who[32])
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, (const unsigned char *)e->user, strlen(e->user) + 1);
	crypto_generichash_update(&st, (const unsigned char *)e->password, strlen(e->password));
	crypto_generichash_final(&st, who, 32);
}

/* A token for the current endpoint from the cache: 1 (now in e->token), or 0. */
static int token_cached(struct hkv_etcd *e)
{
	unsigned char who[32];
	int found = 0;

	token_who(e, who);
	pthread_mutex_lock(&token_lock);
	for (int i = 0; i < TOKEN_CACHE && !found; i++)
		if (token_cache[i].token[0] && !strcmp(token_cache[i].ep, e->ep[e->cur].host_hdr) &&
		    !sodium_memcmp(token_cache[i].who, who, 32)) {
			memcpy(e->token, token_cache[i].token, sizeof(e->token));
			e->token_ep = e->cur;
			found = 1;
		}
	pthread_mutex_unlock(&token_lock);
	return found;
}

/* Keep e's token for its endpoint (token non-NULL), or drop it (NULL). */
static void token_keep(struct hkv_etcd *e, int ep, const char *token)
{
	unsigned char who[32];
	int slot = -1;

	token_who(e, who);
	pthread_mutex_lock(&token_lock);
	for (int i = 0; i < TOKEN_CACHE && slot < 0; i++)
		if (!strcmp(token_cache[i].ep, e->ep[ep].host_hdr) &&
		    !sodium_memcmp(token_cache[i].who, who, 32))
			slot = i;
	if (!token) {
		if (slot >= 0 && !strcmp(token_cache[slot].token, e->token))
			token_cache[slot].token[0] = 0; /* (unless another replaced it) */
	} else {
		if (slot < 0)
			slot = (int)(token_next++ % TOKEN_CACHE);
		snprintf(token_cache[slot].ep, sizeof(token_cache[slot].ep), "%s",
			 e->ep[ep].host_hdr);
		memcpy(token_cache[slot].who, who, 32);
		snprintf(token_cache[slot].token, sizeof(token_cache[slot].token), "%s", token);
	}
	pthread_mutex_unlock(&token_lock);
}

/* A line for a failure the operator must fix (credentials, roles, TLS),
 * in etcd's or OpenSSL's words; at most one a second per handle. */
static void call_log(struct hkv_etcd *e, const char *path, const struct etcd_call *c, int rc)
{
	const char *hint = rc == -EACCES && strstr(c->why, "permission denied")
				   ? " (the etcd user's role may not do this)"
			   : rc == -EKEYREJECTED ? " (check --etcd-user and --etcd-password-file)"
						 : "";

	if (!rc) {
		e->answered = 1;
		return;
	}
	if (rc == -EIO && !c->why[0] && !e->tls && !e->answered)
		hint = " (nothing has answered yet: does etcd want TLS? --etcd-cacert)";
	else if (rc != -EACCES && rc != -EKEYREJECTED && !((rc == -EIO || rc == -EPROTO) && c->why[0]))
		return;
	hkv_log_limited(&e->log_limit, HKV_LOG_ERROR, "etcd at %s%s%s (%s): %s%s",
			e->ep[e->cur].host_hdr, e->user ? " as " : "", e->user ? e->user : "", path,
			c->why[0] ? c->why : "the connection failed", hint);
}

/* POST /v3/auth/authenticate with the user and password; the token it
 * gives is for the endpoint that answered. An etcd with its authentication
 * off is refused (-EACCES) even when insecure is allowed: a user was given,
 * so the operator meant etcd to check it (`etcdctl auth enable` forgotten). */
static int authenticate(struct hkv_etcd *e, int timeout_ms)
{
	struct etcd_call c = {.no_auth = 1};
	json_object *req = json_object_new_object(), *reply = NULL, *tok;
	const char *s;
	size_t len;
	int rc = -ENOMEM;

	e->token[0] = 0;
	e->token_ep = -1;
	if (!req || json_add(req, "name", json_object_new_string(e->user)) ||
	    json_add(req, "password", json_object_new_string(e->password)) ||
	    !(s = json_object_to_json_string_length(req, JSON_OUT, &len)) ||
	    !(c.body = evbuffer_new()))
		goto put_req;
	rc = call_run(e, "/v3/auth/authenticate", s, len, &c, timeout_ms);
	if (!rc)
		rc = c.status == 200 ? body_json(c.body, &reply) : reply_error(&c);
	if (rc == -ENOTSUP) {
		snprintf(c.why, sizeof(c.why), "etcd's authentication is off (etcdctl auth "
			 "enable; scripts/etcd-roles): anyone who reaches it owns the cluster");
		rc = -EACCES;
	} else if (!rc) {
		if (!json_object_object_get_ex(reply, "token", &tok) ||
		    !json_object_is_type(tok, json_type_string) ||
		    (size_t)json_object_get_string_len(tok) >= sizeof(e->token) ||
		    !json_object_get_string_len(tok)) {
			rc = -EPROTO;
		} else {
			snprintf(e->token, sizeof(e->token), "%s", json_object_get_string(tok));
			e->token_ep = e->cur;
			token_keep(e, e->cur, e->token);
		}
	}
	if (rc == -EKEYEXPIRED)
		rc = -EKEYREJECTED;
	call_log(e, "/v3/auth/authenticate", &c, rc);
	json_object_put(reply);
	if (c.body)
		evbuffer_free(c.body);
put_req:
	json_object_put(req);
	return rc;
}

/* The token e used is no good (lapsed, or another member's): forget it,
 * here and in the process's cache, and make c ready to be sent again. */
static void token_lapsed(struct hkv_etcd *e, struct etcd_call *c)
{
	if (e->token_ep >= 0)
		token_keep(e, e->token_ep, NULL);
	e->token_ep = -1;
	evbuffer_drain(c->body, evbuffer_get_length(c->body));
	if (c->tok)
		json_tokener_reset(c->tok);
	c->status = c->err = c->done = c->http_failed = c->http_timeout = 0;
	c->why[0] = 0;
}

/*
 * call_run() as the handle's user: authenticate first if there is no token
 * for the current endpoint (the first call, or a call_run that moved to
 * another endpoint), and once more if etcd says the token lapsed, then
 * resend. A request etcd refused for its token was not applied, so sending
 * it again is safe even for a txn. Returns as call_run(); an error reply of
 * a unary call stays in c for the caller.
 */
static int call_auth(struct hkv_etcd *e, const char *path, const char *body, size_t len,
		     struct etcd_call *c, int timeout_ms)
{
	int rc;

	creds_refresh(e); /* (a SIGHUP's new TLS files and password) */
	for (int again = 0;; again++) {
		if (e->user && e->token_ep != e->cur && !token_cached(e) &&
		    (rc = authenticate(e, timeout_ms)))
			return rc;
		rc = call_run(e, path, body, len, c, timeout_ms);
		if (!rc && c->status != 200 && c->tok == NULL) {
			/* a unary error reply: was it the token? */
			int err = reply_error(c);

			if (err != -EKEYEXPIRED || !e->user || again) {
				call_log(e, path, c, err);
				return 0;
			}
		} else if (rc != -EKEYEXPIRED || !e->user || again) {
			call_log(e, path, c, rc);
			return rc;
		}
		token_lapsed(e, c); /* lapsed, or another member's: a new one */
	}
}

/* ---- unary calls ---- */

/* POST req (consumed) to path; *reply is the 200 reply's object
 * (json_object_put it). resend: req only reads (or renews a lease), so it
 * may be sent again to the next endpoint within the deadline. */
static int etcd_call(struct hkv_etcd *e, const char *path, json_object *req, int resend,
		     json_object **reply)
{
	struct etcd_call c = {.resend = resend};
	const char *s;
	size_t len;
	int rc = -ENOMEM;

	*reply = NULL;
	if (!(s = json_object_to_json_string_length(req, JSON_OUT, &len)))
		goto put_req;
	if (!(c.body = evbuffer_new()))
		goto put_req;
	for (int again = 0;; again++) {
		json_object *err;

		rc = call_auth(e, path, s, len, &c, e->timeout_ms);
		if (!rc)
			rc = c.status == 200 ? body_json(c.body, reply) : reply_error(&c);
		/* a stream's one object (a keepalive) may be an error with 200 */
		if (rc || !e->user || again || json_child(*reply, "result") ||
		    !(err = json_child(*reply, "error")) || grpc_error(&c, err) != -EKEYEXPIRED)
			break;
		json_object_put(*reply);
		*reply = NULL;
		token_lapsed(e, &c); /* the token lapsed: a new one, and once more */
	}
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
	if ((rc = etcd_call(e, "/v3/kv/range", req, 1, &reply)))
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
	if ((rc = etcd_call(e, "/v3/kv/put", req, 0, &reply)))
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
	if ((rc = etcd_call(e, "/v3/kv/deleterange", req, 0, &reply)))
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
	if ((rc = etcd_call(e, "/v3/kv/txn", req, 0, reply)))
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
	if ((rc = etcd_call(e, "/v3/lease/grant", req, 0, &reply)))
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
	if ((rc = etcd_call(e, "/v3/lease/keepalive", req, 1, &reply)))
		return rc;
	if (!(res = json_child(reply, "result")))
		rc = json_child(reply, "error") ? grpc_error(&(struct etcd_call){0}, json_child(reply, "error")) : -EPROTO;
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
	if ((rc = etcd_call(e, "/v3/lease/revoke", req, 0, &reply)))
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
		return json_child(obj, "error") ? grpc_error(c, json_child(obj, "error")) : -EPROTO;
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
	rc = call_auth(e, "/v3/watch", s, len, &c, timeout_ms);
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
