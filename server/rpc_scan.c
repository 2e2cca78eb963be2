/* rpc_scan: a frame's wire format walked before protobuf-c decodes it (see rpc_scan.h).
 *
 * The walk reads what protobuf-c's decoder reads (protobuf-c.c: a tag of at most 5 bytes,
 * varints of at most 10, lengths within the message) and refuses a little more: unknown
 * field numbers, and wire types that do not match the field's type (protobuf-c refuses
 * most of those itself, after the whole message was scanned). Message fields are walked
 * with their own descriptor (field->descriptor); a packed repeated scalar counts as many
 * fields as it holds elements. */
#include "rpc_scan.h"

#include <stdlib.h>

#include "frame.h"

/* A field as it lies in the bytes: its number and wire type, a varint's value, the extent
 * of its value (a length-delimited one: what follows the length). */
struct wireField {
    uint32_t num;
    unsigned wt; /* a ProtobufCWireType */
    uint64_t v;  /* a varint's value (its bits past 64 dropped, as protobuf-c does) */
    bool set;    /* a varint with a bit set, past 64 too (protobuf-c's bool) */
    const uint8_t *val;
    size_t len;
};

/* Reads the field at p[*i] (n bytes in the message) into *f and moves *i past it. 1: read;
 * 0: malformed; -1: it does not end within the n bytes. */
static int readField(const uint8_t *p, size_t n, size_t *i, struct wireField *f)
{
    uint64_t key = 0;
    size_t used = 0;
    int rc = frame_varint_get(p + *i, n - *i, &key, &used);
    if (rc != 1) {
        return rc;
    }
    if (used > 5 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) {
        return 0; /* protobuf-c takes a 32-bit tag; numbers are 1..2^29-1 */
    }
    size_t at = *i + used;
    f->num = (uint32_t)(key >> 3);
    f->wt = (unsigned)(key & 7);
    f->v = 0;
    f->set = false;
    size_t vlen = 0;
    switch (f->wt) {
    case PROTOBUF_C_WIRE_TYPE_VARINT:
        rc = frame_varint_get(p + at, n - at, &f->v, &vlen);
        if (rc != 1) {
            return rc;
        }
        for (size_t k = 0; k < vlen; k++) {
            f->set = f->set || (p[at + k] & 0x7f) != 0;
        }
        break;
    case PROTOBUF_C_WIRE_TYPE_64BIT:
        vlen = 8;
        break;
    case PROTOBUF_C_WIRE_TYPE_32BIT:
        vlen = 4;
        break;
    case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED: {
        uint64_t l = 0;
        rc = frame_varint_get(p + at, n - at, &l, &used);
        if (rc != 1) {
            return rc;
        }
        at += used;
        if (l > n - at) {
            return -1;
        }
        vlen = (size_t)l;
        break;
    }
    default:
        return 0; /* groups (3, 4) and the numbers no wire type has (6, 7) */
    }
    if (f->wt != PROTOBUF_C_WIRE_TYPE_VARINT && vlen > n - at) {
        return -1;
    }
    f->val = p + at;
    f->len = vlen;
    *i = at + vlen;
    return 1;
}

/* The wire type a field of type t has when it is not packed. */
static unsigned wireTypeOf(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_BOOL:
    case PROTOBUF_C_TYPE_ENUM:
        return PROTOBUF_C_WIRE_TYPE_VARINT;
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return PROTOBUF_C_WIRE_TYPE_32BIT;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return PROTOBUF_C_WIRE_TYPE_64BIT;
    default:
        return PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    }
}

/* The elements of a packed repeated scalar of wire type wt in len bytes at p, or -1 when
 * they do not fill it exactly. */
static long packedCount(unsigned wt, const uint8_t *p, size_t len)
{
    if (wt == PROTOBUF_C_WIRE_TYPE_32BIT || wt == PROTOBUF_C_WIRE_TYPE_64BIT) {
        size_t size = wt == PROTOBUF_C_WIRE_TYPE_32BIT ? 4 : 8;
        return len % size == 0 ? (long)(len / size) : -1;
    }
    long count = 0;
    for (size_t i = 0; i < len; i++) {
        count += (p[i] & 0x80) == 0;
    }
    return len == 0 || (p[len - 1] & 0x80) == 0 ? count : -1;
}

