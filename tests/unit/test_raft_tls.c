/* Unit tests of cluster/raft_tls.c, the TLS pumps under raft's streams (tls.raft): a
 * connector and a listener in one loop over 127.0.0.1, each pump between its TCP connection
 * and a socketpair. What the test holds are the two plaintext ends, as raft (or
 * transport.c) would: raft_uv_tcp's handshake written by the connector, bytes both ways
 * intact, backpressure (a plaintext end that is not read holds the writer back, the pumps'
 * queues stay bounded), ends in both directions, TLS failures (a certificate of another CA,
 * a certificate for another address, a plaintext peer, a listener that never answers),
 * and close (connections being made are called back canceled; the close waits for every
 * pump). Certificates are made at test time with the openssl CLI (pki.h). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pki.h"
#include "raft_tls.h"

#define TIMEOUT_MS 600 /* the handshake timeout of these tests */

static struct pki pki;

/* A plaintext end as its holder sees it: what it read, whether it ended. */
struct plain {
    uv_stream_t *s;
    uint8_t *got;
    size_t len;
    size_t cap;
    bool eof;
    bool reading;
};

struct fx {
    uv_loop_t loop;
    uv_timer_t tick; /* keeps UV_RUN_ONCE from blocking for long */
    uv_tcp_t listener;
    char address[64];
    struct sockaddr_storage sa; /* the listener's */
    struct raft_tls *srv;
    struct raft_tls *cli;
    struct plain sp; /* the listener's plaintext end */
    struct plain cp; /* the connector's */
    struct raft_uv_connect req;
    int connected; /* callbacks of the connect request */
    int status;
    int fails_srv;
    int fails_cli;
    const char *why_srv;
    const char *why_cli;
    char text_cli[512];
    char text_srv[512];
    int closed;
    int refused;     /* connections raft_tls_accept refused (closing) */
    bool accept_raw; /* the listener's connections stay plain TCP (a silent listener) */
    uv_tcp_t *raw;   /* that connection */
};

static uint8_t readBuf[65536];

static void failSrv(void *data, const struct raft_tls_failure *f)
{
    struct fx *x = data;
    assert_true(f->incoming);
    assert_non_null(f->from);
    x->fails_srv++;
    x->why_srv = f->why;
    snprintf(x->text_srv, sizeof(x->text_srv), "%s", f->text);
}

static void failCli(void *data, const struct raft_tls_failure *f)
{
    struct fx *x = data;
    assert_false(f->incoming);
    assert_int_equal(f->peer, 2);
    x->fails_cli++;
    x->why_cli = f->why;
    snprintf(x->text_cli, sizeof(x->text_cli), "%s", f->text);
}

static void closedCb(void *data)
{
    struct fx *x = data;
    x->closed++;
}

static struct raft_tls *mk(struct fx *x, bool server, const char *cert, const char *ca)
{
    struct raft_tls_files files = {cert, pki.paths[PKI_SRV_KEY], ca};
    struct raft_tls_cbs cbs = {.data = x, .fail = server ? failSrv : failCli, .closed = closedCb};
    struct raft_tls *rt = NULL;
    char err[256];
    if (raft_tls_new(&x->loop, &files, TIMEOUT_MS, &cbs, &rt, err, sizeof(err)) != 0) {
        fail_msg("raft_tls_new: %s", err);
    }
    return rt;
}

static void plainAlloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init((char *)readBuf, sizeof(readBuf));
}

static void plainRead(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct plain *p = s->data;
    if (n < 0) {
        p->eof = true;
        uv_read_stop(s);
        p->reading = false;
        return;
    }
    if (p->len + (size_t)n > p->cap) {
        p->cap = (p->len + (size_t)n) * 2;
        p->got = realloc(p->got, p->cap);
        assert_non_null(p->got);
    }
    memcpy(p->got + p->len, buf->base, (size_t)n);
    p->len += (size_t)n;
}

static void plainStart(struct plain *p)
{
    p->s->data = p;
    if (!p->reading) {
        assert_int_equal(uv_read_start(p->s, plainAlloc, plainRead), 0);
        p->reading = true;
    }
}

static void freeHandle(uv_handle_t *h)
{
    raft_free(h);
}

