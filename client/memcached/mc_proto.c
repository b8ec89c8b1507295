/*
 * mc_proto.c - memcached text protocol parser (see mc_proto.h for the contract).
 *
 * Number rules follow memcached's safe_strto* helpers (strtoull/strtol
 * semantics: optional leading white space and sign, a '-' never makes a
 * negative value pass as unsigned), so replies match byte for byte.
 */
#include "client/memcached/mc_proto.h"

#include <string.h>

struct tok {
	const char *p;
	size_t len;
};

struct line {
	struct tok t[MC_MAX_TOKENS + 1];
	int n;           /* tokens found (MC_MAX_TOKENS + 1 = too many) */
	const char *end; /* end of the line's content */
};

static const char *const err_text[MC_E_NTYPES] = {
	[MC_OK] = "",
	[MC_E_ERROR] = "ERROR",
	[MC_E_FORMAT] = "CLIENT_ERROR bad command line format",
	[MC_E_CHUNK] = "CLIENT_ERROR bad data chunk",
	[MC_E_TOO_LARGE] = "SERVER_ERROR object too large for cache",
	[MC_E_DELTA] = "CLIENT_ERROR invalid numeric delta argument",
	[MC_E_EXPTIME] = "CLIENT_ERROR invalid exptime argument",
	[MC_E_DELETE_USAGE] = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
	[MC_E_BAD_FLAG] = "CLIENT_ERROR invalid flag",
	[MC_E_DUP_FLAG] = "CLIENT_ERROR duplicate flag",
	[MC_E_BAD_DUP_FLAG] = "CLIENT_ERROR invalid or duplicate flag",
	[MC_E_BAD_TOKEN] = "CLIENT_ERROR bad token in command line format",
	[MC_E_BAD_MODE] = "CLIENT_ERROR invalid mode for ms M token",
	[MC_E_OPAQUE] = "CLIENT_ERROR opaque token too long",
	[MC_E_STATS_DETAIL] = "CLIENT_ERROR usage: stats detail on|off|dump",
	[MC_E_HTTP] = "(an HTTP request line: closed without a reply)", /* never sent */
};

const char *mc_strerror(enum mc_err err)
{
	return (unsigned)err < MC_E_NTYPES ? err_text[err] : "SERVER_ERROR internal";
}

/* ---- numbers, as memcached's safe_strtoull / safe_strtol read them -------- */

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* strtoull over [p, p + len): 1 and *out if the digits end the token or
 * are followed by white space; *neg tells whether a '-' was seen. */
static int scan_u64(const char *p, size_t len, uint64_t *out, int *neg, int nul_ends)
{
	const char *e = p + len;
	uint64_t v = 0;
	int digits = 0;

	while (p < e && is_space(*p))
		p++;
	*neg = 0;
	if (p < e && (*p == '+' || *p == '-'))
		*neg = *p++ == '-';
	for (; p < e && *p >= '0' && *p <= '9'; p++, digits++) {
		uint64_t d = (uint64_t)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return 0; /* ERANGE */
		v = v * 10 + d;
	}
	if (!digits || (p < e && !is_space(*p) && !(nul_ends && *p == '\0')))
		return 0;
	*out = *neg ? 0 - v : v;
	return 1;
}

static int parse_u64(struct tok t, uint64_t *out)
{
	int neg;

	if (!scan_u64(t.p, t.len, out, &neg, 0))
		return 0;
	return !((int64_t)*out < 0 && neg);
}

int mc_value_number(const char *p, size_t len, uint64_t *out)
{
	int neg;

	if (!len || !scan_u64(p, len, out, &neg, 1))
		return 0;
	return !((int64_t)*out < 0 && neg);
}

static int parse_i32(struct tok t, int64_t *out)
{
	uint64_t v;
	int neg;

	if (!scan_u64(t.p, t.len, &v, &neg, 0))
		return 0;
	if (neg ? 0 - v > (uint64_t)INT32_MAX + 1 : v > INT32_MAX)
		return 0;
	*out = neg ? -(int64_t)(0 - v) : (int64_t)v;
	return 1;
}

static int tok_is(struct tok t, const char *s)
{
	size_t n = strlen(s);

	return t.len == n && memcmp(t.p, s, n) == 0;
}

/* ---- lines and tokens --------------------------------------------------- */

