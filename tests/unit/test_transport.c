/* Unit tests of cluster/transport.c's addresses: members dialled by host name (looked up by
 * client/resolver.c, with a lookup function of the test's that it can move a name with) and
 * by IPv6 address, the listener on its own listen address; a name looked up again at an
 * attempt once its last answer is TRANSPORT_RESOLVE_REUSE_MS old, so that a member whose
 * address changed under its name is reached again; lookups that fail or are cut short by
 * the transport's close; and under TLS (tls.raft) the member's name checked against its
 * certificate. Two transports in one loop, as raft_uv would drive them, without raft. */
#define _GNU_SOURCE /* usleep */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "pki.h"
#include "raft_tls.h"
#include "resolver.h"
#include "transport.h"

static struct pki pki;

/* ---- the names: every one resolves to fakeAnswer ("": none) ------------------------------- */

static pthread_mutex_t fakeMu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fakeCv = PTHREAD_COND_INITIALIZER;
static char fakeAnswer[64];
static bool fakeHold; /* lookups wait while it is set */

static int fakeLookup(const char *host, struct sockaddr_storage *out, size_t cap, size_t *n)
{
    (void)host;
    pthread_mutex_lock(&fakeMu);
    while (fakeHold) {
        pthread_cond_wait(&fakeCv, &fakeMu);
    }
    char list[64];
    memcpy(list, fakeAnswer, sizeof(list));
    pthread_mutex_unlock(&fakeMu);
    *n = 0;
    char *save = NULL;
    for (char *a = strtok_r(list, ",", &save); a != NULL && *n < cap;
         a = strtok_r(NULL, ",", &save)) {
        *n += IdemSockaddrLiteral(a, 0, &out[*n]);
    }
    return *n > 0 ? 0 : EAI_NONAME;
}

static void fakeSet(const char *answer, bool hold)
{
    pthread_mutex_lock(&fakeMu);
    snprintf(fakeAnswer, sizeof fakeAnswer, "%s", answer);
    fakeHold = hold;
    pthread_cond_broadcast(&fakeCv);
    pthread_mutex_unlock(&fakeMu);
}

/* ---- a member: a transport, what it accepted -------------------------------------------- */

struct member {
    struct transport t; /* first: raft_uv's callbacks get &t.outer */
    int accepted;
    raft_id from;
    bool closed;
};

static void freeStreamCb(uv_handle_t *h)
{
    raft_free(h);
}

static void acceptCb(struct raft_uv_transport *o, raft_id id, const char *address,
                     struct uv_stream_s *stream)
{
    struct member *m = (struct member *)o;
    (void)address;
    m->accepted++;
    m->from = id;
    uv_close((uv_handle_t *)stream, freeStreamCb);
}

static const uint8_t secret[40] = "a Raft secret of forty bytes, test only";

/* Starts m as node id at `address`, listening at `listen` (NULL: its address), with the
 * resolver r, a secret when auth, TLS when tls. */
static void memberStart(struct member *m, uv_loop_t *loop, struct idem_resolver *r, raft_id id,
                        const char *address, const char *listen, bool auth, bool tls)
{
    memset(m, 0, sizeof(*m));
    struct transport_secret s = {secret, sizeof(secret)};
    assert_int_equal(transport_init(&m->t, loop, &s, auth ? 1 : 0), 0);
    if (tls) {
        struct raft_tls_files files = {pki.paths[PKI_SRV_CRT], pki.paths[PKI_SRV_KEY],
                                       pki.paths[PKI_CA_CRT]};
        char err[256];
        assert_int_equal(transport_tls(&m->t, &files, err, sizeof(err)), 0);
    }
    transport_set_listen(&m->t, listen);
    transport_set_resolver(&m->t, r);
    assert_int_equal(m->t.outer.init(&m->t.outer, id, address), 0);
    if (listen != NULL) {
        assert_int_equal(m->t.outer.listen(&m->t.outer, acceptCb), 0);
    }
}

