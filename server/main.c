/* idemd: the daemon. Loads the configuration, runs one libuv loop that carries Raft, the
 * binary RPC and the timers (docs/architecture.md), reloads the configuration on SIGHUP
 * (server/reload.h), and shuts down cleanly on SIGTERM or SIGINT: the RPC listener stops,
 * waiting requests are answered unavailable, Raft closes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <uv.h>

#include "cluster.h" /* clog_set_sink */
#include "config.h"
#include "http.h"
#include "fingerprint.h"
#include "log.h"
#include "notify.h"
#include "reload.h"
#include "rpc.h"
#include "service.h"

struct daemon {
    uv_loop_t loop;
    uv_signal_t sigterm;
    uv_signal_t sigint;
    uv_signal_t sighup;
    struct config_ref *boot; /* the configuration read at start (reloads: reloader.cur) */
    struct reloader reloader;
    struct service *svc;
    struct rpc_server *rpc;
    struct http_server *http; /* NULL when node.http_address is empty and no proxy is set */
    struct notifier *notify;  /* NULL when not run by systemd as Type=notify */
    int closing;              /* parts (rpc, service, http) still closing */
    bool stopping;
    bool handing_off;         /* a leader's handoff before stopping (signalCb) */
    bool closed_all;          /* closeAll ran */
    uv_timer_t after_handoff; /* closeAll on the loop turn after the handoff's callback */
};

static void usage(FILE *out)
{
    fprintf(out, "usage: idemd --config FILE        run a node\n"
                 "       idemd --check-config FILE  validate a configuration and exit\n"
                 "       idemd --version\n");
}

/* Once rpc, service and http have all closed: h2o's context keeps uv_run from returning,
 * so stop the loop; main then frees the gateway outside it (docs/h2o-notes.md §5). */
static void partClosed(struct daemon *d)
{
    if (--d->closing == 0 && d->http != NULL) {
        uv_stop(&d->loop);
    }
}

static void serviceClosed(void *data)
{
    struct daemon *d = data;
    log_info("raft closed");
    notifier_close(d->notify);
    d->notify = NULL;
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
    uv_close((uv_handle_t *)&d->after_handoff, NULL);
    /* Closing the handle gives SIGHUP back its default action, which ends the process: a
     * reload asked for in the rest of the shutdown is ignored instead. */
    signal(SIGHUP, SIG_IGN);
    partClosed(d);
}

static void rpcClosed(void *data)
{
    partClosed(data);
}

static void httpClosed(void *data)
{
    partClosed(data);
}

/* Closes the listeners and the service, after any handoff (signalCb). */
static void closeAll(struct daemon *d)
{
    if (d->closed_all) {
        return;
    }
    d->closed_all = true;
    d->closing = d->http != NULL ? 3 : 2;
    if (d->http != NULL) {
        http_server_stop(d->http, httpClosed, d);
    }
    rpc_server_close(d->rpc, rpcClosed, d);
    service_close(d->svc, serviceClosed, d);
}

static void afterHandOffCb(uv_timer_t *t)
{
    closeAll(t->data);
}

/* Raft's transfer callback: the close waits for the next loop turn, out of raft's calls. */
static void handedOff(void *data, uint64_t moved_to)
{
    struct daemon *d = data;
    d->handing_off = false;
    if (moved_to != 0) {
        log_info("leadership handed to node %llu", (unsigned long long)moved_to);
    } else if (!d->closed_all) {
        log_warn("leadership handoff did not complete: stopping anyway (the others elect a "
                 "leader after an election timeout)");
    }
    uv_timer_start(&d->after_handoff, afterHandOffCb, 0, 0);
}

/* A leader hands its leadership to another voter first (service_hand_off), still serving
 * meanwhile, so that a planned stop costs the cluster a transfer, not an election timeout;
 * then the listeners and the service close. */
