/* Unit tests of the state machine: every outcome of docs/contract.md against the pure FSM.
 *
 * The first test is a table of scenarios: each is a list of steps (an operation, the leader
 * clock, and the expected outcome), where a step may use the token granted by an earlier
 * step. The tests after it check properties that a table cannot say well: token values,
 * retry-after, stored bytes, expiry order, quotas, and malformed input. The last one applies
 * thousands of random commands to two state machines in lockstep, one of them restored from
 * snapshots of itself, and checks that they never disagree (IDEM_SEED replays a run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm_helpers.h"
#include "prefault_thread.h"

#define ACQ IDEM__OUTCOME__OUTCOME_ACQUIRED
#define REPLAY IDEM__OUTCOME__OUTCOME_REPLAY
#define INPROG IDEM__OUTCOME__OUTCOME_IN_PROGRESS
#define MISMATCH IDEM__OUTCOME__OUTCOME_MISMATCH
#define LEXP IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED
#define UNKNOWN IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN
#define EXPIRED IDEM__OUTCOME__OUTCOME_EXPIRED
#define OK IDEM__OUTCOME__OUTCOME_OK
#define LOST IDEM__OUTCOME__OUTCOME_LEASE_LOST
#define NOTFOUND IDEM__OUTCOME__OUTCOME_NOT_FOUND
#define QUOTA IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED
#define INVALID IDEM__OUTCOME__OUTCOME_INVALID

#define SUCCEEDED IDEM__COMPLETION__COMPLETION_SUCCEEDED
#define FAILED IDEM__COMPLETION__COMPLETION_FAILED_FINAL
#define UNKNOWN_C IDEM__COMPLETION__COMPLETION_UNKNOWN

#define TAKEOVER IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
#define CONFLICT IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT

/* ---- the scenario table -------------------------------------------------------------- */

enum op { END = 0, CLAIM, COMPLETE, RELEASE, RENEW, GET, EXPIRE, RESOLVE_REL, RESOLVE_RESP };

struct step {
    enum op op;
    uint64_t now;
    uint8_t fp;            /* claim: fingerprint byte (default 1) */
    const char *attempt;   /* claim */
    Idem__LeasePolicy policy;
    int tok;               /* complete/release/renew: token of step `tok` (1-based); 0: 999 */
    Idem__Completion completion;
    Idem__Outcome expect;
};

struct scenario {
    const char *name;
    struct step steps[10];
};

/* All steps act on tenant "t1", key "k"; lease 1000 ms, ttl 10000 ms. */
static const struct scenario scenarios[] = {
    {"fresh key is acquired", {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}}},
    {"retry during the lease is in progress",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {CLAIM, 500, 1, NULL, 0, 0, 0, INPROG}}},
    {"completed key replays",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {CLAIM, 20, 1, NULL, 0, 0, 0, REPLAY}}},
    {"failed_final replays too",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, FAILED, OK},
      {CLAIM, 20, 1, NULL, 0, 0, 0, REPLAY}}},
    {"other fingerprint is a mismatch while processing",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {CLAIM, 10, 2, NULL, 0, 0, 0, MISMATCH}}},
    {"other fingerprint is a mismatch when completed, record untouched",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {CLAIM, 20, 2, NULL, 0, 0, 0, MISMATCH},
      {CLAIM, 30, 1, NULL, 0, 0, 0, REPLAY}}},
    {"lease passed, policy conflict",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {CLAIM, 1000, 1, NULL, CONFLICT, 0, 0, LEXP}}},
    {"lease passed, unspecified policy means conflict",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {CLAIM, 5000, 1, NULL, 0, 0, 0, LEXP}}},
    {"lease passed, policy takeover",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {CLAIM, 1000, 1, NULL, TAKEOVER, 0, 0, ACQ},
      {COMPLETE, 1010, 0, NULL, 0, 1, SUCCEEDED, LOST},
      {COMPLETE, 1020, 0, NULL, 0, 2, SUCCEEDED, OK}}},
    {"takeover before the lease passed is in progress",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {CLAIM, 999, 1, NULL, TAKEOVER, 0, 0, INPROG}}},
    {"same attempt id gets its lease back",
     {{CLAIM, 0, 1, "a1", 0, 0, 0, ACQ}, {CLAIM, 10, 1, "a1", 0, 0, 0, ACQ}}},
    {"another attempt id is in progress",
     {{CLAIM, 0, 1, "a1", 0, 0, 0, ACQ}, {CLAIM, 10, 1, "a2", 0, 0, 0, INPROG}}},
    {"unknown outcome quarantines",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {CLAIM, 5000, 1, NULL, TAKEOVER, 0, 0, UNKNOWN},
      {CLAIM, 5000, 1, "a9", TAKEOVER, 0, 0, UNKNOWN}}},
    {"resolve ends a quarantine with release",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {RESOLVE_REL, 20, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 30, 1, NULL, 0, 0, 0, ACQ}}},
    {"resolve ends a quarantine with a response",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {RESOLVE_RESP, 20, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 30, 1, NULL, 0, 0, 0, REPLAY}}},
    {"resolve of an unknown key", {{RESOLVE_REL, 0, 0, NULL, 0, 0, 0, NOTFOUND}}},
    {"complete is idempotent for the same token; another outcome is refused",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {COMPLETE, 20, 0, NULL, 0, 1, SUCCEEDED, OK},
      {COMPLETE, 30, 0, NULL, 0, 1, FAILED, LOST},
      {COMPLETE, 35, 0, NULL, 0, 1, UNKNOWN_C, LOST},
      {CLAIM, 40, 1, NULL, 0, 0, 0, REPLAY}}},
    {"a quarantine is not ended by its own token completing otherwise",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {COMPLETE, 20, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {COMPLETE, 30, 0, NULL, 0, 1, SUCCEEDED, LOST},
      {CLAIM, 40, 1, NULL, 0, 0, 0, UNKNOWN}}},
    {"complete with a stale token is lease_lost",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {COMPLETE, 10, 0, NULL, 0, 0, SUCCEEDED, LOST}}},
    {"complete of an unknown key", {{COMPLETE, 0, 0, NULL, 0, 0, SUCCEEDED, NOTFOUND}}},
    {"release deletes: the next claim runs again",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RELEASE, 10, 0, NULL, 0, 1, 0, OK},
      {GET, 20, 0, NULL, 0, 0, 0, NOTFOUND},
      {CLAIM, 30, 2, NULL, 0, 0, 0, ACQ}}},
    {"release is idempotent for the same token",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RELEASE, 10, 0, NULL, 0, 1, 0, OK},
      {RELEASE, 20, 0, NULL, 0, 1, 0, OK}}},
    {"release with a stale token is lease_lost",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {RELEASE, 10, 0, NULL, 0, 0, 0, LOST}}},
    {"release after complete is lease_lost and keeps the response",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {RELEASE, 20, 0, NULL, 0, 1, 0, LOST},
      {CLAIM, 30, 1, NULL, 0, 0, 0, REPLAY}}},
    {"release of an unknown key", {{RELEASE, 0, 0, NULL, 0, 0, 0, NOTFOUND}}},
    {"old holder cannot release after a takeover",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {CLAIM, 2000, 1, NULL, TAKEOVER, 0, 0, ACQ},
      {RELEASE, 2010, 0, NULL, 0, 1, 0, LOST}}},
    {"renew extends the lease",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RENEW, 900, 0, NULL, 0, 1, 0, OK},
      {CLAIM, 1500, 1, NULL, TAKEOVER, 0, 0, INPROG}}},
    {"renew with a stale token is lease_lost",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {RENEW, 10, 0, NULL, 0, 0, 0, LOST}}},
    {"renew after complete is lease_lost",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {RENEW, 20, 0, NULL, 0, 1, 0, LOST}}},
    {"renew of an unknown key", {{RENEW, 0, 0, NULL, 0, 0, 0, NOTFOUND}}},
    {"get of an unknown key", {{GET, 0, 0, NULL, 0, 0, 0, NOTFOUND}}},
    {"get of a claimed key", {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {GET, 10, 0, NULL, 0, 0, 0, OK}}},
    {"ttl passed: tombstone answers expired, then the key is new again",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {EXPIRE, 10000, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 10001, 1, NULL, 0, 0, 0, EXPIRED},
      {GET, 10002, 0, NULL, 0, 0, 0, OK},
      {COMPLETE, 10003, 0, NULL, 0, 1, SUCCEEDED, NOTFOUND},
      {EXPIRE, 20000, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 20001, 1, NULL, 0, 0, 0, ACQ}}},
    {"expire before the ttl changes nothing",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {EXPIRE, 9999, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 9999, 1, NULL, 0, 0, 0, REPLAY}}},
    {"tombstone of another fingerprint is a mismatch",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {EXPIRE, 10000, 0, NULL, 0, 0, 0, OK},
      {CLAIM, 10001, 2, NULL, 0, 0, 0, MISMATCH}}},
    {"complete after the lease passed, nobody took over",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {CLAIM, 1500, 1, NULL, CONFLICT, 0, 0, LEXP},
      {COMPLETE, 2000, 0, NULL, 0, 1, SUCCEEDED, OK},
      {CLAIM, 2010, 1, NULL, 0, 0, 0, REPLAY}}},
    {"renew after the lease passed, nobody took over",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RENEW, 1500, 0, NULL, 0, 1, 0, OK},
      {CLAIM, 2000, 1, NULL, TAKEOVER, 0, 0, INPROG}}},

    {"a quarantined record refuses release and renew",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {RELEASE, 20, 0, NULL, 0, 1, 0, LOST},
      {RENEW, 30, 0, NULL, 0, 1, 0, LOST},
      {CLAIM, 40, 2, NULL, 0, 0, 0, MISMATCH},
      {CLAIM, 50, 1, NULL, 0, 0, 0, UNKNOWN}}},
    {"a released marker is not found but for a repeated release",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RELEASE, 10, 0, NULL, 0, 1, 0, OK},
      {RELEASE, 20, 0, NULL, 0, 0, 0, NOTFOUND},
      {RENEW, 30, 0, NULL, 0, 1, 0, NOTFOUND},
      {COMPLETE, 40, 0, NULL, 0, 1, SUCCEEDED, NOTFOUND},
      {RESOLVE_REL, 50, 0, NULL, 0, 0, 0, NOTFOUND},
      {RELEASE, 60, 0, NULL, 0, 1, 0, OK}}},
    {"a tombstone is not found by release, renew and resolve",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {EXPIRE, 10000, 0, NULL, 0, 0, 0, OK},
      {RELEASE, 10010, 0, NULL, 0, 1, 0, NOTFOUND},
      {RENEW, 10020, 0, NULL, 0, 1, 0, NOTFOUND},
      {RESOLVE_REL, 10030, 0, NULL, 0, 0, 0, NOTFOUND},
      {RESOLVE_RESP, 10040, 0, NULL, 0, 0, 0, NOTFOUND},
      {CLAIM, 10050, 1, NULL, 0, 0, 0, EXPIRED}}},
    {"a claim after a release takes the new fingerprint",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {RELEASE, 10, 0, NULL, 0, 1, 0, OK},
      {CLAIM, 20, 2, NULL, 0, 0, 0, ACQ},
      {CLAIM, 30, 2, NULL, 0, 0, 0, INPROG},
      {CLAIM, 40, 1, NULL, 0, 0, 0, MISMATCH},
      {RELEASE, 50, 0, NULL, 0, 1, 0, LOST}}},
    {"the old holder's attempt id after a takeover is in progress",
     {{CLAIM, 0, 1, "a1", 0, 0, 0, ACQ},
      {CLAIM, 1000, 1, "a2", TAKEOVER, 0, 0, ACQ},
      {CLAIM, 1100, 1, "a1", 0, 0, 0, INPROG},
      {CLAIM, 1200, 1, "a2", 0, 0, 0, ACQ}}},
    {"resolve with release deletes the record: the old token finds nothing",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, UNKNOWN_C, OK},
      {RESOLVE_REL, 20, 0, NULL, 0, 0, 0, OK},
      {RELEASE, 30, 0, NULL, 0, 1, 0, NOTFOUND},
      {COMPLETE, 40, 0, NULL, 0, 1, SUCCEEDED, NOTFOUND},
      {GET, 50, 0, NULL, 0, 0, 0, NOTFOUND}}},
};

