/* probe: status discovery, what `idemctl status` and every command that finds the leader
 * first do: ask every node for its status in parallel, keep one answer per node, and
 * conclude who leads, the configuration and the quorum (struct clusterView). Also whether a
 * member's addresses reach the node meant (probeMemberMismatch()).
 *
 * Every address of --cluster is asked in parallel, each by its own client (a client is not
 * thread-safe), so that a silent node costs one deadline, not one each. A second round
 * asks the members those answers name that --cluster did not list, so that the report
 * covers the whole cluster. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "idemctl.h"

/* A probe's thread: asks the node at p->addr for its status, into p->rv, resp and err. */
static void *probeRun(void *arg)
{
    struct probe *p = arg;
    struct idem_client *c = NULL;
    char why[256];
    p->rv = callClientOpen(p->g, p->addr, p->token, &c, why, sizeof why);
    if (p->rv != IDEM_OK) {
        snprintf(p->err, sizeof p->err, "%s: %s", idem_strerror(p->rv), why);
        return NULL;
    }
    Idem__StatusRequest sr = IDEM__STATUS_REQUEST__INIT;
    sr.digest = p->digest;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_STATUS;
    req.status = &sr;
    p->rv = idem_call_node(c, p->addr, &req, p->deadline_ms, &p->resp);
    snprintf(p->err, sizeof p->err, "%s", idem_client_errmsg(c));
    idem_client_close(c);
    return NULL;
}

/* Asks probes[from..to) in parallel and waits for every answer. */
static void probeAll(struct probe *probes, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        probes[i].started = pthread_create(&probes[i].thread, NULL, probeRun, &probes[i]) == 0;
        if (!probes[i].started) {
            probeRun(&probes[i]); /* no thread: ask it from here */
        }
    }
    for (size_t i = from; i < to; i++) {
        if (probes[i].started) {
            pthread_join(probes[i].thread, NULL);
        }
    }
}

/* Whether probes[0..n) list the address of `len` bytes at addr. */
static bool addrListed(const struct probe *probes, size_t n, const char *addr, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(probes[i].addr) == len && memcmp(probes[i].addr, addr, len) == 0) {
            return true;
        }
    }
    return false;
}

size_t probeClusterAddrs(const char *cluster, char addrs[][ADDR_MAX], size_t max)
{
    size_t n = 0;
    const char *s = cluster;
    while (n < max) {
        const char *end = strchr(s, ',');
        if (end == NULL) {
            end = s + strlen(s);
        }
        const char *b = s, *e = end;
        while (b < e && (*b == ' ' || *b == '\t')) {
            b++;
        }
        while (e > b && (e[-1] == ' ' || e[-1] == '\t')) {
            e--;
        }
        size_t len = (size_t)(e - b);
        if (len >= ADDR_MAX) {
            cli_usage_error("--cluster: address too long");
        }
        bool listed = len == 0;
        for (size_t i = 0; i < n && !listed; i++) {
            listed = strlen(addrs[i]) == len && memcmp(addrs[i], b, len) == 0;
        }
        if (!listed) {
            memcpy(addrs[n], b, len);
            addrs[n][len] = '\0';
            n++;
        }
        if (*end == '\0') {
            break;
        }
        s = end + 1;
    }
    return n;
}

/* probeClusterAddrs into probes[].addr; returns how many. */
static size_t splitCluster(const char *cluster, struct probe *probes, size_t max)
{
    static char addrs[IDEM_NODES_MAX][ADDR_MAX];
    size_t n = probeClusterAddrs(cluster, addrs, max < IDEM_NODES_MAX ? max : IDEM_NODES_MAX);
    for (size_t i = 0; i < n; i++) {
        memcpy(probes[i].addr, addrs[i], ADDR_MAX);
    }
    return n;
}

/* The node's own status when it answered one, else NULL. */
const Idem__NodeStatus *probeStatus(const struct probe *p)
{
    if (p->rv != IDEM_OK || p->resp == NULL || p->resp->status == NULL) {
        return NULL;
    }
    Idem__Outcome o = idem_response_outcome(p->resp);
    return o == IDEM__OUTCOME__OUTCOME_OK || o == IDEM__OUTCOME__OUTCOME_UNSPECIFIED
               ? p->resp->status
               : NULL;
}

