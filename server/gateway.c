/* gateway: the HTTP gateway's h2o setup, routes and lifecycle (see http.h), and what its
 * parts share besides answering (gateway_answer.c): the request's id and key, forwarding a
 * packed request to the leader (forward.c).
 *
 * A request on node.http_address: route → method (405) → /healthz, /livez, /readyz, /metrics
 * here (metrics.c) → body cap (413) → the JSON API (http_api.c). A request on a proxy listener
 * goes to proxy mode (proxy.c). h2o's own error answers (413 above its entity cap, broken
 * framing) get the same problem+json error body through a filter. Stopping: docs/h2o-notes.md §5.
 *
 * TLS (tls.http for node.http_address, tls.proxy for the proxy listeners): h2o's own
 * OpenSSL layer, an accept context of its own with the SSL_CTX that tls_stream.c makes from
 * tls.cert_file and key_file (TLS 1.2+, client certificates as tls.http_client_certs says),
 * ALPN http/1.1 only (docs/h2o-notes.md §6).
 *
 * Status mapping: docs/contract.md. Nothing here logs a key or a token; metric labels are a
 * fixed route name, a status number, an outcome name and a transport name. */
#include "gateway_internal.h"

#include <assert.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <xxhash.h>

#include "fingerprint.h"
#include "http_conv.h"
#include "log.h"
#include "resolver.h"
#include "tls_stream.h"
#include "xmalloc.h"

#define HTTP_H2O_ENTITY_MAX (2u << 20) /* h2o's own cap, so that our handler sees 1 MiB + 1 */
#define HTTP_STOP_POLL_MS 20
#define HTTP_STOP_GRACE_MS 3000 /* after this, busy connections are closed too */

const char *const gateway_route_names[R_N] = {"healthz", "livez",    "readyz",  "metrics",
                                              "claim",   "complete", "release", "renew",
                                              "get",     "proxy",    "other"};

const char *const gateway_outcome_names[REQSTATS_OUTCOMES] = {
    "unspecified",     "acquired",        "replay",  "in_progress", "mismatch",
    "lease_expired",   "outcome_unknown", "expired", "ok",          "lease_lost",
    "not_found",       "quota_exceeded",  "invalid", "unavailable", "not_leader",
    "unauthenticated", "forbidden"};
_Static_assert(IDEM__OUTCOME__OUTCOME_FORBIDDEN == REQSTATS_OUTCOMES - 1,
               "gateway_outcome_names and reqstats.h must name every Idem__Outcome");

struct httpHandler {
    h2o_handler_t super;
    struct http_server *h;
};

/* ---- forwarding to the leader ---------------------------------------------------------- */

/* The leader's RPC address when this node can forward to it: another node leads, its
 * address is known and the forwarder is open. NULL otherwise (the local service answers). */
const char *gateway_forward_target(const struct http_server *h)
{
    return h->fwd != NULL && !h->stopping ? service_leader_elsewhere(h->svc) : NULL;
}

/* A leader became known (service_set_leader_cb): the requests forwarded to another node
 * that are not answered yet go to it, or fail now (gateway_forward's resend decides).
 * Without this, after a leader was cut off or stopped, they waited for its answer until
 * their deadline (rpc.default_deadline_ms) while the new leader was serving: the clients
 * saw the failover that much later. */
static void leaderKnownCb(void *data)
{
    struct http_server *h = data;
    const char *to = h->fwd != NULL && !h->stopping ? service_leader_rpc(h->svc) : NULL;
    size_t moved = to != NULL ? forwarder_move(h->fwd, to) : 0;
    if (moved > 0) {
        h->m.forwards_moved += moved;
        log_info("forward: %zu request(s) forwarded to a node that no longer leads sent again to "
                 "the leader", moved);
    }
}

/* Sends rq once to the leader at addr with the forwarder, which packs it (the one encoding
 * of the request on this node); cb gets the answer, possibly before this returns. The call
 * waits as long as the request's own deadline_ms when it has a shorter one than
 * rpc.default_deadline_ms (a proxy's renewal: proto/renew_plan.h bounds each try by the
 * lease left, and the next try must not wait behind a leader that does not answer). */
