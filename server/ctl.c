/*
 * ctl.c - see ctl.h. Requests are decoded by server/ctl_decode.h.
 *
 * Rate limit: every source (a TCP peer's IP address; a unix-socket peer's
 * uid) has a token bucket of CTL_RATE_BURST tokens refilled at CTL_RATE_PER_S
 * per second. A refused request (wrong token, malformed) takes a token; a
 * request from a source whose bucket is empty is answered ERROR
 * HKV_EAGAIN "rate limited" without looking at its token (so a guesser
 * learns nothing while limited) and closed, with at most one log line per
 * second. Correct tokens take nothing: a host opening many handles at once
 * is never limited unless it also sends bad requests. Sources live in a
 * fixed table (CTL_RATE_SOURCES, a few probes per lookup; the stalest entry
 * makes room), so neither the limiter nor the connection cap can grow memory:
 * at most HKV_CTL_MAX_CONNS connections, each buffering at most
 * HKV_CTL_REQ_MAX bytes (the read high-watermark) and one reply.
 */
#include "server/ctl.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>

#include <sodium.h>

#include "common/ctl_auth.h"
#include "common/hkv_alloc.h"
#include "common/layout.h"
#include "common/log.h"
#include "server/ctl_decode.h"

#define CTL_RATE_PER_S   20
#define CTL_RATE_BURST   40
#define CTL_RATE_SOURCES 1024 /* power of two */
#define CTL_RATE_PROBES  8
#define CTL_MILLI        1000 /* bucket levels in thousandths of a token */

struct ctl_source {
	uint64_t key;      /* 0 = empty entry */
	uint64_t stamp_ns; /* when level was last brought up to date */
	uint64_t level;    /* thousandths of a token */
	uint32_t conns;    /* connections of this source open now */
};

struct hkv_ctl {
	struct hkv_store *store;
	struct evconnlistener *listener;
	struct hkv_ctl_opts o;
	char path[108];
	int nconns;
	struct ctl_source sources[CTL_RATE_SOURCES];
	struct event *resume; /* re-enables the listener after an accept error */
};

struct ctl_conn {
	struct hkv_ctl *ctl;
	struct bufferevent *bev;
	struct event *deadline; /* the whole request must be in by then */
	struct event *again;    /* a GRANT whose bind is in flight: asked again */
	struct hkv_ctl_grant grant;
	struct hkv_ctl_carve carve;
	int is_carve;
	uint64_t grant_until_ns;
	uint64_t source; /* rate-limit key of the peer */
	int closing;
	int challenged; /* a HELLO answered: the next message must be PROVE */
	uint8_t nonce_c[HKV_CTL_NONCE_LEN], nonce_s[HKV_CTL_NONCE_LEN];
};

/* ---- rate limit -------------------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The peer's rate-limit key: its IP address (TCP) or uid (unix socket); never 0. */
static uint64_t source_key(evutil_socket_t fd, const struct sockaddr *sa)
{
	struct ucred cr;
	socklen_t crlen = sizeof(cr);

	if (sa->sa_family == AF_INET)
		return 1ull << 62 | ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
	if (sa->sa_family == AF_INET6)
		return 2ull << 62 |
		       hkv_hash64(&((const struct sockaddr_in6 *)sa)->sin6_addr, 16) >> 2;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) == 0)
		return 3ull << 62 | cr.uid;
	return 3ull << 62 | 1ull << 32; /* unknown peer: one shared bucket */
}

/* The source's entry, brought up to date; a fresh full one if it was not tracked. */
static struct ctl_source *source_get(struct hkv_ctl *ctl, uint64_t key)
{
	uint64_t now = now_ns(), h = hkv_hash64(&key, sizeof(key));
	struct ctl_source *s, *victim = NULL;

