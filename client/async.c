/* async.c: libidem's asynchronous client on a caller's libuv loop (see include/idem.h): the
 * API, the requests (deadlines, retries after a refusal for load, the stall watch) and
 * how they are written in batches; the connection itself (connect, TLS, reads, what each
 * answer does) is async_conn.c's.
 *
 * Shape: one TCP connection at a time, to the node believed to lead. Every request is
 * packed once (request id, token, operation) when it is accepted; each send prefixes the
 * time left as Request.deadline_ms (protobuf lets a field come first; the body never
 * carries it). Requests are pipelined and answers, matched by request id, may come back in
 * any order. Submits are coalesced: a submit arms a zero-delay timer (`kick`), and the
 * requests accepted until it fires (at the latest in the next loop turn's timers) go out
 * together, in writes of about BATCH_BYTES (plain TCP) or as a batch of records (TLS).
 *
 * The happy path: accept → (connect) → write → answer with our id → callback → close the
 * request's deadline timer → free the request in the timer's close callback.
 *
 * Failure modes, and what happens to the requests:
 * - connect fails, the connection breaks, a frame does not decode or is too large, or the
 *   node answers with request id 0 (it could not read one of our frames, which one it does
 *   not say, and closes the connection): the connection is closed; every request written
 *   on it goes back to waiting (same id, same key, same attempt id), and a reconnect to the
 *   next seed is scheduled after a backoff (10 ms doubling to 200 ms, jittered; reset by
 *   the next answer from a leader).
 * - OUTCOME_NOT_LEADER with the leader's address: the leader becomes the candidate; the
 *   connection is replaced (at once for the first redirect since the last answer, after a
 *   backoff for the following ones, so that two nodes pointing at each other cannot spin);
 *   every request written on it is sent again to the leader.
 * - OUTCOME_NOT_LEADER without an address, OUTCOME_UNAVAILABLE: as a broken connection
 *   (next seed, after a backoff).
 * - OUTCOME_UNAVAILABLE with retry_after_ms (a leader refusing for load: its
 *   batch.max_pending_mb, or the tenant's share of it; or while it hands its leadership
 *   on, after which it redirects): that request alone waits again
 *   after at least that long (the backoff when longer), sent to the same node on the same
 *   connection; the others go on.
 * - a request's deadline passes: its callback gets IDEM_EUNAVAILABLE; an answer that comes
 *   later finds no request with its id and is dropped. Deadlines count from the submit
 *   (the loop's time is updated there, so a slow callback before it costs nothing).
 * - a connection that does not come up (connect, resolution, TLS handshake), or on which
 *   requests are outstanding but nothing arrives, for an attempt's share of their time
 *   (max(remaining / 3, IDEM_ATTEMPT_MIN_MS)): dropped by the stall watch (watchCb), its
 *   requests wait again and the next seed is tried at once: a leader that accepts but
 *   does not answer (stopped, frozen, blackholed) is left.
 * - an answer that a request exceeded the node's max_frame_bytes (IDEM_FRAME_TOO_LARGE):
 *   that request alone fails with IDEM_ETOOBIG; the connection and the others go on.
 * - an answer without a result: that request fails with IDEM_EPROTO (IdemResultFill), as
 *   a synchronous call does; the connection and the others go on.
 * - idem_async_close(): every pending callback gets IDEM_ECANCELED before it returns; then
 *   the connection, the timers and the reconnect timer close, and the close callback runs
 *   once the last handle's close callback ran (libuv frees nothing of ours before that).
 *
 * TLS: libidem's TLS stream (tls_stream.h, the daemon's too). Bytes read from the socket are
 * fed to it; whatever it produces (handshake, records) is taken from it and written to the
 * socket. The connection counts as up (requests are written) once the handshake
 * finished and the server's certificate and name were verified; a failed handshake is a
 * failed connection (next seed, backoff).
 *
 * Names: a numeric host is connected at once; a name is resolved with uv_getaddrinfo (on
 * libuv's thread pool), or on the resolver the caller gave (idem_async_use_resolver: the
 * daemon's forwarder), and its first address is used. A connection object is freed only
 * once its TCP handle closed and its uv_getaddrinfo (if any) called back; a resolver's
 * lookup is cancelled at the close and never calls back.
 *
 * Raw calls to a named node (idem_rpc.h) are requests too, on their node's list and
 * connection instead of a->reqs and a->conn, written by the same kick: async_node.c. */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "frame.h"
