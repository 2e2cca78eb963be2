/* config_tenants: the configuration's tenants list: names, token hashes (unique across
 * tenants and the admin token), quotas, leases, ttls and the status of a reused key
 * (config_internal.h). */
#include "config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "key.h"

/* ---- the index of names and token hashes (struct tenant_index) ---- */

/* The slots for n entries: the smallest power of two that keeps them at most half full. */
static size_t slotsFor(size_t n)
{
    size_t slots = 16;
    while (slots < 2 * n) {
        slots *= 2;
    }
    return slots;
}

/* The slot of tenant name s (its XXH3 h): the one that holds it, or the empty one where it
 * goes. */
static struct tenant_slot *nameSlot(const struct tenant_index *x, const struct config *cfg,
                                    const char *s, uint64_t h)
{
    for (size_t i = h & x->names_mask;; i = (i + 1) & x->names_mask) {
        struct tenant_slot *slot = &x->names[i];
        if (slot->tenant == 0 ||
            (slot->hash == h && strcmp(cfg->tenants[slot->tenant - 1].name, s) == 0)) {
            return slot;
        }
    }
}

/* The slot of token hash d (its XXH3 h), likewise. */
static struct tenant_slot *hashSlot(const struct tenant_index *x, const struct config *cfg,
                                    const uint8_t d[CONFIG_HASH_LEN], uint64_t h)
{
    for (size_t i = h & x->hashes_mask;; i = (i + 1) & x->hashes_mask) {
        struct tenant_slot *slot = &x->hashes[i];
        if (slot->tenant == 0 ||
            (slot->hash == h && memcmp(cfg->tenants[slot->tenant - 1].token_hashes[slot->item], d,
                                       CONFIG_HASH_LEN) == 0)) {
            return slot;
        }
    }
}

/* Doubles the hash table when one more hash would fill it past half: the list's length
 * sized it for one hash a tenant, and a tenant may list several. */
static int hashesMakeRoom(struct tenant_index *x)
{
    if ((x->n_hashes + 1) * 2 <= x->hashes_mask + 1) {
        return 0;
    }
    size_t mask = x->hashes_mask * 2 + 1;
    struct tenant_slot *slots = calloc(mask + 1, sizeof *slots);
    if (slots == NULL) {
        return -1;
    }
    for (size_t i = 0; i <= x->hashes_mask; i++) {
        if (x->hashes[i].tenant != 0) {
            size_t j = x->hashes[i].hash & mask;
            while (slots[j].tenant != 0) {
                j = (j + 1) & mask;
            }
            slots[j] = x->hashes[i];
        }
    }
    free(x->hashes);
    x->hashes = slots;
    x->hashes_mask = mask;
    return 0;
}

/* ---- tenants ---- */

/* Checks that a token hash just read at node v (field `name`), item `item` of
 * tenants[index], is not the admin's nor one read before (c->tenant_index holds those of
 * tenants[0..index] read so far), and enters it in the index. */
static int uniqueHash(struct ctx *c, const struct config *cfg, size_t index, size_t item,
                      const uint8_t h[CONFIG_HASH_LEN], const yaml_node_t *v, const char *name)
{
    if (memcmp(h, cfg->admin_token_sha256, CONFIG_HASH_LEN) == 0) {
        return config_fail_node(c, v,
                                "%s: equals admin.token_sha256; the admin token must differ "
                                "from every tenant's",
                                name);
    }
    struct tenant_index *x = &c->tenant_index;
    if (hashesMakeRoom(x) != 0) {
        return config_fail_node(c, v, "%s: out of memory", name);
    }
    uint64_t k = XXH3_64bits(h, CONFIG_HASH_LEN);
    struct tenant_slot *slot = hashSlot(x, cfg, h, k);
    /* The hashes in the index are all different, so one slot at most holds h: its tenant
     * tells the two mistakes apart. */
    if (slot->tenant == index + 1) {
        return config_fail_node(c, v, "%s: the same hash is listed twice", name);
    }
    if (slot->tenant != 0) {
        const struct config_tenant *t = &cfg->tenants[slot->tenant - 1];
        char q[QUOTE_SIZE];
        return config_fail_node(c, v, "%s: the same hash is already a token of tenant %s", name,
                                config_quote(q, t->name, strlen(t->name)));
    }
    slot->hash = k;
    slot->tenant = (uint32_t)(index + 1);
    slot->item = (uint32_t)item;
    x->n_hashes++;
    return 0;
}

/* Reads the token_sha256 of tenants[index] (t): one hash or a list of at least one. */
static int parseTokens(struct ctx *c, const struct config *cfg, const struct field *f, size_t index,
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
            uniqueHash(c, cfg, index, 0, t->token_hashes[0], v, f->name) != 0) {
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
            uniqueHash(c, cfg, index, i, t->token_hashes[i], item, name) != 0) {
            return -1;
        }
        t->n_token_hashes = i + 1;
    }
    return 0;
}

/* Reads the name of tenants[index] (t), unique among the tenants (c->tenant_index holds
 * the names of tenants[0..index)), and enters it in the index. */
static int parseTenantName(struct ctx *c, const struct config *cfg, const struct field *f,
                           size_t index, struct config_tenant *t)
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
    uint64_t h = XXH3_64bits(s, len);
    struct tenant_slot *slot = nameSlot(&c->tenant_index, cfg, s, h);
    if (slot->tenant != 0) {
        return config_fail_node(c, f->val, "%s: duplicate tenant name %s (also tenants[%zu])",
                                f->name, q, (size_t)slot->tenant - 1);
    }
    memcpy(t->name, s, len + 1);
    slot->hash = h;
    slot->tenant = (uint32_t)(index + 1);
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
        config_required(c, &f[NAME]) != 0 || parseTenantName(c, cfg, &f[NAME], index, t) != 0 ||
        config_required(c, &f[TOKEN]) != 0 || parseTokens(c, cfg, &f[TOKEN], index, t) != 0 ||
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

/* config_list_each's call for tenants[i]. parseTenant() compares with tenants[0..i) only
 * (through c->tenant_index); the tenant is counted whether or not it is complete, so that
 * config_free() frees its hashes after a failure. */
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
    /* Both indexes are kept when the list is good (cfg->name_slots, cfg->token_slots), and
     * freed here otherwise. */
    struct tenant_index *x = &c->tenant_index;
    x->names_mask = slotsFor(n) - 1;
    x->names = calloc(x->names_mask + 1, sizeof *x->names);
    x->hashes_mask = x->names_mask;
    x->hashes = calloc(x->hashes_mask + 1, sizeof *x->hashes);
    int rc;
    if (x->names == NULL || x->hashes == NULL) {
        rc = config_fail_node(c, f->val, "%s: out of memory", f->name);
    } else {
        rc = config_list_each(c, f, cfg, &cfg->n_tenants, tenantItem);
    }
    if (rc == 0) {
        cfg->name_slots = x->names;
        cfg->name_mask = x->names_mask;
        cfg->token_slots = x->hashes;
        cfg->token_mask = x->hashes_mask;
    } else {
        free(x->names);
        free(x->hashes);
    }
    memset(x, 0, sizeof *x);
    return rc;
}
