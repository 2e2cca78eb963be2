/* service: requests in, decisions out (see service.h).
 *
 * A data request's life: authenticate (SHA-256 of the bearer token → tenant) → validate the
 * key → build the log Command with the leader's clock, the tenant's defaults and quotas →
 * cluster_propose() with an `op` as waiter → either svcApply() gets the op back with the
 * command's result (answer it), or svcFail() does (answer unavailable), or the op's deadline
 * passes first (answer unavailable; the op stays alive until the cluster hands it back,
 * because the cluster still holds it). Every answer goes out exactly once. The ops'
 * deadlines share one timer (deadlines.h), armed for the earliest.
 *
 * Fail closed (docs/contract.md): nothing is ever answered from local state. A follower
 * answers not_leader with the leader's RPC address; a node that knows no leader, or whose
 * proposal does not commit in time, answers unavailable.
 *
 * This file: the ops the cluster holds as waiters, answering them, the cluster's callbacks,
 * proposing, the expiry ticker and the service's lifecycle. Authentication and data requests
 * are service_requests.c, operators' requests service_admin.c (service_internal.h). */
#include "service_internal.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "fingerprint.h"
#include "frame.h"
#include "log.h"
#include "prefault_thread.h"
#include "resolver.h"
#include "xmalloc.h"

/* Layouts server/ and cluster/ each define, so that neither library includes the other's
 * headers: they must agree. */
_Static_assert(CONFIG_RAFT_SECRET_MIN == CLUSTER_SECRET_MIN,
               "config.c and cluster.h must agree on a Raft secret's least length");
_Static_assert(FSM_SLOT_BITS == CLUSTER_SLOT_BITS,
               "a fencing token is the command index cluster.c applies a command at");


uint64_t service_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- answering ----------------------------------------------------------------------- */

void service_answer_retry_after(service_done_cb cb, void *data, uint64_t request_id,
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

void service_answer(service_done_cb cb, void *data, uint64_t request_id, Idem__Outcome outcome,
                         const char *error, const char *leader)
{
    service_answer_retry_after(cb, data, request_id, outcome, error, leader, 0);
}

void service_answer_invalid(service_done_cb cb, void *data, uint64_t request_id,
                            const char *why)
{
    service_answer(cb, data, request_id, IDEM__OUTCOME__OUTCOME_INVALID, why, NULL);
}

static void serviceMaybeFinish(struct service *s);

static void opMaybeFree(struct op *o)
{
    if (o->in_cluster) {
        return;
    }
    struct service *s = o->s;
    deadlines_remove(&s->deadlines, &o->deadline);
    LIST_REMOVE(o, link);
    free(o->tenant);
    free(o);
    if (s->closing) {
        serviceMaybeFinish(s);
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
    service_answer_retry_after(o->cb, o->data, o->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, why, NULL,
                     retry_after_ms);
}

static void deadlineCb(uv_timer_t *t);

/* Arms the deadline timer for the earliest deadline, unless it is armed for that or
 * earlier already. */
static void deadlineArm(struct service *s)
{
    struct deadline *d = deadlines_min(&s->deadlines);
    if (d == NULL || s->closing || (s->deadline_armed && s->deadline_armed_at <= d->at)) {
        return;
    }
    uint64_t now = uv_now(s->loop);
    s->deadline_armed = true;
    s->deadline_armed_at = d->at;
    uv_timer_start(&s->deadline_timer, deadlineCb, d->at > now ? d->at - now : 0, 0);
}

/* Answers unavailable every op whose deadline passed before its command committed. The op
 * itself lives on until the cluster hands it back, because the cluster still holds it. */
static void deadlineCb(uv_timer_t *t)
{
    struct service *s = t->data;
    s->deadline_armed = false;
    uint64_t now = uv_now(s->loop);
    struct deadline *d;
    while ((d = deadlines_min(&s->deadlines)) != NULL && d->at <= now) {
        struct op *o = (struct op *)((char *)d - offsetof(struct op, deadline));
        deadlines_remove(&s->deadlines, d);
        opAnswerUnavailable(o, "deadline passed before the command committed", 0);
        opMaybeFree(o);
    }
    deadlineArm(s);
}

void service_record_from_view(const struct fsm_record_view *v, Idem__Record *rec)
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

/* A replay's stored response on its way out: field 8 of Result as protobuf-c's unknown
 * fields carry a length-delimited one, its length (a varint) then its bytes. */
struct storedWire {
    ProtobufCMessageUnknownField field;
    uint8_t *heap; /* the bytes when they do not fit `small`; freed by storedWireFree */
    uint8_t small[1024];
};

static void storedWireFree(struct storedWire *w)
{
    free(w->heap);
}

/* Fills an Idem__Result from the state machine's result; rec and stored are its caller's
 * storage for the nested parts (stored freed with storedWireFree). A replay's stored
 * response is not decoded: the bytes the table keeps (a packed StoredResponse) go out as
 * field 8 (`response`) through protobuf-c's unknown fields, which it packs as they are; the
 * client decodes them as the message. In this process, service_stored_response() decodes
 * them for the gateway. */
static void resultToProto(const struct fsm_result *r, Idem__Result *out,
                          struct storedWire *stored, Idem__Record *rec)
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
    stored->heap = NULL;
    if (r->response != NULL) {
        size_t need = FRAME_VARINT_MAX + r->response_len;
        uint8_t *p = need <= sizeof(stored->small) ? stored->small : (stored->heap = xmalloc(need));
        size_t n = frame_varint_put(p, r->response_len);
        memcpy(p + n, r->response, r->response_len);
        stored->field = (ProtobufCMessageUnknownField){
            .tag = SERVICE_RESULT_RESPONSE_FIELD,
            .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
            .len = n + r->response_len,
            .data = p,
        };
        out->base.n_unknown_fields = 1;
        out->base.unknown_fields = &stored->field;
    }
    if (r->has_record) {
        service_record_from_view(&r->record, rec);
        rec->response.data = (uint8_t *)r->record.response;
        rec->response.len = r->record.response_len;
        out->record = rec;
    }
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
        service_answer_quarantine_list(s, o);
    } else if (!o->answered) {
        o->answered = true;
        Idem__Result res = IDEM__RESULT__INIT;
        Idem__Record rec = IDEM__RECORD__INIT;
        struct storedWire stored;
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
        storedWireFree(&stored);
    }
    opMaybeFree(o); /* its deadline too */
}

