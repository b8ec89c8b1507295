/* cli.c - see cli.h. */
#include "common/cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
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

/* ---- --config FILE ---- */

/* The value of --config in argv (--config FILE, --config=FILE), its index
 * and how many words it takes; NULL if none. */
static const char *config_arg(int argc, char **argv, int *at, int *words)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			break;
		if (!strncmp(argv[i], "--config=", 9)) {
			*at = i;
			*words = 1;
			return argv[i] + 9;
		}
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			*at = i;
			*words = 2;
			return argv[i + 1];
		}
	}
	return NULL;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/* Append word (copied) to the growing vector; -1 on ENOMEM. */
static int push(char ***v, int *n, int *cap, const char *word)
{
	if (*n + 1 >= *cap) {
		int ncap = *cap ? *cap * 2 : 32;
		char **nv = realloc(*v, (size_t)ncap * sizeof(**v));

		if (!nv)
			return -1;
		*v = nv;
		*cap = ncap;
	}
	if (!((*v)[(*n)++] = strdup(word)))
		return -1;
	(*v)[*n] = NULL;
	return 0;
}

int hkv_cli_config(int *argc, char ***argv, const struct option *opts, const char *prog)
{
	static char **keep; /* the new vector: options point into it */
	char line[4096], **v = NULL;
	int at = 0, words = 0, n = 0, cap = 0, lineno = 0, bad = 0;
	const char *path = config_arg(*argc, *argv, &at, &words);
	FILE *f;

	if (!path)
		return 0;
	if (!(f = fopen(path, "re"))) {
		fprintf(stderr, "%s: --config %s: %s\n", prog, path, strerror(errno));
		return -1;
	}
	if (push(&v, &n, &cap, (*argv)[0]))
		goto nomem;
	while (!bad && fgets(line, sizeof(line), f)) {
		char *name, *value = NULL, *p, opt[256];
		const struct option *o;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "%s:%d: line too long\n", path, lineno);
			bad = 1;
			break;
		}
		name = trim(line);
		if (!*name || *name == '#')
			continue;
		if (!strncmp(name, "--", 2))
			name += 2;
		p = name + strcspn(name, " \t=");
		if (*p) {
			*p++ = 0;
			value = trim(p);
			if (*value == '=')
				value = trim(value + 1);
			if (*value == '"') {
				size_t len = strlen(value);

				if (len < 2 || value[len - 1] != '"') {
					fprintf(stderr, "%s:%d: '%s': unterminated quote\n", path,
						lineno, name);
					bad = 1;
					break;
				}
				value[len - 1] = 0;
				value++;
			} else if (!*value) {
				value = NULL;
			}
		}
		for (o = opts; o->name && strcmp(o->name, name); o++)
			;
		if (!o->name || !strcmp(name, "config") || !strcmp(name, "help") ||
		    !strcmp(name, "version")) {
			fprintf(stderr, "%s:%d: '%s' is no option of %s (%s --help lists them)\n",
				path, lineno, name, prog, prog);
			bad = 1;
		} else if (o->has_arg == required_argument && !value) {
			fprintf(stderr, "%s:%d: '%s' needs a value (%s = VALUE)\n", path, lineno,
				name, name);
			bad = 1;
		} else if (o->has_arg == no_argument && value) {
			fprintf(stderr, "%s:%d: '%s' is a switch: it takes no value\n", path, lineno,
				name);
			bad = 1;
		} else {
			snprintf(opt, sizeof(opt), "--%s", name);
			if (push(&v, &n, &cap, opt) || (value && push(&v, &n, &cap, value)))
				goto nomem;
		}
	}
	fclose(f);
	if (bad)
		return -1;
	for (int i = 1; i < *argc; i++)
		if ((i < at || i >= at + words) && push(&v, &n, &cap, (*argv)[i]))
			goto nomem_closed;
	keep = v;
	*argc = n;
	*argv = keep;
	return 0;

nomem:
	fclose(f);
nomem_closed:
	fprintf(stderr, "%s: --config %s: out of memory\n", prog, path);
	return -1;
}
