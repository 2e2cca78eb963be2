/* async_conn.c: the connections of libidem's asynchronous client (async.c): connect (a
 * numeric address at once, a name after uv_getaddrinfo), TLS (tls_stream.h), writes,
 * reads, frames, and what each answer does to its request and to the connection (see
 * async.c for the failure modes). The typed calls have one connection at a time, a->conn,
 * to the node believed to lead; a dropped one is closed, its requests wait again, and a
 * reconnect is scheduled. Raw calls have one per named node (conn->named; async_node.c
 * says what its answers and failures do).
 *
 * A connection goes CONNECTING -> (TLS: HANDSHAKING ->) UP -> CLOSING (enum aconnState);
 * requests are written only while it is UP. Its memory is freed once both its TCP handle
 * closed and its resolution (if any) called back. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "frame.h"
#include "internal.h"
#include "resolver.h"

/* ---- addresses ------------------------------------------------------------------------- */

/* Whether the node's host is a numeric address; fills *ss when it is. */
static bool numericNode(const struct idem_node *n, struct sockaddr_storage *ss)
{
    int port = atoi(n->port);
    return uv_ip4_addr(n->host, port, (struct sockaddr_in *)ss) == 0 ||
           uv_ip6_addr(n->host, port, (struct sockaddr_in6 *)ss) == 0;
}

/* Whether conn is still in use: not closing, and its owner's connection (a->conn, or its
 * named node's). */
static bool connLive(const struct aconn *conn)
{
    if (conn->state == ACONN_CLOSING) {
        return false;
    }
    return conn->named != NULL ? conn->named->conn == conn : conn->a->conn == conn;
}

/* conn is up, or its queued writes drained: what waits for it is written. */
static void connReady(struct aconn *conn)
{
    if (conn->named != NULL) {
        IdemNamedFlush(conn->named);
    } else {
        IdemAsyncFlush(conn->a);
    }
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

static void writeCb(uv_write_t *w, int status)
{
    struct awrite *wr = (struct awrite *)w;
    struct aconn *conn = wr->conn;
    OPENSSL_cleanse(wr->data, wr->len); /* a request frame carries the token */
    free(wr);
    assert(conn->writes > 0);
    conn->writes--;
    if (!connLive(conn)) {
        return;
    }
    struct idem_async *a = conn->a;
    if (status < 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: write: %s", conn->peer->addr,
                 uv_strerror(status));
        IdemAsyncConnFail(conn, AFAIL_IO);
    } else if (conn->writes == 0) {
        connReady(conn); /* what was submitted meanwhile */
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
enum writeResult IdemAsyncConnWrite(struct aconn *conn, struct awrite *wr)
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
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: write: %s", conn->peer->addr,
                 uv_strerror(rv));
        IdemAsyncConnFail(conn, AFAIL_IO);
        return W_FAILED;
    }
    conn->writes++;
    return W_QUEUED;
}

/* TLS: writes whatever the stream has produced (handshake messages, records) to the
 * socket. Returns false when the connection was dropped. */
bool IdemAsyncTlsFlushOut(struct aconn *conn)
{
    size_t n = IdemTlsPending(conn->tls);
    if (n == 0) {
        return true;
    }
    struct awrite *wr = malloc(sizeof *wr + n);
    if (wr == NULL) {
        struct idem_async *a = conn->a;
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory writing to %s",
                 conn->peer->addr);
        IdemAsyncConnFail(conn, AFAIL_NOMEM);
        return false;
    }
    wr->len = IdemTlsTake(conn->tls, wr->data, n);
    return IdemAsyncConnWrite(conn, wr) != W_FAILED;
}

/* ---- the connection -------------------------------------------------------------------- */

static void connFree(struct aconn *conn)
{
    IdemTlsFree(conn->tls);
    free(conn->cbuf);
    free(conn->rbuf);
    free(conn);
}

static void connClosedCb(uv_handle_t *h)
{
    struct aconn *conn = h->data;
    struct idem_async *a = conn->a;
    assert(conn->state == ACONN_CLOSING && !conn->tcp_closed);
    conn->tcp_closed = true;
    if (!conn->resolving) {
        connFree(conn);
    }
    a->handles--;
    IdemAsyncMaybeFinish(a);
}

void IdemAsyncConnClose(struct aconn *conn)
{
    if (conn->state == ACONN_CLOSING) {
        return;
    }
    conn->state = ACONN_CLOSING;
    if (conn->resolving && conn->lookup != NULL) {
        IdemResolveCancel(conn->lookup); /* its callback never comes */
        conn->lookup = NULL;
        conn->resolving = false;
        conn->a->handles--;
    } else if (conn->resolving) {
        (void)uv_cancel((uv_req_t *)&conn->gai); /* its callback runs either way */
    }
    uv_close((uv_handle_t *)&conn->tcp, connClosedCb);
}