static void plainClose(struct plain *p)
{
    if (p->s != NULL) {
        uv_close((uv_handle_t *)p->s, freeHandle);
        p->s = NULL;
    }
    free(p->got);
    p->got = NULL;
    p->len = p->cap = 0;
}

static void listenCb(uv_stream_t *l, int status)
{
    struct fx *x = l->data;
    assert_int_equal(status, 0);
    uv_tcp_t *tcp = raft_malloc(sizeof(*tcp));
    uv_tcp_init(&x->loop, tcp);
    assert_int_equal(uv_accept(l, (uv_stream_t *)tcp), 0);
    if (x->accept_raw) {
        x->raw = tcp;
        return;
    }
    uv_stream_t *plain = NULL;
    int rv = raft_tls_accept(x->srv, tcp, &plain);
    if (rv != 0) {
        /* Closing: the connection stays the caller's, as transport.c closes it. */
        assert_int_equal(rv, UV_ECANCELED);
        uv_close((uv_handle_t *)tcp, freeHandle);
        x->refused++;
        return;
    }
    assert_null(x->sp.s);
    x->sp.s = plain;
    plainStart(&x->sp);
}

static void connectCb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct fx *x = req->data;
    x->connected++;
    x->status = status;
    if (status == 0) {
        x->cp.s = stream;
    } else {
        assert_null(stream);
    }
}

static void tickCb(uv_timer_t *t)
{
    (void)t;
}

/* Runs the loop until cond(x) or ms pass; returns cond(x). */
static bool runUntil(struct fx *x, bool (*cond)(struct fx *), uint64_t ms)
{
    uint64_t end = uv_now(&x->loop) + ms;
    while (!cond(x) && uv_now(&x->loop) < end) {
        uv_run(&x->loop, UV_RUN_ONCE);
    }
    return cond(x);
}

static bool never(struct fx *x)
{
    (void)x;
    return false;
}

static bool connectedDone(struct fx *x)
{
    return x->connected > 0;
}

static void setupFx(struct fx *x, const char *srv_cert, const char *srv_ca, const char *cli_ca)
{
    memset(x, 0, sizeof(*x));
    assert_int_equal(uv_loop_init(&x->loop), 0);
    uv_timer_init(&x->loop, &x->tick);
    uv_timer_start(&x->tick, tickCb, 10, 10);
    x->srv = mk(x, true, srv_cert, srv_ca);
    x->cli = mk(x, false, pki.paths[PKI_SRV_CRT], cli_ca);
    uv_tcp_init(&x->loop, &x->listener);
    x->listener.data = x;
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    assert_int_equal(uv_tcp_bind(&x->listener, (const struct sockaddr *)&sa, 0), 0);
    assert_int_equal(uv_listen((uv_stream_t *)&x->listener, 16, listenCb), 0);
    int len = sizeof(sa);
    uv_tcp_getsockname(&x->listener, (struct sockaddr *)&sa, &len);
    snprintf(x->address, sizeof(x->address), "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    memcpy(&x->sa, &sa, sizeof(sa));
    x->req.data = x;
}

static void setupGood(struct fx *x)
{
    setupFx(x, pki.paths[PKI_SRV_CRT], pki.paths[PKI_CA_CRT], pki.paths[PKI_CA_CRT]);
}

static void connectTo(struct fx *x)
{
    assert_int_equal(raft_tls_connect(x->cli, &x->req, 2, (const struct sockaddr *)&x->sa,
                                      "127.0.0.1", 1, "127.0.0.1:9001", connectCb),
                     0);
}

static bool bothClosed(struct fx *x)
{
    return raft_tls_closed(x->srv) && raft_tls_closed(x->cli);
}

static void teardownFx(struct fx *x)
{
    plainClose(&x->sp);
    plainClose(&x->cp);
    if (x->raw != NULL) {
        uv_close((uv_handle_t *)x->raw, freeHandle);
    }
    raft_tls_close(x->srv);
    raft_tls_close(x->cli);
    assert_true(runUntil(x, bothClosed, 5000));
    raft_tls_free(x->srv);
    raft_tls_free(x->cli);
    uv_close((uv_handle_t *)&x->listener, NULL);
    uv_close((uv_handle_t *)&x->tick, NULL);
    uv_run(&x->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&x->loop), 0);
}

