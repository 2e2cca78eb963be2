/* proxy_rules: proxy mode's pure request rules (proxy_rules.h): path normalisation, prefix
 * matching, the caller namespace. Hashing and base64 are OpenSSL's. */
#include "proxy_rules.h"

#include <openssl/evp.h>
#include <string.h>
#include <strings.h>

const char *proxy_path_strerror(int rc)
{
    switch (rc) {
    case PROXY_PATH_OK:
        return "ok";
    case PROXY_PATH_NOT_ORIGIN:
        return "the request target must be a path starting with '/'";
    case PROXY_PATH_BAD_PERCENT:
        return "the path has a malformed percent-encoding (or %00)";
    case PROXY_PATH_ENCODED_SLASH:
        return "the path has an encoded '/' (%2F)";
    case PROXY_PATH_BACKSLASH:
        return "the path has a '\\' (or %5C)";
    case PROXY_PATH_DOT_SEGMENT:
        return "the path has a '.' or '..' segment (also percent-encoded)";
    case PROXY_PATH_EMPTY_SEGMENT:
        return "the path has an empty segment ('//')";
    case PROXY_PATH_BAD_BYTE:
        return "the path has a byte that must be percent-encoded (a control, space, '#' or "
               "non-ASCII byte)";
    default:
        return "the path is not accepted";
    }
}

