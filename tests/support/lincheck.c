/*
 * lincheck.c - see lincheck.h.
 *
 * The search (Lowe's refinement of Wing & Gong): the 2n invoke and return
 * events sit in one doubly linked list in time order (at equal times
 * invocations first, so touching intervals count as concurrent). Walking
 * the list from the front, an invocation is a candidate to linearize next:
 * if the model accepts it and the resulting (linearized set, state) is new,
 * its two events are unlinked, it is pushed on a stack and the walk
 * restarts at the front. Reaching a return event means its op should have
 * been linearized already: pop the last choice, relink it and try the
 * invocation after it. An empty list is a linearization; a return event
 * with an empty stack proves there is none.
 */
#include "tests/support/lincheck.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct node {
	size_t prev, next;
};

struct frame {
	size_t op;
	uint64_t state;
};

/* Hash set of (linearized bitset, state) keys of `words` + 1 words each. */
struct memo {
	size_t words, cap, count, max_bytes;
	uint64_t *hash; /* 0 = empty slot */
	uint64_t *keys;
};

struct search {
	enum lc_model model;
	const struct lc_op *ops;
	size_t n;
	struct node *node; /* 2n events + the sentinel */
	struct frame *stack;
	size_t depth;
	uint64_t *bits;
	uint64_t state;
	struct memo memo;
	const struct lc_limits *lim;
	struct timespec start;
	struct lc_report *rep;
};

/* ---- the sequential models ---------------------------------------------- */

static int step_register(uint64_t st, const struct lc_op *op, uint64_t *next)
{
	int present = st != LC_ABSENT, unk = op->status == LC_UNKNOWN;

	*next = st;
	switch (op->kind) {
	case LC_GET:
		if (unk)
			return 1;
		return present ? op->status == LC_OK && op->out == st : op->status == LC_NOTFOUND;
	case LC_SET:
		*next = op->arg;
		return unk || op->status == LC_OK;
	case LC_CAS:
		if (present && st == op->expect) {
			*next = op->arg;
			return unk || op->status == LC_OK;
		}
		return unk || op->status == (present ? LC_VERSION : LC_NOTFOUND);
	case LC_DELETE:
		*next = LC_ABSENT;
		return unk || op->status == (present ? LC_OK : LC_NOTFOUND);
	case LC_ADD:
		if (!present)
			*next = op->arg;
		return unk || op->status == (present ? LC_EXISTS : LC_OK);
	default:
		return 0;
	}
}

static int step_counter(uint64_t st, const struct lc_op *op, uint64_t *next)
{
	int unk = op->status == LC_UNKNOWN;

	*next = st;
	switch (op->kind) {
	case LC_GET:
		return unk || (op->status == LC_OK && op->out == st);
	case LC_SET:
		*next = op->arg;
		return unk || op->status == LC_OK;
	case LC_INCR:
		*next = st + op->arg;
		return unk || (op->status == LC_OK && op->out == *next);
	case LC_DECR:
		*next = op->arg > st ? 0 : st - op->arg;
		return unk || (op->status == LC_OK && op->out == *next);
	default:
		return 0;
	}
}

static int step(enum lc_model m, uint64_t st, const struct lc_op *op, uint64_t *next)
{
	return m == LC_REGISTER ? step_register(st, op, next) : step_counter(st, op, next);
}

/* ---- memo: the (linearized set, state) pairs already explored ------------------ */

static uint64_t mix(uint64_t h, uint64_t w)
{
	h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h ^= h >> 31;
	return h * 0xbf58476d1ce4e5b9ull;
}

static uint64_t key_hash(const uint64_t *bits, size_t words, uint64_t state)
{
	uint64_t h = mix(0, state);

	for (size_t i = 0; i < words; i++)
		h = mix(h, bits[i]);
	return h ? h : 1;
}

static uint64_t *memo_key(const struct memo *m, size_t slot)
{
	return m->keys + slot * (m->words + 1);
}

static size_t memo_find(const struct memo *m, uint64_t h, const uint64_t *bits, uint64_t state,
			int *found)
{
	size_t i = (size_t)h & (m->cap - 1);

	for (;; i = (i + 1) & (m->cap - 1)) {
		const uint64_t *k = memo_key(m, i);

		*found = m->hash[i] == h && k[m->words] == state &&
			 !memcmp(k, bits, m->words * 8);
		if (!m->hash[i] || *found)
			return i;
	}
}

