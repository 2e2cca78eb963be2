/* fsm: apply, digest and the per-operation rules of docs/contract.md.
 *
 * Every apply function follows the same shape: validate the whole command first (an
 * invalid command changes nothing, not even the clock), then advance the clock
 * (clock = max(clock, now)), then decide. Tenant usage is kept exact by uncounting a
 * record before it changes and counting it again after (recUncount / recCount). */
#include "fsm.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "arena.h"
#include "key.h"
#include "fsm_internal.h"
#include "xmalloc.h"

/* A released record is kept this long (or until its ttl, if sooner) so that a repeated
 * release with the same token answers ok (docs/contract.md: release is idempotent). It is a
 * compile-time constant, not configuration, so every replica decides the same. */
#define FSM_RELEASED_KEEP_MS (10u * 60u * 1000u)

#define ARENA_BYTES (64u * 1024u)

static uint64_t addSat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

_Static_assert(FSM_HASH_SECRET_LEN == TABLE_SECRET_LEN, "fsm.h and table.h: one secret size");

struct fsm *fsm_new_with(const struct fsm_options *opt)
{
    struct fsm *f = xcalloc(1, sizeof(*f));
    if (opt != NULL) {
        f->opt = *opt;
    }
    if (f->opt.hash_secret != NULL) {
        memcpy(f->secret, f->opt.hash_secret, TABLE_SECRET_LEN);
        f->opt.hash_secret = f->secret;
    }
    table_init(&f->t, f->opt.prefault, f->opt.hash_secret);
    f->spare_pf.with = f->opt.prefault;
    arena_init(&f->arena, ARENA_BYTES);
    return f;
}

struct fsm *fsm_new(void)
{
    return fsm_new_with(NULL);
}

void fsm_close(struct fsm *f)
{
    if (f == NULL) {
        return;
    }
    if (f->frozen != NULL) {
        fsm_thaw(f, f->frozen);
    }
    xbig_prefault_wait(&f->spare_pf);
    xbig_free(f->spare_slots, f->spare_n * sizeof(*f->spare_slots));
    table_close(&f->t);
    arena_close(&f->arena);
    free(f);
}

uint64_t fsm_clock(const struct fsm *f)
{
    return f->clock;
}

/* ---- accounting ---------------------------------------------------------------------- */

size_t fsm_rec_response_len(const struct rec *r)
{
    if (r->response == NULL) {
        return 0;
    }
    uint32_t n;
    memcpy(&n, r->response, sizeof(n));
    return n;
}

static uint64_t recBytes(const struct rec *r)
{
    return (uint64_t)r->key_len + FSM_FINGERPRINT_LEN + fsm_rec_response_len(r);
}

static bool recCounted(const struct rec *r)
{
    return r->state != IDEM__RECORD_STATE__RECORD_STATE_RELEASED;
}

void fsm_rec_count(struct fsm *f, const struct rec *r)
{
    assert(r->state < FSM_STATES);
    f->n_state[r->state]++;
    if (recCounted(r)) {
        struct tenant *tn = &f->t.tenants[r->tenant];
        uint64_t b = recBytes(r);
        tn->records++;
        tn->bytes += b;
        f->bytes += b;
    }
}

static void recUncount(struct fsm *f, const struct rec *r)
{
    assert(f->n_state[r->state] > 0);
    f->n_state[r->state]--;
    if (recCounted(r)) {
        struct tenant *tn = &f->t.tenants[r->tenant];
        uint64_t b = recBytes(r);
        assert(tn->records > 0 && tn->bytes >= b && f->bytes >= b);
        tn->records--;
        tn->bytes -= b;
        f->bytes -= b;
    }
}

static void recSetResponse(struct rec *r, uint8_t *stored)
{
    free(r->response);
    r->response = stored;
}

/* ---- copy-on-write while a view is frozen (fsm.h, fsm_freeze) ------------------------
 *
 * Every write to a record goes through recWritable() first, and every removal through
 * recRemove(): with no view frozen they cost one test of f->frozen. */

bool fsm_rec_frozen(const struct fsm *f, const struct rec *r)
{
    const struct fsm_frozen *z = f->frozen;
    if (z == NULL || z->detached) {
        return false;
    }
    return table_slots_hold(z->slots, z->mask, table_rec_hash(&f->t, r), r);
}

/* The record to modify in r's place: r itself, or, when the frozen view holds r, a copy
 * that replaces r in the table (r goes to the view, untouched). */
static struct rec *recWritable(struct fsm *f, struct rec *r)
{
    if (!fsm_rec_frozen(f, r)) {
        return r;
    }
    struct rec *c = table_clone(&f->t, r, table_rec_hash(&f->t, r));
    fsm_frozen_retire(f->frozen, r);
    return c;
}

static void recRemove(struct fsm *f, struct rec *r)
{
    recUncount(f, r);
    if (fsm_rec_frozen(f, r)) {
        table_unlink(&f->t, r);
        fsm_frozen_retire(f->frozen, r);
    } else {
        table_remove(&f->t, r);
    }
}

/* ---- validation helpers -------------------------------------------------------------- */

static bool tenantValid(const char *tenant)
{
    size_t n = tenant ? strnlen(tenant, FSM_TENANT_MAX + 1) : 0;
    return n > 0 && n <= FSM_TENANT_MAX;
}

/* How a key is judged: key.c's rule with a length bound, KEY_MAX_LEN at apply, a tenant's
 * key_max_len (no more) before the log; `rc` keeps the verdict (fsm_command_check). */
