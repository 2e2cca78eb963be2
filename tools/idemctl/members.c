/* members: the commands that change or show the Raft configuration and leadership:
 * members list|add|promote|remove, transfer, and snapshot (which finds the leader as
 * status does). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemctl.h"

/* A node ID: 1..INT64_MAX, the IDs a JSON integer (and status) can show. */
static uint64_t parseNodeId(const char *what, const char *s)
{
    return cli_parse_u64(what, s, 1, (uint64_t)INT64_MAX);
}

static void printMembersTable(const Idem__Response *resp)
{
    printf("%-6s %-8s %-22s %-22s %s\n", "ID", "ROLE", "RAFT_ADDRESS", "RPC_ADDRESS",
           "HTTP_ADDRESS");
    for (size_t i = 0; i < resp->n_members; i++) {
        const Idem__Member *m = resp->members[i];
        /* An address not known yet (a member just added, whose addresses this node has
         * not applied) is "-", as one not given. */
        printf("%-6" PRIu64 " %-8s %-22s %-22s %s\n", m->id, m->role, m->raft_address,
               m->rpc_address[0] ? m->rpc_address : "-",
               m->http_address[0] ? m->http_address : "-");
    }
}

/* Before `members remove ID`: when ID leads and another voter exists, leadership is handed
 * to a voter the leader hears from first, as `transfer` does. Removed while leading, the
 * node steps down only once the change commits, and the cluster has no leader (every
 * request unavailable) until the others time out and elect one: an election timeout or
 * two. *moved_to (OUT): the new leader, 0 when nothing moved; then *pre (OUT) is the
 * discovery made here, for the removal's leaderCall (free with probeDiscoveryFree() and free()),
 * else NULL. EXIT_ANSWERED to go on with the removal; otherwise the failure was reported
 * (nothing removed) and its exit status is returned. A last voter is left to the node,
 * which refuses its removal. */
static int leadershipAway(struct global *g, uint64_t id, uint64_t *moved_to, struct discovery **pre)
{
    *moved_to = 0;
    *pre = NULL;
    if (g->cluster == NULL) {
        return EXIT_ANSWERED; /* leaderCall says what is missing */
    }
    struct discovery *d = calloc(1, sizeof *d);
    if (d == NULL) {
        outOom();
    }
    probeDiscover(g, false, d);
    bool leads = d->v.leader == id && probeOfNode(d->probes, d->n, &d->v, d->v.leader) != NULL;
    if (!leads || d->v.voters < 2) {
        *pre = d;
        return EXIT_ANSWERED;
    }
    fprintf(stderr,
            "idemctl: note: node %" PRIu64 " leads: handing leadership to another voter before "
            "removing it (removed while leading, it would leave the cluster without a leader "
            "until an election)\n",
            id);
    Idem__TransferRequest tr = IDEM__TRANSFER_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    Idem__Response *resp = NULL;
    uint64_t leader_id = 0;
    json_t *extra = jobj();
    jset(extra, "removed", json_false());
    g->fail_extra = extra;
    /* The transfer goes where this discovery found the leader: a node of --cluster that does
     * not answer costs the removal two deadlines (this discovery and the one that finds the
     * new leader), not three. */
    int code =
        leaderCall(g, "members remove: moving leadership first", 0, &req, &resp, &leader_id, d);
    probeDiscoveryFree(d);
    free(d);
    if (code == EXIT_MOVED) {
        *moved_to = leader_id;
        code = EXIT_ANSWERED;
    } else if (code == EXIT_ANSWERED) {
        Idem__Outcome out = idem_response_outcome(resp);
        if (out == IDEM__OUTCOME__OUTCOME_OK) {
            *moved_to = resp->leader_id;
            if (*moved_to == 0) { /* a node older than that field: as status shows it */
                uint64_t now = leaderOfStatus(g);
                *moved_to = now != id ? now : 0;
            }
        } else {
            char msg[400];
            snprintf(msg, sizeof msg,
                     "members remove: node %" PRIu64 " leads, and handing leadership over "
                     "first was refused (%s: %s); nothing was removed",
                     id, idem_outcome_name(out),
                     resp->error != NULL && resp->error[0] ? resp->error : "no reason given");
            code = outFailCall(g, IDEM_EUNAVAILABLE, msg);
        }
        idem__response__free_unpacked(resp, NULL);
    }
    g->fail_extra = NULL;
    json_decref(extra);
    if (code != EXIT_ANSWERED) {
        fprintf(stderr, "idemctl: node %" PRIu64 " was not removed\n", id);
    }
    return code;
}

