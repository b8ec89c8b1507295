/*
 * transport.h - one-sided remote memory access, one interface, two backends.
 *
 * A client opens a connection (struct hkv_conn) to a server's listener
 * (struct hkv_listener), which exposes exactly one memory region. Over the
 * connection the client posts chains of work requests against that region:
 *
 *   HKV_WR_READ   remote[addr, addr+len) -> local
 *   HKV_WR_WRITE  local -> remote[addr, addr+len)
 *   HKV_WR_CAS    8-byte aligned compare-and-swap; old value -> local (8 B)
 *   HKV_WR_FAA    8-byte aligned fetch-and-add;    old value -> local (8 B)
 *
 * Semantics are those of an InfiniBand RC queue pair, which both backends
 * honour: requests of one connection execute at the responder in post order;
 * an atomic or READ that follows a WRITE on the same connection sees it; a
 * WRITE may pass an earlier READ unless HKV_WR_F_FENCE is set on it. Nothing is
 * ordered across connections. A failed request moves the connection to the
 * error state: it and every later request complete with an error
 * (HKV_EFLUSHED for the later ones), exactly like a QP going to ERR. Remote
 * access violations (wrong rkey, out of bounds, missing rights) complete with
 * HKV_EREMOTE_ACCESS; they are never a crash in either process.
 *
 * Backends (struct hkv_conn_ops, called through the inline wrappers below):
 *   verbs  rdma-core: rdma_cm RC connection, ibv_post_send chains (one doorbell
 *          per hkv_conn_post), selective signaling, inline small WRITEs.
 *   shm    same host: the region is a memfd passed over a unix socket; the
 *          client executes requests on its own mapping with real 8-byte
 *          atomics, checking rkey and bounds like a NIC.
 *
 * Round trip: one hkv_conn_exec() (post a chain, wait for its completions) is
 * one round trip, whatever the chain holds; counted in hkv_conn_stats.
 *
 * Threading: a connection belongs to one thread at a time. Listeners are
 * driven from one event loop thread.
 */
#ifndef HKV_TRANSPORT_H
#define HKV_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "hatchkv_err.h"

enum hkv_transport_kind {
	HKV_TRANSPORT_SHM = 1,
	HKV_TRANSPORT_VERBS = 2,
};

enum hkv_wr_opcode {
	HKV_WR_READ = 0,
	HKV_WR_WRITE = 1,
	HKV_WR_CAS = 2,
	HKV_WR_FAA = 3,
	HKV_WR_NOPS
};

/* Remote access rights of an exposed region (what its rkey permits). */
#define HKV_ACCESS_READ   0x1
#define HKV_ACCESS_WRITE  0x2
#define HKV_ACCESS_ATOMIC 0x4
#define HKV_ACCESS_ALL    (HKV_ACCESS_READ | HKV_ACCESS_WRITE | HKV_ACCESS_ATOMIC)
/* In an accept's region.access: the listener uses memory windows, so the
 * accept's rkey is 0 and every rkey of this connection comes from
 * hkv_listener_grant() (asked for through the server's control plane). */
#define HKV_ACCESS_WINDOWS 0x100

#define HKV_WR_F_SIGNALED 0x1 /* completion wanted (the last WR of a chain always has one) */
#define HKV_WR_F_FENCE    0x2 /* wait for earlier READs/atomics before this one */
/* On the last WR of a chain: post it unsignaled (fire and forget; nothing to
 * wait for). Its send-queue room comes back with the next signaled chain. */
#define HKV_WR_F_NO_COMPLETION 0x4

/* Largest private blob carried by a connect request (rdma_cm REQ: 56 bytes). */
#define HKV_HELLO_MAX 48
/* Largest reply blob a listener may attach to an accept. */
#define HKV_REPLY_MAX 128

struct hkv_mr {
	void *addr;
	size_t length;
	uint32_t lkey;
	void *impl; /* backend handle */
};

struct hkv_wr {
	uint64_t wr_id;
	void *local;             /* READ dst, WRITE src, CAS/FAA 8-byte result */
	const struct hkv_mr *mr; /* registration covering local; NULL ok for inline WRITE */
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t length;      /* READ/WRITE bytes; atomics are always 8 */
	uint64_t compare_add; /* CAS: compare; FAA: addend */
	uint64_t swap;        /* CAS: new value */
	uint8_t opcode;       /* enum hkv_wr_opcode */
	uint8_t flags;        /* HKV_WR_F_* */
};

struct hkv_wc {
	uint64_t wr_id;
	int status; /* 0 or negative HKV_E* */
	uint8_t opcode;
};

