/* service_internal: what service.c (ops, answers, the cluster's callbacks, lifecycle),
 * service_requests.c (authentication, data requests) and service_admin.c (operators'
 * requests, status) share; nothing else includes it. */
#ifndef IDEM_SERVER_SERVICE_INTERNAL_H
#define IDEM_SERVER_SERVICE_INTERNAL_H

#include <openssl/evp.h>
#include <sys/queue.h>

#include "deadlines.h"
#include "service.h"
#include "tokhash.h"

/* OP_CLIENT answers with the command's result; OP_KEY_GET with the record as an operator
 * sees it (AdminRecord); OP_QUARANTINE_LIST is a read barrier (an op-less command, which
 * every replica applies as a no-op, fsm.h) whose answer is read from this node's state
 * machine when the barrier applies here; OP_EXPIRE is the leader's ticker. */
enum opKind { OP_CLIENT, OP_EXPIRE, OP_KEY_GET, OP_QUARANTINE_LIST };

struct op {
    struct service *s;
    enum opKind kind;
    service_done_cb cb;
    void *data;
    uint64_t request_id;
    struct deadline deadline; /* in service.deadlines while its answer is owed by a time */
    bool answered;   /* cb was called */
    bool in_cluster; /* the cluster holds this op as a waiter */
    char *tenant;   /* OP_QUARANTINE_LIST: owned; NULL for every tenant */
    uint32_t limit; /* OP_QUARANTINE_LIST */
    bool lease_ended;  /* OP_QUARANTINE_LIST: processing records whose lease ended instead */
    uint64_t lease_ms; /* claim, renew: the lease asked for */
    uint64_t now_ms;   /* claim, renew: the command's clock (Result.lease_ms: the lease left);
                          quarantine list: its barrier's (lease_ended goes by it) */
    LIST_ENTRY(op) link; /* in service.ops */
};

struct service {
    uv_loop_t *loop;
    struct tokhash *tokhash; /* tokens' digests, per request (service_token_hash) */
    /* The digest service_handle's caller gave for the request's auth_token, for the call's
     * length (tok NULL: none): service_token_hash answers with it for those bytes. */
    struct service_given {
        const uint8_t *tok;
        size_t len;
        uint8_t sha256[32];
    } given;
    const struct config *cfg; /* the current one (service_set_config) */
    /* The cluster's accounts (batch.tenant_max_pending_percent) by tenant name, so that a
     * tenant keeps its account across reloads: acct_of[i] is cfg->tenants[i]'s, and
     * acct_names[a] the tenant account a was made for (n_accts of them, never fewer). */
    uint32_t *acct_of;
    char (*acct_names)[CONFIG_TENANT_NAME_MAX + 1];
    uint32_t n_accts;
    service_reload_fn reload; /* `idemctl reload`; NULL: not offered */
    service_leader_fn leader_cb; /* service_set_leader_cb; NULL: none */
    void *leader_data;
    void *reload_data;
    struct fsm *fsm;
    struct cluster *cluster;
    struct idem_resolver *resolver; /* members' host names (the cluster's and rpc.c's) */
    uv_timer_t expiry_timer;
    /* The proposed ops' deadlines (uv_now() times): one timer, armed for the earliest (or
     * earlier: a deadline removed leaves it armed, and it re-arms when it fires). */
    struct deadlines deadlines;
    uv_timer_t deadline_timer;
    bool deadline_armed;
    uint64_t deadline_armed_at;
    bool deadline_timer_closed;
    bool expire_in_flight;
    LIST_HEAD(, op) ops; /* live ops, for shutdown */
    struct service_stats stats;
    bool closing;
    bool timer_closed;
    bool cluster_closed;
    void (*close_cb)(void *data);
    void *close_data;
};

/* What a leader refusing a request for load (batch.max_pending_mb, a tenant's share of it)
 * or during a leadership transfer says to wait before sending it again
 * (Result.retry_after_ms): about a log write's time. */
#define SERVICE_BUSY_RETRY_MS 10

/* ---- service.c ---- */

/* The leader's clock: wall time in ms, what every command carries as now_ms. */
uint64_t service_now_ms(void);

/* Answers cb with `outcome`, `error` (NULL: none) and the leader's RPC address (NULL: none),
 * and Result.retry_after_ms: the caller may send it again after that long (0: no hint). */
void service_answer_retry_after(service_done_cb cb, void *data, uint64_t request_id,
                                Idem__Outcome outcome, const char *error, const char *leader,
                                uint64_t retry_after_ms);
/* service_answer_retry_after() without a retry time. */
void service_answer(service_done_cb cb, void *data, uint64_t request_id, Idem__Outcome outcome,
                    const char *error, const char *leader);
/* Answers invalid, saying why (a static string, never key bytes). */
void service_answer_invalid(service_done_cb cb, void *data, uint64_t request_id,
                            const char *why);

/* Fills rec's fields (all but the stored response) from a record view; rec borrows v's
 * memory. */
void service_record_from_view(const struct fsm_record_view *v, Idem__Record *rec);

/* Proposes a packed command for a client, answered as `kind` says, on the tenant's account
 * (CLUSTER_ACCOUNT_NONE for none). On any refusal, answers at once and returns NULL;
 * otherwise returns the op (the cluster holds it). */
struct op *service_propose(struct service *s, const Idem__Command *cmd, enum opKind kind,
                           uint32_t account, uint64_t request_id, uint32_t deadline_ms,
                           service_done_cb cb, void *data);
/* service_propose() of an OP_CLIENT on no account. */
void service_propose_client(struct service *s, const Idem__Command *cmd, uint64_t request_id,
                            uint32_t deadline_ms, service_done_cb cb, void *data);

/* ---- service_requests.c ---- */

/* The cluster account of tenant t (one of s->cfg's tenants). */
uint32_t service_account_of(const struct service *s, const struct config_tenant *t);

/* SHA-256 of a bearer token into h (OUT); false for an empty token. */
bool service_token_hash(const struct service *s, const ProtobufCBinaryData *tok, uint8_t h[32]);
/* The tenant whose token `tok` is, or NULL. */
const struct config_tenant *service_auth_tenant(const struct service *s,
                                                const ProtobufCBinaryData *tok);
/* Whether `tok` is the admin token. */
bool service_auth_admin(const struct service *s, const ProtobufCBinaryData *tok);
/* The request's deadline: its own, or the configured default, at most the maximum. */
uint32_t service_deadline_of(const struct service *s, const Idem__Request *req);
/* What to answer for a key_validate() result (key.h): NULL for KEY_OK. */
const char *service_key_error(int key_rc);

/* ---- service_admin.c ---- */

/* An admin op (status, members, transfer, snapshot, resolve, key get, purge, quarantine
 * list): checks the admin token and answers or proposes. */
void service_admin_handle(struct service *s, const Idem__Request *req, service_done_cb cb,
                          void *data);
/* Answers a quarantine list op from this node's state machine, when its read barrier
 * applies here. */
void service_answer_quarantine_list(struct service *s, struct op *o);

#endif
