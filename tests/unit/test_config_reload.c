/* server/config_reload.c: what a reload takes from a file read again and what it keeps
 * (config_reload_merge), with the checks of the kept values against the new ones, the log
 * section's level, and configuration references. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "config.h"
#include "config_reload.h"

#define HASH_ADMIN "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define HASH_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HASH_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

#define NODE(id)                                                                                   \
    "node:\n"                                                                                      \
    "  id: " id "\n"                                                                               \
    "  raft_address: 127.0.0.1:9001\n"                                                             \
    "  rpc_address: 127.0.0.1:7001\n"                                                              \
    "  http_address: 127.0.0.1:8001\n"                                                             \
    "  data_dir: /tmp/idem\n"
#define ADMIN "admin:\n  token_sha256: " HASH_ADMIN "\n"

static void parseOk(const char *text, struct config *out)
{
    char err[512];
    if (config_parse("x.yaml", text, strlen(text), out, err, sizeof err) != 0) {
        fail_msg("config_parse failed: %s", err);
    }
}

/* The keys config_reload_merge named, joined with spaces. */
struct kept {
    char keys[1024];
};

static void keptCb(void *arg, const char *key)
{
    struct kept *k = arg;
    size_t n = strlen(k->keys);
    snprintf(k->keys + n, sizeof k->keys - n, "%s%s", n ? " " : "", key);
}

/* Merges `next_text` into `cur_text`'s running configuration: the return code, the kept keys
 * in k and the message in err; *next (OUT) is the merged configuration (the caller frees it). */
static int merge(const char *cur_text, const char *next_text, struct config *next, struct kept *k,
                 char *err, size_t errlen)
{
    struct config cur;
    parseOk(cur_text, &cur);
    parseOk(next_text, next);
    memset(k, 0, sizeof *k);
    int rc = config_reload_merge(next, &cur, "x.yaml", keptCb, k, err, errlen);
    config_free(&cur);
    return rc;
}

static void test_log_level(void **state)
{
    (void)state;
    struct config c;
    parseOk(NODE("1") ADMIN "tenants: [{name: a, token_sha256: " HASH_A "}]\n", &c);
    assert_int_equal(c.log.level, LOG_LEVEL_INFO);
    config_free(&c);
    parseOk(NODE("1") ADMIN "tenants: [{name: a, token_sha256: " HASH_A "}]\nlog:\n  level: warn\n",
            &c);
    assert_int_equal(c.log.level, LOG_LEVEL_WARN);
    config_free(&c);
    char err[256];
    const char *bad =
        NODE("1") ADMIN "tenants: [{name: a, token_sha256: " HASH_A "}]\nlog:\n  level: loud\n";
    assert_int_equal(config_parse("x.yaml", bad, strlen(bad), &c, err, sizeof err), -1);
    assert_string_equal(err, "x.yaml:11:10: log.level: expected debug, info, warn or error, got "
                             "\"loud\"");
}

/* The running file: two tenants, raft and rpc settings, a proxy listener. */
#define CUR_TEXT                                                                                   \
    NODE("1")                                                                                      \
    "cluster:\n"                                                                                   \
    "  bootstrap: [{id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}]\n"          \
    "raft:\n  election_timeout_ms: 1000\n"                                                         \
    "rpc:\n  max_connections: 100\n" ADMIN "tenants:\n"                                            \
    "  - {name: a, token_sha256: " HASH_A "}\n"                                                    \
    "  - {name: b, token_sha256: " HASH_B ", max_records: 5}\n"                                    \
    "proxy:\n"                                                                                     \
    "  - address: 127.0.0.1:8101\n"                                                                \
    "    routes: [{upstream: 'http://127.0.0.1:9999', tenant: b}]\n"
/* CUR_TEXT's route with fingerprint pointers (a kept route keeps them: routeCopy). */
#define CUR_FP_TEXT(x)                                                                             \
    NODE("1")                                                                                      \
    "cluster:\n"                                                                                   \
    "  bootstrap: [{id: 1, raft_address: 127.0.0.1:9001, rpc_address: 127.0.0.1:7001}]\n"          \
    "raft:\n  election_timeout_ms: 1000\n"                                                         \
    "rpc:\n  max_connections: 100\n" ADMIN "tenants:\n"                                            \
    "  - {name: a, token_sha256: " HASH_A "}\n"                                                    \
    "  - {name: b, token_sha256: " HASH_B ", max_records: 5}\n"                                    \
    "proxy:\n"                                                                                     \
    "  - address: 127.0.0.1:8101\n"                                                                \
    "    routes: [{upstream: 'http://127.0.0.1:9999', tenant: b, fingerprint_ignore: [/ts],\n"     \
    "              fingerprint_fields: [" x "]}]\n"

