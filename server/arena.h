/* arena: a bump allocator that protobuf-c unpacks into, reset after every command.
 *
 * Decoding a command with malloc costs several allocations and frees per command; the
 * arena makes it one pointer bump each and a reset. Requests larger than what is left go
 * to malloc and are freed at the next reset. */
#ifndef IDEM_SERVER_ARENA_H
#define IDEM_SERVER_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

struct arena_big;

struct arena {
    ProtobufCAllocator pb; /* hand &arena->pb to protobuf-c's unpack functions */
    unsigned char *buf;
    size_t cap;
    size_t used;
    struct arena_big *big; /* chained oversize blocks */
};

void arena_init(struct arena *a, size_t cap);
/* Frees every block handed out since the last reset; keeps the main buffer. */
void arena_reset(struct arena *a);
void arena_close(struct arena *a);

#endif
