/* Unit tests of the node configuration loader (server/config*.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "config.h"

/* Token hashes of the test configurations. The admin's is upper-case hex on purpose. */
#define HASH_ADMIN "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF"
#define HASH_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HASH_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define HASH_C "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
#define HASH_63 "ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
#define HASH_NONHEX "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeg"

/* The repository root, from this file's path (absolute under CMake, relative to the root
 * when compiled by hand from there). */
#define THIS_FILE_IN_REPO "tests/unit/test_config.c"
#define EXAMPLE_IN_REPO "tools/idemd.example.yaml"

/* Lines 1-5: a valid node section. */
#define NODE_OK                                                                                    \
    "node:\n"                                                                                      \
    "  id: 1\n"                                                                                    \
    "  raft_address: 127.0.0.1:9001\n"                                                             \
    "  rpc_address: 127.0.0.1:7001\n"                                                              \
    "  data_dir: /tmp/idem\n"

/* Two lines: a valid admin section. */
#define ADMIN_OK                                                                                   \
    "admin:\n"                                                                                     \
    "  token_sha256: " HASH_ADMIN "\n"

/* Three lines: a valid tenants section. */
#define TENANTS_OK                                                                                 \
    "tenants:\n"                                                                                   \
    "  - name: demo\n"                                                                             \
    "    token_sha256: " HASH_A "\n"

#define MINIMAL NODE_OK ADMIN_OK TENANTS_OK

/* Parses a C string literal as "x.yaml". */
static int parseStr(const char *text, struct config *out, char *err, size_t errlen)
{
    return config_parse("x.yaml", text, strlen(text), out, err, errlen);
}

static void parseOk(const char *text, struct config *out)
{
    char err[512];
    if (parseStr(text, out, err, sizeof err) != 0) {
        fail_msg("config_parse failed: %s", err);
    }
}

static void hashOf(const char *token, uint8_t out[CONFIG_HASH_LEN])
{
    unsigned int n = 0;
    assert_int_equal(EVP_Digest(token, strlen(token), out, &n, EVP_sha256(), NULL), 1);
    assert_int_equal(n, CONFIG_HASH_LEN);
}

static void hexOf(const uint8_t h[CONFIG_HASH_LEN], char out[2 * CONFIG_HASH_LEN + 1])
{
    for (size_t i = 0; i < CONFIG_HASH_LEN; i++) {
        snprintf(out + 2 * i, 3, "%02x", h[i]);
    }
}

static void assertAddr(const struct config_addr *a, const char *text, const char *host,
                       uint16_t port)
{
    assert_string_equal(a->text, text);
    assert_string_equal(a->host, host);
    assert_int_equal(a->port, port);
}

static void assertAddrUnset(const struct config_addr *a)
{
    assertAddr(a, "", "", 0);
}

static void assertHashFilled(const uint8_t h[CONFIG_HASH_LEN], uint8_t byte)
{
    for (size_t i = 0; i < CONFIG_HASH_LEN; i++) {
        assert_int_equal(h[i], byte);
    }
}

/* ---- a full configuration: every field set to something other than its default -------- */

/* clang-format off */
static const char full_text[] =
    "# every field, none at its default\n"
    "node:\n"
    "  id: 9223372036854775807\n"
    "  raft_address: 10.0.0.1:9001\n"
    "  rpc_address: 10.0.0.1:7001\n"
    "  http_address: 10.0.0.1:8001\n"
    "  data_dir: /var/lib/idem/node1\n"
    "cluster:\n"
    "  bootstrap:\n"
    "    - {id: 9223372036854775807, raft_address: 10.0.0.1:9001,\n"
    "       rpc_address: 10.0.0.1:7001, http_address: 10.0.0.1:8001}\n"
    "    - id: 2\n"
    "      raft_address: 10.0.0.2:9001\n"
    "      rpc_address: 10.0.0.2:7001\n"
    "raft:\n"
    "  election_timeout_ms: 1000\n"
    "  heartbeat_timeout_ms: 150\n"
    "  snapshot_threshold: 100000\n"
    "  snapshot_trailing: 1\n"
    "  snapshot_log_percent: 0\n"
    "  snapshot_log_max_mb: 1024\n"
    "  segment_size_mb: 8\n"
    "  pre_vote: no\n"
    "  snapshot_nice: 0\n"
    "  prefill_segments: false\n"
    "  stuck_write_step_down_ms: 0\n"
    "rpc:\n"
    "  max_frame_bytes: 1048576\n"
    "  default_deadline_ms: 500\n"
    "  max_deadline_ms: 30000\n"
    "  max_connections: 10\n"
    "batch:\n"
    "  max_commands: 64\n"
    "  max_bytes: 65536\n"
    "  max_pending_mb: 8\n"
    "  tenant_max_pending_percent: 25\n"
    "  tenant_max_inflight_kb: 0\n"
    "expiry:\n"
    "  interval_ms: 250\n"
    "  batch: 32\n"
    "http:\n"
    "  max_connections: 77\n"
    "  handshake_timeout_ms: 250\n"
    "tls:\n"
    "  cert_file: /etc/idem/node.crt\n"
    "  key_file: '/etc/idem/node.key'\n"
    "  ca_file: \"/etc/idem/ca.crt\"\n"
    "  rpc: true\n"
    "  http: yes\n"
    "  http_client_certs: require\n"
    "  raft: true\n"
    "admin:\n"
    "  token_sha256: " HASH_ADMIN "\n"
    "tenants:\n"
    "  - name: alpha\n"
    "    token_sha256: " HASH_A "\n"
    "    max_records: 1000\n"
    "    max_bytes: 18446744073709551615\n"
    "    key_max_len: 64\n"
    "    lease_ms: 5000\n"
    "    ttl_ms: 31536000000\n"
    "    tombstone_ttl_ms: 60000\n"
    "    lease_policy: takeover\n"
    "  - name: Beta_2.x-y\n"
    "    token_sha256: [" HASH_B ", " HASH_C "]\n"
    "    lease_policy: conflict\n";
/* clang-format on */

static void test_full(void **state)
{
    (void)state;
    struct config c;
    parseOk(full_text, &c);

    assert_true(c.node.id == (uint64_t)INT64_MAX);
    assertAddr(&c.node.raft_address, "10.0.0.1:9001", "10.0.0.1", 9001);
    assertAddr(&c.node.rpc_address, "10.0.0.1:7001", "10.0.0.1", 7001);
    assertAddr(&c.node.http_address, "10.0.0.1:8001", "10.0.0.1", 8001);
    assert_string_equal(c.node.data_dir, "/var/lib/idem/node1");

    assert_int_equal(c.cluster.n_bootstrap, 2);
    assert_true(c.cluster.bootstrap[0].id == (uint64_t)INT64_MAX);
    assertAddr(&c.cluster.bootstrap[0].raft_address, "10.0.0.1:9001", "10.0.0.1", 9001);
    assertAddr(&c.cluster.bootstrap[0].rpc_address, "10.0.0.1:7001", "10.0.0.1", 7001);
    assertAddr(&c.cluster.bootstrap[0].http_address, "10.0.0.1:8001", "10.0.0.1", 8001);
    assert_int_equal(c.cluster.bootstrap[1].id, 2);
    assertAddr(&c.cluster.bootstrap[1].raft_address, "10.0.0.2:9001", "10.0.0.2", 9001);
    assertAddr(&c.cluster.bootstrap[1].rpc_address, "10.0.0.2:7001", "10.0.0.2", 7001);
    assertAddrUnset(&c.cluster.bootstrap[1].http_address);

    assert_int_equal(c.raft.election_timeout_ms, 1000);
    assert_int_equal(c.raft.heartbeat_timeout_ms, 150);
    assert_int_equal(c.raft.snapshot_threshold, 100000);
    assert_int_equal(c.raft.snapshot_trailing, 1);
    assert_int_equal(c.raft.snapshot_log_percent, 0);
    assert_int_equal(c.raft.snapshot_log_max_mb, 1024);
    assert_int_equal(c.raft.segment_size_mb, 8);
    assert_false(c.raft.pre_vote);
    assert_int_equal(c.raft.snapshot_nice, 0);
    assert_false(c.raft.prefill_segments);
    assert_int_equal(c.raft.stuck_write_step_down_ms, 0);

    assert_int_equal(c.rpc.max_frame_bytes, 1048576);
    assert_int_equal(c.rpc.default_deadline_ms, 500);
    assert_int_equal(c.rpc.max_deadline_ms, 30000);
    assert_int_equal(c.rpc.max_connections, 10);

    assert_int_equal(c.batch.max_commands, 64);
    assert_int_equal(c.batch.max_bytes, 65536);
    assert_int_equal(c.batch.max_pending_mb, 8);
    assert_int_equal(c.batch.tenant_max_pending_percent, 25);
    assert_int_equal(c.batch.tenant_max_inflight_kb, 0);

    assert_int_equal(c.expiry.interval_ms, 250);
    assert_int_equal(c.expiry.batch, 32);

    assert_true(c.tls.enabled);
    assert_string_equal(c.tls.cert_file, "/etc/idem/node.crt");
    assert_string_equal(c.tls.key_file, "/etc/idem/node.key");
    assert_string_equal(c.tls.ca_file, "/etc/idem/ca.crt");
    assert_true(c.tls.rpc);
    assert_true(c.tls.http);
    assert_false(c.tls.proxy);
    assert_int_equal(c.tls.http_client_certs, CONFIG_CLIENT_CERTS_REQUIRE);
    assert_string_equal(c.tls.at, "x.yaml:45:3"); /* the mapping, at its first key */
    assert_int_equal(c.http.max_connections, 77);
    assert_int_equal(c.http.handshake_timeout_ms, 250);
    assert_true(c.tls.raft);

    static const uint8_t admin[CONFIG_HASH_LEN] = {
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45,
        0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
        0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
    };
    assert_memory_equal(c.admin_token_sha256, admin, CONFIG_HASH_LEN);
    assert_true(config_is_admin_hash(&c, admin));

    assert_int_equal(c.n_tenants, 2);
    const struct config_tenant *a = &c.tenants[0];
    assert_string_equal(a->name, "alpha");
    assert_int_equal(a->n_token_hashes, 1);
    assertHashFilled(a->token_hashes[0], 0xaa);
    assert_int_equal(a->max_records, 1000);
    assert_true(a->max_bytes == UINT64_MAX);
    assert_int_equal(a->key_max_len, 64);
    assert_int_equal(a->lease_ms, 5000);
    assert_int_equal(a->ttl_ms, UINT64_C(31536000000));
    assert_int_equal(a->tombstone_ttl_ms, 60000);
    assert_int_equal(a->lease_policy, CONFIG_LEASE_TAKEOVER);

    const struct config_tenant *b = &c.tenants[1];
    assert_string_equal(b->name, "Beta_2.x-y");
    assert_int_equal(b->n_token_hashes, 2);
    assertHashFilled(b->token_hashes[0], 0xbb);
    assertHashFilled(b->token_hashes[1], 0xcc);
    assert_int_equal(b->lease_policy, CONFIG_LEASE_CONFLICT);

    config_free(&c);
    config_free(&c); /* zeroed: a second call is harmless */
}

/* ---- defaults ------------------------------------------------------------------------------ */