static Idem__Outcome runStep(struct th *h, const struct step *s, const uint64_t *tokens)
{
    uint64_t token = s->tok ? tokens[s->tok - 1] : 999999;
    struct th_claim opt = {.attempt = s->attempt, .policy = s->policy};
    switch (s->op) {
    case CLAIM:
        return th_claim(h, s->now, "k", s->fp ? s->fp : 1, &opt);
    case COMPLETE:
        return th_complete(h, s->now, "t1", "k", token, s->completion,
                           s->completion == UNKNOWN_C ? 0 : 201, "{\"id\":7}", 0);
    case RELEASE:
        return th_release(h, s->now, "t1", "k", token);
    case RENEW:
        return th_renew(h, s->now, "t1", "k", token, 1000);
    case GET:
        return th_get(h, s->now, "t1", "k");
    case EXPIRE:
        return th_expire(h, s->now, 100);
    case RESOLVE_REL:
        return th_resolve(h, s->now, "t1", "k", 1, 0, NULL);
    case RESOLVE_RESP:
        return th_resolve(h, s->now, "t1", "k", 0, 200, "resolved");
    case END:
        break;
    }
    fail_msg("bad step");
    return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
}

static void test_scenarios(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        const struct scenario *sc = &scenarios[i];
        struct th h;
        uint64_t tokens[10] = {0};
        th_init(&h);
        for (size_t j = 0; j < 10 && sc->steps[j].op != END; j++) {
            Idem__Outcome got = runStep(&h, &sc->steps[j], tokens);
            tokens[j] = h.r.token;
            if (got != sc->steps[j].expect) {
                fail_msg("scenario \"%s\" step %zu: outcome %d, expected %d (%s)", sc->name,
                         j + 1, (int)got, (int)sc->steps[j].expect,
                         h.r.detail ? h.r.detail : "-");
            }
        }
        th_close(&h);
    }
}

/* ---- properties ---------------------------------------------------------------------- */

static void test_acquired_fields(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim opt = {.lease_ms = 3000, .ttl_ms = 60000};
    uint64_t idx = h.index;
    assert_int_equal(th_claim(&h, 1000, "k", 1, &opt), ACQ);
    assert_int_equal(h.r.token, idx); /* the fencing token is the command index */
    assert_int_equal(h.r.lease_deadline_ms, 4000);
    assert_int_equal(h.r.expires_at_ms, 61000);
    assert_false(h.r.takeover);

    assert_int_equal(th_claim(&h, 1500, "k", 1, &opt), INPROG);
    assert_int_equal(h.r.retry_after_ms, 2500);
    assert_int_equal(h.r.token, 0); /* in_progress reveals no token */
    th_close(&h);
}

static void test_takeover_token_increases(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim opt = {.policy = TAKEOVER};
    assert_int_equal(th_claim(&h, 0, "k", 1, &opt), ACQ);
    uint64_t t1 = h.r.token;
    assert_int_equal(th_claim(&h, 1000, "k", 1, &opt), ACQ);
    assert_true(h.r.takeover);
    assert_int_equal(h.r.previous_token, t1);
    uint64_t t2 = h.r.token;
    assert_true(t2 > t1);
    assert_int_equal(h.r.lease_deadline_ms, 2000);
    /* The stale holder is fenced off everywhere. */
    assert_int_equal(th_renew(&h, 1100, "t1", "k", t1, 1000), LOST);
    assert_int_equal(th_complete(&h, 1100, "t1", "k", t1, SUCCEEDED, 200, "x", 0), LOST);
    assert_int_equal(th_claim(&h, 2000, "k", 1, &opt), ACQ);
    assert_true(h.r.token > t2);
    th_close(&h);
}

static void test_attempt_retry_same_token(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim a1 = {.attempt = "attempt-1"};
    assert_int_equal(th_claim(&h, 0, "k", 1, &a1), ACQ);
    uint64_t t = h.r.token;
    assert_int_equal(h.r.lease_deadline_ms, 1000);
    assert_int_equal(th_claim(&h, 400, "k", 1, &a1), ACQ);
    assert_int_equal(h.r.token, t);
    assert_int_equal(h.r.lease_deadline_ms, 1000); /* a live lease is not extended */
    /* After the lease passed with nobody taking over, the same attempt gets a fresh one. */
    assert_int_equal(th_claim(&h, 1500, "k", 1, &a1), ACQ);
    assert_int_equal(h.r.token, t);
    assert_int_equal(h.r.lease_deadline_ms, 2500);
    /* A claim without an attempt id never matches one. */
    assert_int_equal(th_claim(&h, 1600, "k", 1, NULL), INPROG);
    th_close(&h);
}

static void test_replay_bytes_and_get(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "k", 1, NULL), ACQ);
    uint64_t t = h.r.token;
    assert_int_equal(th_complete(&h, 5, "t1", "k", t, SUCCEEDED, 201, "{\"order\":42}", 0), OK);
    assert_int_equal(th_claim(&h, 10, "k", 1, NULL), REPLAY);
    assert_non_null(h.r.response);
    Idem__StoredResponse *m = idem__stored_response__unpack(NULL, h.r.response_len,
                                                            h.r.response);
    assert_non_null(m);
    assert_int_equal(m->status, 201);
    assert_int_equal(m->n_headers, 1);
    assert_string_equal(m->headers[0]->name, "content-type");
    assert_int_equal(m->body.len, strlen("{\"order\":42}"));
    assert_memory_equal(m->body.data, "{\"order\":42}", m->body.len);
    idem__stored_response__free_unpacked(m, NULL);

    /* A second completion with another body changes nothing. */
    assert_int_equal(th_complete(&h, 20, "t1", "k", t, SUCCEEDED, 500, "other", 0), OK);
    assert_int_equal(th_claim(&h, 30, "k", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "{\"order\":42}");

    assert_int_equal(th_get(&h, 40, "t1", "k"), OK);
    assert_true(h.r.has_record);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_COMPLETED);
    assert_int_equal(h.r.record.completion, SUCCEEDED);
    assert_int_equal(h.r.record.token, t);
    assert_int_equal(h.r.record.created_at_ms, 0);
    assert_int_equal(h.r.record.key_len, 1);
    assert_memory_equal(h.r.record.key, "k", 1);
    assert_string_equal(h.r.record.tenant, "t1");
    assert_string_equal(th_body(h.r.record.response, h.r.record.response_len),
                        "{\"order\":42}");
    th_close(&h);
}

static void test_tenants_are_separate(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim a = {.tenant = "alpha"}, b = {.tenant = "beta"};
    assert_int_equal(th_claim(&h, 0, "same-key", 1, &a), ACQ);
    uint64_t ta = h.r.token;
    assert_int_equal(th_claim(&h, 0, "same-key", 2, &b), ACQ); /* no mismatch across tenants */
    uint64_t tb = h.r.token;
    assert_int_equal(th_complete(&h, 1, "alpha", "same-key", ta, SUCCEEDED, 200, "A", 0), OK);
    assert_int_equal(th_complete(&h, 1, "beta", "same-key", ta, SUCCEEDED, 200, "B", 0), LOST);
    assert_int_equal(th_complete(&h, 1, "beta", "same-key", tb, SUCCEEDED, 200, "B", 0), OK);
    assert_int_equal(th_claim(&h, 2, "same-key", 1, &a), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "A");
    assert_int_equal(th_claim(&h, 2, "same-key", 2, &b), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "B");
    assert_int_equal(th_get(&h, 3, "gamma", "same-key"), NOTFOUND);
    th_close(&h);
}

static void test_clock_never_goes_backwards(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 5000, "a", 1, NULL), ACQ);
    assert_int_equal(fsm_clock(h.f), 5000);
    /* A command stamped earlier (a new leader with a slower clock) uses the later time. */
    assert_int_equal(th_claim(&h, 1000, "b", 1, NULL), ACQ);
    assert_int_equal(fsm_clock(h.f), 5000);
    assert_int_equal(h.r.lease_deadline_ms, 6000);
    assert_int_equal(th_claim(&h, 2000, "a", 1, NULL), INPROG);
    assert_int_equal(h.r.retry_after_ms, 1000);
    assert_int_equal(th_claim(&h, 7000, "c", 1, NULL), ACQ);
    assert_int_equal(fsm_clock(h.f), 7000);
    th_close(&h);
}

static void test_expiry_order_and_batch_bound(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    /* Ten records with ttls in a scrambled order; k3 and k7 share an expiry time, so the
     * token (command index) breaks the tie. */
    const uint64_t ttl[10] = {900, 300, 500, 100, 700, 200, 1000, 500, 800, 400};
    char key[8];
    uint64_t tok[10];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        struct th_claim opt = {.ttl_ms = ttl[i], .lease_ms = 50, .tombstone_ttl_ms = 100000};
        assert_int_equal(th_claim(&h, 0, key, 1, &opt), ACQ);
        tok[i] = h.r.token;
    }
    assert_true(tok[2] < tok[7]);
    assert_int_equal(fsm_next_expiry(h.f), 100);
    const int order[10] = {3, 5, 1, 9, 2, 7, 4, 8, 0, 6};
    /* At t=2000 every record is due; a batch of 3 takes exactly the first three. */
    for (int b = 0; b < 4; b++) {
        assert_int_equal(th_expire(&h, 2000, 3), OK);
        uint32_t want = b < 3 ? 3 : 1;
        assert_int_equal(h.r.expired, want);
        assert_int_equal(h.r.dropped, 0);
        assert_int_equal(h.r.more, b < 3);
        for (int i = 0; i < 10; i++) {
            snprintf(key, sizeof(key), "k%d", i);
            int pos = 0;
            while (order[pos] != i) {
                pos++;
            }
            Idem__Outcome o = th_claim(&h, 2000, key, 1, NULL);
            if (pos < b * 3 + (int)want) {
                assert_int_equal(o, EXPIRED);
            } else {
                assert_int_equal(o, LEXP); /* still processing, lease passed */
            }
        }
    }
    struct fsm_stats st;
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.tombstones, 10);
    assert_int_equal(st.processing, 0);
    /* Tombstones live tombstone_ttl past their record's ttl, then go. */
    assert_int_equal(fsm_next_expiry(h.f), 100100);
    assert_int_equal(th_expire(&h, 100100, 100), OK);
    assert_int_equal(h.r.dropped, 1);
    assert_int_equal(th_expire(&h, 200000, 100), OK);
    assert_int_equal(h.r.dropped, 9);
    assert_false(h.r.more);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.records, 0);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(fsm_next_expiry(h.f), UINT64_MAX);
    th_close(&h);
}

