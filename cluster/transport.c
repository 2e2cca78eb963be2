#include "transport.h"
#include "handshake.h"
#include "raft_tls.h"
#include "clog.h"
#include "resolver.h"
#include "tls_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
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

static uint64_t refusedTotal;   /* transport_refused_total() */
static uint64_t authFailedTotal; /* transport_auth_failed_total() */

uint64_t transport_refused_total(void)
{
    return refusedTotal;
}

uint64_t transport_auth_failed_total(void)
{
    return authFailedTotal;
}

/* Says why a connection was closed: at once the first time for each reason and peer (a
 * node we connected to, or the address an incoming connection came from), then at most
 * once per TRANSPORT_LOG_INTERVAL_MS with how many were not said meanwhile (a
 * misconfigured peer reconnects every 100 ms). `what` names the side: "refused from
 * ADDRESS" or "to node N failed"; `why` is one of this file's string constants, the
 * reason, and `text` (NULL: `why` itself) what is said of it, with the node IDs it names.
 * A full table gives the slot logged longest ago to the new reason when that was over an
 * interval ago; else the new one is counted with the others (transport.h). */
static void refusalLog(struct transport *t, raft_id peer, const uint8_t *ip, const char *what,
                       const char *why, const char *text)
{
    static const uint8_t none[16] = {0};
    ip = ip != NULL ? ip : none;
    uint64_t now = uv_now(t->loop);
    size_t i = 0, oldest = 0;
    while (i < TRANSPORT_LOG_REASONS && t->logged[i].why != NULL &&
           (t->logged[i].why != why || t->logged[i].peer != peer ||
            memcmp(t->logged[i].ip, ip, 16) != 0)) {
        if (t->logged[i].log_ms < t->logged[oldest].log_ms) {
            oldest = i;
        }
        i++;
    }
    if (i == TRANSPORT_LOG_REASONS) {
        if (now - t->logged[oldest].log_ms < TRANSPORT_LOG_INTERVAL_MS) {
            /* Every slot was logged within the interval: this one is counted with the
             * others that found no slot, and they are said together at most once an
             * interval (else connections from ever new addresses would each be logged). */
            t->others++;
            if (t->others_log_ms == 0 || now - t->others_log_ms >= TRANSPORT_LOG_INTERVAL_MS) {
                clog_warn("raft connections: %llu refused or failed beyond the %d peers and "
                          "reasons named at a time, in the last %u s (%s)",
                          (unsigned long long)t->others, TRANSPORT_LOG_REASONS,
                          TRANSPORT_LOG_INTERVAL_MS / 1000, why);
                t->others = 0;
                t->others_log_ms = now;
            }
            return;
        }
        i = oldest;
        t->logged[i].why = NULL;
    }
    bool same = t->logged[i].why == why;
    if (same && now - t->logged[i].log_ms < TRANSPORT_LOG_INTERVAL_MS) {
        t->logged[i].unlogged++;
        return;
    }
    if (text == NULL) {
        text = why;
    }
    if (same && t->logged[i].unlogged > 0) {
        clog_warn("raft connection %s: %s (%llu more in the last %u s)", what, text,
                  (unsigned long long)t->logged[i].unlogged, TRANSPORT_LOG_INTERVAL_MS / 1000);
    } else {
        clog_warn("raft connection %s: %s", what, text);
    }
    t->logged[i].why = why;
    t->logged[i].peer = peer;
    memcpy(t->logged[i].ip, ip, 16);
    t->logged[i].log_ms = now;
    t->logged[i].unlogged = 0;
}

static size_t putLe64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
    return 8;
}

/* One write of `len` bytes (copied) on a stream that may be handed to raft, or closed,
 * before it completes: the request is its own allocation, freed by its callback. */
struct authWrite {
    uv_write_t req;
    uint8_t data[TRANSPORT_GREETING_LEN > TRANSPORT_ANSWER_LEN ? TRANSPORT_GREETING_LEN
                                                               : TRANSPORT_ANSWER_LEN];
};

static void authWriteCb(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows as the peer's silence or a closed connection */
    free(req->data);
}

static bool authSend(uv_stream_t *stream, const uint8_t *data, size_t len)
{
    struct authWrite *w = malloc(sizeof(*w));
    if (w == NULL || len > sizeof(w->data)) {
        free(w);
        return false;
    }
    memcpy(w->data, data, len);
    w->req.data = w;
    uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)len);
    if (uv_write(&w->req, stream, &buf, 1, authWriteCb) != 0) {
        free(w);
        return false;
    }
    return true;
}

void transport_tcp_tune(uv_tcp_t *tcp)
{
    uv_tcp_nodelay(tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)tcp, &fd) != 0) {
        return;
    }
    int on = 1, idle = TRANSPORT_KEEPALIVE_S, interval = 2, count = 3;
    unsigned int user_timeout = TRANSPORT_TCP_USER_TIMEOUT_MS;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