static void test_defaults(void **state)
{
    (void)state;
    struct config c;
    parseOk(MINIMAL, &c);

    assert_int_equal(c.node.id, 1);
    assertAddr(&c.node.raft_address, "127.0.0.1:9001", "127.0.0.1", 9001);
    assertAddr(&c.node.rpc_address, "127.0.0.1:7001", "127.0.0.1", 7001);
    assertAddrUnset(&c.node.http_address);
    assert_string_equal(c.node.data_dir, "/tmp/idem");
    assert_int_equal(c.cluster.n_bootstrap, 0);
    assert_null(c.cluster.bootstrap);

    assert_int_equal(c.raft.election_timeout_ms, 300);
    assert_int_equal(c.raft.heartbeat_timeout_ms, 50);
    assert_int_equal(c.raft.snapshot_threshold, 8192);
    assert_int_equal(c.raft.snapshot_trailing, 2048);
    assert_int_equal(c.raft.snapshot_log_percent, 100);
    assert_int_equal(c.raft.snapshot_log_max_mb, 256);
    assert_int_equal(c.raft.segment_size_mb, 64);
    assert_true(c.raft.pre_vote);
    assert_int_equal(c.raft.snapshot_nice, 19);
    assert_true(c.raft.prefill_segments);
    assert_int_equal(c.raft.stuck_write_step_down_ms, 5000);
    assert_int_equal(c.rpc.max_frame_bytes, 4 * 1024 * 1024 + 128 * 1024);
    assert_int_equal(c.rpc.default_deadline_ms, 2000);
    assert_int_equal(c.http.max_connections, 1024);
    assert_int_equal(c.rpc.max_deadline_ms, 60000);
    assert_int_equal(c.rpc.max_connections, 1024);
    assert_int_equal(c.rpc.idle_timeout_ms, 300000);
    assert_int_equal(c.rpc.handshake_timeout_ms, 5000);
    assert_int_equal(c.rpc.first_frame_timeout_ms, 5000);
    assert_int_equal(c.rpc.max_connections_per_address, 256);
    assert_int_equal(c.rpc.member_connections, 32);
    assert_int_equal(c.rpc.unauthenticated_max_frame_bytes, 65536);
    assert_int_equal(c.rpc.max_frame_buffer_mb, 256);
    assert_int_equal(c.rpc.max_answer_buffer_mb, 1024);
    assert_int_equal(c.batch.max_commands, 256);
    assert_int_equal(c.batch.max_bytes, 1024 * 1024);
    assert_int_equal(c.batch.max_pending_mb, 64);
    assert_int_equal(c.batch.tenant_max_pending_percent, 50);
    assert_int_equal(c.batch.tenant_max_inflight_kb, 2048);
    assert_int_equal(c.raft.snapshot_trailing_max_mb, 256);
    assert_int_equal(c.expiry.interval_ms, 1000);
    assert_int_equal(c.expiry.batch, 1024);
    assert_false(c.tls.enabled);
    assert_null(c.tls.cert_file);
    assert_null(c.tls.key_file);
    assert_null(c.tls.ca_file);
    assert_false(c.tls.rpc);
    assert_false(c.tls.http);
    assert_false(c.tls.proxy);
    assert_int_equal(c.tls.http_client_certs, CONFIG_CLIENT_CERTS_OFF);
    assert_null(c.tls.at);
    assert_int_equal(c.http.handshake_timeout_ms, 5000);
    assert_false(c.rpc.insecure_cluster_secret);
    assert_false(c.tls.raft);

    assert_int_equal(c.n_tenants, 1);
    const struct config_tenant *t = &c.tenants[0];
    assert_string_equal(t->name, "demo");
    assert_int_equal(t->n_token_hashes, 1);
    assertHashFilled(t->token_hashes[0], 0xaa);
    assert_int_equal(t->max_records, 10000000); /* bounded by default */
    assert_int_equal(t->max_bytes, UINT64_C(4) << 30);
    assert_int_equal(t->key_max_len, 255);
    assert_int_equal(t->lease_ms, 30000);
    assert_int_equal(t->ttl_ms, 86400000);
    assert_int_equal(t->tombstone_ttl_ms, 86400000); /* 0 = as long as the ttl */
    assert_int_equal(t->lease_policy, CONFIG_LEASE_CONFLICT);
    assert_int_equal(t->mismatch_status, 409);
    config_free(&c);
}

/* Empty values, "~" and null count as absent; empty sections too; yes/True are booleans. */
static void test_empty_values_are_defaults(void **state)
{
    (void)state;
    struct config c;
    parseOk(NODE_OK "  http_address: \"\"\n"
                    "cluster:\n"
                    "  bootstrap: []\n"
                    "raft:\n"
                    "  election_timeout_ms: ~\n"
                    "  heartbeat_timeout_ms:\n"
                    "  pre_vote: True\n"
                    "rpc: {}\n"
                    "batch:\n"
                    "expiry: null\n"
                    "tls:\n"
                    "  cert_file: ''\n" ADMIN_OK TENANTS_OK "    tombstone_ttl_ms: 0\n"
                    "    ttl_ms: 1000\n",
            &c);
    assertAddrUnset(&c.node.http_address);
    assert_int_equal(c.cluster.n_bootstrap, 0);
    assert_int_equal(c.raft.election_timeout_ms, 300);
    assert_int_equal(c.raft.heartbeat_timeout_ms, 50);
    assert_true(c.raft.pre_vote);
    assert_int_equal(c.rpc.max_connections, 1024);
    assert_false(c.tls.enabled);
    assert_int_equal(c.tenants[0].ttl_ms, 1000);
    assert_int_equal(c.tenants[0].tombstone_ttl_ms, 1000);
    config_free(&c);
}

/* ---- address forms -------------------------------------------------------------------------- */

static void assertParsed(const char *in, const char *text, const char *host, uint16_t port,
                         int family)
{
    struct config_addr a;
    char why[256];
    if (config_addr_parse(in, &a, why, sizeof why) != 0) {
        fail_msg("%s: %s", in, why);
    }
    assertAddr(&a, text, host, port);
    assert_int_equal(a.family, family);
    assert_int_equal(config_addr_is_name(&a), family == AF_UNSPEC);
}

/* Names (in lower case), IPv6 addresses in brackets (in RFC 5952's form), IPv4 as before:
 * each endpoint has one text. */
static void test_address_forms(void **state)
{
    (void)state;
    assertParsed("127.0.0.1:9001", "127.0.0.1:9001", "127.0.0.1", 9001, AF_INET);
    assertParsed("0.0.0.0:1", "0.0.0.0:1", "0.0.0.0", 1, AF_INET);
    assertParsed("localhost:7001", "localhost:7001", "localhost", 7001, AF_UNSPEC);
    assertParsed("Node-1.Example.COM:65535", "node-1.example.com:65535", "node-1.example.com",
                 65535, AF_UNSPEC);
    assertParsed("idem_1.svc.cluster.local.:9001", "idem_1.svc.cluster.local.:9001",
                 "idem_1.svc.cluster.local.", 9001, AF_UNSPEC);
    assertParsed("1a:80", "1a:80", "1a", 80, AF_UNSPEC);
    assertParsed("[::1]:9001", "[::1]:9001", "::1", 9001, AF_INET6);
    assertParsed("[0:0:0:0:0:0:0:1]:9001", "[::1]:9001", "::1", 9001, AF_INET6);
    assertParsed("[2001:DB8:0:0:1:0:0:1]:80", "[2001:db8::1:0:0:1]:80", "2001:db8::1:0:0:1", 80,
                 AF_INET6);
    assertParsed("[::]:9001", "[::]:9001", "::", 9001, AF_INET6);
    /* An IPv4-mapped IPv6 address is the IPv4 address. */
    assertParsed("[::ffff:127.0.0.1]:9001", "127.0.0.1:9001", "127.0.0.1", 9001, AF_INET);
    assertParsed("[::FFFF:7f00:2]:9001", "127.0.0.2:9001", "127.0.0.2", 9001, AF_INET);
    /* The longest name: 253 bytes in labels of 63. */
    char longName[300];
    snprintf(longName, sizeof longName, "%.63s.%.63s.%.63s.%.61s:1", HASH_A HASH_A, HASH_B HASH_B,
             HASH_C HASH_C, HASH_A HASH_A);
    struct config_addr a;
    char why[256];
    assert_int_equal(config_addr_parse(longName, &a, why, sizeof why), 0);
    assert_int_equal(strlen(a.host), 253);
    snprintf(longName, sizeof longName, "%.63s.%.63s.%.63s.%.62s:1", HASH_A HASH_A, HASH_B HASH_B,
             HASH_C HASH_C, HASH_A HASH_A);
    assert_int_equal(config_addr_parse(longName, &a, why, sizeof why), -1);
    assert_non_null(strstr(why, "longer than 253 bytes"));

    /* A node addressed by names and IPv6, its listeners on wildcards; the listen addresses
     * default to the advertised ones. */
    struct config c;
    parseOk("node:\n"
            "  id: 2\n"
            "  raft_address: Node2.Example:9001\n"
            "  rpc_address: '[::1]:7001'\n"
            "  http_address: node2.example:8001\n"
            "  raft_listen: 0.0.0.0:9001\n"
            "  rpc_listen: '[::]:7001'\n"
            "  data_dir: /tmp/idem\n"
            "cluster:\n"
            "  bootstrap:\n"
            "    - {id: 1, raft_address: node1.example:9001, rpc_address: '[::2]:7001'}\n"
            "    - {id: 2, raft_address: node2.example:9001, rpc_address: '[::1]:7001'}\n"
            "proxy:\n"
            "  - address: '[::1]:8101'\n"
            "    routes: [{upstream: 'http://127.0.0.1:9', tenant: demo}]\n"
            "  - address: localhost:8102\n"
            "    routes: [{upstream: 'http://127.0.0.1:9', tenant: demo}]\n" ADMIN_OK TENANTS_OK,
            &c);
    assertAddr(&c.node.raft_address, "node2.example:9001", "node2.example", 9001);
    assertAddr(&c.node.rpc_address, "[::1]:7001", "::1", 7001);
    assertAddr(&c.node.raft_listen, "0.0.0.0:9001", "0.0.0.0", 9001);
    assertAddr(&c.node.rpc_listen, "[::]:7001", "::", 7001);
    assertAddr(&c.node.http_listen, "node2.example:8001", "node2.example", 8001);
    assertAddr(&c.cluster.bootstrap[0].raft_address, "node1.example:9001", "node1.example", 9001);
    assertAddr(&c.cluster.bootstrap[0].rpc_address, "[::2]:7001", "::2", 7001);
    assertAddr(&c.proxies[0].address, "[::1]:8101", "::1", 8101);
    assertAddr(&c.proxies[1].address, "localhost:8102", "localhost", 8102);
    config_free(&c);
    parseOk(MINIMAL, &c);
    assertAddr(&c.node.raft_listen, "127.0.0.1:9001", "127.0.0.1", 9001);
    assertAddr(&c.node.rpc_listen, "127.0.0.1:7001", "127.0.0.1", 7001);
    assertAddrUnset(&c.node.http_listen);
    config_free(&c);

    /* One endpoint, two spellings: still one Raft address. */
    char err[512];
    static const char dup[] =
        NODE_OK "cluster:\n  bootstrap:\n"
                "    - {id: 1, raft_address: '[::1]:9001', rpc_address: 127.0.0.1:7001}\n"
                "    - {id: 2, raft_address: '[0::1]:9001', rpc_address: 127.0.0.1:7002}\n" ADMIN_OK
                    TENANTS_OK;
    assert_int_equal(parseStr(dup, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "x.yaml:9:29: cluster.bootstrap[1].raft_address: duplicate Raft"));
    static const char dupName[] = NODE_OK
        "cluster:\n  bootstrap:\n"
        "    - {id: 1, raft_address: n1.example:9001, rpc_address: 127.0.0.1:7001}\n"
        "    - {id: 2, raft_address: N1.EXAMPLE:9001, rpc_address: 127.0.0.1:7002}\n" ADMIN_OK
            TENANTS_OK;
    assert_int_equal(parseStr(dupName, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "duplicate Raft address"));
    /* A name with its final dot is the same name (and a bad case below). */
    struct config_addr dotted, plain;
    char why2[256];
    assert_int_equal(config_addr_parse("N2.Example.:9002", &dotted, why2, sizeof why2), 0);
    assert_int_equal(config_addr_parse("n2.example:9002", &plain, why2, sizeof why2), 0);
    assert_true(config_addr_same(&dotted, &plain));
    assert_int_equal(config_addr_parse("n2.example:9003", &plain, why2, sizeof why2), 0);
    assert_false(config_addr_same(&dotted, &plain));
}

/* ---- bad inputs ---------------------------------------------------------------------------- */

struct bad_case {
    const char *name;
    const char *text;
    const char *prefix; /* the exact "x.yaml:LINE:COL: " the message starts with */
    const char *substr; /* a part of the rest of the message */
};