	for (int i = 0; i < CTL_RATE_PROBES; i++) {
		s = &ctl->sources[(h + (uint64_t)i) & (CTL_RATE_SOURCES - 1)];
		if (s->key == key)
			goto refill;
		/* empty entries have stamp 0; one with connections open is kept
		 * unless all are (its count would be lost) */
		if (!victim || (victim->conns && !s->conns) ||
		    (!victim->conns == !s->conns && s->stamp_ns < victim->stamp_ns))
			victim = s;
	}
	/* forgetting the stalest entry forgives at most a bucket's worth */
	s = victim;
	*s = (struct ctl_source){.key = key, .stamp_ns = now,
				 .level = CTL_RATE_BURST * CTL_MILLI};
refill:
	s->level += (now - s->stamp_ns) * CTL_RATE_PER_S / (1000000000ull / CTL_MILLI);
	if (s->level > CTL_RATE_BURST * CTL_MILLI)
		s->level = CTL_RATE_BURST * CTL_MILLI;
	s->stamp_ns = now;
	return s;
}

static int source_limited(struct ctl_conn *cc)
{
	return source_get(cc->ctl, cc->source)->level < CTL_MILLI;
}

/* A refused request costs its source one token. */
static void source_charge(struct ctl_conn *cc)
{
	struct ctl_source *s = source_get(cc->ctl, cc->source);

	s->level = s->level >= CTL_MILLI ? s->level - CTL_MILLI : 0;
}

/* A refusal, counted for the metrics (server/store.h). */
static void count_refused(struct hkv_ctl *ctl, enum hkv_refusal why)
{
	ctl->store->stats.refused[why]++;
}

static void conn_free(struct ctl_conn *cc)
{
	struct ctl_source *s = source_get(cc->ctl, cc->source);

	s->conns -= s->conns > 0;
	cc->ctl->nconns--;
	if (cc->deadline)
		event_free(cc->deadline);
	if (cc->again)
		event_free(cc->again);
	bufferevent_free(cc->bev);
	hkv_free(cc);
}

static void send_msg(struct ctl_conn *cc, uint16_t type, int status, const void *body,
		     uint32_t len)
{
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = type, .status = status, .len = len};

	bufferevent_write(cc->bev, &h, sizeof(h));
	if (len)
		bufferevent_write(cc->bev, body, len);
}

/* The last message of a connection: close once flushed. */
static void reply(struct ctl_conn *cc, uint16_t type, int status, const void *body, uint32_t len)
{
	send_msg(cc, type, status, body, len);
	cc->closing = 1;
	bufferevent_disable(cc->bev, EV_READ);
}

/* Refuse a client (counted by reason, `kind`) with status and why. */
static void refuse(struct ctl_conn *cc, enum hkv_refusal kind, int status, const char *why)
{
	count_refused(cc->ctl, kind);
	hkv_warn_limited("ctl: refused a client: %s", why);
	reply(cc, HKV_CTL_ERROR, status, why, (uint32_t)strlen(why));
}

/* Over its source's limit: refuse without judging the request; log <= 1/s. */
static void refuse_limited(struct ctl_conn *cc)
{
	static const char why[] = "rate limited";

	cc->ctl->store->stats.rate_limited++;
	hkv_warn_limited("ctl: refused a client: %s", why);
	reply(cc, HKV_CTL_ERROR, HKV_EAGAIN, why, sizeof(why) - 1);
}

/*
 * HELLO: answer a CHALLENGE - our nonce and the proofs that we hold the
 * writer token (and the read-only one, if we have it) - and wait for PROVE
 * on this connection (within the same deadline).
 */
static void process_hello(struct ctl_conn *cc, const uint8_t *body)
{
	const struct hkv_ctl_opts *o = &cc->ctl->o;
	struct hkv_ctl_challenge ch = {0};

	memcpy(cc->nonce_c, body, HKV_CTL_NONCE_LEN);
	randombytes_buf(cc->nonce_s, sizeof(cc->nonce_s));
	memcpy(ch.nonce_s, cc->nonce_s, sizeof(ch.nonce_s));
	hkv_ctl_mac(ch.proof_full, o->token, o->token_len, "hatchkv server", cc->nonce_c,
		    cc->nonce_s);
	if (o->ro_token) {
		hkv_ctl_mac(ch.proof_ro, o->ro_token, o->ro_token_len, "hatchkv server",
			    cc->nonce_c, cc->nonce_s);
		ch.flags = HKV_CHALLENGE_F_RO;
	}
	cc->challenged = 1;
	send_msg(cc, HKV_CTL_CHALLENGE, 0, &ch, sizeof(ch));
}

