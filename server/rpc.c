/* rpc: connections: accept and admission (rpc_admit.h), reads, writes, TLS, timeouts.
 * What a connection does with the frames it reads is rpc_frames.c's (rpc_internal.h).
 *
 * A connection is freed when its handle is closed and no request it sent is still owed an
 * answer by the service (conn.refs counts the handle, each request, each write and a
 * place in the flush list).
 *
 * Answers are coalesced: an answer frame is appended to its connection's output buffer,
 * and the connections with output are written once per loop turn, one write each, from a
 * check handle (after the loop's I/O callbacks, where answers are made). While any output
 * waits, an idle handle keeps the loop's poll from blocking, so an answer made in a timer
 * callback is written in the same turn too. Under load, one write carries every answer
 * that one commit of the log produced for that connection instead of one system call each.
 * Draining: after a bad frame, and when the server stops, a connection reads no more but
 * stays open until every request it already sent is answered and every answer written;
 * then it closes. Back-pressure: a connection with too many requests in flight, or too many
 * answer bytes queued, is not read until that drops.
 *
 * Admission (rpc_admit.h): at its accept, a connection is admitted, admitted in place of
 * the oldest unauthenticated one (which is closed), or closed at once.
 *
 * Timeouts (a sweep every SWEEP_MS): a connection that has neither completed a frame nor
 * sent a known token rpc.first_frame_timeout_ms after it was accepted (its TLS handshake
 * included), a TLS connection whose handshake has not finished rpc.handshake_timeout_ms
 * after it, a connection owed nothing (no request in flight, no answer waiting or being
 * written) that has not completed a frame for rpc.idle_timeout_ms, and one with a write
 * outstanding that has not moved for rpc.idle_timeout_ms (a peer that sends but does not
 * read) are closed, so that silent, trickling or deaf peers cannot hold the max_connections
 * slots. A connection with more than CONN_MAX_BUFFERED answer bytes waiting is closed.
 * After rpc_server_close, draining connections get CLOSE_GRACE_MS, then are closed, so
 * that a peer cannot hold the exit.
 *
 * TLS (tls.rpc in the config): the same connection with a TLS stream (libidem's
 * client/tls_stream.h, the one its clients and the forwarder use) between the socket and
 * the frame buffer. Reads land in the listener's one ciphertext buffer, are fed to the
 * connection's TLS engine and decrypted into the frame buffer (the same limits apply to
 * the plaintext); the engine keeps no more than a record's worth of buffers while the
 * connection is idle (tls_stream.c); every answer
 * frame is encrypted and the resulting records written. Whatever the engine produces on its
 * own (handshake messages, alerts) is written after each read. A TLS failure (a plain-TCP
 * client, a bad or missing client certificate, a corrupt record) closes that connection
 * only, after a best-effort write of the alert; the peer's close_notify is an end of
 * stream like EOF. A closing connection sends its own close_notify when it can. */
#include "rpc_internal.h"

#include <arpa/inet.h>
#include <assert.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "frame.h"
#include "resolver.h"
#include "log.h"
#include "tls_stream.h"
#include "xmalloc.h"

struct writeReq {
    uv_write_t req;
    struct conn *c;
    uint8_t data[];
};

/* Moves c to `to`, asserting that its life allows the change (enum connState). */
static void connSetState(struct conn *c, enum connState to)
{
    assert(c->state != CONN_CLOSING); /* final */
    assert(to != CONN_READING || c->state == CONN_PAUSED);
    assert(to != CONN_PAUSED || c->state == CONN_READING);
    assert(to != CONN_DRAINING || rpc_conn_open(c));
    c->state = to;
}

static void flushHandleClosed(uv_handle_t *h);
static void sweepClosed(uv_handle_t *h);

/* The figures and totals of every listener in this process (rpc_internal.h). */
struct rpc_stats rpc_figures;
uint64_t rpc_frame_buffer_grown;
uint64_t rpc_answer_bytes;

static uint64_t grownBytes(const struct conn *c)
{
    return c->cap > CONN_BUF_MIN ? c->cap - CONN_BUF_MIN : 0;
}

void rpc_get_stats(struct rpc_stats *out)
{
    *out = rpc_figures;
    out->answer_buffer_bytes = rpc_answer_bytes;
}