struct hkv_conn_stats {
	uint64_t wrs[HKV_WR_NOPS]; /* work requests posted, by opcode */
	uint64_t signaled;         /* of them, signaled (a completion each) */
	uint64_t posts;            /* doorbells (hkv_conn_post calls) */
	uint64_t round_trips;      /* hkv_conn_exec calls / hkv_conn_wait waits */
	uint64_t bytes_read;       /* READ payload + atomic results */
	uint64_t bytes_written;    /* WRITE payload + atomic operands */
};

/* sum += s (every field is a uint64_t count) */
static inline void hkv_conn_stats_add(struct hkv_conn_stats *sum, const struct hkv_conn_stats *s)
{
	uint64_t *d = (uint64_t *)sum;
	const uint64_t *a = (const uint64_t *)s;

	_Static_assert(sizeof(*s) % sizeof(uint64_t) == 0, "hkv_conn_stats: uint64_t only");
	for (size_t i = 0; i < sizeof(*s) / sizeof(uint64_t); i++)
		d[i] += a[i];
}

/* What the listener tells every accepted client about the one region. */
struct hkv_region_desc {
	uint64_t base;   /* remote address of the first byte */
	uint64_t length; /* bytes */
	uint32_t rkey;
	uint32_t access; /* HKV_ACCESS_* granted */
};

struct hkv_conn;

struct hkv_conn_ops {
	const char *name;
	int (*post)(struct hkv_conn *c, struct hkv_wr *wrs, int n);
	int (*poll)(struct hkv_conn *c, struct hkv_wc *wc, int max);
	struct hkv_mr *(*reg)(struct hkv_conn *c, void *addr, size_t len);
	void (*dereg)(struct hkv_conn *c, struct hkv_mr *mr);
	int (*check)(struct hkv_conn *c); /* cheap liveness check while waiting */
	void (*close)(struct hkv_conn *c);
};

/* Base of every backend connection; backends embed it first (container_of). */
struct hkv_conn {
	const struct hkv_conn_ops *ops;
	struct hkv_conn_stats stats;
	struct hkv_region_desc region;
	int timeout_ms;
	int error; /* sticky: first failure, after which everything is flushed */
	uint64_t next_alive_ns; /* hkv_conn_alive: the next backend check */
	/*
	 * Send-queue room, counted here alike for every backend, by the rules of
	 * an RC queue pair: a WR holds its place until a signaled WR posted at or
	 * after it completes and is reaped. An unsignaled chain is signaled
	 * anyway (wr_id HKV_WRID_QUIET, reaped by the next post or wait) once the
	 * unsignaled WRs since the last signaled one reach a quarter of the
	 * queue, so unsignaled work can never take all the room with nothing
	 * signaled to give it back.
	 */
	int sq_depth, sq_used;
	uint16_t *runs; /* ring: WRs accounted to each outstanding signaled WR */
	unsigned run_head, run_tail;
	int carry;      /* unsignaled WRs posted since the last signaled one */
	int quiet_out;  /* HKV_WRID_QUIET completions not reaped yet */
};

/* wr_id of completions the transport asked for itself (reserved). */
#define HKV_WRID_QUIET UINT64_MAX

struct hkv_conn_cfg {
	enum hkv_transport_kind kind;
	const char *host;  /* verbs: server address (name or IP) */
	const char *port;  /* verbs: rdma_cm port (service) */
	const char *path;  /* shm: unix socket path */
	const void *hello; /* opaque blob for the listener's on_connect, <= HKV_HELLO_MAX */
	size_t hello_len;
	int timeout_ms; /* connect and completion timeout; default 5000 */
	int sq_depth;   /* work requests in flight; default 256 */
	/* shm: the listener's process must run as this uid, or as ours, or as
	 * root (SO_PEERCRED), before the hello (and its ticket) is sent; -1:
	 * ours or root only. 0 (the default of a zeroed cfg) means root only
	 * besides ours. */
	long trust_uid;
};

/* May a unix-socket peer of uid `peer` be sent a secret? (ours, root, or trusted) */
int hkv_peer_trusted(int fd, long trust_uid, unsigned *peer_uid);

/*
 * Open a connection. On success returns it and, if reply != NULL, copies the
 * listener's reply blob (up to *reply_len bytes; *reply_len set to its size).
 * On failure returns NULL with errno set (positive HKV_E* value or errno):
 * HKV_EAUTH-style rejects arrive as ECONNREFUSED unless the listener replied.
 */
struct hkv_conn *hkv_conn_open(const struct hkv_conn_cfg *cfg, void *reply, size_t *reply_len);
void hkv_conn_close(struct hkv_conn *c);

