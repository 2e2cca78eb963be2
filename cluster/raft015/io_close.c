/* io_close: raft's close held back while the wrapper's disk writes and pool work are in
 * flight. libraft 0.15 crashes when raft_uv is closed with more than one append queued
 * (canonical/raft #338, below), and raft_uv would be freed under a work still running on a
 * pool thread; raft_uv must not be closed from inside its own callbacks either. Also the
 * async_work that raft's asynchronous snapshots run through. */
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio_reap.h"
#include "clog.h"

/* ---- close ----------------------------------------------------------------------------
 *
 * What libraft 0.15 does when raft_close runs with disk writes in flight (read in its
 * source: raft.c, convert.c, replication.c, uv.c, uv_append.c; the crash's stack matched
 * against the Debian binary):
 *
 * - raft_close converts raft to RAFT_UNAVAILABLE (a leader's pending requests fail with
 *   RAFT_LEADERSHIPLOST; the cluster has failed its waiters with RAFT_SHUTDOWN before) and
 *   calls io->close. raft frees its in-memory log, configuration and address only in the
 *   io's close callback; until then it ignores ticks and frees received messages.
 * - raft_uv's close (uvClose -> uvAppendClose) completes every append still queued (not yet
 *   handed to the kernel) at once, with RAFT_CANCELED, from inside raft_close. The leader's
 *   callback (appendLeaderCb) answers any failure with logRelease and then, unconditionally,
 *   logTruncate(log, first index of the request). With two queued requests, say for
 *   indexes 10-12 and 13-15, the first truncates the log to 9 and the second truncates from
 *   13, past its end: removeSuffix counts (last index - 13 + 1) entries, which wraps around,
 *   and walks off the log. That is the SEGV seen under ASan in
 *   test_sigterm_answers_waiting_requests (io_close -> uvClose -> uvAppendClose ->
 *   appendLeaderCb -> logTruncate -> removeSuffix -> refsDecr). Upstream fixed it after 0.15
 *   by truncating only an index still in the log (canonical/raft #338). An append whose
 *   write is already with the kernel is not canceled: its callback comes when the write
 *   ends, with the write's status, before raft_uv's close completes.
 *
 * So the wrapper calls raft_uv's close only once no append is in flight (and from the loop,
 * not from inside raft_uv's callbacks: io_close_maybe_later). Why the callbacks
 * that then reach raft between raft_close and its io's close are safe in 0.15: raft_uv is
 * not closing, so it writes the queued appends as usual, and they end with status 0.
 * appendLeaderCb then updates last_stored against the in-memory log (still whole), sees
 * that raft is no longer leader and only releases the entries; appendFollowerCb sees
 * RAFT_UNAVAILABLE and only releases the entries. Neither sends, writes nor applies
 * anything. Holding the close changes nothing else: raft's close callback, where the
 * cluster frees raft_uv, still comes after raft_uv's.
 *
 * snapshot_put is held back the same way. raft_uv's close cancels a put still waiting for
 * its barrier (the appends before it), and appends queued behind a barrier are queued
 * appends as above; a put that completes instead reaches takeSnapshotCb (compacts the
 * in-memory log, finalizes the snapshot) or installSnapshotCb (discards the result of a
 * raft that is unavailable) on a raft that is still whole. Holding it costs at most the
 * bound below, but for snapstore's data write, which is pool work (io.h).
 *
 * The wait for disk writes is bounded (close_wait_ms), so that a stuck disk cannot hang
 * shutdown; past it, raft_uv is closed anyway and one line goes to stderr. An append that
 * then ends failed or canceled (or fails on its own while raft is closing) is reported to
 * raft as done, status 0, not as failed: after raft_close its status decides only whether
 * appendLeaderCb truncates the in-memory log that raft frees a moment later, and that
 * truncation is the crash; no client waits for it. late_failures counts these. Async works
 * are always waited for, without a bound (ioWorkDone).
 */

static void ioCloseCb(struct raft_io *i)
{
    struct io *io = io_from_inner(i);
    /* Held behind a put raft_uv never called back: they end canceled before raft's close
     * (raft frees its requests then). */
    io_disk_release_held(io, true);
    io_held_install_drop(io);
    io_held_timeout_now_drop(io);
    io_conf_free(io); /* not before: callbacks still come while the close waits */
    if (io->late_failures > 0) {
        clog_warn("raft I/O: %lu append(s) failed or canceled after close (not "
                  "stored; reported to raft as done)",
                  io->late_failures);
    }
    if (io->close_cb != NULL) {
        io->close_cb(&io->outer);
    }
}

static void closeTimerClosed(uv_handle_t *h)
{
    free(h);
}

/* raft asked for the close and nothing holds raft_uv's close back any more. */
static bool closeMayGo(const struct io *io)
{
    return io->close_deferred && io->works == 0 && (io->disk == 0 || io->disk_wait_over);
}

