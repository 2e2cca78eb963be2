/* Unit test of cluster/raft015/snapstore.c: the reference raft_uv stores (encode/decode), the data
 * file written in chunks and made durable (exact content, no .tmp left, size and XXH3-64 in
 * the reference), reading it back with its size and hash checked (and refused, with a
 * message naming the file, when either is wrong), and the removal of old files. Each test
 * works in a fresh mkdtemp() directory under /tmp, removed at teardown. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "snapstore.h"
#include "tmpdir.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    return tmpdir_make(dir, sizeof(dir), "idem-snapstore");
}

static int teardown(void **state)
{
    (void)state;
    /* The directory and what snapstore made in it (idem-trash/ too). */
    return tmpdir_remove(dir);
}

static void pathOf(char *out, size_t cap, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < cap);
}

static void touch(const char *name)
{
    char path[256];
    pathOf(path, sizeof(path), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
}

static bool exists(const char *name)
{
    char path[256];
    struct stat sb;
    pathOf(path, sizeof(path), name);
    return stat(path, &sb) == 0;
}

/* The whole content of dir/name, malloc()ed; its length in *len. */
static uint8_t *slurp(const char *name, size_t *len)
{
    char path[256];
    pathOf(path, sizeof(path), name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Files in dir whose name ends with suffix. */
static int countSuffix(const char *suffix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l >= sl && strcmp(e->d_name + l - sl, suffix) == 0) {
            n++;
        }
    }
    closedir(d);
    return n;
}

/* Deterministic bytes (splitmix64 from seed): content that a wrong offset or order shows. */
static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) {
            x += 0x9E3779B97F4A7C15ull;
        }
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = (uint8_t)(z >> (8 * (i % 8)));
    }
}

/* ---- the reference ------------------------------------------------------------------- */

static void test_ref_round_trip(void **state)
{
    (void)state;
    struct snapstore_ref r = {.term = 0x0102030405060708ull,
                              .index = 0xF1F2F3F4F5F6F7F8ull,
                              .size = 300 * 1024 + 7,
                              .hash = 0xDEADBEEFCAFEBABEull};
    uint8_t buf[SNAPSTORE_REF_SIZE];
    memset(buf, 0xAA, sizeof(buf));
    snapstore_ref_encode(&r, buf);
    /* The layout snapstore.h documents: magic, then little-endian fields, then 0. */
    assert_memory_equal(buf, "IDEMSNP1", 8);
    assert_int_equal(buf[8], 0x08);
    assert_int_equal(buf[15], 0x01);
    assert_int_equal(buf[16], 0xF8);
    assert_int_equal(buf[32], 0xBE);
    for (int i = 40; i < SNAPSTORE_REF_SIZE; i++) {
        assert_int_equal(buf[i], 0);
    }
    struct snapstore_ref d;
    memset(&d, 0, sizeof(d));
    assert_true(snapstore_ref_decode(buf, sizeof(buf), &d));
    assert_int_equal(d.term, r.term);
    assert_int_equal(d.index, r.index);
    assert_int_equal(d.size, r.size);
    assert_int_equal(d.hash, r.hash);

    struct snapstore_ref zero = {0, 0, 0, 0};
    snapstore_ref_encode(&zero, buf);
    memset(&d, 0xFF, sizeof(d));
    assert_true(snapstore_ref_decode(buf, sizeof(buf), &d));
    assert_int_equal(d.term, 0);
    assert_int_equal(d.index, 0);
    assert_int_equal(d.size, 0);
    assert_int_equal(d.hash, 0);
}

/* decode refuses buf and leaves r as it was. */
static void assertRefused(const void *buf, size_t len)
{
    struct snapstore_ref r = {11, 22, 33, 44};
    assert_false(snapstore_ref_decode(buf, len, &r));
    assert_int_equal(r.term, 11);
    assert_int_equal(r.index, 22);
    assert_int_equal(r.size, 33);
    assert_int_equal(r.hash, 44);
}