/* PROVE: the client's MAC names its token (writer or read-only); admit it
 * and send the WELCOME sealed under the session key. */
static void process_prove(struct ctl_conn *cc, const uint8_t *body)
{
	const struct hkv_ctl_opts *o = &cc->ctl->o;
	struct hkv_ctl_welcome_msg msg;
	struct hkv_ctl_welcome w;
	uint8_t want[HKV_CTL_MAC_LEN], sk[HKV_CTL_MAC_LEN], rk[HKV_CTL_MAC_LEN];
	const char *tok = o->token;
	size_t tlen = o->token_len;
	int full, ro = 0, ret;

	hkv_ctl_mac(want, o->token, o->token_len, "hatchkv client", cc->nonce_c, cc->nonce_s);
	full = hkv_ctl_mac_equal(want, body);
	if (!full && o->ro_token) {
		hkv_ctl_mac(want, o->ro_token, o->ro_token_len, "hatchkv client", cc->nonce_c,
			    cc->nonce_s);
		ro = hkv_ctl_mac_equal(want, body);
		tok = o->ro_token;
		tlen = o->ro_token_len;
	}
	if (!full && !ro) {
		source_charge(cc);
		refuse(cc, HKV_REFUSED_TOKEN, HKV_EAUTH, "wrong token");
		return;
	}
	hkv_ctl_mac(sk, tok, tlen, "hatchkv session", cc->nonce_c, cc->nonce_s);
	hkv_ctl_request_key(rk, sk);
	ret = hkv_store_admit(cc->ctl->store, &w, !full, cc->source, rk);
	sodium_memzero(rk, sizeof(rk));
	if (ret) {
		sodium_memzero(sk, sizeof(sk));
		refuse(cc, ret == HKV_EDISCONNECTED ? HKV_REFUSED_FENCED : HKV_REFUSED_MAX_CLIENTS,
		       ret, ret == HKV_EDISCONNECTED
					? "fenced: not serving for now (cluster: settling on the map, "
					  "moving partitions, or lease in doubt)"
					: "too many clients");
		return;
	}
	cc->ctl->store->stats.admitted++;
	w.transport = o->kind;
	w.flags |= full ? 0 : HKV_WELCOME_F_READONLY;
	snprintf(w.data_endpoint, sizeof(w.data_endpoint), "%s", o->data_endpoint);
	hkv_ctl_welcome_seal(&msg, &w, sk);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(&w, sizeof(w));
	reply(cc, HKV_CTL_WELCOME, 0, &msg, sizeof(msg));
}

static void grant_step(struct ctl_conn *cc);
static void carve_step(struct ctl_conn *cc);

static void on_grant_again(evutil_socket_t fd, short what, void *arg)
{
	struct ctl_conn *cc = arg;

	if (cc->is_carve)
		carve_step(cc);
	else
		grant_step(cc);
}

/* Ask again in a millisecond (a bind, or a segment being moved); 0 if set. */
static int again_later(struct ctl_conn *cc)
{
	struct timeval ms = {0, 1000};

	if (!cc->again)
		cc->again = evtimer_new(bufferevent_get_base(cc->bev), on_grant_again, cc);
	return cc->again && !evtimer_add(cc->again, &ms) ? 0 : -1;
}

/*
 * One step of a CARVE. Moving a segment between classes waits for frees in
 * flight and for held blocks to be given back or abandoned: the request is
 * looked at again every millisecond (each look is a step of the move) while
 * everyone else is served, for up to 4 s.
 */
