/* idem-bench: load generator for an idemd cluster over libidem, closed or open loop.
 *
 * Closed loop (default, --concurrency C): C operations in flight at all times, the next one
 * sent as soon as one is answered, i.e. what C synchronous callers would do. It runs on the
 * open loop's engine below (one thread, a libuv loop, --connections asynchronous clients),
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
 * --duration bounds the run whatever the cluster does. The first call (below)
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
 * run got no answer, or not one operation was answered); 1 setup failed otherwise. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/rand.h>
#include <uv.h>

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

/* ---- configuration ------------------------------------------------------------------- */

enum workload { WL_FRESH, WL_REPLAY, WL_CLAIM_COMPLETE, WL_CONTENTION };

static const char *const workloadNames[] = {"fresh", "replay", "claim-complete", "contention"};

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

static const char usageText[] =
    "Usage: idem-bench --cluster H:P,... --token T\n"
    "                  --workload fresh|replay|claim-complete|contention\n"
    "                  [--concurrency N [--threads] | --rate R [--concurrency N]]\n"
    "                  [--connections N]\n"
    "                  [--keys N]\n"
    "                  [--duration SECONDS] [--requests N] [--deadline MS]\n"
    "                  [--no-histogram] [--timeline MS] [--stall-probe] [--json]\n"
    "                  [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "                  [--tls-server-name NAME]\n"
    "\n"
    "  --cluster H:P,...   RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T           tenant bearer token (env IDEM_TOKEN)\n"
    "  --workload W        fresh: claim a new key each time (expects acquired);\n"
    "                      replay: claim one of --keys pre-completed keys (expects replay);\n"
    "                      claim-complete (or mixed): claim then complete a new key (one\n"
    "                      op per pair);\n"
    "                      contention: claim one of --keys keys with a fresh attempt id\n"
    "                      (expects acquired, then releases it, or in_progress)\n"
    "  --concurrency N     closed loop (the default mode): N operations in flight, the next\n"
    "                      sent when one is answered (default 8), from one thread. With\n"
    "                      --rate: the most operations in flight at once (default 1024).\n"
    "                      At most 1024.\n"
    "  --threads           closed loop on N threads, each with its own synchronous client\n"
    "  --rate R            open loop: schedule R operations per second whatever the answers;\n"
    "                      latency counts from each operation's scheduled time\n"
    "                      (latency figures include failed operations, in every mode);\n"
    "                      sent from one thread (libuv loop, asynchronous clients)\n"
    "  --connections N     asynchronous clients, each one pipelined connection\n"
    "                      to the leader, used round robin (default 1, at most 64)\n"
    "  --keys N            key set of replay (default 64) and contention (default 8),\n"
    "                      1..100000\n"
    "  --duration SECONDS  how long to run (default 10, at most 3600); then the calls in\n"
    "                      flight get at most 1 s more, or one --deadline if shorter (with\n"
    "                      --rate, the operations due but unsent are sent in its first\n"
    "                      half): a call without an answer by then is an error (as is\n"
    "                      a complete or release due with under 1 ms left: not sent), so\n"
    "                      the run ends by then\n"
    "  --requests N        stop after N operations (default: no limit)\n"
    "  --deadline MS       deadline of each call, retries included (default 5000); also\n"
    "                      bounds the first call, which checks the cluster, and each call of\n"
    "                      the replay workload's setup (before the run, not timed: --keys\n"
    "                      keys claimed and completed, 16 at a time)\n"
    "  --no-histogram      leave the ASCII latency distribution out of the text output\n"
    "  --timeline MS       also report latency per MS milliseconds of the run (operations\n"
    "                      counted in the interval they end in): ops, p50, p99, max;\n"
    "                      shows when a tail happened. 10..60000; not with --threads\n"
    "  --stall-probe       also measure how long the machine held this process's threads\n"
    "                      off its CPUs during the run: a thread per CPU, at SCHED_FIFO\n"
    "                      priority 1 when allowed (root or CAP_SYS_NICE), wakes every\n"
    "                      1 ms; a wake-up 1 ms or more late is a hold (a hypervisor that\n"
    "                      descheduled the virtual CPU, or, without the priority, other\n"
    "                      threads). Reports the holds per CPU, the longest, and with\n"
    "                      --timeline the longest in each interval\n"
    "  --json              print one JSON object: mode, workload, ops, ops_per_sec, errors,\n"
    "                      p50_ms, p90_ms, p99_ms, p999_ms, max_ms, outcomes, histogram\n"
    "                      (every non-empty bucket as [lo_us, hi_us, count]) and more\n"
    "  --help              print this help and exit\n"
    "TLS (nodes with tls.rpc: true):\n" CLI_TLS_HELP "\n"
    "A progress line is printed to stderr once per second when stderr is a terminal: ops\n"
    "and ops/s as the summary counts them (the expected outcome), errors apart; with --rate\n"
    "also the largest lag of a send behind its schedule.\n"
    "Exit status: 0 it ran, 2 usage error (also: a TLS file that cannot be loaded), 3\n"
    "nothing could be reached (also: every node's certificate refused by --tls-ca), 1 setup\n"
    "failed.\n";

/* Matches "--name value" or "--name=value" at argv[*i]; consumes it. */
static bool optValue(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) {
        return false;
    }
    if (arg[n] == '=') {
        *val = arg + n + 1;
        (*i)++;
        return true;
    }
    if (arg[n] != '\0') {
        return false;
    }
    if (*i + 1 >= argc) {
        cli_usage_error("option %s needs a value", name);
    }
    *val = argv[*i + 1];
    *i += 2;
    return true;
}

/* The options that take a value (the next argument, unless given as --name=value). */
static const char *const valueOptions[] = {
    "--cluster",  "--token",    "--concurrency", "--rate",     "--connections", "--keys",
    "--duration", "--requests", "--deadline",    "--timeline", "--workload"};

/* Whether --json is given as an option: not as another option's value (--token --json). */
static bool jsonAsked(int argc, char **argv)
{
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--json") == 0) {
            return true;
        }
        bool value = cli_tls_takes_value(argv[k]);
        for (size_t o = 0; !value && o < sizeof valueOptions / sizeof valueOptions[0]; o++) {
            value = strcmp(argv[k], valueOptions[o]) == 0;
        }
        if (value) {
            k++; /* its value */
        }
    }
    return false;
}

