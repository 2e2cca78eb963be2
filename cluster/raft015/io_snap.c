/* io_snap: the raft I/O wrapper's load and snapshots. At load, the start-up repairs of the
 * data directory (logdir_recover: a truncation left undone; segtail_repair: an open segment
 * libraft 0.15 cannot load). Snapshots go through snapstore (its data in files of our own,
 * written paced, raft_uv storing a small reference: snapstore.h), and a leader's snapshot
 * that cannot be stored stops the node (installFailed: libraft 0.15 goes on with its log
 * dropped and writes the next entries at the wrong indexes). */
#include "io_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"
#include "logdir.h"
#include "segtail.h"
#include "snapstore.h"

/* A snapshot put through snapstore: a pool thread writes the data (snapWriteWork), then
 * raft_uv stores the reference (snapWriteAfter), then old files go (snapGcQueue). */
struct ioSnapJob {
    uv_work_t work;
    struct ioDisk *d;
    unsigned trailing;
    const struct raft_snapshot *snapshot; /* raft's, alive until the put calls back */
    struct raft_snapshot ref_snapshot;    /* what raft_uv stores: the same, but the data */
    struct raft_buffer ref_buf;
    uint8_t ref[SNAPSTORE_REF_SIZE];
    struct snapstore_ref r;
    int rv;
    bool shielded; /* segments were linked into the trash before raft_uv's put */
    char err[256];
};

struct ioSnapGc {
    uv_work_t work;
    struct io *io;
    uint64_t older, newest;
};

/* Frees a snapshot as raft_uv hands it over (raft owns it otherwise). */
static void snapshotFree(struct raft_snapshot *s)
{
    raft_configuration_close(&s->configuration);
    for (unsigned i = 0; i < s->n_bufs; i++) {
        raft_free(s->bufs[i].base);
    }
    raft_free(s->bufs);
    raft_free(s);
}

/* If snapshot is a snapstore reference, puts the data it names in its place (1 buffer,
 * raft_malloc()ed, as raft_uv's own; with map, at load, mapped instead when it can be, and
 * remembered in io->snap_map: io_snap_data_free). Returns 0, or -1 with a message in err. */
static int snapshotResolve(struct io *io, struct raft_snapshot *snapshot, bool map, char *err,
                           size_t errlen)
{
    struct snapstore_ref r;
    if (snapshot->n_bufs != 1 ||
        !snapstore_ref_decode(snapshot->bufs[0].base, snapshot->bufs[0].len, &r)) {
        return 0; /* raft_uv holds the data itself (written before snapstore) */
    }
    if (r.term != snapshot->term || r.index != snapshot->index) {
        snprintf(err, errlen,
                 "snapshot %llu/%llu refers to the data of snapshot %llu/%llu (term/index)",
                 (unsigned long long)snapshot->term, (unsigned long long)snapshot->index,
                 (unsigned long long)r.term, (unsigned long long)r.index);
        return -1;
    }
    void *data = NULL;
    bool mapped = false;
    if ((map ? snapstore_map(io->snap_dir, &r, &data, &mapped, err, errlen)
             : snapstore_read(io->snap_dir, &r, &data, err, errlen)) != 0) {
        return -1;
    }
    if (mapped) {
        io->snap_map = data;
        io->snap_map_len = r.size;
    }
    raft_free(snapshot->bufs[0].base);
    snapshot->bufs[0].base = data;
    snapshot->bufs[0].len = (size_t)r.size;
    return 0;
}

static uint64_t nowUs(void)
{
    return uv_hrtime() / 1000u;
}

static int snapLoad(struct io *io, raft_term *term, raft_id *voted_for,
                    struct raft_snapshot **snapshot, raft_index *start_index,
                    struct raft_entry *entries[], size_t *n_entries);

int io_snap_load(struct raft_io *o, raft_term *term, raft_id *voted_for,
                 struct raft_snapshot **snapshot, raft_index *start_index,
                 struct raft_entry *entries[], size_t *n_entries)
{
    struct io *io = io_from_outer(o);
    uint64_t t0 = nowUs();
    io->load_snap_us = 0;
    int rv = snapLoad(io, term, voted_for, snapshot, start_index, entries, n_entries);
    io->load_us = nowUs() - t0;
    return rv;
}

