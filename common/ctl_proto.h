/*
 * ctl_proto.h - the control plane's wire format (TCP for verbs, a unix socket
 * for shm). Off the data path: a client talks to it once, to authenticate and
 * learn where the data plane is. Every message:
 *
 *   +--------+--------+--------+----------+--------+
 *   | magic4 | ver2   | type2  | status4  | len4   |  then len body bytes
 *   +--------+--------+--------+----------+--------+
 *
 *   HELLO     client -> server  body: struct hkv_ctl_hello (its nonce)
 *   CHALLENGE server -> client  body: struct hkv_ctl_challenge (the server's
 *                               nonce and its proofs that it holds the tokens)
 *   PROVE     client -> server  body: struct hkv_ctl_prove (the client's proof)
 *   WELCOME   server -> client  body: struct hkv_ctl_welcome_msg (sealed)
 *   AUTH      (protocol 1: the token in clear) refused with a message
 *   GRANT    client -> server  body: struct hkv_ctl_grant
 *   GRANTED  server -> client  body: struct hkv_ctl_granted
 *   CARVE    client -> server  body: struct hkv_ctl_carve
 *   CARVED   server -> client  body: struct hkv_ctl_carved
 *   ERROR    server -> client  status: HKV_E* code, body: a message
 *
 * Authentication (issue 28): the token never crosses the wire, and the
 * server proves it holds it before the client proves the same. On one
 * connection: HELLO (nonce_c), CHALLENGE (nonce_s, and HMAC-SHA-256 keyed
 * by the writer token - and by the read-only token, if the server has one -
 * over "server", nonce_c, nonce_s); the client checks the proof for its own
 * token and sends nothing more to a server that fails it; PROVE (HMAC by
 * its token over "client", nonce_c, nonce_s): the server learns the role
 * from which token it matches. Both derive a session key (HMAC over
 * "session", nonce_c, nonce_s); the WELCOME's ticket travels XORed with a
 * pad from it and the whole WELCOME carries its MAC, so a relay that
 * passes the exchange through learns no ticket and cannot alter where the
 * data connection goes. A peer that records the exchange can test guesses
 * of the token offline only by guessing all of it (16 random bytes).
 *
 * Every other request (GRANT, CARVE) is one per connection, from a client
 * already welcomed: it names the client and proves it comes from that
 * session - a sequence number above the client's last one and a MAC, by a
 * key derived from the session key, over the request (common/ctl_auth.h).
 * A relay that passed the exchange through, or sees a request, can neither
 * make another request nor replay one (before: the ticket in clear).
 * GRANT exists when the data plane uses memory
 * windows (the accept's region access has HKV_ACCESS_WINDOWS): a connected
 * client asks for its base rights (READ over the region, and for a writer
 * ATOMIC over everything past the header, a second rkey) and then for WRITE
 * rights over the data area (a third rkey, for writers). The server binds
 * the windows on the client's own queue pair and answers their rkeys.
 *
 * CARVE asks for memory of one size class when no segment of that class
 * has a free block to claim: the server carves a FREE segment into the
 * class, or moves one from another class (a wholly free one; in cache mode
 * it evicts one first, memcached's slab mover), and answers its index.
 * Rare: once per segment's worth of memory that changes class, never per
 * operation.
 *
 * No address or rkey is sent before the token checks out: the WELCOME only
 * carries a one-time ticket; the region's rkey travels in the data plane's
 * accept, which the server grants only against a live ticket.
 */
#ifndef HKV_CTL_PROTO_H
#define HKV_CTL_PROTO_H

#include <stdint.h>

#define HKV_CTL_MAGIC    0x4c54434bu /* "KCTL" */
#define HKV_CTL_VERSION  4 /* 4: writers post claim intents (layout.h), which a
			    * server's sweep relies on; 3: GRANT/CARVE MACed under
			    * the session (2: with the ticket in clear; 1: AUTH
			    * with the token) */
#define HKV_CTL_BODY_MAX 1024
#define HKV_TOKEN_MAX    256
#define HKV_TICKET_LEN   16

