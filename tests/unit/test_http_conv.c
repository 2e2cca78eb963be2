/* Unit tests of server/http_conv.c (RFC 8941 sf-strings, the rule a refused key broke, RFC
 * 9457 problem details, tokens as strings) and of the JSON API's bodies that use them
 * (server/http_api_body.c: tokens as strings, unknown fields named). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http_api_body.h"
#include "http_conv.h"

/* ---- sf-strings -------------------------------------------------------------------------- */

/* Decodes in as an sf-string: its rc, and the decoded text into out (NUL-terminated). */
static int sf(const char *in, char *out)
{
    size_t n = 99;
    char buf[256];
    int rc = http_sf_string(in, strlen(in), buf, &n);
    if (rc != HTTP_SF_OK) {
        assert_int_equal(n, 0);
    }
    memcpy(out, buf, n);
    out[n] = '\0';
    return rc;
}

static void test_sf_string_valid(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(sf("\"order-1\"", out), HTTP_SF_OK);
    assert_string_equal(out, "order-1");
    assert_int_equal(sf("\"\"", out), HTTP_SF_OK);
    assert_string_equal(out, "");
    assert_int_equal(sf("  \"a b\"  ", out), HTTP_SF_OK); /* spaces around, not inside */
    assert_string_equal(out, "a b");
    assert_int_equal(sf("\"say \\\"hi\\\" \\\\o/\"", out), HTTP_SF_OK);
    assert_string_equal(out, "say \"hi\" \\o/");
    assert_int_equal(sf("\"~!#$%&'()*+,-./:;<=>?@[]^_`{|}\"", out), HTTP_SF_OK);
    assert_string_equal(out, "~!#$%&'()*+,-./:;<=>?@[]^_`{|}");
}

static void test_sf_string_refused(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(sf("order-1", out), HTTP_SF_NOT_STRING);
    assert_int_equal(sf("", out), HTTP_SF_NOT_STRING);
    assert_int_equal(sf("   ", out), HTTP_SF_NOT_STRING);
    assert_int_equal(sf("'a'", out), HTTP_SF_NOT_STRING);
    assert_int_equal(sf("\"abc", out), HTTP_SF_UNTERMINATED);
    assert_int_equal(sf("\"", out), HTTP_SF_UNTERMINATED);
    assert_int_equal(sf("\"abc\\", out), HTTP_SF_UNTERMINATED);
    assert_int_equal(sf("\"abc\\\"", out), HTTP_SF_UNTERMINATED); /* the quote is escaped */
    assert_int_equal(sf("\"a\\nb\"", out), HTTP_SF_BAD_ESCAPE);
    assert_int_equal(sf("\"a\\u0041\"", out), HTTP_SF_BAD_ESCAPE);
    assert_int_equal(sf("\"a\tb\"", out), HTTP_SF_BAD_CHAR);
    assert_int_equal(sf("\"caf\xc3\xa9\"", out), HTTP_SF_BAD_CHAR);
    assert_int_equal(sf("\"a\x7f\"", out), HTTP_SF_BAD_CHAR);
    assert_int_equal(sf("\"abc\";p=1", out), HTTP_SF_TRAILING); /* parameters */
    assert_int_equal(sf("\"abc\" x", out), HTTP_SF_TRAILING);
    assert_int_equal(sf("\"a\"\"b\"", out), HTTP_SF_TRAILING);
    /* a NUL inside is a byte outside printable ASCII; nothing past len is read */
    char buf[8];
    size_t n;
    assert_int_equal(http_sf_string("\"a\0b\"", 5, buf, &n), HTTP_SF_BAD_CHAR);
    assert_int_equal(http_sf_string("\"ab\"", 3, buf, &n), HTTP_SF_UNTERMINATED);
    for (int rc = HTTP_SF_OK; rc <= HTTP_SF_TRAILING + 1; rc++) {
        assert_non_null(http_sf_strerror(rc));
        assert_true(strlen(http_sf_strerror(rc)) > 0);
    }
    assert_non_null(strstr(http_sf_strerror(HTTP_SF_TRAILING), "parameters"));
}

