/* config_sections: the configuration's top level and its node, cluster, raft, rpc, batch,
 * http, expiry, tls, log and admin sections, and the checks made once every section is read
 * (config_internal.h): no secret is also a token, the cluster secret never goes out in
 * clear but between loopback addresses, a TLS switch has its listeners. */
#include "config_internal.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsm.h" /* FSM_SLOT_BITS: the commands of one log entry */

/* node.*_listen: each defaults to its advertised address; http_listen needs http_address
 * (a gateway no member or client is told of would be of no use). */
static int nodeListen(struct ctx *c, const struct field *f, struct config_node *n)
{
    enum { RAFT_L, RPC_L, HTTP_L };
    if (config_get_addr(c, &f[RAFT_L], &n->raft_listen) != 0 ||
        config_get_addr(c, &f[RPC_L], &n->rpc_listen) != 0 ||
        config_get_addr(c, &f[HTTP_L], &n->http_listen) != 0) {
        return -1;
    }
    if (n->http_listen.port != 0 && n->http_address.port == 0) {
        return config_fail_node(c, f[HTTP_L].val,
                                "%s: set node.http_address too (the address the members and "
                                "clients are given for this gateway)",
                                f[HTTP_L].name);
    }
    if (n->raft_listen.port == 0) {
        n->raft_listen = n->raft_address;
    }
    if (n->rpc_listen.port == 0) {
        n->rpc_listen = n->rpc_address;
    }
    if (n->http_listen.port == 0) {
        n->http_listen = n->http_address;
    }
    return 0;
}

