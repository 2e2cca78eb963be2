/* status: `idemctl status`, every node's line (JSON or a table) and the warnings drawn
 * from what status discovery (probe.c) found. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemctl.h"

/* A node's oldest log write this old is warned of, as the node itself warns in its log
 * (CLUSTER_STUCK_APPEND_US, cluster/include/cluster.h). */
#define STUCK_WRITE_MS 5000
#define DEFAULT_MAX_LAG 1000u /* status: entries a node may trail the leader by */
/* status --check: how long a voter that trails the leader may take to apply what the
 * leader had applied (--max-lag-ms), by default and at most (the deadline's ceiling). */
#define DEFAULT_MAX_LAG_MS 5000u
#define MAX_LAG_MS_LIMIT 600000u

/* A node's line of status as JSON: what its status says, or why there is none (unreachable,
 * refused), with its lag behind the leader's applied index. */
static json_t *nodeJson(const struct probe *p, const struct clusterView *v)
{
    json_t *o = jobj();
    const Idem__NodeStatus *st = probeStatus(p);
    const Idem__Member *m = probeViewMember(v, st ? st->id : 0, p->addr);
    uint64_t id = probeId(p, v);
    jset(o, "id", id ? ju64(id) : json_null());
    jset(o, "rpc_address", jstr(p->addr));
    jset(o, "role", jstr(st ? st->role : "unreachable"));
    jset(o, "member_role", m ? jstr(m->role) : json_null());
    jset(o, "term", st ? ju64(st->term) : json_null());
    jset(o, "commit_index", st ? ju64(st->commit_index) : json_null());
    jset(o, "applied_index", st ? ju64(st->applied_index) : json_null());
    jset(o, "records", st ? ju64(st->records) : json_null());
    if (st != NULL) {
        jset(o, "leader_id", st->leader_id ? ju64(st->leader_id) : json_null());
        if (v->leader_st != NULL) {
            uint64_t la = v->leader_st->applied_index;
            jset(o, "lag", ju64(la > st->applied_index ? la - st->applied_index : 0));
        } else {
            jset(o, "lag", json_null());
        }
        jset(o, "last_snapshot_index", ju64(st->last_snapshot_index));
        jset(o, "snapshot_threshold", ju64(st->snapshot_threshold));
        jset(o, "snapshot_bytes", ju64(st->snapshot_bytes));
        jset(o, "raft_authenticated", json_boolean(st->raft_authenticated));
        jset(o, "raft_connections_refused", ju64(st->raft_connections_refused));
        jset(o, "raft_connect_auth_failures", ju64(st->raft_connect_auth_failures));
        jset(o, "append_oldest_ms", ju64(st->append_oldest_ms));
        jset(o, "processing", ju64(st->processing));
        jset(o, "completed", ju64(st->completed));
        jset(o, "quarantined", ju64(st->quarantined));
        jset(o, "tombstones", ju64(st->tombstones));
        jset(o, "bytes", ju64(st->bytes));
        jset(o, "raft_address", jstr(st->raft_address));
        jset(o, "http_address", jstr(st->http_address));
        jset(o, "version", jstr(st->version));
        if (st->digest != NULL && st->digest[0] != '\0') {
            jset(o, "digest", jstr(st->digest));
        }
    } else if (p->rv == IDEM_OK) {
        /* Reached, but it refused (e.g. a wrong admin token) or sent no status. */
        Idem__Outcome outcome = idem_response_outcome(p->resp);
        char msg[640];
        const char *detail = p->resp->error != NULL ? p->resp->error : "";
        snprintf(msg, sizeof msg, "%s%s%s",
                 p->resp->status == NULL && outcome == IDEM__OUTCOME__OUTCOME_OK
                     ? "answered without a status"
                     : idem_outcome_name((int)outcome),
                 detail[0] ? ": " : "", detail);
        jset(o, "role", jstr("refused"));
        jset(o, "error", jstr(msg));
    } else {
        jset(o, "error", jstr(p->err[0] ? p->err : idem_strerror(p->rv)));
    }
    return o;
}