struct keyRule {
    size_t max_len;
    int rc;
};
#define KEY_RULE_APPLY ((struct keyRule){KEY_MAX_LEN, KEY_OK})

static bool keyValid(struct keyRule *kr, const ProtobufCBinaryData *key)
{
    kr->rc = key_validate(key->data, key->len, kr->max_len);
    return kr->rc == KEY_OK;
}

static bool completionValid(Idem__Completion c)
{
    return c == IDEM__COMPLETION__COMPLETION_SUCCEEDED ||
           c == IDEM__COMPLETION__COMPLETION_FAILED_FINAL ||
           c == IDEM__COMPLETION__COMPLETION_UNKNOWN;
}

bool fsm_response_valid(const Idem__StoredResponse *resp, const char **why)
{
    /* protobuf-c keeps unknown fields and writes them back when the response is stored,
     * in a form it may then refuse to read (a tag 0 written over-long): a stored response
     * must be exactly what this schema knows. */
    if (resp->base.n_unknown_fields != 0) {
        *why = "response has fields this version does not know";
        return false;
    }
    for (size_t i = 0; i < resp->n_headers; i++) {
        if (resp->headers[i] != NULL && resp->headers[i]->base.n_unknown_fields != 0) {
            *why = "response header has fields this version does not know";
            return false;
        }
    }
    if (resp->status < 100 || resp->status > 599) {
        *why = "response status out of range 100-599";
        return false;
    }
    if (resp->n_headers > FSM_HEADERS_MAX) {
        *why = "too many response headers";
        return false;
    }
    for (size_t i = 0; i < resp->n_headers; i++) {
        const Idem__Header *h = resp->headers[i];
        if (h == NULL || h->name == NULL || h->name[0] == '\0') {
            *why = "response header without a name";
            return false;
        }
    }
    if (resp->body_sha256.len != 0 && resp->body_sha256.len != 32) {
        *why = "body_sha256 must be 32 bytes";
        return false;
    }
    if (resp->body_ref != NULL && resp->body_ref[0] != '\0') {
        if (resp->body.len != 0) {
            *why = "body and body_ref are exclusive";
            return false;
        }
        if (resp->body_sha256.len != 32) {
            *why = "body_ref requires body_sha256";
            return false;
        }
    }
    if (protobuf_c_message_get_packed_size(&resp->base) > FSM_RESPONSE_MAX) {
        *why = "stored response too large";
        return false;
    }
    return true;
}

/* Packs a validated response into the record format: u32 length, then the packed bytes.
 * The caller owns the result. */
static uint8_t *responseStore(const Idem__StoredResponse *resp, size_t *len /* OUT */)
{
    size_t n = protobuf_c_message_get_packed_size(&resp->base);
    assert(n <= FSM_RESPONSE_MAX);
    uint8_t *buf = xmalloc(sizeof(uint32_t) + n);
    uint32_t n32 = (uint32_t)n;
    memcpy(buf, &n32, sizeof(n32));
    protobuf_c_message_pack(&resp->base, buf + sizeof(uint32_t));
    *len = n;
    return buf;
}

static void outResponse(const struct rec *r, struct fsm_result *out)
{
    out->response_len = fsm_rec_response_len(r);
    out->response = r->response ? r->response + sizeof(uint32_t) : NULL;
}

static Idem__Outcome invalid(struct fsm_result *out, const char *why)
{
    out->outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    out->detail = why;
    return out->outcome;
}

static void advanceClock(struct fsm *f, uint64_t now)
{
    if (now > f->clock) {
        f->clock = now;
    }
}

/* Finds (tenant, key); NULL when either is unknown. Released markers are returned too. */
static struct rec *findRecord(const struct fsm *f, const char *tenant,
                              const ProtobufCBinaryData *key)
{
    int tn = table_tenant_find(&f->t, tenant, strlen(tenant));
    if (tn < 0) {
        return NULL;
    }
    uint64_t h = table_hash(&f->t, tn, key->data, key->len);
    return table_find(&f->t, tn, h, key->data, key->len);
}

static bool isLive(const struct rec *r)
{
    return r != NULL && r->state != IDEM__RECORD_STATE__RECORD_STATE_RELEASED;
}

/* ---- claim --------------------------------------------------------------------------- */

static void attemptDigest(const ProtobufCBinaryData *attempt, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(attempt->data, attempt->len));
    memcpy(out, c.digest, 16);
}

static bool limitsAllow(const Idem__TenantLimits *lim, const struct tenant *tn,
                        uint64_t add_records, uint64_t add_bytes)
{
    if (lim == NULL) {
        return true;
    }
    /* Only a dimension the command grows can refuse it: a tenant already over a quota
     * (lowered by the leader, or grown by an operator's resolve) must still be able to
     * complete what it holds, or an unknown outcome could not be recorded. */
    if (add_records > 0 && lim->max_records != 0 && tn->records + add_records > lim->max_records) {
        return false;
    }
    if (add_bytes > 0 && lim->max_bytes != 0 && tn->bytes + add_bytes > lim->max_bytes) {
        return false;
    }
    return true;
}

static void grantLease(struct rec *r, uint64_t index, uint64_t now, const Idem__ClaimCmd *c)
{
    r->token = index;
    r->lease_deadline = addSat(now, c->lease_ms);
    r->has_attempt = c->attempt_id.len > 0;
    if (r->has_attempt) {
        attemptDigest(&c->attempt_id, r->attempt);
    } else {
        memset(r->attempt, 0, sizeof(r->attempt));
    }
}

