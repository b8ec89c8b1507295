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
#include "common/log.h"

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

/* Free a vector push() made. */
static void vec_free(char **v)
{
	for (int i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

/* One line of FILE (trimmed, not a comment) as "--name" [value] on v;
 * 0, 1 after a line on stderr saying what is wrong, -1 on ENOMEM. */
static int config_line(char *line, const char *path, int lineno, const struct option *opts,
		       const char *prog, char ***v, int *n, int *cap)
{
	char *name = line, *value = NULL, *p, opt[256];
	const struct option *o;

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
				fprintf(stderr, "%s:%d: '%s': unterminated quote\n", path, lineno,
					name);
				return 1;
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
		fprintf(stderr, "%s:%d: '%s' is no option of %s (%s --help lists them)\n", path,
			lineno, name, prog, prog);
		return 1;
	}
	if (o->has_arg == required_argument && !value) {
		fprintf(stderr, "%s:%d: '%s' needs a value (%s = VALUE)\n", path, lineno, name,
			name);
		return 1;
	}
	if (o->has_arg == no_argument && value) {
		fprintf(stderr, "%s:%d: '%s' is a switch: it takes no value\n", path, lineno, name);
		return 1;
	}
	snprintf(opt, sizeof(opt), "--%s", name);
	return push(v, n, cap, opt) || (value && push(v, n, cap, value)) ? -1 : 0;
}

/*
 * The options of path followed by argv's without its --config (at at, words
 * long): a new vector in *out (vec_free), its length in *outc. 0, or -1
 * after a line on stderr.
 */
static int config_vector(int argc, char **argv, const char *path, int at, int words,
			 const struct option *opts, const char *prog, int *outc, char ***out)
{
	char line[4096], **v = NULL;
	int n = 0, cap = 0, lineno = 0, bad = 0;
	FILE *f;

	if (!(f = fopen(path, "re"))) {
		fprintf(stderr, "%s: --config %s: %s\n", prog, path, strerror(errno));
		return -1;
	}
	if (push(&v, &n, &cap, argv[0]))
		goto nomem;
	while (!bad && fgets(line, sizeof(line), f)) {
		char *name;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "%s:%d: line too long\n", path, lineno);
			bad = 1;
			break;
		}
		name = trim(line);
		if (!*name || *name == '#')
			continue;
		bad = config_line(name, path, lineno, opts, prog, &v, &n, &cap);
		if (bad < 0)
			goto nomem;
	}
	fclose(f);
	if (bad) {
		vec_free(v);
		return -1;
	}
	for (int i = 1; i < argc; i++)
		if ((i < at || i >= at + words) && push(&v, &n, &cap, argv[i]))
			goto nomem_closed;
	*outc = n;
	*out = v;
	return 0;

nomem:
	fclose(f);
nomem_closed:
	vec_free(v);
	fprintf(stderr, "%s: --config %s: out of memory\n", prog, path);
	return -1;
}

/* What hkv_cli_config was given, for hkv_cli_values (SIGHUP). */
static struct {
	int argc;
	char **argv; /* main()'s: lives as long as the process */
	const struct option *opts;
	const char *prog, *path;
} cli_src;

int hkv_cli_config(int *argc, char ***argv, const struct option *opts, const char *prog)
{
	/* the new vector: options point into it (volatile: a store never read
	 * back is dropped by the optimizer, and LeakSanitizer then calls the
	 * vector leaked) */
	static char **volatile keep;
	int at = 0, words = 0, n;
	const char *path = config_arg(*argc, *argv, &at, &words);
	char **v;

	cli_src.argc = *argc;
	cli_src.argv = *argv;
	cli_src.opts = opts;
	cli_src.prog = prog;
	cli_src.path = path;
	if (!path)
		return 0;
	if (config_vector(*argc, *argv, path, at, words, opts, prog, &n, &v))
		return -1;
	keep = v;
	*argc = n;
	*argv = keep;
	return 0;
}

/* ---- SIGHUP: the options again ---- */

