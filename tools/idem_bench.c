/* idem-bench: closed-loop load generator for an idemd cluster, over libidem.
 *
 * N threads, each with its own client (a client is not thread-safe), each sending one
 * request at a time and the next as soon as the answer arrives, until --duration passes or
 * --requests operations were started. Workloads:
 *   fresh           claim a new key every time: expected outcome acquired.
 *   replay          claim one of 64 keys completed during setup, with its fingerprint:
 *                   expected replay (the stored response).
 *   claim-complete  claim a new key, then complete it (200, "ok"): expected acquired then
 *                   ok; the pair counts as one operation and one latency sample.
 * Keys are "bench-<run id>-<thread>-<n>", the run id random, so that reruns against the
 * same cluster never collide; every key gets a random 32-byte fingerprint.
 *
 * Latencies (µs) of successful operations go into a per-thread log-linear histogram
 * (HdrHistogram's layout: 128 linear sub-buckets per power of two, so that every recorded
 * value is known to within 1/64 of itself), merged at the end. Errors are operations that
 * got another outcome than expected, or no answer at all (transport: the client's own
 * retries ran out of deadline); they are counted, not timed.
 *
 * Output: ops/s, p50, p99, p99.9 and max (ms), errors; --json prints one object.
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
#include "idem_rpc.h"

#define EXIT_RAN 0
#define EXIT_SETUP 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3

#define REPLAY_KEYS 64
#define MAX_CONCURRENCY 1024
#define MAX_DURATION_S 3600
#define DEFAULT_DEADLINE_MS 5000u

/* ---- histogram ----------------------------------------------------------------------- */

/* Values below HIST_SUB are counted exactly; above, each power-of-two range [2^e, 2^(e+1))
 * is split into HIST_HALF equal buckets. Values at or above 2^HIST_MAX_EXP are clamped. */
#define HIST_SUB_BITS 7
#define HIST_SUB (1u << HIST_SUB_BITS) /* 128 */
#define HIST_HALF (HIST_SUB / 2)       /* 64 */
#define HIST_MAX_EXP 40                /* 2^40 µs: 12.7 days */
#define HIST_BUCKETS (HIST_SUB + (HIST_MAX_EXP - HIST_SUB_BITS) * HIST_HALF)

struct hist {
    uint64_t counts[HIST_BUCKETS];
    uint64_t total;
    uint64_t min;
    uint64_t max;
    double sum;
};

static void histInit(struct hist *h)
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

static size_t histIndex(uint64_t v)
{
    if (v >= (1ull << HIST_MAX_EXP)) {
        v = (1ull << HIST_MAX_EXP) - 1;
    }
    if (v < HIST_SUB) {
        return (size_t)v;
    }
    unsigned shift = msbIndex(v) - (HIST_SUB_BITS - 1); /* v >> shift is in [64, 128) */
    return HIST_SUB + (size_t)(shift - 1) * HIST_HALF + (size_t)((v >> shift) - HIST_HALF);
}

/* The smallest and largest value that land in bucket `i`. */
static void histBounds(size_t i, uint64_t *lo, uint64_t *hi)
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

static void histRecord(struct hist *h, uint64_t v)
{
    h->counts[histIndex(v)]++;
    h->total++;
    h->sum += (double)v;
    if (v < h->min) {
        h->min = v;
    }
    if (v > h->max) {
        h->max = v;
    }
}

static void histMerge(struct hist *dst, const struct hist *src)
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

/* The value at percentile p (0 < p <= 100): the largest value equivalent to the bucket
 * that holds the ceil(p% * total)-th smallest sample, as HdrHistogram reports it, but
 * never more than the largest value recorded. 0 when the histogram is empty. */
static uint64_t histPercentile(const struct hist *h, double p)
{
    if (h->total == 0) {
        return 0;
    }
    double want = p / 100.0 * (double)h->total;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want) {
        rank++;
    }
    if (rank == 0) {
        rank = 1;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t lo, hi;
            histBounds(i, &lo, &hi);
            return hi < h->max ? hi : h->max;
        }
    }
    return h->max;
}

/* ---- configuration ------------------------------------------------------------------- */

enum workload { WL_FRESH, WL_REPLAY, WL_CLAIM_COMPLETE };

static const char *const workloadNames[] = {"fresh", "replay", "claim-complete"};

struct config {
    const char *cluster;
    const char *token;
    unsigned concurrency;
    unsigned duration_s;
    uint64_t requests; /* 0: unbounded */
    enum workload workload;
    bool json;
    uint32_t deadline_ms;
};

