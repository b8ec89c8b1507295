/*
 * connect.c - opening and closing a handle:
 *   1. control plane (TCP or unix socket): AUTH with the token, get WELCOME
 *      (client id, one-time ticket, data endpoint);
 *   2. data plane: transport connection whose hello redeems the ticket; its
 *      accept carries the region's address and rkey;
 *   3. one RDMA Read of the region header, validated (magic, sum, version,
 *      sizes) before anything else is trusted;
 *   4. the registered scratch arena, location cache and allocator.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sodium.h>

#include "client/client_int.h"
#include "client/replica.h"
#include "common/cache_policy.h"
#include "common/ctl_auth.h"
#include "common/ctl_proto.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/token.h"
#include "common/transport_int.h"

struct endpoint {
	enum hkv_transport_kind kind;
	char host[256], port[16], path[108];
	long trust_uid; /* shm: the server's uid besides ours and root's (the token file's owner) */
};

/* What a handle needs to connect again, copied at hkv_open (the config may
 * be freed while the handle lives). */
struct hkv_origin {
	struct endpoint ep;
	char token[HKV_TOKEN_MAX + 1];
	int timeout_ms;
	size_t max_value;
};

static int parse_uri(const char *uri, struct endpoint *ep)
{
	const char *colon;

	memset(ep, 0, sizeof(*ep));
	if (!strncmp(uri, "shm:", 4)) {
		ep->kind = HKV_TRANSPORT_SHM;
		if (strlen(uri + 4) >= sizeof(ep->path) || !uri[4])
			return -EINVAL;
		strcpy(ep->path, uri + 4);
		return 0;
	}
	if (strncmp(uri, "verbs://", 8))
		return -EINVAL;
	ep->kind = HKV_TRANSPORT_VERBS;
	uri += 8;
	colon = strrchr(uri, ':');
	if (!colon || colon == uri || (size_t)(colon - uri) >= sizeof(ep->host) ||
	    strlen(colon + 1) >= sizeof(ep->port) || !colon[1])
		return -EINVAL;
	memcpy(ep->host, uri, (size_t)(colon - uri));
	strcpy(ep->port, colon + 1);
	return 0;
}

static int wait_fd(int fd, short events, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = events};
	int n = poll(&p, 1, timeout_ms);

	return n > 0 ? 0 : n == 0 ? HKV_ETIMEDOUT : -errno;
}

static int ctl_socket(const struct endpoint *ep, int timeout_ms)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	int fd, ret = 0, err = 0;
	socklen_t elen = sizeof(err);

	if (ep->kind == HKV_TRANSPORT_SHM) {
		strcpy(sun.sun_path, ep->path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
			ret = -errno;
			close(fd);
			return ret;
		}
		{ /* the token goes only to the server's process (not to a squatter) */
			unsigned peer = 0;

			if (!hkv_peer_trusted(fd, ep->trust_uid, &peer)) {
				hkv_warn("client: %s is served by uid %u, neither ours, root's nor "
					 "the token file owner's: not sending the token", ep->path,
					 peer);
				close(fd);
				return HKV_EAUTH;
			}
		}
		return fd;
	}
	if (getaddrinfo(ep->host, ep->port, &hints, &ai))
		return -EHOSTUNREACH;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		freeaddrinfo(ai);
		return -errno;
	}
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)
		ret = -errno;
	freeaddrinfo(ai);
	if (!ret)
		ret = wait_fd(fd, POLLOUT, timeout_ms);
	if (!ret && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) || err))
		ret = -err;
	if (!ret)
		ret = fcntl(fd, F_SETFL, 0) ? -errno : 0;
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n;
		int ret = wait_fd(fd, POLLIN, timeout_ms);

		if (ret)
			return ret;
		n = read(fd, p, len);
		if (n <= 0)
			return n < 0 ? -errno : HKV_EDISCONNECTED;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Send one control message (header + body) in one send, never SIGPIPE: a
 * server that went away mid-request is an error for this call, not a
 * signal that kills the application. */