static const char *skip_spaces(const char *p, const char *end)
{
	while (p < end && *p == ' ')
		p++;
	return p;
}

static struct tok next_token(const char **pos, const char *end)
{
	const char *p = skip_spaces(*pos, end), *s = p;

	while (p < end && *p != ' ')
		p++;
	*pos = p;
	return (struct tok){s, (size_t)(p - s)};
}

static void tokenize(struct line *l, const char *p, const char *end)
{
	l->n = 0;
	l->end = end;
	for (;;) {
		struct tok t = next_token(&p, end);

		if (!t.len)
			return;
		if (l->n == MC_MAX_TOKENS + 1)
			return;
		l->t[l->n++] = t;
	}
}

/* A line too long for its command: only get/gets may be long (multigets). */
static int long_line_ok(const char *buf, size_t len)
{
	const char *p = skip_spaces(buf, buf + (len < 101 ? len : 101));

	if (p - buf > 100)
		return 0;
	len -= (size_t)(p - buf);
	return (len >= 4 && !memcmp(p, "get ", 4)) || (len >= 5 && !memcmp(p, "gets ", 5));
}

/* ---- commands ----------------------------------------------------------- */

static int set_key(struct mc_req *r, struct tok t)
{
	r->key = t.p;
	r->klen = t.len;
	return t.len <= MC_KEY_MAX;
}

static int noreply_last(struct mc_req *r, const struct line *l)
{
	r->noreply = l->n > 1 && tok_is(l->t[l->n - 1], "noreply");
	return r->noreply;
}

/* memcached's item accounting for the -I limit. */
static int item_too_big(size_t klen, size_t vlen, size_t item_max)
{
	return 48 + 8 + klen + 1 + vlen + 2 > item_max;
}

/* Data block of a storage request after a line of `used` bytes. */
static int take_block(struct mc_req *r, size_t used, size_t len, const char *buf)
{
	size_t total = used + r->dlen + 2;

	if (len < total) {
		r->need = total;
		return 0;
	}
	r->data = buf + used;
	if (buf[used + r->dlen] != '\r' || buf[used + r->dlen + 1] != '\n')
		r->err = MC_E_CHUNK;
	return (int)total;
}

static int parse_storage(struct mc_req *r, const struct line *l, const char *buf, size_t used,
			 size_t len, size_t item_max)
{
	int is_cas = r->cmd == MC_CMD_CAS, want = is_cas ? 6 : 5;
	uint64_t flags, vlen64;
	int64_t vlen;

	if (l->n != want && l->n != want + 1)
		return r->err = MC_E_ERROR, (int)used;
	noreply_last(r, l);
	if (!set_key(r, l->t[1]))
		return r->err = MC_E_FORMAT, (int)used;
	if (!parse_u64(l->t[2], &flags) || !parse_i32(l->t[3], &r->exptime) ||
	    !parse_i32(l->t[4], &vlen) || (is_cas && !parse_u64(l->t[5], &r->cas)))
		return r->err = MC_E_FORMAT, (int)used;
	if (vlen < 0 || vlen > INT32_MAX - 2)
		return r->err = MC_E_FORMAT, (int)used;
	r->flags = (uint32_t)flags;
	vlen64 = (uint64_t)vlen;
	r->dlen = (size_t)vlen64;
	if (item_too_big(r->klen, r->dlen, item_max)) {
		r->err = MC_E_TOO_LARGE;
		r->swallow = r->dlen + 2;
		return (int)used;
	}
	return take_block(r, used, len, buf);
}

static int parse_retrieval(struct mc_req *r, const char *p, const char *end)
{
	const char *k;
	size_t kl;

	if (r->cmd == MC_CMD_GAT || r->cmd == MC_CMD_GATS) {
		struct tok t = next_token(&p, end);

		if (!t.len)
			return r->err = MC_E_ERROR, 0;
		if (!parse_i32(t, &r->exptime))
			return r->err = MC_E_EXPTIME, 0;
	}
	p = skip_spaces(p, end);
	r->keys = p;
	r->keys_len = (size_t)(end - p);
	while (mc_key_next(&p, end, &k, &kl)) {
		r->nkeys++;
		if (kl > MC_KEY_MAX)
			return r->err = MC_E_FORMAT, 0;
	}
	if (!r->nkeys)
		r->err = MC_E_ERROR;
	return 0;
}