/* The checks of a claim that need no state (fsm_command_check). NULL when it passes. */
static const char *claimCheck(const Idem__ClaimCmd *c, struct keyRule *kr)
{
    if (!tenantValid(c->tenant)) {
        return "claim: tenant missing or too long";
    }
    if (!keyValid(kr, &c->key)) {
        return "claim: key missing or invalid";
    }
    if (c->fingerprint.len != FSM_FINGERPRINT_LEN) {
        return "claim: fingerprint must be 32 bytes";
    }
    if (c->attempt_id.len > FSM_ATTEMPT_MAX) {
        return "claim: attempt id longer than 64 bytes";
    }
    if (c->lease_ms == 0 || c->ttl_ms == 0) {
        return "claim: lease_ms and ttl_ms must be positive";
    }
    if (c->policy != IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED &&
        c->policy != IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT &&
        c->policy != IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER) {
        return "claim: unknown lease policy";
    }
    return NULL;
}

/* Answers acquired with r's token, lease and expiry. */
static Idem__Outcome acquired(const struct rec *r, struct fsm_result *out)
{
    out->outcome = IDEM__OUTCOME__OUTCOME_ACQUIRED;
    out->token = r->token;
    out->lease_deadline_ms = r->lease_deadline;
    out->expires_at_ms = r->expires_at;
    return out->outcome;
}

/* A claim of a key with no live record: r is NULL (a new record, inserted with hash h) or a
 * released one that the key may be claimed again over. */
static Idem__Outcome claimNew(struct fsm *f, uint64_t index, int tn, uint64_t h, struct rec *r,
                              const Idem__ClaimCmd *c, struct fsm_result *out)
{
    const uint64_t now = f->clock;
    if (!limitsAllow(c->limits, &f->t.tenants[tn], 1, (uint64_t)c->key.len + FSM_FINGERPRINT_LEN)) {
        out->outcome = IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED;
        return out->outcome;
    }
    bool fresh = r == NULL;
    if (fresh) {
        r = table_insert(&f->t, tn, h, c->key.data, c->key.len);
        fsm_spare_step(f);
    } else {
        r = recWritable(f, r);
        recUncount(f, r);
    }
    memcpy(r->fp, c->fingerprint.data, FSM_FINGERPRINT_LEN);
    r->state = IDEM__RECORD_STATE__RECORD_STATE_PROCESSING;
    r->completion = IDEM__COMPLETION__COMPLETION_UNSPECIFIED;
    recSetResponse(r, NULL);
    r->created_at = now;
    r->expires_at = addSat(now, c->ttl_ms);
    r->tombstone_ttl = c->tombstone_ttl_ms ? c->tombstone_ttl_ms : c->ttl_ms;
    grantLease(r, index, now, c);
    if (fresh) {
        expiry_push(&f->t.heap, r);
    } else {
        expiry_update(&f->t.heap, r);
    }
    fsm_rec_count(f, r);
    return acquired(r, out);
}

/* A claim, with the same fingerprint, of a record in processing: the holder's own retry,
 * in progress, or a lease that ran out (taken over, or lease_expired). */
static Idem__Outcome claimHeld(struct fsm *f, uint64_t index, struct rec *r,
                               const Idem__ClaimCmd *c, struct fsm_result *out)
{
    const uint64_t now = f->clock;
    if (r->has_attempt && c->attempt_id.len > 0) {
        uint8_t d[16];
        attemptDigest(&c->attempt_id, d);
        if (memcmp(d, r->attempt, sizeof(d)) == 0) {
            /* The holder's own retry (its answer was lost): same token. If its lease ran
             * out meanwhile and nobody took over, it gets a fresh one. */
            if (now >= r->lease_deadline) {
                r = recWritable(f, r);
                r->lease_deadline = addSat(now, c->lease_ms);
            }
            return acquired(r, out);
        }
    }
#ifdef IDEM_TEST_BROKEN_TAKEOVER
    /* A deliberately broken build for the chaos suite's test of its own checker
     * (tests/chaos/CMakeLists.txt, idemd-broken-takeover): a takeover claim does not wait
     * for the holder's lease to run out. Never defined in a product build. */
    bool live = now < r->lease_deadline && c->policy != IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER;
#else
    bool live = now < r->lease_deadline;
#endif
    if (live) {
        out->outcome = IDEM__OUTCOME__OUTCOME_IN_PROGRESS;
        out->retry_after_ms = r->lease_deadline - now;
        out->expires_at_ms = r->expires_at;
        return out->outcome;
    }
    if (c->policy != IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER) {
        out->outcome = IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED;
        out->lease_deadline_ms = r->lease_deadline;
        out->expires_at_ms = r->expires_at;
        return out->outcome;
    }
    r = recWritable(f, r);
    out->previous_token = r->token;
    grantLease(r, index, now, c);
    expiry_update(&f->t.heap, r); /* the token is part of the expiry order */
    out->takeover = true;
    return acquired(r, out);
}