static int ctl_send(int fd, uint16_t type, const void *body, uint32_t len)
{
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = type, .len = len};
	uint8_t req[sizeof(h) + HKV_CTL_BODY_MAX];

	if (len > HKV_CTL_BODY_MAX)
		return -EINVAL;
	memcpy(req, &h, sizeof(h));
	memcpy(req + sizeof(h), body, len);
	if (send(fd, req, sizeof(h) + len, MSG_NOSIGNAL) != (ssize_t)(sizeof(h) + len))
		return errno == EPIPE || errno == ECONNRESET ? HKV_EDISCONNECTED : -errno;
	return 0;
}

/* Read one reply: of type `want` and exactly out_len bytes into out; an
 * ERROR reply returns its status (the message goes to the debug log). */
static int ctl_recv(int fd, int timeout_ms, uint16_t want, void *out, uint32_t out_len)
{
	struct hkv_ctl_hdr h;
	char msg[HKV_CTL_BODY_MAX + 1];
	int ret = read_full(fd, &h, sizeof(h), timeout_ms);

	if (ret)
		return ret;
	if (h.magic != HKV_CTL_MAGIC || h.version != HKV_CTL_VERSION || h.len > HKV_CTL_BODY_MAX)
		return HKV_EPROTO;
	if ((ret = read_full(fd, msg, h.len, timeout_ms)))
		return ret;
	if (h.type == HKV_CTL_ERROR) {
		msg[h.len] = 0;
		hkv_debug("client: server refused: %s", msg);
		return h.status < 0 ? h.status : HKV_EPROTO;
	}
	if (h.type != want || h.len != out_len)
		return HKV_EPROTO;
	memcpy(out, msg, out_len);
	return 0;
}

/* One control-plane request on a connection of its own (GRANT, CARVE). */
static int ctl_request(const struct endpoint *ep, uint16_t type, const void *body, uint32_t len,
		       int timeout_ms, uint16_t want, void *out, uint32_t out_len)
{
	int fd = ctl_socket(ep, timeout_ms), ret;

	if (fd < 0)
		return fd;
	ret = ctl_send(fd, type, body, len);
	if (!ret)
		ret = ctl_recv(fd, timeout_ms, want, out, out_len);
	close(fd);
	return ret;
}

/*
 * The control plane's authentication on a connected fd (common/ctl_proto.h):
 * HELLO, the server's CHALLENGE checked against our token (nothing more is
 * sent to a server that fails it: HKV_ESERVERAUTH), PROVE, and the sealed
 * WELCOME opened with the session key. Fills *w (ticket in clear).
 */
int hkv_ctl_handshake(int fd, const char *token, int timeout_ms, struct hkv_ctl_welcome *w,
		      uint8_t rk[32])
{
	size_t tlen = strlen(token);
	struct hkv_ctl_hello hello;
	struct hkv_ctl_challenge ch;
	struct hkv_ctl_prove pr;
	struct hkv_ctl_welcome_msg msg;
	uint8_t want[HKV_CTL_MAC_LEN], sk[HKV_CTL_MAC_LEN];
	int ret;

	randombytes_buf(hello.nonce_c, sizeof(hello.nonce_c));
	if ((ret = ctl_send(fd, HKV_CTL_HELLO, &hello, sizeof(hello))) ||
	    (ret = ctl_recv(fd, timeout_ms, HKV_CTL_CHALLENGE, &ch, sizeof(ch))))
		return ret;
	hkv_ctl_mac(want, token, tlen, "hatchkv server", hello.nonce_c, ch.nonce_s);
	if (!hkv_ctl_mac_equal(want, ch.proof_full) &&
	    !((ch.flags & HKV_CHALLENGE_F_RO) && hkv_ctl_mac_equal(want, ch.proof_ro)))
		return HKV_ESERVERAUTH;
	hkv_ctl_mac(pr.proof_c, token, tlen, "hatchkv client", hello.nonce_c, ch.nonce_s);
	if ((ret = ctl_send(fd, HKV_CTL_PROVE, &pr, sizeof(pr))) ||
	    (ret = ctl_recv(fd, timeout_ms, HKV_CTL_WELCOME, &msg, sizeof(msg))))
		return ret;
	hkv_ctl_mac(sk, token, tlen, "hatchkv session", hello.nonce_c, ch.nonce_s);
	ret = hkv_ctl_welcome_open(w, &msg, sk);
	if (!ret && rk)
		hkv_ctl_request_key(rk, sk);
	sodium_memzero(sk, sizeof(sk));
	if (ret)
		return HKV_ESERVERAUTH; /* altered on the way: nothing in it is used */
	w->data_endpoint[sizeof(w->data_endpoint) - 1] = 0;
	return 0;
}

