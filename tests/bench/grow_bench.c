/* grow-bench: the worst single fsm_apply() while the record table grows.
 *
 * Applies N claims on fresh keys (the table doubles at 768, 1536, ... 786432, 1572864
 * records) and times every apply on its own. Prints the total time, the worst applies with
 * the record count at which they happened, the worst of the applies that found the table
 * full (at 768 << k records), and how many took over 1 ms. Other processes on the machine
 * show up as isolated slow applies anywhere: repeat runs. Like fsm-bench,
 * commands are packed before the clock starts, and the first pass (a fresh process: every
 * page faulted in) is followed by warm passes on new state machines that reuse the freed
 * memory (mallopt). The per-apply clock reads (two clock_gettime calls) are included.
 *
 * --malloc-default leaves glibc's malloc as it is (large arrays are then mmap()ed, fresh
 * and lazily zeroed, instead of reused heap memory that calloc must clear).
 *
 * Usage: grow-bench [--records N] [--runs R] [--malloc-default]
 * It prints figures; it asserts nothing about speed. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#include "fsm.h"
#include "prefault_thread.h"
#include "table.h"
#include "packed.h"

/* As the daemon makes them: the arrays allocated ahead are faulted in on a thread
 * (prefault_thread.h). */
static const struct fsm_options daemonOpts = {.prefault = &prefault_thread};

static uint64_t nowNs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define WORST 5

struct pass {
    double total_s;
    uint64_t worst_ns[WORST]; /* descending */
    size_t worst_at[WORST];   /* records in the table before that apply */
    size_t over_1ms;
    uint64_t growth_ns; /* the worst apply that found the table full (768 << k) */
    size_t unexpected;
    /* The last growth with its whole migration inside the run: the table full at
     * mig_at records; the applies of its migration (mig_len of them: the old array's
     * slots / TABLE_MIGRATE_STEP) took mig_ns in all, the mig_len applies before it
     * pre_ns. */
    size_t mig_at, mig_len;
    uint64_t mig_ns, pre_ns;
};

static void runPass(const struct packed *p, uint64_t *dts, struct pass *out)
{
    memset(out, 0, sizeof(*out));
    struct fsm *f = fsm_new_with(&daemonOpts);
    struct fsm_result r;
    uint64_t t_start = nowNs();
    for (size_t i = 0; i < p->n; i++) {
        uint64_t t0 = nowNs();
        Idem__Outcome o = fsm_apply(f, i + 1, p->buf + p->off[i], p->off[i + 1] - p->off[i], &r);
        uint64_t dt = nowNs() - t0;
        dts[i] = dt;
        if (o != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
            out->unexpected++;
        }
        if (i >= 768 && i % 768 == 0 && ((i / 768) & (i / 768 - 1)) == 0 && dt > out->growth_ns) {
            out->growth_ns = dt;
        }
        if (dt > 1000000) {
            out->over_1ms++;
        }
        if (dt > out->worst_ns[WORST - 1]) {
            int k = WORST - 1;
            while (k > 0 && out->worst_ns[k - 1] < dt) {
                out->worst_ns[k] = out->worst_ns[k - 1];
                out->worst_at[k] = out->worst_at[k - 1];
                k--;
            }
            out->worst_ns[k] = dt;
            out->worst_at[k] = i;
        }
    }
    out->total_s = (double)(nowNs() - t_start) / 1e9;
    fsm_close(f);
    for (size_t g = 768; g <= p->n; g *= 2) {
        size_t len = g / 3 * 4 / TABLE_MIGRATE_STEP; /* the old array has g * 4/3 slots */
        if (g + len <= p->n && len <= g) {
            out->mig_at = g;
            out->mig_len = len;
        }
    }
    out->mig_ns = out->pre_ns = 0;
    for (size_t i = 0; i < out->mig_len; i++) {
        out->mig_ns += dts[out->mig_at + i];
        out->pre_ns += dts[out->mig_at - out->mig_len + i];
    }
}

int main(int argc, char **argv)
{
    size_t n = 2000000;
    int runs = 3;
    int tune_malloc = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--records") == 0 && i + 1 < argc) {
            n = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--malloc-default") == 0) {
            tune_malloc = 0;
        } else {
            fprintf(stderr, "usage: grow-bench [--records N] [--runs R] [--malloc-default]\n");
            return 2;
        }
    }
    if (n == 0 || runs < 1) {
        fprintf(stderr, "grow-bench: --records and --runs must be positive\n");
        return 2;
    }
    if (tune_malloc) {
        mallopt(M_TRIM_THRESHOLD, INT32_MAX);
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
    }
    static uint8_t fingerprint[32];
    memset(fingerprint, 0x5a, sizeof(fingerprint));
    struct packed p;
    pack_claims(&p, n, fingerprint);
    uint64_t *dts = calloc(n, sizeof *dts);
    if (dts == NULL) {
        fprintf(stderr, "grow-bench: out of memory\n");
        return 1;
    }
    printf("grow-bench: %zu claims on fresh keys, each fsm_apply() timed%s\n", n,
           tune_malloc ? "" : " (malloc as is)");
    size_t bad = 0;
    for (int run = 0; run <= runs; run++) {
        struct pass s;
        runPass(&p, dts, &s);
        bad += s.unexpected;
        printf("  %-5s total %.3f s (%.0f applies/s), >1 ms: %zu, worst at a growth %.3f ms, "
               "worst:",
               run == 0 ? "cold" : "warm", s.total_s, (double)n / s.total_s, s.over_1ms,
               (double)s.growth_ns / 1e6);
        for (int k = 0; k < WORST; k++) {
            printf(" %.3f ms @%zu", (double)s.worst_ns[k] / 1e6, s.worst_at[k]);
        }
        printf("\n");
        if (s.mig_len > 0) {
            printf("        migration from %zu records: its %zu applies %.3f ms, the %zu before "
                   "%.3f ms\n",
                   s.mig_at, s.mig_len, (double)s.mig_ns / 1e6, s.mig_len, (double)s.pre_ns / 1e6);
        }
    }
    free(dts);
    pack_free(&p);
    if (bad != 0) {
        fprintf(stderr, "grow-bench: %zu unexpected outcomes\n", bad);
        return 1;
    }
    return 0;
}
