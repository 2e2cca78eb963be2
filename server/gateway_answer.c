/* gateway_answer: answering a gateway request (see gateway_internal.h): the status line,
 * headers and X-Request-Id, JSON and error bodies (docs/contract.md), counted per route and
 * status; replays of stored responses; a job's hold on the request it answers; the text
 * buffers of /metrics and the proxy's request heads. */
#include "gateway_internal.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fsm.h"
#include "http_conv.h"
#include "log.h"
#include "xmalloc.h"

/* ---- answering ------------------------------------------------------------------------- */

static const char *reasonOf(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 303:
        return "See Other";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 413:
        return "Payload Too Large";
    case 422:
        return "Unprocessable Content";
    case 425:
        return "Too Early";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
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
void gateway_send_raw_as(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                         int status, const char *ctype, const char *body, size_t len,
                         size_t content_length, const struct hdr *extra, size_t n_extra)
{
    if (status >= 100 && status < 600) {
        h->m.http[route][status]++;
    }
    if (log_enabled(LOG_LEVEL_DEBUG)) { /* no path: it may hold a key */
        char r[80];
        snprintf(r, sizeof r, "%.*s", (int)rid.len, rid.base);
        log_at(LOG_LEVEL_DEBUG, r, "http: %s answered %d%s", gateway_route_names[route], status,
               req == NULL ? " (the client is gone)" : "");
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

/* Sends one complete answer and counts it (gateway_send_raw_as, Content-Length the body's). */
void gateway_send_raw(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                      int status, const char *ctype, const char *body, size_t len,
                      const struct hdr *extra, size_t n_extra)
{
    gateway_send_raw_as(h, req, route, rid, status, ctype, body, len, len, extra, n_extra);
}

/* Sends a JSON body (stolen) with the given status and media type. The text goes into a
 * buffer on the stack (into the request's pool when it is longer), which h2o_send_inline
 * copies. */
static void sendJsonAs(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                       int status, json_t *body, const char *ctype, const struct hdr *extra,
                       size_t n_extra)
{
    if (req == NULL || body == NULL) { /* the client is gone, or no memory: only counted */
        json_decref(body);
        if (req != NULL) {
            static const char oom[] = "{\"code\":\"internal\",\"message\":\"out of memory\"}";
            gateway_send_raw(h, req, route, rid, 500, HTTP_PROBLEM_CTYPE, oom, sizeof(oom) - 1,
                             NULL, 0);
            return;
        }
        gateway_send_raw(h, NULL, route, rid, status, NULL, NULL, 0, NULL, 0);
        return;
    }
    char buf[1024];
    char *s = buf;
    size_t n = json_dumpb(body, buf, sizeof buf, JSON_COMPACT);
    if (n > sizeof buf) {
        s = h2o_mem_alloc_pool(&req->pool, n);
        n = json_dumpb(body, s, n, JSON_COMPACT);
    }
    json_decref(body);
    if (n == 0) {
        sendJsonAs(h, req, route, rid, 500, NULL, ctype, NULL, 0);
        return;
    }
    gateway_send_raw(h, req, route, rid, status, ctype, s, n, extra, n_extra);
}

void gateway_send_json(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                       int status, json_t *body, const struct hdr *extra, size_t n_extra)
{
    sendJsonAs(h, req, route, rid, status, body, "application/json", extra, n_extra);
}

json_t *gateway_error_body(h2o_req_t *req, int status, const char *code, const char *message,
                           h2o_iovec_t rid)
{
    return http_problem(status, code, message, rid.base, rid.len, req ? req->path.base : NULL,
                        req ? req->path.len : 0);
}

/* Sends the error body of docs/http-api.md (RFC 9457 problem details, with code, message and
 * request_id) as application/problem+json and counts a 503 as failed closed; retry_after_s
 * > 0 adds Retry-After, a 401 WWW-Authenticate: Bearer, and more[0..n_more) (at most three:
 * a 405's Allow is the caller's, which knows the path) go last. */
void gateway_send_error_with(struct http_server *h, h2o_req_t *req, enum route route,
                             h2o_iovec_t rid, int status, const char *code, const char *message,
                             uint64_t retry_after_s, const struct hdr *more, size_t n_more)
{
    json_t *o = req != NULL ? gateway_error_body(req, status, code, message, rid) : NULL;
    char ra[24];
    struct hdr extra[6] = {{0}};
    size_t n = 0;
    assert(n_more <= 3);
    if (retry_after_s > 0) {
        snprintf(ra, sizeof(ra), "%llu", (unsigned long long)retry_after_s);
        extra[n++] = (struct hdr){"retry-after", "Retry-After", ra, strlen(ra)};
    }
    if (status == 401 && route != R_PROXY) { /* RFC 6750 3 */
        extra[n++] = (struct hdr){"www-authenticate", "WWW-Authenticate", "Bearer", 6};
    }
    for (size_t i = 0; i < n_more; i++) {
        extra[n++] = more[i];
    }
    if (status == 503) {
        h->m.req.fail_closed++;
    }
    if (req == NULL) { /* the client is gone: only counted */
        gateway_send_raw(h, NULL, route, rid, status, NULL, NULL, 0, NULL, 0);
        return;
    }
    sendJsonAs(h, req, route, rid, status, o, HTTP_PROBLEM_CTYPE, extra, n);
}

/* Sends the error body (gateway_send_error_with); retry_after_s > 0 adds Retry-After. */
void gateway_send_error(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                        int status, const char *code, const char *message, uint64_t retry_after_s)
{
    gateway_send_error_with(h, req, route, rid, status, code, message, retry_after_s, NULL, 0);
}

bool gateway_outcome_error(const Idem__Result *res, struct gateway_err *e)
{
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    e->retry_after_s = 0;
    switch (oc) {
    case IDEM__OUTCOME__OUTCOME_IN_PROGRESS: {
        uint64_t s = (res->retry_after_ms + 999) / 1000;
        *e = (struct gateway_err){409, "idempotency_request_in_progress",
                                  "another attempt holds the key's lease", s ? s : 1};
        return true;
    }
    case IDEM__OUTCOME__OUTCOME_MISMATCH:
        *e = (struct gateway_err){409, "idempotency_key_reused",
                                  "the key was used with a different request", 0};
        return true;
    case IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED:
        *e = (struct gateway_err){409, "idempotency_lease_expired", "the holder's lease passed", 0};
        return true;
    case IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN:
        *e = (struct gateway_err){409, "idempotency_outcome_unknown",
                                  "the outcome of an earlier attempt is unknown", 0};
        return true;
    case IDEM__OUTCOME__OUTCOME_EXPIRED:
        *e = (struct gateway_err){410, "idempotency_key_expired", "the key expired", 0};
        return true;
    case IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED:
        *e = (struct gateway_err){429, "idempotency_quota_exceeded",
                                  "the tenant's quota is exhausted", 0};
        return true;
    default:
        return false;
    }
}
/* ---- holding a request ----------------------------------------------------------------- */

static void holdDisposeCb(void *p)
{
    struct gateway_hold **slot = p;
    if (*slot != NULL) {
        (*slot)->req = NULL;
        (*slot)->slot = NULL;
        *slot = NULL;
    }
}

void gateway_hold(struct gateway_hold *hd, h2o_req_t *req)
{
    hd->req = req;
    hd->slot = h2o_mem_alloc_shared(&req->pool, sizeof(*hd->slot), holdDisposeCb);
    *hd->slot = hd;
}

h2o_req_t *gateway_hold_take(struct gateway_hold *hd)
{
    h2o_req_t *req = hd->req;
    if (req != NULL) {
        *hd->slot = NULL;
        hd->slot = NULL;
        hd->req = NULL;
    }
    return req;
}

/* ---- replays -------------------------------------------------------------------------- */

/* Header names a replay never copies from the stored response: hop-by-hop, framing, and
 * the ones the gateway sets itself. */
bool gateway_replay_skips(const char *name)
{
    static const char *const skip[] = {"content-length",
                                       "transfer-encoding",
                                       "connection",
                                       "keep-alive",
                                       "upgrade",
                                       "te",
                                       "trailer",
                                       "date",
                                       "server",
                                       "x-request-id",
                                       "idempotency-replayed"};
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
 * name that is not a token or a value with a control character, stored before those were
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
           !gateway_replay_skips(hd->name);
}

/* Lower-case hex of n bytes into out (room for 2n + 1). */
void gateway_hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t k = 0; k < n; k++) {
        out[2 * k] = digits[p[k] >> 4];
        out[2 * k + 1] = digits[p[k] & 0xf];
    }
    out[2 * n] = '\0';
}
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
        gateway_hex(r->body_sha256.data, 32, hex);
        extra[n++] = (struct hdr){"idempotency-body-sha256", "Idempotency-Body-SHA256", hex, 64};
    }
    return n;
}