const char *hkv_cli_config_file(void)
{
	return cli_src.path;
}

static int nopts(const struct option *opts)
{
	int n = 0;

	while (opts && opts[n].name)
		n++;
	return n;
}

/* getopt's short options for opts: each val that is a letter or digit. */
static void short_opts(const struct option *opts, char *buf, size_t cap)
{
	size_t k = 0;

	buf[k++] = ':'; /* (a missing value: ':', never a line of getopt's own) */
	for (int i = 0; opts[i].name && k + 3 < cap; i++)
		if (opts[i].val > 0 && opts[i].val < 128 && isalnum(opts[i].val) && !opts[i].flag) {
			buf[k++] = (char)opts[i].val;
			if (opts[i].has_arg == required_argument)
				buf[k++] = ':';
		}
	buf[k] = 0;
}

char **hkv_cli_values(void)
{
	int n = nopts(cli_src.opts), argc = 0, at = 0, words = 0, saved_opterr = opterr, c, li;
	char **v, **args = NULL, shortopts[200];

	if (!cli_src.opts || !(v = calloc((size_t)n + 1, sizeof(*v))))
		return NULL;
	if (cli_src.path) {
		config_arg(cli_src.argc, cli_src.argv, &at, &words);
		if (config_vector(cli_src.argc, cli_src.argv, cli_src.path, at, words, cli_src.opts,
				  cli_src.prog, &argc, &args))
			goto free_values;
	} else {
		/* (getopt permutes what it parses: a copy, never main()'s) */
		int cap = 0;

		for (int i = 0; i < cli_src.argc; i++)
			if (push(&args, &argc, &cap, cli_src.argv[i]))
				goto free_args;
	}
	short_opts(cli_src.opts, shortopts, sizeof(shortopts));
	opterr = 0; /* (the start said what was wrong with the command line) */
	optind = 0; /* (glibc: start over) */
	for (;;) {
		li = -1;
		if ((c = getopt_long(argc, args, shortopts, cli_src.opts, &li)) == -1)
			break;
		if (c == '?' || c == ':')
			continue;
		for (int i = 0; li < 0 && i < n; i++)
			if (cli_src.opts[i].val == c && !cli_src.opts[i].flag)
				li = i;
		if (li < 0)
			continue;
		free(v[li]);
		if (!(v[li] = strdup(optarg ? optarg : "")))
			goto free_args;
	}
	opterr = saved_opterr;
	vec_free(args);
	return v;

free_args:
	opterr = saved_opterr;
	vec_free(args);
free_values:
	hkv_cli_values_free(v);
	return NULL;
}

void hkv_cli_values_free(char **v)
{
	int n = nopts(cli_src.opts);

	for (int i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

const char *hkv_cli_value(char *const *v, const char *name)
{
	for (int i = 0; v && cli_src.opts[i].name; i++)
		if (!strcmp(cli_src.opts[i].name, name))
			return v[i];
	return NULL;
}

static int same(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

static const char *shown(const struct option *o, const char *val)
{
	if (o->has_arg == no_argument)
		return val ? "on" : "off";
	return val ? val : "(unset)";
}

int hkv_cli_values_diff(char *const *was, char **now, int (*live)(const char *name),
			const char *who)
{
	const struct option *opts = cli_src.opts;
	int changed = 0;

	for (int i = 0; was && opts && opts[i].name; i++) {
		char *keep = NULL;

		if (same(was[i], now[i]))
			continue;
		if (live(opts[i].name)) {
			changed++;
			continue;
		}
		hkv_warn("%s: SIGHUP: --%s changed in %s (%s -> %s): needs a restart; keeping %s",
			 who, opts[i].name, cli_src.path, shown(&opts[i], was[i]),
			 shown(&opts[i], now[i]), shown(&opts[i], was[i]));
		if (was[i] && !(keep = strdup(was[i])))
			continue; /* (then the next SIGHUP says it again) */
		free(now[i]);
		now[i] = was[i] ? keep : NULL;
	}
	return changed;
}
