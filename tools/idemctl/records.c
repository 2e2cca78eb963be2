/* records: the admin commands on records of any tenant: key get|resolve|purge (and the
 * older `resolve KEY --tenant NAME`) and quarantine list. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "idemctl.h"

#define TENANT_MAX 128                /* bytes of tenant name (server/fsm.h) */
#define QUARANTINE_DEFAULT_LIMIT 100u /* quarantine list --limit (the server's default) */
#define QUARANTINE_MAX_LIMIT 1000u    /* the server's ceiling */

/* Sends an operator's change of a record (resolve, purge) once, to the leader that status
 * finds, as leaderCall() sends a membership change: neither is safe to send again behind
 * the operator's back. Sent again after an attempt's timeout, one that had been applied
 * meanwhile would be answered as the repeat, not as what was done (a purge not_found, a
 * resolve invalid), and a purge would delete what a client claimed in between. Without an
 * answer, the change may or may not have been made: `key get` tells. */
static int onceToLeader(const struct global *g, const char *what, const Idem__Request *req,
                        Idem__Response **resp)
{
    uint64_t leader_id = 0;
    return leaderCall(g, what, 0, req, resp, &leader_id, NULL);
}

/* Sends a resolve of (tenant, key): --release, or a final response from --status/--body
 * (all borrowed). `cmd` names the command in usage errors. */
