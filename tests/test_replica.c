/*
 * test_replica.c - static replication (issue 15, first slice): a handle
 * opened with hkv_config_set_replicas(cfg, r) over r store-mode servers,
 * R0 (the primary, the only one read) ... Rk (the decider, the last), which
 * applies every write on every replica, decider first.
 *
 *   test_replica shm           (unit tier)
 *   test_replica verbs         (rdma tier, Soft-RoCE guest)
 *   test_replica shm --quick   (fewer ops: the ThreadSanitizer run)
 *
 * Three store-mode servers A, B, C are started once and serve every test
 * but the destructive ones, as a long-running set of servers would: r = 2
 * is A,B and r = 3 is A,B,C; each test has key prefixes of its own. Every
 * server is given one shared token file. Direct (unreplicated) handles on
 * each server check what every replica holds.
 *
 *  test_config           set_replicas refuses r outside 1..3; hkv_open
 *                        refuses a server count that is not r.
 *  test_basic            r = 2 and 3, values of 0 B .. 100 KiB: every
 *                        operation's result as memcached's; after each write
 *                        every replica holds the same value, flags and
 *                        version (= hkv_last_version), a deleted key reads
 *                        HKV_ENOTFOUND on each; mget and get_view read R0.
 *  test_reads_primary    a key only R0 holds is found, one only the decider
 *                        holds is not: reads go to R0 alone.
 *  test_expiry           already-expired writes read absent; add/set/incr
 *                        over expired items, the same everywhere.
 *  test_expired_read_directly  an expired item read by a plain handle on ONE
 *                        replica (which removes it there): the key must
 *                        still take replicated writes.
 *  test_many_keys        3000 keys of 0..1.5 KB through r = 3, rewritten and
 *                        deleted: mget on every replica agrees with R0.
 *  test_pipe             a pipe over a replicated config (its lanes are
 *                        replicated handles): sets, incr, delete land on
 *                        every replica.
 *  test_checker          r = 2 and 3: threads (a replicated handle each) on
 *                        hot keys, set/get/cas/delete/add and incr/decr,
 *                        every key's history linearizable (lincheck).
 *  test_helper_race      a writer held (not killed) after deciding (and,
 *                        r = 3, after one more replica) while another
 *                        handle writes the key: the held write goes first,
 *                        exactly once (an add during a held delete may
 *                        instead answer EXISTS from R0, the delete not yet
 *                        in effect); both return; every replica agrees.
 *  test_writer_killed    a child process SIGKILLed at the decided point
 *                        (r = 2, 3) or one step later (r = 3), in a set,
 *                        incr, delete, add: R0 still reads the old value,
 *                        the decider the new; the next write finishes it.
 *  test_checker_victims  the checker with writers SIGKILLed at those
 *                        points mixed in (their ops of unknown outcome).
 *  test_rounds           round trips per get/insert/update/incr/delete at r = 1, 2, 3
 *                        (a GET one READ; a warm update 2r).
 *  test_flush            flush_all deletes every key on every replica (replicated
 *                        deletes); the keys are writable again.
 *  test_cache_refused
 *  test_backup_down      (own servers) r = 2, the decider SIGKILLed: writes
 *                        fail within the timeout, reads still return every
 *                        acknowledged value.
 *  test_primary_down     (own servers) r = 2, the primary SIGKILLed: writes
 *                        and reads fail, the decider holds every
 *                        acknowledged write with its version.
 *  test_cut_after_deciding  (own servers) the primary (r = 2, 3) or the
 *                        middle replica (r = 3) killed from the hook just
 *                        after a set decided: the set says HKV_EUNKNOWN (or
 *                        0), the decider holds it; then as above.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/hkv_test.h"
#include "tests/support/hkvserver.h"
#include "tests/support/lincheck.h"

HKV_TEST_MAIN_DEFS;

#define NSRV      3
#define MEMORY    "96M"
#define SEGMENT   "256K"
#define RBUF_CAP  (256u << 10)
#define VAL_MAX   (100u << 10)
#define VALUE_CAP 2048 /* checker values */

struct params {
	int threads;  /* checker: threads, a replicated handle each */
	int ops;      /* checker: ops per thread */
	int victims;  /* checker_victims: writers killed per run */
};

static const struct params shm_params = {.threads = 4, .ops = 2000, .victims = 8};
static const struct params quick_params = {.threads = 3, .ops = 300, .victims = 3};
static const struct params verbs_params = {.threads = 4, .ops = 400, .victims = 4};

static struct params prm;
static int use_verbs;
static char work_dir[128], token_file[256];
static struct hkvserver srv[NSRV];
static int srv_up;
static struct hkv_client *direct[NSRV]; /* one unreplicated handle per server */
static char rbuf[RBUF_CAP];

/* ---- small things --------------------------------------------------------------- */

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t now_ms(void)
{
	return now_ns() / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* len bytes that depend on seed (and differ between seeds at every length > 0). */
static void fill_val(char *buf, size_t len, unsigned seed)
{
	uint64_t h = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < len; i++) {
		h ^= h >> 29;
		h *= 0xbf58476d1ce4e5b9ull;
		buf[i] = (char)('A' + (h >> 40) % 58);
	}
}

/* ---- checker values: unique, self-describing ------------------------------------------- */

/* Value ids: run << 48 | writer << 32 | seq (writer 1..: threads; 100..: victims). */
static uint64_t value_id(unsigned run, unsigned writer, unsigned seq)
{
	return (uint64_t)run << 48 | (uint64_t)writer << 32 | seq;
}

/* "w<id hex>:" and a filler: mostly short, sometimes ~1.5 KiB. */
static size_t make_value(uint64_t id, char *buf)
{
	uint64_t h = (id * 0x9e3779b97f4a7c15ull) >> 32;
	size_t len = (size_t)sprintf(buf, "w%" PRIx64 ":", id);
	size_t want = h % 5 == 0 ? 1200 + h % 300 : len + h % 40;

	for (size_t i = len; i < want; i++)
		buf[i] = (char)('a' + (h + i) % 26);
	return want;
}

static uint64_t parse_value(char *buf, size_t len, char *scratch)
{
	uint64_t id;
	int used = 0;

	buf[len] = 0;
	if (sscanf(buf, "w%" SCNx64 ":%n", &id, &used) != 1 || !used)
		return LC_GARBAGE;
	return make_value(id, scratch) == len && !memcmp(buf, scratch, len) ? id : LC_GARBAGE;
}

static uint64_t parse_counter(const char *buf, size_t len)
{
	uint64_t v = 0;

	while (len && buf[len - 1] == ' ')
		len--;
	if (!len || len > 19)
		return LC_GARBAGE;
	for (size_t i = 0; i < len; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			return LC_GARBAGE;
		v = v * 10 + (uint64_t)(buf[i] - '0');
	}
	return v;
}

/* ---- servers and handles ---------------------------------------------------------- */

static int make_token(void)
{
	unsigned char rnd[16];
	FILE *f;

	snprintf(work_dir, sizeof(work_dir), "/tmp/hkvrepl-%d", (int)getpid());
	mkdir(work_dir, 0700);
	snprintf(token_file, sizeof(token_file), "%s/token", work_dir);
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd) || !(f = fopen(token_file, "w")))
		return -1;
	for (int i = 0; i < 16; i++)
		fprintf(f, "%02x", rnd[i]);
	fprintf(f, "\n");
	fclose(f);
	chmod(token_file, 0600);
	return 0;
}

/* A server with the shared token (readiness without a client: its own
 * token file, which hkvserver_start would wait for, never exists). */
static int start_server(struct hkvserver *s, int cache)
{
	const char *extra[] = {"--token-file", token_file, cache ? "--cache" : NULL, NULL};

	return hkvserver_start_noclient(s, use_verbs, MEMORY, SEGMENT, extra);
}

static struct hkv_config *direct_config(const struct hkvserver *s, int timeout_ms)
{
	struct hkv_config *cfg = hkv_config_new();

	if (!cfg)
		return NULL;
	if (hkv_config_add_server(cfg, s->uri) || hkv_config_set_token_file(cfg, token_file) ||
	    (timeout_ms && hkv_config_set_timeout_ms(cfg, timeout_ms))) {
		hkv_config_free(cfg);
		return NULL;
	}
	return cfg;
}

static struct hkv_client *direct_open(const struct hkvserver *s, int timeout_ms)
{
	struct hkv_config *cfg = direct_config(s, timeout_ms);
	struct hkv_client *c = NULL;
	int rc = cfg ? hkv_open(cfg, &c) : -ENOMEM;

	hkv_config_free(cfg);
	if (rc) {
		fprintf(stderr, "# cannot open a direct handle on %s: %s\n", s->uri, hkv_strerror(rc));
		return NULL;
	}
	return c;
}

/* A config replicating over servers s[0..r) (s[0] the primary, s[r-1] the decider). */
static struct hkv_config *repl_config(struct hkvserver *const *s, int r, int timeout_ms)
{
	struct hkv_config *cfg = hkv_config_new();
	int rc;

	if (!cfg)
		return NULL;
	rc = hkv_config_set_replicas(cfg, r);
	for (int i = 0; i < r && !rc; i++)
		rc = hkv_config_add_server(cfg, s[i]->uri);
	if (!rc)
		rc = hkv_config_set_token_file(cfg, token_file);
	if (!rc && timeout_ms)
		rc = hkv_config_set_timeout_ms(cfg, timeout_ms);
	if (rc) {
		fprintf(stderr, "# replicated config (r = %d): %s\n", r, hkv_strerror(rc));
		hkv_config_free(cfg);
		return NULL;
	}
	return cfg;
}

/* The main servers' first r as a list. */
static struct hkvserver *const main_list[NSRV] = {&srv[0], &srv[1], &srv[2]};

static struct hkv_client *repl_open_cfg(const struct hkv_config *cfg, int r)
{
	struct hkv_client *c = NULL;
	int rc = cfg ? hkv_open(cfg, &c) : -EINVAL;

	if (rc) {
		fprintf(stderr, "# cannot open a replicated handle (r = %d): %s\n", r,
			hkv_strerror(rc));
		return NULL;
	}
	return c;
}

static struct hkv_client *repl_open(int r)
{
	struct hkv_config *cfg = repl_config(main_list, r, 0);
	struct hkv_client *c = repl_open_cfg(cfg, r);

	hkv_config_free(cfg);
	return c;
}

/* ---- what the replicas hold --------------------------------------------------------- */

static void show(const char *what, const char *key, int rc, size_t n, const struct hkv_item_info *i)
{
	fprintf(stderr, "#   %s: %s -> %s, %zu bytes, version %#" PRIx64 ", flags %u, exptime %u\n",
		what, key, hkv_strerror(rc), rc ? 0 : n, rc ? 0 : i->version, rc ? 0 : i->flags,
		rc ? 0 : i->exptime);
}

/*
 * key holds val (vlen bytes) read through the replicated handle c (R0) and
 * on each of the replicas d[0..r) directly, with one version, flags and
 * exptime everywhere. 0 (and *info), or -1 after printing what each says.
 */
static int held_on(struct hkv_client *c, struct hkv_client *const *d, int r, const char *key,
		   const void *val, size_t vlen, struct hkv_item_info *info)
{
	struct hkv_item_info ri = {0}, di[NSRV] = {{0}};
	size_t n = 0, dn[NSRV] = {0};
	int rc = hkv_get(c, key, strlen(key), rbuf, sizeof(rbuf), &n, &ri), drc[NSRV];
	int bad = rc || n != vlen || (vlen && memcmp(rbuf, val, vlen));

	for (int i = 0; i < r; i++) {
		drc[i] = hkv_get(d[i], key, strlen(key), rbuf, sizeof(rbuf), &dn[i], &di[i]);
		bad |= drc[i] || dn[i] != vlen || (vlen && memcmp(rbuf, val, vlen)) ||
		       di[i].version != ri.version || di[i].flags != ri.flags ||
		       di[i].exptime != ri.exptime;
	}
	if (bad) {
		fprintf(stderr, "# %s should hold %zu bytes (\"%.*s\"...) with one version "
			"everywhere (r = %d):\n", key, vlen, (int)(vlen < 16 ? vlen : 16),
			(const char *)val, r);
		show("replicated", key, rc, n, &ri);
		for (int i = 0; i < r; i++) {
			char what[32];

			snprintf(what, sizeof(what), "R%d direct%s", i, i == r - 1 ? " (decider)" : "");
			show(what, key, drc[i], dn[i], &di[i]);
		}
		return -1;
	}
	if (info)
		*info = ri;
	return 0;
}

