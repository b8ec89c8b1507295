/*
 * test_faults.c - hatchkv under faults, against a real hatchkv-server:
 *
 *   test_faults shm     (unit tier)
 *   test_faults verbs   (rdma tier, Soft-RoCE guest)
 *
 * test_garbage: a "vandal" authenticates like any client, then RDMA-WRITEs
 * random bytes into the index and the data area while reader/writer clients
 * run sets, gets, multi-gets and deletes. Every get that succeeds must return
 * a value that was really written for its key; the only errors allowed are
 * HKV_ENOTFOUND, HKV_ECORRUPT, HKV_EFULL and HKV_EAGAIN; no client crashes;
 * after the vandal stops a fresh client still reads and writes.
 *
 * test_garbage_table: the same, with garbage CASed into the segment table
 * and the free bitmaps (what any writer's ATOMIC rights reach).
 *
 * test_garbage_header: a writer WRITEs random bytes over the region header
 * (every geometry field, forged sealed headers, the clock word) while
 * clients work and newcomers keep connecting: the server keeps its own
 * geometry, puts the header back, and serves every newcomer.
 *
 * test_sigkill_writer: a client killed with SIGKILL in a write loop. A fresh
 * client then sees every key absent or whole, never torn; the blocks the
 * dead client held come back by the server's sweep within 5 s, and a new
 * client fills the store nearly as far as in a store that never had it.
 *
 * test_holder_killed: a client stopped, then SIGKILLed, while it holds
 * claimed blocks: exactly the blocks it held and never wrote come back.
 *
 * Clients are separate processes: the test binary runs itself again in a
 * worker mode ("test_faults worker ROLE URI TOKEN-FILE ID MS FD"), fork +
 * exec. A bare fork is not an option: RDMA resources already exist in this
 * process (hkvserver_start opens a client) and librdmacm's device fds do not
 * work in a forked child. Workers report counters as "name=value" lines on
 * the pipe FD; their crashes show as the signal in their exit status (and a
 * backtrace on stderr).
 *
 * Values are self-validating: struct val_hdr (magic, length, writer sequence
 * number, 64-bit hash), then the key, then filler derived from the sequence
 * number. A value returned for a key either is one some client wrote for that
 * key, or check_value() says why not.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if !defined(__SANITIZE_ADDRESS__)
#include <execinfo.h>
#endif

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <sodium.h>

#include "client/client_int.h"
#include "common/ctl_auth.h"
#include "common/ctl_proto.h"
#include "common/layout.h"
#include "common/token.h"
#include "common/transport.h"
#include "common/transport_int.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;

/* ---- counters, reported by workers as "name=value" --------------------------- */

enum counter {
	C_OPS,
	C_GETS,
	C_HITS,
	C_SETS,
	C_SETS_OK,
	C_DELS,
	C_MGETS,
	C_BAD,           /* a value nobody wrote for its key */
	C_NOTFOUND,      /* the allowed errors: ENOTFOUND, ECORRUPT, EFULL, EAGAIN */
	C_CORRUPT,
	C_FULL,
	C_AGAIN,
	C_OTHER,         /* any other error: not allowed */
	C_CORRUPT_READS, /* hkv_client_stats: blocks that failed validation */
	C_RB_MISS,       /* fresh client: a miss right after its own successful set */
	C_RB_STALE,      /* fresh client: an older valid value right after its set */
	C_VANDAL_WRITES,
	C_VANDAL_BYTES,
	C_PROGRESS,      /* writer: sets issued so far */
	C_CLAIMED,       /* hkv_client_stats: blocks its claims took */
	C_GIVEN_BACK,    /* hkv_client_stats: held blocks it gave back */
	C_TIMEDOUT,      /* HKV_ETIMEDOUT: allowed by test_garbage_table only */
	C_OPENS,         /* newcomer: hkv_open that worked */
	C_OPEN_FAILS,    /* newcomer: hkv_open that failed */
	NCOUNTERS
};

static const char *const counter_names[NCOUNTERS] = {
	[C_OPS] = "ops",
	[C_GETS] = "gets",
	[C_HITS] = "hits",
	[C_SETS] = "sets",
	[C_SETS_OK] = "sets_ok",
	[C_DELS] = "dels",
	[C_MGETS] = "mgets",
	[C_BAD] = "bad",
	[C_NOTFOUND] = "notfound",
	[C_CORRUPT] = "corrupt",
	[C_FULL] = "full",
	[C_AGAIN] = "again",
	[C_OTHER] = "other",
	[C_CORRUPT_READS] = "corrupt_reads",
	[C_RB_MISS] = "rb_miss",
	[C_RB_STALE] = "rb_stale",
	[C_VANDAL_WRITES] = "vandal_writes",
	[C_VANDAL_BYTES] = "vandal_bytes",
	[C_PROGRESS] = "progress",
	[C_CLAIMED] = "claimed",
	[C_GIVEN_BACK] = "given_back",
	[C_TIMEDOUT] = "timedout",
	[C_OPENS] = "opens",
	[C_OPEN_FAILS] = "open_fails",
};

static unsigned long long cv(const uint64_t *cnt, enum counter i)
{
	return (unsigned long long)cnt[i];
}

/* ---- small helpers ----------------------------------------------------------- */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
			      .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static uint64_t rnd(uint64_t *s) /* xorshift64* */
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static uint64_t seed_of(int id)
{
	return (0x9e3779b97f4a7c15ull * (uint64_t)(id + 1) ^ (uint64_t)getpid() << 20 ^
		(uint64_t)time(NULL)) | 1; /* never 0: xorshift would stay there */
}

static int write_full(int fd, const void *p, size_t len)
{
	const uint8_t *b = p;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

static int read_full(int fd, void *p, size_t len)
{
	uint8_t *b = p;

	while (len) {
		ssize_t n = read(fd, b, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

static void key_name(char *buf, size_t cap, char prefix, int i)
{
	snprintf(buf, cap, "%c-%04d", prefix, i);
}

/* ---- self-validating values -------------------------------------------------- */

#define VAL_MAGIC 0x4c415648u /* "HVAL" */
#define VAL_MAX   4096
#define FNV_BASIS 0xcbf29ce484222325ull

struct val_hdr {
	uint32_t magic;
	uint32_t len; /* of the whole value */
	uint64_t seq; /* writer id << 40 | counter */
	uint64_t sum; /* FNV-1a over the value with sum = 0 */
	uint16_t klen;
	uint16_t rsv[3];
};

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		h = (h ^ *b++) * 0x100000001b3ull;
	return h;
}

static uint8_t filler_byte(uint64_t seq, size_t i)
{
	uint64_t x = (seq + (uint64_t)(i / 8) * 0x9e3779b97f4a7c15ull) * 0xd6e8feb86659fd93ull;

	return (uint8_t)((x ^ x >> 29) >> (i % 8 * 8));
}

static uint64_t value_sum(const uint8_t *v, size_t len)
{
	struct val_hdr h;

	memcpy(&h, v, sizeof(h));
	h.sum = 0;
	return fnv64(fnv64(FNV_BASIS, &h, sizeof(h)), v + sizeof(h), len - sizeof(h));
}

/* Build the value of `key` with sequence number seq, about len bytes; its length. */
static size_t make_value(uint8_t *v, size_t len, const char *key, uint64_t seq)
{
	size_t klen = strlen(key), head = sizeof(struct val_hdr) + klen;
	struct val_hdr h = {.magic = VAL_MAGIC, .seq = seq, .klen = (uint16_t)klen};

	if (len < head)
		len = head;
	if (len > VAL_MAX)
		len = VAL_MAX;
	h.len = (uint32_t)len;
	memcpy(v, &h, sizeof(h));
	memcpy(v + sizeof(h), key, klen);
	for (size_t i = head; i < len; i++)
		v[i] = filler_byte(seq, i);
	h.sum = value_sum(v, len);
	memcpy(v, &h, sizeof(h));
	return len;
}

/* NULL if v is a value some writer built for key, else why not. */
static const char *check_value(const char *key, const uint8_t *v, size_t vlen)
{
	size_t klen = strlen(key);
	struct val_hdr h;

	if (vlen < sizeof(h) + klen)
		return "too short for a value of this key";
	memcpy(&h, v, sizeof(h));
	if (h.magic != VAL_MAGIC)
		return "no value magic";
	if (h.len != vlen)
		return "length differs from the written one";
	if (h.klen != klen || memcmp(v + sizeof(h), key, klen))
		return "written for another key";
	if (h.sum != value_sum(v, vlen))
		return "checksum mismatch (torn or garbage)";
	if (h.seq >> 40 == 0 || h.seq >> 40 > 127)
		return "sequence number of no writer";
	for (size_t i = sizeof(h) + klen; i < vlen; i++)
		if (v[i] != filler_byte(h.seq, i))
			return "filler does not match its sequence number";
	return NULL;
}

static void report_bad(const char *who, const char *op, const char *key, const uint8_t *v,
		       size_t vlen, const char *why)
{
	char hex[3 * 48 + 1] = "";

	for (size_t i = 0; i < vlen && i < 48; i++)
		snprintf(hex + 3 * i, 4, "%02x ", v[i]);
	fprintf(stderr, "%s: %s(\"%s\") returned a value nobody wrote: %s; %zu bytes: %s\n", who,
		op, key, why, vlen, hex);
}

/* ---- a raw data-plane connection (what hkv_open does, by hand) ------------------ */

#define RAW_BUF (64u << 10)

struct ctl_ep {
	enum hkv_transport_kind kind;
	char host[256], port[16], path[108];
	char source[16]; /* TCP: bind to this address first ("": the kernel's choice) */
};

struct raw {
	struct hkv_conn *conn;
	struct hkv_geometry g;
	struct hkv_mr *mr;
	uint8_t *buf;
	uint32_t rkey;  /* the accept's, or with memory windows the granted base window's */
	uint32_t akey;  /* for atomics: rkey, or with windows the ATOMIC window's */
	uint32_t wkey;  /* for WRITEs: rkey, or with windows the WRITE window's (data area) */
	int windows;
	uint32_t id;    /* client id */
	uint8_t rk[32]; /* the session's request key (GRANT) */
	uint64_t seq;
	struct ctl_ep ep;
};

static int ep_parse(const char *uri, struct ctl_ep *ep)
{
	const char *colon;

	memset(ep, 0, sizeof(*ep));
	if (!strncmp(uri, "shm:", 4)) {
		ep->kind = HKV_TRANSPORT_SHM;
		snprintf(ep->path, sizeof(ep->path), "%s", uri + 4);
		return 0;
	}
	if (strncmp(uri, "verbs://", 8) || !(colon = strrchr(uri + 8, ':')))
		return -EINVAL;
	ep->kind = HKV_TRANSPORT_VERBS;
	snprintf(ep->host, sizeof(ep->host), "%.*s", (int)(colon - (uri + 8)), uri + 8);
	snprintf(ep->port, sizeof(ep->port), "%s", colon + 1);
	return 0;
}

static int ctl_connect(const struct ctl_ep *ep)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct timeval tmo = {5, 0};
	int fd, ret;

	if (ep->kind == HKV_TRANSPORT_SHM) {
		snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", ep->path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ret = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sun, sizeof(sun));
	} else {
		if (getaddrinfo(ep->host, ep->port, &hints, &ai))
			return -EHOSTUNREACH;
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ret = fd < 0 ? -1 : 0;
		if (!ret && ep->source[0]) { /* another source, for the server's limits */
			struct sockaddr_in src = {.sin_family = AF_INET};

			ret = inet_pton(AF_INET, ep->source, &src.sin_addr) == 1
				      ? bind(fd, (struct sockaddr *)&src, sizeof(src)) : -1;
		}
		if (!ret)
			ret = connect(fd, ai->ai_addr, ai->ai_addrlen);
		freeaddrinfo(ai);
	}
	if (ret) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
		return ret;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
	return fd;
}

/* One control request (type, body) and its reply of type `want` into out. */
static int ctl_call(const struct ctl_ep *ep, uint16_t type, const void *req, uint32_t len,
		    uint16_t want, void *out, uint32_t out_len)
{
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = type, .len = len};
	uint8_t body[HKV_CTL_BODY_MAX];
	int fd = ctl_connect(ep), ret = 0;

	if (fd < 0)
		return fd;
	if (write_full(fd, &h, sizeof(h)) || write_full(fd, req, h.len) ||
	    read_full(fd, &h, sizeof(h)))
		ret = HKV_EDISCONNECTED;
	else if (h.magic != HKV_CTL_MAGIC || h.version != HKV_CTL_VERSION || h.len > sizeof(body))
		ret = HKV_EPROTO;
	else if (read_full(fd, body, h.len))
		ret = HKV_EDISCONNECTED;
	else if (h.type == HKV_CTL_ERROR)
		ret = h.status < 0 ? h.status : HKV_EPROTO;
	else if (h.type != want || h.len != out_len)
		ret = HKV_EPROTO;
	else
		memcpy(out, body, out_len);
	close(fd);
	return ret;
}

/* Control plane: the library's mutual authentication (HELLO, CHALLENGE,
 * PROVE), WELCOME with client id and ticket. */
static int ctl_auth(const struct ctl_ep *ep, const char *token, struct hkv_ctl_welcome *w,
		    uint8_t rk[32])
{
	int fd = ctl_connect(ep), ret;

	if (fd < 0)
		return fd;
	ret = hkv_ctl_handshake(fd, token, 5000, w, rk);
	close(fd);
	return ret;
}

/* Memory windows: ask for rights to segment seg (HKV_GRANT_BASE: base rights). */
static int raw_grant(struct raw *r, uint32_t seg, struct hkv_ctl_granted *out)
{
	struct hkv_ctl_grant g = {.client_id = r->id, .seg = seg};

	uint64_t t0 = now_ms();
	int ret;

	/* -EAGAIN: the server has not yet seen this connection established
	 * (rdma_cm's event reaches it after our connect returned); retry as
	 * the library does, for up to 5 s */
	do {
		g.seq = ++r->seq;
		hkv_ctl_request_seal(&g, sizeof(g), HKV_CTL_GRANT, r->rk);
		ret = ctl_call(&r->ep, HKV_CTL_GRANT, &g, sizeof(g), HKV_CTL_GRANTED, out,
			       sizeof(*out));
		if (ret == -EAGAIN)
			sleep_ms(5);
	} while (ret == -EAGAIN && now_ms() - t0 < 5000);
	return ret;
}

/* One READ, WRITE or CAS of the scratch buffer against region offset off
 * with a given rkey: one round trip. CAS: compare/swap, old value in buf. */
static int raw_op(struct raw *r, uint8_t op, uint64_t off, uint32_t len, uint32_t rkey,
		  uint64_t compare, uint64_t swap)
{
	const struct hkv_region_desc *rd = hkv_conn_region(r->conn);
	struct hkv_wr wr = {.opcode = op, .local = r->buf, .mr = r->mr,
			    .remote_addr = rd->base + off, .rkey = rkey, .length = len,
			    .compare_add = compare, .swap = swap};

	return hkv_conn_exec(r->conn, &wr, 1);
}

/* One READ or WRITE of the scratch buffer against region offset off: one round trip.
 * (With windows a WRITE reaches only the data area.) */
static int raw_xfer(struct raw *r, uint8_t op, uint64_t off, uint32_t len)
{
	return raw_op(r, op, off, len, op == HKV_WR_WRITE ? r->wkey : r->rkey, 0, 0);
}

static void raw_close(struct raw *r)
{
	if (r->conn) {
		hkv_conn_dereg(r->conn, r->mr);
		hkv_conn_close(r->conn);
	}
	free(r->buf);
	memset(r, 0, sizeof(*r));
}

/* Open a data connection with a redeemed ticket; read and check the header. */
static int raw_open(struct raw *r, const char *uri, const char *token_file)
{
	char token[HKV_TOKEN_MAX + 1];
	struct hkv_data_hello hello;
	struct hkv_ctl_welcome w;
	struct hkv_conn_cfg cc;
	struct ctl_ep ep;
	int ret = ep_parse(uri, &ep);

	memset(r, 0, sizeof(*r));
	if (!ret && hkv_token_load(token_file, token, sizeof(token), 0) < 0)
		ret = HKV_EAUTH;
	if (!ret)
		ret = ctl_auth(&ep, token, &w, r->rk);
	if (!ret && w.transport != ep.kind)
		ret = HKV_EPROTO;
	if (ret)
		return ret;
	w.data_endpoint[sizeof(w.data_endpoint) - 1] = 0;
	memset(&hello, 0, sizeof(hello));
	hello.client_id = w.client_id;
	memcpy(hello.ticket, w.ticket, HKV_TICKET_LEN);
	cc = (struct hkv_conn_cfg){.kind = ep.kind, .host = ep.host, .port = w.data_endpoint,
				   .path = w.data_endpoint, .hello = &hello,
				   .hello_len = sizeof(hello), .timeout_ms = 5000};
	r->conn = hkv_conn_open(&cc, NULL, NULL);
	if (!r->conn)
		return -errno;
	r->ep = ep;
	r->id = w.client_id;
	r->rkey = r->akey = r->wkey = hkv_conn_region(r->conn)->rkey;
	r->windows = !!(hkv_conn_region(r->conn)->access & HKV_ACCESS_WINDOWS);
	if (r->windows) {
		struct hkv_ctl_granted gr;

		ret = raw_grant(r, HKV_GRANT_BASE, &gr);
		if (ret) {
			raw_close(r);
			return ret;
		}
		r->rkey = gr.rkey;
		r->akey = gr.atomic_rkey;
		r->wkey = gr.write_rkey;
	}
	r->buf = aligned_alloc(4096, RAW_BUF);
	r->mr = r->buf ? hkv_conn_reg(r->conn, r->buf, RAW_BUF) : NULL;
	ret = r->mr ? raw_xfer(r, HKV_WR_READ, 0, sizeof(r->g)) : -ENOMEM;
	if (!ret) {
		memcpy(&r->g, r->buf, sizeof(r->g));
		ret = hkv_geometry_check(&r->g, hkv_conn_region(r->conn)->length);
	}
	if (ret)
		raw_close(r);
	return ret;
}

/*
 * The allocator's state as any client can read it: the segment table, and
 * the free bits (set: free) of every SHARED segment, over the blocks of its
 * class. Entries with a class the geometry has not are counted as garbage.
 */
struct bit_census {
	uint32_t segs_free, segs_shared, segs_draining, segs_garbage;
	uint64_t blocks;    /* blocks of the SHARED segments */
	uint64_t free_bits; /* of those, free */
};

static int bit_census(struct raw *r, struct bit_census *bc)
{
	const struct hkv_geometry *g = &r->g;
	uint32_t per = RAW_BUF / g->bitmap_bytes;
	uint64_t *tab = calloc(g->nsegs, 8);
	int ret = !tab ? -ENOMEM : g->nsegs * 8ull > RAW_BUF ? -E2BIG : 0;

	memset(bc, 0, sizeof(*bc));
	if (!ret)
		ret = raw_xfer(r, HKV_WR_READ, g->seg_table_off, g->nsegs * 8);
	if (!ret)
		memcpy(tab, r->buf, (size_t)g->nsegs * 8);
	for (uint32_t i = 0; !ret && i < g->nsegs; i += per) {
		uint32_t n = g->nsegs - i < per ? g->nsegs - i : per;

		ret = raw_xfer(r, HKV_WR_READ, g->bitmap_off + (uint64_t)i * g->bitmap_bytes,
			       n * g->bitmap_bytes);
		for (uint32_t j = 0; !ret && j < n; j++) {
			uint64_t e = tab[i + j];
			uint32_t cls = hkv_seg_class(e), nb;

			if (hkv_seg_state(e) == HKV_SEG_FREE) {
				bc->segs_free++;
				continue;
			}
			if (hkv_seg_state(e) == HKV_SEG_DRAINING && cls < g->nclasses) {
				bc->segs_draining++;
				continue;
			}
			if (hkv_seg_state(e) != HKV_SEG_SHARED || cls >= g->nclasses) {
				bc->segs_garbage++;
				continue;
			}
			bc->segs_shared++;
			nb = g->seg_size / g->class_size[cls];
			bc->blocks += nb;
			for (uint32_t w = 0; w * 64 < nb; w++) {
				uint64_t bits;

				memcpy(&bits, r->buf + (size_t)j * g->bitmap_bytes + (size_t)w * 8, 8);
				if (nb - w * 64 < 64)
					bits &= (1ull << (nb - w * 64)) - 1;
				bc->free_bits += (uint64_t)__builtin_popcountll(bits);
			}
		}
	}
	free(tab);
	return ret;
}

/* The free bits of the region, or UINT64_MAX if they cannot be read. */
static uint64_t free_bits(struct raw *r)
{
	struct bit_census bc;

	return bit_census(r, &bc) ? UINT64_MAX : bc.free_bits;
}

/* ---- worker processes ------------------------------------------------------------ */

struct worker_args {
	const char *role, *uri, *token_file;
	int id, ms, fd;
};

static void emit_counters(int fd, const uint64_t *cnt)
{
	char line[1024];
	size_t n = 0;

	for (int i = 0; i < NCOUNTERS; i++)
		if (cnt[i])
			n += (size_t)snprintf(line + n, sizeof(line) - n, "%s=%llu ",
					      counter_names[i], cv(cnt, (enum counter)i));
	line[n ? n - 1 : 0] = '\n';
	write_full(fd, line, n ? n : 1);
}

#if !defined(__SANITIZE_ADDRESS__)
static void on_fatal(int sig)
{
	static const char msg[] = "test_faults worker: fatal signal; backtrace:\n";
	void *frames[64];
	int n = backtrace(frames, 64);

	if (write(2, msg, sizeof(msg) - 1) > 0)
		backtrace_symbols_fd(frames, n, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}
#endif

/* A worker that dies of a signal prints where (ASan builds: ASan does). */
static void install_crash_handler(void)
{
#if !defined(__SANITIZE_ADDRESS__)
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
	void *warm[1];

	backtrace(warm, 1); /* load libgcc now, not inside the handler */
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], on_fatal);
#endif
}

static struct hkv_client *worker_client(const struct worker_args *a)
{
	struct hkv_config *cfg = hkv_config_new();
	struct hkv_client *c = NULL;
	int ret = -ENOMEM;

	if (cfg && !hkv_config_add_server(cfg, a->uri) &&
	    !hkv_config_set_token_file(cfg, a->token_file)) {
		if (!strcmp(a->role, "rw1s")) /* test_garbage_table: wait 1 s at most */
			hkv_config_set_timeout_ms(cfg, 1000);
		ret = hkv_open(cfg, &c);
	}
	hkv_config_free(cfg);
	if (ret)
		fprintf(stderr, "worker %s %d: cannot open a client: %s\n", a->role, a->id,
			hkv_strerror(ret));
	return c;
}

/* ---- reader/writer clients ------------------------------------------------------- */

#define GKEYS 256 /* keys of the garbage test */
#define WKEYS 300 /* keys of the killed writer */

struct rw_ctx {
	struct hkv_client *c;
	const char *who;
	uint64_t rs, seq;
	uint64_t *cnt;
	uint8_t val[VAL_MAX], got[2 * VAL_MAX];
	uint8_t mbuf[4][2 * VAL_MAX];
};

static struct rw_ctx *rw_new(struct hkv_client *c, const char *who, int id, uint64_t *cnt)
{
	struct rw_ctx *x = calloc(1, sizeof(*x));

	if (!x)
		abort();
	x->c = c;
	x->who = who;
	x->rs = seed_of(id);
	x->seq = (uint64_t)id << 40;
	x->cnt = cnt;
	return x;
}

static void count_err(struct rw_ctx *x, int ret, const char *op, const char *key)
{
	switch (ret) {
	case HKV_ENOTFOUND: x->cnt[C_NOTFOUND]++; break;
	case HKV_ECORRUPT: x->cnt[C_CORRUPT]++; break;
	case HKV_EFULL: x->cnt[C_FULL]++; break;
	case HKV_EAGAIN: x->cnt[C_AGAIN]++; break;
	case HKV_ETIMEDOUT: x->cnt[C_TIMEDOUT]++; break;
	default:
		if (x->cnt[C_OTHER]++ < 5)
			fprintf(stderr, "%s: %s(\"%s\"): unexpected error %d (%s)\n", x->who, op,
				key, ret, hkv_strerror(ret));
	}
}

static void check_hit(struct rw_ctx *x, const char *op, const char *key, const uint8_t *v,
		      size_t vlen)
{
	const char *why = check_value(key, v, vlen);

	x->cnt[C_HITS]++;
	if (why && x->cnt[C_BAD]++ < 5)
		report_bad(x->who, op, key, v, vlen, why);
}

static size_t random_len(struct rw_ctx *x)
{
	return rnd(&x->rs) % 4 ? 40 + rnd(&x->rs) % 360 : 40 + rnd(&x->rs) % (VAL_MAX - 40);
}

static void rw_get(struct rw_ctx *x, const char *key)
{
	size_t vlen = 0;
	int ret = hkv_get(x->c, key, strlen(key), x->got, sizeof(x->got), &vlen, NULL);

	x->cnt[C_OPS]++;
	x->cnt[C_GETS]++;
	if (ret)
		count_err(x, ret, "get", key);
	else
		check_hit(x, "get", key, x->got, vlen);
}

static int rw_set(struct rw_ctx *x, const char *key, size_t len)
{
	int ret;

	len = make_value(x->val, len, key, ++x->seq);
	ret = hkv_set(x->c, key, strlen(key), x->val, len, NULL);
	x->cnt[C_OPS]++;
	x->cnt[C_SETS]++;
	if (ret)
		count_err(x, ret, "set", key);
	else
		x->cnt[C_SETS_OK]++;
	return ret;
}

static void rw_del(struct rw_ctx *x, const char *key)
{
	int ret = hkv_delete(x->c, key, strlen(key));

	x->cnt[C_OPS]++;
	x->cnt[C_DELS]++;
	if (ret)
		count_err(x, ret, "delete", key);
}

static void rw_mget(struct rw_ctx *x)
{
	struct hkv_mget_item it[4];
	char keys[4][16];
	int ret;

	for (int i = 0; i < 4; i++) {
		key_name(keys[i], sizeof(keys[i]), 'g', (int)(rnd(&x->rs) % GKEYS));
		it[i] = (struct hkv_mget_item){.key = keys[i], .klen = strlen(keys[i]),
					       .buf = x->mbuf[i], .cap = sizeof(x->mbuf[i])};
	}
	ret = hkv_mget(x->c, it, 4);
	x->cnt[C_OPS]++;
	x->cnt[C_MGETS]++;
	if (ret) {
		count_err(x, ret, "mget", keys[0]);
		return;
	}
	for (int i = 0; i < 4; i++) {
		x->cnt[C_GETS]++;
		if (it[i].status)
			count_err(x, it[i].status, "mget", keys[i]);
		else
			check_hit(x, "mget", keys[i], x->mbuf[i], it[i].vlen);
	}
}

/* One random operation on the garbage test's keys. */
static void rw_step(struct rw_ctx *x)
{
	char key[16];
	unsigned op = (unsigned)(rnd(&x->rs) % 100);

	key_name(key, sizeof(key), 'g', (int)(rnd(&x->rs) % GKEYS));
	if (op < 45)
		rw_get(x, key);
	else if (op < 80)
		rw_set(x, key, random_len(x));
	else if (op < 90)
		rw_del(x, key);
	else
		rw_mget(x);
}

static int run_rw(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, end = now_ms() + (uint64_t)a->ms;
	struct hkv_client_stats st;
	struct hkv_client *c = worker_client(a);
	struct rw_ctx *x;
	char who[32];

	if (!c)
		return 2;
	snprintf(who, sizeof(who), "client %d", a->id);
	x = rw_new(c, who, a->id, cnt);
	while (now_ms() < end)
		for (int i = 0; i < 32 && now_ms() < end; i++)
			rw_step(x);
	hkv_client_stats(c, &st);
	cnt[C_CORRUPT_READS] = st.corrupt_reads;
	hkv_close(c);
	free(x);
	emit_counters(a->fd, cnt);
	return cnt[C_BAD] || cnt[C_OTHER] || (cnt[C_TIMEDOUT] && strcmp(a->role, "rw1s")) ? 1 : 0;
}

/* The client that gets killed: sets of 40 B..4 KiB values until SIGKILL (or ms). */
static int run_writer(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, end = now_ms() + (uint64_t)a->ms;
	struct hkv_client *c = worker_client(a);
	struct rw_ctx *x;
	char key[16];

	if (!c)
		return 2;
	x = rw_new(c, "writer", a->id, cnt);
	for (uint64_t n = 1; !a->ms || now_ms() < end; n++) {
		key_name(key, sizeof(key), 'w', (int)(rnd(&x->rs) % WKEYS));
		rw_set(x, key, 40 + rnd(&x->rs) % (VAL_MAX - 40 + 1));
		if (n == 256)
			write_full(a->fd, "ready\n", 6);
		if (n % 512 == 0) {
			cnt[C_PROGRESS] = n;
			emit_counters(a->fd, cnt);
		}
	}
	hkv_close(c);
	free(x);
	return 0;
}

/* ---- the vandal ------------------------------------------------------------------ */

/*
 * Garbage goes only into the hash index and the data area. The header, the
 * segment table and the free bitmaps are the allocator's own metadata: a
 * client with write rights can wreck them on purpose (claim every segment,
 * free other clients' live blocks), which is a question of whom to trust
 * with write rights, not of read safety. This test is about reads staying
 * safe over whatever bytes the index and the blocks hold.
 */
struct vandal {
	struct raw r;
	uint64_t rs;
	uint64_t bucket[GKEYS][2]; /* both buckets of each test key */
	uint32_t fp[GKEYS];
	char key[GKEYS][16];
};

static void vandal_init(struct vandal *v, int id)
{
	v->rs = seed_of(id + 1000);
	for (int k = 0; k < GKEYS; k++) {
		uint64_t h;

		key_name(v->key[k], sizeof(v->key[k]), 'g', k);
		h = hkv_key_hash(&v->r.g, v->key[k], strlen(v->key[k]));
		h += !h; /* as the client does */
		v->fp[k] = hkv_fp_of(h);
		hkv_buckets_of(&v->r.g, h, &v->bucket[k][0], &v->bucket[k][1]);
	}
}

static uint64_t v_index_end(const struct vandal *v)
{
	return v->r.g.index_off + v->r.g.nbuckets * HKV_BUCKET_SIZE;
}

static uint64_t v_data_end(const struct vandal *v)
{
	return v->r.g.data_off + (uint64_t)v->r.g.nsegs * v->r.g.seg_size;
}

/* Offset of one of the buckets a test key lives in. */
static uint64_t v_key_bucket(struct vandal *v, int *k)
{
	*k = (int)(rnd(&v->rs) % GKEYS);
	return v->r.g.index_off + v->bucket[*k][rnd(&v->rs) % 2] * HKV_BUCKET_SIZE;
}

/* A block boundary of a random class in a random segment (sometimes just 64 B aligned). */
static uint64_t v_block_off(struct vandal *v, uint32_t *cls)
{
	const struct hkv_geometry *g = &v->r.g;
	uint32_t csize;
	uint64_t seg = g->data_off + rnd(&v->rs) % g->nsegs * g->seg_size;

	*cls = (uint32_t)(rnd(&v->rs) % g->nclasses);
	csize = g->class_size[*cls];
	if (rnd(&v->rs) % 4 == 0)
		return seg + rnd(&v->rs) % (g->seg_size / HKV_BLOCK_ALIGN) * HKV_BLOCK_ALIGN;
	return seg + rnd(&v->rs) % (g->seg_size / csize) * csize;
}

