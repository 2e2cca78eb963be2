#include "transport.h"
#include "wire_check.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* raft_uv owns outer.data (it stores itself there), so the wrapper is found from `outer`
 * being the first member of struct transport. */
static struct transport *fromOuter(struct raft_uv_transport *o)
{
    return (struct transport *)o;
}

struct connectReq {
    struct raft_uv_connect inner;
    struct raft_uv_connect *outer;
};

static void noDelay(struct uv_stream_s *stream)
{
    /* raft_uv_tcp's streams are uv_tcp_t. A failure only costs latency. */
    uv_tcp_nodelay((uv_tcp_t *)stream, 1);
}

static int transportInit(struct raft_uv_transport *o, raft_id id, const char *address)
{
    struct transport *t = fromOuter(o);
    snprintf(t->address, sizeof(t->address), "%s", address);
    return t->inner.init(&t->inner, id, address);
}

/* ---- the listener: raft_uv_tcp's handshake, bounded ----------------------------------- */

/* One connection whose handshake is being read: protocol, sender ID, address length (u64
 * little endian each), then the address, NUL-terminated and zero-padded to 8 bytes. */
struct incoming {
    struct transport *t;
    uv_tcp_t *tcp;  /* raft_malloc'd: raft_uv frees the stream it is handed */
    uv_timer_t timer;
    uint8_t pre[24];
    char addr[TRANSPORT_ADDRESS_MAX];
    size_t want;    /* bytes of the part being read: 24, then the address length */
    size_t got;
    bool in_address;
    int closing;    /* handles (tcp, timer) still to close */
    bool handed;    /* the stream went to raft: only the timer closes here */
    struct incoming *prev, *next;
};

static void maybeClosed(struct transport *t);

static void incomingUnlink(struct incoming *in)
{
    struct transport *t = in->t;
    if (in->prev != NULL) {
        in->prev->next = in->next;
    } else {
        t->incoming = in->next;
    }
    if (in->next != NULL) {
        in->next->prev = in->prev;
    }
    t->n_incoming--;
}

static void incomingClosedCb(uv_handle_t *h)
{
    struct incoming *in = h->data;
    if (h == (uv_handle_t *)in->tcp) {
        raft_free(in->tcp);
    }
    if (--in->closing == 0) {
        struct transport *t = in->t;
        free(in);
        t->n_closing_incoming--;
        maybeClosed(t);
    }
}

/* Ends a handshake: closes the connection (unless raft has it) and the timer. */
static void incomingEnd(struct incoming *in, const char *why)
{
    struct transport *t = in->t;
    if (why != NULL) {
        t->refused++;
        if (t->refused <= 100) {
            fprintf(stderr, "idemd: raft connection refused: %s\n", why);
        }
    }
    incomingUnlink(in);
    t->n_closing_incoming++;
    in->closing = 1;
    uv_timer_stop(&in->timer);
    uv_close((uv_handle_t *)&in->timer, incomingClosedCb);
    if (!in->handed) {
        in->closing++;
        uv_close((uv_handle_t *)in->tcp, incomingClosedCb);
    }
}

static void incomingTimeoutCb(uv_timer_t *timer)
{
    incomingEnd(timer->data, "no handshake within 10 s");
}

static void incomingAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct incoming *in = h->data;
    (void)suggested;
    /* Exactly what the handshake has left: the peer's first message stays in the socket
     * for raft_uv, which starts reading once it has the stream. */
    uint8_t *base = in->in_address ? (uint8_t *)in->addr : in->pre;
    *buf = uv_buf_init((char *)base + in->got, (unsigned)(in->want - in->got));
}

static void incomingReadCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct incoming *in = s->data;
    (void)buf;
    if (nread == 0) {
        return;
    }
    if (nread < 0) {
        incomingEnd(in, NULL); /* the peer went away */
        return;
    }
    in->got += (size_t)nread;
    if (in->got < in->want) {
        return;
    }
    if (!in->in_address) {
        uint64_t protocol = wire_le(in->pre, 8);
        uint64_t len = wire_le(in->pre + 16, 8);
        if (protocol != TRANSPORT_HANDSHAKE_PROTOCOL) {
            incomingEnd(in, "unknown handshake protocol");
            return;
        }
        if (len == 0 || len > sizeof(in->addr)) {
            incomingEnd(in, "handshake address length out of range");
            return;
        }
        in->in_address = true;
        in->want = (size_t)len;
        in->got = 0;
        return;
    }
    if (memchr(in->addr, '\0', in->want) == NULL) {
        incomingEnd(in, "handshake address not terminated");
        return;
    }
    uv_read_stop(s);
    raft_id id = wire_le(in->pre + 8, 8);
    struct transport *t = in->t;
    in->handed = true;
    uv_stream_t *stream = (uv_stream_t *)in->tcp;
    char addr[TRANSPORT_ADDRESS_MAX];
    memcpy(addr, in->addr, sizeof(addr));
    incomingEnd(in, NULL);
    noDelay(stream);
    t->accept_cb(&t->outer, id, addr, stream);
}

