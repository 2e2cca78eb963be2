/* async.c: libidem's asynchronous client on a caller's libuv loop (see include/idem.h).
 *
 * Shape: one TCP connection at a time, to the node believed to lead. Every request is
 * packed once (request id, token, operation) when it is accepted; each send prefixes the
 * time left as Request.deadline_ms (protobuf lets a field come first; the body never
 * carries it). Requests are pipelined and answers, matched by request id, may come back in
 * any order. Submits are coalesced: a submit arms a zero-delay timer (`kick`), and the
 * requests accepted until it fires (at the latest in the next loop turn's timers) go out
 * together, in writes of about BATCH_BYTES (plain TCP) or as a batch of records (TLS).
 *
 * The happy path: accept → (connect) → write → answer with our id → callback → close the
 * request's deadline timer → free the request in the timer's close callback.
 *
 * Failure modes, and what happens to the requests:
 * - connect fails, the connection breaks, a frame does not decode or is too large, or the
 *   node answers with request id 0 (it could not read one of our frames, which one it does
 *   not say, and closes the connection): the connection is closed; every request written
 *   on it goes back to waiting (same id, same key, same attempt id), and a reconnect to the
 *   next seed is scheduled after a backoff (10 ms doubling to 200 ms, jittered; reset by
 *   the next answer from a leader).
 * - OUTCOME_NOT_LEADER with the leader's address: the leader becomes the candidate; the
 *   connection is replaced (at once for the first redirect since the last answer, after a
 *   backoff for the following ones, so that two nodes pointing at each other cannot spin);
 *   every request written on it is sent again to the leader.
 * - OUTCOME_NOT_LEADER without an address, OUTCOME_UNAVAILABLE: as a broken connection
 *   (next seed, after a backoff).
 * - OUTCOME_UNAVAILABLE with retry_after_ms (a leader refusing for load: its
 *   batch.max_pending_mb, or the tenant's share of it; or while it hands its leadership
 *   on, after which it redirects): that request alone waits again
 *   after at least that long (the backoff when longer), sent to the same node on the same
 *   connection; the others go on.
 * - a request's deadline passes: its callback gets IDEM_EUNAVAILABLE; an answer that comes
 *   later finds no request with its id and is dropped. Deadlines count from the submit
 *   (the loop's time is updated there, so a slow callback before it costs nothing).
 * - a connection that does not come up (connect, resolution, TLS handshake), or on which
 *   requests are outstanding but nothing arrives, for an attempt's share of their time
 *   (max(remaining / 3, IDEM_ATTEMPT_MIN_MS)): dropped by the stall watch (watchCb), its
 *   requests wait again and the next seed is tried at once: a leader that accepts but
 *   does not answer (stopped, frozen, blackholed) is left.
 * - an answer that a request exceeded the node's max_frame_bytes (IDEM_FRAME_TOO_LARGE):
 *   that request alone fails with IDEM_ETOOBIG; the connection and the others go on.
 * - an answer without a result: that request fails with IDEM_EPROTO (IdemResultFill), as
 *   a synchronous call does; the connection and the others go on.
 * - idem_async_close(): every pending callback gets IDEM_ECANCELED before it returns; then
 *   the connection, the timers and the reconnect timer close, and the close callback runs
 *   once the last handle's close callback ran (libuv frees nothing of ours before that).
 *
 * TLS: OpenSSL on memory BIOs. Bytes read from the socket go into the session's read BIO;
 * whatever the session writes (handshake, records) is taken from its write BIO and written
 * to the socket. The connection counts as up (requests are written) once the handshake
 * finished and the server's certificate and name were verified; a failed handshake is a
 * failed connection (next seed, backoff).
 *
 * Names: a numeric host is connected at once; a name is resolved with uv_getaddrinfo (on
 * libuv's thread pool) and its first address is used. A connection object is freed only
 * once both its TCP handle closed and its resolution (if any) called back. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <uv.h>

#include "internal.h"

enum areqState {
    AREQ_WAITING, /* to be written when a connection is up */
    AREQ_SENT,    /* written on `sent_on`, waiting for the answer */
    AREQ_DELAYED, /* refused by a leader for load: waiting again from `retry_at` on */
    AREQ_DONE,    /* called back; its timer is closing */
};

struct areq {
    struct idem_async *a;
    TAILQ_ENTRY(areq) link; /* in a->reqs, in acceptance order */
    uint64_t id;
    uint8_t *body; /* packed Request without deadline_ms; owned */
    size_t body_len;
    uint64_t deadline; /* uv_now() ms */
    uint64_t retry_at; /* AREQ_DELAYED: uv_now() ms */
    char *refusal;     /* the last refusal for load it got (owned), or NULL */
    uint32_t deadline_ms;
    enum areqState state;
    struct aconn *sent_on;
    uv_timer_t timer; /* the deadline */
    idem_async_cb cb;
    void *data;
};

struct aconn {
    struct idem_async *a;
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    size_t node;
    bool connected; /* TCP up and, with TLS, the handshake done: requests may be written */
    bool closing;
    bool resolving; /* a uv_getaddrinfo is outstanding (it holds a reference) */
    bool tcp_closed;
    SSL *ssl;      /* with TLS; owns rbio and wbio */
    BIO *rbio;     /* network bytes in */
    BIO *wbio;     /* network bytes out */
    uint8_t *cbuf; /* TLS: ciphertext read buffer; owned */
    uint8_t *rbuf; /* plaintext read and not yet parsed; owned */
    size_t rlen, rcap;
    uint64_t quiet_since; /* uv_now() of the last byte read (or of the start, or of the
                           * last moment nothing was owed): the stall watch's reference */
    unsigned writes;      /* uv_write()s not called back yet (flush writes when none is) */
};

struct awrite {
    uv_write_t w;
    struct aconn *conn;
    size_t len;
    uint8_t data[]; /* the frame */
};

