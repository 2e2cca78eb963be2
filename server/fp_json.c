/* fp_json: canonical JSON for request fingerprints (fp_json.h; the rules are fingerprint.h's
 * and docs/contract.md's). jansson parses the body and encodes its strings; this file walks
 * the parsed tree, applies the fingerprint pointers (RFC 6901) and writes numbers as RFC 8785
 * does, the one part jansson cannot be asked for (it writes reals with 17 digits).
 *
 * Shortest digits: for p = 1..17 significant digits, glibc's printf gives the p-digit decimal
 * nearest to the double (correctly rounded) and strtod reads it back (correctly rounded); the
 * first p at which that decimal, or failing it its neighbour on the other side of the double
 * (which can read back when the double's rounding interval is lopsided, at a power of two),
 * reads back as the same double gives the digits. 17 digits always do. The decimals are read
 * back as "DIGITSeEXP", without a decimal point, so that no locale can change them. */
#include "fp_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"

/* Flags of the parse; see fp_compute() in fingerprint.h. */
#define FP_JSON_LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL)

/* The most significant digits a double needs to read back as itself. */
#define MAX_DIGITS 17

/* A growing output buffer; oom once an allocation failed (then nothing more is written). */
struct buf {
    char *p;
    size_t len;
    size_t cap;
    bool oom;
};