static void signalCb(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    if (d->stopping) {
        if (d->handing_off) {
            /* A second signal does not wait for the handoff (at most an election timeout):
             * raft's close ends it. */
            log_info("%s again: stopping without waiting for the handoff",
                     signum == SIGTERM ? "SIGTERM" : "SIGINT");
            closeAll(d);
        }
        return;
    }
    d->stopping = true;
    log_info("%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    notifier_stopping(d->notify);
    reloader_close(&d->reloader);
    if (service_hand_off(d->svc, handedOff, d) == 0) {
        d->handing_off = true;
        log_info("this node leads: handing leadership over before stopping");
        return;
    }
    closeAll(d);
}

/* SIGHUP: the configuration file read again (reload.h); its errors are logged there. */
static void sighupCb(uv_signal_t *h, int signum)
{
    (void)signum;
    struct daemon *d = h->data;
    reloader_run(&d->reloader, "SIGHUP", NULL, NULL);
}

static int ensureDir(const char *path, char *err, size_t errlen)
{
    /* mkdir -p: the data dir and its parents. */
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
        snprintf(err, errlen, "data_dir too long");
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0700);
            *p = '/';
        }
    }
    if (mkdir(tmp, 0700) != 0) {
        struct stat st;
        if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "data_dir %s: cannot create", path);
            return -1;
        }
    }
    return 0;
}

/* Raises the soft limit on open files to the hard one, then lowers the connection caps if
 * they still do not fit with the node's own reserve: a node out of file descriptors cannot
 * open its next log segment, and a leader whose log write fails stops (docs/limits.md). */
static void fitFileLimit(struct config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = rl;
        up.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
            rl = up;
        }
    }
    uint64_t limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    uint32_t rpc, http;
    if (config_fd_budget(cfg, limit, &rpc, &http)) {
        log_warn("open files are limited to %llu: rpc.max_connections %u and "
                 "http.max_connections %u lowered to %u and %u (%d kept for raft, logs and "
                 "snapshots); raise the limit (ulimit -n, systemd LimitNOFILE) to keep them",
                 (unsigned long long)limit, cfg->rpc.max_connections, cfg->http.max_connections,
                 rpc, http, CONFIG_FD_RESERVE);
        cfg->rpc.max_connections = rpc;
        cfg->http.max_connections = http;
    }
}

/* The cluster's lines (clog.h) go to this process's log, with its time, level and node. */
static void clusterLogSink(enum clog_level level, const char *msg)
{
    if (level == CLOG_ERROR) {
        log_error("%s", msg);
    } else if (level == CLOG_WARN) {
        log_warn("%s", msg);
    } else {
        log_info("%s", msg);
    }
}

/* Without raft.secret_file, who may connect to the Raft port: anyone who reaches it, or with
 * tls.raft anyone with a certificate of the CA. */
static void warnRaftOpen(const struct config *cfg)
{
    if (cfg->raft.secret.set) {
        return;
    }
    if (cfg->tls.raft) {
        log_warn("raft.secret_file is not set: the Raft port (%s) takes connections from "
                 "anyone with a certificate signed by tls.ca_file (RPC clients' too, if it "
                 "signs theirs); set it, or use a CA that signs the members' certificates only",
                 cfg->node.raft_address.text);
    } else {
        log_warn("raft.secret_file is not set: the Raft port (%s) takes connections from "
                 "anyone who reaches it; keep it on a network of the members only",
                 cfg->node.raft_address.text);
    }
}

/* A tenant that a proxy route serves gets its keys from the proxied service's callers: an
 * unlimited quota lets them fill the node's memory. Warned once per tenant. */
static void warnUnboundedProxyTenants(const struct config *cfg)
{
    for (size_t t = 0; t < cfg->n_tenants; t++) {
        const struct config_tenant *tn = &cfg->tenants[t];
        bool served = false;
        for (size_t p = 0; p < cfg->n_proxies && !served; p++) {
            for (size_t r = 0; r < cfg->proxies[p].n_routes && !served; r++) {
                served = cfg->proxies[p].routes[r].tenant == t;
            }
        }
        if (served && (tn->max_records == 0 || tn->max_bytes == 0)) {
            log_warn("tenant %s is served by a proxy route and has no %s quota (0 = "
                     "unlimited): its callers can fill this node's memory",
                     tn->name, tn->max_records == 0 ? "max_records" : "max_bytes");
        }
    }
}

