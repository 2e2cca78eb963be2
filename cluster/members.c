/* members: the members' addresses (the metadata the leader puts in the log, so that any
 * node can redirect to any member), membership changes and leadership transfer. */
#include "cluster_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void copyAddr(char dst[CLUSTER_ADDR_MAX], const char *src)
{
    snprintf(dst, CLUSTER_ADDR_MAX, "%s", src ? src : "");
}

/* ---- member metadata ----------------------------------------------------------------- */

struct memberMeta *members_find(struct cluster *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_meta; i++) {
        if (c->meta[i].m.id == id) {
            return &c->meta[i];
        }
    }
    return NULL;
}

/* A slot whose member left the configuration (the lowest such id, so that replicas that
 * applied the same entries pick the same one), or NULL. */
static struct memberMeta *metaRecycle(struct cluster *c)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    struct memberMeta *pick = NULL;
    for (size_t i = 0; i < c->n_meta; i++) {
        bool member = false;
        for (unsigned j = 0; j < conf->n; j++) {
            member = member || conf->servers[j].id == c->meta[i].m.id;
        }
        if (!member && (pick == NULL || c->meta[i].m.id < pick->m.id)) {
            pick = &c->meta[i];
        }
    }
    return pick;
}

struct memberMeta *members_put(struct cluster *c, uint64_t id, const char *rpc,
                               const char *http)
{
    struct memberMeta *mm = members_find(c, id);
    if (mm == NULL) {
        if (c->n_meta == CLUSTER_MEMBERS_MAX) {
            mm = metaRecycle(c);
            if (mm == NULL) {
                return NULL;
            }
        } else {
            mm = &c->meta[c->n_meta++];
        }
        memset(mm, 0, sizeof(*mm));
        mm->m.id = id;
        mm->m.role = -1;
    }
    copyAddr(mm->m.rpc_address, rpc);
    copyAddr(mm->m.http_address, http);
    return mm;
}

/* A MemberInfo entry was applied: its addresses are in the replicated state now. */
void members_apply_info(struct cluster *c, const Idem__MemberInfo *mi)
{
    struct memberMeta *mm = members_put(c, mi->id, mi->rpc_address, mi->http_address);
    if (mm != NULL) {
        mm->logged = true;
        mm->proposed = false;
    }
}

static int proposeMemberInfo(struct cluster *c, const struct cluster_member *m)
{
    Idem__MemberInfo mi = IDEM__MEMBER_INFO__INIT;
    mi.id = m->id;
    mi.rpc_address = (char *)m->rpc_address;
    mi.http_address = (char *)m->http_address;
    Idem__LogEntry e = IDEM__LOG_ENTRY__INIT;
    e.kind_case = IDEM__LOG_ENTRY__KIND_MEMBER;
    e.member = &mi;
    return batch_propose_internal(c, &e);
}

void members_tick(struct cluster *c)
{
    /* The leader makes sure every member's addresses are in the log, so that any node
     * (including one that joins later and replays the log) can redirect to any member. */
    for (size_t i = 0; i < c->n_meta; i++) {
        struct memberMeta *mm = &c->meta[i];
        if (!mm->logged && !mm->proposed && mm->m.rpc_address[0] != '\0') {
            if (proposeMemberInfo(c, &mm->m) == 0) {
                mm->proposed = true;
            }
        }
    }
}

uint64_t cluster_leader(const struct cluster *c, const char **rpc_address)
{
    raft_id id = 0;
    const char *addr = NULL;
    raft_leader((struct raft *)&c->raft, &id, &addr);
    *rpc_address = "";
    if (id == c->cfg.id && !cluster_leading(c)) {
        return 0; /* stepping down (cluster_leading): not a leader to send anyone to */
    }
    if (id != 0) {
        for (size_t i = 0; i < c->n_meta; i++) {
            if (c->meta[i].m.id == id) {
                *rpc_address = c->meta[i].m.rpc_address;
            }
        }
    }
    return id;
}

