/*
 * hkvserver.h - run a real hatchkv-server process for black-box tests and
 * benchmarks: started by fork + exec of the binary beside the running
 * executable, on a private socket / port, with its own token file; waited
 * for until its control plane answers; stopped with SIGTERM or killed.
 */
#ifndef HKV_TEST_HKVSERVER_H
#define HKV_TEST_HKVSERVER_H

#include <sys/types.h>

#include "hatchkv.h"

struct hkvserver {
	pid_t pid;
	int verbs;
	char dir[128];       /* private directory: socket, token, log */
	char uri[256];       /* for hkv_config_add_server */
	char token_file[256];
	char port[16];
};

/*
 * Start a server: verbs when `verbs`, else shm; memory/segment are
 * hatchkv-server size strings ("32M"); extra: more arguments or NULL.
 * Returns 0 or -errno.
 */
int hkvserver_start(struct hkvserver *s, int verbs, const char *memory, const char *segment,
		    const char *const *extra);
/* Start it again after a kill (or kill it first): same directory, port,
 * socket and token, so clients reconnect to the same URI. 0 or -errno. */
int hkvserver_restart(struct hkvserver *s, const char *memory, const char *segment,
		      const char *const *extra);
/*
 * The same, but waiting for readiness without opening a client (which would
 * open the RDMA device in this process): until the control plane accepts a
 * connection and the server's log says "server: ready". For a process that
 * must hold no RDMA device, e.g. one that deletes and re-adds rxe0.
 */
int hkvserver_start_noclient(struct hkvserver *s, int verbs, const char *memory,
			     const char *segment, const char *const *extra);
int hkvserver_restart_noclient(struct hkvserver *s, const char *memory, const char *segment,
			       const char *const *extra);
/* A config for it (caller frees). */
struct hkv_config *hkvserver_config(const struct hkvserver *s);
/* Open a client handle on it; aborts the test program on failure. */
struct hkv_client *hkvserver_client(const struct hkvserver *s);
void hkvserver_stop(struct hkvserver *s);
void hkvserver_kill(struct hkvserver *s);
/* Lines of its log (info level) that contain what; -1 if unreadable. */
int hkvserver_log_count(const struct hkvserver *s, const char *what);
/* A get into a C string (cap counts its NUL; "" unless found), and a set of
 * one: the tests' shorthands. */
int get_str(struct hkv_client *c, const char *key, char *buf, size_t cap,
	    struct hkv_item_info *info);
int set_str(struct hkv_client *c, const char *key, const char *val);
/* Where key's block is (region offset) and its generation, as handle c
 * finds it now (one lookup; no API names a block: tests only). 0, or -1 if
 * not found (*off and *gen then UINT64_MAX). */
int hkvserver_block_of(struct hkv_client *c, const char *key, uint64_t *off, uint64_t *gen);
/* The segment holding key's block, as c finds it now (-1: not found). */
int64_t hkvserver_seg_of(struct hkv_client *c, const char *key);
/* Does argv ask for the verbs transport? If it does and the host has no
 * RDMA device, the test skips here (exit 77, saying why) or, with
 * HKV_REQUIRE_RDMA, fails. */
int hkvserver_want_verbs(int argc, char **argv);

#endif
