/* config_tenants: the configuration's tenants list: names, token hashes (unique across
 * tenants and the admin token), quotas, leases, ttls and the status of a reused key
 * (config_internal.h). */
#include "config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "key.h"

/* Checks that a token hash just read at node v (field `name`) is not the admin's nor one of
 * the tenants' already read; tenants[0..n) are complete and `self` holds n_self hashes. */
static int uniqueHash(struct ctx *c, const struct config *cfg, const struct config_tenant *self,
                      size_t n_self, const uint8_t h[CONFIG_HASH_LEN], const yaml_node_t *v,
                      const char *name)
{
    if (memcmp(h, cfg->admin_token_sha256, CONFIG_HASH_LEN) == 0) {
        return config_fail_node(c, v,
                                "%s: equals admin.token_sha256; the admin token must differ "
                                "from every tenant's",
                                name);
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        const struct config_tenant *t = &cfg->tenants[i];
        for (size_t j = 0; j < t->n_token_hashes; j++) {
            if (memcmp(h, t->token_hashes[j], CONFIG_HASH_LEN) == 0) {
                char q[QUOTE_SIZE];
                return config_fail_node(c, v, "%s: the same hash is already a token of tenant %s",
                                        name, config_quote(q, t->name, strlen(t->name)));
            }
        }
    }
    for (size_t j = 0; j < n_self; j++) {
        if (memcmp(h, self->token_hashes[j], CONFIG_HASH_LEN) == 0) {
            return config_fail_node(c, v, "%s: the same hash is listed twice", name);
        }
    }
    return 0;
}

/* Reads a tenant's token_sha256: one hash or a list of at least one. */
static int parseTokens(struct ctx *c, const struct config *cfg, const struct field *f,
                       struct config_tenant *t)
{
    const yaml_node_t *v = f->val;
    size_t n = 1;
    if (v->type == YAML_SEQUENCE_NODE) {
        n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
        if (n == 0) {
            return config_fail_node(c, v, "%s: at least one hash is required", f->name);
        }
    } else if (v->type != YAML_SCALAR_NODE) {
        return config_fail_node(c, v, "%s: expected a hash or a list of hashes, got %s", f->name,
                                config_kind_name(v));
    }
    t->token_hashes = calloc(n, sizeof *t->token_hashes);
    if (t->token_hashes == NULL) {
        return config_fail_node(c, v, "%s: out of memory", f->name);
    }
    if (v->type == YAML_SCALAR_NODE) {
        if (config_hash_value(c, v, f->name, t->token_hashes[0]) != 0 ||
            uniqueHash(c, cfg, t, 0, t->token_hashes[0], v, f->name) != 0) {
            return -1;
        }
        t->n_token_hashes = 1;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char name[FIELD_NAME_MAX + 24]; /* room for f->name and "[index]" */
        snprintf(name, sizeof name, "%s[%zu]", f->name, i);
        yaml_node_t *item = NULL;
        if (config_visit(c, v->data.sequence.items.start[i], &item) != 0 ||
            config_hash_value(c, item, name, t->token_hashes[i]) != 0 ||
            uniqueHash(c, cfg, t, i, t->token_hashes[i], item, name) != 0) {
            return -1;
        }
        t->n_token_hashes = i + 1;
    }
    return 0;
}

static int parseTenantName(struct ctx *c, const struct config *cfg, const struct field *f,
                           struct config_tenant *t)
{
    const char *s;
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    config_quote(q, s, len);
    if (len == 0 || len > CONFIG_TENANT_NAME_MAX) {
        return config_fail_node(c, f->val, "%s: must be 1..%d bytes, got %zu", f->name,
                                CONFIG_TENANT_NAME_MAX, len);
    }
    if (strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != len) {
        return config_fail_node(
            c, f->val, "%s: may hold only letters, digits, '.', '_' and '-', got %s", f->name, q);
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        if (strcmp(cfg->tenants[i].name, s) == 0) {
            return config_fail_node(c, f->val, "%s: duplicate tenant name %s (also tenants[%zu])",
                                    f->name, q, i);
        }
    }
    memcpy(t->name, s, len + 1);
    return 0;
}

int config_status_choice(struct ctx *c, const struct field *f, uint32_t a, uint32_t b,
                         uint32_t *out)
{
    uint64_t x = *out;
    if (config_get_u64(c, f, 100, 599, &x) != 0) {
        return -1;
    }
    if (x != a && x != b) {
        return config_fail_node(c, f->val, "%s: expected %u or %u, got %llu", f->name, a, b,
                                (unsigned long long)x);
    }
    *out = (uint32_t)x;
    return 0;
}