static void listenCb(uv_stream_t *l, int status)
{
    struct transport *t = l->data;
    if (status != 0 || t->closing) {
        return;
    }
    struct incoming *in = calloc(1, sizeof(*in));
    uv_tcp_t *tcp = raft_malloc(sizeof(*tcp));
    if (in == NULL || tcp == NULL) {
        /* Returning without uv_accept() would leave the listener unpolled for good. */
        fprintf(stderr, "idemd: out of memory\n");
        abort();
    }
    in->t = t;
    in->tcp = tcp;
    in->want = sizeof(in->pre);
    uv_tcp_init(t->loop, tcp);
    tcp->data = in;
    uv_timer_init(t->loop, &in->timer);
    in->timer.data = in;
    in->next = t->incoming;
    if (t->incoming != NULL) {
        t->incoming->prev = in;
    }
    t->incoming = in;
    t->n_incoming++;
    if (uv_accept(l, (uv_stream_t *)tcp) != 0) {
        incomingEnd(in, NULL);
        return;
    }
    if (t->n_incoming > TRANSPORT_HANDSHAKES_MAX) {
        incomingEnd(in, "too many handshakes in progress");
        return;
    }
    uv_timer_start(&in->timer, incomingTimeoutCb, TRANSPORT_HANDSHAKE_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)tcp, incomingAllocCb, incomingReadCb);
}

static void listenerClosedCb(uv_handle_t *h)
{
    struct transport *t = h->data;
    t->listener_open = false;
    maybeClosed(t);
}

static int transportListen(struct raft_uv_transport *o, raft_uv_accept_cb cb)
{
    struct transport *t = fromOuter(o);
    t->accept_cb = cb;
    /* Our own listener instead of raft_uv_tcp's, which reads a handshake with no bound on
     * the address length a peer declares (it allocates it), no time limit, and no cap on
     * the connections that have not finished one. */
    char host[64];
    const char *colon = strrchr(t->address, ':');
    struct sockaddr_in sa;
    int rv = UV_EINVAL;
    if (colon != NULL && (size_t)(colon - t->address) < sizeof(host)) {
        memcpy(host, t->address, (size_t)(colon - t->address));
        host[colon - t->address] = '\0';
        rv = uv_ip4_addr(host, atoi(colon + 1), &sa);
    }
    if (rv == 0) {
        uv_tcp_init(t->loop, &t->listener);
        t->listener.data = t;
        t->listener_open = true;
        rv = uv_tcp_bind(&t->listener, (const struct sockaddr *)&sa, 0);
        if (rv == 0) {
            rv = uv_listen((uv_stream_t *)&t->listener, 128, listenCb);
        }
    }
    if (rv != 0) {
        /* libraft would say only "I/O error": the operator gets the reason (an address in
         * use, most often). libuv's codes are negative errno values. */
        snprintf(o->errmsg, sizeof(o->errmsg), "raft address %s: %s", t->address,
                 strerror(-rv));
        return RAFT_IOERR;
    }
    return 0;
}

static void connectCb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct connectReq *w = req->data;
    struct raft_uv_connect *outer = w->outer;
    free(w);
    if (status == 0) {
        noDelay(stream);
    }
    outer->cb(outer, stream, status);
}

static int transportConnect(struct raft_uv_transport *o, struct raft_uv_connect *req,
                            raft_id id, const char *address, raft_uv_connect_cb cb)
{
    struct transport *t = fromOuter(o);
    struct connectReq *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return RAFT_NOMEM;
    }
    w->outer = req;
    req->cb = cb;
    w->inner.data = w;
    int rv = t->inner.connect(&t->inner, &w->inner, id, address, connectCb);
    if (rv != 0) {
        free(w);
    }
    return rv;
}

/* raft's close callback, once raft_uv_tcp, our listener and every handshake are closed. */
static void maybeClosed(struct transport *t)
{
    if (t->closing && t->inner_closed && !t->listener_open && t->incoming == NULL &&
        t->n_closing_incoming == 0 && t->close_cb != NULL) {
        raft_uv_transport_close_cb cb = t->close_cb;
        t->close_cb = NULL;
        cb(&t->outer);
    }
}

static void closeCb(struct raft_uv_transport *inner)
{
    struct transport *t = inner->data;
    t->inner_closed = true;
    maybeClosed(t);
}

static void transportClose(struct raft_uv_transport *o, raft_uv_transport_close_cb cb)
{
    struct transport *t = fromOuter(o);
    t->close_cb = cb;
    t->closing = true;
    while (t->incoming != NULL) {
        incomingEnd(t->incoming, NULL);
    }
    if (t->listener_open && !uv_is_closing((uv_handle_t *)&t->listener)) {
        uv_close((uv_handle_t *)&t->listener, listenerClosedCb);
    }
    t->inner.close(&t->inner, closeCb);
}

int transport_init(struct transport *t, uv_loop_t *loop)
{
    memset(t, 0, sizeof(*t));
    t->loop = loop;
    int rv = raft_uv_tcp_init(&t->inner, loop);
    if (rv != 0) {
        return rv;
    }
    t->inner.data = t;
    t->outer.init = transportInit;
    t->outer.listen = transportListen;
    t->outer.connect = transportConnect;
    t->outer.close = transportClose;
    return 0;
}

void transport_close(struct transport *t)
{
    raft_uv_tcp_close(&t->inner);
}
