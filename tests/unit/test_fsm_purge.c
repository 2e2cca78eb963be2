/* Unit tests of the operator's commands in the state machine: purge (an admin's last
 * resort that deletes a record or a tombstone outright on every replica), the quarantined
 * records listing behind `idemctl quarantine list`, and the op-less command the service
 * proposes as a read barrier. The randomized lockstep of test_fsm.c applies purges too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fsm_helpers.h"

#define ACQ IDEM__OUTCOME__OUTCOME_ACQUIRED
#define REPLAY IDEM__OUTCOME__OUTCOME_REPLAY
#define UNKNOWN IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN
#define EXPIRED IDEM__OUTCOME__OUTCOME_EXPIRED
#define OK IDEM__OUTCOME__OUTCOME_OK
#define NOTFOUND IDEM__OUTCOME__OUTCOME_NOT_FOUND
#define QUOTA IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED
#define INVALID IDEM__OUTCOME__OUTCOME_INVALID
#define INPROG IDEM__OUTCOME__OUTCOME_IN_PROGRESS

#define SUCCEEDED IDEM__COMPLETION__COMPLETION_SUCCEEDED
#define UNKNOWN_C IDEM__COMPLETION__COMPLETION_UNKNOWN

#define ST_PROCESSING IDEM__RECORD_STATE__RECORD_STATE_PROCESSING
#define ST_COMPLETED IDEM__RECORD_STATE__RECORD_STATE_COMPLETED
#define ST_QUARANTINED IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED
#define ST_TOMBSTONE IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE

static Idem__Outcome purge(struct th *h, uint64_t now, const char *tenant, const char *key)
{
    Idem__PurgeCmd c = IDEM__PURGE_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key.data = (uint8_t *)key;
    c.key.len = key ? strlen(key) : 0;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_PURGE;
    cmd.purge = &c;
    return th_apply(h, &cmd);
}

static struct fsm_stats stats(const struct th *h)
{
    struct fsm_stats st;
    fsm_get_stats(h->f, &st);
    return st;
}

/* Puts (t1, key) into `state` at times from `now` on; returns the record's token. */
static uint64_t makeRecord(struct th *h, uint64_t now, const char *key, Idem__RecordState state)
{
    struct th_claim opt = {.ttl_ms = 1000, .tombstone_ttl_ms = 5000};
    assert_int_equal(th_claim(h, now, key, 1, &opt), ACQ);
    uint64_t token = h->r.token;
    switch (state) {
    case ST_PROCESSING:
        break;
    case ST_COMPLETED:
        assert_int_equal(th_complete(h, now, "t1", key, token, SUCCEEDED, 201, "stored", 0), OK);
        break;
    case ST_QUARANTINED:
        assert_int_equal(th_complete(h, now, "t1", key, token, UNKNOWN_C, 0, NULL, 0), OK);
        break;
    case ST_TOMBSTONE:
        assert_int_equal(th_complete(h, now, "t1", key, token, SUCCEEDED, 200, "x", 0), OK);
        assert_int_equal(th_expire(h, now + 1000, 16), OK);
        assert_int_equal(h->r.expired, 1);
        break;
    default:
        fail_msg("no such state");
    }
    assert_int_equal(th_get(h, 0, "t1", key), OK);
    assert_int_equal(h->r.record.state, state);
    return token;
}

/* Every visible state can be purged: the record, its usage and its expiry entry go, and
 * the key can be claimed afresh, with a larger token. */