static const char *envOrNull(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

static void parseArgs(int argc, char **argv, struct config *cfg)
{
    const char *workload = NULL;
    bool concurrency_set = false;
    cfg->cluster = envOrNull("IDEM_CLUSTER");
    cfg->token = envOrNull("IDEM_TOKEN");
    cfg->concurrency = DEFAULT_CLOSED_CONCURRENCY;
    cfg->duration_s = 10;
    cfg->requests = 0;
    cfg->rate = 0;
    cfg->connections = 0;
    cfg->keys = 0;
    cfg->json = false;
    cfg->no_histogram = false;
    cfg->deadline_ms = DEFAULT_DEADLINE_MS;
    cli_tls_from_env(&cfg->tls);
    /* --json anywhere: usage errors found before it is reached print JSON too. */
    cli_set_json(jsonAsked(argc, argv));
    int i = 1;
    while (i < argc) {
        const char *v;
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usageText, stdout);
            exit(EXIT_RAN);
        } else if (strcmp(arg, "--json") == 0) {
            cfg->json = true;
            i++;
        } else if (strcmp(arg, "--threads") == 0) {
            cfg->threads = true;
            i++;
        } else if (strcmp(arg, "--no-histogram") == 0) {
            cfg->no_histogram = true;
            i++;
        } else if (strcmp(arg, "--stall-probe") == 0) {
            cfg->stall_probe = true;
            i++;
        } else if (optValue(argc, argv, &i, "--cluster", &v)) {
            cfg->cluster = v;
        } else if (optValue(argc, argv, &i, "--token", &v)) {
            cfg->token = v;
        } else if (optValue(argc, argv, &i, "--concurrency", &v)) {
            cfg->concurrency = (unsigned)cli_parse_u64("--concurrency", v, 1, MAX_CONCURRENCY);
            concurrency_set = true;
        } else if (optValue(argc, argv, &i, "--rate", &v)) {
            cfg->rate = cli_parse_u64("--rate", v, 1, MAX_RATE);
        } else if (optValue(argc, argv, &i, "--connections", &v)) {
            cfg->connections =
                (unsigned)cli_parse_u64("--connections", v, 1, MAX_CONNECTIONS);
        } else if (optValue(argc, argv, &i, "--keys", &v)) {
            cfg->keys = (unsigned)cli_parse_u64("--keys", v, 1, MAX_KEYS);
        } else if (optValue(argc, argv, &i, "--duration", &v)) {
            cfg->duration_s = (unsigned)cli_parse_u64("--duration", v, 1, MAX_DURATION_S);
        } else if (optValue(argc, argv, &i, "--requests", &v)) {
            cfg->requests = cli_parse_u64("--requests", v, 1, UINT64_MAX / 2);
        } else if (optValue(argc, argv, &i, "--deadline", &v)) {
            cfg->deadline_ms = (uint32_t)cli_parse_u64("--deadline", v, 1, 600000);
        } else if (optValue(argc, argv, &i, "--timeline", &v)) {
            cfg->timeline_ms = (unsigned)cli_parse_u64("--timeline", v, 10, 60000);
        } else if (optValue(argc, argv, &i, "--workload", &v)) {
            workload = v;
        } else if (cli_tls_flag(&cfg->tls, argc, argv, &i)) {
            continue;
        } else if (arg[0] == '-') {
            cli_usage_error("unknown option %s", arg);
        } else {
            cli_usage_error("unexpected argument \"%s\"", arg);
        }
    }
    if (workload == NULL) {
        cli_usage_error("missing --workload fresh|replay|claim-complete|contention");
    }
    bool found = false;
    for (size_t w = 0; w < sizeof workloadNames / sizeof workloadNames[0]; w++) {
        if (strcmp(workload, workloadNames[w]) == 0) {
            cfg->workload = (enum workload)w;
            found = true;
        }
    }
    if (strcmp(workload, "mixed") == 0) { /* the name the workload has in the docs' list */
        cfg->workload = WL_CLAIM_COMPLETE;
        found = true;
    }
    if (!found) {
        cli_usage_error("--workload must be fresh, replay, claim-complete or contention, "
                        "got \"%s\"",
                        workload);
    }
    if (cfg->keys != 0 && cfg->workload != WL_REPLAY && cfg->workload != WL_CONTENTION) {
        cli_usage_error("--keys applies to the replay and contention workloads only");
    }
    if (cfg->keys == 0) {
        cfg->keys = cfg->workload == WL_CONTENTION ? DEFAULT_CONTENTION_KEYS : DEFAULT_REPLAY_KEYS;
    }
    if (cfg->rate != 0 && !concurrency_set) {
        cfg->concurrency = DEFAULT_OPEN_CONCURRENCY;
    }
    if (cfg->threads && cfg->rate != 0) {
        cli_usage_error("--threads applies to the closed loop only (not with --rate)");
    }
    if (cfg->timeline_ms != 0 && cfg->threads) {
        cli_usage_error("--timeline does not apply with --threads");
    }
    if (cfg->connections != 0 && cfg->threads) {
        cli_usage_error("--connections does not apply with --threads (one client per thread)");
    }
    if (cfg->connections == 0) {
        cfg->connections = DEFAULT_CONNECTIONS;
    }
    if (cfg->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    char why[160];
    if (idem_seeds_check(cfg->cluster, why, sizeof why) != IDEM_OK) {
        cli_usage_error("bad --cluster: %s", why);
    }
    if (cfg->token == NULL) {
        cli_usage_error("no token: pass --token T or set IDEM_TOKEN");
    }
    if ((cfg->tls.cert_file == NULL) != (cfg->tls.key_file == NULL)) {
        cli_usage_error("--tls-cert and --tls-key go together");
    }
}

/* Why the run could not be made (the first failure reported by benchError). */
static char failWhy[512];

/* Reports a failure that ends the run before its results: "idem-bench: MESSAGE" on stderr;
 * the first one is kept for benchExit. */