void gateway_forward(struct http_server *h, const char *addr, const Idem__Request *rq,
                     forward_resend_fn resend, forward_cb cb, void *data)
{
    uint32_t deadline_ms = h->cfg->rpc.default_deadline_ms;
    if (rq->deadline_ms != 0 && rq->deadline_ms < deadline_ms) {
        deadline_ms = rq->deadline_ms;
    }
    forward_call(h->fwd, addr, rq, deadline_ms, resend, cb, data);
}

/* The index of the one header `name` (lower case) of req, -1 when there is none, -2 when
 * there are more than one: a hop in front that joins repeated headers into one (RFC 9110
 * allows it for list-valued fields) and this node would then see different values. */
ssize_t gateway_find_single(h2o_req_t *req, const char *name, size_t len)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, len, -1);
    if (i >= 0 && h2o_find_header_by_str(&req->headers, name, len, i) >= 0) {
        return -2;
    }
    return i;
}

/* The one header `name` (lower case) of req, as the item it names (http_header_item: an
 * RFC 8941 sf-string decoded into the request's pool, or the bare value) into *val (empty
 * when there is none); false when it answered 400 `code` instead: the header was sent more
 * than once, or is a bad sf-string. `what` names the header in the answer. */
bool gateway_header_item(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                         const char *name, const char *what, const char *code, h2o_iovec_t *val)
{
    ssize_t ki = gateway_find_single(req, name, strlen(name));
    char msg[200];
    *val = h2o_iovec_init(NULL, 0);
    if (ki == -2) {
        snprintf(msg, sizeof msg, "more than one %s header", what);
        gateway_send_error(h, req, route, rid, 400, code, msg, 0);
        return false;
    }
    if (ki < 0) {
        return true;
    }
    h2o_iovec_t v = req->headers.entries[ki].value;
    char *out = h2o_mem_alloc_pool(&req->pool, v.len + 1);
    const char *why, *p;
    size_t n;
    if (!http_header_item(v.base, v.len, out, &p, &n, &why)) {
        snprintf(msg, sizeof msg, "the %s is %s", what, why);
        gateway_send_error(h, req, route, rid, 400, code, msg, 0);
        return false;
    }
    *val = h2o_iovec_init(p, n);
    return true;
}

/* The one Idempotency-Key header of req into *key (empty when there is none; an sf-string
 * decoded); false when it answered 400 (sent twice, a bad sf-string). */
bool gateway_header_key(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                        h2o_iovec_t *key)
{
    return gateway_header_item(h, req, route, rid, "idempotency-key", "Idempotency-Key",
                               "idempotency_key_invalid", key);
}

bool gateway_bearer(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                    h2o_iovec_t *tok)
{
    *tok = h2o_iovec_init(NULL, 0);
    ssize_t ai = gateway_find_single(req, H2O_STRLIT("authorization"));
    if (ai == -2) {
        gateway_send_error(h, req, route, rid, 401, "unauthenticated",
                           "more than one Authorization header", 0);
        return false;
    }
    if (ai >= 0) {
        h2o_iovec_t v = req->headers.entries[ai].value;
        if (v.len > 7 && strncasecmp(v.base, "bearer ", 7) == 0) {
            *tok = h2o_iovec_init(v.base + 7, v.len - 7);
            while (tok->len > 0 && tok->base[0] == ' ') {
                tok->base++;
                tok->len--;
            }
            while (tok->len > 0 && tok->base[tok->len - 1] == ' ') {
                tok->len--;
            }
        }
    }
    return true;
}

/* /metrics names tenants and their load: only for the admin token unless
 * http.metrics_public. False when it answered (401, 403) instead. */
