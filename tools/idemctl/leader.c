/* leader: sending an admin request once to the leader that status finds (leaderCall()),
 * following a move of leadership at most once and never retrying behind the operator's
 * back, and explaining the leader's refusals from what status shows. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "idemctl.h"

/* The probe of a node that refused the token, when no node answered with a status; NULL
 * otherwise. */
static const struct probe *everyNodeRefused(const struct discovery *d)
{
    size_t statuses = 0;
    const struct probe *refused = NULL;
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        statuses += probeStatus(p) != NULL;
        refused = refused == NULL && probeRefused(p) ? p : refused;
    }
    return statuses == 0 ? refused : NULL;
}

/* No leader in a discovery: the refusal when every node that answered refused the token
 * (the answer: exit 0, as for every admin command), else exit 3 with why (`what`: the
 * command; `hint`: what to do instead, or ""). */
int leaderNone(const struct global *g, const struct discovery *d, const char *what,
               const char *hint)
{
    size_t answered = 0;
    const struct probe *refused = everyNodeRefused(d), *silent = NULL;
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        answered += p->rv == IDEM_OK;
        silent = silent == NULL && p->rv != IDEM_OK ? p : silent;
    }
    if (refused != NULL) {
        outEmit(g, jResult(refused->resp));
        return EXIT_ANSWERED;
    }
    char msg[600];
    if (answered == 0 && silent != NULL) {
        snprintf(msg, sizeof msg, "no node answered (%s)",
                 silent->err[0] ? silent->err : idem_strerror(silent->rv));
    } else {
        snprintf(msg, sizeof msg, "%s: no leader (as status shows)%s%s", what, hint[0] ? "; " : "",
                 hint);
    }
    return outFailCall(g, IDEM_EUNAVAILABLE, msg);
}

/* What is left until `end` (ms, callNowMs()), at least 1 ms: the deadline of the next
 * call. */
static uint32_t leftMs(uint64_t end)
{
    uint64_t now = callNowMs();
    return (uint32_t)(end > now + 1 ? end - now : 1);
}

/* After a transfer answered "did not move" by the leader `asked` (0: its ID unknown): waits,
 * until `end` (ms), for status to show a leader. A leader other than `asked` means the
 * transfer took effect after all: EXIT_MOVED with *node_id that leader. `asked` itself:
 * EXIT_ANSWERED with its address in addr (the request may go to it again). Otherwise
 * (no leader by the end, or `asked` unknown so that a move cannot be told apart) the
 * failure is reported and its exit status returned. */
static int settledLeader(const struct global *g, uint64_t end, uint64_t asked, char *addr,
                         size_t addr_len, uint64_t *node_id)
{
    for (;;) {
        struct global probe = *g;
        probe.deadline_ms = leftMs(end);
        struct discovery d;
        probeDiscover(&probe, false, &d);
        const struct probe *lp = probeOfNode(d.probes, d.n, &d.v, d.v.leader);
        uint64_t leader = lp != NULL ? d.v.leader : 0;
        if (lp != NULL) {
            snprintf(addr, addr_len, "%s", lp->addr);
        }
        probeDiscoveryFree(&d);
        if (leader != 0 && asked != 0 && leader != asked) {
            *node_id = leader;
            return EXIT_MOVED;
        }
        if (leader != 0 && leader == asked) {
            return EXIT_ANSWERED;
        }
        if (leader != 0) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "the leader answered that leadership did not move; status now shows node "
                     "%" PRIu64 " as leader, which may be a move: see status before sending "
                     "it again",
                     leader);
            return outFailCall(g, IDEM_EUNAVAILABLE, msg);
        }
        if (callNowMs() + 200 >= end) {
            return outFailCall(g, IDEM_EUNAVAILABLE,
                               "leadership did not move before the "
                               "deadline");
        }
        callSleepMs(200); /* an election is under way: wait for it */
    }
}

