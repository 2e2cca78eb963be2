/* segfill: corrects raft_uv 0.15's open segments left as fallocate reserves them (unwritten
 * extents: every O_DSYNC append converts one, a journal commit and an EAGAIN retry on the
 * pool): its UvFsAllocateFile calls come here through the linker's --wrap, and the segment
 * is written through with zeros before use (segfill.h explains). */
#define _GNU_SOURCE /* O_DIRECT */
#include "segfill.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifndef XFS_SUPER_MAGIC
#define XFS_SUPER_MAGIC 0x58465342 /* linux/magic.h has it only from Linux 5.x headers */
#endif

#define CHUNK (1u << 20) /* one zero write; a multiple of any O_DIRECT alignment */
#define OPEN_PREFIX "open-"

int __real_UvFsAllocateFile(const char *dir, const char *filename, size_t size, uv_file *fd,
                            char *errmsg);

static atomic_bool disabled;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct segfill_stats stats;

void segfill_set_enabled(bool on)
{
    atomic_store(&disabled, !on);
}

void segfill_get_stats(struct segfill_stats *s)
{
    pthread_mutex_lock(&mu);
    *s = stats;
    pthread_mutex_unlock(&mu);
}

static void count(uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&mu);
    *field += n;
    pthread_mutex_unlock(&mu);
}

/* ext4 (and ext2/3, one magic) and XFS: the file systems whose fallocate leaves unwritten
 * extents that an in-place overwrite keeps (no copy on write). */
static bool hasUnwrittenExtents(int fd)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0) {
        return false;
    }
    return fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC;
}

/* Writes `size` bytes of zeros over the file at `path` (size a multiple of 4096, as
 * raft_uv's segment sizes are: a whole number of its blocks). 0, 1 (left alone: the file
 * system does not need it or takes no direct I/O), or -1 (a write failed). */
static int fill(const char *path, size_t size, uint64_t *written)
{
    *written = 0;
    int fd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        return 1; /* no O_DIRECT here (EINVAL): nothing to gain */
    }
    if (!hasUnwrittenExtents(fd)) {
        close(fd);
        return 1;
    }
    void *zeros = NULL;
    if (posix_memalign(&zeros, 4096, CHUNK) != 0) {
        close(fd);
        return -1;
    }
    memset(zeros, 0, CHUNK);
    int rc = 0;
    for (size_t off = 0; off < size && rc == 0; off += CHUNK) {
        size_t n = size - off < CHUNK ? size - off : CHUNK;
        if (pwrite(fd, zeros, n, (off_t)off) != (ssize_t)n) {
            rc = -1;
        } else {
            *written += n;
        }
    }
    /* The extents' conversion committed here, on the pool thread, not by raft_uv's first
     * O_DSYNC append into them. */
    if (rc == 0 && fdatasync(fd) != 0) {
        rc = -1;
    }
    free(zeros);
    close(fd);
    return rc;
}

int __wrap_UvFsAllocateFile(const char *dir, const char *filename, size_t size, uv_file *fd,
                            char *errmsg)
{
    int rv = __real_UvFsAllocateFile(dir, filename, size, fd, errmsg);
    if (rv != 0 || strncmp(filename, OPEN_PREFIX, strlen(OPEN_PREFIX)) != 0) {
        return rv;
    }
    if (atomic_load(&disabled)) {
        count(&stats.skipped_off, 1);
        return rv;
    }
    char path[4096];
    int len = snprintf(path, sizeof(path), "%s/%s", dir, filename);
    if (len < 0 || (size_t)len >= sizeof(path)) {
        count(&stats.failed, 1); /* raft_uv's own paths are far shorter (UV__PATH_SZ) */
        return rv;
    }
    uint64_t written;
    int rc = fill(path, size, &written);
    pthread_mutex_lock(&mu);
    if (rc == 0) {
        stats.filled++;
    } else if (rc > 0) {
        stats.skipped_fs++;
    } else {
        stats.failed++;
    }
    stats.bytes += written;
    pthread_mutex_unlock(&mu);
    return rv;
}
