/* fuzz_http_conv: server/http_conv.h on untrusted header values and body bytes: an
 * Idempotency-Key or Idempotency-Attempt value read as an RFC 8941 sf-string
 * (http_sf_string, http_header_item), written back (http_item_out), a key judged
 * (http_key_why), a token in a string (http_token_from_json) and an error's problem details
 * (http_problem) with the input as its message and path.
 *
 * Input: the bytes of one header value (also the message, the path and a token's string).
 *
 * Invariants (abort() on violation):
 * - http_sf_string reads nothing past the input and writes at most len bytes (ASan: exact
 *   buffers); a valid sf-string decodes to printable ASCII only, never longer than the
 *   input; HTTP_SF_NOT_STRING exactly when the input, after spaces, does not begin with '"';
 * - http_header_item agrees with it (the bare value is the input itself);
 * - a decoded non-empty value written with http_item_out parses back to the same bytes
 *   (bare or as an sf-string);
 * - http_key_why is empty exactly when key_validate accepts the key, and never longer than
 *   its buffer;
 * - http_token_from_json of the input as a JSON string agrees with a reference decimal parse;
 * - http_problem gives an object whose type ends with the code, whose status is the one
 *   given, whose instance (when there is one) is printable ASCII without a '?'. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_conv.h"
#include "key.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_http_conv: invariant violated: %s\n", what);
    abort();
}

static void checkSf(const char *in, size_t len)
{
    char *out = malloc(len ? len : 1);
    if (out == NULL) {
        abort();
    }
    size_t n = 12345;
    int rc = http_sf_string(in, len, out, &n);
    size_t sp = 0;
    while (sp < len && in[sp] == ' ') {
        sp++;
    }
    bool quoted = sp < len && in[sp] == '"';
    if ((rc == HTTP_SF_NOT_STRING) == quoted) {
        fail("HTTP_SF_NOT_STRING does not say whether the value begins with a quote");
    }
    if (rc != HTTP_SF_OK && n != 0) {
        fail("a refused sf-string left a length");
    }
    if (rc == HTTP_SF_OK) {
        if (n > len) {
            fail("a decoded sf-string is longer than its input");
        }
        for (size_t i = 0; i < n; i++) {
            if (out[i] < 0x20 || out[i] > 0x7e) {
                fail("a decoded sf-string holds a byte outside printable ASCII");
            }
        }
        if (n > 0) {
            char *enc = malloc(2 * n + 3), *back = malloc(2 * n + 3);
            size_t en = 0, bn = 0;
            if (enc == NULL || back == NULL) {
                abort();
            }
            if (!http_item_out(out, n, enc, &en) || en > 2 * n + 2) {
                fail("a decoded sf-string cannot be written back");
            }
            const char *v, *why;
            if (!http_header_item(enc, en, back, &v, &bn, &why) || bn != n ||
                memcmp(v, out, n) != 0) {
                fail("a value written back does not read as the same bytes");
            }
            free(enc);
            free(back);
        }
    }
    char *item = malloc(len ? len : 1);
    const char *v, *why;
    size_t vn;
    bool ok = http_header_item(in, len, item, &v, &vn, &why);
    if (ok != (rc == HTTP_SF_OK || rc == HTTP_SF_NOT_STRING) || ok == (why != NULL)) {
        fail("http_header_item disagrees with http_sf_string");
    }
    if (rc == HTTP_SF_NOT_STRING && (v != in || vn != len)) {
        fail("a bare value is not the value itself");
    }
    if (rc == HTTP_SF_OK && (vn != n || memcmp(v, out, n) != 0)) {
        fail("http_header_item decodes otherwise than http_sf_string");
    }
    free(item);
    free(out);
}

/* The reference: 1-20 decimal digits whose value fits in 64 bits. */
static bool refToken(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20) {
        return false;
    }
    unsigned __int128 x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
        x = x * 10 + (unsigned)(s[i] - '0');
    }
    if (x > UINT64_MAX) {
        return false;
    }
    *out = (uint64_t)x;
    return true;
}

static void checkToken(const char *in, size_t len)
{
    json_t *s = json_stringn(in, len); /* NULL unless UTF-8 */
    if (s == NULL) {
        return;
    }
    uint64_t a = 0, b = 0;
    bool ok = http_token_from_json(s, &a), ref = refToken(in, len, &b);
    if (ok != ref || (ok && a != b)) {
        fail("a token in a string is not read as its decimal digits");
    }
    json_decref(s);
}

static void checkProblem(const char *in, size_t len)
{
    char *msg = malloc(len + 1);
    if (msg == NULL) {
        abort();
    }
    memcpy(msg, in, len);
    msg[len] = '\0';
    json_t *o = http_problem(len % 2 ? 409 : 503, "idempotency_key_reused", msg, in,
                             len < 64 ? len : 64, in, len);
    if (o == NULL) {
        fail("no problem details");
    }
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type == NULL || strcmp(type, HTTP_PROBLEM_TYPE_BASE "idempotency_key_reused") != 0) {
        fail("the problem's type is not the code's");
    }
    if (json_integer_value(json_object_get(o, "status")) != (len % 2 ? 409 : 503)) {
        fail("the problem's status is not the one given");
    }
    if (json_string_value(json_object_get(o, "detail")) == NULL) {
        fail("a problem without a detail");
    }
    const char *inst = json_string_value(json_object_get(o, "instance"));
    if (inst != NULL && strncmp(inst, "urn:idemd:request:", 18) != 0) {
        fail("a problem's instance is not a request's URN");
    }
    for (const char *p = inst; p != NULL && *p != '\0'; p++) {
        if (*p <= 0x20 || *p >= 0x7f || *p == '?' || *p == '/') {
            fail("a problem's instance holds a byte outside visible ASCII, a '/' or a query");
        }
    }
    char *text = json_dumps(o, JSON_COMPACT);
    free(text);
    json_decref(o);
    free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy without a NUL: ASan sees any read past the value. */
    char *in = malloc(size ? size : 1);
    if (in == NULL) {
        abort();
    }
    memcpy(in, data, size);
    checkSf(in, size);
    char why[112];
    http_key_why((const uint8_t *)in, size, size % 300, why, sizeof why);
    size_t max = size % 300 == 0 ? KEY_MAX_LEN : size % 300;
    if ((why[0] == '\0') != (key_validate((const uint8_t *)in, size, max) == KEY_OK)) {
        fail("http_key_why disagrees with key_validate");
    }
    checkToken(in, size);
    checkProblem(in, size);
    free(in);
    return 0;
}
