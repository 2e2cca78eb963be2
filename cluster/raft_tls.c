/* raft_tls: see raft_tls.h. One pump per connection: the TCP handle, the near end of the
 * socketpair, a TLS stream between them (memory BIOs), and for the connector a timer. */
#include "raft_tls.h"
#include "handshake.h"
#include "tls_stream.h"
#include "transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

/* The most one read takes (every read lands in raft_tls's one buffer, used up before the
 * next), and the most plaintext one decryption pass gathers into one write. */
#define READ_MAX 65536

struct pump;

struct raft_tls {
    uv_loop_t *loop;
    struct idem_tls_ctx *server; /* the listener's: client certificates required */
    struct idem_tls_ctx *client; /* the connector's */
    uint64_t timeout_ms;
    struct raft_tls_cbs cbs;
    LIST_HEAD(pumpList, pump) pumps;
    size_t n_pumps;
    bool closing;
    uint8_t rbuf[READ_MAX]; /* what a read brought, consumed in its callback */
    uint8_t pbuf[READ_MAX]; /* decrypted plaintext, and the last TLS bytes on a close */
};

struct pump {
    struct raft_tls *rt;
    struct idem_tls *tls;
    uv_tcp_t *tcp; /* raft_malloc'd */
    uv_pipe_t near;
    uv_pipe_t *far;   /* connector: the plaintext end until it is handed over (raft_malloc'd) */
    uv_timer_t timer; /* connector: TCP connection and TLS handshake within timeout_ms */
    uv_connect_t connect;
    struct raft_uv_connect *req; /* connector: not called back yet */
    raft_uv_connect_cb cb;
    raft_id peer;            /* connector: the node */
    struct sockaddr_storage from; /* listener: the peer's address (from_known) */
    bool from_known;
    uint8_t *hs; /* connector: raft_uv_tcp's handshake, written once TLS is up */
    size_t hs_len;
    uint8_t *held; /* plaintext written before the TLS handshake completed */
    size_t held_len;
    bool incoming;
    bool tcp_connected; /* and the socketpair made */
    bool established;
    bool ending;
    bool tcp_reading;
    bool near_reading;
    int closing; /* handles still to close */
    LIST_ENTRY(pump) link;
};

/* The reasons told to the transport (raft_tls_failure.why). */
static const char tlsHandshakeFailed[] = "TLS handshake failed";
static const char tlsError[] = "TLS error";
static const char tlsTimeout[] = "no TLS handshake in time";
static const char tlsClosedEarly[] = "the peer closed the connection during the TLS handshake";

struct pwrite {
    uv_write_t req;
    struct pump *p;
    uint8_t data[];
};

static void pumpEnd(struct pump *p, bool notify, const char *why, const char *text);

static size_t queued(void *stream)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)stream);
}

/* ---- flow: which side is read --------------------------------------------------------- */

static void nearAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void nearReadCb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
static void tcpAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void tcpReadCb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static void setReading(uv_stream_t *s, bool on, bool *reading, uv_alloc_cb alloc, uv_read_cb cb)
{
    if (on && !*reading) {
        *reading = uv_read_start(s, alloc, cb) == 0;
    } else if (!on && *reading) {
        uv_read_stop(s);
        *reading = false;
    }
}

/* Reads a side only while what waits towards the other is within RAFT_TLS_QUEUE_MAX:
 * plaintext towards the TCP connection (or held for the handshake), decrypted bytes
 * towards the plaintext end. */
static void pumpFlow(struct pump *p)
{
    if (p->ending || !p->tcp_connected) {
        return;
    }
    size_t towards_tcp = p->established ? queued(p->tcp) : p->held_len;
    setReading((uv_stream_t *)&p->near, towards_tcp <= RAFT_TLS_QUEUE_MAX, &p->near_reading,
               nearAllocCb, nearReadCb);
    setReading((uv_stream_t *)p->tcp, queued(&p->near) <= RAFT_TLS_QUEUE_MAX, &p->tcp_reading,
               tcpAllocCb, tcpReadCb);
}