static int snapLoad(struct io *io, raft_term *term, raft_id *voted_for,
                    struct raft_snapshot **snapshot, raft_index *start_index,
                    struct raft_entry *entries[], size_t *n_entries)
{
    if (io->log_dir != NULL) {
        char msg[1024];
        if (logdir_recover(io->log_dir, msg, sizeof(msg)) != 0) {
            /* Whole on stderr: raft's message holds 256 bytes. */
            clog_error("%s", msg);
            snprintf(io->outer.errmsg, sizeof(io->outer.errmsg),
                     "a log truncation was left undone (the message above says what to do)");
            return RAFT_IOERR;
        }
        if (msg[0] != '\0') {
            clog_warn("%s", msg);
        }
        /* libraft 0.15's loader aborts on an open segment whose entries end 8 bytes before
         * its end (segtail.h). */
        int trimmed = segtail_repair(io->log_dir, msg, sizeof(msg));
        if (trimmed < 0) {
            clog_error("%s", msg);
            snprintf(io->outer.errmsg, sizeof(io->outer.errmsg),
                     "a log segment cannot be read or trimmed (the message above says which)");
            return RAFT_IOERR;
        }
        if (trimmed > 0) {
            clog_warn("log segments %s in %s: their entries ended 8 bytes before the end of "
                      "the file (this node stopped before raft_uv closed a full segment), which "
                      "libraft 0.15 cannot load; removed those 8 zero bytes, no entry",
                      msg, io->log_dir);
        }
        /* raft_uv reads every open segment whole (segtail.h): their zeros go first. */
        unsigned removed, cut;
        if (segtail_zeros(io->log_dir, &removed, &cut, msg, sizeof(msg)) != 0) {
            clog_error("%s", msg);
            snprintf(io->outer.errmsg, sizeof(io->outer.errmsg),
                     "a log segment cannot be read or trimmed (the message above says which)");
            return RAFT_IOERR;
        }
    }
    int rv = io->inner.load(&io->inner, term, voted_for, snapshot, start_index, entries, n_entries);
    if (rv == 0) {
        io_conf_snapshot_loaded(io, *snapshot);
    }
    /* Where raft_uv writes the next entry (an empty log: not known until the first). */
    io->disk_next = rv == 0 && *n_entries > 0 ? *start_index + *n_entries : 0;
    if (rv != 0 || io->snap_dir == NULL || *snapshot == NULL) {
        return io_pass_err(io, rv);
    }
    char err[sizeof(io->outer.errmsg)];
    uint64_t t0 = nowUs();
    int resolved = snapshotResolve(io, *snapshot, true, err, sizeof(err));
    io->load_snap_us = nowUs() - t0;
    if (resolved != 0) {
        /* raft does not free what a failed load returned. */
        snapshotFree(*snapshot);
        *snapshot = NULL;
        void *batch = NULL;
        for (size_t i = 0; i < *n_entries; i++) {
            if ((*entries)[i].batch != batch) {
                batch = (*entries)[i].batch;
                raft_free(batch);
            }
        }
        raft_free(*entries);
        *entries = NULL;
        *n_entries = 0;
        snprintf(io->outer.errmsg, sizeof(io->outer.errmsg), "%s", err);
        return RAFT_CORRUPT;
    }
    io->snap_last = (*snapshot)->index;
    return 0;
}

bool io_snap_data_unmap(struct io *io, const void *base)
{
    if (base == NULL || base != io->snap_map) {
        return false;
    }
    snapstore_unmap(io->snap_map, io->snap_map_len);
    io->snap_map = NULL;
    io->snap_map_len = 0;
    return true;
}

void io_snap_data_free(struct io *io, void *base)
{
    if (!io_snap_data_unmap(io, base)) {
        raft_free(base);
    }
}

/* A snapshot_get through snapstore: raft_uv reads the reference, a pool thread the data. */
struct ioGet {
    struct raft_io_snapshot_get req; /* handed to the inner io */
    struct raft_io_snapshot_get *outer;
    raft_io_snapshot_get_cb cb;
    struct io *io;
    uv_work_t work;
    struct raft_snapshot *snapshot; /* raft_uv's, with the reference */
    int rv;
    char err[256];
};

