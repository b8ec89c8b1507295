/* rawserve.c - see rawserve.h. */
#include "tests/support/rawserve.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/region.h"

static int rawserve_on_connect(void *arg, const void *hello, size_t len,
			       struct hkv_accept_info *out)
{
	if (len != strlen(RAWSERVE_TOKEN) || memcmp(hello, RAWSERVE_TOKEN, len))
		return HKV_EAUTH;
	memcpy(out->reply, RAWSERVE_REPLY, sizeof(RAWSERVE_REPLY));
	out->reply_len = sizeof(RAWSERVE_REPLY);
	return 0;
}

static void rawserve_child(const struct rawserve *rs, size_t size, int ctl, int ready)
{
	struct hkv_listener_cfg cfg = {
		.kind = rs->kind,
		.host = rs->host,
		.port = rs->port,
		.path = rs->path,
		.on_connect = rawserve_on_connect,
	};
	struct hkv_region region;
	struct hkv_listener *l;
	struct pollfd pfd[2];
	char ok = 1;

	if (hkv_region_create(&region, size, NULL, NULL))
		_exit(2);
	cfg.region = region.base;
	cfg.region_len = region.length;
	cfg.region_fd = region.fd;
	l = hkv_listener_create(&cfg);
	if (!l) {
		fprintf(stderr, "rawserve: listener: %s\n", hkv_strerror(-errno));
		_exit(3);
	}
	if (write(ready, &ok, 1) != 1)
		_exit(4);
	pfd[0] = (struct pollfd){.fd = hkv_listener_fd(l), .events = POLLIN};
	pfd[1] = (struct pollfd){.fd = ctl, .events = POLLIN};
	for (;;) {
		if (poll(pfd, 2, 200) < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;
		hkv_listener_dispatch(l);
	}
	hkv_listener_destroy(l);
	hkv_region_destroy(&region);
	_exit(0);
}

/*
 * librdmacm opens every device when first used and keeps those descriptors;
 * a forked child that inherits them may not use them (the kernel refuses
 * "changed security contexts"), and would keep the parent's objects alive.
 * So the server is a fresh process: fork + exec of hkv-rawserve, found next
 * to the running executable.
 */
static int rawserve_exec(const struct rawserve *rs, size_t size, int ctl, int ready)
{
	char exe[4096], kind[4], sz[32], ctlfd[16], readyfd[16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 32);
	char *slash;

	if (n <= 0)
		return -errno;
	exe[n] = 0;
	slash = strrchr(exe, '/');
	strcpy(slash + 1, "hkv-rawserve");
	snprintf(kind, sizeof(kind), "%d", (int)rs->kind);
	snprintf(sz, sizeof(sz), "%zu", size);
	snprintf(ctlfd, sizeof(ctlfd), "%d", ctl);
	snprintf(readyfd, sizeof(readyfd), "%d", ready);
	execl(exe, exe, kind, rs->path, rs->host, rs->port, sz, ctlfd, readyfd, (char *)NULL);
	fprintf(stderr, "rawserve: exec %s: %s\n", exe, strerror(errno));
	return -errno;
}

int rawserve_main(int argc, char **argv)
{
	struct rawserve rs = {0};

	if (argc != 8)
		return 2;
	rs.kind = (enum hkv_transport_kind)atoi(argv[1]);
	snprintf(rs.path, sizeof(rs.path), "%s", argv[2]);
	snprintf(rs.host, sizeof(rs.host), "%s", argv[3]);
	snprintf(rs.port, sizeof(rs.port), "%s", argv[4]);
	rawserve_child(&rs, strtoull(argv[5], NULL, 10), atoi(argv[6]), atoi(argv[7]));
	return 0;
}

int rawserve_start(struct rawserve *rs, enum hkv_transport_kind kind, size_t size)
{
	static int seq;
	int ctl[2], ready[2];
	const char *addr = getenv("HKV_RDMA_ADDR");
	char ok;

	memset(rs, 0, sizeof(*rs));
	rs->kind = kind;
	snprintf(rs->path, sizeof(rs->path), "/tmp/hkv-rawserve-%d-%d.sock", (int)getpid(), seq);
	snprintf(rs->host, sizeof(rs->host), "%s", addr ? addr : "192.0.2.1");
	snprintf(rs->port, sizeof(rs->port), "%d", 20000 + (int)(getpid() % 20000) + seq * 7);
	seq++;
	if (pipe2(ctl, O_CLOEXEC) || pipe2(ready, O_CLOEXEC))
		return -errno;
	fflush(NULL);
	rs->pid = fork();
	if (rs->pid < 0)
		return -errno;
	if (rs->pid == 0) {
		/* the child keeps its ends across exec, and only those */
		fcntl(ctl[0], F_SETFD, 0);
		fcntl(ready[1], F_SETFD, 0);
		rawserve_exec(rs, size, ctl[0], ready[1]);
		_exit(127);
	}
	close(ctl[0]);
	close(ready[1]);
	rs->ctl = ctl[1];
	if (read(ready[0], &ok, 1) != 1) {
		close(ready[0]);
		rawserve_stop(rs);
		return -ECONNREFUSED;
	}
	close(ready[0]);
	return 0;
}

void rawserve_conn_cfg(const struct rawserve *rs, struct hkv_conn_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->kind = rs->kind;
	cfg->host = rs->host;
	cfg->port = rs->port;
	cfg->path = rs->path;
	cfg->hello = RAWSERVE_TOKEN;
	cfg->hello_len = strlen(RAWSERVE_TOKEN);
	cfg->timeout_ms = 5000;
}

void rawserve_stop(struct rawserve *rs)
{
	if (rs->pid <= 0)
		return;
	close(rs->ctl);
	waitpid(rs->pid, NULL, 0);
	rs->pid = 0;
}

void rawserve_kill(struct rawserve *rs)
{
	if (rs->pid <= 0)
		return;
	kill(rs->pid, SIGKILL);
	waitpid(rs->pid, NULL, 0);
	close(rs->ctl);
	rs->pid = 0;
}
