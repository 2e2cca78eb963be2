/* run.c: idem_run(), a business function run at most once per key: claim, run with the
 * lease renewed by a background thread, then complete or release by the function's own
 * classification (docs/contract.md). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "renew_plan.h"

#define LEASE_GUESS_MS 1000 /* when the lease cannot be estimated */

struct renewer {
    struct idem_client *c;
    const char *key; /* borrowed from idem_run's caller, for the run's duration */
    uint64_t token;
    uint64_t lease_ms;     /* sent with each renewal; 0: the tenant's default */
    uint64_t lease_est_ms; /* the lease granted (or asked for, or guessed): the schedule's */
    uint64_t lease_end;    /* IdemNowMs() by which the lease ends at the latest */
    uint64_t last_ok;      /* IdemNowMs() when the last renewal that succeeded was sent */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    bool stop;
    bool lost;           /* a renewal answered lease_lost or not_found */
    bool lapsed;         /* the lease ended with no renewal answered in time */
    unsigned renewals;   /* answered ok */
    int last_error;      /* of the last failed renewal call, or IDEM_OK */
};

static void monotonicAt(struct timespec *ts, uint64_t at_ms)
{
    ts->tv_sec = (time_t)(at_ms / 1000);
    ts->tv_nsec = (long)(at_ms % 1000) * 1000000L;
}

static void *renewerMain(void *arg)
{
    struct renewer *r = arg;
    bool failed = false;
    pthread_mutex_lock(&r->mu);
    while (!r->stop && !r->lost) {
        uint64_t at_ms;
        uint32_t dl;
        renew_plan(IdemNowMs(), r->lease_est_ms, r->lease_end, r->last_ok, failed,
                      r->renewals == 0, &at_ms, &dl);
        struct timespec at;
        monotonicAt(&at, at_ms);
        int w = 0;
        while (!r->stop && w != ETIMEDOUT) {
            w = pthread_cond_timedwait(&r->cond, &r->mu, &at);
        }
        if (r->stop) {
            break;
        }
        pthread_mutex_unlock(&r->mu);
        struct idem_result res;
        uint64_t sent = IdemNowMs();
        int rv = idem_renew(r->c, r->key, r->token, r->lease_ms, dl, &res);
        uint64_t back = IdemNowMs();
        pthread_mutex_lock(&r->mu);
        failed = rv != IDEM_OK;
        if (rv != IDEM_OK) {
            r->last_error = rv; /* tried again soon (renew_plan) */
        } else if (res.outcome == IDEM_OUTCOME_OK) {
            r->renewals++;
            if (back > r->lease_end) {
                r->lapsed = true; /* renewed, but after the lease had ended */
            }
            /* The schedule follows the lease this renewal granted (the claim's answer may
             * have been only what was left of a lease, on a holder's own retry): as the
             * node says, else as asked, else as before. */
            if (res.lease_ms != 0) {
                r->lease_est_ms = res.lease_ms;
            } else if (r->lease_ms != 0) {
                r->lease_est_ms = r->lease_ms;
            }
            /* The lease now runs from when the node applied the renewal, after it was
             * sent: counting from the send is on the safe side. */
            r->last_ok = sent;
            r->lease_end = sent + r->lease_est_ms;
        } else if (res.outcome == IDEM_OUTCOME_LEASE_LOST ||
                   res.outcome == IDEM_OUTCOME_NOT_FOUND) {
            r->lost = true;
        } else {
            failed = true; /* e.g. unavailable (no quorum) answered by a node */
            r->last_error = IDEM_EUNAVAILABLE;
        }
        idem_result_free(&res);
    }
    if (!r->lost && IdemNowMs() > r->lease_end) {
        r->lapsed = true;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static int completionOf(int cls)
{
    switch (cls) {
    case IDEM_RUN_SUCCEEDED:
        return IDEM_COMPLETION_SUCCEEDED;
    case IDEM_RUN_FAILED_FINAL:
        return IDEM_COMPLETION_FAILED_FINAL;
    default:
        return IDEM_COMPLETION_UNKNOWN;
    }
}

/* Sets up r's lock and its condition (timed on CLOCK_MONOTONIC, as renewerMain waits) and
 * starts the renewer on *th. False if any of it failed; nothing is left to destroy then. */
static bool renewerStart(struct renewer *r, pthread_t *th)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        return false;
    }
    bool ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&r->cond, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        return false;
    }
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        pthread_cond_destroy(&r->cond);
        return false;
    }
    if (pthread_create(th, NULL, renewerMain, r) != 0) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->mu);
        return false;
    }
    return true;
}

