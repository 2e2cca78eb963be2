/* deadlines: a binary min-heap of deadlines, so that the ops a node holds until their
 * command commits (service.c) share one loop timer instead of a timer handle each.
 *
 * A struct deadline is embedded in what it times; the heap holds pointers to them and keeps
 * each one's position in it, so that removing one (its command answered in time, the usual
 * case) takes O(log n) and no search. Pure: no clock, no loop; the caller says what time a
 * deadline is at and asks which one comes first. */
#ifndef IDEM_SERVER_DEADLINES_H
#define IDEM_SERVER_DEADLINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEADLINE_NONE SIZE_MAX /* deadline.pos of one the heap does not hold */

struct deadline {
    uint64_t at; /* when it falls due, in the caller's clock */
    size_t pos;  /* its index in the heap, or DEADLINE_NONE */
};

struct deadlines {
    struct deadline **v;
    size_t n;
    size_t cap;
};

void deadlines_init(struct deadlines *h);
/* Frees the heap's array; what it pointed at is the caller's. */
void deadlines_free(struct deadlines *h);
/* Adds d, due at `at` (aborts when out of memory, as xmalloc does). d must not be held. */
void deadlines_push(struct deadlines *h, struct deadline *d, uint64_t at);
/* Removes d if the heap holds it; nothing otherwise. */
void deadlines_remove(struct deadlines *h, struct deadline *d);
/* The earliest deadline held, or NULL when none is. */
struct deadline *deadlines_min(const struct deadlines *h);

static inline void deadline_init(struct deadline *d)
{
    d->at = 0;
    d->pos = DEADLINE_NONE;
}

static inline bool deadline_held(const struct deadline *d)
{
    return d->pos != DEADLINE_NONE;
}

#endif
