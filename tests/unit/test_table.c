/* The record table (server/table.c): incremental growth.
 *
 * The table doubles by moving its old slot array over a few positions per insert (see
 * table.h). These tests drive it through several growths against a reference model and
 * check, after every operation of a migration, that each record is found exactly once,
 * that table_foreach visits each exactly once, and that the old array holds records only
 * in its part not migrated yet. Keys are chosen by their home slot to build the probe runs
 * that matter: runs whose members' homes were migrated while they were not (they must be
 * looked for from the migration cursor), and a run that wraps around the array's end. */
/* mincore(2) is not in POSIX.1-2008: glibc shows it with _DEFAULT_SOURCE. */
#define _DEFAULT_SOURCE

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "fsm_helpers.h"
#include "fsm_internal.h"
#include "prefault_thread.h"
#include "table.h"
#include "xmalloc.h"

/* Bytes of mapped array p (page-aligned) resident in memory (mincore(2)). */
static size_t residentBytes(const void *p, size_t bytes)
{
    size_t pages = (bytes + XBIG_PAGE - 1) / XBIG_PAGE;
    unsigned char *vec = malloc(pages);
    assert_non_null(vec);
    assert_int_equal(mincore((void *)p, bytes, vec), 0);
    size_t n = 0;
    for (size_t i = 0; i < pages; i++) {
        n += vec[i] & 1;
    }
    free(vec);
    return n * XBIG_PAGE < bytes ? n * XBIG_PAGE : bytes;
}

#define KEY_LEN 9 /* "k" + 8 digits */

/* The table, and for every candidate key c (the key "k%08u" of c) its record or NULL. */
struct model {
    struct table t;
    int tn;
    size_t cap;
    struct rec **rec;
    unsigned *visits;
    size_t live;
    /* What the checks saw: records of `old` not migrated yet whose home was, and those
     * of them whose run wraps around the end of `old`; removals of such records. */
    size_t seen_moved, seen_wrapped;
    size_t removed_moved, removed_wrapped;
};

static void keyOf(char out[KEY_LEN + 1], size_t c)
{
    if (snprintf(out, KEY_LEN + 1, "k%08zu", c) > KEY_LEN) {
        fail_msg("key number %zu does not fit %d characters", c, KEY_LEN);
    }
}

static uint64_t hashOf(const struct model *m, size_t c)
{
    char k[KEY_LEN + 1];
    keyOf(k, c);
    return table_hash(&m->t, m->tn, (const uint8_t *)k, KEY_LEN);
}

static void modelInit(struct model *m, size_t cap)
{
    memset(m, 0, sizeof(*m));
    table_init(&m->t, &prefault_thread, NULL); /* as the daemon's state machine */
    m->tn = table_tenant_intern(&m->t, "t1", 2);
    assert_int_equal(m->tn, 0);
    m->cap = cap;
    m->rec = calloc(cap, sizeof(*m->rec));
    m->visits = calloc(cap, sizeof(*m->visits));
    assert_non_null(m->rec);
    assert_non_null(m->visits);
}

static void modelClose(struct model *m)
{
    table_close(&m->t);
    free(m->rec);
    free(m->visits);
}

static struct rec *find(struct model *m, size_t c)
{
    char k[KEY_LEN + 1];
    keyOf(k, c);
    return table_find(&m->t, m->tn, hashOf(m, c), (const uint8_t *)k, KEY_LEN);
}

static void insert(struct model *m, size_t c)
{
    assert_null(m->rec[c]);
    char k[KEY_LEN + 1];
    keyOf(k, c);
    struct rec *r = table_insert(&m->t, m->tn, hashOf(m, c), (const uint8_t *)k, KEY_LEN);
    assert_non_null(r);
    r->token = c; /* what clone must carry over */
    m->rec[c] = r;
    m->live++;
}

static size_t relOld(const struct table *t, size_t pos)
{
    return (pos - t->mig_first) & t->old_mask;
}

/* Where r sits in `old`, or SIZE_MAX (it is then in `slots`). */
static size_t oldPos(const struct table *t, const struct rec *r)
{
    if (t->old == NULL) {
        return SIZE_MAX;
    }
    for (size_t i = 0; i <= t->old_mask; i++) {
        if ((t->old[i] & ((UINT64_C(1) << 48) - 1)) == (uintptr_t)r) {
            return i;
        }
    }
    return SIZE_MAX;
}