static void test_ref_decode_refuses(void **state)
{
    (void)state;
    struct snapstore_ref r = {3, 7, 100, 12345};
    uint8_t good[SNAPSTORE_REF_SIZE + 1];
    snapstore_ref_encode(&r, good);
    good[SNAPSTORE_REF_SIZE] = 0;
    uint8_t buf[SNAPSTORE_REF_SIZE + 1];

    /* Wrong length: one short, one long (a valid reference followed by a byte), empty. */
    assertRefused(good, SNAPSTORE_REF_SIZE - 1);
    assertRefused(good, SNAPSTORE_REF_SIZE + 1);
    assertRefused(good, 0);
    /* NULL, with the right length. */
    assertRefused(NULL, SNAPSTORE_REF_SIZE);
    /* Wrong magic: its first and its last byte. */
    memcpy(buf, good, sizeof(buf));
    buf[0] = 'i';
    assertRefused(buf, SNAPSTORE_REF_SIZE);
    memcpy(buf, good, sizeof(buf));
    buf[7] = '2';
    assertRefused(buf, SNAPSTORE_REF_SIZE);
    /* The reserved field not zero: its first and its last byte. */
    memcpy(buf, good, sizeof(buf));
    buf[40] = 1;
    assertRefused(buf, SNAPSTORE_REF_SIZE);
    memcpy(buf, good, sizeof(buf));
    buf[47] = 0x80;
    assertRefused(buf, SNAPSTORE_REF_SIZE);
    /* raft_uv's own data (anything not a reference) of the same length. */
    memset(buf, 0, sizeof(buf));
    assertRefused(buf, SNAPSTORE_REF_SIZE);
    /* And the unchanged copy is taken. */
    memcpy(buf, good, sizeof(buf));
    assert_true(snapstore_ref_decode(buf, SNAPSTORE_REF_SIZE, &r));
}

/* ---- write and read ------------------------------------------------------------------ */

/* Writes bufs of the given sizes as snapshot term/index and checks the file and the
 * reference; returns the concatenation (malloc()ed) and the reference. */
static uint8_t *writeChecked(uint64_t term, uint64_t index, const size_t *sizes, unsigned n,
                             unsigned pause_us, struct snapstore_ref *ref, size_t *total)
{
    struct raft_buffer bufs[8];
    assert_true(n <= 8);
    size_t sum = 0;
    for (unsigned i = 0; i < n; i++) {
        sum += sizes[i];
    }
    uint8_t *all = malloc(sum + 1);
    assert_non_null(all);
    fill(all, sum, term * 1000 + index);
    size_t off = 0;
    for (unsigned i = 0; i < n; i++) {
        bufs[i].base = all + off;
        bufs[i].len = sizes[i];
        off += sizes[i];
    }
    char err[256] = "";
    memset(ref, 0, sizeof(*ref));
    int rv = snapstore_write(dir, term, index, bufs, n, pause_us, NULL, ref, err, sizeof(err));
    assert_int_equal(rv, 0);
    assert_int_equal(ref->term, term);
    assert_int_equal(ref->index, index);
    assert_int_equal(ref->size, sum);
    assert_int_equal(ref->hash, XXH3_64bits(all, sum));

    char name[64];
    snprintf(name, sizeof(name), "idem-snapshot-%llu-%llu", (unsigned long long)term,
             (unsigned long long)index);
    size_t len;
    uint8_t *file = slurp(name, &len);
    assert_int_equal(len, sum);
    if (sum > 0) {
        assert_memory_equal(file, all, sum);
    }
    free(file);
    assert_int_equal(countSuffix(".tmp"), 0);
    *total = sum;
    return all;
}

/* read returns exactly want, and so does map (mapped unless empty). */
static void readChecked(const struct snapstore_ref *ref, const uint8_t *want, size_t len)
{
    void *data = NULL;
    char err[256] = "";
    assert_int_equal(snapstore_read(dir, ref, &data, err, sizeof(err)), 0);
    assert_non_null(data);
    if (len > 0) {
        assert_memory_equal(data, want, len);
    }
    raft_free(data);
    bool mapped = false;
    data = NULL;
    assert_int_equal(snapstore_map(dir, ref, &data, &mapped, err, sizeof(err)), 0);
    assert_non_null(data);
    assert_true(mapped == (len > 0));
    if (len > 0) {
        assert_memory_equal(data, want, len);
        snapstore_unmap(data, len);
    } else {
        raft_free(data);
    }
}

static void test_write_read_across_chunks(void **state)
{
    (void)state;
    /* ~300 KiB in 3 buffers: the first ends one byte short of a chunk, the second crosses
     * the chunk boundary, the third ends inside the third chunk. */
    const size_t sizes[] = {SNAPSTORE_CHUNK - 1, 2, 170000};
    struct snapstore_ref ref;
    size_t total;
    uint8_t *all = writeChecked(2, 130, sizes, 3, 0, &ref, &total);
    assert_true(total > 2 * SNAPSTORE_CHUNK);
    readChecked(&ref, all, total);
    free(all);
}

