/*
 * fuzz_mc.c - libFuzzer target: the memcached text-protocol parser
 * (client/memcached/mc_proto.c) on any bytes, the way hatchkv-memcached
 * meets a client's stream: parse, consume, discard what it says to swallow,
 * parse the next request, until the bytes run out.
 *
 * Input: byte 0 picks the -I item limit (64 B << (byte % 20)); the rest is
 * the stream, in an exact-size heap copy so ASan sees any read past it.
 *
 * Aborts unless, for every request, mc_parse keeps its contract (mc_proto.h):
 *   - it returns MC_PARSE_CLOSE, 0 with need > len, or 1..len consumed bytes;
 *   - every pointer it fills (key, keys, data, arg, opaque) lies inside the
 *     consumed bytes, and a data block to swallow is not pointed at; a valid request's keys are 1..MC_KEY_MAX bytes and
 *     mc_key_next walks exactly nkeys of them; a valid storage request's
 *     data block ends the request and is followed by "\r\n";
 *   - each error has its reply line (mc_strerror);
 *   - it depends on nothing after its own bytes: the consumed prefix alone
 *     parses to the same request, and a shorter prefix asks for more bytes
 *     without asking past the request's end (else a daemon would stall).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/memcached/mc_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                     \
	do {                                                                          \
		if (!(c)) {                                                           \
			fprintf(stderr, "fuzz_mc: invariant broken: %s (line %d)\n", #c, \
				__LINE__);                                            \
			abort();                                                      \
		}                                                                     \
	} while (0)

/* [p, p + n) inside [lo, hi)? (p NULL with n 0 counts as inside.) */
static int inside(const char *p, size_t n, const char *lo, const char *hi)
{
	if (!p)
		return n == 0;
	return p >= lo && p <= hi && n <= (size_t)(hi - p);
}

static int is_storage(enum mc_cmd c)
{
	return c >= MC_CMD_SET && c <= MC_CMD_CAS;
}

static void check_request(const char *buf, int ret, const struct mc_req *r)
{
	const char *end = buf + ret, *pos, *k;
	size_t kl, n = 0;

	ASSERT(r->err < MC_E_NTYPES && mc_strerror(r->err) != NULL);
	ASSERT((r->err == MC_OK) == (mc_strerror(r->err)[0] == 0));
	ASSERT(inside(r->key, r->klen, buf, end) && inside(r->keys, r->keys_len, buf, end));
	ASSERT(inside(r->arg, r->arg_len, buf, end));
	ASSERT(inside(r->meta.opaque, r->meta.opaque_len, buf, end));
	/* a refused data block is not consumed: swallowed later, never pointed at */
	if (r->data)
		ASSERT(inside(r->data, r->dlen, buf, end) && !r->swallow);
	if (r->err != MC_OK)
		return;
	if (r->key)
		ASSERT(r->klen >= 1 && r->klen <= MC_KEY_MAX);
	if (r->keys) {
		pos = r->keys;
		while (mc_key_next(&pos, r->keys + r->keys_len, &k, &kl)) {
			ASSERT(inside(k, kl, r->keys, r->keys + r->keys_len));
			ASSERT(kl >= 1 && kl <= MC_KEY_MAX);
			n++;
		}
		ASSERT(n == r->nkeys && n >= 1);
	}
	if (is_storage(r->cmd)) {
		ASSERT(r->data && r->data + r->dlen + 2 == end);
		ASSERT(end[-2] == '\r' && end[-1] == '\n');
	}
}

/* The request's bytes alone parse the same; shorter prefixes ask for more. */
static void check_prefixes(const char *buf, int ret, size_t item_max, const struct mc_req *r)
{
	struct mc_req p;
	size_t step = ret > 256 ? (size_t)ret / 64 : 1;

	ASSERT(mc_parse(buf, (size_t)ret, item_max, &p) == ret);
	ASSERT(p.cmd == r->cmd && p.err == r->err && p.klen == r->klen && p.dlen == r->dlen);
	for (size_t len = 0; len < (size_t)ret; len += step) {
		int pr = mc_parse(buf, len, item_max, &p);

		ASSERT(pr == 0 && p.need > len && p.need <= (size_t)ret);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t item_max = (size_t)64 << (size ? data[0] % 20 : 0), off = 0, len;
	char *buf;

	if (size < 1)
		return 0;
	len = size - 1;
	buf = malloc(len ? len : 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 1, len);
	for (int i = 0; i < 1000 && off <= len; i++) {
		struct mc_req r;
		int ret = mc_parse(buf + off, len - off, item_max, &r);

		ASSERT(ret == MC_PARSE_CLOSE || (ret >= 0 && (size_t)ret <= len - off));
		if (ret == 0)
			ASSERT(r.need > len - off);
		if (ret <= 0)
			break;
		check_request(buf + off, ret, &r);
		check_prefixes(buf + off, ret, item_max, &r);
		off += (size_t)ret;
		off += r.swallow < len - off ? r.swallow : len - off; /* as mc_server.c does */
	}
	free(buf);
	return 0;
}
