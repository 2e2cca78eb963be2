#include "arena.h"

#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static _Noreturn void outOfMemory(size_t n)
{
    fprintf(stderr, "out of memory allocating %zu bytes for a decode\n", n);
    abort();
}

static void *xalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        outOfMemory(n);
    }
    return p;
}

/* The most the main buffer grows to (arena_reset). */
#define ARENA_GROW_MAX (1024u * 1024u)

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
     * that cannot be decoded would make this replica diverge: abort instead, unless the
     * arena is soft (a request's decode, which may fail). */
    if (size > SIZE_MAX - sizeof(struct arena_big)) {
        if (a->soft) {
            return NULL;
        }
        outOfMemory(size);
    }
    struct arena_big *b = a->soft ? malloc(sizeof(*b) + size) : xalloc(sizeof(*b) + size);
    if (b == NULL) {
        return NULL;
    }
    b->next = a->big;
    a->big = b;
    a->big_bytes += size + align;
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
    a->big_bytes = 0;
    a->soft = false;
}

void arena_reset(struct arena *a)
{
    while (a->big != NULL) {
        struct arena_big *next = a->big->next;
        free(a->big);
        a->big = next;
    }
    /* What did not fit this time: the buffer doubles towards it, up to ARENA_GROW_MAX. */
    size_t want = a->used + a->big_bytes;
    if (a->big_bytes != 0 && a->cap < ARENA_GROW_MAX) {
        size_t cap = a->cap != 0 ? a->cap : 4096;
        while (cap < want && cap < ARENA_GROW_MAX) {
            cap *= 2;
        }
        cap = cap < ARENA_GROW_MAX ? cap : ARENA_GROW_MAX;
        unsigned char *grown = a->soft ? malloc(cap) : xalloc(cap);
        if (grown != NULL) { /* a soft arena keeps its buffer when it cannot grow */
            free(a->buf);
            a->buf = grown;
            a->cap = cap;
        }
    }
    a->big_bytes = 0;
    a->used = 0;
}

void arena_close(struct arena *a)
{
    a->big_bytes = 0; /* no growth on the way out */
    arena_reset(a);
    free(a->buf);
    a->buf = NULL;
    a->cap = 0;
}
