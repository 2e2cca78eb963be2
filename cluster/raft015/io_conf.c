/* io_conf: libraft 0.15's rollback of an uncommitted configuration, corrected
 * (docs/raft-0.15.md, 32; canonical/raft #250, fixed after 0.15 by #354).
 *
 * A configuration change takes effect on a server as soon as its entry is in the log
 * (raft's rule), before it commits: raft keeps it as configuration_uncommitted_index, the
 * last committed one as configuration_index. When a new leader's entries overwrite the
 * uncommitted entry, 0.15 rolls the configuration back by decoding the log entry at
 * configuration_index, with no check that the log still holds it; a snapshot takes it out
 * of the log once it is past the trailing entries, and the rollback then dereferences NULL
 * (the node crashes). Two more 0.15 flaws lead there or worse:
 * - at start, raft takes the last configuration entry of the log it loaded as committed
 *   (configuration_index), whether it was or not: when a new leader then overwrites it, no
 *   rollback happens at all, and the node keeps a configuration the cluster never
 *   committed, for good;
 * - a snapshot taken while a change is uncommitted stores that configuration as the
 *   committed one (the state machine's snapshot refuses then: cluster/snapshot.c).
 *
 * The wrapper keeps a copy of the last committed configuration, taken whenever raft has
 * none uncommitted (io_conf_note, after each of raft's callbacks and before each snapshot)
 * and from a snapshot loaded at start. Before raft handles an AppendEntries that would
 * overwrite the uncommitted entry while the committed one is no longer in the log, it
 * rolls the configuration back from that copy itself, so that raft finds nothing to roll
 * back (io_conf_rollback). After raft_start, a last configuration entry past the snapshot
 * is marked uncommitted, the one before it (in the log, or the snapshot's) committed, as
 * libraft does after #354 (io_conf_after_start); it commits again as the node applies it. */
#include "io_internal.h"

#include <stdlib.h>
#include <string.h>

#include "clog.h"

/* Replaces *dst (initialised) by a copy of src. 0, or a raft error code with *dst empty. */
static int confCopy(struct raft_configuration *dst, const struct raft_configuration *src)
{
    raft_configuration_close(dst);
    raft_configuration_init(dst);
    for (unsigned i = 0; i < src->n; i++) {
        const struct raft_server *s = &src->servers[i];
        int rv = raft_configuration_add(dst, s->id, s->address, s->role);
        if (rv != 0) {
            raft_configuration_close(dst);
            raft_configuration_init(dst);
            return rv;
        }
    }
    return 0;
}

void io_conf_init(struct io *io)
{
    raft_configuration_init(&io->conf);
    io->conf_index = 0;
    io->conf_rollbacks = 0;
    io->conf_marked = 0;
    io->conf_cleared = 0;
}

void io_conf_free(struct io *io)
{
    raft_configuration_close(&io->conf);
    raft_configuration_init(&io->conf);
    io->conf_index = 0;
}

/* Whether raft is closing or closed: its messages are dropped, nothing changes any more. */
static bool closed(const struct io *io)
{
    return io->raft == NULL || io->closing || raft_state(io->raft) == RAFT_UNAVAILABLE;
}

void io_conf_note(struct io *io)
{
    if (closed(io)) {
        return;
    }
    struct raft *r = io->raft;
    raft_index u = r->configuration_uncommitted_index;
    if (u != 0 && (u <= r->log.snapshot.last_index || u <= r->last_applied)) {
        /* Covered by a snapshot installed since (0.15's snapshotRestore sets the snapshot's
         * configuration and its index but leaves the uncommitted index as it was), or
         * applied: committed, and the configuration raft holds is the committed one. Left
         * set, it would keep the node from every snapshot (cluster/snapshot.c) and its
         * leader from every change. */
        r->configuration_uncommitted_index = 0;
        io->conf_cleared++;
    }
    if (r->configuration_uncommitted_index != 0 || r->configuration_index == 0 ||
        r->configuration_index == io->conf_index) {
        return;
    }
    if (confCopy(&io->conf, &r->configuration) != 0) {
        io->conf_index = 0; /* out of memory: next time */
        return;
    }
    io->conf_index = r->configuration_index;
}

