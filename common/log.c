/* log.c - see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int log_level = -1;
static const char *log_prog = "hatchkv";
static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static int level_from_env(void)
{
	const char *s = getenv("HKV_LOG");

	if (!s)
		return HKV_LOG_INFO;
	for (int i = HKV_LOG_ERROR; i <= HKV_LOG_DEBUG; i++)
		if (!strcasecmp(s, level_names[i]))
			return i;
	return HKV_LOG_INFO;
}

void hkv_log_set_level(enum hkv_log_level lvl)
{
	__atomic_store_n(&log_level, (int)lvl, __ATOMIC_RELAXED);
}

enum hkv_log_level hkv_log_env_level(void)
{
	return (enum hkv_log_level)level_from_env();
}

enum hkv_log_level hkv_log_get_level(void)
{
	for (int l = HKV_LOG_DEBUG; l > HKV_LOG_ERROR; l--)
		if (hkv_log_enabled((enum hkv_log_level)l))
			return (enum hkv_log_level)l;
	return HKV_LOG_ERROR;
}

const char *hkv_log_level_name(enum hkv_log_level lvl)
{
	static const char *const lower[] = {"error", "warn", "info", "debug"};

	return lvl >= HKV_LOG_ERROR && lvl <= HKV_LOG_DEBUG ? lower[lvl] : "?";
}

void hkv_log_set_prog(const char *prog)
{
	log_prog = prog;
}

int hkv_log_enabled(enum hkv_log_level lvl)
{
	int cur = __atomic_load_n(&log_level, __ATOMIC_RELAXED);

	if (cur < 0) { /* first use: every thread computes the same answer */
		cur = level_from_env();
		__atomic_store_n(&log_level, cur, __ATOMIC_RELAXED);
	}
	return (int)lvl <= cur;
}

/*
 * Is stderr the journal's stream? systemd sets JOURNAL_STREAM to
 * "DEVICE:INODE" of the stream it connected (sd_journal_stream_fd(3)); a
 * line there starts with "<N>", its syslog priority, and needs no time of
 * its own. Elsewhere a line starts with the UTC date and time.
 */
static int to_journal(void)
{
	static int known = -1; /* (atomics: threads log at once; each computes the same) */
	int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
	const char *js;
	unsigned long long dev, ino;
	struct stat st;

	if (k >= 0)
		return k;
	js = getenv("JOURNAL_STREAM");
	k = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && !fstat(2, &st) &&
	    (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
	__atomic_store_n(&known, k, __ATOMIC_RELAXED);
	return k;
}

static const int syslog_prio[] = {3, 4, 6, 7}; /* err, warning, info, debug */

void hkv_log(enum hkv_log_level lvl, const char *fmt, ...)
{
	char msg[1024], stamp[32];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (!hkv_log_enabled(lvl))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (to_journal()) {
		fprintf(stderr, "<%d>%s[%d] %s %s\n", syslog_prio[lvl], log_prog, (int)getpid(),
			level_names[lvl], msg);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	fprintf(stderr, "%s.%03ldZ %s[%d] %s %s\n", stamp, ts.tv_nsec / 1000000, log_prog,
		(int)getpid(), level_names[lvl], msg);
}

void hkv_log_limited(struct hkv_log_limit *l, enum hkv_log_level lvl, const char *fmt, ...)
{
	uint64_t now, last, quiet;
	struct timespec ts;
	char msg[1024];
	va_list ap;

	if (!hkv_log_enabled(lvl))
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	last = __atomic_load_n(&l->last_ns, __ATOMIC_RELAXED);
	if ((last && now - last < 1000000000ull) ||
	    !__atomic_compare_exchange_n(&l->last_ns, &last, now, 0, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED)) {
		__atomic_fetch_add(&l->quiet, 1, __ATOMIC_RELAXED);
		return;
	}
	quiet = __atomic_exchange_n(&l->quiet, 0, __ATOMIC_RELAXED);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (quiet)
		hkv_log(lvl, "%s (and %llu more like it in the last %.1f s)", msg,
			(unsigned long long)quiet, last ? (double)(now - last) / 1e9 : 0.0);
	else
		hkv_log(lvl, "%s", msg);
}