static const char usageText[] =
    "Usage: idem-bench --cluster H:P,... --token T --workload fresh|replay|claim-complete\n"
    "                  [--concurrency N] [--duration SECONDS] [--requests N]\n"
    "                  [--deadline MS] [--json]\n"
    "\n"
    "  --cluster H:P,...   RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T           tenant bearer token (env IDEM_TOKEN)\n"
    "  --workload W        fresh: claim a new key each time (expects acquired);\n"
    "                      replay: claim one of 64 pre-completed keys (expects replay);\n"
    "                      claim-complete: claim then complete a new key (one op per pair)\n"
    "  --concurrency N     threads, one client and one request in flight each\n"
    "                      (default 8, at most 1024)\n"
    "  --duration SECONDS  how long to run (default 10, at most 3600)\n"
    "  --requests N        stop after N operations (default: no limit)\n"
    "  --deadline MS       deadline of each call, retries included (default 5000)\n"
    "  --json              print one JSON object: ops_per_sec, p50_ms, p99_ms, errors, ops,\n"
    "                      duration_s, workload, concurrency (and a few more)\n"
    "  --help              print this help and exit\n"
    "\n"
    "Exit status: 0 it ran, 2 usage error, 3 nothing could be reached, 1 setup failed.\n";

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
    cfg->cluster = envOrNull("IDEM_CLUSTER");
    cfg->token = envOrNull("IDEM_TOKEN");
    cfg->concurrency = 8;
    cfg->duration_s = 10;
    cfg->requests = 0;
    cfg->json = false;
    cfg->deadline_ms = DEFAULT_DEADLINE_MS;
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
        } else if (optValue(argc, argv, &i, "--cluster", &v)) {
            cfg->cluster = v;
        } else if (optValue(argc, argv, &i, "--token", &v)) {
            cfg->token = v;
        } else if (optValue(argc, argv, &i, "--concurrency", &v)) {
            cfg->concurrency = (unsigned)cli_parse_u64("--concurrency", v, 1, MAX_CONCURRENCY);
        } else if (optValue(argc, argv, &i, "--duration", &v)) {
            cfg->duration_s = (unsigned)cli_parse_u64("--duration", v, 1, MAX_DURATION_S);
        } else if (optValue(argc, argv, &i, "--requests", &v)) {
            cfg->requests = cli_parse_u64("--requests", v, 1, UINT64_MAX / 2);
        } else if (optValue(argc, argv, &i, "--deadline", &v)) {
            cfg->deadline_ms = (uint32_t)cli_parse_u64("--deadline", v, 1, 600000);
        } else if (optValue(argc, argv, &i, "--workload", &v)) {
            workload = v;
        } else if (arg[0] == '-') {
            cli_usage_error("unknown option %s", arg);
        } else {
            cli_usage_error("unexpected argument \"%s\"", arg);
        }
    }
    if (workload == NULL) {
        cli_usage_error("missing --workload fresh|replay|claim-complete");
    }
    bool found = false;
    for (size_t w = 0; w < sizeof workloadNames / sizeof workloadNames[0]; w++) {
        if (strcmp(workload, workloadNames[w]) == 0) {
            cfg->workload = (enum workload)w;
            found = true;
        }
    }
    if (!found) {
        cli_usage_error("--workload must be fresh, replay or claim-complete, got \"%s\"", workload);
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
}

/* ---- the run ------------------------------------------------------------------------- */

struct replay_key {
    char key[96];
    uint8_t fp[32];
};

struct bench {
    struct config cfg;
    char run_id[17];
    struct replay_key replay[REPLAY_KEYS];
    uint64_t start_ms;
    uint64_t end_ms;
    atomic_uint_fast64_t tickets; /* operations started, for --requests */
    atomic_uint_fast64_t done;    /* operations finished, for progress */
    atomic_bool stop;
};

