/* Unit tests of snapshots: restore(snapshot(S)) equals S (by digest, by stats and by how it
 * answers afterwards), and a snapshot that is not valid is refused without touching the
 * running state. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm_helpers.h"

#define SUCCEEDED IDEM__COMPLETION__COMPLETION_SUCCEEDED
#define UNKNOWN_C IDEM__COMPLETION__COMPLETION_UNKNOWN

static void assertSameState(struct fsm *a, struct fsm *b)
{
    char da[33], db[33];
    fsm_digest_hex(a, da);
    fsm_digest_hex(b, db);
    assert_string_equal(da, db);
    struct fsm_stats sa, sb;
    fsm_get_stats(a, &sa);
    fsm_get_stats(b, &sb);
    assert_int_equal(sa.records, sb.records);
    assert_int_equal(sa.processing, sb.processing);
    assert_int_equal(sa.completed, sb.completed);
    assert_int_equal(sa.quarantined, sb.quarantined);
    assert_int_equal(sa.tombstones, sb.tombstones);
    assert_int_equal(sa.released, sb.released);
    assert_int_equal(sa.bytes, sb.bytes);
    assert_int_equal(sa.clock_ms, sb.clock_ms);
    assert_int_equal(sa.last_index, sb.last_index);
    assert_int_equal(fsm_next_expiry(a), fsm_next_expiry(b));
}

/* Fills h with n records in every state, over three tenants, with and without attempt ids
 * and bodies. Deterministic. */
static void populate(struct th *h, int n)
{
    static const char *tenants[] = {"acme", "globex", "initech"};
    char key[32], body[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "order-%07d", i);
        struct th_claim opt = {
            .tenant = tenants[i % 3],
            .attempt = i % 4 == 0 ? key : NULL,
            .ttl_ms = 1000 + (uint64_t)(i % 97) * 10,
            .lease_ms = 500,
        };
        uint64_t now = (uint64_t)i / 100;
        assert_int_equal(th_claim(h, now, key, (uint8_t)(i % 251), &opt),
                         IDEM__OUTCOME__OUTCOME_ACQUIRED);
        uint64_t tok = h->r.token;
        switch (i % 5) {
        case 0:
        case 1:
            snprintf(body, sizeof(body), "{\"order\":%d}", i);
            th_complete(h, now, tenants[i % 3], key, tok, SUCCEEDED, 201, body, 0);
            break;
        case 2:
            th_complete(h, now, tenants[i % 3], key, tok, UNKNOWN_C, 0, NULL, 0);
            break;
        case 3:
            th_release(h, now, tenants[i % 3], key, tok);
            break;
        default:
            break; /* stays processing */
        }
    }
    /* Turn the earliest ones into tombstones. */
    th_expire(h, 1100, 1000);
}

static void test_round_trip_100k(void **state)
{
    (void)state;
    struct th a, b;
    th_init(&a);
    th_init(&b);
    populate(&a, 100000);
    struct fsm_stats st;
    fsm_get_stats(a.f, &st);
    assert_true(st.tombstones > 0 && st.completed > 0 && st.quarantined > 0 &&
                st.processing > 0 && st.released > 0);

    /* b holds unrelated state that the restore must replace entirely. */
    th_claim(&b, 5, "leftover", 9, NULL);

    uint8_t *snap = NULL;
    size_t len = 0;
    assert_int_equal(fsm_snapshot(a.f, &snap, &len), 0);
    const char *why = NULL;
    assert_int_equal(fsm_restore(b.f, snap, len, &why), 0);
    assertSameState(a.f, b.f);

    /* The snapshot of the restored copy restores to the same state again. */
    uint8_t *snap2 = NULL;
    size_t len2 = 0;
    fsm_snapshot(b.f, &snap2, &len2);
    assert_int_equal(len2, len);
    struct fsm *c = fsm_new();
    assert_int_equal(fsm_restore(c, snap2, len2, NULL), 0);
    assertSameState(a.f, c);
    fsm_close(c);
    free(snap2);
    free(snap);

    /* Both answer every later command the same way, and stay equal. */
    b.index = a.index;
    char key[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "order-%07d", (i * 37) % 100500);
        static const char *tenants[] = {"acme", "globex", "initech"};
        struct th_claim opt = {.tenant = tenants[i % 3],
                               .policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER};
        Idem__Outcome oa = th_claim(&a, 1200 + (uint64_t)i, key, (uint8_t)(i % 7), &opt);
        Idem__Outcome ob = th_claim(&b, 1200 + (uint64_t)i, key, (uint8_t)(i % 7), &opt);
        assert_int_equal(oa, ob);
        assert_int_equal(a.r.token, b.r.token);
        assert_int_equal(a.r.response_len, b.r.response_len);
        if (a.r.response_len > 0) {
            assert_memory_equal(a.r.response, b.r.response, a.r.response_len);
        }
        if (i % 100 == 0) {
            th_expire(&a, 1200 + (uint64_t)i * 5, 500);
            th_expire(&b, 1200 + (uint64_t)i * 5, 500);
            assert_int_equal(a.r.expired, b.r.expired);
            assert_int_equal(a.r.dropped, b.r.dropped);
        }
    }
    assertSameState(a.f, b.f);
    th_close(&a);
    th_close(&b);
}

