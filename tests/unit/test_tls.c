/* Unit tests of client/tls_stream.c, the TLS stream of libidem and the daemon: a client and
 * a server stream pumping bytes to each other in memory (no sockets): handshake, data both
 * ways, the peer rule (addresses and names, SNI, wildcards, the server name override),
 * client certificates, close_notify and a bare end of stream, garbage, and the context
 * errors in each role's words. Certificates are made at test time with the openssl CLI in a
 * temp dir (removed at the end). */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pki.h"
#include "tls_stream.h"

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

static struct idem_tls_params params(enum idem_tls_role role, const char *cert, const char *key,
                                     const char *ca)
{
    struct idem_tls_params p = {.role = role, .cert_file = cert, .key_file = key, .ca_file = ca};
    return p;
}

static struct idem_tls_params serverParams(const char *ca)
{
    return params(IDEM_TLS_SERVER, pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], ca);
}

static struct idem_tls_params clientParams(const char *ca)
{
    return params(IDEM_TLS_CLIENT, NULL, NULL, ca);
}

/* Moves every pending byte from `from` to `to`; returns how many. */
static size_t pipeBytes(struct idem_tls *from, struct idem_tls *to)
{
    uint8_t buf[4096];
    size_t total = 0, n;
    while ((n = IdemTlsTake(from, buf, sizeof buf)) > 0) {
        assert_int_equal(IdemTlsFeed(to, buf, n), 0);
        total += n;
    }
    return total;
}

/* Runs the handshake to the end; returns the client's last result, *srv_rv (OUT) the
 * server's. */
static int handshake(struct idem_tls *cli, struct idem_tls *srv, int *srv_rv)
{
    uint8_t buf[64];
    int crv = IDEM_TLS_WANT;
    *srv_rv = IDEM_TLS_WANT;
    for (int round = 0; round < 20; round++) {
        crv = IdemTlsHandshake(cli);
        size_t moved = pipeBytes(cli, srv);
        int r = IdemTlsRead(srv, buf, sizeof buf); /* the server's handshake runs in read */
        if (r != IDEM_TLS_WANT) {
            *srv_rv = r;
        }
        moved += pipeBytes(srv, cli);
        if (crv == IDEM_TLS_ERROR || *srv_rv == IDEM_TLS_ERROR || (crv == 0 && moved == 0)) {
            break;
        }
    }
    if (*srv_rv == IDEM_TLS_WANT && IdemTlsEstablished(srv)) {
        *srv_rv = 0;
    }
    return crv;
}

static struct idem_tls_ctx *ctxNew(const struct idem_tls_params *p)
{
    char err[512];
    struct idem_tls_ctx *ctx = NULL;
    if (IdemTlsCtxNew(p, &ctx, err, sizeof err) != IDEM_OK) {
        fail_msg("ctx: %s", err);
    }
    assert_non_null(ctx);
    return ctx;
}

struct pair {
    struct idem_tls *srv, *cli;
};

static void pairOpen(struct pair *p, const struct idem_tls_params *s,
                     const struct idem_tls_params *c, const char *peer)
{
    struct idem_tls_ctx *sctx = ctxNew(s);
    struct idem_tls_ctx *cctx = ctxNew(c);
    p->srv = IdemTlsNew(sctx, NULL);
    p->cli = IdemTlsNew(cctx, peer);
    assert_non_null(p->srv);
    assert_non_null(p->cli);
    /* Streams keep their own reference: the contexts may go first. */
    IdemTlsCtxFree(sctx);
    IdemTlsCtxFree(cctx);
}

static void pairClose(struct pair *p)
{
    IdemTlsFree(p->srv);
    IdemTlsFree(p->cli);
}

/* Opens a pair and runs its handshake; returns the client's result (*srv_rv: the server's).
 * The pair stays open (pairClose). */
static int pairHandshake(struct pair *p, const struct idem_tls_params *s,
                         const struct idem_tls_params *c, const char *peer, int *srv_rv)
{
    pairOpen(p, s, c, peer);
    return handshake(p->cli, p->srv, srv_rv);
}