static bool metricsAllowed(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid)
{
    h2o_iovec_t tok;
    if (h->cfg->http.metrics_public) {
        return true;
    }
    if (!gateway_bearer(h, req, R_METRICS, rid, &tok)) {
        return false;
    }
    if (tok.len > 0 && service_token_is_admin(h->svc, (const uint8_t *)tok.base, tok.len)) {
        return true;
    }
    if (tok.len > 0 && service_tenant_for_token(h->svc, (const uint8_t *)tok.base, tok.len)) {
        gateway_send_error(h, req, R_METRICS, rid, 403, "forbidden",
                           "/metrics needs the admin token, not a tenant's", 0);
        return false;
    }
    gateway_send_error(h, req, R_METRICS, rid, 401, "unauthenticated",
                       "/metrics needs the admin token (or http.metrics_public: true)", 0);
    return false;
}

/* The message of a 400 for a key the service refused: NULL unless `detail` (an invalid
 * answer's) is one of its key codes, idempotency_key_missing or idempotency_key_invalid,
 * which are then the answer's code. The key itself is judged by the service, before the
 * log, with the state machine's rule (fsm_command_check), not here. */
const char *gateway_key_refusal(const char *detail)
{
    if (detail == NULL) {
        return NULL;
    }
    if (strcmp(detail, "idempotency_key_missing") == 0) {
        return "the Idempotency-Key is missing";
    }
    if (strcmp(detail, "idempotency_key_invalid") == 0) {
        return "the idempotency key is malformed";
    }
    return NULL;
}

/* ---- routes ---------------------------------------------------------------------------- */

/* The request's id: a valid X-Request-Id it brought, or a new one. A new id is the next value
 * of the gateway's counter mixed by XXH3-64 with a key drawn at start: for a fixed key the
 * 8-byte XXH3 is a bijection, so ids do not repeat within a run, and the key keeps nodes and
 * restarts apart. Ids are not secrets, so no random bytes are drawn per request. */
static h2o_iovec_t requestId(struct http_server *h, h2o_req_t *req)
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
    uint64_t n = h->rid_next++;
    uint64_t v = XXH3_64bits_withSeed(&n, sizeof n, h->rid_key);
    uint8_t b[8];
    for (int k = 0; k < 8; k++) {
        b[k] = (uint8_t)(v >> (56 - 8 * k));
    }
    char *hex = h2o_mem_alloc_pool(&req->pool, 17);
    gateway_hex(b, sizeof b, hex);
    return h2o_iovec_init(hex, 16);
}