int mc_key_next(const char **pos, const char *end, const char **key, size_t *klen)
{
	struct tok t = next_token(pos, end);

	*key = t.p;
	*klen = t.len;
	return t.len > 0;
}

static void parse_arith(struct mc_req *r, const struct line *l)
{
	if (l->n != 3 && l->n != 4) {
		r->err = MC_E_ERROR;
		return;
	}
	noreply_last(r, l);
	if (!set_key(r, l->t[1]))
		r->err = MC_E_FORMAT;
	else if (!parse_u64(l->t[2], &r->delta))
		r->err = MC_E_DELTA;
}

static void parse_touch(struct mc_req *r, const struct line *l)
{
	if (l->n != 3 && l->n != 4) {
		r->err = MC_E_ERROR;
		return;
	}
	noreply_last(r, l);
	if (!set_key(r, l->t[1]))
		r->err = MC_E_FORMAT;
	else if (!parse_i32(l->t[2], &r->exptime))
		r->err = MC_E_EXPTIME;
}

static void parse_delete(struct mc_req *r, const struct line *l)
{
	if (l->n < 2 || l->n > 4) {
		r->err = MC_E_ERROR;
		return;
	}
	if (l->n > 2) {
		int zero = tok_is(l->t[2], "0"), nr = noreply_last(r, l);

		if (!((l->n == 3 && (zero || nr)) || (l->n == 4 && zero && nr))) {
			r->err = MC_E_DELETE_USAGE;
			return;
		}
	}
	if (!set_key(r, l->t[1]))
		r->err = MC_E_FORMAT;
}

static void parse_flush(struct mc_req *r, const struct line *l)
{
	if (l->n > 3) {
		r->err = MC_E_ERROR;
		return;
	}
	noreply_last(r, l);
	if (l->n == (r->noreply ? 2 : 1))
		return;
	r->has_exptime = 1;
	if (!parse_i32(l->t[1], &r->exptime))
		r->err = MC_E_EXPTIME;
}

static void parse_verbosity(struct mc_req *r, const struct line *l)
{
	uint64_t level;

	if (l->n < 2 || l->n > 3) {
		r->err = MC_E_ERROR;
		return;
	}
	noreply_last(r, l);
	if (!parse_u64(l->t[1], &level))
		r->err = MC_E_FORMAT;
}

static void parse_stats(struct mc_req *r, const struct line *l)
{
	r->arg = l->n > 1 ? l->t[1].p : l->end;
	r->arg_len = (size_t)(l->end - r->arg);
	if (l->n > 1 && tok_is(l->t[1], "detail") && (l->n != 3 || !(tok_is(l->t[2], "on") ||
	    tok_is(l->t[2], "off") || tok_is(l->t[2], "dump"))))
		r->err = MC_E_STATS_DETAIL;
}

/* ---- meta commands ------------------------------------------------------ */

/* memcached 1.6.18 words the same mistakes differently per command. */
struct meta_rules {
	const char *allowed;        /* flags this command accepts */
	enum mc_err bad, dup, token; /* unknown flag, repeated flag, bad number */
};

static const struct meta_rules mg_rules = {"cfkOqstuvTPL", MC_E_BAD_FLAG, MC_E_DUP_FLAG,
					   MC_E_BAD_TOKEN};
static const struct meta_rules ms_rules = {"cCFIkOqTMPLS", MC_E_BAD_FLAG, MC_E_DUP_FLAG,
					   MC_E_BAD_TOKEN};
static const struct meta_rules md_rules = {"CkOqTIPL", MC_E_BAD_DUP_FLAG, MC_E_BAD_DUP_FLAG,
					   MC_E_BAD_DUP_FLAG};
static const struct meta_rules ma_rules = {"CNJDTMqOtcvkPL", MC_E_BAD_DUP_FLAG,
					   MC_E_BAD_DUP_FLAG, MC_E_BAD_DUP_FLAG};

static enum mc_err meta_token(struct mc_req *r, char f, struct tok a, enum mc_err bad)
{
	struct mc_meta *m = &r->meta;
	uint64_t u;
	int ok = 1;

