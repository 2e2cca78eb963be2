/* snapstore: the snapshot's data in a file of our own, written paced, with raft_uv storing
 * only a small reference to it.
 *
 * Why: raft_uv 0.15 writes a snapshot file in one go and fsyncs it. The whole file then goes
 * to the disk at once, and every log write (O_DIRECT, RWF_DSYNC) on the same disk queues
 * behind it: tens of milliseconds on each node sharing the disk (measured; docs/benchmarks.md).
 * Here the data is written in SNAPSTORE_CHUNK pieces, each pushed to the disk and waited for
 * (sync_file_range) before the next, with a pause between them, so a log write waits behind
 * one chunk at most. The pause is as long as the chunk took, within [pause_us / 4, pause_us]
 * (SNAPSTORE_PAUSE_US: 1 ms by default), so the log's writes have the disk at least half the
 * time. A fixed 1 ms pause made the write take 1.4 s per 131 MB on the benchmark machine,
 * where a chunk took 0.25 ms (0.23-0.32 s without pauses): 80% of it was pauses.
 *
 * Layout, in raft_uv's directory:
 *   idem-snapshot-<term>-<index>        the data, as raft handed it (bufs concatenated);
 *   idem-snapshot-<term>-<index>.tmp    while it is written (renamed once durable);
 *   idem-trash/                         links to the log segments raft_uv is about to delete,
 *                                       freed paced afterwards (snapstore_shield).
 * The reference raft_uv stores (SNAPSTORE_REF_SIZE bytes, little-endian):
 *   "IDEMSNP1", term, index, size, XXH3-64 of the data, 0.
 * The file is durable (fdatasync, rename, directory fsync) before raft_uv is handed the
 * reference, so a reference raft_uv holds always names a complete file; reading checks its
 * size and hash and refuses anything else.
 *
 * All functions are blocking: call them on a pool thread, or at startup. They return 0 or
 * -1 with a message in err. */
#ifndef IDEM_CLUSTER_SNAPSTORE_H
#define IDEM_CLUSTER_SNAPSTORE_H

#include <raft.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNAPSTORE_REF_SIZE 48
#define SNAPSTORE_CHUNK (128 * 1024) /* bytes pushed to the disk at a time */
#define SNAPSTORE_PAUSE_US 1000      /* the longest pause between chunks, by default */
/* Bytes freed at a time (snapstore_gc), and the pause between steps by default: with online
 * discard on ext4 without a journal each step is one trim that the disk's other writes wait
 * behind (on the benchmark machine 0.5-2.1 ms for 1 MiB, ~2 ms for 4 MiB; docs/benchmarks.md).
 * With a journal, ext4 trims a transaction's freed ranges, merged, when it commits, so the
 * steps do not split them there. 100 MiB a second. */
#define SNAPSTORE_DELETE_STEP (1024 * 1024)
#define SNAPSTORE_DELETE_PAUSE_US 10000
#define SNAPSTORE_TRASH "idem-trash"

struct snapstore_ref {
    uint64_t term;
    uint64_t index;
    uint64_t size; /* bytes of data */
    uint64_t hash; /* XXH3-64 of the data */
};

void snapstore_ref_encode(const struct snapstore_ref *r, uint8_t out[SNAPSTORE_REF_SIZE]);

/* True if buf is a reference (exactly SNAPSTORE_REF_SIZE bytes with the magic); fills r. */
bool snapstore_ref_decode(const void *buf, size_t len, struct snapstore_ref *r);

#define SNAPSTORE_STOPPED 1 /* snapstore_write: *stop was set; none of the file is left */

/* Writes bufs to dir/idem-snapshot-<term>-<index>, paced by pauses of pause_us / 4 to
 * pause_us between chunks (0: none), and makes it durable; fills out. stop (may be NULL) is
 * read before each chunk: once it is set (the node is closing, and would discard the file
 * anyway: io_snap.c), the partial file is removed and SNAPSTORE_STOPPED returned, so that a
 * close does not wait for a paced write (0.5 s per 100 MB here, more on a slower disk). */
int snapstore_write(const char *dir, uint64_t term, uint64_t index, const struct raft_buffer bufs[],
                    unsigned n, unsigned pause_us, const atomic_bool *stop,
                    struct snapstore_ref *out, char *err, size_t errlen);

/* Reads the file r names into a raft_malloc()ed buffer of r->size bytes (*data), after
 * checking its size and hash. */
int snapstore_read(const char *dir, const struct snapstore_ref *r, void **data, char *err,
                   size_t errlen);

/* The same data, mapped instead of copied (read-only, private, its pages populated from the
 * page cache at once), after the same checks: for the restore at start, which reads it once
 * and releases it with snapstore_unmap. A read took a fresh buffer of the file's size (its
 * pages faulted in and zeroed) and a copy: 60-100 ms of a start at 130 MB. *mapped is false
 * when the data was read instead (an empty file, which cannot be mapped): raft_free() it. */
int snapstore_map(const char *dir, const struct snapstore_ref *r, void **data, bool *mapped,
                  char *err, size_t errlen);
void snapstore_unmap(void *data, uint64_t size);

/* Removes the idem-snapshot-* files (and leftover .tmp) below index keep_newest, but for
 * keep_older's (raft_uv keeps the snapshot before the newest too). Files at or past
 * keep_newest are left: one may be written now. Then empties the trash (snapstore_shield).
 * A file that goes is first shrunk SNAPSTORE_DELETE_STEP at a time with pause_us between
 * steps (0: unlinked at once). Once *stop (may be NULL) is set, it stops between steps and
 * leaves the rest (a shrunk file too) to the next snapshot's gc. Returns the number of
 * files whose data went. */
int snapstore_gc(const char *dir, uint64_t keep_older, uint64_t keep_newest, unsigned pause_us,
                 const atomic_bool *stop);

/* Before raft_uv stores a snapshot at `index` keeping `trailing` entries (it then deletes
 * the closed log segments that end before index - trailing + 1): links those segments into
 * dir/idem-trash, so that raft_uv's unlink only drops a name and snapstore_gc frees their
 * blocks paced. Returns the number linked, -1 if the trash cannot be made (nothing breaks:
 * the segments are then freed at once, as before). */
int snapstore_shield(const char *dir, uint64_t index, uint64_t trailing);

#endif