bool gateway_random(struct http_server *h, uint8_t *out, size_t n)
{
    assert(n <= sizeof h->rnd);
    if (h->rnd_left < n) {
        if (RAND_bytes(h->rnd, (int)sizeof h->rnd) != 1) {
            return false;
        }
        h->rnd_left = sizeof h->rnd;
    }
    uint8_t *p = h->rnd + (sizeof h->rnd - h->rnd_left);
    memcpy(out, p, n);
    memset(p, 0, n); /* handed out once */
    h->rnd_left -= n;
    return true;
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
    if (IS("/livez")) {
        return R_LIVEZ;
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

/* The forms that take the key from the Idempotency-Key header instead of the path (a key in
 * a URL is written to every access log in front of the node): GET /v1/claims reads the
 * record, POST /v1/claims/complete, .../release and .../renew act on it. Returns the route
 * of such a request (its path key cleared) or `route` unchanged. A key named "complete"
 * keeps its path form for GET; POST on /v1/claims/{key} was never a route. */
static enum route headerKeyRoute(h2o_req_t *req, enum route route, h2o_iovec_t *key)
{
    if (route == R_CLAIM && isMethod(req, "GET")) {
        return R_GET;
    }
    if (route != R_GET || !isMethod(req, "POST")) {
        return route;
    }
    enum route r = h2o_memis(key->base, key->len, H2O_STRLIT("complete")) ? R_COMPLETE
                   : h2o_memis(key->base, key->len, H2O_STRLIT("release")) ? R_RELEASE
                   : h2o_memis(key->base, key->len, H2O_STRLIT("renew"))   ? R_RENEW
                                                                           : R_GET;
    if (r != R_GET) {
        *key = h2o_iovec_init(NULL, 0);
    }
    return r;
}

/* The Allow of a 405 on a JSON API or probe path, by the route headerKeyRoute() gave it (and
 * the path's key): GET and POST on /v1/claims, and on /v1/claims/complete, .../release and
 * .../renew (a key of that name, or the header-key form); POST on a key's complete, release
 * and renew; GET elsewhere. */
static const char *allowOf(enum route route, h2o_iovec_t key)
{
    if (route == R_CLAIM ||
        (route == R_GET && (h2o_memis(key.base, key.len, H2O_STRLIT("complete")) ||
                            h2o_memis(key.base, key.len, H2O_STRLIT("release")) ||
                            h2o_memis(key.base, key.len, H2O_STRLIT("renew"))))) {
        return "GET, POST";
    }
    return route == R_COMPLETE || route == R_RELEASE || route == R_RENEW ? "POST" : "GET";
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
    gateway_send_json(h, req, R_READYZ, rid, ready ? 200 : 503, o, NULL, 0);
}

/* ---- h2o's own error answers -------------------------------------------------------------
 *
 * h2o answers some requests itself before any handler runs: a body above
 * max_request_entity_size (413, HTTP_H2O_ENTITY_MAX), broken chunked encoding or
 * Content-Length (400). Those answers are bound to the host's fallback path; a filter there
 * turns their text/plain body into the problem+json error body of docs/http-api.md, with
 * X-Request-Id. h2o still closes the connection after them. */

struct h2oErrFilter {
    h2o_filter_t super;
    struct http_server *h;
};

struct h2oErrOstream {
    h2o_ostream_t super;
    h2o_iovec_t body; /* in req->pool */
};

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
    h2o_iovec_t rid = requestId(h, req);
    json_t *o = gateway_error_body(req, st, code, msg, rid);
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
        req->res.headers.entries[ci].value = h2o_iovec_init(H2O_STRLIT(HTTP_PROBLEM_CTYPE));
    } else {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, "Content-Type",
                       H2O_STRLIT(HTTP_PROBLEM_CTYPE));
    }
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0,
                          "X-Request-Id", rid.base, rid.len);
    req->res.content_length = body.len;
    if (st >= 100 && st < 600) {
        h->m.http[proxy_of(h, req) != NULL ? R_PROXY : R_OTHER][st]++;
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
    h2o_iovec_t rid = requestId(h, req);
    if (hasFoldedHeader(req)) {
        req->http1_is_persistent = 0; /* what follows on the connection is not trusted */
        gateway_send_error(h, req, R_OTHER, rid, 400, "invalid_request",
                           "folded header lines (obs-fold) are not accepted", 0);
        return 0;
    }
    const struct config_proxy *proxy = proxy_of(h, req);
    if (proxy != NULL) {
        proxy_handle(h, proxy, req, rid);
        return 0;
    }
    size_t plen = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    h2o_iovec_t key;
    enum route route = routeOf(req->path.base, plen, &key);
    route = headerKeyRoute(req, route, &key);
    bool post = route == R_CLAIM || route == R_COMPLETE || route == R_RELEASE || route == R_RENEW;
    if (route == R_OTHER) {
        gateway_send_error(h, req, route, rid, 404, "not_found", "no such route", 0);
        return 0;
    }
    if (!isMethod(req, post ? "POST" : "GET")) {
        const char *methods = allowOf(route, key);
        struct hdr allow = {"allow", "Allow", methods, strlen(methods)};
        gateway_send_error_with(h, req, route, rid, 405, "method_not_allowed", "method not allowed",
                                0, &allow, 1);
        return 0;
    }
    if (route == R_HEALTHZ || route == R_LIVEZ) {
        /* Liveness: answered on the loop, so the loop turns; no quorum, no token, also
         * while the node stops. */
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        gateway_send_json(h, req, route, rid, 200, o, NULL, 0);
        return 0;
    }
    if (h->stopping && route == R_READYZ) {
        json_t *o = json_object();
        json_object_set_new(o, "ready", json_false());
        json_object_set_new(o, "role", json_string("stopping"));
        gateway_send_json(h, req, route, rid, 503, o, NULL, 0);
        return 0;
    }
    if (h->stopping) {
        gateway_send_error(h, req, route, rid, 503, "idempotency_unavailable", "node shutting down",
                           1);
        return 0;
    }
    if (route == R_READYZ) {
        answerReadyz(h, req, rid);
        return 0;
    }
    if (route == R_METRICS) {
        if (metricsAllowed(h, req, rid)) {
            metrics_answer(h, req, rid);
        }
        return 0;
    }
    if (req->entity.len > HTTP_BODY_MAX) {
        gateway_send_error(h, req, route, rid, 413, "payload_too_large", "the body exceeds 1 MiB",
                           0);
        return 0;
    }
    http_api_handle(h, req, route, rid, key);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* One accepted connection of the gateway or a proxy listener; h2o owns tcp.data. */
struct httpConn {
    uv_tcp_t tcp; /* first member: the close callback gets &tcp */
    struct http_server *h;
    LIST_ENTRY(httpConn) link;   /* in h->conns */
    struct rpc_admit_entry adm; /* its address counted (when admitted) */
    SSL_CTX *ssl_ctx;           /* a TLS listener's context at its accept, held; or NULL */
};

static void connClosedCb(uv_handle_t *handle)
{
    struct httpConn *c = (struct httpConn *)handle;
    rpc_admit_remove(&c->h->admit, &c->adm);
    SSL_CTX_free(c->ssl_ctx);
    c->h->m.connections--;
    LIST_REMOVE(c, link);
    gateway_maybe_stopped(c->h);
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
    struct httpConn *c = xcalloc(1, sizeof(*c));
    c->h = h;
    h->m.connections++;
    LIST_INSERT_HEAD(&h->conns, c, link);
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
    /* One host (an IPv4 address, an IPv6 /64) holds at most its share of the slots, or one
     * client without any token could hold them all (idle, or pipelining requests it never
     * reads the answers of), health checks included. */
    struct sockaddr_storage sa;
    int len = sizeof sa;
    struct rpc_admit_addr addr = rpc_admit_addr_v4(0);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0) {
        (void)IdemSockaddrKey((const struct sockaddr *)&sa, addr.b); /* zeros: unknown */
    }
    struct rpc_admit_entry *none = NULL;
    if (rpc_admit_decide(&h->admit, addr, &none) != RPC_ADMIT_OK) {
        h->m.refused_address++;
        uv_close((uv_handle_t *)&c->tcp, connClosedCb);
        return;
    }
    rpc_admit_add(&h->admit, &c->adm, addr);
    uv_tcp_nodelay(&c->tcp, 1);
    bool tls = l == (uv_stream_t *)&h->listener ? h->cfg->tls.http : h->cfg->tls.proxy;
    if (tls) {
        /* h2o keeps the SSL_CTX it is handed here without a reference and makes the
         * connection's SSL from it only when the first bytes arrive: by then a reload may
         * have put another context in and freed this one (http_server_set_tls). */
        c->ssl_ctx = h->tls_accept_ctx.ssl_ctx;
        SSL_CTX_up_ref(c->ssl_ctx);
    }
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, connClosedCb);
    h2o_accept(tls ? &h->tls_accept_ctx : &h->accept_ctx, sock);
}

