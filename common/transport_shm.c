/*
 * transport_shm.c - same-host backend of transport.h.
 *
 * The listener owns a SOCK_SEQPACKET unix socket. A client connects, sends
 * its hello; the listener answers with the accept message and, in the same
 * datagram, the region's memfd (SCM_RIGHTS; a read-only reopen of it when the
 * client is granted read access only). The client maps it and from then on
 * executes READ/WRITE/CAS/FAA itself on its mapping, in post order, and
 * completes them through a private completion ring - playing the NIC: it
 * checks the rkey, the bounds, the rights and atomic alignment, and a
 * violation is an error completion that moves the connection to the error
 * state. The socket stays open as the liveness signal: when the server goes
 * away (or drops the client) the next checks see the hangup and the
 * connection fails with HKV_EDISCONNECTED.
 *
 * Fencing (hkv_listener_fence): a client process keeps its mapping however
 * the socket ends, so a closed socket alone does not stop a client stopped
 * between a check and its next chain. So the listener also hands every
 * connection a gate: a slot of a shared table (a second memfd) holding a
 * generation and a busy count. A chain is executed only between raising
 * the count and lowering it, and only if the slot's generation is still
 * the one the connection was given; the listener fences by bumping the
 * generation, then reading the count (both sequentially consistent, so
 * either the chain sees the bump or the listener sees the count): 0 means
 * no chain of that slot is in flight and none will run again. A peer
 * stopped inside a chain keeps the fence waiting: the cost of its stop is
 * the memory the server cannot take back meanwhile.
 */
#include "common/transport_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/hkv_alloc.h"
#include "common/log.h"

#define SHM_CHECK_INTERVAL_NS 1000000ull /* liveness check once per coarse tick (1-4 ms) */
#define SHM_MAX_CLIENTS       4096
#define SHM_HELLO_NS          (2000ull * 1000000ull) /* a connection's hello must come by then */
#define SHM_GATE_MAGIC        0x47544b48u /* "HKTG": the accept carries a gate */

/* One connection's gate (a slot per listener fd, reused with a new generation). */
struct shm_gate {
	uint32_t gen;  /* the generation allowed to execute; bumped to fence */
	uint32_t busy; /* chains in flight on the slot */
};

/* After the accept message, in the same datagram, with the gate table's fd. */
struct shm_gate_info {
	uint32_t magic, slot, gen;
};

/* ---- client ---------------------------------------------------------------- */

struct shm_conn {
	struct hkv_conn base;
	int sock;
	uint8_t *map;
	size_t map_len;
	struct hkv_wc *cq;
	unsigned cq_mask, cq_head, cq_tail;
	uint64_t next_check_ns;
	struct shm_gate *gates; /* the table's mapping (NULL: a server without gates) */
	struct shm_gate *gate;  /* ours */
	uint32_t gen;
};

/*
 * Remote memory is shared with other processes that write it concurrently,
 * exactly as a NIC's DMA would: these copies race by design (readers detect
 * torn data by checksums). Keep ThreadSanitizer out of them.
 */
#if defined(__SANITIZE_THREAD__)
__attribute__((no_sanitize("thread"))) static void remote_copy(void *dst, const void *src, size_t n)
{
	volatile uint8_t *d = dst;
	const volatile uint8_t *s = src;

	while (n--)
		*d++ = *s++;
}
#else
#define remote_copy memcpy
#endif

