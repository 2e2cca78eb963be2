/* fuzz_raft_message: the header of one Raft message from a peer, as raft_uv hands it to
 * uvDecodeMessage, which the linker sends to __wrap_uvDecodeMessage
 * (cluster/raft015/wire_check.h: wire_check_message() first, then libraft 0.15's own decoder
 * for the messages that pass).
 *
 * Input: the first byte is the message type (raft_uv's preamble gives it; 1..6 are
 * RAFT_IO_*, any other passes the check and libraft refuses it), the rest is the header.
 * The header is copied to the end of a page followed by an inaccessible one, so that a read
 * past it faults, by wire_check (also seen by ASan) or by libraft's decoder, which is not
 * instrumented.
 *
 * Invariants (abort() on violation):
 * - wire_check_message() returns 0 with an empty why, or -1 with a NUL-terminated why that
 *   names the type and the header's length; the same bytes give the same answer;
 * - the wrapper refuses (RAFT_MALFORMED, a zeroed message of the type, no payload) exactly
 *   the headers the check refuses, and counts each refusal (wire_check_refused());
 * - a header that passes is decoded without reading past it; an unknown type is refused by
 *   libraft (RAFT_IOERR), the fixed-size messages and AppendEntries decode;
 * - what libraft decodes agrees with the layout the check reads: an AppendEntries' entry
 *   count, each entry's type and data length (a multiple of 8), and the payload raft_uv reads
 *   next is their sum, so that its walk through the entries' data (uvDecodeEntriesBatch:
 *   each length rounded up to 8) ends inside it; an InstallSnapshot's server count, and the
 *   snapshot data length after the configuration;
 * - what the decoder allocated is freed as raft_uv frees it (uvServerDestroy): LeakSanitizer
 *   finds nothing left. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <raft.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "wire_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libraft's decoder, unwrapped (the linker's --wrap names it __real_). */
int __real_uvDecodeMessage(uint16_t type, const uv_buf_t *header, struct raft_message *message,
                           size_t *payload_len);

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_raft_message: invariant violated: %s\n", what);
    abort();
}

/* Pages of room for a header, then one inaccessible page. */
static uint8_t *region;
static size_t regionRoom;

