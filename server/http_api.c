/* http_api: the JSON API (docs/contract.md): requests to Idem__Requests, and the service's
 * answers back to JSON.
 *
 * A JSON API request: route → body cap (413) → bearer token → tenant (401) → one
 * Idempotency-Key header (400) → body (400 invalid_request, nothing proposed; parsed by
 * http_api_body.c, which knows no h2o) → an Idem__Request in a job, handed to the service,
 * or on a follower that knows the leader straight to the leader's RPC address (forward.c);
 * the leader's service judges the key (400). The job keeps the h2o request and a
 * back-reference allocated in the request's pool (docs/h2o-notes.md §3): if h2o disposes
 * the request first, the reference clears job->req and the answer is only counted. The
 * service's deadline (rpc.default_deadline_ms) and the forward's own deadline guarantee
 * that every job is answered.
 *
 * The data-plane series (reqstats.h) are the gateway's own (transport "http"): a forwarded
 * request is counted here, once, with the leader's answer. */
#include "gateway_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


#include "fingerprint.h"
#include "http_api_body.h"
#include "http_conv.h"
#include "log.h"
#include "xmalloc.h"

struct httpJob {
    struct http_server *h;
    struct gateway_hold hold; /* the request, until answered or disposed */
    enum route route;
    h2o_iovec_t rid;    /* into rid_buf: the job may outlive the request's pool */
    char rid_buf[64];   /* requestId(): at most 64 bytes */
    uint64_t start_ns;
    int key_rc; /* a forwarded request's key by the state machine's rule (jobStart) */
    bool resend_ok; /* forwarded, and may go to a new leader (jobResend) */
    char key_why[112];        /* which rule the key breaks, by this node's tenant (or "") */
    uint32_t mismatch_status; /* the tenant's status for idempotency_key_reused */
    char attempt[2 * HTTP_ATTEMPT_ID_MAX + 3]; /* a claim's Idempotency-Attempt answer header */
    size_t attempt_len;                        /* 0: none */
    char attempt_id[HTTP_ATTEMPT_ID_MAX + 1];  /* a claim's attempt id, for its body */
    LIST_ENTRY(httpJob) link; /* in h->jobs */
};

/* ---- answering ------------------------------------------------------------------------- */

static json_t *jsonBytes(const uint8_t *p, size_t len)
{
    json_t *s = json_stringn((const char *)p, len);
    return s ? s : json_null(); /* not UTF-8: jansson refuses it */
}

/* A token as a JSON integer under `name`, and as a decimal string under `name_str` (`name`
 * and "_str": a client whose numbers lose precision past 2^53 reads that one). */
static void setToken(json_t *o, const char *name, const char *name_str, uint64_t token)
{
    char str[21];
    http_token_str(token, str);
    json_object_set_new(o, name, json_integer((json_int_t)token));
    json_object_set_new(o, name_str, json_string(str));
}

static json_t *storedToJson(const Idem__StoredResponse *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "status", json_integer(r->status));
    json_t *hs = json_object();
    for (size_t i = 0; i < r->n_headers; i++) {
        json_object_set_new(hs, r->headers[i]->name,
                            jsonBytes(r->headers[i]->value.data, r->headers[i]->value.len));
    }
    json_object_set_new(o, "headers", hs);
    json_object_set_new(o, "body", jsonBytes(r->body.data, r->body.len));
    if (r->body_ref != NULL && r->body_ref[0] != '\0') {
        json_object_set_new(o, "body_ref", json_string(r->body_ref));
    }
    if (r->body_sha256.len == 32) {
        char hex[65];
        for (size_t i = 0; i < 32; i++) {
            snprintf(hex + 2 * i, 3, "%02x", r->body_sha256.data[i]);
        }
        json_object_set_new(o, "body_sha256", json_string(hex));
    }
    return o;
}
static void sendReplay(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                       const Idem__StoredResponse *r, const struct hdr *att, size_t n_att)
{
    if (gateway_stored_too_large(r)) {
        /* The proxy's marker of an answer it could not keep: as its own replay says. */
        gateway_send_error_with(
            h, req, route, rid, 502, "upstream_response_too_large",
            "the stored answer was too large to keep; only its digest was recorded", 0, att, n_att);
        return;
    }
    /* The JSON API answers with the stored response itself, from idemd's own origin: only
     * headers that describe that response go out (no Set-Cookie, Refresh, CORS or security
     * policies of another service's), and no browser may guess its type. */
    static const char *const allow[] = {
        "content-type", "content-language", "content-location", "content-disposition",
        "location",     "etag",             "last-modified",    "link",
        "cache-control", "expires",         "retry-after",      "vary",
        NULL};
    struct hdr own[2] = {{"x-content-type-options", "X-Content-Type-Options", "nosniff", 7}};
    if (n_att > 0) {
        own[1] = *att;
    }
    gateway_send_replay(h, req, route, rid, r, allow, NULL, own, 1 + n_att);
}