static void benchError(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void benchError(const char *fmt, ...)
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

/* A client of the cluster with the run's token and TLS options; why (OUT) on failure. */
static int clientOpen(const struct config *cfg, struct idem_client **c, char *why,
                      size_t why_len)
{
    struct idem_options o = {0};
    o.seeds = cfg->cluster;
    o.token = cfg->token;
    cli_tls_options(&cfg->tls, &o);
    return idem_client_open(&o, c, why, why_len);
}

/* ---- the run ------------------------------------------------------------------------- */

/* A key of the replay or contention set. */
struct set_key {
    char key[96];
    uint8_t fp[32];
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

/* --timeline: what one interval of the run saw. */
struct tl_row {
    uint64_t end_ms; /* since the start of the run */
    uint64_t ops;    /* operations that ended in it, failed ones included */
    uint64_t p50_us, p99_us, max_us;
    uint64_t held_max_us; /* --stall-probe: the CPUs' longest hold that ended in it */
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

static uint64_t nowUs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
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

/* Sets the run's start, its end (--duration later) and its bound (the grace after it). */
static void runTimes(struct bench *b, uint64_t start_us)
{
    uint32_t grace_ms = b->cfg.deadline_ms < END_GRACE_MS ? b->cfg.deadline_ms : END_GRACE_MS;
    b->start_us = start_us;
    b->end_us = start_us + (uint64_t)b->cfg.duration_s * 1000000u;
    b->last_us = b->end_us + (uint64_t)grace_ms * 1000u;
    b->send_until_us = b->end_us + (uint64_t)grace_ms * 500u;
}

/* The deadline of a call made now: --deadline, cut so that the call ends by the run's
 * bound (at least 1 ms); --deadline before the run starts. */
static uint32_t callDeadline(const struct bench *b)
{
    if (b->last_us == 0) {
        return b->cfg.deadline_ms;
    }
    uint64_t now = nowUs();
    uint64_t left_ms = now < b->last_us ? (b->last_us - now) / 1000u : 0;
    if (left_ms < 1) {
        left_ms = 1;
    }
    return left_ms < b->cfg.deadline_ms ? (uint32_t)left_ms : b->cfg.deadline_ms;
}

/* Whether a complete or release can still follow its claim: not with less than 1 ms left
 * of the run's bound, when it would go out with callDeadline's 1 ms floor and could be
 * applied on the node while counted here as an error. */
static bool followUpFits(const struct bench *b)
{
    return b->last_us == 0 || nowUs() + 1000u <= b->last_us;
}

#define CUT_OFF "not sent: the claim was answered with less than 1 ms left of the run's bound"

static uint64_t rngNext(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void randomFill(uint64_t *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = rngNext(s);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(out + i, &r, k);
    }
}

static uint64_t seedFromRandom(void)
{
    uint64_t s;
    if (RAND_bytes((unsigned char *)&s, (int)sizeof s) != 1) {
        s = nowUs() ^ ((uint64_t)getpid() << 40);
    }
    return s;
}

static void noteError(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void noteError(struct worker *w, const char *fmt, ...)
{
    if (w->first_error[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first_error, sizeof w->first_error, fmt, ap);
    va_end(ap);
}

static size_t outcomeSlot(int rv, Idem__Outcome o)
{
    if (rv != IDEM_OK) {
        return OUTC_NONE;
    }
    return (unsigned)o < OUTC_OTHER ? (size_t)o : OUTC_OTHER;
}
/* One claim. Returns the outcome, or UNSPECIFIED with *rv set when there was no answer.
 * *token (OUT) gets the fencing token when acquired. */
static Idem__Outcome doClaim(struct idem_client *c, uint32_t deadline_ms, const char *key,
                             const uint8_t fp[32], const char *attempt, uint64_t *token,
                             int *rv, char *err, size_t errlen)
{
    Idem__ClaimRequest cr = IDEM__CLAIM_REQUEST__INIT;
    cr.key.data = (uint8_t *)key;
    cr.key.len = strlen(key);
    cr.fingerprint.data = (uint8_t *)fp;
    cr.fingerprint.len = 32;
    cr.attempt_id.data = (uint8_t *)attempt;
    cr.attempt_id.len = strlen(attempt);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_CLAIM;
    req.claim = &cr;
    Idem__Response *resp = NULL;
    char why[512];
    *rv = idem_call_why(c, &req, deadline_ms, &resp, why, sizeof why);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "claim: %s: %s", idem_strerror(*rv), why);
        return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    if (o == IDEM__OUTCOME__OUTCOME_ACQUIRED && token != NULL) {
        *token = resp->result->token;
    }
    snprintf(err, errlen, "claim: %s%s%s", idem_outcome_name((int)o),
             resp->error[0] ? ": " : "", resp->error);
    idem__response__free_unpacked(resp, NULL);
    return o;
}

static Idem__Outcome doComplete(struct idem_client *c, uint32_t deadline_ms, const char *key,
                                uint64_t token, int *rv, char *err, size_t errlen)
{
    static const char body[] = "ok";
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    sr.status = 200;
    sr.body.data = (uint8_t *)body;
    sr.body.len = sizeof body - 1;
    Idem__CompleteRequest cr = IDEM__COMPLETE_REQUEST__INIT;
    cr.key.data = (uint8_t *)key;
    cr.key.len = strlen(key);
    cr.token = token;
    cr.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    cr.response = &sr;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_COMPLETE;
    req.complete = &cr;
    Idem__Response *resp = NULL;
    char why[512];
    *rv = idem_call_why(c, &req, deadline_ms, &resp, why, sizeof why);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "complete: %s: %s", idem_strerror(*rv), why);
        return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    snprintf(err, errlen, "complete: %s%s%s", idem_outcome_name((int)o),
             resp->error[0] ? ": " : "", resp->error);
    idem__response__free_unpacked(resp, NULL);
    return o;
}

static Idem__Outcome doRelease(struct idem_client *c, uint32_t deadline_ms, const char *key,
                               uint64_t token, int *rv, char *err, size_t errlen)
{
    Idem__ReleaseRequest rr = IDEM__RELEASE_REQUEST__INIT;
    rr.key.data = (uint8_t *)key;
    rr.key.len = strlen(key);
    rr.token = token;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RELEASE;
    req.release = &rr;
    Idem__Response *resp = NULL;
    char why[512];
    *rv = idem_call_why(c, &req, deadline_ms, &resp, why, sizeof why);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "release: %s: %s", idem_strerror(*rv), why);
        return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    snprintf(err, errlen, "release: %s%s%s", idem_outcome_name((int)o),
             resp->error[0] ? ": " : "", resp->error);
    idem__response__free_unpacked(resp, NULL);
    return o;
}

/* Counts a call: answered or not. */
static void countCall(struct worker *w, int rv)
{
    if (rv == IDEM_OK) {
        w->answered++;
    } else {
        w->transport++;
    }
}

/* Runs one operation of the workload; returns true when every call got an expected
 * outcome. Counts answers, transport failures and the first call's outcome. */
static bool workerOp(struct worker *w, struct idem_client *c)
{
    struct bench *b = w->b;
    char key[96], attempt[48], err[600];
    uint8_t fp[32];
    uint64_t token = 0;
    int rv = IDEM_OK;
    Idem__Outcome o;
    if (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION) {
        const struct set_key *sk = &b->set[rngNext(&w->rng) % b->cfg.keys];
        snprintf(attempt, sizeof attempt, "r%u-%" PRIu64 "-%016" PRIx64, w->index, w->seq++,
                 rngNext(&w->rng));
        o = doClaim(c, callDeadline(b), sk->key, sk->fp, attempt, &token, &rv, err, sizeof err);
        countCall(w, rv);
        w->outcomes[outcomeSlot(rv, o)]++;
        if (b->cfg.workload == WL_REPLAY) {
            if (o != IDEM__OUTCOME__OUTCOME_REPLAY) {
                noteError(w, "%s", err);
                return false;
            }
            return true;
        }
        if (o == IDEM__OUTCOME__OUTCOME_IN_PROGRESS) {
            return true;
        }
        if (o != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
            noteError(w, "%s", err);
            return false;
        }
        if (!followUpFits(b)) {
            noteError(w, "release: " CUT_OFF);
            return false;
        }
        o = doRelease(c, callDeadline(b), sk->key, token, &rv, err, sizeof err);
        countCall(w, rv);
        if (o != IDEM__OUTCOME__OUTCOME_OK) {
            noteError(w, "%s", err);
            return false;
        }
        return true;
    }
    uint64_t n = w->seq++;
    snprintf(key, sizeof key, "bench-%s-%u-%" PRIu64, b->run_id, w->index, n);
    snprintf(attempt, sizeof attempt, "a%u-%" PRIu64, w->index, n);
    randomFill(&w->rng, fp, sizeof fp);
    o = doClaim(c, callDeadline(b), key, fp, attempt, &token, &rv, err, sizeof err);
    countCall(w, rv);
    w->outcomes[outcomeSlot(rv, o)]++;
    if (o != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
        noteError(w, "%s", err);
        return false;
    }
    if (b->cfg.workload == WL_FRESH) {
        return true;
    }
    if (!followUpFits(b)) {
        noteError(w, "complete: " CUT_OFF);
        return false;
    }
    o = doComplete(c, callDeadline(b), key, token, &rv, err, sizeof err);
    countCall(w, rv);
    if (o != IDEM__OUTCOME__OUTCOME_OK) {
        noteError(w, "%s", err);
        return false;
    }
    return true;
}

/* Closed loop: takes the next operation; false once --requests were started or the run is
 * over. */
static bool nextTicket(struct bench *b)
{
    if (atomic_load_explicit(&b->stop, memory_order_relaxed) || nowUs() >= b->end_us) {
        return false;
    }
    return b->cfg.requests == 0 ||
           atomic_fetch_add_explicit(&b->tickets, 1, memory_order_relaxed) < b->cfg.requests;
}

/* Open loop: the scheduled time of operation i, i / rate seconds after the start, in µs,
 * without overflow for any i we can reach. */
static uint64_t schedUs(const struct bench *b, uint64_t i)
{
    uint64_t r = b->cfg.rate;
    return b->start_us + i / r * 1000000u + (i % r) * 1000000u / r;
}

static void *workerRun(void *arg)
{
    struct worker *w = arg;
    struct bench *b = w->b;
    struct idem_client *c = NULL;
    char why[256];
    int rv = clientOpen(&b->cfg, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        noteError(w, "client: %s: %s", idem_strerror(rv), why);
        w->errors++;
        return NULL;
    }
    while (nextTicket(b)) {
        uint64_t t0 = nowUs();
        bool ok = workerOp(w, c);
        /* Every operation sent counts in the latency figures, failed ones too: a request
         * that timed out during a failover waited its whole deadline, and leaving it out
         * would make the tail look better than what callers saw. */
        hist_record(&w->hist, nowUs() - t0);
        if (ok) {
            w->ops++;
            atomic_fetch_add_explicit(&b->succeeded, 1, memory_order_relaxed);
        } else {
            w->errors++;
            atomic_fetch_add_explicit(&b->failed, 1, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&b->done, 1, memory_order_relaxed);
    }
    idem_client_close(c);
    return NULL;
}

/* ---- open loop: one thread, one libuv loop, asynchronous clients ------------------------ */

/* The open loop sends from a single thread: a libuv loop with --connections asynchronous
 * clients (each pipelines its requests over one connection to the leader), used round
 * robin. A 1 ms timer sends every operation that is due (scheduled at or before now) while
 * fewer than --concurrency are in flight; an answer that frees a slot sends the next due
 * operation at once. So the generator adds no runnable threads of its own next to the
 * cluster it measures: what it reports is the cluster's, not the scheduler's. */

#define OPEN_TICK_MS 1

struct open_loop;

/* One operation in flight; a pool of --concurrency of them. */
struct open_op {
    struct open_loop *L;
    struct idem_async *a; /* the client it went out on (the pair's second call too) */
    struct open_op *next_free;
    const struct set_key *sk; /* replay, contention: the key; else NULL (own key below) */
    uint64_t sched_us;
    uint64_t sent_us;
    uint64_t token;
    char key[96];
};

struct open_loop {
    struct bench *b;
    uv_loop_t loop;
    uv_timer_t tick;
    uv_timer_t progress;
    bool progress_on;
    struct idem_async **conns;
    unsigned nconns;
    unsigned rr;
    unsigned closing; /* clients whose close has not finished */
    struct open_op *ops;
    struct open_op *free_ops;
    unsigned inflight;
    unsigned warming; /* warm-up calls not answered yet */
    bool started;     /* the schedule runs */
    bool finishing;   /* no more sends; close once nothing is in flight */
    bool closed;      /* the clients and timers are closing */
    bool pumping;     /* openPump is running (an operation refused at once re-enters) */
    uint64_t next;     /* the next operation to send */
    uint64_t expected; /* operations scheduled in all */
    /* progress: when it was last printed, and the ops (succeeded) then */
    uint64_t last_print, last_done;
    struct worker w; /* the counters and histograms, as one closed-loop worker's */
    uv_timer_t timeline; /* --timeline: closes an interval */
    struct hist tl_hist; /* the interval's latencies */
};

static void openPump(struct open_loop *L);
static double ms(uint64_t us);

/* Ends the current --timeline interval: its row is appended (even when empty, so that a
 * stall shows as rows without operations). */
static void timelineRoll(struct open_loop *L)
{
    struct bench *b = L->b;
    if (b->n_timeline == b->cap_timeline) {
        size_t cap = b->cap_timeline ? b->cap_timeline * 2 : 64;
        struct tl_row *rows = realloc(b->timeline, cap * sizeof *rows);
        if (rows == NULL) {
            return; /* the timeline stops growing; the run goes on */
        }
        b->timeline = rows;
        b->cap_timeline = cap;
    }
    const struct hist *h = &L->tl_hist;
    uint64_t now = nowUs();
    b->timeline[b->n_timeline++] = (struct tl_row){
        .end_ms = now > b->start_us ? (now - b->start_us + 500) / 1000 : 0,
        .ops = h->total,
        .p50_us = hist_percentile(h, 50),
        .p99_us = hist_percentile(h, 99),
        .max_us = h->total ? h->max : 0,
    };
    if (b->probe != NULL) {
        struct stallprobe_window win;
        stallprobe_take(b->probe, &win);
        b->timeline[b->n_timeline - 1].held_max_us = win.max_us;
    }
    hist_init(&L->tl_hist);
}

static void timelineCb(uv_timer_t *t)
{
    timelineRoll(t->data);
}

static void openCloseCb(struct idem_async *a, void *data)
{
    (void)a;
    struct open_loop *L = data;
    L->closing--;
}

/* Stops the timers and closes the clients; the loop ends when they are closed. */
static void openFinish(struct open_loop *L)
{
    L->finishing = true;
    if (L->closed || L->inflight > 0 || L->warming > 0) {
        return; /* every call ends by its deadline; the last one comes back here */
    }
    L->closed = true;
    if (L->started && L->b->cfg.rate != 0) {
        /* Operations scheduled but never sent (the run fell behind and the extra deadline
         * ran out) waited at least from their scheduled time until now: they count in the
         * latency with that wait, as well as in `unsent`, so that a run that stalls
         * cannot show a better tail than one that answered late. */
        uint64_t now = nowUs();
        for (uint64_t i = L->next; i < L->expected; i++) {
            uint64_t sched = schedUs(L->b, i);
            if (sched > now) {
                break;
            }
            hist_record(&L->w.hist, now - sched);
            if (L->b->cfg.timeline_ms != 0) {
                hist_record(&L->tl_hist, now - sched);
            }
        }
    }
    uv_timer_stop(&L->tick);
    uv_timer_stop(&L->progress);
    if (L->b->cfg.timeline_ms != 0 && L->started) {
        uv_timer_stop(&L->timeline);
        if (L->tl_hist.total > 0) {
            timelineRoll(L); /* the last, partial interval */
        }
    }
    uv_close((uv_handle_t *)&L->timeline, NULL);
    L->closing = L->nconns;
    for (unsigned i = 0; i < L->nconns; i++) {
        idem_async_close(L->conns[i], openCloseCb, L);
    }
    uv_close((uv_handle_t *)&L->tick, NULL);
    uv_close((uv_handle_t *)&L->progress, NULL);
}

/* An operation ended (ok: every call got its expected outcome): it is timed and its slot
 * freed. */
static void openDone(struct open_op *op, bool ok)
{
    struct open_loop *L = op->L;
    struct worker *w = &L->w;
    uint64_t t1 = nowUs();
    /* As in the closed loop, failed operations count in the latency too. */
    hist_record(&w->hist, t1 - op->sched_us);
    hist_record(&w->service, t1 - op->sent_us);
    if (L->b->cfg.timeline_ms != 0) {
        hist_record(&L->tl_hist, t1 - op->sched_us);
    }
    if (ok) {
        w->ops++;
        atomic_fetch_add_explicit(&L->b->succeeded, 1, memory_order_relaxed);
    } else {
        w->errors++;
        atomic_fetch_add_explicit(&L->b->failed, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&L->b->done, 1, memory_order_relaxed);
    op->next_free = L->free_ops;
    L->free_ops = op;
    L->inflight--;
    if (L->finishing) {
        openFinish(L);
    } else {
        openPump(L);
    }
}

/* Counts one call's end; on anything but `want` notes the first error and returns false. */
static bool openCall(struct open_op *op, const char *what, int status,
                     const struct idem_result *r, int want, bool first)
{
    struct worker *w = &op->L->w;
    countCall(w, status);
    if (first) {
        w->outcomes[outcomeSlot(status, status == IDEM_OK ? (Idem__Outcome)r->outcome
                                                          : IDEM__OUTCOME__OUTCOME_UNSPECIFIED)]++;
    }
    if (status != IDEM_OK) {
        noteError(w, "%s: %s: %s", what, idem_strerror(status), r->detail);
        return false;
    }
    if (r->outcome != want) {
        noteError(w, "%s: %s%s%s", what, idem_outcome_name(r->outcome),
                  r->detail[0] ? ": " : "", r->detail);
        return false;
    }
    return true;
}

static void openSecondCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    (void)a;
    struct open_op *op = data;
    const char *what = op->L->b->cfg.workload == WL_CONTENTION ? "release" : "complete";
    openDone(op, openCall(op, what, status, r, IDEM_OUTCOME_OK, false));
}

static void openClaimCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    struct open_op *op = data;
    struct open_loop *L = op->L;
    enum workload wl = L->b->cfg.workload;
    uint32_t dl = callDeadline(L->b);
    if (wl == WL_CONTENTION && status == IDEM_OK && r->outcome == IDEM_OUTCOME_IN_PROGRESS) {
        openCall(op, "claim", status, r, IDEM_OUTCOME_IN_PROGRESS, true);
        openDone(op, true);
        return;
    }
    int want = wl == WL_REPLAY ? IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_ACQUIRED;
    if (!openCall(op, "claim", status, r, want, true)) {
        openDone(op, false);
        return;
    }
    if (wl == WL_REPLAY || wl == WL_FRESH) {
        openDone(op, true);
        return;
    }
    op->token = r->token;
    const char *key = op->sk != NULL ? op->sk->key : op->key;
    if (!followUpFits(L->b)) {
        noteError(&L->w, "%s: " CUT_OFF, wl == WL_CLAIM_COMPLETE ? "complete" : "release");
        openDone(op, false);
        return;
    }
    int rv;
    if (wl == WL_CLAIM_COMPLETE) {
        static const uint8_t body[] = "ok";
        struct idem_response resp = {.status = 200, .body = body, .body_len = 2};
        rv = idem_async_complete(a, key, op->token, IDEM_COMPLETION_SUCCEEDED, &resp, dl,
                                 openSecondCb, op);
    } else {
        rv = idem_async_release(a, key, op->token, dl, openSecondCb, op);
    }
    if (rv != IDEM_OK) {
        countCall(&L->w, rv);
        noteError(&L->w, "%s: %s", wl == WL_CLAIM_COMPLETE ? "complete" : "release",
                  idem_strerror(rv));
        openDone(op, false);
    }
}

/* Sends operation L->next (due now) on the next client. */
static void openSend(struct open_loop *L, uint64_t sched, uint64_t now)
{
    struct bench *b = L->b;
    struct worker *w = &L->w;
    struct open_op *op = L->free_ops;
    L->free_ops = op->next_free;
    uint64_t i = L->next++;
    op->a = L->conns[L->rr++ % L->nconns];
    op->sched_us = sched;
    op->sent_us = now;
    op->token = 0;
    if (now - sched > atomic_load_explicit(&b->max_lag, memory_order_relaxed)) {
        atomic_store_explicit(&b->max_lag, now - sched, memory_order_relaxed);
    }
    char attempt[48];
    uint8_t fpbuf[32];
    const uint8_t *fp;
    const char *key;
    if (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION) {
        op->sk = &b->set[rngNext(&w->rng) % b->cfg.keys];
        key = op->sk->key;
        fp = op->sk->fp;
        snprintf(attempt, sizeof attempt, "r-%" PRIu64 "-%016" PRIx64, i, rngNext(&w->rng));
    } else {
        op->sk = NULL;
        snprintf(op->key, sizeof op->key, "bench-%s-o-%" PRIu64, b->run_id, i);
        snprintf(attempt, sizeof attempt, "a-%" PRIu64, i);
        randomFill(&w->rng, fpbuf, sizeof fpbuf);
        key = op->key;
        fp = fpbuf;
    }
    struct idem_claim_opts co = {.attempt_id = attempt, .deadline_ms = callDeadline(b)};
    L->inflight++;
    int rv = idem_async_claim(op->a, key, fp, &co, openClaimCb, op);
    if (rv != IDEM_OK) {
        countCall(w, rv);
        w->outcomes[OUTC_NONE]++;
        noteError(w, "claim: %s", idem_strerror(rv));
        openDone(op, false);
    }
}

/* Sends every operation that is due while the in-flight cap allows; finishes the run when
 * everything was sent and answered, or when it is over. */
static void openPump(struct open_loop *L)
{
    if (!L->started || L->finishing || L->pumping) {
        return;
    }
    uint64_t now = nowUs();
    bool closed = L->b->cfg.rate == 0;
    /* The closed loop sends nothing after the end; the open loop still sends what was
     * scheduled before it, for half the grace. */
    if (now >= (closed ? L->b->end_us : L->b->send_until_us)) {
        openFinish(L);
        return;
    }
    /* openSend may end an operation at once (a refused request), which calls back here:
     * the guard makes that a no-op, and this loop goes on. */
    L->pumping = true;
    while (L->next < L->expected && L->free_ops != NULL && !L->finishing) {
        uint64_t sched = closed ? now : schedUs(L->b, L->next);
        if (sched > now) {
            break;
        }
        openSend(L, sched, now);
        now = nowUs();
    }
    L->pumping = false;
    if (L->next >= L->expected && L->inflight == 0) {
        openFinish(L);
    }
}

static void openTickCb(uv_timer_t *t)
{
    openPump(t->data);
}

static void openProgressCb(uv_timer_t *t)
{
    struct open_loop *L = t->data;
    struct bench *b = L->b;
    uint64_t now = nowUs();
    /* ops as the summary counts them: the expected outcome; errors apart. */
    uint64_t d = atomic_load_explicit(&b->succeeded, memory_order_relaxed);
    uint64_t f = atomic_load_explicit(&b->failed, memory_order_relaxed);
    double el = now > b->start_us ? (double)(now - b->start_us) / 1e6 : 0;
    fprintf(stderr, "\r[%4.0fs] %" PRIu64 " ops, %.0f ops/s, %" PRIu64 " errors", el, d,
            (double)(d - L->last_done) * 1e6 / (double)(now - L->last_print), f);
    /* The lag behind the schedule: there is one only with --rate (this loop also runs the
     * closed loop without --threads). */
    if (b->cfg.rate != 0) {
        fprintf(stderr, ", max lag %.1f ms",
                ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
    fputs("   ", stderr);
    L->last_print = now;
    L->last_done = d;
}

/* --stall-probe: started with the run; a probe that cannot start is reported, and the run
 * goes on without it. */
static void probeStart(struct bench *b)
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

/* Starts the schedule once every client has its connection to the leader. */
static void openStart(struct open_loop *L)
{
    struct bench *b = L->b;
    L->started = true;
    probeStart(b);
    runTimes(b, nowUs() + 1000u);
    L->last_print = b->start_us;
    uv_timer_start(&L->tick, openTickCb, OPEN_TICK_MS, OPEN_TICK_MS);
    if (L->progress_on) {
        uv_timer_start(&L->progress, openProgressCb, 1000, 1000);
    }
    if (b->cfg.timeline_ms != 0) {
        uv_timer_start(&L->timeline, timelineCb, b->cfg.timeline_ms, b->cfg.timeline_ms);
    }
}

/* The warm-up call of a client (a get of the probe key) came back: its connection to the
 * leader is up (or the call failed, and the run will show why). */
static void openWarmCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    (void)a;
    (void)status;
    (void)r;
    struct open_loop *L = data;
    if (--L->warming == 0) {
        if (L->finishing) {
            openFinish(L);
        } else {
            openStart(L);
        }
    }
}

/* Runs the open loop on this thread; fills w (OUT, initialised by the caller) and returns
 * EXIT_RAN, or EXIT_USAGE / EXIT_SETUP when a client cannot be made. */
static int runOpen(struct bench *b, struct worker *w, bool progress)
{
    struct open_loop *L = calloc(1, sizeof *L);
    int code = EXIT_SETUP;
    if (L == NULL) {
        benchError("out of memory");
        return EXIT_SETUP;
    }
    L->b = b;
    L->w = *w;
    L->progress_on = progress;
    /* Closed loop: as many as the run's time allows, or --requests. */
    uint64_t scheduled = b->cfg.rate ? b->cfg.rate * b->cfg.duration_s : UINT64_MAX;
    L->expected = b->cfg.requests == 0 || scheduled < b->cfg.requests ? scheduled
                                                                        : b->cfg.requests;
    L->ops = calloc(b->cfg.concurrency, sizeof *L->ops);
    L->conns = calloc(b->cfg.connections, sizeof *L->conns);
    if (L->ops == NULL || L->conns == NULL || uv_loop_init(&L->loop) != 0) {
        benchError("out of memory");
        free(L->ops);
        free(L->conns);
        free(L);
        return EXIT_SETUP;
    }
    for (unsigned i = b->cfg.concurrency; i-- > 0;) {
        L->ops[i].L = L;
        L->ops[i].next_free = L->free_ops;
        L->free_ops = &L->ops[i];
    }
    uv_timer_init(&L->loop, &L->tick);
    uv_timer_init(&L->loop, &L->progress);
    uv_timer_init(&L->loop, &L->timeline);
    L->tick.data = L;
    L->progress.data = L;
    L->timeline.data = L;
    hist_init(&L->tl_hist);
    struct idem_options o = {0};
    o.seeds = b->cfg.cluster;
    o.token = b->cfg.token;
    o.default_deadline_ms = b->cfg.deadline_ms;
    cli_tls_options(&b->cfg.tls, &o);
    char why[256], probe_key[96];
    snprintf(probe_key, sizeof probe_key, "bench-%s-probe", b->run_id);
    int rv = IDEM_OK;
    for (unsigned i = 0; i < b->cfg.connections; i++) {
        rv = idem_async_open(&L->loop, &o, &L->conns[i], why, sizeof why);
        if (rv != IDEM_OK) {
            benchError("%s: %s", idem_strerror(rv), why);
            code = rv == IDEM_EINVAL || rv == IDEM_ETLS ? EXIT_USAGE : EXIT_SETUP;
            break;
        }
        L->nconns++;
    }
    if (rv == IDEM_OK) {
        for (unsigned i = 0; i < L->nconns; i++) {
            if (idem_async_get(L->conns[i], probe_key, b->cfg.deadline_ms, openWarmCb, L) ==
                IDEM_OK) {
                L->warming++;
            }
        }
        if (L->warming == 0) {
            openStart(L);
        }
        code = EXIT_RAN;
    } else {
        L->finishing = true;
    }
    if (L->finishing) {
        openFinish(L);
    }
    uv_run(&L->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&L->loop) != 0) {
        fputs("idem-bench: the event loop did not close cleanly\n", stderr);
    }
    if (code == EXIT_RAN) {
        *w = L->w;
        w->b = b;
    }
    free(L->ops);
    free(L->conns);
    free(L);
    return code;
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
        benchError("cluster unreachable: %s",
                rv == IDEM_EUNAVAILABLE ? idem_client_errmsg(c) : idem_strerror(rv));
        return EXIT_UNAVAILABLE;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    int code = EXIT_RAN;
    if (o == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED || o == IDEM__OUTCOME__OUTCOME_FORBIDDEN) {
        benchError("the cluster refused the token: %s%s%s",
                idem_outcome_name((int)o), resp->error[0] ? ": " : "", resp->error);
        code = EXIT_USAGE;
    }
    idem__response__free_unpacked(resp, NULL);
    return code;
}

/* The replay workload's setup: threads that claim and complete the key set together over
 * one (thread-safe) client, each taking the next key. */
#define SETUP_THREADS 16

struct setup {
    struct bench *b;
    struct idem_client *c;
    atomic_uint next;     /* the next key to take */
    atomic_bool failed;   /* one failed: the others stop */
    pthread_mutex_t lock; /* guards code */
    int code;             /* the first failure's exit status, EXIT_RAN while none */
};

static void *setupRun(void *arg)
{
    struct setup *s = arg;
    struct bench *b = s->b;
    char err[600], attempt[48];
    for (;;) {
        unsigned i = atomic_fetch_add(&s->next, 1);
        if (i >= b->cfg.keys || atomic_load(&s->failed)) {
            return NULL;
        }
        const struct set_key *sk = &b->set[i];
        snprintf(attempt, sizeof attempt, "setup-%u", i);
        uint64_t token = 0;
        int rv;
        Idem__Outcome o = doClaim(s->c, b->cfg.deadline_ms, sk->key, sk->fp, attempt, &token,
                                  &rv, err, sizeof err);
        if (o == IDEM__OUTCOME__OUTCOME_ACQUIRED) {
            o = doComplete(s->c, b->cfg.deadline_ms, sk->key, token, &rv, err, sizeof err);
        }
        if (o != IDEM__OUTCOME__OUTCOME_OK) {
            pthread_mutex_lock(&s->lock);
            if (s->code == EXIT_RAN) {
                benchError("replay setup, key %u of %u: %s", i + 1, b->cfg.keys, err);
                s->code = rv == IDEM_EUNAVAILABLE ? EXIT_UNAVAILABLE : EXIT_SETUP;
            }
            pthread_mutex_unlock(&s->lock);
            atomic_store(&s->failed, true);
            return NULL;
        }
    }
}

/* replay and contention: makes the key set; for replay also claims and completes every key
 * (SETUP_THREADS at a time; before the run, not timed, each call bounded by --deadline) so
 * that the run replays it. */
static int setupSet(struct bench *b, struct idem_client *c)
{
    uint64_t rng = seedFromRandom();
    b->set = calloc(b->cfg.keys, sizeof *b->set);
    if (b->set == NULL) {
        benchError("out of memory");
        return EXIT_SETUP;
    }
    for (unsigned i = 0; i < b->cfg.keys; i++) {
        struct set_key *sk = &b->set[i];
        snprintf(sk->key, sizeof sk->key, "bench-%s-%s-%u", b->run_id,
                 b->cfg.workload == WL_REPLAY ? "replay" : "hot", i);
        randomFill(&rng, sk->fp, sizeof sk->fp);
    }
    if (b->cfg.workload != WL_REPLAY) {
        return EXIT_RAN;
    }
    if (isatty(STDERR_FILENO) == 1) {
        fprintf(stderr, "idem-bench: replay setup: claiming and completing %u keys\n",
                b->cfg.keys);
    }
    struct setup s = {.b = b, .c = c, .code = EXIT_RAN};
    atomic_init(&s.next, 0);
    atomic_init(&s.failed, false);
    pthread_mutex_init(&s.lock, NULL);
    unsigned n = b->cfg.keys < SETUP_THREADS ? b->cfg.keys : SETUP_THREADS;
    pthread_t th[SETUP_THREADS];
    unsigned started = 0;
    while (started < n && pthread_create(&th[started], NULL, setupRun, &s) == 0) {
        started++;
    }
    if (started == 0) {
        setupRun(&s); /* no thread: this one does it all */
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
    }
    pthread_mutex_destroy(&s.lock);
    return s.code;
}

static json_t *jnum(double v)
{
    return json_real(v);
}

static void jset(json_t *o, const char *k, json_t *v)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        fputs("idem-bench: out of memory\n", stderr);
        exit(EXIT_SETUP);
    }
}

