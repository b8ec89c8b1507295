/*
 * ctl.h - the server's control plane on libevent: accepts TCP (verbs) or
 * unix-socket (shm) connections, checks the shared token (or the read-only
 * token, whose clients get rights to RDMA Read only) in constant time,
 * answers WELCOME (client id, one-time ticket, data endpoint) or ERROR, and
 * closes. With memory windows it also answers a connected client's GRANT
 * (hkv_store_grant) with GRANTED or ERROR. Bounded: at most HKV_CTL_MAX_CONNS at
 * once and HKV_CTL_MAX_PER_SOURCE of them from one source (IP, or peer uid on
 * the unix socket), a request of at most header + HKV_TOKEN_MAX bytes
 * (nothing more is ever buffered), 5 s from the accept to send all of it
 * (a deadline, not an idle timeout: a byte now and then does not extend it;
 * one that misses it counts as a refused request), and per source 20
 * refused requests a second (burst 40) before it is answered "rate limited";
 * anything else is refused and logged, and the server keeps serving.
 */
#ifndef HKV_SERVER_CTL_H
#define HKV_SERVER_CTL_H

#include <event2/event.h>

#include "server/store.h"

#define HKV_CTL_MAX_CONNS      256
#define HKV_CTL_MAX_PER_SOURCE 128 /* one source never holds more than half */
#define HKV_CTL_DEADLINE_S     5

struct hkv_ctl;

struct hkv_ctl_opts {
	enum hkv_transport_kind kind;
	const char *host;          /* TCP bind address (verbs) */
	const char *port;          /* TCP port (verbs) */
	const char *path;          /* unix socket path (shm) */
	const char *data_endpoint; /* told to clients: rdma_cm port or shm data socket */
	const char *token;
	size_t token_len;
	const char *ro_token; /* NULL: no read-only clients */
	size_t ro_token_len;
};

struct hkv_ctl *hkv_ctl_create(struct event_base *base, struct hkv_store *store,
			       const struct hkv_ctl_opts *o);
void hkv_ctl_destroy(struct hkv_ctl *ctl);
/* New tokens for the authentications that start from now (SIGHUP); the
 * buffers stay the caller's and must outlive the control plane. */
void hkv_ctl_set_tokens(struct hkv_ctl *ctl, const char *token, size_t token_len,
			const char *ro_token, size_t ro_token_len);

#endif /* HKV_SERVER_CTL_H */
