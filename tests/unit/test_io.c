#define _GNU_SOURCE /* mkdtemp */
/* Unit test of the I/O wrapper (cluster/raft015/io*.c): the correction of libraft 0.15's
 * AppendEntries answers, the
 * forwarding of async_work (asynchronous snapshots) with raft's close held back until the
 * last work has called back, and raft's close held back (for a bounded time) while appends
 * and snapshot puts are in flight. A fake raft_uv below the wrapper records what is sent and
 * holds async works, appends and puts until the test completes them; a fake raft above it
 * answers the way libraft 0.15 does (its last stored index). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aio_reap.h"
#include "io.h"
#include "logdir.h"
#include "snapstore.h"
#include "tmpdir.h"

static uv_loop_t loop; /* the close bound's timer runs on it */
static struct io theIo;
static raft_io_recv_cb innerRecv; /* what the wrapper registered with the "raft_uv" */
static raft_io_tick_cb innerTick;
static struct raft_message lastSent;
static int sends;
static raft_index lastStored; /* what the fake raft reports */
static bool answerRejected;
static raft_index seenCommit; /* leader_commit as the fake raft received it */

static unsigned startedEvery; /* the tick interval the wrapper asked the "raft_uv" for */

static int fakeStart(struct raft_io *io, unsigned msecs, raft_io_tick_cb tick, raft_io_recv_cb recv)
{
    (void)io;
    startedEvery = msecs;
    innerTick = tick;
    innerRecv = recv;
    return 0;
}

static int fakeSend(struct raft_io *io, struct raft_io_send *req,
                    const struct raft_message *message, raft_io_send_cb cb)
{
    (void)io;
    (void)req;
    (void)cb;
    lastSent = *message;
    sends++;
    return 0;
}

/* InstallSnapshots the fake raft received: how many, the last one's index and sender. */
static int installsSeen;
static raft_index installSeenIndex;
static char installSeenAddr[64];

/* The fake raft: takes an InstallSnapshot (freeing what raft owns then), answers every
 * AppendEntries at once with its last stored index. */
static struct raft_request_vote seenVote; /* the last RequestVote the fake raft received */
static int votesSeen;

/* TimeoutNow messages and ticks the fake raft received. */
static int timeoutNowSeen, ticksSeen;
static char timeoutNowAddr[64];

static void raftRecv(struct raft_io *io, struct raft_message *msg)
{
    if (msg->type == RAFT_IO_TIMEOUT_NOW) {
        timeoutNowSeen++;
        snprintf(timeoutNowAddr, sizeof(timeoutNowAddr), "%s", msg->server_address);
        return;
    }
    if (msg->type == RAFT_IO_REQUEST_VOTE) {
        seenVote = msg->request_vote;
        votesSeen++;
        return;
    }
    if (msg->type == RAFT_IO_INSTALL_SNAPSHOT) {
        installsSeen++;
        installSeenIndex = msg->install_snapshot.last_index;
        snprintf(installSeenAddr, sizeof(installSeenAddr), "%s", msg->server_address);
        raft_configuration_close(&msg->install_snapshot.conf);
        raft_free(msg->install_snapshot.data.base);
        return;
    }
    seenCommit = msg->append_entries.leader_commit;
    struct raft_message res;
    memset(&res, 0, sizeof(res));
    res.type = RAFT_IO_APPEND_ENTRIES_RESULT;
    res.server_id = msg->server_id;
    res.server_address = "127.0.0.1:9001"; /* its leader's, as raft addresses it */
    res.append_entries_result.rejected = answerRejected ? msg->append_entries.prev_log_index : 0;
    res.append_entries_result.last_log_index = lastStored;
    struct raft_io_send req;
    io->send(io, &req, &res, NULL);
}

static void raftTick(struct raft_io *io)
{
    (void)io;
    ticksSeen++;
}

static void deliverAppendEntriesCommit(raft_id from, raft_index prev, unsigned n, raft_index commit)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_APPEND_ENTRIES;
    m.server_id = from;
    m.append_entries.prev_log_index = prev;
    m.append_entries.n_entries = n;
    m.append_entries.leader_commit = commit;
    innerRecv(&theIo.inner, &m);
}

static void deliverAppendEntries(raft_id from, raft_index prev, unsigned n)
{
    deliverAppendEntriesCommit(from, prev, n, 0);
}

static int setup(void **state)
{
    (void)state;
    memset(&theIo, 0, sizeof(theIo));
    theIo.inner.version = 1;
    theIo.inner.start = fakeStart;
    theIo.inner.send = fakeSend;
    io_wrap(&theIo, &loop);
    sends = 0;
    answerRejected = false;
    assert_int_equal(theIo.outer.start(&theIo.outer, 100, raftTick, raftRecv), 0);
    return 0;
}

static void test_heartbeat_answer_is_clamped(void **state)
{
    (void)state;
    /* The follower holds stale entries up to 13; the heartbeat only covers up to 10. */
    lastStored = 13;
    deliverAppendEntries(2, 10, 0);
    assert_int_equal(sends, 1);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 10);
    assert_int_equal(theIo.corrected, 1);
    /* Entries the RPC carried are vouched for. */
    deliverAppendEntries(2, 10, 2);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 12);
}

/* raft ticks every heartbeat timeout (100 ms here); the wrapper asks for IO_TICK_MAX_MS. */
static void test_tick_is_finer_than_the_heartbeat(void **state)
{
    (void)state;
    assert_int_equal(startedEvery, IO_TICK_MAX_MS);
    unsigned every = startedEvery;
    assert_int_equal(theIo.outer.start(&theIo.outer, 5, raftTick, raftRecv), 0);
    assert_int_equal(startedEvery, 5); /* a shorter heartbeat keeps its own */
    startedEvery = every;
}

/* A follower of leader 1, its election timeout 300 ms, last heard from the leader at
 * `heard` in raft's clock (ms). */
static void followerOf1(struct raft *r, raft_time heard)
{
    memset(r, 0, sizeof(*r));
    r->state = RAFT_FOLLOWER;
    r->follower_state.current_leader.id = 1;
    r->election_timeout = 300;
    r->heartbeat_timeout = 50;
    r->election_timer_start = heard;
}

static struct raft_message voteRequest(raft_id from, bool pre_vote)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_REQUEST_VOTE;
    m.server_id = from;
    m.request_vote.candidate_id = from;
    m.request_vote.term = 3;
    m.request_vote.pre_vote = pre_vote;
    return m;
}

/* libraft 0.15 refuses any vote while it knows a leader; past half an election timeout
 * without hearing from it, the wrapper lets the request be decided on terms and logs. */
static void test_vote_past_a_stale_leader(void **state)
{
    (void)state;
    struct raft r;
    followerOf1(&r, 1000);
    struct raft_message m = voteRequest(2, true);
    /* Heard from 149 ms ago: the leader still counts, the request is left as it came. */
    assert_false(io_vote_past_stale_leader(&r, 1149, &m));
    assert_false(m.request_vote.disrupt_leader);
    /* 150 ms: half the election timeout has passed. */
    assert_true(io_vote_past_stale_leader(&r, 1150, &m));
    assert_true(m.request_vote.disrupt_leader);
    /* A real vote, likewise; a clock behind the timer's start changes nothing. */
    m = voteRequest(2, false);
    assert_true(io_vote_past_stale_leader(&r, 5000, &m));
    m = voteRequest(2, false);
    assert_false(io_vote_past_stale_leader(&r, 999, &m));
    /* No leader known, a candidate, a leader: raft decides on its own already. */
    r.follower_state.current_leader.id = 0;
    m = voteRequest(2, true);
    assert_false(io_vote_past_stale_leader(&r, 5000, &m));
    assert_false(m.request_vote.disrupt_leader);
    followerOf1(&r, 1000);
    r.state = RAFT_CANDIDATE;
    assert_false(io_vote_past_stale_leader(&r, 5000, &m));
    r.state = RAFT_LEADER;
    assert_false(io_vote_past_stale_leader(&r, 5000, &m));
    /* The threshold: half the election timeout, at least two heartbeats, at most the
     * whole timeout. */
    followerOf1(&r, 1000);
    assert_int_equal(io_stale_leader_ms(&r), 150);
    r.heartbeat_timeout = 100;
    assert_int_equal(io_stale_leader_ms(&r), 200);
    m = voteRequest(2, true);
    assert_false(io_vote_past_stale_leader(&r, 1199, &m));
    assert_true(io_vote_past_stale_leader(&r, 1200, &m));
    r.heartbeat_timeout = 250;
    assert_int_equal(io_stale_leader_ms(&r), 300);
    /* Other messages are never touched. */
    followerOf1(&r, 1000);
    struct raft_message ae;
    memset(&ae, 0, sizeof(ae));
    ae.type = RAFT_IO_APPEND_ENTRIES;
    assert_false(io_vote_past_stale_leader(&r, 5000, &ae));
}

/* A raft whose log holds entries 11-16 of term 1 after a snapshot at 10 (term 1), the
 * entries at `changes` (a 0-ended list) configuration changes, the rest commands; its
 * configuration has `voters` voters (ids 1..voters). */
static void confRaft(struct raft *r, struct raft_entry entries[8], const raft_index *changes,
                     unsigned voters)
{
    memset(r, 0, sizeof(*r));
    memset(entries, 0, 8 * sizeof(*entries));
    r->state = RAFT_FOLLOWER;
    r->current_term = 1;
    r->log.entries = entries;
    r->log.size = 8;
    r->log.front = 0;
    r->log.back = 6;
    r->log.offset = 10;
    r->log.snapshot.last_index = 10;
    r->log.snapshot.last_term = 1;
    for (unsigned i = 0; i < 6; i++) {
        entries[i].term = 1;
        entries[i].type = RAFT_COMMAND;
        for (const raft_index *c = changes; *c != 0; c++) {
            if (*c == 11 + i) {
                entries[i].type = RAFT_CHANGE;
            }
        }
    }
    r->commit_index = 10;
    raft_configuration_init(&r->configuration);
    for (unsigned i = 1; i <= voters; i++) {
        char addr[8];
        snprintf(addr, sizeof addr, "%u", i);
        assert_int_equal(raft_configuration_add(&r->configuration, i, addr, RAFT_VOTER), 0);
    }
}

/* io_conf_snapshot_loaded with a snapshot whose configuration, at `index`, has `voters`
 * voters (ids 1..voters). */
static void confSnapshotLoaded(struct io *io, raft_index index, unsigned voters)
{
    struct raft_snapshot snap;
    memset(&snap, 0, sizeof(snap));
    snap.configuration_index = index;
    raft_configuration_init(&snap.configuration);
    for (unsigned i = 1; i <= voters; i++) {
        char addr[8];
        snprintf(addr, sizeof addr, "%u", i);
        assert_int_equal(raft_configuration_add(&snap.configuration, i, addr, RAFT_VOTER), 0);
    }
    io_conf_snapshot_loaded(io, &snap);
    raft_configuration_close(&snap.configuration);
}

/* docs/raft-0.15.md, 32, at start: libraft 0.15 takes the log's last configuration entry as
 * committed; the wrapper marks one past the snapshot uncommitted, and the one before it (in
 * the log, else the snapshot's) committed. One from the snapshot, the bootstrap entry, or
 * one at or below the commit index is left as it is. */
static void test_last_configuration_at_start_is_uncommitted(void **state)
{
    (void)state;
    struct raft r;
    struct raft_entry entries[8];
    struct io io;
    memset(&io, 0, sizeof(io));
    io_conf_init(&io);
    io.raft = &r;
    const raft_index two[] = {13, 15, 0}, one[] = {15, 0};
    confRaft(&r, entries, two, 2);
    r.configuration_index = 15;
    io_conf_after_start(&io);
    assert_int_equal(r.configuration_uncommitted_index, 15);
    assert_int_equal(r.configuration_index, 13);
    assert_int_equal(io.conf_marked, 1);
    raft_configuration_close(&r.configuration);
    /* The only change past the snapshot: the snapshot's configuration is the committed one
     * (copied at load); none known, it is left as raft took it. */
    confRaft(&r, entries, one, 2);
    r.configuration_index = 15;
    io_conf_after_start(&io);
    assert_int_equal(r.configuration_uncommitted_index, 0);
    assert_int_equal(r.configuration_index, 15);
    confSnapshotLoaded(&io, 7, 1);
    assert_int_equal(io.conf_index, 7);
    io_conf_after_start(&io);
    assert_int_equal(r.configuration_uncommitted_index, 15);
    assert_int_equal(r.configuration_index, 7);
    /* From the snapshot, the bootstrap entry, known committed: untouched. */
    for (raft_index ci = 1; ci <= 15; ci += 5) {
        r.configuration_uncommitted_index = 0;
        r.configuration_index = ci == 11 ? 15 : ci; /* 1, 6 (the snapshot's), 15 committed */
        r.commit_index = ci == 11 ? 15 : 10;
        io_conf_after_start(&io);
        assert_int_equal(r.configuration_uncommitted_index, 0);
    }
    raft_configuration_close(&r.configuration);
    io_conf_free(&io);
}

