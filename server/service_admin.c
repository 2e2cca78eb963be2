/* service_admin: the operators' requests (admin token): status and members, membership
 * changes and leadership transfers through the cluster, snapshots, and the record commands
 * (key get, purge, resolve, quarantine list) that go through the log like data requests
 * (service_requests.c), so that a stale node can answer none of them (docs/contract.md). */
#include "service_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "log.h"
#include "xmalloc.h"

#define QUARANTINE_LIST_DEFAULT 100u
#define QUARANTINE_LIST_MAX 1000u

/* A membership change or transfer the cluster answers later (its callback frees it). */
struct adminOp {
    struct service *s;
    service_done_cb cb;
    void *data;
    uint64_t request_id;
    char log_rid[LOG_RPC_ID_SIZE + 32]; /* the request in scope when it came (log.h), or "" */
};

/* Answers a quarantine list from this node's state machine. Called when the op's read
 * barrier applies on the node that proposed it, so the state holds every command committed
 * before the request arrived (docs/contract.md: never from a replica that may be stale).
 * Stored responses are left out: the listing names records, `key get` shows one. */
void service_answer_quarantine_list(struct service *s, struct op *o)
{
    uint32_t cap = o->limit;
    struct fsm_record_view *views = xcalloc(cap, sizeof(*views));
    size_t total = fsm_quarantined(s->fsm, o->tenant, o->lease_ended, o->now_ms, views, cap);
    size_t n = total < cap ? total : cap;
    Idem__AdminRecord *ars = xcalloc(n ? n : 1, sizeof(*ars));
    Idem__AdminRecord **arps = xcalloc(n ? n : 1, sizeof(*arps));
    Idem__Record *recs = xcalloc(n ? n : 1, sizeof(*recs));
    char(*digests)[FP_HEX12_SIZE] = xcalloc(n ? n : 1, sizeof(*digests));
    for (size_t i = 0; i < n; i++) {
        const struct fsm_record_view *v = &views[i];
        Idem__Record *rec = &recs[i];
        idem__record__init(rec);
        service_record_from_view(v, rec);
        key_digest(v->tenant, v->key, v->key_len, digests[i]);
        idem__admin_record__init(&ars[i]);
        ars[i].record = rec;
        ars[i].key_digest = digests[i];
        arps[i] = &ars[i];
    }
    Idem__Result res = IDEM__RESULT__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_OK;
    res.detail = "";
    Idem__Response resp = IDEM__RESPONSE__INIT;
    resp.request_id = o->request_id;
    resp.result = &res;
    resp.n_records = n;
    resp.records = arps;
    resp.more = total > n;
    o->cb(o->data, &resp);
    free(digests);
    free(recs);
    free(arps);
    free(ars);
    free(views);
}

static const char *roleName(int state)
{
    switch (state) {
    case RAFT_LEADER:
        return "leader";
    case RAFT_FOLLOWER:
        return "follower";
    case RAFT_CANDIDATE:
        return "candidate";
    default:
        return "unavailable";
    }
}

static const char *memberRole(int role)
{
    switch (role) {
    case RAFT_VOTER:
        return "voter";
    case RAFT_STANDBY:
        return "standby";
    case RAFT_SPARE:
        return "spare";
    default:
        return "unknown";
    }
}

