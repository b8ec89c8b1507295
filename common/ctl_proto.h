/*
 * ctl_proto.h - the control plane's wire format (TCP for verbs, a unix socket
 * for shm). Off the data path: a client talks to it once, to authenticate and
 * learn where the data plane is. Every message:
 *
 *   +--------+--------+--------+----------+--------+
 *   | magic4 | ver2   | type2  | status4  | len4   |  then len body bytes
 *   +--------+--------+--------+----------+--------+
 *
 *   AUTH     client -> server  body: the shared token (1..HKV_TOKEN_MAX bytes)
 *   WELCOME  server -> client  body: struct hkv_ctl_welcome
 *   ERROR    server -> client  status: HKV_E* code, body: a message
 *
 * No address or rkey is sent before the token checks out: the WELCOME only
 * carries a one-time ticket; the region's rkey travels in the data plane's
 * accept, which the server grants only against a live ticket.
 */
#ifndef HKV_CTL_PROTO_H
#define HKV_CTL_PROTO_H

#include <stdint.h>

#define HKV_CTL_MAGIC    0x4c54434bu /* "KCTL" */
#define HKV_CTL_VERSION  1
#define HKV_CTL_BODY_MAX 1024
#define HKV_TOKEN_MAX    256
#define HKV_TICKET_LEN   16

enum hkv_ctl_type { HKV_CTL_AUTH = 1, HKV_CTL_WELCOME = 2, HKV_CTL_ERROR = 3 };

struct hkv_ctl_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	int32_t status;
	uint32_t len;
};

struct hkv_ctl_welcome {
	uint32_t client_id;
	uint32_t transport; /* enum hkv_transport_kind */
	uint8_t ticket[HKV_TICKET_LEN];
	char data_endpoint[112]; /* shm: socket path; verbs: rdma_cm port */
	uint32_t flags;          /* HKV_WELCOME_F_* */
	uint32_t pad;
};

/* The token was the read-only one: the data plane grants READ rights only. */
#define HKV_WELCOME_F_READONLY 0x1

/* The data plane's hello: which ticket this connection redeems. */
struct hkv_data_hello {
	uint32_t client_id;
	uint8_t ticket[HKV_TICKET_LEN];
};

#endif /* HKV_CTL_PROTO_H */
