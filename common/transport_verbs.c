/*
 * transport_verbs.c - rdma-core backend of transport.h.
 *
 * One RDMA lifecycle, written once (rc_pingpong/rping order):
 *   client:   event channel -> cm id -> resolve addr/route -> PD -> CQ -> QP
 *             -> rdma_connect (hello in private data) -> ESTABLISHED (accept
 *             message in private data);  teardown in exact reverse.
 *   listener: event channel -> cm id -> bind/listen -> PD -> MR(region) -> CQ;
 *             per CONNECT_REQUEST a QP on the child id and rdma_accept.
 * The listener posts nothing on the data path: every data-path operation is
 * one-sided, so the server's CPU sees only connection events and, with
 * memory windows, one bind per grant (a connection's first rights and each
 * segment it claims).
 *
 * Memory windows (cfg->windows on a device with type-2B windows): the region
 * is registered with local rights and MW_BIND only, so no MR rkey opens
 * anything remotely. Every right a client has is a type-2 window bound
 * (IBV_WR_BIND_MW, posted on that client's own queue pair and waited for)
 * over exactly the bytes granted: the NIC accepts such an rkey only on the
 * queue pair it was bound on, so it is useless to any other client, and the
 * windows are deallocated when the connection goes. A window is bound over
 * an MR of exactly its own range (the whole region for base rights, one MR
 * per segment, registered at its first grant): Soft-RoCE checks a window's
 * accesses against its MR's bounds, not the window's (rxe_resp.c,
 * check_rkey -> mr_check_range), so only an MR as small as the window keeps
 * the bounds there too.
 *
 * Posting: a chain becomes one linked ibv_send_wr list and one
 * ibv_post_send (one doorbell). Only the WRs asked for, and always the last,
 * are signaled; the send queue room taken by each signaled WR's unsignaled
 * predecessors is returned when its completion is reaped (RC completes in
 * order). Small WRITEs go inline.
 */
#include "common/transport_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common/hkv_alloc.h"
#include "common/log.h"

#define VERBS_ACK_TIMEOUT 15 /* 4.096 us * 2^15 = 134 ms per try, 6 retries */
/* The listener's QPs carry only keepalives: 2.1 s per try, so a peer is given
 * up after ~15 s without an answer, and a shorter outage is ridden out. */
#define VERBS_KEEPALIVE_ACK_TIMEOUT 19
#define VERBS_POLL_BATCH  16
#define VERBS_RD_ATOMIC   16
#define VERBS_L_CQ        4096 /* listener CQ: binds (one at a time) + keepalives */
#define VERBS_L_PROBES    (VERBS_L_CQ / 2) /* keepalives in flight at most */

struct verbs_conn {
	struct hkv_conn base;
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint32_t max_inline;
	int connected;
	int sq_depth; /* room is counted in transport.c (struct hkv_conn) */
	struct ibv_send_wr *wrs;
	struct ibv_sge *sges;
};

static int wc_status_to_err(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
		return HKV_EREMOTE_ACCESS;
	case IBV_WC_REM_INV_REQ_ERR:
		return HKV_EREMOTE_INVAL;
	case IBV_WC_WR_FLUSH_ERR:
		return HKV_EFLUSHED;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_REM_ABORT_ERR:
		return HKV_EDISCONNECTED;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return -EFAULT;
	default:
		return HKV_ETRANSPORT;
	}
}

static const enum ibv_wr_opcode wr_opcodes[HKV_WR_NOPS] = {
	[HKV_WR_READ] = IBV_WR_RDMA_READ,
	[HKV_WR_WRITE] = IBV_WR_RDMA_WRITE,
	[HKV_WR_CAS] = IBV_WR_ATOMIC_CMP_AND_SWP,
	[HKV_WR_FAA] = IBV_WR_ATOMIC_FETCH_AND_ADD,
};

static uint8_t wc_opcode(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_RDMA_READ:
		return HKV_WR_READ;
	case IBV_WC_COMP_SWAP:
		return HKV_WR_CAS;
	case IBV_WC_FETCH_ADD:
		return HKV_WR_FAA;
	default:
		return HKV_WR_WRITE;
	}
}

/* Wait for the next cm event on ec, at most timeout_ms; must be acked. */
static int cm_wait_event(struct rdma_event_channel *ec, int timeout_ms,
			 struct rdma_cm_event **ev)
{
	struct pollfd pfd = {.fd = ec->fd, .events = POLLIN};
	int n = poll(&pfd, 1, timeout_ms);

	if (n == 0)
		return HKV_ETIMEDOUT;
	if (n < 0 || rdma_get_cm_event(ec, ev))
		return -errno;
	return 0;
}

static int cm_expect(struct rdma_event_channel *ec, int timeout_ms, enum rdma_cm_event_type want,
		     struct hkv_accept_msg *acc)
{
	struct rdma_cm_event *ev;
	int ret = cm_wait_event(ec, timeout_ms, &ev);
	size_t plen;

	if (ret)
		return ret;
	if (ev->event == want) {
		ret = 0;
		if (acc) {
			plen = ev->param.conn.private_data_len;
			memset(acc, 0, sizeof(*acc));
			memcpy(acc, ev->param.conn.private_data,
			       plen < sizeof(*acc) ? plen : sizeof(*acc));
			if (plen < offsetof(struct hkv_accept_msg, data) ||
			    acc->magic != HKV_CONN_MAGIC || acc->len > HKV_REPLY_MAX)
				ret = HKV_EPROTO;
		}
	} else if (ev->event == RDMA_CM_EVENT_REJECTED) {
		const struct hkv_accept_msg *rej = ev->param.conn.private_data;

		plen = ev->param.conn.private_data_len;
		if (acc) { /* what came with the refusal, as it came (for diagnostics) */
			memset(acc, 0, sizeof(*acc));
			if (rej)
				memcpy(acc, rej, plen < sizeof(*acc) ? plen : sizeof(*acc));
		}
		ret = -ECONNREFUSED;
		if (rej && ev->param.conn.private_data_len >= 8 && rej->magic == HKV_CONN_MAGIC &&
		    rej->status < 0)
			ret = rej->status;
	} else {
		hkv_debug("verbs: expected %s, got %s (status %d)", rdma_event_str(want),
			  rdma_event_str(ev->event), ev->status);
		ret = ev->event == RDMA_CM_EVENT_ADDR_ERROR || ev->event == RDMA_CM_EVENT_ROUTE_ERROR
			      ? HKV_ENODEV
			      : -ECONNREFUSED;
	}
	rdma_ack_cm_event(ev);
	return ret;
}