static Idem__Outcome applyClaim(struct fsm *f, uint64_t index, uint64_t now_cmd,
                                const Idem__ClaimCmd *c, struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    const char *bad = claimCheck(c, &kr);
    if (bad != NULL) {
        return invalid(out, bad);
    }
    int tn = table_tenant_intern(&f->t, c->tenant, strlen(c->tenant));
    if (tn < 0) {
        return invalid(out, "claim: too many tenants");
    }
    advanceClock(f, now_cmd);
    uint64_t h = table_hash(&f->t, tn, c->key.data, c->key.len);
    struct rec *r = table_find(&f->t, tn, h, c->key.data, c->key.len);
    if (!isLive(r)) {
        return claimNew(f, index, tn, h, r, c, out);
    }
    if (!fp_equal(r->fp, c->fingerprint.data)) {
        /* Same key, another request: refuse and leave the record untouched (§3). The
         * record's ttl deadline (a tombstone's: when it is dropped) says when the key is
         * free; a quarantined record has none. */
        out->outcome = IDEM__OUTCOME__OUTCOME_MISMATCH;
        if (r->state != IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED) {
            out->expires_at_ms = r->expires_at;
        }
        return out->outcome;
    }
    switch ((Idem__RecordState)r->state) {
    case IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE:
        out->outcome = IDEM__OUTCOME__OUTCOME_EXPIRED;
        out->expires_at_ms = r->expires_at; /* when the tombstone is dropped */
        return out->outcome;
    case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED:
        out->outcome = IDEM__OUTCOME__OUTCOME_REPLAY;
        out->token = r->token;
        out->expires_at_ms = r->expires_at;
        outResponse(r, out);
        return out->outcome;
    case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED:
        out->outcome = IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN;
        return out->outcome;
    case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING:
        return claimHeld(f, index, r, c, out);
    default:
        assert(0 && "unreachable record state");
        abort();
    }
}

/* ---- complete, release, renew, get, resolve ------------------------------------------ */

/* The record a complete or renew by `token` acts on, `bad` being what its stateless check
 * (completeCheck, renewCheck) said. NULL with out->outcome invalid (bad != NULL; nothing
 * changes), or, once the clock is advanced to now_cmd, not_found when the key has no live
 * record (or a tombstone), or lease_lost when another token holds it. */
static struct rec *heldRecord(struct fsm *f, const char *bad, uint64_t now_cmd, const char *tenant,
                              const ProtobufCBinaryData *key, uint64_t token,
                              struct fsm_result *out)
{
    if (bad != NULL) {
        invalid(out, bad);
        return NULL;
    }
    advanceClock(f, now_cmd);
    struct rec *r = findRecord(f, tenant, key);
    if (!isLive(r) || r->state == IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE) {
        out->outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        return NULL;
    }
    if (r->token != token) {
        out->outcome = IDEM__OUTCOME__OUTCOME_LEASE_LOST;
        return NULL;
    }
    return r;
}

static const char *completeCheck(const Idem__CompleteCmd *c, struct keyRule *kr)
{
    const char *why = NULL;
    if (!tenantValid(c->tenant) || !keyValid(kr, &c->key)) {
        return "complete: tenant or key missing or invalid";
    }
    if (!completionValid(c->outcome)) {
        return "complete: outcome must be succeeded, failed_final or unknown";
    }
    if (c->response == NULL && c->outcome != IDEM__COMPLETION__COMPLETION_UNKNOWN) {
        return "complete: a final outcome needs a response";
    }
    if (c->response != NULL && !fsm_response_valid(c->response, &why)) {
        return why;
    }
    return NULL;
}

static Idem__Outcome applyComplete(struct fsm *f, uint64_t now_cmd, const Idem__CompleteCmd *c,
                                   struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    struct rec *r =
        heldRecord(f, completeCheck(c, &kr), now_cmd, c->tenant, &c->key, c->token, out);
    if (r == NULL) {
        return out->outcome;
    }
    if (r->state != IDEM__RECORD_STATE__RECORD_STATE_PROCESSING) {
        /* Completed or quarantined by this very token. With the same outcome, a repeat (a
         * retry whose first answer was lost) changes nothing and answers ok; its response is
         * not compared, the first one stays. Another outcome is no repeat: lease_lost, as a
         * release after complete, so that nobody believes a quarantine ended, or an outcome
         * changed, when it did not. */
        if (r->completion != (uint8_t)c->outcome) {
            out->outcome = IDEM__OUTCOME__OUTCOME_LEASE_LOST;
            out->detail = "complete: this token already completed the record with another "
                          "outcome, which stays (resolve ends a quarantine)";
            return out->outcome;
        }
        out->outcome = IDEM__OUTCOME__OUTCOME_OK;
        out->token = r->token;
        return out->outcome;
    }
    size_t n = 0;
    uint8_t *stored = c->response ? responseStore(c->response, &n) : NULL;
    if (!limitsAllow(c->limits, &f->t.tenants[r->tenant], 0, n)) {
        free(stored);
        out->outcome = IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED;
        return out->outcome;
    }
    r = recWritable(f, r);
    recUncount(f, r);
    recSetResponse(r, stored);
    r->completion = (uint8_t)c->outcome;
    r->state = c->outcome == IDEM__COMPLETION__COMPLETION_UNKNOWN
                   ? IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED
                   : IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
    fsm_rec_count(f, r);
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    out->token = r->token;
    out->expires_at_ms = r->expires_at;
    return out->outcome;
}

