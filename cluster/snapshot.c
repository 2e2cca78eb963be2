/* snapshot: when this node takes its snapshots, and taking and restoring them.
 *
 * Policy: the threshold (entries between snapshots) adapts to the table's size
 * (cluster_snapshot_threshold), each voter snapshots at its own phase of it
 * (cluster_snapshot_stagger), the leader less often (cluster_snapshot_leader_threshold), and
 * the log applied since the last one is capped (snapshot_log_max_bytes). Taking: raft's
 * fsm snapshot callbacks, the application's state serialised off the loop when it can
 * (fsm version 3), niced (niced.h). A snapshot is the member metadata (a ClusterSnapshot,
 * behind its 4-byte length) followed by the application's bytes. */
#include "cluster_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "niced.h"

static void putBE32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint64_t monoUs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static bool snapshotAsync(const struct cluster *c)
{
    return c->ops.snapshot_freeze != NULL;
}

unsigned cluster_snapshot_threshold(unsigned min, unsigned percent, uint64_t max_log_bytes,
                                    uint64_t snapshot_bytes, uint64_t entries, uint64_t entry_bytes)
{
    if (percent == 0 || snapshot_bytes == 0 || entries == 0 || entry_bytes == 0) {
        return min;
    }
    /* Doubles: no overflow, and the threshold is each node's own, not replicated state. */
    double log_bytes = (double)snapshot_bytes * (double)percent / 100.0;
    if (max_log_bytes != 0 && log_bytes > (double)max_log_bytes) {
        log_bytes = (double)max_log_bytes;
    }
    double n = log_bytes * (double)entries / (double)entry_bytes;
    if (n < (double)min) {
        return min;
    }
    return n >= (double)UINT_MAX ? UINT_MAX : (unsigned)n;
}

/* This node's place among the n voters of the configuration (the same order on every node):
 * *k in 0..n-1, or n = 0 when it is not a voter. */
static void voterPlace(const struct cluster *c, unsigned *k, unsigned *n)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned seen = 0;
    bool me = false;
    *k = 0;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].role != RAFT_VOTER) {
            continue;
        }
        if (conf->servers[i].id == c->cfg.id) {
            *k = seen;
            me = true;
        }
        seen++;
    }
    *n = me ? seen : 0;
}

/* The entries from index to the first index at or after j0 on voter k of n's phase of
 * interval t (k * t / n, mod t), as a threshold: at most UINT_MAX. */
static unsigned onPhase(uint64_t t, uint64_t index, uint64_t j0, unsigned k, unsigned n)
{
    uint64_t phase = t * k / n;
    uint64_t th = j0 + (phase + t - j0 % t) % t - index;
    return th > UINT_MAX ? UINT_MAX : (unsigned)th;
}

unsigned cluster_snapshot_stagger(unsigned threshold, uint64_t index, unsigned k, unsigned n)
{
    if (n < 2 || threshold < 2 * n) {
        return threshold;
    }
    return onPhase(threshold, index, index + threshold / 2, k, n);
}

unsigned cluster_snapshot_stagger_forward(unsigned threshold, uint64_t index, unsigned k,
                                          unsigned n)
{
    if (n < 2 || threshold < 2 * n) {
        return threshold;
    }
    return onPhase(threshold, index, index + threshold, k, n);
}

unsigned cluster_trailing_for(const struct raft_log *l, uint64_t index, unsigned trailing,
                              uint64_t max_bytes)
{
    size_t held = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    uint64_t bytes = 0;
    for (unsigned k = 0; k < trailing; k++) {
        uint64_t i = index - k; /* the k-th entry back from index */
        if (i == 0 || i <= l->offset || i - l->offset > held) {
            return trailing; /* no more held: nothing more to keep or free */
        }
        bytes += l->entries[(l->front + (size_t)(i - l->offset - 1)) % l->size].buf.len;
        if (bytes > max_bytes) {
            return k > 0 ? k : 1;
        }
    }
    return trailing;
}

unsigned cluster_snapshot_leader_threshold(unsigned staggered, unsigned interval,
                                           uint64_t max_entries)
{
    for (unsigned extra = 2; extra > 0; extra--) {
        uint64_t th = (uint64_t)staggered + (uint64_t)extra * interval;
        if (th <= max_entries && th <= UINT_MAX) {
            return (unsigned)th;
        }
    }
    return staggered;
}

