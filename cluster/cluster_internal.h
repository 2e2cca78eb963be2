/* cluster_internal: what the parts of the Raft group share (private to cluster/).
 *
 * Happy path of a proposal: cluster_propose() (admission.c) copies the command into the open
 * batch and arms a uv_check handle; after this loop turn's I/O callbacks ran, batch_flush()
 * (batch.c) packs the batch into one LogEntry, raft_apply()s it and keeps it in `pending`
 * with the waiters of its commands; once committed, raft calls fsmApply() (cluster.c) on
 * every node, which hands each command to ops.apply (batch_apply_commands), with the waiter
 * on the proposer only; then raft's apply callback (batch.c) frees the pending batch.
 *
 * Failure modes: raft_apply() refuses (not leader any more) → every waiter of the batch is
 * failed at once; raft fails the request later (leadership lost, shutdown) → the apply
 * callback fails the waiters not yet handed to apply; the node closes with an open batch →
 * its waiters are failed with RAFT_SHUTDOWN. A proposer's batch is recognised at apply by
 * (proposer id, epoch, proposal number), never by index alone, so that an entry another
 * leader wrote at the same index can never complete our waiters.
 *
 * The parts: cluster.c (lifecycle, status, the tick, raft's apply callback), batch.c
 * (batching proposals into entries, result hand-off), admission.c (max_pending_bytes and the
 * per-account bounds), snapshot.c (snapshot policy, taking and restoring), members.c (member
 * metadata, membership changes, leadership transfer); below raft, transport.c and the
 * corrections of libraft 0.15 in raft015/. */
#ifndef IDEM_CLUSTER_INTERNAL_H
#define IDEM_CLUSTER_INTERNAL_H

#include <sys/queue.h>
#include "cluster.h"

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "batch.h"
#include "idem.pb-c.h"
#include "io.h"
#include "transport.h"

_Static_assert(CLUSTER_APPEND_BUCKETS == IO_APPEND_BUCKETS, "one count of append buckets");
_Static_assert(CLUSTER_APPEND_BOUND_US(3) == IO_APPEND_BOUND_US(3), "one bound of a bucket");

/* One command's part of an account's pending bytes (cluster_config.n_accounts). */
struct charge {
    uint32_t account; /* CLUSTER_ACCOUNT_NONE: none */
    uint32_t cost;    /* its bytes + CLUSTER_COMMAND_OVERHEAD (at most 64 MiB + 256) */
};

/* A command held back on the leader because its account has max_account_inflight_bytes in
 * the open batch and in raft already (cluster_config); it joins the open batch, in its
 * account's order, as those commit. Charged to pending_bytes and its account's pending
 * bytes from the start, like any command taken. */
struct queued {
    STAILQ_ENTRY(queued) link; /* in its account's acctQueue, oldest first */
    void *waiter;
    uint8_t *data; /* malloc'd copy of the command, handed to the open batch as it is */
    size_t len;
    uint32_t cost;
};

struct acctQueue {
    STAILQ_HEAD(queuedList, queued) held;
    uint64_t bytes; /* the costs of those held */
};

struct cluster_batch {
    struct raft_apply req;
    struct cluster *c;
    TAILQ_ENTRY(cluster_batch) link; /* in cluster.pending, oldest first */
    uint64_t proposal;
    uint64_t cost;          /* its commands' part of pending_bytes */
    void **waiters;         /* one per command; NULL once handed back */
    struct charge *charges; /* one per command */
    unsigned n;
};

/* An internal entry (member metadata, barrier) that has no waiter. */
struct internalReq {
    struct raft_apply req;
};

struct changeReq {
    struct raft_change req;
    struct cluster *c;
    cluster_change_cb cb;
    void *data;
};

struct transferReq {
    struct raft_transfer req;
    struct cluster *c;
    cluster_change_cb cb;
    void *data;
};

struct memberMeta {
    struct cluster_member m;
    bool logged;   /* its MemberInfo is in the replicated state */
    bool proposed; /* a MemberInfo for it is in flight (leader) */
};

/* A committed entry whose application waits (cluster_apply_deferred): a copy of its bytes. */
struct deferred {
    STAILQ_ENTRY(deferred) link;
    uint64_t index;
    size_t len;
    uint8_t data[];
};

struct cluster {
    uv_loop_t *loop;
    struct cluster_config cfg;
    char *raft_address, *rpc_address, *http_address, *data_dir;
    struct cluster_ops ops;
    struct transport transport;
    struct io io;
    struct raft_fsm fsm;
    struct raft raft;
    uv_check_t flush;
    uv_timer_t tick;
    int handles_open;
    bool raft_open; /* raft_init succeeded and raft_close has not completed */
    bool stopping;
    cluster_close_cb close_cb;
    void *close_data;

