/*
 * log.h - one-line logs to stderr: "<time> <prog>[pid] <LEVEL> message".
 * Thread-safe (one fprintf per line). Level from HKV_LOG (error, warn, info,
 * debug; default info) or hkv_log_set_level(), which any thread may call at
 * any time (a daemon's SIGHUP does: docs/operating.md). There is no log
 * file: stderr is the journal's stream under systemd, nothing to reopen.
 */
#ifndef HKV_LOG_H
#define HKV_LOG_H

#include <stdint.h>

enum hkv_log_level { HKV_LOG_ERROR, HKV_LOG_WARN, HKV_LOG_INFO, HKV_LOG_DEBUG };

void hkv_log_set_level(enum hkv_log_level lvl);
/* The level in force, and the one HKV_LOG names (info if unset or unknown;
 * the environment as the process has it: set at start). */
enum hkv_log_level hkv_log_get_level(void);
enum hkv_log_level hkv_log_env_level(void);
/* "error", "warn", "info" or "debug" (static). */
const char *hkv_log_level_name(enum hkv_log_level lvl);
void hkv_log_set_prog(const char *prog);
int hkv_log_enabled(enum hkv_log_level lvl);
void hkv_log(enum hkv_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* A line a peer can make repeat (a refused client, a bad request): at most
 * one per second from one call site, the next one saying how many were left
 * out meanwhile. Thread-safe. */
struct hkv_log_limit {
	uint64_t last_ns, quiet; /* (atomics) */
};
void hkv_log_limited(struct hkv_log_limit *l, enum hkv_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
#define hkv_warn_limited(...)                                                              \
	do {                                                                               \
		static struct hkv_log_limit limit_;                                        \
		hkv_log_limited(&limit_, HKV_LOG_WARN, __VA_ARGS__);                       \
	} while (0)

#define hkv_err(...)   hkv_log(HKV_LOG_ERROR, __VA_ARGS__)
#define hkv_warn(...)  hkv_log(HKV_LOG_WARN, __VA_ARGS__)
#define hkv_info(...)  hkv_log(HKV_LOG_INFO, __VA_ARGS__)
#define hkv_debug(...)                                                                     \
	do {                                                                               \
		if (hkv_log_enabled(HKV_LOG_DEBUG))                                        \
			hkv_log(HKV_LOG_DEBUG, __VA_ARGS__);                               \
	} while (0)

#endif /* HKV_LOG_H */