void io_conf_snapshot_loaded(struct io *io, const struct raft_snapshot *s)
{
    if (s == NULL || s->configuration_index == 0 || confCopy(&io->conf, &s->configuration) != 0) {
        return;
    }
    io->conf_index = s->configuration_index;
}

/* The index of the first entry of ae that raft would overwrite (an entry of the log at
 * the same index with another term), 0 when it overwrites none: raft's replicationAppend
 * truncates there. An AppendEntries raft refuses (an older term, or a previous entry that
 * does not match) overwrites nothing. */
static raft_index overwrittenAt(const struct raft *r, const struct raft_append_entries *ae)
{
    if (ae->term < r->current_term) {
        return 0;
    }
    if (ae->prev_log_index != 0) {
        if (io_log_term(r, ae->prev_log_index) != ae->prev_log_term) {
            return 0;
        }
    }
    for (unsigned k = 0; k < ae->n_entries; k++) {
        raft_index index = ae->prev_log_index + 1 + k;
        const struct raft_entry *e = io_log_entry(r, index);
        if (e == NULL) {
            return 0; /* past the log's end: appended, nothing overwritten */
        }
        if (e->term != ae->entries[k].term) {
            return index;
        }
    }
    return 0;
}

bool io_conf_rollback(struct io *io, const struct raft_append_entries *ae)
{
    if (closed(io)) {
        return false; /* raft drops the message */
    }
    struct raft *r = io->raft;
    raft_index uncommitted = r->configuration_uncommitted_index;
    if (uncommitted == 0 || io_log_entry(r, r->configuration_index) != NULL) {
        return false; /* nothing to roll back, or raft finds the committed entry itself */
    }
    raft_index at = overwrittenAt(r, ae);
    if (at == 0 || at > uncommitted || at <= r->commit_index) {
        /* Past the change, or nothing overwritten; at or below the commit index raft stops
         * (RAFT_SHUTDOWN) before any rollback. */
        return false;
    }
    if (io->conf_index != r->configuration_index) {
        /* Not known here (never seen settled): raft's own rollback would crash. Stopping
         * with a message beats a segmentation fault; the node starts again from its log. */
        clog_error("a new leader overwrites this node's uncommitted configuration (entry %llu), "
                   "and the last committed one (entry %llu) is neither in the log nor known to "
                   "the raft I/O wrapper (it knows entry %llu): stopping",
                   (unsigned long long)uncommitted, (unsigned long long)r->configuration_index,
                   (unsigned long long)io->conf_index);
        abort();
    }
    struct raft_configuration back;
    raft_configuration_init(&back);
    if (confCopy(&back, &io->conf) != 0) {
        clog_error("out of memory rolling back an uncommitted configuration");
        abort();
    }
    raft_configuration_close(&r->configuration);
    r->configuration = back;
    r->configuration_uncommitted_index = 0;
    io->conf_rollbacks++;
    clog_warn("a new leader overwrites this node's uncommitted configuration (entry %llu): "
              "rolled back to the committed one (entry %llu, %u servers)",
              (unsigned long long)uncommitted, (unsigned long long)r->configuration_index,
              r->configuration.n);
    return true;
}

void io_conf_after_start(struct io *io)
{
    struct raft *r = io->raft;
    raft_index last = r->configuration_index;
    if (r->configuration_uncommitted_index != 0 || last <= 1 ||
        last <= r->log.snapshot.last_index || last <= r->commit_index) {
        return; /* from the snapshot, the bootstrap entry, or known committed */
    }
    raft_index before = 0;
    for (raft_index i = last - 1; i > r->log.offset && i > r->log.snapshot.last_index; i--) {
        const struct raft_entry *e = io_log_entry(r, i);
        if (e != NULL && e->type == RAFT_CHANGE) {
            before = i;
            break;
        }
    }
    if (before == 0 && io->conf_index != 0 && io->conf_index < last) {
        before = io->conf_index; /* the snapshot's, copied at load */
    }
    if (before == 0) {
        clog_warn("the log's last configuration (entry %llu) is taken as committed: no earlier "
                  "one is known to roll back to",
                  (unsigned long long)last);
        return;
    }
    r->configuration_uncommitted_index = last;
    r->configuration_index = before;
    io->conf_marked++;
    clog_info("the log's last configuration (entry %llu) is taken as uncommitted until this node "
              "applies it again; the one before it (entry %llu) as committed",
              (unsigned long long)last, (unsigned long long)before);
}
