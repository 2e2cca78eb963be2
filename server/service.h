/* service: the one place where a request becomes a decision. Front ends (the binary RPC
 * today, the HTTP gateway later) hand it a decoded Idem__Request; it authenticates,
 * validates, stamps the leader's clock, proposes the command through the cluster and
 * answers with an Idem__Response once the command was applied here, or with unavailable
 * when it cannot be (no leader, leadership lost, deadline passed). It also owns the state
 * machine the cluster applies to, and the leader's expiry ticker. */
#ifndef IDEM_SERVER_SERVICE_H
#define IDEM_SERVER_SERVICE_H

#include <stdint.h>
#include <uv.h>

#include "cluster.h"
#include "config.h"
#include "fsm.h"
#include "idem.pb-c.h"
#include "rpc_admit.h"

struct service;

/* Called exactly once per service_handle() call, possibly before it returns. `resp` is
 * borrowed for the duration of the call. */
typedef void (*service_done_cb)(void *data, const Idem__Response *resp);

/* Creates the service, its state machine and its Raft group on `loop`. `cfg` is borrowed
 * and must outlive the service. Returns NULL with a message in err on failure. */
struct service *service_new(uv_loop_t *loop, const struct config *cfg, char *err,
                            size_t errlen);

/* A configuration reload (server/reload.c): the service reads `cfg` from now on (borrowed
 * as in service_new; the caller keeps the one before alive until the end of the loop turn).
 * Tenants, tokens, quotas and the proxy routes' tenants come from it; the settings that
 * change only with a restart are the running ones (config_reload_merge). A tenant keeps its
 * account in the cluster's admission (by name); a new one gets one. */
void service_set_config(struct service *s, const struct config *cfg);

/* A configuration reload's Raft TLS, in two steps (server/reload.c: no part of the node
 * switches before every part has loaded its files). service_load_tls: with tls.raft, the
 * new contexts of tls's files (borrowed for the call) for the Raft listener and connector
 * into *server and *client (cluster_tls_load; both NULL without tls.raft); 0, or -1 with
 * the reason in err ("FILE:LINE:COLUMN: tls: ... (tls.raft)") and both NULL.
 * service_set_tls: the Raft connections made from now on use them, as service_load_tls made
 * them (taken; cluster_tls_set); those that run keep their sessions. */
struct idem_tls_ctx;
int service_load_tls(const struct config_tls *tls, struct idem_tls_ctx **server,
                     struct idem_tls_ctx **client, char *err, size_t errlen);
void service_set_tls(struct service *s, struct idem_tls_ctx *server, struct idem_tls_ctx *client);

/* What the admin op `reload` (idemctl reload) calls, on the loop, with the admin token
 * checked: the reload then calls done(done_data, rc, err) on the loop once it ended (at once
 * or later), rc 0 or -1 with the reason in err. */
typedef void (*service_reload_done)(void *data, int rc, const char *err);
typedef void (*service_reload_fn)(void *data, service_reload_done done, void *done_data);
void service_set_reload(struct service *s, service_reload_fn fn, void *data);

/* Called on the loop each time this node learns which node leads (not when it knows none),
 * from within the cluster's callbacks: it may read the service (service_leader_rpc) but
 * must not hand it requests or answer any. fn NULL clears it. */
typedef void (*service_leader_fn)(void *data);
void service_set_leader_cb(struct service *s, service_leader_fn fn, void *data);

/* The lease policy a claim of tenant t asks for: its own, or the tenant's default. */
Idem__LeasePolicy service_claim_policy(const struct config_tenant *t, Idem__LeasePolicy asked);

/* The RPC address of the node that leads, this node's own when it does; NULL when no leader
 * is known (or its address is not). Valid until the next loop turn. */
const char *service_leader_rpc(const struct service *s);

/* Starts Raft and the expiry ticker. 0 or -1 with a message in err. */
int service_start(struct service *s, char *err, size_t errlen);

/* Handles one request. `req` is borrowed for the duration of the call only. A request with
 * as_tenant set is handled as service_handle_as(as_tenant) when its auth_token is the
 * cluster secret (rpc.cluster_secret_file; SHA-256 compared in constant time), and refused
 * otherwise: forbidden for a tenant's or the admin's token, unauthenticated for any other
 * (or when the node has no secret). token_sha256, when not NULL, is the SHA-256 of
 * req->auth_token's bytes, which the caller already took (the RPC listener keeps it with a
 * connection's last token): the request is authorised with it instead of a new digest. */
void service_handle(struct service *s, const Idem__Request *req, const uint8_t *token_sha256,
                    service_done_cb cb, void *data);

/* Handles one data op (claim, complete, release, renew, get) on behalf of the configured
 * tenant `tenant_name`, authorised by the node's configuration (a proxy route), not by a
 * bearer token: req->auth_token is ignored. Admin ops are answered forbidden; an unknown
 * tenant unauthenticated. Otherwise as service_handle(): cb is called exactly once, possibly
 * before this returns; tenant_name and req are borrowed for the call. A follower answers
 * not_leader (the caller decides what to do: proxy mode forwards to the leader with
 * Request.as_tenant and the cluster secret, or answers 503 without a secret). */
void service_handle_as(struct service *s, const char *tenant_name, const Idem__Request *req,
                       service_done_cb cb, void *data);

/* The field number of Result.response (proto/idem.proto): a local answer's replay carries
 * its stored response there as the packed bytes the table holds (service_new checks the
 * number against the descriptor). */
#define SERVICE_RESULT_RESPONSE_FIELD 8

/* The stored response of a replay result `res` (borrowed): res->response when it was
 * decoded (an answer that came over the RPC), else the bytes a local answer carries (see
 * above), decoded now into *owned, which the caller frees with
 * idem__stored_response__free_unpacked (NULL when nothing was decoded). NULL when there is
 * none, or when the bytes do not decode. */
