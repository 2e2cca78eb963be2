/* proxy_record: proxy mode's service calls (local, else forwarded to the leader, retried
 * while no leader answers), the lease renewal during the upstream call, and recording what
 * the upstream call ended with (complete or release). See proxy.c for the whole flow. */
#include "proxy_internal.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "renew_plan.h"
#include "xmalloc.h"

#define PJ_RETRY_FIRST_MS 50
#define PJ_RETRY_MAX_MS 500

void proxy_key_digest(const struct proxyJob *j, char kd[FP_HEX12_SIZE])
{
    key_digest(j->tenant->name, (const uint8_t *)j->key, j->key_len, kd);
}

/* An outcome's name for a log line. */
static const char *outcomeName(Idem__Outcome oc)
{
    return (unsigned)oc < REQSTATS_OUTCOMES ? gateway_outcome_names[oc] : "?";
}


/* ---- service calls: local, else forwarded to the leader --------------------------------- */

static void pjCallSend(struct proxyJob *j);

/* Answers the call in flight with a synthetic outcome (no service answer). */
static void pjCallSynth(struct proxyJob *j, Idem__Outcome oc, const char *why)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = oc;
    resp.result = &res;
    resp.error = (char *)why;
    j->call_in_flight = false;
    service_done_cb cb = j->call_cb;
    j->call_cb = NULL;
    cb(j, &resp);
}

static void pjRetryCb(uv_timer_t *t)
{
    pjCallSend(t->data);
}

/* The call's answer: retried after a pause while no leader answers (and the call allows
 * it), else handed to the call's callback. */
static void pjCallDone(struct proxyJob *j, const Idem__Response *resp)
{
    struct http_server *h = j->h;
    Idem__Outcome oc = resp->result ? resp->result->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    /* Without a secret a follower's not_leader is final: it cannot forward. */
    bool noLeader = oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE ||
                    oc == IDEM__OUTCOME__OUTCOME_UNSPECIFIED ||
                    (oc == IDEM__OUTCOME__OUTCOME_NOT_LEADER && h->cfg->rpc.cluster_secret.set);
    uint64_t now = uv_now(h->loop);
    if (noLeader && j->call_retry && !h->stopping && now + j->call_backoff_ms < j->call_deadline) {
        uv_timer_start(&j->timer, pjRetryCb, j->call_backoff_ms, 0);
        j->call_backoff_ms = j->call_backoff_ms * 2 > PJ_RETRY_MAX_MS ? PJ_RETRY_MAX_MS
                                                                      : j->call_backoff_ms * 2;
        return;
    }
    j->call_in_flight = false;
    service_done_cb cb = j->call_cb;
    j->call_cb = NULL;
    cb(j, resp);
}

static void pjForwardDoneCb(void *data, const Idem__Response *resp, const char *err)
{
    struct proxyJob *j = data;
    if (resp != NULL) {
        pjCallDone(j, resp);
        return;
    }
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response r = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_UNAVAILABLE;
    r.result = &res;
    r.error = (char *)(err ? err : "");
    pjCallDone(j, &r);
}

/* The local service's answer. */
static void pjServiceDoneCb(void *data, const Idem__Response *resp)
{
    pjCallDone(data, resp);
}

/* Sends the packed call (again, for a retry): to the leader when another node leads and this
 * node has a cluster secret (the leader accepts as_tenant only with it), else to the local
 * service, which decides on a leader and answers not_leader or unavailable on a follower. */
