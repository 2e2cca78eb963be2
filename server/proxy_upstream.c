/* proxy_upstream: proxy mode's upstream client (h2o's http1client over a keep-alive pool per
 * upstream, docs/h2o-notes.md §4): the request sent under the route's total deadline, the
 * answer read (its body kept up to max_inline_body, and hashed), then recorded
 * (proxy_record.c) and passed on. See proxy.c for the whole flow. */
#include "proxy_internal.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy_rules.h"
#include "xmalloc.h"

/* Idle keep-alive connections to an upstream are closed after this; it must stay below the
 * upstreams' own idle timeouts (nginx 75 s, gunicorn 2 s), so that a pooled connection is
 * rarely closed by the upstream just as a request goes out on it. */
#define HTTP_POOL_IDLE_MS 1000

/* The longest upstream_timeout_ms a route may have (config_proxy.c). */
#define PROXY_UPSTREAM_TIMEOUT_MAX_MS 3600000

/* The pool of route r's upstream, or NULL when there is none yet. */
static struct upstreamPool *poolOf(const struct http_server *h, const struct config_proxy_route *r)
{
    for (size_t i = 0; i < h->n_pools; i++) {
        struct upstreamPool *p = h->pools[i];
        if (p->port == r->upstream_port && strcmp(p->host, r->upstream_host) == 0) {
            return p;
        }
    }
    return NULL;
}

/* Moves the upstream call to `to`, asserting the transition (enum pjUpstream). */
static void pjUpTo(struct proxyJob *j, enum pjUpstream to)
{
    switch (to) {
    case PJ_UP_CONNECTING:
        assert(j->up == PJ_UP_NONE);
        break;
    case PJ_UP_SENT:
        assert(j->up == PJ_UP_CONNECTING);
        break;
    case PJ_UP_ENDED:
        assert(j->up == PJ_UP_CONNECTING || j->up == PJ_UP_SENT);
        break;
    default:
        assert(!"no transition to PJ_UP_NONE");
    }
    j->up = to;
}

bool proxy_upstream_running(const struct proxyJob *j)
{
    return j->up == PJ_UP_CONNECTING || j->up == PJ_UP_SENT;
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
        if (proxy_connection_names(u->value, u->value_len, name, nl)) {
            return true;
        }
    }
    return false;
}

void proxy_send_upstream(struct proxyJob *j)
{
    h2o_req_t *req = proxy_take_req(j);
    size_t n = 0;
    char date[40];
    struct hdr *extra = xcalloc(j->n_up_hdrs + 2, sizeof(*extra));
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
        const struct upHdr *u = &j->up_hdrs[i];
        if (gateway_replay_skips(u->name) || strcmp(u->name, "idempotency-expires") == 0 ||
            strcmp(u->name, "proxy-connection") == 0 || upConnectionNames(j, u->name)) {
            continue;
        }
        extra[n++] = (struct hdr){u->name, NULL, u->value, u->value_len};
    }
    n = proxy_answer_headers(j, extra, n, date);
    size_t clen = j->up_len;
    if (strcmp(j->method, "HEAD") == 0) {
        /* The upstream's length, or none (SIZE_MAX: h2o then sends no Content-Length, and
         * never chunks a HEAD); none either where a length is not allowed (1xx, 204). */
        clen = j->up_status < 200 || j->up_status == 204 ? SIZE_MAX : j->up_head_length;
    }
    gateway_send_raw_as(j->h, req, R_PROXY, proxy_rid(j), j->up_status, NULL,
                        (const char *)j->up_body, j->up_len, clen, extra, n);
    free(extra);
}

static void pjSetError(struct proxyJob *j, int status, const char *code, const char *msg)
{
    j->after = PJ_AFTER_ERROR;
    j->err_status = status;
    j->err_code = code;
    j->err_msg = msg;
}

/* Why an upstream call ended without its answer. */
enum pjFailure {
    PJ_FAILED,   /* the connection failed, or could not be opened */
    PJ_TIMEOUT,  /* upstream_timeout_ms passed */
    PJ_STOPPING, /* the node stops and its grace ended (proxy_upstream_cut) */
};

