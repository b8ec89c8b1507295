/*
 * test_transport.c - one conformance suite for every transport backend.
 *
 *   test_transport shm     (unit tier, host)
 *   test_transport verbs   (rdma tier, Soft-RoCE guest; skips without a device)
 *
 * A server child (tests/support/rawserve) exposes a zeroed region; this
 * process connects and checks what a user of the transport relies on: data
 * moved exactly at any size and alignment, CAS/FAA results, ordering within a
 * chain, error completions for bad rkeys / bounds / alignment (and that the
 * connection then stays failed), rejected hellos, a server that vanishes in
 * the middle of a batch, and exact sums of concurrent atomic increments from
 * many threads and two processes.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/transport.h"
#include "common/transport_int.h"
#include "tests/hkv_test.h"
#include "tests/support/rawserve.h"

HKV_TEST_MAIN_DEFS;

#define REGION_SIZE (4u << 20)
#define MAX_IO      (1u << 20)

static enum hkv_transport_kind kind;
static struct rawserve server;

struct client {
	struct hkv_conn *conn;
	uint8_t *buf; /* 2 * MAX_IO + 64: scratch, registered */
	struct hkv_mr *mr;
	uint64_t base;
	uint32_t rkey;
};

static int client_open(struct client *cl)
{
	struct hkv_conn_cfg cfg;
	char reply[64] = {0};
	size_t rlen = sizeof(reply);

	rawserve_conn_cfg(&server, &cfg);
	memset(cl, 0, sizeof(*cl));
	cl->conn = hkv_conn_open(&cfg, reply, &rlen);
	if (!cl->conn) {
		fprintf(stderr, "connect: %s\n", hkv_strerror(-errno));
		return -1;
	}
	if (rlen != sizeof(RAWSERVE_REPLY) || strcmp(reply, RAWSERVE_REPLY)) {
		fprintf(stderr, "connect: unexpected reply blob\n");
		return -1;
	}
	cl->buf = aligned_alloc(4096, 2 * MAX_IO + 4096);
	cl->mr = hkv_conn_reg(cl->conn, cl->buf, 2 * MAX_IO + 4096);
	cl->base = hkv_conn_region(cl->conn)->base;
	cl->rkey = hkv_conn_region(cl->conn)->rkey;
	return cl->mr ? 0 : -1;
}

static void client_close(struct client *cl)
{
	if (cl->conn) {
		hkv_conn_dereg(cl->conn, cl->mr);
		hkv_conn_close(cl->conn);
	}
	free(cl->buf);
	memset(cl, 0, sizeof(*cl));
}

static struct hkv_wr wr_rw(struct client *cl, int op, void *local, uint64_t off, uint32_t len)
{
	return (struct hkv_wr){.opcode = (uint8_t)op, .local = local, .mr = cl->mr,
			       .remote_addr = cl->base + off, .rkey = cl->rkey, .length = len};
}

static struct hkv_wr wr_atomic(struct client *cl, int op, uint64_t *res, uint64_t off,
			       uint64_t cmp_add, uint64_t swap)
{
	return (struct hkv_wr){.opcode = (uint8_t)op, .local = res, .mr = cl->mr,
			       .remote_addr = cl->base + off, .rkey = cl->rkey,
			       .compare_add = cmp_add, .swap = swap};
}

static int do_rw(struct client *cl, int op, void *local, uint64_t off, uint32_t len)
{
	struct hkv_wr wr = wr_rw(cl, op, local, off, len);

	return hkv_conn_exec(cl->conn, &wr, 1);
}

static int do_atomic(struct client *cl, int op, uint64_t off, uint64_t a, uint64_t b,
		     uint64_t *old)
{
	uint64_t *res = (uint64_t *)(cl->buf + 2 * MAX_IO);
	struct hkv_wr wr = wr_atomic(cl, op, res, off, a, b);
	int ret = hkv_conn_exec(cl->conn, &wr, 1);

	*old = *res;
	return ret;
}