    /* Open batch: its commands' bytes one after another in open_buf (batch_bytes of
     * open_cap), command i at cmd_at[i] for cmds[i].len bytes (cmds[i].data is set when the
     * batch is packed: open_buf may move until then). */
    ProtobufCBinaryData *cmds;
    size_t *cmd_at;
    uint8_t *open_buf;
    size_t open_cap;
    void **waiters;
    unsigned n_cmds;
    unsigned cap_cmds;
    size_t batch_bytes;
    uint64_t open_cost;     /* the open batch's part of pending_bytes */
    uint64_t pending_bytes; /* commands proposed, not yet applied or failed (cluster.h) */
    uint64_t pending_refused;
    uint64_t transfer_refused; /* CLUSTER_ETRANSFER answers */
    uint64_t not_proposed;     /* commands never proposed: their batch raft_apply refused,
                                * or held back when leadership was lost (admission_fail_queued) */
    struct charge *charges;    /* the open batch's, one per command */
    uint64_t *acct_pending;    /* per account (cfg.n_accounts), as pending_bytes counts */
    uint64_t *acct_refused;    /* per account: CLUSTER_ESHARE refusals */
    struct acctQueue *queues;  /* per account: its commands held back (struct queued) */
    uint64_t queued_bytes;     /* every account's held back, together */
    uint32_t next_admit;       /* the account admission_admit_queued looks at first */

    /* Pending (proposed, not yet applied or failed) batches. */
    TAILQ_HEAD(batchList, cluster_batch) pending; /* proposed, not yet applied or failed */
    struct arena decode; /* the log entry being applied decodes into it (fsmApply) */
    /* Committed entries a follower applies just after its answer to the append that
     * committed them is sent (cluster_apply_deferred), oldest first. */
    STAILQ_HEAD(deferredList, deferred) deferred;
    size_t deferred_bytes;          /* their bytes */
    unsigned long deferred_applies; /* entries applied just after an answer so far */
    uint64_t yield_off_until_ns;    /* no yield after an answer before then (ioSettled) */
    uint64_t next_proposal;
    uint64_t epoch;

    struct memberMeta meta[CLUSTER_MEMBERS_MAX];
    size_t n_meta;

    uint64_t last_snapshot_index;
    unsigned saved_threshold; /* nonzero while a forced snapshot is pending */
    /* The snapshot in flight when asynchronous (fsmSnapshot → fsmSnapshotAsync on a pool
     * thread → fsmSnapshotFinalize). The pool thread writes only write_us / written / nice;
     * libuv's work queue orders those writes before the loop reads them. */
    struct {
        void *view;
        uint64_t index;
        uint64_t pause_us;
        uint64_t write_us;
        size_t bytes;
        bool written;
        int nice; /* the nice value snapshot_write ran at */
    } snap;
    uint64_t snapshots;
    /* The io's own_puts when the snapshot being taken began: fsmSnapshotFinalize tells from
     * it whether that snapshot's put ended, and how. */
    unsigned long puts_before;
    /* Entries added to raft's threshold after a snapshot that could not be stored: raft
     * measures from its last stored snapshot, so it would try again at every apply. */
    unsigned retry_extra;
    uint64_t stuck_append_warned_us;  /* when tickCb last warned of an append in flight long */
    uint64_t stuck_transfer_us;       /* when tickCb last asked another voter to lead for it */
    uint64_t stuck_refusal_logged_us; /* ... and last said that it could not */
    uint64_t snapshot_pause_us_last, snapshot_pause_us_max, snapshot_write_us_last;
    uint64_t restore_us_last; /* fsmRestore's ops.restore, the last one */
    /* Adaptive snapshot threshold (cluster_snapshot_threshold): entries and their bytes
     * applied since the threshold was last set, and that threshold. */
    uint64_t applied_entries, applied_bytes;
    uint64_t log_since_snapshot; /* bytes applied since the last snapshot was taken (at
                                  * fsmSnapshot) or restored: what logCap() bounds */
    uint64_t entries_measured, bytes_measured; /* the window the threshold came from */
    unsigned threshold;
    unsigned interval;        /* the interval adaptThreshold computed, before phase/leader */
    uint64_t interval_from;   /* ... after the snapshot at this index */
    bool threshold_as_leader; /* the threshold set counts this node as the leader */
    uint64_t snapshot_bytes_last;
    uint64_t seen_leader;
    raft_term barrier_term; /* the term this node, as leader, proposed its barrier in */
    uint64_t leader_changes;
    bool change_in_flight;
    uint64_t waits, waits_off; /* batch waits begun; times waits were turned off (batch.c) */
    unsigned waits_idle_run;   /* waits in a row that nothing joined */
    /* The open batch's wait (cluster_config.batch_delay_us, batch.c): a timerfd (-1: none,
     * no wait) polled on the loop, armed while the batch waits. */
    uv_poll_t delay;
    int delay_fd;
    bool delay_armed;
    unsigned delay_from_cmds;      /* commands in the batch when its wait began */
    uint64_t last_proposed_ns;     /* uv_hrtime when the last batch was proposed */
    uint64_t wait_off_until_ns;    /* no wait before this (batch.c: a wait nothing joined) */
    char errmsg[256];
};