void transport_set_listen(struct transport *t, const char *listen)
{
    snprintf(t->listen, sizeof(t->listen), "%s", listen != NULL ? listen : "");
}

void transport_set_resolver(struct transport *t, struct idem_resolver *resolver)
{
    t->resolver = resolver;
}

static int transportInit(struct raft_uv_transport *o, raft_id id, const char *address)
{
    struct transport *t = fromOuter(o);
    snprintf(t->address, sizeof(t->address), "%s", address);
    t->id = id;
    return t->inner.init(&t->inner, id, address);
}

/* ---- the listener: raft_uv_tcp's handshake, bounded ----------------------------------- */

/* One connection whose handshake is being read (handshake.h: raft_uv_tcp's, then with a
 * secret the connector's answer). */
struct incoming {
    struct transport *t;
    /* raft_malloc'd (raft_uv frees the stream it is handed): the TCP connection, or under
     * TLS the plaintext end (raft_tls.h) */
    uv_stream_t *stream;
    struct sockaddr_storage peer; /* the TCP connection's peer, for the log */
    uv_timer_t timer;
    struct handshake hs;
    uint8_t nonce_l[TRANSPORT_NONCE_LEN];
    int closing;    /* handles (tcp, timer) still to close */
    bool handed;    /* the stream went to raft: only the timer closes here */
    TAILQ_ENTRY(incoming) link; /* in t->incoming */
};

static void maybeClosed(struct transport *t);

static void incomingUnlink(struct incoming *in)
{
    struct transport *t = in->t;
    TAILQ_REMOVE(&t->incoming, in, link);
    t->n_incoming--;
}

static void incomingClosedCb(uv_handle_t *h)
{
    struct incoming *in = h->data;
    if (h == (uv_handle_t *)in->stream) {
        raft_free(in->stream);
    }
    if (--in->closing == 0) {
        struct transport *t = in->t;
        free(in);
        t->n_closing_incoming--;
        maybeClosed(t);
    }
}

/* Ends a handshake: closes the connection (unless raft has it) and the timer. `why` (NULL:
 * nothing to say) and `text` as refusalLog() takes them. */
static void incomingEndSaying(struct incoming *in, const char *why, const char *text)
{
    struct transport *t = in->t;
    if (why != NULL) {
        refusedTotal++;
        char what[IDEM_SOCKADDR_TEXT_MAX + 20] = "refused";
        const struct sockaddr *sa = (const struct sockaddr *)&in->peer;
        uint8_t ip[16];
        if (IdemSockaddrKey(sa, ip)) {
            char from[IDEM_SOCKADDR_TEXT_MAX];
            IdemSockaddrText(sa, from, sizeof(from));
            snprintf(what, sizeof(what), "refused from %s", from);
        }
        refusalLog(t, 0, ip, what, why, text);
    }
    incomingUnlink(in);
    t->n_closing_incoming++;
    in->closing = 1;
    uv_timer_stop(&in->timer);
    uv_close((uv_handle_t *)&in->timer, incomingClosedCb);
    if (!in->handed) {
        in->closing++;
        uv_close((uv_handle_t *)in->stream, incomingClosedCb);
    }
}

static void incomingEnd(struct incoming *in, const char *why)
{
    incomingEndSaying(in, why, NULL);
}

static void incomingTimeoutCb(uv_timer_t *timer)
{
    incomingEnd(timer->data, "no handshake (or authentication) within 10 s");
}

static void incomingAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct incoming *in = h->data;
    (void)suggested;
    /* Exactly what the handshake has left: the peer's first message stays in the socket
     * for raft_uv, which starts reading once it has the stream. */
    size_t len = 0;
    uint8_t *base = handshake_room(&in->hs, &len);
    *buf = uv_buf_init((char *)base, (unsigned)len);
}

/* The reasons a listener refuses a connector's MACs (refusalLog()'s `why`). */
static const char authFailed[] = "authentication failed (the peer has another "
                                 "raft.secret_file, or none)";
static const char authFailedUnnamed[] = "authentication failed, target unknown";
static const char authFailedNamed[] = "authentication failed, another target named";
static const char wrongNode[] = "a member asked for another node";

/* 1 + the index of our newest key with which one of the connector's MACs was made for a
 * connection from `id` to `target`; 0 when none was. */
static size_t connectorKey(const struct transport *t, const struct incoming *in, raft_id id,
                           raft_id target)
{
    return handshake_connector_key(t->key, t->n_keys, in->nonce_l, in->hs.auth_answer, id, target,
                                   in->hs.addr);
}

/* None of the connector's MACs is right for this node: closes, saying why as well as it
 * can be told. When the connector's nonce names another node and its MACs are right for
 * that one, it holds the secret and means to reach that node at our address (its Raft
 * configuration gives that node our address: `members add` with a wrong ID): the log says
 * so, and the connector is told our ID under the key it proved (transport.h), so that it
 * can say so too. Else the MACs prove nothing, and nothing more is sent. */
