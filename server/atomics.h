/*
 * atomics.h - the server's atomics on words clients reach with RDMA atomics
 * (slots, block metas and stamps, bitmap words).
 *
 * A CPU atomic is atomic against the NIC's only on devices that report
 * IBV_ATOMIC_GLOB. Soft-RoCE executes an RDMA atomic as a read and a write
 * under its own lock, and most NICs report IBV_ATOMIC_HCA: a CPU CAS that
 * lands between the NIC's read and write is lost, and a block can get two
 * owners. So on verbs every such atomic of the server is posted as an RDMA
 * atomic on a connection of its own to its region (hkv_listener_loopback),
 * where the NIC serialises it with the clients'; many at once go as one
 * chain (one round trip). On shm the clients execute their atomics with the
 * CPU's own: the server uses them too.
 *
 * Plain loads are not atomics: reading a word the NIC may be changing sees
 * it before or after, as a client's READ does.
 *
 * Thread-safe (one mutex): the event loop (the sweep, moves, purges) and any
 * other thread may call.
 */
#ifndef HKV_SERVER_ATOMICS_H
#define HKV_SERVER_ATOMICS_H

#include <pthread.h>
#include <stdint.h>

struct hkv_conn;
struct hkv_listener;
struct hkv_mr;

#define HKV_SATOM_CHAIN 32 /* atomics per chain (one round trip) */

struct hkv_satom {
	pthread_mutex_t lock;
	struct hkv_listener *listener; /* verbs: where the loopback comes from; NULL: shm */
	struct hkv_conn *conn;         /* the loopback, NULL while it is not up */
	struct hkv_mr *mr;             /* over res */
	uint64_t res[HKV_SATOM_CHAIN];
	uint8_t *local;  /* the region's first byte in this process */
	uint64_t remote; /* ... as the loopback addresses it */
	uint32_t rkey;
	uint64_t retry_ns; /* no reopen of a failed loopback before this */
	/* counted (metrics, tests): atomics through the device, on the CPU,
	 * the loopback's round trips, and its failures */
	uint64_t nic, cpu, round_trips, failures;
};

/* One atomic: CAS (cmp_add = expected, swap = new) or FAA (cmp_add =
 * addend) of an 8-byte aligned word of the region. old: the word before
 * (a CAS won iff old == cmp_add). */
struct hkv_satom_op {
	uint64_t *word;
	uint64_t cmp_add, swap, old;
	uint8_t opcode; /* HKV_WR_CAS or HKV_WR_FAA */
};

/* Set up for the region whose first byte is at local (CPU atomics until a
 * listener is attached). 0 or -ENOMEM. */
int hkv_satom_init(struct hkv_satom *a, void *local);
/* The data plane is up on l (verbs: the loopback is opened now; if it
 * cannot be, the CPU's atomics are used, counted and logged, and it is
 * tried again each second); and it goes down (the loopback is closed
 * first: call before destroying l). While no verbs listener is attached no
 * client can reach the region through a NIC: the CPU's atomics are used. */
void hkv_satom_attach(struct hkv_satom *a, struct hkv_listener *l);
void hkv_satom_detach(struct hkv_satom *a);
void hkv_satom_fini(struct hkv_satom *a);

/*
 * Execute ops[0..n) in order (chains of HKV_SATOM_CHAIN), filling each old.
 * 0, or the loopback's error: then the ops of the failed chain and after
 * are reported as not executed - a CAS's old made unequal to its expected
 * value, an FAA's old set to UINT64_MAX - though one may have been (its
 * effect is then one a concurrent agent could have had: a lost CAS leaves
 * the word's owner in charge, a lost free leaks the block until a warm
 * restart).
 */
int hkv_satom_run(struct hkv_satom *a, struct hkv_satom_op *ops, int n);
/* One CAS; returns the word's old value (won iff == expect). */
uint64_t hkv_satom_cas(struct hkv_satom *a, uint64_t *word, uint64_t expect, uint64_t swap);
/* OR masks[i] into words[i] for every i (CASes on the values seen, again
 * where a client changed the word meanwhile; n <= HKV_SATOM_CHAIN per
 * chain). Bits already set stay set. */
void hkv_satom_or(struct hkv_satom *a, uint64_t *const *words, const uint64_t *masks, int n);
/* One word. */
void hkv_satom_or1(struct hkv_satom *a, uint64_t *word, uint64_t mask);

#endif
