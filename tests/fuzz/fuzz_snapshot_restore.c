/* fuzz_snapshot_restore: fsm_restore() on untrusted snapshot bytes (from disk or from
 * another node).
 *
 * Each input is restored three ways into a state machine that already holds records:
 *   1. as it is (mostly stops at the magic, the format or the checksum);
 *   2. with a correct XXH3-64 trailer appended, so that the fuzzer gets past the checksum;
 *   3. when it does not start with the magic: after "IDEMSNAP" and format 1, and with the
 *      trailer, so that the fuzzer works on the header and records directly.
 * Layout (server/fsm_snapshot.c): "IDEMSNAP" | u32 LE format | varint-delimited
 * SnapshotHeader | records, each varint-delimited | u64 LE XXH3-64 of the preceding bytes.
 *
 * Invariants (abort() on violation):
 * - a failed restore leaves the state machine's digest and stats unchanged, and says why;
 * - a successful one gives a state machine whose counts add up, whose snapshot restores to
 *   the same digest and stats, and which then stays equal to that copy when both apply the
 *   same expire and claim commands (the expiry heap built by restore is usable). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAGIC "IDEMSNAP"
#define MAGIC_LEN 8

static void fail(const char *what, int variant)
{
    fprintf(stderr, "fuzz_snapshot_restore: invariant violated (variant %d): %s\n", variant,
            what);
    abort();
}

static int statsEqual(const struct fsm_stats *a, const struct fsm_stats *b)
{
    return a->records == b->records && a->processing == b->processing &&
           a->completed == b->completed && a->quarantined == b->quarantined &&
           a->tombstones == b->tombstones && a->released == b->released &&
           a->bytes == b->bytes && a->tenants == b->tenants && a->clock_ms == b->clock_ms &&
           a->last_index == b->last_index;
}

static void checkCounts(const struct fsm *f, int variant)
{
    struct fsm_stats s;
    fsm_get_stats(f, &s);
    if (s.records != s.processing + s.completed + s.quarantined + s.tombstones + s.released) {
        fail("state counts do not add up to the record count", variant);
    }
}

static void applyPacked(struct fsm *f, uint64_t index, const Idem__Command *cmd)
{
    uint8_t buf[256];
    size_t n = idem__command__get_packed_size(cmd);
    if (n > sizeof buf) {
        abort();
    }
    idem__command__pack(cmd, buf);
    struct fsm_result r;
    fsm_apply(f, index, buf, n, &r);
}

static void claim(struct fsm *f, uint64_t index, uint64_t now, const char *tenant,
                  const char *key)
{
    uint8_t fp[32];
    memset(fp, 0x5a, sizeof fp);
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    c.tenant = (char *)tenant;
    c.key.data = (uint8_t *)key;
    c.key.len = strlen(key);
    c.fingerprint.data = fp;
    c.fingerprint.len = sizeof fp;
    c.lease_ms = 1000;
    c.ttl_ms = 10000;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    applyPacked(f, index, &cmd);
}

static void expire(struct fsm *f, uint64_t index, uint64_t now)
{
    Idem__ExpireCmd e = IDEM__EXPIRE_CMD__INIT;
    e.max_batch = 65536;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_EXPIRE;
    cmd.expire = &e;
    applyPacked(f, index, &cmd);
}

/* A state machine that is not empty, so that "unchanged" after a failed restore means
 * something. */
static struct fsm *populated(void)
{
    struct fsm *f = fsm_new();
    claim(f, 1, 1000, "t1", "k1");
    claim(f, 2, 1001, "t1", "k2");
    claim(f, 3, 1002, "t2", "k1");
    return f;
}

/* Applies the same commands to a and b and checks that they stay equal. */
static void stepBoth(struct fsm *a, struct fsm *b, int variant)
{
    struct fsm_stats s;
    fsm_get_stats(a, &s);
    if (s.last_index >= UINT64_MAX - 4 || s.clock_ms >= UINT64_MAX / 2) {
        return;
    }
    uint64_t ix = s.last_index + 1;
    uint64_t now = s.clock_ms;
    struct fsm *both[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        claim(both[i], ix, now + 1, "t1", "fresh-key");
        expire(both[i], ix + 1, now + 20000);
        expire(both[i], ix + 2, UINT64_MAX / 2);
    }
    uint8_t da[16], db[16];
    fsm_digest(a, da);
    fsm_digest(b, db);
    if (memcmp(da, db, 16) != 0) {
        fail("a restored state machine and its re-restored copy diverge on apply", variant);
    }
    checkCounts(a, variant);
}

static void restoreOne(const uint8_t *buf, size_t len, int variant)
{
    struct fsm *f = populated();
    uint8_t d0[16], d1[16];
    struct fsm_stats s0, s1;
    fsm_digest(f, d0);
    fsm_get_stats(f, &s0);

    /* A private copy, so that ASan sees any read past the snapshot's bytes. */
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        abort();
    }
    memcpy(copy, buf, len);
    const char *why = NULL;
    int rc = fsm_restore(f, copy, len, &why);
    free(copy);

    if (rc != 0) {
        if (rc != -1 || why == NULL) {
            fail("a failed restore must return -1 and say why", variant);
        }
        fsm_digest(f, d1);
        fsm_get_stats(f, &s1);
        if (memcmp(d0, d1, 16) != 0 || !statsEqual(&s0, &s1)) {
            fprintf(stderr, "why: %s\n", why);
            fail("a failed restore changed the state machine", variant);
        }
        fsm_close(f);
        return;
    }

    checkCounts(f, variant);
    fsm_digest(f, d0);
    fsm_get_stats(f, &s0);
    uint8_t *snap = NULL;
    size_t snap_len = 0;
    fsm_snapshot(f, &snap, &snap_len);
    struct fsm *g = populated();
    if (fsm_restore(g, snap, snap_len, &why) != 0) {
        fprintf(stderr, "why: %s\n", why);
        fail("the snapshot of a restored state machine does not restore", variant);
    }
    free(snap);
    fsm_digest(g, d1);
    fsm_get_stats(g, &s1);
    if (memcmp(d0, d1, 16) != 0) {
        fail("snapshot of a restored state machine restores to a different digest", variant);
    }
    if (!statsEqual(&s0, &s1)) {
        fail("snapshot of a restored state machine restores to different stats", variant);
    }
    stepBoth(f, g, variant);
    fsm_close(g);
    fsm_close(f);
}

static void putLE64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    restoreOne(data, size, 1);

    /* MAGIC_LEN + 4: room for the prefix of variant 3. */
    uint8_t *buf = malloc(MAGIC_LEN + 4 + size + 8);
    if (buf == NULL) {
        abort();
    }
    memcpy(buf, data, size);
    putLE64(buf + size, XXH3_64bits(buf, size));
    restoreOne(buf, size + 8, 2);

    if (size < MAGIC_LEN || memcmp(data, MAGIC, MAGIC_LEN) != 0) {
        memcpy(buf, MAGIC, MAGIC_LEN);
        memcpy(buf + MAGIC_LEN, "\1\0\0\0", 4);
        memcpy(buf + MAGIC_LEN + 4, data, size);
        size_t n = MAGIC_LEN + 4 + size;
        putLE64(buf + n, XXH3_64bits(buf, n));
        restoreOne(buf, n + 8, 3);
    }
    free(buf);
    return 0;
}
