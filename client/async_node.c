/* async_node.c: the asynchronous client's raw calls to a named node (idem_async_call_node,
 * include/idem_rpc.h), with which idemd's gateway forwards requests to the leader its node
 * names. They share the typed calls' requests, deadlines, frames, batches, connections
 * and TLS (async.c, async_conn.c); what differs is where they go and what a failure does.
 *
 * Shape: each named node (struct anode, "host:port" as given) has its calls, in acceptance
 * order, and one connection, opened for its first call and kept open for the next ones.
 * A call is packed once when accepted and waits for the kick (async.c), which writes the
 * calls of the loop turn together, as it does typed ones: a node without a connection
 * gets one then (never from within idem_async_call_node, so that no callback runs there).
 *
 * The happy path: accept → kick → (connect) → write → answer with our id → the call's
 * callback with the answer as it is (request_id the caller's) → its timer closes → freed.
 *
 * Failure modes, and what happens to the calls:
 * - an answer OUTCOME_NOT_LEADER naming another node: the call moves to that node's
 *   connection, once (same id, same deadline); a second one is the call's answer;
 * - any other answer (unavailable, a refusal for load, frame_too_large, ...): the call's;
 * - the connection fails (connect, TLS, a read or write, a frame too large or that does
 *   not decode, an answer with request id 0): every call of the node fails with a static
 *   reason, and the connection closes; the next call opens a new one. No retries, no
 *   backoff, no stall watch: the caller, which knows who leads, decides what comes next;
 * - the deadline passes: the call fails ("deadline passed"); a late answer is dropped. A
 *   connection that never came up (a connect or handshake that hangs) goes with its
 *   node's last call, so that the next call does not queue behind it;
 * - the caller learned that another node leads (idem_async_move_calls): every call of the
 *   other nodes moves to it, sent again there within its deadline, and their connections
 *   close (a node cut off from the others may never answer them);
 * - idem_async_close(): every call fails with IDEM_ECANCELED, every connection closes.
 *
 * A node left without calls or a connection is freed by the next kick. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "internal.h"

/* What a failed connection tells its calls: a status and a static reason. */
static const struct {
    int status;
    const char *reason;
} failures[] = {
    [AFAIL_CONNECT] = {IDEM_EUNAVAILABLE, "cannot connect to the node"},
    [AFAIL_IO] = {IDEM_EUNAVAILABLE, "connection to the node failed"},
    [AFAIL_CLOSED] = {IDEM_EUNAVAILABLE, "the node closed the connection"},
    [AFAIL_REFUSED] = {IDEM_EUNAVAILABLE, "the node could not read a request"},
    [AFAIL_FRAME] = {IDEM_EPROTO, "the node sent a frame that is too large or does not decode"},
    [AFAIL_HANDSHAKE] = {IDEM_EUNAVAILABLE, "TLS handshake with the node failed"},
    [AFAIL_TLS] = {IDEM_EUNAVAILABLE, "TLS connection to the node failed"},
    [AFAIL_NOMEM] = {IDEM_ENOMEM, "out of memory"},
    [AFAIL_ANSWER] = {IDEM_EUNAVAILABLE, "connection to the node failed"},
};

/* ---- nodes ----------------------------------------------------------------------------- */

static struct anode *namedFind(struct idem_async *a, const char *addr)
{
    struct anode *n;
    LIST_FOREACH (n, &a->named, link) {
        if (strcmp(n->node.addr, addr) == 0) {
            return n;
        }
    }
    return NULL;
}

/* The node for addr, made when there is none (*out, OUT). IDEM_OK, IDEM_EINVAL (not a
 * "host:port") or IDEM_ENOMEM. */
static int namedGet(struct idem_async *a, const char *addr, struct anode **out)
{
    *out = namedFind(a, addr);
    if (*out != NULL) {
        return IDEM_OK;
    }
    struct anode *n = calloc(1, sizeof *n);
    if (n == NULL) {
        return IDEM_ENOMEM;
    }
    char why[128];
    int rv = IdemNodeInit(&n->node, addr, strlen(addr), why, sizeof why);
    if (rv != IDEM_OK) {
        free(n);
        return rv;
    }
    n->a = a;
    TAILQ_INIT(&n->reqs);
    LIST_INSERT_HEAD(&a->named, n, link);
    *out = n;
    return IDEM_OK;
}

