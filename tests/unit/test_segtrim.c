#define _GNU_SOURCE /* mkdtemp */
/* Unit tests of cluster/segtrim.c: a closing raft_uv segment's unused rest is freed in
 * steps before raft_uv truncates and renames it, never below what raft_uv keeps; raft_uv's
 * own answer is returned; and a segment left between two steps (a crash during a close)
 * is read back by raft_uv with all its entries. Files are made in fresh mkdtemp()
 * directories under /tmp, removed at teardown. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <raft.h>

#include "segtrim.h"
#include "tmpdir.h"
#include "uvlog.h"

#define MIB (1u << 20)

static char dir[64];

static int setup(void **state)
{
    (void)state;
    segtrim_set_pause_us(0); /* the steps, not their pauses, are under test */
    snprintf(dir, sizeof(dir), "/tmp/idem-segtrim-XXXXXX");
    return mkdtemp(dir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    segtrim_set_pause_us(SEGTRIM_PAUSE_US);
    return tmpdir_remove(dir);
}

static uint8_t patternAt(size_t i)
{
    return (uint8_t)(i * 131u + 7u);
}

/* dir/name: `data` bytes of a pattern, then zeros up to `size` (written, not a hole). */
static void makeSegment(const char *name, size_t data, size_t size)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    uint8_t *buf = calloc(1, MIB);
    assert_non_null(buf);
    for (size_t off = 0; off < size; off += MIB) {
        size_t n = size - off < MIB ? size - off : MIB;
        memset(buf, 0, MIB);
        for (size_t i = 0; i < n && off + i < data; i++) {
            buf[i] = patternAt(off + i);
        }
        assert_int_equal(pwrite(fd, buf, n, (off_t)off), (ssize_t)n);
    }
    free(buf);
    assert_int_equal(close(fd), 0);
}

static off_t sizeOf(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static void assertPattern(const char *name, size_t data)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    for (size_t i = 0; i < data; i++) {
        int c = fgetc(f);
        assert_int_equal(c, patternAt(i));
    }
    fclose(f);
}

static struct segtrim_stats delta(const struct segtrim_stats *a, const struct segtrim_stats *b)
{
    return (struct segtrim_stats){.closed = b->closed - a->closed,
                                  .stepped = b->stepped - a->stepped,
                                  .steps = b->steps - a->steps,
                                  .step_bytes = b->step_bytes - a->step_bytes,
                                  .step_failed = b->step_failed - a->step_failed};
}

/* An 8 MiB segment whose entries use 100,001 bytes: seven 1 MiB steps (8 -> 1 MiB), then
 * raft_uv's truncation to the exact size and the rename; the data is intact. */
static void test_rest_freed_in_steps_then_closed(void **state)
{
    (void)state;
    makeSegment("open-1", 100001, 8 * MIB);
    struct segtrim_stats a, b;
    segtrim_get_stats(&a);
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    assert_int_equal(__wrap_UvFsTruncateAndRenameFile(dir, 100001, "open-1", "1-10", errmsg), 0);
    segtrim_get_stats(&b);
    struct segtrim_stats d = delta(&a, &b);
    assert_int_equal(d.closed, 1);
    assert_int_equal(d.stepped, 1);
    assert_int_equal(d.steps, 7);
    assert_int_equal(d.step_bytes, 7 * MIB);
    assert_int_equal(d.step_failed, 0);
    assert_int_equal(sizeOf("open-1"), -1);
    assert_int_equal(sizeOf("1-10"), 100001);
    assertPattern("1-10", 100001);
}

/* A rest under one step is left to raft_uv's truncation. */
static void test_small_rest_at_once(void **state)
{
    (void)state;
    makeSegment("open-2", 4096, MIB + MIB / 2);
    struct segtrim_stats a, b;
    segtrim_get_stats(&a);
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    assert_int_equal(__wrap_UvFsTruncateAndRenameFile(dir, MIB, "open-2", "11-20", errmsg), 0);
    segtrim_get_stats(&b);
    struct segtrim_stats d = delta(&a, &b);
    assert_int_equal(d.closed, 1);
    assert_int_equal(d.stepped, 0);
    assert_int_equal(d.steps, 0);
    assert_int_equal(sizeOf("11-20"), MIB);
    assertPattern("11-20", 4096);
}

/* A rest of 256 MiB goes in at most SEGTRIM_MAX_STEPS steps (4 MiB each here). The file
 * is sparse: the steps' sizes are under test, not the disk. */