int config_tenants_lease_policy(struct ctx *c, const struct field *f, enum config_lease_policy *p)
{
    const char *s;
    if (!config_present(f)) {
        return 0;
    }
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    if (strcmp(s, "conflict") == 0) {
        *p = CONFIG_LEASE_CONFLICT;
    } else if (strcmp(s, "takeover") == 0) {
        *p = CONFIG_LEASE_TAKEOVER;
    } else {
        char q[QUOTE_SIZE];
        return config_fail_node(c, f->val, "%s: expected conflict or takeover, got %s", f->name,
                                config_quote(q, s, strlen(s)));
    }
    return 0;
}

/* Reads tenants[index] into t; cfg->tenants[0..cfg->n_tenants) are complete. */
static int parseTenant(struct ctx *c, yaml_node_t *map, size_t index, const struct config *cfg,
                       struct config_tenant *t)
{
    /* clang-format off */
    enum { NAME, TOKEN, MAX_RECORDS, MAX_BYTES, KEY_LEN, LEASE, TTL, TOMBSTONE, POLICY, MISMATCH,
           N };
    /* clang-format on */
    static const char *const keys[N] = {
        "name",     "token_sha256", "max_records",      "max_bytes",    "key_max_len",
        "lease_ms", "ttl_ms",       "tombstone_ttl_ms", "lease_policy", "mismatch_status"};
    char where[FIELD_NAME_MAX];
    snprintf(where, sizeof where, "tenants[%zu]", index);
    struct field f[N];
    t->max_records = CONFIG_DEFAULT_MAX_RECORDS;
    t->max_bytes = CONFIG_DEFAULT_MAX_BYTES;
    t->key_max_len = KEY_MAX_LEN;
    t->lease_ms = 30000;
    t->ttl_ms = DAY_MS;
    t->lease_policy = CONFIG_LEASE_CONFLICT;
    t->mismatch_status = 409;
    if (config_map_fields(c, map, where, where, keys, N, f) != 0 ||
        config_required(c, &f[NAME]) != 0 || parseTenantName(c, cfg, &f[NAME], t) != 0 ||
        config_required(c, &f[TOKEN]) != 0 || parseTokens(c, cfg, &f[TOKEN], t) != 0 ||
        config_get_u64(c, &f[MAX_RECORDS], 0, UINT64_MAX, &t->max_records) != 0 ||
        config_get_u64(c, &f[MAX_BYTES], 0, UINT64_MAX, &t->max_bytes) != 0 ||
        config_get_u32(c, &f[KEY_LEN], 1, KEY_MAX_LEN, &t->key_max_len) != 0 ||
        config_get_u64(c, &f[LEASE], 1, DAY_MS, &t->lease_ms) != 0 ||
        config_get_u64(c, &f[TTL], 1, 365 * DAY_MS, &t->ttl_ms) != 0 ||
        config_get_u64(c, &f[TOMBSTONE], 0, 365 * DAY_MS, &t->tombstone_ttl_ms) != 0 ||
        config_tenants_lease_policy(c, &f[POLICY], &t->lease_policy) != 0 ||
        config_status_choice(c, &f[MISMATCH], 409, 422, &t->mismatch_status) != 0) {
        return -1;
    }
    /* docs/contract.md: a tombstone is kept, by default, as long as the ttl. */
    if (t->tombstone_ttl_ms == 0) {
        t->tombstone_ttl_ms = t->ttl_ms;
    }
    return 0;
}

/* config_list_each's call for tenants[i]. parseTenant() compares with tenants[0..i) only;
 * the tenant is counted whether or not it is complete, so that config_free() frees its
 * hashes after a failure. */
static int tenantItem(struct ctx *c, yaml_node_t *item, size_t i, struct config *cfg)
{
    return parseTenant(c, item, i, cfg, &cfg->tenants[i]);
}

int config_tenants_parse(struct ctx *c, const struct field *f, struct config *cfg)
{
    size_t n;
    if (config_list_len(c, f, "at least one tenant is required", &n) != 0) {
        return -1;
    }
    cfg->tenants = calloc(n, sizeof *cfg->tenants);
    if (cfg->tenants == NULL) {
        return config_fail_node(c, f->val, "%s: out of memory", f->name);
    }
    return config_list_each(c, f, cfg, &cfg->n_tenants, tenantItem);
}
