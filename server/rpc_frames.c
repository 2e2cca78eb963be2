/* rpc_frames: what an RPC connection does with the frames it reads (rpc_internal.h): the
 * frame buffer, the checks before a decode, the decode, the refusals, and how each answer
 * is counted.
 *
 * Untrusted bytes: a frame's length is checked against max_frame_bytes before anything is
 * buffered for it; its wire format is walked (rpc_scan.h: fields capped, unknown field
 * numbers refused) and its token checked (service_credential_of) before protobuf-c decodes
 * it, on an allocator with a budget; nothing from it is logged. A request whose token is
 * not known is answered unauthenticated, as the service would, with nothing decoded. Until
 * a connection has sent a known token, a frame past rpc.unauthenticated_max_frame_bytes is
 * read no further than its first RPC_SCAN_PEEK_BYTES, where clients put the token
 * (connGate): with a known token there it is read as any, without it is answered
 * unauthenticated and skipped as it arrives.
 *
 * A frame longer than max_frame_bytes is not buffered: its request id is read from its
 * first bytes (protobuf wire format: fields 1 and 2, both varints, when they come first;
 * no length from the frame trusted; at most 22 bytes looked at), it is answered
 * OUTCOME_INVALID with result detail "frame_too_large" under that id, and its bytes are
 * skipped as they arrive; the connection carries on. When no request id can be read it is
 * answered under id 0 and the connection drains, as after any undecodable frame.
 *
 * Metrics (rpc_get_stats): each request handed to the service carries a struct call, which
 * says how its answer is counted: a client's data op by outcome (a claim timed too), a data
 * op another node's gateway forwarded apart, an admin op not at all (reqstats.h). */
#include "rpc_internal.h"

#include <assert.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "rpc_scan.h"
#include "xmalloc.h"

/* How a request taken from a frame is counted once answered (rpc_stats.requests). */
enum callKind {
    CALL_ADMIN,     /* an admin op: not counted */
    CALL_DATA,      /* a client's data op */
    CALL_CLAIM,     /* a client's claim: timed too */
    CALL_FORWARDED, /* a data op another node's gateway forwarded: rpc_stats.forwarded */
};

/* A request handed to the service, until it is answered. */
struct call {
    struct conn *c;
    enum callKind kind;
    uint64_t start_ns;   /* uv_hrtime() when it was taken */
    uint64_t request_id; /* the client's, for the log */
    int op;              /* Idem__Request's op_case: its field number */
};

static enum callKind callKindOf(const Idem__Request *req)
{
    if (!service_data_op(req)) {
        return CALL_ADMIN;
    }
    /* A follower's gateway marks what it forwards (forward.c), and its proxy forwards with
     * as_tenant: the gateway counts its client's request, this node does not again. */
    if (req->forwarded || (req->as_tenant != NULL && req->as_tenant[0] != '\0')) {
        return CALL_FORWARDED;
    }
    return req->op_case == IDEM__REQUEST__OP_CLAIM ? CALL_CLAIM : CALL_DATA;
}

static void callCount(const struct call *k, const Idem__Response *resp)
{
    unsigned oc = resp->result != NULL ? (unsigned)resp->result->outcome : 0;
    if (k->kind == CALL_ADMIN) {
        return;
    }
    /* A request that says it was forwarded (or asks for as_tenant) counts as forwarded only
     * once its credentials passed: a refused one (no or a wrong secret or token, a tenant no
     * route names) is this node's own client's, counted where refusals are watched, so that
     * nobody hides a flood of refused requests among the followers' forwards. */
    bool refused = oc == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED ||
                   oc == IDEM__OUTCOME__OUTCOME_FORBIDDEN;
    if (k->kind == CALL_FORWARDED && !refused) {
        if (oc < REQSTATS_OUTCOMES) {
            rpc_figures.forwarded[oc]++;
        }
        return;
    }
    if (k->kind == CALL_CLAIM) {
        reqstats_claim(&rpc_figures.requests, (double)(uv_hrtime() - k->start_ns) / 1e9);
    }
    reqstats_outcome(&rpc_figures.requests, oc);
    if (oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
        rpc_figures.requests.fail_closed++;
    }
}

