#include "expiry.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>

#include "table.h"
#include "xmalloc.h"

static bool expiryLess(const struct rec *a, const struct rec *b)
{
    if (a->expires_at != b->expires_at) {
        return a->expires_at < b->expires_at;
    }
    return a->token < b->token;
}

static void expirySet(struct expiry *e, size_t i, struct rec *r)
{
    e->items[i] = r;
    r->heap_pos = (uint32_t)i;
}

static void expiryUp(struct expiry *e, size_t i)
{
    struct rec *r = e->items[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!expiryLess(r, e->items[parent])) {
            break;
        }
        expirySet(e, i, e->items[parent]);
        i = parent;
    }
    expirySet(e, i, r);
}

static void expiryDown(struct expiry *e, size_t i)
{
    struct rec *r = e->items[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= e->len) {
            break;
        }
        if (child + 1 < e->len && expiryLess(e->items[child + 1], e->items[child])) {
            child++;
        }
        if (!expiryLess(e->items[child], r)) {
            break;
        }
        expirySet(e, i, e->items[child]);
        i = child;
    }
    expirySet(e, i, r);
}

void expiry_init(struct expiry *e)
{
    e->items = NULL;
    e->len = 0;
    e->cap = 0;
}

void expiry_close(struct expiry *e)
{
    xbig_free(e->items, e->cap * sizeof(*e->items));
    expiry_init(e);
}

void expiry_append(struct expiry *e, struct rec *r)
{
    if (e->len == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        assert(cap <= UINT32_MAX);
        /* Mapped from 1 MiB on: a doubling moves page tables instead of copying the array
         * (1-5 ms at 1M records with realloc, on every replica at the same index). */
        e->items = xbig_grow(e->items, e->cap * sizeof(*e->items), cap * sizeof(*e->items));
        e->cap = cap;
    }
    e->items[e->len] = r;
    r->heap_pos = (uint32_t)e->len;
    e->len++;
}

/* How many positions ahead expiry_heapify loads the records it compares next: a restore
 * appends them in the snapshot's order, which is not their expiry order, and each sift
 * reads two children and their parent (1M records: 0.08 s of cache misses without it). */
#define HEAPIFY_AHEAD 16

void expiry_heapify(struct expiry *e)
{
    for (size_t i = e->len / 2; i-- > 0;) {
        if (i >= HEAPIFY_AHEAD) {
            size_t j = i - HEAPIFY_AHEAD;
            __builtin_prefetch(e->items[j], 1);
            __builtin_prefetch(e->items[2 * j + 1], 1);
            if (2 * j + 2 < e->len) {
                __builtin_prefetch(e->items[2 * j + 2], 1);
            }
        }
        expiryDown(e, i);
    }
}

void expiry_push(struct expiry *e, struct rec *r)
{
    expiry_append(e, r);
    expiryUp(e, e->len - 1);
}

void expiry_remove(struct expiry *e, struct rec *r)
{
    size_t i = r->heap_pos;
    assert(i < e->len && e->items[i] == r);
    e->len--;
    if (i == e->len) {
        return;
    }
    expirySet(e, i, e->items[e->len]);
    expiry_update(e, e->items[i]);
}

void expiry_update(struct expiry *e, struct rec *r)
{
    size_t i = r->heap_pos;
    assert(i < e->len && e->items[i] == r);
    if (i > 0 && expiryLess(r, e->items[(i - 1) / 2])) {
        expiryUp(e, i);
    } else {
        expiryDown(e, i);
    }
}

struct rec *expiry_min(const struct expiry *e)
{
    return e->len > 0 ? e->items[0] : NULL;
}
