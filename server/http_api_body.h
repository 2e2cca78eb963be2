/* http_api_body: the JSON API's request bodies (docs/contract.md) to the operation of an
 * Idem__Request. Pure: no h2o, no service, no clock; what http_api.c calls for each JSON API
 * request once it knows the tenant and the key, and what tests/fuzz/fuzz_http_body drives.
 * The body is untrusted bytes: parsed by jansson (duplicate keys refused), every field
 * checked for its type and range; the stored response of a complete is checked for its shape
 * here, for its combination by the service (fsm_response_valid). */
#ifndef IDEM_SERVER_HTTP_API_BODY_H
#define IDEM_SERVER_HTTP_API_BODY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "fingerprint.h"
#include "idem.pb-c.h"

#define HTTP_ATTEMPT_ID_MAX 64

/* What a parsed body's operation borrows (the Idem__Request points into it) until the
 * request was handed on: the parsed JSON, the buffers built from it, and the operations. */
struct http_api_body {
    json_t *body;
    char *canon; /* canonical JSON of a claim's request body */
    Idem__Header *hdrs;
    Idem__Header **hdrp;
    char *names;     /* lower-cased header names, NUL-separated */
    uint8_t sha[32]; /* a stored response's body_sha256 */
    Idem__ClaimRequest cl;
    Idem__CompleteRequest co;
    Idem__StoredResponse sr;
    Idem__ReleaseRequest re;
    Idem__RenewRequest rn;
    Idem__GetRequest ge;
    uint8_t fp[FP_LEN];
    char why[112]; /* a refusal that names an unknown field, or a bad fingerprint pointer */
};

/* Parses the `len` bytes at `body` (not NUL-terminated; ignored for a get) as the body of
 * operation `op` (IDEM__REQUEST__OP_CLAIM, _COMPLETE, _RELEASE, _RENEW or _GET) of tenant t
 * on key `key` (borrowed), and points rq's operation (op_case and its message) at what it
 * built in *b, which it initialises first. True, or false with *why set when the body is
 * refused: a static text, or b->why naming a member the operation does not know (a name of
 * at most 64 printable ASCII bytes; the only body bytes a refusal quotes) or a claim's
 * fingerprint pointer that breaks a rule ("request.fingerprint_ignore[3]: " and the rule
 * fp_pointer_check() names; never the pointer's bytes); rq's operation may then be set too.
 * A claim's `request` may carry `fingerprint_fields` and `fingerprint_ignore`, arrays of at
 * most FP_POINTERS_MAX JSON Pointers (fingerprint.h), null for none. A token (complete, release,
 * renew) is a JSON integer or a string of decimal digits. http_api_body_free(b) afterwards in both
 * cases, once rq is no longer used. */
bool http_api_parse_body(Idem__Request__OpCase op, const char *body, size_t len,
                         const struct config_tenant *t, ProtobufCBinaryData key, Idem__Request *rq,
                         struct http_api_body *b, const char **why);

/* Frees what a parse allocated; *b may not be used again before the next parse. */
void http_api_body_free(struct http_api_body *b);

#endif