/* The request of `members ACTION ...` (pos[0..npos), the action first; none: list), into
 * mr (OUT; its addresses borrowed from pos). A usage error exits. */
static void membersRequest(const char **pos, size_t npos, Idem__MembersRequest *mr)
{
    const char *action = npos ? pos[0] : "list";
    if (strcmp(action, "list") == 0) {
        if (npos > 1) {
            cli_usage_error("members list: unexpected argument \"%s\"", pos[1]);
        }
        mr->action = IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST;
    } else if (strcmp(action, "add") == 0) {
        if (npos < 4) {
            cli_usage_error("members add: expected ID RAFT_ADDR RPC_ADDR [HTTP_ADDR]");
        }
        mr->action = IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD;
        mr->id = parseNodeId("members add ID", pos[1]);
        char why[160];
        for (size_t i = 2; i < npos; i++) {
            if (idem_seeds_check(pos[i], why, sizeof why) != IDEM_OK ||
                strchr(pos[i], ',') != NULL) {
                cli_usage_error("members add: bad address %s",
                                strchr(pos[i], ',') ? "(one address each)" : why);
            }
        }
        mr->raft_address = (char *)pos[2];
        mr->rpc_address = (char *)pos[3];
        if (npos > 4) {
            mr->http_address = (char *)pos[4];
        }
    } else if (strcmp(action, "promote") == 0 || strcmp(action, "remove") == 0) {
        if (npos != 2) {
            cli_usage_error("members %s: expected ID", action);
        }
        mr->action = action[1] == 'r' ? IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE
                                      : IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE;
        mr->id = parseNodeId("members ID", pos[1]);
    } else {
        cli_usage_error("members: unknown action \"%s\" (list, add, promote or remove)", action);
    }
}

/* Sends mr: a change to the leader (a remove of the leader after leadershipAway(), the new
 * leader in *moved_to, OUT, 0 when nothing moved), the list as a status request to the
 * first node that answers (its address in from, OUT). On an answer returns EXIT_ANSWERED
 * with *resp (OUT; free with idem__response__free_unpacked); otherwise the failure was
 * reported and its exit status is returned. */
static int membersSend(struct global *g, Idem__MembersRequest *mr, Idem__Response **resp,
                       char *from, size_t from_len, uint64_t *moved_to)
{
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_MEMBERS;
    req.members = mr;
    *resp = NULL;
    *moved_to = 0;
    from[0] = '\0';
    if (mr->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST) {
        /* Any node answers the list with its own configuration, a lone candidate's too: the
         * node's status carries the same list (the nodes answer both from one place) and who
         * the node is and whom it follows, so that the output can say so. */
        Idem__StatusRequest sr = IDEM__STATUS_REQUEST__INIT;
        req.op_case = IDEM__REQUEST__OP_STATUS;
        req.status = &sr;
        return callFrom(g, true, NULL, &req, resp, from, from_len);
    }
    uint64_t leader_id = 0;
    struct discovery *pre = NULL; /* remove: the one leadershipAway() made, when kept */
    json_t *moved = NULL;
    if (mr->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE) {
        int code = leadershipAway(g, mr->id, moved_to, &pre);
        if (code != EXIT_ANSWERED) {
            return code;
        }
        if (*moved_to != 0) { /* said with a failure of the removal too */
            moved = jobj();
            jset(moved, "leader_moved_to", ju64(*moved_to));
            g->fail_extra = moved;
        }
        if (*moved_to != 0 && pre == NULL) {
            /* The removal goes to the new leader once status shows it. */
            pre = calloc(1, sizeof *pre);
            if (pre == NULL) {
                outOom();
            }
            if (!leaderDiscoverSettled(g, pre)) {
                probeDiscoveryFree(pre);
                free(pre);
                char msg[300];
                snprintf(msg, sizeof msg,
                         "members remove: leadership moved to node %" PRIu64 ", then no leader "
                         "showed in status within the deadline; node %" PRIu64 " was not "
                         "removed (nothing was sent): see `idemctl status`, then remove it again",
                         *moved_to, mr->id);
                jset(moved, "removed", json_false());
                code = outFailCall(g, IDEM_EUNAVAILABLE, msg);
                g->fail_extra = NULL;
                json_decref(moved);
                return code;
            }
        }
    }
    int code = leaderCall(g, "members",
                          mr->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE ? mr->id : 0,
                          &req, resp, &leader_id, pre);
    if (pre != NULL) {
        probeDiscoveryFree(pre);
        free(pre);
    }
    if (moved != NULL) {
        g->fail_extra = NULL;
        json_decref(moved);
    }
    if (code != EXIT_ANSWERED && *moved_to != 0) {
        fprintf(stderr,
                "idemctl: leadership moved to node %" PRIu64 " first, then the removal of "
                "node %" PRIu64 " failed (it may still take effect after a timeout): see "
                "`idemctl members list`, then remove it again if need be\n",
                *moved_to, mr->id);
    }
    return code;
}