/* Authenticate to the endpoint's server; fills the welcome or returns the refusal. */
static int ctl_auth(const struct endpoint *ep, const char *token, int timeout_ms,
		    struct hkv_ctl_welcome *w, uint8_t rk[32])
{
	int fd = ctl_socket(ep, timeout_ms), ret;

	if (fd < 0)
		return fd;
	ret = hkv_ctl_handshake(fd, token, timeout_ms, w, rk);
	close(fd);
	if (ret == HKV_ESERVERAUTH)
		hkv_warn_limited("client: the server at %s%s%s did not prove it holds our token: "
				 "not authenticating to it",
				 ep->kind == HKV_TRANSPORT_SHM ? ep->path : ep->host,
				 ep->kind == HKV_TRANSPORT_SHM ? "" : ":",
				 ep->kind == HKV_TRANSPORT_SHM ? "" : ep->port);
	return ret;
}

static int open_data(struct hkv_client *c, const struct endpoint *ep,
		     const struct hkv_ctl_welcome *w)
{
	struct hkv_data_hello hello = {.client_id = w->client_id};
	struct hkv_conn_cfg cc = {
		.kind = ep->kind,
		.host = ep->host,
		.port = w->data_endpoint,
		.path = w->data_endpoint,
		.hello = &hello,
		.hello_len = sizeof(hello),
		.timeout_ms = c->timeout_ms,
		.sq_depth = 1024, /* a multi-get round: 2 READs a cold key (~500 keys) */
		.trust_uid = ep->trust_uid,
	};

	if (w->transport != ep->kind)
		return HKV_EPROTO;
	memcpy(hello.ticket, w->ticket, HKV_TICKET_LEN);
	c->conn = hkv_conn_open(&cc, NULL, NULL);
	if (!c->conn)
		return -errno;
	c->client_id = w->client_id;
	c->readonly = !(hkv_conn_region(c->conn)->access & HKV_ACCESS_WRITE);
	c->windows = !!(hkv_conn_region(c->conn)->access & HKV_ACCESS_WINDOWS);
	c->base = hkv_conn_region(c->conn)->base;
	c->rkey = c->akey = hkv_conn_region(c->conn)->rkey;
	return 0;
}

static int grant(struct hkv_client *c, uint32_t seg, struct hkv_ctl_granted *out)
{
	struct hkv_ctl_grant g = {.client_id = c->client_id, .seg = seg};
	int ret;

	if (!c->windows)
		return -EOPNOTSUPP;
	for (uint64_t t0 = hkv_now_ns();;) {
		g.seq = ++c->req_seq; /* (each send a new one: the server keeps the last) */
		hkv_ctl_request_seal(&g, sizeof(g), HKV_CTL_GRANT, c->req_key);
		ret = ctl_request(&c->via->ep, HKV_CTL_GRANT, &g, sizeof(g), c->timeout_ms,
				  HKV_CTL_GRANTED, out, sizeof(*out));
		/* -EAGAIN: the server has not seen our connection established yet */
		if (ret != -EAGAIN || hkv_now_ns() - t0 > (uint64_t)c->timeout_ms * 1000000ull)
			break;
		usleep(2000);
	}
	if (!ret && (out->seg != seg || !out->rkey))
		ret = HKV_EPROTO;
	if (ret) {
		hkv_debug("client %u: grant of %s %u: %s", c->client_id,
			  seg == HKV_GRANT_BASE ? "base rights" : "segment", seg, hkv_strerror(ret));
		return ret;
	}
	c->stats.grants++;
	return 0;
}