/* ---- the tests -------------------------------------------------------------------------- */

static bool handshakeRead(struct fx *x)
{
    return x->sp.len >= 40;
}

/* raft_uv_tcp's handshake (protocol 1, ID 1, address length 16, the address padded) is the
 * first thing the listener's plaintext end reads. */
static void connectAndHandshake(struct fx *x)
{
    connectTo(x);
    assert_true(runUntil(x, connectedDone, 5000));
    assert_int_equal(x->status, 0);
    assert_non_null(x->cp.s);
    assert_int_equal(x->cp.s->type, UV_NAMED_PIPE);
    assert_true(runUntil(x, handshakeRead, 5000));
    static const uint8_t want[40] = {
        1, 0, 0, 0, 0,   0,   0,   0,   1,   0,   0,   0,   0,   0,   0,   0,   16,  0,   0, 0,
        0, 0, 0, 0, '1', '2', '7', '.', '0', '.', '0', '.', '1', ':', '9', '0', '0', '1', 0, 0};
    assert_memory_equal(x->sp.got, want, sizeof(want));
    x->sp.len = 0;
}

static uint8_t *pattern(size_t n, unsigned seed)
{
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        b[i] = (uint8_t)((i * 131u + seed) ^ (i >> 11));
    }
    return b;
}

struct wr {
    uv_write_t req;
    bool done;
    int status;
};

static void wrCb(uv_write_t *req, int status)
{
    struct wr *w = (struct wr *)req;
    w->done = true;
    w->status = status;
}

static size_t wantLen;

static bool srvGotAll(struct fx *x)
{
    return x->sp.len >= wantLen;
}

static bool cliGotAll(struct fx *x)
{
    return x->cp.len >= wantLen;
}

static void test_bytes_both_ways(void **state)
{
    (void)state;
    struct fx x;
    setupGood(&x);
    connectAndHandshake(&x);
    assert_int_equal(raft_tls_pumps(x.srv), 1);
    assert_int_equal(raft_tls_pumps(x.cli), 1);
    /* 3 MiB each way, at once. */
    size_t n = 3u << 20;
    uint8_t *a = pattern(n, 7), *b = pattern(n, 99);
    struct wr wa = {0}, wb = {0};
    uv_buf_t ba = uv_buf_init((char *)a, (unsigned)n), bb = uv_buf_init((char *)b, (unsigned)n);
    assert_int_equal(uv_write(&wa.req, x.cp.s, &ba, 1, wrCb), 0);
    assert_int_equal(uv_write(&wb.req, x.sp.s, &bb, 1, wrCb), 0);
    plainStart(&x.cp);
    wantLen = n;
    assert_true(runUntil(&x, srvGotAll, 20000));
    assert_true(runUntil(&x, cliGotAll, 20000));
    assert_int_equal(x.sp.len, n);
    assert_int_equal(x.cp.len, n);
    assert_memory_equal(x.sp.got, a, n);
    assert_memory_equal(x.cp.got, b, n);
    runUntil(&x, never, 50);
    assert_true(wa.done && wb.done);
    assert_int_equal(wa.status, 0);
    assert_int_equal(wb.status, 0);
    assert_int_equal(x.fails_srv + x.fails_cli, 0);
    free(a);
    free(b);
    teardownFx(&x);
    assert_int_equal(x.closed, 2);
}

/* A listener's plaintext end that is not read: the connector's 16 MiB stay with the writer
 * (its write does not complete), the pumps hold a bounded amount; once read, all of it
 * arrives, intact. */