static void pjCallSend(struct proxyJob *j)
{
    struct http_server *h = j->h;
    if (h->stopping) {
        pjCallSynth(j, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, "node shutting down");
        return;
    }
    Idem__Request *rq = idem__request__unpack(NULL, j->call_len, j->call_packed);
    if (rq == NULL) {
        pjCallSynth(j, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, "cannot decode the request again");
        return;
    }
    /* j may be answered (and finished) before this returns. */
    const char *leader = h->cfg->rpc.cluster_secret.set ? gateway_forward_target(h) : NULL;
    if (leader != NULL && !h->cfg->tls.rpc && !config_addr_is_loopback(leader)) {
        /* rpc.insecure_cluster_secret allows the clear only between loopback addresses (the
         * configuration checks the bootstrap members'; this, a member added later). */
        idem__request__free_unpacked(rq, NULL);
        uint64_t now = uv_now(h->loop);
        if (h->clear_warned_ms == 0 || now - h->clear_warned_ms >= 10000) {
            h->clear_warned_ms = now ? now : 1;
            log_at(LOG_LEVEL_WARN, j->rid,
                   "proxy: the leader's RPC address %s is not a loopback address and tls.rpc "
                   "is off: the cluster secret is not sent to it in clear",
                   leader);
        }
        pjCallSynth(j, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                    "this node does not send the cluster secret to the leader without TLS; "
                    "retry, or use the leader's proxy");
        return;
    }
    char rid[sizeof j->rid]; /* j may be finished before the call returns */
    memcpy(rid, j->rid, sizeof rid);
    const char *outer = log_request_enter(rid);
    if (leader != NULL) {
        /* Never sent again by the forwarder when the leader changes: it fails, and
         * pjCallDone retries it as after any failed call, through the checks above. */
        gateway_forward(h, leader, rq, NULL, pjForwardDoneCb, j);
    } else {
        service_handle_as(h->svc, j->tenant->name, rq, pjServiceDoneCb, j);
    }
    log_request_leave(outer);
    idem__request__free_unpacked(rq, NULL);
}

/* Calls the service on behalf of the route's tenant (one call at a time per job); on a
 * follower the call goes to the leader (see above). retry_ms > 0: a call that finds no
 * leader is sent again for up to retry_ms. After http_server_stop() the service is no
 * longer called and cb gets unavailable. cb may run before this returns. */
void proxy_call(struct proxyJob *j, Idem__Request *rq, service_done_cb cb, uint64_t retry_ms)
{
    struct http_server *h = j->h;
    const struct config_secret *sec = &h->cfg->rpc.cluster_secret;
    if (rq->deadline_ms == 0) {
        rq->deadline_ms = h->cfg->rpc.default_deadline_ms;
    }
    if (sec->set) { /* read only by the leader, when the call is forwarded */
        rq->as_tenant = (char *)j->tenant->name;
        rq->auth_token.data = sec->value;
        rq->auth_token.len = sec->len;
    }
    if (j->call_packed != NULL) {
        OPENSSL_cleanse(j->call_packed, j->call_len);
        free(j->call_packed);
    }
    j->call_len = idem__request__get_packed_size(rq);
    j->call_packed = xmalloc(j->call_len ? j->call_len : 1);
    idem__request__pack(rq, j->call_packed);
    j->call_cb = cb;
    j->call_in_flight = true;
    j->call_retry = retry_ms > 0;
    j->call_deadline = uv_now(h->loop) + retry_ms;
    j->call_backoff_ms = PJ_RETRY_FIRST_MS;
    pjCallSend(j);
}

/* ---- recording the upstream call and renewing its lease ---------------------------------- */

static void pjCompleteStored(struct proxyJob *j);

static void pjRecordDoneCb(void *data, const Idem__Response *resp)
{
    struct proxyJob *j = data;
    Idem__Outcome oc = resp->result ? resp->result->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    if ((oc == IDEM__OUTCOME__OUTCOME_INVALID || oc == IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED) &&
        j->record == PJ_REC_STORE && !j->too_large) {
        /* The answer could not be stored as it is (larger than a log entry takes, past the
         * tenant's bytes quota, ...), and that will not change: the record would stay
         * processing and a retry could run the upstream again once the lease ends. Its
         * digest-only marker is stored instead (a replay answers 502), as for an answer
         * over max_inline_body; this caller still gets the upstream's answer. */
        char kd[FP_HEX12_SIZE];
        proxy_key_digest(j, kd);
        log_at(LOG_LEVEL_WARN, j->rid,
               "proxy: the upstream's answer cannot be stored (outcome %s); its digest is "
               "recorded instead, replays answer 502 (key_digest %s)",
               outcomeName(oc), kd);
        j->too_large = true;
        j->digest_instead = true;
        pjCompleteStored(j);
        return;
    }
    if (oc != IDEM__OUTCOME__OUTCOME_OK) {
        char kd[FP_HEX12_SIZE];
        proxy_key_digest(j, kd);
        log_at(LOG_LEVEL_WARN, j->rid,
               "proxy: recording the upstream's answer failed (key_digest %s, outcome %s)", kd,
               outcomeName(oc));
        j->unrecorded = true;
        j->quarantining = false; /* not quarantined: the record keeps its expiry */
    }
    proxy_answer_after(j);
}

