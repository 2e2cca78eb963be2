/* forward: RPC client connections and calls (see forward.h).
 *
 * Happy path: forward_call packs the request once (without a request id, with
 * Request.forwarded set for the leader's metrics) and attaches a call to the connection for
 * its address, opening it if there is none; the frame goes out once the connection is open
 * (calls made while connecting are queued on it), with the forwarder's own request id
 * prepended as protobuf field 1 (the packed body omits a zero id, and a repeated scalar
 * field's last value wins anyway). Frames are gathered per connection and written once per
 * loop turn, after its I/O callbacks (a uv_check handle), as the RPC server writes its
 * answers: a follower forwarding a burst of HTTP claims makes one system call for all of
 * them, not one each. The answer is matched by id; the call's callback runs and the call is
 * freed once its deadline timer is closed.
 *
 * Failure modes: the connection cannot be opened, is reset, closed by the peer, or sends a
 * frame that is too large or does not decode: every call on it fails with a reason and the
 * connection is dropped (the next call opens a new one). The deadline passes: the call
 * fails; a late answer for its id is ignored. NOT_LEADER naming another address: the call
 * moves to that address once. forwarder_close: every call fails, every connection closes.
 * Nothing from a request or answer is logged.
 *
 * TLS (a forwarder made with a tls_ctx): each connection has a tls_conn (tls.h) between the
 * socket and the frame buffer, checking that the leader's certificate names the IP address
 * it is reached at. Once TCP is connected the client's handshake starts; frames are
 * written only once it has finished (calls made before then wait on the connection, as
 * while connecting). Reads land in a ciphertext buffer, are fed to the engine and
 * decrypted into the frame buffer; every frame written is encrypted and the engine's
 * output written as one write. A handshake or verification failure fails the connection's
 * calls like any connection failure, and is logged with OpenSSL's reason (never peer
 * bytes). Closing sends close_notify when the socket can take it at once. */
#include "forward.h"

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "config.h"
#include "frame.h"
#include "log.h"
#include "tls.h"
#include "xmalloc.h"

#define FWD_TLS_READ 65536 /* ciphertext read buffer of a TLS connection */

struct fwdCall;

/* A connection's life; every change asserts the state it leaves. */
enum fwdConnState {
    FWD_CONNECTING,  /* TCP connecting: calls wait on it */
    FWD_HANDSHAKING, /* TLS only: TCP up, the handshake running; calls still wait */
    FWD_OPEN,        /* frames may be written */
    FWD_CLOSING,     /* the handle is closing; freed in its close callback */
};

struct fwdConn {
    struct forwarder *f;
    char addr[CONFIG_ADDR_MAX + 1];
    uv_tcp_t tcp;
    uv_connect_t connect;
    enum fwdConnState state;
    uint8_t *buf;
    size_t len, cap;
    struct tls_conn *tls;  /* NULL without TLS */
    uint8_t *cipher;       /* TLS only: FWD_TLS_READ bytes that reads land in */
    bool tls_failed;       /* TLS only: the stream is broken, no close_notify */
    LIST_HEAD(, fwdCall) calls; /* calls waiting for an answer on this connection */
    struct fwdWrite *out;  /* frames gathered this loop turn, not written (nor encrypted) yet */
    size_t out_len, out_cap;
    bool queued; /* on f->flush: frames (or TLS records) to write this loop turn */
    SLIST_ENTRY(fwdConn) flush_link;
    LIST_ENTRY(fwdConn) link; /* in f->conns */
};

/* A call's life: waiting for its connection, written on it, or answered (its timer
 * closing). */
enum fwdCallState {
    CALL_QUEUED,  /* on conn->calls, not written yet (the connection is not open) */
    CALL_WRITTEN, /* its frame gathered for (or written on) conn */
    CALL_DONE,    /* its callback ran; no longer on any connection */
};

struct fwdCall {
    struct forwarder *f;
    struct fwdConn *conn; /* NULL once finished */
    uint64_t id;          /* the forwarder's request id on the wire */
    uint64_t orig_id;     /* the caller's request id, restored in the answer */
    uint8_t *body;        /* packed Request without request_id; owned */
    size_t body_len;
    enum fwdCallState state;
    int redirects_left;
    uv_timer_t timer;
    forward_cb cb;
    void *data;
    LIST_ENTRY(fwdCall) link; /* on conn->calls */
};

