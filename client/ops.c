/* ops.c: the typed operations (claim, complete, release, renew, get): plain C arguments to
 * an idem.Request, an idem.Response to a struct idem_result, and the synchronous calls. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* What a result owns behind its pointers. */
struct resultOwned {
    Idem__Response *m;         /* the answer */
    Idem__StoredResponse *sr;  /* get: the record's unpacked stored response */
    struct idem_header *hdrs;  /* the response's headers, pointing into m, sr or copy */
    void *copy;                /* idem_run: one block holding a copy of fn's response */
};

/* ---- building requests --------------------------------------------------------------- */

#define ATTEMPT_ID_MAX 64

void IdemBuiltFree(struct idem_built *b)
{
    free(b->hdrs);
    free(b->hdr_ptrs);
    b->hdrs = NULL;
    b->hdr_ptrs = NULL;
}

static int buildResponse(const struct idem_response *r, struct idem_built *b, char *why,
                         size_t why_len)
{
    if ((r->n_headers > 0 && r->headers == NULL) || (r->body_len > 0 && r->body == NULL)) {
        IdemWhyf(why, why_len, "response: NULL headers or body with a non-zero count");
        return IDEM_EINVAL;
    }
    idem__stored_response__init(&b->sr);
    b->sr.status = r->status;
    b->sr.body.data = (uint8_t *)r->body;
    b->sr.body.len = r->body_len;
    if (r->body_ref != NULL && r->body_ref[0] != '\0') {
        b->sr.body_ref = (char *)r->body_ref;
    }
    if (r->body_sha256 != NULL) {
        b->sr.body_sha256.data = (uint8_t *)r->body_sha256;
        b->sr.body_sha256.len = 32;
    }
    if (r->n_headers > 0) {
        if (r->n_headers > IDEM_MAX_FRAME / 4) {
            IdemWhyf(why, why_len, "response: too many headers");
            return IDEM_ETOOBIG;
        }
        b->hdrs = calloc(r->n_headers, sizeof *b->hdrs);
        b->hdr_ptrs = calloc(r->n_headers, sizeof *b->hdr_ptrs);
        if (b->hdrs == NULL || b->hdr_ptrs == NULL) {
            return IDEM_ENOMEM;
        }
        for (size_t i = 0; i < r->n_headers; i++) {
            const struct idem_header *h = &r->headers[i];
            if (h->name == NULL || h->name[0] == '\0' || (h->value_len > 0 && h->value == NULL)) {
                IdemWhyf(why, why_len, "response: header %zu has no name or a NULL value", i);
                return IDEM_EINVAL;
            }
            idem__header__init(&b->hdrs[i]);
            b->hdrs[i].name = (char *)h->name;
            b->hdrs[i].value.data = (uint8_t *)h->value;
            b->hdrs[i].value.len = h->value_len;
            b->hdr_ptrs[i] = &b->hdrs[i];
        }
        b->sr.n_headers = r->n_headers;
        b->sr.headers = b->hdr_ptrs;
    }
    return IDEM_OK;
}

