/* service_requests: authentication (bearer tokens, the cluster secret of a proxied request)
 * and the data requests (claim, complete, release, renew, get): each becomes one command
 * with the leader's clock and the tenant's defaults and quotas, checked as the state machine
 * would check it, then proposed (service.c). The entry points service_handle and
 * service_handle_as dispatch admin ops to service_admin.c. */
#include "service_internal.h"

#include <openssl/evp.h>
#include <string.h>

#include "key.h"

bool service_token_hash(const struct service *s, const ProtobufCBinaryData *tok, uint8_t h[32])
{
    if (s->given.tok != NULL && tok->len > 0 && tok->data == s->given.tok &&
        tok->len == s->given.len) {
        memcpy(h, s->given.sha256, 32); /* the request's own token, digested by the caller */
        return true;
    }
    return tokhash_sha256(s->tokhash, tok->data, tok->len, h);
}

const struct config_tenant *service_auth_tenant(const struct service *s,
                                              const ProtobufCBinaryData *tok)
{
    uint8_t h[32];
    return service_token_hash(s, tok, h) ? config_tenant_by_token_hash(s->cfg, h) : NULL;
}

bool service_auth_admin(const struct service *s, const ProtobufCBinaryData *tok)
{
    uint8_t h[32];
    return service_token_hash(s, tok, h) && config_is_admin_hash(s->cfg, h);
}

enum service_credential service_credential_of(const struct service *s, const uint8_t *token,
                                              size_t len, uint8_t *sha256)
{
    ProtobufCBinaryData tok = {len, (uint8_t *)token};
    uint8_t h[32];
    if (!service_token_hash(s, &tok, h)) {
        return SERVICE_CREDENTIAL_NONE;
    }
    memcpy(sha256, h, 32);
    if (config_tenant_by_token_hash(s->cfg, h) != NULL) {
        return SERVICE_CREDENTIAL_TENANT;
    }
    if (config_is_admin_hash(s->cfg, h)) {
        return SERVICE_CREDENTIAL_ADMIN;
    }
    return config_is_cluster_secret_hash(s->cfg, h) ? SERVICE_CREDENTIAL_CLUSTER
                                                    : SERVICE_CREDENTIAL_NONE;
}

uint32_t service_deadline_of(const struct service *s, const Idem__Request *req)
{
    uint32_t d = req->deadline_ms ? req->deadline_ms : s->cfg->rpc.default_deadline_ms;
    return d > s->cfg->rpc.max_deadline_ms ? s->cfg->rpc.max_deadline_ms : d;
}

const char *service_key_error(int key_rc)
{
    switch (key_rc) {
    case KEY_OK:
        return NULL;
    case KEY_MISSING:
        return "idempotency_key_missing";
    default:
        return "idempotency_key_invalid";
    }
}

/* The commands a data request may become; cmd points at one of them. */
struct dataCmd {
    Idem__Command cmd;
    Idem__ClaimCmd claim;
    Idem__CompleteCmd complete;
    Idem__ReleaseCmd release;
    Idem__RenewCmd renew;
    Idem__GetCmd get;
    Idem__TenantLimits limits;
};

Idem__LeasePolicy service_claim_policy(const struct config_tenant *t, Idem__LeasePolicy asked)
{
    if (asked != IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED) {
        return asked;
    }
    return t->lease_policy == CONFIG_LEASE_TAKEOVER ? IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
                                                    : IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
}

/* Builds into d the command a data request of tenant t becomes, with the tenant's defaults
 * and quotas and the leader's clock. Returns NULL, or why the request is invalid (an
 * unknown op, a claim's fingerprint or a complete's response that cannot be right). */
