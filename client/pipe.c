/*
 * pipe.c - operations in flight (include/hatchkv.h, "operations in flight").
 *
 * A pipe has `depth` lanes. A lane is a whole handle - its own connection,
 * buffers, allocator and counters, opened from the pipe's config - and a
 * coroutine (a stack of its own; switching saves and restores the
 * callee-saved registers only, no system call: glibc's swapcontext makes
 * two, which here cost more than the round trips they overlap) that runs
 * one operation at a time on it with the
 * blocking calls, unchanged. When a lane's chain is on the wire its
 * transport wait finds nothing and calls the idle hook (common/transport.h),
 * which switches back to the scheduler; the scheduler resumes each busy lane
 * in turn (each polls its own completion queue once and yields again), so
 * `depth` chains are in flight at once.
 *
 * Why it is correct: lanes are independent clients, and the per-key
 * protocol is linearizable for any number of concurrent clients (docs/
 * design.md, "Why it is correct"); nothing is shared between lanes but the
 * config's location cache, which is already shared between threads. What
 * the pipe adds is order: an operation starts only when no earlier
 * operation on its key (in flight or queued) is left, so operations on one
 * key complete in submission order.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"
#include "common/transport.h"
#include "hatchkv.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PIPE_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define PIPE_TSAN 1
#endif

#define LANE_STACK (512u << 10)
#define PIPE_MAX_DEPTH 64

#if !defined(__x86_64__)
#error "client/pipe.c switches stacks with x86-64 code"
#endif

/*
 * hkv_ctx_switch(&from_sp, to_sp): push the callee-saved registers and the
 * SSE/x87 control words on this stack, save the stack pointer in *from_sp,
 * load to_sp and pop the same from there: the other context returns from
 * its own hkv_ctx_switch call (or, the first time, into lane_start, with
 * the lane in r12).
 */
void hkv_ctx_switch(void **from_sp, void *to_sp);
void hkv_lane_start(void);
__asm__(".text\n"
	".globl hkv_ctx_switch\n"
	".hidden hkv_ctx_switch\n"
	".type hkv_ctx_switch,@function\n"
	"hkv_ctx_switch:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size hkv_ctx_switch,.-hkv_ctx_switch\n"
	".globl hkv_lane_start\n"
	".hidden hkv_lane_start\n"
	".type hkv_lane_start,@function\n"
	"hkv_lane_start:\n"
	"	movq %r12, %rdi\n"
	"	call hkv_lane_main\n"
	"	ud2\n"
	".size hkv_lane_start,.-hkv_lane_start\n");

struct lane {
	struct hkv_pipe *p;
	struct hkv_client *h;
	void *sp;    /* its saved stack pointer while it does not run */
	void *map;   /* its stack, with a guard page below */
	void *stack;
	struct hkv_pipe_op *op; /* running (NULL: free) */
	int done;
#ifdef PIPE_TSAN
	void *fiber;
#endif
};

struct hkv_pipe {
	struct lane lanes[PIPE_MAX_DEPTH];
	int depth;
	void *main_sp;
	struct lane *cur;
#ifdef PIPE_ASAN
	void *main_fake;
	const void *main_bottom;
	size_t main_size;
#endif
#ifdef PIPE_TSAN
	void *main_fiber;
#endif
	/* queued: submitted, not started (a ring, in submission order) */
	struct hkv_pipe_op **q;
	unsigned qhead, qlen, qcap;
	/* finished, not yet handed back */
	struct hkv_pipe_op **fin;
	unsigned nfin;
	unsigned pending; /* submitted and not handed back */
	int peak;         /* most lanes busy at once (hkv_pipe_peak) */
};

/* ---- switching ------------------------------------------------------------ */