/* docs/raft-0.15.md, 32, at an AppendEntries: rolled back from the wrapper's copy only when
 * the AppendEntries overwrites the uncommitted entry (or one before it) and raft's log no
 * longer holds the committed one; not for an AppendEntries raft refuses (older term,
 * previous entry not matching), one that overwrites only entries after the change, or when
 * raft can roll back itself. */
static void test_uncommitted_configuration_rolled_back_from_the_copy(void **state)
{
    (void)state;
    struct raft r;
    struct raft_entry entries[8];
    struct io io;
    memset(&io, 0, sizeof(io));
    io_conf_init(&io);
    io.raft = &r;
    confSnapshotLoaded(&io, 3, 3);
    const raft_index one[] = {15, 0};
    confRaft(&r, entries, one, 2); /* the change at 15 removed a voter */
    r.configuration_index = 3;
    r.configuration_uncommitted_index = 15;
    struct raft_entry sent[2];
    memset(sent, 0, sizeof(sent));
    sent[0].term = 2;
    sent[1].term = 2;
    struct raft_append_entries ae = {.term = 2, .prev_log_index = 15, .prev_log_term = 1,
                                     .entries = sent, .n_entries = 1};
    assert_false(io_conf_rollback(&io, &ae)); /* overwrites 16 only */
    ae.prev_log_index = 14;
    ae.prev_log_term = 2; /* no match: refused */
    assert_false(io_conf_rollback(&io, &ae));
    ae.prev_log_term = 1;
    ae.term = 0; /* an older term: refused */
    r.current_term = 1;
    assert_false(io_conf_rollback(&io, &ae));
    ae.term = 2;
    r.configuration_index = 12; /* in the log: raft rolls back itself */
    assert_false(io_conf_rollback(&io, &ae));
    r.configuration_index = 3;
    assert_int_equal(r.configuration_uncommitted_index, 15);
    r.commit_index = 15; /* at or below the commit index: raft stops instead */
    assert_false(io_conf_rollback(&io, &ae));
    r.commit_index = 10;
    io.closing = true; /* raft drops messages once it closes */
    assert_false(io_conf_rollback(&io, &ae));
    io.closing = false;
    assert_true(io_conf_rollback(&io, &ae)); /* overwrites 15 */
    assert_int_equal(r.configuration_uncommitted_index, 0);
    assert_int_equal(r.configuration_index, 3);
    assert_int_equal(r.configuration.n, 3);
    assert_int_equal(io.conf_rollbacks, 1);
    /* Once rolled back, nothing more to do. */
    assert_false(io_conf_rollback(&io, &ae));
    /* An uncommitted index an installed snapshot covers (0.15's restore leaves it) is
     * cleared, and the snapshot's configuration copied. */
    r.configuration_uncommitted_index = 15;
    r.log.snapshot.last_index = 20;
    r.configuration_index = 18;
    io_conf_note(&io);
    assert_int_equal(r.configuration_uncommitted_index, 0);
    assert_int_equal(io.conf_cleared, 1);
    assert_int_equal(io.conf_index, 18);
    raft_configuration_close(&r.configuration);
    io_conf_free(&io);
}

/* A follower's timer reset by its leader's AppendEntries (raft moved its start) is drawn
 * again; not a candidate's, nor a follower's that knows no leader, nor one left as it was. */
static void test_timeout_drawn_again_at_the_leaders_reset(void **state)
{
    (void)state;
    struct raft r;
    followerOf1(&r, 1000);
    assert_true(io_timer_reset_by_leader(&r, 990));
    assert_false(io_timer_reset_by_leader(&r, 1000));
    r.follower_state.current_leader.id = 0;
    assert_false(io_timer_reset_by_leader(&r, 990));
    followerOf1(&r, 1000);
    r.state = RAFT_CANDIDATE;
    assert_false(io_timer_reset_by_leader(&r, 990));
}

/* Through the wrapper's receive path: raft gets the request marked, and it is counted. */
static void test_vote_past_a_stale_leader_is_delivered_marked(void **state)
{
    (void)state;
    struct raft r;
    uv_update_time(&loop);
    raft_time now = uv_now(&loop); /* ms since an arbitrary point: the boot, on Linux */
    assert_true(now > 400);
    followerOf1(&r, now - 400);
    theIo.raft = &r;
    votesSeen = 0;
    struct raft_message m = voteRequest(2, true);
    innerRecv(&theIo.inner, &m);
    assert_int_equal(votesSeen, 1);
    assert_true(seenVote.disrupt_leader);
    assert_int_equal(theIo.stale_votes, 1);
    /* Just heard from: delivered as it came. */
    r.election_timer_start = now;
    m = voteRequest(2, true);
    innerRecv(&theIo.inner, &m);
    assert_int_equal(votesSeen, 2);
    assert_false(seenVote.disrupt_leader);
    theIo.raft = NULL;
}

static void test_other_answers_are_untouched(void **state)
{
    (void)state;
    lastStored = 9; /* behind what the RPC covers: nothing to clamp */
    deliverAppendEntries(2, 10, 0);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 9);
    answerRejected = true; /* rejections carry their own hint */
    lastStored = 13;
    deliverAppendEntries(2, 10, 0);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 13);
    /* An answer sent outside the handling of an AppendEntries (after a disk append) is
     * passed as it is. */
    struct raft_message res;
    memset(&res, 0, sizeof(res));
    res.type = RAFT_IO_APPEND_ENTRIES_RESULT;
    res.server_id = 2;
    res.append_entries_result.last_log_index = 20;
    struct raft_io_send req;
    theIo.outer.send(&theIo.outer, &req, &res, NULL);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 20);
    assert_int_equal(theIo.corrected, 0);
}

/* A follower learns a commit index only as far as the RPC proved its log matches. */
static void test_leader_commit_is_clamped(void **state)
{
    (void)state;
    lastStored = 13;
    deliverAppendEntriesCommit(2, 10, 0, 12);
    assert_int_equal(seenCommit, 10);
    deliverAppendEntriesCommit(2, 10, 5, 12);
    assert_int_equal(seenCommit, 12);
}

/* ---- async_work and close ----------------------------------------------------------- */

static struct raft_io_async_work *innerWork; /* the work the wrapper handed to "raft_uv" */
static raft_io_async_work_cb innerWorkCb;
static int innerCloses;
static bool inInnerCb; /* the fake raft_uv is inside one of its callbacks */
static raft_io_close_cb innerCloseCb;
static int workRuns, workCbs, workStatus, outerCloses;

static int fakeAsyncWork(struct raft_io *io, struct raft_io_async_work *req,
                         raft_io_async_work_cb cb)
{
    (void)io;
    innerWork = req;
    innerWorkCb = cb;
    req->cb = cb;
    return 0;
}

/* raft_uv 0.15 must not be closed from inside its own callbacks (io_close.c explains). */
static void fakeClose(struct raft_io *io, raft_io_close_cb cb)
{
    (void)io;
    assert_false(inInnerCb);
    innerCloses++;
    innerCloseCb = cb;
}

static int raftWork(struct raft_io_async_work *req)
{
    (void)req;
    workRuns++;
    return 0;
}

static void raftWorkDone(struct raft_io_async_work *req, int status)
{
    (void)req;
    workCbs++;
    workStatus = status;
}

static void raftClosed(struct raft_io *io)
{
    assert_ptr_equal(io, &theIo.outer);
    outerCloses++;
}

/* The pool thread finished: raft_uv calls the wrapper back on the loop. */
static void completeWork(int status)
{
    inInnerCb = true;
    innerWorkCb(innerWork, status);
    inInnerCb = false;
}

/* Runs the loop until nothing is left on it: the bound's timer, if any, fired or was closed,
 * and its handle is freed. */
static void drainLoop(void)
{
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_alive(&loop), 0);
}

/* raft closes the io with nothing in flight: raft_uv closes at once, the loop empties. */
static void closeIo(void)
{
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* One turn of the loop: the close the wrapper put off to it runs. */
static void turnLoop(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
}

static int setupWork(void **state)
{
    setup(state);
    theIo.inner.async_work = fakeAsyncWork;
    theIo.inner.close = fakeClose;
    io_wrap(&theIo, &loop);
    innerWork = NULL;
    innerCloses = workRuns = workCbs = outerCloses = 0;
    workStatus = -1;
    return 0;
}

/* Hands m, from `from`, to the wrapper as raft_uv does: its sender's address in raft_uv's
 * own buffer, reused once the callback returned (scribbled over here). */
static void deliverFrom(struct raft_message *m, raft_id from)
{
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", 9000u + (unsigned)from);
    m->server_id = from;
    m->server_address = addr;
    innerRecv(&theIo.inner, m);
    memset(addr, 'x', sizeof(addr) - 1);
}

/* An InstallSnapshot from `from` of a snapshot at `index`, as raft_uv hands it over: its
 * data and configuration for raft to own. */
static void deliverInstall(raft_id from, raft_index index)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_INSTALL_SNAPSHOT;
    m.install_snapshot.term = 2;
    m.install_snapshot.last_index = index;
    m.install_snapshot.last_term = 2;
    raft_configuration_init(&m.install_snapshot.conf);
    assert_int_equal(
        raft_configuration_add(&m.install_snapshot.conf, 1, "127.0.0.1:9001", RAFT_VOTER), 0);
    m.install_snapshot.data.len = 64;
    m.install_snapshot.data.base = raft_malloc(64);
    assert_non_null(m.install_snapshot.data.base);
    memset(m.install_snapshot.data.base, 0xab, 64);
    deliverFrom(&m, from);
}

static struct raft takingRaft; /* a follower raft, its own snapshot in progress or not */

static int setupInstall(void **state)
{
    setup(state);
    theIo.inner.close = fakeClose;
    innerCloses = outerCloses = 0;
    installsSeen = 0;
    memset(&takingRaft, 0, sizeof(takingRaft));
    theIo.raft = &takingRaft;
    return 0;
}

/* io_install_waits: only an InstallSnapshot, only while raft stores a snapshot (its own, or
 * an earlier one of the leader's: libraft's own test). */
static void test_install_waits_only_for_an_own_snapshot(void **state)
{
    (void)state;
    struct raft r;
    memset(&r, 0, sizeof(r));
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_INSTALL_SNAPSHOT;
    assert_false(io_install_waits(&r, &m));
    r.snapshot.pending.term = 3; /* taking its own */
    assert_true(io_install_waits(&r, &m));
    m.type = RAFT_IO_APPEND_ENTRIES;
    assert_false(io_install_waits(&r, &m));
    /* Installing one (a put, nothing pending): the first one's answer is for an older
     * snapshot than the one its leader then waits for (seen). */
    m.type = RAFT_IO_INSTALL_SNAPSHOT;
    r.snapshot.pending.term = 0;
    r.snapshot.put.data = &r;
    assert_true(io_install_waits(&r, &m));
    r.snapshot.put.data = NULL;
    assert_false(io_install_waits(&r, &m));
}

/* The leader's snapshot arriving while the follower stores another (which libraft 0.15 would
 * drop, unanswered, for the leader to resend after 30 s) reaches raft at the first tick
 * after that one is stored; a newer one replaces it meanwhile. */