static void v_fill_random(struct vandal *v, uint32_t len)
{
	for (uint32_t i = 0; i < len; i += 8) {
		uint64_t x = rnd(&v->rs);

		memcpy(v->r.buf + i, &x, len - i < 8 ? len - i : 8);
	}
}

/* Random bytes, unaligned, into the index (half the time into a test key's bucket). */
static uint32_t v_random_index(struct vandal *v, uint64_t *off)
{
	uint64_t ilen = v->r.g.nbuckets * HKV_BUCKET_SIZE;
	uint32_t len = 1 + (uint32_t)(rnd(&v->rs) % 64);
	int k;

	if (rnd(&v->rs) % 2)
		*off = v_key_bucket(v, &k) + rnd(&v->rs) % HKV_BUCKET_SIZE;
	else
		*off = v->r.g.index_off + rnd(&v->rs) % ilen;
	if (*off + len > v_index_end(v))
		len = (uint32_t)(v_index_end(v) - *off);
	v_fill_random(v, len);
	return len;
}

/* A plausible slot: a test key's fingerprint, a sane class and offset, random ver. */
static uint32_t v_forged_slot(struct vandal *v, uint64_t *off)
{
	uint32_t cls;
	int k;
	uint64_t b = v_key_bucket(v, &k), s, blk = v_block_off(v, &cls);

	s = hkv_slot_make(v->fp[k], cls, (uint32_t)rnd(&v->rs), blk);
	memcpy(v->r.buf, &s, 8);
	*off = b + rnd(&v->rs) % HKV_BUCKET_SLOTS * 8;
	return 8;
}

/* Zeroes over a run of slots: entries vanish (their blocks leak). */
static uint32_t v_zero_slots(struct vandal *v, uint64_t *off)
{
	uint32_t len = 8 * (1 + (uint32_t)(rnd(&v->rs) % 8));
	int k;

	*off = v_key_bucket(v, &k) + rnd(&v->rs) % HKV_BUCKET_SLOTS * 8;
	if (*off + len > v_index_end(v))
		len = (uint32_t)(v_index_end(v) - *off);
	memset(v->r.buf, 0, len);
	return len;
}

static uint32_t v_random_data(struct vandal *v, uint64_t *off)
{
	uint64_t dlen = v_data_end(v) - v->r.g.data_off;
	uint32_t len = 1 + (uint32_t)(rnd(&v->rs) % 256);

	*off = v->r.g.data_off + rnd(&v->rs) % dlen;
	if (*off + len > v_data_end(v))
		len = (uint32_t)(v_data_end(v) - *off);
	v_fill_random(v, len);
	return len;
}

/* A LIVE block header with a test key after it, but a random CRC. */
static uint32_t v_fake_header(struct vandal *v, uint64_t *off)
{
	int k = (int)(rnd(&v->rs) % GKEYS);
	size_t klen = strlen(v->key[k]);
	uint32_t cls;
	struct hkv_block_hdr h = {.sum = (uint32_t)rnd(&v->rs),
				  .vlen = (uint32_t)(rnd(&v->rs) % 512),
				  .klen = (uint16_t)klen};

	*off = v_block_off(v, &cls);
	h.meta = hkv_meta_make(HKV_BLK_LIVE, cls, (uint32_t)rnd(&v->rs));
	memcpy(v->r.buf, &h, sizeof(h));
	memcpy(v->r.buf + sizeof(h), v->key[k], klen);
	return (uint32_t)(sizeof(h) + klen);
}

static int vandal_strike(struct vandal *v, uint64_t *cnt)
{
	unsigned kind = (unsigned)(rnd(&v->rs) % 100);
	uint64_t off;
	uint32_t len;

	if (kind < 30)
		len = v_random_index(v, &off);
	else if (kind < 55)
		len = v_forged_slot(v, &off);
	else if (kind < 60)
		len = v_zero_slots(v, &off);
	else if (kind < 90)
		len = v_random_data(v, &off);
	else
		len = v_fake_header(v, &off);
	if (off < v->r.g.index_off || off + len > v_data_end(v) ||
	    (off + len > v_index_end(v) && off < v->r.g.data_off))
		abort(); /* never outside the index and the data area */
	cnt[C_VANDAL_WRITES]++;
	cnt[C_VANDAL_BYTES] += len;
	return raw_xfer(&v->r, HKV_WR_WRITE, off, len);
}

/* Quiet for ms/8, garbage for 5ms/8, then gone: clients see before, during, after. */
static int run_vandal(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, end;
	uint64_t pace_us = strncmp(a->uri, "verbs:", 6) ? 200 : 1000;
	struct vandal *v = calloc(1, sizeof(*v));
	int ret = v ? raw_open(&v->r, a->uri, a->token_file) : -ENOMEM;

	if (ret) {
		fprintf(stderr, "vandal: cannot connect: %s\n", hkv_strerror(ret));
		return 2;
	}
	vandal_init(v, a->id);
	sleep_ms((uint64_t)a->ms / 8);
	end = now_ms() + (uint64_t)a->ms * 5 / 8;
	while (!ret && now_ms() < end) {
		ret = vandal_strike(v, cnt);
		usleep((useconds_t)pace_us);
	}
	if (ret)
		fprintf(stderr, "vandal: a WRITE failed: %s\n", hkv_strerror(ret));
	raw_close(&v->r);
	free(v);
	emit_counters(a->fd, cnt);
	return ret ? 2 : 0;
}

/* ---- the table vandal (test_garbage_table) ------------------------------------------- */

/*
 * Garbage into what the allocator trusts: segment table entries and bitmap
 * words, by CAS (what every writer's ATOMIC rights allow, windows or not).
 * Entries become random words, SHARED in another or a nonexistent class,
 * DRAINING or FREE; bitmap words random, all free or none free.
 */
static int table_strike(struct raw *r, uint64_t *rs, uint64_t *cnt)
{
	const struct hkv_geometry *g = &r->g;
	unsigned kind = (unsigned)(rnd(rs) % 100);
	uint32_t seg = (uint32_t)(rnd(rs) % g->nsegs);
	uint64_t off, old, val;
	int ret;

	if (kind < 50)
		off = g->seg_table_off + (uint64_t)seg * 8;
	else
		off = g->bitmap_off + (uint64_t)seg * g->bitmap_bytes +
		      rnd(rs) % (g->bitmap_bytes / 8) * 8;
	if ((ret = raw_xfer(r, HKV_WR_READ, off, 8)))
		return ret;
	memcpy(&old, r->buf, 8);
	if (kind < 20)
		val = rnd(rs);
	else if (kind < 35)
		val = hkv_seg_make(HKV_SEG_SHARED, (uint32_t)(rnd(rs) % g->nclasses),
				   hkv_seg_epoch(old) + 1);
	else if (kind < 45)
		val = hkv_seg_make(rnd(rs) % 2 ? HKV_SEG_FREE : HKV_SEG_DRAINING, hkv_seg_class(old),
				   hkv_seg_epoch(old) + 1);
	else if (kind < 50)
		val = hkv_seg_make(HKV_SEG_SHARED, g->nclasses + (uint32_t)(rnd(rs) % 64),
				   hkv_seg_epoch(old) + 1);
	else if (kind < 75)
		val = rnd(rs);
	else if (kind < 90)
		val = ~0ull;
	else
		val = 0;
	cnt[C_VANDAL_WRITES]++;
	cnt[C_VANDAL_BYTES] += 8;
	return raw_op(r, HKV_WR_CAS, off, 8, r->akey, old, val);
}

/* Quiet for ms/8, garbage for 5ms/8, then gone (as run_vandal). */
static int run_table_vandal(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, end, rs = seed_of(a->id + 2000);
	uint64_t pace_us = strncmp(a->uri, "verbs:", 6) ? 1000 : 2000;
	struct raw r;
	int ret = raw_open(&r, a->uri, a->token_file);

	if (ret) {
		fprintf(stderr, "table vandal: cannot connect: %s\n", hkv_strerror(ret));
		return 2;
	}
	sleep_ms((uint64_t)a->ms / 8);
	end = now_ms() + (uint64_t)a->ms * 5 / 8;
	while (!ret && now_ms() < end) {
		ret = table_strike(&r, &rs, cnt);
		usleep((useconds_t)pace_us);
	}
	if (ret)
		fprintf(stderr, "table vandal: a READ or CAS failed: %s\n", hkv_strerror(ret));
	raw_close(&r);
	emit_counters(a->fd, cnt);
	return ret ? 2 : 0;
}

/* ---- the header vandal (test_garbage_header) ----------------------------------------- */

#define HEADER_ROUNDS 200

static const struct {
	size_t off, len;
} header_fields[] = {
#define F(f) {offsetof(struct hkv_geometry, f), sizeof(((struct hkv_geometry *)0)->f)}
	F(magic), F(version), F(flags), F(total_size), F(seg_table_off), F(bitmap_off),
	F(index_off), F(data_off), F(nbuckets), F(nsegs), F(seg_size), F(bitmap_bytes),
	F(nclasses), F(boot_id), F(intent_off), F(nintents), F(rsv32), F(hash_key),
	F(reserved), F(class_size), F(sum),
#undef F
	{HKV_CLOCK_OFF, 8},
};

/*
 * One strike at the header: a field gets random bytes or 0 / all ones; a
 * class size 0 (the divisor the server once took from here); a forged
 * header that validates (sealed, another hash key or segment count); or
 * random bytes anywhere in the header's 4 KiB.
 */
static int header_strike(struct raw *r, uint64_t *rs, uint64_t *cnt)
{
	unsigned kind = (unsigned)(rnd(rs) % 100);
	size_t nf = sizeof(header_fields) / sizeof(header_fields[0]);
	uint64_t off;
	uint32_t len;

	if (kind < 50) {
		size_t f = rnd(rs) % nf;

		off = header_fields[f].off;
		len = (uint32_t)header_fields[f].len;
		for (uint32_t i = 0; i < len; i++)
			r->buf[i] = kind < 30 ? (uint8_t)rnd(rs) : kind < 40 ? 0 : 0xff;
	} else if (kind < 65) {
		uint32_t zero = 0, c = (uint32_t)(rnd(rs) % HKV_NCLASSES_MAX);

		off = offsetof(struct hkv_geometry, class_size) + c * sizeof(uint32_t);
		len = 4;
		memcpy(r->buf, &zero, 4);
	} else if (kind < 80) {
		struct hkv_geometry g = r->g;

		if (kind < 70)
			g.hash_key[rnd(rs) % sizeof(g.hash_key)] ^= 0x5a;
		else if (kind < 75)
			g.nsegs = g.nsegs / 2 + 1;
		else
			g.class_size[0] = 64 * (1 + (uint32_t)(rnd(rs) % 4));
		hkv_geometry_seal(&g);
		off = 0;
		len = sizeof(g);
		memcpy(r->buf, &g, len);
	} else {
		len = 1 + (uint32_t)(rnd(rs) % 64);
		off = rnd(rs) % (HKV_HEADER_SIZE - len + 1);
		for (uint32_t i = 0; i < len; i++)
			r->buf[i] = (uint8_t)rnd(rs);
	}
	cnt[C_VANDAL_WRITES]++;
	cnt[C_VANDAL_BYTES] += len;
	return raw_xfer(r, HKV_WR_WRITE, off, len);
}

/* Quiet for ms/8, HEADER_ROUNDS strikes spread over 5ms/8, then gone. */
static int run_header_vandal(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, rs = seed_of(a->id + 3000), t0;
	struct raw r;
	int ret = raw_open(&r, a->uri, a->token_file);

	if (ret) {
		fprintf(stderr, "header vandal: cannot connect: %s\n", hkv_strerror(ret));
		return 2;
	}
	sleep_ms((uint64_t)a->ms / 8);
	t0 = now_ms();
	for (int i = 0; !ret && i < HEADER_ROUNDS; i++) {
		uint64_t at = t0 + (uint64_t)a->ms * 5 / 8 * (uint64_t)(i + 1) / HEADER_ROUNDS;

		ret = header_strike(&r, &rs, cnt);
		while (now_ms() < at)
			sleep_ms(1);
	}
	if (ret)
		fprintf(stderr, "header vandal: a WRITE failed: %s\n", hkv_strerror(ret));
	raw_close(&r);
	emit_counters(a->fd, cnt);
	return ret ? 2 : 0;
}

/* New clients, one after another for ms: each connects, sets its key and
 * reads it back. An open that fails, and anything but the value just set,
 * is counted. */
static int run_newcomer(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0}, end = now_ms() + (uint64_t)a->ms;
	char key[32], val[64], got[64];

	for (int n = 0; now_ms() < end; n++) {
		struct hkv_config *cfg = hkv_config_new();
		struct hkv_client *c = NULL;
		size_t vlen = 0;
		int ret = -ENOMEM;

		if (cfg && !hkv_config_add_server(cfg, a->uri) &&
		    !hkv_config_set_token_file(cfg, a->token_file))
			ret = hkv_open(cfg, &c);
		hkv_config_free(cfg);
		if (ret) {
			cnt[C_OPEN_FAILS]++;
			fprintf(stderr, "newcomer %d: cannot open a client: %s\n", n,
				hkv_strerror(ret));
			sleep_ms(20);
			continue;
		}
		cnt[C_OPENS]++;
		snprintf(key, sizeof(key), "newcomer-%d-%d", a->id, n % 50);
		snprintf(val, sizeof(val), "value %d of %s", n, key);
		cnt[C_SETS]++;
		ret = hkv_set(c, key, strlen(key), val, strlen(val), NULL);
		if (!ret) {
			cnt[C_SETS_OK]++;
			cnt[C_GETS]++;
			ret = hkv_get(c, key, strlen(key), got, sizeof(got), &vlen, NULL);
			if (!ret && (vlen != strlen(val) || memcmp(got, val, vlen)))
				cnt[C_BAD]++;
			else if (!ret)
				cnt[C_HITS]++;
			else
				cnt[C_RB_MISS]++;
		}
		if (ret && ret != HKV_EFULL && ret != HKV_EAGAIN) {
			cnt[C_OTHER]++;
			fprintf(stderr, "newcomer %d: %s\n", n, hkv_strerror(ret));
		}
		hkv_close(c);
		sleep_ms(5);
	}
	emit_counters(a->fd, cnt);
	return 0;
}

/* ---- the holder (test_holder_killed) --------------------------------------------------- */

/* Classes whose claims take two blocks or more (16 KiB's worth, client/alloc.c). */
#define HOLD_MAX_CLASS 8192

/* The value length that makes key's item fill a block of class cls exactly. */
static size_t class_vlen(const struct hkv_geometry *g, uint32_t cls, const char *key)
{
	return g->class_size[cls] - HKV_BLOCK_HDR - strlen(key);
}

/* One item, of 'prefix' bytes, in every class of up to HOLD_MAX_CLASS bytes;
 * how many sets succeeded. */
static int set_per_class(struct hkv_client *c, char prefix)
{
	static uint8_t val[HOLD_MAX_CLASS];
	char key[16];
	int ok = 0;

	memset(val, prefix, sizeof(val));
	for (uint32_t cls = 0; cls < c->g.nclasses && c->g.class_size[cls] <= HOLD_MAX_CLASS;
	     cls++) {
		key_name(key, sizeof(key), prefix, (int)cls);
		ok += !hkv_set(c, key, strlen(key), val, class_vlen(&c->g, cls, key), NULL);
	}
	return ok;
}

/* How many of set_per_class()' items are there; those that do not read back
 * whole (or fail to delete) counted in *bad. Deletes them. */
static int check_and_delete_per_class(struct hkv_client *c, char prefix, int *bad)
{
	static uint8_t got[HOLD_MAX_CLASS];
	char key[16];
	int found = 0;

	*bad = 0;
	for (uint32_t cls = 0; cls < c->g.nclasses && c->g.class_size[cls] <= HOLD_MAX_CLASS;
	     cls++) {
		size_t vlen = 0, want;
		int ret;

		key_name(key, sizeof(key), prefix, (int)cls);
		want = class_vlen(&c->g, cls, key);
		ret = hkv_get(c, key, strlen(key), got, sizeof(got), &vlen, NULL);
		if (ret == HKV_ENOTFOUND)
			continue;
		found++;
		for (size_t i = 0; !ret && i < vlen; i++)
			ret = got[i] == (uint8_t)prefix ? 0 : HKV_ECORRUPT;
		if (ret || vlen != want)
			(*bad)++;
		if (!ret && hkv_delete(c, key, strlen(key)))
			(*bad)++;
	}
	return found;
}

/* The client that is stopped, then killed, holding blocks it claimed: one
 * item per class, its counters and "ready", then SIGSTOP. */
static int run_holder(const struct worker_args *a)
{
	uint64_t cnt[NCOUNTERS] = {0};
	struct hkv_client_stats st;
	struct hkv_client *c = worker_client(a);

	if (!c)
		return 2;
	cnt[C_SETS_OK] = (uint64_t)set_per_class(c, 'h');
	hkv_client_stats(c, &st);
	cnt[C_CLAIMED] = st.blocks_claimed;
	cnt[C_GIVEN_BACK] = st.blocks_given_back;
	emit_counters(a->fd, cnt);
	write_full(a->fd, "ready\n", 6);
	raise(SIGSTOP);
	sleep_ms((uint64_t)a->ms); /* (not reached: SIGKILLed while stopped) */
	return 0;
}

/* The claimer (test_claimer_killed): its set of a value of a->ms bytes
 * stops itself (SIGSTOP) right after its claim CAS won, before the HELD
 * stamps - "ready" first. It is then killed there. */
static int claimer_fd = -1;

static void claimer_stop(struct hkv_client *c, enum hkv_test_point point)
{
	(void)c;
	if (point != HKV_TP_CLAIM_STAMP || claimer_fd < 0)
		return;
	write_full(claimer_fd, "ready\n", 6);
	claimer_fd = -1;
	raise(SIGSTOP);
}

static int run_claimer(const struct worker_args *a)
{
	static uint8_t val[65536];
	struct hkv_client *c = worker_client(a);
	char key[32];

	if (!c || a->ms <= 0 || (size_t)a->ms > sizeof(val))
		return 2;
	memset(val, 'k', sizeof(val));
	snprintf(key, sizeof(key), "claimer-%d", a->id);
	claimer_fd = a->fd;
	hkv_test_hook = claimer_stop;
	(void)hkv_set(c, key, strlen(key), val, (size_t)a->ms, NULL);
	return 3; /* (not reached: killed while stopped) */
}

static int nf_run_load(const struct worker_args *a); /* test_netdev_flap's children */
static int nf_run_read(const struct worker_args *a);

static int worker_main(int argc, char **argv)
{
	struct worker_args a;

	if (argc != 8) {
		fprintf(stderr, "usage: test_faults worker ROLE URI TOKEN-FILE ID MS FD\n");
		return 2;
	}
	a = (struct worker_args){.role = argv[2], .uri = argv[3], .token_file = argv[4],
				 .id = atoi(argv[5]), .ms = atoi(argv[6]), .fd = atoi(argv[7])};
	install_crash_handler();
	if (!strcmp(a.role, "rw") || !strcmp(a.role, "rw1s"))
		return run_rw(&a);
	if (!strcmp(a.role, "writer"))
		return run_writer(&a);
	if (!strcmp(a.role, "vandal"))
		return run_vandal(&a);
	if (!strcmp(a.role, "tablevandal"))
		return run_table_vandal(&a);
	if (!strcmp(a.role, "headervandal"))
		return run_header_vandal(&a);
	if (!strcmp(a.role, "newcomer"))
		return run_newcomer(&a);
	if (!strcmp(a.role, "holder"))
		return run_holder(&a);
	if (!strcmp(a.role, "claimer"))
		return run_claimer(&a);
	if (!strcmp(a.role, "flap-load"))
		return nf_run_load(&a);
	if (!strcmp(a.role, "flap-read"))
		return nf_run_read(&a);
	fprintf(stderr, "test_faults worker: unknown role %s\n", a.role);
	return 2;
}

/* ---- the parent's side of workers -------------------------------------------------- */

struct worker {
	pid_t pid;
	int fd, status, hung, ready, id;
	const char *role;
	uint64_t cnt[NCOUNTERS];
	char buf[4096];
	size_t len;
};

