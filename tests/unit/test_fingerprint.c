/* Unit tests of the fingerprint, key-digest and key-validation module (docs/contract.md). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fingerprint.h"
#include "fp_json.h"
#include "http_api_body.h"

/* Shorthands for a body given as a C string literal, in an initializer and in a statement. */
#define BODY(s) .body = (const uint8_t *)(s), .body_len = sizeof(s) - 1
#define SETBODY(in, s) ((in).body = (const uint8_t *)(s), (in).body_len = sizeof(s) - 1)

/* A baseline request that each case below varies in one respect. */
static struct fp_input baseInput(void)
{
    struct fp_input in = {
        .method = "POST",
        .path = "/v1/payments",
        .tenant = "tenant-a",
        .content_type = "application/json",
        BODY("{\"a\":1,\"b\":2}"),
    };
    return in;
}

/* Computes a fingerprint and fails the test if that does not succeed. */
static void computeOk(const struct fp_input *in, uint8_t out[FP_LEN])
{
    int rc = fp_compute(in, out);
    if (rc != FP_OK) {
        fail_msg("fp_compute: %s", fp_strerror(rc));
    }
}

/* One comparison: two inputs and whether their fingerprints must be equal. */
struct pair_case {
    const char *name;
    struct fp_input a;
    struct fp_input b;
    bool equal;
};