static void test_install_held_until_own_snapshot_stored(void **state)
{
    (void)state;
    takingRaft.snapshot.pending.term = 2;
    deliverInstall(2, 213);
    assert_int_equal(installsSeen, 0);
    assert_int_equal(theIo.installs_held, 1);
    innerTick(&theIo.inner); /* still taking it */
    assert_int_equal(installsSeen, 0);
    deliverInstall(2, 277);
    assert_int_equal(theIo.installs_held, 2);
    takingRaft.snapshot.pending.term = 0; /* its own stored; an install of the leader's */
    takingRaft.snapshot.put.data = &takingRaft;
    innerTick(&theIo.inner);
    assert_int_equal(installsSeen, 0);
    takingRaft.snapshot.put.data = NULL; /* stored too */
    innerTick(&theIo.inner);
    assert_int_equal(installsSeen, 1);
    assert_int_equal(installSeenIndex, 277);
    assert_string_equal(installSeenAddr, "127.0.0.1:9002");
    innerTick(&theIo.inner);
    assert_int_equal(installsSeen, 1);
    /* With no snapshot of its own in progress, one goes to raft at once. */
    deliverInstall(3, 300);
    assert_int_equal(installsSeen, 2);
    assert_int_equal(installSeenIndex, 300);
    assert_string_equal(installSeenAddr, "127.0.0.1:9003");
    assert_int_equal(theIo.installs_held, 2);
    theIo.raft = NULL;
}

/* One still held at the close is freed (LeakSanitizer would report it otherwise). */
static void test_close_frees_a_held_install(void **state)
{
    (void)state;
    takingRaft.snapshot.pending.term = 2;
    deliverInstall(2, 213);
    assert_non_null(theIo.held_install_addr);
    closeIo();
    assert_null(theIo.held_install_addr);
    assert_int_equal(installsSeen, 0);
    theIo.raft = NULL;
}

/* libraft 0.15's raft_uv has async_work but says version 1: the wrapper says 2. */
static void test_async_work_is_forwarded(void **state)
{
    (void)state;
    assert_int_equal(theIo.outer.version, 2);
    assert_non_null(theIo.outer.async_work);
    struct raft_io_async_work req = {.data = NULL, .work = raftWork, .cb = NULL};
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    assert_non_null(innerWork);
    assert_int_equal(theIo.works, 1);
    /* The pool thread runs raft's function; the loop then gets raft's callback. */
    assert_int_equal(innerWork->work(innerWork), 0);
    assert_int_equal(workRuns, 1);
    completeWork(0);
    assert_int_equal(workCbs, 1);
    assert_int_equal(workStatus, 0);
    assert_int_equal(theIo.works, 0);
    /* A failure is passed on as it is; the request's data is not the wrapper's to keep
     * (libraft 0.15's raft_fixture sets it to its raft_io's data, tests/sim). */
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    innerWork->data = theIo.inner.data;
    assert_int_equal(innerWork->work(innerWork), 0);
    assert_int_equal(workRuns, 2);
    completeWork(RAFT_IOERR);
    assert_int_equal(workStatus, RAFT_IOERR);
    closeIo(); /* no work in flight: close goes through at once */
}

/* raft_close while a work runs on the pool: raft_uv is closed only once the work called
 * back (else the cluster frees it under the running work), and the late work is reported
 * canceled so that raft does not start storing a snapshot on a closing node. */
static void test_close_waits_for_async_work(void **state)
{
    (void)state;
    struct raft_io_async_work req = {.data = NULL, .work = raftWork, .cb = NULL};
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 0);
    assert_true(theIo.close_deferred);
    /* Closing: no new work is accepted. */
    struct raft_io_async_work other = {.data = NULL, .work = raftWork, .cb = NULL};
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &other, raftWorkDone), RAFT_CANCELED);
    innerWork->work(innerWork);
    completeWork(0);
    assert_int_equal(workCbs, 1);
    assert_int_equal(workStatus, RAFT_CANCELED);
    assert_int_equal(innerCloses, 0); /* not from inside raft_uv's callback */
    turnLoop();
    assert_int_equal(innerCloses, 1);
    assert_int_equal(outerCloses, 0);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* ---- appends, snapshot puts and close ------------------------------------------------- */

#define MAX_DISK 8

/* What the fake raft_uv holds: appends and puts not completed yet, in order. Like
 * raft_uv 0.15, its close completes the appends still queued at once, with RAFT_CANCELED,
 * from inside the close, and a put still waiting with RAFT_CANCELED too. */
static struct raft_io_append *innerAppends[MAX_DISK];
static raft_io_append_cb innerAppendCbs[MAX_DISK];
static int nInnerAppends;
static struct raft_io_snapshot_put *innerPut;
static raft_io_snapshot_put_cb innerPutCb;
static bool innerClosed;

/* What the fake raft saw. */
static int appendCbs, appendStatus, putCbs, putStatus;

static int fakeAppend(struct raft_io *io, struct raft_io_append *req,
                      const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
    (void)io;
    (void)entries;
    (void)n;
    assert_false(innerClosed); /* raft_uv 0.15 asserts it */
    assert_true(nInnerAppends < MAX_DISK);
    req->cb = cb;
    innerAppends[nInnerAppends] = req;
    innerAppendCbs[nInnerAppends] = cb;
    nInnerAppends++;
    return 0;
}

static const struct raft_snapshot *innerPutSnapshot; /* as raft_uv got it */

static int fakeSnapshotPut(struct raft_io *io, unsigned trailing, struct raft_io_snapshot_put *req,
                           const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    (void)io;
    (void)trailing;
    innerPutSnapshot = snapshot;
    assert_false(innerClosed);
    assert_null(innerPut);
    req->cb = cb;
    innerPut = req;
    innerPutCb = cb;
    return 0;
}

/* The disk finishes the oldest append still held, with status. */
static void completeAppend(int status)
{
    assert_true(nInnerAppends > 0);
    struct raft_io_append *req = innerAppends[0];
    raft_io_append_cb cb = innerAppendCbs[0];
    nInnerAppends--;
    memmove(innerAppends, innerAppends + 1, sizeof(innerAppends[0]) * (size_t)nInnerAppends);
    memmove(innerAppendCbs, innerAppendCbs + 1, sizeof(innerAppendCbs[0]) * (size_t)nInnerAppends);
    inInnerCb = true;
    cb(req, status);
    inInnerCb = false;
}

static void completePut(int status)
{
    struct raft_io_snapshot_put *req = innerPut;
    innerPut = NULL;
    inInnerCb = true;
    innerPutCb(req, status);
    inInnerCb = false;
}

static void fakeCloseCancelling(struct raft_io *io, raft_io_close_cb cb)
{
    (void)io;
    assert_false(inInnerCb);
    innerCloses++;
    innerCloseCb = cb;
    innerClosed = true;
    while (nInnerAppends > 0) {
        completeAppend(RAFT_CANCELED);
    }
    if (innerPut != NULL) {
        completePut(RAFT_CANCELED);
    }
}

static void raftAppendDone(struct raft_io_append *req, int status)
{
    (void)req;
    appendCbs++;
    appendStatus = status;
}

static void raftPutDone(struct raft_io_snapshot_put *req, int status)
{
    (void)req;
    putCbs++;
    putStatus = status;
}

static int setupDisk(void **state)
{
    setupWork(state);
    theIo.inner.append = fakeAppend;
    theIo.inner.snapshot_put = fakeSnapshotPut;
    theIo.inner.close = fakeCloseCancelling;
    io_wrap(&theIo, &loop);
    aio_reap_set_inline(false); /* a test that failed after a bounded close left it on */
    nInnerAppends = 0;
    innerPut = NULL;
    innerClosed = false;
    appendCbs = putCbs = 0;
    appendStatus = putStatus = -1;
    return 0;
}

static struct raft_entry oneEntry = {.term = 1, .type = RAFT_COMMAND};

/* The oldest append in flight: what a disk that stops answering shows (its appends never
 * end, so never reach the histogram). raft_uv ends them in order. */
static void test_oldest_append_in_flight(void **state)
{
    (void)state;
    assert_int_equal(io_oldest_append_us(&theIo), 0);
    struct raft_io_append a, b;
    uint64_t before = uv_hrtime() / 1000u;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    uint64_t first = io_oldest_append_us(&theIo);
    assert_true(first >= before && first <= uv_hrtime() / 1000u);
    usleep(2000);
    assert_int_equal(theIo.outer.append(&theIo.outer, &b, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(io_oldest_append_us(&theIo), first); /* still the first */
    completeAppend(0);
    assert_true(io_oldest_append_us(&theIo) >= first + 2000); /* now the second */
    completeAppend(0);
    assert_int_equal(io_oldest_append_us(&theIo), 0);
    closeIo();
}

/* A TimeoutNow from `from`. */
static void deliverTimeoutNow(raft_id from)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_TIMEOUT_NOW;
    m.timeout_now.term = 2;
    deliverFrom(&m, from);
}

/* libraft 0.15's follower takes a configuration entry as its configuration only when its
 * write ends, and only if it is still a follower then (io.h, the fifth flaw): while an
 * append holding one is in flight, a follower's TimeoutNow is held (the latest) and raft
 * gets no tick; both resume once it called back, and a TimeoutNow held longer than an
 * election timeout (the leader gave its transfer up) is dropped. Other appends hold
 * nothing, nor does a configuration a node appended as leader, after it stepped down too.
 * tests/sim's test_transfer_to_a_follower_storing_a_configuration shows the whole case on
 * raft. */
static void test_configuration_in_flight_holds_timeout_now_and_ticks(void **state)
{
    (void)state;
    struct raft r;
    memset(&r, 0, sizeof(r));
    r.state = RAFT_FOLLOWER;
    r.election_timeout = 1000;
    theIo.raft = &r;
    timeoutNowSeen = ticksSeen = 0;
    struct raft_entry change = {.term = 1, .type = RAFT_CHANGE};
    struct raft_entry both[2] = {oneEntry, change};
    struct raft_io_append a, b, c;
    /* A command's append holds nothing. */
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    innerTick(&theIo.inner);
    deliverTimeoutNow(1);
    assert_int_equal(ticksSeen, 1);
    assert_int_equal(timeoutNowSeen, 1);
    completeAppend(0);
    /* One with a configuration among its entries: held while in flight. */
    assert_int_equal(theIo.outer.append(&theIo.outer, &b, both, 2, raftAppendDone), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &c, &change, 1, raftAppendDone), 0);
    assert_int_equal(theIo.change_appends, 2);
    innerTick(&theIo.inner);
    deliverTimeoutNow(2);
    deliverTimeoutNow(3); /* the latest replaces it */
    innerTick(&theIo.inner);
    assert_int_equal(ticksSeen, 1);
    assert_int_equal(timeoutNowSeen, 1);
    assert_int_equal(theIo.ticks_held, 2);
    assert_int_equal(theIo.timeouts_held, 2);
    completeAppend(0); /* one still in flight */
    assert_int_equal(timeoutNowSeen, 1);
    innerTick(&theIo.inner);
    assert_int_equal(ticksSeen, 1);
    completeAppend(0); /* raft has it now: the TimeoutNow goes, with its own address */
    assert_int_equal(theIo.change_appends, 0);
    assert_int_equal(timeoutNowSeen, 2);
    assert_string_equal(timeoutNowAddr, "127.0.0.1:9003");
    assert_int_equal(appendCbs, 3);
    innerTick(&theIo.inner);
    assert_int_equal(ticksSeen, 2);
    /* A leader's own configuration append holds nothing, in flight after it stepped down
     * either. */
    r.state = RAFT_LEADER;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &change, 1, raftAppendDone), 0);
    innerTick(&theIo.inner);
    r.state = RAFT_FOLLOWER;
    innerTick(&theIo.inner);
    deliverTimeoutNow(1);
    assert_int_equal(ticksSeen, 4);
    assert_int_equal(timeoutNowSeen, 3);
    completeAppend(0);
    /* One held past an election timeout: the leader gave its transfer up, and raft does not
     * get it. */
    r.election_timeout = 20;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &change, 1, raftAppendDone), 0);
    deliverTimeoutNow(2);
    usleep(40 * 1000);
    uv_update_time(&loop);
    completeAppend(0);
    assert_int_equal(timeoutNowSeen, 3);
    assert_int_equal(theIo.timeouts_dropped, 1);
    assert_null(theIo.held_timeout_now_addr);
    /* One held when raft closes is freed (LeakSanitizer would report it otherwise), and
     * raft does not get it: the append ends after the close. */
    r.state = RAFT_FOLLOWER;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &change, 1, raftAppendDone), 0);
    deliverTimeoutNow(2);
    assert_non_null(theIo.held_timeout_now_addr);
    theIo.outer.close(&theIo.outer, raftClosed);
    completeAppend(0);
    assert_null(theIo.held_timeout_now_addr);
    assert_int_equal(timeoutNowSeen, 3);
    assert_int_equal(theIo.timeouts_dropped, 1);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
    theIo.raft = NULL;
}

