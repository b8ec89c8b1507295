/*
 * test_ctl.c - the control plane under bad input, from raw sockets: a wrong
 * token, a wrong protocol version, a wrong magic, an oversized or truncated
 * request, garbage bytes, a silent client. Each is refused (an ERROR reply
 * with the right code, or the connection closed) and the server keeps
 * serving real clients throughout. Then the limits: requests at the body
 * size boundary, a flood of idle and half-sent connections beyond the
 * connection cap, and a flood of wrong tokens against the per-source rate
 * limit.
 *
 *   test_ctl shm|verbs
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/ctl_proto.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "server/ctl.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"

HKV_TEST_MAIN_DEFS;

static struct hkvserver srv;

static int ctl_connect(void)
{
	int fd;

	if (!srv.verbs) {
		struct sockaddr_un sun = {.sun_family = AF_UNIX};

		if (strlen(srv.uri + 4) >= sizeof(sun.sun_path))
			return -1;
		memcpy(sun.sun_path, srv.uri + 4, strlen(srv.uri + 4) + 1);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0)
			return fd;
	} else {
		struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
		char host[64];
		const char *h = srv.uri + 8, *colon = strrchr(h, ':');

		snprintf(host, sizeof(host), "%.*s", (int)(colon - h), h);
		if (getaddrinfo(host, srv.port, &hints, &ai))
			return -1;
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			freeaddrinfo(ai);
			return fd;
		}
		freeaddrinfo(ai);
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

/*
 * Send raw bytes; return the status of an ERROR reply (its text in why, if
 * given), 0 for WELCOME, 1 if closed without a reply.
 */
static int exchange_why(const void *msg, size_t len, int timeout_ms, char *why, size_t cap)
{
	struct hkv_ctl_hdr h;
	struct pollfd p;
	int fd = ctl_connect(), ret = 1;
	ssize_t n;

	if (why)
		why[0] = 0;
	if (fd < 0)
		return -999;
	if (len && send(fd, msg, len, MSG_NOSIGNAL) != (ssize_t)len) {
		close(fd);
		return -998;
	}
	p = (struct pollfd){.fd = fd, .events = POLLIN};
	if (poll(&p, 1, timeout_ms) == 1 && (n = read(fd, &h, sizeof(h))) == sizeof(h) &&
	    h.magic == HKV_CTL_MAGIC) {
		ret = h.type == HKV_CTL_WELCOME ? 0 : h.status;
		if (why && h.type == HKV_CTL_ERROR && h.len < cap &&
		    (n = read(fd, why, h.len)) >= 0)
			why[n] = 0;
	}
	close(fd);
	return ret;
}

static int exchange(const void *msg, size_t len, int timeout_ms)
{
	return exchange_why(msg, len, timeout_ms, NULL, 0);
}

static int request_why(uint32_t magic, uint16_t version, uint16_t type, uint32_t len,
		       const char *body, size_t body_len, char *why, size_t cap)
{
	char buf[sizeof(struct hkv_ctl_hdr) + 512];
	struct hkv_ctl_hdr h = {.magic = magic, .version = version, .type = type, .len = len};

	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), body, body_len);
	return exchange_why(buf, sizeof(h) + body_len, 3000, why, cap);
}

static int request(uint32_t magic, uint16_t version, uint16_t type, uint32_t len,
		   const char *body, size_t body_len)
{
	return request_why(magic, version, type, len, body, body_len, NULL, 0);
}