static void to_lane(struct hkv_pipe *p, struct lane *l)
{
	p->cur = l;
	hkv_conn_idle = (struct hkv_conn_idle){NULL, NULL}; /* set by the lane itself */
#ifdef PIPE_ASAN
	__sanitizer_start_switch_fiber(&p->main_fake, l->stack, LANE_STACK);
#endif
#ifdef PIPE_TSAN
	__tsan_switch_to_fiber(l->fiber, 0);
#endif
	hkv_ctx_switch(&p->main_sp, l->sp);
#ifdef PIPE_ASAN
	__sanitizer_finish_switch_fiber(p->main_fake, NULL, NULL);
#endif
	hkv_conn_idle = (struct hkv_conn_idle){NULL, NULL};
	p->cur = NULL;
}

static void to_main(struct lane *l)
{
	struct hkv_pipe *p = l->p;
#ifdef PIPE_ASAN
	void *fake = NULL;

	__sanitizer_start_switch_fiber(&fake, p->main_bottom, p->main_size);
#endif
#ifdef PIPE_TSAN
	__tsan_switch_to_fiber(p->main_fiber, 0);
#endif
	hkv_ctx_switch(&l->sp, p->main_sp);
#ifdef PIPE_ASAN
	__sanitizer_finish_switch_fiber(fake, &p->main_bottom, &p->main_size);
#endif
}

/* The transport's idle hook: our chain is on the wire, let the others run. */
static void lane_idle(void *arg)
{
	struct lane *l = arg;

	to_main(l);
	hkv_conn_idle = (struct hkv_conn_idle){lane_idle, l}; /* resumed: ours again */
}

/* ---- running one operation ---------------------------------------------- */

static void run(struct hkv_client *h, int lane, struct hkv_pipe_op *op)
{
	switch (op->kind) {
	case HKV_PIPE_GET:
		op->status = hkv_get(h, op->key, op->klen, op->buf, op->cap, &op->out_vlen,
				     &op->info);
		break;
	case HKV_PIPE_SET:
		op->status = hkv_set(h, op->key, op->klen, op->val, op->vlen, &op->opts);
		break;
	case HKV_PIPE_ADD:
		op->status = hkv_add(h, op->key, op->klen, op->val, op->vlen, &op->opts);
		break;
	case HKV_PIPE_REPLACE:
		op->status = hkv_replace(h, op->key, op->klen, op->val, op->vlen, &op->opts);
		break;
	case HKV_PIPE_CAS:
		op->status = hkv_cas(h, op->key, op->klen, op->val, op->vlen, op->version,
				     &op->opts);
		break;
	case HKV_PIPE_DELETE:
		op->status = hkv_delete(h, op->key, op->klen);
		break;
	case HKV_PIPE_INCR:
		op->status = hkv_incr(h, op->key, op->klen, op->delta, &op->number);
		break;
	case HKV_PIPE_DECR:
		op->status = hkv_decr(h, op->key, op->klen, op->delta, &op->number);
		break;
	case HKV_PIPE_TOUCH:
		op->status = hkv_touch(h, op->key, op->klen, op->opts.exptime);
		break;
	case HKV_PIPE_CALL:
		op->status = op->call ? op->call(h, lane, op->user) : -EINVAL;
		break;
	default:
		op->status = -EINVAL;
	}
}

void hkv_lane_main(struct lane *l) __attribute__((noreturn, visibility("hidden")));
void hkv_lane_main(struct lane *l)
{
#ifdef PIPE_ASAN
	__sanitizer_finish_switch_fiber(NULL, &l->p->main_bottom, &l->p->main_size);
#endif
	for (;;) {
		hkv_conn_idle = (struct hkv_conn_idle){lane_idle, l};
		run(l->h, (int)(l - l->p->lanes), l->op);
		hkv_conn_idle = (struct hkv_conn_idle){NULL, NULL};
		l->done = 1;
		to_main(l);
	}
}

/* ---- the scheduler -------------------------------------------------------- */

static int same_key(const struct hkv_pipe_op *a, const struct hkv_pipe_op *b)
{
	return a->klen == b->klen && !memcmp(a->key, b->key, a->klen);
}

