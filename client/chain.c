/*
 * chain.c - round trips: the work requests every operation chains
 * (hkv_wr_read/write/cas/faa), hkv_exec (post a chain, wait: one round
 * trip; it carries the region clock's READ when due), how old a view may
 * grow before nothing may act on it, and backing
 * off after a lost race. client/ops_int.h has the overview of the rooms.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "common/transport_int.h"

void (*hkv_test_hook)(struct hkv_client *c, enum hkv_test_point point);

/* ---- work request helpers --------------------------------------------------- */

struct hkv_wr hkv_wr_read(struct hkv_client *c, void *local, uint64_t off, uint32_t len)
{
	return (struct hkv_wr){.opcode = HKV_WR_READ, .local = local, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->rkey, .length = len};
}

/* We only ever WRITE blocks (in the data area); with memory windows that
 * takes the data area's WRITE window (the base rkey has no WRITE right). */
struct hkv_wr hkv_wr_write(struct hkv_client *c, const void *local, uint64_t off, uint32_t len)
{
	uint32_t rkey = c->windows && off >= c->g.data_off ? c->wkey : c->rkey;

	return (struct hkv_wr){.opcode = HKV_WR_WRITE, .local = (void *)local, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = rkey, .length = len};
}

struct hkv_wr hkv_wr_cas(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t expect,
			 uint64_t swap)
{
	return (struct hkv_wr){.opcode = HKV_WR_CAS, .local = res, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->akey,
			       .compare_add = expect, .swap = swap};
}

struct hkv_wr hkv_wr_faa(struct hkv_client *c, uint64_t *res, uint64_t off, uint64_t add)
{
	return (struct hkv_wr){.opcode = HKV_WR_FAA, .local = res, .mr = c->mr,
			       .remote_addr = hkv_raddr(c, off), .rkey = c->akey, .compare_add = add};
}

/* -EAGAIN (room held by signaled work nobody waits for) cannot happen for
 * a client's chain; if it did, it must not be an answer: fail the
 * connection, so the next operation connects again (hkv_revive). */
static int no_eagain(struct hkv_client *c, int ret)
{
	return ret == -EAGAIN ? (c->conn->error = HKV_ETRANSPORT) : ret;
}

/* ---- the region's clock (common/layout.h, HKV_CLOCK_OFF) ----------------------- */

uint64_t hkv_wall_off_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec - hkv_coarse_ns();
}

/* The clock word was READ (into atom[7]) between t0 and t1 (coarse ns). */
static void clock_learn(struct hkv_client *c, uint64_t t0, uint64_t t1)
{
	uint64_t ms = c->atom[7], mid = t0 + (t1 - t0) / 2;

	if (!ms) /* a server without the word: our own wall clock */
		c->clock_off_ns = hkv_wall_off_ns();
	else /* (the word is up to a tick old when read: half a tick on average) */
		c->clock_off_ns = ms * 1000000ull + HKV_CLOCK_TICK_MS * 500000ull - mid;
	c->clock_at_ns = t1 ? t1 : 1;
}

int hkv_clock_refresh(struct hkv_client *c)
{
	struct hkv_wr wr = hkv_wr_read(c, &c->atom[7], HKV_CLOCK_OFF, 8);
	uint64_t t0 = hkv_coarse_ns();
	int ret = no_eagain(c, hkv_conn_exec(c->conn, &wr, 1));

	if (!ret)
		clock_learn(c, t0, hkv_coarse_ns());
	return ret;
}

int hkv_clock_keep(struct hkv_client *c)
{
	/* (a clock that went back shows as a huge age too) */
	return hkv_coarse_ns() - c->clock_at_ns >= HKV_CLOCK_MAX_AGE_NS ? hkv_clock_refresh(c) : 0;
}

#define CLOCK_RIDE_MAX 31 /* chains this long or shorter carry the clock READ */

/* Post a chain and wait for it; a chain once the clock is HKV_CLOCK_RIDE_NS
 * old also READs the clock word first (unsignaled: RC completes it before
 * the chain's last WR), so a busy handle never spends a round trip on it. */