/* A get is counted in works from its submission to raft's callback: raft_uv 0.15 fires its
 * close callback right after a get's callback, and raft must hear of the get first. */
static void getEnd(struct ioGet *g, struct raft_snapshot *snapshot, int status)
{
    struct io *io = g->io;
    struct raft_io_snapshot_get *outer = g->outer;
    raft_io_snapshot_get_cb cb = g->cb;
    free(g);
    cb(outer, snapshot, status);
    io->works--;
    io_close_maybe_later(io);
}

/* The data could not be put back: raft gets an I/O error and no snapshot. */
static void getFail(struct ioGet *g, struct raft_snapshot *snapshot, const char *why)
{
    clog_error("snapshot for a follower: %s", why);
    snapshotFree(snapshot);
    getEnd(g, NULL, RAFT_IOERR);
}

static void snapGetWork(uv_work_t *w)
{
    struct ioGet *g = w->data;
    g->rv = snapshotResolve(g->io, g->snapshot, false, g->err, sizeof(g->err));
}

static void snapGetAfter(uv_work_t *w, int status)
{
    struct ioGet *g = w->data;
    struct raft_snapshot *snapshot = g->snapshot;
    if (status != 0 || g->rv != 0) {
        getFail(g, snapshot, status != 0 ? uv_strerror(status) : g->err);
        return;
    }
    getEnd(g, snapshot, 0);
}

static void ioSnapshotGetDone(struct raft_io_snapshot_get *req, struct raft_snapshot *snapshot,
                              int status)
{
    struct ioGet *g = req->data;
    struct io *io = g->io;
    struct snapstore_ref r;
    if (status == 0 && snapshot != NULL && snapshot->n_bufs == 1 &&
        snapstore_ref_decode(snapshot->bufs[0].base, snapshot->bufs[0].len, &r)) {
        g->snapshot = snapshot;
        g->work.data = g;
        int rv = uv_queue_work(io->loop, &g->work, snapGetWork, snapGetAfter);
        if (rv != 0) {
            getFail(g, snapshot, uv_strerror(rv));
        }
        return;
    }
    getEnd(g, snapshot, status);
}

int io_snap_get(struct raft_io *o, struct raft_io_snapshot_get *req,
                raft_io_snapshot_get_cb cb)
{
    struct io *io = io_from_outer(o);
    if (io->snap_dir == NULL) {
        return io_pass_err(io, io->inner.snapshot_get(&io->inner, req, cb));
    }
    struct ioGet *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return RAFT_NOMEM;
    }
    g->req.data = g;
    g->outer = req;
    g->cb = cb;
    g->io = io;
    req->cb = cb;
    io->works++;
    int rv = io->inner.snapshot_get(&io->inner, &g->req, ioSnapshotGetDone);
    if (rv != 0) {
        io->works--;
        free(g);
    }
    return io_pass_err(io, rv);
}

static void snapGcWork(uv_work_t *w)
{
    struct ioSnapGc *g = w->data;
    snapstore_gc(g->io->snap_dir, g->older, g->newest, g->io->snap_delete_pause_us,
                 &g->io->snap_stop);
}

static void snapGcAfter(uv_work_t *w, int status)
{
    (void)status;
    struct ioSnapGc *g = w->data;
    struct io *io = g->io;
    free(g);
    io->works--;
    io_close_maybe_later(io);
}

/* Queues snapstore_gc(older, newest) on the pool; (0, 0) only empties the trash. */
static void snapGcQueue(struct io *io, uint64_t older, uint64_t newest)
{
    if (io->closing) {
        return; /* the next stored snapshot removes them */
    }
    struct ioSnapGc *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return;
    }
    g->work.data = g;
    g->io = io;
    g->older = older;
    g->newest = newest;
    if (uv_queue_work(io->loop, &g->work, snapGcWork, snapGcAfter) != 0) {
        free(g);
        return;
    }
    io->works++;
}

/* A snapshot at `index` is stored: the files of all older ones but the one before it
 * (raft_uv keeps that one too) can go, off the loop. */