static double monoSec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The pause after each full chunk is as long as the chunk took, within [pause_us / 4,
 * pause_us]: with chunks that take far less than a quarter of a 200 ms cap, eight of them
 * pause 50 ms each (0.4 s in all: never less), not 200 ms each (1.6 s and more with a fixed
 * pause). */
static void test_write_pauses_track_the_chunks(void **state)
{
    (void)state;
    const size_t sizes[] = {8 * SNAPSTORE_CHUNK + 1};
    struct snapstore_ref ref;
    size_t total;
    double t0 = monoSec();
    uint8_t *all = writeChecked(4, 90, sizes, 1, 200000, &ref, &total);
    double took = monoSec() - t0;
    free(all);
    if (took < 0.4 || took >= 1.55) {
        fail_msg("8 chunks paced within [50, 200] ms each took %.3f s", took);
    }
}

static void test_write_read_exact_chunks(void **state)
{
    (void)state;
    /* Buffers ending exactly on chunk boundaries, one of them empty, and a paced write. */
    const size_t sizes[] = {SNAPSTORE_CHUNK, 0, SNAPSTORE_CHUNK, 100000};
    struct snapstore_ref ref;
    size_t total;
    uint8_t *all = writeChecked(1, 7, sizes, 4, 1, &ref, &total);
    readChecked(&ref, all, total);
    free(all);
}

static void test_write_read_empty(void **state)
{
    (void)state;
    struct snapstore_ref ref;
    size_t total;
    /* No buffer at all, and one empty buffer. */
    uint8_t *all = writeChecked(1, 1, NULL, 0, 0, &ref, &total);
    assert_int_equal(total, 0);
    readChecked(&ref, all, 0);
    free(all);
    const size_t sizes[] = {0};
    all = writeChecked(1, 2, sizes, 1, 0, &ref, &total);
    assert_int_equal(ref.hash, XXH3_64bits("", 0));
    readChecked(&ref, all, 0);
    free(all);
}

/* A .tmp left by a crash, longer than the new data, does not end up in the file. */
static void test_write_replaces_stale_tmp(void **state)
{
    (void)state;
    char path[256];
    pathOf(path, sizeof(path), "idem-snapshot-4-40.tmp");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    uint8_t junk[4096];
    memset(junk, 0x5A, sizeof(junk));
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    close(fd);
    const size_t sizes[] = {1000};
    struct snapstore_ref ref;
    size_t total;
    uint8_t *all = writeChecked(4, 40, sizes, 1, 0, &ref, &total);
    readChecked(&ref, all, total);
    free(all);
}

static void test_write_into_missing_dir_fails(void **state)
{
    (void)state;
    char missing[128];
    pathOf(missing, sizeof(missing), "no-such-dir");
    uint8_t data[16] = {0};
    struct raft_buffer buf = {.base = data, .len = sizeof(data)};
    struct snapstore_ref ref = {9, 9, 9, 9};
    char err[256] = "";
    assert_int_equal(snapstore_write(missing, 1, 5, &buf, 1, 0, NULL, &ref, err, sizeof(err)), -1);
    assert_non_null(strstr(err, missing));
    assert_non_null(strstr(err, strerror(ENOENT)));
    /* out is untouched. */
    assert_int_equal(ref.term, 9);
    assert_int_equal(ref.size, 9);
}

/* A snapshot of ~300 KiB written in dir; its reference in *ref and its path in path. */
static uint8_t *writeSample(struct snapstore_ref *ref, char *path, size_t cap)
{
    const size_t sizes[] = {100000, 150000, 50003};
    size_t total;
    uint8_t *all = writeChecked(3, 77, sizes, 3, 0, ref, &total);
    pathOf(path, cap, "idem-snapshot-3-77");
    return all;
}

/* read and map refuse: -1, a message naming the file that contains `why`, *data untouched
 * (a reference whose size is 0 is read, not mapped: not tried here). */
static void assertReadRefused(const struct snapstore_ref *ref, const char *path, const char *why)
{
    for (int map = 0; map < 2; map++) {
        int sentinel;
        void *data = &sentinel;
        bool mapped = false;
        char err[512] = "";
        assert_int_equal(map ? snapstore_map(dir, ref, &data, &mapped, err, sizeof(err))
                             : snapstore_read(dir, ref, &data, err, sizeof(err)),
                         -1);
        assert_ptr_equal(data, &sentinel);
        assert_false(mapped);
        if (strstr(err, path) == NULL || strstr(err, why) == NULL) {
            fail_msg("%s: message \"%s\" should name %s and say \"%s\"", map ? "map" : "read", err,
                     path, why);
        }
    }
}

