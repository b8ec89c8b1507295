/*
 * etcd.h - a small blocking client for etcd v3's JSON gateway, for the
 * cluster's control plane (membership, the partition map, leadership).
 * Never on the data path.
 *
 * etcd 3.4 (Debian 12) serves gRPC and, on the same port, a JSON gateway:
 * POST /v3/kv/range, /v3/kv/put, /v3/kv/deleterange, /v3/kv/txn,
 * /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/watch. Keys and
 * values travel as standard base64 (libsodium's codec), 64-bit numbers
 * (revisions, lease IDs) as JSON strings, and proto3 leaves out fields that
 * hold their default value (0, "", false). Spoken over libevent's evhttp with
 * a private event_base per handle; JSON by json-c.
 *
 * URIs: etcd://HOST:PORT/PREFIX (HOST may be [IPv6]; PREFIX keeps its
 * leading '/' and loses trailing ones: etcd://h:2379/hkv/ gives "/hkv"; keys
 * given to the calls below are full keys, callers build them from
 * hkv_etcd_prefix()).
 *
 * Threads: a handle is used by one thread at a time; open one per thread.
 * Handles share their TLS context and password (hkv_etcd_reload below).
 * Every call blocks for at most the handle's timeout (hkv_etcd_watch_wait:
 * for its own timeout_ms). Each call is one HTTP connection of its own.
 *
 * Security (issue 28): hkv_etcd_open_sec() speaks TLS to etcd (the CA
 * verifies etcd's certificate and host name or IP; a client certificate
 * optional) and etcd's own authentication: the user and password are sent
 * once to /v3/auth/authenticate, the token it gives goes in every request's
 * Authorization header, and is fetched again when etcd says it lapsed
 * (Unauthenticated, "auth store is old") and after a change of endpoint
 * (a simple token is known only to the member that issued it). Without TLS
 * and a user the open is refused unless the caller says insecure.
 *
 * Errors (negative errno): -ECONNREFUSED (nothing listens) / -EIO (the
 * connection failed or etcd says it is unavailable), -ETIMEDOUT, -EPROTO (a
 * reply that is not what etcd sends: malformed JSON, bad base64, an HTTP
 * status other than 200 without etcd's error object), -ECANCELED (a compare
 * in hkv_etcd_put_if / delete_if failed), -ENOENT (lease gone: also from a
 * put under it), -EINVAL (also etcd's InvalidArgument, e.g. a request over
 * its size limit), -ENOMEM, -EACCES (etcd: permission denied - the user's
 * role may not do that - or no user given to an etcd with auth on),
 * -EKEYREJECTED (etcd refused the user or password). TLS failures (a
 * certificate that does not verify, a plain-HTTP peer) are -EIO. Each of
 * these is logged with etcd's or OpenSSL's own words (rate-limited).
 */
#ifndef HKV_ETCD_H
#define HKV_ETCD_H

#include <stddef.h>
#include <stdint.h>

struct hkv_etcd;

/* One key of a range reply. value is NUL-terminated (vlen excludes it). */
struct hkv_etcd_kv {
	char *key;
	char *value;
	size_t vlen;
	int64_t create_rev, mod_rev, version, lease;
};

/* Split etcd://HOST:PORT/PREFIX. 0 or -EINVAL (no scheme, no port, a
 * component too long for its buffer). An absent prefix gives "".
 * hkv_etcd_open takes several endpoints too: etcd://H1:P1,H2:P2,.../PREFIX
 * (at most HKV_ETCD_MAX_ENDPOINTS), each parsed as this one. */
#define HKV_ETCD_MAX_ENDPOINTS 8
int hkv_etcd_parse_uri(const char *uri, char *host, size_t hostlen, int *port,
		       char *prefix, size_t prefixlen);

/*
 * How to reach etcd securely; every program takes these as --etcd-* options
 * (hkv_etcd_sec_opt) and the client library by hkv_config_set_etcd().
 * Strings are hkv_malloc'd copies (hkv_etcd_sec_free).
 */