/* The server's token (trailing newline and blanks cut); its length, 0 if unreadable. */
static size_t read_token(char *token, size_t cap)
{
	FILE *f = fopen(srv.token_file, "r");
	size_t tl = f ? fread(token, 1, cap - 1, f) : 0;

	if (f)
		fclose(f);
	while (tl && (token[tl - 1] == '\n' || token[tl - 1] == ' '))
		tl--;
	return tl;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void still_serving(void)
{
	struct hkv_client *c = hkvserver_client(&srv); /* aborts if it cannot */
	char v[8];
	size_t n;

	CHECK_RC(hkv_set(c, "alive", 5, "yes", 3, NULL), 0);
	CHECK_RC(hkv_get(c, "alive", 5, v, sizeof(v), &n, NULL), 0);
	hkv_close(c);
}

static void test_bad_requests(void)
{
	char token[300], junk[256];
	size_t tl = read_token(token, sizeof(token));

	CHECK(tl >= 16);
	/* the real token works over the raw protocol */
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, tl), 0);
	/* wrong token, same length and shorter */
	token[0] ^= 1;
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, tl),
		 HKV_EAUTH);
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, 5, token, 5), HKV_EAUTH);
	token[0] ^= 1;
	/* wrong protocol version, wrong magic, wrong type */
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION + 1, HKV_CTL_AUTH, (uint32_t)tl, token, tl),
		 HKV_EPROTO);
	CHECK_RC(request(0x12345678, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, tl),
		 HKV_EPROTO);
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, 77, (uint32_t)tl, token, tl), HKV_EPROTO);
	/* GRANT (memory windows): a wrong size is malformed; a forged ticket is
	 * refused (shm has no windows, so GRANT is refused as unsupported there) */
	{
		struct hkv_ctl_grant g = {.client_id = 1, .seg = HKV_GRANT_BASE};
		const char *gb = (const char *)&g;

		CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_GRANT, sizeof(g) + 1, gb,
				 sizeof(g)), HKV_EPROTO);
		CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_GRANT, sizeof(g), gb,
				 sizeof(g)), srv.verbs ? HKV_EAUTH : -EOPNOTSUPP);
		g.client_id = 0;
		CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_GRANT, sizeof(g), gb,
				 sizeof(g)), srv.verbs ? HKV_EAUTH : -EOPNOTSUPP);
	}
	/* oversized and empty bodies */
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, 1u << 30, token, tl),
		 HKV_EPROTO);
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, 0, token, 0), HKV_EPROTO);
	/* garbage bytes */
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (char)(i * 131 + 7);
	CHECK(exchange(junk, sizeof(junk), 3000) == HKV_EPROTO);
	CHECK_PASSES(still_serving());
	/* truncated: a header promising more than is sent, then silence; and a
	 * client that sends nothing: both are dropped by the 5 s request timeout */
	CHECK(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, 3) == 1);
	CHECK(exchange(NULL, 0, 7000) == 1);
	CHECK_PASSES(still_serving());
}

/* Bodies at the limit: HKV_TOKEN_MAX bytes are judged (a wrong token), one
 * more is refused from the header alone; bytes streamed past a request's end
 * are never buffered or judged. */
static void test_size_limits(void)
{
	char big[HKV_TOKEN_MAX + 1], stream[4096];
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = HKV_CTL_AUTH, .len = 16};

	memset(big, 'x', sizeof(big));
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, HKV_TOKEN_MAX, big,
			 HKV_TOKEN_MAX),
		 HKV_EAUTH);
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, HKV_TOKEN_MAX + 1, big,
			 HKV_TOKEN_MAX + 1),
		 HKV_EPROTO);
	/* a 16-byte request followed by 4 KiB more: the 16 bytes are the token */
	memset(stream, 'y', sizeof(stream));
	memcpy(stream, &h, sizeof(h));
	CHECK_RC(exchange(stream, sizeof(stream), 3000), HKV_EAUTH);
	CHECK_PASSES(still_serving());
}

static long server_rss_kb(void)
{
	char path[64], line[128];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)srv.pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

/* How many of fds[0..n) the server closes (EOF or reset) within timeout_ms;
 * closed ones are marked -1 in seen. */