static void test_exchange(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(NULL);
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    static const char *const peers[] = {"127.0.0.1", "node1.test"};
    for (size_t k = 0; k < 2; k++) {
        struct pair p;
        int srv_rv;
        int crv = pairHandshake(&p, &s, &c, peers[k], &srv_rv);
        if (crv != 0) {
            fail_msg("handshake with %s: %d %s / server %d %s", peers[k], crv, IdemTlsErrmsg(p.cli),
                     srv_rv, IdemTlsErrmsg(p.srv));
        }
        assert_true(IdemTlsEstablished(p.cli));
        assert_null(IdemTlsVerifyError(p.cli));
        /* 200 KiB one way (several records, fed in one go), a short answer back. */
        size_t n = 200 * 1024;
        uint8_t *big = malloc(n), *got = malloc(n);
        assert_true(big && got);
        for (size_t i = 0; i < n; i++) {
            big[i] = (uint8_t)(i * 31 + 7);
        }
        assert_int_equal(IdemTlsWrite(p.cli, big, n), 0);
        assert_true(IdemTlsPending(p.cli) > n);
        pipeBytes(p.cli, p.srv);
        size_t have = 0;
        int r;
        while ((r = IdemTlsRead(p.srv, got + have, n - have)) > 0) {
            have += (size_t)r;
        }
        assert_int_equal(r, IDEM_TLS_WANT);
        assert_int_equal(have, n);
        assert_memory_equal(big, got, n);
        assert_int_equal(IdemTlsWrite(p.srv, (const uint8_t *)"pong", 4), 0);
        pipeBytes(p.srv, p.cli);
        uint8_t small[16];
        assert_int_equal(IdemTlsRead(p.cli, small, sizeof small), 4);
        assert_memory_equal(small, "pong", 4);
        /* close_notify: the server sees a clean end, even with the stream's end after it. */
        assert_int_equal(IdemTlsShutdown(p.cli), 0);
        pipeBytes(p.cli, p.srv);
        IdemTlsFeedEof(p.srv);
        assert_int_equal(IdemTlsRead(p.srv, small, sizeof small), IDEM_TLS_CLOSED);
        free(big);
        free(got);
        pairClose(&p);
    }
}

/* The end of the stream without close_notify: an error, in the handshake and after it. */
static void test_bare_end_of_stream(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(NULL);
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    struct pair p;
    pairOpen(&p, &s, &c, "127.0.0.1");
    assert_int_equal(IdemTlsHandshake(p.cli), IDEM_TLS_WANT);
    assert_true(IdemTlsPending(p.cli) > 0); /* the ClientHello */
    assert_int_equal(IdemTlsHandshake(p.cli), IDEM_TLS_WANT);
    IdemTlsFeedEof(p.cli);
    assert_int_equal(IdemTlsHandshake(p.cli), IDEM_TLS_ERROR);
    assert_non_null(strstr(IdemTlsErrmsg(p.cli), "unexpected eof"));
    assert_null(IdemTlsVerifyError(p.cli));
    pairClose(&p);

    int srv_rv;
    assert_int_equal(pairHandshake(&p, &s, &c, "127.0.0.1", &srv_rv), 0);
    uint8_t buf[16];
    assert_int_equal(IdemTlsRead(p.srv, buf, sizeof buf), IDEM_TLS_WANT);
    IdemTlsFeedEof(p.srv);
    assert_int_equal(IdemTlsRead(p.srv, buf, sizeof buf), IDEM_TLS_ERROR);
    assert_non_null(strstr(IdemTlsErrmsg(p.srv), "unexpected eof"));
    pairClose(&p);
}

/* Fails the handshake and checks the client's reasons: the verification result (`cert`)
 * both alone and in the error text. */
static void expectRefused(const struct idem_tls_params *s, const struct idem_tls_params *c,
                          const char *peer, const char *cert)
{
    struct pair p;
    int srv_rv;
    assert_int_equal(pairHandshake(&p, s, c, peer, &srv_rv), IDEM_TLS_ERROR);
    const char *vr = IdemTlsVerifyError(p.cli);
    if (vr == NULL || strcmp(vr, cert) != 0) {
        fail_msg("%s: verify error %s, want %s", peer, vr ? vr : "(none)", cert);
    }
    char want[200];
    snprintf(want, sizeof want, "certificate verify failed (certificate: %s)", cert);
    if (strstr(IdemTlsErrmsg(p.cli), want) == NULL) {
        fail_msg("%s: errmsg %s, want %s", peer, IdemTlsErrmsg(p.cli), want);
    }
    pairClose(&p);
}