/* A copy of the n bytes at p that ends where the inaccessible page starts. */
static uint8_t *guarded(const uint8_t *p, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (n > regionRoom || region == NULL) {
        if (region != NULL) {
            munmap(region, regionRoom + page);
        }
        regionRoom = (n + page - 1) / page * page;
        if (regionRoom == 0) {
            regionRoom = page;
        }
        region = mmap(NULL, regionRoom + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
        if (region == MAP_FAILED || mprotect(region + regionRoom, page, PROT_NONE) != 0) {
            abort();
        }
    }
    uint8_t *at = region + regionRoom - n;
    if (n > 0) {
        memcpy(at, p, n);
    }
    return at;
}

/* What raft_uv frees of a decoded (or half-decoded) message: uvServerDestroy. */
static void release(struct raft_message *m)
{
    switch (m->type) {
    case RAFT_IO_APPEND_ENTRIES:
        raft_free(m->append_entries.entries);
        break;
    case RAFT_IO_INSTALL_SNAPSHOT:
        raft_configuration_close(&m->install_snapshot.conf);
        break;
    default:
        break;
    }
}

static void checkAppendEntries(const struct raft_message *m, const uint8_t *h, size_t payload)
{
    const struct raft_append_entries *ae = &m->append_entries;
    if (ae->n_entries != wire_le(h + 32, 8)) {
        fail("AppendEntries: the decoded entry count is not the header's");
    }
    if (ae->n_entries > 0 && ae->entries == NULL) {
        fail("AppendEntries: entries counted but none decoded");
    }
    uint64_t sum = 0, walked = 0;
    for (unsigned i = 0; i < ae->n_entries; i++) {
        const uint8_t *e = h + 40 + 16 * (size_t)i;
        const struct raft_entry *d = &ae->entries[i];
        if (d->type != e[8] || d->buf.len != wire_le(e + 12, 4) || d->term != wire_le(e, 8)) {
            fail("AppendEntries: an entry's type, data length or term is not the header's");
        }
        if (d->type != RAFT_COMMAND && d->type != RAFT_BARRIER && d->type != RAFT_CHANGE) {
            fail("AppendEntries: an entry of an unknown type passed");
        }
        sum += d->buf.len;
        walked += (d->buf.len + 7) / 8 * 8; /* uvDecodeEntriesBatch's step */
    }
    if (payload != sum) {
        fail("AppendEntries: the payload length is not the sum of the entries' lengths");
    }
    if (walked > payload) {
        fail("AppendEntries: the walk through the entries' data would leave the payload");
    }
}

static void checkInstallSnapshot(const struct raft_message *m, const uint8_t *h, size_t len,
                                 size_t payload)
{
    const struct raft_install_snapshot *is = &m->install_snapshot;
    uint64_t conf = wire_le(h + 32, 8);
    if (conf > len - 48) {
        fail("InstallSnapshot: a configuration longer than the header passed");
    }
    if (is->conf.n != wire_le(h + 41, 8)) {
        fail("InstallSnapshot: the decoded server count is not the configuration's");
    }
    if (is->data.len != wire_le(h + 40 + conf, 8) || payload != is->data.len) {
        fail("InstallSnapshot: the snapshot's data length is not the header's");
    }
    for (unsigned i = 0; i < is->conf.n; i++) {
        if (is->conf.servers[i].address == NULL) {
            fail("InstallSnapshot: a server without an address");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    uint16_t type = data[0];
    size_t len = size - 1;
    uint8_t *h = guarded(data + 1, len);

    char why[256], why2[256];
    memset(why, 'x', sizeof why);
    int rc = wire_check_message(type, h, len, why, sizeof why);
    if (rc != 0 && rc != -1) {
        fail("wire_check_message returned neither 0 nor -1");
    }
    if (memchr(why, '\0', sizeof why) == NULL) {
        fail("why is not NUL-terminated");
    }
    if (rc == 0 && why[0] != '\0') {
        fail("a message that passed has a why");
    }
    if (rc == -1) {
        char head[96];
        snprintf(head, sizeof head, "raft message of type %u, header %zu bytes: ", (unsigned)type,
                 len);
        if (strncmp(why, head, strlen(head)) != 0 || why[strlen(head)] == '\0') {
            fprintf(stderr, "why: %s\n", why);
            fail("a refusal's why does not name the type and length, or says nothing more");
        }
    }
    if (wire_check_message(type, h, len, why2, sizeof why2) != rc || strcmp(why, why2) != 0) {
        fail("the same header checked twice gives another answer");
    }

    /* The production path: the wrapper raft_uv calls. */
    uint64_t refused = wire_check_refused();
    uv_buf_t buf = uv_buf_init((char *)h, (unsigned)len);
    struct raft_message m;
    memset(&m, 0xa5, sizeof m);
    size_t payload = 12345;
    int drc = __wrap_uvDecodeMessage(type, &buf, &m, &payload);
    if (rc == -1) {
        struct raft_message zero;
        memset(&zero, 0, sizeof zero);
        zero.type = type;
        if (drc != RAFT_MALFORMED || payload != 0 || memcmp(&m, &zero, sizeof m) != 0) {
            fail("a refused message is not RAFT_MALFORMED with a zeroed message");
        }
        if (wire_check_refused() != refused + 1) {
            fail("a refusal was not counted");
        }
        return 0;
    }
    if (wire_check_refused() != refused) {
        fail("a message that passed was counted as refused");
    }
    switch (type) {
    case RAFT_IO_REQUEST_VOTE:
    case RAFT_IO_REQUEST_VOTE_RESULT:
    case RAFT_IO_APPEND_ENTRIES_RESULT:
    case RAFT_IO_TIMEOUT_NOW:
        if (drc != 0 || payload != 0) {
            fail("a fixed-size message that passed does not decode, or has a payload");
        }
        break;
    case RAFT_IO_APPEND_ENTRIES:
        if (drc != 0) {
            fprintf(stderr, "libraft: %d\n", drc);
            fail("an AppendEntries that passed does not decode");
        }
        checkAppendEntries(&m, h, payload);
        break;
    case RAFT_IO_INSTALL_SNAPSHOT:
        /* libraft may refuse the configuration's servers (IDs, addresses, roles). */
        if (drc == 0) {
            checkInstallSnapshot(&m, h, len, payload);
        } else if (drc == RAFT_NOMEM) {
            fail("an InstallSnapshot that passed ran out of memory");
        }
        break;
    default:
        if (drc == 0) {
            fail("libraft decoded a message of an unknown type");
        }
        break;
    }
    release(&m);
    return 0;
}
