/*
 * mover.h - a store-mode move's copy (docs/design.md "Moves"): the losing
 * server's CPU, fenced, copies every live item the new map places elsewhere
 * into its new home, as a client of that home (the client library's
 * hkv_set: the new home's CPU stays off the data path).
 */
#ifndef HKV_SERVER_MOVER_H
#define HKV_SERVER_MOVER_H

#include <stdint.h>

struct hkv_store;
struct hkv_cmap;
struct hkv_cmember;

struct hkv_move_stats {
	uint64_t items, bytes; /* copied (keys + values) */
	uint64_t expired;      /* left behind: expired already */
};

/*
 * Copy the live, unexpired items that `cur` places on `self` and `map`
 * does not to their new primaries (homes[], indexed like map->names), with
 * `token`. 0, or the
 * first error (nothing dropped here: the caller's settle does that once
 * the move is committed). max_value: the largest value to expect.
 */
int hkv_move_copy(struct hkv_store *s, const struct hkv_cmap *cur, const struct hkv_cmap *map,
		  const struct hkv_cmember *homes, const char *self, const char *token,
		  uint64_t max_value, struct hkv_move_stats *st);

#endif /* HKV_SERVER_MOVER_H */