static int verbs_resolve(struct verbs_conn *v, const struct hkv_conn_cfg *cfg)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai;
	int ret;

	if (!cfg->host || !cfg->port)
		return -EINVAL;
	if (getaddrinfo(cfg->host, cfg->port, &hints, &ai))
		return -EHOSTUNREACH;
	ret = rdma_resolve_addr(v->id, NULL, ai->ai_addr, cfg->timeout_ms) ? -errno : 0;
	freeaddrinfo(ai);
	if (!ret)
		ret = cm_expect(v->ec, cfg->timeout_ms, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	if (!ret && rdma_resolve_route(v->id, cfg->timeout_ms))
		ret = -errno;
	if (!ret)
		ret = cm_expect(v->ec, cfg->timeout_ms, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	return ret;
}

static int verbs_create_qp(struct verbs_conn *v, int depth)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = v->cq,
		.recv_cq = v->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = (uint32_t)depth,
			.max_recv_wr = 1,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = HKV_INLINE_MAX},
	};

	if (rdma_create_qp(v->id, v->pd, &attr)) {
		attr.cap.max_inline_data = 0; /* some devices have no inline support */
		if (rdma_create_qp(v->id, v->pd, &attr))
			return -errno;
	}
	v->max_inline = attr.cap.max_inline_data;
	return 0;
}

static int verbs_connect(struct verbs_conn *v, const struct hkv_conn_cfg *cfg,
			 struct hkv_accept_msg *acc)
{
	struct ibv_device_attr dattr;
	struct hkv_hello_msg hello;
	struct rdma_conn_param param = {
		.private_data = &hello,
		.private_data_len = sizeof(hello),
		/* 6, not 7: Soft-RoCE takes 7 as "retry forever" (rxe_comp.c), so a
		 * peer that vanished would never fail a request, here or in the
		 * server's keepalives (its QP takes this count from our request) */
		.retry_count = 6,
		.rnr_retry_count = 7,
	};

	if (ibv_query_device(v->id->verbs, &dattr))
		return -errno;
	param.initiator_depth = (uint8_t)(dattr.max_qp_init_rd_atom < VERBS_RD_ATOMIC
						  ? dattr.max_qp_init_rd_atom
						  : VERBS_RD_ATOMIC);
	param.responder_resources = 0;
	hkv_hello_fill(&hello, cfg);
	if (rdma_connect(v->id, &param))
		return -errno;
	return cm_expect(v->ec, cfg->timeout_ms, RDMA_CM_EVENT_ESTABLISHED, acc);
}

static void verbs_teardown(struct verbs_conn *v)
{
	if (v->connected)
		rdma_disconnect(v->id);
	if (v->id && v->id->qp)
		rdma_destroy_qp(v->id);
	if (v->cq)
		ibv_destroy_cq(v->cq);
	if (v->pd)
		ibv_dealloc_pd(v->pd);
	if (v->id)
		rdma_destroy_id(v->id);
	if (v->ec)
		rdma_destroy_event_channel(v->ec);
	hkv_free(v->wrs);
	hkv_free(v->sges);
	hkv_free(v);
}

static int verbs_post(struct hkv_conn *c, struct hkv_wr *wrs, int n)
{
	struct verbs_conn *v = container_of(c, struct verbs_conn, base);
	struct ibv_send_wr *bad;
	int ret;

	if (n > v->sq_depth)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		const struct hkv_wr *w = &wrs[i];
		struct ibv_send_wr *iw = &v->wrs[i];
		struct ibv_sge *sg = &v->sges[i];
		uint32_t len = w->opcode >= HKV_WR_CAS ? 8 : w->length;

		if (w->opcode >= HKV_WR_NOPS)
			return -EINVAL;
		memset(iw, 0, sizeof(*iw));
		sg->addr = (uintptr_t)w->local;
		sg->length = len;
		sg->lkey = w->mr ? w->mr->lkey : 0;
		iw->wr_id = w->wr_id;
		iw->sg_list = sg;
		iw->num_sge = len ? 1 : 0;
		iw->opcode = wr_opcodes[w->opcode];
		iw->next = i + 1 < n ? &v->wrs[i + 1] : NULL;
		if (w->flags & HKV_WR_F_FENCE)
			iw->send_flags |= IBV_SEND_FENCE;
		if (w->opcode == HKV_WR_WRITE && len <= v->max_inline)
			iw->send_flags |= IBV_SEND_INLINE;
		else if (!w->mr && len)
			return -EFAULT;
		if (w->opcode >= HKV_WR_CAS) {
			iw->wr.atomic.remote_addr = w->remote_addr;
			iw->wr.atomic.rkey = w->rkey;
			iw->wr.atomic.compare_add = w->compare_add;
			iw->wr.atomic.swap = w->swap;
		} else {
			iw->wr.rdma.remote_addr = w->remote_addr;
			iw->wr.rdma.rkey = w->rkey;
		}
		if ((i == n - 1 && !(w->flags & HKV_WR_F_NO_COMPLETION)) ||
		    (w->flags & HKV_WR_F_SIGNALED))
			iw->send_flags |= IBV_SEND_SIGNALED;
	}
	ret = ibv_post_send(v->id->qp, v->wrs, &bad);
	if (ret)
		hkv_debug("verbs: ibv_post_send: %s (wr %d of %d)", strerror(ret), (int)(bad - v->wrs), n);
	if (ret)
		return ret == ENOMEM ? -EAGAIN : -ret;
	return 0;
}

static int verbs_poll(struct hkv_conn *c, struct hkv_wc *wc, int max)
{
	struct verbs_conn *v = container_of(c, struct verbs_conn, base);
	struct ibv_wc iwc[VERBS_POLL_BATCH];
	int n = ibv_poll_cq(v->cq, max < VERBS_POLL_BATCH ? max : VERBS_POLL_BATCH, iwc);

	if (n < 0)
		return HKV_ETRANSPORT;
	for (int i = 0; i < n; i++) {
		wc[i].wr_id = iwc[i].wr_id;
		wc[i].status = wc_status_to_err(iwc[i].status);
		wc[i].opcode = wc[i].status ? HKV_WR_NOPS : wc_opcode(iwc[i].opcode);
		if (wc[i].status)
			hkv_debug("verbs: completion error %s", ibv_wc_status_str(iwc[i].status));
	}
	return n;
}

