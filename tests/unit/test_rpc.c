/* Unit tests of server/rpc.c's per-connection limits, with a stand-in for service_handle()
 * that holds every request until the test answers it: a connection never has more than
 * 4096 requests awaiting an answer, even when one read brings tens of thousands of frames
 * (those wait in the frame buffer, or in the TLS engine, and are taken up as answers go
 * out, with no more bytes from the peer); a frame buffer that one large frame grew goes
 * back to 64 KiB; rpc_get_stats() counts connections, requests, buffer memory and the
 * answers by outcome. The listener binds 127.0.0.1; the client is a thread with a blocking
 * socket (and OpenSSL for the TLS case, with certificates made in a temporary directory
 * removed at the end). */
#define _GNU_SOURCE /* usleep */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <uv.h>

#include "idem.pb-c.h"
#include "pki.h"
#include "rpc.h"
#include "service.h"

#define MAX_INFLIGHT 4096  /* rpc.c's CONN_MAX_INFLIGHT */
#define BUF_MIN 65536      /* rpc.c's CONN_BUF_MIN */
#define BIG_KEY (1u << 20) /* the first frame's key: grows the frame buffer past 1 MiB */
#define SMALL_FRAMES 20000 /* then this many small frames, sent at once */
#define QUIET_MS 300       /* no new request for this long: the server has stopped taking */

static struct pki pki;

/* ---- the stand-in service: holds requests until answerAll() ---- */

struct held {
    service_done_cb cb;
    void *data;
    uint64_t id;
};
static struct held *held;
static size_t n_held, cap_held;
static unsigned handled; /* requests handed to service_handle() */
static unsigned digested; /* of them, with their token's digest (stand-in: fakeDigest) */

/* The stand-in's "digest" of a token: its length and bytes, repeated. */
static void fakeDigest(const uint8_t *tok, size_t len, uint8_t out[32])
{
    for (size_t i = 0; i < 32; i++) {
        out[i] = (uint8_t)(len + (len > 0 ? tok[i % len] : 0));
    }
}

void service_handle(struct service *s, const Idem__Request *req, const uint8_t *token_sha256,
                    service_done_cb cb, void *data)
{
    (void)s;
    if (token_sha256 != NULL) { /* then it is this request's token's */
        uint8_t want[32];
        fakeDigest(req->auth_token.data, req->auth_token.len, want);
        assert_memory_equal(token_sha256, want, 32);
        digested++;
    }
    if (n_held == cap_held) {
        cap_held = cap_held ? cap_held * 2 : 1024;
        held = realloc(held, cap_held * sizeof(*held));
        assert_non_null(held);
    }
    held[n_held++] = (struct held){cb, data, req->request_id};
    handled++;
}

/* Every non-empty token is a tenant's (rpc_frames.c asks before it decodes a frame). */
enum service_credential service_credential_of(const struct service *s, const uint8_t *token,
                                              size_t len, uint8_t *sha256)
{
    (void)s;
    if (len > 0) {
        fakeDigest(token, len, sha256);
    }
    return len > 0 ? SERVICE_CREDENTIAL_TENANT : SERVICE_CREDENTIAL_NONE;
}

/* No member addresses: the client is a client (rpc.c asks for them). */
size_t service_member_addrs(const struct service *s, struct rpc_admit_addr *out, size_t cap)
{
    (void)s;
    (void)out;
    (void)cap;
    return 0;
}

static void answerAll(void)
{
    struct held *list = held;
    size_t n = n_held;
    held = NULL;
    n_held = cap_held = 0;
    for (size_t i = 0; i < n; i++) {
        Idem__Result res = IDEM__RESULT__INIT;
        Idem__Response resp = IDEM__RESPONSE__INIT;
        res.outcome = IDEM__OUTCOME__OUTCOME_NOT_FOUND;
        resp.request_id = list[i].id;
        resp.result = &res;
        list[i].cb(list[i].data, &resp);
    }
    free(list);
}

/* ---- the client thread ---- */

struct client {
    int port;
    bool tls;
    atomic_bool grown;        /* the test saw the frame buffer hold most of the large frame */
    atomic_bool answered_all; /* every answer read, each id once */
    atomic_bool may_close;    /* the test has looked at the open connection's figures */
    atomic_bool done;
    char err[256]; /* empty: no failure */
    unsigned answers;
};

static size_t putFrame(uint8_t *p, uint64_t id, const uint8_t *key, size_t keylen)
{
    Idem__GetRequest get = IDEM__GET_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    get.key.data = (uint8_t *)key;
    get.key.len = keylen;
    req.request_id = id;
    req.auth_token.data = (uint8_t *)"token";
    req.auth_token.len = 5;
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &get;
    size_t n = idem__request__pack(&req, p + 4);
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
    return 4 + n;
}