/* The upstream call failed: sent (PJ_UP_SENT) says whether the request may have reached it. */
static void pjUpstreamFailed(struct proxyJob *j, enum pjFailure why)
{
    bool sent = j->up == PJ_UP_SENT;
    pjUpTo(j, PJ_UP_ENDED);
    uv_timer_stop(&j->timer);
    if (why == PJ_STOPPING) {
        pjSetError(j, 503, "idempotency_unavailable", "node shutting down");
    } else if (!sent) {
        pjSetError(j, 502, "upstream_unavailable", "the upstream could not be reached");
    } else if (why == PJ_TIMEOUT) {
        pjSetError(j, 504, "upstream_timeout", "the upstream did not answer in time");
    } else {
        pjSetError(j, 502, "upstream_unavailable", "the upstream connection failed");
    }
    if (!j->idem) {
        proxy_answer_after(j);
    } else if (!sent || !j->route->on_timeout_unknown) {
        proxy_record(j, PJ_REC_RELEASE); /* nothing was sent, or the route says release */
    } else {
        proxy_record(j, PJ_REC_UNKNOWN);
    }
}

/* The upstream answered completely. */
static void pjUpstreamDone(struct proxyJob *j)
{
    assert(j->up == PJ_UP_SENT);
    pjUpTo(j, PJ_UP_ENDED);
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
        proxy_answer_after(j);
        return;
    }
    if (j->up_status >= 400 && j->up_status < 500 && !j->route->store_4xx) {
        proxy_record(j, PJ_REC_RELEASE);
        return;
    }
    proxy_record(j, PJ_REC_STORE);
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
        pjUpstreamFailed(j, isTimeoutErr(errstr) ? PJ_TIMEOUT : PJ_FAILED);
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
        pjUpstreamFailed(j, isTimeoutErr(errstr) ? PJ_TIMEOUT : PJ_FAILED);
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
        pjUpstreamFailed(j, PJ_FAILED);
        return NULL;
    }
    pjUpTo(j, PJ_UP_SENT);
    *reqbufs = j->reqbufs;
    *reqbufcnt = j->body_len > 0 ? 2 : 1;
    *method_is_head = strcmp(j->method, "HEAD") == 0;
    return pjOnHead;
}

static void pjDeadlineCb(uv_timer_t *t)
{
    struct proxyJob *j = t->data;
    if (!proxy_upstream_running(j)) {
        return;
    }
    if (j->client != NULL) { /* not inside a client callback: cancelling is safe */
        h2o_http1client_cancel(j->client);
        j->client = NULL;
    }
    pjUpstreamFailed(j, PJ_TIMEOUT);
}

void proxy_cut_all(struct http_server *h)
{
    /* A cut job is answered and finishes, but leaves h->pjobs only when its handles close. */
    for (struct proxyJob *j = LIST_FIRST(&h->pjobs), *next; j != NULL; j = next) {
        next = LIST_NEXT(j, link);
        proxy_upstream_cut(j);
    }
}

void proxy_upstream_cut(struct proxyJob *j)
{
    if (!proxy_upstream_running(j)) {
        return;
    }
    char kd[FP_HEX12_SIZE];
    proxy_key_digest(j, kd);
    log_at(LOG_LEVEL_WARN, j->rid,
           "proxy: the upstream call is cut off by the node's stop%s%s%s",
           j->idem ? "; its record stays as it is until its lease ends (key_digest " : "",
           j->idem ? kd : "", j->idem ? ")" : "");
    if (j->client != NULL) { /* called from a timer: not inside a client callback */
        h2o_http1client_cancel(j->client);
        j->client = NULL;
    }
    pjUpstreamFailed(j, PJ_STOPPING);
}

/* Header names never forwarded to the upstream: hop-by-hop, framing, the protocol's own (the
 * fence and the key are set by the proxy), and method overrides (the upstream could act on a
 * method the route did not fence; proxy.c refuses them with method_override: refuse). */
bool proxy_forward_skips(const char *name, size_t len)
{
    static const char *const skip[] = {"host",
                                       "content-length",
                                       "transfer-encoding",
                                       "connection",
                                       "keep-alive",
                                       "proxy-connection",
                                       "upgrade",
                                       "te",
                                       "trailer",
                                       "expect",
                                       "http2-settings",
                                       "idempotency-fence",
                                       "idempotency-key",
                                       "x-request-id",
                                       "x-http-method-override",
                                       "x-http-method",
                                       "x-method-override"};
    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
        if (strlen(skip[i]) == len && strncasecmp(name, skip[i], len) == 0) {
            return true;
        }
    }
    return false;
}