static void svcFail(void *data, void *waiter, int status)
{
    struct service *s = data;
    struct op *o = waiter;
    o->in_cluster = false;
    if (o->kind == OP_EXPIRE) {
        s->expire_in_flight = false;
    } else if (status == RAFT_NOTLEADER) {
        /* Never in the log: as if refused when it was taken (service_propose). */
        opAnswerUnavailable(o,
                            "not proposed: this leader began a leadership transfer or stopped "
                            "leading first; send it again shortly",
                            SERVICE_BUSY_RETRY_MS);
    } else {
        opAnswerUnavailable(
            o, status == RAFT_SHUTDOWN ? "node shutting down" : "leadership lost before commit", 0);
    }
    opMaybeFree(o); /* its deadline too */
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
                 "written off the loop in %.1f ms at nice %d; stored in %.1f ms; next after %u "
                 "entries",
                 (unsigned long long)info->index, (unsigned long long)records, info->bytes,
                 (double)info->pause_us / 1000.0, (double)info->write_us / 1000.0, info->nice,
                 (double)info->store_us / 1000.0, info->next_threshold);
    } else {
        log_warn("snapshot at index %llu abandoned (loop paused %.3f ms)",
                 (unsigned long long)info->index, (double)info->pause_us / 1000.0);
    }
}

static int svcRestore(void *data, const uint8_t *buf, size_t len)
{
    struct service *s = data;
    const char *why = NULL;
    uint64_t t0 = uv_hrtime();
    if (fsm_restore(s->fsm, buf, len, &why) != 0) {
        log_error("snapshot restore refused: %s", why);
        return -1;
    }
    struct fsm_stats st;
    fsm_get_stats(s->fsm, &st);
    log_info("snapshot restored: %llu records, %zu bytes in %.1f ms",
             (unsigned long long)st.records, len, (double)(uv_hrtime() - t0) / 1e6);
    return 0;
}

static void svcLeaderChanged(void *data, uint64_t leader_id, bool is_me)
{
    struct service *s = data;
    if (leader_id == 0) {
        log_warn("no leader known");
    } else {
        log_info("leader is now node %llu%s", (unsigned long long)leader_id,
                 is_me ? " (this node)" : "");
    }
    if (leader_id != 0 && s->leader_cb != NULL) {
        s->leader_cb(s->leader_data);
    }
}

/* ---- proposing ----------------------------------------------------------------------- */