/* How long a complete or release is retried while no leader answers. */
static uint64_t pjRecordRetryMs(const struct proxyJob *j)
{
    uint64_t d = 3 * (uint64_t)j->h->cfg->rpc.default_deadline_ms;
    return j->lease_ms > d ? j->lease_ms : d;
}

void proxy_release(struct proxyJob *j)
{
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__ReleaseRequest re = IDEM__RELEASE_REQUEST__INIT;
    re.key.data = (uint8_t *)j->key;
    re.key.len = j->key_len;
    re.token = j->token;
    rq.op_case = IDEM__REQUEST__OP_RELEASE;
    rq.release = &re;
    proxy_call(j, &rq, pjRecordDoneCb, pjRecordRetryMs(j));
}

static void pjComplete(struct proxyJob *j, Idem__Completion outcome, Idem__StoredResponse *sr)
{
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__CompleteRequest co = IDEM__COMPLETE_REQUEST__INIT;
    co.key.data = (uint8_t *)j->key;
    co.key.len = j->key_len;
    co.token = j->token;
    co.outcome = outcome;
    co.response = sr;
    rq.op_case = IDEM__REQUEST__OP_COMPLETE;
    rq.complete = &co;
    proxy_call(j, &rq, pjRecordDoneCb, pjRecordRetryMs(j));
}

/* Records what the upstream call ended with (j->record), unless the lease was lost: then the
 * answer is only passed on (see the section comment). Waits for a renewal in flight. */
static void pjRecordNow(struct proxyJob *j)
{
    j->record_waiting = false;
    if (j->lease_lost) {
        char kd[FP_HEX12_SIZE];
        proxy_key_digest(j, kd);
        log_at(LOG_LEVEL_WARN, j->rid,
               "proxy: the lease was lost during the upstream call; its answer is passed on "
               "but not recorded (key_digest %s, fence %llu)",
               kd, (unsigned long long)j->token);
        j->unrecorded = true;
        proxy_answer_after(j);
        return;
    }
    switch (j->record) {
    case PJ_REC_RELEASE:
        proxy_release(j);
        return;
    case PJ_REC_UNKNOWN:
        j->quarantining = true;
        pjComplete(j, IDEM__COMPLETION__COMPLETION_UNKNOWN, NULL); /* quarantine */
        return;
    case PJ_REC_STORE:
        pjCompleteStored(j);
        return;
    default:
        proxy_answer_after(j);
        return;
    }
}

void proxy_record(struct proxyJob *j, enum pjRecord what)
{
    j->record = what;
    uv_timer_stop(&j->renew_timer);
    if (j->call_in_flight) { /* a renewal: its answer may say the lease is lost */
        j->record_waiting = true;
        return;
    }
    pjRecordNow(j);
}

static void pjRenewDoneCb(void *data, const Idem__Response *resp)
{
    struct proxyJob *j = data;
    const Idem__Result *res = resp->result;
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    j->renew_failed = false;
    if (oc == IDEM__OUTCOME__OUTCOME_LEASE_LOST || oc == IDEM__OUTCOME__OUTCOME_NOT_FOUND) {
        j->lease_lost = true;
        uv_timer_stop(&j->renew_timer);
    } else if (oc == IDEM__OUTCOME__OUTCOME_OK) {
        j->renewed = true;
        j->renew_last_ok = j->renew_sent;
        j->lease_end = j->renew_sent + (res->lease_ms ? res->lease_ms : j->lease_ms);
    } else {
        char kd[FP_HEX12_SIZE];
        proxy_key_digest(j, kd);
        log_at(LOG_LEVEL_WARN, j->rid,
               "proxy: renewing the lease failed, trying again shortly (key_digest %s, "
               "outcome %s)",
               kd, outcomeName(oc));
        j->renew_failed = true;
    }
    if (j->record_waiting) {
        pjRecordNow(j);
    } else if (!j->lease_lost) {
        proxy_renew_next(j);
    }
}

