#include "transport.h"
#include "handshake.h"
#include "raft_tls.h"
#include "clog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
 * A full table gives the slot logged longest ago to the new reason. */
static void refusalLog(struct transport *t, raft_id peer, uint32_t ip, const char *what,
                       const char *why, const char *text)
{
    uint64_t now = uv_now(t->loop);
    size_t i = 0, oldest = 0;
    while (i < TRANSPORT_LOG_REASONS && t->logged[i].why != NULL &&
           (t->logged[i].why != why || t->logged[i].peer != peer || t->logged[i].ip != ip)) {
        if (t->logged[i].log_ms < t->logged[oldest].log_ms) {
            oldest = i;
        }
        i++;
    }
    if (i == TRANSPORT_LOG_REASONS) {
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
    t->logged[i].ip = ip;
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

static void noDelay(struct uv_stream_s *stream)
{
    /* raft_uv_tcp's streams are uv_tcp_t (under TLS, pipes: raft_tls.c sets it on the TCP
     * connection). A failure only costs latency. */
    if (stream->type == UV_TCP) {
        uv_tcp_nodelay((uv_tcp_t *)stream, 1);
    }
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
        char what[80] = "refused";
        const struct sockaddr_storage *sa = &in->peer;
        char ip[INET6_ADDRSTRLEN];
        uint32_t ip4 = 0;
        if (sa->ss_family == AF_INET &&
            uv_ip4_name((const struct sockaddr_in *)sa, ip, sizeof(ip)) == 0) {
            const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
            ip4 = ntohl(sin->sin_addr.s_addr);
            snprintf(what, sizeof(what), "refused from %s:%u", ip,
                     (unsigned)ntohs(sin->sin_port));
        }
        refusalLog(t, 0, ip4, what, why, text);
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
        snprintf(o->errmsg, sizeof(o->errmsg), "raft address %.200s: %s", t->address,
                 strerror(-rv));
        return RAFT_IOERR;
    }
    return 0;
}

/* ---- outgoing connections: raft_uv_tcp's, then the authentication ------------------- */

/* One connection raft_uv_tcp made (its handshake written) whose authentication is being
 * read and answered before raft gets it. */
struct outgoing {
    struct transport *t;
    struct raft_uv_connect inner;
    struct raft_uv_connect *outer;
    raft_id peer;
    char address[TRANSPORT_ADDRESS_MAX]; /* the peer's, as raft gave it */
    uv_stream_t *stream; /* raft_uv_tcp's (raft_malloc'd) */
    uv_timer_t timer;
    uint8_t buf[TRANSPORT_GREETING_LEN]; /* the greeting, then the listener's MAC */
    uint8_t nonce_l[TRANSPORT_NONCE_LEN];
    uint8_t nonce_c[TRANSPORT_NONCE_LEN];
    size_t want;
    size_t got;
    bool greeted;  /* the greeting read, our MACs sent */
    uint8_t macs[HANDSHAKE_MACS_LEN]; /* as sent: the listener's MAC covers them */
    int status;    /* for raft's callback when it failed: RAFT_NOCONNECTION or _CANCELED */
    int closing;   /* handles (stream, timer) still to close */
    TAILQ_ENTRY(outgoing) link; /* in t->outgoing */
};

static void outgoingClosedCb(uv_handle_t *h)
{
    struct outgoing *og = h->data;
    if (h == (uv_handle_t *)og->stream) {
        raft_free(og->stream);
    }
    if (--og->closing == 0) {
        struct transport *t = og->t;
        struct raft_uv_connect *outer = og->outer;
        /* raft_uv's clients take only RAFT_CANCELED once they are closing (uvSendClose
         * comes before the transport's close). */
        int status = t->closing ? RAFT_CANCELED : og->status;
        free(og);
        t->n_closing_outgoing--;
        outer->cb(outer, NULL, status);
        maybeClosed(t);
    }
}

static void outgoingUnlink(struct outgoing *og)
{
    TAILQ_REMOVE(&og->t->outgoing, og, link);
}

/* Ends an authentication that failed (why, and text, as refusalLog() takes them) or was
 * cancelled (why NULL): closes the connection, then tells raft, which tries again after its
 * retry delay. */
static void outgoingFailSaying(struct outgoing *og, const char *why, const char *text)
{
    struct transport *t = og->t;
    og->status = RAFT_NOCONNECTION;
    if (why != NULL) {
        authFailedTotal++;
        char what[48];
        snprintf(what, sizeof(what), "to node %llu failed", (unsigned long long)og->peer);
        refusalLog(t, og->peer, 0, what, why, text);
    } else {
        og->status = RAFT_CANCELED;
    }
    outgoingUnlink(og);
    t->n_closing_outgoing++;
    og->closing = 2;
    uv_timer_stop(&og->timer);
    uv_close((uv_handle_t *)&og->timer, outgoingClosedCb);
    uv_close((uv_handle_t *)og->stream, outgoingClosedCb);
}

static void outgoingFail(struct outgoing *og, const char *why)
{
    outgoingFailSaying(og, why, NULL);
}

/* The timer of an authentication that succeeded: the stream is raft's already. */
static void outgoingTimerClosedCb(uv_handle_t *h)
{
    struct outgoing *og = h->data;
    struct transport *t = og->t;
    free(og);
    t->n_closing_outgoing--;
    maybeClosed(t);
}

static void outgoingTimeoutCb(uv_timer_t *timer)
{
    outgoingFail(timer->data, "no authentication from the peer within 10 s (has it the same "
                              "raft.secret_file?)");
}

static void outgoingAllocCb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct outgoing *og = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)og->buf + og->got, (unsigned)(og->want - og->got));
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
            ok = handshake_mac(t->key[k], "connector", og->nonce_l, og->nonce_c, t->id, og->peer,
                               NULL, t->address, macs + k * TRANSPORT_MAC_LEN);
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
    /* Authenticated: the stream is raft's from here (it sets stream->data); the rest of
     * this request goes with the timer's close. */
    uv_read_stop(s);
    outgoingUnlink(og);
    struct raft_uv_connect *outer = og->outer;
    uv_stream_t *stream = og->stream;
    uv_timer_stop(&og->timer);
    t->n_closing_outgoing++;
    uv_close((uv_handle_t *)&og->timer, outgoingTimerClosedCb);
    outer->cb(outer, stream, 0);
}

