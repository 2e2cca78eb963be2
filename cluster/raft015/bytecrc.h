/* bytecrc: raft_uv's checksums computed by ISA-L instead of libraft 0.15's own loop.
 *
 * raft_uv checksums every batch of log entries (two CRC-32s: its header and its data) when
 * it writes it, on the loop, and again when it loads the log at start. libraft 0.15 computes
 * them with byteCrc32(), a table lookup per byte: about 0.3 GB/s on the benchmark machine,
 * so a start that loaded 53 MB of log spent 0.15-0.2 s in it, and a leader spends ~0.2 ms
 * of its loop per 64 KiB it appends. Its CRC is the non-reflected CRC-32 of polynomial
 * 0x04C11DB7 with the caller's initial value and no final inversion: ISA-L's crc32_ieee()
 * is that CRC with the initial value and the result inverted, and runs 20-30 times faster
 * (carry-less multiplication where the CPU has it, a table otherwise).
 *
 * The linker redirects libraft's own calls of byteCrc32() to __wrap_byteCrc32() below
 * (cluster/CMakeLists.txt, `--wrap`; nothing else in the process is affected); the result
 * is the same for every input (tests/unit/test_raft_uv.c checks it against libraft's). */
#ifndef IDEM_CLUSTER_BYTECRC_H
#define IDEM_CLUSTER_BYTECRC_H

#include <stddef.h>
#include <stdint.h>

/* What libraft calls instead of byteCrc32 (its declaration in libraft's byte.h). */
uint32_t __wrap_byteCrc32(const void *buf, size_t size, uint32_t init);

#endif