static void test_quarantine_survives_ttl(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "k", 1, NULL), ACQ);
    assert_int_equal(th_complete(&h, 1, "t1", "k", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    for (uint64_t t = 10000; t <= 100000; t += 10000) {
        assert_int_equal(th_expire(&h, t, 100), OK);
        assert_int_equal(th_claim(&h, t, "k", 1, NULL), UNKNOWN);
    }
    struct fsm_stats st;
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.quarantined, 1);
    th_close(&h);
}

/* What today's leaders propose (ResolveCmd.unsettled_only): a quarantined record, or one
 * whose lease has ended, is resolved; a completed one, or one whose lease is live, is
 * refused and left as it was. Entries of older leaders (the flag unset) still resolve any
 * live record, as they did when first applied. */
static void test_resolve_only_what_is_unsettled(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    /* Quarantined: resolved. */
    assert_int_equal(th_claim(&h, 0, "q", 1, NULL), ACQ);
    assert_int_equal(th_complete(&h, 1, "t1", "q", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    assert_int_equal(th_resolve_unsettled(&h, 2, "t1", "q", 0, 201, "operator"), OK);
    assert_int_equal(th_claim(&h, 3, "q", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "operator");
    /* Completed: refused either way; the stored answer stays. */
    assert_int_equal(th_claim(&h, 10, "c", 1, NULL), ACQ);
    uint64_t tok = h.r.token;
    assert_int_equal(th_complete(&h, 11, "t1", "c", tok, SUCCEEDED, 200, "done", 0), OK);
    assert_int_equal(th_resolve_unsettled(&h, 12, "t1", "c", 0, 201, "operator"), INVALID);
    assert_non_null(strstr(h.r.detail, "completed"));
    assert_int_equal(th_resolve_unsettled(&h, 13, "t1", "c", 1, 0, NULL), INVALID);
    assert_int_equal(th_claim(&h, 14, "c", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "done");
    assert_int_equal(th_complete(&h, 15, "t1", "c", tok, SUCCEEDED, 200, "done", 0), OK);
    /* Processing with a live lease (1000 ms from 20): refused, the holder completes;
     * another once its lease has ended: resolved. (The state machine's clock never goes
     * back: each command's time is at least the last one's.) */
    assert_int_equal(th_claim(&h, 20, "p", 1, NULL), ACQ);
    tok = h.r.token;
    assert_int_equal(th_resolve_unsettled(&h, 1019, "t1", "p", 1, 0, NULL), INVALID);
    assert_non_null(strstr(h.r.detail, "lease is live"));
    assert_int_equal(th_claim(&h, 1019, "p", 1, NULL), INPROG);
    assert_int_equal(th_complete(&h, 1019, "t1", "p", tok, SUCCEEDED, 200, "held", 0), OK);
    assert_int_equal(th_claim(&h, 1100, "e", 1, NULL), ACQ);
    tok = h.r.token;
    assert_int_equal(th_resolve_unsettled(&h, 2100, "t1", "e", 0, 200, "decided"), OK);
    assert_true(h.r.token > tok);
    assert_int_equal(th_claim(&h, 2101, "e", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "decided");
    /* ...and its holder is fenced off, as by a takeover: lease_lost, not an ok that would
     * drop its answer. */
    assert_int_equal(th_complete(&h, 2102, "t1", "e", tok, FAILED, 500, "late", 0), LOST);
    assert_int_equal(th_renew(&h, 2103, "t1", "e", tok, 1000), LOST);
    assert_int_equal(th_release(&h, 2104, "t1", "e", tok), LOST);
    assert_int_equal(th_claim(&h, 2105, "e", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "decided");
    /* An older leader's entry (no flag) on a completed record: applied as it was then. */
    assert_int_equal(th_resolve(&h, 2200, "t1", "c", 1, 0, NULL), OK);
    assert_int_equal(th_claim(&h, 2201, "c", 1, NULL), ACQ);
    /* Nothing left to resolve: not found, as before. */
    assert_int_equal(th_resolve_unsettled(&h, 2300, "t1", "none", 1, 0, NULL), NOTFOUND);
    th_close(&h);
}

/* A quarantined record keeps its token when an operator resolves it (docs/contract.md,
 * resolve): its holder's late complete with the outcome the operator's status gave answers
 * ok as a repeat does and changes nothing; with another outcome, lease_lost. */
static void test_resolved_quarantine_keeps_its_token(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "q", 1, NULL), ACQ);
    uint64_t tok = h.r.token;
    assert_int_equal(th_complete(&h, 1, "t1", "q", tok, UNKNOWN_C, 0, NULL, 0), OK);
    assert_int_equal(th_resolve_unsettled(&h, 2, "t1", "q", 0, 201, "operator"), OK);
    assert_int_equal(h.r.token, tok);
    assert_int_equal(th_complete(&h, 3, "t1", "q", tok, SUCCEEDED, 201, "late", 0), OK);
    assert_int_equal(th_complete(&h, 4, "t1", "q", tok, FAILED, 500, "late", 0), LOST);
    assert_int_equal(th_renew(&h, 5, "t1", "q", tok, 1000), LOST);
    assert_int_equal(th_release(&h, 6, "t1", "q", tok), LOST);
    assert_int_equal(th_claim(&h, 7, "q", 1, NULL), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "operator");
    th_close(&h);
}

/* The lease, not the ttl, bounds how long a holder may run: today's leaders' expire leaves
 * a processing record with a live lease alone until the lease ends (renewals move it on);
 * entries of older leaders tombstone it at its ttl, as they did. */
static void test_expire_keeps_live_leases(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim o = {.lease_ms = 60000, .ttl_ms = 1000};
    assert_int_equal(th_claim(&h, 0, "k", 1, &o), ACQ);
    uint64_t tok = h.r.token;
    assert_int_equal(th_expire_as(&h, 1500, 100, true), OK);
    assert_int_equal(h.r.expired, 0);
    assert_int_equal(th_claim(&h, 1600, "k", 1, NULL), INPROG);
    assert_int_equal(th_renew(&h, 50000, "t1", "k", tok, 60000), OK);
    assert_int_equal(th_expire_as(&h, 61000, 100, true), OK); /* the first lease's end */
    assert_int_equal(h.r.expired, 0);
    assert_int_equal(th_complete(&h, 70000, "t1", "k", tok, SUCCEEDED, 200, "ran", 0), OK);
    assert_int_equal(th_claim(&h, 70001, "k", 1, NULL), REPLAY);
    /* Once the lease has ended, the ttl applies (a tombstone kept long enough to see). */
    struct th_claim t = {.lease_ms = 60000, .ttl_ms = 1000, .tombstone_ttl_ms = 1000000};
    assert_int_equal(th_claim(&h, 70002, "e", 1, &t), ACQ);
    assert_int_equal(th_expire_as(&h, 130003, 100, true), OK);
    assert_int_equal(th_claim(&h, 130004, "e", 1, NULL), EXPIRED);
    /* An older leader's entry: the ttl, as before. */
    assert_int_equal(th_claim(&h, 130005, "o", 1, &t), ACQ);
    assert_int_equal(th_expire(&h, 131006, 100), OK);
    assert_int_equal(th_claim(&h, 131007, "o", 1, NULL), EXPIRED);
    th_close(&h);
}

static void test_released_marker_goes_away(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim opt = {.ttl_ms = 3600000};
    assert_int_equal(th_claim(&h, 0, "k", 1, &opt), ACQ);
    assert_int_equal(th_release(&h, 10, "t1", "k", h.r.token), OK);
    struct fsm_stats st;
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.released, 1);
    assert_int_equal(st.bytes, 0); /* released markers do not count against quotas */
    assert_int_equal(fsm_next_expiry(h.f), 10 + 600000);
    assert_int_equal(th_expire(&h, 10 + 600000, 10), OK);
    assert_int_equal(h.r.dropped, 1);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.records, 0);
    th_close(&h);
}

static void test_quotas(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim lim = {.max_records = 2};
    assert_int_equal(th_claim(&h, 0, "a", 1, &lim), ACQ);
    uint64_t ta = h.r.token;
    assert_int_equal(th_claim(&h, 0, "b", 1, &lim), ACQ);
    assert_int_equal(th_claim(&h, 0, "c", 1, &lim), QUOTA);
    /* What /metrics shows of each tenant (idem_tenant_records, idem_tenant_bytes). */
    uint64_t rec, by;
    fsm_tenant_usage(h.f, "t1", &rec, &by);
    assert_int_equal(rec, 2);
    assert_int_equal(by, 2 * (1 + 32));
    fsm_tenant_usage(h.f, "nobody", &rec, &by);
    assert_int_equal(rec, 0);
    assert_int_equal(by, 0);
    /* Live records are never evicted, and existing keys still answer. */
    assert_int_equal(th_claim(&h, 10, "a", 1, &lim), INPROG);
    assert_int_equal(th_get(&h, 10, "t1", "c"), NOTFOUND);
    /* Another tenant has its own budget. */
    struct th_claim other = {.tenant = "t2", .max_records = 2};
    assert_int_equal(th_claim(&h, 10, "c", 1, &other), ACQ);
    /* Releasing frees a slot. */
    assert_int_equal(th_release(&h, 20, "t1", "a", ta), OK);
    assert_int_equal(th_claim(&h, 20, "c", 1, &lim), ACQ);

    /* Bytes: key + 32-byte fingerprint per record, plus the stored response. */
    struct th_claim bytes = {.tenant = "t3", .max_bytes = 2 * (1 + 32) + 10};
    assert_int_equal(th_claim(&h, 30, "x", 1, &bytes), ACQ);
    uint64_t tx = h.r.token;
    assert_int_equal(th_claim(&h, 30, "y", 1, &bytes), ACQ);
    assert_int_equal(th_claim(&h, 30, "z", 1, &bytes), QUOTA);
    char big[64];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(th_complete(&h, 31, "t3", "x", tx, SUCCEEDED, 200, big, bytes.max_bytes),
                     QUOTA);
    /* The refused completion changed nothing: the holder may still complete small. */
    assert_int_equal(th_get(&h, 32, "t3", "x"), OK);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_PROCESSING);
    assert_int_equal(th_complete(&h, 33, "t3", "x", tx, SUCCEEDED, 0, NULL, bytes.max_bytes),
                     INVALID); /* a final outcome needs a response */
    assert_int_equal(th_release(&h, 34, "t3", "x", tx), OK);
    fsm_tenant_usage(h.f, "t3", &rec, &by); /* a released marker counts for nothing */
    assert_int_equal(rec, 1);
    assert_int_equal(by, 1 + 32);
    fsm_tenant_usage(h.f, "t1", &rec, &by);
    assert_int_equal(rec, 2);
    th_close(&h);
}

static void test_invalid_commands_change_nothing(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 100, "k", 1, NULL), ACQ);
    char before[33], after[33];
    fsm_digest_hex(h.f, before);

    /* Garbage, truncated and empty-op bytes. */
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x00};
    struct fsm_result r;
    assert_int_equal(fsm_apply(h.f, h.index++, garbage, sizeof(garbage), &r), INVALID);
    assert_non_null(r.detail);
    assert_int_equal(fsm_apply(h.f, h.index++, NULL, 0, &r), INVALID); /* no op */
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    uint8_t fp[32] = {1};
    c.tenant = "t1";
    c.key.data = (uint8_t *)"k2";
    c.key.len = 2;
    c.fingerprint.data = fp;
    c.fingerprint.len = 32;
    c.lease_ms = 1000;
    c.ttl_ms = 1000;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = 999999; /* would move the clock if it were applied */
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    uint8_t buf[256];
    size_t n = idem__command__pack(&cmd, buf);
    assert_int_equal(fsm_apply(h.f, h.index++, buf, n / 2, &r), INVALID); /* truncated */

    /* Each field out of range, one at a time. */
    Idem__ClaimCmd bad;
    bad = c; bad.tenant = "";
    cmd.claim = &bad;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.key.len = 0;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.key.data = (uint8_t *)"a b"; bad.key.len = 3;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.fingerprint.len = 31;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.lease_ms = 0;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.ttl_ms = 0;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    bad = c; bad.policy = (Idem__LeasePolicy)7;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    uint8_t long_attempt[65];
    memset(long_attempt, 'a', sizeof(long_attempt));
    bad = c; bad.attempt_id.data = long_attempt; bad.attempt_id.len = 65;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    uint8_t long_key[256];
    memset(long_key, 'k', sizeof(long_key));
    bad = c; bad.key.data = long_key; bad.key.len = 256;
    assert_int_equal(th_apply(&h, &cmd), INVALID);

    /* Bad completions: unspecified outcome, status out of range, body with body_ref. */
    assert_int_equal(th_complete(&h, 999999, "t1", "k", 1, IDEM__COMPLETION__COMPLETION_UNSPECIFIED,
                                 200, "x", 0),
                     INVALID);
    assert_int_equal(th_complete(&h, 999999, "t1", "k", 1, SUCCEEDED, 99, "x", 0), INVALID);
    assert_int_equal(th_complete(&h, 999999, "t1", "k", 1, SUCCEEDED, 600, "x", 0), INVALID);
    assert_int_equal(th_renew(&h, 999999, "t1", "k", 1, 0), INVALID);
    assert_int_equal(th_expire(&h, 999999, 0), INVALID);
    assert_int_equal(th_resolve(&h, 999999, "t1", "k", 1, 200, "both"), INVALID);
    assert_int_equal(th_resolve(&h, 999999, "t1", "k", 0, 0, NULL), INVALID);

    /* An index that does not increase is refused too. */
    h.index = 1;
    assert_int_equal(th_claim(&h, 999999, "fresh", 1, NULL), INVALID);

    fsm_digest_hex(h.f, after);
    assert_string_equal(before, after);
    assert_int_equal(fsm_clock(h.f), 100);
    th_close(&h);
}

