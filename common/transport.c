/*
 * transport.c - backend-independent half of the transport: opening, the
 * post/wait/exec round-trip helpers and their counters, listener dispatch.
 */
#include "common/transport_int.h"

#include "common/hkv_alloc.h"
#include "common/log.h"

#include <errno.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define HKV_DEFAULT_TIMEOUT_MS 5000
#define WAIT_BATCH             16
#define CHECK_AFTER_NS         (20ull * 1000000ull) /* 20 ms */

enum hkv_transport_kind hkv_transport_parse(const char *name)
{
	if (!strcasecmp(name, "shm"))
		return HKV_TRANSPORT_SHM;
	if (!strcasecmp(name, "verbs") || !strcasecmp(name, "rdma"))
		return HKV_TRANSPORT_VERBS;
	return 0;
}

int hkv_verbs_available(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (list)
		ibv_free_device_list(list);
	return n > 0;
}

void hkv_hello_fill(struct hkv_hello_msg *m, const struct hkv_conn_cfg *cfg)
{
	memset(m, 0, sizeof(*m));
	m->magic = HKV_CONN_MAGIC;
	m->len = (uint8_t)cfg->hello_len;
	if (cfg->hello_len)
		memcpy(m->data, cfg->hello, cfg->hello_len);
}

void hkv_listener_answer(struct hkv_listener *l, const struct hkv_hello_msg *hello, size_t len,
			 struct hkv_accept_msg *acc, uint32_t *access, uint64_t *cookie)
{
	struct hkv_accept_info info = {.access = HKV_ACCESS_ALL};

	memset(acc, 0, sizeof(*acc));
	acc->magic = HKV_CONN_MAGIC;
	info.reply = acc->data;
	if (!hello || len < offsetof(struct hkv_hello_msg, data) || hello->magic != HKV_CONN_MAGIC ||
	    hello->len > HKV_HELLO_MAX || hello->len > len - offsetof(struct hkv_hello_msg, data)) {
		acc->status = HKV_EPROTO;
		return;
	}
	if (l->on_connect)
		acc->status = l->on_connect(l->arg, hello->data, hello->len, &info);
	if (info.reply_len > HKV_REPLY_MAX)
		acc->status = -EOVERFLOW;
	if (acc->status) { /* a refusal says nothing but why: no address, no key */
		acc->len = 0;
		return;
	}
	acc->len = (uint16_t)info.reply_len;
	acc->region = l->region;
	acc->region.access = info.access | (l->region.access & HKV_ACCESS_WINDOWS);
	*access = info.access;
	*cookie = info.cookie;
}

void hkv_listener_gone(struct hkv_listener *l, uint64_t cookie)
{
	if (l->on_disconnect)
		l->on_disconnect(l->arg, cookie);
}

int hkv_conn_settle(struct hkv_conn *c, int timeout_ms, int sq_depth)
{
	c->timeout_ms = timeout_ms;
	c->sq_depth = sq_depth;
	c->runs = hkv_calloc((size_t)sq_depth, sizeof(*c->runs));
	if (!c->runs) {
		c->ops->close(c);
		errno = ENOMEM;
		return -ENOMEM;
	}
	return 0;
}

struct hkv_conn *hkv_conn_open(const struct hkv_conn_cfg *cfg_in, void *reply, size_t *reply_len)
{
	struct hkv_conn_cfg cfg = *cfg_in;
	struct hkv_accept_msg acc;
	struct hkv_conn *c;

	if (cfg.hello_len > HKV_HELLO_MAX || (cfg.hello_len && !cfg.hello)) {
		errno = EINVAL;
		return NULL;
	}
	if (cfg.timeout_ms <= 0)
		cfg.timeout_ms = HKV_DEFAULT_TIMEOUT_MS;
	if (cfg.sq_depth <= 0)
		cfg.sq_depth = 256;
	switch (cfg.kind) {
	case HKV_TRANSPORT_SHM:
		c = hkv_shm_conn_open(&cfg, &acc);
		break;
	case HKV_TRANSPORT_VERBS:
		c = hkv_verbs_conn_open(&cfg, &acc);
		break;
	default:
		errno = EINVAL;
		return NULL;
	}
	if (!c || hkv_conn_settle(c, cfg.timeout_ms, cfg.sq_depth))
		return NULL;
	if (reply && reply_len) {
		*reply_len = *reply_len < acc.len ? *reply_len : acc.len;
		memcpy(reply, acc.data, *reply_len);
	}
	return c;
}

int hkv_peer_trusted(int fd, long trust_uid, unsigned *peer_uid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		return 0;
	*peer_uid = (unsigned)cr.uid;
	return cr.uid == geteuid() || cr.uid == 0 || (trust_uid >= 0 && cr.uid == (uid_t)trust_uid);
}

void hkv_conn_close(struct hkv_conn *c)
{
	if (c) {
		hkv_free(c->runs);
		c->ops->close(c);
	}
}

