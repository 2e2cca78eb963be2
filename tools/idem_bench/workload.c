/* workload: what one operation of idem-bench is. The names of its key, attempt id and
 * fingerprint (keys are "bench-<run id>-...", so that reruns against the same cluster never
 * collide), the synchronous calls the --threads closed loop and the replay setup make, the
 * counters of a worker, and the key set of replay and contention (for replay claimed and
 * completed before the run). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "bench.h"
#include "dec.h"

uint64_t workload_rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void workload_random_fill(uint64_t *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = workload_rng_next(s);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(out + i, &r, k);
    }
}

uint64_t workload_seed(void)
{
    uint64_t s;
    if (RAND_bytes((unsigned char *)&s, (int)sizeof s) != 1) {
        s = bench_now_us() ^ ((uint64_t)getpid() << 40);
    }
    return s;
}

/* Copies s (without its NUL) to out; returns its length. */
static size_t putStr(char *out, const char *s)
{
    size_t n = strlen(s);
    memcpy(out, s, n);
    return n;
}

void workload_name_op(struct worker *w, bool open, uint64_t n, struct op_names *out)
{
    struct bench *b = w->b;
    if (bench_uses_key_set(&b->cfg)) {
        out->sk = &b->set[workload_rng_next(&w->rng) % b->cfg.keys];
        if (open) {
            snprintf(out->attempt, sizeof out->attempt, "r-%" PRIu64 "-%016" PRIx64, n,
                     workload_rng_next(&w->rng));
        } else {
            snprintf(out->attempt, sizeof out->attempt, "r%u-%" PRIu64 "-%016" PRIx64,
                     w->index, n, workload_rng_next(&w->rng));
        }
        return;
    }
    out->sk = NULL;
    _Static_assert(sizeof out->key >= sizeof "bench--" + sizeof b->run_id + 2 * DEC_U64_MAX,
                   "op_names.key");
    _Static_assert(sizeof out->attempt >= sizeof "a-" + 2 * DEC_U64_MAX, "op_names.attempt");
    /* A new key per operation, on the generator's critical path in a closed loop: its digits
     * by hand, not through printf ("bench-RUN-o-N" and "a-N", or "bench-RUN-W-N" and
     * "aW-N" on threads). */
    size_t k = putStr(out->key, "bench-");
    k += putStr(out->key + k, b->run_id);
    size_t a = putStr(out->attempt, "a");
    if (open) {
        k += putStr(out->key + k, "-o");
    } else {
        out->key[k++] = '-';
        k += dec_u64(out->key + k, w->index);
        a += dec_u64(out->attempt + a, w->index);
    }
    out->key[k++] = '-';
    out->key[k + dec_u64(out->key + k, n)] = '\0';
    out->attempt[a++] = '-';
    out->attempt[a + dec_u64(out->attempt + a, n)] = '\0';
    workload_random_fill(&w->rng, out->fpbuf, sizeof out->fpbuf);
}

/* ---- a worker's counters ------------------------------------------------------------- */

void workload_note_error(struct worker *w, const char *fmt, ...)
{
    if (w->first_error[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first_error, sizeof w->first_error, fmt, ap);
    va_end(ap);
}

size_t workload_outcome_slot(int rv, Idem__Outcome o)
{
    if (rv != IDEM_OK) {
        return OUTC_NONE;
    }
    return (unsigned)o < OUTC_OTHER ? (size_t)o : OUTC_OTHER;
}

void workload_count_call(struct worker *w, int rv)
{
    if (rv == IDEM_OK) {
        w->answered++;
    } else {
        w->transport++;
    }
}

void workload_finish(struct worker *w, bool ok)
{
    struct bench *b = w->b;
    if (ok) {
        w->ops++;
        atomic_fetch_add_explicit(&b->succeeded, 1, memory_order_relaxed);
    } else {
        w->errors++;
        atomic_fetch_add_explicit(&b->failed, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&b->done, 1, memory_order_relaxed);
}

/* ---- synchronous calls --------------------------------------------------------------- */

/* Makes the call req (`what`: "claim", ...). Returns the outcome, or UNSPECIFIED with *rv
 * set when there was no answer; err (OUT) says what came back, for the first error.
 * *token (OUT, if not NULL) gets the fencing token when acquired. */
static Idem__Outcome syncCall(struct idem_client *c, const char *what, const Idem__Request *req,
                              uint32_t deadline_ms, uint64_t *token, int *rv, char *err,
                              size_t errlen)
{
    Idem__Response *resp = NULL;
    char why[512];
    *rv = idem_call_why(c, req, deadline_ms, &resp, why, sizeof why);
    if (*rv != IDEM_OK) {
        snprintf(err, errlen, "%s: %s: %s", what, idem_strerror(*rv), why);
        return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    }
    Idem__Outcome o = idem_response_outcome(resp);
    if (o == IDEM__OUTCOME__OUTCOME_ACQUIRED && token != NULL) {
        *token = resp->result->token;
    }
    snprintf(err, errlen, "%s: %s%s%s", what, idem_outcome_name((int)o),
             resp->error[0] ? ": " : "", resp->error);
    idem__response__free_unpacked(resp, NULL);
    return o;
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
    return syncCall(c, "claim", &req, deadline_ms, token, rv, err, errlen);
}

/* Completes key (held with token) with the response 200 "ok". */
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
    return syncCall(c, "complete", &req, deadline_ms, NULL, rv, err, errlen);
}

/* Releases key (held with token). */
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
    return syncCall(c, "release", &req, deadline_ms, NULL, rv, err, errlen);
}