static void reconnectCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    a->reconnect_armed = false;
    if (!a->closing && a->conn == NULL && !TAILQ_EMPTY(&a->reqs)) {
        IdemAsyncConnStart(a);
    }
}

void IdemAsyncConnDrop(struct idem_async *a, struct aconn *conn, size_t next, uint64_t delay)
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
    IdemAsyncConnClose(conn);
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

void IdemAsyncConnFail(struct aconn *conn, enum aconnFail why)
{
    if (conn->named != NULL) {
        IdemNamedConnFail(conn, why);
        return;
    }
    struct idem_async *a = conn->a;
    IdemAsyncConnDrop(a, conn, a->next_seed, IdemBackoffNext(&a->backoff, &a->rng));
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

/* Tells the client's TLS failure callback, if any, what failed on conn (`reason`). */
static void tlsReport(struct aconn *conn, const char *what, const char *reason)
{
    struct idem_async *a = conn->a;
    if (a->tls_failure_cb != NULL) {
        a->tls_failure_cb(a->tls_failure_data, conn->peer->addr, what, reason);
    }
}

void IdemAsyncTlsFail(struct aconn *conn, const char *what)
{
    struct idem_async *a = conn->a;
    /* No stream: it could not be made (setup), for want of memory. */
    const char *reason = conn->tls != NULL ? IdemTlsErrmsg(conn->tls) : "out of memory";
    const char *cert = conn->tls != NULL ? IdemTlsVerifyError(conn->tls) : NULL;
    if (cert != NULL) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: tls: certificate verification failed: %s",
                 conn->peer->addr, cert);
    } else {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: tls %s: %s", conn->peer->addr, what, reason);
    }
    tlsReport(conn, what, reason); /* with " (certificate: ...)" when that failed */
    IdemAsyncConnFail(conn, conn->state == ACONN_UP ? AFAIL_TLS : AFAIL_HANDSHAKE);
}

/* Advances the handshake; once done, the connection is up and waiting requests are
 * written. Returns false when the connection was dropped. */
static bool tlsHandshakeStep(struct aconn *conn)
{
    int r = IdemTlsHandshake(conn->tls);
    if (r == 0) {
        if (!IdemAsyncTlsFlushOut(conn)) {
            return false;
        }
        assert(conn->state == ACONN_HANDSHAKING);
        conn->state = ACONN_UP;
        connReady(conn);
        return conn->state != ACONN_CLOSING;
    }
    if (r == IDEM_TLS_WANT) {
        return IdemAsyncTlsFlushOut(conn);
    }
    IdemAsyncTlsFail(conn, "handshake");
    return false;
}

/* TLS: feeds `n` ciphertext bytes to the stream and appends the plaintext to conn->rbuf.
 * Returns false when the connection was dropped. */
static bool tlsRead(struct aconn *conn, size_t n)
{
    struct idem_async *a = conn->a;
    if (IdemTlsFeed(conn->tls, conn->cbuf, n) != 0) {
        IdemAsyncTlsFail(conn, "read");
        return false;
    }
    if (conn->state == ACONN_HANDSHAKING) {
        if (!tlsHandshakeStep(conn)) {
            return false;
        }
        if (conn->state != ACONN_UP) {
            return true; /* more handshake to come */
        }
    }
    assert(conn->state == ACONN_UP);
    for (;;) {
        if (conn->rcap - conn->rlen < 16384) {
            uint8_t *p = realloc(conn->rbuf, conn->rcap + READ_CHUNK);
            if (p == NULL) {
                IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory reading");
                IdemAsyncConnFail(conn, AFAIL_NOMEM);
                return false;
            }
            conn->rbuf = p;
            conn->rcap += READ_CHUNK;
        }
        int got = IdemTlsRead(conn->tls, conn->rbuf + conn->rlen, conn->rcap - conn->rlen);
        if (got > 0) {
            conn->rlen += (size_t)got;
            continue;
        }
        if (got == IDEM_TLS_WANT) {
            break;
        }
        if (got == IDEM_TLS_CLOSED) {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: connection closed by the node",
                     conn->peer->addr);
            IdemAsyncConnFail(conn, AFAIL_CLOSED);
            return false;
        }
        IdemAsyncTlsFail(conn, "read");
        return false;
    }
    return IdemAsyncTlsFlushOut(conn); /* e.g. answers to post-handshake messages */
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
    const char *addr = conn->peer->addr;
    if (m->request_id == 0) {
        /* The node could not read one of our frames and closes the connection. */
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: refused a request frame: %.200s", addr,
                 m->error ? m->error : "");
        idem__response__free_unpacked(m, NULL);
        IdemAsyncConnFail(conn, AFAIL_REFUSED);
        return false;
    }
    if (conn->named != NULL) {
        return IdemNamedAnswer(conn, m);
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
        IdemAsyncReqFail(r, IDEM_ETOOBIG, "the request is larger than the node's max_frame_bytes");
        return conn->state != ACONN_CLOSING;
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
        IdemAsyncRetryArm(a, r->retry_at);
        return conn->state != ACONN_CLOSING;
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
            IdemAsyncConnDrop(a, conn, to, delay);
        } else {
            IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s%s%.200s", addr,
                     outcome == IDEM__OUTCOME__OUTCOME_UNAVAILABLE ? "unavailable"
                                                                   : "not the leader",
                     m->error && m->error[0] ? ": " : "", m->error ? m->error : "");
            idem__response__free_unpacked(m, NULL);
            IdemAsyncConnFail(conn, AFAIL_ANSWER);
        }
        return false;
    }
    a->backoff = IDEM_BACKOFF_MIN_MS;
    a->redirects = 0;
    a->errmsg[0] = '\0'; /* a leader answered: earlier failures are history */
    a->words.n = 0;
    struct idem_result res;
    int rv = IdemResultFill(&res, m);
    IdemAsyncReqFinish(r, rv, &res);
    return conn->state != ACONN_CLOSING;
}

