/* fsm: the deterministic idempotency state machine that every node runs over the Raft log.
 *
 * The state machine is pure: bytes in, result out. It does no I/O, reads no clock and no
 * configuration; everything it decides with is carried in the command by the leader
 * (docs/contract.md). Two state machines that applied the same commands with the same
 * indexes hold the same table, whatever their history of snapshots and restores, and
 * fsm_digest() says so.
 *
 * Fencing tokens. A token is the *command index* of the command that granted the claim.
 * The cluster applies a log entry that packs several commands (docs/architecture.md), so
 * the command index is fsm_command_index(raft_index, slot): the entry's Raft index shifted
 * left by FSM_SLOT_BITS plus the command's position in the entry. Tokens are therefore
 * strictly increasing in log order and unique across the cluster, and
 * `token >> FSM_SLOT_BITS` is the Raft index of the entry that granted the claim. cluster.h
 * defines the same layout (CLUSTER_SLOT_BITS; service.c asserts they agree).
 *
 * Memory. Allocation failure aborts (like redis's zmalloc): the table cannot degrade
 * gracefully and a replica that skipped a command would diverge. */
#ifndef IDEM_SERVER_FSM_H
#define IDEM_SERVER_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem.pb-c.h"
#include "key.h"

struct xbig_prefaulter; /* xmalloc.h */

#define FSM_SLOT_BITS 16
#define FSM_FINGERPRINT_LEN FP_LEN        /* key.h */
#define FSM_ATTEMPT_MAX 64            /* bytes of attempt id */
#define FSM_TENANT_MAX 128            /* bytes of tenant name */
#define FSM_TENANTS_MAX 65535         /* distinct tenants */
#define FSM_RESPONSE_MAX (4u << 20)   /* bytes of a packed stored response */
#define FSM_EXPIRE_BATCH_MAX 65536    /* records one expire command may touch */
#define FSM_HEADERS_MAX 64            /* headers in a stored response */

/* The command index of slot `slot` of the log entry at `raft_index`. */
static inline uint64_t fsm_command_index(uint64_t raft_index, unsigned slot)
{
    return (raft_index << FSM_SLOT_BITS) | (uint64_t)slot;
}

struct fsm;

/* A read-only view of one record, valid until the next fsm_apply(), fsm_restore() or
 * fsm_close() on the same state machine. */
struct fsm_record_view {
    const char *tenant;
    const uint8_t *key;
    size_t key_len;
    const uint8_t *fingerprint; /* FSM_FINGERPRINT_LEN bytes */
    Idem__RecordState state;
    Idem__Completion completion;
    uint64_t token;
    uint64_t created_at_ms;
    uint64_t lease_deadline_ms;
    uint64_t expires_at_ms;
    const uint8_t *response; /* packed Idem__StoredResponse, or NULL */
    size_t response_len;
};

/* The answer to one command. Pointers in it borrow the state machine's memory and stay
 * valid until the next fsm_apply(), fsm_restore() or fsm_close(). */
struct fsm_result {
    Idem__Outcome outcome;
    uint64_t token;             /* acquired, replay, ok; 0 otherwise */
    uint64_t lease_deadline_ms; /* acquired, renew */
    uint64_t expires_at_ms;     /* claim: the record's ttl deadline (a tombstone's: when it
                                 * is dropped); 0 for quarantined and quota_exceeded */
    uint64_t retry_after_ms;    /* in_progress */
    bool takeover;              /* acquired by taking over an expired lease */
    uint64_t previous_token;    /* with takeover */
    const uint8_t *response;    /* replay: packed Idem__StoredResponse */
    size_t response_len;
    bool has_record;            /* get */
    struct fsm_record_view record;
    uint32_t expired;           /* expire: records turned into tombstones */
    uint32_t dropped;           /* expire: tombstones and released markers removed */
    bool more;                  /* expire: more records are already due */
    const char *detail;         /* invalid (and a complete's lease_lost by its own token):
                                 * a static description; never holds key bytes */
};

struct fsm_stats {
    uint64_t records;     /* all records the table holds, released markers included */
    uint64_t processing;
    uint64_t completed;
    uint64_t quarantined;
    uint64_t tombstones;
    uint64_t released;
    uint64_t bytes;       /* key + fingerprint + stored responses of counted records */
    uint64_t tenants;
    uint64_t clock_ms;
    uint64_t last_index;
    uint64_t snapshot_spare_bytes; /* the slot copy kept for the next snapshot: the last
                                    * one's, or one made ahead of it (mapped sizes) */
    uint64_t index_slots_bytes;     /* the record table's slot arrays: table_index_bytes */
    uint64_t index_migrating_bytes;
    uint64_t index_ahead_bytes;
};

/* What the owner gives a state machine that is not a command. Nothing in it may change
 * what the state machine decides. */
/* Bytes of fsm_options.hash_secret. */
#define FSM_HASH_SECRET_LEN 192

