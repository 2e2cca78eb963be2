/* mremap and MREMAP_MAYMOVE are Linux's: glibc shows them with _GNU_SOURCE. */
#define _GNU_SOURCE

#include "expiry.h"

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Arrays of this many bytes or more are mapped, and grow with mremap(2): the kernel moves
 * page-table entries instead of realloc copying the array (1-5 ms at 1M records, on the
 * apply path of every replica at the same index; grow-bench). */
#define ITEMS_MAP_MIN_BYTES ((size_t)1 << 20)

static void *mapOrDie(void *p, size_t bytes)
{
    if (p == MAP_FAILED) {
        fprintf(stderr, "idemd: out of memory mapping %zu bytes\n", bytes);
        abort();
    }
    return p;
}

/* Grows e->items to `cap` entries, keeping the first e->len. */
static void itemsGrow(struct expiry *e, size_t cap)
{
    size_t old_bytes = e->cap * sizeof(*e->items);
    size_t bytes = cap * sizeof(*e->items);
    if (bytes < ITEMS_MAP_MIN_BYTES) {
        e->items = xrealloc(e->items, bytes);
    } else if (old_bytes < ITEMS_MAP_MIN_BYTES) {
        struct rec **items = mapOrDie(
            mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), bytes);
        if (e->len > 0) {
            memcpy(items, e->items, e->len * sizeof(*e->items));
        }
        free(e->items);
        e->items = items;
    } else {
        e->items = mapOrDie(mremap(e->items, old_bytes, bytes, MREMAP_MAYMOVE), bytes);
    }
    e->cap = cap;
}

void expiry_close(struct expiry *e)
{
    if (e->cap * sizeof(*e->items) >= ITEMS_MAP_MIN_BYTES) {
        munmap(e->items, e->cap * sizeof(*e->items));
    } else {
        free(e->items);
    }
    expiry_init(e);
}

void expiry_append(struct expiry *e, struct rec *r)
{
    if (e->len == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        assert(cap <= UINT32_MAX);
        itemsGrow(e, cap);
    }
    e->items[e->len] = r;
    r->heap_pos = (uint32_t)e->len;
    e->len++;
}

void expiry_heapify(struct expiry *e)
{
    for (size_t i = e->len / 2; i-- > 0;) {
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