#include "internal.h"

/* ---- lifetime ------------------------------------------------------------------------ */

static void asyncFree(struct idem_async *a)
{
    IdemNamedFree(a);
    for (size_t i = 0; i < a->n_nodes; i++) {
        IdemNodeFree(&a->nodes[i]);
    }
    if (a->token != NULL) {
        OPENSSL_cleanse(a->token, a->token_len);
    }
    free(a->token);
    IdemTlsCtxFree(a->tls);
    free(a);
}

/* Once closing and the last handle closed: the close callback, then the memory. */
void IdemAsyncMaybeFinish(struct idem_async *a)
{
    if (!a->closing || a->handles > 0) {
        return;
    }
    if (a->close_cb != NULL) {
        a->close_cb(a, a->close_data);
    }
    asyncFree(a);
}

static void handleClosedCb(uv_handle_t *h)
{
    struct idem_async *a = h->data;
    a->handles--;
    IdemAsyncMaybeFinish(a);
}

/* ---- requests -------------------------------------------------------------------------- */

static void reqFreeCb(uv_handle_t *h)
{
    struct areq *r = h->data;
    struct idem_async *a = r->a;
    OPENSSL_cleanse(r->body, r->body_len); /* it carries the token */
    free(r->body);
    free(r->refusal);
    free(r);
    a->handles--;
    IdemAsyncMaybeFinish(a);
}

/* Takes the request off its list (a typed call's, or its named node's) and stops its
 * timer: it is done, its callback comes next. */
static void reqEnd(struct idem_async *a, struct areq *r)
{
    assert(a->pending > 0 && r->state != AREQ_DONE);
    TAILQ_REMOVE(r->named != NULL ? &r->named->reqs : &a->reqs, r, link);
    a->pending--;
    r->state = AREQ_DONE;
    uv_timer_stop(&r->timer);
}

int IdemAsyncReqStart(struct areq *r, uint32_t deadline_ms, uv_timer_cb on_deadline)
{
    struct idem_async *a = r->a;
    if (uv_timer_init(a->loop, &r->timer) != 0) {
        return IDEM_ESYS;
    }
    a->handles++;
    r->timer.data = r;
    r->deadline_ms = deadline_ms ? deadline_ms : a->default_deadline_ms;
    /* The loop's cached time is as old as the start of this loop turn, which may have
     * been long (a slow callback): count the deadline from now. */
    uv_update_time(a->loop);
    r->deadline = uv_now(a->loop) + r->deadline_ms;
    r->state = AREQ_WAITING;
    uv_timer_start(&r->timer, on_deadline, r->deadline_ms, 0);
    return IDEM_OK;
}

/* Calls the request back (exactly once) with `status` and `res` (freed afterwards unless
 * the callback moved it), and frees the request once its timer closed. */
void IdemAsyncReqFinish(struct areq *r, int status, struct idem_result *res)
{
    struct idem_async *a = r->a;
    reqEnd(a, r);
    r->cb(a, status, res, r->data);
    idem_result_free(res);
    uv_close((uv_handle_t *)&r->timer, reqFreeCb);
}

void IdemAsyncRawFinish(struct areq *r, int status, const Idem__Response *resp,
                        const char *reason)
{
    struct idem_async *a = r->a;
    reqEnd(a, r);
    r->raw_cb(a, status, resp, reason, r->data);
    uv_close((uv_handle_t *)&r->timer, reqFreeCb);
}

