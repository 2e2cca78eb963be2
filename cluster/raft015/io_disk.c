/* io_disk: the raft I/O wrapper's appends and truncations. Corrects libraft 0.15's leader
 * that stays leader after a failed log write (ioAppendDone stops the node), raft_uv's
 * truncation that fails silently or, asked during a snapshot put, never runs (canonical/raft
 * #372: held until the put called back, marked and checked, logdir.h), and appends asked at
 * another index than the next one on disk (checkAppendIndex); io.h says each. It also times
 * the appends (the histogram, io_oldest_append_us). */
#include "io_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"
#include "logdir.h"

/* Hands raft_uv a truncation. It fails silently (logdir.h): it is marked before, and checked
 * when the first append after it ends (truncationChecked). */
static void submitTruncate(struct io *io, raft_index index)
{
    char err[512];
    if (io->log_dir != NULL && logdir_truncate_begin(io->log_dir, index, err, sizeof(err)) != 0) {
        clog_error("cannot mark the log truncation from index %llu (%s); stopping before "
                   "it: restarted, the node resumes from what its disk holds",
                   (unsigned long long)index, err);
        abort();
    }
    int rv = io->inner.truncate(&io->inner, index);
    if (rv != 0) {
        /* Nothing was done (raft_uv could not queue it), and raft goes on as if it had been:
         * the mark, if any, is left for the next start, which finds the log as it was. */
        clog_error("raft_uv refused the log truncation from index %llu (%s); stopping: "
                   "restarted, the node resumes from what its disk holds",
                   (unsigned long long)index, raft_strerror(rv));
        abort();
    }
    if (io->trunc_last != 0 && io->trunc_last != index) {
        /* No append came after the one before (from a later index, since the log then
         * ended before it): the check of this one covers both. */
        if (logdir_truncate_end(io->log_dir, io->trunc_last, err, sizeof(err)) != 0) {
            clog_error("%s; stopping", err);
            abort();
        }
    }
    io->trunc_last = io->log_dir != NULL ? index : 0;
}

/* The first append after a truncation ended: raft_uv did the truncation before it wrote it.
 * Checked before raft hears of it, so that nothing written since is acknowledged unless the
 * truncation was done; otherwise the node stops and its next start moves those entries
 * aside (logdir_recover). */
static void truncationChecked(struct io *io, uint64_t index)
{
    char err[512];
    int done = logdir_truncate_done(io->log_dir, index, err, sizeof(err));
    /* Not told yet: raft_uv is closing an open segment on its pool. The loop waits (a
     * moment, not the node's answers: nothing goes on until this is told) for it to end,
     * so that a node that stops here leaves a log its next start can put right. */
    for (int i = 0; done == 2 && i < 40; i++) {
        uv_sleep(50);
        done = logdir_truncate_done(io->log_dir, index, err, sizeof(err));
    }
    if (done != 1) {
        clog_error("the log truncation from index %llu %s (%s): the entries written since "
                   "would be read back at the wrong indexes; stopping: restarted, the node moves "
                   "them aside and resumes from its log as it was before",
                   (unsigned long long)index, done == 0 ? "was not done" : "cannot be checked",
                   err);
        abort();
    }
    if (logdir_truncate_end(io->log_dir, index, err, sizeof(err)) != 0) {
        clog_error("%s; stopping", err);
        abort();
    }
}

/* The index raft gives the first of entries[0, n) it asks to append: they are the tail of
 * its in-memory log (libraft 0.15 appends them there first, leader and follower alike).
 * 0 when that cannot be confirmed (the entry at that index is not entries[0]). */
static raft_index appendIndex(const struct raft *r, const struct raft_entry entries[], unsigned n)
{
    const struct raft_log *l = &r->log;
    size_t held = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    if (n == 0 || held < n || l->size == 0) {
        return 0;
    }
    raft_index first = l->offset + held - n + 1;
    const struct raft_entry *e =
        &l->entries[(l->front + (size_t)(first - l->offset - 1)) % l->size];
    return e->buf.base == entries[0].buf.base && e->term == entries[0].term ? first : 0;
}

