#include "io.h"

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

static void ioCloseCb(struct raft_io *i)
{
    struct io *io = fromInner(i);
    if (io->close_cb != NULL) {
        io->close_cb(&io->outer);
    }
}

static void ioClose(struct raft_io *o, raft_io_close_cb cb)
{
    struct io *io = fromOuter(o);
    io->close_cb = cb;
    io->closing = true;
    if (io->works > 0) {
        /* raft is unavailable from now on: it ignores ticks and frees received messages
         * until the inner close completes. */
        io->close_deferred = true;
        return;
    }
    io->inner.close(&io->inner, ioCloseCb);
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

static int ioAppend(struct raft_io *o, struct raft_io_append *req,
                    const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.append(&io->inner, req, entries, n, cb));
}

static int ioTruncate(struct raft_io *o, raft_index index)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.truncate(&io->inner, index));
}

static int ioSnapshotPut(struct raft_io *o, unsigned trailing, struct raft_io_snapshot_put *req,
                         const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    struct io *io = fromOuter(o);
    return passErr(io, io->inner.snapshot_put(&io->inner, trailing, req, snapshot, cb));
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
    if (io->close_deferred && io->works == 0) {
        io->close_deferred = false;
        io->inner.close(&io->inner, ioCloseCb);
    }
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

void io_wrap(struct io *io)
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
    io->works = 0;
    io->closing = false;
    io->close_deferred = false;
}
