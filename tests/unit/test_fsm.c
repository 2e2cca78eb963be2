/* Unit tests of the state machine: every outcome of CONTRACT.md §2 against the pure FSM.
 *
 * The first test is a table of scenarios: each is a list of steps (an operation, the leader
 * clock, and the expected outcome), where a step may use the token granted by an earlier
 * step. The tests after it check properties that a table cannot say well: token values,
 * retry-after, stored bytes, expiry order, quotas, and malformed input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fsm_helpers.h"

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
    {"complete is idempotent for the same token",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ},
      {COMPLETE, 10, 0, NULL, 0, 1, SUCCEEDED, OK},
      {COMPLETE, 20, 0, NULL, 0, 1, SUCCEEDED, OK},
      {COMPLETE, 30, 0, NULL, 0, 1, FAILED, OK},
      {CLAIM, 40, 1, NULL, 0, 0, 0, REPLAY}}},
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
    {"get of a claimed key",
     {{CLAIM, 0, 1, NULL, 0, 0, 0, ACQ}, {GET, 10, 0, NULL, 0, 0, 0, OK}}},
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
        cmocka_unit_test(test_released_marker_goes_away),
        cmocka_unit_test(test_quotas),
        cmocka_unit_test(test_invalid_commands_change_nothing),
        cmocka_unit_test(test_body_ref_response),
        cmocka_unit_test(test_digest_is_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
