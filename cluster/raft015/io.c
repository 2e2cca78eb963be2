/* io: the raft I/O wrapper's messages in and out, and its wiring (io_wrap). Corrects
 * libraft 0.15's answers that vouch for more than their AppendEntries covered and its
 * follower's commit index (io_clamp_commit), its leader's commit of older terms' entries
 * (io_hold_result, Figure 8), its follower's append below its snapshot
 * (io_skip_snapshotted), its leader's ignored acknowledgement of a snapshot
 * (io_snapshot_acked), its answers sent with no address (io_result_unaddressed) and its
 * InstallSnapshot dropped while another is stored (io_install_waits); io.h says each.
 * The other parts: io_internal.h. */
#include "io_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"
#include "snapstore.h"

static int ioInit(struct raft_io *o, raft_id id, const char *address)
{
    struct io *io = io_from_outer(o);
    return io_pass_err(io, io->inner.init(&io->inner, id, address));
}

bool io_install_waits(const struct raft *r, const struct raft_message *m)
{
    return m->type == RAFT_IO_INSTALL_SNAPSHOT &&
           (r->snapshot.pending.term != 0 || r->snapshot.put.data != NULL);
}

/* Frees a held InstallSnapshot that raft will not get. */
void io_held_install_drop(struct io *io)
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
    io_held_install_drop(io);
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

static raft_time ioNow(const struct io *io);

/* The wrapper's clock read now: the loop's cached time may be late by a long turn (one that
 * waited on the disk, say). */
static raft_time ioNowFresh(const struct io *io)
{
    return io->loop != NULL ? (raft_time)(uv_hrtime() / 1000000u) : ioNow(io);
}

bool io_change_waits(const struct io *io)
{
    return io->raft != NULL && io->change_appends > 0 && io->raft->state == RAFT_FOLLOWER;
}

void io_held_timeout_now_drop(struct io *io)
{
    free(io->held_timeout_now_addr);
    io->held_timeout_now_addr = NULL;
}

/* Holds `msg` (a TimeoutNow that would make raft a candidate before it takes the
 * configuration being written), in place of an older one held. */
static void heldTimeoutNowKeep(struct io *io, const struct raft_message *msg)
{
    io_held_timeout_now_drop(io);
    char *addr = strdup(msg->server_address != NULL ? msg->server_address : "");
    if (addr == NULL) {
        /* Without a copy of the address it cannot be held: dropped (as an older one held),
         * as a TimeoutNow raft ignores; the leader's transfer then times out, and it stays
         * leader. */
        return;
    }
    io->held_timeout_now = *msg;
    io->held_timeout_now_addr = addr;
    io->held_timeout_now_at = ioNowFresh(io);
    io->timeouts_held++;
}

void io_change_stored(struct io *io)
{
    char *addr = io->held_timeout_now_addr;
    if (addr == NULL || io_change_waits(io)) {
        return;
    }
    /* The leader gives a transfer up an election timeout after it began ("leadership did not
     * move"), and the election a TimeoutNow starts takes a round of votes: one held over
     * half an election timeout would often start an election after the leader reported
     * that the transfer failed. (This narrows that window; a slow network can still make
     * it.) */
    raft_time now = ioNowFresh(io), at = io->held_timeout_now_at;
    raft_time age = now > at ? now - at : 0;
    if (io->closing || io->raft == NULL || age > io->raft->election_timeout / 2) {
        io->timeouts_dropped += !io->closing;
        io_held_timeout_now_drop(io);
        return;
    }
    struct raft_message msg = io->held_timeout_now;
    io->held_timeout_now_addr = NULL;
    msg.server_address = addr;
    io->raft_recv(&io->outer, &msg);
    free(addr);
}

static void ioTickCb(struct raft_io *i)
{
    struct io *io = io_from_inner(i);
    heldInstallMaybeDeliver(io);
    if (io_change_waits(io)) {
        io->ticks_held++; /* the next one after the append runs the election timer */
    } else {
        io->raft_tick(&io->outer);
    }
    io_settle(io, false);
}

bool io_hold_result(const struct raft *r, struct raft_append_entries_result *res)
{
    if (res->rejected != 0 || r->last_stored == 0 ||
        io_log_term(r, r->last_stored) == r->current_term) {
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

/* The wrapper's clock in ms: its loop's (raft_uv's own clock), else the inner io's. */
static raft_time ioNow(const struct io *io)
{
    if (io->loop != NULL) {
        return uv_now(io->loop);
    }
    struct raft_io *inner = (struct raft_io *)&io->inner;
    return inner->time(inner);
}

/* Notes that a message from `id` arrived now: its own entry, else an unused one, else the
 * one heard from longest ago. */
static void noteHeard(struct io *io, raft_id id)
{
    raft_time now = ioNow(io);
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
            raft_time now = ioNow(io);
            return now >= io->heard[k].at_ms ? now - io->heard[k].at_ms : 0;
        }
    }
    return UINT64_MAX;
}

