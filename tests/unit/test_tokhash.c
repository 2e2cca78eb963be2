/* server/tokhash.c: bearer tokens' SHA-256, the last few kept. */
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

/* Every length, kept or not, digests as SHA-256 does, the second time too. */
static void test_digests_are_sha256(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t tok[1000];
    for (size_t i = 0; i < sizeof tok; i++) {
        tok[i] = (uint8_t)(i * 7 + 3);
    }
    const size_t lens[] = {1, 32, TOKHASH_TOKEN_MAX, TOKHASH_TOKEN_MAX + 1, sizeof tok};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint64_t kept = t.kept;
        expectDigest(&t, tok, lens[i]);
        assert_int_equal(t.kept, kept); /* new: digested */
        expectDigest(&t, tok, lens[i]);
        /* the second time answered from the kept token, unless too long to keep */
        assert_int_equal(t.kept, kept + (lens[i] <= TOKHASH_TOKEN_MAX ? 1 : 0));
    }
    uint8_t h[32];
    assert_false(tokhash_sha256(&t, tok, 0, h));
    assert_false(tokhash_sha256(&t, NULL, 0, h));
    tokhash_close(&t);
}

/* A kept token answers only for the same bytes: not for a prefix, an extension or a token
 * that differs in its last byte. */
static void test_kept_tokens_match_only_themselves(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t a[32], b[32];
    memset(a, 'a', sizeof a);
    memcpy(b, a, sizeof b);
    b[31] = 'b';
    expectDigest(&t, a, sizeof a);
    uint64_t kept = t.kept;
    expectDigest(&t, b, sizeof b);
    expectDigest(&t, a, sizeof a - 1);
    assert_int_equal(t.kept, kept);
    expectDigest(&t, a, sizeof a);
    expectDigest(&t, b, sizeof b);
    expectDigest(&t, a, sizeof a - 1);
    assert_int_equal(t.kept, kept + 3);
    /* Kept tokens are compared zero-padded: a token that is another one and a zero byte
     * more is not that one. */
    static const uint8_t z4[4] = {'z', 'z', 'z', 'z'}, z5[5] = {'z', 'z', 'z', 'z', 0};
    expectDigest(&t, z4, sizeof z4);
    kept = t.kept;
    expectDigest(&t, z5, sizeof z5);
    assert_int_equal(t.kept, kept);
    expectDigest(&t, z4, sizeof z4);
    expectDigest(&t, z5, sizeof z5);
    assert_int_equal(t.kept, kept + 2);
    tokhash_close(&t);
}

/* More tokens than slots, in turn: each digest stays right; the oldest is digested again. */
static void test_more_tokens_than_slots(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t toks[TOKHASH_SLOTS + 1][16];
    for (size_t i = 0; i < TOKHASH_SLOTS + 1; i++) {
        memset(toks[i], (int)('A' + i), sizeof toks[i]);
    }
    for (int round = 0; round < 3; round++) {
        uint64_t kept = t.kept;
        for (size_t i = 0; i < TOKHASH_SLOTS + 1; i++) {
            expectDigest(&t, toks[i], sizeof toks[i]);
        }
        /* round robin over one slot fewer than tokens: each evicts the one it needs next */
        assert_int_equal(t.kept, kept);
    }
    uint64_t kept = t.kept;
    for (size_t i = 1; i < TOKHASH_SLOTS + 1; i++) {
        expectDigest(&t, toks[i], sizeof toks[i]); /* the last TOKHASH_SLOTS are kept */
    }
    assert_int_equal(t.kept, kept + TOKHASH_SLOTS);
    tokhash_close(&t);
}

/* The close wipes the kept tokens and digests. */
static void test_close_wipes(void **state)
{
    (void)state;
    struct tokhash t;
    assert_true(tokhash_init(&t));
    uint8_t tok[24];
    memset(tok, 0x5a, sizeof tok);
    expectDigest(&t, tok, sizeof tok);
    tokhash_close(&t);
    static const struct tokhash_slot zero;
    for (int i = 0; i < TOKHASH_SLOTS; i++) {
        assert_memory_equal(&t.slot[i], &zero, sizeof zero);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digests_are_sha256),
        cmocka_unit_test(test_kept_tokens_match_only_themselves),
        cmocka_unit_test(test_more_tokens_than_slots),
        cmocka_unit_test(test_close_wipes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
