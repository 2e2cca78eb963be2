/* Unit tests of server/rpc_scan.c: the walk of an RPC frame's wire format before protobuf-c
 * decodes it, the peek at a frame's leading fields, and the decode's bounded allocator.
 *
 * The cost of a decode is counted, not timed: every allocation goes through a counting
 * allocator. A hostile frame (millions of tiny fields, known or unknown, at the top or
 * nested) is refused by the walk with no allocation at all, where protobuf-c alone makes an
 * allocation per field; and the allocator's budget alone fails such a decode after a
 * bounded amount. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "fsm.h"
#include "rpc_scan.h"

/* ---- building frames by hand ---- */

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void putVarint(struct buf *b, uint64_t v)
{
    uint8_t tmp[FRAME_VARINT_MAX];
    put(b, tmp, frame_varint_put(tmp, v));
}

static void putKey(struct buf *b, uint32_t num, unsigned wt)
{
    putVarint(b, (uint64_t)num << 3 | wt);
}

static void putBytes(struct buf *b, uint32_t num, const void *data, size_t n)
{
    putKey(b, num, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
    putVarint(b, n);
    put(b, data, n);
}

/* A packed Request with a token and a claim. */
static struct buf packedClaim(uint64_t id, const char *token)
{
    Idem__ClaimRequest claim = IDEM__CLAIM_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    uint8_t fp[32] = {1};
    claim.key.data = (uint8_t *)"key-1";
    claim.key.len = 5;
    claim.fingerprint.data = fp;
    claim.fingerprint.len = sizeof fp;
    req.request_id = id;
    req.deadline_ms = 500;
    req.auth_token.data = (uint8_t *)token;
    req.auth_token.len = strlen(token);
    req.op_case = IDEM__REQUEST__OP_CLAIM;
    req.claim = &claim;
    struct buf b = {0};
    b.cap = b.len = idem__request__get_packed_size(&req);
    b.p = malloc(b.cap);
    assert_non_null(b.p);
    assert_int_equal(idem__request__pack(&req, b.p), b.len);
    return b;
}

/* ---- a counting allocator, for protobuf-c without the walk ---- */

struct counts {
    size_t calls, bytes;
};

static void *countAlloc(void *data, size_t size)
{
    struct counts *c = data;
    c->calls++;
    c->bytes += size;
    return malloc(size ? size : 1);
}

static void countFree(void *data, void *p)
{
    (void)data;
    free(p);
}

/* ---- the tests ---- */

static void test_picked_fields_are_the_descriptors(void **state)
{
    (void)state;
    const ProtobufCMessageDescriptor *d = &idem__request__descriptor;
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "request_id")->id,
                     RPC_SCAN_FIELD_REQUEST_ID);
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "deadline_ms")->id,
                     RPC_SCAN_FIELD_DEADLINE_MS);
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "auth_token")->id,
                     RPC_SCAN_FIELD_AUTH_TOKEN);
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "as_tenant")->id,
                     RPC_SCAN_FIELD_AS_TENANT);
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "forwarded")->id,
                     RPC_SCAN_FIELD_FORWARDED);
    /* The op's field numbers are its oneof case values. */
    assert_int_equal(protobuf_c_message_descriptor_get_field_by_name(d, "claim")->id,
                     IDEM__REQUEST__OP_CLAIM);
}

