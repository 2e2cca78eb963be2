/* config_internal: what the configuration loader's files share (config.c: reading the YAML
 * node tree, typed values, messages, parse/load/free; config_sections.c: the top level and
 * the node, cluster, raft, rpc, batch, http, expiry, tls and admin sections;
 * config_tenants.c; config_proxy.c). Nothing else includes it. */
#ifndef IDEM_SERVER_CONFIG_INTERNAL_H
#define IDEM_SERVER_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "config.h"

/* Room for a field's dotted name in messages, e.g. "tenants[3].token_sha256[1]". */
#define FIELD_NAME_MAX 96

/* The most keys one mapping of the format may hold (a proxy route has 22). */
#define FIELDS_MAX 22

/* How many bytes of a value a message quotes; longer values end in "...". */
#define QUOTE_MAX 40
#define QUOTE_SIZE (QUOTE_MAX * 4 + 8)

/* Bounds of the cluster secret (rpc.cluster_secret_file), in bytes after trimming. */
#define SECRET_MIN 16
#define SECRET_MAX 4096
/* Trailing whitespace read past SECRET_MAX bytes, to be dropped (a secret of SECRET_MAX bytes
 * and a newline is SECRET_MAX bytes). */
#define SECRET_TAIL_MAX 64
/* Raft secrets: a peer that listens at a member's address gets MACs made with them, so they
 * must not be guessable (cluster.h, CLUSTER_SECRET_MIN). */

/* The IDs a JSON integer can carry exactly, and idemctl can name (docs/idemctl.md). */
#define NODE_ID_MAX ((uint64_t)INT64_MAX)
#define DAY_MS CONFIG_LEASE_MAX_MS

/* One slot of config_tenants.c's index (struct tenant_index). */
struct tenant_slot {
    uint64_t hash;   /* XXH3 of the name, or of the token hash */
    uint32_t tenant; /* 1 + the tenant's index in cfg->tenants; 0: the slot is empty */
    uint32_t item;   /* the token hash's index in the tenant's token_hashes */
};

/* The names and token hashes of the tenants read so far, by open addressing, so that each
 * new one is checked unique with one lookup instead of a pass over every tenant before it
 * (40,000 tenants took 9 s to parse, on the loop that a reload runs on). Both tables are at
 * most half full. An index fits in uint32_t: every tenant and every hash is a node of the
 * document, and libyaml counts nodes in an int. */
struct tenant_index {
    struct tenant_slot *names; /* names_mask + 1 slots */
    size_t names_mask;
    struct tenant_slot *hashes; /* hashes_mask + 1 slots, doubled as hashes come */
    size_t hashes_mask;
    size_t n_hashes;
};

/* One walk over one parsed document. */
struct ctx {
    const char *name; /* FILE in messages */
    const char *text; /* the input, to place libyaml's reader errors */
    size_t len;
    yaml_document_t *doc;
    unsigned char *seen; /* one flag per node of doc: reached already (aliases) */
    size_t n_nodes;
    char *err;
    size_t errlen;
    const yaml_node_t *secret_node;        /* rpc.cluster_secret_file's value, for the checks that
                                            * follow the tenants */
    const yaml_node_t *raft_secret_node;   /* raft.secret_file's, likewise */
    const yaml_node_t *raft_previous_node; /* raft.previous_secret_file's */
    const yaml_node_t *insecure_node;      /* rpc.insecure_cluster_secret's value */
    const yaml_node_t *tls_http_node;      /* tls.http's value, tls.proxy's */
    const yaml_node_t *tls_proxy_node;
    struct tenant_index tenant_index; /* config_tenants.c's, while it reads the list */
};

/* One key of a mapping, as config_map_fields() found it. */
struct field {
    const char *key;           /* the key this slot is for */
    char name[FIELD_NAME_MAX]; /* dotted name for messages, e.g. "raft.pre_vote" */
    const char *where;         /* the mapping's name for messages, e.g. "raft" */
    yaml_node_t *map;          /* the mapping, to place "missing key" */
    yaml_node_t *knode;        /* the key node; NULL when the key is absent */
    yaml_node_t *val;          /* the value node; NULL when the key is absent */
};

/* ---- config.c: messages, the tree, typed values ---- */

/* Writes a message "FILE:LINE:COLUMN: ..." placed at node n's start; returns -1. */
__attribute__((format(printf, 3, 4))) int config_fail_node(struct ctx *c, const yaml_node_t *n,
                                                           const char *fmt, ...);

/* "FILE:LINE:COLUMN" of node n (malloc'd, the caller's; NULL when out of memory). */
char *config_position(struct ctx *c, const yaml_node_t *n);

