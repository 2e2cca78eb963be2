/* Request fingerprints and key digests (docs/contract.md); the key rule is key.c.
 *
 * Hashing is OpenSSL's EVP SHA-256; a JSON body's canonical form (jansson's parser, the
 * pointers, RFC 8785 numbers) is fp_json.c's; this file frames fields and orders them. Every
 * variable-length field goes into the digest as a 4-byte big-endian length followed by its bytes
 * (see fingerprint.h for the exact order), so fields cannot run into each other.
 *
 * Known untested: the FP_ENOMEM and FP_ECRYPTO paths (no allocation-failure injection yet)
 * and the FP_ETOO_LARGE paths (they need a field of 4 GiB). */
#include "fingerprint.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "fp_json.h"

/* The domain tag that opens every fingerprint; bump it if the framing ever changes. */
#define FP_DOMAIN_TAG "idem-fp-v1"

/* How a string is case-folded on its way into the digest. */
enum fold {
    FOLD_NONE,
    FOLD_UPPER,
    FOLD_LOWER,
};

/* A slice of a borrowed buffer, used to sort query parameters without copying them. */
struct slice {
    const char *ptr;
    size_t len;
};

const char *fp_strerror(int rc)
{
    switch (rc) {
    case FP_OK:
        return "success";
#define FP_ERRORS_CASE(code, msg)                                                                  \
    case code:                                                                                     \
        return msg;
        FP_ERRORS(FP_ERRORS_CASE)
#undef FP_ERRORS_CASE
    default:
        return "unknown fingerprint error";
    }
}

/* ASCII case folding that does not depend on the locale. */
static unsigned char asciiUpper(unsigned char c)
{
    return (c >= 'a' && c <= 'z') ? (unsigned char)(c - 'a' + 'A') : c;
}

static unsigned char asciiLower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c - 'A' + 'a') : c;
}

/* Returns whether the len bytes at s equal the NUL-terminated lower-case ASCII word, ignoring
 * ASCII case. */
static bool asciiCaseEqual(const char *s, size_t len, const char *word)
{
    if (strlen(word) != len) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (asciiLower((unsigned char)s[i]) != (unsigned char)word[i]) {
            return false;
        }
    }
    return true;
}

/* Feeds the 4-byte big-endian length of a field into the digest. */
static int fpUpdateLength(EVP_MD_CTX *ctx, size_t len)
{
    uint8_t be[4];

    if (len > UINT32_MAX) {
        return FP_ETOO_LARGE;
    }
    be[0] = (uint8_t)(len >> 24);
    be[1] = (uint8_t)(len >> 16);
    be[2] = (uint8_t)(len >> 8);
    be[3] = (uint8_t)len;
    return EVP_DigestUpdate(ctx, be, sizeof be) == 1 ? FP_OK : FP_ECRYPTO;
}

/* Feeds raw bytes, with no framing, into the digest. */
static int fpUpdateRaw(EVP_MD_CTX *ctx, const void *data, size_t len)
{
    if (len == 0) {
        return FP_OK;
    }
    return EVP_DigestUpdate(ctx, data, len) == 1 ? FP_OK : FP_ECRYPTO;
}

/* Feeds one framed field (length, then bytes) into the digest, case-folded as asked. Folding
 * goes through a small stack buffer, so it allocates nothing. */
static int fpUpdateField(EVP_MD_CTX *ctx, const void *data, size_t len, enum fold fold)
{
    const unsigned char *src = data;
    unsigned char chunk[64];
    int rc;

    rc = fpUpdateLength(ctx, len);
    if (rc != FP_OK) {
        return rc;
    }
    if (fold == FOLD_NONE) {
        return fpUpdateRaw(ctx, src, len);
    }
    while (len > 0) {
        size_t n = len < sizeof chunk ? len : sizeof chunk;
        for (size_t i = 0; i < n; i++) {
            chunk[i] = fold == FOLD_UPPER ? asciiUpper(src[i]) : asciiLower(src[i]);
        }
        rc = fpUpdateRaw(ctx, chunk, n);
        if (rc != FP_OK) {
            return rc;
        }
        src += n;
        len -= n;
    }
    return FP_OK;
}

/* Orders byte strings as strcmp() orders their NUL-terminated forms would: bytewise, and a
 * proper prefix first. */
static int bytesCompare(const void *a, size_t a_len, const void *b, size_t b_len)
{
    size_t n = a_len < b_len ? a_len : b_len;
    int c = n > 0 ? memcmp(a, b, n) : 0;

    if (c != 0) {
        return c;
    }
    return (a_len > b_len) - (a_len < b_len);
}