static void test_purge_every_state(void **state)
{
    (void)state;
    static const Idem__RecordState states[] = {ST_PROCESSING, ST_COMPLETED, ST_QUARANTINED,
                                               ST_TOMBSTONE};
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        struct th h;
        th_init(&h);
        uint64_t token = makeRecord(&h, 100, "k", states[i]);
        struct fsm_stats st = stats(&h);
        assert_int_equal(st.records, 1);
        assert_true(st.bytes > 0);
        assert_int_not_equal(fsm_next_expiry(h.f), UINT64_MAX);

        assert_int_equal(purge(&h, 5000, "t1", "k"), OK);
        assert_int_equal(h.r.token, token); /* which attempt was dropped */
        st = stats(&h);
        assert_int_equal(st.records, 0);
        assert_int_equal(st.processing + st.completed + st.quarantined + st.tombstones, 0);
        assert_int_equal(st.bytes, 0);
        assert_int_equal(fsm_next_expiry(h.f), UINT64_MAX);
        assert_int_equal(fsm_clock(h.f), 5000);
        assert_int_equal(th_get(&h, 5000, "t1", "k"), NOTFOUND);

        /* No 410, no 409, no replay: the key is new again, and the token still fences. */
        assert_int_equal(th_claim(&h, 5001, "k", 2, NULL), ACQ);
        assert_true(h.r.token > token);
        assert_false(h.r.takeover);
        th_close(&h);
    }
}

/* Absent records answer not_found and change nothing: a second purge is exactly as
 * harmless as a read (same digest as a state machine that read instead). */
static void test_purge_absent_and_repeated(void **state)
{
    (void)state;
    struct th a, b;
    th_init(&a);
    th_init(&b);
    for (struct th *h = &a; h != NULL; h = h == &a ? &b : NULL) {
        makeRecord(h, 100, "k", ST_COMPLETED);
        makeRecord(h, 100, "other", ST_PROCESSING);
        assert_int_equal(purge(h, 200, "t1", "k"), OK);
    }
    assert_int_equal(purge(&a, 300, "t1", "k"), NOTFOUND);
    assert_int_equal(a.r.token, 0);
    assert_int_equal(th_get(&b, 300, "t1", "k"), NOTFOUND);
    char da[33], db[33];
    fsm_digest_hex(a.f, da);
    fsm_digest_hex(b.f, db);
    assert_string_equal(da, db);

    assert_int_equal(purge(&a, 300, "t1", "never-claimed"), NOTFOUND);
    assert_int_equal(purge(&a, 300, "no-such-tenant", "other"), NOTFOUND);
    assert_int_equal(purge(&a, 300, "t2", "other"), NOTFOUND); /* tenants stay apart */
    assert_int_equal(th_get(&a, 300, "t1", "other"), OK);
    assert_int_equal(stats(&a).records, 1);
    th_close(&a);
    th_close(&b);
}

/* A released marker is invisible (docs/contract.md, release): purge treats it as absent and
 * leaves it, so a repeated release with its token still answers ok. */
static void test_purge_leaves_released_marker(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    assert_int_equal(th_claim(&h, 0, "k", 1, NULL), ACQ);
    uint64_t token = h.r.token;
    assert_int_equal(th_release(&h, 1, "t1", "k", token), OK);
    assert_int_equal(purge(&h, 2, "t1", "k"), NOTFOUND);
    assert_int_equal(stats(&h).released, 1);
    assert_int_equal(th_release(&h, 3, "t1", "k", token), OK);
    th_close(&h);
}

/* Malformed purges are refused and change nothing, not even the clock. */
static void test_purge_invalid_changes_nothing(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    makeRecord(&h, 100, "k", ST_COMPLETED);
    char before[33], after[33];
    fsm_digest_hex(h.f, before);
    assert_int_equal(purge(&h, 9999, "", "k"), INVALID);
    assert_non_null(h.r.detail);
    assert_int_equal(purge(&h, 9999, NULL, "k"), INVALID);
    assert_int_equal(purge(&h, 9999, "t1", ""), INVALID);
    assert_int_equal(purge(&h, 9999, "t1", "a key"), INVALID);
    char long_key[257];
    memset(long_key, 'k', 256);
    long_key[256] = '\0';
    assert_int_equal(purge(&h, 9999, "t1", long_key), INVALID);
    fsm_digest_hex(h.f, after);
    assert_string_equal(before, after);
    assert_int_equal(fsm_clock(h.f), 100);
    th_close(&h);
}

/* The expiry index stays exact: purging the first, a middle and the last record to expire
 * moves fsm_next_expiry accordingly, and expire then touches only the records left. */