static void carve_step(struct ctl_conn *cc)
{
	struct hkv_ctl_carved out;
	const char *why;
	int ret = hkv_store_carve(cc->ctl->store, &cc->carve, &out, &why);

	if (ret == -EINPROGRESS && now_ns() < cc->grant_until_ns && !again_later(cc))
		return;
	if (ret == -EINPROGRESS) {
		ret = HKV_ETIMEDOUT;
		why = "moving a segment did not finish within 4 s";
	}
	if (ret == HKV_EAUTH)
		source_charge(cc);
	if (ret == HKV_EFULL)
		cc->ctl->store->stats.carves_full++;
	else if (ret)
		cc->ctl->store->stats.carves_refused++;
	else
		cc->ctl->store->stats.carves++;
	if (ret) {
		if (ret != HKV_EFULL)
			hkv_warn_limited("ctl: refused a carve to client %u: %s",
					 cc->carve.client_id, why);
		reply(cc, HKV_CTL_ERROR, ret, why, (uint32_t)strlen(why));
		return;
	}
	reply(cc, HKV_CTL_CARVED, 0, &out, sizeof(out));
}

/* A GRANT's or CARVE's proof (ctl_proto.h): from the session that welcomed
 * the client, and new. A forged or replayed one costs like a guessed token. */
static int request_ok(struct ctl_conn *cc, uint32_t id, uint64_t seq, uint16_t type,
		      const void *body, size_t len)
{
	const char *why = "not from the session that welcomed this client, or replayed";

	if (hkv_store_request_ok(cc->ctl->store, id, seq, type, body, len))
		return 1;
	source_charge(cc);
	if (type == HKV_CTL_GRANT)
		cc->ctl->store->stats.grants_refused++;
	else
		cc->ctl->store->stats.carves_refused++;
	hkv_warn_limited("ctl: refused a %s to client %u: %s",
			 type == HKV_CTL_GRANT ? "grant" : "carve", id, why);
	bufferevent_disable(cc->bev, EV_READ);
	reply(cc, HKV_CTL_ERROR, HKV_EAUTH, why, (uint32_t)strlen(why));
	return 0;
}

/* CARVE: a connected writer asks for memory of one class (see ctl_proto.h). */
static void process_carve(struct ctl_conn *cc, const uint8_t *body)
{
	memcpy(&cc->carve, body, sizeof(cc->carve));
	if (!request_ok(cc, cc->carve.client_id, cc->carve.seq, HKV_CTL_CARVE, &cc->carve,
			sizeof(cc->carve)))
		return;
	cc->is_carve = 1;
	cc->grant_until_ns = now_ns() + 4000000000ull;
	bufferevent_disable(cc->bev, EV_READ); /* one request per connection */
	carve_step(cc);
}

/*
 * One step of a GRANT. The window's bind goes out on the client's queue
 * pair and completes later: the event loop never waits for it (nor for a
 * connection still being established) - the request is looked at again
 * every millisecond for up to 2 s while everyone else is served.
 */
static void grant_step(struct ctl_conn *cc)
{
	struct hkv_ctl_granted out;
	const struct hkv_ctl_grant *g = &cc->grant;
	const char *why;
	int ret;

	ret = hkv_store_grant(cc->ctl->store, g, &out, &why);
	if (ret == -EINPROGRESS && now_ns() < cc->grant_until_ns && !again_later(cc))
		return;
	if (ret == -EINPROGRESS) {
		ret = HKV_ETIMEDOUT;
		why = "the window's bind did not complete within 2 s";
	}
	/* a guessed ticket, or GRANTs before the connection is up, cost like a
	 * guessed token: repeating them runs into the rate limit */
	if (ret == HKV_EAUTH || ret == -EAGAIN)
		source_charge(cc);
	if (ret)
		cc->ctl->store->stats.grants_refused++;
	else
		cc->ctl->store->stats.grants++;
	if (ret) {
		hkv_warn_limited("ctl: refused a grant to client %u: %s", g->client_id, why);
		reply(cc, HKV_CTL_ERROR, ret, why, (uint32_t)strlen(why));
		return;
	}
	reply(cc, HKV_CTL_GRANTED, 0, &out, sizeof(out));
}

