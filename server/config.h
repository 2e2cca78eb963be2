/* config: loads and validates one node's YAML configuration file (docs/configuration.md).
 *
 * The file format, with every field, its unit, range and default, is documented in
 * tools/idemd.example.yaml. Loading either fills a whole struct config or fails with one
 * message "FILE:LINE:COLUMN: what is wrong" (1-based, the position of the offending YAML
 * node; of the enclosing mapping when a required key is missing). Unknown keys, duplicate
 * keys, YAML aliases and values out of range are errors; nothing is silently ignored.
 * Error messages never contain a token hash, only the name of the field that holds it.
 *
 * Proxy mode (issue #4): the optional top-level `proxy:` list of listeners and routes. The TLS
 * files are not opened here; whoever sets up TLS reports a missing or unreadable file at startup
 * (server/rpc.c for tls.rpc, server/gateway.c for tls.http and tls.proxy, cluster/raft_tls.c
 * for tls.raft), placed at the tls section (config_tls.at). */
#ifndef IDEM_SERVER_CONFIG_H
#define IDEM_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h" /* enum log_level, enum log_format */

/* Bytes of a token hash: a SHA-256 digest, written in the file as 64 hex digits. */
#define CONFIG_HASH_LEN 32

/* Longest host name (RFC 1035) and longest "host:port" text, without the NUL. */
#define CONFIG_HOST_MAX 253
#define CONFIG_ADDR_MAX (CONFIG_HOST_MAX + 6)

/* Longest tenant name in bytes, without the NUL; equals FSM_TENANT_MAX. */
#define CONFIG_TENANT_NAME_MAX 128

/* A "host:port" address (config_addr_parse): the host an IPv4 address, an IPv6 address in
 * brackets ("[::1]:9001") or a host name. Names are resolved where the address is used: a
 * listener's once at start, a peer's at each connection attempt (docs/operations.md). An
 * optional address that is not set has text and host "" and port 0. */
struct config_addr {
    char text[CONFIG_ADDR_MAX + 1]; /* canonical, e.g. "127.0.0.1:9001", "[::1]:9001",
                                     * "node1.example:9001" (config_addr_parse) */
    char host[CONFIG_HOST_MAX + 1]; /* without brackets: "127.0.0.1", "::1", "node1.example" */
    uint16_t port;                  /* 1..65535 when set */
    int family; /* AF_INET or AF_INET6 for an address, AF_UNSPEC (0) for a name */
};

/* Parses a node's address into *out: "A.B.C.D:PORT" (inet_pton's IPv4 form: no leading
 * zeros, no short or hexadecimal forms), "[IPV6]:PORT" (no zone index) or "NAME:PORT" (a host
 * name: labels of letters, digits, '-' and '_', the last not all digits), the port 1..65535
 * without leading zeros. out->text is canonical: an IPv6 address in RFC 5952's form (an
 * IPv4-mapped one, [::ffff:A.B.C.D], as the IPv4 address), a name in lower case; so two addresses
 * parsed here are the same endpoint when their texts are equal (a name and an address it resolves
 * to are not told apart). Nothing is resolved. 0, or -1 with the reason in `why` (which quotes `s`
 * escaped and cut short, never raw). */
int config_addr_parse(const char *s, struct config_addr *out, char *why, size_t why_len);

/* Whether a and b name one endpoint: their texts are equal, but for a name's final dot. */
bool config_addr_same(const struct config_addr *a, const struct config_addr *b);

/* Whether a set address's host is a name (to be resolved), not an IP address. */
bool config_addr_is_name(const struct config_addr *a);

/* Whether a "host:port" text (as config_addr_parse takes it) names a loopback address
 * (127.0.0.0/8, ::1); false for anything else: a host name (which may
 * resolve elsewhere, now or later) and a text that does not parse included. */
bool config_addr_is_loopback(const char *s);

