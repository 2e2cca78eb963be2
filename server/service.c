/* service: requests in, decisions out (see service.h).
 *
 * A data request's life: authenticate (SHA-256 of the bearer token → tenant) → validate the
 * key → build the log Command with the leader's clock, the tenant's defaults and quotas →
 * cluster_propose() with an `op` as waiter → either svcApply() gets the op back with the
 * command's result (answer it), or svcFail() does (answer unavailable), or the op's deadline
 * timer fires first (answer unavailable; the op stays alive until the cluster hands it back,
 * because the cluster still holds it). Every answer goes out exactly once.
 *
 * Fail closed (docs/contract.md): nothing is ever answered from local state. A follower
 * answers not_leader with the leader's RPC address; a node that knows no leader, or whose
 * proposal does not commit in time, answers unavailable. */
#include "service.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fingerprint.h"
#include "log.h"
#include "prefault_thread.h"
#include "xmalloc.h"

/* Layouts server/ and cluster/ each define, so that neither library includes the other's
 * headers: they must agree. */
_Static_assert(CONFIG_RAFT_SECRET_MIN == CLUSTER_SECRET_MIN,
               "config.c and cluster.h must agree on a Raft secret's least length");
_Static_assert(FSM_SLOT_BITS == CLUSTER_SLOT_BITS,
               "a fencing token is the command index cluster.c applies a command at");

#define IDEM_VERSION "0.1.0"

/* OP_CLIENT answers with the command's result; OP_KEY_GET with the record as an operator
 * sees it (AdminRecord); OP_QUARANTINE_LIST is a read barrier (an op-less command, which
 * every replica applies as a no-op, fsm.h) whose answer is read from this node's state
 * machine when the barrier applies here; OP_EXPIRE is the leader's ticker. */
enum opKind { OP_CLIENT, OP_EXPIRE, OP_KEY_GET, OP_QUARANTINE_LIST };

#define QUARANTINE_LIST_DEFAULT 100u
#define QUARANTINE_LIST_MAX 1000u

struct op {
    struct service *s;
    enum opKind kind;
    service_done_cb cb;
    void *data;
    uint64_t request_id;
    uv_timer_t timer;
    bool answered;   /* cb was called */
    bool in_cluster; /* the cluster holds this op as a waiter */
    bool timer_open;
    char *tenant;   /* OP_QUARANTINE_LIST: owned; NULL for every tenant */
    uint32_t limit; /* OP_QUARANTINE_LIST */
    bool lease_ended;  /* OP_QUARANTINE_LIST: processing records whose lease ended instead */
    uint64_t lease_ms; /* claim, renew: the lease asked for */
    uint64_t now_ms;   /* claim, renew: the command's clock (Result.lease_ms: the lease left) */
    struct op *prev, *next; /* live ops, for shutdown */
};

struct adminOp {
    struct service *s;
    service_done_cb cb;
    void *data;
    uint64_t request_id;
};

struct service {
    uv_loop_t *loop;
    const struct config *cfg;
    struct fsm *fsm;
    struct cluster *cluster;
    uv_timer_t expiry_timer;
    bool expire_in_flight;
    struct op *ops;
    struct service_stats stats;
    bool closing;
    bool timer_closed;
    bool cluster_closed;
    void (*close_cb)(void *data);
    void *close_data;
};

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- answering ----------------------------------------------------------------------- */

/* answerSimple() with Result.retry_after_ms: the caller may send it again after that long. */
static void answerRetryAfter(service_done_cb cb, void *data, uint64_t request_id,
                             Idem__Outcome outcome, const char *error, const char *leader,
                             uint64_t retry_after_ms)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = outcome;
    res.retry_after_ms = retry_after_ms;
    resp.request_id = request_id;
    resp.result = &res;
    resp.error = (char *)(error ? error : "");
    resp.leader_rpc_address = (char *)(leader ? leader : "");
    cb(data, &resp);
}

/* What a leader refusing a request for load (batch.max_pending_mb, a tenant's share of it)
 * or during a leadership transfer says to wait before sending it again
 * (Result.retry_after_ms): about a log write's time. */
#define SERVICE_BUSY_RETRY_MS 10

static void answerSimple(service_done_cb cb, void *data, uint64_t request_id, Idem__Outcome outcome,
                         const char *error, const char *leader)
{
    answerRetryAfter(cb, data, request_id, outcome, error, leader, 0);
}

static void serviceMaybeFinish(struct service *s);

static void opMaybeFree(struct op *o)
{
    if (o->in_cluster || o->timer_open) {
        return;
    }
    struct service *s = o->s;
    if (o->prev) {
        o->prev->next = o->next;
    } else {
        s->ops = o->next;
    }
    if (o->next) {
        o->next->prev = o->prev;
    }
    free(o->tenant);
    free(o);
    if (s->closing) {
        serviceMaybeFinish(s);
    }
}

static void opTimerClosed(uv_handle_t *h)
{
    struct op *o = h->data;
    o->timer_open = false;
    opMaybeFree(o);
}

static void opStopTimer(struct op *o)
{
    if (o->timer_open && !uv_is_closing((uv_handle_t *)&o->timer)) {
        uv_timer_stop(&o->timer);
        uv_close((uv_handle_t *)&o->timer, opTimerClosed);
    }
}

/* retry_after_ms: 0, or when the same request to this node may succeed (Result). */
static void opAnswerUnavailable(struct op *o, const char *why, uint64_t retry_after_ms)
{
    if (o->answered || o->cb == NULL) {
        o->answered = true;
        return;
    }
    o->answered = true;
    o->s->stats.unavailable++;
    answerRetryAfter(o->cb, o->data, o->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, why, NULL,
                     retry_after_ms);
}

static void opDeadlineCb(uv_timer_t *t)
{
    struct op *o = t->data;
    opAnswerUnavailable(o, "deadline passed before the command committed", 0);
    opStopTimer(o);
}

/* Fills rec's fields (all but the stored response) from a record view; rec borrows v's
 * memory. */
static void recordFromView(const struct fsm_record_view *v, Idem__Record *rec)
{
    rec->tenant = (char *)v->tenant;
    rec->key.data = (uint8_t *)v->key;
    rec->key.len = v->key_len;
    rec->fingerprint.data = (uint8_t *)v->fingerprint;
    rec->fingerprint.len = FSM_FINGERPRINT_LEN;
    rec->state = v->state;
    rec->token = v->token;
    rec->created_at_ms = v->created_at_ms;
    rec->lease_deadline_ms = v->lease_deadline_ms;
    rec->expires_at_ms = v->expires_at_ms;
    rec->completion = v->completion;
}

/* Fills an Idem__Result from the state machine's result. Nested messages it needs are
 * unpacked into *resp_out / *rec_out (freed by the caller). */
