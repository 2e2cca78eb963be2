/* Unit tests of server/tls.c: a client and a server tls_conn pumping bytes to each other in
 * memory (no sockets): handshake, data both ways, verification of the server's address,
 * client certificates, close_notify, garbage, and the context errors. Certificates are
 * made at test time with the openssl CLI in a temp dir (removed at the end). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tls.h"
#include "pki.h"

static struct pki pki;

static int setupPki(void **state)
{
    (void)state;
    return pki_make(&pki, "idem-tls-unit");
}

static int teardownPki(void **state)
{
    (void)state;
    return pki_remove(&pki);
}

static struct config_tls tlsCfg(const char *cert, const char *key, const char *ca)
{
    struct config_tls t = {0};
    t.cert_file = (char *)cert;
    t.key_file = (char *)key;
    t.ca_file = (char *)ca;
    t.enabled = cert != NULL;
    t.rpc = true;
    return t;
}

/* Moves every pending byte from a to b; returns how many. */
static size_t pipeBytes(struct tls_conn *from, struct tls_conn *to)
{
    uint8_t buf[4096];
    size_t total = 0, n;
    while ((n = tls_conn_take(from, buf, sizeof buf)) > 0) {
        tls_conn_feed(to, buf, n);
        total += n;
    }
    return total;
}

/* Runs the handshake to the end; returns the client's last result, *srv_rv (OUT) the
 * server's. */
static int handshake(struct tls_conn *cli, struct tls_conn *srv, int *srv_rv)
{
    uint8_t buf[64];
    int crv = TLS_WANT;
    *srv_rv = TLS_WANT;
    for (int round = 0; round < 20; round++) {
        crv = tls_conn_handshake(cli);
        size_t moved = pipeBytes(cli, srv);
        int r = tls_conn_read(srv, buf, sizeof buf); /* the server's handshake runs in read */
        if (r != TLS_WANT) {
            *srv_rv = r;
        }
        moved += pipeBytes(srv, cli);
        if (crv == TLS_ERROR || *srv_rv == TLS_ERROR || (crv == 0 && moved == 0)) {
            break;
        }
    }
    if (*srv_rv == TLS_WANT && tls_conn_established(srv)) {
        *srv_rv = 0;
    }
    return crv;
}

struct pair {
    struct tls_ctx *sctx, *cctx;
    struct tls_conn *srv, *cli;
};

static void pairOpen(struct pair *p, const struct config_tls *s, const struct config_tls *c,
                     const char *peer)
{
    char err[512];
    p->sctx = tls_ctx_new(s, TLS_SERVER, err, sizeof err);
    if (p->sctx == NULL) {
        fail_msg("server ctx: %s", err);
    }
    p->cctx = tls_ctx_new(c, TLS_CLIENT, err, sizeof err);
    if (p->cctx == NULL) {
        fail_msg("client ctx: %s", err);
    }
    p->srv = tls_conn_new(p->sctx, NULL);
    p->cli = tls_conn_new(p->cctx, peer);
    /* Connections keep their own reference: the contexts may go first. */
    tls_ctx_free(p->sctx);
    tls_ctx_free(p->cctx);
}

static void pairClose(struct pair *p)
{
    tls_conn_free(p->srv);
    tls_conn_free(p->cli);
}

static void test_exchange(void **state)
{
    (void)state;
    struct config_tls s = tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], NULL);
    struct config_tls c = tlsCfg(NULL, NULL, pki.paths[PKI_CA_CRT]);
    static const char *const peers[] = {"127.0.0.1", "node1.test"};
    for (size_t k = 0; k < 2; k++) {
        struct pair p;
        pairOpen(&p, &s, &c, peers[k]);
        int srv_rv;
        int crv = handshake(p.cli, p.srv, &srv_rv);
        if (crv != 0) {
            fail_msg("handshake with %s: %d %s / server %d %s", peers[k], crv,
                     tls_conn_errmsg(p.cli), srv_rv, tls_conn_errmsg(p.srv));
        }
        assert_true(tls_conn_established(p.cli));
        /* 200 KiB one way (several records, fed in one go), a short answer back. */
        size_t n = 200 * 1024;
        uint8_t *big = malloc(n), *got = malloc(n);
        assert_true(big && got);
        for (size_t i = 0; i < n; i++) {
            big[i] = (uint8_t)(i * 31 + 7);
        }
        assert_int_equal(tls_conn_write(p.cli, big, n), 0);
        assert_true(tls_conn_pending(p.cli) > n);
        pipeBytes(p.cli, p.srv);
        size_t have = 0;
        int r;
        while ((r = tls_conn_read(p.srv, got + have, n - have)) > 0) {
            have += (size_t)r;
        }
        assert_int_equal(r, TLS_WANT);
        assert_int_equal(have, n);
        assert_memory_equal(big, got, n);
        assert_int_equal(tls_conn_write(p.srv, (const uint8_t *)"pong", 4), 0);
        pipeBytes(p.srv, p.cli);
        uint8_t small[16];
        assert_int_equal(tls_conn_read(p.cli, small, sizeof small), 4);
        assert_memory_equal(small, "pong", 4);
        /* close_notify: the server sees a clean end. */
        assert_int_equal(tls_conn_shutdown(p.cli), 0);
        pipeBytes(p.cli, p.srv);
        assert_int_equal(tls_conn_read(p.srv, small, sizeof small), TLS_CLOSED);
        free(big);
        free(got);
        pairClose(&p);
    }
}