/* qsort() comparator for query parameters (struct slice). */
static int sliceCompare(const void *a, const void *b)
{
    const struct slice *x = a;
    const struct slice *y = b;

    return bytesCompare(x->ptr, x->len, y->ptr, y->len);
}

/* Feeds the path with its query parameters sorted, as one framed field. The sorted form has
 * exactly the length of the original, so the parameters are hashed in place in their new
 * order and the path is never copied. */
static int fpUpdatePath(EVP_MD_CTX *ctx, const char *path)
{
    const char *question = strchr(path, '?');
    const char *query;
    size_t path_len;
    size_t query_len;
    size_t n_params = 1;
    struct slice *params = NULL;
    int rc;

    if (question == NULL) {
        return fpUpdateField(ctx, path, strlen(path), FOLD_NONE);
    }
    path_len = (size_t)(question - path);
    query = question + 1;
    query_len = strlen(query);
    if (query_len == 0) {
        /* "/a?" is the same request as "/a". */
        return fpUpdateField(ctx, path, path_len, FOLD_NONE);
    }

    for (size_t i = 0; i < query_len; i++) {
        if (query[i] == '&') {
            n_params++;
        }
    }
    params = calloc(n_params, sizeof *params);
    if (params == NULL) {
        rc = FP_ENOMEM;
        goto cleanup;
    }
    {
        const char *start = query;
        size_t k = 0;
        for (const char *p = query;; p++) {
            if (*p == '&' || *p == '\0') {
                params[k].ptr = start;
                params[k].len = (size_t)(p - start);
                k++;
                start = p + 1;
                if (*p == '\0') {
                    break;
                }
            }
        }
    }
    qsort(params, n_params, sizeof *params, sliceCompare);

    rc = fpUpdateLength(ctx, path_len + 1 + query_len);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateRaw(ctx, path, path_len);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateRaw(ctx, "?", 1);
    if (rc != FP_OK) {
        goto cleanup;
    }
    for (size_t i = 0; i < n_params; i++) {
        if (i > 0) {
            rc = fpUpdateRaw(ctx, "&", 1);
            if (rc != FP_OK) {
                goto cleanup;
            }
        }
        rc = fpUpdateRaw(ctx, params[i].ptr, params[i].len);
        if (rc != FP_OK) {
            goto cleanup;
        }
    }
    rc = FP_OK;

cleanup:
    free(params);
    return rc;
}

/* Returns whether a Content-Type value names JSON: its media type (before any ';', with
 * surrounding spaces and tabs trimmed) is application/json or has a subtype ending in "+json"
 * (RFC 6839), ignoring ASCII case. */
static bool isJsonContentType(const char *content_type)
{
    const char *start = content_type;
    const char *end;
    const char *slash;
    size_t len;
    size_t subtype_len;

    if (content_type == NULL) {
        return false;
    }
    end = strchr(content_type, ';');
    if (end == NULL) {
        end = content_type + strlen(content_type);
    }
    while (start < end && (*start == ' ' || *start == '\t')) {
        start++;
    }
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    len = (size_t)(end - start);
    if (asciiCaseEqual(start, len, "application/json")) {
        return true;
    }
    slash = memchr(start, '/', len);
    if (slash == NULL || slash == start) {
        return false;
    }
    /* The subtype needs something before the suffix: "application/+json" is not JSON. */
    subtype_len = (size_t)(end - slash - 1);
    return subtype_len > 5 && asciiCaseEqual(end - 5, 5, "+json");
}

/* Feeds the body into the digest as one framed field: canonical JSON when it is JSON and not
 * empty (fp_json.c), the raw bytes otherwise. */
static int fpUpdateBody(EVP_MD_CTX *ctx, const struct fp_input *in)
{
    if (!isJsonContentType(in->content_type) || in->body_len == 0) {
        return fpUpdateField(ctx, in->body, in->body_len, FOLD_NONE);
    }
    char *canonical = NULL;
    size_t canonical_len = 0;
    int rc = fp_json_canonical(in->body, in->body_len, in->fields, in->n_fields, in->ignore,
                               in->n_ignore, &canonical, &canonical_len);
    if (rc == FP_OK) {
        rc = fpUpdateField(ctx, canonical, canonical_len, FOLD_NONE);
    }
    free(canonical);
    return rc;
}

/* qsort() comparator for headers (pointers to struct fp_header): by lower-cased name, then
 * by value bytewise. */
static int headerCompare(const void *a, const void *b)
{
    const struct fp_header *x = *(const struct fp_header *const *)a;
    const struct fp_header *y = *(const struct fp_header *const *)b;
    const unsigned char *xn = (const unsigned char *)x->name;
    const unsigned char *yn = (const unsigned char *)y->name;

    for (;; xn++, yn++) {
        unsigned char xc = asciiLower(*xn);
        unsigned char yc = asciiLower(*yn);
        if (xc != yc) {
            return xc < yc ? -1 : 1;
        }
        if (xc == '\0') {
            break;
        }
    }
    return bytesCompare(x->value, x->value_len, y->value, y->value_len);
}

