/*
 * test_clock.c - one clock per region (issue 27): no rule compares one
 * host's clock with another's. A second client runs in a process of its own
 * under libfaketime (Debian's faketime), its clock 120 s ahead, 120 s behind,
 * or jumping by an hour while connected, and talks to a hatchkv-server
 * beside a client on the true clock:
 *
 *   test_ttl_ahead / test_ttl_behind: an item set with a 60 s TTL by either
 *     is read by the other (not expired early, not removed by the skewed
 *     one), and one set with a 2 s TTL by the skewed one is gone for both
 *     3.2 s later (not kept alive past exptime + 1 s); both handles'
 *     hkv_time() agree within a second.
 *   test_lease_ahead: an insert held 300 ms between its slot CAS and its
 *     commit (HKV_TP_INSERT_COMMIT) while the client 120 s ahead adds the
 *     same key: the insert commits (its PENDING lease is on the region's
 *     clock: the other client's did not find it 120 s old), the other's add
 *     finds it (exists).
 *   test_jump: the skewed client's clock jumps by +1 h between two of its
 *     operations; TTLs it sets and reads stay right.
 *
 * Cache mode (expiry and atime matter most there); shm, and verbs in the
 * Soft-RoCE guest. Usage: test_clock shm|verbs. The skewed client is
 * hkv-clock-peer (tests/support/clock_peer.c), beside this program.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"

HKV_TEST_MAIN_DEFS;

static int use_verbs;
static struct hkvserver srv;
static struct hkv_config *cfg;
static struct hkv_client *a; /* on the true clock */
static char peer[4096]; /* hkv-clock-peer, beside us */
static const char *faketime_lib;

/* ---- the parent's side ----------------------------------------------------------- */

struct skewed {
	pid_t pid;
	FILE *to, *from;
};

/* Start the skewed client: FAKETIME as libfaketime reads it ("+120s",
 * "-120s"), or a file it re-reads on every call (jumps while connected). */
static int skewed_start(struct skewed *k, const char *faketime, const char *file)
{
	int in[2], out[2];

	if (pipe(in) || pipe(out))
		return -1;
	k->pid = fork();
	if (k->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		setenv("LD_PRELOAD", faketime_lib, 1);
		/* (the ASan tree: libfaketime comes before ASan's runtime) */
		setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
		if (file) {
			setenv("FAKETIME_TIMESTAMP_FILE", file, 1);
			setenv("FAKETIME_NO_CACHE", "1", 1);
		} else {
			setenv("FAKETIME", faketime, 1);
		}
		execl(peer, peer, srv.uri, srv.token_file, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	k->to = fdopen(in[1], "w");
	k->from = fdopen(out[0], "r");
	if (k->pid < 0 || !k->to || !k->from)
		return -1;
	setvbuf(k->to, NULL, _IOLBF, 0);
	return 0;
}

static void skewed_stop(struct skewed *k)
{
	int st;

	if (k->to)
		fclose(k->to);
	if (k->from)
		fclose(k->from);
	if (k->pid > 0)
		waitpid(k->pid, &st, 0);
	memset(k, 0, sizeof(*k));
}

/* Send one command; its answer line (without the newline) in ans. */
static void ask(struct skewed *k, const char *cmd, char *ans, size_t cap)
{
	ans[0] = 0;
	fprintf(k->to, "%s\n", cmd);
	if (!fgets(ans, (int)cap, k->from))
		snprintf(ans, cap, "(no answer)");
	ans[strcspn(ans, "\n")] = 0;
}

static int a_get(const char *key)
{
	char v[64];
	size_t n;

	return hkv_get(a, key, strlen(key), v, sizeof(v), &n, NULL);
}

static int a_set(const char *key, int64_t ttl)
{
	struct hkv_write_opts o = {.exptime = ttl};

	return hkv_set(a, key, strlen(key), "true", 4, &o);
}

/* Both handles' region clocks agree within a second; the skewed process's
 * own clock is off by about want_skew s. */
static void clocks_agree(struct skewed *k, long want_skew)
{
	char ans[128];
	unsigned rt = 0;
	long long wall = 0;
	uint32_t mine;

	ask(k, "time", ans, sizeof(ans));
	mine = hkv_time(a);
	CHECK(sscanf(ans, "%u %lld", &rt, &wall) == 2);
	printf("# region clock: ours %u, the skewed client's %u; its wall clock %+lld s off\n",
	       mine, rt, wall - (long long)time(NULL));
	CHECK(rt + 1 >= mine && rt <= mine + 1);
	CHECK(llabs(wall - (long long)time(NULL) - want_skew) <= 5);
}

static void ttl_skewed(const char *faketime, long skew, const char *tag)
{
	struct skewed k = {0};
	char ans[64], cmd[128], key[64];

	CHECK(skewed_start(&k, faketime, NULL) == 0);
	clocks_agree(&k, skew); /* (on: the behaviour is checked too) */
	/* ours, 60 s: the skewed one reads it and leaves it */
	snprintf(key, sizeof(key), "%s-ours", tag);
	CHECK_RC(a_set(key, 60), 0);
	snprintf(cmd, sizeof(cmd), "get %s", key);
	ask(&k, cmd, ans, sizeof(ans));
	CHECK(!strcmp(ans, "hit"));
	CHECK_RC(a_get(key), 0);
	/* theirs, 60 s: we read it */
	snprintf(key, sizeof(key), "%s-theirs", tag);
	snprintf(cmd, sizeof(cmd), "set %s 60", key);
	ask(&k, cmd, ans, sizeof(ans));
	CHECK(!strcmp(ans, "ok"));
	CHECK_RC(a_get(key), 0);
	/* theirs, 2 s: there now, gone for both 3.2 s later */
	snprintf(key, sizeof(key), "%s-short", tag);
	snprintf(cmd, sizeof(cmd), "set %s 2", key);
	ask(&k, cmd, ans, sizeof(ans));
	CHECK(!strcmp(ans, "ok"));
	CHECK_RC(a_get(key), 0);
	usleep(3200 * 1000);
	CHECK_RC(a_get(key), HKV_ENOTFOUND);
	snprintf(cmd, sizeof(cmd), "get %s", key);
	ask(&k, cmd, ans, sizeof(ans));
	CHECK(!strcmp(ans, "miss"));
	skewed_stop(&k);
}

static void test_ttl_ahead(void)
{
	ttl_skewed("+120s", 120, "ahead");
}

static void test_ttl_behind(void)
{
	ttl_skewed("-120s", -120, "behind");
}

static struct skewed *lease_peer;
static int lease_fired;

static void lease_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c != a || point != HKV_TP_INSERT_COMMIT || lease_fired)
		return;
	lease_fired = 1;
	fprintf(lease_peer->to, "add lease-key 60\n"); /* (answered after our commit) */
	usleep(300 * 1000);
}