struct idem_async {
    uv_loop_t *loop;
    struct idem_node nodes[IDEM_NODES_MAX]; /* seeds, then learned leaders */
    size_t n_nodes, n_seeds;
    size_t current;   /* the node to connect to next */
    size_t next_seed; /* the seed after `current` in rotation */
    uint8_t *token;
    size_t token_len;
    uint32_t default_deadline_ms;
    SSL_CTX *tls;          /* NULL: plain TCP */
    char *tls_server_name; /* owned; NULL: each node's host */
    uint64_t next_id;
    uint64_t rng;
    uint64_t backoff;   /* the next reconnect delay after a failure */
    unsigned redirects; /* since the last answer from a leader */
    struct aconn *conn; /* NULL: none */
    uv_timer_t reconnect;
    bool reconnect_armed;
    uv_timer_t watch;   /* the stall watch; runs (unreferenced) while requests are pending */
    uv_timer_t kick;    /* zero-delay: writes the requests submitted since it was armed */
    uv_timer_t retry;   /* due at the earliest AREQ_DELAYED request's retry_at */
    uint32_t max_frame; /* the largest request body accepted */
    TAILQ_HEAD(areqs, areq) reqs; /* accepted, not called back yet */
    size_t pending;
    unsigned handles; /* open uv handles we own: the reconnect, watch, kick and retry timers,
                       * request timers, conns (with a resolution pending, one more) */
    bool closing;
    idem_async_close_cb close_cb;
    void *close_data;
    char errmsg[IDEM_ERRMSG_LEN]; /* what the last connection failure was */
    struct idem_words words;      /* ... and each node's, since a leader last answered */
};

static void connStart(struct idem_async *a);
static void connDrop(struct idem_async *a, struct aconn *conn, size_t next, uint64_t delay);

/* ---- lifetime ------------------------------------------------------------------------ */

static void asyncFree(struct idem_async *a)
{
    for (size_t i = 0; i < a->n_nodes; i++) {
        IdemNodeFree(&a->nodes[i]);
    }
    if (a->token != NULL) {
        OPENSSL_cleanse(a->token, a->token_len);
    }
    free(a->token);
    SSL_CTX_free(a->tls);
    free(a->tls_server_name);
    free(a);
}

/* Once closing and the last handle closed: the close callback, then the memory. */
static void maybeFinish(struct idem_async *a)
{
    if (!a->closing || a->handles > 0) {
        return;
    }
    if (a->close_cb != NULL) {
        a->close_cb(a, a->close_data);
    }
    asyncFree(a);
}

static void handleClosedCb(uv_handle_t *h)
{
    struct idem_async *a = h->data;
    a->handles--;
    maybeFinish(a);
}

/* ---- addresses ------------------------------------------------------------------------- */

/* Whether the node's host is a numeric address; fills *ss when it is. */
static bool numericNode(const struct idem_node *n, struct sockaddr_storage *ss)
{
    int port = atoi(n->port);
    return uv_ip4_addr(n->host, port, (struct sockaddr_in *)ss) == 0 ||
           uv_ip6_addr(n->host, port, (struct sockaddr_in6 *)ss) == 0;
}

static size_t nodeFindOrAdd(struct idem_async *a, const char *addr)
{
    for (size_t i = 0; i < a->n_nodes; i++) {
        if (strcmp(a->nodes[i].addr, addr) == 0) {
            return i;
        }
    }
    if (a->n_nodes == IDEM_NODES_MAX) {
        return IDEM_NODES_MAX;
    }
    char why[128];
    if (IdemNodeInit(&a->nodes[a->n_nodes], addr, strlen(addr), why, sizeof why) != IDEM_OK) {
        return IDEM_NODES_MAX;
    }
    return a->n_nodes++;
}

/* ---- requests -------------------------------------------------------------------------- */

static void reqFreeCb(uv_handle_t *h)
{
    struct areq *r = h->data;
    struct idem_async *a = r->a;
    OPENSSL_cleanse(r->body, r->body_len); /* it carries the token */
    free(r->body);
    free(r->refusal);
    free(r);
    a->handles--;
    maybeFinish(a);
}

static void reqUnlink(struct idem_async *a, struct areq *r)
{
    TAILQ_REMOVE(&a->reqs, r, link);
    a->pending--;
}

/* Calls the request back (exactly once) with `status` and `res` (freed afterwards unless
 * the callback moved it), and frees the request once its timer closed. */
static void reqFinish(struct areq *r, int status, struct idem_result *res)
{
    struct idem_async *a = r->a;
    reqUnlink(a, r);
    r->state = AREQ_DONE;
    uv_timer_stop(&r->timer);
    r->cb(a, status, res, r->data);
    idem_result_free(res);
    uv_close((uv_handle_t *)&r->timer, reqFreeCb);
}

static void reqFail(struct areq *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reqFail(struct areq *r, int status, const char *fmt, ...)
{
    struct idem_result res;
    memset(&res, 0, sizeof res);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res.detail, sizeof res.detail, fmt, ap);
    va_end(ap);
    reqFinish(r, status, &res);
}

static void reqDeadlineCb(uv_timer_t *t)
{
    struct areq *r = t->data;
    struct idem_async *a = r->a;
    if (r->refusal != NULL) {
        /* A leader kept refusing it for load: that says more than other nodes' words (the
         * text is formatted before reqFail lets go of r). */
        reqFail(r, IDEM_EUNAVAILABLE, "no leader answered within %u ms (last: %.300s)",
                r->deadline_ms, r->refusal);
        return;
    }
    if (a->words.n > 1) {
        char said[IDEM_ERRMSG_LEN];
        IdemWordsJoin(&a->words, said, sizeof said);
        reqFail(r, IDEM_EUNAVAILABLE,
                "no leader answered within %u ms (each node's last answer: %.200s)", r->deadline_ms,
                said);
        return;
    }
    char last[IDEM_ERRMSG_LEN];
    snprintf(last, sizeof last, "%s", a->errmsg[0] ? a->errmsg : "no answer");
    reqFail(r, IDEM_EUNAVAILABLE, "no leader answered within %u ms (last: %.200s)", r->deadline_ms,
            last);
}