/* key is absent through c and on every replica directly. 0 or -1 (printed). */
static int absent_on(struct hkv_client *c, struct hkv_client *const *d, int r, const char *key)
{
	size_t n = 0;
	struct hkv_item_info i = {0};
	int rc = hkv_get(c, key, strlen(key), rbuf, sizeof(rbuf), &n, &i), bad = 0;

	if (rc != HKV_ENOTFOUND) {
		fprintf(stderr, "# %s should be absent (r = %d):\n", key, r);
		show("replicated", key, rc, n, &i);
		bad = 1;
	}
	for (int k = 0; k < r; k++) {
		rc = hkv_get(d[k], key, strlen(key), rbuf, sizeof(rbuf), &n, &i);
		if (rc != HKV_ENOTFOUND) {
			char what[32];

			if (!bad)
				fprintf(stderr, "# %s should be absent (r = %d):\n", key, r);
			snprintf(what, sizeof(what), "R%d direct", k);
			show(what, key, rc, n, &i);
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

/* The same for a C string. */
static int held_str(struct hkv_client *c, struct hkv_client *const *d, int r, const char *key,
		    const char *val, struct hkv_item_info *info)
{
	return held_on(c, d, r, key, val, strlen(val), info);
}

/* What one handle reads of key as a C string ("" unless found). */
static int read_str(struct hkv_client *c, const char *key, char *buf, size_t cap,
		    struct hkv_item_info *info)
{
	return get_str(c, key, buf, cap, info);
}

/* ---- test_config -------------------------------------------------------------------- */

static void test_config(void)
{
	struct hkv_config *cfg = hkv_config_new();
	struct hkv_client *c = NULL;
	int rc;

	CHECK(cfg);
	CHECK(hkv_config_set_replicas(cfg, 0) < 0);
	CHECK(hkv_config_set_replicas(cfg, 4) < 0);
	CHECK(hkv_config_set_replicas(cfg, -2) < 0);
	CHECK_RC(hkv_config_set_replicas(cfg, 1), 0); /* the default: no replication */
	CHECK_RC(hkv_config_add_server(cfg, srv[0].uri), 0);
	CHECK_RC(hkv_config_set_token_file(cfg, token_file), 0);
	CHECK_RC(hkv_open(cfg, &c), 0);
	CHECK_RC(set_str(c, "cfg-plain", "1"), 0);
	hkv_close(c);
	c = NULL;
	/* r = 2, one server: refused */
	CHECK_RC(hkv_config_set_replicas(cfg, 2), 0);
	rc = hkv_open(cfg, &c);
	printf("# r = 2 over 1 server: %s\n", hkv_strerror(rc));
	CHECK(rc < 0 && !c);
	/* r = 2, three servers: refused */
	CHECK_RC(hkv_config_add_server(cfg, srv[1].uri), 0);
	CHECK_RC(hkv_config_add_server(cfg, srv[2].uri), 0);
	rc = hkv_open(cfg, &c);
	printf("# r = 2 over 3 servers: %s\n", hkv_strerror(rc));
	CHECK(rc < 0 && !c);
	/* r = 3 over the three: fine */
	CHECK_RC(hkv_config_set_replicas(cfg, 3), 0);
	CHECK_RC(hkv_open(cfg, &c), 0);
	hkv_close(c);
	hkv_config_free(cfg);
}

/* ---- test_basic ----------------------------------------------------------------------- */

static char vals[6][VAL_MAX + 8], expect[VAL_MAX + 64];

/* Every operation on key (values of `size` bytes) through c, checked on every replica. */
static void basic_seq(struct hkv_client *c, int r, size_t size)
{
	struct hkv_client *const *d = direct;
	struct hkv_write_opts fl = {.flags = 7};
	struct hkv_item_info i1, i2, i3, i4;
	char key[64], nkey[64], xkey[64];
	const void *view;
	size_t vlen, elen;
	uint64_t n = 0, ver;

	snprintf(key, sizeof(key), "basic%d-%zu", r, size);
	snprintf(nkey, sizeof(nkey), "basic%d-%zu-n", r, size);
	snprintf(xkey, sizeof(xkey), "basic%d-%zu-x", r, size);
	for (int i = 0; i < 6; i++)
		fill_val(vals[i], size, (unsigned)(r * 1000 + i * 100 + size % 97));
#define K key, strlen(key)
	/* absent: every conditional write says so and leaves nothing behind */
	CHECK(absent_on(c, d, r, key) == 0);
	CHECK_RC(hkv_replace(c, K, vals[0], size, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_cas(c, K, vals[0], size, 12345, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_append(c, K, "ab", 2, 0), HKV_ENOTFOUND);
	CHECK_RC(hkv_append(c, K, "ab", 2, 1), HKV_ENOTFOUND);
	CHECK_RC(hkv_append_if(c, K, "ab", 2, 0, 12345), HKV_ENOTFOUND);
	CHECK_RC(hkv_incr(c, K, 1, &n), HKV_ENOTFOUND);
	CHECK_RC(hkv_decr(c, K, 1, &n), HKV_ENOTFOUND);
	CHECK_RC(hkv_touch(c, K, 3600), HKV_ENOTFOUND);
	CHECK_RC(hkv_delete(c, K), HKV_ENOTFOUND);
	CHECK_RC(hkv_delete_if(c, K, 12345), HKV_ENOTFOUND);
	CHECK_RC(hkv_get_view(c, K, &view, &vlen, NULL), HKV_ENOTFOUND);
	CHECK(absent_on(c, d, r, key) == 0);
	/* add, add again */
	CHECK_RC(hkv_add(c, K, vals[0], size, NULL), 0);
	CHECK(held_on(c, d, r, key, vals[0], size, &i1) == 0);
	CHECK(hkv_last_version(c) == i1.version);
	CHECK_RC(hkv_add(c, K, vals[1], size, NULL), HKV_EEXISTS);
	CHECK(held_on(c, d, r, key, vals[0], size, &i2) == 0);
	CHECK(i2.version == i1.version);
	/* set (with flags): a new version */
	CHECK_RC(hkv_set(c, K, vals[1], size, &fl), 0);
	CHECK(held_on(c, d, r, key, vals[1], size, &i2) == 0);
	CHECK(i2.version != i1.version && i2.flags == 7);
	CHECK(hkv_last_version(c) == i2.version);
	/* replace */
	CHECK_RC(hkv_replace(c, K, vals[2], size, NULL), 0);
	CHECK(held_on(c, d, r, key, vals[2], size, &i3) == 0);
	CHECK(i3.version != i2.version && i3.flags == 0);
	/* cas: a stale version, then the current one */
	CHECK_RC(hkv_cas(c, K, vals[3], size, i2.version, NULL), HKV_EVERSION);
	CHECK(held_on(c, d, r, key, vals[2], size, &i4) == 0);
	CHECK(i4.version == i3.version);
	CHECK_RC(hkv_cas(c, K, vals[3], size, i3.version, NULL), 0);
	CHECK(held_on(c, d, r, key, vals[3], size, &i4) == 0);
	CHECK(i4.version != i3.version && hkv_last_version(c) == i4.version);
	/* get_view reads the same */
	CHECK_RC(hkv_get_view(c, K, &view, &vlen, &i1), 0);
	CHECK(vlen == size && (!size || !memcmp(view, vals[3], size)) && i1.version == i4.version);
	/* append, prepend */
	CHECK_RC(hkv_append(c, K, "ab", 2, 0), 0);
	CHECK_RC(hkv_append(c, K, "XY", 2, 1), 0);
	memcpy(expect, "XY", 2);
	memcpy(expect + 2, vals[3], size);
	memcpy(expect + 2 + size, "ab", 2);
	elen = size + 4;
	CHECK(held_on(c, d, r, key, expect, elen, &i1) == 0);
	CHECK(i1.version != i4.version && hkv_last_version(c) == i1.version);
	/* append_if: stale, then current */
	CHECK_RC(hkv_append_if(c, K, "cd", 2, 0, i4.version), HKV_EVERSION);
	CHECK(held_on(c, d, r, key, expect, elen, &i2) == 0);
	CHECK(i2.version == i1.version);
	CHECK_RC(hkv_append_if(c, K, "cd", 2, 0, i1.version), 0);
	memcpy(expect + elen, "cd", 2);
	elen += 2;
	CHECK(held_on(c, d, r, key, expect, elen, &i2) == 0);
	CHECK(i2.version != i1.version);
	/* touch keeps the value (a new version when replicated), exptime everywhere */
	CHECK_RC(hkv_touch(c, K, 3600), 0);
	CHECK(held_on(c, d, r, key, expect, elen, &i3) == 0);
	CHECK(i3.exptime != 0 && i3.exptime != i2.exptime);
	CHECK(i3.version != i2.version && hkv_last_version(c) == i3.version);
	/* incr on a value that is no number */
	if (size)
		CHECK_RC(hkv_incr(c, K, 1, &n), HKV_ENOTNUM);
	CHECK(held_on(c, d, r, key, expect, elen, &i4) == 0);
	CHECK(i4.version == i3.version);
	/* delete_if: stale, then current; a tombstone reads as absent on every replica */
	CHECK_RC(hkv_delete_if(c, K, i2.version), HKV_EVERSION);
	CHECK(held_on(c, d, r, key, expect, elen, NULL) == 0);
	CHECK_RC(hkv_delete_if(c, K, i3.version), 0);
	CHECK(absent_on(c, d, r, key) == 0);
	CHECK_RC(hkv_delete(c, K), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(c, K, vals[4], size, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_append(c, K, "ab", 2, 0), HKV_ENOTFOUND);
	CHECK_RC(hkv_cas(c, K, vals[4], size, i3.version, NULL), HKV_ENOTFOUND);
	CHECK(absent_on(c, d, r, key) == 0);
	/* add after delete, then delete, then set */
	CHECK_RC(hkv_add(c, K, vals[4], size, NULL), 0);
	CHECK(held_on(c, d, r, key, vals[4], size, &i1) == 0);
	CHECK(i1.version != i3.version && i1.exptime == 0);
	CHECK_RC(hkv_delete(c, K), 0);
	CHECK(absent_on(c, d, r, key) == 0);
	CHECK_RC(hkv_set(c, K, vals[5], size, NULL), 0);
	CHECK(held_on(c, d, r, key, vals[5], size, &i2) == 0);
	CHECK(i2.version != i1.version);
	/* counters */
	CHECK_RC(hkv_incr(c, nkey, strlen(nkey), 1, &n), HKV_ENOTFOUND);
	CHECK_RC(set_str(c, nkey, "41"), 0);
	CHECK_RC(hkv_incr(c, nkey, strlen(nkey), 1, &n), 0);
	CHECK(n == 42);
	CHECK(held_str(c, d, r, nkey, "42", &i1) == 0);
	CHECK(hkv_last_version(c) == i1.version);
	CHECK_RC(hkv_incr(c, nkey, strlen(nkey), 958, &n), 0);
	CHECK(n == 1000);
	CHECK(held_str(c, d, r, nkey, "1000", NULL) == 0);
	CHECK_RC(hkv_decr(c, nkey, strlen(nkey), 1, &n), 0);
	CHECK(n == 999);
	CHECK_RC(hkv_decr(c, nkey, strlen(nkey), 5000, &n), 0);
	CHECK(n == 0);
	ver = hkv_last_version(c);
	{
		/* "0" (memcached may keep trailing spaces): the same bytes everywhere */
		static char cbuf[32];
		struct hkv_item_info ci;
		size_t cl = 0;

		CHECK_RC(hkv_get(c, nkey, strlen(nkey), cbuf, sizeof(cbuf), &cl, &ci), 0);
		CHECK(parse_counter(cbuf, cl) == 0 && ci.version == ver);
		CHECK(held_on(c, d, r, nkey, cbuf, cl, NULL) == 0);
	}
	/* mget through the replicated handle: R0's values */
	{
		static char b0[VAL_MAX + 8], b1[32], b2[32];
		struct hkv_mget_item it[3] = {
			{.key = key, .klen = strlen(key), .buf = b0, .cap = sizeof(b0)},
			{.key = nkey, .klen = strlen(nkey), .buf = b1, .cap = sizeof(b1)},
			{.key = xkey, .klen = strlen(xkey), .buf = b2, .cap = sizeof(b2)},
		};

		CHECK_RC(hkv_mget(c, it, 3), 0);
		CHECK(it[0].status == 0 && it[0].vlen == size &&
		      (!size || !memcmp(b0, vals[5], size)) && it[0].info.version == i2.version);
		CHECK(it[1].status == 0 && it[1].info.version == ver);
		CHECK(it[2].status == HKV_ENOTFOUND);
	}
	/* clean up: deleted everywhere */
	CHECK_RC(hkv_delete(c, K), 0);
	CHECK_RC(hkv_delete(c, nkey, strlen(nkey)), 0);
	CHECK(absent_on(c, d, r, key) == 0);
	CHECK(absent_on(c, d, r, nkey) == 0);
#undef K
}

static void test_basic(void)
{
	static const size_t sizes[] = {0, 1, 100, 4096, 100u << 10};

	CHECK(srv_up);
	for (int r = 2; r <= 3; r++) {
		struct hkv_client *c = repl_open(r);
		int before = hkv_test_failures;

		CHECK(c);
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			int f = hkv_test_failures;

			CHECK_PASSES(basic_seq(c, r, sizes[s]));
			if (hkv_test_failures != f)
				fprintf(stderr, "# (r = %d, values of %zu bytes)\n", r, sizes[s]);
		}
		printf("# r = %d: every operation on values of 0 B..100 KiB, checked on %d "
		       "replicas: %s\n", r, r, hkv_test_failures == before ? "ok" : "FAILED");
		hkv_close(c);
	}
}

/* Reads go to R0 alone: keys written directly (unreplicated) on one server. */
static void test_reads_primary(void)
{
	struct hkv_client *c;
	char buf[64];

	CHECK(srv_up);
	CHECK(c = repl_open(2));
	CHECK_RC(set_str(direct[0], "ro-primary-only", "p"), 0);
	CHECK_RC(set_str(direct[1], "ro-decider-only", "d"), 0);
	CHECK_RC(read_str(c, "ro-primary-only", buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "p"));
	CHECK_RC(read_str(c, "ro-decider-only", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_delete(direct[0], "ro-primary-only", 15), 0);
	CHECK_RC(hkv_delete(direct[1], "ro-decider-only", 15), 0);
	hkv_close(c);
}

/* ---- expiry, many keys, a pipe ---------------------------------------------------------------- */

/*
 * Expired items: a write that is already expired reads as absent; items
 * that expire later read as absent through the handle, and a replicated
 * add/set over them works and lands the same everywhere - also after direct
 * (unreplicated) reads of the expired item on every replica (which a
 * plain handle answers by removing the expired entry).
 */
static void test_expiry(void)
{
	const int r = 3;
	/* (2 s: exptimes are whole seconds, so a 1 s one may end within ms of
	 * the set, before the check that it is held everywhere) */
	struct hkv_write_opts past = {.exptime = -1}, soon = {.exptime = 2};
	struct hkv_client *c;
	struct hkv_item_info i1;
	char buf[64];
	uint64_t n;

	CHECK(srv_up);
	CHECK(c = repl_open(r));
	CHECK_RC(hkv_set(c, "exp-past", 8, "v", 1, &past), 0);
	CHECK_RC(read_str(c, "exp-past", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(c, "exp-past", 8, "w", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(c, "exp-past", 8, "a", 1, NULL), 0);
	CHECK(held_str(c, direct, r, "exp-past", "a", NULL) == 0);
	CHECK_RC(hkv_set(c, "exp-a", 5, "1", 1, &soon), 0);
	CHECK_RC(hkv_set(c, "exp-b", 5, "1", 1, &soon), 0);
	CHECK_RC(hkv_set(c, "exp-c", 5, "1", 1, &soon), 0);
	CHECK(held_str(c, direct, r, "exp-a", "1", &i1) == 0);
	CHECK(i1.exptime != 0);
	sleep_ms(3100);
	/* through the handle only */
	CHECK_RC(read_str(c, "exp-a", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(c, "exp-a", 5, "2", 1, NULL), 0);
	CHECK(held_str(c, direct, r, "exp-a", "2", &i1) == 0);
	CHECK(i1.exptime == 0);
	/* read directly on every replica first */
	for (int i = 0; i < r; i++)
		CHECK_RC(read_str(direct[i], "exp-b", buf, sizeof(buf), NULL), HKV_ENOTFOUND);
	CHECK_RC(set_str(c, "exp-b", "2"), 0);
	CHECK(held_str(c, direct, r, "exp-b", "2", NULL) == 0);
	CHECK_RC(hkv_delete(c, "exp-b", 5), 0);
	CHECK(absent_on(c, direct, r, "exp-b") == 0);
	CHECK_RC(hkv_add(c, "exp-b", 5, "3", 1, NULL), 0);
	CHECK(held_str(c, direct, r, "exp-b", "3", NULL) == 0);
	/* conditional writes on an expired key */
	CHECK_RC(hkv_replace(c, "exp-c", 5, "2", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(hkv_incr(c, "exp-c", 5, 1, &n), HKV_ENOTFOUND);
	CHECK_RC(hkv_delete(c, "exp-c", 5), HKV_ENOTFOUND);
	CHECK_RC(hkv_add(c, "exp-c", 5, "5", 1, NULL), 0);
	CHECK_RC(hkv_incr(c, "exp-c", 5, 1, &n), 0);
	CHECK(n == 6);
	CHECK(held_str(c, direct, r, "exp-c", "6", NULL) == 0);
	hkv_close(c);
}

/*
 * An expired item read directly (a plain handle on one server) on one
 * replica only: a plain handle answers an expired hit by removing the
 * entry, on that replica alone. A replicated write of the key must still
 * work and land the same everywhere.
 */
static void test_expired_read_directly(void)
{
	const int r = 2;
	struct hkv_write_opts soon = {.exptime = 2}; /* (as in test_expiry) */
	static const char *const keys[] = {"expd-dec", "expd-pri", "expd-dec1", "expd-pri1"};
	struct hkv_client *c;
	char buf[64];

	CHECK(srv_up);
	CHECK(c = repl_open(r));
	for (int i = 0; i < 4; i++) {
		if (i < 2) /* a key with an earlier write (pred not 0) */
			CHECK_RC(set_str(c, keys[i], "0"), 0);
		CHECK_RC(hkv_set(c, keys[i], strlen(keys[i]), "1", 1, &soon), 0);
		CHECK(held_str(c, direct, r, keys[i], "1", NULL) == 0);
	}
	sleep_ms(3100);
	for (int i = 0; i < 4; i++) {
		int on = i % 2 == 0 ? r - 1 : 0; /* the decider, or the primary */
		int64_t t0 = now_ms();
		int rc;

		CHECK_RC(read_str(direct[on], keys[i], buf, sizeof(buf), NULL), HKV_ENOTFOUND);
		rc = set_str(c, keys[i], "2");
		printf("# %s expired, read directly on R%d only; then a replicated set: %s "
		       "(%lld ms)\n", keys[i], on, hkv_strerror(rc), (long long)(now_ms() - t0));
		if (rc || held_str(c, direct, r, keys[i], "2", NULL)) {
			fprintf(stderr, "%s:%d: %s: the replicated set after a direct read of the "
				"expired item on R%d failed: %s\n", __FILE__, __LINE__, keys[i], on,
				hkv_strerror(rc));
			hkv_test_failures++;
		}
	}
	hkv_close(c);
}

/* Many keys of many sizes through one r = 3 handle, some rewritten, some
 * deleted: every replica holds each as R0 does (mget on each, compared). */
#define MANY      3000
#define MANY_VMAX 1500
#define BATCH     100

static size_t many_len(int i, int gen)
{
	return (size_t)((i * 37 + gen * 101) % MANY_VMAX);
}

static void test_many_keys(void)
{
	const int r = 3;
	static char bufs[NSRV + 1][BATCH][MANY_VMAX + 1], keys[MANY][16], want[MANY_VMAX];
	struct hkv_mget_item it[NSRV + 1][BATCH];
	struct hkv_client *c;
	int bad = 0, present = 0;

	CHECK(srv_up);
	CHECK(c = repl_open(r));
	for (int i = 0; i < MANY; i++) {
		snprintf(keys[i], sizeof(keys[i]), "many-%d", i);
		fill_val(want, many_len(i, 0), (unsigned)i);
		CHECK_RC(hkv_set(c, keys[i], strlen(keys[i]), want, many_len(i, 0), NULL), 0);
	}
	for (int i = 0; i < MANY; i++) {
		if (i % 5 == 0) {
			CHECK_RC(hkv_delete(c, keys[i], strlen(keys[i])), 0);
		} else if (i % 2 == 0) {
			fill_val(want, many_len(i, 1), (unsigned)i + 7777);
			CHECK_RC(hkv_set(c, keys[i], strlen(keys[i]), want, many_len(i, 1), NULL), 0);
		}
	}
	for (int b = 0; b < MANY; b += BATCH) {
		for (int h = 0; h <= r; h++) {
			for (int j = 0; j < BATCH; j++)
				it[h][j] = (struct hkv_mget_item){.key = keys[b + j],
								  .klen = strlen(keys[b + j]),
								  .buf = bufs[h][j],
								  .cap = MANY_VMAX + 1};
			CHECK_RC(hkv_mget(h == r ? c : direct[h], it[h], BATCH), 0);
		}
		for (int j = 0; j < BATCH; j++) {
			int i = b + j, gen = i % 2 == 0 ? 1 : 0;
			size_t len = many_len(i, gen);

			fill_val(want, len, (unsigned)i + (gen ? 7777 : 0));
			for (int h = 0; h <= r; h++) {
				struct hkv_mget_item *m = &it[h][j];
				int ok = i % 5 == 0 ? m->status == HKV_ENOTFOUND
						    : m->status == 0 && m->vlen == len &&
							      !memcmp(m->buf, want, len) &&
							      m->info.version == it[r][j].info.version;

				if (!ok && bad++ < 5)
					fprintf(stderr, "# %s on %s: %s, %zu bytes (want %zu), version "
						"%#" PRIx64 " (R0 via the handle: %#" PRIx64 ")\n", keys[i],
						h == r ? "the replicated handle" : h == 0 ? "R0" : h == 1 ? "R1"
						: "R2", hkv_strerror(m->status), m->vlen, len,
						m->info.version, it[r][j].info.version);
				present += h == r && m->status == 0;
			}
		}
	}
	printf("# %d keys (%d present, %d deleted) on %d replicas: %d disagreements\n", MANY, present,
	       MANY - present, r, bad);
	CHECK(bad == 0);
	hkv_close(c);
}

/* A pipe opened from a replicated config: its lanes are replicated handles. */
static void test_pipe(void)
{
	const int r = 2, nk = 64, depth = 8;
	struct hkv_config *cfg;
	struct hkv_pipe *p = NULL;
	struct hkv_pipe_op ops[64 * 3], *done[16];
	char keys[64][16], pvals[64][24];
	int rc, sub = 0, fin = 0, bad = 0;
	struct hkv_client *c;

	CHECK(srv_up);
	CHECK(cfg = repl_config(main_list, r, 0));
	rc = hkv_pipe_open(cfg, depth, &p);
	printf("# a pipe of depth %d over r = %d: %s\n", depth, r, hkv_strerror(rc));
	if (rc) {
		CHECK(rc == -ENOTSUP); /* refused outright, or it works */
		hkv_config_free(cfg);
		return;
	}
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < nk; i++) {
		snprintf(keys[i], sizeof(keys[i]), "pipe-%d", i % 32);
		snprintf(pvals[i], sizeof(pvals[i]), "v%d", i);
		ops[3 * i] = (struct hkv_pipe_op){.kind = HKV_PIPE_SET, .key = keys[i],
						  .klen = strlen(keys[i]), .val = pvals[i],
						  .vlen = strlen(pvals[i])};
		ops[3 * i + 1] = (struct hkv_pipe_op){.kind = HKV_PIPE_INCR, .key = "pipe-n",
						      .klen = 6, .delta = 1};
		ops[3 * i + 2] = (struct hkv_pipe_op){.kind = HKV_PIPE_DELETE, .key = "pipe-gone",
						      .klen = 9};
	}
	CHECK(c = repl_open(r));
	CHECK_RC(set_str(c, "pipe-n", "0"), 0);
	CHECK_RC(set_str(c, "pipe-gone", "x"), 0);
	for (int64_t end = now_ms() + 30000; fin < 3 * nk && now_ms() < end;) {
		while (sub < 3 * nk && hkv_pipe_submit(p, &ops[sub]) == 0)
			sub++;
		int n = hkv_pipe_poll(p, done, 16);

		for (int j = 0; j < n; j++) {
			struct hkv_pipe_op *o = done[j];

			fin++;
			if (o->kind == HKV_PIPE_DELETE ? o->status != 0 && o->status != HKV_ENOTFOUND
						       : o->status != 0)
				bad++;
		}
	}
	hkv_pipe_close(p);
	printf("# pipe: %d of %d ops done, %d failed\n", fin, 3 * nk, bad);
	CHECK(fin == 3 * nk && bad == 0);
	/* keys pipe-0..31: the last set of each (ops on one key run in order) */
	for (int i = 32; i < nk; i++)
		CHECK(held_str(c, direct, r, keys[i], pvals[i], NULL) == 0);
	{
		char want[16];

		snprintf(want, sizeof(want), "%d", nk);
		CHECK(held_str(c, direct, r, "pipe-n", want, NULL) == 0);
	}
	CHECK(absent_on(c, direct, r, "pipe-gone") == 0);
	hkv_close(c);
	hkv_config_free(cfg);
}

/* ---- checker: values, threads, histories ----------------------------------------------- */

#define NREG    5
#define NKEYS   (NREG + 1) /* registers r0..r4, counter c0 */
#define COUNTER NREG

static char ck_keys[NKEYS][32];

struct rec {
	int key;
	struct lc_op op;
};

struct cthread {
	pthread_t tid;
	struct hkv_client *c;
	int id, nops, errors, gaveup, run;
	int throttle;              /* sleep up to this many us between ops */
	atomic_int *more;          /* keep going past nops while set */
	unsigned seed, seq;
	struct rec *recs;
	size_t n, cap;
	int have[NKEYS];
	uint64_t ver[NKEYS], seen[NKEYS];
	char wbuf[VALUE_CAP + 1], rbuf[VALUE_CAP + 1], scratch[VALUE_CAP + 1];
};

static pthread_barrier_t start_line;

/*
 * The checker runs' hook: now and then a writer stalls after deciding (or
 * one step later), for a few microseconds or, rarely, past HKV_HELP_MS, so
 * racing writers find its write pending and finish it themselves.
 */
static __thread unsigned stall_seed;
static atomic_uint stalls_long;

static void stall_hook(struct hkv_client *c, enum hkv_test_point point)
{
	unsigned r;

	(void)c;
	if (point != HKV_TP_REPL_DECIDED && point != HKV_TP_REPL_STEP &&
	    point != HKV_TP_REPL_RECLAIM)
		return;
	r = (unsigned)rand_r(&stall_seed) % 1000;
	if (r < 8) {
		atomic_fetch_add(&stalls_long, 1);
		usleep(60000 + r * 3000);
	} else if (r < 150) {
		usleep(r % 200);
	} else if (r < 300) {
		sched_yield();
	}
}

/* What a return code means for the history; -1 if it is an error. */
static int classify(int rc, enum lc_kind kind, enum lc_status *st)
{
	if (rc == 0)
		*st = LC_OK;
	else if (rc == HKV_ENOTFOUND)
		*st = LC_NOTFOUND;
	else if (rc == HKV_EVERSION && kind == LC_CAS)
		*st = LC_VERSION;
	else if (rc == HKV_EEXISTS && kind == LC_ADD)
		*st = LC_EXISTS;
	else
		return -1;
	return 0;
}

static int run_op(struct cthread *t, int key, struct lc_op *op, uint64_t version)
{
	const char *k = ck_keys[key];
	size_t kl = strlen(k), wlen = 0, vlen = 0;
	struct hkv_item_info info = {0};
	int rc;

	if (t->n == t->cap)
		return -1;
	if (op->kind == LC_SET || op->kind == LC_CAS || op->kind == LC_ADD)
		wlen = make_value(op->arg, t->wbuf);
	op->client = t->id;
	op->call = now_ns();
	switch (op->kind) {
	case LC_GET: rc = hkv_get(t->c, k, kl, t->rbuf, VALUE_CAP, &vlen, &info); break;
	case LC_SET: rc = hkv_set(t->c, k, kl, t->wbuf, wlen, NULL); break;
	case LC_CAS: rc = hkv_cas(t->c, k, kl, t->wbuf, wlen, version, NULL); break;
	case LC_DELETE: rc = hkv_delete(t->c, k, kl); break;
	case LC_ADD: rc = hkv_add(t->c, k, kl, t->wbuf, wlen, NULL); break;
	case LC_INCR: rc = hkv_incr(t->c, k, kl, op->arg, &op->out); break;
	case LC_DECR: rc = hkv_decr(t->c, k, kl, op->arg, &op->out); break;
	default: rc = -EINVAL;
	}
	op->ret = now_ns();
	if (rc == HKV_EAGAIN) { /* retries exhausted under contention: an answer
				 * the API gives, its effect unknown to the checker */
		op->status = LC_UNKNOWN;
		op->ret = INT64_MAX;
		t->gaveup++;
	} else if (classify(rc, op->kind, &op->status)) {
		fprintf(stderr, "# thread %d: %s %s failed after %zu ops: %s\n", t->id,
			lc_kind_name(op->kind), k, t->n, hkv_strerror(rc));
		op->status = LC_UNKNOWN;
		op->ret = INT64_MAX;
		t->errors++;
	} else if (op->kind == LC_GET && op->status == LC_OK) {
		if (key == COUNTER) {
			op->out = parse_counter(t->rbuf, vlen);
		} else {
			op->out = parse_value(t->rbuf, vlen, t->scratch);
			t->have[key] = 1;
			t->ver[key] = info.version;
			t->seen[key] = op->out;
		}
	}
	t->recs[t->n++] = (struct rec){key, *op};
	return op->status == LC_UNKNOWN ? -1 : 0;
}

/* One op of lincheck.h's mix on a register key (a cas with the version of
 * the thread's last get of it). */
static int register_op(struct cthread *t, int key)
{
	struct lc_op op = {0};
	int get_first;
	unsigned r = lc_mix_roll(&t->seed, t->have[key], &get_first);

	if (get_first) {
		struct lc_op get = {.kind = LC_GET};

		if (run_op(t, key, &get, 0))
			return -1;
	}
	op.kind = lc_mix_kind(r, t->have[key]);
	if (op.kind == LC_SET || op.kind == LC_CAS || op.kind == LC_ADD)
		op.arg = value_id((unsigned)t->run, (unsigned)t->id + 1, ++t->seq);
	if (op.kind == LC_CAS)
		op.expect = t->seen[key];
	return run_op(t, key, &op, t->ver[key]);
}

/* One op of lincheck.h's counter mix. */
static int counter_op(struct cthread *t)
{
	struct lc_op op = {0};

	op.kind = lc_counter_mix(&t->seed, &op.arg);
	return run_op(t, COUNTER, &op, 0);
}

static void *checker_thread(void *arg)
{
	struct cthread *t = arg;

	stall_seed = t->seed ^ 0x5bd1e995u;
	pthread_barrier_wait(&start_line);
	for (int i = 0; i < t->nops || (t->more && atomic_load(t->more)); i++) {
		int key = (int)((unsigned)rand_r(&t->seed) % NKEYS);

		if (t->throttle)
			usleep((useconds_t)((unsigned)rand_r(&t->seed) % (unsigned)t->throttle));
		else if (rand_r(&t->seed) % 8 == 0)
			sched_yield();
		if (key == COUNTER ? counter_op(t) : register_op(t, key))
			break;
	}
	return NULL;
}

/* ---- victims: writer processes SIGKILLed at a test point ---------------------------------- */

/*
 * The child: this binary run again as
 *   --victim POINT OP KEY ARG FD TOKEN R URI...
 * POINT: decided | step | none; OP: set (ARG a value id, hex) | setstr (ARG
 * the value) | incr (ARG the delta) | append (ARG) | delete | add (ARG the
 * value). It opens a replicated handle, writes "C <call ns>" to FD, runs
 * the op (SIGKILLing itself at POINT) and, if it returns, "R <rc> <out>".
 */
static int victim_point = -1;

static void victim_hook(struct hkv_client *c, enum hkv_test_point point)
{
	(void)c;
	if ((int)point == victim_point)
		raise(SIGKILL);
}

static int victim_main(int argc, char **argv)
{
	struct hkv_config *cfg;
	struct hkv_client *c = NULL;
	const char *op, *key, *arg;
	char line[128], *val = NULL;
	uint64_t out = 0;
	int fd, r, rc;

	if (argc < 10)
		return 2;
	victim_point = !strcmp(argv[2], "decided") ? HKV_TP_REPL_DECIDED
		       : !strcmp(argv[2], "step")  ? HKV_TP_REPL_STEP
		       : !strcmp(argv[2], "reclaim") ? HKV_TP_REPL_RECLAIM
						   : -1;
	op = argv[3];
	key = argv[4];
	arg = argv[5];
	fd = atoi(argv[6]);
	r = atoi(argv[8]);
	if (argc < 9 + r || !(cfg = hkv_config_new()) || hkv_config_set_replicas(cfg, r) ||
	    hkv_config_set_token_file(cfg, argv[7]))
		return 2;
	for (int i = 0; i < r; i++)
		if (hkv_config_add_server(cfg, argv[9 + i]))
			return 2;
	if ((rc = hkv_open(cfg, &c))) {
		fprintf(stderr, "victim: cannot open a replicated handle: %s\n", hkv_strerror(rc));
		return 3;
	}
	if (!strcmp(op, "set") || !strcmp(op, "setdel")) {
		val = malloc(VALUE_CAP + 1);
		if (!val)
			return 2;
	}
	hkv_test_hook = victim_hook;
	snprintf(line, sizeof(line), "C %" PRId64 "\n", now_ns());
	if (write(fd, line, strlen(line)) < 0)
		return 2;
	if (!strcmp(op, "set")) {
		size_t n = make_value(strtoull(arg, NULL, 16), val);

		rc = hkv_set(c, key, strlen(key), val, n, NULL);
	} else if (!strcmp(op, "setstr")) {
		rc = hkv_set(c, key, strlen(key), arg, strlen(arg), NULL);
	} else if (!strcmp(op, "add")) {
		rc = hkv_add(c, key, strlen(key), arg, strlen(arg), NULL);
	} else if (!strcmp(op, "append")) {
		rc = hkv_append(c, key, strlen(key), arg, strlen(arg), 0);
	} else if (!strcmp(op, "incr")) {
		rc = hkv_incr(c, key, strlen(key), strtoull(arg, NULL, 10), &out);
	} else if (!strcmp(op, "delete")) {
		rc = hkv_delete(c, key, strlen(key));
	} else if (!strcmp(op, "setdel")) { /* a set, then (if it held) a delete */
		size_t n = make_value(strtoull(arg, NULL, 16), val);

		rc = hkv_set(c, key, strlen(key), val, n, NULL);
		snprintf(line, sizeof(line), "S %d %" PRId64 "\n", rc, now_ns());
		if (write(fd, line, strlen(line)) < 0)
			return 2;
		if (!rc)
			rc = hkv_delete(c, key, strlen(key));
	} else {
		return 2;
	}
	hkv_test_hook = NULL;
	snprintf(line, sizeof(line), "R %d %" PRIu64 "\n", rc, out);
	if (write(fd, line, strlen(line)) < 0)
		return 2;
	hkv_close(c);
	hkv_config_free(cfg);
	free(val);
	return 0;
}

struct victim {
	pid_t pid;
	int fd;
	int status;
	int64_t call; /* 0: never started its op */
	int returned, rc;
	uint64_t out;
	int killed; /* died of SIGKILL (at the test point) */
	/* setdel: its set returned set_rc at set_ret (the delete's call) */
	int set_done, set_rc;
	int64_t set_ret;
};

static int victim_start(struct victim *v, const char *point, const char *op, const char *key,
			const char *arg, struct hkvserver *const *s, int r)
{
	char exe[4096], fds[16], rs[16];
	const char *argv[16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int p[2], a = 0;

	memset(v, 0, sizeof(*v));
	v->fd = -1;
	if (n <= 0 || pipe2(p, O_CLOEXEC))
		return -1;
	exe[n] = 0;
	snprintf(fds, sizeof(fds), "%d", p[1]);
	snprintf(rs, sizeof(rs), "%d", r);
	argv[a++] = exe;
	argv[a++] = "--victim";
	argv[a++] = point;
	argv[a++] = op;
	argv[a++] = key;
	argv[a++] = arg;
	argv[a++] = fds;
	argv[a++] = token_file;
	argv[a++] = rs;
	for (int i = 0; i < r; i++)
		argv[a++] = s[i]->uri;
	argv[a] = NULL;
	fflush(NULL);
	v->pid = fork();
	if (v->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		fcntl(p[1], F_SETFD, 0);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	if (v->pid < 0) {
		close(p[0]);
		return -1;
	}
	v->fd = p[0];
	return 0;
}

/* Read the child's report to EOF and reap it (SIGKILL after timeout_ms). 0, or -1 if it
 * neither returned nor died of SIGKILL. */
static int victim_wait(struct victim *v, int timeout_ms)
{
	char buf[512];
	size_t len = 0;
	int64_t end = now_ms() + timeout_ms;
	int hung = 0;

	while (v->fd >= 0) {
		struct pollfd pf = {.fd = v->fd, .events = POLLIN};
		ssize_t n;

		if (now_ms() > end) {
			hung = 1;
			kill(v->pid, SIGKILL);
			timeout_ms += 5000; /* read to EOF after the kill */
			end = now_ms() + 5000;
		}
		if (poll(&pf, 1, 100) <= 0)
			continue;
		n = read(v->fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			close(v->fd);
			v->fd = -1;
			break;
		}
		len += (size_t)n;
		if (len == sizeof(buf) - 1)
			len = 0;
	}
	buf[len] = 0;
	waitpid(v->pid, &v->status, 0);
	for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		if (l[0] == 'C')
			v->call = strtoll(l + 2, NULL, 10);
		else if (l[0] == 'S' && sscanf(l + 2, "%d %" SCNd64, &v->set_rc, &v->set_ret) == 2)
			v->set_done = 1;
		else if (l[0] == 'R' && sscanf(l + 2, "%d %" SCNu64, &v->rc, &v->out) == 2)
			v->returned = 1;
	}
	v->killed = !hung && WIFSIGNALED(v->status) && WTERMSIG(v->status) == SIGKILL;
	if (hung)
		fprintf(stderr, "# victim %d hung; killed\n", (int)v->pid);
	else if (!v->killed && !(WIFEXITED(v->status) && !WEXITSTATUS(v->status) && v->returned))
		fprintf(stderr, "# victim %d: status %#x, %s\n", (int)v->pid, v->status,
			v->returned ? "returned" : "no result");
	return !hung && (v->killed || v->returned) && v->call ? 0 : -1;
}

/* ---- checker runs ---------------------------------------------------------------------------- */

static int cmp_call(const void *a, const void *b)
{
	const struct lc_op *x = a, *y = b;

	return x->call < y->call ? -1 : x->call > y->call;
}

/* Check one key's history; 0 if linearizable (else printed, and a failure counted). */
static int check_key(const char *key, enum lc_model m, uint64_t init, struct lc_op *ops,
		     size_t n, size_t *unknown, size_t *overlapped)
{
	struct lc_limits lim = {.max_steps = 500000000, .max_seconds = 120, .max_memo_mb = 512};
	struct lc_report rep;
	int64_t reach = INT64_MIN;
	int ret = 0;

	*unknown = 0;
	for (size_t i = 0; i < n; i++)
		*unknown += ops[i].status == LC_UNKNOWN;
	qsort(ops, n, sizeof(*ops), cmp_call);
	for (size_t i = 0; i < n; i++) { /* ops overlapping another in time */
		*overlapped += ops[i].call <= reach || (i + 1 < n && ops[i + 1].call <= ops[i].ret);
		reach = ops[i].ret > reach ? ops[i].ret : reach;
	}
	lc_check(m, init, ops, n, &lim, &rep);
	if (rep.result != LC_LINEARIZABLE) {
		printf("# %s (initial %#" PRIx64 "): %s\n", key, init, lc_result_name(rep.result));
		lc_print_report(stdout, ops, n, &rep);
		ret = -1;
	}
	lc_report_free(&rep);
	return ret;
}

/*
 * One run: prm.threads threads, each with a replicated handle over the
 * main servers' first r, on keys "ck<run>-r0..r4" and "ck<run>-c0". With
 * victims: point ("decided"/"step": sets and incrs; "reclaim": deletes) and that many
 * writer processes killed
 * there, one after another while the threads run. Every key's history must
 * be linearizable; no thread op may fail.
 */
static void checker_run(int run, int r, const char *point, int victims)
{
	struct hkv_config *cfg = repl_config(main_list, r, 0);
	struct cthread *t = calloc((size_t)prm.threads, sizeof(*t));
	struct lc_op *ops[NKEYS] = {NULL};
	size_t nops[NKEYS] = {0}, capk[NKEYS] = {0}, total = 0;
	uint64_t init[NKEYS];
	atomic_int more = victims > 0;
	int errors = 0, gaveup = 0, killed = 0, vfail = 0, opened = 0;
	struct hkv_client *c0;
	int64_t t0 = now_ms();

	CHECK(cfg && t);
	for (int k = 0; k < NKEYS; k++)
		snprintf(ck_keys[k], sizeof(ck_keys[k]), "ck%d-%s%d", run, k == COUNTER ? "c" : "r",
			 k == COUNTER ? 0 : k);
	CHECK(c0 = repl_open_cfg(cfg, r));
	CHECK_RC(hkv_set(c0, ck_keys[COUNTER], strlen(ck_keys[COUNTER]), "100", 3, NULL), 0);
	for (int k = 0; k < NKEYS; k++)
		init[k] = k == COUNTER ? 100 : LC_ABSENT;
	for (int k = 0; k < NREG; k++)
		CHECK_RC(hkv_get(c0, ck_keys[k], strlen(ck_keys[k]), rbuf, sizeof(rbuf), NULL, NULL),
			 HKV_ENOTFOUND);
	pthread_barrier_init(&start_line, NULL, (unsigned)prm.threads);
	for (int i = 0; i < prm.threads; i++) {
		t[i].id = i;
		t[i].run = run;
		t[i].nops = victims ? prm.ops / 4 : prm.ops; /* (and on while victims run) */
		t[i].seed = (unsigned)(run * 7919 + i * 104729 + 1);
		t[i].cap = (size_t)prm.ops * 2 + (victims ? 40000 : 0);
		t[i].recs = calloc(t[i].cap, sizeof(*t[i].recs));
		t[i].throttle = victims ? 400 : 0;
		t[i].more = victims ? &more : NULL;
		if (!t[i].recs || !(t[i].c = repl_open_cfg(cfg, r)))
			break;
		opened++;
	}
	if (opened < prm.threads) {
		for (int i = 0; i < opened; i++)
			hkv_close(t[i].c);
		CHECK(opened == prm.threads);
	}
	atomic_store(&stalls_long, 0);
	hkv_test_hook = victims ? NULL : stall_hook;
	for (int i = 0; i < prm.threads; i++)
		pthread_create(&t[i].tid, NULL, checker_thread, &t[i]);
	/* the victims, one at a time, while the threads run */
	/* (a victim at "reclaim" sets its key, then deletes it: killed unless
	 * a load thread deleted it in between; up to 4 tries per victim, each
	 * in the history, two ops each) */
	int del = point && !strcmp(point, "reclaim"), tries = del ? victims * 4 : victims;
	struct lc_op *vops = calloc((size_t)tries * 2 + 1, sizeof(*vops));
	int vkeys[64];
	int nv = 0;

	for (int v = 0; v < tries && killed < victims && vops && nv < 63; v++) {
		struct victim vi;
		char arg[32];
		int key = !del && v % 3 == 2 ? COUNTER : (v * 3) % NREG;
		uint64_t id = value_id((unsigned)run, 100 + (unsigned)v, 1);

		sleep_ms(10 + v % 3 * 10);
		if (key == COUNTER)
			snprintf(arg, sizeof(arg), "%d", 1000 * (v + 1));
		else
			snprintf(arg, sizeof(arg), "%" PRIx64, id);
		if (victim_start(&vi, point, del ? "setdel" : key == COUNTER ? "incr" : "set",
				 ck_keys[key], arg, main_list, r) || victim_wait(&vi, 30000)) {
			vfail++;
			continue;
		}
		killed += vi.killed;
		if (del && vi.set_done) { /* its set: known, then the delete from there */
			vops[nv] = (struct lc_op){.kind = LC_SET, .client = 100 + v, .arg = id,
						  .call = vi.call, .ret = vi.set_ret};
			if (classify(vi.set_rc, LC_SET, &vops[nv].status)) {
				vops[nv].status = LC_UNKNOWN;
				vops[nv].ret = INT64_MAX;
			}
			vkeys[nv++] = key;
			vi.call = vi.set_ret;
			if (vi.set_rc)
				continue; /* (no delete) */
		} else if (del) { /* killed inside the set? never: "reclaim" is a delete's */
			vfail++;
			continue;
		}
		vops[nv] = (struct lc_op){
			.kind = del ? LC_DELETE : key == COUNTER ? LC_INCR : LC_SET,
			.status = LC_UNKNOWN,
			.client = 100 + v,
			.arg = del ? 0 : key == COUNTER ? (uint64_t)(1000 * (v + 1)) : id,
			.call = vi.call,
			.ret = INT64_MAX,
		};
		if (vi.returned) { /* not killed: it finished, its result is known */
			vops[nv].ret = now_ns();
			if (classify(vi.rc, vops[nv].kind, &vops[nv].status)) {
				vops[nv].status = LC_UNKNOWN;
				vops[nv].ret = INT64_MAX;
			}
			vops[nv].out = vi.out;
		}
		vkeys[nv++] = key;
	}
	atomic_store(&more, 0);
	for (int i = 0; i < prm.threads; i++)
		pthread_join(t[i].tid, NULL);
	hkv_test_hook = NULL;
	for (int i = 0; i < prm.threads; i++) {
		hkv_close(t[i].c);
		errors += t[i].errors;
		gaveup += t[i].gaveup;
		for (size_t j = 0; j < t[i].n; j++) {
			int k = t[i].recs[j].key;

			if (nops[k] == capk[k]) {
				capk[k] = capk[k] ? capk[k] * 2 : 1024;
				ops[k] = realloc(ops[k], capk[k] * sizeof(**ops));
			}
			ops[k][nops[k]++] = t[i].recs[j].op;
		}
		total += t[i].n;
		free(t[i].recs);
	}
	for (int v = 0; v < nv; v++) {
		int k = vkeys[v];

		if (nops[k] == capk[k]) {
			capk[k] = capk[k] ? capk[k] * 2 : 1024;
			ops[k] = realloc(ops[k], capk[k] * sizeof(**ops));
		}
		ops[k][nops[k]++] = vops[v];
	}
	int bad = 0;
	size_t unk_total = 0, overlapped = 0;

	for (int k = 0; k < NKEYS; k++) {
		size_t unk = 0;

		bad += check_key(ck_keys[k], k == COUNTER ? LC_COUNTER : LC_REGISTER, init[k], ops[k],
				 nops[k], &unk, &overlapped) != 0;
		unk_total += unk;
		free(ops[k]);
	}
	printf("# checker r = %d%s%s: %d threads, %zu ops on %d keys (%zu%% overlapping another, "
	       "%zu of unknown outcome), %u writers stalled past the help delay, %d victims of %d "
	       "killed at the point, %d errors, %d gave up (retries exhausted), %d keys not "
	       "linearizable, %lld ms\n", r,
	       victims ? ", victims at " : "", victims ? point : "", prm.threads,
	       total + (size_t)nv, NKEYS, 100 * overlapped / (total + (size_t)nv + !(total + nv)),
	       unk_total, atomic_load(&stalls_long), killed, nv, errors, gaveup, bad,
	       (long long)(now_ms() - t0));
	/* afterwards: every replica agrees on every key (one write first finishes any
	 * pending write of a victim) */
	for (int k = 0; k < NKEYS && !bad; k++) {
		uint64_t n = 0;
		int rc = k == COUNTER ? hkv_incr(c0, ck_keys[k], strlen(ck_keys[k]), 0, &n)
				      : hkv_set(c0, ck_keys[k], strlen(ck_keys[k]), "end", 3, NULL);
		size_t vl = 0;
		struct hkv_item_info in;

		CHECK_RC(rc, 0);
		if (k == COUNTER) {
			CHECK_RC(hkv_get(c0, ck_keys[k], strlen(ck_keys[k]), rbuf, sizeof(rbuf), &vl,
					 &in), 0);
			memcpy(expect, rbuf, vl); /* (held_on reads into rbuf) */
			CHECK(parse_counter(expect, vl) == n);
			CHECK(held_on(c0, direct, r, ck_keys[k], expect, vl, NULL) == 0);
		} else {
			CHECK(held_str(c0, direct, r, ck_keys[k], "end", NULL) == 0);
		}
	}
	hkv_close(c0);
	hkv_config_free(cfg);
	free(vops);
	free(t);
	pthread_barrier_destroy(&start_line);
	CHECK(errors == 0);
	/* giving up is for contention beyond what the retries absorb: rare */
	CHECK((size_t)gaveup * 100 <= total + 100);
	CHECK(bad == 0);
	CHECK(vfail == 0);
	/* each write reached the point (a delete only if it found the key) */
	if (victims && !del)
		CHECK(killed == nv && nv == victims);
	else if (victims)
		CHECK(killed == victims);
}

static void test_checker(void)
{
	CHECK(srv_up);
	checker_run(1, 2, NULL, 0);
	checker_run(2, 3, NULL, 0);
	checker_run(3, 2, NULL, 0);
	checker_run(4, 3, NULL, 0);
}

static void test_checker_victims(void)
{
	CHECK(srv_up);
	checker_run(11, 2, "decided", prm.victims);
	checker_run(12, 3, "decided", prm.victims);
	checker_run(13, 3, "step", prm.victims);
	/* deletes killed after reclaiming their tombstone on the decider only */
	checker_run(14, 2, "reclaim", prm.victims);
	checker_run(15, 3, "reclaim", prm.victims);
}

/* ---- a writer held at a point while another handle writes its key -------------------------- */

static struct hkv_client *held_handle;
static int held_point;
static atomic_int held_state; /* 0 waiting, 1 holding now, 2 released */

static void hold_hook(struct hkv_client *c, enum hkv_test_point point)
{
	int zero = 0;

	if (c != held_handle || (int)point != held_point)
		return;
	if (!atomic_compare_exchange_strong(&held_state, &zero, 1))
		return;
	sleep_ms(400);
	atomic_store(&held_state, 2);
}

struct held_op {
	struct hkv_client *c;
	const char *op, *key, *val;
	uint64_t version, out;
	int rc;
};

static void *held_thread(void *arg)
{
	struct held_op *h = arg;
	const char *k = h->key;

	if (!strcmp(h->op, "incr"))
		h->rc = hkv_incr(h->c, k, strlen(k), 1, &h->out);
	else if (!strcmp(h->op, "set"))
		h->rc = set_str(h->c, k, h->val);
	else if (!strcmp(h->op, "delete"))
		h->rc = hkv_delete(h->c, k, strlen(k));
	else if (!strcmp(h->op, "cas"))
		h->rc = hkv_cas(h->c, k, strlen(k), h->val, strlen(h->val), h->version, NULL);
	return NULL;
}

/* Start op on handle ch, held at point; 0 once it is held (within 5 s). */
static int hold_start(pthread_t *tid, struct held_op *h, int point)
{
	held_handle = h->c;
	held_point = point;
	atomic_store(&held_state, 0);
	hkv_test_hook = hold_hook;
	pthread_create(tid, NULL, held_thread, h);
	for (int64_t end = now_ms() + 5000; now_ms() < end;) {
		if (atomic_load(&held_state) == 1)
			return 0;
		sleep_ms(1);
	}
	fprintf(stderr, "# %s of %s never reached the point (state %d)\n", h->op, h->key,
		atomic_load(&held_state));
	return -1;
}

static void hold_end(pthread_t tid)
{
	pthread_join(tid, NULL);
	hkv_test_hook = NULL;
	held_handle = NULL;
}

static void helper_race(int r, int point, const char *pname)
{
	struct hkv_client *ch, *cb;
	struct hkv_item_info i1, i2;
	struct held_op h;
	pthread_t tid;
	char k[64], buf[64];
	uint64_t n = 0;
	int64_t t0;
	int rc;

	CHECK(ch = repl_open(r));
	CHECK(cb = repl_open(r));
	/* incr held; another incr meanwhile: the held one goes first, once */
	snprintf(k, sizeof(k), "hr%d%s-n", r, pname);
	CHECK_RC(set_str(cb, k, "100"), 0);
	h = (struct held_op){.c = ch, .op = "incr", .key = k};
	CHECK(hold_start(&tid, &h, point) == 0);
	CHECK_RC(read_str(cb, k, buf, sizeof(buf), NULL), 0);
	CHECK(!strcmp(buf, "100")); /* R0 still has the old value */
	t0 = now_ms();
	rc = hkv_incr(cb, k, strlen(k), 10, &n);
	printf("# r = %d, incr held at %s: another incr returned %s, %" PRIu64 " after %lld ms "
	       "(the held one still held: %s)\n", r, pname, hkv_strerror(rc), n,
	       (long long)(now_ms() - t0), atomic_load(&held_state) == 1 ? "yes" : "no");
	hold_end(tid);
	CHECK_RC(rc, 0);
	CHECK(n == 111);
	CHECK_RC(h.rc, 0);
	CHECK(h.out == 101);
	CHECK(held_str(cb, direct, r, k, "111", NULL) == 0);
	/* set held; append meanwhile: "held" then "+b", and the held set does not
	 * come back over it */
	snprintf(k, sizeof(k), "hr%d%s-s", r, pname);
	CHECK_RC(set_str(cb, k, "old"), 0);
	h = (struct held_op){.c = ch, .op = "set", .key = k, .val = "held"};
	CHECK(hold_start(&tid, &h, point) == 0);
	rc = hkv_append(cb, k, strlen(k), "+b", 2, 0);
	hold_end(tid);
	CHECK_RC(rc, 0);
	CHECK_RC(h.rc, 0);
	CHECK(held_str(cb, direct, r, k, "held+b", NULL) == 0);
	/* delete held; add meanwhile: either it finishes the delete first and
	 * stores (then "new" everywhere), or it fails from R0's entry, the
	 * delete not yet in effect (then the delete ends it: absent everywhere) */
	snprintf(k, sizeof(k), "hr%d%s-d", r, pname);
	CHECK_RC(set_str(cb, k, "old"), 0);
	h = (struct held_op){.c = ch, .op = "delete", .key = k};
	CHECK(hold_start(&tid, &h, point) == 0);
	rc = hkv_add(cb, k, strlen(k), "new", 3, NULL);
	hold_end(tid);
	printf("# r = %d, delete held at %s: an add meanwhile %s\n", r, pname, hkv_strerror(rc));
	CHECK(rc == 0 || rc == HKV_EEXISTS);
	CHECK_RC(h.rc, 0);
	if (rc == 0)
		CHECK(held_str(cb, direct, r, k, "new", NULL) == 0);
	else
		CHECK(absent_on(cb, direct, r, k) == 0);
	/* delete held; a set meanwhile: the delete first, then the set */
	snprintf(k, sizeof(k), "hr%d%s-d2", r, pname);
	CHECK_RC(set_str(cb, k, "old"), 0);
	h = (struct held_op){.c = ch, .op = "delete", .key = k};
	CHECK(hold_start(&tid, &h, point) == 0);
	rc = set_str(cb, k, "new");
	hold_end(tid);
	CHECK_RC(rc, 0);
	CHECK_RC(h.rc, 0);
	CHECK(held_str(cb, direct, r, k, "new", NULL) == 0);
	/* cas held; a cas with the version read from R0 meanwhile: too late */
	snprintf(k, sizeof(k), "hr%d%s-c", r, pname);
	CHECK_RC(set_str(cb, k, "old"), 0);
	CHECK_RC(read_str(cb, k, buf, sizeof(buf), &i1), 0);
	h = (struct held_op){.c = ch, .op = "cas", .key = k, .val = "held", .version = i1.version};
	CHECK(hold_start(&tid, &h, point) == 0);
	CHECK_RC(read_str(cb, k, buf, sizeof(buf), &i2), 0);
	CHECK(!strcmp(buf, "old") && i2.version == i1.version);
	rc = hkv_cas(cb, k, strlen(k), "other", 5, i2.version, NULL);
	hold_end(tid);
	CHECK_RC(rc, HKV_EVERSION);
	CHECK_RC(h.rc, 0);
	CHECK(held_str(cb, direct, r, k, "held", &i2) == 0);
	CHECK(i2.version != i1.version);
	hkv_close(ch);
	hkv_close(cb);
}

static void test_helper_race(void)
{
	CHECK(srv_up);
	helper_race(2, HKV_TP_REPL_DECIDED, "decided");
	helper_race(3, HKV_TP_REPL_DECIDED, "decided");
	helper_race(3, HKV_TP_REPL_STEP, "step");
}

/* ---- a writer killed at a point --------------------------------------------------------------- */

/* Run a victim on key (r, point, op, arg) and check it died there. */
static int kill_writer(int r, const char *point, const char *op, const char *key, const char *arg)
{
	struct victim v;

	if (victim_start(&v, point, op, key, arg, main_list, r) || victim_wait(&v, 30000))
		return -1;
	if (!v.killed) {
		fprintf(stderr, "# %s %s (r = %d) did not reach the point %s: it returned %s\n", op,
			key, r, point, hkv_strerror(v.rc));
		return -1;
	}
	return 0;
}

/* On replica i directly, key reads val (NULL: absent). */
static int replica_reads(int i, const char *key, const char *val)
{
	char buf[64];
	int rc = read_str(direct[i], key, buf, sizeof(buf), NULL);

	if (val ? rc == 0 && !strcmp(buf, val) : rc == HKV_ENOTFOUND)
		return 0;
	fprintf(stderr, "# R%d direct: %s reads %s \"%s\", wanted %s\n", i, key, hkv_strerror(rc),
		buf, val ? val : "absent");
	return -1;
}

/* After a writer of key died at the point (`has` replicas from the decider
 * down hold newv, the others oldv): what each replica and the replicated
 * handle read. */
static int pending_state(struct hkv_client *c, int r, int has, const char *key, const char *oldv,
			 const char *newv)
{
	char buf[64];
	int rc = read_str(c, key, buf, sizeof(buf), NULL), bad = 0;

	if (oldv ? rc != 0 || strcmp(buf, oldv) : rc != HKV_ENOTFOUND) {
		fprintf(stderr, "# %s through the replicated handle: %s \"%s\", wanted %s (R0's "
			"old value)\n", key, hkv_strerror(rc), buf, oldv ? oldv : "absent");
		bad = 1;
	}
	for (int i = 0; i < r; i++)
		bad |= replica_reads(i, key, i >= r - has ? newv : oldv) != 0;
	return bad ? -1 : 0;
}

static void writer_killed(int r, const char *point, int has)
{
	struct hkv_client *c;
	struct hkv_item_info i1, i2;
	char k[64], buf[64];
	uint64_t n = 0;
	int rc;

	CHECK(c = repl_open(r));
	/* set, then an append by another: the set first */
	snprintf(k, sizeof(k), "wk%d%s-set", r, point);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, point, "setstr", k, "child") == 0);
	CHECK(pending_state(c, r, has, k, "old", "child") == 0);
	CHECK_RC(hkv_append(c, k, strlen(k), "X", 1, 0), 0);
	CHECK(held_str(c, direct, r, k, "childX", NULL) == 0);
	/* incr: applied once, before ours */
	snprintf(k, sizeof(k), "wk%d%s-incr", r, point);
	CHECK_RC(set_str(c, k, "10"), 0);
	CHECK(kill_writer(r, point, "incr", k, "5") == 0);
	CHECK(pending_state(c, r, has, k, "10", "15") == 0);
	CHECK_RC(hkv_incr(c, k, strlen(k), 1, &n), 0);
	CHECK(n == 16);
	CHECK(held_str(c, direct, r, k, "16", NULL) == 0);
	/* delete (a tombstone on the decider), then an add */
	snprintf(k, sizeof(k), "wk%d%s-del", r, point);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, point, "delete", k, "-") == 0);
	CHECK(pending_state(c, r, has, k, "old", NULL) == 0);
	rc = hkv_add(c, k, strlen(k), "new", 3, NULL);
	if (r == 2 && !strcmp(point, "decided"))
		printf("# a delete killed after deciding, then an add: %s\n", hkv_strerror(rc));
	CHECK(rc == 0 || rc == HKV_EEXISTS);
	if (rc == HKV_EEXISTS) { /* nothing done: R0 still has it, the delete pending */
		CHECK(pending_state(c, r, has, k, "old", NULL) == 0);
		CHECK_RC(hkv_add(c, k, strlen(k), "new", 3, NULL), HKV_EEXISTS);
		CHECK_RC(set_str(c, k, "new"), 0);
	}
	CHECK(held_str(c, direct, r, k, "new", NULL) == 0);
	/* delete, then a delete by another: not found (the first went first) */
	snprintf(k, sizeof(k), "wk%d%s-del2", r, point);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, point, "delete", k, "-") == 0);
	rc = hkv_delete(c, k, strlen(k));
	CHECK(rc == 0 || rc == HKV_ENOTFOUND);
	CHECK(absent_on(c, direct, r, k) == 0);
	CHECK_RC(hkv_add(c, k, strlen(k), "again", 5, NULL), 0);
	CHECK(held_str(c, direct, r, k, "again", NULL) == 0);
	/* add of an absent key (an insert), then an add by another: exists */
	snprintf(k, sizeof(k), "wk%d%s-add", r, point);
	CHECK(kill_writer(r, point, "add", k, "child") == 0);
	CHECK(pending_state(c, r, has, k, NULL, "child") == 0);
	CHECK_RC(hkv_add(c, k, strlen(k), "p", 1, NULL), HKV_EEXISTS);
	CHECK(held_str(c, direct, r, k, "child", NULL) == 0);
	/* set, then a cas with the version R0 still shows: too late */
	snprintf(k, sizeof(k), "wk%d%s-cas", r, point);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, point, "setstr", k, "child") == 0);
	CHECK_RC(read_str(c, k, buf, sizeof(buf), &i1), 0);
	CHECK(!strcmp(buf, "old"));
	CHECK_RC(hkv_cas(c, k, strlen(k), "p", 1, i1.version, NULL), HKV_EVERSION);
	CHECK(held_str(c, direct, r, k, "child", &i2) == 0);
	CHECK_RC(hkv_cas(c, k, strlen(k), "p", 1, i2.version, NULL), 0);
	CHECK(held_str(c, direct, r, k, "p", NULL) == 0);
	/* set, then a plain set by another */
	snprintf(k, sizeof(k), "wk%d%s-set2", r, point);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, point, "setstr", k, "child") == 0);
	CHECK_RC(set_str(c, k, "parent"), 0);
	CHECK(held_str(c, direct, r, k, "parent", NULL) == 0);
	/* two writers killed in a row on one key: the second finishes the first,
	 * then dies with its own decided; the next write finishes both */
	snprintf(k, sizeof(k), "wk%d%s-two", r, point);
	CHECK_RC(set_str(c, k, "a"), 0);
	CHECK(kill_writer(r, point, "append", k, "b") == 0);
	CHECK(kill_writer(r, point, "append", k, "c") == 0);
	CHECK(replica_reads(r - 1, k, "abc") == 0);
	CHECK_RC(hkv_append(c, k, strlen(k), "d", 1, 0), 0);
	CHECK(held_str(c, direct, r, k, "abcd", NULL) == 0);
	hkv_close(c);
}

static void test_writer_killed(void)
{
	CHECK(srv_up);
	writer_killed(2, "decided", 1);
	writer_killed(3, "decided", 1);
	writer_killed(3, "step", 2);
}

/* ---- flush_all, cache mode -------------------------------------------------------------------- */

/* Round trips (the transport's counters, summed over the replicas) of one
 * op of each kind on handle c: a warm get, an insert of a new key, a warm
 * update (set), incr, delete; *rt[5] in that order. */
static void rounds_of(struct hkv_client *c, const char *tag, uint64_t rt[5])
{
	char k[32], n[32];
	uint64_t t0, t1, x, y, v;
	size_t len;

	snprintf(k, sizeof(k), "rounds-%s", tag);
	snprintf(n, sizeof(n), "rounds-n-%s", tag);
	set_str(c, k, "warm"); /* (warm: its locations cached everywhere, */
	set_str(c, n, "1");    /* and blocks of the class held on every replica) */
	for (int i = 0; i < 8; i++) {
		char w[32];

		snprintf(w, sizeof(w), "rounds-w%d-%s", i, tag);
		set_str(c, w, "new");
		set_str(c, w, "update");
		hkv_incr(c, n, strlen(n), 1, &v);
		hkv_delete(c, w, strlen(w));
	}
	hkv_get(c, k, strlen(k), (char[16]){0}, 16, &len, NULL);
#define RT_OF(slot, call)                                                                  \
	do {                                                                               \
		hkv_client_totals(c, &t0, &x, &y);                                         \
		call;                                                                      \
		hkv_client_totals(c, &t1, &x, &y);                                         \
		rt[slot] = t1 - t0;                                                        \
	} while (0)
	RT_OF(0, hkv_get(c, k, strlen(k), (char[16]){0}, 16, &len, NULL));
	snprintf(k, sizeof(k), "rounds-new-%s", tag);
	RT_OF(1, set_str(c, k, "new"));
	set_str(c, k, "update0");
	RT_OF(2, set_str(c, k, "update"));
	RT_OF(3, hkv_incr(c, n, strlen(n), 1, &v));
	RT_OF(4, hkv_delete(c, k, strlen(k)));
#undef RT_OF
}

/* Round trips per operation at r = 1 (a direct handle), 2 and 3: a GET is
 * one READ of the primary whatever r; a warm update takes 2 per replica
 * (READ + WRITE/CAS/CAS) and the primary's READ; printed for the README. */
static void test_rounds(void)
{
	static const char *what[5] = {"get", "insert", "update", "incr", "delete"};
	uint64_t rt[4][5];

	CHECK(srv_up);
	rounds_of(direct[0], "r1", rt[1]);
	for (int r = 2; r <= 3; r++) {
		struct hkv_client *c = repl_open(r);
		char tag[8];

		CHECK(c);
		snprintf(tag, sizeof(tag), "r%d", r);
		rounds_of(c, tag, rt[r]);
		hkv_close(c);
	}
	printf("# round trips per op (transport counters) r=1 / r=2 / r=3:");
	for (int i = 0; i < 5; i++)
		printf(" %s %llu/%llu/%llu%s", what[i], (unsigned long long)rt[1][i],
		       (unsigned long long)rt[2][i], (unsigned long long)rt[3][i], i < 4 ? "," : "\n");
	/* a GET: one READ of the primary; a warm update: R0's READ, READ +
	 * publish per other replica, R0's publish on that READ's view: 2r (+1
	 * where a replica's handle claims more blocks, a round trip per up to
	 * 16 writes); a delete: the same for its tombstone, then the tombstone
	 * reclaimed, mark + slot CAS per replica on the location its step
	 * recorded: 4r */
	for (int r = 2; r <= 3; r++) {
		CHECK(rt[r][0] == 1);
		CHECK(rt[r][2] >= 2 * (uint64_t)r && rt[r][2] <= 3 * (uint64_t)r);
		CHECK(rt[r][4] >= 4 * (uint64_t)r && rt[r][4] <= 5 * (uint64_t)r);
	}
}

/* (own servers: the shared ones hold keys tests wrote on one replica only) */
static void test_flush(void)
{
	struct hkvserver s[2], *list[2] = {&s[0], &s[1]};
	struct hkv_client *c = NULL, *d[2] = {NULL, NULL};
	struct hkv_config *cfg = NULL;
	char k[32], buf[16];
	uint64_t items, bytes;
	size_t n;
	int left = 0;

	memset(s, 0, sizeof(s));
	for (int i = 0; i < 2; i++)
		CHECK(start_server(&s[i], 0) == 0);
	CHECK(cfg = repl_config(list, 2, 0));
	CHECK(c = repl_open_cfg(cfg, 2));
	for (int i = 0; i < 2; i++)
		CHECK(d[i] = direct_open(&s[i], 0));
	for (int i = 0; i < 500; i++) {
		snprintf(k, sizeof(k), "flush-k%d", i);
		CHECK_RC(set_str(c, k, "v"), 0);
	}
	CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
	CHECK(items == 500);
	CHECK_RC(hkv_delete(c, "flush-k7", 8), 0);
	/* the replicated handle counts keys; the delete's tombstone is gone
	 * from each replica's index again (reclaimed) */
	CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
	CHECK(items == 499);
	for (int i = 0; i < 2; i++) {
		CHECK_RC(hkv_count_items(d[i], &items, &bytes), 0);
		CHECK(items == 499);
	}
	CHECK_RC(hkv_flush_all(c), 0);
	CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
	CHECK(items == 0 && bytes == 0);
	for (int i = 0; i < 2; i++) { /* (no tombstones left behind either) */
		CHECK_RC(hkv_count_items(d[i], &items, &bytes), 0);
		CHECK(items == 0);
	}
	for (int i = 0; i < 500; i++) {
		snprintf(k, sizeof(k), "flush-k%d", i);
		left += hkv_get(c, k, strlen(k), buf, sizeof(buf), &n, NULL) != HKV_ENOTFOUND;
		for (int r = 0; r < 2; r++)
			left += hkv_get(d[r], k, strlen(k), buf, sizeof(buf), &n, NULL) !=
				HKV_ENOTFOUND;
	}
	CHECK(left == 0);
	/* the keys are writable again, on both replicas */
	CHECK_RC(hkv_add(c, "flush-k1", 8, "w", 1, NULL), 0);
	CHECK(held_str(c, d, 2, "flush-k1", "w", NULL) == 0);
	for (int i = 0; i < 2; i++) {
		hkv_close(d[i]);
		hkvserver_stop(&s[i]);
	}
	hkv_close(c);
	hkv_config_free(cfg);
}

static void test_cache_refused(void)
{
	struct hkvserver cs;
	struct hkvserver *ab[2] = {&srv[0], &cs}, *ba[2] = {&cs, &srv[0]};
	struct hkv_config *cfg;
	struct hkv_client *c = NULL, *d;
	int rc;

	CHECK(srv_up);
	CHECK(start_server(&cs, 1) == 0);
	CHECK(d = direct_open(&cs, 0)); /* the server itself works */
	CHECK_RC(set_str(d, "cache-k", "v"), 0);
	hkv_close(d);
	CHECK(cfg = repl_config(ab, 2, 0));
	rc = hkv_open(cfg, &c);
	hkv_config_free(cfg);
	printf("# store + cache server: %s\n", hkv_strerror(rc));
	CHECK_RC(rc, -ENOTSUP);
	CHECK(!c);
	CHECK(cfg = repl_config(ba, 2, 0));
	rc = hkv_open(cfg, &c);
	hkv_config_free(cfg);
	printf("# cache + store server: %s\n", hkv_strerror(rc));
	CHECK_RC(rc, -ENOTSUP);
	CHECK(!c);
	hkvserver_stop(&cs);
}

/* ---- a replica lost (servers of their own) --------------------------------------------------- */

#define DOWN_KEYS    8
#define DOWN_TIMEOUT 2000

static struct hkv_client *cut_handle;
static struct hkvserver *cut_server;

/* Kill cut_server the first time cut_handle's write has decided. */
static void cut_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c == cut_handle && point == HKV_TP_REPL_DECIDED && cut_server) {
		hkvserver_kill(cut_server);
		cut_server = NULL;
	}
}