static void resultToProto(const struct fsm_result *r, Idem__Result *out,
                          Idem__StoredResponse **resp_out, Idem__Record *rec)
{
    out->outcome = r->outcome;
    out->token = r->token;
    out->lease_deadline_ms = r->lease_deadline_ms;
    out->retry_after_ms = r->retry_after_ms;
    out->takeover = r->takeover;
    out->previous_token = r->previous_token;
    out->expires_at_ms = r->expires_at_ms;
    out->expired = r->expired;
    out->dropped = r->dropped;
    out->more = r->more;
    out->detail = (char *)(r->detail ? r->detail : "");
    *resp_out = NULL;
    if (r->response != NULL) {
        *resp_out = idem__stored_response__unpack(NULL, r->response_len, r->response);
        out->response = *resp_out;
    }
    if (r->has_record) {
        recordFromView(&r->record, rec);
        rec->response.data = (uint8_t *)r->record.response;
        rec->response.len = r->record.response_len;
        out->record = rec;
    }
}

/* ---- admin reads --------------------------------------------------------------------- */

/* Answers a quarantine list from this node's state machine. Called when the op's read
 * barrier applies on the node that proposed it, so the state holds every command committed
 * before the request arrived (docs/contract.md: never from a replica that may be stale).
 * Stored responses are left out: the listing names records, `key get` shows one. */
static void answerQuarantineList(struct service *s, struct op *o)
{
    uint32_t cap = o->limit;
    struct fsm_record_view *views = xcalloc(cap, sizeof(*views));
    size_t total = fsm_quarantined(s->fsm, o->tenant, o->lease_ended, views, cap);
    size_t n = total < cap ? total : cap;
    Idem__AdminRecord *ars = xcalloc(n ? n : 1, sizeof(*ars));
    Idem__AdminRecord **arps = xcalloc(n ? n : 1, sizeof(*arps));
    Idem__Record *recs = xcalloc(n ? n : 1, sizeof(*recs));
    char(*digests)[FP_HEX12_SIZE] = xcalloc(n ? n : 1, sizeof(*digests));
    for (size_t i = 0; i < n; i++) {
        const struct fsm_record_view *v = &views[i];
        Idem__Record *rec = &recs[i];
        idem__record__init(rec);
        recordFromView(v, rec);
        key_digest(v->tenant, v->key, v->key_len, digests[i]);
        idem__admin_record__init(&ars[i]);
        ars[i].record = rec;
        ars[i].key_digest = digests[i];
        arps[i] = &ars[i];
    }
    Idem__Result res = IDEM__RESULT__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_OK;
    res.detail = "";
    Idem__Response resp = IDEM__RESPONSE__INIT;
    resp.request_id = o->request_id;
    resp.result = &res;
    resp.n_records = n;
    resp.records = arps;
    resp.more = total > n;
    o->cb(o->data, &resp);
    free(digests);
    free(recs);
    free(arps);
    free(ars);
    free(views);
}

/* ---- cluster callbacks --------------------------------------------------------------- */

static void expiryArm(struct service *s, uint64_t delay_ms);

static void svcApply(void *data, uint64_t cmd_index, const uint8_t *cmd, size_t len,
                     void *waiter)
{
    struct service *s = data;
    struct fsm_result r;
    fsm_apply(s->fsm, cmd_index, cmd, len, &r);
    struct op *o = waiter;
    if (o == NULL) {
        return;
    }
    o->in_cluster = false;
    if (o->kind == OP_EXPIRE) {
        s->expire_in_flight = false;
        if (r.outcome == IDEM__OUTCOME__OUTCOME_OK && r.more) {
            expiryArm(s, 0);
        }
    } else if (!o->answered && o->kind == OP_QUARANTINE_LIST) {
        o->answered = true;
        answerQuarantineList(s, o);
    } else if (!o->answered) {
        o->answered = true;
        Idem__Result res = IDEM__RESULT__INIT;
        Idem__Record rec = IDEM__RECORD__INIT;
        Idem__StoredResponse *stored = NULL;
        resultToProto(&r, &res, &stored, &rec);
        if (o->lease_ms > 0 && (r.outcome == IDEM__OUTCOME__OUTCOME_ACQUIRED ||
                                r.outcome == IDEM__OUTCOME__OUTCOME_OK)) {
            /* The lease granted, as of the command's clock: what was asked for, or less on a
             * holder's own retry of a claim, which keeps the lease it has (a client that
             * times its renewals from this must not think it has more). */
            uint64_t left = r.lease_deadline_ms > o->now_ms ? r.lease_deadline_ms - o->now_ms : 0;
            uint64_t granted = left < o->lease_ms ? left : o->lease_ms;
            res.lease_ms = granted > UINT32_MAX ? UINT32_MAX : (uint32_t)granted;
        }
        Idem__Response resp = IDEM__RESPONSE__INIT;
        resp.request_id = o->request_id;
        resp.result = &res;
        /* key get: the record goes in records[0] with its key_digest, not in result. */
        Idem__AdminRecord ar = IDEM__ADMIN_RECORD__INIT;
        Idem__AdminRecord *arp = &ar;
        char digest[FP_HEX12_SIZE];
        if (o->kind == OP_KEY_GET && res.record != NULL) {
            key_digest(rec.tenant, rec.key.data, rec.key.len, digest);
            ar.record = res.record;
            ar.key_digest = digest;
            res.record = NULL;
            resp.n_records = 1;
            resp.records = &arp;
        }
        o->cb(o->data, &resp);
        if (stored != NULL) {
            idem__stored_response__free_unpacked(stored, NULL);
        }
    }
    opStopTimer(o);
    opMaybeFree(o);
}

static void svcFail(void *data, void *waiter, int status)
{
    struct service *s = data;
    struct op *o = waiter;
    o->in_cluster = false;
    if (o->kind == OP_EXPIRE) {
        s->expire_in_flight = false;
    } else if (status == RAFT_NOTLEADER) {
        /* Never in the log: as if refused when it was taken (proposeOp). */
        opAnswerUnavailable(o,
                            "not proposed: this leader began a leadership transfer or stopped "
                            "leading first; send it again shortly",
                            SERVICE_BUSY_RETRY_MS);
    } else {
        opAnswerUnavailable(
            o, status == RAFT_SHUTDOWN ? "node shutting down" : "leadership lost before commit", 0);
    }
    opStopTimer(o);
    opMaybeFree(o);
}

static int svcSnapshot(void *data, uint8_t **buf, size_t *len)
{
    struct service *s = data;
    return fsm_snapshot(s->fsm, buf, len);
}

/* Snapshots off the loop (cluster_ops): the loop freezes the state machine, a pool thread
 * serialises the frozen view, the loop thaws it. The state machine stays single-threaded:
 * the pool thread reads only the view (fsm.h, fsm_freeze). */
