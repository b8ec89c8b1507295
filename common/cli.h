/*
 * cli.h - what every program's command line shares (issue 30): --version,
 * and sizes parsed strictly (digits, one binary suffix K/M/G/T with an
 * optional "B" or "iB"; no sign, no blanks, no overflow) with a message that
 * says what is wrong, and a region size checked against the memory this
 * machine (or its cgroup) has available.
 */
#ifndef HKV_CLI_H
#define HKV_CLI_H

#include <stdint.h>
#include <stdio.h>

/* "PROG 0.1.0 (region layout 6, control protocol 2, git REV)\n" to out. */
void hkv_print_version(FILE *out, const char *prog);

/* 0 and *out, or -EINVAL with *why (static text) saying what is wrong. */
int hkv_parse_size(const char *s, uint64_t *out, const char **why);

/* Bytes this process may still take: MemAvailable, or less if its cgroup's
 * memory.max leaves less; 0 if neither can be read. *from names the limit
 * ("MemAvailable" or "cgroup memory.max"). */
uint64_t hkv_memory_available(const char **from);

/*
 * --config FILE (every program; issue 30, and the one file format for the
 * etcd settings of issue 28): each line of FILE is one long option without
 * its "--", as "name = value", "name value" or a bare "name" for a switch;
 * '#' starts a comment line; a value may be in double quotes. The file's
 * options go before the command line's, so the command line wins.
 * Rewrites argc and argv (the new vector lives as long as the process: the
 * options point into it) with --config removed. 0, or -1 after a line on
 * stderr naming FILE:LINE and what is wrong (an unknown option, a missing
 * or unexpected value, an unreadable file).
 */
struct option;
int hkv_cli_config(int *argc, char ***argv, const struct option *opts, const char *prog);

/*
 * SIGHUP (issue 30): the options again, from what hkv_cli_config was given
 * (main()'s argv, which must stay as it was: only the --config file is read
 * again; the command line still wins). v[i] is the last value given to the
 * i-th entry of hkv_cli_config's opts (by its long or short name), "" for a
 * switch given, NULL for an option not given. NULL after a line on stderr
 * saying what is wrong with the file: apply nothing then. Main thread only
 * (getopt's state). Free with hkv_cli_values_free().
 */
char **hkv_cli_values(void);
void hkv_cli_values_free(char **v);
/* v's value of the long option name (NULL: not given, or no such option). */
const char *hkv_cli_value(char *const *v, const char *name);
/* The --config FILE given, or NULL. */
const char *hkv_cli_config_file(void);
/*
 * Compare two hkv_cli_values(): each option whose value differs is either
 * one live(name) says the program applies now, or one that needs a
 * restart; for each of those one warning line ("WHO: SIGHUP: --memory
 * changed in FILE (1G -> 2G): needs a restart; keeping 1G") and now's value
 * is set back to was's, so that now describes what runs (and the next
 * SIGHUP says it again). Returns how many live options changed.
 */
int hkv_cli_values_diff(char *const *was, char **now, int (*live)(const char *name),
			const char *who);

#define HKV_CONFIG_USAGE                                                                   \
	"  --config FILE            options from FILE, one per line: name = value, or\n"    \
	"                           a bare name for a switch; the command line wins\n"

#endif /* HKV_CLI_H */