/* Whether the node answered, refusing the admin token (unauthenticated or forbidden). */
bool probeRefused(const struct probe *p)
{
    if (p->rv != IDEM_OK || p->resp == NULL) {
        return false;
    }
    Idem__Outcome o = idem_response_outcome(p->resp);
    return o == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED || o == IDEM__OUTCOME__OUTCOME_FORBIDDEN;
}

/* Keeps one probe per node ID, since two addresses can name one node ("localhost:7001"
 * and "127.0.0.1:7001"): the one at the node's own rpc_address, else the first. Frees the
 * others' answers; returns how many are left. */
static size_t dropDuplicateIds(struct probe *probes, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *si = probeStatus(&probes[i]);
        size_t j = 0;
        while (si != NULL && j < k &&
               (probeStatus(&probes[j]) == NULL || probeStatus(&probes[j])->id != si->id)) {
            j++;
        }
        if (si == NULL || j == k) {
            if (k != i) {
                probes[k] = probes[i];
            }
            k++;
            continue;
        }
        if (strcmp(probes[j].addr, probeStatus(&probes[j])->rpc_address) != 0 &&
            strcmp(probes[i].addr, si->rpc_address) == 0) {
            struct probe keep = probes[i];
            probes[i] = probes[j];
            probes[j] = keep;
        }
        if (probes[i].resp != NULL) {
            idem__response__free_unpacked(probes[i].resp, NULL);
            probes[i].resp = NULL;
        }
    }
    return k;
}

/* Splits "host:port" or "[v6]:port" into host and port (OUT); false when it is neither. */
static bool splitHostPort(const char *addr, char *host, size_t hlen, char *port, size_t plen)
{
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon[1] == '\0') {
        return false;
    }
    const char *h = addr;
    size_t len = (size_t)(colon - addr);
    if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len == 0 || len >= hlen || strlen(colon + 1) >= plen) {
        return false;
    }
    memcpy(host, h, len);
    host[len] = '\0';
    snprintf(port, plen, "%s", colon + 1);
    return true;
}

/* Whether two sockaddrs are the same IP address and port. */
static bool sameSockaddr(const struct sockaddr *x, const struct sockaddr *y)
{
    if (x->sa_family != y->sa_family) {
        return false;
    }
    if (x->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)x;
        const struct sockaddr_in *b = (const struct sockaddr_in *)(const void *)y;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (x->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)x;
        const struct sockaddr_in6 *b = (const struct sockaddr_in6 *)(const void *)y;
        return a->sin6_port == b->sin6_port &&
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
    }
    return false;
}

/* Whether the addresses a and b ("host:port") name a common endpoint, as getaddrinfo()
 * resolves them ("localhost:7003" and "127.0.0.1:7003"; numeric IPs as they are). */
static bool sameEndpoint(const char *a, const char *b)
{
    char ha[ADDR_MAX], pa[16], hb[ADDR_MAX], pb[16];
    if (!splitHostPort(a, ha, sizeof ha, pa, sizeof pa) ||
        !splitHostPort(b, hb, sizeof hb, pb, sizeof pb)) {
        return false;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *ra = NULL, *rb = NULL;
    bool same = false;
    if (getaddrinfo(ha, pa, &hints, &ra) == 0 && getaddrinfo(hb, pb, &hints, &rb) == 0) {
        for (const struct addrinfo *x = ra; x != NULL && !same; x = x->ai_next) {
            for (const struct addrinfo *y = rb; y != NULL && !same; y = y->ai_next) {
                same = sameSockaddr(x->ai_addr, y->ai_addr);
            }
        }
    }
    if (ra != NULL) {
        freeaddrinfo(ra);
    }
    if (rb != NULL) {
        freeaddrinfo(rb);
    }
    return same;
}

/* Whether `addr` is the rpc_address of a member in any status of probes[0..n). */
static bool memberAddress(const struct probe *probes, size_t n, const char *addr)
{
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        for (size_t k = 0; st != NULL && k < st->n_members; k++) {
            if (strcmp(st->members[k]->rpc_address, addr) == 0) {
                return true;
            }
        }
    }
    return false;
}