static void listenerClosedCb(uv_handle_t *l);

/* Binds and listens on addr with handle tcp (initialised here first, whatever follows, so
 * that closeListenersNow() may close it); *sa (OUT) is the address bound (a name resolved
 * here, once, at start). 0, or a libuv error (why says it too). */
static int listenOn(struct http_server *h, uv_tcp_t *tcp, const struct config_addr *addr,
                    struct sockaddr_storage *sa, char *why, size_t why_len)
{
    uv_tcp_init(h->loop, tcp);
    tcp->data = h;
    h->open_listeners++;
    if (IdemSockaddrResolveNow(addr->host, addr->port, sa, why, why_len) != 0) {
        return UV_EINVAL;
    }
    int rv = uv_tcp_bind(tcp, (const struct sockaddr *)sa, 0);
    if (rv == 0) {
        rv = uv_listen((uv_stream_t *)tcp, 511, acceptCb);
    }
    if (rv != 0) {
        snprintf(why, why_len, "%s", uv_strerror(rv)); /* (of 0, libuv leaks its text) */
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
    IdemTlsCtxFree(h->tls);
    config_ref_drop(h->ref);
    rpc_admit_free(&h->admit);
    free(h);
}

/* Opens node.http_listen (when set: node.http_address's by default) and every proxy listener;
 * false with a message in err (whatever was opened is then closed, and h freed). */
static bool openListeners(struct http_server *h, char *err, size_t errlen)
{
    const struct config *cfg = h->cfg;
    const struct config_addr *addr = &cfg->node.http_listen;
    struct sockaddr_storage sa;
    char why[CONFIG_HOST_MAX + 64];
    int rv;
    if (addr->text[0] != '\0') {
        h->has_listener = true;
        rv = listenOn(h, &h->listener, addr, &sa, why, sizeof why);
        if (rv != 0) {
            snprintf(err, errlen, "http listen on %s: %s", addr->text, why);
            closeListenersNow(h);
            return false;
        }
    }
    h->plisteners = xcalloc(cfg->n_proxies ? cfg->n_proxies : 1, sizeof(*h->plisteners));
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        struct proxyListener *pl = &h->plisteners[i];
        h->n_plisteners = i + 1;
        rv = listenOn(h, &pl->tcp, &cfg->proxies[i].address, &pl->sa, why, sizeof why);
        if (rv != 0) {
            snprintf(err, errlen, "proxy listen on %s: %s", cfg->proxies[i].address.text, why);
            closeListenersNow(h);
            return false;
        }
    }
    return true;
}

