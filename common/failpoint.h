/*
 * failpoint.h - named stall points for tests (issue 27: an unbounded stall
 * of the server's sweep or mover between a check and the write it allows
 * must cost no client's item).
 *
 * HKV_STALL="name:ms[:times],..." in the environment when the process
 * starts makes hkv_failpoint(name) sleep ms milliseconds the first `times`
 * times (default 1) it is reached, each with a log line ("stall: NAME for
 * MS ms (HKV_STALL)"); entries of one name are used in turn
 * ("take-back:200,take-back:2000": 0.2 s, then 2 s). The server's data
 * path is the clients' own, so a server asleep at one of its points is what
 * a descheduled, paged-out or frozen server is. Without HKV_STALL a failpoint costs a load and a
 * branch. The points are listed in docs/design.md, "Check-then-write".
 */
#ifndef HKV_FAILPOINT_H
#define HKV_FAILPOINT_H

extern int hkv_failpoints_on;
void hkv_failpoint_hit(const char *name);

static inline void hkv_failpoint(const char *name)
{
	if (__builtin_expect(hkv_failpoints_on, 0))
		hkv_failpoint_hit(name);
}

/* Read HKV_STALL (called once at start; a bad value is an error: -1). */
int hkv_failpoints_init(void);

#endif /* HKV_FAILPOINT_H */