static void namedFree(struct anode *n)
{
    assert(n->conn == NULL && TAILQ_EMPTY(&n->reqs));
    LIST_REMOVE(n, link);
    IdemNodeFree(&n->node);
    free(n);
}

void IdemNamedFree(struct idem_async *a)
{
    while (!LIST_EMPTY(&a->named)) {
        namedFree(LIST_FIRST(&a->named));
    }
}

/* Fails the calls n has now with `why` (their callbacks may make new calls, to n too: those
 * wait for the next connection; or close the client, which fails the rest). */
static void namedFailCalls(struct anode *n, enum aconnFail why)
{
    uint64_t newer = n->a->next_id; /* calls accepted from here on are not failed */
    struct areq *r;
    while ((r = TAILQ_FIRST(&n->reqs)) != NULL && r->id < newer) {
        IdemAsyncRawFinish(r, failures[why].status, NULL, failures[why].reason);
    }
}

/* Opens n's connection; when none can be made, n's calls fail. */
static void namedConnect(struct anode *n)
{
    struct aconn *conn = IdemAsyncConnNew(n->a, &n->node);
    if (conn == NULL) {
        namedFailCalls(n, AFAIL_CONNECT);
        return;
    }
    conn->named = n;
    n->conn = conn;
    IdemAsyncConnGo(conn);
}

void IdemNamedFlush(struct anode *n)
{
    if (n->a->closing || TAILQ_EMPTY(&n->reqs)) {
        return;
    }
    if (n->conn == NULL) {
        namedConnect(n);
        return;
    }
    struct aconn *conn = n->conn;
    if (conn->state != ACONN_UP || conn->writes > 0) {
        return;
    }
    struct areq *from = TAILQ_FIRST(&n->reqs);
    while (from != NULL && IdemAsyncSendBatch(conn, &from)) {
    }
}

void IdemNamedFlushAll(struct idem_async *a)
{
    /* Nothing frees a node but this loop; a callback's new node goes first, seen next time. */
    struct anode *n = LIST_FIRST(&a->named);
    while (n != NULL && !a->closing) {
        struct anode *next = LIST_NEXT(n, link);
        IdemNamedFlush(n);
        if (n->conn == NULL && TAILQ_EMPTY(&n->reqs)) {
            namedFree(n);
        }
        n = next;
    }
}

void IdemNamedConnFail(struct aconn *conn, enum aconnFail why)
{
    struct anode *n = conn->named;
    assert(n->conn == conn);
    n->conn = NULL;
    IdemAsyncConnClose(conn);
    namedFailCalls(n, why);
}

/* ---- calls ----------------------------------------------------------------------------- */

static void namedDeadlineCb(uv_timer_t *t)
{
    struct areq *r = t->data;
    struct anode *n = r->named;
    IdemAsyncRawFinish(r, IDEM_EUNAVAILABLE, NULL,
                       r->fail_reason != NULL ? r->fail_reason : "deadline passed");
    struct aconn *conn = n->conn;
    if (conn != NULL && conn->state != ACONN_UP && TAILQ_EMPTY(&n->reqs)) {
        /* It never came up, and nothing waits for it any more: the next call starts a
         * fresh one. */
        n->conn = NULL;
        IdemAsyncConnClose(conn);
    }
}

bool IdemNamedAnswer(struct aconn *conn, Idem__Response *m)
{
    struct anode *n = conn->named;
    struct idem_async *a = n->a;
    struct areq *r;
    TAILQ_FOREACH (r, &n->reqs, link) {
        if (r->id == m->request_id) {
            break;
        }
    }
    if (r == NULL || r->state != AREQ_SENT || r->sent_on != conn) {
        idem__response__free_unpacked(m, NULL); /* its deadline passed; dropped */
        return true;
    }
    struct anode *to = NULL;
    if (r->may_redirect && idem_response_outcome(m) == IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
        m->leader_rpc_address != NULL && m->leader_rpc_address[0] != '\0' &&
        strcmp(m->leader_rpc_address, n->node.addr) != 0 &&
        namedGet(a, m->leader_rpc_address, &to) == IDEM_OK) {
        /* Once to the leader it names, on that node's connection (made by the kick). */
        idem__response__free_unpacked(m, NULL);
        TAILQ_REMOVE(&n->reqs, r, link);
        r->named = to;
        r->may_redirect = false;
        r->state = AREQ_WAITING;
        r->sent_on = NULL;
        TAILQ_INSERT_TAIL(&to->reqs, r, link);
        IdemAsyncKick(a);
        return true;
    }
    m->request_id = r->orig_id;
    IdemAsyncRawFinish(r, IDEM_OK, m, NULL);
    idem__response__free_unpacked(m, NULL);
    return conn->state != ACONN_CLOSING;
}

