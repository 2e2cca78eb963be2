/* Unit test of cluster/io.c: the correction of libraft 0.15's AppendEntries answers, the
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

#include "io.h"

static uv_loop_t loop; /* the close bound's timer runs on it */
static struct io theIo;
static raft_io_recv_cb innerRecv; /* what the wrapper registered with the "raft_uv" */
static struct raft_message lastSent;
static int sends;
static raft_index lastStored;   /* what the fake raft reports */
static bool answerRejected;
static raft_index seenCommit; /* leader_commit as the fake raft received it */

static int fakeStart(struct raft_io *io, unsigned msecs, raft_io_tick_cb tick,
                     raft_io_recv_cb recv)
{
    (void)io;
    (void)msecs;
    (void)tick;
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

/* The fake raft: answers every AppendEntries at once with its last stored index. */
static void raftRecv(struct raft_io *io, struct raft_message *msg)
{
    seenCommit = msg->append_entries.leader_commit;
    struct raft_message res;
    memset(&res, 0, sizeof(res));
    res.type = RAFT_IO_APPEND_ENTRIES_RESULT;
    res.server_id = msg->server_id;
    res.append_entries_result.rejected = answerRejected ? msg->append_entries.prev_log_index : 0;
    res.append_entries_result.last_log_index = lastStored;
    struct raft_io_send req;
    io->send(io, &req, &res, NULL);
}

static void raftTick(struct raft_io *io)
{
    (void)io;
}

static void deliverAppendEntriesCommit(raft_id from, raft_index prev, unsigned n,
                                       raft_index commit)
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

/* raft_uv 0.15 must not be closed from inside its own callbacks (io.c explains). */
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
    /* A failure is passed on as it is. */
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    completeWork(RAFT_IOERR);
    assert_int_equal(workStatus, RAFT_IOERR);
    /* No work in flight: close goes through at once. */
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 1);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
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

static int fakeSnapshotPut(struct raft_io *io, unsigned trailing, struct raft_io_snapshot_put *req,
                           const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    (void)io;
    (void)trailing;
    (void)snapshot;
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
    nInnerAppends = 0;
    innerPut = NULL;
    innerClosed = false;
    appendCbs = putCbs = 0;
    appendStatus = putStatus = -1;
    return 0;
}

static struct raft_entry oneEntry = {.term = 1, .type = RAFT_COMMAND};

/* Appends pass through, their status as it is while raft is open. */
static void test_append_is_forwarded(void **state)
{
    (void)state;
    struct raft_io_append req;
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    assert_int_equal(nInnerAppends, 1);
    assert_int_equal(theIo.disk, 1);
    completeAppend(RAFT_IOERR);
    assert_int_equal(appendCbs, 1);
    assert_int_equal(appendStatus, RAFT_IOERR);
    assert_int_equal(theIo.disk, 0);
    assert_int_equal(theIo.outer.append(&theIo.outer, &req, &oneEntry, 1, raftAppendDone), 0);
    completeAppend(0);
    assert_int_equal(appendStatus, 0);
    theIo.outer.close(&theIo.outer, raftClosed);
    assert_int_equal(innerCloses, 1); /* nothing in flight: at once */
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
    drainLoop();
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
    drainLoop(); /* the timer fires, the wrapper closes raft_uv, which cancels both */
    assert_int_equal(innerCloses, 1);
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

int main(void)
{
    assert_int_equal(uv_loop_init(&loop), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_heartbeat_answer_is_clamped, setup),
        cmocka_unit_test_setup(test_other_answers_are_untouched, setup),
        cmocka_unit_test_setup(test_leader_commit_is_clamped, setup),
        cmocka_unit_test_setup(test_async_work_is_forwarded, setupWork),
        cmocka_unit_test_setup(test_close_waits_for_async_work, setupWork),
        cmocka_unit_test_setup(test_append_is_forwarded, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_appends, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_snapshot_put, setupDisk),
        cmocka_unit_test_setup(test_close_wait_is_bounded, setupDisk),
        cmocka_unit_test_setup(test_close_bound_still_waits_for_work, setupDisk),
        cmocka_unit_test_setup(test_close_waits_for_work_then_append, setupDisk),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* Every test closed what it opened on the loop. */
    if (uv_loop_close(&loop) != 0) {
        fprintf(stderr, "test_io: handles left open on the loop\n");
        return 1;
    }
    return failed;
}