/* One member of the initial Raft configuration (cluster.bootstrap). */
struct config_member {
    uint64_t id;
    struct config_addr raft_address;
    struct config_addr rpc_address;
    struct config_addr http_address; /* optional */
};

/* A node's addresses: those it is known by (advertised: what the other members and clients
 * are given, replicated as member metadata) and those it binds (node.*_listen; each defaults
 * to its advertised address, and may be a wildcard, 0.0.0.0:P or [::]:P). */
struct config_node {
    uint64_t id; /* 1..2^63 */
    struct config_addr raft_address;
    struct config_addr rpc_address;
    struct config_addr http_address; /* optional */
    struct config_addr raft_listen;  /* node.raft_listen, else raft_address */
    struct config_addr rpc_listen;   /* node.rpc_listen, else rpc_address */
    struct config_addr http_listen;  /* node.http_listen, else http_address (unset: none) */
    char *data_dir;                  /* owned, never NULL or empty after a successful load */
};

/* Used only on the first start of a node with an empty data_dir. */
struct config_cluster {
    struct config_member *bootstrap; /* owned array of n_bootstrap; NULL when empty (join) */
    size_t n_bootstrap;
};

/* A secret read from a file: the file's bytes, without trailing whitespace, at least 16
 * (the cluster secret) or 32 (the Raft secrets) and at most 4096 bytes; never printed. The cluster secret (rpc.cluster_secret_file) is shared by every node; a
 * follower's proxy listener sends it as the auth_token of the requests it forwards to the
 * leader on behalf of a configured tenant (Request.as_tenant). The Raft secret
 * (raft.secret_file) authenticates the Raft connections. */
/* The fewest bytes of a Raft secret; cluster.h's CLUSTER_SECRET_MIN (service.c
 * asserts the two agree: config does not see the cluster's headers). */
#define CONFIG_RAFT_SECRET_MIN 32

struct config_secret {
    bool set;                         /* false: no file configured (the default) */
    uint8_t *value;                   /* owned; len bytes (not NUL-terminated); NULL when unset */
    size_t len;
    uint8_t sha256[CONFIG_HASH_LEN];  /* SHA-256 of value, compared in constant time */
};

struct config_raft {
    uint32_t election_timeout_ms;  /* 100..60000, default 300 */
    uint32_t heartbeat_timeout_ms; /* 10..10000 and < election, default 50 */
    uint32_t snapshot_threshold;   /* fewest entries between snapshots, >= 16, default 8192 */
    uint32_t snapshot_trailing;    /* entries kept after a snapshot, default 2048 */
    uint32_t snapshot_trailing_max_mb; /* ... but no more than this much of them (at least
                                        * one entry); 1..65536, default 256 */
    uint32_t snapshot_log_percent; /* next snapshot once the log since the last one reaches
                                    * this % of its size; 0..10000, default 100, 0: off */
    uint32_t snapshot_log_max_mb;  /* ... or this much log; 1..65536, default 256 */
    uint32_t segment_size_mb;      /* log segment files; 1..1024, default 64 */
    uint32_t snapshot_nice;        /* added to the serialising thread's nice; 0..19, default 19 */
    bool pre_vote;                 /* default true */
    bool prefill_segments;         /* default true (cluster/segfill.h) */
    uint32_t stuck_write_step_down_ms; /* 0 or 1000..600000, default 5000 (cluster.h) */
    /* raft.secret_file: when set, every Raft connection is authenticated both ways with it
     * (cluster/transport.h); every member needs the same one. Must differ from every token
     * and from the cluster secret (which is sent over the RPC). */
    struct config_secret secret;
    /* raft.previous_secret_file: while the members move to a new secret, the old one, still
     * accepted and used to connect to peers that do not have the new one yet. Needs
     * secret_file; differs from it, from every token and from the cluster secret. */
    struct config_secret previous_secret;
};