static void flush(struct idem_async *a);

static void writeCb(uv_write_t *w, int status)
{
    struct awrite *wr = (struct awrite *)w;
    struct aconn *conn = wr->conn;
    OPENSSL_cleanse(wr->data, wr->len); /* a request frame carries the token */
    free(wr);
    conn->writes--;
    if (conn->closing || conn->a->conn != conn) {
        return;
    }
    struct idem_async *a = conn->a;
    if (status < 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: write: %s", a->nodes[conn->node].addr,
                 uv_strerror(status));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
    } else if (conn->writes == 0) {
        flush(a); /* what was submitted meanwhile */
    }
}

/* Hands `wr` (taken) to the socket. When nothing is queued before it, it is sent at once
 * with send(MSG_NOSIGNAL); what the socket does not take then (or all of it, behind a
 * queued write) goes to libuv's queue, written as the socket drains. libuv writes with
 * write(2), and a write to a connection the node has closed raises SIGPIPE (EPIPE, once
 * its reset came back), which kills a program that does not ignore it: in the loop libuv
 * reads a connection's end before it writes to it again, but a write from a callback or a
 * submit would come before that read. On failure drops the connection and returns
 * W_FAILED. */
enum writeResult { W_SENT, W_QUEUED, W_FAILED };

static enum writeResult connWrite(struct aconn *conn, struct awrite *wr)
{
    struct idem_async *a = conn->a;
    wr->conn = conn;
    size_t off = 0;
    int rv = 0;
    uv_os_fd_t fd;
    if (conn->writes == 0 && uv_fileno((uv_handle_t *)&conn->tcp, &fd) == 0) {
        while (off < wr->len) {
            ssize_t n = send(fd, wr->data + off, wr->len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t)n;
                continue;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break; /* the rest goes to libuv's queue */
            }
            rv = n < 0 ? -errno : UV_EIO; /* 0 of a non-empty write: not a TCP socket's answer */
            break;
        }
        if (rv == 0 && off == wr->len) {
            OPENSSL_cleanse(wr->data, wr->len); /* a request frame carries the token */
            free(wr);
            return W_SENT;
        }
    }
    if (rv == 0) {
        uv_buf_t buf = uv_buf_init((char *)wr->data + off, (unsigned)(wr->len - off));
        rv = uv_write(&wr->w, (uv_stream_t *)&conn->tcp, &buf, 1, writeCb);
    }
    if (rv != 0) {
        OPENSSL_cleanse(wr->data, wr->len);
        free(wr);
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: write: %s", a->nodes[conn->node].addr,
                 uv_strerror(rv));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return W_FAILED;
    }
    conn->writes++;
    return W_QUEUED;
}

/* TLS: writes whatever the session has produced (handshake messages, records) to the
 * socket. Returns false when the connection was dropped. */
static bool tlsFlushOut(struct aconn *conn)
{
    size_t n = BIO_ctrl_pending(conn->wbio);
    if (n == 0) {
        return true;
    }
    struct awrite *wr = malloc(sizeof *wr + n);
    if (wr == NULL) {
        struct idem_async *a = conn->a;
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory writing to %s",
                 a->nodes[conn->node].addr);
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return false;
    }
    int got = BIO_read(conn->wbio, wr->data, (int)n);
    wr->len = got > 0 ? (size_t)got : 0;
    return connWrite(conn, wr) != W_FAILED;
}

/* The most bytes a request frame adds to its body: the length and deadline_ms. */
#define FRAME_OVERHEAD (4 + 6)
/* A batch of requests is cut into writes of about this many bytes. */
#define BATCH_BYTES 65536
/* After an allocation failure, the waiting requests are tried again this much later. */
#define KICK_RETRY_MS 10

static void kickCb(uv_timer_t *t);

/* Lays out `r`'s frame at `dst` (room for FRAME_OVERHEAD + body_len) with the time it has
 * left as deadline_ms; returns its length. */
static size_t reqFrame(struct idem_async *a, const struct areq *r, uint8_t *dst)
{
    uint64_t now = uv_now(a->loop);
    uint64_t rem = r->deadline > now ? r->deadline - now : 1;
    uint32_t dl = rem > UINT32_MAX ? UINT32_MAX : (uint32_t)rem;
    size_t pre_len = 0;
    uint8_t *pre = dst + 4;
    pre[pre_len++] = 0x10; /* field 2 (deadline_ms), varint */
    do {
        uint8_t b = dl & 0x7f;
        dl >>= 7;
        pre[pre_len++] = (uint8_t)(b | (dl ? 0x80 : 0));
    } while (dl != 0);
    size_t body = pre_len + r->body_len;
    dst[0] = (uint8_t)(body >> 24);
    dst[1] = (uint8_t)(body >> 16);
    dst[2] = (uint8_t)(body >> 8);
    dst[3] = (uint8_t)body;
    memcpy(pre + pre_len, r->body, r->body_len);
    return 4 + body;
}

/* Writes waiting requests from `*from` on, in acceptance order, as one write of about
 * BATCH_BYTES (at least one request) on the current, connected connection; `*from`
 * moves past them. A write that fails drops the connection (which puts every request
 * written on it back to waiting); returns false then, or when out of memory: the
 * requests stay waiting and the kick is armed to try again in KICK_RETRY_MS (their
 * deadlines still hold; failing them from here could call back inside idem_async_*(),
 * which the API rules out). */
