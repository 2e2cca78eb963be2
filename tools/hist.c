/* hist: see hist.h. The index arithmetic: for v >= HIST_SUB let shift = msb(v) - 6, so that
 * v >> shift lies in [64, 128); bucket = HIST_SUB + (shift - 1) * 64 + (v >> shift) - 64.
 * Bucket widths are therefore 2^shift for values in [2^(shift+6), 2^(shift+7)). */
#include "hist.h"

#include <string.h>

void hist_init(struct hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

static unsigned msbIndex(uint64_t v)
{
    unsigned e = 0;
    while (v >>= 1) {
        e++;
    }
    return e;
}

size_t hist_index(uint64_t v)
{
    if (v >= (1ull << HIST_MAX_EXP)) {
        v = (1ull << HIST_MAX_EXP) - 1;
    }
    if (v < HIST_SUB) {
        return (size_t)v;
    }
    unsigned shift = msbIndex(v) - (HIST_SUB_BITS - 1);
    return HIST_SUB + (size_t)(shift - 1) * HIST_HALF + (size_t)((v >> shift) - HIST_HALF);
}

void hist_bounds(size_t i, uint64_t *lo, uint64_t *hi)
{
    if (i < HIST_SUB) {
        *lo = *hi = i;
        return;
    }
    size_t k = i - HIST_SUB;
    unsigned shift = (unsigned)(k / HIST_HALF) + 1;
    uint64_t m = k % HIST_HALF + HIST_HALF;
    *lo = m << shift;
    *hi = ((m + 1) << shift) - 1;
}

void hist_record(struct hist *h, uint64_t v)
{
    h->counts[hist_index(v)]++;
    h->total++;
    h->sum += (double)v;
    if (v < h->min) {
        h->min = v;
    }
    if (v > h->max) {
        h->max = v;
    }
}

void hist_merge(struct hist *dst, const struct hist *src)
{
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        dst->counts[i] += src->counts[i];
    }
    dst->total += src->total;
    dst->sum += src->sum;
    if (src->min < dst->min) {
        dst->min = src->min;
    }
    if (src->max > dst->max) {
        dst->max = src->max;
    }
}

uint64_t hist_percentile(const struct hist *h, double p)
{
    if (h->total == 0) {
        return 0;
    }
    /* rank = ceil(p% of total) in integers: p in millionths of the whole, so that 99.9 of
     * 1000 samples is rank 999 and not 1000 (99.9 / 100 * 1000 is 999.0000000000001). */
    if (p < 0) {
        p = 0;
    }
    if (p > 100) {
        p = 100;
    }
    uint64_t ppm = (uint64_t)(p * 10000.0 + 0.5);
    uint64_t rank = (ppm * h->total + 999999u) / 1000000u;
    if (rank == 0) {
        rank = 1;
    }
    if (rank > h->total) {
        rank = h->total;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t lo, hi;
            hist_bounds(i, &lo, &hi);
            return hi < h->max ? hi : h->max;
        }
    }
    return h->max;
}

double hist_mean(const struct hist *h)
{
    return h->total ? h->sum / (double)h->total : 0;
}

void hist_print_ascii(FILE *out, const struct hist *h, double scale, const char *unit,
                      unsigned width)
{
    if (h->total == 0) {
        fputs("(no samples)\n", out);
        return;
    }
    /* Rows: [2^e, 2^(e+1)) for e from msb(min) to msb(max); 0 falls in the first row. */
    unsigned e_lo = h->min ? msbIndex(h->min) : 0;
    unsigned e_hi = msbIndex(h->max ? h->max : 1);
    if (e_hi >= HIST_MAX_EXP) {
        e_hi = HIST_MAX_EXP - 1;
    }
    uint64_t rows[HIST_MAX_EXP] = {0};
    uint64_t fullest = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        if (h->counts[i] == 0) {
            continue;
        }
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        unsigned e = lo ? msbIndex(lo) : 0;
        if (e < e_lo) {
            e = e_lo;
        }
        if (e > e_hi) {
            e = e_hi;
        }
        rows[e] += h->counts[i];
    }
    for (unsigned e = e_lo; e <= e_hi; e++) {
        if (rows[e] > fullest) {
            fullest = rows[e];
        }
    }
    uint64_t cum = 0;
    for (unsigned e = e_lo; e <= e_hi; e++) {
        cum += rows[e];
        double lo = (double)(e == e_lo && h->min == 0 ? 0 : (1ull << e)) / scale;
        double hi = (double)(1ull << (e + 1)) / scale;
        unsigned bar = fullest ? (unsigned)((double)rows[e] * width / (double)fullest + 0.5) : 0;
        if (bar == 0 && rows[e] > 0) {
            bar = 1;
        }
        fprintf(out, "  [%9.3f, %9.3f) %s %10llu %6.2f%% %7.3f%% |", lo, hi, unit,
                (unsigned long long)rows[e], 100.0 * (double)rows[e] / (double)h->total,
                100.0 * (double)cum / (double)h->total);
        for (unsigned k = 0; k < bar; k++) {
            fputc('#', out);
        }
        fputc('\n', out);
    }
}