/* Writes s (len bytes) into out as a double-quoted string for a message: printable ASCII as
 * is, other bytes as \xNN, at most QUOTE_MAX bytes of s and then "...", and every run of 16
 * or more hex digits that holds a letter as "<hex>". Returns out. Never call it on a token
 * hash field. */
const char *config_quote(char out[QUOTE_SIZE], const char *s, size_t len);

/* A scalar's text; NUL-terminated by libyaml. */
const char *config_scalar_text(const yaml_node_t *n);

/* "a mapping", "a list", "a string"...: a node's kind for messages. */
const char *config_kind_name(const yaml_node_t *n);

/* Fetches node `index` of the document into *out, refusing a node reached before (an alias
 * or a cycle). */
int config_visit(struct ctx *c, int index, yaml_node_t **out);

/* Whether the field has a non-null value. */
bool config_present(const struct field *f);

/* Reads the mapping `map` whose allowed keys are keys[0..nkeys) into fields[0..nkeys).
 * `where` names the mapping in messages ("the top level", "raft", "tenants[0]"); `prefix`
 * starts each field's dotted name ("" at the top level). Both must outlive fields. Unknown
 * keys, duplicate keys and keys that are not scalars are errors. */
int config_map_fields(struct ctx *c, yaml_node_t *map, const char *where, const char *prefix,
                      const char *const *keys, size_t nkeys, struct field *fields);

/* Fails unless the field has a value. */
int config_required(struct ctx *c, const struct field *f);

/* Read a decimal integer in [min, max] into *out; leave *out alone when the field is absent
 * or null. Only plain scalars of digits count: no sign, no leading zeros (YAML 1.1 would read
 * 010 as octal), no hex, no underscores. */
int config_get_u64(struct ctx *c, const struct field *f, uint64_t min, uint64_t max, uint64_t *out);
int config_get_u32(struct ctx *c, const struct field *f, uint32_t min, uint32_t max, uint32_t *out);

/* Reads true/false/yes/no (also capitalised or upper-case) into *out; leaves *out alone
 * when the field is absent or null. */
int config_get_bool(struct ctx *c, const struct field *f, bool *out);

/* Checks that the value of a present field is a scalar without NUL bytes and returns its
 * text in *s. */
int config_string_value(struct ctx *c, const struct field *f, const char **s);

/* Copies a string field into *out (owned, malloc'd); leaves *out alone (NULL) when the field
 * is absent, null or "". */
int config_get_path(struct ctx *c, const struct field *f, char **out);

/* Reads "host:port" into *out; leaves it empty when the field is absent, null or "". */
int config_get_addr(struct ctx *c, const struct field *f, struct config_addr *out);

/* Reads 64 hex digits at node v into out. The value is a secret's digest: messages name the
 * field (`name`) and never quote the value. */
int config_hash_value(struct ctx *c, const yaml_node_t *v, const char *name,
                      uint8_t out[CONFIG_HASH_LEN]);

/* A list field's length into *n; fails when it is not a list, or is empty and `empty` (the
 * message) is not NULL. */
int config_list_len(struct ctx *c, const struct field *f, const char *empty, size_t *n);

/* Calls each(c, item node, i, cfg) for every item of list field f in order; *count (the
 * list's element count in cfg) covers every item each() was called for, complete or not, so
 * that config_free() frees what a failed one holds. */
typedef int (*config_item_fn)(struct ctx *c, yaml_node_t *item, size_t i, struct config *cfg);
int config_list_each(struct ctx *c, const struct field *f, struct config *cfg, size_t *count,
                     config_item_fn each);

/* ---- the sections ---- */

/* config_sections.c: reads the top-level mapping and every section into cfg, then checks
 * that no secret is also a token. */
int config_sections_parse_root(struct ctx *c, yaml_node_t *root, struct config *cfg);

/* config_tenants.c: the tenants list (required, not empty). */
int config_tenants_parse(struct ctx *c, const struct field *f, struct config *cfg);
/* A lease_policy field ("conflict" or "takeover") into *out; left alone when absent. */
/* A status field that must be a or b (409 or 422, 409 or 425) into *out; left alone when
 * absent. */
int config_status_choice(struct ctx *c, const struct field *f, uint32_t a, uint32_t b,
                         uint32_t *out);
int config_tenants_lease_policy(struct ctx *c, const struct field *f,
                                enum config_lease_policy *out);

/* config_proxy.c: the proxy listeners. */
int config_proxy_parse(struct ctx *c, const struct field *f, struct config *cfg);

#endif