/*
 * r over fresh servers; replica `victim` (0 the primary, r - 1 the decider)
 * SIGKILLed: between writes, or (cut) inside one, just after it decided, so
 * it must report HKV_EUNKNOWN (or success, had it reached every replica)
 * and the decider hold it. Then writes must fail (each within twice the
 * timeout and a second), the first soon after the kill; what was
 * acknowledged is still there: through the handle while the primary lives
 * (whose reads fail once it is gone), and on the decider directly, with the
 * version acknowledged.
 */
static void replica_down(int r, int victim, int cut)
{
	struct hkvserver s[NSRV], *list[NSRV] = {&s[0], &s[1], &s[2]};
	struct hkv_config *cfg = NULL;
	struct hkv_client *c = NULL, *d[NSRV] = {NULL, NULL, NULL};
	char key[DOWN_KEYS][32], acked[DOWN_KEYS][32], maybe[DOWN_KEYS][32];
	const char *who = victim == 0 ? "primary" : victim == r - 1 ? "decider" : "middle replica";
	uint64_t aver[DOWN_KEYS];
	int64_t t_kill, first_fail = -1, worst = 0;
	int fails_in_row = 0, unknown = 0, other = 0, round = 0, rc;
	int dec = r - 1;

	memset(s, 0, sizeof(s));
	for (int i = 0; i < r; i++)
		CHECK(start_server(&s[i], 0) == 0);
	CHECK(cfg = repl_config(list, r, DOWN_TIMEOUT));
	CHECK(c = repl_open_cfg(cfg, r));
	for (int i = 0; i < r; i++)
		CHECK(d[i] = direct_open(&s[i], DOWN_TIMEOUT));
	for (int i = 0; i < DOWN_KEYS; i++) {
		snprintf(key[i], sizeof(key[i]), "down%d%d%d-%d", r, victim, cut, i);
		snprintf(acked[i], sizeof(acked[i]), "v0-%d", i);
		maybe[i][0] = 0;
		CHECK_RC(set_str(c, key[i], acked[i]), 0);
		aver[i] = hkv_last_version(c);
		CHECK(held_str(c, d, r, key[i], acked[i], NULL) == 0);
	}
	if (cut) {
		cut_handle = c;
		cut_server = &s[victim];
		hkv_test_hook = cut_hook;
		rc = set_str(c, key[0], "cut");
		hkv_test_hook = NULL;
		t_kill = now_ms();
		printf("# r = %d, the %s killed inside a set, after it decided: %s\n", r, who,
		       hkv_strerror(rc));
		CHECK(!cut_server); /* it did reach the point */
		CHECK(rc == HKV_EUNKNOWN || rc == 0);
		{
			char buf[64];
			int drc = read_str(d[dec], key[0], buf, sizeof(buf), NULL);

			printf("# the decider directly: %s \"%s\"\n", hkv_strerror(drc), buf);
			CHECK(drc == 0 && !strcmp(buf, "cut"));
		}
		if (rc == 0) {
			snprintf(acked[0], sizeof(acked[0]), "cut");
			aver[0] = hkv_last_version(c);
		} else {
			snprintf(maybe[0], sizeof(maybe[0]), "cut");
		}
	} else {
		hkvserver_kill(&s[victim]);
		t_kill = now_ms();
	}
	/* write until writes fail, 10 s at most: after the first failure, 2 x
	 * DOWN_KEYS more writes must all fail */
	while (now_ms() - t_kill < 10000 && fails_in_row < 2 * DOWN_KEYS) {
		int i = round % DOWN_KEYS;
		char val[32];
		int64_t t0 = now_ms(), dt;

		snprintf(val, sizeof(val), "v%d-%d", ++round, i);
		rc = set_str(c, key[i], val);
		dt = now_ms() - t0;
		worst = dt > worst ? dt : worst;
		if (!rc) {
			fails_in_row = 0;
			snprintf(acked[i], sizeof(acked[i]), "%s", val);
			aver[i] = hkv_last_version(c);
			maybe[i][0] = 0;
			continue;
		}
		if (first_fail < 0)
			first_fail = now_ms() - t_kill;
		fails_in_row++;
		unknown += rc == HKV_EUNKNOWN;
		other += rc != HKV_EUNKNOWN;
		if (rc == HKV_EUNKNOWN) /* may have taken effect */
			snprintf(maybe[i], sizeof(maybe[i]), "%s", val);
		if (fails_in_row == 1 || dt > 100)
			printf("# the %s down: set %s -> %s after %lld ms\n", who, key[i],
			       hkv_strerror(rc), (long long)dt);
	}
	printf("# r = %d, the %s killed: first write failed %lld ms after (timeout %d ms), %d "
	       "writes, %d failed with HKV_EUNKNOWN, %d with another error, slowest %lld ms\n", r,
	       who, (long long)first_fail, DOWN_TIMEOUT, round, unknown, other, (long long)worst);
	CHECK(first_fail >= 0 && first_fail < 2 * DOWN_TIMEOUT + 3000);
	CHECK(fails_in_row >= 2 * DOWN_KEYS);
	CHECK(worst < 2 * DOWN_TIMEOUT + 1000);
	/* what was acknowledged is still there (or the write of unknown outcome
	 * since): on R0 through the handle while it lives; on the decider
	 * directly, with the version acknowledged, while it lives */
	for (int i = 0; i < DOWN_KEYS; i++) {
		for (int via_i = 0; via_i < 2; via_i++) {
			struct hkv_client *via = via_i == 0 ? c : d[dec];
			struct hkv_item_info info;
			char buf[64];

			if ((via_i == 0 && victim == 0) || (via_i == 1 && victim == dec))
				continue;
			rc = read_str(via, key[i], buf, sizeof(buf), &info);
			if (rc || (strcmp(buf, acked[i]) && strcmp(buf, maybe[i])))
				fprintf(stderr, "# %s %s after the %s died: %s \"%s\", wanted \"%s\"%s%s\n",
					via_i ? "the decider directly:" : "through the handle:", key[i], who,
					hkv_strerror(rc), buf, acked[i], maybe[i][0] ? " or " : "",
					maybe[i]);
			CHECK_RC(rc, 0);
			CHECK(!strcmp(buf, acked[i]) || !strcmp(buf, maybe[i]));
			if (!strcmp(buf, acked[i]))
				CHECK(info.version == aver[i]);
			/* the decider holds every decided write: the cut one too */
			if (via_i == 1 && maybe[i][0] && i == 0 && cut)
				CHECK(!strcmp(buf, maybe[i]));
		}
	}
	if (victim == 0) { /* the primary gone: reads through the handle fail too */
		char buf[64];

		rc = 0;
		for (int64_t end = now_ms() + 2 * DOWN_TIMEOUT + 3000; !rc && now_ms() < end;)
			rc = read_str(c, key[1], buf, sizeof(buf), NULL);
		printf("# the primary down: a get through the handle: %s\n", hkv_strerror(rc));
		CHECK(rc < 0 && rc != HKV_ENOTFOUND);
	}
	hkv_close(c);
	for (int i = 0; i < r; i++)
		hkv_close(d[i]);
	hkv_config_free(cfg);
	for (int i = 0; i < r; i++)
		hkvserver_stop(&s[i]);
}

