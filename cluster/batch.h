/* batch: the log entries of the Raft group and the commands in them, shared by the cluster
 * (batch.c) and the simulation (tests/sim), which applies the same entries over
 * raft_fixture's in-memory I/O.
 *
 * Log entry framing. raft_uv stores entries padded to 8 bytes and hands them back padded
 * after a restart (its segment format requires 8-byte multiples; canonical/raft issue
 * #189), so an entry is an 8-byte header (u32 little-endian payload length, u32 zero), the
 * packed LogEntry, and zero padding up to a multiple of 8. */
#ifndef IDEM_CLUSTER_BATCH_H
#define IDEM_CLUSTER_BATCH_H

#include <raft.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "idem.pb-c.h"

/* A command's index: its entry's raft index << BATCH_SLOT_BITS | its place in the entry. */
#define BATCH_SLOT_BITS CLUSTER_SLOT_BITS

/* Packs a log entry into buf (raft_calloc'd, framed as above). Aborts when out of memory. */
void batch_entry_encode(const Idem__LogEntry *e, struct raft_buffer *buf);

/* Packs a batch of n commands into buf as batch_entry_encode() does. */
void batch_encode(ProtobufCBinaryData *cmds, size_t n, uint64_t proposer, uint64_t epoch,
                  uint64_t proposal, struct raft_buffer *buf);

/* The log entry in buf, decoded with allocator a (NULL: malloc; free it with
 * idem__log_entry__free_unpacked), or NULL when its framing or its bytes do not decode. */
Idem__LogEntry *batch_entry_decode(const struct raft_buffer *buf, ProtobufCAllocator *a);

/* What cluster_ops.apply is: one command, its index, its waiter (NULL: none here). */
typedef void (*batch_apply_fn)(void *data, uint64_t cmd_index, const uint8_t *cmd, size_t len,
                               void *waiter);

/* Hands each command of batch b, committed at raft index `index`, to apply(data, ...) in
 * order, command i at index << BATCH_SLOT_BITS | i, with waiters[i] when i < n_waiters
 * (taken: set to NULL; waiters may be NULL with n_waiters 0). A batch of more commands than
 * a command index has room for is logged and skipped whole: every replica holds the same
 * bytes and skips them alike. */
void batch_apply_commands(const Idem__CommandBatch *b, uint64_t index, void **waiters,
                          unsigned n_waiters, batch_apply_fn apply, void *data);

#endif