/* raft_uv's segments give entries no index of their own: an entry's index is its place on
 * disk. Entries raft asks to append at another index than the next one there would be
 * stored at the wrong one (libraft 0.15 did so after a failed log write and after a failed
 * snapshot install; both now stop the node before): stop before writing them. */
static raft_index checkAppendIndex(struct io *io, const struct raft_entry entries[], unsigned n)
{
    raft_index first = io->raft != NULL ? appendIndex(io->raft, entries, n) : 0;
    if (first != 0 && io->disk_next != 0 && first != io->disk_next) {
        clog_error("raft asked to append entries %llu-%llu while this node's log on disk "
                   "ends at %llu: they would be stored at the wrong indexes; stopping: restarted, "
                   "it resumes from what its disk holds",
                   (unsigned long long)first, (unsigned long long)(first + n - 1),
                   (unsigned long long)(io->disk_next - 1));
        abort();
    }
    return first;
}

/* A wrapper for a request about to go to raft_uv, counted in io->disk; NULL (nothing
 * counted) when out of memory. */
struct ioDisk *io_disk_begin(struct io *io)
{
    struct ioDisk *d = malloc(sizeof(*d));
    if (d != NULL) {
        memset(d, 0, sizeof(*d));
        d->io = io;
        io->disk++;
    }
    return d;
}

/* raft_uv answered the submission with rv. libuv's rule: an error means no callback, so d
 * is dropped. (raft_uv 0.15 breaks the rule in one case: when the write of a queued append
 * cannot be submitted, the request stays queued. raft frees its own request on the error
 * too, so that case is broken above us already.) */
int io_disk_submitted(struct ioDisk *d, int rv)
{
    if (rv != 0) {
        struct io *io = d->io;
        io->disk--;
        free(d);
        return io_pass_err(io, rv);
    }
    return 0;
}

/* The request's callback came: d is freed and no longer counted. Returns its io. */
struct io *io_disk_end(struct ioDisk *d)
{
    struct io *io = d->io;
    free(d);
    io->disk--;
    return io;
}

/* The append's time in the histogram: what an operator compares with etcd's WAL fsync
 * duration, and the part of a claim's latency the disk is responsible for. */
static void appendTimed(struct io *io, uint64_t start_us)
{
    uint64_t us = uv_hrtime() / 1000u - start_us;
    unsigned i = 0;
    while (i + 1 < IO_APPEND_BUCKETS && us > IO_APPEND_BOUND_US(i)) {
        i++;
    }
    io->append_buckets[i]++;
    io->append_count++;
    io->append_sum_us += us;
}

/* Appends in flight (io->appends) are kept oldest first: raft_uv writes them in order, so
 * the first is the one that waits longest. */
uint64_t io_oldest_append_us(const struct io *io)
{
    const struct ioDisk *d = TAILQ_FIRST(&io->appends);
    return d != NULL ? d->start_us : 0;
}

static void ioAppendDone(struct raft_io_append *req, int status)
{
    struct ioDisk *d = req->data;
    TAILQ_REMOVE(&d->io->appends, d, link);
    struct raft_io_append *outer = d->outer.append;
    raft_io_append_cb cb = d->cb.append;
    uint64_t start_us = d->start_us;
    uint64_t trunc = d->trunc;
    bool change = d->change;
    struct io *io = io_disk_end(d);
    io->change_appends -= change;
    if (status == 0) {
        appendTimed(io, start_us);
        if (trunc != 0) {
            truncationChecked(io, trunc);
        }
    } else if (!io->closing) {
        /* A failed log write, on any node, stops it: neither libraft 0.15 nor raft_uv can go
         * on safely after one. The leader truncates those entries from its log and stays
         * leader, so its next entries take the same indexes in the same term, while
         * followers may already hold the first ones (sent before the write ended) and keep
         * them, since they match by index and term. A follower keeps the entries in its
         * in-memory log, and raft_uv, whose segments give no entry its index (an entry's
         * place in the segment is its index), writes the next ones where the failed write
         * should have gone: the disk then holds entries at the wrong indexes, which the
         * follower loads as the leader's own (same term) after a restart and acknowledges
         * (seen with a follower's RLIMIT_FSIZE lowered and raised again: it restarted at
         * the leader's index with 56 records fewer). Stopping at the first failure leaves
         * the disk with what was written before it, which the node restarts from, while
         * the others go on (another leader takes over). */
        clog_error("raft log write failed on this node (%s%s%s); stopping: restarted, "
                   "it resumes from what its disk holds",
                   raft_strerror(status), io->inner.errmsg[0] != '\0' ? ": " : "",
                   io->inner.errmsg[0] != '\0' ? io->inner.errmsg : "");
        abort();
    }
    if (io->closing && status != 0) {
        io->late_failures++;
        status = 0; /* see the comment above ioCloseCb */
    }
    cb(outer, status);
    if (change) {
        io_change_stored(io); /* raft has taken the configuration now */
    }
    io_settle(io, false);
    io_close_maybe_later(io);
}