static void test_lease_ahead(void)
{
	struct skewed k = {0};
	struct hkv_write_opts o = {.exptime = 60};
	char ans[64];
	int ret;

	CHECK(skewed_start(&k, "+120s", NULL) == 0);
	clocks_agree(&k, 120); /* (on: the behaviour is checked too) */
	lease_peer = &k;
	lease_fired = 0;
	hkv_test_hook = lease_hook;
	ret = hkv_add(a, "lease-key", 9, "true", 4, &o);
	hkv_test_hook = NULL;
	CHECK(lease_fired);
	if (!fgets(ans, sizeof(ans), k.from))
		ans[0] = 0;
	ans[strcspn(ans, "\n")] = 0;
	printf("# an insert held 300 ms before its commit: ours %s, the client 120 s ahead: %s\n",
	       hkv_strerror(ret), ans);
	CHECK_RC(ret, 0);
	CHECK(!strcmp(ans, "exists"));
	skewed_stop(&k);
}

static void test_jump(void)
{
	struct skewed k = {0};
	char ans[64], file[] = "/tmp/hkv-faketime-XXXXXX";
	int fd = mkstemp(file);
	FILE *f;

	CHECK(fd >= 0);
	CHECK(write(fd, "+0\n", 3) == 3);
	close(fd);
	CHECK(skewed_start(&k, NULL, file) == 0);
	clocks_agree(&k, 0); /* (on: the behaviour is checked too) */
	CHECK_RC(a_set("jump-ours", 60), 0);
	ask(&k, "set jump-theirs 60", ans, sizeof(ans));
	CHECK(!strcmp(ans, "ok"));
	/* its clocks (wall and monotonic) jump an hour ahead, connected */
	f = fopen(file, "w");
	CHECK(f != NULL);
	fprintf(f, "+3600\n");
	fclose(f);
	clocks_agree(&k, 3600); /* (on: the behaviour is checked too) */
	ask(&k, "get jump-ours", ans, sizeof(ans));
	CHECK(!strcmp(ans, "hit"));
	ask(&k, "get jump-theirs", ans, sizeof(ans));
	CHECK(!strcmp(ans, "hit"));
	CHECK_RC(a_get("jump-ours"), 0);
	ask(&k, "set jump-after 60", ans, sizeof(ans));
	CHECK(!strcmp(ans, "ok"));
	CHECK_RC(a_get("jump-after"), 0);
	ask(&k, "set jump-short 2", ans, sizeof(ans));
	CHECK(!strcmp(ans, "ok"));
	CHECK_RC(a_get("jump-short"), 0);
	usleep(3200 * 1000);
	CHECK_RC(a_get("jump-short"), HKV_ENOTFOUND);
	skewed_stop(&k);
	unlink(file);
}

static const char *find_faketime(void)
{
	static const char *const libs[] = {
		"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
		"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
		"/usr/lib/faketime/libfaketime.so.1",
	};

	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++)
		if (access(libs[i], R_OK) == 0)
			return libs[i];
	return NULL;
}

int main(int argc, char **argv)
{
	const char *const cache[] = {"--cache", NULL};
	ssize_t n;

	use_verbs = hkvserver_want_verbs(argc, argv);
	printf("# transport %s\n", use_verbs ? "verbs" : "shm");
	faketime_lib = find_faketime();
	if (!faketime_lib) {
		fprintf(stderr, "FAIL: no libfaketime (apt-get install faketime; scripts/install-deps)\n");
		return 1;
	}
	n = readlink("/proc/self/exe", peer, sizeof(peer) - 32);
	if (n <= 0 || !strrchr(peer, '/'))
		return 1;
	peer[n] = 0;
	strcpy(strrchr(peer, '/') + 1, "hkv-clock-peer");
	signal(SIGPIPE, SIG_IGN);
	if (hkvserver_start(&srv, use_verbs, "32M", "1M", cache)) {
		fprintf(stderr, "FAIL: cannot start hatchkv-server\n");
		return 1;
	}
	cfg = hkvserver_config(&srv);
	if (hkv_open(cfg, &a)) {
		fprintf(stderr, "FAIL: cannot open a client\n");
		hkvserver_stop(&srv);
		return 1;
	}
	RUN_TEST(test_ttl_ahead);
	RUN_TEST(test_ttl_behind);
	RUN_TEST(test_lease_ahead);
	RUN_TEST(test_jump);
	hkv_close(a);
	hkv_config_free(cfg);
	hkvserver_stop(&srv);
	return hkv_test_finish();
}