static int memberIdCmp(const void *a, const void *b)
{
    uint64_t x = ((const struct cluster_member *)a)->id, y = ((const struct cluster_member *)b)->id;
    return x < y ? -1 : x > y;
}

size_t cluster_members(const struct cluster *c, struct cluster_member *out, size_t cap)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned i;
    for (i = 0; i < conf->n && i < cap; i++) {
        const struct raft_server *s = &conf->servers[i];
        struct cluster_member *m = &out[i];
        memset(m, 0, sizeof(*m));
        m->id = s->id;
        copyAddr(m->raft_address, s->address);
        m->role = s->role;
        for (size_t j = 0; j < c->n_meta; j++) {
            if (c->meta[j].m.id == s->id) {
                copyAddr(m->rpc_address, c->meta[j].m.rpc_address);
                copyAddr(m->http_address, c->meta[j].m.http_address);
            }
        }
    }
    /* Raft keeps them in the order they were added: a member added again comes last. */
    qsort(out, i, sizeof(*out), memberIdCmp);
    return conf->n;
}

/* ---- membership and leadership ------------------------------------------------------- */

static void changeCb(struct raft_change *req, int status)
{
    struct changeReq *cr = req->data;
    struct cluster *c = cr->c;
    c->change_in_flight = false;
    cr->cb(cr->data, status, status == 0 ? "" : raft_strerror(status));
    free(cr);
}

static struct changeReq *changeNew(struct cluster *c, cluster_change_cb cb, void *data)
{
    struct changeReq *cr = cluster_xcalloc(sizeof(*cr));
    cr->c = c;
    cr->cb = cb;
    cr->data = data;
    cr->req.data = cr;
    return cr;
}

static int changeCheck(struct cluster *c)
{
    c->errmsg[0] = '\0';
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (!cluster_is_leader(c)) {
        return CLUSTER_ENOTLEADER;
    }
    if (c->change_in_flight) {
        return CLUSTER_EBUSY;
    }
    if (c->raft.transfer != NULL) {
        /* libraft 0.15 refuses a change during a transfer with RAFT_NOTLEADER, which a
         * client takes for a redirect to this very node (as cluster_transfer says). Checked
         * before an add records the new member's addresses. */
        cluster_set_err(c, "", "a leadership transfer is in progress");
        return CLUSTER_EBUSY;
    }
    return CLUSTER_OK;
}

/* Raft's refusals that are the caller's mistake, not the cluster's state. */
static int raftRefusal(int rv)
{
    switch (rv) {
    case RAFT_BADID:
    case RAFT_DUPLICATEID:
    case RAFT_DUPLICATEADDRESS:
    case RAFT_BADROLE:
    case RAFT_NOTFOUND:
    case RAFT_INVALID:
        return CLUSTER_EINVAL;
    case RAFT_NOTLEADER:
        return CLUSTER_ENOTLEADER;
    case RAFT_CANTCHANGE:
        /* Not a change of this leader's (changeCheck() refused those): one raft has not
         * committed yet, such as the last change when this node has only just been
         * elected; it commits with the leader's first entry. */
        return CLUSTER_ESETTLING;
    default:
        return CLUSTER_ERAFT;
    }
}

/* libraft 0.15 sets its error message on some refusals only, and never clears it: called
 * before a raft_* call whose refusal is reported with raftCallErr(), so that a refusal that
 * set none is not reported with an earlier call's message ("server is already voter" for a
 * remove of an unknown ID after a promote). */
static void raftErrClear(struct cluster *c)
{
    c->raft.errmsg[0] = '\0';
}

/* What the raft_* call after raftErrClear() said when it refused with rv. */
static const char *raftCallErr(struct cluster *c, int rv)
{
    return c->raft.errmsg[0] != '\0' ? raft_errmsg(&c->raft) : raft_strerror(rv);
}

static int changeStarted(struct cluster *c, struct changeReq *cr, int rv)
{
    if (rv != 0) {
        cluster_set_err(c, "", raftCallErr(c, rv));
        free(cr);
        return raftRefusal(rv);
    }
    c->change_in_flight = true;
    return CLUSTER_OK;
}

