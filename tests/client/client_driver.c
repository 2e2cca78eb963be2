/* client_driver: scenarios of libidem against a real cluster, driven by
 * tests/integration/test_client.py. Each scenario does its calls, checks what only the
 * client can see (callbacks counted per request, tokens per attempt id, fn calls) and
 * prints one JSON object on its last line, which the Python test asserts on.
 *
 *   client_driver SCENARIO SEEDS TOKEN [ARGS...]
 *
 * Scenarios (see each function): attempt, ops, loop, deadline, async-many, async-tls,
 * async-close, async-ops, async-stream, run-once, run-retryable, run-slow, run-unknown,
 * run-unknown-bare, tls,
 * claims, big, async-blocked, async-refused, run-badresp, run-bigresp, run-lapse, lease,
 * run-renewals, serve (a line-per-call client for tests/chaos). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>

#include "idem.h"

static const char *g_seeds;
static const char *g_token;
static const char *g_tls_ca;   /* async-tls: TLS for the async client */
static const char *g_tls_name;

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleepMs(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fpOf(const char *s, uint8_t fp[IDEM_FINGERPRINT_LEN])
{
    idem_fingerprint(s, strlen(s), fp);
}

static struct idem_client *openClient(const struct idem_options *extra)
{
    struct idem_options o = {.seeds = g_seeds, .token = g_token, .default_deadline_ms = 10000};
    if (extra != NULL) {
        o = *extra;
    }
    struct idem_client *c = NULL;
    char why[256];
    int rv = idem_client_open(&o, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        fprintf(stderr, "client_driver: open: %s: %s\n", idem_strerror(rv), why);
        exit(2);
    }
    return c;
}

static void die(const char *what, int rv, const struct idem_result *r)
{
    fprintf(stderr, "client_driver: %s: %s: %s\n", what, idem_strerror(rv), r ? r->detail : "");
    exit(1);
}

/* ---- attempt: a claim retried with the same attempt id gets its own lease back --------- */

static int scAttempt(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    const char *key = argv[0];
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("attempt", fp);
    char aid[IDEM_ATTEMPT_ID_HEX + 1];
    idem_attempt_id_new(aid);
    struct idem_claim_opts o = {.attempt_id = aid};
    struct idem_result r1, r2, r3;
    int rv = idem_claim(c, key, fp, &o, &r1);
    if (rv != IDEM_OK) {
        die("claim 1", rv, &r1);
    }
    rv = idem_claim(c, key, fp, &o, &r2);
    if (rv != IDEM_OK) {
        die("claim 2", rv, &r2);
    }
    rv = idem_claim(c, key, fp, NULL, &r3); /* a fresh attempt id */
    if (rv != IDEM_OK) {
        die("claim 3", rv, &r3);
    }
    printf("{\"first\": \"%s\", \"first_token\": %" PRIu64 ", \"second\": \"%s\", "
           "\"second_token\": %" PRIu64 ", \"other_attempt\": \"%s\", \"leader\": \"%s\"}\n",
           idem_outcome_name(r1.outcome), r1.token, idem_outcome_name(r2.outcome), r2.token,
           idem_outcome_name(r3.outcome), idem_client_leader(c) ? idem_client_leader(c) : "");
    idem_result_free(&r1);
    idem_result_free(&r2);
    idem_result_free(&r3);
    idem_client_close(c);
    return 0;
}

/* ---- ops: every synchronous call and its outcomes --------------------------------------- */

static int scOps(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    const char *key = argv[0];
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN], fp2[IDEM_FINGERPRINT_LEN];
    fpOf("ops", fp);
    fpOf("ops-other", fp2);
    struct idem_result r;
    int rv;
    printf("{");
#define STEP(name, call)                                                                       \
    do {                                                                                       \
        rv = (call);                                                                           \
        if (rv != IDEM_OK) {                                                                   \
            die(name, rv, &r);                                                                 \
        }                                                                                      \
        printf("\"%s\": \"%s\", ", name, idem_outcome_name(r.outcome));                        \
    } while (0)
    struct idem_claim_opts co = {.lease_ms = 5000};
    STEP("claim", idem_claim(c, key, fp, &co, &r));
    uint64_t token = r.token, lease1 = r.lease_deadline_ms;
    idem_result_free(&r);
    STEP("renew", idem_renew(c, key, token, 60000, 0, &r));
    printf("\"renew_extends\": %s, ", r.lease_deadline_ms > lease1 ? "true" : "false");
    idem_result_free(&r);
    STEP("renew_wrong_token", idem_renew(c, key, token + 1, 0, 0, &r));
    idem_result_free(&r);
    STEP("get_processing", idem_get(c, key, 0, &r));
    printf("\"state\": %d, \"get_token_matches\": %s, \"get_fp_matches\": %s, ", r.record.state,
           r.record.token == token ? "true" : "false",
           r.record.fingerprint_len == 32 && memcmp(r.record.fingerprint, fp, 32) == 0 ? "true"
                                                                                      : "false");
    idem_result_free(&r);
    STEP("claim_mismatch", idem_claim(c, key, fp2, NULL, &r));
    idem_result_free(&r);
    struct idem_header h[2] = {
        {.name = "content-type", .value = (const uint8_t *)"application/json", .value_len = 16},
        {.name = "location", .value = (const uint8_t *)"/orders/7", .value_len = 9}};
    struct idem_response resp = {.status = 201, .headers = h, .n_headers = 2,
                                 .body = (const uint8_t *)"order=7", .body_len = 7};
    STEP("complete", idem_complete(c, key, token, IDEM_COMPLETION_SUCCEEDED, &resp, 0, &r));
    idem_result_free(&r);
    STEP("complete_again", idem_complete(c, key, token, IDEM_COMPLETION_SUCCEEDED, &resp, 0, &r));
    idem_result_free(&r);
    STEP("release_after_complete", idem_release(c, key, token, 0, &r));
    idem_result_free(&r);
    STEP("get_completed", idem_get(c, key, 0, &r));
    printf("\"state2\": %d, \"stored_status\": %u, \"stored_body\": \"%.*s\", "
           "\"stored_headers\": %zu, \"stored_h1\": \"%s\", ",
           r.record.state, r.response.status, (int)r.response.body_len,
           (const char *)r.response.body, r.response.n_headers,
           r.response.n_headers > 1 ? r.response.headers[1].name : "");
    idem_result_free(&r);
    STEP("claim_replay", idem_claim(c, key, fp, NULL, &r));
    printf("\"replay_body\": \"%.*s\", ", (int)r.response.body_len, (const char *)r.response.body);
    idem_result_free(&r);
    STEP("release_unknown_key", idem_release(c, "ops-never-claimed", 1, 0, &r));
    idem_result_free(&r);
    STEP("get_unknown_key", idem_get(c, "ops-never-claimed", 0, &r));
    idem_result_free(&r);
    STEP("claim_bad_key", idem_claim(c, "bad key with spaces", fp, NULL, &r));
    printf("\"bad_key_detail\": \"%s\", ", r.detail);
    idem_result_free(&r);
    idem_client_close(c);
    struct idem_options o = {.seeds = g_seeds, .token = "not-a-token"};
    c = openClient(&o);
    STEP("claim_unauthenticated", idem_claim(c, key, fp, NULL, &r));
    idem_result_free(&r);
    idem_client_close(c);
#undef STEP
    printf("\"done\": true}\n");
    return 0;
}

/* ---- loop: several threads on one client, claim → complete → claim again ------------- *
 * Each thread takes fresh keys PREFIX-t-i: claim (own attempt id; on IDEM_EUNAVAILABLE the
 * same claim again, same attempt id), complete, then a claim with a fresh attempt id that
 * must be a replay. Runs until a "stop" line on stdin (bounded: MAX_OPS per thread, 120 s).
 * Prints "progress N" lines (N = keys done) so the test can act mid-run. */

