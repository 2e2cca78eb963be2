/* idem-bench: load generator for an idemd cluster over libidem, closed or open loop.
 *
 * Closed loop (default, --concurrency C): C threads, each with its own client (a client is
 * not thread-safe), each sending one operation at a time and the next as soon as the
 * answer arrives. Latency is measured from send to answer; throughput is what the cluster
 * gives C synchronous callers.
 *
 * Open loop (--rate R): operation i is *scheduled* at start + i/R seconds, whether or not
 * earlier ones were answered. C threads (--concurrency, default 64 here) take the next
 * scheduled operation, wait for its time if it is still ahead, and send it. Latency is
 * measured from the scheduled time, not from the actual send, so that a stall of the
 * cluster shows up in the latency of every operation that should have been sent during it
 * (no "coordinated omission"); when every thread is busy the operations fall behind
 * schedule and that wait counts. The service time (send to answer) is reported next to it,
 * and so is the largest lag of a send behind its schedule: a lag that grows means R is
 * more than the cluster (or C threads) can sustain. Operations scheduled before the end
 * that are still unsent when --duration passes are sent afterwards, for at most one
 * --deadline more; any left then are reported as "unsent", never silently dropped.
 *
 * Workloads:
 *   fresh           claim a new key every time: expected outcome acquired.
 *   replay          claim one of --keys keys (default 64) completed during setup, with its
 *                   fingerprint: expected replay (the stored response).
 *   claim-complete  claim a new key, then complete it (200, "ok"): expected acquired then
 *                   ok; the pair counts as one operation and one latency sample.
 *   contention      claim one of --keys keys (default 8) with its fingerprint and a fresh
 *                   attempt id: acquired (then released at once, expected ok, the pair one
 *                   operation) or in_progress (another thread holds it) are both expected;
 *                   the split is printed with the other outcomes.
 * Keys are "bench-<run id>-...", the run id random, so that reruns against the same cluster
 * never collide; fresh keys get a random 32-byte fingerprint.
 *
 * Latencies (µs) of successful operations go into per-thread log-linear histograms
 * (tools/hist.h), merged at the end. Errors are operations that got an unexpected outcome,
 * or no answer at all (transport: the client's own retries ran out of deadline); they are
 * counted, not timed. The run ends after --duration seconds or --requests operations,
 * whichever comes first.
 *
 * Output: a summary, the percentiles p50/p90/p99/p99.9/max (of every operation sent, failed
 * ones included), the outcome counts and an ASCII distribution of the latencies; --json prints one object instead. While it runs, a
 * progress line is written once per second to stderr when stderr is a terminal.
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

#include "cli.h"
#include "hist.h"
#include "idem_rpc.h"

#define EXIT_RAN 0
#define EXIT_SETUP 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3

#define DEFAULT_REPLAY_KEYS 64
#define DEFAULT_CONTENTION_KEYS 8
#define MAX_KEYS 100000
#define MAX_CONCURRENCY 1024
#define MAX_DURATION_S 3600
#define MAX_RATE 10000000
#define DEFAULT_DEADLINE_MS 5000u
#define DEFAULT_CLOSED_CONCURRENCY 8
#define DEFAULT_OPEN_CONCURRENCY 64

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
    unsigned keys;     /* replay and contention key set */
    enum workload workload;
    bool json;
    bool no_histogram;
    uint32_t deadline_ms;
    struct cli_tls tls;
};