/* Appends pass through while raft is open (a failed one stops the process:
 * test_failed_write_stops_the_node). */
static void test_append_is_forwarded(void **state)
{
    (void)state;
    struct raft_io_append req;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(nInnerAppends, 1);
    assert_int_equal(theIo.disk, 1);
    completeAppend(0);
    assert_int_equal(appendCbs, 1);
    assert_int_equal(appendStatus, 0);
    assert_int_equal(theIo.disk, 0);
    /* The append is timed, in the histogram, in the bucket its measured time belongs to
     * (which bucket that is depends on how busy the machine is: not asserted). */
    assert_int_equal(theIo.append_count, 1);
    uint64_t us = theIo.append_sum_us;
    for (int i = 0; i < IO_APPEND_BUCKETS; i++) {
        bool above = i == 0 || us > IO_APPEND_BOUND_US(i - 1);
        bool below = i == IO_APPEND_BUCKETS - 1 || us <= IO_APPEND_BOUND_US(i);
        assert_int_equal(theIo.append_buckets[i], above && below ? 1 : 0);
    }
    closeIo(); /* nothing in flight: at once */
}

/* An append that took at least 2 ms is counted above the 0.5 and 1 ms buckets. */
static void test_slow_append_is_counted_as_slow(void **state)
{
    (void)state;
    struct raft_io_append req;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    usleep(2500);
    completeAppend(0);
    assert_int_equal(theIo.append_count, 1);
    assert_true(theIo.append_sum_us >= 2500);
    assert_int_equal(theIo.append_buckets[0], 0);
    assert_int_equal(theIo.append_buckets[1], 0);
    uint64_t above = 0;
    for (int i = 2; i < IO_APPEND_BUCKETS; i++) {
        above += theIo.append_buckets[i];
    }
    assert_int_equal(above, 1);
    closeIo();
}

/* raft_close with two appends queued: raft_uv 0.15 would cancel both from inside its close
 * and libraft 0.15 would truncate its log twice (canonical/raft #338). The wrapper closes
 * raft_uv only after both were written, and raft gets their real status. */
static void test_close_waits_for_appends(void **state)
{
    (void)state;
    struct raft_io_append a, b;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &b, &oneEntry, 1, raftAppendDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 0);
    assert_true(theIo.close_deferred);
    assert_non_null(theIo.close_timer);
    completeAppend(0);
    assert_int_equal(appendCbs, 1);
    assert_int_equal(innerCloses, 0);
    completeAppend(0);
    assert_int_equal(appendCbs, 2);
    assert_int_equal(appendStatus, 0);
    /* raft_uv is closed on the loop's next turn, not from inside its write callback. */
    assert_int_equal(innerCloses, 0);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    assert_null(theIo.close_timer);
    assert_int_equal(theIo.late_failures, 0);
    assert_false(aio_reap_inline()); /* nothing in the kernel: destroys stay off the loop */
    /* No append after raft_uv's close: raft_uv 0.15 asserts it never gets one. */
    struct raft_io_append c;
    assert_int_equal(theIo.outer.append(&theIo.outer, &c, &oneEntry, 1, raftAppendDone),
                     RAFT_CANCELED);
    assert_int_equal(outerCloses, 0);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* A snapshot put holds the close back the same way; its status is passed as it is. */
static void test_close_waits_for_snapshot_put(void **state)
{
    (void)state;
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    memset(&snap, 0, sizeof(snap));
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    assert_int_equal(theIo.disk, 1);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 0);
    completePut(RAFT_IOERR);
    assert_int_equal(putCbs, 1);
    assert_int_equal(putStatus, RAFT_IOERR);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone),
                     RAFT_CANCELED);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* A disk that never answers does not hang the close: after close_wait_ms raft_uv is closed
 * anyway. The appends it then cancels reach raft as done (status 0), so that libraft 0.15
 * does not truncate its log once per canceled request; the wrapper counts them. */
static void test_close_wait_is_bounded(void **state)
{
    (void)state;
    theIo.close_wait_ms = 1;
    struct raft_io_append a, b;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &b, &oneEntry, 1, raftAppendDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 0);
    assert_false(aio_reap_inline());
    drainLoop(); /* the timer fires, the wrapper closes raft_uv, which cancels both */
    assert_int_equal(innerCloses, 1);
    /* Both writes are still in the kernel: raft_uv's io_destroy must wait for them before
     * their buffers are freed, so it runs on the loop again (aio_reap.h). */
    assert_true(aio_reap_inline());
    aio_reap_set_inline(false);
    assert_int_equal(appendCbs, 2);
    assert_int_equal(appendStatus, 0);
    assert_int_equal(theIo.late_failures, 2);
    assert_int_equal(theIo.disk, 0);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
}

/* The bound covers disk writes only: a snapshot serialisation still running on the pool is
 * waited for, without a bound (raft_uv would be freed under it). */
static void test_close_bound_still_waits_for_work(void **state)
{
    (void)state;
    theIo.close_wait_ms = 1;
    struct raft_io_append a;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    struct raft_io_async_work req = {.data = NULL, .work = raftWork, .cb = NULL};
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    drainLoop();
    assert_true(theIo.disk_wait_over);
    assert_int_equal(innerCloses, 0);
    innerWork->work(innerWork);
    completeWork(0);
    assert_int_equal(workStatus, RAFT_CANCELED);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    assert_int_equal(appendCbs, 1);
    assert_int_equal(appendStatus, 0);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* An append that completes after the works are done but while raft waits for it closes
 * raft_uv (both kinds of wait end in whichever order). */
static void test_close_waits_for_work_then_append(void **state)
{
    (void)state;
    struct raft_io_append a;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    struct raft_io_async_work req = {.data = NULL, .work = raftWork, .cb = NULL};
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    innerWork->work(innerWork);
    completeWork(0);
    assert_int_equal(innerCloses, 0);
    completeAppend(0);
    assert_int_equal(innerCloses, 0);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* ---- snapshot data through snapstore --------------------------------------------------- */

static char snapDir[64];

static int setupStore(void **state)
{
    setupDisk(state);
    strcpy(snapDir, "/tmp/idem-test-io-XXXXXX");
    assert_non_null(mkdtemp(snapDir));
    theIo.snap_dir = snapDir;
    theIo.snap_pause_us = 0;
    theIo.snap_delete_pause_us = 0;
    innerPutSnapshot = NULL;
    return 0;
}

static int teardownStore(void **state)
{
    (void)state;
    /* The directory and what snapstore made in it (idem-trash/ too). */
    return tmpdir_remove(snapDir);
}

static bool snapFileExists(uint64_t term, uint64_t index)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/idem-snapshot-%llu-%llu", snapDir, (unsigned long long)term,
             (unsigned long long)index);
    return access(path, F_OK) == 0;
}

/* Runs the loop until cond holds (the pool thread's work and its callback ran). */
#define RUN_UNTIL(cond)                                                                            \
    do {                                                                                           \
        for (int i_ = 0; i_ < 100000 && !(cond); i_++) {                                           \
            uv_run(&loop, UV_RUN_ONCE);                                                            \
        }                                                                                          \
        assert_true(cond);                                                                         \
    } while (0)

static uint8_t bigData[300 * 1024];

static void fillSnapshot(struct raft_snapshot *snap, struct raft_buffer bufs[2], uint64_t index)
{
    for (size_t i = 0; i < sizeof(bigData); i++) {
        bigData[i] = (uint8_t)(i * 31 + index);
    }
    memset(snap, 0, sizeof(*snap));
    snap->term = 2;
    snap->index = index;
    bufs[0].base = bigData;
    bufs[0].len = 1000;
    bufs[1].base = bigData + 1000;
    bufs[1].len = sizeof(bigData) - 1000;
    snap->bufs = bufs;
    snap->n_bufs = 2;
}

/* Puts a snapshot at index and lets it through to the end: raft_uv stores the reference,
 * the files of older snapshots but the one before go. */
static void putThrough(uint64_t index)
{
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, index);
    int before = putCbs;
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    assert_null(innerPut); /* the data is written first, on the pool */
    assert_int_equal(theIo.works, 1);
    assert_int_equal(theIo.disk, 1);
    RUN_UNTIL(innerPut != NULL);
    /* raft_uv gets the same snapshot with a reference for its data. */
    assert_non_null(innerPutSnapshot);
    assert_int_equal(innerPutSnapshot->index, index);
    assert_int_equal(innerPutSnapshot->term, 2);
    assert_int_equal(innerPutSnapshot->n_bufs, 1);
    struct snapstore_ref r;
    assert_true(
        snapstore_ref_decode(innerPutSnapshot->bufs[0].base, innerPutSnapshot->bufs[0].len, &r));
    assert_int_equal(r.index, index);
    assert_int_equal(r.size, sizeof(bigData));
    void *data = NULL;
    char err[256];
    assert_int_equal(snapstore_read(snapDir, &r, &data, err, sizeof(err)), 0);
    assert_memory_equal(data, bigData, sizeof(bigData));
    raft_free(data);
    assert_int_equal(putCbs, before); /* raft hears of it once raft_uv is done */
    completePut(0);
    assert_int_equal(putCbs, before + 1);
    assert_int_equal(putStatus, 0);
    assert_int_equal(theIo.snap_last, index);
    assert_int_equal(theIo.disk, 0);
    RUN_UNTIL(theIo.works == 0); /* the clean-up of old files */
}

static void test_snapshot_put_stores_a_reference(void **state)
{
    (void)state;
    putThrough(100);
    putThrough(200);
    assert_true(snapFileExists(2, 100));
    putThrough(300);
    assert_false(snapFileExists(2, 100)); /* raft_uv keeps two snapshots: so do we */
    assert_true(snapFileExists(2, 200));
    assert_true(snapFileExists(2, 300));
    assert_int_equal(theIo.snap_last, 300); /* putThrough checked each reference raft_uv got */
    closeIo();
}

/* A failed write reaches raft as an I/O error and raft_uv never sees a reference. */
static void test_snapshot_put_write_failure(void **state)
{
    (void)state;
    theIo.snap_dir = "/nonexistent/idem-test-io";
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 100);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    RUN_UNTIL(putCbs == 1);
    assert_int_equal(putStatus, RAFT_IOERR);
    assert_null(innerPutSnapshot);
    assert_int_equal(theIo.disk, 0);
    assert_int_equal(theIo.works, 0);
    assert_int_equal(theIo.snap_last, 0);
    closeIo();
}

/* Forks with the child's stderr into a pipe (*fd, the parent's end): 0 in the child. */
static pid_t forkCapturing(int *fd)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], STDERR_FILENO);
        close(p[1]);
        return 0;
    }
    close(p[1]);
    *fd = p[0];
    return pid;
}

/* The child stopped the way the wrapper stops a node (abort) and said `msg` first (so that
 * no other abort, an assert's say, passes for it). */
static void expectStopped(pid_t pid, int fd, const char *msg)
{
    char out[4096];
    size_t len = 0;
    ssize_t k;
    while ((k = read(fd, out + len, sizeof(out) - 1 - len)) > 0) {
        len += (size_t)k;
    }
    close(fd);
    out[len] = '\0';
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    if (strstr(out, msg) == NULL) {
        fail_msg("the child said %s, not %s", out, msg);
    }
}

/* A put of a snapshot sent by the leader that fails, in the data's write (the first child)
 * or in raft_uv's put (the second), stops the process: libraft 0.15 has dropped its log for
 * the snapshot's by then and would take the next entries on top of nothing. A put of the
 * node's own snapshot that fails reaches raft. libraft submits both with its one request,
 * r.snapshot.put, whose data tells them apart (raft itself for its own). */