static void test_wrong_peer_name_or_ca(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(NULL);
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    expectRefused(&s, &c, "127.0.0.2", "IP address mismatch"); /* not in the certificate */
    expectRefused(&s, &c, "node2.test", "hostname mismatch");
    /* An address is matched as an address only, never as a DNS name. */
    expectRefused(&s, &c, "::1", "IP address mismatch");
    struct idem_tls_params other = clientParams(pki.paths[PKI_OTHER_CA]);
    expectRefused(&s, &other, "127.0.0.1", "unable to get local issuer certificate");
    /* No ca_file: the system store, which does not know the test CA. */
    struct idem_tls_params sys = clientParams(NULL);
    expectRefused(&s, &sys, "127.0.0.1", "unable to get local issuer certificate");
}

/* A name goes out as SNI in the ClientHello; an address does not (RFC 6066 §3). */
static void test_sni(void **state)
{
    (void)state;
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    struct idem_tls_ctx *ctx = ctxNew(&c);
    static const struct {
        const char *peer;
        bool sni;
    } cases[] = {{"node1.test", true}, {"127.0.0.1", false}, {"::1", false}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct idem_tls *t = IdemTlsNew(ctx, cases[k].peer);
        assert_non_null(t);
        assert_int_equal(IdemTlsHandshake(t), IDEM_TLS_WANT);
        uint8_t hello[4096];
        size_t n = IdemTlsTake(t, hello, sizeof hello);
        assert_true(n > 0 && n < sizeof hello);
        bool found = memmem(hello, n, cases[k].peer, strlen(cases[k].peer)) != NULL;
        assert_int_equal(found, cases[k].sni);
        IdemTlsFree(t);
    }
    IdemTlsCtxFree(ctx);
}

/* A whole-label wildcard matches; a partial one (n*.part.test) does not. */
static void test_wildcards(void **state)
{
    (void)state;
    struct idem_tls_params s =
        params(IDEM_TLS_SERVER, pki.paths[PKI_WILD_CRT], pki.paths[PKI_SRV_KEY], NULL);
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    struct pair p;
    int srv_rv;
    assert_int_equal(pairHandshake(&p, &s, &c, "node1.wild.test", &srv_rv), 0);
    pairClose(&p);
    expectRefused(&s, &c, "node1.part.test", "hostname mismatch");
}

/* The context's server_name is what every certificate must carry, whatever the peer. */
static void test_server_name_override(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(NULL);
    struct idem_tls_params c = clientParams(pki.paths[PKI_CA_CRT]);
    c.server_name = "node1.test";
    struct pair p;
    int srv_rv;
    assert_int_equal(pairHandshake(&p, &s, &c, "127.0.0.2", &srv_rv), 0);
    pairClose(&p);
    c.server_name = "node2.test";
    expectRefused(&s, &c, "127.0.0.1", "hostname mismatch");
    /* No name at all is refused rather than checked against nothing. */
    c.server_name = NULL;
    struct idem_tls_ctx *ctx = ctxNew(&c);
    assert_null(IdemTlsNew(ctx, ""));
    IdemTlsCtxFree(ctx);
}

static void test_client_certificates(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(pki.paths[PKI_CA_CRT]);
    struct idem_tls_params with = params(IDEM_TLS_CLIENT, pki.paths[PKI_CLI_CRT],
                                         pki.paths[PKI_CLI_KEY], pki.paths[PKI_CA_CRT]);
    struct idem_tls_params without = clientParams(pki.paths[PKI_CA_CRT]);
    struct pair p;
    int srv_rv;
    assert_int_equal(pairHandshake(&p, &s, &with, "127.0.0.1", &srv_rv), 0);
    assert_int_equal(srv_rv, 0);
    pairClose(&p);
    pairHandshake(&p, &s, &without, "127.0.0.1", &srv_rv);
    assert_int_equal(srv_rv, IDEM_TLS_ERROR); /* the server refuses a client without one */
    assert_non_null(strstr(IdemTlsErrmsg(p.srv), "certificate"));
    pairClose(&p);
}

