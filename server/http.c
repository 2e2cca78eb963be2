/* http: routes, JSON translation, asynchronous answers, metrics and shutdown (see http.h).
 *
 * A JSON API request: route → body cap (413) → bearer token → tenant (401) → key (400) →
 * body (400 invalid_request, nothing proposed) → an Idem__Request handed to service_handle()
 * in a job. The job keeps the h2o request and a back-reference allocated in the request's
 * pool (docs/h2o-notes.md §3): if h2o disposes the request first, the reference clears
 * job->req and the answer is only counted. A follower's service answers not_leader; the job
 * then forwards the same request once to the leader's RPC address (forward.c) and answers
 * from the leader's response. The service's deadline (rpc.default_deadline_ms) and the
 * forward's own deadline guarantee that every job is answered.
 *
 * Status mapping: docs/contract.md. Nothing here logs a key or a token; metric labels are a
 * fixed route name, a status number, an outcome name and a transport name. The data-plane
 * series (reqstats.h) are the gateway's own (transport "http": a forwarded request counted
 * here, once, with the leader's answer) and the RPC listener's (rpc_get_stats()). */
#include "http.h"

#include <h2o.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "fingerprint.h"
#include "forward.h"
#include "log.h"
#include "rpc.h"
#include "tls.h"
#include "xmalloc.h"

#define HTTP_BODY_MAX (1u << 20)          /* our own 413 above this (docs/contract.md) */
#define HTTP_H2O_ENTITY_MAX (2u << 20)    /* h2o's own cap, so that our handler sees 1 MiB + 1 */
#define HTTP_STOP_POLL_MS 20
#define HTTP_STOP_GRACE_MS 3000           /* after this, busy connections are closed too */
#define HTTP_ATTEMPT_ID_MAX 64
/* Idle keep-alive connections to an upstream are closed after this; it must stay below the
 * upstreams' own idle timeouts (nginx 75 s, gunicorn 2 s), so that a pooled connection is
 * rarely closed by the upstream just as a request goes out on it. */
#define HTTP_POOL_IDLE_MS 1000

enum route {
    R_HEALTHZ,
    R_READYZ,
    R_METRICS,
    R_CLAIM,
    R_COMPLETE,
    R_RELEASE,
    R_RENEW,
    R_GET,
    R_PROXY,
    R_OTHER,
    R_N
};

static const char *const routeNames[R_N] = {"healthz", "readyz", "metrics", "claim", "complete",
                                            "release", "renew",  "get",     "proxy", "other"};

static const char *const outcomeNames[REQSTATS_OUTCOMES] = {
    "unspecified",     "acquired",        "replay",  "in_progress", "mismatch",
    "lease_expired",   "outcome_unknown", "expired", "ok",          "lease_lost",
    "not_found",       "quota_exceeded",  "invalid", "unavailable", "not_leader",
    "unauthenticated", "forbidden"};
_Static_assert(IDEM__OUTCOME__OUTCOME_FORBIDDEN == REQSTATS_OUTCOMES - 1,
               "outcomeNames and reqstats.h must name every Idem__Outcome");

struct httpMetrics {
    uint64_t http[R_N][600]; /* by route and status */
    /* The gateway's data-plane figures (transport "http"): answers to JSON API and proxy
     * requests by service outcome (a forwarded one by the leader's), every 503 (fail_closed),
     * JSON API claims' durations (forwarding included). */
    struct reqstats req;
    uint64_t connections;         /* open connections of the gateway and proxy listeners */
    uint64_t connections_refused; /* closed at once: http.max_connections were open */
};

struct httpJob;
struct proxyJob;
struct http_server;

/* Keep-alive connections to one upstream (host, port), shared by the routes that name it. */
struct upstreamPool {
    const char *host; /* borrows the config */
    uint16_t port;
    h2o_socketpool_t pool;
};

/* A proxy listener (cfg->proxies[i]). */
struct proxyListener {
    uv_tcp_t tcp;
    const struct config_proxy *cfg;
    struct sockaddr_in sa;
};

struct http_server {
    uv_loop_t *loop;
    const struct config *cfg;
    struct service *svc;
    struct forwarder *fwd;
    h2o_globalconf_t conf;
    h2o_context_t ctx; /* must not move: embeds uv handles */
    h2o_accept_ctx_t accept_ctx;
    uv_tcp_t listener;          /* node.http_address; bound when has_listener */
    bool has_listener;
    struct proxyListener *plisteners; /* cfg->n_proxies */
    size_t n_plisteners;
    int open_listeners;         /* listeners not yet closed */
    h2o_timeout_t io_timeout;   /* http1client's per-phase timeout (proxy mode) */
    h2o_http1client_ctx_t client_ctx;
    struct upstreamPool *pools; /* one per distinct upstream of the proxy routes */
    size_t n_pools;
    struct proxyJob *pjobs;
    uint64_t secret_warned_ms; /* last warning about a refused cluster secret */
    uv_timer_t stop_timer;
    bool ctx_ready;
    bool stopping;
    bool fwd_closed;
    uint64_t stop_started_ms;
    void (*stop_cb)(void *data);
    void *stop_data;
    struct httpJob *jobs;
    struct httpMetrics m;
};

struct httpHandler {
    h2o_handler_t super;
    struct http_server *h;
};

/* Lives in the request's pool; cleared by whichever side goes first (notes §3). */
struct jobRef {
    struct httpJob *job;
};

struct httpJob {
    struct http_server *h;
    h2o_req_t *req;     /* NULL once h2o disposed the request, or once answered */
    struct jobRef *ref; /* in req->pool; NULL with req */
    enum route route;
    h2o_iovec_t rid;    /* into rid_buf: the job may outlive the request's pool */
    char rid_buf[64];   /* requestId(): at most 64 bytes */
    uint64_t start_ns;
    uint8_t *packed;    /* the packed Idem__Request, for forwarding; owned */
    size_t packed_len;
    bool forwarded;
    struct httpJob *prev, *next;
};

/* An extra response header; name and value are copied into the request's pool. */
struct hdr {
    const char *name; /* lower case */
    const char *orig; /* case printed on HTTP/1, or NULL */
    const char *value;
    size_t value_len;
};

/* ---- answering ------------------------------------------------------------------------- */

static const char *reasonOf(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default:
        return status < 300   ? "OK"
               : status < 400 ? "Redirection"
               : status < 500 ? "Client Error"
                              : "Server Error";
    }
}

/* Sends one complete answer and counts it, with Content-Length: content_length (for a
 * HEAD request, which h2o answers without the body, the length a GET would have). req may
 * be NULL (the client is gone): then the answer is only counted. */
static void sendRawAs(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                      int status, const char *ctype, const char *body, size_t len,
                      size_t content_length, const struct hdr *extra, size_t n_extra)
{
    if (status >= 100 && status < 600) {
        h->m.http[route][status]++;
    }
    if (req == NULL) {
        return;
    }
    req->res.status = status;
    req->res.reason = reasonOf(status);
    req->res.content_length = content_length;
    if (ctype != NULL) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, "Content-Type", ctype,
                       strlen(ctype));
    }
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0,
                          "X-Request-Id", rid.base, rid.len);
    for (size_t i = 0; i < n_extra; i++) {
        h2o_iovec_t n = h2o_strdup(&req->pool, extra[i].name, strlen(extra[i].name));
        h2o_iovec_t v = h2o_strdup(&req->pool, extra[i].value, extra[i].value_len);
        h2o_add_header_by_str(&req->pool, &req->res.headers, n.base, n.len, 1, extra[i].orig,
                              v.base, v.len);
    }
    h2o_send_inline(req, body, len);
}

/* Sends one complete answer and counts it (sendRawAs, Content-Length the body's). */
static void sendRaw(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                    int status, const char *ctype, const char *body, size_t len,
                    const struct hdr *extra, size_t n_extra)
{
    sendRawAs(h, req, route, rid, status, ctype, body, len, len, extra, n_extra);
}

/* Sends a JSON body (stolen) with the given status. */
static void sendJson(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                     int status, json_t *body, const struct hdr *extra, size_t n_extra)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (s == NULL) {
        static const char oom[] = "{\"code\":\"internal\",\"message\":\"out of memory\"}";
        sendRaw(h, req, route, rid, 500, "application/json", oom, sizeof(oom) - 1, NULL, 0);
        return;
    }
    sendRaw(h, req, route, rid, status, "application/json", s, strlen(s), extra, n_extra);
    free(s);
}

/* Sends the error body of docs/contract.md; retry_after_s > 0 adds Retry-After. */
static void sendError(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                      int status, const char *code, const char *message, uint64_t retry_after_s)
{
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    json_t *msg = json_string(message ? message : code);
    json_object_set_new(o, "message", msg ? msg : json_string(code));
    json_object_set_new(o, "request_id", json_stringn(rid.base, rid.len));
    char ra[24];
    struct hdr extra[2] = {{0}};
    size_t n = 0;
    if (retry_after_s > 0) {
        snprintf(ra, sizeof(ra), "%llu", (unsigned long long)retry_after_s);
        extra[n++] = (struct hdr){"retry-after", "Retry-After", ra, strlen(ra)};
    }
    if (status == 405) {
        const char *allow = (route == R_CLAIM || route == R_COMPLETE || route == R_RELEASE ||
                             route == R_RENEW)
                                ? "POST"
                                : "GET";
        extra[n++] = (struct hdr){"allow", "Allow", allow, strlen(allow)};
    }
    if (status == 503) {
        h->m.req.fail_closed++;
    }
    sendJson(h, req, route, rid, status, o, extra, n);
}

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

/* Header names a replay never copies from the stored response: hop-by-hop, framing, and
 * the ones the gateway sets itself. */
