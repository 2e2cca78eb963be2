/* threads: idem-bench's closed loop with --threads: --concurrency threads, each with its own
 * synchronous client, each sending its next operation as soon as the last one is answered
 * (what a thread-per-request service sees; the generator's own threads compete for the CPU
 * with the cluster). Latency is measured from send to answer. */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "bench.h"

/* Closed loop: takes the next operation; false once --requests were started or the run is
 * over. */
static bool nextTicket(struct bench *b)
{
    if (atomic_load_explicit(&b->stop, memory_order_relaxed) || bench_now_us() >= b->end_us) {
        return false;
    }
    return b->cfg.requests == 0 ||
           atomic_fetch_add_explicit(&b->tickets, 1, memory_order_relaxed) < b->cfg.requests;
}

static void *workerRun(void *arg)
{
    struct worker *w = arg;
    struct bench *b = w->b;
    struct idem_client *c = NULL;
    char why[256];
    int rv = bench_client_open(&b->cfg, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        workload_note_error(w, "client: %s: %s", idem_strerror(rv), why);
        w->errors++;
        return NULL;
    }
    while (nextTicket(b)) {
        uint64_t t0 = bench_now_us();
        bool ok = workload_op(w, c);
        /* Every operation sent counts in the latency figures, failed ones too: a request
         * that timed out during a failover waited its whole deadline, and leaving it out
         * would make the tail look better than what callers saw. */
        hist_record(&w->hist, bench_now_us() - t0);
        workload_finish(w, ok);
    }
    idem_client_close(c);
    return NULL;
}

/* Sleeps until the monotonic clock reads `us`. */
static void sleepUntilUs(uint64_t us)
{
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000u),
                          .tv_nsec = (long)(us % 1000000u) * 1000L};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        /* EINTR: sleep again. */
    }
}

/* Waits for the end of the run or `expected` operations done (the workers stop themselves
 * at end_us or after --requests), printing the progress line meanwhile. */
static void waitForEnd(struct bench *b, uint64_t expected, bool progress)
{
    uint64_t last_print = bench_now_us();
    uint64_t last_done = 0;
    while (bench_now_us() < b->end_us) {
        if (expected != 0 && atomic_load_explicit(&b->done, memory_order_relaxed) >= expected) {
            break;
        }
        sleepUntilUs(bench_now_us() + 50000u);
        uint64_t now = bench_now_us();
        if (progress && now - last_print >= 1000000u) {
            last_done = report_progress(b, now, last_print, last_done);
            last_print = now;
        }
    }
}

int threads_run(struct bench *b, struct worker *ws, unsigned n, uint64_t expected,
                bool progress, unsigned *running)
{
    bench_run_times(b, bench_now_us());
    bench_probe_start(b);
    *running = 0;
    for (unsigned i = 0; i < n; i++) {
        ws[i].started = pthread_create(&ws[i].thread, NULL, workerRun, &ws[i]) == 0;
        if (!ws[i].started) {
            bench_error("could not start thread %u; running with %u", i + 1, *running);
            break;
        }
        (*running)++;
    }
    if (*running == 0) {
        return EXIT_SETUP;
    }
    waitForEnd(b, expected, progress);
    atomic_store(&b->stop, true);
    for (unsigned i = 0; i < *running; i++) {
        pthread_join(ws[i].thread, NULL);
    }
    return EXIT_RAN;
}