/* The log applied since the last snapshot past which this node takes one whatever the
 * entry count: snapshot_log_max_bytes, less k/2n of it on voter k of n, so that when the
 * cap is what decides (large entries) the replicas do not all write their snapshots at the
 * same index, as their phases keep them apart otherwise (cluster_snapshot_stagger). */
static uint64_t logCap(const struct cluster *c)
{
    uint64_t max = c->cfg.snapshot_log_max_bytes;
    unsigned k, n;
    voterPlace(c, &k, &n);
    return n >= 2 ? max - max / (2 * n) * k : max;
}

void snapshot_note_applied(struct cluster *c, size_t len)
{
    c->applied_entries++;
    c->applied_bytes += len;
    c->log_since_snapshot += len;
    if (c->cfg.snapshot_log_max_bytes != 0 && c->log_since_snapshot > logCap(c) &&
        c->saved_threshold == 0) {
        /* The log since the last snapshot (raft holds all of it in memory) reached
         * snapshot_log_max_bytes (this voter's share of it) before the threshold's count
         * of entries (at least snapshot_threshold, 8192 by default: 8 GiB of 1 MiB
         * entries): a snapshot at the next apply raft can take one, as
         * cluster_snapshot_now() asks for one. Counted from when the last one was taken
         * (fsmSnapshot), not stored, so that one still being written does not make the
         * next come at once; one whose write fails is not asked for again before another
         * cap's worth of entries. */
        c->saved_threshold = c->raft.snapshot.threshold;
        raft_set_snapshot_threshold(&c->raft, 1);
    }
}

/* Sets raft's threshold from the schedule adaptThreshold() computed: this voter's phase of
 * the interval, and on the leader two intervals more when the log cap allows. Called again
 * when this node becomes or stops being the leader. */
static void applyThreshold(struct cluster *c)
{
    unsigned t = c->interval;
    c->threshold_as_leader = raft_state(&c->raft) == RAFT_LEADER;
    if (c->cfg.snapshot_log_percent != 0) {
        unsigned k, n;
        voterPlace(c, &k, &n);
        /* At the configured minimum (a young or small table), phases that only ever come
         * later: no snapshot sooner than that minimum. */
        t = t <= c->cfg.snapshot_threshold
                ? cluster_snapshot_stagger_forward(t, c->interval_from, k, n)
                : cluster_snapshot_stagger(t, c->interval_from, k, n);
        if (t < c->cfg.snapshot_threshold) {
            t = c->cfg.snapshot_threshold; /* an interval under twice the minimum, staggered */
        }
        if (c->threshold_as_leader && n >= 2 && c->interval > c->cfg.snapshot_threshold) {
            /* Entries that make snapshot_log_max_bytes of log, at the measured entry size
             * (measured: an interval above snapshot_threshold needs it). */
            double cap = (double)c->cfg.snapshot_log_max_bytes * (double)c->entries_measured /
                         (double)c->bytes_measured;
            t = cluster_snapshot_leader_threshold(
                t, c->interval, cap >= (double)UINT64_MAX ? UINT64_MAX : (uint64_t)cap);
        }
    }
    c->threshold = t;
    unsigned withRetry = t > UINT_MAX - c->retry_extra ? UINT_MAX : t + c->retry_extra;
    if (c->saved_threshold != 0) {
        c->saved_threshold = withRetry; /* a forced snapshot is pending: set after it */
    } else {
        raft_set_snapshot_threshold(&c->raft, withRetry);
    }
}

/* After a snapshot of `bytes` at `index` was taken or restored: the next one comes after
 * cluster_snapshot_threshold() entries (the interval), measured on the entries applied
 * since the threshold was last set (or, with too few of those, on the window measured
 * before), at this node's own phase (cluster_snapshot_stagger). The interval is rounded
 * down to a power of two so that replicas, whose measures differ a little, agree on it and
 * so on the phases. */
static void adaptThreshold(struct cluster *c, uint64_t bytes, uint64_t index)
{
    c->snapshot_bytes_last = bytes;
    if (c->applied_entries >= 64 || c->entries_measured == 0) {
        c->entries_measured = c->applied_entries;
        c->bytes_measured = c->applied_bytes;
    }
    c->applied_entries = 0;
    c->applied_bytes = 0;
    unsigned t = cluster_snapshot_threshold(c->cfg.snapshot_threshold, c->cfg.snapshot_log_percent,
                                            c->cfg.snapshot_log_max_bytes, bytes,
                                            c->entries_measured, c->bytes_measured);
    if (c->cfg.snapshot_log_percent != 0 && t > c->cfg.snapshot_threshold) {
        unsigned p = 1;
        while (p <= t / 2) {
            p *= 2;
        }
        t = p > c->cfg.snapshot_threshold ? p : c->cfg.snapshot_threshold;
    }
    c->interval = t;
    c->interval_from = index;
    applyThreshold(c);
}

