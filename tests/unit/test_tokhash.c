/* server/tokhash.c: bearer tokens' SHA-256 through one kept context. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "tokhash.h"

static void sha256(const uint8_t *p, size_t n, uint8_t out[32])
{
    unsigned int len = 0;
    assert_int_equal(EVP_Digest(p, n, out, &len, EVP_sha256(), NULL), 1);
    assert_int_equal(len, 32);
}

static void expectDigest(struct tokhash *t, const uint8_t *tok, size_t n)
{
    uint8_t got[32], want[32];
    memset(got, 0xaa, sizeof got);
    assert_true(tokhash_sha256(t, tok, n, got));
    sha256(tok, n, want);
    assert_memory_equal(got, want, 32);
}

/* FIPS 180-2's first example: SHA-256("abc"). */
static void test_known_answer(void **state)
{
    (void)state;
    static const uint8_t want[32] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t got[32];
    for (int i = 0; i < 2; i++) { /* the reused context gives it again */
        memset(got, 0, sizeof got);
        assert_true(tokhash_sha256(&t, (const uint8_t *)"abc", 3, got));
        assert_memory_equal(got, want, sizeof want);
    }
    tokhash_close(&t);
}

/* Every length digests as SHA-256 does, whatever was digested before with the same context
 * (a longer token, then a prefix of it, then one differing in its last byte). */
static void test_digests_are_sha256(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t tok[1000];
    for (size_t i = 0; i < sizeof tok; i++) {
        tok[i] = (uint8_t)(i * 7 + 3);
    }
    const size_t lens[] = {1, 32, 55, 56, 64, 128, 129, sizeof tok, 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        expectDigest(&t, tok, lens[i]);
        expectDigest(&t, tok, lens[i]);
        expectDigest(&t, tok, lens[i] - 1 > 0 ? lens[i] - 1 : 1);
        tok[lens[i] - 1] ^= 1;
        expectDigest(&t, tok, lens[i]);
        tok[lens[i] - 1] ^= 1;
    }
    tokhash_close(&t);
}

/* An empty or absent token has no digest; a token after them digests as SHA-256 does. */
static void test_empty_token_refused(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t h[32];
    assert_false(tokhash_sha256(&t, (const uint8_t *)"x", 0, h));
    assert_false(tokhash_sha256(&t, NULL, 0, h));
    assert_false(tokhash_sha256(&t, NULL, 5, h));
    expectDigest(&t, (const uint8_t *)"x", 1);
    tokhash_close(&t);
    tokhash_close(&t); /* a second close is harmless */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answer),
        cmocka_unit_test(test_digests_are_sha256),
        cmocka_unit_test(test_empty_token_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
