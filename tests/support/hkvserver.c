/* hkvserver.c - see hkvserver.h. */
#include "tests/support/hkvserver.h"
#include "tests/hkv_test.h"
#include "client/client_int.h"
#include "client/ops_int.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int exe_dir(char *buf, size_t cap)
{
	ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
	char *slash;

	if (n <= 0)
		return -errno;
	buf[n] = 0;
	slash = strrchr(buf, '/');
	*slash = 0;
	return 0;
}

/* Does the control plane accept a connection? (TCP for verbs, the unix socket for shm.) */
static int ctl_accepts(const struct hkvserver *s)
{
	const char *addr = getenv("HKV_RDMA_ADDR");
	int ok = 0;

	if (s->verbs) {
		struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
		struct addrinfo *res = NULL;

		if (getaddrinfo(addr ? addr : "192.0.2.1", s->port, &hints, &res))
			return 0;
		for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
			int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
					ai->ai_protocol);

			if (fd < 0)
				continue;
			ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
			close(fd);
		}
		freeaddrinfo(res);
	} else {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		char path[160];
		int fd;

		if ((size_t)snprintf(path, sizeof(path), "%s/ctl.sock", s->dir) >=
		    sizeof(sa.sun_path))
			return 0;
		memcpy(sa.sun_path, path, strlen(path) + 1);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return 0;
		ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
	}
	return ok;
}

/* Has the server logged that it is ready? (Taken as yes when its log goes to stderr
 * or HKV_LOG hides the info line.) */
static int log_says_ready(const struct hkvserver *s)
{
	const char *lvl = getenv("HKV_LOG");
	char path[200], buf[4096];
	size_t n;
	FILE *f;

	if (getenv("HKV_TEST_SERVER_LOG_STDERR") ||
	    (lvl && (!strcasecmp(lvl, "error") || !strcasecmp(lvl, "warn"))))
		return 1;
	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	if (!(f = fopen(path, "r")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, "server: ready") != NULL;
}

/*
 * Ready without a client: the control plane accepts a connection (it listens
 * only once the data plane does, and a killed predecessor's listener is gone,
 * so this is the new process) and the log says "server: ready" (so the
 * listener is not some other program's on a clashing port).
 */
static int ready_without_client(const struct hkvserver *s)
{
	return ctl_accepts(s) && log_says_ready(s);
}

static struct timespec now_ts(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts;
}

static long elapsed_ms(const struct timespec *t0)
{
	struct timespec t = now_ts();

	return (t.tv_sec - t0->tv_sec) * 1000L + (t.tv_nsec - t0->tv_nsec) / 1000000L;
}

static int start_once(struct hkvserver *s, int verbs, const char *memory, const char *segment,
		      const char *const *extra, int attempt, int reuse, int no_client)
{
	static int seq;
	char bin[4096], sock[160], log[160];
	const char *argv[48];
	const char *addr = getenv("HKV_RDMA_ADDR");
	int argc = 0, last = 0;

	if (!reuse) { /* a restart keeps directory, port, socket and token */
		memset(s, 0, sizeof(*s));
		s->verbs = verbs;
		snprintf(s->dir, sizeof(s->dir), "/tmp/hkvtest-%d-%d", (int)getpid(), seq);
		/* ports: pid-derived first; on a clash (the server exits at once) random ones */
		snprintf(s->port, sizeof(s->port), "%d",
			 attempt ? 30000 + (int)(random() % 15000) * 2
				 : 30000 + (int)(getpid() % 15000) * 2 + seq * 2);
		seq++;
		mkdir(s->dir, 0700);
	}
	snprintf(s->token_file, sizeof(s->token_file), "%s/token", s->dir);
	snprintf(sock, sizeof(sock), "%s/ctl.sock", s->dir);
	snprintf(log, sizeof(log), "%s/server.log", s->dir);
	if (verbs)
		snprintf(s->uri, sizeof(s->uri), "verbs://%s:%s", addr ? addr : "192.0.2.1", s->port);
	else
		snprintf(s->uri, sizeof(s->uri), "shm:%s", sock);
	if (exe_dir(bin, sizeof(bin) - 32))
		return -errno;
	strcat(bin, "/hatchkv-server");
	argv[argc++] = bin;
	argv[argc++] = "--transport";
	argv[argc++] = verbs ? "verbs" : "shm";
	argv[argc++] = "--socket";
	argv[argc++] = sock;
	argv[argc++] = "--port";
	argv[argc++] = s->port;
	argv[argc++] = "--memory";
	argv[argc++] = memory;
	argv[argc++] = "--segment-size";
	argv[argc++] = segment;
	argv[argc++] = "--token-file";
	argv[argc++] = s->token_file;
	if (verbs) {
		argv[argc++] = "--listen";
		argv[argc++] = addr ? addr : "192.0.2.1";
	}
	for (int i = 0; extra && extra[i] && argc < 46; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;
	fflush(NULL);
	s->pid = fork();
	if (s->pid < 0)
		return -errno;
	if (s->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the test */
		if (!getenv("HKV_TEST_SERVER_LOG_STDERR") &&
		    (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout)))
			_exit(126);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	/* ready once a client can authenticate; allow 30 s (wall time: an
	 * emulated guest under load can take seconds per connection, and a dead
	 * rdma_cm makes every try last the open's timeout), then try another
	 * port (something else may answer on this one) */
	for (struct timespec t0 = now_ts(); elapsed_ms(&t0) < 30000;) {
		struct hkv_config *cfg;
		struct hkv_client *c;
		int status;

		if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
			fprintf(stderr, "hkvserver: server on port %s exited early (%s)\n", s->port,
				attempt < 4 ? "trying another port" : "giving up");
			s->pid = 0;
			return -ECHILD;
		}
		if (no_client) {
			if (ready_without_client(s))
				return 0;
		} else if (access(s->token_file, R_OK) == 0 && (cfg = hkvserver_config(s))) {
			int ret = hkv_open(cfg, &c);

			hkv_config_free(cfg);
			if (!ret) {
				hkv_close(c);
				return 0;
			}
			last = ret;
		}
		usleep(25000);
	}
	fprintf(stderr, "hkvserver: server on port %s never accepted a client (last open: %s)%s\n",
		s->port, hkv_strerror(last), attempt < 4 && !reuse ? "; trying another port" : "");
	hkvserver_kill(s);
	return attempt < 4 && !reuse ? -ECHILD : -ETIMEDOUT;
}

int hkvserver_start(struct hkvserver *s, int verbs, const char *memory, const char *segment,
		    const char *const *extra)
{
	int ret = -ECHILD;

	srandom((unsigned)getpid() ^ (unsigned)time(NULL));
	for (int attempt = 0; attempt < 5 && ret == -ECHILD; attempt++)
		ret = start_once(s, verbs, memory, segment, extra, attempt, 0, 0);
	return ret;
}

int hkvserver_start_noclient(struct hkvserver *s, int verbs, const char *memory,
			     const char *segment, const char *const *extra)
{
	int ret = -ECHILD;

	srandom((unsigned)getpid() ^ (unsigned)time(NULL));
	for (int attempt = 0; attempt < 5 && ret == -ECHILD; attempt++)
		ret = start_once(s, verbs, memory, segment, extra, attempt, 0, 1);
	return ret;
}

int hkvserver_restart(struct hkvserver *s, const char *memory, const char *segment,
		      const char *const *extra)
{
	hkvserver_kill(s);
	return start_once(s, s->verbs, memory, segment, extra, 0, 1, 0);
}

int hkvserver_restart_noclient(struct hkvserver *s, const char *memory, const char *segment,
			       const char *const *extra)
{
	hkvserver_kill(s);
	return start_once(s, s->verbs, memory, segment, extra, 0, 1, 1);
}

struct hkv_config *hkvserver_config(const struct hkvserver *s)
{
	struct hkv_config *cfg = hkv_config_new();

	if (!cfg)
		return NULL;
	if (hkv_config_add_server(cfg, s->uri) || hkv_config_set_token_file(cfg, s->token_file)) {
		hkv_config_free(cfg);
		return NULL;
	}
	return cfg;
}

struct hkv_client *hkvserver_client(const struct hkvserver *s)
{
	struct hkv_config *cfg = hkvserver_config(s);
	struct hkv_client *c = NULL;
	int ret = cfg ? hkv_open(cfg, &c) : -ENOMEM;

	hkv_config_free(cfg);
	if (ret) {
		fprintf(stderr, "hkvserver: cannot open a client on %s: %s\n", s->uri,
			hkv_strerror(ret));
		abort();
	}
	return c;
}

static void cleanup_dir(struct hkvserver *s)
{
	char path[200];

	if (getenv("HKV_TEST_KEEP"))
		return;
	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	unlink(path);
	unlink(s->token_file);
	rmdir(s->dir);
}

int hkvserver_log_count(const struct hkvserver *s, const char *what)
{
	char path[200], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/server.log", s->dir);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

void hkvserver_stop(struct hkvserver *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGTERM);
		waitpid(s->pid, NULL, 0);
		s->pid = 0;
	}
	cleanup_dir(s);
}