static void snapStored(struct io *io, uint64_t index)
{
    uint64_t older = io->snap_last;
    io->snap_last = index;
    snapGcQueue(io, older, index);
}

/* raft_uv took a snapshot put (rv 0). Without trailing entries it takes it for an install,
 * whoever asked: it drops the whole log and, from the put's submission on, appends the next
 * entry at the snapshot's index + 1 (later appends wait behind the put). */
static void putSubmitted(struct io *io, struct ioDisk *d, int rv, unsigned trailing, uint64_t index)
{
    if (rv == 0 && trailing == 0) {
        io->disk_next = index + 1;
    }
    if (rv == 0) {
        d->in_inner = true;
        io->puts_inner++;
    }
}

/* Whether req, as raft submits it, is the put of a snapshot sent by the leader, not of one
 * of its own. libraft 0.15 uses its one request (raft->snapshot.put) for both, with trailing
 * 0 for an install (which snapshot_trailing may be too); its data is raft itself for its own
 * snapshot (takeSnapshot), the install's request for an install
 * (replicationInstallSnapshot). */
static bool isInstall(const struct io *io, const struct raft_io_snapshot_put *req)
{
    return io->raft != NULL && req->data != (void *)io->raft;
}

/* A snapshot sent by the leader could not be stored. libraft 0.15 has by then dropped its
 * in-memory log for the snapshot's and set nothing back: to the leader's next
 * InstallSnapshot it answers that it has a more recent one, and it takes the entries after
 * the snapshot, which raft_uv writes after its own last entry on disk, so at the wrong
 * indexes (seen: such a follower, restarted, matched the leader at one of them and applied
 * the wrong commands; made leader, it granted 57 claims that were held a second time).
 * Stop instead: the disk still holds the log and snapshot from before (the snapshot's data
 * is written first, and raft_uv's own put only after it), which the node restarts from. */
static void installFailed(int status, const char *why)
{
    clog_error("storing the leader's snapshot failed on this node (%s%s%s); stopping: "
               "restarted, it resumes from what its disk holds",
               raft_strerror(status), why[0] != '\0' ? ": " : "", why);
    abort();
}

void io_snap_put_done(struct raft_io_snapshot_put *req, int status)
{
    struct ioDisk *d = req->data;
    struct raft_io_snapshot_put *outer = d->outer.put;
    raft_io_snapshot_put_cb cb = d->cb.put;
    struct ioSnapJob *j = d->job;
    bool install = d->install;
    bool in_inner = d->in_inner;
    uint64_t start_us = d->start_us;
    struct io *io = io_disk_end(d);
    const char *why = j != NULL && j->err[0] != '\0' ? j->err : io->inner.errmsg;
    if (status != 0 && !io->closing && install) {
        installFailed(status, why);
    }
    if (!io->closing && !install) {
        io->own_puts++;
        io->own_put_us = nowUs() - start_us;
        io->own_put_status = status;
        io->own_put_err[0] = '\0';
        if (status != 0) {
            io->own_put_failures++;
            snprintf(io->own_put_err, sizeof(io->own_put_err), "%s",
                     why[0] != '\0' ? why : raft_strerror(status));
        }
    }
    if (j != NULL) {
        if (status == 0) { /* only raft_uv's put, after our write, answers 0 */
            snapStored(io, j->r.index);
        } else if (j->shielded) {
            /* Whatever raft_uv deleted before failing is freed; nothing of ours goes. */
            snapGcQueue(io, 0, 0);
        }
        free(j);
    }
    cb(outer, status);
    if (in_inner) {
        /* After raft's callback, which may ask a truncation: held too (raft_uv ends the put's
         * barrier only once this returns). */
        io->puts_inner--;
        io_disk_release_later(io);
    }
    io_close_maybe_later(io);
}

static void snapWriteWork(uv_work_t *w)
{
    struct ioSnapJob *j = w->data;
    struct io *io = j->d->io;
    j->rv = snapstore_write(io->snap_dir, j->snapshot->term, j->snapshot->index, j->snapshot->bufs,
                            j->snapshot->n_bufs, io->snap_pause_us, &io->snap_stop, &j->r, j->err,
                            sizeof(j->err));
    if (j->rv == 0) {
        /* raft_uv deletes the log segments this snapshot covers: let it drop only names. */
        j->shielded = snapstore_shield(io->snap_dir, j->snapshot->index, j->trailing) > 0;
    }
}

