/* rpc: connections and frames.
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
 * answer bytes queued, is not read until that drops. Untrusted bytes: a frame's length is
 * checked against max_frame_bytes before anything is buffered for it, the request is decoded
 * by protobuf-c, and nothing from it is logged.
 *
 * Metrics (rpc_get_stats): each request handed to the service carries a struct call, which
 * says how its answer is counted: a client's data op by outcome (a claim timed too), a data
 * op another node's gateway forwarded apart, an admin op not at all (reqstats.h).
 *
 * A frame longer than max_frame_bytes is not buffered: its request id is read from its
 * first bytes (protobuf wire format: fields 1 and 2, both varints, when they come first;
 * no length from the frame trusted; at most 22 bytes looked at), it is answered OUTCOME_INVALID
 * with result detail "frame_too_large" under that id, and its bytes are skipped as they arrive; the
 * connection carries on. When no request id can be read it is answered under id 0 and
 * the connection drains, as after any undecodable frame.
 *
 * Timeouts (a sweep every SWEEP_MS): a TLS connection whose handshake has not finished
 * rpc.handshake_timeout_ms after it was accepted, a connection owed nothing (no request
 * in flight, no answer waiting or being written) that has not completed a frame for
 * rpc.idle_timeout_ms, and one with a write outstanding that has not moved for
 * rpc.idle_timeout_ms (a peer that sends but does not read) are closed, so that silent,
 * trickling or deaf peers cannot hold the max_connections slots. A connection with more
 * than CONN_MAX_BUFFERED answer bytes waiting is closed. After rpc_server_close, draining
 * connections get CLOSE_GRACE_MS, then are closed, so that a peer cannot hold the exit.
 *
 * TLS (tls.rpc in the config): the same connection with a TLS stream (libidem's
 * client/tls_stream.h, the one its clients and the forwarder use) between the socket and
 * the frame buffer. Reads land in a ciphertext buffer, are fed to the TLS engine and
 * decrypted into the frame buffer (the same limits apply to the plaintext); every answer
 * frame is encrypted and the resulting records written. Whatever the engine produces on its
 * own (handshake messages, alerts) is written after each read. A TLS failure (a plain-TCP
 * client, a bad or missing client certificate, a corrupt record) closes that connection
 * only, after a best-effort write of the alert; the peer's close_notify is an end of
 * stream like EOF. A closing connection sends its own close_notify when it can. */
#include "rpc.h"

#include <arpa/inet.h>
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "frame.h"
#include "log.h"
#include "tls_stream.h"
#include "xmalloc.h"

#define CONN_MAX_INFLIGHT 4096      /* requests awaiting an answer */
#define CONN_MAX_QUEUED (16u << 20) /* answer bytes waiting to be written: reading pauses */
/* Answer bytes waiting to be written past which the connection is closed: reading pauses at
 * CONN_MAX_QUEUED, but the answers to requests already taken (up to CONN_MAX_INFLIGHT, each
 * up to a stored response's size) still come; a peer that does not read them is cut off
 * instead of having gigabytes buffered for it. */
#define CONN_MAX_BUFFERED (64u << 20)
/* Past rpc.max_answer_buffer_mb of answers waiting in every connection together, the
 * connection holding the most is closed (until they are back under it); from half of it, a
 * connection with CONN_OUT_BATCH or more waiting stops reading. Without it, 1024 peers
 * that do not read could make a node hold 64 GiB (CONN_MAX_BUFFERED each). */
#define SHED_WARN_EVERY_MS 10000 /* at most one warning per this for such closes */
/* After rpc_server_close, connections still draining this long are closed (a peer that does
 * not read its last answers must not hold the node's exit). */
#define CLOSE_GRACE_MS 2000
#define CONN_TLS_READ 65536         /* ciphertext read buffer of a TLS connection */
#define CONN_BUF_MIN 65536          /* a frame buffer's first size, and what it shrinks back to */
#define CONN_READ_SLACK 16384       /* room kept past a large frame, for the next read */
#define CONN_OUT_BATCH (256u << 10) /* answer bytes gathered before a write is cut */
#define SWEEP_MS 250                /* how often timeouts are checked */
#define TLS_WARN_EVERY_MS 10000     /* at most one TLS failure warning per this */