static bool sendBatch(struct idem_async *a, struct areq **from)
{
    struct aconn *conn = a->conn;
    size_t cap = 0;
    struct areq *end = *from;
    for (; end != NULL && (cap == 0 || cap + FRAME_OVERHEAD + end->body_len <= BATCH_BYTES);
         end = TAILQ_NEXT(end, link)) {
        if (end->state == AREQ_WAITING) {
            cap += FRAME_OVERHEAD + end->body_len;
        }
    }
    struct areq *start = *from;
    *from = end;
    if (cap == 0) {
        return true;
    }
    struct awrite *wr = malloc(sizeof *wr + cap);
    if (wr == NULL) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory writing a request");
        uv_timer_start(&a->kick, kickCb, KICK_RETRY_MS, 0);
        return false;
    }
    size_t len = 0;
    for (struct areq *r = start; r != end; r = TAILQ_NEXT(r, link)) {
        if (r->state == AREQ_WAITING) {
            len += reqFrame(a, r, wr->data + len);
            r->state = AREQ_SENT;
            r->sent_on = conn;
        }
    }
    wr->len = len;
    if (conn->ssl == NULL) {
        return connWrite(conn, wr) == W_SENT;
    }
    size_t written = 0;
    int ok = SSL_write_ex(conn->ssl, wr->data, wr->len, &written);
    OPENSSL_cleanse(wr->data, wr->len);
    free(wr);
    if (ok != 1) {
        char ebuf[256];
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: tls write: %s", a->nodes[conn->node].addr,
                 IdemTlsError(ebuf, sizeof ebuf));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return false;
    }
    return tlsFlushOut(conn) && conn->writes == 0;
}

/* Writes waiting requests, in acceptance order, if a connection is up: batch after batch
 * (BATCH_BYTES each) while the socket takes them at once; once one waits in libuv's queue,
 * the rest wait for its writeCb. Starts a connection otherwise (unless a reconnect is
 * already scheduled). */
static void flush(struct idem_async *a)
{
    if (a->closing) {
        return;
    }
    if (a->conn == NULL) {
        if (!a->reconnect_armed && !TAILQ_EMPTY(&a->reqs)) {
            connStart(a);
        }
        return;
    }
    if (!a->conn->connected || a->conn->writes > 0) {
        return;
    }
    struct areq *from = TAILQ_FIRST(&a->reqs);
    while (from != NULL && sendBatch(a, &from)) {
    }
}

static void kickCb(uv_timer_t *t)
{
    flush(t->data);
}

/* Delayed requests whose time came wait again (and are written); the timer is set again
 * for the next one. */
static void retryCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    if (a->closing) {
        return;
    }
    uint64_t now = uv_now(a->loop), next = UINT64_MAX;
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        if (r->state != AREQ_DELAYED) {
            continue;
        }
        if (r->retry_at <= now) {
            r->state = AREQ_WAITING;
        } else if (r->retry_at < next) {
            next = r->retry_at;
        }
    }
    if (next != UINT64_MAX) {
        uv_timer_start(&a->retry, retryCb, next - now, 0);
    }
    flush(a);
}

/* Makes the retry timer due by `at` (uv_now() ms) at the latest. */
static void retryArm(struct idem_async *a, uint64_t at)
{
    uint64_t now = uv_now(a->loop);
    uint64_t in = at > now ? at - now : 0;
    if (!uv_is_active((uv_handle_t *)&a->retry) || uv_timer_get_due_in(&a->retry) > in) {
        uv_timer_start(&a->retry, retryCb, in, 0);
    }
}

/* ---- the connection -------------------------------------------------------------------- */

static void connFree(struct aconn *conn)
{
    SSL_free(conn->ssl); /* frees rbio and wbio */
    free(conn->cbuf);
    free(conn->rbuf);
    free(conn);
}

static void connClosedCb(uv_handle_t *h)
{
    struct aconn *conn = h->data;
    struct idem_async *a = conn->a;
    conn->tcp_closed = true;
    if (!conn->resolving) {
        connFree(conn);
    }
    a->handles--;
    maybeFinish(a);
}

static void connClose(struct aconn *conn)
{
    if (conn->closing) {
        return;
    }
    conn->closing = true;
    if (conn->resolving) {
        (void)uv_cancel((uv_req_t *)&conn->gai); /* its callback runs either way */
    }
    uv_close((uv_handle_t *)&conn->tcp, connClosedCb);
}

static void reconnectCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    a->reconnect_armed = false;
    if (!a->closing && a->conn == NULL && !TAILQ_EMPTY(&a->reqs)) {
        connStart(a);
    }
}

/* Drops `conn` (the current one): its sent requests wait again; the next connection goes
 * to node `next` after `delay` ms (0: on the next loop turn). */
static void connDrop(struct idem_async *a, struct aconn *conn, size_t next, uint64_t delay)
{
    if (a->errmsg[0] != '\0') {
        IdemWordsNote(&a->words, conn->node, a->errmsg); /* what made it drop this one */
    }
    if (a->conn == conn) {
        a->conn = NULL;
    }
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        if (r->state == AREQ_SENT && r->sent_on == conn) {
            r->state = AREQ_WAITING;
            r->sent_on = NULL;
        }
    }
    connClose(conn);
    if (a->closing) {
        return;
    }
    a->current = next < a->n_nodes ? next : 0;
    if (a->current < a->n_seeds) {
        a->next_seed = (a->current + 1) % a->n_seeds;
    }
    if (!TAILQ_EMPTY(&a->reqs) && !a->reconnect_armed) {
        a->reconnect_armed = true;
        uv_timer_start(&a->reconnect, reconnectCb, delay, 0);
    }
}

#define READ_CHUNK 65536

static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct aconn *conn = h->data;
    (void)suggested;
    if (conn->cbuf != NULL) {
        *buf = uv_buf_init((char *)conn->cbuf, READ_CHUNK);
        return;
    }
    size_t want = conn->rlen + READ_CHUNK;
    if (want > conn->rcap) {
        uint8_t *p = realloc(conn->rbuf, want);
        if (p == NULL) {
            *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
            return;
        }
        conn->rbuf = p;
        conn->rcap = want;
    }
    *buf = uv_buf_init((char *)conn->rbuf + conn->rlen, (unsigned)(conn->rcap - conn->rlen));
}