static int svcSnapshotFreeze(void *data, void **view)
{
    struct service *s = data;
    /* A table growth in progress: move it on a step and let raft try again at its next
     * apply (it takes the refusal as transient), rather than finish it here at once. */
    if (!fsm_freeze_ready(s->fsm)) {
        return -1;
    }
    struct fsm_frozen *z = fsm_freeze(s->fsm);
    if (z == NULL) {
        return -1;
    }
    *view = z;
    return 0;
}

static int svcSnapshotWrite(void *view, uint8_t **buf, size_t *len)
{
    return fsm_frozen_write(view, buf, len);
}

static void svcSnapshotRelease(void *data, void *view,
                               const struct cluster_snapshot_info *info)
{
    struct service *s = data;
    uint64_t records = fsm_frozen_records(view);
    fsm_thaw(s->fsm, view);
    if (info->written && !info->put_ended) {
        log_info("snapshot at index %llu not stored (raft did not store it: shutting down, or "
                 "it refused the put)",
                 (unsigned long long)info->index);
    } else if (info->written && !info->stored) {
        log_warn("snapshot at index %llu (%llu records, %zu bytes) could not be stored (%s); "
                 "the log keeps its entries; next attempt after %u entries",
                 (unsigned long long)info->index, (unsigned long long)records, info->bytes,
                 info->store_error != NULL && info->store_error[0] != '\0' ? info->store_error
                                                                           : "no reason given",
                 info->next_threshold);
    } else if (info->written) {
        log_info("snapshot at index %llu: %llu records, %zu bytes; loop paused %.3f ms, "
                 "written off the loop in %.1f ms at nice %d; next after %u entries",
                 (unsigned long long)info->index, (unsigned long long)records, info->bytes,
                 (double)info->pause_us / 1000.0, (double)info->write_us / 1000.0, info->nice,
                 info->next_threshold);
    } else {
        log_warn("snapshot at index %llu abandoned (loop paused %.3f ms)",
                 (unsigned long long)info->index, (double)info->pause_us / 1000.0);
    }
}

static int svcRestore(void *data, const uint8_t *buf, size_t len)
{
    struct service *s = data;
    const char *why = NULL;
    if (fsm_restore(s->fsm, buf, len, &why) != 0) {
        log_error("snapshot restore refused: %s", why);
        return -1;
    }
    return 0;
}

static void svcLeaderChanged(void *data, uint64_t leader_id, bool is_me)
{
    (void)data;
    if (leader_id == 0) {
        log_warn("no leader known");
    } else {
        log_info("leader is now node %llu%s", (unsigned long long)leader_id,
                 is_me ? " (this node)" : "");
    }
}

/* ---- proposing ----------------------------------------------------------------------- */

static struct op *opNew(struct service *s, enum opKind kind)
{
    struct op *o = xcalloc(1, sizeof(*o));
    o->s = s;
    o->kind = kind;
    o->next = s->ops;
    if (s->ops) {
        s->ops->prev = o;
    }
    s->ops = o;
    return o;
}

/* Proposes a packed command for a client, answered as `kind` says. On any refusal,
 * answers at once and returns NULL; otherwise returns the op (the cluster holds it). */
static struct op *proposeOp(struct service *s, const Idem__Command *cmd, enum opKind kind,
                            uint32_t account, uint64_t request_id, uint32_t deadline_ms,
                            service_done_cb cb, void *data)
{
    const char *leader = "";
    if (!cluster_is_leader(s->cluster)) {
        uint64_t lid = cluster_leader(s->cluster, &leader);
        if (lid == 0 || leader[0] == '\0') {
            s->stats.unavailable++;
            answerSimple(cb, data, request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                         "no leader known: the cluster has no quorum or is electing", NULL);
        } else {
            s->stats.not_leader++;
            answerSimple(cb, data, request_id, IDEM__OUTCOME__OUTCOME_NOT_LEADER, "not the leader",
                         leader);
        }
        return NULL;
    }
    size_t n = idem__command__get_packed_size(cmd);
    uint8_t stackbuf[1024];
    uint8_t *buf = n <= sizeof(stackbuf) ? stackbuf : xmalloc(n);
    idem__command__pack(cmd, buf);
    struct op *o = opNew(s, kind);
    o->cb = cb;
    o->data = data;
    o->request_id = request_id;
    int rc = cluster_propose(s->cluster, buf, n, o, account);
    if (buf != stackbuf) {
        free(buf);
    }
    if (rc != CLUSTER_OK) {
        o->answered = true;
        s->stats.unavailable++;
        /* Refused for load by a leader, or while it hands its leadership on: the same
         * request to it again shortly (libidem does, on the same connection, rather than
         * leave a leader that is well; after a transfer it redirects to the new one). */
        bool busy = rc == CLUSTER_EOVERLOAD || rc == CLUSTER_ESHARE || rc == CLUSTER_ETRANSFER;
        answerRetryAfter(cb, data, request_id,
                         rc == CLUSTER_ETOOBIG ? IDEM__OUTCOME__OUTCOME_INVALID
                                               : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                         cluster_strerror(rc), NULL, busy ? SERVICE_BUSY_RETRY_MS : 0);
        opMaybeFree(o);
        return NULL;
    }
    o->in_cluster = true;
    uv_timer_init(s->loop, &o->timer);
    o->timer.data = o;
    o->timer_open = true;
    uv_timer_start(&o->timer, opDeadlineCb, deadline_ms, 0);
    return o;
}

static void proposeClient(struct service *s, const Idem__Command *cmd, uint64_t request_id,
                          uint32_t deadline_ms, service_done_cb cb, void *data)
{
    proposeOp(s, cmd, OP_CLIENT, CLUSTER_ACCOUNT_NONE, request_id, deadline_ms, cb, data);
}

/* ---- expiry ticker ------------------------------------------------------------------- */

static void expiryTick(uv_timer_t *t)
{
    struct service *s = t->data;
    uint64_t now = nowMs();
    if (s->closing || s->expire_in_flight || !cluster_is_leader(s->cluster) ||
        fsm_next_expiry(s->fsm) > now) {
        return;
    }
    Idem__ExpireCmd e = IDEM__EXPIRE_CMD__INIT;
    e.max_batch = s->cfg->expiry.batch;
    e.keep_live_leases = true;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_EXPIRE;
    cmd.expire = &e;
    uint8_t buf[64];
    size_t n = idem__command__pack(&cmd, buf);
    struct op *o = opNew(s, OP_EXPIRE);
    if (cluster_propose_own(s->cluster, buf, n, o) != CLUSTER_OK) {
        opMaybeFree(o);
        return;
    }
    o->in_cluster = true;
    s->expire_in_flight = true;
}

static void expiryArm(struct service *s, uint64_t delay_ms)
{
    if (!s->closing) {
        uv_timer_start(&s->expiry_timer, expiryTick, delay_ms, s->cfg->expiry.interval_ms);
    }
}