static void serverMaybeFree(struct rpc_server *r)
{
    if (r->closing && LIST_EMPTY(&r->conns) && !r->handles_closed) {
        /* The flush handles and the sweep outlive every connection: draining ones still
         * write, and the sweep ends their grace period. */
        if (!r->sweep_closing) {
            r->sweep_closing = true;
            uv_timer_stop(&r->sweep);
            uv_close((uv_handle_t *)&r->sweep, sweepClosed);
        }
        if (r->handles_closing == 0) {
            r->handles_closing = 2;
            uv_close((uv_handle_t *)&r->flusher, flushHandleClosed);
            uv_close((uv_handle_t *)&r->awake, flushHandleClosed);
        }
        return;
    }
    if (r->closing && r->listener_closed && r->sweep_closed && LIST_EMPTY(&r->conns) &&
        r->handles_closed) {
        void (*cb)(void *) = r->close_cb;
        void *data = r->close_data;
        IdemTlsCtxFree(r->tls);
        rpc_admit_free(&r->admit);
        arena_close(&r->decode);
        free(r->cipher);
        free(r);
        if (cb) {
            cb(data);
        }
    }
}

void rpc_conn_unref(struct conn *c)
{
    assert(c->refs > 0);
    if (--c->refs > 0) {
        return;
    }
    struct rpc_server *r = c->srv;
    assert(c->state == CONN_CLOSING && c->inflight == 0 && c->writes == 0 && !c->queued);
    LIST_REMOVE(c, link);
    r->n_conns--;
    rpc_figures.connections--;
    rpc_answer_bytes -= c->accounted;
    rpc_figures.frame_buffer_bytes -= c->cap;
    rpc_frame_buffer_grown -= grownBytes(c);
    IdemTlsFree(c->tls);
    free(c->buf);
    free(c->out);
    if (c->tok != NULL) {
        OPENSSL_cleanse(c->tok, c->tok_len);
        free(c->tok);
    }
    OPENSSL_cleanse(c->tok_sha256, sizeof c->tok_sha256);
    free(c);
    serverMaybeFree(r);
}

static void flushHandleClosed(uv_handle_t *h)
{
    struct rpc_server *r = h->data;
    if (--r->handles_closing == 0) {
        r->handles_closed = true;
        serverMaybeFree(r);
    }
}

static void flushCb(uv_check_t *h);
static void connAccount(struct conn *c);

static void awakeCb(uv_idle_t *h)
{
    (void)h; /* only keeps the poll from blocking while answers wait */
}

static void connClosed(uv_handle_t *h)
{
    rpc_conn_unref(h->data);
}

/* libidem's TLS stream reports running out of memory; the server aborts, as xmalloc does. */
static void tlsOutOfMemory(void)
{
    fputs("idemd: out of memory in TLS\n", stderr);
    abort();
}

/* Closing: writes what the TLS engine has queued (an alert, close_notify) if the socket
 * takes it at once; nothing waits for it. */
static void tlsTryFlush(struct conn *c)
{
    uint8_t out[4096];
    size_t n;
    while ((n = IdemTlsTake(c->tls, out, sizeof out)) > 0) {
        uv_buf_t b = uv_buf_init((char *)out, (unsigned)n);
        if (uv_try_write((uv_stream_t *)&c->tcp, &b, 1) != (int)n) {
            return;
        }
    }
}

void rpc_conn_close(struct conn *c)
{
    if (c->state == CONN_CLOSING) {
        return;
    }
    connSetState(c, CONN_CLOSING);
    connAccount(c);
    rpc_admit_remove(&c->srv->admit, &c->admit);
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (c->tls != NULL) {
        if (!c->tls_failed) {
            IdemTlsShutdown(c->tls);
        }
        tlsTryFlush(c);
    }
    uv_close((uv_handle_t *)&c->tcp, connClosed);
}