struct forwarder {
    uv_loop_t *loop;
    uint32_t max_frame;
    struct tls_ctx *tls; /* owned; NULL: plain TCP */
    uint64_t next_id;
    LIST_HEAD(, fwdConn) conns;
    size_t n_calls; /* calls not yet freed (their timers close asynchronously) */
    SLIST_HEAD(, fwdConn) flush; /* connections with frames to write this loop turn */
    uv_check_t flusher;    /* writes them, after the turn's I/O callbacks */
    uv_idle_t awake;       /* active while any wait: the poll does not block */
    int handles_open;      /* flusher and awake, until forwarder_close closes them */
    bool closing;
    void (*close_cb)(void *data);
    void *close_data;
};

struct fwdWrite {
    uv_write_t req;
    uint8_t data[];
};

static void forwarderMaybeFree(struct forwarder *f)
{
    if (f->closing && LIST_EMPTY(&f->conns) && f->n_calls == 0 && f->handles_open == 0) {
        void (*cb)(void *) = f->close_cb;
        void *data = f->close_data;
        tls_ctx_free(f->tls);
        free(f);
        if (cb) {
            cb(data);
        }
    }
}

/* ---- calls ----------------------------------------------------------------------------- */

static void callTimerClosedCb(uv_handle_t *h)
{
    struct fwdCall *c = h->data;
    struct forwarder *f = c->f;
    free(c->body);
    free(c);
    f->n_calls--;
    forwarderMaybeFree(f);
}

static void callUnlink(struct fwdCall *c)
{
    struct fwdConn *k = c->conn;
    if (k == NULL) {
        return;
    }
    LIST_REMOVE(c, link);
    c->conn = NULL;
}

/* Answers the call exactly once and frees it (after its timer closes). */
static void callFinish(struct fwdCall *c, const Idem__Response *resp, const char *err)
{
    if (c->state == CALL_DONE) {
        return;
    }
    c->state = CALL_DONE;
    callUnlink(c);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, callTimerClosedCb);
    c->cb(c->data, resp, err);
}

static void connFail(struct fwdConn *k, const char *why);

/* A call's deadline passed. When it was the last call waiting on a connection that never
 * opened (a connect or TLS handshake that hangs), that connection is dropped too, so that
 * the next call starts a fresh one instead of queueing behind it. */
static void callDeadlineCb(uv_timer_t *t)
{
    struct fwdCall *c = t->data;
    struct fwdConn *k = c->conn;
    callFinish(c, NULL, "deadline passed");
    if (k != NULL && (k->state == FWD_CONNECTING || k->state == FWD_HANDSHAKING) &&
        LIST_EMPTY(&k->calls)) {
        connFail(k, "deadline passed");
    }
}

/* ---- connections ----------------------------------------------------------------------- */

static void connClosedCb(uv_handle_t *h)
{
    struct fwdConn *k = h->data;
    struct forwarder *f = k->f;
    assert(k->state == FWD_CLOSING && LIST_EMPTY(&k->calls));
    if (k->queued) {
        SLIST_REMOVE(&f->flush, k, fwdConn, flush_link);
    }
    free(k->out);
    LIST_REMOVE(k, link);
    tls_conn_free(k->tls);
    free(k->cipher);
    free(k->buf);
    free(k);
    forwarderMaybeFree(f);
}

/* TLS: before closing, writes a close_notify if the socket takes it at once (a best
 * effort: the peer treats a plain EOF the same way). */
static void connTlsGoodbye(struct fwdConn *k)
{
    /* The engine holds nothing here (every write into it is flushed at once); the turn's
     * frames wait unencrypted in k->out and are dropped with it (their calls have failed). */
    if (k->tls == NULL || k->tls_failed || !tls_conn_established(k->tls) ||
        tls_conn_shutdown(k->tls) != 0) {
        return;
    }
    uint8_t out[512];
    size_t n = tls_conn_take(k->tls, out, sizeof out);
    if (n > 0) {
        uv_buf_t b = uv_buf_init((char *)out, (unsigned)n);
        (void)uv_try_write((uv_stream_t *)&k->tcp, &b, 1);
    }
}

