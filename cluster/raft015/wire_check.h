/* wire_check: checks every Raft message a peer sends before libraft 0.15 decodes it.
 *
 * raft_uv's decoder trusts the bytes it reads from a peer. It reads each message's fixed
 * fields without comparing them with the header's length; it reads an AppendEntries'
 * entry count from the wire and then that many entry headers, wherever they end; and when
 * an entry's type is invalid, uvDecodeBatchHeader frees the entries and sets them to NULL
 * but leaves the count, which uvDecodeMessage then walks through the NULL pointer. One
 * 112-byte message to the Raft port (an AppendEntries with one entry of type 9) crashed
 * the node, no authentication needed (without raft.secret_file the Raft port has none:
 * docs/limits.md; with it, only a holder of the secret gets this far, transport.h).
 *
 * idemd links libraft statically and the linker sends raft_uv's call of its internal
 * uvDecodeMessage() to __wrap_uvDecodeMessage() below (cluster/CMakeLists.txt, `--wrap`,
 * as aio_reap.h does for UvOsIoDestroy). The wrapper runs wire_check_message() on the
 * header first; a message that fails it is answered RAFT_MALFORMED without decoding, and
 * raft_uv closes that connection (what it does for a message it cannot decode). Messages
 * that pass are decoded by libraft's own function, unchanged.
 *
 * What is checked (the encoding is raft_uv's, little endian, uv_encoding.c): every fixed
 * field lies inside the header; an AppendEntries' entry count fits the header (16 bytes
 * per entry header) and every entry is a command, a barrier or a configuration change
 * whose data length is a multiple of 8 (raft_uv walks the payload in 8-byte steps); an
 * InstallSnapshot's configuration (a format byte, a server count, then per server an ID,
 * a NUL-terminated address and a role byte) lies inside the length it declares, which
 * lies inside the header. What is not: the sizes a header declares for the payload that
 * follows (entries' data, snapshot data) and for the header itself, which raft_uv
 * allocates as a peer says, and the entries' data itself (a configuration change's is
 * decoded by libraft as it comes); a peer that gets a connection into raft (anyone who
 * reaches the port without raft.secret_file, a member with it) can still make a node
 * allocate memory, and pose as a leader. tests/fuzz/fuzz_raft_message drives the wrapper
 * with arbitrary headers, then libraft's decoder with those that pass. */
#ifndef IDEM_CLUSTER_WIRE_CHECK_H
#define IDEM_CLUSTER_WIRE_CHECK_H

#include <raft.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* The little-endian integer of `bytes` bytes at p: raft_uv's byte order on the wire, for
 * this check and for the handshake transport.c reads. */
static inline uint64_t wire_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

/* Messages refused by the wrapper since the process started (all clusters). */
uint64_t wire_check_refused(void);

/* Checks one message's header bytes (`type` as raft_uv's preamble gives it, RAFT_IO_*):
 * 0 when libraft may decode it, else -1 with why (OUT, NUL-terminated, never the bytes)
 * set. An unknown type passes: libraft refuses it itself. */
int wire_check_message(uint64_t type, const uint8_t *header, size_t len, char *why,
                       size_t why_len);

/* What libraft calls instead of uvDecodeMessage (its declaration in libraft's
 * uv_encoding.h). */
int __wrap_uvDecodeMessage(uint16_t type, const uv_buf_t *header, struct raft_message *message,
                           size_t *payload_len);

#endif /* IDEM_CLUSTER_WIRE_CHECK_H */
