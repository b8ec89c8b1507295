/*
 * transport_int.h - what the transport backends share; not for users of
 * transport.h. Wire formats of the connect handshake (same bytes in the
 * rdma_cm private data of verbs and the SOCK_SEQPACKET messages of shm):
 *
 *   hello  (client -> listener, 56 bytes = rdma_cm REQ private data limit)
 *   +--------+-----+-----+-----------------------+
 *   | magic4 | len1| pad3| data[48]              |
 *   +--------+-----+-----+-----------------------+
 *   accept (listener -> client, <= 196 bytes = IB CM REP private data limit)
 *   +--------+---------+---------------------+------+------+-----------+
 *   | magic4 | status4 | region desc 24      | len2 | pad2 | data[128] |
 *   +--------+---------+---------------------+------+------+-----------+
 * All fields little-endian host order (x86-64, the only supported host).
 */
#ifndef HKV_TRANSPORT_INT_H
#define HKV_TRANSPORT_INT_H

#include <assert.h>
#include <stddef.h>
#include <time.h>

#include "common/transport.h"

#define HKV_CONN_MAGIC 0x31564b48u /* "HKV1" */
/* Largest WRITE the backends send inline (no registration needed). */
#define HKV_INLINE_MAX 64

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

struct hkv_hello_msg {
	uint32_t magic;
	uint8_t len;
	uint8_t pad[3];
	uint8_t data[HKV_HELLO_MAX];
};
static_assert(sizeof(struct hkv_hello_msg) == 56, "hello must fit rdma_cm REQ private data");

struct hkv_accept_msg {
	uint32_t magic;
	int32_t status; /* a refusal (status < 0) is these 8 bytes alone */
	struct hkv_region_desc region;
	uint16_t len;
	uint16_t pad;
	uint8_t data[HKV_REPLY_MAX];
};
static_assert(sizeof(struct hkv_accept_msg) <= 196, "accept must fit IB CM REP private data");

struct hkv_listener_ops {
	int (*fd)(const struct hkv_listener *l);
	int (*dispatch)(struct hkv_listener *l);
	int (*nconns)(const struct hkv_listener *l);
	void (*destroy)(struct hkv_listener *l);
	/* memory windows; NULL: not supported (shm) */
	int (*grant)(struct hkv_listener *l, uint64_t cookie, uint64_t off, uint64_t len,
		     uint32_t access, uint32_t *rkey);
	int (*revoke)(struct hkv_listener *l, uint64_t cookie, uint64_t off);
	int (*nwindows)(const struct hkv_listener *l);
	int (*tick)(struct hkv_listener *l); /* NULL: nothing to probe */
	struct hkv_conn *(*loopback)(struct hkv_listener *l, int timeout_ms); /* NULL: shm */
	int (*fence)(struct hkv_listener *l, uint64_t cookie);
};

struct hkv_listener {
	const struct hkv_listener_ops *ops;
	struct hkv_region_desc region;
	hkv_on_connect_fn on_connect;
	hkv_on_disconnect_fn on_disconnect;
	void *arg;
};

struct hkv_conn *hkv_shm_conn_open(const struct hkv_conn_cfg *cfg, struct hkv_accept_msg *acc);
struct hkv_conn *hkv_verbs_conn_open(const struct hkv_conn_cfg *cfg, struct hkv_accept_msg *acc);
/* Tests only: hold an shm connection's gate busy (on: as a process stopped
 * inside a chain) or let it go; -EINVAL if c is not an shm connection. */
int hkv_shm_test_busy(struct hkv_conn *c, int on);
struct hkv_listener *hkv_shm_listener_create(const struct hkv_listener_cfg *cfg);
struct hkv_listener *hkv_verbs_listener_create(const struct hkv_listener_cfg *cfg);

/* A backend's connection, opened, made usable: what hkv_conn_open does
 * after the backend's open. 0, or -ENOMEM with the connection closed. */
int hkv_conn_settle(struct hkv_conn *c, int timeout_ms, int sq_depth);

/* Bytes of an accept message on the wire: a refusal carries only magic and status. */
#define HKV_REFUSAL_LEN offsetof(struct hkv_accept_msg, region)

/* Fill an accept message by asking the listener's on_connect callback. On
 * refusal only magic and status are set (the rest zero). When it returns
 * status 0 the connection is admitted (on_connect counted it): a listener
 * that then fails to accept it must call hkv_listener_gone(). */
void hkv_listener_answer(struct hkv_listener *l, const struct hkv_hello_msg *hello, size_t len,
			 struct hkv_accept_msg *acc, uint32_t *access, uint64_t *cookie);
/* Tell the owner an accepted connection is gone. */
void hkv_listener_gone(struct hkv_listener *l, uint64_t cookie);
void hkv_hello_fill(struct hkv_hello_msg *m, const struct hkv_conn_cfg *cfg);

static inline uint64_t hkv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Cheaper, a few ms coarse: for ages and rate limits, never for timeouts. */
static inline uint64_t hkv_coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif /* HKV_TRANSPORT_INT_H */