static int count_closed(const int *fds, int *seen, int n, int timeout_ms)
{
	double end = now_s() + timeout_ms / 1e3;
	int closed = 0;

	do {
		for (int i = 0; i < n; i++) {
			struct pollfd p = {.fd = fds[i], .events = POLLIN};
			char b;

			if (fds[i] < 0 || seen[i] || poll(&p, 1, 0) != 1 || read(fds[i], &b, 1) > 0)
				continue;
			seen[i] = -1;
			closed++;
		}
		usleep(20000);
	} while (now_s() < end);
	return closed;
}

#define FLOOD_CONNS 300

/* 300 connections that send nothing or half a header: those beyond the cap
 * are closed at once, the server keeps serving as slots free up, the rest are
 * dropped by the request timeout, and the server's memory does not grow. */
static void test_idle_flood(void)
{
	static int fds[FLOOD_CONNS], seen[FLOOD_CONNS];
	struct hkv_ctl_hdr h = {.magic = HKV_CTL_MAGIC, .version = HKV_CTL_VERSION,
				.type = HKV_CTL_AUTH, .len = 16};
	int nopen = 0, beyond, freed = 50, dropped;
	long rss0 = server_rss_kb(), rss1;

	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < FLOOD_CONNS; i++) {
		fds[i] = ctl_connect();
		nopen += fds[i] >= 0;
		/* a half header (to a connection beyond the cap the server may
		 * have closed already: EPIPE, or ECONNRESET, and never SIGPIPE) */
		if (fds[i] >= 0 && i % 2 && send(fds[i], &h, 10, MSG_NOSIGNAL) != 10 &&
		    errno != EPIPE && errno != ECONNRESET)
			nopen = -FLOOD_CONNS;
	}
	beyond = count_closed(fds, seen, FLOOD_CONNS, 1000);
	rss1 = server_rss_kb();
	/* free 50 of the held slots: a real client gets in at once */
	for (int i = 0; i < FLOOD_CONNS && freed; i++)
		if (fds[i] >= 0 && !seen[i]) {
			close(fds[i]);
			fds[i] = -1;
			freed--;
		}
	CHECK_PASSES(still_serving());
	dropped = count_closed(fds, seen, FLOOD_CONNS, 7000);
	for (int i = 0; i < FLOOD_CONNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	printf("# %d connections from one source: %d closed at once, %d dropped by the deadline; "
	       "server RSS %ld -> %ld KiB\n",
	       nopen, beyond, dropped, rss0, rss1);
	CHECK(nopen == FLOOD_CONNS);
	CHECK(beyond == FLOOD_CONNS - HKV_CTL_MAX_PER_SOURCE);
	CHECK(dropped == HKV_CTL_MAX_PER_SOURCE - 50);
	CHECK(rss0 > 0 && rss1 - rss0 < 8192);
	usleep(2100 * 1000); /* its misses were charged to the source: let it refill */
	CHECK_PASSES(still_serving());
}

static int log_lines_with(const char *what)
{
	char path[300], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/server.log", srv.dir);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return f ? n : -1;
}

/* 1000 AUTH attempts from one source, every 50th with the right token: once
 * its bucket is empty everything is "rate limited" (the right token too, so
 * guessing learns nothing), at most one log line a second; after the bucket
 * refills the right token works again. */
