/* segtrim: the unused rest of a closing raft_uv log segment freed in steps, not at once.
 *
 * raft_uv 0.15 closes an open segment (open-N) by truncating it to the bytes its entries
 * use and renaming it to its closed name, on a pool thread (UvFsTruncateAndRenameFile). A
 * segment is raft.segment_size_mb long (64 MiB by default) and written through before use
 * (segfill.h), so its unused rest is that many blocks freed at once. A snapshot closes the
 * segment in use when most of it is still unused. On a file system mounted with online
 * discard the device trims those blocks in one request, and every write queued behind it
 * waits: on the benchmark machine one 58.5 MiB discard took 30.3 ms, and the writes of all
 * three nodes issued meanwhile completed only after it (block trace, docs/latency.md).
 *
 * The linker redirects raft_uv's own calls of UvFsTruncateAndRenameFile() to
 * __wrap_UvFsTruncateAndRenameFile() below (cluster/CMakeLists.txt, `--wrap`; nothing else
 * in the process is affected). The wrapper first shrinks the file from its end towards the
 * size raft_uv asked for, SEGTRIM_STEP bytes at a time (more when the rest is over
 * SEGTRIM_MAX_STEPS steps), pausing SEGTRIM_PAUSE_US between steps, so each trim is one
 * step's worth; then raft_uv's own function truncates to the exact size, fsyncs and renames,
 * and its answer is returned unchanged. A step never cuts below the size raft_uv asked for,
 * so a crash between steps leaves what a crash before the close would have: the open
 * segment with all its entries and a shorter run of zeros after them, which raft_uv reads
 * back as it reads any open segment (its data ends at the first zeros). If the file cannot
 * be opened or shrunk, the wrapper stops stepping and raft_uv's function does all of it
 * (and reports the error, if there is one). The steps cost up to SEGTRIM_MAX_STEPS pauses
 * (0.13 s) of the pool thread that closes the segment; appends go on meanwhile into the
 * next segment, which raft_uv prepares ahead.
 *
 * Thread-safe: raft_uv closes segments on pool threads, and a process may run several
 * clusters. */
#ifndef IDEM_CLUSTER_SEGTRIM_H
#define IDEM_CLUSTER_SEGTRIM_H

#include <stddef.h>
#include <stdint.h>

#define SEGTRIM_STEP (1u << 20) /* bytes freed per step, at least */
#define SEGTRIM_MAX_STEPS 64    /* larger steps beyond this many */
#define SEGTRIM_PAUSE_US 2000   /* pause after each step, by default */

/* What libraft calls instead of UvFsTruncateAndRenameFile (its declaration in libraft's
 * uv_fs.h): raft_uv's answer, unchanged. */
int __wrap_UvFsTruncateAndRenameFile(const char *dir, size_t size, const char *filename1,
                                     const char *filename2, char *errmsg);

/* The pause after each step, in microseconds (SEGTRIM_PAUSE_US unless set); 0 steps
 * without pausing. Process-wide. For tests. */
void segtrim_set_pause_us(unsigned us);

struct segtrim_stats {
    uint64_t closed;      /* segments closed through the wrapper */
    uint64_t stepped;     /* ... whose rest was freed in steps first */
    uint64_t steps;       /* truncations made in those steps */
    uint64_t step_bytes;  /* ... bytes they freed */
    uint64_t step_failed; /* closes whose stepping stopped early (open or truncate failed) */
};

void segtrim_get_stats(struct segtrim_stats *s);

#endif