static void test_purge_keeps_expiry_index(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    char key[16];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "k%02d", i);
        struct th_claim opt = {.ttl_ms = 1000 + (uint64_t)i * 100, .tombstone_ttl_ms = 100000};
        assert_int_equal(th_claim(&h, 0, key, 1, &opt), ACQ);
    }
    assert_int_equal(fsm_next_expiry(h.f), 1000);
    assert_int_equal(purge(&h, 1, "t1", "k00"), OK);
    assert_int_equal(fsm_next_expiry(h.f), 1100);
    assert_int_equal(purge(&h, 1, "t1", "k10"), OK);
    assert_int_equal(purge(&h, 1, "t1", "k19"), OK);
    assert_int_equal(fsm_next_expiry(h.f), 1100);
    /* Everything left expires into tombstones, in one batch. */
    assert_int_equal(th_expire(&h, 3000, 100), OK);
    assert_int_equal(h.r.expired, 17);
    assert_int_equal(h.r.dropped, 0);
    struct fsm_stats st = stats(&h);
    assert_int_equal(st.tombstones, 17);
    assert_int_equal(st.records, 17);
    assert_int_equal(th_claim(&h, 3001, "k10", 1, NULL), ACQ); /* purged: new */
    assert_int_equal(th_claim(&h, 3001, "k11", 1, NULL), EXPIRED);
    th_close(&h);
}

/* Quotas count exactly what is left: a tenant at its records or bytes quota gets room
 * back when a record is purged, and another tenant's usage is untouched. */
static void test_purge_gives_quota_back(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    struct th_claim lim = {.max_records = 2};
    assert_int_equal(th_claim(&h, 0, "a", 1, &lim), ACQ);
    assert_int_equal(th_complete(&h, 0, "t1", "a", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);
    assert_int_equal(th_claim(&h, 0, "b", 1, &lim), ACQ);
    assert_int_equal(th_claim(&h, 0, "c", 1, &lim), QUOTA);
    struct th_claim other = {.tenant = "t2"};
    assert_int_equal(th_claim(&h, 0, "a", 1, &other), ACQ);
    uint64_t bytes_t2 = 1 + 32;
    assert_int_equal(purge(&h, 1, "t1", "a"), OK); /* a quarantined record, too */
    assert_int_equal(th_claim(&h, 1, "c", 1, &lim), ACQ);
    assert_int_equal(stats(&h).bytes, 2 * (1 + 32) + bytes_t2);

    /* Bytes: a stored response counts until the record is purged. */
    char body[151];
    memset(body, 'x', 150);
    body[150] = '\0';
    struct th_claim blim = {.tenant = "t3", .max_bytes = 300};
    assert_int_equal(th_claim(&h, 2, "x", 1, &blim), ACQ);
    assert_int_equal(th_complete(&h, 2, "t3", "x", h.r.token, SUCCEEDED, 200, body, 300), OK);
    assert_int_equal(th_claim(&h, 2, "y", 1, &blim), ACQ);
    uint64_t ty = h.r.token;
    assert_int_equal(th_complete(&h, 2, "t3", "y", ty, SUCCEEDED, 200, body, 300), QUOTA);
    assert_int_equal(purge(&h, 3, "t3", "x"), OK);
    assert_int_equal(th_complete(&h, 3, "t3", "y", ty, SUCCEEDED, 200, body, 300), OK);
    th_close(&h);
}

/* A snapshot after purges restores to the same digest, and the same purge applied to the
 * original and to the restored copy keeps them equal. */
static void test_purge_and_snapshot(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    char key[16];
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "k%02d", i);
        makeRecord(&h, (uint64_t)i, key, (Idem__RecordState)(1 + i % 3));
    }
    for (int i = 0; i < 50; i += 7) {
        snprintf(key, sizeof(key), "k%02d", i);
        assert_int_equal(purge(&h, 100, "t1", key), OK);
    }
    uint8_t *snap = NULL;
    size_t len = 0;
    const char *why = NULL;
    assert_int_equal(fsm_snapshot(h.f, &snap, &len), 0);
    struct th r;
    th_init(&r);
    assert_int_equal(fsm_restore(r.f, snap, len, &why), 0);
    free(snap);
    r.index = h.index;
    char d1[33], d2[33];
    fsm_digest_hex(h.f, d1);
    fsm_digest_hex(r.f, d2);
    assert_string_equal(d1, d2);
    assert_int_equal(purge(&h, 200, "t1", "k01"), OK);
    assert_int_equal(purge(&r, 200, "t1", "k01"), OK);
    assert_int_equal(purge(&h, 200, "t1", "k07"), NOTFOUND);
    assert_int_equal(purge(&r, 200, "t1", "k07"), NOTFOUND);
    fsm_digest_hex(h.f, d1);
    fsm_digest_hex(r.f, d2);
    assert_string_equal(d1, d2);
    assert_int_equal(fsm_next_expiry(h.f), fsm_next_expiry(r.f));
    th_close(&h);
    th_close(&r);
}