static void test_garbage(void **state)
{
    (void)state;
    struct idem_tls_params s = serverParams(NULL);
    struct idem_tls_ctx *ctx = ctxNew(&s);
    struct idem_tls *t = IdemTlsNew(ctx, NULL);
    assert_non_null(t);
    static const uint8_t frame[] = {0, 0, 0, 5, 0x08, 0x01, 0x1a, 0x01, 'x'};
    assert_int_equal(IdemTlsFeed(t, frame, sizeof frame), 0);
    uint8_t buf[64];
    assert_int_equal(IdemTlsRead(t, buf, sizeof buf), IDEM_TLS_ERROR);
    assert_true(IdemTlsErrmsg(t)[0] != '\0');
    assert_false(IdemTlsEstablished(t));
    /* Writing before the handshake is an error, not a wait. */
    assert_int_equal(IdemTlsWrite(t, frame, sizeof frame), IDEM_TLS_ERROR);
    IdemTlsFree(t);
    IdemTlsCtxFree(ctx);
}

/* IdemTlsCtxNew's result with p: `rv`, and err containing `want`. */
static void expectCtxError(struct idem_tls_params p, int rv, const char *want)
{
    char err[512] = "";
    struct idem_tls_ctx *ctx = (struct idem_tls_ctx *)1;
    assert_int_equal(IdemTlsCtxNew(&p, &ctx, err, sizeof err), rv);
    assert_null(ctx);
    if (strstr(err, want) == NULL) {
        fail_msg("error %s, want %s", err, want);
    }
}

static void test_ctx_errors(void **state)
{
    (void)state;
    const char *srv_crt = pki.paths[PKI_SRV_CRT], *srv_key = pki.paths[PKI_SRV_KEY];
    const char *cli_key = pki.paths[PKI_CLI_KEY];
    /* A server's files in the words of the daemon's tls: section. */
    enum idem_tls_role S = IDEM_TLS_SERVER, C = IDEM_TLS_CLIENT;
    expectCtxError(params(S, "/nonexistent/x.crt", srv_key, NULL), IDEM_ETLS,
                   "tls: cert_file /nonexistent/x.crt: ");
    expectCtxError(params(S, srv_crt, cli_key, NULL), IDEM_ETLS, "tls: key_file ");
    expectCtxError(params(S, srv_crt, srv_key, "/nonexistent/ca.crt"), IDEM_ETLS,
                   "tls: ca_file /nonexistent/ca.crt: ");
    expectCtxError(params(S, NULL, NULL, NULL), IDEM_EINVAL,
                   "tls: a TLS listener needs cert_file and key_file");
    /* A client's in the words of libidem's options. */
    expectCtxError(params(C, "/nonexistent/x.crt", srv_key, NULL), IDEM_ETLS,
                   "tls: certificate file /nonexistent/x.crt: ");
    expectCtxError(params(C, srv_crt, cli_key, NULL), IDEM_ETLS, "tls: key file ");
    expectCtxError(params(C, NULL, NULL, "/nonexistent/ca.crt"), IDEM_ETLS,
                   "tls: CA file /nonexistent/ca.crt: ");
    expectCtxError(params(C, srv_crt, NULL, NULL), IDEM_EINVAL,
                   "tls: a client certificate needs both cert and key files");
    /* A client without ca_file verifies against the system store (as the forwarder does). */
    struct idem_tls_params sys = params(C, NULL, NULL, NULL);
    IdemTlsCtxFree(ctxNew(&sys));
    /* err may be NULL (libidem's why). */
    struct idem_tls_params bad = params(C, NULL, NULL, "/nonexistent/ca.crt");
    struct idem_tls_ctx *ctx = NULL;
    assert_int_equal(IdemTlsCtxNew(&bad, &ctx, NULL, 0), IDEM_ETLS);
    assert_null(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exchange),
        cmocka_unit_test(test_bare_end_of_stream),
        cmocka_unit_test(test_wrong_peer_name_or_ca),
        cmocka_unit_test(test_sni),
        cmocka_unit_test(test_wildcards),
        cmocka_unit_test(test_server_name_override),
        cmocka_unit_test(test_client_certificates),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_ctx_errors),
    };
    return cmocka_run_group_tests(tests, setupPki, teardownPki);
}
