/* madvise's MADV_DONTNEED is not in POSIX.1-2008: glibc shows it with _DEFAULT_SOURCE. */
#define _DEFAULT_SOURCE

#include "table.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm.h"
#include "xmalloc.h"

_Static_assert(offsetof(struct rec, key) == 74 + 32, "record overhead grew: update the budget");
_Static_assert(KEY_MAX_LEN <= UINT8_MAX, "a record's key_len is one byte");
_Static_assert(FSM_TENANTS_MAX <= UINT16_MAX + 1, "a record's tenant index is two bytes");

#define TABLE_MIN_SLOTS 1024
#define SLOT_TAG_SHIFT 48
#define SLOT_PTR_MASK ((UINT64_C(1) << SLOT_TAG_SHIFT) - 1)

/* A mapped slot array (xbig_zalloc) being migrated from gives back its memory by chunks of
 * this many slots (64 KiB: whole pages for 4, 16 and 64 KiB pages), instead of all at the
 * migration's end (1.3 ms to unmap 16 MiB). */
#define SLOTS_CHUNK ((size_t)8192)

static uintptr_t *slotsAlloc(size_t n)
{
    return xbig_zalloc(n * sizeof(uintptr_t));
}

static void slotsRelease(uintptr_t *slots, size_t n)
{
    xbig_free(slots, n * sizeof(uintptr_t));
}

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

void table_init(struct table *t, const struct xbig_prefaulter *pf, const uint8_t *secret)
{
    memset(t, 0, sizeof(*t));
    if (secret != NULL) {
        t->keyed = true;
        memcpy(t->secret, secret, TABLE_SECRET_LEN);
    }
    t->next_pf.with = pf;
    t->slots = slotsAlloc(TABLE_MIN_SLOTS);
    t->mask = TABLE_MIN_SLOTS - 1;
    t->tenant_mask = 15;
    t->tenant_slots = xcalloc(t->tenant_mask + 1, sizeof(*t->tenant_slots));
    expiry_init(&t->heap);
}

static void slotsFree(uintptr_t *slots, size_t mask)
{
    for (size_t i = 0; i <= mask; i++) {
        if (slots[i] != 0) {
            struct rec *r = slotRec(slots[i]);
            free(r->response);
            free(r);
        }
    }
    slotsRelease(slots, mask + 1);
}

/* The size of the array the next growth makes. */
static size_t nextSlots(const struct table *t)
{
    return (t->mask + 1) * 2;
}

size_t table_next_bytes(const struct table *t)
{
    return t->next != NULL ? nextSlots(t) * sizeof(uintptr_t) : 0;
}

void table_get_index_bytes(const struct table *t, struct table_index_bytes *out)
{
    out->slots = (uint64_t)(t->mask + 1) * sizeof(uintptr_t);
    out->migrating =
        t->old != NULL ? (uint64_t)(t->old_mask + 1 - t->mig_done) * sizeof(uintptr_t) : 0;
    out->ahead = t->next != NULL ? xbig_prefault_done(&t->next_pf) : 0;
}

static void nextDrop(struct table *t)
{
    if (t->next != NULL) {
        xbig_prefault_wait(&t->next_pf);
        slotsRelease(t->next, nextSlots(t));
        t->next = NULL;
    }
}

void table_close(struct table *t)
{
    nextDrop(t);
    slotsFree(t->slots, t->mask);
    if (t->old != NULL) {
        slotsFree(t->old, t->old_mask);
    }
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
    if (t->keyed) {
        return XXH3_64bits_withSecret(key, len, t->secret, TABLE_SECRET_LEN) ^
               t->tenants[tenant].hash;
    }
    return XXH3_64bits_withSeed(key, len, t->tenants[tenant].hash);
}

static uint64_t recHash(const struct table *t, const struct rec *r)
{
    return table_hash(t, r->tenant, r->key, r->key_len);
}

/* Where to start looking in `old` for a key whose hash is `hash`: its home, or the
 * migration cursor when the home has been migrated (see table.h). */