/* fork + exec of this binary in worker mode; its counters come back on a pipe. */
static int spawn_worker(struct worker *w, const struct hkvserver *s, const char *role, int id,
			int ms)
{
	char exe[4096], ids[16], mss[16], fds[16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int p[2];

	memset(w, 0, sizeof(*w));
	w->role = role;
	w->id = id;
	if (n <= 0 || pipe2(p, O_CLOEXEC))
		return -errno;
	exe[n] = 0;
	snprintf(ids, sizeof(ids), "%d", id);
	snprintf(mss, sizeof(mss), "%d", ms);
	snprintf(fds, sizeof(fds), "%d", p[1]);
	fflush(NULL);
	w->pid = fork();
	if (w->pid == 0) {
		const char *argv[] = {exe, "worker", role, s->uri, s->token_file,
				      ids, mss, fds, NULL};

		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		fcntl(p[1], F_SETFD, 0);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	if (w->pid < 0) {
		close(p[0]);
		return -errno;
	}
	w->fd = p[0];
	return 0;
}

static void parse_line(struct worker *w, char *line)
{
	char *save = NULL;

	for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(tok, '=');

		if (!eq) {
			w->ready |= !strcmp(tok, "ready");
			continue;
		}
		*eq = 0;
		for (int i = 0; i < NCOUNTERS; i++)
			if (!strcmp(tok, counter_names[i]))
				w->cnt[i] = strtoull(eq + 1, NULL, 10);
	}
}

/* Read what the worker sent within timeout_ms; >0 if anything came. */
static int drain(struct worker *w, int timeout_ms)
{
	struct pollfd p = {.fd = w->fd, .events = POLLIN};
	ssize_t n;
	char *nl;

	if (w->fd < 0) {
		sleep_ms((uint64_t)timeout_ms);
		return 0;
	}
	if (poll(&p, 1, timeout_ms) <= 0)
		return 0;
	n = read(w->fd, w->buf + w->len, sizeof(w->buf) - 1 - w->len);
	if (n <= 0) {
		close(w->fd);
		w->fd = -1;
		return 0;
	}
	w->len += (size_t)n;
	w->buf[w->len] = 0;
	while ((nl = strchr(w->buf, '\n'))) {
		*nl = 0;
		parse_line(w, w->buf);
		w->len -= (size_t)(nl + 1 - w->buf);
		memmove(w->buf, nl + 1, w->len + 1);
	}
	if (w->len == sizeof(w->buf) - 1)
		w->len = 0; /* an endless line: drop it */
	return 1;
}

/* The worker was reaped: collect what it still had to say. */
static void finish_worker(struct worker *w)
{
	while (w->fd >= 0 && drain(w, 200))
		;
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	w->pid = 0;
}

/* Has the worker exited (reaped now)? */
static int worker_exited(struct worker *w)
{
	pid_t r = waitpid(w->pid, &w->status, WNOHANG);

	return r == w->pid || (r < 0 && errno != EINTR);
}

/* Wait for the worker to exit (killing it after timeout_ms); collect its counters. */
static void wait_worker(struct worker *w, int timeout_ms)
{
	uint64_t end = now_ms() + (uint64_t)timeout_ms;

	while (!worker_exited(w)) {
		if (now_ms() > end) {
			fprintf(stderr, "worker %s %d: still running after %d ms; killed\n",
				w->role, w->id, timeout_ms);
			w->hung = 1;
			kill(w->pid, SIGKILL);
			waitpid(w->pid, &w->status, 0);
			break;
		}
		drain(w, 20);
	}
	finish_worker(w);
}

static int worker_ok(const struct worker *w)
{
	if (!w->hung && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0)
		return 1;
	if (WIFSIGNALED(w->status))
		fprintf(stderr, "worker %s %d CRASHED: killed by signal %d (%s)\n", w->role, w->id,
			WTERMSIG(w->status), strsignal(WTERMSIG(w->status)));
	else if (!w->hung)
		fprintf(stderr, "worker %s %d failed: exit status %d\n", w->role, w->id,
			WEXITSTATUS(w->status));
	return 0;
}

static int server_alive(struct hkvserver *s)
{
	if (s->pid > 0 && waitpid(s->pid, NULL, WNOHANG) == s->pid) {
		fprintf(stderr, "the server died; see %s/server.log\n", s->dir);
		s->pid = 0; /* reaped: hkvserver_stop must not signal it */
	}
	return s->pid > 0;
}

/* ---- test_garbage ------------------------------------------------------------------- */

#define MAX_RW 3

static void print_rw_counts(const char *what, const uint64_t *c)
{
	printf("# %s: %llu ops: %llu gets (%llu hits), %llu sets (%llu ok), %llu deletes, "
	       "%llu multi-gets\n",
	       what, cv(c, C_OPS), cv(c, C_GETS), cv(c, C_HITS), cv(c, C_SETS), cv(c, C_SETS_OK),
	       cv(c, C_DELS), cv(c, C_MGETS));
	printf("#   errors: ENOTFOUND %llu, ECORRUPT %llu, EFULL %llu, EAGAIN %llu, ETIMEDOUT %llu, "
	       "other %llu; corrupt block reads %llu; values nobody wrote: %llu\n",
	       cv(c, C_NOTFOUND), cv(c, C_CORRUPT), cv(c, C_FULL), cv(c, C_AGAIN),
	       cv(c, C_TIMEDOUT), cv(c, C_OTHER), cv(c, C_CORRUPT_READS), cv(c, C_BAD));
}

/*
 * Set a fresh value and read it straight back. A miss (or an older value)
 * here is counted and printed, not failed: garbage left in a key's buckets
 * may hide the key (slots carrying its fingerprint whose blocks never
 * validate crowd out the real entry), and the issue allows misses for
 * trashed slots. A value that fails check_value() is a failure.
 */
static void set_readback(struct rw_ctx *x, const char *key)
{
	struct val_hdr h;
	size_t len, vlen = 0;
	const char *why;
	int ret;

	if (rw_set(x, key, random_len(x)))
		return;
	memcpy(&h, x->val, sizeof(h)); /* x->val still holds what was set */
	len = h.len;
	ret = hkv_get(x->c, key, strlen(key), x->got, sizeof(x->got), &vlen, NULL);
	x->cnt[C_OPS]++;
	x->cnt[C_GETS]++;
	if (ret == HKV_ENOTFOUND) {
		x->cnt[C_RB_MISS]++;
		return;
	}
	if (ret) {
		count_err(x, ret, "get after set", key);
		return;
	}
	x->cnt[C_HITS]++;
	if (vlen == len && !memcmp(x->got, x->val, len))
		return;
	why = check_value(key, x->got, vlen);
	if (!why) {
		x->cnt[C_RB_STALE]++;
		return;
	}
	if (x->cnt[C_BAD]++ < 5)
		report_bad(x->who, "get after set", key, x->got, vlen, why);
}

/* After the vandal: a new client reads every key, then writes and reads back
 * (timeout_ms: its hkv_config's, 0 for the default; max_waits: stop writing
 * after that many sets timed out or came back EAGAIN, 0 for never). */
static void fresh_client_pass(const struct hkvserver *s, uint64_t *cnt, int timeout_ms,
			      uint64_t max_waits)
{
	struct hkv_config *cfg = hkvserver_config(s);
	struct hkv_client *c = NULL;
	struct hkv_client_stats st;
	struct rw_ctx *x;
	char key[16];

	if (timeout_ms)
		hkv_config_set_timeout_ms(cfg, timeout_ms);
	if (hkv_open(cfg, &c)) {
		cnt[C_OTHER]++;
		hkv_config_free(cfg);
		return;
	}
	hkv_config_free(cfg);
	x = rw_new(c, "fresh client", 99, cnt);

	for (int i = 0; i < GKEYS; i++) {
		key_name(key, sizeof(key), 'g', i);
		rw_get(x, key);
	}
	for (int i = 0; i < GKEYS + 64; i++) {
		if (max_waits && cnt[C_AGAIN] + cnt[C_TIMEDOUT] >= max_waits)
			break;
		key_name(key, sizeof(key), i < GKEYS ? 'g' : 'n', i);
		set_readback(x, key);
	}
	hkv_client_stats(x->c, &st);
	cnt[C_CORRUPT_READS] = st.corrupt_reads;
	hkv_close(x->c);
	free(x);
}

/* nrw workers of kind rw and one of kind vandal, for ms, side by side:
 * their counters added into sum; returns how many did not end well. */
static int run_beside_vandal(struct hkvserver *s, int nrw, const char *rw, const char *vandal,
			     int ms, uint64_t *sum)
{
	struct worker w[MAX_RW + 1];
	int crashed = 0;

	for (int i = 0; i <= nrw; i++)
		if (spawn_worker(&w[i], s, i < nrw ? rw : vandal, i + 1, ms)) {
			perror("spawn_worker");
			abort();
		}
	for (int i = 0; i <= nrw; i++) {
		wait_worker(&w[i], ms + 60000);
		crashed += !worker_ok(&w[i]);
		for (int k = 0; k < NCOUNTERS; k++)
			sum[k] += w[i].cnt[k];
	}
	return crashed;
}

static void test_garbage(void)
{
	const int nrw = use_verbs ? 2 : MAX_RW, ms = use_verbs ? 12000 : 4000;
	uint64_t sum[NCOUNTERS] = {0}, fresh[NCOUNTERS] = {0}, t0 = now_ms();
	struct hkvserver s;
	/* the vandal WRITEs anywhere, so windows (which stop it at the NIC,
	 * test_windows) are off: this is about clients facing a garbage region */
	const char *const no_windows[] = {"--no-windows", NULL};
	int crashed = 0, alive;

	CHECK(hkvserver_start(&s, use_verbs, "8M", "64K", no_windows) == 0);
	crashed = run_beside_vandal(&s, nrw, "rw", "vandal", ms, sum);
	printf("# garbage: %d clients for %.1f s; vandal: %llu WRITEs, %llu bytes into index and "
	       "data area\n",
	       nrw, (now_ms() - t0) / 1000.0, cv(sum, C_VANDAL_WRITES), cv(sum, C_VANDAL_BYTES));
	print_rw_counts("clients", sum);
	if (server_alive(&s))
		fresh_client_pass(&s, fresh, 0, 0);
	print_rw_counts("fresh client after the vandal", fresh);
	printf("#   its own sets read straight back: %llu missing, %llu older values\n",
	       cv(fresh, C_RB_MISS), cv(fresh, C_RB_STALE));
	alive = server_alive(&s);
	hkvserver_stop(&s);
	CHECK(alive);
	CHECK(crashed == 0);
	CHECK(sum[C_BAD] == 0 && fresh[C_BAD] == 0);
	CHECK(sum[C_OTHER] == 0 && fresh[C_OTHER] == 0);
	CHECK(sum[C_TIMEDOUT] == 0 && fresh[C_TIMEDOUT] == 0);
	CHECK(sum[C_VANDAL_WRITES] > 0);
	CHECK(sum[C_HITS] > 0 && fresh[C_SETS_OK] > 0);
	/* a set that returned 0 must be readable right after, garbage or not */
	CHECK(fresh[C_RB_MISS] == 0 && fresh[C_RB_STALE] == 0);
}

#define FILL_VLEN 1000

/* How many FILL_VLEN-byte items client c stores before the store is full. */
static int fill_store(struct hkv_client *c, const char *prefix, int *n)
{
	static uint8_t val[FILL_VLEN];
	char key[32];
	int ret = 0;

	memset(val, 'f', sizeof(val));
	for (*n = 0; *n < 1000000; (*n)++) {
		ret = hkv_set(c, key, (size_t)snprintf(key, sizeof(key), "%s-%d", prefix, *n), val,
			      sizeof(val), NULL);
		if (ret)
			break;
	}
	return ret;
}

/*
 * test_garbage_table: what test_garbage leaves out. A writer's ATOMIC
 * rights reach the segment table and the bitmaps (they must: claims are CAS
 * on bitmap words), so a client can CAS garbage there - the table vandal
 * does, while reader/writer clients run. Clients may fail sets (HKV_EFULL,
 * HKV_EAGAIN, and HKV_ETIMEDOUT: garbage can leave the server a segment
 * move that never ends, test_stray_bits) and miss items whose segments the
 * garbage made the server carve again; they must never crash, never return
 * a value nobody wrote for its key, never fail otherwise; the server must
 * keep serving, and a fresh client after the vandal reads straight back
 * what it sets. Its clients wait 1 s at most for the control plane, and
 * the fresh one stops setting after 16 such waits.
 */
static void test_garbage_table(void)
{
	const int nrw = use_verbs ? 2 : MAX_RW, ms = use_verbs ? 12000 : 4000;
	uint64_t sum[NCOUNTERS] = {0}, fresh[NCOUNTERS] = {0}, t0 = now_ms();
	struct bit_census bc = {0};
	struct hkvserver s;
	struct raw r;
	int crashed = 0, alive;

	CHECK(hkvserver_start(&s, use_verbs, "8M", "64K", NULL) == 0);
	crashed = run_beside_vandal(&s, nrw, "rw1s", "tablevandal", ms, sum);
	if (!raw_open(&r, s.uri, s.token_file)) {
		bit_census(&r, &bc);
		raw_close(&r);
	}
	printf("# garbage table: %d clients for %.1f s; vandal: %llu CASes into the segment "
	       "table and bitmaps; then %u segments SHARED, %u FREE, %u DRAINING, %u garbage\n",
	       nrw, (now_ms() - t0) / 1000.0, cv(sum, C_VANDAL_WRITES), bc.segs_shared,
	       bc.segs_free, bc.segs_draining, bc.segs_garbage);
	print_rw_counts("clients", sum);
	if (server_alive(&s))
		fresh_client_pass(&s, fresh, 1000, 16);
	print_rw_counts("fresh client after the vandal", fresh);
	printf("#   its own sets read straight back: %llu missing, %llu older values\n",
	       cv(fresh, C_RB_MISS), cv(fresh, C_RB_STALE));
	alive = server_alive(&s);
	hkvserver_stop(&s);
	CHECK(alive);
	CHECK(crashed == 0);
	CHECK(sum[C_BAD] == 0 && fresh[C_BAD] == 0);
	CHECK(sum[C_OTHER] == 0 && fresh[C_OTHER] == 0);
	CHECK(sum[C_VANDAL_WRITES] > 0);
	CHECK(sum[C_HITS] > 0 && fresh[C_HITS] > 0 && fresh[C_SETS_OK] > 0);
	CHECK(fresh[C_RB_MISS] == 0 && fresh[C_RB_STALE] == 0);
}

/*
 * test_garbage_header (issue 28): a writer reaches the region header where
 * memory windows are off (shm; verbs --no-windows). The server once took
 * its geometry from there in place: class_size[0] = 0 killed it with
 * SIGFPE, a huge bitmap_off with SIGSEGV, and bogus nsegs/nbuckets left
 * every new client HKV_ECORRUPT for the server's life. Now the vandal
 * writes HEADER_ROUNDS strikes over every header field (random bytes,
 * zeroes, all ones, class sizes 0, forged headers that validate, the clock
 * word) while rw clients work and a newcomer connects again and again: the
 * server lives, puts the header back, and every newcomer connects and reads
 * back what it set; no client gets a value nobody wrote. After the vandal,
 * the header is the server's again and a fresh client reads and writes.
 */
static void test_garbage_header(void)
{
	const int nrw = use_verbs ? 1 : 2, ms = use_verbs ? 12000 : 4000;
	const char *const no_windows[] = {"--no-windows", NULL};
	uint64_t sum[NCOUNTERS] = {0}, nc[NCOUNTERS] = {0}, fresh[NCOUNTERS] = {0};
	struct worker w[4];
	struct hkv_geometry before = {0};
	struct hkvserver s;
	struct raw r;
	int crashed = 0, alive, nw = nrw + 2, same = 0;

	CHECK(hkvserver_start(&s, use_verbs, "8M", "64K", no_windows) == 0);
	if (!raw_open(&r, s.uri, s.token_file)) {
		before = r.g;
		raw_close(&r);
	}
	for (int i = 0; i < nw; i++)
		if (spawn_worker(&w[i], &s, i < nrw ? "rw" : i == nrw ? "newcomer" : "headervandal",
				 i + 1, ms)) {
			perror("spawn_worker");
			abort();
		}
	for (int i = 0; i < nw; i++) {
		wait_worker(&w[i], ms + 60000);
		crashed += !worker_ok(&w[i]);
		for (int k = 0; k < NCOUNTERS; k++)
			(i == nrw ? nc : sum)[k] += w[i].cnt[k];
	}
	sleep_ms(50); /* the server's tick puts back the vandal's last strike */
	if (server_alive(&s) && !raw_open(&r, s.uri, s.token_file)) {
		same = !memcmp(&r.g, &before, sizeof(before));
		raw_close(&r);
	}
	printf("# garbage header: %d clients and a newcomer for %.1f s; vandal: %llu WRITEs, "
	       "%llu bytes over the header\n", nrw, ms / 1000.0, cv(sum, C_VANDAL_WRITES),
	       cv(sum, C_VANDAL_BYTES));
	print_rw_counts("clients", sum);
	printf("# newcomers: %llu connected, %llu could not; %llu sets, %llu read back, %llu "
	       "wrong, %llu missing, %llu other errors\n", cv(nc, C_OPENS), cv(nc, C_OPEN_FAILS),
	       cv(nc, C_SETS_OK), cv(nc, C_HITS), cv(nc, C_BAD), cv(nc, C_RB_MISS),
	       cv(nc, C_OTHER));
	if (server_alive(&s))
		fresh_client_pass(&s, fresh, 0, 0);
	print_rw_counts("fresh client after the vandal", fresh);
	alive = server_alive(&s);
	hkvserver_stop(&s);
	CHECK(alive);
	CHECK(crashed == 0);
	CHECK(sum[C_VANDAL_WRITES] == HEADER_ROUNDS);
	CHECK(same); /* the header is the server's geometry again */
	CHECK(sum[C_BAD] == 0 && nc[C_BAD] == 0 && fresh[C_BAD] == 0);
	CHECK(sum[C_OTHER] == 0 && nc[C_OTHER] == 0 && fresh[C_OTHER] == 0);
	CHECK(nc[C_OPENS] >= 20 && nc[C_OPEN_FAILS] == 0);
	CHECK(nc[C_HITS] == nc[C_SETS_OK] && nc[C_SETS_OK] > 0);
	CHECK(fresh[C_SETS_OK] > 0 && fresh[C_RB_MISS] == 0 && fresh[C_RB_STALE] == 0);
}

/*
 * test_stray_bits: a set bit past the last block of a segment's class in
 * its last bitmap word (garbage from a CAS, or the carry of an FAA that
 * "freed" an already free last block). Every block of the segment is free,
 * so the server picks it to move to another class. drain_step()
 * (server/slab.c) once CASed the word from exactly the class's mask to 0,
 * which failed on the stray bit every time, on a path that never reached
 * the move's 3 s abort: every CARVE for any class then failed after 4 s,
 * for good. Now the word as it is goes to 0. Made exactly: the store is
 * filled with one class, emptied, a stray bit is put past the last block of
 * every segment, and one item of another class is set.
 */
static void test_stray_bits(void)
{
	struct hkvserver s;
	struct hkv_client *c;
	struct raw r;
	char key[32];
	uint64_t t0, ms;
	int n = 0, strays = 0, ret;

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(fill_store(c, "f", &n), HKV_EFULL);
	for (int i = 0; i < n; i++)
		CHECK_RC(hkv_delete(c, key, (size_t)snprintf(key, sizeof(key), "f-%d", i)), 0);
	hkv_close(c);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	CHECK(r.g.nsegs * 8ull <= RAW_BUF);
	for (uint32_t i = 0; i < r.g.nsegs; i++) {
		uint64_t e, word, bw = r.g.bitmap_off + (uint64_t)i * r.g.bitmap_bytes;
		uint32_t nb;

		CHECK_RC(raw_xfer(&r, HKV_WR_READ, r.g.seg_table_off + (uint64_t)i * 8, 8), 0);
		memcpy(&e, r.buf, 8);
		if (hkv_seg_state(e) != HKV_SEG_SHARED || hkv_seg_class(e) >= r.g.nclasses)
			continue;
		nb = r.g.seg_size / r.g.class_size[hkv_seg_class(e)];
		if (nb % 64 == 0)
			continue;
		CHECK_RC(raw_xfer(&r, HKV_WR_READ, bw + (uint64_t)(nb / 64) * 8, 8), 0);
		memcpy(&word, r.buf, 8);
		CHECK_RC(raw_op(&r, HKV_WR_CAS, bw + (uint64_t)(nb / 64) * 8, 8, r.akey, word,
				word | 1ull << 63), 0);
		strays++;
	}
	raw_close(&r);
	c = hkvserver_client(&s);
	t0 = now_ms();
	ret = hkv_set(c, "small", 5, "x", 1, NULL);
	ms = now_ms() - t0;
	printf("# stray bits past the last block of %d wholly free segments: a set of another "
	       "class %s in %llu ms\n", strays, ret ? hkv_strerror(ret) : "succeeded",
	       (unsigned long long)ms);
	hkv_close(c);
	hkvserver_stop(&s);
	CHECK(strays > 0);
	CHECK_RC(ret, 0);
	CHECK(ms < 1000);
}

/* Store n values "value of PREFIX-i" under keys PREFIX-i; 0 or the error. */
static int put_values(struct hkv_client *c, const char *prefix, int n)
{
	char key[32], val[64];
	int ret = 0;

	for (int i = 0; i < n && !ret; i++) {
		snprintf(key, sizeof(key), "%s-%d", prefix, i);
		snprintf(val, sizeof(val), "value of %s-%d", prefix, i);
		ret = hkv_set(c, key, strlen(key), val, strlen(val), NULL);
	}
	return ret;
}

/* How many of put_values()' n values do not read back exactly. */
static int bad_values(struct hkv_client *c, const char *prefix, int n)
{
	char key[32], val[64], got[64];
	int bad = 0;

	for (int i = 0; i < n; i++) {
		size_t vlen = 0;

		snprintf(key, sizeof(key), "%s-%d", prefix, i);
		snprintf(val, sizeof(val), "value of %s-%d", prefix, i);
		if (hkv_get(c, key, strlen(key), got, sizeof(got), &vlen, NULL) ||
		    vlen != strlen(val) || memcmp(got, val, vlen))
			bad++;
	}
	return bad;
}

/* ---- test_windows ------------------------------------------------------------------ */

/*
 * Memory windows (verbs): what a client's rkeys can and cannot reach, tried
 * at the NIC with raw RDMA next to a library client `a` holding data. Since
 * layout 3 a writer's base GRANT is all it gets: READ over the region,
 * ATOMIC past the header, WRITE over the data area (any block: the trust
 * model of shared pools). The header, the segment table, the bitmaps and
 * the index stay out of every WRITE, and a read-only client WRITEs nothing.
 * Every refused access fails the raw connection (a QP in error), so the raw
 * client connects again after each - as a new client, with new windows.
 */
static int win_denied(struct raw *r, const struct hkvserver *s, const char *token_file,
		      uint8_t op, uint64_t off, uint32_t rkey, const char *what)
{
	int rc = raw_op(r, op, off, 8, rkey, 0, 0);

	printf("# windows: %s -> %s\n", what, hkv_strerror(rc));
	raw_close(r);
	if (raw_open(r, s->uri, token_file))
		return -1;
	return rc == HKV_EREMOTE_ACCESS ? 0 : -1;
}

/* The server's count of bound windows in its last disconnect log line (-1: none yet). */
static int win_bound_logged(const struct hkvserver *s)
{
	char path[300], line[512];
	const char *tag = "memory windows bound: ";
	FILE *f;
	int n = -1;

	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, tag);

		if (p)
			n = atoi(p + strlen(tag));
	}
	fclose(f);
	return n;
}

/* Every WRITE into the allocator's metadata and the index fails at the NIC,
 * with each of the writer's three rkeys. */
static int win_metadata_denied(struct raw *r, const struct hkvserver *s)
{
	const struct {
		const char *name;
		uint64_t off;
	} part[] = {
		{"the region header", 0},
		{"the segment table", r->g.seg_table_off},
		{"a bitmap", r->g.bitmap_off + 8},
		{"the index", r->g.index_off},
		{"the word below the data area", r->g.data_off - 8},
	};
	int bad = 0;

	for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++) {
		const uint32_t key[3] = {r->rkey, r->akey, r->wkey};
		const char *const kname[3] = {"READ", "ATOMIC", "WRITE"};

		for (int k = 0; k < 3; k++) {
			char what[160];

			snprintf(what, sizeof(what), "WRITE into %s with the %s rkey", part[i].name,
				 kname[k]);
			bad += win_denied(r, s, s->token_file, HKV_WR_WRITE, part[i].off, key[k],
					  what) != 0;
		}
	}
	return bad;
}

static void test_windows(void)
{
	char ro_file[160];
	const char *const ro[] = {"--ro-token-file", ro_file, NULL};
	struct hkv_ctl_granted gx;
	struct hkv_client_stats st;
	struct hkvserver s;
	struct hkv_client *a;
	struct raw r, r2, rr;
	uint64_t last, was;
	uint32_t old_wkey;
	int bad = 0;

	snprintf(ro_file, sizeof(ro_file), "/tmp/hkv-win-ro-%d.token", (int)getpid());
	unlink(ro_file);
	CHECK(hkvserver_start(&s, use_verbs, "16M", "64K", ro) == 0);
	a = hkvserver_client(&s);
	CHECK_RC(put_values(a, "win", 50), 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	if (!use_verbs) {
		CHECK(!r.windows);
		CHECK_RC(raw_grant(&r, HKV_GRANT_BASE, &gx), -EOPNOTSUPP);
		printf("# windows: shm has none (clients map the region); GRANT is refused: %s\n",
		       hkv_strerror(-EOPNOTSUPP));
		raw_close(&r);
		hkv_close(a);
		hkvserver_stop(&s);
		unlink(ro_file);
		return;
	}
	CHECK(r.windows);

	/* base rights: three windows, three rkeys */
	CHECK(r.akey && r.wkey && r.akey != r.rkey && r.wkey != r.rkey && r.wkey != r.akey);
	CHECK(win_metadata_denied(&r, &s) == 0);
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_CAS, 0, r.akey,
			 "CAS on the region header with the ATOMIC rkey") == 0);
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_CAS, r.g.index_off, r.rkey,
			 "CAS on the index with the READ rkey") == 0);
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_CAS, r.g.index_off, r.wkey,
			 "CAS on the index with the WRITE rkey") == 0);
	/* what a writer needs: atomics on the index and the bitmaps (adding 0) */
	CHECK_RC(raw_op(&r, HKV_WR_FAA, r.g.index_off, 8, r.akey, 0, 0), 0);
	CHECK_RC(raw_op(&r, HKV_WR_FAA, r.g.bitmap_off, 8, r.akey, 0, 0), 0);
	/* and WRITEs anywhere in the data area (the region's last word, written as it is) */
	last = r.g.data_off + (uint64_t)r.g.nsegs * r.g.seg_size - 8;
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, last, 8), 0);
	memcpy(&was, r.buf, 8);
	CHECK_RC(raw_op(&r, HKV_WR_WRITE, last, 8, r.wkey, 0, 0), 0);
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, last, 8), 0);
	CHECK(!memcmp(r.buf, &was, 8));
	printf("# windows: WRITE into the data area with the WRITE rkey -> ok\n");
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_WRITE, last, r.rkey,
			 "WRITE into the data area with the READ rkey") == 0);
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_WRITE, last, r.akey,
			 "WRITE into the data area with the ATOMIC rkey") == 0);
	/* per-segment GRANTs are gone */
	CHECK_RC(raw_grant(&r, 0, &gx), -EINVAL);
	CHECK_RC(raw_grant(&r, r.g.nsegs, &gx), -EINVAL);
	printf("# windows: GRANT of a segment -> %s\n", hkv_strerror(-EINVAL));

	/* keys are per connection: another client cannot use them */
	CHECK_RC(raw_open(&r2, s.uri, s.token_file), 0);
	CHECK(win_denied(&r2, &s, s.token_file, HKV_WR_READ, 0, r.rkey,
			 "READ with another connection's READ rkey") == 0);
	CHECK(win_denied(&r2, &s, s.token_file, HKV_WR_WRITE, last, r.wkey,
			 "WRITE with another connection's WRITE rkey") == 0);

	/* a new connection: the old one's keys died with it */
	old_wkey = r.wkey;
	raw_close(&r);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	CHECK(win_denied(&r, &s, s.token_file, HKV_WR_WRITE, last, old_wkey,
			 "WRITE with the WRITE rkey of this client's previous connection") == 0);

	/* a read-only client: READ only, at the NIC */
	CHECK_RC(raw_open(&rr, s.uri, ro_file), 0);
	CHECK(rr.windows && !rr.akey && !rr.wkey);
	CHECK_RC(raw_xfer(&rr, HKV_WR_READ, last, 8), 0);
	CHECK(win_denied(&rr, &s, ro_file, HKV_WR_WRITE, last, rr.rkey,
			 "read-only client: WRITE into the data area with its rkey") == 0);
	CHECK(win_denied(&rr, &s, ro_file, HKV_WR_WRITE, r.g.index_off, rr.rkey,
			 "read-only client: WRITE into the index with its rkey") == 0);
	CHECK(win_denied(&rr, &s, ro_file, HKV_WR_CAS, r.g.index_off, rr.rkey,
			 "read-only client: CAS on the index with its rkey") == 0);
	CHECK(win_denied(&rr, &s, ro_file, HKV_WR_WRITE, last, r.wkey,
			 "read-only client: WRITE with a writer's WRITE rkey") == 0);
	raw_close(&rr);

	/* the library client never noticed: every value as written, sets work */
	bad = bad_values(a, "win", 50);
	CHECK_RC(hkv_set(a, "win-after", 9, "x", 1, NULL), 0);
	hkv_client_stats(a, &st);
	printf("# windows: the library client's 50 values intact (%d bad), %llu windows granted "
	       "to it\n", bad, (unsigned long long)st.grants);
	CHECK(bad == 0);
	CHECK(st.grants == 3); /* its base rights: READ, ATOMIC, WRITE */
	/* closing a connection deallocates its windows: once the raw clients
	 * are gone, only the library client's remain bound */
	raw_close(&r2);
	raw_close(&r);
	for (uint64_t t0 = now_ms(); win_bound_logged(&s) != (int)st.grants && now_ms() - t0 < 3000;)
		sleep_ms(20);
	printf("# windows: after the raw clients left, the server has %d windows bound (the "
	       "library client's %llu)\n", win_bound_logged(&s), (unsigned long long)st.grants);
	CHECK(win_bound_logged(&s) == (int)st.grants);
	hkv_close(a);
	hkvserver_stop(&s);
	unlink(ro_file);
}

/* ---- test_sigkill_writer ----------------------------------------------------------- */

/* Let the writer run ~run_ms past its first 256 sets, then SIGKILL it. */
static int kill_writer(struct worker *w, int run_ms)
{
	uint64_t end = now_ms() + 60000;
	int exited = 0;

	while (!w->ready && !exited && now_ms() < end)
		if (!(exited = worker_exited(w)))
			drain(w, 20);
	end = now_ms() + (uint64_t)run_ms;
	while (w->ready && !exited && now_ms() < end)
		if (!(exited = worker_exited(w)))
			drain(w, 10);
	if (exited) {
		finish_worker(w);
		worker_ok(w);
		fprintf(stderr, "the writer exited before the kill\n");
		return -1;
	}
	kill(w->pid, SIGKILL);
	wait_worker(w, 10000);
	if (!w->ready)
		fprintf(stderr, "the writer never got going\n");
	return w->ready && WIFSIGNALED(w->status) && WTERMSIG(w->status) == SIGKILL ? 0 : -1;
}

/* A writer process on s, SIGKILLed mid-loop; 0 if it died of exactly that. */
static int run_and_kill_writer(const struct hkvserver *s)
{
	uint64_t t0 = now_ms();
	struct worker w;
	int ret;

	if (spawn_worker(&w, s, "writer", 50, 0)) {
		perror("spawn_worker");
		abort();
	}
	ret = kill_writer(&w, 1500);
	printf("# writer: %llu+ sets (%llu ok, EFULL %llu, EAGAIN %llu, other %llu) in %.1f s, "
	       "then SIGKILL\n",
	       cv(w.cnt, C_PROGRESS), cv(w.cnt, C_SETS_OK), cv(w.cnt, C_FULL), cv(w.cnt, C_AGAIN),
	       cv(w.cnt, C_OTHER), (now_ms() - t0) / 1000.0);
	return ret;
}

struct key_census {
	int present, absent, bad, other, del_fail;
};

/* Every key of the dead writer: absent or a whole value; then delete the survivors. */
static void census_and_clear(const struct hkvserver *s, struct key_census *kc)
{
	uint64_t cnt[NCOUNTERS] = {0};
	struct rw_ctx *x = rw_new(hkvserver_client(s), "reader after the kill", 98, cnt);
	char key[16];

	memset(kc, 0, sizeof(*kc));
	for (int i = 0; i < WKEYS; i++) {
		size_t vlen = 0;
		int ret;

		key_name(key, sizeof(key), 'w', i);
		ret = hkv_get(x->c, key, strlen(key), x->got, sizeof(x->got), &vlen, NULL);
		if (ret == HKV_ENOTFOUND) {
			kc->absent++;
			continue;
		}
		if (ret) {
			kc->other++;
			fprintf(stderr, "get(\"%s\") after the kill: %s\n", key, hkv_strerror(ret));
			continue;
		}
		check_hit(x, "get after the kill", key, x->got, vlen);
		kc->present++;
		ret = hkv_delete(x->c, key, strlen(key));
		if (ret) {
			kc->del_fail++;
			fprintf(stderr, "delete(\"%s\"): %s\n", key, hkv_strerror(ret));
		}
	}
	kc->bad = (int)cnt[C_BAD];
	hkv_close(x->c); /* returns the frees of the deletes */
	free(x);
}

/* How many FILL_VLEN-byte items fit in a fresh store of `memory` bytes
 * (64 KiB segments); 0 if the fill did not end in HKV_EFULL. */
static int fresh_fill_count(const char *memory)
{
	struct hkvserver s;
	struct hkv_client *c;
	int n = 0, ret;

	if (hkvserver_start(&s, use_verbs, memory, "64K", NULL))
		return 0;
	c = hkvserver_client(&s);
	ret = fill_store(c, "f", &n);
	hkv_close(c);
	hkvserver_stop(&s);
	return ret == HKV_EFULL ? n : 0;
}

/*
 * The blocks of SHARED segments whose bit is clear: *held of them under a
 * HELD stamp (the sweep's to take back), *other not. 0 or <0.
 */
static char clear_blocks_held[4][96]; /* the first held blocks clear_blocks() found */
static uint32_t clear_blocks_holder[4];

static int clear_blocks(struct raw *r, uint64_t *held, uint64_t *other)
{
	const struct hkv_geometry *g = &r->g;
	uint64_t tab[1024];

	*held = *other = 0;
	if (g->nsegs > 1024 || g->bitmap_bytes > RAW_BUF ||
	    raw_xfer(r, HKV_WR_READ, g->seg_table_off, g->nsegs * 8))
		return -1;
	memcpy(tab, r->buf, (size_t)g->nsegs * 8);
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint32_t cls = hkv_seg_class(tab[i]), nb;
		uint8_t bm[RAW_BUF / 8];

		if (hkv_seg_state(tab[i]) != HKV_SEG_SHARED || cls >= g->nclasses)
			continue;
		nb = g->seg_size / g->class_size[cls];
		if (nb > 8 * sizeof(bm) ||
		    raw_xfer(r, HKV_WR_READ, g->bitmap_off + (uint64_t)i * g->bitmap_bytes,
			     g->bitmap_bytes))
			return -1;
		memcpy(bm, r->buf, (nb + 7) / 8);
		for (uint32_t b = 0; b < nb; b++) {
			uint64_t w16;

			if (bm[b / 8] >> (b % 8) & 1)
				continue;
			if (raw_xfer(r, HKV_WR_READ, g->data_off + (uint64_t)i * g->seg_size +
							     (uint64_t)b * g->class_size[cls] + 16, 8))
				return -1;
			memcpy(&w16, r->buf, 8);
			if (hkv_held_is(w16)) {
				if ((*held)++ < 4) /* (who, if it stays out: to see why) */
					snprintf(clear_blocks_held[*held - 1],
						 sizeof(clear_blocks_held[0]),
						 "segment %u block %u: held by client %u seq %u", i,
						 b, hkv_held_holder(w16), (uint32_t)w16);
				if (*held <= 4)
					clear_blocks_holder[*held - 1] = hkv_held_holder(w16);
			} else {
				(*other)++;
			}
		}
	}
	return 0;
}

/*
 * What a writer that dies strands until a warm restart (client/alloc.c),
 * per size class it wrote, once the server's sweep has taken back its held
 * blocks (HELD stamps) and the blocks it had retired and kept or not yet
 * freed (its id in their metas): the block it wrote and had not published,
 * and one it retired in a chain whose meta CAS it never saw. (Dying between
 * a claim CAS and posting the claim's HELD stamps would strand up to 16
 * more: a window of microseconds per claim, not allowed for here.)
 */
#define KILL_SLACK_PER_CLASS 2

static void test_sigkill_writer(void)
{
	char path[300];
	const char *const extra[] = {"--memory-file", path, NULL};
	struct key_census kc = {0};
	int n_fresh, n_after = 0, ret_after = -1, killed, ret;
	uint64_t t_kill, held = 0, other = 0, slack = 0, before_restart = 0;
	struct hkvserver s;
	struct hkv_client *c;
	struct raw r = {0};

	/* A store that never had the dead client: how many items fit. */
	n_fresh = fresh_fill_count("4M");
	CHECK(n_fresh > 0);

	snprintf(path, sizeof(path), "/tmp/hkv-sigkill-%d.region", (int)getpid());
	hkv_test_unlink_region(path);
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", extra) == 0);
	killed = run_and_kill_writer(&s);
	t_kill = now_ms();
	/* its keys: absent or whole; the survivors are deleted (their blocks freed) */
	census_and_clear(&s, &kc);
	/* the blocks it held under HELD stamps, kept or owed a free come back by
	 * the server's sweep within a few seconds of the kill (two sightings
	 * 1.5 s apart); the rest stays out until a warm restart (bounded:
	 * KILL_SLACK_PER_CLASS per class it wrote) */
	ret = raw_open(&r, s.uri, s.token_file);
	if (!ret) /* (run_writer's values: 40..VAL_MAX bytes under 6-byte keys) */
		slack = KILL_SLACK_PER_CLASS *
			(uint64_t)(hkv_class_for(&r.g, HKV_BLOCK_HDR + 6 + VAL_MAX) -
				   hkv_class_for(&r.g, HKV_BLOCK_HDR + 6 + 40) + 1);
	while (!ret && !(ret = clear_blocks(&r, &held, &other)) &&
	       (held || other > slack || now_ms() - t_kill < 4000) && now_ms() - t_kill < 8000)
		sleep_ms(50);
	printf("# after the kill: %d keys whole, %d absent, %d torn/invalid, %d other errors; "
	       "%.1f s after it, %llu held block(s) not yet back, %llu others out until "
	       "a warm restart (at most %llu allowed)\n",
	       kc.present, kc.absent, kc.bad, kc.other, (now_ms() - t_kill) / 1000.0,
	       (unsigned long long)held, (unsigned long long)other, (unsigned long long)slack);
	if (r.conn)
		raw_close(&r);
	/* a warm restart rebuilds the bitmaps: every block no slot names is free */
	if (!ret && !(ret = hkvserver_restart(&s, "4M", "64K", extra)) &&
	    !(ret = raw_open(&r, s.uri, s.token_file))) {
		before_restart = other;
		ret = clear_blocks(&r, &held, &other);
		raw_close(&r);
	}
	if (!ret) {
		c = hkvserver_client(&s);
		ret_after = fill_store(c, "a", &n_after);
		hkv_close(c);
	}
	printf("# after a warm restart: %llu block(s) neither free nor stored (%llu before it); "
	       "items of %d B: %d in a fresh store, %d after the dead client (%.1f%%)\n",
	       (unsigned long long)(held + other), (unsigned long long)before_restart, FILL_VLEN,
	       n_fresh, n_after, n_fresh ? 100.0 * n_after / n_fresh : 0.0);
	hkvserver_stop(&s);
	hkv_test_unlink_region(path);
	CHECK(killed == 0);
	CHECK_RC(ret, 0);
	CHECK(kc.bad == 0 && kc.other == 0 && kc.del_fail == 0);
	CHECK(kc.present > 0);
	CHECK(before_restart <= slack);
	CHECK(held == 0 && other == 0);
	CHECK_RC(ret_after, HKV_EFULL);
	CHECK(n_after >= n_fresh * 9 / 10);
}

/* ---- test_server_atomics -------------------------------------------------------------- */

/*
 * test_server_atomics (issue 27, item 3): the server's atomics on words
 * clients CAS and FAA - the sweep's take-backs, a store move's claims,
 * marks, slot swings and frees - go through the NIC on verbs (a loopback
 * queue pair), never the CPU, while 4 clients claim and free in the same
 * bitmap words. A writer process is SIGKILLed twice in a write loop (the
 * sweep takes back what it held, 1.5 s later) while the 4 churn: sets of
 * 40..600 B then 1000..4000 B values (the second half asks segments of the
 * first's classes to move) and deletes, each keeping the last value it
 * was acknowledged per key. Then: every acknowledged value reads back byte
 * for byte; once all have left and everything is deleted, every block is
 * free (no block with two owners, none lost beyond the killed writer's
 * bounded slack); the server's own count says how its atomics went: on
 * verbs all through the NIC, none on the CPU.
 */
#define SA_THREADS 4
#define SA_KEYS    400
#define SA_MS      6000

struct sa_churn {
	const struct hkvserver *s;
	int t, errors, ops;
	uint32_t ver[SA_KEYS]; /* last acknowledged version; 0: absent */
	uint16_t len[SA_KEYS];
	_Atomic int *stop;
};