/* Closes a draining connection once nothing is owed to it any more. */
void rpc_conn_maybe_finish_drain(struct conn *c)
{
    if (c->state == CONN_DRAINING && c->inflight == 0 && c->writes == 0 && !c->queued) {
        rpc_conn_close(c);
    }
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void connQueue(struct conn *c);
static void tlsRead(struct conn *c, const uint8_t *data, size_t n);

/* Answer bytes waiting to be written: in libuv's queue, gathered this turn, in the TLS
 * engine. */
size_t rpc_conn_queued_bytes(struct conn *c)
{
    return uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->out_len +
           (c->tls != NULL ? IdemTlsPending(c->tls) : 0);
}

/* Brings rpc_answer_bytes up to date with c's answers waiting. A closing connection counts
 * none: what it holds is freed as its handle closes, and it takes no more. Called wherever
 * they change: an answer made, a write started or done, the close. */
static void connAccount(struct conn *c)
{
    size_t now = c->state == CONN_CLOSING ? 0 : rpc_conn_queued_bytes(c);
    rpc_answer_bytes = rpc_answer_bytes - c->accounted + now;
    c->accounted = now;
}

/* rpc.max_answer_buffer_mb in bytes. */
static uint64_t answerBudget(const struct conn *c)
{
    return (uint64_t)c->srv->cfg->max_answer_buffer_mb << 20;
}

/* Whether c has as many requests and answers outstanding as it may: its own limits, or,
 * once every connection's answers together hold half the node's budget, CONN_OUT_BATCH of
 * its own (a peer slow to read stops sending before the budget closes anybody). */
static bool connOverloaded(struct conn *c)
{
    size_t queued = rpc_conn_queued_bytes(c);
    return c->inflight >= CONN_MAX_INFLIGHT || queued >= CONN_MAX_QUEUED ||
           (queued >= CONN_OUT_BATCH && rpc_answer_bytes >= answerBudget(c) / 2);
}

/* Stops or resumes reading by back-pressure. Frames already taken in (c->backlog) go first:
 * once c may take requests again, the flush handle hands them on (flushCb), and reading
 * resumes only after them. */
void rpc_conn_flow_control(struct conn *c)
{
    if (!rpc_conn_open(c)) {
        return;
    }
    bool over = connOverloaded(c);
    if (c->backlog && !over) {
        connQueue(c);
    }
    bool full = over || c->backlog;
    if (full && c->state == CONN_READING) {
        connSetState(c, CONN_PAUSED);
        uv_read_stop((uv_stream_t *)&c->tcp);
    } else if (!full && c->state == CONN_PAUSED) {
        connSetState(c, CONN_READING);
        uv_read_start((uv_stream_t *)&c->tcp, allocCb, readCb);
    }
}

void rpc_conn_drain(struct conn *c)
{
    if (!rpc_conn_open(c)) {
        return;
    }
    connSetState(c, CONN_DRAINING);
    uv_read_stop((uv_stream_t *)&c->tcp);
    rpc_conn_maybe_finish_drain(c);
}

static void writeCb(uv_write_t *req, int status)
{
    struct writeReq *w = (struct writeReq *)req;
    struct conn *c = w->c;
    assert(c->writes > 0);
    c->writes--;
    c->progress_ms = c->wprogress_ms = uv_now(c->srv->loop);
    connAccount(c);
    if (status != 0) {
        rpc_conn_close(c);
    } else {
        rpc_conn_maybe_finish_drain(c);
        rpc_conn_flow_control(c);
    }
    free(w);
    rpc_conn_unref(c);
}

/* Writes n bytes (answer frames, or TLS records) that w->data holds; w is consumed. */
static void connWrite(struct conn *c, struct writeReq *w, size_t n)
{
    w->c = c;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)n);
    if (c->writes == 0) {
        c->wprogress_ms = uv_now(c->srv->loop);
    }
    c->refs++;
    c->writes++;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, writeCb) != 0) {
        free(w);
        c->refs--;
        c->writes--;
        rpc_conn_close(c);
        return;
    }
    connAccount(c); /* libuv may have written some of it at once */
}

/* Writes every byte the TLS engine has for the network, as one write. */
static void tlsFlush(struct conn *c)
{
    size_t n = IdemTlsPending(c->tls);
    if (n == 0 || c->state == CONN_CLOSING) {
        return;
    }
    struct writeReq *w = xmalloc(sizeof(*w) + n);
    size_t got = IdemTlsTake(c->tls, w->data, n);
    connWrite(c, w, got);
}

/* A TLS failure: this connection only, logged without any peer bytes, and at most once
 * per TLS_WARN_EVERY_MS (with the count of failures not logged since), so that a flood of
 * bad handshakes cannot flood the log. */