static void test_backup_down(void)
{
	replica_down(2, 1, 0);
}

static void test_primary_down(void)
{
	replica_down(2, 0, 0);
}

/* ---- tombstones are reclaimed ------------------------------------------------------ */

#define CHURN_THREADS 2
/* keys per thread (every one deleted but 1 in 8): 3000, or HKV_CHURN_KEYS
 * for a longer run by hand (docs/benchmarks.md) */
static int churn_keys(void)
{
	const char *e = getenv("HKV_CHURN_KEYS");

	return e && atoi(e) > 0 ? atoi(e) : 3000;
}
#define CHURN_KEYS churn_keys()

struct churn {
	struct hkv_config *cfg;
	int id, errors, live;
	uint64_t reclaimed;
};

/* Key i of a churn thread stays (1 in 8 of the first 3000: at most 750 in
 * all, whatever HKV_CHURN_KEYS says); every other one is deleted. */
static int churn_kept(int i)
{
	return !(i % 8) && i < 3000;
}

static void *churn_thread(void *arg)
{
	struct churn *t = arg;
	struct hkv_client *c = repl_open_cfg(t->cfg, 2);
	char k[32], v[32];

	if (!c) {
		t->errors++;
		return NULL;
	}
	for (int i = 0; i < CHURN_KEYS; i++) {
		int rc;

		snprintf(k, sizeof(k), "churn-%d-%d", t->id, i);
		snprintf(v, sizeof(v), "v%d-%d", t->id, i);
		if ((rc = set_str(c, k, v)) ||
		    (!churn_kept(i) && (rc = hkv_delete(c, k, strlen(k))))) {
			if (t->errors++ < 3)
				fprintf(stderr, "# churn %s: %s\n", k, hkv_strerror(rc));
			continue;
		}
		t->live += churn_kept(i);
	}
	{
		struct hkv_client_stats st;

		hkv_client_stats(c, &st);
		t->reclaimed = st.repl_reclaimed;
	}
	hkv_close(c);
	return NULL;
}

