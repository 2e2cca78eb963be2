#include "table.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm.h"
#include "xmalloc.h"

_Static_assert(offsetof(struct rec, key) == 74 + 32, "record overhead grew: update the budget");

#define TABLE_MIN_SLOTS 1024
#define SLOT_TAG_SHIFT 48
#define SLOT_PTR_MASK ((UINT64_C(1) << SLOT_TAG_SHIFT) - 1)

static struct rec *slotRec(uintptr_t slot)
{
    return (struct rec *)(slot & SLOT_PTR_MASK);
}

static uintptr_t slotMake(struct rec *r, uint64_t hash)
{
    uintptr_t p = (uintptr_t)r;
    if ((p >> SLOT_TAG_SHIFT) != 0) {
        abort(); /* a heap address above 2^48: this platform cannot tag pointers */
    }
    return p | (uintptr_t)(hash >> SLOT_TAG_SHIFT) << SLOT_TAG_SHIFT;
}

static bool slotTagMatches(uintptr_t slot, uint64_t hash)
{
    return (slot >> SLOT_TAG_SHIFT) == (hash >> SLOT_TAG_SHIFT);
}

void table_init(struct table *t)
{
    memset(t, 0, sizeof(*t));
    t->slots = xcalloc(TABLE_MIN_SLOTS, sizeof(*t->slots));
    t->mask = TABLE_MIN_SLOTS - 1;
    t->tenant_mask = 15;
    t->tenant_slots = xcalloc(t->tenant_mask + 1, sizeof(*t->tenant_slots));
    expiry_init(&t->heap);
}

void table_close(struct table *t)
{
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i] != 0) {
            struct rec *r = slotRec(t->slots[i]);
            free(r->response);
            free(r);
        }
    }
    free(t->slots);
    for (size_t i = 0; i < t->n_tenants; i++) {
        free(t->tenants[i].name);
    }
    free(t->tenants);
    free(t->tenant_slots);
    expiry_close(&t->heap);
    memset(t, 0, sizeof(*t));
}

/* ---- tenants ------------------------------------------------------------------------- */

static uint64_t tenantHash(const char *name, size_t len)
{
    return XXH3_64bits(name, len);
}

int table_tenant_find(const struct table *t, const char *name, size_t len)
{
    uint64_t h = tenantHash(name, len);
    for (size_t i = h & t->tenant_mask;; i = (i + 1) & t->tenant_mask) {
        uint32_t slot = t->tenant_slots[i];
        if (slot == 0) {
            return -1;
        }
        const struct tenant *tn = &t->tenants[slot - 1];
        if (tn->hash == h && tn->name_len == len && memcmp(tn->name, name, len) == 0) {
            return (int)(slot - 1);
        }
    }
}

static void tenantSlotsPut(uint32_t *slots, size_t mask, uint64_t h, uint32_t value)
{
    size_t i = h & mask;
    while (slots[i] != 0) {
        i = (i + 1) & mask;
    }
    slots[i] = value;
}

int table_tenant_intern(struct table *t, const char *name, size_t len)
{
    int found = table_tenant_find(t, name, len);
    if (found >= 0) {
        return found;
    }
    if (t->n_tenants >= FSM_TENANTS_MAX) {
        return -1;
    }
    if (t->n_tenants == t->cap_tenants) {
        t->cap_tenants = t->cap_tenants ? t->cap_tenants * 2 : 8;
        t->tenants = xrealloc(t->tenants, t->cap_tenants * sizeof(*t->tenants));
    }
    /* Keep the open-addressing table at most half full. */
    if ((t->n_tenants + 1) * 2 > t->tenant_mask + 1) {
        size_t mask = t->tenant_mask * 2 + 1;
        uint32_t *slots = xcalloc(mask + 1, sizeof(*slots));
        for (size_t i = 0; i < t->n_tenants; i++) {
            tenantSlotsPut(slots, mask, t->tenants[i].hash, (uint32_t)(i + 1));
        }
        free(t->tenant_slots);
        t->tenant_slots = slots;
        t->tenant_mask = mask;
    }
    struct tenant *tn = &t->tenants[t->n_tenants];
    tn->name = xstrndup(name, len);
    tn->name_len = len;
    tn->hash = tenantHash(name, len);
    tn->records = 0;
    tn->bytes = 0;
    t->n_tenants++;
    tenantSlotsPut(t->tenant_slots, t->tenant_mask, tn->hash, (uint32_t)t->n_tenants);
    return (int)(t->n_tenants - 1);
}

/* ---- records ------------------------------------------------------------------------- */

uint64_t table_hash(const struct table *t, int tenant, const uint8_t *key, size_t len)
{
    return XXH3_64bits_withSeed(key, len, t->tenants[tenant].hash);
}

static uint64_t recHash(const struct table *t, const struct rec *r)
{
    return table_hash(t, r->tenant, r->key, r->key_len);
}

struct rec *table_find(const struct table *t, int tenant, uint64_t hash, const uint8_t *key,
                       size_t len)
{
    for (size_t i = hash & t->mask;; i = (i + 1) & t->mask) {
        uintptr_t slot = t->slots[i];
        if (slot == 0) {
            return NULL;
        }
        if (slotTagMatches(slot, hash)) {
            struct rec *r = slotRec(slot);
            if (r->tenant == tenant && r->key_len == len && memcmp(r->key, key, len) == 0) {
                return r;
            }
        }
    }
}

