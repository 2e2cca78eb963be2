/* table: the record table of the state machine: records keyed by (tenant, key) in an
 * open-addressing hash table (XXH3), tenants interned with their usage counters, and the
 * expiry index.
 *
 * The table is an internal structure of fsm.c: nothing outside the state machine touches
 * it, and nothing the state machine decides depends on its iteration order. */
#ifndef IDEM_SERVER_TABLE_H
#define IDEM_SERVER_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "expiry.h"
#include "fsm.h"
#include "xmalloc.h"

/* One (tenant, key) record, allocated with its key inline (table_rec_size()): 74 bytes of
 * fields, the fingerprint and the key. The hash table holds tagged pointers to records, so a
 * record carries neither a chain pointer nor its hash (recomputed on growth and removal). */
struct rec {
    uint64_t token;          /* fencing token of the current or last holder */
    uint64_t created_at;     /* ms, leader clock */
    uint64_t lease_deadline; /* ms */
    uint64_t expires_at;     /* ms: ttl deadline; tombstones: when they are dropped */
    uint64_t tombstone_ttl;  /* ms */
    uint8_t *response;       /* owned: u32 length + packed StoredResponse, or NULL */
    uint8_t attempt[16];     /* XXH3-128 of the attempt id; all zero when none */
    uint32_t heap_pos;       /* position in the expiry index */
    uint16_t tenant;         /* index into table.tenants */
    uint8_t state;           /* Idem__RecordState */
    uint8_t completion;      /* Idem__Completion */
    uint8_t has_attempt;
    uint8_t key_len; /* 1..KEY_MAX_LEN */
    uint8_t fp[FSM_FINGERPRINT_LEN];
    uint8_t key[];
};

struct tenant {
    char *name; /* owned, NUL-terminated */
    size_t name_len;
    uint64_t hash;
    uint64_t records; /* counted records (all but released markers) */
    uint64_t bytes;   /* key + fingerprint + response of counted records */
};

/* Records live in an open-addressing hash table (linear probing, backward-shift deletion,
 * at most 3/4 full). A slot is 0 or a record pointer with the top 16 bits of the record's
 * hash in its top 16 bits, so most probes that miss never touch a record. This relies on
 * user-space addresses fitting in 48 bits (x86-64 and aarch64 Linux); table_insert checks.
 *
 * Growth is incremental: when the array is full, a twice larger one becomes `slots` and
 * the previous one becomes `old`, whose slots then move over a few at a time: each insert
 * moves TABLE_MIGRATE_STEP positions, zeroing them in `old` (lookups and removals move
 * none, so that table_find stays read-only). New records go to `slots` only, and every
 * record is in exactly one place: `slots`, or the part of `old` not migrated yet. Lookups
 * try `slots`, then `old`. The migration starts right after an empty slot of `old` (a
 * probe-run boundary) and moves positions mig_first, mig_first + 1, ... circularly; the
 * migrated positions are the mig_done ones from mig_first. A key whose home lies there is
 * looked for from the cursor (mig_first + mig_done) on: its run used to be contiguous from
 * its home to it, and the part from the cursor on is untouched. A migration ends after
 * (old slots) / TABLE_MIGRATE_STEP inserts, long before the 3/4 * (old slots) inserts
 * that fill the new array; the next growth would finish it at once otherwise. */
#define TABLE_MIGRATE_STEP 64

/* The next growth's array (`next` below) is faulted in ahead of it. Fresh pages cost 1-4
 * us each to fault in on the 2-core VM (16 MiB: 7-16 ms), and a migration writes each
 * insert's ~48 moved records to random places of the new array, so all its pages used to
 * fault within the first hundred inserts of the migration: tens of ms of one apply batch on
 * every node at the same index. Now, when a mapped array is 5/8 full (the growth comes at
 * 3/4), the next one (twice its size) is allocated and the owner's prefaulter (the daemon's:
 * a thread at the lowest priority) faults it in (xbig_prefault, xmalloc.h), long before it is
 * needed: 131,072 inserts before
 * for 1M slots. (Until 2026-12 each insert faulted one page of it in on the loop: 8,192
 * pages of a 2M-slot array within 0.25 s at 35k claims/s, on every node at once.) */

/* Bytes of the secret that keys record hashes (XXH3's secret: at least 136). */
#define TABLE_SECRET_LEN 192

struct table {
    uintptr_t *slots;
    size_t mask;    /* slots - 1; a power of two */
    size_t count;   /* records in both arrays, released markers included */
    uintptr_t *old; /* the array being migrated from, or NULL */
    size_t old_mask;
    size_t mig_first;             /* first position of `old` migrated (right after an empty one) */
    size_t mig_done;              /* positions of `old` migrated so far */
    uintptr_t *next;              /* the next growth's (mapped) array, allocated ahead, or NULL */
    struct xbig_prefault next_pf; /* faulting `next` in; waited for before `next` is used */
    struct tenant *tenants;
    size_t n_tenants;
    size_t cap_tenants;
    uint32_t *tenant_slots; /* open addressing: tenant index + 1, 0 empty */
    size_t tenant_mask;
    struct expiry heap;
    /* Record hashes are keyed with a secret drawn per process when one is given
     * (table_init), so that nobody outside can choose keys that pile up in one probe run
     * (hash flooding). Nothing replicated depends on them: snapshots are read in any order,
     * the digest is a sum, expiry and listings go by (expires_at, token) and token. */
    bool keyed;
    uint8_t secret[TABLE_SECRET_LEN];
};