static int shm_check_wr(const struct shm_conn *s, const struct hkv_wr *wr, uint64_t *off)
{
	const struct hkv_region_desc *r = &s->base.region;
	uint32_t len = wr->opcode >= HKV_WR_CAS ? 8 : wr->length;
	static const uint32_t need[HKV_WR_NOPS] = {HKV_ACCESS_READ, HKV_ACCESS_WRITE,
						   HKV_ACCESS_ATOMIC, HKV_ACCESS_ATOMIC};

	if (wr->opcode >= HKV_WR_NOPS)
		return HKV_EREMOTE_INVAL;
	if (!wr->local && len)
		return -EFAULT;
	if (!wr->mr && !(wr->opcode == HKV_WR_WRITE && len <= HKV_INLINE_MAX))
		return -EFAULT; /* a NIC would fail the local key check */
	if (wr->mr && len &&
	    ((uint8_t *)wr->local < (uint8_t *)wr->mr->addr ||
	     (uint8_t *)wr->local + len > (uint8_t *)wr->mr->addr + wr->mr->length))
		return -EFAULT;
	if (wr->rkey != r->rkey || !(r->access & need[wr->opcode]))
		return HKV_EREMOTE_ACCESS;
	if (wr->remote_addr < r->base || wr->remote_addr - r->base > r->length ||
	    len > r->length - (wr->remote_addr - r->base))
		return HKV_EREMOTE_ACCESS;
	*off = wr->remote_addr - r->base;
	if (wr->opcode >= HKV_WR_CAS && (*off & 7))
		return HKV_EREMOTE_INVAL;
	return 0;
}