/* raft calls this on the loop. Synchronous: the whole snapshot. Asynchronous: the member
 * metadata (small) and a frozen view of the application state; the application's bytes
 * are written by fsmSnapshotAsync. */
static int fsmSnapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    io_conf_note(&c->io); /* an uncommitted index a snapshot covered is cleared first */
    if (c->raft.configuration_uncommitted_index != 0) {
        /* libraft 0.15 would store the uncommitted configuration as the snapshot's, as if
         * committed (docs/raft-0.15.md, 32): not now. RAFT_BUSY: raft tries again at a
         * later apply. */
        return RAFT_BUSY;
    }
    cluster_apply_deferred(c); /* raft snapshots at its last applied index */
    uint64_t t0 = monoUs();
    c->puts_before = c->io.own_puts;
    Idem__ClusterSnapshot cs = IDEM__CLUSTER_SNAPSHOT__INIT;
    Idem__MemberInfo infos[CLUSTER_MEMBERS_MAX];
    Idem__MemberInfo *ptrs[CLUSTER_MEMBERS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < c->n_meta; i++) {
        if (!c->meta[i].logged) {
            continue;
        }
        idem__member_info__init(&infos[n]);
        infos[n].id = c->meta[i].m.id;
        infos[n].rpc_address = c->meta[i].m.rpc_address;
        infos[n].http_address = c->meta[i].m.http_address;
        ptrs[n] = &infos[n];
        n++;
    }
    cs.n_members = n;
    cs.members = ptrs;
    size_t meta_len = idem__cluster_snapshot__get_packed_size(&cs);

    struct raft_buffer *b = raft_calloc(2, sizeof(*b));
    if (b == NULL) {
        return RAFT_NOMEM;
    }
    b[0].len = 4 + meta_len;
    b[0].base = raft_malloc(b[0].len);
    if (b[0].base == NULL) {
        raft_free(b);
        return RAFT_NOMEM;
    }
    putBE32(b[0].base, (uint32_t)meta_len);
    idem__cluster_snapshot__pack(&cs, (uint8_t *)b[0].base + 4);
    if (snapshotAsync(c)) {
        void *view = NULL;
        if (c->snap.view != NULL || c->ops.snapshot_freeze(c->ops.data, &view) != 0) {
            raft_free(b[0].base);
            raft_free(b);
            return RAFT_BUSY; /* raft takes it as transient and retries later */
        }
        memset(&c->snap, 0, sizeof(c->snap));
        c->snap.view = view;
        c->snap.index = raft_last_applied(&c->raft);
        b[1].base = NULL; /* fsmSnapshotAsync fills it */
        b[1].len = 0;
    } else {
        uint8_t *app = NULL;
        size_t app_len = 0;
        if (c->ops.snapshot(c->ops.data, &app, &app_len) != 0) {
            raft_free(b[0].base);
            raft_free(b);
            return RAFT_IOERR;
        }
        b[1].base = app;
        b[1].len = app_len;
    }
    *bufs = b;
    *n_bufs = 2;
    c->last_snapshot_index = raft_last_applied(&c->raft);
    c->log_since_snapshot = 0;
    /* raft keeps this many entries once the snapshot is stored (its put reads it after this
     * returns), in memory and on disk. */
    raft_set_snapshot_trailing(&c->raft, cluster_trailing_for(&c->raft.log, c->last_snapshot_index,
                                                              c->cfg.snapshot_trailing,
                                                              c->cfg.snapshot_trailing_max_bytes));
    uint64_t pause = monoUs() - t0;
    c->snap.pause_us = pause;
    c->snapshots++;
    c->snapshot_pause_us_last = pause;
    if (pause > c->snapshot_pause_us_max) {
        c->snapshot_pause_us_max = pause;
    }
    if (c->saved_threshold != 0) {
        raft_set_snapshot_threshold(&c->raft, c->saved_threshold);
        c->saved_threshold = 0;
    }
    return 0;
}

