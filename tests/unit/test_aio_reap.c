#define _GNU_SOURCE /* mkdtemp, syscall */
/* Unit tests of cluster/raft015/aio_reap.c: raft_uv's AIO contexts are destroyed by the reaper
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

#include "aio_reap.h"
#include "tmpdir.h"
#include "uvlog.h"

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

/* Inline (io_close.c, closing with writes in the kernel): destroyed before the wrapper returns,
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

static void test_raft_uv_contexts_go_to_the_reaper(void **state)
{
    (void)state;
    aio_reap_stop();
    struct aio_reap_stats a, b;
    aio_reap_get_stats(&a);

    struct uvlog log;
    uvlog_open(&log, dir);
    uvlog_append_one(&log, 1);
    uvlog_close(&log);

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
