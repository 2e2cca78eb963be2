/* config_reload: the settings a reload keeps, and configuration references (see
 * config_reload.h). The settings that change only with a restart are listed once, below:
 * scalar fields by their place in struct config, then the ones that own memory (strings,
 * lists, secrets) and the proxy listeners, each compared and then copied from the running
 * configuration into the new one. */
#include "config_reload.h"

#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy_rules.h" /* PROXY_NS_KEY_LEN */
#include "xmalloc.h"

/* A scalar setting that changes only with a restart: its name and place. */
struct scalarKey {
    const char *name;
    size_t off, size;
};

/* clang-format off */
#define K(name, field) {name, offsetof(struct config, field), sizeof(((struct config *)0)->field)}
/* clang-format on */

static const struct scalarKey scalars[] = {
    K("node.id", node.id),
    K("raft.election_timeout_ms", raft.election_timeout_ms),
    K("raft.heartbeat_timeout_ms", raft.heartbeat_timeout_ms),
    K("raft.snapshot_threshold", raft.snapshot_threshold),
    K("raft.snapshot_trailing", raft.snapshot_trailing),
    K("raft.snapshot_trailing_max_mb", raft.snapshot_trailing_max_mb),
    K("raft.snapshot_log_percent", raft.snapshot_log_percent),
    K("raft.snapshot_log_max_mb", raft.snapshot_log_max_mb),
    K("raft.segment_size_mb", raft.segment_size_mb),
    K("raft.snapshot_nice", raft.snapshot_nice),
    K("raft.pre_vote", raft.pre_vote),
    K("raft.prefill_segments", raft.prefill_segments),
    K("raft.stuck_write_step_down_ms", raft.stuck_write_step_down_ms),
    K("rpc.max_frame_bytes", rpc.max_frame_bytes),
    K("rpc.max_frame_buffer_mb", rpc.max_frame_buffer_mb),
    K("rpc.max_answer_buffer_mb", rpc.max_answer_buffer_mb),
    K("rpc.default_deadline_ms", rpc.default_deadline_ms),
    K("rpc.max_deadline_ms", rpc.max_deadline_ms),
    K("rpc.max_connections", rpc.max_connections),
    K("rpc.idle_timeout_ms", rpc.idle_timeout_ms),
    K("rpc.handshake_timeout_ms", rpc.handshake_timeout_ms),
    K("rpc.first_frame_timeout_ms", rpc.first_frame_timeout_ms),
    K("rpc.max_connections_per_address", rpc.max_connections_per_address),
    K("rpc.member_connections", rpc.member_connections),
    K("rpc.unauthenticated_max_frame_bytes", rpc.unauthenticated_max_frame_bytes),
    K("rpc.insecure_cluster_secret", rpc.insecure_cluster_secret),
    K("batch.max_commands", batch.max_commands),
    K("batch.max_bytes", batch.max_bytes),
    K("batch.max_pending_mb", batch.max_pending_mb),
    K("batch.tenant_max_pending_percent", batch.tenant_max_pending_percent),
    K("batch.tenant_max_inflight_kb", batch.tenant_max_inflight_kb),
    K("batch.delay_us", batch.delay_us),
    K("http.max_connections", http.max_connections),
    K("http.handshake_timeout_ms", http.handshake_timeout_ms),
    K("http.max_connections_per_address", http.max_connections_per_address),
    K("http.metrics_public", http.metrics_public),
    K("expiry.interval_ms", expiry.interval_ms),
    K("expiry.batch", expiry.batch),
    K("tls.rpc", tls.rpc),
    K("tls.http", tls.http),
    K("tls.proxy", tls.proxy),
    K("tls.raft", tls.raft),
};

#undef K

struct merge {
    struct config *next;
    const struct config *cur;
    const char *name;
    config_kept_fn kept;
    void *arg;
    char *err;
    size_t errlen;
};

static void keptIf(struct merge *m, bool differs, const char *key)
{
    if (differs && m->kept != NULL) {
        m->kept(m->arg, key);
    }
}