/* At debug level, one line per answered request: its op, outcome and time taken. */
static void callLog(const struct call *k, const Idem__Response *resp)
{
    if (!log_enabled(LOG_LEVEL_DEBUG)) {
        return;
    }
    const ProtobufCFieldDescriptor *op =
        protobuf_c_message_descriptor_get_field(&idem__request__descriptor, (unsigned)k->op);
    const ProtobufCEnumValue *oc = protobuf_c_enum_descriptor_get_value(
        &idem__outcome__descriptor, resp->result != NULL ? (int)resp->result->outcome : 0);
    const char *ocName = oc != NULL ? oc->name : "?";
    if (strncmp(ocName, "OUTCOME_", 8) == 0) {
        ocName += 8;
    }
    char rid[LOG_RPC_ID_SIZE];
    log_rpc_id(rid, k->c->id, k->request_id);
    log_at(LOG_LEVEL_DEBUG, rid, "rpc: %s answered %s in %.3f ms", op != NULL ? op->name : "?",
           ocName, (double)(uv_hrtime() - k->start_ns) / 1e6);
}

static void answeredCb(void *data, const Idem__Response *resp)
{
    struct call *k = data;
    struct conn *c = k->c;
    callLog(k, resp);
    callCount(k, resp);
    free(k);
    assert(c->inflight > 0);
    c->inflight--;
    rpc_figures.inflight--;
    rpc_conn_send(c, resp); /* bounds c's answers and the node's */
    rpc_conn_maybe_finish_drain(c);
    rpc_conn_flow_control(c);
    rpc_conn_unref(c); /* the request's reference */
}

/* Answers a frame we cannot serve; the connection then drains: requests it sent before
 * still get their answers, and it closes once they are written. */
void rpc_conn_bad_frame(struct conn *c, uint64_t request_id, const char *why)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    resp.request_id = request_id;
    resp.result = &res;
    resp.error = (char *)why;
    rpc_conn_send(c, &resp);
    rpc_conn_drain(c);
}

/* Answers a frame that is not taken in (n bytes, `have` of them at p) under `id`, with
 * `outcome`, `detail` and `why`; with an id the frame is then skipped, without one (0)
 * the connection drains. Returns the bytes consumed from p (0 when draining). */
static size_t refuseFrame(struct conn *c, size_t have, uint32_t n, uint64_t id,
                          Idem__Outcome outcome, const char *detail, const char *why)
{
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = outcome;
    res.detail = (char *)detail;
    resp.request_id = id;
    resp.result = &res;
    resp.error = (char *)why;
    rpc_conn_send(c, &resp);
    c->framed = true;
    if (id == 0) {
        rpc_conn_drain(c);
        return 0;
    }
    size_t take = have < n ? have : n;
    c->skip = (uint64_t)n - take;
    return take;
}

/* The length a frame buffer's first frame declares, 0 when it holds less than its prefix. */
static uint32_t firstFrameLen(const struct conn *c)
{
    if (c->skip > 0 || c->len < FRAME_HEADER_LEN) {
        return 0;
    }
    return frame_header_get(c->buf);
}

/* Gives back a frame buffer that a large frame grew, once what is left in it is small: an
 * idle connection holds CONN_BUF_MIN, not the largest frame it ever sent (up to
 * max_frame_bytes, for each of max_connections). Not while the frame it was grown for is
 * still arriving. */
static void connShrink(struct conn *c)
{
    uint32_t first = firstFrameLen(c);
    if (first != 0 && first <= c->srv->cfg->max_frame_bytes &&
        (size_t)first + 4 + CONN_READ_SLACK > CONN_BUF_MIN) {
        return;
    }
    if (c->cap > CONN_BUF_MIN && c->len <= CONN_BUF_MIN / 4) {
        c->buf = xrealloc(c->buf, CONN_BUF_MIN);
        rpc_figures.frame_buffer_bytes -= c->cap - CONN_BUF_MIN;
        rpc_frame_buffer_grown -= c->cap - CONN_BUF_MIN;
        c->cap = CONN_BUF_MIN;
    }
}

/* refuseUntaken(): the request id of the frame may be in bytes still to come. */
#define REFUSE_WAIT SIZE_MAX

/* Answers the frame at p (its prefix, then `have` of its n body bytes) that is not taken
 * in, under its request id when one can be read from its first bytes (refuseFrame).
 * Returns the body bytes consumed (0: no id, the connection drains), or REFUSE_WAIT when
 * the id may be in the bytes still to come. */