/* Makes room for n more bytes. False (and oom set) when it cannot. */
static bool bufReserve(struct buf *b, size_t n)
{
    if (b->oom) {
        return false;
    }
    if (b->cap - b->len >= n) {
        return true;
    }
    size_t cap = b->cap > 0 ? b->cap : 256;
    while (cap - b->len < n) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void bufPut(struct buf *b, const char *s, size_t n)
{
    if (n > 0 && bufReserve(b, n)) {
        memcpy(b->p + b->len, s, n);
        b->len += n;
    }
}

static void bufChar(struct buf *b, char c)
{
    bufPut(b, &c, 1);
}

/* ---- numbers ---------------------------------------------------------------------------- */

/* Whether the decimal s * 10^exp reads back (strtod) as m. */
static bool readsBack(uint64_t s, int exp, double m)
{
    char t[48];
    snprintf(t, sizeof t, "%" PRIu64 "e%d", s, exp);
    return strtod(t, NULL) == m;
}

/* The shortest decimal that reads back as m (finite, > 0): *s times 10^*exp, *s without
 * trailing zeros. */
static void shortestDigits(double m, uint64_t *s, int *exp)
{
    for (int p = 1; p <= MAX_DIGITS; p++) {
        char t[48];
        snprintf(t, sizeof t, "%.*e", p - 1, m); /* d[.ddd]e[+-]N, the point per locale */
        uint64_t v = 0;
        const char *c = t;
        for (; *c != '\0' && *c != 'e'; c++) {
            if (*c >= '0' && *c <= '9') {
                v = v * 10 + (uint64_t)(*c - '0');
            }
        }
        int e = (*c == 'e' ? atoi(c + 1) : 0) - (p - 1);
        uint64_t found = 0;
        if (readsBack(v, e, m)) {
            found = v;
        } else {
            /* The nearest p-digit decimal is on one side of m; the next one on the other side
             * is the only other candidate with p digits. */
            char u[48];
            snprintf(u, sizeof u, "%" PRIu64 "e%d", v, e);
            uint64_t w = strtod(u, NULL) < m ? v + 1 : v - 1;
            if (w > 0 && readsBack(w, e, m)) {
                found = w;
            }
        }
        if (found != 0 || p == MAX_DIGITS) {
            if (found == 0) {
                found = v; /* not reached: 17 digits read back (glibc's printf is exact) */
            }
            while (found % 10 == 0) {
                found /= 10;
                e++;
            }
            *s = found;
            *exp = e;
            return;
        }
    }
}

size_t fp_json_real(double d, char out[FP_JSON_REAL_SIZE])
{
    size_t at = 0;
    out[0] = '\0';
    if (!isfinite(d)) {
        return 0;
    }
    if (d == 0) { /* 0 and -0 */
        memcpy(out, "0", 2);
        return 1;
    }
    if (d < 0) {
        out[at++] = '-';
        d = -d;
    }
    uint64_t s;
    int x;
    shortestDigits(d, &s, &x);
    char dg[24];
    int k = snprintf(dg, sizeof dg, "%" PRIu64, s);
    int n = x + k; /* d = 0.dg * 10^n: the first digit's decimal exponent is n - 1 */
    if (k <= n && n <= 21) {
        memcpy(out + at, dg, (size_t)k);
        at += (size_t)k;
        for (int i = 0; i < n - k; i++) {
            out[at++] = '0';
        }
    } else if (0 < n && n <= 21) {
        memcpy(out + at, dg, (size_t)n);
        at += (size_t)n;
        out[at++] = '.';
        memcpy(out + at, dg + n, (size_t)(k - n));
        at += (size_t)(k - n);
    } else if (-6 < n && n <= 0) {
        out[at++] = '0';
        out[at++] = '.';
        for (int i = 0; i < -n; i++) {
            out[at++] = '0';
        }
        memcpy(out + at, dg, (size_t)k);
        at += (size_t)k;
    } else {
        out[at++] = dg[0];
        if (k > 1) {
            out[at++] = '.';
            memcpy(out + at, dg + 1, (size_t)(k - 1));
            at += (size_t)(k - 1);
        }
        at += (size_t)snprintf(out + at, FP_JSON_REAL_SIZE - at, "e%c%d", n - 1 < 0 ? '-' : '+',
                               n - 1 < 0 ? 1 - n : n - 1);
    }
    out[at] = '\0';
    return at;
}

/* ---- the canonical writer --------------------------------------------------------------- */

/* One member of an object, for sorting. */
struct member {
    const char *key;
    size_t len;
    json_t *value;
};

/* qsort() comparator of members: by key, bytewise, a proper prefix first. */
static int memberCompare(const void *a, const void *b)
{
    const struct member *x = a;
    const struct member *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n > 0 ? memcmp(x->key, y->key, n) : 0;
    if (c != 0) {
        return c;
    }
    return (x->len > y->len) - (x->len < y->len);
}

/* Writes a JSON string value as jansson's encoder does (the escapes of the old form). */
static void writeString(struct buf *b, const json_t *str)
{
    size_t room = b->cap - b->len;
    size_t n = json_dumpb(str, b->p != NULL ? b->p + b->len : NULL, room, JSON_ENCODE_ANY);
    if (n == 0) {
        b->oom = true; /* a string always encodes to at least "" */
        return;
    }
    if (n > room) {
        if (!bufReserve(b, n) || json_dumpb(str, b->p + b->len, n, JSON_ENCODE_ANY) != n) {
            b->oom = true;
            return;
        }
    }
    b->len += n;
}

static void writeValue(struct buf *b, const json_t *v);

static void writeObject(struct buf *b, const json_t *o)
{
    size_t n = json_object_size(o);
    struct member *m = n > 0 ? calloc(n, sizeof *m) : NULL;
    if (n > 0 && m == NULL) {
        b->oom = true;
        return;
    }
    size_t i = 0;
    const char *key;
    size_t key_len;
    json_t *value;
    json_object_keylen_foreach((json_t *)o, key, key_len, value)
    {
        m[i++] = (struct member){key, key_len, value};
    }
    if (n > 1) {
        qsort(m, n, sizeof *m, memberCompare);
    }
    bufChar(b, '{');
    for (i = 0; i < n && !b->oom; i++) {
        json_t *k = json_stringn_nocheck(m[i].key, m[i].len);
        if (k == NULL) {
            b->oom = true;
            break;
        }
        if (i > 0) {
            bufChar(b, ',');
        }
        writeString(b, k);
        json_decref(k);
        bufChar(b, ':');
        writeValue(b, m[i].value);
    }
    bufChar(b, '}');
    free(m);
}

static void writeValue(struct buf *b, const json_t *v)
{
    char num[FP_JSON_REAL_SIZE]; /* also holds a long long's digits */
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        writeObject(b, v);
        break;
    case JSON_ARRAY:
        bufChar(b, '[');
        for (size_t i = 0; i < json_array_size(v) && !b->oom; i++) {
            if (i > 0) {
                bufChar(b, ',');
            }
            writeValue(b, json_array_get(v, i));
        }
        bufChar(b, ']');
        break;
    case JSON_STRING:
        writeString(b, v);
        break;
    case JSON_INTEGER: /* exact digits: the JCS form up to 2^53, and no merging above */
        bufPut(b, num,
               (size_t)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v)));
        break;
    case JSON_REAL:
        bufPut(b, num, fp_json_real(json_real_value(v), num));
        break;
    case JSON_TRUE:
        bufPut(b, "true", 4);
        break;
    case JSON_FALSE:
        bufPut(b, "false", 5);
        break;
    default:
        bufPut(b, "null", 4);
        break;
    }
}

