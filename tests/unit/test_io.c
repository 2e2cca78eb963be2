/* Unit test of cluster/io.c: the correction of libraft 0.15's AppendEntries answers, and the
 * forwarding of async_work (asynchronous snapshots) with raft's close held back until the
 * last work has called back. A fake raft_uv below the wrapper records what is sent and
 * holds async works until the test completes them; a fake raft above it answers the way
 * libraft 0.15 does (its last stored index). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "io.h"

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
    io_wrap(&theIo);
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

static void fakeClose(struct raft_io *io, raft_io_close_cb cb)
{
    (void)io;
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

static int setupWork(void **state)
{
    setup(state);
    theIo.inner.async_work = fakeAsyncWork;
    theIo.inner.close = fakeClose;
    io_wrap(&theIo);
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
    innerWorkCb(innerWork, 0);
    assert_int_equal(workCbs, 1);
    assert_int_equal(workStatus, 0);
    assert_int_equal(theIo.works, 0);
    /* A failure is passed on as it is. */
    assert_int_equal(theIo.outer.async_work(&theIo.outer, &req, raftWorkDone), 0);
    innerWorkCb(innerWork, RAFT_IOERR);
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
    innerWorkCb(innerWork, 0);
    assert_int_equal(workCbs, 1);
    assert_int_equal(workStatus, RAFT_CANCELED);
    assert_int_equal(innerCloses, 1);
    assert_int_equal(outerCloses, 0);
    innerCloseCb(&theIo.inner);
    assert_int_equal(outerCloses, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_heartbeat_answer_is_clamped, setup),
        cmocka_unit_test_setup(test_other_answers_are_untouched, setup),
        cmocka_unit_test_setup(test_leader_commit_is_clamped, setup),
        cmocka_unit_test_setup(test_async_work_is_forwarded, setupWork),
        cmocka_unit_test_setup(test_close_waits_for_async_work, setupWork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
