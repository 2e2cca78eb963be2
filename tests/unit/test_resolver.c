/* Unit tests of client/resolver.c: names looked up on the resolver's thread and answered on
 * the loop (a lookup function of the test's, whose answers it changes, and getaddrinfo() for
 * "localhost"), answers kept and taken again, lookups joined, withdrawn, refreshed, and a
 * close with a lookup in flight; and the socket address helpers. */
#define _GNU_SOURCE /* usleep */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "resolver.h"

/* ---- the test's lookup function ----------------------------------------------------------- */

static pthread_mutex_t fakeMu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fakeCv = PTHREAD_COND_INITIALIZER;
static char fakeAnswer[64] = "10.0.0.1"; /* what every name resolves to; "" fails */
static bool fakeHold;                    /* lookups wait until it is false */
static atomic_int fakeCalls;             /* lookups started */
static atomic_int fakeReturned;          /* lookups returned */

static int fakeLookup(const char *host, struct sockaddr_storage *out, size_t cap, size_t *n)
{
    (void)host;
    atomic_fetch_add(&fakeCalls, 1);
    pthread_mutex_lock(&fakeMu);
    while (fakeHold) {
        pthread_cond_wait(&fakeCv, &fakeMu);
    }
    char answer[64];
    memcpy(answer, fakeAnswer, sizeof answer);
    pthread_mutex_unlock(&fakeMu);
    *n = 0;
    int rv = EAI_NONAME;
    if (answer[0] != '\0' && cap > 0 && IdemSockaddrLiteral(answer, 0, &out[0])) {
        *n = 1;
        rv = 0;
    }
    atomic_fetch_add(&fakeReturned, 1);
    return rv;
}

static void fakeSet(const char *answer, bool hold)
{
    pthread_mutex_lock(&fakeMu);
    snprintf(fakeAnswer, sizeof fakeAnswer, "%s", answer);
    fakeHold = hold;
    pthread_cond_broadcast(&fakeCv);
    pthread_mutex_unlock(&fakeMu);
}

/* ---- answers ------------------------------------------------------------------------------ */

struct answer {
    int calls;
    int status;
    size_t n;
    char first[IDEM_SOCKADDR_TEXT_MAX];
};

static void answerCb(void *data, int status, const struct sockaddr_storage *addrs, size_t n)
{
    struct answer *a = data;
    a->calls++;
    a->status = status;
    a->n = n;
    a->first[0] = '\0';
    if (n > 0) {
        IdemSockaddrText((const struct sockaddr *)&addrs[0], a->first, sizeof a->first);
    }
}