/* ---- JSON Pointers (RFC 6901) ----------------------------------------------------------- */

const char *fp_pointer_check(const char *ptr, size_t len, bool ignore)
{
    if (ptr == NULL) {
        return "a JSON pointer must not be null";
    }
    if (len > FP_POINTER_MAX_LEN) {
        return "a JSON pointer has at most 256 bytes";
    }
    if (len == 0) {
        return ignore ? "the empty JSON pointer (the whole body) cannot be ignored" : NULL;
    }
    if (ptr[0] != '/') {
        return "a JSON pointer is empty or starts with '/'";
    }
    for (size_t i = 0; i < len; i++) {
        if (ptr[i] == '~' && (i + 1 == len || (ptr[i + 1] != '0' && ptr[i + 1] != '1'))) {
            return "'~' in a JSON pointer must be followed by 0 or 1 (~0 is '~', ~1 is '/')";
        }
    }
    /* jansson refuses a string that is not UTF-8, or that holds a NUL (nocheck aside). */
    json_t *s = memchr(ptr, '\0', len) == NULL ? json_stringn(ptr, len) : NULL;
    if (s == NULL) {
        return "a JSON pointer must be UTF-8 text without NUL bytes";
    }
    json_decref(s);
    return NULL;
}

/* The next reference token of a pointer at *p (which points at its '/'), unescaped into tok
 * (FP_POINTER_MAX_LEN bytes) with its length in *len; advances *p past it. */
static void nextToken(const char **p, char *tok, size_t *len)
{
    const char *c = *p + 1;
    size_t n = 0;
    while (*c != '\0' && *c != '/') {
        if (c[0] == '~') {
            tok[n++] = c[1] == '1' ? '/' : '~';
            c += 2;
        } else {
            tok[n++] = *c++;
        }
    }
    *len = n;
    *p = c;
}

/* The array index a token names in an array of size n, or -1: "0" or digits without a
 * leading zero, below n ("-", the element past the end, names nothing). */
static long arrayIndex(const char *tok, size_t len, size_t n)
{
    if (len == 0 || len > 18 || (len > 1 && tok[0] == '0')) {
        return -1;
    }
    long i = 0;
    for (size_t k = 0; k < len; k++) {
        if (tok[k] < '0' || tok[k] > '9') {
            return -1;
        }
        i = i * 10 + (tok[k] - '0');
    }
    return (size_t)i < n ? i : -1;
}

/* The value token tok names in container c, or NULL. */
static json_t *step(json_t *c, const char *tok, size_t len)
{
    if (json_is_object(c)) {
        return json_object_getn(c, tok, len);
    }
    if (json_is_array(c)) {
        long i = arrayIndex(tok, len, json_array_size(c));
        return i >= 0 ? json_array_get(c, (size_t)i) : NULL;
    }
    return NULL;
}

/* Walks pointer ptr from doc: the value it names, or NULL. With last (OUT, FP_POINTER_MAX_LEN
 * bytes) the walk stops before the last token, which is left in last and *last_len, and
 * returns its container instead (NULL for the empty pointer). */
