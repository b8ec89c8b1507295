/*
 * fuzz_ctl.c - libFuzzer target: the server's control-request decoder
 * (server/ctl_decode.h) on any bytes, delivered whole and in every prefix (a
 * socket hands the server arbitrary pieces). Aborts when:
 *
 *   - it reads outside the bytes given (ASan: they sit in an exact-size
 *     heap copy);
 *   - a verdict disagrees with the wire format: a DECODED request has a
 *     valid header (HELLO, PROVE, GRANT or CARVE with exactly its struct;
 *     protocol 1 and its AUTH are rejected) and its body inside the input, a
 *     REJECT has a complete header that is bad, NEED_MORE has a good
 *     header whose body is incomplete, or no whole header;
 *   - it waits for more than HKV_CTL_REQ_MAX bytes (the server reads no
 *     more than that per connection, so it would wait forever);
 *   - a prefix's verdict contradicts the whole input's (a request decodes
 *     at exactly its length; a rejection stands once the header is there).
 *
 * The client's decoding of WELCOME/ERROR replies is not fuzzed here: it sits
 * inside hkv_ctl_handshake() in client/connect.c, interleaved with its socket
 * reads.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/ctl_decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                      \
	do {                                                                           \
		if (!(c)) {                                                            \
			fprintf(stderr, "fuzz_ctl: invariant broken: %s (line %d)\n", #c, \
				__LINE__);                                             \
			abort();                                                       \
		}                                                                      \
	} while (0)

static int header_good(const struct hkv_ctl_hdr *h)
{
	if (h->magic != HKV_CTL_MAGIC || h->version != HKV_CTL_VERSION)
		return 0;
	if (h->type == HKV_CTL_GRANT)
		return h->len == sizeof(struct hkv_ctl_grant);
	if (h->type == HKV_CTL_CARVE)
		return h->len == sizeof(struct hkv_ctl_carve);
	if (h->type == HKV_CTL_HELLO)
		return h->len == sizeof(struct hkv_ctl_hello);
	return h->type == HKV_CTL_PROVE && h->len == sizeof(struct hkv_ctl_prove);
}

/* The verdict on the first len bytes of buf, checked against the format. */
static enum hkv_ctl_verdict decode_checked(const uint8_t *buf, size_t len,
					   struct hkv_ctl_req *req)
{
	enum hkv_ctl_verdict v = hkv_ctl_decode(buf, len, req);
	struct hkv_ctl_hdr h;

	if (len >= sizeof(h))
		memcpy(&h, buf, sizeof(h));
	switch (v) {
	case HKV_CTL_NEED_MORE:
		ASSERT(len < sizeof(h) || (header_good(&h) && len < sizeof(h) + h.len));
		ASSERT(len < HKV_CTL_REQ_MAX);
		break;
	case HKV_CTL_DECODED:
		ASSERT(len >= sizeof(h) && header_good(&h));
		ASSERT(req->token == buf + sizeof(h) && req->token_len == h.len);
		ASSERT(req->type == h.type);
		ASSERT(req->consumed == sizeof(h) + h.len && req->consumed <= len);
		ASSERT(req->consumed <= HKV_CTL_REQ_MAX);
		break;
	case HKV_CTL_REJECT:
		ASSERT(len >= sizeof(h) && !header_good(&h));
		ASSERT(req->status == HKV_EPROTO && req->why && req->why[0]);
		break;
	default:
		ASSERT(!"unknown verdict");
	}
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf = malloc(size ? size : 1);
	struct hkv_ctl_req whole, part;
	enum hkv_ctl_verdict v;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	v = decode_checked(buf, size, &whole);
	for (size_t n = 0; n < size && n <= HKV_CTL_REQ_MAX; n++) {
		enum hkv_ctl_verdict pv = decode_checked(buf, n, &part);

		if (v == HKV_CTL_DECODED)
			ASSERT(n < whole.consumed ? pv == HKV_CTL_NEED_MORE
						  : pv == HKV_CTL_DECODED &&
							    part.consumed == whole.consumed);
		if (v == HKV_CTL_REJECT)
			ASSERT(n < sizeof(struct hkv_ctl_hdr) ? pv == HKV_CTL_NEED_MORE
							      : pv == HKV_CTL_REJECT);
		if (v == HKV_CTL_NEED_MORE)
			ASSERT(pv == HKV_CTL_NEED_MORE);
	}
	free(buf);
	return 0;
}