/* fsm_quarantined: quarantined records only, lowest token first, filtered by tenant,
 * bounded by cap while still counting every match; resolve and purge take records off. */
static void test_quarantined_listing(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    uint64_t tokens[6];
    char key[16];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "q%d", i);
        struct th_claim opt = {.tenant = i % 2 ? "t2" : "t1"};
        assert_int_equal(th_claim(&h, (uint64_t)i, key, 1, &opt), ACQ);
        tokens[i] = h.r.token;
        /* Some noise in other states. */
        snprintf(key, sizeof(key), "n%d", i);
        assert_int_equal(th_claim(&h, (uint64_t)i, key, 1, &opt), ACQ);
    }
    /* Quarantine in reverse order: the listing follows tokens, not completion order. */
    for (int i = 5; i >= 0; i--) {
        snprintf(key, sizeof(key), "q%d", i);
        assert_int_equal(
            th_complete(&h, 10, i % 2 ? "t2" : "t1", key, tokens[i], UNKNOWN_C, 0, NULL, 0), OK);
    }
    assert_int_equal(th_complete(&h, 10, "t1", "n0", tokens[0] + 1, SUCCEEDED, 200, "ok", 0), OK);

    struct fsm_record_view v[8];
    assert_int_equal(fsm_quarantined(h.f, NULL, false, 0, v, 8), 6);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(v[i].token, tokens[i]);
        assert_int_equal(v[i].state, ST_QUARANTINED);
        assert_int_equal(v[i].completion, UNKNOWN_C);
        assert_string_equal(v[i].tenant, i % 2 ? "t2" : "t1");
        snprintf(key, sizeof(key), "q%d", i);
        assert_int_equal(v[i].key_len, 2);
        assert_memory_equal(v[i].key, key, 2);
        assert_int_equal(v[i].created_at_ms, (uint64_t)i);
    }
    assert_int_equal(fsm_quarantined(h.f, "", false, 0, v, 8), 6);
    assert_int_equal(fsm_quarantined(h.f, "t2", false, 0, v, 8), 3);
    assert_int_equal(v[0].token, tokens[1]);
    assert_int_equal(v[2].token, tokens[5]);
    assert_int_equal(fsm_quarantined(h.f, "nobody", false, 0, v, 8), 0);

    /* cap 2 of 6: the two oldest, and the total says more are left. */
    memset(v, 0, sizeof(v));
    assert_int_equal(fsm_quarantined(h.f, NULL, false, 0, v, 2), 6);
    assert_int_equal(v[0].token, tokens[0]);
    assert_int_equal(v[1].token, tokens[1]);
    assert_int_equal(v[2].token, 0); /* nothing written past cap */

    assert_int_equal(th_resolve(&h, 20, "t1", "q0", 1, 0, NULL), OK);
    assert_int_equal(purge(&h, 20, "t2", "q1"), OK);
    assert_int_equal(fsm_quarantined(h.f, NULL, false, 0, v, 8), 4);
    assert_int_equal(v[0].token, tokens[2]);
    assert_int_equal(stats(&h).quarantined, 4);
    th_close(&h);

    struct th empty;
    th_init(&empty);
    assert_int_equal(fsm_quarantined(empty.f, NULL, false, 0, v, 8), 0);
    th_close(&empty);
}

/* fsm_quarantined with lease_ended: records in processing whose lease has ended by the
 * state machine's clock, lowest token first, by tenant; not quarantined or completed ones,
 * nor a live lease; resolve takes one off. */