static void test_read_write_sizes(void)
{
	static const uint32_t sizes[] = {1, 2, 7, 8, 63, 64, 65, 100, 1000, 4095, 4096, 4097,
					 65537, 300000, MAX_IO};
	static const uint32_t offs[] = {0, 1, 3, 13, 4093};
	struct client cl;

	CHECK(client_open(&cl) == 0);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
			uint8_t *out = cl.buf, *in = cl.buf + MAX_IO;
			uint32_t len = sizes[s];
			uint64_t off = offs[o] + (uint64_t)(s % 3) * MAX_IO;

			for (uint32_t i = 0; i < len; i++)
				out[i] = (uint8_t)(i * 31 + s * 7 + o);
			memset(in, 0xee, len);
			CHECK_RC(do_rw(&cl, HKV_WR_WRITE, out, off, len), 0);
			CHECK_RC(do_rw(&cl, HKV_WR_READ, in, off, len), 0);
			CHECK(memcmp(in, out, len) == 0);
		}
	}
	/* An unregistered source works for a small (inline) write. */
	{
		char small[16] = "inline-write!!";
		struct hkv_wr wr = wr_rw(&cl, HKV_WR_WRITE, small, 8192, sizeof(small));

		wr.mr = NULL;
		CHECK_RC(hkv_conn_exec(cl.conn, &wr, 1), 0);
		CHECK_RC(do_rw(&cl, HKV_WR_READ, cl.buf, 8192, sizeof(small)), 0);
		CHECK(memcmp(cl.buf, small, sizeof(small)) == 0);
	}
	client_close(&cl);
}

static void test_cas_faa(void)
{
	struct client cl;
	uint64_t old, v = 0x1111222233334444ull;

	CHECK(client_open(&cl) == 0);
	memcpy(cl.buf, &v, 8);
	CHECK_RC(do_rw(&cl, HKV_WR_WRITE, cl.buf, 4096, 8), 0);
	/* success: returns the old value and swaps */
	CHECK_RC(do_atomic(&cl, HKV_WR_CAS, 4096, v, 42, &old), 0);
	CHECK(old == v);
	/* failure: returns the current value and leaves it */
	CHECK_RC(do_atomic(&cl, HKV_WR_CAS, 4096, v, 7, &old), 0);
	CHECK(old == 42);
	CHECK_RC(do_rw(&cl, HKV_WR_READ, cl.buf, 4096, 8), 0);
	memcpy(&v, cl.buf, 8);
	CHECK(v == 42);
	/* FAA returns the old value; wraps modulo 2^64 */
	CHECK_RC(do_atomic(&cl, HKV_WR_FAA, 4096, 8, 0, &old), 0);
	CHECK(old == 42);
	CHECK_RC(do_atomic(&cl, HKV_WR_FAA, 4096, (uint64_t)-50, 0, &old), 0);
	CHECK(old == 50);
	CHECK_RC(do_atomic(&cl, HKV_WR_FAA, 4096, 0, 0, &old), 0);
	CHECK(old == 0);
	client_close(&cl);
}