/* Notes whether a record about to be removed sits in `old` with a migrated home. */
static void noteRemoval(struct model *m, size_t c)
{
    const struct table *t = &m->t;
    size_t p = oldPos(t, m->rec[c]);
    if (p == SIZE_MAX) {
        return;
    }
    size_t home = hashOf(m, c) & t->old_mask;
    if (relOld(t, home) < t->mig_done) {
        m->removed_moved++;
        if (p < home) {
            m->removed_wrapped++;
        }
    }
}

static void removeKey(struct model *m, size_t c)
{
    noteRemoval(m, c);
    table_remove(&m->t, m->rec[c]);
    m->rec[c] = NULL;
    m->live--;
}

/* Replaces the record by a copy (what copy-on-write does) and frees the original. */
static void cloneKey(struct model *m, size_t c)
{
    struct rec *r = m->rec[c];
    struct rec *copy = table_clone(&m->t, r, table_rec_hash(&m->t, r));
    assert_ptr_not_equal(copy, r);
    assert_int_equal(copy->token, c);
    table_rec_free(r);
    m->rec[c] = copy;
}

/* Unlinks the record without freeing it (a frozen view's), checks it is gone, frees it. */
static void unlinkKey(struct model *m, size_t c)
{
    struct rec *r = m->rec[c];
    noteRemoval(m, c);
    table_unlink(&m->t, r);
    m->rec[c] = NULL;
    m->live--;
    assert_null(find(m, c));
    table_rec_free(r);
}

static void visit(const struct rec *r, void *arg)
{
    struct model *m = arg;
    assert_int_equal(r->key_len, KEY_LEN);
    char k[KEY_LEN + 1];
    memcpy(k, r->key, KEY_LEN);
    k[KEY_LEN] = '\0';
    size_t c = strtoull(k + 1, NULL, 10);
    assert_true(c < m->cap);
    assert_ptr_equal(m->rec[c], r);
    m->visits[c]++;
}

/* Every key of the model answers as the model says, foreach visits every record once, the
 * counts agree, and `old` holds records only where it has not been migrated. */