/* GRANT: a connected client asks for a memory window (see ctl_proto.h). */
static void process_grant(struct ctl_conn *cc, const uint8_t *body)
{
	memcpy(&cc->grant, body, sizeof(cc->grant));
	if (!request_ok(cc, cc->grant.client_id, cc->grant.seq, HKV_CTL_GRANT, &cc->grant,
			sizeof(cc->grant)))
		return;
	cc->grant_until_ns = now_ns() + 2000000000ull;
	bufferevent_disable(cc->bev, EV_READ); /* one request per connection */
	grant_step(cc);
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct ctl_conn *cc = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	size_t have = evbuffer_get_length(in);
	enum hkv_ctl_verdict v;
	struct hkv_ctl_req req;
	const uint8_t *bytes;

	if (cc->closing)
		return;
	if (have > HKV_CTL_REQ_MAX)
		have = HKV_CTL_REQ_MAX; /* the watermark keeps it there anyway */
	bytes = evbuffer_pullup(in, (ev_ssize_t)have);
	v = hkv_ctl_decode(bytes, have, &req);
	if (v == HKV_CTL_NEED_MORE)
		return;
	if (source_limited(cc)) {
		refuse_limited(cc);
	} else if (v == HKV_CTL_REJECT) {
		source_charge(cc);
		refuse(cc, HKV_REFUSED_MALFORMED, req.status, req.why);
	} else if (cc->challenged != (req.type == HKV_CTL_PROVE)) {
		/* PROVE only right after our CHALLENGE; nothing else then */
		source_charge(cc);
		refuse(cc, HKV_REFUSED_MALFORMED, HKV_EPROTO,
		       cc->challenged ? "expected PROVE after CHALLENGE" : "PROVE without HELLO");
	} else if (req.type == HKV_CTL_GRANT) {
		process_grant(cc, req.token);
	} else if (req.type == HKV_CTL_CARVE) {
		process_carve(cc, req.token);
	} else if (req.type == HKV_CTL_HELLO) {
		process_hello(cc, req.token);
	} else {
		process_prove(cc, req.token);
	}
	evbuffer_drain(in, req.consumed ? req.consumed : evbuffer_get_length(in));
	if (!cc->closing && evbuffer_get_length(in))
		on_read(bev, arg); /* (a PROVE sent right behind its HELLO: refused) */
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct ctl_conn *cc = arg;

	if (cc->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_free(cc);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct ctl_conn *cc = arg;

	if (what & BEV_EVENT_TIMEOUT) /* a reply the peer would not take in 5 s */
		hkv_warn_limited("ctl: a client did not read its reply within the timeout; "
				 "dropped");
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
		conn_free(cc);
}

/* The deadline: a request not whole HKV_CTL_DEADLINE_S after the accept,
 * however its bytes trickled in, is dropped and charged to its source. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct ctl_conn *cc = arg;

	if (cc->closing || cc->grant_until_ns)
		return; /* answered, or a GRANT or CARVE in flight (it answers in time) */
	source_charge(cc);
	count_refused(cc->ctl, HKV_REFUSED_TOO_SLOW);
	hkv_warn_limited("ctl: a client did not send a whole request within 5 s; dropped");
	conn_free(cc);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct hkv_ctl *ctl = arg;
	struct timeval tmo = {HKV_CTL_DEADLINE_S, 0};
	uint64_t source = source_key(fd, sa);
	struct ctl_source *src = source_get(ctl, source);
	struct ctl_conn *cc;

	if (ctl->nconns >= HKV_CTL_MAX_CONNS || src->conns >= HKV_CTL_MAX_PER_SOURCE) {
		count_refused(ctl, HKV_REFUSED_CONN_CAP);
		hkv_warn_limited("ctl: %s", ctl->nconns >= HKV_CTL_MAX_CONNS
						    ? "256 control connections open; refusing more"
						    : "a source holds 128 control connections; refusing "
						      "its next");
		evutil_closesocket(fd);
		return;
	}
	cc = hkv_calloc(1, sizeof(*cc));
	if (!cc) {
		evutil_closesocket(fd);
		return;
	}
	cc->ctl = ctl;
	cc->source = source;
	cc->bev = bufferevent_socket_new(evconnlistener_get_base(l), fd, BEV_OPT_CLOSE_ON_FREE);
	cc->deadline = evtimer_new(evconnlistener_get_base(l), on_deadline, cc);
	if (!cc->bev || !cc->deadline || evtimer_add(cc->deadline, &tmo)) {
		if (cc->bev)
			bufferevent_free(cc->bev);
		else
			evutil_closesocket(fd);
		if (cc->deadline)
			event_free(cc->deadline);
		hkv_free(cc);
		return;
	}
	ctl->nconns++;
	src->conns++;
	bufferevent_setcb(cc->bev, on_read, on_write, on_event, cc);
	bufferevent_set_timeouts(cc->bev, NULL, &tmo);
	bufferevent_setwatermark(cc->bev, EV_READ, 0, HKV_CTL_REQ_MAX);
	bufferevent_enable(cc->bev, EV_READ | EV_WRITE);
}