/* Answers with the node's status and/or the member list. */
static void answerStatus(struct service *s, uint64_t request_id, bool with_status,
                         bool with_digest, service_done_cb cb, void *data)
{
    struct cluster_member ms[CLUSTER_MEMBERS_MAX];
    size_t n = cluster_members(s->cluster, ms, CLUSTER_MEMBERS_MAX);
    if (n > CLUSTER_MEMBERS_MAX) {
        n = CLUSTER_MEMBERS_MAX;
    }
    Idem__Member mem[CLUSTER_MEMBERS_MAX];
    Idem__Member *memp[CLUSTER_MEMBERS_MAX];
    for (size_t i = 0; i < n; i++) {
        idem__member__init(&mem[i]);
        mem[i].id = ms[i].id;
        mem[i].raft_address = ms[i].raft_address;
        mem[i].rpc_address = ms[i].rpc_address;
        mem[i].http_address = ms[i].http_address;
        mem[i].role = (char *)memberRole(ms[i].role);
        memp[i] = &mem[i];
    }
    Idem__NodeStatus st = IDEM__NODE_STATUS__INIT;
    char digest[33]; /* st.digest points here until cb returns */
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_OK;
    resp.request_id = request_id;
    resp.result = &res;
    resp.n_members = n;
    resp.members = memp;
    if (with_status) {
        struct cluster_status cs;
        struct fsm_stats fs;
        cluster_get_status(s->cluster, &cs);
        fsm_get_stats(s->fsm, &fs);
        st.id = s->cfg->node.id;
        st.role = (char *)roleName(cs.state);
        st.term = cs.term;
        st.leader_id = cs.leader_id;
        st.leader_rpc_address = (char *)cs.leader_rpc_address;
        st.commit_index = cs.commit_index;
        st.applied_index = cs.applied_index;
        st.last_snapshot_index = cs.last_snapshot_index;
        st.snapshot_threshold = cs.snapshot_threshold;
        st.snapshot_bytes = cs.snapshot_bytes_last;
        st.raft_authenticated = s->cfg->raft.secret.set;
        struct cluster_io_counters io;
        cluster_get_io_counters(&io);
        st.raft_connections_refused = io.connections_refused;
        st.raft_connect_auth_failures = io.connect_auth_failed;
        st.append_oldest_ms = cs.append_oldest_us / 1000u;
        st.records = fs.records - fs.released;
        st.processing = fs.processing;
        st.completed = fs.completed;
        st.quarantined = fs.quarantined;
        st.tombstones = fs.tombstones;
        st.bytes = fs.bytes;
        st.rpc_address = (char *)s->cfg->node.rpc_address.text;
        st.raft_address = (char *)s->cfg->node.raft_address.text;
        st.http_address = (char *)s->cfg->node.http_address.text;
        st.n_members = n;
        st.members = memp;
        st.version = IDEM_BUILD_VERSION;
        if (with_digest) {
            fsm_digest_hex(s->fsm, digest);
            st.digest = digest;
        }
        resp.status = &st;
    }
    cb(data, &resp);
}

static void adminChangeCb(void *data, int status, const char *errmsg)
{
    struct adminOp *a = data;
    service_answer(a->cb, a->data, a->request_id,
                 status == 0 ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                 errmsg, NULL);
    free(a);
}

/* A transfer's end. One that did not move leadership to a reachable voter (it did not win
 * its election in time: a node still catching up, say) may well succeed again: the answer
 * says so with retry_after_ms, an election timeout, which idemctl waits before it asks
 * again. A refusal up front (a voter not heard from) carries none. */
static void transferDoneCb(void *data, int status, const char *errmsg)
{
    struct adminOp *a = data;
    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response resp = IDEM__RESPONSE__INIT;
    res.outcome = status == 0 ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_UNAVAILABLE;
    if (status != 0) {
        res.retry_after_ms = a->s->cfg->raft.election_timeout_ms;
        log_at(LOG_LEVEL_WARN, a->log_rid[0] ? a->log_rid : NULL,
               "a leadership transfer ended without moving leadership (%s); the caller may "
               "ask again after %u ms",
               errmsg && errmsg[0] ? errmsg : "no reason given", (unsigned)res.retry_after_ms);
    }
    resp.request_id = a->request_id;
    resp.result = &res;
    resp.error = (char *)(errmsg ? errmsg : "");
    resp.leader_rpc_address = "";
    if (status == 0) {
        /* Leadership moved: this node knows the new leader (cluster_transfer). */
        const char *addr = NULL;
        resp.leader_id = cluster_leader(a->s->cluster, &addr);
    }
    a->cb(a->data, &resp);
    free(a);
}

static void answerClusterRc(struct service *s, int rc, uint64_t request_id, service_done_cb cb,
                            void *data)
{
    const char *leader = "";
    if (rc == CLUSTER_ENOTLEADER) {
        cluster_leader(s->cluster, &leader);
        service_answer(cb, data, request_id, leader[0] ? IDEM__OUTCOME__OUTCOME_NOT_LEADER
                                                     : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                     "not the leader", leader);
        return;
    }
    /* ESETTLING: nothing was started, and the same change may be sent again after a
     * heartbeat (idemctl does, within its deadline; libidem's idem_call retries any
     * unavailable answer with its own backoff). */
    service_answer_retry_after(
        cb, data, request_id,
        rc == CLUSTER_EINVAL ? IDEM__OUTCOME__OUTCOME_INVALID : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
        cluster_errmsg(s->cluster)[0] ? cluster_errmsg(s->cluster) : cluster_strerror(rc), NULL,
        rc == CLUSTER_ESETTLING ? s->cfg->raft.heartbeat_timeout_ms : 0);
}