/* h2o's configuration (one host, one handler on "/", the error filter on its fallback path)
 * and context on h->loop. */
static void h2oSetup(struct http_server *h)
{
    h2o_config_init(&h->conf);
    h->conf.http1.upgrade_to_http2 = 0;
    h->conf.handshake_timeout = h->cfg->http.handshake_timeout_ms;
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
    h2o_context_init(&h->ctx, h->loop, &h->conf);
    h->accept_ctx.ctx = &h->ctx;
    h->accept_ctx.hosts = h->conf.hosts;
    h->tls_accept_ctx = h->accept_ctx;
    h->tls_accept_ctx.ssl_ctx = h->tls != NULL ? IdemTlsCtxSsl(h->tls) : NULL;
}

/* The TLS context of the HTTP listeners that serve TLS (tls.http, tls.proxy): tls.cert_file
 * and key_file, TLS 1.2 or later, client certificates as tls.http_client_certs says (against
 * tls.ca_file), HTTP/1.1 the one protocol offered by ALPN (the gateway serves no HTTP/2).
 * *out NULL when no listener serves TLS. False with a message placed at the tls section. */
static bool tlsSetup(const struct config *cfg, struct idem_tls_ctx **out, char *err, size_t errlen)
{
    static const h2o_iovec_t alpn[] = {{H2O_STRLIT("http/1.1")}, {NULL, 0}};
    *out = NULL;
    bool http = cfg->tls.http && cfg->node.http_address.port != 0;
    if (!http && !(cfg->tls.proxy && cfg->n_proxies > 0)) {
        return true;
    }
    enum config_client_certs cc = cfg->tls.http_client_certs;
    struct idem_tls_params p = {.role = IDEM_TLS_SERVER,
                                .cert_file = cfg->tls.cert_file,
                                .key_file = cfg->tls.key_file,
                                .ca_file = cc != CONFIG_CLIENT_CERTS_OFF ? cfg->tls.ca_file : NULL,
                                .client_cert_optional = cc == CONFIG_CLIENT_CERTS_OPTIONAL};
    char why[400];
    if (IdemTlsCtxNew(&p, out, why, sizeof why) != IDEM_OK) {
        snprintf(err, errlen, "%s: %s (the HTTP listeners' TLS: tls.%s)",
                 cfg->tls.at != NULL ? cfg->tls.at : "tls", why, http ? "http" : "proxy");
        return false;
    }
    h2o_ssl_register_alpn_protocols(IdemTlsCtxSsl(*out), alpn);
    return true;
}