static const struct bad_case bad_cases[] = {
    /* YAML itself. */
    {"syntax error", "node:\n  id: 1\n  raft_address: a: b\n",
     "x.yaml:3:18: ", "mapping values are not allowed"},
    {"unclosed flow sequence", NODE_OK "tenants: [1, 2\n",
     "x.yaml:7:1: ", "did not find expected ',' or ']'"},
    {"invalid UTF-8", "node:\n  id: \xff\n", "x.yaml:2:7: ", "invalid leading UTF-8 octet"},
    {"empty file", "", "x.yaml:1:1: ", "holds no configuration"},
    {"only a comment", "# nothing\n", "x.yaml:1:1: ", "holds no configuration"},
    {"top level is a list", "- 1\n- 2\n",
     "x.yaml:1:1: ", "expected a mapping at the top level, got a list"},
    {"second document", MINIMAL "---\nnode: {}\n", "x.yaml:12:1: ", "second YAML document"},
    {"alias", NODE_OK "raft: &r\n  pre_vote: true\nrpc: *r\n",
     "x.yaml:6:7: ", "aliases are not supported"},
    {"duplicate key in node", "node:\n  id: 1\n  id: 2\n",
     "x.yaml:3:3: ", "duplicate key \"id\" in node (first at line 2)"},
    {"duplicate top-level key", NODE_OK "raft: {}\nraft: {}\n",
     "x.yaml:7:1: ", "duplicate key \"raft\" in the top level"},
    {"mapping as a key", NODE_OK "? {a: 1}\n: 2\n",
     "x.yaml:6:3: ", "a key in the top level is a mapping"},
    {"a tag on a value", NODE_OK "raft:\n  election_timeout_ms: !!str 300\n",
     "x.yaml:7:24: ", "a YAML tag (such as !!str)"},
    {"a tag on a mapping", NODE_OK "raft: !!map {pre_vote: true}\n",
     "x.yaml:6:7: ", "a YAML tag"},
    {"a local tag", NODE_OK "raft:\n  segment_size_mb: !mine 64\n", "x.yaml:7:20: ", "a YAML tag"},
    {"nested too deep", NODE_OK "raft: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]"
                                "]]]]]]]]]]]]]]]]\n",
     "x.yaml:6:38: ", "nested more than 32 levels deep"},

    /* Unknown keys. */
    {"unknown key at the top level", NODE_OK "nodee:\n  id: 1\n",
     "x.yaml:6:1: ", "unknown key \"nodee\" in the top level"},
    {"unknown key in raft", NODE_OK "raft:\n  pre_votes: true\n",
     "x.yaml:7:3: ", "unknown key \"pre_votes\" in raft"},
    {"unknown key in a tenant", NODE_OK ADMIN_OK TENANTS_OK "    ttl: 5\n",
     "x.yaml:11:5: ", "unknown key \"ttl\" in tenants[0]"},
    {"unknown key in a bootstrap member", NODE_OK "cluster:\n  bootstrap:\n    - {idd: 1}\n",
     "x.yaml:8:8: ", "unknown key \"idd\" in cluster.bootstrap[0]"},

    /* Types and numbers. */
    {"integer expected", "node:\n  id: abc\n",
     "x.yaml:2:7: ", "node.id: expected an integer, got \"abc\""},
    {"section is a scalar", NODE_OK "raft: 5\n",
     "x.yaml:6:7: ", "raft: expected a mapping, got a scalar"},
    {"string expected",
     "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n  data_dir: [a]\n",
     "x.yaml:5:13: ", "node.data_dir: expected a string, got a list"},
    {"integer is a list", NODE_OK "rpc:\n  max_connections: [1]\n",
     "x.yaml:7:20: ", "rpc.max_connections: expected an integer, got a list"},
    {"negative number", NODE_OK "raft:\n  election_timeout_ms: -5\n",
     "x.yaml:7:24: ", "raft.election_timeout_ms: must not be negative"},
    {"overflow of 64 bits", "node:\n  id: 99999999999999999999\n",
     "x.yaml:2:7: ", "node.id: \"99999999999999999999\" is out of range (1..9223372036854775807)"},
    {"id 2^63", "node:\n  id: 9223372036854775808\n", "x.yaml:2:7: ", "out of range"},
    {"id zero", "node:\n  id: 0\n", "x.yaml:2:7: ", "out of range"},
    {"trailing junk", "node:\n  id: 12abc\n", "x.yaml:2:7: ", "expected an integer"},
    {"hex integer", "node:\n  id: 0x10\n", "x.yaml:2:7: ", "expected an integer"},
    {"leading zeros", NODE_OK "raft:\n  election_timeout_ms: 0600\n",
     "x.yaml:7:24: ", "without leading zeros"},
    {"plus sign", "node:\n  id: +1\n", "x.yaml:2:7: ", "expected an integer"},
    {"quoted integer", "node:\n  id: \"1\"\n", "x.yaml:2:7: ", "quoted string"},
    {"idle timeout below the minimum", NODE_OK "rpc:\n  idle_timeout_ms: 99\n",
     "x.yaml:7:20: ", "rpc.idle_timeout_ms: \"99\" is out of range (100..86400000)"},
    {"handshake timeout above the maximum", NODE_OK "rpc:\n  handshake_timeout_ms: 600001\n",
     "x.yaml:7:25: ", "rpc.handshake_timeout_ms: \"600001\" is out of range (100..600000)"},
    {"first frame timeout below the minimum", NODE_OK "rpc:\n  first_frame_timeout_ms: 99\n",
     "x.yaml:7:27: ", "rpc.first_frame_timeout_ms: \"99\" is out of range (100..600000)"},
    {"unauthenticated frames below the minimum",
     NODE_OK "rpc:\n  unauthenticated_max_frame_bytes: 1023\n", "x.yaml:7:36: ",
     "rpc.unauthenticated_max_frame_bytes: \"1023\" is out of range (1024..67108864)"},
    {"answer budget of zero", NODE_OK "rpc:\n  max_answer_buffer_mb: 0\n",
     "x.yaml:7:25: ", "rpc.max_answer_buffer_mb: \"0\" is out of range (1..65536)"},
    {"below the minimum", NODE_OK "raft:\n  snapshot_threshold: 15\n",
     "x.yaml:7:23: ", "raft.snapshot_threshold: \"15\" is out of range (16..4294967295)"},
    /* raft_uv takes a snapshot put without trailing entries for an install: it would drop
     * the log entries after the snapshot that raft holds as stored (cluster/raft015/io_snap.c). */
    {"no trailing entries", NODE_OK "raft:\n  snapshot_trailing: 0\n",
     "x.yaml:7:22: ", "raft.snapshot_trailing: \"0\" is out of range (1..4294967295)"},
    {"snapshot log percent above the maximum", NODE_OK "raft:\n  snapshot_log_percent: 10001\n",
     "x.yaml:7:25: ", "raft.snapshot_log_percent: \"10001\" is out of range (0..10000)"},
    {"http connections zero", NODE_OK "http:\n  max_connections: 0\n",
     "x.yaml:7:20: ", "http.max_connections: \"0\" is out of range (1..1048576)"},
    {"unknown http key", NODE_OK "http:\n  max_conns: 5\n", "x.yaml:7:3: ", "max_conns"},
    {"snapshot nice above 19", NODE_OK "raft:\n  snapshot_nice: 20\n",
     "x.yaml:7:18: ", "raft.snapshot_nice: \"20\" is out of range (0..19)"},
    {"snapshot log cap zero", NODE_OK "raft:\n  snapshot_log_max_mb: 0\n",
     "x.yaml:7:24: ", "raft.snapshot_log_max_mb: \"0\" is out of range (1..65536)"},
    {"segment size above the maximum", NODE_OK "raft:\n  segment_size_mb: 1025\n",
     "x.yaml:7:20: ", "raft.segment_size_mb: \"1025\" is out of range (1..1024)"},
    {"above the maximum", NODE_OK "batch:\n  max_commands: 65536\n",
     "x.yaml:7:17: ", "out of range (1..65535)"},
    {"pending budget below two entries",
     NODE_OK "batch:\n  max_bytes: 1048576\n  max_pending_mb: 1\n",
     "x.yaml:8:19: ", "batch.max_pending_mb (1 MiB) must be at least twice max_bytes (1048576)"},
    {"tenant share zero", NODE_OK "batch:\n  tenant_max_pending_percent: 0\n",
     "x.yaml:7:31: ", "batch.tenant_max_pending_percent: \"0\" is out of range (1..100)"},
    {"tenant share above all", NODE_OK "batch:\n  tenant_max_pending_percent: 101\n",
     "x.yaml:7:31: ", "batch.tenant_max_pending_percent: \"101\" is out of range (1..100)"},
    {"tenant in flight above 1 GiB", NODE_OK "batch:\n  tenant_max_inflight_kb: 1048577\n",
     "x.yaml:7:27: ", "batch.tenant_max_inflight_kb: \"1048577\" is out of range (0..1048576)"},
    {"entries too large for the default pending budget", NODE_OK "batch:\n  max_bytes: 67108864\n",
     "x.yaml:7:14: ", "batch.max_pending_mb (64 MiB) must be at least twice max_bytes (67108864)"},
    {"key_max_len too large", NODE_OK ADMIN_OK TENANTS_OK "    key_max_len: 256\n",
     "x.yaml:11:18: ", "tenants[0].key_max_len: \"256\" is out of range (1..255)"},
    {"ttl above a year", NODE_OK ADMIN_OK TENANTS_OK "    ttl_ms: 31536000001\n",
     "x.yaml:11:13: ", "out of range"},
    {"step-down under a second", NODE_OK "raft:\n  stuck_write_step_down_ms: 500\n",
     "x.yaml:7:29: ",
     "raft.stuck_write_step_down_ms: 500 is out of range (0, never, or "
     "1000..600000)"},
    {"bad boolean", NODE_OK "raft:\n  pre_vote: maybe\n",
     "x.yaml:7:13: ", "raft.pre_vote: expected true or false, got \"maybe\""},
    {"quoted boolean", NODE_OK "raft:\n  pre_vote: 'true'\n", "x.yaml:7:13: ", "quoted string"},
    {"NUL in a string",
     "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n  data_dir: \"a\\0b\"\n",
     "x.yaml:5:13: ", "node.data_dir: must not contain a NUL"},

    /* Cross-field rules. */
    {"heartbeat equal to election",
     NODE_OK "raft:\n  election_timeout_ms: 200\n  heartbeat_timeout_ms: 200\n",
     "x.yaml:8:25: ", "raft.heartbeat_timeout_ms must be less than election_timeout_ms"},
    {"heartbeat above election",
     NODE_OK "raft:\n  heartbeat_timeout_ms: 1000\n  election_timeout_ms: 500\n",
     "x.yaml:7:25: ", "must be less than election_timeout_ms (1000 >= 500)"},
    {"default deadline above max", NODE_OK "rpc:\n  default_deadline_ms: 70000\n",
     "x.yaml:7:24: ", "rpc.default_deadline_ms must not exceed max_deadline_ms"},
    {"tls with only cert_file", NODE_OK "tls:\n  cert_file: /c.pem\n",
     "x.yaml:7:3: ", "tls: cert_file and key_file go together; missing key_file"},
    {"tls with only key_file", NODE_OK "tls:\n  key_file: /k.pem\n",
     "x.yaml:7:3: ", "tls: cert_file and key_file go together; missing cert_file"},
    {"tls with only ca_file", NODE_OK "tls:\n  ca_file: /ca.pem\n",
     "x.yaml:7:3: ", "tls: ca_file needs cert_file and key_file"},
    {"tls on rpc without files", NODE_OK "tls:\n  rpc: true\n",
     "x.yaml:7:8: ", "tls.rpc: TLS on the RPC listener needs cert_file and key_file"},
    {"tls rpc not a bool", NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  rpc: 3\n",
     "x.yaml:9:8: ", "tls.rpc"},
    {"tls on http without files", NODE_OK "tls:\n  http: true\n",
     "x.yaml:7:9: ", "tls.http: TLS on the HTTP gateway needs cert_file and key_file"},
    {"tls on proxies without files", NODE_OK "tls:\n  proxy: true\n",
     "x.yaml:7:10: ", "tls.proxy: TLS on the proxy listeners needs cert_file and key_file"},
    {"tls client certs: an unknown value",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  http_client_certs: maybe\n",
     "x.yaml:9:22: ", "tls.http_client_certs: expected off, optional or require, got \"maybe\""},
    {"tls client certs without ca_file",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  http: true\n"
             "  http_client_certs: require\n",
     "x.yaml:10:22: ", "tls.http_client_certs: client certificates need ca_file"},
    {"tls client certs without an https listener",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  ca_file: /ca.pem\n"
             "  http_client_certs: optional\n",
     "x.yaml:10:22: ", "tls.http_client_certs: no HTTP listener serves TLS"},
    {"tls on http without an http_address",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  http: true\n" ADMIN_OK TENANTS_OK,
     "x.yaml:9:9: ", "tls.http: this node has no HTTP gateway (node.http_address)"},
    {"tls on proxies without a proxy listener",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  proxy: true\n" ADMIN_OK TENANTS_OK,
     "x.yaml:9:10: ", "tls.proxy: this node has no proxy listener"},
    {"http handshake timeout out of range", NODE_OK "http:\n  handshake_timeout_ms: 99\n",
     "x.yaml:7:25: ", "http.handshake_timeout_ms"},
    {"insecure cluster secret not a bool", NODE_OK "rpc:\n  insecure_cluster_secret: maybe\n",
     "x.yaml:7:28: ", "rpc.insecure_cluster_secret"},
    {"tls on raft without files", NODE_OK "tls:\n  raft: true\n", "x.yaml:7:9: ",
     "tls.raft: TLS between the members needs cert_file, key_file and ca_file; missing "
     "cert_file and key_file"},
    {"tls on raft without ca_file",
     NODE_OK "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  rpc: true\n  raft: true\n",
     "x.yaml:10:9: ",
     "tls.raft: TLS between the members needs cert_file, key_file and ca_file; missing "
     "ca_file"},
    {"tls raft not a bool", NODE_OK "tls:\n  raft: yes please\n", "x.yaml:7:9: ", "tls.raft"},

    /* Required keys. */
    {"missing node.id",
     "node:\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n  data_dir: /d\n",
     "x.yaml:2:3: ", "missing required key \"id\" in node"},
    {"node.id without a value", "node:\n  id:\n", "x.yaml:2:6: ", "node.id: a value is required"},
    {"missing data_dir",
     "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n",
     "x.yaml:2:3: ", "missing required key \"data_dir\" in node"},
    {"empty data_dir",
     "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n  data_dir: ''\n",
     "x.yaml:5:13: ", "node.data_dir: must not be empty"},
    {"missing node", ADMIN_OK TENANTS_OK,
     "x.yaml:1:1: ", "missing required key \"node\" in the top level"},
    {"missing admin", NODE_OK TENANTS_OK,
     "x.yaml:1:1: ", "missing required key \"admin\" in the top level"},
    {"missing admin.token_sha256", NODE_OK "admin: {}\n",
     "x.yaml:6:8: ", "missing required key \"token_sha256\" in admin"},
    {"missing tenants", NODE_OK ADMIN_OK,
     "x.yaml:1:1: ", "missing required key \"tenants\" in the top level"},
    {"empty tenants", NODE_OK ADMIN_OK "tenants: []\n",
     "x.yaml:8:10: ", "tenants: at least one tenant is required"},
    {"tenants not a list", NODE_OK ADMIN_OK "tenants: {name: a}\n",
     "x.yaml:8:10: ", "tenants: expected a list, got a mapping"},
    {"tenant without a token", NODE_OK ADMIN_OK "tenants:\n  - name: demo\n",
     "x.yaml:9:5: ", "missing required key \"token_sha256\" in tenants[0]"},
    {"tenant without a name", NODE_OK ADMIN_OK "tenants:\n  - token_sha256: " HASH_A "\n",
     "x.yaml:9:5: ", "missing required key \"name\" in tenants[0]"},

    /* Token hashes. */
    {"admin hash of 63 digits", NODE_OK "admin:\n  token_sha256: " HASH_63 "\n", "x.yaml:7:17: ",
     "admin.token_sha256: expected 64 hex digits (a SHA-256 digest), got 63 "
     "characters"},
    {"admin hash not hex", NODE_OK "admin:\n  token_sha256: " HASH_NONHEX "\n", "x.yaml:7:17: ",
     "admin.token_sha256: expected 64 hex digits (a SHA-256 digest); the "
     "value holds a character that is not a hex digit"},
    {"tenant hash not hex in a list",
     NODE_OK ADMIN_OK "tenants:\n  - name: demo\n    token_sha256:\n      - " HASH_A
                      "\n      - " HASH_NONHEX "\n",
     "x.yaml:12:9: ", "tenants[0].token_sha256[1]: expected 64 hex digits"},
    {"tenant hash of 63 digits",
     NODE_OK ADMIN_OK "tenants:\n  - name: demo\n"
                      "    token_sha256: " HASH_63 "\n",
     "x.yaml:10:19: ", "tenants[0].token_sha256: expected 64 hex digits"},
    {"empty token list", NODE_OK ADMIN_OK "tenants:\n  - name: demo\n    token_sha256: []\n",
     "x.yaml:10:19: ", "tenants[0].token_sha256: at least one hash is required"},
    {"token hash of two tenants",
     NODE_OK ADMIN_OK "tenants:\n  - {name: a, token_sha256: " HASH_A "}\n"
                      "  - {name: b, token_sha256: " HASH_A "}\n",
     "x.yaml:10:29: ",
     "tenants[1].token_sha256: the same hash is already a token of tenant "
     "\"a\""},
    {"a tenant named like a hash, in a message",
     NODE_OK ADMIN_OK "tenants:\n  - {name: " HASH_ADMIN ", token_sha256: " HASH_A "}\n"
                      "  - {name: b, token_sha256: " HASH_A "}\n",
     "x.yaml:10:29: ",
     "tenants[1].token_sha256: the same hash is already a token of tenant \"<hex>\""},
    {"token hash listed twice",
     NODE_OK ADMIN_OK "tenants:\n  - {name: a, token_sha256: [" HASH_B ", " HASH_B "]}\n",
     "x.yaml:9:96: ", "tenants[0].token_sha256[1]: the same hash is listed twice"},
    {"hash glued to its key in a flow mapping",
     NODE_OK ADMIN_OK "tenants:\n  - {name: a, token_sha256:" HASH_B "}\n",
     "x.yaml:9:15: ", "unknown key \"token_sha256:<hex>\" in tenants[0]"},
    {"hash inside a key", NODE_OK "admin:\n  token_sha256 " HASH_C ": 1\n",
     "x.yaml:7:3: ", "unknown key \"token_sha256 <hex>\" in admin"},
    {"tenant hash equals the admin's",
     NODE_OK ADMIN_OK "tenants:\n  - {name: a, token_sha256: " HASH_ADMIN "}\n",
     "x.yaml:9:29: ", "equals admin.token_sha256"},

    /* Tenants. */
    {"duplicate tenant name",
     NODE_OK ADMIN_OK "tenants:\n  - {name: demo, token_sha256: " HASH_A "}\n"
                      "  - {name: demo, token_sha256: " HASH_B "}\n",
     "x.yaml:10:12: ", "tenants[1].name: duplicate tenant name \"demo\" (also tenants[0])"},
    {"bad tenant name", NODE_OK ADMIN_OK "tenants:\n  - {name: a b, token_sha256: " HASH_A "}\n",
     "x.yaml:9:12: ", "tenants[0].name: may hold only letters"},
    {"empty tenant name", NODE_OK ADMIN_OK "tenants:\n  - {name: '', token_sha256: " HASH_A "}\n",
     "x.yaml:9:12: ", "tenants[0].name: must be 1..128 bytes, got 0"},
    {"bad lease_policy", NODE_OK ADMIN_OK TENANTS_OK "    lease_policy: steal\n",
     "x.yaml:11:19: ", "tenants[0].lease_policy: expected conflict or takeover, got \"steal\""},
    {"tenant mismatch_status", NODE_OK ADMIN_OK TENANTS_OK "    mismatch_status: 425\n",
     "x.yaml:11:22: ", "tenants[0].mismatch_status: expected 409 or 422, got 425"},
    {"second tenant bad after the first is built",
     NODE_OK ADMIN_OK TENANTS_OK "  - name: other\n    token_sha256: [" HASH_B "]\n"
                                 "    lease_ms: 0\n",
     "x.yaml:13:15: ", "tenants[1].lease_ms: \"0\" is out of range (1..86400000)"},

    /* Addresses. */
    {"address without a port", "node:\n  id: 1\n  raft_address: 127.0.0.1\n",
     "x.yaml:3:17: ", "node.raft_address: expected host:port (or [IPv6]:port), got \"127.0.0.1\""},
    {"address with port 0", "node:\n  id: 1\n  raft_address: 127.0.0.1:0\n",
     "x.yaml:3:17: ", "node.raft_address: the port must be 1..65535, got \"127.0.0.1:0\""},
    {"address with port 70000", "node:\n  id: 1\n  raft_address: 127.0.0.1:70000\n",
     "x.yaml:3:17: ", "the port must be 1..65535"},
    {"address without a host", "node:\n  id: 1\n  raft_address: :9001\n",
     "x.yaml:3:17: ", "expected host:port"},
    {"address with a bad IPv4", "node:\n  id: 1\n  raft_address: 256.0.0.1:9001\n",
     "x.yaml:3:17: ", "not a valid IPv4 address"},
    {"address with a short IPv4", "node:\n  id: 1\n  raft_address: 127.1:9001\n",
     "x.yaml:3:17: ", "the host is not a valid IPv4 address, got \"127.1:9001\""},
    /* getaddrinfo would read these as addresses (inet_aton's forms): neither names nor
     * addresses here. */
    {"address in hexadecimal", "node:\n  id: 1\n  raft_address: 0x7f000001:9001\n", "x.yaml:3:17: ",
     "node.raft_address: the host must be an IPv4 address, an IPv6 address in brackets or a "
     "host name, got \"0x7f000001:9001\""},
    {"name with a numeric last label", "node:\n  id: 1\n  raft_address: a.b.123:9001\n",
     "x.yaml:3:17: ", "the host must be an IPv4 address, an IPv6 address in brackets or a host"},
    {"name with a bad character", "node:\n  id: 1\n  raft_address: 'bad host:9001'\n",
     "x.yaml:3:17: ", "the host must be an IPv4 address, an IPv6 address in brackets or a host"},
    {"name with an empty label", "node:\n  id: 1\n  raft_address: a..b:9001\n",
     "x.yaml:3:17: ", "or a host name, got \"a..b:9001\""},
    {"name with a label starting with a dash", "node:\n  id: 1\n  raft_address: -a.b:9001\n",
     "x.yaml:3:17: ", "or a host name"},
    {"name with a label of 64 bytes",
     "node:\n  id: 1\n  raft_address: "
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.b:9001\n",
     "x.yaml:3:17: ", "or a host name"},
    {"bootstrap member with a bad host name",
     NODE_OK "cluster:\n  bootstrap:\n    - {id: 1, raft_address: 'n1/x:9001', "
             "rpc_address: 127.0.0.1:7001}\n",
     "x.yaml:8:29: ", "cluster.bootstrap[0].raft_address: the host must be an IPv4 address"},
    {"address with a leading zero in the port", "node:\n  id: 1\n  raft_address: 127.0.0.1:09001\n",
     "x.yaml:3:17: ", "the port must be 1..65535 without leading zeros, got \"127.0.0.1:09001\""},
    {"address with a leading zero in the host", "node:\n  id: 1\n  raft_address: 127.0.0.01:9001\n",
     "x.yaml:3:17: ", "not a valid IPv4 address"},
    {"IPv6 address without brackets", "node:\n  id: 1\n  raft_address: '::1:9001'\n",
     "x.yaml:3:17: ",
     "node.raft_address: write an IPv6 address in brackets, [address]:port, got \"::1:9001\""},
    {"IPv6 address without a port", "node:\n  id: 1\n  raft_address: '[::1]'\n",
     "x.yaml:3:17: ", "node.raft_address: expected [IPv6]:port, got \"[::1]\""},
    {"IPv6 address without the closing bracket", "node:\n  id: 1\n  raft_address: '[::1:9001'\n",
     "x.yaml:3:17: ", "expected host:port (or [IPv6]:port)"},
    {"IPv6 address with text after the bracket", "node:\n  id: 1\n  raft_address: '[::1]x:9001'\n",
     "x.yaml:3:17: ", "expected [IPv6]:port, got \"[::1]x:9001\""},
    {"bad IPv6 address", "node:\n  id: 1\n  raft_address: '[::g]:9001'\n",
     "x.yaml:3:17: ", "the host is not a valid IPv6 address, got \"[::g]:9001\""},
    {"IPv6 address with a zone", "node:\n  id: 1\n  raft_address: '[fe80::1%eth0]:9001'\n",
     "x.yaml:3:17: ", "not a valid IPv6 address (zone indexes are not taken)"},
    {"IPv4 address in brackets", "node:\n  id: 1\n  raft_address: '[127.0.0.1]:9001'\n",
     "x.yaml:3:17: ", "the host is not a valid IPv6 address"},
    {"empty brackets", "node:\n  id: 1\n  raft_address: '[]:9001'\n",
     "x.yaml:3:17: ", "the host is not a valid IPv6 address"},
    {"IPv6 address with a bad port", "node:\n  id: 1\n  raft_address: '[::1]:0'\n",
     "x.yaml:3:17: ", "the port must be 1..65535, got \"[::1]:0\""},
    {"bad raft_listen", NODE_OK "  raft_listen: 0.0.0.0\n",
     "x.yaml:6:16: ", "node.raft_listen: expected host:port"},
    {"bad rpc_listen", NODE_OK "  rpc_listen: '[::]:70000'\n",
     "x.yaml:6:15: ", "node.rpc_listen: the port must be 1..65535"},
    {"http_listen without an http_address", NODE_OK "  http_listen: 0.0.0.0:8001\n",
     "x.yaml:6:16: ", "node.http_listen: set node.http_address too"},
    {"bad http_address",
     "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
     "  rpc_address: 127.0.0.1:7001\n  http_address: h:x\n",
     "x.yaml:5:17: ", "node.http_address: the port must be 1..65535"},

    /* Bootstrap. */
    {"bootstrap member missing raft_address",
     NODE_OK "cluster:\n  bootstrap:\n    - {id: 1, rpc_address: 127.0.0.1:7001}\n",
     "x.yaml:8:7: ", "missing required key \"raft_address\" in cluster.bootstrap[0]"},
    {"duplicate bootstrap ids",
     NODE_OK "cluster:\n  bootstrap:\n"
             "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
             "    - {id: 1, raft_address: 127.0.0.1:9002, rpc_address: 127.0.0.1:7002}\n",
     "x.yaml:9:12: ",
     "cluster.bootstrap[1].id: duplicate member id 1 (also "
     "cluster.bootstrap[0])"},
    {"duplicate bootstrap raft addresses",
     NODE_OK "cluster:\n  bootstrap:\n"
             "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
             "    - {id: 2, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7002}\n",
     "x.yaml:9:29: ", "cluster.bootstrap[1].raft_address: duplicate Raft address"},
    {"duplicate bootstrap raft addresses, one name with its final dot",
     NODE_OK "cluster:\n  bootstrap:\n"
             "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
             "    - {id: 2, raft_address: n2.example:9002, rpc_address: 127.0.0.1:7002}\n"
             "    - {id: 3, raft_address: n2.example.:9002, rpc_address: 127.0.0.1:7003}\n",
     "x.yaml:10:29: ", "cluster.bootstrap[2].raft_address: duplicate Raft address"},
    {"bootstrap without this node",
     NODE_OK "cluster:\n  bootstrap:\n"
             "    - {id: 2, raft_address: 127.0.0.1:9002, rpc_address: 127.0.0.1:7002}\n",
     "x.yaml:8:5: ", "cluster.bootstrap: node.id 1 is not in the list"},
    {"bootstrap not a list", NODE_OK "cluster:\n  bootstrap: {id: 1}\n",
     "x.yaml:7:14: ", "cluster.bootstrap: expected a list, got a mapping"},

    /* Proxy mode (lines 11 on follow MINIMAL's 10). */
    {"proxy unknown tenant",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://127.0.0.1:9999', tenant: nobody}\n",
     "x.yaml:14:53: ", "proxy[0].routes[0].tenant: unknown tenant \"nobody\""},
    {"proxy https upstream",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'https://127.0.0.1:9999', tenant: demo}\n",
     "x.yaml:14:20: ", "proxy[0].routes[0].upstream: expected http://HOST:PORT (http only)"},
    {"proxy upstream host name",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://example.com:80', tenant: demo}\n",
     "x.yaml:14:20: ", "the host must be an IPv4 address or localhost"},
    {"proxy upstream path",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://127.0.0.1:9999/api', tenant: demo}\n",
     "x.yaml:14:20: ", "must not have a path"},
    {"proxy missing upstream",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {tenant: demo}\n",
     "x.yaml:14:9: ", "missing required key \"upstream\" in proxy[0].routes[0]"},
    {"proxy mismatch_status",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        mismatch_status: 400\n",
     "x.yaml:16:26: ", "proxy[0].routes[0].mismatch_status: expected 409 or 422, got 400"},
    {"proxy in_progress_status",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        in_progress_status: 422\n",
     "x.yaml:16:29: ", "expected 409 or 425, got 422"},
    {"proxy bad method",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        methods: [POST, post]\n",
     "x.yaml:16:25: ", "proxy[0].routes[0].methods[1]: expected GET, HEAD, POST"},
    {"proxy on_timeout",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        on_timeout: retry\n",
     "x.yaml:16:21: ", "expected unknown or release, got \"retry\""},
    {"proxy bad header name",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        response_headers: [content-type, 'a b']\n",
     "x.yaml:16:42: ", "proxy[0].routes[0].response_headers[1]: not a valid header name"},
    {"proxy path_prefix",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://127.0.0.1:9999', tenant: demo, path_prefix: api}\n",
     "x.yaml:14:72: ", "proxy[0].routes[0].path_prefix: must start with '/'"},
    {"proxy no routes", MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes: []\n",
     "x.yaml:13:13: ", "proxy[0].routes: at least one route is required"},
    {"proxy duplicate address",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n"
             "    routes: [{upstream: 'http://127.0.0.1:1', tenant: demo}]\n"
             "  - address: 127.0.0.1:8101\n"
             "    routes: [{upstream: 'http://127.0.0.1:1', tenant: demo}]\n",
     "x.yaml:14:14: ", "proxy[1].address: the address is already used by proxy[0]"},
    {"proxy unknown key",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://127.0.0.1:1', tenant: demo, store_5xx: true}\n",
     "x.yaml:14:56: ", "unknown key \"store_5xx\" in proxy[0].routes[0]"},
    {"proxy store_4xx not a bool",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - {upstream: 'http://127.0.0.1:1', tenant: demo, store_4xx: 1}\n",
     "x.yaml:14:67: ", "proxy[0].routes[0].store_4xx: expected true or false"},
    {"proxy path_prefix dot segment",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        path_prefix: /api/../admin\n",
     "x.yaml:16:22: ", "proxy[0].routes[0].path_prefix: the path has a '.' or '..' segment"},
    {"proxy path_prefix encoded slash",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        path_prefix: /api%2fpay\n",
     "x.yaml:16:22: ", "proxy[0].routes[0].path_prefix: the path has an encoded '/'"},
    {"proxy path_prefix query",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        path_prefix: /api?x=1\n",
     "x.yaml:16:22: ", "proxy[0].routes[0].path_prefix: a prefix must not have a query"},
    {"proxy other_methods",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        other_methods: allow\n",
     "x.yaml:16:24: ",
     "proxy[0].routes[0].other_methods: expected pass_safe, pass or refuse, got \"allow\""},
    {"proxy method_override",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        method_override: honour\n",
     "x.yaml:16:26: ",
     "proxy[0].routes[0].method_override: expected strip or refuse, got \"honour\""},
    {"proxy caller_identity scalar",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: all\n",
     "x.yaml:16:26: ",
     "proxy[0].routes[0].caller_identity: expected none or a mapping {headers: [...]}, got "
     "\"all\""},
    {"proxy caller_identity no headers",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: {headers: []}\n",
     "x.yaml:16:36: ",
     "proxy[0].routes[0].caller_identity.headers: at least one header name is required"},
    {"proxy caller_identity missing headers",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: {tls_client_subject: false}\n",
     "x.yaml:16:26: ", "missing required key \"headers\" in proxy[0].routes[0].caller_identity"},
    {"proxy caller_identity bad header",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: {headers: ['a b']}\n",
     "x.yaml:16:37: ", "proxy[0].routes[0].caller_identity.headers[0]: not a valid header name"},
    {"proxy caller_identity tls",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: {headers: [X-Api-Key], tls_client_subject: true}\n",
     "x.yaml:16:69: ",
     "proxy[0].routes[0].caller_identity.tls_client_subject: needs TLS on the proxy listener"},
    {"proxy caller_identity unknown key",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: {headers: [X-Api-Key], cookies: [sid]}\n",
     "x.yaml:16:49: ", "unknown key \"cookies\" in proxy[0].routes[0].caller_identity"},
    {"proxy fingerprint_ignore empty pointer",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_ignore: [/ts, '']\n",
     "x.yaml:16:35: ",
     "proxy[0].routes[0].fingerprint_ignore[1]: the empty JSON pointer (the whole body) cannot "
     "be ignored, got \"\""},
    {"proxy fingerprint_fields without a slash",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_fields: [amount]\n",
     "x.yaml:16:30: ",
     "proxy[0].routes[0].fingerprint_fields[0]: a JSON pointer is empty or starts with '/', got "
     "\"amount\""},
    {"proxy fingerprint_fields bad escape",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_fields: ['/a~2']\n",
     "x.yaml:16:30: ",
     "proxy[0].routes[0].fingerprint_fields[0]: '~' in a JSON pointer must be followed by 0 or 1"},
    {"proxy fingerprint_fields not a list",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_fields: /a\n",
     "x.yaml:16:29: ", "proxy[0].routes[0].fingerprint_fields: expected a list of JSON pointers"},
    {"proxy fingerprint_ignore item not a scalar",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_ignore: [/a, [/b]]\n",
     "x.yaml:16:34: ", "proxy[0].routes[0].fingerprint_ignore[1]: expected a JSON pointer"},
    {"proxy fingerprint_ignore listed twice",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_ignore:\n          - /a~1b\n          - /a~1b\n",
     "x.yaml:18:13: ", "proxy[0].routes[0].fingerprint_ignore[1]: \"/a~1b\" is listed twice"},
    {"proxy fingerprint_fields too many",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        fingerprint_fields: [/0, /1, /2, /3, /4, /5, /6, /7, /8, /9, /10, /11, /12, "
             "/13, /14, /15, /16, /17, /18, /19, /20, /21, /22, /23, /24, /25, /26, /27, /28, /29, "
             "/30, /31, /32]\n",
     "x.yaml:16:29: ", "proxy[0].routes[0].fingerprint_fields: at most 32 JSON pointers, got 33"},
    {"proxy set-cookie stored without replay_set_cookie",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        response_headers: [content-type, Set-Cookie]\n",
     "x.yaml:16:27: ",
     "proxy[0].routes[0].response_headers: set-cookie is stored and replayed only with "
     "replay_set_cookie: true"},
    {"proxy replay_set_cookie without a caller",
     MINIMAL "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
             "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
             "        caller_identity: none\n        replay_set_cookie: true\n",
     "x.yaml:17:28: ", "proxy[0].routes[0].replay_set_cookie: needs a caller identity"},
    {"proxy caller namespace above key_max_len",
     NODE_OK ADMIN_OK TENANTS_OK "    key_max_len: 42\n"
                                 "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
                                 "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n",
     "x.yaml:16:17: ",
     "proxy[0].routes[0].tenant: tenant \"demo\" has key_max_len 42, and a caller's record is "
     "kept under a 43-byte key: raise key_max_len to 43 or more, or set caller_identity: none"},
    {"proxy caller namespace above key_max_len, explicit identity",
     NODE_OK ADMIN_OK TENANTS_OK "    key_max_len: 20\n"
                                 "proxy:\n  - address: 127.0.0.1:8101\n    routes:\n"
                                 "      - upstream: http://127.0.0.1:9999\n        tenant: demo\n"
                                 "        caller_identity: {headers: [X-Api-Key]}\n",
     "x.yaml:17:26: ", "proxy[0].routes[0].caller_identity: tenant \"demo\" has key_max_len 20"},
};

