/* json: building idemctl's JSON (jansson, every allocation checked) and the JSON views of
 * the nodes' answers: outcomes, records, stored responses, members. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "idemctl.h"

void jset(json_t *o, const char *k, json_t *v)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        outOom();
    }
}

json_t *jobj(void)
{
    json_t *o = json_object();
    if (o == NULL) {
        outOom();
    }
    return o;
}

json_t *jarr(void)
{
    json_t *a = json_array();
    if (a == NULL) {
        outOom();
    }
    return a;
}

void jpush(json_t *arr, json_t *v)
{
    if (v == NULL || json_array_append_new(arr, v) != 0) {
        outOom();
    }
}

json_t *jstr(const char *s)
{
    json_t *v = json_string(s != NULL ? s : "");
    if (v == NULL) {
        /* Not valid UTF-8: say so rather than print bytes. */
        v = json_string("(not UTF-8)");
    }
    return v;
}

json_t *ju64(uint64_t v)
{
    /* jansson integers are signed 64-bit; no idemd counter comes near 2^63. */
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

json_t *jhex(const uint8_t *d, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char *s = malloc(2 * n + 1);
    if (s == NULL) {
        outOom();
    }
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = hex[d[i] >> 4];
        s[2 * i + 1] = hex[d[i] & 15];
    }
    s[2 * n] = '\0';
    json_t *v = json_string(s);
    free(s);
    return v;
}

static json_t *jbase64(const uint8_t *d, size_t n)
{
    if (n > (size_t)INT32_MAX / 2) {
        return json_null();
    }
    char *s = malloc(4 * ((n + 2) / 3) + 1);
    if (s == NULL) {
        outOom();
    }
    EVP_EncodeBlock((unsigned char *)s, d, (int)n);
    json_t *v = json_string(s);
    free(s);
    return v;
}

/* Puts bytes under `key` as a string when they are UTF-8 (no bytes: ""), else under
 * `key`_base64 (and `key` is null). */
void jsetBytes(json_t *o, const char *key, const uint8_t *d, size_t n)
{
    /* protobuf-c leaves no pointer for empty bytes, and json_stringn(NULL, 0) fails. */
    json_t *v = n == 0 ? json_string("") : json_stringn((const char *)d, n);
    if (v != NULL) {
        jset(o, key, v);
        return;
    }
    char alt[64];
    snprintf(alt, sizeof alt, "%s_base64", key);
    jset(o, key, json_null());
    jset(o, alt, jbase64(d, n));
}

static const char *stateName(Idem__RecordState s)
{
    switch (s) {
    case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING:
        return "processing";
    case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED:
        return "completed";
    case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED:
        return "quarantined";
    case IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE:
        return "tombstone";
    case IDEM__RECORD_STATE__RECORD_STATE_RELEASED:
        return "released";
    default:
        return "unspecified";
    }
}

static json_t *completionJson(Idem__Completion c)
{
    switch (c) {
    case IDEM__COMPLETION__COMPLETION_SUCCEEDED:
        return json_string("succeeded");
    case IDEM__COMPLETION__COMPLETION_FAILED_FINAL:
        return json_string("failed_final");
    case IDEM__COMPLETION__COMPLETION_UNKNOWN:
        return json_string("unknown");
    default:
        return json_null();
    }
}

/* A stored response as JSON: status, headers, body reference and digest; the body itself
 * when `body`, its length when `size`. */
static json_t *storedResponseJsonAs(const Idem__StoredResponse *sr, bool body, bool size)
{
    json_t *o = jobj();
    jset(o, "status", ju64(sr->status));
    if (size) {
        jset(o, "body_bytes", ju64(sr->body.len));
    }
    if (body) {
        jsetBytes(o, "body", sr->body.data, sr->body.len);
    }
    if (sr->n_headers > 0) {
        json_t *hs = jarr();
        for (size_t i = 0; i < sr->n_headers; i++) {
            json_t *h = jobj();
            jset(h, "name", jstr(sr->headers[i]->name));
            jsetBytes(h, "value", sr->headers[i]->value.data, sr->headers[i]->value.len);
            jpush(hs, h);
        }
        jset(o, "headers", hs);
    }
    if (sr->body_ref != NULL && sr->body_ref[0] != '\0') {
        jset(o, "body_ref", jstr(sr->body_ref));
    }
    if (sr->body_sha256.len > 0) {
        jset(o, "body_sha256", jhex(sr->body_sha256.data, sr->body_sha256.len));
    }
    return o;
}

static json_t *storedResponseJson(const Idem__StoredResponse *sr)
{
    return storedResponseJsonAs(sr, true, false);
}

static json_t *recordJson(const Idem__Record *r)
{
    json_t *o = jobj();
    jset(o, "tenant", jstr(r->tenant));
    jsetBytes(o, "key", r->key.data, r->key.len);
    jset(o, "state", json_string(stateName(r->state)));
    jset(o, "fingerprint", jhex(r->fingerprint.data, r->fingerprint.len));
    jset(o, "token", ju64(r->token));
    jset(o, "created_at_ms", ju64(r->created_at_ms));
    jset(o, "lease_deadline_ms", ju64(r->lease_deadline_ms));
    jset(o, "expires_at_ms", ju64(r->expires_at_ms));
    jset(o, "completion", completionJson(r->completion));
    jset(o, "tombstone_ttl_ms", ju64(r->tombstone_ttl_ms));
    if (r->response.len > 0) {
        Idem__StoredResponse *sr =
            idem__stored_response__unpack(NULL, r->response.len, r->response.data);
        if (sr != NULL) {
            jset(o, "response", storedResponseJson(sr));
            idem__stored_response__free_unpacked(sr, NULL);
        } else {
            jset(o, "response", json_null());
            jset(o, "response_error", json_string("stored response does not decode"));
        }
    } else {
        jset(o, "response", json_null());
    }
    return o;
}