/* May queued op i start: no lane runs its key, no earlier queued op has it? */
static int may_start(const struct hkv_pipe *p, unsigned i)
{
	const struct hkv_pipe_op *op = p->q[(p->qhead + i) % p->qcap];

	for (int j = 0; j < p->depth; j++)
		if (p->lanes[j].op && same_key(p->lanes[j].op, op))
			return 0;
	for (unsigned k = 0; k < i; k++)
		if (same_key(p->q[(p->qhead + k) % p->qcap], op))
			return 0;
	return 1;
}

static void dequeue(struct hkv_pipe *p, unsigned i)
{
	for (unsigned k = i; k > 0; k--) /* keep the others in order */
		p->q[(p->qhead + k) % p->qcap] = p->q[(p->qhead + k - 1) % p->qcap];
	p->qhead = (p->qhead + 1) % p->qcap;
	p->qlen--;
}

/* Give free lanes the first queued operations that may start. */
static void start_ops(struct hkv_pipe *p)
{
	int busy = 0;

	for (int j = 0; j < p->depth && p->qlen; j++) {
		struct lane *l = &p->lanes[j];

		if (l->op)
			continue;
		for (unsigned i = 0; i < p->qlen; i++) {
			if (!may_start(p, i))
				continue;
			l->op = p->q[(p->qhead + i) % p->qcap];
			dequeue(p, i);
			break;
		}
	}
	for (int j = 0; j < p->depth; j++)
		busy += p->lanes[j].op != NULL;
	if (busy > p->peak)
		p->peak = busy;
}

HKV_EXPORT int hkv_pipe_peak(const struct hkv_pipe *p)
{
	return p->peak;
}

/* Resume every busy lane once; collect what finished. */
static int sweep(struct hkv_pipe *p)
{
	int busy = 0;

	for (int j = 0; j < p->depth; j++) {
		struct lane *l = &p->lanes[j];

		if (!l->op)
			continue;
		busy++;
		to_lane(p, l);
		if (l->done) {
			p->fin[p->nfin++] = l->op;
			l->op = NULL;
			l->done = 0;
		}
	}
	return busy;
}

HKV_EXPORT int hkv_pipe_poll(struct hkv_pipe *p, struct hkv_pipe_op **done, int max)
{
	int n = 0;

#ifdef PIPE_TSAN
	p->main_fiber = __tsan_get_current_fiber(); /* the polling thread's (a pipe may move) */
#endif
	while (!p->nfin) {
		start_ops(p);
		if (!sweep(p))
			break; /* nothing queued or in flight */
	}
	while (n < max && p->nfin) {
		done[n++] = p->fin[0];
		memmove(p->fin, p->fin + 1, --p->nfin * sizeof(*p->fin));
	}
	p->pending -= (unsigned)n;
	return n;
}

HKV_EXPORT int hkv_pipe_submit(struct hkv_pipe *p, struct hkv_pipe_op *op)
{
	if (!op || (!op->key && op->klen))
		return -EINVAL;
	if (p->pending >= p->qcap)
		return -EAGAIN;
	p->q[(p->qhead + p->qlen++) % p->qcap] = op;
	p->pending++;
	return 0;
}

HKV_EXPORT int hkv_pipe_pending(const struct hkv_pipe *p)
{
	return (int)p->pending;
}

HKV_EXPORT void hkv_pipe_stats(const struct hkv_pipe *p, struct hkv_client_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (int j = 0; j < p->depth; j++) {
		struct hkv_client_stats st;
		uint64_t *dst = (uint64_t *)out;
		const uint64_t *src = (const uint64_t *)&st;

		hkv_client_stats(p->lanes[j].h, &st);
		for (size_t k = 0; k < sizeof(st) / sizeof(uint64_t); k++)
			dst[k] += src[k];
	}
}

/* ---- open / close ------------------------------------------------------------- */