static void test_pairs(void **state)
{
    static const struct fp_header h_one[] = {
        {"X-Account", (const uint8_t *)"42", 2},
    };
    static const struct fp_header h_one_other_value[] = {
        {"X-Account", (const uint8_t *)"43", 2},
    };
    static const struct fp_header h_two[] = {
        {"X-Account", (const uint8_t *)"42", 2},
        {"X-Region", (const uint8_t *)"eu", 2},
    };
    static const struct fp_header h_two_reordered_recased[] = {
        {"x-region", (const uint8_t *)"eu", 2},
        {"X-ACCOUNT", (const uint8_t *)"42", 2},
    };
    static const struct fp_header h_dup[] = {
        {"X-Tag", (const uint8_t *)"b", 1},
        {"X-Tag", (const uint8_t *)"a", 1},
    };
    static const struct fp_header h_dup_reordered[] = {
        {"x-tag", (const uint8_t *)"a", 1},
        {"X-TAG", (const uint8_t *)"b", 1},
    };
    /* A header whose name and value boundary shifts must change the fingerprint. */
    static const struct fp_header h_shift_a[] = {
        {"x-ab", (const uint8_t *)"c", 1},
    };
    static const struct fp_header h_shift_b[] = {
        {"x-a", (const uint8_t *)"bc", 2},
    };
    const struct fp_input base = baseInput();
    struct pair_case cases[64];
    size_t n = 0;

    (void)state;

#define CASE(NAME, EQUAL, ...)                                                                     \
    do {                                                                                           \
        assert_true(n < sizeof cases / sizeof cases[0]);                                           \
        cases[n].name = (NAME);                                                                    \
        cases[n].equal = (EQUAL);                                                                  \
        cases[n].a = base;                                                                         \
        cases[n].b = base;                                                                         \
        struct pair_case *c = &cases[n];                                                           \
        __VA_ARGS__;                                                                               \
        n++;                                                                                       \
    } while (0)

    CASE("same input", true, (void)c);
    CASE("JSON key order and whitespace", true, SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("JSON with charset parameter", true, c->a.content_type = "application/json; charset=utf-8",
         c->b.content_type = "application/json;charset=UTF-8",
         SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("JSON media type in upper case", true, c->b.content_type = "Application/JSON",
         SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("+json suffix", true, c->a.content_type = "application/vnd.x+json",
         c->b.content_type = " application/vnd.x+JSON ; charset=utf-8",
         SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("text/plain is hashed raw", false, c->a.content_type = "text/plain",
         c->b.content_type = "text/plain", SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("no content type is hashed raw", false, c->a.content_type = NULL, c->b.content_type = NULL,
         SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("application/jsonx is not JSON", false, c->a.content_type = "application/jsonx",
         c->b.content_type = "application/jsonx", SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("bare +json subtype is not JSON", false, c->a.content_type = "application/+json",
         c->b.content_type = "application/+json", SETBODY(c->b, "{ \"b\":2, \"a\":1 }"));
    CASE("nested objects are sorted", true,
         SETBODY(c->a, "{\"o\":{\"y\":[1,{\"q\":0,\"p\":1}],\"x\":null}}"),
         SETBODY(c->b, "{\"o\":{\"x\":null,\"y\":[1,{\"p\":1,\"q\":0}]}}"));
    CASE("array order matters", false, SETBODY(c->a, "[1,2]"), SETBODY(c->b, "[2,1]"));
    CASE("unicode escape equals UTF-8", true, SETBODY(c->a, "\"\\u00e9\""),
         SETBODY(c->b, "\"\xc3\xa9\""));
    CASE("top-level scalar with whitespace", true, SETBODY(c->a, "42"), SETBODY(c->b, " 42\n"));
    CASE("different JSON body", false, SETBODY(c->b, "{\"a\":1,\"b\":3}"));
    CASE("different raw body", false, c->a.content_type = "text/plain",
         c->b.content_type = "text/plain", SETBODY(c->b, "{\"a\":1,\"b\":3}"));
    CASE("empty JSON body equals empty raw body", true, c->a.body = NULL, c->a.body_len = 0,
         c->b.content_type = "text/plain", c->b.body = NULL, c->b.body_len = 0);
    CASE("different tenant", false, c->b.tenant = "tenant-b");
    CASE("method case", true, c->a.method = "post", c->b.method = "POST");
    CASE("different method", false, c->b.method = "PUT");
    CASE("different path", false, c->b.path = "/v1/refunds");
    CASE("query order", true, c->a.path = "/p?b=2&a=1", c->b.path = "/p?a=1&b=2");
    CASE("three query parameters", true, c->a.path = "/p?c=3&a=1&b=2",
         c->b.path = "/p?b=2&c=3&a=1");
    CASE("query values differ", false, c->a.path = "/p?a=1&b=2", c->b.path = "/p?a=1&b=3");
    CASE("question mark is not dropped", false, c->a.path = "/a?x=1", c->b.path = "/ax=1");
    CASE("empty query equals no query", true, c->a.path = "/a?", c->b.path = "/a");
    CASE("path/tenant boundary", false, c->a.path = "/ab", c->a.tenant = "c", c->b.path = "/a",
         c->b.tenant = "bc");
    CASE("method/path boundary", false, c->a.method = "POST", c->a.path = "/x", c->b.method = "POS",
         c->b.path = "T/x");
    CASE("tenant/body boundary", false, c->a.tenant = "t{", c->a.content_type = "text/plain",
         SETBODY(c->a, "}"), c->b.tenant = "t", c->b.content_type = "text/plain",
         SETBODY(c->b, "{}"));
    CASE("a header changes the fingerprint", false, c->b.headers = h_one, c->b.n_headers = 1);
    CASE("header value matters", false, c->a.headers = h_one, c->a.n_headers = 1,
         c->b.headers = h_one_other_value, c->b.n_headers = 1);
    CASE("header order and name case", true, c->a.headers = h_two, c->a.n_headers = 2,
         c->b.headers = h_two_reordered_recased, c->b.n_headers = 2);
    CASE("repeated header, values in any order", true, c->a.headers = h_dup, c->a.n_headers = 2,
         c->b.headers = h_dup_reordered, c->b.n_headers = 2);
    CASE("header name/value boundary", false, c->a.headers = h_shift_a, c->a.n_headers = 1,
         c->b.headers = h_shift_b, c->b.n_headers = 1);
    CASE("10 and 10.0 (JCS numbers)", true, SETBODY(c->a, "{\"n\":10}"),
         SETBODY(c->b, "{\"n\":10.0}"));
    CASE("1e1 and 1.0E+1", true, SETBODY(c->a, "[1e1,0.5]"), SETBODY(c->b, "[1.0E+1,5e-1]"));
    CASE("-0 and 0", true, SETBODY(c->a, "[-0,-0.0]"), SETBODY(c->b, "[0,0]"));
    CASE("1.10 and 1.1", true, SETBODY(c->a, "1.10"), SETBODY(c->b, "1.1"));
    CASE("10 and 10.5 differ", false, SETBODY(c->a, "10"), SETBODY(c->b, "10.5"));
    CASE("large ids one apart differ (exact integers)", false, SETBODY(c->a, "9007199254740993"),
         SETBODY(c->b, "9007199254740992"));
    CASE("a large integer and the same as a real differ (deviation)", false,
         SETBODY(c->a, "9007199254740993"), SETBODY(c->b, "9007199254740993.0"));
    CASE("numbers inside a string are text", false, SETBODY(c->a, "\"10\""),
         SETBODY(c->b, "\"10.0\""));
#undef CASE

    for (size_t i = 0; i < n; i++) {
        uint8_t fa[FP_LEN];
        uint8_t fb[FP_LEN];
        computeOk(&cases[i].a, fa);
        computeOk(&cases[i].b, fb);
        if (fp_equal(fa, fb) != cases[i].equal) {
            fail_msg("case \"%s\": expected fingerprints to %s", cases[i].name,
                     cases[i].equal ? "match" : "differ");
        }
    }
}

/* One body that fp_compute() must accept or reject. */
struct body_case {
    const char *name;
    const char *content_type;
    const char *body;
    int rc;
};

/* A JSON body past FP_JSON_MAX_VALUES values is refused before any parse (the same body as
 * text fingerprints); one at the bound, and separators inside strings, are not counted
 * against it. */
static void test_json_values_bound(void **state)
{
    (void)state;
    size_t n = FP_JSON_MAX_VALUES;
    char *body = malloc(2 * n + 8);
    assert_non_null(body);
    size_t len = 0;
    body[len++] = '[';
    for (size_t i = 0; i < n - 1; i++) { /* the array and n - 1 zeros: n values */
        body[len++] = '0';
        body[len++] = ',';
    }
    body[len - 1] = ']';
    struct fp_input in = baseInput();
    uint8_t out[FP_LEN];
    in.content_type = "application/json";
    in.body = (const uint8_t *)body;
    in.body_len = len;
    assert_int_equal(fp_compute(&in, out), FP_OK);
    body[len - 1] = ',';
    body[len++] = '0';
    body[len++] = ']'; /* one more */
    in.body_len = len;
    assert_int_equal(fp_compute(&in, out), FP_EJSON_TOO_MANY);
    in.content_type = "text/plain";
    assert_int_equal(fp_compute(&in, out), FP_OK);
    /* Separators in a string (escaped quotes included) count for nothing. */
    len = 0;
    body[len++] = '"';
    for (size_t i = 0; i < n; i++) {
        body[len++] = i % 2 ? ',' : '\\';
        body[len++] = i % 2 ? '[' : '"';
    }
    body[len++] = '"';
    in.content_type = "application/json";
    in.body_len = len;
    assert_int_equal(fp_compute(&in, out), FP_OK);
    free(body);
}

static void test_bodies(void **state)
{
    static const struct body_case cases[] = {
        {"invalid JSON", "application/json", "{\"a\":", FP_EINVAL_JSON},
        {"trailing garbage", "application/json", "{} x", FP_EINVAL_JSON},
        {"two documents", "application/json", "1 2", FP_EINVAL_JSON},
        {"whitespace only", "application/json", "  ", FP_EINVAL_JSON},
        {"duplicate keys", "application/json", "{\"a\":1,\"a\":2}", FP_EINVAL_JSON},
        {"nested duplicate keys", "application/vnd.x+json", "{\"o\":{\"k\":1,\"k\":1}}",
         FP_EINVAL_JSON},
        {"invalid UTF-8", "application/json", "\"\xff\"", FP_EINVAL_JSON},
        {"invalid JSON as text is fine", "text/plain", "{\"a\":", FP_OK},
        {"empty JSON body", "application/json", "", FP_OK},
        {"top-level string", "application/json", "\"s\"", FP_OK},
        {"top-level null", "application/json", "null", FP_OK},
        {"NUL escape in a string", "application/json", "{\"a\":\"x\\u0000y\"}", FP_OK},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fp_input in = baseInput();
        uint8_t out[FP_LEN];
        int rc;

        in.content_type = cases[i].content_type;
        in.body = (const uint8_t *)cases[i].body;
        in.body_len = strlen(cases[i].body);
        rc = fp_compute(&in, out);
        if (rc != cases[i].rc) {
            fail_msg("case \"%s\": expected %s, got %s", cases[i].name, fp_strerror(cases[i].rc),
                     fp_strerror(rc));
        }
    }
}

static void test_invalid_arguments(void **state)
{
    static const struct fp_header no_name[] = {{NULL, (const uint8_t *)"v", 1}};
    static const struct fp_header no_value[] = {{"x-a", NULL, 1}};
    static const struct fp_header empty_value[] = {{"x-a", NULL, 0}};
    struct fp_input in;
    uint8_t out[FP_LEN];

    (void)state;
    in = baseInput();
    assert_int_equal(fp_compute(NULL, out), FP_EINVAL);
    assert_int_equal(fp_compute(&in, NULL), FP_EINVAL);
    in.method = NULL;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in = baseInput();
    in.path = NULL;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in = baseInput();
    in.tenant = NULL;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in = baseInput();
    in.body = NULL;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in = baseInput();
    in.n_headers = 1;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in.headers = no_name;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in.headers = no_value;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in.headers = empty_value;
    assert_int_equal(fp_compute(&in, out), FP_OK);
}

/* Appends a 4-byte big-endian number to buf at *len. */
static void putBe32(uint8_t *buf, size_t *len, uint32_t v)
{
    buf[(*len)++] = (uint8_t)(v >> 24);
    buf[(*len)++] = (uint8_t)(v >> 16);
    buf[(*len)++] = (uint8_t)(v >> 8);
    buf[(*len)++] = (uint8_t)v;
}

/* Appends one framed field (4-byte big-endian length, then the bytes) to buf at *len. */
static void putField(uint8_t *buf, size_t *len, const char *s)
{
    size_t n = strlen(s);
    putBe32(buf, len, (uint32_t)n);
    memcpy(buf + *len, s, n);
    *len += n;
}

/* Hashes bytes with EVP SHA-256, independently of the module under test. */
static void sha256(const uint8_t *data, size_t len, uint8_t out[FP_LEN])
{
    unsigned int out_len = 0;
    assert_int_equal(EVP_Digest(data, len, out, &out_len, EVP_sha256(), NULL), 1);
    assert_int_equal(out_len, FP_LEN);
}

/* Formats 32 bytes as 64 lower-case hex digits. */
static void toHex(const uint8_t *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    }
}

/* Pins the framing: the expected digest is built here by hand from the documented field
 * order, with each canonicalisation written out literally, and hashed with EVP directly. */
static void test_known_answer(void **state)
{
    static const struct fp_header headers[] = {
        {"X-B", (const uint8_t *)"2", 1},
        {"x-A", (const uint8_t *)"1", 1},
    };
    struct fp_input in = {
        .method = "post",
        .path = "/v1/pay?b=2&a=1",
        .tenant = "t1",
        .content_type = "application/json; charset=utf-8",
        BODY("{ \"b\": 2, \"a\": 1 }"),
        .headers = headers,
        .n_headers = 2,
    };
    uint8_t framed[256];
    size_t len = 0;
    uint8_t expected[FP_LEN];
    uint8_t actual[FP_LEN];
    char expected_hex[2 * FP_LEN + 1];
    char actual_hex[2 * FP_LEN + 1];

    (void)state;
    putField(framed, &len, "idem-fp-v1");
    putField(framed, &len, "POST");
    putField(framed, &len, "/v1/pay?a=1&b=2");
    putField(framed, &len, "t1");
    putField(framed, &len, "{\"a\":1,\"b\":2}");
    putBe32(framed, &len, 2);
    putField(framed, &len, "x-a");
    putField(framed, &len, "1");
    putField(framed, &len, "x-b");
    putField(framed, &len, "2");
    sha256(framed, len, expected);

    computeOk(&in, actual);
    toHex(expected, FP_LEN, expected_hex);
    toHex(actual, FP_LEN, actual_hex);
    assert_string_equal(actual_hex, expected_hex);

    /* The same value computed outside C (Python hashlib over the same framed bytes), so a
     * change to the framing that also slipped into the helpers above is still caught. */
    assert_string_equal(actual_hex,
                        "f133ee87e70b9b1a60e586294858cc33b586d4ddca67a48f43094babafb16a62");
}

static void test_equal(void **state)
{
    uint8_t a[FP_LEN];
    uint8_t b[FP_LEN];

    (void)state;
    for (size_t i = 0; i < FP_LEN; i++) {
        a[i] = (uint8_t)(i * 7u);
    }
    memcpy(b, a, FP_LEN);
    assert_true(fp_equal(a, b));
    b[FP_LEN - 1] ^= 1;
    assert_false(fp_equal(a, b));
    b[FP_LEN - 1] ^= 1;
    b[0] ^= 0x80;
    assert_false(fp_equal(a, b));
}

static void test_hex12(void **state)
{
    uint8_t fp[FP_LEN];
    char out[FP_HEX12_SIZE];

    (void)state;
    memset(fp, 0xee, sizeof fp);
    fp[0] = 0x01;
    fp[1] = 0x23;
    fp[2] = 0x45;
    fp[3] = 0x67;
    fp[4] = 0x89;
    fp[5] = 0xab;
    memset(out, 'X', sizeof out);
    fp_hex12(fp, out);
    assert_string_equal(out, "0123456789ab");
    assert_int_equal(out[12], '\0');
}

/* Returns whether s is exactly 12 lower-case hex digits. */
static bool isHex12(const char *s)
{
    if (strlen(s) != 12) {
        return false;
    }
    for (size_t i = 0; i < 12; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return false;
        }
    }
    return true;
}

static void test_key_digest(void **state)
{
    static const uint8_t key[] = "order-17";
    char a[FP_HEX12_SIZE];
    char a_again[FP_HEX12_SIZE];
    char b[FP_HEX12_SIZE];
    char shifted[FP_HEX12_SIZE];
    uint8_t framed[64];
    size_t len = 0;
    uint8_t digest[FP_LEN];
    char expected[FP_HEX12_SIZE];

    (void)state;
    assert_int_equal(key_digest("tenant-a", key, sizeof key - 1, a), FP_OK);
    assert_true(isHex12(a));
    assert_int_equal(key_digest("tenant-a", key, sizeof key - 1, a_again), FP_OK);
    assert_string_equal(a, a_again);
    assert_int_equal(key_digest("tenant-b", key, sizeof key - 1, b), FP_OK);
    assert_true(isHex12(b));
    assert_string_not_equal(a, b);

    /* The tenant/key boundary is framed: ("tenant-ao", "rder-17") is another pair. */
    assert_int_equal(key_digest("tenant-ao", key + 1, sizeof key - 2, shifted), FP_OK);
    assert_string_not_equal(a, shifted);

    /* The framing is pinned: SHA-256(len "tenant-a" || "tenant-a" || len key || key). */
    putField(framed, &len, "tenant-a");
    putField(framed, &len, "order-17");
    sha256(framed, len, digest);
    fp_hex12(digest, expected);
    assert_string_equal(a, expected);

    assert_int_equal(key_digest(NULL, key, 1, a), FP_EINVAL);
    assert_string_equal(a, "");
    assert_int_equal(key_digest("t", NULL, 1, a), FP_EINVAL);

    /* Keyed with a members' secret: HMAC-SHA256 under HMAC-SHA256(secret, label), pinned;
     * another secret gives another digest; unkeyed again gives the plain one. */
    static const uint8_t secret[] = "0123456789abcdef0123456789abcdef";
    static const char label[] = "idemd key_digest v1";
    uint8_t dkey[FP_LEN];
    unsigned int n = 0;
    assert_non_null(HMAC(EVP_sha256(), secret, sizeof secret - 1, (const uint8_t *)label,
                         sizeof label - 1, dkey, &n));
    assert_non_null(HMAC(EVP_sha256(), dkey, sizeof dkey, framed, len, digest, &n));
    fp_hex12(digest, expected);
    char keyed[FP_HEX12_SIZE], other[FP_HEX12_SIZE], plain[FP_HEX12_SIZE];
    assert_int_equal(key_digest_set_secret(secret, sizeof secret - 1), FP_OK);
    assert_int_equal(key_digest("tenant-a", key, sizeof key - 1, keyed), FP_OK);
    assert_string_equal(keyed, expected);
    assert_string_not_equal(keyed, a_again);
    assert_int_equal(key_digest_set_secret(secret, sizeof secret - 2), FP_OK);
    assert_int_equal(key_digest("tenant-a", key, sizeof key - 1, other), FP_OK);
    assert_string_not_equal(other, keyed);
    assert_int_equal(key_digest_set_secret(NULL, 0), FP_OK);
    assert_int_equal(key_digest("tenant-a", key, sizeof key - 1, plain), FP_OK);
    assert_string_equal(plain, a_again);
}

/* One key_validate() call and its expected result. */
struct key_case {
    const char *name;
    const uint8_t *key;
    size_t len;
    size_t max_len;
    int rc;
};

static void test_key_validate(void **state)
{
    uint8_t k255[255];
    uint8_t k256[256];
    static const uint8_t ten[] = "abcdefghij";
    static const uint8_t eleven[] = "abcdefghijk";
    static const uint8_t all_allowed[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:~-";

    (void)state;
    memset(k255, 'k', sizeof k255);
    memset(k256, 'k', sizeof k256);

    const struct key_case cases[] = {
        {"missing", NULL, 0, 0, KEY_MISSING},
        {"missing with a length", NULL, 5, 0, KEY_MISSING},
        {"empty", (const uint8_t *)"", 0, 0, KEY_MISSING},
        {"one byte", (const uint8_t *)"a", 1, 0, KEY_OK},
        {"255 bytes", k255, 255, 0, KEY_OK},
        {"256 bytes", k256, 256, 0, KEY_INVALID},
        {"256 bytes, limit clamped to 255", k256, 256, 1000, KEY_INVALID},
        {"255 bytes, limit above 255", k255, 255, 1000, KEY_OK},
        {"10 bytes, limit 10", ten, 10, 10, KEY_OK},
        {"11 bytes, limit 10", eleven, 11, 10, KEY_INVALID},
        {"every allowed byte", all_allowed, sizeof all_allowed - 1, 0, KEY_OK},
        {"dot", (const uint8_t *)"a.b", 3, 0, KEY_OK},
        {"underscore", (const uint8_t *)"a_b", 3, 0, KEY_OK},
        {"colon", (const uint8_t *)"a:b", 3, 0, KEY_OK},
        {"tilde", (const uint8_t *)"a~b", 3, 0, KEY_OK},
        {"hyphen", (const uint8_t *)"a-b", 3, 0, KEY_OK},
        {"space", (const uint8_t *)"a b", 3, 0, KEY_INVALID},
        {"slash", (const uint8_t *)"a/b", 3, 0, KEY_INVALID},
        {"NUL byte", (const uint8_t *)"a\0b", 3, 0, KEY_INVALID},
        {"byte 0x80",
         (const uint8_t *)"a\x80"
                          "b",
         3, 0, KEY_INVALID},
        {"double quote", (const uint8_t *)"a\"b", 3, 0, KEY_INVALID},
        {"plus", (const uint8_t *)"a+b", 3, 0, KEY_INVALID},
        {"newline", (const uint8_t *)"a\nb", 3, 0, KEY_INVALID},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = key_validate(cases[i].key, cases[i].len, cases[i].max_len);
        if (rc != cases[i].rc) {
            fail_msg("case \"%s\": expected %d, got %d", cases[i].name, cases[i].rc, rc);
        }
    }
}

/* The body fp_compute() hashes for a JSON body with the lists given; fails on an error. */
static char *canonical(const char *body, const char *const *fields, size_t n_fields,
                       const char *const *ignore, size_t n_ignore)
{
    struct fp_input in = baseInput();
    uint8_t *out = NULL;
    size_t len = 0;
    in.body = (const uint8_t *)body;
    in.body_len = strlen(body);
    in.fields = fields;
    in.n_fields = n_fields;
    in.ignore = ignore;
    in.n_ignore = n_ignore;
    int rc = fp_canonical_body(&in, &out, &len);
    if (rc != FP_OK) {
        fail_msg("fp_canonical_body(%s): %s", body, fp_strerror(rc));
    }
    char *s = malloc(len + 1);
    assert_non_null(s);
    memcpy(s, out, len);
    s[len] = '\0';
    free(out);
    return s;
}

static void expectCanonical(const char *body, const char *want)
{
    char *got = canonical(body, NULL, 0, NULL, 0);
    if (strcmp(got, want) != 0) {
        fail_msg("%s: expected %s, got %s", body, want, got);
    }
    free(got);
}

/* RFC 8785's number examples and edge cases, through the whole body path. */
static void test_jcs_numbers(void **state)
{
    static const char *const cases[][2] = {
        {"1e30", "1e+30"},
        {"4.50", "4.5"},
        {"2e-3", "0.002"},
        {"0.000001", "0.000001"},
        {"1e-7", "1e-7"},
        {"333333333.33333329", "333333333.3333333"},
        {"-0", "0"},
        {"-0.0", "0"},
        {"10", "10"},
        {"10.0", "10"},
        {"1e1", "10"},
        {"1.0E+1", "10"},
        {"1E1", "10"},
        {"100e-1", "10"},
        {"0.1", "0.1"},
        {"-1.5e-9", "-1.5e-9"},
        {"1e20", "100000000000000000000"},
        {"1e21", "1e+21"},
        {"123e-20", "1.23e-18"},
        {"0.0000012", "0.0000012"},
        {"1e-400", "0"}, /* below the smallest double: jansson reads 0 */
        {"5e-324", "5e-324"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        /* a power of two whose nearest 16 digits do not read back, the other side does */
        {"5.9604644775390625e-8", "5.960464477539063e-8"},
        {"6.189700196426902e+26", "6.189700196426902e+26"},
        /* integers: exact digits, also past 2^53 (the documented deviation from JCS) */
        {"9007199254740993", "9007199254740993"},
        {"9007199254740993.0", "9007199254740992"},
        {"9223372036854775807", "9223372036854775807"},
        {"-9223372036854775808", "-9223372036854775808"},
        {"{\"b\":[1.0,2.50,{\"c\":-0.0}],\"a\":1E2}", "{\"a\":100,\"b\":[1,2.5,{\"c\":0}]}"},
        /* strings as before: jansson's escapes, UTF-8 kept */
        {"\"\\u001f\\u00e9\\/\"", "\"\\u001F\xc3\xa9/\""},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expectCanonical(cases[i][0], cases[i][1]);
    }
    /* Still refused, as before: integers past long long, numbers past a double. */
    struct fp_input in = baseInput();
    uint8_t out[FP_LEN];
    static const char *const refused[] = {"9223372036854775808",
                                          "-9223372036854775809",
                                          "1e400",
                                          "-1e309",
                                          "NaN",
                                          "Infinity",
                                          "01",
                                          "1."};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        in.body = (const uint8_t *)refused[i];
        in.body_len = strlen(refused[i]);
        if (fp_compute(&in, out) != FP_EINVAL_JSON) {
            fail_msg("%s was not refused as invalid JSON", refused[i]);
        }
    }
}

/* RFC 8785 appendix B: IEEE 754 doubles (bits in hex) and their JCS form. */
static void test_jcs_appendix_b(void **state)
{
    static const struct {
        uint64_t bits;
        const char *want;
    } cases[] = {
        {0x0000000000000000, "0"},
        {0x8000000000000000, "0"},
        {0x0000000000000001, "5e-324"},
        {0x8000000000000001, "-5e-324"},
        {0x7fefffffffffffff, "1.7976931348623157e+308"},
        {0xffefffffffffffff, "-1.7976931348623157e+308"},
        {0x4340000000000000, "9007199254740992"},
        {0xc340000000000000, "-9007199254740992"},
        {0x4430000000000000, "295147905179352830000"},
        {0x44b52d02c7e14af5, "9.999999999999997e+22"},
        {0x44b52d02c7e14af6, "1e+23"},
        {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
        {0x444b1ae4d6e2ef4e, "999999999999999700000"},
        {0x444b1ae4d6e2ef4f, "999999999999999900000"},
        {0x444b1ae4d6e2ef50, "1e+21"},
        {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
        {0x3eb0c6f7a0b5ed8d, "0.000001"},
        {0x41b3de4355555553, "333333333.3333332"},
        {0x41b3de4355555554, "333333333.33333325"},
        {0x41b3de4355555555, "333333333.3333333"},
        {0x41b3de4355555556, "333333333.3333334"},
        {0x41b3de4355555557, "333333333.33333343"},
        {0xbecbf647612f3696, "-0.0000033333333333333333"},
        {0x43143ff3c1cb0959, "1424953923781206.2"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double d;
        char out[FP_JSON_REAL_SIZE];
        memcpy(&d, &cases[i].bits, sizeof d);
        size_t n = fp_json_real(d, out);
        if (n != strlen(cases[i].want) || strcmp(out, cases[i].want) != 0) {
            fail_msg("%016llx: expected %s, got %s", (unsigned long long)cases[i].bits,
                     cases[i].want, out);
        }
    }
    char out[FP_JSON_REAL_SIZE];
    assert_int_equal(fp_json_real(1.0 / 0.0, out), 0);
    assert_string_equal(out, "");
}

/* The JSON Pointer options: what each list does to the hashed body. */
static void test_pointers(void **state)
{
    static const char doc[] = "{\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}],\"e/f\":2,\"g~h\":3},"
                              "\"ts\":\"x\",\"\":{\"\":5}}";
    static const struct {
        const char *name;
        const char *fields[4];
        const char *ignore[6];
        const char *want;
    } cases[] = {
        {"ignore a member",
         {NULL},
         {"/ts"},
         "{\"\":{\"\":5},\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}],\"e/f\":2,\"g~h\":3}}"},
        {"ignore an array element: null, indices kept",
         {NULL},
         {"/b/c/1"},
         "{\"\":{\"\":5},\"a\":1,\"b\":{\"c\":[10,null,{\"d\":null}],\"e/f\":2,\"g~h\":3},"
         "\"ts\":\"x\"}"},
        {"escapes ~1 and ~0",
         {NULL},
         {"/b/e~1f", "/b/g~0h", "/"},
         "{\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}]},\"ts\":\"x\"}"},
        {"pointers that name nothing change nothing",
         {NULL},
         {"/nope", "/a/x", "/b/c/9", "/b/c/-", "/b/c/01", "/b/c/0/x"},
         "{\"\":{\"\":5},\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}],\"e/f\":2,\"g~h\":3},"
         "\"ts\":\"x\"}"},
        {"the member named \"\" of the member named \"\"",
         {NULL},
         {"//"},
         "{\"\":{},\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}],\"e/f\":2,\"g~h\":3},\"ts\":\"x\"}"},
        {"fields: absent left out, null kept",
         {"/a", "/b/c/2/d", "/zz", "/b/e~1f"},
         {NULL},
         "{\"/a\":1,\"/b/c/2/d\":null,\"/b/e~1f\":2}"},
        {"fields: the whole body",
         {""},
         {NULL},
         "{\"\":{\"\":{\"\":5},\"a\":1,\"b\":{\"c\":[10,20,{\"d\":null}],\"e/f\":2,\"g~h\":3},"
         "\"ts\":\"x\"}}"},
        {"fields: an element and a repeated pointer",
         {"/b/c/1", "/b/c/1"},
         {NULL},
         "{\"/b/c/1\":20}"},
        {"ignore first, then fields",
         {"/a", "/b"},
         {"/a", "/b/c"},
         "{\"/b\":{\"e/f\":2,\"g~h\":3}}"},
        {"fields that name nothing: {}", {"/missing"}, {NULL}, "{}"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t nf = 0, ni = 0;
        while (nf < 4 && cases[i].fields[nf] != NULL) {
            nf++;
        }
        while (ni < 6 && cases[i].ignore[ni] != NULL) {
            ni++;
        }
        char *got = canonical(doc, cases[i].fields, nf, cases[i].ignore, ni);
        if (strcmp(got, cases[i].want) != 0) {
            fail_msg("%s: expected %s, got %s", cases[i].name, cases[i].want, got);
        }
        free(got);
        /* The order of a list does not matter. */
        const char *rf[4], *ri[6];
        for (size_t k = 0; k < nf; k++) {
            rf[k] = cases[i].fields[nf - 1 - k];
        }
        for (size_t k = 0; k < ni; k++) {
            ri[k] = cases[i].ignore[ni - 1 - k];
        }
        got = canonical(doc, rf, nf, ri, ni);
        if (strcmp(got, cases[i].want) != 0) {
            fail_msg("%s, lists reversed: expected %s, got %s", cases[i].name, cases[i].want, got);
        }
        free(got);
    }
    /* A top-level array and scalar. */
    static const char *const zero[] = {"/0"}, *const two[] = {"/2"};
    char *got = canonical("[1,2,3]", NULL, 0, zero, 1);
    assert_string_equal(got, "[null,2,3]");
    free(got);
    got = canonical("[1,2,3.0]", two, 1, NULL, 0);
    assert_string_equal(got, "{\"/2\":3}");
    free(got);
    got = canonical("7", two, 1, zero, 1);
    assert_string_equal(got, "{}");
    free(got);
}

/* What the lists do to fingerprints: absent and null differ, the ignored member does not
 * count, a body that is not JSON is hashed raw whatever the lists say. */
static void test_pointer_fingerprints(void **state)
{
    static const char *const ts[] = {"/ts"};
    static const char *const amount[] = {"/amount"};
    struct fp_input a = baseInput(), b = baseInput();
    uint8_t fa[FP_LEN], fb[FP_LEN];
    (void)state;
    SETBODY(a, "{\"amount\":10,\"ts\":1}");
    SETBODY(b, "{\"amount\":10.0,\"ts\":2}");
    computeOk(&a, fa);
    computeOk(&b, fb);
    assert_false(fp_equal(fa, fb));
    a.ignore = b.ignore = ts;
    a.n_ignore = b.n_ignore = 1;
    computeOk(&a, fa);
    computeOk(&b, fb);
    assert_true(fp_equal(fa, fb));
    SETBODY(b, "{\"amount\":11,\"ts\":1}");
    computeOk(&b, fb);
    assert_false(fp_equal(fa, fb));
    /* fields: absent is not null */
    a = baseInput();
    b = baseInput();
    a.fields = b.fields = amount;
    a.n_fields = b.n_fields = 1;
    SETBODY(a, "{\"x\":1}");
    SETBODY(b, "{\"amount\":null,\"x\":1}");
    computeOk(&a, fa);
    computeOk(&b, fb);
    assert_false(fp_equal(fa, fb));
    SETBODY(b, "{\"y\":2}");
    computeOk(&b, fb);
    assert_true(fp_equal(fa, fb));
    /* text: raw, the lists ignored; an empty JSON body: the empty string */
    a = baseInput();
    b = baseInput();
    a.content_type = b.content_type = "text/plain";
    SETBODY(a, "{\"amount\":10,\"ts\":1}");
    SETBODY(b, "{\"amount\":10,\"ts\":1}");
    b.ignore = ts;
    b.n_ignore = 1;
    computeOk(&a, fa);
    computeOk(&b, fb);
    assert_true(fp_equal(fa, fb));
    b.content_type = "application/json";
    b.body = NULL;
    b.body_len = 0;
    a.body = NULL;
    a.body_len = 0;
    computeOk(&a, fa);
    computeOk(&b, fb);
    assert_true(fp_equal(fa, fb));
}

/* fp_pointer_check(), and fp_compute()'s own check of the lists. */
static void test_pointer_rules(void **state)
{
    char p256[FP_POINTER_MAX_LEN + 2];
    (void)state;
    p256[0] = '/';
    memset(p256 + 1, 'a', FP_POINTER_MAX_LEN);
    p256[FP_POINTER_MAX_LEN + 1] = '\0';
    assert_null(fp_pointer_check("", 0, false));
    assert_non_null(fp_pointer_check("", 0, true));
    assert_null(fp_pointer_check("/", 1, true));
    assert_null(fp_pointer_check("/~0~1/x", 7, true));
    assert_null(fp_pointer_check(p256, FP_POINTER_MAX_LEN, true));
    assert_non_null(fp_pointer_check(p256, FP_POINTER_MAX_LEN + 1, false));
    assert_non_null(fp_pointer_check("a", 1, false));
    assert_non_null(fp_pointer_check("#/a", 3, false));
    assert_non_null(fp_pointer_check("/a~", 3, false));
    assert_non_null(fp_pointer_check("/a~2", 4, false));
    assert_non_null(fp_pointer_check("/~/", 3, false));
    assert_non_null(fp_pointer_check("/\xff", 2, false));
    assert_non_null(fp_pointer_check("/a\0b", 4, false));
    assert_non_null(fp_pointer_check(NULL, 0, false));
    /* A rule never quotes the pointer. */
    assert_null(strstr(fp_pointer_check("/secret~", 8, false), "secret"));

    const char *many[FP_POINTERS_MAX + 1];
    char names[FP_POINTERS_MAX + 1][8];
    for (size_t i = 0; i <= FP_POINTERS_MAX; i++) {
        snprintf(names[i], sizeof names[i], "/k%zu", i);
        many[i] = names[i];
    }
    struct fp_input in = baseInput();
    uint8_t out[FP_LEN];
    in.fields = many;
    in.n_fields = FP_POINTERS_MAX;
    assert_int_equal(fp_compute(&in, out), FP_OK);
    in.n_fields = FP_POINTERS_MAX + 1;
    assert_int_equal(fp_compute(&in, out), FP_EPOINTER);
    in.n_fields = 0;
    in.ignore = many;
    in.n_ignore = FP_POINTERS_MAX + 1;
    assert_int_equal(fp_compute(&in, out), FP_EPOINTER);
    static const char *const empty[] = {""}, *const bad[] = {"/a~"}, *const null[] = {NULL};
    in.ignore = empty;
    in.n_ignore = 1;
    assert_int_equal(fp_compute(&in, out), FP_EPOINTER);
    in.content_type = "text/plain"; /* checked whatever the body */
    in.ignore = bad;
    assert_int_equal(fp_compute(&in, out), FP_EPOINTER);
    in.ignore = null;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in.ignore = NULL;
    assert_int_equal(fp_compute(&in, out), FP_EINVAL);
    in.n_ignore = 0;
    in.fields = empty; /* "" is the whole body in fields */
    in.n_fields = 1;
    assert_int_equal(fp_compute(&in, out), FP_OK);
}

/* The fingerprint the JSON API's claim computes from a request object (http_api_body.c). */
static bool apiFingerprint(const char *claim, uint8_t fp[FP_LEN], char *why, size_t why_size)
{
    static const struct config_tenant t = {.name = "tenant-a", .key_max_len = 255};
    static uint8_t key[] = "order-1";
    ProtobufCBinaryData kb = {7, key};
    struct http_api_body b;
    Idem__Request rq = IDEM__REQUEST__INIT;
    const char *w = NULL;
    bool ok =
        http_api_parse_body(IDEM__REQUEST__OP_CLAIM, claim, strlen(claim), &t, kb, &rq, &b, &w);
    snprintf(why, why_size, "%s", w ? w : "");
    if (ok) {
        assert_int_equal(rq.claim->fingerprint.len, FP_LEN);
        memcpy(fp, rq.claim->fingerprint.data, FP_LEN);
    }
    http_api_body_free(&b);
    return ok;
}

/* The JSON API and proxy mode agree: 10 and 10.0, and the pointer lists, give the JSON API's
 * claim the fingerprint fp_compute gives the same request's JSON body. */
static void test_api_agrees_with_proxy(void **state)
{
    static const char *const ts[] = {"/ts"};
    static const char *const amount[] = {"/amount", "/cur"};
    uint8_t api[FP_LEN], api2[FP_LEN], proxy[FP_LEN];
    char why[160];
    (void)state;
    struct fp_input in = baseInput();
    SETBODY(in, "{\"amount\": 10.0, \"ts\": 5}");
    computeOk(&in, proxy);
    assert_true(apiFingerprint("{\"request\": {\"method\": \"POST\", \"path\": \"/v1/payments\", "
                               "\"body\": {\"ts\": 5, \"amount\": 10}}}",
                               api, why, sizeof why));
    assert_true(fp_equal(api, proxy));
    assert_true(apiFingerprint("{\"request\": {\"method\": \"POST\", \"path\": \"/v1/payments\", "
                               "\"body\": {\"ts\": 5, \"amount\": 1.0e1}}}",
                               api2, why, sizeof why));
    assert_true(fp_equal(api2, proxy));
    /* with fingerprint_ignore */
    in.ignore = ts;
    in.n_ignore = 1;
    computeOk(&in, proxy);
    assert_true(apiFingerprint("{\"request\": {\"method\": \"POST\", \"path\": \"/v1/payments\", "
                               "\"body\": {\"ts\": 6, \"amount\": 10}, "
                               "\"fingerprint_ignore\": [\"/ts\"]}}",
                               api, why, sizeof why));
    assert_true(fp_equal(api, proxy));
    /* with fingerprint_fields (null for none is no list) */
    in.ignore = NULL;
    in.n_ignore = 0;
    in.fields = amount;
    in.n_fields = 2;
    computeOk(&in, proxy);
    assert_true(apiFingerprint("{\"request\": {\"method\": \"POST\", \"path\": \"/v1/payments\", "
                               "\"body\": {\"ts\": 7, \"amount\": 10, \"other\": [1]}, "
                               "\"fingerprint_fields\": [\"/cur\", \"/amount\"], "
                               "\"fingerprint_ignore\": null}}",
                               api, why, sizeof why));
    assert_true(fp_equal(api, proxy));
    /* a large id keeps its digits through the JSON API as through the proxy */
    in = baseInput();
    SETBODY(in, "{\"id\":9007199254740993}");
    computeOk(&in, proxy);
    assert_true(apiFingerprint("{\"request\": {\"method\": \"POST\", \"path\": \"/v1/payments\", "
                               "\"body\": {\"id\": 9007199254740993}}}",
                               api, why, sizeof why));
    assert_true(fp_equal(api, proxy));
}

/* The JSON API's refusals of the lists: the member and the rule named, the pointer never. */
static void test_api_pointer_refusals(void **state)
{
    static const struct {
        const char *lists;
        const char *why;
    } cases[] = {
        {"\"fingerprint_ignore\": [\"/ok\", \"\"]",
         "request.fingerprint_ignore[1]: the empty JSON pointer (the whole body) cannot be "
         "ignored"},
        {"\"fingerprint_fields\": [\"secret\"]",
         "request.fingerprint_fields[0]: a JSON pointer is empty or starts with '/'"},
        {"\"fingerprint_fields\": [\"/secret~2\"]",
         "request.fingerprint_fields[0]: '~' in a JSON pointer must be followed by 0 or 1 (~0 "
         "is '~', ~1 is '/')"},
        {"\"fingerprint_fields\": \"/a\"",
         "request.fingerprint_fields must be an array of at most 32 JSON pointer strings"},
        {"\"fingerprint_ignore\": [1]",
         "request.fingerprint_ignore must be an array of at most 32 JSON pointer strings"},
        {"\"fingerprint_filds\": []", "unknown field \"request.fingerprint_filds\""},
    };
    uint8_t fp[FP_LEN];
    char why[160], body[512];
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body,
                 "{\"request\": {\"method\": \"POST\", \"path\": \"/p\", \"body\": {}, %s}}",
                 cases[i].lists);
        assert_false(apiFingerprint(body, fp, why, sizeof why));
        assert_string_equal(why, cases[i].why);
    }
    /* 32 pointers are taken, 33 are not; a 257-byte pointer is not. */
    size_t at = (size_t)snprintf(body, sizeof body,
                                 "{\"request\": {\"method\": \"POST\", \"path\": \"/p\", "
                                 "\"fingerprint_ignore\": [");
    for (size_t i = 0; i < FP_POINTERS_MAX; i++) {
        at += (size_t)snprintf(body + at, sizeof body - at, "%s\"/%zu\"", i ? "," : "", i);
    }
    snprintf(body + at, sizeof body - at, "]}}");
    assert_true(apiFingerprint(body, fp, why, sizeof why));
    snprintf(body + at, sizeof body - at, ",\"/x\"]}}");
    assert_false(apiFingerprint(body, fp, why, sizeof why));
    assert_string_equal(why,
                        "request.fingerprint_ignore must be an array of at most 32 JSON pointer "
                        "strings");
    at = (size_t)snprintf(body, sizeof body,
                          "{\"request\": {\"method\": \"POST\", \"path\": \"/p\", "
                          "\"fingerprint_fields\": [\"/");
    memset(body + at, 'a', FP_POINTER_MAX_LEN);
    snprintf(body + at + FP_POINTER_MAX_LEN, sizeof body - at - FP_POINTER_MAX_LEN, "\"]}}");
    assert_false(apiFingerprint(body, fp, why, sizeof why));
    assert_string_equal(why, "request.fingerprint_fields[0]: a JSON pointer has at most 256 bytes");
}

/* Pins the framing with pointers and JCS numbers: the body field is the canonical JSON of
 * the selection, written out here by hand. */
static void test_known_answer_pointers(void **state)
{
    static const char *const fields[] = {"/n", "/o~1p"};
    static const char *const ignore[] = {"/n/1"};
    struct fp_input in = {
        .method = "POST",
        .path = "/p",
        .tenant = "t1",
        .content_type = "application/json",
        BODY("{\"o/p\": 1.0E+1, \"n\": [0.10, 7, 1e30], \"ts\": 3}"),
        .fields = fields,
        .n_fields = 2,
        .ignore = ignore,
        .n_ignore = 1,
    };
    uint8_t framed[256];
    size_t len = 0;
    uint8_t expected[FP_LEN], actual[FP_LEN];
    char expected_hex[2 * FP_LEN + 1], actual_hex[2 * FP_LEN + 1];
    (void)state;
    putField(framed, &len, "idem-fp-v1");
    putField(framed, &len, "POST");
    putField(framed, &len, "/p");
    putField(framed, &len, "t1");
    putField(framed, &len, "{\"/n\":[0.1,null,1e+30],\"/o~1p\":10}");
    putBe32(framed, &len, 0);
    sha256(framed, len, expected);
    computeOk(&in, actual);
    toHex(expected, FP_LEN, expected_hex);
    toHex(actual, FP_LEN, actual_hex);
    assert_string_equal(actual_hex, expected_hex);
    /* Python's hashlib over the same framed bytes. */
    assert_string_equal(actual_hex,
                        "5aff594ec36fd5dec80a5c590a1e3e507db5d72748cda8ca20b056e62e8dc19f");
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(fp_strerror(FP_OK), "success");
    assert_string_equal(fp_strerror(FP_EINVAL_JSON), "request body is not valid JSON");
    assert_string_equal(fp_strerror(-1), "unknown fingerprint error");
    assert_string_equal(fp_strerror(1000), "unknown fingerprint error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_json_values_bound),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_known_answer),
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_hex12),
        cmocka_unit_test(test_key_digest),
        cmocka_unit_test(test_key_validate),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_jcs_numbers),
        cmocka_unit_test(test_jcs_appendix_b),
        cmocka_unit_test(test_pointers),
        cmocka_unit_test(test_pointer_fingerprints),
        cmocka_unit_test(test_pointer_rules),
        cmocka_unit_test(test_api_agrees_with_proxy),
        cmocka_unit_test(test_api_pointer_refusals),
        cmocka_unit_test(test_known_answer_pointers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