static void pjRenewTickCb(uv_timer_t *t);

void proxy_renew_next(struct proxyJob *j)
{
    uint64_t now = uv_now(j->h->loop);
    uint64_t at;
    renew_plan(now, j->lease_ms, j->lease_end, j->renew_last_ok, j->renew_failed, !j->renewed,
               &at, &j->renew_deadline_ms);
    uv_timer_start(&j->renew_timer, pjRenewTickCb, at - now, 0);
}

/* A renewal, while the upstream call runs (after another call of the job: shortly). */
static void pjRenewTickCb(uv_timer_t *t)
{
    struct proxyJob *j = t->data;
    if (!proxy_upstream_running(j) || j->lease_lost || j->h->stopping) {
        return;
    }
    if (j->call_in_flight) {
        uv_timer_start(&j->renew_timer, pjRenewTickCb, RENEW_MIN_INTERVAL_MS, 0);
        return;
    }
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__RenewRequest rn = IDEM__RENEW_REQUEST__INIT;
    rn.key.data = (uint8_t *)j->key;
    rn.key.len = j->key_len;
    rn.token = j->token;
    rn.lease_ms = j->lease_ms;
    rq.op_case = IDEM__REQUEST__OP_RENEW;
    rq.renew = &rn;
    rq.deadline_ms = j->renew_deadline_ms;
    j->renew_sent = uv_now(j->h->loop);
    proxy_call(j, &rq, pjRenewDoneCb, 0);
}

/* Whether the upstream's header `name` is stored: one the route's response_headers list,
 * and Set-Cookie only with replay_set_cookie (config_proxy.c refuses the list otherwise). */
static bool storedHeaderAllowed(const struct config_proxy_route *r, const char *name)
{
    if (!r->replay_set_cookie && strcmp(name, "set-cookie") == 0) {
        return false;
    }
    for (size_t i = 0; i < r->n_response_headers; i++) {
        if (strcmp(r->response_headers[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* Completes with the upstream's answer: its status, the route's stored headers, and the body;
 * or, when it was too large or could not be stored, its status and body digest alone (its
 * replays answer 502 and use nothing else; the headers may be what could not be stored:
 * more than FSM_HEADERS_MAX of them). */
static void pjCompleteStored(struct proxyJob *j)
{
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__Header *hs = xcalloc(j->n_up_hdrs + 1, sizeof(*hs));
    Idem__Header **hp = xcalloc(j->n_up_hdrs + 1, sizeof(*hp));
    size_t n = 0;
    for (size_t i = 0; i < j->n_up_hdrs && !j->too_large; i++) {
        if (!storedHeaderAllowed(j->route, j->up_hdrs[i].name)) {
            continue;
        }
        idem__header__init(&hs[n]);
        hs[n].name = j->up_hdrs[i].name;
        hs[n].value.data = (uint8_t *)j->up_hdrs[i].value;
        hs[n].value.len = j->up_hdrs[i].value_len;
        hp[n] = &hs[n];
        n++;
    }
    sr.status = (uint32_t)j->up_status;
    sr.n_headers = n;
    sr.headers = hp;
    if (!j->too_large) {
        sr.body.data = j->up_body;
        sr.body.len = j->up_len;
    } else { /* no body, only its digest: a replay answers 502, never a truncated body */
        sr.body_sha256.data = j->sha_out;
        sr.body_sha256.len = sizeof(j->sha_out);
    }
    Idem__Completion oc = j->up_status < 500 && !j->too_large
                              ? IDEM__COMPLETION__COMPLETION_SUCCEEDED
                              : IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    pjComplete(j, oc, &sr); /* sr is borrowed for the call only */
    free(hs);
    free(hp);
}