void IdemNamedClose(struct idem_async *a)
{
    struct anode *n;
    LIST_FOREACH (n, &a->named, link) {
        /* Callbacks may call the client: refused (closing), nothing is added or freed. */
        while (!TAILQ_EMPTY(&n->reqs)) {
            IdemAsyncRawFinish(TAILQ_FIRST(&n->reqs), IDEM_ECANCELED, NULL,
                               "the client was closed before an answer");
        }
        if (n->conn != NULL) {
            struct aconn *conn = n->conn;
            n->conn = NULL;
            IdemAsyncConnClose(conn);
        }
    }
}

size_t idem_async_move_calls(struct idem_async *a, const char *to, idem_move_fn decide,
                             void *arg)
{
    struct anode *dst;
    if (a == NULL || to == NULL || decide == NULL || a->closing ||
        namedGet(a, to, &dst) != IDEM_OK) {
        return 0;
    }
    size_t moved = 0;
    struct anode *n;
    LIST_FOREACH (n, &a->named, link) {
        if (n == dst) {
            continue;
        }
        struct areq *r, *next;
        for (r = TAILQ_FIRST(&n->reqs); r != NULL; r = next) {
            next = TAILQ_NEXT(r, link);
            TAILQ_REMOVE(&n->reqs, r, link);
            r->named = dst;
            r->state = AREQ_WAITING;
            r->sent_on = NULL;
            if (decide(r->data, arg) == IDEM_MOVE_FAIL) {
                /* Failed by its deadline timer, now: on the next loop turn, before the kick
                 * (started after it), so that it is never written. */
                r->fail_reason = "the node it was sent to no longer leads";
                r->state = AREQ_FAILING;
                uv_timer_start(&r->timer, namedDeadlineCb, 0, 0);
            } else {
                moved++;
            }
            TAILQ_INSERT_TAIL(&dst->reqs, r, link);
        }
        if (n->conn != NULL) {
            struct aconn *conn = n->conn;
            n->conn = NULL;
            IdemAsyncConnClose(conn);
        }
    }
    IdemAsyncKick(a); /* writes them, and frees the nodes left without calls */
    return moved;
}

int idem_async_call_node(struct idem_async *a, const char *addr, const Idem__Request *req,
                         uint32_t deadline_ms, idem_async_raw_cb cb, void *data)
{
    if (a == NULL || addr == NULL || req == NULL || cb == NULL) {
        return IDEM_EINVAL;
    }
    if (a->closing) {
        return IDEM_ECLOSED;
    }
    struct anode *n;
    int rv = namedGet(a, addr, &n);
    if (rv != IDEM_OK) {
        return rv;
    }
    struct areq *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return IDEM_ENOMEM;
    }
    Idem__Request copy = *req;
    copy.request_id = a->next_id;
    if (copy.auth_token.len == 0) {
        copy.auth_token.data = a->token;
        copy.auth_token.len = a->token_len;
    }
    r->body_len = idem__request__get_packed_size(&copy);
    if (r->body_len > a->max_frame - 8) {
        free(r);
        return IDEM_ETOOBIG;
    }
    r->body = malloc(r->body_len ? r->body_len : 1);
    if (r->body == NULL) {
        free(r);
        return IDEM_ENOMEM;
    }
    idem__request__pack(&copy, r->body);
    r->a = a;
    if (IdemAsyncReqStart(r, deadline_ms, namedDeadlineCb) != IDEM_OK) {
        OPENSSL_cleanse(r->body, r->body_len); /* it may carry a token */
        free(r->body);
        free(r);
        return IDEM_ESYS;
    }
    r->id = a->next_id++;
    r->orig_id = req->request_id;
    r->named = n;
    r->may_redirect = true;
    r->raw_cb = cb;
    r->data = data;
    TAILQ_INSERT_TAIL(&n->reqs, r, link);
    a->pending++;
    IdemAsyncKick(a);
    return IDEM_OK;
}