/*
 * Set/delete churn over 6000 distinct keys on two servers whose indexes
 * have 4096 slots each: kept, every tombstone would hold a slot and the
 * stores would refuse new keys after ~4000 (HKV_EFULL). Reclaimed, the
 * indexes hold the 750 live keys and nothing else.
 */
static void test_reclaim_churn(void)
{
	const char *extra[] = {"--token-file", token_file, "--index-slots", "4096", NULL};
	struct hkvserver s[2], *list[2] = {&s[0], &s[1]};
	struct hkv_client *c = NULL, *d[2] = {NULL, NULL};
	struct churn t[CHURN_THREADS];
	pthread_t th[CHURN_THREADS];
	uint64_t items, bytes, live_bytes = 0, reclaimed = 0, t0 = (uint64_t)now_ns();
	int live = 0, errors = 0, wrong = 0;
	char k[32], v[32], buf[32];

	memset(s, 0, sizeof(s));
	for (int i = 0; i < 2; i++)
		CHECK(hkvserver_start_noclient(&s[i], use_verbs, "32M", SEGMENT, extra) == 0);
	for (int i = 0; i < 2; i++)
		CHECK(d[i] = direct_open(&s[i], 0));
	for (int i = 0; i < CHURN_THREADS; i++) {
		t[i] = (struct churn){.cfg = repl_config(list, 2, 0), .id = i};
		CHECK(t[i].cfg);
		CHECK(pthread_create(&th[i], NULL, churn_thread, &t[i]) == 0);
	}
	for (int i = 0; i < CHURN_THREADS; i++) {
		pthread_join(th[i], NULL);
		live += t[i].live;
		errors += t[i].errors;
		reclaimed += t[i].reclaimed;
		hkv_config_free(t[i].cfg);
	}
	CHECK(errors == 0);
	/* distinct keys per thread: no race, every delete's reclamation done */
	CHECK(reclaimed == (uint64_t)(CHURN_THREADS * CHURN_KEYS - live));
	CHECK(c = repl_open_cfg(t[0].cfg = repl_config(list, 2, 0), 2));
	for (int id = 0; id < CHURN_THREADS; id++)
		for (int i = 0; i < CHURN_KEYS; i++) {
			int rc;

			snprintf(k, sizeof(k), "churn-%d-%d", id, i);
			snprintf(v, sizeof(v), "v%d-%d", id, i);
			rc = read_str(c, k, buf, sizeof(buf), NULL);
			wrong += !churn_kept(i) ? rc != HKV_ENOTFOUND : rc != 0 || strcmp(buf, v);
		}
	CHECK(wrong == 0);
	for (int i = 0; i < 2; i++) {
		CHECK_RC(hkv_count_items(d[i], &items, &bytes), 0);
		printf("# churn: %d keys set, %d deleted, %d live: R%d's index holds %" PRIu64
		       " entries (%" PRIu64 " bytes of blocks), %.1f s, %llu tombstones reclaimed\n",
		       CHURN_THREADS * CHURN_KEYS, CHURN_THREADS * CHURN_KEYS - live, live, i, items,
		       bytes, (double)((uint64_t)now_ns() - t0) / 1e9,
		       (unsigned long long)reclaimed);
		CHECK(items == (uint64_t)live); /* not a tombstone left */
		if (!i)
			live_bytes = bytes;
		CHECK(bytes == live_bytes);
	}
	CHECK_RC(hkv_count_items(c, &items, &bytes), 0);
	CHECK(items == (uint64_t)live);
	hkv_close(c);
	hkv_config_free(t[0].cfg);
	for (int i = 0; i < 2; i++) {
		hkv_close(d[i]);
		hkvserver_stop(&s[i]);
	}
}

