/*
 * paths.h - where the shm control socket lives by default: in a directory
 * only the server's user can write, so no other user can bind the path
 * first and collect the tokens clients send (clients also check the
 * socket's peer uid: client/connect.c).
 *
 *   root:      /run/hatchkv/hatchkv.sock   (/run/hatchkv made 0755)
 *   others:    $XDG_RUNTIME_DIR/hatchkv.sock, else /tmp/hatchkv-<uid>/hatchkv.sock
 *              (that directory made 0700, refused if another uid owns it or
 *              others may write it)
 */
#ifndef HKV_PATHS_H
#define HKV_PATHS_H

#include <stddef.h>

/* The default socket path into buf; with make_dir, its directory is made
 * (and checked). 0 or -errno. */
int hkv_default_socket(char *buf, size_t cap, int make_dir);

#endif