/* A message must never quote a token hash, even a malformed one. */
static void assertNoHash(const char *case_name, const char *err)
{
    static const char *const hashes[] = {HASH_ADMIN, HASH_A, HASH_B, HASH_C, HASH_63, HASH_NONHEX};
    for (size_t i = 0; i < sizeof hashes / sizeof hashes[0]; i++) {
        char head[17];
        memcpy(head, hashes[i], 16);
        head[16] = '\0';
        if (strstr(err, head) != NULL) {
            fail_msg("%s: the message quotes a token hash: %s", case_name, err);
        }
    }
}

/* Runs every case and reports every mismatch before failing. */
static void test_bad_inputs(void **state)
{
    (void)state;
    size_t failed = 0;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *bc = &bad_cases[i];
        struct config c;
        char err[512];
        memset(err, 'X', sizeof err);
        int rc = parseStr(bc->text, &c, err, sizeof err);
        if (rc != -1) {
            print_error("%s: parsed, expected an error\n", bc->name);
            failed++;
            config_free(&c);
            continue;
        }
        if (strncmp(err, bc->prefix, strlen(bc->prefix)) != 0 ||
            strstr(err + strlen(bc->prefix), bc->substr) == NULL) {
            print_error("%s:\n  got      %s\n  expected %s...%s\n", bc->name, err, bc->prefix,
                        bc->substr);
            failed++;
        }
        assertNoHash(bc->name, err);
        /* A failed parse leaves nothing to free; config_free() is still safe. */
        assert_null(c.node.data_dir);
        assert_null(c.tenants);
        assert_int_equal(c.n_tenants, 0);
        assert_null(c.cluster.bootstrap);
        assert_null(c.tls.cert_file);
        config_free(&c);
    }
    if (failed > 0) {
        fail_msg("%zu of %zu bad inputs gave the wrong answer", failed,
                 sizeof bad_cases / sizeof bad_cases[0]);
    }
}

