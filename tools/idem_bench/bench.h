/* bench.h: what the files of idem-bench share (private to tools/idem_bench/).
 *
 *   main.c      the run: setup, the choice of loop, the exit status; run times and deadlines
 *   options.c   the command line (--help text, options, their checks)
 *   workload.c  what one operation is: keys, fingerprints, the synchronous calls, the
 *               counters of a worker, the replay workload's setup
 *   loop.c      the engine of the open loop and of the default closed loop: one thread, a
 *               libuv loop, asynchronous clients
 *   threads.c   the closed loop of --threads: a thread with a synchronous client each
 *   report.c    the results: merged totals, the text and JSON output, the progress line
 *
 * main.c's top comment describes the program. */
#ifndef IDEM_TOOLS_BENCH_H
#define IDEM_TOOLS_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "hist.h"
#include "idem_rpc.h"
#include "stallprobe.h"

#define EXIT_RAN 0
#define EXIT_SETUP 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3

#define DEFAULT_REPLAY_KEYS 64
#define DEFAULT_CONTENTION_KEYS 8
#define MAX_KEYS 100000
#define MAX_CONCURRENCY 1024
#define MAX_CONNECTIONS 64
#define MAX_DURATION_S 3600
#define MAX_RATE 10000000
#define DEFAULT_DEADLINE_MS 5000u
#define DEFAULT_CLOSED_CONCURRENCY 8
#define DEFAULT_OPEN_CONCURRENCY 1024
#define DEFAULT_CONNECTIONS 1
/* After --duration, calls in flight (and, in the open loop, operations scheduled before the
 * end but not sent yet) get at most this long, or one --deadline if that is shorter: every
 * call's deadline is cut to it, so that a run ends by then whatever the cluster does. */
#define END_GRACE_MS 1000u

/* Outcome counters: indexes are Idem__Outcome values; OUTC_NONE counts calls with no
 * answer, OUTC_OTHER outcomes this program does not know. */
#define OUTC_N 32
#define OUTC_OTHER 30
#define OUTC_NONE 31

/* The error of a complete or release that bench_follow_up_fits refused. */
#define CUT_OFF "not sent: the claim was answered with less than 1 ms left of the run's bound"

/* ---- configuration ------------------------------------------------------------------- */

enum workload { WL_FRESH, WL_REPLAY, WL_CLAIM_COMPLETE, WL_CONTENTION };

/* The --workload names, by enum workload. */
extern const char *const bench_workload_names[4];

struct config {
    const char *cluster;
    const char *token;
    unsigned concurrency;
    unsigned duration_s;
    uint64_t requests; /* 0: unbounded */
    uint64_t rate;     /* operations per second; 0: closed loop */
    unsigned connections; /* asynchronous clients (connections) on the loop */
    bool threads;         /* closed loop on --concurrency threads with synchronous clients */
    unsigned keys;     /* replay and contention key set */
    enum workload workload;
    bool json;
    bool no_histogram;
    uint32_t deadline_ms;
    unsigned timeline_ms; /* 0: no timeline */
    bool stall_probe;     /* --stall-probe: measure how long the CPUs were held off */
    struct cli_tls tls;
};

/* Parses the command line into *cfg (zeroed by the caller); prints the help and exits 0
 * for --help, exits 2 on a usage error (options.c). */
void options_parse(int argc, char **argv, struct config *cfg);

/* Whether the workload claims keys of a fixed set (replay, contention). */
static inline bool bench_uses_key_set(const struct config *cfg)
{
    return cfg->workload == WL_REPLAY || cfg->workload == WL_CONTENTION;
}

/* ---- the run ------------------------------------------------------------------------- */

/* A key of the replay or contention set. */
struct set_key {
    char key[96];
    uint8_t fp[32];
};

/* --timeline: what one interval of the run saw. */
struct tl_row {
    uint64_t end_ms; /* since the start of the run */
    uint64_t ops;    /* operations that ended in it, failed ones included */
    uint64_t p50_us, p99_us, max_us;
    uint64_t held_max_us; /* --stall-probe: the CPUs' longest hold that ended in it */
};

struct bench {
    struct config cfg;
    char run_id[17];
    struct set_key *set; /* cfg.keys entries for replay and contention, else NULL */
    uint64_t start_us;
    uint64_t end_us;  /* start + --duration; 0 until the run starts */
    uint64_t last_us; /* end_us + the grace (END_GRACE_MS or --deadline): the run's bound */
    uint64_t send_until_us; /* open loop: no operation due before the end is sent after this
                             * (half the grace), so that each one has half the grace or more
                             * to be answered in, not a deadline cut to nothing */
    atomic_uint_fast64_t tickets;   /* operations started (closed) or scheduled (open) */
    atomic_uint_fast64_t done;      /* operations finished, failed ones included (--requests) */
    atomic_uint_fast64_t succeeded; /* of those, the expected outcome: the summary's ops */
    atomic_uint_fast64_t failed;    /* of those, errors: the summary's errors */
    atomic_uint_fast64_t max_lag;   /* open loop: largest send lag behind schedule, µs */
    atomic_bool stop;
    struct tl_row *timeline; /* --timeline: one row per interval, on the loop's thread */
    size_t n_timeline, cap_timeline;
    struct stallprobe *probe; /* --stall-probe: from the run's start (NULL if it failed) */
    struct stallprobe_stats probe_stats;
};

