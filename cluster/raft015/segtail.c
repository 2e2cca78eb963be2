/* segtail: corrects libraft 0.15's loader, which aborts at every start (a double free) on an
 * open segment whose entries end 8 bytes before its end: those 8 zero bytes are removed
 * before raft_uv loads the log (segtail.h explains). */
#include "segtail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "logdir.h"

#define FORMAT_1 1u
#define PREAMBLE 16u     /* two u32 checksums and the u64 entry count */
#define ENTRY_HEADER 16u /* u64 term, u8 type, 3 unused bytes, u32 length */
#define TAIL 8u          /* the one tail raft_uv's loader cannot take */

/* pread of exactly len bytes at off: 0, 1 when the file ends first, -1 on an error. */
static int readAt(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -1;
        }
        if (n == 0) {
            return 1;
        }
        got += (size_t)n;
    }
    return 0;
}

/* raft_uv's numbers are little endian. */
static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

/* The file read forward through a buffer: a 64 MiB segment holds some 300,000 batches, and
 * two preads per batch took 0.8 s. */
struct reader {
    int fd;
    uint64_t size;
    uint64_t base; /* the file offset of buf[0] */
    size_t len;    /* bytes of the file in buf */
    uint8_t buf[1 << 16];
};

/* The n bytes (n <= sizeof buf) at off (off + n <= size), or NULL on a read error (errno
 * set) or when the file ended sooner than its size said (errno 0). */
static const uint8_t *readerAt(struct reader *r, uint64_t off, size_t n)
{
    if (off >= r->base && off + n <= r->base + r->len) {
        return r->buf + (off - r->base);
    }
    size_t want = r->size - off < sizeof(r->buf) ? (size_t)(r->size - off) : sizeof(r->buf);
    int rv = readAt(r->fd, r->buf, want, off);
    if (rv != 0) {
        r->len = 0;
        if (rv > 0) {
            errno = 0;
        }
        return NULL;
    }
    r->base = off;
    r->len = want;
    return r->buf;
}

/* Where the batches of the open segment in r end: 0 with *end set when they end cleanly at
 * a whole batch (the rest of the file, if any, is the loader's to judge), 1 when the walk
 * stopped short of that (another format, an entry count of 0, a header or data past the
 * end: left to the loader), -1 on a read error. With zero_ends, a preamble of 16 zero bytes
 * (checksums and count) is the end instead of a stop. */
static int batchesEnd(struct reader *r, uint64_t *end, bool zero_ends)
{
    if (r->size < 8) {
        return 1;
    }
    const uint8_t *p = readerAt(r, 0, 8);
    if (p == NULL) {
        return errno != 0 ? -1 : 1;
    }
    if (le64(p) != FORMAT_1) {
        return 1; /* 0: never written (the loader removes it); others: not this walk's */
    }
    uint64_t off = 8;
    while (r->size - off >= PREAMBLE) {
        if ((p = readerAt(r, off, PREAMBLE)) == NULL) {
            return errno != 0 ? -1 : 1;
        }
        uint64_t n = le64(p + 8);
        if (n == 0 && zero_ends && le64(p) == 0) {
            break; /* a zero preamble: where raft_uv's loader finds the end of the data */
        }
        uint64_t room = r->size - off - PREAMBLE;
        if (n == 0 || n > room / ENTRY_HEADER) {
            return 1;
        }
        uint64_t headers = n * ENTRY_HEADER;
        uint64_t data = 0; /* never past room - headers: no overflow */
        for (uint64_t i = 0; i < n; i++) {
            p = readerAt(r, off + PREAMBLE + i * ENTRY_HEADER, ENTRY_HEADER);
            if (p == NULL) {
                return errno != 0 ? -1 : 1;
            }
            uint64_t len = (uint64_t)p[12] | (uint64_t)p[13] << 8 | (uint64_t)p[14] << 16 |
                           (uint64_t)p[15] << 24;
            if (len % 8 != 0) {
                return 1; /* raft_uv pads when it writes, its loader does not when it reads */
            }
            data += len;
            if (data > room - headers) {
                return 1;
            }
        }
        off += PREAMBLE + headers + data;
    }
    *end = off;
    return 0;
}

