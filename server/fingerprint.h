/* Request fingerprints and key digests for logs (docs/contract.md). The key rule and the
 * fingerprint comparison the state machine applies are in key.h, included here. */
#ifndef IDEM_SERVER_FINGERPRINT_H
#define IDEM_SERVER_FINGERPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "key.h"

/* Size of a fingerprint in bytes (a SHA-256 digest). */
#define FP_LEN 32

/* Size of the buffer fp_hex12() and key_digest() write: 12 hex digits and a NUL. */
#define FP_HEX12_SIZE 13

/* Return codes of the fp_ functions. Positive, so that 0 means success, as in raft. The
 * X-macro keeps each code next to its message for fp_strerror(). */
/* The most values (scalars, arrays, objects and members' names counted as a parser meets
 * them, roughly) a JSON body may have to be fingerprinted: far beyond a request's, and a
 * bound on the work an unauthenticated proxy caller can ask for. */
#define FP_JSON_MAX_VALUES 16384

#define FP_ERRORS(X)                                                                        \
    X(FP_EINVAL_JSON, "request body is not valid JSON")                                     \
    X(FP_EJSON_TOO_MANY, "the JSON body has more values than are fingerprinted (16384)")     \
    X(FP_ETOO_LARGE, "a fingerprint field is longer than 2^32-1 bytes")                     \
    X(FP_ENOMEM, "out of memory")                                                           \
    X(FP_EINVAL, "invalid argument")                                                        \
    X(FP_ECRYPTO, "the SHA-256 digest failed in OpenSSL")

enum fp_rc {
    FP_OK = 0,
#define FP_ERRORS_ENUM(code, msg) code,
    FP_ERRORS(FP_ERRORS_ENUM)
#undef FP_ERRORS_ENUM
};

/* Returns a static, NUL-terminated description of an fp_rc code; the caller must not free it.
 * Unknown codes give "unknown fingerprint error". */
const char *fp_strerror(int rc);

/* One request header that a route adds to the fingerprint.
 * name is a NUL-terminated header name (ASCII; hashed lower-cased); value is value_len raw
 * bytes and may be NULL only when value_len is 0. Both are borrowed by the caller's struct. */
struct fp_header {
    const char *name;
    const uint8_t *value;
    size_t value_len;
};

/* Everything that identifies a request, for fp_compute(). Every pointer is borrowed for the
 * duration of the call only; nothing is retained.
 * - method, path and tenant are NUL-terminated and must not be NULL; path may carry a
 *   "?query".
 * - content_type may be NULL (no Content-Type: the body is hashed raw).
 * - body may be NULL only when body_len is 0.
 * - headers may be NULL only when n_headers is 0; these are the route's named headers. */
struct fp_input {
    const char *method;
    const char *path;
    const char *tenant;
    const char *content_type;
    const uint8_t *body;
    size_t body_len;
    const struct fp_header *headers;
    size_t n_headers;
};

/* Computes the request fingerprint (docs/contract.md) into out (OUT: FP_LEN bytes).
 * The function borrows in, everything it points to, and out; it retains nothing.
 *
 * The fingerprint is SHA-256 over these fields in this order. Each variable-length field is
 * framed as a 4-byte big-endian length followed by its bytes, so that no two different
 * inputs can produce the same byte string by shifting bytes from one field to the next:
 *   1. the domain tag "idem-fp-v1";
 *   2. the method, ASCII upper-cased;
 *   3. the path with its query parameters sorted: the path is split at the first '?', the
 *      query is split at '&', the parameters are sorted bytewise as whole "k=v" strings and
 *      joined again with '&'. No query or an empty one ("/a?") gives the path alone. Nothing
 *      is percent-decoded, and empty parameters ("a=1&&b=2") are kept as they are;
 *   4. the tenant;
 *   5. the body: canonical JSON when the media type of content_type is application/json or
 *      ends in "+json" (compared case-insensitively, parameters such as "; charset=utf-8"
 *      ignored), the raw bytes otherwise. An empty body is the empty string either way;
 *   6. the number of headers as a bare 4-byte big-endian count, then for each header, sorted
 *      by lower-cased name and then by value, the lower-cased name and the value as two
 *      framed fields.
 * The content type itself is not hashed; a route that wants it adds it as a named header.
 *
 * Canonical JSON is jansson's re-encoding of the parsed body: duplicate keys are rejected,
 * top-level scalars and "\u0000" inside strings are accepted, the output is compact with
 * keys sorted bytewise, and non-ASCII text is written as UTF-8. Known limitations, from
 * jansson: integers outside the range of long long are rejected as invalid JSON, reals are
 * normalised through a double (so 1.10 and 1.1 match, and 1 and 1.0 do not), and some
 * allocation failures inside jansson's lexer are reported as FP_EINVAL_JSON, not FP_ENOMEM.
 *
 * A JSON body of more than FP_JSON_MAX_VALUES values is refused before it is parsed (a
 * count of its separators, outside strings): the parse and re-encoding cost grows with the
 * values, and proxy callers need no token to send a body.
 *
 * Returns FP_OK; FP_EINVAL_JSON when the body should be JSON and is not (the caller answers
 * 400); FP_EJSON_TOO_MANY past FP_JSON_MAX_VALUES (413); FP_EINVAL for a NULL where one is not allowed; FP_ETOO_LARGE when a field or the
 * header count does not fit in 32 bits; FP_ENOMEM; or FP_ECRYPTO. On error out is left
 * unspecified. */
int fp_compute(const struct fp_input *in, uint8_t out[FP_LEN]);

/* Writes the first 12 lower-case hex digits of a fingerprint and a NUL into out (OUT:
 * FP_HEX12_SIZE bytes), which is what logs carry (docs/contract.md).
 * fp and out are borrowed for the duration of the call. */
void fp_hex12(const uint8_t fp[FP_LEN], char out[FP_HEX12_SIZE]);

/* Keys key_digest with a secret every member holds (the daemon passes raft.secret_file's,
 * else rpc.cluster_secret_file's): the digest becomes HMAC-SHA256 under
 * HMAC-SHA256(secret, "idemd key_digest v1"), which nobody without the secret can reverse by
 * trying likely keys. NULL or len 0: plain SHA-256 again. Call it before any thread uses
 * key_digest. Returns FP_OK or FP_ECRYPTO (then unkeyed). */
int key_digest_set_secret(const uint8_t *secret, size_t len);

/* Writes key_digest, the first 12 lower-case hex digits of the HMAC (key_digest_set_secret) or
 * else the SHA-256 over the framed tenant and key (4-byte big-endian length, then the bytes,
 * for each; no domain tag), and a NUL into out (OUT: FP_HEX12_SIZE bytes). Logs carry this
 * instead of the key, which is a secret (docs/contract.md).
 * tenant is a NUL-terminated string and must not be NULL; key may be NULL only when key_len
 * is 0; tenant, key and out are borrowed for the duration of the call.
 * Returns FP_OK, FP_EINVAL, FP_ETOO_LARGE, FP_ENOMEM or FP_ECRYPTO; on error out is the empty
 * string, so that a log line that ignores the result still has a valid string. */
int key_digest(const char *tenant, const uint8_t *key, size_t key_len,
               char out[FP_HEX12_SIZE]);

#endif /* IDEM_SERVER_FINGERPRINT_H */