static void incomingRefuse(struct incoming *in, uv_stream_t *s, raft_id id)
{
    struct transport *t = in->t;
    const uint8_t *nonce_c = in->hs.auth_answer;
    const uint8_t *macs = in->hs.auth_answer + TRANSPORT_NONCE_LEN;
    char text[TRANSPORT_ADDRESS_MAX + 400];
    raft_id asked = 0;
    if (!handshake_nonce_target(nonce_c, &asked)) {
        snprintf(text, sizeof(text),
                 "authentication failed (the peer has another raft.secret_file, or none; or it "
                 "runs an earlier idemd and meant to reach another node than this one, node "
                 "%llu)",
                 (unsigned long long)t->id);
        incomingEndSaying(in, authFailedUnnamed, text);
        return;
    }
    size_t k = asked != t->id ? connectorKey(t, in, id, asked) : 0;
    if (k == 0) {
        if (asked == t->id) {
            incomingEnd(in, authFailed);
            return;
        }
        snprintf(text, sizeof(text), "%s; it also asked for node %llu, and this is node %llu",
                 authFailed, (unsigned long long)asked, (unsigned long long)t->id);
        incomingEndSaying(in, authFailedNamed, text);
        return;
    }
    uint8_t answer[TRANSPORT_MAC_LEN], mac[TRANSPORT_MAC_LEN];
    putLe64(answer, t->id);
    if (handshake_mac(t->key[k - 1], "refusal", in->nonce_l, nonce_c, id, t->id, macs, in->hs.addr,
                      mac)) {
        memcpy(answer + 8, mac, sizeof(answer) - 8);
        /* libuv writes it at once (nothing else is queued on the stream), before the close
         * below; were it lost, the connector would only say less. */
        authSend(s, answer, sizeof(answer));
    }
    snprintf(text, sizeof(text),
             "node %llu (raft address %s) asked for node %llu, and this is node %llu: its Raft "
             "configuration gives node %llu this node's raft address (members add with a "
             "wrong id, or a wrong address?); refused, and told which node this is",
             (unsigned long long)id, in->hs.addr, (unsigned long long)asked,
             (unsigned long long)t->id, (unsigned long long)asked);
    incomingEndSaying(in, wrongNode, text);
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
    const char *why = NULL;
    enum handshake_status st = handshake_feed(&in->hs, (size_t)nread, &why);
    if (st == HANDSHAKE_REFUSED) {
        incomingEnd(in, why);
        return;
    }
    if (st == HANDSHAKE_MORE) {
        return;
    }
    struct transport *t = in->t;
    raft_id id = in->hs.id;
    if (t->auth) {
        uint8_t mine[TRANSPORT_MAC_LEN];
        const uint8_t *nonce_c = in->hs.auth_answer;
        const uint8_t *macs = in->hs.auth_answer + TRANSPORT_NONCE_LEN;
        /* Our newest key that one of the connector's MACs was made with. */
        size_t k = connectorKey(t, in, id, t->id);
        if (k == 0) {
            incomingRefuse(in, s, id);
            return;
        }
        if (!handshake_mac(t->key[k - 1], "listener", in->nonce_l, nonce_c, id, t->id, macs,
                           in->hs.addr, mine) ||
            !authSend(s, mine, sizeof(mine))) {
            incomingEnd(in, "cannot answer the authentication");
            return;
        }
    }
    uv_read_stop(s);
    in->handed = true;
    uv_stream_t *stream = in->stream;
    char addr[TRANSPORT_ADDRESS_MAX];
    memcpy(addr, in->hs.addr, sizeof(addr));
    incomingEnd(in, NULL);
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
        clog_error("out of memory");
        abort();
    }
    in->t = t;
    in->stream = (uv_stream_t *)tcp;
    handshake_init(&in->hs, t->auth);
    uv_tcp_init(t->loop, tcp);
    tcp->data = in;
    uv_timer_init(t->loop, &in->timer);
    in->timer.data = in;
    TAILQ_INSERT_TAIL(&t->incoming, in, link);
    t->n_incoming++;
    if (uv_accept(l, (uv_stream_t *)tcp) != 0) {
        incomingEnd(in, NULL);
        return;
    }
    if (t->n_incoming > TRANSPORT_HANDSHAKES_MAX) {
        /* The oldest unfinished handshake goes, not the new one: connections that are held
         * open cannot keep the members (who finish in a round trip) out. */
        incomingEnd(TAILQ_FIRST(&t->incoming),
                    "too many handshakes in progress (the oldest closed)");
    }
    transport_tcp_tune(tcp);
    int len = sizeof(in->peer);
    uv_tcp_getpeername(tcp, (struct sockaddr *)&in->peer, &len);
    uv_timer_start(&in->timer, incomingTimeoutCb, TRANSPORT_HANDSHAKE_TIMEOUT_MS, 0);
    /* Under TLS the handshake, the authentication and raft's messages are read from the
     * plaintext end, within this timer and slot (raft_tls.h). */
    uv_stream_t *plain = NULL;
    if (t->tls != NULL) {
        if (raft_tls_accept(t->tls, tcp, &plain) != 0) {
            incomingEnd(in, "cannot start TLS (out of file descriptors or memory?)");
            return;
        }
        in->stream = plain;
        plain->data = in;
    }
    if (t->auth) {
        uint8_t hello[TRANSPORT_GREETING_LEN] = {0};
        memcpy(hello, TRANSPORT_AUTH_MAGIC, 8);
        if (RAND_bytes(in->nonce_l, sizeof(in->nonce_l)) != 1) {
            incomingEnd(in, "no random bytes for the authentication");
            return;
        }
        memcpy(hello + 8, in->nonce_l, sizeof(in->nonce_l));
        if (!authSend(in->stream, hello, sizeof(hello))) {
            incomingEnd(in, "cannot start the authentication");
            return;
        }
    }
    uv_read_start(in->stream, incomingAllocCb, incomingReadCb);
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
     * the connections that have not finished one; and binds IPv4 addresses only. */
    bool own = t->listen[0] == '\0' || strcmp(t->listen, t->address) == 0;
    const char *bind = own ? t->address : t->listen;
    char host[IDEM_HOST_MAX + 1];
    uint16_t port = 0;
    struct sockaddr_storage sa;
    char why[IDEM_HOST_MAX + 100] = "";
    int rv = UV_EINVAL;
    if (IdemHostPortSplit(bind, host, sizeof(host), &port)) {
        rv = IdemSockaddrResolveNow(host, port, &sa, why, sizeof(why)) == 0 ? 0 : UV_EINVAL;
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
        snprintf(o->errmsg, sizeof(o->errmsg), "raft %saddress %.120s: %.100s",
                 own ? "" : "listen ", bind, why[0] != '\0' ? why : strerror(-rv));
        return RAFT_IOERR;
    }
    return 0;
}