void hkvserver_kill(struct hkvserver *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
		s->pid = 0;
	}
}

int hkvserver_want_verbs(int argc, char **argv)
{
	int verbs = argc > 1 && !strcmp(argv[1], "verbs");

	if (verbs) /* before any server, etcd or child starts */
		hkv_test_need_rdma(hkv_test_rdma_devices() > 0, "no RDMA device on this host");
	return verbs;
}

int get_str(struct hkv_client *c, const char *key, char *buf, size_t cap,
	    struct hkv_item_info *info)
{
	size_t vlen = 0;
	int ret = hkv_get(c, key, strlen(key), buf, cap - 1, &vlen, info);

	buf[ret ? 0 : vlen] = 0;
	return ret;
}

int set_str(struct hkv_client *c, const char *key, const char *val)
{
	return hkv_set(c, key, strlen(key), val, strlen(val), NULL);
}

int hkvserver_block_of(struct hkv_client *c, const char *key, uint64_t *off, uint64_t *gen)
{
	struct key k;
	struct item it;
	struct view v;

	*off = *gen = UINT64_MAX;
	if (hkv_key_init(c, &k, key, strlen(key)) || hkv_find(c, &k, &it, &v))
		return -1;
	*off = it.blk_off;
	*gen = it.gen;
	return 0;
}

int64_t hkvserver_seg_of(struct hkv_client *c, const char *key)
{
	uint64_t off, gen;

	if (hkvserver_block_of(c, key, &off, &gen))
		return -1;
	return (int64_t)((off - c->g.data_off) / c->g.seg_size);
}