void IdemAsyncReqFail(struct areq *r, int status, const char *fmt, ...)
{
    struct idem_result res;
    memset(&res, 0, sizeof res);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res.detail, sizeof res.detail, fmt, ap);
    va_end(ap);
    IdemAsyncReqFinish(r, status, &res);
}

static void reqDeadlineCb(uv_timer_t *t)
{
    struct areq *r = t->data;
    struct idem_async *a = r->a;
    if (r->refusal != NULL) {
        /* A leader kept refusing it for load: that says more than other nodes' words (the
         * text is formatted before IdemAsyncReqFail lets go of r). */
        IdemAsyncReqFail(r, IDEM_EUNAVAILABLE, "no leader answered within %u ms (last: %.300s)",
                         r->deadline_ms, r->refusal);
        return;
    }
    if (a->words.n > 1) {
        char said[IDEM_ERRMSG_LEN];
        IdemWordsJoin(&a->words, said, sizeof said);
        IdemAsyncReqFail(r, IDEM_EUNAVAILABLE,
                         "no leader answered within %u ms (each node's last answer: %.200s)",
                         r->deadline_ms, said);
        return;
    }
    char last[IDEM_ERRMSG_LEN];
    snprintf(last, sizeof last, "%s", a->errmsg[0] ? a->errmsg : "no answer");
    IdemAsyncReqFail(r, IDEM_EUNAVAILABLE, "no leader answered within %u ms (last: %.200s)",
                     r->deadline_ms, last);
}

/* The most bytes a request frame adds to its body: the length and deadline_ms (its key
 * and a uint32 varint of up to 5 bytes). */
#define FRAME_OVERHEAD (FRAME_HEADER_LEN + 1 + 5)
/* A batch of requests is cut into writes of about this many bytes. */
#define BATCH_BYTES 65536
/* After an allocation failure, the waiting requests are tried again this much later. */
#define KICK_RETRY_MS 10

static void kickCb(uv_timer_t *t);

/* Lays out `r`'s frame at `dst` (room for FRAME_OVERHEAD + body_len) with the time it has
 * left as deadline_ms, put before the body packed without it; returns its length. */
static size_t reqFrame(struct idem_async *a, const struct areq *r, uint8_t *dst)
{
    uint64_t now = uv_now(a->loop);
    uint64_t rem = r->deadline > now ? r->deadline - now : 1;
    uint32_t dl = rem > UINT32_MAX ? UINT32_MAX : (uint32_t)rem;
    uint8_t *pre = dst + FRAME_HEADER_LEN;
    size_t pre_len = frame_varint_field_put(pre, FRAME_KEY_DEADLINE_MS, dl);
    assert(pre_len <= FRAME_OVERHEAD - FRAME_HEADER_LEN);
    size_t body = pre_len + r->body_len;
    frame_header_put(dst, (uint32_t)body); /* body_len <= max_frame - 8 (submit) */
    memcpy(pre + pre_len, r->body, r->body_len);
    return FRAME_HEADER_LEN + body;
}

/* Writes waiting requests from `*from` on, in acceptance order, as one write of about
 * BATCH_BYTES (at least one request) on `conn`, connected, whose requests they are (the
 * leader connection's, a->reqs, or a named node's); `*from` moves past them. A write that fails drops the connection (which puts every request
 * written on it back to waiting); returns false then, or when out of memory: the
 * requests stay waiting and the kick is armed to try again in KICK_RETRY_MS (their
 * deadlines still hold; failing them from here could call back inside idem_async_*(),
 * which the API rules out). */