static void sa_value(uint8_t *v, size_t len, int t, int k, uint32_t ver)
{
	for (size_t i = 0; i < len; i++)
		v[i] = (uint8_t)(t * 131 + k * 7 + ver * 13 + i);
}

static void *sa_thread(void *arg)
{
	struct sa_churn *c = arg;
	struct hkv_client *h = hkvserver_client(c->s);
	uint64_t rs = 0x9e3779b97f4a7c15ull * (uint64_t)(c->t + 1), t0 = now_ms();
	static uint8_t bufs[SA_THREADS][4096];
	uint8_t *v = bufs[c->t];
	char key[16];

	while (!atomic_load(c->stop)) {
		int k, ret, big = now_ms() - t0 > SA_MS / 2;
		size_t len;

		rs = rs * 6364136223846793005ull + 1442695040888963407ull;
		k = (int)((rs >> 33) % SA_KEYS);
		snprintf(key, sizeof(key), "%c%d", 'a' + c->t, k);
		if ((rs >> 20) % 5 == 0) {
			ret = hkv_delete(h, key, strlen(key));
			if (!ret || ret == HKV_ENOTFOUND)
				c->ver[k] = 0;
			else
				c->errors++;
		} else {
			len = big ? 1000 + (rs >> 40) % 3000 : 40 + (rs >> 40) % 560;
			sa_value(v, len, c->t, k, c->ver[k] + 1);
			ret = hkv_set(h, key, strlen(key), v, len, NULL);
			if (!ret) {
				c->ver[k]++;
				c->len[k] = (uint16_t)len;
			} else if (ret != HKV_EFULL && ret != HKV_EAGAIN) {
				c->errors++;
				fprintf(stderr, "set(%s): %s\n", key, hkv_strerror(ret));
			}
		}
		c->ops++;
	}
	hkv_close(h);
	return NULL;
}

/* The server's closing count of its atomics: NIC and CPU; -1 if not logged. */
static int sa_atomics_logged(const struct hkvserver *s, unsigned long long *nic,
			     unsigned long long *cpu)
{
	char path[300], line[512];
	FILE *f;
	int found = -1;

	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "atomics: ");

		if (p && sscanf(p, "atomics: %llu through the NIC in %*u round trips, %llu on the CPU",
				nic, cpu) == 2)
			found = 0;
	}
	fclose(f);
	return found;
}

static void test_server_atomics(void)
{
	static struct sa_churn ch[SA_THREADS];
	pthread_t th[SA_THREADS];
	_Atomic int stop = 0;
	struct hkvserver s;
	struct hkv_client *c;
	struct raw r = {0};
	uint64_t t0, held = 0, other = 0, slack;
	unsigned long long nic = 0, cpu = 0;
	int killed = 0, bad = 0, errors = 0, ops = 0, checked = 0, moved, notfree, logged, ret;
	static uint8_t want[4096], got[4096];

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	for (int t = 0; t < SA_THREADS; t++) {
		ch[t] = (struct sa_churn){.s = &s, .t = t, .stop = &stop};
		CHECK(pthread_create(&th[t], NULL, sa_thread, &ch[t]) == 0);
	}
	t0 = now_ms();
	for (int i = 0; i < 2; i++) /* (each ~1.5 s of writing, then SIGKILL) */
		killed += run_and_kill_writer(&s) == 0;
	while (now_ms() - t0 < SA_MS)
		sleep_ms(50);
	atomic_store(&stop, 1);
	for (int t = 0; t < SA_THREADS; t++) {
		pthread_join(th[t], NULL);
		errors += ch[t].errors;
		ops += ch[t].ops;
	}
	/* every acknowledged value, byte for byte; then all deleted */
	c = hkvserver_client(&s);
	for (int t = 0; t < SA_THREADS; t++)
		for (int k = 0; k < SA_KEYS; k++) {
			char key[16];
			size_t vlen = 0;

			snprintf(key, sizeof(key), "%c%d", 'a' + t, k);
			ret = hkv_get(c, key, strlen(key), got, sizeof(got), &vlen, NULL);
			if (!ch[t].ver[k]) {
				bad += ret != HKV_ENOTFOUND;
				continue;
			}
			sa_value(want, ch[t].len[k], t, k, ch[t].ver[k]);
			if (ret || vlen != ch[t].len[k] || memcmp(got, want, vlen)) {
				if (bad++ < 5)
					fprintf(stderr, "%s: %s, %zu B (want version %u, %u B)\n", key,
						hkv_strerror(ret), vlen, ch[t].ver[k], ch[t].len[k]);
				continue;
			}
			checked++;
			CHECK_RC(hkv_delete(c, key, strlen(key)), 0);
		}
	hkv_close(c);
	{
		struct key_census kc;

		census_and_clear(&s, &kc); /* (the killed writers' keys) */
		CHECK(kc.bad == 0 && kc.other == 0 && kc.del_fail == 0);
	}
	/* every block free again once the sweep has taken back the killed
	 * writers' holds, but their bounded slack (test_sigkill_writer) */
	ret = raw_open(&r, s.uri, s.token_file);
	slack = 2 * KILL_SLACK_PER_CLASS *
		(uint64_t)(hkv_class_for(&r.g, HKV_BLOCK_HDR + 6 + VAL_MAX) -
			   hkv_class_for(&r.g, HKV_BLOCK_HDR + 6 + 40) + 1);
	/* (a take-back needs two sightings 1.5 s apart, a pass over the 64
	 * segments 0.8 s: ~3.1 s at worst, longer in the TCG guest) */
	t0 = now_ms();
	while (!ret && !(ret = clear_blocks(&r, &held, &other)) && (held || other > slack) &&
	       now_ms() - t0 < 10000)
		sleep_ms(100);
	for (uint64_t i = 0; i < held && i < 4; i++)
		fprintf(stderr, "still out after %llu ms: %s\n",
			(unsigned long long)(now_ms() - t0), clear_blocks_held[i]);
	if (r.conn)
		raw_close(&r);
	moved = hkvserver_log_count(&s, "moved from class");
	/* (a block a move found with its bit set but not free is left out of
	 * use, counted in `other` above; seen in 2 of ~14 shm runs, never in
	 * the guest: what issue 27's residual of a holder stalled > 1 s past
	 * its hold check - a give-back or write landing after the sweep's
	 * take-back - leaves behind; printed, not asserted) */
	notfree = hkvserver_log_count(&s, "not free");
	kill(s.pid, SIGTERM); /* (its count is logged at exit; hkvserver_stop removes the log) */
	waitpid(s.pid, NULL, 0);
	s.pid = 0;
	logged = sa_atomics_logged(&s, &nic, &cpu);
	for (uint64_t i = 0; i < held && i < 4; i++) { /* what the server said of the holder */
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "grep -E 'client %u[^0-9]' %s/server.log | tail -n 5 >&2",
			 clear_blocks_holder[i], s.dir);
		if (system(cmd))
			fprintf(stderr, "nothing logged of client %u\n", clear_blocks_holder[i]);
	}
	if (logged && use_verbs) { /* (what the server said last, to see why) */
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "tail -n 25 %s/server.log >&2", s.dir);
		if (system(cmd))
			fprintf(stderr, "no server log\n");
	}
	printf("# %d churn operations by %d clients beside %d killed writers, %d errors; %d "
	       "values read back whole, %d wrong; %d segment moves, %d blocks found bit-set but not "
	       "free; afterwards %llu held and %llu other blocks out (slack %llu); server atomics: "
	       "%llu through the NIC, %llu on the CPU\n",
	       ops, SA_THREADS, killed, errors, checked, bad, moved, notfree, (unsigned long long)held,
	       (unsigned long long)other, (unsigned long long)slack, nic, cpu);
	hkvserver_stop(&s);
	CHECK(logged == 0 || !use_verbs);
	CHECK(killed == 2);
	CHECK(errors == 0);
	CHECK(bad == 0);
	CHECK(checked > 0);
	CHECK_RC(ret, 0);
	CHECK(held == 0 && other <= slack);
	if (use_verbs) {
		CHECK(cpu == 0);
		CHECK(nic > 0);
	}
}

/*
 * test_holder_killed: a client stopped (SIGSTOP) while it holds claimed
 * blocks, then SIGKILLed. It stored one item in every class of up to 8 KiB,
 * each from a claim of several blocks, so it held the rest of every claim,
 * stamped HELD. Nobody gives those back but the server's sweep: within 5 s
 * of the kill the region's free bits must be what they were before it
 * claimed, less exactly the items it stored; then, with every item deleted,
 * another client fills the store as far as in a fresh one.
 */
static void test_holder_killed(void)
{
	uint64_t f0 = 0, f1 = 0, f2 = 0, t_kill, waited;
	int n_fresh, n_after = 0, ret_after = -1, pre, h_found = 0, h_bad = 0, p_bad = 0;
	struct hkvserver s;
	struct hkv_client *c;
	struct worker w;
	struct raw r;
	uint64_t end;

	n_fresh = fresh_fill_count("4M");
	CHECK(n_fresh > 0);
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	/* every class the holder uses has a segment first, so that its claims
	 * are all from segments already there (the free bits before it) */
	c = hkvserver_client(&s);
	pre = set_per_class(c, 'p');
	hkv_close(c); /* gives back what it held */
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	f0 = free_bits(&r);
	CHECK(f0 != UINT64_MAX);

	if (spawn_worker(&w, &s, "holder", 60, 60000)) {
		perror("spawn_worker");
		abort();
	}
	for (end = now_ms() + 30000; !w.ready && now_ms() < end && !worker_exited(&w);)
		drain(&w, 20);
	f1 = free_bits(&r); /* stopped, holding (well inside HKV_HOLD_RECLAIM_MS) */
	kill(w.pid, SIGKILL);
	wait_worker(&w, 10000);
	t_kill = now_ms();
	while ((f2 = free_bits(&r)) != f0 - w.cnt[C_SETS_OK] && now_ms() - t_kill < 5000)
		sleep_ms(20);
	waited = now_ms() - t_kill;
	raw_close(&r);
	printf("# holder: %llu items (1 per class up to %d B), %llu blocks claimed, %llu given "
	       "back; free bits %llu before it, %llu while it was stopped, %llu %.1f s after the "
	       "SIGKILL (want %llu)\n",
	       cv(w.cnt, C_SETS_OK), HOLD_MAX_CLASS, cv(w.cnt, C_CLAIMED), cv(w.cnt, C_GIVEN_BACK),
	       (unsigned long long)f0, (unsigned long long)f1, (unsigned long long)f2,
	       waited / 1000.0, (unsigned long long)(f0 - w.cnt[C_SETS_OK]));

	c = hkvserver_client(&s);
	h_found = check_and_delete_per_class(c, 'h', &h_bad);
	check_and_delete_per_class(c, 'p', &p_bad);
	hkv_close(c); /* (its frees are posted by now) */
	c = hkvserver_client(&s);
	ret_after = fill_store(c, "a", &n_after);
	hkv_close(c);
	printf("# holder: its %d items read whole (%d bad); items of %d B: %d in a fresh store, "
	       "%d after the killed holder\n", h_found, h_bad, FILL_VLEN, n_fresh, n_after);
	hkvserver_stop(&s);
	CHECK(w.ready && WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL);
	CHECK(pre > 0 && w.cnt[C_SETS_OK] == (uint64_t)pre);
	/* it held blocks: more claimed than stored, none given back */
	CHECK(w.cnt[C_CLAIMED] > w.cnt[C_SETS_OK] && w.cnt[C_GIVEN_BACK] == 0);
	CHECK(f1 == f0 - w.cnt[C_CLAIMED]);
	CHECK(f2 == f0 - w.cnt[C_SETS_OK]);
	CHECK(waited < 5000);
	CHECK(h_found == pre && h_bad == 0 && p_bad == 0);
	CHECK_RC(ret_after, HKV_EFULL);
	CHECK(n_after == n_fresh);
}

/*
 * test_claimer_killed (issue 27's last stranded blocks): a writer whose
 * claim CAS won is stopped before it stamps the blocks HELD, then
 * SIGKILLed there. Those blocks carry no holder - a fresh carve's zeros in
 * one class, the freed stamp of a client that left in another - and
 * before claim intents the server could not tell them from a stopped
 * claimer's: they stayed out of use until a warm restart. Now: while the
 * claimer is only stopped (3 s, twice the sweep's bound) not one of them
 * comes back - its intent record names their word - and within 10 s of the
 * kill every one is free again, though another writer that claimed in the
 * same word stays connected and idle.
 */
static void claimer_round(struct hkvserver *s, struct raw *r, size_t vlen, int id,
			  uint64_t *f0, uint64_t *f1, uint64_t *f_stopped, uint64_t *f2,
			  uint64_t *waited)
{
	struct worker w;
	uint64_t end, t_kill;

	*f0 = free_bits(r);
	if (spawn_worker(&w, s, "claimer", id, (int)vlen)) {
		perror("spawn_worker");
		abort();
	}
	for (end = now_ms() + 30000; !w.ready && now_ms() < end && !worker_exited(&w);)
		drain(&w, 20);
	*f1 = free_bits(r);
	sleep_ms(3000); /* stopped: the sweep passes several times */
	*f_stopped = free_bits(r);
	kill(w.pid, SIGKILL);
	wait_worker(&w, 10000);
	t_kill = now_ms();
	while ((*f2 = free_bits(r)) != *f0 && now_ms() - t_kill < 10000)
		sleep_ms(50);
	*waited = now_ms() - t_kill;
	CHECK(w.ready && WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL);
}

static void test_claimer_killed(void)
{
	static uint8_t val[4000];
	struct hkvserver s;
	struct hkv_client *c, *idle;
	struct raw r;
	uint64_t f0[2], f1[2], fs[2], f2[2], waited[2];
	char key[32];
	int before;

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", NULL) == 0);
	/* two classes with a segment each, which a client that then left
	 * wrote and emptied: (1) 4000 B values, every block of the segment
	 * freed by it (freed stamps); (2) 1500 B, one item's claim (4 blocks)
	 * freed, the rest as carved (zeros) */
	c = hkvserver_client(&s);
	memset(val, 'f', sizeof(val));
	for (int i = 0; i < 15 + 1; i++) {
		snprintf(key, sizeof(key), "freed-%d", i);
		CHECK_RC(hkv_set(c, key, strlen(key), val, i < 15 ? sizeof(val) : 1500, NULL), 0);
	}
	for (int i = 0; i < 15 + 1; i++) {
		snprintf(key, sizeof(key), "freed-%d", i);
		CHECK_RC(hkv_delete(c, key, strlen(key)), 0);
	}
	hkv_close(c);
	/* a writer that claimed in the 4000 B class's word (15 blocks to a
	 * segment: one word) and then idles, connected: its claim's intent must
	 * not shelter another's for ever (it is emptied after the stamps) */
	idle = hkvserver_client(&s);
	CHECK_RC(hkv_set(idle, "idle", 4, val, sizeof(val), NULL), 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	before = hkvserver_log_count(&s, "never stamped");
	claimer_round(&s, &r, sizeof(val), 1, &f0[0], &f1[0], &fs[0], &f2[0], &waited[0]);
	claimer_round(&s, &r, 1500, 2, &f0[1], &f1[1], &fs[1], &f2[1], &waited[1]);
	raw_close(&r);
	hkv_close(idle);
	for (int i = 0; i < 2; i++)
		printf("# claimer killed at its stamps (%s): free bits %llu before it, %llu "
		       "claimed, still %llu after 3 s stopped, %llu %.1f s after the SIGKILL\n",
		       i ? "blocks as carved, some freed" : "blocks a gone client freed",
		       (unsigned long long)f0[i], (unsigned long long)(f0[i] - f1[i]),
		       (unsigned long long)(f0[i] - fs[i]), (unsigned long long)f2[i],
		       waited[i] / 1000.0);
	c = hkvserver_client(&s); /* the store still works, and reads none of it */
	CHECK_RC(hkv_set(c, "after", 5, val, sizeof(val), NULL), 0);
	CHECK(hkv_get(c, "claimer-1", 9, val, sizeof(val), NULL, NULL) == HKV_ENOTFOUND);
	hkv_close(c);
	CHECK(hkvserver_log_count(&s, "never stamped") > before);
	hkvserver_stop(&s);
	for (int i = 0; i < 2; i++) {
		CHECK(f1[i] < f0[i]); /* it claimed */
		CHECK(fs[i] == f1[i]); /* stopped: nothing taken from it */
		CHECK(f2[i] == f0[i]); /* killed: everything back */
		CHECK(waited[i] < 10000);
	}
}

/*
 * A writer that died between publishing its insert (slot CAS) and
 * committing it (meta PENDING -> LIVE) leaves a PENDING entry. Made exactly
 * so: a key is stored, then its block's meta is turned back to PENDING and
 * stamped now. Readers must take the key as absent at once; an add of the
 * key must succeed once the 1 s lease is over (not fail with EAGAIN or
 * EEXISTS), and the new value is what everyone reads after.
 */
/*
 * The stored entry of key (the first slot of its buckets with its
 * fingerprint): its slot's offset and value. 0, or -1 if none.
 */
static int raw_find_entry(struct raw *r, const char *key, uint64_t *slot_off, uint64_t *slot)
{
	uint64_t h = hkv_key_hash(&r->g, key, strlen(key)), b[2];

	h += !h; /* as the client does */
	hkv_buckets_of(&r->g, h, &b[0], &b[1]);
	for (int i = 0; i < 2; i++) {
		if (raw_xfer(r, HKV_WR_READ, r->g.index_off + b[i] * HKV_BUCKET_SIZE, HKV_BUCKET_SIZE))
			return -1;
		for (int j = 0; j < HKV_BUCKET_SLOTS; j++) {
			memcpy(slot, r->buf + j * 8, 8);
			if (*slot && hkv_slot_fp(*slot) == hkv_fp_of(h)) {
				*slot_off = r->g.index_off + b[i] * HKV_BUCKET_SIZE + (uint64_t)j * 8;
				return 0;
			}
		}
	}
	return -1;
}

/* Turn the LIVE block at blk_off back into a PENDING one stamped age_ms ago:
 * an insert whose writer died between publishing and committing. 0 or <0. */
static int raw_make_pending(struct raw *r, uint64_t blk_off, uint32_t age_ms)
{
	struct hkv_block_hdr bh;
	struct timespec ts;
	int ret = raw_xfer(r, HKV_WR_READ, blk_off, HKV_BLOCK_HDR);

	if (ret)
		return ret;
	memcpy(&bh, r->buf, sizeof(bh));
	if (hkv_meta_state(bh.meta) != HKV_BLK_LIVE)
		return -EINVAL;
	bh.meta = hkv_meta_make(HKV_BLK_PENDING, hkv_meta_class(bh.meta), hkv_meta_gen(bh.meta));
	clock_gettime(CLOCK_REALTIME, &ts);
	bh.atime = (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u) - age_ms;
	memcpy(r->buf, &bh, sizeof(bh));
	return raw_xfer(r, HKV_WR_WRITE, blk_off, HKV_BLOCK_HDR);
}

static void test_abandoned_insert(void)
{
	struct hkvserver s;
	struct hkv_client *c, *c2;
	struct raw r;
	uint64_t blk_off = 0, slot_off = 0, slot = 0, t0, waited_ms;
	char buf[64];
	size_t vlen = 0;
	int ret;
	/* the test plays a dead writer by rewriting its block header: no windows */
	const char *const no_windows[] = {"--no-windows", NULL};

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", no_windows) == 0);
	c = hkvserver_client(&s);
	c2 = hkvserver_client(&s);
	CHECK_RC(hkv_set(c, "abandoned", 9, "old", 3, NULL), 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	CHECK_RC(raw_find_entry(&r, "abandoned", &slot_off, &slot), 0);
	blk_off = hkv_slot_off(slot);
	CHECK_RC(raw_make_pending(&r, blk_off, 0), 0);
	CHECK_RC(hkv_get(c2, "abandoned", 9, buf, sizeof(buf), &vlen, NULL), HKV_ENOTFOUND);
	t0 = now_ms();
	ret = hkv_add(c2, "abandoned", 9, "new", 3, NULL);
	waited_ms = now_ms() - t0;
	printf("# abandoned PENDING entry: read as absent; an add of the key %s after %llu ms\n",
	       ret ? hkv_strerror(ret) : "succeeded", (unsigned long long)waited_ms);
	CHECK_RC(ret, 0);
	CHECK(waited_ms >= 900); /* it waited for the lease, it did not skip the entry */
	CHECK_RC(hkv_get(c, "abandoned", 9, buf, sizeof(buf), &vlen, NULL), 0);
	CHECK(vlen == 3 && !memcmp(buf, "new", 3));
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, blk_off, 8), 0);
	{
		uint64_t meta;

		memcpy(&meta, r.buf, 8);
		CHECK(hkv_meta_state(meta) == HKV_BLK_OBSOLETE && (meta & HKV_META_ABORTED));
	}
	raw_close(&r);
	hkv_close(c2);
	hkv_close(c);
	hkvserver_stop(&s);
}

/* ---- test_hello_and_go ----------------------------------------------------------------- */

/*
 * A token holder that authenticates, sends its data-plane hello and closes
 * at once, before the accept: the server admitted it (on_connect counted it)
 * and its accept could not be sent. Its --max-clients place must come back
 * (issue 12, item 3): with 4 places, 10 such rounds, then a real client.
 * shm only: the verbs error paths after admission give the place back the
 * same way (hkv_listener_gone) but cannot be made to fail from a test.
 */
