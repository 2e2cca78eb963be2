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

#define FP_ERRORS(X)                                                                               \
    X(FP_EINVAL_JSON, "request body is not valid JSON")                                            \
    X(FP_EJSON_TOO_MANY, "the JSON body has more values than are fingerprinted (16384)")           \
    X(FP_ETOO_LARGE, "a fingerprint field is longer than 2^32-1 bytes")                            \
    X(FP_ENOMEM, "out of memory")                                                                  \
    X(FP_EINVAL, "invalid argument")                                                               \
    X(FP_ECRYPTO, "the SHA-256 digest failed in OpenSSL")                                          \
    X(FP_EPOINTER, "invalid fingerprint_fields or fingerprint_ignore (at most 32 JSON pointers)")

enum fp_rc {
    FP_OK = 0,
#define FP_ERRORS_ENUM(code, msg) code,
    FP_ERRORS(FP_ERRORS_ENUM)
#undef FP_ERRORS_ENUM
};

/* Returns a static, NUL-terminated description of an fp_rc code; the caller must not free it.
 * Unknown codes give "unknown fingerprint error". */
const char *fp_strerror(int rc);

/* The most JSON Pointers each of fp_input's two lists (fields, ignore) may hold, and the most
 * bytes one pointer may have (docs/contract.md). */
#define FP_POINTERS_MAX 32
#define FP_POINTER_MAX_LEN 256

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
 * - headers may be NULL only when n_headers is 0; these are the route's named headers.
 * - fields and ignore are lists of RFC 6901 JSON Pointers (NUL-terminated, each valid for
 *   fp_pointer_check(), at most FP_POINTERS_MAX of them); either may be NULL only when its
 *   count is 0. They apply to a JSON body only (see fp_compute()); a list is a set: the
 *   order and repetitions of its pointers do not change the fingerprint. */
struct fp_input {
    const char *method;
    const char *path;
    const char *tenant;
    const char *content_type;
    const uint8_t *body;
    size_t body_len;
    const struct fp_header *headers;
    size_t n_headers;
    const char *const *fields; /* fingerprint_fields: only these values are hashed */
    size_t n_fields;
    const char *const *ignore; /* fingerprint_ignore: removed before hashing */
    size_t n_ignore;
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
 * Canonical JSON is the body parsed by jansson (duplicate keys rejected, top-level scalars
 * and "\u0000" inside strings accepted) and written again by fp_json.c: compact, object keys
 * sorted bytewise (UTF-8, not RFC 8785's UTF-16 order), strings as jansson's encoder writes
 * them (non-ASCII as UTF-8, control characters as \uXXXX in upper-case hex), and numbers as
 * RFC 8785 (JCS) writes them: the ECMAScript form of the double (shortest digits that
 * round-trip; exponent form, "1e+30", "1e-7", when the decimal exponent is >= 21 or <= -7;
 * -0 as 0), so that 10, 10.0, 1e1 and 1.0E+1 hash alike. One deliberate deviation: an
 * integer literal (no fraction, no exponent) is written by its exact decimal digits, which
 * for |n| <= 2^53 is the JCS form and above it keeps two different large ids apart where a
 * double would merge them. Limitations, from jansson: an integer literal outside the range
 * of long long is rejected as invalid JSON, as is a number that overflows a double (1e400);
 * and some allocation failures inside jansson's lexer are reported as FP_EINVAL_JSON.
 *
 * JSON Pointers (RFC 6901), for a JSON body only: the ignore list is applied first, to the
 * parsed body: a pointer that names an object member removes it; one whose last step is an
 * array index replaces that element with null (the other indices stay as they are); one
 * that names nothing (absent member, index past the end, "-", a step through a scalar)
 * changes nothing. Then, when the fields list is not empty, the body hashed is the object
 * that maps each listed pointer (as written, escapes included) that names a value to that
 * value, written canonically; pointers that name nothing are left out, so an absent member
 * and a null one differ. The empty pointer "" names the whole body in fields and is refused
 * in ignore. A body that is not JSON (by content_type), or an empty one, is hashed as
 * before whatever the lists say; the lists are still checked.
 *
 * A JSON body of more than FP_JSON_MAX_VALUES values is refused before it is parsed (a
 * count of its separators, outside strings): the parse and re-encoding cost grows with the
 * values, and proxy callers need no token to send a body.
 *
 * Returns FP_OK; FP_EINVAL_JSON when the body should be JSON and is not (the caller answers
 * 400); FP_EJSON_TOO_MANY past FP_JSON_MAX_VALUES (413); FP_EINVAL for a NULL where one is
 * not allowed; FP_EPOINTER when a pointer list is longer than FP_POINTERS_MAX or holds a
 * pointer fp_pointer_check() refuses; FP_ETOO_LARGE when a field or the header count does
 * not fit in 32 bits; FP_ENOMEM; or FP_ECRYPTO. On error out is left unspecified. */
int fp_compute(const struct fp_input *in, uint8_t out[FP_LEN]);

/* What fp_compute() hashes as the body (field 5) of in, into *out (a malloc'd buffer the
 * caller frees; NULL when *out_len is 0): the canonical JSON of a non-empty JSON body, with
 * in's pointer lists applied, or else a copy of the raw body. Only in's content_type, body,
 * body_len, fields and ignore are read. Returns what fp_compute() would (FP_OK,
 * FP_EINVAL_JSON, FP_EJSON_TOO_MANY, FP_EINVAL, FP_EPOINTER, FP_ENOMEM); *out is NULL on
 * error. For tests, fuzzers and tools that show what is hashed. */
int fp_canonical_body(const struct fp_input *in, uint8_t **out, size_t *out_len);

/* Returns NULL when the len bytes at ptr are a JSON Pointer an fp_input list may hold, else a
 * static text naming the rule they break (never quoting them): RFC 6901 syntax (empty, or
 * '/' then reference tokens in which '~' is followed by '0' or '1'), at most
 * FP_POINTER_MAX_LEN bytes, UTF-8 text without NUL; and, for the ignore list
 * (ignore true), not the empty pointer, which would remove the whole body. */
const char *fp_pointer_check(const char *ptr, size_t len, bool ignore);

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
