/* packed: commands packed before a micro-benchmark's clock starts, as the leader packs them
 * before they reach apply (fsm-bench, grow-bench). Out of memory ends the program. */
#ifndef IDEM_BENCH_PACKED_H
#define IDEM_BENCH_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "idem.pb-c.h"

struct packed {
    uint8_t *buf;
    size_t *off; /* n + 1 offsets: command i is buf[off[i] .. off[i + 1]) */
    size_t n;
};

/* Room for about n commands; *cap is the byte capacity (grown by pack_append). */
void pack_init(struct packed *p, size_t n, size_t *cap);
void pack_append(struct packed *p, size_t *cap, const Idem__Command *cmd);
void pack_free(struct packed *p);

/* The key of claim i: "order-%010zu". */
void pack_key(char *out, size_t cap, size_t i);

/* n claims on fresh keys (pack_key) of tenant "bench" with fingerprint fp (32 bytes,
 * borrowed only during the call), a 30 s lease and a 24 h ttl; the clock advances 1 ms
 * every 1000 claims. */
void pack_claims(struct packed *p, size_t n, const uint8_t *fp);

#endif