/* Drops the connection after a TLS failure, saying what failed. */
static void tlsFail(struct aconn *conn, const char *what)
{
    struct idem_async *a = conn->a;
    char ebuf[256];
    long vr = conn->ssl != NULL ? SSL_get_verify_result(conn->ssl) : X509_V_OK;
    if (vr != X509_V_OK) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: tls: certificate verification failed: %s",
                 a->nodes[conn->node].addr, X509_verify_cert_error_string(vr));
    } else {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s: %s", a->nodes[conn->node].addr, what,
                 IdemTlsError(ebuf, sizeof ebuf));
    }
    connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
}

/* Advances the handshake; once done, the connection is up and waiting requests are
 * written. Returns false when the connection was dropped. */
static bool tlsHandshakeStep(struct aconn *conn)
{
    ERR_clear_error();
    int r = SSL_do_handshake(conn->ssl);
    if (r == 1) {
        if (!tlsFlushOut(conn)) {
            return false;
        }
        conn->connected = true;
        flush(conn->a);
        return !conn->closing;
    }
    int e = SSL_get_error(conn->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        return tlsFlushOut(conn);
    }
    tlsFail(conn, "tls handshake");
    return false;
}

/* TLS: feeds `n` ciphertext bytes to the session and appends the plaintext to conn->rbuf.
 * Returns false when the connection was dropped. */
static bool tlsRead(struct aconn *conn, size_t n)
{
    struct idem_async *a = conn->a;
    if (BIO_write(conn->rbio, conn->cbuf, (int)n) != (int)n) {
        tlsFail(conn, "tls read");
        return false;
    }
    if (!conn->connected) {
        if (!tlsHandshakeStep(conn)) {
            return false;
        }
        if (!conn->connected) {
            return true; /* more handshake to come */
        }
    }
    for (;;) {
        if (conn->rcap - conn->rlen < 16384) {
            uint8_t *p = realloc(conn->rbuf, conn->rcap + READ_CHUNK);
            if (p == NULL) {
                IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory reading");
                connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
                return false;
            }
            conn->rbuf = p;
            conn->rcap += READ_CHUNK;
        }
        size_t got = 0;
        ERR_clear_error();
        int ok = SSL_read_ex(conn->ssl, conn->rbuf + conn->rlen, conn->rcap - conn->rlen, &got);
        if (ok == 1) {
            conn->rlen += got;
            continue;
        }
        int e = SSL_get_error(conn->ssl, ok);
        if (e == SSL_ERROR_WANT_READ) {
            break;
        }
        if (e == SSL_ERROR_ZERO_RETURN) {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: connection closed by the node",
                     a->nodes[conn->node].addr);
            connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
            return false;
        }
        tlsFail(conn, "tls read");
        return false;
    }
    return tlsFlushOut(conn); /* e.g. answers to post-handshake messages */
}

static struct areq *findSent(struct idem_async *a, struct aconn *conn, uint64_t id)
{
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        if (r->id == id) {
            return r->state == AREQ_SENT && r->sent_on == conn ? r : NULL;
        }
    }
    return NULL;
}

/* Handles one answer. Returns false when the connection was dropped. */
static bool handleAnswer(struct idem_async *a, struct aconn *conn, Idem__Response *m)
{
    const char *addr = a->nodes[conn->node].addr;
    if (m->request_id == 0) {
        /* The node could not read one of our frames and closes the connection. */
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: refused a request frame: %.200s", addr,
                 m->error ? m->error : "");
        idem__response__free_unpacked(m, NULL);
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return false;
    }
    struct areq *r = findSent(a, conn, m->request_id);
    if (r == NULL) {
        idem__response__free_unpacked(m, NULL); /* its deadline passed; dropped */
        return true;
    }
    Idem__Outcome outcome = idem_response_outcome(m);
    if (IdemFrameTooLarge(m)) {
        /* Definite: the node skipped this frame unread; sending it again cannot help. The
         * connection stays usable for the others. */
        idem__response__free_unpacked(m, NULL);
        reqFail(r, IDEM_ETOOBIG, "the request is larger than the node's max_frame_bytes");
        return !conn->closing;
    }
    uint64_t busy = outcome == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && m->result != NULL
                        ? m->result->retry_after_ms
                        : 0;
    if (busy > 0) {
        /* The node leads and refused this request for load (its pending budget, or the
         * tenant's share of it): this request alone goes to it again after that long at
         * least (the backoff, growing as after a failure, when longer); the connection and
         * the others go on. Another node would only send it back. */
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: unavailable%s%.200s", addr,
                 m->error && m->error[0] ? ": " : "", m->error ? m->error : "");
        IdemWordsNote(&a->words, conn->node, a->errmsg);
        /* The request's own last word: a->errmsg is cleared by the next answer that is
         * not a refusal, whoever it is for. */
        free(r->refusal);
        r->refusal = strdup(a->errmsg); /* NULL when out of memory: the shared text then */
        idem__response__free_unpacked(m, NULL);
        uint64_t now = uv_now(a->loop);
        uint64_t wait = IdemBackoffNext(&a->backoff, &a->rng);
        wait = wait > busy ? wait : busy;
        uint64_t left = r->deadline > now ? r->deadline - now : 0;
        r->state = AREQ_DELAYED;
        r->sent_on = NULL;
        r->retry_at = now + (wait < left ? wait : left); /* a node's 2^64-1 cannot wrap */
        retryArm(a, r->retry_at);
        return !conn->closing;
    }
    if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER ||
        outcome == IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
        size_t to = IDEM_NODES_MAX;
        if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER && m->leader_rpc_address != NULL &&
            m->leader_rpc_address[0] != '\0' && strcmp(m->leader_rpc_address, addr) != 0) {
            to = nodeFindOrAdd(a, m->leader_rpc_address);
        }
        if (to < IDEM_NODES_MAX) {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: not the leader; redirected to %s", addr,
                     a->nodes[to].addr);
            uint64_t delay =
                a->redirects++ < IDEM_REDIRECTS_FREE ? 0 : IdemBackoffNext(&a->backoff, &a->rng);
            idem__response__free_unpacked(m, NULL);
            connDrop(a, conn, to, delay);
        } else {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s%s%.200s", addr,
                     outcome == IDEM__OUTCOME__OUTCOME_UNAVAILABLE ? "unavailable"
                                                                   : "not the leader",
                     m->error && m->error[0] ? ": " : "", m->error ? m->error : "");
            idem__response__free_unpacked(m, NULL);
            connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        }
        return false;
    }
    a->backoff = IDEM_BACKOFF_MIN_MS;
    a->redirects = 0;
    a->errmsg[0] = '\0'; /* a leader answered: earlier failures are history */
    a->words.n = 0;
    struct idem_result res;
    int rv = IdemResultFill(&res, m);
    reqFinish(r, rv, &res);
    return !conn->closing;
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct aconn *conn = s->data;
    struct idem_async *a = conn->a;
    if (conn->closing || a->conn != conn) {
        return;
    }
    if (nread < 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s", a->nodes[conn->node].addr,
                 nread == UV_EOF ? "connection closed by the node" : uv_strerror((int)nread));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return;
    }
    if (nread > 0) {
        conn->quiet_since = uv_now(a->loop);
    }
    if (conn->ssl != NULL) {
        if (!tlsRead(conn, (size_t)nread)) {
            return;
        }
    } else {
        conn->rlen += (size_t)nread;
    }
    size_t off = 0;
    while (conn->rlen - off >= 4 && !conn->closing) {
        const uint8_t *p = conn->rbuf + off;
        uint32_t len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (len > IDEM_MAX_FRAME) {
            if (IdemLooksHttp(p)) {
                IdemWhyf(a->errmsg, sizeof a->errmsg,
                         "%s answers HTTP, not the idemd binary RPC (an http_address? seeds "
                         "are the nodes' rpc_address)",
                         a->nodes[conn->node].addr);
            } else {
                IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: frame of %u bytes exceeds the limit",
                         a->nodes[conn->node].addr, len);
            }
            connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
            return;
        }
        if (conn->rlen - off - 4 < len) {
            break;
        }
        Idem__Response *m = idem__response__unpack(NULL, len, p + 4);
        off += 4 + (size_t)len;
        if (m == NULL) {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: a %u-byte response does not decode",
                     a->nodes[conn->node].addr, len);
            connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
            return;
        }
        if (!handleAnswer(a, conn, m)) {
            return;
        }
    }
    if (conn->closing) {
        return;
    }
    memmove(conn->rbuf, conn->rbuf + off, conn->rlen - off);
    conn->rlen -= off;
}

