/* roundtrip.c: one synchronous round trip of libidem to one node, over TCP or TLS, and the
 * connection sets that hold a call's sockets (see idem.c for the call that goes through
 * them, following the leader).
 *
 * A round trip: connect (or reuse the connection to) the node, write the request frame
 * (4-byte big-endian length, proto/frame.h), read frames until the Response with our
 * request id arrives. Sockets are non-blocking; every wait is a poll() bounded by the
 * attempt's deadline, and every send() is MSG_NOSIGNAL (a connection the node closed is an
 * error, not a SIGPIPE). With TLS, libidem's TLS stream (tls_stream.h) sits between the
 * frames and the socket: what recv() got is fed to it, what it gives is sent. A kept-alive
 * connection that the server closed while idle is noticed on the first write or read and
 * reopened once. */
#include "internal.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "frame.h"

/* strerror() is not thread-safe; this uses the XSI strerror_r into the caller's buffer. */
const char *IdemErrnoText(int err, char *buf, size_t len)
{
    if (strerror_r(err, buf, len) != 0) {
        snprintf(buf, len, "error %d", err);
    }
    return buf;
}

static int pollTimeout(uint64_t deadline)
{
    uint64_t rem = IdemRemainingMs(deadline);
    return rem > 60000 ? 60000 : (int)rem;
}

/* ---- connection sets ----------------------------------------------------------------- */

/* A connection set for one call: one from the pool, or a new one. NULL when out of memory. */
struct idem_conns *IdemConnsGet(struct idem_client *c)
{
    pthread_mutex_lock(&c->mu);
    struct idem_conns *k = SLIST_FIRST(&c->free_conns);
    if (k != NULL) {
        SLIST_REMOVE_HEAD(&c->free_conns, link);
    }
    pthread_mutex_unlock(&c->mu);
    if (k == NULL) {
        k = calloc(1, sizeof *k);
        if (k == NULL) {
            return NULL;
        }
        for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
            k->fd[i] = -1;
        }
    }
    k->errmsg[0] = '\0';
    return k;
}

/* Puts `k` back and publishes its last message as the client's. */
void IdemConnsPut(struct idem_client *c, struct idem_conns *k)
{
    pthread_mutex_lock(&c->mu);
    memcpy(c->errmsg, k->errmsg, sizeof c->errmsg);
    SLIST_INSERT_HEAD(&c->free_conns, k, link);
    pthread_mutex_unlock(&c->mu);
}

static void connClose(struct idem_conns *k, size_t i)
{
    /* No close_notify: the peer may be gone, and the call must not wait for it. */
    IdemTlsFree(k->tls[i]);
    k->tls[i] = NULL;
    if (k->fd[i] >= 0) {
        close(k->fd[i]);
        k->fd[i] = -1;
    }
}

/* Closes every connection of `k` and frees it (the client is closing). */
void IdemConnsFree(struct idem_conns *k)
{
    for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
        connClose(k, i);
    }
    if (k->wbuf != NULL) {
        OPENSSL_cleanse(k->wbuf, k->wbuf_cap); /* the last frame carried the token */
    }
    free(k->wbuf);
    free(k->rbuf);
    free(k->tbuf); /* ciphertext only */
    free(k);
}

/* ---- one connection ------------------------------------------------------------------ */

/* Waits until fd is ready for `events` or the deadline passes. 1 ready, 0 timed out, -1
 * error (errno). */
static int waitFd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int pr = poll(&pfd, 1, pollTimeout(deadline));
        if ((pr < 0 && errno == EINTR) || pr == 0) {
            /* Interrupted, or a wait of pollTimeout's most (60 s) over with the deadline
             * still ahead: wait again. */
            if (IdemRemainingMs(deadline) == 0) {
                return 0;
            }
            continue;
        }
        return pr > 0 ? 1 : pr;
    }
}

/* waitFd on node i's socket: RT_OK when it is ready for `events`; RT_TIMEOUT (saying
 * `late`) or RT_CONN (poll failed) in k->errmsg otherwise. */