/* ---- outgoing connections: the address resolved, a connection, the authentication ------ */

enum outgoingState {
    OG_NONE,       /* between tries: nothing in flight */
    OG_RESOLVING,  /* the name is being looked up (lookup) */
    OG_CONNECTING, /* plain TCP: connecting, then raft_uv_tcp's handshake written (stream) */
    OG_TLS,        /* raft_tls connects and writes the handshake inside TLS (nothing of ours) */
    OG_AUTH,       /* connected: the authentication read and answered (stream) */
};

/* One connection attempt raft asked for (transportConnect), until raft has its stream or is
 * told the attempt failed. */
struct outgoing {
    struct transport *t;
    struct raft_uv_connect inner; /* raft_tls's request */
    struct raft_uv_connect *outer;
    raft_id peer;
    char address[TRANSPORT_ADDRESS_MAX]; /* the peer's, as raft gave it */
    char host[IDEM_HOST_MAX + 1];        /* its host: an address, or a name */
    uint16_t port;
    enum outgoingState state;
    struct idem_lookup *lookup;                      /* OG_RESOLVING */
    struct sockaddr_storage addrs[IDEM_RESOLVE_MAX]; /* the host's, tried in turn */
    size_t n_addrs;
    size_t next_addr;
    uv_connect_t connect;
    uv_write_t hs_write;
    uint8_t *hs;         /* raft_uv_tcp's handshake while it is written (plain TCP) */
    uv_stream_t *stream; /* the TCP handle (OG_CONNECTING), the connection (OG_AUTH);
                          * raft_malloc'd */
    uv_timer_t timer;    /* the whole attempt within TRANSPORT_HANDSHAKE_TIMEOUT_MS */
    bool timed_out;      /* ... which it did not make: no address is tried after it */
    uint8_t buf[TRANSPORT_GREETING_LEN]; /* the greeting, then the listener's MAC */
    uint8_t nonce_l[TRANSPORT_NONCE_LEN];
    uint8_t nonce_c[TRANSPORT_NONCE_LEN];
    size_t want;
    size_t got;
    bool greeted;  /* the greeting read, our MACs sent */
    uint8_t macs[HANDSHAKE_MACS_LEN]; /* as sent: the listener's MAC covers them */
    bool ending;                      /* outgoingEnd()ed */
    int status;                       /* for raft's callback: RAFT_NOCONNECTION or RAFT_CANCELED */
    int closing;                      /* handles (timer, stream) and a TLS attempt still to end */
    TAILQ_ENTRY(outgoing) link; /* in t->outgoing */
};

/* A socket of a failed try (or one raft_tls handed over too late), closed on its own. */
static void strayClosedCb(uv_handle_t *h)
{
    struct transport *t = h->data;
    raft_free(h);
    t->n_closing_handles--;
    maybeClosed(t);
}

static void strayClose(struct transport *t, uv_handle_t *h)
{
    h->data = t;
    t->n_closing_handles++;
    uv_close(h, strayClosedCb);
}