struct worker {
    struct bench *b;
    unsigned index;
    pthread_t thread;
    bool started;
    struct hist hist;    /* latency: closed loop from send, open loop from schedule */
    struct hist service; /* open loop only: send to answer */
    uint64_t ops;        /* expected outcome */
    uint64_t errors;     /* other outcome, or no answer */
    uint64_t transport;  /* of errors: no answer */
    uint64_t answered;   /* calls that got an answer */
    uint64_t outcomes[OUTC_N]; /* the first call of each operation, by outcome */
    uint64_t rng;
    uint64_t seq;
    char first_error[256];
};

/* main.c: the clock, the run's times and the deadlines cut to them. */
uint64_t bench_now_us(void);
/* Sets the run's start, its end (--duration later) and its bound (the grace after it). */
void bench_run_times(struct bench *b, uint64_t start_us);
/* The deadline of a call made now: --deadline, cut so that the call ends by the run's
 * bound (at least 1 ms); --deadline before the run starts. */
uint32_t bench_call_deadline(const struct bench *b);
/* Whether a complete or release can still follow its claim: not with less than 1 ms left
 * of the run's bound, when it would go out with bench_call_deadline's 1 ms floor and could
 * be applied on the node while counted here as an error. */
bool bench_follow_up_fits(const struct bench *b);
/* The operations the run may make: --requests, or with --rate the ones scheduled
 * (rate x duration) when fewer; 0: no limit (closed loop without --requests). */
uint64_t bench_expected(const struct config *cfg);
/* --stall-probe: started with the run; a probe that cannot start is reported, and the run
 * goes on without it. */
void bench_probe_start(struct bench *b);
/* Reports a failure that ends the run before its results: "idem-bench: MESSAGE" on stderr;
 * the first one is kept for the JSON object of the exit. */
void bench_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A client of the cluster with the run's token and TLS options; why (OUT) on failure. */
int bench_client_open(const struct config *cfg, struct idem_client **c, char *why,
                      size_t why_len);

static inline double bench_ms(uint64_t us)
{
    return (double)us / 1000.0;
}

/* ---- workload.c: operations ---------------------------------------------------------- */

/* The names of one operation: its key (one of the set's, or its own), attempt id and
 * fingerprint. */
struct op_names {
    const struct set_key *sk; /* replay, contention: the key; else NULL (own key below) */
    char key[96];
    char attempt[48];
    uint8_t fpbuf[32];
};

static inline const char *workload_key(const struct op_names *n)
{
    return n->sk != NULL ? n->sk->key : n->key;
}

static inline const uint8_t *workload_fp(const struct op_names *n)
{
    return n->sk != NULL ? n->sk->fp : n->fpbuf;
}

/* Names operation n of worker w: a random key of the set (replay, contention) or a new
 * key with a random fingerprint. The closed loop on threads names them after the worker
 * (`open` false), the loop after n alone. */
void workload_name_op(struct worker *w, bool open, uint64_t n, struct op_names *out);

uint64_t workload_rng_next(uint64_t *s);
void workload_random_fill(uint64_t *s, uint8_t *out, size_t n);
/* A random seed (from OpenSSL, else the clock and the pid). */
uint64_t workload_seed(void);

/* Keeps the first error of w (later ones are only counted). */
void workload_note_error(struct worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The outcome counter of a call: its outcome, or OUTC_NONE without an answer. */
size_t workload_outcome_slot(int rv, Idem__Outcome o);
/* Counts a call: answered or not. */
void workload_count_call(struct worker *w, int rv);
/* Counts an operation that ended (ok: every call got its expected outcome) in w and in the
 * run's shared counters (progress, --requests). */
void workload_finish(struct worker *w, bool ok);

/* Runs one operation of the workload on a synchronous client; returns true when every call
 * got an expected outcome. Counts answers, transport failures and the first call's
 * outcome. */
bool workload_op(struct worker *w, struct idem_client *c);

/* replay and contention: makes the key set; for replay also claims and completes every key
 * (before the run, not timed, each call bounded by --deadline) so that the run replays
 * it. EXIT_RAN, or the exit status of the failure (reported). */
int workload_setup_set(struct bench *b, struct idem_client *c);

/* ---- the loops ----------------------------------------------------------------------- */

/* Runs the open loop (or the closed loop without --threads) on this thread; fills w (OUT,
 * initialised by the caller) and returns EXIT_RAN, or EXIT_USAGE / EXIT_SETUP when a client
 * cannot be made (loop.c). */
int loop_run(struct bench *b, struct worker *w, bool progress);

/* Runs the closed loop on n threads (ws[0..n), initialised by the caller) until the end or
 * `expected` operations (0: no limit); *running (OUT) is how many threads ran. EXIT_RAN, or
 * EXIT_SETUP when not one thread started (threads.c). */
int threads_run(struct bench *b, struct worker *ws, unsigned n, uint64_t expected,
                bool progress, unsigned *running);

/* ---- report.c ------------------------------------------------------------------------ */

/* The results of a run, merged over the workers. */
struct totals {
    struct hist *lat;
    struct hist *svc;
    uint64_t ops, errors, transport, answered;
    uint64_t outcomes[OUTC_N];
    const char *first_error;
    uint64_t unsent; /* open loop: scheduled but never sent before the run ended */
    double elapsed_s;
    unsigned threads;
};

/* Adds worker w's counters and histograms to t. */
void report_merge(struct totals *t, const struct worker *w);
/* Prints the results: one JSON object with --json, else the text summary. */
void report_print(struct bench *b, const struct totals *t);
/* The progress line on stderr: ops (the expected outcome) and their rate since last_print
 * (when there were last_done), errors, and with --rate the largest lag. Returns the ops
 * printed (the next call's last_done). */
uint64_t report_progress(struct bench *b, uint64_t now, uint64_t last_print,
                         uint64_t last_done);

#endif