/* Opens the segment name in dir for reading and writing: its descriptor; SEGMENT_NOT_FILE
 * when it is no regular file (a directory, a symbolic link...: not a segment raft_uv made,
 * left alone); -1 on an error (why in err). */
#define SEGMENT_NOT_FILE (-2)
static int openSegment(int dirfd, const char *name, char *err, size_t errlen)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(err, errlen, "stat %s: %s", name, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        return SEGMENT_NOT_FILE;
    }
    int fd = openat(dirfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(err, errlen, "open %s: %s", name, strerror(errno));
        return -1;
    }
    return fd;
}

/* An open segment a walk (eachOpenSegment) hands its function: opened for reading and
 * writing, a regular file of `size` bytes, with `r` set on it. The function names the step
 * that failed in `what` (errno set) when it returns < 0. */
struct segment {
    int dirfd;
    const char *name;
    int fd;
    uint64_t size;
    struct reader *r;
    const char *what;
    void *data; /* the walk's caller's */
};

/* Calls fn on each open segment in dir that is a regular file, in directory order, until fn
 * fails (< 0). 0, or -1 with why in err: "list DIR: ..." when dir cannot be listed, else
 * "log segment in DIR: ...". */
static int eachOpenSegment(const char *dir, int (*fn)(struct segment *), void *data, char *err,
                           size_t errlen)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        snprintf(err, errlen, "list %s: %s", dir, strerror(errno));
        return -1;
    }
    char why[512] = "";
    struct reader *r = malloc(sizeof(*r));
    if (r == NULL) {
        snprintf(why, sizeof(why), "out of memory");
    }
    struct dirent *e = NULL;
    errno = 0;
    while (why[0] == '\0' && (e = readdir(d)) != NULL) {
        struct segment sg = {.dirfd = dirfd(d), .name = e->d_name, .r = r, .data = data};
        sg.fd = logdir_open_segment(e->d_name)
                    ? openSegment(sg.dirfd, sg.name, why, sizeof(why))
                    : SEGMENT_NOT_FILE;
        if (sg.fd >= 0) {
            struct stat st;
            sg.what = "stat";
            int rv = fstat(sg.fd, &st);
            if (rv == 0 && S_ISREG(st.st_mode)) {
                sg.what = "read";
                sg.size = (uint64_t)st.st_size;
                r->fd = sg.fd;
                r->size = sg.size;
                r->base = 0;
                r->len = 0;
                rv = fn(&sg);
            }
            int saved = errno;
            close(sg.fd);
            if (rv < 0) {
                snprintf(why, sizeof(why), "%s %s: %s", sg.what, sg.name, strerror(saved));
            }
        }
        errno = 0;
    }
    if (why[0] == '\0' && e == NULL && errno != 0) {
        snprintf(why, sizeof(why), "list: %s", strerror(errno));
    }
    free(r);
    closedir(d);
    if (why[0] != '\0') {
        snprintf(err, errlen, "log segment in %s: %s", dir, why);
        return -1;
    }
    return 0;
}

/* The segments segtail_repair trimmed: how many, and their names. */
struct repaired {
    int trimmed;
    char names[512];
    size_t used;
};

/* segtail_repair's step: trims the segment when its batches end 8 zero bytes before its
 * end. */
static int repairOne(struct segment *sg)
{
    uint64_t end = 0;
    int rv = batchesEnd(sg->r, &end, false);
    /* end is past the format version: at least one batch (raft_uv writes the version
     * with the first). */
    if (rv != 0 || end <= 8 || sg->size - end != TAIL) {
        return rv < 0 ? -1 : 0;
    }
    static const uint8_t zeros[TAIL];
    uint8_t tail[TAIL];
    int got = readAt(sg->fd, tail, sizeof(tail), end);
    if (got != 0 || memcmp(tail, zeros, sizeof(tail)) != 0) {
        return got < 0 ? -1 : 0; /* shorter than fstat said: left to the loader */
    }
    sg->what = "trim";
    if (ftruncate(sg->fd, (off_t)end) != 0 || fsync(sg->fd) != 0) {
        return -1;
    }
    struct repaired *rp = sg->data;
    size_t room = sizeof(rp->names) - rp->used;
    int n = snprintf(rp->names + rp->used, room, "%s%s", rp->trimmed ? ", " : "", sg->name);
    rp->used = n < 0 || (size_t)n >= room ? sizeof(rp->names) - 1 : rp->used + (size_t)n;
    rp->trimmed++;
    return 0;
}