static void readCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct aconn *conn = s->data;
    struct idem_async *a = conn->a;
    if (!connLive(conn)) {
        return;
    }
    if (nread < 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s", conn->peer->addr,
                 nread == UV_EOF ? "connection closed by the node" : uv_strerror((int)nread));
        if (conn->state == ACONN_HANDSHAKING) {
            /* A server refusing our certificate (or TLS) may just close. */
            tlsReport(conn, "handshake", "the node closed the connection during the handshake");
        }
        IdemAsyncConnFail(conn, nread == UV_EOF ? AFAIL_CLOSED : AFAIL_IO);
        return;
    }
    if (nread > 0) {
        conn->quiet_since = uv_now(a->loop);
    }
    if (conn->tls != NULL) {
        if (!tlsRead(conn, (size_t)nread)) {
            return;
        }
    } else {
        conn->rlen += (size_t)nread;
    }
    assert(conn->rlen <= conn->rcap);
    size_t off = 0;
    while (conn->state != ACONN_CLOSING) {
        assert(off <= conn->rlen);
        const uint8_t *p = conn->rbuf + off;
        uint32_t len = 0;
        enum frame_status fs = frame_check(p, conn->rlen - off, IDEM_MAX_FRAME, &len);
        if (fs == FRAME_SHORT || fs == FRAME_PARTIAL) {
            break;
        }
        if (fs == FRAME_TOO_LARGE) {
            IdemFrameTooLargeWhy(a->errmsg, sizeof a->errmsg, conn->peer->addr, p, len);
            IdemAsyncConnFail(conn, AFAIL_FRAME);
            return;
        }
        /* Awaiting no id in particular: handleAnswer matches it (and takes request_id 0,
         * IDEM_ANSWER_REFUSED, as the node's refusal of a frame). */
        Idem__Response *m = NULL;
        enum idem_answer an = IdemResponseDecode(p + FRAME_HEADER_LEN, len, 0, conn->peer->addr, &m,
                                                 a->errmsg, sizeof a->errmsg);
        off += FRAME_HEADER_LEN + (size_t)len;
        if (an == IDEM_ANSWER_BAD) {
            IdemAsyncConnFail(conn, AFAIL_FRAME);
            return;
        }
        if (!handleAnswer(a, conn, m)) {
            return;
        }
    }
    if (conn->state == ACONN_CLOSING) {
        return;
    }
    memmove(conn->rbuf, conn->rbuf + off, conn->rlen - off);
    conn->rlen -= off;
}

/* TLS: a stream for `conn`, verifying the node's host (or the configured server name).
 * False when out of memory. */
static bool tlsSetup(struct aconn *conn)
{
    conn->cbuf = malloc(READ_CHUNK);
    conn->tls = IdemTlsNew(conn->a->tls, conn->peer->host);
    return conn->cbuf != NULL && conn->tls != NULL;
}

static void connectCb(uv_connect_t *req, int status)
{
    struct aconn *conn = req->data;
    struct idem_async *a = conn->a;
    if (!connLive(conn)) {
        return;
    }
    const char *addr = conn->peer->addr;
    int rv = status;
    if (rv == 0 && a->tls != NULL && !tlsSetup(conn)) {
        IdemAsyncTlsFail(conn, "setup");
        return;
    }
    if (rv == 0) {
        rv = uv_read_start((uv_stream_t *)&conn->tcp, allocCb, readCb);
    }
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: connect: %s", addr, uv_strerror(rv));
        IdemAsyncConnFail(conn, AFAIL_CONNECT);
        return;
    }
    (void)uv_tcp_nodelay(&conn->tcp, 1);
    assert(conn->state == ACONN_CONNECTING);
    if (conn->tls != NULL) {
        conn->state = ACONN_HANDSHAKING;
        (void)tlsHandshakeStep(conn); /* the ClientHello; up once the server answered */
        return;
    }
    conn->state = ACONN_UP;
    connReady(conn);
}

