/* proc_self: the process's own figures for /metrics, under the names Prometheus clients
 * give them (process_cpu_seconds_total, process_resident_memory_bytes, ...): CPU time,
 * memory and start time from /proc/self/stat, open descriptors from /proc/self/fd, their
 * limit from getrlimit(RLIMIT_NOFILE). Only /proc/self is read (a unit with ProcSubset=pid
 * keeps it); the start time comes from the stat's start in clock ticks since boot and the
 * boot time CLOCK_REALTIME - CLOCK_BOOTTIME gives, not from /proc/stat. A few syscalls and one
 * directory listing: cheap enough for every scrape. */
#ifndef IDEM_SERVER_PROC_SELF_H
#define IDEM_SERVER_PROC_SELF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The fields of /proc/<pid>/stat that proc_self uses, in the kernel's units. */
struct proc_stat_fields {
    uint64_t utime, stime; /* clock ticks */
    uint64_t starttime;    /* clock ticks after boot */
    uint64_t vsize;        /* bytes */
    uint64_t rss;          /* pages */
};

/* Parses the text of a /proc/<pid>/stat file (len bytes, no NUL needed; borrowed). The
 * command name in parentheses may hold anything, parentheses and spaces included: fields are
 * counted after its last ')'. Returns false when the text does not hold them all as
 * decimal numbers. */
bool proc_stat_parse(const char *text, size_t len, struct proc_stat_fields *out /* OUT */);

/* This process now. A figure that could not be read has its *_ok false (and 0). */
struct proc_self {
    bool stat_ok;       /* the next four */
    double cpu_seconds; /* user + system */
    uint64_t resident_bytes;
    uint64_t virtual_bytes;
    double start_time_seconds; /* since the Unix epoch */
    bool fds_ok;
    uint64_t open_fds; /* the listing's own descriptor not counted */
    bool max_fds_ok;
    uint64_t max_fds; /* the soft RLIMIT_NOFILE */
};

void proc_self_read(struct proc_self *out /* OUT */);

#endif