int cluster_member_add(struct cluster *c, const struct cluster_member *m,
                       cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    if (m->id == 0 || m->raft_address[0] == '\0' || m->rpc_address[0] == '\0') {
        return CLUSTER_EINVAL;
    }
    /* Addresses are compared as text: the service takes only those a node's configuration
     * takes, in their canonical text (config_addr_parse: an IPv4 address and a port without
     * leading zeros, an IPv6 address in RFC 5952's form, a name in lower case), equal when
     * they name the same endpoint (a name and an address it resolves to are not told apart).
     *
     * Refuse what raft would refuse before the addresses reach the log: a MemberInfo for
     * an existing member would overwrite its addresses everywhere. */
    const struct raft_configuration *conf = &c->raft.configuration;
    for (unsigned i = 0; i < conf->n; i++) {
        bool same_id = conf->servers[i].id == m->id;
        if (same_id || strcmp(conf->servers[i].address, m->raft_address) == 0) {
            char why[sizeof c->errmsg];
            snprintf(why, sizeof why, "member %llu has this %s already",
                     (unsigned long long)conf->servers[i].id, same_id ? "id" : "raft address");
            cluster_set_err(c, "", why);
            return CLUSTER_EINVAL;
        }
    }
    /* And any address of the new member that is already one of a member's (or another of
     * its own): clients sent to that RPC address would reach the other node, and status,
     * which finds nodes by address, would not show the new one. */
    const char *mine[3] = {m->raft_address, m->rpc_address, m->http_address};
    for (unsigned a = 0; a < 3; a++) {
        for (unsigned b = a + 1; b < 3; b++) {
            if (mine[a][0] != '\0' && strcmp(mine[a], mine[b]) == 0) {
                cluster_set_err(c, "", "the new member's raft, rpc and http addresses must differ");
                return CLUSTER_EINVAL;
            }
        }
    }
    for (unsigned i = 0; i < conf->n; i++) {
        /* Every member's addresses are in the metadata (this node's own put at start);
         * one whose MemberInfo was never applied is compared by its raft address only. */
        const struct memberMeta *om = members_find(c, conf->servers[i].id);
        const char *theirs[3] = {conf->servers[i].address, om != NULL ? om->m.rpc_address : "",
                                 om != NULL ? om->m.http_address : ""};
        for (unsigned a = 0; a < 3; a++) {
            for (unsigned b = 0; b < 3; b++) {
                if (mine[a][0] != '\0' && strcmp(mine[a], theirs[b]) == 0) {
                    char why[sizeof c->errmsg];
                    snprintf(why, sizeof why, "address %.200s is member %llu's already", mine[a],
                             (unsigned long long)conf->servers[i].id);
                    cluster_set_err(c, "", why);
                    return CLUSTER_EINVAL;
                }
            }
        }
    }
    struct memberMeta *mm = members_put(c, m->id, m->rpc_address, m->http_address);
    if (mm == NULL) {
        cluster_set_err(c, "", "too many members");
        return CLUSTER_EINVAL;
    }
    /* The addresses go in the log first, so that the new member is known everywhere by
     * the time it is part of the configuration. */
    if (proposeMemberInfo(c, m) == 0) {
        mm->proposed = true;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_add(&c->raft, &cr->req, m->id, m->raft_address, changeCb));
}

int cluster_member_promote(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_assign(&c->raft, &cr->req, id, RAFT_VOTER, changeCb));
}

int cluster_member_remove(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    /* libraft 0.15 removes the last voter too: the cluster could then never elect a leader
     * again, restarts included, and every record would be out of reach for good. */
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned voters = 0;
    bool target_votes = false;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].role == RAFT_VOTER) {
            voters++;
            target_votes = target_votes || conf->servers[i].id == id;
        }
    }
    if (target_votes && voters == 1) {
        char why[160];
        snprintf(why, sizeof why,
                 "node %llu is the last voter: the cluster would have none (add and promote "
                 "another node first)",
                 (unsigned long long)id);
        cluster_set_err(c, "", why);
        return CLUSTER_EINVAL;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_remove(&c->raft, &cr->req, id, changeCb));
}

