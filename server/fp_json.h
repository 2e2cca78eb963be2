/* fp_json: the JSON side of request fingerprints (fingerprint.h, docs/contract.md): a JSON
 * body parsed, its fingerprint pointers (RFC 6901) applied, and written again as canonical
 * JSON, its numbers in the form RFC 8785 (JCS) gives them. fingerprint.c frames and hashes
 * what this writes; the fuzzer and the unit tests check the number form through
 * fp_json_real(). */
#ifndef IDEM_SERVER_FP_JSON_H
#define IDEM_SERVER_FP_JSON_H

#include <stddef.h>
#include <stdint.h>

/* Size of the buffer fp_json_real() writes: the longest form ("-0.0000001234567890123456"
 * has 26 bytes; "-1.2345678901234567e-308" 24) and a NUL, with room to spare. */
#define FP_JSON_REAL_SIZE 32

/* Writes the ECMAScript Number::toString form of d (RFC 8785 section 3.2.2.3) and a NUL into
 * out (OUT: FP_JSON_REAL_SIZE bytes): the fewest significant digits that read back (strtod)
 * as d, the closest to d when several do; plain digits when the decimal exponent of the
 * first significant digit is from -6 to 20 ("0.000001", "100000000000000000000"), else the
 * exponent form ("1e-7", "1.5e+21"); -0 as "0". Returns the length, or 0 (out "") when d is
 * not finite, which JSON cannot hold. */
size_t fp_json_real(double d, char out[FP_JSON_REAL_SIZE]);

/* The canonical form of the JSON text body[0..len) (docs/contract.md), with the pointer
 * lists applied (both already checked by the caller: fp_pointer_check()), into *out (a
 * malloc'd buffer, never empty, that the caller frees) and *out_len. FP_OK, FP_EINVAL_JSON,
 * FP_EJSON_TOO_MANY or FP_ENOMEM (fingerprint.h); on error *out is NULL. */
int fp_json_canonical(const uint8_t *body, size_t len, const char *const *fields, size_t n_fields,
                      const char *const *ignore, size_t n_ignore, char **out, size_t *out_len);

#endif /* IDEM_SERVER_FP_JSON_H */
