/* key: the rules the state machine applies to idempotency keys and fingerprints
 * (docs/contract.md), in the deterministic core so that the service judges a request by the
 * same rule, once, before it proposes a command. */
#ifndef IDEM_SERVER_KEY_H
#define IDEM_SERVER_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Size of a fingerprint in bytes (a SHA-256 digest, fingerprint.h). */
#define FP_LEN 32

/* The longest idempotency key the contract allows, in bytes (docs/contract.md). */
#define KEY_MAX_LEN 255

/* Results of key_validate(), mapped by the caller to 400 idempotency_key_missing and
 * idempotency_key_invalid (docs/contract.md). */
enum key_rc {
    KEY_OK = 0,
    KEY_MISSING,
    KEY_INVALID,
};

/* Checks an idempotency key against docs/contract.md: 1 to max_len bytes, each one of
 * [A-Za-z0-9._:~-]. max_len is the tenant's limit; 0 means KEY_MAX_LEN, and larger values
 * are clamped to KEY_MAX_LEN.
 * key is borrowed for the duration of the call and may be NULL (the header was absent).
 * Returns KEY_OK; KEY_MISSING when key is NULL or len is 0; KEY_INVALID when len exceeds the
 * limit or a byte is outside the allowed set. */
int key_validate(const uint8_t *key, size_t len, size_t max_len);

/* Compares two fingerprints in constant time (the time does not depend on where they differ).
 * Both are borrowed for the duration of the call. */
bool fp_equal(const uint8_t a[FP_LEN], const uint8_t b[FP_LEN]);

#endif /* IDEM_SERVER_KEY_H */