static const char *stateName(Idem__RecordState s)
{
    switch (s) {
    case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING: return "processing";
    case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED: return "completed";
    case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED: return "quarantined";
    case IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE: return "tombstone";
    case IDEM__RECORD_STATE__RECORD_STATE_RELEASED: return "released";
    default: return "unspecified";
    }
}

static json_t *recordToJson(const Idem__Record *rec)
{
    json_t *o = json_object();
    json_object_set_new(o, "state", json_string(stateName(rec->state)));
    setToken(o, "token", "token_str", rec->token);
    if (rec->fingerprint.len == FP_LEN) {
        char hex[FP_HEX12_SIZE];
        fp_hex12(rec->fingerprint.data, hex);
        json_object_set_new(o, "fingerprint_prefix", json_string(hex));
    }
    json_object_set_new(o, "created_at", json_integer((json_int_t)rec->created_at_ms));
    json_object_set_new(o, "expires_at", json_integer((json_int_t)rec->expires_at_ms));
    json_object_set_new(o, "lease_expires_at", json_integer((json_int_t)rec->lease_deadline_ms));
    if (rec->response.len > 0) {
        Idem__StoredResponse *r =
            idem__stored_response__unpack(NULL, rec->response.len, rec->response.data);
        if (r != NULL) {
            json_object_set_new(o, "response", storedToJson(r));
            idem__stored_response__free_unpacked(r, NULL);
        }
    }
    return o;
}

static json_t *okBody(void)
{
    json_t *o = json_object();
    json_object_set_new(o, "outcome", json_string("ok"));
    return o;
}

