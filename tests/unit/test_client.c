/* test_client: libidem's parts that need no cluster: names, argument checks, building
 * requests from the typed API, results, the deadline against an address where nothing
 * listens (synchronous and asynchronous, including close with pending requests), and
 * answers no idemd node sends but a client must survive, from a fake node on 127.0.0.1. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "internal.h"
#include "renew_plan.h"
#include "resolver.h"

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(idem_strerror(IDEM_OK), "ok");
    assert_true(IDEM_EUNAVAILABLE < 0 && IDEM_ECANCELED < 0);
    assert_string_equal(idem_strerror(IDEM_ECANCELED),
                        "canceled: the client was closed before an answer");
    assert_string_equal(idem_strerror(12345), "unknown error");
    assert_string_equal(idem_outcome_name(IDEM_OUTCOME_ACQUIRED), "acquired");
    assert_string_equal(idem_outcome_name(IDEM_OUTCOME_OUTCOME_UNKNOWN), "outcome_unknown");
    assert_string_equal(idem_outcome_name(IDEM_OUTCOME_FORBIDDEN), "forbidden");
    assert_string_equal(idem_outcome_name(0), "unspecified");
    assert_string_equal(idem_outcome_name(17), "unrecognized");
    assert_string_equal(idem_outcome_name(-1), "unrecognized");
    /* The public enum mirrors the wire's numbers. */
    assert_int_equal(IDEM_OUTCOME_FORBIDDEN, IDEM__OUTCOME__OUTCOME_FORBIDDEN);
    assert_int_equal(IDEM_OUTCOME_LEASE_LOST, IDEM__OUTCOME__OUTCOME_LEASE_LOST);
    assert_int_equal(IDEM_STATE_RELEASED, IDEM__RECORD_STATE__RECORD_STATE_RELEASED);
    assert_int_equal(IDEM_COMPLETION_UNKNOWN, IDEM__COMPLETION__COMPLETION_UNKNOWN);
    assert_int_equal(IDEM_POLICY_TAKEOVER, IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER);
}

static void test_fingerprint_and_attempt(void **state)
{
    (void)state;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    assert_int_equal(idem_fingerprint("abc", 3, fp), IDEM_OK);
    static const uint8_t abc[4] = {0xba, 0x78, 0x16, 0xbf}; /* SHA-256("abc") */
    assert_memory_equal(fp, abc, 4);
    assert_int_equal(idem_fingerprint(NULL, 0, fp), IDEM_OK);
    assert_int_equal(idem_fingerprint(NULL, 3, fp), IDEM_EINVAL);
    char a[IDEM_ATTEMPT_ID_HEX + 1], b[IDEM_ATTEMPT_ID_HEX + 1];
    assert_int_equal(idem_attempt_id_new(a), IDEM_OK);
    assert_int_equal(idem_attempt_id_new(b), IDEM_OK);
    assert_int_equal(strlen(a), IDEM_ATTEMPT_ID_HEX);
    assert_string_not_equal(a, b);
}