/* Messages are cut to the buffer and stay NUL-terminated; no buffer at all is fine too. */
/* The connection caps fit the open-files limit with the node's own reserve; lowered in
 * proportion otherwise (a proxied HTTP request also holds an upstream socket). */
static void test_fd_budget(void **state)
{
    (void)state;
    struct config c;
    parseOk(MINIMAL "rpc:\n  max_connections: 1024\nhttp:\n  max_connections: 512\n", &c);
    assert_int_equal(c.http.max_connections, 512);
    uint32_t rpc = 0, http = 0;
    assert_false(config_fd_budget(&c, 1024 + 512 + CONFIG_FD_RESERVE, &rpc, &http));
    assert_int_equal(rpc, 1024);
    assert_int_equal(http, 512);
    assert_false(config_fd_budget(&c, UINT64_MAX, &rpc, &http));
    assert_true(config_fd_budget(&c, 1024 + 512 + CONFIG_FD_RESERVE - 1, &rpc, &http));
    assert_true(rpc + http + CONFIG_FD_RESERVE <= 1024 + 512 + CONFIG_FD_RESERVE - 1);
    assert_true(config_fd_budget(&c, CONFIG_FD_RESERVE + 300, &rpc, &http));
    assert_int_equal(rpc, 200); /* 2:1, as configured */
    assert_int_equal(http, 100);
    assert_true(config_fd_budget(&c, 10, &rpc, &http)); /* nothing left: one each */
    assert_int_equal(rpc, 1);
    assert_int_equal(http, 1);
    /* With proxy routes each HTTP connection counts twice. */
    c.n_proxies = 1;
    assert_true(config_fd_budget(&c, 1024 + 512 + CONFIG_FD_RESERVE, &rpc, &http));
    assert_true(rpc + 2 * http + CONFIG_FD_RESERVE <= 1024 + 512 + CONFIG_FD_RESERVE);
    assert_false(config_fd_budget(&c, 1024 + 1024 + CONFIG_FD_RESERVE, &rpc, &http));
    c.n_proxies = 0;
    config_free(&c);
}

static void test_small_error_buffer(void **state)
{
    (void)state;
    struct config c;
    char err[12];
    memset(err, 'X', sizeof err);
    assert_int_equal(parseStr("node:\n  id: abc\n", &c, err, sizeof err), -1);
    assert_string_equal(err, "x.yaml:2:7:");
    assert_int_equal(parseStr("node:\n  id: abc\n", &c, NULL, 0), -1);
    assert_int_equal(config_load("/nonexistent/idem.yaml", &c, NULL, 0), -1);
}

/* ---- token lookup -------------------------------------------------------------------------- */