/* The acquired answer's members, in the order they are written. */
static json_t *acquiredTemplate(void)
{
    json_t *o = json_object();
    if (o == NULL) {
        return NULL;
    }
    int bad = json_object_set_new(o, "outcome", json_string("acquired"));
    bad |= json_object_set_new(o, "token", json_integer(0));
    bad |= json_object_set_new(o, "token_str", json_string("0"));
    bad |= json_object_set_new(o, "lease_expires_at", json_integer(0));
    bad |= json_object_set_new(o, "expires_at", json_integer(0));
    bad |= json_object_set_new(o, "takeover", json_false());
    bad |= json_object_set_new(o, "previous_token", json_integer(0));
    bad |= json_object_set_new(o, "previous_token_str", json_string("0"));
    if (bad != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* A claim's acquired answer (a new reference): the server's one object with this answer's
 * values set in place, so an answer allocates no JSON values (a claim's answer is the
 * gateway's most frequent). Only the loop thread answers, and each answer is dumped before
 * the next is filled. NULL without memory. */
static json_t *acquiredBody(struct http_server *h, const Idem__Result *res,
                            const struct httpJob *j)
{
    if (h->acquired == NULL && (h->acquired = acquiredTemplate()) == NULL) {
        return NULL;
    }
    json_t *o = h->acquired;
    char tok[21], prev[21];
    http_token_str(res->token, tok);
    http_token_str(res->previous_token, prev);
    int bad = json_integer_set(json_object_get(o, "token"), (json_int_t)res->token);
    bad |= json_string_set(json_object_get(o, "token_str"), tok);
    bad |= json_integer_set(json_object_get(o, "lease_expires_at"),
                            (json_int_t)res->lease_deadline_ms);
    bad |= json_integer_set(json_object_get(o, "expires_at"), (json_int_t)res->expires_at_ms);
    bad |= json_object_set_new(o, "takeover", json_boolean(res->takeover));
    bad |= json_integer_set(json_object_get(o, "previous_token"),
                            (json_int_t)res->previous_token);
    bad |= json_string_set(json_object_get(o, "previous_token_str"), prev);
    if (bad != 0) { /* no memory: the object may hold another answer's values */
        json_decref(o);
        h->acquired = NULL;
        return NULL;
    }
    /* The attempt id goes last; an id that is not UTF-8 is left out (jansson refuses it). */
    json_t *a = json_object_get(o, "attempt_id");
    if (j->attempt_id[0] == '\0' ||
        (a != NULL ? json_string_set(a, j->attempt_id)
                   : json_object_set_new(o, "attempt_id", json_string(j->attempt_id))) != 0) {
        json_object_del(o, "attempt_id");
    }
    return json_incref(o);
}

/* Answers from the service's (or the leader's) Response, docs/contract.md; a claim's answer
 * carries its attempt id in Idempotency-Attempt (j->attempt). */
static void answerResponse(struct http_server *h, h2o_req_t *req, const struct httpJob *j,
                           const Idem__Response *resp)
{
    enum route route = j->route;
    h2o_iovec_t rid = j->rid;
    const Idem__Result *res = resp->result;
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    reqstats_outcome(&h->m.req, (unsigned)oc);
    const char *detail = resp->error && resp->error[0] ? resp->error
                         : res && res->detail && res->detail[0] ? res->detail
                                                                : NULL;
    struct hdr att = {"idempotency-attempt", "Idempotency-Attempt", j->attempt, j->attempt_len};
    size_t n_att = j->attempt_len > 0 ? 1 : 0;
    struct gateway_err e;
    if (gateway_outcome_error(res, &e)) {
        if (oc == IDEM__OUTCOME__OUTCOME_MISMATCH) {
            e.status = (int)j->mismatch_status;
        }
        gateway_send_error_with(h, req, route, rid, e.status, e.code, e.message, e.retry_after_s,
                                &att, n_att);
        return;
    }
    json_t *o;
    switch (oc) {
    case IDEM__OUTCOME__OUTCOME_ACQUIRED:
        gateway_send_json(h, req, route, rid, 200, acquiredBody(h, res, j), &att, n_att);
        return;
    case IDEM__OUTCOME__OUTCOME_REPLAY: {
        Idem__StoredResponse *owned;
        const Idem__StoredResponse *stored = service_stored_response(res, &owned);
        if (stored != NULL) {
            sendReplay(h, req, route, rid, stored, &att, n_att);
        } else {
            gateway_send_error(h, req, route, rid, 500, "internal",
                               "replay without a stored response", 0);
        }
        if (owned != NULL) {
            idem__stored_response__free_unpacked(owned, NULL);
        }
        return;
    }
    case IDEM__OUTCOME__OUTCOME_OK:
        if (route == R_GET) {
            if (res->record == NULL ||
                res->record->state == IDEM__RECORD_STATE__RECORD_STATE_RELEASED) {
                gateway_send_error(h, req, route, rid, 404, "not_found", "no such key", 0);
                return;
            }
            o = okBody();
            json_object_set_new(o, "record", recordToJson(res->record));
        } else {
            o = okBody();
            if (route == R_RENEW) {
                json_object_set_new(o, "lease_expires_at",
                                    json_integer((json_int_t)res->lease_deadline_ms));
            }
        }
        gateway_send_json(h, req, route, rid, 200, o, NULL, 0);
        return;
    case IDEM__OUTCOME__OUTCOME_LEASE_LOST:
        gateway_send_error(h, req, route, rid, 409, "idempotency_lease_lost",
                           "the token is not the current holder's", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_NOT_FOUND:
        gateway_send_error(h, req, route, rid, 404, "not_found", "no such key", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_INVALID:
        if (gateway_key_refusal(detail) != NULL) {
            gateway_send_error_with(h, req, route, rid, 400, detail,
                                    j->key_why[0] ? j->key_why : gateway_key_refusal(detail), 0,
                                    &att, n_att);
        } else {
            gateway_send_error_with(h, req, route, rid, 400, "invalid_request", detail, 0, &att,
                                    n_att);
        }
        return;
    case IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED:
        gateway_send_error(h, req, route, rid, 401, "unauthenticated",
                           "unknown or missing bearer token", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_FORBIDDEN:
        gateway_send_error(h, req, route, rid, 403, "forbidden", "forbidden", 0);
        return;
    default: /* unavailable, not_leader without a leader, anything unexpected */
        /* An unavailable answer's reason (no leader, deadline, the pending budget or the
         * tenant's share of it) is the node's own text; clients branch on the code. */
        gateway_send_error_with(h, req, route, rid, 503, "idempotency_unavailable",
                                oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && detail != NULL
                                    ? detail
                                    : "no quorum or no leader; retry with the same key",
                                1, &att, n_att);
        return;
    }
}
/* ---- jobs ------------------------------------------------------------------------------ */

/* Answers a job (resp, or err when the forward failed) and frees it. */
static void jobFinish(struct httpJob *j, const Idem__Response *resp, const char *err)
{
    struct http_server *h = j->h;
    /* detach first: the send may dispose the request (notes §3) */
    h2o_req_t *req = gateway_hold_take(&j->hold);
    if (j->route == R_CLAIM) {
        reqstats_claim(&h->m.req, (double)(uv_hrtime() - j->start_ns) / 1e9);
    }
    if (resp != NULL) {
        answerResponse(h, req, j, resp);
    } else if (j->key_rc != KEY_OK) {
        /* The leader would have refused the key; without it this node says so itself, as
         * it does when it knows no leader (its service judges the key first), with the
         * attempt id as the service's refusal has it. */
        const char *code = j->key_rc == KEY_MISSING ? "idempotency_key_missing"
                                                    : "idempotency_key_invalid";
        struct hdr att = {"idempotency-attempt", "Idempotency-Attempt", j->attempt, j->attempt_len};
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_INVALID);
        gateway_send_error_with(h, req, j->route, j->rid, 400, code,
                                j->key_why[0] ? j->key_why : gateway_key_refusal(code), 0, &att,
                                j->attempt_len > 0 ? 1 : 0);
    } else {
        (void)err; /* a static reason from forward.c; it carries no key or token */
        struct hdr att = {"idempotency-attempt", "Idempotency-Attempt", j->attempt, j->attempt_len};
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_UNAVAILABLE);
        gateway_send_error_with(h, req, j->route, j->rid, 503, "idempotency_unavailable",
                                "the leader could not be reached; retry with the same key", 1, &att,
                                j->attempt_len > 0 ? 1 : 0);
    }
    LIST_REMOVE(j, link);
    if (h->n_spare_jobs < HTTP_SPARE_JOBS) {
        h->spare_jobs[h->n_spare_jobs++] = j;
    } else {
        free(j);
    }
    gateway_maybe_stopped(h);
}

/* Whether the leader change may send forwarded job j again to the new leader
 * (forwarder_move): while its client still waits, and unless it is a claim that may take a
 * lease over (the repeat of a claim by its own attempt answers `acquired` without the
 * takeover and the previous token the first answer had). Otherwise it fails (503). */
static bool jobResend(void *data)
{
    const struct httpJob *j = data;
    return j->resend_ok && j->hold.req != NULL;
}

static void forwardDoneCb(void *data, const Idem__Response *resp, const char *err)
{
    jobFinish(data, resp, err);
}
static void serviceDoneCb(void *data, const Idem__Response *resp)
{
    jobFinish(data, resp, NULL);
}

/* Starts a job for rq; the answer goes to req unless h2o disposes it. On a follower that
 * knows the leader, rq goes straight to the leader's RPC (packed once, by the forwarder;
 * the leader validates it); otherwise the local service answers it: the leader's decision,
 * or unavailable when no leader is known. (The service answers not_leader only when it
 * knows a leader, which this check already sent to the forwarder; answerResponse would
 * map one to 503.) */
static void jobStart(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                     const Idem__Request *rq, ProtobufCBinaryData key,
                     const struct config_tenant *t)
{
    size_t key_max_len = t->key_max_len;
    struct httpJob *j;
    if (h->n_spare_jobs > 0) {
        j = h->spare_jobs[--h->n_spare_jobs];
        memset(j, 0, sizeof(*j));
    } else {
        j = xcalloc(1, sizeof(*j));
    }
    j->h = h;
    j->route = route;
    j->mismatch_status = t->mismatch_status;
    http_key_why(key.data, key.len, key_max_len, j->key_why, sizeof j->key_why);
    if (rq->op_case == IDEM__REQUEST__OP_CLAIM && rq->claim->attempt_id.len > 0) {
        ProtobufCBinaryData a = rq->claim->attempt_id; /* at most 64 bytes (parseClaim) */
        memcpy(j->attempt_id, a.data, a.len);
        if (!http_item_out((const char *)a.data, a.len, j->attempt, &j->attempt_len)) {
            j->attempt_len = 0;
        }
    }
    j->rid.len = rid.len < sizeof(j->rid_buf) ? rid.len : sizeof(j->rid_buf);
    memcpy(j->rid_buf, rid.base, j->rid.len);
    j->rid.base = j->rid_buf;
    j->start_ns = uv_hrtime();
    gateway_hold(&j->hold, req);
    LIST_INSERT_HEAD(&h->jobs, j, link);
    /* j may be finished (and freed) before either call returns. The lines written meanwhile
     * name the request (log.h). */
    char lrid[sizeof(j->rid_buf) + 1];
    memcpy(lrid, j->rid.base, j->rid.len);
    lrid[j->rid.len] = '\0';
    const char *outer = log_request_enter(lrid);
    const char *leader = gateway_forward_target(h);
    if (leader != NULL) {
        /* Kept for a forward that fails: the leader judges the key (and answers 400), so a
         * bad key is not a 503 only because the leader is out of reach. */
        j->key_rc = key_validate(key.data, key.len, key_max_len);
        j->resend_ok = !(rq->op_case == IDEM__REQUEST__OP_CLAIM &&
                         service_claim_policy(t, rq->claim->policy) ==
                             IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER);
        gateway_forward(h, leader, rq, jobResend, forwardDoneCb, j);
    } else {
        /* As the tenant its bearer token named (apiTenant, in this loop turn: the gateway's
         * and the service's configuration are the same one), not by hashing the token again. */
        service_handle_as(h->svc, t->name, rq, serviceDoneCb, j);
    }
    log_request_leave(outer);
}

/* ---- requests ------------------------------------------------------------------------ */

/* The tenant of req's bearer token (docs/contract.md: the tenant comes from the token only),
 * with the token in *tok; NULL when it answered 401 or 403, counted in idem_requests_total
 * as the RPC counts its own (a client with a wrong token is what those outcomes show). */
static const struct config_tenant *apiTenant(struct http_server *h, h2o_req_t *req,
                                             enum route route, h2o_iovec_t rid, h2o_iovec_t *tok)
{
    if (!gateway_bearer(h, req, route, rid, tok)) {
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED);
        return NULL;
    }
    const struct config_tenant *t =
        tok->len > 0 ? service_tenant_for_token(h->svc, (const uint8_t *)tok->base, tok->len)
                     : NULL;
    if (t != NULL) {
        return t;
    }
    if (tok->len > 0 && service_token_is_admin(h->svc, (const uint8_t *)tok->base, tok->len)) {
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_FORBIDDEN);
        gateway_send_error(h, req, route, rid, 403, "forbidden",
                           "data operations need a tenant's token, not the admin token", 0);
        return NULL;
    }
    reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED);
    gateway_send_error(h, req, route, rid, 401, "unauthenticated",
                       "unknown or missing bearer token", 0);
    return NULL;
}

/* The operation of a JSON API route. */
static Idem__Request__OpCase apiOp(enum route route)
{
    switch (route) {
    case R_CLAIM:
        return IDEM__REQUEST__OP_CLAIM;
    case R_COMPLETE:
        return IDEM__REQUEST__OP_COMPLETE;
    case R_RELEASE:
        return IDEM__REQUEST__OP_RELEASE;
    case R_RENEW:
        return IDEM__REQUEST__OP_RENEW;
    default:
        return IDEM__REQUEST__OP_GET;
    }
}

/* A claim's attempt id (docs/http-api.md): the body's attempt_id, or the Idempotency-Attempt
 * header's (an sf-string decoded, or the bare value), or else a new one (16 hex digits from
 * 8 random bytes, as proxy mode draws them); cl->attempt_id points at it (the header's and a
 * new one are in the request's pool). False when it answered 400 invalid_request: the header
 * sent twice, a bad sf-string, empty, over 64 bytes, or another id than the body's. */
static bool claimAttempt(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid,
                         Idem__ClaimRequest *cl)
{
    h2o_iovec_t a;
    if (!gateway_header_item(h, req, R_CLAIM, rid, "idempotency-attempt", "Idempotency-Attempt",
                             "invalid_request", &a)) {
        return false;
    }
    const char *bad = NULL;
    if (a.base != NULL && a.len == 0) {
        bad = "the Idempotency-Attempt is empty";
    } else if (a.len > HTTP_ATTEMPT_ID_MAX || memchr(a.base ? a.base : "", '\0', a.len)) {
        bad = "the Idempotency-Attempt must be at most 64 bytes, none of them NUL";
    } else if (a.base != NULL && cl->attempt_id.len > 0 &&
               !h2o_memis(a.base, a.len, (const char *)cl->attempt_id.data, cl->attempt_id.len)) {
        bad = "the Idempotency-Attempt header and the body's attempt_id name different attempts";
    }
    if (bad != NULL) {
        gateway_send_error(h, req, R_CLAIM, rid, 400, "invalid_request", bad, 0);
        return false;
    }
    if (cl->attempt_id.len > 0) {
        return true;
    }
    if (a.base != NULL) {
        cl->attempt_id.data = (uint8_t *)a.base;
        cl->attempt_id.len = a.len;
        return true;
    }
    uint8_t rnd[8];
    char *hex = h2o_mem_alloc_pool(&req->pool, 2 * sizeof rnd + 1);
    if (!gateway_random(h, rnd, sizeof rnd)) {
        gateway_send_error(h, req, R_CLAIM, rid, 500, "internal", "no randomness for an attempt id",
                           0);
        return false;
    }
    gateway_hex(rnd, sizeof rnd, hex);
    cl->attempt_id.data = (uint8_t *)hex;
    cl->attempt_id.len = 2 * sizeof rnd;
    return true;
}

/* The JSON API routes, after method and body-size checks. */
void http_api_handle(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                     h2o_iovec_t pathKey)
{
    h2o_iovec_t tok;
    const struct config_tenant *t = apiTenant(h, req, route, rid, &tok);
    if (t == NULL) {
        return;
    }
    h2o_iovec_t key;
    if (!gateway_header_key(h, req, route, rid, &key)) {
        return;
    }
    if (pathKey.base != NULL) { /* the key in the path; a header beside it must name it too */
        if (key.base != NULL && !h2o_memis(key.base, key.len, pathKey.base, pathKey.len)) {
            gateway_send_error(h, req, route, rid, 400, "idempotency_key_invalid",
                               "the Idempotency-Key header and the path name different keys", 0);
            return;
        }
        key = pathKey;
    }
    Idem__Request rq = IDEM__REQUEST__INIT;
    struct http_api_body body;
    ProtobufCBinaryData kb = {key.len, (uint8_t *)key.base};
    rq.auth_token.data = (uint8_t *)tok.base;
    rq.auth_token.len = tok.len;
    rq.deadline_ms = h->cfg->rpc.default_deadline_ms;
    const char *bad = NULL;
    if (!http_api_parse_body(apiOp(route), req->entity.base, req->entity.len, t, kb, &rq, &body,
                             &bad)) {
        gateway_send_error(h, req, route, rid, 400, "invalid_request", bad, 0);
    } else if (route != R_CLAIM || claimAttempt(h, req, rid, &body.cl)) {
        jobStart(h, req, route, rid, &rq, kb, t);
    }
    http_api_body_free(&body);
}
