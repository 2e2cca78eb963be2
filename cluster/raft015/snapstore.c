/* snapstore: corrects raft_uv 0.15's snapshot write in one go (the whole file to the disk
 * at once, every log write on that disk queued behind it): the data goes to a file of our
 * own, written paced, and raft_uv stores a small reference (snapstore.h explains). */
#define _GNU_SOURCE /* sync_file_range */
#include "snapstore.h"

#include "logdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static const char MAGIC[8] = {'I', 'D', 'E', 'M', 'S', 'N', 'P', '1'};
#define PREFIX "idem-snapshot-"

static void putU64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t getU64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

void snapstore_ref_encode(const struct snapstore_ref *r, uint8_t out[SNAPSTORE_REF_SIZE])
{
    memcpy(out, MAGIC, sizeof(MAGIC));
    putU64(out + 8, r->term);
    putU64(out + 16, r->index);
    putU64(out + 24, r->size);
    putU64(out + 32, r->hash);
    putU64(out + 40, 0);
}

bool snapstore_ref_decode(const void *buf, size_t len, struct snapstore_ref *r)
{
    const uint8_t *p = buf;
    if (buf == NULL || len != SNAPSTORE_REF_SIZE || memcmp(p, MAGIC, sizeof(MAGIC)) != 0 ||
        getU64(p + 40) != 0) {
        return false;
    }
    r->term = getU64(p + 8);
    r->index = getU64(p + 16);
    r->size = getU64(p + 24);
    r->hash = getU64(p + 32);
    return true;
}

static int fail(char *err, size_t errlen, const char *what, const char *path)
{
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
    return -1;
}

