/* logdir: corrects raft_uv 0.15's log truncation that fails silently (a failed step only
 * sets a flag, and the entries written after it are read back at the wrong indexes): every
 * truncation is marked before and checked after, and an undone one is put right at the next
 * start (logdir.h explains). */
#define _GNU_SOURCE /* renameat2 */
#include "logdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *what, const char *path)
{
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
    return -1;
}

bool logdir_closed_segment(const char *name, uint64_t *first, uint64_t *end)
{
    for (int i = 0; i < 33; i++) {
        bool digit = name[i] >= '0' && name[i] <= '9';
        if (i == 16 ? name[i] != '-' : !digit) {
            return false;
        }
    }
    if (name[33] != '\0') {
        return false;
    }
    uint64_t a = 0;
    uint64_t b = 0;
    for (int i = 0; i < 16; i++) {
        a = a * 10 + (uint64_t)(name[i] - '0');
        b = b * 10 + (uint64_t)(name[17 + i] - '0');
    }
    *first = a;
    *end = b;
    return true;
}

bool logdir_open_segment(const char *name)
{
    if (strncmp(name, "open-", 5) != 0 || name[5] == '\0') {
        return false;
    }
    for (const char *p = name + 5; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
    }
    return true;
}

/* A mark's name: the prefix and the index, 20 digits. */
static bool markIndex(const char *name, uint64_t *index)
{
    size_t n = strlen(LOGDIR_MARK_PREFIX);
    if (strncmp(name, LOGDIR_MARK_PREFIX, n) != 0 || strlen(name + n) != 20) {
        return false;
    }
    uint64_t v = 0;
    for (const char *p = name + n; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10) {
            return false;
        }
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *index = v;
    return true;
}

/* An open segment holds entries once raft_uv wrote its first block, which starts with the
 * format version (non-zero); one it prepared and has not used is zeros (its loader removes
 * those). 1 holds entries, 0 does not, -1 error. */
static int openHolds(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return -1;
    }
    uint8_t head[8];
    ssize_t n = pread(fd, head, sizeof(head), 0);
    int saved = errno;
    close(fd);
    if (n < 0) {
        errno = saved;
        return -1;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (head[i] != 0) {
            return 1;
        }
    }
    return 0;
}

struct scan {
    bool any_closed;
    uint64_t closed_end; /* the last index of the closed segment that ends last */
    unsigned opens_held; /* open segments holding entries */
    uint64_t mark;       /* the lowest marked index (0: no mark) */
    bool raced;          /* an open segment went while listed (raft_uv closing it) */
};

static int scanDir(const char *dir, struct scan *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    DIR *d = opendir(dir);
    if (d == NULL) {
        return fail(err, errlen, "list", dir);
    }
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        uint64_t a, b;
        if (logdir_closed_segment(e->d_name, &a, &b)) {
            if (!s->any_closed || b > s->closed_end) {
                s->closed_end = b;
            }
            s->any_closed = true;
        } else if (markIndex(e->d_name, &a)) {
            if (s->mark == 0 || a < s->mark) {
                s->mark = a;
            }
        } else if (logdir_open_segment(e->d_name)) {
            int held = openHolds(dirfd(d), e->d_name);
            if (held < 0 && errno == ENOENT) {
                s->raced = true; /* renamed to a closed segment since readdir */
            } else if (held < 0) {
                int saved = errno;
                closedir(d);
                errno = saved;
                return fail(err, errlen, "read open segment in", dir);
            }
            s->opens_held += held == 1;
        }
        errno = 0;
    }
    int saved = errno;
    closedir(d);
    if (saved != 0) {
        errno = saved;
        return fail(err, errlen, "list", dir);
    }
    return 0;
}

int logdir_sync(const char *dir, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return fail(err, errlen, "open", dir);
    }
    int rv = fsync(fd);
    int saved = errno;
    close(fd);
    if (rv != 0) {
        errno = saved;
        return fail(err, errlen, "fsync", dir);
    }
    return 0;
}

