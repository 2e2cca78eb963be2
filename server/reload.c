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

static int reloadFromRpc(void *data, char *err, size_t errlen)
{
    return reloader_run(data, "admin RPC", err, errlen);
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

/* Loads the TLS files once, as the listeners will, so that a bad file is found before any
 * part has switched. 0, or -1 with "FILE:LINE:COLUMN: tls: ..." in err. */
static int checkTls(const struct config *cfg, char *err, size_t errlen)
{
    const struct config_tls *t = &cfg->tls;
    if (!t->enabled || !(t->rpc || t->http || t->proxy || t->raft)) {
        return 0;
    }
    struct idem_tls_params p = {.role = IDEM_TLS_SERVER,
                                .cert_file = t->cert_file,
                                .key_file = t->key_file,
                                .ca_file = t->ca_file};
    struct idem_tls_ctx *ctx = NULL;
    char why[512];
    if (IdemTlsCtxNew(&p, &ctx, why, sizeof why) != IDEM_OK) {
        snprintf(err, errlen, "%s: %s", t->at != NULL ? t->at : "tls", why);
        return -1;
    }
    IdemTlsCtxFree(ctx);
    return 0;
}

/* Hands next to every part: first the ones that read TLS files again (each may still fail,
 * and then the configuration does not change; a part that read its files already keeps the
 * new certificate, from the files checked), then every part's configuration, which cannot
 * fail. */
static int apply(struct reloader *r, struct config_ref *next, char *err, size_t errlen)
{
    const struct config *cfg = &next->cfg;
    if (rpc_server_reload_tls(r->rpc, &cfg->tls, err, errlen) != 0 ||
        service_reload_tls(r->svc, &cfg->tls, err, errlen) != 0 ||
        (r->http != NULL && http_server_reload_tls(r->http, cfg, err, errlen) != 0)) {
        return -1;
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

int reloader_run(struct reloader *r, const char *trigger, char *err, size_t errlen)
{
    if (r->stopping || r->svc == NULL) {
        snprintf(err, errlen, "the node is %s", r->stopping ? "shutting down" : "starting");
        return -1;
    }
    log_info("reload (%s): reading %s", trigger, r->path);
    struct config_ref *next = config_ref_new();
    int rc = config_load(r->path, &next->cfg, err, errlen);
    if (rc == 0) {
        fitCaps(&next->cfg);
        rc = config_reload_merge(&next->cfg, &r->cur->cfg, r->path, keptCb, r, err, errlen);
    }
    if (rc == 0) {
        rc = checkTls(&next->cfg, err, errlen);
    }
    if (rc == 0) {
        rc = apply(r, next, err, errlen);
    }
    if (rc != 0) {
        config_ref_drop(next);
        stats.error++;
        log_error("reload (%s) failed: %s; the running configuration is kept", trigger, err);
        return -1;
    }
    size_t routes = 0;
    for (size_t i = 0; i < next->cfg.n_proxies; i++) {
        routes += next->cfg.proxies[i].n_routes;
    }
    stats.ok++;
    stats.last_success_s = nowSeconds();
    log_info("reload (%s): configuration reloaded from %s: %zu tenant%s, %zu proxy route%s%s",
             trigger, r->path, next->cfg.n_tenants, next->cfg.n_tenants == 1 ? "" : "s", routes,
             routes == 1 ? "" : "s", next->cfg.tls.enabled ? ", TLS files read again" : "");
    return 0;
}

void reloader_close(struct reloader *r)
{
    r->stopping = true;
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