static size_t refuseUntaken(struct conn *c, const uint8_t *p, size_t have, uint32_t n,
                            Idem__Outcome outcome, const char *detail, const char *why)
{
    uint64_t id = 0;
    int found = frame_peek_request_id(p + FRAME_HEADER_LEN, have < n ? have : n, &id);
    if (found < 0 && have < n) {
        return REFUSE_WAIT;
    }
    return refuseFrame(c, have, n, found > 0 ? id : 0, outcome, detail, why);
}

/* Whether tok (len bytes) is a known token (service_credential_of): the first one
 * authenticates the connection (rpc_admit: a client's, or a member's with the cluster
 * secret); the last one is kept, and the same again is not hashed again until a reload
 * (which may have removed it). */
static bool connKnownToken(struct conn *c, const uint8_t *tok, size_t len)
{
    if (len == 0 || tok == NULL) {
        return false;
    }
    if (c->tok != NULL && c->cred_gen == c->srv->cred_gen && len == c->tok_len &&
        CRYPTO_memcmp(tok, c->tok, len) == 0) {
        return true;
    }
    uint8_t h[32];
    enum service_credential cr = service_credential_of(c->srv->svc, tok, len, h);
    if (cr == SERVICE_CREDENTIAL_NONE) {
        return false;
    }
    if (c->tok != NULL) { /* wiped, not left in the heap */
        OPENSSL_cleanse(c->tok, c->tok_len);
        free(c->tok);
        c->tok = NULL;
        c->tok_len = 0;
    }
    /* The token kept is this one, or none when it is too long to keep: never an older one,
     * which cred_gen, set now, would make pass for checked since the last reload. */
    if (len <= TOKEN_KEEP_MAX) {
        c->tok = xmalloc(len);
        memcpy(c->tok, tok, len);
        c->tok_len = len;
        memcpy(c->tok_sha256, h, sizeof h);
    }
    c->authed = true;
    c->cred_gen = c->srv->cred_gen;
    rpc_admit_authenticated(&c->srv->admit, &c->admit, cr == SERVICE_CREDENTIAL_CLUSTER);
    return true;
}

/* Answers a request whose token is not known, undecoded, as the service would have
 * (unauthenticated, the same words), and counts it as the service's answer would be. */
static void connRefuseToken(struct conn *c, const struct rpc_scan *sc)
{
    Idem__Request r = IDEM__REQUEST__INIT; /* what callKindOf() looks at */
    r.op_case = (Idem__Request__OpCase)sc->op;
    r.forwarded = sc->forwarded;
    r.as_tenant = sc->as_tenant ? "-" : "";
    struct call k = {.c = c,
                     .kind = callKindOf(&r),
                     .start_ns = uv_hrtime(),
                     .request_id = sc->request_id,
                     .op = (int)sc->op};
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED;
    resp.request_id = sc->request_id;
    resp.result = &res;
    resp.error = sc->as_tenant         ? "as_tenant needs the cluster secret"
                 : service_data_op(&r) ? "unknown or missing bearer token"
                                       : "admin operations need the admin token";
    rpc_figures.rejected_unauthenticated++;
    callLog(&k, &resp);
    callCount(&k, &resp);
    rpc_conn_send(c, &resp);
}

/* Checks a complete frame's body (n bytes at p), its token, decodes it and hands its
 * request to the service. False when it is not a request we can serve: it was answered and
 * the connection drains. */