/* Runs the loop until *calls reaches want (or 5 s pass). */
static void runUntil(uv_loop_t *loop, const int *calls, int want)
{
    for (int i = 0; i < 5000 && *calls < want; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(*calls, want);
}

static void closeResolver(uv_loop_t *loop, struct idem_resolver *r)
{
    IdemResolverClose(r);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
}

/* An answer comes on the loop, never from inside IdemResolve, with the port asked for; it is
 * kept (IdemResolverCached, within its age), and a new IdemResolve looks the name up again:
 * a name whose address changed is answered with the new one. */
static void test_lookups_are_answered_kept_and_asked_again(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    assert_non_null(r);
    IdemResolverSetLookup(r, fakeLookup);
    fakeSet("10.0.0.1", false);
    atomic_store(&fakeCalls, 0);
    struct sockaddr_storage ss[IDEM_RESOLVE_MAX];
    assert_int_equal(IdemResolverCached(r, "node1.test", 9001, UINT64_MAX, ss, 8), 0);

    struct answer a = {0};
    struct idem_lookup *l = NULL;
    assert_int_equal(IdemResolve(r, "node1.test", 9001, answerCb, &a, &l), 0);
    assert_int_equal(a.calls, 0);
    runUntil(&loop, &a.calls, 1);
    assert_int_equal(a.status, 0);
    assert_int_equal(a.n, 1);
    assert_string_equal(a.first, "10.0.0.1:9001");
    assert_int_equal(IdemResolverLookups(r), 1);

    /* Kept: taken again with another port, while it is young enough. */
    assert_int_equal(IdemResolverCached(r, "node1.test", 7001, 60000, ss, 8), 1);
    char text[IDEM_SOCKADDR_TEXT_MAX];
    IdemSockaddrText((const struct sockaddr *)&ss[0], text, sizeof text);
    assert_string_equal(text, "10.0.0.1:7001");
    uv_sleep(5);
    uv_update_time(&loop);
    assert_int_equal(IdemResolverCached(r, "node1.test", 7001, 0, ss, 8), 0); /* too old */

    /* The name moves: a new lookup says so; the kept answer follows. */
    fakeSet("::1", false);
    assert_int_equal(IdemResolve(r, "node1.test", 9001, answerCb, &a, &l), 0);
    runUntil(&loop, &a.calls, 2);
    assert_string_equal(a.first, "[::1]:9001");
    assert_int_equal(IdemResolverLookups(r), 2);
    assert_int_equal(atomic_load(&fakeCalls), 2);
    assert_int_equal(IdemResolverCached(r, "node1.test", 1, 60000, ss, 8), 1);
    IdemSockaddrText((const struct sockaddr *)&ss[0], text, sizeof text);
    assert_string_equal(text, "[::1]:1");

    /* A name that does not resolve: its error, no addresses, nothing kept to take. */
    fakeSet("", false);
    assert_int_equal(IdemResolve(r, "gone.test", 1, answerCb, &a, &l), 0);
    runUntil(&loop, &a.calls, 3);
    assert_int_equal(a.status, EAI_NONAME);
    assert_int_equal(a.n, 0);
    assert_int_equal(IdemResolverCached(r, "gone.test", 1, UINT64_MAX, ss, 8), 0);
    assert_non_null(IdemResolveStrerror(a.status));
    closeResolver(&loop, r);
}

/* Two asks for a name while its lookup is out share it; a withdrawn one is not called; a
 * refresh looks a name up only when its answer is old (or there is none). */
static void test_lookups_are_joined_withdrawn_and_refreshed(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    IdemResolverSetLookup(r, fakeLookup);
    atomic_store(&fakeCalls, 0);
    fakeSet("10.0.0.2", true);
    struct answer a = {0}, b = {0}, c = {0};
    struct idem_lookup *la, *lb, *lc;
    assert_int_equal(IdemResolve(r, "n.test", 1, answerCb, &a, &la), 0);
    assert_int_equal(IdemResolve(r, "n.test", 2, answerCb, &b, &lb), 0);
    assert_int_equal(IdemResolve(r, "n.test", 3, answerCb, &c, &lc), 0);
    IdemResolveCancel(lb);
    fakeSet("10.0.0.2", false);
    runUntil(&loop, &c.calls, 1);
    runUntil(&loop, &a.calls, 1);
    assert_string_equal(a.first, "10.0.0.2:1");
    assert_string_equal(c.first, "10.0.0.2:3");
    assert_int_equal(b.calls, 0);
    assert_int_equal(IdemResolverLookups(r), 1);

    /* Fresh: no lookup. Old: one, in the background, whose answer is then kept. */
    IdemResolverRefresh(r, "n.test", 60000);
    assert_int_equal(IdemResolverLookups(r), 1);
    fakeSet("10.0.0.3", false);
    uv_sleep(5);
    uv_update_time(&loop);
    IdemResolverRefresh(r, "n.test", 1);
    IdemResolverRefresh(r, "n.test", 1); /* in flight already: not twice */
    assert_int_equal(IdemResolverLookups(r), 2);
    struct sockaddr_storage ss[2];
    char text[IDEM_SOCKADDR_TEXT_MAX] = "";
    for (int i = 0; i < 5000 && strcmp(text, "10.0.0.3:5") != 0; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
        if (IdemResolverCached(r, "n.test", 5, UINT64_MAX, ss, 2) == 1) {
            IdemSockaddrText((const struct sockaddr *)&ss[0], text, sizeof text);
        }
    }
    assert_string_equal(text, "10.0.0.3:5");
    /* A name never asked for is looked up by a refresh. */
    IdemResolverRefresh(r, "m.test", 60000);
    assert_int_equal(IdemResolverLookups(r), 3);
    closeResolver(&loop, r);
}

/* Closed with a lookup on its thread and others queued: nobody is called, the loop's
 * handle closes at once, the thread ends once its lookup returns. */
static void test_close_drops_what_is_in_flight(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    IdemResolverSetLookup(r, fakeLookup);
    atomic_store(&fakeCalls, 0);
    atomic_store(&fakeReturned, 0);
    fakeSet("10.0.0.4", true);
    struct answer a = {0}, b = {0};
    struct idem_lookup *la, *lb;
    assert_int_equal(IdemResolve(r, "one.test", 1, answerCb, &a, &la), 0);
    assert_int_equal(IdemResolve(r, "two.test", 1, answerCb, &b, &lb), 0);
    for (int i = 0; i < 5000 && atomic_load(&fakeCalls) < 1; i++) {
        usleep(1000);
    }
    assert_int_equal(atomic_load(&fakeCalls), 1); /* one.test on the thread, two.test queued */
    closeResolver(&loop, r);
    fakeSet("10.0.0.4", false);
    for (int i = 0; i < 5000 && atomic_load(&fakeReturned) < 1; i++) {
        usleep(1000);
    }
    usleep(20000); /* the thread frees what it shared, and ends */
    assert_int_equal(atomic_load(&fakeCalls), 1);
    assert_int_equal(a.calls + b.calls, 0);
}

/* The real lookup: localhost (in /etc/hosts). */
static void test_getaddrinfo_resolves_localhost(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    struct answer a = {0};
    struct idem_lookup *l;
    assert_int_equal(IdemResolve(r, "localhost", 7001, answerCb, &a, &l), 0);
    runUntil(&loop, &a.calls, 1);
    assert_int_equal(a.status, 0);
    assert_true(a.n >= 1);
    assert_true(strcmp(a.first, "127.0.0.1:7001") == 0 || strcmp(a.first, "[::1]:7001") == 0);
    closeResolver(&loop, r);
    struct sockaddr_storage ss;
    char why[128];
    assert_int_equal(IdemSockaddrResolveNow("localhost", 5, &ss, why, sizeof why), 0);
    assert_int_equal(IdemSockaddrResolveNow("no-such-host.invalid", 5, &ss, why, sizeof why), -1);
    assert_non_null(strstr(why, "cannot resolve no-such-host.invalid: "));
}

/* ---- socket addresses ---------------------------------------------------------------------- */

static void test_host_port_split(void **state)
{
    (void)state;
    char host[64];
    uint16_t port = 0;
    assert_true(IdemHostPortSplit("127.0.0.1:9001", host, sizeof host, &port));
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9001);
    assert_true(IdemHostPortSplit("[::1]:1", host, sizeof host, &port));
    assert_string_equal(host, "::1");
    assert_int_equal(port, 1);
    assert_true(IdemHostPortSplit("node-1.example:65535", host, sizeof host, &port));
    assert_string_equal(host, "node-1.example");
    assert_int_equal(port, 65535);
    static const char *const bad[] = {
        "127.0.0.1", "::1:9001", "[::1]", "[::1]9001", ":9001", "[]:9001",  "a:0",
        "a:65536",   "a:x",      "a:",    "a:123456",  "",      "[::1:9001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (IdemHostPortSplit(bad[i], host, sizeof host, &port)) {
            fail_msg("took \"%s\"", bad[i]);
        }
    }
    char small[4];
    assert_false(IdemHostPortSplit("abcd:1", small, sizeof small, &port)); /* no room */
    assert_true(IdemHostPortSplit("abc:1", small, sizeof small, &port));
}