/* A table that grew to hold 2000 records and then lost most of them keeps its large slot
 * array, while the restored copy is sized for what is left: the two lay their records out
 * differently, and must still have the same digest and answer the same way. */
static void test_round_trip_after_deletions(void **state)
{
    (void)state;
    struct th a;
    th_init(&a);
    char key[32];
    uint64_t tok[2000];
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "gone-%d", i);
        struct th_claim opt = {.tenant = i % 2 ? "acme" : "globex"};
        assert_int_equal(th_claim(&a, 10, key, 1, &opt), IDEM__OUTCOME__OUTCOME_ACQUIRED);
        tok[i] = a.r.token;
    }
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "gone-%d", i);
        const char *tenant = i % 2 ? "acme" : "globex";
        if (i % 20 == 0) {
            assert_int_equal(th_complete(&a, 20, tenant, key, tok[i], SUCCEEDED, 200, key, 0),
                             IDEM__OUTCOME__OUTCOME_OK);
        } else {
            assert_int_equal(th_resolve(&a, 20, tenant, key, 1, 0, NULL),
                             IDEM__OUTCOME__OUTCOME_OK);
        }
    }
    uint8_t *snap = NULL;
    size_t len = 0;
    fsm_snapshot(a.f, &snap, &len);
    struct th b;
    th_init(&b);
    assert_int_equal(fsm_restore(b.f, snap, len, NULL), 0);
    free(snap);
    assertSameState(a.f, b.f);
    b.index = a.index;
    for (int i = 0; i < 2000; i += 10) {
        snprintf(key, sizeof(key), "gone-%d", i);
        struct th_claim opt = {.tenant = i % 2 ? "acme" : "globex"};
        Idem__Outcome oa = th_claim(&a, 30, key, 1, &opt);
        Idem__Outcome ob = th_claim(&b, 30, key, 1, &opt);
        assert_int_equal(oa, ob);
        assert_int_equal(oa, i % 20 == 0 ? IDEM__OUTCOME__OUTCOME_REPLAY
                                         : IDEM__OUTCOME__OUTCOME_ACQUIRED);
    }
    assertSameState(a.f, b.f);
    th_close(&a);
    th_close(&b);
}

static void test_empty_round_trip(void **state)
{
    (void)state;
    struct fsm *a = fsm_new(), *b = fsm_new();
    uint8_t *snap;
    size_t len;
    fsm_snapshot(a, &snap, &len);
    assert_int_equal(fsm_restore(b, snap, len, NULL), 0);
    assertSameState(a, b);
    free(snap);
    fsm_close(a);
    fsm_close(b);
}

/* ---- refusals ------------------------------------------------------------------------ */

/* Builds snapshot bytes by hand, so each test can break exactly one rule while keeping the
 * checksum right. */
struct sbuf {
    uint8_t p[4096];
    size_t n;
};

static void sPut(struct sbuf *s, const void *p, size_t n)
{
    assert_true(s->n + n <= sizeof(s->p));
    memcpy(s->p + s->n, p, n);
    s->n += n;
}

static void sLE(struct sbuf *s, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));
        sPut(s, &b, 1);
    }
}

static void sMsg(struct sbuf *s, const ProtobufCMessage *m)
{
    uint8_t tmp[1024];
    assert_true(protobuf_c_message_get_packed_size(m) <= sizeof(tmp));
    size_t n = protobuf_c_message_pack(m, tmp);
    /* The length goes first, as a varint. */
    for (size_t v = n;; v >>= 7) {
        uint8_t b = (uint8_t)(v & 0x7f);
        if (v >= 0x80) {
            b |= 0x80;
        }
        sPut(s, &b, 1);
        if (v < 0x80) {
            break;
        }
    }
    sPut(s, tmp, n);
}