/* Key digests in logs and admin answers are keyed with a secret every member holds. */
static void keyDigests(const struct config *cfg)
{
    const struct config_secret *ds =
        cfg->raft.secret.set ? &cfg->raft.secret : &cfg->rpc.cluster_secret;
    if (key_digest_set_secret(ds->set ? ds->value : NULL, ds->set ? ds->len : 0) != FP_OK) {
        log_warn("key digests are plain SHA-256: keying them failed");
    } else if (!ds->set) {
        log_warn("key digests in logs are plain SHA-256 (no raft.secret_file or "
                 "rpc.cluster_secret_file to key them with): a guessable key can be found "
                 "from its digest");
    }
}

/* "ADDRESS" when a listener binds its advertised address, else "ADDRESS (listening on
 * LISTEN)", into buf. */
static const char *listenText(char *buf, size_t len, const struct config_addr *advertised,
                              const struct config_addr *listen)
{
    if (strcmp(advertised->text, listen->text) == 0) {
        snprintf(buf, len, "%s", advertised->text);
    } else {
        snprintf(buf, len, "%s (listening on %s)", advertised->text, listen->text);
    }
    return buf;
}

/* The RPC listener's start failure; its TLS files' errors placed at the tls section, as the
 * gateway's are. */
static void logRpcError(const struct config *cfg, const char *err)
{
    if (strncmp(err, "tls: ", 5) == 0 && cfg->tls.at != NULL) {
        log_error("%s: %s (tls.rpc)", cfg->tls.at, err);
    } else {
        log_error("%s", err);
    }
}

/* SIGTERM and SIGINT stop the node, SIGHUP reloads its configuration. */
static void startSignals(struct daemon *d)
{
    uv_signal_t *hs[] = {&d->sigterm, &d->sigint, &d->sighup};
    const int signums[] = {SIGTERM, SIGINT, SIGHUP};
    uv_timer_init(&d->loop, &d->after_handoff);
    d->after_handoff.data = d;
    for (size_t i = 0; i < 3; i++) {
        uv_signal_init(&d->loop, hs[i]);
        hs[i]->data = d;
        uv_signal_start(hs[i], signums[i] == SIGHUP ? sighupCb : signalCb, signums[i]);
    }
}

/* One line that says what started, from which data: a restart is found in the log by it,
 * with what the node recovered (the last snapshot, restored, and the entries after it, which
 * are applied once the commit index is known again). */
static void logStarted(struct daemon *d, const struct config *cfg)
{
    struct service_info si;
    service_get_info(d->svc, &si);
    char snap[192] = "none";
    if (si.cluster.last_snapshot_index != 0) {
        snprintf(snap, sizeof snap,
                 "index %llu (%llu records; read from disk with the log in %.1f ms, of which "
                 "the snapshot %.1f ms; restored in %.1f ms)",
                 (unsigned long long)si.cluster.last_snapshot_index,
                 (unsigned long long)si.fsm.records, (double)si.cluster.load_us / 1000.0,
                 (double)si.cluster.load_snapshot_us / 1000.0,
                 (double)si.cluster.restore_us_last / 1000.0);
    }
    char rpc[CONFIG_ADDR_MAX * 2 + 32], raft[sizeof rpc], http[sizeof rpc];
    log_info("idemd %s started: rpc on %s, raft on %s, http on %s; data in %s: term %llu, "
             "snapshot: %s, log entries held: %llu",
             IDEM_BUILD_VERSION,
             listenText(rpc, sizeof rpc, &cfg->node.rpc_address, &cfg->node.rpc_listen),
             listenText(raft, sizeof raft, &cfg->node.raft_address, &cfg->node.raft_listen),
             cfg->node.http_address.text[0]
                 ? listenText(http, sizeof http, &cfg->node.http_address, &cfg->node.http_listen)
                 : "(none)",
             cfg->node.data_dir, (unsigned long long)si.cluster.term, snap,
             (unsigned long long)si.cluster.log_entries);
}

