/* ctl_auth.c - see ctl_auth.h. */
#include "common/ctl_auth.h"

#include <string.h>

#include <sodium.h>

#include "hatchkv_err.h"

void hkv_ctl_mac(uint8_t out[HKV_CTL_MAC_LEN], const void *token, size_t token_len,
		 const char *label, const uint8_t nonce_c[HKV_CTL_NONCE_LEN],
		 const uint8_t nonce_s[HKV_CTL_NONCE_LEN])
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, token, token_len);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
	crypto_auth_hmacsha256_update(&st, nonce_c, HKV_CTL_NONCE_LEN);
	crypto_auth_hmacsha256_update(&st, nonce_s, HKV_CTL_NONCE_LEN);
	crypto_auth_hmacsha256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
}

int hkv_ctl_mac_equal(const uint8_t a[HKV_CTL_MAC_LEN], const uint8_t b[HKV_CTL_MAC_LEN])
{
	return sodium_memcmp(a, b, HKV_CTL_MAC_LEN) == 0;
}

/* The ticket's pad and the welcome's MAC, both keyed by the session key. */
static void welcome_pad(uint8_t pad[HKV_CTL_MAC_LEN], const uint8_t sk[HKV_CTL_MAC_LEN])
{
	crypto_auth_hmacsha256(pad, (const uint8_t *)"hatchkv ticket pad", 18, sk);
}

static void welcome_mac(uint8_t mac[HKV_CTL_MAC_LEN], const struct hkv_ctl_welcome *w,
			const uint8_t sk[HKV_CTL_MAC_LEN])
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, sk, HKV_CTL_MAC_LEN);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)"hatchkv welcome", 16);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)w, sizeof(*w));
	crypto_auth_hmacsha256_final(&st, mac);
}

void hkv_ctl_welcome_seal(struct hkv_ctl_welcome_msg *m, const struct hkv_ctl_welcome *w,
			  const uint8_t sk[HKV_CTL_MAC_LEN])
{
	uint8_t pad[HKV_CTL_MAC_LEN];

	_Static_assert(HKV_TICKET_LEN <= HKV_CTL_MAC_LEN, "the pad covers the ticket");
	memset(m, 0, sizeof(*m));
	m->w = *w;
	welcome_pad(pad, sk);
	for (int i = 0; i < HKV_TICKET_LEN; i++)
		m->w.ticket[i] ^= pad[i];
	welcome_mac(m->mac, &m->w, sk);
	sodium_memzero(pad, sizeof(pad));
}

int hkv_ctl_welcome_open(struct hkv_ctl_welcome *w, const struct hkv_ctl_welcome_msg *m,
			 const uint8_t sk[HKV_CTL_MAC_LEN])
{
	uint8_t mac[HKV_CTL_MAC_LEN], pad[HKV_CTL_MAC_LEN];

	welcome_mac(mac, &m->w, sk);
	if (!hkv_ctl_mac_equal(mac, m->mac))
		return HKV_EAUTH;
	*w = m->w;
	welcome_pad(pad, sk);
	for (int i = 0; i < HKV_TICKET_LEN; i++)
		w->ticket[i] ^= pad[i];
	sodium_memzero(pad, sizeof(pad));
	return 0;
}

void hkv_ctl_request_key(uint8_t rk[HKV_CTL_MAC_LEN], const uint8_t sk[HKV_CTL_MAC_LEN])
{
	crypto_auth_hmacsha256(rk, (const uint8_t *)"hatchkv requests", 16, sk);
}

static void request_mac(uint8_t mac[HKV_CTL_MAC_LEN], const void *body, size_t len,
			uint16_t type, const uint8_t rk[HKV_CTL_MAC_LEN])
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, rk, HKV_CTL_MAC_LEN);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)&type, sizeof(type));
	crypto_auth_hmacsha256_update(&st, body, len - HKV_REQ_MAC_LEN);
	crypto_auth_hmacsha256_final(&st, mac);
}

void hkv_ctl_request_seal(void *body, size_t len, uint16_t type, const uint8_t rk[HKV_CTL_MAC_LEN])
{
	uint8_t mac[HKV_CTL_MAC_LEN];

	request_mac(mac, body, len, type, rk);
	memcpy((uint8_t *)body + len - HKV_REQ_MAC_LEN, mac, HKV_REQ_MAC_LEN);
}

int hkv_ctl_request_check(const void *body, size_t len, uint16_t type,
			  const uint8_t rk[HKV_CTL_MAC_LEN])
{
	uint8_t mac[HKV_CTL_MAC_LEN];

	if (len < HKV_REQ_MAC_LEN)
		return 0;
	request_mac(mac, body, len, type, rk);
	return crypto_verify_16(mac, (const uint8_t *)body + len - HKV_REQ_MAC_LEN) == 0;
}
