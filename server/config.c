/* The node configuration loader (DESIGN.md, Configuration).
 *
 * libyaml's document API builds the node tree (with a start mark on every node); this file
 * only walks it. Each mapping is read by mapFields(), which knows the keys the mapping may
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
#include "config.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* The largest file config_load() reads; a configuration is a few kilobytes. */
#define CONFIG_FILE_MAX (16u << 20)

/* Room for a field's dotted name in messages, e.g. "tenants[3].token_sha256[1]". */
#define FIELD_NAME_MAX 96

/* The most keys one mapping of the format may hold (a proxy route has 16). */
#define FIELDS_MAX 16

/* How many bytes of a value a message quotes; longer values end in "...". */
#define QUOTE_MAX 40
#define QUOTE_SIZE (QUOTE_MAX * 4 + 8)

/* Bounds of the cluster secret (rpc.cluster_secret_file), in bytes after trimming. */
#define SECRET_MIN 16
#define SECRET_MAX 4096
/* Raft secrets: a peer that listens at a member's address gets MACs made with them, so they
 * must not be guessable (cluster.h, CLUSTER_SECRET_MIN). */

/* The IDs a JSON integer can carry exactly, and idemctl can name (docs/idemctl.md). */
#define NODE_ID_MAX ((uint64_t)INT64_MAX)
#define DAY_MS CONFIG_LEASE_MAX_MS

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
    const yaml_node_t *secret_node; /* rpc.cluster_secret_file's value, for the checks that
                                     * follow the tenants */
    const yaml_node_t *raft_secret_node; /* raft.secret_file's, likewise */
    const yaml_node_t *raft_previous_node; /* raft.previous_secret_file's */
};