/* Right after leadership moved (a transfer answered): a discovery that shows a leader, into
 * d (OUT; free with probeDiscoveryFree()), made again every 100 ms within g's deadline. The
 * other nodes learn of the new leader from its first heartbeat, and until a majority of
 * those that answer name it, status shows none (buildView()); a request sent then would be
 * refused as "no leader". Returns true when d shows a leader, or every node refused the
 * token (leaderCall() says so); false when none showed one by the deadline (d is the last
 * discovery made). */
bool leaderDiscoverSettled(const struct global *g, struct discovery *d)
{
    uint64_t end = callNowMs() + g->deadline_ms;
    for (;;) {
        struct global probe = *g;
        probe.deadline_ms = leftMs(end);
        probeDiscover(&probe, false, d);
        if (probeOfNode(d->probes, d->n, &d->v, d->v.leader) != NULL ||
            everyNodeRefused(d) != NULL) {
            return true;
        }
        if (callNowMs() + 100 >= end) {
            return false;
        }
        probeDiscoveryFree(d);
        callSleepMs(100);
    }
}

/* Warns on stderr of what discovery d shows makes a promote of `promotee` time out: it
 * does not answer, or its addresses are wrong (probeMemberMismatch()). */
static void warnPromotee(const struct discovery *d, uint64_t promotee)
{
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        if (p->rv != IDEM_OK && probeId(p, &d->v) == promotee) {
            fprintf(stderr,
                    "idemctl: warning: node %" PRIu64 " (%s) did not answer: %s; Raft catches a "
                    "node up before it votes, so a node that is down makes the promote time "
                    "out\n",
                    promotee, p->addr, p->err[0] ? p->err : idem_strerror(p->rv));
        }
    }
    const Idem__Member *pm = probeViewMember(&d->v, promotee, NULL);
    char why[2048];
    if (pm != NULL && probeMemberMismatch(d->probes, d->n, &d->v, pm, why, sizeof why)) {
        fprintf(stderr, "idemctl: warning: %s\n", why);
    }
}

/* Where leaderCall() sends its request first: the leader that a discovery (pre, borrowed,
 * or a new one) shows, its address in addr (OUT) and its ID in *node_id (OUT; 0 when it
 * refused the token); with `promotee` (not 0), what makes a promote of it time out is said
 * first. EXIT_ANSWERED, or the exit status of no leader (reported; `what`: the command). */
static int leaderFirst(const struct global *g, const char *what, uint64_t promotee,
                       const struct discovery *pre, char *addr, size_t addr_len, uint64_t *node_id)
{
    struct discovery d;
    if (pre != NULL) {
        d = *pre; /* a shallow copy: freed by the caller, never here */
    } else {
        probeDiscover(g, false, &d);
    }
    /* The leader answered as leader, or refused the token (buildView()). */
    const struct probe *lp = probeOfNode(d.probes, d.n, &d.v, d.v.leader);
    if (lp == NULL) {
        /* A token every node refused: that node's answer to the request itself (forbidden
         * or unauthenticated, nothing changed). */
        lp = everyNodeRefused(&d);
    }
    int code = EXIT_ANSWERED;
    if (lp == NULL) {
        code = leaderNone(g, &d, what, "");
    } else {
        snprintf(addr, addr_len, "%s", lp->addr);
        *node_id = probeStatus(lp) != NULL ? d.v.leader : 0;
        if (promotee != 0) {
            warnPromotee(&d, promotee);
        }
    }
    if (pre == NULL) {
        probeDiscoveryFree(&d);
    }
    return code;
}

/* The ID of the node at `addr` (a redirect's) when status, asked within `end`, shows it as
 * the leader; 0 otherwise. */
static uint64_t redirectLeaderId(const struct global *g, uint64_t end, const char *addr)
{
    struct global probe = *g;
    probe.deadline_ms = leftMs(end);
    struct discovery d;
    probeDiscover(&probe, false, &d);
    const Idem__Member *m = probeViewMember(&d.v, 0, addr);
    uint64_t id = m != NULL && m->id == d.v.leader ? m->id : 0;
    probeDiscoveryFree(&d);
    return id;
}