enum hkv_ctl_type {
	HKV_CTL_AUTH = 1,
	HKV_CTL_WELCOME = 2,
	HKV_CTL_ERROR = 3,
	HKV_CTL_GRANT = 4,
	HKV_CTL_GRANTED = 5,
	HKV_CTL_CARVE = 6,
	HKV_CTL_CARVED = 7,
	HKV_CTL_HELLO = 8,
	HKV_CTL_CHALLENGE = 9,
	HKV_CTL_PROVE = 10,
};

#define HKV_CTL_NONCE_LEN 32
#define HKV_CTL_MAC_LEN   32

struct hkv_ctl_hello {
	uint8_t nonce_c[HKV_CTL_NONCE_LEN];
};

struct hkv_ctl_challenge {
	uint8_t nonce_s[HKV_CTL_NONCE_LEN];
	uint8_t proof_full[HKV_CTL_MAC_LEN]; /* keyed by the writer token */
	uint8_t proof_ro[HKV_CTL_MAC_LEN];   /* by the read-only token (flag) */
	uint32_t flags;                      /* HKV_CHALLENGE_F_* */
	uint32_t pad;
};

#define HKV_CHALLENGE_F_RO 0x1 /* proof_ro is set: the server has a read-only token */

struct hkv_ctl_prove {
	uint8_t proof_c[HKV_CTL_MAC_LEN];
};

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
	uint32_t geom_sum;       /* with HKV_WELCOME_F_GEOM_SUM: the sum of the server's geometry */
};

/* The WELCOME on the wire: the ticket XORed with the session's pad, and a
 * MAC by the session key over the welcome as sent (common/ctl_auth.h). */
struct hkv_ctl_welcome_msg {
	struct hkv_ctl_welcome w;
	uint8_t mac[HKV_CTL_MAC_LEN];
};

/* The token was the read-only one: the data plane grants READ rights only. */
#define HKV_WELCOME_F_READONLY 0x1
/* geom_sum is set: the header a client reads must carry that sum, else a
 * writer has overwritten it (shm, --no-windows) and the client reads it
 * again (the server puts its own copy back every HKV_CLOCK_TICK_MS). */
#define HKV_WELCOME_F_GEOM_SUM 0x2

/* The data plane's hello: which ticket this connection redeems. */
struct hkv_data_hello {
	uint32_t client_id;
	uint8_t ticket[HKV_TICKET_LEN];
};

/* GRANT's seg for the connection's base rights (READ, and ATOMIC for writers). */
#define HKV_GRANT_BASE 0xffffffffu

/* A welcomed client's request for rights; seq and mac as above (mac last:
 * the MAC covers the type and every byte before it). */
#define HKV_REQ_MAC_LEN 16
struct hkv_ctl_grant {
	uint32_t client_id;
	uint32_t seg; /* segment index, or HKV_GRANT_BASE */
	uint64_t seq;
	uint8_t mac[HKV_REQ_MAC_LEN];
};

struct hkv_ctl_granted {
	uint32_t seg;
	uint32_t rkey;   /* valid on the client's own connection only */
	uint64_t off;    /* region offset of the window */
	uint64_t len;    /* its bytes */
	uint32_t access; /* HKV_ACCESS_* it carries */
	uint32_t atomic_rkey; /* base grant to a writer: its ATOMIC window, over the
			       * region past the header (from seg_table_off); else 0 */
	uint32_t write_rkey;  /* base grant to a writer: its WRITE window over the
			       * data area (from data_off); else 0 */
	uint32_t pad;
};

/* A connected writer asks for a segment of class cls (see CARVE above). */
struct hkv_ctl_carve {
	uint32_t client_id;
	uint32_t cls;
	uint64_t keep_off; /* cache mode: never empty the segment holding this
			    * block (the item a read-modify-write rewrites); 0: none */
	uint32_t flags;    /* HKV_CARVE_F_* */
	uint32_t pad;
	uint64_t seq;
	uint8_t mac[HKV_REQ_MAC_LEN];
};

/* Cache mode: the class has no segment to evict in, so the server may
 * empty one of another class (evicting its items) for it. */
#define HKV_CARVE_F_MOVE 0x1

struct hkv_ctl_carved {
	uint32_t seg; /* now SHARED in class cls */
	uint32_t cls;
};

#endif /* HKV_CTL_PROTO_H */
