/* reload: asks nodes to read their configuration file again (the admin op `reload`, as a
 * SIGHUP does; docs/operations.md, "Reloading the configuration"), one node after the other,
 * and prints what each answered. */
#include <stdio.h>
#include <string.h>

#include "idemctl.h"

/* One node's answer (or failure to answer) into the JSON array `nodes` and a line on stdout
 * (without --json). *refused / *unreached are set when it refused the reload or its caller,
 * or did not answer. */
static void reloadOne(const struct global *g, const char *addr, uint64_t id, json_t *nodes,
                      bool *refused, bool *unreached)
{
    Idem__ReloadRequest rr = IDEM__RELOAD_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RELOAD;
    req.reload = &rr;
    json_t *o = jobj();
    jset(o, "node", jstr(addr));
    if (id != 0) {
        jset(o, "node_id", ju64(id));
    }
    struct idem_client *c = NULL;
    char why[512];
    Idem__Response *resp = NULL;
    int rv = callClientOpen(g, addr, callBearer(g, true), &c, why, sizeof why);
    if (rv == IDEM_OK) {
        rv = idem_call_node(c, addr, &req, g->deadline_ms, &resp);
        snprintf(why, sizeof why, "%s", idem_client_errmsg(c));
    }
    idem_client_close(c);
    if (rv != IDEM_OK) {
        *unreached = true;
        jset(o, "outcome", json_string("unavailable"));
        jset(o, "error", jstr(why[0] ? why : idem_strerror(rv)));
    } else {
        json_t *answer = jOutcome(resp);
        outNoteOutcome(answer); /* a refused token: exit 4 (outTokenRefused) */
        json_object_update(o, answer);
        json_decref(answer);
        *refused = *refused || idem_response_outcome(resp) != IDEM__OUTCOME__OUTCOME_OK;
    }
    if (!g->json) {
        const char *outcome = json_string_value(json_object_get(o, "outcome"));
        json_t *e = json_object_get(o, "error");
        e = e != NULL ? e : json_object_get(o, "message");
        printf("%s: %s", addr, outcome != NULL ? outcome : "?");
        if (json_is_string(e)) {
            fputs(": ", stdout);
            const char *t = json_string_value(e);
            outPutSafe(t, strlen(t), stdout); /* a node's words */
        }
        fputc('\n', stdout);
    }
    idem__response__free_unpacked(resp, NULL);
    jpush(nodes, o);
}

/* reload [--node ADDR | --all]: ADDR; or every member that status finds (--all); or every
 * node of --cluster. Exit 0 when every node reloaded, 2 when one refused (a bad file), 4 when
 * one refused the token, 3 when one did not answer. */
int reloadCmd(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *node = NULL;
    bool all = false;
    const struct argsOpt opts[] = {{"--node", &node, NULL}, {"--all", NULL, &all}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
    if (node != NULL && all) {
        cli_usage_error("reload: --node and --all go alone");
    }
    if (node != NULL) {
        char why[160];
        if (idem_seeds_check(node, why, sizeof why) != IDEM_OK || strchr(node, ',') != NULL) {
            cli_usage_error("reload: bad --node address: %s",
                            strchr(node, ',') ? "give one address" : why);
        }
    } else if (g->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    json_t *nodes = jarr();
    bool refused = false, unreached = false;
    if (node != NULL) {
        reloadOne(g, node, 0, nodes, &refused, &unreached);
    } else if (all) {
        struct discovery d;
        probeDiscover(g, false, &d);
        for (size_t i = 0; i < d.n; i++) {
            reloadOne(g, d.probes[i].addr, probeId(&d.probes[i], &d.v), nodes, &refused,
                      &unreached);
        }
        probeDiscoveryFree(&d);
    } else {
        static char addrs[IDEM_NODES_MAX][ADDR_MAX];
        size_t n = probeClusterAddrs(g->cluster, addrs, IDEM_NODES_MAX);
        for (size_t i = 0; i < n; i++) {
            reloadOne(g, addrs[i], 0, nodes, &refused, &unreached);
        }
    }
    int code = unreached                  ? EXIT_UNAVAILABLE
               : outTokenRefused() != NULL ? EXIT_AUTH
               : refused                   ? EXIT_USAGE
                                           : EXIT_ANSWERED;
    if (g->json) {
        json_t *o = jobj();
        jset(o, "outcome",
             json_string(code == EXIT_ANSWERED ? "ok"
                         : code != EXIT_UNAVAILABLE ? "refused"
                                               : "unavailable"));
        jset(o, "nodes", nodes);
        outPrintJson(o);
        json_decref(o);
    } else {
        json_decref(nodes);
    }
    return code;
}