static void test_nothing_changed(void **state)
{
    (void)state;
    struct config next;
    struct kept k;
    char err[256];
    assert_int_equal(merge(CUR_TEXT, CUR_TEXT, &next, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "");
    config_free(&next);
}

/* A new file that changes the node id (in its bootstrap entry too), a Raft timing, an RPC
 * cap, the listener's address (and its route), the tenants (a's tokens rotated, b's quota, c
 * added) and the log level: the first four are kept and named (the listener whole, with its
 * running route), the rest taken. */
static void test_keeps_restart_only(void **state)
{
    (void)state;
    const char *next_text =
        NODE("7") "cluster:\n"
                  "  bootstrap: [{id: 7, raft_address: 127.0.0.1:9001, rpc_address: "
                  "127.0.0.1:7001}]\n"
                  "raft:\n  election_timeout_ms: 2000\n"
                  "rpc:\n  max_connections: 200\n" ADMIN "tenants:\n"
                  "  - {name: a, token_sha256: [" HASH_A ", " HASH_B "]}\n"
                  "  - {name: b, token_sha256: "
                  "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc, "
                  "max_records: 9}\n"
                  "  - {name: c, token_sha256: "
                  "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd}\n"
                  "proxy:\n"
                  "  - address: 127.0.0.1:8102\n"
                  "    routes: [{upstream: 'http://127.0.0.1:9998', tenant: c}]\n"
                  "log: {level: error}\n";
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(CUR_TEXT, next_text, &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "node.id raft.election_timeout_ms rpc.max_connections "
                                "cluster.bootstrap proxy (the listeners' addresses)");
    assert_int_equal(n.node.id, 1);
    assert_int_equal(n.cluster.n_bootstrap, 1);
    assert_int_equal(n.cluster.bootstrap[0].id, 1);
    assert_int_equal(n.raft.election_timeout_ms, 1000);
    assert_int_equal(n.rpc.max_connections, 100);
    assert_string_equal(n.proxies[0].address.text, "127.0.0.1:8101");
    /* taken from the file */
    assert_int_equal(n.n_tenants, 3);
    assert_int_equal(n.tenants[0].n_token_hashes, 2);
    assert_int_equal(n.tenants[1].max_records, 9);
    assert_string_equal(n.proxies[0].routes[0].upstream, "http://127.0.0.1:9999");
    assert_string_equal(n.tenants[n.proxies[0].routes[0].tenant].name, "b");
    assert_int_equal(n.log.level, LOG_LEVEL_ERROR);
    config_free(&n);
}

/* Two listeners listed in the other order, their routes changed: each listener takes its own
 * routes from the file (found by its address), nothing is named. */
static void test_listeners_reordered(void **state)
{
    (void)state;
    const char *tail = ADMIN "tenants: [{name: a, token_sha256: " HASH_A "}]\n";
    char cur[1024], next[1024];
    snprintf(cur, sizeof cur,
             "%s%sproxy:\n"
             "  - {address: 127.0.0.1:8101, routes: [{upstream: 'http://127.0.0.1:1', tenant: a}]}\n"
             "  - {address: 127.0.0.1:8102, routes: [{upstream: 'http://127.0.0.1:2', tenant: a}]}\n",
             NODE("1"), tail);
    snprintf(next, sizeof next,
             "%s%sproxy:\n"
             "  - {address: 127.0.0.1:8102, routes: [{upstream: 'http://127.0.0.1:22', tenant: a}]}\n"
             "  - {address: 127.0.0.1:8101, routes: [{upstream: 'http://127.0.0.1:11', tenant: a}]}\n",
             NODE("1"), tail);
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(cur, next, &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "");
    assert_int_equal(n.n_proxies, 2);
    assert_string_equal(n.proxies[0].address.text, "127.0.0.1:8101");
    assert_string_equal(n.proxies[0].routes[0].upstream, "http://127.0.0.1:11");
    assert_string_equal(n.proxies[1].address.text, "127.0.0.1:8102");
    assert_string_equal(n.proxies[1].routes[0].upstream, "http://127.0.0.1:22");
    config_free(&n);
}

/* The listen addresses are a restart's too: named and kept (a file without them means the
 * advertised addresses, so leaving one out changes it as well). */
static void test_listen_addresses_kept(void **state)
{
    (void)state;
    const char *tail = ADMIN "tenants: [{name: a, token_sha256: " HASH_A "}]\n";
    char cur[1024], next[1024];
    snprintf(cur, sizeof cur, "%s  raft_listen: 0.0.0.0:9001\n%s", NODE("1"), tail);
    snprintf(next, sizeof next, "%s  rpc_listen: '[::]:7001'\n%s", NODE("1"), tail);
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(cur, next, &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "node.raft_listen node.rpc_listen");
    assert_string_equal(n.node.raft_listen.text, "0.0.0.0:9001");
    assert_string_equal(n.node.rpc_listen.text, "127.0.0.1:7001");
    config_free(&n);
}

/* One proxy listener more in the file: the running ones are kept whole, their routes found
 * again by tenant name in the new tenants (b moved to index 0). */
static void test_listeners_kept(void **state)
{
    (void)state;
    const char *next_text = NODE("1") "cluster:\n"
                                      "  bootstrap: [{id: 1, raft_address: 127.0.0.1:9001, "
                                      "rpc_address: 127.0.0.1:7001}]\n"
                                      "raft:\n  election_timeout_ms: 1000\n"
                                      "rpc:\n  max_connections: 100\n" ADMIN "tenants:\n"
                                      "  - {name: b, token_sha256: " HASH_B "}\n"
                                      "  - {name: a, token_sha256: " HASH_A "}\n"
                                      "proxy:\n"
                                      "  - address: 127.0.0.1:8101\n"
                                      "    routes: [{upstream: 'http://127.0.0.1:1', tenant: a}]\n"
                                      "  - address: 127.0.0.1:8102\n"
                                      "    routes: [{upstream: 'http://127.0.0.1:2', tenant: a}]\n";
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(CUR_TEXT, next_text, &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "proxy (the number of listeners)");
    assert_int_equal(n.n_proxies, 1);
    assert_int_equal(n.proxies[0].n_routes, 1);
    assert_string_equal(n.proxies[0].routes[0].upstream, "http://127.0.0.1:9999");
    assert_int_equal(n.proxies[0].routes[0].tenant, 0);
    assert_string_equal(n.tenants[0].name, "b");
    config_free(&n);

    /* The kept route keeps its fingerprint pointers (a deep copy: freed once each). */
    assert_int_equal(merge(CUR_FP_TEXT("/amount, /ts"), next_text, &n, &k, err, sizeof err), 0);
    const struct config_proxy_route *r = &n.proxies[0].routes[0];
    assert_int_equal(r->n_fingerprint_ignore, 1);
    assert_string_equal(r->fingerprint_ignore[0], "/ts");
    assert_int_equal(r->n_fingerprint_fields, 2);
    assert_string_equal(r->fingerprint_fields[1], "/ts");
    config_free(&n);
    /* The same listener: its pointers are the file's, taken live. */
    assert_int_equal(
        merge(CUR_FP_TEXT("/amount"), CUR_FP_TEXT("/id, /amount, /x"), &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "");
    assert_int_equal(n.proxies[0].routes[0].n_fingerprint_fields, 3);
    assert_string_equal(n.proxies[0].routes[0].fingerprint_fields[2], "/x");
    config_free(&n);

    /* b gone: the kept route has no tenant any more */
    const char *no_b = NODE("1") "cluster:\n"
                                 "  bootstrap: [{id: 1, raft_address: 127.0.0.1:9001, "
                                 "rpc_address: 127.0.0.1:7001}]\n"
                                 "raft:\n  election_timeout_ms: 1000\n"
                                 "rpc:\n  max_connections: 100\n" ADMIN "tenants:\n"
                                 "  - {name: a, token_sha256: " HASH_A "}\n";
    assert_int_equal(merge(CUR_TEXT, no_b, &n, &k, err, sizeof err), -1);
    assert_string_equal(err, "x.yaml: proxy[0].routes[0] (kept until a restart: the proxy "
                             "listeners changed) serves tenant \"b\", which the file no longer "
                             "has");
    config_free(&n);
}

/* tls.rpc stays on: a file without the tls section cannot be taken. */
static void test_tls_switch_needs_files(void **state)
{
    (void)state;
    const char *tenants = "tenants: [{name: a, token_sha256: " HASH_A "}]\n";
    char cur[1024], next[1024];
    snprintf(cur, sizeof cur, "%s%s%s%s", NODE("1"), ADMIN, tenants,
             "tls: {cert_file: /c.pem, key_file: /k.pem, rpc: true}\n");
    snprintf(next, sizeof next, "%s%s%s", NODE("1"), ADMIN, tenants);
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(cur, next, &n, &k, err, sizeof err), -1);
    assert_string_equal(k.keys, "tls.rpc");
    assert_string_equal(err, "x.yaml: tls.rpc stays on until a restart and needs cert_file and "
                             "key_file, which the file no longer has");
    config_free(&n);
    /* the files moved: taken, the switch kept on */
    snprintf(next, sizeof next, "%s%s%s%s", NODE("1"), ADMIN, tenants,
             "tls: {cert_file: /c2.pem, key_file: /k2.pem, rpc: true}\n");
    assert_int_equal(merge(cur, next, &n, &k, err, sizeof err), 0);
    assert_string_equal(k.keys, "");
    assert_string_equal(n.tls.cert_file, "/c2.pem");
    assert_true(n.tls.rpc);
    config_free(&n);
}

/* A secret file (mode 600) holding `value`, at path (OUT). */
static void secretFile(char path[64], const char *value)
{
    snprintf(path, 64, "/tmp/idem-reload-secret.XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, value, strlen(value)), (ssize_t)strlen(value));
    close(fd);
}

/* The cluster secret kept (its file changed) must still differ from every token in the new
 * file; the message names the field, never the hash. */
static void test_kept_secret_vs_tokens(void **state)
{
    (void)state;
    const char *s1 = "the first cluster secret, long enough";
    char p1[64], p2[64], hex[65], cur[2048], next[2048];
    secretFile(p1, s1);
    secretFile(p2, "the second cluster secret, long enough");
    uint8_t h[32];
    unsigned int hl = 0;
    assert_int_equal(EVP_Digest(s1, strlen(s1), h, &hl, EVP_sha256(), NULL), 1);
    for (int i = 0; i < 32; i++) {
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    }
    snprintf(cur, sizeof cur,
             "%s%srpc: {cluster_secret_file: %s, insecure_cluster_secret: true}\n"
             "tenants: [{name: a, token_sha256: " HASH_A "}]\n",
             NODE("1"), ADMIN, p1);
    snprintf(next, sizeof next,
             "%s%srpc: {cluster_secret_file: %s, insecure_cluster_secret: true}\n"
             "tenants: [{name: a, token_sha256: %s}]\n",
             NODE("1"), ADMIN, p2, hex);
    struct config n;
    struct kept k;
    char err[256];
    assert_int_equal(merge(cur, next, &n, &k, err, sizeof err), -1);
    assert_string_equal(k.keys, "rpc.cluster_secret_file");
    assert_string_equal(err, "x.yaml: a token in the file is the secret of "
                             "rpc.cluster_secret_file (kept until a restart); every token must "
                             "differ from it");
    assert_null(strstr(err, hex));
    config_free(&n);
    unlink(p1);
    unlink(p2);
}

static void test_refs(void **state)
{
    (void)state;
    struct config_ref *r = config_ref_new();
    parseOk(CUR_TEXT, &r->cfg);
    assert_ptr_equal(config_ref_hold(r), r);
    assert_int_equal(r->refs, 2);
    config_ref_drop(r);
    assert_int_equal(r->refs, 1);
    config_ref_drop(r); /* frees: LeakSanitizer checks */
    config_ref_drop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_level),
        cmocka_unit_test(test_nothing_changed),
        cmocka_unit_test(test_keeps_restart_only),
        cmocka_unit_test(test_listeners_kept),
        cmocka_unit_test(test_listeners_reordered),
        cmocka_unit_test(test_listen_addresses_kept),
        cmocka_unit_test(test_tls_switch_needs_files),
        cmocka_unit_test(test_kept_secret_vs_tokens),
        cmocka_unit_test(test_refs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