/* A truncation or an append held back while raft_uv holds a snapshot put. */
struct ioHeld {
    TAILQ_ENTRY(ioHeld) link;
    struct ioDisk *d;                 /* an append's or a put's; NULL: a truncation */
    raft_index index;                 /* a truncation's */
    const struct raft_entry *entries; /* an append's (raft's, alive until it is called back) */
    unsigned n;
    const struct raft_snapshot *snapshot; /* a put's (alive until it is called back) */
    unsigned trailing;                    /* a put's */
};

static int submitAppend(struct io *io, struct ioDisk *d, const struct raft_entry entries[],
                        unsigned n, bool held);

/* libraft 0.15's raft_uv runs no truncation asked while one of its snapshot puts holds
 * the open segments (the put's barrier): the truncation's own barrier never fires
 * (canonical/raft #372, fixed after 0.15 by #435). Seen here with raft_uv itself (a
 * truncation from 8 asked while a put at 6 waited): nothing was truncated, the entries
 * after it were written on, and the next load refused the log ("closed segment 8-9 is past
 * last snapshot"); in an open segment they would have been read at the wrong indexes. So
 * a truncation asked while raft_uv holds a put, and every append after it, wait here until
 * the put has called back, and then go to raft_uv in the order raft asked them. */
void io_disk_release_held(struct io *io, bool all)
{
    while (!TAILQ_EMPTY(&io->held) && (io->puts_inner == 0 || all)) {
        struct ioHeld *h = TAILQ_FIRST(&io->held);
        TAILQ_REMOVE(&io->held, h, link);
        struct ioHeld op = *h;
        free(h);
        bool put = op.snapshot != NULL;
        if (op.d == NULL) {
            if (!io->inner_closing) {
                submitTruncate(io, op.index);
            }
        } else if (io->inner_closing) {
            /* As raft_uv's close cancels what it holds. */
            if (put) {
                io_snap_put_done(&op.d->req.put, RAFT_CANCELED);
            } else {
                ioAppendDone(&op.d->req.append, RAFT_CANCELED);
            }
        } else if (put) {
            io_snap_submit_put(io, op.d, op.trailing, op.snapshot, true);
        } else {
            submitAppend(io, op.d, op.entries, op.n, true);
        }
    }
}

/* The release goes to raft_uv after its put's callback has returned (raft_uv ends the put's
 * barrier after it: a truncation asked from inside it was not run either): from the loop's
 * next turn, through the pool (a no-op work; counted in works, which raft's close waits
 * for). */
struct ioRelease {
    uv_work_t work;
    struct io *io;
};

static void releaseWork(uv_work_t *w)
{
    (void)w;
}

static void releaseAfter(uv_work_t *w, int status)
{
    (void)status;
    struct ioRelease *r = w->data;
    struct io *io = r->io;
    free(r);
    io->works--;
    io->release_queued = false;
    io_disk_release_held(io, false);
    io_close_maybe_later(io);
}