void proxy_upstream_start(struct proxyJob *j)
{
    struct http_server *h = j->h;
    const struct config_proxy_route *r = j->route;
    struct textBuf b;
    gateway_tb_init(&b, 1024);
    gateway_tb_printf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nX-Request-Id: %s\r\n", j->method, j->path,
                      r->upstream_hostport, j->rid);
    if (j->fwd_len > 0) {
        gateway_tb_printf(&b, "%.*s", (int)j->fwd_len, j->fwd);
    }
    if (j->idem) {
        gateway_tb_printf(&b, "Idempotency-Key: %.*s\r\nIdempotency-Fence: %llu\r\n",
                          (int)j->key_len, j->key, (unsigned long long)j->token);
    }
    if (j->has_body || j->body_len > 0) {
        gateway_tb_printf(&b, "Content-Length: %zu\r\n", j->body_len);
    }
    gateway_tb_printf(&b, "Connection: keep-alive\r\n\r\n");
    j->head = b.p;
    j->reqbufs[0] = h2o_iovec_init(b.p, b.len);
    j->reqbufs[1] = h2o_iovec_init(j->body, j->body_len);
    pjUpTo(j, PJ_UP_CONNECTING);
    j->sha = EVP_MD_CTX_new();
    if (j->sha == NULL || EVP_DigestInit_ex(j->sha, EVP_sha256(), NULL) != 1) {
        pjUpTo(j, PJ_UP_ENDED);
        pjSetError(j, 500, "internal", "cannot hash");
        if (j->idem) {
            proxy_release(j);
        } else {
            proxy_answer_after(j);
        }
        return;
    }
    uv_timer_start(&j->timer, pjDeadlineCb, r->upstream_timeout_ms, 0);
    if (j->idem) {
        proxy_renew_next(j);
    }
    struct upstreamPool *pool = poolOf(h, r);
    if (pool != NULL) { /* always, as every route's upstream has a pool */
        h2o_http1client_connect_with_pool(&j->client, j, &h->client_ctx, &pool->pool, pjOnConnect);
    } else {
        h2o_http1client_connect(&j->client, j, &h->client_ctx,
                                h2o_iovec_init(r->upstream_host, strlen(r->upstream_host)),
                                r->upstream_port, 0, pjOnConnect);
    }
}

void proxy_upstreams_add(struct http_server *h)
{
    const struct config *cfg = h->cfg;
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        for (size_t k = 0; k < cfg->proxies[i].n_routes; k++) {
            const struct config_proxy_route *r = &cfg->proxies[i].routes[k];
            if (poolOf(h, r) != NULL) {
                continue;
            }
            if (h->n_pools == h->cap_pools) {
                h->cap_pools = h->cap_pools ? 2 * h->cap_pools : 8;
                h->pools = xrealloc(h->pools, h->cap_pools * sizeof(*h->pools));
            }
            struct upstreamPool *up = xcalloc(1, sizeof(*up));
            h->pools[h->n_pools++] = up;
            memcpy(up->host, r->upstream_host, sizeof up->host);
            up->port = r->upstream_port;
            /* capacity is not enforced by h2o 2.2.5 (docs/h2o-notes.md §4) */
            h2o_socketpool_init_by_hostport(&up->pool,
                                            h2o_iovec_init(up->host, strlen(up->host)),
                                            up->port, 0, 1024);
            h2o_socketpool_set_timeout(&up->pool, h->loop, HTTP_POOL_IDLE_MS);
        }
    }
}

void proxy_upstreams_init(struct http_server *h)
{
    /* http1client: one per-phase io timeout no shorter than any route's total deadline, so
     * that the route's own deadline timer decides (docs/h2o-notes.md §4): the longest a
     * route may set, as a reload may raise a route's. */
    h2o_timeout_init(h->loop, &h->io_timeout, PROXY_UPSTREAM_TIMEOUT_MAX_MS);
    proxy_upstreams_add(h);
    h->client_ctx.loop = h->loop;
    h->client_ctx.getaddr_receiver = &h->ctx.receivers.hostinfo_getaddr;
    h->client_ctx.io_timeout = &h->io_timeout;
}

void proxy_upstreams_dispose(struct http_server *h)
{
    for (size_t i = 0; i < h->n_pools; i++) { /* closes the idle pooled connections */
        h2o_socketpool_dispose(&h->pools[i]->pool);
    }
    h2o_timeout_dispose(h->loop, &h->io_timeout);
}