int hkv_grant_base(struct hkv_client *c)
{
	struct hkv_ctl_granted out;
	int ret = grant(c, HKV_GRANT_BASE, &out);

	if (ret)
		return ret;
	if (!c->readonly && (!out.atomic_rkey || !out.write_rkey))
		return HKV_EPROTO;
	c->rkey = out.rkey;
	c->akey = out.atomic_rkey;
	c->wkey = out.write_rkey;
	if (!c->readonly)
		c->stats.grants += 2; /* the ATOMIC and WRITE windows */
	return 0;
}

int hkv_ctl_carve(struct hkv_client *c, uint32_t cls, uint64_t keep_off, uint32_t flags,
		  uint32_t *seg)
{
	struct hkv_ctl_carve req = {.client_id = c->client_id, .cls = cls, .keep_off = keep_off,
				    .flags = flags};
	struct hkv_ctl_carved out;
	int ret;

	if (!c->via)
		return HKV_EFULL;
	req.seq = ++c->req_seq;
	hkv_ctl_request_seal(&req, sizeof(req), HKV_CTL_CARVE, c->req_key);
	ret = ctl_request(&c->via->ep, HKV_CTL_CARVE, &req, sizeof(req), c->timeout_ms,
			  HKV_CTL_CARVED, &out, sizeof(out));
	if (!ret && (out.cls != cls || out.seg >= c->g.nsegs))
		ret = HKV_EPROTO;
	if (ret) {
		hkv_debug("client %u: carve for class %u: %s", c->client_id, cls, hkv_strerror(ret));
		return ret;
	}
	*seg = out.seg;
	return 0;
}

/*
 * READ the header; trust nothing in it until it validates and, when the
 * welcome names it, carries the server's sum. A writer can overwrite the
 * header (shm, verbs --no-windows); the server puts it back within
 * HKV_CLOCK_TICK_MS, so a bad read is read again, for up to ~200 ms.
 */
static int read_geometry(struct hkv_client *c, const struct hkv_ctl_welcome *w)
{
	struct hkv_geometry *g = hkv_aligned_alloc(64, sizeof(*g));
	struct hkv_mr *mr;
	struct hkv_wr wr;
	int ret;

	if (!g)
		return -ENOMEM;
	mr = hkv_conn_reg(c->conn, g, sizeof(*g));
	if (!mr) {
		hkv_free(g);
		return -errno;
	}
	for (int tries = 0;; tries++) {
		wr = (struct hkv_wr){.opcode = HKV_WR_READ, .local = g, .mr = mr,
				     .remote_addr = c->base, .rkey = c->rkey, .length = sizeof(*g)};
		ret = hkv_conn_exec(c->conn, &wr, 1);
		if (!ret)
			ret = hkv_geometry_check(g, hkv_conn_region(c->conn)->length);
		if (!ret && (w->flags & HKV_WELCOME_F_GEOM_SUM) && g->sum != w->geom_sum)
			ret = HKV_ECORRUPT; /* sealed by someone else */
		if (ret != HKV_ECORRUPT || tries == 40)
			break;
		usleep(5000);
	}
	if (!ret)
		c->g = *g;
	hkv_conn_dereg(c->conn, mr);
	hkv_free(g);
	return ret;
}