static void test_open_checks(void **state)
{
    (void)state;
    struct idem_client *c = (struct idem_client *)1;
    char why[256];
    struct idem_options o = {.seeds = "localhost"};
    assert_int_equal(idem_client_open(&o, &c, why, sizeof why), IDEM_EINVAL);
    assert_null(c);
    assert_non_null(strstr(why, "missing :port"));
    o.seeds = "127.0.0.1:1";
    o.tls_cert_file = "/nonexistent/cert.pem";
    assert_int_equal(idem_client_open(&o, &c, why, sizeof why), IDEM_EINVAL);
    assert_non_null(strstr(why, "both cert and key"));
    o.tls_key_file = "/nonexistent/key.pem";
    assert_int_equal(idem_client_open(&o, &c, why, sizeof why), IDEM_ETLS);
    assert_non_null(strstr(why, "/nonexistent/cert.pem"));
    o.tls_cert_file = o.tls_key_file = NULL;
    o.tls_ca_file = "/nonexistent/ca.pem";
    assert_int_equal(idem_client_open(&o, &c, why, sizeof why), IDEM_ETLS);
    assert_null(c);
    assert_int_equal(idem_client_open(NULL, &c, why, sizeof why), IDEM_EINVAL);

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_async *a = (struct idem_async *)1;
    o = (struct idem_options){.seeds = "127.0.0.1:7001,nope"};
    assert_int_equal(idem_async_open(&loop, &o, &a, why, sizeof why), IDEM_EINVAL);
    assert_null(a);
    assert_non_null(strstr(why, "missing :port"));
    o = (struct idem_options){.seeds = "127.0.0.1:7001", .tls_ca_file = "/nonexistent/ca"};
    assert_int_equal(idem_async_open(&loop, &o, &a, why, sizeof why), IDEM_ETLS);
    assert_null(a);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_build_requests(void **state)
{
    (void)state;
    char why[256];
    struct idem_built b;
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {1};
    struct idem_op op = {.kind = IDEM_OP_CLAIM, .key = "k-1", .fingerprint = fp,
                         .attempt_id = "a1", .lease_ms = 5, .policy = IDEM_POLICY_TAKEOVER};
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_OK);
    assert_int_equal(b.req.op_case, IDEM__REQUEST__OP_CLAIM);
    assert_int_equal(b.req.claim->key.len, 3);
    assert_int_equal(b.req.claim->fingerprint.len, 32);
    assert_int_equal(b.req.claim->attempt_id.len, 2);
    assert_int_equal(b.req.claim->policy, IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER);
    IdemBuiltFree(&b);

    op.key = "";
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    op.key = "k";
    op.fingerprint = NULL;
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    op.fingerprint = fp;
    op.policy = 7;
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    op.policy = 0;
    op.attempt_id = "0123456789012345678901234567890123456789012345678901234567890123456789";
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    /* An empty one: refused (a retry of a claim without one gets in_progress, not its
     * lease back); NULL is the way to ask for a fresh one. */
    op.attempt_id = "";
    assert_int_equal(IdemOpBuild(&op, &b, why, sizeof why), IDEM_EINVAL);
    assert_non_null(strstr(why, "empty attempt id"));
    IdemBuiltFree(&b);

    struct idem_header h[2] = {{.name = "content-type", .value = (const uint8_t *)"a/b",
                                .value_len = 3},
                               {.name = "x", .value = NULL, .value_len = 0}};
    struct idem_response resp = {.status = 201, .headers = h, .n_headers = 2,
                                 .body = (const uint8_t *)"{}", .body_len = 2};
    struct idem_op cop = {.kind = IDEM_OP_COMPLETE, .key = "k", .token = 9,
                          .completion = IDEM_COMPLETION_FAILED_FINAL, .response = &resp};
    assert_int_equal(IdemOpBuild(&cop, &b, why, sizeof why), IDEM_OK);
    assert_int_equal(b.req.complete->response->n_headers, 2);
    assert_string_equal(b.req.complete->response->headers[0]->name, "content-type");
    assert_int_equal(b.req.complete->outcome, IDEM__COMPLETION__COMPLETION_FAILED_FINAL);
    IdemBuiltFree(&b);
    cop.completion = 0;
    assert_int_equal(IdemOpBuild(&cop, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    cop.completion = IDEM_COMPLETION_SUCCEEDED;
    h[1].name = NULL;
    assert_int_equal(IdemOpBuild(&cop, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
    cop.response = NULL;
    assert_int_equal(IdemOpBuild(&cop, &b, why, sizeof why), IDEM_EINVAL);
    IdemBuiltFree(&b);
}

/* A Response as the server would send it, through pack/unpack, into a result. */
static void test_result_fill(void **state)
{
    (void)state;
    Idem__Header h = IDEM__HEADER__INIT;
    h.name = "content-type";
    h.value.data = (uint8_t *)"text/plain";
    h.value.len = 10;
    Idem__Header *hp = &h;
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    sr.status = 201;
    sr.n_headers = 1;
    sr.headers = &hp;
    sr.body.data = (uint8_t *)"hello";
    sr.body.len = 5;
    Idem__Result res = IDEM__RESULT__INIT;
    res.outcome = IDEM__OUTCOME__OUTCOME_REPLAY;
    res.response = &sr;
    res.expires_at_ms = 77;
    Idem__Response m = IDEM__RESPONSE__INIT;
    m.request_id = 3;
    m.result = &res;
    uint8_t buf[512];
    size_t n = idem__response__pack(&m, buf);
    Idem__Response *u = idem__response__unpack(NULL, n, buf);
    assert_non_null(u);
    struct idem_result r;
    assert_int_equal(IdemResultFill(&r, u), IDEM_OK);
    assert_int_equal(r.outcome, IDEM_OUTCOME_REPLAY);
    assert_int_equal(r.has_response, 1);
    assert_int_equal(r.response.status, 201);
    assert_int_equal(r.response.body_len, 5);
    assert_memory_equal(r.response.body, "hello", 5);
    assert_int_equal(r.response.n_headers, 1);
    assert_string_equal(r.response.headers[0].name, "content-type");
    assert_int_equal(r.expires_at_ms, 77);
    struct idem_result moved;
    idem_result_move(&moved, &r);
    assert_null(r.priv_);
    idem_result_free(&r); /* zeroed: a no-op */
    /* idem_run's copy of a business response replaces the stored one. */
    struct idem_response mine = {.status = 500, .body = (const uint8_t *)"x", .body_len = 1,
                                 .body_ref = "s3://b/k"};
    assert_int_equal(IdemResultCopyResponse(&moved, &mine), IDEM_OK);
    assert_int_equal(moved.response.status, 500);
    assert_string_equal(moved.response.body_ref, "s3://b/k");
    assert_ptr_not_equal(moved.response.body, mine.body);
    idem_result_free(&moved);
    idem_result_free(&moved);
    idem_result_free(NULL);

    /* get: the record carries its response packed. */
    uint8_t packed[256];
    size_t pn = idem__stored_response__pack(&sr, packed);
    Idem__Record rec = IDEM__RECORD__INIT;
    rec.state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
    rec.token = 42;
    rec.response.data = packed;
    rec.response.len = pn;
    uint8_t fpb[32] = {9};
    rec.fingerprint.data = fpb;
    rec.fingerprint.len = 32;
    Idem__Result gres = IDEM__RESULT__INIT;
    gres.outcome = IDEM__OUTCOME__OUTCOME_OK;
    gres.record = &rec;
    m.result = &gres;
    n = idem__response__pack(&m, buf);
    u = idem__response__unpack(NULL, n, buf);
    assert_non_null(u);
    assert_int_equal(IdemResultFill(&r, u), IDEM_OK);
    assert_int_equal(r.has_record, 1);
    assert_int_equal(r.record.state, IDEM_STATE_COMPLETED);
    assert_int_equal(r.record.token, 42);
    assert_int_equal(r.record.fingerprint_len, 32);
    assert_int_equal(r.record.fingerprint[0], 9);
    assert_int_equal(r.has_response, 1);
    assert_memory_equal(r.response.body, "hello", 5);
    idem_result_free(&r);
}

/* Nothing listens on 127.0.0.1:1 (refused at once): the call retries until its deadline,
 * then answers IDEM_EUNAVAILABLE, with the reason. */
static void test_sync_deadline(void **state)
{
    (void)state;
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new("127.0.0.1:1", "t", &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_claim_opts o = {.deadline_ms = 300};
    struct idem_result r;
    uint64_t t0 = nowMs();
    assert_int_equal(idem_claim(c, "k", fp, &o, &r), IDEM_EUNAVAILABLE);
    uint64_t took = nowMs() - t0;
    assert_true(took >= 290);
    assert_true(took < 300 + 2000);
    assert_non_null(strstr(r.detail, "no leader answered within 300 ms (last: 127.0.0.1:1: "));
    assert_non_null(strstr(r.detail, "Connection refused"));
    assert_null(r.priv_);
    idem_result_free(&r);
    assert_int_equal(idem_claim(c, NULL, fp, &o, &r), IDEM_EINVAL);
    assert_int_equal(idem_complete(c, "k", 1, IDEM_COMPLETION_SUCCEEDED, NULL, 100, &r),
                     IDEM_EINVAL);
    assert_int_equal(idem_claim(NULL, "k", fp, &o, &r), IDEM_EINVAL);
    assert_int_equal(idem_run(c, "k", fp, &o, NULL, NULL, &r), IDEM_EINVAL);
    idem_client_close(c);
}

/* Two seeds, neither listening: the failure names what each said, not only the last one
 * tried (a lost quorum: refused connections, and a node up that knows no leader). */
static void test_sync_deadline_names_every_node(void **state)
{
    (void)state;
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new("127.0.0.1:1,127.0.0.1:2", "t", &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_claim_opts o = {.deadline_ms = 400};
    struct idem_result r;
    assert_int_equal(idem_claim(c, "k", fp, &o, &r), IDEM_EUNAVAILABLE);
    idem_result_free(&r);
    const char *why = idem_client_errmsg(c);
    assert_non_null(strstr(why, "no leader answered within 400 ms (each node's last answer: "));
    assert_non_null(strstr(why, "127.0.0.1:1: connect: Connection refused"));
    assert_non_null(strstr(why, "; 127.0.0.1:2: connect: Connection refused"));
    idem_client_close(c);
}

/* idem_call_why: the call's own account, as idem_client_errmsg() gives it. */
static void test_call_why_names_every_node(void **state)
{
    (void)state;
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new("127.0.0.1:1,127.0.0.1:2", "t", &c), IDEM_OK);
    Idem__GetRequest gr = IDEM__GET_REQUEST__INIT;
    gr.key.data = (uint8_t *)"k";
    gr.key.len = 1;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &gr;
    Idem__Response *resp = NULL;
    char why[512] = "unset";
    assert_int_equal(idem_call_why(c, &req, 300, &resp, why, sizeof why), IDEM_EUNAVAILABLE);
    assert_null(resp);
    assert_non_null(strstr(why, "no leader answered within 300 ms (each node's last answer: "));
    assert_non_null(strstr(why, "127.0.0.1:1: connect: Connection refused"));
    assert_non_null(strstr(why, "; 127.0.0.1:2: connect: Connection refused"));
    assert_string_equal(why, idem_client_errmsg(c));
    idem_client_close(c);
}

struct slot {
    int calls;
    int status;
};

struct counts {
    struct slot s[8];
    int closed;
};

static void countCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    (void)res;
    struct slot *slot = data;
    slot->calls++;
    slot->status = status;
}

static void closedCb(struct idem_async *a, void *data)
{
    (void)a;
    ((struct counts *)data)->closed++;
}

static void test_async_deadline_and_close(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    /* "localhost" goes through uv_getaddrinfo; port 1 refuses. */
    struct idem_options o = {.seeds = "localhost:1,127.0.0.1:1", .token = "t",
                             .default_deadline_ms = 200};
    struct idem_async *a = NULL;
    char why[128];
    assert_int_equal(idem_async_open(&loop, &o, &a, why, sizeof why), IDEM_OK);
    struct counts k;
    memset(&k, 0, sizeof k);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(idem_async_claim(a, "k", fp, NULL, countCb, &k.s[i]), IDEM_OK);
    }
    assert_int_equal(idem_async_claim(a, "", fp, NULL, countCb, &k.s[7]), IDEM_EINVAL);
    assert_int_equal(idem_async_pending(a), 4);
    uint64_t t0 = nowMs();
    while (idem_async_pending(a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uint64_t took = nowMs() - t0;
    assert_true(took >= 190 && took < 200 + 2000);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(k.s[i].calls, 1);
        assert_int_equal(k.s[i].status, IDEM_EUNAVAILABLE);
    }
    /* Two more, then close before any answer: each called back once, canceled. */
    assert_int_equal(idem_async_claim(a, "k", fp, NULL, countCb, &k.s[4]), IDEM_OK);
    assert_int_equal(idem_async_get(a, "k", 0, countCb, &k.s[5]), IDEM_OK);
    uv_run(&loop, UV_RUN_NOWAIT);
    idem_async_close(a, closedCb, &k);
    assert_int_equal(k.s[4].calls, 1);
    assert_int_equal(k.s[4].status, IDEM_ECANCELED);
    assert_int_equal(k.s[5].calls, 1);
    assert_int_equal(k.s[5].status, IDEM_ECANCELED);
    assert_int_equal(idem_async_claim(a, "k", fp, NULL, countCb, &k.s[6]), IDEM_ECLOSED);
    assert_int_equal(k.closed, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(k.closed, 1);
    assert_int_equal(k.s[6].calls, 0);
    assert_int_equal(k.s[7].calls, 0);
    assert_int_equal(uv_loop_close(&loop), 0); /* no handle left open */
}

static char detailSeen[256];

static void detailCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    *(int *)data = status;
    snprintf(detailSeen, sizeof detailSeen, "%s", res->detail);
}

/* Two seeds, neither listening: the asynchronous client's failure names what each said, as
 * the synchronous one's does (it named only the last connection's failure). */
static void test_async_deadline_names_every_node(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options o = {
        .seeds = "127.0.0.1:1,127.0.0.1:2", .token = "t", .default_deadline_ms = 400};
    struct idem_async *a = NULL;
    char why[128];
    assert_int_equal(idem_async_open(&loop, &o, &a, why, sizeof why), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    int status = 0;
    detailSeen[0] = '\0';
    assert_int_equal(idem_async_claim(a, "k", fp, NULL, detailCb, &status), IDEM_OK);
    while (idem_async_pending(a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_int_equal(status, IDEM_EUNAVAILABLE);
    assert_non_null(
        strstr(detailSeen, "no leader answered within 400 ms (each node's last answer: "));
    /* libuv's words: uv_strerror(UV_ECONNREFUSED) */
    assert_non_null(strstr(detailSeen, "127.0.0.1:1: connect: connection refused"));
    assert_non_null(strstr(detailSeen, "; 127.0.0.1:2: connect: connection refused"));
    idem_async_close(a, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* The client's frame limit and the node's frame_too_large answer. */
static void test_frame_limit(void **state)
{
    (void)state;
    struct idem_options o = {.seeds = "127.0.0.1:1"};
    assert_int_equal(IdemMaxFrame(&o), IDEM_MAX_FRAME);
    o.max_frame_bytes = 100;
    assert_int_equal(IdemMaxFrame(&o), 1024);
    o.max_frame_bytes = 1u << 20;
    assert_int_equal(IdemMaxFrame(&o), 1u << 20);
    o.max_frame_bytes = IDEM_MAX_FRAME + 1;
    assert_int_equal(IdemMaxFrame(&o), IDEM_MAX_FRAME);

    Idem__Result res = IDEM__RESULT__INIT;
    Idem__Response m = IDEM__RESPONSE__INIT;
    assert_false(IdemFrameTooLarge(&m)); /* no result */
    m.result = &res;
    res.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    res.detail = (char *)"key too long";
    assert_false(IdemFrameTooLarge(&m));
    res.detail = (char *)IDEM_FRAME_TOO_LARGE;
    assert_true(IdemFrameTooLarge(&m));
    res.outcome = IDEM__OUTCOME__OUTCOME_OK;
    assert_false(IdemFrameTooLarge(&m));

    /* A request over the client's limit fails at once, nothing sent. */
    o.max_frame_bytes = 1024;
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_open(&o, &c, NULL, 0), IDEM_OK);
    static uint8_t body[2048];
    struct idem_response resp = {.status = 200, .body = body, .body_len = sizeof body};
    struct idem_result r;
    assert_int_equal(idem_complete(c, "k", 1, IDEM_COMPLETION_SUCCEEDED, &resp, 1000, &r),
                     IDEM_ETOOBIG);
    idem_result_free(&r);
    idem_client_close(c);
}

struct errmsgArg {
    struct idem_client *c;
    const char *ptr;
    char text[IDEM_ERRMSG_LEN];
};

static void *errmsgThread(void *arg)
{
    struct errmsgArg *e = arg;
    e->ptr = idem_client_errmsg(e->c);
    snprintf(e->text, sizeof e->text, "%s", e->ptr);
    return NULL;
}

/* idem_client_errmsg() hands each thread its own copy: another thread's call cannot
 * change the text under a reader. */
static void test_errmsg_is_a_per_thread_copy(void **state)
{
    (void)state;
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new("127.0.0.1:1", NULL, &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_result r;
    assert_int_equal(idem_claim(c, "k", fp, &(struct idem_claim_opts){.deadline_ms = 50}, &r),
                     IDEM_EUNAVAILABLE);
    idem_result_free(&r);
    const char *mine = idem_client_errmsg(c);
    assert_true(strlen(mine) > 0);
    struct errmsgArg e = {.c = c};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, errmsgThread, &e), 0);
    pthread_join(th, NULL);
    assert_ptr_not_equal(e.ptr, mine);
    assert_string_equal(e.text, mine);
    idem_client_close(c);
}

/* Renewals that all fail, each after its whole deadline (a node that never answers), from a
 * claim at time 0 with a `lease`-ms lease: how many ended before the lease did. */
static int failedRenewalsBeforeEnd(uint64_t lease)
{
    uint64_t now = 0, end = lease;
    int n = 0;
    bool failed = false;
    for (int i = 0; i < 100; i++) {
        uint64_t at;
        uint32_t dl;
        renew_plan(now, lease, end, 0, failed, true, &at, &dl);
        assert_true(at >= now);
        if (at >= end) {
            break;
        }
        now = at + dl;
        failed = true;
        n += now <= end;
    }
    return n;
}

/* idem_run's renewal schedule: a third of the lease after the last success; after a
 * failure another try soon, not a whole interval later (when the lease may have ended);
 * each try's deadline within the lease left, a third of it and 2 s. */
static void test_renew_plan(void **state)
{
    (void)state;
    uint64_t at;
    uint32_t dl;
    /* A 30 s lease claimed at t=1000: the first renewal at 11000, for at most 2 s. */
    renew_plan(1000, 30000, 31000, 1000, false, true, &at, &dl);
    assert_int_equal(at, 11000);
    assert_int_equal(dl, RENEW_ATTEMPT_MAX_MS);
    /* It failed at 13000: the next at 13000 + 30000/3/8. */
    renew_plan(13000, 30000, 31000, 1000, true, true, &at, &dl);
    assert_int_equal(at, 14250);
    assert_int_equal(dl, RENEW_ATTEMPT_MAX_MS);
    /* A success sent at 14250 moves both: next at 24250. */
    renew_plan(14300, 30000, 44250, 14250, false, false, &at, &dl);
    assert_int_equal(at, 24250);
    /* Close to the end the deadline shrinks to what is left less the margin (all of it
     * when that is less than the margin)... */
    renew_plan(27000, 30000, 31000, 1000, true, false, &at, &dl);
    assert_int_equal(at, 28250);
    assert_int_equal(dl, 1500); /* 2750 left - 1250 */
    renew_plan(29000, 30000, 31000, 1000, true, false, &at, &dl);
    assert_int_equal(at, 30250);
    assert_int_equal(dl, 750);
    /* ...and past the end it is the floor. */
    renew_plan(40000, 30000, 31000, 1000, true, false, &at, &dl);
    assert_int_equal(at, 41250);
    assert_int_equal(dl, RENEW_MIN_DEADLINE_MS);
    /* A 600 ms lease whose node never answers: two tries end before the lease does (the
     * schedule before this one made a single try, and the next started at the lease's end);
     * a 30 s lease gets many. */
    assert_int_equal(failedRenewalsBeforeEnd(600), 2);
    assert_true(failedRenewalsBeforeEnd(30000) >= 6);
    /* The smallest intervals are bounded. */
    renew_plan(0, 30, 30, 0, false, true, &at, &dl);
    assert_int_equal(at, 20);
    assert_int_equal(dl, RENEW_MIN_DEADLINE_MS);
    /* A holder's own retry of its claim answers with the lease it has left: 10 ms of it,
     * claimed at 1000, planned at 1002. A renewal after the 20 ms floor would come after
     * the lease ended: it goes at once... */
    renew_plan(1002, 10, 1010, 1000, false, true, &at, &dl);
    assert_int_equal(at, 1002);
    assert_int_equal(dl, RENEW_MIN_DEADLINE_MS);
    renew_plan(1002, 0, 1000, 1000, false, true, &at, &dl); /* nothing left */
    assert_int_equal(at, 1002);
    /* ...but a granted lease that short (after a renewal) keeps the floor between renewals,
     * and so does a failed try. */
    renew_plan(1002, 10, 1010, 1000, false, false, &at, &dl);
    assert_int_equal(at, 1020);
    renew_plan(1002, 10, 1010, 1000, true, true, &at, &dl);
    assert_int_equal(at, 1022);
    /* 100 ms left of the claim's lease: a third of it, as for any lease. */
    renew_plan(1002, 100, 1100, 1000, false, true, &at, &dl);
    assert_int_equal(at, 1033);
}

/* ---- a fake node ------------------------------------------------------------------------ */

/* How the fake node answers each request frame it reads. */
enum fakeMode {
    FAKE_NO_RESULT,  /* a Response with the request's id and no result */
    FAKE_UNREADABLE, /* request_id 0 and INVALID (the node could not read the frame), then
                      * the connection closed, as idemd does */
    FAKE_GRANT,      /* claim: acquired (token FAKE_TOKEN); release: release_outcome */
    FAKE_BUSY,       /* as FAKE_GRANT, but the next `busy` claims are refused for load
                      * (unavailable with retry_after_ms, as a leader past its pending
                      * budget answers) */
    FAKE_REDIRECT,   /* not_leader, naming `redirect` as the leader */
    FAKE_FLOOD,      /* answers to another request id, sent without pause for FLOOD_MS (a
                      * broken or hostile peer), then the connection closed */
};

#define FLOOD_MS 4000

#define FAKE_TOKEN 7

struct fakeNode {
    int lfd;
    char addr[32];
    enum fakeMode mode;
    atomic_int requests; /* request frames read */
    Idem__Outcome release_outcome;
    atomic_int releases;               /* FAKE_GRANT: releases of FAKE_TOKEN */
    atomic_int busy;                   /* FAKE_BUSY: claims still to refuse */
    atomic_bool busy_by_key;           /* FAKE_BUSY: refuse the claims of keys "busy..."
                                        * (all of them), instead of counting */
    _Atomic uint64_t busy_retry_ms;    /* FAKE_BUSY: their retry_after_ms (10 at start) */
    atomic_int conns;                  /* connections accepted */
    char redirect[32];                 /* FAKE_REDIRECT: the leader it names */
    atomic_bool stop;
    pthread_t th;
    uint8_t frame[1 << 16]; /* the request being read */
};

/* Reads n bytes from fd; false on EOF, an error or stop. */
static bool fakeRead(struct fakeNode *f, int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, 50);
        if (atomic_load(&f->stop)) {
            return false;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t got = recv(fd, p, n, 0);
        if (got <= 0) {
            return false;
        }
        p += got;
        n -= (size_t)got;
    }
    return true;
}

/* (cmocka's asserts are for the test's own thread: the fake node's thread returns false.) */
static bool fakeSend(int fd, const Idem__Response *m)
{
    uint8_t buf[512];
    size_t n = idem__response__get_packed_size(m);
    if (n + 4 > sizeof buf) {
        return false;
    }
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    idem__response__pack(m, buf + 4);
    return send(fd, buf, n + 4, MSG_NOSIGNAL) == (ssize_t)(n + 4);
}

/* FAKE_FLOOD: Responses to request `id` (not the client's), a socket buffer's worth at a
 * time so that the client always has bytes to read, until FLOOD_MS passed, the client
 * closed, or stop. */
static void fakeFlood(struct fakeNode *f, int fd, uint64_t id)
{
    Idem__Response m = IDEM__RESPONSE__INIT;
    m.request_id = id;
    m.error = (char *)"an answer to another request";
    size_t n = idem__response__get_packed_size(&m), one = n + 4;
    static uint8_t buf[1 << 16];
    size_t frames = sizeof buf / one, len = frames * one;
    for (size_t i = 0; i < frames; i++) {
        uint8_t *p = buf + i * one;
        p[0] = p[1] = 0;
        p[2] = (uint8_t)(n >> 8);
        p[3] = (uint8_t)n;
        idem__response__pack(&m, p + 4);
    }
    uint64_t end = nowMs() + FLOOD_MS;
    size_t off = 0;
    while (nowMs() < end && !atomic_load(&f->stop)) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, 50) <= 0) {
            continue;
        }
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            return; /* the client closed */
        }
        off = w > 0 ? (off + (size_t)w) % len : off;
    }
}

/* Serves one connection until it ends (or, unreadable, after the first answer). */
static void fakeServe(struct fakeNode *f, int fd)
{
    uint8_t *frame = f->frame;
    for (;;) {
        uint8_t hdr[4];
        if (!fakeRead(f, fd, hdr, sizeof hdr)) {
            return;
        }
        uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 |
                     (uint32_t)hdr[3];
        if (n > sizeof f->frame || !fakeRead(f, fd, frame, n)) {
            return;
        }
        Idem__Request *req = idem__request__unpack(NULL, n, frame);
        if (req == NULL) {
            return; /* not a libidem frame: the test sees too few requests */
        }
        atomic_fetch_add(&f->requests, 1);
        if (f->mode == FAKE_FLOOD) {
            uint64_t other = req->request_id + 1000000;
            idem__request__free_unpacked(req, NULL);
            fakeFlood(f, fd, other);
            return;
        }
        Idem__Response resp = IDEM__RESPONSE__INIT;
        Idem__Result res = IDEM__RESULT__INIT;
        if (f->mode == FAKE_BUSY && req->op_case == IDEM__REQUEST__OP_CLAIM &&
            (atomic_load(&f->busy_by_key)
                 ? req->claim->key.len >= 4 && memcmp(req->claim->key.data, "busy", 4) == 0
                 : atomic_fetch_sub(&f->busy, 1) > 0)) {
            resp.request_id = req->request_id;
            resp.result = &res;
            resp.error = (char *)"the leader holds batch.max_pending_mb of commands not yet "
                                 "committed: send it again later";
            res.outcome = IDEM__OUTCOME__OUTCOME_UNAVAILABLE;
            res.retry_after_ms = atomic_load(&f->busy_retry_ms);
        } else if (f->mode == FAKE_GRANT || f->mode == FAKE_BUSY) {
            resp.request_id = req->request_id;
            resp.result = &res;
            res.outcome = IDEM__OUTCOME__OUTCOME_OK;
            if (req->op_case == IDEM__REQUEST__OP_CLAIM) {
                res.outcome = IDEM__OUTCOME__OUTCOME_ACQUIRED;
                res.token = FAKE_TOKEN;
                res.lease_ms = 1000;
            } else if (req->op_case == IDEM__REQUEST__OP_RELEASE) {
                res.outcome = f->release_outcome;
                if (req->release->token == FAKE_TOKEN) {
                    atomic_fetch_add(&f->releases, 1);
                }
            }
        } else if (f->mode == FAKE_REDIRECT) {
            resp.request_id = req->request_id;
            resp.result = &res;
            resp.leader_rpc_address = f->redirect;
            res.outcome = IDEM__OUTCOME__OUTCOME_NOT_LEADER;
        } else if (f->mode == FAKE_NO_RESULT) {
            resp.request_id = req->request_id;
            resp.error = (char *)"nothing to say";
        } else {
            res.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
            resp.result = &res;
            resp.error = (char *)"frame does not decode as a Request";
        }
        idem__request__free_unpacked(req, NULL);
        if (!fakeSend(fd, &resp) || f->mode == FAKE_UNREADABLE) {
            return;
        }
    }
}

static void *fakeMain(void *arg)
{
    struct fakeNode *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd pf = {.fd = f->lfd, .events = POLLIN};
        if (poll(&pf, 1, 50) <= 0) {
            continue;
        }
        int fd = accept(f->lfd, NULL, NULL);
        if (fd >= 0) {
            atomic_fetch_add(&f->conns, 1);
            fakeServe(f, fd);
            close(fd);
        }
    }
    return NULL;
}

static struct fakeNode *fakeStart(enum fakeMode mode)
{
    struct fakeNode *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->mode = mode;
    f->release_outcome = IDEM__OUTCOME__OUTCOME_OK;
    atomic_store(&f->busy_retry_ms, 10);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->lfd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->lfd, 16), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    assert_int_equal(pthread_create(&f->th, NULL, fakeMain, f), 0);
    return f;
}