static Idem__Outcome applyRelease(struct fsm *f, uint64_t now_cmd, const Idem__ReleaseCmd *c,
                                  struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    if (!tenantValid(c->tenant) || !keyValid(&kr, &c->key)) {
        return invalid(out, "release: tenant or key missing or invalid");
    }
    advanceClock(f, now_cmd);
    struct rec *r = findRecord(f, c->tenant, &c->key);
    if (r == NULL || r->state == IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE) {
        out->outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        return out->outcome;
    }
    if (r->token != c->token) {
        out->outcome = r->state == IDEM__RECORD_STATE__RECORD_STATE_RELEASED
                           ? IDEM__OUTCOME__OUTCOME_NOT_FOUND
                           : IDEM__OUTCOME__OUTCOME_LEASE_LOST;
        return out->outcome;
    }
    if (r->state == IDEM__RECORD_STATE__RECORD_STATE_RELEASED) {
        out->outcome = IDEM__OUTCOME__OUTCOME_OK; /* repeated release */
        return out->outcome;
    }
    if (r->state != IDEM__RECORD_STATE__RECORD_STATE_PROCESSING) {
        /* The holder already completed: releasing now would drop a stored outcome. */
        out->outcome = IDEM__OUTCOME__OUTCOME_LEASE_LOST;
        return out->outcome;
    }
    r = recWritable(f, r);
    recUncount(f, r);
    r->state = IDEM__RECORD_STATE__RECORD_STATE_RELEASED;
    recSetResponse(r, NULL);
    uint64_t keep = addSat(f->clock, FSM_RELEASED_KEEP_MS);
    if (keep < r->expires_at) {
        r->expires_at = keep;
        expiry_update(&f->t.heap, r);
    }
    fsm_rec_count(f, r);
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    return out->outcome;
}

static const char *renewCheck(const Idem__RenewCmd *c, struct keyRule *kr)
{
    if (!tenantValid(c->tenant) || !keyValid(kr, &c->key)) {
        return "renew: tenant or key missing or invalid";
    }
    if (c->lease_ms == 0) {
        return "renew: lease_ms must be positive";
    }
    return NULL;
}

static Idem__Outcome applyRenew(struct fsm *f, uint64_t now_cmd, const Idem__RenewCmd *c,
                                struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    struct rec *r = heldRecord(f, renewCheck(c, &kr), now_cmd, c->tenant, &c->key, c->token, out);
    if (r == NULL) {
        return out->outcome;
    }
    if (r->state != IDEM__RECORD_STATE__RECORD_STATE_PROCESSING) {
        out->outcome = IDEM__OUTCOME__OUTCOME_LEASE_LOST;
        return out->outcome;
    }
    /* A holder whose lease passed but that nobody took over is still the holder (its
     * token is current), so it may renew. */
    r = recWritable(f, r);
    r->lease_deadline = addSat(f->clock, c->lease_ms);
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    out->token = r->token;
    out->lease_deadline_ms = r->lease_deadline;
    return out->outcome;
}

/* Fills v (OUT) with r's fields; v borrows r's memory until the next command. */
static void recView(const struct fsm *f, const struct rec *r, struct fsm_record_view *v)
{
    v->tenant = f->t.tenants[r->tenant].name;
    v->key = r->key;
    v->key_len = r->key_len;
    v->fingerprint = r->fp;
    v->state = (Idem__RecordState)r->state;
    v->completion = (Idem__Completion)r->completion;
    v->token = r->token;
    v->created_at_ms = r->created_at;
    v->lease_deadline_ms = r->lease_deadline;
    v->expires_at_ms = r->expires_at;
    v->response_len = fsm_rec_response_len(r);
    v->response = r->response ? r->response + sizeof(uint32_t) : NULL;
}

static Idem__Outcome applyGet(struct fsm *f, uint64_t now_cmd, const Idem__GetCmd *c,
                              struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    if (!tenantValid(c->tenant) || !keyValid(&kr, &c->key)) {
        return invalid(out, "get: tenant or key missing or invalid");
    }
    advanceClock(f, now_cmd);
    const struct rec *r = findRecord(f, c->tenant, &c->key);
    if (!isLive(r)) {
        out->outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        return out->outcome;
    }
    recView(f, r, &out->record);
    out->has_record = true;
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    out->token = r->token;
    return out->outcome;
}

static const char *resolveCheck(const Idem__ResolveCmd *c, struct keyRule *kr)
{
    const char *why = NULL;
    if (!tenantValid(c->tenant) || !keyValid(kr, &c->key)) {
        return "resolve: tenant or key missing or invalid";
    }
    if (c->release == (c->response != NULL)) {
        return "resolve: exactly one of release and response";
    }
    if (c->response != NULL && !fsm_response_valid(c->response, &why)) {
        return why;
    }
    return NULL;
}

static Idem__Outcome applyResolve(struct fsm *f, uint64_t index, uint64_t now_cmd,
                                  const Idem__ResolveCmd *c, struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    const char *bad = resolveCheck(c, &kr);
    if (bad != NULL) {
        return invalid(out, bad);
    }
    struct rec *r = findRecord(f, c->tenant, &c->key);
    bool found = isLive(r) && r->state != IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE;
    if (c->unsettled_only && found) {
        /* Resolve ends an unknown outcome; it must not overwrite a known one (retries would
         * replay the operator's answer, or run again after a release) nor take a key from a
         * holder that may still complete it. Purge is the last resort for those. Checked
         * before the clock moves: an invalid command changes nothing. */
        uint64_t now = now_cmd > f->clock ? now_cmd : f->clock;
        if (r->state == IDEM__RECORD_STATE__RECORD_STATE_COMPLETED) {
            return invalid(out, "resolve: the record is completed, its outcome is known "
                                "(only a quarantined record, or one whose lease has ended, "
                                "is resolved)");
        }
        if (r->state == IDEM__RECORD_STATE__RECORD_STATE_PROCESSING && now < r->lease_deadline) {
            return invalid(out, "resolve: the record's lease is live, its holder may still "
                                "complete it (resolve once the lease has ended)");
        }
    }
    advanceClock(f, now_cmd);
    if (!found) {
        out->outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        return out->outcome;
    }
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    if (c->release) {
        recRemove(f, r);
        return out->outcome;
    }
    /* An operator's decision is final and bypasses quotas. */
    size_t n = 0;
    r = recWritable(f, r);
    if (c->unsettled_only && r->state == IDEM__RECORD_STATE__RECORD_STATE_PROCESSING) {
        /* The holder whose lease ended is fenced off, as by a takeover: its late complete,
         * renew or release answers lease_lost instead of an ok that would change nothing. */
        r->token = index;
        expiry_update(&f->t.heap, r); /* the token is part of the expiry order */
    }
    recUncount(f, r);
    recSetResponse(r, responseStore(c->response, &n));
    r->state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
    r->completion = c->response->status < 400 ? IDEM__COMPLETION__COMPLETION_SUCCEEDED
                                              : IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    fsm_rec_count(f, r);
    out->token = r->token;
    return out->outcome;
}