static void flipByte(const char *path, off_t at)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x01;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static void test_read_refuses_flipped_byte(void **state)
{
    (void)state;
    struct snapstore_ref ref;
    char path[256];
    uint8_t *all = writeSample(&ref, path, sizeof(path));
    flipByte(path, (off_t)(ref.size / 2));
    assertReadRefused(&ref, path, "hash");
    /* Flipped back, it reads again: the refusal was about that byte. */
    flipByte(path, (off_t)(ref.size / 2));
    readChecked(&ref, all, ref.size);
    /* The last byte, too. */
    flipByte(path, (off_t)(ref.size - 1));
    assertReadRefused(&ref, path, "hash");
    free(all);
}

static void test_read_refuses_wrong_size(void **state)
{
    (void)state;
    struct snapstore_ref ref;
    char path[256];
    uint8_t *all = writeSample(&ref, path, sizeof(path));
    /* Truncated by one byte. */
    assert_int_equal(truncate(path, (off_t)(ref.size - 1)), 0);
    assertReadRefused(&ref, path, "bytes");
    /* Longer by one byte (the original content plus one). */
    assert_int_equal(truncate(path, (off_t)(ref.size + 1)), 0);
    { /* put back the byte the first truncate cut */
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, all + ref.size - 1, 1, (off_t)(ref.size - 1)), 1);
        close(fd);
    }
    assertReadRefused(&ref, path, "bytes");
    /* Cut back to its size, it is whole again. */
    assert_int_equal(truncate(path, (off_t)ref.size), 0);
    readChecked(&ref, all, ref.size);
    /* Empty. */
    assert_int_equal(truncate(path, 0), 0);
    assertReadRefused(&ref, path, "bytes");
    free(all);
}