/* ---- requests ------------------------------------------------------------------------ */

/* SHA-256 of a bearer token into h (OUT); false for an empty token. */
static bool tokenHash(const ProtobufCBinaryData *tok, uint8_t h[32])
{
    unsigned int hl = 0;
    return tok->len > 0 && EVP_Digest(tok->data, tok->len, h, &hl, EVP_sha256(), NULL) == 1;
}

static const struct config_tenant *authTenant(const struct service *s,
                                              const ProtobufCBinaryData *tok)
{
    uint8_t h[32];
    return tokenHash(tok, h) ? config_tenant_by_token_hash(s->cfg, h) : NULL;
}

static bool authAdmin(const struct service *s, const ProtobufCBinaryData *tok)
{
    uint8_t h[32];
    return tokenHash(tok, h) && config_is_admin_hash(s->cfg, h);
}

static uint32_t deadlineOf(const struct service *s, const Idem__Request *req)
{
    uint32_t d = req->deadline_ms ? req->deadline_ms : s->cfg->rpc.default_deadline_ms;
    return d > s->cfg->rpc.max_deadline_ms ? s->cfg->rpc.max_deadline_ms : d;
}

static const char *keyError(const struct config_tenant *t, const ProtobufCBinaryData *key)
{
    switch (key_validate(key->data, key->len, t->key_max_len)) {
    case KEY_OK:
        return NULL;
    case KEY_MISSING:
        return "idempotency_key_missing";
    default:
        return "idempotency_key_invalid";
    }
}

/* A data op on behalf of tenant t (authenticated by the caller). */
static void handleDataAs(struct service *s, const struct config_tenant *t,
                         const Idem__Request *req, service_done_cb cb, void *data)
{
    Idem__Command cmd = IDEM__COMMAND__INIT;
    Idem__ClaimCmd claim = IDEM__CLAIM_CMD__INIT;
    Idem__CompleteCmd complete = IDEM__COMPLETE_CMD__INIT;
    Idem__ReleaseCmd release = IDEM__RELEASE_CMD__INIT;
    Idem__RenewCmd renew = IDEM__RENEW_CMD__INIT;
    Idem__GetCmd get = IDEM__GET_CMD__INIT;
    Idem__TenantLimits limits = IDEM__TENANT_LIMITS__INIT;
    limits.max_records = t->max_records;
    limits.max_bytes = t->max_bytes;
    cmd.now_ms = nowMs();
    char *tenant = (char *)t->name;
    const ProtobufCBinaryData *key = NULL;
    switch (req->op_case) {
    case IDEM__REQUEST__OP_CLAIM:
        key = &req->claim->key;
        claim.tenant = tenant;
        claim.key = req->claim->key;
        claim.fingerprint = req->claim->fingerprint;
        claim.attempt_id = req->claim->attempt_id;
        claim.lease_ms = req->claim->lease_ms ? req->claim->lease_ms : t->lease_ms;
        claim.ttl_ms = req->claim->ttl_ms ? req->claim->ttl_ms : t->ttl_ms;
        claim.tombstone_ttl_ms = t->tombstone_ttl_ms;
        claim.policy = req->claim->policy != IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED
                           ? req->claim->policy
                           : (t->lease_policy == CONFIG_LEASE_TAKEOVER
                                  ? IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
                                  : IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT);
        claim.limits = &limits;
        cmd.op_case = IDEM__COMMAND__OP_CLAIM;
        cmd.claim = &claim;
        if (claim.fingerprint.len != FSM_FINGERPRINT_LEN) {
            answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID,
                         "fingerprint must be 32 bytes (SHA-256)", NULL);
            return;
        }
        break;
    case IDEM__REQUEST__OP_COMPLETE:
        if (req->complete->response != NULL) {
            const char *why = NULL;
            if (!fsm_response_check(req->complete->response, &why)) {
                answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, why,
                             NULL);
                return;
            }
        }
        key = &req->complete->key;
        complete.tenant = tenant;
        complete.key = req->complete->key;
        complete.token = req->complete->token;
        complete.outcome = req->complete->outcome;
        complete.response = req->complete->response;
        complete.limits = &limits;
        cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
        cmd.complete = &complete;
        break;
    case IDEM__REQUEST__OP_RELEASE:
        key = &req->release->key;
        release.tenant = tenant;
        release.key = req->release->key;
        release.token = req->release->token;
        cmd.op_case = IDEM__COMMAND__OP_RELEASE;
        cmd.release = &release;
        break;
    case IDEM__REQUEST__OP_RENEW:
        key = &req->renew->key;
        renew.tenant = tenant;
        renew.key = req->renew->key;
        renew.token = req->renew->token;
        renew.lease_ms = req->renew->lease_ms ? req->renew->lease_ms : t->lease_ms;
        cmd.op_case = IDEM__COMMAND__OP_RENEW;
        cmd.renew = &renew;
        break;
    case IDEM__REQUEST__OP_GET:
        key = &req->get->key;
        get.tenant = tenant;
        get.key = req->get->key;
        cmd.op_case = IDEM__COMMAND__OP_GET;
        cmd.get = &get;
        break;
    default:
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, "unknown op",
                     NULL);
        return;
    }
    const char *kerr = keyError(t, key);
    if (kerr != NULL) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, kerr, NULL);
        return;
    }
    /* A lease or ttl a request asks for is held to the bounds of the tenant's own (a
     * lease of 2^64-1 ms never expired, and kept its record from expiry for good). */
    if ((cmd.op_case == IDEM__COMMAND__OP_CLAIM && claim.lease_ms > CONFIG_LEASE_MAX_MS) ||
        (cmd.op_case == IDEM__COMMAND__OP_RENEW && renew.lease_ms > CONFIG_LEASE_MAX_MS)) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID,
                     "lease_ms above the maximum (86400000: 24 h)", NULL);
        return;
    }
    if (cmd.op_case == IDEM__COMMAND__OP_CLAIM && claim.ttl_ms > CONFIG_TTL_MAX_MS) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID,
                     "ttl_ms above the maximum (31536000000: 365 days)", NULL);
        return;
    }
    /* Whatever the state machine refuses without looking at its state is refused here,
     * before it becomes a log entry that every node writes and syncs. */
    const char *bad = fsm_command_check(&cmd);
    if (bad != NULL) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, bad, NULL);
        return;
    }
    /* The tenant's account (batch.tenant_max_pending_percent): its index in this node's
     * configuration; only a leader proposes, so the leader's own configuration counts. */
    uint32_t account = (uint32_t)(t - s->cfg->tenants);
    struct op *o =
        proposeOp(s, &cmd, OP_CLIENT, account, req->request_id, deadlineOf(s, req), cb, data);
    if (o != NULL) {
        o->lease_ms = cmd.op_case == IDEM__COMMAND__OP_CLAIM   ? claim.lease_ms
                      : cmd.op_case == IDEM__COMMAND__OP_RENEW ? renew.lease_ms
                                                               : 0;
        o->now_ms = cmd.now_ms;
    }
}