static const char *dataCommand(const struct config_tenant *t, const Idem__Request *req,
                               struct dataCmd *d)
{
    *d = (struct dataCmd){
        .cmd = IDEM__COMMAND__INIT,
        .claim = IDEM__CLAIM_CMD__INIT,
        .complete = IDEM__COMPLETE_CMD__INIT,
        .release = IDEM__RELEASE_CMD__INIT,
        .renew = IDEM__RENEW_CMD__INIT,
        .get = IDEM__GET_CMD__INIT,
        .limits = IDEM__TENANT_LIMITS__INIT,
    };
    d->limits.max_records = t->max_records;
    d->limits.max_bytes = t->max_bytes;
    d->cmd.now_ms = service_now_ms();
    char *tenant = (char *)t->name;
    const char *why = NULL;
    switch (req->op_case) {
    case IDEM__REQUEST__OP_CLAIM:
        d->claim.tenant = tenant;
        d->claim.key = req->claim->key;
        d->claim.fingerprint = req->claim->fingerprint;
        d->claim.attempt_id = req->claim->attempt_id;
        d->claim.lease_ms = req->claim->lease_ms ? req->claim->lease_ms : t->lease_ms;
        d->claim.ttl_ms = req->claim->ttl_ms ? req->claim->ttl_ms : t->ttl_ms;
        d->claim.tombstone_ttl_ms = t->tombstone_ttl_ms;
        d->claim.policy = service_claim_policy(t, req->claim->policy);
        d->claim.limits = &d->limits;
        d->cmd.op_case = IDEM__COMMAND__OP_CLAIM;
        d->cmd.claim = &d->claim;
        return d->claim.fingerprint.len != FSM_FINGERPRINT_LEN
                   ? "fingerprint must be 32 bytes (SHA-256)"
                   : NULL;
    case IDEM__REQUEST__OP_COMPLETE:
        if (req->complete->response != NULL &&
            !fsm_response_check(req->complete->response, &why)) {
            return why;
        }
        d->complete.tenant = tenant;
        d->complete.key = req->complete->key;
        d->complete.token = req->complete->token;
        d->complete.outcome = req->complete->outcome;
        d->complete.response = req->complete->response;
        d->complete.limits = &d->limits;
        d->cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
        d->cmd.complete = &d->complete;
        return NULL;
    case IDEM__REQUEST__OP_RELEASE:
        d->release.tenant = tenant;
        d->release.key = req->release->key;
        d->release.token = req->release->token;
        d->cmd.op_case = IDEM__COMMAND__OP_RELEASE;
        d->cmd.release = &d->release;
        return NULL;
    case IDEM__REQUEST__OP_RENEW:
        d->renew.tenant = tenant;
        d->renew.key = req->renew->key;
        d->renew.token = req->renew->token;
        d->renew.lease_ms = req->renew->lease_ms ? req->renew->lease_ms : t->lease_ms;
        d->cmd.op_case = IDEM__COMMAND__OP_RENEW;
        d->cmd.renew = &d->renew;
        return NULL;
    case IDEM__REQUEST__OP_GET:
        d->get.tenant = tenant;
        d->get.key = req->get->key;
        d->cmd.op_case = IDEM__COMMAND__OP_GET;
        d->cmd.get = &d->get;
        return NULL;
    default:
        return "unknown op";
    }
}

/* The lease a claim or renew asks for (0 for other commands). */
static uint64_t dataLeaseMs(const struct dataCmd *d)
{
    return d->cmd.op_case == IDEM__COMMAND__OP_CLAIM   ? d->claim.lease_ms
           : d->cmd.op_case == IDEM__COMMAND__OP_RENEW ? d->renew.lease_ms
                                                       : 0;
}

/* The checks of a built data command before it is proposed: NULL, or why it is invalid.
 * Its key is judged here once, by the state machine's own check (fsm_command_check) with
 * the tenant's key_max_len; the state machine judges it again when it applies the entry. */
static const char *dataCheck(const struct config_tenant *t, const struct dataCmd *d)
{
    /* Whatever the state machine refuses without looking at its state is refused here,
     * before it becomes a log entry that every node writes and syncs. */
    int krc = KEY_OK;
    const char *bad = fsm_command_check(&d->cmd, t->key_max_len, &krc);
    if (krc != KEY_OK) {
        return service_key_error(krc);
    }
    /* A lease or ttl a request asks for is held to the bounds of the tenant's own (a
     * lease of 2^64-1 ms never expired, and kept its record from expiry for good). */
    if (dataLeaseMs(d) > CONFIG_LEASE_MAX_MS) {
        return "lease_ms above the maximum (86400000: 24 h)";
    }
    if (d->cmd.op_case == IDEM__COMMAND__OP_CLAIM && d->claim.ttl_ms > CONFIG_TTL_MAX_MS) {
        return "ttl_ms above the maximum (31536000000: 365 days)";
    }
    return bad;
}

/* A data op on behalf of tenant t (authenticated by the caller). */
static void handleDataAs(struct service *s, const struct config_tenant *t,
                         const Idem__Request *req, service_done_cb cb, void *data)
{
    struct dataCmd d;
    const char *why = dataCommand(t, req, &d);
    if (why == NULL) {
        why = dataCheck(t, &d);
    }
    if (why != NULL) {
        service_answer_invalid(cb, data, req->request_id, why);
        return;
    }
    /* The tenant's account (batch.tenant_max_pending_percent), by its name in this node's
     * configuration; only a leader proposes, so the leader's own configuration counts. */
    uint32_t account = service_account_of(s, t);
    struct op *o = service_propose(s, &d.cmd, OP_CLIENT, account, req->request_id,
                                   service_deadline_of(s, req), cb, data);
    if (o != NULL) {
        o->lease_ms = dataLeaseMs(&d);
        o->now_ms = d.cmd.now_ms;
    }
}

static void handleData(struct service *s, const Idem__Request *req, service_done_cb cb,
                       void *data)
{
    const struct config_tenant *t = service_auth_tenant(s, &req->auth_token);
    if (t == NULL) {
        s->stats.unauthenticated++;
        /* The admin token is known but owns no records: forbidden (403), as a tenant's
         * token on an admin op is (docs/contract.md tells the two apart). */
        if (service_auth_admin(s, &req->auth_token)) {
            service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                         "data operations need a tenant's token, not the admin token", NULL);
            return;
        }
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                     "unknown or missing bearer token", NULL);
        return;
    }
    handleDataAs(s, t, req, cb, data);
}

