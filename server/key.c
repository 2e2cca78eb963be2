/* key: idempotency-key validation and fingerprint comparison (key.h). */
#include "key.h"

/* The bytes that may appear in an idempotency key, [A-Za-z0-9._:~-] (docs/contract.md), as a
 * 256-bit set: bit c of the set is 1 when byte c is allowed. */
static const uint64_t keyBytes[4] = {UINT64_C(0x07ff600000000000), UINT64_C(0x47fffffe87fffffe), UINT64_C(0x0000000000000000), UINT64_C(0x0000000000000000)};

static bool keyByteAllowed(uint8_t c)
{
    return (keyBytes[c >> 6] >> (c & 63)) & 1;
}

int key_validate(const uint8_t *key, size_t len, size_t max_len)
{
    if (key == NULL || len == 0) {
        return KEY_MISSING;
    }
    if (max_len == 0 || max_len > KEY_MAX_LEN) {
        max_len = KEY_MAX_LEN;
    }
    if (len > max_len) {
        return KEY_INVALID;
    }
    /* No early exit: the loop stays branch-free on the hot claim path. */
    bool ok = true;
    for (size_t i = 0; i < len; i++) {
        ok &= keyByteAllowed(key[i]);
    }
    return ok ? KEY_OK : KEY_INVALID;
}

bool fp_equal(const uint8_t a[FP_LEN], const uint8_t b[FP_LEN])
{
    /* Every byte compared, whatever the first difference; volatile keeps the compiler from
     * turning the loop into an early exit. */
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < FP_LEN; i++) {
        diff |= a[i] ^ b[i];
    }
    return diff == 0;
}