/* Whether name is in the NULL-terminated list (NULL: none). */
static bool dropped(const char *name, const char *const *drop)
{
    for (size_t i = 0; drop != NULL && drop[i] != NULL; i++) {
        if (strcasecmp(name, drop[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Sends the replay of stored response r (not one gateway_stored_too_large() marks): its
 * status, the stored headers it may copy (only those named in `allow` when it is not NULL,
 * never one named in `drop`), the body reference's, Idempotency-Replayed, then the caller's
 * own[0..n_own). */
void gateway_send_replay(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                         const Idem__StoredResponse *r, const char *const *allow,
                         const char *const *drop, const struct hdr *own, size_t n_own)
{
    int status = replayStatus(r);
    size_t n = 0;
    char hex[65];
    struct hdr *extra = xcalloc(r->n_headers + 3 + n_own, sizeof(*extra));
    for (size_t i = 0; i < r->n_headers; i++) {
        const Idem__Header *hd = r->headers[i];
        if (!replayHeaderOk(hd) || dropped(hd->name, drop) ||
            (allow != NULL && !dropped(hd->name, allow))) {
            continue;
        }
        extra[n++] = (struct hdr){hd->name, NULL, (const char *)hd->value.data, hd->value.len};
    }
    n = replayBodyRef(r, extra, n, hex);
    extra[n++] = (struct hdr){"idempotency-replayed", "Idempotency-Replayed", "true", 4};
    for (size_t i = 0; i < n_own; i++) {
        extra[n++] = own[i];
    }
    bool body = replayBody(status);
    gateway_send_raw(h, req, route, rid, status, NULL, body ? (const char *)r->body.data : "",
                     body ? r->body.len : 0, extra, n);
    free(extra);
}

/* Whether a stored response is the marker of an upstream answer that was too large to keep
 * (an empty inline body with the SHA-256 of a non-empty one): replaying it would be a
 * silently truncated answer. */
bool gateway_stored_too_large(const Idem__StoredResponse *r)
{
    static const uint8_t emptySha[32] = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
                                         0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
                                         0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
                                         0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
    return r->body.len == 0 && r->body_sha256.len == 32 &&
           (r->body_ref == NULL || r->body_ref[0] == '\0') &&
           memcmp(r->body_sha256.data, emptySha, 32) != 0;
}

/* ---- text buffers ---------------------------------------------------------------------- */

void gateway_tb_init(struct textBuf *b, size_t cap)
{
    b->p = xmalloc(cap);
    b->p[0] = '\0';
    b->len = 0;
    b->cap = cap;
}

void gateway_tb_printf(struct textBuf *b, const char *fmt, ...)
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
