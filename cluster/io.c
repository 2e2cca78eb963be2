#include "io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct io *fromOuter(struct raft_io *o)
{
    return (struct io *)o;
}

static struct io *fromInner(struct raft_io *i)
{
    return (struct io *)((char *)i - offsetof(struct io, inner));
}

/* raft reads io->errmsg after a failed call: pass raft_uv's message up. */
static int passErr(struct io *io, int rv)
{
    if (rv != 0) {
        memcpy(io->outer.errmsg, io->inner.errmsg, sizeof(io->outer.errmsg));
    }
    return rv;
}

static int ioInit(struct raft_io *o, raft_id id, const char *address)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.init(&io->inner, id, address));
}

static int ioLoad(struct raft_io *o, raft_term *term, raft_id *voted_for,
                  struct raft_snapshot **snapshot, raft_index *start_index,
                  struct raft_entry *entries[], size_t *n_entries)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.load(&io->inner, term, voted_for, snapshot, start_index,
                                      entries, n_entries));
}

static void ioTickCb(struct raft_io *i)
{
    struct io *io = fromInner(i);
    io->raft_tick(&io->outer);
}

static void ioRecvCb(struct raft_io *i, struct raft_message *msg)
{
    struct io *io = fromInner(i);
    if (msg->type != RAFT_IO_APPEND_ENTRIES) {
        io->raft_recv(&io->outer, msg);
        return;
    }
    io->in_append_entries = true;
    io->ae_from = msg->server_id;
    io->ae_end = msg->append_entries.prev_log_index + msg->append_entries.n_entries;
    /* The same flaw on the commit side: libraft 0.15's follower commits up to
     * min(leader_commit, its last stored index), which may be a stale suffix the RPC did
     * not cover. Figure 2: commit up to min(leaderCommit, index of last new entry). */
    if (msg->append_entries.leader_commit > io->ae_end) {
        msg->append_entries.leader_commit = io->ae_end;
        io->corrected++;
    }
    io->raft_recv(&io->outer, msg);
    io->in_append_entries = false;
}

static int ioStart(struct raft_io *o, unsigned msecs, raft_io_tick_cb tick,
                   raft_io_recv_cb recv)
{
    struct io *io = fromOuter(o);
    io->raft_tick = tick;
    io->raft_recv = recv;
    return passErr(io, io->inner.start(&io->inner, msecs, ioTickCb, ioRecvCb));
}

static int ioBootstrap(struct raft_io *o, const struct raft_configuration *conf)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.bootstrap(&io->inner, conf));
}

static int ioRecover(struct raft_io *o, const struct raft_configuration *conf)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.recover(&io->inner, conf));
}

static int ioSetTerm(struct raft_io *o, raft_term term)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.set_term(&io->inner, term));
}

static int ioSetVote(struct raft_io *o, raft_id server_id)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.set_vote(&io->inner, server_id));
}

static int ioSend(struct raft_io *o, struct raft_io_send *req, const struct raft_message *message,
                  raft_io_send_cb cb)
{
    struct io *io = fromOuter(o);
    if (message->type == RAFT_IO_APPEND_ENTRIES_RESULT && io->in_append_entries &&
        message->server_id == io->ae_from) {
        const struct raft_append_entries_result *res = &message->append_entries_result;
        if (res->rejected == 0 && res->last_log_index > io->ae_end) {
            /* raft_uv encodes the message before send returns, so a copy on the stack is
             * enough. */
            struct raft_message fixed = *message;
            fixed.append_entries_result.last_log_index = io->ae_end;
            io->corrected++;
            return passErr(io, io->inner.send(&io->inner, req, &fixed, cb));
        }
    }
    return passErr(io, io->inner.send(&io->inner, req, message, cb));
}

static int ioTruncate(struct raft_io *o, raft_index index)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.truncate(&io->inner, index));
}

static int ioSnapshotGet(struct raft_io *o, struct raft_io_snapshot_get *req,
                         raft_io_snapshot_get_cb cb)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.snapshot_get(&io->inner, req, cb));
}

static raft_time ioTime(struct raft_io *o)
{
    struct io *io = fromOuter(o);
    return io->inner.time(&io->inner);
}

