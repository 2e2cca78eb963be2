/* roundtrip.c: one synchronous round trip of libidem to one node, over TCP or TLS, and the
 * connection sets that hold a call's sockets (see idem.c for the call that goes through
 * them, following the leader).
 *
 * A round trip: connect (or reuse the connection to) the node, write the request frame
 * (4-byte big-endian length, proto/frame.h), read frames until the Response with our
 * request id arrives. Sockets are non-blocking; every wait is a poll() bounded by the
 * attempt's deadline. With TLS, the session runs on the socket itself (SSL_set_fd) with
 * SIGPIPE held back around each OpenSSL call (pipeGuard). A kept-alive connection that
 * the server closed while idle is noticed on the first write or read and reopened once. */
#include "internal.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509.h>

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
    if (k->ssl[i] != NULL) {
        /* No close_notify: the peer may be gone, and the call must not block on it. */
        SSL_free(k->ssl[i]);
        k->ssl[i] = NULL;
    }
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

/* SIGPIPE around OpenSSL's socket I/O. OpenSSL's socket BIO writes with write(2), and a
 * write to a connection whose reset came back (a node that closed it) raises SIGPIPE, which
 * kills a program that does not ignore it; the plain path sends with MSG_NOSIGNAL instead.
 * So around each TLS call SIGPIPE is blocked in this thread, and one that the call raised
 * (it is sent to the writing thread) is taken back before the old mask returns, unless one
 * was already pending before (as libpq does). */
struct pipeGuard {
    sigset_t old;
    bool blocked;
    bool pending_before;
};

