/* segtrim: a closing raft_uv segment's unused rest freed in steps (segtrim.h explains why). */
#include "segtrim.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096 /* steps end on a block boundary */

int __real_UvFsTruncateAndRenameFile(const char *dir, size_t size, const char *filename1,
                                     const char *filename2, char *errmsg);

static atomic_uint pauseUs = SEGTRIM_PAUSE_US;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct segtrim_stats stats;

void segtrim_set_pause_us(unsigned us)
{
    atomic_store(&pauseUs, us);
}

void segtrim_get_stats(struct segtrim_stats *s)
{
    pthread_mutex_lock(&mu);
    *s = stats;
    pthread_mutex_unlock(&mu);
}

static void pause_(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The step for `excess` bytes above the target: SEGTRIM_STEP, or more so that there are at
 * most SEGTRIM_MAX_STEPS of them; a whole number of blocks. */
static off_t stepFor(off_t excess)
{
    off_t step = (excess + SEGTRIM_MAX_STEPS - 1) / SEGTRIM_MAX_STEPS;
    if (step < (off_t)SEGTRIM_STEP) {
        step = SEGTRIM_STEP;
    }
    return (step + BLOCK - 1) / BLOCK * BLOCK;
}

/* Shrinks dir/name step by step from its end, never below `size`; the rest (less than a
 * step) is left to raft_uv's truncation. Counts what it did. */
static void shrinkStepwise(const char *dir, const char *name, size_t size)
{
    char path[4096];
    int len = snprintf(path, sizeof(path), "%s/%s", dir, name);
    bool failed = false;
    uint64_t steps = 0, freed = 0;
    int fd = len > 0 && (size_t)len < sizeof(path) ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0) {
        failed = true;
    } else {
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            failed = true;
        } else if (sb.st_size > (off_t)size) {
            off_t cur = sb.st_size;
            off_t step = stepFor(cur - (off_t)size);
            unsigned us = atomic_load(&pauseUs);
            while (cur - step >= (off_t)size) {
                if (ftruncate(fd, cur - step) != 0) {
                    failed = true;
                    break;
                }
                cur -= step;
                steps++;
                freed += (uint64_t)step;
                if (us != 0) {
                    pause_(us);
                }
            }
        }
        close(fd);
    }
    pthread_mutex_lock(&mu);
    stats.closed++;
    if (steps > 0) {
        stats.stepped++;
    }
    stats.steps += steps;
    stats.step_bytes += freed;
    if (failed) {
        stats.step_failed++;
    }
    pthread_mutex_unlock(&mu);
}

int __wrap_UvFsTruncateAndRenameFile(const char *dir, size_t size, const char *filename1,
                                     const char *filename2, char *errmsg)
{
    shrinkStepwise(dir, filename1, size);
    return __real_UvFsTruncateAndRenameFile(dir, size, filename1, filename2, errmsg);
}