/* Drops each probe that got no status (a node that is down, or refused the token) at an
 * address that is no member's rpc_address but names the same endpoint as a member's that
 * was asked too: "localhost:7003" in --cluster for the member at "127.0.0.1:7003" (the
 * second round asks that one). No node ID tells that they are one node, and it would show
 * twice. The member's probe is kept; a refusal is not dropped for a probe that got no
 * answer. Frees the dropped answers; returns how many are left. */
static size_t dropAliases(struct probe *probes, size_t n)
{
    bool *drop = calloc(n ? n : 1, sizeof *drop);
    if (drop == NULL) {
        outOom();
    }
    for (size_t i = 0; i < n; i++) {
        const struct probe *p = &probes[i];
        if (probeStatus(p) != NULL || memberAddress(probes, n, p->addr)) {
            continue;
        }
        for (size_t j = 0; j < n && !drop[i]; j++) {
            const struct probe *q = &probes[j];
            drop[i] = j != i && !drop[j] && !(probeRefused(p) && q->rv != IDEM_OK) &&
                      memberAddress(probes, n, q->addr) && sameEndpoint(p->addr, q->addr);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (drop[i]) {
            if (probes[i].resp != NULL) {
                idem__response__free_unpacked(probes[i].resp, NULL);
                probes[i].resp = NULL;
            }
            continue;
        }
        if (k != i) {
            probes[k] = probes[i];
        }
        k++;
    }
    free(drop);
    return k;
}

const Idem__Member *probeViewMember(const struct clusterView *v, uint64_t id,
                                    const char *rpc_address)
{
    if (v->members_of == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if ((id != 0 && m->id == id) ||
            (id == 0 && rpc_address != NULL && strcmp(m->rpc_address, rpc_address) == 0)) {
            return m;
        }
    }
    return NULL;
}

/* A probe's node ID: from its status answer, else (a node that refused the admin token,
 * or did not answer) from its address in the configuration; 0 when neither tells. */
uint64_t probeId(const struct probe *p, const struct clusterView *v)
{
    const Idem__NodeStatus *st = probeStatus(p);
    if (st != NULL) {
        return st->id;
    }
    const Idem__Member *m = probeViewMember(v, 0, p->addr);
    return m != NULL ? m->id : 0;
}

/* The probe of node `id` that answered, with its status or refusing the admin token; NULL
 * when none did (or `id` is 0). */
const struct probe *probeOfNode(const struct probe *probes, size_t n, const struct clusterView *v,
                                uint64_t id)
{
    for (size_t i = 0; id != 0 && i < n; i++) {
        const struct probe *p = &probes[i];
        if ((probeStatus(p) != NULL || probeRefused(p)) && probeId(p, v) == id) {
            return p;
        }
    }
    return NULL;
}

/* Whether the node that answered st is a voter in its own configuration. A spare is sent
 * no heartbeats and knows no leader; a removed node that still runs, or one not added yet,
 * may know none or an old one: their answers do not say which leader the cluster follows. */
static bool selfVoter(const Idem__NodeStatus *st)
{
    for (size_t i = 0; i < st->n_members; i++) {
        if (st->members[i]->id == st->id) {
            return strcmp(st->members[i]->role, "voter") == 0;
        }
    }
    return false;
}

static void buildView(const struct probe *probes, size_t n, struct clusterView *v)
{
    memset(v, 0, sizeof *v);
    /* The leader is the id that a majority of the reachable voters report (of the reachable
     * nodes, when none of them says it is a voter). */
    size_t reachable = 0, voters = 0;
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        reachable += st != NULL;
        voters += st != NULL && selfVoter(st);
    }
    bool by_voters = voters > 0;
    if (by_voters) {
        reachable = voters;
    }
    for (size_t i = 0; i < n && v->leader == 0; i++) {
        const Idem__NodeStatus *si = probeStatus(&probes[i]);
        if (si == NULL || si->leader_id == 0) {
            continue;
        }
        size_t votes = 0;
        for (size_t j = 0; j < n; j++) {
            const Idem__NodeStatus *sj = probeStatus(&probes[j]);
            votes += sj != NULL && (!by_voters || selfVoter(sj)) && sj->leader_id == si->leader_id;
        }
        if (2 * votes > reachable) {
            v->leader = si->leader_id;
        }
    }
    /* The configuration: the leader's, else the most advanced reachable node's. */
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        if (st == NULL) {
            continue;
        }
        if (v->leader != 0 && st->id == v->leader) {
            v->leader_st = st;
        }
        if (v->members_of == NULL || st->term > v->members_of->term ||
            (st->term == v->members_of->term && st->applied_index > v->members_of->applied_index)) {
            v->members_of = st;
        }
    }
    if (v->leader_st != NULL && strcmp(v->leader_st->role, "leader") == 0) {
        v->members_of = v->leader_st;
    } else if (v->leader_st == NULL && probeOfNode(probes, n, v, v->leader) != NULL) {
        /* It refused the token: the others follow it and it is up, but it cannot be asked
         * with this token. */
    } else {
        /* Followers remember a leader for an election timeout after it died. */
        v->unreachable_leader = v->leader;
        v->leader = 0;
        v->leader_st = NULL;
    }
    if (v->members_of == NULL) {
        return;
    }
    for (size_t i = 0; i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if (strcmp(m->role, "voter") != 0) {
            continue;
        }
        v->voters++;
        /* By address, not by probeId(): two members may share an RPC address (members add
         * refuses it now, but a cluster configured before may have them), and a refusal
         * there counts for both. */
        for (size_t j = 0; j < n; j++) {
            const Idem__NodeStatus *st = probeStatus(&probes[j]);
            if ((st != NULL && st->id == m->id) ||
                (probeRefused(&probes[j]) && strcmp(probes[j].addr, m->rpc_address) == 0)) {
                v->reachable_voters++;
                break;
            }
        }
    }
}