/* One of what an ended attempt waited for is over; the last one tells raft. */
static void outgoingRelease(struct outgoing *og)
{
    if (--og->closing > 0) {
        return;
    }
    struct transport *t = og->t;
    struct raft_uv_connect *outer = og->outer;
    /* raft_uv's clients take only RAFT_CANCELED once they are closing (uvSendClose comes
     * before the transport's close). */
    int status = t->closing ? RAFT_CANCELED : og->status;
    free(og);
    t->n_closing_outgoing--;
    outer->cb(outer, NULL, status);
    maybeClosed(t);
}

static void outgoingClosedCb(uv_handle_t *h)
{
    struct outgoing *og = h->data;
    if (h == (uv_handle_t *)og->stream) {
        raft_free(og->stream);
        og->stream = NULL;
    }
    outgoingRelease(og);
}

/* Ends the attempt with `status` (RAFT_NOCONNECTION; RAFT_CANCELED when the transport
 * closes): its lookup withdrawn, its handles closed, then raft told (after raft_tls's
 * callback too, when a TLS connection is being made: it comes once raft_tls closes). */
static void outgoingEnd(struct outgoing *og, int status)
{
    struct transport *t = og->t;
    if (og->ending) {
        return;
    }
    og->ending = true;
    og->status = status;
    TAILQ_REMOVE(&t->outgoing, og, link);
    t->n_closing_outgoing++;
    if (og->lookup != NULL) {
        IdemResolveCancel(og->lookup);
        og->lookup = NULL;
    }
    og->closing = 1 + (og->stream != NULL) + (og->state == OG_TLS);
    uv_timer_stop(&og->timer);
    uv_close((uv_handle_t *)&og->timer, outgoingClosedCb);
    if (og->stream != NULL) {
        uv_close((uv_handle_t *)og->stream, outgoingClosedCb);
    }
}

/* Says why an attempt failed, by refusalLog()'s rules, without counting it as an
 * authentication's failure. */
static void outgoingSay(struct outgoing *og, const char *why, const char *text)
{
    char what[48];
    snprintf(what, sizeof(what), "to node %llu failed", (unsigned long long)og->peer);
    refusalLog(og->t, og->peer, NULL, what, why, text);
}

/* Ends an authentication that failed (why, and text, as refusalLog() takes them); raft tries
 * again after its retry delay. */
static void outgoingFailSaying(struct outgoing *og, const char *why, const char *text)
{
    authFailedTotal++;
    outgoingSay(og, why, text);
    outgoingEnd(og, RAFT_NOCONNECTION);
}

static void outgoingFail(struct outgoing *og, const char *why)
{
    outgoingFailSaying(og, why, NULL);
}

/* The reasons an attempt failed before any authentication (outgoingSay's `why`). */
static const char resolveFailed[] = "cannot resolve the peer's host name";
static const char attemptTimedOut[] = "no connection in time";

/* The timer of an attempt whose stream raft has. */
static void outgoingTimerClosedCb(uv_handle_t *h)
{
    struct outgoing *og = h->data;
    struct transport *t = og->t;
    free(og);
    t->n_closing_outgoing--;
    maybeClosed(t);
}

/* An authenticated stream (or, without a secret, a connected one) goes to raft, which sets
 * its data; the rest of the attempt goes with the timer's close. */
static void outgoingHandOver(struct outgoing *og)
{
    struct transport *t = og->t;
    TAILQ_REMOVE(&t->outgoing, og, link);
    struct raft_uv_connect *outer = og->outer;
    uv_stream_t *stream = og->stream;
    og->stream = NULL;
    uv_timer_stop(&og->timer);
    t->n_closing_outgoing++;
    og->ending = true;
    og->closing = 1;
    uv_close((uv_handle_t *)&og->timer, outgoingTimerClosedCb);
    transport_watch(t, og->peer, stream);
    outer->cb(outer, stream, 0);
}

static void outgoingTimeoutCb(uv_timer_t *timer)
{
    struct outgoing *og = timer->data;
    char text[TRANSPORT_ADDRESS_MAX + IDEM_HOST_MAX + 200];
    og->timed_out = true;
    switch (og->state) {
    case OG_TLS:
        return; /* raft_tls's own timeout ends it, and no other address is tried */
    case OG_AUTH:
        outgoingFail(og, "no authentication from the peer within 10 s (has it the same "
                         "raft.secret_file?)");
        return;
    case OG_RESOLVING:
        snprintf(text, sizeof(text), "%s %s (node %llu's raft address %s) within %u s",
                 resolveFailed, og->host, (unsigned long long)og->peer, og->address,
                 TRANSPORT_HANDSHAKE_TIMEOUT_MS / 1000);
        outgoingSay(og, resolveFailed, text);
        break;
    default:
        snprintf(text, sizeof(text),
                 "no connection to node %llu at %s within %u s (is it up, at an address "
                 "its raft address still resolves to?)",
                 (unsigned long long)og->peer, og->address, TRANSPORT_HANDSHAKE_TIMEOUT_MS / 1000);
        outgoingSay(og, attemptTimedOut, text);
        break;
    }
    outgoingEnd(og, RAFT_NOCONNECTION);
}

