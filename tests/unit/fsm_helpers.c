#include "fsm_helpers.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "prefault_thread.h"

void th_init(struct th *h)
{
    h->f = fsm_new_with(&(struct fsm_options){.prefault = &prefault_thread}); /* as the daemon */
    h->index = 1;
    memset(&h->r, 0, sizeof(h->r));
}

void th_close(struct th *h)
{
    fsm_close(h->f);
    h->f = NULL;
}

void th_fp(uint8_t out[32], uint8_t b)
{
    memset(out, b, 32);
}

Idem__Outcome th_apply(struct th *h, const Idem__Command *cmd)
{
    size_t n = idem__command__get_packed_size(cmd);
    uint8_t *buf = malloc(n ? n : 1);
    assert(buf != NULL);
    idem__command__pack(cmd, buf);
    Idem__Outcome o = fsm_apply(h->f, h->index++, buf, n, &h->r);
    free(buf);
    return o;
}

static ProtobufCBinaryData bin(const char *s)
{
    ProtobufCBinaryData b = {s ? strlen(s) : 0, (uint8_t *)s};
    return b;
}

Idem__Outcome th_claim(struct th *h, uint64_t now, const char *key, uint8_t fp,
                       const struct th_claim *opt)
{
    static const struct th_claim none;
    if (opt == NULL) {
        opt = &none;
    }
    uint8_t fpb[32];
    th_fp(fpb, fp);
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    Idem__TenantLimits lim = IDEM__TENANT_LIMITS__INIT;
    c.tenant = (char *)(opt->tenant ? opt->tenant : "t1");
    c.key = bin(key);
    c.fingerprint.data = fpb;
    c.fingerprint.len = sizeof(fpb);
    c.attempt_id = bin(opt->attempt);
    c.lease_ms = opt->lease_ms ? opt->lease_ms : 1000;
    c.ttl_ms = opt->ttl_ms ? opt->ttl_ms : 10000;
    c.tombstone_ttl_ms = opt->tombstone_ttl_ms;
    c.policy = opt->policy;
    if (opt->max_records || opt->max_bytes) {
        lim.max_records = opt->max_records;
        lim.max_bytes = opt->max_bytes;
        c.limits = &lim;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    return th_apply(h, &cmd);
}

Idem__Outcome th_complete(struct th *h, uint64_t now, const char *tenant, const char *key,
                          uint64_t token, Idem__Completion outcome, uint32_t status,
                          const char *body, uint64_t max_bytes)
{
    Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    Idem__Header hdr = IDEM__HEADER__INIT;
    Idem__Header *hdrs[1] = {&hdr};
    Idem__TenantLimits lim = IDEM__TENANT_LIMITS__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    c.token = token;
    c.outcome = outcome;
    if (status != 0) {
        resp.status = status;
        resp.body = bin(body);
        hdr.name = "content-type";
        hdr.value = bin("application/json");
        resp.n_headers = 1;
        resp.headers = hdrs;
        c.response = &resp;
    }
    if (max_bytes) {
        lim.max_bytes = max_bytes;
        c.limits = &lim;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
    cmd.complete = &c;
    return th_apply(h, &cmd);
}

Idem__Outcome th_release(struct th *h, uint64_t now, const char *tenant, const char *key,
                         uint64_t token)
{
    Idem__ReleaseCmd c = IDEM__RELEASE_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    c.token = token;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RELEASE;
    cmd.release = &c;
    return th_apply(h, &cmd);
}

Idem__Outcome th_renew(struct th *h, uint64_t now, const char *tenant, const char *key,
                       uint64_t token, uint64_t lease_ms)
{
    Idem__RenewCmd c = IDEM__RENEW_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    c.token = token;
    c.lease_ms = lease_ms;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RENEW;
    cmd.renew = &c;
    return th_apply(h, &cmd);
}

Idem__Outcome th_get(struct th *h, uint64_t now, const char *tenant, const char *key)
{
    Idem__GetCmd c = IDEM__GET_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_GET;
    cmd.get = &c;
    return th_apply(h, &cmd);
}

static Idem__Outcome resolveCmd(struct th *h, uint64_t now, const char *tenant, const char *key,
                                int release, uint32_t status, const char *body, bool unsettled_only)
{
    Idem__ResolveCmd c = IDEM__RESOLVE_CMD__INIT;
    c.unsettled_only = unsettled_only;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    c.release = release != 0;
    if (status != 0) {
        resp.status = status;
        resp.body = bin(body);
        c.response = &resp;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RESOLVE;
    cmd.resolve = &c;
    return th_apply(h, &cmd);
}

Idem__Outcome th_resolve(struct th *h, uint64_t now, const char *tenant, const char *key,
                         int release, uint32_t status, const char *body)
{
    return resolveCmd(h, now, tenant, key, release, status, body, false);
}

Idem__Outcome th_resolve_unsettled(struct th *h, uint64_t now, const char *tenant, const char *key,
                                   int release, uint32_t status, const char *body)
{
    return resolveCmd(h, now, tenant, key, release, status, body, true);
}

Idem__Outcome th_expire(struct th *h, uint64_t now, uint32_t max_batch)
{
    return th_expire_as(h, now, max_batch, false);
}

Idem__Outcome th_expire_as(struct th *h, uint64_t now, uint32_t max_batch, bool keep_live_leases)
{
    Idem__ExpireCmd c = IDEM__EXPIRE_CMD__INIT;
    c.max_batch = max_batch;
    c.keep_live_leases = keep_live_leases;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_EXPIRE;
    cmd.expire = &c;
    return th_apply(h, &cmd);
}

const char *th_body(const uint8_t *resp, size_t len)
{
    static char out[4096];
    out[0] = '\0';
    Idem__StoredResponse *m = idem__stored_response__unpack(NULL, len, resp);
    if (m == NULL) {
        return "<malformed>";
    }
    size_t n = m->body.len < sizeof(out) - 1 ? m->body.len : sizeof(out) - 1;
    memcpy(out, m->body.data, n);
    out[n] = '\0';
    idem__stored_response__free_unpacked(m, NULL);
    return out;
}
