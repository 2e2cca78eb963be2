/* fuzz_fingerprint: fp_compute() on an untrusted request (the HTTP JSON body above all), and
 * key_validate() / key_digest() on an untrusted idempotency key.
 *
 * Input, HTTP-like: the method, the path (with its query), the tenant, each ending at a
 * '\n'; then up to 8 header lines "name:value" ending at an empty line; the rest is the
 * body. Missing parts are empty. The path line is also the idempotency key.
 *
 * Invariants (abort() on violation), from the contract in server/fingerprint.h:
 * - with text/plain (and with no content type, the same) the result is FP_OK;
 * - every content type that names JSON ("application/json", "Application/JSON; charset=utf-8",
 *   "application/problem+json") gives the same result as application/json;
 * - an empty body gives the same fingerprint with JSON and text/plain;
 * - a JSON body that fingerprints is equivalent to its canonical form (jansson, same flags)
 *   sent as JSON or as text/plain;
 * - the method's ASCII case, the order of the query parameters, and the order and name case
 *   of the headers do not change the fingerprint; the same input gives the same fingerprint;
 * - key_validate() agrees with a reference of docs/contract.md, and key_digest() succeeds. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_HEADERS 8
#define JSON "application/json"
#define TEXT "text/plain"

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_fingerprint: invariant violated: %s\n", what);
    abort();
}

/* A NUL-terminated copy of the next line (up to '\n' or the end); advances *pos past it. */
static char *nextLine(const uint8_t *data, size_t size, size_t *pos)
{
    size_t start = *pos;
    size_t end = start;
    while (end < size && data[end] != '\n') {
        end++;
    }
    char *s = malloc(end - start + 1);
    if (s == NULL) {
        abort();
    }
    memcpy(s, data + start, end - start);
    s[end - start] = '\0';
    *pos = end < size ? end + 1 : end;
    return s;
}

static int compute(const struct fp_input *in, const char *ct, uint8_t out[FP_LEN])
{
    struct fp_input x = *in;
    x.content_type = ct;
    return fp_compute(&x, out);
}

/* Computes with content type ct and checks that it agrees with (rc, fp). */
static void same(const struct fp_input *in, const char *ct, int rc, const uint8_t fp[FP_LEN],
                 const char *what)
{
    uint8_t other[FP_LEN];
    int orc = compute(in, ct, other);
    if (orc != rc || (rc == FP_OK && memcmp(fp, other, FP_LEN) != 0)) {
        fprintf(stderr, "content type \"%s\": rc %d vs %d\n", ct ? ct : "(null)", orc, rc);
        fail(what);
    }
}

/* The path with the parameters of its query ('&'-separated, empty ones kept) in reverse
 * order; the same length as the path. */
static char *reverseQuery(const char *path)
{
    size_t len = strlen(path);
    char *out = malloc(len + 1);
    if (out == NULL) {
        abort();
    }
    const char *q = strchr(path, '?');
    if (q == NULL) {
        memcpy(out, path, len + 1);
        return out;
    }
    size_t head = (size_t)(q - path) + 1;
    memcpy(out, path, head);
    size_t w = head;
    const char *end = path + len; /* one past the current last parameter */
    for (;;) {
        const char *start = end;
        while (start > q + 1 && start[-1] != '&') {
            start--;
        }
        memcpy(out + w, start, (size_t)(end - start));
        w += (size_t)(end - start);
        if (start == q + 1) {
            break;
        }
        out[w++] = '&';
        end = start - 1;
    }
    out[w] = '\0';
    if (w != len) {
        fail("test bug: reversed query has a different length");
    }
    return out;
}

static char flipCase(char c)
{
    if (c >= 'a' && c <= 'z') {
        return (char)(c - 'a' + 'A');
    }
    if (c >= 'A' && c <= 'Z') {
        return (char)(c - 'A' + 'a');
    }
    return c;
}

static bool keyByteRef(uint8_t c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '~' || c == '-';
}