static void test_lease_ended_listing(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    /* At 0: a and c with 1 s leases (t1, t2), b with 10 s (t1); d completed; e quarantined. */
    struct th_claim s1 = {.tenant = "t1", .lease_ms = 1000};
    struct th_claim s2 = {.tenant = "t2", .lease_ms = 1000};
    struct th_claim l1 = {.tenant = "t1", .lease_ms = 10000};
    assert_int_equal(th_claim(&h, 0, "a", 1, &s1), ACQ);
    uint64_t ta = h.r.token;
    assert_int_equal(th_claim(&h, 0, "b", 1, &l1), ACQ);
    assert_int_equal(th_claim(&h, 0, "c", 1, &s2), ACQ);
    uint64_t tc = h.r.token;
    assert_int_equal(th_claim(&h, 0, "d", 1, &s1), ACQ);
    assert_int_equal(th_complete(&h, 1, "t1", "d", h.r.token, SUCCEEDED, 200, "ok", 0), OK);
    assert_int_equal(th_claim(&h, 0, "e", 1, &s1), ACQ);
    assert_int_equal(th_complete(&h, 1, "t1", "e", h.r.token, UNKNOWN_C, 0, NULL, 0), OK);

    struct fsm_record_view v[8];
    /* At 999 ms by the clock no lease has ended. */
    assert_int_equal(th_claim(&h, 999, "clock", 1, &l1), ACQ);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 0, v, 8), 0);
    /* At 1000 a's and c's have (the deadline is the first instant without a lease). */
    assert_int_equal(th_claim(&h, 1000, "clock2", 1, &l1), ACQ);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 0, v, 8), 2);
    assert_int_equal(v[0].token, ta);
    assert_int_equal(v[0].state, ST_PROCESSING);
    assert_memory_equal(v[0].key, "a", 1);
    assert_int_equal(v[1].token, tc);
    assert_int_equal(fsm_quarantined(h.f, "t2", true, 0, v, 8), 1);
    assert_int_equal(v[0].token, tc);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 0, v, 1), 2); /* cap 1 of 2 */
    /* The quarantined one is listed without lease_ended only. */
    assert_int_equal(fsm_quarantined(h.f, NULL, false, 0, v, 8), 1);
    assert_memory_equal(v[0].key, "e", 1);
    /* A later time than the clock's (the barrier's, on an idle cluster) counts: at 10000
     * b's lease has ended too, with no command at 10000 applied yet. */
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 9999, v, 8), 2);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 10000, v, 8), 3);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 500, v, 8), 2); /* never the clock's past */
    /* Resolved, a is off the list. */
    assert_int_equal(th_resolve(&h, 1001, "t1", "a", 1, 0, NULL), OK);
    assert_int_equal(fsm_quarantined(h.f, NULL, true, 0, v, 8), 1);
    assert_int_equal(v[0].token, tc);
    th_close(&h);
}

/* The service's read barrier is a Command with a clock and no op: every replica answers it
 * invalid and changes nothing, not even the clock it carries (fsm.h). */
static void test_opless_command_changes_nothing(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    makeRecord(&h, 100, "k", ST_QUARANTINED);
    char before[33], after[33];
    fsm_digest_hex(h.f, before);
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = 1000000;
    assert_int_equal(th_apply(&h, &cmd), INVALID);
    fsm_digest_hex(h.f, after);
    assert_string_equal(before, after);
    assert_int_equal(fsm_clock(h.f), 100);
    /* The next command at the next index is fine: the barrier took no index. */
    assert_int_equal(th_claim(&h, 101, "k", 1, NULL), UNKNOWN);
    th_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_purge_every_state),
        cmocka_unit_test(test_purge_absent_and_repeated),
        cmocka_unit_test(test_purge_leaves_released_marker),
        cmocka_unit_test(test_purge_invalid_changes_nothing),
        cmocka_unit_test(test_purge_keeps_expiry_index),
        cmocka_unit_test(test_purge_gives_quota_back),
        cmocka_unit_test(test_purge_and_snapshot),
        cmocka_unit_test(test_quarantined_listing),
        cmocka_unit_test(test_lease_ended_listing),
        cmocka_unit_test(test_opless_command_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