/* What an add, promote or remove the leader answered ok did, and the next step: o's
 * "message", unless the node gave one. */
static void membersDone(json_t *o, const Idem__MembersRequest *mr, uint64_t moved_to)
{
    if (json_object_get(o, "message") != NULL) {
        return;
    }
    char msg[200];
    if (mr->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD) {
        snprintf(msg, sizeof msg,
                 "node %" PRIu64 " is a spare now; once it runs, `idemctl members promote %" PRIu64
                 "` makes it a voter",
                 mr->id, mr->id);
    } else if (mr->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE) {
        snprintf(msg, sizeof msg, "node %" PRIu64 " is a voter now", mr->id);
    } else if (moved_to != 0) {
        snprintf(msg, sizeof msg,
                 "node %" PRIu64 " is out of the configuration; it can be stopped "
                 "(leadership moved to node %" PRIu64 " first)",
                 mr->id, moved_to);
    } else {
        snprintf(msg, sizeof msg, "node %" PRIu64 " is out of the configuration; it can be stopped",
                 mr->id);
    }
    jset(o, "message", jstr(msg));
}

/* For `members list`: the node whose configuration it is (at `from`, "" if unknown: its
 * own rpc_address), its ID and role and the leader it follows, into o; a node that knows
 * no leader gets a note on stderr, since its configuration may be stale. */
static void membersListNode(json_t *o, const Idem__NodeStatus *st, const char *from)
{
    const char *node = from[0] ? from : st->rpc_address;
    jset(o, "node", jstr(node));
    jset(o, "node_id", ju64(st->id));
    jset(o, "node_role", jstr(st->role));
    jset(o, "leader_id", st->leader_id ? ju64(st->leader_id) : json_null());
    if (st->leader_id == 0) {
        fprintf(stderr,
                "idemctl: note: node %" PRIu64 " (%s) knows no leader (role %s): this is "
                "its own configuration, which may be stale; `idemctl status` asks every "
                "node\n",
                st->id, node, st->role);
    }
}