/* Between polls of an idle CQ: did the connection manager report a loss? */
static int verbs_check(struct hkv_conn *c)
{
	struct verbs_conn *v = container_of(c, struct verbs_conn, base);
	struct rdma_cm_event *ev;
	int ret = 0;

	while (!rdma_get_cm_event(v->ec, &ev)) {
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
		    ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			v->connected = 0;
			ret = HKV_EDISCONNECTED;
		}
		rdma_ack_cm_event(ev);
	}
	return ret;
}

static struct hkv_mr *verbs_reg(struct hkv_conn *c, void *addr, size_t len)
{
	struct verbs_conn *v = container_of(c, struct verbs_conn, base);
	struct hkv_mr *mr = hkv_calloc(1, sizeof(*mr));
	struct ibv_mr *imr;

	if (!mr)
		return NULL;
	imr = ibv_reg_mr(v->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
	if (!imr) {
		int err = errno;

		hkv_free(mr);
		errno = err;
		return NULL;
	}
	mr->addr = addr;
	mr->length = len;
	mr->lkey = imr->lkey;
	mr->impl = imr;
	return mr;
}

static void verbs_dereg(struct hkv_conn *c, struct hkv_mr *mr)
{
	ibv_dereg_mr(mr->impl);
	hkv_free(mr);
}

static void verbs_close(struct hkv_conn *c)
{
	verbs_teardown(container_of(c, struct verbs_conn, base));
}

static const struct hkv_conn_ops verbs_conn_ops = {
	.name = "verbs",
	.post = verbs_post,
	.poll = verbs_poll,
	.reg = verbs_reg,
	.dereg = verbs_dereg,
	.check = verbs_check,
	.close = verbs_close,
};

struct hkv_conn *hkv_verbs_conn_open(const struct hkv_conn_cfg *cfg, struct hkv_accept_msg *acc)
{
	struct verbs_conn *v = hkv_calloc(1, sizeof(*v));
	uint8_t tmo = VERBS_ACK_TIMEOUT;
	int ret = -ENOMEM;

	if (!v)
		goto fail;
	v->base.ops = &verbs_conn_ops;
	v->sq_depth = cfg->sq_depth;
	v->wrs = hkv_calloc((size_t)v->sq_depth, sizeof(*v->wrs));
	v->sges = hkv_calloc((size_t)v->sq_depth, sizeof(*v->sges));
	if (!v->wrs || !v->sges)
		goto teardown;
	ret = HKV_ENODEV;
	v->ec = rdma_create_event_channel();
	if (!v->ec || rdma_create_id(v->ec, &v->id, v, RDMA_PS_TCP))
		goto teardown;
	ret = verbs_resolve(v, cfg);
	if (ret)
		goto teardown;
	rdma_set_option(v->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo));
	ret = -errno;
	if (!(v->pd = ibv_alloc_pd(v->id->verbs)))
		goto teardown;
	if (!(v->cq = ibv_create_cq(v->id->verbs, v->sq_depth, NULL, NULL, 0)))
		goto teardown;
	ret = verbs_create_qp(v, v->sq_depth);
	if (ret)
		goto teardown;
	ret = verbs_connect(v, cfg, acc);
	if (ret)
		goto teardown;
	if (acc->status) {
		ret = acc->status;
		goto teardown;
	}
	v->connected = 1;
	v->base.region = acc->region;
	fcntl(v->ec->fd, F_SETFL, fcntl(v->ec->fd, F_GETFL) | O_NONBLOCK);
	return &v->base;

teardown:
	verbs_teardown(v);
fail:
	errno = ret < 0 ? -ret : EIO;
	return NULL;
}

/* ---- listener -------------------------------------------------------------- */

struct verbs_window {
	uint64_t off, len;
	uint32_t access, rkey;
	struct ibv_mw *mw;
	uint64_t bind_wr; /* its bind is in flight (wr_id), 0 once it completed */
	int status;       /* the bind's outcome once completed: 0 or HKV_E* */
};

struct verbs_bind_mr {
	uint64_t off, len;
	struct ibv_mr *mr;
};

struct verbs_child {
	struct rdma_cm_id *id;
	int established;
	int dead;           /* a keepalive failed: close it at the next tick */
	uint64_t probe_seq; /* wr_id of the keepalive in flight, 0 if none */
	uint64_t probe_ns;  /* when the last one was posted */
	uint64_t cookie;
	struct verbs_window *win;
	uint32_t nwin, capwin;
	struct verbs_child *next;
};

/* The responder side of an owner's own connection (hkv_listener_loopback). */
struct verbs_loop {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *lid, *child;
	struct ibv_cq *cq; /* the responder QP's: its window's bind, nothing else */
	struct ibv_mw *mw;
	struct verbs_loop *next;
};

struct verbs_listener {
	struct hkv_listener base;
	struct verbs_loop *loops;
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_context *ctx;
	struct ibv_context **devs; /* only when bound to the wildcard address */
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mrs[HKV_ACCESS_ALL + 1]; /* region registered per rights granted */
	struct ibv_mr *wmr; /* windows: the region with local rights and MW_BIND only */
	struct verbs_bind_mr *bmrs; /* windows: MRs of exactly a granted range */
	uint32_t nbmrs, capbmrs;
	uint64_t wr_seq; /* wr_ids of the listener's own posts: binds, keepalives */
	int probes;      /* keepalives in flight */
	int keepalive_ms;
	int nwindows;
	void *region;
	size_t region_len;
	uint8_t max_rd_atom;
	struct verbs_child *children;
	int nconns;
};

