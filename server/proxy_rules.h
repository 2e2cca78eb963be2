/* proxy_rules: proxy mode's pure request rules, with no I/O (tests/unit/test_proxy_rules.c):
 * the request path's normalisation and refusals, a route prefix's match at a '/' boundary,
 * and the caller namespace (the caller-identity digest and the key a caller's record is kept
 * under). docs/configuration.md, `proxy`, describes them for operators. */
#ifndef IDEM_SERVER_PROXY_RULES_H
#define IDEM_SERVER_PROXY_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Results of proxy_path_normalise(). */
enum proxy_path_rc {
    PROXY_PATH_OK = 0,
    PROXY_PATH_NOT_ORIGIN,    /* does not start with '/' (absolute-form, '*', empty) */
    PROXY_PATH_BAD_PERCENT,   /* '%' not followed by two hex digits, or %00 */
    PROXY_PATH_ENCODED_SLASH, /* %2F */
    PROXY_PATH_BACKSLASH,     /* '\' or %5C */
    PROXY_PATH_DOT_SEGMENT,   /* a "." or ".." segment, also as %2E, also before a ';' */
    PROXY_PATH_EMPTY_SEGMENT, /* "//" inside the path */
    PROXY_PATH_BAD_BYTE,      /* a control byte, space, '#', DEL or a byte >= 0x80 */
};

/* A short description of a proxy_path_rc for an error message (static). */
const char *proxy_path_strerror(int rc);

/* Normalises a request target "PATH[?QUERY]" (len bytes of in, not NUL-terminated) as
 * RFC 3986 6.2.2 does, and refuses what an upstream could read as another path:
 * - the path must start with '/'; the query (from the first '?') is copied unchanged;
 * - a percent-encoded unreserved byte (ALPHA DIGIT - . _ ~) is decoded, any other stays
 *   encoded with its hex digits upper-cased;
 * - refused: malformed percent-encoding and %00, an encoded '/' (%2F), a '\' raw or encoded,
 *   a "." or ".." segment (after decoding; also when a ';' parameter follows it, as some
 *   servers drop it), an empty segment other than a trailing one ("/a//b"), and bytes that
 *   are not allowed raw in a path (controls, space, '#', DEL, bytes >= 0x80).
 * out gets the normalised target (room for len + 1 bytes; it is never longer than in) and a
 * NUL; *out_len its length, *path_len the length of its path part (before '?'). Returns
 * PROXY_PATH_OK or why the target is refused (out is then undefined). */
int proxy_path_normalise(const char *in, size_t len, char *out, size_t *out_len, size_t *path_len);

/* Whether a normalised path (path_len bytes, no query) is under a route's prefix: equal to
 * it, or starting with it and then '/' (a prefix ending in '/' matches whatever follows it).
 * "/api/pay" matches "/api/pay", "/api/pay/" and "/api/pay/x", not "/api/payroll". */
bool proxy_path_under(const char *path, size_t path_len, const char *prefix);

/* Whether name (nl bytes, compared case-insensitively) is one of the tokens of a Connection
 * header's value (len bytes: tokens separated by commas and blanks). A header it names is
 * hop-by-hop (RFC 9110 7.6.1): proxy mode forwards it neither way. */
bool proxy_connection_names(const char *value, size_t len, const char *name, size_t nl);

/* Size of a caller-identity digest (SHA-256). */
#define PROXY_CALLER_LEN 32

/* Length of the key a namespaced caller's record is kept under: '~' and 42 base64url
 * characters (252 bits), within key.h's rules for every tenant whose key_max_len allows it.
 * That form is reserved: a request whose record would be kept under its bare key (no
 * identity header, or caller_identity: none) may not send a key of it (proxy_key_reserved),
 * so no caller can name another's record. */
#define PROXY_NS_KEY_LEN 43

/* One value of a caller-identity header: the index of its name in the route's list, and its
 * bytes (borrowed). */
struct proxy_caller_value {
    size_t header;
    const uint8_t *value;
    size_t len;
};

/* The caller-identity digest: SHA-256 over a length-prefixed canonical form of the route's
 * identity header names (lower case, in the route's order) and, under each, the count of its
 * values and each value in the request's order (every length a 4-byte big-endian prefix),
 * after the domain tag "idemd-proxy-caller-v1". vals[i].header < n_names. False when the
 * digest fails (OpenSSL). */
bool proxy_caller_digest(const char *const *names, size_t n_names,
                         const struct proxy_caller_value *vals, size_t n_vals,
                         uint8_t out[PROXY_CALLER_LEN]);

/* The key a caller's record is kept under: '~' and the first 42 characters of the
 * base64url form of SHA-256 over the tag "idemd-proxy-key-v1", the caller digest and the
 * caller's key (each length-prefixed), into out (PROXY_NS_KEY_LEN characters and a NUL).
 * False when the digest fails. */
bool proxy_ns_key(const uint8_t caller[PROXY_CALLER_LEN], const uint8_t *key, size_t key_len,
                  char out[PROXY_NS_KEY_LEN + 1]);

/* Whether a key (len bytes) has the reserved form of proxy_ns_key's keys. */
bool proxy_key_reserved(const uint8_t *key, size_t len);

#endif