static void test_tenant_by_token_hash(void **state)
{
    (void)state;
    uint8_t admin[CONFIG_HASH_LEN], h1[CONFIG_HASH_LEN], h2[CONFIG_HASH_LEN], h2b[CONFIG_HASH_LEN],
        unknown[CONFIG_HASH_LEN];
    hashOf("admin-secret", admin);
    hashOf("token-of-alpha", h1);
    hashOf("token-of-beta", h2);
    hashOf("token-of-beta-rotated", h2b);
    hashOf("token-of-nobody", unknown);
    char xa[65], x1[65], x2[65], x2b[65];
    hexOf(admin, xa);
    hexOf(h1, x1);
    hexOf(h2, x2);
    hexOf(h2b, x2b);

    char text[2048];
    int n = snprintf(text, sizeof text,
                     NODE_OK "admin:\n  token_sha256: %s\n"
                             "tenants:\n"
                             "  - name: alpha\n    token_sha256: %s\n"
                             "  - name: beta\n    token_sha256: [%s, %s]\n",
                     xa, x1, x2, x2b);
    assert_true(n > 0 && (size_t)n < sizeof text);
    struct config c;
    parseOk(text, &c);

    const struct config_tenant *t = config_tenant_by_token_hash(&c, h1);
    assert_non_null(t);
    assert_string_equal(t->name, "alpha");
    t = config_tenant_by_token_hash(&c, h2);
    assert_non_null(t);
    assert_string_equal(t->name, "beta");
    t = config_tenant_by_token_hash(&c, h2b);
    assert_non_null(t);
    assert_string_equal(t->name, "beta");
    assert_null(config_tenant_by_token_hash(&c, unknown));
    assert_null(config_tenant_by_token_hash(&c, admin)); /* the admin is not a tenant */
    assert_ptr_equal(config_tenant_by_name(&c, "alpha"), &c.tenants[0]);
    assert_ptr_equal(config_tenant_by_name(&c, "beta"), &c.tenants[1]);
    assert_null(config_tenant_by_name(&c, "gamma"));
    assert_null(config_tenant_by_name(&c, "alph"));
    assert_null(config_tenant_by_name(&c, ""));

    assert_true(config_is_admin_hash(&c, admin));
    assert_false(config_is_admin_hash(&c, h1));
    assert_false(config_is_admin_hash(&c, unknown));
    config_free(&c);
}

/* ---- many tenants -------------------------------------------------------------------------- */

#define MANY_TENANTS 5000

/* A tenant of a generated configuration: named "t" and `name` on 4 digits, with the hashes
 * numbered hash[0] and hash[1] (64 hex digits of the number). */
struct gen_tenant {
    size_t name;
    size_t hash[2];
};

/* tenants[i] named i, with the hashes 2i + 1 and 2i + 2: every name and hash distinct. */
static void genDistinct(struct gen_tenant *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        t[i] = (struct gen_tenant){.name = i, .hash = {2 * i + 1, 2 * i + 2}};
    }
}

/* The text (malloc'd) of a configuration of tenants t[0..n), one a line: tenants[i] on line
 * 9 + i, its name at column 12, its hashes at columns 34 and 100. */
static char *genText(const struct gen_tenant *t, size_t n)
{
    static const char head[] = NODE_OK ADMIN_OK "tenants:\n";
    size_t cap = sizeof head + n * 200;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t len = (size_t)snprintf(text, cap, "%s", head);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(text + len, cap - len,
                                "  - {name: t%04zu, token_sha256: [%064zx, %064zx]}\n", t[i].name,
                                t[i].hash[0], t[i].hash[1]);
        assert_true(len < cap);
    }
    return text;
}

/* Parses the configuration of tenants t[0..n), which must fail with message `want`. */
static void expectGenError(const struct gen_tenant *t, size_t n, const char *want)
{
    char *text = genText(t, n);
    struct config c;
    char err[512];
    int rc = parseStr(text, &c, err, sizeof err);
    free(text);
    assert_int_equal(rc, -1);
    assert_string_equal(err, want);
    config_free(&c);
}

/* Thousands of tenants: each name and hash is checked unique as it is read (an index, not a
 * pass over the tenants before it), and the message still places the later occurrence,
 * names the earlier tenant, and is the file's first mistake. With two hashes a tenant, the
 * hashes outgrow the room first made for them. */
static void test_many_tenants(void **state)
{
    (void)state;
    struct gen_tenant *t = calloc(MANY_TENANTS + 1, sizeof *t);
    assert_non_null(t);
    genDistinct(t, MANY_TENANTS + 1);
    char *text = genText(t, MANY_TENANTS);
    struct config c;
    parseOk(text, &c);
    free(text);
    assert_int_equal(c.n_tenants, MANY_TENANTS);
    assert_string_equal(c.tenants[MANY_TENANTS - 1].name, "t4999");
    uint8_t h[CONFIG_HASH_LEN] = {0};
    h[CONFIG_HASH_LEN - 2] = 0x27; /* 10000 (0x2710): tenants[4999]'s second hash */
    h[CONFIG_HASH_LEN - 1] = 0x10;
    assert_ptr_equal(config_tenant_by_token_hash(&c, h), &c.tenants[MANY_TENANTS - 1]);
    /* Each name leads to its own tenant through the index. */
    for (size_t i = 0; i < MANY_TENANTS; i++) {
        assert_ptr_equal(config_tenant_by_name(&c, c.tenants[i].name), &c.tenants[i]);
    }
    assert_null(config_tenant_by_name(&c, "t5000"));
    config_free(&c);

    /* The last tenant takes the name of tenants[1234]: its own line, the other's index. */
    t[MANY_TENANTS].name = 1234;
    expectGenError(t, MANY_TENANTS + 1,
                   "x.yaml:5009:12: tenants[5000].name: duplicate tenant name \"t1234\" (also "
                   "tenants[1234])");
    genDistinct(t, MANY_TENANTS + 1);

    /* tenants[4999] lists a hash of tenants[1]: the message names tenants[1]. */
    t[4999].hash[1] = t[1].hash[0];
    expectGenError(t, MANY_TENANTS,
                   "x.yaml:5008:100: tenants[4999].token_sha256[1]: the same hash is already a "
                   "token of tenant \"t0001\"");
    /* Its own first hash again: listed twice. */
    t[4999].hash[1] = t[4999].hash[0];
    expectGenError(t, MANY_TENANTS,
                   "x.yaml:5008:100: tenants[4999].token_sha256[1]: the same hash is listed twice");
    genDistinct(t, MANY_TENANTS + 1);

    /* Two mistakes: the first in the file is reported, whichever its kind. */
    t[3000].hash[0] = t[2].hash[1];
    t[4000].name = 7;
    expectGenError(t, MANY_TENANTS,
                   "x.yaml:3009:34: tenants[3000].token_sha256[0]: the same hash is already a "
                   "token of tenant \"t0002\"");
    genDistinct(t, MANY_TENANTS + 1);
    t[3000].name = 7;
    t[4000].hash[0] = t[2].hash[1];
    expectGenError(t, MANY_TENANTS,
                   "x.yaml:3009:12: tenants[3000].name: duplicate tenant name \"t0007\" (also "
                   "tenants[7])");
    free(t);
}

/* ---- files --------------------------------------------------------------------------------- */

/* Writes the path of a file of the repository into out: under $IDEM_SOURCE_DIR when that is
 * set, else next to this file's path (__FILE__ is absolute under CMake; when compiled by hand
 * from the repository root it is relative, and the test must run from there). */
static void repoPath(const char *rel, char *out, size_t outlen)
{
    const char *root = getenv("IDEM_SOURCE_DIR");
    if (root != NULL && *root != '\0') {
        int n = snprintf(out, outlen, "%s/%s", root, rel);
        assert_true(n > 0 && (size_t)n < outlen);
        return;
    }
    const char *self = __FILE__;
    size_t len = strlen(self);
    size_t tail = strlen(THIS_FILE_IN_REPO);
    assert_true(len >= tail && strcmp(self + len - tail, THIS_FILE_IN_REPO) == 0);
    int n = snprintf(out, outlen, "%.*s%s", (int)(len - tail), self, rel);
    assert_true(n > 0 && (size_t)n < outlen);
}