static void check(struct model *m, const size_t *keys, size_t n_keys)
{
    const struct table *t = &m->t;
    assert_int_equal(t->count, m->live);
    for (size_t i = 0; i < n_keys; i++) {
        size_t c = keys[i];
        struct rec *r = find(m, c);
        if (r != m->rec[c]) {
            fail_msg("key %zu: found %p, expected %p (old %s, mig_first %zu, mig_done %zu)", c,
                     (void *)r, (void *)m->rec[c], t->old ? "yes" : "no", t->mig_first,
                     t->mig_done);
        }
    }
    memset(m->visits, 0, m->cap * sizeof(*m->visits));
    table_foreach(t, visit, m);
    size_t visited = 0;
    for (size_t i = 0; i < n_keys; i++) {
        size_t c = keys[i];
        assert_int_equal(m->visits[c], m->rec[c] != NULL ? 1 : 0);
        visited += m->visits[c];
    }
    assert_int_equal(visited, m->live);
    if (t->old == NULL) {
        assert_int_equal(t->mig_done, 0);
        return;
    }
    assert_true(t->mig_done <= t->old_mask);
    size_t e = (t->mig_first - 1) & t->old_mask;
    assert_int_equal(t->old[e], 0); /* the boundary the migration started after */
    for (size_t p = 0; p <= t->old_mask; p++) {
        uintptr_t slot = t->old[p];
        if (relOld(t, p) < t->mig_done) {
            assert_int_equal(slot, 0);
            continue;
        }
        if (slot == 0) {
            continue;
        }
        const struct rec *r = (const struct rec *)(slot & ((UINT64_C(1) << 48) - 1));
        size_t home = table_rec_hash(t, r) & t->old_mask;
        if (relOld(t, home) < t->mig_done) {
            m->seen_moved++;
            if (p < home) {
                m->seen_wrapped++;
            }
        }
    }
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Random inserts, removals, unlinks, clones and settles over four growths (1024 to 16384
 * slots), checked against the model after every operation while a migration is in
 * progress and every 97 otherwise. */
static void test_random_ops_across_growths(void **state)
{
    (void)state;
    enum { KEYS = 9000, OPS = 60000 };
    struct model m;
    modelInit(&m, KEYS);
    size_t *keys = malloc(KEYS * sizeof(*keys));
    assert_non_null(keys);
    for (size_t i = 0; i < KEYS; i++) {
        keys[i] = i;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    size_t growths = 0, settles = 0, mid_ops = 0;
    for (int op = 0; op < OPS; op++) {
        size_t c = (size_t)(xorshift(&x) % KEYS);
        unsigned r = (unsigned)(xorshift(&x) % 100);
        bool was_old = m.t.old != NULL;
        size_t mask = m.t.mask;
        if (m.t.old != NULL && r % 4 == 0) {
            /* A record just past the cursor: its run likely crosses the cursor. */
            size_t skip = (size_t)(xorshift(&x) % 4);
            size_t p = (m.t.mig_first + m.t.mig_done) & m.t.old_mask;
            for (size_t n = 0; n <= m.t.old_mask; n++, p = (p + 1) & m.t.old_mask) {
                if (m.t.old[p] != 0 && skip-- == 0) {
                    break;
                }
            }
            if (m.t.old[p] == 0) {
                continue; /* nothing left in `old` */
            }
            const struct rec *near = (const struct rec *)(m.t.old[p] & ((UINT64_C(1) << 48) - 1));
            char k[KEY_LEN + 1];
            memcpy(k, near->key, KEY_LEN);
            k[KEY_LEN] = '\0';
            c = strtoull(k + 1, NULL, 10);
            r %= 45; /* remove, unlink or clone it */
        }
        if (m.rec[c] == NULL) {
            if (r < 70) {
                insert(&m, c);
            } else {
                assert_null(find(&m, c));
            }
        } else if (r < 20) {
            removeKey(&m, c);
        } else if (r < 30) {
            unlinkKey(&m, c);
        } else if (r < 45) {
            cloneKey(&m, c);
        } else if (r == 45 && m.t.old != NULL) {
            table_settle(&m.t);
            assert_null(m.t.old);
            settles++;
        } else {
            assert_ptr_equal(find(&m, c), m.rec[c]);
        }
        growths += m.t.mask != mask;
        if (m.t.old != NULL || was_old) {
            mid_ops++;
            check(&m, keys, KEYS);
        } else if (op % 97 == 0) {
            check(&m, keys, KEYS);
        }
    }
    check(&m, keys, KEYS);
    /* The run must have exercised what it is about. */
    assert_int_equal(growths, 4);
    assert_true(mid_ops > 100);
    assert_true(m.seen_moved > 0);
    assert_true(m.removed_moved > 0);
    print_message("growths %zu, ops mid-migration %zu, settles %zu, moved-home records seen "
                  "%zu (wrapped %zu), removed %zu (wrapped %zu)\n",
                  growths, mid_ops, settles, m.seen_moved, m.seen_wrapped, m.removed_moved,
                  m.removed_wrapped);
    free(keys);
    modelClose(&m);
}

/* A 1024-slot table filled to its limit (768 records) with three groups of keys chosen by
 * home slot: 200 whose homes are the last 24 slots (one run that wraps around the end, up
 * to slot 175), 150 whose homes are slots 300..310 (one run up to slot 449), and 418 alone
 * in their home slots in 500..999. The next insert starts the growth, after the empty slot
 * 176; the migration cursor then stops inside both runs, leaving members whose homes were
 * migrated and which are found only from the cursor. Inserts drive the migration to its
 * end; in between, such members (wrapped ones too) are removed, unlinked or cloned. */
static void test_runs_across_the_cursor(void **state)
{
    (void)state;
    enum { WRAP = 200, RUN = 150, ALONE = 418, FILLED = WRAP + RUN + ALONE, CAP = 400000 };
    struct model m;
    modelInit(&m, CAP);
    size_t *keys = malloc(CAP * sizeof(*keys));
    bool *home_used = calloc(1024, sizeof(*home_used));
    assert_non_null(keys);
    assert_non_null(home_used);
    size_t n_keys = 0, wrap = 0, run = 0, alone = 0, c = 0;
    while (wrap < WRAP || run < RUN || alone < ALONE) {
        assert_true(c < CAP);
        size_t home = hashOf(&m, c) & 1023;
        bool take = false;
        if (home >= 1000) {
            take = wrap < WRAP;
            wrap += take;
        } else if (home >= 300 && home <= 310) {
            take = run < RUN;
            run += take;
        } else if (home >= 500 && !home_used[home]) {
            take = alone < ALONE;
            alone += take;
            home_used[home] = take;
        }
        if (take) {
            keys[n_keys++] = c;
        }
        c++;
    }
    /* Interleave the groups' inserts. */
    for (size_t i = 0; i < n_keys; i++) {
        size_t k = (i * 7) % n_keys; /* gcd(7, 768) == 1: a permutation */
        insert(&m, keys[k]);
    }
    assert_int_equal(m.live, FILLED);
    assert_int_equal(m.t.mask, 1023);
    assert_null(m.t.old);
    for (size_t p = 0; p < 1024; p++) {
        bool full = p <= 175 || (p >= 300 && p <= 449) || p >= 1000 || (p >= 500 && home_used[p]);
        assert_int_equal(m.t.slots[p] != 0, full);
    }
    check(&m, keys, n_keys);

    size_t fresh = c;
    size_t inserts = 0;
    int round = 0;
    do {
        keys[n_keys++] = fresh;
        insert(&m, fresh++);
        inserts++;
        if (inserts == 1) {
            assert_non_null(m.t.old);
            assert_int_equal(m.t.mig_first, 177);
        }
        size_t moved_before = m.seen_moved;
        check(&m, keys, n_keys);
        if (m.seen_moved > moved_before) {
            /* Some record waits in `old` with a migrated home: remove one of them, unlink
             * another, clone a third (the first wrapped one when there is one), then
             * check again. */
            for (int pass = 0; pass < 3; pass++) {
                size_t pick = SIZE_MAX;
                for (size_t i = 0; i < n_keys && m.t.old != NULL; i++) {
                    size_t k = keys[i];
                    size_t p = m.rec[k] ? oldPos(&m.t, m.rec[k]) : SIZE_MAX;
                    size_t home = hashOf(&m, k) & m.t.old_mask;
                    if (p == SIZE_MAX || relOld(&m.t, home) >= m.t.mig_done) {
                        continue;
                    }
                    if (pick == SIZE_MAX || p < home) {
                        pick = k;
                    }
                    if (p < home) {
                        break;
                    }
                }
                if (pick == SIZE_MAX) {
                    break;
                }
                int what = (round + pass) % 3;
                if (what == 0) {
                    removeKey(&m, pick);
                } else if (what == 1) {
                    unlinkKey(&m, pick);
                } else {
                    cloneKey(&m, pick);
                }
                check(&m, keys, n_keys);
            }
            round++;
        }
    } while (m.t.old != NULL);
    assert_int_equal(m.t.mask, 2047);
    check(&m, keys, n_keys);
    print_message("migration in %zu inserts; moved-home records seen %zu (wrapped %zu), "
                  "removed %zu (wrapped %zu)\n",
                  inserts, m.seen_moved, m.seen_wrapped, m.removed_moved, m.removed_wrapped);
    assert_true(m.seen_moved > 0);
    assert_true(m.seen_wrapped > 0);
    assert_true(m.removed_moved > 0);
    assert_true(m.removed_wrapped > 0);
    free(home_used);
    free(keys);
    modelClose(&m);
}

/* table_reserve and table_settle mid-migration leave one array holding every record. */
static void test_reserve_and_settle_mid_migration(void **state)
{
    (void)state;
    enum { N = 5000 };
    struct model m;
    modelInit(&m, N);
    size_t *keys = malloc(N * sizeof(*keys));
    assert_non_null(keys);
    size_t n = 0;
    while (m.t.old == NULL || m.t.mig_done < 200) {
        keys[n] = n;
        insert(&m, n);
        n++;
    }
    check(&m, keys, n);
    table_settle(&m.t);
    assert_null(m.t.old);
    check(&m, keys, n);
    while (m.t.old == NULL) {
        keys[n] = n;
        insert(&m, n);
        n++;
    }
    size_t mask = m.t.mask;
    table_reserve(&m.t, N);
    assert_null(m.t.old);
    assert_true(m.t.mask > mask);
    check(&m, keys, n);
    while (n < N) {
        keys[n] = n;
        insert(&m, n);
        assert_null(m.t.old); /* reserved: no growth */
        n++;
    }
    check(&m, keys, n);
    free(keys);
    modelClose(&m);
}

/* Arrays of 128 Ki slots and more are mapped from the kernel, and the one being migrated
 * from gives its memory back chunk by chunk (madvise) as the cursor passes: two growths
 * (131072 to 262144 to 524288 slots) with removals, unlinks and clones all along, checked
 * every 256 operations while a migration is in progress. */
static void test_large_mapped_arrays(void **state)
{
    (void)state;
    enum { N = 300000 };
    struct model m;
    modelInit(&m, N);
    size_t *keys = malloc(N * sizeof(*keys));
    assert_non_null(keys);
    for (size_t i = 0; i < N; i++) {
        keys[i] = i;
    }
    uint64_t x = 0x2545f4914f6cdd1dULL;
    size_t checks = 0, growths = 0, ahead = 0;
    uint64_t last_migrating = 0;
    for (size_t c = 0; c < N; c++) {
        size_t mask = m.t.mask;
        uintptr_t *next = m.t.next;
        uint64_t ahead_before = 0;
        if (next != NULL) {
            struct table_index_bytes ib0;
            table_get_index_bytes(&m.t, &ib0);
            ahead_before = ib0.ahead;
        }
        insert(&m, c);
        growths += mask != m.t.mask && m.t.mask >= 262143;
        if (mask != m.t.mask && m.t.mask >= 131071) {
            /* The growth took the array allocated ahead (table.h), waited for the thread
             * that faulted it in, so that it is wholly resident (one insert's migration
             * wrote to a few dozen of its pages only), and the next one is not begun yet. */
            assert_ptr_equal(m.t.slots, next);
            assert_false(xbig_prefault_running(&m.t.next_pf));
            size_t bytes = (m.t.mask + 1) * sizeof(uintptr_t);
            assert_int_equal(residentBytes(m.t.slots, bytes), bytes);
            assert_null(m.t.next);
            ahead++;
        } else if (m.t.next != NULL && next != NULL) {
            /* Faulted in off the loop: what /metrics shows of it only grows, up to it all. */
            assert_ptr_equal(m.t.next, next);
            struct table_index_bytes ib1;
            table_get_index_bytes(&m.t, &ib1);
            assert_true(ib1.ahead >= ahead_before);
            assert_true(ib1.ahead <= table_next_bytes(&m.t));
        } else if (m.t.next != NULL) {
            /* Just allocated: its faulting in is under way, or done already. */
            assert_true(xbig_prefault_running(&m.t.next_pf) ||
                        residentBytes(m.t.next, table_next_bytes(&m.t)) == table_next_bytes(&m.t));
        }
        /* Allocated ahead by an insert that found the table 5/8 full, and only for an
         * array that will be mapped. */
        bool mapped_next = (m.t.mask + 1) * 2 * sizeof(uintptr_t) >= XBIG_MAP_MIN_BYTES;
        if (mask == m.t.mask && mapped_next && m.t.count - 1 >= (m.t.mask + 1) / 8 * 5) {
            assert_non_null(m.t.next);
        }
        if (!mapped_next) {
            assert_null(m.t.next);
        }
        /* What /metrics shows of the arrays (idem_table_index_bytes): the array in use;
         * during a migration, the old array's part not migrated yet, shrinking with each
         * insert; the next array's pages faulted in so far. */
        struct table_index_bytes ib;
        table_get_index_bytes(&m.t, &ib);
        assert_int_equal(ib.slots, (m.t.mask + 1) * sizeof(uintptr_t));
        if (m.t.next != NULL) {
            assert_true(ib.ahead <= xbig_prefault_done(&m.t.next_pf)); /* it runs meanwhile */
        } else {
            assert_int_equal(ib.ahead, 0);
        }
        if (m.t.old != NULL) {
            assert_true(ib.migrating > 0);
            assert_true(ib.migrating <= (m.t.old_mask + 1) * sizeof(uintptr_t));
            assert_true(mask != m.t.mask || ib.migrating < last_migrating);
        } else {
            assert_int_equal(ib.migrating, 0);
        }
        last_migrating = ib.migrating;
        size_t k = (size_t)(xorshift(&x) % (c + 1));
        if (m.rec[k] != NULL) {
            unsigned r = (unsigned)(xorshift(&x) % 8);
            if (r == 0) {
                removeKey(&m, k);
            } else if (r == 1) {
                unlinkKey(&m, k);
            } else if (r == 2) {
                cloneKey(&m, k);
            }
        }
        if (m.t.old != NULL && m.t.old_mask >= 131071 && c % 256 == 0) {
            check(&m, keys, c + 1);
            checks++;
        }
    }
    check(&m, keys, N);
    assert_int_equal(growths, 2);
    assert_int_equal(ahead, 3); /* to 131072, 262144 and 524288 slots */
    assert_true(checks >= 10);
    assert_true(m.seen_moved > 0);
    free(keys);
    modelClose(&m);
}

/* Through the state machine: a synchronous snapshot taken mid-migration restores to the
 * same digest; a freeze mid-migration settles the table, and records the view holds are
 * then cloned and unlinked while the live table grows again with its own migration; the
 * view still serialises to the state at the freeze. */
static void test_fsm_snapshot_and_freeze_mid_migration(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    char key[32];
    int n = 0;
    while (h.f->t.old == NULL) {
        snprintf(key, sizeof(key), "c%06d", n++);
        assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    }
    uint8_t *snap;
    size_t len;
    char d_live[33], d_restored[33];
    assert_int_equal(fsm_snapshot(h.f, &snap, &len), 0);
    struct fsm *x = fsm_new();
    assert_int_equal(fsm_restore(x, snap, len, NULL), 0);
    fsm_digest_hex(h.f, d_live);
    fsm_digest_hex(x, d_restored);
    assert_string_equal(d_live, d_restored);
    fsm_close(x);
    free(snap);

    struct fsm_frozen *z = fsm_freeze(h.f);
    assert_non_null(z);
    assert_null(h.f->t.old); /* settled */
    char d_freeze[33];
    fsm_digest_hex(h.f, d_freeze);
    int frozen_n = n;
    /* Grow again while frozen, and touch the frozen records mid-migration. */
    int touched = 0;
    while (h.f->t.old == NULL) {
        snprintf(key, sizeof(key), "c%06d", n++);
        assert_int_equal(th_claim(&h, 2, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    }
    for (int i = 0; i < frozen_n && h.f->t.old != NULL; i += 3) {
        snprintf(key, sizeof(key), "c%06d", i);
        /* Completing clones the frozen record; releasing a lease unlinks it. */
        Idem__Outcome o = i % 2 ? th_resolve(&h, 3, "t1", key, 0, 200, "ok")
                                : th_resolve(&h, 3, "t1", key, 1, 0, NULL);
        assert_int_equal(o, IDEM__OUTCOME__OUTCOME_OK);
        touched++;
        snprintf(key, sizeof(key), "c%06d", n++);
        assert_int_equal(th_claim(&h, 3, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    }
    assert_true(touched > 10);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "c%06d", i);
        Idem__Outcome want = i < frozen_n && i % 3 == 0 && i / 3 < touched && i % 2 == 0
                                 ? IDEM__OUTCOME__OUTCOME_NOT_FOUND
                                 : IDEM__OUTCOME__OUTCOME_OK;
        assert_int_equal(th_get(&h, 3, "t1", key), want);
    }
    assert_int_equal(fsm_frozen_write(z, &snap, &len), 0);
    fsm_thaw(h.f, z);
    x = fsm_new();
    assert_int_equal(fsm_restore(x, snap, len, NULL), 0);
    fsm_digest_hex(x, d_restored);
    assert_string_equal(d_freeze, d_restored);
    fsm_close(x);
    free(snap);
    th_close(&h);
}

/* The spare slot copy a freeze copies into is made ahead of it: once the table's next
 * growth will be mapped, each fresh claim keeps the spare as large as that growth's array
 * and faults one more page of it in (fsm_spare_step), so the freeze finds it whole and
 * copies into it instead of into fresh memory; the thaw keeps it for the next one. */
static void test_fsm_spare_made_ahead_of_the_freeze(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    char key[32];
    int n = 0;
    while (h.f->t.next == NULL) {
        snprintf(key, sizeof(key), "s%07d", n++);
        assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
        if (h.f->t.next == NULL) {
            assert_null(h.f->spare_slots); /* none before a mapped size */
        }
    }
    size_t want = table_next_bytes(&h.f->t);
    assert_true(want >= XBIG_MAP_MIN_BYTES);
    assert_int_equal(h.f->spare_n * sizeof(uintptr_t), want);
    /* Its faulting in was started at once, off the loop, over all of it (a fresh mapping). */
    assert_int_equal(h.f->spare_faulted, want);
    xbig_prefault_wait(&h.f->spare_pf);
    assert_int_equal(residentBytes(h.f->spare_slots, want), want);
    /* Claims of a key already there or of a fresh one start nothing more. */
    assert_int_equal(th_claim(&h, 1, "s0000000", 1, NULL), IDEM__OUTCOME__OUTCOME_IN_PROGRESS);
    snprintf(key, sizeof(key), "s%07d", n++);
    assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_false(xbig_prefault_running(&h.f->spare_pf));
    assert_int_equal(h.f->spare_faulted, want);
    uintptr_t *spare = h.f->spare_slots;
    char d_live[33], d_restored[33];
    fsm_digest_hex(h.f, d_live);
    assert_true(fsm_freeze_ready(h.f));
    struct fsm_frozen *z = fsm_freeze(h.f);
    assert_non_null(z);
    assert_ptr_equal(z->slots, spare);
    assert_null(h.f->spare_slots);
    /* None is made while the view is out: a claim now changes nothing of it. */
    snprintf(key, sizeof(key), "s%07d", n++);
    assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_null(h.f->spare_slots);
    uint8_t *snap;
    size_t len;
    assert_int_equal(fsm_frozen_write(z, &snap, &len), 0);
    fsm_thaw(h.f, z);
    assert_ptr_equal(h.f->spare_slots, spare);
    assert_int_equal(h.f->spare_n * sizeof(uintptr_t), want);
    /* The freeze copied the table's array, half the spare: the next fresh claim has the
     * rest faulted in (it was already: the thread finds its pages there). */
    size_t copied = (h.f->t.mask + 1) * sizeof(uintptr_t);
    assert_int_equal(h.f->spare_faulted, copied < want ? copied : want);
    snprintf(key, sizeof(key), "s%07d", n++);
    assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    assert_int_equal(h.f->spare_faulted, want);
    xbig_prefault_wait(&h.f->spare_pf);
    assert_int_equal(residentBytes(h.f->spare_slots, want), want);
    struct fsm *x = fsm_new();
    assert_int_equal(fsm_restore(x, snap, len, NULL), 0);
    fsm_digest_hex(x, d_restored);
    assert_string_equal(d_live, d_restored);
    fsm_close(x);
    free(snap);
    th_close(&h);
}

/* fsm_freeze_ready spreads the rest of a migration over calls of FSM_SETTLE_STEP
 * positions each, says true once none is left, and the freeze that follows is the state. */
static void test_freeze_ready_steps(void **state)
{
    (void)state;
    struct th h;
    th_init(&h);
    char key[32];
    int n = 0;
    /* Grow to an old array of at least 4 steps, stopping right after a growth. */
    while (h.f->t.old == NULL || h.f->t.old_mask + 1 < 4 * FSM_SETTLE_STEP) {
        snprintf(key, sizeof(key), "r%07d", n++);
        assert_int_equal(th_claim(&h, 1, key, 1, NULL), IDEM__OUTCOME__OUTCOME_ACQUIRED);
    }
    size_t left = h.f->t.old_mask + 1 - h.f->t.mig_done;
    size_t calls = 0;
    while (!fsm_freeze_ready(h.f)) {
        calls++;
        assert_non_null(h.f->t.old);
        assert_int_equal(h.f->t.old_mask + 1 - h.f->t.mig_done, left - calls * FSM_SETTLE_STEP);
    }
    assert_null(h.f->t.old);
    assert_int_equal(calls, (left - 1) / FSM_SETTLE_STEP);
    assert_true(calls >= 3);
    assert_true(fsm_freeze_ready(h.f)); /* nothing left: stays true */
    char d_live[33], d_restored[33];
    fsm_digest_hex(h.f, d_live);
    struct fsm_frozen *z = fsm_freeze(h.f);
    assert_non_null(z);
    uint8_t *snap;
    size_t len;
    assert_int_equal(fsm_frozen_write(z, &snap, &len), 0);
    fsm_thaw(h.f, z);
    struct fsm *x = fsm_new();
    assert_int_equal(fsm_restore(x, snap, len, NULL), 0);
    fsm_digest_hex(x, d_restored);
    assert_string_equal(d_live, d_restored);
    for (int i = 0; i < n; i += 997) {
        snprintf(key, sizeof(key), "r%07d", i);
        assert_int_equal(th_get(&h, 2, "t1", key), IDEM__OUTCOME__OUTCOME_OK);
    }
    fsm_close(x);
    free(snap);
    th_close(&h);
}

/* The expiry index past the size where its array is mapped and grows with mremap: every
 * record comes out in (expires_at, token) order, after removals in between. */
static void test_expiry_index_across_mapped_growth(void **state)
{
    (void)state;
    enum { N = 300000 }; /* 300000 pointers: 2.4 MB, mapped from 1 MiB on */
    struct rec *recs = calloc(N, sizeof(*recs));
    assert_non_null(recs);
    struct expiry e;
    expiry_init(&e);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        recs[i].expires_at = x % 100000;
        recs[i].token = i + 1;
        expiry_push(&e, &recs[i]);
    }
    assert_true(e.cap * sizeof(*e.items) >= ((size_t)1 << 20));
    for (size_t i = 0; i < N; i += 3) {
        expiry_remove(&e, &recs[i]);
    }
    size_t popped = 0;
    const struct rec *prev = NULL;
    for (struct rec *r = expiry_min(&e); r != NULL; r = expiry_min(&e)) {
        if (prev != NULL) {
            assert_true(prev->expires_at < r->expires_at ||
                        (prev->expires_at == r->expires_at && prev->token < r->token));
        }
        assert_int_not_equal((r->token - 1) % 3, 0);
        prev = r;
        expiry_remove(&e, r);
        popped++;
    }
    assert_int_equal(popped, N - (N + 2) / 3);
    expiry_close(&e);
    free(recs);
}

/* Keyed tables: a key's hash depends on the secret (so nobody who lacks it can choose keys
 * that share a probe run), and is the same for the same secret and tenant. */
static void test_keyed_hashes(void **state)
{
    (void)state;
    uint8_t s1[TABLE_SECRET_LEN], s2[TABLE_SECRET_LEN];
    for (size_t i = 0; i < TABLE_SECRET_LEN; i++) {
        s1[i] = (uint8_t)(i * 7 + 1);
        s2[i] = (uint8_t)(i * 13 + 5);
    }
    struct table a, a2, b, u;
    table_init(&a, NULL, s1);
    table_init(&a2, NULL, s1);
    table_init(&b, NULL, s2);
    table_init(&u, NULL, NULL);
    struct table *all[] = {&a, &a2, &b, &u};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(table_tenant_intern(all[i], "t1", 2), 0);
        assert_int_equal(table_tenant_intern(all[i], "t2", 2), 1);
    }
    unsigned differ_secret = 0, differ_unkeyed = 0, differ_tenant = 0;
    for (int k = 0; k < 64; k++) {
        char key[16];
        int n = snprintf(key, sizeof key, "key-%d", k);
        const uint8_t *p = (const uint8_t *)key;
        assert_true(table_hash(&a, 0, p, (size_t)n) == table_hash(&a2, 0, p, (size_t)n));
        differ_secret += table_hash(&a, 0, p, (size_t)n) != table_hash(&b, 0, p, (size_t)n);
        differ_unkeyed += table_hash(&a, 0, p, (size_t)n) != table_hash(&u, 0, p, (size_t)n);
        differ_tenant += table_hash(&a, 0, p, (size_t)n) != table_hash(&a, 1, p, (size_t)n);
    }
    assert_int_equal(differ_secret, 64);
    assert_int_equal(differ_unkeyed, 64);
    assert_int_equal(differ_tenant, 64);
    for (size_t i = 0; i < 4; i++) {
        table_close(all[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_ops_across_growths),
        cmocka_unit_test(test_runs_across_the_cursor),
        cmocka_unit_test(test_reserve_and_settle_mid_migration),
        cmocka_unit_test(test_large_mapped_arrays),
        cmocka_unit_test(test_fsm_snapshot_and_freeze_mid_migration),
        cmocka_unit_test(test_fsm_spare_made_ahead_of_the_freeze),
        cmocka_unit_test(test_freeze_ready_steps),
        cmocka_unit_test(test_expiry_index_across_mapped_growth),
        cmocka_unit_test(test_keyed_hashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