static void closeInner(struct io *io)
{
    io->close_deferred = false;
    io->inner_closing = true;
    if (io->disk > 0) {
        /* Writes still in the kernel: raft_uv's io_destroy must wait for them before it
         * frees their buffers, on this thread as raft_uv does (aio_reap.h). */
        aio_reap_set_inline(true);
    }
    if (io->close_timer != NULL) {
        uv_close((uv_handle_t *)io->close_timer, closeTimerClosed);
        io->close_timer = NULL;
    }
    io->inner.close(&io->inner, ioCloseCb);
}

static void closeNowCb(uv_timer_t *t)
{
    struct io *io = t->data;
    if (closeMayGo(io)) {
        closeInner(io);
    }
}

/* Called by the callbacks of appends, puts and works. raft_uv 0.15 must not be closed from
 * inside its own callbacks: uvAliveSegmentWriteCb, once the append callbacks of a write
 * have returned, finalizes the segment when raft_uv is closing, and a close made from
 * inside those callbacks finalizes it already: the writer's poll handle is then closed
 * twice (libuv's assertion in uv_poll_stop, seen in the first version of this wrapper). So
 * the close runs from the close timer, on the loop's next turn. */
void io_close_maybe_later(struct io *io)
{
    if (!closeMayGo(io)) {
        return;
    }
    if (io->close_timer != NULL) {
        uv_timer_start(io->close_timer, closeNowCb, 0, 0);
    } else {
        closeInner(io); /* no timer (see io_close): as before this wrapper held appends */
    }
}

/* The bound on the wait for disk writes passed. */
static void closeBoundCb(uv_timer_t *t)
{
    struct io *io = t->data;
    if (io->disk > 0) {
        clog_warn("raft I/O: %u disk write(s) still in flight %u ms after close; closing "
                  "the log anyway",
                  io->disk, io->close_wait_ms);
    }
    io->disk_wait_over = true;
    if (closeMayGo(io)) {
        closeInner(io);
    } /* else async works remain: the last one's callback closes */
}

void io_close(struct raft_io *o, raft_io_close_cb cb)
{
    struct io *io = io_from_outer(o);
    io->close_cb = cb;
    io->closing = true;
    io->close_deferred = true;
    /* A snapshot write in flight would be discarded (snapWriteAfter), and a deletion can
     * wait for the next snapshot: neither keeps the close waiting (snapstore.h). */
    atomic_store(&io->snap_stop, true);
    if (closeMayGo(io)) {
        closeInner(io);
        return;
    }
    /* Something is in flight: the close timer bounds the wait for disk writes and runs the
     * close once the last callback has returned. */
    uv_timer_t *t = io->loop != NULL ? malloc(sizeof(*t)) : NULL;
    if (t == NULL || uv_timer_init(io->loop, t) != 0) {
        free(t);
        clog_warn("raft I/O: no timer for the close; not waiting for %u disk write(s)", io->disk);
        io->disk_wait_over = true;
        if (closeMayGo(io)) {
            closeInner(io);
        }
        return;
    }
    t->data = io;
    io->close_timer = t;
    if (io->disk > 0) {
        uv_timer_start(t, closeBoundCb, io->close_wait_ms, 0);
    }
}

/* One async_work in flight: raft's request, wrapped so that the wrapper sees it end. */
struct ioWork {
    struct raft_io_async_work req; /* handed to the inner io */
    struct raft_io_async_work *outer;
    raft_io_async_work_cb cb;
    struct io *io;
};

/* The ioWork of the request handed to the inner io. Not from req->data: libraft 0.15's
 * raft_fixture sets an async work's data to its raft_io's data, as raft's own requests
 * expect (tests/sim runs the wrapper over it). */
static struct ioWork *workOf(struct raft_io_async_work *req)
{
    return (struct ioWork *)((char *)req - offsetof(struct ioWork, req));
}

/* On a pool thread: raft's work function, nothing else. */
static int ioWorkRun(struct raft_io_async_work *req)
{
    struct ioWork *w = workOf(req);
    return w->outer->work(w->outer);
}

static void ioWorkDone(struct raft_io_async_work *req, int status)
{
    struct ioWork *w = workOf(req);
    struct io *io = w->io;
    struct raft_io_async_work *outer = w->outer;
    raft_io_async_work_cb cb = w->cb;
    free(w);
    io->works--;
    /* After raft_close, a finished work is reported canceled: raft then releases the
     * snapshot (snapshot_finalize) instead of starting to store it on a closing node. */
    cb(outer, io->closing ? RAFT_CANCELED : status);
    io_close_maybe_later(io);
}

int io_async_work(struct raft_io *o, struct raft_io_async_work *req, raft_io_async_work_cb cb)
{
    struct io *io = io_from_outer(o);
    if (io->closing) {
        return RAFT_CANCELED;
    }
    struct ioWork *w = malloc(sizeof(*w));
    if (w == NULL) {
        return RAFT_NOMEM;
    }
    memset(w, 0, sizeof(*w));
    w->req.work = ioWorkRun;
    w->outer = req;
    w->cb = cb;
    w->io = io;
    req->cb = cb;
    int rv = io->inner.async_work(&io->inner, &w->req, ioWorkDone);
    if (rv != 0) {
        free(w);
        return io_pass_err(io, rv);
    }
    io->works++;
    return 0;
}