static void test_a_request_passes_and_decodes_within_its_budget(void **state)
{
    (void)state;
    struct buf b = packedClaim(77, "secret-token");
    struct rpc_scan sc;
    assert_int_equal(rpc_scan_request(b.p, b.len, &sc), RPC_SCAN_OK);
    assert_int_equal(sc.request_id, 77);
    assert_int_equal(sc.op, IDEM__REQUEST__OP_CLAIM);
    assert_int_equal(sc.token_len, strlen("secret-token"));
    assert_memory_equal(sc.token, "secret-token", sc.token_len);
    assert_false(sc.as_tenant);
    assert_false(sc.forwarded);
    assert_int_equal(sc.fields, 6); /* request_id, deadline, token, claim: key, fingerprint */
    struct rpc_alloc a;
    Idem__Request *req = rpc_scan_unpack(b.p, b.len, &sc, &a, NULL);
    assert_non_null(req);
    assert_int_equal(req->request_id, 77);
    assert_true(a.calls > 0 && a.bytes <= a.budget);
    /* Decoded into an arena (the server's way), twice over one: the same request, the same
     * budget's count, and nothing left in the arena after each release. */
    struct arena ar;
    arena_init(&ar, 64);
    for (int i = 0; i < 2; i++) {
        struct rpc_alloc aa;
        Idem__Request *got = rpc_scan_unpack(b.p, b.len, &sc, &aa, &ar);
        assert_non_null(got);
        assert_int_equal(aa.calls, a.calls);
        assert_int_equal(aa.bytes, a.bytes);
        assert_int_equal(got->request_id, 77);
        assert_int_equal(got->op_case, IDEM__REQUEST__OP_CLAIM);
        assert_int_equal(got->auth_token.len, req->auth_token.len);
        assert_memory_equal(got->auth_token.data, req->auth_token.data, req->auth_token.len);
        assert_int_equal(got->claim->key.len, req->claim->key.len);
        assert_memory_equal(got->claim->key.data, req->claim->key.data, req->claim->key.len);
        assert_int_equal(got->claim->fingerprint.len, req->claim->fingerprint.len);
        assert_memory_equal(got->claim->fingerprint.data, req->claim->fingerprint.data,
                            req->claim->fingerprint.len);
        assert_true(ar.used > 0 || ar.big != NULL);
        rpc_scan_release(got, &aa);
        assert_int_equal(ar.used, 0);
        assert_null(ar.big);
    }
    arena_close(&ar);
    rpc_scan_release(req, &a);
    free(b.p);
}

/* The largest stored response the state machine takes (FSM_HEADERS_MAX headers, a 1 MiB
 * body) passes the walk and decodes within its budget; so does a frame of the most fields
 * the walk lets through, in the shape that costs protobuf-c the most memory per byte (empty
 * messages: one allocation each). */
static void test_the_largest_requests_decode_within_their_budget(void **state)
{
    (void)state;
    Idem__Header hs[FSM_HEADERS_MAX];
    Idem__Header *hp[FSM_HEADERS_MAX];
    for (size_t i = 0; i < FSM_HEADERS_MAX; i++) {
        idem__header__init(&hs[i]);
        hs[i].name = "x-header";
        hs[i].value.data = (uint8_t *)"value";
        hs[i].value.len = 5;
        hp[i] = &hs[i];
    }
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    resp.status = 200;
    resp.n_headers = FSM_HEADERS_MAX;
    resp.headers = hp;
    resp.body.len = 1u << 20;
    resp.body.data = calloc(1, resp.body.len);
    Idem__CompleteRequest complete = IDEM__COMPLETE_REQUEST__INIT;
    complete.key.data = (uint8_t *)"k";
    complete.key.len = 1;
    complete.token = 9;
    complete.response = &resp;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.request_id = 1;
    req.auth_token.data = (uint8_t *)"t";
    req.auth_token.len = 1;
    req.op_case = IDEM__REQUEST__OP_COMPLETE;
    req.complete = &complete;
    size_t n = idem__request__get_packed_size(&req);
    uint8_t *p = malloc(n);
    idem__request__pack(&req, p);
    struct rpc_scan sc;
    assert_int_equal(rpc_scan_request(p, n, &sc), RPC_SCAN_OK);
    struct rpc_alloc a;
    Idem__Request *got = rpc_scan_unpack(p, n, &sc, &a, NULL);
    assert_non_null(got);
    assert_int_equal(got->complete->response->n_headers, FSM_HEADERS_MAX);
    idem__request__free_unpacked(got, &a.pa);
    free(p);
    free(resp.body.data);

    /* RPC_SCAN_MAX_FIELDS fields: a token, then empty headers in one stored response. */
    struct buf headers = {0}, cr = {0}, b = {0};
    for (int i = 0; i < RPC_SCAN_MAX_FIELDS - 4; i++) {
        putBytes(&headers, 2, "", 0); /* StoredResponse.headers: an empty Header */
    }
    putBytes(&cr, 4, headers.p, headers.len); /* CompleteRequest.response */
    putBytes(&b, RPC_SCAN_FIELD_AUTH_TOKEN, "t", 1);
    putBytes(&b, IDEM__REQUEST__OP_COMPLETE, cr.p, cr.len);
    putKey(&b, RPC_SCAN_FIELD_REQUEST_ID, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&b, 3);
    assert_int_equal(rpc_scan_request(b.p, b.len, &sc), RPC_SCAN_OK);
    assert_int_equal(sc.fields, RPC_SCAN_MAX_FIELDS);
    got = rpc_scan_unpack(b.p, b.len, &sc, &a, NULL);
    assert_non_null(got);
    assert_false(a.exceeded);
    assert_int_equal(got->complete->response->n_headers, RPC_SCAN_MAX_FIELDS - 4);
    idem__request__free_unpacked(got, &a.pa);
    free(headers.p);
    free(cr.p);
    free(b.p);
}