static void test_mixed_chain(void)
{
	struct client cl;
	struct hkv_wr wrs[6];
	uint64_t *res, v;
	uint8_t *data, *back, *back2;

	CHECK(client_open(&cl) == 0);
	res = (uint64_t *)(cl.buf + 2 * MAX_IO);
	data = cl.buf;
	back = cl.buf + 4096;
	back2 = cl.buf + 8192;
	memset(data, 0x5a, 2048);
	v = 100;
	memcpy(data + 2048, &v, 8);
	/* WRITE block, WRITE word, CAS word, FAA word, READ block, READ word: one doorbell */
	wrs[0] = wr_rw(&cl, HKV_WR_WRITE, data, 65536, 2048);
	wrs[1] = wr_rw(&cl, HKV_WR_WRITE, data + 2048, 128, 8);
	wrs[2] = wr_atomic(&cl, HKV_WR_CAS, &res[0], 128, 100, 200);
	wrs[3] = wr_atomic(&cl, HKV_WR_FAA, &res[1], 128, 5, 0);
	wrs[4] = wr_rw(&cl, HKV_WR_READ, back, 65536, 2048);
	wrs[5] = wr_rw(&cl, HKV_WR_READ, back2, 128, 8);
	wrs[2].flags = HKV_WR_F_SIGNALED; /* a signaled WR in mid-chain is also waited for */
	{
		struct hkv_conn_stats before = cl.conn->stats;

		CHECK_RC(hkv_conn_exec(cl.conn, wrs, 6), 0);
		CHECK(cl.conn->stats.round_trips == before.round_trips + 1);
		CHECK(cl.conn->stats.posts == before.posts + 1);
		CHECK(cl.conn->stats.wrs[HKV_WR_WRITE] == before.wrs[HKV_WR_WRITE] + 2);
		CHECK(cl.conn->stats.wrs[HKV_WR_READ] == before.wrs[HKV_WR_READ] + 2);
		CHECK(cl.conn->stats.bytes_read == before.bytes_read + 2048 + 8 + 16);
		CHECK(cl.conn->stats.bytes_written == before.bytes_written + 2048 + 8 + 16);
	}
	CHECK(res[0] == 100);
	CHECK(res[1] == 200);
	CHECK(memcmp(back, data, 2048) == 0);
	memcpy(&v, back2, 8);
	CHECK(v == 205);
	/* async interface: post two chains, then poll their completions */
	wrs[0] = wr_rw(&cl, HKV_WR_READ, back, 65536, 64);
	wrs[0].wr_id = 11;
	wrs[1] = wr_rw(&cl, HKV_WR_READ, back2, 128, 8);
	wrs[1].wr_id = 12;
	CHECK_RC(hkv_conn_post(cl.conn, &wrs[0], 1), 0);
	CHECK_RC(hkv_conn_post(cl.conn, &wrs[1], 1), 0);
	{
		struct hkv_wc wc[2];

		CHECK_RC(hkv_conn_wait(cl.conn, wc, 2), 0);
		CHECK(wc[0].wr_id == 11 && wc[1].wr_id == 12);
		CHECK(wc[0].opcode == HKV_WR_READ && wc[0].status == 0);
	}
	client_close(&cl);
}

/* An error completion leaves the connection failed; a new one works. */
static void expect_error(int op, uint64_t off_delta, uint32_t rkey_xor, uint32_t len,
			 int want1, int want2)
{
	struct client cl;
	struct hkv_wr wr;
	int ret;

	CHECK(client_open(&cl) == 0);
	if (op >= HKV_WR_CAS)
		wr = wr_atomic(&cl, op, (uint64_t *)cl.buf, 0, 0, 1);
	else
		wr = wr_rw(&cl, op, cl.buf, 0, len);
	wr.remote_addr += off_delta;
	wr.rkey ^= rkey_xor;
	ret = hkv_conn_exec(cl.conn, &wr, 1);
	if (ret != want1 && ret != want2)
		fprintf(stderr, "got %d (%s)\n", ret, hkv_strerror(ret));
	CHECK(ret == want1 || ret == want2);
	/* the connection is now in the error state, like a QP in ERR */
	wr = wr_rw(&cl, HKV_WR_READ, cl.buf, 0, 8);
	CHECK(hkv_conn_exec(cl.conn, &wr, 1) < 0);
	client_close(&cl);
	CHECK(client_open(&cl) == 0);
	wr = wr_rw(&cl, HKV_WR_READ, cl.buf, 0, 8);
	CHECK_RC(hkv_conn_exec(cl.conn, &wr, 1), 0);
	client_close(&cl);
}