void io_disk_release_later(struct io *io)
{
    if (io->puts_inner > 0 || TAILQ_EMPTY(&io->held) || io->release_queued) {
        return;
    }
    if (io->inner_closing) {
        io_disk_release_held(io, false); /* raft_uv takes nothing more: they end canceled, now */
        return;
    }
    if (io->loop == NULL) {
        /* No loop (io_wrap): the inner io has no barrier to end after the callback. */
        io_disk_release_held(io, false);
        return;
    }
    struct ioRelease *r = malloc(sizeof(*r));
    if (r != NULL) {
        r->work.data = r;
        r->io = io;
        if (uv_queue_work(io->loop, &r->work, releaseWork, releaseAfter) == 0) {
            io->works++;
            io->release_queued = true;
            return;
        }
        free(r);
    }
    /* at once, then: the check after it still stops a node it fails */
    io_disk_release_held(io, false);
}

bool io_disk_hold(struct io *io, struct ioDisk *d, raft_index index,
                  const struct raft_entry *entries, unsigned n,
                  const struct raft_snapshot *snapshot, unsigned trailing)
{
    struct ioHeld *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return false;
    }
    h->d = d;
    h->index = index;
    h->entries = entries;
    h->n = n;
    h->snapshot = snapshot;
    h->trailing = trailing;
    TAILQ_INSERT_TAIL(&io->held, h, link);
    return true;
}

int io_disk_truncate(struct raft_io *o, raft_index index)
{
    struct io *io = io_from_outer(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* raft_uv asserts that it is not closing */
    }
    if (io->puts_inner > 0 || !TAILQ_EMPTY(&io->held)) {
        if (!io_disk_hold(io, NULL, index, NULL, 0, NULL, 0)) {
            return RAFT_NOMEM;
        }
        io->truncs_held++;
    } else {
        submitTruncate(io, index);
    }
    io->disk_next = index; /* raft_uv appends at index next */
    return 0;
}

/* Hands raft_uv an append (held: one held back, which raft was told was taken, so that a
 * refusal now stops the node). */
static int submitAppend(struct io *io, struct ioDisk *d, const struct raft_entry entries[],
                        unsigned n, bool held)
{
    d->trunc = io->trunc_last;
    int rv = io->inner.append(&io->inner, &d->req.append, entries, n, ioAppendDone);
    if (rv == 0) {
        io->trunc_last = 0; /* this append carries its check */
        return 0;
    }
    if (held) {
        clog_error("raft_uv refused a log write held back (%s); stopping", raft_strerror(rv));
        abort();
    }
    TAILQ_REMOVE(&io->appends, d, link);
    return rv;
}

int io_disk_append(struct raft_io *o, struct raft_io_append *req, const struct raft_entry entries[],
                   unsigned n, raft_io_append_cb cb)
{
    struct io *io = io_from_outer(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* raft_uv asserts that it is not closing */
    }
    raft_index first = checkAppendIndex(io, entries, n);
    struct ioDisk *d = io_disk_begin(io);
    if (d == NULL) {
        return RAFT_NOMEM;
    }
    d->req.append.data = d;
    d->start_us = uv_hrtime() / 1000u;
    d->outer.append = req;
    d->cb.append = cb;
    req->cb = cb;
    TAILQ_INSERT_TAIL(&io->appends, d, link);
    /* A follower's configuration entry: raft takes it when this append calls back (io.h,
     * the fifth flaw). A leader took its own when it appended it. Counted before raft_uv
     * has the append (d is not read after that), taken back if it refuses it. */
    bool change = false;
    for (unsigned k = 0; k < n; k++) {
        change = change || entries[k].type == RAFT_CHANGE;
    }
    change = change && io->raft != NULL && io->raft->state == RAFT_FOLLOWER;
    d->change = change;
    io->change_appends += change;
    int rv;
    if (!TAILQ_EMPTY(&io->held)) {
        /* After a truncation held back: in raft's order. */
        rv = io_disk_hold(io, d, 0, entries, n, NULL, 0) ? 0 : RAFT_NOMEM;
        if (rv != 0) {
            TAILQ_REMOVE(&io->appends, d, link);
        }
    } else {
        rv = submitAppend(io, d, entries, n, false);
    }
    if (rv == 0) {
        /* Taken: raft_uv stores them next (0: where is not known from here on). */
        io->disk_next = first != 0 ? first + n : 0;
    } else {
        io->change_appends -= change;
    }
    return io_disk_submitted(d, rv);
}
