/* The node configuration loader (docs/configuration.md): reading the YAML node tree,
 * typed values and messages, and config_parse/config_load/config_free. The sections are
 * read by config_sections.c, config_tenants.c and config_proxy.c (config_internal.h).
 *
 * libyaml's document API builds the node tree (with a start mark on every node); this file
 * only walks it. Each mapping is read by config_map_fields(), which knows the keys the mapping may
 * hold and rejects unknown and duplicate ones, and each value by a typed getter (integer,
 * boolean, string, address, hash) that checks its range. Cross-field rules (heartbeat below
 * election, TLS cert and key together and required by a TLS listener, unique tenant names,
 * ids and token hashes) come after the fields they relate. Every failure writes one message
 * "FILE:LINE:COLUMN: ..." and returns -1 up to config_parse(), which frees whatever was
 * already built.
 *
 * YAML aliases are refused: the document API resolves an alias to the node it names, so the
 * walker notices a node reached twice and reports it, at the anchored node (the alias's own
 * position is not kept by libyaml). This also rules out the "billion laughs" blow-up.
 *
 * Known untested: the out-of-memory paths (no allocation-failure injection yet). */
#include "config_internal.h"

#include <assert.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The largest file config_load() reads; a configuration is a few kilobytes. */
#define CONFIG_FILE_MAX (16u << 20)

/* ---- messages ---------------------------------------------------------------------------- */

__attribute__((format(printf, 4, 0))) static int vfailAt(struct ctx *c, size_t line, size_t col,
                                                         const char *fmt, va_list ap)
{
    if (c->errlen == 0) {
        return -1;
    }
    int n = snprintf(c->err, c->errlen, "%s:%zu:%zu: ", c->name, line + 1, col + 1);
    if (n >= 0 && (size_t)n < c->errlen) {
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    }
    return -1;
}

/* Writes "FILE:LINE:COLUMN: message" for a 0-based line and column; returns -1. */
__attribute__((format(printf, 4, 5))) static int failAt(struct ctx *c, size_t line, size_t col,
                                                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfailAt(c, line, col, fmt, ap);
    va_end(ap);
    return -1;
}

/* Writes a message placed at node n's start; returns -1. */
int config_fail_node(struct ctx *c, const yaml_node_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfailAt(c, n->start_mark.line, n->start_mark.column, fmt, ap);
    va_end(ap);
    return -1;
}

char *config_position(struct ctx *c, const yaml_node_t *n)
{
    int len =
        snprintf(NULL, 0, "%s:%zu:%zu", c->name, n->start_mark.line + 1, n->start_mark.column + 1);
    char *out = len < 0 ? NULL : malloc((size_t)len + 1);
    if (out != NULL) {
        snprintf(out, (size_t)len + 1, "%s:%zu:%zu", c->name, n->start_mark.line + 1,
                 n->start_mark.column + 1);
    }
    return out;
}

/* Writes "FILE: message" for failures that have no position; returns -1. */
__attribute__((format(printf, 4, 5))) static int failFile(char *err, size_t errlen,
                                                          const char *name, const char *fmt, ...)
{
    if (errlen == 0) {
        return -1;
    }
    int n = snprintf(err, errlen, "%s: ", name);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Writes s (len bytes) into out as a double-quoted string for a message: printable ASCII as
 * is, other bytes as \xNN, at most QUOTE_MAX bytes of s and then "...". Returns out.
 * Never call it on a token hash field. It also hides, as "<hex>", every run of 16 or more hex
 * digits that holds a letter, so that a hash that a typo put into some other place (a key
 * such as "token_sha256:ab12...") is not printed; runs of decimal digits, such as an
 * overflowing number, are kept. */
const char *config_quote(char out[QUOTE_SIZE], const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    size_t i = 0;
    out[o++] = '"';
    while (i < len && i < QUOTE_MAX) {
        size_t run = 0;
        bool letter = false;
        while (i + run < len && OPENSSL_hexchar2int((unsigned char)s[i + run]) >= 0) {
            letter = letter || s[i + run] > '9';
            run++;
        }
        if (run >= 16 && letter) {
            memcpy(out + o, "<hex>", 5);
            o += 5;
            i += run;
            continue;
        }
        if (run > 0) {
            size_t n = run < QUOTE_MAX - i ? run : QUOTE_MAX - i;
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
            continue;
        }
        unsigned char ch = (unsigned char)s[i++];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o++] = '"';
    if (i < len) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* A scalar's text and length; the text is NUL-terminated by libyaml. */
const char *config_scalar_text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

const char *config_kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a scalar";
    }
}

