/* fuzz_fingerprint: fp_compute() on an untrusted request (the HTTP JSON body above all), and
 * key_validate() / key_digest() on an untrusted idempotency key.
 *
 * Input, HTTP-like: the method, the path (with its query), the tenant, each ending at a
 * '\n'; then up to 8 header lines "name:value" ending at an empty line, among which up to
 * 40 lines "@f:PTR" and "@i:PTR" are JSON Pointers of the fingerprint_fields and
 * fingerprint_ignore lists instead; the rest is the body. Missing parts are empty. The path
 * line is also the idempotency key.
 *
 * Invariants (abort() on violation), from the contract in server/fingerprint.h:
 * - with text/plain (and with no content type, the same) the result is FP_OK;
 * - every content type that names JSON ("application/json", "Application/JSON; charset=utf-8",
 *   "application/problem+json") gives the same result as application/json;
 * - an empty body gives the same fingerprint with JSON and text/plain;
 * - a JSON body that fingerprints is equivalent to its canonical form (fp_canonical_body)
 *   sent as text/plain, with and without the pointer lists; the canonical form re-parses and
 *   re-canonicalises to itself (but where it writes a real of 2^63 or more by its digits,
 *   which jansson refuses as an integer: then the refusal is that one); every real number of
 *   the body is written as RFC 8785 says (fp_json_real): it reads back (strtod) as the same
 *   double, in the ECMAScript form (no '+' but in an exponent, the exponent form exactly
 *   when the decimal exponent is >= 21 or <= -7, no trailing zeros, at most 17 digits);
 * - the pointer lists: refused (FP_EPOINTER) whatever the body exactly when a list has more
 *   than 32 pointers or one that fp_pointer_check() refuses; else a text body's fingerprint
 *   is the one without lists, a JSON body's result (ok, invalid, too many) is the one without
 *   lists, and neither the order of a list nor a repeated pointer changes the fingerprint;
 * - the method's ASCII case, the order of the query parameters, and the order and name case
 *   of the headers do not change the fingerprint; the same input gives the same fingerprint;
 * - key_validate() agrees with a reference of docs/contract.md, and key_digest() succeeds. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "fp_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_HEADERS 8
#define MAX_POINTER_LINES 40
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

/* The pointer lists of one input, and their expected validity. */
struct lists {
    const char *fields[MAX_POINTER_LINES + 1];
    const char *ignore[MAX_POINTER_LINES + 1];
    size_t n_fields, n_ignore;
};

static bool listsValid(const struct lists *l)
{
    if (l->n_fields > FP_POINTERS_MAX || l->n_ignore > FP_POINTERS_MAX) {
        return false;
    }
    for (size_t i = 0; i < l->n_fields; i++) {
        if (fp_pointer_check(l->fields[i], strlen(l->fields[i]), false) != NULL) {
            return false;
        }
    }
    for (size_t i = 0; i < l->n_ignore; i++) {
        if (fp_pointer_check(l->ignore[i], strlen(l->ignore[i]), true) != NULL) {
            return false;
        }
    }
    return true;
}

/* in with the lists of l, reversed when reverse, with the first of each repeated at its end
 * when repeat (room permitting). */
static struct fp_input withLists(const struct fp_input *in, struct lists *l, struct lists *tmp,
                                 bool reverse, bool repeat)
{
    struct fp_input x = *in;
    *tmp = *l;
    for (size_t i = 0; reverse && i < l->n_fields; i++) {
        tmp->fields[i] = l->fields[l->n_fields - 1 - i];
    }
    for (size_t i = 0; reverse && i < l->n_ignore; i++) {
        tmp->ignore[i] = l->ignore[l->n_ignore - 1 - i];
    }
    if (repeat && tmp->n_fields > 0 && tmp->n_fields < FP_POINTERS_MAX) {
        tmp->fields[tmp->n_fields] = tmp->fields[0];
        tmp->n_fields++;
    }
    if (repeat && tmp->n_ignore > 0 && tmp->n_ignore < FP_POINTERS_MAX) {
        tmp->ignore[tmp->n_ignore] = tmp->ignore[0];
        tmp->n_ignore++;
    }
    x.fields = tmp->n_fields ? tmp->fields : NULL;
    x.n_fields = tmp->n_fields;
    x.ignore = tmp->n_ignore ? tmp->ignore : NULL;
    x.n_ignore = tmp->n_ignore;
    return x;
}

/* Checks the form fp_json_real() gives d (RFC 8785, ECMAScript Number::toString). */
static void checkReal(double d)
{
    char out[FP_JSON_REAL_SIZE];
    size_t n = fp_json_real(d, out);
    if (n == 0 || n != strlen(out)) {
        fail("fp_json_real wrote nothing for a finite double");
    }
    if (strtod(out, NULL) != d) {
        fprintf(stderr, "%.17g written as %s\n", d, out);
        fail("a number's JCS form does not read back as the same double");
    }
    const char *e = strchr(out, 'e');
    const char *m = out[0] == '-' ? out + 1 : out;
    size_t digits = 0;
    for (const char *c = m; *c != '\0' && c != e; c++) {
        digits += *c >= '0' && *c <= '9';
    }
    if (strchr(out, '+') != NULL && (e == NULL || e[1] != '+')) {
        fail("a '+' outside an exponent");
    }
    if (digits > 17 && e != NULL) {
        fail("more than 17 digits in the exponent form");
    }
    const char *dot = strchr(out, '.');
    const char *end = e != NULL ? e : out + n;
    if (dot != NULL && (end[-1] == '0' || end[-1] == '.')) {
        fail("a fraction with trailing zeros");
    }
    double a = d < 0 ? -d : d;
    bool big = a >= 1e21, small = a != 0 && a < 1e-6;
    if ((e != NULL) != (big || small)) {
        fprintf(stderr, "%.17g written as %s\n", d, out);
        fail("the exponent form where ECMAScript writes digits, or the other way round");
    }
    if (e != NULL && (e[1] != '+' && e[1] != '-')) {
        fail("an exponent without its sign");
    }
    if (e != NULL && (m[0] < '1' || m[0] > '9' || (m[1] != '.' && m[1] != 'e'))) {
        fail("the exponent form's mantissa is not one digit, a point and digits");
    }
}

