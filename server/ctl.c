/* ctl.c - see ctl.h. */
#include "server/ctl.h"

#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>

#include "common/hkv_alloc.h"
#include "common/log.h"

struct hkv_ctl {
	struct hkv_store *store;
	struct evconnlistener *listener;
	struct hkv_ctl_opts o;
	char path[108];
	int nconns;
};

struct ctl_conn {
	struct hkv_ctl *ctl;
	struct bufferevent *bev;
	int closing;
};

static void conn_free(struct ctl_conn *cc)
{
	cc->ctl->nconns--;
	bufferevent_free(cc->bev);
	hkv_free(cc);
}

static void reply(struct ctl_conn *cc, uint16_t type, int status, const void *body, uint32_t len)
{
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = type, .status = status, .len = len};

	bufferevent_write(cc->bev, &h, sizeof(h));
	if (len)
		bufferevent_write(cc->bev, body, len);
	cc->closing = 1; /* one request per connection: close once flushed */
	bufferevent_disable(cc->bev, EV_READ);
}

static void refuse(struct ctl_conn *cc, int status, const char *why)
{
	hkv_warn("ctl: refused a client: %s", why);
	reply(cc, HKV_CTL_ERROR, status, why, (uint32_t)strlen(why));
}

static int token_equal(const char *secret, size_t slen, const uint8_t *tok, size_t len)
{
	const uint8_t *want = (const uint8_t *)secret;
	uint8_t diff = len != slen;

	/* constant time in the secret: always walk the whole expected token */
	for (size_t i = 0; i < slen; i++)
		diff |= want[i] ^ (i < len ? tok[i] : 0);
	return diff == 0;
}

static void process_auth(struct ctl_conn *cc, const uint8_t *body, uint32_t len)
{
	const struct hkv_ctl_opts *o = &cc->ctl->o;
	int full = token_equal(o->token, o->token_len, body, len);
	int ro = o->ro_token && token_equal(o->ro_token, o->ro_token_len, body, len);
	struct hkv_ctl_welcome w;
	int ret;

	if (!full && !ro) {
		refuse(cc, HKV_EAUTH, "wrong token");
		return;
	}
	ret = hkv_store_admit(cc->ctl->store, &w, !full);
	if (ret) {
		refuse(cc, ret, "too many clients");
		return;
	}
	w.transport = o->kind;
	w.flags = full ? 0 : HKV_WELCOME_F_READONLY;
	snprintf(w.data_endpoint, sizeof(w.data_endpoint), "%s", o->data_endpoint);
	reply(cc, HKV_CTL_WELCOME, 0, &w, sizeof(w));
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct ctl_conn *cc = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	uint8_t body[HKV_CTL_BODY_MAX];
	struct hkv_ctl_hdr h;

	if (cc->closing || evbuffer_get_length(in) < sizeof(h))
		return;
	evbuffer_copyout(in, &h, sizeof(h));
	if (h.magic != HKV_CTL_MAGIC) {
		refuse(cc, HKV_EPROTO, "not a hatchkv control message");
		return;
	}
	if (h.version != HKV_CTL_VERSION) {
		refuse(cc, HKV_EPROTO, "unsupported control protocol version");
		return;
	}
	if (h.type != HKV_CTL_AUTH || h.len == 0 || h.len > HKV_TOKEN_MAX) {
		refuse(cc, HKV_EPROTO, "malformed request");
		return;
	}
	if (evbuffer_get_length(in) < sizeof(h) + h.len)
		return; /* wait for the rest (the read timeout bounds the wait) */
	evbuffer_drain(in, sizeof(h));
	evbuffer_remove(in, body, h.len);
	process_auth(cc, body, h.len);
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

	if (what & BEV_EVENT_TIMEOUT)
		hkv_warn("ctl: client sent an incomplete request within the timeout; dropped");
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
		conn_free(cc);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct hkv_ctl *ctl = arg;
	struct timeval tmo = {5, 0};
	struct ctl_conn *cc;

	if (ctl->nconns >= HKV_CTL_MAX_CONNS) {
		hkv_warn("ctl: %d control connections open; refusing more", ctl->nconns);
		evutil_closesocket(fd);
		return;
	}
	cc = hkv_calloc(1, sizeof(*cc));
	if (!cc) {
		evutil_closesocket(fd);
		return;
	}
	cc->ctl = ctl;
	cc->bev = bufferevent_socket_new(evconnlistener_get_base(l), fd, BEV_OPT_CLOSE_ON_FREE);
	if (!cc->bev) {
		evutil_closesocket(fd);
		hkv_free(cc);
		return;
	}
	ctl->nconns++;
	bufferevent_setcb(cc->bev, on_read, on_write, on_event, cc);
	bufferevent_set_timeouts(cc->bev, &tmo, &tmo);
	bufferevent_setwatermark(cc->bev, EV_READ, 0, sizeof(struct hkv_ctl_hdr) + HKV_TOKEN_MAX);
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

struct hkv_ctl *hkv_ctl_create(struct event_base *base, struct hkv_store *store,
			       const struct hkv_ctl_opts *o)
{
	struct hkv_ctl *ctl = hkv_calloc(1, sizeof(*ctl));

	if (!ctl)
		return NULL;
	ctl->store = store;
	ctl->o = *o;
	ctl->listener = o->kind == HKV_TRANSPORT_SHM ? listen_unix(base, ctl) : listen_tcp(base, ctl);
	if (!ctl->listener) {
		int err = errno;

		hkv_free(ctl);
		errno = err;
		return NULL;
	}
	return ctl;
}

void hkv_ctl_destroy(struct hkv_ctl *ctl)
{
	if (!ctl)
		return;
	evconnlistener_free(ctl->listener);
	if (ctl->path[0])
		unlink(ctl->path);
	hkv_free(ctl);
}