static void handleData(struct service *s, const Idem__Request *req, service_done_cb cb,
                       void *data)
{
    const struct config_tenant *t = authTenant(s, &req->auth_token);
    if (t == NULL) {
        s->stats.unauthenticated++;
        /* The admin token is known but owns no records: forbidden (403), as a tenant's
         * token on an admin op is (docs/contract.md tells the two apart). */
        if (authAdmin(s, &req->auth_token)) {
            answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                         "data operations need a tenant's token, not the admin token", NULL);
            return;
        }
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                     "unknown or missing bearer token", NULL);
        return;
    }
    handleDataAs(s, t, req, cb, data);
}

static const char *roleName(int state)
{
    switch (state) {
    case RAFT_LEADER:
        return "leader";
    case RAFT_FOLLOWER:
        return "follower";
    case RAFT_CANDIDATE:
        return "candidate";
    default:
        return "unavailable";
    }
}

static const char *memberRole(int role)
{
    switch (role) {
    case RAFT_VOTER:
        return "voter";
    case RAFT_STANDBY:
        return "standby";
    case RAFT_SPARE:
        return "spare";
    default:
        return "unknown";
    }
}

/* Answers with the node's status and/or the member list. */
static void answerStatus(struct service *s, uint64_t request_id, bool with_status,
                         bool with_digest, service_done_cb cb, void *data)
{
    struct cluster_member ms[CLUSTER_MEMBERS_MAX];
    size_t n = cluster_members(s->cluster, ms, CLUSTER_MEMBERS_MAX);
    if (n > CLUSTER_MEMBERS_MAX) {
        n = CLUSTER_MEMBERS_MAX;
    }
    Idem__Member mem[CLUSTER_MEMBERS_MAX];
    Idem__Member *memp[CLUSTER_MEMBERS_MAX];
    for (size_t i = 0; i < n; i++) {
        idem__member__init(&mem[i]);
        mem[i].id = ms[i].id;
        mem[i].raft_address = ms[i].raft_address;
        mem[i].rpc_address = ms[i].rpc_address;
        mem[i].http_address = ms[i].http_address;
        mem[i].role = (char *)memberRole(ms[i].role);
        memp[i] = &mem[i];
    }
    Idem__NodeStatus st = IDEM__NODE_STATUS__INIT;
    char digest[33]; /* st.digest points here until cb returns */
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_OK;
    resp.request_id = request_id;
    resp.result = &res;
    resp.n_members = n;
    resp.members = memp;
    if (with_status) {
        struct cluster_status cs;
        struct fsm_stats fs;
        cluster_get_status(s->cluster, &cs);
        fsm_get_stats(s->fsm, &fs);
        st.id = s->cfg->node.id;
        st.role = (char *)roleName(cs.state);
        st.term = cs.term;
        st.leader_id = cs.leader_id;
        st.leader_rpc_address = (char *)cs.leader_rpc_address;
        st.commit_index = cs.commit_index;
        st.applied_index = cs.applied_index;
        st.last_snapshot_index = cs.last_snapshot_index;
        st.snapshot_threshold = cs.snapshot_threshold;
        st.snapshot_bytes = cs.snapshot_bytes_last;
        st.raft_authenticated = s->cfg->raft.secret.set;
        struct cluster_io_counters io;
        cluster_get_io_counters(&io);
        st.raft_connections_refused = io.connections_refused;
        st.raft_connect_auth_failures = io.connect_auth_failed;
        st.append_oldest_ms = cs.append_oldest_us / 1000u;
        st.records = fs.records - fs.released;
        st.processing = fs.processing;
        st.completed = fs.completed;
        st.quarantined = fs.quarantined;
        st.tombstones = fs.tombstones;
        st.bytes = fs.bytes;
        st.rpc_address = (char *)s->cfg->node.rpc_address.text;
        st.raft_address = (char *)s->cfg->node.raft_address.text;
        st.http_address = (char *)s->cfg->node.http_address.text;
        st.n_members = n;
        st.members = memp;
        st.version = IDEM_VERSION;
        if (with_digest) {
            fsm_digest_hex(s->fsm, digest);
            st.digest = digest;
        }
        resp.status = &st;
    }
    cb(data, &resp);
}

static void adminChangeCb(void *data, int status, const char *errmsg)
{
    struct adminOp *a = data;
    answerSimple(a->cb, a->data, a->request_id,
                 status == 0 ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                 errmsg, NULL);
    free(a);
}

/* A transfer's end. One that did not move leadership to a reachable voter (it did not win
 * its election in time: a node still catching up, say) may well succeed again: the answer
 * says so with retry_after_ms, an election timeout, which idemctl waits before it asks
 * again. A refusal up front (a voter not heard from) carries none. */
static void transferDoneCb(void *data, int status, const char *errmsg)
{
    struct adminOp *a = data;
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = status == 0 ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_UNAVAILABLE;
    if (status != 0) {
        res.retry_after_ms = a->s->cfg->raft.election_timeout_ms;
        log_warn("a leadership transfer ended without moving leadership (%s); the caller may "
                 "ask again after %u ms",
                 errmsg && errmsg[0] ? errmsg : "no reason given",
                 (unsigned)res.retry_after_ms);
    }
    resp.request_id = a->request_id;
    resp.result = &res;
    resp.error = (char *)(errmsg ? errmsg : "");
    resp.leader_rpc_address = "";
    if (status == 0) {
        /* Leadership moved: this node knows the new leader (cluster_transfer). */
        const char *addr = NULL;
        resp.leader_id = cluster_leader(a->s->cluster, &addr);
    }
    a->cb(a->data, &resp);
    free(a);
}

static void answerClusterRc(struct service *s, int rc, uint64_t request_id, service_done_cb cb,
                            void *data)
{
    const char *leader = "";
    if (rc == CLUSTER_ENOTLEADER) {
        cluster_leader(s->cluster, &leader);
        answerSimple(cb, data, request_id, leader[0] ? IDEM__OUTCOME__OUTCOME_NOT_LEADER
                                                     : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "not the leader", leader);
        return;
    }
    /* ESETTLING: nothing was started, and the same change may be sent again after a
     * heartbeat (idemctl does, within its deadline; libidem's idem_call retries any
     * unavailable answer with its own backoff). */
    answerRetryAfter(
        cb, data, request_id,
        rc == CLUSTER_EINVAL ? IDEM__OUTCOME__OUTCOME_INVALID : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
        cluster_errmsg(s->cluster)[0] ? cluster_errmsg(s->cluster) : cluster_strerror(rc), NULL,
        rc == CLUSTER_ESETTLING ? s->cfg->raft.heartbeat_timeout_ms : 0);
}