struct fsm_options {
    /* Faults in the slot arrays allocated ahead (the table's next growth, the snapshot
     * spare) off the owner's thread: the daemon's runs a thread (prefault_thread.h).
     * Borrowed; it must outlive the state machine. NULL: at once, on the owner's thread. */
    const struct xbig_prefaulter *prefault;
    /* FSM_HASH_SECRET_LEN random bytes that key the record table's hashes (copied);
     * the daemon draws them at start. NULL: unkeyed, the same in every process. */
    const uint8_t *hash_secret;
};

/* Allocates an empty state machine. Never returns NULL (aborts on allocation failure).
 * The caller owns the result and frees it with fsm_close(). `opt` is borrowed (copied);
 * NULL gives the defaults (every field zero). fsm_new() is fsm_new_with(NULL). */
struct fsm *fsm_new_with(const struct fsm_options *opt);
struct fsm *fsm_new(void);

/* Frees the state machine and everything it holds. Accepts NULL. */
void fsm_close(struct fsm *f);

/* Applies one packed Idem__Command at command index `index`. `buf` is borrowed for the
 * duration of the call. Fills `*out` (OUT) and returns out->outcome. Malformed bytes, an
 * unknown op or out-of-range fields give IDEM__OUTCOME__OUTCOME_INVALID and change nothing
 * at all (not even the clock). `index` must be greater than every index applied before;
 * a command with a smaller or equal index is refused as invalid. */
Idem__Outcome fsm_apply(struct fsm *f, uint64_t index, const uint8_t *buf, size_t len,
                        struct fsm_result *out);

/* The checks fsm_apply makes of a claim, complete, renew, release, get or resolve that need
 * no state (field presence and sizes, known enum values, a well-formed response): NULL
 * when `cmd` (borrowed) passes them, else why (a static string, never key bytes), the
 * detail fsm_apply would answer with OUTCOME_INVALID. The service runs them before it
 * proposes, so that a command the state machine would refuse never becomes a log entry:
 * the one check of a request before the log. The op's key is judged by the rule fsm_apply
 * applies (key_validate) with the bound key_max_len (a tenant's; at most KEY_MAX_LEN, which
 * fsm_apply uses), and the verdict goes to *key_rc (KEY_OK when the key passed or was not
 * reached; key_rc may be NULL). Other ops pass (NULL). */
const char *fsm_command_check(const Idem__Command *cmd, size_t key_max_len, int *key_rc);

/* A Command with no op is answered invalid and changes nothing (the clock included), like
 * every invalid command; the service proposes one as a read barrier (service_admin.c,
 * quarantine list), and tests/unit/test_fsm.c holds it to that. */

/* The same, for a command the caller has already unpacked (borrowed). */
Idem__Outcome fsm_apply_command(struct fsm *f, uint64_t index, const Idem__Command *cmd,
                                struct fsm_result *out);

/* Front-end side: whether a stored response (borrowed) would be accepted by complete and
 * resolve, so that a bad one is refused before it costs a log entry, and whether it can be
 * replayed as an HTTP response as it is: a final status (200-599: an informational one
 * cannot carry a response), header names that are HTTP tokens and values, body_ref
 * included (a replay sends it as a header), without CR, LF or NUL (else a replay could
 * inject headers or split the response, or drop the reference). The last two are checked
 * here only, not when a command applies, so that log entries already written apply as they
 * did. *why (OUT) is a static description when it would not. */
bool fsm_response_check(const Idem__StoredResponse *resp, const char **why);

/* An HTTP header name (an RFC 9110 token) / a value of RFC 9110's field-value characters
 * (tab, space, visible characters, obs-text: no control character). Checked before the log
 * and on replay, never at apply: a value an older version stored is dropped on replay. */
bool fsm_header_name_ok(const char *name);
bool fsm_header_value_ok(const uint8_t *value, size_t len);

/* Leader side: the earliest time (ms) at which an expire command would find something to
 * do, or UINT64_MAX when the table holds nothing that expires. */
uint64_t fsm_next_expiry(const struct fsm *f);

/* The state machine's clock: the largest leader timestamp applied so far. */
uint64_t fsm_clock(const struct fsm *f);

void fsm_get_stats(const struct fsm *f, struct fsm_stats *out /* OUT */);

/* Admin read: fills out[0..min(n, cap)) (OUT) with the quarantined records of `tenant`
 * (borrowed; NULL or "" for every tenant), or with lease_ended those in processing whose
 * lease has ended by now_ms (or by the state machine's clock, when that is later), lowest
 * token (oldest claim) first, and returns n, how many records match in all (more than cap
 * when some were left out). The state machine's clock moves only with commands, so on an
 * idle cluster it is behind: the caller passes the time its read barrier was proposed at.
 * The views borrow the state machine's memory (see fsm_record_view). One pass over the
 * table: the caller is an operator's command, not a request path. */
