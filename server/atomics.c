/* atomics.c - the server's atomics on client-reachable words (see atomics.h). */
#include <errno.h>
#include <string.h>

#include "common/log.h"
#include "common/transport_int.h"
#include "server/atomics.h"

#define LOOP_TIMEOUT_MS 5000
#define REOPEN_NS       (1000ull * 1000000ull) /* a failed loopback is tried again this late */

/* (lock held) Open the loopback if it is not up and may be tried now. */
static void loop_open(struct hkv_satom *a)
{
	uint64_t now = hkv_now_ns();

	if (a->conn || !a->listener || now < a->retry_ns)
		return;
	a->retry_ns = now + REOPEN_NS;
	a->conn = hkv_listener_loopback(a->listener, LOOP_TIMEOUT_MS);
	if (!a->conn) {
		hkv_warn("atomics: no loopback connection (%s): the server's atomics use the CPU "
			 "until one opens, which the NIC may not see as atomic",
			 hkv_strerror(-errno));
		return;
	}
	a->mr = hkv_conn_reg(a->conn, a->res, sizeof(a->res));
	if (!a->mr) {
		hkv_warn("atomics: registering the loopback's results: %s", hkv_strerror(-errno));
		hkv_conn_close(a->conn);
		a->conn = NULL;
		return;
	}
	a->remote = hkv_conn_region(a->conn)->base;
	a->rkey = hkv_conn_region(a->conn)->rkey;
}

/* (lock held) Drop a loopback that failed; the next call opens another. */
static void loop_drop(struct hkv_satom *a, int err)
{
	hkv_warn("atomics: the loopback connection failed (%s); opening another",
		 hkv_strerror(err));
	a->failures++;
	hkv_conn_dereg(a->conn, a->mr);
	hkv_conn_close(a->conn);
	a->conn = NULL;
	a->mr = NULL;
	a->retry_ns = 0;
}

int hkv_satom_init(struct hkv_satom *a, void *local)
{
	memset(a, 0, sizeof(*a));
	a->local = local;
	return pthread_mutex_init(&a->lock, NULL) ? -ENOMEM : 0;
}

void hkv_satom_attach(struct hkv_satom *a, struct hkv_listener *l)
{
	pthread_mutex_lock(&a->lock);
	a->listener = l;
	a->retry_ns = 0;
	errno = 0;
	loop_open(a);
	if (!a->conn && errno == EOPNOTSUPP)
		a->listener = NULL; /* shm: the CPU's atomics are the clients' */
	pthread_mutex_unlock(&a->lock);
}

void hkv_satom_detach(struct hkv_satom *a)
{
	pthread_mutex_lock(&a->lock);
	if (a->conn) {
		uint64_t t0 = hkv_now_ns();

		hkv_conn_dereg(a->conn, a->mr);
		hkv_conn_close(a->conn);
		hkv_debug("atomics: loopback closed in %.0f ms", (double)(hkv_now_ns() - t0) / 1e6);
	}
	a->conn = NULL;
	a->mr = NULL;
	a->listener = NULL;
	pthread_mutex_unlock(&a->lock);
}

void hkv_satom_fini(struct hkv_satom *a)
{
	hkv_satom_detach(a);
	if (a->nic || a->cpu || a->failures)
		hkv_info("atomics: %llu through the NIC in %llu round trips, %llu on the CPU while "
			 "a NIC could reach the region, %llu loopback failures",
			 (unsigned long long)a->nic, (unsigned long long)a->round_trips,
			 (unsigned long long)a->cpu, (unsigned long long)a->failures);
	pthread_mutex_destroy(&a->lock);
}

