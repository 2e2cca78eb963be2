/* frame.h: the framing of the binary RPC (idem.proto, above `message Request`), shared by
 * the server (server/rpc.c) and libidem (client/, which the gateway's forwarder uses):
 * every frame is a 4-byte big-endian length, then that many bytes of one packed Request or
 * Response.
 *
 * Header-only (static inline), so that it adds no symbol to libidem and needs no link.
 * Nothing here allocates or trusts a length: frame_check() bounds it before a caller
 * buffers anything for the frame. */
#ifndef IDEM_PROTO_FRAME_H
#define IDEM_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

/* The length prefix of every frame. */
#define FRAME_HEADER_LEN 4

/* The longest varint (a uint64_t): 10 bytes. */
#define FRAME_VARINT_MAX 10

/* Writes the prefix of a frame whose body is `body_len` bytes at p (FRAME_HEADER_LEN
 * bytes). */
static inline void frame_header_put(uint8_t *p, uint32_t body_len)
{
    p[0] = (uint8_t)(body_len >> 24);
    p[1] = (uint8_t)(body_len >> 16);
    p[2] = (uint8_t)(body_len >> 8);
    p[3] = (uint8_t)body_len;
}

/* The body length a frame's prefix at p (FRAME_HEADER_LEN bytes) declares, unchecked. */
static inline uint32_t frame_header_get(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* What the bytes at the front of a buffer hold (frame_check). */
enum frame_status {
    FRAME_SHORT,     /* not even the prefix yet */
    FRAME_PARTIAL,   /* a valid prefix, but not the whole body yet */
    FRAME_COMPLETE,  /* a whole frame: prefix and body */
    FRAME_TOO_LARGE, /* the prefix declares more than `max`: nothing of it may be buffered */
};

/* Looks at the `have` bytes at p, the front of a stream of frames, against the largest
 * body allowed (`max`): *body_len (OUT) is the declared length whenever the prefix is
 * there (FRAME_PARTIAL, FRAME_COMPLETE and FRAME_TOO_LARGE). */
static inline enum frame_status frame_check(const uint8_t *p, size_t have, uint32_t max,
                                            uint32_t *body_len)
{
    if (have < FRAME_HEADER_LEN) {
        return FRAME_SHORT;
    }
    *body_len = frame_header_get(p);
    if (*body_len > max) {
        return FRAME_TOO_LARGE;
    }
    return have - FRAME_HEADER_LEN < *body_len ? FRAME_PARTIAL : FRAME_COMPLETE;
}

/* Writes v as a protobuf varint at dst (room for FRAME_VARINT_MAX bytes); returns the bytes
 * written. */
static inline size_t frame_varint_put(uint8_t *dst, uint64_t v)
{
    size_t n = 0;
    do {
        uint8_t b = (uint8_t)(v & 0x7f);
        v >>= 7;
        dst[n++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v != 0);
    return n;
}

/* Writes a protobuf varint field (`key`: field number << 3, wire type 0) with value v at
 * dst (room for 1 + FRAME_VARINT_MAX bytes); returns the bytes written. A field put before
 * a packed message is read as part of it (protobuf lets fields come in any order, and the
 * last value of a repeated scalar field wins): how a sender adds a request id or a
 * deadline to a body packed once. */
static inline size_t frame_varint_field_put(uint8_t *dst, uint8_t key, uint64_t v)
{
    dst[0] = key;
    return 1 + frame_varint_put(dst + 1, v);
}

/* Reads a protobuf varint from the first len bytes at p into *v, its size into *used.
 * 1: read; -1: the bytes end inside it (wait for more); 0: longer than 64 bits. */
static inline int frame_varint_get(const uint8_t *p, size_t len, uint64_t *v, size_t *used)
{
    uint64_t x = 0;
    for (size_t i = 0; i < FRAME_VARINT_MAX; i++) {
        if (i >= len) {
            return -1;
        }
        x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if ((p[i] & 0x80) == 0) {
            *v = x;
            *used = i + 1;
            return 1;
        }
    }
    return 0;
}

/* The keys of Request's leading fields, as frame_varint_field_put() takes them. */
#define FRAME_KEY_REQUEST_ID 0x08  /* field 1 (request_id), varint */
#define FRAME_KEY_DEADLINE_MS 0x10 /* field 2 (deadline_ms), varint */

/* Request.request_id from the first `len` bytes of a packed Request, for a frame that is
 * not taken in (too large, or no room for it): looked for only among the leading fields 1
 * (request_id) and 2 (deadline_ms), both varints, which is how every client starts a
 * request (protobuf-c packs fields in number order; libidem's asynchronous client, which
 * the server's forwarder uses, puts deadline_ms before the body, which starts with
 * request_id). 1: *id found (non-zero); 0: not there (another field first, a varint too
 * long, id 0); -1: the bytes so far begin such a field: wait for more. */
static inline int frame_peek_request_id(const uint8_t *p, size_t len, uint64_t *id)
{
    size_t i = 0;
    for (int field = 0; field < 2; field++) {
        if (i >= len) {
            return -1;
        }
        uint8_t key = p[i++];
        if (key != FRAME_KEY_REQUEST_ID && key != FRAME_KEY_DEADLINE_MS) {
            return 0;
        }
        uint64_t v = 0;
        size_t used = 0;
        int rc = frame_varint_get(p + i, len - i, &v, &used);
        if (rc != 1) {
            return rc;
        }
        i += used;
        if (key == FRAME_KEY_REQUEST_ID) {
            *id = v;
            return v != 0 ? 1 : 0;
        }
    }
    return 0;
}

#endif /* IDEM_PROTO_FRAME_H */