static int parseNode(struct ctx *c, yaml_node_t *map, struct config_node *n)
{
    enum { ID, RAFT, RPC, HTTP, DATA_DIR, RAFT_L, RPC_L, HTTP_L, N };
    static const char *const keys[N] = {"id",       "raft_address", "rpc_address", "http_address",
                                        "data_dir", "raft_listen",  "rpc_listen",  "http_listen"};
    struct field f[N];
    if (config_map_fields(c, map, "node", "node", keys, N, f) != 0) {
        return -1;
    }
    if (config_required(c, &f[ID]) != 0 || config_get_u64(c, &f[ID], 1, NODE_ID_MAX, &n->id) != 0 ||
        config_required(c, &f[RAFT]) != 0 || config_get_addr(c, &f[RAFT], &n->raft_address) != 0 ||
        config_required(c, &f[RPC]) != 0 || config_get_addr(c, &f[RPC], &n->rpc_address) != 0 ||
        config_get_addr(c, &f[HTTP], &n->http_address) != 0 ||
        config_required(c, &f[DATA_DIR]) != 0 ||
        config_get_path(c, &f[DATA_DIR], &n->data_dir) != 0) {
        return -1;
    }
    if (n->raft_address.port == 0) {
        return config_fail_node(c, f[RAFT].val, "%s: must not be empty", f[RAFT].name);
    }
    if (n->rpc_address.port == 0) {
        return config_fail_node(c, f[RPC].val, "%s: must not be empty", f[RPC].name);
    }
    if (n->data_dir == NULL) {
        return config_fail_node(c, f[DATA_DIR].val, "%s: must not be empty", f[DATA_DIR].name);
    }
    return nodeListen(c, &f[RAFT_L], n);
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
    if (config_map_fields(c, map, where, where, keys, N, f) != 0) {
        return -1;
    }
    if (config_required(c, &f[ID]) != 0 || config_get_u64(c, &f[ID], 1, NODE_ID_MAX, &m->id) != 0 ||
        config_required(c, &f[RAFT]) != 0 || config_get_addr(c, &f[RAFT], &m->raft_address) != 0 ||
        config_required(c, &f[RPC]) != 0 || config_get_addr(c, &f[RPC], &m->rpc_address) != 0 ||
        config_get_addr(c, &f[HTTP], &m->http_address) != 0) {
        return -1;
    }
    if (m->raft_address.port == 0) {
        return config_fail_node(c, f[RAFT].val, "%s: must not be empty", f[RAFT].name);
    }
    if (m->rpc_address.port == 0) {
        return config_fail_node(c, f[RPC].val, "%s: must not be empty", f[RPC].name);
    }
    for (size_t j = 0; j < index; j++) {
        if (members[j].id == m->id) {
            return config_fail_node(c, f[ID].val,
                                    "%s: duplicate member id %llu (also "
                                    "cluster.bootstrap[%zu])",
                                    f[ID].name, (unsigned long long)m->id, j);
        }
        if (config_addr_same(&members[j].raft_address, &m->raft_address)) {
            return config_fail_node(c, f[RAFT].val,
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
    if (config_map_fields(c, map, "cluster", "cluster", keys, N, f) != 0) {
        return -1;
    }
    if (!config_present(&f[BOOTSTRAP])) {
        return 0;
    }
    yaml_node_t *list = f[BOOTSTRAP].val;
    if (list->type != YAML_SEQUENCE_NODE) {
        return config_fail_node(c, list, "%s: expected a list, got %s", f[BOOTSTRAP].name,
                                config_kind_name(list));
    }
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (n == 0) {
        return 0;
    }
    cl->bootstrap = calloc(n, sizeof *cl->bootstrap);
    if (cl->bootstrap == NULL) {
        return config_fail_node(c, list, "%s: out of memory", f[BOOTSTRAP].name);
    }
    bool has_self = false;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = NULL;
        if (config_visit(c, list->data.sequence.items.start[i], &item) != 0 ||
            parseMember(c, item, i, cl->bootstrap) != 0) {
            return -1;
        }
        cl->n_bootstrap = i + 1;
        has_self = has_self || cl->bootstrap[i].id == self;
    }
    /* Every member of the initial configuration bootstraps with the same list; a node that
     * is not in it must start with an empty list and be added later. */
    if (!has_self) {
        return config_fail_node(c, list,
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
    if (config_map_fields(c, map, "raft", "raft", keys, N, f) != 0 ||
        config_get_u32(c, &f[ELECTION], 100, 60000, &r->election_timeout_ms) != 0 ||
        config_get_u32(c, &f[HEARTBEAT], 10, 10000, &r->heartbeat_timeout_ms) != 0 ||
        config_get_u32(c, &f[THRESHOLD], 16, UINT32_MAX, &r->snapshot_threshold) != 0 ||
        config_get_u32(c, &f[TRAILING], 1, UINT32_MAX, &r->snapshot_trailing) != 0 ||
        config_get_u32(c, &f[LOG_PERCENT], 0, 10000, &r->snapshot_log_percent) != 0 ||
        config_get_u32(c, &f[LOG_MAX], 1, 65536, &r->snapshot_log_max_mb) != 0 ||
        config_get_u32(c, &f[TRAILING_MAX], 1, 65536, &r->snapshot_trailing_max_mb) != 0 ||
        config_get_u32(c, &f[SEGMENT], 1, 1024, &r->segment_size_mb) != 0 ||
        config_get_u32(c, &f[SNAP_NICE], 0, 19, &r->snapshot_nice) != 0 ||
        config_get_bool(c, &f[PRE_VOTE], &r->pre_vote) != 0 ||
        config_get_bool(c, &f[PREFILL], &r->prefill_segments) != 0 ||
        config_get_u32(c, &f[STEP_DOWN], 0, 600000, &r->stuck_write_step_down_ms) != 0 ||
        config_get_path(c, &f[SECRET], &secret_path) != 0 ||
        config_get_path(c, &f[PREVIOUS], &previous_path) != 0) {
        free(secret_path);
        return -1;
    }
    if (r->stuck_write_step_down_ms != 0 && r->stuck_write_step_down_ms < 1000) {
        /* Under a second is within an ordinary slow fsync: leadership would flap. */
        free(secret_path);
        free(previous_path);
        return config_fail_node(c, f[STEP_DOWN].val,
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
        int rc =
            readSecret(c, &f[PREVIOUS], previous_path, CONFIG_RAFT_SECRET_MIN, &r->previous_secret);
        free(previous_path);
        if (rc != 0) {
            return -1;
        }
        c->raft_previous_node = f[PREVIOUS].val;
        if (!r->secret.set) {
            return config_fail_node(
                c, f[PREVIOUS].val,
                "raft.previous_secret_file needs raft.secret_file (the secret the "
                "members move to)");
        }
        if (CRYPTO_memcmp(r->secret.sha256, r->previous_secret.sha256, CONFIG_HASH_LEN) == 0) {
            return config_fail_node(
                c, f[PREVIOUS].val,
                "raft.previous_secret_file: the secret is raft.secret_file's; drop "
                "previous_secret_file, or name the old secret");
        }
    }
    if (r->heartbeat_timeout_ms >= r->election_timeout_ms) {
        const yaml_node_t *at = config_present(&f[HEARTBEAT])  ? f[HEARTBEAT].val
                                : config_present(&f[ELECTION]) ? f[ELECTION].val
                                                               : map;
        return config_fail_node(c, at,
                                "raft.heartbeat_timeout_ms must be less than "
                                "election_timeout_ms (%u >= %u)",
                                (unsigned)r->heartbeat_timeout_ms,
                                (unsigned)r->election_timeout_ms);
    }
    return 0;
}

/* Reads a secret of at least `min` bytes from the file named by field f (present, a path)
 * into *out. Messages quote the path, never the file's bytes. */
static int readSecret(struct ctx *c, const struct field *f, const char *path, size_t min,
                      struct config_secret *out)
{
    char q[QUOTE_SIZE];
    config_quote(q, path, strlen(path));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return config_fail_node(c, f->val, "%s: cannot read %s: %s", f->name, q, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        int e = errno;
        fclose(fp);
        return config_fail_node(c, f->val, "%s: cannot stat %s: %s", f->name, q, strerror(e));
    }
    if (S_ISREG(st.st_mode) && (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
        fclose(fp);
        return config_fail_node(c, f->val,
                                "%s: %s may be read or written by its group or by others (mode "
                                "%04o): give it mode 600 (chmod 600), as the secret it is",
                                f->name, q, (unsigned)(st.st_mode & 07777));
    }
    /* Room for the secret's most bytes and some trailing whitespace after them; a file
     * that fills it holds more than that. */
    uint8_t buf[SECRET_MAX + SECRET_TAIL_MAX + 1];
    size_t len = fread(buf, 1, sizeof buf, fp);
    int rerr = ferror(fp) ? errno : 0;
    fclose(fp);
    int rc = 0;
    while (len > 0 && len < sizeof buf &&
           (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
            buf[len - 1] == '\t')) {
        len--;
    }
    unsigned int hl = 0;
    if (rerr != 0) {
        rc = config_fail_node(c, f->val, "%s: cannot read %s: %s", f->name, q, strerror(rerr));
    } else if (len > SECRET_MAX) {
        rc = config_fail_node(c, f->val, "%s: %s holds more than %u bytes", f->name, q, SECRET_MAX);
    } else if (len < min) {
        rc = config_fail_node(
            c, f->val,
            "%s: %s holds %zu bytes (without trailing whitespace); this secret needs "
            "at least %zu",
            f->name, q, len, min);
    } else if ((out->value = malloc(len)) == NULL) {
        rc = config_fail_node(c, f->val, "%s: out of memory", f->name);
    } else if (EVP_Digest(buf, len, out->sha256, &hl, EVP_sha256(), NULL) != 1) {
        rc = config_fail_node(c, f->val, "%s: cannot hash the secret", f->name);
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
        INSECURE,
        FIRST_FRAME,
        PER_ADDRESS,
        MEMBERS,
        UNAUTH_FRAME,
        N
    };
    static const char *const keys[N] = {"max_frame_bytes",
                                        "default_deadline_ms",
                                        "max_deadline_ms",
                                        "max_connections",
                                        "cluster_secret_file",
                                        "idle_timeout_ms",
                                        "handshake_timeout_ms",
                                        "max_frame_buffer_mb",
                                        "max_answer_buffer_mb",
                                        "insecure_cluster_secret",
                                        "first_frame_timeout_ms",
                                        "max_connections_per_address",
                                        "member_connections",
                                        "unauthenticated_max_frame_bytes"};
    struct field f[N];
    char *secret_path = NULL;
    uint32_t *unauth_max = &r->unauthenticated_max_frame_bytes;
    if (config_map_fields(c, map, "rpc", "rpc", keys, N, f) != 0 ||
        config_get_u32(c, &f[FRAME], 1024, 64u << 20, &r->max_frame_bytes) != 0 ||
        config_get_u32(c, &f[DEFAULT_DEADLINE], 1, 600000, &r->default_deadline_ms) != 0 ||
        config_get_u32(c, &f[MAX_DEADLINE], 1, 600000, &r->max_deadline_ms) != 0 ||
        config_get_u32(c, &f[CONNECTIONS], 1, 1u << 20, &r->max_connections) != 0 ||
        config_get_u32(c, &f[IDLE], 100, 86400000, &r->idle_timeout_ms) != 0 ||
        config_get_u32(c, &f[HANDSHAKE], 100, 600000, &r->handshake_timeout_ms) != 0 ||
        config_get_u32(c, &f[BUFFERS], 1, 65536, &r->max_frame_buffer_mb) != 0 ||
        config_get_u32(c, &f[ANSWERS], 1, 65536, &r->max_answer_buffer_mb) != 0 ||
        config_get_bool(c, &f[INSECURE], &r->insecure_cluster_secret) != 0 ||
        config_get_u32(c, &f[FIRST_FRAME], 100, 600000, &r->first_frame_timeout_ms) != 0 ||
        config_get_u32(c, &f[PER_ADDRESS], 0, 1u << 20, &r->max_connections_per_address) != 0 ||
        config_get_u32(c, &f[MEMBERS], 0, 1u << 20, &r->member_connections) != 0 ||
        config_get_u32(c, &f[UNAUTH_FRAME], 1024, 64u << 20, unauth_max) != 0 ||
        config_get_path(c, &f[SECRET], &secret_path) != 0) {
        return -1;
    }
    c->insecure_node = f[INSECURE].val;
    if (secret_path != NULL) {
        int rc = readSecret(c, &f[SECRET], secret_path, SECRET_MIN, &r->cluster_secret);
        free(secret_path);
        c->secret_node = f[SECRET].val;
        if (rc != 0) {
            return -1;
        }
    }
    if (r->default_deadline_ms > r->max_deadline_ms) {
        const yaml_node_t *at = config_present(&f[DEFAULT_DEADLINE]) ? f[DEFAULT_DEADLINE].val
                                : config_present(&f[MAX_DEADLINE])   ? f[MAX_DEADLINE].val
                                                                     : map;
        return config_fail_node(c, at,
                                "rpc.default_deadline_ms must not exceed max_deadline_ms "
                                "(%u > %u)",
                                (unsigned)r->default_deadline_ms, (unsigned)r->max_deadline_ms);
    }
    return 0;
}

static int parseBatch(struct ctx *c, yaml_node_t *map, struct config_batch *b)
{
    enum { COMMANDS, BYTES, PENDING, SHARE, INFLIGHT, DELAY, N };
    static const char *const keys[N] = {"max_commands",
                                        "max_bytes",
                                        "max_pending_mb",
                                        "tenant_max_pending_percent",
                                        "tenant_max_inflight_kb",
                                        "delay_us"};
    struct field f[N];
    if (config_map_fields(c, map, "batch", "batch", keys, N, f) != 0 ||
        config_get_u32(c, &f[COMMANDS], 1, (1u << FSM_SLOT_BITS) - 1, &b->max_commands) != 0 ||
        config_get_u32(c, &f[BYTES], 1024, 64u << 20, &b->max_bytes) != 0 ||
        config_get_u32(c, &f[PENDING], 1, 65536, &b->max_pending_mb) != 0 ||
        config_get_u32(c, &f[SHARE], 1, 100, &b->tenant_max_pending_percent) != 0 ||
        config_get_u32(c, &f[INFLIGHT], 0, 1048576, &b->tenant_max_inflight_kb) != 0 ||
        config_get_u32(c, &f[DELAY], 0, 100000, &b->delay_us) != 0) {
        return -1;
    }
    if (((uint64_t)b->max_pending_mb << 20) < 2 * (uint64_t)b->max_bytes) {
        const yaml_node_t *at = config_present(&f[PENDING]) ? f[PENDING].val
                                : config_present(&f[BYTES]) ? f[BYTES].val
                                                            : map;
        return config_fail_node(
            c, at, "batch.max_pending_mb (%u MiB) must be at least twice max_bytes (%u)",
            b->max_pending_mb, b->max_bytes);
    }
    return 0;
}

static int parseHttp(struct ctx *c, yaml_node_t *map, struct config_http *h)
{
    enum { CONNECTIONS, HANDSHAKE, METRICS_PUBLIC, PER_ADDRESS, N };
    static const char *const keys[N] = {"max_connections", "handshake_timeout_ms",
                                        "metrics_public", "max_connections_per_address"};
    struct field f[N];
    return config_map_fields(c, map, "http", "http", keys, N, f) != 0 ||
                   config_get_u32(c, &f[CONNECTIONS], 1, 1u << 20, &h->max_connections) != 0 ||
                   config_get_u32(c, &f[HANDSHAKE], 100, 600000, &h->handshake_timeout_ms) != 0 ||
                   config_get_bool(c, &f[METRICS_PUBLIC], &h->metrics_public) != 0 ||
                   config_get_u32(c, &f[PER_ADDRESS], 0, 1u << 20,
                                  &h->max_connections_per_address) != 0
               ? -1
               : 0;
}

static int parseExpiry(struct ctx *c, yaml_node_t *map, struct config_expiry *e)
{
    enum { INTERVAL, BATCH, N };
    static const char *const keys[N] = {"interval_ms", "batch"};
    struct field f[N];
    return config_map_fields(c, map, "expiry", "expiry", keys, N, f) != 0 ||
                   config_get_u32(c, &f[INTERVAL], 1, 3600000, &e->interval_ms) != 0 ||
                   config_get_u32(c, &f[BATCH], 1, 65536, &e->batch) != 0
               ? -1
               : 0;
}

/* tls.http_client_certs: off, optional or require into *out; left alone when absent. */
static int parseClientCerts(struct ctx *c, const struct field *f, enum config_client_certs *out)
{
    const char *s;
    if (!config_present(f)) {
        return 0;
    }
    if (config_string_value(c, f, &s) != 0) {
        return -1;
    }
    static const char *const names[] = {"off", "optional", "require"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum config_client_certs)i;
            return 0;
        }
    }
    char q[QUOTE_SIZE];
    return config_fail_node(c, f->val, "%s: expected off, optional or require, got %s", f->name,
                            config_quote(q, s, strlen(s)));
}

static int parseTls(struct ctx *c, yaml_node_t *map, struct config_tls *t)
{
    enum { CERT, KEY, CA, RPC, HTTP, PROXY, CLIENT_CERTS, RAFT, N };
    static const char *const keys[N] = {"cert_file", "key_file", "ca_file",          "rpc",
                                        "http",      "proxy",    "http_client_certs", "raft"};
    struct field f[N];
    if (config_map_fields(c, map, "tls", "tls", keys, N, f) != 0 ||
        config_get_path(c, &f[CERT], &t->cert_file) != 0 ||
        config_get_path(c, &f[KEY], &t->key_file) != 0 ||
        config_get_path(c, &f[CA], &t->ca_file) != 0 || config_get_bool(c, &f[RPC], &t->rpc) != 0 ||
        config_get_bool(c, &f[HTTP], &t->http) != 0 ||
        config_get_bool(c, &f[PROXY], &t->proxy) != 0 ||
        parseClientCerts(c, &f[CLIENT_CERTS], &t->http_client_certs) != 0 ||
        config_get_bool(c, &f[RAFT], &t->raft) != 0) {
        return -1;
    }
    if ((t->at = config_position(c, map)) == NULL) {
        return config_fail_node(c, map, "tls: out of memory");
    }
    c->tls_http_node = f[HTTP].val;
    c->tls_proxy_node = f[PROXY].val;
    if ((t->cert_file != NULL) != (t->key_file != NULL)) {
        return config_fail_node(c, map, "tls: cert_file and key_file go together; missing %s",
                                t->cert_file ? "key_file" : "cert_file");
    }
    if (t->ca_file != NULL && t->cert_file == NULL) {
        return config_fail_node(c, map, "tls: ca_file needs cert_file and key_file");
    }
    t->enabled = t->cert_file != NULL;
    const struct {
        bool on;
        const yaml_node_t *at;
        const char *what;
    } uses[] = {{t->rpc, f[RPC].val, "tls.rpc: TLS on the RPC listener"},
                {t->http, f[HTTP].val, "tls.http: TLS on the HTTP gateway"},
                {t->proxy, f[PROXY].val, "tls.proxy: TLS on the proxy listeners"}};
    for (size_t i = 0; i < sizeof uses / sizeof uses[0]; i++) {
        if (uses[i].on && !t->enabled) {
            return config_fail_node(c, uses[i].at, "%s needs cert_file and key_file", uses[i].what);
        }
    }
    if (t->http_client_certs != CONFIG_CLIENT_CERTS_OFF) {
        if (t->ca_file == NULL) {
            return config_fail_node(c, f[CLIENT_CERTS].val,
                                    "tls.http_client_certs: client certificates need ca_file "
                                    "(the CA that signs them)");
        }
        if (!t->http && !t->proxy) {
            return config_fail_node(c, f[CLIENT_CERTS].val,
                                    "tls.http_client_certs: no HTTP listener serves TLS "
                                    "(tls.http, tls.proxy)");
        }
    }
    if (t->raft && (!t->enabled || t->ca_file == NULL)) {
        /* Mutual TLS between the members: each verifies the other against ca_file. */
        return config_fail_node(c, f[RAFT].val,
                                "tls.raft: TLS between the members needs cert_file, key_file "
                                "and ca_file; missing %s",
                                t->cert_file == NULL ? "cert_file and key_file" : "ca_file");
    }
    return 0;
}

/* log.level and log.format: the index of a name from `names` (n of them, `expected` lists
 * them for the message) into *out; left alone when absent. */
static int parseLogName(struct ctx *c, const struct field *f, const char *const *names, size_t n,
                        const char *expected, int *out)
{
    const char *s;
    if (!config_present(f)) {
        return 0;
    }
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
    return config_fail_node(c, f->val, "%s: expected %s, got %s", f->name, expected,
                            config_quote(q, s, strlen(s)));
}

static int parseLog(struct ctx *c, yaml_node_t *map, struct config_log *l)
{
    enum { LEVEL, FORMAT, N };
    static const char *const keys[N] = {"level", "format"};
    static const char *const levels[] = {"debug", "info", "warn", "error"}; /* log.h's order */
    static const char *const formats[] = {"text", "json"};
    struct field f[N];
    int level = (int)l->level, format = (int)l->format;
    if (config_map_fields(c, map, "log", "log", keys, N, f) != 0 ||
        parseLogName(c, &f[LEVEL], levels, 4, "debug, info, warn or error", &level) != 0 ||
        parseLogName(c, &f[FORMAT], formats, 2, "text or json", &format) != 0) {
        return -1;
    }
    l->level = (enum log_level)level;
    l->format = (enum log_format)format;
    return 0;
}

static int parseAdmin(struct ctx *c, yaml_node_t *map, uint8_t hash[CONFIG_HASH_LEN])
{
    enum { TOKEN, N };
    static const char *const keys[N] = {"token_sha256"};
    struct field f[N];
    if (config_map_fields(c, map, "admin", "admin", keys, N, f) != 0 ||
        config_required(c, &f[TOKEN]) != 0) {
        return -1;
    }
    return config_hash_value(c, f[TOKEN].val, f[TOKEN].name, hash);
}

/* Neither secret may also be a token: whoever holds that token could then act for any
 * tenant (the cluster secret) or speak Raft to every node (the Raft secret). */
static int checkOneSecret(struct ctx *c, const struct config *cfg, const struct config_secret *sec,
                          const yaml_node_t *at, const char *name)
{
    if (!sec->set) {
        return 0;
    }
    if (config_is_admin_hash(cfg, sec->sha256)) {
        return config_fail_node(
            c, at, "%s: the secret is the admin token; it must differ from every token", name);
    }
    const struct config_tenant *t = config_tenant_by_token_hash(cfg, sec->sha256);
    if (t != NULL) {
        char q[QUOTE_SIZE];
        return config_fail_node(
            c, at, "%s: the secret is a token of tenant %s; it must differ from every token",
            name, config_quote(q, t->name, strlen(t->name)));
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
            CRYPTO_memcmp(raft[i].sec->sha256, cfg->rpc.cluster_secret.sha256, CONFIG_HASH_LEN) ==
                0) {
            return config_fail_node(
                c, raft[i].at,
                "%s: the secret is the cluster secret (rpc.cluster_secret_file), "
                "which followers send to the leader as a token; it must differ",
                raft[i].name);
        }
    }
    return 0;
}

/* The cluster secret crosses the network as a bearer token (a follower's proxy sends it to the
 * leader's RPC address): only over TLS (tls.rpc), or, with rpc.insecure_cluster_secret, in
 * clear between loopback addresses alone (a cluster on one host). A member added later with
 * another address is not sent it (proxy_record.c). */
static int checkSecretTransport(struct ctx *c, const struct config *cfg)
{
    if (!cfg->rpc.cluster_secret.set || cfg->tls.rpc) {
        return 0;
    }
    if (!cfg->rpc.insecure_cluster_secret) {
        return config_fail_node(
            c, c->secret_node,
            "rpc.cluster_secret_file: followers send the cluster secret to the leader's RPC "
            "address, in clear without tls.rpc; turn tls.rpc on, or, when every member's "
            "rpc_address is a loopback address, set rpc.insecure_cluster_secret: true");
    }
    const char *bad =
        config_addr_is_loopback(cfg->node.rpc_address.text) ? NULL : cfg->node.rpc_address.text;
    for (size_t i = 0; bad == NULL && i < cfg->cluster.n_bootstrap; i++) {
        const char *a = cfg->cluster.bootstrap[i].rpc_address.text;
        bad = config_addr_is_loopback(a) ? NULL : a;
    }
    struct config_addr ba;
    char why[QUOTE_SIZE + 96];
    char q[QUOTE_SIZE];
    if (bad != NULL && config_addr_parse(bad, &ba, why, sizeof why) == 0 &&
        config_addr_is_name(&ba)) {
        /* Not resolved to decide: a name may resolve elsewhere later, or on another node. */
        return config_fail_node(
            c, c->insecure_node,
            "rpc.insecure_cluster_secret: the RPC address %s is a host name; the cluster secret "
            "goes in clear only to loopback addresses written as such (127.0.0.1, [::1]), "
            "which a name may not stay: write the address, or turn tls.rpc on",
            config_quote(q, bad, strlen(bad)));
    }
    if (bad != NULL) {
        return config_fail_node(
            c, c->insecure_node,
            "rpc.insecure_cluster_secret: the RPC address %s is not a loopback address; the "
            "cluster secret would cross the network in clear: turn tls.rpc on",
            config_quote(q, bad, strlen(bad)));
    }
    return 0;
}

/* A TLS switch needs the listeners it is for. */
static int checkTlsListeners(struct ctx *c, const struct config *cfg)
{
    if (cfg->tls.http && cfg->node.http_address.port == 0) {
        return config_fail_node(c, c->tls_http_node,
                                "tls.http: this node has no HTTP gateway (node.http_address)");
    }
    if (cfg->tls.proxy && cfg->n_proxies == 0) {
        return config_fail_node(c, c->tls_proxy_node,
                                "tls.proxy: this node has no proxy listener (proxy)");
    }
    return 0;
}

/* Reads the top-level mapping. Sections are read in a fixed order (admin before tenants,
 * node before cluster), whatever their order in the file. */
int config_sections_parse_root(struct ctx *c, yaml_node_t *root, struct config *cfg)
{
    enum { NODE, CLUSTER, RAFT, RPC, BATCH, HTTP, EXPIRY, TLS, ADMIN, TENANTS, PROXY, LOG, N };
    static const char *const keys[N] = {"node",   "cluster", "raft",  "rpc",     "batch", "http",
                                        "expiry", "tls",     "admin", "tenants", "proxy", "log"};
    struct field f[N];
    if (root->type != YAML_MAPPING_NODE) {
        return config_fail_node(c, root, "expected a mapping at the top level, got %s",
                                config_kind_name(root));
    }
    if (config_map_fields(c, root, "the top level", "", keys, N, f) != 0 ||
        config_required(c, &f[NODE]) != 0 || parseNode(c, f[NODE].val, &cfg->node) != 0 ||
        (config_present(&f[CLUSTER]) &&
         parseCluster(c, f[CLUSTER].val, cfg->node.id, &cfg->cluster) != 0) ||
        (config_present(&f[RAFT]) && parseRaft(c, f[RAFT].val, &cfg->raft) != 0) ||
        (config_present(&f[RPC]) && parseRpc(c, f[RPC].val, &cfg->rpc) != 0) ||
        (config_present(&f[BATCH]) && parseBatch(c, f[BATCH].val, &cfg->batch) != 0) ||
        (config_present(&f[HTTP]) && parseHttp(c, f[HTTP].val, &cfg->http) != 0) ||
        (config_present(&f[EXPIRY]) && parseExpiry(c, f[EXPIRY].val, &cfg->expiry) != 0) ||
        (config_present(&f[TLS]) && parseTls(c, f[TLS].val, &cfg->tls) != 0) ||
        (config_present(&f[LOG]) && parseLog(c, f[LOG].val, &cfg->log) != 0) ||
        config_required(c, &f[ADMIN]) != 0 ||
        parseAdmin(c, f[ADMIN].val, cfg->admin_token_sha256) != 0 ||
        config_required(c, &f[TENANTS]) != 0 || config_tenants_parse(c, &f[TENANTS], cfg) != 0 ||
        (config_present(&f[PROXY]) && config_proxy_parse(c, &f[PROXY], cfg) != 0)) {
        return -1;
    }
    return checkSecret(c, cfg) != 0 || checkSecretTransport(c, cfg) != 0 ||
                   checkTlsListeners(c, cfg) != 0
               ? -1
               : 0;
}