/* A hostile frame of `size` bytes: a get, then `filler` (a field, repeated) up to size, at
 * the top level or (nested) inside the get. */
static struct buf hostile(size_t size, const uint8_t *filler, size_t flen, bool nested)
{
    struct buf fill = {0}, b = {0};
    while (fill.len + flen <= size) {
        put(&fill, filler, flen);
    }
    putKey(&b, RPC_SCAN_FIELD_REQUEST_ID, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&b, 5);
    if (nested) {
        struct buf get = {0};
        putBytes(&get, 1, "k", 1);
        put(&get, fill.p, fill.len);
        putBytes(&b, IDEM__REQUEST__OP_GET, get.p, get.len);
        free(get.p);
    } else {
        putBytes(&b, IDEM__REQUEST__OP_GET, "\x0a\x01k", 3);
        put(&b, fill.p, fill.len);
    }
    free(fill.p);
    return b;
}

/* What the walk, then the decode if the walk let it through, allocate (calls and bytes):
 * the server's path. */
static enum rpc_scan_status serverPath(const struct buf *b, struct rpc_scan *sc, struct counts *c)
{
    enum rpc_scan_status st = rpc_scan_request(b->p, b->len, sc);
    *c = (struct counts){0};
    if (st == RPC_SCAN_OK) {
        struct rpc_alloc a;
        Idem__Request *req = rpc_scan_unpack(b->p, b->len, sc, &a, NULL);
        c->calls = a.calls;
        c->bytes = a.bytes;
        if (req != NULL) {
            idem__request__free_unpacked(req, &a.pa);
        }
    }
    return st;
}

static void test_hostile_frames_are_refused_before_any_allocation(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        uint8_t filler[3];
        size_t flen;
        bool nested;
        enum rpc_scan_status want;
    } cases[] = {
        /* field 100, varint 0: unknown to Request, and to GetRequest */
        {"unknown fields", {0xa0, 0x06, 0x00}, 3, false, RPC_SCAN_UNKNOWN_FIELD},
        {"nested unknown fields", {0xa0, 0x06, 0x00}, 3, true, RPC_SCAN_UNKNOWN_FIELD},
        /* deadline_ms = 1, again and again */
        {"a known field repeated", {0x10, 0x01}, 2, false, RPC_SCAN_TOO_MANY_FIELDS},
        /* GetRequest.key, empty, again and again */
        {"a nested field repeated", {0x0a, 0x00}, 2, true, RPC_SCAN_TOO_MANY_FIELDS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct buf b = hostile(4u << 20, cases[i].filler, cases[i].flen, cases[i].nested);
        struct rpc_scan sc;
        struct counts c;
        enum rpc_scan_status st = serverPath(&b, &sc, &c);
        if (st != cases[i].want || c.calls != 0 || c.bytes != 0) {
            fail_msg("%s: status %d (want %d), %zu allocations of %zu bytes", cases[i].what,
                     (int)st, (int)cases[i].want, c.calls, c.bytes);
        }
        /* The walk stops at the first field past the cap (or the first unknown one). */
        assert_true(sc.fields <= RPC_SCAN_MAX_FIELDS + 1);
        assert_int_equal(sc.request_id, 5);
        free(b.p);
    }
}