/* TLS: a session on memory BIOs for `conn`, verifying the server's name. */
static bool tlsSetup(struct aconn *conn)
{
    struct idem_async *a = conn->a;
    conn->cbuf = malloc(READ_CHUNK);
    conn->ssl = SSL_new(a->tls);
    if (conn->cbuf == NULL || conn->ssl == NULL) {
        return false;
    }
    conn->rbio = BIO_new(BIO_s_mem());
    conn->wbio = BIO_new(BIO_s_mem());
    if (conn->rbio == NULL || conn->wbio == NULL) {
        BIO_free(conn->rbio);
        BIO_free(conn->wbio);
        conn->rbio = conn->wbio = NULL;
        return false;
    }
    SSL_set_bio(conn->ssl, conn->rbio, conn->wbio); /* the session owns both now */
    SSL_set_connect_state(conn->ssl);
    return IdemTlsSetPeer(conn->ssl,
                          a->tls_server_name ? a->tls_server_name : a->nodes[conn->node].host);
}

static void connectCb(uv_connect_t *req, int status)
{
    struct aconn *conn = req->data;
    struct idem_async *a = conn->a;
    if (conn->closing || a->conn != conn) {
        return;
    }
    const char *addr = a->nodes[conn->node].addr;
    int rv = status;
    if (rv == 0 && a->tls != NULL && !tlsSetup(conn)) {
        tlsFail(conn, "tls setup");
        return;
    }
    if (rv == 0) {
        rv = uv_read_start((uv_stream_t *)&conn->tcp, allocCb, readCb);
    }
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: connect: %s", addr, uv_strerror(rv));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
        return;
    }
    (void)uv_tcp_nodelay(&conn->tcp, 1);
    if (conn->ssl != NULL) {
        (void)tlsHandshakeStep(conn); /* the ClientHello; up once the server answered */
        return;
    }
    conn->connected = true;
    flush(a);
}

static void gaiCb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct aconn *conn = req->data;
    struct idem_async *a = conn->a;
    conn->resolving = false;
    a->handles--;
    if (conn->closing) {
        uv_freeaddrinfo(res);
        if (conn->tcp_closed) {
            connFree(conn);
        }
        maybeFinish(a);
        return;
    }
    int rv = status < 0 ? status : (res == NULL ? UV_EAI_NONAME : 0);
    if (rv == 0) {
        rv = uv_tcp_connect(&conn->connect_req, &conn->tcp, res->ai_addr, connectCb);
    }
    uv_freeaddrinfo(res);
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s: %s", a->nodes[conn->node].addr,
                 status < 0 ? "resolve" : "connect", uv_strerror(rv));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
    }
}

/* Opens a connection to a->current: at once for a numeric address, after resolving a
 * name otherwise. */