	switch (f) {
	case 'O':
		if (a.len > MC_OPAQUE_MAX)
			return MC_E_OPAQUE;
		m->opaque = a.p;
		m->opaque_len = a.len;
		break;
	case 'T': ok = parse_i32(a, &m->ttl); break;
	case 'N': ok = parse_i32(a, &m->vivify_ttl); break;
	case 'C': ok = parse_u64(a, &m->cas); break;
	case 'D': ok = parse_u64(a, &m->delta); break;
	case 'J': ok = parse_u64(a, &m->initial); break;
	case 'F':
		if (!parse_u64(a, &u))
			return MC_E_FORMAT;
		m->client_flags = (uint32_t)u;
		break;
	case 'M': m->mode = a.len ? a.p[0] : 0; break;
	case 'q': r->noreply = 1; break;
	default: break;
	}
	return ok ? MC_OK : bad;
}

static enum mc_err meta_mode(struct mc_req *r)
{
	char *mo = &r->meta.mode;

	if (r->cmd == MC_CMD_MS) {
		if (!*mo)
			*mo = 'S';
		if (*mo >= 'a' && *mo <= 'z')
			*mo = (char)(*mo - 'a' + 'A');
		return strchr("SEAPR", *mo) ? MC_OK : MC_E_BAD_MODE;
	}
	if (r->cmd == MC_CMD_MA) {
		if (!*mo || *mo == 'I' || *mo == 'i' || *mo == '+')
			*mo = 'I';
		else if (*mo == 'D' || *mo == 'd' || *mo == '-')
			*mo = 'D';
		else
			return MC_E_BAD_DUP_FLAG;
	}
	return MC_OK;
}

static enum mc_err parse_meta_flags(struct mc_req *r, const struct line *l, int first,
				    const struct meta_rules *rules)
{
	struct mc_meta *m = &r->meta;
	enum mc_err e;

	m->delta = 1;
	for (int i = first; i < l->n && i < MC_MAX_TOKENS; i++) {
		char f = l->t[i].p[0];
		struct tok arg = {l->t[i].p + 1, l->t[i].len - 1};

		if (f < 'A' || f > 'z' || !strchr(rules->allowed, f))
			return rules->bad;
		if (m->flags & MC_META_BIT(f))
			return rules->dup;
		m->flags |= MC_META_BIT(f);
		m->order[m->norder++] = f;
		if ((e = meta_token(r, f, arg, rules->token)) != MC_OK)
			return e;
	}
	return meta_mode(r);
}

static int parse_meta(struct mc_req *r, const struct line *l, const char *buf, size_t used,
		      size_t len, size_t item_max)
{
	static const struct meta_rules *const rules[] = {
		[MC_CMD_MG] = &mg_rules, [MC_CMD_MS] = &ms_rules,
		[MC_CMD_MD] = &md_rules, [MC_CMD_MA] = &ma_rules};
	int is_ms = r->cmd == MC_CMD_MS;
	int64_t vlen = 0;

	if (l->n < 2 || l->n > MC_MAX_TOKENS)
		return r->err = MC_E_ERROR, (int)used;
	if (!set_key(r, l->t[1]))
		return r->err = MC_E_FORMAT, (int)used;
	if (is_ms && (l->n < 3 || !parse_i32(l->t[2], &vlen) || vlen < 0 || vlen > INT32_MAX - 2))
		return r->err = MC_E_FORMAT, (int)used;
	r->err = parse_meta_flags(r, l, is_ms ? 3 : 2, rules[r->cmd]);
	if (!is_ms)
		return (int)used;
	r->dlen = (size_t)vlen;
	r->flags = r->meta.client_flags;
	r->exptime = r->meta.ttl;
	if (r->err != MC_OK || item_too_big(r->klen, r->dlen, item_max)) {
		/* memcached answers and throws the data block away */
		if (r->err == MC_OK)
			r->err = MC_E_TOO_LARGE;
		r->swallow = r->dlen + 2;
		return (int)used;
	}
	return take_block(r, used, len, buf);
}

/* ---- dispatch ----------------------------------------------------------- */