static void checkKey(const uint8_t *key, size_t len)
{
    size_t limits[] = {0, 1, 16, KEY_MAX_LEN, 1000};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        size_t max = limits[i] == 0 || limits[i] > KEY_MAX_LEN ? KEY_MAX_LEN : limits[i];
        int want = KEY_OK;
        if (len == 0) {
            want = KEY_MISSING;
        } else if (len > max) {
            want = KEY_INVALID;
        } else {
            for (size_t j = 0; j < len; j++) {
                if (!keyByteRef(key[j])) {
                    want = KEY_INVALID;
                    break;
                }
            }
        }
        if (key_validate(len ? key : NULL, len, limits[i]) != want) {
            fail("key_validate disagrees with docs/contract.md");
        }
    }
    char digest[FP_HEX12_SIZE];
    if (key_digest("tenant", key, len, digest) != FP_OK || strlen(digest) != 12) {
        fail("key_digest failed on a key");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;
    char *method = nextLine(data, size, &pos);
    char *path = nextLine(data, size, &pos);
    char *tenant = nextLine(data, size, &pos);
    char *names[MAX_HEADERS];
    struct fp_header headers[MAX_HEADERS];
    size_t n_headers = 0;
    while (pos < size && n_headers < MAX_HEADERS) {
        char *line = nextLine(data, size, &pos);
        if (line[0] == '\0') {
            free(line);
            break;
        }
        char *colon = strchr(line, ':');
        const char *value = "";
        if (colon != NULL) {
            *colon = '\0';
            value = colon + 1;
        }
        names[n_headers] = line;
        headers[n_headers].name = line;
        headers[n_headers].value = (const uint8_t *)value;
        headers[n_headers].value_len = strlen(value);
        n_headers++;
    }
    size_t body_len = size - pos;
    uint8_t *body = malloc(body_len ? body_len : 1);
    if (body == NULL) {
        abort();
    }
    memcpy(body, data + pos, body_len);

    struct fp_input in = {
        .method = method,
        .path = path,
        .tenant = tenant,
        .content_type = NULL,
        .body = body_len ? body : NULL,
        .body_len = body_len,
        .headers = n_headers ? headers : NULL,
        .n_headers = n_headers,
    };

    uint8_t text_fp[FP_LEN];
    int text_rc = compute(&in, TEXT, text_fp);
    if (text_rc != FP_OK) {
        fail("a text/plain request does not fingerprint");
    }
    same(&in, TEXT, FP_OK, text_fp, "fingerprint is not deterministic");
    same(&in, NULL, FP_OK, text_fp, "no content type differs from text/plain");

    uint8_t json_fp[FP_LEN];
    int json_rc = compute(&in, JSON, json_fp);
    if (json_rc != FP_OK && json_rc != FP_EINVAL_JSON && json_rc != FP_EJSON_TOO_MANY) {
        fprintf(stderr, "rc %d: %s\n", json_rc, fp_strerror(json_rc));
        fail("a JSON request fails with neither success nor invalid JSON nor too many values");
    }
    same(&in, "Application/JSON; charset=utf-8", json_rc, json_fp,
         "JSON content type with parameters differs from application/json");
    same(&in, " application/problem+json\t", json_rc, json_fp,
         "+json content type differs from application/json");
    if (body_len == 0) {
        same(&in, TEXT, json_rc, json_fp, "an empty body differs between JSON and text");
    }

    if (json_rc == FP_OK && body_len > 0) {
        const size_t flags = JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY;
        json_error_t err;
        json_t *doc = json_loadb((const char *)body, body_len,
                                 JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                 &err);
        if (doc == NULL) {
            fail("fp_compute accepted a body that jansson refuses");
        }
        size_t canon_len = json_dumpb(doc, NULL, 0, flags);
        uint8_t *cbuf = malloc(canon_len ? canon_len : 1);
        if (canon_len == 0 || cbuf == NULL ||
            json_dumpb(doc, (char *)cbuf, canon_len, flags) != canon_len) {
            abort();
        }
        json_decref(doc);
        struct fp_input c = in;
        c.body = cbuf;
        c.body_len = canon_len;
        same(&c, TEXT, FP_OK, json_fp, "a JSON body does not hash as its canonical form");
        same(&c, JSON, FP_OK, json_fp, "canonical JSON is not a fixed point");
        free(cbuf);
    }

    /* Method case, query order, header order and header name case. */
    {
        struct fp_input v = in;
        char *m = strdup(method);
        char *p = reverseQuery(path);
        char *hn[MAX_HEADERS];
        struct fp_header hr[MAX_HEADERS];
        if (m == NULL) {
            abort();
        }
        for (size_t i = 0; m[i] != '\0'; i++) {
            m[i] = flipCase(m[i]);
        }
        for (size_t i = 0; i < n_headers; i++) {
            hn[i] = strdup(names[n_headers - 1 - i]);
            if (hn[i] == NULL) {
                abort();
            }
            for (size_t j = 0; hn[i][j] != '\0'; j++) {
                hn[i][j] = flipCase(hn[i][j]);
            }
            hr[i] = headers[n_headers - 1 - i];
            hr[i].name = hn[i];
        }
        v.method = m;
        v.path = p;
        v.headers = n_headers ? hr : NULL;
        same(&v, TEXT, FP_OK, text_fp,
             "method case, query order or header order changed the fingerprint");
        same(&v, JSON, json_rc, json_fp,
             "method case, query order or header order changed the JSON fingerprint");
        for (size_t i = 0; i < n_headers; i++) {
            free(hn[i]);
        }
        free(p);
        free(m);
    }

    checkKey((const uint8_t *)path, strlen(path));

    for (size_t i = 0; i < n_headers; i++) {
        free(names[i]);
    }
    free(body);
    free(tenant);
    free(path);
    free(method);
    return 0;
}