#define LOOP_MAX_KEYS 20000
#define LOOP_MAX_MS 120000u
#define LOOP_RETRIES 5

struct loopShared {
    struct idem_client *c;
    const char *prefix;
    atomic_bool stop;
    atomic_uint_fast64_t keys_done;
    atomic_uint_fast64_t errors;          /* a call that failed even after LOOP_RETRIES */
    atomic_uint_fast64_t retried;         /* claims repeated after IDEM_EUNAVAILABLE */
    atomic_uint_fast64_t not_acquired;    /* first claim of a fresh key not acquired */
    atomic_uint_fast64_t token_changed;   /* a repeated claim (same attempt) got another token */
    atomic_uint_fast64_t second_acquired; /* a fresh attempt after complete got acquired */
    atomic_uint_fast64_t not_replay;      /* ... or anything else than replay */
    uint64_t start;
    pthread_mutex_t mu;
    uint64_t *tokens; /* every acquired token, to check uniqueness */
    size_t n_tokens;
};

struct loopThread {
    struct loopShared *s;
    int id;
};

static void *loopMain(void *arg)
{
    struct loopThread *t = arg;
    struct loopShared *s = t->s;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("loop", fp);
    for (int i = 0; i < LOOP_MAX_KEYS && !atomic_load(&s->stop); i++) {
        if (nowMs() - s->start > LOOP_MAX_MS) {
            break;
        }
        char key[96];
        snprintf(key, sizeof key, "%s-%d-%d", s->prefix, t->id, i);
        char aid[IDEM_ATTEMPT_ID_HEX + 1];
        idem_attempt_id_new(aid);
        struct idem_claim_opts o = {.attempt_id = aid, .deadline_ms = 10000};
        struct idem_result r;
        int rv = IDEM_EUNAVAILABLE;
        uint64_t first_token = 0;
        bool acquired = false;
        for (int k = 0; k < LOOP_RETRIES; k++) {
            rv = idem_claim(s->c, key, fp, &o, &r);
            if (rv == IDEM_OK) {
                if (r.outcome == IDEM_OUTCOME_ACQUIRED) {
                    if (acquired && r.token != first_token) {
                        atomic_fetch_add(&s->token_changed, 1);
                    }
                    acquired = true;
                    first_token = r.token;
                } else {
                    atomic_fetch_add(&s->not_acquired, 1);
                    fprintf(stderr, "loop: %s: claim answered %s (%s)\n", key,
                            idem_outcome_name(r.outcome), r.detail);
                }
                idem_result_free(&r);
                break;
            }
            atomic_fetch_add(&s->retried, 1);
            fprintf(stderr, "loop: %s: claim: %s: %s (retrying)\n", key, idem_strerror(rv),
                    r.detail);
        }
        if (rv != IDEM_OK) {
            atomic_fetch_add(&s->errors, 1);
            continue;
        }
        if (!acquired) {
            continue;
        }
        pthread_mutex_lock(&s->mu);
        s->tokens[s->n_tokens++] = first_token;
        pthread_mutex_unlock(&s->mu);
        struct idem_response resp = {.status = 200, .body = (const uint8_t *)key,
                                     .body_len = strlen(key)};
        for (int k = 0; k < LOOP_RETRIES; k++) {
            rv = idem_complete(s->c, key, first_token, IDEM_COMPLETION_SUCCEEDED, &resp, 10000,
                               &r);
            if (rv == IDEM_OK) {
                if (r.outcome != IDEM_OUTCOME_OK) {
                    fprintf(stderr, "loop: complete answered %s\n", idem_outcome_name(r.outcome));
                    atomic_fetch_add(&s->errors, 1);
                }
                idem_result_free(&r);
                break;
            }
        }
        if (rv != IDEM_OK) {
            atomic_fetch_add(&s->errors, 1);
            continue;
        }
        struct idem_claim_opts o2 = {.deadline_ms = 10000};
        for (int k = 0; k < LOOP_RETRIES; k++) {
            rv = idem_claim(s->c, key, fp, &o2, &r);
            if (rv == IDEM_OK) {
                if (r.outcome == IDEM_OUTCOME_ACQUIRED) {
                    atomic_fetch_add(&s->second_acquired, 1);
                } else if (r.outcome != IDEM_OUTCOME_REPLAY || r.response.body_len != strlen(key) ||
                           memcmp(r.response.body, key, strlen(key)) != 0) {
                    atomic_fetch_add(&s->not_replay, 1);
                }
                idem_result_free(&r);
                break;
            }
        }
        if (rv != IDEM_OK) {
            atomic_fetch_add(&s->errors, 1);
            continue;
        }
        atomic_fetch_add(&s->keys_done, 1);
    }
    return NULL;
}

static void *stdinWatch(void *arg)
{
    struct loopShared *s = arg;
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (strncmp(line, "stop", 4) == 0) {
            break;
        }
    }
    atomic_store(&s->stop, true); /* "stop" or EOF */
    return NULL;
}

static int cmpU64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int scLoop(int argc, char **argv)
{
    if (argc < 2) {
        return 2;
    }
    struct loopShared s;
    memset(&s, 0, sizeof s);
    s.prefix = argv[0];
    int threads = atoi(argv[1]);
    if (threads < 1 || threads > 16) {
        return 2;
    }
    s.c = openClient(NULL);
    s.start = nowMs();
    pthread_mutex_init(&s.mu, NULL);
    s.tokens = calloc((size_t)threads * LOOP_MAX_KEYS, sizeof *s.tokens);
    struct loopThread lt[16];
    pthread_t th[16], watch;
    pthread_create(&watch, NULL, stdinWatch, &s);
    pthread_detach(watch);
    for (int i = 0; i < threads; i++) {
        lt[i] = (struct loopThread){.s = &s, .id = i};
        pthread_create(&th[i], NULL, loopMain, &lt[i]);
    }
    uint64_t last = 0;
    const char *leaders[8]; /* distinct leaders the client followed (sampled) */
    int n_leaders = 0;
    for (;;) {
        sleepMs(20);
        const char *l = idem_client_leader(s.c);
        bool seen = l == NULL;
        for (int i = 0; i < n_leaders && !seen; i++) {
            seen = strcmp(leaders[i], l) == 0;
        }
        if (!seen && n_leaders < 8) {
            leaders[n_leaders++] = l;
        }
        uint64_t done = atomic_load(&s.keys_done);
        if (done / 20 != last / 20) {
            printf("progress %" PRIu64 "\n", done);
            fflush(stdout);
        }
        last = done;
        if (atomic_load(&s.stop) || nowMs() - s.start > LOOP_MAX_MS + 30000) {
            break;
        }
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
    }
    qsort(s.tokens, s.n_tokens, sizeof *s.tokens, cmpU64);
    uint64_t dup_tokens = 0;
    for (size_t i = 1; i < s.n_tokens; i++) {
        dup_tokens += s.tokens[i] == s.tokens[i - 1];
    }
    printf("{\"keys_done\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"retried\": %" PRIu64
           ", \"not_acquired\": %" PRIu64 ", \"token_changed\": %" PRIu64
           ", \"second_acquired\": %" PRIu64 ", \"not_replay\": %" PRIu64
           ", \"acquired\": %zu, \"dup_tokens\": %" PRIu64 ", \"leaders_seen\": %d}\n",
           (uint64_t)atomic_load(&s.keys_done), (uint64_t)atomic_load(&s.errors),
           (uint64_t)atomic_load(&s.retried), (uint64_t)atomic_load(&s.not_acquired),
           (uint64_t)atomic_load(&s.token_changed), (uint64_t)atomic_load(&s.second_acquired),
           (uint64_t)atomic_load(&s.not_replay), s.n_tokens, dup_tokens, n_leaders);
    fflush(stdout);
    free(s.tokens);
    idem_client_close(s.c);
    pthread_mutex_destroy(&s.mu);
    return 0;
}