/* ---- purge and admin reads ----------------------------------------------------------- */

/* An operator's last resort: deletes a record in any visible state, tombstones included,
 * with its tenant usage and its place in the expiry index (recRemove). A released marker is
 * invisible to every client, so it counts as absent and is left alone. The record's token
 * is answered, so the operator can tell which attempt was dropped; a later claim of the key
 * gets a new, larger token, so a fenced downstream still rejects the purged holder. */
static Idem__Outcome applyPurge(struct fsm *f, uint64_t now_cmd, const Idem__PurgeCmd *c,
                                struct fsm_result *out)
{
    struct keyRule kr = KEY_RULE_APPLY;
    if (!tenantValid(c->tenant) || !keyValid(&kr, &c->key)) {
        return invalid(out, "purge: tenant or key missing or invalid");
    }
    advanceClock(f, now_cmd);
    struct rec *r = findRecord(f, c->tenant, &c->key);
    if (!isLive(r)) {
        out->outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        return out->outcome;
    }
    out->token = r->token;
    recRemove(f, r);
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    return out->outcome;
}

struct quarantineAcc {
    int tenant;       /* -1: every tenant */
    bool lease_ended; /* processing records whose lease ended by `clock`, not quarantined */
    uint64_t clock;
    const struct rec **recs;
    size_t n, cap;
};

static void quarantineCollect(const struct rec *r, void *arg)
{
    struct quarantineAcc *acc = arg;
    bool match = acc->lease_ended ? r->state == IDEM__RECORD_STATE__RECORD_STATE_PROCESSING &&
                                        r->lease_deadline <= acc->clock
                                  : r->state == IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED;
    if (match && (acc->tenant < 0 || r->tenant == acc->tenant) && acc->n < acc->cap) {
        acc->recs[acc->n++] = r;
    }
}

static int recTokenCmp(const void *a, const void *b)
{
    const struct rec *x = *(const struct rec *const *)a, *y = *(const struct rec *const *)b;
    return x->token < y->token ? -1 : x->token > y->token;
}

bool fsm_tenant_known(const struct fsm *f, const char *name)
{
    return table_tenant_find(&f->t, name, strlen(name)) >= 0;
}

void fsm_tenant_usage(const struct fsm *f, const char *name, uint64_t *records, uint64_t *bytes)
{
    int tn = table_tenant_find(&f->t, name, strlen(name));
    *records = tn < 0 ? 0 : f->t.tenants[tn].records;
    *bytes = tn < 0 ? 0 : f->t.tenants[tn].bytes;
}

size_t fsm_quarantined(const struct fsm *f, const char *tenant, bool lease_ended, uint64_t now_ms,
                       struct fsm_record_view *out, size_t cap)
{
    struct quarantineAcc acc = {.tenant = -1,
                                .lease_ended = lease_ended,
                                .clock = now_ms > f->clock ? now_ms : f->clock,
                                .recs = NULL,
                                .n = 0,
                                .cap = 0};
    if (tenant != NULL && tenant[0] != '\0') {
        acc.tenant = table_tenant_find(&f->t, tenant, strlen(tenant));
        if (acc.tenant < 0) {
            return 0;
        }
    }
    acc.cap = f->n_state[lease_ended ? IDEM__RECORD_STATE__RECORD_STATE_PROCESSING
                                     : IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED];
    if (acc.cap == 0) {
        return 0;
    }
    /* One pointer per record of that state: for lease_ended, every record in processing,
     * of which few match; glibc maps a large allocation, so only the pages the matches
     * touch are faulted in, and the loop pays one pass over the table, not two. */
    acc.recs = xmalloc(acc.cap * sizeof(*acc.recs));
    table_foreach(&f->t, quarantineCollect, &acc);
    /* Tokens are unique among records, so the order is the same on every replica. */
    qsort(acc.recs, acc.n, sizeof(*acc.recs), recTokenCmp);
    for (size_t i = 0; i < acc.n && i < cap; i++) {
        recView(f, acc.recs[i], &out[i]);
    }
    size_t n = acc.n;
    free(acc.recs);
    return n;
}

/* ---- expire -------------------------------------------------------------------------- */