static int shm_execute(struct shm_conn *s, const struct hkv_wr *wr)
{
	uint64_t off = 0, old;
	int ret = shm_check_wr(s, wr, &off);

	if (ret)
		return ret;
	switch (wr->opcode) {
	case HKV_WR_READ:
		remote_copy(wr->local, s->map + off, wr->length);
		break;
	case HKV_WR_WRITE:
		remote_copy(s->map + off, wr->local, wr->length);
		break;
	case HKV_WR_CAS:
		old = wr->compare_add;
		__atomic_compare_exchange_n((uint64_t *)(s->map + off), &old, wr->swap, 0,
					    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		memcpy(wr->local, &old, 8);
		break;
	case HKV_WR_FAA:
		old = __atomic_fetch_add((uint64_t *)(s->map + off), wr->compare_add,
					 __ATOMIC_SEQ_CST);
		memcpy(wr->local, &old, 8);
		break;
	}
	return 0;
}

/* Has the listener shut our gate (fenced us)? */
static int shm_gate_shut(const struct shm_conn *s)
{
	return s->gate && __atomic_load_n(&s->gate->gen, __ATOMIC_SEQ_CST) != s->gen;
}

static int shm_check(struct hkv_conn *c)
{
	struct shm_conn *s = container_of(c, struct shm_conn, base);
	struct pollfd pfd = {.fd = s->sock, .events = POLLIN | POLLRDHUP};

	if (shm_gate_shut(s))
		return HKV_EDISCONNECTED;
	if (poll(&pfd, 1, 0) < 0)
		return errno == EINTR ? 0 : HKV_EDISCONNECTED;
	/* The server never sends after the accept: any event means it hung up. */
	return pfd.revents ? HKV_EDISCONNECTED : 0;
}

static void shm_complete(struct shm_conn *s, const struct hkv_wr *wr, int status)
{
	struct hkv_wc *wc = &s->cq[s->cq_tail++ & s->cq_mask];

	wc->wr_id = wr->wr_id;
	wc->opcode = wr->opcode;
	wc->status = status;
}

static int shm_post(struct hkv_conn *c, struct hkv_wr *wrs, int n)
{
	struct shm_conn *s = container_of(c, struct shm_conn, base);
	uint64_t now;
	int err = 0;

	if ((unsigned)n > s->cq_mask + 1 - (s->cq_tail - s->cq_head))
		return -EAGAIN;
	now = hkv_coarse_ns();
	if (now >= s->next_check_ns) {
		s->next_check_ns = now + SHM_CHECK_INTERVAL_NS;
		if ((err = shm_check(c)))
			return c->error = err;
	}
	if (s->gate) { /* (the gate: see the top) */
		__atomic_fetch_add(&s->gate->busy, 1, __ATOMIC_SEQ_CST);
		if (shm_gate_shut(s)) {
			__atomic_fetch_sub(&s->gate->busy, 1, __ATOMIC_SEQ_CST);
			return c->error = HKV_EDISCONNECTED;
		}
	}
	for (int i = 0; i < n; i++) {
		int status = err ? HKV_EFLUSHED : shm_execute(s, &wrs[i]);

		if (status && !err)
			err = status;
		if (status || (wrs[i].flags & HKV_WR_F_SIGNALED) ||
		    (i == n - 1 && !(wrs[i].flags & HKV_WR_F_NO_COMPLETION)))
			shm_complete(s, &wrs[i], status);
	}
	if (s->gate)
		__atomic_fetch_sub(&s->gate->busy, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static int shm_poll(struct hkv_conn *c, struct hkv_wc *wc, int max)
{
	struct shm_conn *s = container_of(c, struct shm_conn, base);
	int n = 0;

	while (n < max && s->cq_head != s->cq_tail)
		wc[n++] = s->cq[s->cq_head++ & s->cq_mask];
	return n;
}

static struct hkv_mr *shm_reg(struct hkv_conn *c, void *addr, size_t len)
{
	struct hkv_mr *mr = hkv_calloc(1, sizeof(*mr));

	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->addr = addr;
	mr->length = len;
	return mr;
}

static void shm_dereg(struct hkv_conn *c, struct hkv_mr *mr)
{
	hkv_free(mr);
}

static void shm_close(struct hkv_conn *c)
{
	struct shm_conn *s = container_of(c, struct shm_conn, base);

	if (s->map)
		munmap(s->map, s->map_len);
	if (s->gates)
		munmap(s->gates, SHM_MAX_CLIENTS * sizeof(*s->gates));
	close(s->sock);
	hkv_free(s->cq);
	hkv_free(s);
}

static const struct hkv_conn_ops shm_conn_ops = {
	.name = "shm",
	.post = shm_post,
	.poll = shm_poll,
	.reg = shm_reg,
	.dereg = shm_dereg,
	.check = shm_check,
	.close = shm_close,
};

/* Receive the accept message and, when accepted, the region fd and (a
 * server with gates) the gate table's fd (else -1) and our slot. */
static int shm_recv_accept(int sock, int timeout_ms, struct hkv_accept_msg *acc, int *fd,
			   int *gfd, struct shm_gate_info *gi)
{
	char cbuf[CMSG_SPACE(2 * sizeof(int))];
	uint8_t buf[sizeof(*acc) + sizeof(*gi)];
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf)};
	struct pollfd pfd = {.fd = sock, .events = POLLIN};
	struct cmsghdr *cm;
	size_t alen;
	ssize_t n;
	int fds[2] = {-1, -1};

	*fd = *gfd = -1;
	memset(gi, 0, sizeof(*gi));
	memset(acc, 0, sizeof(*acc));
	if (poll(&pfd, 1, timeout_ms) <= 0)
		return HKV_ETIMEDOUT;
	n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return n < 0 ? -errno : HKV_EDISCONNECTED;
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(fds, CMSG_DATA(cm),
			       cm->cmsg_len >= CMSG_LEN(2 * sizeof(int)) ? 2 * sizeof(int)
									  : sizeof(int));
	*fd = fds[0];
	*gfd = fds[1];
	memcpy(acc, buf, (size_t)n < sizeof(*acc) ? (size_t)n : sizeof(*acc));
	if ((size_t)n >= HKV_REFUSAL_LEN && acc->magic == HKV_CONN_MAGIC && acc->status < 0)
		return acc->status; /* refused: nothing else came */
	if ((size_t)n < offsetof(struct hkv_accept_msg, data) || acc->magic != HKV_CONN_MAGIC ||
	    acc->len > HKV_REPLY_MAX || (size_t)n < offsetof(struct hkv_accept_msg, data) + acc->len)
		return HKV_EPROTO;
	alen = offsetof(struct hkv_accept_msg, data) + acc->len;
	if ((size_t)n >= alen + sizeof(*gi))
		memcpy(gi, buf + alen, sizeof(*gi));
	if (acc->status)
		return HKV_EPROTO;
	if (gi->magic != SHM_GATE_MAGIC || gi->slot >= SHM_MAX_CLIENTS) {
		if (*gfd >= 0)
			close(*gfd);
		*gfd = -1; /* (a server from before gates) */
	}
	return *fd < 0 ? HKV_EPROTO : 0;
}

static int shm_map(struct shm_conn *s, int fd)
{
	const struct hkv_region_desc *r = &s->base.region;
	int prot = PROT_READ | (r->access & (HKV_ACCESS_WRITE | HKV_ACCESS_ATOMIC) ? PROT_WRITE : 0);
	void *p;

	p = mmap(NULL, r->length, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	s->map = p;
	s->map_len = r->length;
	return 0;
}

struct hkv_conn *hkv_shm_conn_open(const struct hkv_conn_cfg *cfg, struct hkv_accept_msg *acc)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct hkv_hello_msg hello;
	struct shm_conn *s;
	struct shm_gate_info gi;
	unsigned cq_size = 1;
	int fd = -1, gfd = -1, ret;

	if (!cfg->path || strlen(cfg->path) >= sizeof(sun.sun_path)) {
		errno = EINVAL;
		return NULL;
	}
	s = hkv_calloc(1, sizeof(*s));
	if (!s)
		goto err_errno;
	while (cq_size < 2u * (unsigned)cfg->sq_depth)
		cq_size <<= 1;
	s->cq = hkv_calloc(cq_size, sizeof(*s->cq));
	if (!s->cq)
		goto free_conn;
	s->cq_mask = cq_size - 1;
	s->base.ops = &shm_conn_ops;
	s->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s->sock < 0)
		goto free_cq;
	strcpy(sun.sun_path, cfg->path);
	if (connect(s->sock, (struct sockaddr *)&sun, sizeof(sun)) < 0)
		goto close_sock;
	{ /* the hello carries a ticket: only to the server's process */
		unsigned peer = 0;

		if (!hkv_peer_trusted(s->sock, cfg->trust_uid, &peer)) {
			hkv_warn("shm: %s is served by uid %u, not by the server's uid; not "
				 "connecting", cfg->path, peer);
			errno = EACCES;
			goto close_sock;
		}
	}
	hkv_hello_fill(&hello, cfg);
	if (send(s->sock, &hello, sizeof(hello), MSG_NOSIGNAL) != sizeof(hello))
		goto close_sock;
	ret = shm_recv_accept(s->sock, cfg->timeout_ms, acc, &fd, &gfd, &gi);
	if (ret)
		goto close_fd;
	s->base.region = acc->region;
	ret = shm_map(s, fd);
	if (ret)
		goto close_fd;
	if (gfd >= 0) {
		void *g = mmap(NULL, SHM_MAX_CLIENTS * sizeof(*s->gates), PROT_READ | PROT_WRITE,
			       MAP_SHARED, gfd, 0);

		if (g == MAP_FAILED) {
			ret = -errno;
			munmap(s->map, s->map_len);
			goto close_fd;
		}
		s->gates = g;
		s->gate = &s->gates[gi.slot];
		s->gen = gi.gen;
		close(gfd);
	}
	close(fd);
	return &s->base;

close_fd:
	if (fd >= 0)
		close(fd);
	if (gfd >= 0)
		close(gfd);
	close(s->sock);
	hkv_free(s->cq);
	hkv_free(s);
	errno = -ret;
	return NULL;
close_sock:
	ret = -errno;
	close(s->sock);
	errno = -ret;
free_cq:
	hkv_free(s->cq);
free_conn:
	hkv_free(s);
err_errno:
	return NULL;
}