static const struct {
	const char *name;
	enum mc_cmd cmd;
} commands[] = {
	{"get", MC_CMD_GET},         {"gets", MC_CMD_GETS},       {"gat", MC_CMD_GAT},
	{"gats", MC_CMD_GATS},       {"set", MC_CMD_SET},         {"add", MC_CMD_ADD},
	{"replace", MC_CMD_REPLACE}, {"append", MC_CMD_APPEND},   {"prepend", MC_CMD_PREPEND},
	{"cas", MC_CMD_CAS},         {"delete", MC_CMD_DELETE},   {"incr", MC_CMD_INCR},
	{"decr", MC_CMD_DECR},       {"touch", MC_CMD_TOUCH},     {"flush_all", MC_CMD_FLUSH_ALL},
	{"version", MC_CMD_VERSION}, {"verbosity", MC_CMD_VERBOSITY}, {"stats", MC_CMD_STATS},
	{"quit", MC_CMD_QUIT},       {"mg", MC_CMD_MG},           {"ms", MC_CMD_MS},
	{"md", MC_CMD_MD},           {"ma", MC_CMD_MA},           {"mn", MC_CMD_MN},
};

static enum mc_cmd lookup(struct tok t)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (tok_is(t, commands[i].name))
			return commands[i].cmd;
	return MC_CMD_NONE;
}

/*
 * An unknown command of two or more characters whose last token starts with
 * "HTTP/" - a web client on the wrong port ("GET / HTTP/1.0", "DELETE
 * HTTP/1.1", "HTTP/1.1"): memcached 1.6 closes the connection without a
 * word (seen of Debian's 1.6.18; "G HTTP/1.1", "GET / HTTP" and known
 * commands like "get a HTTP/1.1" are answered as usual).
 */
static int looks_like_http(struct tok cmd, const char *line, const char *end)
{
	const char *last;

	while (end > line && end[-1] == ' ')
		end--;
	last = end;
	while (last > line && last[-1] != ' ')
		last--;
	return cmd.len >= 2 && end - last >= 5 && !memcmp(last, "HTTP/", 5);
}

static int dispatch(struct mc_req *r, const char *buf, size_t used, size_t len,
		    const char *end, size_t item_max)
{
	const char *p = buf;
	struct line l;
	struct tok cmd = next_token(&p, end);

	r->cmd = lookup(cmd);
	switch (r->cmd) {
	case MC_CMD_NONE:
		r->err = looks_like_http(cmd, buf, end) ? MC_E_HTTP : MC_E_ERROR;
		return (int)used;
	case MC_CMD_GET: case MC_CMD_GETS: case MC_CMD_GAT: case MC_CMD_GATS:
		parse_retrieval(r, p, end);
		return (int)used;
	default: break;
	}
	tokenize(&l, buf, end);
	switch (r->cmd) {
	case MC_CMD_SET: case MC_CMD_ADD: case MC_CMD_REPLACE: case MC_CMD_APPEND:
	case MC_CMD_PREPEND: case MC_CMD_CAS:
		return parse_storage(r, &l, buf, used, len, item_max);
	case MC_CMD_MG: case MC_CMD_MS: case MC_CMD_MD: case MC_CMD_MA:
		return parse_meta(r, &l, buf, used, len, item_max);
	case MC_CMD_INCR: case MC_CMD_DECR: parse_arith(r, &l); break;
	case MC_CMD_TOUCH: parse_touch(r, &l); break;
	case MC_CMD_DELETE: parse_delete(r, &l); break;
	case MC_CMD_FLUSH_ALL: parse_flush(r, &l); break;
	case MC_CMD_VERBOSITY: parse_verbosity(r, &l); break;
	case MC_CMD_STATS: parse_stats(r, &l); break;
	default: break; /* version, quit, mn take anything */
	}
	return (int)used;
}

int mc_parse(const char *buf, size_t len, size_t item_max, struct mc_req *req)
{
	size_t limit = len < MC_MAX_GET_LINE ? len : MC_MAX_GET_LINE;
	const char *nl = limit ? memchr(buf, '\n', limit) : NULL;
	const char *end;

	memset(req, 0, sizeof(*req));
	if (!nl) {
		if (len > MC_MAX_GET_LINE || (len > MC_MAX_LINE && !long_line_ok(buf, len)))
			return MC_PARSE_CLOSE;
		req->need = len + 1;
		return 0;
	}
	if ((size_t)(nl - buf) > MC_MAX_LINE && !long_line_ok(buf, (size_t)(nl - buf)))
		return MC_PARSE_CLOSE;
	end = nl > buf && nl[-1] == '\r' ? nl - 1 : nl;
	return dispatch(req, buf, (size_t)(nl - buf) + 1, len, end, item_max);
}
