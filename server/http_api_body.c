/* http_api_body: the JSON API's request bodies to an Idem__Request's operation (see
 * http_api_body.h). */
#include "http_api_body.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"
#include "http_conv.h"
#include "xmalloc.h"

static bool hexVal(char c, uint8_t *v)
{
    if (c >= '0' && c <= '9') {
        *v = (uint8_t)(c - '0');
    } else if (c >= 'a' && c <= 'f') {
        *v = (uint8_t)(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
        *v = (uint8_t)(c - 'A' + 10);
    } else {
        return false;
    }
    return true;
}

/* An optional non-negative integer field. False when present with the wrong type. */
static bool getU64(json_t *o, const char *name, uint64_t *out, bool *present)
{
    json_t *v = json_object_get(o, name);
    if (present) {
        *present = v != NULL;
    }
    if (v == NULL) {
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return false;
    }
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* An optional string field without NUL bytes. False when present with the wrong type. */
static bool getStr(json_t *o, const char *name, const char **out)
{
    json_t *v = json_object_get(o, name);
    *out = NULL;
    if (v == NULL) {
        return true;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* The first member of object o whose name is not in known[0..n): NULL when there is none,
 * else what to answer, naming it (prefix + name) in sc->why when the name is at most 64 bytes
 * of printable ASCII (jansson escapes it in the answer; it is never logged). */
static const char *unknownField(json_t *o, const char *const *known, size_t n, const char *prefix,
                                struct http_api_body *sc)
{
    const char *field;
    json_t *fval;
    json_object_foreach(o, field, fval)
    {
        bool ok = false;
        for (size_t i = 0; i < n && !ok; i++) {
            ok = strcmp(field, known[i]) == 0;
        }
        if (ok) {
            continue;
        }
        size_t len = strlen(field);
        bool shown = len <= 64;
        for (size_t i = 0; shown && i < len; i++) {
            shown = field[i] >= 0x20 && field[i] < 0x7f;
        }
        if (!shown) {
            return "unknown field (its name is longer than 64 bytes or not printable ASCII)";
        }
        snprintf(sc->why, sizeof sc->why, "unknown field \"%s%s\"", prefix, field);
        return sc->why;
    }
    return NULL;
}

/* Fills a StoredResponse from {"status", "headers", "body"} or, for a body kept elsewhere,
 * {"status", "headers", "body_ref", "body_sha256" (64 hex digits)}, as the RPC takes them
 * (the service checks the combination: fsm_response_valid). False on a wrong shape or a
 * field it does not know (a misspelt one stored a response without it). */
static bool parseStored(json_t *o, Idem__StoredResponse *r, struct http_api_body *sc)
{
    if (!json_is_object(o)) {
        return false;
    }
    const char *ref = NULL, *sha = NULL;
    if (!getStr(o, "body_ref", &ref) || !getStr(o, "body_sha256", &sha)) {
        return false;
    }
    if (ref != NULL) {
        r->body_ref = (char *)ref;
    }
    if (sha != NULL) {
        if (strlen(sha) != 64) {
            return false;
        }
        for (size_t i = 0; i < 32; i++) {
            int hi = OPENSSL_hexchar2int((unsigned char)sha[2 * i]);
            int lo = OPENSSL_hexchar2int((unsigned char)sha[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                return false;
            }
            sc->sha[i] = (uint8_t)(hi << 4 | lo);
        }
        r->body_sha256.data = sc->sha;
        r->body_sha256.len = 32;
    }
    uint64_t status = 0;
    bool has_status = false;
    if (!getU64(o, "status", &status, &has_status) || !has_status || status < 200 || status > 599) {
        return false;
    }
    r->status = (uint32_t)status;
    json_t *hs = json_object_get(o, "headers");
    if (hs != NULL && !json_is_null(hs)) {
        if (!json_is_object(hs)) {
            return false;
        }
        size_t n = json_object_size(hs), total = 0;
        const char *k;
        json_t *v;
        json_object_foreach(hs, k, v)
        {
            if (!json_is_string(v) || !fsm_header_name_ok(k) ||
                !fsm_header_value_ok((const uint8_t *)json_string_value(v),
                                     json_string_length(v))) {
                return false;
            }
            total += strlen(k) + 1;
        }
        sc->hdrs = xcalloc(n ? n : 1, sizeof(*sc->hdrs));
        sc->hdrp = xcalloc(n ? n : 1, sizeof(*sc->hdrp));
        sc->names = xmalloc(total ? total : 1);
        size_t i = 0, off = 0;
        json_object_foreach(hs, k, v)
        {
            char *name = sc->names + off;
            size_t kl = strlen(k);
            for (size_t c = 0; c <= kl; c++) {
                name[c] = (char)((k[c] >= 'A' && k[c] <= 'Z') ? k[c] - 'A' + 'a' : k[c]);
            }
            off += kl + 1;
            /* JSON_REJECT_DUPLICATES compares names as written: "Content-Type" and
             * "content-type" would both be stored and both replayed. */
            for (size_t j = 0; j < i; j++) {
                if (strcmp(sc->hdrs[j].name, name) == 0) {
                    return false;
                }
            }
            idem__header__init(&sc->hdrs[i]);
            sc->hdrs[i].name = name;
            sc->hdrs[i].value.data = (uint8_t *)json_string_value(v);
            sc->hdrs[i].value.len = json_string_length(v);
            sc->hdrp[i] = &sc->hdrs[i];
            i++;
        }
        r->n_headers = n;
        r->headers = sc->hdrp;
    }
    json_t *b = json_object_get(o, "body");
    if (b != NULL && !json_is_null(b)) {
        if (!json_is_string(b)) {
            return false;
        }
        r->body.data = (uint8_t *)json_string_value(b);
        r->body.len = json_string_length(b);
    }
    return true;
}

/* The optional list `name` (fingerprint_fields, or fingerprint_ignore when ignore) of the
 * claim's request object rq: JSON Pointers into ptrs[0..*n) (FP_POINTERS_MAX, borrowed from
 * the body); null is no list. NULL, or a refusal: a static text, or sc->why naming the
 * pointer by its index and the rule it breaks (never its bytes). */
static const char *getPointers(json_t *rq, const char *name, bool ignore, const char **ptrs,
                               size_t *n, struct http_api_body *sc)
{
    json_t *v = json_object_get(rq, name);
    *n = 0;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    const char *shape = ignore ? "request.fingerprint_ignore must be an array of at most 32 "
                                 "JSON pointer strings"
                               : "request.fingerprint_fields must be an array of at most 32 "
                                 "JSON pointer strings";
    if (!json_is_array(v) || json_array_size(v) > FP_POINTERS_MAX) {
        return shape;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) {
            return shape;
        }
        const char *rule = fp_pointer_check(json_string_value(s), json_string_length(s), ignore);
        if (rule != NULL) {
            snprintf(sc->why, sizeof sc->why, "request.%s[%zu]: %s", name, i, rule);
            return sc->why;
        }
        ptrs[i] = json_string_value(s);
    }
    *n = json_array_size(v);
    return NULL;
}

/* The fingerprint of the claim's request object rq (method, path, optional body and pointer
 * lists) for tenant t into fp, as proxy mode computes it for that request: a JSON value in
 * body is hashed as canonical JSON (json_dumps keeps every number as parsed: an integer's
 * digits, a real's 17 significant digits, which fp_compute reads back to the same double), a
 * string as its raw bytes. NULL, or a refusal. */
static const char *requestFingerprint(json_t *rq, const struct config_tenant *t, uint8_t fp[FP_LEN],
                                      struct http_api_body *sc)
{
    const char *method = NULL, *path = NULL, *bad;
    const char *fields[FP_POINTERS_MAX], *ignore[FP_POINTERS_MAX];
    if (!json_is_object(rq) || !getStr(rq, "method", &method) || !getStr(rq, "path", &path) ||
        method == NULL || path == NULL || method[0] == '\0' || path[0] == '\0') {
        return "request must be an object with method and path strings";
    }
    struct fp_input in = {.method = method, .path = path, .tenant = t->name};
    if ((bad = getPointers(rq, "fingerprint_fields", false, fields, &in.n_fields, sc)) != NULL ||
        (bad = getPointers(rq, "fingerprint_ignore", true, ignore, &in.n_ignore, sc)) != NULL) {
        return bad;
    }
    in.fields = fields;
    in.ignore = ignore;
    json_t *body = json_object_get(rq, "body");
    if (body != NULL && json_is_string(body)) {
        in.content_type = "text/plain";
        in.body = (const uint8_t *)json_string_value(body);
        in.body_len = json_string_length(body);
    } else if (body != NULL) {
        sc->canon = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        if (sc->canon == NULL) {
            return "request body cannot be encoded";
        }
        in.content_type = "application/json";
        in.body = (const uint8_t *)sc->canon;
        in.body_len = strlen(sc->canon);
    }
    if (fp_compute(&in, fp) != FP_OK) {
        return "cannot compute the fingerprint";
    }
    return NULL;
}

/* The claim body: fingerprint or request, and the optional fields. 0, or a message. */
static const char *parseClaim(json_t *b, const struct config_tenant *t, Idem__ClaimRequest *cl,
                              uint8_t fp[FP_LEN], struct http_api_body *sc)
{
    static const char *const known[] = {"fingerprint", "request", "attempt_id",
                                        "lease_ms",    "ttl_ms",  "policy"};
    static const char *const knownRq[] = {"method", "path", "body", "fingerprint_fields",
                                          "fingerprint_ignore"};
    const char *fph = NULL, *bad = unknownField(b, known, 6, "", sc);
    json_t *rq = json_object_get(b, "request");
    if (bad != NULL ||
        (json_is_object(rq) && (bad = unknownField(rq, knownRq, 5, "request.", sc)))) {
        return bad;
    }
    if (!getStr(b, "fingerprint", &fph)) {
        return "fingerprint must be a string";
    }
    if ((fph == NULL) == (rq == NULL)) {
        return "exactly one of fingerprint and request is required";
    }
    if (fph != NULL) {
        if (strlen(fph) != 2 * FP_LEN) {
            return "fingerprint must be 64 hex digits";
        }
        for (size_t i = 0; i < FP_LEN; i++) {
            uint8_t hi, lo;
            if (!hexVal(fph[2 * i], &hi) || !hexVal(fph[2 * i + 1], &lo)) {
                return "fingerprint must be 64 hex digits";
            }
            fp[i] = (uint8_t)(hi << 4 | lo);
        }
    } else {
        const char *bad_rq = requestFingerprint(rq, t, fp, sc);
        if (bad_rq != NULL) {
            return bad_rq;
        }
    }
    cl->fingerprint.data = fp;
    cl->fingerprint.len = FP_LEN;
    const char *attempt = NULL, *policy = NULL;
    if (!getU64(b, "lease_ms", &cl->lease_ms, NULL) || !getU64(b, "ttl_ms", &cl->ttl_ms, NULL)) {
        return "lease_ms and ttl_ms must be non-negative integers";
    }
    if (!getStr(b, "attempt_id", &attempt) ||
        (attempt != NULL && (attempt[0] == '\0' || strlen(attempt) > HTTP_ATTEMPT_ID_MAX))) {
        /* An empty one would pass for none, and the claim would get a random id: its retry
         * with the same body would then find the key in progress instead of its own lease. */
        return "attempt_id must be a string of 1 to 64 bytes";
    }
    if (attempt != NULL) {
        cl->attempt_id.data = (uint8_t *)attempt;
        cl->attempt_id.len = strlen(attempt);
    }
    if (!getStr(b, "policy", &policy)) {
        return "policy must be \"conflict\" or \"takeover\"";
    }
    if (policy != NULL) {
        if (strcmp(policy, "conflict") == 0) {
            cl->policy = IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
        } else if (strcmp(policy, "takeover") == 0) {
            cl->policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER;
        } else {
            return "policy must be \"conflict\" or \"takeover\"";
        }
    }
    return NULL;
}

/* The token field, required: a JSON integer or a string of decimal digits (http_conv.h). */
static bool getToken(json_t *b, uint64_t *token)
{
    json_t *v = json_object_get(b, "token");
    return v != NULL && http_token_from_json(v, token);
}

#define TOKEN_BAD "token must be a non-negative integer or a string of decimal digits"

/* The complete body: token, outcome and the optional response. NULL, or a message. */
static const char *parseComplete(json_t *b, Idem__CompleteRequest *co, Idem__StoredResponse *sr,
                                 struct http_api_body *sc)
{
    static const char *const known[] = {"token", "outcome", "response"};
    static const char *const knownR[] = {"status", "headers", "body", "body_ref", "body_sha256"};
    const char *oc = NULL, *bad = unknownField(b, known, 3, "", sc);
    json_t *r = json_object_get(b, "response");
    if (bad != NULL || (json_is_object(r) && (bad = unknownField(r, knownR, 5, "response.", sc)))) {
        return bad;
    }
    if (!getToken(b, &co->token)) {
        return TOKEN_BAD;
    } else if (!getStr(b, "outcome", &oc)) {
        return "outcome must be a string";
    } else if (oc == NULL || strcmp(oc, "succeeded") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    } else if (strcmp(oc, "failed_final") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    } else if (strcmp(oc, "unknown") == 0) {
        co->outcome = IDEM__COMPLETION__COMPLETION_UNKNOWN;
    } else {
        return "outcome must be succeeded, failed_final or unknown";
    }
    if (r != NULL && !json_is_null(r)) {
        if (!parseStored(r, sr, sc)) {
            return "response must be {status, headers, body} or {status, headers, "
                   "body_ref, body_sha256 (64 hex digits)}, each header name once (any case)";
        }
        co->response = sr;
    }
    return NULL;
}

/* Parses the body as a JSON object into b->body. */
static bool parseBody(const char *body, size_t len, struct http_api_body *b)
{
    if (body == NULL || len == 0) {
        return false;
    }
    json_error_t e;
    b->body = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e);
    return b->body != NULL && json_is_object(b->body);
}

/* Fills rq with operation op on key kb from the parsed body b->body (none for a get). NULL,
 * or what is wrong with the body. */
static const char *build(Idem__Request__OpCase op, const struct config_tenant *t,
                         ProtobufCBinaryData kb, struct http_api_body *b, Idem__Request *rq)
{
    static const char *const knownRelease[] = {"token"};
    static const char *const knownRenew[] = {"token", "lease_ms"};
    const char *bad = NULL;
    switch (op) {
    case IDEM__REQUEST__OP_CLAIM:
        bad = parseClaim(b->body, t, &b->cl, b->fp, b);
        b->cl.key = kb;
        rq->op_case = IDEM__REQUEST__OP_CLAIM;
        rq->claim = &b->cl;
        break;
    case IDEM__REQUEST__OP_COMPLETE:
        bad = parseComplete(b->body, &b->co, &b->sr, b);
        b->co.key = kb;
        rq->op_case = IDEM__REQUEST__OP_COMPLETE;
        rq->complete = &b->co;
        break;
    case IDEM__REQUEST__OP_RELEASE:
        if ((bad = unknownField(b->body, knownRelease, 1, "", b)) == NULL &&
            !getToken(b->body, &b->re.token)) {
            bad = TOKEN_BAD;
        }
        b->re.key = kb;
        rq->op_case = IDEM__REQUEST__OP_RELEASE;
        rq->release = &b->re;
        break;
    case IDEM__REQUEST__OP_RENEW:
        bad = unknownField(b->body, knownRenew, 2, "", b);
        if (bad == NULL && !getToken(b->body, &b->rn.token)) {
            bad = TOKEN_BAD;
        } else if (bad == NULL && !getU64(b->body, "lease_ms", &b->rn.lease_ms, NULL)) {
            bad = "lease_ms must be a non-negative integer";
        }
        b->rn.key = kb;
        rq->op_case = IDEM__REQUEST__OP_RENEW;
        rq->renew = &b->rn;
        break;
    default: /* IDEM__REQUEST__OP_GET */
        b->ge.key = kb;
        rq->op_case = IDEM__REQUEST__OP_GET;
        rq->get = &b->ge;
        break;
    }
    return bad;
}

bool http_api_parse_body(Idem__Request__OpCase op, const char *body, size_t len,
                         const struct config_tenant *t, ProtobufCBinaryData key, Idem__Request *rq,
                         struct http_api_body *b, const char **why)
{
    memset(b, 0, sizeof(*b));
    idem__claim_request__init(&b->cl);
    idem__complete_request__init(&b->co);
    idem__stored_response__init(&b->sr);
    idem__release_request__init(&b->re);
    idem__renew_request__init(&b->rn);
    idem__get_request__init(&b->ge);
    if (op != IDEM__REQUEST__OP_CLAIM && op != IDEM__REQUEST__OP_COMPLETE &&
        op != IDEM__REQUEST__OP_RELEASE && op != IDEM__REQUEST__OP_RENEW &&
        op != IDEM__REQUEST__OP_GET) {
        *why = "not an operation of the JSON API";
        return false;
    }
    if (op != IDEM__REQUEST__OP_GET && !parseBody(body, len, b)) {
        *why = "the body must be a JSON object";
        return false;
    }
    *why = build(op, t, key, b, rq);
    return *why == NULL;
}

void http_api_body_free(struct http_api_body *b)
{
    json_decref(b->body);
    free(b->canon);
    free(b->hdrs);
    free(b->hdrp);
    free(b->names);
    b->body = NULL;
    b->canon = NULL;
    b->hdrs = NULL;
    b->hdrp = NULL;
    b->names = NULL;
}