/* The same frames cost protobuf-c alone an allocation per unknown field, and scratch
 * memory by the field for known ones (what the walk spares): 256 KiB frames show it. */
static void test_without_the_walk_protobuf_c_allocates_per_field(void **state)
{
    (void)state;
    static const uint8_t unknown[3] = {0xa0, 0x06, 0x00};
    struct buf b = hostile(256u << 10, unknown, 3, false);
    struct counts c = {0};
    ProtobufCAllocator pa = {countAlloc, countFree, &c};
    Idem__Request *req = idem__request__unpack(&pa, b.len, b.p);
    assert_non_null(req); /* protobuf-c takes it: the unknown fields are kept */
    assert_true(req->base.n_unknown_fields > 80000);
    assert_true(c.calls > 80000);
    idem__request__free_unpacked(req, &pa);
    free(b.p);
    /* A known field again and again: protobuf-c's scratch for it is many times the frame. */
    static const uint8_t deadline[2] = {0x10, 0x01};
    b = hostile(256u << 10, deadline, 2, false);
    c = (struct counts){0};
    req = idem__request__unpack(&pa, b.len, b.p);
    assert_non_null(req);
    assert_true(c.bytes > 8 * b.len);
    idem__request__free_unpacked(req, &pa);
    free(b.p);
}

/* Should a frame reach the decode with more fields than the walk said (the walk and
 * protobuf-c disagreeing), the allocator's budget alone fails the decode, after allocating
 * no more than the budget. */
static void test_the_budget_alone_bounds_a_hostile_decode(void **state)
{
    (void)state;
    static const uint8_t unknown[3] = {0xa0, 0x06, 0x00};
    struct buf b = hostile(4u << 20, unknown, 3, false);
    struct rpc_scan sc = {.fields = RPC_SCAN_MAX_FIELDS};
    struct rpc_alloc a;
    Idem__Request *req = rpc_scan_unpack(b.p, b.len, &sc, &a, NULL);
    assert_null(req);
    assert_true(a.exceeded);
    assert_true(a.bytes <= a.budget);
    assert_true(a.budget == rpc_scan_budget(b.len, RPC_SCAN_MAX_FIELDS));
    assert_true(a.budget < (10u << 20));
    /* The same from an arena: refused at the same budget, and the release returns it all. */
    struct arena ar;
    arena_init(&ar, 4096);
    struct rpc_alloc aa;
    req = rpc_scan_unpack(b.p, b.len, &sc, &aa, &ar);
    assert_null(req);
    assert_true(aa.exceeded);
    assert_true(aa.bytes <= aa.budget);
    assert_int_equal(aa.budget, a.budget);
    assert_int_equal(aa.bytes, a.bytes); /* the same allocations, refused at the same one */
    assert_int_equal(aa.calls, a.calls);
    rpc_scan_release(req, &aa);
    assert_int_equal(ar.used, 0);
    assert_null(ar.big);
    assert_true(ar.cap <= (1u << 20)); /* grown towards it, never past 1 MiB */
    arena_close(&ar);
    free(b.p);
}

static void test_malformed_frames(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        const char *bytes;
        size_t len;
        enum rpc_scan_status want;
    } cases[] = {
        {"truncated varint", "\x08\x80", 2, RPC_SCAN_MALFORMED},
        {"length past the end",
         "\x1a\x05"
         "ab",
         4, RPC_SCAN_MALFORMED},
        {"field number 0", "\x00\x01", 2, RPC_SCAN_MALFORMED},
        {"a group", "\x0b", 1, RPC_SCAN_MALFORMED},
        {"wire type 7", "\x0f", 1, RPC_SCAN_MALFORMED},
        {"request_id as bytes", "\x0a\x01x", 3, RPC_SCAN_MALFORMED},
        {"auth_token as a varint", "\x18\x01", 2, RPC_SCAN_MALFORMED},
        {"fixed32 cut short", "\x0d\x01\x02", 3, RPC_SCAN_MALFORMED},
        {"a tag of 6 bytes", "\x88\x80\x80\x80\x80\x00\x01", 7, RPC_SCAN_MALFORMED},
        {"unknown top-level field", "\xf8\x01\x01", 3, RPC_SCAN_UNKNOWN_FIELD},
        {"unknown field in a claim", "\x52\x03\xf8\x01\x01", 5, RPC_SCAN_UNKNOWN_FIELD},
        {"a claim's key as a varint", "\x52\x02\x08\x01", 4, RPC_SCAN_MALFORMED},
        {"empty", "", 0, RPC_SCAN_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rpc_scan sc;
        enum rpc_scan_status st =
            rpc_scan_request((const uint8_t *)cases[i].bytes, cases[i].len, &sc);
        if (st != cases[i].want) {
            fail_msg("%s: status %d, want %d", cases[i].what, (int)st, (int)cases[i].want);
        }
    }
}

