/* health: what scripts and probes ask of idemctl: `status --check` (whether every voter
 * answers, a leader is known and no voter lags, as an exit status) and `version` (the
 * client's version and each node's, from status discovery). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemctl.h"

#define CHECK_POLL_MS 200u /* between two looks at the voters that trail the leader */

static void addFailure(json_t *failed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void addFailure(json_t *failed, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    jpush(failed, jstr(buf));
}

/* The probe of voter m: one that answered (with a status or a refusal), else one at its
 * address that did not; NULL when none asked it. */
static const struct probe *voterProbe(const struct discovery *d, const Idem__Member *m)
{
    const struct probe *silent = NULL;
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        if (probeId(p, &d->v) != m->id) {
            continue;
        }
        if (probeStatus(p) != NULL || probeRefused(p)) {
            return p;
        }
        silent = silent != NULL ? silent : p;
    }
    return silent;
}

/* The voters that trail the leader by 1 to max_entries entries at the first look: asked
 * again (every CHECK_POLL_MS) until each has applied the index the leader had then, or
 * max_ms passed; the ones that did not are failures. ids, addrs and targets: n of them. */
static void timeLag(const struct global *g, size_t n, const uint64_t *ids, char (*addrs)[ADDR_MAX],
                    const uint64_t *targets, uint64_t max_ms, json_t *failed)
{
    struct probe *probes = calloc(n ? n : 1, sizeof *probes);
    size_t *of = calloc(n ? n : 1, sizeof *of); /* probes[k] asks about voter of[k] */
    if (probes == NULL || of == NULL) {
        outOom();
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(probes[i].addr, sizeof probes[i].addr, "%s", addrs[i]);
        of[i] = i;
    }
    uint64_t end = callNowMs() + max_ms;
    size_t left = n;
    for (uint64_t now = callNowMs(); left > 0 && now < end; now = callNowMs()) {
        callSleepMs(end - now < CHECK_POLL_MS ? end - now : CHECK_POLL_MS);
        now = callNowMs();
        uint64_t rest = end > now ? end - now : 0;
        uint32_t deadline = rest < CHECK_POLL_MS ? CHECK_POLL_MS : (uint32_t)rest;
        probeAgain(g, probes, left, deadline < g->deadline_ms ? deadline : g->deadline_ms);
        size_t k = 0;
        for (size_t i = 0; i < left; i++) {
            const Idem__NodeStatus *st = probeStatus(&probes[i]);
            if (st != NULL && st->applied_index >= targets[of[i]]) {
                idem__response__free_unpacked(probes[i].resp, NULL);
                continue;
            }
            probes[k] = probes[i];
            of[k++] = of[i];
        }
        left = k;
    }
    for (size_t i = 0; i < left; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        char now[64] = "";
        if (st != NULL) {
            snprintf(now, sizeof now, "; applied index %" PRIu64 " now", st->applied_index);
        }
        addFailure(failed,
                   "voter %" PRIu64 " (%s) lags: it has not applied index %" PRIu64
                   ", the leader's, within --max-lag-ms %" PRIu64 "%s",
                   ids[of[i]], addrs[of[i]], targets[of[i]], max_ms, now);
        if (probes[i].resp != NULL) {
            idem__response__free_unpacked(probes[i].resp, NULL);
        }
    }
    free(probes);
    free(of);
}

/* A voter that answered with its status (st): fails when it trails the leader by more than
 * max_entries; one that trails by fewer but some is added to the time check (ids, addrs,
 * targets; *nt of them). */
static void voterLag(const struct clusterView *v, const Idem__Member *m, const Idem__NodeStatus *st,
                     uint64_t max_entries, json_t *failed, uint64_t *ids, char (*addrs)[ADDR_MAX],
                     uint64_t *targets, size_t *nt)
{
    if (v->leader_st == NULL || st->applied_index >= v->leader_st->applied_index) {
        return;
    }
    uint64_t la = v->leader_st->applied_index, lag = la - st->applied_index;
    if (lag > max_entries) {
        addFailure(
            failed,
            "voter %" PRIu64 " (%s) lags: applied index %" PRIu64 " is %" PRIu64
            " entr%s behind the leader's %" PRIu64 " (more than --max-lag-entries %" PRIu64 ")",
            m->id, m->rpc_address, st->applied_index, lag, lag == 1 ? "y" : "ies", la, max_entries);
        return;
    }
    ids[*nt] = m->id;
    snprintf(addrs[*nt], ADDR_MAX, "%s", m->rpc_address);
    targets[*nt] = la;
    (*nt)++;
}