raft_time io_stale_leader_ms(const struct raft *r)
{
    raft_time half = r->election_timeout / 2, two_beats = 2 * (raft_time)r->heartbeat_timeout;
    raft_time ms = half > two_beats ? half : two_beats;
    return ms < r->election_timeout ? ms : r->election_timeout;
}

bool io_vote_past_stale_leader(const struct raft *r, raft_time now, struct raft_message *m)
{
    if (m->type != RAFT_IO_REQUEST_VOTE || m->request_vote.disrupt_leader ||
        r->state != RAFT_FOLLOWER || r->follower_state.current_leader.id == 0 ||
        r->snapshot.put.data != NULL ||
        now < r->election_timer_start || now - r->election_timer_start < io_stale_leader_ms(r)) {
        return false;
    }
    m->request_vote.disrupt_leader = true;
    return true;
}

bool io_timer_reset_by_leader(const struct raft *r, raft_time start_before)
{
    return r->state == RAFT_FOLLOWER && r->follower_state.current_leader.id != 0 &&
           r->election_timer_start != start_before && r->election_timeout != 0;
}

static void pokeSentCb(struct raft_io_send *req, int status)
{
    (void)status; /* failing is its purpose */
    free(req);
}

void io_poke(struct io *io, raft_id id)
{
    const struct raft *r = io->raft;
    if (r == NULL || io->closing) {
        return;
    }
    const char *address = NULL;
    for (unsigned i = 0; i < r->configuration.n; i++) {
        if (r->configuration.servers[i].id == id) {
            address = r->configuration.servers[i].address;
        }
    }
    struct raft_io_send *req = malloc(sizeof(*req));
    if (address == NULL || req == NULL) {
        free(req);
        return;
    }
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_REQUEST_VOTE_RESULT;
    m.server_id = id;
    m.server_address = address;
    m.request_vote_result.term = r->current_term;
    m.request_vote_result.vote_granted = false;
    m.request_vote_result.pre_vote = raft_tribool_false;
    req->data = io;
    if (io->inner.send(&io->inner, req, &m, pokeSentCb) != 0) {
        free(req);
    }
}

static void ioRecv(struct io *io, struct raft_message *msg)
{
    noteHeard(io, msg->server_id);
    if (io->raft != NULL && io_vote_past_stale_leader(io->raft, ioNow(io), msg)) {
        io->stale_votes++;
        clog_info("node %llu asks for a %svote; leader %llu not heard from for %llu ms",
                  (unsigned long long)msg->server_id, msg->request_vote.pre_vote ? "pre-" : "",
                  (unsigned long long)io->raft->follower_state.current_leader.id,
                  (unsigned long long)(ioNow(io) - io->raft->election_timer_start));
    }
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
    if (msg->type == RAFT_IO_TIMEOUT_NOW && io_change_waits(io)) {
        heldTimeoutNowKeep(io, msg);
        return;
    }
    if (msg->type != RAFT_IO_APPEND_ENTRIES) {
        io->raft_recv(&io->outer, msg);
        return;
    }
    if (io->raft != NULL && io_skip_snapshotted(io->raft, &msg->append_entries)) {
        io->skipped++;
    }
    if (io->raft != NULL) {
        (void)io_conf_rollback(io, &msg->append_entries);
    }
    io->in_append_entries = true;
    io->ae_from = msg->server_id;
    io->ae_end = msg->append_entries.prev_log_index + msg->append_entries.n_entries;
    if (io_clamp_commit(&msg->append_entries)) {
        io->corrected++;
    }
    raft_time start_before = io->raft != NULL ? io->raft->election_timer_start : 0;
    io->raft_recv(&io->outer, msg);
    io->in_append_entries = false;
    if (io->raft != NULL && io_timer_reset_by_leader(io->raft, start_before)) {
        struct raft *r = io->raft;
        r->follower_state.randomized_election_timeout = (unsigned)io->inner.random(
            &io->inner, (int)r->election_timeout, 2 * (int)r->election_timeout);
    }
}