int segtail_repair(const char *dir, char *msg, size_t msglen)
{
    struct repaired rp = {0};
    if (eachOpenSegment(dir, repairOne, &rp, msg, msglen) != 0) {
        if (rp.trimmed) {
            size_t n = strlen(msg);
            snprintf(msg + n, msglen - n, " (trimmed before that: %s)", rp.names);
        }
        return -1;
    }
    snprintf(msg, msglen, "%s", rp.names);
    return rp.trimmed;
}

/* ---- zeros (segtail_zeros) ------------------------------------------------------------ */

#define ZERO_CHUNK (1u << 20)

/* Whether bytes [off, size) of fd are all zero: 1 yes, 0 no, -1 a read error. */
static int zerosFrom(int fd, uint64_t off, uint64_t size, uint8_t *buf)
{
    while (off < size) {
        size_t n = size - off < ZERO_CHUNK ? (size_t)(size - off) : ZERO_CHUNK;
        int rv = readAt(fd, buf, n, off);
        if (rv != 0) {
            if (rv > 0) {
                errno = EIO; /* shorter than fstat said */
            }
            return -1;
        }
        /* All zero: the first byte is, and every byte equals the one before it. */
        if (buf[0] != 0 || (n > 1 && memcmp(buf, buf + 1, n - 1) != 0)) {
            return 0;
        }
        off += n;
    }
    return 1;
}

/* What segtail_zeros did: its buffer, and the segments removed and trimmed. */
struct zeroed {
    uint8_t *buf; /* ZERO_CHUNK bytes */
    unsigned removed, trimmed;
};

/* segtail_zeros' step: removes a segment of zeros, or trims the zeros after the batches of
 * one of format 1. */
static int zerosOne(struct segment *sg)
{
    struct zeroed *z = sg->data;
    uint8_t format[8];
    if (sg->size < 8) {
        return 0; /* no format version: the loader's to judge */
    }
    if (readAt(sg->fd, format, sizeof(format), 0) != 0) {
        return -1;
    }
    if (le64(format) == 0) {
        int rv = zerosFrom(sg->fd, 8, sg->size, z->buf);
        if (rv == 1) {
            sg->what = "remove";
            rv = unlinkat(sg->dirfd, sg->name, 0) == 0 ? 1 : -1;
            z->removed += rv == 1;
        }
        return rv < 0 ? -1 : 0;
    }
    uint64_t end = 0;
    if (le64(format) != FORMAT_1) {
        return 0;
    }
    int rv = batchesEnd(sg->r, &end, true);
    if (rv != 0 || end <= 8 || end >= sg->size) {
        return rv < 0 ? -1 : 0;
    }
    rv = zerosFrom(sg->fd, end, sg->size, z->buf);
    if (rv == 1) {
        sg->what = "trim";
        rv = ftruncate(sg->fd, (off_t)end) == 0 && fsync(sg->fd) == 0 ? 1 : -1;
        z->trimmed += rv == 1;
    }
    return rv < 0 ? -1 : 0;
}

int segtail_zeros(const char *dir, unsigned *removed, unsigned *trimmed, char *msg, size_t msglen)
{
    msg[0] = '\0';
    struct zeroed z = {.buf = malloc(ZERO_CHUNK)};
    int rv;
    if (z.buf == NULL) {
        snprintf(msg, msglen, "log segment in %s: out of memory", dir);
        rv = -1;
    } else {
        rv = eachOpenSegment(dir, zerosOne, &z, msg, msglen);
    }
    free(z.buf);
    *removed = z.removed;
    *trimmed = z.trimmed;
    return rv;
}