static bool pipePending(void)
{
    sigset_t pending;
    return sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

static void pipeBlock(struct pipeGuard *g)
{
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    g->pending_before = pipePending();
    g->blocked = pthread_sigmask(SIG_BLOCK, &pipe, &g->old) == 0;
}

static void pipeRestore(struct pipeGuard *g)
{
    if (!g->blocked) {
        return;
    }
    int saved = errno;
    if (!g->pending_before && pipePending()) {
        sigset_t pipe;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    errno = saved;
}

/* Runs the TLS handshake on node i's fresh socket within the deadline. */
static enum rt_result tlsHandshake(struct idem_client *c, struct idem_conns *k, size_t i,
                                   uint64_t deadline)
{
    const struct idem_node *n = &c->nodes[i];
    char ebuf[256];
    SSL *ssl = SSL_new(c->tls);
    if (ssl == NULL || SSL_set_fd(ssl, k->fd[i]) != 1 ||
        !IdemTlsSetPeer(ssl, c->tls_server_name ? c->tls_server_name : n->host)) {
        connErrf(k, "%s: tls setup: %s", n->addr, IdemTlsError(ebuf, sizeof ebuf));
        SSL_free(ssl);
        return RT_NOMEM;
    }
    k->ssl[i] = ssl;
    for (;;) {
        ERR_clear_error();
        struct pipeGuard g;
        pipeBlock(&g);
        int r = SSL_connect(ssl);
        pipeRestore(&g);
        if (r == 1) {
            return RT_OK;
        }
        int e = SSL_get_error(ssl, r);
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (ev == 0) {
            long vr = SSL_get_verify_result(ssl);
            if (vr != X509_V_OK) {
                connErrf(k, "%s: tls: certificate verification failed: %s", n->addr,
                         X509_verify_cert_error_string(vr));
            } else {
                connErrf(k, "%s: tls handshake: %s", n->addr, IdemTlsError(ebuf, sizeof ebuf));
            }
            return RT_CONN;
        }
        enum rt_result w = waitNode(c, k, i, ev, deadline, "tls handshake: timed out");
        if (w != RT_OK) {
            return w;
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

/* Writes all `len` bytes within the deadline. */
static enum rt_result nodeWrite(struct idem_client *c, struct idem_conns *k, size_t i,
                                const uint8_t *buf, size_t len, uint64_t deadline)
{
    const char *addr = c->nodes[i].addr;
    char ebuf[256];
    size_t done = 0;
    while (done < len) {
        short want = POLLOUT;
        if (k->ssl[i] != NULL) {
            ERR_clear_error();
            size_t w = 0;
            struct pipeGuard g;
            pipeBlock(&g);
            int r = SSL_write_ex(k->ssl[i], buf + done, len - done, &w);
            pipeRestore(&g);
            if (r == 1) {
                done += w;
                continue;
            }
            int e = SSL_get_error(k->ssl[i], r);
            if (e == SSL_ERROR_WANT_READ) {
                want = POLLIN;
            } else if (e != SSL_ERROR_WANT_WRITE) {
                connErrf(k, "%s: tls write: %s", addr, IdemTlsError(ebuf, sizeof ebuf));
                return RT_CONN;
            }
        } else {
            ssize_t w = send(k->fd[i], buf + done, len - done, MSG_NOSIGNAL);
            if (w >= 0) {
                done += (size_t)w;
                continue;
            }
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                connErrf(k, "%s: write: %s", addr, IdemErrnoText(errno, ebuf, sizeof ebuf));
                return RT_CONN;
            }
        }
        enum rt_result w = waitNode(c, k, i, want, deadline, "write: timed out");
        if (w != RT_OK) {
            return w;
        }
    }
    return RT_OK;
}

/* Reads exactly `len` bytes within the deadline. *got counts bytes read, so that the
 * caller can tell "closed before answering" from "closed mid-frame". */
static enum rt_result nodeRead(struct idem_client *c, struct idem_conns *k, size_t i, uint8_t *buf,
                               size_t len, uint64_t deadline, size_t *got)
{
    const char *addr = c->nodes[i].addr;
    char ebuf[256];
    size_t done = 0;
    while (done < len) {
        short want = POLLIN;
        size_t r = 0;
        if (k->ssl[i] != NULL) {
            ERR_clear_error();
            struct pipeGuard g; /* a read may write too (TLS 1.3 key updates) */
            pipeBlock(&g);
            int ok = SSL_read_ex(k->ssl[i], buf + done, len - done, &r);
            pipeRestore(&g);
            if (ok != 1) {
                int e = SSL_get_error(k->ssl[i], ok);
                if (e == SSL_ERROR_ZERO_RETURN) {
                    connErrf(k, "%s: connection closed by the node", addr);
                    return RT_CONN;
                }
                if (e == SSL_ERROR_WANT_WRITE) {
                    want = POLLOUT;
                } else if (e != SSL_ERROR_WANT_READ) {
                    connErrf(k, "%s: tls read: %s", addr, IdemTlsError(ebuf, sizeof ebuf));
                    return RT_CONN;
                }
                r = 0;
            }
        } else {
            ssize_t n = recv(k->fd[i], buf + done, len - done, 0);
            if (n == 0) {
                connErrf(k, "%s: connection closed by the node", addr);
                return RT_CONN;
            }
            if (n < 0) {
                if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                    connErrf(k, "%s: read: %s", addr, IdemErrnoText(errno, ebuf, sizeof ebuf));
                    return RT_CONN;
                }
                n = 0;
            }
            r = (size_t)n;
        }
        if (r > 0) {
            done += r;
            *got += r;
            continue;
        }
        enum rt_result w = waitNode(c, k, i, want, deadline, "no answer before the deadline");
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
 * that a previous call gave up on. */
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
        Idem__Response *m = idem__response__unpack(NULL, len, k->rbuf);
        if (m == NULL) {
            connErrf(k, "%s: a %u-byte response does not decode", addr, len);
            return RT_PROTO;
        }
        /* request_id 0: the node could not read our request (idem.proto, above
         * `message Request`); we have only one request outstanding, so it is ours. */
        if (m->request_id == id || m->request_id == 0) {
            *resp = m;
            return RT_OK;
        }
        idem__response__free_unpacked(m, NULL);
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
