#include "transport.h"

#include <stdlib.h>
#include <string.h>

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
    return t->inner.listen(&t->inner, acceptCb);
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