static int markPath(char *path, size_t len, const char *dir, uint64_t index)
{
    int n = snprintf(path, len, "%s/" LOGDIR_MARK_PREFIX "%020" PRIu64, dir, index);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

int logdir_truncate_begin(const char *dir, uint64_t index, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (markPath(path, sizeof(path), dir, index) != 0) {
        snprintf(err, errlen, "data directory path too long: %s", dir);
        return -1;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        return fail(err, errlen, "mkdir " LOGDIR_MARK_PREFIX "... in", dir);
    }
    return logdir_sync(dir, err, errlen);
}

int logdir_truncate_done(const char *dir, uint64_t index, char *err, size_t errlen)
{
    struct scan s;
    if (scanDir(dir, &s, err, errlen) != 0) {
        return -1;
    }
    if (s.raced) {
        snprintf(err, errlen, "an open segment was being closed while the log was listed");
        return 2;
    }
    if (s.opens_held > 1) {
        snprintf(err, errlen,
                 "%u open segments hold entries: one is a segment raft_uv has not closed",
                 s.opens_held);
        return 2;
    }
    if (s.any_closed && s.closed_end >= index) {
        snprintf(err, errlen,
                 "a closed segment still ends at %" PRIu64 ", at or past the truncation point",
                 s.closed_end);
        return 0;
    }
    return 1;
}

int logdir_truncate_end(const char *dir, uint64_t index, char *err, size_t errlen)
{
    if (index != 0) {
        char path[PATH_MAX];
        if (markPath(path, sizeof(path), dir, index) != 0) {
            snprintf(err, errlen, "data directory path too long: %s", dir);
            return -1;
        }
        if (rmdir(path) != 0 && errno != ENOENT) {
            return fail(err, errlen, "remove the truncation mark in", dir);
        }
    } else {
        /* Every mark, the lowest first, each removal seen by the next listing. */
        struct scan s;
        for (unsigned k = 0;; k++) {
            if (scanDir(dir, &s, err, errlen) != 0) {
                return -1;
            }
            if (s.mark == 0) {
                break;
            }
            if (k == 100000 || logdir_truncate_end(dir, s.mark, err, errlen) != 0) {
                if (k == 100000) {
                    snprintf(err, errlen, "the truncation mark at %" PRIu64 " in %s stays", s.mark,
                             dir);
                }
                return -1;
            }
        }
    }
    /* Durable before raft hears of the entries written since: a mark that came back after
     * a crash would have them moved aside although acknowledged. */
    return logdir_sync(dir, err, errlen);
}

/* Moves every open segment that holds entries into LOGDIR_UNTRUNCATED/ (one of an earlier
 * start's of the same name is kept, the new one under a longer name). */
static int moveOpens(const char *dir, unsigned *moved, char *err, size_t errlen)
{
    char aside[PATH_MAX];
    if (snprintf(aside, sizeof(aside), "%s/%s", dir, LOGDIR_UNTRUNCATED) >= (int)sizeof(aside)) {
        snprintf(err, errlen, "data directory path too long: %s", dir);
        return -1;
    }
    if (mkdir(aside, 0700) != 0 && errno != EEXIST) {
        return fail(err, errlen, "mkdir " LOGDIR_UNTRUNCATED " in", dir);
    }
    int afd = open(aside, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (afd < 0) {
        return fail(err, errlen, "open " LOGDIR_UNTRUNCATED " in", dir);
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        close(afd);
        return fail(err, errlen, "list", dir);
    }
    int rv = 0;
    struct dirent *e;
    while (rv == 0 && (e = readdir(d)) != NULL) {
        if (!logdir_open_segment(e->d_name)) {
            continue;
        }
        int held = openHolds(dirfd(d), e->d_name);
        if (held < 0) {
            rv = fail(err, errlen, "read open segment in", dir);
            break;
        }
        if (held == 0) {
            continue;
        }
        char to[NAME_MAX + 1];
        snprintf(to, sizeof(to), "%s", e->d_name);
        int r;
        for (unsigned k = 1; (r = renameat2(dirfd(d), e->d_name, afd, to, RENAME_NOREPLACE)) != 0 &&
                             errno == EEXIST && k < 1000;
             k++) {
            snprintf(to, sizeof(to), "%.200s.%u", e->d_name, k);
        }
        if (r != 0) {
            rv = fail(err, errlen, "move an open segment into " LOGDIR_UNTRUNCATED " in", dir);
        } else {
            (*moved)++;
        }
    }
    closedir(d);
    if (rv == 0 && fsync(afd) != 0) {
        rv = fail(err, errlen, "fsync " LOGDIR_UNTRUNCATED " in", dir);
    }
    close(afd);
    if (rv == 0) {
        rv = logdir_sync(dir, err, errlen);
    }
    struct scan s;
    if (rv == 0 && scanDir(dir, &s, err, errlen) == 0 && (s.opens_held != 0 || s.raced)) {
        snprintf(err, errlen, "open segments holding entries are still in %s", dir);
        rv = -1;
    }
    return rv;
}

struct closed {
    uint64_t first, end;
    char name[34];
};

static int byFirstThenLongest(const void *pa, const void *pb)
{
    const struct closed *a = pa;
    const struct closed *b = pb;
    if (a->first != b->first) {
        return a->first < b->first ? -1 : 1;
    }
    return a->end > b->end ? -1 : a->end < b->end ? 1 : 0;
}

/* What a truncation stopped halfway leaves (raft_uv writes the kept part of the segment
 * under a new name, then deletes that segment and the later ones): two closed segments
 * from one first index, or segments that start at or past the mark. Entries from the mark
 * on are neither committed nor acknowledged since (the mark says so), so the longer of two
 * (the one raft_uv had not deleted yet, whole) is kept and those past the mark go: the
 * log is then as it was before the truncation, or as after it. */
static int dropHalfTruncated(const char *dir, uint64_t mark, unsigned *dropped, char *err,
                             size_t errlen)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return fail(err, errlen, "list", dir);
    }
    struct closed *list = NULL;
    size_t n = 0, cap = 0;
    int rv = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        struct closed c;
        if (!logdir_closed_segment(e->d_name, &c.first, &c.end)) {
            errno = 0;
            continue;
        }
        if (n == cap) {
            size_t ncap = cap == 0 ? 64 : cap * 2;
            struct closed *bigger = realloc(list, ncap * sizeof(*list));
            if (bigger == NULL) {
                rv = fail(err, errlen, "list", dir);
                break;
            }
            list = bigger;
            cap = ncap;
        }
        memcpy(c.name, e->d_name, sizeof(c.name));
        list[n++] = c;
        errno = 0;
    }
    if (rv == 0 && errno != 0) {
        rv = fail(err, errlen, "list", dir);
    }
    if (rv == 0 && n > 0) {
        qsort(list, n, sizeof(*list), byFirstThenLongest);
        for (size_t i = 0; i < n && rv == 0; i++) {
            bool past = list[i].first >= mark && mark > 1;
            bool shorter = i > 0 && list[i].first == list[i - 1].first;
            if ((past || shorter) && unlinkat(dirfd(d), list[i].name, 0) != 0) {
                rv = fail(err, errlen, "remove a segment of a halfway truncation in", dir);
            } else if (past || shorter) {
                (*dropped)++;
            }
        }
    }
    free(list);
    closedir(d);
    return rv == 0 && *dropped > 0 ? logdir_sync(dir, err, errlen) : rv;
}

