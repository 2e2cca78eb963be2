/* Unit tests of cluster/raft015/segtail.c. The segments are written by raft_uv itself (libraft
 * 0.15, linked as idemd links it) in a child process that exits without closing it, as a
 * node killed before raft_uv closed its open segment; raft_uv loads them in another child
 * (its loader may abort, which must not take the test with it). Segments of 16 KiB, one
 * entry sized so that its batch ends a chosen number of bytes before the end of the file.
 * The files are made in a fresh directory under /tmp (tmpdir_make), removed at teardown. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "segtail.h"
#include "tmpdir.h"

#define SEG 16384u      /* raft_uv segment size in these tests */
#define BATCH_FIXED 32u /* a one-entry batch: checksums, count, one entry header */
#define FORMAT_BYTES 8u /* the segment's format version */
#define PATTERN 0x5a
#define LOADED_OK 40 /* a loading child's exit code: one entry, its data intact */

static char dir[4096];

static int setup(void **state)
{
    (void)state;
    return tmpdir_make(dir, sizeof(dir), "idem-segtail");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_remove(dir);
}

static bool appended;

static void appendCb(struct raft_io_append *req, int status)
{
    (void)req;
    appended = status == 0;
}

/* In the child: raft_uv on dir, loaded; 0 or why not. */
static int openIo(uv_loop_t *loop, struct raft_uv_transport *t, struct raft_io *io,
                  struct raft_entry **entries, size_t *n)
{
    if (uv_loop_init(loop) != 0 || raft_uv_tcp_init(t, loop) != 0 ||
        raft_uv_init(io, loop, dir, t) != 0) {
        return 11;
    }
    raft_uv_set_segment_size(io, SEG);
    if (io->init(io, 1, "127.0.0.1:9") != 0) {
        return 12;
    }
    raft_term term;
    raft_id vote;
    struct raft_snapshot *snap;
    raft_index start;
    return io->load(io, &term, &vote, &snap, &start, entries, n) != 0 ? 13 : 0;
}

/* One entry appended by raft_uv, whose batch ends `rest` bytes before the end of the open
 * segment; the child then exits without closing anything. */
static void writeAndDie(size_t rest)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uv_loop_t loop;
        struct raft_uv_transport t;
        struct raft_io io;
        struct raft_entry *entries;
        size_t n;
        int rv = openIo(&loop, &t, &io, &entries, &n);
        if (rv != 0 || n != 0) {
            _exit(rv != 0 ? rv : 14);
        }
        static struct raft_entry e = {.term = 1, .type = RAFT_COMMAND};
        e.buf.len = SEG - FORMAT_BYTES - BATCH_FIXED - rest;
        e.buf.base = raft_malloc(e.buf.len);
        memset(e.buf.base, PATTERN, e.buf.len);
        static struct raft_io_append req;
        if (io.append(&io, &req, &e, 1, appendCb) != 0) {
            _exit(20);
        }
        for (int i = 0; i < 10000 && !appended; i++) {
            uv_run(&loop, UV_RUN_ONCE);
        }
        _exit(appended ? 0 : 21); /* killed: no close, no finalize */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* raft_uv loads dir in a child: its wait status. LOADED_OK: one entry, its data as
 * writeAndDie(rest) wrote it. */
static int loadInChild(size_t rest)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDERR_FILENO); /* the abort's report */
        }
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* and no core file */
        uv_loop_t loop;
        struct raft_uv_transport t;
        struct raft_io io;
        struct raft_entry *entries = NULL;
        size_t n = 0;
        int rv = openIo(&loop, &t, &io, &entries, &n);
        if (rv != 0) {
            _exit(rv);
        }
        if (n != 1 || entries[0].buf.len != SEG - FORMAT_BYTES - BATCH_FIXED - rest) {
            _exit(30 + (int)(n < 9 ? n : 9));
        }
        const uint8_t *p = entries[0].buf.base;
        for (size_t i = 0; i < entries[0].buf.len; i++) {
            if (p[i] != PATTERN) {
                _exit(39);
            }
        }
        _exit(LOADED_OK);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static off_t sizeOf(const char *name)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static void copyDir(const char *to)
{
    char cmd[12000];
    snprintf(cmd, sizeof(cmd), "cp -a '%s/.' '%s/'", dir, to);
    assert_int_equal(system(cmd), 0);
}

/* The case itself: libraft 0.15 cannot load it (a copy of the directory is tried, so that
 * what its failed load may have changed does not count), and after the repair it loads the
 * entry as written. */