/* Is wrs[i] of a chain of n signaled? (The rule every backend applies.) */
static int wr_signaled(const struct hkv_wr *wrs, int i, int n)
{
	return (wrs[i].flags & HKV_WR_F_SIGNALED) ||
	       (i == n - 1 && !(wrs[i].flags & HKV_WR_F_NO_COMPLETION));
}

/*
 * Reap up to max completions into wc. Each successful one gives back the
 * room of the WRs it covers; the transport's own (HKV_WRID_QUIET) are
 * consumed here. Returns how many are left in wc, or <0.
 */
static int reap(struct hkv_conn *c, struct hkv_wc *wc, int max)
{
	int n = c->ops->poll(c, wc, max), kept = 0;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		if (!wc[i].status && c->run_head != c->run_tail)
			c->sq_used -= c->runs[c->run_head++ % (unsigned)c->sq_depth];
		if (!wc[i].status && wc[i].wr_id == HKV_WRID_QUIET) {
			c->quiet_out--;
			continue;
		}
		wc[kept++] = wc[i];
	}
	return kept;
}

/* Wait until n WRs fit in the send queue, reaping our own quiet completions. */
static int make_room(struct hkv_conn *c, int n)
{
	uint64_t start = 0;
	unsigned spins = 0;

	while (n > c->sq_depth - c->sq_used) {
		struct hkv_wc wc[WAIT_BATCH];
		int k;

		if (!c->quiet_out)
			return -EAGAIN; /* held by the caller's own signaled work */
		k = reap(c, wc, WAIT_BATCH);
		if (k < 0)
			return c->error = k;
		for (int i = 0; i < k; i++)
			if (wc[i].status)
				return c->error = wc[i].status;
		if (k) { /* nobody posts signaled work without waiting for it */
			hkv_warn("transport: a completion nobody waited for (wr_id %llu)",
				 (unsigned long long)wc[0].wr_id);
		}
		if (++spins % 1024)
			continue;
		if (!start)
			start = hkv_now_ns();
		else if (hkv_now_ns() - start > (uint64_t)c->timeout_ms * 1000000ull)
			return c->error = HKV_ETIMEDOUT;
	}
	return 0;
}

int hkv_conn_post(struct hkv_conn *c, struct hkv_wr *wrs, int n)
{
	int ret, run;

	if (c->error)
		return c->error;
	if (n <= 0 || n > c->sq_depth)
		return n ? -EINVAL : 0;
	for (int i = 0; i < n; i++) /* what NICs refuse at post time, refused here for all */
		if (wrs[i].opcode >= HKV_WR_NOPS ||
		    (wrs[i].opcode >= HKV_WR_CAS && (wrs[i].remote_addr & 7)))
			return -EINVAL;
	if ((ret = make_room(c, n)))
		return ret;
	if ((wrs[n - 1].flags & HKV_WR_F_NO_COMPLETION) && c->carry + n >= c->sq_depth / 4) {
		int any = 0;

		for (int i = 0; i < n; i++)
			any |= wr_signaled(wrs, i, n);
		if (!any) { /* signal it after all: its completion gives the room back */
			wrs[n - 1].flags &= ~HKV_WR_F_NO_COMPLETION;
			wrs[n - 1].wr_id = HKV_WRID_QUIET;
			c->quiet_out++;
		}
	}
	ret = c->ops->post(c, wrs, n);
	if (ret == -EAGAIN) { /* the device refused what our count says fits */
		hkv_err("transport: the send queue is full against the count (%d of %d used)",
			c->sq_used, c->sq_depth);
		return c->error = HKV_ETRANSPORT;
	}
	if (ret) {
		if (wrs[n - 1].wr_id == HKV_WRID_QUIET && !(wrs[n - 1].flags & HKV_WR_F_NO_COMPLETION))
			c->quiet_out--;
		return ret;
	}
	run = c->carry;
	for (int i = 0; i < n; i++) {
		run++;
		if (wr_signaled(wrs, i, n)) {
			c->runs[c->run_tail++ % (unsigned)c->sq_depth] = (uint16_t)run;
			run = 0;
			c->stats.signaled++;
		}
	}
	c->carry = run;
	c->sq_used += n;
	c->stats.posts++;
	for (int i = 0; i < n; i++) {
		uint8_t op = wrs[i].opcode;

		c->stats.wrs[op]++;
		if (op == HKV_WR_READ)
			c->stats.bytes_read += wrs[i].length;
		else if (op == HKV_WR_WRITE)
			c->stats.bytes_written += wrs[i].length;
		else {
			c->stats.bytes_read += 8;
			c->stats.bytes_written += 8;
		}
	}
	return 0;
}

int hkv_conn_check(struct hkv_conn *c)
{
	int ret;

	if (c->error)
		return c->error;
	ret = c->ops->check ? c->ops->check(c) : 0;
	return ret ? (c->error = ret) : 0;
}