/* The generic view of an answer: outcome and whatever the outcome carries. */
json_t *jResult(const Idem__Response *resp)
{
    json_t *o = jobj();
    Idem__Outcome outcome = idem_response_outcome(resp);
    const Idem__Result *res = resp->result;
    jset(o, "outcome", json_string(idem_outcome_name((int)outcome)));
    if (res != NULL) {
        switch (outcome) {
        case IDEM__OUTCOME__OUTCOME_ACQUIRED:
            jset(o, "token", ju64(res->token));
            jset(o, "lease_deadline_ms", ju64(res->lease_deadline_ms));
            jset(o, "takeover", json_boolean(res->takeover));
            jset(o, "previous_token", res->takeover ? ju64(res->previous_token) : json_null());
            if (res->expires_at_ms != 0) {
                jset(o, "expires_at_ms", ju64(res->expires_at_ms));
            }
            break;
        case IDEM__OUTCOME__OUTCOME_IN_PROGRESS:
            jset(o, "retry_after_ms", ju64(res->retry_after_ms));
            break;
        case IDEM__OUTCOME__OUTCOME_REPLAY:
            jset(o, "response",
                 res->response != NULL ? storedResponseJson(res->response) : json_null());
            if (res->expires_at_ms != 0) {
                jset(o, "expires_at_ms", ju64(res->expires_at_ms));
            }
            break;
        case IDEM__OUTCOME__OUTCOME_OK:
            if (res->lease_deadline_ms != 0) {
                jset(o, "lease_deadline_ms", ju64(res->lease_deadline_ms)); /* renew */
            }
            break;
        default:
            break;
        }
        if (res->record != NULL) {
            jset(o, "record", recordJson(res->record));
        }
        if (res->detail != NULL && res->detail[0] != '\0') {
            jset(o, "detail", jstr(res->detail));
        }
    }
    if (resp->leader_rpc_address != NULL && resp->leader_rpc_address[0] != '\0') {
        jset(o, "leader_rpc_address", jstr(resp->leader_rpc_address));
    }
    if (resp->error != NULL && resp->error[0] != '\0') {
        /* Response.error is the node's human-readable detail; with ok it is only a note
         * ("snapshot scheduled ..."), so it is not called an error there. */
        jset(o, outcome == IDEM__OUTCOME__OUTCOME_OK ? "message" : "error", jstr(resp->error));
    }
    return o;
}

json_t *jMember(const Idem__Member *m)
{
    json_t *o = jobj();
    jset(o, "id", ju64(m->id));
    jset(o, "raft_address", jstr(m->raft_address));
    jset(o, "rpc_address", jstr(m->rpc_address));
    jset(o, "http_address", jstr(m->http_address));
    jset(o, "role", jstr(m->role));
    return o;
}

/* A record as an operator sees it: the key only with `reveal`, the fingerprint as the
 * 12-hex prefix logs carry, the stored response's status and size (its body only with
 * `reveal`), and no stored response at all when `with_response` is false. */
json_t *jAdminRecord(const Idem__AdminRecord *ar, bool reveal, bool with_response)
{
    json_t *o = jobj();
    const Idem__Record *r = ar->record;
    if (r == NULL) {
        jset(o, "key_digest", jstr(ar->key_digest));
        return o;
    }
    jset(o, "tenant", jstr(r->tenant));
    jset(o, "key_digest", jstr(ar->key_digest));
    if (reveal) {
        jsetBytes(o, "key", r->key.data, r->key.len);
    }
    jset(o, "state", json_string(stateName(r->state)));
    jset(o, "fingerprint_prefix",
         jhex(r->fingerprint.data, r->fingerprint.len < 6 ? r->fingerprint.len : 6));
    jset(o, "token", ju64(r->token));
    jset(o, "created_at_ms", ju64(r->created_at_ms));
    jset(o, "lease_deadline_ms", ju64(r->lease_deadline_ms));
    jset(o, "expires_at_ms", ju64(r->expires_at_ms));
    jset(o, "completion", completionJson(r->completion));
    if (!with_response) {
        return o;
    }
    Idem__StoredResponse *sr =
        r->response.len > 0 ? idem__stored_response__unpack(NULL, r->response.len, r->response.data)
                            : NULL;
    if (sr == NULL) {
        jset(o, "response", json_null());
        if (r->response.len > 0) {
            jset(o, "response_error", json_string("stored response does not decode"));
        }
        return o;
    }
    json_t *rj = storedResponseJsonAs(sr, reveal, true);
    idem__stored_response__free_unpacked(sr, NULL);
    jset(o, "response", rj);
    return o;
}

/* The outcome, and the node's note or refusal if any (never a record: no key bytes). */
json_t *jOutcome(const Idem__Response *resp)
{
    json_t *o = jobj();
    Idem__Outcome outcome = idem_response_outcome(resp);
    jset(o, "outcome", json_string(idem_outcome_name((int)outcome)));
    if (resp->result != NULL && resp->result->detail != NULL && resp->result->detail[0] != '\0') {
        jset(o, "detail", jstr(resp->result->detail));
    }
    if (resp->error != NULL && resp->error[0] != '\0') {
        jset(o, outcome == IDEM__OUTCOME__OUTCOME_OK ? "message" : "error", jstr(resp->error));
    }
    return o;
}