struct config_rpc {
    uint32_t max_frame_bytes;     /* 1024..64 MiB, default 4 MiB + 128 KiB */
    uint32_t max_frame_buffer_mb; /* every connection's frame buffers together, past their
                                   * first 64 KiB each: 1..65536 MiB, default 256 */
    uint32_t max_answer_buffer_mb; /* answers waiting to be written, every connection's
                                    * together: 1..65536 MiB, default 1024 */
    uint32_t default_deadline_ms; /* 1..600000 and <= max_deadline_ms, default 2000 */
    uint32_t max_deadline_ms;     /* 1..600000, default 60000 */
    uint32_t max_connections;     /* 1..1048576, default 1024 */
    uint32_t idle_timeout_ms;     /* 100..86400000, default 300000: a connection owed
                                   * nothing that completed no frame for this long closes */
    uint32_t handshake_timeout_ms; /* 100..600000, default 5000: TLS handshake bound */
    uint32_t first_frame_timeout_ms;      /* 100..600000, default 5000: a connection that has
                                           * completed no frame this long after its accept (TLS
                                           * handshake included) is closed */
    uint32_t max_connections_per_address; /* 0..1048576, default 256; 0: no cap. Members'
                                           * addresses are not capped (server/rpc_admit.h) */
    uint32_t member_connections;          /* 0..1048576, default 32: slots of max_connections that
                                           * only members may take (at most half of them) */
    uint32_t unauthenticated_max_frame_bytes; /* 1024..64 MiB, default 64 KiB: the largest
                                               * frame of a connection that has not sent a
                                               * known token yet */
    struct config_secret cluster_secret; /* optional; must differ from every token */
    /* rpc.insecure_cluster_secret: lets followers send the cluster secret without tls.rpc,
     * allowed only when this node's RPC address and every bootstrap member's are loopback
     * addresses (config_sections.c); a follower still never sends it in clear to a leader
     * whose address is not one (proxy_record.c). Default false. */
    bool insecure_cluster_secret;
};

struct config_batch {
    uint32_t max_commands; /* commands per log entry, 1..65535, default 256 */
    uint32_t delay_us;     /* group commit (cluster.h: batch_delay_us), 0..100000, default 2000 */
    uint32_t max_bytes;    /* bytes per log entry, 1024..64 MiB, default 1 MiB */
    uint32_t max_pending_mb; /* commands proposed on the leader and not yet applied, together:
                              * 1..65536 MiB and at least twice max_bytes, default 64 */
    uint32_t tenant_max_pending_percent; /* one tenant's part of max_pending_mb at most (but
                                          * one command, always), 1..100, default 50 */
    uint32_t tenant_max_inflight_kb;     /* one tenant's commands in raft (proposed, not yet
                                          * applied) at most; the next wait on the leader
                                          * (cluster.h: max_account_inflight_bytes); 0: no bound,
                                          * 0..1048576, default 2048 */
};

struct config_http {
    uint32_t max_connections; /* open connections of the gateway and proxy listeners together,
                               * 1..1048576, default 1024 */
    uint32_t handshake_timeout_ms; /* 100..600000, default 5000: a TLS listener's handshake
                                    * (tls.http, tls.proxy) must end this soon after accept */
    uint32_t max_connections_per_address; /* of max_connections, from one IPv4 address or one
                                           * IPv6 /64; 0..1048576 (0: no cap), default 256 */
    bool metrics_public;           /* /metrics without the admin token; default false */
};

struct config_expiry {
    uint32_t interval_ms; /* 1..3600000, default 1000 */
    uint32_t batch;       /* records per expire entry, 1..65536, default 1024 */
};

/* log: what the node writes to stderr (server/log.h). The level can change on a reload. */
struct config_log {
    enum log_level level;   /* debug, info (the default), warn or error */
    enum log_format format; /* text (the default) or json: one object a line */
};

/* Client certificates on the HTTP listeners served over TLS (tls.http_client_certs). */
enum config_client_certs {
    CONFIG_CLIENT_CERTS_OFF = 0,  /* none asked for (the default) */
    CONFIG_CLIENT_CERTS_OPTIONAL, /* asked for; one given must be signed by ca_file */
    CONFIG_CLIENT_CERTS_REQUIRE,  /* a client without one signed by ca_file is refused */
};