static void test_backpressure(void **state)
{
    (void)state;
    struct fx x;
    setupGood(&x);
    connectAndHandshake(&x);
    uv_read_stop(x.sp.s);
    x.sp.reading = false;
    size_t n = 16u << 20;
    uint8_t *a = pattern(n, 3);
    struct wr w = {0};
    uv_buf_t b = uv_buf_init((char *)a, (unsigned)n);
    assert_int_equal(uv_write(&w.req, x.cp.s, &b, 1, wrCb), 0);
    runUntil(&x, never, 1500);
    assert_false(w.done);
    /* Each pump: one queue within the bound plus one read (64 KiB, and TLS's overhead). */
    size_t bound = 2 * (RAFT_TLS_QUEUE_MAX + 80 * 1024);
    size_t held = raft_tls_buffered(x.srv) + raft_tls_buffered(x.cli);
    assert_true(held > 0);
    assert_true(held <= bound);
    /* The far end's own queue holds the rest: at least n minus the pumps' and the kernel's
     * buffers (a few MiB at most). */
    assert_true(uv_stream_get_write_queue_size(x.cp.s) > n / 2);
    plainStart(&x.sp);
    wantLen = n;
    assert_true(runUntil(&x, srvGotAll, 30000));
    assert_int_equal(x.sp.len, n);
    assert_memory_equal(x.sp.got, a, n);
    runUntil(&x, never, 50);
    assert_true(w.done);
    assert_int_equal(w.status, 0);
    free(a);
    teardownFx(&x);
}

static bool srvEof(struct fx *x)
{
    return x->sp.eof;
}

static bool cliEof(struct fx *x)
{
    return x->cp.eof;
}

static bool srvGone(struct fx *x)
{
    return raft_tls_pumps(x->srv) == 0 && raft_tls_pumps(x->cli) == 0;
}

/* Either end closing ends the other, after what was written before it. */
static void test_ends_both_ways(void **state)
{
    (void)state;
    for (int dir = 0; dir < 2; dir++) {
        struct fx x;
        setupGood(&x);
        connectAndHandshake(&x);
        plainStart(&x.cp);
        struct plain *closer = dir == 0 ? &x.cp : &x.sp;
        struct plain *other = dir == 0 ? &x.sp : &x.cp;
        struct wr w = {0};
        uv_buf_t b = uv_buf_init("last words", 10);
        assert_int_equal(uv_write(&w.req, closer->s, &b, 1, wrCb), 0);
        runUntil(&x, never, 100);
        uv_close((uv_handle_t *)closer->s, freeHandle);
        closer->s = NULL;
        assert_true(runUntil(&x, dir == 0 ? srvEof : cliEof, 5000));
        assert_int_equal(other->len, 10);
        assert_memory_equal(other->got, "last words", 10);
        plainClose(other);
        assert_true(runUntil(&x, srvGone, 5000));
        assert_int_equal(x.fails_srv + x.fails_cli, 0);
        teardownFx(&x);
    }
}

static bool srvFailed(struct fx *x)
{
    return x->fails_srv > 0;
}

static bool cliFailed(struct fx *x)
{
    return x->fails_cli > 0;
}

/* The listener takes client certificates of its CA only: the connector's (signed by the
 * test CA) is refused by a listener that trusts another CA, which says why; the connection
 * ends on both sides. */
static void test_client_certificate_of_another_ca(void **state)
{
    (void)state;
    struct fx x;
    setupFx(&x, pki.paths[PKI_SRV_CRT], pki.paths[PKI_OTHER_CA], pki.paths[PKI_CA_CRT]);
    connectTo(&x);
    assert_true(runUntil(&x, srvFailed, 5000));
    assert_string_equal(x.why_srv, "TLS handshake failed");
    assert_non_null(strstr(x.text_srv, "certificate"));
    assert_non_null(strstr(x.text_srv, "tls.ca_file"));
    /* The connector (TLS 1.3: done before the listener checked its certificate) hears the
     * alert, or the close, and its plaintext end, if it got one, ends. */
    assert_true(runUntil(&x, connectedDone, 5000));
    if (x.status == 0) {
        plainStart(&x.cp);
        assert_true(runUntil(&x, cliEof, 5000));
    } else {
        assert_int_equal(x.status, RAFT_NOCONNECTION);
    }
    assert_true(runUntil(&x, srvEof, 5000));
    assert_int_equal(x.sp.len, 0); /* nothing of the connector's reached the listener's end */
    teardownFx(&x);
}

/* The connector checks the listener's certificate: one of another CA, or one that does not
 * carry the address it dialled (DNS names only), fails the connection before the callback
 * has a stream. */