static void test_tail_of_8_bytes_is_trimmed(void **state)
{
    (void)state;
    writeAndDie(8);
    assert_int_equal(sizeOf("open-1"), SEG);

    char keep[sizeof(dir)];
    snprintf(keep, sizeof(keep), "%s", dir);
    char copy[4096];
    assert_int_equal(tmpdir_make(copy, sizeof(copy), "idem-segtail-copy"), 0);
    copyDir(copy);
    snprintf(dir, sizeof(dir), "%s", copy);
    int status = loadInChild(8);
    snprintf(dir, sizeof(dir), "%s", keep);
    assert_int_equal(tmpdir_remove(copy), 0);
    /* libraft 0.15 frees what it loaded twice: abort(3) from glibc, or ASan's report and
     * exit code 1 unless its options say abort. A later libraft that loads this segment,
     * or fails with an error of its own (13), may no longer need the repair: segtail.h. */
    assert_true((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) ||
                (WIFEXITED(status) && WEXITSTATUS(status) == 1));

    char msg[256];
    assert_int_equal(segtail_repair(dir, msg, sizeof(msg)), 1);
    assert_string_equal(msg, "open-1");
    assert_int_equal(sizeOf("open-1"), SEG - 8);
    status = loadInChild(8);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), LOADED_OK);

    /* Loaded, raft_uv closed the segment: nothing left to trim. */
    assert_int_equal(segtail_repair(dir, msg, sizeof(msg)), 0);
    assert_string_equal(msg, "");
}

/* Tails the loader takes as they are: the files are left as they were, and load. */
static void test_other_tails_are_left_alone(void **state)
{
    (void)state;
    static const size_t rests[] = {0, 16, 24, 4096};
    for (size_t i = 0; i < sizeof(rests) / sizeof(rests[0]); i++) {
        assert_int_equal(tmpdir_remove(dir), 0);
        assert_int_equal(mkdir(dir, 0700), 0);
        writeAndDie(rests[i]);
        char msg[256];
        assert_int_equal(segtail_repair(dir, msg, sizeof(msg)), 0);
        assert_int_equal(sizeOf("open-1"), SEG);
        int status = loadInChild(rests[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), LOADED_OK);
    }
}

static void writeFile(const char *name, const void *data, size_t len)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* A segment of format 1 with one batch of one entry of len bytes (its data zero), then
 * tail bytes of fill; count overrides the entry count when not 0. Its length. */
static size_t segment(uint8_t *buf, uint32_t len, uint64_t count, size_t tail, uint8_t fill)
{
    memset(buf, 0, 4096);
    put64(buf, 1);
    put64(buf + 16, count != 0 ? count : 1);
    put64(buf + 24, 1);
    put32(buf + 36, len);
    size_t end = 40 + ((len + 7u) & ~7u);
    memset(buf + end, fill, tail);
    return end + tail;
}

/* What the walk must not trim, and what it must not choke on. */
static void test_what_is_left_alone(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct {
        const char *name;
        size_t len;
    } files[] = {
        {"open-1", segment(buf, 104, 0, 8, 0xff)}, /* the tail is not zero */
        {"open-2", 0},                             /* empty */
        {"open-3", 5},                             /* shorter than the version */
        {"open-4", 16},                            /* version 0 and 8 zero bytes */
        {"open-5", 0},                             /* version 1, no batch, 8 zeros */
        {"open-6", 0},                             /* an entry count past the end */
        {"open-7", 0},                             /* data past the end */
        {"open-8", 0},                             /* a count of 2^63 */
        {"open-12", 0},                            /* a length not padded */
        {"0000000000000001-0000000000000001", 0},  /* closed: not walked */
        {"open-x", 0},                             /* not raft_uv's name */
    };
    writeFile(files[0].name, buf, files[0].len);
    writeFile(files[1].name, buf, 0);
    memset(buf, 0, sizeof(buf));
    writeFile(files[2].name, buf, 5);
    writeFile(files[3].name, buf, 16);
    put64(buf, 1);
    writeFile(files[4].name, buf, files[4].len = 16);
    files[5].len = segment(buf, 104, 1000, 8, 0);
    writeFile(files[5].name, buf, files[5].len);
    files[6].len = segment(buf, 104, 0, 8, 0) - 40;
    writeFile(files[6].name, buf, files[6].len);
    files[7].len = segment(buf, 104, UINT64_C(1) << 63, 8, 0);
    writeFile(files[7].name, buf, files[7].len);
    files[8].len = segment(buf, 100, 0, 8, 0); /* 100 bytes, padded to 104 */
    writeFile(files[8].name, buf, files[8].len);
    files[9].len = segment(buf, 104, 0, 8, 0);
    writeFile(files[9].name, buf, files[9].len);
    files[10].len = files[9].len;
    writeFile(files[10].name, buf, files[10].len);
    char path[8192];
    snprintf(path, sizeof(path), "%s/open-9", dir);
    assert_int_equal(mkdir(path, 0700), 0); /* a directory of that name */
    snprintf(path, sizeof(path), "%s/open-10", dir);
    assert_int_equal(symlink("0000000000000001-0000000000000001", path), 0);

    char msg[256];
    assert_int_equal(segtail_repair(dir, msg, sizeof(msg)), 0);
    assert_string_equal(msg, "");
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        assert_int_equal(sizeOf(files[i].name), files[i].len);
    }

    /* The same batch with a zero tail of 8 bytes is trimmed, whatever its (unchecked)
     * checksums. */
    size_t len = segment(buf, 104, 0, 8, 0);
    writeFile("open-11", buf, len);
    assert_int_equal(segtail_repair(dir, msg, sizeof(msg)), 1);
    assert_string_equal(msg, "open-11");
    assert_int_equal(sizeOf("open-11"), len - 8);
}