static void closedCb(struct raft_uv_transport *o)
{
    ((struct member *)o)->closed = true;
}

static void runWhile(uv_loop_t *loop, const bool *flag, bool value)
{
    for (int i = 0; i < 10000 && *flag == value; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_true(*flag != value);
}

static void memberStop(struct member *m, uv_loop_t *loop)
{
    m->t.outer.close(&m->t.outer, closedCb);
    runWhile(loop, &m->closed, false);
    transport_close(&m->t);
}

/* ---- connecting ---------------------------------------------------------------------------- */

struct attempt {
    struct raft_uv_connect req;
    bool done;
    int status;
};

static void connectCb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct attempt *a = req->data;
    a->done = true;
    a->status = status;
    if (stream != NULL) {
        uv_close((uv_handle_t *)stream, freeStreamCb);
    }
}

/* An attempt of `from` to reach node 2 at `address`; its status (and the loop run until it
 * ended, and until `to` accepted it when it succeeded). */
static int attempt(uv_loop_t *loop, struct member *from, struct member *to, const char *address)
{
    struct attempt a = {.req = {.data = NULL}};
    a.req.data = &a;
    int accepted = to != NULL ? to->accepted : 0;
    int rv = from->t.outer.connect(&from->t.outer, &a.req, 2, address, connectCb);
    if (rv != 0) {
        return rv;
    }
    assert_false(a.done); /* never called back from inside connect */
    runWhile(loop, &a.done, false);
    if (a.status == 0 && to != NULL) {
        for (int i = 0; i < 5000 && to->accepted == accepted; i++) {
            uv_run(loop, UV_RUN_NOWAIT);
            usleep(1000);
        }
        assert_int_equal(to->accepted, accepted + 1);
        assert_int_equal(to->from, 1);
    }
    return a.status;
}