static void outgoingAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct outgoing *og = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)og->buf + og->got, (unsigned)(og->want - og->got));
}

/* The listener's greeting is read: our nonce and MACs go back. */
static void outgoingGreeted(struct outgoing *og, uv_stream_t *s)
{
    struct transport *t = og->t;
    if (!handshake_greeting(og->buf, og->nonce_l)) {
        outgoingFail(og, "the peer does not authenticate Raft connections");
        return;
    }
    uint8_t answer[TRANSPORT_ANSWER_LEN] = {0};
    uint8_t *macs = answer + TRANSPORT_NONCE_LEN;
    /* Our nonce names the node we mean to reach (transport.h), in the clear. */
    memcpy(og->nonce_c, TRANSPORT_TARGET_MAGIC, 8);
    putLe64(og->nonce_c + 8, og->peer);
    bool ok = RAND_bytes(og->nonce_c + 16, sizeof(og->nonce_c) - 16) == 1;
    for (size_t k = 0; ok && k < t->n_keys; k++) {
        ok = handshake_mac(t->key[k], "connector", og->nonce_l, og->nonce_c, t->id, og->peer, NULL,
                           t->address, macs + k * TRANSPORT_MAC_LEN);
    }
    if (!ok) {
        outgoingFail(og, "cannot compute the authentication");
        return;
    }
    memcpy(answer, og->nonce_c, sizeof(og->nonce_c));
    memcpy(og->macs, macs, sizeof(og->macs));
    if (!authSend(s, answer, sizeof(answer))) {
        outgoingFail(og, "cannot send the authentication");
        return;
    }
    og->greeted = true;
    og->want = TRANSPORT_MAC_LEN;
    og->got = 0;
}

static void outgoingReadCb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct outgoing *og = s->data;
    struct transport *t = og->t;
    (void)buf;
    if (nread == 0) {
        return;
    }
    if (nread < 0) {
        static const char closed[] = "the peer closed the connection during the "
                                     "authentication";
        char text[200];
        snprintf(text, sizeof(text),
                 "%s (has it the same raft.secret_file? or, running an earlier idemd, is it "
                 "another node than node %llu?)",
                 closed, (unsigned long long)og->peer);
        outgoingFailSaying(og, closed, text);
        return;
    }
    og->got += (size_t)nread;
    if (og->got < og->want) {
        return;
    }
    if (!og->greeted) {
        outgoingGreeted(og, s);
        return;
    }
    /* Made with one of our keys (the newest the listener has), or a refusal as another node
     * made with one of them. */
    raft_id other = 0;
    enum handshake_answer an =
        handshake_listener_answer(t->key, t->n_keys, og->nonce_l, og->nonce_c, t->id, og->peer,
                                  og->macs, t->address, og->buf, &other);
    if (an == HANDSHAKE_ANSWER_REFUSED) {
        static const char otherNode[] = "the peer is another node";
        char text[TRANSPORT_ADDRESS_MAX + 300];
        snprintf(text, sizeof(text),
                 "the node at %s is node %llu, not node %llu (members add with a wrong id, or a "
                 "wrong raft address?): remove member %llu, and add the node with its own id "
                 "and addresses",
                 og->address, (unsigned long long)other, (unsigned long long)og->peer,
                 (unsigned long long)og->peer);
        outgoingFailSaying(og, otherNode, text);
        return;
    }
    if (an != HANDSHAKE_ANSWER_OK) {
        outgoingFail(og, "the peer's authentication is wrong (it has another "
                         "raft.secret_file)");
        return;
    }
    uv_read_stop(s);
    outgoingHandOver(og);
}

/* Connected, raft_uv_tcp's handshake written: authenticated first when a secret is set. */
static void outgoingConnected(struct outgoing *og, uv_stream_t *stream)
{
    struct transport *t = og->t;
    if (stream->type == UV_TCP) {
        transport_tcp_tune((uv_tcp_t *)stream); /* under TLS raft_tls tuned its socket */
    }
    og->state = OG_AUTH;
    og->stream = stream;
    if (og->timed_out) { /* raft_tls connected after our timer: the authentication gets one */
        og->timed_out = false;
        uv_timer_start(&og->timer, outgoingTimeoutCb, TRANSPORT_HANDSHAKE_TIMEOUT_MS, 0);
    }
    if (!t->auth) {
        outgoingHandOver(og);
        return;
    }
    stream->data = og;
    og->want = sizeof(og->buf);
    og->got = 0;
    uv_read_start(stream, outgoingAllocCb, outgoingReadCb);
}

static void dialNext(struct outgoing *og);

static void handshakeWrittenCb(uv_write_t *w, int status)
{
    struct outgoing *og = w->data;
    free(og->hs);
    og->hs = NULL;
    if (og->ending) {
        return; /* cancelled: the close reports */
    }
    if (status != 0) {
        outgoingEnd(og, RAFT_NOCONNECTION);
        return;
    }
    outgoingConnected(og, og->stream);
}

