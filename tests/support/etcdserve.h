/*
 * etcdserve.h - run a throwaway real etcd for a test: a private data
 * directory under /tmp (a tmpfs in the Soft-RoCE guest, where etcd's
 * fsyncs would be slow over 9p), free client and peer ports on 127.0.0.1,
 * the process a child of the test (it dies with it: PR_SET_PDEATHSIG), its
 * output in DIR/etcd.log. Ready once hkv_etcd_range answers through the
 * v3 JSON gateway.
 *
 * The binary is $HKV_ETCD_BIN, else `etcd` on PATH (Debian: etcd-server;
 * scripts/install-deps installs it).
 */
#ifndef HKV_TEST_ETCDSERVE_H
#define HKV_TEST_ETCDSERVE_H

#include <errno.h>
#include <sys/types.h>

/* hkv_test_etcd_start's "no etcd binary" (no other failure returns it). */
#define HKV_TEST_ETCD_MISSING (-ENOPKG)

struct hkv_test_etcd {
	char prefix[128]; /* set before start; "" gives "/hkvtest" */
	pid_t pid;        /* 0 once it has exited and been reaped */
	int client_port, peer_port;
	char dir[64];      /* /tmp/hkv-etcd-XXXXXX: data/, etcd.log */
	char endpoint[64]; /* http://127.0.0.1:P, e.g. for etcdctl --endpoints */
	char uri[256];     /* etcd://127.0.0.1:P/PREFIX, for hkv_etcd_open */
};

/*
 * Start etcd and wait (up to 20 s) until it answers; if it exits at once
 * (a port taken meanwhile), try other ports. 0, HKV_TEST_ETCD_MISSING, or
 * another -errno: then nothing is left running, the directory is gone and
 * the tail of etcd's log went to stderr.
 */
int hkv_test_etcd_start(struct hkv_test_etcd *t);
/* SIGTERM (SIGKILL after 3 s), reap, remove the directory. Safe to call
 * after hkv_test_etcd_kill and twice. */
void hkv_test_etcd_stop(struct hkv_test_etcd *t);
/* Send sig; for SIGKILL, SIGTERM and SIGINT also reap it (t->pid = 0).
 * SIGSTOP / SIGCONT freeze and thaw it; SIGSTOP returns once every thread
 * of etcd has stopped. 0 or -errno. */
int hkv_test_etcd_kill(struct hkv_test_etcd *t, int sig);

#endif