static void snapWriteAfter(uv_work_t *w, int status)
{
    struct ioSnapJob *j = w->data;
    struct ioDisk *d = j->d;
    struct io *io = d->io;
    io->works--;
    int rv;
    if (status == 0 && j->rv == SNAPSTORE_STOPPED) {
        rv = RAFT_CANCELED; /* raft is closing: the write stopped, nothing of it is left */
    } else if (status != 0 || j->rv != 0) {
        clog_error("snapshot store: %s", status != 0 ? uv_strerror(status) : j->err);
        rv = RAFT_IOERR;
    } else if (io->closing) {
        rv = RAFT_CANCELED; /* written, not referenced: the next stored snapshot removes it */
    } else {
        snapstore_ref_encode(&j->r, j->ref);
        j->ref_buf.base = j->ref;
        j->ref_buf.len = sizeof(j->ref);
        j->ref_snapshot = *j->snapshot;
        j->ref_snapshot.bufs = &j->ref_buf;
        j->ref_snapshot.n_bufs = 1;
        rv = io_snap_submit_put(io, d, j->trailing, &j->ref_snapshot, false);
        if (rv == 0) {
            io_close_maybe_later(io);
            return;
        }
    }
    io_snap_put_done(&d->req.put, rv);
}

/* Hands raft_uv a put, or holds it behind what is held (raft's order). A put held, or one
 * whose data snapstore wrote (j), that raft_uv refuses is called back with the error. */
int io_snap_submit_put(struct io *io, struct ioDisk *d, unsigned trailing,
                       const struct raft_snapshot *snapshot, bool held)
{
    if (!held && !TAILQ_EMPTY(&io->held)) {
        return io_disk_hold(io, d, 0, NULL, 0, snapshot, trailing) ? 0 : RAFT_NOMEM;
    }
    int rv = io->inner.snapshot_put(&io->inner, trailing, &d->req.put, snapshot, io_snap_put_done);
    putSubmitted(io, d, rv, trailing, snapshot->index);
    if (rv != 0 && d->job != NULL) {
        clog_error("snapshot store: raft_uv refused the reference: %s",
                   io->inner.errmsg[0] ? io->inner.errmsg : raft_strerror(rv));
    }
    if (rv != 0 && held) {
        io_snap_put_done(&d->req.put, rv);
        return 0;
    }
    return rv;
}

int io_snap_put(struct raft_io *o, unsigned trailing, struct raft_io_snapshot_put *req,
                const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    struct io *io = io_from_outer(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* what raft_uv answers while closing */
    }
    struct ioDisk *d = io_disk_begin(io);
    if (d == NULL) {
        return RAFT_NOMEM;
    }
    d->req.put.data = d;
    d->outer.put = req;
    d->cb.put = cb;
    d->install = isInstall(io, req);
    d->start_us = nowUs();
    req->cb = cb;
    if (io->snap_dir == NULL) {
        int rv = io_snap_submit_put(io, d, trailing, snapshot, false);
        if (rv != 0 && d->install) {
            installFailed(rv, io->inner.errmsg);
        }
        return io_disk_submitted(d, rv);
    }
    struct ioSnapJob *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        io_disk_end(d);
        return RAFT_NOMEM;
    }
    j->work.data = j;
    j->d = d;
    j->trailing = trailing;
    j->snapshot = snapshot;
    d->job = j;
    int rv = uv_queue_work(io->loop, &j->work, snapWriteWork, snapWriteAfter);
    if (rv != 0) {
        free(j);
        io_disk_end(d);
        snprintf(io->outer.errmsg, sizeof(io->outer.errmsg), "snapshot store: %s", uv_strerror(rv));
        if (isInstall(io, req)) {
            installFailed(RAFT_IOERR, io->outer.errmsg);
        }
        return RAFT_IOERR;
    }
    io->works++;
    return 0;
}
