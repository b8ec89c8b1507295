/*
 * lincheck.h - a linearizability checker for the history of one key.
 *
 * A history is a list of completed operations, each with the time it was
 * invoked and the time it returned (CLOCK_MONOTONIC ns) and what it
 * returned. The history is linearizable if the operations can be put in one
 * order that respects real time (A returned before B was invoked => A comes
 * first) and in which every result is what a sequential object would have
 * returned. Linearizability is compositional, so a store is checked one key
 * at a time.
 *
 * The search is Wing & Gong's, with Lowe's memoization: operations are
 * linearized one at a time in a depth-first search over the invoke/return
 * events, and every (set of linearized operations, model state) pair that
 * has been explored is remembered so it is never explored twice.
 *
 * Two sequential models, both with a 64-bit state:
 *   LC_REGISTER  state = id of the value stored, LC_ABSENT when there is
 *                none. Values are opaque 64-bit ids; every write writes a
 *                distinct one. get / set / cas / delete / add (stores only
 *                when absent, else LC_EXISTS). A cas names the
 *                value its version token was read with (`expect`): it
 *                succeeds iff that value is still the current one.
 *   LC_COUNTER   state = the number stored (always present). get / set /
 *                incr / decr with memcached rules (decr stops at 0, incr
 *                wraps at 2^64); incr and decr return the new value.
 *
 * An operation whose outcome is unknown (it failed with a transport error,
 * say) has status LC_UNKNOWN and ret = INT64_MAX: it may take effect at any
 * time after its invocation, or never, and its result is not checked.
 */
#ifndef HKV_TEST_LINCHECK_H
#define HKV_TEST_LINCHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum lc_model { LC_REGISTER, LC_COUNTER };

enum lc_kind { LC_GET, LC_SET, LC_CAS, LC_DELETE, LC_INCR, LC_DECR, LC_ADD, LC_NKINDS };

/* What an operation returned. */
enum lc_status {
	LC_OK,       /* success */
	LC_NOTFOUND, /* key absent */
	LC_VERSION,  /* cas: version no longer current */
	LC_UNKNOWN,  /* failed in a way that leaves its effect unknown */
	LC_EXISTS,   /* add: key already present */
};

#define LC_ABSENT  0          /* register state: no value stored */
#define LC_GARBAGE UINT64_MAX /* a get returned bytes that no write wrote */

struct lc_op {
	enum lc_kind kind;
	enum lc_status status;
	int client;      /* who ran it (reports only) */
	uint64_t arg;    /* set/cas: value written; incr/decr: delta */
	uint64_t expect; /* cas: the value the version token came with */
	uint64_t out;    /* get: value read; incr/decr: the new value returned */
	int64_t call;    /* invocation time */
	int64_t ret;     /* response time (INT64_MAX if LC_UNKNOWN) */
};

enum lc_result { LC_LINEARIZABLE, LC_VIOLATION, LC_GAVE_UP };

struct lc_limits {
	uint64_t max_steps; /* search steps before giving up (0: no limit) */
	double max_seconds; /* wall time before giving up (0: no limit) */
	size_t max_memo_mb; /* memo table size before giving up (0: 1024) */
};

/* Outcome of a check; free with lc_report_free(). */
struct lc_report {
	enum lc_model model;
	enum lc_result result;
	uint64_t steps; /* search steps taken */
	double seconds;
	size_t nops;
	/* The deepest point the search reached: the ops it had linearized, in
	 * order, the state they led to, and the op whose return it could not
	 * get past. On a violation this is where the history goes wrong. */
	size_t depth;
	size_t *order; /* depth op indexes */
	uint64_t state;
	size_t stuck; /* op index, or (size_t)-1 */
};

/* Check ops[0..n) against `model` starting in state `init`. */
enum lc_result lc_check(enum lc_model model, uint64_t init, const struct lc_op *ops, size_t n,
			const struct lc_limits *lim, struct lc_report *rep);

/*
 * The checker tests' operation mix on a register key: get 30%, set 15%, add
 * 10%, cas 25%, delete 20%. lc_mix_roll draws one (r) and says whether a get
 * of the key should run first (a cas wants a version: always when the
 * caller holds none, else half the time); lc_mix_kind then names it, given
 * whether the caller holds a version after that get (without one, a cas is
 * a set). On a counter key: get 30%, incr by 1..5 50%, decr by 1..3 20%
 * (*delta).
 */
unsigned lc_mix_roll(unsigned *seed, int have, int *get_first);
enum lc_kind lc_mix_kind(unsigned r, int have);
enum lc_kind lc_counter_mix(unsigned *seed, uint64_t *delta);
void lc_report_free(struct lc_report *rep);

const char *lc_result_name(enum lc_result r);
const char *lc_kind_name(enum lc_kind k);
/* One op as a line of text; times relative to t0 (register values in hex,
 * counter numbers in decimal). */
void lc_print_op(FILE *f, enum lc_model m, const struct lc_op *op, size_t idx, int64_t t0);
/* Explain a violation (or give-up): the end of the deepest linearized
 * prefix, the state it led to and the pending ops none of which could go
 * next. */
void lc_print_report(FILE *f, const struct lc_op *ops, size_t n, const struct lc_report *rep);

#endif /* HKV_TEST_LINCHECK_H */
