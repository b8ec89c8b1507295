/* etcdserve.c - see etcdserve.h. */
#include "tests/support/etcdserve.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/etcd.h"

#define READY_MS 20000
#define STOP_MS  3000
#define ATTEMPTS 4

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* $HKV_ETCD_BIN, else etcd on PATH, into bin; 0 or HKV_TEST_ETCD_MISSING. */
static int find_etcd(char *bin, size_t cap)
{
	const char *env = getenv("HKV_ETCD_BIN"), *path = getenv("PATH");

	if (env && *env) {
		snprintf(bin, cap, "%s", env);
		return access(bin, X_OK) ? HKV_TEST_ETCD_MISSING : 0;
	}
	for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t n = strcspn(p, ":");

		if (n > 0 && (size_t)snprintf(bin, cap, "%.*s/etcd", (int)n, p) < cap &&
		    access(bin, X_OK) == 0)
			return 0;
		p += n + (p[n] == ':');
	}
	return HKV_TEST_ETCD_MISSING;
}

/* Two distinct free ports: bound to 127.0.0.1:0 together, then released. */
static int free_ports(int *a, int *b)
{
	int fd[2] = {-1, -1}, port[2] = {0, 0}, rc = 0;

	for (int i = 0; i < 2 && !rc; i++) {
		struct sockaddr_in sa = {.sin_family = AF_INET,
		                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t len = sizeof(sa);

		if ((fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
		    bind(fd[i], (struct sockaddr *)&sa, sizeof(sa)) ||
		    getsockname(fd[i], (struct sockaddr *)&sa, &len))
			rc = -errno;
		else
			port[i] = ntohs(sa.sin_port);
	}
	for (int i = 0; i < 2; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	*a = port[0];
	*b = port[1];
	return rc;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

static void remove_dir(struct hkv_test_etcd *t)
{
	if (t->dir[0])
		nftw(t->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	t->dir[0] = 0;
}

/* The last lines of etcd's log, to stderr (why it did not come up). */
static void print_log_tail(const struct hkv_test_etcd *t)
{
	char path[128], buf[2048];
	long size;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/etcd.log", t->dir);
	if (!(f = fopen(path, "r")))
		return;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	fprintf(stderr, "etcdserve: tail of %s:\n%s\n", path, buf);
}

static pid_t spawn(const struct hkv_test_etcd *t, const char *bin)
{
	char data[96], log[96], client[48], peer[48], cluster[64];
	const char *argv[] = {bin,     "--name",
	                      "t",     "--data-dir",
	                      data,    "--listen-client-urls",
	                      client,  "--advertise-client-urls",
	                      client,  "--listen-peer-urls",
	                      peer,    "--initial-advertise-peer-urls",
	                      peer,    "--initial-cluster",
	                      cluster, "--logger",
	                      "zap",   "--log-level",
	                      "error", NULL};
	pid_t pid;
	int fd;

	snprintf(data, sizeof(data), "%s/data", t->dir);
	snprintf(log, sizeof(log), "%s/etcd.log", t->dir);
	snprintf(client, sizeof(client), "http://127.0.0.1:%d", t->client_port);
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", t->peer_port);
	snprintf(cluster, sizeof(cluster), "t=%s", peer);
	fflush(NULL);
	if ((pid = fork()) != 0)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
	if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0 || dup2(fd, 1) < 0 ||
	    dup2(fd, 2) < 0)
		_exit(126);
	if ((fd = open("/dev/null", O_RDONLY)) >= 0)
		dup2(fd, 0);
	execv(bin, (char *const *)argv);
	_exit(127);
}

/* Poll until a range answers: 0, -ECHILD (etcd exited) or -ETIMEDOUT. */
static int wait_ready(struct hkv_test_etcd *t)
{
	long t0 = now_ms();
	int status;

	while (now_ms() - t0 < READY_MS) {
		struct hkv_etcd *e = hkv_etcd_open(t->uri, 500);
		struct hkv_etcd_kv *kvs;
		int n, rc = e ? hkv_etcd_range(e, "/hkvtest-ready", 0, &kvs, &n, NULL) : -errno;

		hkv_etcd_close(e);
		if (rc == 0) {
			hkv_etcd_kvs_free(kvs, n);
			return 0;
		}
		if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
			t->pid = 0;
			return -ECHILD;
		}
		sleep_ms(50);
	}
	return -ETIMEDOUT;
}

static int start_once(struct hkv_test_etcd *t, const char *bin)
{
	int rc;

	snprintf(t->dir, sizeof(t->dir), "/tmp/hkv-etcd-XXXXXX");
	if (!mkdtemp(t->dir)) {
		t->dir[0] = 0;
		return -errno;
	}
	if ((rc = free_ports(&t->client_port, &t->peer_port)))
		goto remove;
	snprintf(t->endpoint, sizeof(t->endpoint), "http://127.0.0.1:%d", t->client_port);
	snprintf(t->uri, sizeof(t->uri), "etcd://127.0.0.1:%d%s", t->client_port,
	         t->prefix[0] ? t->prefix : "/hkvtest");
	if ((t->pid = spawn(t, bin)) < 0) {
		rc = -errno;
		t->pid = 0;
		goto remove;
	}
	if ((rc = wait_ready(t)) == 0)
		return 0;
	print_log_tail(t);
	hkv_test_etcd_stop(t);
	return rc;
remove:
	remove_dir(t);
	return rc;
}

int hkv_test_etcd_start(struct hkv_test_etcd *t)
{
	char bin[4096];
	int rc = -ECHILD;

	t->pid = 0;
	t->dir[0] = 0;
	if (find_etcd(bin, sizeof(bin)))
		return HKV_TEST_ETCD_MISSING;
	for (int i = 0; i < ATTEMPTS && rc == -ECHILD; i++)
		rc = start_once(t, bin);
	if (rc)
		fprintf(stderr, "etcdserve: %s did not come up: %s\n", bin, strerror(-rc));
	return rc;
}

/* Has every thread of pid stopped (state T or t)? A stop is delivered to
 * each thread as it next enters the kernel: kill() returns before that, and
 * a thread running on another CPU may still answer a request meanwhile. */
static int all_threads_stopped(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int all = 1;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return 0;
	while (all && (e = readdir(d))) {
		char stat[400], buf[512], *rp;
		FILE *f;
		size_t n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(stat, sizeof(stat), "%s/%s/stat", path, e->d_name);
		if (!(f = fopen(stat, "r")))
			continue; /* (the thread exited) */
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		rp = strrchr(buf, ')'); /* "tid (comm) S ...": comm may hold anything */
		all = rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
	}
	closedir(d);
	return all;
}

int hkv_test_etcd_kill(struct hkv_test_etcd *t, int sig)
{
	if (t->pid <= 0)
		return -ESRCH;
	if (kill(t->pid, sig))
		return -errno;
	if (sig == SIGSTOP) { /* frozen when this returns, not a moment later */
		struct timespec ms = {0, 1000000};

		for (int i = 0; i < 2000 && !all_threads_stopped(t->pid); i++)
			nanosleep(&ms, NULL);
	}
	if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT) {
		kill(t->pid, SIGCONT); /* a stopped one must run to die of SIGTERM */
		while (waitpid(t->pid, NULL, 0) < 0 && errno == EINTR)
			;
		t->pid = 0;
	}
	return 0;
}

void hkv_test_etcd_stop(struct hkv_test_etcd *t)
{
	if (t->pid > 0) {
		long t0 = now_ms();

		kill(t->pid, SIGTERM);
		kill(t->pid, SIGCONT);
		while (waitpid(t->pid, NULL, WNOHANG) == 0) {
			if (now_ms() - t0 > STOP_MS) {
				kill(t->pid, SIGKILL);
				waitpid(t->pid, NULL, 0);
				break;
			}
			sleep_ms(20);
		}
		t->pid = 0;
	}
	remove_dir(t);
}