/* Feeds the header count and the headers, sorted, into the digest. The caller's array is
 * left in its order; an array of pointers is sorted instead. */
static int fpUpdateHeaders(EVP_MD_CTX *ctx, const struct fp_header *headers, size_t n_headers)
{
    const struct fp_header **sorted = NULL;
    int rc;

    /* The count is a bare 4-byte big-endian number; the same encoding as a length. */
    rc = fpUpdateLength(ctx, n_headers);
    if (rc != FP_OK || n_headers == 0) {
        return rc;
    }
    sorted = calloc(n_headers, sizeof *sorted);
    if (sorted == NULL) {
        rc = FP_ENOMEM;
        goto cleanup;
    }
    for (size_t i = 0; i < n_headers; i++) {
        sorted[i] = &headers[i];
    }
    qsort(sorted, n_headers, sizeof *sorted, headerCompare);
    for (size_t i = 0; i < n_headers; i++) {
        rc = fpUpdateField(ctx, sorted[i]->name, strlen(sorted[i]->name), FOLD_LOWER);
        if (rc != FP_OK) {
            goto cleanup;
        }
        rc = fpUpdateField(ctx, sorted[i]->value, sorted[i]->value_len, FOLD_NONE);
        if (rc != FP_OK) {
            goto cleanup;
        }
    }
    rc = FP_OK;

cleanup:
    free(sorted);
    return rc;
}

/* Whether one pointer list of struct fp_input holds what fp_pointer_check() allows: FP_OK,
 * FP_EINVAL (a NULL) or FP_EPOINTER. */
static int fpListValid(const char *const *ptrs, size_t n, bool ignore)
{
    if (ptrs == NULL && n > 0) {
        return FP_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (ptrs[i] == NULL) {
            return FP_EINVAL;
        }
    }
    if (n > FP_POINTERS_MAX) {
        return FP_EPOINTER;
    }
    for (size_t i = 0; i < n; i++) {
        if (fp_pointer_check(ptrs[i], strlen(ptrs[i]), ignore) != NULL) {
            return FP_EPOINTER;
        }
    }
    return FP_OK;
}

/* Both pointer lists of in: FP_OK, FP_EINVAL or FP_EPOINTER. */
static int fpListsValid(const struct fp_input *in)
{
    int rc = fpListValid(in->fields, in->n_fields, false);
    return rc != FP_OK ? rc : fpListValid(in->ignore, in->n_ignore, true);
}

/* Returns whether in follows the NULL rules documented on struct fp_input (the pointer lists
 * are fpListsValid()'s). */
static bool fpInputValid(const struct fp_input *in)
{
    if (in->method == NULL || in->path == NULL || in->tenant == NULL) {
        return false;
    }
    if (in->body == NULL && in->body_len > 0) {
        return false;
    }
    if (in->headers == NULL && in->n_headers > 0) {
        return false;
    }
    for (size_t i = 0; i < in->n_headers; i++) {
        if (in->headers[i].name == NULL ||
            (in->headers[i].value == NULL && in->headers[i].value_len > 0)) {
            return false;
        }
    }
    return true;
}

/* A new SHA-256 context into *ctx (NULL when none could be made; the caller frees it with
 * EVP_MD_CTX_free either way). FP_OK, FP_ENOMEM or FP_ECRYPTO. */
static int digestBegin(EVP_MD_CTX **ctx)
{
    *ctx = EVP_MD_CTX_new();
    if (*ctx == NULL) {
        return FP_ENOMEM;
    }
    return EVP_DigestInit_ex(*ctx, EVP_sha256(), NULL) == 1 ? FP_OK : FP_ECRYPTO;
}

int fp_canonical_body(const struct fp_input *in, uint8_t **out, size_t *out_len)
{
    if (out == NULL || out_len == NULL) {
        return FP_EINVAL;
    }
    *out = NULL;
    *out_len = 0;
    int rc = in != NULL && fpInputValid(in) ? fpListsValid(in) : FP_EINVAL;
    if (rc != FP_OK || in->body_len == 0) {
        return rc;
    }
    if (isJsonContentType(in->content_type)) {
        char *canonical = NULL;
        rc = fp_json_canonical(in->body, in->body_len, in->fields, in->n_fields, in->ignore,
                               in->n_ignore, &canonical, out_len);
        *out = (uint8_t *)canonical;
        return rc;
    }
    *out = malloc(in->body_len);
    if (*out == NULL) {
        return FP_ENOMEM;
    }
    memcpy(*out, in->body, in->body_len);
    *out_len = in->body_len;
    return FP_OK;
}