static void installFails(struct raft *r, bool inData)
{
    int fd;
    pid_t pid = forkCapturing(&fd);
    if (pid == 0) {
        if (inData) {
            theIo.snap_dir = "/nonexistent/idem-test-io";
        }
        static int installRequest; /* libraft's request of an install, not raft */
        struct raft_io_snapshot_put *put = &r->snapshot.put;
        put->data = &installRequest;
        struct raft_snapshot snap;
        struct raft_buffer bufs[2];
        fillSnapshot(&snap, bufs, 100);
        theIo.outer.snapshot_put(&theIo.outer, 0, put, &snap, raftPutDone);
        for (int i = 0; i < 100000 && putCbs == 0 && innerPut == NULL; i++) {
            uv_run(&loop, UV_RUN_ONCE);
        }
        if (innerPut != NULL) {
            completePut(RAFT_IOERR);
        }
        _exit(putCbs == 1 ? 1 : 2); /* not reached when the wrapper stops the process */
    }
    expectStopped(pid, fd, "storing the leader's snapshot failed on this node");
}

static void test_failed_install_stops_the_node(void **state)
{
    (void)state;
    struct raft r;
    memset(&r, 0, sizeof(r));
    r.state = RAFT_FOLLOWER;
    theIo.raft = &r;
    installFails(&r, true);
    installFails(&r, false);
    theIo.snap_dir = "/nonexistent/idem-test-io";
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 100);
    r.snapshot.put.data = &r; /* the node's own snapshot (trailing 0 too, as configured) */
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 0, &r.snapshot.put, &snap, raftPutDone),
                     0);
    RUN_UNTIL(putCbs == 1);
    assert_int_equal(putStatus, RAFT_IOERR);
    theIo.raft = NULL;
    closeIo();
}

/* raft_close while the data is being written: the close waits for the pool thread, raft
 * hears the put was canceled, raft_uv never gets the reference. The write stops at its
 * next chunk instead of finishing a file nobody will use: with a 500 ms pause after each
 * of its three chunks it would still be writing for a second, and no file is left. */
static void test_close_during_snapshot_write(void **state)
{
    (void)state;
    theIo.snap_pause_us = 500000;
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 100);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 0);
    RUN_UNTIL(putCbs == 1);
    assert_int_equal(putStatus, RAFT_CANCELED);
    assert_null(innerPutSnapshot);
    assert_false(snapFileExists(2, 100));
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s/idem-snapshot-2-100.tmp", snapDir);
    assert_int_equal(access(tmp, F_OK), -1);
    RUN_UNTIL(innerCloses == 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* What the fake raft_uv's load returns: a snapshot whose single buffer is `ref` (or plain
 * data), and one entry. */
static const struct raft_buffer *loadBuf;
static uint64_t loadIndex;

static int fakeLoad(struct raft_io *io, raft_term *term, raft_id *voted_for,
                    struct raft_snapshot **snapshot, raft_index *start_index,
                    struct raft_entry *entries[], size_t *n_entries)
{
    (void)io;
    *term = 3;
    *voted_for = 1;
    struct raft_snapshot *s = raft_calloc(1, sizeof(*s));
    s->term = 2;
    s->index = loadIndex;
    raft_configuration_init(&s->configuration);
    assert_int_equal(raft_configuration_add(&s->configuration, 1, "127.0.0.1:1", RAFT_VOTER), 0);
    s->bufs = raft_malloc(sizeof(*s->bufs));
    s->bufs[0].base = raft_malloc(loadBuf->len);
    memcpy(s->bufs[0].base, loadBuf->base, loadBuf->len);
    s->bufs[0].len = loadBuf->len;
    s->n_bufs = 1;
    *snapshot = s;
    *start_index = loadIndex + 1;
    *entries = raft_calloc(1, sizeof(**entries));
    (*entries)[0].term = 3;
    (*entries)[0].type = RAFT_COMMAND;
    (*entries)[0].batch = raft_malloc(16);
    (*entries)[0].buf.base = (*entries)[0].batch;
    (*entries)[0].buf.len = 16;
    *n_entries = 1;
    return 0;
}

static void freeSnapshot(struct raft_snapshot *s)
{
    raft_configuration_close(&s->configuration);
    io_snap_data_free(&theIo, s->bufs[0].base); /* as the cluster's restore does */
    raft_free(s->bufs);
    raft_free(s);
}

static void freeLoaded(struct raft_snapshot *s, struct raft_entry *entries)
{
    freeSnapshot(s);
    raft_free(entries[0].batch);
    raft_free(entries);
}

/* Writes the file for a snapshot at index 100 and sets the fake's load to refer to it. */
static int fakeSnapshotGet(struct raft_io *io, struct raft_io_snapshot_get *req,
                           raft_io_snapshot_get_cb cb);

/* Writes the file for a snapshot at index 100 and sets the fake's load (and get) to refer
 * to it. */
static void storeForLoad(void)
{
    static uint8_t ref[SNAPSTORE_REF_SIZE];
    static struct raft_buffer refBuf = {.base = ref, .len = sizeof(ref)};
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 100);
    struct snapstore_ref r;
    char err[256];
    assert_int_equal(snapstore_write(snapDir, 2, 100, bufs, 2, 0, NULL, &r, err, sizeof(err)), 0);
    snapstore_ref_encode(&r, ref);
    loadBuf = &refBuf;
    loadIndex = 100;
    theIo.inner.load = fakeLoad;
    theIo.inner.snapshot_get = fakeSnapshotGet;
}

static void flipByte(uint64_t index, long offset)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/idem-snapshot-2-%llu", snapDir, (unsigned long long)index);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void test_load_puts_the_data_back(void **state)
{
    (void)state;
    storeForLoad();
    raft_term term;
    raft_id vote;
    struct raft_snapshot *s = NULL;
    raft_index start;
    struct raft_entry *entries = NULL;
    size_t n = 0;
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n), 0);
    assert_non_null(s);
    assert_int_equal(s->n_bufs, 1);
    assert_int_equal(s->bufs[0].len, sizeof(bigData));
    assert_memory_equal(s->bufs[0].base, bigData, sizeof(bigData));
    assert_int_equal(n, 1);
    assert_int_equal(theIo.snap_last, 100);
    /* Mapped, not copied (snapstore_map), until the restore releases it. */
    assert_ptr_equal(theIo.snap_map, s->bufs[0].base);
    assert_int_equal(theIo.snap_map_len, sizeof(bigData));
    freeLoaded(s, entries);
    assert_null(theIo.snap_map);

    /* A restore that failed: the mapping goes (raft then frees a NULL base); a buffer that
     * is not the mapped one is left to raft. */
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n), 0);
    void *mapped = s->bufs[0].base;
    static uint8_t other[8];
    assert_false(io_snap_data_unmap(&theIo, other));
    assert_false(io_snap_data_unmap(&theIo, NULL));
    assert_true(io_snap_data_unmap(&theIo, mapped));
    assert_null(theIo.snap_map);
    assert_false(io_snap_data_unmap(&theIo, mapped)); /* once */
    s->bufs[0].base = NULL;
    freeLoaded(s, entries);

    /* A snapshot raft_uv holds itself (stored before snapstore) passes as it is. */
    static const char plain[] = "plain snapshot data";
    struct raft_buffer plainBuf = {.base = (void *)plain, .len = sizeof(plain)};
    loadBuf = &plainBuf;
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n), 0);
    assert_int_equal(s->bufs[0].len, sizeof(plain));
    assert_memory_equal(s->bufs[0].base, plain, sizeof(plain));
    freeLoaded(s, entries);
    closeIo();
}

/* A damaged or missing data file makes the load fail with a message that names it: the
 * node does not start on a state it cannot vouch for. Nothing leaks (ASan). */
static void test_load_refuses_a_damaged_file(void **state)
{
    (void)state;
    storeForLoad();
    flipByte(100, 150 * 1024);
    raft_term term;
    raft_id vote;
    struct raft_snapshot *s = NULL;
    raft_index start;
    struct raft_entry *entries = NULL;
    size_t n = 0;
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n),
                     RAFT_CORRUPT);
    assert_null(s);
    assert_null(entries);
    assert_int_equal(n, 0);
    assert_non_null(strstr(theIo.outer.errmsg, "idem-snapshot-2-100"));
    assert_non_null(strstr(theIo.outer.errmsg, "hash"));

    /* A reference for another snapshot than the one raft_uv loaded. */
    flipByte(100, 150 * 1024); /* repaired */
    loadIndex = 101;
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n),
                     RAFT_CORRUPT);
    assert_non_null(strstr(theIo.outer.errmsg, "refers to"));

    /* The file is gone. */
    loadIndex = 100;
    char path[128];
    snprintf(path, sizeof(path), "%s/idem-snapshot-2-100", snapDir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(theIo.outer.load(&theIo.outer, &term, &vote, &s, &start, &entries, &n),
                     RAFT_CORRUPT);
    assert_non_null(strstr(theIo.outer.errmsg, "idem-snapshot-2-100"));
    closeIo();
}

/* snapshot_get (a follower to catch up): raft_uv reads the reference, the wrapper the data,
 * on the pool. */
static struct raft_io_snapshot_get *innerGet;
static raft_io_snapshot_get_cb innerGetCb;
static int getCbs, getStatus;
static struct raft_snapshot *gotSnapshot;

static int fakeSnapshotGet(struct raft_io *io, struct raft_io_snapshot_get *req,
                           raft_io_snapshot_get_cb cb)
{
    (void)io;
    innerGet = req;
    innerGetCb = cb;
    return 0;
}

static void raftGetDone(struct raft_io_snapshot_get *req, struct raft_snapshot *snapshot,
                        int status)
{
    (void)req;
    getCbs++;
    getStatus = status;
    gotSnapshot = snapshot;
}

/* The fake raft_uv answers the get with what its load would return. */
static void answerGet(void)
{
    raft_term term;
    raft_id vote;
    struct raft_snapshot *s = NULL;
    raft_index start;
    struct raft_entry *entries = NULL;
    size_t n = 0;
    fakeLoad(&theIo.inner, &term, &vote, &s, &start, &entries, &n);
    raft_free(entries[0].batch);
    raft_free(entries);
    innerGetCb(innerGet, s, 0);
}

static void test_snapshot_get_puts_the_data_back(void **state)
{
    (void)state;
    storeForLoad();
    getCbs = 0;
    struct raft_io_snapshot_get get;
    assert_int_equal(theIo.outer.snapshot_get(&theIo.outer, &get, raftGetDone), 0);
    answerGet();
    assert_int_equal(getCbs, 0); /* the data is read on the pool */
    assert_int_equal(theIo.works, 1);
    RUN_UNTIL(getCbs == 1);
    assert_int_equal(getStatus, 0);
    assert_non_null(gotSnapshot);
    assert_int_equal(gotSnapshot->bufs[0].len, sizeof(bigData));
    assert_memory_equal(gotSnapshot->bufs[0].base, bigData, sizeof(bigData));
    freeSnapshot(gotSnapshot);

    /* Damaged: raft gets an I/O error and no snapshot (the wrapper frees raft_uv's). */
    flipByte(100, 7);
    assert_int_equal(theIo.outer.snapshot_get(&theIo.outer, &get, raftGetDone), 0);
    answerGet();
    RUN_UNTIL(getCbs == 2);
    assert_int_equal(getStatus, RAFT_IOERR);
    assert_null(gotSnapshot);
    assert_int_equal(theIo.works, 0);
    closeIo();
}

/* raft_close while raft_uv reads a snapshot for a follower: raft_uv 0.15 fires its close
 * callback right after the get's callback, so the wrapper must not close it before the get
 * (and the data read behind it) has reached raft: raft hears of the get before its close. */
static int closedAfterGets = -1;

static void raftClosedCountingGets(struct raft_io *io)
{
    raftClosed(io);
    closedAfterGets = getCbs;
}