int main(int argc, char **argv)
{
    const char *config_path = NULL;
    bool check_only = false;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "--check-config") == 0) &&
            i + 1 < argc) {
            check_only = strcmp(argv[i], "--check-config") == 0;
            config_path = argv[++i];
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("idemd %s\n", IDEM_BUILD_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "idemd: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (config_path == NULL) {
        usage(stderr);
        return 2;
    }
    static struct daemon d;
    char err[512];
    d.boot = config_ref_new();
    struct config *cfg = &d.boot->cfg;
    if (config_load(config_path, cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "idemd: %s\n", err);
        config_ref_drop(d.boot);
        return 2;
    }
    if (check_only) {
        printf("%s: ok (node %llu, %zu tenant%s)\n", config_path, (unsigned long long)cfg->node.id,
               cfg->n_tenants, cfg->n_tenants == 1 ? "" : "s");
        config_ref_drop(d.boot);
        return 0;
    }
    log_set_node(cfg->node.id);
    log_set_level(cfg->log.level);
    log_set_format(cfg->log.format);
    log_journal_detect();
    clog_set_sink(clusterLogSink);
    signal(SIGPIPE, SIG_IGN);
    /* A write past RLIMIT_FSIZE then fails with EFBIG, as any failed write, and is reported
     * (a failed log write: io.c) instead of killing the node without a word. */
    signal(SIGXFSZ, SIG_IGN);
    /* Until the loop takes SIGHUP (a reload), one would end the node: ignored meanwhile. */
    signal(SIGHUP, SIG_IGN);
    if (ensureDir(cfg->node.data_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "idemd: %s\n", err);
        config_ref_drop(d.boot);
        return 1;
    }
    uv_loop_init(&d.loop);
    reloader_init(&d.reloader, &d.loop, config_path, d.boot); /* log.level from here on */
    fitFileLimit(cfg);
    warnRaftOpen(cfg);
    warnUnboundedProxyTenants(cfg);
    keyDigests(cfg);
    d.svc = service_new(&d.loop, cfg, err, sizeof(err));
    if (d.svc == NULL) {
        log_error("%s", err);
        reloader_close(&d.reloader);
        uv_run(&d.loop, UV_RUN_NOWAIT);
        reloader_free(&d.reloader);
        config_ref_drop(d.boot);
        uv_loop_close(&d.loop);
        return 1;
    }
    /* Bind the RPC port before Raft starts, so that a node that cannot serve never joins
     * an election. */
    d.rpc = rpc_server_new(&d.loop, &cfg->node.rpc_listen, &cfg->rpc, &cfg->tls, d.svc, err,
                           sizeof(err));
    if (d.rpc == NULL) {
        logRpcError(cfg, err);
        return 1;
    }
    if (cfg->node.http_address.text[0] != '\0' || cfg->n_proxies > 0) {
        d.http = http_server_new(&d.loop, d.boot, d.svc, err, sizeof(err));
        if (d.http == NULL) {
            log_error("%s", err);
            return 1;
        }
    }
    reloader_attach(&d.reloader, d.svc, d.rpc, d.http);
    if (service_start(d.svc, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    startSignals(&d);
    d.notify = notifier_start(&d.loop, d.svc, cfg->node.id);
    logStarted(&d, cfg);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    if (d.http != NULL) {
        http_server_free(d.http);
    }
    uv_run(&d.loop, UV_RUN_DEFAULT); /* what closed last (the gateway, the resolver) */
    int rc = uv_loop_close(&d.loop);
    log_info("%s", rc == 0 ? "stopped" : "stopped with handles still open");
    reloader_free(&d.reloader);
    config_ref_drop(d.boot);
    return rc == 0 ? 0 : 1;
}