/* With tls.http on and tls.rpc off, a follower's gateway still forwards the JSON API's
 * requests, bearer tokens included, to the leader's RPC address in clear: said once at start
 * when any member's RPC address is not a loopback address. */
static void warnClearForward(const struct config *cfg)
{
    bool remote = !config_addr_is_loopback(cfg->node.rpc_address.text);
    for (size_t i = 0; !remote && i < cfg->cluster.n_bootstrap; i++) {
        remote = !config_addr_is_loopback(cfg->cluster.bootstrap[i].rpc_address.text);
    }
    if (cfg->tls.http && !cfg->tls.rpc && remote) {
        log_warn("tls.http is on but tls.rpc is off: a follower forwards JSON API requests, "
                 "their bearer tokens included, to the leader's RPC address in clear; turn "
                 "tls.rpc on on every node");
    }
}

struct http_server *http_server_new(uv_loop_t *loop, struct config_ref *ref, struct service *svc,
                                    char *err, size_t errlen)
{
    const struct config *cfg = &ref->cfg;
    /* With TLS on the RPC, forwarding to the leader speaks TLS too: the leader is verified
     * against tls.ca_file (else the system CA store), and this node's certificate is its
     * client certificate where the leader asks for one (forward.h). */
    struct idem_tls_ctx *tls;
    if (!tlsSetup(cfg, &tls, err, errlen)) {
        return NULL;
    }
    struct forwarder *fwd = forwarder_new(loop, cfg->tls.rpc ? &cfg->tls : NULL, err, errlen);
    if (fwd == NULL) {
        IdemTlsCtxFree(tls);
        return NULL;
    }
    uint64_t rid_key;
    if (RAND_bytes((unsigned char *)&rid_key, sizeof rid_key) != 1) {
        snprintf(err, errlen, "http: no randomness for request ids");
        forwarder_close(fwd, NULL, NULL);
        IdemTlsCtxFree(tls);
        return NULL;
    }
    struct http_server *h = xcalloc(1, sizeof(*h));
    h->rid_key = rid_key;
    h->loop = loop;
    h->ref = config_ref_hold(ref);
    h->cfg = cfg;
    h->svc = svc;
    h->tls = tls;
    LIST_INIT(&h->jobs);
    LIST_INIT(&h->pjobs);
    LIST_INIT(&h->conns);
    /* Sized for http.max_connections (kept until a restart), so never full: its cap per
     * address alone decides. */
    rpc_admit_init(&h->admit, cfg->http.max_connections + 1, 0,
                   cfg->http.max_connections_per_address);
    if (!openListeners(h, err, errlen)) { /* h is freed */
        forwarder_close(fwd, NULL, NULL);
        return NULL;
    }
    h2oSetup(h);
    proxy_upstreams_init(h);
    h->fwd = fwd;
    service_set_leader_cb(svc, leaderKnownCb, h);
    uv_timer_init(loop, &h->stop_timer);
    h->stop_timer.data = h;
    if (h->has_listener) {
        log_info("serving %s on %s", cfg->tls.http ? "https" : "http", cfg->node.http_listen.text);
    }
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        log_info("serving proxy on %s (%zu routes%s)", cfg->proxies[i].address.text,
                 cfg->proxies[i].n_routes, cfg->tls.proxy ? ", https" : "");
    }
    warnClearForward(cfg);
    return h;
}