static void test_hello_and_go(void)
{
	const char *const four[] = {"--max-clients", "4", NULL};
	char token[HKV_TOKEN_MAX + 1];
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	struct ctl_ep ep;
	int ret;

	if (use_verbs) {
		printf("# (shm only)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 0, "4M", "64K", four) == 0);
	CHECK_RC(ep_parse(s.uri, &ep), 0);
	CHECK(hkv_token_load(s.token_file, token, sizeof(token), 0) > 0);
	for (int i = 0; i < 10; i++) {
		struct sockaddr_un sun = {.sun_family = AF_UNIX};
		struct hkv_data_hello dh = {0};
		struct hkv_hello_msg m;
		struct hkv_conn_cfg cc = {.hello = &dh, .hello_len = sizeof(dh)};
		struct hkv_ctl_welcome w;
		int fd;

		CHECK_RC(ctl_auth(&ep, token, &w, NULL), 0);
		w.data_endpoint[sizeof(w.data_endpoint) - 1] = 0;
		dh.client_id = w.client_id;
		memcpy(dh.ticket, w.ticket, HKV_TICKET_LEN);
		hkv_hello_fill(&m, &cc);
		CHECK(strlen(w.data_endpoint) < sizeof(sun.sun_path));
		memcpy(sun.sun_path, w.data_endpoint, strlen(w.data_endpoint) + 1);
		fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		CHECK(fd >= 0 && !connect(fd, (struct sockaddr *)&sun, sizeof(sun)));
		CHECK(send(fd, &m, sizeof(m), MSG_NOSIGNAL) == (ssize_t)sizeof(m));
		close(fd); /* gone before the accept */
	}
	sleep_ms(200);
	cfg = hkvserver_config(&s);
	ret = hkv_open(cfg, &c);
	printf("# 10 clients that sent their hello and left at once (--max-clients 4): a real "
	       "client then %s\n", ret ? hkv_strerror(ret) : "connects");
	CHECK_RC(ret, 0);
	if (c) {
		CHECK_RC(hkv_set(c, "k", 1, "v", 1, NULL), 0);
		hkv_close(c);
	}
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/* ---- test_fd_exhaustion ---------------------------------------------------------------- */

/* Lines of the server's log holding what (0 if it cannot be read). */
static int server_log_lines(const struct hkvserver *s, const char *what)
{
	int n = hkvserver_log_count(s, what);

	return n < 0 ? 0 : n;
}

/*
 * Idle data connections (issue 12, item 7): with the server limited to 256
 * file descriptors, 300 connections to its shm data socket that never send
 * a hello. Before, they kept every descriptor: real clients timed out and
 * the control plane logged "Too many open files" hundreds of times a second.
 * Now a connection that sends no hello goes after 2 s (or at once, oldest
 * first, when descriptors run out), a real client connects, and each such
 * log line comes at most once a second.
 */
static void test_fd_exhaustion(void)
{
	static int fds[300];
	struct rlimit lim = {256, 256};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	uint64_t t0;
	int opened = 0, ret, lines;

	if (use_verbs) {
		printf("# (shm only)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 0, "4M", "64K", NULL) == 0);
	CHECK(!prlimit(s.pid, RLIMIT_NOFILE, &lim, NULL));
	CHECK(strlen(s.uri + 4) + 5 < sizeof(sun.sun_path));
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%.100s.data", s.uri + 4);
	t0 = now_ms();
	for (int i = 0; i < 300; i++) { /* the backlog is 128: pace to the accepts */
		fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		while (fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&sun, sizeof(sun)) &&
		       errno == EAGAIN && now_ms() - t0 < 1500)
			sleep_ms(1);
		opened += fds[i] >= 0;
	}
	sleep_ms(300);
	cfg = hkvserver_config(&s);
	hkv_config_set_timeout_ms(cfg, 5000);
	t0 = now_ms();
	ret = hkv_open(cfg, &c);
	if (!ret)
		ret = hkv_set(c, "k", 1, "v", 1, NULL);
	lines = server_log_lines(&s, "file descriptors") + server_log_lines(&s, "Too many open") +
		server_log_lines(&s, "accept:");
	printf("# 300 silent data connections (%d made) to a server with 256 descriptors: a "
	       "real client %s after %llu ms; %d log lines about it\n", opened,
	       ret ? hkv_strerror(ret) : "connected and stored", (unsigned long long)(now_ms() - t0),
	       lines);
	CHECK_RC(ret, 0);
	CHECK(lines <= 10);
	if (c)
		hkv_close(c);
	for (int i = 0; i < 300; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/* ---- test_metrics_flood, test_admission_flood (issue 28, item 6) --------------------- */

/* The port of the server's --metrics endpoint, from its log (which may say
 * it a moment after the control plane accepts); 0 if none within 5 s. */
static int metrics_port(const struct hkvserver *s)
{
	char path[200], line[512];
	const char *p;
	int port = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	for (int tries = 0; !port && tries < 100; tries++) {
		if (tries)
			sleep_ms(50);
		if (!(f = fopen(path, "r")))
			continue;
		while (!port && fgets(line, sizeof(line), f))
			if ((p = strstr(line, "metrics at http://127.0.0.1:")))
				port = atoi(p + strlen("metrics at http://127.0.0.1:"));
		fclose(f);
	}
	return port;
}

/* Lines of the server's log, but for the newcomers' own "client N
 * connected/disconnected" lines. */
static int log_lines(const struct hkvserver *s)
{
	return server_log_lines(s, "") - server_log_lines(s, "connected");
}

/* A TCP connection to 127.0.0.1:port, non-blocking (connect in progress); -1 if none. */
static int tcp_start(int port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof(sin)) && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

/* One GET /metrics: the HTTP status, or -1. */
static int scrape(int port)
{
	char buf[64] = {0};
	int fd = tcp_start(port), flags, st = -1;
	struct pollfd pf;

	if (fd < 0)
		return -1;
	pf = (struct pollfd){.fd = fd, .events = POLLOUT};
	flags = fcntl(fd, F_GETFL);
	if (poll(&pf, 1, 2000) == 1 && !fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
		struct timeval tmo = {2, 0};

		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
		if (write_full(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 35) == 0 &&
		    read(fd, buf, sizeof(buf) - 1) > 12 && !strncmp(buf, "HTTP/1.1 ", 9))
			st = atoi(buf + 9);
	}
	close(fd);
	return st;
}

/* A new client: open, set, get back, close. 0 or the error; *ms what it took. */
static int newcomer_once(const struct hkvserver *s, const char *token_file, int n, uint64_t *ms)
{
	struct hkv_config *cfg = hkvserver_config(s);
	struct hkv_client *c = NULL;
	uint64_t t0 = now_ms();
	char key[32], got[32];
	size_t vlen = 0;
	int ret;

	hkv_config_set_timeout_ms(cfg, 5000);
	if (token_file)
		hkv_config_set_token_file(cfg, token_file);
	snprintf(key, sizeof(key), "flood-%d", n);
	ret = hkv_open(cfg, &c);
	if (!ret)
		ret = hkv_set(c, key, strlen(key), key, strlen(key), NULL);
	if (!ret)
		ret = hkv_get(c, key, strlen(key), got, sizeof(got), &vlen, NULL);
	if (!ret && (vlen != strlen(key) || memcmp(got, key, vlen)))
		ret = HKV_ECORRUPT;
	if (c)
		hkv_close(c);
	hkv_config_free(cfg);
	*ms = now_ms() - t0;
	return ret;
}

/*
 * test_metrics_flood: the server at 512 descriptors, 600 connections to its
 * --metrics port, each sending one header byte a second for 6 s (evhttp's
 * idle timeout restarted on every byte: they stayed, every descriptor went,
 * and the server spun on accept writing millions of lines). Now: at most
 * 64 at once, each gone 5 s after accept; new clients connect, store and
 * read back every 250 ms within their timeout; the log grows by a few
 * lines a second; a scrape answers 200 once the flood stops.
 */
static void test_metrics_flood(void)
{
	const char *const extra[] = {"--metrics", "127.0.0.1:0", NULL};
	static int fds[600];
	struct rlimit lim = {512, 512};
	struct hkvserver s;
	uint64_t t0, worst = 0, ms;
	int port, lines0, lines, fails = 0, served = 0, st = -1, open_now = 0;

	if (use_verbs) {
		printf("# (shm only: the endpoint is the same code on verbs)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 0, "8M", "64K", extra) == 0);
	CHECK((port = metrics_port(&s)) > 0);
	CHECK(!prlimit(s.pid, RLIMIT_NOFILE, &lim, NULL));
	lines0 = log_lines(&s);
	for (int i = 0; i < 600; i++)
		fds[i] = tcp_start(port);
	t0 = now_ms();
	for (int tick = 0; now_ms() - t0 < 6000; tick++) {
		if (tick % 4 == 0) /* a header byte on each, once a second */
			for (int i = 0; i < 600; i++)
				if (fds[i] >= 0 && send(fds[i], "G", 1, MSG_NOSIGNAL) < 0 &&
				    errno != EAGAIN && errno != ENOTCONN) {
					close(fds[i]);
					fds[i] = tcp_start(port); /* dropped: come back */
				}
		int ret = newcomer_once(&s, NULL, tick, &ms);

		fails += ret != 0;
		served += ret == 0;
		worst = ms > worst ? ms : worst;
		if (ret)
			printf("#   a new client during the flood: %s after %llu ms\n",
			       hkv_strerror(ret), (unsigned long long)ms);
		sleep_ms(250);
	}
	for (int i = 0; i < 600; i++)
		if (fds[i] >= 0) {
			open_now++;
			close(fds[i]);
		}
	lines = log_lines(&s) - lines0;
	for (int i = 0; i < 20 && st != 200; i++) {
		sleep_ms(100);
		st = scrape(port);
	}
	printf("# 600 slow connections to --metrics (512 descriptors), 6 s: %d new clients "
	       "served, %d failed, slowest %llu ms; %d log lines; a scrape after: %d\n", served,
	       fails, (unsigned long long)worst, lines, st);
	CHECK(server_alive(&s));
	hkvserver_stop(&s);
	CHECK(fails == 0 && served >= 10);
	CHECK(worst < 5000);
	CHECK(lines <= 6 * 4 + 10);
	CHECK(st == 200);
	(void)open_now;
}

/*
 * test_admission_flood: a read-only token holder sends AUTH 100 times a
 * second and never redeems its tickets (they were good for 10 s and
 * uncapped: every --max-clients place was taken, writers got "too many
 * clients"). Now read-only admissions not redeemed are capped at a quarter
 * of --max-clients (at least 2), a source's at a quarter (at least 8), and
 * tickets last 5 s: a writer connects every 200 ms throughout.
 */
static void test_admission_flood(void)
{
	char ro_file[160], token[HKV_TOKEN_MAX + 1];
	const char *const extra[] = {"--ro-token-file", ro_file, "--max-clients", "8", NULL};
	struct hkv_ctl_welcome w;
	struct ctl_ep ep;
	struct hkvserver s;
	uint64_t t0, ms, worst = 0;
	int welcomed = 0, refused = 0, fails = 0, served = 0, lines0, lines;

	snprintf(ro_file, sizeof(ro_file), "/tmp/hkv-flood-ro-%d.token", (int)getpid());
	unlink(ro_file);
	CHECK(hkvserver_start(&s, use_verbs, "8M", "64K", extra) == 0);
	CHECK(hkv_token_load(ro_file, token, sizeof(token), 0) > 0);
	CHECK(ep_parse(s.uri, &ep) == 0);
	lines0 = log_lines(&s);
	t0 = now_ms();
	for (int n = 0; n < 16; n++) { /* (rounds, not seconds: slower in the guest) */
		for (int k = 0; k < 20; k++) { /* ~100 authentications a second */
			if (ctl_auth(&ep, token, &w, NULL) == 0)
				welcomed++;
			else
				refused++;
			sleep_ms(10);
		}
		int ret = newcomer_once(&s, NULL, n, &ms);

		fails += ret != 0;
		served += ret == 0;
		worst = ms > worst ? ms : worst;
		if (ret)
			printf("#   a writer during the flood: %s\n", hkv_strerror(ret));
	}
	lines = log_lines(&s) - lines0;
	ms = now_ms() - t0;
	printf("# read-only authentications never redeemed, %d in %.1f s (--max-clients 8): %d "
	       "welcomed, %d refused; writers: %d connected, %d failed, slowest %llu ms; %d log "
	       "lines\n", welcomed + refused, ms / 1000.0, welcomed, refused, served, fails,
	       (unsigned long long)worst, lines);
	CHECK(server_alive(&s));
	hkvserver_stop(&s);
	unlink(ro_file);
	CHECK(fails == 0 && served == 16);
	CHECK(welcomed >= 2 && refused > 0);
	CHECK(lines <= (int)(ms / 1000) * 4 + 30);
}

/* ---- test_secret_files, test_shm_region_rights ---------------------------------------- */

/*
 * Run hatchkv-server (shm, in dir) with the extra arguments; 1 if it refused
 * to start (exited non-zero within 5 s), 0 if it came up (then stopped), -1
 * on a harness failure. Its log is dir/server.log.
 */
static int server_refuses(const char *dir, const char *const *extra)
{
	char bin[4096], sock[300], log[300];
	const char *argv[24];
	ssize_t n = readlink("/proc/self/exe", bin, sizeof(bin) - 32);
	int argc = 0, status;
	pid_t pid;

	if (n <= 0)
		return -1;
	bin[n] = 0;
	strcpy(strrchr(bin, '/'), "/hatchkv-server");
	snprintf(sock, sizeof(sock), "%s/ctl.sock", dir);
	snprintf(log, sizeof(log), "%s/server.log", dir);
	argv[argc++] = bin;
	argv[argc++] = "--transport";
	argv[argc++] = "shm";
	argv[argc++] = "--socket";
	argv[argc++] = sock;
	argv[argc++] = "--memory";
	argv[argc++] = "4M";
	argv[argc++] = "--segment-size";
	argv[argc++] = "64K";
	for (int i = 0; extra[i] && argc < 22; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);

		dup2(fd, 2);
		dup2(fd, 1);
		execv(bin, (char **)argv);
		_exit(127);
	}
	for (int i = 0; i < 50; i++) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) != 0 ? 1 : -1;
		sleep_ms(100);
	}
	kill(pid, SIGTERM);
	waitpid(pid, &status, 0);
	return 0;
}

static int file_has(const char *path, const char *what)
{
	char line[512];
	int found = 0;
	FILE *f = fopen(path, "r");

	while (f && fgets(line, sizeof(line), f))
		found |= strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return found;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd;

	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
	if (fd >= 0) {
		if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
			perror("write");
		fchmod(fd, mode);
		close(fd);
	}
}

/*
 * The server's files (issue 12, item 8): a token file or --memory-file that
 * group or others may use, that another uid owns, or that is a symbolic
 * link, is refused with a line saying why; a guessable token gets a
 * warning. Before, each was used without a word.
 */
static void test_secret_files(void)
{
	char dir[] = "/tmp/hkv-files-XXXXXX", tok[300], good[300], link[300], mem[300], log[300];
	const char *args[6] = {"--token-file", tok, NULL, NULL, NULL, NULL};
	int r[7];

	if (use_verbs) {
		printf("# (shm only)\n");
		return;
	}
	CHECK(mkdtemp(dir) != NULL);
	snprintf(tok, sizeof(tok), "%s/token", dir);
	snprintf(good, sizeof(good), "%s/good.token", dir);
	snprintf(link, sizeof(link), "%s/link.token", dir);
	snprintf(mem, sizeof(mem), "%s/region", dir);
	snprintf(log, sizeof(log), "%s/server.log", dir);
	write_file(good, "0f3a9c27d1b84e56a0c2\n", 0600);

	write_file(tok, "0f3a9c27d1b84e56a0c2\n", 0644); /* world-readable */
	r[0] = server_refuses(dir, args);
	CHECK(file_has(log, "group or others may use it"));
	unlink(tok);
	CHECK(!symlink(good, tok)); /* a symbolic link */
	r[1] = server_refuses(dir, args);
	CHECK(file_has(log, "is a symbolic link"));
	unlink(tok);
	write_file(tok, "0f3a9c27d1b84e56a0c2\n", 0600);
	if (getuid() == 0) { /* another uid's */
		CHECK(!chown(tok, 65534, 65534));
		r[2] = server_refuses(dir, args);
		CHECK(file_has(log, "belongs to uid 65534"));
		CHECK(!chown(tok, 0, 0));
	} else {
		r[2] = 1;
	}
	args[2] = "--memory-file";
	args[3] = mem;
	write_file(mem, "", 0644); /* a region others can read */
	r[3] = server_refuses(dir, args);
	hkv_test_unlink_region(mem);
	CHECK(!symlink(good, mem));
	r[4] = server_refuses(dir, args);
	hkv_test_unlink_region(mem);
	args[2] = NULL;
	write_file(tok, "aaaaaaaaaaaaaaaaaaaaaaaa\n", 0600); /* guessable: a warning */
	r[5] = server_refuses(dir, args);
	CHECK(file_has(log, "only 1 distinct characters"));
	unlink(tok);
	r[6] = server_refuses(dir, args); /* none yet: made 0600, served */
	printf("# token 0644 %s, token symlink %s, token of uid 65534 %s, region 0644 %s, region "
	       "symlink %s, token of one repeated character %s, a fresh token %s\n",
	       r[0] == 1 ? "refused" : "USED", r[1] == 1 ? "refused" : "USED",
	       r[2] == 1 ? "refused" : "USED", r[3] == 1 ? "refused" : "USED",
	       r[4] == 1 ? "refused" : "USED", r[5] == 0 ? "served, with a warning" : "refused",
	       r[6] == 0 ? "served" : "refused");
	for (int i = 0; i < 5; i++)
		CHECK(r[i] == 1);
	CHECK(r[5] == 0 && r[6] == 0);
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
	}
}

/* Receive the region fd an shm data connection is accepted with. */
static int shm_region_fd(const char *data_path, const struct hkv_ctl_welcome *w)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct hkv_data_hello dh = {.client_id = w->client_id};
	struct hkv_conn_cfg cc = {.hello = &dh, .hello_len = sizeof(dh)};
	struct hkv_hello_msg m;
	struct hkv_accept_msg acc;
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = &acc, .iov_len = sizeof(acc)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm;
	int sock, fd = -1;

	memcpy(dh.ticket, w->ticket, HKV_TICKET_LEN);
	hkv_hello_fill(&m, &cc);
	memcpy(sun.sun_path, data_path, strlen(data_path) + 1);
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sock < 0 || connect(sock, (struct sockaddr *)&sun, sizeof(sun)) ||
	    send(sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m) ||
	    recvmsg(sock, &msg, 0) <= 0) {
		if (sock >= 0)
			close(sock);
		return -1;
	}
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	/* the socket stays open: the connection lives on */
	return fd;
}

/*
 * The shm region's rights (issue 12, item 1). A read-only client got a
 * read-only reopen of the memfd, which it could reopen read-write through
 * /proc/self/fd (memfd inodes were 0777, unsealed), and any client could
 * ftruncate it and kill the server with SIGBUS. Now the memfd is 0600 and
 * sealed against shrinking and growing: a client of another uid cannot
 * reopen it at all, and nobody can change its size. (A client of the
 * server's own uid can still reopen it read-write: docs/reliability.md.)
 */
static void test_shm_region_rights(void)
{
	char ro_file[160], data[300], token[HKV_TOKEN_MAX + 1];
	const char *extra[] = {"--ro-token-file", ro_file, NULL};
	struct hkv_ctl_welcome w;
	struct hkvserver s;
	struct ctl_ep ep;
	struct stat st;
	int fd, rw = -1, trunc_ro, trunc_rw, other = -1, status;
	char procfd[64];
	pid_t pid;

	if (use_verbs) {
		printf("# (shm only)\n");
		return;
	}
	snprintf(ro_file, sizeof(ro_file), "/tmp/hkv-ro-%d.token", (int)getpid());
	unlink(ro_file);
	CHECK(hkvserver_start(&s, 0, "4M", "64K", extra) == 0);
	{
		struct hkv_client *c = hkvserver_client(&s);

		CHECK_RC(hkv_set(c, "kept", 4, "value", 5, NULL), 0);
		hkv_close(c);
	}
	CHECK_RC(ep_parse(s.uri, &ep), 0);
	CHECK(hkv_token_load(ro_file, token, sizeof(token), 0) > 0);
	CHECK_RC(ctl_auth(&ep, token, &w, NULL), 0);
	snprintf(data, sizeof(data), "%.200s.data", s.uri + 4);
	fd = shm_region_fd(data, &w);
	CHECK(fd >= 0);
	CHECK(!fstat(fd, &st));
	snprintf(procfd, sizeof(procfd), "/proc/self/fd/%d", fd);
	trunc_ro = ftruncate(fd, 0) ? errno : 0;
	rw = open(procfd, O_RDWR | O_CLOEXEC); /* our own uid: possible, documented */
	trunc_rw = rw >= 0 && ftruncate(rw, 4096) ? errno : rw >= 0 ? 0 : -1;
	if (getuid() == 0) { /* another uid, holding the same read-only fd */
		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			if (setgid(65534) || setuid(65534))
				_exit(2);
			_exit(open(procfd, O_RDWR) >= 0 ? 1 : open(procfd, O_RDONLY) >= 0 ? 3 : 0);
		}
		CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
		other = WEXITSTATUS(status);
	}
	printf("# shm region: mode %04o; read-only client: ftruncate %s; reopened read-write as "
	       "the server's uid: %s, then ftruncate %s; as uid 65534: %s\n",
	       (unsigned)(st.st_mode & 07777), trunc_ro ? strerror(trunc_ro) : "DONE",
	       rw >= 0 ? "yes" : "no", trunc_rw > 0 ? strerror(trunc_rw) : trunc_rw ? "-" : "DONE",
	       other < 0 ? "(not root: not tried)" : other == 0 ? "no reopen at all" :
	       other == 1 ? "REOPENED READ-WRITE" : "reopened read-only");
	CHECK((st.st_mode & 077) == 0);
	CHECK(trunc_ro != 0);
	CHECK(trunc_rw != 0);
	CHECK(other <= 0);
	if (rw >= 0)
		close(rw);
	close(fd);
	{
		struct hkv_client *c = hkvserver_client(&s); /* the server lives, items kept */
		char buf[16];
		size_t vlen;

		CHECK_RC(hkv_get(c, "kept", 4, buf, sizeof(buf), &vlen, NULL), 0);
		hkv_close(c);
	}
	hkvserver_stop(&s);
	unlink(ro_file);
}

/* ---- test_socket_squatter -------------------------------------------------------------- */

/*
 * Socket squatting (issue 12, item 6): another user binds the control
 * socket's path first (in a world-writable directory such as /tmp). A
 * client must not send it the token: it checks the peer's uid (SO_PEERCRED:
 * ours, root's, or the token file's owner's) first. Before, the squatter
 * read the header and the token. (The server's default path is now in a
 * directory only its user can write: common/paths.h.)
 */
static void test_socket_squatter(void)
{
	char dir[] = "/tmp/hkv-squat-XXXXXX", sock[300], tok[300], uri[320];
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	int p[2], got = -1, ready = 0, ret, status;
	pid_t pid;

	if (use_verbs || getuid() != 0) {
		printf("# (shm, as root: the squatter is uid 65534)\n");
		return;
	}
	CHECK(mkdtemp(dir) != NULL && !chmod(dir, 01777));
	snprintf(sock, sizeof(sock), "%s/hatchkv.sock", dir);
	snprintf(tok, sizeof(tok), "%s/token", dir);
	snprintf(uri, sizeof(uri), "shm:%s", sock);
	write_file(tok, "0f3a9c27d1b84e56a0c2\n", 0600);
	memcpy(sun.sun_path, sock, strlen(sock) + 1);
	CHECK(!pipe(p));
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct pollfd pf;
		char buf[512];
		int lfd, fd, n = 0, one = 1;

		close(p[0]);
		if (setgid(65534) || setuid(65534))
			_exit(2);
		lfd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (lfd < 0 || bind(lfd, (struct sockaddr *)&sun, sizeof(sun)) || listen(lfd, 4) ||
		    write(p[1], &one, sizeof(one)) != sizeof(one))
			_exit(3);
		pf = (struct pollfd){.fd = lfd, .events = POLLIN};
		if (poll(&pf, 1, 3000) == 1 && (fd = accept(lfd, NULL, NULL)) >= 0) {
			pf = (struct pollfd){.fd = fd, .events = POLLIN};
			while (poll(&pf, 1, 500) == 1) {
				ssize_t r = read(fd, buf, sizeof(buf));

				if (r <= 0)
					break;
				n += (int)r;
			}
		}
		_exit(write(p[1], &n, sizeof(n)) == sizeof(n) ? 0 : 4);
	}
	close(p[1]);
	CHECK(read(p[0], &ready, sizeof(ready)) == sizeof(ready) && ready == 1);
	cfg = hkv_config_new();
	hkv_config_add_server(cfg, uri);
	hkv_config_set_token_file(cfg, tok);
	hkv_config_set_timeout_ms(cfg, 1000);
	ret = hkv_open(cfg, &c);
	CHECK(read(p[0], &got, sizeof(got)) == sizeof(got));
	CHECK(waitpid(pid, &status, 0) == pid);
	close(p[0]);
	printf("# a squatter (uid 65534) on the socket path: hkv_open %s; the squatter read %d "
	       "bytes\n", ret ? hkv_strerror(ret) : "SUCCEEDED", got);
	CHECK(ret != 0);
	CHECK(got == 0);
	if (!ret)
		hkv_close(c);
	hkv_config_free(cfg);
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
	}
}

/*
 * test_request_proof (issue 28, item 3): a CARVE or GRANT proves it comes
 * from the session that welcomed the client - a MAC by that session's
 * request key, and a sequence number above the client's last. Before, they
 * carried the client's ticket in clear, so whoever saw one (a relay at the
 * control endpoint) could CARVE as that client at will. Now a replay of a
 * request seen, one altered on the way, or one MACed by another session's
 * key is refused (HKV_EAUTH) and changes nothing; the client's own next
 * request is served.
 */
static int carve_req(const struct raw *r, const struct hkv_ctl_carve *req)
{
	struct hkv_ctl_carved out;

	return ctl_call(&r->ep, HKV_CTL_CARVE, req, sizeof(*req), HKV_CTL_CARVED, &out,
			sizeof(out));
}

static void test_request_proof(void)
{
	struct hkvserver s;
	struct raw r, other;
	struct hkv_ctl_carve req = {0}, seen;

	CHECK(hkvserver_start(&s, use_verbs, "8M", "64K", NULL) == 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	CHECK_RC(raw_open(&other, s.uri, s.token_file), 0);
	req.client_id = r.id;
	req.cls = 0;
	req.seq = ++r.seq;
	hkv_ctl_request_seal(&req, sizeof(req), HKV_CTL_CARVE, r.rk);
	seen = req; /* what a relay on the way would have seen */
	CHECK(carve_req(&r, &req) != HKV_EAUTH);
	/* the same request again: refused */
	CHECK_RC(carve_req(&r, &seen), HKV_EAUTH);
	/* altered on the way (another class, a later seq): refused */
	seen.cls = 1;
	CHECK_RC(carve_req(&r, &seen), HKV_EAUTH);
	seen.cls = 0;
	seen.seq = 1000;
	CHECK_RC(carve_req(&r, &seen), HKV_EAUTH);
	/* MACed by another session's key (another client's), named as r */
	req.seq = 2000;
	hkv_ctl_request_seal(&req, sizeof(req), HKV_CTL_CARVE, other.rk);
	CHECK_RC(carve_req(&r, &req), HKV_EAUTH);
	/* an old sequence number with a good MAC: refused too */
	req.seq = r.seq;
	hkv_ctl_request_seal(&req, sizeof(req), HKV_CTL_CARVE, r.rk);
	CHECK_RC(carve_req(&r, &req), HKV_EAUTH);
	/* the client's own next request is served */
	req.seq = ++r.seq;
	req.cls = 1;
	hkv_ctl_request_seal(&req, sizeof(req), HKV_CTL_CARVE, r.rk);
	CHECK(carve_req(&r, &req) != HKV_EAUTH);
	raw_close(&other);
	raw_close(&r);
	hkvserver_stop(&s);
}

/* ---- test_impostor (issue 28, item 3) -------------------------------------------------- */

#define IMP_REC (64u << 10)

/* What an impostor saw: the bytes from the client, from the server, and
 * whether its own data connection with the ticket it saw got in. */
struct imp_report {
	uint32_t from_client, from_server;
	int redeemed; /* 1: the server took the ticket it saw; 0: refused; -1: not tried */
	uint8_t c2s[IMP_REC], s2c[IMP_REC];
};

static int unix_listen(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (strlen(path) >= sizeof(sun.sun_path)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) || listen(fd, 4)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* The WELCOME in a server-to-client byte stream (after the CHALLENGE), or NULL. */
static const struct hkv_ctl_welcome_msg *seen_welcome(const uint8_t *b, uint32_t n)
{
	uint32_t off = 0;

	while (off + sizeof(struct hkv_ctl_hdr) <= n) {
		struct hkv_ctl_hdr h;

		memcpy(&h, b + off, sizeof(h));
		if (h.type == HKV_CTL_WELCOME && h.len == sizeof(struct hkv_ctl_welcome_msg) &&
		    off + sizeof(h) + h.len <= n)
			return (const void *)(b + off + sizeof(h));
		off += (uint32_t)sizeof(h) + h.len;
	}
	return NULL;
}

/* Try to redeem what looks like a ticket in a WELCOME seen on the way. */
static int imp_redeem(const struct hkv_ctl_welcome_msg *m)
{
	struct hkv_data_hello hello = {.client_id = m->w.client_id};
	struct hkv_conn_cfg cc = {.kind = HKV_TRANSPORT_SHM, .hello = &hello,
				  .hello_len = sizeof(hello), .timeout_ms = 2000};
	char path[sizeof(m->w.data_endpoint)];
	struct hkv_conn *conn;

	memcpy(path, m->w.data_endpoint, sizeof(path));
	path[sizeof(path) - 1] = 0;
	cc.path = cc.port = path;
	memcpy(hello.ticket, m->w.ticket, HKV_TICKET_LEN);
	conn = hkv_conn_open(&cc, NULL, NULL);
	if (!conn)
		return 0;
	hkv_conn_close(conn);
	return 1;
}

/*
 * The impostor, a child of the test (same uid: the client's peer check
 * passes). real == NULL: it answers a HELLO with a CHALLENGE of random
 * bytes and records what else comes. real: it relays both ways to the real
 * server's control socket, and when the WELCOME passes by it first tries
 * to redeem the ticket in it itself. Its report goes to fd.
 */
static void impostor(int lfd, const char *real, int fd)
{
	static struct imp_report rep;
	struct pollfd pf[2];
	int c, sfd = -1, nfd = 1;

	memset(&rep, 0, sizeof(rep));
	rep.redeemed = -1;
	pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
	if (poll(pf, 1, 5000) != 1 || (c = accept(lfd, NULL, NULL)) < 0)
		_exit(3);
	if (real) {
		struct sockaddr_un sun = {.sun_family = AF_UNIX};

		if (strlen(real) >= sizeof(sun.sun_path))
			_exit(4);
		memcpy(sun.sun_path, real, strlen(real) + 1);
		sfd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (sfd < 0 || connect(sfd, (struct sockaddr *)&sun, sizeof(sun)))
			_exit(4);
		nfd = 2;
	}
	for (;;) {
		pf[0] = (struct pollfd){.fd = c, .events = POLLIN};
		pf[1] = (struct pollfd){.fd = sfd, .events = POLLIN};
		if (poll(pf, (nfds_t)nfd, 1500) <= 0)
			break;
		if (pf[0].revents) {
			uint8_t *at = rep.c2s + rep.from_client;
			ssize_t r = read(c, at, IMP_REC - rep.from_client);

			if (r <= 0)
				break;
			rep.from_client += (uint32_t)r;
			if (real && write_full(sfd, at, (size_t)r))
				break;
			if (!real && rep.from_client >= sizeof(struct hkv_ctl_hdr) +
							    sizeof(struct hkv_ctl_hello)) {
				struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC,
							.version = HKV_CTL_VERSION,
							.type = HKV_CTL_CHALLENGE,
							.len = sizeof(struct hkv_ctl_challenge)};
				uint8_t ch[sizeof(struct hkv_ctl_challenge)];
				static int once;

				randombytes_buf(ch, sizeof(ch));
				if (!once++ && (write_full(c, &h, sizeof(h)) || write_full(c, ch, sizeof(ch))))
					break;
			}
		}
		if (nfd == 2 && pf[1].revents) {
			uint8_t *at = rep.s2c + rep.from_server;
			const struct hkv_ctl_welcome_msg *m;
			ssize_t r = read(sfd, at, IMP_REC - rep.from_server);

			if (r <= 0)
				break;
			rep.from_server += (uint32_t)r;
			m = seen_welcome(rep.s2c, rep.from_server);
			if (m && rep.redeemed < 0) /* before the client gets it */
				rep.redeemed = imp_redeem(m);
			if (write_full(c, at, (size_t)r))
				break;
		}
	}
	_exit(write_full(fd, &rep, sizeof(rep)) ? 5 : 0);
}

/* Does the recording hold the token's bytes (or its first 8 anywhere)? */
static int holds_token(const uint8_t *b, uint32_t n, const char *tok)
{
	size_t tl = strlen(tok) < 8 ? strlen(tok) : 8;

	for (uint32_t i = 0; i + tl <= n; i++)
		if (!memcmp(b + i, tok, tl))
			return 1;
	return 0;
}

/*
 * test_impostor: whoever listens where a client looks for its server - a
 * process at the shm socket path as the client's own uid, a fake member's
 * endpoint - used to receive the token in clear. Now: (1) an impostor that
 * cannot prove it holds the token gets one HELLO (a nonce) and nothing
 * else, and the client fails with HKV_ESERVERAUTH; (2) an impostor that
 * relays the exchange to the real server sees no token and no ticket: the
 * ticket it finds in the WELCOME is sealed, the server refuses it, and the
 * client, whose data connection goes straight to the server the WELCOME
 * names, works.
 */
static void test_impostor(void)
{
	static struct imp_report rep;
	char path[300], uri[320], token[HKV_TOKEN_MAX + 1];
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	int p[2], lfd, ret[2], status, forwarded = 0, ok_after = -1;
	pid_t pid;

	if (use_verbs) {
		printf("# (shm: the verbs control plane runs the same code)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 0, "8M", "64K", NULL) == 0);
	CHECK(hkv_token_load(s.token_file, token, sizeof(token), 0) > 0);
	snprintf(path, sizeof(path), "%s/impostor.sock", s.dir);
	snprintf(uri, sizeof(uri), "shm:%s", path);
	c = hkvserver_client(&s);
	CHECK_RC(hkv_set(c, "via", 3, "relay", 5, NULL), 0);
	hkv_close(c);
	c = NULL;
	for (int round = 0; round < 2; round++) {
		CHECK((lfd = unix_listen(path)) >= 0);
		CHECK(!pipe(p));
		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			close(p[0]);
			impostor(lfd, round ? s.uri + 4 : NULL, p[1]);
		}
		close(p[1]);
		close(lfd);
		cfg = hkv_config_new();
		hkv_config_add_server(cfg, uri);
		hkv_config_set_token_file(cfg, s.token_file);
		hkv_config_set_timeout_ms(cfg, 2000);
		ret[round] = hkv_open(cfg, &c);
		if (!ret[round]) { /* (a read: a write may CARVE, and the relay is gone) */
			char v[8];
			size_t vlen = 0;

			ok_after = hkv_get(c, "via", 3, v, sizeof(v), &vlen, NULL);
			if (!ok_after && (vlen != 5 || memcmp(v, "relay", 5)))
				ok_after = HKV_ECORRUPT;
			hkv_close(c);
			c = NULL;
		}
		hkv_config_free(cfg);
		CHECK(read_full(p[0], &rep, sizeof(rep)) == 0);
		CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0);
		close(p[0]);
		unlink(path);
		CHECK(!holds_token(rep.c2s, rep.from_client, token));
		CHECK(!holds_token(rep.s2c, rep.from_server, token));
		if (round == 0) {
			printf("# an impostor at the socket path (our uid) without the token: hkv_open "
			       "%s; it got %u bytes (one HELLO: %zu), no token\n",
			       hkv_strerror(ret[0]), rep.from_client,
			       sizeof(struct hkv_ctl_hdr) + sizeof(struct hkv_ctl_hello));
			CHECK_RC(ret[0], HKV_ESERVERAUTH);
			CHECK(rep.from_client == sizeof(struct hkv_ctl_hdr) +
						       sizeof(struct hkv_ctl_hello));
		} else {
			forwarded = seen_welcome(rep.s2c, rep.from_server) != NULL;
			printf("# an impostor relaying to the real server: it saw %u + %u bytes, no "
			       "token; the ticket in the WELCOME it saw: %s; the client %s\n",
			       rep.from_client, rep.from_server,
			       rep.redeemed < 0 ? "(none seen)"
			       : rep.redeemed ? "REDEEMED by the impostor" : "refused by the server",
			       ret[1] ? hkv_strerror(ret[1]) : ok_after ? "connected, get failed"
								: "connected and read its item");
			CHECK(forwarded && rep.redeemed == 0);
			CHECK_RC(ret[1], 0);
			CHECK_RC(ok_after, 0);
		}
	}
	hkvserver_stop(&s);
}

/* ---- test_abort_dies ------------------------------------------------------------------- */

static struct hkv_client *abort_victim;

/* The aborter's connection fails right after its meta CAS won (a crash or a
 * cut cable at that point): the slot CAS that follows never runs. */
static void die_at_abort(struct hkv_client *c, enum hkv_test_point point)
{
	if (c == abort_victim && point == HKV_TP_ABORT_SLOT)
		c->conn->error = HKV_ETRANSPORT;
}

/* Is the free bit of the block at off (class cls) set? */
static int raw_block_freed(struct raw *r, uint64_t off, uint32_t cls, int *freed)
{
	uint64_t rel = off - r->g.data_off, word;
	uint32_t seg = (uint32_t)(rel / r->g.seg_size);
	uint32_t blk = (uint32_t)(rel % r->g.seg_size / r->g.class_size[cls]);
	int ret = raw_xfer(r, HKV_WR_READ, r->g.bitmap_off + (uint64_t)seg * r->g.bitmap_bytes +
					     (uint64_t)(blk / 64) * 8, 8);

	memcpy(&word, r->buf, 8);
	*freed = (int)(word >> (blk % 64) & 1);
	return ret;
}

/*
 * Aborting an abandoned insert (issue 11, item 5): the aborter's meta CAS
 * wins, then its connection dies before the slot CAS. The block must not
 * have been freed while its slot still names it (the free comes only after
 * the slot CAS): else it is reused while named, a dangling slot and later a
 * duplicate entry of the key. Then another client's add of the key works,
 * and takes the stuck slot back after the lease.
 */
static void test_abort_dies(void)
{
	const char *const no_windows[] = {"--no-windows", NULL};
	struct hkvserver s;
	struct hkv_client *c, *c2, *c3;
	struct raw r;
	uint64_t h, blk_off = 0, slot_off = 0, slot = 0, meta;
	char buf[64];
	size_t vlen = 0;
	int ret, freed = -1;

	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", no_windows) == 0);
	c = hkvserver_client(&s);
	c2 = hkvserver_client(&s);
	CHECK_RC(hkv_set(c, "abort-dies", 10, "old", 3, NULL), 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	CHECK_RC(raw_find_entry(&r, "abort-dies", &slot_off, &slot), 0);
	blk_off = hkv_slot_off(slot);
	/* its writer "died" between publishing and committing, 2 s ago */
	CHECK_RC(raw_make_pending(&r, blk_off, 2000), 0);

	abort_victim = c2;
	hkv_test_hook = die_at_abort;
	ret = hkv_add(c2, "abort-dies", 10, "new", 3, NULL);
	hkv_test_hook = NULL;
	CHECK(ret < 0);
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, slot_off, 8), 0);
	memcpy(&h, r.buf, 8);
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, blk_off, 8), 0);
	memcpy(&meta, r.buf, 8);
	CHECK_RC(raw_block_freed(&r, blk_off, hkv_meta_class(meta), &freed), 0);
	printf("# aborter died after its meta CAS (%s): slot %s, block %s, free bit %s\n",
	       hkv_strerror(ret), h == slot ? "still names the block" : "changed",
	       hkv_meta_state(meta) == HKV_BLK_OBSOLETE && (meta & HKV_META_ABORTED) ? "aborted"
										     : "not aborted",
	       freed ? "SET (freed while named)" : "clear");
	CHECK(h == slot);
	CHECK(hkv_meta_state(meta) == HKV_BLK_OBSOLETE && (meta & HKV_META_ABORTED));
	CHECK(freed == 0);

	c3 = hkvserver_client(&s);
	CHECK_RC(hkv_add(c3, "abort-dies", 10, "new", 3, NULL), 0);
	CHECK_RC(hkv_get(c, "abort-dies", 10, buf, sizeof(buf), &vlen, NULL), 0);
	CHECK(vlen == 3 && !memcmp(buf, "new", 3));
	CHECK_RC(hkv_delete(c3, "abort-dies", 10), 0);
	sleep_ms(1100); /* past the lease: the next insert takes the stuck slot back */
	CHECK_RC(hkv_add(c3, "abort-dies", 10, "again", 5, NULL), 0);
	CHECK_RC(hkv_add(c3, "abort-dies", 10, "twice", 5, NULL), HKV_EEXISTS);
	CHECK_RC(raw_xfer(&r, HKV_WR_READ, slot_off, 8), 0);
	memcpy(&h, r.buf, 8);
	CHECK_RC(raw_block_freed(&r, blk_off, hkv_meta_class(meta), &freed), 0);
	printf("# later inserts of the key: the stuck slot %s; the aborted block stays unfreed "
	       "(%s)\n", h != slot ? "was taken back" : "is still there",
	       freed ? "freed" : "lost with its aborter");
	CHECK(h != slot);
	CHECK(freed == 0);
	raw_close(&r);
	hkv_close(c3);
	hkv_close(c2);
	hkv_close(c);
	hkvserver_stop(&s);
}