static void test_read_refuses_missing_file(void **state)
{
    (void)state;
    struct snapstore_ref ref;
    char path[256];
    uint8_t *all = writeSample(&ref, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    assertReadRefused(&ref, path, strerror(ENOENT));
    /* A reference to a snapshot never written. */
    struct snapstore_ref other = ref;
    other.index = 78;
    char path78[256];
    pathOf(path78, sizeof(path78), "idem-snapshot-3-78");
    assertReadRefused(&other, path78, strerror(ENOENT));
    free(all);
}

static void test_read_refuses_wrong_hash_in_ref(void **state)
{
    (void)state;
    struct snapstore_ref ref;
    char path[256];
    uint8_t *all = writeSample(&ref, path, sizeof(path));
    struct snapstore_ref bad = ref;
    bad.hash ^= 1ull << 63;
    assertReadRefused(&bad, path, "hash");
    readChecked(&ref, all, ref.size); /* the file itself is fine */
    free(all);
}

/* ---- gc ------------------------------------------------------------------------------ */

static void test_gc_removes_old_files_only(void **state)
{
    (void)state;
    static const char *snaps[] = {"idem-snapshot-1-1", "idem-snapshot-1-2", "idem-snapshot-2-3",
                                  "idem-snapshot-2-4", "idem-snapshot-3-5", "idem-snapshot-3-6"};
    static const char *unrelated[] = {
        "snapshot-1-2-3", "snapshot-1-2-3.meta", "idem-snapshot-x", "idem-snapshot-1-2.bak",
        "idem-snapshot-1-1.tmp~", "idem-snapshot-1", "idem-snapshot-1-", "open-1",
        /* names snapstore never writes (sscanf would take them) */
        "idem-snapshot--1-2", "idem-snapshot-+1-2", "idem-snapshot- 1-2", "idem-snapshot-01-02",
        "idem-snapshot-1-99999999999999999999999"};
    for (size_t i = 0; i < sizeof(snaps) / sizeof(snaps[0]); i++) {
        touch(snaps[i]);
    }
    for (size_t i = 0; i < sizeof(unrelated) / sizeof(unrelated[0]); i++) {
        touch(unrelated[i]);
    }
    touch("idem-snapshot-1-2.tmp");
    touch("idem-snapshot-2-3.tmp"); /* keep_older's data is kept, a leftover .tmp of it not */
    touch("idem-snapshot-3-7.tmp");

    assert_int_equal(snapstore_gc(dir, 3, 5, 0, NULL), 5);

    assert_false(exists("idem-snapshot-1-1"));
    assert_false(exists("idem-snapshot-1-2"));
    assert_false(exists("idem-snapshot-2-4"));
    assert_false(exists("idem-snapshot-1-2.tmp"));
    assert_false(exists("idem-snapshot-2-3.tmp"));
    assert_true(exists("idem-snapshot-2-3")); /* keep_older */
    assert_true(exists("idem-snapshot-3-5")); /* keep_newest */
    assert_true(exists("idem-snapshot-3-6")); /* past it: being written */
    assert_true(exists("idem-snapshot-3-7.tmp"));
    for (size_t i = 0; i < sizeof(unrelated) / sizeof(unrelated[0]); i++) {
        if (!exists(unrelated[i])) {
            fail_msg("gc removed %s, not one of its files", unrelated[i]);
        }
    }

    /* Again: nothing left to remove. */
    assert_int_equal(snapstore_gc(dir, 3, 5, 0, NULL), 0);
    /* A missing directory: nothing removed, no failure. */
    char missing[128];
    pathOf(missing, sizeof(missing), "no-such-dir");
    assert_int_equal(snapstore_gc(missing, 3, 5, 0, NULL), 0);
}

/* raft_uv's segments that a snapshot makes it delete are linked into idem-trash first; gc
 * frees those whose last name the trash holds (paced), and only drops the link of those
 * raft_uv kept, never shrinking a file that has another name. */
static void writeBytes(const char *name, size_t n, uint8_t seed)
{
    char path[256];
    pathOf(path, sizeof(path), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        fputc((int)(uint8_t)(i * 7 + seed), f);
    }
    assert_int_equal(fclose(f), 0);
}

static void test_shield_links_the_segments_raft_uv_deletes(void **state)
{
    (void)state;
    const char *seg1 = "0000000000000001-0000000000000100";
    const char *seg2 = "0000000000000101-0000000000000200";
    const char *seg3 = "0000000000000201-0000000000000300";
    writeBytes(seg1, 9u << 20, 1); /* over two delete steps */
    writeBytes(seg2, 5u << 20, 2);
    writeBytes(seg3, 1000, 3);
    touch("open-1");
    touch("0000000000000001-00000000000000100"); /* 17 digits: not raft_uv's */
    touch("000000000000000a-0000000000000100");

    /* No segment goes while the snapshot is within the trailing entries. */
    assert_int_equal(snapstore_shield(dir, 50, 50), 0);
    assert_false(exists(SNAPSTORE_TRASH));

    /* At 260 keeping 50, raft_uv keeps from 211: segments ending at 100 and 200 go. */
    assert_int_equal(snapstore_shield(dir, 260, 50), 2);
    char t1[128], t2[128], t3[128];
    snprintf(t1, sizeof(t1), "%s/%s", SNAPSTORE_TRASH, seg1);
    snprintf(t2, sizeof(t2), "%s/%s", SNAPSTORE_TRASH, seg2);
    snprintf(t3, sizeof(t3), "%s/%s", SNAPSTORE_TRASH, seg3);
    assert_true(exists(t1));
    assert_true(exists(t2));
    assert_false(exists(t3));
    /* Linking again (a retried snapshot) is harmless. */
    assert_int_equal(snapstore_shield(dir, 260, 50), 0);

    /* raft_uv deletes the first; the second stays (say its put failed). */
    char path[256];
    pathOf(path, sizeof(path), seg1);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(snapstore_gc(dir, 0, 1, 1, NULL), 1); /* the first's data went */
    assert_false(exists(t1));
    assert_false(exists(t2));
    size_t n = 0;
    uint8_t *b = slurp(seg2, &n);
    assert_int_equal(n, 5u << 20); /* untouched: it still had raft_uv's name */
    for (size_t i = 0; i < n; i++) {
        if (b[i] != (uint8_t)(i * 7 + 2)) {
            fail_msg("segment kept by raft_uv changed at byte %zu", i);
        }
    }
    free(b);
    assert_true(exists(seg3));
    assert_true(exists("open-1"));
    assert_true(exists("0000000000000001-00000000000000100"));
    assert_true(exists("000000000000000a-0000000000000100"));
}

/* A write asked to stop (the node is closing, io.c) leaves nothing, not even its .tmp;
 * the same write not asked to stop goes through. */
static void test_write_stops_when_asked(void **state)
{
    (void)state;
    size_t sum = 3 * SNAPSTORE_CHUNK + 17;
    uint8_t *all = malloc(sum);
    assert_non_null(all);
    fill(all, sum, 7);
    struct raft_buffer buf = {.base = all, .len = sum};
    atomic_bool stop;
    atomic_init(&stop, true);
    struct snapstore_ref ref;
    char err[256] = "";
    assert_int_equal(snapstore_write(dir, 1, 9, &buf, 1, 0, &stop, &ref, err, sizeof(err)),
                     SNAPSTORE_STOPPED);
    assert_non_null(strstr(err, "stopped"));
    assert_false(exists("idem-snapshot-1-9"));
    assert_false(exists("idem-snapshot-1-9.tmp"));
    atomic_store(&stop, false);
    assert_int_equal(snapstore_write(dir, 1, 9, &buf, 1, 0, &stop, &ref, err, sizeof(err)), 0);
    assert_true(exists("idem-snapshot-1-9"));
    assert_int_equal(ref.size, sum);
    free(all);
}

/* gc asked to stop leaves every file, old snapshots and the trash, to the next gc. */
static void test_gc_stops_when_asked(void **state)
{
    (void)state;
    touch("idem-snapshot-1-1");
    touch("idem-snapshot-1-2");
    char trash[256];
    pathOf(trash, sizeof(trash), SNAPSTORE_TRASH);
    assert_int_equal(mkdir(trash, 0700), 0);
    writeBytes(SNAPSTORE_TRASH "/0000000000000001-0000000000000100", 5u << 20, 1);
    atomic_bool stop;
    atomic_init(&stop, true);
    assert_int_equal(snapstore_gc(dir, 0, 5, 1, &stop), 0);
    assert_true(exists("idem-snapshot-1-1"));
    assert_true(exists("idem-snapshot-1-2"));
    assert_true(exists(SNAPSTORE_TRASH "/0000000000000001-0000000000000100"));
    atomic_store(&stop, false);
    assert_int_equal(snapstore_gc(dir, 0, 5, 1, &stop), 3);
    assert_false(exists("idem-snapshot-1-1"));
    assert_false(exists("idem-snapshot-1-2"));
    assert_false(exists(SNAPSTORE_TRASH "/0000000000000001-0000000000000100"));
}

/* Sets *stop once the file at path is smaller than `below` bytes (or gone), i.e. once the
 * gc has taken its first step and is in the pause after it; after 30 s without that, sets
 * it anyway and leaves `seen` false. */
struct stopWhenShrunk {
    atomic_bool *stop;
    const char *path;
    off_t below;
    bool seen;
};

static uint64_t monoMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *stopWhenShrunkMain(void *arg)
{
    struct stopWhenShrunk *sw = arg;
    uint64_t deadline = monoMs() + 30000u;
    while (monoMs() < deadline) {
        struct stat sb;
        if (stat(sw->path, &sb) != 0 || sb.st_size < sw->below) {
            sw->seen = true;
            break;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(sw->stop, true);
    return NULL;
}

/* ... and between the steps of a paced deletion: a 9 MiB file, paced 500 ms a step, asked to
 * stop during the first pause, stays, shrunk by a step (without the check between steps
 * it would be shrunk to 1 MiB and unlinked). The stop is set once the file is seen shrunk,
 * not a fixed time after the start: set before the gc's first step (a slow or loaded
 * machine) it would stop the gc before any, and the file would keep its 9 MiB. A thread
 * kept from noticing the shrink for a whole pause only makes the file shrink one more step:
 * the file still stays unless the gc ignores the stop for all eight. */
static void test_gc_stops_between_steps(void **state)
{
    (void)state;
    writeBytes("idem-snapshot-1-1", 9u << 20, 1);
    char path[256];
    pathOf(path, sizeof(path), "idem-snapshot-1-1");
    atomic_bool stop;
    atomic_init(&stop, false);
    struct stopWhenShrunk sw = {.stop = &stop, .path = path, .below = (off_t)(9u << 20)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stopWhenShrunkMain, &sw), 0);
    assert_int_equal(snapstore_gc(dir, 0, 5, 500000, &stop), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(sw.seen);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size < (off_t)(9u << 20));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shield_links_the_segments_raft_uv_deletes, setup,
                                        teardown),
        cmocka_unit_test(test_ref_round_trip),
        cmocka_unit_test(test_ref_decode_refuses),
        cmocka_unit_test_setup_teardown(test_write_read_across_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_read_exact_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_read_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_pauses_track_the_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_replaces_stale_tmp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_into_missing_dir_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_refuses_flipped_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_refuses_wrong_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_refuses_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_refuses_wrong_hash_in_ref, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_removes_old_files_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_stops_when_asked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_stops_when_asked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_stops_between_steps, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