static int access_to_ibv(uint32_t a)
{
	return IBV_ACCESS_LOCAL_WRITE | (a & HKV_ACCESS_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (a & HKV_ACCESS_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (a & HKV_ACCESS_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

static struct ibv_mr *verbs_l_mr(struct verbs_listener *vl, uint32_t access)
{
	access &= HKV_ACCESS_ALL;
	if (!vl->mrs[access])
		vl->mrs[access] = ibv_reg_mr(vl->pd, vl->region, vl->region_len,
					     access_to_ibv(access));
	return vl->mrs[access];
}

static int verbs_l_fd(const struct hkv_listener *l)
{
	return container_of(l, struct verbs_listener, base)->ec->fd;
}

static int verbs_l_nconns(const struct hkv_listener *l)
{
	return container_of(l, struct verbs_listener, base)->nconns;
}

static void verbs_child_forget(struct verbs_listener *vl, struct rdma_cm_id *id)
{
	for (struct verbs_child **pp = &vl->children; *pp; pp = &(*pp)->next) {
		struct verbs_child *ch = *pp;

		if (ch->id != id)
			continue;
		*pp = ch->next;
		if (ch->established)
			vl->nconns--;
		if (ch->probe_seq) /* its completion (flushed) will match no child */
			vl->probes--;
		for (uint32_t i = 0; i < ch->nwin; i++) /* its rkeys die here */
			ibv_dealloc_mw(ch->win[i].mw);
		vl->nwindows -= (int)ch->nwin;
		hkv_free(ch->win);
		rdma_destroy_qp(id); /* from here on, nothing of this peer lands */
		rdma_destroy_id(id);
		hkv_listener_gone(&vl->base, ch->cookie);
		hkv_free(ch);
		return;
	}
}

/* Refuse a connect request with nothing but the status. If the listener
 * had admitted it (on_connect counted it), its place is given back. */
static void verbs_l_reject(struct verbs_listener *vl, struct rdma_cm_id *id,
			   const struct hkv_accept_msg *acc, int admitted, uint64_t cookie)
{
	struct hkv_accept_msg no = {.magic = HKV_CONN_MAGIC, .status = acc->status};

	hkv_warn("verbs: refused a client: %s", hkv_strerror(acc->status));
	rdma_reject(id, &no, HKV_REFUSAL_LEN);
	if (admitted)
		hkv_listener_gone(&vl->base, cookie);
}

/* CONNECT_REQUEST: returns the child to keep, or NULL when rejected. */
static struct verbs_child *verbs_l_request(struct verbs_listener *vl, struct rdma_cm_event *ev)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = vl->cq,
		.recv_cq = vl->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct rdma_conn_param param = {0};
	struct hkv_accept_msg acc;
	struct verbs_child *ch;
	struct ibv_mr *mr = NULL;
	uint64_t cookie = 0;
	uint32_t access;
	uint8_t ack_tmo = VERBS_KEEPALIVE_ACK_TIMEOUT;
	int admitted;

	hkv_listener_answer(&vl->base, ev->param.conn.private_data,
			    ev->param.conn.private_data_len, &acc, &access, &cookie);
	admitted = !acc.status;
	if (!acc.status && ev->id->verbs != vl->ctx)
		acc.status = HKV_ENODEV;
	if (!acc.status && !vl->wmr && !(mr = verbs_l_mr(vl, access)))
		acc.status = -ENOMEM;
	if (acc.status) {
		verbs_l_reject(vl, ev->id, &acc, admitted, cookie);
		return NULL;
	}
	acc.region.rkey = vl->wmr ? 0 : mr->rkey; /* windows: rights come by grant */
	ch = hkv_calloc(1, sizeof(*ch));
	if (!ch || rdma_create_qp(ev->id, vl->pd, &qa)) {
		hkv_free(ch);
		acc.status = -ENOMEM;
		verbs_l_reject(vl, ev->id, &acc, admitted, cookie);
		return NULL;
	}
	ch->id = ev->id;
	ch->cookie = cookie;
	ch->probe_ns = hkv_now_ns();
	param.private_data = &acc;
	param.private_data_len = (uint8_t)(offsetof(struct hkv_accept_msg, data) + acc.len);
	/* The request event reports the peer's initiator depth as our responder side. */
	param.responder_resources = ev->param.conn.responder_resources < vl->max_rd_atom
					    ? ev->param.conn.responder_resources
					    : vl->max_rd_atom;
	param.initiator_depth = 0;
	/* keepalives: a peer that stopped answering fails after ~15 s */
	if (rdma_set_option(ev->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_tmo,
			    sizeof(ack_tmo)))
		hkv_debug("verbs: ack timeout on a client's QP: %s", strerror(errno));
	if (rdma_accept(ev->id, &param)) {
		hkv_warn("verbs: rdma_accept: %s", strerror(errno));
		rdma_destroy_qp(ev->id);
		hkv_free(ch);
		hkv_listener_gone(&vl->base, cookie); /* admitted, never connected */
		return NULL;
	}
	ch->next = vl->children;
	vl->children = ch;
	return ch;
}

static int verbs_l_dispatch(struct hkv_listener *l)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	struct rdma_cm_event *ev;

	for (int budget = 32; budget-- && !rdma_get_cm_event(vl->ec, &ev);) {
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type type = ev->event;
		struct verbs_child *ch = NULL;

		if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
			ch = verbs_l_request(vl, ev);
		rdma_ack_cm_event(ev);
		switch (type) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			if (!ch)
				rdma_destroy_id(id);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			for (ch = vl->children; ch; ch = ch->next)
				if (ch->id == id && !ch->established) {
					ch->established = 1;
					vl->nconns++;
				}
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_REJECTED:
			rdma_disconnect(id);
			verbs_child_forget(vl, id);
			break;
		default:
			break;
		}
	}
	return 0;
}

/* ---- memory windows ---------------------------------------------------------- */

static struct verbs_child *verbs_child_by_cookie(struct verbs_listener *vl, uint64_t cookie)
{
	for (struct verbs_child *ch = vl->children; ch; ch = ch->next)
		if (ch->cookie == cookie)
			return ch;
	return NULL;
}

static int access_to_mw(uint32_t a)
{
	return (a & HKV_ACCESS_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (a & HKV_ACCESS_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (a & HKV_ACCESS_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

/* The MR to bind a window over [off, off+len) on: one of exactly that range. */
static struct ibv_mr *verbs_bind_mr(struct verbs_listener *vl, uint64_t off, uint64_t len)
{
	struct ibv_mr *mr;

	if (off == 0 && len == vl->region_len)
		return vl->wmr;
	for (uint32_t i = 0; i < vl->nbmrs; i++)
		if (vl->bmrs[i].off == off && vl->bmrs[i].len == len)
			return vl->bmrs[i].mr;
	if (vl->nbmrs == vl->capbmrs) {
		uint32_t cap = vl->capbmrs ? 2 * vl->capbmrs : 16;
		void *p = hkv_realloc(vl->bmrs, cap * sizeof(*vl->bmrs));

		if (!p)
			return NULL;
		vl->bmrs = p;
		vl->capbmrs = cap;
	}
	mr = ibv_reg_mr(vl->pd, (uint8_t *)vl->region + off, len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (mr)
		vl->bmrs[vl->nbmrs++] = (struct verbs_bind_mr){.off = off, .len = len, .mr = mr};
	return mr;
}

/*
 * Reap the listener's CQ (it carries only its own posts: binds and
 * keepalives). A bind's completion settles its window (verbs_l_grant reads
 * the outcome), a keepalive's its child (an error marks it dead). 0, or <0
 * on a CQ error.
 */
static int verbs_l_reap(struct verbs_listener *vl)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int n;

	while ((n = ibv_poll_cq(vl->cq, VERBS_POLL_BATCH, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			for (struct verbs_child *ch = vl->children; ch; ch = ch->next)
				for (uint32_t k = 0; k < ch->nwin; k++) /* a window's bind came back */
					if (ch->win[k].bind_wr == wc[i].wr_id) {
						ch->win[k].bind_wr = 0;
						ch->win[k].status = wc_status_to_err(wc[i].status);
						if (wc[i].status)
							hkv_warn("verbs: binding a memory window: %s",
								 ibv_wc_status_str(wc[i].status));
					}
			for (struct verbs_child *ch = vl->children; ch; ch = ch->next) {
				if (ch->probe_seq != wc[i].wr_id)
					continue;
				ch->probe_seq = 0;
				vl->probes--;
				hkv_debug("verbs: keepalive to client %llu: %s",
					  (unsigned long long)ch->cookie,
					  ibv_wc_status_str(wc[i].status));
				if (wc[i].status && !ch->dead) {
					ch->dead = 1;
					hkv_warn("verbs: client %llu did not answer a keepalive (%s)",
						 (unsigned long long)ch->cookie,
						 ibv_wc_status_str(wc[i].status));
				}
			}
		}
	}
	return n < 0 ? HKV_ETRANSPORT : 0;
}

/* Post the bind of mw over [off, off+len) on the child's QP with the new
 * rkey; its wr_id in *wr_id (verbs_l_reap sees it complete). 0 or <0. */
static int verbs_bind(struct verbs_listener *vl, struct verbs_child *ch, struct ibv_mw *mw,
		      uint32_t rkey, uint64_t off, uint64_t len, uint32_t access, uint64_t *wr_id)
{
	struct ibv_send_wr wr = {0}, *bad;
	int ret;

	wr.wr_id = ++vl->wr_seq;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = verbs_bind_mr(vl, off, len);
	if (!wr.bind_mw.bind_info.mr)
		return errno ? -errno : -ENOMEM;
	wr.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)vl->region + off;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = (unsigned int)access_to_mw(access);
	ret = ibv_post_send(ch->id->qp, &wr, &bad);
	if (ret)
		return -ret;
	*wr_id = wr.wr_id;
	return 0;
}

/* Keepalives (see hkv_listener_tick): settle the ones that came back, close
 * the connections whose peer did not answer, send the ones due. */
static int verbs_l_tick(struct hkv_listener *l)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	uint64_t now = hkv_now_ns();
	int closed = 0;

	verbs_l_reap(vl);
	for (struct verbs_child *ch = vl->children, *next; ch; ch = next) {
		struct ibv_send_wr wr = {0}, *bad;

		next = ch->next;
		if (ch->probe_seq && !ch->dead &&
		    now - ch->probe_ns > HKV_PROBE_TIMEOUT_MS * 1000000ull) {
			ch->dead = 1;
			hkv_warn("verbs: client %llu did not answer a keepalive in %d ms",
				 (unsigned long long)ch->cookie, HKV_PROBE_TIMEOUT_MS);
		}
		if (ch->dead) {
			rdma_disconnect(ch->id);
			verbs_child_forget(vl, ch->id);
			closed++;
			continue;
		}
		if (!vl->keepalive_ms || !ch->established || ch->probe_seq ||
		    vl->probes >= VERBS_L_PROBES ||
		    now - ch->probe_ns < (uint64_t)vl->keepalive_ms * 1000000ull)
			continue;
		wr.wr_id = ++vl->wr_seq;
		wr.opcode = IBV_WR_RDMA_WRITE; /* zero bytes: no address, no rkey (C9-88) */
		wr.send_flags = IBV_SEND_SIGNALED;
		if ((errno = ibv_post_send(ch->id->qp, &wr, &bad))) {
			hkv_debug("verbs: keepalive to client %llu not posted: %s",
				  (unsigned long long)ch->cookie, strerror(errno));
			continue; /* send queue busy with binds: next tick */
		}
		ch->probe_seq = wr.wr_id;
		ch->probe_ns = now;
		vl->probes++;
	}
	return closed;
}

static int verbs_l_grant(struct hkv_listener *l, uint64_t cookie, uint64_t off, uint64_t len,
			 uint32_t access, uint32_t *rkey)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	struct verbs_child *ch = verbs_child_by_cookie(vl, cookie);
	struct verbs_window *w;
	struct ibv_mw *mw;
	uint64_t wr_id = 0;
	uint32_t key;
	int ret;

	if (!ch || !ch->id->qp)
		return -ENOENT;
	if (!ch->established) {
		/* The client has seen ESTABLISHED, but ours may still be queued, and
		 * librdmacm moves our QP to RTS only when we take it: take what is
		 * queued, without waiting (the event loop is everyone's). */
		verbs_l_dispatch(l);
		ch = verbs_child_by_cookie(vl, cookie);
		if (!ch)
			return -ENOENT;
		if (!ch->established)
			return -EAGAIN; /* not connected (yet): the client asks again */
	}
	verbs_l_reap(vl);
	for (uint32_t i = 0; i < ch->nwin; i++) {
		w = &ch->win[i];
		if (w->off == off && w->len == len && w->access == access) {
			if (w->bind_wr)
				return -EINPROGRESS; /* its bind has not completed yet */
			if (w->status) { /* it failed: forget it */
				ret = w->status;
				ibv_dealloc_mw(w->mw);
				ch->win[i] = ch->win[--ch->nwin];
				vl->nwindows--;
				return ret;
			}
			*rkey = w->rkey;
			return 0;
		}
		if (w->off == off) /* one window per start: a new grant replaces it */
			return -EEXIST;
	}
	if (ch->nwin == ch->capwin) {
		uint32_t cap = ch->capwin ? 2 * ch->capwin : 4;
		void *p = hkv_realloc(ch->win, cap * sizeof(*ch->win));

		if (!p)
			return -ENOMEM;
		ch->win = p;
		ch->capwin = cap;
	}
	mw = ibv_alloc_mw(vl->pd, IBV_MW_TYPE_2);
	if (!mw)
		return -errno;
	key = ibv_inc_rkey(mw->rkey);
	ret = verbs_bind(vl, ch, mw, key, off, len, access, &wr_id);
	if (ret) {
		ibv_dealloc_mw(mw);
		return ret;
	}
	ch->win[ch->nwin++] = (struct verbs_window){.off = off, .len = len, .access = access,
						    .rkey = key, .mw = mw, .bind_wr = wr_id};
	vl->nwindows++;
	verbs_l_reap(vl); /* a bind is local: often done now */
	if (ch->win[ch->nwin - 1].bind_wr)
		return -EINPROGRESS; /* the caller asks again (hkv_listener_grant) */
	ret = ch->win[ch->nwin - 1].status;
	if (ret) {
		ibv_dealloc_mw(mw);
		ch->nwin--;
		vl->nwindows--;
		return ret;
	}
	*rkey = key;
	return 0;
}

static int verbs_l_revoke(struct hkv_listener *l, uint64_t cookie, uint64_t off)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	struct verbs_child *ch = verbs_child_by_cookie(vl, cookie);

	if (!ch)
		return -ENOENT;
	for (uint32_t i = 0; i < ch->nwin; i++) {
		if (ch->win[i].off != off)
			continue;
		ibv_dealloc_mw(ch->win[i].mw); /* invalidates the rkey */
		ch->win[i] = ch->win[--ch->nwin];
		vl->nwindows--;
		return 0;
	}
	return -ENOENT;
}

static int verbs_l_fence(struct hkv_listener *l, uint64_t cookie)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	struct verbs_child *ch = verbs_child_by_cookie(vl, cookie);

	if (ch) {
		rdma_disconnect(ch->id);
		verbs_child_forget(vl, ch->id); /* (its QP destroyed: nothing of it lands) */
	}
	return 0;
}

static int verbs_l_nwindows(const struct hkv_listener *l)
{
	return container_of(l, struct verbs_listener, base)->nwindows;
}

static void loop_free(struct verbs_loop *lp)
{
	if (lp->mw) /* (first: a window bound to the QP holds it; rxe then takes ~50 s
		     * to destroy the QP) */
		ibv_dealloc_mw(lp->mw);
	if (lp->child) {
		rdma_disconnect(lp->child);
		if (lp->child->qp)
			rdma_destroy_qp(lp->child);
		rdma_destroy_id(lp->child);
	}
	if (lp->cq)
		ibv_destroy_cq(lp->cq);
	if (lp->lid)
		rdma_destroy_id(lp->lid);
	if (lp->ec)
		rdma_destroy_event_channel(lp->ec);
	hkv_free(lp);
}

/* An IPv4 address of this host that the listener's device serves: the one
 * it is bound to, or (a wildcard listener) the first that resolves to it. */
static int loop_addr(struct verbs_listener *vl, struct rdma_event_channel *ec,
		     struct sockaddr_in *out)
{
	struct sockaddr *sa = rdma_get_local_addr(vl->id);
	struct ifaddrs *ifs, *i;
	int ret = HKV_ENODEV;

	if (sa->sa_family == AF_INET &&
	    ((struct sockaddr_in *)sa)->sin_addr.s_addr != htonl(INADDR_ANY)) {
		*out = *(struct sockaddr_in *)sa;
		out->sin_port = 0;
		return 0;
	}
	if (getifaddrs(&ifs))
		return -errno;
	for (i = ifs; i && ret; i = i->ifa_next) {
		struct rdma_cm_id *id;

		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
		    (i->ifa_flags & IFF_LOOPBACK) || rdma_create_id(ec, &id, NULL, RDMA_PS_TCP))
			continue;
		*out = *(struct sockaddr_in *)i->ifa_addr;
		out->sin_port = 0;
		if (!rdma_bind_addr(id, (struct sockaddr *)out) && id->verbs == vl->ctx)
			ret = 0;
		rdma_destroy_id(id);
	}
	freeifaddrs(ifs);
	return ret;
}

