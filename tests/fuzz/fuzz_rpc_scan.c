/* fuzz_rpc_scan: the payload of one RPC frame through what server/rpc_frames.c does before
 * and at the decode: the walk of its wire format (rpc_scan_request), the peek at its leading
 * fields (rpc_scan_peek, on every prefix length up to RPC_SCAN_PEEK_BYTES that the input
 * has), and, when the walk lets it through, protobuf-c's decode on the bounded allocator
 * (rpc_scan_unpack).
 *
 * Invariants (abort() on violation):
 * - the walk never counts past RPC_SCAN_MAX_FIELDS + 1 fields, and a frame it passes has at
 *   most RPC_SCAN_MAX_FIELDS;
 * - a frame the walk passes never runs out of the decode's budget (the budget is a bound
 *   a frame within the walk's limits does not reach);
 * - what the walk picked up is what protobuf-c decodes: request id, op, token, forwarded,
 *   as_tenant; and the decoded request holds no unknown field at any depth (the walk
 *   refuses field numbers idem.proto does not have);
 * - a token the peek finds lies within the bytes it was given;
 * - everything is freed on every path (LeakSanitizer). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.pb-c.h"
#include "rpc_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_rpc_scan: invariant violated: %s\n", what);
    abort();
}

/* Whether m or any message inside it holds fields the schema does not know. */
static bool hasUnknown(const ProtobufCMessage *m)
{
    if (m == NULL) {
        return false;
    }
    if (m->n_unknown_fields != 0) {
        return true;
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            continue;
        }
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t j = 0; j < n; j++) {
                if (hasUnknown(arr[j])) {
                    return true;
                }
            }
        } else {
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(base + f->quantifier_offset) != f->id) {
                continue;
            }
            if (hasUnknown(*(ProtobufCMessage *const *)(base + f->offset))) {
                return true;
            }
        }
    }
    return false;
}

static void checkPeek(const uint8_t *p, size_t size)
{
    size_t most = size < RPC_SCAN_PEEK_BYTES ? size : RPC_SCAN_PEEK_BYTES;
    /* Every prefix of a short input; a few of a long one. */
    size_t step = most > 256 ? most / 64 : 1;
    for (size_t len = 0; len <= most; len += step) {
        struct rpc_scan sc;
        rpc_scan_peek(p, len, &sc);
        if (sc.token != NULL && (sc.token < p || sc.token + sc.token_len > p + len)) {
            fail("the peek's token lies outside its bytes");
        }
    }
}

static void checkDecoded(const Idem__Request *req, const struct rpc_scan *sc)
{
    if (req->request_id != sc->request_id) {
        fail("request id: the walk and protobuf-c differ");
    }
    if ((uint32_t)req->op_case != sc->op) {
        fail("op: the walk and protobuf-c differ");
    }
    if (req->auth_token.len != sc->token_len ||
        (sc->token_len > 0 && memcmp(req->auth_token.data, sc->token, sc->token_len) != 0)) {
        fail("token: the walk and protobuf-c differ");
    }
    if ((req->forwarded != 0) != sc->forwarded) {
        fail("forwarded: the walk and protobuf-c differ");
    }
    if ((req->as_tenant != NULL && req->as_tenant[0] != '\0') != sc->as_tenant) {
        fail("as_tenant: the walk and protobuf-c differ");
    }
    if (hasUnknown(&req->base)) {
        fail("a request the walk passed holds unknown fields");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy, so that ASan sees any read past the frame's payload. */
    uint8_t *p = malloc(size ? size : 1);
    if (p == NULL) {
        abort();
    }
    memcpy(p, data, size);
    checkPeek(p, size);
    struct rpc_scan sc;
    enum rpc_scan_status st = rpc_scan_request(p, size, &sc);
    if (sc.fields > RPC_SCAN_MAX_FIELDS + 1) {
        fail("the walk counted past the cap");
    }
    if (st == RPC_SCAN_OK) {
        /* With malloc (each allocation its own, for the sanitizers), then into an arena as
         * the server decodes. */
        static struct arena ar;
        static bool ar_made;
        if (!ar_made) {
            arena_init(&ar, 16u << 10);
            ar_made = true;
        }
        for (int k = 0; k < 2; k++) {
            struct rpc_alloc a;
            Idem__Request *req = rpc_scan_unpack(p, size, &sc, &a, k == 0 ? NULL : &ar);
            if (a.exceeded) {
                fail("a frame the walk passed ran out of its decode budget");
            }
            if (req != NULL) {
                checkDecoded(req, &sc);
            }
            rpc_scan_release(req, &a);
        }
    }
    free(p);
    return 0;
}