/* ---- writes ----------------------------------------------------------------------------- */

static void writeCb(uv_write_t *req, int status)
{
    struct pwrite *w = (struct pwrite *)req;
    struct pump *p = w->p;
    bool plain = req->handle == (uv_stream_t *)&p->near;
    free(w);
    if (p->ending) {
        return; /* canceled by the close */
    }
    if (status < 0) {
        pumpEnd(p, plain, NULL, NULL); /* that side is gone: close_notify if it was raft's */
        return;
    }
    pumpFlow(p);
}

/* Queues n bytes (copied; from TLS if data is NULL) on s. False when it cannot. */
static bool pumpWrite(struct pump *p, void *s, const uint8_t *data, size_t n)
{
    struct pwrite *w = malloc(sizeof(*w) + n);
    if (w == NULL) {
        return false;
    }
    if (data != NULL) {
        memcpy(w->data, data, n);
    } else {
        n = IdemTlsTake(p->tls, w->data, n);
    }
    w->p = p;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)s, &b, 1, writeCb) != 0) {
        free(w);
        return false;
    }
    return true;
}

/* Writes what the TLS stream has for the network (records, handshake messages, alerts). */
static bool tlsFlush(struct pump *p)
{
    size_t n = IdemTlsPending(p->tls);
    return n == 0 || pumpWrite(p, p->tcp, NULL, n);
}

/* Closing: what the TLS stream still has (an alert, close_notify), if the socket takes it
 * at once behind what is queued; nothing waits for it. */
static void tryFlush(struct pump *p)
{
    size_t n;
    while (p->tcp_connected && (n = IdemTlsTake(p->tls, p->rt->pbuf, sizeof(p->rt->pbuf))) > 0) {
        uv_buf_t b = uv_buf_init((char *)p->rt->pbuf, (unsigned)n);
        if (uv_try_write((uv_stream_t *)p->tcp, &b, 1) != (int)n) {
            return;
        }
    }
}

/* ---- the end ---------------------------------------------------------------------------- */

static void pumpFree(struct pump *p)
{
    struct raft_tls *rt = p->rt;
    if (p->req != NULL) {
        struct raft_uv_connect *req = p->req;
        p->req = NULL;
        p->cb(req, NULL, rt->closing ? RAFT_CANCELED : RAFT_NOCONNECTION);
    }
    LIST_REMOVE(p, link);
    rt->n_pumps--;
    IdemTlsFree(p->tls);
    free(p->held);
    free(p->hs);
    free(p);
    if (rt->closing && rt->n_pumps == 0 && rt->cbs.closed != NULL) {
        rt->cbs.closed(rt->cbs.data);
    }
}

static void pumpClosedCb(uv_handle_t *h)
{
    struct pump *p = h->data;
    if (h == (uv_handle_t *)p->tcp) {
        raft_free(p->tcp);
        p->tcp = NULL;
    } else if (h == (uv_handle_t *)p->far) {
        raft_free(p->far);
        p->far = NULL;
    }
    if (--p->closing == 0) {
        pumpFree(p);
    }
}

/* Tells the transport why a connection failed (unless raft_tls is closing). */
static void pumpTell(struct pump *p, const char *why, const char *text)
{
    struct raft_tls *rt = p->rt;
    if (rt->closing || rt->cbs.fail == NULL) {
        return;
    }
    struct raft_tls_failure f = {
        .incoming = p->incoming,
        .peer = p->peer,
        .from = p->from_known ? (const struct sockaddr *)&p->from : NULL,
        .why = why,
        .text = text != NULL ? text : why,
    };
    rt->cbs.fail(rt->cbs.data, &f);
}

/* Ends the connection: both sides closed (the plaintext end too, while it is still ours),
 * after close_notify when `notify` (the plaintext side ended) and the TLS stream's last
 * bytes when the socket takes them. `why` (NULL: nothing to say) and `text` go to the
 * transport. */
