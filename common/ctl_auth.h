/*
 * ctl_auth.h - the control plane's mutual authentication (common/ctl_proto.h
 * says the exchange): HMAC-SHA-256 (libsodium) keyed by a token over a
 * label and both nonces, the session key, and the sealed WELCOME. Shared
 * by the server (server/ctl.c), the client library (client/connect.c) and
 * the tests' raw clients.
 */
#ifndef HKV_CTL_AUTH_H
#define HKV_CTL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/ctl_proto.h"

/* HMAC-SHA-256 keyed by token over label || nonce_c || nonce_s. */
void hkv_ctl_mac(uint8_t out[HKV_CTL_MAC_LEN], const void *token, size_t token_len,
		 const char *label, const uint8_t nonce_c[HKV_CTL_NONCE_LEN],
		 const uint8_t nonce_s[HKV_CTL_NONCE_LEN]);

/* Constant-time equality of two MACs: 1 if equal. */
int hkv_ctl_mac_equal(const uint8_t a[HKV_CTL_MAC_LEN], const uint8_t b[HKV_CTL_MAC_LEN]);

/* Seal a welcome under session key sk (ticket XORed with the pad, MAC over
 * the result) into m; open one: 0, or HKV_EAUTH if its MAC fails (then
 * nothing in it is to be used). */
void hkv_ctl_welcome_seal(struct hkv_ctl_welcome_msg *m, const struct hkv_ctl_welcome *w,
			  const uint8_t sk[HKV_CTL_MAC_LEN]);
int hkv_ctl_welcome_open(struct hkv_ctl_welcome *w, const struct hkv_ctl_welcome_msg *m,
			 const uint8_t sk[HKV_CTL_MAC_LEN]);

/* A session's request key (GRANT, CARVE): HMAC-SHA-256 keyed by the
 * session key sk over "hatchkv requests". */
void hkv_ctl_request_key(uint8_t rk[HKV_CTL_MAC_LEN], const uint8_t sk[HKV_CTL_MAC_LEN]);
/* A request's MAC: HMAC-SHA-256 keyed by rk over type || body[0 .. len -
 * HKV_REQ_MAC_LEN), truncated to HKV_REQ_MAC_LEN (the body's last field is
 * the MAC). seal writes it into the body; check: 1 if it matches. */
void hkv_ctl_request_seal(void *body, size_t len, uint16_t type,
			  const uint8_t rk[HKV_CTL_MAC_LEN]);
int hkv_ctl_request_check(const void *body, size_t len, uint16_t type,
			  const uint8_t rk[HKV_CTL_MAC_LEN]);

#endif /* HKV_CTL_AUTH_H */
