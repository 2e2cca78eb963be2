/* expiry: the expiry index, a binary min-heap of records ordered by (expires_at, token).
 *
 * Tokens are unique among live records, so the order is total and every replica pops
 * records in the same order whatever the heap's internal layout (docs/contract.md, expire). */
#ifndef IDEM_SERVER_EXPIRY_H
#define IDEM_SERVER_EXPIRY_H

#include <stddef.h>
#include <stdint.h>

struct rec;

struct expiry {
    struct rec **items; /* owned array; the records are the table's */
    size_t len;
    size_t cap;
};

void expiry_init(struct expiry *e);
void expiry_close(struct expiry *e);
/* Adds r (borrowed; stays the table's) to the index. */
void expiry_push(struct expiry *e, struct rec *r);
/* Bulk loading: expiry_append adds without ordering, expiry_heapify orders everything
 * appended in O(n). Nothing may be read from the index in between. */
void expiry_append(struct expiry *e, struct rec *r);
void expiry_heapify(struct expiry *e);
/* Removes r from the index. */
void expiry_remove(struct expiry *e, struct rec *r);
/* Restores the order after r's expires_at or token changed. */
void expiry_update(struct expiry *e, struct rec *r);
/* The record that expires first, or NULL. */
struct rec *expiry_min(const struct expiry *e);

#endif