static void transferCb(struct raft_transfer *req)
{
    struct transferReq *tr = req->data;
    struct cluster *c = tr->c;
    raft_id lid = 0;
    const char *addr = NULL;
    raft_leader(&c->raft, &lid, &addr);
    bool moved = lid != 0 && lid != c->cfg.id;
    tr->cb(tr->data, moved ? 0 : RAFT_NOTLEADER, moved ? "" : "leadership did not move");
    free(tr);
}

int cluster_transfer(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    c->errmsg[0] = '\0';
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (!cluster_is_leader(c)) {
        return CLUSTER_ENOTLEADER;
    }
    if (c->raft.transfer != NULL) {
        /* raft_transfer would answer RAFT_NOTLEADER, which a client takes for a redirect
         * to this very node, over and over until its deadline. */
        cluster_set_err(c, "", "a leadership transfer is already in progress");
        return CLUSTER_EBUSY;
    }
    /* libraft 0.15 starts a transfer to a voter that is down, too (and picks one for "any"
     * when it holds the most entries): the leader then takes no proposals until the
     * transfer times out, and the cluster was seen without a leader for an election
     * timeout after it (test_transfer_to_a_down_node_is_refused). Only a voter
     * this node has heard from within an election timeout is asked to take over. For
     * "any", raft's own pick (the one with the most entries) while every other voter is
     * heard from, else the first one that is. */
    const struct raft_configuration *conf = &c->raft.configuration;
    uint64_t fresh_ms = c->cfg.election_timeout_ms;
    if (id == 0) {
        raft_id first_fresh = 0;
        bool all_fresh = true;
        for (unsigned i = 0; i < conf->n; i++) {
            const struct raft_server *sv = &conf->servers[i];
            if (sv->role != RAFT_VOTER || sv->id == c->cfg.id) {
                continue;
            }
            bool fresh = io_heard_ago_ms(&c->io, sv->id) <= fresh_ms;
            all_fresh = all_fresh && fresh;
            if (fresh && first_fresh == 0) {
                first_fresh = sv->id;
            }
        }
        id = all_fresh ? 0 : first_fresh;
        if (first_fresh == 0) {
            char why[160];
            snprintf(why, sizeof why,
                     "no other voter has been heard from in the last %llu ms",
                     (unsigned long long)fresh_ms);
            cluster_set_err(c, "", why);
            return CLUSTER_EUNREACHABLE;
        }
    } else if (id != c->cfg.id) {
        uint64_t ago = io_heard_ago_ms(&c->io, id);
        for (unsigned i = 0; i < conf->n; i++) {
            if (conf->servers[i].id == id && conf->servers[i].role == RAFT_VOTER &&
                ago > fresh_ms) {
                char why[200];
                if (ago == UINT64_MAX) {
                    snprintf(why, sizeof why,
                             "node %llu has not been heard from since this node started: it "
                             "looks down or unreachable",
                             (unsigned long long)id);
                } else {
                    snprintf(why, sizeof why,
                             "node %llu has not been heard from for %llu ms: it looks down "
                             "or unreachable",
                             (unsigned long long)id, (unsigned long long)ago);
                }
                cluster_set_err(c, "", why);
                return CLUSTER_EUNREACHABLE;
            }
        }
    }
    struct transferReq *tr = cluster_xcalloc(sizeof(*tr));
    tr->c = c;
    tr->cb = cb;
    tr->data = data;
    tr->req.data = tr;
    raftErrClear(c);
    /* A batch still open (waiting for its group commit, batch.c) is not proposed now: raft
     * refuses it once the transfer began, and its commands are answered that they never went
     * in (a definite answer, safe to send again), where proposed now they would most often
     * be answered "leadership lost before commit", an outcome not known. */
    int rv = raft_transfer(&c->raft, &tr->req, id, transferCb);
    if (rv != 0) {
        cluster_set_err(c, "", raftCallErr(c, rv));
        free(tr);
        return raftRefusal(rv);
    }
    return CLUSTER_OK;
}