static int pathOf(char *out, size_t cap, const char *dir, uint64_t term, uint64_t index,
                  const char *suffix)
{
    int n = snprintf(out, cap, "%s/" PREFIX "%" PRIu64 "-%" PRIu64 "%s", dir, term, index, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

static int writeAll(int fd, const uint8_t *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static bool stopped(const atomic_bool *stop)
{
    return stop != NULL && atomic_load_explicit(stop, memory_order_relaxed);
}

static uint64_t monoUs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The pause after a chunk that took `took` µs to write and push to the disk: as long again,
 * within [cap / 4, cap] (snapstore.h, snapstore_write). */
static unsigned chunkPause(uint64_t took, unsigned cap)
{
    unsigned floor = cap / 4;
    if (took < floor) {
        return floor;
    }
    return took > cap ? cap : (unsigned)took;
}

static void pause_(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int snapstore_write(const char *dir, uint64_t term, uint64_t index, const struct raft_buffer bufs[],
                    unsigned n, unsigned pause_us, const atomic_bool *stop,
                    struct snapstore_ref *out, char *err, size_t errlen)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    if (pathOf(tmp, sizeof(tmp), dir, term, index, ".tmp") != 0 ||
        pathOf(path, sizeof(path), dir, term, index, "") != 0) {
        snprintf(err, errlen, "snapshot path in %s: too long", dir);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return fail(err, errlen, "create", tmp);
    }
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    off_t off = 0;
    uint64_t chunk_start = 0;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *p = bufs[i].base;
        size_t left = bufs[i].len;
        while (left > 0) {
            if (off % SNAPSTORE_CHUNK == 0 && stopped(stop)) {
                close(fd);
                unlink(tmp);
                snprintf(err, errlen, "snapshot write stopped: the node is closing");
                return SNAPSTORE_STOPPED;
            }
            if (off % SNAPSTORE_CHUNK == 0) {
                chunk_start = monoUs();
            }
            /* Chunks are aligned to file offsets, so every push but the last is a full one. */
            size_t c = SNAPSTORE_CHUNK - (size_t)(off % SNAPSTORE_CHUNK);
            if (c > left) {
                c = left;
            }
            if (writeAll(fd, p, c, off) != 0) {
                goto err_io;
            }
            XXH3_64bits_update(&st, p, c);
            p += c;
            left -= c;
            off += (off_t)c;
            if (off % SNAPSTORE_CHUNK == 0) {
                /* Push this chunk to the disk and wait for it, then give the log's writes
                 * the disk for as long again (snapstore.h). */
                if (sync_file_range(fd, off - SNAPSTORE_CHUNK, SNAPSTORE_CHUNK,
                                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                        SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
                    goto err_io;
                }
                if (pause_us != 0) {
                    pause_(chunkPause(monoUs() - chunk_start, pause_us));
                }
            }
        }
    }
    if (fdatasync(fd) != 0) {
        goto err_io;
    }
    if (close(fd) != 0) {
        fd = -1;
        goto err_io;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        fail(err, errlen, "rename", tmp);
        unlink(tmp);
        return -1;
    }
    if (logdir_sync(dir, err, errlen) != 0) {
        return -1;
    }
    out->term = term;
    out->index = index;
    out->size = (uint64_t)off;
    out->hash = XXH3_64bits_digest(&st);
    return 0;

err_io:
    fail(err, errlen, "write", tmp);
    if (fd >= 0) {
        close(fd);
    }
    unlink(tmp);
    return -1;
}

/* Opens the data file of r in dir for reading, its path written to path (PATH_MAX bytes),
 * after checking that its size is the one r gives. The descriptor, or -1 with why in err. */
static int openChecked(const char *dir, const struct snapstore_ref *r, char *path, char *err,
                       size_t errlen)
{
    if (pathOf(path, PATH_MAX, dir, r->term, r->index, "") != 0) {
        snprintf(err, errlen, "snapshot path in %s: too long", dir);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return fail(err, errlen, "open", path);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        fail(err, errlen, "stat", path);
        close(fd);
        return -1;
    }
    if ((uint64_t)sb.st_size != r->size || r->size > SIZE_MAX) {
        snprintf(err, errlen, "%s: %lld bytes, the reference says %" PRIu64, path,
                 (long long)sb.st_size, r->size);
        close(fd);
        return -1;
    }
    return fd;
}

int snapstore_read(const char *dir, const struct snapstore_ref *r, void **data, char *err,
                   size_t errlen)
{
    char path[PATH_MAX];
    int fd = openChecked(dir, r, path, err, errlen);
    if (fd < 0) {
        return -1;
    }
    uint8_t *buf = raft_malloc(r->size > 0 ? (size_t)r->size : 1);
    if (buf == NULL) {
        snprintf(err, errlen, "%s: out of memory for %" PRIu64 " bytes", path, r->size);
        close(fd);
        return -1;
    }
    size_t got = 0;
    while (got < r->size) {
        ssize_t n = pread(fd, buf + got, (size_t)r->size - got, (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            if (n == 0) {
                errno = EIO;
            }
            fail(err, errlen, "read", path);
            raft_free(buf);
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    if (XXH3_64bits(buf, (size_t)r->size) != r->hash) {
        snprintf(err, errlen, "%s: content does not match its hash (corrupt)", path);
        raft_free(buf);
        return -1;
    }
    *data = buf;
    return 0;
}

int snapstore_map(const char *dir, const struct snapstore_ref *r, void **data, bool *mapped,
                  char *err, size_t errlen)
{
    *mapped = false;
    if (r->size == 0) {
        return snapstore_read(dir, r, data, err, errlen);
    }
    char path[PATH_MAX];
    int fd = openChecked(dir, r, path, err, errlen);
    if (fd < 0) {
        return -1;
    }
    void *p = mmap(NULL, (size_t)r->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        fail(err, errlen, "map", path);
        close(fd);
        return -1;
    }
    close(fd);
    if (XXH3_64bits(p, (size_t)r->size) != r->hash) {
        snprintf(err, errlen, "%s: content does not match its hash (corrupt)", path);
        munmap(p, (size_t)r->size);
        return -1;
    }
    *data = p;
    *mapped = true;
    return 0;
}

void snapstore_unmap(void *data, uint64_t size)
{
    if (data != NULL) {
        munmap(data, (size_t)size);
    }
}

/* A decimal number as pathOf() writes it: digits only, no sign, no leading zero. */
static const char *parseU64(const char *p, uint64_t *v)
{
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) {
        return NULL;
    }
    uint64_t x = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (x > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) {
            return NULL;
        }
        x = x * 10 + (uint64_t)(*p - '0');
    }
    *v = x;
    return p;
}

/* "<term>-<index>" and what follows it, for names this module wrote. */
static bool parseName(const char *p, uint64_t *term, uint64_t *index, const char **rest)
{
    p = parseU64(p, term);
    if (p == NULL || *p != '-') {
        return false;
    }
    p = parseU64(p + 1, index);
    if (p == NULL) {
        return false;
    }
    *rest = p;
    return true;
}

/* Deleting a large file frees its blocks at once; with online discard (ext4 -o discard, as
 * on the machine measured) the device trims them while every log write on it waits: one
 * 100 MB unlink held the cluster's appends up ~40 ms. Shrinking the file step by step first
 * spreads that out. Only a file with no other name is shrunk (its data is nobody else's). */
static int pacedUnlinkAt(int dfd, const char *name, unsigned pause_us, const atomic_bool *stop)
{
    if (stopped(stop)) {
        return -1;
    }
    if (pause_us != 0) {
        int fd = openat(dfd, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            struct stat sb;
            if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_nlink == 1) {
                off_t size = sb.st_size;
                while (size > SNAPSTORE_DELETE_STEP) {
                    if (stopped(stop)) {
                        close(fd);
                        return -1; /* left for the next gc */
                    }
                    size -= SNAPSTORE_DELETE_STEP;
                    if (ftruncate(fd, size) != 0) {
                        break;
                    }
                    pause_(pause_us);
                }
            }
            close(fd);
        }
    }
    return unlinkat(dfd, name, 0);
}

int snapstore_shield(const char *dir, uint64_t index, uint64_t trailing)
{
    if (index <= trailing) {
        return 0; /* raft_uv keeps every segment */
    }
    uint64_t retain = index - trailing + 1;
    char trash[PATH_MAX];
    if (snprintf(trash, sizeof(trash), "%s/%s", dir, SNAPSTORE_TRASH) >= (int)sizeof(trash) ||
        (mkdir(trash, 0700) != 0 && errno != EEXIST)) {
        return -1;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        return -1;
    }
    int tfd = open(trash, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tfd < 0) {
        closedir(d);
        return -1;
    }
    int linked = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t first, end;
        if (logdir_closed_segment(e->d_name, &first, &end) && end < retain &&
            linkat(dirfd(d), e->d_name, tfd, e->d_name, 0) == 0) {
            linked++;
        }
    }
    close(tfd);
    closedir(d);
    return linked;
}

/* The trash: a link whose file still has another name is only a name (raft_uv kept the
 * segment); one that is the last name goes paced. */
static int emptyTrash(const char *dir, unsigned pause_us, const atomic_bool *stop)
{
    char trash[PATH_MAX];
    if (snprintf(trash, sizeof(trash), "%s/%s", dir, SNAPSTORE_TRASH) >= (int)sizeof(trash)) {
        return 0;
    }
    DIR *d = opendir(trash);
    if (d == NULL) {
        return 0;
    }
    int freed = 0;
    struct dirent *e;
    while (!stopped(stop) && (e = readdir(d)) != NULL) {
        struct stat sb;
        if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            continue;
        }
        if (sb.st_nlink > 1) {
            unlinkat(dirfd(d), e->d_name, 0);
        } else if (pacedUnlinkAt(dirfd(d), e->d_name, pause_us, stop) == 0) {
            freed++;
        }
    }
    closedir(d);
    return freed;
}

int snapstore_gc(const char *dir, uint64_t keep_older, uint64_t keep_newest, unsigned pause_us,
                 const atomic_bool *stop)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return 0;
    }
    int removed = 0;
    struct dirent *e;
    while (!stopped(stop) && (e = readdir(d)) != NULL) {
        uint64_t term, index;
        const char *rest = NULL;
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0 ||
            !parseName(e->d_name + strlen(PREFIX), &term, &index, &rest)) {
            continue;
        }
        bool tmp = strcmp(rest, ".tmp") == 0;
        if (!tmp && rest[0] != '\0') {
            continue; /* not ours */
        }
        /* Files past the newest kept one belong to a snapshot being written now. */
        if (index >= keep_newest || (!tmp && index == keep_older)) {
            continue;
        }
        if (pacedUnlinkAt(dirfd(d), e->d_name, pause_us, stop) == 0) {
            removed++;
        }
    }
    closedir(d);
    return removed + emptyTrash(dir, pause_us, stop);
}