static size_t oldStart(const struct table *t, uint64_t hash)
{
    size_t home = hash & t->old_mask;
    if (((home - t->mig_first) & t->old_mask) < t->mig_done) {
        return (t->mig_first + t->mig_done) & t->old_mask;
    }
    return home;
}

static struct rec *slotsFind(const uintptr_t *slots, size_t mask, size_t start, int tenant,
                             uint64_t hash, const uint8_t *key, size_t len)
{
    for (size_t i = start;; i = (i + 1) & mask) {
        uintptr_t slot = slots[i];
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

struct rec *table_find(const struct table *t, int tenant, uint64_t hash, const uint8_t *key,
                       size_t len)
{
    struct rec *r = slotsFind(t->slots, t->mask, hash & t->mask, tenant, hash, key, len);
    if (r == NULL && t->old != NULL) {
        r = slotsFind(t->old, t->old_mask, oldStart(t, hash), tenant, hash, key, len);
    }
    return r;
}

/* The position of r in the probe run of `slots` that starts at `start`, or SIZE_MAX. */
static size_t slotsLocate(const uintptr_t *slots, size_t mask, size_t start, const struct rec *r)
{
    for (size_t i = start;; i = (i + 1) & mask) {
        uintptr_t slot = slots[i];
        if (slot == 0) {
            return SIZE_MAX;
        }
        if (slotRec(slot) == r) {
            return i;
        }
    }
}

/* The slot of the table that holds r, whose hash is `hash`, in `slots` or in `old`. */
static uintptr_t *tableLocate(struct table *t, const struct rec *r, uint64_t hash, bool *in_old)
{
    size_t i = slotsLocate(t->slots, t->mask, hash & t->mask, r);
    if (i != SIZE_MAX) {
        *in_old = false;
        return &t->slots[i];
    }
    assert(t->old != NULL);
    i = slotsLocate(t->old, t->old_mask, oldStart(t, hash), r);
    assert(i != SIZE_MAX);
    *in_old = true;
    return &t->old[i];
}

static void slotsPut(uintptr_t *slots, size_t mask, uintptr_t slot, uint64_t hash)
{
    size_t i = hash & mask;
    while (slots[i] != 0) {
        i = (i + 1) & mask;
    }
    slots[i] = slot;
}

/* Positions tableMigrate moves as one batch: it first prefetches the batch's records, then
 * hashes them and prefetches their new homes, then puts them, so that the cache misses of
 * a batch overlap instead of costing one full memory latency each (grow-bench: ~8x the
 * cost of a plain insert per migrating insert without it). */
#define MIGRATE_BATCH 16

/* Moves up to `n` positions of `old` to `slots`, and frees `old` once all are. */
static void tableMigrate(struct table *t, size_t n)
{
    if (t->old == NULL) {
        return;
    }
    size_t left = t->old_mask + 1 - t->mig_done;
    if (n > left) {
        n = left;
    }
    bool mapped = (t->old_mask + 1) * sizeof(uintptr_t) >= XBIG_MAP_MIN_BYTES;
    size_t first_chunk = t->mig_first / SLOTS_CHUNK;
    size_t i = (t->mig_first + t->mig_done) & t->old_mask;
    for (size_t done = 0; done < n;) {
        size_t m = n - done < MIGRATE_BATCH ? n - done : MIGRATE_BATCH;
        uintptr_t batch[MIGRATE_BATCH];
        uint64_t hash[MIGRATE_BATCH];
        for (size_t k = 0; k < m; k++) {
            batch[k] = t->old[(i + k) & t->old_mask];
            if (batch[k] != 0) {
                /* The fields recHash reads: tenant and key_len, then the key. */
                const char *r = (const char *)slotRec(batch[k]);
                __builtin_prefetch(r + offsetof(struct rec, tenant));
                __builtin_prefetch(r + offsetof(struct rec, key) + 32);
            }
        }
        for (size_t k = 0; k < m; k++) {
            if (batch[k] != 0) {
                hash[k] = recHash(t, slotRec(batch[k]));
                __builtin_prefetch(&t->slots[hash[k] & t->mask], 1);
            }
        }
        for (size_t k = 0; k < m; k++) {
            if (batch[k] != 0) {
                slotsPut(t->slots, t->mask, batch[k], hash[k]);
                t->old[i] = 0;
            }
            if (mapped && (i + 1) % SLOTS_CHUNK == 0 && i / SLOTS_CHUNK != first_chunk) {
                /* A whole chunk migrated (it does not hold mig_first): give its pages back
                 * now, so that the final munmap has little left to free. They read as zero
                 * again, as migrated slots do. */
                madvise(&t->old[i + 1 - SLOTS_CHUNK], SLOTS_CHUNK * sizeof(uintptr_t),
                        MADV_DONTNEED);
            }
            i = (i + 1) & t->old_mask;
        }
        done += m;
    }
    t->mig_done += n;
    if (t->mig_done == t->old_mask + 1) {
        slotsRelease(t->old, t->old_mask + 1);
        t->old = NULL;
        t->old_mask = 0;
        t->mig_first = 0;
        t->mig_done = 0;
    }
}

void table_settle(struct table *t)
{
    tableMigrate(t, SIZE_MAX);
}

bool table_settle_step(struct table *t, size_t n)
{
    tableMigrate(t, n);
    return t->old == NULL;
}

/* Makes a slot array of `n` slots the table's, and the current one `old`, to be migrated
 * by tableMigrate (see table.h). Finishes the previous migration first. */
static void tableGrow(struct table *t, size_t n)
{
    table_settle(t);
    uintptr_t *fresh = NULL;
    if (t->next != NULL && n == nextSlots(t)) {
        xbig_prefault_wait(&t->next_pf);
        fresh = t->next; /* zero: nothing was written but zeroes */
        t->next = NULL;
    } else {
        nextDrop(t);
    }
    uintptr_t *old = t->slots;
    size_t old_mask = t->mask;
    t->slots = fresh != NULL ? fresh : slotsAlloc(n);
    t->mask = n - 1;
    if (t->count == 0) {
        slotsRelease(old, old_mask + 1);
        return;
    }
    /* Start right after an empty slot, where no probe run crosses; one exists since the
     * array is at most 3/4 full. */
    size_t e = 0;
    while (old[e] != 0) {
        e++;
    }
    t->old = old;
    t->old_mask = old_mask;
    t->mig_first = (e + 1) & old_mask;
    t->mig_done = 0;
}

static bool tableFits(size_t slots, size_t records)
{
    return records <= slots / 4 * 3;
}

void table_reserve(struct table *t, size_t n)
{
    table_settle(t);
    size_t slots = t->mask + 1;
    while (!tableFits(slots, n)) {
        slots *= 2;
    }
    if (slots != t->mask + 1) {
        tableGrow(t, slots);
        table_settle(t);
    }
}

/* Allocates the next growth's array once a mapped array is 5/8 full and starts faulting it
 * in off the loop (table.h, struct table's `next`). */
static void tablePrefault(struct table *t)
{
    size_t bytes = nextSlots(t) * sizeof(uintptr_t);
    if (bytes < XBIG_MAP_MIN_BYTES || t->count < (t->mask + 1) / 8 * 5) {
        return;
    }
    if (t->next == NULL) {
        t->next = slotsAlloc(nextSlots(t));
        xbig_prefault_start(&t->next_pf, t->next, 0, bytes);
    }
}

size_t table_rec_size(size_t key_len)
{
    return offsetof(struct rec, key) + key_len;
}

struct rec *table_insert(struct table *t, int tenant, uint64_t hash, const uint8_t *key, size_t len)
{
    assert(len > 0 && len <= KEY_MAX_LEN);
    assert(tenant >= 0 && (size_t)tenant < t->n_tenants);
    if (!tableFits(t->mask + 1, t->count + 1)) {
        /* A migration still in progress here is finished at once; with TABLE_MIGRATE_STEP
         * positions per insert it ends long before: after (old slots) / STEP inserts of
         * the 3/4 * (old slots) that fill the new array. */
        tableGrow(t, (t->mask + 1) * 2);
    }
    tableMigrate(t, TABLE_MIGRATE_STEP);
    tablePrefault(t);
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

/* Empties slots[i] by backward-shift deletion: pulls later members of the probe run into
 * the hole when their home slot does not lie cyclically in (hole, their slot].
 *
 * In `old` during a migration, the hole and the run after it lie in the part not migrated
 * yet (the run ends at the latest at the empty slot before mig_first, which stays empty).
 * A member whose home was migrated is pulled into the hole, as it must be: its home lies
 * cyclically before the hole, so not in (hole, its slot], and it is then looked for from
 * the cursor, which is at or before the hole. */
static void slotsDelete(const struct table *t, uintptr_t *slots, size_t mask, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uintptr_t slot = slots[j];
        if (slot == 0) {
            break;
        }
        size_t home = recHash(t, slotRec(slot)) & mask;
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            slots[i] = slot;
            i = j;
        }
    }
    slots[i] = 0;
}

void table_unlink(struct table *t, struct rec *r)
{
    bool in_old;
    uintptr_t *p = tableLocate(t, r, recHash(t, r), &in_old);
    if (in_old) {
        slotsDelete(t, t->old, t->old_mask, (size_t)(p - t->old));
    } else {
        slotsDelete(t, t->slots, t->mask, (size_t)(p - t->slots));
    }
    if (r->heap_pos != UINT32_MAX) {
        expiry_remove(&t->heap, r);
    }
    t->count--;
}

void table_foreach(const struct table *t, void (*fn)(const struct rec *r, void *arg), void *arg)
{
    table_slots_foreach(t->slots, t->mask, fn, arg);
    if (t->old != NULL) {
        table_slots_foreach(t->old, t->old_mask, fn, arg);
    }
}

/* ---- copy-on-write support ----------------------------------------------------------- */

uint64_t table_rec_hash(const struct table *t, const struct rec *r)
{
    return recHash(t, r);
}

bool table_slots_hold(const uintptr_t *slots, size_t mask, uint64_t hash, const struct rec *r)
{
    return slotsLocate(slots, mask, hash & mask, r) != SIZE_MAX;
}

/* How far ahead of the record it hands out table_slots_foreach loads records (in slots) and
 * their stored responses (closer: it reads the record's pointer to it). Slot order is hash
 * order, so every record is a cache miss of its own (and often a TLB miss): a snapshot of
 * 1M records spent most of its time waiting for them, one at a time. */
#define FOREACH_REC_AHEAD 32
#define FOREACH_RESP_AHEAD 16

static void prefetchRec(uintptr_t slot)
{
    if (slot != 0) {
        const char *r = (const char *)slotRec(slot);
        __builtin_prefetch(r);
        __builtin_prefetch(r + 64);
        __builtin_prefetch(r + 128);
    }
}

static void prefetchResponse(uintptr_t slot)
{
    if (slot != 0 && slotRec(slot)->response != NULL) {
        __builtin_prefetch(slotRec(slot)->response);
    }
}

void table_slots_foreach(const uintptr_t *slots, size_t mask,
                         void (*fn)(const struct rec *r, void *arg), void *arg)
{
    for (size_t i = 0; i <= mask; i++) {
        if (i + FOREACH_REC_AHEAD <= mask) {
            prefetchRec(slots[i + FOREACH_REC_AHEAD]);
        }
        if (i + FOREACH_RESP_AHEAD <= mask) {
            prefetchResponse(slots[i + FOREACH_RESP_AHEAD]);
        }
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
    bool in_old;
    *tableLocate(t, r, hash, &in_old) = slotMake(c, hash);
    if (r->heap_pos != UINT32_MAX) {
        /* The copy takes the original's place in the expiry index: same keys, same order. */
        assert(r->heap_pos < t->heap.len && t->heap.items[r->heap_pos] == r);
        t->heap.items[r->heap_pos] = c;
    }
    return c;
}
