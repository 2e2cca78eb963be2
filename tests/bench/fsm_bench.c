/* fsm-bench: micro-benchmark of the state machine on one core.
 *
 * Measures what the targets name: claim applies/s on fresh keys, complete
 * applies/s, replay-hit applies/s, table memory per record (without a body and with a
 * 1 KiB body), and snapshot / restore / digest time, the snapshot and the restore also as a
 * node does them (section 4). Commands are packed before the clock
 * starts, as the leader packs them before they reach apply; the timed loops run
 * fsm_apply() on bytes exactly as a replica does.
 *
 * Cold and warm. The first pass of claims runs in a fresh process, where every record
 * lands on a page the kernel must fault in and zero; on this VM that costs as much as the
 * apply itself. A long-running node reuses the memory of expired records instead, so the
 * bench keeps freed memory in the process (mallopt) and measures a second, warm pass on a
 * new state machine. Both figures are printed.
 *
 * Usage: fsm-bench [--records N] [--json]
 * It prints figures; it asserts nothing about speed. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#include "fsm.h"
#include "prefault_thread.h"
#include "packed.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* As the daemon makes them: the arrays allocated ahead are faulted in on a thread
 * (prefault_thread.h). */
/* As the daemon: the pre-fault thread, and record hashes keyed with a secret (random-looking
 * bytes, filled by main(); the daemon draws random ones). */
static uint8_t benchSecret[FSM_HASH_SECRET_LEN];
static const struct fsm_options daemonOpts = {.prefault = &prefault_thread,
                                              .hash_secret = benchSecret};
/* A restore goes into a table keyed with another secret, as on a restarted node (each
 * process draws its own): its slots are then in another order than the snapshot's records,
 * as they are there. */
static uint8_t restartSecret[FSM_HASH_SECRET_LEN];
static const struct fsm_options restartOpts = {.prefault = &prefault_thread,
                                               .hash_secret = restartSecret};

static double nowSec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t heapBytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void *xmallocOrDie(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "fsm-bench: out of memory\n");
        exit(1);
    }
    return p;
}

static uint8_t fingerprint[32];

static void packCompletes(struct packed *p, size_t n, const uint64_t *tokens, size_t body_len)
{
    size_t cap;
    pack_init(p, n, &cap);
    char key[32];
    uint8_t *body = xmallocOrDie(body_len + 1);
    memset(body, 'x', body_len);
    for (size_t i = 0; i < n; i++) {
        pack_key(key, sizeof(key), i);
        Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
        Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
        resp.status = 201;
        resp.body.data = body;
        resp.body.len = body_len;
        c.tenant = "bench";
        c.key.data = (uint8_t *)key;
        c.key.len = strlen(key);
        c.token = tokens[i];
        c.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
        c.response = &resp;
        Idem__Command cmd = IDEM__COMMAND__INIT;
        cmd.now_ms = 1700000001000ull;
        cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
        cmd.complete = &c;
        pack_append(p, &cap, &cmd);
    }
    free(body);
}

/* Applies every packed command; counts outcomes other than `want`. Returns seconds. */
static double applyAll(struct fsm *f, uint64_t *index, const struct packed *p, Idem__Outcome want,
                       uint64_t *tokens, size_t *unexpected)
{
    struct fsm_result r;
    *unexpected = 0;
    double t0 = nowSec();
    for (size_t i = 0; i < p->n; i++) {
        Idem__Outcome o =
            fsm_apply(f, (*index)++, p->buf + p->off[i], p->off[i + 1] - p->off[i], &r);
        if (o != want) {
            (*unexpected)++;
        }
        if (tokens != NULL) {
            tokens[i] = r.token;
        }
    }
    return nowSec() - t0;
}