static const char usageText[] =
    "Usage: idem-bench --cluster H:P,... --token T\n"
    "                  --workload fresh|replay|claim-complete|contention\n"
    "                  [--concurrency N | --rate R [--concurrency N]] [--keys N]\n"
    "                  [--duration SECONDS] [--requests N] [--deadline MS]\n"
    "                  [--no-histogram] [--json]\n"
    "                  [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "                  [--tls-server-name NAME]\n"
    "\n"
    "  --cluster H:P,...   RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T           tenant bearer token (env IDEM_TOKEN)\n"
    "  --workload W        fresh: claim a new key each time (expects acquired);\n"
    "                      replay: claim one of --keys pre-completed keys (expects replay);\n"
    "                      claim-complete: claim then complete a new key (one op per pair);\n"
    "                      contention: claim one of --keys keys with a fresh attempt id\n"
    "                      (expects acquired, then releases it, or in_progress)\n"
    "  --concurrency N     closed loop (the default mode): N threads, one client and one\n"
    "                      request in flight each (default 8). With --rate: the most\n"
    "                      operations in flight at once (default 64). At most 1024.\n"
    "  --rate R            open loop: schedule R operations per second whatever the answers;\n"
    "                      latency counts from each operation's scheduled time\n"
    "                      (latency figures include failed operations, in every mode)\n"
    "  --keys N            key set of replay (default 64) and contention (default 8),\n"
    "                      1..100000\n"
    "  --duration SECONDS  how long to run (default 10, at most 3600)\n"
    "  --requests N        stop after N operations (default: no limit)\n"
    "  --deadline MS       deadline of each call, retries included (default 5000)\n"
    "  --no-histogram      leave the ASCII latency distribution out of the text output\n"
    "  --json              print one JSON object: mode, workload, ops, ops_per_sec, errors,\n"
    "                      p50_ms, p90_ms, p99_ms, p999_ms, max_ms, outcomes, histogram\n"
    "                      (every non-empty bucket as [lo_us, hi_us, count]) and more\n"
    "  --help              print this help and exit\n"
    "TLS (nodes with tls.rpc: true):\n" CLI_TLS_HELP
    "\n"
    "A progress line is printed to stderr once per second when stderr is a terminal.\n"
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
    cfg->keys = 0;
    cfg->json = false;
    cfg->no_histogram = false;
    cfg->deadline_ms = DEFAULT_DEADLINE_MS;
    cli_tls_from_env(&cfg->tls);
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
        } else if (strcmp(arg, "--no-histogram") == 0) {
            cfg->no_histogram = true;
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
        } else if (optValue(argc, argv, &i, "--keys", &v)) {
            cfg->keys = (unsigned)cli_parse_u64("--keys", v, 1, MAX_KEYS);
        } else if (optValue(argc, argv, &i, "--duration", &v)) {
            cfg->duration_s = (unsigned)cli_parse_u64("--duration", v, 1, MAX_DURATION_S);
        } else if (optValue(argc, argv, &i, "--requests", &v)) {
            cfg->requests = cli_parse_u64("--requests", v, 1, UINT64_MAX / 2);
        } else if (optValue(argc, argv, &i, "--deadline", &v)) {
            cfg->deadline_ms = (uint32_t)cli_parse_u64("--deadline", v, 1, 600000);
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
    uint64_t end_us;
    atomic_uint_fast64_t tickets; /* operations started (closed) or scheduled (open) */
    atomic_uint_fast64_t done;    /* operations finished, for progress */
    atomic_uint_fast64_t failed;  /* of those, errors, for progress */
    atomic_uint_fast64_t max_lag; /* open loop: largest send lag behind schedule, µs */
    atomic_bool stop;
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
    *rv = idem_call(c, &req, deadline_ms, &resp);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "claim: %s: %s", idem_strerror(*rv), idem_client_errmsg(c));
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
    *rv = idem_call(c, &req, deadline_ms, &resp);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "complete: %s: %s", idem_strerror(*rv), idem_client_errmsg(c));
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
    *rv = idem_call(c, &req, deadline_ms, &resp);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "release: %s: %s", idem_strerror(*rv), idem_client_errmsg(c));
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
    uint32_t dl = b->cfg.deadline_ms;
    char key[96], attempt[48], err[256];
    uint8_t fp[32];
    uint64_t token = 0;
    int rv = IDEM_OK;
    Idem__Outcome o;
    if (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION) {
        const struct set_key *sk = &b->set[rngNext(&w->rng) % b->cfg.keys];
        snprintf(attempt, sizeof attempt, "r%u-%" PRIu64 "-%016" PRIx64, w->index, w->seq++,
                 rngNext(&w->rng));
        o = doClaim(c, dl, sk->key, sk->fp, attempt, &token, &rv, err, sizeof err);
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
        o = doRelease(c, dl, sk->key, token, &rv, err, sizeof err);
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
    o = doClaim(c, dl, key, fp, attempt, &token, &rv, err, sizeof err);
    countCall(w, rv);
    w->outcomes[outcomeSlot(rv, o)]++;
    if (o != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
        noteError(w, "%s", err);
        return false;
    }
    if (b->cfg.workload == WL_FRESH) {
        return true;
    }
    o = doComplete(c, dl, key, token, &rv, err, sizeof err);
    countCall(w, rv);
    if (o != IDEM__OUTCOME__OUTCOME_OK) {
        noteError(w, "%s", err);
        return false;
    }
    return true;
}

/* Takes the next operation. Closed loop: returns false once --requests were started or
 * the run is over; *sched_us (OUT) is 0. Open loop: the operation's scheduled time in
 * *sched_us, false when it falls after the end of the run or beyond --requests. */