bool IdemAsyncSendBatch(struct aconn *conn, struct areq **from)
{
    struct idem_async *a = conn->a;
    assert(conn->state == ACONN_UP && conn->writes == 0);
    size_t cap = 0;
    struct areq *end = *from;
    for (; end != NULL && (cap == 0 || cap + FRAME_OVERHEAD + end->body_len <= BATCH_BYTES);
         end = TAILQ_NEXT(end, link)) {
        if (end->state == AREQ_WAITING) {
            cap += FRAME_OVERHEAD + end->body_len;
        }
    }
    struct areq *start = *from;
    *from = end;
    if (cap == 0) {
        return true;
    }
    struct awrite *wr = malloc(sizeof *wr + cap);
    if (wr == NULL) {
        IdemWhyf(a->errmsg, sizeof a->errmsg, "out of memory writing a request");
        uv_timer_start(&a->kick, kickCb, KICK_RETRY_MS, 0);
        return false;
    }
    size_t len = 0;
    for (struct areq *r = start; r != end; r = TAILQ_NEXT(r, link)) {
        if (r->state == AREQ_WAITING) {
            len += reqFrame(a, r, wr->data + len);
            assert(len <= cap);
            r->state = AREQ_SENT;
            r->sent_on = conn;
        }
    }
    wr->len = len;
    if (conn->tls == NULL) {
        return IdemAsyncConnWrite(conn, wr) == W_SENT;
    }
    int rv = IdemTlsWrite(conn->tls, wr->data, wr->len);
    OPENSSL_cleanse(wr->data, wr->len);
    free(wr);
    if (rv != 0) {
        IdemAsyncTlsFail(conn, "write");
        return false;
    }
    return IdemAsyncTlsFlushOut(conn) && conn->writes == 0;
}

/* Writes waiting requests, in acceptance order, if a connection is up: batch after batch
 * (BATCH_BYTES each) while the socket takes them at once; once one waits in libuv's queue,
 * the rest wait for its writeCb. Starts a connection otherwise (unless a reconnect is
 * already scheduled). */
void IdemAsyncFlush(struct idem_async *a)
{
    if (a->closing) {
        return;
    }
    if (a->conn == NULL) {
        if (!a->reconnect_armed && !TAILQ_EMPTY(&a->reqs)) {
            IdemAsyncConnStart(a);
        }
        return;
    }
    if (a->conn->state != ACONN_UP || a->conn->writes > 0) {
        return;
    }
    struct areq *from = TAILQ_FIRST(&a->reqs);
    while (from != NULL && IdemAsyncSendBatch(a->conn, &from)) {
    }
}

/* Writes what was submitted since the kick was armed: typed calls, and raw ones. */
static void kickCb(uv_timer_t *t)
{
    IdemAsyncFlush(t->data);
    IdemNamedFlushAll(t->data);
}

void IdemAsyncKick(struct idem_async *a)
{
    if (!uv_is_active((uv_handle_t *)&a->kick)) {
        uv_timer_start(&a->kick, kickCb, 0, 0);
    }
}

/* Delayed requests whose time came wait again (and are written); the timer is set again
 * for the next one. */
static void retryCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    if (a->closing) {
        return;
    }
    uint64_t now = uv_now(a->loop), next = UINT64_MAX;
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        if (r->state != AREQ_DELAYED) {
            continue;
        }
        if (r->retry_at <= now) {
            r->state = AREQ_WAITING;
        } else if (r->retry_at < next) {
            next = r->retry_at;
        }
    }
    if (next != UINT64_MAX) {
        uv_timer_start(&a->retry, retryCb, next - now, 0);
    }
    IdemAsyncFlush(a);
}

/* Makes the retry timer due by `at` (uv_now() ms) at the latest. */
void IdemAsyncRetryArm(struct idem_async *a, uint64_t at)
{
    uint64_t now = uv_now(a->loop);
    uint64_t in = at > now ? at - now : 0;
    if (!uv_is_active((uv_handle_t *)&a->retry) || uv_timer_get_due_in(&a->retry) > in) {
        uv_timer_start(&a->retry, retryCb, in, 0);
    }
}

/* The stall watch: a connection that has not connected (connect, TLS handshake) or, with
 * requests outstanding on it, has read nothing for an attempt's share of their time --
 * max(remaining / 3, IDEM_ATTEMPT_MIN_MS), remaining counted from when the silence began,
 * the smallest over those requests -- is dropped: its requests wait again (same ids) and
 * the next seed is tried at once. This is what moves the client off a leader that
 * accepts connections but does not answer (stopped, frozen, blackholed). */
