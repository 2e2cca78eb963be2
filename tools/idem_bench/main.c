/* idem-bench: load generator for an idemd cluster over libidem, closed or open loop.
 *
 * Closed loop (default, --concurrency C): C operations in flight at all times, the next one
 * sent as soon as one is answered, i.e. what C synchronous callers would do. It runs on the
 * open loop's engine (loop.c: one thread, a libuv loop, --connections asynchronous clients),
 * so that the load generator leaves the cores to the cluster it measures. Latency is
 * measured from send to answer. With --threads the closed loop runs as before instead: C
 * threads, each with its own synchronous client (what a thread-per-request service sees,
 * and the generator's own threads compete for the CPU).
 *
 * Open loop (--rate R): operation i is *scheduled* at start + i/R seconds, whether or not
 * earlier ones were answered. One thread runs a libuv loop with --connections asynchronous
 * clients (default 1; each pipelines its requests over one connection to the leader, used
 * round robin); a 1 ms timer sends every operation that is due while fewer than C
 * (--concurrency, default 1024 here: an operation in flight costs a slot of memory, not a
 * thread, and a lower cap turns every stall of the cluster into lag of the generator)
 * are in flight, and an answer that frees a slot sends
 * the next due one at once. (The load generator must not compete for the CPU with the
 * cluster it measures: earlier, C threads with a synchronous client each did, and their
 * scheduling showed up as latency.) Before the schedule starts, each client makes one
 * call (a get) so that its connection to the leader is up. Latency is
 * measured from the scheduled time, not from the actual send, so that a stall of the
 * cluster shows up in the latency of every operation that should have been sent during it
 * (no "coordinated omission"); when C operations are in flight the next ones fall behind
 * schedule and that wait counts (so does the timer's granularity, up to about 1 ms). The
 * service time (send to answer) is reported next to it, and so is the largest lag of a
 * send behind its schedule: a lag that grows means R is more than the cluster (or C in
 * flight) can sustain. After --duration, a grace of 1 s (or one --deadline if shorter)
 * follows. Operations scheduled before the end that are still unsent then are sent during
 * its first half; any left after it are reported as "unsent", never silently dropped, and
 * count in the latency with their wait from the scheduled time to the end. In every mode
 * the run ends with the grace: each call's deadline is cut so that it ends by then at the
 * latest (a call without an answer by then is an error, timed like the others; a complete
 * or release due with less than 1 ms left is not sent, and its operation is an error), so
 * --duration bounds the run whatever the cluster does. The first call (probe, below)
 * and the replay workload's setup come before the run and are bounded by --deadline.
 *
 * Workloads:
 *   fresh           claim a new key every time: expected outcome acquired.
 *   replay          claim one of --keys keys (default 64) completed during setup, with its
 *                   fingerprint: expected replay (the stored response).
 *   claim-complete  (alias mixed) claim a new key, then complete it (200, "ok"): expected
 *                   acquired then ok; the pair counts as one operation and one latency
 *                   sample.
 *   contention      claim one of --keys keys (default 8) with its fingerprint and a fresh
 *                   attempt id: acquired (then released at once, expected ok, the pair one
 *                   operation) or in_progress (another operation holds it) are both expected;
 *                   the split is printed with the other outcomes.
 * Keys are "bench-<run id>-...", the run id random, so that reruns against the same cluster
 * never collide; fresh keys get a random 32-byte fingerprint.
 *
 * Latencies (µs) go into per-worker log-linear histograms (tools/hist.h), merged at the
 * end. Errors are operations that got an unexpected outcome, or no answer at all
 * (transport: the client's own retries ran out of deadline); they are counted, and timed
 * like the others. The run ends after --duration seconds or --requests operations,
 * whichever comes first.
 *
 * --stall-probe runs tools/stallprobe.c beside the run: a thread per CPU at SCHED_FIFO
 * priority 1 (when allowed) that wakes every millisecond and counts how late, so that a tail
 * can be told apart from time the machine itself (a hypervisor) kept every thread off the
 * CPUs. Its totals go in the summary, and with --timeline the longest hold of each interval.
 *
 * Output: a summary, the percentiles p50/p90/p99/p99.9/max (of every operation sent, failed
 * ones included), the outcome counts and an ASCII distribution of the latencies; --json
 * prints one object instead (and when the run cannot be made, {"outcome", "error"} as
 * idemctl does). While it runs, a progress line is written once per second to stderr when
 * stderr is a terminal, with ops (the expected outcome) and errors counted as the summary
 * counts them.
 * Exit status: 0 it ran; 2 usage error; 3 nothing could be reached (the probe before the
 * run got no answer, or not one operation was answered); 1 setup failed otherwise.
 *
 * This file: the run from setup to exit status, its times and the calls' deadlines; bench.h
 * lists the other files of tools/idem_bench/. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

/* ---- times --------------------------------------------------------------------------- */