/* Fails every call on the connection and closes it. */
static void connFail(struct fwdConn *k, const char *why)
{
    if (k->state == FWD_CLOSING) {
        return;
    }
    bool was_open = k->state == FWD_OPEN;
    k->state = FWD_CLOSING;
    while (!LIST_EMPTY(&k->calls)) {
        callFinish(LIST_FIRST(&k->calls), NULL, why);
    }
    if (was_open) {
        connTlsGoodbye(k);
    }
    uv_close((uv_handle_t *)&k->tcp, connClosedCb);
}

/* A TLS failure on k: logged with OpenSSL's reason and the leader's address, then every
 * call on k fails with `why` (static). */
static void connTlsFail(struct fwdConn *k, const char *what, const char *why)
{
    log_warn("forward: TLS connection to %s failed: %s: %s", k->addr, what,
             tls_conn_errmsg(k->tls));
    k->tls_failed = true;
    connFail(k, why);
}

static void writeCb(uv_write_t *req, int status)
{
    struct fwdConn *k = req->data;
    free(req);
    if (status != 0 && status != UV_ECANCELED) {
        connFail(k, "connection to the leader failed");
    }
}

/* Writes the n bytes at w->data; w is consumed. */
static void connWrite(struct fwdConn *k, struct fwdWrite *w, size_t n)
{
    assert(k->state != FWD_CLOSING);
    w->req.data = k;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&k->tcp, &b, 1, writeCb) != 0) {
        free(w);
        connFail(k, "connection to the leader failed");
    }
}

/* TLS: writes every byte the engine has for the network (handshake messages, records,
 * alerts) as one write. */
static void connTlsFlush(struct fwdConn *k)
{
    size_t n = tls_conn_pending(k->tls);
    if (n == 0 || k->state == FWD_CLOSING) {
        return;
    }
    struct fwdWrite *w = xmalloc(sizeof(*w) + n);
    size_t got = tls_conn_take(k->tls, w->data, n);
    connWrite(k, w, got);
}

static void flushCb(uv_check_t *h);

static void awakeCb(uv_idle_t *h)
{
    (void)h; /* only keeps the poll from blocking while frames wait */
}

/* Puts k on the flush list (once per turn), waking the flush handles if it was empty. */
static void connQueue(struct fwdConn *k)
{
    if (k->queued) {
        return;
    }
    struct forwarder *f = k->f;
    assert(k->state != FWD_CLOSING);
    if (SLIST_EMPTY(&f->flush)) {
        uv_check_start(&f->flusher, flushCb);
        uv_idle_start(&f->awake, awakeCb);
    }
    k->queued = true;
    SLIST_INSERT_HEAD(&f->flush, k, flush_link);
}

/* Writes what k gathered this turn, as one write: its frames, or the TLS engine's records. */
static void connFlush(struct fwdConn *k)
{
    if (k->state == FWD_CLOSING) {
        return;
    }
    if (k->tls != NULL) {
        /* The turn's frames as TLS records, then the engine's output as one write; the
         * buffer stays for the next turn. */
        if (k->out_len > 0) {
            int rv = tls_conn_write(k->tls, k->out->data, k->out_len);
            k->out_len = 0;
            if (rv != 0) {
                connTlsFail(k, "write", "TLS connection to the leader failed");
                return;
            }
        }
        connTlsFlush(k);
        return;
    }
    if (k->out_len == 0) {
        return;
    }
    struct fwdWrite *w = k->out;
    size_t n = k->out_len;
    k->out = NULL;
    k->out_len = k->out_cap = 0;
    connWrite(k, w, n);
}

/* After the turn's I/O callbacks: every connection's frames of this turn go out in one
 * write each, not one system call per frame. A write that fails fails its connection's
 * calls, whose callbacks may queue new frames: those go out on the next turn. */
static void flushCb(uv_check_t *h)
{
    struct forwarder *f = h->data;
    struct fwdConn *list = SLIST_FIRST(&f->flush);
    SLIST_INIT(&f->flush);
    while (list != NULL) {
        struct fwdConn *k = list;
        list = SLIST_NEXT(k, flush_link);
        k->queued = false;
        connFlush(k);
    }
    if (SLIST_EMPTY(&f->flush)) {
        uv_check_stop(&f->flusher);
        uv_idle_stop(&f->awake);
    }
}