#define WATCH_PERIOD_MS 50

static void watchCb(uv_timer_t *t)
{
    struct idem_async *a = t->data;
    if (a->closing) {
        return;
    }
    if (TAILQ_EMPTY(&a->reqs)) {
        uv_timer_stop(&a->watch);
        return;
    }
    struct aconn *conn = a->conn;
    if (conn == NULL || conn->state == ACONN_CLOSING) {
        return;
    }
    uint64_t now = uv_now(a->loop);
    uint64_t limit = UINT64_MAX;
    struct areq *r;
    TAILQ_FOREACH (r, &a->reqs, link) {
        bool owed = conn->state == ACONN_UP ? (r->state == AREQ_SENT && r->sent_on == conn)
                                            : r->state == AREQ_WAITING;
        if (!owed) {
            continue;
        }
        uint64_t rem = r->deadline > conn->quiet_since ? r->deadline - conn->quiet_since : 0;
        uint64_t share = rem / 3 > IDEM_ATTEMPT_MIN_MS ? rem / 3 : IDEM_ATTEMPT_MIN_MS;
        if (share < limit) {
            limit = share;
        }
    }
    if (limit == UINT64_MAX) {
        conn->quiet_since = now; /* nothing owed: silence is normal */
        return;
    }
    if (now - conn->quiet_since < limit) {
        return;
    }
    const char *what = conn->state == ACONN_UP ? "no answer"
                       : a->tls != NULL        ? "not connected (connect or tls handshake)"
                                               : "not connected";
    IdemWhyf(a->errmsg, sizeof a->errmsg, "%s: %s within %" PRIu64 " ms", conn->peer->addr, what,
             limit);
    IdemAsyncConnDrop(a, conn, a->next_seed, 0);
}

/* ---- the API --------------------------------------------------------------------------- */

/* idem_async_open(), or with `raw` idem_async_open_raw(): opts->seeds may then be NULL. */
static int asyncOpen(uv_loop_t *loop, const struct idem_options *opts, bool raw,
                     struct idem_async **out, char *why, size_t why_len)
{
    IdemWhyf(why, why_len, "%s", "");
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    *out = NULL;
    if (loop == NULL || opts == NULL) {
        IdemWhyf(why, why_len, "NULL loop or options");
        return IDEM_EINVAL;
    }
    struct idem_async *a = calloc(1, sizeof *a);
    if (a == NULL) {
        IdemWhyf(why, why_len, "out of memory");
        return IDEM_ENOMEM;
    }
    a->loop = loop;
    TAILQ_INIT(&a->reqs);
    LIST_INIT(&a->named);
    int rv = raw && opts->seeds == NULL
                 ? IDEM_OK
                 : IdemSeedsParse(opts->seeds, a->nodes, &a->n_nodes, why, why_len);
    if (rv != IDEM_OK) {
        free(a);
        return rv;
    }
    a->n_seeds = a->n_nodes;
    if (IdemTlsWanted(opts)) {
        rv = IdemTlsContext(opts, &a->tls, why, why_len);
        if (rv != IDEM_OK) {
            asyncFree(a);
            return rv;
        }
    }
    if (opts->token != NULL && opts->token[0] != '\0') {
        a->token_len = strlen(opts->token);
        a->token = malloc(a->token_len);
        if (a->token == NULL) {
            asyncFree(a);
            IdemWhyf(why, why_len, "out of memory");
            return IDEM_ENOMEM;
        }
        memcpy(a->token, opts->token, a->token_len);
    }
    a->default_deadline_ms =
        opts->default_deadline_ms ? opts->default_deadline_ms : IDEM_DEFAULT_DEADLINE_MS;
    a->max_frame = IdemMaxFrame(opts);
    a->next_id = 1;
    a->rng = IdemRngSeed();
    a->backoff = IDEM_BACKOFF_MIN_MS;
    a->next_seed = a->n_seeds > 1 ? 1 : 0;
    /* The four timers, made in turn; on a failure those made are closed, and the last
     * close callback frees `a` (nothing made: freed here). */
    uv_timer_t *timers[] = {&a->reconnect, &a->watch, &a->kick, &a->retry};
    for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
        int uv = uv_timer_init(loop, timers[i]);
        if (uv != 0) {
            IdemWhyf(why, why_len, "cannot create a libuv timer: %s", uv_strerror(uv));
            if (i == 0) {
                asyncFree(a);
                return IDEM_ESYS;
            }
            a->closing = true;
            for (size_t j = 0; j < i; j++) {
                uv_close((uv_handle_t *)timers[j], handleClosedCb);
            }
            return IDEM_ESYS;
        }
        timers[i]->data = a;
        a->handles++;
    }
    uv_unref((uv_handle_t *)&a->watch); /* never what keeps the caller's loop running */
    *out = a;
    return IDEM_OK;
}