int IdemOpBuild(const struct idem_op *op, struct idem_built *b, char *why, size_t why_len)
{
    memset(b, 0, sizeof *b);
    idem__request__init(&b->req);
    if (op->key == NULL || op->key[0] == '\0') {
        IdemWhyf(why, why_len, "empty or NULL key");
        return IDEM_EINVAL;
    }
    ProtobufCBinaryData key = {.len = strlen(op->key), .data = (uint8_t *)op->key};
    switch (op->kind) {
    case IDEM_OP_CLAIM:
        if (op->fingerprint == NULL) {
            IdemWhyf(why, why_len, "claim: NULL fingerprint");
            return IDEM_EINVAL;
        }
        if (op->policy < IDEM_POLICY_DEFAULT || op->policy > IDEM_POLICY_TAKEOVER) {
            IdemWhyf(why, why_len, "claim: unknown policy %d", op->policy);
            return IDEM_EINVAL;
        }
        idem__claim_request__init(&b->claim);
        b->claim.key = key;
        b->claim.fingerprint.data = (uint8_t *)op->fingerprint;
        b->claim.fingerprint.len = IDEM_FINGERPRINT_LEN;
        if (op->attempt_id != NULL) {
            size_t n = strlen(op->attempt_id);
            if (n == 0) {
                /* The server takes a claim without one as a new attempt every time, so a
                 * retry of it would not get its own lease back (NULL makes one). */
                IdemWhyf(why, why_len, "claim: empty attempt id (NULL makes a fresh one)");
                return IDEM_EINVAL;
            }
            if (n > ATTEMPT_ID_MAX) {
                IdemWhyf(why, why_len, "claim: attempt id longer than %d bytes", ATTEMPT_ID_MAX);
                return IDEM_EINVAL;
            }
            b->claim.attempt_id.data = (uint8_t *)op->attempt_id;
            b->claim.attempt_id.len = n;
        }
        b->claim.lease_ms = op->lease_ms;
        b->claim.ttl_ms = op->ttl_ms;
        b->claim.policy = (Idem__LeasePolicy)op->policy;
        b->req.op_case = IDEM__REQUEST__OP_CLAIM;
        b->req.claim = &b->claim;
        return IDEM_OK;
    case IDEM_OP_COMPLETE: {
        if (op->completion < IDEM_COMPLETION_SUCCEEDED ||
            op->completion > IDEM_COMPLETION_UNKNOWN) {
            IdemWhyf(why, why_len, "complete: unknown completion %d", op->completion);
            return IDEM_EINVAL;
        }
        /* unknown may come without a response (docs/contract.md): none given, or one left
         * as it was zeroed (status 0), is none; any other completion needs one. */
        bool none = op->completion == IDEM_COMPLETION_UNKNOWN &&
                    (op->response == NULL || op->response->status == 0);
        if (op->response == NULL && !none) {
            IdemWhyf(why, why_len, "complete: NULL response");
            return IDEM_EINVAL;
        }
        if (!none) {
            int rv = buildResponse(op->response, b, why, why_len);
            if (rv != IDEM_OK) {
                return rv;
            }
        }
        idem__complete_request__init(&b->complete);
        b->complete.key = key;
        b->complete.token = op->token;
        b->complete.outcome = (Idem__Completion)op->completion;
        b->complete.response = none ? NULL : &b->sr;
        b->req.op_case = IDEM__REQUEST__OP_COMPLETE;
        b->req.complete = &b->complete;
        return IDEM_OK;
    }
    case IDEM_OP_RELEASE:
        idem__release_request__init(&b->release);
        b->release.key = key;
        b->release.token = op->token;
        b->req.op_case = IDEM__REQUEST__OP_RELEASE;
        b->req.release = &b->release;
        return IDEM_OK;
    case IDEM_OP_RENEW:
        idem__renew_request__init(&b->renew);
        b->renew.key = key;
        b->renew.token = op->token;
        b->renew.lease_ms = op->lease_ms;
        b->req.op_case = IDEM__REQUEST__OP_RENEW;
        b->req.renew = &b->renew;
        return IDEM_OK;
    case IDEM_OP_GET:
        idem__get_request__init(&b->get);
        b->get.key = key;
        b->req.op_case = IDEM__REQUEST__OP_GET;
        b->req.get = &b->get;
        return IDEM_OK;
    }
    IdemWhyf(why, why_len, "unknown operation");
    return IDEM_EINVAL;
}

/* ---- results ------------------------------------------------------------------------- */