/* The call after an acquired claim: complete (claim-complete) or release (contention),
 * unless too little of the run is left; true when it answered ok. */
static bool followUp(struct worker *w, struct idem_client *c, const char *key, uint64_t token)
{
    struct bench *b = w->b;
    bool complete = b->cfg.workload == WL_CLAIM_COMPLETE;
    char err[600];
    int rv = IDEM_OK;
    if (!bench_follow_up_fits(b)) {
        workload_note_error(w, "%s: " CUT_OFF, complete ? "complete" : "release");
        return false;
    }
    Idem__Outcome o = complete ? doComplete(c, bench_call_deadline(b), key, token, &rv, err,
                                            sizeof err)
                               : doRelease(c, bench_call_deadline(b), key, token, &rv, err,
                                           sizeof err);
    workload_count_call(w, rv);
    if (o != IDEM__OUTCOME__OUTCOME_OK) {
        workload_note_error(w, "%s", err);
        return false;
    }
    return true;
}

bool workload_op(struct worker *w, struct idem_client *c)
{
    struct bench *b = w->b;
    enum workload wl = b->cfg.workload;
    struct op_names on;
    char err[600];
    uint64_t token = 0;
    int rv = IDEM_OK;
    workload_name_op(w, false, w->seq++, &on);
    Idem__Outcome o = doClaim(c, bench_call_deadline(b), workload_key(&on), workload_fp(&on),
                              on.attempt, &token, &rv, err, sizeof err);
    workload_count_call(w, rv);
    w->outcomes[workload_outcome_slot(rv, o)]++;
    if (wl == WL_CONTENTION && o == IDEM__OUTCOME__OUTCOME_IN_PROGRESS) {
        return true; /* another operation holds the key: expected too */
    }
    Idem__Outcome want =
        wl == WL_REPLAY ? IDEM__OUTCOME__OUTCOME_REPLAY : IDEM__OUTCOME__OUTCOME_ACQUIRED;
    if (o != want) {
        workload_note_error(w, "%s", err);
        return false;
    }
    if (wl == WL_REPLAY || wl == WL_FRESH) {
        return true;
    }
    return followUp(w, c, workload_key(&on), token);
}

/* ---- the key set --------------------------------------------------------------------- */

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
                bench_error("replay setup, key %u of %u: %s", i + 1, b->cfg.keys, err);
                s->code = rv == IDEM_EUNAVAILABLE ? EXIT_UNAVAILABLE : EXIT_SETUP;
            }
            pthread_mutex_unlock(&s->lock);
            atomic_store(&s->failed, true);
            return NULL;
        }
    }
}

/* Claims and completes every key of the set, SETUP_THREADS at a time. */
static int setupReplay(struct bench *b, struct idem_client *c)
{
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

int workload_setup_set(struct bench *b, struct idem_client *c)
{
    uint64_t rng = workload_seed();
    b->set = calloc(b->cfg.keys, sizeof *b->set);
    if (b->set == NULL) {
        bench_error("out of memory");
        return EXIT_SETUP;
    }
    for (unsigned i = 0; i < b->cfg.keys; i++) {
        struct set_key *sk = &b->set[i];
        snprintf(sk->key, sizeof sk->key, "bench-%s-%s-%u", b->run_id,
                 b->cfg.workload == WL_REPLAY ? "replay" : "hot", i);
        workload_random_fill(&rng, sk->fp, sizeof sk->fp);
    }
    if (b->cfg.workload != WL_REPLAY) {
        return EXIT_RAN;
    }
    return setupReplay(b, c);
}
