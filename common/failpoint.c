/*
 * failpoint.c - HKV_STALL's stall points (failpoint.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/failpoint.h"
#include "common/log.h"

#define FP_MAX  16
#define FP_NAME 32

static struct failpoint {
	char name[FP_NAME];
	unsigned ms;
	atomic_uint left; /* stalls still to make */
} points[FP_MAX];
static int npoints;
int hkv_failpoints_on;

/* One "name:ms[:times]" of HKV_STALL; 0 or -1. */
static int parse_one(const char *s, size_t len)
{
	char buf[96], *colon, *end;
	unsigned long ms, times = 1;
	struct failpoint *p;
	size_t nlen;

	if (!len || len >= sizeof(buf) || npoints == FP_MAX)
		return -1;
	memcpy(buf, s, len);
	buf[len] = 0;
	colon = strchr(buf, ':');
	if (!colon || colon == buf || (nlen = (size_t)(colon - buf)) >= FP_NAME)
		return -1;
	*colon++ = 0;
	errno = 0;
	ms = strtoul(colon, &end, 10);
	if (errno || end == colon || ms > 3600000ul)
		return -1;
	if (*end == ':') {
		colon = end + 1;
		times = strtoul(colon, &end, 10);
		if (errno || end == colon || !times || times > 1000000ul)
			return -1;
	}
	if (*end)
		return -1;
	p = &points[npoints++];
	memcpy(p->name, buf, nlen + 1); /* (with its NUL: nlen < FP_NAME) */
	p->ms = (unsigned)ms;
	atomic_init(&p->left, (unsigned)times);
	return 0;
}

int hkv_failpoints_init(void)
{
	const char *env = getenv("HKV_STALL"), *s, *comma;

	if (!env || !*env)
		return 0;
	for (s = env;; s = comma + 1) {
		comma = strchr(s, ',');
		if (parse_one(s, comma ? (size_t)(comma - s) : strlen(s))) {
			hkv_err("HKV_STALL='%s': want name:ms[:times],... (at most %d points)", env,
				FP_MAX);
			npoints = 0;
			return -1;
		}
		if (!comma)
			break;
	}
	hkv_warn("HKV_STALL='%s': %d stall point%s set (for tests)", env, npoints,
		 npoints == 1 ? "" : "s");
	hkv_failpoints_on = 1;
	return 0;
}

void hkv_failpoint_hit(const char *name)
{
	for (int i = 0; i < npoints; i++) {
		struct failpoint *p = &points[i];
		unsigned left = atomic_load(&p->left);
		struct timespec ts;

		if (strcmp(p->name, name))
			continue;
		while (left && !atomic_compare_exchange_weak(&p->left, &left, left - 1))
			;
		if (!left)
			continue; /* spent: the next entry of that name, if any ("a:200,a:2000") */
		hkv_warn("stall: %s for %u ms (HKV_STALL)", name, p->ms);
		ts.tv_sec = p->ms / 1000;
		ts.tv_nsec = (long)(p->ms % 1000) * 1000000L;
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
		hkv_warn("stall: %s over", name);
		return;
	}
}
