/*
 * notify.h - telling systemd how a daemon is doing (Type=notify units):
 * READY=1 once it serves, STATUS= lines while it starts (the region's first
 * touch takes seconds for gigabytes) and while it runs, STOPPING=1 when it
 * shuts down. libsystemd's sd_notify: a datagram to $NOTIFY_SOCKET, nothing
 * when that is unset (not under systemd).
 */
#ifndef HKV_NOTIFY_H
#define HKV_NOTIFY_H

#include <stddef.h>

void hkv_notify_ready(const char *status);
void hkv_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hkv_notify_stopping(void);
/* A hkv_region_progress_fn (common/region.h): a STATUS line and a log line
 * at most once a second while a region is touched; arg: the program's name. */
void hkv_notify_region_progress(size_t done, size_t total, void *arg);

#endif /* HKV_NOTIFY_H */