static void tlsFail(struct conn *c, const char *what)
{
    struct rpc_server *r = c->srv;
    uint64_t now = uv_now(r->loop);
    if (!r->tls_warned || now - r->tls_warn_ms >= TLS_WARN_EVERY_MS) {
        if (r->tls_suppressed > 0) {
            log_warn("rpc: TLS connection closed: %s: %s (%llu more TLS failures not logged)", what,
                     IdemTlsErrmsg(c->tls), (unsigned long long)r->tls_suppressed);
        } else {
            log_warn("rpc: TLS connection closed: %s: %s", what, IdemTlsErrmsg(c->tls));
        }
        r->tls_warned = true;
        r->tls_warn_ms = now;
        r->tls_suppressed = 0;
    } else {
        r->tls_suppressed++;
    }
    c->tls_failed = true;
    rpc_conn_close(c);
}

/* Puts c on the flush list (once per turn), waking the flush handles if it was empty. */
static void connQueue(struct conn *c)
{
    if (c->queued) {
        return;
    }
    struct rpc_server *r = c->srv;
    if (SLIST_EMPTY(&r->flush)) {
        uv_check_start(&r->flusher, flushCb);
        uv_idle_start(&r->awake, awakeCb);
    }
    c->queued = true;
    c->refs++;
    SLIST_INSERT_HEAD(&r->flush, c, flush_link);
}

/* Plain TCP: hands the gathered answer frames to the socket; c->out starts anew. */
static void connWriteOut(struct conn *c)
{
    struct writeReq *w = c->out;
    size_t n = c->out_len;
    /* The next turn's buffer starts as large as this one grew (a client that sends 64
     * requests at a time gets 64 answers each turn), within CONN_OUT_FIRST_MAX. */
    c->out_first = c->out_cap < CONN_OUT_FIRST_MAX ? c->out_cap : CONN_OUT_FIRST_MAX;
    c->out = NULL;
    c->out_len = c->out_cap = 0;
    connWrite(c, w, n);
}

/* Writes what c has gathered this turn: its output buffer, or the TLS engine's records. */
static void connFlush(struct conn *c)
{
    if (c->state == CONN_CLOSING) {
        return;
    }
    if (c->tls != NULL) {
        tlsFlush(c);
    } else if (c->out_len > 0) {
        connWriteOut(c);
    }
}

static void flushCb(uv_check_t *h)
{
    struct rpc_server *r = h->data;
    struct conn *list = SLIST_FIRST(&r->flush);
    SLIST_INIT(&r->flush);
    while (list != NULL) {
        struct conn *c = list;
        list = SLIST_NEXT(c, flush_link);
        assert(c->queued);
        c->queued = false;
        connFlush(c);
        rpc_conn_maybe_finish_drain(c);
        if (c->backlog && rpc_conn_open(c) && !connOverloaded(c)) {
            c->backlog = false;
            if (c->tls != NULL) {
                tlsRead(c, NULL, 0); /* what the engine still holds, then the buffer */
            } else {
                rpc_conn_process(c);
            }
        }
        rpc_conn_flow_control(c);
        rpc_conn_unref(c);
    }
    if (SLIST_EMPTY(&r->flush)) {
        uv_check_stop(&r->flusher);
        uv_idle_stop(&r->awake);
    }
}

/* Lays out resp (n bytes packed) as a frame at p: 4-byte big-endian length, then resp. */
static void packFrame(uint8_t *p, const Idem__Response *resp, size_t n)
{
    assert(n <= UINT32_MAX);
    frame_header_put(p, (uint32_t)n);
    size_t packed = idem__response__pack(resp, p + FRAME_HEADER_LEN);
    assert(packed == n);
    (void)packed;
}

/* After an answer was queued on c: c's own bound (CONN_MAX_BUFFERED) and the node's
 * (rpc.max_answer_buffer_mb, serverShed), which may close c or another connection.
 * Every answer goes through here: the service's and the ones this layer makes itself
 * (refused frames, unknown tokens), so that connections that send such frames and read
 * nothing cannot hold more than the budget either. */
static void serverShed(struct rpc_server *r, uint64_t budget);

static void connBoundAnswers(struct conn *c)
{
    if (c->state != CONN_CLOSING && rpc_conn_queued_bytes(c) > CONN_MAX_BUFFERED) {
        rpc_figures.answer_cuts_connection++;
        c->tls_failed = true; /* no close_notify behind megabytes it does not read */
        rpc_conn_close(c);
    }
    if (rpc_answer_bytes > answerBudget(c)) {
        serverShed(c->srv, answerBudget(c));
    }
}

/* Packs one response frame into c's output for this turn, then bounds the answers waiting
 * (connBoundAnswers): c may be closing when it returns. */