/* Whether an operator's command may name this tenant: one in this node's configuration,
 * or one the replicated state knows (records of a tenant that left the configuration can
 * still be read, resolved and purged: a quarantined record never expires). A mistyped name
 * is neither, and is refused rather than answered not_found (or an empty quarantine list),
 * which would read as a record that is gone. */
static bool tenantKnown(const struct service *s, const char *name)
{
    for (size_t i = 0; i < s->cfg->n_tenants; i++) {
        if (strcmp(s->cfg->tenants[i].name, name) == 0) {
            return true;
        }
    }
    return fsm_tenant_known(s->fsm, name);
}

#define UNKNOWN_TENANT "unknown tenant: neither in this node's configuration nor in its records"

/* The tenant and key an operator names: a known tenant (tenantKnown), a key of docs/contract.md
 * §1's alphabet. Returns NULL or what is wrong (never quoting the key). */
static const char *adminTenantError(const struct service *s, const char *tenant)
{
    size_t tl = tenant ? strnlen(tenant, FSM_TENANT_MAX + 1) : 0;
    if (tl == 0 || tl > FSM_TENANT_MAX) {
        return "tenant missing or longer than 128 bytes";
    }
    return tenantKnown(s, tenant) ? NULL : UNKNOWN_TENANT;
}

static const char *adminKeyError(const struct service *s, const char *tenant,
                                 const ProtobufCBinaryData *key)
{
    const char *why = adminTenantError(s, tenant);
    return why != NULL ? why : service_key_error(key_validate(key->data, key->len, KEY_MAX_LEN));
}

/* key get, purge and quarantine list (admin token checked by the caller): each one goes
 * through the log, so a stale node can answer none of them (docs/contract.md). */
static void handleKeyAdmin(struct service *s, const Idem__Request *req, service_done_cb cb,
                           void *data)
{
    Idem__Command cmd = IDEM__COMMAND__INIT;
    Idem__GetCmd get = IDEM__GET_CMD__INIT;
    Idem__PurgeCmd purge = IDEM__PURGE_CMD__INIT;
    cmd.now_ms = service_now_ms();
    const char *why = NULL;
    switch (req->op_case) {
    case IDEM__REQUEST__OP_KEY_GET:
        why = adminKeyError(s, req->key_get->tenant, &req->key_get->key);
        if (why == NULL) {
            get.tenant = req->key_get->tenant;
            get.key = req->key_get->key;
            cmd.op_case = IDEM__COMMAND__OP_GET;
            cmd.get = &get;
            service_propose(s, &cmd, OP_KEY_GET, CLUSTER_ACCOUNT_NONE, req->request_id,
                      service_deadline_of(s, req), cb, data);
            return;
        }
        break;
    case IDEM__REQUEST__OP_PURGE:
        why = adminKeyError(s, req->purge->tenant, &req->purge->key);
        if (why == NULL) {
            purge.tenant = req->purge->tenant;
            purge.key = req->purge->key;
            cmd.op_case = IDEM__COMMAND__OP_PURGE;
            cmd.purge = &purge;
            service_propose_client(s, &cmd, req->request_id, service_deadline_of(s, req), cb, data);
            return;
        }
        break;
    case IDEM__REQUEST__OP_QUARANTINE_LIST: {
        const Idem__QuarantineListRequest *q = req->quarantine_list;
        const char *tenant = q->tenant != NULL && q->tenant[0] != '\0' ? q->tenant : NULL;
        if (tenant != NULL && strnlen(tenant, FSM_TENANT_MAX + 1) > FSM_TENANT_MAX) {
            why = "tenant longer than 128 bytes";
            break;
        }
        if (tenant != NULL && !tenantKnown(s, tenant)) {
            why = UNKNOWN_TENANT;
            break;
        }
        if (q->limit > QUARANTINE_LIST_MAX) {
            why = "limit out of range 1-1000";
            break;
        }
        /* The barrier: a command with the leader's clock and no op (fsm.h). */
        struct op *o = service_propose(s, &cmd, OP_QUARANTINE_LIST, CLUSTER_ACCOUNT_NONE, req->request_id,
                                 service_deadline_of(s, req), cb, data);
        if (o != NULL) {
            o->tenant = tenant != NULL ? xstrndup(tenant, strlen(tenant)) : NULL;
            o->limit = q->limit ? q->limit : QUARANTINE_LIST_DEFAULT;
            o->lease_ended = q->lease_ended;
            o->now_ms = cmd.now_ms; /* the barrier's clock: lease_ended goes by it */
        }
        return;
    }
    default:
        why = "unknown op";
        break;
    }
    service_answer_invalid(cb, data, req->request_id, why);
}