static void test_body_ref_response(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "k", 1, NULL), ACQ);
    Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    uint8_t sha[32];
    memset(sha, 0xab, sizeof(sha));
    c.tenant = "t1";
    c.key.data = (uint8_t *)"k";
    c.key.len = 1;
    c.token = h.r.token;
    c.outcome = FAILED;
    c.response = &resp;
    resp.status = 502;
    resp.body_ref = "blob://bucket/obj";
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
    cmd.complete = &c;
    assert_int_equal(th_apply(&h, &cmd), INVALID); /* body_ref without its digest */
    resp.body_sha256.data = sha;
    resp.body_sha256.len = 32;
    assert_int_equal(th_apply(&h, &cmd), OK);
    assert_int_equal(th_claim(&h, 1, "k", 1, NULL), REPLAY);
    Idem__StoredResponse *m = idem__stored_response__unpack(NULL, h.r.response_len,
                                                            h.r.response);
    assert_non_null(m);
    assert_string_equal(m->body_ref, "blob://bucket/obj");
    assert_memory_equal(m->body_sha256.data, sha, 32);
    idem__stored_response__free_unpacked(m, NULL);
    th_close(&h);
}

/* The same commands give the same digest in another state machine, and any difference in
 * the commands (here: one clock value) gives another digest. */
static void test_digest_is_deterministic(void **state)
{
    (void)state;
    char d[3][33];
    for (int run = 0; run < 3; run++) {
        struct th h;
        th_init(&h);
        for (int i = 0; i < 500; i++) {
            char key[16];
            snprintf(key, sizeof(key), "key-%d", (i * 7919) % 500);
            uint64_t now = (uint64_t)i * 10 + (run == 2 && i == 499 ? 1 : 0);
            if (th_claim(&h, now, key, (uint8_t)(i % 3 + 1), NULL) == ACQ && i % 2 == 0) {
                th_complete(&h, now, "t1", key, h.r.token, SUCCEEDED, 200, key, 0);
            }
        }
        th_expire(&h, 2000, 64);
        fsm_digest_hex(h.f, d[run]);
        th_close(&h);
    }
    assert_string_equal(d[0], d[1]);
    assert_string_not_equal(d[0], d[2]);
}

/* At the lease deadline itself the lease has passed; renew counts from the clock, and get
 * reports what renew set. */
static void test_lease_deadline_boundaries(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim a1 = {.attempt = "a1"};
    assert_int_equal(th_claim(&h, 0, "k", 1, &a1), ACQ);
    uint64_t t = h.r.token;
    assert_int_equal(h.r.lease_deadline_ms, 1000);
    /* The holder's own retry at exactly the deadline gets a fresh lease. */
    assert_int_equal(th_claim(&h, 1000, "k", 1, &a1), ACQ);
    assert_int_equal(h.r.token, t);
    assert_int_equal(h.r.lease_deadline_ms, 2000);
    /* A renewed lease runs from the clock, not from the old deadline. */
    assert_int_equal(th_renew(&h, 1300, "t1", "k", t, 2000), OK);
    assert_int_equal(h.r.token, t);
    assert_int_equal(h.r.lease_deadline_ms, 3300);
    assert_int_equal(th_get(&h, 1400, "t1", "k"), OK);
    assert_int_equal(h.r.record.lease_deadline_ms, 3300);
    assert_int_equal(h.r.record.created_at_ms, 0);
    assert_int_equal(h.r.record.expires_at_ms, 10000);
    assert_int_equal(th_claim(&h, 3299, "k", 1, NULL), INPROG);
    assert_int_equal(h.r.retry_after_ms, 1);
    assert_int_equal(th_claim(&h, 3300, "k", 1, NULL), LEXP);
    assert_int_equal(h.r.lease_deadline_ms, 3300);
    th_close(&h);
}

/* Renew, release and expire decide with the state machine's clock, never with an earlier
 * timestamp that a command carries (docs/contract.md: clock = max(clock, entry.now)). */
static void test_clock_steps_back_for_every_op(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim longTtl = {.ttl_ms = 3600000};
    assert_int_equal(th_claim(&h, 5000, "a", 1, &longTtl), ACQ);
    uint64_t ta = h.r.token;
    assert_int_equal(th_renew(&h, 1000, "t1", "a", ta, 2000), OK);
    assert_int_equal(h.r.lease_deadline_ms, 7000);

    /* A released marker is kept ten minutes from the clock. */
    assert_int_equal(th_claim(&h, 1000, "b", 1, &longTtl), ACQ);
    assert_int_equal(th_release(&h, 0, "t1", "b", h.r.token), OK);
    assert_int_equal(fsm_next_expiry(h.f), 5000 + 600000);

    /* A record whose ttl passed by the clock expires, whatever the command says. */
    struct th_claim shortTtl = {.ttl_ms = 1000, .tombstone_ttl_ms = 100000};
    assert_int_equal(th_claim(&h, 5000, "c", 1, &shortTtl), ACQ);
    assert_int_equal(th_claim(&h, 9000, "d", 1, &longTtl), ACQ);
    assert_int_equal(th_expire(&h, 100, 10), OK);
    assert_int_equal(h.r.expired, 1);
    assert_int_equal(h.r.dropped, 0);
    assert_int_equal(th_claim(&h, 100, "c", 1, NULL), EXPIRED);
    assert_int_equal(fsm_clock(h.f), 9000);
    th_close(&h);
}

/* What get reports: the completion of every final state, and a fresh record after a claim
 * over a released marker. */