void rpc_conn_send(struct conn *c, const Idem__Response *resp)
{
    if (c->state == CONN_CLOSING) {
        return;
    }
    size_t n = idem__response__get_packed_size(resp);
    if (c->tls != NULL) {
        uint8_t *frame = xmalloc(FRAME_HEADER_LEN + n);
        packFrame(frame, resp, n);
        int rv = IdemTlsWrite(c->tls, frame, FRAME_HEADER_LEN + n);
        free(frame);
        if (rv != 0) {
            tlsFail(c, "write");
            return;
        }
        connAccount(c);
        connQueue(c);
        connBoundAnswers(c);
        return;
    }
    if (c->out_len > 0 && c->out_len + FRAME_HEADER_LEN + n > CONN_OUT_BATCH) {
        /* A turn's answers are written in pieces of about CONN_OUT_BATCH (stored responses
         * run to megabytes): the gathered ones go now, in order, this one starts anew. */
        connWriteOut(c);
        if (c->state == CONN_CLOSING) {
            return;
        }
    }
    if (c->out_cap - c->out_len < FRAME_HEADER_LEN + n) {
        size_t want = c->out_cap ? c->out_cap : c->out_first > 4096 ? c->out_first : 4096;
        while (want - c->out_len < FRAME_HEADER_LEN + n) {
            want *= 2;
        }
        c->out = xrealloc(c->out, sizeof(*c->out) + want);
        c->out_cap = want;
    }
    packFrame(c->out->data + c->out_len, resp, n);
    c->out_len += FRAME_HEADER_LEN + n;
    assert(c->out_len <= c->out_cap);
    connAccount(c);
    connQueue(c);
    connBoundAnswers(c);
}

/* Every connection's answers together hold more than rpc.max_answer_buffer_mb: closes the
 * connection that holds the most, until they are back under it (its peer, most likely one
 * that does not read, loses the answers it was owed; a client sends those requests again
 * with the same key and attempt id). Logged at most once per SHED_WARN_EVERY_MS, with the
 * count of closes not logged since. */
static void serverShed(struct rpc_server *r, uint64_t budget)
{
    while (rpc_answer_bytes > budget) {
        struct conn *most = NULL;
        struct conn *c;
        LIST_FOREACH (c, &r->conns, link) {
            if (c->state != CONN_CLOSING && (most == NULL || c->accounted > most->accounted)) {
                most = c;
            }
        }
        if (most == NULL || most->accounted == 0) {
            return; /* what is left is other listeners' (none today) */
        }
        rpc_figures.answer_cuts_node++;
        uint64_t now = uv_now(r->loop);
        if (!r->shed_warned || now - r->shed_warn_ms >= SHED_WARN_EVERY_MS) {
            char peer[IDEM_SOCKADDR_TEXT_MAX] = "an unknown address";
            struct sockaddr_storage sa;
            int len = sizeof sa;
            if (uv_tcp_getpeername(&most->tcp, (struct sockaddr *)&sa, &len) == 0 &&
                (sa.ss_family == AF_INET || sa.ss_family == AF_INET6)) {
                IdemSockaddrText((const struct sockaddr *)&sa, peer, sizeof peer);
            }
            log_warn("rpc: answers waiting to be written hold %llu MiB, over "
                     "rpc.max_answer_buffer_mb (%u): closed the connection from %s, which held "
                     "%llu KiB of them (%llu more such closes not logged)",
                     (unsigned long long)(rpc_answer_bytes >> 20), r->cfg->max_answer_buffer_mb,
                     peer, (unsigned long long)(most->accounted >> 10),
                     (unsigned long long)r->shed_suppressed);
            r->shed_warned = true;
            r->shed_warn_ms = now;
            r->shed_suppressed = 0;
        } else {
            r->shed_suppressed++;
        }
        most->tls_failed = true; /* no close_notify behind answers it does not read */
        rpc_conn_close(most);
    }
}

static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    (void)suggested;
    if (c->tls != NULL) {
        /* One buffer for every connection: the loop reads one connection at a time, and
         * what a read brought is fed to its TLS engine (which copies it) before the next. */
        struct rpc_server *r = c->srv;
        if (r->cipher == NULL) {
            r->cipher = xmalloc(CONN_TLS_READ);
        }
        *buf = uv_buf_init((char *)r->cipher, CONN_TLS_READ);
        return;
    }
    rpc_conn_reserve(c);
    *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

