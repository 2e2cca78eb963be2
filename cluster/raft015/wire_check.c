/* wire_check: corrects libraft 0.15's decoder of peer messages, which trusts their bytes
 * (one malformed AppendEntries crashed a node): raft_uv's call of uvDecodeMessage comes
 * here first, through the linker's --wrap (wire_check.h explains). */
#include "wire_check.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "clog.h"

/* libraft's own decoder, which the linker's --wrap names __real_. */
int __real_uvDecodeMessage(uint16_t type, const uv_buf_t *header, struct raft_message *message,
                           size_t *payload_len);

static atomic_uint_fast64_t refused;

uint64_t wire_check_refused(void)
{
    return atomic_load_explicit(&refused, memory_order_relaxed);
}

static int fail(char *why, size_t why_len, const char *what, uint64_t type, size_t len)
{
    snprintf(why, why_len, "raft message of type %llu, header %zu bytes: %s",
             (unsigned long long)type, len, what);
    return -1;
}

/* A fixed-size message: raft_uv reads `v1` bytes, and `v2` (> v1) when there are more. */
static int fixed(uint64_t type, size_t len, size_t v1, size_t v2, char *why, size_t why_len)
{
    if (len < v1 || (len > v1 && len < v2)) {
        return fail(why, why_len, "shorter than its fields", type, len);
    }
    return 0;
}

/* raft's configuration encoding (configuration.c): format 1, a u64 server count (not
 * aligned), then per server a u64 ID, a NUL-terminated address and a role byte. */
static int checkConfiguration(const uint8_t *p, size_t len, char *why, size_t why_len)
{
    if (len < 9 || p[0] != 1) {
        snprintf(why, why_len, "configuration: bad format or too short");
        return -1;
    }
    uint64_t n = wire_le(p + 1, 8);
    size_t at = 9;
    /* Each server takes at least 10 bytes: the count cannot exceed what is there. */
    if (n > (len - at) / 10) {
        snprintf(why, why_len, "configuration: %llu servers do not fit in %zu bytes",
                 (unsigned long long)n, len);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (len - at < 8) {
            snprintf(why, why_len, "configuration: server %llu cut short",
                     (unsigned long long)i);
            return -1;
        }
        at += 8;
        const uint8_t *nul = memchr(p + at, '\0', len - at);
        if (nul == NULL) {
            snprintf(why, why_len, "configuration: server %llu's address is not terminated",
                     (unsigned long long)i);
            return -1;
        }
        at = (size_t)(nul - p) + 1;
        if (at >= len) {
            snprintf(why, why_len, "configuration: server %llu has no role",
                     (unsigned long long)i);
            return -1;
        }
        at += 1;
    }
    return 0;
}

int wire_check_message(uint64_t type, const uint8_t *header, size_t len, char *why,
                       size_t why_len)
{
    why[0] = '\0';
    if (header == NULL && len != 0) {
        return fail(why, why_len, "no header bytes", type, len);
    }
    switch (type) {
    case RAFT_IO_REQUEST_VOTE:
        /* term, candidate, last index, last term; then flags (version 2). */
        return fixed(type, len, 32, 40, why, why_len);
    case RAFT_IO_REQUEST_VOTE_RESULT:
        /* term, vote granted; then flags. */
        return fixed(type, len, 16, 24, why, why_len);
    case RAFT_IO_APPEND_ENTRIES_RESULT:
        /* term, rejected, last log index. */
        return fixed(type, len, 24, 24, why, why_len);
    case RAFT_IO_TIMEOUT_NOW:
        /* term, last log index, last log term. */
        return fixed(type, len, 24, 24, why, why_len);
    case RAFT_IO_APPEND_ENTRIES: {
        /* term, prev index, prev term, commit; the entry count; 16 bytes per entry: term,
         * type byte, 3 unused, u32 data length. */
        if (len < 40) {
            return fail(why, why_len, "shorter than its fields", type, len);
        }
        uint64_t n = wire_le(header + 32, 8);
        if (n > (len - 40) / 16) {
            char what[96];
            snprintf(what, sizeof what, "%llu entries declared, room for %zu",
                     (unsigned long long)n, (len - 40) / 16);
            return fail(why, why_len, what, type, len);
        }
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *e = header + 40 + 16 * i;
            uint8_t t = e[8];
            uint32_t data = (uint32_t)wire_le(e + 12, 4);
            char what[96];
            if (t != RAFT_COMMAND && t != RAFT_BARRIER && t != RAFT_CHANGE) {
                snprintf(what, sizeof what, "entry %llu has type %u",
                         (unsigned long long)i, (unsigned)t);
                return fail(why, why_len, what, type, len);
            }
            /* raft_uv receives the sum of the lengths and then walks it with each length
             * rounded up to 8: an unaligned one points the next entry past the payload.
             * Every sender pads (idemd's commands, raft's barriers and configurations). */
            if (data % 8 != 0) {
                snprintf(what, sizeof what, "entry %llu's data length %u is not a multiple of 8",
                         (unsigned long long)i, (unsigned)data);
                return fail(why, why_len, what, type, len);
            }
        }
        return 0;
    }
    case RAFT_IO_INSTALL_SNAPSHOT: {
        /* term, last index, last term, configuration index, configuration length, the
         * configuration, snapshot data length. */
        if (len < 48) {
            return fail(why, why_len, "shorter than its fields", type, len);
        }
        uint64_t conf = wire_le(header + 32, 8);
        if (conf > len - 48) {
            return fail(why, why_len, "configuration longer than the header", type, len);
        }
        char what[160];
        if (checkConfiguration(header + 40, (size_t)conf, what, sizeof what) != 0) {
            return fail(why, why_len, what, type, len);
        }
        return 0;
    }
    default:
        return 0;
    }
}

int __wrap_uvDecodeMessage(uint16_t type, const uv_buf_t *header, struct raft_message *message,
                           size_t *payload_len)
{
    char why[256];
    if (wire_check_message(type, header != NULL ? (const uint8_t *)header->base : NULL,
                           header != NULL ? header->len : 0, why, sizeof why) != 0) {
        /* What raft_uv's caller may look at after a failed decode: nothing allocated. */
        memset(message, 0, sizeof(*message));
        message->type = (unsigned short)type;
        *payload_len = 0;
        if (atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed) < 100) {
            clog_warn("refused a malformed raft message from a peer (%s); "
                      "connection closed",
                      why);
        }
        return RAFT_MALFORMED;
    }
    return __real_uvDecodeMessage(type, header, message, payload_len);
}