static struct evconnlistener *listen_unix(struct event_base *base, struct hkv_ctl *ctl)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};

	if (strlen(ctl->o.path) >= sizeof(sun.sun_path)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	strcpy(sun.sun_path, ctl->o.path);
	snprintf(ctl->path, sizeof(ctl->path), "%s", ctl->o.path);
	unlink(ctl->o.path);
	return evconnlistener_new_bind(base, on_accept, ctl,
				       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 128,
				       (struct sockaddr *)&sun, sizeof(sun));
}

static struct evconnlistener *listen_tcp(struct event_base *base, struct hkv_ctl *ctl)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE};
	struct evconnlistener *l;
	struct addrinfo *ai;

	if (getaddrinfo(ctl->o.host, ctl->o.port, &hints, &ai)) {
		errno = EADDRNOTAVAIL;
		return NULL;
	}
	l = evconnlistener_new_bind(base, on_accept, ctl,
				    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
					    LEV_OPT_REUSEABLE,
				    128, ai->ai_addr, (int)ai->ai_addrlen);
	freeaddrinfo(ai);
	return l;
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(((struct hkv_ctl *)arg)->listener);
}

/* accept() failed (out of descriptors, say): log it at most once a second
 * and pause accepting for 100 ms instead of spinning on a readable socket. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
	struct hkv_ctl *ctl = arg;
	struct timeval pause = {0, 100000};

	hkv_warn_limited("ctl: accept: %s; pausing 100 ms",
			 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	evconnlistener_disable(l);
	evtimer_add(ctl->resume, &pause);
}

struct hkv_ctl *hkv_ctl_create(struct event_base *base, struct hkv_store *store,
			       const struct hkv_ctl_opts *o)
{
	struct hkv_ctl *ctl = hkv_calloc(1, sizeof(*ctl));

	if (!ctl)
		return NULL;
	ctl->store = store;
	ctl->o = *o;
	ctl->listener = o->kind == HKV_TRANSPORT_SHM ? listen_unix(base, ctl) : listen_tcp(base, ctl);
	ctl->resume = ctl->listener ? evtimer_new(base, on_resume, ctl) : NULL;
	if (!ctl->resume) {
		int err = errno ? errno : ENOMEM;

		if (ctl->listener)
			evconnlistener_free(ctl->listener);
		hkv_free(ctl);
		errno = err;
		return NULL;
	}
	evconnlistener_set_error_cb(ctl->listener, on_accept_error);
	return ctl;
}

void hkv_ctl_set_tokens(struct hkv_ctl *ctl, const char *token, size_t token_len,
			const char *ro_token, size_t ro_token_len)
{
	ctl->o.token = token;
	ctl->o.token_len = token_len;
	ctl->o.ro_token = ro_token;
	ctl->o.ro_token_len = ro_token_len;
}

void hkv_ctl_destroy(struct hkv_ctl *ctl)
{
	if (!ctl)
		return;
	evconnlistener_free(ctl->listener);
	event_free(ctl->resume);
	if (ctl->path[0])
		unlink(ctl->path);
	hkv_free(ctl);
}
