/* reload: the daemon's configuration reload (see reload.h). */
#include "reload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "log.h"
#include "tls_stream.h"
#include "xmalloc.h"

static struct reload_stats stats;

void reload_get_stats(struct reload_stats *out)
{
    *out = stats;
}

static uint64_t nowSeconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec;
}

static void setLogLevel(const struct config *cfg)
{
    log_set_level(cfg->log.level);
    log_set_format(cfg->log.format);
}

void reloader_init(struct reloader *r, uv_loop_t *loop, const char *path, struct config_ref *boot)
{
    memset(r, 0, sizeof *r);
    r->loop = loop;
    r->path = path;
    r->boot = config_ref_hold(boot);
    r->cur = config_ref_hold(boot);
    uv_timer_init(loop, &r->drop);
    r->drop.data = r;
    setLogLevel(&boot->cfg);
    stats.last_success_s = nowSeconds();
}

static void reloadFromRpc(void *data, service_reload_done done, void *done_data)
{
    reloader_run(data, "admin RPC", done, done_data);
}

void reloader_attach(struct reloader *r, struct service *svc, struct rpc_server *rpc,
                     struct http_server *http)
{
    r->svc = svc;
    r->rpc = rpc;
    r->http = http;
    service_set_reload(svc, reloadFromRpc, r);
}

static void dropCb(uv_timer_t *t)
{
    struct reloader *r = t->data;
    for (size_t i = 0; i < r->n_retired; i++) {
        config_ref_drop(r->retired[i]); /* freed now unless a proxy request still holds it */
    }
    r->n_retired = 0;
}

/* Lets go of `old` on a later loop turn: whatever called the reload (an admin request being
 * answered) may still read it in this one. */
static void retire(struct reloader *r, struct config_ref *old)
{
    r->retired = xrealloc(r->retired, (r->n_retired + 1) * sizeof(*r->retired));
    r->retired[r->n_retired++] = old;
    uv_timer_start(&r->drop, dropCb, 0, 0);
}

static void keptCb(void *arg, const char *key)
{
    const struct reloader *r = arg;
    log_warn("reload: %s: %s differs from the running value and changes only with a restart: "
             "the running value is kept",
             r->path, key);
}

/* The connection caps as a start fits them to the open-files limit (main.c), so that a file
 * whose caps did not change compares equal to the running ones. */
static void fitCaps(struct config *cfg)
{
    struct rlimit rl;
    uint32_t rpc, http;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    uint64_t limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    if (config_fd_budget(cfg, limit, &rpc, &http)) {
        cfg->rpc.max_connections = rpc;
        cfg->http.max_connections = http;
    }
}

/* A reload's new TLS contexts, one per part that serves TLS (NULL: that part serves none). */
struct tlsNext {
    struct idem_tls_ctx *rpc;                       /* the RPC listener's */
    struct idem_tls_ctx *raft_server, *raft_client; /* Raft's listener and connector */
    struct idem_tls_ctx *http, *forward;            /* the HTTP listeners', the forwarder's */
};

static void freeTls(struct tlsNext *n)
{
    IdemTlsCtxFree(n->rpc);
    IdemTlsCtxFree(n->raft_server);
    IdemTlsCtxFree(n->raft_client);
    IdemTlsCtxFree(n->http);
    IdemTlsCtxFree(n->forward);
}

/* Every part's new TLS contexts from cfg's files, all made before any part switches: a file
 * that one part fails to load (also one rewritten between two parts' reads) then changes no
 * part, where a part that had switched already would serve the new certificate beside
 * others serving the old one. 0, or -1 with "FILE:LINE:COLUMN: tls: ..." in err and every
 * context made freed. */
static int loadTls(const struct reloader *r, const struct config *cfg, struct tlsNext *n,
                   char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    if (rpc_server_load_tls(r->rpc, &cfg->tls, &n->rpc, err, errlen) != 0 ||
        service_load_tls(&cfg->tls, &n->raft_server, &n->raft_client, err, errlen) != 0 ||
        (r->http != NULL &&
         http_server_load_tls(r->http, cfg, &n->http, &n->forward, err, errlen) != 0)) {
        freeTls(n);
        return -1;
    }
    return 0;
}

/* Hands next to every part: first the TLS contexts of all of them, loaded (which may fail,
 * and then the configuration does not change), then switched, then every part's
 * configuration; nothing fails after the load. */
static int apply(struct reloader *r, struct config_ref *next, char *err, size_t errlen)
{
    const struct config *cfg = &next->cfg;
    struct tlsNext tls;
    if (loadTls(r, cfg, &tls, err, errlen) != 0) {
        return -1;
    }
    rpc_server_set_tls(r->rpc, tls.rpc);
    service_set_tls(r->svc, tls.raft_server, tls.raft_client);
    if (r->http != NULL) {
        http_server_set_tls(r->http, tls.http, tls.forward);
    }
    rpc_server_set_config(r->rpc, &cfg->rpc);
    if (r->http != NULL) {
        http_server_set_config(r->http, next);
    }
    service_set_config(r->svc, cfg);
    setLogLevel(cfg);
    retire(r, r->cur);
    r->cur = next; /* the reference config_ref_new made */
    return 0;
}