struct snapshotWriteRun {
    struct cluster *c;
    uint8_t *app;
    size_t len;
};

static int snapshotWriteMain(void *arg)
{
    struct snapshotWriteRun *w = arg;
    return w->c->ops.snapshot_write(w->c->snap.view, &w->app, &w->len);
}

/* raft calls this on a thread of raft_uv's pool (io->async_work), after fsmSnapshot
 * succeeded, while the loop goes on. It touches the view and c->snap's write fields only.
 * The serialisation itself runs niced by cfg.snapshot_nice, the pool thread waiting for it. */
static int fsmSnapshotAsync(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    if (*bufs == NULL || *n_bufs != 2 || c->snap.view == NULL) {
        return RAFT_INVALID;
    }
    uint64_t t0 = monoUs();
    struct snapshotWriteRun w = {.c = c};
    if (niced_run(c->cfg.snapshot_nice, &c->snap.nice, snapshotWriteMain, &w) != 0) {
        return RAFT_IOERR;
    }
    (*bufs)[1].base = w.app;
    (*bufs)[1].len = w.len;
    c->snap.write_us = monoUs() - t0;
    c->snap.bytes = w.len;
    c->snap.written = true;
    return 0;
}

/* A buffer freed on the loop's thread pool (freeOffLoop). */
struct reap {
    uv_work_t req;
    void *p;
};

static void reapWork(uv_work_t *req)
{
    struct reap *r = req->data;
    free(r->p);
}

static void reapDone(uv_work_t *req, int status)
{
    struct reap *r = req->data;
    if (status != 0) { /* cancelled (nothing cancels it today): reapWork did not run */
        free(r->p);
    }
    free(r);
}

/* Frees p on the loop's thread pool. For a snapshot's data (about 110 bytes a record, so
 * ~100 MB at a million records): handing that back to the kernel took 2-7 ms, a pause of
 * the loop every snapshot, when it was freed there. uv_run keeps going until it is done. */
static void freeOffLoop(uv_loop_t *loop, void *p)
{
    struct reap *r = malloc(sizeof(*r));
    if (r == NULL) {
        free(p);
        return;
    }
    r->p = p;
    r->req.data = r;
    if (uv_queue_work(loop, &r->req, reapWork, reapDone) != 0) {
        free(p);
        free(r);
    }
}

/* raft calls this on the loop once it is done with the snapshot's buffers, whether they
 * were stored or not (and after a failed fsmSnapshotAsync or async_work). */
static int fsmSnapshotFinalize(struct raft_fsm *fsm, struct raft_buffer *bufs[],
                               unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    /* Whether raft_uv stored it: finalize comes after the put's end (takeSnapshotCb). */
    bool put_ended = c->io.own_puts != c->puts_before;
    bool stored = put_ended && c->io.own_put_status == 0;
    if (put_ended) {
        /* Stored: as scheduled. Not stored: the next attempt a whole threshold after this
         * one, not at once (raft counts from its last stored snapshot, which is older). */
        uint64_t from = c->raft.log.snapshot.last_index;
        uint64_t extra = stored || c->last_snapshot_index <= from ? 0 : c->last_snapshot_index - from;
        c->retry_extra = extra > UINT_MAX ? UINT_MAX : (unsigned)extra;
    }
    if (*bufs != NULL) {
        if (*n_bufs == 2 && (*bufs)[1].base != NULL) {
            adaptThreshold(c, (*bufs)[0].len + (*bufs)[1].len, c->last_snapshot_index);
        }
        raft_free((*bufs)[0].base);
        if ((*bufs)[1].base != NULL) { /* the application's, malloc'd (NULL if not written) */
            freeOffLoop(c->loop, (*bufs)[1].base);
        }
        raft_free(*bufs);
        *bufs = NULL;
        *n_bufs = 0;
    }
    if (c->snap.view != NULL) {
        struct cluster_snapshot_info info = {
            .index = c->snap.index,
            .pause_us = c->snap.pause_us,
            .write_us = c->snap.write_us,
            .bytes = c->snap.bytes,
            .store_us = put_ended ? c->io.own_put_us : 0,
            .written = c->snap.written,
            .put_ended = put_ended,
            .stored = stored,
            .store_error = stored ? "" : c->io.own_put_err,
            .nice = c->snap.nice,
            .next_threshold = c->threshold,
        };
        void *view = c->snap.view;
        c->snap.view = NULL;
        c->snapshot_write_us_last = info.write_us;
        c->ops.snapshot_release(c->ops.data, view, &info);
    }
    return 0;
}