static void pumpEnd(struct pump *p, bool notify, const char *why, const char *text)
{
    if (p->ending) {
        return;
    }
    p->ending = true;
    if (why != NULL) {
        pumpTell(p, why, text);
    }
    if (notify && p->established) {
        IdemTlsShutdown(p->tls);
    }
    tryFlush(p);
    uv_timer_stop(&p->timer);
    p->closing = 2 + p->tcp_connected + (p->far != NULL);
    uv_close((uv_handle_t *)&p->timer, pumpClosedCb);
    uv_close((uv_handle_t *)p->tcp, pumpClosedCb);
    if (p->tcp_connected) {
        uv_close((uv_handle_t *)&p->near, pumpClosedCb);
    }
    if (p->far != NULL) {
        uv_close((uv_handle_t *)p->far, pumpClosedCb);
    }
}

/* A TLS failure: the reason (OpenSSL's, never the peer's bytes) and a hint. */
static void pumpTlsFailed(struct pump *p)
{
    char text[512];
    const char *why = p->established ? tlsError : tlsHandshakeFailed;
    if (p->established) {
        snprintf(text, sizeof(text), "%s: %s", why, IdemTlsErrmsg(p->tls));
    } else if (p->incoming) {
        snprintf(text, sizeof(text),
                 "%s: %s (has the peer tls.raft on, and a certificate signed by tls.ca_file?)", why,
                 IdemTlsErrmsg(p->tls));
    } else {
        snprintf(text, sizeof(text),
                 "%s: %s (has node %llu tls.raft on, and a certificate signed by tls.ca_file "
                 "for the host of its raft address?)",
                 why, IdemTlsErrmsg(p->tls), (unsigned long long)p->peer);
    }
    pumpEnd(p, false, why, text);
}

/* ---- the plaintext side ----------------------------------------------------------------- */

static void nearAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct pump *p = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)p->rt->rbuf, sizeof(p->rt->rbuf));
}

static void nearReadCb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct pump *p = s->data;
    if (n == 0) {
        return;
    }
    if (n < 0) {
        pumpEnd(p, true, NULL, NULL); /* raft (or transport.c) closed its end */
        return;
    }
    if (!p->established) {
        uint8_t *held = realloc(p->held, p->held_len + (size_t)n);
        if (held == NULL) {
            pumpEnd(p, false, NULL, NULL);
            return;
        }
        memcpy(held + p->held_len, buf->base, (size_t)n);
        p->held = held;
        p->held_len += (size_t)n;
        pumpFlow(p);
        return;
    }
    if (IdemTlsWrite(p->tls, (const uint8_t *)buf->base, (size_t)n) != 0) {
        pumpTlsFailed(p);
        return;
    }
    if (!tlsFlush(p)) {
        pumpEnd(p, false, NULL, NULL);
        return;
    }
    pumpFlow(p);
}

/* ---- the TCP side ----------------------------------------------------------------------- */

static void tcpAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct pump *p = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)p->rt->rbuf, sizeof(p->rt->rbuf));
}

/* The TLS handshake just completed. The listener sends what waited for it; the connector
 * writes raft_uv_tcp's handshake into the plaintext end and hands that end over. False
 * when the pump ended. */
static bool pumpEstablished(struct pump *p)
{
    if (p->incoming) {
        if (p->held_len > 0) {
            if (IdemTlsWrite(p->tls, p->held, p->held_len) != 0) {
                pumpTlsFailed(p);
                return false;
            }
            free(p->held);
            p->held = NULL;
            p->held_len = 0;
            if (!tlsFlush(p)) {
                pumpEnd(p, false, NULL, NULL);
                return false;
            }
        }
        return true;
    }
    uv_timer_stop(&p->timer);
    /* A fresh socketpair takes a few hundred bytes at once. */
    uv_buf_t b = uv_buf_init((char *)p->hs, (unsigned)p->hs_len);
    if (uv_try_write((uv_stream_t *)p->far, &b, 1) != (int)p->hs_len) {
        pumpEnd(p, false, NULL, NULL);
        return false;
    }
    struct raft_uv_connect *req = p->req;
    uv_stream_t *far = (uv_stream_t *)p->far;
    p->req = NULL;
    p->far = NULL;
    far->data = NULL;
    p->cb(req, far, 0);
    return !p->ending;
}

