/*
 * hist.h - log-linear latency histogram: 128 linear sub-buckets per power
 * of two of nanoseconds, so every recorded value is known within 1/128
 * (0.8 %). Fixed size, no allocation, mergeable by adding counts, which is
 * how per-thread histograms become one per operation type.
 */
#ifndef HKV_BENCH_HIST_H
#define HKV_BENCH_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 7
#define HIST_SUB      (1u << HIST_SUB_BITS)
#define HIST_EXPS     40 /* up to 2^40 ns, ~18 minutes */

struct hist {
	uint64_t count, sum_ns, min_ns, max_ns;
	uint64_t b[HIST_EXPS][HIST_SUB];
};

void hist_init(struct hist *h);
void hist_add(struct hist *h, uint64_t ns);
void hist_merge(struct hist *dst, const struct hist *src);
/* Value at quantile q in [0,1], in ns (upper edge of its bucket). */
uint64_t hist_quantile(const struct hist *h, double q);

#endif