/* Whether an operator's command may name this tenant: one in this node's configuration,
 * or one the replicated state knows (records of a tenant that left the configuration can
 * still be read, resolved and purged: a quarantined record never expires). A mistyped name
 * is neither, and is refused rather than answered not_found (or an empty quarantine list),
 * which would read as a record that is gone. */
static bool tenantKnown(const struct service *s, const char *name)
{
    for (size_t i = 0; i < s->cfg->n_tenants; i++) {
        if (strcmp(s->cfg->tenants[i].name, name) == 0) {
            return true;
        }
    }
    return fsm_tenant_known(s->fsm, name);
}

#define UNKNOWN_TENANT "unknown tenant: neither in this node's configuration nor in its records"

/* The tenant and key an operator names: a known tenant (tenantKnown), a key of docs/contract.md
 * §1's alphabet. Returns NULL or what is wrong (never quoting the key). */
static const char *adminKeyError(const struct service *s, const char *tenant,
                                 const ProtobufCBinaryData *key)
{
    size_t tl = tenant ? strnlen(tenant, FSM_TENANT_MAX + 1) : 0;
    if (tl == 0 || tl > FSM_TENANT_MAX) {
        return "tenant missing or longer than 128 bytes";
    }
    if (!tenantKnown(s, tenant)) {
        return UNKNOWN_TENANT;
    }
    switch (key_validate(key->data, key->len, KEY_MAX_LEN)) {
    case KEY_OK:
        return NULL;
    case KEY_MISSING:
        return "idempotency_key_missing";
    default:
        return "idempotency_key_invalid";
    }
}

/* key get, purge and quarantine list (admin token checked by the caller): each one goes
 * through the log, so a stale node can answer none of them (docs/contract.md). */
static void handleKeyAdmin(struct service *s, const Idem__Request *req, service_done_cb cb,
                           void *data)
{
    Idem__Command cmd = IDEM__COMMAND__INIT;
    Idem__GetCmd get = IDEM__GET_CMD__INIT;
    Idem__PurgeCmd purge = IDEM__PURGE_CMD__INIT;
    cmd.now_ms = nowMs();
    const char *why = NULL;
    switch (req->op_case) {
    case IDEM__REQUEST__OP_KEY_GET:
        why = adminKeyError(s, req->key_get->tenant, &req->key_get->key);
        if (why == NULL) {
            get.tenant = req->key_get->tenant;
            get.key = req->key_get->key;
            cmd.op_case = IDEM__COMMAND__OP_GET;
            cmd.get = &get;
            proposeOp(s, &cmd, OP_KEY_GET, CLUSTER_ACCOUNT_NONE, req->request_id,
                      deadlineOf(s, req), cb, data);
            return;
        }
        break;
    case IDEM__REQUEST__OP_PURGE:
        why = adminKeyError(s, req->purge->tenant, &req->purge->key);
        if (why == NULL) {
            purge.tenant = req->purge->tenant;
            purge.key = req->purge->key;
            cmd.op_case = IDEM__COMMAND__OP_PURGE;
            cmd.purge = &purge;
            proposeClient(s, &cmd, req->request_id, deadlineOf(s, req), cb, data);
            return;
        }
        break;
    case IDEM__REQUEST__OP_QUARANTINE_LIST: {
        const Idem__QuarantineListRequest *q = req->quarantine_list;
        const char *tenant = q->tenant != NULL && q->tenant[0] != '\0' ? q->tenant : NULL;
        if (tenant != NULL && strnlen(tenant, FSM_TENANT_MAX + 1) > FSM_TENANT_MAX) {
            why = "tenant longer than 128 bytes";
            break;
        }
        if (tenant != NULL && !tenantKnown(s, tenant)) {
            why = UNKNOWN_TENANT;
            break;
        }
        if (q->limit > QUARANTINE_LIST_MAX) {
            why = "limit out of range 1-1000";
            break;
        }
        /* The barrier: a command with the leader's clock and no op (fsm.h). */
        struct op *o = proposeOp(s, &cmd, OP_QUARANTINE_LIST, CLUSTER_ACCOUNT_NONE, req->request_id,
                                 deadlineOf(s, req), cb, data);
        if (o != NULL) {
            o->tenant = tenant != NULL ? xstrndup(tenant, strlen(tenant)) : NULL;
            o->limit = q->limit ? q->limit : QUARANTINE_LIST_DEFAULT;
            o->lease_ended = q->lease_ended;
        }
        return;
    }
    default:
        why = "unknown op";
        break;
    }
    answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, why, NULL);
}