/* TLS: decrypts everything the engine can into the frame buffer, handing complete frames
 * to rpc_conn_process() whenever the buffer fills up. 0: the engine wants more input; 1:
 * stopped (the connection no longer reads, or has a backlog); -1: the stream ended or
 * failed (the connection is closing, its alert written). */
static int tlsDrain(struct conn *c)
{
    for (;;) {
        if (!rpc_conn_open(c)) {
            return 1;
        }
        rpc_conn_reserve(c);
        if (c->cap == c->len) {
            /* Full: the frames in it are complete (the limit leaves room for the largest
             * frame), so processing frees space. */
            rpc_conn_process(c);
            if (!rpc_conn_open(c) || c->backlog) {
                return 1; /* backlog: the rest stays in the engine until flushCb resumes */
            }
            rpc_conn_reserve(c);
            if (c->cap == c->len) {
                rpc_conn_bad_frame(c, 0, "frame buffer full");
                return 1;
            }
        }
        int got = IdemTlsRead(c->tls, c->buf + c->len, c->cap - c->len);
        if (got > 0) {
            c->len += (size_t)got;
            continue;
        }
        if (got == IDEM_TLS_WANT) {
            return 0;
        }
        tlsFlush(c); /* an alert, if the engine made one */
        if (got == IDEM_TLS_CLOSED) {
            rpc_conn_close(c);
        } else {
            tlsFail(c, IdemTlsEstablished(c->tls) ? "read" : "handshake");
        }
        return -1;
    }
}

/* TLS: feeds what was read (n bytes at data, in the listener's buffer: all of it is fed
 * before returning) and decrypts it. It is fed CONN_TLS_FEED bytes at a time, each
 * decrypted before the next, so that the engine's input buffer, which keeps the largest
 * size it grew to, holds about a record rather than a whole read. */
static void tlsRead(struct conn *c, const uint8_t *data, size_t n)
{
    size_t off = 0;
    int rc;
    do {
        size_t chunk = n - off < CONN_TLS_FEED ? n - off : CONN_TLS_FEED;
        if (chunk != 0 && IdemTlsFeed(c->tls, data + off, chunk) != 0) {
            tlsOutOfMemory(); /* the stream's buffer could not grow */
        }
        off += chunk;
        rc = tlsDrain(c);
    } while (rc == 0 && off < n);
    if (rc < 0) {
        return;
    }
    if (off < n && IdemTlsFeed(c->tls, data + off, n - off) != 0) {
        tlsOutOfMemory(); /* stopped with a backlog: the rest waits in the engine */
    }
    tlsFlush(c);
    if (c->state != CONN_CLOSING) {
        rpc_conn_process(c);
    }
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread == UV_EOF && c->tls == NULL) {
        /* The peer is done sending, maybe not reading (a half-close after its last
         * request): the requests it sent still get their answers, then the connection
         * closes (rpc_conn_drain; a peer that does not read them is cut off by the sweep). */
        rpc_conn_drain(c);
        return;
    }
    if (nread < 0) {
        connFlush(c); /* answers made this turn, before the end of the stream */
        rpc_conn_close(c);
        return;
    }
    if (c->tls != NULL) {
        if (nread > 0) {
            tlsRead(c, (const uint8_t *)buf->base, (size_t)nread);
        }
        return;
    }
    c->len += (size_t)nread;
    assert(c->len <= c->cap);
    rpc_conn_process(c);
}

/* The members' addresses, for admission (rpc_admit_set_members). */
static void serverMembers(struct rpc_server *r)
{
    struct rpc_admit_addr addrs[RPC_ADMIT_MEMBER_ADDRS];
    size_t n = service_member_addrs(r->svc, addrs, RPC_ADMIT_MEMBER_ADDRS);
    rpc_admit_set_members(&r->admit, addrs, n);
}

/* Closes connections past their first-frame, handshake or idle timeout, those whose peer
 * has not taken any of an answer for rpc.idle_timeout_ms (a write outstanding all along),
 * and, once the server is closing, those still draining CLOSE_GRACE_MS after it began.
 * Brings the members' addresses up to date (not once closing: the service may be gone). */