int logdir_recover(const char *dir, char *msg, size_t msglen)
{
    msg[0] = '\0';
    struct scan s;
    char err[512];
    if (scanDir(dir, &s, err, sizeof(err)) != 0) {
        snprintf(msg, msglen, "cannot check the log for a truncation left undone: %s", err);
        return -1;
    }
    if (s.mark == 0) {
        return 0;
    }
    unsigned dropped = 0;
    if (dropHalfTruncated(dir, s.mark, &dropped, err, sizeof(err)) != 0 ||
        scanDir(dir, &s, err, sizeof(err)) != 0) {
        snprintf(msg, msglen, "the log truncation from index %" PRIu64 " was left undone, and: %s",
                 s.mark, err);
        return -1;
    }
    unsigned moved = 0;
    if (s.any_closed && s.closed_end + 1 >= s.mark) {
        if (moveOpens(dir, &moved, err, sizeof(err)) != 0) {
            snprintf(msg, msglen,
                     "the log truncation from index %" PRIu64
                     " was not done, and the entries written after it cannot be moved "
                     "aside: %s",
                     s.mark, err);
            return -1;
        }
    } else if (s.opens_held > 1) {
        snprintf(msg, msglen,
                 "the log truncation from index %" PRIu64
                 " was not checked before this node stopped, and its log cannot be put right "
                 "from here (its closed segments end at %" PRIu64
                 ", %u open segments hold entries): remove the data directory %s and start "
                 "the node again; it rejoins from the leader's snapshot",
                 s.mark, s.closed_end, s.opens_held, dir);
        return -1;
    }
    if (logdir_truncate_end(dir, 0, err, sizeof(err)) != 0) {
        snprintf(msg, msglen, "%s", err);
        return -1;
    }
    if (moved > 0 || dropped > 0) {
        snprintf(msg, msglen,
                 "the log truncation from index %" PRIu64
                 " had not been done when this node stopped: moved the %u open segment%s "
                 "written after it (never acknowledged) into %s/%s%s; the node starts from its "
                 "log as it was before the truncation",
                 s.mark, moved, moved == 1 ? "" : "s", dir, LOGDIR_UNTRUNCATED,
                 dropped > 0 ? ", and removed what it had left halfway" : "");
    } else {
        snprintf(msg, msglen,
                 "a log truncation from index %" PRIu64
                 " was marked but not checked when this node stopped; its log is whole (closed "
                 "segments end at %" PRIu64 ")",
                 s.mark, s.any_closed ? s.closed_end : 0);
    }
    return 0;
}
