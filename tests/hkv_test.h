/*
 * hkv_test.h - a minimal test harness: CHECK macros that report file:line and
 * count failures, a TAP-ish "ok/not ok" line per test, and the rule for the
 * RDMA tier: exit 77 (ctest SKIP) with a reason when no RDMA device exists,
 * unless HKV_REQUIRE_RDMA is set (CI, the Soft-RoCE guest), then fail.
 */
#ifndef HKV_TEST_H
#define HKV_TEST_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hatchkv_err.h"

extern int hkv_test_failures;

#define CHECK(cond)                                                                         \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
				#cond);                                                     \
			hkv_test_failures++;                                                \
			return;                                                             \
		}                                                                           \
	} while (0)

#define CHECK_RC(expr, want)                                                                \
	do {                                                                                \
		int rc_ = (expr);                                                           \
		if (rc_ != (want)) {                                                        \
			fprintf(stderr, "%s:%d: %s returned %d (%s), wanted %d (%s)\n",     \
				__FILE__, __LINE__, #expr, rc_, hkv_strerror(rc_), (want),  \
				hkv_strerror(want));                                        \
			hkv_test_failures++;                                                \
			return;                                                             \
		}                                                                           \
	} while (0)

/* Does the space-separated list name the test (a whole word)? */
static inline int hkv_test_listed(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; (p = strstr(p, name)); p += n)
		if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n]))
			return 1;
	return 0;
}

/* HKV_TEST_ONLY="test_a test_b": run just those (while developing, and to
 * pick a tier's subset). */
#define RUN_TEST(fn)                                                                        \
	do {                                                                                \
		int before_ = hkv_test_failures;                                            \
		const char *only_ = getenv("HKV_TEST_ONLY");                                \
		if (only_ && !hkv_test_listed(only_, #fn))                                  \
			break;                                                              \
		fn();                                                                       \
		printf("%s - %s\n", hkv_test_failures == before_ ? "ok" : "not ok", #fn);   \
		fflush(stdout);                                                             \
	} while (0)

#define HKV_TEST_MAIN_DEFS int hkv_test_failures

/* Exit 77 (skip) or 1 (required but missing) when the RDMA tier cannot run. */
static inline void hkv_test_need_rdma(int available, const char *why)
{
	if (available)
		return;
	if (getenv("HKV_REQUIRE_RDMA")) {
		fprintf(stderr, "FAIL: RDMA required (HKV_REQUIRE_RDMA) but %s\n", why);
		exit(1);
	}
	printf("SKIP: %s (run through scripts/softroce-run for the Soft-RoCE tier)\n", why);
	fflush(stdout);
	exit(77);
}

/* How many RDMA devices the kernel lists (sysfs: opens no device, so a
 * process that must hold none can ask). */
static inline int hkv_test_rdma_devices(void)
{
	struct dirent *e;
	int n = 0;
	DIR *d = opendir("/sys/class/infiniband");

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * CHECK_PASSES(helper(...)): run a helper that CHECKs (a void function that
 * returns at its first failed check) and return from the caller too if any
 * of its checks failed, saying where: no test carries on from a failed setup
 * into a crash.
 */
#define CHECK_PASSES(call)                                                                  \
	do {                                                                                \
		int failures_ = hkv_test_failures;                                          \
		call;                                                                       \
		if (hkv_test_failures != failures_) {                                       \
			fprintf(stderr, "%s:%d: failed in %s\n", __FILE__, __LINE__, #call); \
			return;                                                             \
		}                                                                           \
	} while (0)

/* Remove a --memory-file region and the server's record of its geometry
 * (PATH.geom, server/store.c). */
static inline void hkv_test_unlink_region(const char *path)
{
	char geom[4096];

	snprintf(geom, sizeof(geom), "%s.geom", path);
	unlink(path);
	unlink(geom);
}

static inline int hkv_test_finish(void)
{
	printf("%s: %d failure(s)\n", hkv_test_failures ? "FAILED" : "PASSED", hkv_test_failures);
	return hkv_test_failures ? 1 : 0;
}

#endif /* HKV_TEST_H */