static enum rt_result waitNode(struct idem_client *c, struct idem_conns *k, size_t i, short events,
                               uint64_t deadline, const char *late)
{
    int w = waitFd(k->fd[i], events, deadline);
    if (w == 0) {
        connErrf(k, "%s: %s", c->nodes[i].addr, late);
        return RT_TIMEOUT;
    }
    if (w < 0) {
        char ebuf[128];
        connErrf(k, "%s: poll: %s", c->nodes[i].addr, IdemErrnoText(errno, ebuf, sizeof ebuf));
        return RT_CONN;
    }
    return RT_OK;
}

/* Sends the `len` bytes at p on node i's socket within the deadline. send() with
 * MSG_NOSIGNAL: a connection the node closed is an error (EPIPE), not a SIGPIPE that kills
 * a program that does not ignore it. RT_OK, or RT_CONN ("<what>: <errno's text>") or
 * RT_TIMEOUT (`late`) in k->errmsg. */
static enum rt_result sendAll(struct idem_client *c, struct idem_conns *k, size_t i,
                              const uint8_t *p, size_t len, uint64_t deadline, const char *what,
                              const char *late)
{
    char ebuf[128];
    size_t done = 0;
    while (done < len) {
        ssize_t w = send(k->fd[i], p + done, len - done, MSG_NOSIGNAL);
        if (w >= 0) {
            done += (size_t)w;
            continue;
        }
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            connErrf(k, "%s: %s: %s", c->nodes[i].addr, what,
                     IdemErrnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        enum rt_result r = waitNode(c, k, i, POLLOUT, deadline, late);
        if (r != RT_OK) {
            return r;
        }
    }
    return RT_OK;
}

/* TLS: sends everything node i's stream has for the network (sendAll's results). */
static enum rt_result tlsSend(struct idem_client *c, struct idem_conns *k, size_t i,
                              uint64_t deadline, const char *what, const char *late)
{
    size_t n;
    while ((n = IdemTlsTake(k->tls[i], k->tbuf, IDEM_TLS_BUF)) > 0) {
        enum rt_result r = sendAll(c, k, i, k->tbuf, n, deadline, what, late);
        if (r != RT_OK) {
            return r;
        }
    }
    return RT_OK;
}

/* TLS, after the stream failed: the alert it made, if the socket takes it at once. */
static void tlsSendAlert(struct idem_conns *k, size_t i)
{
    size_t n;
    while ((n = IdemTlsTake(k->tls[i], k->tbuf, IDEM_TLS_BUF)) > 0) {
        if (send(k->fd[i], k->tbuf, n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)n) {
            return;
        }
    }
}

/* TLS: feeds node i's stream what its socket has, waiting for bytes within the deadline:
 * RT_OK once some (or the end of the stream) were fed; RT_CONN ("<what>: <errno's text>"),
 * RT_TIMEOUT (`late`) or RT_NOMEM in k->errmsg. */
static enum rt_result tlsRecv(struct idem_client *c, struct idem_conns *k, size_t i,
                              uint64_t deadline, const char *what, const char *late)
{
    char ebuf[128];
    for (;;) {
        ssize_t n = recv(k->fd[i], k->tbuf, IDEM_TLS_BUF, 0);
        if (n > 0) {
            if (IdemTlsFeed(k->tls[i], k->tbuf, (size_t)n) != 0) {
                connErrf(k, "%s: out of memory reading", c->nodes[i].addr);
                return RT_NOMEM;
            }
            return RT_OK;
        }
        if (n == 0) {
            IdemTlsFeedEof(k->tls[i]); /* the stream's next read says how it ended */
            return RT_OK;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            connErrf(k, "%s: %s: %s", c->nodes[i].addr, what,
                     IdemErrnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        enum rt_result r = waitNode(c, k, i, POLLIN, deadline, late);
        if (r != RT_OK) {
            return r;
        }
    }
}

/* Runs the TLS handshake on node i's fresh socket within the deadline: the stream says
 * what to send, the socket's answers are fed to it, until it is done or fails. */
static enum rt_result tlsHandshake(struct idem_client *c, struct idem_conns *k, size_t i,
                                   uint64_t deadline)
{
    const struct idem_node *n = &c->nodes[i];
    if (k->tbuf == NULL) {
        k->tbuf = malloc(IDEM_TLS_BUF);
    }
    if (k->tbuf == NULL || (k->tls[i] = IdemTlsNew(c->tls, n->host)) == NULL) {
        connErrf(k, "%s: tls setup: out of memory", n->addr);
        return RT_NOMEM;
    }
    struct idem_tls *t = k->tls[i];
    static const char late[] = "tls handshake: timed out";
    for (;;) {
        int r = IdemTlsHandshake(t);
        if (r == IDEM_TLS_ERROR) {
            tlsSendAlert(k, i);
            const char *cert = IdemTlsVerifyError(t);
            if (cert != NULL) {
                connErrf(k, "%s: tls: certificate verification failed: %s", n->addr, cert);
            } else {
                connErrf(k, "%s: tls handshake: %s", n->addr, IdemTlsErrmsg(t));
            }
            return RT_CONN;
        }
        /* The ClientHello, the rest of our part, or our Finished once done (r == 0). */
        enum rt_result s = tlsSend(c, k, i, deadline, "tls handshake", late);
        if (s == RT_OK && r == IDEM_TLS_WANT) {
            s = tlsRecv(c, k, i, deadline, "tls handshake", late);
        } else if (s == RT_OK) {
            return RT_OK;
        }
        if (s != RT_OK) {
            return s;
        }
    }
}

/* Connects node i within the deadline, trying every address the name resolves to; the
 * socket stays non-blocking, and every wait on it is a poll() bounded by the deadline. */
static enum rt_result nodeConnect(struct idem_client *c, struct idem_conns *k, size_t i,
                                  uint64_t deadline)
{
    const struct idem_node *n = &c->nodes[i];
    char ebuf[128];
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(n->host, n->port, &hints, &res);
    if (gai != 0) {
        connErrf(k, "%s: resolve: %s", n->addr, gai_strerror(gai));
        return RT_CONN;
    }
    enum rt_result result = RT_CONN;
    connErrf(k, "%s: connect: no address", n->addr);
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            connErrf(k, "%s: socket: %s", n->addr, IdemErrnoText(errno, ebuf, sizeof ebuf));
            continue;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                int w = waitFd(fd, POLLOUT, deadline);
                if (w == 0) {
                    connErrf(k, "%s: connect: timed out", n->addr);
                    close(fd);
                    result = RT_TIMEOUT;
                    break;
                }
                socklen_t elen = sizeof err;
                if (w < 0) {
                    err = errno;
                } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                    err = errno;
                }
            }
        }
        if (err != 0) {
            connErrf(k, "%s: connect: %s", n->addr, IdemErrnoText(err, ebuf, sizeof ebuf));
            close(fd);
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        k->fd[i] = fd;
        result = RT_OK;
        break;
    }
    freeaddrinfo(res);
    if (result == RT_OK && c->tls != NULL) {
        result = tlsHandshake(c, k, i, deadline);
        if (result != RT_OK) {
            connClose(k, i);
        }
    }
    return result;
}