static void test_close_waits_for_snapshot_get(void **state)
{
    (void)state;
    storeForLoad();
    getCbs = 0;
    struct raft_io_snapshot_get get;
    assert_int_equal(theIo.outer.snapshot_get(&theIo.outer, &get, raftGetDone), 0);
    assert_int_equal(theIo.works, 1);
    theIo.outer.close(&theIo.outer, raftClosedCountingGets);
    assert_int_equal(innerCloses, 0); /* held back by the get */
    answerGet();
    RUN_UNTIL(getCbs == 1);
    assert_int_equal(getStatus, 0);
    assert_int_equal(theIo.works, 0);
    freeSnapshot(gotSnapshot);
    RUN_UNTIL(innerCloses == 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    assert_int_equal(closedAfterGets, 1);
    drainLoop();
}

/* The log segments raft_uv deletes once the snapshot is stored are linked into the trash
 * before its put and freed by the clean-up after it; a failed put empties the trash too. */
static void test_segments_raft_uv_deletes_go_through_the_trash(void **state)
{
    (void)state;
    char seg[128], link[160];
    snprintf(seg, sizeof(seg), "%s/0000000000000001-0000000000000050", snapDir);
    snprintf(link, sizeof(link), "%s/%s/0000000000000001-0000000000000050", snapDir,
             SNAPSTORE_TRASH);
    FILE *f = fopen(seg, "wb");
    assert_non_null(f);
    fputs("entries", f);
    fclose(f);
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 100);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    RUN_UNTIL(innerPut != NULL);
    assert_int_equal(access(link, F_OK), 0); /* linked before raft_uv got the put */
    assert_int_equal(unlink(seg), 0);        /* raft_uv deletes the segment */
    completePut(0);
    RUN_UNTIL(theIo.works == 0);
    assert_int_not_equal(access(link, F_OK), 0);

    /* A put that fails: the segment raft_uv kept keeps its data, the link goes. */
    f = fopen(seg, "wb");
    assert_non_null(f);
    fputs("entries", f);
    fclose(f);
    fillSnapshot(&snap, bufs, 200);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 10, &put, &snap, raftPutDone), 0);
    RUN_UNTIL(innerPut != NULL);
    assert_int_equal(access(link, F_OK), 0);
    completePut(RAFT_IOERR);
    assert_int_equal(putStatus, RAFT_IOERR);
    RUN_UNTIL(theIo.works == 0);
    assert_int_not_equal(access(link, F_OK), 0);
    struct stat sb;
    assert_int_equal(stat(seg, &sb), 0);
    assert_int_equal(sb.st_size, 7);
    assert_int_equal(theIo.snap_last, 100);
    closeIo();
}

/* ---- the leader's side: no commit by counting replicas before an entry of its term ---- */

static struct raft_message lastRecv; /* what the fake raft received */
static int recvs;

static void raftRecvRecording(struct raft_io *io, struct raft_message *msg)
{
    (void)io;
    lastRecv = *msg;
    recvs++;
}

/* A result from follower 2 as the leader's raft receives it. */
static struct raft_append_entries_result resultSeen(raft_index last, raft_index rejected)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_APPEND_ENTRIES_RESULT;
    m.server_id = 2;
    m.append_entries_result.term = 4;
    m.append_entries_result.rejected = rejected;
    m.append_entries_result.last_log_index = last;
    int before = recvs;
    innerRecv(&theIo.inner, &m);
    assert_int_equal(recvs, before + 1);
    assert_int_equal(lastRecv.type, RAFT_IO_APPEND_ENTRIES_RESULT);
    return lastRecv.append_entries_result;
}

static struct raft_entry fakeLog[16];

/* A leader's raft as the wrapper reads it: entries 1..n in its in-memory log, with
 * terms[i] for entry i + 1, from a circular buffer that starts at slot `front`. */
static void fakeLeader(struct raft *r, const raft_term *terms, size_t n, size_t front)
{
    memset(r, 0, sizeof(*r));
    memset(fakeLog, 0, sizeof(fakeLog));
    size_t size = sizeof(fakeLog) / sizeof(fakeLog[0]);
    for (size_t i = 0; i < n; i++) {
        fakeLog[(front + i) % size].term = terms[i];
    }
    r->log.entries = fakeLog;
    r->log.size = size;
    r->log.front = front;
    r->log.back = (front + n) % size;
    r->log.offset = 0;
    r->current_term = 4;
    r->last_stored = n;
}

/* libraft 0.15 commits a leader's last stored entry once a majority holds it, whatever its
 * term (Figure 8 of the paper). While that entry is not of the current term, a success
 * answer is lowered to one below it (not below the commit index); rejections, and answers
 * once an entry of the term is stored, pass as they are. */
static void test_results_cannot_commit_older_terms(void **state)
{
    (void)state;
    assert_int_equal(theIo.outer.start(&theIo.outer, 100, raftTick, raftRecvRecording), 0);
    recvs = 0;
    struct raft r;
    const raft_term terms[] = {1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 4};
    fakeLeader(&r, terms, 10, 12); /* entries 1-10 stored, the last of term 3; wrapped */
    r.commit_index = 5;

    /* No raft known (before raft_init): as it is. */
    assert_int_equal(resultSeen(10, 0).last_log_index, 10);
    theIo.raft = &r;
    assert_int_equal(resultSeen(10, 0).last_log_index, 9);
    assert_int_equal(theIo.results_held, 1);
    assert_int_equal(resultSeen(7, 0).last_log_index, 7);      /* below the cap */
    struct raft_append_entries_result res = resultSeen(10, 8); /* a rejection */
    assert_int_equal(res.rejected, 8);
    assert_int_equal(res.last_log_index, 10);
    /* Never below the commit index (a follower that installed a snapshot up to it). */
    r.commit_index = 10;
    assert_int_equal(resultSeen(10, 0).last_log_index, 10);
    r.commit_index = 5;

    /* Entry 11, of term 4, appended but not yet stored: still held. */
    fakeLeader(&r, terms, 11, 12);
    r.last_stored = 10;
    r.commit_index = 5;
    assert_int_equal(resultSeen(11, 0).last_log_index, 9);
    /* Stored: answers count. */
    r.last_stored = 11;
    assert_int_equal(resultSeen(11, 0).last_log_index, 11);
    assert_int_equal(theIo.results_held, 2);

    /* Everything stored is in a snapshot of term 3 (the in-memory log is empty). */
    memset(&r.log, 0, sizeof(r.log));
    r.log.entries = fakeLog;
    r.log.size = 16;
    r.log.offset = 20;
    r.log.snapshot.last_index = 20;
    r.log.snapshot.last_term = 3;
    r.last_stored = 20;
    r.commit_index = 20;
    assert_int_equal(resultSeen(20, 0).last_log_index, 20); /* all committed: nothing held */
    assert_int_equal(theIo.results_held, 2);
    theIo.raft = NULL;
    closeIo();
}

/* A follower that lost its data acknowledges the snapshot the leader sent it, below the
 * match index it had reported before: the wrapper lowers that match index to one below the
 * snapshot, so that libraft 0.15 takes the acknowledgement (it ignored it, and left the
 * follower in snapshot mode for its 30 s install-snapshot timeout). Nothing else moves it. */
static void test_snapshot_ack_below_an_old_match(void **state)
{
    (void)state;
    assert_int_equal(theIo.outer.start(&theIo.outer, 100, raftTick, raftRecvRecording), 0);
    recvs = 0;
    struct raft r;
    const raft_term terms[] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    fakeLeader(&r, terms, 10, 0); /* entries of the current term: the hold does not act */
    r.state = RAFT_LEADER;
    r.commit_index = 10;
    struct raft_server servers[3] = {{.id = 1}, {.id = 2}, {.id = 3}};
    r.configuration.servers = servers;
    r.configuration.n = 3;
    struct raft_progress progress[3];
    memset(progress, 0, sizeof(progress));
    r.leader_state.progress = progress;
    struct raft_progress *p = &progress[1]; /* server 2, whose results resultSeen() sends */
    const struct raft_progress snapshotMode = {
        .state = 2, .next_index = 7, .match_index = 9, .snapshot_index = 6};
    theIo.raft = &r;

    *p = snapshotMode;
    assert_int_equal(resultSeen(6, 0).last_log_index, 6); /* the answer itself is unchanged */
    assert_int_equal(p->match_index, 5);
    assert_int_equal(theIo.rematched, 1);
    /* Now below the snapshot: raft takes it as news (its own update is not modelled here). */
    resultSeen(6, 0);
    assert_int_equal(p->match_index, 5);
    assert_int_equal(theIo.rematched, 1);

    /* What it leaves alone: another state, another index than the snapshot's, a match at or
     * below the snapshot, a rejection, another term, another role. */
    struct {
        const char *what;
        unsigned short st;
        raft_index last, match, rejected;
        raft_term term;
        unsigned short role;
    } keep[] = {
        {"probe", 0, 6, 9, 0, 4, RAFT_LEADER},
        {"pipeline", 1, 6, 9, 0, 4, RAFT_LEADER},
        {"not the snapshot's index", 2, 7, 9, 0, 4, RAFT_LEADER},
        {"match below the snapshot", 2, 6, 5, 0, 4, RAFT_LEADER},
        {"rejection", 2, 6, 9, 6, 4, RAFT_LEADER},
        {"a result of an older term", 2, 6, 9, 0, 5, RAFT_LEADER},
        {"not leader", 2, 6, 9, 0, 4, RAFT_FOLLOWER},
    };
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        *p = snapshotMode;
        p->state = keep[i].st;
        p->match_index = keep[i].match;
        r.current_term = keep[i].term;
        r.state = keep[i].role;
        resultSeen(keep[i].last, keep[i].rejected);
        if (p->match_index != keep[i].match) {
            fail_msg("%s: match index moved to %llu", keep[i].what,
                     (unsigned long long)p->match_index);
        }
    }
    assert_int_equal(theIo.rematched, 1);
    /* At the snapshot exactly, it is lowered too (raft would see nothing new either). */
    *p = snapshotMode;
    p->match_index = 6;
    r.current_term = 4;
    r.state = RAFT_LEADER;
    resultSeen(6, 0);
    assert_int_equal(p->match_index, 5);
    assert_int_equal(theIo.rematched, 2);
    theIo.raft = NULL;
    closeIo();
}

/* An answer raft 0.15 sends to follower_state.current_leader from a node that is no longer
 * a follower (the union's bytes are then a candidate's flags or a leader's promotee ID), or
 * from a follower that knows no leader (NULL), is not handed to raft_uv, whose strlen of the
 * address crashed; an answer addressed from the message it answers goes as before. */
static void test_unaddressed_answers_are_not_sent(void **state)
{
    (void)state;
    struct raft r;
    memset(&r, 0, sizeof(r));
    theIo.raft = &r;
    char leader[] = "127.0.0.1:9001", from_msg[] = "127.0.0.1:9003";
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_APPEND_ENTRIES_RESULT;
    m.server_id = 1;
    struct raft_io_send req;
    sends = 0;

    r.state = RAFT_FOLLOWER; /* a follower answering its leader: sent */
    r.follower_state.current_leader.address = leader;
    m.server_address = r.follower_state.current_leader.address;
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), 0);
    assert_int_equal(sends, 1);

    r.follower_state.current_leader.address = NULL; /* a follower that knows no leader */
    m.server_address = r.follower_state.current_leader.address;
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), RAFT_NOCONNECTION);

    memset(&r, 0, sizeof(r)); /* a candidate in its pre-vote: the field reads 0x100 */
    r.state = RAFT_CANDIDATE;
    r.candidate_state.in_pre_vote = true;
    m.server_address = r.follower_state.current_leader.address;
    assert_non_null(m.server_address);
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), RAFT_NOCONNECTION);

    memset(&r, 0, sizeof(r)); /* a leader promoting node 2: the field reads 2 */
    r.state = RAFT_LEADER;
    r.leader_state.promotee_id = 2;
    m.server_address = r.follower_state.current_leader.address;
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), RAFT_NOCONNECTION);
    assert_int_equal(sends, 1);
    assert_int_equal(theIo.unaddressed, 3);

    /* The leader refusing a stale leader's AppendEntries, to that message's address: sent.
     * Other messages are not looked at. */
    m.server_address = from_msg;
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), 0);
    m.type = RAFT_IO_REQUEST_VOTE;
    m.server_address = NULL;
    assert_int_equal(theIo.outer.send(&theIo.outer, &req, &m, NULL), 0);
    assert_int_equal(sends, 3);
    assert_int_equal(theIo.unaddressed, 3);
    theIo.raft = NULL;
}

/* After a failed log write neither libraft 0.15's leader (it reuses the failed entries'
 * indexes in the same term) nor its follower with raft_uv (it writes the next entries where
 * the failed ones should be, so at the wrong indexes) can go on safely: the wrapper stops
 * the process, whatever the node's role, and the failed write never reaches raft. */