static void test_wrong_peer_name_or_ca(void **state)
{
    (void)state;
    struct config_tls s = tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], NULL);
    struct config_tls c = tlsCfg(NULL, NULL, pki.paths[PKI_CA_CRT]);
    struct pair p;
    int srv_rv;
    pairOpen(&p, &s, &c, "127.0.0.2"); /* not in the certificate */
    assert_int_equal(handshake(p.cli, p.srv, &srv_rv), TLS_ERROR);
    assert_non_null(strstr(tls_conn_errmsg(p.cli), "certificate"));
    pairClose(&p);
    pairOpen(&p, &s, &c, "node2.test");
    assert_int_equal(handshake(p.cli, p.srv, &srv_rv), TLS_ERROR);
    pairClose(&p);
    struct config_tls other = tlsCfg(NULL, NULL, pki.paths[PKI_OTHER_CA]);
    pairOpen(&p, &s, &other, "127.0.0.1");
    assert_int_equal(handshake(p.cli, p.srv, &srv_rv), TLS_ERROR);
    assert_non_null(strstr(tls_conn_errmsg(p.cli), "certificate"));
    pairClose(&p);
    /* No ca_file: the system store, which does not know the test CA. */
    struct config_tls sys = tlsCfg(NULL, NULL, NULL);
    pairOpen(&p, &s, &sys, "127.0.0.1");
    assert_int_equal(handshake(p.cli, p.srv, &srv_rv), TLS_ERROR);
    assert_non_null(strstr(tls_conn_errmsg(p.cli), "certificate"));
    pairClose(&p);
}

static void test_client_certificates(void **state)
{
    (void)state;
    struct config_tls s =
        tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], pki.paths[PKI_CA_CRT]);
    struct config_tls with =
        tlsCfg(pki.paths[PKI_CLI_CRT], pki.paths[PKI_CLI_KEY], pki.paths[PKI_CA_CRT]);
    struct config_tls without = tlsCfg(NULL, NULL, pki.paths[PKI_CA_CRT]);
    struct pair p;
    int srv_rv;
    pairOpen(&p, &s, &with, "127.0.0.1");
    assert_int_equal(handshake(p.cli, p.srv, &srv_rv), 0);
    assert_int_equal(srv_rv, 0);
    pairClose(&p);
    pairOpen(&p, &s, &without, "127.0.0.1");
    handshake(p.cli, p.srv, &srv_rv);
    assert_int_equal(srv_rv, TLS_ERROR); /* the server refuses a client without one */
    pairClose(&p);
}

static void test_garbage(void **state)
{
    (void)state;
    struct config_tls s = tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], NULL);
    char err[512];
    struct tls_ctx *ctx = tls_ctx_new(&s, TLS_SERVER, err, sizeof err);
    assert_non_null(ctx);
    struct tls_conn *t = tls_conn_new(ctx, NULL);
    static const uint8_t frame[] = {0, 0, 0, 5, 0x08, 0x01, 0x1a, 0x01, 'x'};
    tls_conn_feed(t, frame, sizeof frame);
    uint8_t buf[64];
    assert_int_equal(tls_conn_read(t, buf, sizeof buf), TLS_ERROR);
    assert_true(tls_conn_errmsg(t)[0] != '\0');
    assert_false(tls_conn_established(t));
    tls_conn_free(t);
    tls_ctx_free(ctx);
}

static void test_ctx_errors(void **state)
{
    (void)state;
    char err[512];
    struct config_tls bad = tlsCfg("/nonexistent/x.crt", pki.paths[PKI_SRV_KEY], NULL);
    assert_null(tls_ctx_new(&bad, TLS_SERVER, err, sizeof err));
    assert_non_null(strstr(err, "tls: cert_file /nonexistent/x.crt: "));
    bad = tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_CLI_KEY], NULL);
    assert_null(tls_ctx_new(&bad, TLS_SERVER, err, sizeof err));
    assert_non_null(strstr(err, "tls: key_file "));
    bad = tlsCfg(pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], "/nonexistent/ca.crt");
    assert_null(tls_ctx_new(&bad, TLS_SERVER, err, sizeof err));
    assert_non_null(strstr(err, "tls: ca_file /nonexistent/ca.crt: "));
    bad = tlsCfg(NULL, NULL, NULL);
    assert_null(tls_ctx_new(&bad, TLS_SERVER, err, sizeof err));
    /* A client without ca_file verifies against the system store (as the forwarder does). */
    struct tls_ctx *sys = tls_ctx_new(&bad, TLS_CLIENT, err, sizeof err);
    assert_non_null(sys);
    tls_ctx_free(sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exchange),          cmocka_unit_test(test_wrong_peer_name_or_ca),
        cmocka_unit_test(test_client_certificates), cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_ctx_errors),
    };
    return cmocka_run_group_tests(tests, setupPki, teardownPki);
}
