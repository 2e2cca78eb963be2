/* rpc_scan: what the RPC listener (server/rpc.c) checks of a frame's bytes before
 * protobuf-c decodes them, and the bounded allocator the decode then runs on.
 *
 * protobuf-c's decode costs time and memory by the number of fields in a frame, not by its
 * size: a 4 MiB frame of a million 3-byte fields (unknown numbers, or one field again and
 * again) takes most of a second and hundreds of MiB, where a frame of one 4 MiB field takes
 * milliseconds. So a frame is walked first (rpc_scan_request): its tags and lengths, at
 * every depth of Idem__Request, against the descriptors protobuf-c generated from
 * idem.proto (protobuf-c's own wire types and field types): at most RPC_SCAN_MAX_FIELDS
 * fields in all, no field number the schema does not have, at each field the wire type its
 * type has. The walk also picks up what rpc.c needs before a decode: the request id, the
 * auth token (checked before anything is decoded), the op, as_tenant and forwarded.
 * rpc_scan_peek() reads only the leading fields of a frame, for a frame that is not
 * buffered before its token is known. The decode then runs on an rpc_alloc, which fails it
 * once its allocations pass a budget (rpc_scan_budget) that a frame within the walk's
 * limits does not reach: a bound of its own should the walk and protobuf-c ever disagree.
 *
 * Nothing here trusts a length: each one is checked against the bytes left. Only the
 * decode allocates. */
#ifndef IDEM_SERVER_RPC_SCAN_H
#define IDEM_SERVER_RPC_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "idem.pb-c.h"

/* Fields a frame may hold, at every depth together (a repeated field counts each of its
 * values, a packed one each element). A request's fields are a dozen or so; a stored
 * response with its most headers (FSM_HEADERS_MAX, 64) about 200. */
#define RPC_SCAN_MAX_FIELDS 1024

/* Messages inside messages at most (Request > CompleteRequest > StoredResponse > Header
 * is 3). */
#define RPC_SCAN_MAX_DEPTH 8

/* Idem__Request's fields that rpc_scan picks up (the unit test checks them against the
 * descriptor). */
#define RPC_SCAN_FIELD_REQUEST_ID 1
#define RPC_SCAN_FIELD_DEADLINE_MS 2
#define RPC_SCAN_FIELD_AUTH_TOKEN 3
#define RPC_SCAN_FIELD_AS_TENANT 5
#define RPC_SCAN_FIELD_FORWARDED 6

/* How many bytes of a frame rpc_scan_peek() needs to find a token: room for the request
 * id, the deadline, the longest token (a cluster secret: 4096 bytes), as_tenant and
 * forwarded. */
#define RPC_SCAN_PEEK_BYTES 8192

enum rpc_scan_status {
    RPC_SCAN_OK,
    RPC_SCAN_MALFORMED,      /* not the wire format of a Request: a varint or a length that
                              * runs past its message, a wire type that is not its field's,
                              * a group, field number 0, too deep */
    RPC_SCAN_UNKNOWN_FIELD,  /* a field number that idem.proto does not have, at any depth */
    RPC_SCAN_TOO_MANY_FIELDS /* more than RPC_SCAN_MAX_FIELDS */
};

/* What a walk saw of a frame's top level. As protobuf-c decodes a field given more than once,
 * the last one counts. */
struct rpc_scan {
    uint64_t request_id;  /* 0: none (yet) */
    const uint8_t *token; /* Request.auth_token: points into the frame; NULL when absent */
    size_t token_len;
    bool as_tenant; /* an as_tenant that is not empty as a C string */
    bool forwarded;
    uint32_t op;     /* the op's field number (an IDEM__REQUEST__OP_* value), 0: none */
    uint32_t fields; /* fields seen, every depth (up to the first past the cap) */
};

/* Walks the n bytes of a frame's body at p as an Idem__Request (see above) into *out. On a
 * refusal *out holds what was seen until then (the request id, when it came first). */
enum rpc_scan_status rpc_scan_request(const uint8_t *p, size_t n, struct rpc_scan *out);

/* Reads the leading top-level fields of the len bytes at p, the first bytes of a frame (of
 * any length), into *out: request id, deadline, token, as_tenant, forwarded, until the first
 * other field (the op, as protobuf-c lays out a request) or the first that does not end
 * within len bytes. Whether a complete token was read: out->token != NULL. */
void rpc_scan_peek(const uint8_t *p, size_t len, struct rpc_scan *out);

/* A short text for a refusal (an RPC answer's error). */
const char *rpc_scan_why(enum rpc_scan_status st);

/* A protobuf-c allocator with a budget: its allocations fail once they would take the bytes
 * allocated (freed ones still counted) past `budget`. Pass &a->pa to idem__request__unpack;
 * rpc_scan_release() afterwards. Its memory comes from `arena` when one is given (a bump
 * each, all returned at once by the release), else from malloc (each freed). */
struct rpc_alloc {
    ProtobufCAllocator pa;
    size_t budget;
    size_t bytes;  /* allocated so far */
    size_t calls;  /* allocations made */
    bool exceeded; /* an allocation was refused */
    struct arena *arena; /* NULL: malloc and free */
};
void rpc_alloc_init(struct rpc_alloc *a, size_t budget, struct arena *arena);

/* The budget of the decode of a frame of n bytes that rpc_scan_request() passed with
 * `fields` fields: its bytes twice (copies of its strings and bytes), plus room for every
 * field's message, array slot and protobuf-c's scratch, plus 64 KiB. */
size_t rpc_scan_budget(size_t n, uint32_t fields);

/* Decodes the n bytes at p, which rpc_scan_request() passed into *sc, with the allocator a
 * (initialised here with rpc_scan_budget(n, sc->fields) and `arena`, which may be NULL).
 * The request, or NULL: a->exceeded when the budget ran out, else protobuf-c refused the
 * bytes. Either way rpc_scan_release(req, a) afterwards. */
Idem__Request *rpc_scan_unpack(const uint8_t *p, size_t n, const struct rpc_scan *sc,
                               struct rpc_alloc *a, struct arena *arena);

/* Returns what the decode with a holds: frees req (which may be NULL), or resets a's arena
 * (every request decoded into it since its last reset). */
void rpc_scan_release(Idem__Request *req, struct rpc_alloc *a);

#endif