int hkv_exec(struct hkv_client *c, struct hkv_wr *wrs, int n)
{
	struct hkv_wr ride[CLOCK_RIDE_MAX + 1];
	uint64_t t0;
	int ret;

	if (n > CLOCK_RIDE_MAX || n < 1 || !c->clock_at_ns ||
	    (t0 = hkv_coarse_ns()) - c->clock_at_ns < HKV_CLOCK_RIDE_NS)
		return no_eagain(c, hkv_conn_exec(c->conn, wrs, n));
	ride[0] = hkv_wr_read(c, &c->atom[7], HKV_CLOCK_OFF, 8);
	ride[0].flags |= HKV_WR_F_NO_COMPLETION;
	memcpy(&ride[1], wrs, (size_t)n * sizeof(*wrs));
	ret = no_eagain(c, hkv_conn_exec(c->conn, ride, n + 1));
	if (!ret)
		clock_learn(c, t0, hkv_coarse_ns());
	return ret;
}

int hkv_post(struct hkv_client *c, struct hkv_wr *wrs, int n, int *want)
{
	*want = hkv_conn_completions(wrs, n);
	return no_eagain(c, hkv_conn_post(c->conn, wrs, n));
}

int hkv_room(const struct hkv_client *c)
{
	const struct hkv_conn *cn = c->conn;

	/* the send queue's places: nothing of ours is in flight, so all but the
	 * unsignaled WRs not yet covered by a signaled one (a GET's atime CAS)
	 * come back as the post reaps the transport's quiet completions */
	return cn->sq_depth - (cn->quiet_out ? cn->carry : cn->sq_used);
}

/* ---- views and retries ------------------------------------------------------- */

/* May a write still act on what was seen at seen_ns? Checked right before
 * the post that acts on it (docs/design.md, "Views"). */
uint64_t hkv_test_view_max_ns;

int hkv_view_fresh(struct hkv_client *c, uint64_t seen_ns)
{
	if (hkv_now_ns() - seen_ns <= (hkv_test_view_max_ns ? hkv_test_view_max_ns
							    : HKV_VIEW_MAX_NS)) {
		hkv_test_at(c, HKV_TP_VIEW_POST);
		return 1;
	}
	c->stats.stale_views++;
	return 0;
}

/*
 * Retrying after a lost race. Contenders back off for a random while that
 * grows with the attempts, in units of how long one attempt took (a round
 * trip is 2 us on a NIC, 100+ us under emulation), so they spread out instead
 * of colliding in lock step. An operation gives up (HKV_EAGAIN) only when it
 * has been losing for the whole configured timeout.
 */
void hkv_retry_begin(struct retry *r)
{
	r->start = r->last = hkv_now_ns();
	r->attempt = r->stale = 0;
}

/* Wait before the next attempt; 0 to go on, HKV_EAGAIN when time is up. */
int hkv_retry_wait(struct hkv_client *c, struct retry *r)
{
	uint64_t now, unit, until;
	/* (growth capped at 32 units: an unbounded backoff starves the loser
	 * while fresh winners come back at once - seen as HKV_EAGAIN under six
	 * threads' incr on two emulated CPUs) */
	int shift = r->attempt < 5 ? r->attempt : 5;

	hkv_test_at(c, HKV_TP_RETRY);
	now = hkv_now_ns();
	unit = now - r->last;

	if (now - r->start > (uint64_t)c->timeout_ms * 1000000ull || r->attempt >= HKV_MAX_RETRIES)
		return HKV_EAGAIN;
	if (unit < 1000)
		unit = 1000;
	until = now + hkv_rand(c) % (unit << shift);
	while (hkv_now_ns() < until) {
		if (until - hkv_now_ns() <= 20000)
			continue;
		if (hkv_conn_idle.fn) /* a pipe's lane: the other lanes run */
			hkv_conn_idle.fn(hkv_conn_idle.arg);
		else
			sched_yield(); /* a long wait: let the contenders run */
	}
	r->attempt++;
	r->last = hkv_now_ns();
	return 0;
}

/*
 * A view went stale (STALE): this thread was stopped, not beaten by other
 * writers. Look again at once, and do not count the stall against the
 * timeout - three times; then as a lost race.
 */
int hkv_retry_stale(struct hkv_client *c, struct retry *r)
{
	if (r->stale++ >= 3)
		return hkv_retry_wait(c, r);
	r->start = r->last = hkv_now_ns();
	return 0;
}