static int setup_arena(struct hkv_client *c, size_t max_value)
{
	const struct hkv_geometry *g = &c->g;
	int cls = hkv_class_for(g, (uint32_t)(HKV_BLOCK_HDR + HKV_MAX_KEY + max_value));
	size_t off = 0;

	c->max_block = cls < 0 ? g->class_size[g->nclasses - 1] : g->class_size[cls];
	c->max_value = c->max_block - HKV_BLOCK_HDR - HKV_MAX_KEY;
	if (c->max_value > max_value)
		c->max_value = max_value;
	c->value_cap = c->max_block - HKV_BLOCK_HDR - 1;
	if (c->value_cap > max_value)
		c->value_cap = max_value;
	c->read_cap = 2 * (size_t)c->max_block < (64u << 10) ? (64u << 10) : 2 * (size_t)c->max_block;
	/* the segment table, or up to 64 segments' bitmaps (one harvest chain) */
	c->scr_cap = (size_t)(g->nsegs < 64 ? g->nsegs : 64) * g->bitmap_bytes;
	if (c->scr_cap < (size_t)g->nsegs * 8)
		c->scr_cap = (size_t)g->nsegs * 8;
	c->arena_len = 4 * HKV_BUCKET_SIZE + 64 * 8 + c->read_cap + c->max_block + c->scr_cap;
	c->arena = hkv_aligned_alloc(4096, c->arena_len);
	if (!c->arena)
		return -ENOMEM;
	memset(c->arena, 0, c->arena_len);
	c->mr = hkv_conn_reg(c->conn, c->arena, c->arena_len);
	if (!c->mr)
		return -errno;
	c->bkt = c->arena + off;
	off += 4 * HKV_BUCKET_SIZE;
	c->atom = (uint64_t *)(c->arena + off);
	off += 64 * 8;
	c->rblk = c->arena + off;
	off += c->read_cap;
	c->wblk = c->arena + off;
	off += c->max_block;
	c->scr = c->arena + off;
	return 0;
}

/* The token; *owner = the token file's owner (the uid the server that made
 * it runs as), -1 when the token was given directly. */
static int load_token(const struct hkv_config *cfg, char *tok, size_t cap, long *owner)
{
	struct stat st;
	int ret;

	*owner = -1;
	if (cfg->token) {
		if (strlen(cfg->token) >= cap || strlen(cfg->token) < HKV_TOKEN_MIN)
			return HKV_EAUTH;
		strcpy(tok, cfg->token);
		return 0;
	}
	if (!cfg->token_file)
		return -EINVAL;
	if (!stat(cfg->token_file, &st))
		*owner = (long)st.st_uid;
	ret = hkv_token_load(cfg->token_file, tok, cap, 0);
	if (ret >= 0)
		return 0;
	/* say which file and what is wrong with it (a missing or unreadable
	 * file is that, not a refusal by a server: nothing was sent) */
	hkv_err("client: token file %s: %s", cfg->token_file,
		ret == HKV_EAUTH ? "not a token (16 to 256 printable characters)" : hkv_strerror(ret));
	return ret;
}

/* The config's location cache, made by its first handle (configs are
 * otherwise read-only after hkv_open; the cache is its one shared part). */
static int share_cache(const struct hkv_config *cfg_in, struct hkv_client *c)
{
	struct hkv_config *cfg = (struct hkv_config *)cfg_in;

	pthread_mutex_lock(&cfg->lock);
	if (!cfg->cache)
		cfg->cache = hkv_cache_new(cfg->cache_entries);
	c->cache = cfg->cache ? hkv_cache_ref(cfg->cache) : NULL;
	pthread_mutex_unlock(&cfg->lock);
	return c->cache ? 0 : -ENOMEM;
}

