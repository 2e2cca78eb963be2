/* io: raft's disk and network I/O (raft_uv) behind a thin wrapper that corrects one bug of
 * libraft 0.15's follower.
 *
 * The bug (found by tests/sim, see its comment for the replay seed): a follower that accepts
 * an AppendEntries without writing anything (a heartbeat, or entries it already holds)
 * answers with last_log_index = its last *stored* index. When its log still ends with
 * entries of an older term past those the RPC covered, the leader takes them as matching
 * its own and may commit an entry that only it holds; a later leader overwrites it, and
 * replicas apply different commands at the same index. Raft's rule (Figure 2 of the paper)
 * is that a success answer vouches only for prev_log_index + the RPC's entries; the fork
 * cowsql/raft answers exactly that. This wrapper applies that rule to every answer raft
 * sends from inside its handling of an AppendEntries: those are the answers that report
 * without an append. (An answer sent after an append is right already: the append
 * truncated any conflicting suffix first.) The follower side has the same flaw when it
 * advances its commit index (min(leader_commit, last stored index)); the wrapper lowers an
 * incoming AppendEntries' leader_commit to prev_log_index + n_entries, so that a follower
 * commits only entries the RPC proved to match the leader's log.
 *
 * The wrapper also forwards async_work (raft runs the serialising part of an asynchronous
 * snapshot through it, on raft_uv's thread pool) and holds raft's close back until every
 * such work has called back: raft_uv would otherwise be closed, and freed by the cluster,
 * under a work still running on a pool thread. */
#ifndef IDEM_CLUSTER_IO_H
#define IDEM_CLUSTER_IO_H

#include <raft.h>
#include <stdbool.h>

struct io {
    struct raft_io outer; /* first member; hand &outer to raft_init */
    struct raft_io inner; /* raft_uv_init() it; raft_uv_set_*() and raft_uv_close() on it */
    raft_io_tick_cb raft_tick;
    raft_io_recv_cb raft_recv;
    raft_io_close_cb close_cb;
    bool in_append_entries;
    raft_id ae_from;
    raft_index ae_end;
    unsigned long corrected; /* answers and commit indexes clamped so far */
    unsigned works;          /* async_work requests in flight (raft's async snapshots) */
    bool closing;            /* raft called close */
    bool close_deferred;     /* ... while works > 0: inner close waits for the last one */
};

/* Fills io->outer with methods that delegate to io->inner. Call after raft_uv_init(). */
void io_wrap(struct io *io);

#endif