/* Runs the TLS handshake on, then decrypts what was fed into the plaintext end. */
static void pumpDecrypt(struct pump *p)
{
    struct raft_tls *rt = p->rt;
    if (!p->established) {
        int rv = IdemTlsHandshake(p->tls);
        if (rv == IDEM_TLS_ERROR) {
            pumpTlsFailed(p); /* its alert goes out on the way */
            return;
        }
        if (!tlsFlush(p)) {
            pumpEnd(p, false, NULL, NULL);
            return;
        }
        if (rv == IDEM_TLS_WANT) {
            return;
        }
        p->established = true;
        if (!pumpEstablished(p)) {
            return;
        }
    }
    for (;;) {
        size_t n = 0;
        int rv = 0;
        while (n < sizeof(rt->pbuf) &&
               (rv = IdemTlsRead(p->tls, rt->pbuf + n, sizeof(rt->pbuf) - n)) > 0) {
            n += (size_t)rv;
        }
        if (n > 0 && !pumpWrite(p, &p->near, rt->pbuf, n)) {
            pumpEnd(p, false, NULL, NULL);
            return;
        }
        if (n == sizeof(rt->pbuf)) {
            continue;
        }
        if (rv == IDEM_TLS_WANT) {
            break;
        }
        if (rv == IDEM_TLS_CLOSED) {
            pumpEnd(p, true, NULL, NULL); /* the peer's close_notify: a clean end */
        } else {
            pumpTlsFailed(p);
        }
        return;
    }
    if (!tlsFlush(p)) { /* what reading made (a key update's answer) */
        pumpEnd(p, false, NULL, NULL);
        return;
    }
    pumpFlow(p);
}

static void tcpReadCb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct pump *p = s->data;
    if (n == 0) {
        return;
    }
    if (n < 0) {
        /* The peer went away. Unremarkable but for a connector whose TLS handshake it broke
         * off (a listener without tls.raft refuses the ClientHello so). */
        if (!p->incoming && !p->established) {
            char text[200];
            snprintf(text, sizeof(text), "%s (has node %llu tls.raft on?)", tlsClosedEarly,
                     (unsigned long long)p->peer);
            pumpEnd(p, false, tlsClosedEarly, text);
        } else {
            pumpEnd(p, false, NULL, NULL);
        }
        return;
    }
    if (IdemTlsFeed(p->tls, (const uint8_t *)buf->base, (size_t)n) != 0) {
        pumpTlsFailed(p);
        return;
    }
    pumpDecrypt(p);
}

/* ---- making pumps ----------------------------------------------------------------------- */

/* A pump of ctx's role, its timer started, in rt's list; NULL when out of memory. */
static struct pump *pumpNew(struct raft_tls *rt, bool incoming, const char *peer_name)
{
    struct pump *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->tls = IdemTlsNew(incoming ? rt->server : rt->client, peer_name);
    if (p->tls == NULL) {
        free(p);
        return NULL;
    }
    p->rt = rt;
    p->incoming = incoming;
    uv_timer_init(rt->loop, &p->timer);
    p->timer.data = p;
    LIST_INSERT_HEAD(&rt->pumps, p, link);
    rt->n_pumps++;
    return p;
}

/* The socketpair: its near end the pump's, the far end (raft_malloc'd) in *far. 0 or a
 * libuv error, nothing made. */