static void test_the_last_of_a_repeated_field_counts(void **state)
{
    (void)state;
    struct buf b = {0};
    putBytes(&b, RPC_SCAN_FIELD_AUTH_TOKEN, "first", 5);
    putKey(&b, RPC_SCAN_FIELD_REQUEST_ID, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&b, 1);
    putBytes(&b, IDEM__REQUEST__OP_GET, "\x0a\x01k", 3);
    putBytes(&b, RPC_SCAN_FIELD_AUTH_TOKEN, "second", 6);
    putKey(&b, RPC_SCAN_FIELD_REQUEST_ID, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&b, 2);
    putBytes(&b, RPC_SCAN_FIELD_AS_TENANT, "alpha", 5);
    putKey(&b, RPC_SCAN_FIELD_FORWARDED, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&b, 1);
    struct rpc_scan sc;
    assert_int_equal(rpc_scan_request(b.p, b.len, &sc), RPC_SCAN_OK);
    assert_int_equal(sc.request_id, 2);
    assert_memory_equal(sc.token, "second", 6);
    assert_true(sc.as_tenant);
    assert_true(sc.forwarded);
    assert_int_equal(sc.op, IDEM__REQUEST__OP_GET);
    /* protobuf-c agrees. */
    struct rpc_alloc a;
    Idem__Request *req = rpc_scan_unpack(b.p, b.len, &sc, &a, NULL);
    assert_non_null(req);
    assert_int_equal(req->request_id, 2);
    assert_int_equal(req->auth_token.len, 6);
    assert_memory_equal(req->auth_token.data, "second", 6);
    idem__request__free_unpacked(req, &a.pa);
    free(b.p);
}

static void test_peek_reads_the_leading_fields_only(void **state)
{
    (void)state;
    struct buf b = packedClaim(300, "peeked-token");
    struct rpc_scan sc;
    rpc_scan_peek(b.p, b.len, &sc);
    assert_int_equal(sc.request_id, 300);
    assert_non_null(sc.token);
    assert_memory_equal(sc.token, "peeked-token", sc.token_len);
    /* Cut inside the token: not found; the request id before it still is. */
    rpc_scan_peek(b.p, 8, &sc);
    assert_null(sc.token);
    assert_int_equal(sc.request_id, 300);
    free(b.p);
    /* A token after the op is not looked for. */
    struct buf c = {0};
    putKey(&c, RPC_SCAN_FIELD_REQUEST_ID, PROTOBUF_C_WIRE_TYPE_VARINT);
    putVarint(&c, 4);
    putBytes(&c, IDEM__REQUEST__OP_GET, "\x0a\x01k", 3);
    putBytes(&c, RPC_SCAN_FIELD_AUTH_TOKEN, "late", 4);
    rpc_scan_peek(c.p, c.len, &sc);
    assert_int_equal(sc.request_id, 4);
    assert_null(sc.token);
    free(c.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_picked_fields_are_the_descriptors),
        cmocka_unit_test(test_a_request_passes_and_decodes_within_its_budget),
        cmocka_unit_test(test_the_largest_requests_decode_within_their_budget),
        cmocka_unit_test(test_hostile_frames_are_refused_before_any_allocation),
        cmocka_unit_test(test_without_the_walk_protobuf_c_allocates_per_field),
        cmocka_unit_test(test_the_budget_alone_bounds_a_hostile_decode),
        cmocka_unit_test(test_malformed_frames),
        cmocka_unit_test(test_the_last_of_a_repeated_field_counts),
        cmocka_unit_test(test_peek_reads_the_leading_fields_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
