/* deadlines: see deadlines.h. */
#include "deadlines.h"

#include <assert.h>
#include <stdlib.h>

#include "xmalloc.h"

void deadlines_init(struct deadlines *h)
{
    h->v = NULL;
    h->n = 0;
    h->cap = 0;
}

void deadlines_free(struct deadlines *h)
{
    free(h->v);
    deadlines_init(h);
}

static void place(struct deadlines *h, size_t i, struct deadline *d)
{
    h->v[i] = d;
    d->pos = i;
}

/* Moves d, which belongs at i, up towards the root past every later parent. */
static void siftUp(struct deadlines *h, size_t i, struct deadline *d)
{
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->v[parent]->at <= d->at) {
            break;
        }
        place(h, i, h->v[parent]);
        i = parent;
    }
    place(h, i, d);
}

/* Moves d, which belongs at i, down past every earlier child. */
static void siftDown(struct deadlines *h, size_t i, struct deadline *d)
{
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->n) {
            break;
        }
        if (child + 1 < h->n && h->v[child + 1]->at < h->v[child]->at) {
            child++;
        }
        if (d->at <= h->v[child]->at) {
            break;
        }
        place(h, i, h->v[child]);
        i = child;
    }
    place(h, i, d);
}

void deadlines_push(struct deadlines *h, struct deadline *d, uint64_t at)
{
    assert(!deadline_held(d));
    if (h->n == h->cap) {
        h->cap = h->cap != 0 ? h->cap * 2 : 64;
        h->v = xrealloc(h->v, h->cap * sizeof(*h->v));
    }
    d->at = at;
    h->n++;
    siftUp(h, h->n - 1, d);
}

void deadlines_remove(struct deadlines *h, struct deadline *d)
{
    if (!deadline_held(d)) {
        return;
    }
    size_t i = d->pos;
    assert(i < h->n && h->v[i] == d);
    d->pos = DEADLINE_NONE;
    struct deadline *last = h->v[--h->n];
    if (last == d) {
        return; /* it was the last one */
    }
    /* The last one takes d's place, then moves whichever way its time says. */
    if (i > 0 && last->at < h->v[(i - 1) / 2]->at) {
        siftUp(h, i, last);
    } else {
        siftDown(h, i, last);
    }
}

struct deadline *deadlines_min(const struct deadlines *h)
{
    return h->n != 0 ? h->v[0] : NULL;
}
