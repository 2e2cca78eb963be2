/* io_internal: what the parts of the raft I/O wrapper (io.h) share: io.c (messages in and
 * out, and the wiring), io_disk.c (appends and truncations), io_snap.c (load and snapshots,
 * through snapstore) and io_close.c (raft's close held back, async work). Private to
 * cluster/raft015/. */
#ifndef IDEM_CLUSTER_IO_INTERNAL_H
#define IDEM_CLUSTER_IO_INTERNAL_H

#include <stddef.h>
#include <string.h>

#include "io.h"

static inline struct io *io_from_outer(struct raft_io *o)
{
    return (struct io *)o;
}

/* The inner io hands its callbacks a raft_io whose data is the wrapper: raft_uv its own
 * (io->inner), raft_fixture the one it was created on (io.h, io_wrap). */
static inline struct io *io_from_inner(struct raft_io *i)
{
    return (struct io *)i->data;
}

/* raft reads io->errmsg after a failed call: pass raft_uv's message up. */
static inline int io_pass_err(struct io *io, int rv)
{
    if (rv != 0) {
        memcpy(io->outer.errmsg, io->inner.errmsg, sizeof(io->outer.errmsg));
    }
    return rv;
}

/* The entry at `index` in raft's in-memory log (libraft 0.15's struct raft_log is public),
 * NULL if the log does not hold it. */
static inline const struct raft_entry *io_log_entry(const struct raft *r, raft_index index)
{
    const struct raft_log *l = &r->log;
    size_t n = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    if (index <= l->offset || index - l->offset > n) {
        return NULL;
    }
    return &l->entries[(l->front + (size_t)(index - l->offset - 1)) % l->size];
}

/* The term of the entry at `index`: the log's, the snapshot's at its last index, else 0. */
static inline raft_term io_log_term(const struct raft *r, raft_index index)
{
    if (index != 0 && index == r->log.snapshot.last_index) {
        return r->log.snapshot.last_term;
    }
    const struct raft_entry *e = io_log_entry(r, index);
    return e != NULL ? e->term : 0;
}

struct ioSnapJob; /* io_snap.c: a snapshot put through snapstore */

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
    struct ioSnapJob *job;    /* a put through snapstore */
    uint64_t start_us;        /* when raft asked (appends: appendTimed; puts: own_put_us) */
    TAILQ_ENTRY(ioDisk) link; /* appends: in io->appends */
    uint64_t trunc;           /* appends: the truncation checked when it ends (0: none) */
    bool in_inner;            /* puts: raft_uv holds it (io->puts_inner counts it) */
    bool install;             /* puts: of a snapshot the leader sent (isInstall) */
    bool change;              /* appends: one of its entries is a configuration (counted in
                               * io->change_appends while in flight) */
};

/* ---- io.c ---- */

/* Frees a held InstallSnapshot that raft will not get. */
void io_held_install_drop(struct io *io);
/* Frees a held TimeoutNow that raft will not get. */
void io_held_timeout_now_drop(struct io *io);
/* An append of a configuration entry called back: hands raft the TimeoutNow held meanwhile,
 * once none is in flight (io_change_waits). */
void io_change_stored(struct io *io);

/* ---- io_disk.c: appends and truncations ---- */

/* A wrapper for a request about to go to raft_uv, counted in io->disk; NULL (nothing
 * counted) when out of memory. */
struct ioDisk *io_disk_begin(struct io *io);
/* raft_uv answered the submission with rv (0, or rv with d dropped). */
int io_disk_submitted(struct ioDisk *d, int rv);
/* The request's callback came: d is freed and no longer counted. Returns its io. */
struct io *io_disk_end(struct ioDisk *d);
/* Holds an operation behind the ones held (a truncation: d NULL; an append; a put). */
bool io_disk_hold(struct io *io, struct ioDisk *d, raft_index index,
                  const struct raft_entry *entries, unsigned n,
                  const struct raft_snapshot *snapshot, unsigned trailing);
/* Hands what was held to raft_uv (all: whatever raft_uv holds, at its close). */
void io_disk_release_held(struct io *io, bool all);
/* ... from the loop's next turn, once raft_uv holds no put. */
void io_disk_release_later(struct io *io);
int io_disk_truncate(struct raft_io *o, raft_index index);
int io_disk_append(struct raft_io *o, struct raft_io_append *req, const struct raft_entry entries[],
                   unsigned n, raft_io_append_cb cb);

/* ---- io_snap.c: load and snapshots ---- */

int io_snap_load(struct raft_io *o, raft_term *term, raft_id *voted_for,
                 struct raft_snapshot **snapshot, raft_index *start_index,
                 struct raft_entry *entries[], size_t *n_entries);
int io_snap_get(struct raft_io *o, struct raft_io_snapshot_get *req, raft_io_snapshot_get_cb cb);
int io_snap_put(struct raft_io *o, unsigned trailing, struct raft_io_snapshot_put *req,
                const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb);
int io_snap_submit_put(struct io *io, struct ioDisk *d, unsigned trailing,
                       const struct raft_snapshot *snapshot, bool held);
void io_snap_put_done(struct raft_io_snapshot_put *req, int status);

/* ---- io_close.c: raft's close, async work ---- */

void io_close(struct raft_io *o, raft_io_close_cb cb);
/* Called by the callbacks of appends, puts and works: closes raft_uv from the loop's next
 * turn once nothing holds its close back (io_close.c says why not at once). */
void io_close_maybe_later(struct io *io);
int io_async_work(struct raft_io *o, struct raft_io_async_work *req, raft_io_async_work_cb cb);

#endif
