/*
 * rawserve.h - a bare transport server in a child process, for transport
 * tests and the transport micro-benchmark: a zeroed region exposed through a
 * listener that accepts the hello "ok-token" (reply "welcome") and refuses
 * anything else with HKV_EAUTH. The child serves until killed or until the
 * parent closes the control pipe (or exits). The child is a fresh process
 * (fork + exec of hkv-rawserve), never a bare fork: see rawserve.c.
 */
#ifndef HKV_RAWSERVE_H
#define HKV_RAWSERVE_H

#include <stddef.h>
#include <sys/types.h>

#include "common/transport.h"

#define RAWSERVE_TOKEN "ok-token"
#define RAWSERVE_REPLY "welcome"

struct rawserve {
	pid_t pid;
	int ctl; /* write end: closing it stops the child */
	enum hkv_transport_kind kind;
	char path[108]; /* shm socket */
	char host[64];  /* verbs address */
	char port[16];
};

/* Start a server child with a region of `size` bytes; 0 or -errno. */
int rawserve_start(struct rawserve *rs, enum hkv_transport_kind kind, size_t size);
/* A connection config pointing at it, with the right token. */
void rawserve_conn_cfg(const struct rawserve *rs, struct hkv_conn_cfg *cfg);
void rawserve_stop(struct rawserve *rs);
/* SIGKILL the child (fault tests) and reap it. */
void rawserve_kill(struct rawserve *rs);

/* main() of the hkv-rawserve helper executable. */
int rawserve_main(int argc, char **argv);

#endif