/* The renewer could not be started: fn does not run (without renewals a slow fn could lose
 * its lease unnoticed), and the claim is given back. Fills *out; returns IDEM_ESYS. */
static int runRefuse(struct idem_client *c, const char *key, uint64_t token, uint32_t deadline_ms,
                     struct idem_result *out)
{
    struct idem_result rel;
    int rrv = idem_release(c, key, token, deadline_ms, &rel);
    bool released = rrv == IDEM_OK && rel.outcome == IDEM_OUTCOME_OK;
    char rwhy[96];
    snprintf(rwhy, sizeof rwhy, "%s",
             rrv != IDEM_OK ? idem_strerror(rrv) : idem_outcome_name(rel.outcome));
    idem_result_free(&rel);
    idem_result_free(out);
    if (released) {
        IdemResultFail(out, "cannot start the lease renewal thread; claim released");
    } else {
        IdemResultFail(out,
                       "cannot start the lease renewal thread; the release answered %s: "
                       "the claim is held until its lease ends",
                       rwhy);
    }
    return IDEM_ESYS;
}

/* Stops the renewer started by renewerStart, waits for it (and a renewal in flight) and
 * tears down its lock and condition. */
static void renewerStop(struct renewer *r, pthread_t th)
{
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->mu);
    pthread_join(th, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
}

/* What the renewals saw, into note (len bytes; "" when nothing went wrong): put at the head
 * of detail whatever follows (a lease most often lapses in an outage, when the complete or
 * release fails too), kept short so that what follows has room. */
static void leaseNote(const struct renewer *r, char *note, size_t len)
{
    note[0] = '\0';
    if (r->lost) {
        snprintf(note, len, "lease lost while fn ran (a renewal answered lease_lost)");
    } else if (r->lapsed) {
        IdemWhyf(note, len,
                 "lease may have lapsed while fn ran: no renewal answered in time (last "
                 "renewal error: %s)",
                 r->last_error != IDEM_OK ? idem_strerror(r->last_error) : "none");
    }
}

/* The complete (or release) after fn ran, with class `cls` and fn's response; *out says
 * what it came to behind lease_note (what the renewals saw) and `sep`. */
static int runFinish(struct idem_client *c, const char *key, uint64_t token, int cls,
                     const struct idem_response *resp, uint32_t deadline_ms, bool lost,
                     const char *lease_note, const char *sep, struct idem_result *out)
{
    struct idem_result fin;
    int rv;
    const char *what = cls == IDEM_RUN_RETRYABLE ? "release" : "complete";
    if (cls == IDEM_RUN_RETRYABLE) {
        rv = idem_release(c, key, token, deadline_ms, &fin);
    } else {
        rv = idem_complete(c, key, token, completionOf(cls), resp, deadline_ms, &fin);
    }
    if (rv != IDEM_OK) {
        IdemWhyf(out->detail, sizeof out->detail, "%s%s%s after the function ran: %s", lease_note,
                 sep, what, fin.detail);
        return rv;
    }
    out->finish_outcome = fin.outcome;
    if (fin.outcome == IDEM_OUTCOME_INVALID) {
        /* The cluster refused it and changed nothing (e.g. a complete larger than the
         * leader's batch.max_bytes lets a log entry be): as with a response refused here,
         * the claim stays held until its lease ends or the caller completes it. */
        IdemWhyf(out->detail, sizeof out->detail,
                 "%s%s%s answered invalid (%s): nothing was recorded, the claim is held "
                 "until its lease ends",
                 lease_note, sep, what, fin.detail[0] ? fin.detail : "no reason given");
        idem_result_free(&fin);
        return IDEM_EINVAL;
    }
    if (fin.outcome != IDEM_OUTCOME_OK && !lost) {
        IdemWhyf(out->detail, sizeof out->detail, "%s%s%s answered %s%s%s", lease_note, sep, what,
                 idem_outcome_name(fin.outcome), fin.detail[0] ? ": " : "", fin.detail);
    }
    idem_result_free(&fin);
    return IDEM_OK;
}