int http_server_load_tls(const struct http_server *h, const struct config *cfg,
                         struct idem_tls_ctx **listen, struct idem_tls_ctx **forward, char *err,
                         size_t errlen)
{
    *forward = NULL;
    *listen = NULL;
    if (h->tls != NULL && !tlsSetup(cfg, listen, err, errlen)) {
        return -1;
    }
    char why[400];
    if (h->fwd != NULL && cfg->tls.rpc &&
        forwarder_load_tls(&cfg->tls, forward, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s (forwarding to the leader: tls.rpc)",
                 cfg->tls.at != NULL ? cfg->tls.at : "tls", why);
        IdemTlsCtxFree(*listen);
        *listen = NULL;
        return -1;
    }
    return 0;
}

void http_server_set_tls(struct http_server *h, struct idem_tls_ctx *listen,
                         struct idem_tls_ctx *forward)
{
    if (listen != NULL) {
        /* Every connection accepted with the old one holds it until it closes (acceptCb), so
         * it may go now. */
        h->tls_accept_ctx.ssl_ctx = IdemTlsCtxSsl(listen);
        IdemTlsCtxFree(h->tls);
        h->tls = listen;
    }
    if (forward != NULL) {
        forwarder_set_tls(h->fwd, forward);
    }
}

void http_server_set_config(struct http_server *h, struct config_ref *ref)
{
    config_ref_drop(h->ref); /* the server's; its proxy jobs hold their own */
    h->ref = config_ref_hold(ref);
    h->cfg = &ref->cfg;
    proxy_upstreams_add(h);
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
    return h->open_listeners == 0 && h->fwd_closed && LIST_EMPTY(&h->jobs) &&
           LIST_EMPTY(&h->conns) && /* those in a TLS handshake are in no h2o list */
           LIST_EMPTY(&h->pjobs) && h2o_linklist_is_empty(&h->ctx.http1._conns) &&
           h2o_linklist_is_empty(&h->ctx.http2._conns);
}

void gateway_maybe_stopped(struct http_server *h)
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
    if (all) {
        /* Proxied upstream calls still running: cut off, or the process would wait for
         * each up to its route's upstream_timeout_ms (an hour at most). */
        proxy_cut_all(h);
        /* connections in no h2o list too: a TLS handshake that has not ended */
        struct httpConn *c;
        LIST_FOREACH(c, &h->conns, link)
        {
            uv_os_fd_t fd;
            if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) {
                shutdown(fd, SHUT_RDWR);
            }
        }
    }
    gateway_maybe_stopped(h);
}

static void listenerClosedCb(uv_handle_t *l)
{
    struct http_server *h = l->data;
    h->open_listeners--;
    gateway_maybe_stopped(h);
}

static void forwarderClosedCb(void *data)
{
    struct http_server *h = data;
    h->fwd = NULL;
    h->fwd_closed = true;
    gateway_maybe_stopped(h);
}

void http_server_stop(struct http_server *h, void (*cb)(void *data), void *data)
{
    h->stopping = true;
    service_set_leader_cb(h->svc, NULL, NULL);
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
    proxy_upstreams_dispose(h); /* every client finished with its job */
    if (h2o_timeout_is_linked(&h->ctx.http2._graceful_shutdown_timeout)) {
        h2o_timeout_unlink(&h->ctx.http2._graceful_shutdown_timeout);
    }
    h2o_context_dispose(&h->ctx);
    /* h2o's handles close on the loop; the context must outlive their callbacks. */
    uv_run(h->loop, UV_RUN_DEFAULT);
    rpc_admit_free(&h->admit); /* after the connections' close callbacks */
    h2o_config_dispose(&h->conf);
    for (size_t i = 0; i < h->n_pools; i++) { /* after the loop ran their timers' close callbacks */
        free(h->pools[i]);
    }
    free(h->pools);
    free(h->plisteners);
    IdemTlsCtxFree(h->tls); /* each connection's SSL held its own reference */
    config_ref_drop(h->ref);
    json_decref(h->acquired);
    for (unsigned i = 0; i < h->n_spare_jobs; i++) {
        free(h->spare_jobs[i]);
    }
    free(h);
}