/* A writer stopped right after deciding an insert (from absent), until its
 * write was finished by a helper, overwritten, deleted and reclaimed. */
static struct hkv_client *stalled_handle;
static atomic_int stalled_at; /* 0 running, 1 stopped at the point, 2 go on */

static void decided_stop_hook(struct hkv_client *c, enum hkv_test_point point)
{
	if (c != stalled_handle || point != HKV_TP_REPL_DECIDED || atomic_load(&stalled_at))
		return;
	atomic_store(&stalled_at, 1);
	while (atomic_load(&stalled_at) != 2)
		usleep(1000);
}

struct stale_add {
	struct hkv_client *c;
	const char *key;
	int rc;
};

static void *stale_add_thread(void *arg)
{
	struct stale_add *a = arg;

	a->rc = hkv_add(a->c, a->key, strlen(a->key), "stale", 5, NULL);
	return NULL;
}

static void stale_insert_step(int r)
{
	struct hkv_client *c = repl_open(r), *x = repl_open(r);
	struct stale_add a = {.c = x};
	char k[32];
	pthread_t th;

	CHECK(c && x);
	snprintf(k, sizeof(k), "stale-insert-r%d", r);
	a.key = k;
	stalled_handle = x;
	atomic_store(&stalled_at, 0);
	hkv_test_hook = decided_stop_hook;
	CHECK(pthread_create(&th, NULL, stale_add_thread, &a) == 0);
	for (int i = 0; i < 5000 && !atomic_load(&stalled_at); i++)
		usleep(1000);
	CHECK(atomic_load(&stalled_at) == 1); /* decided on R(r-1), nowhere else */
	CHECK_RC(set_str(c, k, "v2"), 0);     /* finishes the add first (a helper) */
	CHECK(held_str(c, direct, r, k, "v2", NULL) == 0);
	CHECK_RC(hkv_delete(c, k, strlen(k)), 0);
	CHECK(absent_on(c, direct, r, k) == 0);
	atomic_store(&stalled_at, 2); /* its next step, from absent, onto R(r-2) */
	pthread_join(th, NULL);
	hkv_test_hook = NULL;
	/* its add took effect (before the set): success; nothing comes back */
	printf("# r = %d: an add stopped after deciding, then finished by a helper, "
	       "overwritten, deleted and reclaimed; it goes on: %s\n", r, hkv_strerror(a.rc));
	CHECK_RC(a.rc, 0);
	CHECK(absent_on(c, direct, r, k) == 0);
	CHECK_RC(hkv_add(c, k, strlen(k), "again", 5, NULL), 0);
	CHECK(held_str(c, direct, r, k, "again", NULL) == 0);
	hkv_close(x);
	hkv_close(c);
}