/* Connect a new handle to the origin's server, sharing `cache`. */
static int connect_client(const struct hkv_origin *o, struct hkv_cache *cache,
			  struct hkv_client **out)
{
	struct hkv_ctl_welcome w;
	struct hkv_client *c = hkv_calloc(1, sizeof(*c));
	int ret;

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->timeout_ms = o->timeout_ms;
	c->rng = hkv_now_ns() ^ (uint64_t)(uintptr_t)c;
	randombytes_buf(&c->wid_next, sizeof(c->wid_next)); /* write ids: see hkv_next_wid */
	c->cache = hkv_cache_ref(cache);
	c->via = o;
	ret = ctl_auth(&o->ep, o->token, o->timeout_ms, &w, c->req_key);
	if (!ret)
		ret = open_data(c, &o->ep, &w);
	if (!ret && c->windows) /* our rkey is a window on our own connection */
		ret = hkv_grant_base(c);
	if (!ret)
		ret = read_geometry(c, &w);
	if (!ret)
		ret = setup_arena(c, o->max_value);
	if (!ret)
		ret = hkv_alloc_init(c);
	if (!ret)
		ret = hkv_clock_refresh(c);
	if (ret) {
		hkv_close(c);
		return ret;
	}
	*out = c;
	return 0;
}

HKV_EXPORT int hkv_open(const struct hkv_config *cfg, struct hkv_client **out)
{
	struct hkv_origin *o;
	struct hkv_client *c;
	int ret;

	*out = NULL;
	if (sodium_init() < 0) /* the key hash (crypto_shorthash); idempotent */
		return -ENOMEM;
	if (cfg->nservers == 0)
		return -EINVAL;
	if (cfg->replicas > 1)
		return hkv_repl_open(cfg, out);
	if (cfg->nservers > 1)
		return -ENOTSUP; /* a list of servers: use a cluster (etcd://) instead */
	if (!strncmp(cfg->servers[0], "etcd://", 7))
		return hkv_router_open(cfg, out);
	o = hkv_calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	o->timeout_ms = cfg->timeout_ms;
	o->max_value = cfg->max_value;
	ret = parse_uri(cfg->servers[0], &o->ep);
	if (!ret)
		ret = load_token(cfg, o->token, sizeof(o->token), &o->ep.trust_uid);
	if (!ret) {
		struct hkv_client tmp = {0};

		ret = share_cache(cfg, &tmp);
		if (!ret) {
			ret = connect_client(o, tmp.cache, &c);
			hkv_cache_unref(tmp.cache);
		}
	}
	if (ret) {
		hkv_free(o);
		return ret;
	}
	c->origin = o;
	*out = c;
	return 0;
}

/*
 * The connection failed (server gone, restarted, network): connect again,
 * at most every HKV_REVIVE_INTERVAL_MS, so that while the server is away an
 * operation fails at once with HKV_EDISCONNECTED. Everything the handle knew
 * of the old connection goes: its segments were orphaned by the server (or
 * the region is a new one), so allocation starts over; the shared location
 * cache stays (every use of an entry is validated). Counters continue.
 */
int hkv_revive(struct hkv_client *c)
{
	struct hkv_client *n, old;
	uint64_t now = hkv_now_ns();
	int ret;

	/* (a connection the server fenced - it took back blocks we held unused
	 * too long: an idle handle's - or dropped is noticed here, before we
	 * post: it connects again at once) */
	if (!hkv_conn_alive(c->conn))
		return hkv_clock_keep(c);
	if (!c->origin || (c->revive_ns && now - c->revive_ns < HKV_REVIVE_INTERVAL_MS * 1000000ull))
		return HKV_EDISCONNECTED;
	c->revive_ns = now;
	ret = connect_client(c->origin, c->cache, &n);
	if (ret) {
		hkv_debug("client %u: reconnect failed: %s", c->client_id, hkv_strerror(ret));
		return ret == -ECONNREFUSED || ret == -ENOENT ? HKV_EDISCONNECTED : ret;
	}
	old = *c;
	*c = *n;
	c->origin = old.origin;
	c->stats = old.stats;
	c->pol = old.pol; /* what it learned holds for the same cache */
	c->pol_owner = old.pol_owner;
	c->stats.reconnects++;
	c->revive_ns = 0;
	hkv_free(n);
	old.origin = NULL;
	hkv_alloc_fini(&old); /* its held blocks: the server takes them back */
	hkv_cache_unref(old.cache);
	hkv_conn_dereg(old.conn, old.mr);
	hkv_conn_close(old.conn);
	hkv_free(old.arena);
	hkv_info("client %u: reconnected (was client %u)", c->client_id, old.client_id);
	return 0;
}