static bool connTakeRequest(struct conn *c, const uint8_t *p, uint32_t n)
{
    c->progress_ms = uv_now(c->srv->loop);
    c->framed = true;
    struct rpc_scan sc;
    enum rpc_scan_status st = rpc_scan_request(p, n, &sc);
    if (st != RPC_SCAN_OK || sc.op == 0) {
        rpc_figures.rejected_fields += st == RPC_SCAN_TOO_MANY_FIELDS;
        rpc_figures.rejected_unknown_field += st == RPC_SCAN_UNKNOWN_FIELD;
        rpc_figures.rejected_malformed += st == RPC_SCAN_MALFORMED;
        rpc_conn_bad_frame(c, st == RPC_SCAN_MALFORMED ? 0 : sc.request_id,
                           st != RPC_SCAN_OK ? rpc_scan_why(st) : "request has no known op");
        return false;
    }
    if (!connKnownToken(c, sc.token, sc.token_len)) {
        connRefuseToken(c, &sc);
        /* A connection authenticated before a reload whose first unknown token comes after
         * it (most likely one the reload removed) is closed once answered: it would keep
         * an authenticated connection's room (frames buffered whole, its admission slot)
         * on a credential that no longer holds. It connects again like any client. */
        if (c->authed && c->cred_gen != c->srv->cred_gen) {
            rpc_conn_drain(c);
            return false;
        }
        return true;
    }
    /* Decoded into the server's arena, unless a request decoded into it is still being
     * handled (a frame processed from within service_handle): then with malloc. */
    struct rpc_server *srv = c->srv;
    struct arena *arena = srv->decoding ? NULL : &srv->decode;
    srv->decoding = true;
    struct rpc_alloc a;
    Idem__Request *req = rpc_scan_unpack(p, n, &sc, &a, arena);
    if (req == NULL || req->op_case == IDEM__REQUEST__OP__NOT_SET) {
        rpc_figures.rejected_decode_memory += a.exceeded;
        rpc_figures.rejected_malformed += !a.exceeded;
        rpc_scan_release(req, &a);
        srv->decoding = arena == NULL;
        rpc_conn_bad_frame(c, 0, "frame does not decode as a Request");
        return false;
    }
    struct call *k = xmalloc(sizeof(*k));
    k->c = c;
    k->kind = callKindOf(req);
    k->start_ns = uv_hrtime();
    k->request_id = req->request_id;
    k->op = (int)req->op_case;
    c->refs++;
    c->inflight++;
    rpc_figures.inflight++;
    char rid[LOG_RPC_ID_SIZE]; /* the lines written while the service handles it */
    log_rpc_id(rid, c->id, req->request_id);
    const char *outer = log_request_enter(rid);
    /* The digest kept is c->tok's: it goes with the request only when its token is those
     * bytes. A known token longer than TOKEN_KEEP_MAX is not kept (c->tok is then NULL), nor
     * is a token the service did not know: then the service takes the request's own
     * digest. */
    const uint8_t *digest = c->tok != NULL && req->auth_token.len == c->tok_len &&
                                    CRYPTO_memcmp(req->auth_token.data, c->tok, c->tok_len) == 0
                                ? c->tok_sha256
                                : NULL;
    service_handle(srv->svc, req, digest, answeredCb, k);
    log_request_leave(outer);
    rpc_scan_release(req, &a); /* service_handle kept nothing of it */
    srv->decoding = arena == NULL;
    return true;
}

static bool connHoldFrame(struct conn *c, uint32_t n);

/* connGate(): the frame is let through. */
#define GATE_PASS (SIZE_MAX - 1)

/* A frame of n bytes (its prefix, then `have` of them, at p) past
 * rpc.unauthenticated_max_frame_bytes on a connection that has sent no known token: read no
 * further than its first RPC_SCAN_PEEK_BYTES, where a client puts its token (rpc_scan_peek).
 * A known token there authenticates the connection and lets the frame through (GATE_PASS);
 * else it is answered unauthenticated under its id and skipped unread (refuseFrame: the
 * bytes consumed, 0 when it has no id). REFUSE_WAIT: those first bytes are not all here. */
static size_t connGate(struct conn *c, const uint8_t *p, size_t have, uint32_t n)
{
    size_t window = n < RPC_SCAN_PEEK_BYTES ? n : RPC_SCAN_PEEK_BYTES;
    if (have < window) {
        return REFUSE_WAIT;
    }
    struct rpc_scan sc;
    rpc_scan_peek(p + FRAME_HEADER_LEN, window, &sc);
    if (connKnownToken(c, sc.token, sc.token_len)) {
        return GATE_PASS;
    }
    rpc_figures.rejected_unauthenticated++;
    return refuseFrame(c, have, n, sc.request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED, "",
                       "unknown or missing bearer token: until a frame carries a known one, "
                       "a connection's frames are at most rpc.unauthenticated_max_frame_bytes "
                       "unless the token comes before the op");
}

/* Handles the complete frames in the buffer, up to CONN_MAX_INFLIGHT requests awaiting an
 * answer (c->backlog then says that frames were left). */