/* Answers every waiter of `w` (a list) with rc and err, and frees the list. */
static void answerAll(struct reload_waiter *w, int rc, const char *err)
{
    while (w != NULL) {
        struct reload_waiter *next = w->next;
        if (w->done != NULL) {
            w->done(w->data, rc, err);
        }
        free(w);
        w = next;
    }
}

/* On the loop, with the file loaded (or not) by the pool: merges it with the running
 * configuration, loads its TLS files and hands it to every part. 0, or -1 with err. */
static int finish(struct reloader *r, struct config_ref *next, char *err, size_t errlen)
{
    int rc = config_reload_merge(&next->cfg, &r->cur->cfg, r->path, keptCb, r, err, errlen);
    if (rc == 0) {
        rc = apply(r, next, err, errlen);
    }
    return rc;
}

/* A pool thread: reads and checks the file (config.c keeps no state of its own and logs
 * nothing, so it may run off the loop), and fits its connection caps as a start does. */
static void loadWork(uv_work_t *w)
{
    struct reloader *r = w->data;
    r->load_rc = config_load(r->path, &r->loading->cfg, r->load_err, sizeof r->load_err);
    if (r->load_rc == 0) {
        fitCaps(&r->loading->cfg);
    }
}

static void startRound(struct reloader *r);

static void loadedCb(uv_work_t *w, int status)
{
    struct reloader *r = w->data;
    struct config_ref *next = r->loading;
    struct reload_waiter *round = r->round;
    r->loading = NULL;
    r->round = NULL;
    char err[sizeof r->load_err];
    int rc = -1;
    if (status != 0 || r->stopping) {
        snprintf(err, sizeof err, "the node is shutting down");
    } else if (r->load_rc != 0) {
        memcpy(err, r->load_err, sizeof err);
    } else {
        rc = finish(r, next, err, sizeof err);
    }
    if (rc != 0) {
        config_ref_drop(next);
        stats.error++;
        log_error("reload (%s) failed: %s; the running configuration is kept", r->trigger, err);
    } else {
        size_t routes = 0;
        for (size_t i = 0; i < next->cfg.n_proxies; i++) {
            routes += next->cfg.proxies[i].n_routes;
        }
        stats.ok++;
        stats.last_success_s = nowSeconds();
        log_info("reload (%s): configuration reloaded from %s: %zu tenant%s, %zu proxy route%s%s",
                 r->trigger, r->path, next->cfg.n_tenants, next->cfg.n_tenants == 1 ? "" : "s",
                 routes, routes == 1 ? "" : "s",
                 next->cfg.tls.enabled ? ", TLS files read again" : "");
    }
    answerAll(round, rc, rc == 0 ? "configuration reloaded" : err);
    if (r->queued != NULL) {
        if (r->stopping) {
            struct reload_waiter *q = r->queued;
            r->queued = NULL;
            answerAll(q, -1, "the node is shutting down");
        } else {
            startRound(r); /* for the reloads asked for while this one read the file */
        }
    }
}

/* Reads the file again for every reload queued so far. */
static void startRound(struct reloader *r)
{
    r->round = r->queued;
    r->queued = NULL;
    r->trigger = r->round->trigger;
    r->loading = config_ref_new();
    log_info("reload (%s): reading %s", r->trigger, r->path);
    r->work.data = r;
    if (uv_queue_work(r->loop, &r->work, loadWork, loadedCb) != 0) {
        /* libuv refuses only a request without a work callback: not this one */
        abort();
    }
}

void reloader_run(struct reloader *r, const char *trigger, reloader_done_fn done, void *data)
{
    if (r->stopping || r->svc == NULL) {
        char err[64];
        snprintf(err, sizeof err, "the node is %s", r->stopping ? "shutting down" : "starting");
        if (done != NULL) {
            done(data, -1, err);
        }
        return;
    }
    struct reload_waiter *w = xcalloc(1, sizeof(*w));
    w->done = done;
    w->data = data;
    w->trigger = trigger;
    struct reload_waiter **tail = &r->queued;
    while (*tail != NULL) {
        tail = &(*tail)->next;
    }
    *tail = w;
    if (r->loading == NULL) {
        startRound(r);
    }
}

void reloader_close(struct reloader *r)
{
    r->stopping = true;
    if (r->loading != NULL) {
        (void)uv_cancel((uv_req_t *)&r->work); /* else loadedCb answers "shutting down" */
    }
    uv_timer_stop(&r->drop);
    uv_close((uv_handle_t *)&r->drop, NULL);
}

void reloader_free(struct reloader *r)
{
    for (size_t i = 0; i < r->n_retired; i++) {
        config_ref_drop(r->retired[i]);
    }
    free(r->retired);
    r->retired = NULL;
    r->n_retired = 0;
    config_ref_drop(r->cur);
    config_ref_drop(r->boot);
    r->cur = r->boot = NULL;
}