/* ---- deadline: one claim against a cluster without quorum ------------------------------ */

static int scDeadline(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    uint32_t dl = (uint32_t)atoi(argv[0]);
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("deadline", fp);
    struct idem_claim_opts o = {.deadline_ms = dl};
    struct idem_result r;
    uint64_t t0 = nowMs();
    int rv = idem_claim(c, "deadline-key", fp, &o, &r);
    uint64_t took = nowMs() - t0;
    printf("{\"rv\": %d, \"error\": \"%s\", \"elapsed_ms\": %" PRIu64 ", \"outcome\": \"%s\"}\n",
           rv, idem_strerror(rv), took, idem_outcome_name(r.outcome));
    fprintf(stderr, "deadline: %s\n", r.detail);
    idem_result_free(&r);
    idem_client_close(c);
    return 0;
}

/* ---- async-many: N pipelined claims on one loop ---------------------------------------- */

struct asyncReq {
    int calls;
    int status;
    int outcome;
    uint64_t token;
};

struct asyncRun {
    struct asyncReq *reqs;
    int n;
    int answered;
    int close_calls;
    int after_close_rv;
    int submit_failed;
    struct idem_async *a;
};

static void asyncCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    struct asyncReq *q = data;
    (void)a;
    q->calls++;
    q->status = status;
    q->outcome = res->outcome;
    q->token = res->token;
}

static void closeCb(struct idem_async *a, void *data)
{
    (void)a;
    struct asyncRun *run = data;
    run->close_calls++;
}

static struct idem_async *asyncOpen(uv_loop_t *loop, uint32_t deadline_ms)
{
    struct idem_options o = {.seeds = g_seeds, .token = g_token,
                             .default_deadline_ms = deadline_ms,
                             .tls_ca_file = g_tls_ca, .tls_server_name = g_tls_name};
    struct idem_async *a = NULL;
    char why[256];
    int rv = idem_async_open(loop, &o, &a, why, sizeof why);
    if (rv != IDEM_OK) {
        fprintf(stderr, "client_driver: async open: %s: %s\n", idem_strerror(rv), why);
        exit(2);
    }
    return a;
}

/* Counts what came back: per request exactly one call, how many of each status. */
static void asyncReport(struct asyncRun *run, uv_loop_t *loop, size_t max_pending,
                        uint64_t elapsed)
{
    int once = 0, acquired = 0, canceled = 0, unavailable = 0, other = 0;
    uint64_t *tokens = calloc((size_t)run->n, sizeof *tokens);
    size_t nt = 0;
    for (int i = 0; i < run->n; i++) {
        struct asyncReq *q = &run->reqs[i];
        once += q->calls == 1;
        if (q->status == IDEM_OK && q->outcome == IDEM_OUTCOME_ACQUIRED) {
            acquired++;
            tokens[nt++] = q->token;
        } else if (q->status == IDEM_ECANCELED) {
            canceled++;
        } else if (q->status == IDEM_EUNAVAILABLE) {
            unavailable++;
        } else {
            other++;
        }
    }
    qsort(tokens, nt, sizeof *tokens, cmpU64);
    int dups = 0;
    for (size_t i = 1; i < nt; i++) {
        dups += tokens[i] == tokens[i - 1];
    }
    free(tokens);
    int loop_close = uv_loop_close(loop);
    printf("{\"n\": %d, \"exactly_once\": %d, \"acquired\": %d, \"canceled\": %d, "
           "\"unavailable\": %d, \"other\": %d, \"dup_tokens\": %d, \"max_pending\": %zu, "
           "\"close_calls\": %d, \"after_close_rv\": %d, \"submit_failed\": %d, "
           "\"loop_close\": %d, "
           "\"elapsed_ms\": %" PRIu64 "}\n",
           run->n, once, acquired, canceled, unavailable, other, dups, max_pending,
           run->close_calls, run->after_close_rv, run->submit_failed, loop_close, elapsed);
}