/* A line of status: a node's JSON (nodeJson()) and the probe it shows. */
struct statusRow {
    json_t *node;
    const struct probe *p;
};

/* Sorts rows by node id, nodes without one last (by address). */
static int nodeCmp(const void *a, const void *b)
{
    const json_t *x = ((const struct statusRow *)a)->node;
    const json_t *y = ((const struct statusRow *)b)->node;
    json_int_t ix = json_integer_value(json_object_get(x, "id"));
    json_int_t iy = json_integer_value(json_object_get(y, "id"));
    if ((ix == 0) != (iy == 0)) {
        return ix == 0 ? 1 : -1;
    }
    if (ix != iy) {
        return ix < iy ? -1 : 1;
    }
    return strcmp(json_string_value(json_object_get(x, "rpc_address")),
                  json_string_value(json_object_get(y, "rpc_address")));
}

static void addWarning(json_t *warnings, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void addWarning(json_t *warnings, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    jpush(warnings, jstr(buf));
}

/* A node's name in warnings: "node 2 (127.0.0.1:7002)" or "the node at 127.0.0.1:7002". */
static void nodeName(const json_t *node, char *out, size_t len)
{
    const char *addr = json_string_value(json_object_get(node, "rpc_address"));
    json_int_t id = json_integer_value(json_object_get(node, "id"));
    if (id != 0) {
        snprintf(out, len, "node %" JSON_INTEGER_FORMAT " (%s)", id, addr);
    } else {
        snprintf(out, len, "the node at %s", addr);
    }
}

/* For a node that answers (st) but is not a member: the member with another ID whose
 * addresses it holds, and which (OUT: "rpc", covered by probeMemberMismatch()'s warning, or
 * "raft" or "http"); NULL when none. `members add` refuses the node's addresses while that
 * member has them. */
static const Idem__Member *addressHolder(const struct probe *probes, size_t n,
                                         const struct clusterView *v, const Idem__NodeStatus *st,
                                         const char **which)
{
    const Idem__Member *held = NULL;
    for (size_t i = 0; v->members_of != NULL && i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if (m->id == st->id) {
            continue;
        }
        if (probeAnswerAt(probes, n, m->rpc_address) == st) {
            *which = "rpc";
            return m;
        }
        if (held == NULL && strcmp(m->raft_address, st->raft_address) == 0) {
            held = m;
            *which = "raft";
        } else if (held == NULL && st->http_address[0] != '\0' &&
                   strcmp(m->http_address, st->http_address) == 0) {
            held = m;
            *which = "http";
        }
    }
    return held;
}

/* The warnings about a node that answered with its status (row): a Raft log write in
 * flight too long, not a member (or holding a member's addresses), lagging the leader by
 * more than max_lag entries. `name`: the node in warnings (nodeName()). */
static void nodeWarnings(const struct statusRow *row, const char *name, const char *role,
                         const struct probe *probes, size_t n_probes, const struct clusterView *v,
                         uint64_t max_lag, json_t *warnings)
{
    const json_t *x = row->node;
    json_t *lag = json_object_get(x, "lag");
    json_t *stuck = json_object_get(x, "append_oldest_ms");
    if (json_is_integer(stuck) && json_integer_value(stuck) >= STUCK_WRITE_MS) {
        addWarning(warnings,
                   "%s: a Raft log write has been in flight for %.1f s: its disk is "
                   "slow or not answering (%s)",
                   name, (double)json_integer_value(stuck) / 1000.0,
                   strcmp(role, "leader") == 0
                       ? "the leader: nothing commits meanwhile"
                       : "the others commit without it, if they are a majority");
    }
    /* A spare gets no log until it is promoted (raft replicates to voters and
     * standbys only): its lag is expected, not a warning. */
    const char *member = json_string_value(json_object_get(x, "member_role"));
    bool spare = member != NULL && strcmp(member, "spare") == 0;
    /* A node that answers but is not in the configuration (removed and still
     * running, or started and not added yet) keeps calling elections nobody
     * answers, and is easy to take for a member in the table. */
    /* Unless a member holds its addresses (`members add` with a wrong ID): then
     * adding it is refused until that member is removed. */
    bool non_member = member == NULL && v->members_of != NULL;
    const Idem__NodeStatus *st = probeStatus(row->p);
    const char *which = NULL;
    const Idem__Member *holder =
        member == NULL && st != NULL ? addressHolder(probes, n_probes, v, st, &which) : NULL;
    if (non_member && holder == NULL) {
        addWarning(warnings,
                   "%s answers but is not a member of the Raft configuration "
                   "(removed, or not added yet): stop it, or `idemctl members add` it",
                   name);
    } else if (holder != NULL && strcmp(which, "rpc") != 0) {
        char add[4 * ADDR_MAX];
        probeAddCommand(st, add, sizeof add);
        addWarning(warnings,
                   "%s answers but is not a member of the Raft configuration, and its "
                   "%s address %s is member %" PRIu64 "'s there: the id (or address) "
                   "given to `members add` for member %" PRIu64 " is wrong; `idemctl "
                   "members remove %" PRIu64 "`, then `%s`",
                   name, which, strcmp(which, "raft") == 0 ? st->raft_address : st->http_address,
                   holder->id, holder->id, holder->id, add);
    }
    /* Nor is a non-member's (its warning above says what to do): the leader sends
     * it nothing. */
    if (!spare && !non_member && json_is_integer(lag) &&
        (uint64_t)json_integer_value(lag) > max_lag) {
        addWarning(warnings,
                   "%s lags: applied index %" JSON_INTEGER_FORMAT " is %" JSON_INTEGER_FORMAT
                   " entr%s behind the leader's %" PRIu64 " (more than --max-lag %" PRIu64 ")",
                   name, json_integer_value(json_object_get(x, "applied_index")),
                   json_integer_value(lag), json_integer_value(lag) == 1 ? "y" : "ies",
                   v->leader_st->applied_index, max_lag);
    }
}

/* Members with raft.secret_file and members without it cannot talk at all: a warning
 * naming both sides, when status shows both. */
static void authWarning(const struct statusRow *rows, size_t n, json_t *warnings)
{
    char with[160] = "", without[160] = "";
    for (size_t i = 0; i < n; i++) {
        const json_t *auth = json_object_get(rows[i].node, "raft_authenticated");
        const json_t *id = json_object_get(rows[i].node, "id");
        if (!json_is_boolean(auth) || !json_is_integer(id)) {
            continue;
        }
        char *list = json_is_true(auth) ? with : without;
        size_t len = strlen(list);
        if (len + 24 < sizeof with) {
            snprintf(list + len, sizeof with - len, "%s%" JSON_INTEGER_FORMAT, len ? ", " : "",
                     json_integer_value(id));
        }
    }
    if (with[0] != '\0' && without[0] != '\0') {
        addWarning(warnings,
                   "Raft authentication differs: node(s) %s authenticate their Raft connections "
                   "(raft.secret_file) and node(s) %s do not; those cannot talk to each other",
                   with, without);
    }
}

/* The warnings about the cluster as a whole: its state unknown, no leader, no quorum. */
static void clusterWarnings(const struct clusterView *v, json_t *warnings)
{
    if (v->members_of == NULL) {
        addWarning(warnings, "cluster state unknown: no node answered with its status");
        return;
    }
    if (v->unreachable_leader != 0) {
        addWarning(warnings,
                   "no leader: the reachable nodes follow node %" PRIu64 ", which does not "
                   "answer as leader; requests answer unavailable until one is elected",
                   v->unreachable_leader);
    } else if (v->leader == 0) {
        addWarning(warnings, "no leader: no majority of the reachable voters agrees on one; "
                             "requests answer unavailable until one is elected");
    }
    if (2 * v->reachable_voters <= v->voters) {
        addWarning(warnings,
                   "no quorum: %zu of %zu voters reachable; the cluster cannot commit, "
                   "requests answer unavailable",
                   v->reachable_voters, v->voters);
    }
}

/* Every warning of status, in order: per node, per member, then the cluster's. */
static void statusWarnings(const struct statusRow *rows, size_t n, const struct probe *probes,
                           size_t n_probes, const struct clusterView *v, uint64_t max_lag,
                           json_t *warnings)
{
    char name[320];
    for (size_t i = 0; i < n; i++) {
        const json_t *x = rows[i].node;
        nodeName(x, name, sizeof name);
        const char *role = json_string_value(json_object_get(x, "role"));
        const char *err = json_string_value(json_object_get(x, "error"));
        if (strcmp(role, "unreachable") == 0) {
            addWarning(warnings, "%s is unreachable: %s", name, err ? err : "no answer");
        } else if (strcmp(role, "refused") == 0) {
            addWarning(warnings, "%s %s: %s", name,
                       probeRefused(rows[i].p) ? "refused the admin token" : "refused status",
                       err ? err : "");
        } else {
            nodeWarnings(&rows[i], name, role, probes, n_probes, v, max_lag, warnings);
        }
    }
    /* Members whose rpc address is answered by another node, or who listen for Raft
     * elsewhere than the configuration says: Raft cannot reach them. */
    for (size_t i = 0; v->members_of != NULL && i < v->members_of->n_members; i++) {
        char why[2048];
        if (probeMemberMismatch(probes, n_probes, v, v->members_of->members[i], why, sizeof why)) {
            addWarning(warnings, "%s", why);
        }
    }
    authWarning(rows, n, warnings);
    clusterWarnings(v, warnings);
}

/* A cell's text: an integer, a string, or "-" for anything else (null, absent). */
static const char *cellText(const json_t *v, char *buf, size_t len)
{
    if (json_is_integer(v)) {
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    }
    return json_is_string(v) ? json_string_value(v) : "-";
}

/* `digest`: the nodes were asked for their digests (status --digest), shown last. */
static void printStatusTable(const json_t *o, bool digest)
{
    json_t *leader = json_object_get(o, "leader_id");
    json_t *voters = json_object_get(o, "voters");
    if (json_is_integer(leader)) {
        printf("leader: %" JSON_INTEGER_FORMAT, json_integer_value(leader));
    } else {
        printf("leader: none");
    }
    printf("   quorum: %s", json_is_true(json_object_get(o, "quorum")) ? "yes" : "NO");
    if (json_is_integer(voters)) {
        printf(" (%" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT " voters reachable)",
               json_integer_value(json_object_get(o, "reachable_voters")),
               json_integer_value(voters));
    }
    putchar('\n');
    static const struct {
        const char *title, *field;
    } cols[] = {
        {"ID", "id"},
        {"RPC_ADDRESS", "rpc_address"},
        {"ROLE", "role"},
        {"MEMBER", "member_role"},
        {"TERM", "term"},
        {"LEADER", "leader_id"},
        {"COMMIT", "commit_index"},
        {"APPLIED", "applied_index"},
        {"LAG", "lag"},
        {"SNAPSHOT", "last_snapshot_index"},
        {"RECORDS", "records"},
        {"TOMBSTONES", "tombstones"},
        {"QUARANTINED", "quarantined"},
        {"BYTES", "bytes"},
        {"DIGEST", "digest"},
    };
    enum { NCOLS = sizeof cols / sizeof cols[0], ERR_AFTER = 4 };
    size_t ncols = digest ? NCOLS : NCOLS - 1;
    /* Each column as wide as its widest cell; a node that did not answer shows its error
     * after its first ERR_AFTER cells, which alone count for the widths. */
    int width[NCOLS];
    for (size_t c = 0; c < ncols; c++) {
        width[c] = (int)strlen(cols[c].title);
    }
    const json_t *nodes = json_object_get(o, "nodes");
    size_t i;
    json_t *x;
    char buf[32];
    json_array_foreach(nodes, i, x)
    {
        bool err = json_object_get(x, "error") != NULL;
        for (size_t c = 0; c < ncols && (!err || c < ERR_AFTER); c++) {
            size_t w = strlen(cellText(json_object_get(x, cols[c].field), buf, sizeof buf));
            width[c] = w > (size_t)width[c] ? (int)w : width[c];
        }
    }
    for (size_t c = 0; c < ncols; c++) {
        if (c + 1 < ncols) {
            printf("%-*s ", width[c], cols[c].title);
        } else {
            printf("%s\n", cols[c].title);
        }
    }
    json_array_foreach(nodes, i, x)
    {
        const char *err = json_string_value(json_object_get(x, "error"));
        for (size_t c = 0; c < ncols; c++) {
            if (err != NULL && c >= ERR_AFTER) {
                outPutSafe(err, strlen(err), stdout);
                break;
            }
            const char *t = cellText(json_object_get(x, cols[c].field), buf, sizeof buf);
            if (c + 1 < ncols) {
                printf("%-*s ", width[c], t);
            } else {
                printf("%s", t);
            }
        }
        putchar('\n');
    }
    json_array_foreach(json_object_get(o, "warnings"), i, x)
    {
        printf("warning: %s\n", json_string_value(x));
    }
}

/* status when every node that answered refused the admin token: says so on stderr (with
 * --json also as {"outcome", "error", "nodes"} on stdout) and returns EXIT_AUTH, a
 * credential error. Takes `nodes`. */
static int statusRefused(const struct global *g, json_t *nodes, size_t n, size_t refused,
                         size_t unauthenticated)
{
    const char *why = unauthenticated == refused ? "unauthenticated"
                      : unauthenticated == 0     ? "forbidden"
                                                 : "unauthenticated or forbidden";
    char msg[256];
    if (refused == n) {
        snprintf(msg, sizeof msg, "the admin token was refused by every node (%s)", why);
    } else {
        snprintf(msg, sizeof msg,
                 "the admin token was refused by every node that answered, %zu of %zu (%s); "
                 "the others are unreachable",
                 refused, n, why);
    }
    fprintf(stderr, "idemctl: status: %s\n", msg);
    fprintf(stderr, "idemctl: %s\n",
            unauthenticated == 0
                ? "that is a tenant's token: status needs the admin token (--admin-token or "
                  "IDEM_ADMIN_TOKEN)"
                : "check --admin-token (or IDEM_ADMIN_TOKEN): the nodes know the admin token "
                  "by its SHA-256 (admin.token_sha256)");
    if (g->json) {
        json_t *o = jobj();
        jset(o, "outcome", json_string(unauthenticated > 0 ? "unauthenticated" : "forbidden"));
        jset(o, "error", jstr(msg));
        jset(o, "nodes", nodes);
        outPrintJson(o);
        json_decref(o);
    } else {
        json_decref(nodes);
    }
    return EXIT_AUTH;
}

/* status --check: the failed checks (failed, a JSON array, taken) into o as "check";
 * whether all passed. */
static bool statusCheckJson(json_t *o, json_t *failed, uint64_t max_lag, uint64_t max_lag_ms)
{
    bool ok = json_array_size(failed) == 0;
    json_t *c = jobj();
    jset(c, "ok", json_boolean(ok));
    jset(c, "max_lag_entries", ju64(max_lag));
    jset(c, "max_lag_ms", ju64(max_lag_ms));
    jset(c, "failed", failed);
    jset(o, "check", c);
    return ok;
}

/* After status --check's output: each failed check on stderr (o's "check"). */
static void statusCheckStderr(const json_t *o)
{
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(json_object_get(o, "check"), "failed"), i, x)
    {
        const char *f = json_string_value(x);
        fputs("idemctl: status --check failed: ", stderr);
        outPutSafe(f, strlen(f), stderr);
        fputc('\n', stderr);
    }
}