static struct op *opNew(struct service *s, enum opKind kind)
{
    struct op *o = xcalloc(1, sizeof(*o));
    o->s = s;
    o->kind = kind;
    deadline_init(&o->deadline);
    LIST_INSERT_HEAD(&s->ops, o, link);
    return o;
}

struct op *service_propose(struct service *s, const Idem__Command *cmd, enum opKind kind,
                            uint32_t account, uint64_t request_id, uint32_t deadline_ms,
                            service_done_cb cb, void *data)
{
    const char *leader = "";
    if (!cluster_is_leader(s->cluster)) {
        uint64_t lid = cluster_leader(s->cluster, &leader);
        if (lid == 0 || leader[0] == '\0') {
            s->stats.unavailable++;
            service_answer(cb, data, request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                         "no leader known: the cluster has no quorum or is electing", NULL);
        } else {
            s->stats.not_leader++;
            service_answer(cb, data, request_id, IDEM__OUTCOME__OUTCOME_NOT_LEADER, "not the leader",
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
        service_answer_retry_after(cb, data, request_id,
                         rc == CLUSTER_ETOOBIG ? IDEM__OUTCOME__OUTCOME_INVALID
                                               : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                         cluster_strerror(rc), NULL, busy ? SERVICE_BUSY_RETRY_MS : 0);
        opMaybeFree(o);
        return NULL;
    }
    o->in_cluster = true;
    deadlines_push(&s->deadlines, &o->deadline, uv_now(s->loop) + deadline_ms);
    deadlineArm(s);
    return o;
}

void service_propose_client(struct service *s, const Idem__Command *cmd, uint64_t request_id,
                          uint32_t deadline_ms, service_done_cb cb, void *data)
{
    service_propose(s, cmd, OP_CLIENT, CLUSTER_ACCOUNT_NONE, request_id, deadline_ms, cb, data);
}

/* ---- expiry ticker ------------------------------------------------------------------- */

static void expiryTick(uv_timer_t *t)
{
    struct service *s = t->data;
    uint64_t now = service_now_ms();
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

/* ---- lifecycle ----------------------------------------------------------------------- */

/* cluster.bootstrap as the cluster takes it (calloc'd, one more entry than members). */
static struct cluster_member *bootMembers(const struct config *cfg)
{
    struct cluster_member *boot = xcalloc(cfg->cluster.n_bootstrap + 1, sizeof(*boot));
    for (size_t i = 0; i < cfg->cluster.n_bootstrap; i++) {
        const struct config_member *m = &cfg->cluster.bootstrap[i];
        boot[i].id = m->id;
        snprintf(boot[i].raft_address, sizeof(boot[i].raft_address), "%s", m->raft_address.text);
        snprintf(boot[i].rpc_address, sizeof(boot[i].rpc_address), "%s", m->rpc_address.text);
        snprintf(boot[i].http_address, sizeof(boot[i].http_address), "%s", m->http_address.text);
        boot[i].role = RAFT_VOTER;
    }
    return boot;
}

/* Frees a service that service_new() could not finish (its fsm, when made). */
static void serviceFreeEarly(struct service *s)
{
    if (s->fsm != NULL) {
        fsm_close(s->fsm);
    }
    if (s->tokhash != NULL) {
        tokhash_close(s->tokhash);
        free(s->tokhash);
    }
    free(s->acct_of);
    free(s->acct_names);
    free(s);
}

struct service *service_new(uv_loop_t *loop, const struct config *cfg, char *err,
                            size_t errlen)
{
    const ProtobufCFieldDescriptor *rf =
        protobuf_c_message_descriptor_get_field(&idem__result__descriptor,
                                                SERVICE_RESULT_RESPONSE_FIELD);
    if (rf == NULL || rf->descriptor != &idem__stored_response__descriptor) {
        snprintf(err, errlen, "built with a Result.response that is not field %d",
                 SERVICE_RESULT_RESPONSE_FIELD);
        return NULL;
    }
    struct tokhash *tokhash = xcalloc(1, sizeof(*tokhash));
    if (!tokhash_init(tokhash)) {
        free(tokhash);
        snprintf(err, errlen, "no SHA-256 in the crypto library, or no memory for its context");
        return NULL;
    }
    struct service *s = xcalloc(1, sizeof(*s));
    s->tokhash = tokhash;
    s->loop = loop;
    s->cfg = cfg;
    LIST_INIT(&s->ops);
    s->n_accts = (uint32_t)cfg->n_tenants;
    s->acct_of = xcalloc(cfg->n_tenants ? cfg->n_tenants : 1, sizeof(*s->acct_of));
    s->acct_names = xcalloc(cfg->n_tenants ? cfg->n_tenants : 1, sizeof(*s->acct_names));
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        s->acct_of[i] = (uint32_t)i;
        memcpy(s->acct_names[i], cfg->tenants[i].name, sizeof s->acct_names[i]);
    }
    /* The state machine's slot arrays allocated ahead are faulted in on a thread of their
     * own, off the loop (prefault_thread.h). */
    uint8_t secret[FSM_HASH_SECRET_LEN];
    if (RAND_bytes(secret, sizeof secret) != 1) {
        snprintf(err, errlen, "no randomness for the record table's hash key");
        serviceFreeEarly(s);
        return NULL;
    }
    s->fsm = fsm_new_with(
        &(struct fsm_options){.prefault = &prefault_thread, .hash_secret = secret});
    OPENSSL_cleanse(secret, sizeof secret);
    s->resolver = IdemResolverNew(loop);
    if (s->resolver == NULL) {
        snprintf(err, errlen, "cannot make the host name resolver (out of memory)");
        serviceFreeEarly(s);
        return NULL;
    }
    struct cluster_member *boot = bootMembers(cfg);
    struct cluster_config cc = {
        .id = cfg->node.id,
        .raft_address = cfg->node.raft_address.text,
        .raft_listen = cfg->node.raft_listen.text,
        .resolver = s->resolver,
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
        .raft_tls_cert_file = cfg->tls.raft ? cfg->tls.cert_file : NULL,
        .raft_tls_key_file = cfg->tls.raft ? cfg->tls.key_file : NULL,
        .raft_tls_ca_file = cfg->tls.raft ? cfg->tls.ca_file : NULL,
        .batch_max_commands = cfg->batch.max_commands,
        .batch_max_bytes = cfg->batch.max_bytes,
        .batch_delay_us = cfg->batch.delay_us,
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
        IdemResolverClose(s->resolver);
        uv_run(loop, UV_RUN_NOWAIT); /* its handle closes on the loop */
        serviceFreeEarly(s);
        return NULL;
    }
    uv_timer_init(loop, &s->expiry_timer);
    s->expiry_timer.data = s;
    uv_timer_init(loop, &s->deadline_timer);
    s->deadline_timer.data = s;
    return s;
}

/* An index of the accounts by name (service_set_config): open addressing over
 * acct_names, each slot 1 + an account or 0 (empty), at most half full. */
struct acctIndex {
    uint32_t *slots;
    size_t mask;
};

static uint32_t *acctSlot(const struct service *s, const struct acctIndex *x, const char *name)
{
    for (size_t i = XXH3_64bits(name, strlen(name)) & x->mask;; i = (i + 1) & x->mask) {
        if (x->slots[i] == 0 || strcmp(s->acct_names[x->slots[i] - 1], name) == 0) {
            return &x->slots[i];
        }
    }
}

void service_set_config(struct service *s, const struct config *cfg)
{
    uint32_t *of = xcalloc(cfg->n_tenants ? cfg->n_tenants : 1, sizeof(*of));
    /* Each tenant keeps the account of its name, found through an index: a pass over the
     * accounts for each tenant took 1.2 s of the loop with 20,000 tenants, past the
     * election timeout. */
    struct acctIndex x;
    size_t slots = 16;
    while (slots < 2 * ((size_t)s->n_accts + cfg->n_tenants)) {
        slots *= 2;
    }
    x.mask = slots - 1;
    x.slots = xcalloc(slots, sizeof(*x.slots));
    for (uint32_t a = 0; a < s->n_accts; a++) {
        *acctSlot(s, &x, s->acct_names[a]) = a + 1;
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        const char *name = cfg->tenants[i].name;
        uint32_t *slot = acctSlot(s, &x, name);
        if (*slot == 0) { /* a tenant new to this node: an account of its own */
            uint32_t a = s->n_accts;
            s->acct_names = xrealloc(s->acct_names, (size_t)(a + 1) * sizeof(*s->acct_names));
            memcpy(s->acct_names[a], name, sizeof s->acct_names[a]);
            s->n_accts = a + 1;
            *slot = a + 1;
        }
        of[i] = *slot - 1;
    }
    free(x.slots);
    cluster_add_accounts(s->cluster, s->n_accts);
    free(s->acct_of);
    s->acct_of = of;
    s->cfg = cfg;
}

int service_load_tls(const struct config_tls *tls, struct idem_tls_ctx **server,
                     struct idem_tls_ctx **client, char *err, size_t errlen)
{
    *server = *client = NULL;
    char why[400];
    if (tls->raft && cluster_tls_load(tls->cert_file, tls->key_file, tls->ca_file, server, client,
                                      why, sizeof why) != CLUSTER_OK) {
        snprintf(err, errlen, "%s: %s (tls.raft)", tls->at != NULL ? tls->at : "tls", why);
        return -1;
    }
    return 0;
}

void service_set_tls(struct service *s, struct idem_tls_ctx *server, struct idem_tls_ctx *client)
{
    cluster_tls_set(s->cluster, server, client);
}

void service_set_reload(struct service *s, service_reload_fn fn, void *data)
{
    s->reload = fn;
    s->reload_data = data;
}

void service_set_leader_cb(struct service *s, service_leader_fn fn, void *data)
{
    s->leader_cb = fn;
    s->leader_data = data;
}

uint32_t service_account_of(const struct service *s, const struct config_tenant *t)
{
    return s->acct_of[t - s->cfg->tenants];
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

/* Frees the service once its two timers (the expiry ticker, the ops' deadlines) and the
 * cluster are closed and every op was handed back by the cluster (exactly once). */
static void serviceMaybeFinish(struct service *s)
{
    if (!s->timer_closed || !s->deadline_timer_closed || !s->cluster_closed ||
        !LIST_EMPTY(&s->ops)) {
        return;
    }
    deadlines_free(&s->deadlines);
    fsm_close(s->fsm);
    tokhash_close(s->tokhash);
    free(s->tokhash);
    IdemResolverClose(s->resolver); /* the cluster, its user, is closed */
    free(s->acct_of);
    free(s->acct_names);
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

static void deadlineTimerClosed(uv_handle_t *h)
{
    struct service *s = h->data;
    s->deadline_timer_closed = true;
    serviceMaybeFinish(s);
}

/* A handoff in flight (service_hand_off). */
struct handOff {
    struct service *s;
    void (*cb)(void *data, uint64_t moved_to);
    void *data;
};

static void handOffDone(void *data, int status, const char *errmsg)
{
    (void)errmsg;
    struct handOff *h = data;
    const char *addr = NULL;
    uint64_t leader = status == 0 ? cluster_leader(h->s->cluster, &addr) : 0;
    h->cb(h->data, leader);
    free(h);
}

int service_hand_off(struct service *s, void (*cb)(void *data, uint64_t moved_to), void *data)
{
    struct handOff *h = xcalloc(1, sizeof(*h));
    h->s = s;
    h->cb = cb;
    h->data = data;
    int rc = cluster_transfer(s->cluster, 0, handOffDone, h);
    if (rc != CLUSTER_OK) {
        free(h);
    }
    return rc;
}

void service_close(struct service *s, void (*cb)(void *data), void *data)
{
    s->closing = true;
    s->close_cb = cb;
    s->close_data = data;
    uv_timer_stop(&s->expiry_timer);
    uv_close((uv_handle_t *)&s->expiry_timer, expiryTimerClosed);
    uv_timer_stop(&s->deadline_timer);
    uv_close((uv_handle_t *)&s->deadline_timer, deadlineTimerClosed);
    /* Answer everyone now; the cluster hands the ops back as raft closes. */
    struct op *o;
    LIST_FOREACH(o, &s->ops, link) {
        opAnswerUnavailable(o, "node shutting down", 0);
    }
    cluster_close(s->cluster, clusterClosed, s);
}

const Idem__StoredResponse *service_stored_response(const Idem__Result *res,
                                                   Idem__StoredResponse **owned)
{
    *owned = NULL;
    if (res->response != NULL) {
        return res->response;
    }
    for (size_t i = 0; i < res->base.n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &res->base.unknown_fields[i];
        if (u->tag != SERVICE_RESULT_RESPONSE_FIELD ||
            u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) {
            continue;
        }
        /* its length (a varint), then the packed message */
        uint64_t len = 0;
        size_t at = 0;
        if (frame_varint_get(u->data, u->len, &len, &at) != 1 || len != u->len - at) {
            return NULL;
        }
        *owned = idem__stored_response__unpack(NULL, len, u->data + at);
        return *owned;
    }
    return NULL;
}

const char *service_leader_rpc(const struct service *s)
{
    const char *addr = "";
    return cluster_leader(s->cluster, &addr) != 0 && addr[0] != '\0' ? addr : NULL;
}

const char *service_leader_elsewhere(const struct service *s)
{
    return cluster_is_leader(s->cluster) ? NULL : service_leader_rpc(s);
}

/* The addresses of the host of `addr` ("host:port", "[v6]:port") into out[*k..cap): an IP
 * address itself (a wildcard none), a name those it last resolved to (asked again in the
 * background once that answer is old). */
static void hostsOf(const struct service *s, const char *addr, struct rpc_admit_addr *out,
                    size_t cap, size_t *k)
{
    char host[IDEM_HOST_MAX + 1];
    uint16_t port = 0;
    struct sockaddr_storage ss[IDEM_RESOLVE_MAX];
    size_t n = 0;
    if (*k >= cap || !IdemHostPortSplit(addr, host, sizeof host, &port)) {
        return;
    }
    if (IdemSockaddrLiteral(host, port, &ss[0])) {
        n = 1;
    } else {
        IdemResolverRefresh(s->resolver, host, SERVICE_MEMBER_RESOLVE_MS);
        n = IdemResolverCached(s->resolver, host, port, UINT64_MAX, ss, IDEM_RESOLVE_MAX);
    }
    static const struct rpc_admit_addr none;
    for (size_t i = 0; i < n && *k < cap; i++) {
        struct rpc_admit_addr a = none;
        (void)IdemSockaddrKey((const struct sockaddr *)&ss[i], a.b);
        struct rpc_admit_addr any4 = rpc_admit_addr_v4(0);
        any4.b[10] = any4.b[11] = 0xff; /* 0.0.0.0 */
        if (memcmp(&a, &none, sizeof a) != 0 && memcmp(&a, &any4, sizeof a) != 0) {
            out[(*k)++] = a;
        }
    }
}

size_t service_member_addrs(const struct service *s, struct rpc_admit_addr *out, size_t cap)
{
    size_t k = 0;
    const struct config *cfg = s->cfg;
    const char *mine[] = {cfg->node.raft_address.text, cfg->node.rpc_address.text,
                          cfg->node.http_address.text};
    for (size_t i = 0; i < 3; i++) {
        hostsOf(s, mine[i], out, cap, &k);
    }
    for (size_t i = 0; i < cfg->cluster.n_bootstrap; i++) {
        const struct config_member *b = &cfg->cluster.bootstrap[i];
        const char *addrs[] = {b->raft_address.text, b->rpc_address.text, b->http_address.text};
        for (size_t j = 0; j < 3; j++) {
            hostsOf(s, addrs[j], out, cap, &k);
        }
    }
    struct cluster_member ms[CLUSTER_MEMBERS_MAX];
    size_t n = cluster_members(s->cluster, ms, CLUSTER_MEMBERS_MAX);
    for (size_t i = 0; i < n && i < CLUSTER_MEMBERS_MAX; i++) {
        const char *addrs[] = {ms[i].raft_address, ms[i].rpc_address, ms[i].http_address};
        for (size_t j = 0; j < 3; j++) {
            hostsOf(s, addrs[j], out, cap, &k);
        }
    }
    return k;
}

void service_get_stats(const struct service *s, struct service_stats *out)
{
    *out = s->stats;
}

const struct config_tenant *service_tenant_for_token(const struct service *s,
                                                     const uint8_t *token, size_t len)
{
    ProtobufCBinaryData tok = {len, (uint8_t *)token};
    return service_auth_tenant(s, &tok);
}

bool service_token_is_admin(const struct service *s, const uint8_t *token, size_t len)
{
    ProtobufCBinaryData tok = {len, (uint8_t *)token};
    return service_auth_admin(s, &tok);
}

void service_tenant_pending(const struct service *s, size_t i, uint64_t *pending, uint64_t *queued,
                            uint64_t *refused)
{
    uint32_t a = i < s->cfg->n_tenants ? s->acct_of[i] : CLUSTER_ACCOUNT_NONE;
    cluster_account_stats(s->cluster, a, pending, queued, refused);
}

void service_tenant_usage(const struct service *s, const char *name, uint64_t *records,
                          uint64_t *bytes)
{
    fsm_tenant_usage(s->fsm, name, records, bytes);
}

void service_get_info(const struct service *s, struct service_info *out)
{
    cluster_get_status(s->cluster, &out->cluster);
    fsm_get_stats(s->fsm, &out->fsm);
}
