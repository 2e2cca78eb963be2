/* gateway_internal: what the HTTP gateway's files share (gateway.c: h2o, routes, lifecycle;
 * gateway_answer.c: answering; http_api.c: the JSON API; proxy*.c: proxy mode; metrics.c:
 * /metrics). Nothing outside them includes it; main.c uses http.h. */
#ifndef IDEM_SERVER_GATEWAY_INTERNAL_H
#define IDEM_SERVER_GATEWAY_INTERNAL_H

#include <h2o.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "forward.h"
#include "http.h"
#include "reqstats.h"
#include "rpc_admit.h"

#define HTTP_BODY_MAX (1u << 20) /* our own 413 above this (docs/contract.md) */

enum route {
    R_HEALTHZ,
    R_LIVEZ,
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

/* Metric label values: a route's name, an Idem__Outcome's name (gateway.c). */
extern const char *const gateway_route_names[R_N];
extern const char *const gateway_outcome_names[REQSTATS_OUTCOMES];

struct httpMetrics {
    uint64_t http[R_N][600]; /* by route and status */
    /* The gateway's data-plane figures (transport "http"): answers to JSON API and proxy
     * requests by service outcome (a forwarded one by the leader's), every 503 (fail_closed),
     * JSON API claims' durations (forwarding included). */
    struct reqstats req;
    uint64_t connections;         /* open connections of the gateway and proxy listeners */
    uint64_t connections_refused; /* closed at once: http.max_connections were open */
    uint64_t refused_address;     /* closed at once: http.max_connections_per_address were */
    uint64_t forwards_moved;      /* forwarded requests sent again to a new leader */
};

/* Keep-alive connections to one upstream (host, port), shared by the routes that name it
 * (made at start, and for a new upstream by a reload; kept until the server is freed). */
struct upstreamPool {
    char host[16]; /* config_proxy_route.upstream_host */
    uint16_t port;
    h2o_socketpool_t pool; /* must not move: its connections point at it */
};

/* A proxy listener; its configuration is cfg->proxies[i] (proxy_of). */
struct proxyListener {
    uv_tcp_t tcp;
    struct sockaddr_storage sa; /* the address bound */
};

LIST_HEAD(httpJobList, httpJob);
#define HTTP_SPARE_JOBS 256
LIST_HEAD(proxyJobList, proxyJob);
LIST_HEAD(httpConnList, httpConn);

struct idem_tls_ctx;

struct http_server {
    uv_loop_t *loop;
    /* The connections per address (rpc_admit.c's count, used for its per-address cap only:
     * http.max_connections is checked on its own, and nothing is evicted). */
    struct rpc_admit admit;
    struct config_ref *ref;   /* held: the configuration served (reloads swap it) */
    const struct config *cfg; /* &ref->cfg */
    struct service *svc;
    struct forwarder *fwd;
    h2o_globalconf_t conf;
    h2o_context_t ctx; /* must not move: embeds uv handles */
    h2o_accept_ctx_t accept_ctx;     /* the plain-TCP listeners' */
    h2o_accept_ctx_t tls_accept_ctx; /* the TLS ones' (tls.http, tls.proxy): ssl_ctx set */
    struct idem_tls_ctx *tls;        /* their certificate and key; NULL when none serves TLS */
    struct httpConnList conns;       /* every accepted connection not yet closed */
    uv_tcp_t listener;          /* node.http_address; bound when has_listener */
    bool has_listener;
    struct proxyListener *plisteners; /* cfg->n_proxies */
    size_t n_plisteners;
    int open_listeners;         /* listeners not yet closed */
    h2o_timeout_t io_timeout;   /* http1client's per-phase timeout (proxy mode) */
    h2o_http1client_ctx_t client_ctx;
    struct upstreamPool **pools; /* one per distinct upstream of the proxy routes */
    size_t n_pools, cap_pools;
    struct proxyJobList pjobs;  /* proxy requests not yet finished (proxy.c) */
    uint64_t secret_warned_ms; /* last warning about a refused cluster secret */
    uint64_t clear_warned_ms;  /* last warning about a secret not sent in clear */
    uv_timer_t stop_timer;
    bool stopping;
    bool fwd_closed;
    uint64_t stop_started_ms;
    void (*stop_cb)(void *data);
    void *stop_data;
    struct httpJobList jobs;    /* JSON API requests handed to the service (http_api.c) */
    struct httpMetrics m;
    uint64_t rid_key;  /* drawn at start: new request ids (gateway.c, requestId) */
    uint64_t rid_next; /* the counter they are made from */
    uint8_t rnd[512];  /* OpenSSL's random bytes drawn ahead for attempt ids (gateway_random) */
    size_t rnd_left;   /* the last rnd_left of them not yet handed out */
    json_t *acquired;  /* http_api.c: a claim's acquired answer, refilled in place per answer */
    /* http_api.c: finished jobs kept for the next requests (a burst of answers frees many at
     * once, more than malloc's per-thread cache holds); freed with the server. */
    struct httpJob *spare_jobs[HTTP_SPARE_JOBS];
    unsigned n_spare_jobs;
};

/* A job's hold on the h2o request it answers, for a job that may outlive it: a
 * back-reference in the request's pool, cleared by whichever side goes first
 * (docs/h2o-notes.md §3). */
struct gateway_hold {
    h2o_req_t *req;              /* NULL once h2o disposed the request, or once taken */
    struct gateway_hold **slot;  /* in req->pool, pointing here; NULL with req */
};

/* Holds req (the hold must not move while it holds one). */
void gateway_hold(struct gateway_hold *hd, h2o_req_t *req);
/* Lets go of the request and returns it to answer, or NULL when h2o disposed it. */
h2o_req_t *gateway_hold_take(struct gateway_hold *hd);

/* An extra response header; name and value are copied into the request's pool. */
struct hdr {
    const char *name; /* lower case */
    const char *orig; /* case printed on HTTP/1, or NULL */
    const char *value;
    size_t value_len;
};

/* A growable text buffer (/metrics, the proxy's request heads). */
struct textBuf {
    char *p;
    size_t len, cap;
};

/* An empty buffer with room for cap bytes. */
void gateway_tb_init(struct textBuf *b, size_t cap);
__attribute__((format(printf, 2, 3))) void gateway_tb_printf(struct textBuf *b, const char *fmt,
                                                             ...);

/* ---- answering (gateway_answer.c) ---- */

void gateway_send_raw_as(struct http_server *h, h2o_req_t *req, enum route route,
                         h2o_iovec_t rid, int status, const char *ctype, const char *body,
                         size_t len, size_t content_length, const struct hdr *extra,
                         size_t n_extra);
void gateway_send_raw(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                      int status, const char *ctype, const char *body, size_t len,
                      const struct hdr *extra, size_t n_extra);
void gateway_send_json(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                       int status, json_t *body, const struct hdr *extra, size_t n_extra);
void gateway_send_error(struct http_server *h, h2o_req_t *req, enum route route,
                        h2o_iovec_t rid, int status, const char *code, const char *message,
                        uint64_t retry_after_s);
/* The error body of docs/http-api.md: RFC 9457 problem details of req (its path the
 * instance) with code, message and request_id (http_conv.h); NULL message: the title. */
json_t *gateway_error_body(h2o_req_t *req, int status, const char *code, const char *message,
                           h2o_iovec_t rid);
void gateway_send_error_with(struct http_server *h, h2o_req_t *req, enum route route,
                             h2o_iovec_t rid, int status, const char *code, const char *message,
                             uint64_t retry_after_s, const struct hdr *more, size_t n_more);

/* An error answer of docs/contract.md. */
struct gateway_err {
    int status;
    const char *code, *message;
    uint64_t retry_after_s;
};

/* The error answer of a service outcome that means the same to the JSON API and the proxy (in
 * progress, mismatch, lease expired, outcome unknown, expired, quota exceeded) into *e; false
 * for the others. A proxy route may answer another status (in_progress_status,
 * mismatch_status). */
bool gateway_outcome_error(const Idem__Result *res, struct gateway_err *e);

/* ---- replays of stored responses (gateway_answer.c) ---- */

/* Header names a replay never copies from the stored response (nor the proxy from an
 * upstream's answer): hop-by-hop, framing, and the ones the gateway sets itself. */
bool gateway_replay_skips(const char *name);
/* allow: NULL (any), or a NULL-terminated list of the lower-case header names that may be
 * replayed; drop: NULL, or such a list of names not to replay. */
void gateway_send_replay(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                         const Idem__StoredResponse *r, const char *const *allow,
                         const char *const *drop, const struct hdr *own, size_t n_own);
bool gateway_stored_too_large(const Idem__StoredResponse *r);
void gateway_hex(const uint8_t *p, size_t n, char *out);
/* n random bytes (n at most sizeof h->rnd) from OpenSSL's generator (RAND_bytes), drawn ahead
 * a block at a time: a drawn attempt id costs a copy, not a call of the generator each.
 * false when the generator fails. */
bool gateway_random(struct http_server *h, uint8_t *out, size_t n);

/* ---- requests, forwarding, lifecycle (gateway.c) ---- */

ssize_t gateway_find_single(h2o_req_t *req, const char *name, size_t len);
/* The bearer token of req's Authorization header into *tok (empty when there is none or it
 * is not "Bearer ..."). False when it answered instead (401: the header sent twice). */
bool gateway_bearer(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                    h2o_iovec_t *tok);
bool gateway_header_item(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                         const char *name, const char *what, const char *code, h2o_iovec_t *val);
bool gateway_header_key(struct http_server *h, h2o_req_t *req, enum route route,
                        h2o_iovec_t rid, h2o_iovec_t *key);
const char *gateway_key_refusal(const char *detail);
const char *gateway_forward_target(const struct http_server *h);
void gateway_forward(struct http_server *h, const char *addr, const Idem__Request *rq,
                     forward_resend_fn resend, forward_cb cb, void *data);
void gateway_maybe_stopped(struct http_server *h);

/* ---- the parts ---- */

/* The JSON API routes, after method and body-size checks (http_api.c). */
void http_api_handle(struct http_server *h, h2o_req_t *req, enum route route, h2o_iovec_t rid,
                     h2o_iovec_t pathKey);

/* Answers GET /metrics (metrics.c). */
void metrics_answer(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid);

/* A request on proxy listener p (proxy.c). */
void proxy_handle(struct http_server *h, const struct config_proxy *p, h2o_req_t *req,
                  h2o_iovec_t rid);
/* The proxy listener a request arrived on, or NULL for the gateway's own listener. */
const struct config_proxy *proxy_of(struct http_server *h, h2o_req_t *req);
/* The upstream client's timeout and connection pools, one per distinct upstream of the
 * proxy routes (proxy_upstream.c); disposed by proxy_upstreams_dispose. */
void proxy_upstreams_init(struct http_server *h);
/* Adds a pool for each upstream of h->cfg's routes that has none yet (after a reload). */
void proxy_upstreams_add(struct http_server *h);
void proxy_upstreams_dispose(struct http_server *h);
/* The node stops and its grace ended: every proxied upstream call still running is cut off
 * (proxy_upstream_cut). */
void proxy_cut_all(struct http_server *h);

#endif