static int lane_init(struct hkv_pipe *p, struct lane *l, const struct hkv_config *cfg)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t *top;
	uint32_t mxcsr;
	uint16_t fcw;
	int ret;

	l->p = p;
	ret = hkv_open(cfg, &l->h);
	if (ret)
		return ret;
	if (l != p->lanes) /* one eviction policy learns from every lane's gets */
		hkv_pol_share(l->h, p->lanes[0].h);
	l->map = mmap(NULL, LANE_STACK + (size_t)pg, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (l->map == MAP_FAILED) {
		l->map = NULL;
		return -ENOMEM;
	}
	mprotect(l->map, (size_t)pg, PROT_NONE); /* a guard page below the stack */
	l->stack = (uint8_t *)l->map + pg;
#ifdef PIPE_ASAN
	/* fresh memory, but perhaps at the address of a closed pipe's lane
	 * stack, whose parked frames' redzones ASan still has poisoned */
	ASAN_UNPOISON_MEMORY_REGION(l->stack, LANE_STACK);
#endif
	/* what hkv_ctx_switch pops the first time: control words, r15..r12 (the
	 * lane in r12), rbx, rbp, then "return" into hkv_lane_start with the
	 * stack 16-byte aligned (so its call leaves it as the ABI wants) */
	top = (uint64_t *)((uint8_t *)l->stack + LANE_STACK) - 8;
	__asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fcw));
	memset(top, 0, 8 * sizeof(*top));
	memcpy(&top[0], &mxcsr, 4);
	memcpy((uint8_t *)&top[0] + 4, &fcw, 2);
	top[4] = (uint64_t)(uintptr_t)l; /* r12 */
	top[7] = (uint64_t)(uintptr_t)hkv_lane_start;
	l->sp = top;
#ifdef PIPE_TSAN
	l->fiber = __tsan_create_fiber(0);
#endif
	return 0;
}

HKV_EXPORT void hkv_pipe_close(struct hkv_pipe *p)
{
	struct hkv_pipe_op *sink[16];
	long pg = sysconf(_SC_PAGESIZE);

	if (!p)
		return;
	while (hkv_pipe_poll(p, sink, 16) > 0) /* let every operation finish */
		;
	for (int j = 0; j < p->depth; j++) {
		struct lane *l = &p->lanes[j];

		if (l->h)
			hkv_close(l->h);
		if (l->map) {
#ifdef PIPE_ASAN
			/* (the lane's frames stay parked: their redzones must not
			 * outlive the stack in ASan's shadow) */
			ASAN_UNPOISON_MEMORY_REGION(l->stack, LANE_STACK);
#endif
			munmap(l->map, LANE_STACK + (size_t)pg);
		}
#ifdef PIPE_TSAN
		if (l->fiber)
			__tsan_destroy_fiber(l->fiber);
#endif
	}
	hkv_free(p->q);
	hkv_free(p->fin);
	hkv_free(p);
}

HKV_EXPORT int hkv_pipe_open(const struct hkv_config *cfg, int depth, struct hkv_pipe **out)
{
	struct hkv_pipe *p;
	int ret = 0;

	*out = NULL;
	if (!cfg || depth < 1 || depth > PIPE_MAX_DEPTH)
		return -EINVAL;
	p = hkv_calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->qcap = 4u * (unsigned)depth;
	p->q = hkv_calloc(p->qcap, sizeof(*p->q));
	p->fin = hkv_calloc(p->qcap, sizeof(*p->fin));
#ifdef PIPE_TSAN
	p->main_fiber = __tsan_get_current_fiber();
#endif
	if (!p->q || !p->fin)
		ret = -ENOMEM;
	for (; !ret && p->depth < depth; p->depth++)
		ret = lane_init(p, &p->lanes[p->depth], cfg);
	if (ret && p->depth < depth)
		p->depth++; /* (the lane that failed: close what it has) */
	if (ret) {
		hkv_pipe_close(p);
		return ret;
	}
	*out = p;
	return 0;
}