/* A connection's life. Reading and paused alternate by back-pressure (connFlowControl);
 * draining (after a bad frame, or when the server stops) reads no more and ends in closing
 * once everything owed is written; closing is final. Every change asserts the state it
 * leaves. */
enum connState {
    CONN_READING,  /* frames are read */
    CONN_PAUSED,   /* reading stopped by back-pressure */
    CONN_DRAINING, /* no more reads; close once everything owed is written */
    CONN_CLOSING,  /* the handle is closing: no more reads, no more answers */
};

struct conn {
    uv_tcp_t tcp;
    enum connState state;
    struct rpc_server *srv;
    uint8_t *buf;
    size_t len;
    size_t cap;
    int refs;             /* the open handle + requests awaiting an answer + writes + a place on the
                           * flush list */
    unsigned inflight;    /* requests awaiting an answer */
    bool backlog;         /* frames taken from the socket wait for inflight to fall below
                           * CONN_MAX_INFLIGHT (in the frame buffer, or in the TLS engine): reading
                           * stays paused, and the flush handle takes them up */
    unsigned writes;      /* answers being written */
    struct idem_tls *tls; /* NULL on a plain-TCP listener */
    uint8_t *cipher;      /* TLS only: CONN_TLS_READ bytes that reads land in */
    bool tls_failed;      /* TLS only: no close_notify, the stream is broken */
    uint64_t skip;        /* bytes of an oversized frame still to discard */
    uint64_t accepted_ms; /* uv_now() at accept */
    uint64_t progress_ms; /* uv_now() at accept, at each complete frame, each answer written */
    uint64_t wprogress_ms; /* uv_now() when a write last completed, or when one started with
                            * none outstanding: a write stuck since is the peer's not reading */
    LIST_ENTRY(conn) link; /* in the server's conns */
    struct writeReq *out; /* answer frames not yet written (plain TCP), out_len bytes */
    size_t out_len;
    size_t out_cap;
    bool queued; /* on the server's flush list (holds a reference) */
    SLIST_ENTRY(conn) flush_link;
    size_t accounted; /* its answer bytes in answer_bytes, at the last connAccount() */
};

struct rpc_server {
    uv_tcp_t listener;
    uv_loop_t *loop;
    const struct config_rpc *cfg;
    struct service *svc;
    struct idem_tls_ctx *tls; /* NULL: plain TCP */
    LIST_HEAD(, conn) conns;
    size_t n_conns;
    bool closing;
    bool listener_closed;
    uv_timer_t sweep; /* the timeouts; after rpc_server_close, the drain's grace period */
    bool sweep_closing;
    bool sweep_closed;
    uint64_t close_ms;       /* uv_now() at rpc_server_close */
    uint64_t tls_warn_ms;    /* uv_now() of the last TLS failure warning */
    uint64_t tls_suppressed; /* TLS failures not logged since then */
    bool tls_warned;
    uint64_t shed_warn_ms;    /* uv_now() of the last warning of a close for the answer cap */
    uint64_t shed_suppressed; /* such closes not logged since then */
    bool shed_warned;
    SLIST_HEAD(, conn) flush; /* connections with answers to write this loop turn */
    uv_check_t flusher;  /* writes them, after the turn's I/O callbacks */
    uv_idle_t awake;     /* active while anything waits: the poll does not block */
    int handles_closing; /* flusher and awake, once every connection is gone */
    bool handles_closed;
    void (*close_cb)(void *data);
    void *close_data;
};

struct writeReq {
    uv_write_t req;
    struct conn *c;
    uint8_t data[];
};

/* Whether c still takes frames: reading, or paused by back-pressure. */
static bool connOpen(const struct conn *c)
{
    return c->state == CONN_READING || c->state == CONN_PAUSED;
}

