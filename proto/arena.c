#include "arena.h"

#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void *xalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "out of memory allocating %zu bytes for a decode\n", n);
        abort();
    }
    return p;
}

struct arena_big {
    struct arena_big *next;
    max_align_t data[];
};

static void *arenaAlloc(void *data, size_t size)
{
    struct arena *a = data;
    const size_t align = alignof(max_align_t);
    size_t start = (a->used + align - 1) & ~(align - 1);
    if (start <= a->cap && size <= a->cap - start) {
        a->used = start + size;
        return a->buf + start;
    }
    /* protobuf-c treats NULL as out of memory and fails the unpack cleanly, but a message
     * that cannot be decoded would make this replica diverge: abort instead. */
    struct arena_big *b = xalloc(sizeof(*b) + size);
    b->next = a->big;
    a->big = b;
    return b->data;
}

static void arenaFree(void *data, void *ptr)
{
    /* Memory is returned in bulk by arena_reset(). */
    (void)data;
    (void)ptr;
}

void arena_init(struct arena *a, size_t cap)
{
    a->pb.alloc = arenaAlloc;
    a->pb.free = arenaFree;
    a->pb.allocator_data = a;
    a->buf = xalloc(cap);
    a->cap = cap;
    a->used = 0;
    a->big = NULL;
}

void arena_reset(struct arena *a)
{
    while (a->big != NULL) {
        struct arena_big *next = a->big->next;
        free(a->big);
        a->big = next;
    }
    a->used = 0;
}

void arena_close(struct arena *a)
{
    arena_reset(a);
    free(a->buf);
    a->buf = NULL;
    a->cap = 0;
}