static void failedWriteStops(unsigned short role)
{
    struct raft r;
    memset(&r, 0, sizeof(r));
    r.state = role;
    theIo.raft = &r;
    int fd;
    pid_t pid = forkCapturing(&fd);
    if (pid == 0) {
        struct raft_io_append req;
        appendStatus = -1;
        theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone);
        completeAppend(RAFT_IOERR);
        _exit(appendStatus == -1 ? 0 : 1); /* not reached when the wrapper stops the process */
    }
    expectStopped(pid, fd, "raft log write failed on this node");
    theIo.raft = NULL;
}

static void test_failed_write_stops_the_node(void **state)
{
    (void)state;
    failedWriteStops(RAFT_LEADER);
    failedWriteStops(RAFT_FOLLOWER);
    failedWriteStops(RAFT_CANDIDATE);
    /* The same write, succeeding, reaches raft (so the child above did reach the write). */
    struct raft r;
    memset(&r, 0, sizeof(r));
    r.state = RAFT_FOLLOWER;
    theIo.raft = &r;
    struct raft_io_append req;
    appendStatus = -1;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    completeAppend(0);
    assert_int_equal(appendStatus, 0);
    theIo.raft = NULL;
    closeIo();
}

/* raft_uv stores an entry at the index its place on disk gives it: an append that raft
 * asks at another index than the disk's next stops the process before anything is
 * written (after a snapshot without trailing entries, raft_uv's next is the snapshot's
 * index + 1; libraft 0.15 still appended after its last stored entry). */
static char bufA, bufB, bufC;

static int truncCalls;
static raft_index truncIndex;
static int appendsAtTrunc; /* appends raft_uv had been handed when the truncation came */

static int fakeTruncate(struct raft_io *io, raft_index index)
{
    (void)io;
    assert_false(inInnerCb); /* never from inside one of raft_uv's callbacks */
    truncCalls++;
    truncIndex = index;
    appendsAtTrunc = nInnerAppends;
    return 0;
}

static void appendAt(struct raft *r, uint64_t diskNext)
{
    theIo.disk_next = diskNext;
    struct raft_io_append req;
    /* raft's log holds 5, 6, 7 (the last two just added): it asks for 6-7. */
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &r->log.entries[1], 2, raftAppendDone),
                     0);
    completeAppend(0);
}

static void test_append_at_the_wrong_index_stops_the_node(void **state)
{
    (void)state;
    struct raft r;
    const raft_term terms[] = {2, 2, 3};
    fakeLeader(&r, terms, 3, 0);
    r.log.offset = 4; /* entries 5, 6, 7 */
    fakeLog[0].buf.base = &bufA;
    fakeLog[1].buf.base = &bufB;
    fakeLog[2].buf.base = &bufC;
    theIo.raft = &r;
    appendAt(&r, 6);
    assert_int_equal(appendStatus, 0);
    assert_int_equal(theIo.disk_next, 8);
    appendAt(&r, 0); /* not known (an empty log at start): taken from raft */
    assert_int_equal(theIo.disk_next, 8);
    /* Entries that are not raft's tail: not checked, and the next index is not known. */
    struct raft_io_append req;
    struct raft_entry other = {.term = 2, .buf = {.base = &bufC}};
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &other, 1, raftAppendDone), 0);
    completeAppend(0);
    assert_int_equal(theIo.disk_next, 0);
    /* A truncation moves the disk's next back. */
    theIo.inner.truncate = fakeTruncate;
    theIo.disk_next = 8;
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 6), 0);
    assert_int_equal(theIo.disk_next, 6);

    int fd;
    pid_t pid = forkCapturing(&fd);
    if (pid == 0) {
        appendStatus = -1;
        appendAt(&r, 8);                   /* raft's 6-7 where the disk's next is 8 */
        _exit(appendStatus == -1 ? 2 : 1); /* not reached when the wrapper stops the process */
    }
    expectStopped(pid, fd,
                  "raft asked to append entries 6-7 while this node's log on disk ends at 7");
    theIo.raft = NULL;
    closeIo();
}

/* ---- truncations: marked, then checked when the first append after one ends --------- */

static bool markThere(uint64_t index)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/" LOGDIR_MARK_PREFIX "%020llu", snapDir,
             (unsigned long long)index);
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void closedIn(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", snapDir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("segment", f);
    fclose(f);
}

static int refusedTruncate(struct raft_io *io, raft_index index)
{
    (void)io;
    (void)index;
    return RAFT_NOMEM;
}

/* A truncation raft_uv did: its mark goes when the next append ends, before raft hears of
 * it; a second one before any append takes the first one's place. */
static void test_truncation_is_marked_and_checked(void **state)
{
    (void)state;
    theIo.log_dir = snapDir;
    theIo.inner.truncate = fakeTruncate;
    closedIn("0000000000000001-0000000000000005");
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 9), 0);
    assert_true(markThere(9));
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 6), 0);
    assert_false(markThere(9));
    assert_true(markThere(6));
    struct raft_io_append req;
    appendStatus = -1;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    assert_true(markThere(6)); /* not before it ended */
    completeAppend(0);
    assert_false(markThere(6));
    assert_int_equal(appendStatus, 0);
    /* Later appends carry nothing. */
    appendCbs = 0;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    completeAppend(0);
    assert_int_equal(appendCbs, 1);
    closeIo();
}

/* One raft_uv did not do (a closed segment still holds entries from the index on): the node
 * stops before raft hears that the append ended, its mark left for the next start. One
 * raft_uv refused at once: the node stops too. */
static void test_truncation_not_done_stops_the_node(void **state)
{
    (void)state;
    theIo.log_dir = snapDir;
    theIo.inner.truncate = fakeTruncate;
    closedIn("0000000000000002-0000000000000009");
    int fd;
    pid_t pid = forkCapturing(&fd);
    if (pid == 0) {
        struct raft_io_append req;
        appendCbs = 0;
        if (theIo.outer.truncate(&theIo.outer, 6) != 0 ||
            theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone) != 0) {
            _exit(1);
        }
        completeAppend(0);
        _exit(appendCbs == 0 ? 2 : 3); /* not reached when the wrapper stops the process */
    }
    expectStopped(pid, fd,
                  "the log truncation from index 6 was not done (a closed segment still ends "
                  "at 9");
    assert_true(markThere(6));

    theIo.inner.truncate = refusedTruncate;
    pid = forkCapturing(&fd);
    if (pid == 0) {
        theIo.outer.truncate(&theIo.outer, 7);
        _exit(1);
    }
    expectStopped(pid, fd, "raft_uv refused the log truncation from index 7");
    closeIo();
}

/* libraft 0.15's raft_uv never runs a truncation asked while it holds a snapshot put
 * (canonical/raft #372; test_raft_uv shows it on raft_uv itself): the wrapper holds it, and
 * the appends after it, and hands them over in raft's order once the put has called back,
 * from the loop's next turn. Appends asked before the truncation go at once. */
static void test_truncation_waits_for_a_snapshot_put(void **state)
{
    (void)state;
    theIo.inner.truncate = fakeTruncate;
    truncCalls = 0;
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 6);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 2, &put, &snap, raftPutDone), 0);
    assert_non_null(innerPut);
    struct raft_io_append a1, a2, a3;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a1, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(nInnerAppends, 1);
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 8), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &a2, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &a3, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(truncCalls, 0);
    assert_int_equal(nInnerAppends, 1);
    assert_int_equal(theIo.truncs_held, 1);
    completePut(0);
    assert_int_equal(putCbs, 1);
    assert_int_equal(truncCalls, 0); /* not from inside raft_uv's callback */
    RUN_UNTIL(truncCalls == 1);
    assert_int_equal(truncIndex, 8);
    assert_int_equal(appendsAtTrunc, 1); /* a1 before it, a2 and a3 after */
    assert_int_equal(nInnerAppends, 3);
    assert_int_equal(theIo.works, 0);
    appendCbs = 0;
    while (nInnerAppends > 0) {
        completeAppend(0);
    }
    assert_int_equal(appendCbs, 3);
    /* With no put held, a truncation goes at once. */
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 9), 0);
    assert_int_equal(truncCalls, 2);
    closeIo();
}

/* raft asks a truncation from inside its put's callback: held too, since raft_uv ends the
 * put's barrier only after that callback; and a put raft asks while truncations and
 * appends are held waits behind them. */
static int truncInCb; /* the truncation raftPutTruncates asks (0: none) */
static void raftPutTruncates(struct raft_io_snapshot_put *req, int status)
{
    raftPutDone(req, status);
    if (truncInCb != 0) {
        assert_int_equal(theIo.outer.truncate(&theIo.outer, truncInCb), 0);
        truncInCb = 0;
    }
}

static void test_truncation_from_the_put_callback_and_a_put_behind(void **state)
{
    (void)state;
    theIo.inner.truncate = fakeTruncate;
    truncCalls = 0;
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap, snap2;
    struct raft_buffer bufs[2], bufs2[2];
    fillSnapshot(&snap, bufs, 6);
    fillSnapshot(&snap2, bufs2, 20);
    truncInCb = 8;
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 2, &put, &snap, raftPutTruncates), 0);
    completePut(0);
    assert_int_equal(truncCalls, 0);
    assert_int_equal(theIo.truncs_held, 1);
    struct raft_io_append a;
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    struct raft_io_snapshot_put put2;
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 0, &put2, &snap2, raftPutDone), 0);
    assert_null(innerPut); /* behind the truncation and the append */
    assert_int_equal(nInnerAppends, 0);
    RUN_UNTIL(innerPut != NULL);
    assert_int_equal(truncCalls, 1);
    assert_int_equal(appendsAtTrunc, 0);
    assert_int_equal(nInnerAppends, 1);
    completeAppend(0);
    completePut(0);
    assert_int_equal(putCbs, 2);
    closeIo();
}

/* raft's close while an append is held: the close waits for the put, the append goes to
 * raft_uv then and is waited for too; with the wait's bound passed, raft_uv's close cancels
 * the put and the held append ends canceled (reported to raft as done, as raft_uv's own
 * queue is), before raft_uv's close calls back. */
/* A put raft_uv holds, a truncation and an append held behind it. */
static struct raft_io_snapshot_put heldPut;
static struct raft_snapshot heldSnap;
static struct raft_buffer heldBufs[2];
static struct raft_io_append heldAppend;

static void holdBehindAPut(void)
{
    theIo.inner.truncate = fakeTruncate;
    truncCalls = 0;
    fillSnapshot(&heldSnap, heldBufs, 6);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 2, &heldPut, &heldSnap, raftPutDone),
                     0);
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 8), 0);
    appendCbs = 0;
    assert_int_equal(theIo.outer.append(&theIo.outer, &heldAppend, &oneEntry, 1, raftAppendDone),
                     0);
}

/* Wrapped without a loop (tests/sim wraps raft_fixture's in-memory raft_io so): the clock is
 * the inner io's, what waits for a snapshot put goes to the inner io as soon as the put has
 * called back, and the close, with nothing in flight, goes at once. */
static raft_time fakeNow;
static raft_time fakeTime(struct raft_io *io)
{
    (void)io;
    return fakeNow;
}

/* raft_fixture's truncate: unlike raft_uv's, callable from inside the put's callback. */
static int fixtureTruncate(struct raft_io *io, raft_index index)
{
    (void)io;
    truncCalls++;
    truncIndex = index;
    appendsAtTrunc = nInnerAppends;
    return 0;
}

static void test_without_a_loop(void **state)
{
    (void)state;
    io_wrap(&theIo, NULL);
    theIo.inner.time = fakeTime;
    theIo.inner.truncate = fixtureTruncate;
    truncCalls = 0;
    fakeNow = 1000;
    deliverAppendEntries(2, 0, 0);
    fakeNow = 1250;
    assert_int_equal(io_heard_ago_ms(&theIo, 2), 250);
    struct raft_io_snapshot_put put;
    struct raft_snapshot snap;
    struct raft_buffer bufs[2];
    fillSnapshot(&snap, bufs, 6);
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 2, &put, &snap, raftPutDone), 0);
    struct raft_io_append a;
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 8), 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &a, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(truncCalls, 0);
    assert_int_equal(nInnerAppends, 0);
    completePut(0);
    assert_int_equal(putCbs, 1);
    assert_int_equal(truncCalls, 1);
    assert_int_equal(truncIndex, 8);
    assert_int_equal(appendsAtTrunc, 0);
    assert_int_equal(nInnerAppends, 1);
    assert_int_equal(theIo.works, 0);
    completeAppend(0);
    assert_int_equal(appendCbs, 1);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 1);
    assert_null(theIo.close_timer);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
}

