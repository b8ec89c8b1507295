/*
 * hatchkv-hitratio - hit ratios of eviction policies and of real caches on
 * one trace.
 *
 * Input: a Zipfian trace over `keys` keys (theta 0.99; YCSB's generator over
 * exactly the keys) by default, or --family zipf|scan|shift|loop (seeded,
 * bench/trace.h), or --trace FILE (the Twitter cache traces' CSV layout).
 *
 * Server mode (no --policy, no --memcached): the trace is replayed,
 * look-aside style (get; on a miss, set), against a hatchkv-server started
 * with --cache and sized so its value area is `fraction` of the keys'
 * footprint. The same trace is run through an exact LRU cache holding as
 * many items as the server has blocks of the items' class. Both hit ratios
 * are printed side by side, over the whole trace and after the first `keys`
 * requests (warm).
 *
 * Replay mode (--policy and/or --memcached): the exact simulators of
 * bench/sim.h at --cache-bytes, and/or the memcached text protocol against
 * each HOST:PORT given (get; on a miss, set ... noreply), one line each:
 *
 *   # comment lines start with '#'
 *   NAME  REQUESTS  HIT_RATIO%
 *
 * NAME is the policy (lru, lfu, s3fifo; hkv: cache mode's own policy,
 * common/cache_policy.h, sampled as client/evict.c samples) or HOST:PORT;
 * REQUESTS counts the
 * gets replayed (only gets have hits); HIT_RATIO is their hits in percent.
 *
 * With --value-max each key has its own value size, drawn log-uniformly from
 * [--value, --value-max] (fixed per key): the items fall in many size
 * classes, and exact LRU gets the same memory in bytes (the value area),
 * each item charged its block (its size rounded up to its class) - so the
 * difference is what splitting memory by class and moving segments between
 * classes costs.
 *
 * With --max-gap it exits 1 if hatchkv's hit ratio is more than POINTS below
 * exact LRU's (a check, not a timing: the ratios do not depend on speed; a
 * negative POINTS asks for at least that many points above);
 * with --max-set-rt N, if a set (eviction included) took more than N round
 * trips on average (a count, not a timing);
 * with --expect A>B, if A's hit ratio is not above B's (names as printed).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench/sim.h"
#include "bench/trace.h"
#include "bench/ycsb.h"
#include "common/layout.h"
#include "common/transport.h"
#include "hatchkv.h"
#include "tests/support/hkvserver.h"

struct hr_opts {
	uint64_t keys, requests, seed, cache_bytes;
	uint32_t value, value_max;
	double fraction, theta, max_gap, max_set_rt;
	int have_gap;
	int verbs, family;
	const char *trace, *memcached, *expect;
	unsigned policies, s3_promote; /* bit per enum hkv_sim_policy */
	struct hkv_trace_family f;     /* the family's own parameters */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hatchkv-hitratio [--keys N] [--requests N] [--value BYTES] [--value-max BYTES]\n"
		"         [--fraction F] [--theta T] [--seed S] [--verbs] [--max-gap POINTS]\n"
		"         [--max-set-rt N] [--trace FILE | --family zipf|scan|shift|loop [family options]]\n"
		"         [--policy lru,lfu,s3fifo,hkv] [--cache-bytes N[K|M|G]] [--s3fifo-promote N]\n"
		"         [--memcached HOST:PORT[,HOST:PORT...]] [--expect NAME>NAME]\n"
		"  defaults: 100000 keys, 2000000 requests, 1000-byte values, cache = 0.10 of\n"
		"  the footprint, Zipfian theta 0.99, shm transport\n"
		"  family options: --scan-every N --scan-len L (scan: after every N Zipf requests\n"
		"  a one-pass scan of L new keys; default keys, keys/4), --shift-every R\n"
		"  --shift-by N (shift: the Zipf window moves by N ids every R requests; default\n"
		"  requests/10, keys/2), --loop-keys N --loop-frac P (loop: with probability P the\n"
		"  next key of a cycle over N keys; default 0.5 and 1.1x the items that fit)\n"
		"  --trace FILE: CSV timestamp,key,key_size,value_size,client_id,op,ttl\n"
		"  Without --policy and --memcached: a cache-mode hatchkv-server against exact LRU.\n"
		"  With them (replay mode): each policy simulated at --cache-bytes (hkv: cache\n"
		"  mode's own, sampled as a client samples; default: the\n"
		"  fraction of the footprint of the --keys Zipf keys, or of the file's keys; an item\n"
		"  costs key + value + %d bytes), and each memcached-protocol server replayed look-\n"
		"  aside (get; on a miss, set noreply); one line each, '#' lines are comments:\n"
		"    NAME REQUESTS HIT_RATIO%%   (NAME: lru, lfu, s3fifo, hkv or HOST:PORT; REQUESTS:\n"
		"                               gets replayed; HIT_RATIO: hits among them)\n"
		"  --expect A>B: exit 1 unless A's hit ratio is above B's.\n",
		HKV_SIM_ITEM_OVERHEAD);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);

	switch (*end) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	default: return *end ? 0 : v;
	}
}