/* A port free on 127.0.0.1 (for the test to listen on there and on 127.0.0.2). */
static unsigned freePort(uv_loop_t *loop)
{
    uv_tcp_t tcp;
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    uv_tcp_init(loop, &tcp);
    assert_int_equal(uv_tcp_bind(&tcp, (const struct sockaddr *)&sa, 0), 0);
    int len = sizeof(sa);
    uv_tcp_getsockname(&tcp, (struct sockaddr *)&sa, &len);
    uv_close((uv_handle_t *)&tcp, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return ntohs(sa.sin_port);
}

/* Node 2 is known as peer.test:P. It moves from 127.0.0.1 to 127.0.0.2 (its old address gone
 * with it): the attempt right after still has the last answer (at most
 * TRANSPORT_RESOLVE_REUSE_MS old) and fails; the first one after that looks the name up
 * again and reaches it; of two addresses, the one that answers. */
static void movedMember(bool auth, bool tls)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    IdemResolverSetLookup(r, fakeLookup);
    fakeSet("127.0.0.1", false);
    unsigned port = freePort(&loop);
    /* Under TLS the certificate names node1.test (and 127.0.0.1): the member's name. */
    const char *name = tls ? "node1.test" : "peer.test";
    char address[64], at1[64], at2[64];
    snprintf(address, sizeof(address), "%s:%u", name, port);
    snprintf(at1, sizeof(at1), "127.0.0.1:%u", port);
    snprintf(at2, sizeof(at2), "127.0.0.2:%u", port);
    struct member a, b;
    memberStart(&a, &loop, r, 1, "a.test:1", NULL, auth, tls);
    memberStart(&b, &loop, r, 2, address, at1, auth, tls);
    assert_int_equal(attempt(&loop, &a, &b, address), 0);
    assert_int_equal(IdemResolverLookups(r), 1);

    memberStop(&b, &loop);
    fakeSet("127.0.0.2", false);
    memberStart(&b, &loop, r, 2, address, at2, auth, tls);
    assert_int_equal(attempt(&loop, &a, &b, address), RAFT_NOCONNECTION);
    assert_int_equal(IdemResolverLookups(r), 1);
    assert_int_equal(b.accepted, 0);
    uv_sleep(TRANSPORT_RESOLVE_REUSE_MS + 50);
    uv_update_time(&loop);
    assert_int_equal(attempt(&loop, &a, &b, address), 0);
    assert_int_equal(IdemResolverLookups(r), 2);
    /* The answer is young again: the next attempt takes it without a lookup. */
    assert_int_equal(attempt(&loop, &a, &b, address), 0);
    assert_int_equal(IdemResolverLookups(r), 2);
    /* A name with two addresses, nothing at the first: the second is tried. */
    fakeSet("127.0.0.3,127.0.0.2", false);
    uv_sleep(TRANSPORT_RESOLVE_REUSE_MS + 50);
    uv_update_time(&loop);
    assert_int_equal(attempt(&loop, &a, &b, address), 0);
    assert_int_equal(IdemResolverLookups(r), 3);

    memberStop(&a, &loop);
    memberStop(&b, &loop);
    IdemResolverClose(r);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_moved_member_is_reached_again(void **state)
{
    (void)state;
    movedMember(false, false);
}

static void test_moved_member_is_reached_again_authenticated(void **state)
{
    (void)state;
    movedMember(true, false);
}

static void test_moved_member_is_reached_again_over_tls(void **state)
{
    (void)state;
    movedMember(true, true);
}

/* A name that does not resolve fails the attempt (and says so); one whose lookup is out when
 * the transport closes is called back RAFT_CANCELED, and the close completes. An address
 * that is no "host:port" is refused at once. */
static void test_failed_and_cancelled_lookups(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    IdemResolverSetLookup(r, fakeLookup);
    struct member a;
    memberStart(&a, &loop, r, 1, "a.test:1", NULL, true, false);
    fakeSet("", false);
    assert_int_equal(attempt(&loop, &a, NULL, "nowhere.test:9"), RAFT_NOCONNECTION);
    assert_int_equal(attempt(&loop, &a, NULL, "::1:9"), RAFT_NOCONNECTION);

    fakeSet("127.0.0.1", true);
    struct attempt at = {.done = false};
    at.req.data = &at;
    assert_int_equal(a.t.outer.connect(&a.t.outer, &at.req, 2, "slow.test:9", connectCb), 0);
    for (int i = 0; i < 20; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    assert_false(at.done);
    a.t.outer.close(&a.t.outer, closedCb);
    runWhile(&loop, &a.closed, false);
    assert_true(at.done);
    assert_int_equal(at.status, RAFT_CANCELED);
    transport_close(&a.t);
    IdemResolverClose(r);
    uv_run(&loop, UV_RUN_DEFAULT);
    fakeSet("127.0.0.1", false); /* the resolver's thread ends */
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* IPv6: a member listening on [::1] and reached there (skipped without ::1). */
static void test_ipv6_member(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_tcp_t probe;
    struct sockaddr_in6 sa;
    uv_ip6_addr("::1", 0, &sa);
    uv_tcp_init(&loop, &probe);
    int rv = uv_tcp_bind(&probe, (const struct sockaddr *)&sa, 0);
    int len = sizeof(sa);
    uv_tcp_getsockname(&probe, (struct sockaddr *)&sa, &len);
    uv_close((uv_handle_t *)&probe, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    if (rv != 0) {
        assert_int_equal(uv_loop_close(&loop), 0);
        skip(); /* no IPv6 loopback here */
    }
    char address[64];
    snprintf(address, sizeof(address), "[::1]:%u", (unsigned)ntohs(sa.sin6_port));
    struct member a, b;
    memberStart(&a, &loop, NULL, 1, "[::1]:1", NULL, true, false);
    memberStart(&b, &loop, NULL, 2, address, address, true, false);
    assert_int_equal(attempt(&loop, &a, &b, address), 0);
    memberStop(&a, &loop);
    memberStop(&b, &loop);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static int setup(void **state)
{
    (void)state;
    return pki_make(&pki, "idem-transport");
}

static int teardown(void **state)
{
    (void)state;
    return pki_remove(&pki);
}

/* ---- outwatch.c: outgoing connections whose peer closed them ------------------------------ */

/* A connection handed to raft for peer 7 (one end of a socketpair: outwatch looks at the
 * descriptor only), its other end the peer's. */
static void test_outgoing_closed_by_its_peer(void **state)
{
    (void)state;
    struct transport t;
    memset(&t, 0, sizeof(t));
    for (size_t i = 0; i < TRANSPORT_WATCHED_MAX; i++) {
        t.watched[i].fd = -1;
    }
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    int fds[2], other[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, other), 0);
    uv_pipe_t ours, ours8;
    assert_int_equal(uv_pipe_init(&loop, &ours, 0), 0);
    assert_int_equal(uv_pipe_open(&ours, fds[0]), 0);
    assert_int_equal(uv_pipe_init(&loop, &ours8, 0), 0);
    assert_int_equal(uv_pipe_open(&ours8, other[0]), 0);
    transport_watch(&t, 7, (uv_stream_t *)&ours);
    transport_watch(&t, 8, (uv_stream_t *)&ours8);
    raft_id ids[TRANSPORT_WATCHED_MAX];
    /* Both peers there (and one has written something: still alive). */
    assert_int_equal(write(other[1], "x", 1), 1);
    assert_int_equal(transport_dead_outgoing(&t, ids, TRANSPORT_WATCHED_MAX), 0);
    /* Peer 7 goes: found once, and the connection is shut for writing, so the next write
     * raft makes fails at once instead of being lost. */
    close(fds[1]);
    assert_int_equal(transport_dead_outgoing(&t, ids, TRANSPORT_WATCHED_MAX), 1);
    assert_int_equal(ids[0], 7);
    signal(SIGPIPE, SIG_IGN);
    assert_int_equal(write(fds[0], "y", 1), -1);
    assert_int_equal(errno, EPIPE);
    assert_int_equal(transport_dead_outgoing(&t, ids, TRANSPORT_WATCHED_MAX), 0);
    /* Peer 8's connection closed by raft (as raft_uv does after a failed write), its number
     * reused by another socket whose peer is gone: not taken for peer 8's. */
    uv_close((uv_handle_t *)&ours8, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    int again[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, again), 0);
    if (again[0] != other[0]) {
        assert_int_equal(dup2(again[0], other[0]), other[0]);
        close(again[0]);
    }
    close(again[1]);
    assert_int_equal(transport_dead_outgoing(&t, ids, TRANSPORT_WATCHED_MAX), 0);
    close(other[0]);
    close(other[1]);
    /* A new connection to peer 7 replaces the old one in its slot. */
    uv_close((uv_handle_t *)&ours, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    uv_pipe_t fresh;
    assert_int_equal(uv_pipe_init(&loop, &fresh, 0), 0);
    assert_int_equal(uv_pipe_open(&fresh, fds[0]), 0);
    transport_watch(&t, 7, (uv_stream_t *)&fresh);
    size_t watched = 0;
    for (size_t i = 0; i < TRANSPORT_WATCHED_MAX; i++) {
        watched += t.watched[i].fd >= 0;
    }
    assert_int_equal(watched, 1);
    close(fds[1]);
    assert_int_equal(transport_dead_outgoing(&t, ids, TRANSPORT_WATCHED_MAX), 1);
    assert_int_equal(ids[0], 7);
    uv_close((uv_handle_t *)&fresh, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moved_member_is_reached_again),
        cmocka_unit_test(test_moved_member_is_reached_again_authenticated),
        cmocka_unit_test(test_moved_member_is_reached_again_over_tls),
        cmocka_unit_test(test_failed_and_cancelled_lookups),
        cmocka_unit_test(test_ipv6_member),
        cmocka_unit_test(test_outgoing_closed_by_its_peer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