size_t fsm_quarantined(const struct fsm *f, const char *tenant, bool lease_ended, uint64_t now_ms,
                       struct fsm_record_view *out, size_t cap);

/* Whether the replicated state knows a tenant of that name (`name` borrowed): one that had
 * a record since the state was last restored from a snapshot, or has one in it. */
bool fsm_tenant_known(const struct fsm *f, const char *name);

/* What the tenant `name` (borrowed) holds against its quotas (OUT): its records (released
 * markers excluded) and their bytes (key + fingerprint + stored response); 0 and 0 for a
 * tenant the state does not know. The same on every replica at the same applied index. */
void fsm_tenant_usage(const struct fsm *f, const char *name, uint64_t *records, uint64_t *bytes);

/* A 16-byte digest of the whole replicated state (every record, the clock and the last
 * index). It does not depend on insertion order, hash-table layout or memory addresses:
 * replicas, and a state machine restored from a snapshot of another, compare equal. */
void fsm_digest(const struct fsm *f, uint8_t out[16] /* OUT */);

/* Writes the digest as 32 lowercase hex characters and a NUL. */
void fsm_digest_hex(const struct fsm *f, char out[33] /* OUT */);

/* Serialises the whole state. On success returns 0 and hands the caller a malloc'd buffer
 * in *out / *out_len (OUT; the caller frees it). Never fails but for allocation (abort). */
int fsm_snapshot(const struct fsm *f, uint8_t **out, size_t *out_len);

/* Replaces the state with a snapshot's. `buf` is borrowed. Returns 0, or -1 with a static
 * description in *why (OUT, may be NULL) when the bytes are not a valid snapshot, in which
 * case the state machine is unchanged. */
int fsm_restore(struct fsm *f, const uint8_t *buf, size_t len, const char **why);

/* ---- snapshots off the apply path ---------------------------------------------------
 *
 * fsm_snapshot() serialises the whole table in one call: at a million records that is most
 * of a second during which the owner can apply nothing. A frozen view splits it: the owner
 * freezes the state (a bounded copy: the hash table's slot array, 8 bytes a slot, and the
 * tenant names' addresses; no record is read or copied), hands the view to another thread
 * that serialises it, and goes on applying commands meanwhile. Until the view is thawed the
 * state machine is copy-on-write at record level: an apply that would modify a record the
 * view holds modifies a copy that takes its place in the table, and a record the view holds
 * is unlinked rather than freed; fsm_thaw() frees what the view alone still held. The bytes
 * are those fsm_snapshot() would have written at the moment of the freeze.
 *
 * Threads: fsm_freeze, fsm_thaw, fsm_apply*, fsm_restore and fsm_close run on the owner's
 * thread; fsm_frozen_write may run on any one thread between the freeze and the thaw (the
 * caller orders the hand-over, e.g. libuv's work queue does). The state machine starts no
 * thread and takes no lock. */
struct fsm_frozen;

/* Freezes the current state. Returns the view (owned by the state machine until
 * fsm_thaw()), or NULL when a view is frozen already (one at a time). A growth of the table
 * still in progress is finished first, at once (tens of ms at 1M records): call
 * fsm_freeze_ready() until it says true to spread that over several calls. */
struct fsm_frozen *fsm_freeze(struct fsm *f);

/* Moves a growth of the table in progress forward by a bounded step (FSM_SETTLE_STEP slot
 * positions, a millisecond or two at 1M records); true when none is left, so that
 * fsm_freeze() copies one slot array without a rehash. */
#define FSM_SETTLE_STEP 16384
bool fsm_freeze_ready(struct fsm *f);

/* Serialises the view into a malloc'd buffer (OUT, the caller frees it), exactly as
 * fsm_snapshot() would have at freeze time. Reads only the view and the records it holds.
 * Returns 0; aborts on allocation failure. */
int fsm_frozen_write(const struct fsm_frozen *z, uint8_t **out, size_t *out_len);

/* Records the view holds (for logs). */
uint64_t fsm_frozen_records(const struct fsm_frozen *z);

/* Ends the freeze and frees the view and the records only it still held. No
 * fsm_frozen_write() of it may be running. fsm_close() thaws a view that is still frozen.
 * The view's slot copy is kept for the next fsm_freeze() to copy into (memory already
 * mapped: a fraction of the copy's time on the owner's thread), until fsm_close(); the
 * stats' snapshot_spare_bytes count it. From the size where slot arrays are mapped
 * (XBIG_MAP_MIN_BYTES), fresh claims also grow it ahead of a table growth and have it
 * faulted in by the options' prefaulter (xbig_prefault), so that the first freeze after a
 * growth does not copy into fresh memory either. */
void fsm_thaw(struct fsm *f, struct fsm_frozen *z);

#endif /* IDEM_SERVER_FSM_H */