/* ---- the tree ---------------------------------------------------------------------------- */

/* Fetches node `index` of the document into *out, refusing a node reached before (an alias
 * or a cycle). */
int config_visit(struct ctx *c, int index, yaml_node_t **out)
{
    yaml_node_t *n = yaml_document_get_node(c->doc, index);
    assert(n != NULL);
    size_t i = (size_t)(index - 1);
    assert(i < c->n_nodes);
    if (c->seen[i]) {
        return config_fail_node(c, n,
                                "YAML aliases are not supported (this node is referenced by an "
                                "alias)");
    }
    c->seen[i] = 1;
    *out = n;
    return 0;
}

/* Whether n is YAML's null: an empty plain scalar, "~" or "null". */
static bool isNull(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return false;
    }
    const char *s = config_scalar_text(n);
    return n->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Whether the field has a non-null value. */
bool config_present(const struct field *f)
{
    return f->val != NULL && !isNull(f->val);
}

/* Reads the mapping `map` whose allowed keys are keys[0..nkeys) into fields[0..nkeys).
 * `where` names the mapping in messages ("the top level", "raft", "tenants[0]"); `prefix`
 * starts each field's dotted name ("" at the top level). Both must outlive fields. Unknown
 * keys, duplicate keys and keys that are not scalars are errors. */
int config_map_fields(struct ctx *c, yaml_node_t *map, const char *where, const char *prefix,
                      const char *const *keys, size_t nkeys, struct field *fields)
{
    assert(nkeys <= FIELDS_MAX);
    if (map->type != YAML_MAPPING_NODE) {
        return config_fail_node(c, map, "%s%sexpected a mapping, got %s", prefix,
                                *prefix ? ": " : "", config_kind_name(map));
    }
    for (size_t i = 0; i < nkeys; i++) {
        struct field *f = &fields[i];
        f->key = keys[i];
        if (snprintf(f->name, sizeof f->name, "%s%s%s", prefix, *prefix ? "." : "", keys[i]) >=
            (int)sizeof f->name) {
            /* Cut (it is only shown in messages), and seen to be. */
            memcpy(f->name + sizeof f->name - 4, "...", 4);
        }
        f->where = where;
        f->map = map;
        f->knode = NULL;
        f->val = NULL;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = NULL;
        yaml_node_t *v = NULL;
        if (config_visit(c, p->key, &k) != 0) {
            return -1;
        }
        if (k->type != YAML_SCALAR_NODE) {
            return config_fail_node(c, k, "a key in %s is %s; keys must be names", where,
                                    config_kind_name(k));
        }
        size_t i = 0;
        while (i < nkeys && !(strlen(keys[i]) == k->data.scalar.length &&
                              memcmp(keys[i], config_scalar_text(k), k->data.scalar.length) == 0)) {
            i++;
        }
        char q[QUOTE_SIZE];
        if (i == nkeys) {
            return config_fail_node(c, k, "unknown key %s in %s",
                                    config_quote(q, config_scalar_text(k), k->data.scalar.length),
                                    where);
        }
        if (fields[i].knode != NULL) {
            return config_fail_node(c, k, "duplicate key \"%s\" in %s (first at line %zu)", keys[i],
                                    where, (size_t)fields[i].knode->start_mark.line + 1);
        }
        if (config_visit(c, p->value, &v) != 0) {
            return -1;
        }
        fields[i].knode = k;
        fields[i].val = v;
    }
    return 0;
}