static int parse_policies(const char *list, unsigned *mask)
{
	char buf[128], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int p = hkv_sim_policy_parse(tok);

		if (p < 0)
			return fprintf(stderr, "hatchkv-hitratio: unknown policy '%s'\n", tok), -1;
		*mask |= 1u << p;
	}
	return 0;
}

static int parse(int argc, char **argv, struct hr_opts *o)
{
	static const struct option lo[] = {
		{"keys", required_argument, NULL, 'k'},   {"requests", required_argument, NULL, 'r'},
		{"value", required_argument, NULL, 'v'},  {"fraction", required_argument, NULL, 'f'},
		{"theta", required_argument, NULL, 't'},  {"seed", required_argument, NULL, 's'},
		{"verbs", no_argument, NULL, 'V'},        {"help", no_argument, NULL, 'h'},
		{"max-gap", required_argument, NULL, 'g'}, {"value-max", required_argument, NULL, 'x'},
		{"trace", required_argument, NULL, 'T'},  {"family", required_argument, NULL, 'F'},
		{"policy", required_argument, NULL, 'P'}, {"cache-bytes", required_argument, NULL, 'c'},
		{"memcached", required_argument, NULL, 'M'}, {"expect", required_argument, NULL, 'e'},
		{"scan-every", required_argument, NULL, 1}, {"scan-len", required_argument, NULL, 2},
		{"shift-every", required_argument, NULL, 3}, {"shift-by", required_argument, NULL, 4},
		{"loop-keys", required_argument, NULL, 5}, {"loop-frac", required_argument, NULL, 6},
		{"s3fifo-promote", required_argument, NULL, 7},
		{"max-set-rt", required_argument, NULL, 8},
		{NULL, 0, NULL, 0}};
	int ch;

	*o = (struct hr_opts){.keys = 100000, .requests = 2000000, .value = 1000, .fraction = 0.10,
			      .theta = 0.99, .seed = 42, .family = -1};
	while ((ch = getopt_long(argc, argv, "k:r:v:f:t:s:Vhg:x:", lo, NULL)) != -1) {
		switch (ch) {
		case 'k': o->keys = strtoull(optarg, NULL, 10); break;
		case 'r': o->requests = strtoull(optarg, NULL, 10); break;
		case 'v': o->value = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'f': o->fraction = strtod(optarg, NULL); break;
		case 't': o->theta = strtod(optarg, NULL); break;
		case 's': o->seed = strtoull(optarg, NULL, 10); break;
		case 'V': o->verbs = 1; break;
		case 'g': o->max_gap = strtod(optarg, NULL); o->have_gap = 1; break;
		case 8: o->max_set_rt = strtod(optarg, NULL); break;
		case 'x': o->value_max = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'T': o->trace = optarg; break;
		case 'F':
			if ((o->family = hkv_trace_family_parse(optarg)) < 0)
				return usage(stderr), -1;
			break;
		case 'P':
			if (parse_policies(optarg, &o->policies))
				return -1;
			break;
		case 'c': o->cache_bytes = parse_size(optarg); break;
		case 'M': o->memcached = optarg; break;
		case 'e': o->expect = optarg; break;
		case 1: o->f.scan_every = strtoull(optarg, NULL, 10); break;
		case 2: o->f.scan_len = strtoull(optarg, NULL, 10); break;
		case 3: o->f.shift_every = strtoull(optarg, NULL, 10); break;
		case 4: o->f.shift_by = strtoull(optarg, NULL, 10); break;
		case 5: o->f.loop_keys = strtoull(optarg, NULL, 10); break;
		case 6: o->f.loop_frac = strtod(optarg, NULL); break;
		case 7: o->s3_promote = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (o->keys < 100 || !o->requests || o->fraction <= 0 || o->fraction >= 1 ||
	    o->theta <= 0 || o->theta >= 1 || o->value == 0 || o->value > 60000 ||
	    (o->value_max && (o->value_max < o->value || o->value_max > 60000)) ||
	    (o->trace && o->family >= 0) || (o->expect && !strchr(o->expect, '>')) ||
	    optind < argc) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Bytes the simulators charge for the ids [0, n) of a family. */
static uint64_t family_footprint(const struct hr_opts *o, uint64_t n)
{
	struct hkv_trace_family f = {.value = o->value, .value_max = o->value_max};

	return hkv_trace_family_bytes(&f, n, HKV_SIM_ITEM_OVERHEAD);
}

/* Bytes the simulators charge for every key a trace names, at its largest. */
static uint64_t trace_footprint(const struct hkv_trace *t)
{
	uint64_t *sz = calloc(t->nkeys, sizeof(*sz)), sum = 0;

	if (!sz)
		return 0;
	for (uint64_t i = 0; i < t->n; i++) {
		const struct hkv_trace_req *r = &t->req[i];
		uint64_t b = (uint64_t)r->key_size + r->value_size + HKV_SIM_ITEM_OVERHEAD;

		if (b > sz[r->key])
			sz[r->key] = b;
	}
	for (uint32_t k = 0; k < t->nkeys; k++)
		sum += sz[k];
	free(sz);
	return sum;
}

/* The trace the options ask for; the legacy Zipf trace is the zipf family. */
static int load_trace(struct hr_opts *o, struct hkv_trace *t)
{
	char err[256];
	struct hkv_trace_family *f = &o->f;

	if (o->trace) {
		if (hkv_trace_load_csv(t, o->trace, err, sizeof(err)))
			return fprintf(stderr, "hatchkv-hitratio: %s\n", err), -1;
		if (!t->n)
			return fprintf(stderr, "hatchkv-hitratio: %s: no requests\n", o->trace), -1;
		return 0;
	}
	f->kind = o->family < 0 ? HKV_FAMILY_ZIPF : (enum hkv_trace_family_kind)o->family;
	f->seed = o->seed;
	f->keys = o->keys;
	f->requests = o->requests;
	f->value = o->value;
	f->value_max = o->value_max;
	f->theta = o->theta;
	hkv_trace_family_defaults(f);
	if (f->kind == HKV_FAMILY_LOOP && !f->loop_keys) {
		uint64_t cap = o->cache_bytes ? o->cache_bytes
					      : (uint64_t)(o->fraction *
							   (double)family_footprint(o, o->keys));

		f->loop_keys = hkv_trace_loop_keys_for(f, cap, HKV_SIM_ITEM_OVERHEAD);
	}
	if (hkv_trace_generate(t, f))
		return fprintf(stderr, "hatchkv-hitratio: cannot generate the %s family: %s\n",
			       hkv_trace_family_name(f->kind), strerror(errno)), -1;
	return 0;
}

static void describe_trace(const struct hr_opts *o, const struct hkv_trace *t)
{
	const struct hkv_trace_family *f = &o->f;

	if (o->trace) {
		printf("# trace %s: %llu requests over %u keys\n", o->trace,
		       (unsigned long long)t->n, t->nkeys);
		return;
	}
	printf("# family %s, seed %llu: %llu requests, Zipf %.2f over %llu keys, values %u-%u B",
	       hkv_trace_family_name(f->kind), (unsigned long long)f->seed,
	       (unsigned long long)f->requests, f->theta, (unsigned long long)f->keys, f->value,
	       f->value_max ? f->value_max : f->value);
	if (f->kind == HKV_FAMILY_SCAN)
		printf(", a scan of %llu new keys after every %llu", (unsigned long long)f->scan_len,
		       (unsigned long long)f->scan_every);
	else if (f->kind == HKV_FAMILY_SHIFT)
		printf(", moved by %llu ids every %llu requests", (unsigned long long)f->shift_by,
		       (unsigned long long)f->shift_every);
	else if (f->kind == HKV_FAMILY_LOOP)
		printf(", %.0f%% of requests a loop over %llu keys", 100.0 * f->loop_frac,
		       (unsigned long long)f->loop_keys);
	printf("\n");
}

/* ---- replay mode: results by name ---- */

struct result {
	char name[96];
	uint64_t gets, hits;
};

static void print_result(const struct result *r)
{
	printf("%-24s %10llu %8.2f%%\n", r->name, (unsigned long long)r->gets,
	       r->gets ? 100.0 * (double)r->hits / (double)r->gets : 0.0);
	fflush(stdout);
}

static int run_policy(const struct hr_opts *o, const struct hkv_trace *t, uint64_t cap,
		      enum hkv_sim_policy p, struct result *res)
{
	struct hkv_sim_config cfg = {.policy = p, .cap_bytes = cap, .nkeys = t->nkeys,
				     .s3_promote = o->s3_promote};
	struct hkv_sim *s = hkv_sim_create(&cfg);
	struct hkv_sim_stats st;
	double t0 = now_s();

	if (!s)
		return fprintf(stderr, "hatchkv-hitratio: %s: %s\n", hkv_sim_policy_name(p),
			       strerror(errno)), -1;
	for (uint64_t i = 0; i < t->n; i++)
		hkv_sim_request(s, &t->req[i]);
	hkv_sim_stats(s, &st);
	printf("# %s: %.2f s, %llu evictions, %llu items cached at the end\n",
	       hkv_sim_policy_name(p), now_s() - t0, (unsigned long long)st.evictions,
	       (unsigned long long)st.items);
	snprintf(res->name, sizeof(res->name), "%s", hkv_sim_policy_name(p));
	res->gets = st.gets;
	res->hits = st.hits;
	hkv_sim_destroy(s);
	return 0;
}

/* ---- replay mode: the memcached text protocol over TCP ---- */

struct mc_conn {
	int fd;
	char in[65536];
	size_t ilen, ipos;
	char *out;
	size_t olen, ocap;
	uint64_t errors;
};

static int mc_connect(struct mc_conn *m, const char *addr)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *a;
	int one = 1, rc;

	if (!colon || (size_t)(colon - addr) >= sizeof(host))
		return fprintf(stderr, "hatchkv-hitratio: '%s' is not HOST:PORT\n", addr), -1;
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = 0;
	rc = getaddrinfo(host, colon + 1, &hints, &ai);
	if (rc)
		return fprintf(stderr, "hatchkv-hitratio: %s: %s\n", addr, gai_strerror(rc)), -1;
	m->fd = -1;
	for (a = ai; a && m->fd < 0; a = a->ai_next) {
		m->fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
		if (m->fd >= 0 && connect(m->fd, a->ai_addr, a->ai_addrlen)) {
			close(m->fd);
			m->fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (m->fd < 0)
		return fprintf(stderr, "hatchkv-hitratio: %s: cannot connect\n", addr), -1;
	setsockopt(m->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

static int mc_put(struct mc_conn *m, const void *p, size_t n)
{
	if (m->olen + n > m->ocap) {
		size_t cap = m->ocap ? m->ocap : 65536;
		char *q;

		while (cap < m->olen + n)
			cap *= 2;
		if (!(q = realloc(m->out, cap)))
			return -1;
		m->out = q;
		m->ocap = cap;
	}
	memcpy(m->out + m->olen, p, n);
	m->olen += n;
	return 0;
}

static int mc_flush(struct mc_conn *m)
{
	for (size_t off = 0; off < m->olen;) {
		ssize_t n = write(m->fd, m->out + off, m->olen - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		off += (size_t)n;
	}
	m->olen = 0;
	return 0;
}

static int mc_fill(struct mc_conn *m)
{
	ssize_t n;

	if (m->ipos) {
		memmove(m->in, m->in + m->ipos, m->ilen - m->ipos);
		m->ilen -= m->ipos;
		m->ipos = 0;
	}
	if (m->ilen == sizeof(m->in))
		return -1;
	do
		n = read(m->fd, m->in + m->ilen, sizeof(m->in) - m->ilen);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -1;
	m->ilen += (size_t)n;
	return 0;
}

/* The next reply line (terminated in place, without \r\n); NULL on EOF. */
static char *mc_line(struct mc_conn *m)
{
	for (;;) {
		char *nl = memchr(m->in + m->ipos, '\n', m->ilen - m->ipos), *line;

		if (nl) {
			line = m->in + m->ipos;
			m->ipos = (size_t)(nl - m->in) + 1;
			*nl = 0;
			if (nl > line && nl[-1] == '\r')
				nl[-1] = 0;
			return line;
		}
		if (mc_fill(m))
			return NULL;
	}
}

static int mc_skip(struct mc_conn *m, size_t n)
{
	while (m->ilen - m->ipos < n) {
		n -= m->ilen - m->ipos;
		m->ipos = m->ilen;
		if (mc_fill(m))
			return -1;
	}
	m->ipos += n;
	return 0;
}

/* get: 1 hit, 0 miss, -1 connection lost. Error lines (a noreply write the
 * server refused) are counted and passed over. */
static int mc_get(struct mc_conn *m, const char *key, size_t klen)
{
	int hit = 0;
	char *line;

	if (mc_put(m, "get ", 4) || mc_put(m, key, klen) || mc_put(m, "\r\n", 2) || mc_flush(m))
		return -1;
	while ((line = mc_line(m))) {
		unsigned long flags, bytes;

		if (!strcmp(line, "END"))
			return hit;
		if (sscanf(line, "VALUE %*s %lu %lu", &flags, &bytes) == 2) {
			if (mc_skip(m, bytes + 2))
				return -1;
			hit = 1;
			continue;
		}
		m->errors++;
	}
	return -1;
}

/* A write with noreply, buffered until the next get. */
static int mc_write(struct mc_conn *m, const char *cmd, const char *key, size_t klen,
		    const char *val, uint32_t vlen)
{
	char hdr[64];
	int n = snprintf(hdr, sizeof(hdr), " 0 0 %u noreply\r\n", vlen);

	return mc_put(m, cmd, strlen(cmd)) || mc_put(m, key, klen) || mc_put(m, hdr, (size_t)n) ||
	       mc_put(m, val, vlen) || mc_put(m, "\r\n", 2) ? -1 : 0;
}

static int mc_key_ok(const char *k, size_t n)
{
	if (!n || n > 250)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)k[i] <= ' ' || k[i] == 0x7f)
			return 0;
	return 1;
}

static int mc_request(struct mc_conn *m, const struct hkv_trace_req *r, const char *key,
		      size_t klen, const char *val, struct result *res)
{
	static const char *const cmd[] = {
		[HKV_TRACE_SET] = "set ", [HKV_TRACE_ADD] = "add ", [HKV_TRACE_UPDATE] = "replace "};
	int hit;

	switch (r->op) {
	case HKV_TRACE_GET:
		if ((hit = mc_get(m, key, klen)) < 0)
			return -1;
		res->gets++;
		res->hits += (uint64_t)hit;
		return hit ? 0 : mc_write(m, "set ", key, klen, val, r->value_size);
	case HKV_TRACE_DELETE:
		return mc_put(m, "delete ", 7) || mc_put(m, key, klen) ||
		       mc_put(m, " noreply\r\n", 10) ? -1 : 0;
	default:
		return mc_write(m, cmd[r->op], key, klen, val, r->value_size);
	}
}

static int run_memcached(const struct hkv_trace *t, const char *addr, const char *val,
			 struct result *res)
{
	struct mc_conn m = {.fd = -1};
	uint64_t skipped = 0;
	double t0 = now_s();
	char key[256], *line;
	int ret = -1;

	if (mc_connect(&m, addr))
		return -1;
	if (mc_put(&m, "version\r\n", 9) || mc_flush(&m) || !(line = mc_line(&m))) {
		fprintf(stderr, "hatchkv-hitratio: %s: no answer to version\n", addr);
		goto close_fd;
	}
	printf("# %s: %s\n", addr, line);
	snprintf(res->name, sizeof(res->name), "%s", addr);
	for (uint64_t i = 0; i < t->n; i++) {
		size_t klen = hkv_trace_key(t, t->req[i].key, key, sizeof(key));

		if (!mc_key_ok(key, klen)) { /* not a memcached key */
			skipped++;
			continue;
		}
		if (mc_request(&m, &t->req[i], key, klen, val, res)) {
			fprintf(stderr, "hatchkv-hitratio: %s: connection lost at request %llu\n",
				addr, (unsigned long long)i + 1);
			goto close_fd;
		}
	}
	/* the writes still buffered, and one get to see they were taken */
	if (mc_flush(&m) || mc_get(&m, "hatchkv-hitratio-end", 20) < 0)
		goto close_fd;
	printf("# %s: %.1f s, %llu error replies, %llu requests skipped (keys memcached refuses)\n",
	       addr, now_s() - t0, (unsigned long long)m.errors, (unsigned long long)skipped);
	ret = 0;
close_fd:
	close(m.fd);
	free(m.out);
	return ret;
}

/* --expect A>B against the results printed. */
static int check_expect(const char *expect, const struct result *res, int n)
{
	char a[96];
	const char *gt = strchr(expect, '>');
	const struct result *ra = NULL, *rb = NULL;
	double pa, pb;

	snprintf(a, sizeof(a), "%.*s", (int)(gt - expect), expect);
	for (int i = 0; i < n; i++) {
		if (!strcmp(res[i].name, a))
			ra = &res[i];
		if (!strcmp(res[i].name, gt + 1))
			rb = &res[i];
	}
	if (!ra || !rb || !ra->gets || !rb->gets) {
		printf("FAIL: --expect %s names a result not printed\n", expect);
		return 1;
	}
	pa = 100.0 * (double)ra->hits / (double)ra->gets;
	pb = 100.0 * (double)rb->hits / (double)rb->gets;
	printf("%s: %s %.2f%% %s %s %.2f%%\n", pa > pb ? "ok" : "FAIL", a, pa,
	       pa > pb ? ">" : "<=", gt + 1, pb);
	return pa > pb ? 0 : 1;
}

static int run_replay(struct hr_opts *o, const struct hkv_trace *t)
{
	struct result res[HKV_SIM_NPOLICIES + 16];
	uint64_t cap = o->cache_bytes, vmax = 0;
	char *val, list[1024], *save = NULL, *addr;
	int n = 0, ret = 0;

	if (!cap)
		cap = (uint64_t)(o->fraction * (double)(o->trace ? trace_footprint(t)
								 : family_footprint(o, o->keys)));
	describe_trace(o, t);
	printf("# simulators: %llu bytes (%.1f MiB); an item costs key + value + %d B\n",
	       (unsigned long long)cap, (double)cap / 1048576.0, HKV_SIM_ITEM_OVERHEAD);
	printf("# %-22s %10s %9s\n", "name", "requests", "hit ratio");
	for (int p = 0; p < HKV_SIM_NPOLICIES; p++) {
		if (!(o->policies & (1u << p)))
			continue;
		memset(&res[n], 0, sizeof(res[n]));
		if (run_policy(o, t, cap, (enum hkv_sim_policy)p, &res[n]))
			return 1;
		print_result(&res[n++]);
	}
	if (o->memcached) {
		for (uint64_t i = 0; i < t->n; i++)
			vmax = t->req[i].value_size > vmax ? t->req[i].value_size : vmax;
		if (!(val = malloc(vmax + 1)))
			return fprintf(stderr, "hatchkv-hitratio: out of memory\n"), 1;
		memset(val, 'v', vmax + 1);
		snprintf(list, sizeof(list), "%s", o->memcached);
		for (addr = strtok_r(list, ",", &save); addr; addr = strtok_r(NULL, ",", &save)) {
			if (n == (int)(sizeof(res) / sizeof(res[0])))
				break;
			memset(&res[n], 0, sizeof(res[n]));
			if (run_memcached(t, addr, val, &res[n])) {
				ret = 1;
				continue;
			}
			print_result(&res[n++]);
		}
		free(val);
	}
	if (o->expect)
		ret |= check_expect(o->expect, res, n);
	return ret;
}

/* ---- server mode ---- */

/*
 * The smallest region (in KiB) whose value area holds `want` bytes, with
 * 64 KiB segments and an index of `slots` slots: found with the same
 * geometry code the server uses.
 */
static uint64_t region_kib_for(uint64_t want, uint64_t slots)
{
	struct hkv_geometry g;

	for (uint64_t kib = (want >> 10) + 1024;; kib += 64)
		if (!hkv_geometry_init(&g, kib << 10, 64u << 10, slots, HKV_GEOM_F_CACHE, 0) &&
		    (uint64_t)g.nsegs * g.seg_size >= want)
			return kib;
}

/* One request to the server: 1 if a get hit, 0 if not, -1 on an error. */
static int hkv_request(struct hkv_client *c, const struct hkv_trace_req *r, const char *key,
		       size_t klen, const uint8_t *val, uint8_t *buf, size_t cap)
{
	size_t vlen;
	int ret;

	switch (r->op) {
	case HKV_TRACE_GET:
		ret = hkv_get(c, key, klen, buf, cap, &vlen, NULL);
		if (ret == 0)
			return 1;
		return ret != HKV_ENOTFOUND || hkv_set(c, key, klen, val, r->value_size, NULL) ? -1
											  : 0;
	case HKV_TRACE_SET:
		return hkv_set(c, key, klen, val, r->value_size, NULL) ? -1 : 0;
	case HKV_TRACE_ADD:
		ret = hkv_add(c, key, klen, val, r->value_size, NULL);
		return ret && ret != HKV_EEXISTS ? -1 : 0;
	case HKV_TRACE_UPDATE:
		ret = hkv_replace(c, key, klen, val, r->value_size, NULL);
		return ret && ret != HKV_ENOTFOUND ? -1 : 0;
	default:
		ret = hkv_delete(c, key, klen);
		return ret && ret != HKV_ENOTFOUND ? -1 : 0;
	}
}

static int run_server(const struct hr_opts *o, const struct hkv_trace *t)
{
	struct hkv_server_info si;
	struct hkv_client_stats st;
	struct hkvserver srv;
	struct hkv_geometry g;
	struct hkv_client *c;
	struct hkv_sim *lru;
	uint64_t hits_lru = 0, hits_hkv = 0, warm_lru = 0, warm_hkv = 0, errors = 0;
	uint64_t item, footprint = 0, slots, cap, gets_rt = 0, *isz, nkeys = t->nkeys;
	uint64_t gets = 0, warm_gets = 0, warm_from = o->trace ? nkeys : o->keys;
	uint32_t *vsz, vmax = 0;
	char kib[32], slots_arg[32], key[256];
	const char *extra[] = {"--cache", "--index-slots", slots_arg, NULL};
	uint8_t *val, *buf;
	double t0, secs;
	int cls, uniform = !o->trace && !o->value_max;

	if (o->verbs && !hkv_verbs_available()) {
		fprintf(stderr, "hatchkv-hitratio: no RDMA device\n");
		return 1;
	}
	/* one item's block: header + key + value, rounded to its class */
	hkv_geometry_init(&g, 64ull << 20, 64u << 10, 0, HKV_GEOM_F_CACHE, 0);
	vsz = calloc(nkeys, sizeof(*vsz));
	isz = calloc(nkeys, sizeof(*isz));
	if (!vsz || !isz)
		return fprintf(stderr, "hatchkv-hitratio: out of memory\n"), 1;
	if (o->trace) /* a key's largest value in the file */
		for (uint64_t i = 0; i < t->n; i++)
			if (t->req[i].value_size > vsz[t->req[i].key])
				vsz[t->req[i].key] = t->req[i].value_size;
	for (uint64_t k = 0; k < nkeys; k++) {
		if (!o->trace)
			vsz[k] = hkv_trace_value_size(k, o->value, o->value_max);
		vmax = vsz[k] > vmax ? vsz[k] : vmax;
		cls = hkv_class_for(&g, (uint32_t)(HKV_BLOCK_HDR + 24 + vsz[k]));
		if (cls < 0)
			return fprintf(stderr, "hatchkv-hitratio: value too large\n"), 1;
		isz[k] = g.class_size[cls];
		/* the footprint the cache is a fraction of: a family's Zipf keys */
		footprint += o->trace || k < o->keys ? isz[k] : 0;
	}
	item = isz[0];
	slots = 1;
	while (slots < 4 * (uint64_t)(o->fraction * (double)(o->trace ? nkeys : o->keys)) + 64)
		slots <<= 1; /* the index is never what evicts */
	snprintf(slots_arg, sizeof(slots_arg), "%llu", (unsigned long long)slots);
	snprintf(kib, sizeof(kib), "%lluK",
		 (unsigned long long)region_kib_for((uint64_t)(o->fraction * (double)footprint), slots));
	if (hkvserver_start(&srv, o->verbs, kib, "64K", extra)) {
		fprintf(stderr, "hatchkv-hitratio: cannot start hatchkv-server\n");
		return 1;
	}
	c = hkvserver_client(&srv);
	hkv_server_info(c, &si);
	/* exact LRU's memory: as many blocks as the server's segments hold (one
	 * size), or the value area's bytes (many sizes) */
	cap = uniform ? si.value_bytes / si.segment_bytes * (si.segment_bytes / item) * item
		      : si.value_bytes;

	val = malloc(vmax + 1);
	buf = malloc(vmax + 64);
	/* (exact LRU, charging each key its block) */
	lru = hkv_sim_create(&(struct hkv_sim_config){.policy = HKV_SIM_LRU, .cap_bytes = cap,
						      .nkeys = (uint32_t)nkeys, .item_bytes = isz});
	if (!val || !buf || !lru) {
		fprintf(stderr, "hatchkv-hitratio: out of memory\n");
		return 1;
	}
	memset(val, 'v', vmax + 1);

	for (uint64_t i = 0; i < t->n; i++) {
		int hit = hkv_sim_request(lru, &t->req[i]);

		hits_lru += (uint64_t)hit;
		warm_lru += i >= warm_from ? (uint64_t)hit : 0;
	}
	t0 = now_s();
	for (uint64_t i = 0; i < t->n; i++) {
		const struct hkv_trace_req *r = &t->req[i];
		size_t klen = hkv_trace_key(t, r->key, key, sizeof(key));
		int hit = klen ? hkv_request(c, r, key, klen, val, buf, vmax + 64) : -1;

		gets += r->op == HKV_TRACE_GET;
		warm_gets += r->op == HKV_TRACE_GET && i >= warm_from;
		if (hit < 0) {
			errors++;
			continue;
		}
		hits_hkv += (uint64_t)hit;
		warm_hkv += i >= warm_from ? (uint64_t)hit : 0;
	}
	secs = now_s() - t0;
	if (!warm_gets)
		warm_gets = 1;
	hkv_client_stats(c, &st);
	gets_rt = st.op[HKV_OP_GET].round_trips;
	if (o->trace)
		printf("hit ratio, trace %s: %llu requests (%llu gets; set on a miss) over %llu keys\n",
		       o->trace, (unsigned long long)t->n, (unsigned long long)gets,
		       (unsigned long long)nkeys);
	else if (o->family >= 0 && o->family != HKV_FAMILY_ZIPF)
		describe_trace(o, t);
	if (!o->trace && o->value_max)
		printf("hit ratio, Zipfian theta %.2f over %llu keys, %llu requests (get; set on a "
		       "miss), values of %u-%u bytes, log-uniform, fixed per key\n",
		       o->theta, (unsigned long long)o->keys, (unsigned long long)o->requests, o->value,
		       o->value_max);
	else if (!o->trace)
		printf("hit ratio, Zipfian theta %.2f over %llu keys, %llu requests (get; set on a "
		       "miss), %u-byte values (%llu-byte blocks)\n",
		       o->theta, (unsigned long long)o->keys, (unsigned long long)o->requests,
		       o->value, (unsigned long long)item);
	printf("cache: %.1f%% of the %.1f MiB footprint = %.1f MiB for exact LRU (hatchkv-server "
	       "--cache --memory %s: %llu segments of 64 KiB)\n",
	       100.0 * (double)cap / (double)footprint, (double)footprint / 1048576.0,
	       (double)cap / 1048576.0, kib,
	       (unsigned long long)(si.value_bytes / si.segment_bytes));
	printf("%-24s %10s %16s\n", "", "all", "after 1st pass");
	printf("%-24s %9.2f%% %15.2f%%\n", "exact LRU", 100.0 * (double)hits_lru / (double)gets,
	       100.0 * (double)warm_lru / (double)warm_gets);
	printf("%-24s %9.2f%% %15.2f%%\n", "hatchkv (cache mode)",
	       100.0 * (double)hits_hkv / (double)gets,
	       100.0 * (double)warm_hkv / (double)warm_gets);
	printf("exact LRU - hatchkv: %.2f points (warm: %.2f); hatchkv: %llu evictions, %.3f round trips "
	       "per get, %.0f requests/s, %llu errors\n",
	       100.0 * ((double)hits_lru - (double)hits_hkv) / (double)gets,
	       100.0 * ((double)warm_lru - (double)warm_hkv) / (double)warm_gets,
	       (unsigned long long)st.evictions, (double)gets_rt / (double)gets,
	       (double)t->n / secs, (unsigned long long)errors);
	/* what moving memory between classes costs: CARVE requests (the server
	 * carves or moves a segment) happen inside the sets that needed them */
	printf("sets: %llu, %.3f round trips each; %llu CARVE request(s) (one per %.0f sets), "
	       "%llu claims (%llu lost), %llu surveys, %llu blocks kept, %llu given back\n",
	       (unsigned long long)st.op[HKV_OP_SET].count,
	       st.op[HKV_OP_SET].count ? (double)st.op[HKV_OP_SET].round_trips /
					 (double)st.op[HKV_OP_SET].count : 0.0,
	       (unsigned long long)st.carves,
	       st.carves ? (double)st.op[HKV_OP_SET].count / (double)st.carves : 0.0,
	       (unsigned long long)st.claims, (unsigned long long)st.claims_lost,
	       (unsigned long long)st.surveys, (unsigned long long)st.blocks_kept,
	       (unsigned long long)st.blocks_given_back);
	hkv_close(c);
	hkvserver_stop(&srv);
	hkv_sim_destroy(lru);
	free(vsz);
	free(isz);
	free(val);
	free(buf);
	if (o->max_set_rt > 0 && st.op[HKV_OP_SET].count &&
	    (double)st.op[HKV_OP_SET].round_trips / (double)st.op[HKV_OP_SET].count > o->max_set_rt) {
		printf("FAIL: sets took more than %.2f round trips each\n", o->max_set_rt);
		return 1;
	}
	if (o->have_gap && 100.0 * ((double)hits_lru - (double)hits_hkv) / (double)gets >
				   o->max_gap) {
		if (o->max_gap >= 0)
			printf("FAIL: more than %.1f points below exact LRU\n", o->max_gap);
		else
			printf("FAIL: not %.1f points above exact LRU\n", -o->max_gap);
		return 1;
	}
	return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct hr_opts o;
	struct hkv_trace t;
	int ret;

	if (parse(argc, argv, &o))
		return 2;
	if (load_trace(&o, &t)) {
		hkv_trace_free(&t);
		return 1;
	}
	if (o.policies || o.memcached)
		ret = run_replay(&o, &t);
	else
		ret = run_server(&o, &t);
	hkv_trace_free(&t);
	return ret;
}