int idem_async_open(uv_loop_t *loop, const struct idem_options *opts, struct idem_async **out,
                    char *why, size_t why_len)
{
    return asyncOpen(loop, opts, false, out, why, why_len);
}

int idem_async_open_raw(uv_loop_t *loop, const struct idem_options *opts,
                        struct idem_async **out, char *why, size_t why_len)
{
    return asyncOpen(loop, opts, true, out, why, why_len);
}

void idem_async_use_resolver(struct idem_async *a, struct idem_resolver *r)
{
    a->resolver = r;
}

void idem_async_on_tls_failure(struct idem_async *a, idem_async_tls_failure_cb cb, void *data)
{
    a->tls_failure_cb = cb;
    a->tls_failure_data = data;
}

void idem_async_set_tls(struct idem_async *a, struct idem_tls_ctx *ctx)
{
    if (a->tls == NULL || ctx == NULL) {
        IdemTlsCtxFree(ctx);
        return;
    }
    IdemTlsCtxFree(a->tls); /* the streams of open connections hold their own references */
    a->tls = ctx;
}

size_t idem_async_pending(const struct idem_async *a)
{
    return a == NULL ? 0 : a->pending;
}

static int submit(struct idem_async *a, const struct idem_op *op, uint32_t deadline_ms,
                  idem_async_cb cb, void *data)
{
    if (a == NULL || cb == NULL) {
        return IDEM_EINVAL;
    }
    if (a->closing) {
        return IDEM_ECLOSED;
    }
    if (a->n_seeds == 0) {
        return IDEM_EINVAL; /* a client of raw calls (idem_async_open_raw) */
    }
    struct idem_built b;
    char why[256];
    int rv = IdemOpBuild(op, &b, why, sizeof why);
    if (rv != IDEM_OK) {
        /* Refused here, nothing sent: not a connection failure, so not a->errmsg (which a
         * later request's deadline quotes as the last one). */
        IdemBuiltFree(&b);
        return rv;
    }
    struct areq *r = calloc(1, sizeof *r);
    if (r == NULL) {
        IdemBuiltFree(&b);
        return IDEM_ENOMEM;
    }
    r->a = a;
    r->id = a->next_id++;
    b.req.request_id = r->id;
    b.req.deadline_ms = 0; /* prefixed per send */
    b.req.auth_token.data = a->token;
    b.req.auth_token.len = a->token_len;
    r->body_len = idem__request__get_packed_size(&b.req);
    if (r->body_len > a->max_frame - 8) {
        IdemBuiltFree(&b);
        free(r);
        return IDEM_ETOOBIG;
    }
    r->body = malloc(r->body_len ? r->body_len : 1);
    if (r->body == NULL) {
        IdemBuiltFree(&b);
        free(r);
        return IDEM_ENOMEM;
    }
    idem__request__pack(&b.req, r->body);
    IdemBuiltFree(&b);
    if (IdemAsyncReqStart(r, deadline_ms, reqDeadlineCb) != IDEM_OK) {
        OPENSSL_cleanse(r->body, r->body_len); /* it carries the token */
        free(r->body);
        free(r);
        return IDEM_ESYS;
    }
    r->cb = cb;
    r->data = data;
    TAILQ_INSERT_TAIL(&a->reqs, r, link);
    a->pending++;
    if (!uv_is_active((uv_handle_t *)&a->watch)) {
        if (a->conn != NULL) {
            a->conn->quiet_since = uv_now(a->loop);
        }
        uv_timer_start(&a->watch, watchCb, WATCH_PERIOD_MS, WATCH_PERIOD_MS);
    }
    /* Connected: written by the kick, with whatever else is submitted before it fires (at
     * the latest in the timers of the next loop turn; a due timer keeps the poll from
     * blocking). Not connected: starts a connection. Never calls a callback from here: a
     * write that fails at once only puts requests back to waiting. */
    if (a->conn != NULL && a->conn->state == ACONN_UP) {
        IdemAsyncKick(a);
    } else {
        IdemAsyncFlush(a);
    }
    return IDEM_OK;
}