int hkv_shm_test_busy(struct hkv_conn *c, int on)
{
	struct shm_conn *s = container_of(c, struct shm_conn, base);

	if (c->ops != &shm_conn_ops || !s->gate)
		return -EINVAL;
	if (on)
		__atomic_fetch_add(&s->gate->busy, 1, __ATOMIC_SEQ_CST);
	else
		__atomic_fetch_sub(&s->gate->busy, 1, __ATOMIC_SEQ_CST);
	return 0;
}

/* ---- listener -------------------------------------------------------------- */

struct shm_client {
	int fd;
	int accepted;
	int fencing; /* its gate shut by hkv_listener_fence, the drop waiting */
	int draining; /* dropped with a chain in flight: see shm_drop_client */
	uint64_t cookie;
	uint64_t since_ns; /* accepted at: a hello must come within SHM_HELLO_NS */
};

struct shm_listener {
	struct hkv_listener base;
	int sock, epfd, region_fd;
	int gate_fd;             /* the gate table (a memfd), one slot per fd */
	struct shm_gate *gates;  /* its mapping */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct shm_client *clients; /* indexed by fd */
	int ndraining;              /* of them, dropped with a chain in flight */
	int nclients, nconns, max_fd;
	uint64_t log_ns, log_quiet; /* "out of descriptors" lines: at most one a second */
};