static void test_socket_addresses(void **state)
{
    (void)state;
    struct sockaddr_storage v4, v6, mapped, any4, any6, other;
    assert_true(IdemSockaddrLiteral("127.0.0.1", 80, &v4));
    assert_true(IdemSockaddrLiteral("::1", 80, &v6));
    assert_true(IdemSockaddrLiteral("::ffff:127.0.0.1", 80, &mapped));
    assert_true(IdemSockaddrLiteral("0.0.0.0", 80, &any4));
    assert_true(IdemSockaddrLiteral("::", 80, &any6));
    assert_true(IdemSockaddrLiteral("127.0.0.1", 81, &other));
    assert_false(IdemSockaddrLiteral("localhost", 80, &other));
    assert_false(IdemSockaddrLiteral("127.1", 80, &other));
    char text[IDEM_SOCKADDR_TEXT_MAX];
    IdemSockaddrText((const struct sockaddr *)&v4, text, sizeof text);
    assert_string_equal(text, "127.0.0.1:80");
    IdemSockaddrText((const struct sockaddr *)&v6, text, sizeof text);
    assert_string_equal(text, "[::1]:80");
    /* An IPv4 address and its mapped form are one key. */
    uint8_t k4[16], k6[16], km[16];
    assert_true(IdemSockaddrKey((const struct sockaddr *)&v4, k4));
    assert_true(IdemSockaddrKey((const struct sockaddr *)&v6, k6));
    assert_true(IdemSockaddrKey((const struct sockaddr *)&mapped, km));
    assert_memory_equal(k4, km, 16);
    assert_memory_not_equal(k4, k6, 16);
    struct sockaddr_storage unix_sa = {.ss_family = AF_UNIX};
    assert_false(IdemSockaddrKey((const struct sockaddr *)&unix_sa, k4));
    /* Listeners: the same address and port, or a wildcard's port. */
    const struct sockaddr *sv4 = (const struct sockaddr *)&v4;
    assert_true(IdemSockaddrMatches(sv4, sv4));
    assert_true(IdemSockaddrMatches(sv4, (const struct sockaddr *)&mapped));
    assert_true(IdemSockaddrMatches((const struct sockaddr *)&any4, sv4));
    assert_true(IdemSockaddrMatches((const struct sockaddr *)&any6, sv4));
    assert_true(IdemSockaddrMatches((const struct sockaddr *)&any6, (const struct sockaddr *)&v6));
    assert_false(IdemSockaddrMatches(sv4, (const struct sockaddr *)&v6));
    assert_false(IdemSockaddrMatches(sv4, (const struct sockaddr *)&other));
    assert_false(
        IdemSockaddrMatches((const struct sockaddr *)&any4, (const struct sockaddr *)&other));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups_are_answered_kept_and_asked_again),
        cmocka_unit_test(test_lookups_are_joined_withdrawn_and_refreshed),
        cmocka_unit_test(test_close_drops_what_is_in_flight),
        cmocka_unit_test(test_getaddrinfo_resolves_localhost),
        cmocka_unit_test(test_host_port_split),
        cmocka_unit_test(test_socket_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