/* Sends `req` (admin) once to the leader that status finds, following one redirect should
 * leadership move in between, and without retries: a membership change or a transfer
 * that failed or timed out is not started again behind the operator's back (a transfer to
 * a node that cannot take over cost the cluster an election each time). On an answer
 * returns EXIT_ANSWERED with *resp (OUT; free with idem__response__free_unpacked), and
 * *node_id (OUT) the leader's ID as status found it; an `unavailable` answer is reported
 * as exit 3 with the leader's own words, except that a transfer answered "did not move"
 * which leadership then left all the same returns EXIT_MOVED with *node_id the new
 * leader. `promotee` (0: none) is a node to be promoted:
 * when it did not answer idemctl either, a warning says so before the request goes.
 * A membership change answered `unavailable` with retry_after_ms (raft refused it before
 * starting anything: the last change is not committed yet, as on a leader elected a moment
 * ago) is sent again after that long, within the deadline. `pre` (NULL: none): a discovery
 * just made, used instead of a new one (borrowed), so that a node that does not answer
 * costs one deadline, not two. */
int leaderCall(const struct global *g, const char *what, uint64_t promotee,
               const Idem__Request *req, Idem__Response **resp, uint64_t *node_id,
               const struct discovery *pre)
{
    *resp = NULL;
    *node_id = 0;
    if (g->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    char addr[ADDR_MAX];
    int first = leaderFirst(g, what, promotee, pre, addr, sizeof addr, node_id);
    if (first != EXIT_ANSWERED) {
        return first;
    }
    uint64_t end = callNowMs() + g->deadline_ms;
    struct global once = *g;
    bool redirected = false, resent = false;
    for (;;) {
        int code = callSend(&once, true, addr, req, resp);
        if (code != EXIT_ANSWERED) {
            return code;
        }
        Idem__Outcome out = idem_response_outcome(*resp);
        uint64_t wait = (*resp)->result != NULL ? (*resp)->result->retry_after_ms : 0;
        const char *redirect = (*resp)->leader_rpc_address;
        bool later =
            out == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && wait > 0 && callNowMs() + wait + 1 < end;
        if (later && req->op_case == IDEM__REQUEST__OP_MEMBERS) {
            /* Refused before anything started (the last change not committed yet): the
             * same leader is asked again; a move in between answers not_leader below. */
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            callSleepMs(wait);
            once.deadline_ms = leftMs(end);
            continue;
        }
        bool not_moved = later && req->op_case == IDEM__REQUEST__OP_TRANSFER;
        if (not_moved || (resent && out == IDEM__OUTCOME__OUTCOME_NOT_LEADER)) {
            /* A transfer that did not move leadership (to a voter the leader hears from),
             * or, sent again, found that it had moved since. The election may still end
             * with a new leader after raft's timeout: status tells, and the request goes
             * again only to a leader that status shows is still the one asked (a new one
             * would move leadership a second time, or refuse NODE_ID as already the
             * leader); never to a redirect. */
            if (not_moved) {
                callSleepMs(wait);
            }
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            uint64_t asked = *node_id;
            code = settledLeader(g, end, asked, addr, sizeof addr, node_id);
            if (code != EXIT_ANSWERED) {
                return code;
            }
            once.deadline_ms = leftMs(end);
            resent = true;
            continue;
        }
        if (out == IDEM__OUTCOME__OUTCOME_NOT_LEADER && !redirected && !resent &&
            redirect != NULL && redirect[0] != '\0' && strlen(redirect) < sizeof addr) {
            /* Leadership moved between status and the request: the new leader's ID, if
             * status already shows it there, so that a "did not move" answer from it can
             * be told from a move. */
            snprintf(addr, sizeof addr, "%s", redirect);
            redirected = true;
            idem__response__free_unpacked(*resp, NULL); /* and redirect: addr is a copy */
            *resp = NULL;
            *node_id = redirectLeaderId(g, end, addr);
            if (req->op_case == IDEM__REQUEST__OP_MEMBERS &&
                req->members->action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE &&
                (*node_id == 0 || *node_id == req->members->id)) {
                /* Leadership moved to the node being removed (or to one status does not
                 * show yet): sent there, the removal would take out a leader without
                 * handing leadership over first. Nothing was removed; a new run does that. */
                char msg[ADDR_MAX + 400];
                snprintf(msg, sizeof msg,
                         "leadership moved to %s while the removal was sent, %s; nothing was "
                         "removed: run the command again (it hands leadership over first when "
                         "node %" PRIu64 " leads)",
                         addr,
                         *node_id == 0 ? "and status does not show it as leader yet"
                                       : "the node being removed",
                         req->members->id);
                return outFailCall(g, IDEM_EUNAVAILABLE, msg);
            }
            continue;
        }
        if (out == IDEM__OUTCOME__OUTCOME_UNAVAILABLE || out == IDEM__OUTCOME__OUTCOME_NOT_LEADER) {
            const char *said = (*resp)->error != NULL ? (*resp)->error : "";
            char msg[600];
            snprintf(msg, sizeof msg, "%s: %s%s", addr,
                     out == IDEM__OUTCOME__OUTCOME_NOT_LEADER ? "leadership moved twice: " : "",
                     said[0] ? said : "unavailable");
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            return outFailCall(g, IDEM_EUNAVAILABLE, msg);
        }
        return EXIT_ANSWERED;
    }
}

/* Why the leader refused to hand leadership to `id`, or (transfer false) to promote or
 * remove it (it answered invalid, and raft says only "server ID is not valid"): what status
 * shows of the node, in why (OUT). False when status does not tell. */
static bool idRefusal(const struct global *g, uint64_t id, bool transfer, char *why, size_t len)
{
    struct discovery d;
    probeDiscover(g, false, &d);
    const struct clusterView *v = &d.v;
    const Idem__Member *m = probeViewMember(v, id, NULL);
    bool known = v->members_of != NULL;
    if (!known) {
        /* nothing to say */
    } else if (m == NULL) {
        size_t k = (size_t)snprintf(why, len, "node %" PRIu64 " is not a member (members:", id);
        for (size_t i = 0; i < v->members_of->n_members && k < len; i++) {
            k += (size_t)snprintf(why + k, len - k, "%s %" PRIu64, i ? "," : "",
                                  v->members_of->members[i]->id);
        }
        if (k < len) {
            snprintf(why + k, len - k, ")");
        }
    } else if (!transfer) {
        known = false;
    } else if (id == v->leader) {
        snprintf(why, len, "node %" PRIu64 " is already the leader", id);
    } else if (strcmp(m->role, "voter") != 0) {
        snprintf(why, len, "node %" PRIu64 " is not a voter (role %s)", id, m->role);
    } else {
        known = false;
    }
    probeDiscoveryFree(&d);
    return known;
}

/* An invalid answer about node `id` (o: its JSON) whose reason status can tell: "error"
 * becomes that reason, and the leader's own words move to "node_error". */
void leaderExplainRefusal(const struct global *g, json_t *o, uint64_t id, bool transfer)
{
    char why[256];
    if (!idRefusal(g, id, transfer, why, sizeof why)) {
        return;
    }
    json_t *said = json_object_get(o, "error");
    if (said != NULL) {
        jset(o, "node_error", json_copy(said));
    }
    jset(o, "error", jstr(why));
}

/* The leader as status shows it (one that answered as leader), 0 when none does. */
uint64_t leaderOfStatus(const struct global *g)
{
    struct discovery d;
    probeDiscover(g, false, &d);
    uint64_t leader = probeOfNode(d.probes, d.n, &d.v, d.v.leader) != NULL ? d.v.leader : 0;
    probeDiscoveryFree(&d);
    return leader;
}