static void fakeStop(struct fakeNode *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    close(f->lfd);
    free(f);
}

struct asyncOne {
    int calls;
    int status;
    char detail[256];
};

static void asyncOneCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    struct asyncOne *o = data;
    o->calls++;
    o->status = status;
    snprintf(o->detail, sizeof o->detail, "%s", res->detail);
    assert_null(res->priv_); /* a failure: zeroed but for detail */
}

/* One async claim against `addr`: its callback's status and detail in *o. */
static void asyncClaimOnce(const char *addr, uint32_t deadline_ms, struct asyncOne *o)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options opts = {.seeds = addr, .token = "t", .default_deadline_ms = deadline_ms};
    struct idem_async *a = NULL;
    assert_int_equal(idem_async_open(&loop, &opts, &a, NULL, 0), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    memset(o, 0, sizeof *o);
    assert_int_equal(idem_async_claim(a, "k", fp, NULL, asyncOneCb, o), IDEM_OK);
    while (idem_async_pending(a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    idem_async_close(a, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(o->calls, 1);
}

/* An answer to our request without a result: no outcome is known, so the call fails with
 * IDEM_EPROTO, synchronous and asynchronous alike (the synchronous call answered IDEM_OK
 * with outcome "unspecified", which no call lists). */
static void test_answer_without_a_result(void **state)
{
    (void)state;
    struct fakeNode *f = fakeStart(FAKE_NO_RESULT);
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_result r;
    struct idem_claim_opts o = {.deadline_ms = 5000};
    assert_int_equal(idem_claim(c, "k", fp, &o, &r), IDEM_EPROTO);
    assert_null(r.priv_);
    assert_int_equal(r.outcome, IDEM_OUTCOME_UNSPECIFIED);
    assert_non_null(strstr(r.detail, "carries no result: nothing to say"));
    idem_result_free(&r);
    assert_int_equal(idem_get(c, "k", 5000, &r), IDEM_EPROTO);
    idem_result_free(&r);
    idem_client_close(c);

    struct asyncOne ao;
    asyncClaimOnce(f->addr, 5000, &ao);
    assert_int_equal(ao.status, IDEM_EPROTO);
    assert_non_null(strstr(ao.detail, "carries no result"));
    assert_int_equal(atomic_load(&f->requests), 3); /* each sent once */
    fakeStop(f);
}

/* A node that keeps sending answers to another request (without a pause, so that no read
 * ever waits) does not hold a call past its deadline: the call gives up at it and says so. */
static void test_flooding_node_does_not_hold_a_call_past_its_deadline(void **state)
{
    (void)state;
    struct fakeNode *f = fakeStart(FAKE_FLOOD);
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
    struct idem_result r;
    uint64_t t0 = nowMs();
    assert_int_equal(idem_get(c, "k", 300, &r), IDEM_EUNAVAILABLE);
    uint64_t took = nowMs() - t0;
    /* Before the fix the call returned only when the flood ended, after FLOOD_MS. */
    assert_true(took < FLOOD_MS / 2);
    assert_non_null(strstr(r.detail, "no answer before the deadline"));
    idem_result_free(&r);
    idem_client_close(c);
    assert_true(atomic_load(&f->requests) >= 1);
    fakeStop(f);
}

struct busyRun {
    int acquired, other;
};

static void busyCb(struct idem_async *a, int status, struct idem_result *res, void *data)
{
    (void)a;
    struct busyRun *b = data;
    if (status == IDEM_OK && res->outcome == IDEM_OUTCOME_ACQUIRED && res->token == FAKE_TOKEN) {
        b->acquired++;
    } else {
        b->other++;
    }
}

struct amongOthers {
    struct idem_async *a;
    struct asyncOne busy;
    struct busyRun others;
    int sent;
};

/* Every 20 ms, another claim the fake node grants, until the refused one is called back. */
static void othersTick(uv_timer_t *t)
{
    struct amongOthers *m = t->data;
    if (m->busy.calls > 0 || m->sent == 200) {
        uv_timer_stop(t);
        return;
    }
    char key[16];
    snprintf(key, sizeof key, "ok%d", m->sent++);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    assert_int_equal(idem_async_claim(m->a, key, fp, NULL, busyCb, &m->others), IDEM_OK);
}

static void busyAmongOthers(const char *addr)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options opts = {.seeds = addr, .token = "t", .default_deadline_ms = 5000};
    struct amongOthers m;
    memset(&m, 0, sizeof m);
    assert_int_equal(idem_async_open(&loop, &opts, &m.a, NULL, 0), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_claim_opts co = {.deadline_ms = 600};
    assert_int_equal(idem_async_claim(m.a, "busy1", fp, &co, asyncOneCb, &m.busy), IDEM_OK);
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    tick.data = &m;
    uv_timer_start(&tick, othersTick, 20, 20);
    while (m.busy.calls == 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    while (idem_async_pending(m.a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    idem_async_close(m.a, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(m.busy.status, IDEM_EUNAVAILABLE);
    assert_non_null(strstr(m.busy.detail, "batch.max_pending_mb"));
    assert_true(m.others.acquired > 0); /* answered meanwhile */
    assert_int_equal(m.others.other, 0);
}

/* A leader that refuses a request for load (its pending budget, or the tenant's share of
 * it) answers unavailable with retry_after_ms: both clients send that request to it again
 * after that long, on the same connection, rather than take the node for a failed one
 * (which closed the connection, and the asynchronous client sent every request in flight
 * on it again). */
static void test_busy_leader_is_asked_again_on_the_same_connection(void **state)
{
    (void)state;
    struct fakeNode *f = fakeStart(FAKE_BUSY);
    atomic_store(&f->busy, 3);
    /* A second seed that would grant at once: the busy leader is not left for it. */
    struct fakeNode *g = fakeStart(FAKE_GRANT);
    char seeds[80];
    snprintf(seeds, sizeof seeds, "%s,%s", f->addr, g->addr);
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new(seeds, "t", &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_result r;
    struct idem_claim_opts o = {.deadline_ms = 5000};
    assert_int_equal(idem_claim(c, "k", fp, &o, &r), IDEM_OK);
    assert_int_equal(r.outcome, IDEM_OUTCOME_ACQUIRED);
    idem_result_free(&r);
    assert_int_equal(atomic_load(&f->requests), 4); /* refused three times, then taken */
    assert_int_equal(atomic_load(&f->conns), 1);
    assert_int_equal(atomic_load(&g->requests), 0);
    /* Refused until the deadline: the last refusal is what the call says. */
    atomic_store(&f->busy, 1000000);
    o.deadline_ms = 300;
    assert_int_equal(idem_claim(c, "k2", fp, &o, &r), IDEM_EUNAVAILABLE);
    assert_non_null(strstr(r.detail, "batch.max_pending_mb"));
    idem_result_free(&r);
    assert_int_equal(atomic_load(&f->conns), 1);
    assert_int_equal(atomic_load(&g->requests), 0);
    idem_client_close(c);

    /* Five pipelined claims, the first three refused: each refused one alone waits and
     * goes again; nothing else is sent twice and the connection stays. */
    atomic_store(&f->busy, 3);
    atomic_store(&f->requests, 0);
    int conns = atomic_load(&f->conns);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options opts = {.seeds = seeds, .token = "t", .default_deadline_ms = 5000};
    struct idem_async *a = NULL;
    assert_int_equal(idem_async_open(&loop, &opts, &a, NULL, 0), IDEM_OK);
    struct busyRun b = {0, 0};
    for (int i = 0; i < 5; i++) {
        char key[8];
        snprintf(key, sizeof key, "a%d", i);
        assert_int_equal(idem_async_claim(a, key, fp, NULL, busyCb, &b), IDEM_OK);
    }
    while (idem_async_pending(a) > 0) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_int_equal(b.acquired, 5);
    assert_int_equal(b.other, 0);
    assert_int_equal(atomic_load(&f->requests), 8);
    assert_int_equal(atomic_load(&f->conns), conns + 1);
    assert_int_equal(atomic_load(&g->requests), 0);
    /* Closed with a refused request waiting for its retry: canceled, nothing left open. */
    atomic_store(&f->busy, 1000000);
    struct asyncOne late = {0};
    assert_int_equal(idem_async_claim(a, "late", fp, NULL, asyncOneCb, &late), IDEM_OK);
    /* Until it was refused twice (it waited for its retry once), for 5 s at most. */
    int before = atomic_load(&f->requests);
    for (int i = 0; i < 5000 && atomic_load(&f->requests) < before + 2; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    assert_true(atomic_load(&f->requests) >= before + 2);
    idem_async_close(a, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(late.calls, 1);
    assert_int_equal(late.status, IDEM_ECANCELED);
    assert_int_equal(atomic_load(&g->requests), 0);
    fakeStop(g);

    /* Refused until the deadline, after two seeds that refuse connections: the refusal is
     * what the asynchronous call says too (it named only the other seeds' failures). */
    int dead[2];
    unsigned port[2];
    for (int i = 0; i < 2; i++) {
        dead[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        assert_int_equal(bind(dead[i], (struct sockaddr *)&sa, sizeof sa), 0); /* no listen */
        assert_int_equal(getsockname(dead[i], (struct sockaddr *)&sa, &sl), 0);
        port[i] = ntohs(sa.sin_port);
    }
    char seeds3[120];
    snprintf(seeds3, sizeof seeds3, "127.0.0.1:%u,127.0.0.1:%u,%s", port[0], port[1], f->addr);
    struct asyncOne ao;
    asyncClaimOnce(seeds3, 600, &ao);
    close(dead[0]);
    close(dead[1]);
    assert_int_equal(ao.status, IDEM_EUNAVAILABLE);
    assert_non_null(strstr(ao.detail, "batch.max_pending_mb"));

    /* A claim refused until its deadline while others' are answered meanwhile: it still
     * says it was refused (the client's last error, which the others' answers clear, said
     * "no answer"). */
    atomic_store(&f->busy_by_key, true);
    busyAmongOthers(f->addr);
    atomic_store(&f->busy_by_key, false);

    /* A retry time past the deadline (2^64-1 here) waits for the deadline, never wraps
     * around into sending again at once. */
    atomic_store(&f->busy_retry_ms, UINT64_MAX);
    atomic_store(&f->requests, 0);
    asyncClaimOnce(f->addr, 300, &ao);
    assert_int_equal(ao.status, IDEM_EUNAVAILABLE);
    assert_true(atomic_load(&f->requests) <= 2);
    atomic_store(&f->requests, 0);
    assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
    o.deadline_ms = 300;
    assert_int_equal(idem_claim(c, "k3", fp, &o, &r), IDEM_EUNAVAILABLE);
    idem_result_free(&r);
    idem_client_close(c);
    assert_int_equal(atomic_load(&f->requests), 1);
    fakeStop(f);
}

/* request_id 0: the node could not read the request frame (it applied nothing) and closes
 * the connection. Both clients take it as a broken connection: the request is sent again
 * until the deadline, then IDEM_EUNAVAILABLE naming the refusal (the synchronous call
 * answered IDEM_OK with outcome "invalid" at once; the asynchronous one resent). */
static void test_unreadable_request(void **state)
{
    (void)state;
    struct fakeNode *f = fakeStart(FAKE_UNREADABLE);
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct idem_result r;
    struct idem_claim_opts o = {.deadline_ms = 500};
    assert_int_equal(idem_claim(c, "k", fp, &o, &r), IDEM_EUNAVAILABLE);
    assert_null(r.priv_);
    assert_non_null(strstr(r.detail, "refused a request frame: frame does not decode"));
    idem_result_free(&r);
    idem_client_close(c);
    int sync_sent = atomic_load(&f->requests);
    assert_true(sync_sent >= 2); /* sent again */

    struct asyncOne ao;
    asyncClaimOnce(f->addr, 500, &ao);
    assert_int_equal(ao.status, IDEM_EUNAVAILABLE);
    assert_non_null(strstr(ao.detail, "refused a request frame: frame does not decode"));
    assert_true(atomic_load(&f->requests) >= sync_sent + 2);
    fakeStop(f);
}

/* ---- raw calls to a named node (idem_rpc.h) ---------------------------------------------- */

struct rawOne {
    int calls;
    int status;
    Idem__Outcome outcome;
    uint64_t request_id;
    char reason[128];
};

static void rawOneCb(struct idem_async *a, int status, const Idem__Response *resp,
                     const char *reason, void *data)
{
    (void)a;
    struct rawOne *o = data;
    o->calls++;
    o->status = status;
    assert_true((status == IDEM_OK) == (resp != NULL));
    assert_true((status == IDEM_OK) == (reason == NULL));
    if (resp != NULL) {
        o->outcome = idem_response_outcome(resp);
        o->request_id = resp->request_id;
    } else {
        snprintf(o->reason, sizeof o->reason, "%s", reason);
    }
}

/* A raw claim request with the caller's request id 42. */
static void rawCall(struct idem_async *a, const char *addr, uint32_t deadline_ms, struct rawOne *o)
{
    Idem__ClaimRequest claim = IDEM__CLAIM_REQUEST__INIT;
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    claim.key.data = (uint8_t *)"k";
    claim.key.len = 1;
    claim.fingerprint.data = fp;
    claim.fingerprint.len = sizeof fp;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.request_id = 42;
    req.op_case = IDEM__REQUEST__OP_CLAIM;
    req.claim = &claim;
    memset(o, 0, sizeof *o);
    assert_int_equal(idem_async_call_node(a, addr, &req, deadline_ms, rawOneCb, o), IDEM_OK);
}

static void rawRun(uv_loop_t *loop, struct idem_async *a)
{
    while (idem_async_pending(a) > 0) {
        uv_run(loop, UV_RUN_ONCE);
    }
}

/* idem_async_call_node: one redirect followed, the second one answered; one connection per
 * node, kept and pipelined; a node that cannot be reached, one that does not answer (the
 * deadline), close with calls pending; the caller's request id comes back. */
static void test_raw_calls_to_a_named_node(void **state)
{
    (void)state;
    struct fakeNode *leader = fakeStart(FAKE_GRANT);
    struct fakeNode *follower = fakeStart(FAKE_REDIRECT);
    struct fakeNode *stale = fakeStart(FAKE_REDIRECT); /* names the follower */
    snprintf(follower->redirect, sizeof follower->redirect, "%s", leader->addr);
    snprintf(stale->redirect, sizeof stale->redirect, "%s", follower->addr);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options opts = {.seeds = NULL};
    struct idem_async *a = NULL;
    assert_int_equal(idem_async_open(&loop, &opts, &a, NULL, 0), IDEM_EINVAL);
    assert_int_equal(idem_async_open_raw(&loop, &opts, &a, NULL, 0), IDEM_OK);
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    struct asyncOne typed;
    assert_int_equal(idem_async_claim(a, "k", fp, NULL, asyncOneCb, &typed), IDEM_EINVAL);
    Idem__Request empty = IDEM__REQUEST__INIT;
    assert_int_equal(idem_async_call_node(a, "no port", &empty, 0, rawOneCb, NULL), IDEM_EINVAL);

    struct rawOne o[4];
    for (int i = 0; i < 3; i++) {
        rawCall(a, follower->addr, 2000, &o[i]);
    }
    rawRun(&loop, a);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(o[i].calls, 1);
        assert_int_equal(o[i].status, IDEM_OK);
        assert_int_equal(o[i].outcome, IDEM__OUTCOME__OUTCOME_ACQUIRED);
        assert_int_equal(o[i].request_id, 42);
    }
    assert_int_equal(atomic_load(&follower->conns), 1);
    assert_int_equal(atomic_load(&leader->conns), 1);
    rawCall(a, leader->addr, 2000, &o[0]);
    rawRun(&loop, a);
    assert_int_equal(o[0].outcome, IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_int_equal(atomic_load(&leader->conns), 1); /* kept open */
    assert_int_equal(atomic_load(&leader->requests), 4);

    rawCall(a, stale->addr, 2000, &o[0]); /* stale -> follower -> (not followed) */
    rawRun(&loop, a);
    assert_int_equal(o[0].status, IDEM_OK);
    assert_int_equal(o[0].outcome, IDEM__OUTCOME__OUTCOME_NOT_LEADER);
    assert_int_equal(o[0].request_id, 42);
    assert_int_equal(atomic_load(&leader->requests), 4);

    /* Nothing listens: the call fails at once, with a static reason. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    char closed[32];
    snprintf(closed, sizeof closed, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    rawCall(a, closed, 5000, &o[0]);
    rawRun(&loop, a);
    assert_int_equal(o[0].status, IDEM_EUNAVAILABLE);
    assert_string_equal(o[0].reason, "cannot connect to the node");
    /* Listening, never answering: the deadline. */
    assert_int_equal(listen(fd, 4), 0);
    rawCall(a, closed, 100, &o[0]);
    rawRun(&loop, a);
    assert_int_equal(o[0].status, IDEM_EUNAVAILABLE);
    assert_string_equal(o[0].reason, "deadline passed");
    /* Closed with a call pending. */
    rawCall(a, closed, 5000, &o[0]);
    idem_async_close(a, NULL, NULL);
    assert_int_equal(o[0].status, IDEM_ECANCELED);
    assert_int_equal(idem_async_call_node(a, leader->addr, &empty, 0, rawOneCb, &o[1]),
                     IDEM_ECLOSED);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    close(fd);
    fakeStop(stale);
    fakeStop(follower);
    fakeStop(leader);
}

/* While set, the test's name service holds a lookup of "held.idem-test" (on the resolver's
 * thread) until it is cleared. */
static atomic_int holdLookup;

/* The test's name service: "leader.idem-test" is 127.0.0.1, nothing else is known. */
static int fakeNameLookup(const char *host, struct sockaddr_storage *out, size_t cap, size_t *n)
{
    *n = 0;
    while (strcmp(host, "held.idem-test") == 0 && atomic_load(&holdLookup)) {
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    if (cap == 0 || strcmp(host, "leader.idem-test") != 0) {
        return EAI_NONAME;
    }
    memset(out, 0, sizeof *out);
    struct sockaddr_in *sin = (struct sockaddr_in *)out;
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *n = 1;
    return 0;
}

/* idem_async_use_resolver (the daemon's forwarder): a named node's host name is looked up on
 * the resolver given, not with getaddrinfo on libuv's pool: a name only the resolver knows is
 * reached, one it does not know fails the call as a connection failure, and a close while a
 * lookup is in flight cancels it (no callback after; the sanitizers see nothing left). */
static void test_raw_calls_resolve_names_on_the_resolver_given(void **state)
{
    (void)state;
    struct fakeNode *leader = fakeStart(FAKE_GRANT);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_resolver *r = IdemResolverNew(&loop);
    assert_non_null(r);
    IdemResolverSetLookup(r, fakeNameLookup);
    struct idem_options opts = {.seeds = NULL};
    struct idem_async *a = NULL;
    assert_int_equal(idem_async_open_raw(&loop, &opts, &a, NULL, 0), IDEM_OK);
    idem_async_use_resolver(a, r);
    char named[64];
    snprintf(named, sizeof named, "leader.idem-test:%s", strrchr(leader->addr, ':') + 1);

    struct rawOne o;
    rawCall(a, named, 5000, &o);
    rawRun(&loop, a);
    assert_int_equal(o.status, IDEM_OK);
    assert_int_equal(o.outcome, IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_int_equal(IdemResolverLookups(r), 1);
    assert_int_equal(atomic_load(&leader->conns), 1);

    rawCall(a, "nobody.idem-test:9", 5000, &o);
    rawRun(&loop, a);
    assert_int_equal(o.status, IDEM_EUNAVAILABLE);
    assert_string_equal(o.reason, "cannot connect to the node");
    assert_int_equal(IdemResolverLookups(r), 2);

    /* Closed while the lookup of another name is in flight (asked of the resolver, whose
     * thread holds it): the lookup is cancelled, the client's close ends, and the answer,
     * let go after, calls nobody back. */
    atomic_store(&holdLookup, 1);
    rawCall(a, "held.idem-test:9", 5000, &o);
    for (int i = 0; i < 5000 && IdemResolverLookups(r) < 3; i++) {
        uv_run(&loop, UV_RUN_NOWAIT); /* ONCE would wait for the held lookup's answer */
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(IdemResolverLookups(r), 3);
    struct counts cnt = {0};
    idem_async_close(a, closedCb, &cnt);
    assert_int_equal(o.status, IDEM_ECANCELED);
    uv_run(&loop, UV_RUN_NOWAIT);
    atomic_store(&holdLookup, 0);
    IdemResolverClose(r);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(o.calls, 1);
    assert_int_equal(cnt.closed, 1);
    assert_int_equal(uv_loop_close(&loop), 0);
    fakeStop(leader);
}

static enum idem_move moveFirst(void *data, void *arg)
{
    return data == arg ? IDEM_MOVE_SEND : IDEM_MOVE_FAIL;
}

/* idem_async_move_calls: calls sent to a node that never answers (a leader cut off) go to
 * the new one, or fail on the next loop turn, as the caller decides; never within the call. */
static void test_raw_calls_move_to_a_new_leader(void **state)
{
    (void)state;
    struct fakeNode *leader = fakeStart(FAKE_GRANT);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    assert_int_equal(listen(fd, 4), 0); /* connects, never answers */
    char silent[32];
    snprintf(silent, sizeof silent, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct idem_options opts = {.seeds = NULL};
    struct idem_async *a = NULL;
    assert_int_equal(idem_async_open_raw(&loop, &opts, &a, NULL, 0), IDEM_OK);
    struct rawOne o[2];
    rawCall(a, silent, 5000, &o[0]);
    rawCall(a, silent, 5000, &o[1]);
    for (int i = 0; i < 20; i++) {
        uv_run(&loop, UV_RUN_NOWAIT); /* connected and written */
    }
    assert_int_equal(o[0].calls + o[1].calls, 0);
    assert_int_equal(idem_async_move_calls(a, "no port", moveFirst, &o[0]), 0);
    assert_int_equal(idem_async_move_calls(a, leader->addr, moveFirst, &o[0]), 1);
    assert_int_equal(o[0].calls + o[1].calls, 0); /* no callback within the call */
    rawRun(&loop, a);
    assert_int_equal(o[0].calls, 1);
    assert_int_equal(o[0].status, IDEM_OK);
    assert_int_equal(o[0].outcome, IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_int_equal(o[0].request_id, 42);
    assert_int_equal(o[1].calls, 1);
    assert_int_equal(o[1].status, IDEM_EUNAVAILABLE);
    assert_string_equal(o[1].reason, "the node it was sent to no longer leads");
    assert_int_equal(atomic_load(&leader->requests), 1);
    idem_async_close(a, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    close(fd);
    fakeStop(leader);
}

/* ---- system failures ------------------------------------------------------------------
 * test_client links with -Wl,--wrap for these (tests/CMakeLists.txt): libidem's calls go
 * through the wrappers, which fail on demand and otherwise call the real function. */

int __real_uv_timer_init(uv_loop_t *loop, uv_timer_t *t);
int __wrap_uv_timer_init(uv_loop_t *loop, uv_timer_t *t);
int __real_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg);
int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg);
int __real_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr);
int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr);
int __real_poll(struct pollfd *fds, nfds_t n, int timeout);
int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout);

static atomic_int g_timer_fail_in; /* > 0: the n-th uv_timer_init from now fails */
static atomic_bool g_thread_fail;  /* pthread_create fails */
static atomic_bool g_mutex_fail;   /* pthread_mutex_init fails */
static _Thread_local int t_poll_cut; /* > 0: this thread's next polls end at once, as if
                                      * their timeout had passed */

int __wrap_uv_timer_init(uv_loop_t *loop, uv_timer_t *t)
{
    if (atomic_load(&g_timer_fail_in) > 0 && atomic_fetch_sub(&g_timer_fail_in, 1) == 1) {
        return UV_EINVAL;
    }
    return __real_uv_timer_init(loop, t);
}

int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg)
{
    return atomic_load(&g_thread_fail) ? EAGAIN : __real_pthread_create(th, attr, fn, arg);
}

int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr)
{
    return atomic_load(&g_mutex_fail) ? ENOMEM : __real_pthread_mutex_init(m, attr);
}

int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout)
{
    if (t_poll_cut > 0 && timeout > 0) {
        t_poll_cut--;
        return 0;
    }
    return __real_poll(fds, n, timeout);
}

/* libidem waits on a socket at most 60 s per poll(2); one that ends with the deadline still
 * ahead waits again (it was taken for the deadline: `idemctl --deadline 90000 snapshot`
 * against a stopped node gave up after 60 s). Here the first three polls of the call end at
 * once, as a 60 s one would, and the call still gets its answer. */
static void test_a_wait_longer_than_one_poll(void **state)
{
    (void)state;
    struct fakeNode *f = fakeStart(FAKE_GRANT);
    struct idem_client *c = NULL;
    assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
    Idem__StatusRequest st = IDEM__STATUS_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.request_id = 1;
    req.op_case = IDEM__REQUEST__OP_STATUS;
    req.status = &st;
    Idem__Response *resp = NULL;
    t_poll_cut = 3;
    assert_int_equal(idem_call_node(c, f->addr, &req, 5000, &resp), IDEM_OK);
    assert_int_equal(t_poll_cut, 0);
    assert_int_equal(idem_response_outcome(resp), IDEM__OUTCOME__OUTCOME_OK);
    idem__response__free_unpacked(resp, NULL);
    idem_client_close(c);
    fakeStop(f);
}

static int countCallsFn(void *arg, uint64_t token, struct idem_response *response)
{
    (void)token;
    (void)response;
    (*(int *)arg)++;
    return IDEM_RUN_SUCCEEDED;
}

/* The IDEM_ESYS returns of idem.h: idem_client_open (its mutex), idem_async_open (each of
 * its four timers: `why` says so, *out is NULL, and the timers made before close on the
 * loop) and idem_run (no renewal thread: fn does not run, the claim is released, and the
 * detail says whether that worked). */
static void test_system_failures(void **state)
{
    (void)state;
    struct idem_options o = {.seeds = "127.0.0.1:1"};
    char why[128] = "";
    struct idem_client *c = NULL;
    atomic_store(&g_mutex_fail, true);
    int rv = idem_client_open(&o, &c, why, sizeof why);
    atomic_store(&g_mutex_fail, false);
    assert_int_equal(rv, IDEM_ESYS);
    assert_null(c);
    assert_non_null(strstr(why, "cannot initialise the client's mutex"));

    for (int n = 1; n <= 4; n++) { /* its reconnect, watch, kick and retry timers */
        uv_loop_t loop;
        uv_loop_init(&loop);
        struct idem_async *a = NULL;
        why[0] = '\0';
        atomic_store(&g_timer_fail_in, n);
        rv = idem_async_open(&loop, &o, &a, why, sizeof why);
        atomic_store(&g_timer_fail_in, 0);
        assert_int_equal(rv, IDEM_ESYS);
        assert_null(a);
        assert_non_null(strstr(why, "cannot create a libuv timer"));
        uv_run(&loop, UV_RUN_NOWAIT); /* closes what was made; frees the client */
        assert_int_equal(uv_loop_close(&loop), 0);
    }

    for (int ok = 1; ok >= 0; ok--) {
        struct fakeNode *f = fakeStart(FAKE_GRANT);
        f->release_outcome = ok ? IDEM__OUTCOME__OUTCOME_OK : IDEM__OUTCOME__OUTCOME_LEASE_LOST;
        assert_int_equal(idem_client_new(f->addr, "t", &c), IDEM_OK);
        uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
        struct idem_result r;
        int calls = 0;
        atomic_store(&g_thread_fail, true);
        rv = idem_run(c, "k", fp, NULL, countCallsFn, &calls, &r);
        atomic_store(&g_thread_fail, false);
        assert_int_equal(rv, IDEM_ESYS);
        assert_int_equal(calls, 0);
        assert_int_equal(r.ran, 0);
        assert_null(r.priv_);
        assert_int_equal(atomic_load(&f->releases), 1);
        assert_non_null(strstr(r.detail, "cannot start the lease renewal thread"));
        if (ok) {
            assert_non_null(strstr(r.detail, "; claim released"));
        } else {
            assert_non_null(strstr(r.detail, "the release answered lease_lost"));
        }
        idem_result_free(&r);
        idem_client_close(c);
        fakeStop(f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_fingerprint_and_attempt),
        cmocka_unit_test(test_open_checks),
        cmocka_unit_test(test_build_requests),
        cmocka_unit_test(test_result_fill),
        cmocka_unit_test(test_flooding_node_does_not_hold_a_call_past_its_deadline),
        cmocka_unit_test(test_sync_deadline),
        cmocka_unit_test(test_sync_deadline_names_every_node),
        cmocka_unit_test(test_call_why_names_every_node),
        cmocka_unit_test(test_async_deadline_and_close),
        cmocka_unit_test(test_async_deadline_names_every_node),
        cmocka_unit_test(test_frame_limit),
        cmocka_unit_test(test_errmsg_is_a_per_thread_copy),
        cmocka_unit_test(test_renew_plan),
        cmocka_unit_test(test_answer_without_a_result),
        cmocka_unit_test(test_unreadable_request),
        cmocka_unit_test(test_raw_calls_to_a_named_node),
        cmocka_unit_test(test_raw_calls_resolve_names_on_the_resolver_given),
        cmocka_unit_test(test_raw_calls_move_to_a_new_leader),
        cmocka_unit_test(test_busy_leader_is_asked_again_on_the_same_connection),
        cmocka_unit_test(test_system_failures),
        cmocka_unit_test(test_a_wait_longer_than_one_poll),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