/* Fails unless the field has a value. */
int config_required(struct ctx *c, const struct field *f)
{
    if (f->knode == NULL) {
        return config_fail_node(c, f->map, "missing required key \"%s\" in %s", f->key, f->where);
    }
    if (isNull(f->val)) {
        return config_fail_node(c, f->val, "%s: a value is required", f->name);
    }
    return 0;
}

/* ---- typed values ------------------------------------------------------------------------ */

/* Reads a decimal integer in [min, max] into *out; leaves *out alone when the field is
 * absent or null. Only plain scalars of digits count: no sign, no leading zeros (YAML 1.1
 * would read 010 as octal), no hex, no underscores. */
int config_get_u64(struct ctx *c, const struct field *f, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!config_present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SCALAR_NODE) {
        return config_fail_node(c, v, "%s: expected an integer, got %s", f->name,
                                config_kind_name(v));
    }
    const char *s = config_scalar_text(v);
    size_t len = v->data.scalar.length;
    char q[QUOTE_SIZE];
    config_quote(q, s, len);
    if (v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return config_fail_node(c, v, "%s: expected an integer, got the quoted string %s", f->name,
                                q);
    }
    size_t digits = strspn(s, "0123456789");
    if (s[0] == '-' && len > 1 && strspn(s + 1, "0123456789") == len - 1) {
        return config_fail_node(c, v, "%s: must not be negative, got %s", f->name, q);
    }
    if (digits == 0 || digits != len) {
        return config_fail_node(c, v, "%s: expected an integer, got %s", f->name, q);
    }
    if (s[0] == '0' && len > 1) {
        return config_fail_node(
            c, v, "%s: expected a decimal integer without leading zeros, got %s", f->name, q);
    }
    errno = 0;
    char *end = NULL;
    unsigned long long x = strtoull(s, &end, 10);
    if (end != s + len) {
        return config_fail_node(c, v, "%s: expected an integer, got %s", f->name, q);
    }
    if (errno == ERANGE || x < min || x > max) {
        return config_fail_node(c, v, "%s: %s is out of range (%llu..%llu)", f->name, q,
                                (unsigned long long)min, (unsigned long long)max);
    }
    *out = (uint64_t)x;
    return 0;
}