static int ioAll(struct client *cl, int fd, SSL *ssl, uint8_t *p, size_t n, bool writing)
{
    while (n > 0) {
        int chunk = n > (1u << 20) ? (1 << 20) : (int)n;
        ssize_t got;
        if (ssl != NULL) {
            got = writing ? SSL_write(ssl, p, chunk) : SSL_read(ssl, p, chunk);
        } else {
            got =
                writing ? send(fd, p, (size_t)chunk, MSG_NOSIGNAL) : recv(fd, p, (size_t)chunk, 0);
        }
        if (got <= 0) {
            snprintf(cl->err, sizeof cl->err, "%s failed after %u answers (%zd)",
                     writing ? "write" : "read", cl->answers, got);
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static void *clientMain(void *arg)
{
    struct client *cl = arg;
    SSL_CTX *ctx = NULL;
    SSL *ssl = NULL;
    uint8_t *out = NULL, *seen = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {60, 0}; /* a server that stops answering fails the test, not hangs */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cl->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(cl->err, sizeof cl->err, "connect failed");
        goto out;
    }
    if (cl->tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        SSL_CTX_load_verify_locations(ctx, pki.paths[PKI_CA_CRT], NULL);
        ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) != 1) {
            snprintf(cl->err, sizeof cl->err, "TLS handshake failed");
            goto out;
        }
    }
    /* Most of the large frame; once the server holds it, the rest and the small frames as
     * one write. */
    uint8_t *key = calloc(1, BIG_KEY);
    out = malloc(BIG_KEY + 64 + (size_t)SMALL_FRAMES * 32);
    size_t n = putFrame(out, 1, key, BIG_KEY);
    free(key);
    for (uint64_t id = 2; id <= SMALL_FRAMES + 1; id++) {
        n += putFrame(out + n, id, (const uint8_t *)"k", 1);
    }
    size_t first = BIG_KEY - 4096;
    if (ioAll(cl, fd, ssl, out, first, true) != 0) {
        goto out;
    }
    for (int i = 0; i < 60000 && !atomic_load(&cl->grown); i++) {
        usleep(1000);
    }
    if (ioAll(cl, fd, ssl, out + first, n - first, true) != 0) {
        goto out;
    }
    seen = calloc(SMALL_FRAMES + 2, 1);
    while (cl->answers < SMALL_FRAMES + 1) {
        uint8_t hdr[4], body[256];
        if (ioAll(cl, fd, ssl, hdr, 4, false) != 0) {
            goto out;
        }
        uint32_t len =
            (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
        if (len > sizeof body || ioAll(cl, fd, ssl, body, len, false) != 0) {
            snprintf(cl->err + strlen(cl->err), sizeof cl->err - strlen(cl->err),
                     " (answer frame of %u bytes)", len);
            goto out;
        }
        Idem__Response *resp = idem__response__unpack(NULL, len, body);
        uint64_t id = resp != NULL ? resp->request_id : 0;
        idem__response__free_unpacked(resp, NULL);
        if (id < 1 || id > SMALL_FRAMES + 1 || seen[id]) {
            snprintf(cl->err, sizeof cl->err, "answer %u: request id %llu unknown or repeated",
                     cl->answers, (unsigned long long)id);
            goto out;
        }
        seen[id] = 1;
        cl->answers++;
    }
    atomic_store(&cl->answered_all, true);
    for (int i = 0; i < 60000 && !atomic_load(&cl->may_close); i++) {
        usleep(1000);
    }
out:
    if (ssl != NULL) {
        SSL_free(ssl);
    }
    SSL_CTX_free(ctx);
    close(fd);
    free(out);
    free(seen);
    atomic_store(&cl->done, true);
    return NULL;
}

/* ---- the server side ---- */

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int freePort(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void serverClosed(void *data)
{
    *(bool *)data = true;
}

/* One client sends a 1 MiB frame, then SMALL_FRAMES small ones at once, and reads every
 * answer; the service answers only once nothing new has come for QUIET_MS. */
static void runBurst(bool tls)
{
    handled = 0;
    digested = 0;
    struct rpc_stats before;
    rpc_get_stats(&before);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct config_rpc cfg = {.max_frame_bytes = (4u << 20) + (128u << 10),
                             .default_deadline_ms = 2000,
                             .max_deadline_ms = 60000,
                             .max_connections = 16,
                             .idle_timeout_ms = 300000,
                             .handshake_timeout_ms = 5000,
                             .first_frame_timeout_ms = 5000,
                             .max_connections_per_address = 16,
                             .member_connections = 4,
                             .unauthenticated_max_frame_bytes = 65536,
                             .max_frame_buffer_mb = 256,
                             .max_answer_buffer_mb = 1024};
    struct config_tls tcfg = {.enabled = tls, .rpc = tls};
    tcfg.cert_file = pki.paths[PKI_SRV_CRT];
    tcfg.key_file = pki.paths[PKI_SRV_KEY];
    struct config_addr addr = {.host = "127.0.0.1"};
    struct rpc_server *r = NULL;
    char err[256] = "";
    for (int attempt = 0; attempt < 5 && r == NULL; attempt++) {
        addr.port = (uint16_t)freePort();
        snprintf(addr.text, sizeof addr.text, "127.0.0.1:%u", addr.port);
        r = rpc_server_new(&loop, &addr, &cfg, &tcfg, NULL, err, sizeof err);
    }
    if (r == NULL) {
        fail_msg("rpc_server_new: %s", err);
    }

    struct client cl = {.port = addr.port, .tls = tls};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, clientMain, &cl), 0);
    size_t max_held = 0;
    unsigned seen_handled = 0;
    uint64_t quiet_since = nowMs(), deadline = nowMs() + 120000;
    while (!atomic_load(&cl.answered_all) && !atomic_load(&cl.done) && nowMs() < deadline) {
        uv_run(&loop, UV_RUN_NOWAIT);
        struct rpc_stats st;
        rpc_get_stats(&st);
        if (st.frame_buffer_bytes >= BIG_KEY) {
            atomic_store(&cl.grown, true);
        }
        if (handled != seen_handled) {
            seen_handled = handled;
            quiet_since = nowMs();
        } else if (n_held > 0 && nowMs() - quiet_since >= QUIET_MS) {
            assert_int_equal(st.inflight, n_held);
            max_held = n_held > max_held ? n_held : max_held;
            answerAll();
        }
        usleep(500);
    }
    /* The connection is still open: the answers' bookkeeping and the buffer's size. */
    for (int i = 0; i < 20; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    struct rpc_stats open;
    rpc_get_stats(&open);
    atomic_store(&cl.may_close, true);
    pthread_join(th, NULL);
    deadline = nowMs() + 10000;
    struct rpc_stats closed;
    do {
        uv_run(&loop, UV_RUN_NOWAIT);
        rpc_get_stats(&closed);
        usleep(1000);
    } while (closed.connections > 0 && nowMs() < deadline);
    bool gone = false;
    rpc_server_close(r, serverClosed, &gone);
    while (!gone) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_int_equal(uv_loop_close(&loop), 0);

    if (cl.err[0] != '\0') {
        fail_msg("client: %s", cl.err);
    }
    assert_int_equal(cl.answers, SMALL_FRAMES + 1);
    assert_int_equal(handled, SMALL_FRAMES + 1);
    /* One token throughout: each request came with the digest taken for its first frame. */
    assert_int_equal(digested, SMALL_FRAMES + 1);
    /* The cap was reached, and never passed, though one read held all the frames. */
    assert_int_equal(max_held, MAX_INFLIGHT);
    /* The large frame grew the buffer, and once it was handled the buffer went back to its
     * first size. */
    assert_true(atomic_load(&cl.grown));
    assert_int_equal(open.connections, 1);
    assert_int_equal(open.inflight, 0);
    assert_int_equal(open.frame_buffer_bytes, BUF_MIN);
    assert_int_equal(closed.connections, 0);
    assert_int_equal(closed.inflight, 0);
    assert_int_equal(closed.frame_buffer_bytes, 0);
    /* /metrics: each answer to a client's get counted once, by its outcome; no claim timed,
     * nothing unavailable, nothing forwarded. */
    assert_int_equal(closed.requests.outcomes[IDEM__OUTCOME__OUTCOME_NOT_FOUND] -
                         before.requests.outcomes[IDEM__OUTCOME__OUTCOME_NOT_FOUND],
                     SMALL_FRAMES + 1);
    assert_int_equal(closed.requests.claim_count, before.requests.claim_count);
    assert_int_equal(closed.requests.fail_closed, before.requests.fail_closed);
    assert_int_equal(closed.forwarded[IDEM__OUTCOME__OUTCOME_NOT_FOUND],
                     before.forwarded[IDEM__OUTCOME__OUTCOME_NOT_FOUND]);
}

static void test_inflight_cap_holds_per_frame_and_buffer_shrinks(void **state)
{
    (void)state;
    runBurst(false);
}

static void test_inflight_cap_holds_per_frame_over_tls(void **state)
{
    (void)state;
    runBurst(true);
}

static int setup(void **state)
{
    (void)state;
    return pki_make(&pki, "idem-rpc-unit");
}

static int teardown(void **state)
{
    (void)state;
    return pki_remove(&pki);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_cap_holds_per_frame_and_buffer_shrinks),
        cmocka_unit_test(test_inflight_cap_holds_per_frame_over_tls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