int idem_async_claim(struct idem_async *a, const char *key,
                     const uint8_t fingerprint[IDEM_FINGERPRINT_LEN],
                     const struct idem_claim_opts *opts, idem_async_cb cb, void *data)
{
    char attempt[IDEM_ATTEMPT_ID_HEX + 1];
    struct idem_op op;
    if (IdemClaimOp(key, fingerprint, opts, attempt, &op) != IDEM_OK) {
        return IDEM_ESYS;
    }
    return submit(a, &op, opts != NULL ? opts->deadline_ms : 0, cb, data);
}

int idem_async_complete(struct idem_async *a, const char *key, uint64_t token, int completion,
                        const struct idem_response *response, uint32_t deadline_ms,
                        idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_COMPLETE,
                         .key = key,
                         .token = token,
                         .completion = completion,
                         .response = response};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_release(struct idem_async *a, const char *key, uint64_t token, uint32_t deadline_ms,
                       idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_RELEASE, .key = key, .token = token};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_renew(struct idem_async *a, const char *key, uint64_t token, uint64_t lease_ms,
                     uint32_t deadline_ms, idem_async_cb cb, void *data)
{
    struct idem_op op = {.kind = IDEM_OP_RENEW, .key = key, .token = token, .lease_ms = lease_ms};
    return submit(a, &op, deadline_ms, cb, data);
}

int idem_async_get(struct idem_async *a, const char *key, uint32_t deadline_ms, idem_async_cb cb,
                   void *data)
{
    struct idem_op op = {.kind = IDEM_OP_GET, .key = key};
    return submit(a, &op, deadline_ms, cb, data);
}

void idem_async_close(struct idem_async *a, idem_async_close_cb close_cb, void *data)
{
    if (a == NULL || a->closing) {
        return;
    }
    a->closing = true;
    a->close_cb = close_cb;
    a->close_data = data;
    /* Callbacks may call idem_async_* (refused: closing) or close again (a no-op). */
    while (!TAILQ_EMPTY(&a->reqs)) {
        IdemAsyncReqFail(TAILQ_FIRST(&a->reqs), IDEM_ECANCELED,
                         "the client was closed before an answer");
    }
    IdemNamedClose(a);
    if (a->conn != NULL) {
        struct aconn *conn = a->conn;
        a->conn = NULL;
        IdemAsyncConnClose(conn);
    }
    uv_timer_stop(&a->reconnect);
    uv_close((uv_handle_t *)&a->reconnect, handleClosedCb);
    uv_timer_stop(&a->watch);
    uv_close((uv_handle_t *)&a->watch, handleClosedCb);
    uv_timer_stop(&a->kick);
    uv_close((uv_handle_t *)&a->kick, handleClosedCb);
    uv_timer_stop(&a->retry);
    uv_close((uv_handle_t *)&a->retry, handleClosedCb);
}
