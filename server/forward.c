/* forward: the gateway's forwarder (see forward.h) on libidem's asynchronous client: its
 * raw calls to a named node (client/async_node.c) hold the connections, frames, request
 * ids, pipelining, per-turn write batches, TLS and the one redirect. What stays here: the
 * client's options from the node's TLS settings, Request.forwarded, the log line of a TLS
 * failure, and the forwarder's own words for a closed forwarder and a bad address.
 * Nothing from a request or answer is logged. */
#include "forward.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "idem_rpc.h"
#include "log.h"
#include "resolver.h"
#include "tls_stream.h"
#include "xmalloc.h"

struct forwarder {
    struct idem_async *a;
    /* The leader's host name, when it is one, is looked up on this resolver's thread (started
     * at its first lookup), not on libuv's pool, where the log's writes run. Closed after
     * the client, which cancels its lookups as it closes. */
    struct idem_resolver *resolver;
    bool closing;
    void (*close_cb)(void *data);
    void *close_data;
};

/* One call: the caller's callback, and the request's id for an answer made here. */
struct fwdCall {
    forward_resend_fn resend;
    forward_cb cb;
    void *data;
    uint64_t request_id;
};

/* A request larger than the leader's RPC frames take (libidem's IDEM_ETOOBIG, at once and
 * for good): answered invalid, as the leader itself answers a command it cannot take, not
 * as a failure to reach it, which callers retry until their deadline. */
static void answerTooBig(forward_cb cb, void *data, uint64_t request_id)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response r = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    r.result = &res;
    r.request_id = request_id;
    r.error = (char *)"the request is larger than an RPC frame to the leader may be";
    cb(data, &r, NULL);
}

/* A TLS handshake or session with the leader failed: logged with OpenSSL's reason (never
 * bytes from the peer); the calls on that connection fail with a static reason. */
static void tlsFailureCb(void *data, const char *addr, const char *what, const char *reason)
{
    (void)data;
    log_warn("forward: TLS connection to %s failed: %s: %s", addr, what, reason);
}

/* The client's options for the node's TLS settings (tls NULL: plain TCP). */
static struct idem_options tlsOptions(const struct config_tls *tls)
{
    struct idem_options opts = {.seeds = NULL};
    if (tls != NULL) {
        opts.tls = 1;
        opts.tls_ca_file = tls->ca_file;
        opts.tls_cert_file = tls->cert_file;
        opts.tls_key_file = tls->key_file;
    }
    return opts;
}

struct forwarder *forwarder_new(uv_loop_t *loop, const struct config_tls *tls, char *err,
                                size_t errlen)
{
    struct idem_options opts = tlsOptions(tls);
    struct forwarder *f = xcalloc(1, sizeof(*f));
    char why[400];
    f->resolver = IdemResolverNew(loop);
    if (f->resolver == NULL) {
        snprintf(err, errlen, "forwarding to the leader: out of memory");
        free(f);
        return NULL;
    }
    int rv = idem_async_open_raw(loop, &opts, &f->a, why, sizeof(why));
    if (rv != IDEM_OK) {
        snprintf(err, errlen, "forwarding to the leader: %s", why);
        IdemResolverClose(f->resolver);
        free(f);
        return NULL;
    }
    idem_async_use_resolver(f->a, f->resolver);
    idem_async_on_tls_failure(f->a, tlsFailureCb, NULL);
    return f;
}

int forwarder_load_tls(const struct config_tls *tls, struct idem_tls_ctx **out, char *err,
                       size_t errlen)
{
    struct idem_options opts = tlsOptions(tls);
    return IdemTlsContext(&opts, out, err, errlen) == IDEM_OK ? 0 : -1;
}

void forwarder_set_tls(struct forwarder *f, struct idem_tls_ctx *ctx)
{
    idem_async_set_tls(f->a, ctx);
}

static void callDoneCb(struct idem_async *a, int status, const Idem__Response *resp,
                       const char *reason, void *data)
{
    (void)a;
    struct fwdCall c = *(struct fwdCall *)data;
    free(data);
    if (status == IDEM_OK) {
        c.cb(c.data, resp, NULL);
    } else if (status == IDEM_ETOOBIG) {
        answerTooBig(c.cb, c.data, c.request_id);
    } else {
        c.cb(c.data, NULL, status == IDEM_ECANCELED ? "forwarder closed" : reason);
    }
}

void forward_call(struct forwarder *f, const char *addr, const Idem__Request *req,
                  uint32_t deadline_ms, forward_resend_fn resend, forward_cb cb, void *data)
{
    if (f->closing) {
        cb(data, NULL, "forwarder closed");
        return;
    }
    struct fwdCall *c = xmalloc(sizeof(*c));
    c->resend = resend;
    c->cb = cb;
    c->data = data;
    c->request_id = req->request_id;
    Idem__Request copy = *req;
    copy.forwarded = true; /* the leader's /metrics: counted by the gateway, not again there */
    int rv = idem_async_call_node(f->a, addr, &copy, deadline_ms ? deadline_ms : 1, callDoneCb, c);
    if (rv == IDEM_ETOOBIG) {
        free(c);
        answerTooBig(cb, data, req->request_id);
    } else if (rv != IDEM_OK) {
        free(c);
        cb(data, NULL, rv == IDEM_EINVAL ? "bad leader address" : idem_strerror(rv));
    }
}

static enum idem_move moveDecide(void *data, void *arg)
{
    (void)arg;
    const struct fwdCall *c = data;
    return c->resend != NULL && c->resend(c->data) ? IDEM_MOVE_SEND : IDEM_MOVE_FAIL;
}

size_t forwarder_move(struct forwarder *f, const char *to)
{
    return f->closing ? 0 : idem_async_move_calls(f->a, to, moveDecide, NULL);
}

static void closedCb(struct idem_async *a, void *data)
{
    (void)a;
    struct forwarder *f = data;
    void (*cb)(void *) = f->close_cb;
    void *cb_data = f->close_data;
    IdemResolverClose(f->resolver);
    free(f);
    if (cb) {
        cb(cb_data);
    }
}

void forwarder_close(struct forwarder *f, void (*cb)(void *data), void *data)
{
    f->closing = true;
    f->close_cb = cb;
    f->close_data = data;
    idem_async_close(f->a, closedCb, f);
}