struct hkv_etcd_sec {
	char *cacert;        /* PEM CA file: TLS to etcd, its certificate verified */
	char *cert, *key;    /* PEM client certificate and key (optional) */
	char *user;          /* etcd user (auth/authenticate) */
	char *password_file; /* its password: the file's first line */
	int insecure;        /* plain HTTP and/or no user explicitly allowed */
};

/* Set one field by its option name without "--etcd-": "cacert", "cert",
 * "key", "user", "password-file" (value copied) or "insecure" (value NULL,
 * "1"/"yes"/"true" or "0"/"no"/"false"). 0, -EINVAL (unknown name, bad
 * value) or -ENOMEM. */
int hkv_etcd_sec_set(struct hkv_etcd_sec *s, const char *name, const char *value);
int hkv_etcd_sec_copy(struct hkv_etcd_sec *dst, const struct hkv_etcd_sec *src);
void hkv_etcd_sec_free(struct hkv_etcd_sec *s);
/* Append the options that give s back ("--etcd-cacert", FILE, ...) to
 * argv[*argc...] (at most 11 entries, pointers into s); for a program that
 * starts another. */
void hkv_etcd_sec_argv(const struct hkv_etcd_sec *s, const char **argv, int *argc);

/* getopt_long entries and their handler, shared by every program. */
#define HKV_ETCD_OPT_BASE 0x4500
#define HKV_ETCD_LONGOPTS                                                                	{"etcd-cacert", required_argument, NULL, HKV_ETCD_OPT_BASE + 0},                    	{"etcd-cert", required_argument, NULL, HKV_ETCD_OPT_BASE + 1},                      	{"etcd-key", required_argument, NULL, HKV_ETCD_OPT_BASE + 2},                       	{"etcd-user", required_argument, NULL, HKV_ETCD_OPT_BASE + 3},                      	{"etcd-password-file", required_argument, NULL, HKV_ETCD_OPT_BASE + 4},             	{"etcd-insecure", no_argument, NULL, HKV_ETCD_OPT_BASE + 5}
/* 1: opt was one of HKV_ETCD_LONGOPTS and is now set; 0: not ours; <0: error. */
int hkv_etcd_sec_opt(struct hkv_etcd_sec *s, int opt, const char *arg);
#define HKV_ETCD_USAGE \
	"  --etcd-cacert FILE       TLS to etcd: verify its certificate with this CA (PEM)\n" \
	"  --etcd-cert FILE, --etcd-key FILE  client certificate for that TLS channel\n"     \
	"  --etcd-user NAME         etcd user (its role says what it may read and write)\n"  \
	"  --etcd-password-file FILE  that user's password (first line)\n"                 \
	"  --etcd-insecure          allow etcd without TLS and a user (anyone who reaches\n"  \
	"                           etcd then owns the cluster; logged)\n"

/* NULL and errno on failure. Does not contact etcd yet. hkv_etcd_open:
 * plain HTTP, no user (tests, and callers that were told --etcd-insecure).
 * hkv_etcd_open_sec: as s says (NULL: as hkv_etcd_open); without TLS and a
 * user and without s->insecure: NULL and EPERM (and a line saying why); an
 * unreadable CA, certificate, key or password file: NULL, its errno and a
 * line naming the file. */
struct hkv_etcd *hkv_etcd_open(const char *uri, int timeout_ms);
struct hkv_etcd *hkv_etcd_open_sec(const char *uri, const struct hkv_etcd_sec *s, int timeout_ms);
void hkv_etcd_close(struct hkv_etcd *e);

/*
 * Credentials that change live (issue 30: a daemon's SIGHUP). The handles
 * opened with the same files and user (compared by name) share what was
 * loaded from them: the first open loads the CA, certificate, key and
 * password files, later opens take what is loaded. hkv_etcd_reload()
 * loads what now names (the files may have new names, or new contents under
 * the old ones) for every handle opened with opened's files, open or opened
 * later: a new TLS context for connections made from then on (those in
 * flight finish on the old one, freed with the last of them), and the
 * password for the next authentication (a token in use stays until it
 * lapses, so: the new password in its file, SIGHUP, then change it in
 * etcd). A file that fails to load keeps what is in use, with a line
 * naming it and saying why; turning TLS or the user on or off needs a
 * restart (a line says so). *what (cap bytes) gets a summary for the
 * caller's line ("etcd TLS files changed, etcd password unchanged").
 * 0, or the first failure's -errno. Thread-safe; never blocks on etcd.
 */
