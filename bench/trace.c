/* trace.c - see trace.h. */
#include "bench/trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ycsb.h"

static const char *const family_names[] = {"zipf", "scan", "shift", "loop"};

int hkv_trace_family_parse(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(name, family_names[i]))
			return i;
	return -1;
}

const char *hkv_trace_family_name(enum hkv_trace_family_kind k)
{
	return (unsigned)k < 4 ? family_names[k] : "?";
}

void hkv_trace_family_defaults(struct hkv_trace_family *f)
{
	if (!f->theta)
		f->theta = 0.99;
	if (!f->value)
		f->value = 1000;
	if (!f->scan_every)
		f->scan_every = f->keys; /* 20 scans in 2M requests over 100k keys */
	if (!f->scan_len)
		f->scan_len = f->keys / 4;
	if (!f->shift_every)
		f->shift_every = f->requests / 10 ? f->requests / 10 : 1;
	if (!f->shift_by)
		f->shift_by = f->keys / 2;
	if (!f->loop_frac)
		f->loop_frac = 0.5;
	/* loop_keys has no default here: "slightly more than fit" depends on
	 * the cache, which the caller knows */
}

uint64_t hkv_trace_family_bytes(const struct hkv_trace_family *f, uint64_t n,
				uint32_t item_overhead)
{
	uint64_t sum = 0;
	char key[32];

	for (uint64_t k = 0; k < n; k++)
		sum += ycsb_key(k, key, sizeof(key)) +
		       hkv_trace_value_size(k, f->value, f->value_max) + item_overhead;
	return sum;
}

uint64_t hkv_trace_loop_keys_for(const struct hkv_trace_family *f, uint64_t cap_bytes,
				 uint32_t item_overhead)
{
	return (uint64_t)(1.1 * (double)cap_bytes * (double)f->keys /
			  (double)hkv_trace_family_bytes(f, f->keys, item_overhead)) + 1;
}

uint32_t hkv_trace_value_size(uint64_t key, uint32_t value, uint32_t value_max)
{
	double u = (double)(ycsb_fnv64(key ^ 0x5bd1e995ull) % 1000000) / 1e6;

	if (!value_max)
		return value;
	return (uint32_t)((double)value * exp(u * log((double)value_max / (double)value)));
}

static int push(struct hkv_trace *t, const struct hkv_trace_req *r)
{
	if (t->n == t->cap) {
		uint64_t cap = t->cap ? 2 * t->cap : 4096;
		struct hkv_trace_req *p = realloc(t->req, cap * sizeof(*p));

		if (!p)
			return -1;
		t->req = p;
		t->cap = cap;
	}
	t->req[t->n++] = *r;
	return 0;
}

/* ---- generated families ---- */

struct gen {
	const struct hkv_trace_family *f;
	struct ycsb_rng rng;
	struct ycsb_zipf z;
};

static uint64_t gen_zipf(struct gen *g)
{
	return ycsb_fnv64(ycsb_zipf_next(&g->z, &g->rng, g->f->keys)) % g->f->keys;
}

static int gen_emit(struct hkv_trace *t, const struct hkv_trace_family *f, uint64_t id)
{
	char key[32];
	struct hkv_trace_req r = {.key = (uint32_t)id, .op = HKV_TRACE_GET};

	r.key_size = (uint16_t)ycsb_key(id, key, sizeof(key));
	r.value_size = hkv_trace_value_size(id, f->value, f->value_max);
	return push(t, &r);
}

/* The id the family's i-th request names. */
static uint64_t gen_next(struct gen *g, uint64_t i, uint64_t *loop_pos)
{
	const struct hkv_trace_family *f = g->f;
	uint64_t cycle, at;

	switch (f->kind) {
	case HKV_FAMILY_SCAN:
		/* Zipf requests, then a scan, repeated: position within a cycle */
		cycle = f->scan_every + f->scan_len;
		at = i % cycle;
		if (at < f->scan_every)
			return gen_zipf(g);
		return f->keys + (i / cycle) * f->scan_len + (at - f->scan_every);
	case HKV_FAMILY_SHIFT:
		return (i / f->shift_every) * f->shift_by + gen_zipf(g);
	case HKV_FAMILY_LOOP:
		if (ycsb_rand01(&g->rng) < f->loop_frac)
			return f->keys + (*loop_pos)++ % f->loop_keys;
		return gen_zipf(g);
	default:
		return gen_zipf(g);
	}
}

