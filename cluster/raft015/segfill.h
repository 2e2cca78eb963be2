/* segfill: raft_uv's open segments written through with zeros before their first append.
 *
 * raft_uv 0.15 creates each open segment (open-N, raft.segment_size_mb) ahead of use on a
 * pool thread, with posix_fallocate(3), and then writes its log into it with O_DIRECT and
 * O_DSYNC through Linux AIO, asking the kernel not to block (RWF_NOWAIT). On ext4 and XFS
 * fallocate leaves *unwritten* extents: the blocks are reserved but marked as not holding
 * data yet. Every append into an unwritten extent converts it to written, which is a
 * metadata change: a journal commit on top of the data write before an O_DSYNC write can
 * complete, and the kernel refuses such a write without blocking (EAGAIN), so raft_uv
 * writes it again on a pool thread. Measured on the benchmark machine (docs/benchmarks.md):
 * three nodes on one disk, the leader's closed-loop claim rate was 51-58k/s without it and
 * 65-89k/s with it (six alternated pairs, higher in each).
 *
 * The linker redirects raft_uv's own calls of its internal UvFsAllocateFile() to
 * __wrap_UvFsAllocateFile() below (cluster/CMakeLists.txt, `--wrap`; nothing else in the
 * process is affected). The wrapper lets raft_uv allocate the file as before, then, for an
 * open segment (a name starting "open-") on ext4 or XFS, writes zeros over all of it with
 * O_DIRECT (no page cache) in 1 MiB writes and fdatasync(2)s it, on the pool thread that
 * prepares the segment, before raft_uv can append to it. What raft_uv reads back is the
 * same either way: an unwritten extent reads as zeros, and raft_uv finds the end of an
 * open segment's data by its zeros. The space was reserved by fallocate already, so the
 * zeros need none more; other files (raft_uv's capability probe) and other file systems
 * (tmpfs has no unwritten extents; on btrfs or ZFS an overwrite is a new copy) are left
 * as raft_uv made them. It costs the segment's size in sequential writes once per segment
 * (64 MiB by default: 0.07 s on the benchmark machine, off the loop).
 *
 * A failed zero write does not fail the allocation: the segment is allocated and usable,
 * only slower (raft_uv's own write reports a disk that really fails). It is counted.
 * Thread-safe: raft_uv prepares segments on pool threads, and a process may run several
 * clusters (the setting is process-wide). */
#ifndef IDEM_CLUSTER_SEGFILL_H
#define IDEM_CLUSTER_SEGFILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* What libraft calls instead of UvFsAllocateFile (its declaration in libraft's uv_fs.h):
 * raft_uv's answer, unchanged. */
int __wrap_UvFsAllocateFile(const char *dir, const char *filename, size_t size, uv_file *fd,
                            char *errmsg);

/* on (the default): open segments are written through as above; off: raft_uv's files are
 * left as it allocates them (raft.prefill_segments: false). Process-wide; applies to the
 * segments prepared from then on. */
void segfill_set_enabled(bool on);

struct segfill_stats {
    uint64_t filled;      /* open segments written through */
    uint64_t bytes;       /* ... bytes of zeros written */
    uint64_t skipped_fs;  /* open segments left alone: not ext4 or XFS, or no O_DIRECT */
    uint64_t skipped_off; /* ... left alone: turned off */
    uint64_t failed;      /* ... a zero write or the fdatasync failed (usable, slower) */
};

void segfill_get_stats(struct segfill_stats *s);

#endif