/* The status of the node that answers at `rpc`: asked at that address, else one that
 * names it as its own rpc_address (asked at another spelling of it); NULL when none did. */
const Idem__NodeStatus *probeAnswerAt(const struct probe *probes, size_t n, const char *rpc)
{
    for (size_t i = 0; i < n; i++) {
        if (probeStatus(&probes[i]) != NULL && strcmp(probes[i].addr, rpc) == 0) {
            return probeStatus(&probes[i]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        if (st != NULL && strcmp(st->rpc_address, rpc) == 0) {
            return st;
        }
    }
    return NULL;
}

/* `idemctl members add ID RAFT RPC [HTTP]` with node st's own addresses, into out. */
void probeAddCommand(const Idem__NodeStatus *st, char *out, size_t len)
{
    snprintf(out, len, "idemctl members add %" PRIu64 " %s %s%s%s", st->id, st->raft_address,
             st->rpc_address, st->http_address[0] ? " " : "", st->http_address);
}

/* Whether a member's configured raft address reaches a node that says it listens at `own`:
 * the same, or the same port when the node gives a wildcard as its address (0.0.0.0, [::]). */
static bool raftAddressReaches(const char *configured, const char *own)
{
    const char *c = strrchr(configured, ':');
    return strcmp(configured, own) == 0 ||
           (c != NULL && strncmp(own, "0.0.0.0:", 8) == 0 && strcmp(c, own + 7) == 0) ||
           (c != NULL && strncmp(own, "[::]:", 5) == 0 && strcmp(c, own + 4) == 0);
}

/* Whether member m's addresses are wrong, as the node answering at its rpc address tells:
 * it is another node (the ID given to `members add`, or the address, is wrong), or it
 * listens for Raft at another address than m's (a wrong raft address). Either way Raft
 * does not reach m, and a promote of m times out: what is wrong and what to do go to why
 * (OUT). Nothing when no node answers there (status says that it is unreachable), nor when
 * the node follows the leader: then Raft reaches it, whatever its raft address reads (an
 * address translated on the way). */
bool probeMemberMismatch(const struct probe *probes, size_t n, const struct clusterView *v,
                         const Idem__Member *m, char *why, size_t len)
{
    const Idem__NodeStatus *st = probeAnswerAt(probes, n, m->rpc_address);
    if (st == NULL) {
        return false;
    }
    char add[4 * ADDR_MAX];
    probeAddCommand(st, add, sizeof add);
    if (st->id != m->id && probeViewMember(v, st->id, NULL) != NULL) {
        snprintf(why, len,
                 "member %" PRIu64 "'s rpc address %s is answered by node %" PRIu64
                 ", another member: member %" PRIu64 "'s addresses are wrong, and Raft cannot "
                 "reach member %" PRIu64 " there (a promote times out); `idemctl members remove "
                 "%" PRIu64 "`, then add the node meant for it with its own id and addresses",
                 m->id, m->rpc_address, st->id, m->id, m->id, m->id);
        return true;
    }
    if (st->id != m->id) {
        snprintf(why, len,
                 "member %" PRIu64 "'s rpc address %s is answered by node %" PRIu64
                 ": the id given to `members add` (or the address) is wrong, and Raft cannot "
                 "reach member %" PRIu64 " there (a promote times out); `idemctl members "
                 "remove %" PRIu64 "`, then `%s` (node %" PRIu64 "'s own addresses)",
                 m->id, m->rpc_address, st->id, m->id, m->id, add, st->id);
        return true;
    }
    bool follows = v->leader != 0 && st->leader_id == v->leader;
    if (!raftAddressReaches(m->raft_address, st->raft_address) && !follows) {
        snprintf(why, len,
                 "member %" PRIu64 "'s raft address is %s in the Raft configuration, but node "
                 "%" PRIu64 " (%s) listens for Raft at %s: the raft address given to `members "
                 "add` is wrong, and Raft cannot reach member %" PRIu64 " (a promote times "
                 "out); `idemctl members remove %" PRIu64 "`, then `%s`",
                 m->id, m->raft_address, st->id, m->rpc_address, st->raft_address, m->id, m->id,
                 add);
        return true;
    }
    return false;
}

/* Asks every node of --cluster (each address once), then the members their answers name
 * that --cluster did not list, for its status (with its digest when `digest`), keeps one
 * answer per node ID and builds the view. Free with probeDiscoveryFree(). */
void probeDiscover(const struct global *g, bool digest, struct discovery *d)
{
    struct probe *probes = calloc(IDEM_NODES_MAX, sizeof *probes);
    if (probes == NULL) {
        outOom();
    }
    size_t n = splitCluster(g->cluster, probes, IDEM_NODES_MAX);
    for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
        probes[i].g = g;
        probes[i].token = g->admin_token;
        probes[i].digest = digest;
        probes[i].deadline_ms = g->deadline_ms;
    }
    probeAll(probes, 0, n);
    /* Second round: members the answers name that --cluster did not list. */
    size_t listed = n;
    for (size_t i = 0; i < listed; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        for (size_t k = 0; st != NULL && k < st->n_members && n < IDEM_NODES_MAX; k++) {
            const char *addr = st->members[k]->rpc_address;
            size_t len = strlen(addr);
            if (len > 0 && len < sizeof probes[n].addr && !addrListed(probes, n, addr, len)) {
                snprintf(probes[n++].addr, sizeof probes[0].addr, "%s", addr);
            }
        }
    }
    probeAll(probes, listed, n);
    d->probes = probes;
    n = dropDuplicateIds(probes, n);
    d->n = dropAliases(probes, n);
    buildView(probes, d->n, &d->v);
}

void probeAgain(const struct global *g, struct probe *probes, size_t n, uint32_t deadline_ms)
{
    for (size_t i = 0; i < n; i++) {
        if (probes[i].resp != NULL) {
            idem__response__free_unpacked(probes[i].resp, NULL);
        }
        probes[i].resp = NULL;
        probes[i].rv = IDEM_OK;
        probes[i].err[0] = '\0';
        probes[i].g = g;
        probes[i].token = g->admin_token;
        probes[i].digest = false;
        probes[i].deadline_ms = deadline_ms;
    }
    probeAll(probes, 0, n);
}

void probeDiscoveryFree(struct discovery *d)
{
    for (size_t i = 0; i < d->n; i++) {
        if (d->probes[i].resp != NULL) {
            idem__response__free_unpacked(d->probes[i].resp, NULL);
        }
    }
    free(d->probes);
    d->probes = NULL;
    d->n = 0;
}