static void ioRecvCb(struct raft_io *i, struct raft_message *msg)
{
    struct io *io = io_from_inner(i);
    ioRecv(io, msg);
    io_settle(io, false);
}

static int ioStart(struct raft_io *o, unsigned msecs, raft_io_tick_cb tick, raft_io_recv_cb recv)
{
    struct io *io = io_from_outer(o);
    io->raft_tick = tick;
    io->raft_recv = recv;
    unsigned every = msecs < IO_TICK_MAX_MS ? msecs : IO_TICK_MAX_MS;
    return io_pass_err(io, io->inner.start(&io->inner, every, ioTickCb, ioRecvCb));
}

static int ioBootstrap(struct raft_io *o, const struct raft_configuration *conf)
{
    struct io *io = io_from_outer(o);
    return io_pass_err(io, io->inner.bootstrap(&io->inner, conf));
}

static int ioRecover(struct raft_io *o, const struct raft_configuration *conf)
{
    struct io *io = io_from_outer(o);
    return io_pass_err(io, io->inner.recover(&io->inner, conf));
}

static int ioSetTerm(struct raft_io *o, raft_term term)
{
    struct io *io = io_from_outer(o);
    return io_pass_err(io, io->inner.set_term(&io->inner, term));
}

static int ioSetVote(struct raft_io *o, raft_id server_id)
{
    struct io *io = io_from_outer(o);
    return io_pass_err(io, io->inner.set_vote(&io->inner, server_id));
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

void io_settle(struct io *io, bool answered)
{
    io_conf_note(io);
    if (io->settle != NULL) {
        io->settle(io->settle_data, answered);
    }
}

/* What inner's send of message returned (rv), after io_settle for a result. */
static int resultSent(struct io *io, const struct raft_message *message, int rv)
{
    rv = io_pass_err(io, rv);
    if (message->type == RAFT_IO_APPEND_ENTRIES_RESULT) {
        io_settle(io, rv == 0); /* answered only if the send took it */
    }
    return rv;
}

static int ioSend(struct raft_io *o, struct raft_io_send *req, const struct raft_message *message,
                  raft_io_send_cb cb)
{
    struct io *io = io_from_outer(o);
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
            return resultSent(io, message, io->inner.send(&io->inner, req, &fixed, cb));
        }
    }
    return resultSent(io, message, io->inner.send(&io->inner, req, message, cb));
}

static raft_time ioTime(struct raft_io *o)
{
    struct io *io = io_from_outer(o);
    return io->inner.time(&io->inner);
}

static int ioRandom(struct raft_io *o, int min, int max)
{
    struct io *io = io_from_outer(o);
    return io->inner.random(&io->inner, min, max);
}

void io_wrap(struct io *io, uv_loop_t *loop)
{
    struct raft_io *o = &io->outer;
    memset(o, 0, sizeof(*o));
    io->settle = NULL;
    io->settle_data = NULL;
    io->inner.data = io; /* io_from_inner */
    /* libraft 0.15's raft_uv implements async_work (version 2 of raft_io) but still says
     * version 1, and raft_init refuses asynchronous snapshots over a version 1 io: the
     * wrapper, which implements version 2, says so when the inner io has the method. */
    o->version = io->inner.async_work != NULL && io->inner.version < 2 ? 2 : io->inner.version;
    o->init = ioInit;
    o->close = io_close;
    o->load = io_snap_load;
    o->start = ioStart;
    o->bootstrap = ioBootstrap;
    o->recover = ioRecover;
    o->set_term = ioSetTerm;
    o->set_vote = ioSetVote;
    o->send = ioSend;
    o->append = io_disk_append;
    o->truncate = io_disk_truncate;
    o->snapshot_put = io_snap_put;
    o->snapshot_get = io_snap_get;
    o->time = ioTime;
    o->random = ioRandom;
    o->async_work = io->inner.async_work != NULL ? io_async_work : NULL;
    io->in_append_entries = false;
    io->corrected = 0;
    io->raft = NULL;
    io->results_held = 0;
    io_conf_init(io);
    io->rematched = 0;
    io->unaddressed = 0;
    io->skipped = 0;
    memset(&io->held_install, 0, sizeof(io->held_install));
    io->held_install_addr = NULL;
    io->installs_held = 0;
    io->change_appends = 0;
    memset(&io->held_timeout_now, 0, sizeof(io->held_timeout_now));
    io->held_timeout_now_addr = NULL;
    io->held_timeout_now_at = 0;
    io->timeouts_held = 0;
    io->timeouts_dropped = 0;
    io->ticks_held = 0;
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