/* Register local memory for READ destinations / WRITE sources / atomic results. */
static inline struct hkv_mr *hkv_conn_reg(struct hkv_conn *c, void *addr, size_t len)
{
	return c->ops->reg(c, addr, len);
}

static inline void hkv_conn_dereg(struct hkv_conn *c, struct hkv_mr *mr)
{
	if (mr)
		c->ops->dereg(c, mr);
}

/*
 * Post a chain of n work requests with one doorbell. The last one is
 * signaled unless it has HKV_WR_F_NO_COMPLETION. Waits (reaping the
 * transport's own HKV_WRID_QUIET completions) while the send queue lacks
 * room. Returns 0, -EAGAIN only if the room is held by signaled work the
 * caller itself has not waited for, -EINVAL for a malformed request (bad
 * opcode, misaligned atomic, n larger than the queue: nothing is posted and
 * the connection stays usable), or the connection's sticky error.
 */
int hkv_conn_post(struct hkv_conn *c, struct hkv_wr *wrs, int n);


/*
 * Wait until `want` completions arrived (copied to wc if non-NULL, which must
 * hold `want`), or the timeout. Counts one round trip. Returns 0, the first
 * completion error, or HKV_ETIMEDOUT / HKV_EDISCONNECTED.
 */
int hkv_conn_wait(struct hkv_conn *c, struct hkv_wc *wc, int want);
/* While fn is set (on this thread), hkv_conn_wait calls fn(arg) whenever it
 * polled and found nothing yet: a pipe's lane gives the thread to the other
 * lanes while its chain is on the wire (client/pipe.c). */
struct hkv_conn_idle {
	void (*fn)(void *arg);
	void *arg;
};
extern _Thread_local struct hkv_conn_idle hkv_conn_idle;
/* Has the peer gone? Asks the backend (a system call: shm polls its
 * socket, verbs reads its connection manager's events) without posting.
 * 0, or the error the connection is now in. */
int hkv_conn_check(struct hkv_conn *c);
/* The same at most once per coarse clock tick (1-4 ms), for the start of
 * an operation: a connection the listener fenced or dropped (see
 * hkv_listener_fence) is noticed before anything is posted on it. */
int hkv_conn_alive(struct hkv_conn *c);

/* Post a chain and wait for it: one round trip. Only the last WR is signaled. */
int hkv_conn_exec(struct hkv_conn *c, struct hkv_wr *wrs, int n);
/* How many completions a chain of n posts: the last WR's, and those of the
 * WRs before it marked HKV_WR_F_SIGNALED. */
int hkv_conn_completions(const struct hkv_wr *wrs, int n);

static inline const struct hkv_region_desc *hkv_conn_region(const struct hkv_conn *c)
{
	return &c->region;
}

/* ---- server side ---------------------------------------------------------- */

struct hkv_listener;

/* What on_connect decides about one connect request. */
struct hkv_accept_info {
	void *reply;      /* HKV_REPLY_MAX bytes to fill; set reply_len */
	size_t reply_len; /* out: 0 by default */
	uint32_t access;  /* out: HKV_ACCESS_* rights granted (default all) */
	uint64_t cookie;  /* out: handed back to on_disconnect */
};

/*
 * Called for every connect request with the client's hello blob. Return 0 to
 * accept (filling *out as wanted) or <0 (an HKV_E* code) to reject; the code
 * reaches the client as errno of hkv_conn_open().
 */
typedef int (*hkv_on_connect_fn)(void *arg, const void *hello, size_t hello_len,
				 struct hkv_accept_info *out);
/* Called once when an accepted connection is gone (closed, failed, or the
 * peer died); after it returns, nothing from that peer can reach the region. */
typedef void (*hkv_on_disconnect_fn)(void *arg, uint64_t cookie);

struct hkv_listener_cfg {
	enum hkv_transport_kind kind;
	const char *host; /* verbs: local address to bind (NULL: any) */
	const char *port; /* verbs: rdma_cm port */
	const char *path; /* shm: unix socket path (created; removed on destroy) */
	void *region;     /* region to expose: a memfd-backed mapping ... */
	size_t region_len;
	int region_fd; /* ... and its memfd (shm hands it to clients) */
	hkv_on_connect_fn on_connect;
	hkv_on_disconnect_fn on_disconnect;
	void *arg;
	/* verbs, if the device offers type-2 memory windows: expose the region
	 * only through windows bound to each connection's own queue pair, so no
	 * rkey reaches more than was granted to that connection and none
	 * outlives it. hkv_listener_region()->access tells whether it is on.
	 * shm ignores it (the client maps the region: nothing to enforce with). */
	int windows;
	/* verbs: keepalive interval (hkv_listener_tick), 0 = none */
	int keepalive_ms;
};

