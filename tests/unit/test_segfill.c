#define _GNU_SOURCE /* mkdtemp */
/* Unit tests of cluster/raft015/segfill.c: raft_uv's open segments are written through before use,
 * and nothing else is. What the file system holds is read back with FIEMAP (ioctl_fiemap(2)):
 * an extent that fallocate reserved and nothing wrote yet is flagged UNWRITTEN. The files
 * are made in fresh mkdtemp() directories (under /tmp, or the working directory when /tmp
 * is not ext4 or XFS), removed at teardown. Where neither is ext4 or XFS, the tests that
 * need one are skipped and the binary exits 77 (ctest: skipped, not passed). */
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cmocka.h>
#include <raft.h>

#include "segfill.h"
#include "tmpdir.h"
#include "uvlog.h"

#define SEGMENT_SIZE (8u << 20) /* raft_uv's default segment size */
#define MAX_EXTENTS 512

static char dir[4096];
static bool eligible;    /* dir is on ext4 or XFS */
static bool skipped_any; /* a test needed ext4 or XFS and had none */

static bool onExt4OrXfs(const char *path)
{
    struct statfs fs;
    return statfs(path, &fs) == 0 &&
           (fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC);
}

static int makeDir(const char *parent)
{
    snprintf(dir, sizeof(dir), "%s/idem-segfill-XXXXXX", parent);
    return mkdtemp(dir) != NULL ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    segfill_set_enabled(true); /* a failed test before may have left it off */
    if (makeDir("/tmp") != 0) {
        return -1;
    }
    eligible = onExt4OrXfs(dir);
    if (!eligible) {
        char cwd[2048];
        if (tmpdir_remove(dir) != 0 || getcwd(cwd, sizeof(cwd)) == NULL || makeDir(cwd) != 0) {
            return -1;
        }
        eligible = onExt4OrXfs(dir);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_remove(dir);
}

static bool needEligible(void)
{
    if (!eligible) {
        skipped_any = true;
        print_message("neither /tmp nor the working directory is on ext4 or XFS\n");
    }
    return eligible;
}

/* The file's extents, and how many of them are unwritten. */
static void extentsOf(const char *path, unsigned *total, unsigned *unwritten)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    size_t len = sizeof(struct fiemap) + MAX_EXTENTS * sizeof(struct fiemap_extent);
    struct fiemap *fm = calloc(1, len);
    assert_non_null(fm);
    fm->fm_start = 0;
    fm->fm_length = FIEMAP_MAX_OFFSET;
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = MAX_EXTENTS;
    assert_int_equal(ioctl(fd, FS_IOC_FIEMAP, fm), 0);
    assert_true(fm->fm_mapped_extents < MAX_EXTENTS); /* all of them listed */
    *total = fm->fm_mapped_extents;
    *unwritten = 0;
    for (unsigned i = 0; i < fm->fm_mapped_extents; i++) {
        if (fm->fm_extents[i].fe_flags & FIEMAP_EXTENT_UNWRITTEN) {
            (*unwritten)++;
        }
    }
    free(fm);
    close(fd);
}

/* raft_uv's allocation through the wrapper: the answer is raft_uv's, the file its size. */
static void allocate(const char *name, size_t size, char *path, size_t pathlen)
{
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    uv_file fd = -1;
    assert_int_equal(__wrap_UvFsAllocateFile(dir, name, size, &fd, errmsg), 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, size);
    close(fd);
    snprintf(path, pathlen, "%s/%s", dir, name);
}

/* allocate(), and what the wrapper counted meanwhile. */
static struct segfill_stats allocateCounted(const char *name, size_t size, char *path,
                                            size_t pathlen)
{
    struct segfill_stats a, b;
    segfill_get_stats(&a);
    allocate(name, size, path, pathlen);
    segfill_get_stats(&b);
    return (struct segfill_stats){.filled = b.filled - a.filled,
                                  .bytes = b.bytes - a.bytes,
                                  .skipped_fs = b.skipped_fs - a.skipped_fs,
                                  .skipped_off = b.skipped_off - a.skipped_off,
                                  .failed = b.failed - a.failed};
}