static void test_listener_certificate_checked(void **state)
{
    (void)state;
    for (int c = 0; c < 2; c++) {
        struct fx x;
        if (c == 0) {
            setupFx(&x, pki.paths[PKI_SRV_CRT], pki.paths[PKI_CA_CRT], pki.paths[PKI_OTHER_CA]);
        } else {
            setupFx(&x, pki.paths[PKI_WILD_CRT], pki.paths[PKI_CA_CRT], pki.paths[PKI_CA_CRT]);
        }
        connectTo(&x);
        assert_true(runUntil(&x, connectedDone, 5000));
        assert_int_equal(x.status, RAFT_NOCONNECTION);
        assert_null(x.cp.s);
        assert_true(cliFailed(&x));
        assert_string_equal(x.why_cli, "TLS handshake failed");
        assert_non_null(strstr(x.text_cli, c == 0 ? "certificate verify failed" : "mismatch"));
        assert_non_null(strstr(x.text_cli, "node 2"));
        teardownFx(&x);
    }
}

static void rawConnectCb(uv_connect_t *req, int status)
{
    assert_int_equal(status, 0);
    static char junk[] = "\x01\0\0\0\0\0\0\0 a plaintext raft handshake, say";
    uv_buf_t b = uv_buf_init(junk, sizeof(junk));
    uv_try_write(req->handle, &b, 1);
}

/* A peer that speaks no TLS: the listener's TLS handshake fails (told), its plaintext end
 * ends without a byte. */
static void test_plaintext_peer(void **state)
{
    (void)state;
    struct fx x;
    setupGood(&x);
    uv_tcp_t c;
    uv_connect_t req;
    uv_tcp_init(&x.loop, &c);
    struct sockaddr_in sa;
    int len = sizeof(sa);
    uv_tcp_getsockname(&x.listener, (struct sockaddr *)&sa, &len);
    assert_int_equal(uv_tcp_connect(&req, &c, (const struct sockaddr *)&sa, rawConnectCb), 0);
    assert_true(runUntil(&x, srvFailed, 5000));
    assert_string_equal(x.why_srv, "TLS handshake failed");
    assert_true(runUntil(&x, srvEof, 5000));
    assert_int_equal(x.sp.len, 0);
    uv_close((uv_handle_t *)&c, NULL);
    teardownFx(&x);
}

/* A listener that accepts and never answers: the connection fails at the handshake timeout,
 * told as such. */
static void test_silent_listener_times_out(void **state)
{
    (void)state;
    struct fx x;
    setupGood(&x);
    x.accept_raw = true;
    uint64_t start = uv_now(&x.loop);
    connectTo(&x);
    assert_true(runUntil(&x, connectedDone, 5000));
    uint64_t took = uv_now(&x.loop) - start;
    assert_int_equal(x.status, RAFT_NOCONNECTION);
    assert_true(took >= TIMEOUT_MS - 20 && took < TIMEOUT_MS + 1000);
    assert_string_equal(x.why_cli, "no TLS handshake in time");
    teardownFx(&x);
}

/* Close while connections are being made and while others run: the one being made is
 * called back RAFT_CANCELED, every pump goes, then the closed callback, once per side. */
static void test_close_waits_for_pumps(void **state)
{
    (void)state;
    struct fx x;
    setupGood(&x);
    connectAndHandshake(&x);
    /* A second connection, still connecting when the close comes. */
    struct raft_uv_connect req2 = {.data = &x};
    x.connected = 0;
    assert_int_equal(raft_tls_connect(x.cli, &req2, 2, (const struct sockaddr *)&x.sa, "127.0.0.1",
                                      1, "127.0.0.1:9001", connectCb),
                     0);
    uv_stream_t *first = x.cp.s;
    raft_tls_close(x.cli);
    raft_tls_close(x.srv);
    assert_int_equal(x.closed, 0); /* never from inside raft_tls_close */
    assert_int_equal(
        raft_tls_connect(x.cli, &req2, 2, (const struct sockaddr *)&x.sa, "a", 1, "a:1", connectCb),
        RAFT_CANCELED);
    assert_true(runUntil(&x, bothClosed, 5000));
    assert_int_equal(x.connected, 1);
    assert_int_equal(x.status, RAFT_CANCELED);
    assert_int_equal(x.closed, 2);
    /* The plaintext ends stay their holders', ended. */
    x.cp.s = first;
    plainStart(&x.cp);
    assert_true(runUntil(&x, cliEof, 5000));
    assert_true(runUntil(&x, srvEof, 5000));
    assert_int_equal(x.fails_srv + x.fails_cli, 0);
    teardownFx(&x);
}