/* The next cm event on ec must be `want`; its id in *id (acked). */
static int loop_expect(struct rdma_event_channel *ec, int timeout_ms,
		       enum rdma_cm_event_type want, struct rdma_cm_id **id, uint8_t *resources)
{
	struct rdma_cm_event *ev;
	int ret = cm_wait_event(ec, timeout_ms, &ev);

	if (ret)
		return ret;
	ret = ev->event == want ? 0 : -ECONNREFUSED;
	if (!ret && id)
		*id = ev->id;
	if (!ret && resources)
		*resources = ev->param.conn.responder_resources;
	if (ret)
		hkv_debug("verbs: loopback: expected %s, got %s", rdma_event_str(want),
			  rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	return ret;
}

/* Bind the loop's window over the whole region with every right; its rkey. */
static int loop_window(struct verbs_listener *vl, struct verbs_loop *lp, int timeout_ms,
		       uint32_t *rkey)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_wc wc;
	uint64_t until = hkv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int n;

	if (!(lp->mw = ibv_alloc_mw(vl->pd, IBV_MW_TYPE_2)))
		return -errno;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = lp->mw;
	wr.bind_mw.rkey = ibv_inc_rkey(lp->mw->rkey);
	wr.bind_mw.bind_info.mr = vl->wmr;
	wr.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)vl->region;
	wr.bind_mw.bind_info.length = vl->region_len;
	wr.bind_mw.bind_info.mw_access_flags = (unsigned int)access_to_mw(HKV_ACCESS_ALL);
	if ((errno = ibv_post_send(lp->child->qp, &wr, &bad)))
		return -errno;
	while (!(n = ibv_poll_cq(lp->cq, 1, &wc)) && hkv_now_ns() < until)
		;
	if (n <= 0)
		return n < 0 ? HKV_ETRANSPORT : HKV_ETIMEDOUT;
	if (wc.status) {
		hkv_warn("verbs: loopback: binding its window: %s", ibv_wc_status_str(wc.status));
		return wc_status_to_err(wc.status);
	}
	*rkey = wr.bind_mw.rkey;
	return 0;
}

