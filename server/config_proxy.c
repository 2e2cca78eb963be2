/* config_proxy: the configuration's proxy listeners and their routes (methods, headers,
 * upstreams, the statuses that are stored), for the HTTP gateway's proxy mode
 * (config_internal.h). */
#include "config_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "proxy_rules.h"

unsigned config_method_bit(const char *m, size_t len)
{
    static const struct {
        const char *name;
        unsigned bit;
    } ms[] = {{"GET", CONFIG_M_GET},     {"HEAD", CONFIG_M_HEAD},     {"POST", CONFIG_M_POST},
              {"PUT", CONFIG_M_PUT},     {"PATCH", CONFIG_M_PATCH},   {"DELETE", CONFIG_M_DELETE},
              {"OPTIONS", CONFIG_M_OPTIONS}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        if (strlen(ms[i].name) == len && memcmp(ms[i].name, m, len) == 0) {
            return ms[i].bit;
        }
    }
    return 0;
}

static int parseMethods(struct ctx *c, const struct field *f, unsigned *out)
{
    if (!config_present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, v, "%s: expected a list of methods, got %s", f->name,
                                config_kind_name(v));
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0) {
        return config_fail_node(c, v, "%s: at least one method is required", f->name);
    }
    unsigned bits = 0;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (config_visit(c, v->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        char q[QUOTE_SIZE];
        if (item->type != YAML_SCALAR_NODE) {
            return config_fail_node(c, item, "%s[%zu]: expected a method, got %s", f->name, i,
                                    config_kind_name(item));
        }
        unsigned b = config_method_bit(config_scalar_text(item), item->data.scalar.length);
        if (b == 0) {
            return config_fail_node(
                c, item,
                "%s[%zu]: expected GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS, "
                "got %s",
                f->name, i, config_quote(q, config_scalar_text(item), item->data.scalar.length));
        }
        if (bits & b) {
            return config_fail_node(
                c, item, "%s[%zu]: %s is listed twice", f->name, i,
                config_quote(q, config_scalar_text(item), item->data.scalar.length));
        }
        bits |= b;
    }
    *out = bits;
    return 0;
}

/* Reads a list of header names into an owned array of owned lower-cased strings. Leaves the
 * output alone when the field is absent or null. */