static int pairNew(uv_loop_t *loop, uv_pipe_t *near, uv_pipe_t **far)
{
    uv_os_sock_t fds[2];
    int rv = uv_socketpair(SOCK_STREAM, 0, fds, UV_NONBLOCK_PIPE, UV_NONBLOCK_PIPE);
    if (rv != 0) {
        return rv;
    }
    *far = raft_malloc(sizeof(**far));
    if (*far == NULL) {
        close(fds[0]);
        close(fds[1]);
        return UV_ENOMEM;
    }
    uv_pipe_init(loop, near, 0);
    uv_pipe_init(loop, *far, 0);
    /* Fresh descriptors of a fresh pair: opening them does not fail (libuv fails only on
     * a descriptor it already watches). */
    uv_pipe_open(near, fds[0]);
    uv_pipe_open(*far, fds[1]);
    return 0;
}

int raft_tls_accept(struct raft_tls *rt, uv_tcp_t *tcp, uv_stream_t **plain)
{
    if (rt->closing) {
        return UV_ECANCELED;
    }
    uv_pipe_t *far = NULL;
    struct pump *p = pumpNew(rt, true, NULL);
    if (p == NULL) {
        return UV_ENOMEM;
    }
    int rv = pairNew(rt->loop, &p->near, &far);
    if (rv != 0) {
        /* Only the timer to close; the caller keeps tcp. */
        p->tcp = NULL;
        p->closing = 1;
        p->ending = true;
        uv_close((uv_handle_t *)&p->timer, pumpClosedCb);
        return rv;
    }
    p->tcp = tcp;
    tcp->data = p;
    transport_tcp_tune(tcp); /* as transport.c does without TLS: no 40 ms replies */
    p->near.data = p;
    int len = sizeof(p->from);
    p->from_known = uv_tcp_getpeername(tcp, (struct sockaddr *)&p->from, &len) == 0 &&
                    (p->from.ss_family == AF_INET || p->from.ss_family == AF_INET6);
    p->tcp_connected = true;
    far->data = NULL;
    *plain = (uv_stream_t *)far;
    pumpFlow(p);
    return 0;
}

/* ---- the connector ---------------------------------------------------------------------- */

static void timeoutCb(uv_timer_t *timer)
{
    struct pump *p = timer->data;
    char text[200];
    snprintf(text, sizeof(text),
             "no TLS connection within %llu s (is node %llu up, with tls.raft on?)",
             (unsigned long long)(p->rt->timeout_ms / 1000), (unsigned long long)p->peer);
    pumpEnd(p, false, tlsTimeout, text);
}

static void connectCb(uv_connect_t *c, int status)
{
    struct pump *p = c->data;
    if (p->ending) {
        return; /* canceled: the close reports */
    }
    if (status != 0) {
        pumpEnd(p, false, NULL, NULL); /* refused, unreachable: raft_uv retries */
        return;
    }
    transport_tcp_tune(p->tcp);
    if (pairNew(p->rt->loop, &p->near, &p->far) != 0) {
        pumpEnd(p, false, NULL, NULL);
        return;
    }
    p->near.data = p;
    p->far->data = p;
    p->tcp_connected = true;
    if (IdemTlsHandshake(p->tls) == IDEM_TLS_ERROR || !tlsFlush(p)) { /* the ClientHello */
        pumpTlsFailed(p);
        return;
    }
    pumpFlow(p);
}

