/* Unit test of cluster/raft015/logdir.c: raft_uv's segment names, the truncation marks, the check
 * of a truncation and what a start does with one marked and not checked. Segments here are
 * stand-ins with raft_uv's names: an open segment that holds entries starts with a non-zero
 * word (raft_uv's format version), one prepared and unused is zeros. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "logdir.h"
#include "tmpdir.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    return tmpdir_make(dir, sizeof(dir), "idem-logdir");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_remove(dir);
}

static void pathOf(char *out, size_t cap, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < cap);
}

/* A file of 4096 bytes whose first byte is `first`. */
static void segment(const char *name, unsigned char first)
{
    char path[256];
    pathOf(path, sizeof(path), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    unsigned char block[4096] = {0};
    block[0] = first;
    assert_int_equal(write(fd, block, sizeof(block)), (ssize_t)sizeof(block));
    close(fd);
}

static void closedSeg(uint64_t first, uint64_t end)
{
    char name[64];
    snprintf(name, sizeof(name), "%016llu-%016llu", (unsigned long long)first,
             (unsigned long long)end);
    segment(name, 1);
}

static bool exists(const char *name)
{
    char path[256];
    struct stat sb;
    pathOf(path, sizeof(path), name);
    return stat(path, &sb) == 0;
}

static bool marked(void)
{
    char name[64];
    snprintf(name, sizeof(name), LOGDIR_MARK_PREFIX "%020llu", 106ull);
    return exists(name);
}

static void test_closed_segment_names(void **state)
{
    (void)state;
    uint64_t a = 0, b = 0;
    assert_true(logdir_closed_segment("0000000000000002-0000000000000143", &a, &b));
    assert_int_equal(a, 2);
    assert_int_equal(b, 143);
    assert_true(logdir_closed_segment("9999999999999999-9999999999999999", &a, &b));
    assert_int_equal(b, 9999999999999999ull);
    const char * not [] = {"open-1",
                           "metadata1",
                           "0000000000000002-000000000000014",
                           "0000000000000002-00000000000001433",
                           "0000000000000002_0000000000000143",
                           "000000000000000x-0000000000000143",
                           "",
                           "idem-trash"};
    for (size_t i = 0; i < sizeof(not ) / sizeof(not [0]); i++) {
        assert_false(logdir_closed_segment(not [i], &a, &b));
    }
}

/* A truncation done as raft_uv does it: the rewritten segment ends before the index, one
 * open segment holds what was written since, the others are prepared (zeros). */
static void test_done_truncation_is_checked_and_unmarked(void **state)
{
    (void)state;
    char err[256];
    closedSeg(1, 1);
    closedSeg(2, 143);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_true(marked());
    assert_int_equal(logdir_truncate_done(dir, 106, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "ends at 143"));

    char path[256], to[256];
    pathOf(path, sizeof(path), "0000000000000002-0000000000000143");
    pathOf(to, sizeof(to), "0000000000000002-0000000000000105");
    assert_int_equal(rename(path, to), 0);
    segment("open-2", 1);
    segment("open-3", 0);
    segment("open-4", 0);
    assert_int_equal(logdir_truncate_done(dir, 106, err, sizeof(err)), 1);
    assert_int_equal(logdir_truncate_end(dir, 106, err, sizeof(err)), 0);
    assert_false(marked());
}

/* raft_uv could not close the open segment before truncating: its entries (past the point)
 * stay in it, and another open segment holds what was written since. */
static void test_two_open_segments_holding_entries_are_not_done(void **state)
{
    (void)state;
    char err[256];
    closedSeg(1, 105);
    segment("open-1", 1);
    segment("open-2", 1);
    assert_int_equal(logdir_truncate_done(dir, 106, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "2 open segments"));
}

/* The boundaries: a closed segment ending at the index is not done; an open segment too
 * short for raft_uv's format word holds nothing. */
static void test_done_boundaries(void **state)
{
    (void)state;
    char err[256], path[256];
    closedSeg(1, 106);
    assert_int_equal(logdir_truncate_done(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_truncate_done(dir, 107, err, sizeof(err)), 1);
    segment("open-1", 1);
    pathOf(path, sizeof(path), "open-2");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(logdir_truncate_done(dir, 107, err, sizeof(err)), 1);
}

/* A check removes its own mark; a start's recovery every one. */
static void test_end_removes_the_one_mark(void **state)
{
    (void)state;
    char err[256];
    assert_int_equal(logdir_truncate_begin(dir, 50, err, sizeof(err)), 0);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_truncate_begin(dir, 200, err, sizeof(err)), 0);
    assert_int_equal(logdir_truncate_end(dir, 106, err, sizeof(err)), 0);
    assert_false(marked());
    assert_true(exists(LOGDIR_MARK_PREFIX "00000000000000000050"));
    assert_true(exists(LOGDIR_MARK_PREFIX "00000000000000000200"));
    assert_int_equal(logdir_truncate_end(dir, 0, err, sizeof(err)), 0);
    assert_false(exists(LOGDIR_MARK_PREFIX "00000000000000000050"));
    assert_false(exists(LOGDIR_MARK_PREFIX "00000000000000000200"));
}

static void test_recover_without_a_mark_does_nothing(void **state)
{
    (void)state;
    char msg[512];
    closedSeg(1, 143);
    segment("open-1", 1);
    segment("open-2", 1);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_string_equal(msg, "");
    assert_true(exists("open-1"));
    assert_true(exists("open-2"));
}

/* The truncation was not done: the open segments holding entries (written after it) are
 * moved aside, the prepared ones and the closed ones stay, the mark goes. */
static void test_recover_moves_the_entries_written_after(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 1);
    closedSeg(2, 143);
    segment("open-2", 1);
    segment("open-3", 0);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_non_null(strstr(msg, "moved the 1 open segment"));
    assert_false(exists("open-2"));
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-2"));
    assert_true(exists("open-3"));
    assert_true(exists("0000000000000002-0000000000000143"));
    assert_false(marked());

    /* Once more, with an open-2 of the same name already aside: both are kept. */
    segment("open-2", 1);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-2"));
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-2.1"));
    assert_false(exists("open-2"));
}