/* status [--digest] [--max-lag-entries N] [--check [--max-lag-ms T]]: every node, then
 * the warnings; exit 0 when a node answered, 3 when none did, 4 when every node that
 * answered refused the admin token; with --check, 5 when a check failed. */
int statusCmd(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    bool digest = false, check = false;
    const char *lag = NULL, *lag_entries = NULL, *lag_ms = NULL;
    const struct argsOpt opts[] = {{"--max-lag", &lag, NULL},
                                   {"--max-lag-entries", &lag_entries, NULL},
                                   {"--max-lag-ms", &lag_ms, NULL},
                                   {"--digest", NULL, &digest},
                                   {"--check", NULL, &check}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
    if (lag != NULL && lag_entries != NULL) {
        cli_usage_error("status: --max-lag is --max-lag-entries: give one of them");
    }
    if (lag_ms != NULL && !check) {
        cli_usage_error("status: --max-lag-ms goes with --check");
    }
    uint64_t max_lag = lag ? cli_parse_u64("--max-lag", lag, 0, UINT64_MAX)
                       : lag_entries
                           ? cli_parse_u64("--max-lag-entries", lag_entries, 0, UINT64_MAX)
                           : DEFAULT_MAX_LAG;
    uint64_t max_lag_ms =
        lag_ms ? cli_parse_u64("--max-lag-ms", lag_ms, 1, MAX_LAG_MS_LIMIT) : DEFAULT_MAX_LAG_MS;
    struct discovery d;
    probeDiscover(g, digest, &d);
    struct probe *probes = d.probes;
    size_t n = d.n;
    struct clusterView v = d.v;
    struct statusRow *rows = calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        outOom();
    }
    size_t answered = 0, refused = 0, unauthenticated = 0;
    for (size_t i = 0; i < n; i++) {
        rows[i].node = nodeJson(&probes[i], &v);
        rows[i].p = &probes[i];
        answered += probes[i].rv == IDEM_OK;
        refused += probeRefused(&probes[i]);
        unauthenticated += probeRefused(&probes[i]) && idem_response_outcome(probes[i].resp) ==
                                                           IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED;
    }
    qsort(rows, n, sizeof *rows, nodeCmp);
    json_t *nodes = jarr();
    for (size_t i = 0; i < n; i++) {
        jpush(nodes, rows[i].node);
    }
    if (refused > 0 && refused == answered) {
        /* Nothing is known of the cluster but that the token is wrong: not "no quorum". */
        free(rows);
        probeDiscoveryFree(&d);
        return statusRefused(g, nodes, n, refused, unauthenticated);
    }
    json_t *warnings = jarr();
    statusWarnings(rows, n, probes, n, &v, max_lag, warnings);
    free(rows);

    json_t *o = jobj();
    jset(o, "leader_id", v.leader ? ju64(v.leader) : json_null());
    /* Quorum: a majority of the voters answered (with a status, or refusing the token). A
     * cluster between two leaders has one (it can elect the next); the leader's absence is
     * leader_id and the "no leader" warning. Without any status the voters are unknown. */
    jset(o, "quorum", json_boolean(v.members_of != NULL && 2 * v.reachable_voters > v.voters));
    jset(o, "voters", v.members_of ? ju64(v.voters) : json_null());
    jset(o, "reachable_voters", ju64(v.reachable_voters));
    jset(o, "max_lag", ju64(max_lag));
    jset(o, "nodes", nodes);
    json_t *ms = jarr();
    for (size_t i = 0; v.members_of != NULL && i < v.members_of->n_members; i++) {
        jpush(ms, jMember(v.members_of->members[i]));
    }
    jset(o, "members", ms);
    jset(o, "warnings", warnings);
    bool healthy = true;
    if (check && answered > 0) {
        healthy = statusCheckJson(o, healthCheck(g, &d, max_lag, max_lag_ms), max_lag, max_lag_ms);
    }
    if (g->json) {
        outPrintJson(o);
    } else {
        printStatusTable(o, digest);
        if (check && answered > 0) {
            printf("check: %s\n", healthy ? "ok" : "failed");
        }
    }
    fflush(stdout);
    statusCheckStderr(o);
    json_decref(o);
    if (answered == 0) {
        /* What the failures have in common (a TLS mismatch, say) is worth a hint. */
        unsigned hints = 0;
        for (size_t i = 0; i < n; i++) {
            hints |= outHintsFor(g, probes[i].err);
        }
        outPrintHints(hints);
    }
    probeDiscoveryFree(&d);
    /* Answered when any node answered, even with a refusal; 3 when none was reachable. */
    if (answered == 0) {
        return EXIT_UNAVAILABLE;
    }
    return healthy ? EXIT_ANSWERED : EXIT_CHECK;
}