static bool replaySkips(const char *name)
{
    static const char *const skip[] = {"content-length", "transfer-encoding", "connection",
                                       "keep-alive",     "upgrade",           "te",
                                       "trailer",        "date",              "server",
                                       "x-request-id",   "idempotency-replayed"};
    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
        if (strcasecmp(name, skip[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* A stored response as it is replayed: its status (a stored one outside 200-599, which
 * fsm_response_check now refuses but an older version stored, replays as 200), whether a
 * body may go with it (not with 204 or 304), and whether a stored header may go out (a
 * name that is not a token or a value with CR, LF or NUL, stored before those were
 * refused, would inject headers: dropped). */
static int replayStatus(const Idem__StoredResponse *r)
{
    return r->status >= 200 && r->status < 600 ? (int)r->status : 200;
}

static bool replayBody(int status)
{
    return status != 204 && status != 304;
}

static bool replayHeaderOk(const Idem__Header *hd)
{
    return fsm_header_name_ok(hd->name) && fsm_header_value_ok(hd->value.data, hd->value.len) &&
           !replaySkips(hd->name);
}

/* Lower-case hex of n bytes into out (room for 2n + 1). */
static void toHex(const uint8_t *p, size_t n, char *out)
{
    for (size_t k = 0; k < n; k++) {
        snprintf(out + 2 * k, 3, "%02x", p[k]);
    }
}

static bool storedTooLarge(const Idem__StoredResponse *r);

/* A body stored by reference (body_ref, with its SHA-256) is not fetched: the replay has no
 * body and says where it is, in Idempotency-Body-Ref and Idempotency-Body-SHA256 (hex).
 * Appends those headers to extra[n..] (room for two; hex: 65 bytes); returns the new n. */
static size_t replayBodyRef(const Idem__StoredResponse *r, struct hdr *extra, size_t n, char *hex)
{
    if (r->body_ref == NULL || r->body_ref[0] == '\0' ||
        !fsm_header_value_ok((const uint8_t *)r->body_ref, strlen(r->body_ref))) {
        return n;
    }
    extra[n++] = (struct hdr){"idempotency-body-ref", "Idempotency-Body-Ref", r->body_ref,
                              strlen(r->body_ref)};
    if (r->body_sha256.len == 32) {
        toHex(r->body_sha256.data, 32, hex);
        extra[n++] = (struct hdr){"idempotency-body-sha256", "Idempotency-Body-SHA256", hex, 64};
    }
    return n;
}

static void sendReplay(struct http_server *h, h2o_req_t *req, enum route route,
                       h2o_iovec_t rid, const Idem__StoredResponse *r)
{
    if (storedTooLarge(r)) {
        /* The proxy's marker of an answer it could not keep: as its own replay says. */
        sendError(h, req, route, rid, 502, "upstream_response_too_large",
                  "the stored answer was too large to keep; only its digest was recorded", 0);
        return;
    }
    int status = replayStatus(r);
    size_t n = 0;
    char hex[65];
    struct hdr *extra = xcalloc(r->n_headers + 3, sizeof(*extra));
    for (size_t i = 0; i < r->n_headers; i++) {
        const Idem__Header *hd = r->headers[i];
        if (!replayHeaderOk(hd)) {
            continue;
        }
        extra[n++] = (struct hdr){hd->name, NULL, (const char *)hd->value.data, hd->value.len};
    }
    n = replayBodyRef(r, extra, n, hex);
    extra[n++] = (struct hdr){"idempotency-replayed", "Idempotency-Replayed", "true", 4};
    bool body = replayBody(status);
    sendRaw(h, req, route, rid, status, NULL, body ? (const char *)r->body.data : "",
            body ? r->body.len : 0, extra, n);
    free(extra);
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
        sendJson(h, req, route, rid, 200, o, NULL, 0);
        return;
    case IDEM__OUTCOME__OUTCOME_REPLAY:
        if (res->response != NULL) {
            sendReplay(h, req, route, rid, res->response);
        } else {
            sendError(h, req, route, rid, 500, "internal", "replay without a stored response", 0);
        }
        return;
    case IDEM__OUTCOME__OUTCOME_IN_PROGRESS: {
        uint64_t s = (res->retry_after_ms + 999) / 1000;
        sendError(h, req, route, rid, 409, "idempotency_request_in_progress",
                  "another attempt holds the key's lease", s ? s : 1);
        return;
    }
    case IDEM__OUTCOME__OUTCOME_MISMATCH:
        sendError(h, req, route, rid, 409, "idempotency_key_reused",
                  "the key was used with a different request", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED:
        sendError(h, req, route, rid, 409, "idempotency_lease_expired",
                  "the holder's lease passed", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN:
        sendError(h, req, route, rid, 409, "idempotency_outcome_unknown",
                  "the outcome of an earlier attempt is unknown", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_EXPIRED:
        sendError(h, req, route, rid, 410, "idempotency_key_expired", "the key expired", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_OK:
        if (route == R_GET) {
            if (res->record == NULL ||
                res->record->state == IDEM__RECORD_STATE__RECORD_STATE_RELEASED) {
                sendError(h, req, route, rid, 404, "not_found", "no such key", 0);
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
        sendJson(h, req, route, rid, 200, o, NULL, 0);
        return;
    case IDEM__OUTCOME__OUTCOME_LEASE_LOST:
        sendError(h, req, route, rid, 409, "idempotency_lease_lost",
                  "the token is not the current holder's", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_NOT_FOUND:
        sendError(h, req, route, rid, 404, "not_found", "no such key", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED:
        sendError(h, req, route, rid, 429, "idempotency_quota_exceeded",
                  "the tenant's quota is exhausted", 0);
        return;
    case IDEM__OUTCOME__OUTCOME_INVALID:
        if (detail && (strcmp(detail, "idempotency_key_missing") == 0 ||
                       strcmp(detail, "idempotency_key_invalid") == 0)) {
            sendError(h, req, route, rid, 400, detail, "bad idempotency key", 0);
        } else {
            sendError(h, req, route, rid, 400, "invalid_request", detail, 0);
        }
        return;
    case IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED:
        sendError(h, req, route, rid, 401, "unauthenticated", "unknown or missing bearer token",
                  0);
        return;
    case IDEM__OUTCOME__OUTCOME_FORBIDDEN:
        sendError(h, req, route, rid, 403, "forbidden", "forbidden", 0);
        return;
    default: /* unavailable, not_leader without a leader, anything unexpected */
        /* An unavailable answer's reason (no leader, deadline, the pending budget or the
         * tenant's share of it) is the node's own text; clients branch on the code. */
        sendError(h, req, route, rid, 503, "idempotency_unavailable",
                  oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && detail != NULL
                      ? detail
                      : "no quorum or no leader; retry with the same key",
                  1);
        return;
    }
}

/* ---- jobs ------------------------------------------------------------------------------ */

static void jobRefDisposeCb(void *p)
{
    struct jobRef *ref = p;
    if (ref->job != NULL) {
        ref->job->req = NULL;
        ref->job->ref = NULL;
        ref->job = NULL;
    }
}

static void httpMaybeStopped(struct http_server *h);

/* Answers a job (resp, or err when the forward failed) and frees it. */
static void jobFinish(struct httpJob *j, const Idem__Response *resp, const char *err)
{
    struct http_server *h = j->h;
    h2o_req_t *req = j->req;
    if (req != NULL) { /* detach first: the send may dispose the request (notes §3) */
        j->ref->job = NULL;
        j->ref = NULL;
        j->req = NULL;
    }
    if (j->route == R_CLAIM) {
        reqstats_claim(&h->m.req, (double)(uv_hrtime() - j->start_ns) / 1e9);
    }
    if (resp != NULL) {
        answerResponse(h, req, j->route, j->rid, resp);
    } else {
        (void)err; /* a static reason from forward.c; it carries no key or token */
        reqstats_outcome(&h->m.req, IDEM__OUTCOME__OUTCOME_UNAVAILABLE);
        sendError(h, req, j->route, j->rid, 503, "idempotency_unavailable",
                  "the leader could not be reached; retry with the same key", 1);
    }
    if (j->prev) {
        j->prev->next = j->next;
    } else {
        h->jobs = j->next;
    }
    if (j->next) {
        j->next->prev = j->prev;
    }
    free(j->packed);
    free(j);
    httpMaybeStopped(h);
}

static void forwardDoneCb(void *data, const Idem__Response *resp, const char *err)
{
    jobFinish(data, resp, err);
}

/* The leader's RPC address when resp is a follower's not_leader that names one, else NULL. */
static const char *leaderOf(const Idem__Response *resp)
{
    if (resp->result != NULL && resp->result->outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
        resp->leader_rpc_address != NULL && resp->leader_rpc_address[0] != '\0') {
        return resp->leader_rpc_address;
    }
    return NULL;
}

/* Sends the packed request (packed, len) once to the leader at addr with the forwarder; cb
 * gets the answer, possibly before this returns. false, and nothing sent, when the bytes do
 * not decode. */
static bool forwardPacked(struct http_server *h, const char *addr, const uint8_t *packed,
                          size_t len, forward_cb cb, void *data)
{
    Idem__Request *rq = idem__request__unpack(NULL, len, packed);
    if (rq == NULL) {
        return false;
    }
    forward_call(h->fwd, addr, rq, h->cfg->rpc.default_deadline_ms, cb, data);
    idem__request__free_unpacked(rq, NULL);
    return true;
}

static void serviceDoneCb(void *data, const Idem__Response *resp)
{
    struct httpJob *j = data;
    const char *leader = j->forwarded ? NULL : leaderOf(resp);
    if (leader != NULL) {
        j->forwarded = true;
        /* j may be finished (and freed) inside forwardPacked. */
        if (!forwardPacked(j->h, leader, j->packed, j->packed_len, forwardDoneCb, j)) {
            jobFinish(j, NULL, "cannot decode the request again");
        }
        return;
    }
    jobFinish(j, resp, NULL);
}

/* Hands rq to the service in a new job; the answer goes to req unless h2o disposes it. */
static void jobStart(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                     const Idem__Request *rq)
{
    struct httpJob *j = xcalloc(1, sizeof(*j));
    j->h = h;
    j->req = req;
    j->route = route;
    j->rid.len = rid.len < sizeof(j->rid_buf) ? rid.len : sizeof(j->rid_buf);
    memcpy(j->rid_buf, rid.base, j->rid.len);
    j->rid.base = j->rid_buf;
    j->start_ns = uv_hrtime();
    j->packed_len = idem__request__get_packed_size(rq);
    j->packed = xmalloc(j->packed_len ? j->packed_len : 1);
    idem__request__pack(rq, j->packed);
    struct jobRef *ref = h2o_mem_alloc_shared(&req->pool, sizeof(*ref), jobRefDisposeCb);
    ref->job = j;
    j->ref = ref;
    j->next = h->jobs;
    if (h->jobs) {
        h->jobs->prev = j;
    }
    h->jobs = j;
    /* j may be finished (and freed) before service_handle returns. */
    service_handle(h->svc, rq, serviceDoneCb, j);
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

/* ---- routes ---------------------------------------------------------------------------- */

static h2o_iovec_t requestId(h2o_req_t *req)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-request-id"), -1);
    if (i >= 0) {
        h2o_iovec_t v = req->headers.entries[i].value;
        bool ok = v.len >= 1 && v.len <= 64;
        for (size_t k = 0; ok && k < v.len; k++) {
            char c = v.base[k];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-';
        }
        if (ok) {
            return h2o_strdup(&req->pool, v.base, v.len);
        }
    }
    uint8_t rnd[8];
    char hex[17];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        memset(rnd, 0, sizeof(rnd));
    }
    toHex(rnd, sizeof(rnd), hex);
    return h2o_strdup(&req->pool, hex, 16);
}

static bool isMethod(h2o_req_t *req, const char *m)
{
    return h2o_memis(req->method.base, req->method.len, m, strlen(m));
}

/* The route of a raw path (without its query); *key (OUT) is the key segment, if any. */
static enum route routeOf(const char *p, size_t len, h2o_iovec_t *key)
{
    *key = h2o_iovec_init(NULL, 0);
#define IS(s) (len == sizeof(s) - 1 && memcmp(p, s, len) == 0)
    if (IS("/healthz")) {
        return R_HEALTHZ;
    }
    if (IS("/readyz")) {
        return R_READYZ;
    }
    if (IS("/metrics")) {
        return R_METRICS;
    }
    if (IS("/v1/claims")) {
        return R_CLAIM;
    }
#undef IS
    static const char pre[] = "/v1/claims/";
    if (len < sizeof(pre) - 1 || memcmp(p, pre, sizeof(pre) - 1) != 0) {
        return R_OTHER;
    }
    const char *k = p + sizeof(pre) - 1, *end = p + len;
    const char *slash = memchr(k, '/', (size_t)(end - k));
    if (slash == NULL) {
        *key = h2o_iovec_init(k, (size_t)(end - k));
        return R_GET;
    }
    *key = h2o_iovec_init(k, (size_t)(slash - k));
    const char *a = slash + 1;
    size_t alen = (size_t)(end - a);
    if (alen == 8 && memcmp(a, "complete", 8) == 0) {
        return R_COMPLETE;
    }
    if (alen == 7 && memcmp(a, "release", 7) == 0) {
        return R_RELEASE;
    }
    if (alen == 5 && memcmp(a, "renew", 5) == 0) {
        return R_RENEW;
    }
    return R_OTHER;
}

static void answerReadyz(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid)
{
    struct service_info si;
    service_get_info(h->svc, &si);
    int st = si.cluster.state;
    char why[128];
    bool ready = cluster_ready(&si.cluster, why, sizeof why);
    json_t *o = json_object();
    json_object_set_new(o, "ready", json_boolean(ready));
    if (!ready) {
        json_object_set_new(o, "reason", json_string(why));
    }
    json_object_set_new(o, "role", json_string(st == RAFT_LEADER     ? "leader"
                                               : st == RAFT_FOLLOWER  ? "follower"
                                               : st == RAFT_CANDIDATE ? "candidate"
                                                                      : "unavailable"));
    json_object_set_new(o, "leader_id", json_integer((json_int_t)si.cluster.leader_id));
    json_object_set_new(o, "term", json_integer((json_int_t)si.cluster.term));
    json_object_set_new(o, "commit_index", json_integer((json_int_t)si.cluster.commit_index));
    json_object_set_new(o, "applied_index", json_integer((json_int_t)si.cluster.applied_index));
    sendJson(h, req, R_READYZ, rid, ready ? 200 : 503, o, NULL, 0);
}

/* A growable text buffer for /metrics. */
struct textBuf {
    char *p;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void tbPrintf(struct textBuf *b, const char *fmt,
                                                            ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
}

/* One series of a Prometheus histogram (after its HELP and TYPE lines): buckets[i] (not
 * cumulative) counts observations up to bounds[i] seconds; count includes those above the
 * last bound; sum in seconds. labels: e.g. transport="rpc", or NULL. */
static void tbHistogramSeries(struct textBuf *b, const char *name, const char *labels,
                              const double bounds[], const uint64_t buckets[], size_t n,
                              uint64_t count, double sum)
{
    const char *l = labels != NULL ? labels : "", *sep = labels != NULL ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += buckets[i];
        tbPrintf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, l, sep, bounds[i],
                 (unsigned long long)cum);
    }
    tbPrintf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, l, sep, (unsigned long long)count);
    if (labels != NULL) {
        tbPrintf(b, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, l, sum, name, l,
                 (unsigned long long)count);
    } else {
        tbPrintf(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, (unsigned long long)count);
    }
}

/* A Prometheus histogram without labels (tbHistogramSeries). */
static void tbHistogram(struct textBuf *b, const char *name, const char *help,
                        const double bounds[], const uint64_t buckets[], size_t n, uint64_t count,
                        double sum)
{
    tbPrintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    tbHistogramSeries(b, name, NULL, bounds, buckets, n, count, sum);
}

/* The data-plane series of both front ends (reqstats.h), with a transport label: the
 * gateway's (http) and the RPC listener's (rpc), and the requests forwarded to this node. */
static void tbRequests(struct textBuf *b, const struct reqstats *http, const struct rpc_stats *rs)
{
    const struct {
        const char *name;
        const struct reqstats *r;
    } t[] = {{"http", http}, {"rpc", &rs->requests}};
    const size_t nt = sizeof(t) / sizeof(t[0]);
    tbPrintf(b, "# HELP idem_requests_total Answers to clients' data ops (claim, complete, "
                "release, renew, get) by service outcome, by the transport the client used: "
                "\"http\" the HTTP gateway and proxy listeners, \"rpc\" the binary RPC. A "
                "request a follower's gateway forwards to the leader is counted once, by that "
                "gateway, with the leader's answer (the leader counts it in "
                "idem_forwarded_requests_total). Admin ops are not counted.\n"
                "# TYPE idem_requests_total counter\n");
    for (size_t k = 0; k < nt; k++) {
        for (int o = 1; o < REQSTATS_OUTCOMES; o++) {
            tbPrintf(b, "idem_requests_total{outcome=\"%s\",transport=\"%s\"} %llu\n",
                     outcomeNames[o], t[k].name, (unsigned long long)t[k].r->outcomes[o]);
        }
    }
    tbPrintf(b, "# HELP idem_fail_closed_total Unavailable answers (fail closed; the client "
                "retries with the same key), by transport: \"http\" every 503 of the gateway "
                "and proxy listeners, \"rpc\" every unavailable answer of the binary RPC to a "
                "client's data op or to a frame it refused unread "
                "(idem_rpc_frames_refused_total). A forwarded request is counted by the gateway "
                "that forwarded it.\n"
                "# TYPE idem_fail_closed_total counter\n");
    for (size_t k = 0; k < nt; k++) {
        tbPrintf(b, "idem_fail_closed_total{transport=\"%s\"} %llu\n", t[k].name,
                 (unsigned long long)t[k].r->fail_closed);
    }
    double bounds[REQSTATS_BUCKETS];
    for (size_t i = 0; i < REQSTATS_BUCKETS; i++) {
        bounds[i] = reqstats_bound(i);
    }
    tbPrintf(b, "# HELP idem_claim_duration_seconds Time from a claim being taken to its answer, "
                "by transport: \"http\" from the parsed JSON API request (a forward to the "
                "leader included), \"rpc\" from the decoded frame (forwarded claims not "
                "included).\n"
                "# TYPE idem_claim_duration_seconds histogram\n");
    for (size_t k = 0; k < nt; k++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "transport=\"%s\"", t[k].name);
        tbHistogramSeries(b, "idem_claim_duration_seconds", labels, bounds, t[k].r->claim_buckets,
                          REQSTATS_BUCKETS, t[k].r->claim_count, t[k].r->claim_sum);
    }
    tbPrintf(b, "# HELP idem_forwarded_requests_total Data ops other nodes' gateways forwarded to "
                "this node's binary RPC, by the outcome this node answered. Their clients are "
                "counted by the node they reached, not here: its JSON API's requests in "
                "idem_requests_total{transport=\"http\"}, its proxy listeners' claims only "
                "(the proxy's complete, release and renew are counted here alone).\n"
                "# TYPE idem_forwarded_requests_total counter\n");
    for (int o = 1; o < REQSTATS_OUTCOMES; o++) {
        tbPrintf(b, "idem_forwarded_requests_total{outcome=\"%s\"} %llu\n", outcomeNames[o],
                 (unsigned long long)rs->forwarded[o]);
    }
}

static void answerMetrics(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid)
{
    struct service_info si;
    service_get_info(h->svc, &si);
    struct rpc_stats rs;
    rpc_get_stats(&rs);
    struct textBuf b = {xmalloc(8192), 0, 8192};
    b.p[0] = '\0';
    const struct httpMetrics *m = &h->m;
    tbPrintf(&b, "# HELP idem_http_requests_total HTTP requests answered by the gateway.\n"
                 "# TYPE idem_http_requests_total counter\n");
    for (int r = 0; r < R_N; r++) {
        for (int s = 100; s < 600; s++) {
            if (m->http[r][s]) {
                tbPrintf(&b, "idem_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                         routeNames[r], s, (unsigned long long)m->http[r][s]);
            }
        }
    }
    tbRequests(&b, &m->req, &rs);
    /* The last of the cluster's buckets has no bound: it counts in +Inf (the count) only. */
    double appendBounds[CLUSTER_APPEND_BUCKETS - 1];
    for (size_t i = 0; i + 1 < CLUSTER_APPEND_BUCKETS; i++) {
        appendBounds[i] = (double)CLUSTER_APPEND_BOUND_US(i) / 1e6;
    }
    tbHistogram(&b, "idem_raft_append_duration_seconds",
                "Time to write and sync a Raft log append on this node (raft's append to its "
                "completion).",
                appendBounds, si.cluster.append_buckets, CLUSTER_APPEND_BUCKETS - 1,
                si.cluster.append_count, (double)si.cluster.append_sum_us / 1e6);
    tbPrintf(&b,
             "# HELP idem_raft_append_oldest_seconds Age of the oldest Raft log append still in "
             "flight on this node (0: none). An append that never ends (a disk that stopped "
             "answering) shows here, never in idem_raft_append_duration_seconds.\n"
             "# TYPE idem_raft_append_oldest_seconds gauge\n"
             "idem_raft_append_oldest_seconds %.6f\n",
             (double)si.cluster.append_oldest_us / 1e6);
    struct {
        const char *name, *type, *help;
        uint64_t v;
    } g[] = {
        {"idem_raft_term", "gauge", "Current Raft term.", si.cluster.term},
        {"idem_raft_commit_index", "gauge", "Raft commit index.", si.cluster.commit_index},
        {"idem_raft_applied_index", "gauge", "Raft applied index.", si.cluster.applied_index},
        {"idem_raft_log_entries", "gauge",
         "Log entries raft holds in memory: those since the last snapshot and the trailing "
         "ones it kept (raft.snapshot_trailing, within raft.snapshot_trailing_max_mb).",
         si.cluster.log_entries},
        {"idem_raft_leader_changes_total", "counter", "Leader changes seen by this node.",
         si.cluster.leader_changes},
        {"idem_raft_snapshot_threshold", "gauge",
         "Entries between snapshots now (adapted to the last snapshot's size).",
         si.cluster.snapshot_threshold},
        {"idem_raft_snapshot_bytes", "gauge",
         "Size of the last snapshot taken or restored (its serialised data).",
         si.cluster.snapshot_bytes_last},
        {"idem_raft_snapshot_index", "gauge",
         "Index of the last snapshot stored on this node (or loaded at start).",
         si.cluster.last_snapshot_index},
        {"idem_raft_snapshot_store_failures_total", "counter",
         "Snapshots of this node's own that could not be stored (the log keeps its entries; "
         "the next attempt comes a snapshot threshold later).",
         si.cluster.snapshot_store_failures},
        {"idem_records", "gauge", "Records held (released markers excluded).",
         si.fsm.records - si.fsm.released},
        {"idem_tombstones", "gauge", "Tombstones held.", si.fsm.tombstones},
        {"idem_quarantined", "gauge", "Quarantined records.", si.fsm.quarantined},
        {"idem_bytes", "gauge", "Bytes counted against quotas.", si.fsm.bytes},
        {"idem_rpc_connections", "gauge", "Open connections of the binary RPC listener.",
         rs.connections},
        {"idem_http_connections", "gauge",
         "Open connections of the HTTP gateway and proxy listeners (at most "
         "http.max_connections).",
         m->connections},
        {"idem_http_connections_refused_total", "counter",
         "HTTP connections closed on accept because http.max_connections were open.",
         m->connections_refused},
        {"idem_rpc_inflight_requests", "gauge",
         "RPC requests taken that await their answer (at most 4096 per connection).", rs.inflight},
        {"idem_rpc_frame_buffer_bytes", "gauge",
         "Memory held by the RPC connections' frame buffers (64 KiB each when idle; their "
         "growth past that at most rpc.max_frame_buffer_mb together).",
         rs.frame_buffer_bytes},
        {"idem_rpc_frames_refused_total", "counter",
         "RPC frames answered unavailable and skipped: the frame buffers' growth had "
         "reached rpc.max_frame_buffer_mb.",
         rs.frames_refused},
        {"idem_proposals_pending_bytes", "gauge",
         "Commands this leader proposed that are not yet applied, each counted as its bytes + "
         "256 (clients' commands are refused past batch.max_pending_mb; the leader's own "
         "expire entries are not).",
         si.cluster.pending_bytes},
        {"idem_proposals_queued_bytes", "gauge",
         "Commands this leader holds back, counted as idem_proposals_pending_bytes (and in "
         "it): their tenant had batch.tenant_max_inflight_kb in the log's queue; they go in "
         "as its earlier ones commit.",
         si.cluster.queued_bytes},
        {"idem_proposals_refused_total", "counter",
         "Commands answered unavailable because batch.max_pending_mb were pending.",
         si.cluster.pending_refused},
        {"idem_proposals_transfer_refused_total", "counter",
         "Commands answered unavailable because this leader was handing its leadership to "
         "another voter (raft takes no entry meanwhile).",
         si.cluster.transfer_refused},
        {"idem_proposals_not_proposed_total", "counter",
         "Commands this leader took that never went into the log: their batch refused by raft "
         "(a leadership transfer began, or the node stopped leading, first), or held back "
         "(batch.tenant_max_inflight_kb) when it stopped leading. Answered unavailable.",
         si.cluster.not_proposed},
        {"idem_proposals_share_refused_total", "counter",
         "Commands answered unavailable because their tenant had its share of "
         "batch.max_pending_mb pending (batch.tenant_max_pending_percent), every tenant's.",
         si.cluster.share_refused},
        {"idem_rpc_answer_buffer_bytes", "gauge",
         "Answers of the binary RPC waiting to be written, every connection's together (at "
         "most rpc.max_answer_buffer_mb, and 64 MiB per connection).",
         rs.answer_buffer_bytes},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++) {
        tbPrintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", g[i].name, g[i].help, g[i].name,
                 g[i].type, g[i].name, (unsigned long long)g[i].v);
    }
    /* Per tenant: names are [A-Za-z0-9._-] (config.h), safe in a label as they are. */
    static const struct {
        const char *name, *type, *help;
    } tg[] = {
        {"idem_tenant_proposals_pending_bytes", "gauge",
         "A tenant's commands this leader proposed that are not yet applied, counted as "
         "idem_proposals_pending_bytes (at most batch.tenant_max_pending_percent of "
         "batch.max_pending_mb, or one command)."},
        {"idem_tenant_proposals_queued_bytes", "gauge",
         "A tenant's commands this leader holds back until its earlier ones commit "
         "(batch.tenant_max_inflight_kb), of idem_tenant_proposals_pending_bytes."},
        {"idem_tenant_proposals_refused_total", "counter",
         "A tenant's commands answered unavailable because it had its share of "
         "batch.max_pending_mb pending."},
    };
    for (size_t k = 0; k < sizeof(tg) / sizeof(tg[0]); k++) {
        tbPrintf(&b, "# HELP %s %s\n# TYPE %s %s\n", tg[k].name, tg[k].help, tg[k].name,
                 tg[k].type);
        for (size_t i = 0; i < h->cfg->n_tenants; i++) {
            uint64_t v[3] = {0, 0, 0}; /* in tg's order */
            service_tenant_pending(h->svc, i, &v[0], &v[1], &v[2]);
            tbPrintf(&b, "%s{tenant=\"%s\"} %llu\n", tg[k].name, h->cfg->tenants[i].name,
                     (unsigned long long)v[k]);
        }
    }
    tbPrintf(&b,
             "# HELP idem_raft_corrections_total Corrections of libraft 0.15 made by this node's "
             "raft I/O wrapper (cluster/io.h): answers and commit indexes clamped, results held "
             "by a leader, AppendEntries cut at the snapshot, a follower's match index lowered to "
             "the snapshot it installed after losing its data, an answer without a leader "
             "address not sent, the leader's snapshot held while this follower stored another.\n"
             "# TYPE idem_raft_corrections_total counter\n"
             "idem_raft_corrections_total{kind=\"clamp\"} %llu\n"
             "idem_raft_corrections_total{kind=\"hold\"} %llu\n"
             "idem_raft_corrections_total{kind=\"cut\"} %llu\n"
             "idem_raft_corrections_total{kind=\"rematch\"} %llu\n"
             "idem_raft_corrections_total{kind=\"unaddressed\"} %llu\n"
             "idem_raft_corrections_total{kind=\"install_held\"} %llu\n",
             (unsigned long long)si.cluster.raft_clamped, (unsigned long long)si.cluster.raft_held,
             (unsigned long long)si.cluster.raft_cut, (unsigned long long)si.cluster.raft_rematched,
             (unsigned long long)si.cluster.raft_unaddressed,
             (unsigned long long)si.cluster.raft_installs_held);
    tbPrintf(&b,
             "# HELP idem_rpc_connections_cut_total RPC connections closed for the answers "
             "waiting to be written to them: past 64 MiB of its own (limit=\"connection\"), or "
             "as the one holding the most when every connection's together passed "
             "rpc.max_answer_buffer_mb (limit=\"node\").\n"
             "# TYPE idem_rpc_connections_cut_total counter\n"
             "idem_rpc_connections_cut_total{limit=\"connection\"} %llu\n"
             "idem_rpc_connections_cut_total{limit=\"node\"} %llu\n",
             (unsigned long long)rs.answer_cuts_connection,
             (unsigned long long)rs.answer_cuts_node);
    tbPrintf(&b,
             "# HELP idem_table_index_bytes Memory of the record table's slot arrays (the "
             "records themselves are not counted): the array in use, the part of the one "
             "being migrated from during a growth, the part of the next growth's array "
             "faulted in ahead of it, and the slot copy kept for the next snapshot.\n"
             "# TYPE idem_table_index_bytes gauge\n"
             "idem_table_index_bytes{array=\"slots\"} %llu\n"
             "idem_table_index_bytes{array=\"migrating\"} %llu\n"
             "idem_table_index_bytes{array=\"ahead\"} %llu\n"
             "idem_table_index_bytes{array=\"snapshot_spare\"} %llu\n",
             (unsigned long long)si.fsm.index_slots_bytes,
             (unsigned long long)si.fsm.index_migrating_bytes,
             (unsigned long long)si.fsm.index_ahead_bytes,
             (unsigned long long)si.fsm.snapshot_spare_bytes);
    struct cluster_io_counters io;
    cluster_get_io_counters(&io);
    tbPrintf(&b,
             "# HELP idem_raft_aio_contexts_destroyed_total Kernel AIO contexts of raft's log "
             "writer destroyed, by the thread that waited for io_destroy: the reaper thread "
             "(cluster/aio_reap.h), or the caller's (the loop) when the reaper could not "
             "take one.\n"
             "# TYPE idem_raft_aio_contexts_destroyed_total counter\n"
             "idem_raft_aio_contexts_destroyed_total{thread=\"reaper\"} %llu\n"
             "idem_raft_aio_contexts_destroyed_total{thread=\"caller\"} %llu\n"
             "# HELP idem_raft_aio_destroy_failures_total io_destroy calls of the reaper "
             "thread that failed.\n"
             "# TYPE idem_raft_aio_destroy_failures_total counter\n"
             "idem_raft_aio_destroy_failures_total %llu\n",
             (unsigned long long)io.aio_destroyed_reaper,
             (unsigned long long)io.aio_destroyed_caller,
             (unsigned long long)io.aio_destroy_failed);
    tbPrintf(&b,
             "# HELP idem_raft_segments_prefilled_total raft's open log segments by what "
             "happened before their first append (cluster/segfill.h): written through with "
             "zeros, left as allocated (not ext4 or XFS, or raft.prefill_segments off), or a "
             "zero write failed (the segment is used as allocated).\n"
             "# TYPE idem_raft_segments_prefilled_total counter\n"
             "idem_raft_segments_prefilled_total{result=\"filled\"} %llu\n"
             "idem_raft_segments_prefilled_total{result=\"skipped\"} %llu\n"
             "idem_raft_segments_prefilled_total{result=\"failed\"} %llu\n",
             (unsigned long long)io.segments_filled, (unsigned long long)io.segments_skipped,
             (unsigned long long)io.segments_failed);
    tbPrintf(&b,
             "# HELP idem_raft_messages_refused_total Raft messages from peers refused before "
             "libraft decoded them (malformed: cluster/wire_check.h); each closed its "
             "connection.\n"
             "# TYPE idem_raft_messages_refused_total counter\n"
             "idem_raft_messages_refused_total %llu\n"
             "# HELP idem_raft_connections_refused_total Raft connections from peers closed "
             "before raft had them: a handshake that broke its rules, or an authentication "
             "that failed (raft.secret_file; cluster/transport.h).\n"
             "# TYPE idem_raft_connections_refused_total counter\n"
             "idem_raft_connections_refused_total %llu\n"
             "# HELP idem_raft_connect_auth_failures_total Raft connections to peers closed "
             "before raft had them: the peer's authentication was wrong, or it closed the "
             "connection or did not answer within 10 s (another secret, none, or it "
             "stopped).\n"
             "# TYPE idem_raft_connect_auth_failures_total counter\n"
             "idem_raft_connect_auth_failures_total %llu\n",
             (unsigned long long)io.messages_refused,
             (unsigned long long)io.connections_refused,
             (unsigned long long)io.connect_auth_failed);
    sendRaw(h, req, R_METRICS, rid, 200, "text/plain; version=0.0.4", b.p, b.len, NULL, 0);
    free(b.p);
}

/* The index of the one header `name` (lower case) of req, -1 when there is none, -2 when
 * there are more than one: a hop in front that joins repeated headers into one (RFC 9110
 * allows it for list-valued fields) and this node would then see different values. */
static ssize_t findSingle(h2o_req_t *req, const char *name, size_t len)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, len, -1);
    if (i >= 0 && h2o_find_header_by_str(&req->headers, name, len, i) >= 0) {
        return -2;
    }
    return i;
}

/* The JSON API routes, after method and body-size checks. */
static void handleApi(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                      h2o_iovec_t pathKey)
{
    /* Authentication: docs/contract.md, the tenant comes from the token only. */
    ssize_t ai = findSingle(req, H2O_STRLIT("authorization"));
    if (ai == -2) {
        sendError(h, req, route, rid, 401, "unauthenticated", "more than one Authorization header",
                  0);
        return;
    }
    const struct config_tenant *t = NULL;
    h2o_iovec_t tok = h2o_iovec_init(NULL, 0);
    if (ai >= 0) {
        h2o_iovec_t v = req->headers.entries[ai].value;
        if (v.len > 7 && strncasecmp(v.base, "bearer ", 7) == 0) {
            tok = h2o_iovec_init(v.base + 7, v.len - 7);
            while (tok.len > 0 && tok.base[0] == ' ') {
                tok.base++;
                tok.len--;
            }
            while (tok.len > 0 && tok.base[tok.len - 1] == ' ') {
                tok.len--;
            }
            t = service_tenant_for_token(h->svc, (const uint8_t *)tok.base, tok.len);
        }
    }
    if (t == NULL) {
        if (tok.len > 0 && service_token_is_admin(h->svc, (const uint8_t *)tok.base, tok.len)) {
            sendError(h, req, route, rid, 403, "forbidden",
                      "data operations need a tenant's token, not the admin token", 0);
            return;
        }
        sendError(h, req, route, rid, 401, "unauthenticated", "unknown or missing bearer token",
                  0);
        return;
    }
    h2o_iovec_t key = pathKey;
    if (route == R_CLAIM) {
        ssize_t ki = findSingle(req, H2O_STRLIT("idempotency-key"));
        if (ki == -2) {
            sendError(h, req, route, rid, 400, "idempotency_key_invalid",
                      "more than one Idempotency-Key header", 0);
            return;
        }
        key = ki >= 0 ? req->headers.entries[ki].value : h2o_iovec_init(NULL, 0);
    }
    switch (key_validate((const uint8_t *)key.base, key.len, t->key_max_len)) {
    case KEY_OK:
        break;
    case KEY_MISSING:
        sendError(h, req, route, rid, 400, "idempotency_key_missing",
                  "the Idempotency-Key is missing", 0);
        return;
    default:
        sendError(h, req, route, rid, 400, "idempotency_key_invalid",
                  "the idempotency key is malformed", 0);
        return;
    }
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__ClaimRequest cl = IDEM__CLAIM_REQUEST__INIT;
    Idem__CompleteRequest co = IDEM__COMPLETE_REQUEST__INIT;
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__ReleaseRequest re = IDEM__RELEASE_REQUEST__INIT;
    Idem__RenewRequest rn = IDEM__RENEW_REQUEST__INIT;
    Idem__GetRequest ge = IDEM__GET_REQUEST__INIT;
    struct scratch sc = {0};
    uint8_t fp[FP_LEN];
    ProtobufCBinaryData kb = {key.len, (uint8_t *)key.base};
    rq.auth_token.data = (uint8_t *)tok.base;
    rq.auth_token.len = tok.len;
    rq.deadline_ms = h->cfg->rpc.default_deadline_ms;
    const char *bad = NULL;
    if (route != R_GET && !parseBody(req, &sc)) {
        bad = "the body must be a JSON object";
    } else {
        switch (route) {
        case R_CLAIM:
            bad = parseClaim(sc.body, t, &cl, fp, &sc);
            cl.key = kb;
            rq.op_case = IDEM__REQUEST__OP_CLAIM;
            rq.claim = &cl;
            break;
        case R_COMPLETE: {
            const char *oc = NULL;
            json_t *r = json_object_get(sc.body, "response");
            if (!getToken(sc.body, &co.token)) {
                bad = "token must be a non-negative integer";
            } else if (!getStr(sc.body, "outcome", &oc)) {
                bad = "outcome must be a string";
            } else if (oc == NULL || strcmp(oc, "succeeded") == 0) {
                co.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
            } else if (strcmp(oc, "failed_final") == 0) {
                co.outcome = IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
            } else if (strcmp(oc, "unknown") == 0) {
                co.outcome = IDEM__COMPLETION__COMPLETION_UNKNOWN;
            } else {
                bad = "outcome must be succeeded, failed_final or unknown";
            }
            if (bad == NULL && r != NULL && !json_is_null(r)) {
                if (!parseStored(r, &sr, &sc)) {
                    bad = "response must be {status, headers, body} or {status, headers, "
                          "body_ref, body_sha256 (64 hex digits)}";
                } else {
                    co.response = &sr;
                }
            }
            co.key = kb;
            rq.op_case = IDEM__REQUEST__OP_COMPLETE;
            rq.complete = &co;
            break;
        }
        case R_RELEASE:
            if (!getToken(sc.body, &re.token)) {
                bad = "token must be a non-negative integer";
            }
            re.key = kb;
            rq.op_case = IDEM__REQUEST__OP_RELEASE;
            rq.release = &re;
            break;
        case R_RENEW:
            if (!getToken(sc.body, &rn.token)) {
                bad = "token must be a non-negative integer";
            } else if (!getU64(sc.body, "lease_ms", &rn.lease_ms, NULL)) {
                bad = "lease_ms must be a non-negative integer";
            }
            rn.key = kb;
            rq.op_case = IDEM__REQUEST__OP_RENEW;
            rq.renew = &rn;
            break;
        default: /* R_GET */
            ge.key = kb;
            rq.op_case = IDEM__REQUEST__OP_GET;
            rq.get = &ge;
            break;
        }
    }
    if (bad != NULL) {
        sendError(h, req, route, rid, 400, "invalid_request", bad, 0);
    } else {
        jobStart(h, req, route, rid, &rq);
    }
    scratchFree(&sc);
}

/* ---- proxy mode (issue #4 item 2) -------------------------------------------------------
 *
 * A request on a proxy listener: route by path prefix → key (400) → fingerprint → claim
 * through service_handle_as() on behalf of the route's tenant → on acquired, the request goes
 * to the upstream with http1client (docs/h2o-notes.md §4) under a total deadline → the
 * upstream's answer is recorded (complete or release, docs/contract.md) and then passed on.
 * Everything a job needs after the claim is copied into the job, so that it can finish
 * (and record the upstream's answer) even when h2o disposed the request first.
 *
 * Followers (pjCall): every record op (claim, renew, complete, release) goes to the local
 * service first; a follower answers not_leader, and the op is then forwarded to the leader's
 * RPC address (forward.c, one redirect) with Request.as_tenant and the cluster secret
 * (rpc.cluster_secret_file) as its auth_token. The upstream is always called from the node
 * the caller reached. Without a secret a follower answers 503 with Retry-After.
 *
 * Retries: a claim that finds no leader (unavailable, a forward that failed) is sent again
 * with the same attempt id (so a claim that committed but whose answer was lost gets its own
 * lease back, docs/contract.md) for up to rpc.default_deadline_ms, then answered 503. A
 * complete or release after the upstream answered is retried the same way (both are
 * idempotent for one token) for up to max(lease, 3 × rpc.default_deadline_ms), so that a
 * leader change during the upstream call does not leave the record processing.
 *
 * Lease renewal: while the upstream call runs, the lease is renewed every third of it. If a
 * renewal answers lease_lost or not_found (the lease passed during a stall and another
 * attempt took the key over, or the record is gone), the upstream's answer is passed on to
 * the caller but not recorded: the record belongs to its new holder (docs/contract.md: only
 * the current token may complete; the fence told the upstream that this holder was stale),
 * and a retry with the same key gets the new holder's outcome. */

struct upHdr {
    char *name; /* lower case, owned */
    char *value; /* owned */
    size_t value_len;
};

enum pjAfter {
    PJ_AFTER_UPSTREAM, /* pass the upstream's answer on */
    PJ_AFTER_ERROR,    /* answer err_status / err_code */
};

/* What the job records once the upstream call ended. */
enum pjRecord {
    PJ_REC_NONE,    /* nothing (pass-through) */
    PJ_REC_RELEASE, /* release: nothing happened, or a 4xx */
    PJ_REC_UNKNOWN, /* complete with outcome unknown: quarantine */
    PJ_REC_STORE,   /* complete with the upstream's answer */
};

#define PJ_RETRY_FIRST_MS 50
#define PJ_RETRY_MAX_MS 500

struct proxyJob;

struct pjobRef {
    struct proxyJob *job;
};

struct proxyJob {
    struct http_server *h;
    const struct config_proxy_route *route;
    const struct config_tenant *tenant;
    h2o_req_t *req;       /* NULL once h2o disposed the request, or once answered */
    struct pjobRef *ref;  /* in req->pool; NULL with req */
    char rid[72];
    bool idem;            /* the protocol applies (else: plain pass-through) */
    char *method;         /* owned copies of the request */
    char *path;
    uint8_t *body;
    size_t body_len;
    bool has_body;
    char *key;
    size_t key_len;
    char *fwd;            /* the caller's headers to forward, serialised */
    size_t fwd_len;
    uint64_t token;
    uint64_t expires_at_ms; /* 0: unknown */
    /* upstream */
    h2o_http1client_t *client;
    uv_timer_t timer;
    bool in_upstream;
    bool sent;
    char *head;
    h2o_iovec_t reqbufs[2];
    int up_status;
    size_t up_head_length; /* a HEAD's answer: the upstream's Content-Length; SIZE_MAX:
                            * none (or not a number), and then none is sent either */
    struct upHdr *up_hdrs;
    size_t n_up_hdrs;
    uint8_t *up_body;
    size_t up_len, up_cap;
    uint64_t up_total;
    bool too_large;
    EVP_MD_CTX *sha;
    uint8_t sha_out[32];
    /* what to answer once the record op is done */
    enum pjAfter after;
    int err_status;
    const char *err_code;
    const char *err_msg;
    /* the one service call in flight (pjCall), kept packed for retries and forwarding */
    service_done_cb call_cb;
    uint8_t *call_packed; /* owned; holds the cluster secret when one is configured */
    size_t call_len;
    bool call_in_flight;
    bool call_retry;      /* retried while no leader answers, until call_deadline */
    uint64_t call_deadline; /* uv_now() bound of the retries */
    uint64_t call_backoff_ms;
    /* lease renewal */
    uv_timer_t renew_timer;
    uint64_t lease_ms;
    bool lease_lost;      /* a renewal found another holder: the answer is not recorded */
    bool unrecorded;      /* the answer passed on is not known to be the key's recorded one */
    enum pjRecord record;
    bool record_waiting;  /* the upstream ended while a renewal was in flight */
    int open_handles;
    struct proxyJob *prev, *next;
};

static void pjRefDisposeCb(void *p)
{
    struct pjobRef *ref = p;
    if (ref->job != NULL) {
        ref->job->req = NULL;
        ref->job->ref = NULL;
        ref->job = NULL;
    }
}

/* Detaches and returns the request to answer, or NULL when the client is gone. */
static h2o_req_t *pjTakeReq(struct proxyJob *j)
{
    h2o_req_t *req = j->req;
    if (req != NULL) {
        j->ref->job = NULL;
        j->ref = NULL;
        j->req = NULL;
    }
    return req;
}

static h2o_iovec_t pjRid(struct proxyJob *j)
{
    return h2o_iovec_init(j->rid, strlen(j->rid));
}

/* RFC 9110 IMF-fixdate of a Unix time in ms into out; false when unknown. */
static bool imfDate(uint64_t ms, char out[40])
{
    if (ms == 0) {
        return false;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL) {
        return false;
    }
    static const char *const wd[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const mo[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    snprintf(out, 40, "%s, %02d %s %04d %02d:%02d:%02d GMT", wd[tm.tm_wday], tm.tm_mday,
             mo[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return true;
}

/* Adds Idempotency-Expires to extra when known; returns the new count. date is the caller's. */
static size_t pjExpires(const struct proxyJob *j, struct hdr *extra, size_t n, char date[40])
{
    if (j->idem && imfDate(j->expires_at_ms, date)) {
        extra[n++] = (struct hdr){"idempotency-expires", "Idempotency-Expires", date, strlen(date)};
    }
    return n;
}

/* pjExpires, then Idempotency-Recorded: false when the answer passed on is not known to be
 * the key's recorded result (its lease was lost during the upstream call, or recording it
 * did not answer ok): a retry may get another holder's result, and a client can tell this
 * answer from a recorded one (docs/contract.md). Adds at most two headers. */
static size_t pjAnswerHeaders(const struct proxyJob *j, struct hdr *extra, size_t n,
                              char date[40])
{
    n = pjExpires(j, extra, n, date);
    if (j->unrecorded) {
        extra[n++] = (struct hdr){"idempotency-recorded", "Idempotency-Recorded", "false", 5};
    }
    return n;
}

static void pjSendError(struct proxyJob *j, int status, const char *code, const char *message,
                        uint64_t retry_after_s)
{
    struct http_server *h = j->h;
    h2o_req_t *req = pjTakeReq(j);
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    json_t *msg = json_string(message ? message : code);
    json_object_set_new(o, "message", msg ? msg : json_string(code));
    json_object_set_new(o, "request_id", json_string(j->rid));
    char ra[24], date[40];
    struct hdr extra[3];
    size_t n = 0;
    if (retry_after_s > 0) {
        snprintf(ra, sizeof(ra), "%llu", (unsigned long long)retry_after_s);
        extra[n++] = (struct hdr){"retry-after", "Retry-After", ra, strlen(ra)};
    }
    n = pjAnswerHeaders(j, extra, n, date);
    if (status == 503) {
        h->m.req.fail_closed++;
    }
    sendJson(h, req, R_PROXY, pjRid(j), status, o, extra, n);
}

/* Whether a stored response is the marker of an upstream answer that was too large to keep
 * (an empty inline body with the SHA-256 of a non-empty one): replaying it would be a
 * silently truncated answer. */
static bool storedTooLarge(const Idem__StoredResponse *r)
{
    static const uint8_t emptySha[32] = {
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
        0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
    return r->body.len == 0 && r->body_sha256.len == 32 &&
           (r->body_ref == NULL || r->body_ref[0] == '\0') &&
           memcmp(r->body_sha256.data, emptySha, 32) != 0;
}

static void pjSendReplay(struct proxyJob *j, const Idem__StoredResponse *r)
{
    if (storedTooLarge(r)) {
        pjSendError(j, 502, "upstream_response_too_large",
                    "the upstream's answer exceeded the route's max_inline_body and was not kept",
                    0);
        return;
    }
    h2o_req_t *req = pjTakeReq(j);
    int status = replayStatus(r);
    size_t n = 0;
    char date[40], hex[65];
    struct hdr *extra = xcalloc(r->n_headers + 4, sizeof(*extra));
    for (size_t i = 0; i < r->n_headers; i++) {
        const Idem__Header *hd = r->headers[i];
        if (!replayHeaderOk(hd) || strcasecmp(hd->name, "idempotency-expires") == 0) {
            continue;
        }
        extra[n++] = (struct hdr){hd->name, NULL, (const char *)hd->value.data, hd->value.len};
    }
    n = replayBodyRef(r, extra, n, hex);
    extra[n++] = (struct hdr){"idempotency-replayed", "Idempotency-Replayed", "true", 4};
    n = pjExpires(j, extra, n, date);
    bool body = replayBody(status);
    sendRaw(j->h, req, R_PROXY, pjRid(j), status, NULL, body ? (const char *)r->body.data : "",
            body ? r->body.len : 0, extra, n);
    free(extra);
}

/* Whether `name` is one of the comma-separated tokens of the upstream's Connection
 * header(s): those are hop-by-hop too (RFC 9110 §7.6.1), not passed on. */
static bool upConnectionNames(const struct proxyJob *j, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
        const struct upHdr *u = &j->up_hdrs[i];
        if (strcmp(u->name, "connection") != 0) {
            continue;
        }
        const char *p = u->value, *end = u->value + u->value_len;
        while (p < end) {
            while (p < end && (*p == ',' || *p == ' ' || *p == '\t')) {
                p++;
            }
            const char *t = p;
            while (p < end && *p != ',' && *p != ' ' && *p != '\t') {
                p++;
            }
            if ((size_t)(p - t) == nl && strncasecmp(t, name, nl) == 0) {
                return true;
            }
        }
    }
    return false;
}

/* Passes the upstream's answer on (every end-to-end header). */
static void pjSendUpstream(struct proxyJob *j)
{
    h2o_req_t *req = pjTakeReq(j);
    size_t n = 0;
    char date[40];
    struct hdr *extra = xcalloc(j->n_up_hdrs + 2, sizeof(*extra));
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
        const struct upHdr *u = &j->up_hdrs[i];
        if (replaySkips(u->name) || strcmp(u->name, "idempotency-expires") == 0 ||
            strcmp(u->name, "proxy-connection") == 0 || upConnectionNames(j, u->name)) {
            continue;
        }
        extra[n++] = (struct hdr){u->name, NULL, u->value, u->value_len};
    }
    n = pjAnswerHeaders(j, extra, n, date);
    size_t clen = j->up_len;
    if (strcmp(j->method, "HEAD") == 0) {
        /* The upstream's length, or none (SIZE_MAX: h2o then sends no Content-Length, and
         * never chunks a HEAD); none either where a length is not allowed (1xx, 204). */
        clen = j->up_status < 200 || j->up_status == 204 ? SIZE_MAX : j->up_head_length;
    }
    sendRawAs(j->h, req, R_PROXY, pjRid(j), j->up_status, NULL, (const char *)j->up_body, j->up_len,
              clen, extra, n);
    free(extra);
}

static void pjClosedCb(uv_handle_t *t)
{
    struct proxyJob *j = t->data;
    struct http_server *h = j->h;
    if (--j->open_handles > 0) {
        return;
    }
    if (j->prev) {
        j->prev->next = j->next;
    } else {
        h->pjobs = j->next;
    }
    if (j->next) {
        j->next->prev = j->prev;
    }
    free(j->method);
    free(j->path);
    free(j->body);
    free(j->key);
    free(j->fwd);
    free(j->head);
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
        free(j->up_hdrs[i].name);
        free(j->up_hdrs[i].value);
    }
    free(j->up_hdrs);
    free(j->up_body);
    EVP_MD_CTX_free(j->sha);
    if (j->call_packed != NULL) {
        OPENSSL_cleanse(j->call_packed, j->call_len);
        free(j->call_packed);
    }
    free(j);
    httpMaybeStopped(h);
}

/* Ends a job that has answered (or whose client is gone). */
static void pjFinish(struct proxyJob *j)
{
    if (j->req != NULL) { /* every path answers; this is a safety net */
        pjSendError(j, 500, "internal", "no answer", 0);
    }
    uv_timer_stop(&j->timer);
    uv_timer_stop(&j->renew_timer);
    j->open_handles = 2;
    uv_close((uv_handle_t *)&j->timer, pjClosedCb);
    uv_close((uv_handle_t *)&j->renew_timer, pjClosedCb);
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

/* The local service's answer: a follower's not_leader goes to the leader when this node has
 * a cluster secret. */
static void pjServiceDoneCb(void *data, const Idem__Response *resp)
{
    struct proxyJob *j = data;
    struct http_server *h = j->h;
    const char *leader = leaderOf(resp);
    if (leader != NULL && h->cfg->rpc.cluster_secret.set && !h->stopping && h->fwd != NULL) {
        /* j may be answered (and finished) inside forwardPacked. */
        if (!forwardPacked(h, leader, j->call_packed, j->call_len, pjForwardDoneCb, j)) {
            pjCallSynth(j, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, "cannot decode the request again");
        }
        return;
    }
    pjCallDone(j, resp);
}

/* Sends the packed call to the local service (again, for a retry). */
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
    service_handle_as(h->svc, j->tenant->name, rq, pjServiceDoneCb, j);
    idem__request__free_unpacked(rq, NULL);
}

/* Calls the service on behalf of the route's tenant (one call at a time per job); on a
 * follower the call goes to the leader (see above). retry_ms > 0: a call that finds no
 * leader is sent again for up to retry_ms. After http_server_stop() the service is no
 * longer called and cb gets unavailable. cb may run before this returns. */
static void pjCall(struct proxyJob *j, Idem__Request *rq, service_done_cb cb, uint64_t retry_ms)
{
    struct http_server *h = j->h;
    const struct config_secret *sec = &h->cfg->rpc.cluster_secret;
    rq->deadline_ms = h->cfg->rpc.default_deadline_ms;
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

static void pjAnswerAfter(struct proxyJob *j)
{
    if (j->after == PJ_AFTER_UPSTREAM) {
        pjSendUpstream(j);
    } else {
        pjSendError(j, j->err_status, j->err_code, j->err_msg, 0);
    }
    pjFinish(j);
}

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
        key_digest(j->tenant->name, (const uint8_t *)j->key, j->key_len, kd);
        log_warn("proxy: the upstream's answer cannot be stored (outcome %s); its digest is "
                 "recorded instead, replays answer 502 (key_digest %s)",
                 (unsigned)oc < REQSTATS_OUTCOMES ? outcomeNames[oc] : "?", kd);
        j->too_large = true;
        pjCompleteStored(j);
        return;
    }
    if (oc != IDEM__OUTCOME__OUTCOME_OK) {
        char kd[FP_HEX12_SIZE];
        key_digest(j->tenant->name, (const uint8_t *)j->key, j->key_len, kd);
        log_warn("proxy: recording the upstream's answer failed (key_digest %s, outcome %s)", kd,
                 (unsigned)oc < REQSTATS_OUTCOMES ? outcomeNames[oc] : "?");
        j->unrecorded = true;
    }
    pjAnswerAfter(j);
}

/* How long a complete or release is retried while no leader answers. */
static uint64_t pjRecordRetryMs(const struct proxyJob *j)
{
    uint64_t d = 3 * (uint64_t)j->h->cfg->rpc.default_deadline_ms;
    return j->lease_ms > d ? j->lease_ms : d;
}

static void pjRelease(struct proxyJob *j)
{
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__ReleaseRequest re = IDEM__RELEASE_REQUEST__INIT;
    re.key.data = (uint8_t *)j->key;
    re.key.len = j->key_len;
    re.token = j->token;
    rq.op_case = IDEM__REQUEST__OP_RELEASE;
    rq.release = &re;
    pjCall(j, &rq, pjRecordDoneCb, pjRecordRetryMs(j));
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
    pjCall(j, &rq, pjRecordDoneCb, pjRecordRetryMs(j));
}

/* Records what the upstream call ended with (j->record), unless the lease was lost: then the
 * answer is only passed on (see the section comment). Waits for a renewal in flight. */
static void pjRecordNow(struct proxyJob *j)
{
    j->record_waiting = false;
    if (j->lease_lost) {
        char kd[FP_HEX12_SIZE];
        key_digest(j->tenant->name, (const uint8_t *)j->key, j->key_len, kd);
        log_warn("proxy: the lease was lost during the upstream call; its answer is passed on "
                 "but not recorded (key_digest %s, fence %llu)",
                 kd, (unsigned long long)j->token);
        j->unrecorded = true;
        pjAnswerAfter(j);
        return;
    }
    switch (j->record) {
    case PJ_REC_RELEASE:
        pjRelease(j);
        return;
    case PJ_REC_UNKNOWN:
        pjComplete(j, IDEM__COMPLETION__COMPLETION_UNKNOWN, NULL); /* quarantine */
        return;
    case PJ_REC_STORE:
        pjCompleteStored(j);
        return;
    default:
        pjAnswerAfter(j);
        return;
    }
}

static void pjRecord(struct proxyJob *j, enum pjRecord what)
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
    Idem__Outcome oc = resp->result ? resp->result->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    if (oc == IDEM__OUTCOME__OUTCOME_LEASE_LOST || oc == IDEM__OUTCOME__OUTCOME_NOT_FOUND) {
        j->lease_lost = true;
        uv_timer_stop(&j->renew_timer);
    } else if (oc != IDEM__OUTCOME__OUTCOME_OK) {
        char kd[FP_HEX12_SIZE];
        key_digest(j->tenant->name, (const uint8_t *)j->key, j->key_len, kd);
        log_warn("proxy: renewing the lease failed, trying again in a third of it (key_digest "
                 "%s, outcome %s)",
                 kd, (unsigned)oc < REQSTATS_OUTCOMES ? outcomeNames[oc] : "?");
    }
    if (j->record_waiting) {
        pjRecordNow(j);
    }
}

/* Every third of the lease while the upstream call runs. */
static void pjRenewTickCb(uv_timer_t *t)
{
    struct proxyJob *j = t->data;
    if (!j->in_upstream || j->call_in_flight || j->lease_lost || j->h->stopping) {
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
    pjCall(j, &rq, pjRenewDoneCb, 0);
}

static void pjSetError(struct proxyJob *j, int status, const char *code, const char *msg)
{
    j->after = PJ_AFTER_ERROR;
    j->err_status = status;
    j->err_code = code;
    j->err_msg = msg;
}

/* The upstream call failed: sent says whether the request may have reached it. */
static void pjUpstreamFailed(struct proxyJob *j, bool sent, bool timeout)
{
    j->in_upstream = false;
    uv_timer_stop(&j->timer);
    if (!sent) {
        pjSetError(j, 502, "upstream_unavailable", "the upstream could not be reached");
    } else if (timeout) {
        pjSetError(j, 504, "upstream_timeout", "the upstream did not answer in time");
    } else {
        pjSetError(j, 502, "upstream_unavailable", "the upstream connection failed");
    }
    if (!j->idem) {
        pjAnswerAfter(j);
    } else if (!sent || !j->route->on_timeout_unknown) {
        pjRecord(j, PJ_REC_RELEASE); /* nothing was sent, or the route says release */
    } else {
        pjRecord(j, PJ_REC_UNKNOWN);
    }
}

static bool storedHeaderAllowed(const struct config_proxy_route *r, const char *name)
{
    for (size_t i = 0; i < r->n_response_headers; i++) {
        if (strcmp(r->response_headers[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* The upstream answered completely. */
static void pjUpstreamDone(struct proxyJob *j)
{
    j->in_upstream = false;
    uv_timer_stop(&j->timer);
    unsigned int sl = 0;
    if (EVP_DigestFinal_ex(j->sha, j->sha_out, &sl) != 1) {
        memset(j->sha_out, 0, sizeof(j->sha_out));
    }
    j->after = PJ_AFTER_UPSTREAM;
    if (j->too_large) {
        pjSetError(j, 502, "upstream_response_too_large",
                   "the upstream's answer exceeds the route's max_inline_body");
    }
    if (!j->idem) {
        pjAnswerAfter(j);
        return;
    }
    if (j->up_status >= 400 && j->up_status < 500 && !j->route->store_4xx) {
        pjRecord(j, PJ_REC_RELEASE);
        return;
    }
    pjRecord(j, PJ_REC_STORE);
}

/* Completes with the upstream's answer: its status, the route's stored headers, and the body
 * (or only its digest when it was too large). */
static void pjCompleteStored(struct proxyJob *j)
{
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__Header *hs = xcalloc(j->n_up_hdrs + 1, sizeof(*hs));
    Idem__Header **hp = xcalloc(j->n_up_hdrs + 1, sizeof(*hp));
    size_t n = 0;
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
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

static bool isTimeoutErr(const char *errstr)
{
    return errstr != NULL && strstr(errstr, "timeout") != NULL;
}

static void pjAppend(struct proxyJob *j, const char *p, size_t len)
{
    if (len == 0) {
        return;
    }
    EVP_DigestUpdate(j->sha, p, len);
    j->up_total += len;
    if (j->too_large || j->up_total > j->route->max_inline_body) {
        j->too_large = true;
        free(j->up_body);
        j->up_body = NULL;
        j->up_len = j->up_cap = 0;
        return;
    }
    if (j->up_len + len > j->up_cap) {
        size_t cap = j->up_cap ? j->up_cap : 4096;
        while (cap < j->up_len + len) {
            cap *= 2;
        }
        j->up_body = xrealloc(j->up_body, cap);
        j->up_cap = cap;
    }
    memcpy(j->up_body + j->up_len, p, len);
    j->up_len += len;
}

static int pjOnBody(h2o_http1client_t *client, const char *errstr)
{
    struct proxyJob *j = client->data;
    h2o_buffer_t *in = client->sock != NULL ? client->sock->input : NULL;
    if (in != NULL && in->size > 0) {
        pjAppend(j, in->bytes, in->size);
        h2o_buffer_consume(&client->sock->input, in->size);
    }
    if (errstr == NULL) {
        return 0;
    }
    j->client = NULL; /* freed by the library after this returns */
    if (errstr == h2o_http1client_error_is_eos) {
        pjUpstreamDone(j);
    } else {
        pjUpstreamFailed(j, true, isTimeoutErr(errstr));
    }
    return 0;
}

static h2o_http1client_body_cb pjOnHead(h2o_http1client_t *client, const char *errstr,
                                        int minor_version, int status, h2o_iovec_t msg,
                                        h2o_header_t *headers, size_t num_headers, int rlen)
{
    (void)minor_version;
    (void)msg;
    (void)rlen;
    struct proxyJob *j = client->data;
    if (errstr != NULL && errstr != h2o_http1client_error_is_eos) {
        j->client = NULL;
        pjUpstreamFailed(j, true, isTimeoutErr(errstr));
        return NULL;
    }
    j->up_status = status >= 100 && status < 600 ? status : 502;
    j->up_head_length = SIZE_MAX;
    j->up_hdrs = xcalloc(num_headers ? num_headers : 1, sizeof(*j->up_hdrs));
    for (size_t i = 0; i < num_headers; i++) {
        h2o_iovec_t *nm = headers[i].name;
        if (nm->len == 0 || h2o_memis(nm->base, nm->len, H2O_STRLIT("content-length"))) {
            if (nm->len > 0 && strcmp(j->method, "HEAD") == 0) {
                /* The answer has no body, but says how long a GET's would be. */
                j->up_head_length = h2o_strtosize(headers[i].value.base, headers[i].value.len);
            }
            continue;
        }
        struct upHdr *u = &j->up_hdrs[j->n_up_hdrs++];
        u->name = xmalloc(nm->len + 1);
        for (size_t k = 0; k < nm->len; k++) {
            char c = nm->base[k];
            u->name[k] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        }
        u->name[nm->len] = '\0';
        u->value = xmalloc(headers[i].value.len + 1);
        memcpy(u->value, headers[i].value.base, headers[i].value.len);
        u->value[headers[i].value.len] = '\0';
        u->value_len = headers[i].value.len;
    }
    if (errstr == h2o_http1client_error_is_eos) {
        j->client = NULL;
        pjUpstreamDone(j);
        return NULL;
    }
    return pjOnBody;
}

static h2o_http1client_head_cb pjOnConnect(h2o_http1client_t *client, const char *errstr,
                                           h2o_iovec_t **reqbufs, size_t *reqbufcnt,
                                           int *method_is_head)
{
    struct proxyJob *j = client->data;
    if (errstr != NULL) {
        j->client = NULL;
        pjUpstreamFailed(j, false, false);
        return NULL;
    }
    j->sent = true;
    *reqbufs = j->reqbufs;
    *reqbufcnt = j->body_len > 0 ? 2 : 1;
    *method_is_head = strcmp(j->method, "HEAD") == 0;
    return pjOnHead;
}

static void pjDeadlineCb(uv_timer_t *t)
{
    struct proxyJob *j = t->data;
    if (!j->in_upstream) {
        return;
    }
    if (j->client != NULL) { /* not inside a client callback: cancelling is safe */
        h2o_http1client_cancel(j->client);
        j->client = NULL;
    }
    pjUpstreamFailed(j, j->sent, true);
}

/* Header names never forwarded to the upstream: hop-by-hop, framing, and the protocol's own
 * (the fence and the key are set by the proxy). */
static bool forwardSkips(const char *name, size_t len)
{
    static const char *const skip[] = {"host",          "content-length",   "transfer-encoding",
                                       "connection",    "keep-alive",       "proxy-connection",
                                       "upgrade",       "te",               "trailer",
                                       "expect",        "http2-settings",   "idempotency-fence",
                                       "idempotency-key", "x-request-id"};
    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
        if (strlen(skip[i]) == len && strncasecmp(name, skip[i], len) == 0) {
            return true;
        }
    }
    return false;
}

/* Sends the request to the upstream; j may be finished before this returns. */
static void pjUpstreamStart(struct proxyJob *j)
{
    struct http_server *h = j->h;
    const struct config_proxy_route *r = j->route;
    struct textBuf b = {xmalloc(1024), 0, 1024};
    b.p[0] = '\0';
    tbPrintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nX-Request-Id: %s\r\n", j->method, j->path,
             r->upstream_hostport, j->rid);
    if (j->fwd_len > 0) {
        tbPrintf(&b, "%.*s", (int)j->fwd_len, j->fwd);
    }
    if (j->idem) {
        tbPrintf(&b, "Idempotency-Key: %.*s\r\nIdempotency-Fence: %llu\r\n", (int)j->key_len,
                 j->key, (unsigned long long)j->token);
    }
    if (j->has_body || j->body_len > 0) {
        tbPrintf(&b, "Content-Length: %zu\r\n", j->body_len);
    }
    tbPrintf(&b, "Connection: keep-alive\r\n\r\n");
    j->head = b.p;
    j->reqbufs[0] = h2o_iovec_init(b.p, b.len);
    j->reqbufs[1] = h2o_iovec_init(j->body, j->body_len);
    j->in_upstream = true;
    j->sha = EVP_MD_CTX_new();
    if (j->sha == NULL || EVP_DigestInit_ex(j->sha, EVP_sha256(), NULL) != 1) {
        j->in_upstream = false;
        pjSetError(j, 500, "internal", "cannot hash");
        if (j->idem) {
            pjRelease(j);
        } else {
            pjAnswerAfter(j);
        }
        return;
    }
    uv_timer_start(&j->timer, pjDeadlineCb, r->upstream_timeout_ms, 0);
    if (j->idem) {
        uint64_t every = j->lease_ms / 3 ? j->lease_ms / 3 : 1;
        uv_timer_start(&j->renew_timer, pjRenewTickCb, every, every);
    }
    struct upstreamPool *pool = NULL;
    for (size_t i = 0; i < h->n_pools && pool == NULL; i++) {
        if (h->pools[i].port == r->upstream_port && strcmp(h->pools[i].host, r->upstream_host) == 0) {
            pool = &h->pools[i];
        }
    }
    if (pool != NULL) { /* always, as every route's upstream has a pool */
        h2o_http1client_connect_with_pool(&j->client, j, &h->client_ctx, &pool->pool, pjOnConnect);
    } else {
        h2o_http1client_connect(&j->client, j, &h->client_ctx,
                                h2o_iovec_init(r->upstream_host, strlen(r->upstream_host)),
                                r->upstream_port, 0, pjOnConnect);
    }
}

static void pjClaimDoneCb(void *data, const Idem__Response *resp)
{
    struct proxyJob *j = data;
    struct http_server *h = j->h;
    const Idem__Result *res = resp->result;
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    const char *d = res != NULL && res->detail && res->detail[0] ? res->detail : resp->error;
    reqstats_outcome(&h->m.req, (unsigned)oc);
    if (res != NULL && res->expires_at_ms != 0) {
        j->expires_at_ms = res->expires_at_ms;
    }
    const struct config_proxy_route *r = j->route;
    switch (oc) {
    case IDEM__OUTCOME__OUTCOME_ACQUIRED:
        j->token = res->token;
        pjUpstreamStart(j);
        return;
    case IDEM__OUTCOME__OUTCOME_REPLAY:
        if (res->response != NULL) {
            pjSendReplay(j, res->response);
        } else {
            pjSendError(j, 500, "internal", "replay without a stored response", 0);
        }
        break;
    case IDEM__OUTCOME__OUTCOME_IN_PROGRESS: {
        uint64_t s = (res->retry_after_ms + 999) / 1000;
        pjSendError(j, (int)r->in_progress_status, "idempotency_request_in_progress",
                    "another attempt holds the key's lease", s ? s : 1);
        break;
    }
    case IDEM__OUTCOME__OUTCOME_MISMATCH:
        pjSendError(j, (int)r->mismatch_status, "idempotency_key_reused",
                    "the key was used with a different request", 0);
        break;
    case IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED:
        pjSendError(j, 409, "idempotency_lease_expired", "the holder's lease passed", 0);
        break;
    case IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN:
        pjSendError(j, 409, "idempotency_outcome_unknown",
                    "the outcome of an earlier attempt is unknown", 0);
        break;
    case IDEM__OUTCOME__OUTCOME_EXPIRED:
        pjSendError(j, 410, "idempotency_key_expired", "the key expired", 0);
        break;
    case IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED:
        pjSendError(j, 429, "idempotency_quota_exceeded", "the tenant's quota is exhausted", 0);
        break;
    case IDEM__OUTCOME__OUTCOME_INVALID:
        if (d && (strcmp(d, "idempotency_key_missing") == 0 ||
                  strcmp(d, "idempotency_key_invalid") == 0)) {
            pjSendError(j, 400, d, "bad idempotency key", 0);
        } else {
            pjSendError(j, 400, "invalid_request", d && d[0] ? d : "invalid request", 0);
        }
        break;
    case IDEM__OUTCOME__OUTCOME_NOT_LEADER:
        pjSendError(j, 503, "idempotency_unavailable",
                    h->cfg->rpc.cluster_secret.set
                        ? "the leader could not be reached; retry with the same key"
                        : "this node is not the leader and has no cluster secret "
                          "(rpc.cluster_secret_file) to forward proxy claims with; retry, "
                          "or use the leader's proxy",
                    1);
        break;
    case IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED:
    case IDEM__OUTCOME__OUTCOME_FORBIDDEN: {
        /* Locally the tenant is configured: only the leader refuses, for the secret. */
        uint64_t now = uv_now(h->loop);
        if (h->secret_warned_ms == 0 || now - h->secret_warned_ms >= 10000) {
            h->secret_warned_ms = now ? now : 1;
            log_warn("proxy: the leader refused this node's cluster secret; check "
                     "rpc.cluster_secret_file on every node");
        }
        pjSendError(j, 503, "idempotency_unavailable",
                    "the leader refused this node's cluster secret; retry on another node", 1);
        break;
    }
    default:
        pjSendError(j, 503, "idempotency_unavailable",
                    oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && d != NULL && d[0] != '\0'
                        ? d
                        : "no quorum or no leader; retry with the same key",
                    1);
        break;
    }
    pjFinish(j);
}

static char *dupMem(const char *p, size_t len)
{
    char *s = xmalloc(len + 1);
    if (len > 0) {
        memcpy(s, p, len);
    }
    s[len] = '\0';
    return s;
}

/* The route for a request: the first whose prefix matches and whose methods include the
 * request's (*idem = true); else the first whose prefix matches (pass-through); else NULL. */
static const struct config_proxy_route *proxyRoute(const struct config_proxy *p, h2o_req_t *req,
                                                   bool *idem)
{
    unsigned bit = config_method_bit(req->method.base, req->method.len);
    const struct config_proxy_route *any = NULL;
    for (size_t i = 0; i < p->n_routes; i++) {
        const struct config_proxy_route *r = &p->routes[i];
        size_t pl = strlen(r->path_prefix);
        if (req->path.len < pl || memcmp(req->path.base, r->path_prefix, pl) != 0) {
            continue;
        }
        if (bit != 0 && (r->methods & bit)) {
            *idem = true;
            return r;
        }
        if (any == NULL) {
            any = r;
        }
    }
    *idem = false;
    return any;
}

static void handleProxy(struct http_server *h, const struct config_proxy *p, h2o_req_t *req,
                        h2o_iovec_t rid)
{
    bool idem = false;
    const struct config_proxy_route *r = proxyRoute(p, req, &idem);
    struct proxyJob tmp = {.h = h, .req = NULL};
    snprintf(tmp.rid, sizeof(tmp.rid), "%.*s", (int)rid.len, rid.base);
    if (r == NULL) {
        sendError(h, req, R_PROXY, rid, 404, "not_found", "no proxy route for this path", 0);
        return;
    }
    if (h->stopping) {
        sendError(h, req, R_PROXY, rid, 503, "idempotency_unavailable", "node shutting down", 1);
        return;
    }
    if (req->entity.len > HTTP_BODY_MAX) {
        sendError(h, req, R_PROXY, rid, 413, "payload_too_large", "the body exceeds 1 MiB", 0);
        return;
    }
    const struct config_tenant *t = &h->cfg->tenants[r->tenant];
    h2o_iovec_t key = h2o_iovec_init(NULL, 0);
    if (idem) {
        ssize_t ki = findSingle(req, H2O_STRLIT("idempotency-key"));
        if (ki == -2) {
            sendError(h, req, R_PROXY, rid, 400, "idempotency_key_invalid",
                      "more than one Idempotency-Key header", 0);
            return;
        }
        key = ki >= 0 ? req->headers.entries[ki].value : h2o_iovec_init(NULL, 0);
        switch (key_validate((const uint8_t *)key.base, key.len, t->key_max_len)) {
        case KEY_OK:
            break;
        case KEY_MISSING:
            if (r->key_required) {
                sendError(h, req, R_PROXY, rid, 400, "idempotency_key_missing",
                          "the Idempotency-Key is missing", 0);
                return;
            }
            idem = false; /* optional key: pass through without the protocol */
            break;
        default:
            sendError(h, req, R_PROXY, rid, 400, "idempotency_key_invalid",
                      "the idempotency key is malformed", 0);
            return;
        }
    }
    struct proxyJob *j = xcalloc(1, sizeof(*j));
    j->h = h;
    j->route = r;
    j->tenant = t;
    j->idem = idem;
    memcpy(j->rid, tmp.rid, sizeof(j->rid));
    j->method = dupMem(req->method.base, req->method.len);
    j->path = dupMem(req->path.base, req->path.len);
    j->has_body = req->entity.base != NULL;
    j->body_len = req->entity.len;
    j->body = (uint8_t *)dupMem(req->entity.base, req->entity.len);
    if (idem) {
        j->key = dupMem(key.base, key.len);
        j->key_len = key.len;
    }
    /* The caller's end-to-end headers, serialised for the upstream. */
    struct textBuf fb = {xmalloc(1024), 0, 1024};
    fb.p[0] = '\0';
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *hd = &req->headers.entries[i];
        if (hd->name->len == 0 || forwardSkips(hd->name->base, hd->name->len)) {
            continue; /* a nameless one: the continuation line of a folded header */
        }
        tbPrintf(&fb, "%.*s: %.*s\r\n", (int)hd->name->len, hd->name->base, (int)hd->value.len,
                 hd->value.base);
    }
    j->fwd = fb.p;
    j->fwd_len = fb.len;
    uv_timer_init(h->loop, &j->timer);
    j->timer.data = j;
    uv_timer_init(h->loop, &j->renew_timer);
    j->renew_timer.data = j;
    j->lease_ms = r->lease_ms ? r->lease_ms : t->lease_ms;
    j->req = req;
    j->ref = h2o_mem_alloc_shared(&req->pool, sizeof(*j->ref), pjRefDisposeCb);
    j->ref->job = j;
    j->next = h->pjobs;
    if (h->pjobs) {
        h->pjobs->prev = j;
    }
    h->pjobs = j;
    if (!idem) {
        pjUpstreamStart(j);
        return;
    }
    /* Fingerprint: method, path with query, tenant, content type, body, named headers. */
    ssize_t ci = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);
    char *ctype = ci >= 0 ? dupMem(req->headers.entries[ci].value.base,
                                   req->headers.entries[ci].value.len)
                          : NULL;
    size_t nfh = 0;
    struct fp_header *fh = xcalloc(req->headers.size + 1, sizeof(*fh));
    for (size_t k = 0; k < r->n_fingerprint_headers; k++) {
        const char *name = r->fingerprint_headers[k];
        for (ssize_t i = -1;
             (i = h2o_find_header_by_str(&req->headers, name, strlen(name), i)) >= 0;) {
            fh[nfh++] = (struct fp_header){name, (const uint8_t *)req->headers.entries[i].value.base,
                                           req->headers.entries[i].value.len};
        }
    }
    struct fp_input in = {.method = j->method,
                          .path = j->path,
                          .tenant = t->name,
                          .content_type = ctype,
                          .body = j->body,
                          .body_len = j->body_len,
                          .headers = fh,
                          .n_headers = nfh};
    uint8_t fp[FP_LEN];
    int rc = fp_compute(&in, fp);
    free(ctype);
    free(fh);
    if (rc != FP_OK) {
        pjSendError(j, rc == FP_EINVAL_JSON ? 400 : 500,
                    rc == FP_EINVAL_JSON ? "invalid_request" : "internal", fp_strerror(rc), 0);
        pjFinish(j);
        return;
    }
    uint8_t rnd[8];
    char attempt[17];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        pjSendError(j, 500, "internal", "no randomness for the attempt id", 0);
        pjFinish(j);
        return;
    }
    toHex(rnd, sizeof(rnd), attempt);
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__ClaimRequest cl = IDEM__CLAIM_REQUEST__INIT;
    cl.key.data = (uint8_t *)j->key;
    cl.key.len = j->key_len;
    cl.fingerprint.data = fp;
    cl.fingerprint.len = FP_LEN;
    cl.attempt_id.data = (uint8_t *)attempt;
    cl.attempt_id.len = 16;
    cl.lease_ms = r->lease_ms;
    cl.ttl_ms = r->ttl_ms;
    if (r->lease_policy_set) {
        cl.policy = r->lease_policy == CONFIG_LEASE_TAKEOVER
                        ? IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
                        : IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
    }
    rq.op_case = IDEM__REQUEST__OP_CLAIM;
    rq.claim = &cl;
    /* j may be finished before this returns. */
    pjCall(j, &rq, pjClaimDoneCb, h->cfg->rpc.default_deadline_ms);
}

/* The proxy listener a request arrived on, or NULL for the gateway's own listener. */
static const struct config_proxy *proxyOf(struct http_server *h, h2o_req_t *req)
{
    if (h->n_plisteners == 0 || req->conn->callbacks->get_sockname == NULL) {
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = req->conn->callbacks->get_sockname(req->conn, (struct sockaddr *)&ss);
    if (sl == 0 || ss.ss_family != AF_INET) {
        return NULL;
    }
    const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;
    for (size_t i = 0; i < h->n_plisteners; i++) {
        const struct sockaddr_in *a = &h->plisteners[i].sa;
        if (a->sin_port == sin->sin_port &&
            (a->sin_addr.s_addr == INADDR_ANY || a->sin_addr.s_addr == sin->sin_addr.s_addr)) {
            return h->plisteners[i].cfg;
        }
    }
    return NULL;
}

/* ---- h2o's own error answers -------------------------------------------------------------
 *
 * h2o answers some requests itself before any handler runs: a body above
 * max_request_entity_size (413, HTTP_H2O_ENTITY_MAX), broken chunked encoding or
 * Content-Length (400). Those answers are bound to the host's fallback path; a filter there
 * turns their text/plain body into the JSON error body of docs/contract.md, with X-Request-Id.
 * h2o still closes the connection after them. */

struct h2oErrFilter {
    h2o_filter_t super;
    struct http_server *h;
};

struct h2oErrOstream {
    h2o_ostream_t super;
    h2o_iovec_t body; /* in req->pool */
};

static const struct config_proxy *proxyOf(struct http_server *h, h2o_req_t *req);

/* Sends the JSON body in place of h2o's text (none for HEAD: h2o sends no buffers then). */
static void h2oErrSendCb(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *inbufs,
                         size_t inbufcnt, h2o_send_state_t state)
{
    struct h2oErrOstream *o = (struct h2oErrOstream *)self;
    (void)inbufs;
    if (inbufcnt > 0 && o->body.len > 0) {
        h2o_iovec_t b = o->body;
        o->body.len = 0;
        h2o_ostream_send_next(&o->super, req, &b, 1, state);
    } else {
        h2o_ostream_send_next(&o->super, req, NULL, 0, state);
    }
}

static void h2oErrSetupCb(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    struct http_server *h = ((struct h2oErrFilter *)self)->h;
    int st = req->res.status;
    const char *code = st == 413 ? "payload_too_large" : st == 400 ? "invalid_request" : "http_error";
    const char *msg = st == 413 ? "the body exceeds the gateway's limit"
                      : req->res.reason != NULL ? req->res.reason
                                                : code;
    h2o_iovec_t rid = requestId(req);
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    json_t *m = json_string(msg);
    json_object_set_new(o, "message", m ? m : json_string(code));
    json_object_set_new(o, "request_id", json_stringn(rid.base, rid.len));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (text == NULL) { /* out of memory: h2o's own text goes out */
        h2o_setup_next_ostream(req, slot);
        return;
    }
    h2o_iovec_t body = h2o_strdup(&req->pool, text, strlen(text));
    free(text);
    ssize_t ci = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (ci >= 0) {
        req->res.headers.entries[ci].value = h2o_iovec_init(H2O_STRLIT("application/json"));
    } else {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, "Content-Type",
                       H2O_STRLIT("application/json"));
    }
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0,
                          "X-Request-Id", rid.base, rid.len);
    req->res.content_length = body.len;
    if (st >= 100 && st < 600) {
        h->m.http[proxyOf(h, req) != NULL ? R_PROXY : R_OTHER][st]++;
    }
    struct h2oErrOstream *os =
        (struct h2oErrOstream *)h2o_add_ostream(req, sizeof(*os), slot);
    os->super.do_send = h2oErrSendCb;
    os->body = body;
    h2o_setup_next_ostream(req, &os->super.next);
}

/* Whether the request has a folded header line (obs-fold, RFC 9112 5.2: a line that begins
 * with a space or tab continues the one before). h2o 2.2.5 takes such a line as a header
 * without a name: a folded "Idempotency-Key: ab" + " cd" was the key "ab" here, and "ab cd"
 * or a refusal at a front proxy that unfolds it. */
static bool hasFoldedHeader(const h2o_req_t *req)
{
    for (size_t i = 0; i < req->headers.size; i++) {
        if (req->headers.entries[i].name->len == 0) {
            return true;
        }
    }
    return false;
}

static int onReqCb(h2o_handler_t *self, h2o_req_t *req)
{
    struct http_server *h = ((struct httpHandler *)self)->h;
    h2o_iovec_t rid = requestId(req);
    if (hasFoldedHeader(req)) {
        req->http1_is_persistent = 0; /* what follows on the connection is not trusted */
        sendError(h, req, R_OTHER, rid, 400, "invalid_request",
                  "folded header lines (obs-fold) are not accepted", 0);
        return 0;
    }
    const struct config_proxy *proxy = proxyOf(h, req);
    if (proxy != NULL) {
        handleProxy(h, proxy, req, rid);
        return 0;
    }
    size_t plen = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    h2o_iovec_t key;
    enum route route = routeOf(req->path.base, plen, &key);
    bool post = route == R_CLAIM || route == R_COMPLETE || route == R_RELEASE || route == R_RENEW;
    if (route == R_OTHER) {
        sendError(h, req, route, rid, 404, "not_found", "no such route", 0);
        return 0;
    }
    if (!isMethod(req, post ? "POST" : "GET")) {
        sendError(h, req, route, rid, 405, "method_not_allowed", "method not allowed", 0);
        return 0;
    }
    if (route == R_HEALTHZ) {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        sendJson(h, req, route, rid, 200, o, NULL, 0);
        return 0;
    }
    if (h->stopping && route == R_READYZ) {
        json_t *o = json_object();
        json_object_set_new(o, "ready", json_false());
        json_object_set_new(o, "role", json_string("stopping"));
        sendJson(h, req, route, rid, 503, o, NULL, 0);
        return 0;
    }
    if (h->stopping) {
        sendError(h, req, route, rid, 503, "idempotency_unavailable", "node shutting down", 1);
        return 0;
    }
    if (route == R_READYZ) {
        answerReadyz(h, req, rid);
        return 0;
    }
    if (route == R_METRICS) {
        answerMetrics(h, req, rid);
        return 0;
    }
    if (req->entity.len > HTTP_BODY_MAX) {
        sendError(h, req, route, rid, 413, "payload_too_large", "the body exceeds 1 MiB", 0);
        return 0;
    }
    handleApi(h, req, route, rid, key);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* One accepted connection of the gateway or a proxy listener; h2o owns tcp.data. */
struct httpConn {
    uv_tcp_t tcp; /* first member: the close callback gets &tcp */
    struct http_server *h;
};

static void connClosedCb(uv_handle_t *handle)
{
    struct httpConn *c = (struct httpConn *)handle;
    c->h->m.connections--;
    free(c);
}

/* Past http.max_connections a connection is accepted and closed at once (left in the
 * backlog it would only wait there): each holds a file descriptor, and a node out of them
 * cannot open its next log segment, which stops a leader (docs/limits.md). */
static void acceptCb(uv_stream_t *l, int status)
{
    struct http_server *h = l->data;
    if (status != 0 || h->stopping) {
        return;
    }
    struct httpConn *c = xmalloc(sizeof(*c));
    c->h = h;
    h->m.connections++;
    uv_tcp_init(h->loop, &c->tcp);
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, connClosedCb);
        return;
    }
    if (h->m.connections > h->cfg->http.max_connections) {
        h->m.connections_refused++;
        uv_close((uv_handle_t *)&c->tcp, connClosedCb);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, connClosedCb);
    h2o_accept(&h->accept_ctx, sock);
}

static void listenerClosedCb(uv_handle_t *l);

/* Binds and listens on addr with handle tcp (initialised here). 0 or a libuv error. */
static int listenOn(struct http_server *h, uv_tcp_t *tcp, const struct config_addr *addr,
                    struct sockaddr_in *sa)
{
    int rv = uv_ip4_addr(addr->host, addr->port, sa);
    if (rv != 0) {
        return rv;
    }
    uv_tcp_init(h->loop, tcp);
    tcp->data = h;
    h->open_listeners++;
    rv = uv_tcp_bind(tcp, (const struct sockaddr *)sa, 0);
    if (rv == 0) {
        rv = uv_listen((uv_stream_t *)tcp, 511, acceptCb);
    }
    return rv;
}

/* Closes whatever listenOn() opened, after a failure in http_server_new. */
static void closeListenersNow(struct http_server *h)
{
    if (h->has_listener) {
        uv_close((uv_handle_t *)&h->listener, NULL);
    }
    for (size_t i = 0; i < h->n_plisteners; i++) {
        uv_close((uv_handle_t *)&h->plisteners[i].tcp, NULL);
    }
    uv_run(h->loop, UV_RUN_NOWAIT); /* the structs must outlive the close */
    free(h->plisteners);
    free(h);
}

struct http_server *http_server_new(uv_loop_t *loop, const struct config *cfg,
                                    struct service *svc, char *err, size_t errlen)
{
    const struct config_addr *addr = &cfg->node.http_address;
    struct sockaddr_in sa;
    /* With TLS on the RPC, forwarding to the leader speaks TLS too: the leader is verified
     * against tls.ca_file (else the system CA store), and this node's certificate is its
     * client certificate where the leader asks for one (forward.h). */
    struct tls_ctx *fwd_tls = NULL;
    if (cfg->tls.rpc) {
        char terr[400];
        fwd_tls = tls_ctx_new(&cfg->tls, TLS_CLIENT, terr, sizeof(terr));
        if (fwd_tls == NULL) {
            snprintf(err, errlen, "forwarding to the leader: %s", terr);
            return NULL;
        }
    }
    struct http_server *h = xcalloc(1, sizeof(*h));
    h->loop = loop;
    h->cfg = cfg;
    h->svc = svc;
    int rv;
    if (addr->text[0] != '\0') {
        h->has_listener = true;
        rv = listenOn(h, &h->listener, addr, &sa);
        if (rv != 0) {
            snprintf(err, errlen, "http listen on %s: %s", addr->text, uv_strerror(rv));
            closeListenersNow(h);
            tls_ctx_free(fwd_tls);
            return NULL;
        }
    }
    h->plisteners = xcalloc(cfg->n_proxies ? cfg->n_proxies : 1, sizeof(*h->plisteners));
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        struct proxyListener *pl = &h->plisteners[i];
        pl->cfg = &cfg->proxies[i];
        h->n_plisteners = i + 1;
        rv = listenOn(h, &pl->tcp, &pl->cfg->address, &pl->sa);
        if (rv != 0) {
            snprintf(err, errlen, "proxy listen on %s: %s", pl->cfg->address.text,
                     uv_strerror(rv));
            closeListenersNow(h);
            tls_ctx_free(fwd_tls);
            return NULL;
        }
    }
    h2o_config_init(&h->conf);
    h->conf.http1.upgrade_to_http2 = 0;
    h->conf.max_request_entity_size = HTTP_H2O_ENTITY_MAX;
    h->conf.server_name = h2o_iovec_init(H2O_STRLIT("idemd"));
    h2o_hostconf_t *host =
        h2o_config_register_host(&h->conf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    struct httpHandler *hh = (struct httpHandler *)h2o_create_handler(path, sizeof(*hh));
    hh->super.on_req = onReqCb;
    hh->h = h;
    struct h2oErrFilter *ef =
        (struct h2oErrFilter *)h2o_create_filter(&host->fallback_path, sizeof(*ef));
    ef->super.on_setup_ostream = h2oErrSetupCb;
    ef->h = h;
    h2o_context_init(&h->ctx, loop, &h->conf);
    h->ctx_ready = true;
    h->accept_ctx.ctx = &h->ctx;
    h->accept_ctx.hosts = h->conf.hosts;
    /* http1client: one per-phase io timeout no shorter than any route's total deadline, so
     * that the route's own deadline timer decides (docs/h2o-notes.md §4). */
    uint64_t io_ms = 1000;
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        for (size_t k = 0; k < cfg->proxies[i].n_routes; k++) {
            uint64_t t = cfg->proxies[i].routes[k].upstream_timeout_ms;
            io_ms = t > io_ms ? t : io_ms;
        }
    }
    h2o_timeout_init(loop, &h->io_timeout, io_ms);
    size_t n_routes = 0;
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        n_routes += cfg->proxies[i].n_routes;
    }
    h->pools = xcalloc(n_routes ? n_routes : 1, sizeof(*h->pools));
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        for (size_t k = 0; k < cfg->proxies[i].n_routes; k++) {
            const struct config_proxy_route *r = &cfg->proxies[i].routes[k];
            bool seen = false;
            for (size_t p = 0; p < h->n_pools && !seen; p++) {
                seen = h->pools[p].port == r->upstream_port &&
                       strcmp(h->pools[p].host, r->upstream_host) == 0;
            }
            if (seen) {
                continue;
            }
            struct upstreamPool *up = &h->pools[h->n_pools++];
            up->host = r->upstream_host;
            up->port = r->upstream_port;
            /* capacity is not enforced by h2o 2.2.5 (docs/h2o-notes.md §4) */
            h2o_socketpool_init_by_hostport(&up->pool,
                                            h2o_iovec_init(up->host, strlen(up->host)),
                                            up->port, 0, 1024);
            h2o_socketpool_set_timeout(&up->pool, loop, HTTP_POOL_IDLE_MS);
        }
    }
    h->client_ctx.loop = loop;
    h->client_ctx.getaddr_receiver = &h->ctx.receivers.hostinfo_getaddr;
    h->client_ctx.io_timeout = &h->io_timeout;
    h->fwd = forwarder_new(loop, cfg->rpc.max_frame_bytes, fwd_tls);
    uv_timer_init(loop, &h->stop_timer);
    h->stop_timer.data = h;
    if (h->has_listener) {
        log_info("serving http on %s", addr->text);
    }
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        log_info("serving proxy on %s (%zu routes)", cfg->proxies[i].address.text,
                 cfg->proxies[i].n_routes);
    }
    return h;
}

static void stopTimerClosedCb(uv_handle_t *t)
{
    struct http_server *h = t->data;
    void (*cb)(void *) = h->stop_cb;
    h->stop_cb = NULL;
    if (cb) {
        cb(h->stop_data);
    }
}

static bool httpIdle(struct http_server *h)
{
    return h->open_listeners == 0 && h->fwd_closed && h->jobs == NULL && h->pjobs == NULL &&
           h2o_linklist_is_empty(&h->ctx.http1._conns) &&
           h2o_linklist_is_empty(&h->ctx.http2._conns);
}

static void httpMaybeStopped(struct http_server *h)
{
    if (h->stopping && h->stop_cb != NULL && httpIdle(h) &&
        !uv_is_closing((uv_handle_t *)&h->stop_timer)) {
        uv_timer_stop(&h->stop_timer);
        uv_close((uv_handle_t *)&h->stop_timer, stopTimerClosedCb);
    }
}

/* Closes idle keep-alive connections (h2o has no API for it, notes §5); after the grace
 * period, every connection. */
static int closeIdleCb(h2o_req_t *req, void *data)
{
    bool all = *(bool *)data;
    if (req->version == 0 || all) {
        h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
        if (sock != NULL) {
            shutdown(h2o_socket_get_fd(sock), SHUT_RDWR);
        }
    }
    return 0;
}

static void stopPollCb(uv_timer_t *t)
{
    struct http_server *h = t->data;
    bool all = uv_now(h->loop) - h->stop_started_ms >= HTTP_STOP_GRACE_MS;
    h->conf.http1.callbacks.foreach_request(&h->ctx, closeIdleCb, &all);
    httpMaybeStopped(h);
}

static void listenerClosedCb(uv_handle_t *l)
{
    struct http_server *h = l->data;
    h->open_listeners--;
    httpMaybeStopped(h);
}

static void forwarderClosedCb(void *data)
{
    struct http_server *h = data;
    h->fwd = NULL;
    h->fwd_closed = true;
    httpMaybeStopped(h);
}

void http_server_stop(struct http_server *h, void (*cb)(void *data), void *data)
{
    h->stopping = true;
    h->stop_cb = cb;
    h->stop_data = data;
    h->stop_started_ms = uv_now(h->loop);
    if (h->has_listener) {
        uv_close((uv_handle_t *)&h->listener, listenerClosedCb);
    }
    for (size_t i = 0; i < h->n_plisteners; i++) {
        uv_close((uv_handle_t *)&h->plisteners[i].tcp, listenerClosedCb);
    }
    h2o_context_request_shutdown(&h->ctx);
    forwarder_close(h->fwd, forwarderClosedCb, h);
    uv_timer_start(&h->stop_timer, stopPollCb, 0, HTTP_STOP_POLL_MS);
}

void http_server_free(struct http_server *h)
{
    for (size_t i = 0; i < h->n_pools; i++) { /* closes the idle pooled connections */
        h2o_socketpool_dispose(&h->pools[i].pool);
    }
    h2o_timeout_dispose(h->loop, &h->io_timeout); /* every client finished with its job */
    if (h2o_timeout_is_linked(&h->ctx.http2._graceful_shutdown_timeout)) {
        h2o_timeout_unlink(&h->ctx.http2._graceful_shutdown_timeout);
    }
    h2o_context_dispose(&h->ctx);
    /* h2o's handles close on the loop; the context must outlive their callbacks. */
    uv_run(h->loop, UV_RUN_DEFAULT);
    h2o_config_dispose(&h->conf);
    free(h->pools); /* after the loop ran the close callbacks of their timers */
    free(h->plisteners);
    free(h);
}