static struct hkv_conn *verbs_l_loopback(struct hkv_listener *l, int timeout_ms)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);
	struct verbs_loop *lp = hkv_calloc(1, sizeof(*lp));
	struct verbs_conn *v = hkv_calloc(1, sizeof(*v));
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct rdma_conn_param param = {.retry_count = 6, .rnr_retry_count = 7};
	struct hkv_accept_msg acc = {.magic = HKV_CONN_MAGIC}, got;
	struct sockaddr_in at;
	char host[INET_ADDRSTRLEN], port[8];
	struct hkv_conn_cfg cfg = {.kind = HKV_TRANSPORT_VERBS, .host = host, .port = port,
				   .timeout_ms = timeout_ms};
	struct ibv_device_attr dattr;
	struct ibv_mr *mr = NULL;
	uint32_t rkey = 0;
	uint8_t resources = 0, tmo = VERBS_ACK_TIMEOUT;
	int ret = -ENOMEM, depth = 64;

	if (!lp || !v)
		goto fail;
	v->base.ops = &verbs_conn_ops;
	v->sq_depth = depth;
	v->wrs = hkv_calloc((size_t)depth, sizeof(*v->wrs));
	v->sges = hkv_calloc((size_t)depth, sizeof(*v->sges));
	if (!v->wrs || !v->sges)
		goto fail;
	/* the responder: a listener of our own on an ephemeral port */
	ret = HKV_ENODEV;
	if (!(lp->ec = rdma_create_event_channel()) ||
	    rdma_create_id(lp->ec, &lp->lid, NULL, RDMA_PS_TCP))
		goto fail;
	ret = loop_addr(vl, lp->ec, &at);
	if (ret)
		goto fail;
	ret = rdma_bind_addr(lp->lid, (struct sockaddr *)&at) || rdma_listen(lp->lid, 1) ? -errno : 0;
	if (ret)
		goto fail;
	inet_ntop(AF_INET, &at.sin_addr, host, sizeof(host));
	snprintf(port, sizeof(port), "%u", (unsigned)ntohs(rdma_get_src_port(lp->lid)));
	/* the requester, as a client's (hkv_verbs_conn_open) */
	ret = HKV_ENODEV;
	if (!(v->ec = rdma_create_event_channel()) || rdma_create_id(v->ec, &v->id, v, RDMA_PS_TCP))
		goto fail;
	ret = verbs_resolve(v, &cfg);
	if (ret)
		goto fail;
	ret = HKV_ENODEV;
	if (v->id->verbs != vl->ctx)
		goto fail; /* (the address is another device's) */
	/* (a client's ack timeout: its teardown does not wait out the default's) */
	rdma_set_option(v->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo));
	ret = -errno;
	if (!(v->pd = ibv_alloc_pd(v->id->verbs)) ||
	    !(v->cq = ibv_create_cq(v->id->verbs, depth, NULL, NULL, 0)) ||
	    ibv_query_device(v->id->verbs, &dattr))
		goto fail;
	ret = verbs_create_qp(v, depth);
	if (ret)
		goto fail;
	param.initiator_depth = (uint8_t)(dattr.max_qp_init_rd_atom < VERBS_RD_ATOMIC
						  ? dattr.max_qp_init_rd_atom
						  : VERBS_RD_ATOMIC);
	param.private_data = &acc; /* (nobody reads it: any 8 bytes will do) */
	param.private_data_len = 8;
	ret = rdma_connect(v->id, &param) ? -errno : 0;
	if (!ret)
		ret = loop_expect(lp->ec, timeout_ms, RDMA_CM_EVENT_CONNECT_REQUEST, &lp->child,
				  &resources);
	if (ret)
		goto fail;
	/* the responder's QP: in the region's PD, so that its rkeys work */
	ret = -errno;
	if (!(lp->cq = ibv_create_cq(vl->ctx, 4, NULL, NULL, 0)))
		goto fail;
	qa.send_cq = qa.recv_cq = lp->cq;
	if (rdma_create_qp(lp->child, vl->pd, &qa))
		goto fail;
	acc.region.base = (uint64_t)(uintptr_t)vl->region;
	acc.region.length = vl->region_len;
	acc.region.access = HKV_ACCESS_ALL;
	if (!vl->wmr && !(mr = verbs_l_mr(vl, HKV_ACCESS_ALL)))
		goto fail;
	memset(&param, 0, sizeof(param));
	param.private_data = &acc;
	param.private_data_len = (uint8_t)offsetof(struct hkv_accept_msg, data);
	param.responder_resources = resources < vl->max_rd_atom ? resources : vl->max_rd_atom;
	rdma_set_option(lp->child, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo));
	ret = rdma_accept(lp->child, &param) ? -errno : 0;
	if (!ret)
		ret = cm_expect(v->ec, timeout_ms, RDMA_CM_EVENT_ESTABLISHED, &got);
	if (!ret)
		ret = loop_expect(lp->ec, timeout_ms, RDMA_CM_EVENT_ESTABLISHED, NULL, NULL);
	if (ret)
		goto fail;
	v->connected = 1;
	if (vl->wmr) { /* (the QP is at RTS now: a window can be bound on it) */
		ret = loop_window(vl, lp, timeout_ms, &rkey);
		if (ret)
			goto fail;
	} else {
		rkey = mr->rkey;
	}
	v->base.region = acc.region;
	v->base.region.rkey = rkey;
	fcntl(v->ec->fd, F_SETFL, fcntl(v->ec->fd, F_GETFL) | O_NONBLOCK);
	lp->next = vl->loops;
	vl->loops = lp;
	if (hkv_conn_settle(&v->base, timeout_ms, depth))
		return NULL; /* (closed it; the responder goes with the listener) */
	hkv_info("verbs: loopback connection on %s:%s for the server's own atomics", host, port);
	return &v->base;

