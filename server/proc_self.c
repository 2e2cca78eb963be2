/* proc_self: the process's own figures (proc_self.h). */
#include "proc_self.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Reads the unsigned decimal at *p (after spaces), moving *p past it. */
static bool takeU64(const char **p, const char *end, uint64_t *out)
{
    const char *s = *p;
    while (s < end && *s == ' ') {
        s++;
    }
    if (s == end || *s < '0' || *s > '9') {
        return false;
    }
    uint64_t v = 0;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return false;
        }
        v = v * 10 + d;
    }
    if (s < end && *s != ' ' && *s != '\n') {
        return false;
    }
    *p = s;
    *out = v;
    return true;
}

/* Skips one field of non-space bytes (after spaces). */
static bool skipField(const char **p, const char *end)
{
    const char *s = *p;
    while (s < end && *s == ' ') {
        s++;
    }
    if (s == end || *s == '\n') {
        return false;
    }
    while (s < end && *s != ' ' && *s != '\n') {
        s++;
    }
    *p = s;
    return true;
}

bool proc_stat_parse(const char *text, size_t len, struct proc_stat_fields *out)
{
    memset(out, 0, sizeof(*out));
    const char *end = text + len, *close = NULL;
    for (const char *s = text; s < end; s++) {
        if (*s == ')') {
            close = s;
        }
    }
    if (close == NULL) {
        return false;
    }
    /* Field 3 (state) follows the name; proc(5) numbers utime 14, stime 15, starttime 22,
     * vsize 23, rss 24. */
    const char *p = close + 1;
    uint64_t v[25] = {0};
    for (int field = 3; field <= 24; field++) {
        /* The others are skipped as text: some (tty_nr, tpgid, priority, nice) may be
         * negative. */
        bool want = field == 14 || field == 15 || field >= 22;
        if (!(want ? takeU64(&p, end, &v[field]) : skipField(&p, end))) {
            return false;
        }
    }
    *out = (struct proc_stat_fields){
        .utime = v[14], .stime = v[15], .starttime = v[22], .vsize = v[23], .rss = v[24]};
    return true;
}

/* The whole of a small file, NUL-terminated, into buf; its length or -1. */
static ssize_t readSmall(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            if (r < 0) {
                n = 0;
            }
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return n > 0 ? (ssize_t)n : -1;
}

static double clockSeconds(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0) {
        return 0;
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void readStat(struct proc_self *out)
{
    char buf[1024];
    ssize_t n = readSmall("/proc/self/stat", buf, sizeof(buf));
    struct proc_stat_fields f;
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (n < 0 || tick <= 0 || page <= 0 || !proc_stat_parse(buf, (size_t)n, &f)) {
        return;
    }
    out->stat_ok = true;
    out->cpu_seconds = (double)(f.utime + f.stime) / (double)tick;
    out->resident_bytes = f.rss * (uint64_t)page;
    out->virtual_bytes = f.vsize;
    double boot = clockSeconds(CLOCK_REALTIME) - clockSeconds(CLOCK_BOOTTIME);
    out->start_time_seconds = boot + (double)f.starttime / (double)tick;
}

static void readFds(struct proc_self *out)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        return;
    }
    int own = dirfd(d);
    uint64_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char *endp;
        long v = strtol(e->d_name, &endp, 10);
        if (*endp == '\0' && v != own) {
            n++;
        }
    }
    closedir(d);
    out->fds_ok = true;
    out->open_fds = n;
}

void proc_self_read(struct proc_self *out)
{
    memset(out, 0, sizeof(*out));
    readStat(out);
    readFds(out);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        out->max_fds_ok = true;
        out->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    }
}
