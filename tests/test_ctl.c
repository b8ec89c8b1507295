/*
 * test_ctl.c - the control plane under bad input, from raw sockets: a wrong
 * token, a wrong protocol version, a wrong magic, an oversized or truncated
 * request, garbage bytes, a silent client. Each is refused (an ERROR reply
 * with the right code, or the connection closed) and the server keeps
 * serving real clients throughout.
 *
 *   test_ctl shm|verbs
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/ctl_proto.h"
#include "common/transport.h"
#include "hatchkv.h"
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

/* Send raw bytes; return the status of an ERROR reply, 0 for WELCOME, 1 if closed. */
static int exchange(const void *msg, size_t len, int timeout_ms)
{
	struct hkv_ctl_hdr h;
	struct pollfd p;
	int fd = ctl_connect(), ret = 1;
	ssize_t n;

	if (fd < 0)
		return -999;
	if (len && write(fd, msg, len) != (ssize_t)len) {
		close(fd);
		return -998;
	}
	p = (struct pollfd){.fd = fd, .events = POLLIN};
	if (poll(&p, 1, timeout_ms) == 1 && (n = read(fd, &h, sizeof(h))) == sizeof(h) &&
	    h.magic == HKV_CTL_MAGIC)
		ret = h.type == HKV_CTL_WELCOME ? 0 : h.status;
	close(fd);
	return ret;
}

static int request(uint32_t magic, uint16_t version, uint16_t type, uint32_t len,
		   const char *body, size_t body_len)
{
	char buf[sizeof(struct hkv_ctl_hdr) + 512];
	struct hkv_ctl_hdr h = {.magic = magic, .version = version, .type = type, .len = len};

	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), body, body_len);
	return exchange(buf, sizeof(h) + body_len, 3000);
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
	FILE *f = fopen(srv.token_file, "r");
	size_t tl = f ? fread(token, 1, sizeof(token) - 1, f) : 0;

	if (f)
		fclose(f);
	while (tl && (token[tl - 1] == '\n' || token[tl - 1] == ' '))
		tl--;
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
	/* oversized and empty bodies */
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, 1u << 30, token, tl),
		 HKV_EPROTO);
	CHECK_RC(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, 0, token, 0), HKV_EPROTO);
	/* garbage bytes */
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (char)(i * 131 + 7);
	CHECK(exchange(junk, sizeof(junk), 3000) == HKV_EPROTO);
	still_serving();
	/* truncated: a header promising more than is sent, then silence; and a
	 * client that sends nothing: both are dropped by the 5 s request timeout */
	CHECK(request(HKV_CTL_MAGIC, HKV_CTL_VERSION, HKV_CTL_AUTH, (uint32_t)tl, token, 3) == 1);
	CHECK(exchange(NULL, 0, 7000) == 1);
	still_serving();
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
	hkvserver_stop(&srv);
	return hkv_test_finish();
}