static int shm_l_fd(const struct hkv_listener *l)
{
	return container_of(l, struct shm_listener, base)->epfd;
}

static int shm_l_nconns(const struct hkv_listener *l)
{
	return container_of(l, struct shm_listener, base)->nconns;
}

/* Close fd for good (its gate already shut). */
static void shm_close_client(struct shm_listener *sl, int fd)
{
	sl->clients[fd].fd = -1;
	sl->clients[fd].accepted = 0;
	sl->clients[fd].draining = 0;
	sl->nclients--;
	epoll_ctl(sl->epfd, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
}

/* A draining client is done: its chain is over (count 0) or its process
 * has closed its socket (peer_gone: exited - no thread of it runs on - so
 * its count, raised for ever, is reset: the slot is still its alone, since
 * fd stays open until here). */
static void shm_drain_end(struct shm_listener *sl, int fd, int peer_gone)
{
	if (peer_gone)
		__atomic_store_n(&sl->gates[fd].busy, 0, __ATOMIC_SEQ_CST);
	sl->ndraining--;
	hkv_listener_gone(&sl->base, sl->clients[fd].cookie);
	shm_close_client(sl, fd);
}

/*
 * Drop a connection. Its gate shuts: a live process that still maps the
 * region runs no chain from here on. One in flight (a peer stopped inside
 * shm_post: the count raised before the bump) may still finish, so a peer
 * that may be alive (peer_gone 0: a protocol error, the listener closing
 * at a lost lease) with its count raised counts as gone for the store -
 * whose sweep then takes back what it holds - only once the count reads 0
 * (shm_l_tick, hkv_listener_fence) or its socket hangs up (its process
 * exited). Until then its fd stays open, so its gate slot is not handed to
 * another, and its blocks stay out of use. A review found every drop but a
 * fence telling the store at once, with a chain still to land.
 */
static void shm_drop_client(struct shm_listener *sl, int fd, int peer_gone)
{
	struct epoll_event ev = {.events = EPOLLRDHUP, .data.fd = fd};

	__atomic_fetch_add(&sl->gates[fd].gen, 1, __ATOMIC_SEQ_CST);
	if (sl->clients[fd].accepted) {
		sl->nconns--;
		if (!peer_gone && __atomic_load_n(&sl->gates[fd].busy, __ATOMIC_SEQ_CST) &&
		    !epoll_ctl(sl->epfd, EPOLL_CTL_MOD, fd, &ev)) {
			sl->clients[fd].accepted = 0;
			sl->clients[fd].draining = 1;
			sl->ndraining++;
			hkv_warn("shm: a client dropped inside a chain; it counts as gone once "
				 "the chain is over or its process has exited");
			return;
		}
		hkv_listener_gone(&sl->base, sl->clients[fd].cookie);
	}
	shm_close_client(sl, fd);
}

/* The connection that has waited longest without a hello, or -1. */
static int shm_oldest_silent(const struct shm_listener *sl)
{
	int best = -1;

	for (int fd = 0; fd < SHM_MAX_CLIENTS; fd++)
		if (sl->clients[fd].fd >= 0 && !sl->clients[fd].accepted &&
		    !sl->clients[fd].draining &&
		    (best < 0 || sl->clients[fd].since_ns < sl->clients[best].since_ns))
			best = fd;
	return best;
}

static void shm_log_limited(struct shm_listener *sl, const char *what)
{
	uint64_t now = hkv_now_ns();

	if (now - sl->log_ns < 1000000000ull) {
		sl->log_quiet++;
		return;
	}
	hkv_warn("shm: %s (and %llu more since the last such line)", what,
		 (unsigned long long)sl->log_quiet);
	sl->log_ns = now;
	sl->log_quiet = 0;
}

static void shm_accept_one(struct shm_listener *sl)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
	int fd = accept4(sl->sock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
		/* out of descriptors: make room by dropping the connection that
		 * has been silent longest (a real client says hello at once) */
		int old = shm_oldest_silent(sl);

		shm_log_limited(sl, "out of file descriptors; dropping the longest silent "
				    "connection");
		if (old < 0)
			return;
		shm_drop_client(sl, old, 0);
		fd = accept4(sl->sock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	}
	if (fd < 0)
		return;
	if (fd >= SHM_MAX_CLIENTS) {
		shm_log_limited(sl, "too many clients, refusing connection");
		close(fd);
		return;
	}
	ev.data.fd = fd;
	if (epoll_ctl(sl->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		close(fd);
		return;
	}
	sl->clients[fd].fd = fd;
	sl->clients[fd].accepted = 0;
	sl->clients[fd].fencing = 0;
	sl->clients[fd].draining = 0;
	sl->clients[fd].since_ns = hkv_now_ns();
	sl->nclients++;
}

/* Once a second: connections that sent no hello within SHM_HELLO_NS go. */
static int shm_l_tick(struct hkv_listener *l)
{
	struct shm_listener *sl = container_of(l, struct shm_listener, base);
	uint64_t now = hkv_now_ns();
	int dropped = 0;

	for (int fd = 0; fd < SHM_MAX_CLIENTS; fd++)
		if (sl->clients[fd].fd >= 0 && !sl->clients[fd].accepted &&
		    !sl->clients[fd].draining && now - sl->clients[fd].since_ns > SHM_HELLO_NS) {
			shm_drop_client(sl, fd, 0);
			dropped++;
		}
	if (dropped)
		shm_log_limited(sl, "dropped connections that sent no hello within 2 s");
	for (int fd = 0; sl->ndraining && fd < SHM_MAX_CLIENTS; fd++) /* (shm_drop_client) */
		if (sl->clients[fd].draining &&
		    !__atomic_load_n(&sl->gates[fd].busy, __ATOMIC_SEQ_CST))
			shm_drain_end(sl, fd, 0);
	return 0;
}

/* The fd a client gets: the memfd itself, or a read-only reopen of it. */
static int shm_fd_for(struct shm_listener *sl, uint32_t access)
{
	char path[64];

	if (access & (HKV_ACCESS_WRITE | HKV_ACCESS_ATOMIC))
		return dup(sl->region_fd);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", sl->region_fd);
	return open(path, O_RDONLY | O_CLOEXEC);
}

static int shm_send_accept(int fd, const struct hkv_accept_msg *acc, int region_fd,
			   int gate_fd, const struct shm_gate_info *gi)
{
	char cbuf[CMSG_SPACE(2 * sizeof(int))] = {0};
	struct iovec iov[2] = {{.iov_base = (void *)acc,
				.iov_len = acc->status ? HKV_REFUSAL_LEN
						       : offsetof(struct hkv_accept_msg, data) +
								 acc->len},
			       {.iov_base = (void *)gi, .iov_len = sizeof(*gi)}};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = region_fd >= 0 ? 2 : 1};
	struct cmsghdr *cm;
	int fds[2] = {region_fd, gate_fd};

	if (region_fd >= 0) {
		msg.msg_control = cbuf;
		msg.msg_controllen = sizeof(cbuf);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, sizeof(fds));
	}
	return sendmsg(fd, &msg, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

static void shm_handle_hello(struct shm_listener *sl, int fd)
{
	struct hkv_hello_msg hello;
	struct hkv_accept_msg acc;
	struct shm_gate_info gi = {SHM_GATE_MAGIC, (uint32_t)fd, 0};
	uint32_t access;
	int rfd = -1, admitted;
	ssize_t n;

	n = recv(fd, &hello, sizeof(hello), 0);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		shm_drop_client(sl, fd, 1);
		return;
	}
	hkv_listener_answer(&sl->base, &hello, (size_t)n, &acc, &access, &sl->clients[fd].cookie);
	admitted = !acc.status;
	if (!acc.status && (rfd = shm_fd_for(sl, access)) < 0)
		acc.status = -errno;
	/* (a fresh generation for the slot: whoever had this fd before stays shut) */
	gi.gen = __atomic_add_fetch(&sl->gates[fd].gen, 1, __ATOMIC_SEQ_CST);
	if (shm_send_accept(fd, &acc, acc.status ? -1 : rfd, sl->gate_fd, &gi) || acc.status) {
		if (acc.status)
			hkv_warn("shm: refused a client: %s", hkv_strerror(acc.status));
		if (admitted) /* counted by on_connect, never connected: its place back */
			hkv_listener_gone(&sl->base, sl->clients[fd].cookie);
		shm_drop_client(sl, fd, 0);
	} else {
		sl->clients[fd].accepted = 1;
		sl->nconns++;
	}
	if (rfd >= 0)
		close(rfd);
}

static int shm_l_dispatch(struct hkv_listener *l)
{
	struct shm_listener *sl = container_of(l, struct shm_listener, base);
	struct epoll_event evs[32];
	int n = epoll_wait(sl->epfd, evs, 32, 0);

	for (int i = 0; i < n; i++) {
		int fd = evs[i].data.fd;

		if (fd == sl->sock)
			shm_accept_one(sl);
		else if (sl->clients[fd].draining) /* (it listens for hangups only) */
			shm_drain_end(sl, fd, 1);
		else if (!sl->clients[fd].accepted && (evs[i].events & EPOLLIN))
			shm_handle_hello(sl, fd);
		else /* hangup (its process closed it: exited), or data after accept */
			shm_drop_client(sl, fd,
					!!(evs[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)));
	}
	return n < 0 && errno != EINTR ? -errno : 0;
}

static int shm_l_fence(struct hkv_listener *l, uint64_t cookie)
{
	struct shm_listener *sl = container_of(l, struct shm_listener, base);

	for (int fd = 0; fd < SHM_MAX_CLIENTS; fd++) {
		struct shm_client *c = &sl->clients[fd];

		if (c->fd < 0 || !c->accepted || c->cookie != cookie)
			continue;
		if (!c->fencing) {
			c->fencing = 1;
			__atomic_fetch_add(&sl->gates[fd].gen, 1, __ATOMIC_SEQ_CST);
		}
		if (__atomic_load_n(&sl->gates[fd].busy, __ATOMIC_SEQ_CST))
			return -EINPROGRESS; /* a chain in flight (a peer stopped in it?) */
		shm_drop_client(sl, fd, 0);
		return 0;
	}
	for (int fd = 0; sl->ndraining && fd < SHM_MAX_CLIENTS; fd++) { /* dropped already */
		if (!sl->clients[fd].draining || sl->clients[fd].cookie != cookie)
			continue;
		if (__atomic_load_n(&sl->gates[fd].busy, __ATOMIC_SEQ_CST))
			return -EINPROGRESS;
		shm_drain_end(sl, fd, 0);
		return 0;
	}
	return 0;
}

static void shm_l_destroy(struct hkv_listener *l)
{
	struct shm_listener *sl = container_of(l, struct shm_listener, base);

	for (int fd = 0; fd < SHM_MAX_CLIENTS; fd++)
		if (sl->clients[fd].fd >= 0 && !sl->clients[fd].draining)
			shm_drop_client(sl, fd, 0);
	/* (a client still inside a chain is never told gone: its blocks stay
	 * out of use until the server restarts - memory, never another's item) */
	if (sl->ndraining)
		hkv_warn("shm: %d client%s stopped inside a chain as the listener closes; what "
			 "they hold stays out of use", sl->ndraining, sl->ndraining == 1 ? "" : "s");
	for (int fd = 0; fd < SHM_MAX_CLIENTS; fd++)
		if (sl->clients[fd].fd >= 0)
			shm_close_client(sl, fd);
	if (sl->gates)
		munmap(sl->gates, SHM_MAX_CLIENTS * sizeof(*sl->gates));
	if (sl->gate_fd >= 0)
		close(sl->gate_fd);
	close(sl->epfd);
	close(sl->sock);
	unlink(sl->path);
	hkv_free(sl->clients);
	hkv_free(sl);
}

static const struct hkv_listener_ops shm_listener_ops = {
	.fd = shm_l_fd,
	.dispatch = shm_l_dispatch,
	.nconns = shm_l_nconns,
	.destroy = shm_l_destroy,
	.tick = shm_l_tick,
	.fence = shm_l_fence,
};

struct hkv_listener *hkv_shm_listener_create(const struct hkv_listener_cfg *cfg)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct epoll_event ev = {.events = EPOLLIN};
	struct shm_listener *sl;
	int err;

	if (!cfg->path || strlen(cfg->path) >= sizeof(sun.sun_path) || cfg->region_fd < 0) {
		errno = EINVAL;
		return NULL;
	}
	sl = hkv_calloc(1, sizeof(*sl));
	if (!sl)
		return NULL;
	sl->gate_fd = -1;
	sl->clients = hkv_malloc(SHM_MAX_CLIENTS * sizeof(*sl->clients));
	if (!sl->clients)
		goto free_listener;
	for (int i = 0; i < SHM_MAX_CLIENTS; i++) {
		sl->clients[i].fd = -1;
		sl->clients[i].draining = 0;
	}
	sl->base.ops = &shm_listener_ops;
	sl->base.on_connect = cfg->on_connect;
	sl->base.on_disconnect = cfg->on_disconnect;
	sl->base.arg = cfg->arg;
	sl->base.region.base = (uint64_t)(uintptr_t)cfg->region;
	sl->base.region.length = cfg->region_len;
	sl->base.region.access = HKV_ACCESS_ALL;
	if (getrandom(&sl->base.region.rkey, sizeof(uint32_t), 0) != sizeof(uint32_t))
		goto free_clients;
	sl->region_fd = cfg->region_fd;
	sl->gate_fd = memfd_create("hatchkv-gates", MFD_CLOEXEC);
	if (sl->gate_fd < 0 || ftruncate(sl->gate_fd, SHM_MAX_CLIENTS * sizeof(*sl->gates)) < 0 ||
	    (sl->gates = mmap(NULL, SHM_MAX_CLIENTS * sizeof(*sl->gates), PROT_READ | PROT_WRITE,
			      MAP_SHARED, sl->gate_fd, 0)) == MAP_FAILED) {
		sl->gates = NULL;
		goto free_clients;
	}
	strcpy(sl->path, cfg->path);
	strcpy(sun.sun_path, cfg->path);
	sl->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (sl->sock < 0)
		goto free_clients;
	unlink(cfg->path);
	if (bind(sl->sock, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(sl->sock, 128) < 0)
		goto close_sock;
	sl->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sl->epfd < 0)
		goto unlink_path;
	ev.data.fd = sl->sock;
	if (epoll_ctl(sl->epfd, EPOLL_CTL_ADD, sl->sock, &ev) < 0)
		goto close_epoll;
	return &sl->base;

close_epoll:
	err = errno;
	close(sl->epfd);
	errno = err;
unlink_path:
	unlink(cfg->path);
close_sock:
	err = errno;
	close(sl->sock);
	errno = err;
free_clients:
	err = errno;
	if (sl->gates)
		munmap(sl->gates, SHM_MAX_CLIENTS * sizeof(*sl->gates));
	if (sl->gate_fd >= 0)
		close(sl->gate_fd);
	errno = err;
free_listener:
	hkv_free(sl->clients);
	hkv_free(sl);
	return NULL;
}