static void connStart(struct idem_async *a)
{
    struct aconn *conn = calloc(1, sizeof *conn);
    if (conn == NULL) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory opening a connection");
        a->reconnect_armed = true;
        uv_timer_start(&a->reconnect, reconnectCb, IDEM_BACKOFF_MAX_MS, 0);
        return;
    }
    conn->a = a;
    conn->node = a->current;
    conn->quiet_since = uv_now(a->loop);
    if (uv_tcp_init(a->loop, &conn->tcp) != 0) {
        free(conn);
        a->reconnect_armed = true;
        uv_timer_start(&a->reconnect, reconnectCb, IDEM_BACKOFF_MAX_MS, 0);
        return;
    }
    conn->tcp.data = conn;
    conn->connect_req.data = conn;
    conn->gai.data = conn;
    a->handles++;
    a->conn = conn;
    const struct idem_node *n = &a->nodes[conn->node];
    struct sockaddr_storage ss;
    int rv;
    const char *what = "connect";
    if (numericNode(n, &ss)) {
        rv =
            uv_tcp_connect(&conn->connect_req, &conn->tcp, (const struct sockaddr *)&ss, connectCb);
    } else {
        struct addrinfo hints;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        what = "resolve";
        rv = uv_getaddrinfo(a->loop, &conn->gai, gaiCb, n->host, n->port, &hints);
        if (rv == 0) {
            conn->resolving = true;
            a->handles++;
        }
    }
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s: %s", n->addr, what, uv_strerror(rv));
        connDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
    }
}

/* The stall watch: a connection that has not connected (connect, TLS handshake) or, with
 * requests outstanding on it, has read nothing for an attempt's share of their time --
 * max(remaining / 3, IDEM_ATTEMPT_MIN_MS), remaining counted from when the silence began,
 * the smallest over those requests -- is dropped: its requests wait again (same ids) and
 * the next seed is tried at once. This is what moves the client off a leader that
 * accepts connections but does not answer (stopped, frozen, blackholed). */
#define WATCH_PERIOD_MS 50

static void watchCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    if (a->closing) {
        return;
    }
    if (TAILQ_EMPTY(&a->reqs)) {
        uv_timer_stop(&a->watch);
        return;
    }
    struct aconn *conn = a->conn;
    if (conn == NULL || conn->closing) {
        return;
    }
    uint64_t now = uv_now(a->loop);
    uint64_t limit = UINT64_MAX;
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        bool owed = conn->connected ? (r->state == AREQ_SENT && r->sent_on == conn)
                                    : r->state == AREQ_WAITING;
        if (!owed) {
            continue;
        }
        uint64_t rem = r->deadline > conn->quiet_since ? r->deadline - conn->quiet_since : 0;
        uint64_t share = rem / 3 > IDEM_ATTEMPT_MIN_MS ? rem / 3 : IDEM_ATTEMPT_MIN_MS;
        if (share < limit) {
            limit = share;
        }
    }
    if (limit == UINT64_MAX) {
        conn->quiet_since = now; /* nothing owed: silence is normal */
        return;
    }
    if (now - conn->quiet_since < limit) {
        return;
    }
    const char *what = conn->connected  ? "no answer"
                       : a->tls != NULL ? "not connected (connect or tls handshake)"
                                        : "not connected";
    IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s within %" PRIu64 " ms", a->nodes[conn->node].addr,
             what, limit);
    connDrop(a, conn, a->next_seed, 0);
}

/* ---- the API --------------------------------------------------------------------------- */

int idem_async_open(uv_loop_t *loop, const struct idem_options *opts, struct idem_async **out,
                    char *why, size_t why_len)
{
    IdemWhyf(why, why_len, "%s", "");
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    *out = NULL;
    if (loop == NULL || opts == NULL) {
        IdemWhyf(why, why_len, "NULL loop or options");
        return IDEM_EINVAL;
    }
    struct idem_async *a = calloc(1, sizeof *a);
    if (a == NULL) {
        IdemWhyf(why, why_len, "out of memory");
        return IDEM_ENOMEM;
    }
    a->loop = loop;
    TAILQ_INIT(&a->reqs);
    int rv = IdemSeedsParse(opts->seeds, a->nodes, &a->n_nodes, why, why_len);
    if (rv != IDEM_OK) {
        free(a);
        return rv;
    }
    a->n_seeds = a->n_nodes;
    if (IdemTlsWanted(opts)) {
        rv = IdemTlsContext(opts, &a->tls, why, why_len);
        if (rv == IDEM_OK && opts->tls_server_name != NULL && opts->tls_server_name[0] != '\0') {
            a->tls_server_name = strdup(opts->tls_server_name);
            rv = a->tls_server_name == NULL ? IDEM_ENOMEM : IDEM_OK;
            if (rv != IDEM_OK) {
                IdemWhyf(why, why_len, "out of memory");
            }
        }
        if (rv != IDEM_OK) {
            asyncFree(a);
            return rv;
        }
    }
    if (opts->token != NULL && opts->token[0] != '\0') {
        a->token_len = strlen(opts->token);
        a->token = malloc(a->token_len);
        if (a->token == NULL) {
            asyncFree(a);
            IdemWhyf(why, why_len, "out of memory");
            return IDEM_ENOMEM;
        }
        memcpy(a->token, opts->token, a->token_len);
    }
    a->default_deadline_ms =
        opts->default_deadline_ms ? opts->default_deadline_ms : IDEM_DEFAULT_DEADLINE_MS;
    a->max_frame = IdemMaxFrame(opts);
    a->next_id = 1;
    a->rng = IdemRngSeed();
    a->backoff = IDEM_BACKOFF_MIN_MS;
    a->next_seed = a->n_seeds > 1 ? 1 : 0;
    /* The four timers, made in turn; on a failure those made are closed, and the last
     * close callback frees `a` (nothing made: freed here). */
    uv_timer_t *timers[] = {&a->reconnect, &a->watch, &a->kick, &a->retry};
    for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
        int uv = uv_timer_init(loop, timers[i]);
        if (uv != 0) {
            IdemWhyf(why, why_len, "cannot create a libuv timer: %s", uv_strerror(uv));
            if (i == 0) {
                asyncFree(a);
                return IDEM_ESYS;
            }
            a->closing = true;
            for (size_t j = 0; j < i; j++) {
                uv_close((uv_handle_t *)timers[j], handleClosedCb);
            }
            return IDEM_ESYS;
        }
        timers[i]->data = a;
        a->handles++;
    }
    uv_unref((uv_handle_t *)&a->watch); /* never what keeps the caller's loop running */
    *out = a;
    return IDEM_OK;
}