/* ---- cluster.c ---- */

/* Sets c->errmsg to prefix + detail, cut to the buffer. */
void cluster_set_err(struct cluster *c, const char *prefix, const char *detail);
/* calloc that aborts (with a log line) when out of memory. */
void *cluster_xcalloc(size_t n);

/* ---- admission.c: max_pending_bytes and the per-account bounds ---- */

/* Allocates the per-account arrays (cfg.n_accounts of them; none for 0). */
void admission_init(struct cluster *c);
void admission_free(struct cluster *c);
void admission_uncharge(struct cluster *c, const struct charge *ch, unsigned n);
void admission_fail_queued(struct cluster *c, int status);
void admission_admit_queued(struct cluster *c);

/* ---- batch.c: the open batch, proposed batches, internal entries ---- */

void batch_reset_open(struct cluster *c, bool keep_charges);
void batch_close_open(struct cluster *c);
void batch_flush(struct cluster *c);
void batch_flush_cb(uv_check_t *h);
void batch_delay_cb(uv_poll_t *h, int status, int events);
bool batch_open_full(const struct cluster *c, size_t len);
bool batch_may_propose(struct cluster *c);

/* Whether raft leads and may be handed entries. libraft 0.15 still says RAFT_LEADER while
 * it fails a stepping-down leader's requests (convertClearLeader), after it freed the
 * leader's progress array: raft_apply then reads that array, and the node crashed when a
 * failure callback proposed again (an answer callback making its next call at once, as
 * proxy mode's complete after a failed renew) and the full open batch was flushed. The
 * array, gone, is what tells that window apart. */
static inline bool cluster_leading(const struct cluster *c)
{
    return raft_state((struct raft *)&c->raft) == RAFT_LEADER &&
           c->raft.leader_state.progress != NULL;
}
void batch_open_append(struct cluster *c, const uint8_t *data, size_t len, void *waiter,
                       uint32_t account, uint32_t cost, bool charged);
void batch_fail_waiters(struct cluster *c, void **waiters, unsigned n, int status);
int batch_propose_internal(struct cluster *c, const Idem__LogEntry *entry);
/* Hands each command of a committed batch at raft index `index` to ops.apply, with its
 * waiter when this node proposed the batch (taken from the pending batch). */
void batch_apply(struct cluster *c, const Idem__CommandBatch *b, uint64_t index);

/* ---- snapshot.c: snapshot policy, taking and restoring ---- */

/* Sets the raft_fsm's snapshot callbacks (version 3 when ops has the asynchronous ones). */
void snapshot_fsm_init(struct cluster *c);
/* An entry of `len` bytes is being applied: counts it, and asks for a snapshot at the next
 * apply when the log since the last one reached this voter's cap (snapshot_log_max_bytes). */
void snapshot_note_applied(struct cluster *c, size_t len);
/* Applies the committed entries fsmApply held back, in order; returns how many. */
unsigned long cluster_apply_deferred(struct cluster *c);
/* On each tick: the first snapshot's phase once this node is one of two or more voters,
 * and the threshold again when this node became or stopped being the leader. */
void snapshot_tick(struct cluster *c);

/* ---- members.c: member metadata, membership changes, transfer ---- */

struct memberMeta *members_find(struct cluster *c, uint64_t id);
struct memberMeta *members_put(struct cluster *c, uint64_t id, const char *rpc, const char *http);
/* A MemberInfo entry was applied: its addresses are in the replicated state now. */
void members_apply_info(struct cluster *c, const Idem__MemberInfo *mi);
/* On each tick of the leader: proposes the addresses of every member not in the log yet. */
void members_tick(struct cluster *c);

#endif /* IDEM_CLUSTER_INTERNAL_H */
