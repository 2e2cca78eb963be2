/* fuzz_http_api_body: http_api_parse_body() (server/http_api_body.h) on an untrusted JSON API
 * request body, as the gateway's http_api.c calls it once it knows the tenant and the key:
 * the claim (fingerprint or request), complete (outcome, and the stored response with its
 * headers, body or body_ref and body_sha256), release, renew and get bodies.
 *
 * Input: the first byte names the operation ('c' claim, 'o' complete, 'r' release, 'n'
 * renew, 'g' get; another byte: its value modulo 5 in that order); the rest is the body.
 *
 * Invariants (abort() on violation):
 * - the answer is true exactly when *why is NULL; a refusal's why is a non-empty short text,
 *   the same from a second parse: a static text (the same pointer from a second parse whose
 *   memory is all still held, so it is no copy of the body's bytes) or the parse's own b->why
 *   naming an unknown member, a name of at most 64 printable ASCII bytes;
 * - a member the operation does not know is refused, named;
 * - a body that is not a JSON object (jansson, duplicate keys refused) is refused as such
 *   for every operation but get, which takes any body;
 * - an accepted body gives rq the operation asked for, on the key given, and the same
 *   packed Request twice; that Request packs, decodes again, and repacks to the same bytes
 *   (every pointer it borrows is alive: ASan);
 * - an accepted claim carries a 32-byte fingerprint (the given hex digits decoded, when
 *   given), an attempt id of at most 64 bytes and a policy it named; release and renew carry
 *   the body's token (a JSON integer, or a string of decimal digits); an accepted body has
 *   no member its operation does not know; an accepted complete's stored response has a
 *   status in 200..599, lower-case header names the state machine accepts (fsm_header_name_ok), as many as the
 *   body's headers object has, values it accepts, and a body_sha256 of 0 or 32 bytes; the
 *   service's own check of it (fsm_response_valid) gives a reason when it refuses;
 * - http_api_body_free() frees everything on every path (LeakSanitizer). */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"
#include "fsm_internal.h"
#include "http_api_body.h"

/* Whether why is a refusal of a claim's fingerprint pointer: "request.fingerprint_fields[I]: "
 * or "request.fingerprint_ignore[I]: " (I < 32) and then a rule of fp_pointer_check(), which
 * never quotes the pointer. */
static bool pointerReason(const char *why)
{
    static const char *const lists[] = {"request.fingerprint_fields[",
                                        "request.fingerprint_ignore["};
    for (size_t l = 0; l < 2; l++) {
        size_t n = strlen(lists[l]);
        if (strncmp(why, lists[l], n) != 0) {
            continue;
        }
        char *end;
        unsigned long i = strtoul(why + n, &end, 10);
        if (end == why + n || i >= FP_POINTERS_MAX || strncmp(end, "]: ", 3) != 0) {
            return false;
        }
        /* the rule is one of fp_pointer_check's texts: found by asking it about bad pointers */
        static char big[FP_POINTER_MAX_LEN + 2];
        memset(big, '/', sizeof big - 1);
        const char *texts[] = {fp_pointer_check("a", 1, false), fp_pointer_check("", 0, true),
                               fp_pointer_check("/~", 2, false),
                               fp_pointer_check("/\xff", 2, false),
                               fp_pointer_check(big, sizeof big - 1, false)};
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            if (texts[k] != NULL && strcmp(end + 3, texts[k]) == 0) {
                return true;
            }
        }
        return false;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_http_api_body: invariant violated: %s\n", what);
    abort();
}

static const Idem__Request__OpCase ops[5] = {IDEM__REQUEST__OP_CLAIM, IDEM__REQUEST__OP_COMPLETE,
                                             IDEM__REQUEST__OP_RELEASE, IDEM__REQUEST__OP_RENEW,
                                             IDEM__REQUEST__OP_GET};

static Idem__Request__OpCase opOf(uint8_t b)
{
    static const char letters[] = "conrg";
    const char *l = b != 0 ? strchr(letters, b) : NULL;
    return ops[l != NULL ? (size_t)(l - letters) : b % 5];
}

static uint8_t *pack(const Idem__Request *rq, size_t *len)
{
    *len = idem__request__get_packed_size(rq);
    uint8_t *p = malloc(*len ? *len : 1);
    if (p == NULL) {
        abort();
    }
    if (idem__request__pack(rq, p) != *len) {
        fail("pack wrote another size than get_packed_size");
    }
    return p;
}

/* The operation's key, as rq holds it. */
static ProtobufCBinaryData keyOf(const Idem__Request *rq)
{
    switch (rq->op_case) {
    case IDEM__REQUEST__OP_CLAIM:
        return rq->claim->key;
    case IDEM__REQUEST__OP_COMPLETE:
        return rq->complete->key;
    case IDEM__REQUEST__OP_RELEASE:
        return rq->release->key;
    case IDEM__REQUEST__OP_RENEW:
        return rq->renew->key;
    case IDEM__REQUEST__OP_GET:
        return rq->get->key;
    default:
        fail("an accepted body left no operation");
        abort();
    }
}

static int hexDigit(char c)
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