static void cpu_run(struct hkv_satom *a, struct hkv_satom_op *ops, int n)
{
	for (int i = 0; i < n; i++) {
		if (ops[i].opcode == HKV_WR_CAS) {
			ops[i].old = ops[i].cmp_add;
			__atomic_compare_exchange_n(ops[i].word, &ops[i].old, ops[i].swap, 0,
						    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		} else {
			ops[i].old = __atomic_fetch_add(ops[i].word, ops[i].cmp_add,
							__ATOMIC_ACQ_REL);
		}
	}
	if (a->listener) /* verbs without its loopback: counted (tests assert 0) */
		a->cpu += (uint64_t)n;
}

/* (lock held) One chain through the loopback; 0 or its error. */
static int nic_run(struct hkv_satom *a, struct hkv_satom_op *ops, int n)
{
	struct hkv_wr wrs[HKV_SATOM_CHAIN];
	int ret;

	memset(wrs, 0, sizeof(wrs[0]) * (size_t)n);
	for (int i = 0; i < n; i++) {
		wrs[i].local = &a->res[i];
		wrs[i].mr = a->mr;
		wrs[i].remote_addr = a->remote + (uint64_t)((uint8_t *)ops[i].word - a->local);
		wrs[i].rkey = a->rkey;
		wrs[i].length = 8;
		wrs[i].compare_add = ops[i].cmp_add;
		wrs[i].swap = ops[i].swap;
		wrs[i].opcode = ops[i].opcode;
	}
	ret = hkv_conn_exec(a->conn, wrs, n);
	a->round_trips++;
	if (ret)
		return ret;
	for (int i = 0; i < n; i++)
		ops[i].old = a->res[i];
	a->nic += (uint64_t)n;
	return 0;
}

static void not_done(struct hkv_satom_op *ops, int n)
{
	for (int i = 0; i < n; i++)
		ops[i].old = ops[i].opcode == HKV_WR_CAS ? ~ops[i].cmp_add : UINT64_MAX;
}

int hkv_satom_run(struct hkv_satom *a, struct hkv_satom_op *ops, int n)
{
	int ret = 0;

	pthread_mutex_lock(&a->lock);
	loop_open(a);
	for (int i = 0; i < n; i += HKV_SATOM_CHAIN) {
		int k = n - i < HKV_SATOM_CHAIN ? n - i : HKV_SATOM_CHAIN;

		if (!a->conn) {
			cpu_run(a, ops + i, k);
			continue;
		}
		ret = nic_run(a, ops + i, k);
		if (ret) {
			loop_drop(a, ret);
			not_done(ops + i, n - i);
			break;
		}
	}
	pthread_mutex_unlock(&a->lock);
	return ret;
}

uint64_t hkv_satom_cas(struct hkv_satom *a, uint64_t *word, uint64_t expect, uint64_t swap)
{
	struct hkv_satom_op op = {word, expect, swap, 0, HKV_WR_CAS};

	hkv_satom_run(a, &op, 1);
	return op.old;
}

void hkv_satom_or(struct hkv_satom *a, uint64_t *const *words, const uint64_t *masks, int n)
{
	struct hkv_satom_op ops[HKV_SATOM_CHAIN];
	int idx[HKV_SATOM_CHAIN];

	for (int base = 0; base < n; base += HKV_SATOM_CHAIN) {
		int k = 0, m = n - base < HKV_SATOM_CHAIN ? n - base : HKV_SATOM_CHAIN;

		for (int i = 0; i < m; i++) {
			uint64_t v = __atomic_load_n(words[base + i], __ATOMIC_ACQUIRE);

			if ((v & masks[base + i]) == masks[base + i])
				continue; /* (set already) */
			idx[k] = base + i;
			ops[k++] = (struct hkv_satom_op){words[base + i], v, v | masks[base + i], 0,
							 HKV_WR_CAS};
		}
		while (k) { /* the ones a client changed meanwhile: again, on what they hold */
			int left = 0;

			if (hkv_satom_run(a, ops, k))
				return; /* (logged; the bits stay clear: leaked, never doubled) */
			for (int i = 0; i < k; i++) {
				uint64_t v = ops[i].old, mask = masks[idx[i]];

				if (v == ops[i].cmp_add || (v & mask) == mask)
					continue;
				idx[left] = idx[i];
				ops[left++] = (struct hkv_satom_op){ops[i].word, v, v | mask, 0,
								   HKV_WR_CAS};
			}
			k = left;
		}
	}
}

void hkv_satom_or1(struct hkv_satom *a, uint64_t *word, uint64_t mask)
{
	hkv_satom_or(a, &word, &mask, 1);
}