/* TLS files and the listeners that use them: one certificate and key for every listener.
 * cert_file and key_file go together; ca_file is optional: when set, the RPC listener asks
 * every client for a certificate signed by it (and a TLS client verifies the server's
 * against it); the HTTP listeners ask for one as http_client_certs says; the Raft transport (raft) always
 * needs one. `enabled` says the files are there; each kind of listener has its own switch. */
struct config_tls {
    bool enabled;    /* cert_file and key_file are set */
    char *cert_file; /* owned; NULL when TLS is off */
    char *key_file;  /* owned; NULL when TLS is off */
    char *ca_file;   /* owned; NULL when not given */
    bool rpc;        /* serve the binary RPC over TLS; default false (plain TCP) */
    bool http;       /* serve node.http_address (JSON API, probes, metrics) over TLS */
    bool proxy;      /* serve every proxy listener over TLS */
    enum config_client_certs http_client_certs; /* for http and proxy; needs ca_file */
    char *at; /* owned: "FILE:LINE:COLUMN" of the tls section, to place the errors of loading
               * its files at startup; NULL without one */
    bool raft;       /* Raft between the members over mutual TLS (needs ca_file too); default
                      * false */
};

enum config_lease_policy {
    CONFIG_LEASE_CONFLICT = 0, /* an expired lease answers lease_expired (docs/contract.md) */
    CONFIG_LEASE_TAKEOVER,     /* an expired lease is taken over by the next claim */
};

struct config_tenant {
    char name[CONFIG_TENANT_NAME_MAX + 1];    /* 1..128 bytes of [A-Za-z0-9._-], unique */
    uint8_t (*token_hashes)[CONFIG_HASH_LEN]; /* owned array of n_token_hashes, >= 1 */
    size_t n_token_hashes;
    uint64_t max_records;                  /* default 10 M; 0 = unlimited */
    uint64_t max_bytes;                    /* default 4 GiB; 0 = unlimited */
    uint32_t key_max_len;                  /* 1..255, default 255 */
    uint64_t lease_ms;                     /* default lease, 1..86400000, default 30000 */
    uint64_t ttl_ms;                       /* default ttl, 1..365 days, default 24 h */
    uint64_t tombstone_ttl_ms;             /* effective value: 0 in the file is stored as ttl_ms */
    enum config_lease_policy lease_policy; /* default conflict */
    uint32_t mismatch_status;              /* idempotency_key_reused: 409 (default) or 422 */
};

/* Methods a proxy route may list (bits of config_proxy_route.methods). */
enum config_method {
    CONFIG_M_GET = 1u << 0,
    CONFIG_M_HEAD = 1u << 1,
    CONFIG_M_POST = 1u << 2,
    CONFIG_M_PUT = 1u << 3,
    CONFIG_M_PATCH = 1u << 4,
    CONFIG_M_DELETE = 1u << 5,
    CONFIG_M_OPTIONS = 1u << 6,
};

/* The bit of a method name (exact, upper case), or 0 when it is not one of the above. */
unsigned config_method_bit(const char *m, size_t len);

/* What a proxy route does with a method it does not list (other_methods). */
enum config_other_methods {
    CONFIG_OTHER_PASS_SAFE = 0, /* pass_safe (default): GET, HEAD, OPTIONS pass, others 405 */
    CONFIG_OTHER_PASS,          /* pass: every other method passes through unchecked */
    CONFIG_OTHER_REFUSE,        /* refuse: every other method 405 */
};

/* One route of a proxy listener: requests whose method is in `methods` and whose normalised
 * path is under `path_prefix` (at a '/' boundary, server/proxy_rules.h) go through the
 * idempotency protocol on behalf of `tenant`; other methods under the prefix pass through
 * to the upstream unchecked or are refused (`other_methods`). */