static void handleAdmin(struct service *s, const Idem__Request *req, service_done_cb cb,
                        void *data)
{
    if (!authAdmin(s, &req->auth_token)) {
        /* A tenant's own token is known but not allowed here: forbidden (403), not
         * unauthenticated (401), as docs/contract.md tells them apart. */
        if (authTenant(s, &req->auth_token) != NULL) {
            answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                         "admin operations need the admin token, not a tenant's", NULL);
            return;
        }
        s->stats.unauthenticated++;
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                     "admin operations need the admin token", NULL);
        return;
    }
    int rc = CLUSTER_OK;
    struct adminOp *a = NULL;
    switch (req->op_case) {
    case IDEM__REQUEST__OP_STATUS:
        answerStatus(s, req->request_id, true, req->status->digest, cb, data);
        return;
    case IDEM__REQUEST__OP_SNAPSHOT:
        rc = cluster_snapshot_now(s->cluster);
        answerSimple(cb, data, req->request_id,
                     rc == CLUSTER_OK ? IDEM__OUTCOME__OUTCOME_OK
                                      : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     rc == CLUSTER_OK ? "snapshot scheduled at the next applied entry"
                                      : cluster_strerror(rc),
                     NULL);
        return;
    case IDEM__REQUEST__OP_RESOLVE: {
        const Idem__ResolveRequest *r = req->resolve;
        const char *why = NULL;
        if (r->response != NULL && !fsm_response_check(r->response, &why)) {
            answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, why, NULL);
            return;
        }
        Idem__ResolveCmd rc_cmd = IDEM__RESOLVE_CMD__INIT;
        rc_cmd.tenant = r->tenant;
        rc_cmd.key = r->key;
        rc_cmd.release = r->release;
        rc_cmd.response = r->response;
        rc_cmd.unsettled_only = true;
        Idem__Command cmd = IDEM__COMMAND__INIT;
        cmd.now_ms = nowMs();
        cmd.op_case = IDEM__COMMAND__OP_RESOLVE;
        cmd.resolve = &rc_cmd;
        /* As key get and purge check theirs: a bad tenant or key is refused here, not
         * written to the log for the state machine to refuse. */
        const char *bad = adminKeyError(s, r->tenant, &r->key);
        if (bad == NULL) {
            bad = fsm_command_check(&cmd);
        }
        if (bad != NULL) {
            answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, bad, NULL);
            return;
        }
        proposeClient(s, &cmd, req->request_id, deadlineOf(s, req), cb, data);
        return;
    }
    case IDEM__REQUEST__OP_KEY_GET:
    case IDEM__REQUEST__OP_PURGE:
    case IDEM__REQUEST__OP_QUARANTINE_LIST:
        handleKeyAdmin(s, req, cb, data);
        return;
    case IDEM__REQUEST__OP_MEMBERS:
    case IDEM__REQUEST__OP_TRANSFER:
        break;
    default:
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, "unknown op",
                     NULL);
        return;
    }
    if (req->op_case == IDEM__REQUEST__OP_MEMBERS &&
        req->members->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST) {
        answerStatus(s, req->request_id, false, false, cb, data);
        return;
    }
    /* Node IDs are 1..INT64_MAX, as in the configuration: the IDs a JSON integer carries
     * exactly (transfer's 0 means "any"). */
    uint64_t id = req->op_case == IDEM__REQUEST__OP_TRANSFER ? req->transfer->id : req->members->id;
    if (id > (uint64_t)INT64_MAX) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID,
                     "node id out of range (1..9223372036854775807)", NULL);
        return;
    }
    /* members add: each address as a node's configuration takes it (config_addr_parse: an
     * IPv4 address, a port without leading zeros), so that the cluster can compare them as
     * text, and none is cut short to fit. The RPC has other clients than idemctl. */
    if (req->op_case == IDEM__REQUEST__OP_MEMBERS &&
        req->members->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD) {
        const Idem__MembersRequest *m = req->members;
        const char *given[3] = {m->raft_address, m->rpc_address, m->http_address};
        static const char *const names[3] = {"raft", "rpc", "http"};
        for (unsigned i = 0; i < 3; i++) {
            struct config_addr ca;
            char why[256], msg[300];
            if (i == 2 && given[i][0] == '\0') {
                continue; /* the HTTP address is optional */
            }
            if (config_addr_parse(given[i], &ca, why, sizeof why) != 0) {
                snprintf(msg, sizeof msg, "%s address: %s", names[i], why);
                answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, msg, NULL);
                return;
            }
        }
    }
    a = xcalloc(1, sizeof(*a));
    a->s = s;
    a->cb = cb;
    a->data = data;
    a->request_id = req->request_id;
    if (req->op_case == IDEM__REQUEST__OP_TRANSFER) {
        rc = cluster_transfer(s->cluster, req->transfer->id, transferDoneCb, a);
    } else {
        const Idem__MembersRequest *m = req->members;
        struct cluster_member cm;
        memset(&cm, 0, sizeof(cm));
        cm.id = m->id;
        switch (m->action) {
        case IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD:
            snprintf(cm.raft_address, sizeof(cm.raft_address), "%s", m->raft_address);
            snprintf(cm.rpc_address, sizeof(cm.rpc_address), "%s", m->rpc_address);
            snprintf(cm.http_address, sizeof(cm.http_address), "%s", m->http_address);
            rc = cluster_member_add(s->cluster, &cm, adminChangeCb, a);
            break;
        case IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE:
            rc = cluster_member_promote(s->cluster, m->id, adminChangeCb, a);
            break;
        case IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE:
            rc = cluster_member_remove(s->cluster, m->id, adminChangeCb, a);
            break;
        default:
            rc = CLUSTER_EINVAL;
        }
    }
    if (rc != CLUSTER_OK) {
        free(a);
        answerClusterRc(s, rc, req->request_id, cb, data);
    }
}

static void handleAs(struct service *s, const char *tenant_name, const Idem__Request *req,
                     service_done_cb cb, void *data);

/* A request with as_tenant: a follower's proxy on behalf of a configured tenant. Only the
 * cluster secret may ask for it (its SHA-256 compared in constant time); a known tenant or
 * admin token is forbidden, anything else unauthenticated. */
static void handleAsTenant(struct service *s, const Idem__Request *req, service_done_cb cb,
                           void *data)
{
    uint8_t h[32];
    bool hashed = tokenHash(&req->auth_token, h);
    if (hashed && config_is_cluster_secret_hash(s->cfg, h)) {
        handleAs(s, req->as_tenant, req, cb, data);
        return;
    }
    s->stats.unauthenticated++;
    if (hashed && (config_tenant_by_token_hash(s->cfg, h) != NULL ||
                   config_is_admin_hash(s->cfg, h))) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                     "as_tenant needs the cluster secret", NULL);
        return;
    }
    answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                 s->cfg->rpc.cluster_secret.set ? "as_tenant needs the cluster secret"
                                                : "as_tenant needs the cluster secret, and this "
                                                  "node has none (rpc.cluster_secret_file)",
                 NULL);
}

void service_handle(struct service *s, const Idem__Request *req, service_done_cb cb,
                    void *data)
{
    s->stats.requests++;
    if (s->closing) {
        s->stats.unavailable++;
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "node shutting down", NULL);
        return;
    }
    if (req->as_tenant != NULL && req->as_tenant[0] != '\0') {
        handleAsTenant(s, req, cb, data);
        return;
    }
    if (service_data_op(req)) {
        handleData(s, req, cb, data);
        return;
    }
    switch (req->op_case) {
    case IDEM__REQUEST__OP_STATUS:
    case IDEM__REQUEST__OP_MEMBERS:
    case IDEM__REQUEST__OP_TRANSFER:
    case IDEM__REQUEST__OP_SNAPSHOT:
    case IDEM__REQUEST__OP_RESOLVE:
    case IDEM__REQUEST__OP_KEY_GET:
    case IDEM__REQUEST__OP_PURGE:
    case IDEM__REQUEST__OP_QUARANTINE_LIST:
        handleAdmin(s, req, cb, data);
        return;
    default:
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, "unknown op",
                     NULL);
    }
}

void service_handle_as(struct service *s, const char *tenant_name, const Idem__Request *req,
                       service_done_cb cb, void *data)
{
    s->stats.requests++;
    if (s->closing) {
        s->stats.unavailable++;
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "node shutting down", NULL);
        return;
    }
    handleAs(s, tenant_name, req, cb, data);
}

static void handleAs(struct service *s, const char *tenant_name, const Idem__Request *req,
                     service_done_cb cb, void *data)
{
    const struct config_tenant *t = NULL;
    for (size_t i = 0; i < s->cfg->n_tenants && t == NULL; i++) {
        if (strcmp(s->cfg->tenants[i].name, tenant_name) == 0) {
            t = &s->cfg->tenants[i];
        }
    }
    if (!service_data_op(req)) {
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                     "only data ops on behalf of a tenant", NULL);
        return;
    }
    if (t == NULL) {
        s->stats.unauthenticated++;
        answerSimple(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                     "unknown tenant", NULL);
        return;
    }
    handleDataAs(s, t, req, cb, data);
}