static void checkClaim(const Idem__ClaimRequest *cl, json_t *ref)
{
    if (cl->fingerprint.len != FP_LEN || cl->fingerprint.data == NULL) {
        fail("an accepted claim without a 32-byte fingerprint");
    }
    json_t *fp = json_object_get(ref, "fingerprint");
    if (fp != NULL) {
        const char *h = json_string_value(fp);
        if (h == NULL || strlen(h) != 2 * FP_LEN) {
            fail("a claim accepted with a fingerprint that is not 64 characters");
        }
        for (size_t i = 0; i < FP_LEN; i++) {
            int hi = hexDigit(h[2 * i]), lo = hexDigit(h[2 * i + 1]);
            if (hi < 0 || lo < 0 || cl->fingerprint.data[i] != (uint8_t)(hi << 4 | lo)) {
                fail("a claim's fingerprint is not its hex digits decoded");
            }
        }
    }
    if (cl->attempt_id.len > HTTP_ATTEMPT_ID_MAX) {
        fail("a claim accepted with an attempt id over 64 bytes");
    }
    json_t *pol = json_object_get(ref, "policy");
    Idem__LeasePolicy want = IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED;
    if (pol != NULL) {
        want = strcmp(json_string_value(pol), "takeover") == 0
                   ? IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
                   : IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
    }
    if (cl->policy != want) {
        fail("a claim's policy is not the one its body named");
    }
}

static void checkStored(const Idem__StoredResponse *sr, json_t *ref)
{
    if (sr->status < 200 || sr->status > 599) {
        fail("a stored response accepted with a status outside 200..599");
    }
    json_t *hs = json_object_get(ref, "headers");
    size_t n = json_is_object(hs) ? json_object_size(hs) : 0;
    if (sr->n_headers != n || (n > 0 && sr->headers == NULL)) {
        fail("a stored response's header count is not its headers object's");
    }
    for (size_t i = 0; i < sr->n_headers; i++) {
        const Idem__Header *h = sr->headers[i];
        if (!fsm_header_name_ok(h->name) || !fsm_header_value_ok(h->value.data, h->value.len)) {
            fail("a stored response's header the state machine refuses");
        }
        for (const char *c = h->name; *c != '\0'; c++) {
            if (*c >= 'A' && *c <= 'Z') {
                fail("a stored response's header name is not lower case");
            }
        }
    }
    if (sr->body_sha256.len != 0 && sr->body_sha256.len != 32) {
        fail("a stored response's body_sha256 is neither absent nor 32 bytes");
    }
    const char *why = NULL;
    if (!fsm_response_valid(sr, &why) && why == NULL) {
        fail("fsm_response_valid refused without a reason");
    }
}

/* Whether every member of the accepted body `ref` is one its operation knows. */
static void checkKnown(Idem__Request__OpCase op, json_t *ref)
{
    static const char *const known[][7] = {
        {"fingerprint", "request", "attempt_id", "lease_ms", "ttl_ms", "policy", NULL},
        {"token", "outcome", "response", NULL},
        {"token", NULL},
        {"token", "lease_ms", NULL},
    };
    size_t k = op == IDEM__REQUEST__OP_CLAIM      ? 0
               : op == IDEM__REQUEST__OP_COMPLETE ? 1
               : op == IDEM__REQUEST__OP_RELEASE  ? 2
               : op == IDEM__REQUEST__OP_RENEW    ? 3
                                                  : 4;
    const char *name;
    json_t *v;
    json_object_foreach(k < 4 ? ref : NULL, name, v)
    {
        bool ok = false;
        for (size_t i = 0; known[k][i] != NULL && !ok; i++) {
            ok = strcmp(name, known[k][i]) == 0;
        }
        if (!ok) {
            fail("a body accepted with a member its operation does not know");
        }
    }
}

/* What an accepted body must have given, against the reference parse `ref`. */
static void checkAccepted(Idem__Request__OpCase op, const Idem__Request *rq, json_t *ref,
                          ProtobufCBinaryData key)
{
    if (rq->op_case != op) {
        fail("the request's operation is not the one asked for");
    }
    checkKnown(op, ref);
    ProtobufCBinaryData k = keyOf(rq);
    if (k.data != key.data || k.len != key.len) {
        fail("the request's key is not the one given");
    }
    uint64_t token = 0;
    json_t *tv = op == IDEM__REQUEST__OP_GET ? NULL : json_object_get(ref, "token");
    if (tv != NULL && json_is_integer(tv)) {
        token = (uint64_t)json_integer_value(tv);
    } else if (tv != NULL && json_is_string(tv)) {
        const char *d = json_string_value(tv);
        if (json_string_length(tv) < 1 || json_string_length(tv) > 20 ||
            strspn(d, "0123456789") != json_string_length(tv)) {
            fail("a token accepted from a string that is not 1-20 decimal digits");
        }
        errno = 0;
        unsigned long long x = strtoull(d, NULL, 10);
        if (errno != 0) {
            fail("a token accepted from a string past 64 bits");
        }
        token = (uint64_t)x;
    }
    switch (op) {
    case IDEM__REQUEST__OP_CLAIM:
        checkClaim(rq->claim, ref);
        break;
    case IDEM__REQUEST__OP_COMPLETE:
        if (rq->complete->token != token || tv == NULL) {
            fail("a complete's token is not its body's");
        }
        if (rq->complete->response != NULL) {
            checkStored(rq->complete->response, json_object_get(ref, "response"));
        }
        break;
    case IDEM__REQUEST__OP_RELEASE:
        if (rq->release->token != token || tv == NULL) {
            fail("a release's token is not its body's");
        }
        break;
    case IDEM__REQUEST__OP_RENEW:
        if (rq->renew->token != token || tv == NULL) {
            fail("a renew's token is not its body's");
        }
        break;
    default:
        break;
    }
}