int config_get_u32(struct ctx *c, const struct field *f, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t x = *out;
    if (config_get_u64(c, f, min, max, &x) != 0) {
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

/* Reads true/false/yes/no (also capitalised or upper-case) into *out; leaves *out alone
 * when the field is absent or null. */
int config_get_bool(struct ctx *c, const struct field *f, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO"};
    if (!config_present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SCALAR_NODE) {
        return config_fail_node(c, v, "%s: expected true or false, got %s", f->name,
                                config_kind_name(v));
    }
    char q[QUOTE_SIZE];
    config_quote(q, config_scalar_text(v), v->data.scalar.length);
    if (v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return config_fail_node(c, v, "%s: expected true or false, got the quoted string %s",
                                f->name, q);
    }
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcmp(config_scalar_text(v), yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(config_scalar_text(v), no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return config_fail_node(c, v, "%s: expected true or false, got %s", f->name, q);
}

/* Checks that the value of a present field is a scalar without NUL bytes and returns its
 * text in *s. */
int config_string_value(struct ctx *c, const struct field *f, const char **s)
{
    const yaml_node_t *v = f->val;
    *s = ""; /* on every path: gcc -O3 cannot tell that config_fail_node() never returns 0 */
    if (v->type != YAML_SCALAR_NODE) {
        return config_fail_node(c, v, "%s: expected a string, got %s", f->name,
                                config_kind_name(v));
    }
    if (strlen(config_scalar_text(v)) != v->data.scalar.length) {
        return config_fail_node(c, v, "%s: must not contain a NUL character", f->name);
    }
    *s = config_scalar_text(v);
    return 0;
}

/* Copies a string field into *out (owned, malloc'd); leaves *out alone (NULL) when the field
 * is absent, null or "". */
int config_get_path(struct ctx *c, const struct field *f, char **out)
{
    const char *s;
    if (!config_present(f)) {
        return 0;
    }
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    if (*s == '\0') {
        return 0;
    }
    char *copy = strdup(s);
    if (copy == NULL) {
        return config_fail_node(c, f->val, "%s: out of memory", f->name);
    }
    *out = copy;
    return 0;
}

/* Reads "host:port" into *out; leaves it empty when the field is absent, null or "". */
int config_get_addr(struct ctx *c, const struct field *f, struct config_addr *out)
{
    const char *s;
    if (!config_present(f)) {
        return 0;
    }
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    if (s[0] == '\0') {
        return 0;
    }
    char why[QUOTE_SIZE + 96];
    if (config_addr_parse(s, out, why, sizeof why) != 0) {
        return config_fail_node(c, f->val, "%s: %s", f->name, why);
    }
    return 0;
}

/* Reads 64 hex digits at node v into out. The value is a secret's digest: messages name the
 * field (`name`) and never quote the value. */
int config_hash_value(struct ctx *c, const yaml_node_t *v, const char *name,
                      uint8_t out[CONFIG_HASH_LEN])
{
    if (v->type != YAML_SCALAR_NODE) {
        return config_fail_node(c, v, "%s: expected 64 hex digits (a SHA-256 digest), got %s", name,
                                config_kind_name(v));
    }
    const char *s = config_scalar_text(v);
    size_t len = v->data.scalar.length;
    if (len != 2 * CONFIG_HASH_LEN) {
        return config_fail_node(c, v,
                                "%s: expected 64 hex digits (a SHA-256 digest), got %zu "
                                "characters",
                                name, len);
    }
    for (size_t i = 0; i < CONFIG_HASH_LEN; i++) {
        int hi = OPENSSL_hexchar2int((unsigned char)s[2 * i]);
        int lo = OPENSSL_hexchar2int((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return config_fail_node(c, v,
                                    "%s: expected 64 hex digits (a SHA-256 digest); the value "
                                    "holds a character that is not a hex digit",
                                    name);
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int config_list_len(struct ctx *c, const struct field *f, const char *empty, size_t *n)
{
    yaml_node_t *list = f->val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, list, "%s: expected a list, got %s", f->name,
                                config_kind_name(list));
    }
    *n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (*n == 0 && empty != NULL) {
        return config_fail_node(c, list, "%s: %s", f->name, empty);
    }
    return 0;
}

int config_list_each(struct ctx *c, const struct field *f, struct config *cfg, size_t *count,
                     config_item_fn each)
{
    yaml_node_t *list = f->val;
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (config_visit(c, list->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        int rc = each(c, item, i, cfg);
        *count = i + 1;
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

static void setDefaults(struct config *cfg)
{
    cfg->raft.election_timeout_ms = 300;
    cfg->raft.heartbeat_timeout_ms = 50;
    cfg->raft.snapshot_threshold = 8192;
    cfg->raft.snapshot_trailing = 2048;
    cfg->raft.snapshot_log_percent = 100;
    cfg->raft.snapshot_log_max_mb = 256;
    cfg->raft.snapshot_trailing_max_mb = 256;
    cfg->raft.segment_size_mb = 64;
    cfg->raft.snapshot_nice = 19;
    cfg->raft.pre_vote = true;
    cfg->raft.prefill_segments = true;
    cfg->raft.stuck_write_step_down_ms = 5000;
    cfg->rpc.max_frame_bytes = (4u << 20) + (128u << 10);
    cfg->rpc.default_deadline_ms = 2000;
    cfg->rpc.max_deadline_ms = 60000;
    cfg->rpc.max_connections = 1024;
    cfg->rpc.max_frame_buffer_mb = 256;
    cfg->rpc.max_answer_buffer_mb = 1024;
    cfg->rpc.idle_timeout_ms = 300000;
    cfg->rpc.handshake_timeout_ms = 5000;
    cfg->rpc.first_frame_timeout_ms = 5000;
    cfg->rpc.max_connections_per_address = 256;
    cfg->rpc.member_connections = 32;
    cfg->rpc.unauthenticated_max_frame_bytes = 65536;
    cfg->batch.max_commands = 256;
    cfg->batch.max_bytes = 1u << 20;
    cfg->batch.max_pending_mb = 64;
    cfg->batch.tenant_max_pending_percent = 50;
    cfg->batch.tenant_max_inflight_kb = 2048;
    cfg->batch.delay_us = 2000;
    cfg->http.max_connections = 1024;
    cfg->http.handshake_timeout_ms = 5000;
    cfg->http.max_connections_per_address = 256;
    cfg->expiry.interval_ms = 1000;
    cfg->expiry.batch = 1024;
    cfg->log.level = LOG_LEVEL_INFO;
    cfg->log.format = LOG_FORMAT_TEXT;
}

/* Reports a libyaml parser failure with its problem text and position. */
static int yamlFail(struct ctx *c, const yaml_parser_t *p)
{
    const char *problem = p->problem != NULL ? p->problem : "invalid YAML";
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return failFile(c->err, c->errlen, c->name, "out of memory while parsing");
    case YAML_READER_ERROR: {
        /* The reader gives a byte offset, not a mark. */
        size_t line = 0;
        size_t col = 0;
        for (size_t i = 0; i < p->problem_offset && i < c->len; i++) {
            if (c->text[i] == '\n') {
                line++;
                col = 0;
            } else {
                col++;
            }
        }
        return failAt(c, line, col, "%s", problem);
    }
    default:
        if (p->context != NULL) {
            return failAt(c, p->problem_mark.line, p->problem_mark.column,
                          "%s (%s at line %zu, column %zu)", problem, p->context,
                          (size_t)p->context_mark.line + 1, (size_t)p->context_mark.column + 1);
        }
        return failAt(c, p->problem_mark.line, p->problem_mark.column, "%s", problem);
    }
}

/* Nesting deeper than this is refused before the document is built: the configuration needs
 * a few levels, and libyaml's scanner takes time quadratic in the depth of nested flow
 * collections (a 100 KB file of "[[[..." took seconds), on the loop that a reload runs on. */
#define CONFIG_DEPTH_MAX 32

/* A pass over the parser's events before the document is built: refuses nesting deeper than
 * CONFIG_DEPTH_MAX and explicit tags ("!!str 300" would pass a string as the integer the
 * field takes, "!!float" is read as nothing of the sort: a value's type is its field's).
 * 0, or -1 with the position in c->err. A parse error stops it quietly: the load then
 * reports it. */
static int prescan(struct ctx *c)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        return failFile(c->err, c->errlen, c->name, "out of memory while parsing");
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)c->text, c->len);
    int rc = 0;
    unsigned depth = 0;
    for (bool end = false; rc == 0 && !end;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            break;
        }
        const yaml_char_t *tag = ev.type == YAML_SCALAR_EVENT           ? ev.data.scalar.tag
                                 : ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.tag
                                 : ev.type == YAML_MAPPING_START_EVENT  ? ev.data.mapping_start.tag
                                                                        : NULL;
        if (tag != NULL) {
            rc = failAt(c, ev.start_mark.line, ev.start_mark.column,
                        "a YAML tag (such as !!str): a value is read as its field's type, "
                        "written without a tag");
        } else if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            if (++depth > CONFIG_DEPTH_MAX) {
                rc = failAt(c, ev.start_mark.line, ev.start_mark.column,
                            "nested more than %d levels deep", CONFIG_DEPTH_MAX);
            }
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        end = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

/* Parses one YAML document from text into cfg (already zeroed and holding the defaults). */
static int parseText(struct ctx *c, struct config *cfg)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = -1;
    if (prescan(c) != 0) {
        return -1;
    }
    if (!yaml_parser_initialize(&parser)) {
        return failFile(c->err, c->errlen, c->name, "out of memory while parsing");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)c->text, c->len);
    /* On failure yaml_parser_load() has already deleted the document. */
    if (!yaml_parser_load(&parser, &doc)) {
        rc = yamlFail(c, &parser);
        yaml_parser_delete(&parser);
        return rc;
    }
    c->doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root == NULL) {
        rc = failAt(c, 0, 0,
                    "the file holds no configuration (expected a mapping at the top "
                    "level)");
        goto out;
    }
    yaml_document_t next;
    if (!yaml_parser_load(&parser, &next)) {
        rc = yamlFail(c, &parser);
        goto out;
    }
    yaml_node_t *extra = yaml_document_get_root_node(&next);
    if (extra != NULL) {
        rc = config_fail_node(c, extra, "a second YAML document; the file must hold only one");
        yaml_document_delete(&next);
        goto out;
    }
    yaml_document_delete(&next);
    c->n_nodes = (size_t)(doc.nodes.top - doc.nodes.start);
    c->seen = calloc(c->n_nodes, 1);
    if (c->seen == NULL) {
        rc = failFile(c->err, c->errlen, c->name, "out of memory");
        goto out;
    }
    yaml_node_t *r;
    rc = config_visit(c, 1, &r);
    assert(rc == 0 && r == root);
    rc = config_sections_parse_root(c, root, cfg);
out:
    free(c->seen);
    c->seen = NULL;
    c->doc = NULL;
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int config_parse(const char *name, const char *text, size_t len, struct config *out, char *err,
                 size_t errlen)
{
    struct ctx c = {
        .name = name,
        .text = text,
        .len = len,
        .err = err,
        .errlen = errlen,
    };
    if (errlen > 0) {
        err[0] = '\0';
    }
    memset(out, 0, sizeof *out);
    setDefaults(out);
    if (parseText(&c, out) != 0) {
        config_free(out);
        return -1;
    }
    return 0;
}

int config_load(const char *path, struct config *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return failFile(err, errlen, path, "cannot read: %s", strerror(errno));
    }
    size_t cap = 4096;
    size_t len = 0;
    char *buf = malloc(cap);
    int rc = -1;
    if (buf == NULL) {
        failFile(err, errlen, path, "cannot read: %s", strerror(ENOMEM));
        goto out;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= CONFIG_FILE_MAX) {
                /* Full: the file is at most CONFIG_FILE_MAX bytes when nothing follows. */
                char more;
                if (fread(&more, 1, 1, fp) == 0 && !ferror(fp)) {
                    break;
                }
                failFile(err, errlen, path, "cannot read: the file is larger than %u bytes",
                         CONFIG_FILE_MAX);
                goto out;
            }
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                failFile(err, errlen, path, "cannot read: %s", strerror(ENOMEM));
                goto out;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, fp);
        len += n;
        if (n == 0) {
            if (ferror(fp)) {
                failFile(err, errlen, path, "cannot read: %s", strerror(errno));
                goto out;
            }
            break;
        }
    }
    rc = config_parse(path, buf, len, out, err, errlen);
out:
    free(buf);
    fclose(fp);
    return rc;
}

void config_free(struct config *c)
{
    if (c == NULL) {
        return;
    }
    free(c->node.data_dir);
    free(c->cluster.bootstrap);
    free(c->tls.cert_file);
    free(c->tls.key_file);
    free(c->tls.ca_file);
    free(c->tls.at);
    const struct config_secret *secrets[] = {&c->rpc.cluster_secret, &c->raft.secret,
                                             &c->raft.previous_secret};
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++) {
        if (secrets[i]->value != NULL) {
            OPENSSL_cleanse(secrets[i]->value, secrets[i]->len);
            free(secrets[i]->value);
        }
    }
    for (size_t i = 0; i < c->n_tenants; i++) {
        free(c->tenants[i].token_hashes);
    }
    free(c->tenants);
    free(c->token_slots);
    free(c->name_slots);
    for (size_t i = 0; i < c->n_proxies; i++) {
        struct config_proxy *p = &c->proxies[i];
        for (size_t j = 0; j < p->n_routes; j++) {
            struct config_proxy_route *r = &p->routes[j];
            free(r->path_prefix);
            free(r->upstream);
            free(r->upstream_hostport);
            for (size_t k = 0; k < r->n_fingerprint_headers; k++) {
                free(r->fingerprint_headers[k]);
            }
            free(r->fingerprint_headers);
            for (size_t k = 0; k < r->n_fingerprint_fields; k++) {
                free(r->fingerprint_fields[k]);
            }
            free(r->fingerprint_fields);
            for (size_t k = 0; k < r->n_fingerprint_ignore; k++) {
                free(r->fingerprint_ignore[k]);
            }
            free(r->fingerprint_ignore);
            for (size_t k = 0; k < r->n_response_headers; k++) {
                free(r->response_headers[k]);
            }
            free(r->response_headers);
            for (size_t k = 0; k < r->n_caller_headers; k++) {
                free(r->caller_headers[k]);
            }
            free(r->caller_headers);
        }
        free(p->routes);
    }
    free(c->proxies);
    memset(c, 0, sizeof *c);
}

