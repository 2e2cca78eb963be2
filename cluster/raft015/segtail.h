/* segtail: an open log segment that libraft 0.15 cannot load, made loadable at start.
 *
 * raft_uv (libraft 0.15) writes its log batch after batch into an open segment (open-N,
 * raft.segment_size_mb long) and starts the next segment when a batch no longer fits; it
 * closes the full one (truncated to what it holds and renamed) once the next batch has
 * been queued. A batch fits when it ends at or before the end of the file, and every size
 * in a segment is a multiple of 8 bytes, so the last batch can end exactly 8 bytes before
 * the end. When the node stops before that segment is closed (killed, crashed, the power
 * lost), raft_uv's loader takes those 8 zero bytes for the checksums of one more batch,
 * fails to read its entry count ("short read"), treats that as an I/O error rather than as
 * the end of the data, and frees the entries it had loaded twice: the process aborts
 * (double free) at every start, and the node stays down until someone repairs its log by
 * hand (seen with libraft 0.15.0: tests/unit/test_segtail.c). Any other tail is fine: 16
 * zero bytes or more read as an entry count of 0, the end of the data.
 *
 * So before raft_uv loads the log, segtail_repair walks the batch headers of every open
 * segment in the directory. raft_uv's format 1, little endian: a u64 format version (1),
 * then per batch two u32 checksums and a u64 entry count, per entry a u64 term, a u8 type,
 * 3 unused bytes and a u32 length, then the entries' data, each padded to 8 bytes. When the
 * batches end exactly 8 bytes before the end of the file and those 8 bytes are zero, the
 * file is truncated by those 8 bytes and synced. That removes no data: the loader then finds
 * the last batch ending at the end of the file, loads it and closes the segment as usual.
 * The walk reads only the headers and checks no checksum (the loader does, and cuts the log
 * at a torn batch itself): it only decides whether 8 zero bytes go. A walk that meets
 * anything else (an entry count of 0, a header or data running past the end, another format)
 * leaves the file as it is. Blocking (reads of the headers only, an fsync when it trims); at
 * start only. */
#ifndef IDEM_CLUSTER_SEGTAIL_H
#define IDEM_CLUSTER_SEGTAIL_H

#include <stddef.h>

/* The number of open segments in dir trimmed (0: none needed it; their names in msg, ""
 * when none), or -1 with why in msg when a segment cannot be read or trimmed (raft_uv
 * could not load it either: the node must not start). */
int segtail_repair(const char *dir, char *msg, size_t msglen);

/* Open segments' zeros, taken off before raft_uv loads the log. raft_uv 0.15 reads every
 * open segment whole into a buffer of its size (raft.segment_size_mb: 64 MiB by default)
 * and then checks byte by byte that what follows the last batch is zero: the segment in use
 * when the node stopped, and those prepared ahead of it (all zero, and written through
 * with zeros when raft.prefill_segments is on). At 64 MiB that was 0.25-0.3 s of every
 * start (three segments: docs/benchmarks.md). It then removes a segment that holds no
 * batch ("zeroed open segment") and truncates one that holds some to the end of its last
 * batch as it closes it. This does the same first, reading through a buffer of 1 MiB:
 *   - a segment of format 0 whose every byte is zero is removed;
 *   - a segment of format 1 whose batches (walked as segtail_repair does, up to a preamble
 *     of zeros) end before the end of the file, followed by zeros only, is truncated to
 *     that end and synced.
 * Anything else (a byte that is not zero, a walk that stops short) is left for raft_uv's
 * loader to judge, as before. Returns how many segments it removed (*removed) and trimmed
 * (*trimmed), 0, or -1 with why in msg when one cannot be read, removed or truncated
 * (raft_uv could not load it either). Blocking; at start only. */
int segtail_zeros(const char *dir, unsigned *removed, unsigned *trimmed, char *msg, size_t msglen);

#endif