static void test_large_rest_in_bounded_steps(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/open-3", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 256 * (off_t)MIB), 0);
    assert_int_equal(close(fd), 0);
    struct segtrim_stats a, b;
    segtrim_get_stats(&a);
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    assert_int_equal(__wrap_UvFsTruncateAndRenameFile(dir, 4096, "open-3", "21-30", errmsg), 0);
    segtrim_get_stats(&b);
    struct segtrim_stats d = delta(&a, &b);
    assert_true(d.steps <= SEGTRIM_MAX_STEPS);
    assert_int_equal(d.steps, 63);
    assert_int_equal(d.step_bytes, 252 * (uint64_t)MIB);
    assert_int_equal(sizeOf("21-30"), 4096);
}

/* A file that is not there: no step, and raft_uv's own error comes back. */
static void test_missing_file_reports_raft_uv_error(void **state)
{
    (void)state;
    struct segtrim_stats a, b;
    segtrim_get_stats(&a);
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    int rv = __wrap_UvFsTruncateAndRenameFile(dir, 4096, "open-9", "91-99", errmsg);
    segtrim_get_stats(&b);
    struct segtrim_stats d = delta(&a, &b);
    assert_int_equal(rv, RAFT_IOERR);
    assert_true(strlen(errmsg) > 0);
    assert_int_equal(d.closed, 1);
    assert_int_equal(d.steps, 0);
    assert_int_equal(d.step_failed, 1);
    assert_int_equal(sizeOf("91-99"), -1);
}

/* The name of the one file in dir whose name starts with `prefix`, or "" if none. */
static void findFile(const char *prefix, char *out, size_t outlen)
{
    out[0] = '\0';
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(out, outlen, "%s", e->d_name);
        }
    }
    closedir(d);
}

/* raft_uv itself, linked as idemd links it: closing its open segment goes through the
 * wrapper in steps, and the closed segment it leaves is read back with its entries. */
static void test_raft_uv_closes_through_the_wrapper(void **state)
{
    (void)state;
    struct segtrim_stats a, b;
    segtrim_get_stats(&a);
    struct uvlog log;
    uvlog_open(&log, dir);
    uvlog_append_one(&log, 1);
    uvlog_append_one(&log, 1);
    uvlog_close(&log);
    segtrim_get_stats(&b);
    struct segtrim_stats d = delta(&a, &b);
    assert_true(d.closed >= 1);
    assert_true(d.stepped >= 1);
    assert_int_equal(d.step_failed, 0);
    char closed[256];
    findFile("0000000000000001-", closed, sizeof(closed));
    assert_true(closed[0] != '\0');
    assert_true(sizeOf(closed) < (off_t)MIB);
    assert_int_equal(uvlog_load(&log, dir), 2);
    uvlog_close(&log);
}

/* A close interrupted between two steps (a crash) leaves the open segment with all its
 * entries and a shorter run of zeros: raft_uv reads them all back. The interruption is
 * made by hand: the open segment's bytes are kept before raft_uv closes it, and then put
 * back as the open segment one step shorter, in place of the closed one. */
static void test_segment_left_between_steps_loads(void **state)
{
    (void)state;
    struct uvlog log;
    uvlog_open(&log, dir);
    uvlog_append_one(&log, 1);
    uvlog_append_one(&log, 1);
    uvlog_append_one(&log, 1);
    char open1[256];
    snprintf(open1, sizeof(open1), "%s/open-1", dir);
    off_t full = sizeOf("open-1");
    assert_true(full > (off_t)MIB);
    size_t keep = (size_t)full - MIB;
    uint8_t *bytes = malloc(keep);
    assert_non_null(bytes);
    int fd = open(open1, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, bytes, keep, 0), (ssize_t)keep);
    assert_int_equal(close(fd), 0);
    uvlog_close(&log);
    char closed[256], cpath[512];
    findFile("0000000000000001-", closed, sizeof(closed));
    assert_true(closed[0] != '\0');
    snprintf(cpath, sizeof(cpath), "%s/%s", dir, closed);
    assert_int_equal(unlink(cpath), 0);
    fd = open(open1, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, keep, 0), (ssize_t)keep);
    assert_int_equal(close(fd), 0);
    free(bytes);
    assert_int_equal(uvlog_load(&log, dir), 3);
    uvlog_close(&log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rest_freed_in_steps_then_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_rest_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_rest_in_bounded_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file_reports_raft_uv_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raft_uv_closes_through_the_wrapper, setup, teardown),
        cmocka_unit_test_setup_teardown(test_segment_left_between_steps_loads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