/* Packs rq, decodes the bytes and packs them again: the same bytes. */
static void roundTrip(const uint8_t *p1, size_t n1)
{
    Idem__Request *again = idem__request__unpack(NULL, n1, p1);
    if (again == NULL) {
        fail("a packed request does not decode");
    }
    size_t n2;
    uint8_t *p2 = pack(again, &n2);
    if (n1 != n2 || memcmp(p1, p2, n1) != 0) {
        fail("repacking the decoded request changed its bytes");
    }
    free(p2);
    idem__request__free_unpacked(again, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    Idem__Request__OpCase op = opOf(data[0]);
    size_t len = size - 1;
    /* Private copies, without a NUL: ASan sees any read past the body. */
    char *body1 = malloc(len ? len : 1), *body2 = malloc(len ? len : 1);
    if (body1 == NULL || body2 == NULL) {
        abort();
    }
    memcpy(body1, data + 1, len);
    memcpy(body2, data + 1, len);

    static struct config_tenant tenant = {.name = "demo", .key_max_len = 255};
    static uint8_t keyBytes[] = "order-1";
    ProtobufCBinaryData key = {sizeof keyBytes - 1, keyBytes};

    Idem__Request rq1 = IDEM__REQUEST__INIT, rq2 = IDEM__REQUEST__INIT;
    struct http_api_body b1, b2;
    const char *why1 = (const char *)1, *why2 = (const char *)1;
    bool ok1 = http_api_parse_body(op, len ? body1 : NULL, len, &tenant, key, &rq1, &b1, &why1);
    bool ok2 = http_api_parse_body(op, len ? body2 : NULL, len, &tenant, key, &rq2, &b2, &why2);
    if (ok1 != (why1 == NULL) || ok2 != (why2 == NULL)) {
        fail("the answer does not agree with why");
    }
    bool own1 = !ok1 && why1 >= b1.why && why1 < b1.why + sizeof b1.why;
    bool own2 = !ok2 && why2 >= b2.why && why2 < b2.why + sizeof b2.why;
    if (ok1 != ok2 || own1 != own2 || (!own1 && why1 != why2) ||
        (own1 && strcmp(why1, why2) != 0)) {
        fail("two parses of the same body differ (or a reason is not a static text)");
    }
    if (!ok1 && (why1[0] == '\0' || strlen(why1) > 200)) {
        fail("a refusal's reason is empty or not a short text");
    }
    if (own1 && (strncmp(why1, "unknown field \"", 15) != 0 || strlen(why1) > 15 + 9 + 64 + 1) &&
        !pointerReason(why1)) {
        fail("a reason of the parse's own is not an unknown field's, named in 64 bytes, nor a "
             "fingerprint pointer's rule");
    }
    for (size_t i = 0; own1 && why1[i] != '\0'; i++) {
        if (why1[i] < 0x20 || why1[i] >= 0x7f) {
            fail("an unknown field's name repeated with a byte outside printable ASCII");
        }
    }

    /* The reference: whether the body is a JSON object at all. */
    json_error_t e;
    json_t *ref = len ? json_loadb(body1, len, JSON_REJECT_DUPLICATES, &e) : NULL;
    bool object = ref != NULL && json_is_object(ref);
    if (op == IDEM__REQUEST__OP_GET) {
        if (!ok1) {
            fail("a get was refused for its body");
        }
    } else if (!object && (ok1 || strcmp(why1, "the body must be a JSON object") != 0)) {
        fail("a body that is not a JSON object was not refused as such");
    } else if (object && !ok1 && strcmp(why1, "the body must be a JSON object") == 0) {
        fail("a JSON object was refused as not one");
    }

    if (ok1) {
        checkAccepted(op, &rq1, ref, key);
        size_t n1, n2;
        uint8_t *p1 = pack(&rq1, &n1), *p2 = pack(&rq2, &n2);
        if (n1 != n2 || memcmp(p1, p2, n1) != 0) {
            fail("two parses of the same body pack differently");
        }
        roundTrip(p1, n1);
        free(p1);
        free(p2);
    }
    json_decref(ref);
    http_api_body_free(&b1);
    http_api_body_free(&b2);
    if (b1.body != NULL || b1.canon != NULL || b1.hdrs != NULL || b1.hdrp != NULL ||
        b1.names != NULL) {
        fail("http_api_body_free left a pointer behind");
    }
    free(body1);
    free(body2);
    return 0;
}
