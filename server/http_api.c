/* http_api: the JSON API (docs/contract.md): requests to Idem__Requests, and the service's
 * answers back to JSON.
 *
 * A JSON API request: route → body cap (413) → bearer token → tenant (401) → one
 * Idempotency-Key header (400) → body (400 invalid_request, nothing proposed) → an
 * Idem__Request in a job, handed to the service, or on a follower that knows the leader
 * straight to the leader's RPC address (forward.c); the leader's service judges the key
 * (400). The job keeps the h2o request and a back-reference allocated in the request's
 * pool (docs/h2o-notes.md §3): if h2o disposes the request first, the reference clears
 * job->req and the answer is only counted. The service's deadline
 * (rpc.default_deadline_ms) and the forward's own deadline guarantee that every job is
 * answered.
 *
 * The data-plane series (reqstats.h) are the gateway's own (transport "http"): a forwarded
 * request is counted here, once, with the leader's answer. */
#include "gateway_internal.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fingerprint.h"
#include "xmalloc.h"

#define HTTP_ATTEMPT_ID_MAX 64

struct httpJob {
    struct http_server *h;
    struct gateway_hold hold; /* the request, until answered or disposed */
    enum route route;
    h2o_iovec_t rid;    /* into rid_buf: the job may outlive the request's pool */
    char rid_buf[64];   /* requestId(): at most 64 bytes */
    uint64_t start_ns;
    int key_rc; /* a forwarded request's key by the state machine's rule (jobStart) */
    LIST_ENTRY(httpJob) link; /* in h->jobs */
};

/* ---- answering ------------------------------------------------------------------------- */