const Idem__StoredResponse *service_stored_response(const Idem__Result *res,
                                                   Idem__StoredResponse **owned);

/* The leader's RPC address when another node leads and its address is known, else NULL
 * (this node leads, or no leader is known: the service answers those requests itself). A
 * front end that forwards sends a request there at once instead of asking the service for
 * a not_leader answer first. Borrowed until the next loop turn. */
const char *service_leader_elsewhere(const struct service *s);

/* Before a planned stop: when this node leads, hands leadership to the most up-to-date
 * other voter heard from within an election timeout (cluster_transfer), so the cluster does
 * not wait an election timeout for a new leader. Returns 0 when a handoff started, and
 * cb(data, moved_to) then runs once it ended (moved_to: the new leader's id, 0 when
 * leadership did not move; libraft gives up after an election timeout); nonzero when none
 * started (not the leader, no other voter heard from), and cb never runs. The node keeps
 * serving meanwhile: proposals wait or are refused for the transfer's length, then go to
 * the new leader. */
int service_hand_off(struct service *s, void (*cb)(void *data, uint64_t moved_to), void *data);

/* Stops: every request still waiting is answered unavailable, then Raft closes; cb(data)
 * runs once everything is freed. */
void service_close(struct service *s, void (*cb)(void *data), void *data);

/* Counters for logs and metrics. */
struct service_stats {
    uint64_t requests;
    uint64_t unavailable;  /* fail-closed refusals */
    uint64_t not_leader;
    uint64_t unauthenticated;
    /* RPC requests with as_tenant refused: their token was not the cluster secret, the
     * tenant is one no proxy route of this node names, the op is not a data op. */
    uint64_t as_tenant_refused_secret;
    uint64_t as_tenant_refused_tenant;
    uint64_t as_tenant_refused_op;
};
void service_get_stats(const struct service *s, struct service_stats *out);

/* The tenant that owns a bearer token (its SHA-256 compared in constant time, as for every
 * request), or NULL for an empty or unknown token. `token` is borrowed for the call; the
 * result borrows the service's config: valid until the end of the loop turn (a reload may
 * replace the config). */
const struct config_tenant *service_tenant_for_token(const struct service *s,
                                                     const uint8_t *token, size_t len);

/* Whether a bearer token is the admin token (compared as service_tenant_for_token does): a
 * known credential that data ops refuse as forbidden (403), not unauthenticated (401).
 * `token` is borrowed for the call. */
bool service_token_is_admin(const struct service *s, const uint8_t *token, size_t len);

/* What a bearer token is (service_credential_of). */
enum service_credential {
    SERVICE_CREDENTIAL_NONE,    /* empty or unknown */
    SERVICE_CREDENTIAL_TENANT,  /* a tenant's token */
    SERVICE_CREDENTIAL_ADMIN,   /* the admin token */
    SERVICE_CREDENTIAL_CLUSTER, /* the cluster secret (rpc.cluster_secret_file) */
};

/* Whether a bearer token is one the node knows, and whose: its SHA-256 compared in
 * constant time as for every request. The RPC listener asks before it decodes a frame
 * (server/rpc.c); the request is then authorised by service_handle() as any. `token` is
 * borrowed for the call. Whenever the answer is not SERVICE_CREDENTIAL_NONE, the token's
 * SHA-256 is in sha256 (32 bytes). */
enum service_credential service_credential_of(const struct service *s, const uint8_t *token,
                                              size_t len, uint8_t *sha256);

/* The addresses of the cluster's members (rpc_admit.h's form): the hosts of their Raft, RPC
 * and HTTP addresses in the current configuration, in cluster.bootstrap and this node's own
 * (wildcards left out). A host name counts with the addresses it last resolved to, and is
 * looked up again (off the loop) once that answer is SERVICE_MEMBER_RESOLVE_MS old; until
 * its first answer it counts with none (its connections are a client's, or a member's once
 * they send the cluster secret). Fills up to `cap` entries of out (OUT), maybe the same
 * address more than once; returns how many. */
#define SERVICE_MEMBER_RESOLVE_MS 30000
size_t service_member_addrs(const struct service *s, struct rpc_admit_addr *out, size_t cap);

/* Raft and state machine figures for health checks and metrics (OUT). The cluster status's
 * leader_rpc_address borrows the cluster's memory until the next loop turn. */
struct service_info {
    struct cluster_status cluster;
    struct fsm_stats fsm;
};
void service_get_info(const struct service *s, struct service_info *out);

/* Tenant i's (config.tenants) commands this leader proposed and has not applied, in bytes as
 * batch.max_pending_mb counts them, those of them it holds back (batch.tenant_max_inflight_kb)
 * and its commands refused for its share of them (batch.tenant_max_pending_percent) since
 * the start (OUT, any may be NULL). */
void service_tenant_pending(const struct service *s, size_t i, uint64_t *pending, uint64_t *queued,
                            uint64_t *refused);

/* The records and bytes the tenant `name` (borrowed) holds against its quotas, in this
 * node's state machine (fsm_tenant_usage; OUT). */
void service_tenant_usage(const struct service *s, const char *name, uint64_t *records,
                          uint64_t *bytes);

/* Whether req is a data op (claim, complete, release, renew, get), as opposed to an admin op. */
static inline bool service_data_op(const Idem__Request *req)
{
    switch (req->op_case) {
    case IDEM__REQUEST__OP_CLAIM:
    case IDEM__REQUEST__OP_COMPLETE:
    case IDEM__REQUEST__OP_RELEASE:
    case IDEM__REQUEST__OP_RENEW:
    case IDEM__REQUEST__OP_GET:
        return true;
    default:
        return false;
    }
}

#endif