static void connectCb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct outgoing *og = req->data;
    struct transport *t = og->t;
    struct raft_uv_connect *outer = og->outer;
    if (status != 0 || !t->auth) {
        free(og);
        if (status == 0) {
            noDelay(stream);
        }
        outer->cb(outer, stream, status);
        return;
    }
    noDelay(stream);
    og->stream = stream;
    stream->data = og;
    og->want = sizeof(og->buf);
    uv_timer_init(t->loop, &og->timer);
    og->timer.data = og;
    TAILQ_INSERT_TAIL(&t->outgoing, og, link);
    uv_timer_start(&og->timer, outgoingTimeoutCb, TRANSPORT_HANDSHAKE_TIMEOUT_MS, 0);
    uv_read_start(stream, outgoingAllocCb, outgoingReadCb);
}

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
    og->inner.data = og;
    /* Under TLS raft_tls connects, and writes raft_uv_tcp's handshake inside TLS. */
    int rv = t->tls != NULL
                 ? raft_tls_connect(t->tls, &og->inner, id, address, t->id, t->address, connectCb)
                 : t->inner.connect(&t->inner, &og->inner, id, address, connectCb);
    if (rv != 0) {
        free(og);
    }
    return rv;
}

/* raft's close callback, once raft_uv_tcp, our listener, every handshake and every TLS pump
 * are closed. */
static void maybeClosed(struct transport *t)
{
    if (t->closing && t->inner_closed && !t->listener_open && TAILQ_EMPTY(&t->incoming) &&
        t->n_closing_incoming == 0 && TAILQ_EMPTY(&t->outgoing) && t->n_closing_outgoing == 0 &&
        (t->tls == NULL || raft_tls_closed(t->tls)) && t->close_cb != NULL) {
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
        outgoingFail(TAILQ_FIRST(&t->outgoing), NULL);
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
    char what[80];
    uint32_t ip4 = 0;
    if (f->incoming) {
        refusedTotal++;
        char ip[INET6_ADDRSTRLEN];
        snprintf(what, sizeof(what), "refused");
        if (f->from != NULL && uv_ip4_name(f->from, ip, sizeof(ip)) == 0) {
            ip4 = ntohl(f->from->sin_addr.s_addr);
            snprintf(what, sizeof(what), "refused from %s:%u", ip,
                     (unsigned)ntohs(f->from->sin_port));
        }
    } else {
        authFailedTotal++;
        snprintf(what, sizeof(what), "to node %llu failed", (unsigned long long)f->peer);
    }
    refusalLog(t, f->incoming ? 0 : f->peer, ip4, what, f->why, f->text);
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

int transport_tls_reload(struct transport *t, const struct raft_tls_files *files, char *err,
                         size_t errlen)
{
    if (t->tls == NULL) {
        return 0; /* plain TCP: tls.raft changes only with a restart */
    }
    return raft_tls_reload(t->tls, files, err, errlen);
}
