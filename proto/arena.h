/* arena: a bump allocator that protobuf-c unpacks into, reset after every message.
 *
 * Decoding a message with malloc costs an allocation and a free for every submessage, string
 * and bytes field; the arena makes each one pointer bump, and all of them one reset. The
 * state machine decodes each command into one (server/fsm.c), the cluster each log entry
 * (cluster/cluster.c), the RPC listener each request (server/rpc_frames.c). Requests larger
 * than what is left go to malloc and are freed at the next reset; running out of memory
 * aborts (a message that cannot be decoded would make a replica diverge), unless the arena
 * is soft. */
#ifndef IDEM_PROTO_ARENA_H
#define IDEM_PROTO_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

struct arena_big;

struct arena {
    ProtobufCAllocator pb; /* hand &arena->pb to protobuf-c's unpack functions */
    unsigned char *buf;
    size_t cap;
    size_t used;
    struct arena_big *big; /* chained oversize blocks */
    size_t big_bytes;      /* their bytes since the last reset */
    /* false (arena_init): running out of memory aborts. true (set it after arena_init): an
     * allocation that malloc refuses is NULL, which fails protobuf-c's unpack cleanly, and
     * the buffer stays as it is when it cannot grow (a request's decode, which may fail). */
    bool soft;
};

void arena_init(struct arena *a, size_t cap);
/* Frees every block handed out since the last reset; keeps the main buffer, grown (up to
 * 1 MiB) when some of them did not fit in it. */
void arena_reset(struct arena *a);
void arena_close(struct arena *a);

#endif