/* Gathers the call's frame for this turn's write: length, field 1 (request id), then the
 * packed body. */
static void connSend(struct fwdConn *k, struct fwdCall *c)
{
    assert(k->state == FWD_OPEN && c->state == CALL_QUEUED && c->conn == k);
    uint8_t idbuf[1 + FRAME_VARINT_MAX];
    size_t n = frame_varint_field_put(idbuf, FRAME_KEY_REQUEST_ID, c->id);
    size_t len = n + c->body_len;
    if (k->out_cap - k->out_len < 4 + len) {
        size_t cap = k->out_cap ? k->out_cap * 2 : 4096;
        while (cap - k->out_len < 4 + len) {
            cap *= 2;
        }
        k->out = xrealloc(k->out, sizeof(*k->out) + cap);
        k->out_cap = cap;
    }
    uint8_t *frame = k->out->data + k->out_len;
    k->out_len += FRAME_HEADER_LEN + len;
    assert(k->out_len <= k->out_cap);
    frame_header_put(frame, (uint32_t)len); /* the body was packed from a frame we took */
    memcpy(frame + FRAME_HEADER_LEN, idbuf, n);
    if (c->body_len > 0) {
        memcpy(frame + FRAME_HEADER_LEN + n, c->body, c->body_len);
    }
    c->state = CALL_WRITTEN;
    connQueue(k);
}

static void connDeliver(struct fwdConn *k, const uint8_t *p, size_t n);

/* Makes room for at least 16 KiB more in the frame buffer, up to one largest frame plus
 * slack. */
static void connGrow(struct fwdConn *k)
{
    if (k->cap - k->len < 16384) {
        size_t want = k->cap ? k->cap * 2 : 65536;
        size_t limit = (size_t)k->f->max_frame + 4 + 65536;
        if (want > limit) {
            want = limit;
        }
        if (want > k->cap) {
            k->buf = xrealloc(k->buf, want);
            k->cap = want;
        }
    }
}

static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct fwdConn *k = h->data;
    (void)suggested;
    if (k->tls != NULL) {
        if (k->cipher == NULL) {
            k->cipher = xmalloc(FWD_TLS_READ);
        }
        *buf = uv_buf_init((char *)k->cipher, FWD_TLS_READ);
        return;
    }
    connGrow(k);
    *buf = uv_buf_init((char *)k->buf + k->len, (unsigned)(k->cap - k->len));
}

/* Delivers every whole frame in the frame buffer and keeps the rest. */
static void connFrames(struct fwdConn *k)
{
    assert(k->len <= k->cap);
    size_t off = 0;
    while (k->state != FWD_CLOSING) {
        assert(off <= k->len);
        const uint8_t *p = k->buf + off;
        uint32_t n = 0;
        enum frame_status fs = frame_check(p, k->len - off, k->f->max_frame, &n);
        if (fs == FRAME_TOO_LARGE) {
            connFail(k, "the leader sent a frame larger than max_frame_bytes");
            return;
        }
        if (fs != FRAME_COMPLETE) {
            break;
        }
        off += FRAME_HEADER_LEN + (size_t)n;
        connDeliver(k, p + FRAME_HEADER_LEN, n);
    }
    if (k->state == FWD_CLOSING) {
        return;
    }
    if (off > 0) {
        memmove(k->buf, k->buf + off, k->len - off);
        k->len -= off;
    }
}

static void connSendQueued(struct fwdConn *k)
{
    assert(k->state == FWD_OPEN);
    for (struct fwdCall *c = LIST_FIRST(&k->calls); c != NULL && k->state != FWD_CLOSING;) {
        struct fwdCall *next = LIST_NEXT(c, link);
        if (c->state == CALL_QUEUED) {
            connSend(k, c);
        }
        c = next;
    }
}

/* TLS: feeds n ciphertext bytes, finishes the handshake (then sends the queued calls),
 * and decrypts everything available into the frame buffer. */
