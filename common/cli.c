/* cli.c - see cli.h. */
#include "common/cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ctl_proto.h"
#include "common/layout.h"

#ifndef HKV_VERSION_STRING
#define HKV_VERSION_STRING "unknown"
#endif
#ifndef HKV_GIT_REV
#define HKV_GIT_REV "unknown"
#endif

void hkv_print_version(FILE *out, const char *prog)
{
	fprintf(out, "%s %s (region layout %d, control protocol %d, git %s)\n", prog,
		HKV_VERSION_STRING, HKV_LAYOUT_VERSION, HKV_CTL_VERSION, HKV_GIT_REV);
}

int hkv_parse_size(const char *s, uint64_t *out, const char **why)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (!s || !isdigit((unsigned char)s[0])) {
		*why = s && (s[0] == '-' || s[0] == '+') ? "no sign: a size is a count of bytes"
							 : "not a number (e.g. 64M, 8G, 1T)";
		return -EINVAL;
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE) {
		*why = "too large a number";
		return -EINVAL;
	}
	switch (*end) {
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	default: break;
	}
	if (shift) {
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
	} else if (!strcmp(end, "B")) {
		end++;
	}
	if (*end) {
		*why = "unknown suffix (K, M, G or T, binary: 1K = 1024)";
		return -EINVAL;
	}
	if (shift && v > (~0ull >> shift)) {
		*why = "too large (over 16 EiB)";
		return -EINVAL;
	}
	if (!v) {
		*why = "zero";
		return -EINVAL;
	}
	*out = (uint64_t)v << shift;
	return 0;
}

/* The first number in path's first line ("max" or unreadable: 0). */
static uint64_t read_u64_file(const char *path)
{
	char line[64];
	FILE *f = fopen(path, "r");
	uint64_t v = 0;

	if (f && fgets(line, sizeof(line), f) && isdigit((unsigned char)line[0]))
		v = strtoull(line, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

uint64_t hkv_memory_available(const char **from)
{
	char line[256], cg[256] = "", path[300];
	uint64_t avail = 0, max, cur;
	FILE *f = fopen("/proc/meminfo", "r");

	*from = "MemAvailable";
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %lu kB", &avail) == 1) {
			avail <<= 10;
			break;
		}
	if (f)
		fclose(f);
	/* cgroup v2: "0::/PATH" */
	f = fopen("/proc/self/cgroup", "r");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "0::", 3)) {
			memcpy(cg, line + 3, strlen(line + 3) + 1);
			cg[strcspn(cg, "\n")] = 0;
		}
	if (f)
		fclose(f);
	if (cg[0]) {
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", cg);
		max = read_u64_file(path);
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.current", cg);
		cur = read_u64_file(path);
		if (max && (max > cur ? max - cur : 0) < (avail ? avail : ~0ull)) {
			avail = max > cur ? max - cur : 0;
			*from = "cgroup memory.max";
		}
	}
	return avail;
}
