/*
 * mc_proto.h - a pure parser for the memcached text protocol (hatchkv-memcached).
 *
 * No I/O, no allocation, no global state, no libevent, no libhatchkv: it reads
 * bytes and fills a struct mc_req whose pointers point INTO the caller's
 * buffer. That makes it a libFuzzer target on its own.
 *
 * Contract of mc_parse(buf, len, item_max, req), for ANY bytes buf[0..len):
 *
 *   > 0  one whole request was recognised; that many bytes are consumed.
 *        req->err says whether it is a valid request (MC_OK) or a bad one
 *        whose exact reply line is mc_strerror(req->err). A bad request is
 *        still consumed (like memcached, which answers and moves on).
 *        For MC_E_TOO_LARGE / MC_E_BAD_MODE the data block is NOT part of
 *        the consumed bytes: the caller must discard req->swallow more
 *        bytes as they arrive (they may be far more than one buffer).
 *    0   more bytes are needed; req->need is the total length (from buf)
 *        at which calling again can make progress (len + 1 if unknown).
 *   < 0  MC_PARSE_CLOSE: no line end within the line limit; memcached
 *        closes such a connection.
 *
 * Lines end with "\n" (a "\r" before it is dropped); tokens are separated by
 * one or more spaces. Storage requests (set/add/replace/append/prepend/cas,
 * ms) include their data block: consumed = line + vlen + 2. Keys are 1..250
 * bytes; retrieval commands (get/gets/gat/gats) may carry any number of
 * keys: they are all checked here, and mc_key_next() walks them.
 *
 * item_max is the daemon's -I limit; a data block whose item (memcached's
 * accounting: 48 B header + 8 B cas + key + 1 + value + 2) exceeds it is
 * MC_E_TOO_LARGE.
 *
 * Bounds: at most MC_MAX_TOKENS tokens per line outside retrieval keys,
 * lines up to MC_MAX_LINE bytes (retrieval lines up to MC_MAX_GET_LINE).
 * Thread-safe (pure function of its inputs).
 */
#ifndef HKV_MC_PROTO_H
#define HKV_MC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define MC_KEY_MAX 250
#define MC_MAX_TOKENS 24
#define MC_MAX_LINE 2048
#define MC_MAX_GET_LINE (1u << 20)
#define MC_OPAQUE_MAX 32
#define MC_PARSE_CLOSE (-1)

enum mc_cmd {
	MC_CMD_NONE,
	MC_CMD_GET, MC_CMD_GETS, MC_CMD_GAT, MC_CMD_GATS,
	MC_CMD_SET, MC_CMD_ADD, MC_CMD_REPLACE, MC_CMD_APPEND, MC_CMD_PREPEND, MC_CMD_CAS,
	MC_CMD_DELETE, MC_CMD_INCR, MC_CMD_DECR, MC_CMD_TOUCH,
	MC_CMD_FLUSH_ALL, MC_CMD_VERSION, MC_CMD_VERBOSITY, MC_CMD_STATS, MC_CMD_QUIT,
	MC_CMD_MG, MC_CMD_MS, MC_CMD_MD, MC_CMD_MA, MC_CMD_MN,
};

/* Each bad-input class has exactly one reply line (mc_strerror). */
enum mc_err {
	MC_OK,
	MC_E_ERROR,        /* "ERROR": unknown command or wrong token count */
	MC_E_FORMAT,       /* "CLIENT_ERROR bad command line format" */
	MC_E_CHUNK,        /* "CLIENT_ERROR bad data chunk" */
	MC_E_TOO_LARGE,    /* "SERVER_ERROR object too large for cache" */
	MC_E_DELTA,        /* "CLIENT_ERROR invalid numeric delta argument" */
	MC_E_EXPTIME,      /* "CLIENT_ERROR invalid exptime argument" */
	MC_E_DELETE_USAGE, /* delete with a bad hold time */
	MC_E_BAD_FLAG,     /* meta: "CLIENT_ERROR invalid flag" */
	MC_E_DUP_FLAG,     /* meta: "CLIENT_ERROR duplicate flag" */
	MC_E_BAD_DUP_FLAG, /* ma: "CLIENT_ERROR invalid or duplicate flag" */
	MC_E_BAD_TOKEN,    /* meta: "CLIENT_ERROR bad token in command line format" */
	MC_E_BAD_MODE,     /* ms: "CLIENT_ERROR invalid mode for ms M token" */
	MC_E_OPAQUE,       /* meta: "CLIENT_ERROR opaque token too long" */
	MC_E_STATS_DETAIL, /* "CLIENT_ERROR usage: stats detail on|off|dump" */
	MC_E_HTTP,         /* an HTTP request line: close the connection, no reply */
	MC_E_NTYPES
};

/* Meta flags: bit (c - 'A') for 'A'..'z'; values of those with tokens. */
#define MC_META_BIT(ch) (1ull << ((ch) - 'A'))

struct mc_meta {
	uint64_t flags;                 /* MC_META_BIT of each flag given */
	char order[MC_MAX_TOKENS];      /* flags in request order (return flags) */
	int norder;
	const char *opaque;             /* O token (without the 'O') */
	size_t opaque_len;
	int64_t ttl;                    /* T */
	int64_t vivify_ttl;             /* N */
	uint64_t cas;                   /* C */
	uint32_t client_flags;          /* F */
	uint64_t delta;                 /* D (default 1) */
	uint64_t initial;               /* J (default 0) */
	char mode;                      /* M: ms S/E/A/P/R, ma I/D (normalised) */
};

struct mc_req {
	enum mc_cmd cmd;
	enum mc_err err;
	int noreply;              /* "noreply" given, or meta 'q' */
	const char *key;          /* single-key commands */
	size_t klen;
	const char *keys;         /* retrieval: the key list, walk with mc_key_next */
	size_t keys_len;
	size_t nkeys;
	const char *data;         /* storage: value bytes (no \r\n) */
	size_t dlen;
	uint32_t flags;           /* storage: client flags */
	int64_t exptime;          /* storage, touch, gat; flush_all delay */
	int has_exptime;          /* flush_all: a delay was given */
	uint64_t cas;             /* cas: unique */
	uint64_t delta;           /* incr/decr */
	const char *arg;          /* stats: the rest of the line (may be empty) */
	size_t arg_len;
	size_t swallow;           /* bytes to discard after the consumed ones */
	size_t need;              /* when 0 is returned: bytes needed in total */
	struct mc_meta meta;
};

/* See the contract above. req is fully overwritten. */
int mc_parse(const char *buf, size_t len, size_t item_max, struct mc_req *req);

/*
 * Walk a retrieval key list: *pos starts at req->keys, end is
 * req->keys + req->keys_len. Returns 1 and the next key, or 0 at the end.
 */
int mc_key_next(const char **pos, const char *end, const char **key, size_t *klen);

/*
 * A stored value read as memcached's incr/decr reads it (strtoull over the
 * data, which must be followed by white space, NUL or its end). 1 and *out
 * when numeric, else 0 (the "non-numeric value" error). len 0 is non-numeric.
 */
int mc_value_number(const char *p, size_t len, uint64_t *out);

/* The reply line for err, without "\r\n" (static storage; "" for MC_OK). */
const char *mc_strerror(enum mc_err err);

#endif /* HKV_MC_PROTO_H */