/* Moves c to `to`, asserting that its life allows the change (enum connState). */
static void connSetState(struct conn *c, enum connState to)
{
    assert(c->state != CONN_CLOSING); /* final */
    assert(to != CONN_READING || c->state == CONN_PAUSED);
    assert(to != CONN_PAUSED || c->state == CONN_READING);
    assert(to != CONN_DRAINING || connOpen(c));
    c->state = to;
}

static void flushHandleClosed(uv_handle_t *h);
static void sweepClosed(uv_handle_t *h);

/* Every listener's figures in this process (rpc_get_stats). */
static struct rpc_stats stats;

/* What frame buffers hold past their first CONN_BUF_MIN bytes, every connection's
 * together: what rpc.max_frame_buffer_mb bounds (connHoldFrame). */
static uint64_t frame_buffer_grown;

/* Answer bytes waiting to be written, every connection's together (connAccount). */
static uint64_t answer_bytes;

static uint64_t grownBytes(const struct conn *c)
{
    return c->cap > CONN_BUF_MIN ? c->cap - CONN_BUF_MIN : 0;
}

void rpc_get_stats(struct rpc_stats *out)
{
    *out = stats;
    out->answer_buffer_bytes = answer_bytes;
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
        free(r);
        if (cb) {
            cb(data);
        }
    }
}

