/* server/proxy_rules.c: proxy mode's pure request rules. Table-driven: path normalisation and
 * its refusals, prefix matching at a '/' boundary, and the caller namespace (digest framing,
 * the namespaced key's form, and fixed vectors computed independently, in Python, from the
 * framing proxy_rules.h describes, so that a change of the derivation, which would orphan
 * every namespaced record, is seen). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "key.h"
#include "proxy_rules.h"

struct pathCase {
    const char *in;
    int rc;
    const char *out; /* the normalised target when rc is PROXY_PATH_OK */
    size_t path_len; /* its path part's length */
};

static const struct pathCase pathCases[] = {
    {"/", PROXY_PATH_OK, "/", 1},
    {"/api/pay", PROXY_PATH_OK, "/api/pay", 8},
    {"/api/pay/", PROXY_PATH_OK, "/api/pay/", 9},
    {"/api/pay?x=1&y=%2f..", PROXY_PATH_OK, "/api/pay?x=1&y=%2f..", 8}, /* query unchanged */
    {"/api/pay?", PROXY_PATH_OK, "/api/pay?", 8},
    {"/%61%70%69/%7euser", PROXY_PATH_OK, "/api/~user", 10}, /* unreserved decoded */
    {"/a%2d%2E%5f%7E", PROXY_PATH_OK, "/a-._~", 6},
    {"/a%20b/%c3%a9", PROXY_PATH_OK, "/a%20b/%C3%A9", 13}, /* others kept, upper-case hex */
    {"/a%3fb?q", PROXY_PATH_OK, "/a%3Fb?q", 6},            /* an encoded '?' stays a byte */
    {"/a;v=1/b", PROXY_PATH_OK, "/a;v=1/b", 8},
    {"/.well-known/x", PROXY_PATH_OK, "/.well-known/x", 14},
    {"/a/...", PROXY_PATH_OK, "/a/...", 6},
    {"/a/.b/..c", PROXY_PATH_OK, "/a/.b/..c", 9},
    {"/a:b@c!$&'()*+,=", PROXY_PATH_OK, "/a:b@c!$&'()*+,=", 16},
    /* the review's paths */
    {"/api/pay/../../internal/admin", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/api/pay%2f..%2finternal", PROXY_PATH_ENCODED_SLASH, NULL, 0},
    {"/api/pay%2F..%2Finternal", PROXY_PATH_ENCODED_SLASH, NULL, 0},
    /* dot segments, raw and encoded, anywhere */
    {"/.", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/..", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/./b", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/..", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/../", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/%2e%2e/b", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/%2E./b", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/.%2e", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/%2e/b", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/..;x/b", PROXY_PATH_DOT_SEGMENT, NULL, 0}, /* Tomcat-style "..;" */
    {"/a/.;/b", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    {"/a/../b?x", PROXY_PATH_DOT_SEGMENT, NULL, 0},
    /* backslashes */
    {"/a\\b", PROXY_PATH_BACKSLASH, NULL, 0},
    {"/a%5cb", PROXY_PATH_BACKSLASH, NULL, 0},
    {"/a%5C..%5Cb", PROXY_PATH_BACKSLASH, NULL, 0},
    /* malformed percent-encoding */
    {"/a%", PROXY_PATH_BAD_PERCENT, NULL, 0},
    {"/a%2", PROXY_PATH_BAD_PERCENT, NULL, 0},
    {"/a%2?x=1", PROXY_PATH_BAD_PERCENT, NULL, 0}, /* the query does not complete it */
    {"/a%zz", PROXY_PATH_BAD_PERCENT, NULL, 0},
    {"/a%g0", PROXY_PATH_BAD_PERCENT, NULL, 0},
    {"/a%%41", PROXY_PATH_BAD_PERCENT, NULL, 0},
    {"/a%00b", PROXY_PATH_BAD_PERCENT, NULL, 0},
    /* empty segments */
    {"//", PROXY_PATH_EMPTY_SEGMENT, NULL, 0},
    {"//api/pay", PROXY_PATH_EMPTY_SEGMENT, NULL, 0},
    {"/api//pay", PROXY_PATH_EMPTY_SEGMENT, NULL, 0},
    /* bytes that must be encoded */
    {"/a b", PROXY_PATH_BAD_BYTE, NULL, 0},
    {"/a#b", PROXY_PATH_BAD_BYTE, NULL, 0},
    {"/a\tb", PROXY_PATH_BAD_BYTE, NULL, 0},
    {"/a\x7f", PROXY_PATH_BAD_BYTE, NULL, 0},
    {"/caf\xc3\xa9", PROXY_PATH_BAD_BYTE, NULL, 0},
    /* not origin-form */
    {"", PROXY_PATH_NOT_ORIGIN, NULL, 0},
    {"*", PROXY_PATH_NOT_ORIGIN, NULL, 0},
    {"http://h/api/pay", PROXY_PATH_NOT_ORIGIN, NULL, 0},
    {"api/pay", PROXY_PATH_NOT_ORIGIN, NULL, 0},
    {"?x", PROXY_PATH_NOT_ORIGIN, NULL, 0},
};

static void test_normalise(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof pathCases / sizeof pathCases[0]; i++) {
        const struct pathCase *c = &pathCases[i];
        size_t len = strlen(c->in);
        char out[128];
        memset(out, 'Z', sizeof out);
        size_t out_len = 999, path_len = 999;
        int rc = proxy_path_normalise(c->in, len, out, &out_len, &path_len);
        if (rc != c->rc) {
            fail_msg("case %zu \"%s\": rc %d (%s), want %d", i, c->in, rc, proxy_path_strerror(rc),
                     c->rc);
        }
        if (rc != PROXY_PATH_OK) {
            assert_true(strlen(proxy_path_strerror(rc)) > 0);
            continue;
        }
        if (strcmp(out, c->out) != 0 || out_len != strlen(c->out) || path_len != c->path_len) {
            fail_msg("case %zu \"%s\": got \"%s\" (%zu, path %zu), want \"%s\" (path %zu)", i,
                     c->in, out, out_len, path_len, c->out, c->path_len);
        }
        assert_true(out_len <= len); /* never longer: out needs len + 1 bytes */
        /* normalising a normalised target changes nothing */
        char again[128];
        size_t al = 0, apl = 0;
        assert_int_equal(proxy_path_normalise(out, out_len, again, &al, &apl), PROXY_PATH_OK);
        assert_string_equal(again, out);
        assert_int_equal(apl, path_len);
    }
}

/* Not NUL-terminated input: only len bytes are read. */
static void test_normalise_reads_len_bytes(void **state)
{
    (void)state;
    char in[] = {'/', 'a', '%', '4'};
    char out[8];
    size_t ol = 0, pl = 0;
    assert_int_equal(proxy_path_normalise(in, sizeof in, out, &ol, &pl), PROXY_PATH_BAD_PERCENT);
    assert_int_equal(proxy_path_normalise(in, 2, out, &ol, &pl), PROXY_PATH_OK);
    assert_string_equal(out, "/a");
}

struct matchCase {
    const char *prefix;
    const char *path;
    bool under;
};

static const struct matchCase matchCases[] = {
    {"/api/pay", "/api/pay", true},
    {"/api/pay", "/api/pay/", true},
    {"/api/pay", "/api/pay/x", true},
    {"/api/pay", "/api/pay/x/y", true},
    {"/api/pay", "/api/payroll", false},
    {"/api/pay", "/api/pa", false},
    {"/api/pay", "/api", false},
    {"/api/pay", "/API/pay", false},
    {"/api/pay", "/internal/api/pay", false},
    {"/api/pay/", "/api/pay/", true},
    {"/api/pay/", "/api/pay/x", true},
    {"/api/pay/", "/api/pay", false},
    {"/api/pay/", "/api/payroll", false},
    {"/", "/", true},
    {"/", "/anything/at/all", true},
    {"/a", "/a;x", false}, /* a parameter makes another segment name */
};

static void test_under(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof matchCases / sizeof matchCases[0]; i++) {
        const struct matchCase *c = &matchCases[i];
        if (proxy_path_under(c->path, strlen(c->path), c->prefix) != c->under) {
            fail_msg("case %zu: \"%s\" under \"%s\": want %s", i, c->path, c->prefix,
                     c->under ? "true" : "false");
        }
    }
    /* only path_len bytes count (the query is not part of the path) */
    assert_true(proxy_path_under("/api/pay?x", 8, "/api/pay"));
    assert_false(proxy_path_under("/api/pay?x", 8, "/api/pay/"));
}

static const char *const idNames[] = {"authorization", "cookie"};

static void hex32(const uint8_t *d, char out[65])
{
    for (size_t i = 0; i < 32; i++) {
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    }
}

static void test_caller_vectors(void **state)
{
    (void)state;
    uint8_t d[PROXY_CALLER_LEN];
    char hex[65], ns[PROXY_NS_KEY_LEN + 1];
    const char *alice = "Bearer alice";
    struct proxy_caller_value a[] = {{0, (const uint8_t *)alice, strlen(alice)}};
    assert_true(proxy_caller_digest(idNames, 2, a, 1, d));
    hex32(d, hex);
    assert_string_equal(hex, "ea532afba47c2246797ba3f63099d96192f62e22751a34cbbe52171d5bf9d378");
    assert_true(proxy_ns_key(d, (const uint8_t *)"order-1", 7, ns));
    assert_string_equal(ns, "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdIa");
    assert_true(proxy_key_reserved((const uint8_t *)ns, strlen(ns)));

    /* values grouped under their name, whatever the request's header order */
    const char *cookie = "session=abc", *bob = "Bearer bob";
    struct proxy_caller_value b[] = {{1, (const uint8_t *)cookie, strlen(cookie)},
                                     {0, (const uint8_t *)bob, strlen(bob)}};
    assert_true(proxy_caller_digest(idNames, 2, b, 2, d));
    hex32(d, hex);
    assert_string_equal(hex, "44436d241479fb2d266c92d2970e1d8644a0b9808cbdc43368d69b7be32191c7");
    assert_true(proxy_ns_key(d, (const uint8_t *)"order-1", 7, ns));
    assert_string_equal(ns, "~M6vi_5yTUxgaaG8Yl20GCBRWiENOeg_Cf9w9pDK9ZJ");
}

/* Distinct callers and keys get distinct namespaced keys; the framing keeps values from
 * running into each other or into another header. */
static void test_caller_distinct(void **state)
{
    (void)state;
    struct {
        size_t n;
        struct proxy_caller_value v[2];
    } ids[] = {
        {1, {{0, (const uint8_t *)"ab", 2}}},
        {2, {{0, (const uint8_t *)"a", 1}, {0, (const uint8_t *)"b", 1}}},
        {1, {{1, (const uint8_t *)"ab", 2}}}, /* the same value under the other header */
        {2, {{0, (const uint8_t *)"a", 1}, {1, (const uint8_t *)"b", 1}}},
        {1, {{0, (const uint8_t *)"", 0}}}, /* an empty value is a value */
        {0, {{0, NULL, 0}}},                /* no identity header */
    };
    size_t n = sizeof ids / sizeof ids[0];
    char keys[6][2][PROXY_NS_KEY_LEN + 1];
    for (size_t i = 0; i < n; i++) {
        uint8_t d[PROXY_CALLER_LEN];
        assert_true(proxy_caller_digest(idNames, 2, ids[i].v, ids[i].n, d));
        assert_true(proxy_ns_key(d, (const uint8_t *)"k1", 2, keys[i][0]));
        assert_true(proxy_ns_key(d, (const uint8_t *)"k2", 2, keys[i][1]));
        for (size_t k = 0; k < 2; k++) {
            /* a valid key for every tenant whose key_max_len is 43 or more, of the reserved
             * form */
            assert_int_equal(strlen(keys[i][k]), PROXY_NS_KEY_LEN);
            assert_true(proxy_key_reserved((const uint8_t *)keys[i][k], PROXY_NS_KEY_LEN));
            assert_int_equal(
                key_validate((const uint8_t *)keys[i][k], PROXY_NS_KEY_LEN, PROXY_NS_KEY_LEN),
                KEY_OK);
        }
        assert_string_not_equal(keys[i][0], keys[i][1]);
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = i + 1; k < n; k++) {
            assert_string_not_equal(keys[i][0], keys[k][0]);
        }
    }
    /* the longest key the contract allows */
    uint8_t d[PROXY_CALLER_LEN] = {0};
    uint8_t longest[KEY_MAX_LEN];
    memset(longest, 'k', sizeof longest);
    char ns[PROXY_NS_KEY_LEN + 1];
    assert_true(proxy_ns_key(d, longest, sizeof longest, ns));
    assert_int_equal(strlen(ns), PROXY_NS_KEY_LEN);
}