static void jappend(json_t *a, json_t *v)
{
    if (v == NULL || json_array_append_new(a, v) != 0) {
        fputs("idem-bench: out of memory\n", stderr);
        exit(EXIT_SETUP);
    }
}

/* Rounds to 3 decimals, so that JSON shows 1.234 rather than 1.2339999999999999. */
static double round3(double v)
{
    return (double)(int64_t)(v * 1000.0 + (v >= 0 ? 0.5 : -0.5)) / 1000.0;
}

static const char *outcomeLabel(size_t slot)
{
    if (slot == OUTC_NONE) {
        return "no_answer";
    }
    if (slot == OUTC_OTHER) {
        return "other";
    }
    return idem_outcome_name((int)slot);
}

static double ms(uint64_t us)
{
    return (double)us / 1000.0;
}

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

static void printJson(struct bench *b, const struct totals *t)
{
    const struct hist *h = t->lat;
    json_t *o = json_object();
    if (o == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        exit(EXIT_SETUP);
    }
    double ops_s = t->elapsed_s > 0 ? (double)t->ops / t->elapsed_s : 0;
    jset(o, "mode", json_string(b->cfg.rate ? "open" : "closed"));
    jset(o, "workload", json_string(workloadNames[b->cfg.workload]));
    if (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION) {
        jset(o, "keys", json_integer((json_int_t)b->cfg.keys));
    }
    jset(o, "concurrency", json_integer((json_int_t)t->threads));
    if (b->cfg.rate) {
        jset(o, "target_rate", json_integer((json_int_t)b->cfg.rate));
    }
    jset(o, "threads", json_boolean(b->cfg.threads));
    if (!b->cfg.threads) {
        jset(o, "connections", json_integer((json_int_t)b->cfg.connections));
    }
    jset(o, "ops_per_sec", jnum(round3(ops_s)));
    jset(o, "ops", json_integer((json_int_t)t->ops));
    jset(o, "errors", json_integer((json_int_t)t->errors));
    jset(o, "transport_errors", json_integer((json_int_t)t->transport));
    jset(o, "duration_s", jnum(round3(t->elapsed_s)));
    jset(o, "p50_ms", jnum(round3(ms(hist_percentile(h, 50)))));
    jset(o, "p90_ms", jnum(round3(ms(hist_percentile(h, 90)))));
    jset(o, "p99_ms", jnum(round3(ms(hist_percentile(h, 99)))));
    jset(o, "p999_ms", jnum(round3(ms(hist_percentile(h, 99.9)))));
    jset(o, "max_ms", jnum(round3(ms(h->total ? h->max : 0))));
    jset(o, "mean_ms", jnum(round3(hist_mean(h) / 1000.0)));
    if (b->cfg.rate) {
        jset(o, "service_p50_ms", jnum(round3(ms(hist_percentile(t->svc, 50)))));
        jset(o, "service_p99_ms", jnum(round3(ms(hist_percentile(t->svc, 99)))));
        jset(o, "unsent", json_integer((json_int_t)t->unsent));
        jset(o, "max_lag_ms",
             jnum(round3(ms(atomic_load_explicit(&b->max_lag,
                                                 memory_order_relaxed)))));
    }
    json_t *oc = json_object();
    if (oc == NULL) {
        exit(EXIT_SETUP);
    }
    for (size_t i = 0; i < OUTC_N; i++) {
        if (t->outcomes[i]) {
            jset(oc, outcomeLabel(i), json_integer((json_int_t)t->outcomes[i]));
        }
    }
    jset(o, "outcomes", oc);
    json_t *hb = json_array();
    if (hb == NULL) {
        exit(EXIT_SETUP);
    }
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        if (h->counts[i] == 0) {
            continue;
        }
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        json_t *row = json_array();
        if (row == NULL) {
            exit(EXIT_SETUP);
        }
        jappend(row, json_integer((json_int_t)lo));
        jappend(row, json_integer((json_int_t)hi));
        jappend(row, json_integer((json_int_t)h->counts[i]));
        jappend(hb, row);
    }
    jset(o, "histogram", hb);
    if (b->cfg.timeline_ms != 0) {
        json_t *tl = json_array();
        if (tl == NULL) {
            exit(EXIT_SETUP);
        }
        for (size_t i = 0; i < b->n_timeline; i++) {
            const struct tl_row *r = &b->timeline[i];
            json_t *row = json_object();
            if (row == NULL) {
                exit(EXIT_SETUP);
            }
            jset(row, "end_ms", json_integer((json_int_t)r->end_ms));
            jset(row, "ops", json_integer((json_int_t)r->ops));
            jset(row, "p50_ms", jnum(round3(ms(r->p50_us))));
            jset(row, "p99_ms", jnum(round3(ms(r->p99_us))));
            jset(row, "max_ms", jnum(round3(ms(r->max_us))));
            if (b->probe != NULL) {
                jset(row, "held_max_ms", jnum(round3(ms(r->held_max_us))));
            }
            jappend(tl, row);
        }
        jset(o, "timeline_ms", json_integer((json_int_t)b->cfg.timeline_ms));
        jset(o, "timeline", tl);
    }
    if (b->probe != NULL) {
        const struct stallprobe_stats *ps = &b->probe_stats;
        json_t *sp = json_object();
        if (sp == NULL) {
            exit(EXIT_SETUP);
        }
        jset(sp, "cpus", json_integer((json_int_t)ps->cpus));
        jset(sp, "scheduling", json_string(ps->fifo ? "fifo" : "normal"));
        jset(sp, "period_ms", jnum(STALLPROBE_PERIOD_US / 1000.0));
        jset(sp, "seconds", jnum(round3(ps->seconds)));
        jset(sp, "wakeups", json_integer((json_int_t)ps->wakeups));
        jset(sp, "holds", json_integer((json_int_t)ps->holds));
        jset(sp, "held_ms_per_cpu", jnum(round3(ms(ps->held_us) / ps->cpus)));
        jset(sp, "held_max_ms", jnum(round3(ms(ps->held_max_us))));
        jset(o, "stall_probe", sp);
    }
    jset(o, "run_id", json_string(b->run_id));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12) | JSON_COMPACT);
    if (s == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        exit(EXIT_SETUP);
    }
    puts(s);
    free(s);
    json_decref(o);
}

