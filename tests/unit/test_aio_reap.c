#define _GNU_SOURCE /* mkdtemp, syscall */
/* Unit tests of cluster/aio_reap.c: raft_uv's AIO contexts are destroyed by the reaper
 * thread, not by the caller. The contexts are real ones (io_setup(2)), and the last test
 * drives raft_uv itself (libraft linked as idemd links it, cluster/CMakeLists.txt) in a
 * fresh mkdtemp() directory under /tmp, removed at teardown. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "aio_reap.h"
#include "tmpdir.h"

static aio_context_t newContext(void)
{
    aio_context_t ctx = 0;
    assert_int_equal(syscall(SYS_io_setup, 1, &ctx), 0);
    assert_true(ctx != 0);
    return ctx;
}

/* io_destroy of a context that no longer exists fails with EINVAL. */
static bool contextGone(aio_context_t ctx)
{
    return syscall(SYS_io_destroy, ctx) == -1 && errno == EINVAL;
}

/* The wrapper answers 0 at once; after aio_reap_stop the thread has destroyed the context. */
static void test_queued_context_is_destroyed(void **state)
{
    (void)state;
    struct aio_reap_stats a, b;
    aio_reap_get_stats(&a);
    aio_context_t ctx[3] = {newContext(), newContext(), newContext()};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(__wrap_UvOsIoDestroy(ctx[i]), 0);
    }
    aio_reap_stop();
    aio_reap_get_stats(&b);
    assert_int_equal(b.queued - a.queued, 3);
    assert_int_equal(b.destroyed - a.destroyed, 3);
    assert_int_equal(b.failed - a.failed, 0);
    assert_int_equal(b.inline_runs - a.inline_runs, 0);
    assert_true(b.last_tid != 0 && b.last_tid != gettid()); /* not on this thread */
    for (int i = 0; i < 3; i++) {
        assert_true(contextGone(ctx[i]));
    }
    /* Stopped: the next context starts the thread again. */
    aio_context_t again = newContext();
    assert_int_equal(__wrap_UvOsIoDestroy(again), 0);
    aio_reap_stop();
    aio_reap_get_stats(&a);
    assert_int_equal(a.destroyed - b.destroyed, 1);
    assert_true(contextGone(again));
    aio_reap_stop(); /* nothing running: returns */
}

/* A context the kernel refuses to destroy is counted, not retried. */
static void test_refused_destroy_is_counted(void **state)
{
    (void)state;
    struct aio_reap_stats a, b;
    aio_context_t ctx = newContext();
    assert_int_equal(syscall(SYS_io_destroy, ctx), 0);
    aio_reap_get_stats(&a);
    assert_int_equal(__wrap_UvOsIoDestroy(ctx), 0);
    aio_reap_stop();
    aio_reap_get_stats(&b);
    assert_int_equal(b.destroyed - a.destroyed, 1);
    assert_int_equal(b.failed - a.failed, 1);
}

/* Inline (io.c, closing with writes in the kernel): destroyed before the wrapper returns,
 * on the caller's thread, and nothing is queued. */
static void test_inline_destroys_before_returning(void **state)
{
    (void)state;
    struct aio_reap_stats a, b;
    aio_reap_get_stats(&a);
    aio_reap_set_inline(true);
    aio_context_t ctx = newContext();
    assert_int_equal(__wrap_UvOsIoDestroy(ctx), 0);
    assert_true(contextGone(ctx)); /* no aio_reap_stop needed */
    aio_reap_get_stats(&b);
    assert_int_equal(b.inline_runs - a.inline_runs, 1);
    assert_int_equal(b.queued - a.queued, 0);
    assert_int_equal(b.last_tid, gettid());
    aio_reap_set_inline(false);
}

/* raft_uv itself: its capability probe and the writer of its open segment each set up an
 * AIO context. Every one it destroys goes through the reaper (the link's --wrap), none on
 * the loop, and none is left when it is closed. */
static bool appended, closed;
static char dir[64];

static int setup(void **state)
{
    (void)state;
    aio_reap_set_inline(false); /* a failed test before may have left it on */
    snprintf(dir, sizeof(dir), "/tmp/idem-aio-reap-XXXXXX");
    return mkdtemp(dir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_remove(dir);
}

static void appendCb(struct raft_io_append *req, int status)
{
    (void)req;
    assert_int_equal(status, 0);
    appended = true;
}

static void closeCb(struct raft_io *io)
{
    (void)io;
    closed = true;
}

static void test_raft_uv_contexts_go_to_the_reaper(void **state)
{
    (void)state;
    aio_reap_stop();
    struct aio_reap_stats a, b;
    aio_reap_get_stats(&a);

    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    struct raft_uv_transport transport = {0};
    struct raft_io io = {0};
    assert_int_equal(raft_uv_tcp_init(&transport, &loop), 0);
    assert_int_equal(raft_uv_init(&io, &loop, dir, &transport), 0);
    assert_int_equal(io.init(&io, 1, "127.0.0.1:9"), 0);
    raft_term term;
    raft_id vote;
    struct raft_snapshot *snap;
    raft_index start;
    struct raft_entry *loaded;
    size_t n;
    assert_int_equal(io.load(&io, &term, &vote, &snap, &start, &loaded, &n), 0);
    assert_null(snap);
    assert_int_equal(n, 0);

    static uint8_t payload[8] = "command";
    struct raft_entry e = {.term = 1, .type = RAFT_COMMAND};
    e.buf.base = payload;
    e.buf.len = sizeof payload;
    struct raft_io_append req = {0};
    appended = closed = false;
    assert_int_equal(io.append(&io, &req, &e, 1, appendCb), 0);
    for (int i = 0; i < 1000 && !appended; i++) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_true(appended);

    io.close(&io, closeCb);
    for (int i = 0; i < 1000 && !closed; i++) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_true(closed);
    raft_uv_close(&io);
    raft_uv_tcp_close(&transport);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);

    aio_reap_stop();
    aio_reap_get_stats(&b);
    print_message("raft_uv handed %llu AIO contexts to the reaper\n",
                  (unsigned long long)(b.queued - a.queued));
    assert_true(b.queued - a.queued >= 1);
    assert_int_equal(b.destroyed - a.destroyed, b.queued - a.queued);
    assert_int_equal(b.failed - a.failed, 0);
    assert_int_equal(b.inline_runs - a.inline_runs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queued_context_is_destroyed),
        cmocka_unit_test(test_refused_destroy_is_counted),
        cmocka_unit_test(test_inline_destroys_before_returning),
        cmocka_unit_test_setup_teardown(test_raft_uv_contexts_go_to_the_reaper, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