int hkv_etcd_reload(const struct hkv_etcd_sec *opened, const struct hkv_etcd_sec *now,
		    char *what, size_t cap);
/* The PREFIX part of the URI ("" if none); valid while the handle is open. */
const char *hkv_etcd_prefix(const struct hkv_etcd *e);

/* Read key, or every key under key as a prefix (prefix != 0). *kvs is
 * hkv_malloc'd (free with hkv_etcd_kvs_free; NULL when *n == 0); sorted by
 * key as etcd sends them. *rev (may be NULL): the store's revision. */
int hkv_etcd_range(struct hkv_etcd *e, const char *key, int prefix, struct hkv_etcd_kv **kvs,
		   int *n, int64_t *rev);
void hkv_etcd_kvs_free(struct hkv_etcd_kv *kvs, int n);

/* Unconditional put; lease 0 = none. *rev (may be NULL): revision after. */
int hkv_etcd_put(struct hkv_etcd *e, const char *key, const void *value, size_t vlen,
		 int64_t lease, int64_t *rev);

/* Delete key (or every key under it). *deleted (may be NULL): how many. */
int hkv_etcd_delete(struct hkv_etcd *e, const char *key, int prefix, int64_t *deleted);

/* One transaction: put key = value only if the key's mod_revision equals
 * expect_rev (expect_rev 0: only if the key does not exist). 0 and *rev =
 * the new revision, or -ECANCELED (and *rev = the key's current
 * mod_revision, 0 if absent) when the compare failed. */
int hkv_etcd_put_if(struct hkv_etcd *e, const char *key, const void *value, size_t vlen,
		    int64_t expect_rev, int64_t lease, int64_t *rev);

/* A compare of hkv_etcd_txn_put: key's mod_revision, create_revision (0:
 * the key does not exist) or lease equals value. */
enum hkv_etcd_cmp_what { HKV_ETCD_CMP_MOD, HKV_ETCD_CMP_CREATE, HKV_ETCD_CMP_LEASE };
struct hkv_etcd_cmp {
	const char *key;
	enum hkv_etcd_cmp_what what;
	int64_t value;
};

/* One transaction: if every compare holds, put put_key = value (lease 0:
 * none) and, if del_key is not NULL, delete del_key. 0 and *rev (may be
 * NULL) = the revision after, or -ECANCELED when a compare failed. */
int hkv_etcd_txn_put(struct hkv_etcd *e, const struct hkv_etcd_cmp *cmps, int ncmp,
		     const char *put_key, const void *value, size_t vlen, int64_t lease,
		     const char *del_key, int64_t *rev);

/* Delete key only if its mod_revision equals expect_rev: 0 or -ECANCELED. */
int hkv_etcd_delete_if(struct hkv_etcd *e, const char *key, int64_t expect_rev);

/* Leases. grant: *id of a new lease of ttl_s seconds (etcd may raise it to
 * its minimum). keepalive: one POST; *ttl_s (may be NULL) = the TTL granted
 * back; -ENOENT if the lease no longer exists (expired or revoked). */
int hkv_etcd_lease_grant(struct hkv_etcd *e, int ttl_s, int64_t *id);
int hkv_etcd_lease_keepalive(struct hkv_etcd *e, int64_t id, int *ttl_s);
int hkv_etcd_lease_revoke(struct hkv_etcd *e, int64_t id);

/* Wait until key (or a key under it, prefix != 0) changes at a revision
 * after after_rev, for at most timeout_ms: 0 and *rev = the revision of the
 * first such change, or -ETIMEDOUT. A change that happened between after_rev
 * and the call is reported at once (the watch starts at after_rev + 1). If
 * etcd has compacted revisions after after_rev away, 0 and *rev = the
 * compaction revision at once: something may have changed, re-read. */
int hkv_etcd_watch_wait(struct hkv_etcd *e, const char *key, int prefix, int64_t after_rev,
			int timeout_ms, int64_t *rev);

#endif /* HKV_ETCD_H */