static void test_remote_errors(void)
{
	int before = hkv_test_failures;

	/* past the end, straddling the end, below the base */
	expect_error(HKV_WR_READ, REGION_SIZE, 0, 8, HKV_EREMOTE_ACCESS, HKV_EREMOTE_ACCESS);
	expect_error(HKV_WR_WRITE, REGION_SIZE - 4, 0, 8, HKV_EREMOTE_ACCESS, HKV_EREMOTE_ACCESS);
	expect_error(HKV_WR_READ, (uint64_t)-4096, 0, 8, HKV_EREMOTE_ACCESS, HKV_EREMOTE_ACCESS);
	/* wrong rkey */
	expect_error(HKV_WR_READ, 0, 0x5a5a, 8, HKV_EREMOTE_ACCESS, HKV_EREMOTE_ACCESS);
	expect_error(HKV_WR_CAS, 0, 0x1, 8, HKV_EREMOTE_ACCESS, HKV_EREMOTE_ACCESS);
	if (hkv_test_failures != before)
		return;
	/* a misaligned atomic is refused at post time; the connection stays usable */
	{
		struct client cl;
		struct hkv_wr wr;

		CHECK(client_open(&cl) == 0);
		wr = wr_atomic(&cl, HKV_WR_FAA, (uint64_t *)cl.buf, 4, 1, 0);
		CHECK_RC(hkv_conn_exec(cl.conn, &wr, 1), -EINVAL);
		wr = wr_rw(&cl, HKV_WR_READ, cl.buf, 0, 8);
		CHECK_RC(hkv_conn_exec(cl.conn, &wr, 1), 0);
		client_close(&cl);
	}
	/* errors in mid-chain: what follows is flushed, the call reports the error */
	{
		struct client cl;
		struct hkv_wr wrs[3];

		CHECK(client_open(&cl) == 0);
		wrs[0] = wr_rw(&cl, HKV_WR_READ, cl.buf, 0, 8);
		wrs[1] = wr_rw(&cl, HKV_WR_READ, cl.buf, REGION_SIZE, 8);
		wrs[2] = wr_rw(&cl, HKV_WR_READ, cl.buf, 0, 8);
		CHECK(hkv_conn_exec(cl.conn, wrs, 3) == HKV_EREMOTE_ACCESS);
		client_close(&cl);
	}
}

static void test_rejected_hello(void)
{
	static const uint8_t zero[sizeof(struct hkv_accept_msg)];
	struct hkv_accept_msg acc;
	struct hkv_conn_cfg cfg;
	struct hkv_conn *c;

	rawserve_conn_cfg(&server, &cfg);
	cfg.hello = "wrong-token";
	cfg.hello_len = strlen("wrong-token");
	c = hkv_conn_open(&cfg, NULL, NULL);
	CHECK(c == NULL);
	CHECK(-errno == HKV_EAUTH);
	/* the refusal carries its status and nothing else: no region address,
	 * length or rkey for a peer that did not authenticate (issue 12) */
	memset(&acc, 0xa5, sizeof(acc));
	cfg.timeout_ms = 5000;
	cfg.sq_depth = 16;
	c = kind == HKV_TRANSPORT_SHM ? hkv_shm_conn_open(&cfg, &acc)
				      : hkv_verbs_conn_open(&cfg, &acc);
	CHECK(c == NULL);
	printf("# refusal: magic %08x status %d, region base %llx length %llu rkey %u\n",
	       acc.magic, acc.status, (unsigned long long)acc.region.base,
	       (unsigned long long)acc.region.length, acc.region.rkey);
	CHECK(acc.magic == HKV_CONN_MAGIC && acc.status == HKV_EAUTH);
	CHECK(!memcmp((const uint8_t *)&acc + HKV_REFUSAL_LEN, zero,
		      sizeof(acc) - HKV_REFUSAL_LEN));
	cfg.hello_len = HKV_HELLO_MAX + 1;
	c = hkv_conn_open(&cfg, NULL, NULL);
	CHECK(c == NULL && errno == EINVAL);
}