static int parseHeaderNames(struct ctx *c, const struct field *f, char ***out, size_t *n_out)
{
    if (!config_present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, v, "%s: expected a list of header names, got %s", f->name,
                                config_kind_name(v));
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    for (size_t i = 0; i < *n_out; i++) {
        free((*out)[i]);
    }
    free(*out);
    *out = NULL;
    *n_out = 0;
    if (n == 0) {
        return 0;
    }
    *out = calloc(n, sizeof **out);
    if (*out == NULL) {
        return config_fail_node(c, v, "%s: out of memory", f->name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (config_visit(c, v->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        if (item->type != YAML_SCALAR_NODE) {
            return config_fail_node(c, item, "%s[%zu]: expected a header name, got %s", f->name, i,
                                    config_kind_name(item));
        }
        const char *s = config_scalar_text(item);
        size_t len = item->data.scalar.length;
        char q[QUOTE_SIZE];
        bool ok = len > 0 && len <= 128 && strlen(s) == len;
        for (size_t k = 0; ok && k < len; k++) {
            unsigned char ch = (unsigned char)s[k];
            ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 strchr("!#$%&'*+-.^_`|~", ch) != NULL;
        }
        if (!ok) {
            return config_fail_node(c, item, "%s[%zu]: not a valid header name: %s", f->name, i,
                                    config_quote(q, s, len));
        }
        char *copy = malloc(len + 1);
        if (copy == NULL) {
            return config_fail_node(c, item, "%s: out of memory", f->name);
        }
        for (size_t k = 0; k <= len; k++) {
            copy[k] = (char)((s[k] >= 'A' && s[k] <= 'Z') ? s[k] - 'A' + 'a' : s[k]);
        }
        for (size_t k = 0; k < *n_out; k++) {
            if (strcmp((*out)[k], copy) == 0) {
                free(copy);
                return config_fail_node(c, item, "%s[%zu]: %s is listed twice", f->name, i,
                                        config_quote(q, s, len));
            }
        }
        (*out)[i] = copy;
        *n_out = i + 1;
    }
    return 0;
}

/* Reads fingerprint_fields (ignore false) or fingerprint_ignore (ignore true): a list of at
 * most FP_POINTERS_MAX JSON Pointers, each one fp_pointer_check() allows and listed once,
 * into an owned array of owned strings. Leaves the output alone when the field is absent or
 * null. */
static int parsePointers(struct ctx *c, const struct field *f, bool ignore, char ***out,
                         size_t *n_out)
{
    if (!config_present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, v, "%s: expected a list of JSON pointers, got %s", f->name,
                                config_kind_name(v));
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > FP_POINTERS_MAX) {
        return config_fail_node(c, v, "%s: at most %d JSON pointers, got %zu", f->name,
                                FP_POINTERS_MAX, n);
    }
    *out = calloc(n > 0 ? n : 1, sizeof **out);
    if (*out == NULL) {
        return config_fail_node(c, v, "%s: out of memory", f->name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (config_visit(c, v->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        if (item->type != YAML_SCALAR_NODE) {
            return config_fail_node(c, item, "%s[%zu]: expected a JSON pointer, got %s", f->name, i,
                                    config_kind_name(item));
        }
        const char *s = config_scalar_text(item);
        size_t len = item->data.scalar.length;
        char q[QUOTE_SIZE];
        const char *rule = fp_pointer_check(s, len, ignore);
        if (rule != NULL) {
            return config_fail_node(c, item, "%s[%zu]: %s, got %s", f->name, i, rule,
                                    config_quote(q, s, len));
        }
        for (size_t k = 0; k < *n_out; k++) {
            if (strcmp((*out)[k], s) == 0) {
                return config_fail_node(c, item, "%s[%zu]: %s is listed twice", f->name, i,
                                        config_quote(q, s, len));
            }
        }
        if (((*out)[i] = strdup(s)) == NULL) {
            return config_fail_node(c, item, "%s: out of memory", f->name);
        }
        *n_out = i + 1;
    }
    return 0;
}

/* Reads "http://HOST[:PORT][/]" where HOST is an IPv4 literal or localhost. */
static int parseUpstream(struct ctx *c, const struct field *f, struct config_proxy_route *r)
{
    const char *s;
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    config_quote(q, s, len);
    static const char scheme[] = "http://";
    if (len < sizeof scheme || strncmp(s, scheme, sizeof scheme - 1) != 0) {
        return config_fail_node(c, f->val, "%s: expected http://HOST:PORT (http only), got %s",
                                f->name, q);
    }
    const char *h = s + sizeof scheme - 1;
    size_t hlen = strcspn(h, ":/");
    const char *rest = h + hlen;
    unsigned long port = 80;
    if (*rest == ':') {
        const char *p = rest + 1;
        size_t plen = strspn(p, "0123456789");
        if (plen == 0 || plen > 5 || p[0] == '0') {
            return config_fail_node(c, f->val, "%s: the port must be 1..65535, got %s", f->name, q);
        }
        port = strtoul(p, NULL, 10);
        if (port < 1 || port > 65535) {
            return config_fail_node(c, f->val, "%s: the port must be 1..65535, got %s", f->name, q);
        }
        rest = p + plen;
    }
    if (!(rest[0] == '\0' || (rest[0] == '/' && rest[1] == '\0'))) {
        return config_fail_node(c, f->val, "%s: the upstream must not have a path, got %s", f->name,
                                q);
    }
    char host[CONFIG_HOST_MAX + 1];
    if (hlen == 0 || hlen > CONFIG_HOST_MAX) {
        return config_fail_node(c, f->val, "%s: expected http://HOST:PORT, got %s", f->name, q);
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    struct in_addr a;
    if (strcmp(host, "localhost") == 0) {
        snprintf(r->upstream_host, sizeof r->upstream_host, "127.0.0.1");
    } else if (hlen < sizeof r->upstream_host && inet_pton(AF_INET, host, &a) == 1) {
        memcpy(r->upstream_host, host, hlen + 1);
    } else {
        return config_fail_node(
            c, f->val, "%s: the host must be an IPv4 address or localhost, got %s", f->name, q);
    }
    r->upstream_port = (uint16_t)port;
    r->upstream = strdup(s);
    char hp[CONFIG_HOST_MAX + 8];
    snprintf(hp, sizeof hp, "%s:%lu", host, port);
    r->upstream_hostport = strdup(hp);
    if (r->upstream == NULL || r->upstream_hostport == NULL) {
        return config_fail_node(c, f->val, "%s: out of memory", f->name);
    }
    return 0;
}

/* A string field that must be one of names[0..n) (2 or 3) into *out (its index); left alone
 * when absent. */
static int parseChoice(struct ctx *c, const struct field *f, const char *const *names, size_t n,
                       int *out)
{
    if (!config_present(f)) {
        return 0;
    }
    const char *s;
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    char q[QUOTE_SIZE];
    config_quote(q, s, strlen(s));
    if (n == 2) {
        return config_fail_node(c, f->val, "%s: expected %s or %s, got %s", f->name, names[0],
                                names[1], q);
    }
    return config_fail_node(c, f->val, "%s: expected %s, %s or %s, got %s", f->name, names[0],
                            names[1], names[2], q);
}

/* path_prefix: default "/"; must start with '/', and is kept normalised as request paths are
 * (proxy_rules.h): a prefix the normalisation refuses, or with a query, could never match. */
static int parsePrefix(struct ctx *c, yaml_node_t *map, const char *where, const struct field *f,
                       struct config_proxy_route *r)
{
    if (config_get_path(c, f, &r->path_prefix) != 0) {
        return -1;
    }
    if (r->path_prefix == NULL) {
        r->path_prefix = strdup("/");
        return r->path_prefix != NULL ? 0 : config_fail_node(c, map, "%s: out of memory", where);
    }
    size_t len = strlen(r->path_prefix), out_len = 0, path_len = 0;
    char q[QUOTE_SIZE];
    config_quote(q, r->path_prefix, len);
    if (r->path_prefix[0] != '/') {
        return config_fail_node(c, f->val, "%s: must start with '/', got %s", f->name, q);
    }
    char *norm = malloc(len + 1);
    if (norm == NULL) {
        return config_fail_node(c, f->val, "%s: out of memory", f->name);
    }
    int rc = proxy_path_normalise(r->path_prefix, len, norm, &out_len, &path_len);
    if (rc != PROXY_PATH_OK || path_len != out_len) {
        free(norm);
        return config_fail_node(c, f->val, "%s: %s, got %s", f->name,
                                rc != PROXY_PATH_OK ? proxy_path_strerror(rc)
                                                    : "a prefix must not have a query ('?')",
                                q);
    }
    free(r->path_prefix);
    r->path_prefix = norm;
    return 0;
}

/* caller_identity: absent (the default headers), `none`, or a mapping {headers: [names],
 * tls_client_subject: false}. tls_client_subject is the name kept for the TLS client
 * certificate's subject, which needs TLS on the proxy listener (not there yet). */
static int parseCallerIdentity(struct ctx *c, const struct field *f, struct config_proxy_route *r)
{
    if (!config_present(f)) {
        return 0;
    }
    yaml_node_t *v = f->val;
    if (v->type == YAML_SCALAR_NODE) {
        char q[QUOTE_SIZE];
        if (strcmp(config_scalar_text(v), "none") != 0) {
            return config_fail_node(c, v, "%s: expected none or a mapping {headers: [...]}, got %s",
                                    f->name,
                                    config_quote(q, config_scalar_text(v), v->data.scalar.length));
        }
        r->caller_none = true;
        for (size_t k = 0; k < r->n_caller_headers; k++) {
            free(r->caller_headers[k]);
        }
        free(r->caller_headers);
        r->caller_headers = NULL;
        r->n_caller_headers = 0;
        return 0;
    }
    enum { HEADERS, TLS_SUBJECT, N };
    static const char *const keys[N] = {"headers", "tls_client_subject"};
    struct field g[N];
    bool tls = false;
    if (config_map_fields(c, v, f->name, f->name, keys, N, g) != 0 ||
        config_required(c, &g[HEADERS]) != 0 ||
        parseHeaderNames(c, &g[HEADERS], &r->caller_headers, &r->n_caller_headers) != 0 ||
        config_get_bool(c, &g[TLS_SUBJECT], &tls) != 0) {
        return -1;
    }
    if (r->n_caller_headers == 0) {
        return config_fail_node(c, g[HEADERS].val,
                                "%s: at least one header name is required (caller_identity: "
                                "none shares the records between callers)",
                                g[HEADERS].name);
    }
    if (tls) {
        return config_fail_node(c, g[TLS_SUBJECT].val,
                                "%s: needs TLS on the proxy listener, which idemd does not have "
                                "yet; name request headers instead",
                                g[TLS_SUBJECT].name);
    }
    return 0;
}

/* The route's options against caller leaks (docs/configuration.md, `proxy`): other_methods,
 * method_override, caller_identity and replay_set_cookie, with the checks that tie them to
 * response_headers and to the tenant's key_max_len. */
static int parseRouteGuards(struct ctx *c, const struct field *other, const struct field *ovr,
                            const struct field *caller, const struct field *cookie,
                            const struct field *resp, const struct config_tenant *t,
                            const struct field *tenant, struct config_proxy_route *r)
{
    static const char *const others[] = {"pass_safe", "pass", "refuse"};
    static const char *const overrides[] = {"strip", "refuse"};
    int om = (int)r->other_methods, mo = r->method_override_refuse;
    r->caller_headers = calloc(2, sizeof *r->caller_headers);
    if (r->caller_headers == NULL || (r->caller_headers[0] = strdup("authorization")) == NULL ||
        (r->caller_headers[1] = strdup("cookie")) == NULL) {
        r->n_caller_headers = r->caller_headers != NULL ? 2 : 0;
        return config_fail_node(c, tenant->val, "%s: out of memory", tenant->name);
    }
    r->n_caller_headers = 2;
    if (parseChoice(c, other, others, 3, &om) != 0 || parseChoice(c, ovr, overrides, 2, &mo) != 0 ||
        parseCallerIdentity(c, caller, r) != 0 ||
        config_get_bool(c, cookie, &r->replay_set_cookie) != 0) {
        return -1;
    }
    r->other_methods = (enum config_other_methods)om;
    r->method_override_refuse = mo == 1;
    for (size_t i = 0; i < r->n_response_headers && !r->replay_set_cookie; i++) {
        if (strcmp(r->response_headers[i], "set-cookie") == 0) {
            return config_fail_node(c, resp->val,
                                    "%s: set-cookie is stored and replayed only with "
                                    "replay_set_cookie: true",
                                    resp->name);
        }
    }
    if (r->replay_set_cookie && r->caller_none) {
        return config_fail_node(c, cookie->val,
                                "%s: needs a caller identity (not caller_identity: none): a "
                                "replayed cookie would go to another caller",
                                cookie->name);
    }
    if (!r->caller_none && t->key_max_len < PROXY_NS_KEY_LEN) {
        const struct field *at = config_present(caller) ? caller : tenant;
        char q[QUOTE_SIZE];
        return config_fail_node(c, at->val,
                                "%s: tenant %s has key_max_len %u, and a caller's record is "
                                "kept under a %d-byte key: raise key_max_len to %d or more, or "
                                "set caller_identity: none",
                                at->name, config_quote(q, t->name, strlen(t->name)),
                                (unsigned)t->key_max_len, PROXY_NS_KEY_LEN, PROXY_NS_KEY_LEN);
    }
    return 0;
}

static int parseRoute(struct ctx *c, yaml_node_t *map, const char *where,
                      const struct config *cfg, struct config_proxy_route *r)
{
    /* clang-format off */
    enum {
        METHODS, PREFIX, UPSTREAM, TENANT, LEASE, TTL, POLICY, MISMATCH, IN_PROGRESS, FP_HEADERS,
        STORE_4XX, ON_TIMEOUT, TIMEOUT, RESP_HEADERS, MAX_INLINE, KEY_REQUIRED, OTHER_METHODS,
        METHOD_OVERRIDE, CALLER, SET_COOKIE, FP_FIELDS, FP_IGNORE, N
    };
    static const char *const keys[N] = {
        "methods",         "path_prefix",         "upstream",           "tenant",
        "lease_ms",        "ttl_ms",              "lease_policy",       "mismatch_status",
        "in_progress_status", "fingerprint_headers", "store_4xx",       "on_timeout",
        "upstream_timeout_ms", "response_headers", "max_inline_body",   "key_required",
        "other_methods",   "method_override",     "caller_identity",    "replay_set_cookie",
        "fingerprint_fields", "fingerprint_ignore"};
    /* clang-format on */
    static const char *const timeouts[] = {"unknown", "release"};
    struct field f[N];
    r->methods = CONFIG_M_POST | CONFIG_M_PUT | CONFIG_M_PATCH | CONFIG_M_DELETE;
    r->mismatch_status = 409;
    r->in_progress_status = 409;
    r->on_timeout_unknown = true;
    r->upstream_timeout_ms = 10000;
    r->max_inline_body = 1u << 20;
    r->key_required = true;
    /* What a replay keeps by default: the type and the headers that point at what the
     * request made (docs/configuration.md). */
    static const char *const stored[] = {"content-type", "location", "content-location", "etag",
                                         "link"};
    const size_t n_stored = sizeof stored / sizeof stored[0];
    r->response_headers = calloc(n_stored, sizeof *r->response_headers);
    for (size_t i = 0; r->response_headers != NULL && i < n_stored; i++) {
        if ((r->response_headers[i] = strdup(stored[i])) == NULL) {
            return config_fail_node(c, map, "%s: out of memory", where);
        }
        r->n_response_headers = i + 1;
    }
    if (r->response_headers == NULL) {
        return config_fail_node(c, map, "%s: out of memory", where);
    }
    if (config_map_fields(c, map, where, where, keys, N, f) != 0 ||
        parseMethods(c, &f[METHODS], &r->methods) != 0 ||
        parsePrefix(c, map, where, &f[PREFIX], r) != 0 || config_required(c, &f[UPSTREAM]) != 0 ||
        parseUpstream(c, &f[UPSTREAM], r) != 0 || config_required(c, &f[TENANT]) != 0) {
        return -1;
    }
    const char *tn;
    if (config_string_value(c, &f[TENANT], &tn) != 0) {
        return -1;
    }
    size_t ti = 0;
    while (ti < cfg->n_tenants && strcmp(cfg->tenants[ti].name, tn) != 0) {
        ti++;
    }
    if (ti == cfg->n_tenants) {
        char q[QUOTE_SIZE];
        return config_fail_node(c, f[TENANT].val, "%s: unknown tenant %s (not in tenants)",
                                f[TENANT].name, config_quote(q, tn, strlen(tn)));
    }
    r->tenant = ti;
    r->mismatch_status = cfg->tenants[ti].mismatch_status;
    /* 0: the tenant's default. */
    if (config_get_u64(c, &f[LEASE], 0, DAY_MS, &r->lease_ms) != 0 ||
        config_get_u64(c, &f[TTL], 0, 365 * DAY_MS, &r->ttl_ms) != 0) {
        return -1;
    }
    if (config_present(&f[POLICY])) {
        if (config_tenants_lease_policy(c, &f[POLICY], &r->lease_policy) != 0) {
            return -1;
        }
        r->lease_policy_set = true;
    }
    int unknown = r->on_timeout_unknown ? 0 : 1;
    if (config_status_choice(c, &f[MISMATCH], 409, 422, &r->mismatch_status) != 0 ||
        config_status_choice(c, &f[IN_PROGRESS], 409, 425, &r->in_progress_status) != 0 ||
        parseHeaderNames(c, &f[FP_HEADERS], &r->fingerprint_headers, &r->n_fingerprint_headers) !=
            0 ||
        parsePointers(c, &f[FP_FIELDS], false, &r->fingerprint_fields, &r->n_fingerprint_fields) !=
            0 ||
        parsePointers(c, &f[FP_IGNORE], true, &r->fingerprint_ignore, &r->n_fingerprint_ignore) !=
            0 ||
        config_get_bool(c, &f[STORE_4XX], &r->store_4xx) != 0 ||
        parseChoice(c, &f[ON_TIMEOUT], timeouts, 2, &unknown) != 0) {
        return -1;
    }
    r->on_timeout_unknown = unknown == 0;
    if (config_get_u32(c, &f[TIMEOUT], 1, 3600000, &r->upstream_timeout_ms) != 0 ||
        parseHeaderNames(c, &f[RESP_HEADERS], &r->response_headers, &r->n_response_headers) != 0 ||
        config_get_u64(c, &f[MAX_INLINE], 0, 64u << 20, &r->max_inline_body) != 0 ||
        config_get_bool(c, &f[KEY_REQUIRED], &r->key_required) != 0) {
        return -1;
    }
    return parseRouteGuards(c, &f[OTHER_METHODS], &f[METHOD_OVERRIDE], &f[CALLER], &f[SET_COOKIE],
                            &f[RESP_HEADERS], &cfg->tenants[ti], &f[TENANT], r);
}

static int parseProxyListener(struct ctx *c, yaml_node_t *map, size_t index, struct config *cfg,
                              struct config_proxy *p)
{
    enum { ADDRESS, ROUTES, N };
    static const char *const keys[N] = {"address", "routes"};
    char where[FIELD_NAME_MAX];
    snprintf(where, sizeof where, "proxy[%zu]", index);
    struct field f[N];
    if (config_map_fields(c, map, where, where, keys, N, f) != 0 ||
        config_required(c, &f[ADDRESS]) != 0 || config_get_addr(c, &f[ADDRESS], &p->address) != 0) {
        return -1;
    }
    if (p->address.port == 0) {
        return config_fail_node(c, f[ADDRESS].val, "%s: must not be empty", f[ADDRESS].name);
    }
    if (config_addr_same(&p->address, &cfg->node.http_address) ||
        config_addr_same(&p->address, &cfg->node.rpc_address) ||
        config_addr_same(&p->address, &cfg->node.raft_address)) {
        return config_fail_node(c, f[ADDRESS].val, "%s: the address is already used by node",
                                f[ADDRESS].name);
    }
    for (size_t i = 0; i < index; i++) {
        if (config_addr_same(&cfg->proxies[i].address, &p->address)) {
            return config_fail_node(c, f[ADDRESS].val,
                                    "%s: the address is already used by proxy[%zu]",
                                    f[ADDRESS].name, i);
        }
    }
    if (config_required(c, &f[ROUTES]) != 0) {
        return -1;
    }
    yaml_node_t *list = f[ROUTES].val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, list, "%s: expected a list, got %s", f[ROUTES].name,
                                config_kind_name(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return config_fail_node(c, list, "%s: at least one route is required", f[ROUTES].name);
    }
    p->routes = calloc(n, sizeof *p->routes);
    if (p->routes == NULL) {
        return config_fail_node(c, list, "%s: out of memory", f[ROUTES].name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        char rwhere[FIELD_NAME_MAX + 32];
        snprintf(rwhere, sizeof rwhere, "%s.routes[%zu]", where, i);
        if (config_visit(c, list->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        int rc = parseRoute(c, item, rwhere, cfg, &p->routes[i]);
        p->n_routes = i + 1;
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

/* config_list_each's call for proxy[i]. */
static int proxyItem(struct ctx *c, yaml_node_t *item, size_t i, struct config *cfg)
{
    return parseProxyListener(c, item, i, cfg, &cfg->proxies[i]);
}

int config_proxy_parse(struct ctx *c, const struct field *f, struct config *cfg)
{
    size_t n;
    if (config_list_len(c, f, NULL, &n) != 0) {
        return -1;
    }
    if (n == 0) {
        return 0;
    }
    cfg->proxies = calloc(n, sizeof *cfg->proxies);
    if (cfg->proxies == NULL) {
        return config_fail_node(c, f->val, "%s: out of memory", f->name);
    }
    return config_list_each(c, f, cfg, &cfg->n_proxies, proxyItem);
}
