/*
 * token.h - the shared secret of the control plane, kept in a file.
 * A token is 16..HKV_TOKEN_MAX printable bytes; trailing whitespace in the
 * file is ignored. hkv_token_load() can create the file (mode 0600, 32 random
 * hex characters) when it does not exist, which is what the server does.
 *
 * The server's files (create != 0) are opened without following a symlink,
 * and an existing one is refused (-EPERM, with a log line saying why) when
 * another uid owns it or group/others may read or write it. A token of few
 * distinct bytes is accepted with a warning. A client reading a token file
 * others may read is warned.
 */
#ifndef HKV_TOKEN_H
#define HKV_TOKEN_H

#include <stddef.h>

#define HKV_TOKEN_MIN 16

/* Returns the token length (>0) or -errno / HKV_EAUTH for a bad token. */
int hkv_token_load(const char *path, char *buf, size_t cap, int create);

/* A server's secret file (token, region) open as fd: 0 if it is a regular
 * file of this uid that group and others cannot use; else -EPERM, logged. */
int hkv_secret_file_ok(int fd, const char *path, const char *what);

#endif