struct config_proxy_route {
    unsigned methods;             /* CONFIG_M_* bits, default POST|PUT|PATCH|DELETE */
    char *path_prefix;            /* owned, normalised, starts with '/', default "/" */
    char *upstream;               /* owned, as written, e.g. "http://127.0.0.1:9999" */
    char upstream_host[16];       /* IPv4 literal ("localhost" is stored as 127.0.0.1) */
    uint16_t upstream_port;       /* default 80 */
    char *upstream_hostport;      /* owned, the Host header sent upstream, e.g. "127.0.0.1:9999" */
    size_t tenant;                /* index into config.tenants */
    uint64_t lease_ms;            /* 0: the tenant's default */
    uint64_t ttl_ms;              /* 0: the tenant's default */
    bool lease_policy_set;        /* false: the tenant's policy */
    enum config_lease_policy lease_policy;
    uint32_t mismatch_status;     /* 409 or 422, default the tenant's mismatch_status */
    uint32_t in_progress_status;  /* 409 or 425, default 409 */
    char **fingerprint_headers;   /* owned, lower-cased names; n_fingerprint_headers */
    size_t n_fingerprint_headers;
    char **fingerprint_fields;    /* owned JSON Pointers (fp_pointer_check), <= 32; none: [] */
    size_t n_fingerprint_fields;
    char **fingerprint_ignore;    /* owned JSON Pointers, never "", <= 32; none: [] */
    size_t n_fingerprint_ignore;
    bool store_4xx;               /* default false: 4xx answers are released */
    bool on_timeout_unknown;      /* on_timeout: unknown (default, true) or release */
    uint32_t upstream_timeout_ms; /* 1..3600000, default 10000 */
    char **response_headers;      /* owned, lower-cased names; default ["content-type"] */
    size_t n_response_headers;
    uint64_t max_inline_body;     /* bytes, 0..64 MiB, default 1 MiB */
    bool key_required;            /* default true */
    /* default CONFIG_OTHER_PASS_SAFE */
    enum config_other_methods other_methods;
    bool method_override_refuse; /* method_override: refuse (true) or strip (default) */
    bool caller_none;            /* caller_identity: none: callers share the records */
    char **caller_headers;       /* owned, lower-cased; default authorization, cookie */
    size_t n_caller_headers;     /* 0 when caller_none */
    bool replay_set_cookie;      /* default false: Set-Cookie never stored nor replayed */
};

/* One proxy listener. */
struct config_proxy {
    struct config_addr address;
    struct config_proxy_route *routes; /* owned array of n_routes, >= 1 */
    size_t n_routes;
};

/* Everything one node's configuration file holds. Zero-initialise it (or let a failed load
 * leave it zeroed) and release it with config_free(). */
struct tenant_slot; /* config_internal.h */

struct config {
    struct config_node node;
    struct config_cluster cluster;
    struct config_raft raft;
    struct config_rpc rpc;
    struct config_batch batch;
    struct config_http http;
    struct config_expiry expiry;
    struct config_tls tls;
    struct config_log log;
    uint8_t admin_token_sha256[CONFIG_HASH_LEN];
    struct config_tenant *tenants; /* owned array of n_tenants, >= 1 */
    size_t n_tenants;
    /* The tenants' token hashes by their XXH3, open addressing (config_tenants.c builds it
     * as it reads the list; config_tenant_by_token_hash() reads it); owned, token_mask + 1
     * slots, at most half full. NULL: no tenants list read (the list is required, so only
     * while a config is parsed or after a failed parse). */
    struct tenant_slot *token_slots;
    size_t token_mask;
    /* The tenants' names by their XXH3, likewise (config_tenant_by_name() reads it); owned,
     * name_mask + 1 slots, at most half full; NULL as token_slots is. */
    struct tenant_slot *name_slots;
    size_t name_mask;
    struct config_proxy *proxies; /* owned array of n_proxies; NULL when there is none */
    size_t n_proxies;
};