static int resolveCall(struct global *g, const char *cmd, const char *tenant, const char *key,
                       bool release, const char *status, const char *body)
{
    if (release == (status != NULL)) {
        cli_usage_error("%s: give exactly one of --release and --status CODE", cmd);
    }
    if (release && body != NULL) {
        cli_usage_error("%s: --body goes with --status, not --release", cmd);
    }
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__ResolveRequest rr = IDEM__RESOLVE_REQUEST__INIT;
    rr.tenant = (char *)tenant;
    rr.key.data = (uint8_t *)key;
    rr.key.len = strlen(key);
    rr.release = release;
    if (!release) {
        dataStoredResponseFill(&sr, cmd, status, body);
        rr.response = &sr;
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RESOLVE;
    req.resolve = &rr;
    Idem__Response *resp = NULL;
    int code = onceToLeader(g, "key resolve", &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    outEmit(g, jResult(resp));
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* A TENANT operand or --tenant value: 1-TENANT_MAX bytes, or a usage error. */
static void requireTenant(const char *cmd, const char *tenant)
{
    if (tenant == NULL) {
        cli_usage_error("%s: missing TENANT", cmd);
    }
    if (tenant[0] == '\0' || strlen(tenant) > TENANT_MAX) {
        cli_usage_error("%s: TENANT must be 1-%d bytes", cmd, TENANT_MAX);
    }
}

/* resolve KEY --tenant NAME ...: the older spelling of `key resolve NAME KEY ...`. */
int recordsCmdResolve(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *tenant = NULL, *status = NULL, *body = NULL;
    bool release = false;
    const struct argsOpt opts[] = {{"--tenant", &tenant, NULL},
                                   {"--status", &status, NULL},
                                   {"--body", &body, NULL},
                                   {"--release", NULL, &release}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 1, &npos);
    argsRequireKey("resolve", npos ? pos[0] : NULL);
    if (tenant == NULL || tenant[0] == '\0') {
        cli_usage_error("resolve: missing --tenant NAME");
    }
    requireTenant("resolve --tenant", tenant);
    return resolveCall(g, "resolve", tenant, pos[0], release, status, body);
}

/* key get (purge false) or key purge of (tenant, key), on the leader: the outcome, and the
 * record (its key and body only with `reveal`) or the purged record's token. */
static int keyGetOrPurge(struct global *g, bool purge, const char *tenant, const char *key,
                         bool reveal)
{
    Idem__KeyGetRequest kg = IDEM__KEY_GET_REQUEST__INIT;
    Idem__PurgeRequest pr = IDEM__PURGE_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    if (purge) {
        pr.tenant = (char *)tenant;
        pr.key.data = (uint8_t *)key;
        pr.key.len = strlen(key);
        req.op_case = IDEM__REQUEST__OP_PURGE;
        req.purge = &pr;
    } else {
        kg.tenant = (char *)tenant;
        kg.key.data = (uint8_t *)key;
        kg.key.len = strlen(key);
        req.op_case = IDEM__REQUEST__OP_KEY_GET;
        req.key_get = &kg;
    }
    Idem__Response *resp = NULL;
    int code = purge ? onceToLeader(g, "key purge", &req, &resp)
                     : callSend(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = jOutcome(resp);
    if (purge && idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_OK && resp->result != NULL) {
        jset(o, "purged_token", ju64(resp->result->token));
    }
    if (!purge && resp->n_records > 0 && resp->records[0] != NULL) {
        json_t *rec = jAdminRecord(resp->records[0], reveal, true);
        json_object_update(o, rec);
        json_decref(rec);
    }
    outEmit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* key get|resolve|purge TENANT KEY [options] */
int recordsCmdKey(struct global *g, struct args *a)
{
    const char *pos[3];
    size_t npos = 0;
    const char *status = NULL, *body = NULL;
    bool release = false, reveal = false;
    const struct argsOpt opts[] = {{"--status", &status, NULL},
                                   {"--body", &body, NULL},
                                   {"--release", NULL, &release},
                                   {"--reveal", NULL, &reveal}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 3, &npos);
    if (npos == 0) {
        cli_usage_error("key: missing subcommand (get, resolve or purge)");
    }
    const char *sub = pos[0];
    char cmd[32];
    snprintf(cmd, sizeof cmd, "key %s", sub);
    bool is_get = strcmp(sub, "get") == 0, is_resolve = strcmp(sub, "resolve") == 0,
         is_purge = strcmp(sub, "purge") == 0;
    if (!is_get && !is_resolve && !is_purge) {
        cli_usage_error("key: unknown subcommand \"%s\" (get, resolve or purge)", sub);
    }
    requireTenant(cmd, npos > 1 ? pos[1] : NULL);
    argsRequireKey(cmd, npos > 2 ? pos[2] : NULL);
    if (reveal && !is_get) {
        cli_usage_error("%s: --reveal goes with key get", cmd);
    }
    if (!is_resolve && (release || status != NULL || body != NULL)) {
        cli_usage_error("%s: --release, --status and --body go with key resolve", cmd);
    }
    if (is_get || is_purge) {
        return keyGetOrPurge(g, is_purge, pos[1], pos[2], reveal);
    }
    return resolveCall(g, cmd, pos[1], pos[2], release, status, body);
}

/* quarantine [list] [--tenant T] [--limit N] [--reveal] [--lease-ended] */
int recordsCmdQuarantine(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *tenant = NULL, *limit = NULL;
    bool reveal = false, lease_ended = false;
    const struct argsOpt opts[] = {{"--tenant", &tenant, NULL},
                                   {"--limit", &limit, NULL},
                                   {"--reveal", NULL, &reveal},
                                   {"--lease-ended", NULL, &lease_ended}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 1, &npos);
    if (npos > 0 && strcmp(pos[0], "list") != 0) {
        cli_usage_error("quarantine: unknown subcommand \"%s\" (list)", pos[0]);
    }
    if (tenant != NULL) {
        requireTenant("quarantine list --tenant", tenant);
    }
    Idem__QuarantineListRequest ql = IDEM__QUARANTINE_LIST_REQUEST__INIT;
    ql.tenant = (char *)(tenant ? tenant : "");
    ql.limit = limit ? (uint32_t)cli_parse_u64("--limit", limit, 1, QUARANTINE_MAX_LIMIT)
                     : QUARANTINE_DEFAULT_LIMIT;
    ql.lease_ended = lease_ended;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_QUARANTINE_LIST;
    req.quarantine_list = &ql;
    Idem__Response *resp = NULL;
    int code = callSend(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = jOutcome(resp);
    if (idem_response_outcome(resp) != IDEM__OUTCOME__OUTCOME_OK) {
        outEmit(g, o);
        idem__response__free_unpacked(resp, NULL);
        return EXIT_ANSWERED;
    }
    json_t *recs = jarr();
    for (size_t i = 0; i < resp->n_records; i++) {
        json_t *r = jAdminRecord(resp->records[i], reveal, false);
        /* The record keeps no quarantine time: since is when the key was first claimed
         * (a takeover keeps created_at); a lease ended at its deadline. */
        json_t *since = json_object_get(r, lease_ended ? "lease_deadline_ms" : "created_at_ms");
        if (since != NULL) {
            jset(r, "since_ms", json_copy(since));
        }
        jpush(recs, r);
    }
    jset(o, "count", ju64(resp->n_records));
    jset(o, "lease_ended", json_boolean(lease_ended));
    jset(o, "more", json_boolean(resp->more));
    jset(o, "limit", ju64(ql.limit));
    jset(o, "records", recs);
    if (g->json) {
        outPrintJson(o);
    } else {
        const char *what =
            lease_ended ? "records in processing whose lease has ended" : "quarantined records";
        if (resp->n_records == 0) {
            printf("no %s%s%s\n", what, tenant ? " of tenant " : "", tenant ? tenant : "");
        } else {
            printf("%-20s %-12s %-20s %-24s%s\n", "TENANT", "KEY_DIGEST", "TOKEN",
                   lease_ended ? "LEASE ENDED (UTC)" : "SINCE (claimed, UTC)",
                   reveal ? " KEY" : "");
        }
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r)
        {
            char when[40];
            outIsoTime((uint64_t)json_integer_value(json_object_get(r, "since_ms")), when,
                       sizeof when);
            printf("%-20s %-12s %-20" JSON_INTEGER_FORMAT " %-24s",
                   json_string_value(json_object_get(r, "tenant")),
                   json_string_value(json_object_get(r, "key_digest")),
                   json_integer_value(json_object_get(r, "token")), when);
            if (reveal) {
                const char *k = json_string_value(json_object_get(r, "key"));
                printf(" %s", k ? k : "(not UTF-8)");
            }
            putchar('\n');
        }
        if (resp->more) {
            printf("... more %s than --limit %" PRIu32 " (not shown)\n", what, ql.limit);
        }
    }
    json_decref(o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}