static json_t *walk(json_t *doc, const char *ptr, char *last, size_t *last_len)
{
    char tok[FP_POINTER_MAX_LEN];
    size_t len;
    json_t *cur = doc;
    const char *p = ptr;
    if (last != NULL && *p == '\0') {
        return NULL;
    }
    while (cur != NULL && *p != '\0') {
        nextToken(&p, tok, &len);
        if (last != NULL && *p == '\0') {
            memcpy(last, tok, len);
            *last_len = len;
            return cur;
        }
        cur = step(cur, tok, len);
    }
    return cur;
}

/* Removes what each pointer of ignore names from doc: an object member, or an array element
 * replaced with null. False when out of memory. */
static bool applyIgnore(json_t *doc, const char *const *ignore, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char last[FP_POINTER_MAX_LEN];
        size_t len = 0;
        json_t *c = walk(doc, ignore[i], last, &len);
        if (json_is_object(c)) {
            json_object_deln(c, last, len); /* -1 when absent: nothing to do */
        } else if (json_is_array(c)) {
            long k = arrayIndex(last, len, json_array_size(c));
            if (k >= 0 && json_array_set_new(c, (size_t)k, json_null()) != 0) {
                return false;
            }
        }
    }
    return true;
}

/* The object mapping each pointer of fields that names a value in doc to that value (shared
 * with doc), or NULL when out of memory. */
static json_t *selectFields(json_t *doc, const char *const *fields, size_t n)
{
    json_t *out = json_object();
    for (size_t i = 0; out != NULL && i < n; i++) {
        json_t *v = walk(doc, fields[i], NULL, NULL);
        if (v != NULL && json_object_set(out, fields[i], v) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

/* ---- the body --------------------------------------------------------------------------- */

/* Whether the JSON text b[0..n) has at most max values, counted cheaply before any parse:
 * one for the first value and one per ',', ':', '[' and '{' outside strings (an upper
 * bound of what a parser would build, whatever the text's validity). */
static bool jsonValuesWithin(const uint8_t *b, size_t n, size_t max)
{
    size_t count = 1;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = b[i];
        if (in_string) {
            if (ch == '\\') {
                i++; /* the escaped byte, whatever it is */
            } else if (ch == '"') {
                in_string = false;
            }
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == ',' || ch == ':' || ch == '[' || ch == '{') {
            if (++count > max) {
                return false;
            }
        }
    }
    return true;
}

int fp_json_canonical(const uint8_t *body, size_t len, const char *const *fields, size_t n_fields,
                      const char *const *ignore, size_t n_ignore, char **out, size_t *out_len)
{
    json_error_t error;
    struct buf b = {0};
    json_t *sel = NULL;
    int rc = FP_ENOMEM;

    *out = NULL;
    *out_len = 0;
    if (!jsonValuesWithin(body, len, FP_JSON_MAX_VALUES)) {
        return FP_EJSON_TOO_MANY;
    }
    /* jansson leaves the code byte of error untouched when it fails before parsing, which it
     * does only when it cannot allocate its lexer; zeroing error lets us tell that apart. */
    memset(&error, 0, sizeof error);
    json_t *doc = json_loadb((const char *)body, len, FP_JSON_LOAD_FLAGS, &error);
    if (doc == NULL) {
        bool oom = json_error_code(&error) == json_error_out_of_memory || error.text[0] == '\0';
        return oom ? FP_ENOMEM : FP_EINVAL_JSON;
    }
    if (!applyIgnore(doc, ignore, n_ignore)) {
        goto cleanup;
    }
    if (n_fields > 0 && (sel = selectFields(doc, fields, n_fields)) == NULL) {
        goto cleanup;
    }
    writeValue(&b, sel != NULL ? sel : doc);
    if (!b.oom) {
        *out = b.p;
        *out_len = b.len;
        b.p = NULL;
        rc = FP_OK;
    }

cleanup:
    free(b.p);
    json_decref(sel);
    json_decref(doc);
    return rc;
}