struct worker {
    struct bench *b;
    unsigned index;
    pthread_t thread;
    bool started;
    struct hist hist;
    uint64_t ops;       /* expected outcome */
    uint64_t errors;    /* other outcome, or no answer */
    uint64_t transport; /* of errors: no answer */
    uint64_t answered;  /* calls that got an answer */
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

static uint64_t nowMs(void)
{
    return nowUs() / 1000u;
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

/* Runs one operation of the workload; returns true when every call got its expected
 * outcome. Counts answers and transport failures. */
static bool workerOp(struct worker *w, struct idem_client *c)
{
    struct bench *b = w->b;
    uint32_t dl = b->cfg.deadline_ms;
    char key[96], attempt[48], err[256];
    uint8_t fp[32];
    uint64_t token = 0;
    int rv = IDEM_OK;
    Idem__Outcome o;
    if (b->cfg.workload == WL_REPLAY) {
        const struct replay_key *rk = &b->replay[rngNext(&w->rng) % REPLAY_KEYS];
        snprintf(attempt, sizeof attempt, "r%u-%" PRIu64, w->index, w->seq++);
        o = doClaim(c, dl, rk->key, rk->fp, attempt, NULL, &rv, err, sizeof err);
        if (rv == IDEM_OK) {
            w->answered++;
        } else {
            w->transport++;
        }
        if (o != IDEM__OUTCOME__OUTCOME_REPLAY) {
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
    if (rv == IDEM_OK) {
        w->answered++;
    } else {
        w->transport++;
    }
    if (o != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
        noteError(w, "%s", err);
        return false;
    }
    if (b->cfg.workload == WL_FRESH) {
        return true;
    }
    o = doComplete(c, dl, key, token, &rv, err, sizeof err);
    if (rv == IDEM_OK) {
        w->answered++;
    } else {
        w->transport++;
    }
    if (o != IDEM__OUTCOME__OUTCOME_OK) {
        noteError(w, "%s", err);
        return false;
    }
    return true;
}

static void *workerRun(void *arg)
{
    struct worker *w = arg;
    struct bench *b = w->b;
    struct idem_client *c = NULL;
    int rv = idem_client_new(b->cfg.cluster, b->cfg.token, &c);
    if (rv != IDEM_OK) {
        noteError(w, "client: %s", idem_strerror(rv));
        w->errors++;
        return NULL;
    }
    for (;;) {
        if (atomic_load_explicit(&b->stop, memory_order_relaxed) || nowMs() >= b->end_ms) {
            break;
        }
        if (b->cfg.requests != 0 &&
            atomic_fetch_add_explicit(&b->tickets, 1, memory_order_relaxed) >= b->cfg.requests) {
            break;
        }
        uint64_t t0 = nowUs();
        if (workerOp(w, c)) {
            histRecord(&w->hist, nowUs() - t0);
            w->ops++;
        } else {
            w->errors++;
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

/* replay workload: claims and completes REPLAY_KEYS keys that the run will replay. */
static int setupReplay(struct bench *b, struct idem_client *c)
{
    uint64_t rng = seedFromRandom();
    char err[256], attempt[48];
    for (unsigned i = 0; i < REPLAY_KEYS; i++) {
        struct replay_key *rk = &b->replay[i];
        snprintf(rk->key, sizeof rk->key, "bench-%s-replay-%u", b->run_id, i);
        snprintf(attempt, sizeof attempt, "setup-%u", i);
        randomFill(&rng, rk->fp, sizeof rk->fp);
        uint64_t token = 0;
        int rv;
        Idem__Outcome o = doClaim(c, b->cfg.deadline_ms, rk->key, rk->fp, attempt, &token, &rv,
                                  err, sizeof err);
        if (o == IDEM__OUTCOME__OUTCOME_ACQUIRED) {
            o = doComplete(c, b->cfg.deadline_ms, rk->key, token, &rv, err, sizeof err);
        }
        if (o != IDEM__OUTCOME__OUTCOME_OK) {
            fprintf(stderr, "idem-bench: replay setup, key %u of %d: %s\n", i + 1, REPLAY_KEYS,
                    err);
            return rv == IDEM_EUNAVAILABLE ? EXIT_UNAVAILABLE : EXIT_SETUP;
        }
    }
    return EXIT_RAN;
}

static void sleepMs(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
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

/* Rounds to 3 decimals, so that JSON shows 1.234 rather than 1.2339999999999999. */
static double round3(double v)
{
    return (double)(int64_t)(v * 1000.0 + (v >= 0 ? 0.5 : -0.5)) / 1000.0;
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
    atomic_init(&b->stop, false);

    struct idem_client *c = NULL;
    int rv = idem_client_new(b->cfg.cluster, b->cfg.token, &c);
    if (rv != IDEM_OK) {
        fprintf(stderr, "idem-bench: %s\n", idem_strerror(rv));
        free(b);
        return rv == IDEM_EINVAL ? EXIT_USAGE : EXIT_SETUP;
    }
    int code = probe(b, c);
    if (code == EXIT_RAN && b->cfg.workload == WL_REPLAY) {
        code = setupReplay(b, c);
    }
    idem_client_close(c);
    if (code != EXIT_RAN) {
        free(b);
        return code;
    }

    unsigned n = b->cfg.concurrency;
    struct worker *ws = calloc(n, sizeof *ws);
    if (ws == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        free(b);
        return EXIT_SETUP;
    }
    bool progress = !b->cfg.json && isatty(STDERR_FILENO);
    b->start_ms = nowMs();
    b->end_ms = b->start_ms + (uint64_t)b->cfg.duration_s * 1000u;
    uint64_t t_start = nowUs();
    unsigned running = 0;
    for (unsigned i = 0; i < n; i++) {
        ws[i].b = b;
        ws[i].index = i;
        ws[i].rng = seedFromRandom();
        histInit(&ws[i].hist);
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
        free(b);
        return EXIT_SETUP;
    }
    /* The workers stop themselves at end_ms or after --requests; progress meanwhile. */
    uint64_t last_print = b->start_ms;
    uint64_t last_done = 0;
    while (nowMs() < b->end_ms) {
        if (b->cfg.requests != 0 &&
            atomic_load_explicit(&b->done, memory_order_relaxed) >= b->cfg.requests) {
            break;
        }
        sleepMs(50);
        uint64_t now = nowMs();
        if (progress && now - last_print >= 1000) {
            uint64_t d = atomic_load_explicit(&b->done, memory_order_relaxed);
            fprintf(stderr, "\r[%3" PRIu64 "s] %" PRIu64 " ops, %.0f ops/s   ",
                    (now - b->start_ms) / 1000, d,
                    (double)(d - last_done) * 1000.0 / (double)(now - last_print));
            last_print = now;
            last_done = d;
        }
    }
    atomic_store(&b->stop, true);
    for (unsigned i = 0; i < running; i++) {
        pthread_join(ws[i].thread, NULL);
    }
    double elapsed = (double)(nowUs() - t_start) / 1e6;
    if (progress) {
        fputs("\n", stderr);
    }

    struct hist *all = malloc(sizeof *all);
    if (all == NULL) {
        fputs("idem-bench: out of memory\n", stderr);
        free(ws);
        free(b);
        return EXIT_SETUP;
    }
    histInit(all);
    uint64_t ops = 0, errors = 0, transport = 0, answered = 0;
    const char *first_error = NULL;
    for (unsigned i = 0; i < running; i++) {
        histMerge(all, &ws[i].hist);
        ops += ws[i].ops;
        errors += ws[i].errors;
        transport += ws[i].transport;
        answered += ws[i].answered;
        if (first_error == NULL && ws[i].first_error[0] != '\0') {
            first_error = ws[i].first_error;
        }
    }
    double ops_s = elapsed > 0 ? (double)ops / elapsed : 0;
    double p50 = (double)histPercentile(all, 50) / 1000.0;
    double p99 = (double)histPercentile(all, 99) / 1000.0;
    double p999 = (double)histPercentile(all, 99.9) / 1000.0;
    double max = all->total ? (double)all->max / 1000.0 : 0;
    double mean = all->total ? all->sum / (double)all->total / 1000.0 : 0;

    if (b->cfg.json) {
        json_t *o = json_object();
        if (o == NULL) {
            fputs("idem-bench: out of memory\n", stderr);
            exit(EXIT_SETUP);
        }
        jset(o, "ops_per_sec", jnum(round3(ops_s)));
        jset(o, "p50_ms", jnum(round3(p50)));
        jset(o, "p99_ms", jnum(round3(p99)));
        jset(o, "errors", json_integer((json_int_t)errors));
        jset(o, "ops", json_integer((json_int_t)ops));
        jset(o, "duration_s", jnum(round3(elapsed)));
        jset(o, "workload", json_string(workloadNames[b->cfg.workload]));
        jset(o, "concurrency", json_integer((json_int_t)running));
        jset(o, "p999_ms", jnum(round3(p999)));
        jset(o, "max_ms", jnum(round3(max)));
        jset(o, "mean_ms", jnum(round3(mean)));
        jset(o, "transport_errors", json_integer((json_int_t)transport));
        jset(o, "run_id", json_string(b->run_id));
        char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
        if (s == NULL) {
            fputs("idem-bench: out of memory\n", stderr);
            exit(EXIT_SETUP);
        }
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("workload     %s\n", workloadNames[b->cfg.workload]);
        printf("concurrency  %u\n", running);
        printf("duration     %.2f s\n", elapsed);
        printf("ops          %" PRIu64 "\n", ops);
        printf("ops/s        %.1f\n", ops_s);
        printf("latency ms   p50 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f\n", p50, p99,
               p999, max, mean);
        printf("errors       %" PRIu64 " (no answer: %" PRIu64 ")\n", errors, transport);
    }
    if (first_error != NULL) {
        fprintf(stderr, "idem-bench: first error: %s\n", first_error);
    }
    code = (answered == 0 && transport > 0) ? EXIT_UNAVAILABLE : EXIT_RAN;
    if (code == EXIT_UNAVAILABLE) {
        fputs("idem-bench: not one call was answered\n", stderr);
    }
    free(all);
    free(ws);
    free(b);
    return code;
}
