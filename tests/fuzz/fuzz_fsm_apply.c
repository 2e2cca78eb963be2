/* fuzz_fsm_apply: state-machine commands (packed Idem__Command bytes, as a Raft log entry
 * carries them) applied in sequence to one state machine.
 *
 * Input: a sequence of commands, each a 2-byte little-endian length and that many bytes (a
 * length that overruns the input takes what is left). Command k is applied at command
 * index k + 1, so that the fencing tokens the fuzzer must guess stay small.
 *
 * Invariants, checked after every command (abort() on violation):
 * - the per-state counts add up to the record count;
 * - an INVALID outcome changes nothing: digest and stats as before;
 * - any other outcome moves last_index to the command's index; the clock never goes back;
 * and at the end a snapshot restored into a second state machine has the same digest and
 * stats, and snapshotting that one gives a snapshot that restores to the same digest. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_COMMANDS 64

static void fail(const char *what, size_t k)
{
    fprintf(stderr, "fuzz_fsm_apply: invariant violated after command %zu: %s\n", k, what);
    abort();
}

static void checkCounts(const struct fsm_stats *s, size_t k)
{
    if (s->records != s->processing + s->completed + s->quarantined + s->tombstones +
                          s->released) {
        fprintf(stderr, "records %llu processing %llu completed %llu quarantined %llu "
                        "tombstones %llu released %llu\n",
                (unsigned long long)s->records, (unsigned long long)s->processing,
                (unsigned long long)s->completed, (unsigned long long)s->quarantined,
                (unsigned long long)s->tombstones, (unsigned long long)s->released);
        fail("state counts do not add up to the record count", k);
    }
}

static int statsEqual(const struct fsm_stats *a, const struct fsm_stats *b)
{
    return a->records == b->records && a->processing == b->processing &&
           a->completed == b->completed && a->quarantined == b->quarantined &&
           a->tombstones == b->tombstones && a->released == b->released &&
           a->bytes == b->bytes && a->tenants == b->tenants && a->clock_ms == b->clock_ms &&
           a->last_index == b->last_index;
}

/* Snapshot f, restore into a fresh state machine, and compare; twice, so that a snapshot
 * written by a restored state machine is checked as well. */
static void checkSnapshot(const struct fsm *f, size_t k)
{
    uint8_t d0[16], d1[16], d2[16];
    struct fsm_stats s0, s1;
    fsm_digest(f, d0);
    fsm_get_stats(f, &s0);

    uint8_t *snap = NULL;
    size_t len = 0;
    fsm_snapshot(f, &snap, &len);
    struct fsm *g = fsm_new();
    const char *why = NULL;
    if (fsm_restore(g, snap, len, &why) != 0) {
        fprintf(stderr, "restore: %s\n", why);
        fail("a snapshot of a live state machine does not restore", k);
    }
    fsm_digest(g, d1);
    fsm_get_stats(g, &s1);
    if (memcmp(d0, d1, 16) != 0) {
        fail("restored state machine has a different digest", k);
    }
    if (!statsEqual(&s0, &s1)) {
        fail("restored state machine has different stats", k);
    }
    free(snap);

    fsm_snapshot(g, &snap, &len);
    struct fsm *h = fsm_new();
    if (fsm_restore(h, snap, len, &why) != 0) {
        fprintf(stderr, "restore: %s\n", why);
        fail("a snapshot of a restored state machine does not restore", k);
    }
    fsm_digest(h, d2);
    if (memcmp(d0, d2, 16) != 0) {
        fail("second-generation restore has a different digest", k);
    }
    free(snap);
    fsm_close(h);
    fsm_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsm *f = fsm_new();
    struct fsm_result r;
    struct fsm_stats before, after;
    uint8_t dbefore[16], dafter[16];
    size_t pos = 0;
    size_t k = 0;

    fsm_get_stats(f, &before);
    fsm_digest(f, dbefore);
    while (pos + 2 <= size && k < MAX_COMMANDS) {
        size_t n = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
        pos += 2;
        if (n > size - pos) {
            n = size - pos;
        }
        /* A private copy, so that ASan sees a read past the command's own bytes. */
        uint8_t *cmd = malloc(n ? n : 1);
        if (cmd == NULL) {
            abort();
        }
        memcpy(cmd, data + pos, n);
        pos += n;
        uint64_t index = (uint64_t)k + 1;

        Idem__Outcome o = fsm_apply(f, index, cmd, n, &r);
        free(cmd);
        if (o != r.outcome) {
            fail("returned outcome differs from out->outcome", k);
        }
        fsm_get_stats(f, &after);
        fsm_digest(f, dafter);
        checkCounts(&after, k);
        if (o == IDEM__OUTCOME__OUTCOME_INVALID) {
            if (r.detail == NULL) {
                fail("INVALID without a detail", k);
            }
            if (memcmp(dbefore, dafter, 16) != 0) {
                fprintf(stderr, "detail: %s\n", r.detail);
                fail("INVALID outcome changed the digest", k);
            }
            if (!statsEqual(&before, &after)) {
                fprintf(stderr, "detail: %s\n", r.detail);
                fail("INVALID outcome changed the stats", k);
            }
        } else {
            if (after.last_index != index) {
                fail("applied command did not move last_index to its index", k);
            }
            if (after.clock_ms < before.clock_ms) {
                fail("clock went back", k);
            }
        }
        before = after;
        memcpy(dbefore, dafter, 16);
        k++;
    }
    checkSnapshot(f, k);
    fsm_close(f);
    return 0;
}