json_t *healthCheck(const struct global *g, const struct discovery *d, uint64_t max_entries,
                    uint64_t max_ms)
{
    json_t *failed = jarr();
    const struct clusterView *v = &d->v;
    if (v->members_of == NULL) {
        addFailure(failed, "cluster state unknown: no node answered with its status");
        return failed;
    }
    if (2 * v->reachable_voters <= v->voters) {
        addFailure(failed, "no quorum: %zu of %zu voters reachable", v->reachable_voters,
                   v->voters);
    }
    if (v->unreachable_leader != 0) {
        addFailure(failed,
                   "no leader: the reachable nodes follow node %" PRIu64
                   ", which does not answer as leader",
                   v->unreachable_leader);
    } else if (v->leader == 0) {
        addFailure(failed, "no leader: no majority of the reachable voters agrees on one");
    }
    size_t nm = v->members_of->n_members, nt = 0;
    uint64_t *ids = calloc(nm ? nm : 1, sizeof *ids);
    uint64_t *targets = calloc(nm ? nm : 1, sizeof *targets);
    char(*addrs)[ADDR_MAX] = calloc(nm ? nm : 1, sizeof *addrs);
    if (ids == NULL || targets == NULL || addrs == NULL) {
        outOom();
    }
    for (size_t i = 0; i < nm; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if (strcmp(m->role, "voter") != 0) {
            continue; /* standbys and spares do not count toward the quorum */
        }
        const struct probe *p = voterProbe(d, m);
        const Idem__NodeStatus *st = p != NULL ? probeStatus(p) : NULL;
        if (p == NULL) {
            addFailure(failed, "voter %" PRIu64 " (%s) was not asked", m->id, m->rpc_address);
        } else if (probeRefused(p)) {
            addFailure(failed, "voter %" PRIu64 " (%s) refused the admin token (%s)", m->id,
                       m->rpc_address, idem_outcome_name((int)idem_response_outcome(p->resp)));
        } else if (st == NULL) {
            addFailure(failed, "voter %" PRIu64 " (%s) is unreachable: %s", m->id, m->rpc_address,
                       p->err[0] ? p->err : idem_strerror(p->rv));
        } else {
            voterLag(v, m, st, max_entries, failed, ids, addrs, targets, &nt);
        }
    }
    if (nt > 0) {
        timeLag(g, nt, ids, addrs, targets, max_ms, failed);
    }
    free(ids);
    free(targets);
    free(addrs);
    return failed;
}

/* Sorts probes by node ID (those without one last), then by address. */
static const struct discovery *sortView;

static int probeCmp(const void *a, const void *b)
{
    const struct probe *x = *(const struct probe *const *)a, *y = *(const struct probe *const *)b;
    uint64_t ix = probeId(x, &sortView->v), iy = probeId(y, &sortView->v);
    if ((ix == 0) != (iy == 0)) {
        return ix == 0 ? 1 : -1;
    }
    if (ix != iy) {
        return ix < iy ? -1 : 1;
    }
    return strcmp(x->addr, y->addr);
}

/* A node's version line as JSON: id, rpc_address, version (null when it did not tell) and
 * error. Counts it in *answered and *refused. */
static json_t *versionNode(const struct discovery *d, const struct probe *p, size_t *answered,
                           size_t *refused)
{
    json_t *o = jobj();
    uint64_t id = probeId(p, &d->v);
    const Idem__NodeStatus *st = probeStatus(p);
    jset(o, "id", id ? ju64(id) : json_null());
    jset(o, "rpc_address", jstr(st != NULL ? st->rpc_address : p->addr));
    jset(o, "version", st != NULL ? jstr(st->version) : json_null());
    *answered += st != NULL;
    if (probeRefused(p)) {
        (*refused)++;
        char msg[600];
        snprintf(msg, sizeof msg, "refused the admin token: %s%s%s",
                 idem_outcome_name((int)idem_response_outcome(p->resp)),
                 p->resp->error && p->resp->error[0] ? ": " : "",
                 p->resp->error ? p->resp->error : "");
        jset(o, "error", jstr(msg));
    } else if (st == NULL) {
        jset(o, "error", jstr(p->err[0] ? p->err : idem_strerror(p->rv)));
    }
    return o;
}

/* version [--client]: the client's version, and each node's (status discovery). */
int versionCmd(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    bool client_only = false;
    const struct argsOpt opts[] = {{"--client", NULL, &client_only}};
    argsParse(g, a, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
    json_t *o = jobj();
    jset(o, "client", jstr(IDEMCTL_VERSION));
    if (client_only) {
        outEmit(g, o);
        return EXIT_ANSWERED;
    }
    int code = mainConfigCheck(g, "version", true);
    if (code != EXIT_ANSWERED) {
        json_decref(o);
        return code;
    }
    struct discovery d;
    probeDiscover(g, false, &d);
    const struct probe **order = calloc(d.n ? d.n : 1, sizeof *order);
    if (order == NULL) {
        outOom();
    }
    for (size_t i = 0; i < d.n; i++) {
        order[i] = &d.probes[i];
    }
    sortView = &d;
    qsort(order, d.n, sizeof *order, probeCmp);
    json_t *nodes = jarr();
    size_t answered = 0, refused = 0;
    for (size_t i = 0; i < d.n; i++) {
        jpush(nodes, versionNode(&d, order[i], &answered, &refused));
    }
    free(order);
    probeDiscoveryFree(&d);
    jset(o, "nodes", nodes);
    if (g->json) {
        outPrintJson(o);
    } else {
        printf("client: %s\n", IDEMCTL_VERSION);
        size_t i;
        json_t *x;
        json_array_foreach(nodes, i, x)
        {
            json_int_t id = json_integer_value(json_object_get(x, "id"));
            const char *ver = json_string_value(json_object_get(x, "version"));
            const char *err = json_string_value(json_object_get(x, "error"));
            const char *addr = json_string_value(json_object_get(x, "rpc_address"));
            if (id != 0) {
                printf("node %" JSON_INTEGER_FORMAT " (", id);
            } else {
                fputs("the node at ", stdout);
            }
            outPutSafe(addr, strlen(addr), stdout);
            fputs(id != 0 ? "): " : ": ", stdout);
            if (ver == NULL) {
                fputs("no version: ", stdout);
            }
            const char *text = ver != NULL ? (ver[0] ? ver : "(not told)") : err;
            outPutSafe(text, strlen(text), stdout);
            putchar('\n');
        }
    }
    json_decref(o);
    if (answered == 0 && refused > 0) {
        fprintf(stderr, "idemctl: version: the admin token was refused by every node that "
                        "answered\n");
        return EXIT_AUTH;
    }
    return answered > 0 ? EXIT_ANSWERED : EXIT_UNAVAILABLE;
}