/* Whether the request carries the admin token; answers it forbidden or unauthenticated
 * when not. */
static bool adminAuthorized(struct service *s, const Idem__Request *req, service_done_cb cb,
                            void *data)
{
    if (service_auth_admin(s, &req->auth_token)) {
        return true;
    }
    /* A tenant's own token is known but not allowed here: forbidden (403), not
     * unauthenticated (401), as docs/contract.md tells them apart. */
    if (service_auth_tenant(s, &req->auth_token) != NULL) {
        service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_FORBIDDEN,
                       "admin operations need the admin token, not a tenant's", NULL);
        return false;
    }
    s->stats.unauthenticated++;
    service_answer(cb, data, req->request_id, IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED,
                   "admin operations need the admin token", NULL);
    return false;
}

/* resolve: settles a record as an operator says, through the log. */
static void adminResolve(struct service *s, const Idem__Request *req, service_done_cb cb,
                         void *data)
{
    const Idem__ResolveRequest *r = req->resolve;
    const char *why = NULL;
    if (r->response != NULL && !fsm_response_check(r->response, &why)) {
        service_answer_invalid(cb, data, req->request_id, why);
        return;
    }
    Idem__ResolveCmd rc_cmd = IDEM__RESOLVE_CMD__INIT;
    rc_cmd.tenant = r->tenant;
    rc_cmd.key = r->key;
    rc_cmd.release = r->release;
    rc_cmd.response = r->response;
    rc_cmd.unsettled_only = true;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = service_now_ms();
    cmd.op_case = IDEM__COMMAND__OP_RESOLVE;
    cmd.resolve = &rc_cmd;
    /* As key get and purge check theirs: a bad tenant or key is refused here, not
     * written to the log for the state machine to refuse. */
    const char *bad = adminTenantError(s, r->tenant);
    if (bad == NULL) {
        int krc = KEY_OK;
        bad = fsm_command_check(&cmd, KEY_MAX_LEN, &krc);
        bad = krc != KEY_OK ? service_key_error(krc) : bad;
    }
    if (bad != NULL) {
        service_answer_invalid(cb, data, req->request_id, bad);
        return;
    }
    service_propose_client(s, &cmd, req->request_id, service_deadline_of(s, req), cb, data);
}

/* members add: each address as a node's configuration takes it (config_addr_parse: an IPv4
 * address, an IPv6 one in brackets or a host name, a port without leading zeros), and none
 * is cut short to fit. The cluster is given their canonical texts (canonicalText), so that it
 * can compare them as text. The RPC has other clients than idemctl. Returns 0, or -1 with
 * what is wrong in msg. */
static int membersAddCheck(const Idem__MembersRequest *m, char *msg, size_t msg_len)
{
    const char *given[3] = {m->raft_address, m->rpc_address, m->http_address};
    static const char *const names[3] = {"raft", "rpc", "http"};
    for (unsigned i = 0; i < 3; i++) {
        struct config_addr ca;
        char why[256];
        if (i == 2 && given[i][0] == '\0') {
            continue; /* the HTTP address is optional */
        }
        if (config_addr_parse(given[i], &ca, why, sizeof why) != 0) {
            snprintf(msg, msg_len, "%s address: %s", names[i], why);
            return -1;
        }
    }
    return 0;
}

/* The canonical text of an address membersAddCheck() took ("" stays ""), into out. */
static void canonicalText(char *out, size_t len, const char *given)
{
    struct config_addr ca;
    char why[256];
    snprintf(out, len, "%s", config_addr_parse(given, &ca, why, sizeof why) == 0 ? ca.text : given);
}

/* Starts a membership change (members add, promote, remove) or a leadership transfer, whose
 * callback answers a; a CLUSTER_* code when none started. */
static int adminStartChange(struct service *s, const Idem__Request *req, struct adminOp *a)
{
    if (req->op_case == IDEM__REQUEST__OP_TRANSFER) {
        return cluster_transfer(s->cluster, req->transfer->id, transferDoneCb, a);
    }
    const Idem__MembersRequest *m = req->members;
    struct cluster_member cm;
    memset(&cm, 0, sizeof(cm));
    cm.id = m->id;
    switch (m->action) {
    case IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD:
        canonicalText(cm.raft_address, sizeof(cm.raft_address), m->raft_address);
        canonicalText(cm.rpc_address, sizeof(cm.rpc_address), m->rpc_address);
        canonicalText(cm.http_address, sizeof(cm.http_address), m->http_address);
        return cluster_member_add(s->cluster, &cm, adminChangeCb, a);
    case IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE:
        return cluster_member_promote(s->cluster, m->id, adminChangeCb, a);
    case IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE:
        return cluster_member_remove(s->cluster, m->id, adminChangeCb, a);
    default:
        return CLUSTER_EINVAL;
    }
}