static void connUnref(struct conn *c)
{
    assert(c->refs > 0);
    if (--c->refs > 0) {
        return;
    }
    struct rpc_server *r = c->srv;
    assert(c->state == CONN_CLOSING && c->inflight == 0 && c->writes == 0 && !c->queued);
    LIST_REMOVE(c, link);
    r->n_conns--;
    stats.connections--;
    answer_bytes -= c->accounted;
    stats.frame_buffer_bytes -= c->cap;
    frame_buffer_grown -= grownBytes(c);
    IdemTlsFree(c->tls);
    free(c->cipher);
    free(c->buf);
    free(c->out);
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
    connUnref(h->data);
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

static void connClose(struct conn *c)
{
    if (c->state == CONN_CLOSING) {
        return;
    }
    connSetState(c, CONN_CLOSING);
    connAccount(c);
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
static void connMaybeFinishDrain(struct conn *c)
{
    if (c->state == CONN_DRAINING && c->inflight == 0 && c->writes == 0 && !c->queued) {
        connClose(c);
    }
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void connQueue(struct conn *c);
static void connProcess(struct conn *c);
static bool connHoldFrame(struct conn *c, uint32_t n);
static void tlsRead(struct conn *c, const uint8_t *data, size_t n);

/* Answer bytes waiting to be written: in libuv's queue, gathered this turn, in the TLS
 * engine. */
static size_t connQueuedBytes(struct conn *c)
{
    return uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->out_len +
           (c->tls != NULL ? IdemTlsPending(c->tls) : 0);
}

/* Brings answer_bytes up to date with c's answers waiting. A closing connection counts
 * none: what it holds is freed as its handle closes, and it takes no more. Called wherever
 * they change: an answer made, a write started or done, the close. */
static void connAccount(struct conn *c)
{
    size_t now = c->state == CONN_CLOSING ? 0 : connQueuedBytes(c);
    answer_bytes = answer_bytes - c->accounted + now;
    c->accounted = now;
}

static uint64_t answerBudget(const struct conn *c)
{
    return (uint64_t)c->srv->cfg->max_answer_buffer_mb << 20;
}

/* Whether c has as many requests and answers outstanding as it may: its own limits, or,
 * once every connection's answers together hold half the node's budget, CONN_OUT_BATCH of
 * its own (a peer slow to read stops sending before the budget closes anybody). */
static bool connOverloaded(struct conn *c)
{
    size_t queued = connQueuedBytes(c);
    return c->inflight >= CONN_MAX_INFLIGHT || queued >= CONN_MAX_QUEUED ||
           (queued >= CONN_OUT_BATCH && answer_bytes >= answerBudget(c) / 2);
}

/* Stops or resumes reading by back-pressure. Frames already taken in (c->backlog) go first:
 * once c may take requests again, the flush handle hands them on (flushCb), and reading
 * resumes only after them. */
static void connFlowControl(struct conn *c)
{
    if (!connOpen(c)) {
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

static void connDrain(struct conn *c)
{
    if (!connOpen(c)) {
        return;
    }
    connSetState(c, CONN_DRAINING);
    uv_read_stop((uv_stream_t *)&c->tcp);
    connMaybeFinishDrain(c);
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
        connClose(c);
    } else {
        connMaybeFinishDrain(c);
        connFlowControl(c);
    }
    free(w);
    connUnref(c);
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
        connClose(c);
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
    connClose(c);
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
        connMaybeFinishDrain(c);
        if (c->backlog && connOpen(c) && !connOverloaded(c)) {
            c->backlog = false;
            if (c->tls != NULL) {
                tlsRead(c, NULL, 0); /* what the engine still holds, then the buffer */
            } else {
                connProcess(c);
            }
        }
        connFlowControl(c);
        connUnref(c);
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

/* Packs one response frame into c's output for this turn. */
static void connSend(struct conn *c, const Idem__Response *resp)
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
        size_t want = c->out_cap ? c->out_cap : 4096;
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
}

/* Every connection's answers together hold more than rpc.max_answer_buffer_mb: closes the
 * connection that holds the most, until they are back under it (its peer, most likely one
 * that does not read, loses the answers it was owed; a client sends those requests again
 * with the same key and attempt id). Logged at most once per SHED_WARN_EVERY_MS, with the
 * count of closes not logged since. */
static void serverShed(struct rpc_server *r, uint64_t budget)
{
    while (answer_bytes > budget) {
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
        stats.answer_cuts_node++;
        uint64_t now = uv_now(r->loop);
        if (!r->shed_warned || now - r->shed_warn_ms >= SHED_WARN_EVERY_MS) {
            char peer[64] = "an unknown address";
            struct sockaddr_storage sa;
            int len = sizeof sa;
            if (uv_tcp_getpeername(&most->tcp, (struct sockaddr *)&sa, &len) == 0 &&
                sa.ss_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;
                char ip[INET_ADDRSTRLEN];
                if (uv_ip4_name(in, ip, sizeof ip) == 0) {
                    snprintf(peer, sizeof peer, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
                }
            }
            log_warn("rpc: answers waiting to be written hold %llu MiB, over "
                     "rpc.max_answer_buffer_mb (%u): closed the connection from %s, which held "
                     "%llu KiB of them (%llu more such closes not logged)",
                     (unsigned long long)(answer_bytes >> 20), r->cfg->max_answer_buffer_mb, peer,
                     (unsigned long long)(most->accounted >> 10),
                     (unsigned long long)r->shed_suppressed);
            r->shed_warned = true;
            r->shed_warn_ms = now;
            r->shed_suppressed = 0;
        } else {
            r->shed_suppressed++;
        }
        most->tls_failed = true; /* no close_notify behind answers it does not read */
        connClose(most);
    }
}

/* How a request taken from a frame is counted once answered (rpc_stats.requests). */
enum callKind {
    CALL_ADMIN,     /* an admin op: not counted */
    CALL_DATA,      /* a client's data op */
    CALL_CLAIM,     /* a client's claim: timed too */
    CALL_FORWARDED, /* a data op another node's gateway forwarded: rpc_stats.forwarded */
};

/* A request handed to the service, until it is answered. */
struct call {
    struct conn *c;
    enum callKind kind;
    uint64_t start_ns; /* CALL_CLAIM: uv_hrtime() when it was taken */
};

static enum callKind callKindOf(const Idem__Request *req)
{
    if (!service_data_op(req)) {
        return CALL_ADMIN;
    }
    /* A follower's gateway marks what it forwards (forward.c), and its proxy forwards with
     * as_tenant: the gateway counts its client's request, this node does not again. */
    if (req->forwarded || (req->as_tenant != NULL && req->as_tenant[0] != '\0')) {
        return CALL_FORWARDED;
    }
    return req->op_case == IDEM__REQUEST__OP_CLAIM ? CALL_CLAIM : CALL_DATA;
}

static void callCount(const struct call *k, const Idem__Response *resp)
{
    unsigned oc = resp->result != NULL ? (unsigned)resp->result->outcome : 0;
    if (k->kind == CALL_ADMIN) {
        return;
    }
    if (k->kind == CALL_FORWARDED) {
        if (oc < REQSTATS_OUTCOMES) {
            stats.forwarded[oc]++;
        }
        return;
    }
    if (k->kind == CALL_CLAIM) {
        reqstats_claim(&stats.requests, (double)(uv_hrtime() - k->start_ns) / 1e9);
    }
    reqstats_outcome(&stats.requests, oc);
    if (oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
        stats.requests.fail_closed++;
    }
}

static void answeredCb(void *data, const Idem__Response *resp)
{
    struct call *k = data;
    struct conn *c = k->c;
    callCount(k, resp);
    free(k);
    assert(c->inflight > 0);
    c->inflight--;
    stats.inflight--;
    connSend(c, resp);
    if (c->state != CONN_CLOSING && connQueuedBytes(c) > CONN_MAX_BUFFERED) {
        stats.answer_cuts_connection++;
        c->tls_failed = true; /* no close_notify behind megabytes it does not read */
        connClose(c);
    }
    if (answer_bytes > answerBudget(c)) {
        serverShed(c->srv, answerBudget(c));
    }
    connMaybeFinishDrain(c);
    connFlowControl(c);
    connUnref(c); /* the request's reference */
}

/* Answers a frame we cannot serve; the connection then drains: requests it sent before
 * still get their answers, and it closes once they are written. */
static void badFrame(struct conn *c, uint64_t request_id, const char *why)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    resp.request_id = request_id;
    resp.result = &res;
    resp.error = (char *)why;
    connSend(c, &resp);
    connDrain(c);
}

/* Answers a frame that is not taken in (n bytes, `have` of them at p) under `id`, with
 * `outcome`, `detail` and `why`; with an id the frame is then skipped, without one (0)
 * the connection drains. Returns the bytes consumed from p (0 when draining). */
static size_t refuseFrame(struct conn *c, size_t have, uint32_t n, uint64_t id,
                          Idem__Outcome outcome, const char *detail, const char *why)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = outcome;
    res.detail = (char *)detail;
    resp.request_id = id;
    resp.result = &res;
    resp.error = (char *)why;
    connSend(c, &resp);
    if (id == 0) {
        connDrain(c);
        return 0;
    }
    size_t take = have < n ? have : n;
    c->skip = (uint64_t)n - take;
    return take;
}

/* The length a frame buffer's first frame declares, 0 when it holds less than its prefix. */
static uint32_t firstFrameLen(const struct conn *c)
{
    if (c->skip > 0 || c->len < FRAME_HEADER_LEN) {
        return 0;
    }
    return frame_header_get(c->buf);
}

/* Gives back a frame buffer that a large frame grew, once what is left in it is small: an
 * idle connection holds CONN_BUF_MIN, not the largest frame it ever sent (up to
 * max_frame_bytes, for each of max_connections). Not while the frame it was grown for is
 * still arriving. */
static void connShrink(struct conn *c)
{
    uint32_t first = firstFrameLen(c);
    if (first != 0 && first <= c->srv->cfg->max_frame_bytes &&
        (size_t)first + 4 + CONN_READ_SLACK > CONN_BUF_MIN) {
        return;
    }
    if (c->cap > CONN_BUF_MIN && c->len <= CONN_BUF_MIN / 4) {
        c->buf = xrealloc(c->buf, CONN_BUF_MIN);
        stats.frame_buffer_bytes -= c->cap - CONN_BUF_MIN;
        frame_buffer_grown -= c->cap - CONN_BUF_MIN;
        c->cap = CONN_BUF_MIN;
    }
}

/* refuseUntaken(): the request id of the frame may be in bytes still to come. */
#define REFUSE_WAIT SIZE_MAX

/* Answers the frame at p (its prefix, then `have` of its n body bytes) that is not taken
 * in, under its request id when one can be read from its first bytes (refuseFrame).
 * Returns the body bytes consumed (0: no id, the connection drains), or REFUSE_WAIT when
 * the id may be in the bytes still to come. */
static size_t refuseUntaken(struct conn *c, const uint8_t *p, size_t have, uint32_t n,
                            Idem__Outcome outcome, const char *detail, const char *why)
{
    uint64_t id = 0;
    int found = frame_peek_request_id(p + FRAME_HEADER_LEN, have < n ? have : n, &id);
    if (found < 0 && have < n) {
        return REFUSE_WAIT;
    }
    return refuseFrame(c, have, n, found > 0 ? id : 0, outcome, detail, why);
}

/* Decodes a complete frame's body (n bytes at p) and hands its request to the service.
 * False when it is not a request we can serve: it was answered and the connection drains. */
static bool connTakeRequest(struct conn *c, const uint8_t *p, uint32_t n)
{
    Idem__Request *req = idem__request__unpack(NULL, n, p);
    c->progress_ms = uv_now(c->srv->loop);
    if (req == NULL) {
        badFrame(c, 0, "frame does not decode as a Request");
        return false;
    }
    if (req->op_case == IDEM__REQUEST__OP__NOT_SET) {
        badFrame(c, req->request_id, "request has no known op");
        idem__request__free_unpacked(req, NULL);
        return false;
    }
    struct call *k = xmalloc(sizeof(*k));
    k->c = c;
    k->kind = callKindOf(req);
    k->start_ns = k->kind == CALL_CLAIM ? uv_hrtime() : 0;
    c->refs++;
    c->inflight++;
    stats.inflight++;
    service_handle(c->srv->svc, req, answeredCb, k);
    idem__request__free_unpacked(req, NULL);
    return true;
}

/* Handles the complete frames in the buffer, up to CONN_MAX_INFLIGHT requests awaiting an
 * answer (c->backlog then says that frames were left). */
static void connProcess(struct conn *c)
{
    size_t off = 0;
    const uint32_t max = c->srv->cfg->max_frame_bytes;
    assert(c->len <= c->cap);
    while (connOpen(c) && c->len - off > 0) {
        assert(off < c->len);
        if (c->skip > 0) {
            size_t d = c->len - off < c->skip ? c->len - off : (size_t)c->skip;
            off += d;
            c->skip -= d;
            if (c->skip == 0) {
                c->progress_ms = uv_now(c->srv->loop);
            }
            continue;
        }
        const uint8_t *p = c->buf + off;
        uint32_t n = 0;
        enum frame_status fs = frame_check(p, c->len - off, max, &n);
        if (fs == FRAME_SHORT) {
            break;
        }
        if (c->inflight >= CONN_MAX_INFLIGHT) {
            /* The cap holds per request, not per read: one read of a full buffer can bring
             * tens of thousands of small frames. The rest wait where they are. */
            c->backlog = true;
            break;
        }
        if (fs == FRAME_COMPLETE) {
            off += FRAME_HEADER_LEN + (size_t)n;
            if (!connTakeRequest(c, p + FRAME_HEADER_LEN, n)) {
                return;
            }
            continue;
        }
        size_t have = c->len - off - FRAME_HEADER_LEN;
        size_t took;
        if (fs == FRAME_TOO_LARGE) {
            took = refuseUntaken(c, p, have, n, IDEM__OUTCOME__OUTCOME_INVALID, "frame_too_large",
                                 "frame larger than max_frame_bytes");
        } else if (connHoldFrame(c, n)) {
            break; /* FRAME_PARTIAL: the rest of it fits in the buffer */
        } else {
            /* Every connection's buffers together hold rpc.max_frame_buffer_mb already
             * (say, many peers that each started a large frame and stopped): this frame is
             * answered unavailable (a client may send it again) and skipped as it comes. */
            took = refuseUntaken(c, p, have, n, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, "",
                                 "the node's frame buffers are full "
                                 "(rpc.max_frame_buffer_mb): send it again later");
            if (took != REFUSE_WAIT) {
                stats.frames_refused++;
                stats.requests.fail_closed++;
            }
        }
        if (took == REFUSE_WAIT) {
            break; /* the request id may be in the bytes still to come */
        }
        if (took == 0) {
            return; /* no request id: answered under 0, the connection drains */
        }
        off += FRAME_HEADER_LEN + took;
    }
    connFlowControl(c);
    if (off > 0) {
        assert(off <= c->len);
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    connShrink(c);
}

/* The frame buffer's first CONN_BUF_MIN bytes. It grows past them only for a frame whose
 * length is known (connHoldFrame), so that every byte a connection buffers is counted
 * against rpc.max_frame_buffer_mb before it is taken. */
static void connReserve(struct conn *c)
{
    if (c->cap == 0) {
        c->buf = xmalloc(CONN_BUF_MIN);
        stats.frame_buffer_bytes += CONN_BUF_MIN;
        c->cap = CONN_BUF_MIN;
    }
}

/* Makes room for the frame of n bytes (n <= max_frame_bytes) and CONN_READ_SLACK more,
 * once it is at the buffer's front (connProcess moves what is left there before the next
 * read), within every connection's budget together: the growth of frame buffers past
 * their first CONN_BUF_MIN bytes is at most rpc.max_frame_buffer_mb. False, nothing
 * changed, when it would go past. */
static bool connHoldFrame(struct conn *c, uint32_t n)
{
    size_t need = 4 + (size_t)n + CONN_READ_SLACK;
    if (need <= c->cap) {
        return true;
    }
    uint64_t budget = (uint64_t)c->srv->cfg->max_frame_buffer_mb << 20;
    uint64_t more = need - (c->cap > CONN_BUF_MIN ? c->cap : CONN_BUF_MIN);
    if (frame_buffer_grown + more > budget) {
        return false;
    }
    frame_buffer_grown += more;
    c->buf = xrealloc(c->buf, need);
    stats.frame_buffer_bytes += need - c->cap;
    c->cap = need;
    return true;
}

static void allocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    (void)suggested;
    if (c->tls != NULL) {
        if (c->cipher == NULL) {
            c->cipher = xmalloc(CONN_TLS_READ);
        }
        *buf = uv_buf_init((char *)c->cipher, CONN_TLS_READ);
        return;
    }
    connReserve(c);
    *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

/* TLS: feeds what was read and decrypts everything available into the frame buffer,
 * handing complete frames to connProcess() whenever the buffer fills up. */
static void tlsRead(struct conn *c, const uint8_t *data, size_t n)
{
    if (IdemTlsFeed(c->tls, data, n) != 0) {
        tlsOutOfMemory(); /* the stream's buffer could not grow */
    }
    for (;;) {
        if (!connOpen(c)) {
            break;
        }
        connReserve(c);
        if (c->cap == c->len) {
            /* Full: the frames in it are complete (the limit leaves room for the largest
             * frame), so processing frees space. */
            connProcess(c);
            if (!connOpen(c) || c->backlog) {
                break; /* backlog: the rest stays in the engine until flushCb resumes */
            }
            connReserve(c);
            if (c->cap == c->len) {
                badFrame(c, 0, "frame buffer full");
                break;
            }
        }
        int got = IdemTlsRead(c->tls, c->buf + c->len, c->cap - c->len);
        if (got > 0) {
            c->len += (size_t)got;
            continue;
        }
        if (got == IDEM_TLS_WANT) {
            break;
        }
        tlsFlush(c); /* an alert, if the engine made one */
        if (got == IDEM_TLS_CLOSED) {
            connClose(c);
        } else {
            tlsFail(c, IdemTlsEstablished(c->tls) ? "read" : "handshake");
        }
        return;
    }
    tlsFlush(c);
    if (c->state != CONN_CLOSING) {
        connProcess(c);
    }
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread == UV_EOF && c->tls == NULL) {
        /* The peer is done sending, maybe not reading (a half-close after its last
         * request): the requests it sent still get their answers, then the connection
         * closes (connDrain; a peer that does not read them is cut off by the sweep). */
        connDrain(c);
        return;
    }
    if (nread < 0) {
        connFlush(c); /* answers made this turn, before the end of the stream */
        connClose(c);
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
    connProcess(c);
}

/* Closes connections past their handshake or idle timeout, those whose peer has not taken
 * any of an answer for rpc.idle_timeout_ms (a write outstanding all along), and, once the
 * server is closing, those still draining CLOSE_GRACE_MS after it began. */
static void sweepCb(uv_timer_t *t)
{
    struct rpc_server *r = t->data;
    uint64_t now = uv_now(r->loop);
    struct conn *c;
    LIST_FOREACH (c, &r->conns, link) {
        if (c->state == CONN_CLOSING) {
            continue;
        }
        if (r->closing) {
            if (now - r->close_ms >= CLOSE_GRACE_MS) {
                c->tls_failed = true;
                connClose(c);
            }
            continue;
        }
        if (c->writes > 0 && now - c->wprogress_ms >= r->cfg->idle_timeout_ms) {
            c->tls_failed = true; /* it reads nothing: no close_notify either */
            connClose(c);
        } else if (c->tls != NULL && !IdemTlsEstablished(c->tls) &&
                   now - c->accepted_ms >= r->cfg->handshake_timeout_ms) {
            c->tls_failed = true; /* nothing to say to it */
            connClose(c);
        } else if (c->inflight == 0 && c->writes == 0 && !c->queued &&
                   now - c->progress_ms >= r->cfg->idle_timeout_ms) {
            connClose(c);
        }
    }
}

static void sweepClosed(uv_handle_t *h)
{
    struct rpc_server *r = h->data;
    r->sweep_closed = true;
    serverMaybeFree(r);
}

static void acceptCb(uv_stream_t *l, int status)
{
    struct rpc_server *r = l->data;
    if (status != 0 || r->closing) {
        return;
    }
    struct conn *c = xcalloc(1, sizeof(*c));
    c->srv = r;
    c->state = CONN_READING;
    c->refs = 1;
    uv_tcp_init(r->loop, &c->tcp);
    c->tcp.data = c;
    LIST_INSERT_HEAD(&r->conns, c, link);
    r->n_conns++;
    stats.connections++;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || r->n_conns > r->cfg->max_connections) {
        connClose(c);
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

struct rpc_server *rpc_server_new(uv_loop_t *loop, const struct config_addr *addr,
                                  const struct config_rpc *cfg, const struct config_tls *tls,
                                  struct service *svc, char *err, size_t errlen)
{
    struct idem_tls_ctx *tctx = NULL;
    if (tls != NULL && tls->rpc) {
        struct idem_tls_params tp = {.role = IDEM_TLS_SERVER,
                                     .cert_file = tls->cert_file,
                                     .key_file = tls->key_file,
                                     .ca_file = tls->ca_file};
        if (IdemTlsCtxNew(&tp, &tctx, err, errlen) != IDEM_OK) {
            return NULL;
        }
    }
    struct sockaddr_in sa;
    int rv = uv_ip4_addr(addr->host, addr->port, &sa);
    if (rv != 0) {
        snprintf(err, errlen, "rpc address %s: %s", addr->text, uv_strerror(rv));
        IdemTlsCtxFree(tctx);
        return NULL;
    }
    struct rpc_server *r = xcalloc(1, sizeof(*r));
    LIST_INIT(&r->conns);
    SLIST_INIT(&r->flush);
    r->loop = loop;
    r->cfg = cfg;
    r->svc = svc;
    r->tls = tctx;
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
        connDrain(c);
    }
    serverMaybeFree(r); /* closes the sweep at once when no connection is left */
}