/* Writes all `len` bytes within the deadline (with TLS: encrypted, then sent). */
static enum rt_result nodeWrite(struct idem_client *c, struct idem_conns *k, size_t i,
                                const uint8_t *buf, size_t len, uint64_t deadline)
{
    static const char late[] = "write: timed out";
    if (k->tls[i] == NULL) {
        return sendAll(c, k, i, buf, len, deadline, "write", late);
    }
    if (IdemTlsWrite(k->tls[i], buf, len) != 0) {
        connErrf(k, "%s: tls write: %s", c->nodes[i].addr, IdemTlsErrmsg(k->tls[i]));
        return RT_CONN;
    }
    return tlsSend(c, k, i, deadline, "write", late);
}

/* TLS: nodeRead's work: decrypts until `len` bytes are in buf, feeding the stream what the
 * socket has whenever it wants more. */
static enum rt_result tlsReadAll(struct idem_client *c, struct idem_conns *k, size_t i,
                                 uint8_t *buf, size_t len, uint64_t deadline, size_t *got)
{
    static const char late[] = "no answer before the deadline";
    struct idem_tls *t = k->tls[i];
    const char *addr = c->nodes[i].addr;
    size_t done = 0;
    while (done < len) {
        int r = IdemTlsRead(t, buf + done, len - done);
        if (r > 0) {
            done += (size_t)r;
            *got += (size_t)r;
            continue;
        }
        if (r == IDEM_TLS_CLOSED) {
            connErrf(k, "%s: connection closed by the node", addr);
            return RT_CONN;
        }
        if (r == IDEM_TLS_ERROR) {
            tlsSendAlert(k, i);
            connErrf(k, "%s: tls read: %s", addr, IdemTlsErrmsg(t));
            return RT_CONN;
        }
        /* Records without application data (e.g. TLS 1.3 session tickets) can come without
         * end, and then the waits below never run out: the time is checked here too. */
        if (IdemRemainingMs(deadline) == 0) {
            connErrf(k, "%s: %s", addr, late);
            return RT_TIMEOUT;
        }
        /* What reading made the stream say (an answer to a TLS 1.3 key update), then more
         * bytes from the node. */
        enum rt_result s = tlsSend(c, k, i, deadline, "write", late);
        if (s == RT_OK) {
            s = tlsRecv(c, k, i, deadline, "read", late);
        }
        if (s != RT_OK) {
            return s;
        }
    }
    return RT_OK;
}