static void test_get_reports_completion_and_creation(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "f", 1, NULL), ACQ);
    assert_int_equal(th_complete(&h, 1, "t1", "f", h.r.token, FAILED, 502, "bad gateway", 0), OK);
    assert_int_equal(th_get(&h, 2, "t1", "f"), OK);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_COMPLETED);
    assert_int_equal(h.r.record.completion, FAILED);

    assert_int_equal(th_claim(&h, 3, "u", 1, NULL), ACQ);
    assert_int_equal(th_complete(&h, 4, "t1", "u", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    assert_int_equal(th_get(&h, 5, "t1", "u"), OK);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED);
    assert_int_equal(h.r.record.completion, UNKNOWN_C);
    assert_null(h.r.record.response);

    /* An operator's response decides the completion by its status. */
    assert_int_equal(th_resolve(&h, 6, "t1", "u", 0, 500, "refunded"), OK);
    assert_int_equal(th_get(&h, 7, "t1", "u"), OK);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_COMPLETED);
    assert_int_equal(h.r.record.completion, FAILED);
    assert_string_equal(th_body(h.r.record.response, h.r.record.response_len), "refunded");
    assert_int_equal(th_claim(&h, 8, "v", 1, NULL), ACQ);
    assert_int_equal(th_complete(&h, 9, "t1", "v", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    assert_int_equal(th_resolve(&h, 10, "t1", "v", 0, 200, "charged"), OK);
    assert_int_equal(th_get(&h, 11, "t1", "v"), OK);
    assert_int_equal(h.r.record.completion, SUCCEEDED);

    /* A claim over a released marker starts a new record. */
    assert_int_equal(th_claim(&h, 20, "r", 1, NULL), ACQ);
    uint64_t old = h.r.token;
    assert_int_equal(th_release(&h, 30, "t1", "r", old), OK);
    assert_int_equal(th_claim(&h, 50, "r", 1, NULL), ACQ);
    uint64_t fresh = h.r.token;
    assert_true(fresh > old);
    assert_int_equal(th_get(&h, 60, "t1", "r"), OK);
    assert_int_equal(h.r.record.created_at_ms, 50);
    assert_int_equal(h.r.record.token, fresh);
    assert_int_equal(h.r.record.state, IDEM__RECORD_STATE__RECORD_STATE_PROCESSING);
    assert_int_equal(h.r.record.completion, IDEM__COMPLETION__COMPLETION_UNSPECIFIED);
    th_close(&h);
}

/* The expiry index orders by (expires_at, token) whatever changed a record's place in it:
 * a tie is broken by the token one record at a time, a takeover's new token moves the record
 * behind its peers, and a release that shortens the expiry moves it to the front. */
static void test_expiry_order_follows_changes(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim opt = {.ttl_ms = 1000, .lease_ms = 10, .tombstone_ttl_ms = 50000};
    assert_int_equal(th_claim(&h, 0, "a", 1, &opt), ACQ);
    assert_int_equal(th_claim(&h, 0, "b", 1, &opt), ACQ);
    assert_int_equal(th_claim(&h, 0, "c", 1, &opt), ACQ);
    struct th_claim take = {.policy = TAKEOVER, .lease_ms = 10};
    assert_int_equal(th_claim(&h, 100, "a", 1, &take), ACQ);
    assert_true(h.r.takeover);
    /* Now the order is b, c, a; one record per batch. */
    const char *order[3] = {"b", "c", "a"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(th_expire(&h, 1000, 1), OK);
        assert_int_equal(h.r.expired, 1);
        assert_int_equal(h.r.more, i < 2);
        for (int j = 0; j < 3; j++) {
            assert_int_equal(th_get(&h, 1000, "t1", order[j]), OK);
            assert_int_equal(h.r.record.state, j <= i ? IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE
                                                      : IDEM__RECORD_STATE__RECORD_STATE_PROCESSING);
        }
    }
    th_close(&h);

    th_init(&h);
    struct th_claim hour = {.ttl_ms = 3600000};
    uint64_t tok[5];
    char key[8];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "r%d", i);
        assert_int_equal(th_claim(&h, 0, key, 1, &hour), ACQ);
        tok[i] = h.r.token;
    }
    assert_int_equal(fsm_next_expiry(h.f), 3600000);
    assert_int_equal(th_release(&h, 10, "t1", "r4", tok[4]), OK);
    assert_int_equal(fsm_next_expiry(h.f), 600010);
    assert_int_equal(th_release(&h, 20, "t1", "r2", tok[2]), OK);
    assert_int_equal(fsm_next_expiry(h.f), 600010);
    /* A released marker goes at its ttl when that comes before the ten minutes. */
    struct th_claim second = {.ttl_ms = 1000};
    assert_int_equal(th_claim(&h, 30, "s", 1, &second), ACQ);
    assert_int_equal(th_release(&h, 40, "t1", "s", h.r.token), OK);
    assert_int_equal(fsm_next_expiry(h.f), 1030);
    assert_int_equal(th_expire(&h, 1030, 10), OK);
    assert_int_equal(h.r.dropped, 1);
    assert_int_equal(fsm_next_expiry(h.f), 600010);
    assert_int_equal(th_expire(&h, 600010, 10), OK);
    assert_int_equal(h.r.dropped, 1);
    assert_int_equal(fsm_next_expiry(h.f), 600020);
    /* Without a tombstone ttl a tombstone lives as long as the ttl. */
    struct th_claim plain = {.ttl_ms = 1000};
    assert_int_equal(th_claim(&h, 700000, "p", 1, &plain), ACQ);
    assert_int_equal(th_expire(&h, 701000, 10), OK);
    assert_int_equal(h.r.expired, 1);
    assert_int_equal(h.r.dropped, 1); /* r2's marker */
    assert_int_equal(fsm_next_expiry(h.f), 702000);
    th_close(&h);
}

/* Quotas are maxima: an exact fit is accepted. Bytes include the stored response, released
 * markers do not count, but claiming a released key again is a new record that does. */
static void test_quota_boundaries(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim fit = {.max_bytes = 2 * (1 + 32)};
    assert_int_equal(th_claim(&h, 0, "x", 1, &fit), ACQ);
    uint64_t tx = h.r.token;
    assert_int_equal(th_claim(&h, 0, "y", 1, &fit), ACQ);
    uint64_t ty = h.r.token;
    assert_int_equal(th_claim(&h, 0, "z", 1, &fit), QUOTA);
    struct fsm_stats st;
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.bytes, 66);
    assert_int_equal(th_complete(&h, 1, "t1", "x", tx, SUCCEEDED, 200, "A", 0), OK);
    assert_int_equal(th_get(&h, 2, "t1", "x"), OK);
    size_t resp = h.r.record.response_len;
    assert_true(resp > 0);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.bytes, 66 + resp);
    /* A response of the same size fills the byte quota exactly. */
    assert_int_equal(th_complete(&h, 3, "t1", "y", ty, SUCCEEDED, 200, "B", 66 + 2 * resp - 1),
                     QUOTA);
    assert_int_equal(th_complete(&h, 3, "t1", "y", ty, SUCCEEDED, 200, "B", 66 + 2 * resp), OK);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.bytes, 66 + 2 * resp);
    th_close(&h);

    th_init(&h);
    struct th_claim one = {.max_records = 1};
    assert_int_equal(th_claim(&h, 0, "a", 1, &one), ACQ);
    assert_int_equal(th_release(&h, 1, "t1", "a", h.r.token), OK);
    assert_int_equal(th_claim(&h, 2, "b", 1, &one), ACQ);
    assert_int_equal(th_claim(&h, 3, "a", 1, &one), QUOTA);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.records, 2);
    assert_int_equal(st.released, 1);
    assert_int_equal(st.processing, 1);
    /* Resolve with release deletes the record outright: no marker is left behind. */
    assert_int_equal(th_resolve(&h, 4, "t1", "b", 1, 0, NULL), OK);
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.bytes, 0);
    th_close(&h);
}

/* Applies six commands to a fresh state machine, one detail of which `variant` changes, and
 * writes the digest. Each variant changes exactly one replicated field. */
static void digestOfVariant(int variant, char out[33])
{
    struct th h;
    th_init(&h);
    const char *tenant = variant == 3 ? "t2" : "t1";
    const char *key = variant == 5 ? "k2" : "k1";
    struct th_claim opt = {
        .tenant = tenant,
        .attempt = variant == 1 ? "b" : "a",
        .tombstone_ttl_ms = variant == 2 ? 6000 : 5000,
        /* Claimed 10 ms later with a 10 ms shorter ttl: only created_at differs. */
        .ttl_ms = variant == 4 ? 9990 : 10000,
    };
    assert_int_equal(th_claim(&h, variant == 4 ? 20 : 10, key, variant == 6 ? 2 : 1, &opt), ACQ);
    uint64_t tok = h.r.token;
    assert_int_equal(th_renew(&h, 30, tenant, key, tok, variant == 7 ? 2000 : 1000), OK);
    assert_int_equal(th_complete(&h, 40, tenant, key, tok, variant == 8 ? FAILED : SUCCEEDED, 201,
                                 variant == 9 ? "y" : "x", 0),
                     OK);
    assert_int_equal(th_get(&h, variant == 10 ? 60 : 50, "t1", "none"), NOTFOUND);
    fsm_digest_hex(h.f, out);
    th_close(&h);
}

/* The digest covers every replicated field: changing any one of them changes it. */
static void test_digest_covers_every_field(void **state)
{
    (void)state;
    static const char *what[] = {"base",       "attempt id", "tombstone ttl", "tenant",
                                 "created_at", "key",        "fingerprint",   "lease deadline",
                                 "completion", "response",   "clock"};
    enum { N = sizeof(what) / sizeof(what[0]) };
    char d[N][33];
    for (int v = 0; v < N; v++) {
        digestOfVariant(v, d[v]);
    }
    char again[33];
    digestOfVariant(0, again);
    assert_string_equal(d[0], again);
    for (int v = 1; v < N; v++) {
        if (strcmp(d[0], d[v]) == 0) {
            fail_msg("the digest does not cover the %s", what[v]);
        }
    }
}

/* The home slot of (tenant, key) in a table of `slots` slots, computed the way table.c does
 * (XXH3 of the key, seeded with XXH3 of the tenant). The churn test below uses it only to
 * pick keys that crowd around the end of the slot array; if the table ever hashes otherwise,
 * the test still holds, it merely exercises less. */
static size_t homeSlot(const char *tenant, const char *key, size_t slots)
{
    uint64_t seed = XXH3_64bits(tenant, strlen(tenant));
    return (size_t)(XXH3_64bits_withSeed(key, strlen(key), seed) & (slots - 1));
}

/* The record table is open addressing with linear probing and backward-shift deletion.
 * Forty keys whose home is one of the last 16 slots and forty whose home is one of the
 * first 8 make one long probe run that wraps around the end of the 1024-slot array, among
 * 500 keys elsewhere. Deleting and re-inserting keys of the run at random must keep every
 * present key reachable and every deleted key absent, wherever the hole falls. */
static void test_table_churn_keeps_keys_reachable(void **state)
{
    (void)state;
    enum { EDGE = 80, FILL = 500, N = EDGE + FILL };
    static char keys[N][16];
    int tail = 0, head = 0, fill = 0;
    for (int c = 0; tail + head < EDGE || fill < FILL; c++) {
        char key[16];
        snprintf(key, sizeof(key), "w%d", c);
        size_t home = homeSlot("t1", key, 1024);
        if (home >= 1024 - 16 && tail < EDGE / 2) {
            strcpy(keys[tail++], key);
        } else if (home < 8 && head < EDGE / 2) {
            strcpy(keys[EDGE / 2 + head++], key);
        } else if (home >= 64 && home < 1024 - 64 && fill < FILL) {
            strcpy(keys[EDGE + fill++], key);
        }
    }
    struct th h;
    th_init(&h);
    bool present[N];
    for (int i = 0; i < N; i++) {
        /* Interleave the two ends so that the run mixes their homes. */
        int k = i < EDGE ? (i % 2 ? EDGE / 2 + i / 2 : i / 2) : i;
        assert_int_equal(th_claim(&h, 0, keys[k], 1, NULL), ACQ);
        present[k] = true;
    }
    uint64_t x = 0x2545f4914f6cdd1dULL;
    for (int step = 0; step < 400; step++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int k = (int)(x % EDGE);
        if (present[k]) {
            assert_int_equal(th_resolve(&h, 0, "t1", keys[k], 1, 0, NULL), OK);
        } else {
            assert_int_equal(th_claim(&h, 0, keys[k], 1, NULL), ACQ);
        }
        present[k] = !present[k];
        int upto = step % 50 == 49 ? N : EDGE;
        size_t live = 0;
        for (int i = 0; i < upto; i++) {
            Idem__Outcome o = th_get(&h, 0, "t1", keys[i]);
            if (o != (present[i] ? OK : NOTFOUND)) {
                fail_msg("step %d: key %s (home %zu) answers %d", step, keys[i],
                         homeSlot("t1", keys[i], 1024), (int)o);
            }
            live += present[i];
        }
        if (upto == N) {
            struct fsm_stats st;
            fsm_get_stats(h.f, &st);
            assert_int_equal(st.records, live);
        }
    }
    th_close(&h);
}