static int ioRandom(struct raft_io *o, int min, int max)
{
    struct io *io = fromOuter(o);
    return io->inner.random(&io->inner, min, max);
}

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
 *   test_sigterm_answers_waiting_requests (ioClose -> uvClose -> uvAppendClose ->
 *   appendLeaderCb -> logTruncate -> removeSuffix -> refsDecr). Upstream fixed it after 0.15
 *   by truncating only an index still in the log (canonical/raft #338). An append whose
 *   write is already with the kernel is not canceled: its callback comes when the write
 *   ends, with the write's status, before raft_uv's close completes.
 *
 * So the wrapper calls raft_uv's close only once no append is in flight (and from the loop,
 * not from inside raft_uv's callbacks: maybeCloseInnerLater). Why the callbacks
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
 * bound below.
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
    struct io *io = fromInner(i);
    if (io->late_failures > 0) {
        fprintf(stderr,
                "idemd: raft I/O: %lu append(s) failed or canceled after close (not "
                "stored; reported to raft as done)\n",
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
static void maybeCloseInnerLater(struct io *io)
{
    if (!closeMayGo(io)) {
        return;
    }
    if (io->close_timer != NULL) {
        uv_timer_start(io->close_timer, closeNowCb, 0, 0);
    } else {
        closeInner(io); /* no timer (see ioClose): as before this wrapper held appends */
    }
}

/* The bound on the wait for disk writes passed. */
static void closeBoundCb(uv_timer_t *t)
{
    struct io *io = t->data;
    if (io->disk > 0) {
        fprintf(stderr,
                "idemd: raft I/O: %u disk write(s) still in flight %u ms after close; closing "
                "the log anyway\n",
                io->disk, io->close_wait_ms);
    }
    io->disk_wait_over = true;
    if (closeMayGo(io)) {
        closeInner(io);
    } /* else async works remain: the last one's callback closes */
}

static void ioClose(struct raft_io *o, raft_io_close_cb cb)
{
    struct io *io = fromOuter(o);
    io->close_cb = cb;
    io->closing = true;
    io->close_deferred = true;
    if (closeMayGo(io)) {
        closeInner(io);
        return;
    }
    /* Something is in flight: the close timer bounds the wait for disk writes and runs the
     * close once the last callback has returned. */
    uv_timer_t *t = malloc(sizeof(*t));
    if (t == NULL || uv_timer_init(io->loop, t) != 0) {
        free(t);
        fprintf(stderr,
                "idemd: raft I/O: no timer for the close; not waiting for %u disk write(s)\n",
                io->disk);
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

/* One append or snapshot put in flight: raft's request, wrapped so that the wrapper sees it
 * end. */
struct ioDisk {
    union {
        struct raft_io_append append;
        struct raft_io_snapshot_put put;
    } req; /* handed to the inner io */
    union {
        struct raft_io_append *append;
        struct raft_io_snapshot_put *put;
    } outer;
    union {
        raft_io_append_cb append;
        raft_io_snapshot_put_cb put;
    } cb;
    struct io *io;
};

/* A wrapper for a request about to go to raft_uv, counted in io->disk; NULL (nothing
 * counted) when out of memory. */
static struct ioDisk *diskBegin(struct io *io)
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
static int diskSubmitted(struct ioDisk *d, int rv)
{
    if (rv != 0) {
        struct io *io = d->io;
        io->disk--;
        free(d);
        return passErr(io, rv);
    }
    return 0;
}

/* The request's callback came: d is freed and no longer counted. Returns its io. */
static struct io *diskEnd(struct ioDisk *d)
{
    struct io *io = d->io;
    free(d);
    io->disk--;
    return io;
}

static void ioAppendDone(struct raft_io_append *req, int status)
{
    struct ioDisk *d = req->data;
    struct raft_io_append *outer = d->outer.append;
    raft_io_append_cb cb = d->cb.append;
    struct io *io = diskEnd(d);
    if (io->closing && status != 0) {
        io->late_failures++;
        status = 0; /* see the comment above ioCloseCb */
    }
    cb(outer, status);
    maybeCloseInnerLater(io);
}

static int ioAppend(struct raft_io *o, struct raft_io_append *req,
                    const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* raft_uv asserts that it is not closing */
    }
    struct ioDisk *d = diskBegin(io);
    if (d == NULL) {
        return RAFT_NOMEM;
    }
    d->req.append.data = d;
    d->outer.append = req;
    d->cb.append = cb;
    req->cb = cb;
    return diskSubmitted(d, io->inner.append(&io->inner, &d->req.append, entries, n,
                                             ioAppendDone));
}

static void ioSnapshotPutDone(struct raft_io_snapshot_put *req, int status)
{
    struct ioDisk *d = req->data;
    struct raft_io_snapshot_put *outer = d->outer.put;
    raft_io_snapshot_put_cb cb = d->cb.put;
    struct io *io = diskEnd(d);
    cb(outer, status);
    maybeCloseInnerLater(io);
}

static int ioSnapshotPut(struct raft_io *o, unsigned trailing, struct raft_io_snapshot_put *req,
                         const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* what raft_uv answers while closing */
    }
    struct ioDisk *d = diskBegin(io);
    if (d == NULL) {
        return RAFT_NOMEM;
    }
    d->req.put.data = d;
    d->outer.put = req;
    d->cb.put = cb;
    req->cb = cb;
    return diskSubmitted(d, io->inner.snapshot_put(&io->inner, trailing, &d->req.put, snapshot,
                                                   ioSnapshotPutDone));
}

/* One async_work in flight: raft's request, wrapped so that the wrapper sees it end. */
struct ioWork {
    struct raft_io_async_work req; /* handed to the inner io */
    struct raft_io_async_work *outer;
    raft_io_async_work_cb cb;
    struct io *io;
};

/* On a pool thread: raft's work function, nothing else. */
static int ioWorkRun(struct raft_io_async_work *req)
{
    struct ioWork *w = req->data;
    return w->outer->work(w->outer);
}

static void ioWorkDone(struct raft_io_async_work *req, int status)
{
    struct ioWork *w = req->data;
    struct io *io = w->io;
    struct raft_io_async_work *outer = w->outer;
    raft_io_async_work_cb cb = w->cb;
    free(w);
    io->works--;
    /* After raft_close, a finished work is reported canceled: raft then releases the
     * snapshot (snapshot_finalize) instead of starting to store it on a closing node. */
    cb(outer, io->closing ? RAFT_CANCELED : status);
    maybeCloseInnerLater(io);
}

static int ioAsyncWork(struct raft_io *o, struct raft_io_async_work *req,
                       raft_io_async_work_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->closing) {
        return RAFT_CANCELED;
    }
    struct ioWork *w = malloc(sizeof(*w));
    if (w == NULL) {
        return RAFT_NOMEM;
    }
    memset(w, 0, sizeof(*w));
    w->req.data = w;
    w->req.work = ioWorkRun;
    w->outer = req;
    w->cb = cb;
    w->io = io;
    req->cb = cb;
    int rv = io->inner.async_work(&io->inner, &w->req, ioWorkDone);
    if (rv != 0) {
        free(w);
        return passErr(io, rv);
    }
    io->works++;
    return 0;
}

void io_wrap(struct io *io, uv_loop_t *loop)
{
    struct raft_io *o = &io->outer;
    memset(o, 0, sizeof(*o));
    /* libraft 0.15's raft_uv implements async_work (version 2 of raft_io) but still says
     * version 1, and raft_init refuses asynchronous snapshots over a version 1 io: the
     * wrapper, which implements version 2, says so when the inner io has the method. */
    o->version = io->inner.async_work != NULL && io->inner.version < 2 ? 2 : io->inner.version;
    o->init = ioInit;
    o->close = ioClose;
    o->load = ioLoad;
    o->start = ioStart;
    o->bootstrap = ioBootstrap;
    o->recover = ioRecover;
    o->set_term = ioSetTerm;
    o->set_vote = ioSetVote;
    o->send = ioSend;
    o->append = ioAppend;
    o->truncate = ioTruncate;
    o->snapshot_put = ioSnapshotPut;
    o->snapshot_get = ioSnapshotGet;
    o->time = ioTime;
    o->random = ioRandom;
    o->async_work = io->inner.async_work != NULL ? ioAsyncWork : NULL;
    io->in_append_entries = false;
    io->corrected = 0;
    io->loop = loop;
    io->works = 0;
    io->disk = 0;
    io->closing = false;
    io->close_deferred = false;
    io->inner_closing = false;
    io->disk_wait_over = false;
    io->close_wait_ms = IO_CLOSE_WAIT_MS;
    io->close_timer = NULL;
    io->late_failures = 0;
}