/* checkReal() on every real number of a parsed document. */
static void checkReals(const json_t *v)
{
    if (json_is_real(v)) {
        checkReal(json_real_value(v));
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            checkReals(json_array_get(v, i));
        }
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            checkReals(x);
        }
    }
}

/* The canonical body of x (JSON, fingerprinted fine): checks that it hashes as text like x
 * does as JSON, and that it is its own canonical form. */
static void checkCanonical(const struct fp_input *x, const uint8_t fp[FP_LEN])
{
    uint8_t *canon = NULL;
    size_t len = 0;
    struct fp_input j = *x;
    j.content_type = JSON;
    if (fp_canonical_body(&j, &canon, &len) != FP_OK || len == 0) {
        fail("fp_canonical_body fails where fp_compute succeeds");
    }
    struct fp_input c = *x;
    c.body = canon;
    c.body_len = len;
    same(&c, TEXT, FP_OK, fp, "a JSON body does not hash as its canonical form");
    /* Re-canonicalised, without the lists: the same bytes. */
    struct fp_input r = c;
    r.content_type = JSON;
    r.fields = r.ignore = NULL;
    r.n_fields = r.n_ignore = 0;
    uint8_t *again = NULL;
    size_t again_len = 0;
    int rc = fp_canonical_body(&r, &again, &again_len);
    if (rc == FP_EINVAL_JSON) {
        json_error_t err;
        json_t *doc = json_loadb((const char *)canon, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (doc != NULL || json_error_code(&err) != json_error_numeric_overflow) {
            fprintf(stderr, "canonical: %.*s\n", (int)len, (const char *)canon);
            fail("the canonical form does not parse again (and not for a large number)");
        }
    } else if (rc != FP_OK || again_len != len || memcmp(again, canon, len) != 0) {
        fprintf(stderr, "canonical: %.*s\nagain: %.*s\n", (int)len, (const char *)canon,
                (int)again_len, again ? (const char *)again : "");
        fail("canonical JSON is not a fixed point");
    }
    free(again);
    free(canon);
}

/* The pointer lists' invariants (see the top of the file). */
static void checkLists(const struct fp_input *in, struct lists *l, int text_rc, int json_rc,
                       const uint8_t text_fp[FP_LEN])
{
    struct lists t1, t2;
    struct fp_input x = withLists(in, l, &t1, false, false);
    bool valid = listsValid(l);
    uint8_t fa[FP_LEN], fb[FP_LEN];
    int ta = compute(&x, TEXT, fa);
    int ja = compute(&x, JSON, fb);
    if (!valid) {
        if (ta != FP_EPOINTER || ja != FP_EPOINTER) {
            fail("a bad pointer list was not refused (FP_EPOINTER)");
        }
        return;
    }
    if (ta != text_rc || memcmp(fa, text_fp, FP_LEN) != 0) {
        fail("the pointer lists changed a text body's fingerprint");
    }
    if (ja != json_rc) {
        fail("the pointer lists changed whether a JSON body fingerprints");
    }
    struct fp_input y = withLists(in, l, &t2, true, true);
    same(&y, JSON, ja, fb, "the order of a pointer list, or a repeated pointer, mattered");
    if (ja == FP_OK && in->body_len > 0) {
        checkCanonical(&x, fb);
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
    char *plines[MAX_POINTER_LINES];
    size_t n_plines = 0;
    struct lists lists = {.n_fields = 0};
    while (pos < size) {
        size_t at = pos;
        char *line = nextLine(data, size, &pos);
        if (line[0] == '\0') {
            free(line);
            break;
        }
        bool ptr = line[0] == '@' && (line[1] == 'f' || line[1] == 'i') && line[2] == ':';
        if (ptr && n_plines < MAX_POINTER_LINES) {
            plines[n_plines++] = line;
            if (line[1] == 'f') {
                lists.fields[lists.n_fields++] = line + 3;
            } else {
                lists.ignore[lists.n_ignore++] = line + 3;
            }
            continue;
        }
        if (n_headers == MAX_HEADERS) {
            free(line);
            pos = at; /* the body starts here */
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
        struct fp_input j = in;
        j.content_type = JSON;
        checkCanonical(&j, json_fp);
        json_error_t err;
        json_t *doc = json_loadb((const char *)body, body_len,
                                 JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                 &err);
        if (doc == NULL) {
            fail("fp_compute accepted a body that jansson refuses");
        }
        checkReals(doc);
        json_decref(doc);
    }
    checkLists(&in, &lists, text_rc, json_rc, text_fp);

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
    for (size_t i = 0; i < n_plines; i++) {
        free(plines[i]);
    }
    free(body);
    free(tenant);
    free(path);
    free(method);
    return 0;
}