static void test_rate_limit(void)
{
	char token[300], why[64];
	size_t tl = read_token(token, sizeof(token));
	int wrong = 0, limited = 0, right_limited = 0, other = 0, log0, log1, wlog0, wlog1;
	double t0, el;

	CHECK(tl >= 16);
	log0 = log_lines_with("rate limited");
	wlog0 = log_lines_with("wrong token");
	t0 = now_s();
	for (int i = 0; i < 1000; i++) {
		int right = i % 50 == 49, rc;

		token[0] ^= !right;
		rc = request_why(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token,
				 tl, why, sizeof(why));
		token[0] ^= !right;
		if (rc == HKV_EAGAIN && !strcmp(why, "rate limited")) {
			limited++;
			right_limited += right;
		} else if (rc == HKV_EAUTH && !right) {
			wrong++;
		} else if (rc != 0 || !right) {
			other++;
		}
	}
	el = now_s() - t0;
	log1 = log_lines_with("rate limited");
	wlog1 = log_lines_with("wrong token");
	printf("# 1000 attempts in %.2f s: %d wrong token, %d rate limited (%d of them right), "
	       "%d + %d log lines\n",
	       el, wrong, limited, right_limited, wlog1 - wlog0, log1 - log0);
	/* a peer cannot make the log repeat: one line a second of each kind */
	CHECK(wlog0 < 0 || (wlog1 - wlog0 >= 1 && wlog1 - wlog0 <= (int)el + 2));
	CHECK(other == 0);
	CHECK(limited > 0 && right_limited > 0);
	CHECK(wrong <= 40 + (int)(20 * el) + 1);
	CHECK(log0 < 0 || (log1 - log0 >= 1 && log1 - log0 <= (int)el + 2));
	usleep(2100 * 1000); /* the bucket refills: 40 tokens at 20/s */
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, tl), 0);
	CHECK_PASSES(still_serving());
}

/*
 * Slowloris (issue 12, item 4): 256 connections from one source, each
 * sending one more header byte every second. Before, each byte reset a 5 s
 * idle timeout, so they held every place and locked real clients and GRANTs
 * out. Now one source holds at most HKV_CTL_MAX_PER_SOURCE and each must
 * send its whole request within 5 s of the accept. On shm (run as root) the
 * attacker is another uid - another source - and a real client gets in
 * during the attack; elsewhere the attacker shares the test's source.
 */
static void test_slowloris(void)
{
	static const uint8_t hdr[sizeof(struct hkv_ctl_hdr)] = {0x48};
	int other = !srv.verbs && getuid() == 0, p[2], rep[2] = {-1, -1}, status, ret = 0;
	struct hkv_config *cfg = hkvserver_config(&srv);
	struct hkv_client *c = NULL;
	pid_t pid;

	CHECK(!pipe(p));
	if (other) { /* let uid 65534 reach the socket */
		char path[300];

		snprintf(path, sizeof(path), "%s/ctl.sock", srv.dir);
		CHECK(!chmod(srv.dir, 0755) && !chmod(path, 0777));
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		static int fds[HKV_CTL_MAX_CONNS], seen[HKV_CTL_MAX_CONNS];
		int r[2] = {0, 0};

		close(p[0]);
		if (other && (setgid(65534) || setuid(65534)))
			_exit(2);
		for (int i = 0; i < HKV_CTL_MAX_CONNS; i++)
			fds[i] = ctl_connect();
		r[0] = count_closed(fds, seen, HKV_CTL_MAX_CONNS, 500); /* refused at once */
		if (write(p[1], &r[0], sizeof(r[0])) != sizeof(r[0]))
			_exit(3);
		for (int sec = 0; sec < 7; sec++) { /* a byte a second, past the deadline */
			for (int i = 0; i < HKV_CTL_MAX_CONNS; i++)
				if (fds[i] >= 0 && !seen[i] && (size_t)sec < sizeof(hdr) &&
				    send(fds[i], &hdr[sec], 1, MSG_NOSIGNAL) != 1)
					seen[i] = 1;
			usleep(1000 * 1000);
		}
		count_closed(fds, seen, HKV_CTL_MAX_CONNS, 100);
		for (int i = 0; i < HKV_CTL_MAX_CONNS; i++)
			r[1] += fds[i] >= 0 && !seen[i];
		_exit(write(p[1], r, sizeof(r)) == sizeof(r) ? 0 : 3);
	}
	close(p[1]);
	CHECK(pid > 0 && read(p[0], &rep[0], sizeof(rep[0])) == sizeof(rep[0]));
	if (other) {
		ret = hkv_open(cfg, &c);
		if (c)
			hkv_close(c);
	}
	CHECK(read(p[0], rep, sizeof(rep)) == sizeof(rep));
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status));
	close(p[0]);
	printf("# slowloris from %s: %d of %d connections refused at once; a real client of "
	       "another source meanwhile: %s; after 7 s of a byte a second %d still open "
	       "(deadline %d s)\n", other ? "uid 65534" : "the test's own source", rep[0],
	       HKV_CTL_MAX_CONNS, other ? (ret ? hkv_strerror(ret) : "connects") : "(not tried)",
	       rep[1], HKV_CTL_DEADLINE_S);
	CHECK_RC(ret, 0);
	CHECK(rep[0] == HKV_CTL_MAX_CONNS - HKV_CTL_MAX_PER_SOURCE);
	CHECK(rep[1] == 0);
	hkv_config_free(cfg);
	usleep(2100 * 1000); /* 128 misses were charged to that source: let it refill */
	CHECK_PASSES(still_serving());
}