fail:
	hkv_warn("verbs: loopback connection: %s", hkv_strerror(ret));
	if (v)
		verbs_teardown(v);
	if (lp)
		loop_free(lp);
	errno = ret < 0 ? -ret : EIO;
	return NULL;
}

static void verbs_l_destroy(struct hkv_listener *l)
{
	struct verbs_listener *vl = container_of(l, struct verbs_listener, base);

	while (vl->children) {
		rdma_disconnect(vl->children->id);
		verbs_child_forget(vl, vl->children->id);
	}
	while (vl->loops) {
		struct verbs_loop *lp = vl->loops;

		vl->loops = lp->next;
		loop_free(lp);
	}
	for (int i = HKV_ACCESS_ALL; i >= 0; i--)
		if (vl->mrs[i])
			ibv_dereg_mr(vl->mrs[i]);
	for (uint32_t i = 0; i < vl->nbmrs; i++)
		ibv_dereg_mr(vl->bmrs[i].mr);
	hkv_free(vl->bmrs);
	if (vl->wmr)
		ibv_dereg_mr(vl->wmr);
	if (vl->cq)
		ibv_destroy_cq(vl->cq);
	if (vl->pd)
		ibv_dealloc_pd(vl->pd);
	if (vl->id)
		rdma_destroy_id(vl->id);
	if (vl->devs)
		rdma_free_devices(vl->devs);
	if (vl->ec)
		rdma_destroy_event_channel(vl->ec);
	hkv_free(vl);
}

