#include "io.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio_reap.h"
#include "clog.h"
#include "logdir.h"
#include "segtail.h"
#include "snapstore.h"

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
 * raft_malloc()ed, as raft_uv's own). Returns 0, or -1 with a message in err. */
static int snapshotResolve(struct io *io, struct raft_snapshot *snapshot, char *err, size_t errlen)
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
    if (snapstore_read(io->snap_dir, &r, &data, err, errlen) != 0) {
        return -1;
    }
    raft_free(snapshot->bufs[0].base);
    snapshot->bufs[0].base = data;
    snapshot->bufs[0].len = (size_t)r.size;
    return 0;
}

static int ioLoad(struct raft_io *o, raft_term *term, raft_id *voted_for,
                  struct raft_snapshot **snapshot, raft_index *start_index,
                  struct raft_entry *entries[], size_t *n_entries)
{
    struct io *io = fromOuter(o);
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
    }
    int rv = io->inner.load(&io->inner, term, voted_for, snapshot, start_index, entries, n_entries);
    /* Where raft_uv writes the next entry (an empty log: not known until the first). */
    io->disk_next = rv == 0 && *n_entries > 0 ? *start_index + *n_entries : 0;
    if (rv != 0 || io->snap_dir == NULL || *snapshot == NULL) {
        return passErr(io, rv);
    }
    char err[sizeof(io->outer.errmsg)];
    if (snapshotResolve(io, *snapshot, err, sizeof(err)) != 0) {
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

bool io_install_waits(const struct raft *r, const struct raft_message *m)
{
    return m->type == RAFT_IO_INSTALL_SNAPSHOT &&
           (r->snapshot.pending.term != 0 || r->snapshot.put.data != NULL);
}

/* Frees a held InstallSnapshot that raft will not get. */
static void heldInstallDrop(struct io *io)
{
    if (io->held_install_addr == NULL) {
        return;
    }
    raft_configuration_close(&io->held_install.install_snapshot.conf);
    raft_free(io->held_install.install_snapshot.data.base);
    free(io->held_install_addr);
    io->held_install_addr = NULL;
}

/* Holds `msg` (an InstallSnapshot raft would drop now), in place of an older one held. */
static void heldInstallKeep(struct io *io, const struct raft_message *msg)
{
    char *addr = strdup(msg->server_address != NULL ? msg->server_address : "");
    if (addr == NULL) {
        /* Without a copy of the address it cannot be held: raft drops it, as before. */
        io->raft_recv(&io->outer, (struct raft_message *)msg);
        return;
    }
    heldInstallDrop(io);
    io->held_install = *msg;
    io->held_install_addr = addr;
    io->installs_held++;
    clog_info("the leader's snapshot (index %llu) arrived while this node was storing "
              "another: installing it once that one is stored",
              (unsigned long long)msg->install_snapshot.last_index);
}

/* Hands the held InstallSnapshot to raft once the snapshot being stored is. */
static void heldInstallMaybeDeliver(struct io *io)
{
    char *addr = io->held_install_addr;
    if (addr == NULL || io->raft == NULL || io_install_waits(io->raft, &io->held_install)) {
        return;
    }
    struct raft_message msg = io->held_install;
    io->held_install_addr = NULL;
    msg.server_address = addr;
    io->raft_recv(&io->outer, &msg); /* raft takes the data and the configuration */
    free(addr);
}

static void ioTickCb(struct raft_io *i)
{
    struct io *io = fromInner(i);
    heldInstallMaybeDeliver(io);
    io->raft_tick(&io->outer);
}

/* The term of the entry at `index` in raft's in-memory log (libraft 0.15's struct raft_log
 * is public), 0 if the log does not hold it. */
static raft_term logTermAt(const struct raft *r, raft_index index)
{
    const struct raft_log *l = &r->log;
    if (index != 0 && index == l->snapshot.last_index) {
        return l->snapshot.last_term;
    }
    size_t n = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    if (index <= l->offset || index - l->offset > n) {
        return 0;
    }
    return l->entries[(l->front + (size_t)(index - l->offset - 1)) % l->size].term;
}

bool io_hold_result(const struct raft *r, struct raft_append_entries_result *res)
{
    if (res->rejected != 0 || r->last_stored == 0 ||
        logTermAt(r, r->last_stored) == r->current_term) {
        return false;
    }
    /* Never below the commit index: a follower that installed a snapshot still leaves
     * the snapshot state. */
    raft_index cap = r->last_stored - 1 > r->commit_index ? r->last_stored - 1 : r->commit_index;
    if (res->last_log_index <= cap) {
        return false;
    }
    res->last_log_index = cap;
    return true;
}

/* libraft 0.15's progress states (src/progress.h): probe, pipeline, snapshot. */
#define RAFT015_PROGRESS_SNAPSHOT 2

bool io_snapshot_acked(struct raft *r, raft_id from, const struct raft_append_entries_result *res)
{
    if (r->state != RAFT_LEADER || res->rejected != 0 || res->term != r->current_term ||
        r->leader_state.progress == NULL) {
        return false;
    }
    for (unsigned i = 0; i < r->configuration.n; i++) {
        if (r->configuration.servers[i].id != from) {
            continue;
        }
        struct raft_progress *p = &r->leader_state.progress[i];
        if (p->state != RAFT015_PROGRESS_SNAPSHOT || p->snapshot_index == 0 ||
            res->last_log_index != p->snapshot_index || res->last_log_index > p->match_index) {
            return false;
        }
        p->match_index = res->last_log_index - 1;
        return true;
    }
    return false;
}

bool io_clamp_commit(struct raft_append_entries *ae)
{
    /* libraft 0.15's follower commits up to min(leader_commit, its last stored index),
     * which may be a stale suffix the RPC did not cover. Figure 2: commit up to
     * min(leaderCommit, index of last new entry). */
    raft_index end = ae->prev_log_index + ae->n_entries;
    if (ae->leader_commit <= end) {
        return false;
    }
    ae->leader_commit = end;
    return true;
}

/* Frees the batches that entries[0, k) use and no entry of entries[k, n) does. An
 * AppendEntries' entries point into batches that raft frees with the message (one per
 * message from raft_uv); entries of one batch are contiguous, as raft itself assumes. */
static void freeDroppedBatches(struct raft_entry *entries, unsigned k, unsigned n)
{
    void *last = NULL;
    for (unsigned i = 0; i < k; i++) {
        void *batch = entries[i].batch;
        if (batch == NULL || batch == last) {
            continue;
        }
        last = batch;
        bool kept = false;
        for (unsigned j = k; j < n && !kept; j++) {
            kept = entries[j].batch == batch;
        }
        if (!kept) {
            raft_free(batch);
        }
    }
}

bool io_skip_snapshotted(const struct raft *r, struct raft_append_entries *ae)
{
    raft_index snap = r->log.snapshot.last_index;
    if (snap == 0 || ae->prev_log_index >= snap || ae->term < r->current_term) {
        return false;
    }
    /* Every entry up to snap is committed, so the leader of this term holds the same
     * ones (Leader Completeness): the RPC can start at snap. */
    raft_index covered = snap - ae->prev_log_index;
    if (covered >= ae->n_entries) {
        /* The leader's term for snap when the RPC reaches it (a conflict then stops raft,
         * as below); else only the snapshot's own is known. */
        ae->prev_log_term = covered == ae->n_entries && ae->n_entries > 0
                                ? ae->entries[ae->n_entries - 1].term
                                : r->log.snapshot.last_term;
        freeDroppedBatches(ae->entries, ae->n_entries, ae->n_entries);
        raft_free(ae->entries);
        ae->entries = NULL;
        ae->n_entries = 0;
    } else {
        unsigned k = (unsigned)covered;
        /* The leader's own term for snap: should it differ from ours, raft sees a
         * conflict at a committed index and stops, as it must. */
        ae->prev_log_term = ae->entries[k - 1].term;
        freeDroppedBatches(ae->entries, k, ae->n_entries);
        memmove(ae->entries, ae->entries + k, (ae->n_entries - k) * sizeof(*ae->entries));
        ae->n_entries -= k;
    }
    ae->prev_log_index = snap;
    return true;
}

/* Notes that a message from `id` arrived now: its own entry, else an unused one, else the
 * one heard from longest ago. */
static void noteHeard(struct io *io, raft_id id)
{
    raft_time now = uv_now(io->loop);
    size_t pick = 0;
    for (size_t k = 0; k < IO_PEERS_MAX; k++) {
        if (io->heard[k].id == id) {
            pick = k;
            break;
        }
        if (io->heard[pick].id != 0 &&
            (io->heard[k].id == 0 || io->heard[k].at_ms < io->heard[pick].at_ms)) {
            pick = k;
        }
    }
    io->heard[pick].id = id;
    io->heard[pick].at_ms = now;
}

uint64_t io_heard_ago_ms(const struct io *io, raft_id id)
{
    for (size_t k = 0; k < IO_PEERS_MAX; k++) {
        if (io->heard[k].id == id && id != 0) {
            raft_time now = uv_now(io->loop);
            return now >= io->heard[k].at_ms ? now - io->heard[k].at_ms : 0;
        }
    }
    return UINT64_MAX;
}

static void ioRecvCb(struct raft_io *i, struct raft_message *msg)
{
    struct io *io = fromInner(i);
    noteHeard(io, msg->server_id);
    if (msg->type == RAFT_IO_APPEND_ENTRIES_RESULT && io->raft != NULL &&
        io_hold_result(io->raft, &msg->append_entries_result)) {
        io->results_held++;
    }
    if (msg->type == RAFT_IO_APPEND_ENTRIES_RESULT && io->raft != NULL &&
        io_snapshot_acked(io->raft, msg->server_id, &msg->append_entries_result)) {
        io->rematched++;
        clog_warn("node %llu acknowledged snapshot %llu below the index it had matched "
                  "before (its data was lost?): replicating to it from the snapshot",
                  (unsigned long long)msg->server_id,
                  (unsigned long long)msg->append_entries_result.last_log_index);
    }
    if (io->raft != NULL && io_install_waits(io->raft, msg)) {
        heldInstallKeep(io, msg);
        return;
    }
    if (msg->type != RAFT_IO_APPEND_ENTRIES) {
        io->raft_recv(&io->outer, msg);
        return;
    }
    if (io->raft != NULL && io_skip_snapshotted(io->raft, &msg->append_entries)) {
        io->skipped++;
    }
    io->in_append_entries = true;
    io->ae_from = msg->server_id;
    io->ae_end = msg->append_entries.prev_log_index + msg->append_entries.n_entries;
    if (io_clamp_commit(&msg->append_entries)) {
        io->corrected++;
    }
    io->raft_recv(&io->outer, msg);
    io->in_append_entries = false;
}

static int ioStart(struct raft_io *o, unsigned msecs, raft_io_tick_cb tick, raft_io_recv_cb recv)
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

bool io_result_unaddressed(const struct raft *r, const struct raft_message *m)
{
    if (m->type != RAFT_IO_APPEND_ENTRIES_RESULT) {
        return false;
    }
    return m->server_address == NULL ||
           (r->state != RAFT_FOLLOWER &&
            m->server_address == r->follower_state.current_leader.address);
}

static int ioSend(struct raft_io *o, struct raft_io_send *req, const struct raft_message *message,
                  raft_io_send_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->raft != NULL && io_result_unaddressed(io->raft, message)) {
        /* In a state other than follower, message->server_id is the union's bytes too. */
        io->unaddressed++;
        if ((io->unaddressed & (io->unaddressed - 1)) == 0) { /* the 1st, 2nd, 4th, ... */
            clog_warn("raft answered a leader from state %d with no leader address "
                      "(libraft 0.15, io.h); the answer is dropped (%lu so far)",
                      io->raft->state, io->unaddressed);
        }
        return RAFT_NOCONNECTION;
    }
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
    const struct raft_entry *e = &l->entries[(l->front + (size_t)(first - l->offset - 1)) % l->size];
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

static void maybeCloseInnerLater(struct io *io);
static void releaseHeld(struct io *io, bool all);

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
    maybeCloseInnerLater(io);
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
    g->rv = snapshotResolve(g->io, g->snapshot, g->err, sizeof(g->err));
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

static int ioSnapshotGet(struct raft_io *o, struct raft_io_snapshot_get *req,
                         raft_io_snapshot_get_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->snap_dir == NULL) {
        return passErr(io, io->inner.snapshot_get(&io->inner, req, cb));
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
    return passErr(io, rv);
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
    struct io *io = fromInner(i);
    /* Held behind a put raft_uv never called back: they end canceled before raft's close
     * (raft frees its requests then). */
    releaseHeld(io, true);
    heldInstallDrop(io);
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
        clog_warn("raft I/O: %u disk write(s) still in flight %u ms after close; closing "
                  "the log anyway",
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
    /* A snapshot write in flight would be discarded (snapWriteAfter), and a deletion can
     * wait for the next snapshot: neither keeps the close waiting (snapstore.h). */
    atomic_store(&io->snap_stop, true);
    if (closeMayGo(io)) {
        closeInner(io);
        return;
    }
    /* Something is in flight: the close timer bounds the wait for disk writes and runs the
     * close once the last callback has returned. */
    uv_timer_t *t = malloc(sizeof(*t));
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
    struct ioSnapJob *job; /* a put through snapstore */
    uint64_t start_us;     /* appends: when raft asked (appendTimed) */
    TAILQ_ENTRY(ioDisk) link; /* appends: in io->appends */
    uint64_t trunc;           /* appends: the truncation checked when it ends (0: none) */
    bool in_inner;            /* puts: raft_uv holds it (io->puts_inner counts it) */
    bool install;          /* puts: of a snapshot the leader sent (isInstall) */
};

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
    struct io *io = diskEnd(d);
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
    maybeCloseInnerLater(io);
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
static int submitPut(struct io *io, struct ioDisk *d, unsigned trailing,
                     const struct raft_snapshot *snapshot, bool held);
static void ioSnapshotPutDone(struct raft_io_snapshot_put *req, int status);

/* libraft 0.15's raft_uv runs no truncation asked while one of its snapshot puts holds
 * the open segments (the put's barrier): the truncation's own barrier never fires
 * (canonical/raft #372, fixed after 0.15 by #435). Seen here with raft_uv itself (a
 * truncation from 8 asked while a put at 6 waited): nothing was truncated, the entries
 * after it were written on, and the next load refused the log ("closed segment 8-9 is past
 * last snapshot"); in an open segment they would have been read at the wrong indexes. So
 * a truncation asked while raft_uv holds a put, and every append after it, wait here until
 * the put has called back, and then go to raft_uv in the order raft asked them. */
static void releaseHeld(struct io *io, bool all)
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
                ioSnapshotPutDone(&op.d->req.put, RAFT_CANCELED);
            } else {
                ioAppendDone(&op.d->req.append, RAFT_CANCELED);
            }
        } else if (put) {
            submitPut(io, op.d, op.trailing, op.snapshot, true);
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
    releaseHeld(io, false);
    maybeCloseInnerLater(io);
}