struct tenantHash {
    uint64_t bits; /* the home slot in 1024 and the 16-bit tag of key "k" */
    int tenant;
};

static int tenantHashCmp(const void *a, const void *b)
{
    const struct tenantHash *x = a, *y = b;
    return x->bits < y->bits ? -1 : x->bits > y->bits;
}

/* Two tenants whose hashes of the same key collide in the home slot and in the 16-bit tag
 * that the table keeps in each slot (found by a birthday search over tenant names) still
 * never see each other's record: the table compares the tenant, not just hash and key. */
static void test_tenants_separate_when_hashes_collide(void **state)
{
    (void)state;
    enum { M = 60000 };
    struct tenantHash *hs = malloc(M * sizeof(*hs));
    assert_non_null(hs);
    char name[16];
    for (int i = 0; i < M; i++) {
        snprintf(name, sizeof(name), "tenant%d", i);
        uint64_t h = XXH3_64bits_withSeed("k", 1, XXH3_64bits(name, strlen(name)));
        hs[i].bits = (h >> 48) << 10 | (h & 1023);
        hs[i].tenant = i;
    }
    qsort(hs, M, sizeof(*hs), tenantHashCmp);
    int a = -1, b = -1;
    for (int i = 1; i < M && a < 0; i++) {
        if (hs[i].bits == hs[i - 1].bits) {
            a = hs[i - 1].tenant;
            b = hs[i].tenant;
        }
    }
    free(hs);
    assert_true(a >= 0);
    char ta[16], tb[16];
    snprintf(ta, sizeof(ta), "tenant%d", a);
    snprintf(tb, sizeof(tb), "tenant%d", b);

    struct th h;
    th_init(&h);
    struct th_claim oa = {.tenant = ta}, ob = {.tenant = tb};
    assert_int_equal(th_claim(&h, 0, "k", 1, &oa), ACQ);
    uint64_t tokA = h.r.token;
    assert_int_equal(th_get(&h, 1, tb, "k"), NOTFOUND);
    assert_int_equal(th_claim(&h, 2, "k", 2, &ob), ACQ);
    uint64_t tokB = h.r.token;
    assert_int_equal(th_complete(&h, 3, tb, "k", tokA, SUCCEEDED, 200, "B", 0), LOST);
    assert_int_equal(th_complete(&h, 4, tb, "k", tokB, SUCCEEDED, 200, "B", 0), OK);
    assert_int_equal(th_claim(&h, 5, "k", 1, &oa), INPROG);
    assert_int_equal(th_resolve(&h, 6, ta, "k", 1, 0, NULL), OK);
    assert_int_equal(th_claim(&h, 7, "k", 2, &ob), REPLAY);
    assert_string_equal(th_body(h.r.response, h.r.response_len), "B");
    th_close(&h);
}

/* Tenants are interned in their own open-addressing table that must grow before it fills. */
static void test_many_tenants(void **state)
{
    (void)state;
    enum { N = 200 };
    struct th h;
    th_init(&h);
    char tenant[16];
    for (int i = 0; i < N; i++) {
        snprintf(tenant, sizeof(tenant), "tenant-%d", i);
        struct th_claim opt = {.tenant = tenant};
        assert_int_equal(th_claim(&h, 0, "k", 1, &opt), ACQ);
    }
    for (int i = 0; i < N; i++) {
        snprintf(tenant, sizeof(tenant), "tenant-%d", i);
        struct th_claim opt = {.tenant = tenant};
        assert_int_equal(th_claim(&h, 1, "k", 1, &opt), INPROG);
    }
    assert_int_equal(th_get(&h, 2, "nobody", "k"), NOTFOUND);
    struct fsm_stats st;
    fsm_get_stats(h.f, &st);
    assert_int_equal(st.tenants, N);
    assert_int_equal(st.records, N);
    th_close(&h);
}

/* ---- randomized lockstep ------------------------------------------------------------- */

/* Two state machines apply the same random commands (claim, complete, release, renew, get,
 * expire, resolve, purge and malformed bytes over 50 keys of 2 tenants, with a leader clock that
 * mostly advances and sometimes steps back). One of them is now and then replaced by a
 * snapshot and restore of itself. After every command both must have answered the same and
 * hold the same digest, their counters must add up, and no fencing token may be granted
 * twice. The seed is printed; IDEM_SEED=<seed> replays a run. */

#define LS_TENANTS 2
#define LS_KEYS 50
#define LS_SLOTS (LS_TENANTS * LS_KEYS)
#define LS_STEPS 4000
#define LS_AUDIT_EVERY 100

static const char *const lsTenantNames[LS_TENANTS] = {"t1", "t2"};
static const char *const lsAttempts[] = {NULL, NULL, "a1", "a2", "a3"};

struct lockstep {
    unsigned long long seed;
    uint64_t rng;
    int step;
    struct th a, b;
    uint64_t now;                /* the leader's clock for the next command */
    uint64_t clock;              /* what fsm_clock() must say */
    uint64_t cur[LS_SLOTS];      /* the last token granted to each key; 0: none yet */
    uint64_t max_token;          /* the largest token granted so far */
    unsigned grants, reacquires; /* new tokens granted; attempt-id retries given theirs */
    int recent[8];               /* slots acquired lately, so that most commands find one */
    unsigned n_recent;
    uint16_t *owner;             /* owner[token]: 1 + the key slot it was granted to */
    size_t owner_cap;
    unsigned restores;
};

#define LS_CHECK(ls, cond)                                                                     \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fail_msg("lockstep seed %llu, step %d: %s", (ls)->seed, (ls)->step, #cond);        \
        }                                                                                      \
    } while (0)

