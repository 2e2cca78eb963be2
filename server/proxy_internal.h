/* proxy_internal: what proxy mode's files share (proxy.c: the request, the claim and the
 * answers; proxy_record.c: service calls, lease renewal and recording the upstream's answer;
 * proxy_upstream.c: the upstream client). Nothing else includes it. */
#ifndef IDEM_SERVER_PROXY_INTERNAL_H
#define IDEM_SERVER_PROXY_INTERNAL_H

#include <openssl/evp.h>

#include "fingerprint.h"
#include "gateway_internal.h"
#include "service.h"

/* An upstream answer's header. */
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

/* Where a job's upstream call is (proxy_upstream.c): NONE → CONNECTING → SENT → ENDED, or
 * CONNECTING → ENDED (not reached, or cannot hash). Only CONNECTING and SENT run. */
enum pjUpstream {
    PJ_UP_NONE,       /* not started (a claim in flight, or answered without one) */
    PJ_UP_CONNECTING, /* started: connecting, nothing sent yet */
    PJ_UP_SENT,       /* connected: the request may have reached the upstream */
    PJ_UP_ENDED,      /* answered completely, failed or timed out */
};

struct proxyJob {
    struct http_server *h;
    struct config_ref *ref; /* held: the configuration route and tenant are in */
    const struct config_proxy_route *route;
    const struct config_tenant *tenant;
    struct gateway_hold hold; /* the request, until answered or disposed */
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
    enum pjUpstream up;
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
    bool digest_instead; /* the answer passed on could not be stored: its digest was */
    bool caller_named;   /* the record's key is the caller's namespaced one (identity headers) */
    EVP_MD_CTX *sha;
    uint8_t sha_out[32];
    /* what to answer once the record op is done */
    enum pjAfter after;
    int err_status;
    const char *err_code;
    const char *err_msg;
    /* the one service call in flight (proxy_call), kept packed for retries and forwarding */
    service_done_cb call_cb;
    uint8_t *call_packed; /* owned; holds the cluster secret when one is configured */
    size_t call_len;
    bool call_in_flight;
    bool call_retry;      /* retried while no leader answers, until call_deadline */
    uint64_t call_deadline; /* uv_now() bound of the retries */
    uint64_t call_backoff_ms;
    /* lease renewal (proto/renew_plan.h; uv_now() milliseconds) */
    uv_timer_t renew_timer;
    uint64_t lease_ms;
    uint64_t lease_end;     /* when the lease last granted ends */
    uint64_t renew_last_ok; /* when the last renewal that succeeded was sent (the claim's) */
    uint64_t renew_sent;    /* when the renewal in flight was sent */
    uint32_t renew_deadline_ms; /* the next renewal's deadline */
    bool renew_failed;      /* the last renewal failed: the next comes soon */
    bool renewed;           /* a renewal succeeded: the lease is no longer the claim's */
    bool lease_lost;      /* a renewal found another holder: the answer is not recorded */
    bool unrecorded;      /* the answer passed on is not known to be the key's recorded one */
    bool quarantining;    /* its record quarantined (asked; cleared if that failed): no date */
    enum pjRecord record;
    bool record_waiting;  /* the upstream ended while a renewal was in flight */
    int open_handles;
    LIST_ENTRY(proxyJob) link; /* in h->pjobs */
};

/* ---- proxy.c ---- */

/* Answers an error body (docs/contract.md) with the job's Idempotency-* headers. */
void proxy_send_error(struct proxyJob *j, int status, const char *code, const char *message,
                      uint64_t retry_after_s);
/* Answers what the job ended with (the upstream's answer or its error) and finishes it. */
void proxy_answer_after(struct proxyJob *j);
/* Ends a job that has answered (or whose client is gone). */
void proxy_finish(struct proxyJob *j);
/* Detaches and returns the request to answer, or NULL when the client is gone. */
h2o_req_t *proxy_take_req(struct proxyJob *j);
/* The request's X-Request-Id, kept in the job. */
h2o_iovec_t proxy_rid(struct proxyJob *j);
/* Adds the job's Idempotency-Expires and Idempotency-Recorded headers (at most two). */
size_t proxy_answer_headers(const struct proxyJob *j, struct hdr *extra, size_t n,
                            char date[40]);

/* ---- proxy_record.c ---- */

/* The job's key digest for a log line (the key itself is never logged). */
void proxy_key_digest(const struct proxyJob *j, char kd[FP_HEX12_SIZE]);

/* Calls the service for the job (locally, else forwarded to the leader; retried for up to
 * retry_ms while no leader answers); cb may run before this returns. */
void proxy_call(struct proxyJob *j, Idem__Request *rq, service_done_cb cb, uint64_t retry_ms);
/* Releases the job's claim, then answers what the job ended with. */
void proxy_release(struct proxyJob *j);
/* Records what the upstream call ended with (after a renewal in flight), then answers. */
void proxy_record(struct proxyJob *j, enum pjRecord what);
/* Arms the renew timer for the next renewal while the upstream call runs, when and with
 * the deadline proto/renew_plan.h (libidem's rule) gives. */
void proxy_renew_next(struct proxyJob *j);

/* ---- proxy_upstream.c ---- */

/* Sends the request to the upstream; j may be finished before this returns. */
void proxy_upstream_start(struct proxyJob *j);
/* Passes the upstream's answer on (every end-to-end header). */
void proxy_send_upstream(struct proxyJob *j);
/* Whether the upstream call runs (PJ_UP_CONNECTING or PJ_UP_SENT). */
bool proxy_upstream_running(const struct proxyJob *j);
/* The node stops and its grace ended (gateway.c): a running upstream call is cut off, as at
 * its deadline, so that the process exits within the grace, not upstream_timeout_ms. The
 * caller is answered 503 (its connection is closing); the record is not asked to change (a
 * stopping node no longer calls the cluster): it stays processing until its lease ends, a
 * crashed node's outcome. Logged. */
void proxy_upstream_cut(struct proxyJob *j);
/* Header names never forwarded to the upstream. */
bool proxy_forward_skips(const char *name, size_t len);

#endif