static void printText(struct bench *b, const struct totals *t)
{
    const struct hist *h = t->lat;
    double ops_s = t->elapsed_s > 0 ? (double)t->ops / t->elapsed_s : 0;
    printf("workload     %s", workloadNames[b->cfg.workload]);
    if (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION) {
        printf(" (%u keys)", b->cfg.keys);
    }
    printf("\n");
    if (b->cfg.rate) {
        printf("mode         open loop, target %" PRIu64 " ops/s, at most %u in flight, "
               "%u connection%s\n",
               b->cfg.rate, t->threads, b->cfg.connections, b->cfg.connections == 1 ? "" : "s");
    } else {
        if (b->cfg.threads) {
            printf("mode         closed loop, %u threads with a synchronous client each\n",
                   t->threads);
        } else {
            printf("mode         closed loop, %u in flight, %u connection%s\n", t->threads,
                   b->cfg.connections, b->cfg.connections == 1 ? "" : "s");
        }
    }
    printf("duration     %.2f s\n", t->elapsed_s);
    printf("ops          %" PRIu64 "\n", t->ops);
    printf("ops/s        %.1f\n", ops_s);
    printf("errors       %" PRIu64 " (no answer: %" PRIu64 ")\n", t->errors, t->transport);
    printf("outcomes    ");
    for (size_t i = 0; i < OUTC_N; i++) {
        if (t->outcomes[i]) {
            printf(" %s %" PRIu64, outcomeLabel(i), t->outcomes[i]);
        }
    }
    printf("\n");
    printf("latency ms   p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f%s\n",
           ms(hist_percentile(h, 50)), ms(hist_percentile(h, 90)), ms(hist_percentile(h, 99)),
           ms(hist_percentile(h, 99.9)), ms(h->total ? h->max : 0), hist_mean(h) / 1000.0,
           b->cfg.rate ? "  (from the scheduled send time)" : "");
    if (b->cfg.rate) {
        printf("service ms   p50 %.3f  p99 %.3f  (send to answer)\n",
               ms(hist_percentile(t->svc, 50)), ms(hist_percentile(t->svc, 99)));
        printf("unsent       %" PRIu64 " (scheduled, but the run ended first; in the latency "
               "with their wait until then)\n",
               t->unsent);
        printf("max lag      %.3f ms behind schedule\n",
               ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
    if (b->probe != NULL) {
        stallprobe_print(stdout, &b->probe_stats);
    }
    if (!b->cfg.no_histogram) {
        printf("distribution (latency ms, count, share, cumulative):\n");
        hist_print_ascii(stdout, h, 1000.0, "ms", 50);
    }
    if (b->cfg.timeline_ms != 0) {
        printf("timeline (every %u ms, by the time operations ended):\n", b->cfg.timeline_ms);
        printf("  %10s %9s %9s %9s %9s%s\n", "until ms", "ops", "p50 ms", "p99 ms", "max ms",
               b->probe != NULL ? "   held ms" : "");
        for (size_t i = 0; i < b->n_timeline; i++) {
            const struct tl_row *r = &b->timeline[i];
            printf("  %10" PRIu64 " %9" PRIu64 " %9.3f %9.3f %9.3f", r->end_ms, r->ops,
                   ms(r->p50_us), ms(r->p99_us), ms(r->max_us));
            if (b->probe != NULL) {
                printf(" %9.3f", ms(r->held_max_us));
            }
            printf("\n");
        }
    }
}

int main(int argc, char **argv)
{
    cli_set_prog("idem-bench");
    struct bench *b = calloc(1, sizeof *b);
    if (b == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        return EXIT_SETUP;
    }
    parseArgs(argc, argv, &b->cfg);
    const bool json = b->cfg.json;
    uint64_t run_seed = seedFromRandom();
    snprintf(b->run_id, sizeof b->run_id, "%016" PRIx64, rngNext(&run_seed));
    atomic_init(&b->tickets, 0);
    atomic_init(&b->done, 0);
    atomic_init(&b->succeeded, 0);
    atomic_init(&b->failed, 0);
    atomic_init(&b->max_lag, 0);
    atomic_init(&b->stop, false);

    struct idem_client *c = NULL;
    char why[256];
    int rv = clientOpen(&b->cfg, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        benchError("%s: %s", idem_strerror(rv), why);
        free(b);
        return benchExit(json, rv == IDEM_EINVAL || rv == IDEM_ETLS ? EXIT_USAGE : EXIT_SETUP);
    }
    int code = probe(b, c);
    if (code == EXIT_RAN && (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION)) {
        code = setupSet(b, c);
    }
    idem_client_close(c);
    if (code != EXIT_RAN) {
        free(b->set);
        free(b);
        return benchExit(json, code);
    }

    /* Open loop: one worker's counters, filled by the loop on this thread. */
    bool on_loop = b->cfg.rate != 0 || !b->cfg.threads;
    unsigned n = on_loop ? 1 : b->cfg.concurrency;
    struct worker *ws = calloc(n, sizeof *ws);
    if (ws == NULL) {
        benchError("out of memory");
        free(b->set);
        free(b);
        return benchExit(json, EXIT_SETUP);
    }
    bool progress = isatty(STDERR_FILENO) == 1;
    for (unsigned i = 0; i < n; i++) {
        ws[i].b = b;
        ws[i].index = i;
        ws[i].rng = seedFromRandom();
        hist_init(&ws[i].hist);
        hist_init(&ws[i].service);
    }
    unsigned running = 0;
    /* Open loop: operations scheduled before the end but not sent yet (the run fell
     * behind) are still sent, for at most one call deadline more; what is left then is
     * reported as unsent. */
    uint64_t expected = b->cfg.requests;
    if (on_loop) {
        if (b->cfg.rate) {
            uint64_t scheduled = b->cfg.rate * b->cfg.duration_s;
            expected = expected == 0 || scheduled < expected ? scheduled : expected;
        }
        code = runOpen(b, &ws[0], progress);
        if (code != EXIT_RAN) {
            free(ws);
            free(b->set);
            free(b);
            return benchExit(json, code);
        }
        running = 1;
    } else {
        runTimes(b, nowUs());
        probeStart(b);
        for (unsigned i = 0; i < n; i++) {
            ws[i].started = pthread_create(&ws[i].thread, NULL, workerRun, &ws[i]) == 0;
            if (!ws[i].started) {
                benchError("could not start thread %u; running with %u", i + 1, running);
                break;
            }
            running++;
        }
        if (running == 0) {
            if (b->probe != NULL) {
                stallprobe_stop(b->probe, &b->probe_stats);
                stallprobe_free(b->probe);
            }
            free(ws);
            free(b->set);
            free(b);
            return benchExit(json, EXIT_SETUP);
        }
        /* The workers stop themselves at end_us or after --requests; progress meanwhile. */
        uint64_t last_print = nowUs();
        uint64_t last_done = 0;
        while (nowUs() < b->end_us) {
            if (expected != 0 &&
                atomic_load_explicit(&b->done, memory_order_relaxed) >= expected) {
                break;
            }
            sleepUntilUs(nowUs() + 50000u);
            uint64_t now = nowUs();
            if (progress && now - last_print >= 1000000u) {
                uint64_t d = atomic_load_explicit(&b->succeeded, memory_order_relaxed);
                uint64_t f = atomic_load_explicit(&b->failed, memory_order_relaxed);
                double el = now > b->start_us ? (double)(now - b->start_us) / 1e6 : 0;
                fprintf(stderr, "\r[%4.0fs] %" PRIu64 " ops, %.0f ops/s, %" PRIu64 " errors   ",
                        el, d, (double)(d - last_done) * 1e6 / (double)(now - last_print), f);
                last_print = now;
                last_done = d;
            }
        }
        atomic_store(&b->stop, true);
        for (unsigned i = 0; i < running; i++) {
            pthread_join(ws[i].thread, NULL);
        }
    }
    uint64_t t_end = nowUs();
    if (b->probe != NULL) {
        stallprobe_stop(b->probe, &b->probe_stats);
    }
    if (progress) {
        fputs("\n", stderr);
    }

    struct totals t = {0};
    t.lat = malloc(sizeof *t.lat);
    t.svc = malloc(sizeof *t.svc);
    if (t.lat == NULL || t.svc == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        return EXIT_SETUP;
    }
    hist_init(t.lat);
    hist_init(t.svc);
    t.threads = on_loop ? b->cfg.concurrency : running;
    t.elapsed_s = t_end > b->start_us ? (double)(t_end - b->start_us) / 1e6 : 0;
    for (unsigned i = 0; i < running; i++) {
        hist_merge(t.lat, &ws[i].hist);
        hist_merge(t.svc, &ws[i].service);
        t.ops += ws[i].ops;
        t.errors += ws[i].errors;
        t.transport += ws[i].transport;
        t.answered += ws[i].answered;
        for (size_t k = 0; k < OUTC_N; k++) {
            t.outcomes[k] += ws[i].outcomes[k];
        }
        if (t.first_error == NULL && ws[i].first_error[0] != '\0') {
            t.first_error = ws[i].first_error;
        }
    }
    if (b->cfg.rate) {
        t.unsent = expected > t.ops + t.errors ? expected - t.ops - t.errors : 0;
    }
    if (b->cfg.json) {
        printJson(b, &t);
    } else {
        printText(b, &t);
    }
    if (t.first_error != NULL) {
        fprintf(stderr, "idem-bench: first error: %s\n", t.first_error);
    }
    code = (t.answered == 0 && t.transport > 0) ? EXIT_UNAVAILABLE : EXIT_RAN;
    if (code == EXIT_UNAVAILABLE) {
        fputs("idem-bench: not one call was answered\n", stderr);
    }
    free(t.lat);
    free(t.svc);
    free(ws);
    free(b->set);
    free(b->timeline);
    stallprobe_free(b->probe);
    free(b);
    return code;
}
