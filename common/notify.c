/* notify.c - see notify.h. */
#include "common/notify.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "common/log.h"

void hkv_notify_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void hkv_notify_status(const char *fmt, ...)
{
	char buf[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", buf);
}

void hkv_notify_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void hkv_notify_region_progress(size_t done, size_t total, void *arg)
{
	static uint64_t last_ms, start_ms;
	uint64_t now = mono_ms();
	double mib = 1024.0 * 1024.0;

	if (done == 0) {
		start_ms = last_ms = now;
		hkv_notify_status("touching the region: 0 of %.0f MiB", total / mib);
		return;
	}
	if (done < total && now - last_ms < 1000)
		return;
	last_ms = now;
	hkv_notify_status("touching the region: %.0f of %.0f MiB (%.0f %%)", done / mib,
			  total / mib, 100.0 * (double)done / (double)total);
	if (done < total || now - start_ms >= 1000) /* (a line only when it takes a while) */
		hkv_info("%s: region touched: %.0f of %.0f MiB (%.0f %%, %.1f s)",
			 arg ? (const char *)arg : "server", done / mib, total / mib,
			 100.0 * (double)done / (double)total, (now - start_ms) / 1000.0);
}