void rpc_conn_process(struct conn *c)
{
    size_t off = 0;
    const uint32_t max = c->srv->cfg->max_frame_bytes;
    assert(c->len <= c->cap);
    while (rpc_conn_open(c) && c->len - off > 0) {
        assert(off < c->len);
        if (c->skip > 0) {
            size_t d = c->len - off < c->skip ? c->len - off : (size_t)c->skip;
            off += d;
            c->skip -= d;
            if (c->skip == 0) {
                c->progress_ms = uv_now(c->srv->loop);
            }
            continue;
        }
        const uint8_t *p = c->buf + off;
        uint32_t n = 0;
        enum frame_status fs = frame_check(p, c->len - off, max, &n);
        if (fs == FRAME_SHORT) {
            break;
        }
        if (c->inflight >= CONN_MAX_INFLIGHT) {
            /* The cap holds per request, not per read: one read of a full buffer can bring
             * tens of thousands of small frames. The rest wait where they are. */
            c->backlog = true;
            break;
        }
        if (fs != FRAME_TOO_LARGE && !c->authed &&
            n > c->srv->cfg->unauthenticated_max_frame_bytes) {
            size_t took = connGate(c, p, c->len - off - FRAME_HEADER_LEN, n);
            if (took == REFUSE_WAIT) {
                break;
            }
            if (took == 0) {
                return; /* no request id: answered under 0, the connection drains */
            }
            if (took != GATE_PASS) {
                off += FRAME_HEADER_LEN + took;
                continue;
            }
        }
        if (fs == FRAME_COMPLETE) {
            off += FRAME_HEADER_LEN + (size_t)n;
            if (!connTakeRequest(c, p + FRAME_HEADER_LEN, n)) {
                return;
            }
            continue;
        }
        size_t have = c->len - off - FRAME_HEADER_LEN;
        size_t took;
        if (fs == FRAME_TOO_LARGE) {
            took = refuseUntaken(c, p, have, n, IDEM__OUTCOME__OUTCOME_INVALID, "frame_too_large",
                                 "frame larger than max_frame_bytes");
        } else if (connHoldFrame(c, n)) {
            break; /* FRAME_PARTIAL: the rest of it fits in the buffer */
        } else {
            /* Every connection's buffers together hold rpc.max_frame_buffer_mb already
             * (say, many peers that each started a large frame and stopped): this frame is
             * answered unavailable (a client may send it again) and skipped as it comes. */
            took = refuseUntaken(c, p, have, n, IDEM__OUTCOME__OUTCOME_UNAVAILABLE, "",
                                 "the node's frame buffers are full "
                                 "(rpc.max_frame_buffer_mb): send it again later");
            if (took != REFUSE_WAIT) {
                rpc_figures.frames_refused++;
                rpc_figures.requests.fail_closed++;
            }
        }
        if (took == REFUSE_WAIT) {
            break; /* the request id may be in the bytes still to come */
        }
        if (took == 0) {
            return; /* no request id: answered under 0, the connection drains */
        }
        off += FRAME_HEADER_LEN + took;
    }
    rpc_conn_flow_control(c);
    if (off > 0) {
        assert(off <= c->len);
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    connShrink(c);
}

/* The frame buffer's first CONN_BUF_MIN bytes. It grows past them only for a frame whose
 * length is known (connHoldFrame), so that every byte a connection buffers is counted
 * against rpc.max_frame_buffer_mb before it is taken. */
void rpc_conn_reserve(struct conn *c)
{
    if (c->cap == 0) {
        c->buf = xmalloc(CONN_BUF_MIN);
        rpc_figures.frame_buffer_bytes += CONN_BUF_MIN;
        c->cap = CONN_BUF_MIN;
    }
}

/* Makes room for the frame of n bytes (n <= max_frame_bytes) and CONN_READ_SLACK more,
 * once it is at the buffer's front (rpc_conn_process moves what is left there before the next
 * read), within every connection's budget together: the growth of frame buffers past
 * their first CONN_BUF_MIN bytes is at most rpc.max_frame_buffer_mb. False, nothing
 * changed, when it would go past. */
static bool connHoldFrame(struct conn *c, uint32_t n)
{
    size_t need = 4 + (size_t)n + CONN_READ_SLACK;
    if (need <= c->cap) {
        return true;
    }
    uint64_t budget = (uint64_t)c->srv->cfg->max_frame_buffer_mb << 20;
    uint64_t more = need - (c->cap > CONN_BUF_MIN ? c->cap : CONN_BUF_MIN);
    if (rpc_frame_buffer_grown + more > budget) {
        return false;
    }
    rpc_frame_buffer_grown += more;
    c->buf = xrealloc(c->buf, need);
    rpc_figures.frame_buffer_bytes += need - c->cap;
    c->cap = need;
    return true;
}