/* The namespaced keys' form, which no bare key may take: '~' and 42 base64url characters,
 * exactly. Keys a caller is likely to choose (43 base64url characters, as from 32 random
 * bytes, or '~' with another length or character) are not reserved. */
static void test_reserved_form(void **state)
{
    (void)state;
    static const char *const reserved[] = {
        "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdIa",
        "~------------------------------------------",
        "~AZaz09_-AZaz09_-AZaz09_-AZaz09_-AZaz09_-AZ",
    };
    static const char *const free_[] = {
        "4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdIaY",  /* 43 base64url characters */
        "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdI",   /* one short */
        "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdIaY", /* one long */
        "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmd.a",  /* '.' is a key byte, not base64url */
        "~4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmd~a",
        "x4k9TeE5Tv8yqg8t4vbL38ASv2wyW2YfY_9Z95kmdIa",
        "order-1",
    };
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
        assert_int_equal(strlen(reserved[i]), PROXY_NS_KEY_LEN);
        assert_true(proxy_key_reserved((const uint8_t *)reserved[i], strlen(reserved[i])));
    }
    for (size_t i = 0; i < sizeof free_ / sizeof free_[0]; i++) {
        assert_false(proxy_key_reserved((const uint8_t *)free_[i], strlen(free_[i])));
    }
}