const struct config_tenant *config_tenant_by_name(const struct config *c, const char *name)
{
    if (c->name_slots == NULL) {
        return NULL; /* no tenants read (yet) */
    }
    uint64_t h = XXH3_64bits(name, strlen(name));
    for (size_t i = h & c->name_mask;; i = (i + 1) & c->name_mask) {
        const struct tenant_slot *slot = &c->name_slots[i];
        if (slot->tenant == 0) {
            return NULL;
        }
        const struct config_tenant *t = &c->tenants[slot->tenant - 1];
        if (slot->hash == h && strcmp(t->name, name) == 0) {
            return t;
        }
    }
}

const struct config_tenant *config_tenant_by_token_hash(const struct config *c,
                                                        const uint8_t hash[CONFIG_HASH_LEN])
{
    if (c->token_slots == NULL) {
        return NULL; /* no tenants read (yet) */
    }
    uint64_t h = XXH3_64bits(hash, CONFIG_HASH_LEN);
    for (size_t i = h & c->token_mask;; i = (i + 1) & c->token_mask) {
        const struct tenant_slot *slot = &c->token_slots[i];
        if (slot->tenant == 0) {
            return NULL;
        }
        const struct config_tenant *t = &c->tenants[slot->tenant - 1];
        if (slot->hash == h &&
            CRYPTO_memcmp(t->token_hashes[slot->item], hash, CONFIG_HASH_LEN) == 0) {
            return t;
        }
    }
}

