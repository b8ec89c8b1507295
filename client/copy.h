/*
 * copy.h - the library's one entry point for the server's own writes: a
 * partition move (server/mover.c) copies each item into its new home and
 * keeps the item's write id, so a version a client read before the move
 * (hkv_item_info.version) still matches after it. Not part of the API.
 */
#ifndef HKV_CLIENT_COPY_H
#define HKV_CLIENT_COPY_H

#include <stddef.h>
#include <stdint.h>

struct hkv_client;

/* A set of key on the per-server handle c with flags, absolute exptime
 * (Unix s, 0 = never), write id wid (!= 0) and pred word (a replicated
 * store's; else 0): the block is the original's but for its place. Also
 * used by a replicated store's repair (server/filler.c). 0 or an hkv
 * error. */
int hkv_put_copy(struct hkv_client *c, const void *key, size_t klen, const void *val,
		 size_t vlen, uint32_t flags, uint32_t exptime, uint64_t wid, uint64_t pred);
/* The same, only if the key's entry there (expired or not, a tombstone or
 * not) has write id `from`, or with from 0 only if the key has no entry:
 * else HKV_EVERSION (a repair's copy, server/filler.c). */
int hkv_put_exact(struct hkv_client *c, const void *key, size_t klen, const void *val,
		  size_t vlen, uint32_t flags, uint32_t exptime, uint64_t wid, uint64_t pred,
		  uint64_t from);

/* Remove the key's entry only if it has write id wid (a repair taking back
 * a copy of a tombstone reclaimed since; a replicated delete reclaiming its
 * tombstone, client/replica.c): 0, HKV_ENOTFOUND (none there), HKV_EVERSION
 * (another write's) or an hkv error. */
int hkv_remove_copy(struct hkv_client *c, const void *key, size_t klen, uint64_t wid);

#endif /* HKV_CLIENT_COPY_H */