/* Reads exactly `len` bytes within the deadline. *got counts bytes read, so that the
 * caller can tell "closed before answering" from "closed mid-frame". */
static enum rt_result nodeRead(struct idem_client *c, struct idem_conns *k, size_t i, uint8_t *buf,
                               size_t len, uint64_t deadline, size_t *got)
{
    if (k->tls[i] != NULL) {
        return tlsReadAll(c, k, i, buf, len, deadline, got);
    }
    const char *addr = c->nodes[i].addr;
    char ebuf[128];
    size_t done = 0;
    while (done < len) {
        ssize_t n = recv(k->fd[i], buf + done, len - done, 0);
        if (n > 0) {
            done += (size_t)n;
            *got += (size_t)n;
            continue;
        }
        if (n == 0) {
            connErrf(k, "%s: connection closed by the node", addr);
            return RT_CONN;
        }
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            connErrf(k, "%s: read: %s", addr, IdemErrnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        enum rt_result w = waitNode(c, k, i, POLLIN, deadline, "no answer before the deadline");
        if (w != RT_OK) {
            return w;
        }
    }
    return RT_OK;
}

static bool bufReserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) {
        return true;
    }
    size_t n = *cap < 4096 ? 4096 : *cap;
    while (n < need) {
        n *= 2;
    }
    /* Not realloc: the old block may hold a frame with the bearer token, wiped before it
     * is freed. */
    uint8_t *p = malloc(n);
    if (p == NULL) {
        return false;
    }
    if (*buf != NULL) {
        memcpy(p, *buf, *cap);
        OPENSSL_cleanse(*buf, *cap);
        free(*buf);
    }
    *buf = p;
    *cap = n;
    return true;
}

/* Reads frames until the Response to `id` arrives; skips answers to earlier requests
 * that a previous call gave up on. A node that keeps sending such answers never makes a
 * read wait, so each skip checks the deadline itself. */