static Idem__Outcome applyExpire(struct fsm *f, uint64_t now_cmd, const Idem__ExpireCmd *c,
                                 struct fsm_result *out)
{
    if (c->max_batch == 0 || c->max_batch > FSM_EXPIRE_BATCH_MAX) {
        return invalid(out, "expire: max_batch out of range 1-65536");
    }
    advanceClock(f, now_cmd);
    uint32_t done = 0;
    struct rec *r;
    while (done < c->max_batch && (r = expiry_min(&f->t.heap)) != NULL &&
           r->expires_at <= f->clock) {
        done++;
        switch ((Idem__RecordState)r->state) {
        case IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE:
        case IDEM__RECORD_STATE__RECORD_STATE_RELEASED:
            recRemove(f, r);
            out->dropped++;
            break;
        case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED:
            /* Nothing re-runs on a guess (docs/contract.md, unknown): a quarantined record
             * outlives its ttl until resolve; it is re-armed for another tombstone ttl
             * (positive: the ttl when not given) from now, so that a clock jump does not
             * make it use up the batch. */
            r = recWritable(f, r);
            r->expires_at =
                addSat(r->expires_at > f->clock ? r->expires_at : f->clock, r->tombstone_ttl);
            expiry_update(&f->t.heap, r);
            break;
        case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING:
            if (c->keep_live_leases && r->lease_deadline > f->clock) {
                /* Its holder may still be running (a lease longer than the ttl, or renewed
                 * past it): a tombstone now would fence it off with not_found and let
                 * another attempt run once the tombstone goes. Looked at again when the
                 * lease ends, unless it is renewed or completed before. */
                r = recWritable(f, r);
                r->expires_at = r->lease_deadline;
                expiry_update(&f->t.heap, r);
                break;
            }
            /* fall through */
        case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED:
            r = recWritable(f, r);
            recUncount(f, r);
            recSetResponse(r, NULL);
            r->state = IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE;
            r->expires_at = addSat(r->expires_at, r->tombstone_ttl);
            expiry_update(&f->t.heap, r);
            fsm_rec_count(f, r);
            out->expired++;
            break;
        default:
            assert(0 && "unreachable record state");
            abort();
        }
    }
    r = expiry_min(&f->t.heap);
    out->more = r != NULL && r->expires_at <= f->clock;
    out->outcome = IDEM__OUTCOME__OUTCOME_OK;
    return out->outcome;
}

uint64_t fsm_next_expiry(const struct fsm *f)
{
    const struct rec *r = expiry_min(&f->t.heap);
    return r ? r->expires_at : UINT64_MAX;
}

/* ---- dispatch ------------------------------------------------------------------------ */

Idem__Outcome fsm_apply_command(struct fsm *f, uint64_t index, const Idem__Command *cmd,
                                struct fsm_result *out)
{
    memset(out, 0, sizeof(*out));
    if (index <= f->last_index) {
        return invalid(out, "command index not increasing");
    }
    Idem__Outcome o;
    switch (cmd->op_case) {
    case IDEM__COMMAND__OP_CLAIM:
        o = applyClaim(f, index, cmd->now_ms, cmd->claim, out);
        break;
    case IDEM__COMMAND__OP_COMPLETE:
        o = applyComplete(f, cmd->now_ms, cmd->complete, out);
        break;
    case IDEM__COMMAND__OP_RELEASE:
        o = applyRelease(f, cmd->now_ms, cmd->release, out);
        break;
    case IDEM__COMMAND__OP_RENEW:
        o = applyRenew(f, cmd->now_ms, cmd->renew, out);
        break;
    case IDEM__COMMAND__OP_GET:
        o = applyGet(f, cmd->now_ms, cmd->get, out);
        break;
    case IDEM__COMMAND__OP_RESOLVE:
        o = applyResolve(f, index, cmd->now_ms, cmd->resolve, out);
        break;
    case IDEM__COMMAND__OP_EXPIRE:
        o = applyExpire(f, cmd->now_ms, cmd->expire, out);
        break;
    case IDEM__COMMAND__OP_PURGE:
        o = applyPurge(f, cmd->now_ms, cmd->purge, out);
        break;
    default:
        return invalid(out, "unknown op");
    }
    if (o != IDEM__OUTCOME__OUTCOME_INVALID) {
        f->last_index = index;
    }
    return o;
}

static const char *commandCheck(const Idem__Command *cmd, struct keyRule *kr)
{
    switch (cmd->op_case) {
    case IDEM__COMMAND__OP_CLAIM:
        return claimCheck(cmd->claim, kr);
    case IDEM__COMMAND__OP_COMPLETE:
        return completeCheck(cmd->complete, kr);
    case IDEM__COMMAND__OP_RENEW:
        return renewCheck(cmd->renew, kr);
    case IDEM__COMMAND__OP_RESOLVE:
        return resolveCheck(cmd->resolve, kr);
    case IDEM__COMMAND__OP_RELEASE:
        return tenantValid(cmd->release->tenant) && keyValid(kr, &cmd->release->key)
                   ? NULL
                   : "release: tenant or key missing or invalid";
    case IDEM__COMMAND__OP_GET:
        return tenantValid(cmd->get->tenant) && keyValid(kr, &cmd->get->key)
                   ? NULL
                   : "get: tenant or key missing or invalid";
    default:
        return NULL;
    }
}

const char *fsm_command_check(const Idem__Command *cmd, size_t key_max_len, int *key_rc)
{
    struct keyRule kr = {key_max_len < KEY_MAX_LEN ? key_max_len : KEY_MAX_LEN, KEY_OK};
    const char *bad = commandCheck(cmd, &kr);
    if (key_rc != NULL) {
        *key_rc = kr.rc;
    }
    return bad;
}

Idem__Outcome fsm_apply(struct fsm *f, uint64_t index, const uint8_t *buf, size_t len,
                        struct fsm_result *out)
{
    arena_reset(&f->arena);
    Idem__Command *cmd = idem__command__unpack(&f->arena.pb, len, buf);
    if (cmd == NULL) {
        memset(out, 0, sizeof(*out));
        return invalid(out, "malformed command");
    }
    /* The command lives in the arena until the next reset; results point into the table,
     * never into the command. */
    return fsm_apply_command(f, index, cmd, out);
}

