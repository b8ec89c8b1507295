/*
 * filler.h - repair of a replicated store (docs/design.md "Repair"): the
 * primary A of a partition whose replica list is short copies the
 * partition's items into the server N the coordinator admits, while
 * clients keep reading and writing the partition on its old list.
 *
 * Online passes (hkv_fill_pass, on a thread of the server's own, the event
 * loop serving on) walk A's index and copy every committed item of the
 * partitions being filled whose write id N does not hold yet (a table
 * records key -> write id copied); a block that changes under the read is
 * skipped, the next pass takes it. The final pass runs fenced - no client
 * can reach A or any other server on those lists - so it sees A's last
 * state and copies what changed since. (A replicated store's keys never
 * leave A: deletes leave tombstones, expired items stay.) Each copy keeps the item's write id and pred, so
 * N's entries are A's as the replicated protocol sees them. N is written
 * as a client (the client library): its CPU stays off the data path.
 */
#ifndef HKV_SERVER_FILLER_H
#define HKV_SERVER_FILLER_H

#include <stdint.h>

struct hkv_store;
struct hkv_cmap;
struct hkv_cmember;
struct hkv_fill;

struct hkv_fill_stats {
	uint64_t items, bytes;  /* copied in this pass (keys + values) */
	uint64_t seen;          /* items of the filled partitions looked at */
	uint64_t skipped;       /* changed while read: the next pass takes them */
	uint64_t unseen;        /* final pass: copied before, not found on A now */
	uint64_t taken_back;    /* final pass: of those, copies of reclaimed tombstones
				 * taken off the gainers */
};

/* The fill of the partitions `target` grows against `cur`, identified by
 * (rev, tag): a state made for another (rev, tag) starts over. NULL on
 * ENOMEM. */
struct hkv_fill *hkv_fill_new(int64_t rev, const char *tag);
void hkv_fill_free(struct hkv_fill *f);
/* Is f the state of fill (rev, tag)? */
int hkv_fill_is(const struct hkv_fill *f, int64_t rev, const char *tag);
/* Ask a pass under way to stop soon (any thread). */
void hkv_fill_cancel(struct hkv_fill *f);

/*
 * One pass over A's (self's) items of the partitions target grows where
 * cur's primary is self, into each gainer (homes[], indexed like
 * target->names) with token. Each copy holds only if the gainer's entry is
 * still the write this fill copied there (or absent): a copy from anyone
 * else (a stale fill) fails the pass instead of being overwritten. halt
 * (may be NULL): asked before each copy; true stops the pass (-ECANCELED).
 * final: nothing changes under us (fenced): every key copied before must
 * be seen again and nothing may be changing, else the pass fails. 1 when
 * the pass copied little (under 1% of what it saw, or it took under 200
 * ms: the fill has converged; always, for a final pass), 0 when another
 * pass is worth it, or an error.
 */
int hkv_fill_pass(struct hkv_fill *f, struct hkv_store *s, const struct hkv_cmap *cur,
		  const struct hkv_cmap *target, const struct hkv_cmember *homes, const char *self,
		  const char *token, uint64_t max_value, int final, int (*halt)(void *),
		  void *halt_arg, struct hkv_fill_stats *st);

/* Is self the primary, in cur, of a partition whose list target grows? */
int hkv_fill_source(const struct hkv_cmap *cur, const struct hkv_cmap *target, const char *self);

#endif /* HKV_SERVER_FILLER_H */