static void connTlsRead(struct fwdConn *k, const uint8_t *data, size_t n)
{
    tls_conn_feed(k->tls, data, n);
    if (k->state == FWD_HANDSHAKING) {
        int rv = tls_conn_handshake(k->tls);
        connTlsFlush(k);
        if (rv == TLS_ERROR) {
            connTlsFail(k, "handshake", "TLS handshake with the leader failed");
            return;
        }
        if (rv != 0 || k->state == FWD_CLOSING) {
            return;
        }
        k->state = FWD_OPEN;
        connSendQueued(k);
    }
    while (k->state == FWD_OPEN) {
        connGrow(k);
        int got = tls_conn_read(k->tls, k->buf + k->len, k->cap - k->len);
        if (got > 0) {
            k->len += (size_t)got;
            connFrames(k);
            continue;
        }
        connTlsFlush(k); /* an alert, if the engine made one */
        if (got == TLS_CLOSED) {
            connFail(k, "the leader closed the connection");
        } else if (got == TLS_ERROR) {
            connTlsFail(k, "read", "TLS connection to the leader failed");
        }
        return;
    }
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct fwdConn *k = s->data;
    if (nread < 0) {
        if (k->state == FWD_HANDSHAKING) {
            log_warn("forward: TLS connection to %s closed during the handshake", k->addr);
        }
        connFail(k, nread == UV_EOF ? "the leader closed the connection"
                                    : "connection to the leader failed");
        return;
    }
    if (k->tls != NULL) {
        if (nread > 0) {
            connTlsRead(k, (const uint8_t *)buf->base, (size_t)nread);
        }
        return;
    }
    k->len += (size_t)nread;
    connFrames(k);
}

static void connectCb(uv_connect_t *req, int status)
{
    struct fwdConn *k = req->data;
    if (k->state == FWD_CLOSING) {
        return;
    }
    assert(k->state == FWD_CONNECTING);
    if (status != 0) {
        connFail(k, "cannot connect to the leader");
        return;
    }
    uv_tcp_nodelay(&k->tcp, 1);
    if (uv_read_start((uv_stream_t *)&k->tcp, allocCb, readCb) != 0) {
        connFail(k, "cannot read from the leader");
        return;
    }
    if (k->tls != NULL) {
        /* The ClientHello; the calls wait for the handshake (connTlsRead). */
        k->state = FWD_HANDSHAKING;
        if (tls_conn_handshake(k->tls) == TLS_ERROR) {
            connTlsFail(k, "handshake", "TLS handshake with the leader failed");
            return;
        }
        connTlsFlush(k);
        return;
    }
    k->state = FWD_OPEN;
    connSendQueued(k);
}

/* The open (or opening) connection to addr, created when there is none. NULL when addr is
 * not an IPv4 "host:port" literal; *why (OUT) then says so. */
static struct fwdConn *connFor(struct forwarder *f, const char *addr, const char **why)
{
    struct fwdConn *k;
    LIST_FOREACH (k, &f->conns, link) {
        if (k->state != FWD_CLOSING && strcmp(k->addr, addr) == 0) {
            return k;
        }
    }
    const char *colon = strrchr(addr, ':');
    char host[CONFIG_HOST_MAX + 1];
    struct sockaddr_in sa;
    if (colon == NULL || (size_t)(colon - addr) > CONFIG_HOST_MAX ||
        strlen(addr) > CONFIG_ADDR_MAX) {
        *why = "bad leader address";
        return NULL;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end = NULL;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || port == 0 || port > 65535 ||
        uv_ip4_addr(host, (int)port, &sa) != 0) {
        *why = "bad leader address";
        return NULL;
    }
    k = xcalloc(1, sizeof(*k));
    k->f = f;
    k->state = FWD_CONNECTING;
    LIST_INIT(&k->calls);
    snprintf(k->addr, sizeof(k->addr), "%s", addr);
    if (f->tls != NULL) {
        /* The leader's certificate must carry the address it is reached at. */
        k->tls = tls_conn_new(f->tls, host);
    }
    uv_tcp_init(f->loop, &k->tcp);
    k->tcp.data = k;
    k->connect.data = k;
    LIST_INSERT_HEAD(&f->conns, k, link);
    if (uv_tcp_connect(&k->connect, &k->tcp, (const struct sockaddr *)&sa, connectCb) != 0) {
        k->state = FWD_CLOSING;
        uv_close((uv_handle_t *)&k->tcp, connClosedCb);
        *why = "cannot connect to the leader";
        return NULL;
    }
    return k;
}

/* Attaches the call to the connection for addr and sends it when the connection is open.
 * Fails the call when no connection can be made. */