/* segtail_zeros: a segment raft_uv prepared and never wrote goes, the zeros after the last
 * batch of the one in use go, and raft_uv loads what is left as it loaded the original. */
static void test_zeros_go_before_the_load(void **state)
{
    (void)state;
    writeAndDie(4096);
    static uint8_t zeros[SEG];
    writeFile("open-7", zeros, SEG); /* prepared ahead, never written */
    writeFile("open-8", zeros, 8);   /* only a format version of 0 */
    unsigned removed = 0, trimmed = 0;
    char msg[256];
    assert_int_equal(segtail_zeros(dir, &removed, &trimmed, msg, sizeof(msg)), 0);
    assert_int_equal(trimmed, 1);
    assert_int_equal(sizeOf("open-1"), SEG - 4096);
    char path[8192];
    snprintf(path, sizeof(path), "%s/open-7", dir);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof(path), "%s/open-8", dir);
    assert_int_equal(access(path, F_OK), -1);
    assert_true(removed >= 2); /* and those raft_uv prepared itself, if any */
    int status = loadInChild(4096);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), LOADED_OK);

    /* Nothing left to do: the segment is closed, no open one is left. */
    assert_int_equal(segtail_zeros(dir, &removed, &trimmed, msg, sizeof(msg)), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(trimmed, 0);
}

/* What segtail_zeros leaves to raft_uv's loader: any byte that is not zero, what is not a
 * segment file, a walk that stops short. */
static void test_zeros_leaves_the_rest(void **state)
{
    (void)state;
    uint8_t buf[4096];
    size_t len1 = segment(buf, 104, 0, 3000, 0);
    buf[len1 - 1] = 1; /* a non-zero byte far past the batch */
    writeFile("open-1", buf, len1);
    memset(buf, 0, sizeof(buf));
    buf[4000] = 7; /* format 0, but not all zero */
    writeFile("open-2", buf, sizeof(buf));
    writeFile("open-3", buf, 5);                  /* shorter than a format version */
    size_t len4 = segment(buf, 104, 1000, 64, 0); /* a count past the end: walk stops */
    writeFile("open-4", buf, len4);
    size_t len5 = segment(buf, 104, 0, 0, 0); /* ends with its batch */
    writeFile("open-5", buf, len5);
    memset(buf, 0, sizeof(buf));
    writeFile("0000000000000001-0000000000000001", buf, sizeof(buf)); /* closed */
    writeFile("open-x", buf, sizeof(buf));                            /* not raft_uv's */
    char path[8192];
    snprintf(path, sizeof(path), "%s/open-9", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/open-10", dir);
    assert_int_equal(symlink("0000000000000001-0000000000000001", path), 0);

    unsigned removed = 9, trimmed = 9;
    char msg[256];
    assert_int_equal(segtail_zeros(dir, &removed, &trimmed, msg, sizeof(msg)), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(trimmed, 0);
    assert_int_equal(sizeOf("open-1"), len1);
    assert_int_equal(sizeOf("open-2"), sizeof(buf));
    assert_int_equal(sizeOf("open-3"), 5);
    assert_int_equal(sizeOf("open-4"), len4);
    assert_int_equal(sizeOf("open-5"), len5);
    assert_int_equal(sizeOf("0000000000000001-0000000000000001"), sizeof(buf));
    assert_int_equal(sizeOf("open-x"), sizeof(buf));

    snprintf(path, sizeof(path), "%s/missing", dir);
    assert_int_equal(segtail_zeros(path, &removed, &trimmed, msg, sizeof(msg)), -1);
    assert_non_null(strstr(msg, "No such file or directory"));
}

static void test_unreadable_directory_is_an_error(void **state)
{
    (void)state;
    char path[8192];
    snprintf(path, sizeof(path), "%s/missing", dir);
    char msg[512];
    assert_int_equal(segtail_repair(path, msg, sizeof(msg)), -1);
    assert_non_null(strstr(msg, "No such file or directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tail_of_8_bytes_is_trimmed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_tails_are_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_what_is_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_directory_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zeros_go_before_the_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zeros_leaves_the_rest, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