/* Starts a snapshot whose header holds the given tenants and format. */
static void sStartHeader(struct sbuf *s, uint64_t count, uint64_t last_index, char **tenants,
                         size_t n_tenants, uint32_t format)
{
    s->n = 0;
    sPut(s, "IDEMSNAP", 8);
    sLE(s, 1, 4);
    Idem__SnapshotHeader h = IDEM__SNAPSHOT_HEADER__INIT;
    h.format = format;
    h.clock_ms = 100;
    h.record_count = count;
    h.n_tenants = n_tenants;
    h.tenants = tenants;
    h.last_index = last_index;
    sMsg(s, &h.base);
}

static void sStart(struct sbuf *s, uint64_t count, uint64_t last_index)
{
    char *tenants[] = {"acme"};
    sStartHeader(s, count, last_index, tenants, 1, 1);
}

static void sFinish(struct sbuf *s)
{
    sLE(s, XXH3_64bits(s->p, s->n), 8);
}

static uint8_t goodFp[32];

static Idem__Record goodRecord(const char *key)
{
    Idem__Record r = IDEM__RECORD__INIT;
    r.key.data = (uint8_t *)key;
    r.key.len = strlen(key);
    r.fingerprint.data = goodFp;
    r.fingerprint.len = 32;
    r.state = IDEM__RECORD_STATE__RECORD_STATE_PROCESSING;
    r.token = 5;
    r.created_at_ms = 10;
    r.lease_deadline_ms = 1010;
    r.expires_at_ms = 5000;
    r.tombstone_ttl_ms = 5000;
    return r;
}

/* Restores `s` into a state machine that holds one record and checks the outcome; on
 * refusal the state must be untouched. */
static void expectRestore(const struct sbuf *s, int want, const char *label)
{
    struct th h;
    th_init(&h);
    th_claim(&h, 1, "existing", 3, NULL);
    char before[33], after[33];
    fsm_digest_hex(h.f, before);
    const char *why = NULL;
    int rc = fsm_restore(h.f, s->p, s->n, &why);
    if (rc != want) {
        fail_msg("%s: restore returned %d (%s), expected %d", label, rc, why ? why : "-", want);
    }
    if (rc != 0) {
        assert_non_null(why);
        fsm_digest_hex(h.f, after);
        assert_string_equal(before, after);
        assert_int_equal(th_claim(&h, 2, "existing", 3, NULL),
                         IDEM__OUTCOME__OUTCOME_IN_PROGRESS);
    }
    th_close(&h);
}

static void test_handmade_good_snapshot(void **state)
{
    (void)state;
    struct sbuf s;
    sStart(&s, 1, 5);
    Idem__Record r = goodRecord("k1");
    sMsg(&s, &r.base);
    sFinish(&s);
    expectRestore(&s, 0, "good");
}

/* Records are restored by batches (fsm_snapshot.c, RESTORE_BATCH): a snapshot of many
 * records crossing several batches restores them all, and a duplicate refuses the
 * snapshot (the state untouched) whether it repeats a key of its own batch, of an earlier
 * batch, or the batch's last record. */
static void test_records_restored_by_batches(void **state)
{
    (void)state;
    enum { N = 41 };
    char keys[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "key-%02d", i);
    }
    struct sbuf s;
    sStart(&s, N, 5);
    for (int i = 0; i < N; i++) {
        Idem__Record r = goodRecord(keys[i]);
        sMsg(&s, &r.base);
    }
    sFinish(&s);
    expectRestore(&s, 0, "41 records");
    struct fsm *f = fsm_new();
    assert_int_equal(fsm_restore(f, s.p, s.n, NULL), 0);
    struct fsm_stats st;
    fsm_get_stats(f, &st);
    assert_int_equal(st.records, N);
    assert_int_equal(st.processing, N);
    fsm_close(f);

    /* {position of the duplicate, position of the record it repeats} */
    static const int dups[][2] = {{5, 2}, {15, 0}, {16, 15}, {37, 3}, {40, 39}};
    for (size_t d = 0; d < sizeof(dups) / sizeof(dups[0]); d++) {
        sStart(&s, N, 5);
        for (int i = 0; i < N; i++) {
            Idem__Record r = goodRecord(keys[i == dups[d][0] ? dups[d][1] : i]);
            sMsg(&s, &r.base);
        }
        sFinish(&s);
        expectRestore(&s, -1, "duplicate across batches");
        const char *why = NULL;
        f = fsm_new();
        assert_int_equal(fsm_restore(f, s.p, s.n, &why), -1);
        assert_string_equal(why, "duplicate record");
        fsm_close(f);
    }
}