/* ---- test_unpublished_reclaimed ------------------------------------------------------ */

/* Claim up to n free blocks of a SHARED segment of class cls (only: that
 * segment, or -1 for any) the way a writer does (CAS of a bitmap word),
 * without stamping them: their offsets in off[]; how many, or <0. */
static int raw_claim(struct raw *r, uint32_t cls, int64_t only, uint64_t *off, int n)
{
	const struct hkv_geometry *g = &r->g;
	uint32_t csize = g->class_size[cls], nb = g->seg_size / csize;
	uint64_t tab[1024];

	if (g->nsegs > 1024 || raw_xfer(r, HKV_WR_READ, g->seg_table_off, g->nsegs * 8))
		return -1;
	memcpy(tab, r->buf, (size_t)g->nsegs * 8);
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint64_t word, mask = 0, bw = g->bitmap_off + (uint64_t)i * g->bitmap_bytes;
		int got = 0;

		if (hkv_seg_state(tab[i]) != HKV_SEG_SHARED || hkv_seg_class(tab[i]) != cls ||
		    (only >= 0 && i != (uint64_t)only))
			continue;
		if (raw_xfer(r, HKV_WR_READ, bw, 8))
			return -1;
		memcpy(&word, r->buf, 8);
		if (nb < 64)
			word &= (1ull << nb) - 1;
		for (uint64_t w = word; w && got < n; w &= w - 1) {
			uint32_t b = (uint32_t)__builtin_ctzll(w);

			mask |= 1ull << b;
			off[got++] = g->data_off + (uint64_t)i * g->seg_size + (uint64_t)b * csize;
		}
		if (got < n)
			continue;
		memcpy(r->buf, &word, 8);
		if (raw_op(r, HKV_WR_CAS, bw, 8, r->akey, word, word & ~mask))
			return -1;
		return memcmp(r->buf, &word, 8) ? 0 : got;
	}
	return 0;
}

/* Write a block of class cls at off (key, value of vlen 'u' bytes, meta st
 * at the generation after the one it has, in *gen; we are its owner). */
