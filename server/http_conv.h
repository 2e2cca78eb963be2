/* http_conv: the HTTP conventions the gateway and proxy mode share that need no h2o
 * (docs/http-api.md): RFC 8941 sf-strings in Idempotency-Key and Idempotency-Attempt, the
 * rule a refused key broke, RFC 9457 problem details for error answers, and fencing tokens
 * as decimal strings. Pure functions over borrowed bytes; what tests/unit/test_http_conv.c
 * and tests/fuzz/fuzz_http_conv drive. */
#ifndef IDEM_SERVER_HTTP_CONV_H
#define IDEM_SERVER_HTTP_CONV_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The prefix of every problem type URI: type is this followed by the error's code
 * (docs/http-api.md, Errors). An identifier: clients compare it, nobody fetches it. */
#define HTTP_PROBLEM_TYPE_BASE "urn:idemd:problem:"

/* The media type of every error answer. */
#define HTTP_PROBLEM_CTYPE "application/problem+json"

/* Results of http_sf_string(). */
enum http_sf_rc {
    HTTP_SF_OK = 0,
    HTTP_SF_NOT_STRING,   /* it does not begin with a DQUOTE (after spaces): not an sf-string */
    HTTP_SF_UNTERMINATED, /* no closing DQUOTE */
    HTTP_SF_BAD_ESCAPE,   /* a backslash not followed by DQUOTE or backslash */
    HTTP_SF_BAD_CHAR,     /* a byte outside %x20-7E */
    HTTP_SF_TRAILING,     /* something other than spaces after the closing DQUOTE (parameters
                           * included: none is accepted) */
};

/* A static description of an http_sf_rc, for a 400's detail. */
const char *http_sf_strerror(int rc);

/* Decodes the RFC 8941 sf-string at in[0..len) (section 4.2.5; leading and trailing spaces
 * skipped as a field value's are, section 4.2) into out, which has room for len bytes, with
 * its length in *out_len. HTTP_SF_OK, or why it is not a valid sf-string (HTTP_SF_NOT_STRING
 * when it does not begin with a DQUOTE; *out_len is then 0). in may hold any bytes, NUL
 * included; nothing past in[len) is read. */
int http_sf_string(const char *in, size_t len, char *out, size_t *out_len);

/* An Idempotency-Key or Idempotency-Attempt header value to the bytes it names: an sf-string
 * decoded (into out, room for len bytes), or else the value itself as it was sent. True with
 * *val (OUT) pointing at them; false with *why set (a static text) for a value that begins
 * like an sf-string and is not a valid one. */
bool http_header_item(const char *v, size_t len, char *out, const char **val, size_t *val_len,
                      const char **why);

/* The response header value of an item (an attempt id): the bytes themselves when they are
 * 1..len bytes of the key alphabet [A-Za-z0-9._:~-], else an sf-string (quoted, '"' and '\\'
 * escaped) when they are printable ASCII; into out (room for 2 * len + 3 bytes), its length
 * in *out_len. False (nothing to send) for an empty value or one with another byte. */
bool http_item_out(const char *v, size_t len, char *out, size_t *out_len);

/* Which rule of docs/contract.md key (len bytes, NULL when absent) breaks for a tenant whose
 * key_max_len is max_len (0: the contract's 255): into buf (n bytes, at least 96), e.g. "the
 * key is 300 bytes, over the limit of 255 bytes". Empty when the key passes. Never copies
 * the key's bytes (keys are secrets: an offset names the first byte outside the alphabet). */
void http_key_why(const uint8_t *key, size_t len, size_t max_len, char *buf, size_t n);

/* The RFC 9457 problem details of an error answer: type (HTTP_PROBLEM_TYPE_BASE + code),
 * title (fixed per code), status, detail (message, or the title when NULL), instance
 * ("urn:idemd:request:" + the request id, when it is 1..64 letters, digits, '-', '_' or '.':
 * never the path, which may hold the key), and the extension members code, message (= detail) and request_id. The path
 * arguments are unused (kept for the callers).
 * A new object (NULL only when out of memory). */
json_t *http_problem(int status, const char *code, const char *message, const char *rid,
                     size_t rid_len, const char *path, size_t path_len);

/* The fixed title of an error code (a short summary, the same for every answer with that
 * code); the status's reason phrase for an unknown code (reason may be NULL). */
const char *http_problem_title(const char *code, const char *reason);

/* A fencing token in a request: a JSON integer >= 0, or a string of 1-20 decimal digits
 * whose value fits in 64 bits. False for anything else. */
bool http_token_from_json(const json_t *v, uint64_t *out);

/* The decimal string of a token into buf (21 bytes), for the *_str members of answers. */
void http_token_str(uint64_t token, char buf[21]);

#endif