int hkv_conn_alive(struct hkv_conn *c)
{
	uint64_t now;

	if (c->error)
		return c->error;
	now = hkv_coarse_ns();
	if (now < c->next_alive_ns)
		return 0;
	c->next_alive_ns = now + 1000000ull;
	return hkv_conn_check(c);
}

_Thread_local struct hkv_conn_idle hkv_conn_idle;

int hkv_conn_wait(struct hkv_conn *c, struct hkv_wc *wc, int want)
{
	uint64_t start = 0, now, last_check = 0;
	struct hkv_wc tmp[WAIT_BATCH];
	int got = 0, first_err = 0;
	unsigned spins = 0;

	c->stats.round_trips++;
	while (got < want) {
		struct hkv_wc *dst = wc ? wc + got : tmp;
		int max = wc ? want - got : (want - got < WAIT_BATCH ? want - got : WAIT_BATCH);
		int n = reap(c, dst, max);

		if (n < 0)
			return c->error = n;
		for (int i = 0; i < n; i++)
			if (dst[i].status && !first_err)
				first_err = dst[i].status;
		got += n;
		if (first_err)
			return c->error = first_err;
		if (!n && hkv_conn_idle.fn)
			hkv_conn_idle.fn(hkv_conn_idle.arg); /* the other lanes run meanwhile */
		if (n || ++spins % 1024)
			continue;
		/* Idle: read the clock now and then; only after a quiet spell ask
		 * the backend (a system call) whether the peer is gone. */
		now = hkv_now_ns();
		if (!start) {
			start = now;
			continue;
		}
		if (now - start > (uint64_t)c->timeout_ms * 1000000ull)
			return c->error = HKV_ETIMEDOUT;
		if (now - start > CHECK_AFTER_NS && now - last_check > CHECK_AFTER_NS) {
			last_check = now;
			if (c->ops->check && (n = c->ops->check(c)))
				return c->error = n;
		}
	}
	return 0;
}

int hkv_conn_completions(const struct hkv_wr *wrs, int n)
{
	int signaled = 0;

	for (int i = 0; i < n - 1; i++)
		signaled += !!(wrs[i].flags & HKV_WR_F_SIGNALED);
	return signaled + 1;
}

int hkv_conn_exec(struct hkv_conn *c, struct hkv_wr *wrs, int n)
{
	int ret = hkv_conn_post(c, wrs, n);

	return ret ? ret : hkv_conn_wait(c, NULL, hkv_conn_completions(wrs, n));
}

struct hkv_listener *hkv_listener_create(const struct hkv_listener_cfg *cfg)
{
	if (!cfg->region || !cfg->region_len) {
		errno = EINVAL;
		return NULL;
	}
	switch (cfg->kind) {
	case HKV_TRANSPORT_SHM:
		return hkv_shm_listener_create(cfg);
	case HKV_TRANSPORT_VERBS:
		return hkv_verbs_listener_create(cfg);
	default:
		errno = EINVAL;
		return NULL;
	}
}

int hkv_listener_fd(const struct hkv_listener *l)
{
	return l->ops->fd(l);
}

int hkv_listener_dispatch(struct hkv_listener *l)
{
	return l->ops->dispatch(l);
}

int hkv_listener_nconns(const struct hkv_listener *l)
{
	return l->ops->nconns(l);
}

int hkv_listener_grant(struct hkv_listener *l, uint64_t cookie, uint64_t off, uint64_t len,
		       uint32_t access, uint32_t *rkey)
{
	if (!l->ops->grant || !(l->region.access & HKV_ACCESS_WINDOWS))
		return -EOPNOTSUPP;
	if (!len || off > l->region.length || len > l->region.length - off ||
	    !(access & HKV_ACCESS_ALL) || (access & ~HKV_ACCESS_ALL))
		return -EINVAL;
	return l->ops->grant(l, cookie, off, len, access, rkey);
}

int hkv_listener_revoke(struct hkv_listener *l, uint64_t cookie, uint64_t off)
{
	if (!l->ops->revoke || !(l->region.access & HKV_ACCESS_WINDOWS))
		return -EOPNOTSUPP;
	return l->ops->revoke(l, cookie, off);
}

int hkv_listener_tick(struct hkv_listener *l)
{
	return l->ops->tick ? l->ops->tick(l) : 0;
}

int hkv_listener_nwindows(const struct hkv_listener *l)
{
	return l->ops->nwindows ? l->ops->nwindows(l) : 0;
}

int hkv_listener_fence(struct hkv_listener *l, uint64_t cookie)
{
	return l->ops->fence ? l->ops->fence(l, cookie) : -EOPNOTSUPP;
}

struct hkv_conn *hkv_listener_loopback(struct hkv_listener *l, int timeout_ms)
{
	if (!l->ops->loopback) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return l->ops->loopback(l, timeout_ms);
}

const struct hkv_region_desc *hkv_listener_region(const struct hkv_listener *l)
{
	return &l->region;
}

void hkv_listener_destroy(struct hkv_listener *l)
{
	if (l)
		l->ops->destroy(l);
}