/* ---- lifecycle ----------------------------------------------------------------------- */

struct service *service_new(uv_loop_t *loop, const struct config *cfg, char *err,
                            size_t errlen)
{
    struct service *s = xcalloc(1, sizeof(*s));
    s->loop = loop;
    s->cfg = cfg;
    /* The state machine's slot arrays allocated ahead are faulted in on a thread of their
     * own, off the loop (prefault_thread.h). */
    s->fsm = fsm_new_with(&(struct fsm_options){.prefault = &prefault_thread});
    struct cluster_member *boot = xcalloc(cfg->cluster.n_bootstrap + 1, sizeof(*boot));
    for (size_t i = 0; i < cfg->cluster.n_bootstrap; i++) {
        const struct config_member *m = &cfg->cluster.bootstrap[i];
        boot[i].id = m->id;
        snprintf(boot[i].raft_address, sizeof(boot[i].raft_address), "%s", m->raft_address.text);
        snprintf(boot[i].rpc_address, sizeof(boot[i].rpc_address), "%s", m->rpc_address.text);
        snprintf(boot[i].http_address, sizeof(boot[i].http_address), "%s", m->http_address.text);
        boot[i].role = RAFT_VOTER;
    }
    struct cluster_config cc = {
        .id = cfg->node.id,
        .raft_address = cfg->node.raft_address.text,
        .rpc_address = cfg->node.rpc_address.text,
        .http_address = cfg->node.http_address.text,
        .data_dir = cfg->node.data_dir,
        .bootstrap = boot,
        .n_bootstrap = cfg->cluster.n_bootstrap,
        .election_timeout_ms = cfg->raft.election_timeout_ms,
        .heartbeat_timeout_ms = cfg->raft.heartbeat_timeout_ms,
        .snapshot_threshold = cfg->raft.snapshot_threshold,
        .snapshot_trailing = cfg->raft.snapshot_trailing,
        .snapshot_trailing_max_bytes = (uint64_t)cfg->raft.snapshot_trailing_max_mb << 20,
        .snapshot_log_percent = cfg->raft.snapshot_log_percent,
        .snapshot_log_max_bytes = (uint64_t)cfg->raft.snapshot_log_max_mb << 20,
        .segment_size = (size_t)cfg->raft.segment_size_mb << 20,
        .snapshot_nice = cfg->raft.snapshot_nice,
        .pre_vote = cfg->raft.pre_vote,
        .segment_prefill_off = !cfg->raft.prefill_segments,
        .stuck_write_step_down_ms = cfg->raft.stuck_write_step_down_ms,
        .raft_secret = cfg->raft.secret.value,
        .raft_secret_len = cfg->raft.secret.len,
        .raft_previous_secret = cfg->raft.previous_secret.value,
        .raft_previous_secret_len = cfg->raft.previous_secret.len,
        .batch_max_commands = cfg->batch.max_commands,
        .batch_max_bytes = cfg->batch.max_bytes,
        .max_pending_bytes = (uint64_t)cfg->batch.max_pending_mb << 20,
        .n_accounts = (uint32_t)cfg->n_tenants,
        .max_account_pending_bytes = ((uint64_t)cfg->batch.max_pending_mb << 20) *
                                     cfg->batch.tenant_max_pending_percent / 100,
        .max_account_inflight_bytes = (uint64_t)cfg->batch.tenant_max_inflight_kb << 10,
    };
    struct cluster_ops ops = {
        .data = s,
        .apply = svcApply,
        .fail = svcFail,
        .snapshot = svcSnapshot,
        .snapshot_freeze = svcSnapshotFreeze,
        .snapshot_write = svcSnapshotWrite,
        .snapshot_release = svcSnapshotRelease,
        .restore = svcRestore,
        .leader_changed = svcLeaderChanged,
    };
    s->cluster = cluster_new(loop, &cc, &ops, err, errlen);
    free(boot);
    if (s->cluster == NULL) {
        fsm_close(s->fsm);
        free(s);
        return NULL;
    }
    uv_timer_init(loop, &s->expiry_timer);
    s->expiry_timer.data = s;
    return s;
}

int service_start(struct service *s, char *err, size_t errlen)
{
    if (cluster_start(s->cluster) != CLUSTER_OK) {
        snprintf(err, errlen, "%s", cluster_errmsg(s->cluster));
        return -1;
    }
    expiryArm(s, s->cfg->expiry.interval_ms);
    return 0;
}

/* Frees the service once the expiry timer and the cluster are closed and every op was
 * handed back by the cluster (exactly once) with its timer closed. */
static void serviceMaybeFinish(struct service *s)
{
    if (!s->timer_closed || !s->cluster_closed || s->ops != NULL) {
        return;
    }
    fsm_close(s->fsm);
    void (*cb)(void *) = s->close_cb;
    void *cbdata = s->close_data;
    free(s);
    if (cb) {
        cb(cbdata);
    }
}

static void clusterClosed(void *data)
{
    struct service *s = data;
    s->cluster_closed = true;
    serviceMaybeFinish(s);
}

static void expiryTimerClosed(uv_handle_t *h)
{
    struct service *s = h->data;
    s->timer_closed = true;
    serviceMaybeFinish(s);
}

void service_close(struct service *s, void (*cb)(void *data), void *data)
{
    s->closing = true;
    s->close_cb = cb;
    s->close_data = data;
    uv_timer_stop(&s->expiry_timer);
    uv_close((uv_handle_t *)&s->expiry_timer, expiryTimerClosed);
    /* Answer everyone now; the cluster hands the ops back as raft closes. */
    for (struct op *o = s->ops; o != NULL; o = o->next) {
        opAnswerUnavailable(o, "node shutting down", 0);
    }
    cluster_close(s->cluster, clusterClosed, s);
}

void service_get_stats(const struct service *s, struct service_stats *out)
{
    *out = s->stats;
}

const struct config_tenant *service_tenant_for_token(const struct service *s,
                                                     const uint8_t *token, size_t len)
{
    ProtobufCBinaryData tok = {len, (uint8_t *)token};
    return authTenant(s, &tok);
}

bool service_token_is_admin(const struct service *s, const uint8_t *token, size_t len)
{
    ProtobufCBinaryData tok = {len, (uint8_t *)token};
    return authAdmin(s, &tok);
}

void service_tenant_pending(const struct service *s, size_t i, uint64_t *pending, uint64_t *queued,
                            uint64_t *refused)
{
    cluster_account_stats(s->cluster, i < UINT32_MAX ? (uint32_t)i : CLUSTER_ACCOUNT_NONE, pending,
                          queued, refused);
}

void service_get_info(const struct service *s, struct service_info *out)
{
    cluster_get_status(s->cluster, &out->cluster);
    fsm_get_stats(s->fsm, &out->fsm);
}