static void test_open_segment_is_written_through(void **state)
{
    (void)state;
    if (!needEligible()) {
        skip();
    }
    char path[8192];
    struct segfill_stats d = allocateCounted("open-1", SEGMENT_SIZE, path, sizeof(path));
    assert_int_equal(d.filled, 1);
    assert_int_equal(d.bytes, SEGMENT_SIZE);
    assert_int_equal(d.failed, 0);
    unsigned total, unwritten;
    extentsOf(path, &total, &unwritten);
    assert_true(total >= 1);
    assert_int_equal(unwritten, 0);
    /* What raft_uv reads back: zeros, as from the unwritten extent before. */
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    static uint8_t buf[1 << 16], zeros[1 << 16];
    for (off_t off = 0; off < SEGMENT_SIZE; off += SEGMENT_SIZE / 4) {
        assert_int_equal(pread(fd, buf, sizeof(buf), off), sizeof(buf));
        assert_memory_equal(buf, zeros, sizeof(buf));
    }
    close(fd);
}

/* The control: what fallocate leaves is seen as unwritten (so the test above can fail),
 * and a file that is not an open segment (raft_uv's capability probe) is left so. */
static void test_other_files_are_left_alone(void **state)
{
    (void)state;
    if (!needEligible()) {
        skip();
    }
    char path[8192];
    struct segfill_stats d = allocateCounted(".probe", 1u << 20, path, sizeof(path));
    const struct segfill_stats none = {0};
    assert_memory_equal(&d, &none, sizeof(d));
    unsigned total, unwritten;
    extentsOf(path, &total, &unwritten);
    assert_true(unwritten >= 1);
}

static void test_turned_off_leaves_segments_as_allocated(void **state)
{
    (void)state;
    if (!needEligible()) {
        skip();
    }
    segfill_set_enabled(false);
    char path[8192];
    struct segfill_stats d = allocateCounted("open-2", SEGMENT_SIZE, path, sizeof(path));
    segfill_set_enabled(true);
    assert_int_equal(d.skipped_off, 1);
    assert_int_equal(d.filled, 0);
    assert_int_equal(d.bytes, 0);
    unsigned total, unwritten;
    extentsOf(path, &total, &unwritten);
    assert_true(unwritten >= 1);
}

/* tmpfs has no unwritten extents: nothing is written. */
static void test_tmpfs_is_left_alone(void **state)
{
    (void)state;
    struct statfs fs;
    if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
        skipped_any = true;
        print_message("/dev/shm is not tmpfs\n");
        skip();
    }
    char tdir[64] = "/dev/shm/idem-segfill-XXXXXX";
    assert_non_null(mkdtemp(tdir));
    struct segfill_stats a, b;
    segfill_get_stats(&a);
    char errmsg[RAFT_ERRMSG_BUF_SIZE] = "";
    uv_file fd = -1;
    int rv = __wrap_UvFsAllocateFile(tdir, "open-1", 1u << 20, &fd, errmsg);
    if (fd >= 0) {
        close(fd);
    }
    segfill_get_stats(&b);
    assert_int_equal(tmpdir_remove(tdir), 0);
    assert_int_equal(rv, 0);
    assert_int_equal(b.skipped_fs - a.skipped_fs, 1);
    assert_int_equal(b.filled - a.filled, 0);
    assert_int_equal(b.bytes - a.bytes, 0);
}

/* raft_uv itself, linked as idemd links it: the open segment it appends into was written
 * through before the append (the link's --wrap reaches raft_uv's own call). */
static void test_raft_uv_appends_into_a_written_segment(void **state)
{
    (void)state;
    if (!needEligible()) {
        skip();
    }
    struct segfill_stats a, b;
    segfill_get_stats(&a);
    struct uvlog log;
    uvlog_open(&log, dir);
    uvlog_append_one(&log, 1);
    char path[8192];
    snprintf(path, sizeof(path), "%s/open-1", dir);
    unsigned total, unwritten;
    extentsOf(path, &total, &unwritten);
    segfill_get_stats(&b);
    uvlog_close(&log);
    assert_true(total >= 1);
    assert_int_equal(unwritten, 0);
    assert_true(b.filled - a.filled >= 1);
    assert_int_equal(b.failed - a.failed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_segment_is_written_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_files_are_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_turned_off_leaves_segments_as_allocated, setup,
                                        teardown),
        cmocka_unit_test(test_tmpfs_is_left_alone),
        cmocka_unit_test_setup_teardown(test_raft_uv_appends_into_a_written_segment, setup,
                                        teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed == 0 && skipped_any ? 77 : failed;
}