/* A restore refused: raft frees the buffer itself (raft_free), so data io_snap_load mapped is
 * unmapped here and the buffer emptied. */
static int restoreRefused(struct cluster *c, struct raft_buffer *buf)
{
    if (io_snap_data_unmap(&c->io, buf->base)) {
        buf->base = NULL;
        buf->len = 0;
    }
    return RAFT_MALFORMED;
}

static int fsmRestore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct cluster *c = fsm->data;
    cluster_apply_deferred(c); /* in order, before the state is replaced */
    const uint8_t *p = buf->base;
    if (buf->len < 4) {
        return restoreRefused(c, buf);
    }
    uint32_t meta_len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (meta_len > buf->len - 4) {
        return restoreRefused(c, buf);
    }
    Idem__ClusterSnapshot *cs = idem__cluster_snapshot__unpack(NULL, meta_len, p + 4);
    if (cs == NULL) {
        return restoreRefused(c, buf);
    }
    uint64_t t0 = monoUs();
    if (c->ops.restore(c->ops.data, p + 4 + meta_len, buf->len - 4 - meta_len) != 0) {
        idem__cluster_snapshot__free_unpacked(cs, NULL);
        return restoreRefused(c, buf);
    }
    c->restore_us_last = monoUs() - t0;
    for (size_t i = 0; i < cs->n_members; i++) {
        struct memberMeta *mm = members_put(c, cs->members[i]->id, cs->members[i]->rpc_address,
                                            cs->members[i]->http_address);
        if (mm != NULL) {
            mm->logged = true;
        }
    }
    idem__cluster_snapshot__free_unpacked(cs, NULL);
    /* The snapshot's index: libraft 0.15 moves its applied index there only after this
     * returns (snapshotRestore), so raft_last_applied() is still the old one here (0 at a
     * start). The wrapper noted it (at load, and when an install is stored). */
    uint64_t at = c->io.snap_last != 0 ? c->io.snap_last : raft_last_applied(&c->raft);
    c->last_snapshot_index = at;
    c->log_since_snapshot = 0;
    c->retry_extra = 0; /* a snapshot of the leader's stands for this node's */
    c->saved_threshold = 0; /* and for one forced or asked for: adaptThreshold sets raft's */
    adaptThreshold(c, buf->len, at);
    io_snap_data_free(&c->io, buf->base);
    return 0;
}

void snapshot_tick(struct cluster *c)
{
    if (c->interval == 0 && c->cfg.snapshot_log_percent != 0 &&
        raft_state(&c->raft) != RAFT_UNAVAILABLE) {
        /* No snapshot taken nor restored yet: once this node is one of two or more voters
         * (a spare waits for its promotion), the first one comes at this voter's phase
         * too, not at the same index on every replica. */
        unsigned k, n;
        voterPlace(c, &k, &n);
        if (n >= 2) {
            c->interval = c->cfg.snapshot_threshold;
            c->interval_from = 0;
            applyThreshold(c);
        }
    } else if ((raft_state(&c->raft) == RAFT_LEADER) != c->threshold_as_leader &&
               c->interval != 0) {
        applyThreshold(c);
    }
}

void snapshot_fsm_init(struct cluster *c)
{
    c->fsm.version = 2;
    c->fsm.snapshot = fsmSnapshot;
    c->fsm.restore = fsmRestore;
    c->fsm.snapshot_finalize = fsmSnapshotFinalize;
    if (snapshotAsync(c)) {
        c->fsm.version = 3;
        c->fsm.snapshot_async = fsmSnapshotAsync;
    }
}

static void barrierCb(struct raft_barrier *req, int status)
{
    (void)status;
    free(req);
}

int cluster_snapshot_now(struct cluster *c)
{
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (c->saved_threshold == 0) {
        c->saved_threshold = c->raft.snapshot.threshold;
        raft_set_snapshot_threshold(&c->raft, 1);
    }
    if (cluster_is_leader(c)) {
        struct raft_barrier *b = cluster_xcalloc(sizeof(*b));
        if (raft_barrier(&c->raft, b, barrierCb) != 0) {
            free(b);
        }
    }
    return CLUSTER_OK;
}