bool fsm_header_name_ok(const char *name)
{
    if (name == NULL || *name == '\0') {
        return false;
    }
    for (const char *s = name; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("!#$%&'*+-.^_`|~", c) != NULL)) {
            return false;
        }
    }
    return true;
}

bool fsm_header_value_ok(const uint8_t *value, size_t len)
{
    for (size_t i = 0; i < len; i++) { /* RFC 9110 5.5: HTAB, SP, VCHAR, obs-text */
        if ((value[i] < 0x20 && value[i] != '\t') || value[i] == 0x7f) {
            return false;
        }
    }
    return true;
}

bool fsm_response_check(const Idem__StoredResponse *resp, const char **why)
{
    if (!fsm_response_valid(resp, why)) {
        return false;
    }
    if (resp->status < 200) {
        *why = "response status must be a final one (200-599)";
        return false;
    }
    for (size_t i = 0; i < resp->n_headers; i++) {
        const Idem__Header *h = resp->headers[i];
        if (!fsm_header_name_ok(h->name)) {
            *why = "response header name is not an HTTP token";
            return false;
        }
        if (!fsm_header_value_ok(h->value.data, h->value.len)) {
            *why = "response header value holds a control character (RFC 9110 allows tab, space, "
                   "visible characters and obs-text)";
            return false;
        }
    }
    /* A replay sends body_ref as a header (Idempotency-Body-Ref): one it could not send
     * would replay as an empty answer with no reference. */
    if (resp->body_ref != NULL &&
        !fsm_header_value_ok((const uint8_t *)resp->body_ref, strlen(resp->body_ref))) {
        *why = "response body_ref holds a control character (it is replayed as a header value)";
        return false;
    }
    return true;
}

/* ---- stats and digest ---------------------------------------------------------------- */

void fsm_get_stats(const struct fsm *f, struct fsm_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->records = f->t.count;
    out->processing = f->n_state[IDEM__RECORD_STATE__RECORD_STATE_PROCESSING];
    out->completed = f->n_state[IDEM__RECORD_STATE__RECORD_STATE_COMPLETED];
    out->quarantined = f->n_state[IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED];
    out->tombstones = f->n_state[IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE];
    out->released = f->n_state[IDEM__RECORD_STATE__RECORD_STATE_RELEASED];
    out->bytes = f->bytes;
    out->tenants = f->t.n_tenants;
    out->clock_ms = f->clock;
    out->last_index = f->last_index;
    out->snapshot_spare_bytes = f->spare_n * sizeof(*f->spare_slots);
    struct table_index_bytes ib;
    table_get_index_bytes(&f->t, &ib);
    out->index_slots_bytes = ib.slots;
    out->index_migrating_bytes = ib.migrating;
    out->index_ahead_bytes = ib.ahead;
}

struct digestAcc {
    const struct fsm *f;
    uint64_t lo, hi;
};

static size_t putU64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
    return 8;
}

static size_t putBytes(uint8_t *p, const void *src, size_t n)
{
    size_t w = putU64(p, n);
    memcpy(p + w, src, n);
    return w + n;
}

static void digestRecord(const struct rec *r, void *arg)
{
    struct digestAcc *acc = arg;
    const struct tenant *tn = &acc->f->t.tenants[r->tenant];
    /* Every replicated field in a fixed layout; the response by its own hash. */
    uint8_t buf[FSM_TENANT_MAX + 255 + 32 + 16 + 16 + 14 * 8];
    size_t n = 0;
    n += putBytes(buf + n, tn->name, tn->name_len);
    n += putBytes(buf + n, r->key, r->key_len);
    memcpy(buf + n, r->fp, sizeof(r->fp));
    n += sizeof(r->fp);
    n += putU64(buf + n, r->state);
    n += putU64(buf + n, r->completion);
    n += putU64(buf + n, r->token);
    n += putU64(buf + n, r->created_at);
    n += putU64(buf + n, r->lease_deadline);
    n += putU64(buf + n, r->expires_at);
    n += putU64(buf + n, r->tombstone_ttl);
    n += putU64(buf + n, r->has_attempt);
    memcpy(buf + n, r->attempt, sizeof(r->attempt));
    n += sizeof(r->attempt);
    size_t rl = fsm_rec_response_len(r);
    XXH128_hash_t rh = XXH3_128bits(rl ? r->response + sizeof(uint32_t) : NULL, rl);
    n += putU64(buf + n, rl);
    n += putU64(buf + n, rh.low64);
    n += putU64(buf + n, rh.high64);
    assert(n <= sizeof(buf));
    XXH128_hash_t h = XXH3_128bits(buf, n);
    /* A sum of per-record hashes: the same multiset of records gives the same digest in
     * any order. */
    acc->lo += h.low64;
    acc->hi += h.high64;
}

void fsm_digest(const struct fsm *f, uint8_t out[16])
{
    struct digestAcc acc = {.f = f, .lo = 0, .hi = 0};
    table_foreach(&f->t, digestRecord, &acc);
    uint8_t buf[5 * 8];
    size_t n = 0;
    n += putU64(buf + n, acc.lo);
    n += putU64(buf + n, acc.hi);
    n += putU64(buf + n, f->t.count);
    n += putU64(buf + n, f->clock);
    n += putU64(buf + n, f->last_index);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, n));
    memcpy(out, c.digest, 16);
}

void fsm_digest_hex(const struct fsm *f, char out[33])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t d[16];
    fsm_digest(f, d);
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[32] = '\0';
}