static void memo_put(struct memo *m, size_t slot, uint64_t h, const uint64_t *bits,
		     uint64_t state)
{
	uint64_t *k = memo_key(m, slot);

	m->hash[slot] = h;
	memcpy(k, bits, m->words * 8);
	k[m->words] = state;
	m->count++;
}

static int memo_alloc(struct memo *m, size_t cap)
{
	uint64_t *hash, *keys;

	if (cap * (m->words + 2) * 8 > m->max_bytes)
		return -1;
	hash = calloc(cap, 8);
	keys = malloc(cap * (m->words + 1) * 8);
	if (!hash || !keys) {
		free(hash);
		free(keys);
		return -1;
	}
	m->cap = cap;
	m->count = 0;
	m->hash = hash;
	m->keys = keys;
	return 0;
}

/* Double the table; on failure it stays as it was. */
static int memo_grow(struct memo *m)
{
	struct memo old = *m;
	int found;

	if (memo_alloc(m, old.cap * 2))
		return -1;
	for (size_t i = 0; i < old.cap; i++) {
		const uint64_t *k = memo_key(&old, i);

		if (old.hash[i])
			memo_put(m, memo_find(m, old.hash[i], k, k[m->words], &found),
				 old.hash[i], k, k[m->words]);
	}
	free(old.hash);
	free(old.keys);
	return 0;
}

/* 1 if new (and now remembered), 0 if seen before, -1 out of memory. */
static int memo_add(struct memo *m, const uint64_t *bits, uint64_t state)
{
	uint64_t h = key_hash(bits, m->words, state);
	int found;
	size_t slot;

	if (2 * (m->count + 1) > m->cap && memo_grow(m))
		return -1;
	slot = memo_find(m, h, bits, state, &found);
	if (found)
		return 0;
	memo_put(m, slot, h, bits, state);
	return 1;
}

/* ---- the event list ----------------------------------------------------------- */

struct event {
	int64_t t;
	size_t ev; /* 2 op = its invocation, 2 op + 1 = its return */
};

static int event_cmp(const void *a, const void *b)
{
	const struct event *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	if ((x->ev & 1) != (y->ev & 1))
		return (x->ev & 1) ? 1 : -1; /* invocations first: touching = overlapping */
	return x->ev < y->ev ? -1 : x->ev > y->ev;
}

/* Link the 2n events in time order between the sentinel at index 2n. */
static int build_list(struct search *s)
{
	size_t n2 = 2 * s->n, prev = n2;
	struct event *ev = malloc((n2 + 1) * sizeof(*ev));

	if (!ev)
		return -1;
	for (size_t i = 0; i < n2; i++)
		ev[i] = (struct event){i & 1 ? s->ops[i / 2].ret : s->ops[i / 2].call, i};
	qsort(ev, n2, sizeof(*ev), event_cmp);
	for (size_t i = 0; i < n2; i++) {
		s->node[prev].next = ev[i].ev;
		s->node[ev[i].ev].prev = prev;
		prev = ev[i].ev;
	}
	s->node[prev].next = n2;
	s->node[n2].prev = prev;
	free(ev);
	return 0;
}

static void unlink_event(struct node *node, size_t e)
{
	node[node[e].prev].next = node[e].next;
	node[node[e].next].prev = node[e].prev;
}

static void relink_event(struct node *node, size_t e)
{
	node[node[e].prev].next = e;
	node[node[e].next].prev = e;
}

/* ---- the search --------------------------------------------------------------- */