static atomic_int closer_stop;

/* A control server that closes every connection as soon as it comes: it
 * spins on accept, so the close often lands before the client's write. */
static void *closer(void *arg)
{
	int lfd = *(int *)arg;

	while (!atomic_load(&closer_stop)) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);

		if (fd >= 0)
			close(fd);
	}
	return NULL;
}

/*
 * The library never raises SIGPIPE (issue 12, item 4): an application that
 * keeps SIGPIPE's default action opens handles against a server that hangs
 * up at once, 300 times; it must get errors, and live.
 */
static void test_no_sigpipe(void)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	char path[64], uri[80];
	pthread_t t;
	pid_t pid;
	int lfd, status = -1;

	snprintf(path, sizeof(path), "/tmp/hkv-closer-%d.sock", (int)getpid());
	snprintf(uri, sizeof(uri), "shm:%s", path);
	memcpy(sun.sun_path, path, strlen(path) + 1);
	unlink(path);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(lfd >= 0 && !bind(lfd, (struct sockaddr *)&sun, sizeof(sun)) && !listen(lfd, 64));
	CHECK(!fcntl(lfd, F_SETFL, O_NONBLOCK));
	atomic_store(&closer_stop, 0);
	CHECK(!pthread_create(&t, NULL, closer, &lfd));
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct hkv_config *cfg = hkv_config_new();
		char token[200];
		int errors = 0;

		signal(SIGPIPE, SIG_DFL);
		memset(token, 't', sizeof(token) - 1);
		token[sizeof(token) - 1] = 0;
		hkv_config_add_server(cfg, uri);
		hkv_config_set_token(cfg, token);
		hkv_config_set_timeout_ms(cfg, 500);
		for (int i = 0; i < 300; i++) {
			struct hkv_client *c;

			errors += hkv_open(cfg, &c) != 0;
		}
		_exit(errors == 300 ? 0 : 3);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	printf("# 300 hkv_open against a server that hangs up at once, SIGPIPE at its default: "
	       "%s\n", WIFSIGNALED(status) ? strsignal(WTERMSIG(status))
		       : WEXITSTATUS(status) == 0 ? "300 errors, no signal" : "unexpected");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	atomic_store(&closer_stop, 1);
	pthread_join(t, NULL);
	close(lfd);
	unlink(path);
}

int main(int argc, char **argv)
{
	int verbs = hkvserver_want_verbs(argc, argv);

	if (verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	if (hkvserver_start(&srv, verbs, "16M", "64K", NULL)) {
		fprintf(stderr, "cannot start hatchkv-server\n");
		return 1;
	}
	RUN_TEST(test_bad_requests);
	RUN_TEST(test_size_limits);
	RUN_TEST(test_idle_flood);
	RUN_TEST(test_rate_limit);
	RUN_TEST(test_slowloris);
	if (!verbs)
		RUN_TEST(test_no_sigpipe);
	hkvserver_stop(&srv);
	return hkv_test_finish();
}