static void test_header_item(void **state)
{
    (void)state;
    char out[64];
    const char *v, *why;
    size_t n;
    /* bare: the value itself */
    const char *bare = "order-1";
    assert_true(http_header_item(bare, 7, out, &v, &n, &why));
    assert_ptr_equal(v, bare);
    assert_int_equal(n, 7);
    assert_null(why);
    /* an sf-string, decoded into out */
    assert_true(http_header_item("\"order-1\"", 9, out, &v, &n, &why));
    assert_ptr_equal(v, out);
    assert_memory_equal(v, "order-1", 7);
    assert_int_equal(n, 7);
    /* begins like one and is not */
    assert_false(http_header_item("\"order-1", 8, out, &v, &n, &why));
    assert_string_equal(why, http_sf_strerror(HTTP_SF_UNTERMINATED));
    assert_null(v);
    /* a bare value with a quote inside is bare */
    assert_true(http_header_item("a\"b", 3, out, &v, &n, &why));
    assert_int_equal(n, 3);
}

static void test_item_out(void **state)
{
    (void)state;
    char out[2 * 64 + 3];
    size_t n;
    assert_true(http_item_out("a-81f2", 6, out, &n));
    assert_int_equal(n, 6);
    assert_memory_equal(out, "a-81f2", 6);
    assert_true(http_item_out("a b\"c\\", 6, out, &n));
    assert_int_equal(n, 10);
    assert_memory_equal(out, "\"a b\\\"c\\\\\"", 10);
    /* and it parses back to the same bytes */
    char back[64];
    size_t bn;
    assert_int_equal(http_sf_string(out, n, back, &bn), HTTP_SF_OK);
    assert_int_equal(bn, 6);
    assert_memory_equal(back, "a b\"c\\", 6);
    assert_false(http_item_out("", 0, out, &n));
    assert_false(http_item_out("a\r\nX: y", 7, out, &n)); /* no header injection */
    assert_false(http_item_out("caf\xc3\xa9", 5, out, &n));
}

/* ---- keys -------------------------------------------------------------------------------- */

static void test_key_why(void **state)
{
    (void)state;
    char buf[112];
    http_key_why((const uint8_t *)"order-1", 7, 0, buf, sizeof buf);
    assert_string_equal(buf, "");
    http_key_why(NULL, 0, 0, buf, sizeof buf);
    assert_non_null(strstr(buf, "missing or empty"));
    http_key_why((const uint8_t *)"", 0, 0, buf, sizeof buf);
    assert_non_null(strstr(buf, "missing or empty"));
    char longKey[300];
    memset(longKey, 'a', sizeof longKey);
    http_key_why((const uint8_t *)longKey, 300, 0, buf, sizeof buf);
    assert_string_equal(buf, "the key is 300 bytes, over the limit of 255 bytes");
    http_key_why((const uint8_t *)longKey, 65, 64, buf, sizeof buf);
    assert_string_equal(buf, "the key is 65 bytes, over the limit of 64 bytes");
    http_key_why((const uint8_t *)"ord er", 6, 0, buf, sizeof buf);
    assert_string_equal(buf, "the key has a byte outside [A-Za-z0-9._:~-] (at offset 3)");
    /* the message never holds the key's bytes */
    http_key_why((const uint8_t *)"secret\"x", 8, 0, buf, sizeof buf);
    assert_null(strstr(buf, "secret"));
}

/* ---- problem details --------------------------------------------------------------------- */