/* Closed segments ending just before the point: done, or the open segment raft_uv did not
 * close starts at the point. Either way the open segments hold only entries from the point
 * on, never acknowledged: moved aside. */
static void test_recover_at_the_point_moves_them_too(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 105);
    segment("open-5", 1);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-5"));
}

/* Several marks: the lowest counts (the log holds nothing acknowledged past it). */
static void test_recover_takes_the_lowest_mark(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 104);
    segment("open-7", 1);
    assert_int_equal(logdir_truncate_begin(dir, 150, err, sizeof(err)), 0);
    assert_int_equal(logdir_truncate_begin(dir, 105, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_non_null(strstr(msg, "from index 105"));
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-7"));
    assert_false(exists(LOGDIR_MARK_PREFIX "00000000000000000150"));
}

/* A truncation stopped halfway: raft_uv had written the kept part (2-105) and not yet
 * deleted the segment it came from (2-143) nor a later one (144-150). The whole one is
 * kept, the rest goes, and the open segment written after is moved aside. */
static void test_recover_undoes_a_halfway_truncation(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 1);
    closedSeg(2, 105);
    closedSeg(2, 143);
    closedSeg(144, 150);
    segment("open-9", 1);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_non_null(strstr(msg, "removed what it had left halfway"));
    assert_true(exists("0000000000000001-0000000000000001"));
    assert_true(exists("0000000000000002-0000000000000143"));
    assert_false(exists("0000000000000002-0000000000000105"));
    assert_false(exists("0000000000000144-0000000000000150"));
    assert_true(exists(LOGDIR_UNTRUNCATED "/open-9"));
}

/* After a snapshot install raft_uv keeps no closed segment: the one open segment holding
 * entries is the log after the snapshot, and stays. */
static void test_recover_without_closed_segments_keeps_the_open_one(void **state)
{
    (void)state;
    char err[256], msg[512];
    segment("open-3", 1);
    assert_int_equal(logdir_truncate_begin(dir, 600, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_true(exists("open-3"));
    assert_false(exists(LOGDIR_MARK_PREFIX "00000000000000000600"));
}

/* The node stopped before raft_uv closed the open segment: it still holds entries before
 * the point (committed ones among them), so it stays; only the mark goes. */
static void test_recover_keeps_an_open_segment_with_entries_before_the_point(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 90);
    segment("open-3", 1);
    segment("open-4", 0);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), 0);
    assert_non_null(strstr(msg, "its log is whole"));
    assert_true(exists("open-3"));
    assert_false(marked());
}

/* ... and with a second one holding entries, which is which cannot be told: refused, the
 * directory left as it was. */
static void test_recover_refuses_what_it_cannot_tell(void **state)
{
    (void)state;
    char err[256], msg[512];
    closedSeg(1, 90);
    segment("open-3", 1);
    segment("open-4", 1);
    assert_int_equal(logdir_truncate_begin(dir, 106, err, sizeof(err)), 0);
    assert_int_equal(logdir_recover(dir, msg, sizeof(msg)), -1);
    assert_non_null(strstr(msg, "remove the data directory"));
    assert_true(exists("open-3"));
    assert_true(exists("open-4"));
    assert_true(marked());
}

static void test_missing_directory_fails(void **state)
{
    (void)state;
    char err[256], msg[512];
    assert_int_equal(logdir_truncate_begin("/nonexistent/idem-logdir", 5, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/idem-logdir"));
    assert_int_equal(logdir_truncate_done("/nonexistent/idem-logdir", 5, err, sizeof(err)), -1);
    assert_int_equal(logdir_recover("/nonexistent/idem-logdir", msg, sizeof(msg)), -1);
    assert_non_null(strstr(msg, "cannot check the log"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_segment_names),
        cmocka_unit_test_setup_teardown(test_done_truncation_is_checked_and_unmarked, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_two_open_segments_holding_entries_are_not_done, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_done_boundaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_takes_the_lowest_mark, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_undoes_a_halfway_truncation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_without_closed_segments_keeps_the_open_one,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_removes_the_one_mark, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_without_a_mark_does_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_moves_the_entries_written_after, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_recover_at_the_point_moves_them_too, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_recover_keeps_an_open_segment_with_entries_before_the_point, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_refuses_what_it_cannot_tell, setup, teardown),
        cmocka_unit_test(test_missing_directory_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