void IdemResultFail(struct idem_result *out, const char *fmt, ...)
{
    memset(out, 0, sizeof *out);
    char tmp[sizeof out->detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(out->detail, tmp, sizeof tmp);
}

void idem_result_free(struct idem_result *r)
{
    if (r == NULL) {
        return;
    }
    struct resultOwned *o = r->priv_;
    if (o != NULL) {
        if (o->m != NULL) {
            idem__response__free_unpacked(o->m, NULL);
        }
        if (o->sr != NULL) {
            idem__stored_response__free_unpacked(o->sr, NULL);
        }
        free(o->hdrs);
        free(o->copy);
        free(o);
    }
    memset(r, 0, sizeof *r);
}

void idem_result_move(struct idem_result *dst, struct idem_result *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}

/* Points out->response at `sr` (owned by `o`). */
static int setResponse(struct idem_result *out, struct resultOwned *o,
                       const Idem__StoredResponse *sr)
{
    struct idem_response *r = &out->response;
    memset(r, 0, sizeof *r);
    r->status = sr->status;
    if (sr->n_headers > 0) {
        o->hdrs = calloc(sr->n_headers, sizeof *o->hdrs);
        if (o->hdrs == NULL) {
            return IDEM_ENOMEM;
        }
        for (size_t i = 0; i < sr->n_headers; i++) {
            o->hdrs[i].name = sr->headers[i]->name;
            o->hdrs[i].value = sr->headers[i]->value.data;
            o->hdrs[i].value_len = sr->headers[i]->value.len;
        }
        r->headers = o->hdrs;
        r->n_headers = sr->n_headers;
    }
    if (sr->body.len > 0) {
        r->body = sr->body.data;
        r->body_len = sr->body.len;
    }
    if (sr->body_ref != NULL && sr->body_ref[0] != '\0') {
        r->body_ref = sr->body_ref;
    }
    if (sr->body_sha256.len == 32) {
        r->body_sha256 = sr->body_sha256.data;
    }
    out->has_response = 1;
    return IDEM_OK;
}

int IdemResultFill(struct idem_result *out, Idem__Response *m)
{
    memset(out, 0, sizeof *out);
    struct resultOwned *o = calloc(1, sizeof *o);
    if (o == NULL) {
        idem__response__free_unpacked(m, NULL);
        IdemResultFail(out, "out of memory");
        return IDEM_ENOMEM;
    }
    o->m = m;
    out->priv_ = o;
    if (m->error != NULL && m->error[0] != '\0') {
        snprintf(out->detail, sizeof out->detail, "%s", m->error);
    }
    const Idem__Result *res = m->result;
    if (res == NULL) {
        /* Every answer of idemd to a data operation carries a result: without one the
         * outcome is unknown (the request may have been applied). */
        char said[sizeof out->detail];
        memcpy(said, out->detail, sizeof said);
        idem_result_free(out);
        IdemResultFail(out, "the node's answer carries no result%s%.200s", said[0] ? ": " : "",
                       said);
        return IDEM_EPROTO;
    }
    out->outcome = (int)res->outcome;
    out->token = res->token;
    out->lease_deadline_ms = res->lease_deadline_ms;
    out->lease_ms = res->lease_ms;
    out->retry_after_ms = res->retry_after_ms;
    out->expires_at_ms = res->expires_at_ms;
    out->takeover = res->takeover ? 1 : 0;
    out->previous_token = res->previous_token;
    if (out->detail[0] == '\0' && res->detail != NULL && res->detail[0] != '\0') {
        snprintf(out->detail, sizeof out->detail, "%s", res->detail);
    }
    int rv = IDEM_OK;
    if (res->response != NULL) {
        rv = setResponse(out, o, res->response);
    }
    const Idem__Record *rec = res->record;
    if (rv == IDEM_OK && rec != NULL) {
        struct idem_record *d = &out->record;
        d->state = (int)rec->state;
        d->token = rec->token;
        d->created_at_ms = rec->created_at_ms;
        d->lease_deadline_ms = rec->lease_deadline_ms;
        d->expires_at_ms = rec->expires_at_ms;
        d->completion = (int)rec->completion;
        if (rec->fingerprint.len == IDEM_FINGERPRINT_LEN) {
            memcpy(d->fingerprint, rec->fingerprint.data, IDEM_FINGERPRINT_LEN);
            d->fingerprint_len = IDEM_FINGERPRINT_LEN;
        }
        out->has_record = 1;
        if (rec->response.len > 0 && !out->has_response) {
            o->sr = idem__stored_response__unpack(NULL, rec->response.len, rec->response.data);
            if (o->sr == NULL) {
                idem_result_free(out);
                IdemResultFail(out, "the record's stored response does not decode");
                return IDEM_EPROTO;
            }
            rv = setResponse(out, o, o->sr);
        }
    }
    if (rv != IDEM_OK) {
        idem_result_free(out);
        IdemResultFail(out, "out of memory");
    }
    return rv;
}

/* Replaces out's response by a copy of `r` (borrowed), held in one block. */
int IdemResultCopyResponse(struct idem_result *out, const struct idem_response *r)
{
    struct resultOwned *o = out->priv_;
    if (o == NULL) {
        o = calloc(1, sizeof *o);
        if (o == NULL) {
            return IDEM_ENOMEM;
        }
        out->priv_ = o;
    }
    size_t need = r->n_headers * sizeof(struct idem_header) + r->body_len + 32 + 1;
    for (size_t i = 0; i < r->n_headers; i++) {
        need += strlen(r->headers[i].name) + 1 + r->headers[i].value_len;
    }
    if (r->body_ref != NULL) {
        need += strlen(r->body_ref) + 1;
    }
    uint8_t *blk = malloc(need);
    if (blk == NULL) {
        return IDEM_ENOMEM;
    }
    struct idem_header *hdrs = (struct idem_header *)(void *)blk;
    uint8_t *p = blk + r->n_headers * sizeof(struct idem_header);
    struct idem_response c = {.status = r->status, .n_headers = r->n_headers};
    for (size_t i = 0; i < r->n_headers; i++) {
        size_t nl = strlen(r->headers[i].name) + 1;
        memcpy(p, r->headers[i].name, nl);
        hdrs[i].name = (const char *)p;
        p += nl;
        if (r->headers[i].value_len > 0) {
            memcpy(p, r->headers[i].value, r->headers[i].value_len);
        }
        hdrs[i].value = p;
        hdrs[i].value_len = r->headers[i].value_len;
        p += r->headers[i].value_len;
    }
    c.headers = r->n_headers > 0 ? hdrs : NULL;
    if (r->body_len > 0) {
        memcpy(p, r->body, r->body_len);
        c.body = p;
        c.body_len = r->body_len;
        p += r->body_len;
    }
    if (r->body_sha256 != NULL) {
        memcpy(p, r->body_sha256, 32);
        c.body_sha256 = p;
        p += 32;
    }
    if (r->body_ref != NULL) {
        size_t bl = strlen(r->body_ref) + 1;
        memcpy(p, r->body_ref, bl);
        c.body_ref = (const char *)p;
    }
    free(o->copy);
    o->copy = blk;
    out->response = c;
    out->has_response = 1;
    return IDEM_OK;
}

/* ---- synchronous calls --------------------------------------------------------------- */

static int syncOp(struct idem_client *c, const struct idem_op *op, uint32_t deadline_ms,
                  struct idem_result *out)
{
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    memset(out, 0, sizeof *out);
    if (c == NULL) {
        IdemResultFail(out, "NULL client");
        return IDEM_EINVAL;
    }
    struct idem_built b;
    int rv = IdemOpBuild(op, &b, out->detail, sizeof out->detail);
    if (rv == IDEM_OK) {
        Idem__Response *m = NULL;
        rv = IdemClientCall(c, &b.req, deadline_ms ? deadline_ms : IdemClientDefaultDeadline(c),
                            &m, out->detail, sizeof out->detail);
        if (rv == IDEM_OK) {
            rv = IdemResultFill(out, m);
        }
    }
    IdemBuiltFree(&b);
    if (rv != IDEM_OK && out->priv_ == NULL) {
        char detail[sizeof out->detail];
        memcpy(detail, out->detail, sizeof detail);
        IdemResultFail(out, "%s", detail);
    }
    return rv;
}

int IdemClaimOp(const char *key, const uint8_t *fingerprint, const struct idem_claim_opts *opts,
                char attempt[IDEM_ATTEMPT_ID_HEX + 1], struct idem_op *op)
{
    static const struct idem_claim_opts none;
    if (opts == NULL) {
        opts = &none;
    }
    const char *aid = opts->attempt_id;
    if (aid == NULL) {
        if (idem_attempt_id_new(attempt) != IDEM_OK) {
            return IDEM_ESYS;
        }
        aid = attempt;
    }
    *op = (struct idem_op){.kind = IDEM_OP_CLAIM,
                           .key = key,
                           .fingerprint = fingerprint,
                           .attempt_id = aid,
                           .lease_ms = opts->lease_ms,
                           .ttl_ms = opts->ttl_ms,
                           .policy = opts->policy};
    return IDEM_OK;
}

int idem_claim(struct idem_client *c, const char *key,
               const uint8_t fingerprint[IDEM_FINGERPRINT_LEN], const struct idem_claim_opts *opts,
               struct idem_result *out)
{
    char attempt[IDEM_ATTEMPT_ID_HEX + 1];
    struct idem_op op;
    if (IdemClaimOp(key, fingerprint, opts, attempt, &op) != IDEM_OK) {
        if (out != NULL) {
            IdemResultFail(out, "no random attempt id");
        }
        return IDEM_ESYS;
    }
    return syncOp(c, &op, opts != NULL ? opts->deadline_ms : 0, out);
}

int idem_complete(struct idem_client *c, const char *key, uint64_t token, int completion,
                  const struct idem_response *response, uint32_t deadline_ms,
                  struct idem_result *out)
{
    struct idem_op op = {.kind = IDEM_OP_COMPLETE,
                         .key = key,
                         .token = token,
                         .completion = completion,
                         .response = response};
    return syncOp(c, &op, deadline_ms, out);
}

int idem_release(struct idem_client *c, const char *key, uint64_t token, uint32_t deadline_ms,
                 struct idem_result *out)
{
    struct idem_op op = {.kind = IDEM_OP_RELEASE, .key = key, .token = token};
    return syncOp(c, &op, deadline_ms, out);
}

int idem_renew(struct idem_client *c, const char *key, uint64_t token, uint64_t lease_ms,
               uint32_t deadline_ms, struct idem_result *out)
{
    struct idem_op op = {.kind = IDEM_OP_RENEW, .key = key, .token = token, .lease_ms = lease_ms};
    return syncOp(c, &op, deadline_ms, out);
}

int idem_get(struct idem_client *c, const char *key, uint32_t deadline_ms,
             struct idem_result *out)
{
    struct idem_op op = {.kind = IDEM_OP_GET, .key = key};
    return syncOp(c, &op, deadline_ms, out);
}