/* One key of a mapping, as mapFields() found it. */
struct field {
    const char *key;           /* the key this slot is for */
    char name[FIELD_NAME_MAX]; /* dotted name for messages, e.g. "raft.pre_vote" */
    const char *where;         /* the mapping's name for messages, e.g. "raft" */
    yaml_node_t *map;          /* the mapping, to place "missing key" */
    yaml_node_t *knode;        /* the key node; NULL when the key is absent */
    yaml_node_t *val;          /* the value node; NULL when the key is absent */
};

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
__attribute__((format(printf, 3, 4))) static int failNode(struct ctx *c, const yaml_node_t *n,
                                                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfailAt(c, n->start_mark.line, n->start_mark.column, fmt, ap);
    va_end(ap);
    return -1;
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
static const char *quote(char out[QUOTE_SIZE], const char *s, size_t len)
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
static const char *scalarText(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static const char *kindName(const yaml_node_t *n)
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
static int visit(struct ctx *c, int index, yaml_node_t **out)
{
    yaml_node_t *n = yaml_document_get_node(c->doc, index);
    assert(n != NULL);
    size_t i = (size_t)(index - 1);
    assert(i < c->n_nodes);
    if (c->seen[i]) {
        return failNode(c, n,
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
    const char *s = scalarText(n);
    return n->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Whether the field has a non-null value. */
static bool present(const struct field *f)
{
    return f->val != NULL && !isNull(f->val);
}

/* Reads the mapping `map` whose allowed keys are keys[0..nkeys) into fields[0..nkeys).
 * `where` names the mapping in messages ("the top level", "raft", "tenants[0]"); `prefix`
 * starts each field's dotted name ("" at the top level). Both must outlive fields. Unknown
 * keys, duplicate keys and keys that are not scalars are errors. */
static int mapFields(struct ctx *c, yaml_node_t *map, const char *where, const char *prefix,
                     const char *const *keys, size_t nkeys, struct field *fields)
{
    assert(nkeys <= FIELDS_MAX);
    if (map->type != YAML_MAPPING_NODE) {
        return failNode(c, map, "%s%sexpected a mapping, got %s", prefix, *prefix ? ": " : "",
                        kindName(map));
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
        if (visit(c, p->key, &k) != 0) {
            return -1;
        }
        if (k->type != YAML_SCALAR_NODE) {
            return failNode(c, k, "a key in %s is %s; keys must be names", where, kindName(k));
        }
        size_t i = 0;
        while (i < nkeys && !(strlen(keys[i]) == k->data.scalar.length &&
                              memcmp(keys[i], scalarText(k), k->data.scalar.length) == 0)) {
            i++;
        }
        char q[QUOTE_SIZE];
        if (i == nkeys) {
            return failNode(c, k, "unknown key %s in %s",
                            quote(q, scalarText(k), k->data.scalar.length), where);
        }
        if (fields[i].knode != NULL) {
            return failNode(c, k, "duplicate key \"%s\" in %s (first at line %zu)", keys[i], where,
                            (size_t)fields[i].knode->start_mark.line + 1);
        }
        if (visit(c, p->value, &v) != 0) {
            return -1;
        }
        fields[i].knode = k;
        fields[i].val = v;
    }
    return 0;
}

/* Fails unless the field has a value. */
static int required(struct ctx *c, const struct field *f)
{
    if (f->knode == NULL) {
        return failNode(c, f->map, "missing required key \"%s\" in %s", f->key, f->where);
    }
    if (isNull(f->val)) {
        return failNode(c, f->val, "%s: a value is required", f->name);
    }
    return 0;
}

/* ---- typed values ------------------------------------------------------------------------ */

/* Reads a decimal integer in [min, max] into *out; leaves *out alone when the field is
 * absent or null. Only plain scalars of digits count: no sign, no leading zeros (YAML 1.1
 * would read 010 as octal), no hex, no underscores. */
static int getU64(struct ctx *c, const struct field *f, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SCALAR_NODE) {
        return failNode(c, v, "%s: expected an integer, got %s", f->name, kindName(v));
    }
    const char *s = scalarText(v);
    size_t len = v->data.scalar.length;
    char q[QUOTE_SIZE];
    quote(q, s, len);
    if (v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return failNode(c, v, "%s: expected an integer, got the quoted string %s", f->name, q);
    }
    size_t digits = strspn(s, "0123456789");
    if (s[0] == '-' && len > 1 && strspn(s + 1, "0123456789") == len - 1) {
        return failNode(c, v, "%s: must not be negative, got %s", f->name, q);
    }
    if (digits == 0 || digits != len) {
        return failNode(c, v, "%s: expected an integer, got %s", f->name, q);
    }
    if (s[0] == '0' && len > 1) {
        return failNode(c, v, "%s: expected a decimal integer without leading zeros, got %s",
                        f->name, q);
    }
    errno = 0;
    char *end = NULL;
    unsigned long long x = strtoull(s, &end, 10);
    if (end != s + len) {
        return failNode(c, v, "%s: expected an integer, got %s", f->name, q);
    }
    if (errno == ERANGE || x < min || x > max) {
        return failNode(c, v, "%s: %s is out of range (%llu..%llu)", f->name, q,
                        (unsigned long long)min, (unsigned long long)max);
    }
    *out = (uint64_t)x;
    return 0;
}

static int getU32(struct ctx *c, const struct field *f, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t x = *out;
    if (getU64(c, f, min, max, &x) != 0) {
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

/* Reads true/false/yes/no (also capitalised or upper-case) into *out; leaves *out alone
 * when the field is absent or null. */
static int getBool(struct ctx *c, const struct field *f, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO"};
    if (!present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SCALAR_NODE) {
        return failNode(c, v, "%s: expected true or false, got %s", f->name, kindName(v));
    }
    char q[QUOTE_SIZE];
    quote(q, scalarText(v), v->data.scalar.length);
    if (v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return failNode(c, v, "%s: expected true or false, got the quoted string %s", f->name, q);
    }
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcmp(scalarText(v), yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(scalarText(v), no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return failNode(c, v, "%s: expected true or false, got %s", f->name, q);
}

/* Checks that the value of a present field is a scalar without NUL bytes and returns its
 * text in *s. */
static int stringValue(struct ctx *c, const struct field *f, const char **s)
{
    const yaml_node_t *v = f->val;
    *s = ""; /* on every path: gcc -O3 cannot tell that failNode() never returns 0 */
    if (v->type != YAML_SCALAR_NODE) {
        return failNode(c, v, "%s: expected a string, got %s", f->name, kindName(v));
    }
    if (strlen(scalarText(v)) != v->data.scalar.length) {
        return failNode(c, v, "%s: must not contain a NUL character", f->name);
    }
    *s = scalarText(v);
    return 0;
}

/* Copies a string field into *out (owned, malloc'd); leaves *out alone (NULL) when the field
 * is absent, null or "". */
static int getPath(struct ctx *c, const struct field *f, char **out)
{
    const char *s;
    if (!present(f)) {
        return 0;
    }
    if (stringValue(c, f, &s) != 0) {
        return -1;
    }
    if (*s == '\0') {
        return 0;
    }
    char *copy = strdup(s);
    if (copy == NULL) {
        return failNode(c, f->val, "%s: out of memory", f->name);
    }
    *out = copy;
    return 0;
}

int config_addr_parse(const char *s, struct config_addr *out, char *why, size_t why_len)
{
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    quote(q, s, len);
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || colon[1] == '\0') {
        snprintf(why, why_len, "expected host:port, got %s", q);
        return -1;
    }
    size_t hostlen = (size_t)(colon - s);
    if (memchr(s, ':', hostlen) != NULL || s[0] == '[') {
        snprintf(why, why_len, "IPv6 addresses are not supported, got %s", q);
        return -1;
    }
    const char *port = colon + 1;
    size_t portlen = strlen(port);
    if (strspn(port, "0123456789") != portlen || portlen > 5 || port[0] == '0') {
        snprintf(why, why_len, "the port must be 1..65535%s, got %s",
                 portlen > 1 && port[0] == '0' && strspn(port, "0123456789") == portlen
                     ? " without leading zeros"
                     : "",
                 q);
        return -1;
    }
    unsigned long p = strtoul(port, NULL, 10);
    if (p < 1 || p > 65535) {
        snprintf(why, why_len, "the port must be 1..65535, got %s", q);
        return -1;
    }
    if (hostlen > CONFIG_HOST_MAX) {
        snprintf(why, why_len, "the host is longer than %d bytes", CONFIG_HOST_MAX);
        return -1;
    }
    char host[CONFIG_HOST_MAX + 1];
    memcpy(host, s, hostlen);
    host[hostlen] = '\0';
    /* Not a name: the listeners bind with uv_ip4_addr() and libraft 0.15 dials its peers
     * with it too, so a name passed here only to fail at start (or never be reached). */
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) != 1) {
        snprintf(why, why_len,
                 strspn(host, "0123456789.") == hostlen
                     ? "the host is not a valid IPv4 address, got %s"
                     : "the host must be an IPv4 address (names are not resolved), got %s",
                 q);
        return -1;
    }
    memcpy(out->text, s, len + 1);
    memcpy(out->host, host, hostlen + 1);
    out->port = (uint16_t)p;
    return 0;
}

/* Reads "host:port" into *out; leaves it empty when the field is absent, null or "". */
static int getAddr(struct ctx *c, const struct field *f, struct config_addr *out)
{
    const char *s;
    if (!present(f)) {
        return 0;
    }
    if (stringValue(c, f, &s) != 0) {
        return -1;
    }
    if (s[0] == '\0') {
        return 0;
    }
    char why[QUOTE_SIZE + 96];
    if (config_addr_parse(s, out, why, sizeof why) != 0) {
        return failNode(c, f->val, "%s: %s", f->name, why);
    }
    return 0;
}

/* Reads 64 hex digits at node v into out. The value is a secret's digest: messages name the
 * field (`name`) and never quote the value. */
static int hashValue(struct ctx *c, const yaml_node_t *v, const char *name,
                     uint8_t out[CONFIG_HASH_LEN])
{
    if (v->type != YAML_SCALAR_NODE) {
        return failNode(c, v, "%s: expected 64 hex digits (a SHA-256 digest), got %s", name,
                        kindName(v));
    }
    const char *s = scalarText(v);
    size_t len = v->data.scalar.length;
    if (len != 2 * CONFIG_HASH_LEN) {
        return failNode(c, v,
                        "%s: expected 64 hex digits (a SHA-256 digest), got %zu "
                        "characters",
                        name, len);
    }
    for (size_t i = 0; i < CONFIG_HASH_LEN; i++) {
        int hi = OPENSSL_hexchar2int((unsigned char)s[2 * i]);
        int lo = OPENSSL_hexchar2int((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return failNode(c, v,
                            "%s: expected 64 hex digits (a SHA-256 digest); the value "
                            "holds a character that is not a hex digit",
                            name);
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* ---- sections ---------------------------------------------------------------------------- */

static int parseNode(struct ctx *c, yaml_node_t *map, struct config_node *n)
{
    enum { ID, RAFT, RPC, HTTP, DATA_DIR, N };
    static const char *const keys[N] = {"id", "raft_address", "rpc_address", "http_address",
                                        "data_dir"};
    struct field f[N];
    if (mapFields(c, map, "node", "node", keys, N, f) != 0) {
        return -1;
    }
    if (required(c, &f[ID]) != 0 || getU64(c, &f[ID], 1, NODE_ID_MAX, &n->id) != 0 ||
        required(c, &f[RAFT]) != 0 || getAddr(c, &f[RAFT], &n->raft_address) != 0 ||
        required(c, &f[RPC]) != 0 || getAddr(c, &f[RPC], &n->rpc_address) != 0 ||
        getAddr(c, &f[HTTP], &n->http_address) != 0 || required(c, &f[DATA_DIR]) != 0 ||
        getPath(c, &f[DATA_DIR], &n->data_dir) != 0) {
        return -1;
    }
    if (n->raft_address.port == 0) {
        return failNode(c, f[RAFT].val, "%s: must not be empty", f[RAFT].name);
    }
    if (n->rpc_address.port == 0) {
        return failNode(c, f[RPC].val, "%s: must not be empty", f[RPC].name);
    }
    if (n->data_dir == NULL) {
        return failNode(c, f[DATA_DIR].val, "%s: must not be empty", f[DATA_DIR].name);
    }
    return 0;
}

/* Reads one bootstrap member; `index` is its position in the list, for messages. members
 * [0..index) are already read, to check that ids and Raft addresses are unique. */
static int parseMember(struct ctx *c, yaml_node_t *map, size_t index, struct config_member *members)
{
    enum { ID, RAFT, RPC, HTTP, N };
    static const char *const keys[N] = {"id", "raft_address", "rpc_address", "http_address"};
    char where[FIELD_NAME_MAX];
    snprintf(where, sizeof where, "cluster.bootstrap[%zu]", index);
    struct field f[N];
    struct config_member *m = &members[index];
    if (mapFields(c, map, where, where, keys, N, f) != 0) {
        return -1;
    }
    if (required(c, &f[ID]) != 0 || getU64(c, &f[ID], 1, NODE_ID_MAX, &m->id) != 0 ||
        required(c, &f[RAFT]) != 0 || getAddr(c, &f[RAFT], &m->raft_address) != 0 ||
        required(c, &f[RPC]) != 0 || getAddr(c, &f[RPC], &m->rpc_address) != 0 ||
        getAddr(c, &f[HTTP], &m->http_address) != 0) {
        return -1;
    }
    if (m->raft_address.port == 0) {
        return failNode(c, f[RAFT].val, "%s: must not be empty", f[RAFT].name);
    }
    if (m->rpc_address.port == 0) {
        return failNode(c, f[RPC].val, "%s: must not be empty", f[RPC].name);
    }
    for (size_t j = 0; j < index; j++) {
        if (members[j].id == m->id) {
            return failNode(c, f[ID].val,
                            "%s: duplicate member id %llu (also "
                            "cluster.bootstrap[%zu])",
                            f[ID].name, (unsigned long long)m->id, j);
        }
        if (strcmp(members[j].raft_address.text, m->raft_address.text) == 0) {
            return failNode(c, f[RAFT].val,
                            "%s: duplicate Raft address (also "
                            "cluster.bootstrap[%zu])",
                            f[RAFT].name, j);
        }
    }
    return 0;
}

static int parseCluster(struct ctx *c, yaml_node_t *map, uint64_t self, struct config_cluster *cl)
{
    enum { BOOTSTRAP, N };
    static const char *const keys[N] = {"bootstrap"};
    struct field f[N];
    if (mapFields(c, map, "cluster", "cluster", keys, N, f) != 0) {
        return -1;
    }
    if (!present(&f[BOOTSTRAP])) {
        return 0;
    }
    yaml_node_t *list = f[BOOTSTRAP].val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return failNode(c, list, "%s: expected a list, got %s", f[BOOTSTRAP].name, kindName(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return 0;
    }
    cl->bootstrap = calloc(n, sizeof *cl->bootstrap);
    if (cl->bootstrap == NULL) {
        return failNode(c, list, "%s: out of memory", f[BOOTSTRAP].name);
    }
    bool has_self = false;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (visit(c, list->data.sequence.items.start[i], &item) != 0 ||
            parseMember(c, item, i, cl->bootstrap) != 0) {
            return -1;
        }
        cl->n_bootstrap = i + 1;
        has_self = has_self || cl->bootstrap[i].id == self;
    }
    /* Every member of the initial configuration bootstraps with the same list; a node that
     * is not in it must start with an empty list and be added later. */
    if (!has_self) {
        return failNode(c, list,
                        "%s: node.id %llu is not in the list (a node that joins "
                        "later has no bootstrap list)",
                        f[BOOTSTRAP].name, (unsigned long long)self);
    }
    return 0;
}

static int readSecret(struct ctx *c, const struct field *f, const char *path, size_t min,
                      struct config_secret *out);

static int parseRaft(struct ctx *c, yaml_node_t *map, struct config_raft *r)
{
    enum {
        ELECTION,
        HEARTBEAT,
        THRESHOLD,
        TRAILING,
        LOG_PERCENT,
        LOG_MAX,
        SEGMENT,
        PRE_VOTE,
        SNAP_NICE,
        SECRET,
        PREVIOUS,
        PREFILL,
        STEP_DOWN,
        TRAILING_MAX,
        N
    };
    static const char *const keys[N] = {"election_timeout_ms",
                                        "heartbeat_timeout_ms",
                                        "snapshot_threshold",
                                        "snapshot_trailing",
                                        "snapshot_log_percent",
                                        "snapshot_log_max_mb",
                                        "segment_size_mb",
                                        "pre_vote",
                                        "snapshot_nice",
                                        "secret_file",
                                        "previous_secret_file",
                                        "prefill_segments",
                                        "stuck_write_step_down_ms",
                                        "snapshot_trailing_max_mb"};
    struct field f[N];
    char *secret_path = NULL, *previous_path = NULL;
    if (mapFields(c, map, "raft", "raft", keys, N, f) != 0 ||
        getU32(c, &f[ELECTION], 100, 60000, &r->election_timeout_ms) != 0 ||
        getU32(c, &f[HEARTBEAT], 10, 10000, &r->heartbeat_timeout_ms) != 0 ||
        getU32(c, &f[THRESHOLD], 16, UINT32_MAX, &r->snapshot_threshold) != 0 ||
        getU32(c, &f[TRAILING], 1, UINT32_MAX, &r->snapshot_trailing) != 0 ||
        getU32(c, &f[LOG_PERCENT], 0, 10000, &r->snapshot_log_percent) != 0 ||
        getU32(c, &f[LOG_MAX], 1, 65536, &r->snapshot_log_max_mb) != 0 ||
        getU32(c, &f[TRAILING_MAX], 1, 65536, &r->snapshot_trailing_max_mb) != 0 ||
        getU32(c, &f[SEGMENT], 1, 1024, &r->segment_size_mb) != 0 ||
        getU32(c, &f[SNAP_NICE], 0, 19, &r->snapshot_nice) != 0 ||
        getBool(c, &f[PRE_VOTE], &r->pre_vote) != 0 ||
        getBool(c, &f[PREFILL], &r->prefill_segments) != 0 ||
        getU32(c, &f[STEP_DOWN], 0, 600000, &r->stuck_write_step_down_ms) != 0 ||
        getPath(c, &f[SECRET], &secret_path) != 0 ||
        getPath(c, &f[PREVIOUS], &previous_path) != 0) {
        free(secret_path);
        return -1;
    }
    if (r->stuck_write_step_down_ms != 0 && r->stuck_write_step_down_ms < 1000) {
        /* Under a second is within an ordinary slow fsync: leadership would flap. */
        free(secret_path);
        free(previous_path);
        return failNode(c, f[STEP_DOWN].val,
                        "raft.stuck_write_step_down_ms: %u is out of range (0, never, or "
                        "1000..600000)",
                        (unsigned)r->stuck_write_step_down_ms);
    }
    if (secret_path != NULL) {
        int rc = readSecret(c, &f[SECRET], secret_path, CONFIG_RAFT_SECRET_MIN, &r->secret);
        free(secret_path);
        if (rc != 0) {
            free(previous_path);
            return -1;
        }
        c->raft_secret_node = f[SECRET].val;
    }
    if (previous_path != NULL) {
        int rc = readSecret(c, &f[PREVIOUS], previous_path, CONFIG_RAFT_SECRET_MIN, &r->previous_secret);
        free(previous_path);
        if (rc != 0) {
            return -1;
        }
        c->raft_previous_node = f[PREVIOUS].val;
        if (!r->secret.set) {
            return failNode(c, f[PREVIOUS].val,
                            "raft.previous_secret_file needs raft.secret_file (the secret the "
                            "members move to)");
        }
        if (CRYPTO_memcmp(r->secret.sha256, r->previous_secret.sha256, CONFIG_HASH_LEN) == 0) {
            return failNode(c, f[PREVIOUS].val,
                            "raft.previous_secret_file: the secret is raft.secret_file's; drop "
                            "previous_secret_file, or name the old secret");
        }
    }
    if (r->heartbeat_timeout_ms >= r->election_timeout_ms) {
        const yaml_node_t *at = present(&f[HEARTBEAT])  ? f[HEARTBEAT].val
                                : present(&f[ELECTION]) ? f[ELECTION].val
                                                        : map;
        return failNode(c, at,
                        "raft.heartbeat_timeout_ms must be less than "
                        "election_timeout_ms (%u >= %u)",
                        (unsigned)r->heartbeat_timeout_ms, (unsigned)r->election_timeout_ms);
    }
    return 0;
}

/* Reads a secret of at least `min` bytes from the file named by field f (present, a path)
 * into *out. Messages quote the path, never the file's bytes. */
static int readSecret(struct ctx *c, const struct field *f, const char *path, size_t min,
                      struct config_secret *out)
{
    char q[QUOTE_SIZE];
    quote(q, path, strlen(path));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return failNode(c, f->val, "%s: cannot read %s: %s", f->name, q, strerror(errno));
    }
    uint8_t buf[SECRET_MAX + 2];
    size_t len = fread(buf, 1, sizeof buf, fp);
    int rerr = ferror(fp) ? errno : 0;
    fclose(fp);
    int rc = 0;
    while (len > 0 && len <= SECRET_MAX &&
           (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
            buf[len - 1] == '\t')) {
        len--;
    }
    unsigned int hl = 0;
    if (rerr != 0) {
        rc = failNode(c, f->val, "%s: cannot read %s: %s", f->name, q, strerror(rerr));
    } else if (len > SECRET_MAX) {
        rc = failNode(c, f->val, "%s: %s holds more than %u bytes", f->name, q, SECRET_MAX);
    } else if (len < min) {
        rc = failNode(c, f->val,
                      "%s: %s holds %zu bytes (without trailing whitespace); this secret needs "
                      "at least %zu",
                      f->name, q, len, min);
    } else if ((out->value = malloc(len)) == NULL) {
        rc = failNode(c, f->val, "%s: out of memory", f->name);
    } else if (EVP_Digest(buf, len, out->sha256, &hl, EVP_sha256(), NULL) != 1) {
        rc = failNode(c, f->val, "%s: cannot hash the secret", f->name);
    } else {
        memcpy(out->value, buf, len);
        out->len = len;
        out->set = true;
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

static int parseRpc(struct ctx *c, yaml_node_t *map, struct config_rpc *r)
{
    enum {
        FRAME,
        DEFAULT_DEADLINE,
        MAX_DEADLINE,
        CONNECTIONS,
        SECRET,
        IDLE,
        HANDSHAKE,
        BUFFERS,
        ANSWERS,
        N
    };
    static const char *const keys[N] = {
        "max_frame_bytes",      "default_deadline_ms", "max_deadline_ms",
        "max_connections",      "cluster_secret_file", "idle_timeout_ms",
        "handshake_timeout_ms", "max_frame_buffer_mb", "max_answer_buffer_mb"};
    struct field f[N];
    char *secret_path = NULL;
    if (mapFields(c, map, "rpc", "rpc", keys, N, f) != 0 ||
        getU32(c, &f[FRAME], 1024, 64u << 20, &r->max_frame_bytes) != 0 ||
        getU32(c, &f[DEFAULT_DEADLINE], 1, 600000, &r->default_deadline_ms) != 0 ||
        getU32(c, &f[MAX_DEADLINE], 1, 600000, &r->max_deadline_ms) != 0 ||
        getU32(c, &f[CONNECTIONS], 1, 1u << 20, &r->max_connections) != 0 ||
        getU32(c, &f[IDLE], 100, 86400000, &r->idle_timeout_ms) != 0 ||
        getU32(c, &f[HANDSHAKE], 100, 600000, &r->handshake_timeout_ms) != 0 ||
        getU32(c, &f[BUFFERS], 1, 65536, &r->max_frame_buffer_mb) != 0 ||
        getU32(c, &f[ANSWERS], 1, 65536, &r->max_answer_buffer_mb) != 0 ||
        getPath(c, &f[SECRET], &secret_path) != 0) {
        return -1;
    }
    if (secret_path != NULL) {
        int rc = readSecret(c, &f[SECRET], secret_path, SECRET_MIN, &r->cluster_secret);
        free(secret_path);
        c->secret_node = f[SECRET].val;
        if (rc != 0) {
            return -1;
        }
    }
    if (r->default_deadline_ms > r->max_deadline_ms) {
        const yaml_node_t *at = present(&f[DEFAULT_DEADLINE]) ? f[DEFAULT_DEADLINE].val
                                : present(&f[MAX_DEADLINE])   ? f[MAX_DEADLINE].val
                                                              : map;
        return failNode(c, at,
                        "rpc.default_deadline_ms must not exceed max_deadline_ms "
                        "(%u > %u)",
                        (unsigned)r->default_deadline_ms, (unsigned)r->max_deadline_ms);
    }
    return 0;
}

static int parseBatch(struct ctx *c, yaml_node_t *map, struct config_batch *b)
{
    enum { COMMANDS, BYTES, PENDING, SHARE, INFLIGHT, N };
    static const char *const keys[N] = {"max_commands", "max_bytes", "max_pending_mb",
                                        "tenant_max_pending_percent", "tenant_max_inflight_kb"};
    struct field f[N];
    if (mapFields(c, map, "batch", "batch", keys, N, f) != 0 ||
        getU32(c, &f[COMMANDS], 1, 65535, &b->max_commands) != 0 ||
        getU32(c, &f[BYTES], 1024, 64u << 20, &b->max_bytes) != 0 ||
        getU32(c, &f[PENDING], 1, 65536, &b->max_pending_mb) != 0 ||
        getU32(c, &f[SHARE], 1, 100, &b->tenant_max_pending_percent) != 0 ||
        getU32(c, &f[INFLIGHT], 0, 1048576, &b->tenant_max_inflight_kb) != 0) {
        return -1;
    }
    if (((uint64_t)b->max_pending_mb << 20) < 2 * (uint64_t)b->max_bytes) {
        const yaml_node_t *at = present(&f[PENDING]) ? f[PENDING].val
                                : present(&f[BYTES]) ? f[BYTES].val
                                                     : map;
        return failNode(c, at,
                        "batch.max_pending_mb (%u MiB) must be at least twice max_bytes (%u)",
                        b->max_pending_mb, b->max_bytes);
    }
    return 0;
}

static int parseHttp(struct ctx *c, yaml_node_t *map, struct config_http *h)
{
    enum { CONNECTIONS, N };
    static const char *const keys[N] = {"max_connections"};
    struct field f[N];
    return mapFields(c, map, "http", "http", keys, N, f) != 0 ||
                   getU32(c, &f[CONNECTIONS], 1, 1u << 20, &h->max_connections) != 0
               ? -1
               : 0;
}

static int parseExpiry(struct ctx *c, yaml_node_t *map, struct config_expiry *e)
{
    enum { INTERVAL, BATCH, N };
    static const char *const keys[N] = {"interval_ms", "batch"};
    struct field f[N];
    return mapFields(c, map, "expiry", "expiry", keys, N, f) != 0 ||
                   getU32(c, &f[INTERVAL], 1, 3600000, &e->interval_ms) != 0 ||
                   getU32(c, &f[BATCH], 1, 65536, &e->batch) != 0
               ? -1
               : 0;
}

static int parseTls(struct ctx *c, yaml_node_t *map, struct config_tls *t)
{
    enum { CERT, KEY, CA, RPC, N };
    static const char *const keys[N] = {"cert_file", "key_file", "ca_file", "rpc"};
    struct field f[N];
    if (mapFields(c, map, "tls", "tls", keys, N, f) != 0 ||
        getPath(c, &f[CERT], &t->cert_file) != 0 || getPath(c, &f[KEY], &t->key_file) != 0 ||
        getPath(c, &f[CA], &t->ca_file) != 0 || getBool(c, &f[RPC], &t->rpc) != 0) {
        return -1;
    }
    if ((t->cert_file != NULL) != (t->key_file != NULL)) {
        return failNode(c, map, "tls: cert_file and key_file go together; missing %s",
                        t->cert_file ? "key_file" : "cert_file");
    }
    if (t->ca_file != NULL && t->cert_file == NULL) {
        return failNode(c, map, "tls: ca_file needs cert_file and key_file");
    }
    t->enabled = t->cert_file != NULL;
    if (t->rpc && !t->enabled) {
        return failNode(c, f[RPC].val, "tls.rpc: TLS on the RPC listener needs cert_file and "
                                       "key_file");
    }
    return 0;
}

static int parseAdmin(struct ctx *c, yaml_node_t *map, uint8_t hash[CONFIG_HASH_LEN])
{
    enum { TOKEN, N };
    static const char *const keys[N] = {"token_sha256"};
    struct field f[N];
    if (mapFields(c, map, "admin", "admin", keys, N, f) != 0 || required(c, &f[TOKEN]) != 0) {
        return -1;
    }
    return hashValue(c, f[TOKEN].val, f[TOKEN].name, hash);
}

/* Checks that a token hash just read at node v (field `name`) is not the admin's nor one of
 * the tenants' already read; tenants[0..n) are complete and `self` holds n_self hashes. */
static int uniqueHash(struct ctx *c, const struct config *cfg, const struct config_tenant *self,
                      size_t n_self, const uint8_t h[CONFIG_HASH_LEN], const yaml_node_t *v,
                      const char *name)
{
    if (memcmp(h, cfg->admin_token_sha256, CONFIG_HASH_LEN) == 0) {
        return failNode(c, v,
                        "%s: equals admin.token_sha256; the admin token must differ "
                        "from every tenant's",
                        name);
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        const struct config_tenant *t = &cfg->tenants[i];
        for (size_t j = 0; j < t->n_token_hashes; j++) {
            if (memcmp(h, t->token_hashes[j], CONFIG_HASH_LEN) == 0) {
                return failNode(c, v, "%s: the same hash is already a token of tenant \"%s\"", name,
                                t->name);
            }
        }
    }
    for (size_t j = 0; j < n_self; j++) {
        if (memcmp(h, self->token_hashes[j], CONFIG_HASH_LEN) == 0) {
            return failNode(c, v, "%s: the same hash is listed twice", name);
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
            return failNode(c, v, "%s: at least one hash is required", f->name);
        }
    } else if (v->type != YAML_SCALAR_NODE) {
        return failNode(c, v, "%s: expected a hash or a list of hashes, got %s", f->name,
                        kindName(v));
    }
    t->token_hashes = calloc(n, sizeof *t->token_hashes);
    if (t->token_hashes == NULL) {
        return failNode(c, v, "%s: out of memory", f->name);
    }
    if (v->type == YAML_SCALAR_NODE) {
        if (hashValue(c, v, f->name, t->token_hashes[0]) != 0 ||
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
        if (visit(c, v->data.sequence.items.start[i], &item) != 0 ||
            hashValue(c, item, name, t->token_hashes[i]) != 0 ||
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
    if (stringValue(c, f, &s) != 0) {
        return -1;
    }
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    quote(q, s, len);
    if (len == 0 || len > CONFIG_TENANT_NAME_MAX) {
        return failNode(c, f->val, "%s: must be 1..%d bytes, got %zu", f->name,
                        CONFIG_TENANT_NAME_MAX, len);
    }
    if (strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != len) {
        return failNode(c, f->val, "%s: may hold only letters, digits, '.', '_' and '-', got %s",
                        f->name, q);
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        if (strcmp(cfg->tenants[i].name, s) == 0) {
            return failNode(c, f->val, "%s: duplicate tenant name %s (also tenants[%zu])", f->name,
                            q, i);
        }
    }
    memcpy(t->name, s, len + 1);
    return 0;
}

static int parseLeasePolicy(struct ctx *c, const struct field *f, enum config_lease_policy *p)
{
    const char *s;
    if (!present(f)) {
        return 0;
    }
    if (stringValue(c, f, &s) != 0) {
        return -1;
    }
    if (strcmp(s, "conflict") == 0) {
        *p = CONFIG_LEASE_CONFLICT;
    } else if (strcmp(s, "takeover") == 0) {
        *p = CONFIG_LEASE_TAKEOVER;
    } else {
        char q[QUOTE_SIZE];
        return failNode(c, f->val, "%s: expected conflict or takeover, got %s", f->name,
                        quote(q, s, strlen(s)));
    }
    return 0;
}

/* Reads tenants[index] into t; cfg->tenants[0..cfg->n_tenants) are complete. */
static int parseTenant(struct ctx *c, yaml_node_t *map, size_t index, const struct config *cfg,
                       struct config_tenant *t)
{
    enum { NAME, TOKEN, MAX_RECORDS, MAX_BYTES, KEY_MAX_LEN, LEASE, TTL, TOMBSTONE, POLICY, N };
    static const char *const keys[N] = {"name",      "token_sha256",     "max_records",
                                        "max_bytes", "key_max_len",      "lease_ms",
                                        "ttl_ms",    "tombstone_ttl_ms", "lease_policy"};
    char where[FIELD_NAME_MAX];
    snprintf(where, sizeof where, "tenants[%zu]", index);
    struct field f[N];
    t->key_max_len = 255;
    t->lease_ms = 30000;
    t->ttl_ms = DAY_MS;
    t->lease_policy = CONFIG_LEASE_CONFLICT;
    if (mapFields(c, map, where, where, keys, N, f) != 0 || required(c, &f[NAME]) != 0 ||
        parseTenantName(c, cfg, &f[NAME], t) != 0 || required(c, &f[TOKEN]) != 0 ||
        parseTokens(c, cfg, &f[TOKEN], t) != 0 ||
        getU64(c, &f[MAX_RECORDS], 0, UINT64_MAX, &t->max_records) != 0 ||
        getU64(c, &f[MAX_BYTES], 0, UINT64_MAX, &t->max_bytes) != 0 ||
        getU32(c, &f[KEY_MAX_LEN], 1, 255, &t->key_max_len) != 0 ||
        getU64(c, &f[LEASE], 1, DAY_MS, &t->lease_ms) != 0 ||
        getU64(c, &f[TTL], 1, 365 * DAY_MS, &t->ttl_ms) != 0 ||
        getU64(c, &f[TOMBSTONE], 0, 365 * DAY_MS, &t->tombstone_ttl_ms) != 0 ||
        parseLeasePolicy(c, &f[POLICY], &t->lease_policy) != 0) {
        return -1;
    }
    /* docs/contract.md: a tombstone is kept, by default, as long as the ttl. */
    if (t->tombstone_ttl_ms == 0) {
        t->tombstone_ttl_ms = t->ttl_ms;
    }
    return 0;
}

static int parseTenants(struct ctx *c, const struct field *f, struct config *cfg)
{
    yaml_node_t *list = f->val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return failNode(c, list, "%s: expected a list, got %s", f->name, kindName(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return failNode(c, list, "%s: at least one tenant is required", f->name);
    }
    cfg->tenants = calloc(n, sizeof *cfg->tenants);
    if (cfg->tenants == NULL) {
        return failNode(c, list, "%s: out of memory", f->name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        /* parseTenant() compares with tenants[0..i) only; the tenant is counted whether or
         * not it is complete, so that config_free() frees its hashes after a failure. */
        if (visit(c, list->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        int rc = parseTenant(c, item, i, cfg, &cfg->tenants[i]);
        cfg->n_tenants = i + 1;
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- proxy ------------------------------------------------------------------------------- */

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
    if (!present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SEQUENCE_NODE) {
        return failNode(c, v, "%s: expected a list of methods, got %s", f->name, kindName(v));
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0) {
        return failNode(c, v, "%s: at least one method is required", f->name);
    }
    unsigned bits = 0;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (visit(c, v->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        char q[QUOTE_SIZE];
        if (item->type != YAML_SCALAR_NODE) {
            return failNode(c, item, "%s[%zu]: expected a method, got %s", f->name, i,
                            kindName(item));
        }
        unsigned b = config_method_bit(scalarText(item), item->data.scalar.length);
        if (b == 0) {
            return failNode(c, item,
                            "%s[%zu]: expected GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS, "
                            "got %s",
                            f->name, i, quote(q, scalarText(item), item->data.scalar.length));
        }
        if (bits & b) {
            return failNode(c, item, "%s[%zu]: %s is listed twice", f->name, i,
                            quote(q, scalarText(item), item->data.scalar.length));
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
    if (!present(f)) {
        return 0;
    }
    const yaml_node_t *v = f->val;
    if (v->type != YAML_SEQUENCE_NODE) {
        return failNode(c, v, "%s: expected a list of header names, got %s", f->name,
                        kindName(v));
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
        return failNode(c, v, "%s: out of memory", f->name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (visit(c, v->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        if (item->type != YAML_SCALAR_NODE) {
            return failNode(c, item, "%s[%zu]: expected a header name, got %s", f->name, i,
                            kindName(item));
        }
        const char *s = scalarText(item);
        size_t len = item->data.scalar.length;
        char q[QUOTE_SIZE];
        bool ok = len > 0 && len <= 128 && strlen(s) == len;
        for (size_t k = 0; ok && k < len; k++) {
            unsigned char ch = (unsigned char)s[k];
            ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 strchr("!#$%&'*+-.^_`|~", ch) != NULL;
        }
        if (!ok) {
            return failNode(c, item, "%s[%zu]: not a valid header name: %s", f->name, i,
                            quote(q, s, len));
        }
        char *copy = malloc(len + 1);
        if (copy == NULL) {
            return failNode(c, item, "%s: out of memory", f->name);
        }
        for (size_t k = 0; k <= len; k++) {
            copy[k] = (char)((s[k] >= 'A' && s[k] <= 'Z') ? s[k] - 'A' + 'a' : s[k]);
        }
        for (size_t k = 0; k < *n_out; k++) {
            if (strcmp((*out)[k], copy) == 0) {
                free(copy);
                return failNode(c, item, "%s[%zu]: %s is listed twice", f->name, i,
                                quote(q, s, len));
            }
        }
        (*out)[i] = copy;
        *n_out = i + 1;
    }
    return 0;
}

/* Reads "http://HOST[:PORT][/]" where HOST is an IPv4 literal or localhost. */
static int parseUpstream(struct ctx *c, const struct field *f, struct config_proxy_route *r)
{
    const char *s;
    if (stringValue(c, f, &s) != 0) {
        return -1;
    }
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    quote(q, s, len);
    static const char scheme[] = "http://";
    if (len < sizeof scheme || strncmp(s, scheme, sizeof scheme - 1) != 0) {
        return failNode(c, f->val, "%s: expected http://HOST:PORT (http only), got %s", f->name,
                        q);
    }
    const char *h = s + sizeof scheme - 1;
    size_t hlen = strcspn(h, ":/");
    const char *rest = h + hlen;
    unsigned long port = 80;
    if (*rest == ':') {
        const char *p = rest + 1;
        size_t plen = strspn(p, "0123456789");
        if (plen == 0 || plen > 5 || p[0] == '0') {
            return failNode(c, f->val, "%s: the port must be 1..65535, got %s", f->name, q);
        }
        port = strtoul(p, NULL, 10);
        if (port < 1 || port > 65535) {
            return failNode(c, f->val, "%s: the port must be 1..65535, got %s", f->name, q);
        }
        rest = p + plen;
    }
    if (!(rest[0] == '\0' || (rest[0] == '/' && rest[1] == '\0'))) {
        return failNode(c, f->val, "%s: the upstream must not have a path, got %s", f->name, q);
    }
    char host[CONFIG_HOST_MAX + 1];
    if (hlen == 0 || hlen > CONFIG_HOST_MAX) {
        return failNode(c, f->val, "%s: expected http://HOST:PORT, got %s", f->name, q);
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    struct in_addr a;
    if (strcmp(host, "localhost") == 0) {
        snprintf(r->upstream_host, sizeof r->upstream_host, "127.0.0.1");
    } else if (hlen < sizeof r->upstream_host && inet_pton(AF_INET, host, &a) == 1) {
        memcpy(r->upstream_host, host, hlen + 1);
    } else {
        return failNode(c, f->val, "%s: the host must be an IPv4 address or localhost, got %s",
                        f->name, q);
    }
    r->upstream_port = (uint16_t)port;
    r->upstream = strdup(s);
    char hp[CONFIG_HOST_MAX + 8];
    snprintf(hp, sizeof hp, "%s:%lu", host, port);
    r->upstream_hostport = strdup(hp);
    if (r->upstream == NULL || r->upstream_hostport == NULL) {
        return failNode(c, f->val, "%s: out of memory", f->name);
    }
    return 0;
}

static int parseStatusChoice(struct ctx *c, const struct field *f, uint32_t a, uint32_t b,
                             uint32_t *out)
{
    uint64_t x = *out;
    if (getU64(c, f, 100, 599, &x) != 0) {
        return -1;
    }
    if (x != a && x != b) {
        return failNode(c, f->val, "%s: expected %u or %u, got %llu", f->name, a, b,
                        (unsigned long long)x);
    }
    *out = (uint32_t)x;
    return 0;
}

static int parseRoute(struct ctx *c, yaml_node_t *map, const char *where,
                      const struct config *cfg, struct config_proxy_route *r)
{
    enum {
        METHODS, PREFIX, UPSTREAM, TENANT, LEASE, TTL, POLICY, MISMATCH, IN_PROGRESS, FP_HEADERS,
        STORE_4XX, ON_TIMEOUT, TIMEOUT, RESP_HEADERS, MAX_INLINE, KEY_REQUIRED, N
    };
    static const char *const keys[N] = {
        "methods",         "path_prefix",         "upstream",           "tenant",
        "lease_ms",        "ttl_ms",              "lease_policy",       "mismatch_status",
        "in_progress_status", "fingerprint_headers", "store_4xx",       "on_timeout",
        "upstream_timeout_ms", "response_headers", "max_inline_body",   "key_required"};
    struct field f[N];
    r->methods = CONFIG_M_POST | CONFIG_M_PUT | CONFIG_M_PATCH | CONFIG_M_DELETE;
    r->mismatch_status = 409;
    r->in_progress_status = 409;
    r->on_timeout_unknown = true;
    r->upstream_timeout_ms = 10000;
    r->max_inline_body = 1u << 20;
    r->key_required = true;
    r->response_headers = calloc(1, sizeof *r->response_headers);
    if (r->response_headers == NULL || (r->response_headers[0] = strdup("content-type")) == NULL) {
        return failNode(c, map, "%s: out of memory", where);
    }
    r->n_response_headers = 1;
    if (mapFields(c, map, where, where, keys, N, f) != 0 ||
        parseMethods(c, &f[METHODS], &r->methods) != 0 || getPath(c, &f[PREFIX], &r->path_prefix) != 0) {
        return -1;
    }
    if (r->path_prefix == NULL) {
        r->path_prefix = strdup("/");
        if (r->path_prefix == NULL) {
            return failNode(c, map, "%s: out of memory", where);
        }
    } else if (r->path_prefix[0] != '/') {
        char q[QUOTE_SIZE];
        return failNode(c, f[PREFIX].val, "%s: must start with '/', got %s", f[PREFIX].name,
                        quote(q, r->path_prefix, strlen(r->path_prefix)));
    }
    if (required(c, &f[UPSTREAM]) != 0 || parseUpstream(c, &f[UPSTREAM], r) != 0 ||
        required(c, &f[TENANT]) != 0) {
        return -1;
    }
    const char *tn;
    if (stringValue(c, &f[TENANT], &tn) != 0) {
        return -1;
    }
    size_t ti = 0;
    while (ti < cfg->n_tenants && strcmp(cfg->tenants[ti].name, tn) != 0) {
        ti++;
    }
    if (ti == cfg->n_tenants) {
        char q[QUOTE_SIZE];
        return failNode(c, f[TENANT].val, "%s: unknown tenant %s (not in tenants)", f[TENANT].name,
                        quote(q, tn, strlen(tn)));
    }
    r->tenant = ti;
    /* 0: the tenant's default. */
    if (getU64(c, &f[LEASE], 0, DAY_MS, &r->lease_ms) != 0 ||
        getU64(c, &f[TTL], 0, 365 * DAY_MS, &r->ttl_ms) != 0) {
        return -1;
    }
    if (present(&f[POLICY])) {
        if (parseLeasePolicy(c, &f[POLICY], &r->lease_policy) != 0) {
            return -1;
        }
        r->lease_policy_set = true;
    }
    if (parseStatusChoice(c, &f[MISMATCH], 409, 422, &r->mismatch_status) != 0 ||
        parseStatusChoice(c, &f[IN_PROGRESS], 409, 425, &r->in_progress_status) != 0 ||
        parseHeaderNames(c, &f[FP_HEADERS], &r->fingerprint_headers, &r->n_fingerprint_headers) !=
            0 ||
        getBool(c, &f[STORE_4XX], &r->store_4xx) != 0) {
        return -1;
    }
    if (present(&f[ON_TIMEOUT])) {
        const char *s;
        if (stringValue(c, &f[ON_TIMEOUT], &s) != 0) {
            return -1;
        }
        if (strcmp(s, "unknown") == 0) {
            r->on_timeout_unknown = true;
        } else if (strcmp(s, "release") == 0) {
            r->on_timeout_unknown = false;
        } else {
            char q[QUOTE_SIZE];
            return failNode(c, f[ON_TIMEOUT].val, "%s: expected unknown or release, got %s",
                            f[ON_TIMEOUT].name, quote(q, s, strlen(s)));
        }
    }
    if (getU32(c, &f[TIMEOUT], 1, 3600000, &r->upstream_timeout_ms) != 0 ||
        parseHeaderNames(c, &f[RESP_HEADERS], &r->response_headers, &r->n_response_headers) != 0 ||
        getU64(c, &f[MAX_INLINE], 0, 64u << 20, &r->max_inline_body) != 0 ||
        getBool(c, &f[KEY_REQUIRED], &r->key_required) != 0) {
        return -1;
    }
    return 0;
}

static int parseProxyListener(struct ctx *c, yaml_node_t *map, size_t index, struct config *cfg,
                              struct config_proxy *p)
{
    enum { ADDRESS, ROUTES, N };
    static const char *const keys[N] = {"address", "routes"};
    char where[FIELD_NAME_MAX];
    snprintf(where, sizeof where, "proxy[%zu]", index);
    struct field f[N];
    if (mapFields(c, map, where, where, keys, N, f) != 0 || required(c, &f[ADDRESS]) != 0 ||
        getAddr(c, &f[ADDRESS], &p->address) != 0) {
        return -1;
    }
    if (p->address.port == 0) {
        return failNode(c, f[ADDRESS].val, "%s: must not be empty", f[ADDRESS].name);
    }
    if (strcmp(p->address.text, cfg->node.http_address.text) == 0 ||
        strcmp(p->address.text, cfg->node.rpc_address.text) == 0 ||
        strcmp(p->address.text, cfg->node.raft_address.text) == 0) {
        return failNode(c, f[ADDRESS].val, "%s: the address is already used by node",
                        f[ADDRESS].name);
    }
    for (size_t i = 0; i < index; i++) {
        if (strcmp(cfg->proxies[i].address.text, p->address.text) == 0) {
            return failNode(c, f[ADDRESS].val, "%s: the address is already used by proxy[%zu]",
                            f[ADDRESS].name, i);
        }
    }
    if (required(c, &f[ROUTES]) != 0) {
        return -1;
    }
    yaml_node_t *list = f[ROUTES].val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return failNode(c, list, "%s: expected a list, got %s", f[ROUTES].name, kindName(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return failNode(c, list, "%s: at least one route is required", f[ROUTES].name);
    }
    p->routes = calloc(n, sizeof *p->routes);
    if (p->routes == NULL) {
        return failNode(c, list, "%s: out of memory", f[ROUTES].name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        char rwhere[FIELD_NAME_MAX + 32];
        snprintf(rwhere, sizeof rwhere, "%s.routes[%zu]", where, i);
        if (visit(c, list->data.sequence.items.start[i], &item) != 0) {
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

static int parseProxies(struct ctx *c, const struct field *f, struct config *cfg)
{
    yaml_node_t *list = f->val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return failNode(c, list, "%s: expected a list, got %s", f->name, kindName(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return 0;
    }
    cfg->proxies = calloc(n, sizeof *cfg->proxies);
    if (cfg->proxies == NULL) {
        return failNode(c, list, "%s: out of memory", f->name);
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (visit(c, list->data.sequence.items.start[i], &item) != 0) {
            return -1;
        }
        int rc = parseProxyListener(c, item, i, cfg, &cfg->proxies[i]);
        cfg->n_proxies = i + 1;
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

/* Neither secret may also be a token: whoever holds that token could then act for any
 * tenant (the cluster secret) or speak Raft to every node (the Raft secret). */
static int checkOneSecret(struct ctx *c, const struct config *cfg,
                          const struct config_secret *sec, const yaml_node_t *at,
                          const char *name)
{
    if (!sec->set) {
        return 0;
    }
    if (config_is_admin_hash(cfg, sec->sha256)) {
        return failNode(c, at, "%s: the secret is the admin token; it must differ from every token",
                        name);
    }
    const struct config_tenant *t = config_tenant_by_token_hash(cfg, sec->sha256);
    if (t != NULL) {
        return failNode(c, at,
                        "%s: the secret is a token of tenant \"%s\"; it must differ from every "
                        "token",
                        name, t->name);
    }
    return 0;
}

static int checkSecret(struct ctx *c, const struct config *cfg)
{
    if (checkOneSecret(c, cfg, &cfg->rpc.cluster_secret, c->secret_node,
                       "rpc.cluster_secret_file") != 0) {
        return -1;
    }
    const struct {
        const struct config_secret *sec;
        const yaml_node_t *at;
        const char *name;
    } raft[] = {{&cfg->raft.secret, c->raft_secret_node, "raft.secret_file"},
                {&cfg->raft.previous_secret, c->raft_previous_node, "raft.previous_secret_file"}};
    for (size_t i = 0; i < sizeof raft / sizeof raft[0]; i++) {
        if (checkOneSecret(c, cfg, raft[i].sec, raft[i].at, raft[i].name) != 0) {
            return -1;
        }
        /* Nor may a Raft secret be the cluster secret: followers send that one to the leader
         * as a bearer token, in the clear unless tls.rpc is on, while a Raft secret never
         * leaves a node (transport.h sends only MACs made with it). */
        if (raft[i].sec->set && cfg->rpc.cluster_secret.set &&
            CRYPTO_memcmp(raft[i].sec->sha256, cfg->rpc.cluster_secret.sha256,
                          CONFIG_HASH_LEN) == 0) {
            return failNode(c, raft[i].at,
                            "%s: the secret is the cluster secret (rpc.cluster_secret_file), "
                            "which followers send to the leader as a token; it must differ",
                            raft[i].name);
        }
    }
    return 0;
}

static void setDefaults(struct config *cfg)
{
    cfg->raft.election_timeout_ms = 600;
    cfg->raft.heartbeat_timeout_ms = 100;
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
    cfg->batch.max_commands = 256;
    cfg->batch.max_bytes = 1u << 20;
    cfg->batch.max_pending_mb = 64;
    cfg->batch.tenant_max_pending_percent = 50;
    cfg->batch.tenant_max_inflight_kb = 2048;
    cfg->http.max_connections = 1024;
    cfg->expiry.interval_ms = 1000;
    cfg->expiry.batch = 1024;
}

/* Reads the top-level mapping. Sections are read in a fixed order (admin before tenants,
 * node before cluster), whatever their order in the file. */
static int parseRoot(struct ctx *c, yaml_node_t *root, struct config *cfg)
{
    enum { NODE, CLUSTER, RAFT, RPC, BATCH, HTTP, EXPIRY, TLS, ADMIN, TENANTS, PROXY, N };
    static const char *const keys[N] = {"node", "cluster", "raft",  "rpc",     "batch", "http",
                                        "expiry", "tls",   "admin", "tenants", "proxy"};
    struct field f[N];
    if (root->type != YAML_MAPPING_NODE) {
        return failNode(c, root, "expected a mapping at the top level, got %s", kindName(root));
    }
    if (mapFields(c, root, "the top level", "", keys, N, f) != 0 || required(c, &f[NODE]) != 0 ||
        parseNode(c, f[NODE].val, &cfg->node) != 0 ||
        (present(&f[CLUSTER]) &&
         parseCluster(c, f[CLUSTER].val, cfg->node.id, &cfg->cluster) != 0) ||
        (present(&f[RAFT]) && parseRaft(c, f[RAFT].val, &cfg->raft) != 0) ||
        (present(&f[RPC]) && parseRpc(c, f[RPC].val, &cfg->rpc) != 0) ||
        (present(&f[BATCH]) && parseBatch(c, f[BATCH].val, &cfg->batch) != 0) ||
        (present(&f[HTTP]) && parseHttp(c, f[HTTP].val, &cfg->http) != 0) ||
        (present(&f[EXPIRY]) && parseExpiry(c, f[EXPIRY].val, &cfg->expiry) != 0) ||
        (present(&f[TLS]) && parseTls(c, f[TLS].val, &cfg->tls) != 0) ||
        required(c, &f[ADMIN]) != 0 || parseAdmin(c, f[ADMIN].val, cfg->admin_token_sha256) != 0 ||
        required(c, &f[TENANTS]) != 0 || parseTenants(c, &f[TENANTS], cfg) != 0 ||
        (present(&f[PROXY]) && parseProxies(c, &f[PROXY], cfg) != 0)) {
        return -1;
    }
    return checkSecret(c, cfg);
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

/* Parses one YAML document from text into cfg (already zeroed and holding the defaults). */
static int parseText(struct ctx *c, struct config *cfg)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = -1;
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
        rc = failNode(c, extra, "a second YAML document; the file must hold only one");
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
    rc = visit(c, 1, &r);
    assert(rc == 0 && r == root);
    rc = parseRoot(c, root, cfg);
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
            for (size_t k = 0; k < r->n_response_headers; k++) {
                free(r->response_headers[k]);
            }
            free(r->response_headers);
        }
        free(p->routes);
    }
    free(c->proxies);
    memset(c, 0, sizeof *c);
}

const struct config_tenant *config_tenant_by_token_hash(const struct config *c,
                                                        const uint8_t hash[CONFIG_HASH_LEN])
{
    const struct config_tenant *found = NULL;
    for (size_t i = 0; i < c->n_tenants; i++) {
        const struct config_tenant *t = &c->tenants[i];
        for (size_t j = 0; j < t->n_token_hashes; j++) {
            /* No early exit: every hash is compared whatever matched before. Hashes are
             * unique (config_parse() checks), so at most one matches. */
            int differs = CRYPTO_memcmp(t->token_hashes[j], hash, CONFIG_HASH_LEN);
            found = differs == 0 ? t : found;
        }
    }
    return found;
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