size_t idem_async_pending(const struct idem_async *a)
{
    return a == NULL ? 0 : a->pending;
}

static int submit(struct idem_async *a, const struct idem_op *op, uint32_t deadline_ms,
                  idem_async_cb cb, void *data)
{
    if (a == NULL || cb == NULL) {
        return IDEM_EINVAL;
    }
    if (a->closing) {
        return IDEM_ECLOSED;
    }
    struct idem_built b;
    char why[256];
    int rv = IdemOpBuild(op, &b, why, sizeof why);
    if (rv != IDEM_OK) {
        /* Refused here, nothing sent: not a connection failure, so not a->errmsg (which a
         * later request's deadline quotes as the last one). */
        IdemBuiltFree(&b);
        return rv;
    }
    struct areq *r = calloc(1, sizeof *r);
    if (r == NULL) {
        IdemBuiltFree(&b);
        return IDEM_ENOMEM;
    }
    r->a = a;
    r->id = a->next_id++;
    b.req.request_id = r->id;
    b.req.deadline_ms = 0; /* prefixed per send */
    b.req.auth_token.data = a->token;
    b.req.auth_token.len = a->token_len;
    r->body_len = idem__request__get_packed_size(&b.req);
    if (r->body_len > a->max_frame - 8) {
        IdemBuiltFree(&b);
        free(r);
        return IDEM_ETOOBIG;
    }
    r->body = malloc(r->body_len ? r->body_len : 1);
    if (r->body == NULL) {
        IdemBuiltFree(&b);
        free(r);
        return IDEM_ENOMEM;
    }
    idem__request__pack(&b.req, r->body);
    IdemBuiltFree(&b);
    if (uv_timer_init(a->loop, &r->timer) != 0) {
        OPENSSL_cleanse(r->body, r->body_len); /* it carries the token */
        free(r->body);
        free(r);
        return IDEM_ESYS;
    }
    a->handles++;
    r->timer.data = r;
    r->cb = cb;
    r->data = data;
    r->deadline_ms = deadline_ms ? deadline_ms : a->default_deadline_ms;
    /* The loop's cached time is as old as the start of this loop turn, which may have
     * been long (a slow callback): count the deadline from now. */
    uv_update_time(a->loop);
    r->deadline = uv_now(a->loop) + r->deadline_ms;
    r->state = AREQ_WAITING;
    uv_timer_start(&r->timer, reqDeadlineCb, r->deadline_ms, 0);
    TAILQ_INSERT_TAIL(&a->reqs, r, link);
    a->pending++;
    if (!uv_is_active((uv_handle_t *)&a->watch)) {
        if (a->conn != NULL) {
            a->conn->quiet_since = uv_now(a->loop);
        }
        uv_timer_start(&a->watch, watchCb, WATCH_PERIOD_MS, WATCH_PERIOD_MS);
    }
    /* Connected: written by the kick, with whatever else is submitted before it fires (at
     * the latest in the timers of the next loop turn; a due timer keeps the poll from
     * blocking). Not connected: starts a connection. Never calls a callback from here: a
     * write that fails at once only puts requests back to waiting. */
    if (a->conn != NULL && a->conn->connected) {
        if (!uv_is_active((uv_handle_t *)&a->kick)) {
            uv_timer_start(&a->kick, kickCb, 0, 0);
        }
    } else {
        flush(a);
    }
    return IDEM_OK;
}

int idem_async_claim(struct idem_async *a, const char *key,
                     const uint8_t fingerprint[IDEM_FINGERPRINT_LEN],
                     const struct idem_claim_opts *opts, idem_async_cb cb, void *data)
{
    char attempt[IDEM_ATTEMPT_ID_HEX + 1];
    struct idem_op op;
    if (IdemClaimOp(key, fingerprint, opts, attempt, &op) != IDEM_OK) {
        return IDEM_ESYS;
    }
    return submit(a, &op, opts != NULL ? opts->deadline_ms : 0, cb, data);
}

int idem_async_complete(struct idem_async *a, const char *key, uint64_t token, int completion,
                        const struct idem_response *response, uint32_t deadline_ms,
                        idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_COMPLETE,
                         .key = key,
                         .token = token,
                         .completion = completion,
                         .response = response};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_release(struct idem_async *a, const char *key, uint64_t token, uint32_t deadline_ms,
                       idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_RELEASE, .key = key, .token = token};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_renew(struct idem_async *a, const char *key, uint64_t token, uint64_t lease_ms,
                     uint32_t deadline_ms, idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_RENEW, .key = key, .token = token, .lease_ms = lease_ms};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_get(struct idem_async *a, const char *key, uint32_t deadline_ms, idem_async_cb cb,
                   void *data)
{
    struct idem_op op = {.kind = IDEM_OP_GET, .key = key};
    return submit(a, &op, deadline_ms, cb, data);
}

void idem_async_close(struct idem_async *a, idem_async_close_cb close_cb, void *data)
{
    if (a == NULL || a->closing) {
        return;
    }
    a->closing = true;
    a->close_cb = close_cb;
    a->close_data = data;
    /* Callbacks may call idem_async_* (refused: closing) or close again (a no-op). */
    while (!TAILQ_EMPTY(&a->reqs)) {
        reqFail(TAILQ_FIRST(&a->reqs), IDEM_ECANCELED, "the client was closed before an answer");
    }
    if (a->conn != NULL) {
        struct aconn *conn = a->conn;
        a->conn = NULL;
        connClose(conn);
    }
    uv_timer_stop(&a->reconnect);
    uv_close((uv_handle_t *)&a->reconnect, handleClosedCb);
    uv_timer_stop(&a->watch);
    uv_close((uv_handle_t *)&a->watch, handleClosedCb);
    uv_timer_stop(&a->kick);
    uv_close((uv_handle_t *)&a->kick, handleClosedCb);
    uv_timer_stop(&a->retry);
    uv_close((uv_handle_t *)&a->retry, handleClosedCb);
}
