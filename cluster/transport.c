#include "transport.h"

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

static void acceptCb(struct raft_uv_transport *inner, raft_id id, const char *address,
                     struct uv_stream_s *stream)
{
    struct transport *t = inner->data;
    noDelay(stream);
    t->accept_cb(&t->outer, id, address, stream);
}

static int transportListen(struct raft_uv_transport *o, raft_uv_accept_cb cb)
{
    struct transport *t = fromOuter(o);
    t->accept_cb = cb;
    int rv = t->inner.listen(&t->inner, acceptCb);
    if (rv != 0) {
        /* raft_uv_tcp says nothing of why, and libraft only "I/O error": a bind of our own
         * finds the reason (an address in use, most often) for the operator. */
        const char *why = "cannot listen";
        char host[64];
        const char *colon = strrchr(t->address, ':');
        struct sockaddr_in sa;
        if (colon != NULL && (size_t)(colon - t->address) < sizeof(host)) {
            memcpy(host, t->address, (size_t)(colon - t->address));
            host[colon - t->address] = '\0';
            if (uv_ip4_addr(host, atoi(colon + 1), &sa) == 0) {
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd >= 0) {
                    if (bind(fd, (const struct sockaddr *)&sa, sizeof(sa)) != 0) {
                        why = strerror(errno);
                    }
                    close(fd);
                }
            }
        }
        snprintf(o->errmsg, sizeof(o->errmsg), "raft address %s: %s", t->address, why);
    }
    return rv;
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

static void closeCb(struct raft_uv_transport *inner)
{
    struct transport *t = inner->data;
    if (t->close_cb != NULL) {
        t->close_cb(&t->outer);
    }
}

static void transportClose(struct raft_uv_transport *o, raft_uv_transport_close_cb cb)
{
    struct transport *t = fromOuter(o);
    t->close_cb = cb;
    t->inner.close(&t->inner, closeCb);
}

int transport_init(struct transport *t, uv_loop_t *loop)
{
    memset(t, 0, sizeof(*t));
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