static int scAsyncMany(int argc, char **argv)
{
    if (argc < 2) {
        return 2;
    }
    const char *prefix = argv[0];
    int n = atoi(argv[1]);
    uint32_t dl = argc > 2 ? (uint32_t)atoi(argv[2]) : 20000;
    if (n < 1 || n > 100000) {
        return 2;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct asyncRun run = {.n = n, .reqs = calloc((size_t)n, sizeof(struct asyncReq))};
    run.a = asyncOpen(&loop, dl);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("async", fp);
    uint64_t t0 = nowMs();
    for (int i = 0; i < n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s-%d", prefix, i);
        int rv = idem_async_claim(run.a, key, fp, NULL, asyncCb, &run.reqs[i]);
        if (rv != IDEM_OK) {
            fprintf(stderr, "submit %d: %s\n", i, idem_strerror(rv));
            return 1;
        }
    }
    size_t max_pending = idem_async_pending(run.a);
    /* Every request was accepted before the loop ran: they are all in flight at once. */
    while (idem_async_pending(run.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uint64_t elapsed = nowMs() - t0;
    idem_async_close(run.a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    asyncReport(&run, &loop, max_pending, elapsed);
    free(run.reqs);
    return 0;
}

/* ---- async-close: close with requests pending ------------------------------------------ *
 * MODE "now": close before the loop ever ran; "mid": after the first answer, from within
 * its callback; "dead": against a dead cluster, close after a few loop turns. */

struct midCtx {
    struct asyncRun *run;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
};

static struct midCtx g_mid;

static void midCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    asyncCb(a, status, res, data);
    struct asyncRun *run = g_mid.run;
    run->answered++;
    if (run->answered == 1 && status == IDEM_OK) {
        idem_async_close(a, closeCb, run);
        /* Refused from now on, and its callback never runs. */
        run->after_close_rv = idem_async_claim(a, "after-close", g_mid.fp, NULL, asyncCb,
                                               &run->reqs[0]);
    }
}

static int scAsyncClose(int argc, char **argv)
{
    if (argc < 3) {
        return 2;
    }
    const char *mode = argv[0];
    const char *prefix = argv[1];
    int n = atoi(argv[2]);
    if (n < 1 || n > 100000) {
        return 2;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct asyncRun run = {.n = n, .reqs = calloc((size_t)n, sizeof(struct asyncReq))};
    run.a = asyncOpen(&loop, 20000);
    g_mid.run = &run;
    fpOf("async-close", g_mid.fp);
    for (int i = 0; i < n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s-%d", prefix, i);
        int rv = idem_async_claim(run.a, key, g_mid.fp, NULL,
                                  strcmp(mode, "mid") == 0 ? midCb : asyncCb, &run.reqs[i]);
        if (rv != IDEM_OK) {
            fprintf(stderr, "submit %d: %s\n", i, idem_strerror(rv));
            return 1;
        }
    }
    size_t max_pending = idem_async_pending(run.a);
    uint64_t t0 = nowMs();
    if (strcmp(mode, "now") == 0) {
        idem_async_close(run.a, closeCb, &run);
        run.after_close_rv = idem_async_claim(run.a, "after-close", g_mid.fp, NULL, asyncCb,
                                              &run.reqs[0]);
    } else if (strcmp(mode, "dead") == 0) {
        for (int i = 0; i < 20; i++) {
            uv_run(&loop, UV_RUN_NOWAIT);
            sleepMs(5);
        }
        idem_async_close(run.a, closeCb, &run);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    asyncReport(&run, &loop, max_pending, nowMs() - t0);
    free(run.reqs);
    return 0;
}

/* ---- async-ops: claim → renew → get → complete → get → release on one loop, chained -- */

struct chain {
    struct idem_async *a;
    const char *key;
    uint64_t token;
    int step;
    int bad;
    char log[512];
    struct idem_result kept; /* moved out of the last callback */
};

static void chainCb(struct idem_async *a, int status, struct idem_result *res, void *data);

static void chainNext(struct chain *ch)
{
    static const struct idem_response resp = {.status = 200, .body = (const uint8_t *)"async",
                                               .body_len = 5};
    int rv = IDEM_OK;
    switch (ch->step) {
    case 1:
        rv = idem_async_renew(ch->a, ch->key, ch->token, 30000, 0, chainCb, ch);
        break;
    case 2:
        rv = idem_async_get(ch->a, ch->key, 0, chainCb, ch);
        break;
    case 3:
        rv = idem_async_complete(ch->a, ch->key, ch->token, IDEM_COMPLETION_FAILED_FINAL, &resp, 0,
                                 chainCb, ch);
        break;
    case 4:
        rv = idem_async_get(ch->a, ch->key, 0, chainCb, ch);
        break;
    case 5:
        rv = idem_async_release(ch->a, ch->key, ch->token, 0, chainCb, ch);
        break;
    default:
        return;
    }
    if (rv != IDEM_OK) {
        ch->bad++;
    }
}

static void chainCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    struct chain *ch = data;
    size_t n = strlen(ch->log);
    snprintf(ch->log + n, sizeof ch->log - n, "%s%s", n ? "," : "",
             status == IDEM_OK ? idem_outcome_name(res->outcome) : idem_strerror(status));
    if (status != IDEM_OK) {
        ch->bad++;
        return;
    }
    if (ch->step == 0) {
        ch->token = res->token;
    }
    if (ch->step == 4) {
        idem_result_move(&ch->kept, res); /* freed by the scenario, not the library */
    }
    ch->step++;
    chainNext(ch);
}

static int scAsyncOps(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct chain ch = {.key = argv[0]};
    ch.a = asyncOpen(&loop, 10000);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("async-ops", fp);
    if (idem_async_claim(ch.a, ch.key, fp, NULL, chainCb, &ch) != IDEM_OK) {
        return 1;
    }
    while (idem_async_pending(ch.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    struct asyncRun run = {0};
    idem_async_close(ch.a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    printf("{\"log\": \"%s\", \"bad\": %d, \"kept_state\": %d, \"kept_completion\": %d, "
           "\"kept_body\": \"%.*s\", \"close_calls\": %d, \"loop_close\": %d}\n",
           ch.log, ch.bad, ch.kept.record.state, ch.kept.record.completion,
           (int)ch.kept.response.body_len,
           ch.kept.response.body ? (const char *)ch.kept.response.body : "", run.close_calls,
           uv_loop_close(&loop));
    idem_result_free(&ch.kept);
    return 0;
}

/* ---- async-refused: a request refused at submit leaves no trace in later ones ------------- *
 * A claim without a key is refused (IDEM_EINVAL); a get then sent to seeds that never answer
 * fails at its deadline with a detail about the connection, not the refused claim's reason. */

struct detailReq {
    int calls;
    int status;
    char detail[256]; /* as struct idem_result's */
};

static void detailCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    struct detailReq *q = data;
    q->calls++;
    q->status = status;
    snprintf(q->detail, sizeof q->detail, "%s", res->detail);
}

static int scAsyncRefused(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_async *a = asyncOpen(&loop, 10000);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("async-refused", fp);
    struct detailReq q = {0};
    int claim_rv = idem_async_claim(a, NULL, fp, NULL, detailCb, &q);
    /* 100 ms: before the client gives up on the silent connection (250 ms), which would
     * write its own reason over the refused claim's. */
    int get_rv = idem_async_get(a, "k", 100, detailCb, &q);
    while (idem_async_pending(a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    struct asyncRun run = {0};
    idem_async_close(a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    printf("{\"claim_rv\": %d, \"get_rv\": %d, \"calls\": %d, \"status\": %d, "
           "\"detail\": \"",
           claim_rv, get_rv, q.calls, q.status);
    for (const char *p = q.detail; *p; p++) { /* JSON: quotes and backslashes escaped */
        printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    }
    printf("\", \"loop_close\": %d}\n", uv_loop_close(&loop));
    return 0;
}

/* ---- async-stream: a window of claims kept in flight until "stop" on stdin ---------------- *
 * The test changes the leader meanwhile: every request must still be answered exactly once,
 * acquired, with a token of its own. Bounded: STREAM_MAX requests, 120 s. */

#define STREAM_MAX 200000
#define STREAM_MAX_MS 120000u

struct stream {
    struct idem_async *a;
    struct asyncReq *reqs;
    const char *prefix;
    int window;
    int submitted;
    int answered;
    int failed;
    atomic_bool stop;
    uint64_t start;
    uv_timer_t tick;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
};

static void streamCb(struct idem_async *a, int status, struct idem_result *res, void *data);

static void streamSubmit(struct stream *st)
{
    while (!atomic_load(&st->stop) && st->submitted < STREAM_MAX &&
           st->submitted - st->answered < st->window) {
        char key[96];
        snprintf(key, sizeof key, "%s-%d", st->prefix, st->submitted);
        struct asyncReq *q = &st->reqs[st->submitted];
        if (idem_async_claim(st->a, key, st->fp, NULL, streamCb, q) != IDEM_OK) {
            st->failed++;
            return;
        }
        st->submitted++;
    }
}

static struct stream *g_stream;

static void streamCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    asyncCb(a, status, res, data);
    struct stream *st = g_stream;
    st->answered++;
    if (status != IDEM_OK || res->outcome != IDEM_OUTCOME_ACQUIRED) {
        fprintf(stderr, "stream: %s / %s: %s\n", idem_strerror(status),
                idem_outcome_name(res->outcome), res->detail);
    }
    streamSubmit(st);
}

static void streamTickCb(uv_timer_t *t)
{
    struct stream *st = t->data;
    printf("progress %d\n", st->answered);
    if (nowMs() - st->start > STREAM_MAX_MS) {
        atomic_store(&st->stop, true);
    }
}

static void *streamStdin(void *arg)
{
    struct stream *st = arg;
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL && strncmp(line, "stop", 4) != 0) {
    }
    atomic_store(&st->stop, true);
    return NULL;
}

static int scAsyncStream(int argc, char **argv)
{
    if (argc < 2) {
        return 2;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    static struct stream st;
    g_stream = &st;
    st.prefix = argv[0];
    st.window = atoi(argv[1]);
    if (st.window < 1 || st.window > 10000) {
        return 2;
    }
    st.reqs = calloc(STREAM_MAX, sizeof *st.reqs);
    st.a = asyncOpen(&loop, 15000);
    st.start = nowMs();
    fpOf("stream", st.fp);
    pthread_t th;
    pthread_create(&th, NULL, streamStdin, &st);
    pthread_detach(th);
    uv_timer_init(&loop, &st.tick);
    st.tick.data = &st;
    uv_timer_start(&st.tick, streamTickCb, 50, 50);
    streamSubmit(&st);
    /* Until "stop" and every answer is in (the tick wakes the loop every 50 ms). */
    while (!atomic_load(&st.stop) || idem_async_pending(st.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_close((uv_handle_t *)&st.tick, NULL);
    struct asyncRun run = {.n = st.submitted, .reqs = st.reqs, .submit_failed = st.failed};
    idem_async_close(st.a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    asyncReport(&run, &loop, (size_t)st.window, nowMs() - st.start);
    free(st.reqs);
    return 0;
}

/* ---- idem_run scenarios ------------------------------------------------------------------ */

struct business {
    int calls;
    int cls[4]; /* what to return on call 1, 2, ... */
    unsigned sleep_ms;
    bool bare; /* an IDEM_RUN_UNKNOWN call leaves the response as it got it (zeroed) */
    char body[128];
    /* run-slow: a concurrent claim while fn sleeps */
    const char *key;
    int concurrent_outcome;
};

static int businessFn(void *arg, uint64_t token, struct idem_response *resp)
{
    struct business *b = arg;
    int call = b->calls++;
    snprintf(b->body, sizeof b->body, "charged once, call %d, fence %" PRIu64, call + 1, token);
    if (b->sleep_ms > 0) {
        /* Sleep past the lease, then claim the same key as another attempt would. */
        sleepMs(b->sleep_ms);
        struct idem_client *other = openClient(NULL);
        uint8_t fp[IDEM_FINGERPRINT_LEN];
        fpOf("run", fp);
        struct idem_result r;
        int rv = idem_claim(other, b->key, fp, NULL, &r);
        b->concurrent_outcome = rv == IDEM_OK ? r.outcome : rv;
        idem_result_free(&r);
        idem_client_close(other);
    }
    int cls = b->cls[call < 4 ? call : 3];
    if (b->bare && cls == IDEM_RUN_UNKNOWN) {
        return cls; /* it cannot tell what happened: nothing to store */
    }
    resp->status = 201;
    resp->body = (const uint8_t *)b->body;
    resp->body_len = strlen(b->body);
    static const struct idem_header hdr = {.name = "content-type",
                                           .value = (const uint8_t *)"text/plain",
                                           .value_len = 10};
    resp->headers = &hdr;
    resp->n_headers = 1;
    return cls;
}

static void printRun(const char *name, int rv, const struct idem_result *r, const char *sep)
{
    printf("\"%s\": {\"rv\": %d, \"outcome\": \"%s\", \"ran\": %d, \"run_class\": %d, "
           "\"finish\": \"%s\", \"status\": %u, \"body\": \"%.*s\", \"headers\": %zu, "
           "\"token\": %" PRIu64 "}%s",
           name, rv, idem_outcome_name(r->outcome), r->ran, r->run_class,
           idem_outcome_name(r->finish_outcome), r->has_response ? r->response.status : 0,
           r->has_response ? (int)r->response.body_len : 0,
           r->has_response && r->response.body ? (const char *)r->response.body : "",
           r->has_response ? r->response.n_headers : 0, r->token, sep);
}

static int scRun(const char *mode, int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    const char *key = argv[0];
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("run", fp);
    struct business b = {.cls = {IDEM_RUN_SUCCEEDED, IDEM_RUN_SUCCEEDED, IDEM_RUN_SUCCEEDED,
                                 IDEM_RUN_SUCCEEDED},
                         .key = key};
    struct idem_claim_opts o = {0};
    if (strcmp(mode, "run-retryable") == 0) {
        b.cls[0] = IDEM_RUN_RETRYABLE;
    } else if (strcmp(mode, "run-unknown") == 0 || strcmp(mode, "run-unknown-bare") == 0) {
        b.cls[0] = IDEM_RUN_UNKNOWN;
        b.bare = strcmp(mode, "run-unknown-bare") == 0;
    } else if (strcmp(mode, "run-slow") == 0) {
        o.lease_ms = 800;
        b.sleep_ms = 2500; /* three leases and more */
    }
    struct idem_result r1, r2;
    int rv1 = idem_run(c, key, fp, &o, businessFn, &b, &r1);
    int calls_after_first = b.calls;
    b.sleep_ms = 0;
    int rv2 = idem_run(c, key, fp, &o, businessFn, &b, &r2);
    printf("{");
    printRun("first", rv1, &r1, ", ");
    printRun("second", rv2, &r2, ", ");
    printf("\"calls_after_first\": %d, \"calls\": %d, \"concurrent\": \"%s\"",
           calls_after_first, b.calls, idem_outcome_name(b.concurrent_outcome));
    idem_result_free(&r1);
    idem_result_free(&r2);
    if (strcmp(mode, "run-slow") == 0) {
        /* The control: the same lease without renewals does lapse (the other attempt sees
         * lease_expired), so the in_progress above is the renewals' doing. */
        char ctl[128];
        snprintf(ctl, sizeof ctl, "%s-control", key);
        struct idem_claim_opts co = {.lease_ms = 800};
        struct idem_result a, bb;
        int rv = idem_claim(c, ctl, fp, &co, &a);
        if (rv != IDEM_OK) {
            die("control claim", rv, &a);
        }
        sleepMs(2500);
        rv = idem_claim(c, ctl, fp, NULL, &bb);
        if (rv != IDEM_OK) {
            die("control claim 2", rv, &bb);
        }
        printf(", \"control_first\": \"%s\", \"control_second\": \"%s\"",
               idem_outcome_name(a.outcome), idem_outcome_name(bb.outcome));
        idem_result_free(&a);
        idem_result_free(&bb);
    }
    printf("}\n");
    idem_client_close(c);
    return 0;
}

/* ---- run-lapse: the lease ends while fn runs ------------------------------------------------
 * fn prints "running" and waits for a line on stdin: the test stops every node meanwhile,
 * for longer than the 1 s lease, and sends the line while they are still stopped. */

static int lapseFn(void *arg, uint64_t token, struct idem_response *resp)
{
    (void)arg;
    (void)token;
    printf("running\n");
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL) {
        return IDEM_RUN_RETRYABLE;
    }
    resp->status = 201;
    resp->body = (const uint8_t *)"done";
    resp->body_len = 4;
    return IDEM_RUN_SUCCEEDED;
}

static int scRunLapse(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("run", fp);
    struct idem_claim_opts o = {.lease_ms = 1000, .deadline_ms = 1500};
    struct idem_result r;
    int rv = idem_run(c, argv[0], fp, &o, lapseFn, NULL, &r);
    printf("{\"rv\": %d, \"ran\": %d, \"detail\": \"", rv, r.ran);
    for (const char *p = r.detail; *p; p++) { /* JSON: quotes and backslashes escaped */
        printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    }
    printf("\"}\n");
    idem_result_free(&r);
    idem_client_close(c);
    return 0;
}

/* ---- tls: a claim and a get over TLS ------------------------------------------------------ */

static int scTls(int argc, char **argv)
{
    if (argc < 2) {
        return 2;
    }
    const char *key = argv[0];
    struct idem_options o = {.seeds = g_seeds, .token = g_token, .tls = 1,
                             .tls_ca_file = argv[1], .default_deadline_ms = 3000};
    if (argc > 2 && argv[2][0] != '\0') {
        o.tls_server_name = argv[2];
    }
    if (argc > 4) {
        o.tls_cert_file = argv[3];
        o.tls_key_file = argv[4];
    }
    struct idem_client *c = NULL;
    char why[256];
    int rv = idem_client_open(&o, &c, why, sizeof why);
    if (rv != IDEM_OK) {
        printf("{\"open\": %d, \"why\": \"%s\"}\n", rv, why);
        return 0;
    }
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("tls", fp);
    struct idem_result r;
    rv = idem_claim(c, key, fp, NULL, &r);
    printf("{\"open\": 0, \"rv\": %d, \"outcome\": \"%s\", \"token\": %" PRIu64
           ", \"errmsg\": \"%s\"}\n",
           rv, idem_outcome_name(r.outcome), r.token, rv == IDEM_OK ? "" : r.detail);
    idem_result_free(&r);
    idem_client_close(c);
    return 0;
}

/* ---- claims: N synchronous claims in turn, then each key claimed again ------------------ *
 * claims PREFIX N DEADLINE_MS. Every claim has its own attempt id; the second round (fresh
 * attempt ids) must find every key held (in_progress): a key acquired twice shows there.
 * Reports the slowest call, so that the test can see each finished within its deadline. */

static int scClaims(int argc, char **argv)
{
    if (argc < 3) {
        return 2;
    }
    const char *prefix = argv[0];
    int n = atoi(argv[1]);
    uint32_t dl = (uint32_t)atoi(argv[2]);
    if (n < 1 || n > 10000 || dl == 0) {
        return 2;
    }
    struct idem_options oo = {.seeds = g_seeds, .token = g_token, .default_deadline_ms = dl};
    struct idem_client *c = openClient(&oo);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("claims", fp);
    int acquired = 0, failed = 0, held = 0, second_acquired = 0;
    uint64_t max_ms = 0;
    char last[256] = "";
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++) {
            char key[96];
            snprintf(key, sizeof key, "%s-%d", prefix, i);
            struct idem_result r;
            uint64_t t0 = nowMs();
            int rv = idem_claim(c, key, fp, NULL, &r);
            uint64_t took = nowMs() - t0;
            if (round == 0 && took > max_ms) {
                max_ms = took;
            }
            if (rv != IDEM_OK) {
                failed++;
                snprintf(last, sizeof last, "%s: %.200s", idem_strerror(rv), r.detail);
            } else if (round == 0) {
                acquired += r.outcome == IDEM_OUTCOME_ACQUIRED;
            } else {
                held += r.outcome == IDEM_OUTCOME_IN_PROGRESS;
                second_acquired += r.outcome == IDEM_OUTCOME_ACQUIRED;
            }
            idem_result_free(&r);
        }
    }
    const char *leader = idem_client_leader(c);
    printf("{\"n\": %d, \"acquired\": %d, \"failed\": %d, \"held\": %d, "
           "\"second_acquired\": %d, \"max_ms\": %" PRIu64 ", \"leader\": \"%s\", "
           "\"last_error\": \"%s\"}\n",
           n, acquired, failed, held, second_acquired, max_ms, leader ? leader : "", last);
    idem_client_close(c);
    return 0;
}

/* ---- big: a request larger than the node's max_frame_bytes among small ones ------------- *
 * big PREFIX BIG_BYTES. Async: a complete carrying a BIG_BYTES body, then 20 claims, all
 * pipelined on one connection; sync: the same complete, then a claim on the same client.
 * Then both again with max_frame_bytes set to 1 MiB on the client: refused before sending. */

#define BIG_SMALL 20

static int scBig(int argc, char **argv)
{
    if (argc < 2) {
        return 2;
    }
    const char *prefix = argv[0];
    size_t big = (size_t)atol(argv[1]);
    if (big == 0 || big > (15u << 20)) {
        return 2;
    }
    uint8_t *body = calloc(1, big);
    if (body == NULL) {
        return 1;
    }
    struct idem_response resp = {.status = 200, .body = body, .body_len = big};
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("big", fp);
    char key[96];

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct asyncRun run = {.n = BIG_SMALL, .reqs = calloc(BIG_SMALL, sizeof(struct asyncReq))};
    struct asyncReq bigreq = {0};
    run.a = asyncOpen(&loop, 10000);
    snprintf(key, sizeof key, "%s-async-big", prefix);
    int big_submit = idem_async_complete(run.a, key, 1, IDEM_COMPLETION_SUCCEEDED, &resp, 0,
                                         asyncCb, &bigreq);
    for (int i = 0; i < BIG_SMALL; i++) {
        snprintf(key, sizeof key, "%s-async-%d", prefix, i);
        if (idem_async_claim(run.a, key, fp, NULL, asyncCb, &run.reqs[i]) != IDEM_OK) {
            run.submit_failed++;
        }
    }
    uint64_t t0 = nowMs();
    while (idem_async_pending(run.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uint64_t async_ms = nowMs() - t0;
    idem_async_close(run.a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    int async_acquired = 0;
    for (int i = 0; i < BIG_SMALL; i++) {
        async_acquired += run.reqs[i].calls == 1 && run.reqs[i].status == IDEM_OK &&
                          run.reqs[i].outcome == IDEM_OUTCOME_ACQUIRED;
    }

    struct idem_client *c = openClient(NULL);
    struct idem_result r;
    snprintf(key, sizeof key, "%s-sync-big", prefix);
    int sync_big = idem_complete(c, key, 1, IDEM_COMPLETION_SUCCEEDED, &resp, 10000, &r);
    idem_result_free(&r);
    snprintf(key, sizeof key, "%s-sync-after", prefix);
    int sync_after = idem_claim(c, key, fp, NULL, &r);
    const char *sync_after_outcome = idem_outcome_name(r.outcome);
    idem_result_free(&r);
    idem_client_close(c);

    /* The client's own limit. */
    struct idem_options lo = {.seeds = g_seeds, .token = g_token, .max_frame_bytes = 1u << 20};
    c = openClient(&lo);
    int limited_sync = idem_complete(c, key, 1, IDEM_COMPLETION_SUCCEEDED, &resp, 10000, &r);
    idem_result_free(&r);
    idem_client_close(c);
    struct idem_async *la = NULL;
    char why[256];
    int limited_async = idem_async_open(&loop, &lo, &la, why, sizeof why);
    if (limited_async == IDEM_OK) {
        struct asyncReq q = {0};
        limited_async = idem_async_complete(la, key, 1, IDEM_COMPLETION_SUCCEEDED, &resp, 0,
                                            asyncCb, &q);
        idem_async_close(la, NULL, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    printf("{\"big_submit\": %d, \"big_calls\": %d, \"big_status\": %d, "
           "\"async_acquired\": %d, \"submit_failed\": %d, \"async_ms\": %" PRIu64 ", "
           "\"sync_big\": %d, \"sync_after\": %d, \"sync_after_outcome\": \"%s\", "
           "\"limited_sync\": %d, \"limited_async\": %d, \"loop_close\": %d}\n",
           big_submit, bigreq.calls, bigreq.status, async_acquired, run.submit_failed, async_ms,
           sync_big, sync_after, sync_after_outcome, limited_sync, limited_async,
           uv_loop_close(&loop));
    free(run.reqs);
    free(body);
    return 0;
}

/* ---- async-blocked: a callback blocks the loop, then submits ----------------------------- *
 * async-blocked KEY BLOCK_MS DEADLINE_MS: the first claim's callback sleeps BLOCK_MS (the
 * loop's cached time falls behind) and then submits a claim with DEADLINE_MS, which must
 * get its whole deadline, not fail at once. */

struct blocked {
    struct idem_async *a;
    const char *key;
    unsigned block_ms;
    uint32_t deadline_ms;
    struct asyncReq second;
    int submit_rv;
    uint64_t submitted_at;
    uint64_t answered_at;
};

static void blockedSecondCb(struct idem_async *a, int status, struct idem_result *res,
                            void *data)
{
    struct blocked *b = data;
    asyncCb(a, status, res, &b->second);
    b->answered_at = nowMs();
}

static void blockedFirstCb(struct idem_async *a, int status, struct idem_result *res,
                           void *data)
{
    (void)status;
    (void)res;
    struct blocked *b = data;
    sleepMs(b->block_ms);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("blocked", fp);
    char key[128];
    snprintf(key, sizeof key, "%s-second", b->key);
    struct idem_claim_opts o = {.deadline_ms = b->deadline_ms};
    b->submitted_at = nowMs();
    b->submit_rv = idem_async_claim(a, key, fp, &o, blockedSecondCb, b);
}

static int scAsyncBlocked(int argc, char **argv)
{
    if (argc < 3) {
        return 2;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct blocked b = {.key = argv[0],
                        .block_ms = (unsigned)atoi(argv[1]),
                        .deadline_ms = (uint32_t)atoi(argv[2])};
    b.a = asyncOpen(&loop, 10000);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("blocked", fp);
    if (idem_async_claim(b.a, b.key, fp, NULL, blockedFirstCb, &b) != IDEM_OK) {
        return 1;
    }
    while (idem_async_pending(b.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    struct asyncRun run = {0};
    idem_async_close(b.a, closeCb, &run);
    uv_run(&loop, UV_RUN_DEFAULT);
    printf("{\"submit_rv\": %d, \"calls\": %d, \"status\": %d, \"outcome\": \"%s\", "
           "\"answer_ms\": %" PRIu64 ", \"loop_close\": %d}\n",
           b.submit_rv, b.second.calls, b.second.status, idem_outcome_name(b.second.outcome),
           b.answered_at - b.submitted_at, uv_loop_close(&loop));
    return 0;
}

/* ---- run-badresp: fn answers a header without a name ------------------------------------ *
 * idem_run must refuse it (IDEM_EINVAL after fn ran) without crashing and without
 * completing: the record stays processing. */

static int badRespFn(void *arg, uint64_t token, struct idem_response *response)
{
    (void)arg;
    (void)token;
    static const struct idem_header h[1] = {{.name = NULL, .value = NULL, .value_len = 0}};
    response->status = 200;
    response->headers = h;
    response->n_headers = 1;
    return IDEM_RUN_SUCCEEDED;
}

/* run-badresp and run-bigresp: idem_run with fn (and arg), then a get of the key; prints
 * what the run returned and the record's state (1: processing). */
static int scRunRefused(int argc, char **argv, idem_run_fn fn, void *arg)
{
    if (argc < 1) {
        return 2;
    }
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("refused", fp);
    struct idem_result r, g;
    int rv = idem_run(c, argv[0], fp, NULL, fn, arg, &r);
    int grv = idem_get(c, argv[0], 0, &g);
    printf("{\"rv\": %d, \"ran\": %d, \"finish\": \"%s\", \"has_response\": %d, "
           "\"response_len\": %zu, \"token\": %" PRIu64 ", \"get_rv\": %d, \"state\": %d, "
           "\"detail\": \"",
           rv, r.ran, idem_outcome_name(r.finish_outcome), r.has_response,
           r.has_response ? r.response.body_len : 0, r.token, grv,
           g.has_record ? g.record.state : -1);
    for (const char *p = r.detail; *p; p++) { /* JSON: quotes and backslashes escaped */
        printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    }
    printf("\"}\n");
    idem_result_free(&r);
    idem_result_free(&g);
    idem_client_close(c);
    return 0;
}

/* ---- run-bigresp: fn's response is larger than a log entry may be -------------------------
 * 2 MiB: within the node's frame limit (4 MiB + 128 KiB) but over batch.max_bytes (1 MiB),
 * so the cluster answers the complete `invalid` and changes nothing. */

#define BIG_RESP_LEN (2u << 20)

static int bigRespFn(void *arg, uint64_t token, struct idem_response *response)
{
    (void)token;
    response->status = 200;
    response->body = arg;
    response->body_len = BIG_RESP_LEN;
    return IDEM_RUN_SUCCEEDED;
}

static int scRunBigResp(int argc, char **argv)
{
    uint8_t *body = malloc(BIG_RESP_LEN);
    if (body == NULL) {
        return 1;
    }
    memset(body, 'x', BIG_RESP_LEN);
    int rc = scRunRefused(argc, argv, bigRespFn, body);
    free(body);
    return rc;
}

/* ---- lease: Result.lease_ms of claims and renewals ---------------------------------------- */

static int scLease(int argc, char **argv)
{
    if (argc < 1) {
        return 2;
    }
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("lease", fp);
    char key[128];
    struct idem_result a, b, rn;
    snprintf(key, sizeof key, "%s-asked", argv[0]);
    struct idem_claim_opts o = {.lease_ms = 4321};
    int rv1 = idem_claim(c, key, fp, &o, &a);
    int rv3 = idem_renew(c, key, a.token, 7654, 0, &rn);
    snprintf(key, sizeof key, "%s-default", argv[0]);
    int rv2 = idem_claim(c, key, fp, NULL, &b);
    /* The holder's own retry 1 s into a 3 s lease keeps that lease: 2 s left. */
    struct idem_result r1, r2;
    snprintf(key, sizeof key, "%s-retry", argv[0]);
    struct idem_claim_opts ro = {.lease_ms = 3000, .attempt_id = "retry-attempt"};
    int rv4 = idem_claim(c, key, fp, &ro, &r1);
    sleepMs(1000);
    int rv5 = idem_claim(c, key, fp, &ro, &r2);
    printf("{\"rv\": [%d, %d, %d, %d, %d], \"asked\": %" PRIu64 ", \"default\": %" PRIu64
           ", \"renewed\": %" PRIu64 ", \"renew_outcome\": \"%s\", \"first\": %" PRIu64
           ", \"retry\": %" PRIu64 ", \"retry_outcome\": \"%s\", \"same_token\": %d}\n",
           rv1, rv2, rv3, rv4, rv5, a.lease_ms, b.lease_ms, rn.lease_ms,
           idem_outcome_name(rn.outcome), r1.lease_ms, r2.lease_ms, idem_outcome_name(r2.outcome),
           r1.token == r2.token && r1.token != 0);
    idem_result_free(&a);
    idem_result_free(&b);
    idem_result_free(&rn);
    idem_result_free(&r1);
    idem_result_free(&r2);
    idem_client_close(c);
    return 0;
}

/* ---- run-renewals: idem_run on a holder's own retry of a claim with little lease left -----
 *   run-renewals KEY LEASE_MS LEFT_MS FN_MS
 * Claims KEY (attempt id of its own, LEASE_MS), waits until about LEFT_MS of that lease are
 * left, then idem_run()s KEY with the same attempt id: the claim answers acquired with the
 * lease left (Result.lease_ms), and fn sleeps FN_MS. The test counts the renewals in the
 * Raft log: each renewal grants the whole lease, so they come every third of it, however
 * little was left when fn started. */

static int sleepFn(void *arg, uint64_t token, struct idem_response *resp)
{
    (void)token;
    sleepMs(*(const unsigned *)arg);
    resp->status = 200;
    resp->body = (const uint8_t *)"slept";
    resp->body_len = 5;
    return IDEM_RUN_SUCCEEDED;
}

static int scRunRenewals(int argc, char **argv)
{
    if (argc < 4) {
        return 2;
    }
    const char *key = argv[0];
    uint64_t lease = strtoull(argv[1], NULL, 10);
    uint64_t left = strtoull(argv[2], NULL, 10);
    unsigned fn_ms = (unsigned)strtoul(argv[3], NULL, 10);
    struct idem_client *c = openClient(NULL);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fpOf("renewals", fp);
    char aid[IDEM_ATTEMPT_ID_HEX + 1];
    if (idem_attempt_id_new(aid) != IDEM_OK) {
        die("attempt id", IDEM_ESYS, NULL);
    }
    struct idem_claim_opts o = {.lease_ms = lease, .attempt_id = aid};
    struct idem_result first, r;
    uint64_t t0 = nowMs();
    int rv = idem_claim(c, key, fp, &o, &first);
    if (rv != IDEM_OK) {
        die("claim", rv, &first);
    }
    uint64_t now = nowMs();
    if (t0 + lease > now + left) {
        sleepMs((unsigned)(t0 + lease - left - now));
    }
    rv = idem_run(c, key, fp, &o, sleepFn, &fn_ms, &r);
    printf("{\"first\": \"%s\", \"rv\": %d, \"outcome\": \"%s\", \"ran\": %d, "
           "\"finish\": \"%s\", \"same_token\": %d, \"retry_lease_ms\": %" PRIu64 "}\n",
           idem_outcome_name(first.outcome), rv, idem_outcome_name(r.outcome), r.ran,
           idem_outcome_name(r.finish_outcome), r.token == first.token && r.token != 0,
           r.lease_ms);
    idem_result_free(&first);
    idem_result_free(&r);
    idem_client_close(c);
    return 0;
}

/* ---- serve: one call per line of stdin, one JSON answer per line (tests/chaos) ----------- */

/* Lower-case hex of n bytes at p into a fresh string (the caller frees it). */
static char *hexOf(const void *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *b = p;
    char *out = malloc(2 * n + 1);
    if (out == NULL) {
        fprintf(stderr, "client_driver: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
    return out;
}

/* n bytes of hex into out (OUT, at least strlen(hex) / 2 bytes); false when not hex. */
static bool unhex(const char *hex, uint8_t *out, size_t *n)
{
    size_t len = strlen(hex);
    if (len % 2 != 0) {
        return false;
    }
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            return false;
        }
        out[i] = (uint8_t)v;
    }
    *n = len / 2;
    return true;
}

/* One answer line: the call's return code and the result's fields; the stored response's
 * body and the detail as hex (they are the cluster's bytes, printed without escaping). */
static void servePrint(int rv, const struct idem_result *r)
{
    char *detail = hexOf(r->detail, strlen(r->detail));
    char *body = hexOf(r->has_response ? r->response.body : NULL,
                       r->has_response ? r->response.body_len : 0);
    printf("{\"rv\": \"%s\", \"outcome\": \"%s\", \"token\": %" PRIu64 ", \"takeover\": %d, "
           "\"previous_token\": %" PRIu64 ", \"lease_ms\": %" PRIu64 ", \"has_response\": %d, "
           "\"status\": %u, \"body_hex\": \"%s\", \"detail_hex\": \"%s\"}\n",
           rv == IDEM_OK ? "ok" : idem_strerror(rv), rv == IDEM_OK ? idem_outcome_name(r->outcome) : "",
           r->token, r->takeover, r->previous_token, r->lease_ms, r->has_response,
           r->has_response ? r->response.status : 0, body, detail);
    free(body);
    free(detail);
}

/* serve: a long-lived client for the chaos suite's libidem workers. Each line of stdin is
 * one call; each is answered by one line of JSON on stdout (servePrint), in order:
 *   claim KEY FINGERPRINT_HEX ATTEMPT LEASE_MS takeover|conflict DEADLINE_MS
 *   complete KEY TOKEN STATUS BODY_HEX DEADLINE_MS      (outcome succeeded)
 *   release KEY TOKEN DEADLINE_MS
 * A malformed line is answered {"rv": "usage"}. Ends at end of input. `serve CA`: over TLS,
 * the nodes verified against the CA file (the chaos cluster's nodes serve the RPC over TLS:
 * they send the cluster secret between them). */
static int scServe(int argc, char **argv)
{
    struct idem_options tls = {.seeds = g_seeds,
                               .token = g_token,
                               .default_deadline_ms = 10000,
                               .tls = 1,
                               .tls_ca_file = argc > 0 ? argv[0] : NULL};
    struct idem_client *c = openClient(argc > 0 ? &tls : NULL);
    char line[4096];
    while (fgets(line, sizeof line, stdin) != NULL) {
        char op[16], key[256], a[1100], b[80], d[16];
        unsigned long long n1 = 0, n2 = 0, n3 = 0;
        struct idem_result r;
        memset(&r, 0, sizeof r);
        int rv = IDEM_EINVAL;
        bool ok = false;
        if (sscanf(line, "%15s", op) != 1) {
            op[0] = '\0';
        }
        if (strcmp(op, "claim") == 0 &&
            sscanf(line, "%*s %255s %1099s %79s %llu %15s %llu", key, a, b, &n1, d, &n2) == 6) {
            uint8_t fp[IDEM_FINGERPRINT_LEN + 1];
            size_t fplen = 0;
            if (unhex(a, fp, &fplen) && fplen == IDEM_FINGERPRINT_LEN) {
                struct idem_claim_opts o = {
                    .attempt_id = b,
                    .lease_ms = n1,
                    .policy = strcmp(d, "takeover") == 0 ? IDEM_POLICY_TAKEOVER
                                                         : IDEM_POLICY_CONFLICT,
                    .deadline_ms = (uint32_t)n2,
                };
                rv = idem_claim(c, key, fp, &o, &r);
                ok = true;
            }
        } else if (strcmp(op, "complete") == 0 &&
                   sscanf(line, "%*s %255s %llu %llu %1099s %llu", key, &n1, &n2, a, &n3) == 5) {
            uint8_t body[550];
            size_t blen = 0;
            if (unhex(a, body, &blen)) {
                struct idem_response resp = {.status = (uint32_t)n2, .body = body,
                                             .body_len = blen};
                rv = idem_complete(c, key, n1, IDEM_COMPLETION_SUCCEEDED, &resp, (uint32_t)n3, &r);
                ok = true;
            }
        } else if (strcmp(op, "release") == 0 &&
                   sscanf(line, "%*s %255s %llu %llu", key, &n1, &n2) == 3) {
            rv = idem_release(c, key, n1, (uint32_t)n2, &r);
            ok = true;
        }
        if (!ok) {
            printf("{\"rv\": \"usage\"}\n");
            continue;
        }
        servePrint(rv, &r);
        idem_result_free(&r);
    }
    idem_client_close(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: client_driver SCENARIO SEEDS TOKEN [ARGS...]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *sc = argv[1];
    g_seeds = argv[2];
    g_token = argv[3];
    argc -= 4;
    argv += 4;
    if (strcmp(sc, "attempt") == 0) {
        return scAttempt(argc, argv);
    }
    if (strcmp(sc, "ops") == 0) {
        return scOps(argc, argv);
    }
    if (strcmp(sc, "async-stream") == 0) {
        return scAsyncStream(argc, argv);
    }
    if (strcmp(sc, "async-ops") == 0) {
        return scAsyncOps(argc, argv);
    }
    if (strcmp(sc, "loop") == 0) {
        return scLoop(argc, argv);
    }
    if (strcmp(sc, "deadline") == 0) {
        return scDeadline(argc, argv);
    }
    if (strcmp(sc, "async-many") == 0) {
        return scAsyncMany(argc, argv);
    }
    if (strcmp(sc, "async-tls") == 0 && argc >= 4) {
        /* async-tls PREFIX N DEADLINE CA [SERVER_NAME] */
        g_tls_ca = argv[3];
        g_tls_name = argc > 4 && argv[4][0] ? argv[4] : NULL;
        return scAsyncMany(3, argv);
    }
    if (strcmp(sc, "async-refused") == 0) {
        return scAsyncRefused(argc, argv);
    }
    if (strcmp(sc, "async-close") == 0) {
        return scAsyncClose(argc, argv);
    }
    if (strcmp(sc, "run-bigresp") == 0) {
        return scRunBigResp(argc, argv);
    }
    if (strcmp(sc, "run-badresp") == 0) {
        return scRunRefused(argc, argv, badRespFn, NULL);
    }
    if (strcmp(sc, "run-lapse") == 0) {
        return scRunLapse(argc, argv);
    }
    if (strcmp(sc, "run-renewals") == 0) {
        return scRunRenewals(argc, argv);
    }
    if (strncmp(sc, "run-", 4) == 0) {
        return scRun(sc, argc, argv);
    }
    if (strcmp(sc, "tls") == 0) {
        return scTls(argc, argv);
    }
    if (strcmp(sc, "claims") == 0) {
        return scClaims(argc, argv);
    }
    if (strcmp(sc, "big") == 0) {
        return scBig(argc, argv);
    }
    if (strcmp(sc, "async-blocked") == 0) {
        return scAsyncBlocked(argc, argv);
    }
    if (strcmp(sc, "lease") == 0) {
        return scLease(argc, argv);
    }
    if (strcmp(sc, "serve") == 0) {
        return scServe(argc, argv);
    }
    fprintf(stderr, "client_driver: unknown scenario %s\n", sc);
    return 2;
}