/* Reads and validates the file at path. Returns 0 and fills *out, or -1 with a
 * NUL-terminated message in err (truncated to errlen bytes) and *out zeroed.
 * path is borrowed for the duration of the call and is the FILE of every message; out is
 * the caller's (OUT), which then owns what it points to and frees it with config_free();
 * err is the caller's buffer of errlen bytes (OUT) and may be NULL when errlen is 0.
 * An unreadable file gives "FILE: cannot read: <strerror>". */
int config_load(const char *path, struct config *out, char *err, size_t errlen);

/* The same for a configuration held in memory: text is len bytes (no NUL needed).
 * name and text are borrowed for the duration of the call; name is the FILE of every
 * message; out and err are as for config_load(). */
int config_parse(const char *name, const char *text, size_t len, struct config *out, char *err,
                 size_t errlen);

/* The longest lease and ttl a tenant's defaults, a proxy route or a request may set. */
#define CONFIG_LEASE_MAX_MS UINT64_C(86400000)           /* 24 h */
#define CONFIG_TTL_MAX_MS (UINT64_C(365) * 86400000)     /* 365 days */
/* A tenant's quotas when its configuration names none: bounded, so that one tenant (a
 * proxied service's callers, say) cannot fill a node's memory; 0 configured = unlimited. */
#define CONFIG_DEFAULT_MAX_RECORDS UINT64_C(10000000)
#define CONFIG_DEFAULT_MAX_BYTES (UINT64_C(4) << 30)

/* File descriptors a node keeps for itself besides its client connections: Raft's peer
 * connections, log segments, snapshots, the loop's own. */
#define CONFIG_FD_RESERVE 256

/* Fits the connection caps to a file descriptor limit: the RPC connections, the HTTP ones
 * and, with proxy routes, one upstream connection per HTTP one, plus CONFIG_FD_RESERVE,
 * must fit in `limit`. Sets *rpc and *http (OUT) to the caps to use: the configured ones
 * when they fit, else both lowered in proportion (at least 1 each). Returns true when it
 * lowered them. */
bool config_fd_budget(const struct config *c, uint64_t limit, uint32_t *rpc, uint32_t *http);

/* Frees what c owns and zeroes it, so that freeing twice is safe. c is the caller's
 * struct, borrowed; the struct itself is not freed. Accepts NULL. */
void config_free(struct config *c);

/* The tenant named name, or NULL. Found through c->name_slots: one lookup, however many
 * tenants there are (a request made on behalf of a tenant names it). */
const struct config_tenant *config_tenant_by_name(const struct config *c, const char *name);

/* The tenant one of whose token hashes equals hash, or NULL. Found through c->token_slots
 * (the XXH3 of hash, then the hashes of its slots compared with OpenSSL's CRYPTO_memcmp),
 * so a lookup costs the same with 2 tenants or 60,000: each request with a token no tenant
 * has (any unauthenticated client can send them) costs one lookup. What the time may tell
 * is whether another hash shares the XXH3 bits of a slot with the SHA-256 of the caller's
 * own token, nothing about any tenant's token. NULL while no tenants list was read.
 * c and hash are borrowed for the duration of the call; the result borrows c's memory and
 * is valid until config_free(c). */
const struct config_tenant *config_tenant_by_token_hash(const struct config *c,
                                                        const uint8_t hash[CONFIG_HASH_LEN]);

/* Whether hash equals the cluster secret's hash, compared in constant time
 * (CRYPTO_memcmp); false when no secret is configured. */
bool config_is_cluster_secret_hash(const struct config *c, const uint8_t hash[CONFIG_HASH_LEN]);

/* Whether hash equals the admin token hash, compared in constant time (CRYPTO_memcmp).
 * c and hash are borrowed for the duration of the call. */
bool config_is_admin_hash(const struct config *c, const uint8_t hash[CONFIG_HASH_LEN]);

#endif /* IDEM_SERVER_CONFIG_H */