static void releaseLater(struct io *io)
{
    if (io->puts_inner > 0 || TAILQ_EMPTY(&io->held) || io->release_queued) {
        return;
    }
    if (io->inner_closing) {
        releaseHeld(io, false); /* raft_uv takes nothing more: they end canceled, now */
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
    releaseHeld(io, false); /* at once, then: the check after it still stops a node it fails */
}

static bool holdOp(struct io *io, struct ioDisk *d, raft_index index,
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

static int ioTruncate(struct raft_io *o, raft_index index)
{
    struct io *io = fromOuter(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* raft_uv asserts that it is not closing */
    }
    if (io->puts_inner > 0 || !TAILQ_EMPTY(&io->held)) {
        if (!holdOp(io, NULL, index, NULL, 0, NULL, 0)) {
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

static int ioAppend(struct raft_io *o, struct raft_io_append *req,
                    const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
    struct io *io = fromOuter(o);
    if (io->inner_closing) {
        return RAFT_CANCELED; /* raft_uv asserts that it is not closing */
    }
    raft_index first = checkAppendIndex(io, entries, n);
    struct ioDisk *d = diskBegin(io);
    if (d == NULL) {
        return RAFT_NOMEM;
    }
    d->req.append.data = d;
    d->start_us = uv_hrtime() / 1000u;
    d->outer.append = req;
    d->cb.append = cb;
    req->cb = cb;
    TAILQ_INSERT_TAIL(&io->appends, d, link);
    int rv;
    if (!TAILQ_EMPTY(&io->held)) {
        /* After a truncation held back: in raft's order. */
        rv = holdOp(io, d, 0, entries, n, NULL, 0) ? 0 : RAFT_NOMEM;
        if (rv != 0) {
            TAILQ_REMOVE(&io->appends, d, link);
        }
    } else {
        rv = submitAppend(io, d, entries, n, false);
    }
    if (rv == 0) {
        /* Taken: raft_uv stores them next (0: where is not known from here on). */
        io->disk_next = first != 0 ? first + n : 0;
    }
    return diskSubmitted(d, rv);
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
    maybeCloseInnerLater(io);
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

static void ioSnapshotPutDone(struct raft_io_snapshot_put *req, int status)
{
    struct ioDisk *d = req->data;
    struct raft_io_snapshot_put *outer = d->outer.put;
    raft_io_snapshot_put_cb cb = d->cb.put;
    struct ioSnapJob *j = d->job;
    bool install = d->install;
    bool in_inner = d->in_inner;
    struct io *io = diskEnd(d);
    const char *why = j != NULL && j->err[0] != '\0' ? j->err : io->inner.errmsg;
    if (status != 0 && !io->closing && install) {
        installFailed(status, why);
    }
    if (!io->closing && !install) {
        io->own_puts++;
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
        releaseLater(io);
    }
    maybeCloseInnerLater(io);
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
        rv = submitPut(io, d, j->trailing, &j->ref_snapshot, false);
        if (rv == 0) {
            maybeCloseInnerLater(io);
            return;
        }
    }
    ioSnapshotPutDone(&d->req.put, rv);
}

/* Hands raft_uv a put, or holds it behind what is held (raft's order). A put held, or one
 * whose data snapstore wrote (j), that raft_uv refuses is called back with the error. */
static int submitPut(struct io *io, struct ioDisk *d, unsigned trailing,
                     const struct raft_snapshot *snapshot, bool held)
{
    if (!held && !TAILQ_EMPTY(&io->held)) {
        return holdOp(io, d, 0, NULL, 0, snapshot, trailing) ? 0 : RAFT_NOMEM;
    }
    int rv = io->inner.snapshot_put(&io->inner, trailing, &d->req.put, snapshot, ioSnapshotPutDone);
    putSubmitted(io, d, rv, trailing, snapshot->index);
    if (rv != 0 && d->job != NULL) {
        clog_error("snapshot store: raft_uv refused the reference: %s",
                   io->inner.errmsg[0] ? io->inner.errmsg : raft_strerror(rv));
    }
    if (rv != 0 && held) {
        ioSnapshotPutDone(&d->req.put, rv);
        return 0;
    }
    return rv;
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
    d->install = isInstall(io, req);
    req->cb = cb;
    if (io->snap_dir == NULL) {
        int rv = submitPut(io, d, trailing, snapshot, false);
        if (rv != 0 && d->install) {
            installFailed(rv, io->inner.errmsg);
        }
        return diskSubmitted(d, rv);
    }
    struct ioSnapJob *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        diskEnd(d);
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
        diskEnd(d);
        snprintf(io->outer.errmsg, sizeof(io->outer.errmsg), "snapshot store: %s", uv_strerror(rv));
        if (isInstall(io, req)) {
            installFailed(RAFT_IOERR, io->outer.errmsg);
        }
        return RAFT_IOERR;
    }
    io->works++;
    return 0;
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

static int ioAsyncWork(struct raft_io *o, struct raft_io_async_work *req, raft_io_async_work_cb cb)
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
    io->raft = NULL;
    io->results_held = 0;
    io->rematched = 0;
    io->unaddressed = 0;
    io->skipped = 0;
    memset(&io->held_install, 0, sizeof(io->held_install));
    io->held_install_addr = NULL;
    io->installs_held = 0;
    io->loop = loop;
    io->works = 0;
    io->disk = 0;
    TAILQ_INIT(&io->appends);
    io->closing = false;
    io->close_deferred = false;
    io->inner_closing = false;
    io->disk_wait_over = false;
    io->close_wait_ms = IO_CLOSE_WAIT_MS;
    io->close_timer = NULL;
    io->late_failures = 0;
    io->snap_dir = NULL;
    io->snap_pause_us = SNAPSTORE_PAUSE_US;
    atomic_init(&io->snap_stop, false);
    io->snap_delete_pause_us = SNAPSTORE_DELETE_PAUSE_US;
    io->snap_last = 0;
    io->log_dir = NULL;
    io->trunc_last = 0;
    io->puts_inner = 0;
    io->truncs_held = 0;
    io->release_queued = false;
    TAILQ_INIT(&io->held);
    memset(io->append_buckets, 0, sizeof(io->append_buckets));
    memset(io->heard, 0, sizeof(io->heard));
    io->append_count = 0;
    io->append_sum_us = 0;
}
