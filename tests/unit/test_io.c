/* Unit test of cluster/io.c: the correction of libraft 0.15's AppendEntries answers. A fake
 * raft_uv below the wrapper records what is sent; a fake raft above it answers the way
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_heartbeat_answer_is_clamped, setup),
        cmocka_unit_test_setup(test_other_answers_are_untouched, setup),
        cmocka_unit_test_setup(test_leader_commit_is_clamped, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