static void gaiCb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct aconn *conn = req->data;
    struct idem_async *a = conn->a;
    conn->resolving = false;
    a->handles--;
    if (conn->state == ACONN_CLOSING) {
        uv_freeaddrinfo(res);
        if (conn->tcp_closed) {
            connFree(conn);
        }
        IdemAsyncMaybeFinish(a);
        return;
    }
    int rv = status < 0 ? status : (res == NULL ? UV_EAI_NONAME : 0);
    if (rv == 0) {
        rv = uv_tcp_connect(&conn->connect_req, &conn->tcp, res->ai_addr, connectCb);
    }
    uv_freeaddrinfo(res);
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s: %s", conn->peer->addr,
                 status < 0 ? "resolve" : "connect", uv_strerror(rv));
        IdemAsyncConnFail(conn, AFAIL_CONNECT);
    }
}

/* The client's resolver answered (IdemAsyncConnGo): the first address it gave is
 * connected to, as with getaddrinfo's. Not called once the connection closed first
 * (IdemAsyncConnClose cancels the lookup). */
static void resolvedCb(void *data, int status, const struct sockaddr_storage *addrs, size_t n)
{
    struct aconn *conn = data;
    struct idem_async *a = conn->a;
    conn->lookup = NULL;
    conn->resolving = false;
    a->handles--;
    int rv = status == 0 && n > 0
                 ? uv_tcp_connect(&conn->connect_req, &conn->tcp,
                                  (const struct sockaddr *)&addrs[0], connectCb)
                 : 0;
    if (status != 0 || n == 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: resolve: %s", conn->peer->addr,
                 status != 0 ? IdemResolveStrerror(status) : "no address");
        IdemAsyncConnFail(conn, AFAIL_CONNECT);
    } else if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: connect: %s", conn->peer->addr,
                 uv_strerror(rv));
        IdemAsyncConnFail(conn, AFAIL_CONNECT);
    }
}

struct aconn *IdemAsyncConnNew(struct idem_async *a, const struct idem_node *peer)
{
    struct aconn *conn = calloc(1, sizeof *conn);
    if (conn == NULL) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory opening a connection");
        return NULL;
    }
    conn->a = a;
    conn->peer = peer;
    conn->quiet_since = uv_now(a->loop);
    int rv = uv_tcp_init(a->loop, &conn->tcp);
    if (rv != 0) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: cannot make a TCP handle: %s", peer->addr,
                 uv_strerror(rv));
        free(conn);
        return NULL;
    }
    conn->tcp.data = conn;
    conn->connect_req.data = conn;
    conn->gai.data = conn;
    a->handles++;
    return conn;
}

void IdemAsyncConnGo(struct aconn *conn)
{
    struct idem_async *a = conn->a;
    const struct idem_node *n = conn->peer;
    struct sockaddr_storage ss;
    int rv;
    const char *what = "connect";
    if (numericNode(n, &ss)) {
        rv =
            uv_tcp_connect(&conn->connect_req, &conn->tcp, (const struct sockaddr *)&ss, connectCb);
    } else if (a->resolver != NULL) {
        what = "resolve";
        /* IdemResolve fails for a name it cannot keep (too long, or every kept name busy
         * with a lookup) as well as for memory: said as a failed lookup. */
        rv = IdemResolve(a->resolver, n->host, (uint16_t)atoi(n->port), resolvedCb, conn,
                         &conn->lookup) == 0
                 ? 0
                 : UV_EAI_FAIL;
        if (rv == 0) {
            conn->resolving = true;
            a->handles++;
        }
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
        IdemAsyncConnFail(conn, AFAIL_CONNECT);
    }
}

/* Opens the leader connection, to a->current; when no connection can be made, tries again
 * after IDEM_BACKOFF_MAX_MS. */
void IdemAsyncConnStart(struct idem_async *a)
{
    struct aconn *conn = IdemAsyncConnNew(a, &a->nodes[a->current]);
    if (conn == NULL) {
        a->reconnect_armed = true;
        uv_timer_start(&a->reconnect, reconnectCb, IDEM_BACKOFF_MAX_MS, 0);
        return;
    }
    conn->node = a->current;
    a->conn = conn;
    IdemAsyncConnGo(conn);
}