static void test_close_with_held_appends(void **state)
{
    (void)state;
    holdBehindAPut();
    theIo.outer.close(&theIo.outer, raftClosed);
    completePut(0);
    RUN_UNTIL(nInnerAppends == 1);
    assert_int_equal(truncCalls, 1);
    assert_int_equal(innerCloses, 0);
    completeAppend(0);
    turnLoop();
    assert_int_equal(innerCloses, 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    assert_int_equal(appendCbs, 1);
    drainLoop();
}

static void test_bounded_close_cancels_held_appends(void **state)
{
    (void)state;
    theIo.close_wait_ms = 1;
    holdBehindAPut();
    theIo.outer.close(&theIo.outer, raftClosed);
    drainLoop(); /* the bound's timer: raft_uv closes, cancelling the put */
    assert_int_equal(innerCloses, 1);
    assert_int_equal(putCbs, 1);
    assert_int_equal(appendCbs, 1);
    assert_int_equal(appendStatus, 0);
    assert_int_equal(truncCalls, 0);
    aio_reap_set_inline(false);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
}

/* ---- the follower's side: entries its snapshot covers -------------------------------- */

static struct raft_append_entries seenAe; /* the AppendEntries as the fake raft got it */
static raft_term seenTerms[32];

/* Records the AppendEntries, then answers like raftRecv. */
static void raftRecvAe(struct raft_io *io, struct raft_message *msg)
{
    seenAe = msg->append_entries;
    for (unsigned i = 0; i < seenAe.n_entries && i < 32; i++) {
        seenTerms[i] = seenAe.entries[i].term;
    }
    raftRecv(io, msg);
}

/* An AppendEntries of term 3 carrying entries prev+1 .. prev+n, the one at index i of term
 * termOf(i), in raft_malloc'd memory as raft_uv hands it: one entries array, and one batch
 * (two when split > 0: entries up to index prev + split in the first). */
static raft_term termOf(raft_index i)
{
    return i <= 1 ? 1 : i <= 22 ? 2 : 3;
}

static void deliverCovered(raft_index prev, unsigned n, unsigned split, void **batches)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = RAFT_IO_APPEND_ENTRIES;
    m.server_id = 1;
    m.append_entries.term = 3;
    m.append_entries.prev_log_index = prev;
    m.append_entries.prev_log_term = prev == 0 ? 0 : termOf(prev);
    m.append_entries.leader_commit = prev + n;
    m.append_entries.n_entries = n;
    struct raft_entry *entries = raft_calloc(n, sizeof(*entries));
    assert_non_null(entries);
    batches[0] = raft_malloc(8 * n);
    batches[1] = split > 0 ? raft_malloc(8 * n) : NULL;
    assert_non_null(batches[0]);
    for (unsigned i = 0; i < n; i++) {
        void *batch = split > 0 && i >= split ? batches[1] : batches[0];
        entries[i] = (struct raft_entry){.term = termOf(prev + 1 + i),
                                         .type = RAFT_COMMAND,
                                         .buf = {.base = (char *)batch + 8 * i, .len = 8},
                                         .batch = batch};
    }
    m.append_entries.entries = entries;
    memset(&seenAe, 0, sizeof(seenAe));
    innerRecv(&theIo.inner, &m);
}

/* Frees what the fake raft kept of an RPC that reached it with entries (raft would). */
static void freeSeen(void *batch)
{
    raft_free(batch);
    raft_free(seenAe.entries);
}

/* libraft 0.15's follower takes the entries of an AppendEntries that starts below its
 * snapshot, whose indexes its log no longer holds, for new ones: it appends them after its
 * last entry and then crashes (in removeSuffix) or corrupts its log. A leader sends such an
 * RPC from index 1 after a failed send to a follower it has no match index for. The wrapper
 * starts the RPC at the snapshot instead: the entries up to it are committed, hence the
 * same on the leader, and their batches are freed unless a kept entry uses them. */
static void test_snapshotted_entries_are_cut(void **state)
{
    (void)state;
    assert_int_equal(theIo.outer.start(&theIo.outer, 100, raftTick, raftRecvAe), 0);
    struct raft r;
    memset(&r, 0, sizeof(r));
    r.state = RAFT_FOLLOWER;
    r.current_term = 3;
    r.log.offset = 12; /* entries 13-25 in memory (none needed here), snapshot at 20 */
    r.log.snapshot.last_index = 20;
    r.log.snapshot.last_term = 2;
    lastStored = 25;
    void *batches[2];

    /* Before raft_init: as it is. */
    deliverCovered(0, 30, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 0);
    assert_int_equal(seenAe.n_entries, 30);
    freeSeen(batches[0]);
    theIo.raft = &r;

    /* From index 1 past the snapshot: starts at 21, the batch is kept. */
    deliverCovered(0, 30, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.prev_log_term, 2);
    assert_int_equal(seenAe.n_entries, 10);
    assert_int_equal(seenTerms[0], termOf(21));
    assert_int_equal(seenTerms[9], termOf(30));
    assert_ptr_equal(seenAe.entries[0].batch, batches[0]);
    assert_ptr_equal(seenAe.entries[0].buf.base, (char *)batches[0] + 8 * 20);
    assert_int_equal(seenAe.leader_commit, 30);
    assert_int_equal(theIo.skipped, 1);
    freeSeen(batches[0]);

    /* Two batches, the first one only in the snapshot: it is freed, the second kept (ASan
     * and LSan see the rest). */
    deliverCovered(0, 30, 10, batches);
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.n_entries, 10);
    assert_ptr_equal(seenAe.entries[0].batch, batches[1]);
    freeSeen(batches[1]);

    /* Every entry in the snapshot: a heartbeat at the snapshot, with its term; the entries
     * are freed; the success answer vouches for 20, not the follower's 25. */
    sends = 0;
    deliverCovered(5, 10, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.prev_log_term, 2);
    assert_int_equal(seenAe.n_entries, 0);
    assert_null(seenAe.entries);
    assert_int_equal(seenAe.leader_commit, 15); /* not raised */
    assert_int_equal(sends, 1);
    assert_int_equal(lastSent.append_entries_result.last_log_index, 20);
    assert_int_equal(theIo.skipped, 3);

    /* From inside the snapshot, as the sim sees them most: starts at 21. */
    deliverCovered(10, 15, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.n_entries, 5);
    assert_int_equal(seenTerms[0], termOf(21));
    freeSeen(batches[0]);

    /* prev_log_term is the leader's term for the snapshot's index whenever the RPC carries
     * that entry (should it differ from the snapshot's, raft sees the conflict), and the
     * snapshot's own term only when the RPC ends before it. (A snapshot term the leader
     * disagrees with, here, to tell the two apart.) */
    r.log.snapshot.last_term = 9;
    deliverCovered(10, 15, 0, batches); /* carries 20 and more */
    assert_int_equal(seenAe.prev_log_term, termOf(20));
    freeSeen(batches[0]);
    deliverCovered(10, 10, 0, batches); /* ends at 20 */
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.n_entries, 0);
    assert_int_equal(seenAe.prev_log_term, termOf(20));
    deliverCovered(10, 5, 0, batches); /* ends before 20 */
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.prev_log_term, 9);
    r.log.snapshot.last_term = 2;
    assert_int_equal(theIo.skipped, 7);

    /* Left as they are: RPCs from the snapshot on or past it, RPCs of an older term (raft
     * refuses them), and a follower without a snapshot. */
    deliverCovered(20, 5, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 20);
    assert_int_equal(seenAe.n_entries, 5);
    freeSeen(batches[0]);
    r.current_term = 4;
    deliverCovered(0, 30, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 0);
    assert_int_equal(seenAe.n_entries, 30);
    freeSeen(batches[0]);
    r.current_term = 3;
    r.log.snapshot.last_index = 0;
    r.log.snapshot.last_term = 0;
    r.log.offset = 0;
    deliverCovered(0, 30, 0, batches);
    assert_int_equal(seenAe.prev_log_index, 0);
    assert_int_equal(seenAe.n_entries, 30);
    freeSeen(batches[0]);
    assert_int_equal(theIo.skipped, 7);
    theIo.raft = NULL;
}

int main(void)
{
    assert_int_equal(uv_loop_init(&loop), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_heartbeat_answer_is_clamped, setup),
        cmocka_unit_test_setup(test_other_answers_are_untouched, setup),
        cmocka_unit_test_setup(test_tick_is_finer_than_the_heartbeat, setup),
        cmocka_unit_test(test_vote_past_a_stale_leader),
        cmocka_unit_test(test_last_configuration_at_start_is_uncommitted),
        cmocka_unit_test(test_uncommitted_configuration_rolled_back_from_the_copy),
        cmocka_unit_test(test_timeout_drawn_again_at_the_leaders_reset),
        cmocka_unit_test_setup(test_vote_past_a_stale_leader_is_delivered_marked, setup),
        cmocka_unit_test_setup(test_leader_commit_is_clamped, setup),
        cmocka_unit_test_setup(test_unaddressed_answers_are_not_sent, setup),
        cmocka_unit_test(test_install_waits_only_for_an_own_snapshot),
        cmocka_unit_test_setup(test_install_held_until_own_snapshot_stored, setupInstall),
        cmocka_unit_test_setup(test_configuration_in_flight_holds_timeout_now_and_ticks, setupDisk),
        cmocka_unit_test_setup(test_close_frees_a_held_install, setupInstall),
        cmocka_unit_test_setup(test_snapshot_ack_below_an_old_match, setupDisk),
        cmocka_unit_test_setup(test_async_work_is_forwarded, setupWork),
        cmocka_unit_test_setup(test_close_waits_for_async_work, setupWork),
        cmocka_unit_test_setup(test_append_is_forwarded, setupDisk),
        cmocka_unit_test_setup(test_slow_append_is_counted_as_slow, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_appends, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_snapshot_put, setupDisk),
        cmocka_unit_test_setup(test_close_wait_is_bounded, setupDisk),
        cmocka_unit_test_setup(test_close_bound_still_waits_for_work, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_work_then_append, setupDisk),
        cmocka_unit_test_setup_teardown(test_snapshot_put_stores_a_reference, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_snapshot_put_write_failure, setupStore, teardownStore),
        cmocka_unit_test_setup_teardown(test_close_during_snapshot_write, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_load_puts_the_data_back, setupStore, teardownStore),
        cmocka_unit_test_setup_teardown(test_load_refuses_a_damaged_file, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_snapshot_get_puts_the_data_back, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_close_waits_for_snapshot_get, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_segments_raft_uv_deletes_go_through_the_trash,
                                        setupStore, teardownStore),
        cmocka_unit_test_setup(test_results_cannot_commit_older_terms, setupDisk),
        cmocka_unit_test_setup(test_failed_write_stops_the_node, setupDisk),
        cmocka_unit_test_setup(test_oldest_append_in_flight, setupDisk),
        cmocka_unit_test_setup(test_append_at_the_wrong_index_stops_the_node, setupDisk),
        cmocka_unit_test_setup(test_truncation_waits_for_a_snapshot_put, setupDisk),
        cmocka_unit_test_setup(test_truncation_from_the_put_callback_and_a_put_behind, setupDisk),
        cmocka_unit_test_setup(test_without_a_loop, setupDisk),
        cmocka_unit_test_setup(test_close_with_held_appends, setupDisk),
        cmocka_unit_test_setup(test_bounded_close_cancels_held_appends, setupDisk),
        cmocka_unit_test_setup_teardown(test_truncation_is_marked_and_checked, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_truncation_not_done_stops_the_node, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup_teardown(test_failed_install_stops_the_node, setupStore,
                                        teardownStore),
        cmocka_unit_test_setup(test_snapshotted_entries_are_cut, setup),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* Every test closed what it opened on the loop. */
    if (uv_loop_close(&loop) != 0) {
        fprintf(stderr, "test_io: handles left open on the loop\n");
        return 1;
    }
    return failed;
}