static const struct hkv_listener_ops verbs_listener_ops = {
	.fd = verbs_l_fd,
	.dispatch = verbs_l_dispatch,
	.nconns = verbs_l_nconns,
	.destroy = verbs_l_destroy,
	.grant = verbs_l_grant,
	.revoke = verbs_l_revoke,
	.nwindows = verbs_l_nwindows,
	.tick = verbs_l_tick,
	.loopback = verbs_l_loopback,
	.fence = verbs_l_fence,
};

static int verbs_l_bind(struct verbs_listener *vl, const struct hkv_listener_cfg *cfg)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE};
	struct addrinfo *ai;
	int ret;

	if (getaddrinfo(cfg->host, cfg->port, &hints, &ai))
		return -EADDRNOTAVAIL;
	ret = rdma_bind_addr(vl->id, ai->ai_addr) || rdma_listen(vl->id, 128) ? -errno : 0;
	freeaddrinfo(ai);
	if (ret)
		return ret;
	vl->ctx = vl->id->verbs;
	if (!vl->ctx) { /* wildcard: serve the first device */
		int n = 0;

		vl->devs = rdma_get_devices(&n);
		if (!vl->devs || n < 1)
			return HKV_ENODEV;
		vl->ctx = vl->devs[0];
	}
	return 0;
}

struct hkv_listener *hkv_verbs_listener_create(const struct hkv_listener_cfg *cfg)
{
	struct verbs_listener *vl = hkv_calloc(1, sizeof(*vl));
	struct ibv_device_attr dattr;
	struct ibv_mr *mr = NULL;
	int ret = -ENOMEM;

	if (!vl)
		goto fail;
	vl->base.ops = &verbs_listener_ops;
	vl->base.on_connect = cfg->on_connect;
	vl->base.on_disconnect = cfg->on_disconnect;
	vl->base.arg = cfg->arg;
	vl->region = cfg->region;
	vl->region_len = cfg->region_len;
	vl->keepalive_ms = cfg->keepalive_ms;
	ret = HKV_ENODEV;
	vl->ec = rdma_create_event_channel();
	if (!vl->ec || rdma_create_id(vl->ec, &vl->id, vl, RDMA_PS_TCP))
		goto destroy;
	ret = verbs_l_bind(vl, cfg);
	if (ret)
		goto destroy;
	ret = -errno;
	if (ibv_query_device(vl->ctx, &dattr) || !(vl->pd = ibv_alloc_pd(vl->ctx)))
		goto destroy;
	vl->max_rd_atom = (uint8_t)(dattr.max_qp_rd_atom < VERBS_RD_ATOMIC ? dattr.max_qp_rd_atom
									     : VERBS_RD_ATOMIC);
	if (cfg->windows && !(dattr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B))
		hkv_warn("verbs: device %s has no type-2B memory windows: every client's rkey "
			 "reaches the whole region", ibv_get_device_name(vl->ctx->device));
	else if (cfg->windows &&
		 !(vl->wmr = ibv_reg_mr(vl->pd, vl->region, vl->region_len,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND))) {
		ret = -errno;
		goto destroy;
	}
	if ((!vl->wmr && !(mr = verbs_l_mr(vl, HKV_ACCESS_ALL))) ||
	    !(vl->cq = ibv_create_cq(vl->ctx, VERBS_L_CQ, NULL, NULL, 0))) {
		ret = errno ? -errno : -ENOMEM;
		goto destroy;
	}
	vl->base.region.base = (uint64_t)(uintptr_t)cfg->region;
	vl->base.region.length = cfg->region_len;
	vl->base.region.rkey = vl->wmr ? 0 : mr->rkey;
	vl->base.region.access = HKV_ACCESS_ALL | (vl->wmr ? HKV_ACCESS_WINDOWS : 0);
	fcntl(vl->ec->fd, F_SETFL, fcntl(vl->ec->fd, F_GETFL) | O_NONBLOCK);
	if (vl->wmr)
		hkv_info("verbs: listening on %s:%s, device %s, region %zu bytes, memory windows "
			 "per client", cfg->host ? cfg->host : "*", cfg->port,
			 ibv_get_device_name(vl->ctx->device), cfg->region_len);
	else
		hkv_info("verbs: listening on %s:%s, device %s, region %zu bytes rkey 0x%x",
			 cfg->host ? cfg->host : "*", cfg->port,
			 ibv_get_device_name(vl->ctx->device), cfg->region_len, mr->rkey);
	return &vl->base;

destroy:
	verbs_l_destroy(&vl->base);
fail:
	errno = ret < 0 ? -ret : EIO;
	return NULL;
}