static void test_problem(void **state)
{
    (void)state;
    const char *path = "/v1/claims/order-2/complete?x=1";
    json_t *o = http_problem(409, "idempotency_key_reused", "the key was used otherwise",
                             "3f9a1c0de2b47a65", 16, path, strlen(path));
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "type")),
                        HTTP_PROBLEM_TYPE_BASE "idempotency_key_reused");
    assert_string_equal(json_string_value(json_object_get(o, "title")),
                        http_problem_title("idempotency_key_reused", NULL));
    assert_int_equal(json_integer_value(json_object_get(o, "status")), 409);
    assert_string_equal(json_string_value(json_object_get(o, "detail")),
                        "the key was used otherwise");
    assert_string_equal(json_string_value(json_object_get(o, "message")),
                        "the key was used otherwise");
    /* the request by its id, never the path (it holds the key) */
    assert_string_equal(json_string_value(json_object_get(o, "instance")),
                        "urn:idemd:request:3f9a1c0de2b47a65");
    assert_string_equal(json_string_value(json_object_get(o, "code")), "idempotency_key_reused");
    assert_string_equal(json_string_value(json_object_get(o, "request_id")), "3f9a1c0de2b47a65");
    json_decref(o);

    /* no message: the title; no request id: no instance */
    o = http_problem(503, "idempotency_unavailable", NULL, "r", 1, "/a b", 4);
    assert_string_equal(json_string_value(json_object_get(o, "detail")),
                        http_problem_title("idempotency_unavailable", NULL));
    assert_string_equal(json_string_value(json_object_get(o, "instance")), "urn:idemd:request:r");
    json_decref(o);
    o = http_problem(400, "invalid_request", "x", NULL, 0, "*", 1);
    assert_null(json_object_get(o, "instance"));
    json_decref(o);
    o = http_problem(400, "invalid_request", "bad \xff utf-8", "r", 1, NULL, 0);
    assert_string_equal(json_string_value(json_object_get(o, "detail")),
                        http_problem_title("invalid_request", NULL));
    json_decref(o);

    /* every code of docs/http-api.md has a title of its own */
    static const char *const codes[] = {"invalid_request",
                                        "invalid_path",
                                        "idempotency_key_missing",
                                        "idempotency_key_invalid",
                                        "unauthenticated",
                                        "forbidden",
                                        "not_found",
                                        "method_not_allowed",
                                        "idempotency_request_in_progress",
                                        "idempotency_key_reused",
                                        "idempotency_lease_expired",
                                        "idempotency_outcome_unknown",
                                        "idempotency_lease_lost",
                                        "idempotency_key_expired",
                                        "payload_too_large",
                                        "idempotency_quota_exceeded",
                                        "internal",
                                        "upstream_unavailable",
                                        "upstream_response_too_large",
                                        "idempotency_unavailable",
                                        "upstream_timeout"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        assert_string_not_equal(http_problem_title(codes[i], NULL), "Error");
    }
    assert_string_equal(http_problem_title("http_error", "Bad Request"), "Bad Request");
    assert_string_equal(http_problem_title("http_error", NULL), "Error");
}

/* ---- tokens ------------------------------------------------------------------------------ */

static bool tokenOf(const char *json, uint64_t *out)
{
    json_error_t e;
    json_t *v = json_loads(json, JSON_DECODE_ANY, &e);
    assert_non_null(v);
    bool ok = http_token_from_json(v, out);
    json_decref(v);
    return ok;
}

static void test_token_from_json(void **state)
{
    (void)state;
    uint64_t t = 0;
    assert_true(tokenOf("4456448", &t));
    assert_int_equal(t, 4456448);
    assert_true(tokenOf("\"4456448\"", &t));
    assert_int_equal(t, 4456448);
    assert_true(tokenOf("\"18446744073709551615\"", &t)); /* past what JSON integers carry */
    assert_true(t == UINT64_MAX);
    assert_true(tokenOf("\"0\"", &t));
    assert_int_equal(t, 0);
    assert_true(tokenOf("\"007\"", &t));
    assert_int_equal(t, 7);
    assert_false(tokenOf("\"18446744073709551616\"", &t));  /* overflows */
    assert_false(tokenOf("\"100000000000000000000\"", &t)); /* 21 digits */
    assert_false(tokenOf("\"\"", &t));
    assert_false(tokenOf("\"-1\"", &t));
    assert_false(tokenOf("\"+1\"", &t));
    assert_false(tokenOf("\" 1\"", &t));
    assert_false(tokenOf("\"1 \"", &t));
    assert_false(tokenOf("\"0x10\"", &t));
    assert_false(tokenOf("\"1e3\"", &t));
    assert_false(tokenOf("-1", &t));
    assert_false(tokenOf("1.0", &t));
    assert_false(tokenOf("true", &t));
    assert_false(tokenOf("null", &t));
    char buf[21];
    http_token_str(UINT64_MAX, buf);
    assert_string_equal(buf, "18446744073709551615");
    http_token_str(0, buf);
    assert_string_equal(buf, "0");
}

/* ---- the JSON API's bodies --------------------------------------------------------------- */

static const struct config_tenant tenant = {.name = "demo", .key_max_len = 255};

#define FP64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* Parses body for op: true, or false with its reason in why (copied). */
static bool parse(Idem__Request__OpCase op, const char *body, Idem__Request *rq, char *why,
                  uint64_t *token)
{
    static uint8_t key[] = "order-1";
    ProtobufCBinaryData kb = {7, key};
    struct http_api_body b;
    const char *w = NULL;
    *rq = (Idem__Request)IDEM__REQUEST__INIT;
    bool ok = http_api_parse_body(op, body, strlen(body), &tenant, kb, rq, &b, &w);
    snprintf(why, 160, "%s", w ? w : "");
    if (ok && token != NULL) {
        *token = op == IDEM__REQUEST__OP_COMPLETE  ? rq->complete->token
                 : op == IDEM__REQUEST__OP_RELEASE ? rq->release->token
                                                   : rq->renew->token;
    }
    http_api_body_free(&b);
    return ok;
}