static void slotsPut(uintptr_t *slots, size_t mask, uintptr_t slot, uint64_t hash)
{
    size_t i = hash & mask;
    while (slots[i] != 0) {
        i = (i + 1) & mask;
    }
    slots[i] = slot;
}

/* Rebuilds the slot array with `n` slots. Not incremental: at 1M records this rehashes
 * every key once, a stall of tens of milliseconds on the apply path (see README, Limits). */
static void tableResize(struct table *t, size_t n)
{
    uintptr_t *slots = xcalloc(n, sizeof(*slots));
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i] != 0) {
            slotsPut(slots, n - 1, t->slots[i], recHash(t, slotRec(t->slots[i])));
        }
    }
    free(t->slots);
    t->slots = slots;
    t->mask = n - 1;
}

static bool tableFits(size_t slots, size_t records)
{
    return records <= slots / 4 * 3;
}

void table_reserve(struct table *t, size_t n)
{
    size_t slots = t->mask + 1;
    while (!tableFits(slots, n)) {
        slots *= 2;
    }
    if (slots != t->mask + 1) {
        tableResize(t, slots);
    }
}

size_t table_rec_size(size_t key_len)
{
    return offsetof(struct rec, key) + key_len;
}

struct rec *table_insert(struct table *t, int tenant, uint64_t hash, const uint8_t *key,
                         size_t len)
{
    assert(len > 0 && len <= 255);
    assert(tenant >= 0 && (size_t)tenant < t->n_tenants);
    if (!tableFits(t->mask + 1, t->count + 1)) {
        tableResize(t, (t->mask + 1) * 2);
    }
    struct rec *r = xmalloc(table_rec_size(len));
    memset(r, 0, offsetof(struct rec, key));
    memcpy(r->key, key, len);
    r->key_len = (uint8_t)len;
    r->tenant = (uint16_t)tenant;
    r->heap_pos = UINT32_MAX;
    slotsPut(t->slots, t->mask, slotMake(r, hash), hash);
    t->count++;
    return r;
}

void table_remove(struct table *t, struct rec *r)
{
    table_unlink(t, r);
    table_rec_free(r);
}

void table_rec_free(struct rec *r)
{
    free(r->response);
    free(r);
}

void table_unlink(struct table *t, struct rec *r)
{
    size_t i = recHash(t, r) & t->mask;
    while (slotRec(t->slots[i]) != r) {
        assert(t->slots[i] != 0);
        i = (i + 1) & t->mask;
    }
    /* Backward-shift deletion: pull later members of the probe run into the hole when
     * their home slot does not lie cyclically in (hole, their slot]. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        uintptr_t slot = t->slots[j];
        if (slot == 0) {
            break;
        }
        size_t home = recHash(t, slotRec(slot)) & t->mask;
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            t->slots[i] = slot;
            i = j;
        }
    }
    t->slots[i] = 0;
    if (r->heap_pos != UINT32_MAX) {
        expiry_remove(&t->heap, r);
    }
    t->count--;
}

void table_foreach(const struct table *t, void (*fn)(const struct rec *r, void *arg),
                   void *arg)
{
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i] != 0) {
            fn(slotRec(t->slots[i]), arg);
        }
    }
}

/* ---- copy-on-write support ----------------------------------------------------------- */

uint64_t table_rec_hash(const struct table *t, const struct rec *r)
{
    return recHash(t, r);
}

bool table_slots_hold(const uintptr_t *slots, size_t mask, uint64_t hash, const struct rec *r)
{
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        uintptr_t slot = slots[i];
        if (slot == 0) {
            return false;
        }
        if (slotRec(slot) == r) {
            return true;
        }
    }
}

void table_slots_foreach(const uintptr_t *slots, size_t mask,
                         void (*fn)(const struct rec *r, void *arg), void *arg)
{
    for (size_t i = 0; i <= mask; i++) {
        if (slots[i] != 0) {
            fn(slotRec(slots[i]), arg);
        }
    }
}

struct rec *table_clone(struct table *t, struct rec *r, uint64_t hash)
{
    size_t size = table_rec_size(r->key_len);
    struct rec *c = xmalloc(size);
    memcpy(c, r, size);
    if (r->response != NULL) {
        uint32_t n;
        memcpy(&n, r->response, sizeof(n));
        c->response = xmalloc(sizeof(uint32_t) + n);
        memcpy(c->response, r->response, sizeof(uint32_t) + n);
    }
    size_t i = hash & t->mask;
    while (slotRec(t->slots[i]) != r) {
        assert(t->slots[i] != 0);
        i = (i + 1) & t->mask;
    }
    t->slots[i] = slotMake(c, hash);
    if (r->heap_pos != UINT32_MAX) {
        /* The copy takes the original's place in the expiry index: same keys, same order. */
        assert(r->heap_pos < t->heap.len && t->heap.items[r->heap_pos] == r);
        t->heap.items[r->heap_pos] = c;
    }
    return c;
}