int main(int argc, char **argv)
{
    uint64_t x = UINT64_C(0x243f6a8885a308d3);
    for (size_t b = 0; b < sizeof benchSecret; b++) {
        x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        benchSecret[b] = (uint8_t)(x >> 56);
        restartSecret[b] = (uint8_t)(x >> 48);
    }
    size_t n = 1000000;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--records") == 0 && i + 1 < argc) {
            n = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            fprintf(stderr, "usage: fsm-bench [--records N] [--json]\n");
            return 2;
        }
    }
    if (n == 0) {
        fprintf(stderr, "fsm-bench: --records must be positive\n");
        return 2;
    }
    memset(fingerprint, 0x5a, sizeof(fingerprint));
    char key[32];
    pack_key(key, sizeof(key), 0);
    const size_t key_len = strlen(key);
    uint64_t *tokens = xmallocOrDie(n * sizeof(uint64_t));
    size_t bad = 0, bad_total = 0;

    /* Keep freed memory in the process, as a long-running node does (see the top). */
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
    mallopt(M_MMAP_THRESHOLD, 1 << 30);

    /* 1. Claims on fresh keys (no body): a cold pass, then a warm pass that is measured for
     * time and memory. */
    struct packed claims, completes, completes1k;
    pack_claims(&claims, n, fingerprint);
    struct fsm *f = fsm_new_with(&daemonOpts);
    uint64_t index = 1;
    double t_claim_cold =
        applyAll(f, &index, &claims, IDEM__OUTCOME__OUTCOME_ACQUIRED, tokens, &bad);
    bad_total += bad;
    fsm_close(f);
    f = fsm_new_with(&daemonOpts);
    index = 1;
    size_t mem0 = heapBytes();
    double t_claim = applyAll(f, &index, &claims, IDEM__OUTCOME__OUTCOME_ACQUIRED, tokens, &bad);
    bad_total += bad;
    size_t mem_claimed = heapBytes() - mem0;

    /* 2. Completes (16-byte body), then 3. replay hits. */
    packCompletes(&completes, n, tokens, 16);
    double t_complete = applyAll(f, &index, &completes, IDEM__OUTCOME__OUTCOME_OK, NULL, &bad);
    bad_total += bad;
    double t_replay = applyAll(f, &index, &claims, IDEM__OUTCOME__OUTCOME_REPLAY, NULL, &bad);
    bad_total += bad;

    /* 4. Snapshot, restore and digest of the n-record table. A node takes a snapshot as
     * fsm_freeze (on its loop) and fsm_frozen_write (off it, checksum included): timed
     * together, then fsm_snapshot (the same bytes in one go, on a live table). A restore is
     * fsm_restore (checksum, decode, validate, insert); at a node's start the bytes are
     * first read from disk into a fresh buffer and their file's hash checked (snapstore):
     * timed as a copy into fresh memory and that hash, then the restore. */
    uint8_t *snap;
    size_t snap_len;
    double t0 = nowSec();
    struct fsm_frozen *z = fsm_freeze(f);
    fsm_frozen_write(z, &snap, &snap_len);
    double t_snap_node = nowSec() - t0;
    fsm_thaw(f, z);
    free(snap);
    t0 = nowSec();
    fsm_snapshot(f, &snap, &snap_len);
    double t_snap = nowSec() - t0;
    struct fsm *g = fsm_new_with(&restartOpts);
    const char *why = NULL;
    t0 = nowSec();
    int rc = fsm_restore(g, snap, snap_len, &why);
    double t_restore = nowSec() - t0;
    struct fsm *g2 = fsm_new_with(&restartOpts);
    t0 = nowSec();
    uint8_t *read_buf = xmallocOrDie(snap_len);
    memcpy(read_buf, snap, snap_len);
    volatile uint64_t file_hash = XXH3_64bits(read_buf, snap_len);
    (void)file_hash;
    rc |= fsm_restore(g2, read_buf, snap_len, &why);
    free(read_buf);
    double t_restore_start = nowSec() - t0;
    fsm_close(g2);
    t0 = nowSec();
    char d1[33], d2[33];
    fsm_digest_hex(f, d1);
    double t_digest = nowSec() - t0;
    fsm_digest_hex(g, d2);
    if (rc != 0 || strcmp(d1, d2) != 0) {
        fprintf(stderr, "fsm-bench: restore failed (%s) or digests differ\n", why ? why : "-");
        return 1;
    }
    free(snap);
    fsm_close(g);
    fsm_close(f);
    pack_free(&completes);

    /* 4b. The same snapshot taken off the apply path (fsm_freeze): the owner's pause is the
     * freeze; then completes applied while the view is frozen (the worst case of
     * copy-on-write: every one copies its record), the view's serialisation (what a pool
     * thread does), and the thaw (frees the n records the view alone held). */
    f = fsm_new_with(&daemonOpts);
    index = 1;
    applyAll(f, &index, &claims, IDEM__OUTCOME__OUTCOME_ACQUIRED, tokens, &bad);
    bad_total += bad;
    packCompletes(&completes, n, tokens, 16);
    t0 = nowSec();
    z = fsm_freeze(f);
    double t_freeze = nowSec() - t0;
    double t_complete_frozen =
        applyAll(f, &index, &completes, IDEM__OUTCOME__OUTCOME_OK, NULL, &bad);
    bad_total += bad;
    t0 = nowSec();
    fsm_frozen_write(z, &snap, &snap_len);
    double t_frozen_write = nowSec() - t0;
    free(snap);
    t0 = nowSec();
    fsm_thaw(f, z);
    double t_thaw = nowSec() - t0;
    t0 = nowSec();
    z = fsm_freeze(f);
    double t_freeze2 = nowSec() - t0;
    fsm_thaw(f, z);
    fsm_close(f);
    pack_free(&completes);

    /* 5. Memory with a 1 KiB body: a fresh table, claims then completes. */
    f = fsm_new_with(&daemonOpts);
    index = 1;
    mem0 = heapBytes();
    applyAll(f, &index, &claims, IDEM__OUTCOME__OUTCOME_ACQUIRED, tokens, &bad);
    bad_total += bad;
    size_t mem_before_1k = heapBytes();
    packCompletes(&completes1k, n, tokens, 1024);
    size_t pack_mem = heapBytes() - mem_before_1k;
    applyAll(f, &index, &completes1k, IDEM__OUTCOME__OUTCOME_OK, NULL, &bad);
    bad_total += bad;
    size_t mem_1k = heapBytes() - mem0 - pack_mem;
    fsm_close(f);
    pack_free(&completes1k);
    pack_free(&claims);
    free(tokens);

    double per_rec = (double)mem_claimed / (double)n;
    double per_rec_1k = (double)mem_1k / (double)n;
    double overhead = per_rec - (double)key_len - 32;
    double overhead_1k = per_rec_1k - (double)key_len - 32 - 1024;
    if (json) {
        printf("{\"records\": %zu, \"claim_applies_per_sec\": %.0f, "
               "\"claim_cold_applies_per_sec\": %.0f, "
               "\"complete_applies_per_sec\": %.0f, \"claim_complete_pairs_per_sec\": %.0f, "
               "\"replay_applies_per_sec\": %.0f, \"bytes_per_record\": %.1f, "
               "\"overhead_per_record\": %.1f, \"bytes_per_record_1k_body\": %.1f, "
               "\"overhead_per_record_1k_body\": %.1f, \"snapshot_node_sec\": %.3f, "
               "\"snapshot_sec\": %.3f, \"snapshot_bytes\": %zu, \"restore_sec\": %.3f, "
               "\"restore_start_sec\": %.3f, \"digest_sec\": %.3f, "
               "\"freeze_sec\": %.4f, \"freeze_again_sec\": %.4f, "
               "\"complete_frozen_applies_per_sec\": %.0f, \"frozen_write_sec\": %.3f, "
               "\"thaw_sec\": %.3f, \"unexpected_outcomes\": %zu}\n",
               n, (double)n / t_claim, (double)n / t_claim_cold, (double)n / t_complete,
               (double)n / (t_claim + t_complete), (double)n / t_replay, per_rec, overhead,
               per_rec_1k, overhead_1k, t_snap_node, t_snap, snap_len, t_restore, t_restore_start,
               t_digest, t_freeze, t_freeze2, (double)n / t_complete_frozen, t_frozen_write, t_thaw,
               bad_total);
    } else {
        printf("fsm-bench: %zu records, key %zu bytes, one core\n", n, key_len);
        printf("  claim (fresh key)     %12.0f applies/s warm, %.0f cold\n", (double)n / t_claim,
               (double)n / t_claim_cold);
        printf("  complete (16 B body)  %12.0f applies/s\n", (double)n / t_complete);
        printf("  claim+complete        %12.0f pairs/s\n", (double)n / (t_claim + t_complete));
        printf("  claim (replay hit)    %12.0f applies/s\n", (double)n / t_replay);
        printf(
            "  memory, no body       %8.1f B/record (%.1f B overhead beyond key + fingerprint)\n",
            per_rec, overhead);
        printf("  memory, 1 KiB body    %8.1f B/record (%.1f B overhead beyond key + fp + body)\n",
               per_rec_1k, overhead_1k);
        printf(
            "  snapshot, as a node   %8.3f s (freeze, then the view written with its checksum)\n",
            t_snap_node);
        printf("  snapshot, in one go   %8.3f s (%zu bytes)\n", t_snap, snap_len);
        printf("  restore               %8.3f s (checksum, decode, validate, insert)\n", t_restore);
        printf("  restore, as at start  %8.3f s (read into a fresh buffer, its file hash "
               "checked, restored)\n",
               t_restore_start);
        printf("  digest                %8.3f s\n", t_digest);
        printf("  off-loop snapshot: freeze (the owner's pause) %.2f ms, again after a thaw "
               "%.2f ms;\n    completes while frozen %.0f applies/s (each copies its record); "
               "frozen view written in %.3f s; thaw %.3f s\n",
               t_freeze * 1000.0, t_freeze2 * 1000.0, (double)n / t_complete_frozen, t_frozen_write,
               t_thaw);
        printf("  unexpected outcomes   %zu\n", bad_total);
    }
    return bad_total == 0 ? 0 : 1;
}