int raft_tls_connect(struct raft_tls *rt, struct raft_uv_connect *req, raft_id id,
                     const struct sockaddr *addr, const char *peer_name, raft_id self,
                     const char *self_address, raft_uv_connect_cb cb)
{
    if (rt->closing) {
        return RAFT_CANCELED;
    }
    size_t hs_len = 0;
    uint8_t *hs = handshake_encode(self, self_address, &hs_len);
    uv_tcp_t *tcp = raft_malloc(sizeof(*tcp));
    struct pump *p = hs != NULL && tcp != NULL ? pumpNew(rt, false, peer_name) : NULL;
    if (p == NULL) {
        free(hs);
        raft_free(tcp);
        return RAFT_NOMEM;
    }
    p->hs = hs;
    p->hs_len = hs_len;
    p->peer = id;
    p->tcp = tcp;
    uv_tcp_init(rt->loop, tcp);
    tcp->data = p;
    p->connect.data = p;
    if (uv_tcp_connect(&p->connect, tcp, addr, connectCb) != 0) {
        pumpEnd(p, false, NULL, NULL); /* no callback: the error is returned */
        return RAFT_NOCONNECTION;
    }
    p->req = req;
    p->cb = cb;
    uv_timer_start(&p->timer, timeoutCb, rt->timeout_ms, 0);
    return 0;
}

/* ---- the whole ---------------------------------------------------------------------------- */

int raft_tls_load(const struct raft_tls_files *files, struct idem_tls_ctx **server,
                  struct idem_tls_ctx **client, char *err, size_t errlen)
{
    *server = *client = NULL;
    if (files->cert_file == NULL || files->key_file == NULL || files->ca_file == NULL) {
        snprintf(err, errlen, "tls.raft needs tls.cert_file, tls.key_file and tls.ca_file");
        return -1;
    }
    struct idem_tls_params sp = {.role = IDEM_TLS_SERVER,
                                 .cert_file = files->cert_file,
                                 .key_file = files->key_file,
                                 .ca_file = files->ca_file};
    struct idem_tls_params cp = sp;
    cp.role = IDEM_TLS_CLIENT;
    if (IdemTlsCtxNew(&sp, server, err, errlen) != IDEM_OK ||
        IdemTlsCtxNew(&cp, client, err, errlen) != IDEM_OK) {
        IdemTlsCtxFree(*server);
        *server = NULL;
        return -1;
    }
    return 0;
}

int raft_tls_new(uv_loop_t *loop, const struct raft_tls_files *files, uint64_t handshake_timeout_ms,
                 const struct raft_tls_cbs *cbs, struct raft_tls **out, char *err, size_t errlen)
{
    *out = NULL;
    struct raft_tls *rt = calloc(1, sizeof(*rt));
    if (rt == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (raft_tls_load(files, &rt->server, &rt->client, err, errlen) != 0) {
        raft_tls_free(rt);
        return -1;
    }
    rt->loop = loop;
    rt->timeout_ms = handshake_timeout_ms;
    rt->cbs = *cbs;
    LIST_INIT(&rt->pumps);
    *out = rt;
    return 0;
}

void raft_tls_set(struct raft_tls *rt, struct idem_tls_ctx *server, struct idem_tls_ctx *client)
{
    /* The streams of the pumps that run hold their own references (tls_stream.h). */
    IdemTlsCtxFree(rt->server);
    IdemTlsCtxFree(rt->client);
    rt->server = server;
    rt->client = client;
}

void raft_tls_close(struct raft_tls *rt)
{
    rt->closing = true;
    struct pump *p;
    LIST_FOREACH(p, &rt->pumps, link)
    {
        pumpEnd(p, true, NULL, NULL); /* frees nothing before the loop's close callbacks */
    }
}

bool raft_tls_closed(const struct raft_tls *rt)
{
    return rt->closing && rt->n_pumps == 0;
}

void raft_tls_free(struct raft_tls *rt)
{
    if (rt == NULL) {
        return;
    }
    IdemTlsCtxFree(rt->server);
    IdemTlsCtxFree(rt->client);
    free(rt);
}

size_t raft_tls_pumps(const struct raft_tls *rt)
{
    return rt->n_pumps;
}

size_t raft_tls_buffered(const struct raft_tls *rt)
{
    size_t n = 0;
    const struct pump *p;
    LIST_FOREACH(p, &rt->pumps, link)
    {
        n += p->held_len;
        if (p->tcp_connected && !p->ending) {
            n += queued(p->tcp) + queued((void *)&p->near);
        }
    }
    return n;
}