/* The server dies while the client streams big batches: an error, no hang. */
static void test_peer_vanishes(void)
{
	struct rawserve victim;
	struct hkv_conn_cfg cfg;
	struct hkv_wr wrs[16];
	struct client cl;
	time_t start;
	int ret = 0, rounds = 0;

	CHECK(rawserve_start(&victim, kind, REGION_SIZE) == 0);
	rawserve_conn_cfg(&victim, &cfg);
	cfg.timeout_ms = 3000;
	memset(&cl, 0, sizeof(cl));
	cl.conn = hkv_conn_open(&cfg, NULL, NULL);
	CHECK(cl.conn != NULL);
	cl.buf = aligned_alloc(4096, 2 * MAX_IO + 4096);
	cl.mr = hkv_conn_reg(cl.conn, cl.buf, 2 * MAX_IO + 4096);
	cl.base = hkv_conn_region(cl.conn)->base;
	cl.rkey = hkv_conn_region(cl.conn)->rkey;
	for (int i = 0; i < 16; i++)
		wrs[i] = wr_rw(&cl, i % 2 ? HKV_WR_WRITE : HKV_WR_READ, cl.buf, (uint64_t)i * 65536,
			       65536);
	start = time(NULL);
	while (!ret && time(NULL) - start < 30) {
		if (rounds == 3)
			rawserve_kill(&victim);
		if ((ret = hkv_conn_post(cl.conn, wrs, 16)))
			break;
		ret = hkv_conn_wait(cl.conn, NULL, 1);
		rounds++;
	}
	printf("# peer vanished: error after %d rounds, %ld s: %s\n", rounds,
	       (long)(time(NULL) - start), hkv_strerror(ret));
	CHECK(ret == HKV_EDISCONNECTED || ret == HKV_ETIMEDOUT || ret == HKV_EFLUSHED);
	CHECK(time(NULL) - start < 30);
	CHECK(hkv_conn_post(cl.conn, wrs, 1) < 0); /* stays failed */
	client_close(&cl);
}

#define HAMMER_THREADS 4
#define HAMMER_ITERS   400

/* Each worker adds HAMMER_ITERS to word 0 by read-CAS loops, and to word 8 by FAA. */
static void *hammer(void *arg)
{
	struct client cl;
	uint64_t cur = 0, old;
	long failures = 0;

	if (client_open(&cl))
		return (void *)1;
	for (int i = 0; i < HAMMER_ITERS; i++) {
		for (;;) {
			if (do_atomic(&cl, HKV_WR_CAS, 0, cur, cur + 1, &old)) {
				failures++;
				goto out;
			}
			if (old == cur)
				break;
			cur = old; /* lost the race: retry from what we saw */
		}
		cur++;
		if (do_atomic(&cl, HKV_WR_FAA, 8, 1, 0, &old)) {
			failures++;
			goto out;
		}
	}
out:
	client_close(&cl);
	return (void *)failures;
}

static int hammer_process(void)
{
	pthread_t t[HAMMER_THREADS];
	long bad = 0;

	for (int i = 0; i < HAMMER_THREADS; i++)
		pthread_create(&t[i], NULL, hammer, NULL);
	for (int i = 0; i < HAMMER_THREADS; i++) {
		void *r;

		pthread_join(t[i], &r);
		bad += (long)r;
	}
	return bad ? 1 : 0;
}

/*
 * The second process is a fresh exec of this program ("--hammer"), not a bare
 * fork: librdmacm's inherited device descriptors are unusable in a child.
 */