static void test_refuses_bad_snapshots(void **state)
{
    (void)state;
    struct sbuf s;
    Idem__Record r;

    sStart(&s, 1, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    sFinish(&s);
    s.p[0] = 'X';
    expectRestore(&s, -1, "bad magic");

    sStart(&s, 0, 5);
    s.p[8] = 2;
    sFinish(&s);
    expectRestore(&s, -1, "unknown format");

    sStart(&s, 1, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    sFinish(&s);
    s.p[s.n - 12] ^= 0x01;
    expectRestore(&s, -1, "checksum");

    sStart(&s, 2, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    sFinish(&s);
    expectRestore(&s, -1, "fewer records than declared");

    sStart(&s, 1, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    r = goodRecord("k2");
    sMsg(&s, &r.base);
    sFinish(&s);
    expectRestore(&s, -1, "trailing record");

    sStart(&s, 2, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    sMsg(&s, &r.base);
    sFinish(&s);
    expectRestore(&s, -1, "duplicate record");

    static const char *labels[] = {
        "unknown tenant",         "invalid key",
        "short fingerprint",      "bad state",
        "token beyond last index", "response while processing",
        "completed without response", "zero tombstone ttl",
        "bad attempt digest",     "malformed response",
        "unknown completion",     "response with status out of range",
        "zero token",             "state unspecified",
    };
    for (size_t i = 0; i < sizeof(labels) / sizeof(labels[0]); i++) {
        sStart(&s, 1, 5);
        r = goodRecord("k1");
        static uint8_t junk[3] = {0xff, 0xff, 0xff};
        switch (i) {
        case 0: r.tenant_index = 1; break;
        case 1: r.key.data = (uint8_t *)"a b"; r.key.len = 3; break;
        case 2: r.fingerprint.len = 16; break;
        case 3: r.state = (Idem__RecordState)9; break;
        case 4: r.token = 6; break;
        case 5: /* a valid StoredResponse (status 200), in a state that keeps none */
            r.response.data = (uint8_t *)"\x08\xc8\x01";
            r.response.len = 3;
            break;
        case 6: r.state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED; break;
        case 7: r.tombstone_ttl_ms = 0; break;
        case 8: r.attempt_digest.data = junk; r.attempt_digest.len = 3; break;
        case 9: r.state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
                r.response.data = junk; r.response.len = 3; break;
        case 10: r.completion = (Idem__Completion)7; break;
        case 11: /* a well-formed StoredResponse with status 99 */
            r.state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
            r.response.data = (uint8_t *)"\x08\x63";
            r.response.len = 2;
            break;
        case 12: r.token = 0; break;
        case 13: r.state = IDEM__RECORD_STATE__RECORD_STATE_UNSPECIFIED; break;
        }
        sMsg(&s, &r.base);
        sFinish(&s);
        expectRestore(&s, -1, labels[i]);
    }

    /* Header rules: tenant names non-empty, at most 128 bytes and distinct; the header's
     * own format number; a record count that the bytes could hold. */
    char longName[130];
    memset(longName, 'n', 129);
    longName[129] = '\0';
    char *repeated[] = {"acme", "acme"};
    char *empty[] = {""};
    char *tooLong[] = {longName};
    char *fine[] = {"acme"};
    struct {
        const char *label;
        char **tenants;
        size_t n;
        uint32_t format;
        uint64_t count;
    } headers[] = {
        {"repeated tenant", repeated, 2, 1, 0},
        {"empty tenant", empty, 1, 1, 0},
        {"tenant name of 129 bytes", tooLong, 1, 1, 0},
        {"header format 2", fine, 1, 2, 0},
        {"record count far beyond the bytes", fine, 1, 1, UINT64_C(1) << 50},
    };
    for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
        sStartHeader(&s, headers[i].count, 5, headers[i].tenants, headers[i].n,
                     headers[i].format);
        sFinish(&s);
        expectRestore(&s, -1, headers[i].label);
    }
    /* A name of exactly 128 bytes is allowed. */
    longName[128] = '\0';
    sStartHeader(&s, 0, 5, tooLong, 1, 1);
    sFinish(&s);
    expectRestore(&s, 0, "tenant name of 128 bytes");

    /* Cut anywhere: always refused, never a crash. */
    sStart(&s, 1, 5);
    r = goodRecord("k1");
    sMsg(&s, &r.base);
    sFinish(&s);
    struct sbuf cut;
    for (size_t n = 0; n < s.n; n++) {
        memcpy(cut.p, s.p, n);
        cut.n = n;
        expectRestore(&cut, -1, "truncated");
    }
}

/* Flipping any single byte of a real snapshot is caught. */
static void test_every_byte_flip_refused(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    populate(&h, 50);
    uint8_t *snap;
    size_t len;
    fsm_snapshot(h.f, &snap, &len);
    struct fsm *x = fsm_new();
    for (size_t i = 0; i < len; i++) {
        snap[i] ^= 0x40;
        assert_int_equal(fsm_restore(x, snap, len, NULL), -1);
        snap[i] ^= 0x40;
    }
    assert_int_equal(fsm_restore(x, snap, len, NULL), 0);
    assertSameState(h.f, x);
    fsm_close(x);
    free(snap);
    th_close(&h);
}

/* ---- frozen views (fsm_freeze): snapshots taken while applies go on ------------------ */

/* One deterministic mutating command for step i: claims (fresh keys in an extra tenant, so
 * the table grows and rehashes and the tenant array grows; takeovers of lapsed leases;
 * re-claims of released keys), completes, releases, renews, resolves (with a response, and
 * releases that free records) and expires (tombstones, drops). It reads the record first
 * with a get so that it aims at the state the record is in. */
static Idem__Outcome mutateStep(struct th *h, int i, int populated)
{
    static const char *tenants[] = {"acme", "globex", "initech"};
    char key[32];
    uint64_t now = 1200 + (uint64_t)i / 3;
    int k = (int)(((unsigned)i * 7919u) % (unsigned)populated);
    const char *tenant = tenants[k % 3];
    snprintf(key, sizeof(key), "order-%07d", k);
    switch (i % 7) {
    case 0: {
        /* A fresh key in a tenant the frozen view does not know. */
        snprintf(key, sizeof(key), "fresh-%07d", i);
        struct th_claim opt = {.tenant = i % 2 ? "newco" : "acme", .ttl_ms = 20000 + (uint64_t)(i % 5) * 100};
        return th_claim(h, now, key, 3, &opt);
    }
    case 1: {
        struct th_claim opt = {.tenant = tenant,
                               .policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER};
        return th_claim(h, now, key, (uint8_t)(k % 251), &opt);
    }
    case 2:
    case 3:
    case 4:
        if (th_get(h, now, tenant, key) != IDEM__OUTCOME__OUTCOME_OK) {
            return th_expire(h, now, 50);
        }
        if (h->r.record.state == IDEM__RECORD_STATE__RECORD_STATE_PROCESSING) {
            uint64_t tok = h->r.record.token;
            if (i % 7 == 2) {
                return th_complete(h, now, tenant, key, tok, SUCCEEDED, 200, "{\"late\":1}", 0);
            }
            if (i % 7 == 3) {
                return th_release(h, now, tenant, key, tok);
            }
            return th_renew(h, now, tenant, key, tok, 700);
        }
        if (h->r.record.state == IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED) {
            return th_resolve(h, now, tenant, key, 0, 409, "{\"resolved\":1}");
        }
        if (h->r.record.state == IDEM__RECORD_STATE__RECORD_STATE_COMPLETED) {
            return th_resolve(h, now, tenant, key, 1, 0, NULL); /* frees the record */
        }
        return th_expire(h, now, 50);
    case 5:
        return th_expire(h, now + 500, 300);
    default:
        return th_resolve(h, now, tenant, key, 1, 0, NULL);
    }
}

/* Applies step i to both and checks that they answered alike. */
static void mutateBoth(struct th *a, struct th *b, int i, int populated)
{
    Idem__Outcome oa = mutateStep(a, i, populated);
    Idem__Outcome ob = mutateStep(b, i, populated);
    assert_int_equal(oa, ob);
    assert_int_equal(a->r.token, b->r.token);
    assert_int_equal(a->r.expired, b->r.expired);
    assert_int_equal(a->r.dropped, b->r.dropped);
    assert_int_equal(a->r.response_len, b->r.response_len);
}

static void restoredDigest(const uint8_t *snap, size_t len, char out[33])
{
    struct fsm *x = fsm_new();
    const char *why = NULL;
    assert_int_equal(fsm_restore(x, snap, len, &why), 0);
    fsm_digest_hex(x, out);
    fsm_close(x);
}

/* A view frozen before many applies serialises to exactly the state at the freeze, while
 * the live state machine goes on exactly as one that never froze anything (its twin). */
static void test_frozen_view_under_applies(void **state)
{
    (void)state;
    enum { POPULATED = 3000, STEPS = 42000 };
    struct th a, twin;
    th_init(&a);
    th_init(&twin);
    populate(&a, POPULATED);
    populate(&twin, POPULATED);
    assertSameState(a.f, twin.f);

    char at_freeze[33];
    fsm_digest_hex(a.f, at_freeze);
    struct fsm_stats before;
    fsm_get_stats(a.f, &before);
    uint8_t *sync_snap = NULL;
    size_t sync_len = 0;
    fsm_snapshot(a.f, &sync_snap, &sync_len);

    struct fsm_frozen *z = fsm_freeze(a.f);
    assert_non_null(z);
    assert_null(fsm_freeze(a.f)); /* one view at a time */
    assert_int_equal(fsm_frozen_records(z), before.records);

    uint64_t dropped = 0, expired = 0;
    for (int i = 0; i < STEPS; i++) {
        mutateBoth(&a, &twin, i, POPULATED);
        dropped += a.r.dropped;
        expired += a.r.expired;
    }
    struct fsm_stats after;
    fsm_get_stats(a.f, &after);
    /* The workload did what it claims: the table grew well past the slot array it had at
     * the freeze (rehashes), a tenant was added, records expired and were dropped. */
    assert_true(after.records > 2 * before.records);
    assert_true(after.tenants > before.tenants);
    assert_true(expired > 0 && dropped > 0);
    assertSameState(a.f, twin.f);

    uint8_t *snap = NULL;
    size_t len = 0;
    assert_int_equal(fsm_frozen_write(z, &snap, &len), 0);
    /* Byte for byte what fsm_snapshot wrote at the freeze. */
    assert_int_equal(len, sync_len);
    assert_memory_equal(snap, sync_snap, len);
    char from_view[33], live[33], twin_d[33];
    restoredDigest(snap, len, from_view);
    assert_string_equal(from_view, at_freeze);
    fsm_digest_hex(a.f, live);
    fsm_digest_hex(twin.f, twin_d);
    assert_string_equal(live, twin_d);
    assert_string_not_equal(live, at_freeze);
    free(snap);
    free(sync_snap);

    fsm_thaw(a.f, z);
    assertSameState(a.f, twin.f);
    /* The thaw kept the view's slot copy for the next freeze. */
    struct fsm_stats st;
    fsm_get_stats(a.f, &st);
    uint64_t spare = st.snapshot_spare_bytes;
    assert_true(spare > 0);
    /* After the thaw: more applies, a second freeze, and the live state still matches. The
     * table outgrew the first copy, so this one is a new, larger one; a third freeze at the
     * same table size copies into the second's (stale slots left there must not show). */
    for (int round = 0; round < 2; round++) {
        int from = STEPS + round * 6000;
        for (int i = from; i < from + 3000; i++) {
            mutateBoth(&a, &twin, i, POPULATED);
        }
        fsm_digest_hex(a.f, at_freeze);
        z = fsm_freeze(a.f);
        assert_non_null(z);
        for (int i = from + 3000; i < from + 6000; i++) {
            mutateBoth(&a, &twin, i, POPULATED);
        }
        fsm_frozen_write(z, &snap, &len);
        restoredDigest(snap, len, from_view);
        assert_string_equal(from_view, at_freeze);
        free(snap);
        fsm_thaw(a.f, z);
        assertSameState(a.f, twin.f);
        uint64_t before_round = spare;
        fsm_get_stats(a.f, &st);
        spare = st.snapshot_spare_bytes;
        if (round == 0) {
            assert_true(spare > before_round); /* a new copy, for the grown table */
        } else {
            assert_int_equal(spare, before_round); /* the same size again */
        }
    }
    th_close(&a);
    th_close(&twin);
}

/* A restore while a view is frozen replaces the live table; the view still serialises the
 * state at its freeze, and the old table is freed at the thaw (LSan checks). */
static void test_frozen_view_survives_restore(void **state)
{
    (void)state;
    struct th a, other;
    th_init(&a);
    th_init(&other);
    populate(&a, 2000);
    populate(&other, 500);
    th_claim(&other, 50, "only-in-other", 1, NULL);
    char at_freeze[33];
    fsm_digest_hex(a.f, at_freeze);
    struct fsm_frozen *z = fsm_freeze(a.f);
    assert_non_null(z);
    for (int i = 0; i < 3000; i++) {
        mutateStep(&a, i, 2000);
    }
    uint8_t *osnap = NULL;
    size_t olen = 0;
    fsm_snapshot(other.f, &osnap, &olen);
    assert_int_equal(fsm_restore(a.f, osnap, olen, NULL), 0);
    free(osnap);
    assertSameState(a.f, other.f);
    /* Applies on the restored table (none of its records is the view's). */
    a.index = other.index;
    for (int i = 0; i < 2000; i++) {
        mutateBoth(&a, &other, i, 500);
    }
    uint8_t *snap = NULL;
    size_t len = 0;
    fsm_frozen_write(z, &snap, &len);
    char from_view[33];
    restoredDigest(snap, len, from_view);
    assert_string_equal(from_view, at_freeze);
    free(snap);
    fsm_thaw(a.f, z);
    assertSameState(a.f, other.f);
    th_close(&a);
    th_close(&other);
}

/* Replaces a's state with a fresh one of n records, freezes it, checks the view against the
 * state at the freeze, thaws, and returns the bytes kept for the next freeze. */
static uint64_t freezeAfterRestore(struct th *a, int n)
{
    struct th src;
    th_init(&src);
    populate(&src, n);
    uint8_t *snap = NULL;
    size_t len = 0;
    fsm_snapshot(src.f, &snap, &len);
    assert_int_equal(fsm_restore(a->f, snap, len, NULL), 0);
    free(snap);
    th_close(&src);
    char at_freeze[33], from_view[33];
    fsm_digest_hex(a->f, at_freeze);
    struct fsm_frozen *z = fsm_freeze(a->f);
    assert_non_null(z);
    fsm_frozen_write(z, &snap, &len);
    restoredDigest(snap, len, from_view);
    assert_string_equal(from_view, at_freeze);
    free(snap);
    fsm_thaw(a->f, z);
    struct fsm_stats st;
    fsm_get_stats(a->f, &st);
    return st.snapshot_spare_bytes;
}

/* The thaw keeps the view's slot copy and the next freeze copies into it: a table half the
 * size still uses it (so the bytes kept stay those of the larger copy, which a new copy of
 * the table's own size would halve); one a quarter of the size or less gets a copy of its
 * own, and that replaces the over-large one. Each view is checked against its state. */
static void test_freeze_reuses_kept_copy(void **state)
{
    (void)state;
    struct th a;
    th_init(&a);
    uint64_t big = freezeAfterRestore(&a, 2000);
    assert_true(big > 0);
    assert_int_equal(freezeAfterRestore(&a, 1000), big);
    uint64_t small = freezeAfterRestore(&a, 500);
    assert_true(small > 0 && small * 4 <= big);
    th_close(&a);
}

/* fsm_close with a view still frozen frees everything (LSan checks). */
static void test_close_while_frozen(void **state)
{
    (void)state;
    struct th a;
    th_init(&a);
    populate(&a, 500);
    assert_non_null(fsm_freeze(a.f));
    for (int i = 0; i < 2000; i++) {
        mutateStep(&a, i, 500);
    }
    th_close(&a);
}

int main(void)
{
    memset(goodFp, 7, sizeof(goodFp));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_100k),
        cmocka_unit_test(test_round_trip_after_deletions),
        cmocka_unit_test(test_empty_round_trip),
        cmocka_unit_test(test_handmade_good_snapshot),
        cmocka_unit_test(test_records_restored_by_batches),
        cmocka_unit_test(test_refuses_bad_snapshots),
        cmocka_unit_test(test_every_byte_flip_refused),
        cmocka_unit_test(test_frozen_view_under_applies),
        cmocka_unit_test(test_frozen_view_survives_restore),
        cmocka_unit_test(test_freeze_reuses_kept_copy),
        cmocka_unit_test(test_close_while_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