/* `pf` (borrowed, may be NULL: at once) faults the next growth's array in (xbig_prefault).
 * `secret` (TABLE_SECRET_LEN random bytes, copied; NULL: unkeyed, the same hashes in every
 * process, as tests and benchmarks want) keys the record hashes. */
void table_init(struct table *t, const struct xbig_prefaulter *pf, const uint8_t *secret);
/* Frees every record, tenant and index. */
void table_close(struct table *t);

/* The tenant's index, or -1 when unknown. `name` is borrowed. */
int table_tenant_find(const struct table *t, const char *name, size_t len);
/* The tenant's index, interning a copy of `name` (borrowed) when new; -1 when the table
 * already holds FSM_TENANTS_MAX tenants. */
int table_tenant_intern(struct table *t, const char *name, size_t len);

uint64_t table_hash(const struct table *t, int tenant, const uint8_t *key, size_t len);

/* The record for (tenant, key), or NULL. `key` is borrowed. */
struct rec *table_find(const struct table *t, int tenant, uint64_t hash, const uint8_t *key,
                       size_t len);

/* Starts loading the home slot of `hash` into the cache, for a table_find or table_insert
 * of that hash soon after (restores go through their records by batches). */
static inline void table_prefetch(const struct table *t, uint64_t hash)
{
    __builtin_prefetch(&t->slots[hash & t->mask], 1);
}

/* Bytes of one record with a key of key_len bytes. */
size_t table_rec_size(size_t key_len);

/* Makes room for `n` records in all without growing again. Finishes any migration, and
 * rehashes synchronously (it is meant for a restore, on an empty table). */
void table_reserve(struct table *t, size_t n);

/* Finishes a migration in progress at once, so that `slots` alone holds every record (a
 * no-op when none is). fsm_freeze calls it: the one rehash left on the apply path that is
 * not incremental, only when a snapshot starts while a growth is in progress. */
void table_settle(struct table *t);

/* Bytes held by `next`, the next growth's array allocated ahead (0 when none). */
size_t table_next_bytes(const struct table *t);

/* Memory of the table's slot arrays, in bytes. */
struct table_index_bytes {
    uint64_t slots;     /* the array in use */
    uint64_t migrating; /* the part of `old` not migrated yet (migrated chunks are given back) */
    uint64_t ahead;     /* the part of `next` faulted in so far */
};
void table_get_index_bytes(const struct table *t, struct table_index_bytes *out);

/* Moves a migration in progress forward by up to n positions; true when none is left. */
bool table_settle_step(struct table *t, size_t n);

/* Allocates a zeroed record holding a copy of `key` (borrowed), links it into the hash
 * table (not the expiry index) and returns it; the table owns it. The caller makes sure
 * no record for (tenant, key) exists. */
struct rec *table_insert(struct table *t, int tenant, uint64_t hash, const uint8_t *key,
                         size_t len);

/* Unlinks the record from the hash table and the expiry index and frees it. */
void table_remove(struct table *t, struct rec *r);

/* Calls fn(r, arg) for every record, in no particular order. fn must not modify the table. */
void table_foreach(const struct table *t, void (*fn)(const struct rec *r, void *arg), void *arg);

/* ---- copy-on-write support for frozen snapshots (fsm_freeze, fsm.h) -------------------
 *
 * A frozen view is a copy of the slot array: it shares the records with the live table.
 * While it exists the state machine must neither modify nor free a record the copy holds:
 * it clones the record first (table_clone) or unlinks it without freeing it
 * (table_unlink), and frees it once the view is gone (table_rec_free). */

/* The hash of a record of this table (what table_find was called with). */
uint64_t table_rec_hash(const struct table *t, const struct rec *r);

/* Whether the slot array `slots` (mask + 1 entries, a copy of a settled table's: see
 * table_settle) holds r, whose hash is `hash`. Compares addresses only: it never reads a
 * record. */
bool table_slots_hold(const uintptr_t *slots, size_t mask, uint64_t hash, const struct rec *r);

/* Calls fn(r, arg) for every record of a slot array (a table's `slots` or `old`, or a copy
 * of a settled table's `slots`). */
void table_slots_foreach(const uintptr_t *slots, size_t mask,
                         void (*fn)(const struct rec *r, void *arg), void *arg);

/* Replaces r in the hash table and in the expiry index by a new copy of it (its stored
 * response copied too) and returns the copy; r itself is left untouched and is no longer
 * the table's: the caller frees it with table_rec_free. `hash` is r's. */
struct rec *table_clone(struct table *t, struct rec *r, uint64_t hash);

/* Unlinks the record from the hash table and the expiry index without freeing it; the
 * caller frees it with table_rec_free. */
void table_unlink(struct table *t, struct rec *r);

/* Frees a record that is no longer the table's (its response too). */
void table_rec_free(struct rec *r);

#endif
