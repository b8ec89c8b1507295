/* hist.c - see hist.h. */
#include "bench/hist.h"

#include <string.h>

void hist_init(struct hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min_ns = UINT64_MAX;
}

/* Bucket of v: exponent e = position of the top bit above the sub-bucket
 * bits, sub = the next HIST_SUB_BITS bits. Values < HIST_SUB are exact. */
static void bucket_of(uint64_t v, unsigned *e, unsigned *sub)
{
	unsigned top = v ? 63u - (unsigned)__builtin_clzll(v) : 0;

	if (top < HIST_SUB_BITS) {
		*e = 0;
		*sub = (unsigned)v;
		return;
	}
	*e = top - HIST_SUB_BITS + 1;
	if (*e >= HIST_EXPS) {
		*e = HIST_EXPS - 1;
		*sub = HIST_SUB - 1;
		return;
	}
	*sub = (unsigned)(v >> (*e - 1)) & (HIST_SUB - 1);
}

static uint64_t bucket_upper(unsigned e, unsigned sub)
{
	if (e == 0)
		return sub;
	return ((uint64_t)(HIST_SUB | sub) << (e - 1)) + ((1ull << (e - 1)) - 1);
}

void hist_add(struct hist *h, uint64_t ns)
{
	unsigned e, sub;

	bucket_of(ns, &e, &sub);
	h->b[e][sub]++;
	h->count++;
	h->sum_ns += ns;
	if (ns < h->min_ns)
		h->min_ns = ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
}

void hist_merge(struct hist *dst, const struct hist *src)
{
	for (unsigned e = 0; e < HIST_EXPS; e++)
		for (unsigned s = 0; s < HIST_SUB; s++)
			dst->b[e][s] += src->b[e][s];
	dst->count += src->count;
	dst->sum_ns += src->sum_ns;
	if (src->min_ns < dst->min_ns)
		dst->min_ns = src->min_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
}

uint64_t hist_quantile(const struct hist *h, double q)
{
	uint64_t want, seen = 0;

	if (!h->count)
		return 0;
	want = (uint64_t)(q * (double)h->count + 0.5);
	if (want < 1)
		want = 1;
	for (unsigned e = 0; e < HIST_EXPS; e++)
		for (unsigned s = 0; s < HIST_SUB; s++) {
			seen += h->b[e][s];
			if (seen >= want) {
				uint64_t up = bucket_upper(e, s);

				return up > h->max_ns ? h->max_ns : up;
			}
		}
	return h->max_ns;
}