static void test_body_token_as_string(void **state)
{
    (void)state;
    Idem__Request rq;
    char why[160];
    uint64_t t = 0;
    assert_true(
        parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": \"18446744073709551615\"}", &rq, why, &t));
    assert_true(t == UINT64_MAX);
    assert_true(
        parse(IDEM__REQUEST__OP_RENEW, "{\"token\": \"42\", \"lease_ms\": 5}", &rq, why, &t));
    assert_int_equal(t, 42);
    assert_true(parse(IDEM__REQUEST__OP_COMPLETE,
                      "{\"token\": \"7\", \"response\": {\"status\": 201, \"body\": \"x\"}}", &rq,
                      why, &t));
    assert_int_equal(t, 7);
    assert_true(parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": 9}", &rq, why, &t));
    assert_int_equal(t, 9);
    assert_false(parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": \"9a\"}", &rq, why, NULL));
    assert_non_null(strstr(why, "string of decimal digits"));
    assert_false(parse(IDEM__REQUEST__OP_RELEASE, "{}", &rq, why, NULL));
    assert_non_null(strstr(why, "token must be"));
}

static void test_body_unknown_fields(void **state)
{
    (void)state;
    Idem__Request rq;
    char why[160];
    assert_false(parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": 1, \"tokne\": 2}", &rq, why, NULL));
    assert_string_equal(why, "unknown field \"tokne\"");
    assert_false(parse(IDEM__REQUEST__OP_RENEW, "{\"token\": 1, \"lease\": 2}", &rq, why, NULL));
    assert_string_equal(why, "unknown field \"lease\"");
    assert_false(parse(IDEM__REQUEST__OP_CLAIM,
                       "{\"fingerprint\": \"" FP64 "\", \"attempt\": \"a\"}", &rq, why, NULL));
    assert_string_equal(why, "unknown field \"attempt\"");
    assert_false(parse(IDEM__REQUEST__OP_CLAIM,
                       "{\"request\": {\"method\": \"POST\", \"path\": \"/\", \"bdy\": 1}}", &rq,
                       why, NULL));
    assert_string_equal(why, "unknown field \"request.bdy\"");
    assert_false(
        parse(IDEM__REQUEST__OP_COMPLETE, "{\"token\": 1, \"status\": 201}", &rq, why, NULL));
    assert_string_equal(why, "unknown field \"status\"");
    assert_false(parse(IDEM__REQUEST__OP_COMPLETE,
                       "{\"token\": 1, \"response\": {\"status\": 201, \"header\": {}}}", &rq, why,
                       NULL));
    assert_string_equal(why, "unknown field \"response.header\"");
    /* a name that is not short printable ASCII is not repeated */
    assert_false(
        parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": 1, \"caf\xc3\xa9\": 2}", &rq, why, NULL));
    assert_null(strstr(why, "caf"));
    assert_non_null(strstr(why, "unknown field"));
    assert_false(parse(IDEM__REQUEST__OP_RELEASE, "{\"token\": 1, \"a\\nb\": 2}", &rq, why, NULL));
    assert_null(strstr(why, "a\nb"));
    char big[200];
    snprintf(big, sizeof big, "{\"token\": 1, \"%070d\": 2}", 0);
    assert_false(parse(IDEM__REQUEST__OP_RELEASE, big, &rq, why, NULL));
    assert_null(strstr(why, "0000000"));
    /* the known ones pass */
    assert_true(parse(IDEM__REQUEST__OP_CLAIM,
                      "{\"fingerprint\": \"" FP64 "\", \"attempt_id\": \"a\", \"lease_ms\": 5, "
                      "\"ttl_ms\": 6, \"policy\": \"takeover\"}",
                      &rq, why, NULL));
    assert_true(parse(IDEM__REQUEST__OP_CLAIM,
                      "{\"request\": {\"method\": \"POST\", \"path\": \"/\", \"body\": {}}}", &rq,
                      why, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sf_string_valid),
        cmocka_unit_test(test_sf_string_refused),
        cmocka_unit_test(test_header_item),
        cmocka_unit_test(test_item_out),
        cmocka_unit_test(test_key_why),
        cmocka_unit_test(test_problem),
        cmocka_unit_test(test_token_from_json),
        cmocka_unit_test(test_body_token_as_string),
        cmocka_unit_test(test_body_unknown_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