static void test_stale_insert_step(void)
{
	CHECK(srv_up);
	stale_insert_step(2);
	stale_insert_step(3);
}

/* A delete killed after reclaiming its tombstone on the decider only. */
static void reclaim_killed(int r)
{
	struct hkv_client *c = repl_open(r);
	char k[32];
	int rc;

	CHECK(c);
	/* then an add: it finishes the reclamation first */
	snprintf(k, sizeof(k), "rk%d-add", r);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, "reclaim", "delete", k, "-") == 0);
	CHECK(absent_on(c, direct, r, k) == 0);
	CHECK_RC(hkv_add(c, k, strlen(k), "new", 3, NULL), 0);
	CHECK(held_str(c, direct, r, k, "new", NULL) == 0);
	/* then a delete of nothing, a set and a delete */
	snprintf(k, sizeof(k), "rk%d-set", r);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, "reclaim", "delete", k, "-") == 0);
	CHECK_RC(hkv_delete(c, k, strlen(k)), HKV_ENOTFOUND);
	CHECK_RC(hkv_replace(c, k, strlen(k), "r", 1, NULL), HKV_ENOTFOUND);
	CHECK_RC(set_str(c, k, "new"), 0);
	CHECK(held_str(c, direct, r, k, "new", NULL) == 0);
	CHECK_RC(hkv_delete(c, k, strlen(k)), 0);
	CHECK(absent_on(c, direct, r, k) == 0);
	/* then an add by a writer stopped after it decided, killed there */
	snprintf(k, sizeof(k), "rk%d-two", r);
	CHECK_RC(set_str(c, k, "old"), 0);
	CHECK(kill_writer(r, "reclaim", "delete", k, "-") == 0);
	CHECK(kill_writer(r, "decided", "add", k, "child") == 0);
	rc = hkv_add(c, k, strlen(k), "p", 1, NULL);
	CHECK_RC(rc, HKV_EEXISTS); /* the child's add, finished by this one */
	CHECK(held_str(c, direct, r, k, "child", NULL) == 0);
	hkv_close(c);
}