int hkv_trace_generate(struct hkv_trace *t, const struct hkv_trace_family *f)
{
	struct gen g = {.f = f};
	uint64_t loop_pos = 0, top;

	memset(t, 0, sizeof(*t));
	if (f->keys < 2 || !f->requests || f->theta <= 0 || f->theta >= 1 || !f->value ||
	    (f->value_max && f->value_max < f->value) ||
	    (f->kind == HKV_FAMILY_SCAN && (!f->scan_every || !f->scan_len)) ||
	    (f->kind == HKV_FAMILY_SHIFT && !f->shift_every) ||
	    (f->kind == HKV_FAMILY_LOOP && (!f->loop_keys || f->loop_frac <= 0 || f->loop_frac > 1)))
		return errno = EINVAL, -1;
	/* every id must fit the request's 32 bits */
	top = f->keys + f->loop_keys;
	if (f->kind == HKV_FAMILY_SCAN)
		top += (f->requests / (f->scan_every + f->scan_len) + 1) * f->scan_len;
	if (f->kind == HKV_FAMILY_SHIFT)
		top += (f->requests / f->shift_every) * f->shift_by;
	if (top >= UINT32_MAX)
		return errno = EINVAL, -1;
	ycsb_rng_seed(&g.rng, f->seed);
	ycsb_zipf_init(&g.z, f->keys, f->theta, 0);
	t->cap = f->requests;
	t->req = malloc(t->cap * sizeof(*t->req));
	if (!t->req)
		return errno = ENOMEM, -1;
	for (uint64_t i = 0; i < f->requests; i++)
		if (gen_emit(t, f, gen_next(&g, i, &loop_pos)))
			return errno = ENOMEM, -1;
	t->nkeys = (uint32_t)top; /* every id a request may name: the Zipf ones first */
	return 0;
}

/* ---- CSV ---- */

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
	return h;
}

static const char *name_of(const struct hkv_trace *t, uint32_t id, size_t *len)
{
	*len = t->name_off[id + 1] - t->name_off[id];
	return t->names + t->name_off[id];
}

static int ht_grow(struct hkv_trace *t)
{
	uint64_t n = t->ht ? 2 * (t->ht_mask + 1) : 1024;
	uint32_t *ht = calloc(n, sizeof(*ht));

	if (!ht)
		return -1;
	for (uint32_t id = 0; id < t->nkeys; id++) {
		size_t len;
		const char *s = name_of(t, id, &len);
		uint64_t h = fnv1a(s, len) & (n - 1);

		while (ht[h])
			h = (h + 1) & (n - 1);
		ht[h] = id + 1;
	}
	free(t->ht);
	t->ht = ht;
	t->ht_mask = n - 1;
	return 0;
}

static int name_add(struct hkv_trace *t, const char *s, size_t len)
{
	if (t->names_len + len > t->names_cap) {
		uint64_t cap = t->names_cap ? 2 * t->names_cap : 65536;
		char *p;

		while (cap < t->names_len + len)
			cap *= 2;
		p = realloc(t->names, cap);
		if (!p)
			return -1;
		t->names = p;
		t->names_cap = cap;
	}
	/* name_off has nkeys + 1 entries; grown with the table (load <= 1/2) */
	memcpy(t->names + t->names_len, s, len);
	t->names_len += len;
	t->name_off[t->nkeys + 1] = t->names_len;
	return 0;
}

/* The id of key s, interned if new; -1 when out of memory. */
static int64_t intern(struct hkv_trace *t, const char *s, size_t len)
{
	uint64_t h;

	if (!t->ht || 2 * ((uint64_t)t->nkeys + 1) > t->ht_mask + 1) {
		uint64_t *off = realloc(t->name_off, 2 * (t->ht_mask + 1 + 1024) * sizeof(*off));

		if (!off)
			return -1;
		t->name_off = off;
		if (!t->nkeys)
			off[0] = 0;
		if (ht_grow(t))
			return -1;
	}
	for (h = fnv1a(s, len) & t->ht_mask; t->ht[h]; h = (h + 1) & t->ht_mask) {
		size_t l;
		const char *n = name_of(t, t->ht[h] - 1, &l);

		if (l == len && !memcmp(n, s, len))
			return t->ht[h] - 1;
	}
	if (t->nkeys == UINT32_MAX - 1 || name_add(t, s, len))
		return -1;
	t->ht[h] = ++t->nkeys;
	return t->nkeys - 1;
}

static const struct {
	const char *name;
	enum hkv_trace_op op;
} csv_ops[] = {
	{"get", HKV_TRACE_GET},        {"gets", HKV_TRACE_GET},        {"set", HKV_TRACE_SET},
	{"add", HKV_TRACE_ADD},        {"replace", HKV_TRACE_UPDATE}, {"cas", HKV_TRACE_UPDATE},
	{"append", HKV_TRACE_UPDATE}, {"prepend", HKV_TRACE_UPDATE}, {"incr", HKV_TRACE_UPDATE},
	{"decr", HKV_TRACE_UPDATE},   {"delete", HKV_TRACE_DELETE},
};

static int parse_op(const char *s)
{
	for (size_t i = 0; i < sizeof(csv_ops) / sizeof(csv_ops[0]); i++)
		if (!strcmp(s, csv_ops[i].name))
			return (int)csv_ops[i].op;
	return -1;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *v)
{
	char *end;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || *end || *v > max ? -1 : 0;
}

static int parse_int(const char *s)
{
	char *end;

	if (!*s)
		return -1;
	errno = 0;
	(void)strtoll(s, &end, 10);
	return errno || *end ? -1 : 0;
}