static json_t *jsonBytes(const uint8_t *p, size_t len)
{
    json_t *s = json_stringn((const char *)p, len);
    return s ? s : json_null(); /* not UTF-8: jansson refuses it */
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
static void sendReplay(struct http_server *h, h2o_req_t *req, enum route route,
                       h2o_iovec_t rid, const Idem__StoredResponse *r)
{
    if (gateway_stored_too_large(r)) {
        /* The proxy's marker of an answer it could not keep: as its own replay says. */
        gateway_send_error(h, req, route, rid, 502, "upstream_response_too_large",
                           "the stored answer was too large to keep; only its digest was recorded",
                           0);
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
    static const struct hdr nosniff = {"x-content-type-options", "X-Content-Type-Options",
                                       "nosniff", 7};
    gateway_send_replay(h, req, route, rid, r, allow, NULL, &nosniff, 1);
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
    json_object_set_new(o, "token", json_integer((json_int_t)rec->token));
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

/* Answers from the service's (or the leader's) Response, docs/contract.md. */
static void answerResponse(struct http_server *h, h2o_req_t *req, enum route route,
                           h2o_iovec_t rid, const Idem__Response *resp)
{
    const Idem__Result *res = resp->result;
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    reqstats_outcome(&h->m.req, (unsigned)oc);
    const char *detail = resp->error && resp->error[0] ? resp->error
                         : res && res->detail && res->detail[0] ? res->detail
                                                                : NULL;
    struct gateway_err e;
    if (gateway_outcome_error(res, &e)) {
        gateway_send_error(h, req, route, rid, e.status, e.code, e.message, e.retry_after_s);
        return;
    }
    json_t *o;
    switch (oc) {
    case IDEM__OUTCOME__OUTCOME_ACQUIRED:
        o = json_object();
        json_object_set_new(o, "outcome", json_string("acquired"));
        json_object_set_new(o, "token", json_integer((json_int_t)res->token));
        json_object_set_new(o, "lease_expires_at", json_integer((json_int_t)res->lease_deadline_ms));
        json_object_set_new(o, "expires_at", json_integer((json_int_t)res->expires_at_ms));
        json_object_set_new(o, "takeover", json_boolean(res->takeover));
        json_object_set_new(o, "previous_token", json_integer((json_int_t)res->previous_token));
        gateway_send_json(h, req, route, rid, 200, o, NULL, 0);
        return;
    case IDEM__OUTCOME__OUTCOME_REPLAY: {
        Idem__StoredResponse *owned;
        const Idem__StoredResponse *stored = service_stored_response(res, &owned);
        if (stored != NULL) {
            sendReplay(h, req, route, rid, stored);
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
            gateway_send_error(h, req, route, rid, 400, detail, gateway_key_refusal(detail), 0);
        } else {
            gateway_send_error(h, req, route, rid, 400, "invalid_request", detail, 0);
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
        gateway_send_error(h, req, route, rid, 503, "idempotency_unavailable",
                           oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && detail != NULL
                               ? detail
                               : "no quorum or no leader; retry with the same key",
                           1);
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
        answerResponse(h, req, j->route, j->rid, resp);
    } else if (j->key_rc != KEY_OK) {
        /* The leader would have refused the key; without it this node says so itself, as
         * it does when it knows no leader (its service judges the key first). */
        const char *code = j->key_rc == KEY_MISSING ? "idempotency_key_missing"
                                                    : "idempotency_key_invalid";
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_INVALID);
        gateway_send_error(h, req, j->route, j->rid, 400, code, gateway_key_refusal(code), 0);
    } else {
        (void)err; /* a static reason from forward.c; it carries no key or token */
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_UNAVAILABLE);
        gateway_send_error(h, req, j->route, j->rid, 503, "idempotency_unavailable",
                           "the leader could not be reached; retry with the same key", 1);
    }
    LIST_REMOVE(j, link);
    free(j);
    gateway_maybe_stopped(h);
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
                     const Idem__Request *rq, ProtobufCBinaryData key, size_t key_max_len)
{
    struct httpJob *j = xcalloc(1, sizeof(*j));
    j->h = h;
    j->route = route;
    j->rid.len = rid.len < sizeof(j->rid_buf) ? rid.len : sizeof(j->rid_buf);
    memcpy(j->rid_buf, rid.base, j->rid.len);
    j->rid.base = j->rid_buf;
    j->start_ns = uv_hrtime();
    gateway_hold(&j->hold, req);
    LIST_INSERT_HEAD(&h->jobs, j, link);
    /* j may be finished (and freed) before either call returns. */
    const char *leader = gateway_forward_target(h);
    if (leader != NULL) {
        /* Kept for a forward that fails: the leader judges the key (and answers 400), so a
         * bad key is not a 503 only because the leader is out of reach. */
        j->key_rc = key_validate(key.data, key.len, key_max_len);
        gateway_forward(h, leader, rq, forwardDoneCb, j);
    } else {
        service_handle(h->svc, rq, serviceDoneCb, j);
    }
}

/* ---- request parsing ------------------------------------------------------------------- */

static bool hexVal(char c, uint8_t *v)
{
    if (c >= '0' && c <= '9') {
        *v = (uint8_t)(c - '0');
    } else if (c >= 'a' && c <= 'f') {
        *v = (uint8_t)(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
        *v = (uint8_t)(c - 'A' + 10);
    } else {
        return false;
    }
    return true;
}

/* An optional non-negative integer field. False when present with the wrong type. */
static bool getU64(json_t *o, const char *name, uint64_t *out, bool *present)
{
    json_t *v = json_object_get(o, name);
    if (present) {
        *present = v != NULL;
    }
    if (v == NULL) {
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return false;
    }
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* An optional string field without NUL bytes. False when present with the wrong type. */
static bool getStr(json_t *o, const char *name, const char **out)
{
    json_t *v = json_object_get(o, name);
    *out = NULL;
    if (v == NULL) {
        return true;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* What a handler built for the service; freed after service_handle returned. */
struct scratch {
    json_t *body;
    char *canon; /* canonical JSON of a request body */
    Idem__Header *hdrs;
    Idem__Header **hdrp;
    char *names; /* lower-cased header names, NUL-separated */
    uint8_t sha[32]; /* a stored response's body_sha256 */
};

static void scratchFree(struct scratch *s)
{
    json_decref(s->body);
    free(s->canon);
    free(s->hdrs);
    free(s->hdrp);
    free(s->names);
}

/* Fills a StoredResponse from {"status", "headers", "body"} or, for a body kept elsewhere,
 * {"status", "headers", "body_ref", "body_sha256" (64 hex digits)}, as the RPC takes them
 * (the service checks the combination: fsm_response_valid). False on a wrong shape or a
 * field it does not know (a misspelt one stored a response without it). */
static bool parseStored(json_t *o, Idem__StoredResponse *r, struct scratch *sc)
{
    if (!json_is_object(o)) {
        return false;
    }
    static const char *const known[] = {"status", "headers", "body", "body_ref", "body_sha256"};
    const char *field;
    json_t *fval;
    json_object_foreach(o, field, fval)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]) && !ok; i++) {
            ok = strcmp(field, known[i]) == 0;
        }
        if (!ok) {
            return false;
        }
    }
    const char *ref = NULL, *sha = NULL;
    if (!getStr(o, "body_ref", &ref) || !getStr(o, "body_sha256", &sha)) {
        return false;
    }
    if (ref != NULL) {
        r->body_ref = (char *)ref;
    }
    if (sha != NULL) {
        if (strlen(sha) != 64) {
            return false;
        }
        for (size_t i = 0; i < 32; i++) {
            int hi = OPENSSL_hexchar2int((unsigned char)sha[2 * i]);
            int lo = OPENSSL_hexchar2int((unsigned char)sha[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                return false;
            }
            sc->sha[i] = (uint8_t)(hi << 4 | lo);
        }
        r->body_sha256.data = sc->sha;
        r->body_sha256.len = 32;
    }
    uint64_t status = 0;
    bool has_status = false;
    if (!getU64(o, "status", &status, &has_status) || !has_status || status < 200 || status > 599) {
        return false;
    }
    r->status = (uint32_t)status;
    json_t *hs = json_object_get(o, "headers");
    if (hs != NULL && !json_is_null(hs)) {
        if (!json_is_object(hs)) {
            return false;
        }
        size_t n = json_object_size(hs), total = 0;
        const char *k;
        json_t *v;
        json_object_foreach(hs, k, v) {
            if (!json_is_string(v) || !fsm_header_name_ok(k) ||
                !fsm_header_value_ok((const uint8_t *)json_string_value(v),
                                     json_string_length(v))) {
                return false;
            }
            total += strlen(k) + 1;
        }
        sc->hdrs = xcalloc(n ? n : 1, sizeof(*sc->hdrs));
        sc->hdrp = xcalloc(n ? n : 1, sizeof(*sc->hdrp));
        sc->names = xmalloc(total ? total : 1);
        size_t i = 0, off = 0;
        json_object_foreach(hs, k, v) {
            char *name = sc->names + off;
            size_t kl = strlen(k);
            for (size_t c = 0; c <= kl; c++) {
                name[c] = (char)((k[c] >= 'A' && k[c] <= 'Z') ? k[c] - 'A' + 'a' : k[c]);
            }
            off += kl + 1;
            idem__header__init(&sc->hdrs[i]);
            sc->hdrs[i].name = name;
            sc->hdrs[i].value.data = (uint8_t *)json_string_value(v);
            sc->hdrs[i].value.len = json_string_length(v);
            sc->hdrp[i] = &sc->hdrs[i];
            i++;
        }
        r->n_headers = n;
        r->headers = sc->hdrp;
    }
    json_t *b = json_object_get(o, "body");
    if (b != NULL && !json_is_null(b)) {
        if (!json_is_string(b)) {
            return false;
        }
        r->body.data = (uint8_t *)json_string_value(b);
        r->body.len = json_string_length(b);
    }
    return true;
}

/* Parses the request body as a JSON object into sc->body. */
static bool parseBody(h2o_req_t *req, struct scratch *sc)
{
    if (req->entity.base == NULL || req->entity.len == 0) {
        return false;
    }
    json_error_t e;
    sc->body = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &e);
    return sc->body != NULL && json_is_object(sc->body);
}

/* The claim body: fingerprint or request, and the optional fields. 0, or a message. */
static const char *parseClaim(json_t *b, const struct config_tenant *t, Idem__ClaimRequest *cl,
                              uint8_t fp[FP_LEN], struct scratch *sc)
{
    const char *fph = NULL;
    if (!getStr(b, "fingerprint", &fph)) {
        return "fingerprint must be a string";
    }
    json_t *rq = json_object_get(b, "request");
    if ((fph == NULL) == (rq == NULL)) {
        return "exactly one of fingerprint and request is required";
    }
    if (fph != NULL) {
        if (strlen(fph) != 2 * FP_LEN) {
            return "fingerprint must be 64 hex digits";
        }
        for (size_t i = 0; i < FP_LEN; i++) {
            uint8_t hi, lo;
            if (!hexVal(fph[2 * i], &hi) || !hexVal(fph[2 * i + 1], &lo)) {
                return "fingerprint must be 64 hex digits";
            }
            fp[i] = (uint8_t)(hi << 4 | lo);
        }
    } else {
        const char *method = NULL, *path = NULL;
        if (!json_is_object(rq) || !getStr(rq, "method", &method) || !getStr(rq, "path", &path) ||
            method == NULL || path == NULL || method[0] == '\0' || path[0] == '\0') {
            return "request must be an object with method and path strings";
        }
        struct fp_input in = {.method = method, .path = path, .tenant = t->name};
        json_t *body = json_object_get(rq, "body");
        if (body != NULL && json_is_string(body)) {
            in.content_type = "text/plain";
            in.body = (const uint8_t *)json_string_value(body);
            in.body_len = json_string_length(body);
        } else if (body != NULL) {
            sc->canon = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
            if (sc->canon == NULL) {
                return "request body cannot be encoded";
            }
            in.content_type = "application/json";
            in.body = (const uint8_t *)sc->canon;
            in.body_len = strlen(sc->canon);
        }
        if (fp_compute(&in, fp) != FP_OK) {
            return "cannot compute the fingerprint";
        }
    }
    cl->fingerprint.data = fp;
    cl->fingerprint.len = FP_LEN;
    const char *attempt = NULL, *policy = NULL;
    if (!getU64(b, "lease_ms", &cl->lease_ms, NULL) || !getU64(b, "ttl_ms", &cl->ttl_ms, NULL)) {
        return "lease_ms and ttl_ms must be non-negative integers";
    }
    if (!getStr(b, "attempt_id", &attempt) ||
        (attempt != NULL && strlen(attempt) > HTTP_ATTEMPT_ID_MAX)) {
        return "attempt_id must be a string of at most 64 bytes";
    }
    if (attempt != NULL) {
        cl->attempt_id.data = (uint8_t *)attempt;
        cl->attempt_id.len = strlen(attempt);
    }
    if (!getStr(b, "policy", &policy)) {
        return "policy must be \"conflict\" or \"takeover\"";
    }
    if (policy != NULL) {
        if (strcmp(policy, "conflict") == 0) {
            cl->policy = IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
        } else if (strcmp(policy, "takeover") == 0) {
            cl->policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER;
        } else {
            return "policy must be \"conflict\" or \"takeover\"";
        }
    }
    return NULL;
}

/* The token field, required. */
static bool getToken(json_t *b, uint64_t *token)
{
    bool present = false;
    return getU64(b, "token", token, &present) && present;
}

/* The tenant of req's bearer token (docs/contract.md: the tenant comes from the token only),
 * with the token in *tok; NULL when it answered 401 or 403. */
static const struct config_tenant *apiTenant(struct http_server *h, h2o_req_t *req,
                                             enum route route, h2o_iovec_t rid, h2o_iovec_t *tok)
{
    if (!gateway_bearer(h, req, route, rid, tok)) {
        return NULL;
    }
    const struct config_tenant *t =
        tok->len > 0 ? service_tenant_for_token(h->svc, (const uint8_t *)tok->base, tok->len)
                     : NULL;
    if (t != NULL) {
        return t;
    }
    if (tok->len > 0 && service_token_is_admin(h->svc, (const uint8_t *)tok->base, tok->len)) {
        gateway_send_error(h, req, route, rid, 403, "forbidden",
                           "data operations need a tenant's token, not the admin token", 0);
        return NULL;
    }
    gateway_send_error(h, req, route, rid, 401, "unauthenticated",
                       "unknown or missing bearer token", 0);
    return NULL;
}

/* The complete body: token, outcome and the optional response. NULL, or a message. */
static const char *parseComplete(json_t *b, Idem__CompleteRequest *co, Idem__StoredResponse *sr,
                                 struct scratch *sc)
{
    const char *oc = NULL;
    json_t *r = json_object_get(b, "response");
    if (!getToken(b, &co->token)) {
        return "token must be a non-negative integer";
    } else if (!getStr(b, "outcome", &oc)) {
        return "outcome must be a string";
    } else if (oc == NULL || strcmp(oc, "succeeded") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    } else if (strcmp(oc, "failed_final") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    } else if (strcmp(oc, "unknown") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_UNKNOWN;
    } else {
        return "outcome must be succeeded, failed_final or unknown";
    }
    if (r != NULL && !json_is_null(r)) {
        if (!parseStored(r, sr, sc)) {
            return "response must be {status, headers, body} or {status, headers, "
                   "body_ref, body_sha256 (64 hex digits)}";
        }
        co->response = sr;
    }
    return NULL;
}

/* The operations a JSON API request may carry; the one of its route goes into the
 * Idem__Request, borrowing from here until service_handle returned. */
struct apiOps {
    Idem__ClaimRequest cl;
    Idem__CompleteRequest co;
    Idem__StoredResponse sr;
    Idem__ReleaseRequest re;
    Idem__RenewRequest rn;
    Idem__GetRequest ge;
    uint8_t fp[FP_LEN];
};

/* Fills rq with the route's operation on key kb from the parsed body sc->body (none for a
 * get). NULL, or what is wrong with the body. */
static const char *apiBuild(enum route route, const struct config_tenant *t,
                            ProtobufCBinaryData kb, struct scratch *sc, struct apiOps *ops,
                            Idem__Request *rq)
{
    const char *bad = NULL;
    switch (route) {
    case R_CLAIM:
        bad = parseClaim(sc->body, t, &ops->cl, ops->fp, sc);
        ops->cl.key = kb;
        rq->op_case = IDEM__REQUEST__OP_CLAIM;
        rq->claim = &ops->cl;
        break;
    case R_COMPLETE:
        bad = parseComplete(sc->body, &ops->co, &ops->sr, sc);
        ops->co.key = kb;
        rq->op_case = IDEM__REQUEST__OP_COMPLETE;
        rq->complete = &ops->co;
        break;
    case R_RELEASE:
        if (!getToken(sc->body, &ops->re.token)) {
            bad = "token must be a non-negative integer";
        }
        ops->re.key = kb;
        rq->op_case = IDEM__REQUEST__OP_RELEASE;
        rq->release = &ops->re;
        break;
    case R_RENEW:
        if (!getToken(sc->body, &ops->rn.token)) {
            bad = "token must be a non-negative integer";
        } else if (!getU64(sc->body, "lease_ms", &ops->rn.lease_ms, NULL)) {
            bad = "lease_ms must be a non-negative integer";
        }
        ops->rn.key = kb;
        rq->op_case = IDEM__REQUEST__OP_RENEW;
        rq->renew = &ops->rn;
        break;
    default: /* R_GET */
        ops->ge.key = kb;
        rq->op_case = IDEM__REQUEST__OP_GET;
        rq->get = &ops->ge;
        break;
    }
    return bad;
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
    struct apiOps ops = {IDEM__CLAIM_REQUEST__INIT,   IDEM__COMPLETE_REQUEST__INIT,
                         IDEM__STORED_RESPONSE__INIT, IDEM__RELEASE_REQUEST__INIT,
                         IDEM__RENEW_REQUEST__INIT,   IDEM__GET_REQUEST__INIT,
                         {0}};
    struct scratch sc = {0};
    ProtobufCBinaryData kb = {key.len, (uint8_t *)key.base};
    rq.auth_token.data = (uint8_t *)tok.base;
    rq.auth_token.len = tok.len;
    rq.deadline_ms = h->cfg->rpc.default_deadline_ms;
    const char *bad = NULL;
    if (route != R_GET && !parseBody(req, &sc)) {
        bad = "the body must be a JSON object";
    } else {
        bad = apiBuild(route, t, kb, &sc, &ops, &rq);
    }
    if (bad != NULL) {
        gateway_send_error(h, req, route, rid, 400, "invalid_request", bad, 0);
    } else {
        jobStart(h, req, route, rid, &rq, kb, t->key_max_len);
    }
    scratchFree(&sc);
}