static void test_reclaim_killed(void)
{
	CHECK(srv_up);
	reclaim_killed(2);
	reclaim_killed(3);
}

/* The primary, and (r = 3) the middle replica, killed just after a write decided. */
static void test_cut_after_deciding(void)
{
	replica_down(2, 0, 1);
	replica_down(3, 1, 1);
	replica_down(3, 0, 1);
}

/* ------------------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	int quick = argc > 2 && !strcmp(argv[2], "--quick");

	if (argc > 1 && !strcmp(argv[1], "--victim"))
		return victim_main(argc, argv);
	use_verbs = hkvserver_want_verbs(argc, argv);
	if (use_verbs)
		hkv_test_need_rdma(hkv_verbs_available(), "no RDMA device on this host");
	prm = use_verbs ? verbs_params : quick ? quick_params : shm_params;
	if (make_token()) {
		fprintf(stderr, "cannot write a token file\n");
		return 1;
	}
	srv_up = 1;
	for (int i = 0; i < NSRV && srv_up; i++) {
		srv_up = start_server(&srv[i], 0) == 0 && (direct[i] = direct_open(&srv[i], 0));
		if (!srv_up)
			fprintf(stderr, "cannot start hatchkv-server %d\n", i);
	}
	RUN_TEST(test_config);
	RUN_TEST(test_basic);
	RUN_TEST(test_reads_primary);
	RUN_TEST(test_expiry);
	RUN_TEST(test_expired_read_directly);
	RUN_TEST(test_many_keys);
	RUN_TEST(test_pipe);
	RUN_TEST(test_checker);
	RUN_TEST(test_helper_race);
	RUN_TEST(test_writer_killed);
	RUN_TEST(test_checker_victims);
	RUN_TEST(test_rounds);
	RUN_TEST(test_flush);
	RUN_TEST(test_cache_refused);
	RUN_TEST(test_reclaim_churn);
	RUN_TEST(test_stale_insert_step);
	RUN_TEST(test_reclaim_killed);
	for (int i = 0; i < NSRV; i++) {
		if (direct[i])
			hkv_close(direct[i]);
		if (srv[i].pid)
			hkvserver_stop(&srv[i]);
	}
	/* destructive: servers of their own */
	RUN_TEST(test_backup_down);
	RUN_TEST(test_primary_down);
	RUN_TEST(test_cut_after_deciding);
	unlink(token_file);
	rmdir(work_dir);
	return hkv_test_finish();
}