static int raw_put_block(struct raw *r, uint64_t off, uint32_t cls, enum hkv_block_state st,
			 const char *key, uint32_t vlen, uint32_t *gen)
{
	struct hkv_block_hdr h = {.vlen = vlen, .klen = (uint16_t)strlen(key),
				  .owner = (uint16_t)r->id, .wid = off};
	struct timespec ts;
	uint64_t was;

	if (raw_xfer(r, HKV_WR_READ, off, 8))
		return -1;
	memcpy(&was, r->buf, 8);
	*gen = hkv_meta_gen(was) + 1;
	h.meta = hkv_meta_make(st, cls, *gen);
	clock_gettime(CLOCK_REALTIME, &ts);
	h.atime = (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
	memcpy(r->buf + HKV_BLOCK_HDR, key, h.klen);
	memset(r->buf + HKV_BLOCK_HDR + h.klen, 'u', vlen);
	h.sum = hkv_block_sum(&h, r->buf + HKV_BLOCK_HDR);
	memcpy(r->buf, &h, sizeof(h));
	return raw_xfer(r, HKV_WR_WRITE, off, HKV_BLOCK_HDR + h.klen + vlen);
}

/* Publish the block at off (generation gen) as key's: CAS of an empty slot
 * of its first bucket, whose offset goes to *slot_off if not NULL. */
static int raw_publish(struct raw *r, const char *key, uint32_t cls, uint64_t off, uint32_t gen,
		       uint64_t *slot_off)
{
	uint64_t h = hkv_key_hash(&r->g, key, strlen(key)), b[2];

	h += !h;
	hkv_buckets_of(&r->g, h, &b[0], &b[1]);
	if (raw_xfer(r, HKV_WR_READ, r->g.index_off + b[0] * HKV_BUCKET_SIZE, HKV_BUCKET_SIZE))
		return -1;
	for (int j = 0; j < HKV_BUCKET_SLOTS; j++) {
		uint64_t slot, so = r->g.index_off + b[0] * HKV_BUCKET_SIZE + (uint64_t)j * 8;

		memcpy(&slot, r->buf + j * 8, 8);
		if (slot)
			continue;
		if (raw_op(r, HKV_WR_CAS, so, 8, r->akey, 0,
			   hkv_slot_make(hkv_fp_of(h), cls, gen, off)))
			return -1;
		memcpy(&slot, r->buf, 8);
		if (slot_off)
			*slot_off = so;
		return slot == 0 ? 0 : -1;
	}
	return -1;
}

/*
 * A client that dies between writing a block and publishing it (an insert
 * or update that never reached its slot CAS) leaves the block allocated with
 * no slot naming it and no HELD stamp. The sweep leaves it (telling it from
 * a live write would cost a key hash per live item a gone writer wrote, on
 * every pass): only a move of its segment takes it back
 * (test_move_takes_leftovers), or a warm restart, which rebuilds the
 * bitmaps from the index. Made exactly: a raw writer claims four blocks of
 * a class, writes LIVE, LIVE and PENDING ones no slot names and a LIVE one
 * it publishes, and disconnects. After the server restarts on its
 * --memory-file, exactly the three unpublished blocks are free (and
 * OBSOLETE), and the published item and every item stored before read as
 * written.
 */
static void test_unpublished_reclaimed(void)
{
	static const char *const keys[4] = {"unpub-0", "unpub-1", "unpub-2", "publish"};
	static const enum hkv_block_state states[4] = {HKV_BLK_LIVE, HKV_BLK_LIVE,
						       HKV_BLK_PENDING, HKV_BLK_LIVE};
	const uint32_t vlen = 100;
	char path[300];
	const char *const extra[] = {"--memory-file", path, NULL};
	struct hkvserver s;
	struct hkv_client *c;
	struct raw r;
	uint64_t off[4], meta[4];
	uint32_t cls, gen[4];
	char got[256];
	size_t vlen_got = 0;
	int freed[4] = {-1, -1, -1, -1}, before[4] = {-1, -1, -1, -1}, bad;

	snprintf(path, sizeof(path), "/tmp/hkv-unpub-%d.region", (int)getpid());
	hkv_test_unlink_region(path);
	CHECK(hkvserver_start(&s, use_verbs, "4M", "64K", extra) == 0);
	c = hkvserver_client(&s);
	CHECK_RC(put_values(c, "kept", 50), 0);
	{
		char v[100];

		memset(v, 'c', sizeof(v)); /* the raw writer's class gets a segment */
		CHECK_RC(hkv_set(c, "carver", 6, v, sizeof(v), NULL), 0);
	}
	hkv_close(c); /* (gives back what it held) */
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	cls = (uint32_t)hkv_class_for(&r.g, HKV_BLOCK_HDR + 7 + vlen);
	CHECK(raw_claim(&r, cls, -1, off, 4) == 4);
	for (int i = 0; i < 4; i++)
		CHECK_RC(raw_put_block(&r, off[i], cls, states[i], keys[i], vlen, &gen[i]), 0);
	CHECK_RC(raw_publish(&r, "publish", cls, off[3], gen[3], NULL), 0);
	raw_close(&r); /* the writer is gone */

	/* the running server does not take them back: no HELD stamp, no move */
	sleep_ms(HKV_HOLD_RECLAIM_MS + 1500);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	for (int i = 0; i < 4; i++)
		CHECK_RC(raw_block_freed(&r, off[i], cls, &before[i]), 0);
	raw_close(&r);
	CHECK(before[0] == 0 && before[1] == 0 && before[2] == 0 && before[3] == 0);

	CHECK(hkvserver_restart(&s, "4M", "64K", extra) == 0);
	CHECK_RC(raw_open(&r, s.uri, s.token_file), 0);
	for (int i = 0; i < 4; i++) {
		CHECK_RC(raw_block_freed(&r, off[i], cls, &freed[i]), 0);
		CHECK_RC(raw_xfer(&r, HKV_WR_READ, off[i], 8), 0);
		memcpy(&meta[i], r.buf, 8);
	}
	raw_close(&r);
	c = hkvserver_client(&s);
	bad = bad_values(c, "kept", 50);
	printf("# unpublished blocks of a dead writer: free bits %d %d %d before the restart (the "
	       "sweep leaves written blocks), %d %d %d after it; its published block: %s; "
	       "items stored before: %d of 50 bad\n", before[0], before[1], before[2], freed[0],
	       freed[1], freed[2], freed[3] ? "FREED" : "kept", bad);
	CHECK(freed[0] == 1 && freed[1] == 1 && freed[2] == 1 && freed[3] == 0);
	CHECK(hkv_meta_state(meta[0]) == HKV_BLK_OBSOLETE && !(meta[0] & HKV_META_ABORTED));
	CHECK(hkv_meta_state(meta[1]) == HKV_BLK_OBSOLETE);
	CHECK(hkv_meta_state(meta[2]) == HKV_BLK_OBSOLETE && (meta[2] & HKV_META_ABORTED));
	CHECK(hkv_meta_state(meta[3]) == HKV_BLK_LIVE);
	CHECK(bad == 0);
	CHECK_RC(hkv_get(c, "publish", 7, got, sizeof(got), &vlen_got, NULL), 0);
	CHECK(vlen_got == vlen && got[0] == 'u' && got[vlen - 1] == 'u');
	CHECK_RC(hkv_get(c, "unpub-0", 7, got, sizeof(got), &vlen_got, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_get(c, "unpub-2", 7, got, sizeof(got), &vlen_got, NULL), HKV_ENOTFOUND);
	hkv_close(c);
	hkvserver_stop(&s);
	hkv_test_unlink_region(path);
}

/* ---- test_move_takes_leftovers ------------------------------------------------------ */

/*
 * A full store set up for a move of one segment (as test_flow
 * test_cas_across_move): S1 holds one item k-0 of class c1, S2 four items
 * of c1 and free blocks, every other segment one largest-class item. A set
 * of a class with no segment then makes the server empty S1 (the cheapest
 * of the two whose items fit elsewhere, when S2 has as many blocks a move
 * waits for): k-0 moves to S2. ok = 1 when so.
 */
struct move_stage {
	struct hkvserver s;
	struct hkv_client *c;
	uint32_t c1, nb;
	int64_t s1, s2;
	int ok;
};

#define STAGE_VLEN 3000 /* c1: about 20 blocks a segment */

static void move_stage(struct move_stage *m)
{
	static const char *const verbose[] = {"-v", NULL}; /* (takes back are debug lines) */
	struct hkv_client *a;
	char key[48], *v;
	size_t big;
	int nkeys, ins1 = 0, ins2 = 0, ret = 0;

	memset(m, 0, sizeof(*m));
	m->s2 = -1;
	CHECK(hkvserver_start(&m->s, use_verbs, "4M", "64K", verbose) == 0);
	a = hkvserver_client(&m->s);
	m->c = hkvserver_client(&m->s);
	m->c1 = (uint32_t)hkv_class_for(&a->g, HKV_BLOCK_HDR + 4 + STAGE_VLEN);
	m->nb = a->g.seg_size / a->g.class_size[m->c1];
	big = a->max_value; /* with an 8-byte key: a largest-class block, a segment */
	v = malloc(big);
	CHECK(v != NULL);
	memset(v, 'k', STAGE_VLEN);
	CHECK_RC(hkv_set(a, "k-0", 3, v, STAGE_VLEN, NULL), 0);
	m->s1 = hkvserver_seg_of(a, "k-0");
	for (nkeys = 1; nkeys < 256 && ins2 < 4 && !ret; nkeys++) {
		int64_t sg;

		snprintf(key, sizeof(key), "k-%d", nkeys);
		ret = hkv_set(a, key, strlen(key), v, STAGE_VLEN, NULL);
		sg = hkvserver_seg_of(a, key);
		if (sg == m->s1) {
			ins1++;
		} else {
			ret = ret ? ret : m->s2 >= 0 && sg != m->s2;
			m->s2 = sg;
			ins2++;
		}
	}
	memset(v, 'B', big);
	for (size_t n = 0; !ret && n < 4096; n++) {
		snprintf(key, sizeof(key), "big%05zu", n);
		if ((ret = hkv_set(a, key, strlen(key), v, big, NULL)) == HKV_EFULL)
			break;
	}
	for (int i = 1; ret == HKV_EFULL && i <= ins1; i++) {
		snprintf(key, sizeof(key), "k-%d", i);
		if (hkv_delete(a, key, strlen(key)))
			ret = -1;
	}
	hkv_close(a); /* (its holds go back) */
	free(v);
	printf("# c1 (%d B values, %u blocks a segment): segment %lld holds k-0 (%d more "
	       "deleted), segment %lld holds %d; the rest full: %s\n", STAGE_VLEN, m->nb,
	       (long long)m->s1, ins1, (long long)m->s2, ins2, hkv_strerror(ret));
	CHECK_RC(ret, HKV_EFULL);
	CHECK(m->s1 >= 0 && m->s2 >= 0 && ins1 >= 8 && ins2 == 4 && m->nb >= 12);
	m->ok = 1;
}

/* The segment table entry of seg, read by r. */
static uint64_t raw_seg_entry(struct raw *r, int64_t seg)
{
	uint64_t e = 0;

	if (!raw_xfer(r, HKV_WR_READ, r->g.seg_table_off + (uint64_t)seg * 8, 8))
		memcpy(&e, r->buf, 8);
	return e;
}

/* Wait until the server logged client id's disconnect (up to 2 s). */
static int wait_disconnect_logged(const struct hkvserver *s, uint32_t id)
{
	char what[64];

	snprintf(what, sizeof(what), "store: client %u disconnected", id);
	for (int i = 0; i < 200; i++) {
		if (hkvserver_log_count(s, what) > 0)
			return 0;
		sleep_ms(10);
	}
	return -1;
}

/*
 * A writer that died with blocks unpublished in the one segment a store's
 * move picks: LIVE and PENDING blocks no slot names, and an insert it never
 * committed (PENDING, its slot in place). The move takes them back (the
 * writer's id in each block says who may still write it: nobody, once it
 * is disconnected; the insert is aborted as a client does past its lease)
 * and finishes in about 1.5 s - before, it waited 3 s, was undone and the
 * segment passed over for 30 s. k-0 moves and reads back; the insert's key
 * reads as absent, its slot empty. The same writer's two PENDING blocks in
 * S2, which no move empties, stay out (only a move takes such blocks).
 */
static void test_move_takes_leftovers(void)
{
	static const char *const keys[3] = {"dead-live", "dead-pend", "dead-pend-u"};
	static const enum hkv_block_state states[3] = {HKV_BLK_LIVE, HKV_BLK_PENDING,
						       HKV_BLK_PENDING};
	struct move_stage m;
	struct raw w, q;
	uint64_t off[3], off2[2], pend_slot = 0, slot, meta, t0, took_ms, e;
	uint32_t gen[3], gen2[2], xcls, wid;
	int undone0, moved0, gone0, lease0, freed2[2] = {-1, -1};
	char v[1000], got[STAGE_VLEN + 8];
	size_t n = 0;

	CHECK_PASSES(move_stage(&m));
	if (!m.ok) {
		hkvserver_stop(&m.s);
		return;
	}
	CHECK_RC(raw_open(&w, m.s.uri, m.s.token_file), 0);
	CHECK(raw_claim(&w, m.c1, m.s1, off, 3) == 3);
	CHECK(raw_claim(&w, m.c1, m.s2, off2, 2) == 2);
	for (int i = 0; i < 3; i++)
		CHECK_RC(raw_put_block(&w, off[i], m.c1, states[i], keys[i], 100, &gen[i]), 0);
	CHECK_RC(raw_publish(&w, "dead-pend", m.c1, off[1], gen[1], &pend_slot), 0);
	for (int i = 0; i < 2; i++)
		CHECK_RC(raw_put_block(&w, off2[i], m.c1, HKV_BLK_PENDING, i ? "s2-b" : "s2-a", 100,
				       &gen2[i]), 0);
	wid = w.id;
	raw_close(&w); /* the writer is gone */
	CHECK_RC(wait_disconnect_logged(&m.s, wid), 0);

	undone0 = hkvserver_log_count(&m.s, "undone");
	moved0 = hkvserver_log_count(&m.s, "live items moved");
	gone0 = hkvserver_log_count(&m.s, "a gone writer's unpublished block taken back");
	lease0 = hkvserver_log_count(&m.s, "an insert past its lease taken back");
	/* a class with no segment, in a full store: the server empties S1 */
	memset(v, 'x', sizeof(v));
	t0 = now_ms();
	CHECK_RC(hkv_set(m.c, "x", 1, v, sizeof(v), NULL), 0);
	took_ms = now_ms() - t0;
	CHECK_RC(raw_open(&q, m.s.uri, m.s.token_file), 0);
	xcls = (uint32_t)hkv_class_for(&q.g, HKV_BLOCK_HDR + 1 + sizeof(v));
	e = raw_seg_entry(&q, m.s1);
	for (int i = 0; i < 2; i++)
		CHECK_RC(raw_block_freed(&q, off2[i], m.c1, &freed2[i]), 0);
	CHECK_RC(raw_xfer(&q, HKV_WR_READ, pend_slot, 8), 0);
	memcpy(&slot, q.buf, 8);
	CHECK_RC(raw_xfer(&q, HKV_WR_READ, off2[0], 8), 0);
	memcpy(&meta, q.buf, 8);
	raw_close(&q);
	printf("# a 1000 B set into the full store took %llu ms; segment %lld now %s class %u "
	       "(x: %u); the server logged %d move(s) undone, %d emptied by moving items, %d "
	       "unpublished block(s) and %d insert(s) taken back; the insert's slot: 0x%llx; "
	       "S2's leftovers free: %d %d\n", (unsigned long long)took_ms, (long long)m.s1,
	       hkv_seg_state(e) == HKV_SEG_SHARED ? "SHARED" : "not SHARED", hkv_seg_class(e),
	       xcls, hkvserver_log_count(&m.s, "undone") - undone0,
	       hkvserver_log_count(&m.s, "live items moved") - moved0,
	       hkvserver_log_count(&m.s, "a gone writer's unpublished block taken back") - gone0,
	       hkvserver_log_count(&m.s, "an insert past its lease taken back") - lease0,
	       (unsigned long long)slot, freed2[0], freed2[1]);
	CHECK(took_ms < 3000);
	CHECK(hkvserver_log_count(&m.s, "undone") == undone0);
	CHECK(hkvserver_log_count(&m.s, "live items moved") == moved0 + 1);
	CHECK(hkvserver_log_count(&m.s, "a gone writer's unpublished block taken back") ==
	      gone0 + 2);
	CHECK(hkvserver_log_count(&m.s, "an insert past its lease taken back") == lease0 + 1);
	CHECK(hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) == xcls);
	CHECK(slot == 0);
	CHECK(freed2[0] == 0 && freed2[1] == 0 && hkv_meta_state(meta) == HKV_BLK_PENDING);
	CHECK_RC(hkv_get(m.c, "k-0", 3, got, sizeof(got), &n, NULL), 0);
	CHECK(n == STAGE_VLEN && got[0] == 'k' && got[n - 1] == 'k');
	CHECK(hkvserver_seg_of(m.c, "k-0") == m.s2);
	CHECK_RC(hkv_get(m.c, "dead-pend", 9, got, sizeof(got), &n, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_get(m.c, "dead-live", 9, got, sizeof(got), &n, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(m.c, "dead-pend", 9, "new", 3, NULL), 0);
	CHECK_RC(hkv_get(m.c, "x", 1, got, sizeof(got), &n, NULL), 0);
	CHECK(n == sizeof(v) && got[0] == 'x');
	hkv_close(m.c);
	hkvserver_stop(&m.s);
}

/*
 * The same, but the writer of the unpublished LIVE block in S1 stays
 * connected: it may still publish it (or write it again), so the move must
 * not take it - it waits, is undone after 3 s, as before, and the block is
 * as it was written. (The server then empties S2 instead.)
 */
static void test_move_spares_live_writer(void)
{
	struct move_stage m;
	struct raw w;
	uint64_t off, t0, took_ms, meta = 0, e;
	uint32_t gen;
	int undone0, freed = -1, ret;
	char v[1000], got[STAGE_VLEN + 8], what[64];
	size_t n = 0;

	CHECK_PASSES(move_stage(&m));
	if (!m.ok) {
		hkvserver_stop(&m.s);
		return;
	}
	CHECK_RC(raw_open(&w, m.s.uri, m.s.token_file), 0);
	CHECK(raw_claim(&w, m.c1, m.s1, &off, 1) == 1);
	CHECK_RC(raw_put_block(&w, off, m.c1, HKV_BLK_LIVE, "alive-live", 100, &gen), 0);
	snprintf(what, sizeof(what), "moving segment %lld from class %u", (long long)m.s1, m.c1);
	undone0 = hkvserver_log_count(&m.s, what);
	memset(v, 'x', sizeof(v));
	t0 = now_ms();
	ret = hkv_set(m.c, "x", 1, v, sizeof(v), NULL);
	took_ms = now_ms() - t0;
	CHECK_RC(raw_block_freed(&w, off, m.c1, &freed), 0);
	CHECK_RC(raw_xfer(&w, HKV_WR_READ, off, 8), 0);
	memcpy(&meta, w.buf, 8);
	e = raw_seg_entry(&w, m.s1);
	printf("# the writer connected: the set took %llu ms (%s); moves of segment %lld undone: "
	       "%d; its block free: %d, meta %s gen %u (wrote %u); the segment still class %u: "
	       "%s\n", (unsigned long long)took_ms, hkv_strerror(ret), (long long)m.s1,
	       hkvserver_log_count(&m.s, what) - undone0, freed,
	       hkv_meta_state(meta) == HKV_BLK_LIVE ? "LIVE" : "not LIVE", hkv_meta_gen(meta),
	       gen, m.c1, hkv_seg_class(e) == m.c1 ? "yes" : "no");
	raw_close(&w);
	CHECK(hkvserver_log_count(&m.s, what) == undone0 + 1);
	CHECK(took_ms >= 3000);
	CHECK_RC(ret, 0); /* (S2 was emptied instead: its items fit in S1) */
	CHECK(freed == 0 && meta == hkv_meta_make(HKV_BLK_LIVE, m.c1, gen));
	CHECK(hkv_seg_state(e) == HKV_SEG_SHARED && hkv_seg_class(e) == m.c1);
	CHECK_RC(hkv_get(m.c, "k-0", 3, got, sizeof(got), &n, NULL), 0);
	CHECK(n == STAGE_VLEN && got[0] == 'k' && got[n - 1] == 'k');
	hkv_close(m.c);
	hkvserver_stop(&m.s);
}

/* ---- test_vanished_client ------------------------------------------------------------- */

/*
 * A client that vanishes without a word: it connects its data plane as any
 * client does (AUTH, then rdma_cm with its ticket), then its queue pair
 * stops answering - moved to the error state, as a dead host's would - and
 * no disconnect request is ever sent. The server never sends on a client's
 * connection for the data path, so only its keepalives (a zero-length RDMA
 * WRITE every HKV_PROBE_INTERVAL_MS) can find out.
 */
struct ghost {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct hkv_ctl_welcome w; /* its AUTH: client id and ticket */
	uint8_t rk[32];           /* and its session's request key */
	struct ctl_ep ep;
};

static int ghost_wait(struct ghost *g, enum rdma_cm_event_type want)
{
	struct pollfd p = {.fd = g->ec->fd, .events = POLLIN};
	struct rdma_cm_event *ev;
	int ok;

	if (poll(&p, 1, 5000) != 1 || rdma_get_cm_event(g->ec, &ev))
		return -1;
	ok = ev->event == want;
	rdma_ack_cm_event(ev);
	return ok ? 0 : -1;
}

static void ghost_free(struct ghost *g)
{
	if (g->id && g->id->qp)
		rdma_destroy_qp(g->id);
	if (g->cq)
		ibv_destroy_cq(g->cq);
	if (g->pd)
		ibv_dealloc_pd(g->pd);
	if (g->id)
		rdma_destroy_id(g->id);
	if (g->ec)
		rdma_destroy_event_channel(g->ec);
	memset(g, 0, sizeof(*g));
}

/* half: send the connect request and stop there (never take the reply, so
 * the connection is never established on the server's side either). */
static int ghost_connect(struct ghost *g, const struct hkvserver *s, int half)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	/* 7: Soft-RoCE retries forever, so only the server's keepalive deadline
	 * (not the transport's retries) can find this peer gone */
	struct rdma_conn_param cp = {.retry_count = 7, .rnr_retry_count = 7};
	char token[HKV_TOKEN_MAX + 1];
	struct hkv_data_hello dh;
	struct hkv_hello_msg m;
	struct hkv_ctl_welcome w;
	struct ctl_ep ep;
	uint64_t t0 = now_ms();
	int ret;

	memset(g, 0, sizeof(*g));
	if (ep_parse(s->uri, &ep) || hkv_token_load(s->token_file, token, sizeof(token), 0) < 0)
		return -1;
	/* the server may not have seen its readiness probe's client go yet */
	while ((ret = ctl_auth(&ep, token, &w, g->rk)) == -EUSERS && now_ms() - t0 < 5000)
		sleep_ms(50);
	if (ret)
		return -1;
	memset(&dh, 0, sizeof(dh));
	dh.client_id = w.client_id;
	memcpy(dh.ticket, w.ticket, HKV_TICKET_LEN);
	memset(&m, 0, sizeof(m));
	m.magic = HKV_CONN_MAGIC;
	m.len = sizeof(dh);
	memcpy(m.data, &dh, sizeof(dh));
	cp.private_data = &m;
	cp.private_data_len = sizeof(m);
	w.data_endpoint[sizeof(w.data_endpoint) - 1] = 0;
	if (!(g->ec = rdma_create_event_channel()) ||
	    rdma_create_id(g->ec, &g->id, NULL, RDMA_PS_TCP) ||
	    getaddrinfo(ep.host, w.data_endpoint, &hints, &ai))
		return -1;
	ret = rdma_resolve_addr(g->id, NULL, ai->ai_addr, 2000);
	freeaddrinfo(ai);
	if (ret || ghost_wait(g, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(g->id, 2000) || ghost_wait(g, RDMA_CM_EVENT_ROUTE_RESOLVED) ||
	    !(g->pd = ibv_alloc_pd(g->id->verbs)) ||
	    !(g->cq = ibv_create_cq(g->id->verbs, 4, NULL, NULL, 0)))
		return -1;
	qa.send_cq = qa.recv_cq = g->cq;
	g->w = w;
	g->ep = ep;
	if (rdma_create_qp(g->id, g->pd, &qa) || rdma_connect(g->id, &cp) ||
	    (!half && ghost_wait(g, RDMA_CM_EVENT_ESTABLISHED)))
		return -1;
	return 0;
}

static void test_vanished_client(void)
{
	const char *const one[] = {"--max-clients", "1", NULL};
	struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	struct hkvserver s;
	struct ghost g;
	uint64_t t0, gone_ms;
	char got[8];
	size_t vlen = 0;
	int ret;

	if (!use_verbs) {
		printf("# vanished client: verbs only (on shm a client that is gone has closed its "
		       "socket, which the server sees at once)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 1, "4M", "64K", one) == 0);
	cfg = hkvserver_config(&s);
	CHECK(cfg != NULL);
	CHECK(ghost_connect(&g, &s, 0) == 0);
	/* --max-clients 1: while the ghost is there, nobody else gets in - also
	 * after a few keepalives, which a live peer answers */
	CHECK_RC(hkv_open(cfg, &c), -EUSERS);
	sleep_ms(2 * HKV_PROBE_INTERVAL_MS + 1000);
	CHECK_RC(hkv_open(cfg, &c), -EUSERS);
	CHECK(ibv_modify_qp(g.id->qp, &err, IBV_QP_STATE) == 0);
	t0 = now_ms();
	while ((ret = hkv_open(cfg, &c)) == -EUSERS && now_ms() - t0 < 45000)
		sleep_ms(200);
	gone_ms = now_ms() - t0;
	printf("# vanished client: its queue pair stopped answering, no disconnect was sent; "
	       "%s after %llu ms (keepalive every %d ms, given up after %d ms)\n",
	       ret ? hkv_strerror(ret) : "the server closed it and a new client got its place",
	       (unsigned long long)gone_ms, HKV_PROBE_INTERVAL_MS, HKV_PROBE_TIMEOUT_MS);
	CHECK_RC(ret, 0);
	CHECK(gone_ms < HKV_PROBE_INTERVAL_MS + HKV_PROBE_TIMEOUT_MS + 8000);
	CHECK_RC(hkv_set(c, "after-ghost", 11, "ok", 2, NULL), 0);
	CHECK_RC(hkv_get(c, "after-ghost", 11, got, sizeof(got), &vlen, NULL), 0);
	CHECK(vlen == 2 && !memcmp(got, "ok", 2));
	hkv_close(c);
	ghost_free(&g);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}

/* ---- test_grant_stall ----------------------------------------------------------------- */

struct stall {
	struct ghost *g;
	atomic_int stop;
	int grants, again, slow;
	uint64_t worst_ms;
};

static void *stall_granter(void *arg)
{
	struct stall *st = arg;
	struct hkv_ctl_grant gr = {.client_id = st->g->w.client_id, .seg = HKV_GRANT_BASE};
	struct hkv_ctl_granted out;

	while (!atomic_load(&st->stop)) {
		uint64_t t0 = now_ms();
		int rc;

		gr.seq++;
		hkv_ctl_request_seal(&gr, sizeof(gr), HKV_CTL_GRANT, st->g->rk);
		rc = ctl_call(&st->g->ep, HKV_CTL_GRANT, &gr, sizeof(gr), HKV_CTL_GRANTED, &out,
				  sizeof(out));

		st->grants++;
		st->again += rc == -EAGAIN || rc == HKV_EAGAIN;
		if (now_ms() - t0 > st->worst_ms)
			st->worst_ms = now_ms() - t0;
	}
	return NULL;
}

/*
 * GRANT must not block the server's one event loop (issue 12, item 10). A
 * client authenticates, sends its connect request and never completes it
 * (its side never takes the reply, so the server never sees ESTABLISHED),
 * then asks for its base window over and over with its valid ticket.
 * Before, each GRANT spun up to 2 s waiting for the connection, stalling
 * every other client's control requests: a real client could not open.
 * Now a GRANT of an unestablished connection is refused at once and
 * charged to its source (the repeats run into the rate limit), and a bind
 * in flight is looked at again without waiting; a real client opens, sets
 * and gets meanwhile.
 */
static void test_grant_stall(void)
{
	struct stall st = {0};
	struct hkvserver s;
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	struct ghost g;
	pthread_t t;
	uint64_t t0, open_ms;
	int ret;

	if (!use_verbs) {
		printf("# (verbs: shm has no windows)\n");
		return;
	}
	CHECK(hkvserver_start(&s, 1, "4M", "64K", NULL) == 0);
	CHECK(ghost_connect(&g, &s, 1) == 0);
	/* its GRANTs from another address: another source than the real client */
	snprintf(g.ep.source, sizeof(g.ep.source), "127.0.0.1");
	st.g = &g;
	CHECK(!pthread_create(&t, NULL, stall_granter, &st));
	sleep_ms(300);
	cfg = hkvserver_config(&s);
	hkv_config_set_timeout_ms(cfg, 5000);
	t0 = now_ms();
	ret = hkv_open(cfg, &c);
	if (!ret)
		ret = hkv_set(c, "k", 1, "v", 1, NULL);
	open_ms = now_ms() - t0;
	atomic_store(&st.stop, 1);
	pthread_join(t, NULL);
	printf("# a half-connected client asked GRANT %d times (%d refused: not connected / rate "
	       "limited; slowest answer %llu ms); meanwhile a real client %s in %llu ms\n",
	       st.grants, st.again, (unsigned long long)st.worst_ms,
	       ret ? hkv_strerror(ret) : "opened and stored", (unsigned long long)open_ms);
	CHECK_RC(ret, 0);
	CHECK(open_ms < 1500);
	CHECK(st.worst_ms < 500);
	if (c)
		hkv_close(c);
	ghost_free(&g);
	hkv_config_free(cfg);
	hkvserver_stop(&s);
}


/* ---- test_netdev_down --------------------------------------------------------------- */

/*
 * The netdev under the rxe device goes down mid-run (issue 6). Verbs only:
 * the shm transport has no network device, so on shm this test has nothing
 * to take down and passes with a note.
 *
 * A client with a 2 s timeout runs gets (of keys stored before the fault,
 * whose values are known) and sets (each of a new key) in a thread while
 * `ip link set <netdev> down` holds for ND_HOLD_MS, then `ip link set up`
 * (and the address re-added had it gone). The fault runs in a shell of its
 * own session that always brings the link back after the hold, even if this
 * process crashes or is killed.
 *
 * What `ip link set down` does to rxe loopback traffic (measured, Debian 12,
 * kernel 6.1): it does cut the path. The next RDMA op fails at once (a
 * local QP error, HKV_ETRANSPORT); from then the handle's own reconnect
 * attempts (every 200 ms) fail at once with HKV_EDISCONNECTED while the
 * link is down. A connection with no traffic while the link is down rides
 * the flap out: afterwards the same handle and a new one work. But traffic
 * during the fault leaves rdma_cm over that rxe device dead after the link
 * is up: every connect (ours, and perftest's `ib_read_lat -R` from another
 * process) times out for as long as was tried (>60 s), the GSI QP still
 * reading RTS; reconnects of the old handle then fail with HKV_ETIMEDOUT
 * after the full timeout. `rdma link delete` + `add` cures it, but only once
 * no process holds the device (rxe cannot disassociate open contexts, and
 * librdmacm keeps every device open until exit), so not from inside this
 * process, and the rdma tests after this one in the same guest would fail.
 *
 * So by default the test runs quiet: operations before and after the flap,
 * none while the link is down; it checks that nothing fails and that the
 * same handle, a new one, and every key come through. With
 * HKV_NETDEV_FAULT_UNDER_LOAD=1 (run it alone, last in its guest:
 * `scripts/softroce-run env HKV_REQUIRE_RDMA=1 HKV_NETDEV_FAULT_UNDER_LOAD=1
 * build-nd/bin/test_faults verbs`) operations go on during the fault, and
 * it checks what a user needs: no operation takes longer than the timeout
 * plus a margin, failures are the lost-path errors (never a miss of a
 * stored key, never a wrong value), and a new handle's failed connects are
 * bounded too; if one connects, every key reads back. test_netdev_flap
 * below runs that load in the rdma tier from a process that holds no RDMA
 * device, makes the device again afterwards and reads every key back.
 *
 * It runs only against a dummy netdev (what scripts/softroce-run makes): on
 * a host with a real RDMA NIC it would take that host's network down.
 */

#define ND_TIMEOUT_MS 2000
#define ND_MARGIN_MS  1500 /* TCG guest: scheduling noise on top of the timeout */
#define ND_KEYS       200
#define ND_HOLD_MS    (ND_TIMEOUT_MS + 3000)
#define ND_MAX_SETS   200000
#define ND_MAX_CODES  8

struct nd_loop {
	struct hkv_client *c;
	uint64_t t0;
	int quiet;
	_Atomic int stop;
	_Atomic uint64_t fault_at, up_at; /* ms since t0 the fault started / the link was up */
	/* results, read after the join */
	uint64_t ops, ok, bad, miss, ok_down, ops_before, err_before;
	uint64_t max_ms, max_at, max_down_ms, first_err_at, first_err_ms;
	int first_err, max_ret;
	int codes[ND_MAX_CODES], ncodes;
	uint64_t code_n[ND_MAX_CODES];
	int nsets;
	uint8_t set_ok[ND_MAX_SETS]; /* 1: the set of key n returned 0; 2: it failed */
	uint8_t val[VAL_MAX], got[VAL_MAX];
};

static const char *hkv_code_name(int ret)
{
	switch (ret) {
	case 0: return "ok";
	case HKV_ENOTFOUND: return "HKV_ENOTFOUND";
	case HKV_EDISCONNECTED: return "HKV_EDISCONNECTED";
	case HKV_ETIMEDOUT: return "HKV_ETIMEDOUT";
	case HKV_EREMOTE_ACCESS: return "HKV_EREMOTE_ACCESS";
	case HKV_EREMOTE_INVAL: return "HKV_EREMOTE_INVAL";
	case HKV_EFLUSHED: return "HKV_EFLUSHED";
	case HKV_ETRANSPORT: return "HKV_ETRANSPORT";
	case HKV_ECORRUPT: return "HKV_ECORRUPT";
	case HKV_EAGAIN: return "HKV_EAGAIN";
	case HKV_EFULL: return "HKV_EFULL";
	default: return hkv_strerror(ret);
	}
}

/* The errors a lost path may give: the connection is gone or timed out. */
static int nd_error_ok(int ret)
{
	return ret == HKV_ETIMEDOUT || ret == HKV_EDISCONNECTED || ret == HKV_ETRANSPORT ||
	       ret == HKV_EFLUSHED;
}

static size_t nd_value(uint8_t *v, char *key, size_t cap, int preloaded, int i)
{
	snprintf(key, cap, "%s-%06d", preloaded ? "nd-pre" : "nd-set", i);
	return make_value(v, preloaded ? 64 + (size_t)i % 300 : 64 + (size_t)i % 200, key,
			  (uint64_t)(preloaded ? 1 : 2) << 40 | (uint64_t)i);
}

static void nd_count(struct nd_loop *l, int ret)
{
	int i;

	for (i = 0; i < l->ncodes && l->codes[i] != ret; i++)
		;
	if (i == l->ncodes && l->ncodes < ND_MAX_CODES)
		l->codes[l->ncodes++] = ret;
	if (i < ND_MAX_CODES)
		l->code_n[i]++;
}

/* One get (odd n) or set (even n); its result is accounted to the fault's phases. */
static void nd_step(struct nd_loop *l, uint64_t n)
{
	char key[32];
	uint8_t want[VAL_MAX];
	uint64_t start = now_ms() - l->t0, took, down, up;
	size_t len, vlen = 0;
	int ret, set = !(n & 1) && l->nsets < ND_MAX_SETS;

	if (set) {
		len = nd_value(l->val, key, sizeof(key), 0, l->nsets);
		ret = hkv_set(l->c, key, strlen(key), l->val, len, NULL);
		l->set_ok[l->nsets++] = ret ? 2 : 1;
	} else {
		len = nd_value(want, key, sizeof(key), 1, (int)(n / 2 % ND_KEYS));
		ret = hkv_get(l->c, key, strlen(key), l->got, sizeof(l->got), &vlen, NULL);
		if (!ret && (vlen != len || memcmp(l->got, want, len))) {
			if (l->bad++ < 5)
				report_bad("netdev-down client", "get", key, l->got, vlen,
					   check_value(key, l->got, vlen) ?: "an older value");
		}
		if (ret == HKV_ENOTFOUND && l->miss++ < 5)
			fprintf(stderr, "netdev-down client: get(\"%s\"): a stored key reported "
				"absent\n", key);
	}
	took = now_ms() - l->t0 - start;
	down = atomic_load(&l->fault_at);
	up = atomic_load(&l->up_at);
	l->ops++;
	if (!down) {
		l->ops_before++;
		l->err_before += ret != 0;
	}
	if (took > l->max_ms) {
		l->max_ms = took;
		l->max_at = start;
		l->max_ret = ret;
	}
	if (down && (!up || start < up) && took > l->max_down_ms)
		l->max_down_ms = took;
	if (!ret) {
		l->ok++;
		l->ok_down += down && !up;
		return;
	}
	nd_count(l, ret);
	if (!l->first_err_at) {
		l->first_err_at = start + took;
		l->first_err_ms = took;
		l->first_err = ret;
	}
	sleep_ms(1); /* a failed handle fails at once: keep the loop from spinning */
}

static void *nd_loop_main(void *arg)
{
	struct nd_loop *l = arg;

	for (uint64_t n = 0; !atomic_load(&l->stop); n++) {
		if (l->quiet && atomic_load(&l->fault_at) && !atomic_load(&l->up_at)) {
			sleep_ms(1); /* quiet mode: no operation while the link is down */
			continue;
		}
		nd_step(l, n);
	}
	return NULL;
}

/* The first line of a command's output, trailing newline cut; 0 or -1. */
static int nd_cmd_line(const char *cmd, char *out, size_t cap)
{
	FILE *p = popen(cmd, "r");
	int ok;

	if (!p)
		return -1;
	ok = fgets(out, (int)cap, p) != NULL;
	pclose(p);
	if (!ok)
		return -1;
	out[strcspn(out, "\n")] = 0;
	return 0;
}

/* The netdev under the rdma device and its IPv4 address/prefix; 0 or -1. */
static int nd_find_netdev(char *dev, size_t dcap, char *cidr, size_t ccap)
{
	const char *rdev = getenv("HKV_RDMA_DEV");
	char path[256], cmd[256], line[512], *p;
	FILE *f;
	int ok;

	if (!rdev)
		return -1;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/0", rdev);
	if (!(f = fopen(path, "r")))
		return -1;
	ok = fgets(dev, (int)dcap, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	dev[strcspn(dev, "\n")] = 0;
	snprintf(cmd, sizeof(cmd), "ip -o -4 addr show dev %s 2>/dev/null", dev);
	if (nd_cmd_line(cmd, line, sizeof(line)) || !(p = strstr(line, " inet ")))
		return -1;
	p += 6;
	snprintf(cidr, ccap, "%.*s", (int)strcspn(p, " "), p);
	return 0;
}

static int nd_is_dummy(const char *dev)
{
	char cmd[256], line[1024];

	snprintf(cmd, sizeof(cmd), "ip -d -o link show dev %s 2>/dev/null", dev);
	return !nd_cmd_line(cmd, line, sizeof(line)) && strstr(line, " dummy ");
}

/*
 * Start the fault in its own session (posix_spawn: no fork of this process,
 * which holds RDMA resources): down, say "down", hold, up, re-add the address
 * if it went, say "up". Its stdout comes back on *fd.
 */
static pid_t nd_start_fault(const char *dev, const char *cidr, int hold_ms, int *fd)
{
	static const char script[] =
		"ip link set dev \"$0\" down && echo down; sleep \"$2\"; "
		"ip link set dev \"$0\" up; "
		"ip -o -4 addr show dev \"$0\" | grep -q \" inet $1 \" || "
		"ip addr add \"$1\" dev \"$0\"; echo up";
	char hold[16];
	const char *argv[] = {"/bin/sh", "-c", script, dev, cidr, hold, NULL};
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	extern char **environ;
	pid_t pid = -1;
	int p[2];

	snprintf(hold, sizeof(hold), "%d.%03d", hold_ms / 1000, hold_ms % 1000);
	if (pipe2(p, O_CLOEXEC))
		return -1;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawnattr_init(&at);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
	if (posix_spawn(&pid, "/bin/sh", &fa, &at, (char *const *)argv, environ))
		pid = -1;
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(p[1]);
	if (pid < 0)
		close(p[0]);
	else
		*fd = p[0];
	return pid;
}

/* Wait up to timeout_ms for the fault script to print `word`; 0 or -1. */
static int nd_wait_word(int fd, const char *word, int timeout_ms)
{
	uint64_t end = now_ms() + (uint64_t)timeout_ms;
	char line[64];
	size_t len = 0;

	while (now_ms() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 50) <= 0)
			continue;
		n = read(fd, line + len, 1);
		if (n <= 0)
			return -1;
		if (line[len] != '\n') {
			len += len < sizeof(line) - 2;
			continue;
		}
		line[len] = 0;
		len = 0;
		if (!strcmp(line, word))
			return 0;
	}
	return -1;
}

/* Link up, address present, rdma port ACTIVE; 1 if so. */
static int nd_path_ready(const char *dev, const char *cidr)
{
	const char *rdev = getenv("HKV_RDMA_DEV");
	char cmd[256], line[512], want[96], path[256], state[64] = "";
	FILE *f;

	snprintf(cmd, sizeof(cmd), "ip -o -4 addr show dev %s up 2>/dev/null", dev);
	snprintf(want, sizeof(want), " inet %s ", cidr);
	if (nd_cmd_line(cmd, line, sizeof(line)) || !strstr(line, want))
		return 0;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", rdev);
	if ((f = fopen(path, "r"))) {
		if (!fgets(state, sizeof(state), f))
			state[0] = 0;
		fclose(f);
	}
	return strstr(state, "ACTIVE") != NULL;
}

struct nd_open {
	int ret, tries;
	uint64_t ms, longest_ms;
};

/* Open a handle on s with the test's timeout, trying again until it works or for_ms passed. */
static struct hkv_client *nd_open(const struct hkvserver *s, uint64_t for_ms, struct nd_open *o)
{
	struct hkv_config *cfg = hkvserver_config(s);
	struct hkv_client *c = NULL;
	uint64_t t0 = now_ms(), t;

	memset(o, 0, sizeof(*o));
	if (!cfg || hkv_config_set_timeout_ms(cfg, ND_TIMEOUT_MS))
		abort();
	do {
		if (o->tries++)
			sleep_ms(200);
		t = now_ms();
		o->ret = hkv_open(cfg, &c);
		if (now_ms() - t > o->longest_ms)
			o->longest_ms = now_ms() - t;
	} while (o->ret && now_ms() - t0 < for_ms);
	o->ms = now_ms() - t0;
	hkv_config_free(cfg);
	return o->ret ? NULL : c;
}

struct nd_after {
	int pre_ok, pre_lost, pre_bad, set_ok_lost, set_ok_bad, set_fail_present, set_fail_bad,
		set_fail_absent, other;
};

/* Every key stored before the fault, every set of the loop, read by handle c. */
static void nd_readback(struct hkv_client *c, const struct nd_loop *l, struct nd_after *a)
{
	uint8_t *want = malloc(VAL_MAX), *got = malloc(VAL_MAX);
	char key[32];

	memset(a, 0, sizeof(*a));
	if (!want || !got)
		abort();
	for (int i = 0; i < ND_KEYS + l->nsets; i++) {
		int pre = i < ND_KEYS, idx = pre ? i : i - ND_KEYS, ret, same;
		size_t len = nd_value(want, key, sizeof(key), pre, idx), vlen = 0;

		ret = hkv_get(c, key, strlen(key), got, VAL_MAX, &vlen, NULL);
		same = !ret && vlen == len && !memcmp(got, want, len);
		if (ret && ret != HKV_ENOTFOUND) {
			if (a->other++ < 5)
				fprintf(stderr, "new client: get(\"%s\"): %s\n", key,
					hkv_code_name(ret));
			continue;
		}
		if (pre) {
			a->pre_ok += same;
			a->pre_lost += ret == HKV_ENOTFOUND;
			a->pre_bad += !ret && !same;
		} else if (l->set_ok[idx] == 1) {
			a->set_ok_lost += ret == HKV_ENOTFOUND;
			a->set_ok_bad += !ret && !same;
		} else {
			a->set_fail_absent += ret == HKV_ENOTFOUND;
			a->set_fail_present += same;
			a->set_fail_bad += !ret && !same;
		}
	}
	free(want);
	free(got);
}

static void nd_print_loop(const struct nd_loop *l, uint64_t fault, uint64_t down, uint64_t up,
			  uint64_t end)
{
	printf("# netdev down: %llu ops (%llu ok) in %.1f s; `ip link set down` started at "
	       "%.2f s, returned at %.2f s; link up again at %.2f s\n",
	       (unsigned long long)l->ops, (unsigned long long)l->ok, end / 1000.0,
	       fault / 1000.0, down / 1000.0, up / 1000.0);
	printf("#   before the fault: %llu ops, %llu errors; %llu ops succeeded from then until "
	       "the link was up\n",
	       (unsigned long long)l->ops_before, (unsigned long long)l->err_before,
	       (unsigned long long)l->ok_down);
	if (l->first_err_at)
		printf("#   first error %s at %.3f s (%+.0f ms from the start of `ip link set "
		       "down`), that op waited %llu ms\n",
		       hkv_code_name(l->first_err), l->first_err_at / 1000.0,
		       (double)l->first_err_at - (double)fault,
		       (unsigned long long)l->first_err_ms);
	printf("#   longest op %llu ms (started at %.3f s, %s); timeout %d ms\n",
	       (unsigned long long)l->max_ms, l->max_at / 1000.0, hkv_code_name(l->max_ret),
	       ND_TIMEOUT_MS);
	for (int i = 0; i < l->ncodes; i++)
		printf("#   error %s (%d): %llu ops\n", hkv_code_name(l->codes[i]), l->codes[i],
		       (unsigned long long)l->code_n[i]);
	printf("#   wrong values %llu, stored keys reported absent %llu\n",
	       (unsigned long long)l->bad, (unsigned long long)l->miss);
}

static void test_netdev_down(void)
{
	struct nd_loop *l;
	struct nd_after a = {0};
	struct nd_open probe, o = {0};
	struct hkvserver s;
	struct hkv_client *c;
	char dev[64], cidr[64], key[32], file[128];
	/* No keepalives: Soft-RoCE fails a send at once while its netdev is down
	 * (a local QP error, no retries), so the server's keepalive during the
	 * flap would end the connection this test wants to see ride it out; and
	 * any traffic during a flap leaves rxe's rdma_cm dead (see above).
	 * test_vanished_client covers the keepalives. */
	const char *extra[] = {"--memory-file", file, "--keepalive-ms", "0", NULL};
	uint64_t fault, down = 0, up = 0, end, t_up, back_ms;
	int fd = -1, status = 0, fault_ok, ready, joined, old_ret, codes_ok = 1, alive,
	    n_ok = 0;
	size_t vlen = 0;
	pid_t fpid;
	pthread_t th;

	if (!use_verbs) {
		printf("# netdev down: verbs only (shm has no network device); nothing to do\n");
		return;
	}
	CHECK(nd_find_netdev(dev, sizeof(dev), cidr, sizeof(cidr)) == 0);
	if (!nd_is_dummy(dev)) {
		printf("# netdev down: %s is not a dummy device; not taking a real network down "
		       "(run through scripts/softroce-run)\n", dev);
		return;
	}
	printf("# netdev down: %s under %s holds %s; down for %d ms\n", dev,
	       getenv("HKV_RDMA_DEV"), cidr, ND_HOLD_MS);
	l = calloc(1, sizeof(*l));
	CHECK(l != NULL);
	l->quiet = !getenv("HKV_NETDEV_FAULT_UNDER_LOAD");
	printf("# netdev down: %s\n", l->quiet ? "quiet mode: no operations while the link is "
	       "down (HKV_NETDEV_FAULT_UNDER_LOAD=1: operations go on)" : "operations go on "
	       "while the link is down; rdma_cm over the device stays dead after this");
	snprintf(file, sizeof(file), "/tmp/hkv-netdev-%d.region", (int)getpid());
	hkv_test_unlink_region(file);
	CHECK(hkvserver_start(&s, 1, "16M", "64K", extra) == 0);
	l->c = nd_open(&s, 0, &o);
	CHECK_RC(o.ret, 0);
	for (int i = 0; i < ND_KEYS; i++) {
		size_t len = nd_value(l->val, key, sizeof(key), 1, i);

		CHECK_RC(hkv_set(l->c, key, strlen(key), l->val, len, NULL), 0);
	}

	l->t0 = now_ms();
	CHECK(pthread_create(&th, NULL, nd_loop_main, l) == 0);
	sleep_ms(1500);
	fault = now_ms() - l->t0;
	atomic_store(&l->fault_at, fault);
	fpid = nd_start_fault(dev, cidr, ND_HOLD_MS, &fd);
	fault_ok = fpid > 0 && nd_wait_word(fd, "down", 10000) == 0;
	down = now_ms() - l->t0;
	if (fpid > 0) {
		fault_ok &= nd_wait_word(fd, "up", ND_HOLD_MS + 30000) == 0;
		up = now_ms() - l->t0;
		atomic_store(&l->up_at, up);
		waitpid(fpid, &status, 0);
		close(fd);
	}
	t_up = now_ms();
	while (!(ready = nd_path_ready(dev, cidr)) && now_ms() - t_up < 10000)
		sleep_ms(50);
	back_ms = now_ms() - t_up;
	sleep_ms(2000); /* the old handle keeps going with the link up */
	atomic_store(&l->stop, 1);
	{
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 30;
		joined = pthread_timedjoin_np(th, NULL, &ts) == 0;
	}
	end = now_ms() - l->t0;
	if (!joined) {
		fprintf(stderr, "netdev down: an operation still hangs 30 s after the link came "
			"back\n");
		fflush(NULL);
		_exit(1);
	}
	nd_print_loop(l, fault, down, up, end);
	printf("# netdev down: link, address and %s port ACTIVE %llu ms after `ip link set up`\n",
	       getenv("HKV_RDMA_DEV"), (unsigned long long)back_ms);
	old_ret = hkv_get(l->c, "nd-pre-000000", 13, l->got, sizeof(l->got), &vlen, NULL);
	printf("# netdev down: the old handle (it reconnects by itself) then: get -> %s\n",
	       hkv_code_name(old_ret));

	/* A new handle on the same server, with the link back. */
	c = nd_open(&s, 10000, &probe);
	printf("# netdev down: a new handle on the same server: %s after %llu ms (%d tries, "
	       "longest %llu ms)\n",
	       hkv_code_name(probe.ret), (unsigned long long)probe.ms, probe.tries,
	       (unsigned long long)probe.longest_ms);
	if (!c)
		printf("# netdev down: rdma_cm over %s does not answer any more (see the comment "
		       "above test_netdev_down); keys not read back\n", getenv("HKV_RDMA_DEV"));
	if (c) {
		nd_readback(c, l, &a);
		hkv_close(c);
	}
	for (int i = 0; i < l->nsets; i++)
		n_ok += l->set_ok[i] == 1;
	printf("# netdev down: of %d keys stored before the fault: %d read back, %d lost, %d "
	       "wrong\n", ND_KEYS, a.pre_ok, a.pre_lost, a.pre_bad);
	printf("#   sets in the loop: %d returned ok (%d lost, %d wrong), %d failed (%d absent, "
	       "%d stored whole, %d wrong); other errors %d\n",
	       n_ok, a.set_ok_lost, a.set_ok_bad, l->nsets - n_ok, a.set_fail_absent,
	       a.set_fail_present, a.set_fail_bad, a.other);
	if (l->c)
		hkv_close(l->c);
	alive = s.pid > 0 && server_alive(&s);
	hkvserver_stop(&s);
	hkv_test_unlink_region(file);
	for (int i = 0; i < l->ncodes; i++)
		codes_ok &= nd_error_ok(l->codes[i]);
	CHECK(fault_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(ready);
	CHECK(alive);
	CHECK(l->ops_before > 0 && l->err_before == 0);
	CHECK(l->bad == 0 && l->miss == 0);
	CHECK(codes_ok);
	CHECK(l->max_ms <= ND_TIMEOUT_MS + ND_MARGIN_MS); /* no hang */
	/* a failed open is bounded by the timeout too, and says why */
	CHECK(probe.longest_ms <= ND_TIMEOUT_MS + ND_MARGIN_MS);
	CHECK(probe.ret == 0 || nd_error_ok(probe.ret));
	if (l->quiet) {
		/* an idle connection rides out the flap: nothing fails, nothing is lost */
		CHECK(l->first_err_at == 0);
		CHECK_RC(old_ret, 0);
		CHECK_RC(probe.ret, 0);
	} else {
		CHECK(l->first_err_at > 0); /* the fault did cut the path */
	}
	if (c) {
		CHECK(a.pre_ok == ND_KEYS && a.other == 0);
		CHECK(a.set_ok_lost == 0 && a.set_ok_bad == 0 && a.set_fail_bad == 0);
		CHECK(n_ok > 0);
	}
	free(l);
}

/* ---- test_netdev_flap: the flap under load, then every stored key read back ----------- */

/*
 * `test_faults verbs netdev-flap` (ctest netdev_flap_verbs, rdma tier): the
 * netdev under rxe0 goes down for ND_HOLD_MS while a client runs gets and
 * sets, as with HKV_NETDEV_FAULT_UNDER_LOAD=1 above; then the device is made
 * again and every set that returned success is read back.
 *
 * Traffic during the flap leaves rdma_cm over rxe dead (see the comment
 * above test_netdev_down); only `rdma link delete` + `rdma link add` brings
 * it back, and only once no process holds the device. So this process, the
 * supervisor, never opens an RDMA device: it starts the server with
 * hkvserver_start_noclient() (readiness by a control-plane connect and the
 * log's "ready", not by hkv_open) and does all verbs work in children, fork +
 * exec of this binary ("test_faults worker flap-load|flap-read URI TOKEN-FILE
 * ID MS FD"; commands on their stdin, results on FD):
 *
 *   1. server on --memory-file; the loaded child stores ND_KEYS keys, says
 *      "ready", runs nd_step() in a thread (gets of those keys, sets of new
 *      keys) while the supervisor takes the link down and up (it tells the
 *      child when: "fault T", "down T", "up T"), runs 2 s more, then "stop".
 *      The child reports its counts, its error codes, its longest
 *      operation, and every set with its outcome as "k|f KEY LEN SEQ PHASE"
 *      (the value is make_value(KEY, LEN, SEQ); PHASE p: the preload, b:
 *      before the fault, g: while `ip link set down` ran, d: link down, a:
 *      link up again; by when the set started), then exits. It must show
 *      operations while the link was down, each ending within the timeout
 *      plus ND_MARGIN_MS with a lost-path error (nd_error_ok()), never a
 *      wrong value or a miss of a stored key;
 *   2. the server is killed; with no process holding the device left (the
 *      supervisor checks /proc/<pid>/fd for /dev/infiniband/uverbs*, its own
 *      included), rxe0 is deleted and added again on the same netdev, and
 *      the address and port state (ACTIVE) are checked;
 *   3. the server is restarted warm on its memory file; a fresh reader child
 *      gets every reported key: each set that returned success must read
 *      back with its exact value, a failed set may be absent or whole (never
 *      anything else); a few new sets then read back too.
 *
 * The device is made again exactly as scripts/softroce-run made it, so the
 * rdma tests after this one in the same guest run on it.
 */

#define NF_NEW_KEYS 100

enum { NF_PRE, NF_BEFORE, NF_GOING, NF_DOWN, NF_AFTER, NF_NPHASES };
static const char nf_tag[NF_NPHASES + 1] = "pbgda";
static const char *const nf_phase_name[NF_NPHASES] = {
	"stored before the loop", "before the fault", "while `ip link set down` ran",
	"while the link was down", "after the link was up"};

/* nd_value()'s length and sequence number for key i (mirrored; the loaded
 * child checks it gives the same bytes). */
static void nf_params(int preloaded, int i, size_t *len, uint64_t *seq)
{
	*len = preloaded ? 64 + (size_t)i % 300 : 64 + (size_t)i % 200;
	*seq = (uint64_t)(preloaded ? 1 : 2) << 40 | (uint64_t)i;
}

/* ---- children ---- */

/* A struct hkvserver naming only what a child needs (URI and token file). */
static void nf_server_of(struct hkvserver *s, const struct worker_args *a)
{
	memset(s, 0, sizeof(*s));
	s->verbs = 1;
	snprintf(s->uri, sizeof(s->uri), "%s", a->uri);
	snprintf(s->token_file, sizeof(s->token_file), "%s", a->token_file);
}

struct nf_load {
	struct nd_loop *l;
	_Atomic uint64_t down_at; /* ms since l->t0 `ip link set down` returned */
	uint64_t ops[NF_NPHASES], ok[NF_NPHASES];
	uint8_t phase_of[ND_MAX_SETS];
};

static int nf_phase(struct nf_load *x)
{
	if (!atomic_load(&x->l->fault_at))
		return NF_BEFORE;
	if (atomic_load(&x->l->up_at))
		return NF_AFTER;
	return atomic_load(&x->down_at) ? NF_DOWN : NF_GOING;
}

static void *nf_load_main(void *arg)
{
	struct nf_load *x = arg;
	struct nd_loop *l = x->l;

	for (uint64_t n = 0; !atomic_load(&l->stop); n++) {
		int ph = nf_phase(x), ns = l->nsets;
		uint64_t ok = l->ok;

		nd_step(l, n);
		x->ops[ph]++;
		x->ok[ph] += l->ok - ok;
		if (l->nsets > ns)
			x->phase_of[ns] = (uint8_t)ph;
	}
	return NULL;
}

/* "k|f KEY LEN SEQ PHASE" for one set; 1 if nf_params() does not give nd_value()'s bytes. */
static int nf_report_set(FILE *f, int ok, int preloaded, int i, int ph)
{
	static uint8_t v[VAL_MAX], w[VAL_MAX];
	char key[32];
	size_t len, vlen = nd_value(v, key, sizeof(key), preloaded, i);
	uint64_t seq;

	nf_params(preloaded, i, &len, &seq);
	fprintf(f, "%c %s %zu %llu %c\n", ok ? 'k' : 'f', key, len, (unsigned long long)seq,
		nf_tag[ph]);
	return make_value(w, len, key, seq) != vlen || memcmp(v, w, vlen);
}

/* The loaded client: preload, "ready", nd_step() until "stop", then the report. */
static int nf_run_load(const struct worker_args *a)
{
	struct nd_loop *l = calloc(1, sizeof(*l));
	struct nf_load *x = calloc(1, sizeof(*x));
	struct hkvserver s;
	struct nd_open o;
	struct timespec ts;
	char line[128], key[32];
	int joined, mismatch = 0;
	pthread_t th;
	FILE *f;

	if (!l || !x)
		abort();
	x->l = l;
	nf_server_of(&s, a);
	l->c = nd_open(&s, 20000, &o);
	if (!l->c) {
		fprintf(stderr, "flap-load: cannot open a client: %s (%d tries)\n",
			hkv_code_name(o.ret), o.tries);
		return 2;
	}
	for (int i = 0; i < ND_KEYS; i++) {
		size_t len = nd_value(l->val, key, sizeof(key), 1, i);
		int ret = hkv_set(l->c, key, strlen(key), l->val, len, NULL);

		if (ret) {
			fprintf(stderr, "flap-load: preload set(\"%s\"): %s\n", key,
				hkv_code_name(ret));
			return 2;
		}
	}
	dprintf(a->fd, "ready\n");
	l->t0 = now_ms();
	if (pthread_create(&th, NULL, nf_load_main, x))
		return 2;
	/* commands: "fault T" / "down T" / "up T" (T: the supervisor's CLOCK_MONOTONIC ms),
	 * "stop" */
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long long t = 0;
		uint64_t rel;

		if (!strncmp(line, "stop", 4))
			break;
		if (sscanf(line, "%*s %llu", &t) != 1)
			continue;
		rel = t > l->t0 ? t - l->t0 : 1;
		if (!strncmp(line, "fault", 5))
			atomic_store(&l->fault_at, rel);
		else if (!strncmp(line, "down", 4))
			atomic_store(&x->down_at, rel);
		else if (!strncmp(line, "up", 2))
			atomic_store(&l->up_at, rel);
	}
	atomic_store(&l->stop, 1);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 30;
	joined = pthread_timedjoin_np(th, NULL, &ts) == 0;
	if (!joined) {
		fprintf(stderr, "flap-load: an operation still hangs 30 s after \"stop\"\n");
		dprintf(a->fd, "hung\n");
		_exit(3);
	}
	hkv_close(l->c);
	if (!(f = fdopen(a->fd, "w")))
		return 2;
	fprintf(f, "loop ops=%llu ok=%llu bad=%llu miss=%llu ops_before=%llu err_before=%llu "
		"max_ms=%llu max_at=%llu max_ret=%d max_down_ms=%llu first_err=%d "
		"first_err_at=%llu first_err_ms=%llu nsets=%d fault_at=%llu up_at=%llu\n",
		(unsigned long long)l->ops, (unsigned long long)l->ok, (unsigned long long)l->bad,
		(unsigned long long)l->miss, (unsigned long long)l->ops_before,
		(unsigned long long)l->err_before, (unsigned long long)l->max_ms,
		(unsigned long long)l->max_at, l->max_ret, (unsigned long long)l->max_down_ms,
		l->first_err, (unsigned long long)l->first_err_at,
		(unsigned long long)l->first_err_ms, l->nsets,
		(unsigned long long)atomic_load(&l->fault_at),
		(unsigned long long)atomic_load(&l->up_at));
	fprintf(f, "phases");
	for (int p = NF_BEFORE; p < NF_NPHASES; p++)
		fprintf(f, " ops_%c=%llu ok_%c=%llu", nf_tag[p], (unsigned long long)x->ops[p],
			nf_tag[p], (unsigned long long)x->ok[p]);
	fprintf(f, "\n");
	for (int i = 0; i < l->ncodes; i++)
		fprintf(f, "code %d %llu\n", l->codes[i], (unsigned long long)l->code_n[i]);
	for (int i = 0; i < ND_KEYS; i++)
		mismatch += nf_report_set(f, 1, 1, i, NF_PRE);
	for (int i = 0; i < l->nsets; i++)
		mismatch += nf_report_set(f, l->set_ok[i] == 1, 0, i, x->phase_of[i]);
	fprintf(f, "mismatch n=%d\nend\n", mismatch);
	free(x);
	free(l);
	return fclose(f) ? 2 : 0;
}

/* The reader: every set from stdin read back on a fresh handle, then new sets. */
static int nf_run_read(const struct worker_args *a)
{
	/* per phase, sets that returned ok: n, exact, absent, wrong, error */
	unsigned long long k[NF_NPHASES][5] = {{0}};
	/* sets that failed: n, absent, whole, wrong, error; new sets read back */
	unsigned long long fl[5] = {0}, new_ok = 0, max_ms = 0;
	uint8_t *want = malloc(VAL_MAX), *got = malloc(VAL_MAX);
	struct hkv_client *c;
	struct hkvserver s;
	struct nd_open o;
	char line[160], key[64], tag, what;
	int shown = 0;

	if (!want || !got)
		abort();
	nf_server_of(&s, a);
	c = nd_open(&s, 20000, &o);
	dprintf(a->fd, "open ret=%d ms=%llu tries=%d\n", o.ret, (unsigned long long)o.ms,
		o.tries);
	if (!c) {
		fprintf(stderr, "flap-read: cannot open a client: %s (%d tries in %llu ms)\n",
			hkv_code_name(o.ret), o.tries, (unsigned long long)o.ms);
		return 2;
	}
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long long seq;
		size_t len, vlen = 0;
		uint64_t t = now_ms();
		const char *ph;
		int ret, same;

		if (sscanf(line, "%c %63s %zu %llu %c", &what, key, &len, &seq, &tag) != 5 ||
		    (what != 'k' && what != 'f') || !tag || !(ph = strchr(nf_tag, tag)))
			continue;
		len = make_value(want, len, key, seq);
		ret = hkv_get(c, key, strlen(key), got, VAL_MAX, &vlen, NULL);
		if (now_ms() - t > max_ms)
			max_ms = now_ms() - t;
		same = !ret && vlen == len && !memcmp(got, want, len);
		if (what == 'k') {
			unsigned long long *n = k[ph - nf_tag];

			n[0]++;
			n[1] += same;
			n[2] += ret == HKV_ENOTFOUND;
			n[3] += !ret && !same;
			n[4] += ret && ret != HKV_ENOTFOUND;
		} else {
			fl[0]++;
			fl[1] += ret == HKV_ENOTFOUND;
			fl[2] += same;
			fl[3] += !ret && !same;
			fl[4] += ret && ret != HKV_ENOTFOUND;
		}
		if ((ret == HKV_ENOTFOUND && what == 'k') || (ret && ret != HKV_ENOTFOUND) ||
		    (!ret && !same)) {
			if (shown++ < 5)
				fprintf(stderr, "flap-read: get(\"%s\") of a set that %s (%c): %s%s\n",
					key, what == 'k' ? "returned ok" : "failed", tag,
					hkv_code_name(ret), !ret ? ", a different value" : "");
		}
	}
	for (int i = 0; i < NF_NEW_KEYS; i++) {
		size_t len, vlen = 0;

		snprintf(key, sizeof(key), "nf-new-%04d", i);
		len = make_value(want, 64 + (size_t)i, key, (uint64_t)3 << 40 | (uint64_t)i);
		new_ok += !hkv_set(c, key, strlen(key), want, len, NULL) &&
			  !hkv_get(c, key, strlen(key), got, VAL_MAX, &vlen, NULL) && vlen == len &&
			  !memcmp(got, want, len);
	}
	hkv_close(c);
	dprintf(a->fd, "failed n=%llu absent=%llu whole=%llu wrong=%llu err=%llu\n", fl[0], fl[1],
		fl[2], fl[3], fl[4]);
	for (int p = 0; p < NF_NPHASES; p++)
		dprintf(a->fd, "ok_%c n=%llu exact=%llu absent=%llu wrong=%llu err=%llu\n",
			nf_tag[p], k[p][0], k[p][1], k[p][2], k[p][3], k[p][4]);
	dprintf(a->fd, "new n=%d ok=%llu max_ms=%llu\nend\n", NF_NEW_KEYS, new_ok, max_ms);
	free(want);
	free(got);
	return 0;
}

/* ---- the supervisor's side: it never opens an RDMA device ---- */

struct nf_child {
	const char *role;
	pid_t pid;
	int to, from, status, hung;
	char *out; /* everything it reported */
	size_t len, cap;
};

/* fork + exec of this binary as worker `role`: commands to its stdin (to),
 * reports from its FD (from). */
static int nf_spawn(struct nf_child *ch, const char *role, const struct hkvserver *s)
{
	char exe[4096], fds[16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int in[2], rep[2];

	memset(ch, 0, sizeof(*ch));
	ch->role = role;
	ch->to = ch->from = -1;
	if (n <= 0 || pipe2(in, O_CLOEXEC))
		return -1;
	if (pipe2(rep, O_CLOEXEC)) {
		close(in[0]);
		close(in[1]);
		return -1;
	}
	exe[n] = 0;
	snprintf(fds, sizeof(fds), "%d", rep[1]);
	fflush(NULL);
	ch->pid = fork();
	if (ch->pid == 0) {
		const char *argv[] = {exe, "worker", role, s->uri, s->token_file, "0", "0", fds,
				      NULL};

		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		if (dup2(in[0], 0) < 0)
			_exit(126);
		fcntl(rep[1], F_SETFD, 0);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(rep[1]);
	if (ch->pid < 0) {
		close(in[1]);
		close(rep[0]);
		return -1;
	}
	ch->to = in[1];
	ch->from = rep[0];
	return 0;
}

/* Everything the child reports until it closes its end (or timeout_ms); 0 at EOF. */
static int nf_collect(struct nf_child *ch, int timeout_ms)
{
	uint64_t end = now_ms() + (uint64_t)timeout_ms;

	while (ch->from >= 0 && now_ms() < end) {
		struct pollfd p = {.fd = ch->from, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		if (ch->cap - ch->len < 4096) {
			char *b = realloc(ch->out, ch->cap * 2 + 65536);

			if (!b)
				abort();
			ch->out = b;
			ch->cap = ch->cap * 2 + 65536;
		}
		n = read(ch->from, ch->out + ch->len, ch->cap - ch->len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			close(ch->from);
			ch->from = -1;
			break;
		}
		ch->len += (size_t)n;
		ch->out[ch->len] = 0;
	}
	return ch->from < 0 ? 0 : -1;
}

/* Reap the child (SIGKILL after timeout_ms); 1 if it exited with status 0. */
static int nf_reap(struct nf_child *ch, int timeout_ms)
{
	uint64_t end = now_ms() + (uint64_t)timeout_ms;

	if (ch->to >= 0)
		close(ch->to);
	ch->to = -1;
	while (ch->pid > 0 && waitpid(ch->pid, &ch->status, WNOHANG) != ch->pid) {
		if (now_ms() > end) {
			fprintf(stderr, "netdev flap: %s child still running after %d ms; killed\n",
				ch->role, timeout_ms);
			ch->hung = 1;
			kill(ch->pid, SIGKILL);
			waitpid(ch->pid, &ch->status, 0);
			break;
		}
		sleep_ms(20);
	}
	ch->pid = 0;
	if (ch->from >= 0)
		close(ch->from);
	ch->from = -1;
	if (ch->hung)
		return 0;
	if (WIFSIGNALED(ch->status))
		fprintf(stderr, "netdev flap: %s child killed by signal %d (%s)\n", ch->role,
			WTERMSIG(ch->status), strsignal(WTERMSIG(ch->status)));
	else if (WEXITSTATUS(ch->status))
		fprintf(stderr, "netdev flap: %s child failed: exit status %d\n", ch->role,
			WEXITSTATUS(ch->status));
	return WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == 0;
}

/* The line of out that starts with `head` (a word), or NULL. */
static const char *nf_line(const char *out, const char *head)
{
	size_t n = strlen(head);

	for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, head, n) && (p[n] == ' ' || p[n] == '\n'))
			return p;
	return NULL;
}

/* The value of name=... in the line of out that starts with `head`; 0 if absent. */
static long long nf_val(const char *out, const char *head, const char *name)
{
	const char *p = nf_line(out, head), *eol;
	size_t n = strlen(name);

	if (!p)
		return 0;
	eol = strchr(p, '\n');
	for (p = strchr(p, ' '); p && (!eol || p < eol); p = strchr(p + 1, ' '))
		if (!strncmp(p + 1, name, n) && p[n + 1] == '=')
			return strtoll(p + n + 2, NULL, 10);
	return 0;
}

/* Processes with an open /dev/infiniband/uverbs* ("pid (comm)" into out); their count. */
static int nf_rdma_holders(char *out, size_t cap)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;
	size_t used = 0;

	out[0] = 0;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char path[64], link[300], comm[64] = "?";
		DIR *fdd;
		struct dirent *fe;
		int held = 0, pid;
		FILE *f;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		pid = atoi(e->d_name);
		snprintf(path, sizeof(path), "/proc/%d/fd", pid);
		if (!(fdd = opendir(path)))
			continue;
		while (!held && (fe = readdir(fdd))) {
			ssize_t l;

			if (fe->d_name[0] < '0' || fe->d_name[0] > '9')
				continue;
			snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, atoi(fe->d_name));
			l = readlink(path, link, sizeof(link) - 1);
			if (l > 0) {
				link[l] = 0;
				held = !strncmp(link, "/dev/infiniband/uverbs", 22);
			}
		}
		closedir(fdd);
		if (!held)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/comm", pid);
		if ((f = fopen(path, "r"))) {
			if (fgets(comm, sizeof(comm), f))
				comm[strcspn(comm, "\n")] = 0;
			fclose(f);
		}
		n++;
		if (used < cap)
			used += (size_t)snprintf(out + used, cap - used, "%s%d (%s)", n > 1 ? ", " : "",
						 pid, comm);
	}
	closedir(d);
	return n;
}

/* Run `sh -c script dev netdev cidr` (stdout and stderr: ours); its exit status, -1 if
 * it could not run or ran past timeout_ms (then killed). */
static int nf_sh(const char *script, const char *rdev, const char *dev, const char *cidr,
		 int timeout_ms)
{
	const char *argv[] = {"/bin/sh", "-c", script, rdev, dev, cidr, NULL};
	extern char **environ;
	uint64_t end = now_ms() + (uint64_t)timeout_ms;
	int status;
	pid_t pid;

	fflush(NULL);
	if (posix_spawn(&pid, "/bin/sh", NULL, NULL, (char *const *)argv, environ))
		return -1;
	while (waitpid(pid, &status, WNOHANG) != pid) {
		if (now_ms() > end) {
			fprintf(stderr, "netdev flap: `%s` still running after %d ms; killed\n",
				script, timeout_ms);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -1;
		}
		sleep_ms(20);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Is rdev an rxe device on netdev dev? */
static int nf_is_rxe_on(const char *rdev, const char *dev)
{
	char path[256], desc[64] = "", parent[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/node_desc", rdev);
	if ((f = fopen(path, "r"))) {
		if (!fgets(desc, sizeof(desc), f))
			desc[0] = 0;
		fclose(f);
	}
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/parent", rdev);
	if ((f = fopen(path, "r"))) {
		if (!fgets(parent, sizeof(parent), f))
			parent[0] = 0;
		fclose(f);
	}
	desc[strcspn(desc, "\n")] = 0;
	parent[strcspn(parent, "\n")] = 0;
	return !strcmp(desc, "rxe") && !strcmp(parent, dev);
}

/*
 * Make the rxe device again once nobody holds it: delete, add on the same
 * netdev, the address back if it went, wait for link, address and port
 * ACTIVE. 0, or -1 (why on stderr). *ms: how long it took.
 */
static int nf_remake_device(const char *rdev, const char *dev, const char *cidr, uint64_t *ms)
{
	static const char script[] =
		"rdma link delete \"$0\" || exit 1; "
		"rdma link add \"$0\" type rxe netdev \"$1\" || exit 2; "
		"ip -o -4 addr show dev \"$1\" | grep -q \" inet $2 \" || ip addr add \"$2\" dev \"$1\"";
	char holders[512];
	uint64_t t0 = now_ms();
	int n, ret;

	/* the children are reaped and the server killed; their device files close on exit */
	while ((n = nf_rdma_holders(holders, sizeof(holders))) != 0 && now_ms() - t0 < 10000)
		sleep_ms(100);
	if (n) {
		fprintf(stderr, "netdev flap: %s still held by %s; not deleting it\n", rdev,
			n < 0 ? "(cannot read /proc)" : holders);
		return -1;
	}
	ret = nf_sh(script, rdev, dev, cidr, 60000);
	if (ret) {
		fprintf(stderr, "netdev flap: making %s again failed (step %d)\n", rdev, ret);
		return -1;
	}
	while (!nd_path_ready(dev, cidr) && now_ms() - t0 < 60000)
		sleep_ms(50);
	*ms = now_ms() - t0;
	if (!nd_path_ready(dev, cidr) || !nf_is_rxe_on(rdev, dev)) {
		fprintf(stderr, "netdev flap: %s made again, but the path is not ready\n", rdev);
		return -1;
	}
	return 0;
}

/* Send the loaded child a command: "WORD T" with T = now (CLOCK_MONOTONIC ms). */
static void nf_tell(struct nf_child *ch, const char *word)
{
	dprintf(ch->to, "%s %llu\n", word, (unsigned long long)now_ms());
}

static void nf_print_load(const char *out, uint64_t down, uint64_t up, int *codes_ok)
{
	static const char *const ph[] = {"b", "g", "d", "a"};
	const char *p;

	printf("# netdev flap: the loaded client: %lld ops (%lld ok); the fault started at %.2f s "
	       "of its loop (`ip link set down` returned %llu ms later), the link was up again "
	       "at %.2f s (%llu ms after the fault started)\n",
	       nf_val(out, "loop", "ops"), nf_val(out, "loop", "ok"),
	       nf_val(out, "loop", "fault_at") / 1000.0, (unsigned long long)down,
	       nf_val(out, "loop", "up_at") / 1000.0, (unsigned long long)up);
	for (int i = 0; i < 4; i++) {
		char o[8], k[8];

		snprintf(o, sizeof(o), "ops_%s", ph[i]);
		snprintf(k, sizeof(k), "ok_%s", ph[i]);
		printf("#   %s: %lld ops, %lld ok\n", nf_phase_name[i + 1], nf_val(out, "phases", o),
		       nf_val(out, "phases", k));
	}
	if (nf_val(out, "loop", "first_err_at"))
		printf("#   first error %s at %.3f s, that op waited %lld ms\n",
		       hkv_code_name((int)nf_val(out, "loop", "first_err")),
		       nf_val(out, "loop", "first_err_at") / 1000.0,
		       nf_val(out, "loop", "first_err_ms"));
	printf("#   longest op %lld ms (started at %.3f s, %s), longest while down %lld ms; "
	       "timeout %d ms\n",
	       nf_val(out, "loop", "max_ms"), nf_val(out, "loop", "max_at") / 1000.0,
	       hkv_code_name((int)nf_val(out, "loop", "max_ret")),
	       nf_val(out, "loop", "max_down_ms"), ND_TIMEOUT_MS);
	*codes_ok = 1;
	for (p = nf_line(out, "code"); p; p = nf_line(strchr(p, '\n') ?: "", "code")) {
		int code = 0;
		unsigned long long n = 0;

		sscanf(p, "code %d %llu", &code, &n);
		printf("#   error %s (%d): %llu ops\n", hkv_code_name(code), code, n);
		*codes_ok &= nd_error_ok(code);
	}
	printf("#   wrong values %lld, stored keys reported absent %lld\n",
	       nf_val(out, "loop", "bad"), nf_val(out, "loop", "miss"));
}

/* The "k"/"f" lines of the loaded child's report, to the reader's stdin. */
static int nf_forward_sets(const char *out, int fd)
{
	for (const char *p = out; *p;) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p + 1) : strlen(p);

		if ((p[0] == 'k' || p[0] == 'f') && p[1] == ' ' && write_full(fd, p, n))
			return -1;
		p += n;
	}
	return 0;
}

static void test_netdev_flap(void)
{
	const char *rdev = getenv("HKV_RDMA_DEV");
	struct nf_child ld = {.to = -1, .from = -1}, rd = {.to = -1, .from = -1};
	struct hkvserver s;
	char dev[64], cidr[64], file[128], holders[256];
	const char *extra[] = {"--memory-file", file, NULL};
	uint64_t t0, fault_t, down = 0, up = 0, remake_ms = 0, t;
	int fd = -1, status = 0, fault_ok = 0, ready = 0, ld_ok, ld_done, rd_ok = 0, rd_done = 0,
	    remade = 0, restarted = 0, codes_ok = 0, sets_ok = 0, sets_failed = 0, self_held;
	pid_t fpid;

	if (!use_verbs) {
		printf("# netdev flap: verbs only (shm has no network device); nothing to do\n");
		return;
	}
	if (!rdev) {
		printf("# netdev flap: HKV_RDMA_DEV names no device to flap; nothing to do (run "
		       "through scripts/softroce-run)\n");
		return;
	}
	CHECK(nd_find_netdev(dev, sizeof(dev), cidr, sizeof(cidr)) == 0);
	if (!nd_is_dummy(dev) || !nf_is_rxe_on(rdev, dev) || geteuid() != 0) {
		printf("# netdev flap: needs root and an rxe device on a dummy netdev (%s on %s): "
		       "it takes the link down and makes the device again; run through "
		       "scripts/softroce-run\n", rdev, dev);
		return;
	}
	/* the whole point: this process holds no RDMA device, ever */
	self_held = nf_rdma_holders(holders, sizeof(holders));
	CHECK(self_held == 0);
	printf("# netdev flap: %s under %s holds %s; down for %d ms under load, then %s made "
	       "again and the server restarted on its memory file\n",
	       dev, rdev, cidr, ND_HOLD_MS, rdev);
	signal(SIGPIPE, SIG_IGN);
	snprintf(file, sizeof(file), "/tmp/hkv-netflap-%d.region", (int)getpid());
	hkv_test_unlink_region(file);
	CHECK(hkvserver_start_noclient(&s, 1, "16M", "64K", extra) == 0);
	if (nf_spawn(&ld, "flap-load", &s) || nd_wait_word(ld.from, "ready", 120000)) {
		fprintf(stderr, "netdev flap: the loaded client did not get ready\n");
		nf_reap(&ld, 1000);
		hkvserver_stop(&s);
		hkv_test_unlink_region(file);
		CHECK(0);
	}

	/* 1. the flap under load */
	t0 = now_ms();
	sleep_ms(1500);
	fault_t = now_ms();
	nf_tell(&ld, "fault");
	fpid = nd_start_fault(dev, cidr, ND_HOLD_MS, &fd);
	fault_ok = fpid > 0 && nd_wait_word(fd, "down", 10000) == 0;
	down = now_ms() - fault_t;
	nf_tell(&ld, "down");
	if (fpid > 0) {
		fault_ok &= nd_wait_word(fd, "up", ND_HOLD_MS + 30000) == 0;
		up = now_ms() - fault_t;
		nf_tell(&ld, "up");
		waitpid(fpid, &status, 0);
		close(fd);
	}
	t = now_ms();
	while (!(ready = nd_path_ready(dev, cidr)) && now_ms() - t < 10000)
		sleep_ms(50);
	sleep_ms(2000); /* the old handle keeps going with the link up */
	dprintf(ld.to, "stop\n");
	ld_done = nf_collect(&ld, 60000) == 0;
	ld_ok = nf_reap(&ld, 5000);
	ld_done &= ld.out && nf_line(ld.out, "end") != NULL;
	printf("# netdev flap: loaded client stopped %.1f s after its loop began; link, "
	       "address and port %s\n", (now_ms() - t0) / 1000.0,
	       ready ? "ready again" : "NOT ready");
	if (ld_done) {
		nf_print_load(ld.out, down, up, &codes_ok);
		for (const char *p = ld.out; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
			sets_ok += p[0] == 'k' && p[1] == ' ';
			sets_failed += p[0] == 'f' && p[1] == ' ';
		}
	}

	/* 2. nobody holds the device: kill the server, make rxe0 again */
	hkvserver_kill(&s);
	remade = nf_remake_device(rdev, dev, cidr, &remake_ms) == 0;
	printf("# netdev flap: %s deleted and added again on %s: %s in %llu ms\n", rdev, dev,
	       remade ? "link, address and port ACTIVE" : "FAILED",
	       (unsigned long long)remake_ms);

	/* 3. warm restart, a fresh reader reads every set back */
	if (remade)
		restarted = hkvserver_restart_noclient(&s, "16M", "64K", extra) == 0;
	if (restarted && ld_done && nf_spawn(&rd, "flap-read", &s) == 0) {
		if (nf_forward_sets(ld.out, rd.to))
			fprintf(stderr, "netdev flap: could not hand the reader its keys\n");
		close(rd.to);
		rd.to = -1;
		rd_done = nf_collect(&rd, 300000) == 0;
		rd_ok = nf_reap(&rd, 5000);
		rd_done &= rd.out && nf_line(rd.out, "end") != NULL;
	}
	if (rd_done) {
		printf("# netdev flap: a new handle after the warm restart: %s in %lld ms (%lld "
		       "tries)\n", hkv_code_name((int)nf_val(rd.out, "open", "ret")),
		       nf_val(rd.out, "open", "ms"), nf_val(rd.out, "open", "tries"));
		for (int p = 0; p < NF_NPHASES; p++) {
			char head[8];

			snprintf(head, sizeof(head), "ok_%c", nf_tag[p]);
			printf("#   sets that returned ok %s: %lld/%lld read back exact (%lld absent, "
			       "%lld wrong, %lld errors)\n", nf_phase_name[p],
			       nf_val(rd.out, head, "exact"), nf_val(rd.out, head, "n"),
			       nf_val(rd.out, head, "absent"), nf_val(rd.out, head, "wrong"),
			       nf_val(rd.out, head, "err"));
		}
		printf("#   sets that failed: %lld (%lld absent, %lld stored whole, %lld wrong, %lld "
		       "errors); new sets after the restart: %lld/%lld read back; longest get %lld "
		       "ms\n", nf_val(rd.out, "failed", "n"), nf_val(rd.out, "failed", "absent"),
		       nf_val(rd.out, "failed", "whole"), nf_val(rd.out, "failed", "wrong"),
		       nf_val(rd.out, "failed", "err"), nf_val(rd.out, "new", "ok"),
		       nf_val(rd.out, "new", "n"), nf_val(rd.out, "new", "max_ms"));
	}
	hkvserver_stop(&s);
	hkv_test_unlink_region(file);

	CHECK(fault_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(ready);
	CHECK(ld_ok && ld_done);
	CHECK(nf_val(ld.out, "mismatch", "n") == 0);
	CHECK(nf_val(ld.out, "loop", "ops_before") > 0 &&
	      nf_val(ld.out, "loop", "err_before") == 0);
	CHECK(nf_val(ld.out, "phases", "ops_d") > 0);         /* operations while it was down */
	CHECK(nf_val(ld.out, "loop", "first_err_at") > 0);    /* the fault did cut the path */
	CHECK(nf_val(ld.out, "loop", "bad") == 0 && nf_val(ld.out, "loop", "miss") == 0);
	CHECK(codes_ok);                                      /* lost-path errors only */
	CHECK(nf_val(ld.out, "loop", "max_ms") <= ND_TIMEOUT_MS + ND_MARGIN_MS); /* no hang */
	CHECK(sets_ok + sets_failed == ND_KEYS + nf_val(ld.out, "loop", "nsets"));
	CHECK(sets_ok > ND_KEYS);
	CHECK(remade);
	CHECK(restarted);
	CHECK(rd_ok && rd_done);
	CHECK(nf_val(rd.out, "open", "ret") == 0);
	/* data lost: none. Every set that returned ok reads back exact. */
	for (int p = 0; p < NF_NPHASES; p++) {
		char head[8];

		snprintf(head, sizeof(head), "ok_%c", nf_tag[p]);
		CHECK(nf_val(rd.out, head, "exact") == nf_val(rd.out, head, "n"));
	}
	{
		long long exact = 0;

		for (int p = 0; p < NF_NPHASES; p++) {
			char head[8];

			snprintf(head, sizeof(head), "ok_%c", nf_tag[p]);
			exact += nf_val(rd.out, head, "exact");
		}
		CHECK(exact == sets_ok);
	}
	CHECK(nf_val(rd.out, "failed", "n") == sets_failed);
	CHECK(nf_val(rd.out, "failed", "wrong") == 0 && nf_val(rd.out, "failed", "err") == 0);
	CHECK(nf_val(rd.out, "new", "ok") == NF_NEW_KEYS);
	free(ld.out);
	free(rd.out);
}

/* `test_faults verbs netdev-flap`: only test_netdev_flap, in a process that opens no
 * RDMA device (hkvserver_want_verbs' skip check reads sysfs, not libibverbs). */
static int netdev_flap_main(void)
{
	RUN_TEST(test_netdev_flap);
	return hkv_test_finish();
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "worker"))
		return worker_main(argc, argv);
	use_verbs = hkvserver_want_verbs(argc, argv);
	if (argc > 2 && !strcmp(argv[2], "netdev-flap"))
		return netdev_flap_main();
	if (use_verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	/* The netdev tests can leave rdma_cm over the device dead for every
	 * later test (see above test_netdev_down): on verbs each runs alone,
	 * in a guest of its own (ctest netdev_down_verbs, netdev_flap_verbs) */
	if (argc > 2 && !strcmp(argv[2], "netdev-down")) {
		RUN_TEST(test_netdev_down);
		return hkv_test_finish();
	}
	/*
	 * Layout 3 (shared per-class pools, server-written segment table):
	 * changed: test_windows (three base rkeys, WRITE over the data area
	 * only, no per-segment GRANT, read-only client), test_sigkill_writer
	 * (free bits back by the sweep instead of orphaned segments),
	 * test_unpublished_reclaimed (unpublished blocks come back at a warm
	 * restart, not by adoption); removed: test_segment_theft (no
	 * per-segment windows, no owners: a client's CAS on the table is
	 * test_garbage_table's garbage); unchanged: test_vanished_client,
	 * test_grant_stall (the base GRANT still exists); new:
	 * test_garbage_table, test_holder_killed, test_stray_bits.
	 */
	RUN_TEST(test_windows);
	RUN_TEST(test_garbage);
	RUN_TEST(test_garbage_table);
	RUN_TEST(test_garbage_header);
	RUN_TEST(test_sigkill_writer);
	RUN_TEST(test_holder_killed);
	RUN_TEST(test_claimer_killed);
	RUN_TEST(test_stray_bits);
	RUN_TEST(test_abandoned_insert);
	RUN_TEST(test_abort_dies);
	RUN_TEST(test_hello_and_go);
	RUN_TEST(test_fd_exhaustion);
	RUN_TEST(test_metrics_flood);
	RUN_TEST(test_admission_flood);
	RUN_TEST(test_secret_files);
	RUN_TEST(test_shm_region_rights);
	RUN_TEST(test_socket_squatter);
	RUN_TEST(test_impostor);
	RUN_TEST(test_request_proof);
	RUN_TEST(test_grant_stall);
	RUN_TEST(test_unpublished_reclaimed);
	RUN_TEST(test_move_takes_leftovers);
	RUN_TEST(test_server_atomics);
	RUN_TEST(test_move_spares_live_writer);
	RUN_TEST(test_vanished_client);
	if (!use_verbs)
		RUN_TEST(test_netdev_down);
	return hkv_test_finish();
}
