/* aio_reap: destroys libraft's kernel AIO contexts on a thread of its own, not on the loop.
 *
 * raft_uv 0.15 writes its log through Linux AIO, one context per open segment, and
 * destroys the context (io_destroy(2)) on the loop when the segment is closed: when it
 * fills up, and at every snapshot (raft's barrier closes the open segment). io_destroy
 * waits for an RCU grace period; on the kernels measured (docs/benchmarks.md) it takes 32 ms
 * every time, and all that time the node's loop answers nothing: on the leader, every
 * request in flight waits 32 ms more.
 *
 * idemd links libraft statically and the linker redirects libraft's own calls of its
 * internal UvOsIoDestroy() to __wrap_UvOsIoDestroy() below (cluster/CMakeLists.txt,
 * `--wrap`); nothing else in the process is affected. The wrapper queues the context and
 * returns 0 at once; a thread destroys the queued contexts in order. This is safe because
 * raft_uv destroys a context only after closing its writer, and uses the context's value
 * no more: it finalizes a segment once the segment's writes are done, and at close idemd's
 * I/O wrapper waits for the appends in flight (cluster/raft015/io.h). A write still in the kernel
 * then (only past that wait's bound, on a disk that never answers) holds the kernel's own
 * references to its file and event fd, and the context's ring stays mapped until the
 * context is destroyed; what io_destroy waits for (the RCU grace period) is the kernel's.
 *
 * When the queue is full or no thread can be started, the context is destroyed on the
 * caller's thread, as raft_uv itself would. The queue's bound also bounds the contexts
 * alive at once (fs.aio-max-nr): raft_uv opens one per segment writer and closes one every
 * few seconds at most. Thread-safe: a process may run several clusters, and raft_uv's
 * writers that allow concurrent writes (raft_uv opens none) call it from pool threads. */
#ifndef IDEM_CLUSTER_AIO_REAP_H
#define IDEM_CLUSTER_AIO_REAP_H

#include <linux/aio_abi.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* What libraft calls instead of UvOsIoDestroy (its declaration in libraft's uv_os.h).
 * Returns 0, or the negative errno of io_destroy when it ran on the caller's thread. */
int __wrap_UvOsIoDestroy(aio_context_t ctx);

/* Waits until every context queued so far is destroyed and stops the thread (the next
 * queued context starts another). Called when a cluster closes, after raft_uv is closed,
 * so that a node's contexts are gone before it reports closed. Blocks its caller up to
 * about 32 ms per context still queued. */
void aio_reap_stop(void);

/* on: from now on every context is destroyed on the caller's thread, as raft_uv would,
 * until called again with false. io_close.c turns it on when it closes raft_uv with log writes
 * still in the kernel (past its bounded wait for a disk that does not answer): raft_uv
 * frees such a write's buffer only after io_destroy returns, which waits for the write;
 * returning at once would free the buffer under the kernel. Process-wide. */
void aio_reap_set_inline(bool on);
bool aio_reap_inline(void);

struct aio_reap_stats {
    uint64_t queued;      /* contexts handed to the thread */
    uint64_t destroyed;   /* ... and destroyed by it */
    uint64_t failed;      /* ... of which io_destroy refused (the context stays) */
    uint64_t inline_runs; /* contexts destroyed on the caller's thread instead */
    pid_t last_tid;       /* the thread (gettid) that destroyed the last context */
};

void aio_reap_get_stats(struct aio_reap_stats *s);

#endif