static void test_example_file(void **state)
{
    (void)state;
    char path[4096];
    repoPath(EXAMPLE_IN_REPO, path, sizeof path);
    struct config c;
    char err[512];
    if (config_load(path, &c, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    assert_int_equal(c.node.id, 1);
    assert_int_equal(c.cluster.n_bootstrap, 3);
    assert_false(c.tls.enabled); /* the example leaves the TLS files empty */
    assert_int_equal(c.n_tenants, 1);
    assert_int_equal(c.n_proxies, 1); /* the example documents proxy mode too */
    assert_int_equal(c.proxies[0].n_routes, 1);

    /* The example documents which tokens its hashes belong to. */
    uint8_t h[CONFIG_HASH_LEN];
    hashOf("example-admin-token", h);
    assert_true(config_is_admin_hash(&c, h));
    hashOf("example-demo-token", h);
    const struct config_tenant *t = config_tenant_by_token_hash(&c, h);
    assert_non_null(t);
    assert_string_equal(t->name, "demo");
    hashOf("example-demo-token-next", h);
    assert_ptr_equal(config_tenant_by_token_hash(&c, h), t);
    config_free(&c);
}

static void writeTemp(char path[64], const char *data, size_t len);

/* A file of 16 MiB is read; one byte more is refused, saying so. */
static void test_file_size_limit(void **state)
{
    (void)state;
    const size_t max = 16u << 20;
    char *text = malloc(max + 1);
    assert_non_null(text);
    size_t n = strlen(MINIMAL);
    memcpy(text, MINIMAL, n);
    memset(text + n, '#', max + 1 - n); /* a comment to the end */
    text[max - 1] = '\n';
    char path[64];
    writeTemp(path, text, max);
    struct config c;
    char err[512];
    if (config_load(path, &c, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    config_free(&c);
    assert_int_equal(remove(path), 0);
    text[max - 1] = '#';
    text[max] = '\n';
    writeTemp(path, text, max + 1);
    assert_int_equal(config_load(path, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot read: the file is larger than 16777216 bytes"));
    assert_int_equal(remove(path), 0);
    free(text);
}

static void test_unreadable_file(void **state)
{
    (void)state;
    struct config c;
    char err[512];
    assert_int_equal(config_load("/nonexistent/idem.yaml", &c, err, sizeof err), -1);
    assert_string_equal(err, "/nonexistent/idem.yaml: cannot read: No such file or directory");
    config_free(&c);
    assert_int_equal(config_load("/", &c, err, sizeof err), -1);
    assert_string_equal(err, "/: cannot read: Is a directory");
}

/* A file's errors carry the file's path as given. */
static void test_load_error_names_the_file(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-config-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    assert_non_null(fp);
    fputs(NODE_OK "raft:\n  election_timeout_ms: 600\n  heartbeat_timeout_ms: 600\n", fp);
    assert_int_equal(fclose(fp), 0);
    struct config c;
    char err[512];
    char want[512];
    snprintf(want, sizeof want,
             "%s:8:25: raft.heartbeat_timeout_ms must be less than election_timeout_ms "
             "(600 >= 600)",
             path);
    assert_int_equal(config_load(path, &c, err, sizeof err), -1);
    assert_string_equal(err, want);
    assert_int_equal(remove(path), 0);
}

/* ---- proxy mode -------------------------------------------------------------------------- */

/* A tenant's mismatch_status is its JSON API's, and its proxy routes' unless one sets its
 * own. */
static void test_mismatch_status_of_tenant_and_routes(void **state)
{
    (void)state;
    struct config c;
    parseOk(NODE_OK ADMIN_OK
            "tenants:\n"
            "  - {name: demo, token_sha256: " HASH_A ", mismatch_status: 422}\n"
            "  - {name: other, token_sha256: " HASH_B "}\n"
            "proxy:\n"
            "  - address: 127.0.0.1:8101\n"
            "    routes:\n"
            "      - {upstream: 'http://127.0.0.1:9999', tenant: demo}\n"
            "      - {upstream: 'http://127.0.0.1:9999', tenant: demo, mismatch_status: 409}\n"
            "      - {upstream: 'http://127.0.0.1:9999', tenant: other}\n",
            &c);
    assert_int_equal(c.tenants[0].mismatch_status, 422);
    assert_int_equal(c.tenants[1].mismatch_status, 409);
    assert_int_equal(c.proxies[0].routes[0].mismatch_status, 422);
    assert_int_equal(c.proxies[0].routes[1].mismatch_status, 409);
    assert_int_equal(c.proxies[0].routes[2].mismatch_status, 409);
    config_free(&c);
}

static void test_proxy(void **state)
{
    (void)state;
    struct config c;
    parseOk(MINIMAL
            "proxy:\n"
            "  - address: 127.0.0.1:8101\n"
            "    routes:\n"
            "      - upstream: http://127.0.0.1:9999\n"
            "        tenant: demo\n"
            "      - methods: [POST, PUT]\n"
            "        path_prefix: /payments\n"
            "        upstream: http://localhost:9000/\n"
            "        tenant: demo\n"
            "        lease_ms: 5000\n"
            "        ttl_ms: 60000\n"
            "        lease_policy: takeover\n"
            "        mismatch_status: 422\n"
            "        in_progress_status: 425\n"
            "        fingerprint_headers: [X-Account]\n"
            "        store_4xx: true\n"
            "        on_timeout: release\n"
            "        upstream_timeout_ms: 2500\n"
            "        response_headers: [Content-Type, Location]\n"
            "        max_inline_body: 4096\n"
            "        key_required: false\n"
            "        other_methods: refuse\n"
            "        method_override: refuse\n"
            "        caller_identity: {headers: [X-Api-Key, Authorization]}\n"
            "        replay_set_cookie: true\n"
            "        fingerprint_fields: ['', /amount, /a~1b/0]\n"
            "        fingerprint_ignore:\n"
            "          - /ts\n"
            "          - /items/0/note~0\n"
            "  - address: 127.0.0.1:8102\n"
            "    routes: [{upstream: 'http://10.1.2.3', tenant: demo, other_methods: pass,\n"
            "              caller_identity: none, path_prefix: '/a%7eb/%c3%a9/'}]\n",
            &c);
    assert_int_equal(c.n_proxies, 2);
    const struct config_proxy *p = &c.proxies[0];
    assertAddr(&p->address, "127.0.0.1:8101", "127.0.0.1", 8101);
    assert_int_equal(p->n_routes, 2);
    const struct config_proxy_route *r = &p->routes[0];
    assert_int_equal(r->methods, CONFIG_M_POST | CONFIG_M_PUT | CONFIG_M_PATCH | CONFIG_M_DELETE);
    assert_string_equal(r->path_prefix, "/");
    assert_string_equal(r->upstream_host, "127.0.0.1");
    assert_int_equal(r->upstream_port, 9999);
    assert_string_equal(r->upstream_hostport, "127.0.0.1:9999");
    assert_int_equal(r->tenant, 0);
    assert_int_equal(r->lease_ms, 0);
    assert_int_equal(r->ttl_ms, 0);
    assert_false(r->lease_policy_set);
    assert_int_equal(r->mismatch_status, 409);
    assert_int_equal(r->in_progress_status, 409);
    assert_int_equal(r->n_fingerprint_headers, 0);
    assert_int_equal(r->n_fingerprint_fields, 0);
    assert_int_equal(r->n_fingerprint_ignore, 0);
    assert_false(r->store_4xx);
    assert_true(r->on_timeout_unknown);
    assert_int_equal(r->upstream_timeout_ms, 10000);
    /* by default a replay keeps the type and what points at what the request made */
    assert_int_equal(r->n_response_headers, 5);
    assert_string_equal(r->response_headers[0], "content-type");
    assert_string_equal(r->response_headers[1], "location");
    assert_string_equal(r->response_headers[2], "content-location");
    assert_string_equal(r->response_headers[3], "etag");
    assert_string_equal(r->response_headers[4], "link");
    assert_int_equal(r->max_inline_body, 1u << 20);
    assert_true(r->key_required);
    assert_int_equal(r->other_methods, CONFIG_OTHER_PASS_SAFE);
    assert_false(r->method_override_refuse);
    assert_false(r->caller_none);
    assert_int_equal(r->n_caller_headers, 2);
    assert_string_equal(r->caller_headers[0], "authorization");
    assert_string_equal(r->caller_headers[1], "cookie");
    assert_false(r->replay_set_cookie);
    r = &p->routes[1];
    assert_int_equal(r->methods, CONFIG_M_POST | CONFIG_M_PUT);
    assert_string_equal(r->path_prefix, "/payments");
    assert_string_equal(r->upstream, "http://localhost:9000/");
    assert_string_equal(r->upstream_host, "127.0.0.1");
    assert_int_equal(r->upstream_port, 9000);
    assert_string_equal(r->upstream_hostport, "localhost:9000");
    assert_int_equal(r->lease_ms, 5000);
    assert_int_equal(r->ttl_ms, 60000);
    assert_true(r->lease_policy_set);
    assert_int_equal(r->lease_policy, CONFIG_LEASE_TAKEOVER);
    assert_int_equal(r->mismatch_status, 422);
    assert_int_equal(r->in_progress_status, 425);
    assert_int_equal(r->n_fingerprint_headers, 1);
    assert_string_equal(r->fingerprint_headers[0], "x-account");
    assert_true(r->store_4xx);
    assert_false(r->on_timeout_unknown);
    assert_int_equal(r->upstream_timeout_ms, 2500);
    assert_int_equal(r->n_response_headers, 2);
    assert_string_equal(r->response_headers[1], "location");
    assert_int_equal(r->max_inline_body, 4096);
    assert_false(r->key_required);
    assert_int_equal(r->other_methods, CONFIG_OTHER_REFUSE);
    assert_true(r->method_override_refuse);
    assert_false(r->caller_none);
    assert_int_equal(r->n_caller_headers, 2);
    assert_string_equal(r->caller_headers[0], "x-api-key");
    assert_string_equal(r->caller_headers[1], "authorization");
    assert_true(r->replay_set_cookie);
    assert_int_equal(r->n_fingerprint_fields, 3);
    assert_string_equal(r->fingerprint_fields[0], "");
    assert_string_equal(r->fingerprint_fields[1], "/amount");
    assert_string_equal(r->fingerprint_fields[2], "/a~1b/0");
    assert_int_equal(r->n_fingerprint_ignore, 2);
    assert_string_equal(r->fingerprint_ignore[0], "/ts");
    assert_string_equal(r->fingerprint_ignore[1], "/items/0/note~0");
    r = &c.proxies[1].routes[0];
    assert_int_equal(r->upstream_port, 80);
    assert_string_equal(r->upstream_hostport, "10.1.2.3:80");
    assert_int_equal(r->other_methods, CONFIG_OTHER_PASS);
    assert_true(r->caller_none);
    assert_int_equal(r->n_caller_headers, 0);
    assert_null(r->caller_headers);
    assert_string_equal(r->path_prefix, "/a~b/%C3%A9/"); /* kept normalised */
    config_free(&c);
    config_free(&c); /* twice is safe */

    parseOk(MINIMAL "proxy: []\n", &c);
    assert_int_equal(c.n_proxies, 0);
    assert_null(c.proxies);
    config_free(&c);
    parseOk(MINIMAL, &c);
    assert_int_equal(c.n_proxies, 0);
    config_free(&c);
    assert_int_equal(config_method_bit("DELETE", 6), CONFIG_M_DELETE);
    assert_int_equal(config_method_bit("delete", 6), 0);
}

/* ---- the cluster secret (rpc.cluster_secret_file) ------------------------------------------ */

/* Writes len bytes of data into a new temporary file; its path into path (a mkstemp
 * template the caller removes). */
static void writeTemp(char path[64], const char *data, size_t len)
{
    snprintf(path, 64, "/tmp/idem-secret-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* Parses NODE_OK + "rpc:\n  cluster_secret_file: <value>\n" (allowed without TLS: NODE_OK's
 * addresses are loopback ones) + admin (hash admin_hex, or
 * HASH_ADMIN) + tenant demo (hash tenant_hex, or HASH_A); returns config_parse()'s result. */
static int parseSecret(const char *value, const char *admin_hex, const char *tenant_hex,
                       struct config *c, char *err, size_t errlen)
{
    char text[2048];
    int n = snprintf(text, sizeof text,
                     NODE_OK "rpc:\n  cluster_secret_file: %s\n  insecure_cluster_secret: true\n"
                             "admin:\n  token_sha256: %s\n"
                             "tenants:\n  - name: demo\n    token_sha256: %s\n",
                     value, admin_hex ? admin_hex : HASH_ADMIN, tenant_hex ? tenant_hex : HASH_A);
    assert_true(n > 0 && (size_t)n < sizeof text);
    return parseStr(text, c, err, errlen);
}

static void expectSecretError(const char *value, const char *admin_hex, const char *tenant_hex,
                              const char *want, const char *secret)
{
    struct config c;
    char err[512];
    assert_int_equal(parseSecret(value, admin_hex, tenant_hex, &c, err, sizeof err), -1);
    if (strncmp(err, "x.yaml:7:24: rpc.cluster_secret_file: ", 38) != 0 ||
        strstr(err, want) == NULL) {
        fail_msg("got %s, expected x.yaml:7:24: rpc.cluster_secret_file: ...%s", err, want);
    }
    if (secret != NULL && strstr(err, secret) != NULL) {
        fail_msg("the message quotes the secret: %s", err);
    }
    assert_false(c.rpc.cluster_secret.set);
    assert_null(c.rpc.cluster_secret.value);
    config_free(&c);
}

static void test_cluster_secret(void **state)
{
    (void)state;
    struct config c;
    uint8_t h[CONFIG_HASH_LEN];
    char hex[2 * CONFIG_HASH_LEN + 1];

    /* Not configured: the default. */
    parseOk(MINIMAL, &c);
    assert_false(c.rpc.cluster_secret.set);
    hashOf("", h);
    assert_false(config_is_cluster_secret_hash(&c, h));
    config_free(&c);
    parseOk(NODE_OK "rpc:\n  cluster_secret_file: \"\"\n" ADMIN_OK TENANTS_OK, &c);
    assert_false(c.rpc.cluster_secret.set);
    config_free(&c);
    /* insecure_cluster_secret without a secret: nothing to allow, and no error. */
    parseOk(NODE_OK "rpc:\n  insecure_cluster_secret: true\n" ADMIN_OK TENANTS_OK, &c);
    assert_true(c.rpc.insecure_cluster_secret);
    config_free(&c);

    /* A secret with a trailing newline (as `echo` writes it): trimmed. */
    static const char secret[] = "secret-of-the-cluster-0123";
    char path[64];
    writeTemp(path, "secret-of-the-cluster-0123\r\n\n", sizeof secret - 1 + 3);
    char err[512];
    if (parseSecret(path, NULL, NULL, &c, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    assert_true(c.rpc.cluster_secret.set);
    assert_int_equal(c.rpc.cluster_secret.len, sizeof secret - 1);
    assert_memory_equal(c.rpc.cluster_secret.value, secret, sizeof secret - 1);
    hashOf(secret, h);
    assert_memory_equal(c.rpc.cluster_secret.sha256, h, CONFIG_HASH_LEN);
    assert_true(config_is_cluster_secret_hash(&c, h));
    hashOf("secret-of-the-cluster-0124", h);
    assert_false(config_is_cluster_secret_hash(&c, h));
    config_free(&c);

    /* The secret must not be a token: the admin's or a tenant's. */
    hashOf(secret, h);
    hexOf(h, hex);
    expectSecretError(path, hex, NULL, "the secret is the admin token", secret);
    expectSecretError(path, NULL, hex, "the secret is a token of tenant \"demo\"", secret);
    assert_int_equal(remove(path), 0);

    /* A file its group or others may read or write: refused, the mode named. */
    writeTemp(path, "secret-of-the-cluster-0123\n", sizeof secret);
    assert_int_equal(chmod(path, 0640), 0);
    expectSecretError(path, NULL, NULL,
                      "may be read or written by its group or by others (mode 0640)", secret);
    assert_int_equal(chmod(path, 0602), 0);
    expectSecretError(path, NULL, NULL, "(mode 0602): give it mode 600", secret);
    assert_int_equal(remove(path), 0);

    /* Too short (after trimming), too long, unreadable, not a string. */
    writeTemp(path, "fifteen-bytes-x\n", 16);
    expectSecretError(path, NULL, NULL, "holds 15 bytes (without trailing whitespace)",
                      "fifteen-bytes-x");
    assert_int_equal(remove(path), 0);
    writeTemp(path, "", 0);
    expectSecretError(path, NULL, NULL, "holds 0 bytes", NULL);
    assert_int_equal(remove(path), 0);
    static char big[5000];
    memset(big, 's', sizeof big);
    writeTemp(path, big, sizeof big);
    expectSecretError(path, NULL, NULL, "holds more than 4096 bytes", NULL);
    assert_int_equal(remove(path), 0);
    /* 4096 bytes and a newline (or CRLF): the newline is dropped, the secret taken. */
    big[4096] = '\n';
    for (size_t n = 4097; n <= 4098; n++) {
        writeTemp(path, big, n);
        if (parseSecret(path, NULL, NULL, &c, err, sizeof err) != 0) {
            fail_msg("%zu bytes: %s", n, err);
        }
        assert_int_equal(c.rpc.cluster_secret.len, 4096);
        config_free(&c);
        assert_int_equal(remove(path), 0);
        big[4096] = '\r';
        big[4097] = '\n';
    }
    big[4096] = big[4097] = 's';
    writeTemp(path, big, 4097);
    expectSecretError(path, NULL, NULL, "holds more than 4096 bytes", NULL);
    assert_int_equal(remove(path), 0);
    expectSecretError("/nonexistent/idem.secret", NULL, NULL,
                      "cannot read \"/nonexistent/idem.secret\": No such file or directory", NULL);
    expectSecretError("/", NULL, NULL, "cannot read \"/\": Is a directory", NULL);
    expectSecretError("[a, b]", NULL, NULL, "expected a string, got a list", NULL);
}

/* ---- the cluster secret never crosses the network in clear --------------------------------- */

/* Parses node (a node section) + rpc: the secret file at `path` and then `more` lines + tls
 * + admin and tenants; 0 or -1 with the message in err. */
static int parseTransport(const char *node, const char *path, const char *more, const char *tls,
                          struct config *c, char *err, size_t errlen)
{
    char text[4096];
    int n =
        snprintf(text, sizeof text, "%srpc:\n  cluster_secret_file: %s\n%s%s" ADMIN_OK TENANTS_OK,
                 node, path, more, tls);
    assert_true(n > 0 && (size_t)n < sizeof text);
    return parseStr(text, c, err, errlen);
}

static void expectTransport(const char *node, const char *path, const char *more, const char *tls,
                            const char *want)
{
    struct config c;
    char err[512];
    int rc = parseTransport(node, path, more, tls, &c, err, sizeof err);
    if (want == NULL) {
        if (rc != 0) {
            fail_msg("config_parse failed: %s", err);
        }
        assert_true(c.rpc.cluster_secret.set);
    } else if (rc == 0 || strncmp(err, want, strlen(want)) != 0) {
        fail_msg("got %s, expected %s...", rc == 0 ? "success" : err, want);
    }
    config_free(&c);
}

static void test_cluster_secret_transport(void **state)
{
    (void)state;
    char path[64];
    writeTemp(path, "secret-of-the-cluster-0123\n", 27);
    /* Without tls.rpc and without the switch: refused where the secret file is named. */
    expectTransport(NODE_OK, path, "", "",
                    "x.yaml:7:24: rpc.cluster_secret_file: followers send the cluster secret to "
                    "the leader's RPC address, in clear without tls.rpc; turn tls.rpc on, or, "
                    "when every member's rpc_address is a loopback address, set "
                    "rpc.insecure_cluster_secret: true");
    expectTransport(NODE_OK, path, "  insecure_cluster_secret: false\n", "",
                    "x.yaml:7:24: rpc.cluster_secret_file: followers send the cluster secret");
    /* The switch, on a cluster of loopback addresses (127.0.0.0/8): allowed. */
    expectTransport(NODE_OK, path, "  insecure_cluster_secret: true\n", "", NULL);
    static const char loopbackCluster[] =
        NODE_OK "cluster:\n  bootstrap:\n"
                "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
                "    - {id: 2, raft_address: 127.0.0.2:9001, rpc_address: 127.3.0.2:7001}\n";
    expectTransport(loopbackCluster, path, "  insecure_cluster_secret: true\n", "", NULL);
    /* ... not with one member elsewhere, nor with this node elsewhere. */
    static const char remoteMember[] =
        NODE_OK "cluster:\n  bootstrap:\n"
                "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
                "    - {id: 2, raft_address: 127.0.0.2:9001, rpc_address: 10.0.0.2:7001}\n";
    expectTransport(remoteMember, path, "  insecure_cluster_secret: true\n", "",
                    "x.yaml:12:28: rpc.insecure_cluster_secret: the RPC address \"10.0.0.2:7001\" is "
                    "not a loopback address; the cluster secret would cross the network in "
                    "clear: turn tls.rpc on");
    static const char remoteNode[] = "node:\n  id: 1\n  raft_address: 127.0.0.1:9001\n"
                                     "  rpc_address: 0.0.0.0:7001\n  data_dir: /tmp/idem\n";
    expectTransport(remoteNode, path, "  insecure_cluster_secret: true\n", "",
                    "x.yaml:8:28: rpc.insecure_cluster_secret: the RPC address \"0.0.0.0:7001\" is "
                    "not a loopback address");
    /* With tls.rpc the secret travels encrypted: any addresses, no switch needed. */
    static const char tlsRpc[] = "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  rpc: true\n";
    expectTransport(remoteMember, path, "", tlsRpc, NULL);
    expectTransport(remoteNode, path, "", tlsRpc, NULL);
    assert_int_equal(remove(path), 0);

    assert_true(config_addr_is_loopback("127.0.0.1:1"));
    assert_true(config_addr_is_loopback("127.255.255.254:65535"));
    assert_false(config_addr_is_loopback("128.0.0.1:1"));
    assert_false(config_addr_is_loopback("0.0.0.0:7001"));
    assert_false(config_addr_is_loopback("127.0.0.1"));
    assert_false(config_addr_is_loopback("localhost:7001"));
    assert_false(config_addr_is_loopback(""));
    assert_false(config_addr_is_loopback(NULL));
    assert_true(config_addr_is_loopback("[::1]:7001"));
    assert_true(config_addr_is_loopback("[0:0:0:0:0:0:0:1]:7001"));
    assert_true(config_addr_is_loopback("[::ffff:127.0.0.2]:7001"));
    assert_false(config_addr_is_loopback("[::]:7001"));
    assert_false(config_addr_is_loopback("[::2]:7001"));
    assert_false(config_addr_is_loopback("[::ffff:10.0.0.1]:7001"));
    assert_false(config_addr_is_loopback("::1:7001"));

    /* A member's RPC address that is a name: refused, not resolved (it may resolve elsewhere
     * later), with a message that says so. */
    static const char namedMember[] =
        NODE_OK "cluster:\n  bootstrap:\n"
                "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
                "    - {id: 2, raft_address: 127.0.0.1:9002, rpc_address: localhost:7002}\n";
    writeTemp(path, "secret-of-the-cluster-0123\n", 27);
    expectTransport(namedMember, path, "  insecure_cluster_secret: true\n", "",
                    "x.yaml:12:28: rpc.insecure_cluster_secret: the RPC address \"localhost:7002\" is "
                    "a host name; the cluster secret goes in clear only to loopback addresses "
                    "written as such");
    static const char v6Member[] =
        NODE_OK "cluster:\n  bootstrap:\n"
                "    - {id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}\n"
                "    - {id: 2, raft_address: '[::1]:9002', rpc_address: '[::1]:7002'}\n";
    expectTransport(v6Member, path, "  insecure_cluster_secret: true\n", "", NULL);
    assert_int_equal(remove(path), 0);
}

/* ---- the Raft secret (raft.secret_file) ---------------------------------------------------- */

static void test_raft_secret(void **state)
{
    (void)state;
    struct config c;
    char err[512];
    parseOk(MINIMAL, &c);
    assert_false(c.raft.secret.set);
    assert_null(c.raft.secret.value);
    config_free(&c);

    static const char secret[] = "secret-of-the-raft-port-0123456789abcdef";
    char path[64];
    writeTemp(path, "secret-of-the-raft-port-0123456789abcdef\n", sizeof secret);
    char text[2048];
    snprintf(text, sizeof text, NODE_OK "raft:\n  secret_file: %s\n" ADMIN_OK TENANTS_OK, path);
    if (parseStr(text, &c, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    assert_true(c.raft.secret.set);
    assert_int_equal(c.raft.secret.len, sizeof secret - 1);
    assert_memory_equal(c.raft.secret.value, secret, sizeof secret - 1);
    /* Not the cluster secret: that one stays unset. */
    assert_false(c.rpc.cluster_secret.set);
    config_free(&c);

    /* The same secret for both is refused: followers send the cluster secret over the RPC. */
    snprintf(text, sizeof text,
             NODE_OK
             "raft:\n  secret_file: %s\nrpc:\n  cluster_secret_file: %s\n" ADMIN_OK TENANTS_OK,
             path, path);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    static const char same[] = "x.yaml:7:16: raft.secret_file: the secret is the cluster secret";
    if (strncmp(err, same, sizeof same - 1) != 0) {
        fail_msg("got %s", err);
    }
    config_free(&c);

    /* A token of a tenant as the Raft secret: refused where the file is named. */
    uint8_t h[CONFIG_HASH_LEN];
    char hex[2 * CONFIG_HASH_LEN + 1];
    hashOf(secret, h);
    hexOf(h, hex);
    snprintf(text, sizeof text,
             NODE_OK "raft:\n  secret_file: %s\nadmin:\n  token_sha256: " HASH_ADMIN
                     "\ntenants:\n  - name: demo\n    token_sha256: %s\n",
             path, hex);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    static const char want[] =
        "x.yaml:7:16: raft.secret_file: the secret is a token of tenant \"demo\"";
    if (strncmp(err, want, sizeof want - 1) != 0 || strstr(err, secret) != NULL) {
        fail_msg("got %s", err);
    }
    config_free(&c);

    /* The previous secret: with the current one, and not the same. */
    char path2[64];
    writeTemp(path2, "the-old-secret-of-the-raft-port-0123456789\n", 43);
    snprintf(text, sizeof text,
             NODE_OK "raft:\n  secret_file: %s\n  previous_secret_file: %s\n" ADMIN_OK TENANTS_OK,
             path, path2);
    if (parseStr(text, &c, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    assert_true(c.raft.secret.set && c.raft.previous_secret.set);
    assert_int_equal(c.raft.previous_secret.len, 42);
    config_free(&c);
    snprintf(text, sizeof text, NODE_OK "raft:\n  previous_secret_file: %s\n" ADMIN_OK TENANTS_OK,
             path2);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    static const char alone[] = "x.yaml:7:25: raft.previous_secret_file needs raft.secret_file";
    if (strncmp(err, alone, sizeof alone - 1) != 0) {
        fail_msg("got %s", err);
    }
    config_free(&c);
    snprintf(text, sizeof text,
             NODE_OK "raft:\n  secret_file: %s\n  previous_secret_file: %s\n" ADMIN_OK TENANTS_OK,
             path2, path2);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    static const char twice[] =
        "x.yaml:8:25: raft.previous_secret_file: the secret is raft.secret_file's";
    if (strncmp(err, twice, sizeof twice - 1) != 0) {
        fail_msg("got %s", err);
    }
    config_free(&c);
    /* The previous secret may not be the cluster secret either. */
    snprintf(text, sizeof text,
             NODE_OK "raft:\n  secret_file: %s\n  previous_secret_file: %s\nrpc:\n"
                     "  cluster_secret_file: %s\n" ADMIN_OK TENANTS_OK,
             path, path2, path2);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    static const char cluster[] =
        "x.yaml:8:25: raft.previous_secret_file: the secret is the cluster secret";
    if (strncmp(err, cluster, sizeof cluster - 1) != 0) {
        fail_msg("got %s", err);
    }
    config_free(&c);
    assert_int_equal(remove(path2), 0);
    assert_int_equal(remove(path), 0);

    /* Too short: the file:line:column of the value, never the bytes. */
    writeTemp(path, "short-secret\n", 13);
    snprintf(text, sizeof text, NODE_OK "raft:\n  secret_file: %s\n" ADMIN_OK TENANTS_OK, path);
    assert_int_equal(parseStr(text, &c, err, sizeof err), -1);
    if (strncmp(err, "x.yaml:7:16: raft.secret_file: ", 31) != 0 ||
        strstr(err, "holds 12 bytes") == NULL || strstr(err, "needs at least 32") == NULL ||
        strstr(err, "short-secret") != NULL) {
        fail_msg("got %s", err);
    }
    assert_false(c.raft.secret.set);
    config_free(&c);
    assert_int_equal(remove(path), 0);
}

/* log: level and format, their defaults, and the names refused. */
static void test_log_section(void **state)
{
    (void)state;
    struct config c;
    parseOk(MINIMAL, &c);
    assert_int_equal(c.log.level, LOG_LEVEL_INFO);
    assert_int_equal(c.log.format, LOG_FORMAT_TEXT);
    config_free(&c);
    parseOk(MINIMAL "log:\n  level: debug\n  format: json\n", &c);
    assert_int_equal(c.log.level, LOG_LEVEL_DEBUG);
    assert_int_equal(c.log.format, LOG_FORMAT_JSON);
    config_free(&c);
    parseOk(MINIMAL "log:\n  level: error\n", &c);
    assert_int_equal(c.log.level, LOG_LEVEL_ERROR);
    assert_int_equal(c.log.format, LOG_FORMAT_TEXT);
    config_free(&c);
    parseOk(MINIMAL "log:\n  level: warn\n  format: text\n", &c);
    assert_int_equal(c.log.level, LOG_LEVEL_WARN);
    config_free(&c);
    static const struct {
        const char *text, *err;
    } bad[] = {
        {MINIMAL "log:\n  level: verbose\n",
         "x.yaml:12:10: log.level: expected debug, info, warn or error, got \"verbose\""},
        {MINIMAL "log:\n  format: xml\n",
         "x.yaml:12:11: log.format: expected text or json, got \"xml\""},
        {MINIMAL "log:\n  level: [info]\n",
         "x.yaml:12:10: log.level: expected a string, got a list"},
        {MINIMAL "log:\n  colour: true\n", "x.yaml:12:3: unknown key \"colour\" in log"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512];
        assert_int_equal(parseStr(bad[i].text, &c, err, sizeof err), -1);
        assert_string_equal(err, bad[i].err);
        config_free(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_empty_values_are_defaults),
        cmocka_unit_test(test_address_forms),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_small_error_buffer),
        cmocka_unit_test(test_fd_budget),
        cmocka_unit_test(test_tenant_by_token_hash),
        cmocka_unit_test(test_many_tenants),
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_unreadable_file),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_load_error_names_the_file),
        cmocka_unit_test(test_proxy),
        cmocka_unit_test(test_mismatch_status_of_tenant_and_routes),
        cmocka_unit_test(test_cluster_secret),
        cmocka_unit_test(test_cluster_secret_transport),
        cmocka_unit_test(test_raft_secret),
        cmocka_unit_test(test_log_section),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