/* What the top level of a request says that rpc.c needs (struct rpc_scan). */
static void pick(struct rpc_scan *out, const ProtobufCFieldDescriptor *d, const struct wireField *f)
{
    switch (f->num) {
    case RPC_SCAN_FIELD_REQUEST_ID:
        out->request_id = f->v;
        break;
    case RPC_SCAN_FIELD_AUTH_TOKEN:
        out->token = f->val;
        out->token_len = f->len;
        break;
    case RPC_SCAN_FIELD_AS_TENANT:
        out->as_tenant = f->len > 0 && f->val[0] != '\0'; /* as a C string reads it */
        break;
    case RPC_SCAN_FIELD_FORWARDED:
        out->forwarded = f->set;
        break;
    default:
        if (d != NULL && (d->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
            out->op = f->num;
        }
    }
}

/* Walks the n bytes at p as a message of descriptor md, `depth` messages deep. */
static enum rpc_scan_status walk(const ProtobufCMessageDescriptor *md, const uint8_t *p, size_t n,
                                 unsigned depth, struct rpc_scan *out)
{
    size_t i = 0;
    while (i < n) {
        struct wireField f;
        if (readField(p, n, &i, &f) != 1) {
            return RPC_SCAN_MALFORMED;
        }
        if (++out->fields > RPC_SCAN_MAX_FIELDS) {
            return RPC_SCAN_TOO_MANY_FIELDS;
        }
        const ProtobufCFieldDescriptor *d = protobuf_c_message_descriptor_get_field(md, f.num);
        if (d == NULL) {
            return RPC_SCAN_UNKNOWN_FIELD;
        }
        unsigned want = wireTypeOf(d->type);
        if (f.wt != want) {
            long k = -1;
            if (d->label == PROTOBUF_C_LABEL_REPEATED &&
                f.wt == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) {
                k = packedCount(want, f.val, f.len);
            }
            if (k < 0) {
                return RPC_SCAN_MALFORMED;
            }
            if (k > RPC_SCAN_MAX_FIELDS || out->fields + (uint32_t)k > RPC_SCAN_MAX_FIELDS) {
                out->fields = RPC_SCAN_MAX_FIELDS + 1;
                return RPC_SCAN_TOO_MANY_FIELDS;
            }
            out->fields += (uint32_t)k;
        } else if (d->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth + 1 > RPC_SCAN_MAX_DEPTH) {
                return RPC_SCAN_MALFORMED;
            }
            enum rpc_scan_status st = walk(d->descriptor, f.val, f.len, depth + 1, out);
            if (st != RPC_SCAN_OK) {
                return st;
            }
        }
        if (depth == 0) {
            pick(out, d, &f);
        }
    }
    return RPC_SCAN_OK;
}

enum rpc_scan_status rpc_scan_request(const uint8_t *p, size_t n, struct rpc_scan *out)
{
    *out = (struct rpc_scan){0};
    return walk(&idem__request__descriptor, p, n, 0, out);
}

void rpc_scan_peek(const uint8_t *p, size_t len, struct rpc_scan *out)
{
    *out = (struct rpc_scan){0};
    size_t i = 0;
    while (i < len) {
        struct wireField f;
        if (readField(p, len, &i, &f) != 1) {
            return;
        }
        bool lead = f.num == RPC_SCAN_FIELD_REQUEST_ID || f.num == RPC_SCAN_FIELD_DEADLINE_MS ||
                    f.num == RPC_SCAN_FIELD_AUTH_TOKEN || f.num == RPC_SCAN_FIELD_AS_TENANT ||
                    f.num == RPC_SCAN_FIELD_FORWARDED;
        const ProtobufCFieldDescriptor *d =
            protobuf_c_message_descriptor_get_field(&idem__request__descriptor, f.num);
        if (!lead || d == NULL || f.wt != wireTypeOf(d->type)) {
            return;
        }
        out->fields++;
        pick(out, d, &f);
    }
}

const char *rpc_scan_why(enum rpc_scan_status st)
{
    switch (st) {
    case RPC_SCAN_OK:
        return "ok";
    case RPC_SCAN_UNKNOWN_FIELD:
        return "request has a field this version does not know";
    case RPC_SCAN_TOO_MANY_FIELDS:
        return "request has too many fields";
    default:
        return "frame does not decode as a Request";
    }
}

static void *budgetAlloc(void *data, size_t size)
{
    struct rpc_alloc *a = data;
    if (size > a->budget - a->bytes) {
        a->exceeded = true;
        return NULL;
    }
    void *p = a->arena != NULL ? a->arena->pb.alloc(a->arena->pb.allocator_data, size)
                               : malloc(size ? size : 1);
    if (p != NULL) {
        a->bytes += size;
        a->calls++;
    }
    return p;
}

static void budgetFree(void *data, void *p)
{
    struct rpc_alloc *a = data;
    if (a->arena == NULL) {
        free(p);
    } /* else returned in bulk by rpc_scan_release */
}

void rpc_alloc_init(struct rpc_alloc *a, size_t budget, struct arena *arena)
{
    *a = (struct rpc_alloc){.pa = {budgetAlloc, budgetFree, a}, .budget = budget, .arena = arena};
}

size_t rpc_scan_budget(size_t n, uint32_t fields)
{
    return 2 * n + (size_t)fields * 256 + (64u << 10);
}

Idem__Request *rpc_scan_unpack(const uint8_t *p, size_t n, const struct rpc_scan *sc,
                               struct rpc_alloc *a, struct arena *arena)
{
    rpc_alloc_init(a, rpc_scan_budget(n, sc->fields), arena);
    return idem__request__unpack(&a->pa, n, p);
}

void rpc_scan_release(Idem__Request *req, struct rpc_alloc *a)
{
    if (a->arena != NULL) {
        arena_reset(a->arena);
    } else if (req != NULL) {
        idem__request__free_unpacked(req, &a->pa);
    }
}