uint64_t bench_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void bench_run_times(struct bench *b, uint64_t start_us)
{
    uint32_t grace_ms = b->cfg.deadline_ms < END_GRACE_MS ? b->cfg.deadline_ms : END_GRACE_MS;
    b->start_us = start_us;
    b->end_us = start_us + (uint64_t)b->cfg.duration_s * 1000000u;
    b->last_us = b->end_us + (uint64_t)grace_ms * 1000u;
    b->send_until_us = b->end_us + (uint64_t)grace_ms * 500u;
}

uint32_t bench_call_deadline(const struct bench *b)
{
    if (b->last_us == 0) {
        return b->cfg.deadline_ms;
    }
    uint64_t now = bench_now_us();
    uint64_t left_ms = now < b->last_us ? (b->last_us - now) / 1000u : 0;
    if (left_ms < 1) {
        left_ms = 1;
    }
    return left_ms < b->cfg.deadline_ms ? (uint32_t)left_ms : b->cfg.deadline_ms;
}

bool bench_follow_up_fits(const struct bench *b)
{
    return b->last_us == 0 || bench_now_us() + 1000u <= b->last_us;
}

uint64_t bench_expected(const struct config *cfg)
{
    if (cfg->rate == 0) {
        return cfg->requests;
    }
    uint64_t scheduled = cfg->rate * cfg->duration_s;
    return cfg->requests == 0 || scheduled < cfg->requests ? scheduled : cfg->requests;
}

void bench_probe_start(struct bench *b)
{
    if (!b->cfg.stall_probe) {
        return;
    }
    char err[256];
    /* --timeline rows take the longest hold since the previous row as they close. */
    if (stallprobe_start(&b->probe, err, sizeof err) != 0) {
        fprintf(stderr, "idem-bench: --stall-probe: %s; running without it\n", err);
        b->probe = NULL;
    }
}

/* ---- failures before the results ----------------------------------------------------- */

/* Why the run could not be made (the first failure reported by bench_error). */
static char failWhy[512];

void bench_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "idem-bench: %s\n", msg);
    if (failWhy[0] == '\0') {
        snprintf(failWhy, sizeof failWhy, "%s", msg);
    }
}

/* The exit status of a run that ended before its results; with --json also prints
 * {"outcome": "unavailable" (status 3), "usage" (2) or "error" (1), "error": why} on stdout,
 * as idemctl does, so that a script always gets an object. */
static int benchExit(bool json, int code)
{
    if (json) {
        if (failWhy[0] == '\0') {
            snprintf(failWhy, sizeof failWhy, "setup failed");
        }
        cli_json_outcome(code == EXIT_UNAVAILABLE ? "unavailable"
                         : code == EXIT_USAGE     ? "usage"
                                                  : "error",
                         failWhy);
    }
    return code;
}

/* ---- setup --------------------------------------------------------------------------- */

int bench_client_open(const struct config *cfg, struct idem_client **c, char *why,
                      size_t why_len)
{
    struct idem_options o = {0};
    o.seeds = cfg->cluster;
    o.token = cfg->token;
    cli_tls_options(&cfg->tls, &o);
    return idem_client_open(&o, c, why, why_len);
}

/* Asks the cluster once before the run (a get of a key nobody has) so that an unreachable
 * cluster or a refused token ends the run at once with a clear message. */