HKV_EXPORT void hkv_close(struct hkv_client *c)
{
	if (!c)
		return;
	if (c->router) {
		hkv_router_close(c);
		hkv_free(c);
		return;
	}
	if (c->repl) {
		hkv_repl_close(c);
		return;
	}
	if (c->conn && !c->conn->error && c->classes)
		hkv_alloc_release(c);
	hkv_alloc_fini(c);
	if (c->pol && c->pol_owner == c) {
		hkv_cpol_fini(c->pol);
		hkv_free(c->pol);
	}
	hkv_cache_unref(c->cache);
	if (c->conn) {
		hkv_conn_dereg(c->conn, c->mr);
		hkv_conn_close(c->conn);
	}
	hkv_free(c->arena);
	hkv_free(c->origin);
	hkv_free(c);
}

HKV_EXPORT void hkv_client_stats(const struct hkv_client *c, struct hkv_client_stats *out)
{
	if (c->router) {
		hkv_router_stats(c, out);
		return;
	}
	if (c->repl) {
		hkv_repl_stats(c, out);
		return;
	}
	*out = c->stats;
}

void hkv_client_conn_totals(const struct hkv_client *c, struct hkv_conn_stats *sum)
{
	if (c->router)
		hkv_router_conn_totals(c, sum);
	else if (c->repl)
		hkv_repl_conn_totals(c, sum);
	else if (c->conn)
		hkv_conn_stats_add(sum, &c->conn->stats);
}

HKV_EXPORT void hkv_client_totals(const struct hkv_client *c, uint64_t *round_trips,
				  uint64_t *bytes_read, uint64_t *bytes_written)
{
	struct hkv_conn_stats s = {0};

	hkv_client_conn_totals(c, &s);
	*round_trips = s.round_trips;
	*bytes_read = s.bytes_read;
	*bytes_written = s.bytes_written;
}

HKV_EXPORT void hkv_client_wrs(const struct hkv_client *c, uint64_t *wrs, uint64_t *atomics,
			       uint64_t *signaled)
{
	struct hkv_conn_stats s = {0};

	hkv_client_conn_totals(c, &s);
	*atomics = s.wrs[HKV_WR_CAS] + s.wrs[HKV_WR_FAA];
	*wrs = s.wrs[HKV_WR_READ] + s.wrs[HKV_WR_WRITE] + *atomics;
	*signaled = s.signaled;
}

HKV_EXPORT void hkv_server_info(const struct hkv_client *c, struct hkv_server_info *out)
{
	uint32_t replicas;

	if (c->router) {
		hkv_router_server_info(c, out);
		return;
	}
	replicas = c->repl ? (uint32_t)hkv_repl_count(c) : 1;
	if (c->repl)
		c = hkv_repl_primary(c);
	*out = (struct hkv_server_info){
		.replicas = replicas,
		.region_bytes = c->g.total_size,
		.index_slots = c->g.nbuckets * HKV_BUCKET_SLOTS,
		.value_bytes = (uint64_t)c->g.nsegs * c->g.seg_size,
		.segment_bytes = c->g.seg_size,
		.max_value = (uint32_t)c->max_value,
		.max_item = c->max_block,
		.cache_mode = !!(c->g.flags & HKV_GEOM_F_CACHE),
	};
}