static void sweepCb(uv_timer_t *t)
{
    struct rpc_server *r = t->data;
    uint64_t now = uv_now(r->loop);
    if (!r->closing) {
        serverMembers(r);
    }
    struct conn *c;
    LIST_FOREACH (c, &r->conns, link) {
        if (c->state == CONN_CLOSING) {
            continue;
        }
        if (r->closing) {
            if (now - r->close_ms >= CLOSE_GRACE_MS) {
                c->tls_failed = true;
                rpc_conn_close(c);
            }
            continue;
        }
        if (c->writes > 0 && now - c->wprogress_ms >= r->cfg->idle_timeout_ms) {
            c->tls_failed = true; /* it reads nothing: no close_notify either */
            rpc_conn_close(c);
        } else if (!c->framed && !c->authed &&
                   now - c->accepted_ms >= r->cfg->first_frame_timeout_ms) {
            rpc_figures.dropped_first_frame++;
            c->tls_failed = true; /* nothing to say to it */
            rpc_conn_close(c);
        } else if (c->tls != NULL && !IdemTlsEstablished(c->tls) &&
                   now - c->accepted_ms >= r->cfg->handshake_timeout_ms) {
            c->tls_failed = true; /* nothing to say to it */
            rpc_conn_close(c);
        } else if (c->inflight == 0 && c->writes == 0 && !c->queued &&
                   now - c->progress_ms >= r->cfg->idle_timeout_ms) {
            rpc_conn_close(c);
        }
    }
}

static void sweepClosed(uv_handle_t *h)
{
    struct rpc_server *r = h->data;
    r->sweep_closed = true;
    serverMaybeFree(r);
}

/* Admits c (just accepted) by rpc_admit_decide(), closing the connection it evicts;
 * false: refused. */
static bool connAdmit(struct rpc_server *r, struct conn *c)
{
    struct sockaddr_storage sa;
    int len = sizeof sa;
    struct rpc_admit_addr addr = rpc_admit_addr_v4(0);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0) {
        (void)IdemSockaddrKey((const struct sockaddr *)&sa, addr.b); /* zeros: unknown */
    }
    struct rpc_admit_entry *old = NULL;
    switch (rpc_admit_decide(&r->admit, addr, &old)) {
    case RPC_ADMIT_REFUSE_ADDR:
        rpc_figures.refused_address++;
        return false;
    case RPC_ADMIT_REFUSE_FULL:
        rpc_figures.refused_connections++;
        return false;
    case RPC_ADMIT_EVICT: {
        struct conn *victim = (struct conn *)((char *)old - offsetof(struct conn, admit));
        rpc_figures.dropped_evicted++;
        victim->tls_failed = true;
        rpc_conn_close(victim); /* takes it out of the admission */
        break;
    }
    case RPC_ADMIT_OK:
        break;
    }
    rpc_admit_add(&r->admit, &c->admit, addr);
    return true;
}

static void acceptCb(uv_stream_t *l, int status)
{
    struct rpc_server *r = l->data;
    if (status != 0 || r->closing) {
        return;
    }
    struct conn *c = xcalloc(1, sizeof(*c));
    c->srv = r;
    c->id = ++r->conn_serial;
    c->state = CONN_READING;
    c->refs = 1;
    uv_tcp_init(r->loop, &c->tcp);
    c->tcp.data = c;
    LIST_INSERT_HEAD(&r->conns, c, link);
    r->n_conns++;
    rpc_figures.connections++;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || !connAdmit(r, c)) {
        rpc_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->accepted_ms = c->progress_ms = uv_now(r->loop);
    if (r->tls != NULL) {
        c->tls = IdemTlsNew(r->tls, NULL);
        if (c->tls == NULL) {
            tlsOutOfMemory();
        }
    }
    uv_read_start((uv_stream_t *)&c->tcp, allocCb, readCb);
}

/* The listener's TLS context from tls (tls.rpc on) into *out; NULL without. 0 or -1 (err). */
static int tlsContext(const struct config_tls *tls, struct idem_tls_ctx **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    if (tls == NULL || !tls->rpc) {
        return 0;
    }
    struct idem_tls_params tp = {.role = IDEM_TLS_SERVER,
                                 .cert_file = tls->cert_file,
                                 .key_file = tls->key_file,
                                 .ca_file = tls->ca_file};
    return IdemTlsCtxNew(&tp, out, err, errlen) == IDEM_OK ? 0 : -1;
}

