/*
 * ctl_decode.h - the control plane's request decoder, pure: the bytes a
 * connection has sent so far in, a verdict out. No I/O, no allocation, no
 * state; server/ctl.c calls it on every read, tests/fuzz/fuzz_ctl.c feeds it
 * garbage.
 *
 * A request is one HELLO, PROVE, GRANT or CARVE message (common/ctl_proto.h):
 *
 *   +--------+--------+--------+----------+--------+------------------+
 *   | magic4 | ver2   | type2  | status4  | len4   | body, len bytes  |
 *   +--------+--------+--------+----------+--------+------------------+
 *   HELLO, PROVE, GRANT, CARVE: len == the size of their struct. AUTH
 *   (protocol 1: the token in clear) and a protocol-1 header are refused
 *   from the header, with a message that says to upgrade the client. So a
 *   request is at most HKV_CTL_REQ_MAX bytes: the server never buffers
 *   more per connection.
 *
 * The header is judged as soon as it is complete (magic, then version, then
 * type and length), before the body arrives: a bad header is rejected at
 * once, a good one waits for its body.
 */
#ifndef HKV_SERVER_CTL_DECODE_H
#define HKV_SERVER_CTL_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/ctl_proto.h"
#include "hatchkv_err.h"

#define HKV_CTL_REQ_MAX (sizeof(struct hkv_ctl_hdr) + HKV_TOKEN_MAX)

enum hkv_ctl_verdict {
	HKV_CTL_NEED_MORE = 0, /* not a whole request yet: read on */
	HKV_CTL_DECODED = 1,   /* req->token, token_len, consumed are set */
	HKV_CTL_REJECT = 2,    /* req->status, why are set: answer ERROR, close */
};

struct hkv_ctl_req {
	uint16_t type;        /* HKV_CTL_HELLO, PROVE, GRANT or CARVE */
	const uint8_t *token; /* the body: points into the caller's bytes */
	uint32_t token_len;   /* the body's length (its struct's size) */
	size_t consumed;      /* header + body bytes of this request */
	int status;           /* REJECT: the ERROR reply's status (HKV_EPROTO) */
	const char *why;      /* REJECT: the ERROR reply's text (static) */
};

/*
 * Decode the len bytes at buf (all the connection sent so far; buf may be
 * unaligned and is only read within [buf, buf+len)). Fills *req as the
 * verdict says; never fails otherwise. Thread-safe (no state).
 */
static inline enum hkv_ctl_verdict hkv_ctl_decode(const void *buf, size_t len,
						  struct hkv_ctl_req *req)
{
	struct hkv_ctl_hdr h;

	memset(req, 0, sizeof(*req));
	if (len < sizeof(h))
		return HKV_CTL_NEED_MORE;
	memcpy(&h, buf, sizeof(h));
	req->status = HKV_EPROTO;
	if (h.magic != HKV_CTL_MAGIC)
		req->why = "not a hatchkv control message";
	else if (h.version == 1 || (h.version == HKV_CTL_VERSION && h.type == HKV_CTL_AUTH))
		req->why = "control protocol 1 (the token sent in clear) is no longer served: "
			   "upgrade the client";
	else if (h.version == 2 || h.version == 3)
		req->why = "control protocol 2-3 (a client that posts no claim intents) is no "
			   "longer served: upgrade the client";
	else if (h.version != HKV_CTL_VERSION)
		req->why = "unsupported control protocol version";
	else if (h.type == HKV_CTL_HELLO   ? h.len != sizeof(struct hkv_ctl_hello)
		 : h.type == HKV_CTL_PROVE ? h.len != sizeof(struct hkv_ctl_prove)
		 : h.type == HKV_CTL_GRANT ? h.len != sizeof(struct hkv_ctl_grant)
		 : h.type == HKV_CTL_CARVE ? h.len != sizeof(struct hkv_ctl_carve)
					   : 1)
		req->why = "malformed request";
	if (req->why)
		return HKV_CTL_REJECT;
	req->status = 0;
	if (len < sizeof(h) + h.len)
		return HKV_CTL_NEED_MORE; /* the caller's read timeout bounds the wait */
	req->type = h.type;
	req->token = (const uint8_t *)buf + sizeof(h);
	req->token_len = h.len;
	req->consumed = sizeof(h) + h.len;
	return HKV_CTL_DECODED;
}

#endif /* HKV_SERVER_CTL_DECODE_H */