int fp_compute(const struct fp_input *in, uint8_t out[FP_LEN])
{
    EVP_MD_CTX *ctx = NULL;
    unsigned int digest_len = 0;
    int rc;

    if (in == NULL || out == NULL || !fpInputValid(in)) {
        return FP_EINVAL;
    }
    rc = fpListsValid(in);
    if (rc != FP_OK) {
        return rc;
    }
    rc = digestBegin(&ctx);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateField(ctx, FP_DOMAIN_TAG, strlen(FP_DOMAIN_TAG), FOLD_NONE);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateField(ctx, in->method, strlen(in->method), FOLD_UPPER);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdatePath(ctx, in->path);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateField(ctx, in->tenant, strlen(in->tenant), FOLD_NONE);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateBody(ctx, in);
    if (rc != FP_OK) {
        goto cleanup;
    }
    rc = fpUpdateHeaders(ctx, in->headers, in->n_headers);
    if (rc != FP_OK) {
        goto cleanup;
    }
    if (EVP_DigestFinal_ex(ctx, out, &digest_len) != 1 || digest_len != FP_LEN) {
        rc = FP_ECRYPTO;
        goto cleanup;
    }
    rc = FP_OK;

cleanup:
    EVP_MD_CTX_free(ctx);
    return rc;
}

void fp_hex12(const uint8_t fp[FP_LEN], char out[FP_HEX12_SIZE])
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < (FP_HEX12_SIZE - 1) / 2; i++) {
        out[2 * i] = digits[fp[i] >> 4];
        out[2 * i + 1] = digits[fp[i] & 0x0f];
    }
    out[FP_HEX12_SIZE - 1] = '\0';
}

/* The key of key_digest's HMAC (key_digest_set_secret), or none: plain SHA-256. */
static uint8_t digestKey[FP_LEN];
static bool digestKeyed;

static const char digestLabel[] = "idemd key_digest v1";

int key_digest_set_secret(const uint8_t *secret, size_t len)
{
    if (secret == NULL || len == 0) {
        digestKeyed = false;
        return FP_OK;
    }
    unsigned int n = 0;
    if (HMAC(EVP_sha256(), secret, (int)len, (const unsigned char *)digestLabel,
             sizeof digestLabel - 1, digestKey, &n) == NULL ||
        n != FP_LEN) {
        digestKeyed = false;
        return FP_ECRYPTO;
    }
    digestKeyed = true;
    return FP_OK;
}

/* Appends a 4-byte big-endian length and then the bytes to buf at *at. */
static void frameField(uint8_t *buf, size_t *at, const void *data, size_t len)
{
    buf[(*at)++] = (uint8_t)(len >> 24);
    buf[(*at)++] = (uint8_t)(len >> 16);
    buf[(*at)++] = (uint8_t)(len >> 8);
    buf[(*at)++] = (uint8_t)len;
    if (len > 0) {
        memcpy(buf + *at, data, len);
    }
    *at += len;
}

int key_digest(const char *tenant, const uint8_t *key, size_t key_len, char out[FP_HEX12_SIZE])
{
    if (out == NULL) {
        return FP_EINVAL;
    }
    out[0] = '\0';
    if (tenant == NULL || (key == NULL && key_len > 0)) {
        return FP_EINVAL;
    }
    size_t tlen = strlen(tenant);
    if (tlen > UINT32_MAX || key_len > UINT32_MAX || tlen + key_len > (1u << 20)) {
        return FP_ETOO_LARGE;
    }
    size_t cap = 8 + tlen + key_len, at = 0;
    uint8_t stackbuf[600];
    uint8_t *buf = cap <= sizeof stackbuf ? stackbuf : malloc(cap);
    if (buf == NULL) {
        return FP_ENOMEM;
    }
    frameField(buf, &at, tenant, tlen);
    frameField(buf, &at, key, key_len);
    uint8_t digest[FP_LEN];
    unsigned int n = 0;
    bool ok = digestKeyed
                  ? HMAC(EVP_sha256(), digestKey, sizeof digestKey, buf, at, digest, &n) != NULL
                  : EVP_Digest(buf, at, digest, &n, EVP_sha256(), NULL) == 1;
    OPENSSL_cleanse(buf, at); /* it held the key */
    if (buf != stackbuf) {
        free(buf);
    }
    if (!ok || n != FP_LEN) {
        return FP_ECRYPTO;
    }
    fp_hex12(digest, out);
    return FP_OK;
}
