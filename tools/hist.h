/* hist: a log-linear latency histogram in the layout of HdrHistogram (idem-bench's).
 *
 * Values (any unit; idem-bench records microseconds) below HIST_SUB are counted exactly;
 * above, each power-of-two range [2^e, 2^(e+1)) is split into HIST_HALF equal buckets, so
 * that every recorded value is known to within 1/64 of itself (two significant decimal
 * digits). Values at or above 2^HIST_MAX_EXP are counted in the last bucket (the exact
 * maximum is kept separately). Fixed size, no allocation: a struct hist can live on the
 * stack of a thread, one per thread, merged at the end. Not thread-safe. */
#ifndef IDEM_TOOLS_HIST_H
#define IDEM_TOOLS_HIST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define HIST_SUB_BITS 7
#define HIST_SUB (1u << HIST_SUB_BITS) /* 128 values counted exactly */
#define HIST_HALF (HIST_SUB / 2)       /* 64 buckets per power of two above */
#define HIST_MAX_EXP 40                /* 2^40 µs: 12.7 days */
#define HIST_BUCKETS (HIST_SUB + (HIST_MAX_EXP - HIST_SUB_BITS) * HIST_HALF)

struct hist {
    uint64_t counts[HIST_BUCKETS];
    uint64_t total;
    uint64_t min; /* UINT64_MAX while empty */
    uint64_t max; /* 0 while empty */
    double sum;
};

/* Empties h (the caller's). */
void hist_init(struct hist *h);

/* Counts one value. */
void hist_record(struct hist *h, uint64_t v);

/* Adds every count of src (borrowed) into dst. */
void hist_merge(struct hist *dst, const struct hist *src);

/* The bucket that holds v. */
size_t hist_index(uint64_t v);

/* The smallest and largest value (OUT: lo, hi) that land in bucket i < HIST_BUCKETS. */
void hist_bounds(size_t i, uint64_t *lo, uint64_t *hi);

/* The value at percentile p (0 < p <= 100): the largest value of the bucket that holds
 * the ceil(p% × total)-th smallest sample (as HdrHistogram reports it), but never more
 * than the largest value recorded; so the answer is >= the true percentile and at most
 * 1/64 above it. 0 when the histogram is empty. */
uint64_t hist_percentile(const struct hist *h, double p);

/* The mean of the recorded values, 0 when empty. */
double hist_mean(const struct hist *h);

/* Prints an ASCII distribution to out: one row per power-of-two range of the values
 * between min and max ("[lo, hi) ms  count  pct  cumulative  bar"), `width` characters of
 * bar for the fullest row. Values are divided by `scale` for display (1000: µs shown as
 * ms). Prints "(no samples)" when empty. */
void hist_print_ascii(FILE *out, const struct hist *h, double scale, const char *unit,
                      unsigned width);

#endif