/* splitmix64: small, and the same sequence on every platform. */
static uint64_t lsNext(struct lockstep *ls)
{
    uint64_t z = (ls->rng += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t lsBelow(struct lockstep *ls, uint64_t n)
{
    return lsNext(ls) % n;
}

static unsigned long long lsSeed(void)
{
    const char *env = getenv("IDEM_SEED");
    if (env != NULL && env[0] != '\0') {
        return strtoull(env, NULL, 0);
    }
    return (unsigned long long)time(NULL);
}

/* The same result from both state machines, compared field by field (pointers differ, so
 * the bytes they point at are compared instead). */
static void lsSameResult(const struct lockstep *ls)
{
    const struct fsm_result *x = &ls->a.r, *y = &ls->b.r;
    LS_CHECK(ls, x->outcome == y->outcome);
    LS_CHECK(ls, x->token == y->token);
    LS_CHECK(ls, x->lease_deadline_ms == y->lease_deadline_ms);
    LS_CHECK(ls, x->expires_at_ms == y->expires_at_ms);
    LS_CHECK(ls, x->retry_after_ms == y->retry_after_ms);
    LS_CHECK(ls, x->takeover == y->takeover);
    LS_CHECK(ls, x->previous_token == y->previous_token);
    LS_CHECK(ls, x->response_len == y->response_len);
    LS_CHECK(ls, (x->response == NULL) == (y->response == NULL));
    if (x->response_len > 0) {
        LS_CHECK(ls, memcmp(x->response, y->response, x->response_len) == 0);
    }
    LS_CHECK(ls, x->expired == y->expired);
    LS_CHECK(ls, x->dropped == y->dropped);
    LS_CHECK(ls, x->more == y->more);
    LS_CHECK(ls, (x->detail == NULL) == (y->detail == NULL));
    if (x->detail != NULL) {
        LS_CHECK(ls, strcmp(x->detail, y->detail) == 0);
    }
    LS_CHECK(ls, x->has_record == y->has_record);
    if (x->has_record) {
        const struct fsm_record_view *u = &x->record, *v = &y->record;
        LS_CHECK(ls, strcmp(u->tenant, v->tenant) == 0);
        LS_CHECK(ls, u->key_len == v->key_len && memcmp(u->key, v->key, u->key_len) == 0);
        LS_CHECK(ls, memcmp(u->fingerprint, v->fingerprint, 32) == 0);
        LS_CHECK(ls, u->state == v->state);
        LS_CHECK(ls, u->completion == v->completion);
        LS_CHECK(ls, u->token == v->token);
        LS_CHECK(ls, u->created_at_ms == v->created_at_ms);
        LS_CHECK(ls, u->lease_deadline_ms == v->lease_deadline_ms);
        LS_CHECK(ls, u->expires_at_ms == v->expires_at_ms);
        LS_CHECK(ls, u->response_len == v->response_len);
        if (u->response_len > 0) {
            LS_CHECK(ls, memcmp(u->response, v->response, u->response_len) == 0);
        }
    }
}

/* Both state machines hold the same state, and each one's counters add up. */
static void lsSameState(const struct lockstep *ls)
{
    uint8_t da[16], db[16];
    fsm_digest(ls->a.f, da);
    fsm_digest(ls->b.f, db);
    LS_CHECK(ls, memcmp(da, db, sizeof(da)) == 0);
    struct fsm_stats sa, sb;
    fsm_get_stats(ls->a.f, &sa);
    fsm_get_stats(ls->b.f, &sb);
    LS_CHECK(ls, memcmp(&sa, &sb, sizeof(sa)) == 0);
    LS_CHECK(ls, sa.records == sa.processing + sa.completed + sa.quarantined + sa.tombstones +
                                   sa.released);
    LS_CHECK(ls, sa.records <= LS_SLOTS);
    LS_CHECK(ls, sa.clock_ms == ls->clock);
    LS_CHECK(ls, sa.last_index < ls->a.index);
    LS_CHECK(ls, fsm_next_expiry(ls->a.f) == fsm_next_expiry(ls->b.f));
}

/* A state machine whose record table is keyed with a secret made from the run's seed and n
 * (the daemon draws one per process): b's, so that every check of a against b also shows
 * that nothing replicated depends on the key. */
static struct fsm *lsKeyedFsm(const struct lockstep *ls, uint64_t n)
{
    uint8_t secret[FSM_HASH_SECRET_LEN];
    uint64_t x = ls->seed ^ (n * UINT64_C(0x9e3779b97f4a7c15));
    for (size_t i = 0; i < sizeof secret; i++) {
        x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        secret[i] = (uint8_t)(x >> 56);
    }
    return fsm_new_with(
        &(struct fsm_options){.prefault = &prefault_thread, .hash_secret = secret});
}

/* Replaces b's state with a snapshot of itself: into a new state machine (keyed with another
 * secret), or restored over the running one, in turn. */
static void lsSnapshotRestore(struct lockstep *ls)
{
    uint8_t *snap = NULL;
    size_t len = 0;
    const char *why = NULL;
    LS_CHECK(ls, fsm_snapshot(ls->b.f, &snap, &len) == 0);
    if (ls->restores % 2 == 0) {
        struct fsm *fresh = lsKeyedFsm(ls, ls->restores + 2);
        LS_CHECK(ls, fsm_restore(fresh, snap, len, &why) == 0);
        fsm_close(ls->b.f);
        ls->b.f = fresh;
    } else {
        LS_CHECK(ls, fsm_restore(ls->b.f, snap, len, &why) == 0);
    }
    free(snap);
    ls->restores++;
    lsSameState(ls);
}

static uint64_t lsPickToken(struct lockstep *ls, int slot)
{
    uint64_t r = lsBelow(ls, 10);
    if (r < 7 && ls->cur[slot] != 0) {
        return ls->cur[slot];
    }
    if (r < 9 && ls->max_token > 0) {
        return 1 + lsBelow(ls, ls->max_token); /* most likely another key's, or stale */
    }
    return lsBelow(ls, 2 * (uint64_t)LS_STEPS);
}

/* The fencing-token rules for one acquired claim on `slot` applied at `index`. */
static void lsCheckAcquired(struct lockstep *ls, int slot, uint64_t index, const char *attempt)
{
    const struct fsm_result *r = &ls->a.r;
    LS_CHECK(ls, r->token != 0 && r->token < ls->owner_cap);
    if (r->token == index) {
        /* A new grant: a token never seen before, larger than every earlier one. */
        LS_CHECK(ls, ls->owner[r->token] == 0);
        LS_CHECK(ls, r->token > ls->max_token);
        if (r->takeover) {
            LS_CHECK(ls, r->previous_token == ls->cur[slot] && r->previous_token != 0);
            LS_CHECK(ls, r->previous_token < r->token);
        }
        ls->owner[r->token] = (uint16_t)(slot + 1);
        ls->cur[slot] = r->token;
        ls->max_token = r->token;
        ls->grants++;
        ls->recent[ls->n_recent++ % 8] = slot;
    } else {
        /* Only the holder's own retry with its attempt id gets a token back: its own. */
        LS_CHECK(ls, attempt != NULL);
        LS_CHECK(ls, !r->takeover);
        LS_CHECK(ls, ls->owner[r->token] == slot + 1);
        LS_CHECK(ls, r->token == ls->cur[slot]);
        ls->reacquires++;
    }
    LS_CHECK(ls, r->lease_deadline_ms > ls->clock);
}

/* Every visible record of the model's keys, read with get at time 0 (which moves no
 * clock), must account for the byte and record counters exactly. */
static void lsAudit(struct lockstep *ls)
{
    uint64_t bytes = 0, visible = 0;
    char key[8];
    for (int slot = 0; slot < LS_SLOTS; slot++) {
        const char *tenant = lsTenantNames[slot / LS_KEYS];
        snprintf(key, sizeof(key), "k%02d", slot % LS_KEYS);
        Idem__Outcome oa = th_get(&ls->a, 0, tenant, key);
        Idem__Outcome ob = th_get(&ls->b, 0, tenant, key);
        LS_CHECK(ls, oa == ob);
        lsSameResult(ls);
        if (oa == OK) {
            LS_CHECK(ls, ls->a.r.record.token == ls->cur[slot]);
            bytes += ls->a.r.record.key_len + 32 + ls->a.r.record.response_len;
            visible++;
        } else {
            LS_CHECK(ls, oa == NOTFOUND);
        }
    }
    struct fsm_stats st;
    fsm_get_stats(ls->a.f, &st);
    LS_CHECK(ls, st.bytes == bytes);
    LS_CHECK(ls, st.records - st.released == visible);
    lsSameState(ls);
}

/* Malformed input, the same for both: random bytes (kind 0), a valid command cut short
 * (kind 1), or a command with one field out of range (kind 2). Returns the length. */
static size_t lsMakeGarbage(struct lockstep *ls, uint8_t *buf, size_t cap, uint64_t *kind_out)
{
    uint64_t kind = lsBelow(ls, 3);
    *kind_out = kind;
    if (kind == 0) {
        size_t n = (size_t)lsBelow(ls, 48);
        for (size_t i = 0; i < n; i++) {
            buf[i] = (uint8_t)lsNext(ls);
        }
        return n;
    }
    uint8_t fp[32];
    memset(fp, 1, sizeof(fp));
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    c.tenant = (char *)"t1";
    c.key.data = (uint8_t *)"k00";
    c.key.len = 3;
    c.fingerprint.data = fp;
    c.fingerprint.len = sizeof(fp);
    c.lease_ms = 1000;
    c.ttl_ms = 1000;
    switch (lsBelow(ls, 4)) {
    case 0: c.lease_ms = 0; break;
    case 1: c.fingerprint.len = 31; break;
    case 2: c.key.data = (uint8_t *)"k 0"; break;
    default: c.policy = (Idem__LeasePolicy)9; break;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = ls->now + 1000000; /* would move the clock if it were applied */
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    size_t n = idem__command__get_packed_size(&cmd);
    assert_true(n <= cap);
    idem__command__pack(&cmd, buf);
    if (kind == 1) {
        /* A valid command cut short: the claim is the last field, so any cut breaks it. */
        c.lease_ms = 1000;
        c.fingerprint.len = 32;
        c.key.data = (uint8_t *)"k00";
        c.policy = IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED;
        n = idem__command__pack(&cmd, buf);
        n = (size_t)lsBelow(ls, n);
    }
    return n;
}

/* An operator's purge of (tenant, key). */
static Idem__Outcome lsPurge(struct th *h, uint64_t now, const char *tenant, const char *key)
{
    Idem__PurgeCmd c = IDEM__PURGE_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key.data = (uint8_t *)key;
    c.key.len = strlen(key);
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_PURGE;
    cmd.purge = &c;
    return th_apply(h, &cmd);
}

static void lsStep(struct lockstep *ls)
{
    /* The leader's clock: mostly forward, sometimes a jump that lets records expire, and
     * sometimes backwards (a new leader whose clock is behind). */
    uint64_t dt = lsBelow(ls, 100);
    if (dt < 5) {
        uint64_t back = 1 + lsBelow(ls, 5000);
        ls->now = ls->now > back ? ls->now - back : 0;
    } else if (dt < 10) {
        ls->now += 5000 + lsBelow(ls, 40000);
    } else {
        ls->now += lsBelow(ls, 300);
    }
    uint64_t op = lsBelow(ls, 100);
    /* A key acquired lately for most commands but claims, any key otherwise. */
    int slot = (int)lsBelow(ls, LS_SLOTS);
    if (ls->n_recent > 0 && lsBelow(ls, 10) < (op < 35 ? 3u : 6u)) {
        slot = ls->recent[lsBelow(ls, ls->n_recent < 8 ? ls->n_recent : 8)];
    }
    const char *tenant = lsTenantNames[slot / LS_KEYS];
    char key[8];
    snprintf(key, sizeof(key), "k%02d", slot % LS_KEYS);
    uint64_t index = ls->a.index;
    LS_CHECK(ls, ls->b.index == index);
    uint64_t before = fsm_clock(ls->a.f);
    uint8_t digest_before[16];
    fsm_digest(ls->a.f, digest_before);

    Idem__Outcome oa, ob;
    const char *attempt = NULL;
    uint64_t token = 0;
    bool is_claim = false, uses_token = false;
    if (op < 35) {
        is_claim = true;
        attempt = lsAttempts[lsBelow(ls, 5)];
        struct th_claim opt = {
            .tenant = tenant,
            .attempt = attempt,
            .lease_ms = 100 + lsBelow(ls, 3000),
            .ttl_ms = 2000 + lsBelow(ls, 40000),
            .tombstone_ttl_ms = lsBelow(ls, 2) ? 0 : 500 + lsBelow(ls, 20000),
            .policy = (Idem__LeasePolicy)lsBelow(ls, 3),
            .max_records = lsBelow(ls, 5) == 0 ? 10 + lsBelow(ls, 30) : 0,
            .max_bytes = lsBelow(ls, 5) == 0 ? 300 + lsBelow(ls, 3000) : 0,
        };
        uint8_t fp = lsBelow(ls, 8) == 0 ? 2 : 1;
        oa = th_claim(&ls->a, ls->now, key, fp, &opt);
        ob = th_claim(&ls->b, ls->now, key, fp, &opt);
    } else if (op < 50) {
        uses_token = true;
        token = lsPickToken(ls, slot);
        /* Mostly valid completions; one in twenty is unspecified, or lacks a response or has
         * a status out of range where one is needed. */
        uint64_t kind = lsBelow(ls, 20);
        Idem__Completion c = kind == 0  ? IDEM__COMPLETION__COMPLETION_UNSPECIFIED
                             : kind < 9 ? SUCCEEDED
                             : kind < 14 ? FAILED
                                         : UNKNOWN_C;
        static const uint32_t statuses[] = {200, 201, 409, 500};
        uint32_t status = statuses[lsBelow(ls, 4)];
        uint64_t odd = lsBelow(ls, 20);
        if ((c == UNKNOWN_C && odd < 10) || odd == 0) {
            status = 0; /* no response: fine for unknown only */
        } else if (odd == 1) {
            status = 99;
        }
        char body[48];
        size_t blen = (size_t)lsBelow(ls, sizeof(body));
        for (size_t i = 0; i < blen; i++) {
            body[i] = (char)('a' + lsBelow(ls, 26));
        }
        body[blen] = '\0';
        uint64_t max_bytes = lsBelow(ls, 5) == 0 ? 200 + lsBelow(ls, 3000) : 0;
        oa = th_complete(&ls->a, ls->now, tenant, key, token, c, status, body, max_bytes);
        ob = th_complete(&ls->b, ls->now, tenant, key, token, c, status, body, max_bytes);
    } else if (op < 58) {
        uses_token = true;
        token = lsPickToken(ls, slot);
        oa = th_release(&ls->a, ls->now, tenant, key, token);
        ob = th_release(&ls->b, ls->now, tenant, key, token);
    } else if (op < 66) {
        uses_token = true;
        token = lsPickToken(ls, slot);
        uint64_t lease = lsBelow(ls, 20) == 0 ? 0 : 1 + lsBelow(ls, 3000);
        oa = th_renew(&ls->a, ls->now, tenant, key, token, lease);
        ob = th_renew(&ls->b, ls->now, tenant, key, token, lease);
    } else if (op < 74) {
        oa = th_get(&ls->a, ls->now, tenant, key);
        ob = th_get(&ls->b, ls->now, tenant, key);
    } else if (op < 88) {
        uint32_t batch = lsBelow(ls, 30) == 0 ? 0 : (uint32_t)(1 + lsBelow(ls, 8));
        bool keep = lsBelow(ls, 2) == 0; /* as today's leaders propose it, or older ones */
        oa = th_expire_as(&ls->a, ls->now, batch, keep);
        ob = th_expire_as(&ls->b, ls->now, batch, keep);
    } else if (op < 93) {
        int release = (int)lsBelow(ls, 2);
        uint32_t status = release ? 0 : (lsBelow(ls, 2) ? 200 : 500);
        if (lsBelow(ls, 2)) { /* as today's leaders propose it, or as older ones did */
            oa = th_resolve_unsettled(&ls->a, ls->now, tenant, key, release, status, "decided");
            ob = th_resolve_unsettled(&ls->b, ls->now, tenant, key, release, status, "decided");
        } else {
            oa = th_resolve(&ls->a, ls->now, tenant, key, release, status, "decided");
            ob = th_resolve(&ls->b, ls->now, tenant, key, release, status, "decided");
        }
        if (oa == OK && !release && ls->a.r.token != ls->cur[slot]) {
            /* Resolving a claim whose lease ended fences its holder off: a new token, as
             * a grant's. */
            LS_CHECK(ls, ls->a.r.token == index && index > ls->max_token);
            LS_CHECK(ls, index < ls->owner_cap && ls->owner[index] == 0);
            ls->owner[index] = (uint16_t)(slot + 1);
            ls->cur[slot] = index;
            ls->max_token = index;
        }
    } else if (op < 95) {
        oa = lsPurge(&ls->a, ls->now, tenant, key);
        ob = lsPurge(&ls->b, ls->now, tenant, key);
    } else {
        uint8_t buf[256];
        uint64_t kind;
        size_t n = lsMakeGarbage(ls, buf, sizeof(buf), &kind);
        oa = fsm_apply(ls->a.f, ls->a.index++, buf, n, &ls->a.r);
        ob = fsm_apply(ls->b.f, ls->b.index++, buf, n, &ls->b.r);
        /* Random bytes could, in theory, spell a valid command; the others never do. */
        LS_CHECK(ls, kind == 0 || oa == INVALID);
    }
    LS_CHECK(ls, oa == ob);
    lsSameResult(ls);

    /* The clock: max(clock, now) for every valid command, untouched by an invalid one. */
    if (oa == INVALID) {
        uint8_t digest_after[16];
        fsm_digest(ls->a.f, digest_after);
        LS_CHECK(ls, memcmp(digest_before, digest_after, 16) == 0);
        LS_CHECK(ls, fsm_clock(ls->a.f) == before);
    } else {
        ls->clock = ls->now > before ? ls->now : before;
    }
    LS_CHECK(ls, fsm_clock(ls->a.f) == ls->clock);

    if (is_claim && oa == ACQ) {
        lsCheckAcquired(ls, slot, index, attempt);
    } else {
        LS_CHECK(ls, !ls->a.r.takeover);
    }
    if (is_claim && oa == REPLAY) {
        LS_CHECK(ls, ls->a.r.token == ls->cur[slot]);
    }
    if (uses_token && oa == OK) {
        /* Only the key's current holder's token is ever accepted. */
        LS_CHECK(ls, token == ls->cur[slot]);
    }
    lsSameState(ls);
}

static void test_randomized_lockstep_with_snapshots(void **state)
{
    (void)state;
    struct lockstep *ls = calloc(1, sizeof(*ls));
    assert_non_null(ls);
    ls->seed = lsSeed();
    print_message("lockstep seed %llu (IDEM_SEED=%llu replays this run)\n", ls->seed, ls->seed);
    ls->rng = ls->seed;
    th_init(&ls->a);
    th_init(&ls->b);
    fsm_close(ls->b.f);
    ls->b.f = lsKeyedFsm(ls, 1);
    ls->now = 1000000;
    ls->owner_cap = 4 * (size_t)LS_STEPS + (size_t)LS_STEPS / LS_AUDIT_EVERY * 2 * LS_SLOTS + 16;
    ls->owner = calloc(ls->owner_cap, sizeof(*ls->owner));
    assert_non_null(ls->owner);
    for (ls->step = 1; ls->step <= LS_STEPS; ls->step++) {
        lsStep(ls);
        if (lsBelow(ls, 150) == 0) {
            lsSnapshotRestore(ls);
        }
        if (ls->step % LS_AUDIT_EVERY == 0) {
            lsAudit(ls);
        }
    }
    print_message("lockstep: %d steps, %u restores, %u tokens granted, %u attempt-id retries\n",
                  LS_STEPS, ls->restores, ls->grants, ls->reacquires);
    th_close(&ls->a);
    th_close(&ls->b);
    free(ls->owner);
    free(ls);
}

/* Applies a complete of (t1, key) with the given limits; status 0: no response. */
static Idem__Outcome completeWithLimits(struct th *h, uint64_t now, const char *key,
                                        uint64_t token, Idem__Completion outcome,
                                        uint32_t status, uint64_t max_records,
                                        uint64_t max_bytes)
{
    Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    Idem__TenantLimits lim = IDEM__TENANT_LIMITS__INIT;
    c.tenant = "t1";
    c.key.data = (uint8_t *)key;
    c.key.len = strlen(key);
    c.token = token;
    c.outcome = outcome;
    if (status != 0) {
        resp.status = status;
        c.response = &resp;
    }
    lim.max_records = max_records;
    lim.max_bytes = max_bytes;
    c.limits = &lim;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
    cmd.complete = &c;
    return th_apply(h, &cmd);
}

/* A completion adds no record, so a records quota cannot refuse it; and a completion that
 * adds no bytes cannot be refused by a bytes quota, even when the tenant is already over it
 * (the leader lowered the quota, or an operator's resolve, which bypasses quotas, grew it).
 * Otherwise an unknown outcome cannot be recorded, the record stays processing, and after
 * the lease a takeover runs the business again on a guess. */
static void test_complete_not_refused_by_a_quota_it_does_not_grow(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "a", 1, NULL), ACQ);
    uint64_t ta = h.r.token;
    assert_int_equal(th_claim(&h, 0, "b", 1, NULL), ACQ);
    uint64_t tb = h.r.token;
    /* Two records held; the leader's records quota is now 1. */
    assert_int_equal(completeWithLimits(&h, 1, "a", ta, SUCCEEDED, 200, 1, 0), OK);
    /* 2 x 33 bytes held plus a's response; the bytes quota is now 40. */
    assert_int_equal(completeWithLimits(&h, 2, "b", tb, UNKNOWN_C, 0, 0, 40), OK);
    struct th_claim take = {.policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER};
    assert_int_equal(th_claim(&h, 5000, "b", 1, &take), UNKNOWN);
    th_close(&h);
}

/* Re-arming a quarantined record must not depend on how far the clock jumped: one expire
 * command with room for every due record turns the completed record into a tombstone,
 * instead of spending its whole batch re-arming the quarantined one, one tombstone ttl at
 * a time. */
static void test_quarantine_rearm_does_not_eat_the_batch(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim q = {.ttl_ms = 10, .tombstone_ttl_ms = 1};
    assert_int_equal(th_claim(&h, 0, "q", 1, &q), ACQ);
    assert_int_equal(th_complete(&h, 0, "t1", "q", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    struct th_claim p = {.ttl_ms = 100000, .tombstone_ttl_ms = 1000000};
    assert_int_equal(th_claim(&h, 0, "p", 1, &p), ACQ);
    assert_int_equal(th_complete(&h, 0, "t1", "p", h.r.token, SUCCEEDED, 200, "x", 0), OK);
    assert_int_equal(th_expire(&h, 200000, 100), OK);
    assert_int_equal(h.r.expired, 1);
    assert_false(h.r.more);
    th_close(&h);
}

/* A stored response must be exactly what the schema knows: protobuf-c would write unknown
 * fields back in a form it may refuse to read again (found by fuzz_rpc_request). */
static void test_response_with_unknown_fields_refused(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "k", 1, NULL), ACQ);
    Idem__StoredResponse good = IDEM__STORED_RESPONSE__INIT;
    good.status = 201;
    uint8_t buf[64];
    size_t n = idem__stored_response__pack(&good, buf);
    const uint8_t unknown[] = {0x98, 0x06, 0x01}; /* field 99, varint 1 */
    memcpy(buf + n, unknown, sizeof(unknown));
    Idem__StoredResponse *odd = idem__stored_response__unpack(NULL, n + sizeof(unknown), buf);
    assert_non_null(odd);
    assert_int_equal(odd->base.n_unknown_fields, 1);
    const char *why = NULL;
    assert_false(fsm_response_check(odd, &why));
    assert_non_null(why);
    Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
    c.tenant = "t1";
    c.key.data = (uint8_t *)"k";
    c.key.len = 1;
    c.token = h.r.token;
    c.outcome = SUCCEEDED;
    c.response = odd;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
    cmd.complete = &c;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    assert_true(fsm_response_check(&good, &why));
    /* body_ref is replayed as a header value: none with a control character. */
    uint8_t sha[32] = {0};
    good.body_sha256.data = sha;
    good.body_sha256.len = sizeof sha;
    good.body_ref = "s3://b/o";
    assert_true(fsm_response_check(&good, &why));
    good.body_ref = "s3://b/o\nv2";
    assert_false(fsm_response_check(&good, &why));
    assert_non_null(strstr(why, "body_ref"));
    idem__stored_response__free_unpacked(odd, NULL);
    th_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scenarios),
        cmocka_unit_test(test_acquired_fields),
        cmocka_unit_test(test_takeover_token_increases),
        cmocka_unit_test(test_attempt_retry_same_token),
        cmocka_unit_test(test_replay_bytes_and_get),
        cmocka_unit_test(test_tenants_are_separate),
        cmocka_unit_test(test_clock_never_goes_backwards),
        cmocka_unit_test(test_expiry_order_and_batch_bound),
        cmocka_unit_test(test_quarantine_survives_ttl),
        cmocka_unit_test(test_resolve_only_what_is_unsettled),
        cmocka_unit_test(test_resolved_quarantine_keeps_its_token),
        cmocka_unit_test(test_expire_keeps_live_leases),
        cmocka_unit_test(test_released_marker_goes_away),
        cmocka_unit_test(test_quotas),
        cmocka_unit_test(test_invalid_commands_change_nothing),
        cmocka_unit_test(test_body_ref_response),
        cmocka_unit_test(test_digest_is_deterministic),
        cmocka_unit_test(test_complete_not_refused_by_a_quota_it_does_not_grow),
        cmocka_unit_test(test_quarantine_rearm_does_not_eat_the_batch),
        cmocka_unit_test(test_response_with_unknown_fields_refused),
        cmocka_unit_test(test_lease_deadline_boundaries),
        cmocka_unit_test(test_clock_steps_back_for_every_op),
        cmocka_unit_test(test_get_reports_completion_and_creation),
        cmocka_unit_test(test_expiry_order_follows_changes),
        cmocka_unit_test(test_quota_boundaries),
        cmocka_unit_test(test_digest_covers_every_field),
        cmocka_unit_test(test_table_churn_keeps_keys_reachable),
        cmocka_unit_test(test_tenants_separate_when_hashes_collide),
        cmocka_unit_test(test_many_tenants),
        cmocka_unit_test(test_randomized_lockstep_with_snapshots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