static int probe(struct bench *b, struct idem_client *c)
{
    char key[96];
    snprintf(key, sizeof key, "bench-%s-probe", b->run_id);
    Idem__GetRequest gr = IDEM__GET_REQUEST__INIT;
    gr.key.data = (uint8_t *)key;
    gr.key.len = strlen(key);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &gr;
    Idem__Response *resp = NULL;
    int rv = idem_call(c, &req, b->cfg.deadline_ms, &resp);
    if (rv != IDEM_OK) {
        bench_error("cluster unreachable: %s",
                    rv == IDEM_EUNAVAILABLE ? idem_client_errmsg(c) : idem_strerror(rv));
        return EXIT_UNAVAILABLE;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    int code = EXIT_RAN;
    if (o == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED || o == IDEM__OUTCOME__OUTCOME_FORBIDDEN) {
        bench_error("the cluster refused the token: %s%s%s", idem_outcome_name((int)o),
                    resp->error[0] ? ": " : "", resp->error);
        code = EXIT_USAGE;
    }
    idem__response__free_unpacked(resp, NULL);
    return code;
}

/* The run's state with a new run id, or NULL when out of memory. */
static struct bench *benchNew(void)
{
    struct bench *b = calloc(1, sizeof *b);
    if (b == NULL) {
        return NULL;
    }
    uint64_t run_seed = workload_seed();
    snprintf(b->run_id, sizeof b->run_id, "%016" PRIx64, workload_rng_next(&run_seed));
    atomic_init(&b->tickets, 0);
    atomic_init(&b->done, 0);
    atomic_init(&b->succeeded, 0);
    atomic_init(&b->failed, 0);
    atomic_init(&b->max_lag, 0);
    atomic_init(&b->stop, false);
    return b;
}

static void benchFree(struct bench *b)
{
    free(b->set);
    free(b->timeline);
    stallprobe_free(b->probe);
    free(b);
}

/* Before the run, over one synchronous client: the check of the cluster (probe) and the
 * key set of replay and contention. EXIT_RAN, or the exit status of the failure. */
static int prepare(struct bench *b)
{
    struct idem_client *c = NULL;
    char why[256];
    int rv = bench_client_open(&b->cfg, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        bench_error("%s: %s", idem_strerror(rv), why);
        return rv == IDEM_EINVAL || rv == IDEM_ETLS ? EXIT_USAGE : EXIT_SETUP;
    }
    int code = probe(b, c);
    if (code == EXIT_RAN && bench_uses_key_set(&b->cfg)) {
        code = workload_setup_set(b, c);
    }
    idem_client_close(c);
    return code;
}

/* ---- the run ------------------------------------------------------------------------- */

/* Runs the workers ws[0..n) (one on the loop, or n threads); *running (OUT) is how many
 * ran. On failure the probe is stopped. */
static int runWorkers(struct bench *b, struct worker *ws, unsigned n, bool progress,
                      unsigned *running)
{
    for (unsigned i = 0; i < n; i++) {
        ws[i].b = b;
        ws[i].index = i;
        ws[i].rng = workload_seed();
        hist_init(&ws[i].hist);
        hist_init(&ws[i].service);
    }
    if (b->cfg.rate != 0 || !b->cfg.threads) {
        *running = 1;
        return loop_run(b, &ws[0], progress);
    }
    int code = threads_run(b, ws, n, bench_expected(&b->cfg), progress, running);
    if (code != EXIT_RAN && b->probe != NULL) {
        stallprobe_stop(b->probe, &b->probe_stats);
    }
    return code;
}

/* Merges the workers' results, prints them and returns the exit status: EXIT_UNAVAILABLE
 * when not one call was answered. */
static int finish(struct bench *b, const struct worker *ws, unsigned running, uint64_t t_end)
{
    struct totals t = {0};
    t.lat = malloc(sizeof *t.lat);
    t.svc = malloc(sizeof *t.svc);
    if (t.lat == NULL || t.svc == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        exit(EXIT_SETUP);
    }
    hist_init(t.lat);
    hist_init(t.svc);
    bool on_loop = b->cfg.rate != 0 || !b->cfg.threads;
    t.threads = on_loop ? b->cfg.concurrency : running;
    t.elapsed_s = t_end > b->start_us ? (double)(t_end - b->start_us) / 1e6 : 0;
    for (unsigned i = 0; i < running; i++) {
        report_merge(&t, &ws[i]);
    }
    if (b->cfg.rate) {
        /* Operations scheduled before the end but not sent yet (the run fell behind) are
         * still sent, for at most one call deadline more; what is left then is unsent. */
        uint64_t expected = bench_expected(&b->cfg);
        t.unsent = expected > t.ops + t.errors ? expected - t.ops - t.errors : 0;
    }
    report_print(b, &t);
    if (t.first_error != NULL) {
        fprintf(stderr, "idem-bench: first error: %s\n", t.first_error);
    }
    int code = (t.answered == 0 && t.transport > 0) ? EXIT_UNAVAILABLE : EXIT_RAN;
    if (code == EXIT_UNAVAILABLE) {
        fputs("idem-bench: not one call was answered\n", stderr);
    }
    free(t.lat);
    free(t.svc);
    return code;
}

int main(int argc, char **argv)
{
    cli_set_prog("idem-bench");
    struct bench *b = benchNew();
    if (b == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        return EXIT_SETUP;
    }
    options_parse(argc, argv, &b->cfg);
    const bool json = b->cfg.json;
    int code = prepare(b);
    if (code != EXIT_RAN) {
        benchFree(b);
        return benchExit(json, code);
    }
    /* The loop: one worker's counters, filled by the loop on this thread. */
    unsigned n = b->cfg.rate != 0 || !b->cfg.threads ? 1 : b->cfg.concurrency;
    struct worker *ws = calloc(n, sizeof *ws);
    if (ws == NULL) {
        bench_error("out of memory");
        benchFree(b);
        return benchExit(json, EXIT_SETUP);
    }
    bool progress = isatty(STDERR_FILENO) == 1;
    unsigned running = 0;
    code = runWorkers(b, ws, n, progress, &running);
    if (code != EXIT_RAN) {
        free(ws);
        benchFree(b);
        return benchExit(json, code);
    }
    uint64_t t_end = bench_now_us();
    if (b->probe != NULL) {
        stallprobe_stop(b->probe, &b->probe_stats);
    }
    if (progress) {
        fputs("\n", stderr);
    }
    code = finish(b, ws, running, t_end);
    free(ws);
    benchFree(b);
    return code;
}