__attribute__((format(printf, 3, 4))) static int fail(struct merge *m, const char *at,
                                                      const char *fmt, ...)
{
    if (m->errlen == 0) {
        return -1;
    }
    int n = snprintf(m->err, m->errlen, "%s: ", at != NULL ? at : m->name);
    if (n >= 0 && (size_t)n < m->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->err + n, m->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static bool secretDiffers(const struct config_secret *a, const struct config_secret *b)
{
    return a->set != b->set ||
           (a->set && CRYPTO_memcmp(a->sha256, b->sha256, CONFIG_HASH_LEN) != 0);
}

static void secretFree(struct config_secret *s)
{
    if (s->value != NULL) {
        OPENSSL_cleanse(s->value, s->len);
        free(s->value);
    }
    memset(s, 0, sizeof *s);
}

static void secretCopy(struct config_secret *dst, const struct config_secret *src)
{
    *dst = *src;
    dst->value = src->value != NULL ? xmemdup(src->value, src->len) : NULL;
}

static bool bootstrapDiffers(const struct config_cluster *a, const struct config_cluster *b)
{
    if (a->n_bootstrap != b->n_bootstrap) {
        return true;
    }
    for (size_t i = 0; i < a->n_bootstrap; i++) {
        const struct config_member *x = &a->bootstrap[i], *y = &b->bootstrap[i];
        if (x->id != y->id || strcmp(x->raft_address.text, y->raft_address.text) != 0 ||
            strcmp(x->rpc_address.text, y->rpc_address.text) != 0 ||
            strcmp(x->http_address.text, y->http_address.text) != 0) {
            return true;
        }
    }
    return false;
}

/* The settings that own memory or are not plain scalars: compared, then cur's copied. */
static void keepNodeAndSecrets(struct merge *m)
{
    struct config *n = m->next;
    const struct config *c = m->cur;
    keptIf(m, strcmp(n->node.raft_address.text, c->node.raft_address.text) != 0,
           "node.raft_address");
    keptIf(m, strcmp(n->node.rpc_address.text, c->node.rpc_address.text) != 0, "node.rpc_address");
    keptIf(m, strcmp(n->node.http_address.text, c->node.http_address.text) != 0,
           "node.http_address");
    keptIf(m, strcmp(n->node.raft_listen.text, c->node.raft_listen.text) != 0, "node.raft_listen");
    keptIf(m, strcmp(n->node.rpc_listen.text, c->node.rpc_listen.text) != 0, "node.rpc_listen");
    keptIf(m, strcmp(n->node.http_listen.text, c->node.http_listen.text) != 0, "node.http_listen");
    keptIf(m, strcmp(n->node.data_dir, c->node.data_dir) != 0, "node.data_dir");
    keptIf(m, bootstrapDiffers(&n->cluster, &c->cluster), "cluster.bootstrap");
    keptIf(m, secretDiffers(&n->raft.secret, &c->raft.secret), "raft.secret_file");
    keptIf(m, secretDiffers(&n->raft.previous_secret, &c->raft.previous_secret),
           "raft.previous_secret_file");
    keptIf(m, secretDiffers(&n->rpc.cluster_secret, &c->rpc.cluster_secret),
           "rpc.cluster_secret_file");
    free(n->node.data_dir);
    n->node.raft_address = c->node.raft_address;
    n->node.rpc_address = c->node.rpc_address;
    n->node.http_address = c->node.http_address;
    n->node.raft_listen = c->node.raft_listen;
    n->node.rpc_listen = c->node.rpc_listen;
    n->node.http_listen = c->node.http_listen;
    n->node.data_dir = xstrndup(c->node.data_dir, strlen(c->node.data_dir));
    free(n->cluster.bootstrap);
    n->cluster.n_bootstrap = c->cluster.n_bootstrap;
    n->cluster.bootstrap =
        c->cluster.n_bootstrap > 0
            ? xmemdup(c->cluster.bootstrap, c->cluster.n_bootstrap * sizeof *c->cluster.bootstrap)
            : NULL;
    secretFree(&n->raft.secret);
    secretFree(&n->raft.previous_secret);
    secretFree(&n->rpc.cluster_secret);
    secretCopy(&n->raft.secret, &c->raft.secret);
    secretCopy(&n->raft.previous_secret, &c->raft.previous_secret);
    secretCopy(&n->rpc.cluster_secret, &c->rpc.cluster_secret);
}

static char **strsCopy(char *const *src, size_t n)
{
    char **out = xcalloc(n > 0 ? n : 1, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        out[i] = xstrndup(src[i], strlen(src[i]));
    }
    return out;
}

/* A deep copy of route src, its tenant index that of the tenant of the same name in `cfg`
 * (next); -1 when cfg has no such tenant or it no longer allows the route's caller keys. */
static int routeCopy(struct merge *m, const struct config_proxy_route *src,
                     struct config_proxy_route *dst, const char *where)
{
    const char *tname = m->cur->tenants[src->tenant].name;
    *dst = *src;
    dst->path_prefix = xstrndup(src->path_prefix, strlen(src->path_prefix));
    dst->upstream = xstrndup(src->upstream, strlen(src->upstream));
    dst->upstream_hostport = xstrndup(src->upstream_hostport, strlen(src->upstream_hostport));
    dst->fingerprint_headers = strsCopy(src->fingerprint_headers, src->n_fingerprint_headers);
    dst->fingerprint_fields = strsCopy(src->fingerprint_fields, src->n_fingerprint_fields);
    dst->fingerprint_ignore = strsCopy(src->fingerprint_ignore, src->n_fingerprint_ignore);
    dst->response_headers = strsCopy(src->response_headers, src->n_response_headers);
    dst->caller_headers = strsCopy(src->caller_headers, src->n_caller_headers);
    size_t t = 0;
    while (t < m->next->n_tenants && strcmp(m->next->tenants[t].name, tname) != 0) {
        t++;
    }
    if (t == m->next->n_tenants) {
        return fail(m, NULL,
                    "%s (kept until a restart: the proxy listeners changed) serves tenant "
                    "\"%s\", which the file no longer has",
                    where, tname);
    }
    dst->tenant = t;
    if (!src->caller_none && m->next->tenants[t].key_max_len < PROXY_NS_KEY_LEN) {
        return fail(m, NULL,
                    "%s (kept until a restart: the proxy listeners changed) keeps callers' "
                    "records under %d-byte keys, and tenant \"%s\" now has key_max_len %u",
                    where, PROXY_NS_KEY_LEN, tname, (unsigned)m->next->tenants[t].key_max_len);
    }
    return 0;
}

/* Puts the file's proxy listeners in the running order, each found by its address (a
 * listener's routes go with its address, whatever the order of the file's list). False, and
 * nothing moved, unless the file has exactly the running listeners' addresses. */
static bool proxiesInRunningOrder(struct config *n, const struct config *c)
{
    if (n->n_proxies != c->n_proxies) {
        return false;
    }
    size_t *at = n->n_proxies > 0 ? xcalloc(n->n_proxies, sizeof *at) : NULL;
    bool all = true;
    for (size_t i = 0; i < c->n_proxies && all; i++) {
        all = false;
        for (size_t j = 0; j < n->n_proxies && !all; j++) {
            if (strcmp(n->proxies[j].address.text, c->proxies[i].address.text) == 0) {
                at[i] = j;
                all = true;
            }
        }
    }
    if (all && n->n_proxies > 0) {
        struct config_proxy *sorted = xcalloc(n->n_proxies, sizeof *sorted);
        for (size_t i = 0; i < n->n_proxies; i++) {
            sorted[i] = n->proxies[at[i]];
        }
        memcpy(n->proxies, sorted, n->n_proxies * sizeof *sorted);
        free(sorted);
    }
    free(at);
    return all;
}

/* The proxy listeners: the number and the addresses are cur's. When the file has the same
 * listeners (by address, in any order), each takes its own routes from the file; otherwise
 * the whole running proxy section is kept (its routes copied, their tenants found again by
 * name). */
static int keepProxies(struct merge *m)
{
    struct config *n = m->next;
    const struct config *c = m->cur;
    if (proxiesInRunningOrder(n, c)) {
        for (size_t i = 0; i < n->n_proxies; i++) {
            n->proxies[i].address = c->proxies[i].address;
        }
        return 0;
    }
    keptIf(m, true,
           n->n_proxies != c->n_proxies ? "proxy (the number of listeners)"
                                        : "proxy (the listeners' addresses)");
    struct config staged = {0}; /* the old file's listeners, freed with `n`'s on failure */
    staged.n_proxies = c->n_proxies;
    staged.proxies = c->n_proxies > 0 ? xcalloc(c->n_proxies, sizeof *staged.proxies) : NULL;
    int rc = 0;
    for (size_t i = 0; i < c->n_proxies && rc == 0; i++) {
        const struct config_proxy *p = &c->proxies[i];
        struct config_proxy *q = &staged.proxies[i];
        q->address = p->address;
        q->routes = xcalloc(p->n_routes, sizeof *q->routes);
        for (size_t r = 0; r < p->n_routes && rc == 0; r++) {
            char where[64];
            snprintf(where, sizeof where, "proxy[%zu].routes[%zu]", i, r);
            rc = routeCopy(m, &p->routes[r], &q->routes[r], where);
            q->n_routes = r + 1;
        }
    }
    /* Swap: next gets the kept listeners; its own (the file's) are freed with `staged`. */
    struct config_proxy *fp = n->proxies;
    size_t fn = n->n_proxies;
    n->proxies = staged.proxies;
    n->n_proxies = staged.n_proxies;
    staged.proxies = fp;
    staged.n_proxies = fn;
    config_free(&staged);
    return rc;
}

/* What the kept values and the new ones must satisfy together (config_sections.c checks the
 * same of one file). */
static int checkTogether(struct merge *m)
{
    const struct config *n = m->next;
    const struct config_tls *t = &n->tls;
    const char *at = t->at; /* the tls section of the new file, if it has one */
    const char *switches[] = {t->rpc ? "tls.rpc" : NULL, t->http ? "tls.http" : NULL,
                              t->proxy ? "tls.proxy" : NULL, t->raft ? "tls.raft" : NULL};
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
        if (switches[i] != NULL && !t->enabled) {
            return fail(m, at,
                        "%s stays on until a restart and needs cert_file and key_file, which "
                        "the file no longer has",
                        switches[i]);
        }
    }
    if (t->raft && t->ca_file == NULL) {
        return fail(m, at, "tls.raft stays on until a restart and needs ca_file");
    }
    if (t->http_client_certs != CONFIG_CLIENT_CERTS_OFF && !t->http && !t->proxy) {
        return fail(m, at,
                    "tls.http_client_certs: no HTTP listener serves TLS (tls.http and tls.proxy "
                    "change only with a restart)");
    }
    const struct {
        const struct config_secret *s;
        const char *name;
    } secrets[] = {{&n->rpc.cluster_secret, "rpc.cluster_secret_file"},
                   {&n->raft.secret, "raft.secret_file"},
                   {&n->raft.previous_secret, "raft.previous_secret_file"}};
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++) {
        const struct config_secret *s = secrets[i].s;
        if (s->set && (config_is_admin_hash(n, s->sha256) ||
                       config_tenant_by_token_hash(n, s->sha256) != NULL)) {
            return fail(m, NULL,
                        "a token in the file is the secret of %s (kept until a restart); "
                        "every token must differ from it",
                        secrets[i].name);
        }
    }
    return 0;
}

int config_reload_merge(struct config *next, const struct config *cur, const char *name,
                        config_kept_fn kept, void *arg, char *err, size_t errlen)
{
    struct merge m = {next, cur, name, kept, arg, err, errlen};
    if (errlen > 0) {
        err[0] = '\0';
    }
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        const struct scalarKey *k = &scalars[i];
        char *n = (char *)next + k->off;
        const char *c = (const char *)cur + k->off;
        keptIf(&m, memcmp(n, c, k->size) != 0, k->name);
        memcpy(n, c, k->size);
    }
    keepNodeAndSecrets(&m);
    if (keepProxies(&m) != 0) {
        return -1;
    }
    return checkTogether(&m);
}

/* ---- references ---------------------------------------------------------------------- */

struct config_ref *config_ref_new(void)
{
    struct config_ref *r = xcalloc(1, sizeof *r);
    r->refs = 1;
    return r;
}

struct config_ref *config_ref_hold(struct config_ref *r)
{
    r->refs++;
    return r;
}

void config_ref_drop(struct config_ref *r)
{
    if (r != NULL && --r->refs == 0) {
        config_free(&r->cfg);
        free(r);
    }
}