static pid_t spawn_hammer(void)
{
	char exe[4096], kind_s[4];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	pid_t pid;

	if (n <= 0)
		return -1;
	exe[n] = 0;
	snprintf(kind_s, sizeof(kind_s), "%d", (int)kind);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		execl(exe, exe, "--hammer", kind_s, server.path, server.host, server.port,
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void test_concurrent_increments(void)
{
	struct client cl;
	uint64_t zero[2] = {0, 0}, got[2];
	pid_t child;
	int status, parent_rc;

	CHECK(client_open(&cl) == 0);
	memcpy(cl.buf, zero, 16);
	CHECK_RC(do_rw(&cl, HKV_WR_WRITE, cl.buf, 0, 16), 0);
	client_close(&cl);
	child = spawn_hammer();
	CHECK(child > 0);
	parent_rc = hammer_process();
	CHECK(waitpid(child, &status, 0) == child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(parent_rc == 0);
	CHECK(client_open(&cl) == 0);
	CHECK_RC(do_rw(&cl, HKV_WR_READ, cl.buf, 0, 16), 0);
	memcpy(got, cl.buf, 16);
	printf("# CAS-loop sum %llu, FAA sum %llu, expected %d each\n", (unsigned long long)got[0],
	       (unsigned long long)got[1], 2 * HAMMER_THREADS * HAMMER_ITERS);
	CHECK(got[0] == 2 * HAMMER_THREADS * HAMMER_ITERS);
	CHECK(got[1] == 2 * HAMMER_THREADS * HAMMER_ITERS);
	client_close(&cl);
}

/*
 * Unsignaled work never wedges the send queue (issue 11, item 4): four
 * queues' worth of fire-and-forget FAAs, one post each as the library posts
 * its frees and access-time CASes, then a signaled READ. Each FAA must land,
 * no post may be refused, and the send-queue count must come back. Before
 * the transport signaled such chains now and then, verbs refused every post
 * (-EAGAIN, for ever) once the queue was full; shm counts room the same way.
 */
static void test_unsignaled_floods(void)
{
	uint64_t *res = NULL, got;
	struct client cl;
	int depth, posts, refused = 0;

	CHECK(client_open(&cl) == 0);
	res = (uint64_t *)(cl.buf + 2 * MAX_IO);
	depth = cl.conn->sq_depth;
	posts = 4 * depth + 7;
	CHECK(depth > 0);
	CHECK_RC(do_atomic(&cl, HKV_WR_CAS, 4096, 0, 0, &got), 0); /* read it */
	CHECK_RC(do_atomic(&cl, HKV_WR_CAS, 4096, got, 0, &got), 0); /* zero it */
	for (int i = 0; i < posts; i++) {
		struct hkv_wr wr = wr_atomic(&cl, HKV_WR_FAA, res + 1, 4096, 1, 0);
		int ret;

		wr.flags = HKV_WR_F_NO_COMPLETION;
		ret = hkv_conn_post(cl.conn, &wr, 1);
		refused += ret != 0;
		if (ret && refused == 1)
			fprintf(stderr, "unsignaled post %d of %d refused: %d (%s)\n", i, posts, ret,
				hkv_strerror(ret));
	}
	CHECK(refused == 0);
	CHECK_RC(do_rw(&cl, HKV_WR_READ, cl.buf, 4096, 8), 0);
	memcpy(&got, cl.buf, 8);
	printf("# %d unsignaled FAAs (queue depth %d): counter %llu, %d refused; %d WRs held "
	       "after a signaled READ\n", posts, depth, (unsigned long long)got, refused,
	       cl.conn->sq_used);
	CHECK(got == (uint64_t)posts);
	CHECK(cl.conn->sq_used < depth / 4 + 2); /* at most the last unsignaled run */
	client_close(&cl);
}

int main(int argc, char **argv)
{
	if (argc == 6 && !strcmp(argv[1], "--hammer")) { /* the second process */
		kind = (enum hkv_transport_kind)atoi(argv[2]);
		server.kind = kind;
		snprintf(server.path, sizeof(server.path), "%s", argv[3]);
		snprintf(server.host, sizeof(server.host), "%s", argv[4]);
		snprintf(server.port, sizeof(server.port), "%s", argv[5]);
		return hammer_process();
	}
	if (argc != 2 || !(kind = hkv_transport_parse(argv[1]))) {
		fprintf(stderr, "usage: %s shm|verbs\n", argv[0]);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (kind == HKV_TRANSPORT_VERBS)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	if (rawserve_start(&server, kind, REGION_SIZE)) {
		fprintf(stderr, "cannot start the test server\n");
		return 1;
	}
	printf("# transport %s\n", argv[1]);
	RUN_TEST(test_read_write_sizes);
	RUN_TEST(test_cas_faa);
	RUN_TEST(test_mixed_chain);
	RUN_TEST(test_remote_errors);
	RUN_TEST(test_rejected_hello);
	RUN_TEST(test_concurrent_increments);
	RUN_TEST(test_unsignaled_floods);
	RUN_TEST(test_peer_vanishes);
	rawserve_stop(&server);
	return hkv_test_finish();
}