static void test_bad_files(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct raft_tls_cbs cbs = {0};
    struct raft_tls *rt = NULL;
    char err[256];
    struct raft_tls_files files = {pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY], NULL};
    assert_int_equal(raft_tls_new(&loop, &files, 1000, &cbs, &rt, err, sizeof(err)), -1);
    assert_null(rt);
    assert_non_null(strstr(err, "ca_file"));
    files.ca_file = "/nonexistent/ca.crt";
    assert_int_equal(raft_tls_new(&loop, &files, 1000, &cbs, &rt, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "tls: ca_file /nonexistent/ca.crt"));
    files.ca_file = pki.paths[PKI_CA_CRT];
    files.key_file = pki.paths[PKI_CA_CRT];
    assert_int_equal(raft_tls_new(&loop, &files, 1000, &cbs, &rt, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "key_file"));
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* A reload as idemd makes it: raft_tls_load, then raft_tls_set when every file loaded. */
static int reloadTls(struct raft_tls *rt, const struct raft_tls_files *files, char *err,
                     size_t errlen)
{
    struct idem_tls_ctx *server, *client;
    if (raft_tls_load(files, &server, &client, err, errlen) != 0) {
        assert_null(server);
        assert_null(client);
        return -1;
    }
    raft_tls_set(rt, server, client);
    return 0;
}

/* raft_tls_load and raft_tls_set: a listener that trusts another CA takes the test CA after
 * a reload (its next connection verifies against it), a reload with a file missing changes
 * nothing, and a connection made before a reload goes on with its session. */
static void test_reload(void **state)
{
    (void)state;
    struct fx x;
    setupFx(&x, pki.paths[PKI_SRV_CRT], pki.paths[PKI_OTHER_CA], pki.paths[PKI_CA_CRT]);
    char err[256];
    struct raft_tls_files files = {pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY],
                                   "/nonexistent/ca.crt"};
    assert_int_equal(reloadTls(x.srv, &files, err, sizeof err), -1);
    assert_non_null(strstr(err, "tls: ca_file /nonexistent/ca.crt"));
    files.ca_file = pki.paths[PKI_CA_CRT];
    assert_int_equal(reloadTls(x.srv, &files, err, sizeof err), 0);
    connectAndHandshake(&x);
    /* back to the other CA: new connections would be refused, this one goes on */
    files.ca_file = pki.paths[PKI_OTHER_CA];
    assert_int_equal(reloadTls(x.srv, &files, err, sizeof err), 0);
    size_t n = 4096;
    uint8_t *a = pattern(n, 3);
    struct wr wa = {0};
    uv_buf_t ba = uv_buf_init((char *)a, (unsigned)n);
    assert_int_equal(uv_write(&wa.req, x.cp.s, &ba, 1, wrCb), 0);
    wantLen = n;
    assert_true(runUntil(&x, srvGotAll, 5000));
    assert_memory_equal(x.sp.got, a, n);
    assert_int_equal(x.fails_srv + x.fails_cli, 0);
    free(a);
    teardownFx(&x);
}

static int setupPki(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN); /* as idemd: a write to a closed end fails, EPIPE */
    return pki_make(&pki, "idem-raft-tls-unit");
}

static int teardownPki(void **state)
{
    (void)state;
    return pki_remove(&pki);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_both_ways),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_ends_both_ways),
        cmocka_unit_test(test_client_certificate_of_another_ca),
        cmocka_unit_test(test_listener_certificate_checked),
        cmocka_unit_test(test_plaintext_peer),
        cmocka_unit_test(test_silent_listener_times_out),
        cmocka_unit_test(test_close_waits_for_pumps),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_reload),
    };
    return cmocka_run_group_tests(tests, setupPki, teardownPki);
}