bool config_is_cluster_secret_hash(const struct config *c, const uint8_t hash[CONFIG_HASH_LEN])
{
    return c->rpc.cluster_secret.set &&
           CRYPTO_memcmp(c->rpc.cluster_secret.sha256, hash, CONFIG_HASH_LEN) == 0;
}

bool config_is_admin_hash(const struct config *c, const uint8_t hash[CONFIG_HASH_LEN])
{
    return CRYPTO_memcmp(c->admin_token_sha256, hash, CONFIG_HASH_LEN) == 0;
}

bool config_fd_budget(const struct config *c, uint64_t limit, uint32_t *rpc, uint32_t *http)
{
    uint64_t r = c->rpc.max_connections;
    uint64_t h = c->http.max_connections;
    uint64_t per_http = c->n_proxies > 0 ? 2 : 1; /* a proxied request's upstream socket */
    *rpc = (uint32_t)r;
    *http = (uint32_t)h;
    if (r + h * per_http + CONFIG_FD_RESERVE <= limit) {
        return false;
    }
    uint64_t room = limit > CONFIG_FD_RESERVE ? limit - CONFIG_FD_RESERVE : 0;
    uint64_t want = r + h * per_http;
    uint64_t nr = room * r / want;
    uint64_t nh = room * h / want;
    *rpc = (uint32_t)(nr > 0 ? nr : 1);
    *http = (uint32_t)(nh > 0 ? nh : 1);
    return true;
}