static enum rt_result nodeAwait(struct idem_client *c, struct idem_conns *k, size_t i, uint64_t id,
                                uint64_t deadline, Idem__Response **resp, size_t *got)
{
    const char *addr = c->nodes[i].addr;
    for (;;) {
        uint8_t hdr[FRAME_HEADER_LEN];
        enum rt_result r = nodeRead(c, k, i, hdr, sizeof hdr, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        uint32_t len = 0;
        if (frame_check(hdr, sizeof hdr, IDEM_MAX_FRAME, &len) == FRAME_TOO_LARGE) {
            IdemFrameTooLargeWhy(k->errmsg, sizeof k->errmsg, addr, hdr, len);
            return RT_PROTO;
        }
        if (!bufReserve(&k->rbuf, &k->rbuf_cap, len)) {
            connErrf(k, "%s: out of memory reading a %u-byte frame", addr, len);
            return RT_NOMEM;
        }
        r = nodeRead(c, k, i, k->rbuf, len, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        /* request_id 0 (IDEM_ANSWER_REFUSED): the node could not read our request
         * (idem.proto, above `message Request`); we have only one request outstanding, so
         * it is ours. Another id: an answer to a request given up on, skipped. */
        switch (IdemResponseDecode(k->rbuf, len, id, addr, resp, k->errmsg, sizeof k->errmsg)) {
        case IDEM_ANSWER_BAD:
            return RT_PROTO;
        case IDEM_ANSWER_OTHER:
            if (IdemRemainingMs(deadline) == 0) {
                connErrf(k, "%s: no answer before the deadline", addr);
                return RT_TIMEOUT;
            }
            break;
        default:
            return RT_OK;
        }
    }
}

/* Packs `req` into k->wbuf as one frame, with our request id, the time left and the
 * client's token. Returns IDEM_OK, IDEM_ETOOBIG or IDEM_ENOMEM; *len (OUT) is the frame
 * length including the 4-byte prefix. */
int IdemFrameBuild(struct idem_client *c, struct idem_conns *k, const Idem__Request *req,
                   uint64_t id, uint64_t deadline, size_t *len)
{
    Idem__Request r = *req; /* shallow: borrows every field of req */
    r.request_id = id;
    uint64_t rem = IdemRemainingMs(deadline);
    r.deadline_ms = rem == 0 ? 1 : (rem > UINT32_MAX ? UINT32_MAX : (uint32_t)rem);
    if (r.auth_token.len == 0 && c->token_len > 0) {
        r.auth_token.data = c->token;
        r.auth_token.len = c->token_len;
    }
    size_t body = idem__request__get_packed_size(&r);
    if (body > c->max_frame) {
        connErrf(k, "request of %zu bytes exceeds the limit of %u", body, c->max_frame);
        return IDEM_ETOOBIG;
    }
    if (!bufReserve(&k->wbuf, &k->wbuf_cap, FRAME_HEADER_LEN + body)) {
        connErrf(k, "out of memory packing a %zu-byte request", body);
        return IDEM_ENOMEM;
    }
    frame_header_put(k->wbuf, (uint32_t)body); /* body <= max_frame <= IDEM_MAX_FRAME */
    size_t packed = idem__request__pack(&r, k->wbuf + FRAME_HEADER_LEN);
    assert(packed == body);
    (void)packed;
    *len = FRAME_HEADER_LEN + body;
    return IDEM_OK;
}

/* One request, one answer, on node i. The frame must already be in k->wbuf. A
 * kept-alive connection that turns out to be closed before a byte of the answer arrived
 * is reopened once. On anything but RT_OK the connection is closed. */
enum rt_result IdemRoundTrip(struct idem_client *c, struct idem_conns *k, size_t i,
                             size_t frame_len, uint64_t id, uint64_t deadline,
                             Idem__Response **resp)
{
    for (int attempt = 0;; attempt++) {
        bool reused = k->fd[i] >= 0;
        if (!reused) {
            enum rt_result r = nodeConnect(c, k, i, deadline);
            if (r != RT_OK) {
                return r;
            }
        }
        size_t got = 0;
        enum rt_result r = nodeWrite(c, k, i, k->wbuf, frame_len, deadline);
        if (r == RT_OK) {
            r = nodeAwait(c, k, i, id, deadline, resp, &got);
        }
        if (r == RT_OK) {
            if ((*resp)->request_id == 0) {
                connClose(k, i); /* the node closes it too after an unreadable request */
            }
            return RT_OK;
        }
        connClose(k, i);
        if (r == RT_CONN && reused && got == 0 && attempt == 0 && IdemRemainingMs(deadline) > 0) {
            continue;
        }
        return r;
    }
}