static void handleAs(struct service *s, const char *tenant_name, const Idem__Request *req,
                     service_done_cb cb, void *data);

/* Whether a proxy route of this node's configuration names the tenant: the only tenants the
 * cluster secret acts for (a follower's proxy claims for its route's tenant, and the
 * proxy routes are the same on every node: docs/configuration.md). */
static bool routeTenant(const struct config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_proxies; i++) {
        for (size_t r = 0; r < cfg->proxies[i].n_routes; r++) {
            if (strcmp(cfg->tenants[cfg->proxies[i].routes[r].tenant].name, name) == 0) {
                return true;
            }
        }
    }
    return false;
}

/* A request with as_tenant: a follower's proxy on behalf of its route's tenant. Only the
 * cluster secret may ask for it (its SHA-256 compared in constant time), and only for a data
 * op and a tenant that a proxy route names: anything else is forbidden (a known tenant or
 * admin token, another tenant, an admin op) or unauthenticated (any other token). */
static void handleAsTenant(struct service *s, const Idem__Request *req, service_done_cb cb,
                           void *data)
{
    uint8_t h[32];
    bool hashed = service_token_hash(s, &req->auth_token, h);
    if (hashed && config_is_cluster_secret_hash(s->cfg, h)) {
        if (!service_data_op(req)) {
            s->stats.as_tenant_refused_op++;
        } else if (!routeTenant(s->cfg, req->as_tenant)) {
            s->stats.as_tenant_refused_tenant++;
            service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                           "as_tenant: no proxy route of this node names that tenant", NULL);
            return;
        }
        handleAs(s, req->as_tenant, req, cb, data);
        return;
    }
    s->stats.unauthenticated++;
    s->stats.as_tenant_refused_secret++;
    if (hashed && (config_tenant_by_token_hash(s->cfg, h) != NULL ||
                   config_is_admin_hash(s->cfg, h))) {
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                     "as_tenant needs the cluster secret", NULL);
        return;
    }
    service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                 s->cfg->rpc.cluster_secret.set ? "as_tenant needs the cluster secret"
                                                : "as_tenant needs the cluster secret, and this "
                                                  "node has none (rpc.cluster_secret_file)",
                 NULL);
}

static void handleRequest(struct service *s, const Idem__Request *req, service_done_cb cb,
                          void *data)
{
    s->stats.requests++;
    if (s->closing) {
        s->stats.unavailable++;
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "node shutting down", NULL);
        return;
    }
    if (req->as_tenant != NULL && req->as_tenant[0] != '\0') {
        handleAsTenant(s, req, cb, data);
        return;
    }
    if (service_data_op(req)) {
        handleData(s, req, cb, data);
        return;
    }
    switch (req->op_case) {
    case IDEM__REQUEST__OP_STATUS:
    case IDEM__REQUEST__OP_MEMBERS:
    case IDEM__REQUEST__OP_TRANSFER:
    case IDEM__REQUEST__OP_SNAPSHOT:
    case IDEM__REQUEST__OP_RESOLVE:
    case IDEM__REQUEST__OP_KEY_GET:
    case IDEM__REQUEST__OP_PURGE:
    case IDEM__REQUEST__OP_QUARANTINE_LIST:
    case IDEM__REQUEST__OP_RELOAD:
        service_admin_handle(s, req, cb, data);
        return;
    default:
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_INVALID, "unknown op",
                     NULL);
    }
}

void service_handle(struct service *s, const Idem__Request *req, const uint8_t *token_sha256,
                    service_done_cb cb, void *data)
{
    /* For this call only (a request handled within it, if any, has its own): restored. */
    struct service_given outer = s->given;
    memset(&s->given, 0, sizeof s->given);
    if (token_sha256 != NULL && req->auth_token.len > 0) {
        s->given.tok = req->auth_token.data;
        s->given.len = req->auth_token.len;
        memcpy(s->given.sha256, token_sha256, sizeof s->given.sha256);
    }
    handleRequest(s, req, cb, data);
    s->given = outer;
}

void service_handle_as(struct service *s, const char *tenant_name, const Idem__Request *req,
                       service_done_cb cb, void *data)
{
    s->stats.requests++;
    if (s->closing) {
        s->stats.unavailable++;
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "node shutting down", NULL);
        return;
    }
    handleAs(s, tenant_name, req, cb, data);
}

static void handleAs(struct service *s, const char *tenant_name, const Idem__Request *req,
                     service_done_cb cb, void *data)
{
    const struct config_tenant *t = config_tenant_by_name(s->cfg, tenant_name);
    if (!service_data_op(req)) {
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                     "only data ops on behalf of a tenant", NULL);
        return;
    }
    if (t == NULL) {
        s->stats.unauthenticated++;
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                     "unknown tenant", NULL);
        return;
    }
    handleDataAs(s, t, req, cb, data);
}