int idem_run(struct idem_client *c, const char *key,
             const uint8_t fingerprint[IDEM_FINGERPRINT_LEN], const struct idem_claim_opts *opts,
             idem_run_fn fn, void *arg, struct idem_result *out)
{
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    if (fn == NULL) {
        IdemResultFail(out, "NULL business function");
        return IDEM_EINVAL;
    }
    static const struct idem_claim_opts none;
    const struct idem_claim_opts *o = opts != NULL ? opts : &none;
    uint64_t claim_sent = IdemNowMs();
    int rv = idem_claim(c, key, fingerprint, o, out); /* makes the attempt id when o has none */
    if (rv != IDEM_OK || out->outcome != IDEM_OUTCOME_ACQUIRED) {
        return rv; /* replay, in_progress, mismatch, ...: fn does not run */
    }
    uint64_t token = out->token;
    uint32_t deadline_ms = o->deadline_ms;

    /* The renewal interval: a third of the lease the node says it granted (Result.lease_ms;
     * on a holder's own retry of its claim, what is left of its lease), or of the one asked
     * for, or of LEASE_GUESS_MS from a node that does not say; from the first renewal on, a
     * third of the lease each renewal granted. Never from lease_deadline_ms: that is the
     * leader's wall clock, and ours may be skewed. The renewer times itself on
     * CLOCK_MONOTONIC. */
    uint64_t lease = out->lease_ms ? out->lease_ms : o->lease_ms ? o->lease_ms : LEASE_GUESS_MS;
    struct renewer r = {.c = c,
                        .key = key,
                        .token = token,
                        .lease_ms = o->lease_ms,
                        .lease_est_ms = lease,
                        .lease_end = claim_sent + lease,
                        .last_ok = claim_sent};
    pthread_t th;
    if (!renewerStart(&r, &th)) {
        return runRefuse(c, key, token, deadline_ms, out);
    }

    struct idem_response resp;
    memset(&resp, 0, sizeof resp);
    int cls = fn(arg, token, &resp);
    if (cls < IDEM_RUN_SUCCEEDED || cls > IDEM_RUN_UNKNOWN) {
        cls = IDEM_RUN_UNKNOWN;
    }
    renewerStop(&r, th);

    out->ran = 1;
    out->run_class = cls;
    char lease_note[160];
    leaseNote(&r, lease_note, sizeof lease_note);
    const char *sep = lease_note[0] != '\0' ? "; " : "";
    snprintf(out->detail, sizeof out->detail, "%s", lease_note);
    if (cls != IDEM_RUN_RETRYABLE) {
        /* Checked before anything is copied or sent: a response that cannot be stored
         * (a NULL header name, a NULL body with a length) changes nothing; the claim stays
         * held until its lease ends or the caller completes it with out->token. */
        struct idem_op op = {.kind = IDEM_OP_COMPLETE,
                             .key = key,
                             .token = token,
                             .completion = completionOf(cls),
                             .response = &resp};
        struct idem_built b;
        char why[256];
        int vrv = IdemOpBuild(&op, &b, why, sizeof why);
        IdemBuiltFree(&b);
        if (vrv != IDEM_OK) {
            IdemWhyf(out->detail, sizeof out->detail,
                     "%s%sthe function's response cannot be stored (%s); nothing was "
                     "completed, the claim is held until its lease ends",
                     lease_note, sep, why);
            return vrv == IDEM_ENOMEM ? IDEM_ENOMEM : IDEM_EINVAL;
        }
        if (IdemResultCopyResponse(out, &resp) != IDEM_OK) {
            /* The complete below still stores fn's response; only our copy is missing. */
            size_t n = strlen(lease_note);
            snprintf(lease_note + n, sizeof lease_note - n, "%sout of memory copying the response",
                     sep);
            sep = "; ";
            snprintf(out->detail, sizeof out->detail, "%s", lease_note);
        }
    }
    return runFinish(c, key, token, cls, &resp, deadline_ms, r.lost, lease_note, sep, out);
}