int rpc_server_load_tls(const struct rpc_server *r, const struct config_tls *tls,
                        struct idem_tls_ctx **out, char *err, size_t errlen)
{
    *out = NULL;
    char why[400];
    if (r->tls != NULL && tlsContext(tls, out, why, sizeof why) != 0) {
        /* placed at the tls section, as main.c places the same failure at start */
        snprintf(err, errlen, "%s: %s (tls.rpc)", tls->at != NULL ? tls->at : "tls", why);
        return -1;
    }
    return 0;
}

void rpc_server_set_tls(struct rpc_server *r, struct idem_tls_ctx *ctx)
{
    if (ctx != NULL) {
        IdemTlsCtxFree(r->tls); /* each connection's stream holds its own reference */
        r->tls = ctx;
    }
}

void rpc_server_set_config(struct rpc_server *r, const struct config_rpc *cfg)
{
    r->cfg = cfg;
    r->cred_gen++; /* a reload: each connection's kept token is checked again (rpc_frames.c) */
}

struct rpc_server *rpc_server_new(uv_loop_t *loop, const struct config_addr *addr,
                                  const struct config_rpc *cfg, const struct config_tls *tls,
                                  struct service *svc, char *err, size_t errlen)
{
    struct idem_tls_ctx *tctx = NULL;
    if (tlsContext(tls, &tctx, err, errlen) != 0) {
        return NULL;
    }
    /* A name is resolved here, once, at start (before the loop serves anything). */
    struct sockaddr_storage sa;
    char why[CONFIG_HOST_MAX + 64];
    if (IdemSockaddrResolveNow(addr->host, addr->port, &sa, why, sizeof why) != 0) {
        snprintf(err, errlen, "rpc listen on %s: %s", addr->text, why);
        IdemTlsCtxFree(tctx);
        return NULL;
    }
    int rv;
    struct rpc_server *r = xcalloc(1, sizeof(*r));
    LIST_INIT(&r->conns);
    SLIST_INIT(&r->flush);
    r->loop = loop;
    r->cfg = cfg;
    r->svc = svc;
    r->tls = tctx;
    rpc_admit_init(&r->admit, cfg->max_connections, cfg->member_connections,
                   cfg->max_connections_per_address);
    arena_init(&r->decode, RPC_DECODE_ARENA_BYTES);
    r->decode.soft = true; /* a request that memory cannot hold is refused, as with malloc */
    serverMembers(r);
    uv_tcp_init(loop, &r->listener);
    r->listener.data = r;
    rv = uv_tcp_bind(&r->listener, (const struct sockaddr *)&sa, 0);
    if (rv == 0) {
        rv = uv_listen((uv_stream_t *)&r->listener, 511, acceptCb);
    }
    if (rv == 0) {
        uv_check_init(loop, &r->flusher);
        r->flusher.data = r;
        uv_idle_init(loop, &r->awake);
        r->awake.data = r;
        uv_timer_init(loop, &r->sweep);
        r->sweep.data = r;
        uv_timer_start(&r->sweep, sweepCb, SWEEP_MS, SWEEP_MS);
        uv_unref((uv_handle_t *)&r->sweep);
    }
    if (rv != 0) {
        snprintf(err, errlen, "rpc listen on %s: %s", addr->text, uv_strerror(rv));
        r->closing = true;
        uv_close((uv_handle_t *)&r->listener, NULL);
        /* The handle is closed on the next loop turn; the struct must outlive it. */
        uv_run(loop, UV_RUN_NOWAIT);
        IdemTlsCtxFree(tctx);
        rpc_admit_free(&r->admit);
        arena_close(&r->decode);
        free(r);
        return NULL;
    }
    return r;
}

static void listenerClosed(uv_handle_t *h)
{
    struct rpc_server *r = h->data;
    r->listener_closed = true;
    serverMaybeFree(r);
}

void rpc_server_close(struct rpc_server *r, void (*cb)(void *data), void *data)
{
    r->closing = true;
    r->close_cb = cb;
    r->close_data = data;
    r->close_ms = uv_now(r->loop);
    uv_close((uv_handle_t *)&r->listener, listenerClosed);
    /* Requests taken get their answers; frames still waiting for the in-flight cap
     * (c->backlog) get none, as bytes not read yet: the peer sees the close and retries
     * elsewhere with the same key and attempt id. */
    struct conn *c;
    LIST_FOREACH (c, &r->conns, link) {
        rpc_conn_drain(c);
    }
    serverMaybeFree(r); /* closes the sweep at once when no connection is left */
}