static double elapsed(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static int out_of_budget(struct search *s)
{
	const struct lc_limits *lim = s->lim;

	if (lim->max_steps && s->rep->steps > lim->max_steps)
		return 1;
	return lim->max_seconds > 0 && (s->rep->steps & 1023) == 0 &&
	       elapsed(&s->start) > lim->max_seconds;
}

/* The search could not get past op's return with the current prefix. */
static void note_stuck(struct search *s, size_t op)
{
	struct lc_report *rep = s->rep;

	if (rep->stuck != (size_t)-1 && s->depth <= rep->depth)
		return;
	rep->depth = s->depth;
	rep->state = s->state;
	rep->stuck = op;
	for (size_t i = 0; i < s->depth; i++)
		rep->order[i] = s->stack[i].op;
}

/* Try to linearize op next: 1 done, 0 not possible, -1 out of memory. */
static int try_linearize(struct search *s, size_t op)
{
	uint64_t next, bit = 1ull << (op % 64);
	int fresh;

	if (!step(s->model, s->state, &s->ops[op], &next))
		return 0;
	s->bits[op / 64] |= bit;
	fresh = memo_add(&s->memo, s->bits, next);
	if (fresh <= 0) {
		s->bits[op / 64] &= ~bit;
		return fresh;
	}
	s->stack[s->depth++] = (struct frame){op, s->state};
	s->state = next;
	unlink_event(s->node, 2 * op);
	unlink_event(s->node, 2 * op + 1);
	return 1;
}

/* Undo the last choice; returns the event to continue from. */
static size_t backtrack(struct search *s)
{
	struct frame f = s->stack[--s->depth];

	relink_event(s->node, 2 * f.op + 1);
	relink_event(s->node, 2 * f.op);
	s->bits[f.op / 64] &= ~(1ull << (f.op % 64));
	s->state = f.state;
	return s->node[2 * f.op].next;
}

static enum lc_result search(struct search *s)
{
	size_t end = 2 * s->n, e = s->node[end].next;

	while (s->node[end].next != end) {
		s->rep->steps++;
		if (out_of_budget(s))
			return LC_GAVE_UP;
		if (!(e & 1)) {
			int r = try_linearize(s, e / 2);

			if (r < 0)
				return LC_GAVE_UP;
			e = r ? s->node[end].next : s->node[e].next;
			continue;
		}
		note_stuck(s, e / 2);
		if (!s->depth)
			return LC_VIOLATION;
		e = backtrack(s);
	}
	return LC_LINEARIZABLE;
}

static int search_init(struct search *s, size_t n, const struct lc_limits *lim)
{
	size_t words = (n + 63) / 64;

	s->memo.words = words;
	s->memo.max_bytes = (lim->max_memo_mb ? lim->max_memo_mb : 1024) << 20;
	s->node = malloc((2 * n + 1) * sizeof(*s->node));
	s->stack = malloc((n + 1) * sizeof(*s->stack));
	s->bits = calloc(words + 1, 8);
	s->rep->order = malloc((n + 1) * sizeof(*s->rep->order));
	if (!s->node || !s->stack || !s->bits || !s->rep->order || memo_alloc(&s->memo, 1024))
		return -1;
	return build_list(s);
}

static void search_fini(struct search *s)
{
	free(s->node);
	free(s->stack);
	free(s->bits);
	free(s->memo.hash);
	free(s->memo.keys);
}

enum lc_result lc_check(enum lc_model model, uint64_t init, const struct lc_op *ops, size_t n,
			const struct lc_limits *lim, struct lc_report *rep)
{
	struct search s = {.model = model, .ops = ops, .n = n, .state = init, .lim = lim,
			   .rep = rep};

	memset(rep, 0, sizeof(*rep));
	rep->model = model;
	rep->nops = n;
	rep->stuck = (size_t)-1;
	rep->state = init;
	clock_gettime(CLOCK_MONOTONIC, &s.start);
	rep->result = search_init(&s, n, lim) ? LC_GAVE_UP : search(&s);
	rep->seconds = elapsed(&s.start);
	search_fini(&s);
	return rep->result;
}

void lc_report_free(struct lc_report *rep)
{
	free(rep->order);
	rep->order = NULL;
}

/* ---- printing ------------------------------------------------------------------- */

const char *lc_result_name(enum lc_result r)
{
	static const char *const names[] = {"linearizable", "NOT LINEARIZABLE",
					    "GAVE UP (search budget exhausted)"};

	return names[r];
}

const char *lc_kind_name(enum lc_kind k)
{
	static const char *const names[] = {"get", "set", "cas", "delete", "incr", "decr", "add"};

	return k < LC_NKINDS ? names[k] : "?";
}

static const char *status_name(enum lc_status st)
{
	static const char *const names[] = {"ok", "NOTFOUND", "EVERSION", "UNKNOWN", "EEXISTS"};

	return names[st];
}

static void print_time(FILE *f, int64_t t, int64_t t0)
{
	if (t == INT64_MAX)
		fprintf(f, "      never");
	else
		fprintf(f, "%11.3f", (double)(t - t0) / 1000.0);
}

static void print_value(FILE *f, enum lc_model m, uint64_t v)
{
	if (m == LC_COUNTER)
		fprintf(f, "%llu", (unsigned long long)v);
	else if (v == LC_ABSENT)
		fprintf(f, "absent");
	else
		fprintf(f, "%#llx", (unsigned long long)v);
}

void lc_print_op(FILE *f, enum lc_model m, const struct lc_op *op, size_t idx, int64_t t0)
{
	fprintf(f, "#   op %4zu client %2d [", idx, op->client);
	print_time(f, op->call, t0);
	fprintf(f, " ..");
	print_time(f, op->ret, t0);
	fprintf(f, " us] %-6s", lc_kind_name(op->kind));
	if (op->kind != LC_GET && op->kind != LC_DELETE) {
		fprintf(f, " ");
		print_value(f, op->kind == LC_INCR || op->kind == LC_DECR ? LC_COUNTER : m, op->arg);
	}
	if (op->kind == LC_CAS) {
		fprintf(f, " expecting ");
		print_value(f, m, op->expect);
	}
	fprintf(f, " -> %s", status_name(op->status));
	if (op->status == LC_OK && (op->kind == LC_GET || op->kind == LC_INCR ||
				    op->kind == LC_DECR)) {
		fprintf(f, " ");
		print_value(f, m, op->out);
	}
	fprintf(f, "\n");
}

static int linearized(const struct lc_report *rep, size_t op)
{
	for (size_t i = 0; i < rep->depth; i++)
		if (rep->order[i] == op)
			return 1;
	return 0;
}

void lc_print_report(FILE *f, const struct lc_op *ops, size_t n, const struct lc_report *rep)
{
	size_t from = rep->depth > 8 ? rep->depth - 8 : 0, pending = 0;
	int64_t t0 = INT64_MAX;

	for (size_t i = 0; i < n; i++)
		t0 = ops[i].call < t0 ? ops[i].call : t0;
	fprintf(f, "# %s after %llu steps; deepest linearized prefix: %zu of %zu ops\n",
		lc_result_name(rep->result), (unsigned long long)rep->steps, rep->depth, n);
	if (rep->stuck == (size_t)-1)
		return;
	fprintf(f, "# the end of that prefix, in linearization order:\n");
	for (size_t i = from; i < rep->depth; i++)
		lc_print_op(f, rep->model, &ops[rep->order[i]], rep->order[i], t0);
	fprintf(f, "# state after it: ");
	print_value(f, rep->model, rep->state);
	fprintf(f, "; this op returns next, and cannot follow:\n");
	lc_print_op(f, rep->model, &ops[rep->stuck], rep->stuck, t0);
	fprintf(f, "# nor can it after any of the other ops pending then:\n");
	for (size_t i = 0; i < n; i++) {
		if (i != rep->stuck && ops[i].call <= ops[rep->stuck].ret && !linearized(rep, i)) {
			lc_print_op(f, rep->model, &ops[i], i, t0);
			pending++;
		}
	}
	if (!pending)
		fprintf(f, "#   (none)\n");
}

unsigned lc_mix_roll(unsigned *seed, int have, int *get_first)
{
	unsigned r = (unsigned)rand_r(seed) % 20;

	*get_first = r >= 11 && r < 16 && (!have || rand_r(seed) % 2);
	return r;
}

enum lc_kind lc_mix_kind(unsigned r, int have)
{
	if (r < 6)
		return LC_GET;
	if (r < 9 || (r >= 11 && r < 16 && !have))
		return LC_SET;
	if (r < 11)
		return LC_ADD;
	return r < 16 ? LC_CAS : LC_DELETE;
}

enum lc_kind lc_counter_mix(unsigned *seed, uint64_t *delta)
{
	unsigned r = (unsigned)rand_r(seed) % 10;

	*delta = 0;
	if (r < 3)
		return LC_GET;
	if (r < 8) {
		*delta = 1 + (unsigned)rand_r(seed) % 5;
		return LC_INCR;
	}
	*delta = 1 + (unsigned)rand_r(seed) % 3;
	return LC_DECR;
}