static void plainConnectCb(uv_connect_t *c, int status)
{
    struct outgoing *og = c->data;
    if (og->ending) {
        return; /* cancelled: the close reports */
    }
    if (status != 0) { /* refused, unreachable: the next address, if any */
        uv_stream_t *tcp = og->stream;
        og->stream = NULL;
        og->state = OG_NONE;
        strayClose(og->t, (uv_handle_t *)tcp);
        dialNext(og);
        return;
    }
    size_t len = 0;
    og->hs = handshake_encode(og->t->id, og->t->address, &len);
    og->hs_write.data = og;
    uv_buf_t b = uv_buf_init((char *)og->hs, (unsigned)len);
    if (og->hs == NULL || uv_write(&og->hs_write, og->stream, &b, 1, handshakeWrittenCb) != 0) {
        free(og->hs);
        og->hs = NULL;
        outgoingEnd(og, RAFT_NOCONNECTION);
    }
}

static void tlsConnectCb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct outgoing *og = req->data;
    og->state = OG_NONE;
    if (og->ending) {
        if (stream != NULL) {
            strayClose(og->t, (uv_handle_t *)stream);
        }
        outgoingRelease(og);
        return;
    }
    if (status != 0) {
        dialNext(og);
        return;
    }
    outgoingConnected(og, stream);
}

/* Connects to the next of the peer's addresses: under TLS raft_tls does, and writes
 * raft_uv_tcp's handshake inside TLS; else a TCP connection of ours, the handshake written
 * as raft_uv_tcp does. With none left (or the time up), the attempt failed. */
static void dialNext(struct outgoing *og)
{
    struct transport *t = og->t;
    while (!og->timed_out && og->next_addr < og->n_addrs) {
        const struct sockaddr *sa = (const struct sockaddr *)&og->addrs[og->next_addr++];
        if (t->tls != NULL) {
            og->inner.data = og;
            if (raft_tls_connect(t->tls, &og->inner, og->peer, sa, og->host, t->id, t->address,
                                 tlsConnectCb) == 0) {
                og->state = OG_TLS;
                return;
            }
            continue;
        }
        uv_tcp_t *tcp = raft_malloc(sizeof(*tcp));
        if (tcp == NULL) {
            break;
        }
        uv_tcp_init(t->loop, tcp);
        tcp->data = og;
        og->connect.data = og;
        if (uv_tcp_connect(&og->connect, tcp, sa, plainConnectCb) == 0) {
            og->state = OG_CONNECTING;
            og->stream = (uv_stream_t *)tcp;
            return;
        }
        strayClose(t, (uv_handle_t *)tcp);
    }
    outgoingEnd(og, RAFT_NOCONNECTION);
}

static void resolvedCb(void *data, int status, const struct sockaddr_storage *addrs, size_t n)
{
    struct outgoing *og = data;
    og->lookup = NULL;
    og->state = OG_NONE;
    if (status != 0 || n == 0) {
        char text[TRANSPORT_ADDRESS_MAX + IDEM_HOST_MAX + 200];
        snprintf(text, sizeof(text), "cannot resolve %s (node %llu's raft address %s): %s",
                 og->host, (unsigned long long)og->peer, og->address, IdemResolveStrerror(status));
        outgoingSay(og, resolveFailed, text);
        outgoingEnd(og, RAFT_NOCONNECTION);
        return;
    }
    memcpy(og->addrs, addrs, n * sizeof(*addrs));
    og->n_addrs = n;
    dialNext(og);
}

/* raft_uv's connect: an attempt to reach node `id` at `address`. Its host, when a name, is
 * looked up again unless its last answer is at most TRANSPORT_RESOLVE_REUSE_MS old
 * (transport.h); raft's callback always comes later, from the loop. */
static int transportConnect(struct raft_uv_transport *o, struct raft_uv_connect *req,
                            raft_id id, const char *address, raft_uv_connect_cb cb)
{
    struct transport *t = fromOuter(o);
    struct outgoing *og = calloc(1, sizeof(*og));
    if (og == NULL) {
        return RAFT_NOMEM;
    }
    og->t = t;
    og->outer = req;
    og->peer = id;
    snprintf(og->address, sizeof(og->address), "%s", address);
    req->cb = cb;
    if (!IdemHostPortSplit(address, og->host, sizeof(og->host), &og->port)) {
        free(og);
        return RAFT_NOCONNECTION;
    }
    if (IdemSockaddrLiteral(og->host, og->port, &og->addrs[0])) {
        og->n_addrs = 1;
    } else if (t->resolver != NULL) {
        og->n_addrs = IdemResolverCached(t->resolver, og->host, og->port,
                                         TRANSPORT_RESOLVE_REUSE_MS, og->addrs, IDEM_RESOLVE_MAX);
    }
    if (og->n_addrs == 0) {
        if (t->resolver == NULL ||
            IdemResolve(t->resolver, og->host, og->port, resolvedCb, og, &og->lookup) != 0) {
            free(og);
            return RAFT_NOCONNECTION;
        }
        og->state = OG_RESOLVING;
    }
    uv_timer_init(t->loop, &og->timer);
    og->timer.data = og;
    TAILQ_INSERT_TAIL(&t->outgoing, og, link);
    uv_timer_start(&og->timer, outgoingTimeoutCb, TRANSPORT_HANDSHAKE_TIMEOUT_MS, 0);
    if (og->state == OG_NONE) {
        dialNext(og); /* a failure here still calls back from the loop (the timer's close) */
    }
    return 0;
}