/* members (list, add, promote, remove) and transfer. */
static void adminMembership(struct service *s, const Idem__Request *req, service_done_cb cb,
                            void *data)
{
    if (req->op_case == IDEM__REQUEST__OP_MEMBERS &&
        req->members->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST) {
        answerStatus(s, req->request_id, false, false, cb, data);
        return;
    }
    /* Node IDs are 1..INT64_MAX, as in the configuration: the IDs a JSON integer carries
     * exactly (transfer's 0 means "any"). */
    uint64_t id = req->op_case == IDEM__REQUEST__OP_TRANSFER ? req->transfer->id : req->members->id;
    if (id > (uint64_t)INT64_MAX) {
        service_answer_invalid(cb, data, req->request_id,
                               "node id out of range (1..9223372036854775807)");
        return;
    }
    char msg[300];
    if (req->op_case == IDEM__REQUEST__OP_MEMBERS &&
        req->members->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD &&
        membersAddCheck(req->members, msg, sizeof msg) != 0) {
        service_answer_invalid(cb, data, req->request_id, msg);
        return;
    }
    struct adminOp *a = xcalloc(1, sizeof(*a));
    a->s = s;
    a->cb = cb;
    a->data = data;
    a->request_id = req->request_id;
    if (log_request_current() != NULL) {
        snprintf(a->log_rid, sizeof a->log_rid, "%s", log_request_current());
    }
    int rc = adminStartChange(s, req, a);
    if (rc != CLUSTER_OK) {
        free(a);
        answerClusterRc(s, rc, req->request_id, cb, data);
    }
}

/* A reload's caller, answered when the reload ends (reloadDone). */
struct reloadCall {
    service_done_cb cb;
    void *data;
    uint64_t request_id;
};

static void reloadDone(void *data, int rc, const char *err)
{
    struct reloadCall *k = data;
    service_answer(k->cb, k->data, k->request_id,
                   rc == 0 ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_INVALID, err, NULL);
    free(k);
}

/* reload: this node reads its configuration file again (server/reload.c), as on SIGHUP;
 * answered when that ended (the file is read off the loop). */
static void adminReload(struct service *s, const Idem__Request *req, service_done_cb cb, void *data)
{
    if (s->reload == NULL) {
        service_answer_invalid(cb, data, req->request_id, "this node cannot reload");
        return;
    }
    struct reloadCall *k = xcalloc(1, sizeof(*k));
    k->cb = cb;
    k->data = data;
    k->request_id = req->request_id;
    s->reload(s->reload_data, reloadDone, k);
}

void service_admin_handle(struct service *s, const Idem__Request *req, service_done_cb cb,
                          void *data)
{
    if (!adminAuthorized(s, req, cb, data)) {
        return;
    }
    switch (req->op_case) {
    case IDEM__REQUEST__OP_STATUS:
        answerStatus(s, req->request_id, true, req->status->digest, cb, data);
        return;
    case IDEM__REQUEST__OP_SNAPSHOT: {
        int rc = cluster_snapshot_now(s->cluster);
        service_answer(cb, data, req->request_id,
                       rc == CLUSTER_OK ? IDEM__OUTCOME__OUTCOME_OK
                                        : IDEM__OUTCOME__OUTCOME_UNAVAILABLE,
                       rc == CLUSTER_OK ? "snapshot scheduled at the next applied entry"
                                        : cluster_strerror(rc),
                       NULL);
        return;
    }
    case IDEM__REQUEST__OP_RESOLVE:
        adminResolve(s, req, cb, data);
        return;
    case IDEM__REQUEST__OP_KEY_GET:
    case IDEM__REQUEST__OP_PURGE:
    case IDEM__REQUEST__OP_QUARANTINE_LIST:
        handleKeyAdmin(s, req, cb, data);
        return;
    case IDEM__REQUEST__OP_MEMBERS:
    case IDEM__REQUEST__OP_TRANSFER:
        adminMembership(s, req, cb, data);
        return;
    case IDEM__REQUEST__OP_RELOAD:
        adminReload(s, req, cb, data);
        return;
    default:
        service_answer_invalid(cb, data, req->request_id, "unknown op");
        return;
    }
}