struct hkv_listener *hkv_listener_create(const struct hkv_listener_cfg *cfg);
/* File descriptor to watch for readability (libevent); then call dispatch. */
int hkv_listener_fd(const struct hkv_listener *l);
/* Handle pending connection events without blocking. Returns 0 or <0. */
int hkv_listener_dispatch(struct hkv_listener *l);
/* The descriptor clients receive for full access. */
const struct hkv_region_desc *hkv_listener_region(const struct hkv_listener *l);
/*
 * Memory windows (listeners created with windows): give the connection
 * accepted with `cookie` the rights `access` (HKV_ACCESS_*) to region bytes
 * [off, off+len): a type-2 window bound to that connection's queue pair,
 * so its rkey works on no other connection and dies with this one. The
 * same range with the same rights again returns the same rkey. Never waits:
 * returns 0 with *rkey set; -EINPROGRESS when the bind is posted but not
 * complete (ask again, the same way, for the rkey); -EAGAIN when the
 * connection is not established yet; -ENOENT (no such connection), -EINVAL
 * (range), -EOPNOTSUPP (no windows), or the bind's error.
 */
int hkv_listener_grant(struct hkv_listener *l, uint64_t cookie, uint64_t off, uint64_t len,
		       uint32_t access, uint32_t *rkey);
/* Invalidate that connection's window starting at off: a later access with
 * its rkey fails at the NIC. 0, -ENOENT, or -EOPNOTSUPP. */
int hkv_listener_revoke(struct hkv_listener *l, uint64_t cookie, uint64_t off);
/*
 * Fence the connection accepted with `cookie`: once this returns 0 nothing
 * that peer posts can land in the region any more, and the connection is
 * closed (on_disconnect runs). verbs: its queue pair is destroyed. shm,
 * where the peer's process executes its own requests on its mapping: its
 * gate (a word each chain checks, between raising and lowering a busy
 * count: client/transport_shm.c) is shut, and 0 comes once no chain of the
 * slot is in flight; -EINPROGRESS meanwhile (a peer stopped inside a
 * chain: ask again). 0 also for a connection already gone.
 */
int hkv_listener_fence(struct hkv_listener *l, uint64_t cookie);
/*
 * Liveness of accepted connections; call it about once a second. A peer that
 * vanishes without a word (host down, network cut: no disconnect request
 * ever arrives) would otherwise keep its connection, and everything the
 * owner tied to it, forever: the listener never sends on its own. So every
 * cfg->keepalive_ms each established connection gets a zero-length
 * RDMA WRITE (verbs; no memory is touched at either end). One the peer does
 * not acknowledge - the transport's retries give up (about 15 s), or it is
 * still unanswered after HKV_PROBE_TIMEOUT_MS (a peer may ask for endless
 * retries) - closes the connection like a disconnect (on_disconnect runs).
 * A network outage shorter than that is ridden out. shm: nothing to do, the
 * socket tells. Returns how many connections it closed.
 */
#define HKV_PROBE_INTERVAL_MS 2000 /* the default keepalive_ms */
#define HKV_PROBE_TIMEOUT_MS  20000
int hkv_listener_tick(struct hkv_listener *l);
/* Windows currently bound, over all connections. */
int hkv_listener_nwindows(const struct hkv_listener *l);
/*
 * The owner's own connection to its region through the device (verbs), for
 * atomics on words clients reach with RDMA atomics: a CPU atomic is atomic
 * against the NIC's only on devices with IBV_ATOMIC_GLOB (rxe executes an
 * RDMA atomic as a read and a write under its own lock; most NICs report
 * IBV_ATOMIC_HCA). A private rdma_cm pair on the listener's address and
 * device, set up without the listener's event loop; its region descriptor
 * carries an rkey with every right (a window bound to this connection's
 * queue pair alone when the listener uses windows). The listener keeps the
 * responder side; close the connection before destroying the listener.
 * NULL with errno: EOPNOTSUPP on shm (the clients execute their atomics with
 * the CPU's: nothing to serialise against), else why it failed.
 */
struct hkv_conn *hkv_listener_loopback(struct hkv_listener *l, int timeout_ms);
/* Connections currently established. */
int hkv_listener_nconns(const struct hkv_listener *l);
void hkv_listener_destroy(struct hkv_listener *l);

/* Parse "shm" / "verbs"; returns 0 if unknown. */
enum hkv_transport_kind hkv_transport_parse(const char *name);
/* Does this host have an RDMA device libibverbs can open? */
int hkv_verbs_available(void);

#endif /* HKV_TRANSPORT_H */