/* raft's close callback, once raft_uv_tcp, our listener, every handshake and every TLS pump
 * are closed. */
static void maybeClosed(struct transport *t)
{
    if (t->closing && t->inner_closed && !t->listener_open && TAILQ_EMPTY(&t->incoming) &&
        t->n_closing_incoming == 0 && TAILQ_EMPTY(&t->outgoing) && t->n_closing_outgoing == 0 &&
        t->n_closing_handles == 0 && (t->tls == NULL || raft_tls_closed(t->tls)) &&
        t->close_cb != NULL) {
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
    while (!TAILQ_EMPTY(&t->incoming)) {
        incomingEnd(TAILQ_FIRST(&t->incoming), NULL);
    }
    while (!TAILQ_EMPTY(&t->outgoing)) {
        outgoingEnd(TAILQ_FIRST(&t->outgoing), RAFT_CANCELED);
    }
    if (t->listener_open && !uv_is_closing((uv_handle_t *)&t->listener)) {
        uv_close((uv_handle_t *)&t->listener, listenerClosedCb);
    }
    if (t->tls != NULL) {
        raft_tls_close(t->tls); /* connections being made end RAFT_CANCELED */
    }
    t->inner.close(&t->inner, closeCb);
}

int transport_init(struct transport *t, uv_loop_t *loop, const struct transport_secret *secrets,
                   size_t n_secrets)
{
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < TRANSPORT_WATCHED_MAX; i++) {
        t->watched[i].fd = -1;
    }
    TAILQ_INIT(&t->incoming);
    TAILQ_INIT(&t->outgoing);
    t->loop = loop;
    if (n_secrets > TRANSPORT_KEYS_MAX) {
        return RAFT_INVALID;
    }
    for (size_t k = 0; k < n_secrets; k++) {
        unsigned int len = 0;
        if (HMAC(EVP_sha256(), secrets[k].value, (int)secrets[k].len,
                 (const uint8_t *)TRANSPORT_AUTH_LABEL, strlen(TRANSPORT_AUTH_LABEL), t->key[k],
                 &len) == NULL ||
            len != TRANSPORT_MAC_LEN) {
            OPENSSL_cleanse(t->key, sizeof(t->key));
            return RAFT_INVALID;
        }
        t->n_keys = k + 1;
        t->auth = true;
    }
    int rv = raft_uv_tcp_init(&t->inner, loop);
    if (rv != 0) {
        OPENSSL_cleanse(t->key, sizeof(t->key));
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
    OPENSSL_cleanse(t->key, sizeof(t->key));
    raft_uv_tcp_close(&t->inner);
    raft_tls_free(t->tls);
    t->tls = NULL;
}

/* A TLS connection that failed (raft_tls.h): logged and counted as the transport's other
 * refusals, by the address it came from or the node it was for. */
static void tlsFailCb(void *data, const struct raft_tls_failure *f)
{
    struct transport *t = data;
    char what[IDEM_SOCKADDR_TEXT_MAX + 40];
    uint8_t ip[16] = {0};
    if (f->incoming) {
        refusedTotal++;
        snprintf(what, sizeof(what), "refused");
        if (f->from != NULL && IdemSockaddrKey(f->from, ip)) {
            char from[IDEM_SOCKADDR_TEXT_MAX];
            IdemSockaddrText(f->from, from, sizeof(from));
            snprintf(what, sizeof(what), "refused from %s", from);
        }
    } else {
        authFailedTotal++;
        snprintf(what, sizeof(what), "to node %llu failed", (unsigned long long)f->peer);
    }
    refusalLog(t, f->incoming ? 0 : f->peer, ip, what, f->why, f->text);
}

static void tlsClosedCb(void *data)
{
    maybeClosed(data);
}

int transport_tls(struct transport *t, const struct raft_tls_files *files, char *err, size_t errlen)
{
    struct raft_tls_cbs cbs = {.data = t, .fail = tlsFailCb, .closed = tlsClosedCb};
    return raft_tls_new(t->loop, files, TRANSPORT_HANDSHAKE_TIMEOUT_MS, &cbs, &t->tls, err, errlen);
}

void transport_tls_set(struct transport *t, struct idem_tls_ctx *server,
                       struct idem_tls_ctx *client)
{
    if (t->tls == NULL) { /* plain TCP: tls.raft changes only with a restart */
        IdemTlsCtxFree(server);
        IdemTlsCtxFree(client);
        return;
    }
    raft_tls_set(t->tls, server, client);
}