static int parse_num(const char *s)
{
	char *end;

	if (!*s)
		return -1;
	(void)strtod(s, &end);
	return *end ? -1 : 0;
}

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/*
 * One line, split in place: f[0] timestamp, f[1] key (may hold commas),
 * f[2..6] key_size value_size client_id op ttl. -1 if it has fewer fields.
 */
static int split(char *line, char *f[7])
{
	char *c = strchr(line, ',');

	if (!c)
		return -1;
	*c = 0;
	f[0] = line;
	f[1] = c + 1;
	for (int i = 6; i >= 2; i--) {
		c = strrchr(f[1], ',');
		if (!c)
			return -1;
		*c = 0;
		f[i] = c + 1;
	}
	return 0;
}

/* A parsed line into a request; *why says what is wrong on -1. */
static int csv_request(struct hkv_trace *t, char *f[7], uint32_t **last, uint64_t *last_cap,
		       const char **why)
{
	struct hkv_trace_req r;
	uint64_t ks, vs;
	int64_t id;
	int op;

	if (parse_num(f[0]))
		return *why = "timestamp is not a number", -1;
	if (!*f[1])
		return *why = "empty key", -1;
	if (strlen(f[1]) > 65535)
		return *why = "key longer than 65535 bytes", -1;
	if (parse_u64(f[2], 65535, &ks) || parse_u64(f[3], UINT32_MAX, &vs))
		return *why = "key_size or value_size is not a size", -1;
	if (parse_int(f[4]) || parse_int(f[6]))
		return *why = "client_id or ttl is not an integer", -1;
	if ((op = parse_op(f[5])) < 0)
		return *why = "unknown op", -1;
	if ((id = intern(t, f[1], strlen(f[1]))) < 0)
		return *why = "out of memory", -1;
	if ((uint64_t)id >= *last_cap) {
		uint64_t cap = *last_cap ? 2 * *last_cap : 4096;
		uint32_t *p = realloc(*last, cap * sizeof(*p));

		if (!p)
			return *why = "out of memory", -1;
		memset(p + *last_cap, 0, (cap - *last_cap) * sizeof(*p));
		*last = p;
		*last_cap = cap;
	}
	/* a get recorded with no size (a miss) fills with the key's last size */
	if (vs)
		(*last)[id] = (uint32_t)vs;
	else if (op == HKV_TRACE_GET)
		vs = (*last)[id];
	r = (struct hkv_trace_req){.key = (uint32_t)id, .value_size = (uint32_t)vs,
				   .key_size = (uint16_t)ks, .op = (uint8_t)op};
	if (push(t, &r))
		return *why = "out of memory", -1;
	return 0;
}

static int blank(const char *s)
{
	for (; *s; s++)
		if (*s != ' ' && *s != '\t')
			return 0;
	return 1;
}

int hkv_trace_read_csv(struct hkv_trace *t, FILE *in, const char *name, char *err, size_t errlen)
{
	char *line = NULL, *f[7];
	size_t cap = 0;
	ssize_t len;
	uint64_t lineno = 0, last_cap = 0;
	uint32_t *last = NULL;
	int seen = 0, ret = 0;
	const char *why;

	memset(t, 0, sizeof(*t));
	while ((len = getline(&line, &cap, in)) >= 0) {
		lineno++;
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		if (blank(line))
			continue;
		why = "expected 7 fields: timestamp,key,key_size,value_size,client_id,op,ttl";
		if (split(line, f)) {
			ret = -1;
			break;
		}
		/* a header: the first line, its timestamp not a number */
		if (!seen++ && parse_num(f[0]))
			continue;
		if (csv_request(t, f, &last, &last_cap, &why)) {
			ret = -1;
			break;
		}
	}
	if (ret)
		seterr(err, errlen, "%s:%llu: %s", name, (unsigned long long)lineno, why);
	else if (ferror(in))
		ret = -1, seterr(err, errlen, "%s: %s", name, strerror(errno));
	free(line);
	free(last);
	free(t->ht); /* needed only while reading */
	t->ht = NULL;
	t->ht_mask = 0;
	return ret;
}

int hkv_trace_load_csv(struct hkv_trace *t, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	int ret;

	if (!f) {
		memset(t, 0, sizeof(*t));
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	ret = hkv_trace_read_csv(t, f, path, err, errlen);
	fclose(f);
	return ret;
}

size_t hkv_trace_key(const struct hkv_trace *t, uint32_t key, char *buf, size_t cap)
{
	size_t len;
	const char *s;

	if (!t->names)
		return ycsb_key(key, buf, cap);
	s = name_of(t, key, &len);
	if (len > cap)
		return 0;
	memcpy(buf, s, len);
	return len;
}

void hkv_trace_free(struct hkv_trace *t)
{
	free(t->req);
	free(t->names);
	free(t->name_off);
	free(t->ht);
	memset(t, 0, sizeof(*t));
}
