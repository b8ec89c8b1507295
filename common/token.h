/*
 * token.h - the shared secret of the control plane, kept in a file.
 * A token is 16..HKV_TOKEN_MAX printable bytes; trailing whitespace in the
 * file is ignored. hkv_token_load() can create the file (mode 0600, 32 random
 * hex characters) when it does not exist, which is what the server does.
 */
#ifndef HKV_TOKEN_H
#define HKV_TOKEN_H

#include <stddef.h>

#define HKV_TOKEN_MIN 16

/* Returns the token length (>0) or -errno / HKV_EAUTH for a bad token. */
int hkv_token_load(const char *path, char *buf, size_t cap, int create);

#endif