/* members [list | add ID RAFT RPC [HTTP] | promote ID | remove ID] */
int membersCmd(struct global *g, struct args *a)
{
    const char *pos[5];
    size_t npos = 0;
    argsParse(g, a, NULL, 0, pos, 5, &npos);
    Idem__MembersRequest mr = IDEM__MEMBERS_REQUEST__INIT;
    membersRequest(pos, npos, &mr);
    bool is_list = mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST;
    Idem__Response *resp = NULL;
    uint64_t moved_to = 0;
    char from[256];
    int code = membersSend(g, &mr, &resp, from, sizeof from, &moved_to);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = jResult(resp);
    Idem__Outcome out = idem_response_outcome(resp);
    if ((mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE ||
         mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE) &&
        out == IDEM__OUTCOME__OUTCOME_INVALID) {
        leaderExplainRefusal(g, o, mr.id, false);
    }
    if (!is_list && out == IDEM__OUTCOME__OUTCOME_OK) {
        membersDone(o, &mr, moved_to);
    }
    if (moved_to != 0) {
        jset(o, "leader_moved_to", ju64(moved_to));
    }
    /* The list is the answer to `list`; add, promote and remove answer only an outcome
     * (an empty list there would read as "no members"). */
    bool list = is_list && out == IDEM__OUTCOME__OUTCOME_OK;
    if (list && resp->status != NULL) {
        membersListNode(o, resp->status, from);
    }
    if (list || resp->n_members > 0) {
        json_t *ms = jarr();
        for (size_t i = 0; i < resp->n_members; i++) {
            jpush(ms, jMember(resp->members[i]));
        }
        jset(o, "members", ms);
    }
    if (!g->json && resp->n_members > 0) {
        json_object_del(o, "members");
        outNoteOutcome(o);
        outPrintFlat(o, "");
        printMembersTable(resp);
        json_decref(o);
    } else {
        outEmit(g, o);
    }
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* transfer [NODE_ID]: sent to the leader; a refusal of NODE_ID is explained from status. */
int membersCmdTransfer(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    argsParse(g, a, NULL, 0, pos, 1, &npos);
    Idem__TransferRequest tr = IDEM__TRANSFER_REQUEST__INIT;
    tr.id = npos ? parseNodeId("transfer NODE_ID", pos[0]) : 0;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    Idem__Response *resp = NULL;
    uint64_t leader_id = 0;
    int code = leaderCall(g, "transfer", 0, &req, &resp, &leader_id, NULL);
    if (code == EXIT_MOVED) {
        json_t *o = jobj();
        jset(o, "outcome", jstr("ok"));
        jset(o, "leader_id", ju64(leader_id));
        char msg[160];
        snprintf(msg, sizeof msg,
                 "leadership moved to node %" PRIu64 " after the leader had answered that it "
                 "did not",
                 leader_id);
        jset(o, "message", jstr(msg));
        outEmit(g, o);
        return EXIT_ANSWERED;
    }
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = jResult(resp);
    Idem__Outcome out = idem_response_outcome(resp);
    if (tr.id != 0 && out == IDEM__OUTCOME__OUTCOME_INVALID) {
        leaderExplainRefusal(g, o, tr.id, true);
    }
    if (out == IDEM__OUTCOME__OUTCOME_OK) {
        /* The node that leads now, as the old leader saw it when the transfer ended (a
         * node older than this field says 0: status is asked instead). */
        uint64_t now_leader = resp->leader_id != 0 ? resp->leader_id : leaderOfStatus(g);
        jset(o, "leader_id", now_leader != 0 ? ju64(now_leader) : json_null());
        if (now_leader != 0 && json_object_get(o, "message") == NULL) {
            char msg[96];
            snprintf(msg, sizeof msg, "node %" PRIu64 " leads now", now_leader);
            jset(o, "message", jstr(msg));
        }
    }
    outEmit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* snapshot [--node ADDR]: on ADDR, else on the leader that status finds. */
int membersCmdSnapshot(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *node = NULL;
    const struct argsOpt opts[] = {{"--node", &node, NULL}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
    if (node != NULL) {
        char why[160];
        if (idem_seeds_check(node, why, sizeof why) != IDEM_OK || strchr(node, ',') != NULL) {
            cli_usage_error("snapshot: bad --node address: %s",
                            strchr(node, ',') ? "give one address" : why);
        }
        if (g->cluster == NULL) {
            g->cluster = node;
        }
    }
    if (g->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    /* Any node takes a snapshot when asked: find the leader as status does. */
    char leader_addr[ADDR_MAX];
    uint64_t leader_id = 0;
    if (node == NULL) {
        struct discovery d;
        probeDiscover(g, false, &d);
        /* The leader answered as leader, or refused the token (buildView()). */
        const struct probe *lp = probeOfNode(d.probes, d.n, &d.v, d.v.leader);
        if (lp == NULL) {
            int code =
                leaderNone(g, &d, "snapshot", "pass --node ADDR to take a snapshot on one node");
            probeDiscoveryFree(&d);
            return code;
        }
        snprintf(leader_addr, sizeof leader_addr, "%s", lp->addr);
        leader_id = d.v.leader;
        probeDiscoveryFree(&d);
        node = leader_addr;
    }
    Idem__SnapshotRequest sn = IDEM__SNAPSHOT_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_SNAPSHOT;
    req.snapshot = &sn;
    json_t *extra = jobj();
    jset(extra, "node", jstr(node));
    if (leader_id != 0) {
        jset(extra, "node_id", ju64(leader_id));
    }
    return callAndEmit(g, true, node, &req, extra);
}