static int hexVal(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* RFC 3986 2.3: ALPHA DIGIT - . _ ~ */
static bool unreserved(unsigned v)
{
    return (v >= 'a' && v <= 'z') || (v >= 'A' && v <= 'Z') || (v >= '0' && v <= '9') || v == '-' ||
           v == '.' || v == '_' || v == '~';
}

/* Checks one normalised segment (n bytes at s); last: nothing follows it in the path. */
static int segmentCheck(const char *s, size_t n, bool last)
{
    if (n == 0) {
        return last ? PROXY_PATH_OK : PROXY_PATH_EMPTY_SEGMENT;
    }
    const char *semi = memchr(s, ';', n);
    size_t base = semi != NULL ? (size_t)(semi - s) : n;
    if ((base == 1 && s[0] == '.') || (base == 2 && s[0] == '.' && s[1] == '.')) {
        return PROXY_PATH_DOT_SEGMENT;
    }
    return PROXY_PATH_OK;
}

/* One "%XY" at in[i] (i + 2 < end checked by the caller) into out at *o. */
static int percentByte(const char *in, size_t i, size_t end, char *out, size_t *o)
{
    static const char hex[] = "0123456789ABCDEF";
    int hi = i + 2 < end ? hexVal(in[i + 1]) : -1;
    int lo = i + 2 < end ? hexVal(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
        return PROXY_PATH_BAD_PERCENT;
    }
    unsigned v = (unsigned)(hi * 16 + lo);
    if (v == 0) {
        return PROXY_PATH_BAD_PERCENT;
    }
    if (v == '/') {
        return PROXY_PATH_ENCODED_SLASH;
    }
    if (v == '\\') {
        return PROXY_PATH_BACKSLASH;
    }
    if (unreserved(v)) {
        out[(*o)++] = (char)v;
    } else {
        out[(*o)++] = '%';
        out[(*o)++] = hex[hi];
        out[(*o)++] = hex[lo];
    }
    return PROXY_PATH_OK;
}

int proxy_path_normalise(const char *in, size_t len, char *out, size_t *out_len, size_t *path_len)
{
    if (len == 0 || in[0] != '/') {
        return PROXY_PATH_NOT_ORIGIN;
    }
    const char *qm = memchr(in, '?', len);
    size_t end = qm != NULL ? (size_t)(qm - in) : len;
    size_t o = 0, seg = 1;
    out[o++] = '/';
    for (size_t i = 1; i <= end; i++) {
        if (i == end || in[i] == '/') {
            int rc = segmentCheck(out + seg, o - seg, i == end);
            if (rc != PROXY_PATH_OK) {
                return rc;
            }
            if (i == end) {
                break;
            }
            out[o++] = '/';
            seg = o;
            continue;
        }
        unsigned char ch = (unsigned char)in[i];
        if (ch == '%') {
            int rc = percentByte(in, i, end, out, &o);
            if (rc != PROXY_PATH_OK) {
                return rc;
            }
            i += 2;
            continue;
        }
        if (ch == '\\') {
            return PROXY_PATH_BACKSLASH;
        }
        if (ch <= 0x20 || ch == 0x7f || ch == '#' || ch >= 0x80) {
            return PROXY_PATH_BAD_BYTE;
        }
        out[o++] = (char)ch;
    }
    *path_len = o;
    memcpy(out + o, in + end, len - end);
    o += len - end;
    out[o] = '\0';
    *out_len = o;
    return PROXY_PATH_OK;
}

bool proxy_path_under(const char *path, size_t path_len, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (path_len < pl || memcmp(path, prefix, pl) != 0) {
        return false;
    }
    return path_len == pl || (pl > 0 && prefix[pl - 1] == '/') || path[pl] == '/';
}

/* ---- the caller namespace ---------------------------------------------------------------- */

/* Adds a 4-byte big-endian length and the bytes to the digest. */
static bool putField(EVP_MD_CTX *md, const void *p, size_t len)
{
    if (len > UINT32_MAX) {
        return false;
    }
    uint8_t be[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    return EVP_DigestUpdate(md, be, 4) == 1 && (len == 0 || EVP_DigestUpdate(md, p, len) == 1);
}

static bool putCount(EVP_MD_CTX *md, size_t n)
{
    if (n > UINT32_MAX) {
        return false;
    }
    uint8_t be[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    return EVP_DigestUpdate(md, be, 4) == 1;
}

static bool callerFields(EVP_MD_CTX *md, const char *const *names, size_t n_names,
                         const struct proxy_caller_value *vals, size_t n_vals)
{
    static const char tag[] = "idemd-proxy-caller-v1";
    if (!putField(md, tag, sizeof tag - 1)) {
        return false;
    }
    for (size_t h = 0; h < n_names; h++) {
        size_t count = 0;
        for (size_t i = 0; i < n_vals; i++) {
            count += vals[i].header == h;
        }
        if (!putField(md, names[h], strlen(names[h])) || !putCount(md, count)) {
            return false;
        }
        for (size_t i = 0; i < n_vals; i++) {
            if (vals[i].header == h && !putField(md, vals[i].value, vals[i].len)) {
                return false;
            }
        }
    }
    return true;
}

bool proxy_caller_digest(const char *const *names, size_t n_names,
                         const struct proxy_caller_value *vals, size_t n_vals,
                         uint8_t out[PROXY_CALLER_LEN])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int olen = 0;
    bool ok = md != NULL && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
              callerFields(md, names, n_names, vals, n_vals) &&
              EVP_DigestFinal_ex(md, out, &olen) == 1 && olen == PROXY_CALLER_LEN;
    EVP_MD_CTX_free(md);
    return ok;
}

bool proxy_ns_key(const uint8_t caller[PROXY_CALLER_LEN], const uint8_t *key, size_t key_len,
                  char out[PROXY_NS_KEY_LEN + 1])
{
    static const char tag[] = "idemd-proxy-key-v1";
    uint8_t d[32];
    unsigned int dlen = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = md != NULL && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
              putField(md, tag, sizeof tag - 1) && putField(md, caller, PROXY_CALLER_LEN) &&
              putField(md, key, key_len) && EVP_DigestFinal_ex(md, d, &dlen) == 1 &&
              dlen == sizeof d;
    EVP_MD_CTX_free(md);
    if (!ok) {
        return false;
    }
    unsigned char b64[48]; /* 44 characters and a NUL */
    if (EVP_EncodeBlock(b64, d, sizeof d) != 44) {
        return false;
    }
    out[0] = '~';
    for (size_t i = 1; i < PROXY_NS_KEY_LEN; i++) { /* base64url */
        out[i] = b64[i - 1] == '+' ? '-' : b64[i - 1] == '/' ? '_' : (char)b64[i - 1];
    }
    out[PROXY_NS_KEY_LEN] = '\0';
    return true;
}

bool proxy_key_reserved(const uint8_t *key, size_t len)
{
    if (len != PROXY_NS_KEY_LEN || key[0] != '~') {
        return false;
    }
    for (size_t i = 1; i < len; i++) {
        uint8_t c = key[i];
        bool b64 = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_';
        if (!b64) {
            return false;
        }
    }
    return true;
}

bool proxy_connection_names(const char *value, size_t len, const char *name, size_t nl)
{
    const char *p = value, *end = value + len;
    while (p < end) {
        while (p < end && (*p == ',' || *p == ' ' || *p == '\t')) {
            p++;
        }
        const char *t = p;
        while (p < end && *p != ',' && *p != ' ' && *p != '\t') {
            p++;
        }
        if (p > t && (size_t)(p - t) == nl && strncasecmp(t, name, nl) == 0) {
            return true;
        }
    }
    return false;
}
