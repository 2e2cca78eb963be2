/* http_conv: HTTP conventions without h2o (see http_conv.h). */
#include "http_conv.h"

#include <inttypes.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "dec.h"
#include "key.h"

const char *http_sf_strerror(int rc)
{
    switch (rc) {
    case HTTP_SF_OK:
        return "a valid sf-string";
    case HTTP_SF_NOT_STRING:
        return "not an sf-string: it does not begin with a double quote";
    case HTTP_SF_UNTERMINATED:
        return "a bad sf-string: no closing double quote";
    case HTTP_SF_BAD_ESCAPE:
        return "a bad sf-string: a backslash may only escape a double quote or a backslash";
    case HTTP_SF_BAD_CHAR:
        return "a bad sf-string: a byte outside printable ASCII (0x20-0x7e)";
    case HTTP_SF_TRAILING:
        return "a bad sf-string: something follows the closing double quote (parameters are "
               "not accepted)";
    default:
        return "a bad sf-string";
    }
}

int http_sf_string(const char *in, size_t len, char *out, size_t *out_len)
{
    size_t i = 0, o = 0;
    *out_len = 0;
    while (i < len && in[i] == ' ') {
        i++;
    }
    if (i == len || in[i] != '"') {
        return HTTP_SF_NOT_STRING;
    }
    for (i++; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == '\\') {
            if (i + 1 == len) {
                return HTTP_SF_UNTERMINATED;
            }
            c = (unsigned char)in[++i];
            if (c != '"' && c != '\\') {
                return HTTP_SF_BAD_ESCAPE;
            }
            out[o++] = (char)c;
        } else if (c == '"') {
            for (i++; i < len; i++) {
                if (in[i] != ' ') {
                    return HTTP_SF_TRAILING;
                }
            }
            *out_len = o;
            return HTTP_SF_OK;
        } else if (c < 0x20 || c > 0x7e) {
            return HTTP_SF_BAD_CHAR;
        } else {
            out[o++] = (char)c;
        }
    }
    return HTTP_SF_UNTERMINATED;
}

bool http_header_item(const char *v, size_t len, char *out, const char **val, size_t *val_len,
                      const char **why)
{
    size_t n = 0;
    int rc = http_sf_string(v, len, out, &n);
    *why = NULL;
    if (rc == HTTP_SF_NOT_STRING) {
        *val = v;
        *val_len = len;
        return true;
    }
    if (rc != HTTP_SF_OK) {
        *why = http_sf_strerror(rc);
        *val = NULL;
        *val_len = 0;
        return false;
    }
    *val = out;
    *val_len = n;
    return true;
}

bool http_item_out(const char *v, size_t len, char *out, size_t *out_len)
{
    *out_len = 0;
    if (len == 0) {
        return false;
    }
    if (key_validate((const uint8_t *)v, len, KEY_MAX_LEN) == KEY_OK) {
        memcpy(out, v, len);
        *out_len = len;
        return true;
    }
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c > 0x7e) {
            return false;
        }
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
        }
        out[o++] = (char)c;
    }
    out[o++] = '"';
    *out_len = o;
    return true;
}

void http_key_why(const uint8_t *key, size_t len, size_t max_len, char *buf, size_t n)
{
    if (max_len == 0 || max_len > KEY_MAX_LEN) {
        max_len = KEY_MAX_LEN;
    }
    int rc = key_validate(key, len, max_len);
    if (rc == KEY_OK) {
        if (n > 0) {
            buf[0] = '\0'; /* per request: no formatting */
        }
    } else if (rc == KEY_MISSING) {
        snprintf(buf, n, "the key is missing or empty (Idempotency-Key)");
    } else if (len > max_len) {
        snprintf(buf, n, "the key is %zu bytes, over the limit of %zu bytes", len, max_len);
    } else {
        size_t at = 0;
        while (at < len && key_validate(key + at, 1, 1) == KEY_OK) {
            at++;
        }
        snprintf(buf, n, "the key has a byte outside [A-Za-z0-9._:~-] (at offset %zu)", at);
    }
}

const char *http_problem_title(const char *code, const char *reason)
{
    static const char *const titles[][2] = {
        {"invalid_request", "The request is invalid"},
        {"invalid_path", "The path is refused"},
        {"idempotency_key_missing", "The Idempotency-Key is missing"},
        {"idempotency_key_invalid", "The Idempotency-Key is invalid"},
        {"unauthenticated", "Unauthenticated"},
        {"forbidden", "Forbidden"},
        {"not_found", "Not found"},
        {"method_not_allowed", "Method not allowed"},
        {"idempotency_request_in_progress", "A request with this key is in progress"},
        {"idempotency_key_reused", "The key was used with a different request"},
        {"idempotency_lease_expired", "The holder's lease expired"},
        {"idempotency_outcome_unknown", "The outcome of an earlier attempt is unknown"},
        {"idempotency_lease_lost", "The token is not the current holder's"},
        {"idempotency_key_expired", "The key expired"},
        {"payload_too_large", "The body is too large"},
        {"idempotency_quota_exceeded", "The tenant's quota is exhausted"},
        {"internal", "Internal error"},
        {"upstream_unavailable", "The upstream is unavailable"},
        {"upstream_response_too_large", "The upstream's answer is too large"},
        {"idempotency_unavailable", "The idempotency service is unavailable"},
        {"upstream_timeout", "The upstream did not answer in time"},
    };
    for (size_t i = 0; code != NULL && i < sizeof titles / sizeof titles[0]; i++) {
        if (strcmp(code, titles[i][0]) == 0) {
            return titles[i][1];
        }
    }
    return reason != NULL && reason[0] != '\0' ? reason : "Error";
}

json_t *http_problem(int status, const char *code, const char *message, const char *rid,
                     size_t rid_len, const char *path, size_t path_len)
{
    json_t *o = json_object();
    if (o == NULL) {
        return NULL;
    }
    const char *title = http_problem_title(code, NULL);
    char type[128];
    snprintf(type, sizeof type, "%s%s", HTTP_PROBLEM_TYPE_BASE, code);
    json_t *detail = json_string(message != NULL ? message : title);
    if (detail == NULL) { /* not UTF-8: the title instead */
        detail = json_string(title);
    }
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "title", json_string(title));
    json_object_set_new(o, "status", json_integer(status));
    json_object_set(o, "detail", detail);
    (void)path;
    (void)path_len;
    bool ridOk = rid != NULL && rid_len > 0 && rid_len <= 64;
    for (size_t i = 0; ridOk && i < rid_len; i++) { /* the ids the node makes or takes */
        ridOk = isalnum((unsigned char)rid[i]) || rid[i] == '-' || rid[i] == '_' || rid[i] == '.';
    }
    if (ridOk) {
        char inst[96];
        snprintf(inst, sizeof inst, "urn:idemd:request:%.*s", (int)rid_len, rid);
        json_object_set_new(o, "instance", json_string(inst));
    }
    json_object_set_new(o, "code", json_string(code));
    json_object_set_new(o, "message", detail); /* the older name of detail */
    json_object_set_new(o, "request_id", json_stringn(rid != NULL ? rid : "", rid_len));
    return o;
}

bool http_token_from_json(const json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0) {
            return false;
        }
        *out = (uint64_t)json_integer_value(v);
        return true;
    }
    if (!json_is_string(v)) {
        return false;
    }
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > 20) {
        return false;
    }
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
        uint64_t d = (uint64_t)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10) {
            return false;
        }
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

void http_token_str(uint64_t token, char buf[21])
{
    /* Two per JSON answer: digits by hand, not through printf's machinery. */
    buf[dec_u64(buf, token)] = '\0';
}