static bool nextTicket(struct bench *b, uint64_t *sched_us)
{
    *sched_us = 0;
    if (atomic_load_explicit(&b->stop, memory_order_relaxed)) {
        return false;
    }
    if (b->cfg.rate == 0) {
        if (nowUs() >= b->end_us) {
            return false;
        }
        return b->cfg.requests == 0 ||
               atomic_fetch_add_explicit(&b->tickets, 1, memory_order_relaxed) < b->cfg.requests;
    }
    uint64_t i = atomic_fetch_add_explicit(&b->tickets, 1, memory_order_relaxed);
    if (b->cfg.requests != 0 && i >= b->cfg.requests) {
        return false;
    }
    /* i / rate seconds after the start, in µs, without overflow for any i we can reach. */
    uint64_t off = i / b->cfg.rate * 1000000u + (i % b->cfg.rate) * 1000000u / b->cfg.rate;
    *sched_us = b->start_us + off;
    return *sched_us < b->end_us;
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
    uint64_t sched;
    while (nextTicket(b, &sched)) {
        if (sched != 0 && nowUs() < sched) {
            sleepUntilUs(sched);
        }
        uint64_t t0 = nowUs();
        if (sched != 0 && t0 > sched) {
            uint64_t lag = t0 - sched;
            uint64_t seen = atomic_load_explicit(&b->max_lag, memory_order_relaxed);
            while (lag > seen && !atomic_compare_exchange_weak_explicit(
                                     &b->max_lag, &seen, lag, memory_order_relaxed,
                                     memory_order_relaxed)) {
            }
        }
        bool ok = workerOp(w, c);
        uint64_t t1 = nowUs();
        /* Every operation sent counts in the latency figures, failed ones too: a request
         * that timed out during a failover waited its whole deadline, and leaving it out
         * would make the tail look better than what callers saw. */
        hist_record(&w->hist, t1 - (sched != 0 ? sched : t0));
        if (sched != 0) {
            hist_record(&w->service, t1 - t0);
        }
        if (ok) {
            w->ops++;
        } else {
            w->errors++;
            atomic_fetch_add_explicit(&b->failed, 1, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&b->done, 1, memory_order_relaxed);
    }
    idem_client_close(c);
    return NULL;
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
        fprintf(stderr, "idem-bench: cluster unreachable: %s\n",
                rv == IDEM_EUNAVAILABLE ? idem_client_errmsg(c) : idem_strerror(rv));
        return EXIT_UNAVAILABLE;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    int code = EXIT_RAN;
    if (o == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED || o == IDEM__OUTCOME__OUTCOME_FORBIDDEN) {
        fprintf(stderr, "idem-bench: the cluster refused the token: %s%s%s\n",
                idem_outcome_name((int)o), resp->error[0] ? ": " : "", resp->error);
        code = EXIT_USAGE;
    }
    idem__response__free_unpacked(resp, NULL);
    return code;
}

/* replay and contention: makes the key set; for replay also claims and completes every key
 * so that the run replays it. */
static int setupSet(struct bench *b, struct idem_client *c)
{
    uint64_t rng = seedFromRandom();
    char err[256], attempt[48];
    b->set = calloc(b->cfg.keys, sizeof *b->set);
    if (b->set == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        return EXIT_SETUP;
    }
    for (unsigned i = 0; i < b->cfg.keys; i++) {
        struct set_key *sk = &b->set[i];
        snprintf(sk->key, sizeof sk->key, "bench-%s-%s-%u", b->run_id,
                 b->cfg.workload == WL_REPLAY ? "replay" : "hot", i);
        randomFill(&rng, sk->fp, sizeof sk->fp);
        if (b->cfg.workload != WL_REPLAY) {
            continue;
        }
        snprintf(attempt, sizeof attempt, "setup-%u", i);
        uint64_t token = 0;
        int rv;
        Idem__Outcome o = doClaim(c, b->cfg.deadline_ms, sk->key, sk->fp, attempt, &token, &rv,
                                  err, sizeof err);
        if (o == IDEM__OUTCOME__OUTCOME_ACQUIRED) {
            o = doComplete(c, b->cfg.deadline_ms, sk->key, token, &rv, err, sizeof err);
        }
        if (o != IDEM__OUTCOME__OUTCOME_OK) {
            fprintf(stderr, "idem-bench: replay setup, key %u of %u: %s\n", i + 1, b->cfg.keys,
                    err);
            return rv == IDEM_EUNAVAILABLE ? EXIT_UNAVAILABLE : EXIT_SETUP;
        }
    }
    return EXIT_RAN;
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
        printf("mode         open loop, target %" PRIu64 " ops/s, at most %u in flight\n",
               b->cfg.rate, t->threads);
    } else {
        printf("mode         closed loop, concurrency %u\n", t->threads);
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
        printf("unsent       %" PRIu64 " (scheduled, but the run ended first)\n", t->unsent);
        printf("max lag      %.3f ms behind schedule\n",
               ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
    if (!b->cfg.no_histogram) {
        printf("distribution (latency ms, count, share, cumulative):\n");
        hist_print_ascii(stdout, h, 1000.0, "ms", 50);
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
    uint64_t run_seed = seedFromRandom();
    snprintf(b->run_id, sizeof b->run_id, "%016" PRIx64, rngNext(&run_seed));
    atomic_init(&b->tickets, 0);
    atomic_init(&b->done, 0);
    atomic_init(&b->failed, 0);
    atomic_init(&b->max_lag, 0);
    atomic_init(&b->stop, false);

    struct idem_client *c = NULL;
    char why[256];
    int rv = clientOpen(&b->cfg, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        fprintf(stderr, "idem-bench: %s: %s\n", idem_strerror(rv), why);
        free(b);
        return rv == IDEM_EINVAL || rv == IDEM_ETLS ? EXIT_USAGE : EXIT_SETUP;
    }
    int code = probe(b, c);
    if (code == EXIT_RAN && (b->cfg.workload == WL_REPLAY || b->cfg.workload == WL_CONTENTION)) {
        code = setupSet(b, c);
    }
    idem_client_close(c);
    if (code != EXIT_RAN) {
        free(b->set);
        free(b);
        return code;
    }

    unsigned n = b->cfg.concurrency;
    struct worker *ws = calloc(n, sizeof *ws);
    if (ws == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        free(b->set);
        free(b);
        return EXIT_SETUP;
    }
    bool progress = isatty(STDERR_FILENO) == 1;
    /* Open loop: the schedule starts a little ahead so that every thread is up by then. */
    b->start_us = nowUs() + (b->cfg.rate ? 20000u : 0u);
    b->end_us = b->start_us + (uint64_t)b->cfg.duration_s * 1000000u;
    unsigned running = 0;
    for (unsigned i = 0; i < n; i++) {
        ws[i].b = b;
        ws[i].index = i;
        ws[i].rng = seedFromRandom();
        hist_init(&ws[i].hist);
        hist_init(&ws[i].service);
        ws[i].started = pthread_create(&ws[i].thread, NULL, workerRun, &ws[i]) == 0;
        if (!ws[i].started) {
            fprintf(stderr, "idem-bench: could not start thread %u; running with %u\n", i + 1,
                    running);
            break;
        }
        running++;
    }
    if (running == 0) {
        free(ws);
        free(b->set);
        free(b);
        return EXIT_SETUP;
    }
    /* The workers stop themselves at end_us or after --requests; progress meanwhile. */
    uint64_t last_print = nowUs();
    uint64_t last_done = 0;
    /* Open loop: operations scheduled before the end but not sent yet (the run fell
     * behind) are still sent, for at most one call deadline more; what is left then is
     * reported as unsent. */
    uint64_t expected = b->cfg.requests;
    uint64_t until = b->end_us;
    if (b->cfg.rate) {
        uint64_t scheduled = b->cfg.rate * b->cfg.duration_s;
        expected = expected == 0 || scheduled < expected ? scheduled : expected;
        until += (uint64_t)b->cfg.deadline_ms * 1000u;
    }
    while (nowUs() < until) {
        if (expected != 0 && atomic_load_explicit(&b->done, memory_order_relaxed) >= expected) {
            break;
        }
        sleepUntilUs(nowUs() + 50000u);
        uint64_t now = nowUs();
        if (progress && now - last_print >= 1000000u) {
            uint64_t d = atomic_load_explicit(&b->done, memory_order_relaxed);
            uint64_t f = atomic_load_explicit(&b->failed, memory_order_relaxed);
            double el = now > b->start_us ? (double)(now - b->start_us) / 1e6 : 0;
            fprintf(stderr, "\r[%4.0fs] %" PRIu64 " ops, %.0f ops/s, %" PRIu64 " errors", el, d,
                    (double)(d - last_done) * 1e6 / (double)(now - last_print), f);
            if (b->cfg.rate) {
                fprintf(stderr, ", max lag %.1f ms",
                        ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
            }
            fputs("   ", stderr);
            last_print = now;
            last_done = d;
        }
    }
    atomic_store(&b->stop, true);
    for (unsigned i = 0; i < running; i++) {
        pthread_join(ws[i].thread, NULL);
    }
    uint64_t t_end = nowUs();
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
    t.threads = running;
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
    free(b);
    return code;
}