/* A Connection header's tokens: commas and blanks between them, any case, whole tokens only;
 * the value is read to len, not to a NUL. */
static void test_connection_names(void **state)
{
    (void)state;
    static const char v[] = "keep-alive, X-Hop,\tx-other ,,Upgrade";
    size_t n = strlen(v);
    assert_true(proxy_connection_names(v, n, "x-hop", 5));
    assert_true(proxy_connection_names(v, n, "X-OTHER", 7));
    assert_true(proxy_connection_names(v, n, "keep-alive", 10));
    assert_true(proxy_connection_names(v, n, "upgrade", 7));
    assert_false(proxy_connection_names(v, n, "x-ho", 4));
    assert_false(proxy_connection_names(v, n, "x-hop-2", 7));
    assert_false(proxy_connection_names(v, n, "alive", 5));
    assert_false(proxy_connection_names(v, n - 1, "upgrade", 7)); /* "Upgrad" */
    assert_false(proxy_connection_names("", 0, "x", 1));
    assert_false(proxy_connection_names(" , ", 3, "", 0)); /* no empty token */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalise),       cmocka_unit_test(test_normalise_reads_len_bytes),
        cmocka_unit_test(test_under),           cmocka_unit_test(test_caller_vectors),
        cmocka_unit_test(test_caller_distinct), cmocka_unit_test(test_reserved_form),
        cmocka_unit_test(test_connection_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