static void callAttach(struct fwdCall *c, const char *addr)
{
    const char *why = NULL;
    struct fwdConn *k = connFor(c->f, addr, &why);
    if (k == NULL) {
        callFinish(c, NULL, why);
        return;
    }
    assert(c->state != CALL_DONE && c->conn == NULL);
    c->id = ++c->f->next_id;
    c->state = CALL_QUEUED;
    c->conn = k;
    LIST_INSERT_HEAD(&k->calls, c, link);
    if (k->state == FWD_OPEN) {
        connSend(k, c);
    }
}

/* One answer frame from the connection. */
static void connDeliver(struct fwdConn *k, const uint8_t *p, size_t n)
{
    Idem__Response *resp = idem__response__unpack(NULL, n, p);
    if (resp == NULL) {
        connFail(k, "the leader sent a frame that does not decode");
        return;
    }
    struct fwdCall *c;
    LIST_FOREACH (c, &k->calls, link) {
        if (c->id == resp->request_id) {
            break;
        }
    }
    if (c == NULL) {
        /* The call's deadline passed already (or the id is unknown): drop the answer. */
        idem__response__free_unpacked(resp, NULL);
        return;
    }
    if (resp->result != NULL && resp->result->outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
        c->redirects_left > 0 && resp->leader_rpc_address != NULL &&
        resp->leader_rpc_address[0] != '\0' && strcmp(resp->leader_rpc_address, k->addr) != 0) {
        c->redirects_left--;
        callUnlink(c);
        char addr[CONFIG_ADDR_MAX + 1];
        snprintf(addr, sizeof(addr), "%s", resp->leader_rpc_address);
        idem__response__free_unpacked(resp, NULL);
        callAttach(c, addr);
        return;
    }
    resp->request_id = c->orig_id;
    callFinish(c, resp, NULL);
    idem__response__free_unpacked(resp, NULL);
}

/* ---- public ---------------------------------------------------------------------------- */

static void handleClosedCb(uv_handle_t *h)
{
    struct forwarder *f = h->data;
    f->handles_open--;
    forwarderMaybeFree(f);
}

struct forwarder *forwarder_new(uv_loop_t *loop, uint32_t max_frame_bytes, struct tls_ctx *tls)
{
    struct forwarder *f = xcalloc(1, sizeof(*f));
    f->loop = loop;
    f->max_frame = max_frame_bytes;
    f->tls = tls;
    LIST_INIT(&f->conns);
    SLIST_INIT(&f->flush);
    uv_check_init(loop, &f->flusher);
    uv_idle_init(loop, &f->awake);
    f->flusher.data = f;
    f->awake.data = f;
    f->handles_open = 2;
    return f;
}

void forward_call(struct forwarder *f, const char *addr, const Idem__Request *req,
                  uint32_t deadline_ms, forward_cb cb, void *data)
{
    if (f->closing) {
        cb(data, NULL, "forwarder closed");
        return;
    }
    struct fwdCall *c = xcalloc(1, sizeof(*c));
    c->f = f;
    c->cb = cb;
    c->data = data;
    c->orig_id = req->request_id;
    c->redirects_left = 1;
    Idem__Request copy = *req;
    copy.request_id = 0; /* the wire id is prepended per send */
    copy.forwarded = true; /* the leader's /metrics: counted by the gateway, not again there */
    c->body_len = idem__request__get_packed_size(&copy);
    c->body = xmalloc(c->body_len ? c->body_len : 1);
    idem__request__pack(&copy, c->body);
    f->n_calls++;
    uv_timer_init(f->loop, &c->timer);
    c->timer.data = c;
    uv_timer_start(&c->timer, callDeadlineCb, deadline_ms ? deadline_ms : 1, 0);
    callAttach(c, addr);
}

void forwarder_close(struct forwarder *f, void (*cb)(void *data), void *data)
{
    f->closing = true;
    f->close_cb = cb;
    f->close_data = data;
    struct fwdConn *k;
    LIST_FOREACH (k, &f->conns, link) {
        connFail(k, "forwarder closed");
    }
    uv_close((uv_handle_t *)&f->flusher, handleClosedCb);
    uv_close((uv_handle_t *)&f->awake, handleClosedCb);
}
