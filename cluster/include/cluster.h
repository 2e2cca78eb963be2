/* cluster: one Raft group on the node's libuv loop: raft + raft_uv + its TCP transport,
 * bootstrap, batching of proposals into log entries, result hand-off, snapshots, member
 * metadata and membership changes.
 *
 * The cluster knows nothing of idempotency. It carries opaque commands: the application
 * proposes bytes with an opaque `waiter`, and every node applies every committed command
 * through cluster_ops.apply, in log order. On the node that proposed it, apply receives the
 * command's waiter; everywhere else (and after the waiter was failed) it receives NULL.
 *
 * Exactly once: every waiter passed to a successful cluster_propose() is handed back exactly
 * once, either to ops.apply (its command committed and was applied here) or to ops.fail
 * (leadership was lost, the node shut down, or the entry could not be appended). A failed
 * waiter's command may still commit later: every operation is retry-safe (docs/contract.md).
 *
 * The group is an object, not a global (docs/architecture.md). */
#ifndef IDEM_CLUSTER_H
#define IDEM_CLUSTER_H

#include <raft.h>
#include <raft/uv.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define CLUSTER_ADDR_MAX 264
/* The fewest bytes of a Raft secret (raft.secret_file): the transport's handshake needs a
 * secret nobody can guess. */
#define CLUSTER_SECRET_MIN 32
#define CLUSTER_MEMBERS_MAX 64
/* Log appends timed by duration (cluster_status.append_buckets), in buckets bounded by
 * CLUSTER_APPEND_BOUND_US(i) = 0.5 ms << i, the last one unbounded (the I/O wrapper's
 * IO_APPEND_BUCKETS and IO_APPEND_BOUND_US, which these equal). */
#define CLUSTER_APPEND_BUCKETS 14
#define CLUSTER_APPEND_BOUND_US(i) (500ull << (i))

/* The command index cluster_ops.apply is given: the entry's Raft index shifted left by this
 * many bits, plus the command's position in the entry (so at most 2^16 - 1 commands an
 * entry). The state machine's fencing tokens are these indexes: server/fsm.h's
 * FSM_SLOT_BITS is asserted equal to it (server/service.c). */
#define CLUSTER_SLOT_BITS 16

enum cluster_rc {
    CLUSTER_OK = 0,
    CLUSTER_ENOTLEADER = -1, /* not the leader: ask cluster_leader() */
    CLUSTER_ETOOBIG = -2,    /* command larger than the batch limit */
    CLUSTER_ESTOPPING = -3,  /* the node is shutting down */
    CLUSTER_EBUSY = -4,      /* a membership change is already in flight */
    CLUSTER_EINVAL = -5,
    CLUSTER_ERAFT = -6,        /* raft refused; see cluster_errmsg() */
    CLUSTER_EUNREACHABLE = -7, /* transfer: the voter named (or every other) is not heard from */
    CLUSTER_EOVERLOAD = -8,    /* max_pending_bytes of commands not yet applied: try later */
    CLUSTER_ESETTLING = -9,    /* membership: raft holds a configuration it has not committed
                                * (a leader of a moment ago commits the last one with its first
                                * entry); nothing was started: try again shortly */
    CLUSTER_ESHARE = -10,      /* the account's own max_account_pending_bytes: try later */
    CLUSTER_ETRANSFER = -11,   /* a leadership transfer is in progress (raft takes no entry
                                * until it ends): nothing proposed; ask again shortly */
};

/* The account of a command that no account's bound applies to (cluster_propose). */
#define CLUSTER_ACCOUNT_NONE UINT32_MAX

/* What a proposed command costs against max_pending_bytes beyond its bytes: its waiter, its
 * copy and its place in raft's entry. */
#define CLUSTER_COMMAND_OVERHEAD 256

struct cluster_member {
    uint64_t id;
    char raft_address[CLUSTER_ADDR_MAX];
    char rpc_address[CLUSTER_ADDR_MAX];
    char http_address[CLUSTER_ADDR_MAX];
    int role; /* RAFT_VOTER, RAFT_STANDBY, RAFT_SPARE; -1 when not in the configuration */
};

struct idem_resolver;

struct cluster_config {
    uint64_t id;
    const char *raft_address; /* "host:port": an IPv4 address, [IPv6] or a host name */
    /* The address the Raft listener binds (node.raft_listen: may be a wildcard, 0.0.0.0:P or
     * [::]:P); NULL or "": raft_address. A name is resolved when raft starts, blocking. */
    const char *raft_listen;
    /* Resolves the members' host names off the loop (client/resolver.h), borrowed: it must
     * outlive the cluster. NULL: members reached by IP address only. */
    struct idem_resolver *resolver;
    const char *rpc_address;
    const char *http_address;
    const char *data_dir;
    const struct cluster_member *bootstrap; /* borrowed; voters of the first start */
    size_t n_bootstrap;
    unsigned election_timeout_ms;
    unsigned heartbeat_timeout_ms;
    unsigned snapshot_threshold;     /* the fewest entries between snapshots */
    unsigned snapshot_trailing;
    uint64_t snapshot_trailing_max_bytes; /* cluster_trailing_for() */
    unsigned snapshot_log_percent;   /* 0: snapshot every snapshot_threshold entries */
    uint64_t snapshot_log_max_bytes; /* see cluster_snapshot_threshold() */
    size_t segment_size;             /* raft_uv's log segment size; 0: raft_uv's default */
    unsigned snapshot_nice;          /* niced_run increment for snapshot_write */
    bool pre_vote;
    /* true: raft_uv's open segments are left as it allocates them (segfill.h; process-wide:
     * set from each cluster_new). Zero, the default: written through before use. */
    bool segment_prefill_off;
    /* A leader whose oldest log write has been in flight this long asks another voter to
     * take over (raft.stuck_write_step_down_ms); 0: never. */
    unsigned stuck_write_step_down_ms;
    /* Borrowed for cluster_new only; NULL: Raft connections are not authenticated
     * (transport.h). The previous secret (or NULL) is accepted too, and used to connect to
     * peers that do not have the current one yet. */
    const uint8_t *raft_secret;
    size_t raft_secret_len;
    const uint8_t *raft_previous_secret;
    size_t raft_previous_secret_len;
    /* Borrowed for cluster_new only; all NULL: Raft over plain TCP. All three given: every
     * Raft connection is TLS with certificates both ways (tls.raft; transport.h). */
    const char *raft_tls_cert_file;
    const char *raft_tls_key_file;
    const char *raft_tls_ca_file;
    unsigned batch_max_commands; /* 1..65535 */
    size_t batch_max_bytes;
    /* Group commit: commands that arrive less than this long after the leader proposed its
     * last entry wait until this long after it (or until BATCH_WAIT_COMMANDS joined them,
     * or the batch is full) to go in as one entry, not one entry per loop turn: fewer,
     * larger entries, each costing every node its writes, syncs and messages. A wait that
     * nothing joined (the callers wait for these answers first: a closed loop) turns waits
     * off for BATCH_WAIT_OFF_NS. A leader that proposed nothing for this long proposes the
     * next command at once. 0: each loop turn's commands are proposed at its end. */
    unsigned batch_delay_us;
    /* Commands proposed on this leader and not yet applied or failed, together (each counted
     * as its bytes + CLUSTER_COMMAND_OVERHEAD): past it cluster_propose() refuses with
     * CLUSTER_EOVERLOAD. Without it a client sending faster than the log commits (the
     * deadline frees its slots, not raft's copies) made the leader hold gigabytes. */
    uint64_t max_pending_bytes;
    /* Accounts 0..n_accounts-1 (idemd: one per tenant) that cluster_propose() charges. An
     * account's commands pending together are at most max_account_pending_bytes (counted as
     * above; past it CLUSTER_ESHARE), so that one account cannot take the whole
     * max_pending_bytes from the others; 0: no bound per account. An account with nothing
     * pending may always propose one command, past either bound: max_pending_bytes is then
     * exceeded by at most one command per account. */
    uint32_t n_accounts;
    uint64_t max_account_pending_bytes;
    /* An account's commands in the open batch and in raft (proposed, not yet applied)
     * together, at most (0: no bound): past it its next commands wait on the leader, still
     * charged as pending, and go in as its earlier ones commit, the accounts' waiting
     * commands one of each in turn. So an account whose commands are large or many holds
     * at most this much of the log's queue ahead of another account's command, where it
     * held up to max_account_pending_bytes. An account with nothing in flight always sends
     * one command. */
    uint64_t max_account_inflight_bytes;
};

/* What one snapshot taken off the loop cost (cluster_ops.snapshot_release). */
/* A log append in flight this long is warned of (tickCb), again every twice as long. */
#define CLUSTER_STUCK_APPEND_US 5000000u

struct cluster_snapshot_info {
    uint64_t index;    /* the raft index it covers */
    uint64_t pause_us; /* the loop's part: snapshot_freeze and the member metadata */
    uint64_t write_us; /* snapshot_write off the loop (0 when it did not run) */
    size_t bytes;      /* what snapshot_write produced */
    uint64_t store_us; /* its put, from raft's call to its end: the data written paced and
                        * made durable, then referenced by raft_uv (0 when none ended) */
    bool written;      /* snapshot_write ran and succeeded */
    bool put_ended;    /* ... and raft's put of it ended while raft was open */
    bool stored;       /* ... and raft_uv stored it */
    const char *store_error; /* why it was not stored, when written ("" if unknown) */
    int nice;          /* the nice value it ran at (cfg.snapshot_nice over the process's) */
    unsigned next_threshold; /* entries until the next one (cluster_snapshot_threshold) */
};

struct cluster_ops {
    void *data;
    /* Applies one committed command. cmd_index = raft index << CLUSTER_SLOT_BITS | position
     * in the entry. `cmd` is borrowed for the call. `waiter` as described above. */
    void (*apply)(void *data, uint64_t cmd_index, const uint8_t *cmd, size_t len, void *waiter);
    /* Hands back a waiter whose command will not be applied here. status is a RAFT_* code
     * (RAFT_LEADERSHIPLOST, RAFT_SHUTDOWN, ...). RAFT_NOTLEADER: the command is in no log:
     * raft refused its batch when it was proposed (the node began a leadership transfer or
     * stopped leading after the command was taken), or it was held back
     * (max_account_inflight_bytes) when the node stopped leading. */
    void (*fail)(void *data, void *waiter, int status);
    /* Serialises the application state into a malloc'd buffer (OUT, the cluster frees). */
    int (*snapshot)(void *data, uint8_t **buf, size_t *len);
    /* Optional, all three or none: snapshots serialised off the loop (raft's asynchronous
     * snapshots, fsm version 3); `snapshot` is then unused. snapshot_freeze runs on the loop
     * and must be short: it hands back an opaque view of the state (OUT) and returns 0, or
     * -1 to skip this snapshot (raft retries later). snapshot_write then runs off the loop,
     * at cfg.snapshot_nice (niced.h), while the loop goes on applying commands; it
     * may read the view and nothing else, and hands back a malloc'd buffer (OUT, the
     * cluster frees it).
     * snapshot_release runs on the loop once raft is done with the snapshot (stored,
     * failed, or abandoned at shutdown), exactly once per successful freeze. */
    int (*snapshot_freeze)(void *data, void **view);
    int (*snapshot_write)(void *view, uint8_t **buf, size_t *len);
    void (*snapshot_release)(void *data, void *view, const struct cluster_snapshot_info *info);
    /* Replaces the application state; `buf` is borrowed. Returns 0 or -1. */
    int (*restore)(void *data, const uint8_t *buf, size_t len);
    /* Optional: the known leader changed (0: none known); is_me when it is this node. */
    void (*leader_changed)(void *data, uint64_t leader_id, bool is_me);
};

struct cluster_status {
    int state;             /* RAFT_LEADER, RAFT_FOLLOWER, RAFT_CANDIDATE, RAFT_UNAVAILABLE */
    uint64_t term;
    uint64_t leader_id;    /* 0: unknown */
    const char *leader_rpc_address; /* "" when unknown; valid until the next loop turn */
    /* ms since the last raft message from the leader arrived (0 on the leader; UINT64_MAX
     * when no leader is known or none came since this node started) */
    uint64_t leader_heard_ms;
    int role;                     /* this node's in its configuration: RAFT_VOTER, RAFT_STANDBY,
                                   * RAFT_SPARE, or -1 when it is not in it */
    unsigned election_timeout_ms; /* as configured */
    uint64_t commit_index;
    uint64_t applied_index;
    uint64_t log_entries; /* entries raft holds in memory: since the last snapshot, and the
                           * trailing ones kept before it */
    uint64_t last_snapshot_index;     /* the last one stored (or loaded at start) */
    uint64_t snapshot_store_failures; /* this node's own that could not be stored */
    uint64_t leader_changes; /* times this node saw the leader change */
    uint64_t snapshots;      /* snapshots taken by this node since it started */
    uint64_t snapshot_pause_us_last; /* the loop's part of the last one (see cluster_ops) */
    uint64_t snapshot_pause_us_max;
    uint64_t snapshot_write_us_last; /* its serialisation, off the loop when asynchronous */
    uint64_t snapshot_threshold;     /* entries between snapshots, as adapted now */
    uint64_t snapshot_bytes_last;    /* the FSM's part of the last snapshot taken or restored */
    /* This node's start (µs): raft's load of its log and snapshot from disk, the snapshot
     * data's part of it, and the last restore of a snapshot by the application (at start,
     * or one the leader sent). */
    uint64_t load_us, load_snapshot_us, restore_us_last;
    /* Log appends on this node by duration (CLUSTER_APPEND_BUCKETS), non-cumulative. */
    uint64_t append_buckets[CLUSTER_APPEND_BUCKETS];
    uint64_t append_count;
    uint64_t append_sum_us;
    uint64_t append_oldest_us; /* age of the oldest append in flight, 0 when none */
    /* The raft I/O wrapper's corrections of libraft 0.15 (io.h) on this node: answers and
     * commit indexes clamped, results held by a leader, RPCs cut at the snapshot. */
    uint64_t pending_bytes;   /* commands proposed and not yet applied, as counted above */
    uint64_t pending_refused; /* proposals refused with CLUSTER_EOVERLOAD */
    uint64_t share_refused;   /* proposals refused with CLUSTER_ESHARE, every account's */
    uint64_t transfer_refused; /* proposals refused with CLUSTER_ETRANSFER */
    uint64_t batch_waits;      /* group commits: batches that waited (batch_delay_us) */
    uint64_t batch_waits_off;  /* ... and times waiting was turned off (a closed loop) */
    uint64_t applied_after_answer; /* entries this node applied as a follower just after its
                                    * answer to the append that committed them (fsmApply) */
    uint64_t queued_bytes;     /* commands held back (max_account_inflight_bytes), of
                                * pending_bytes */
    uint64_t not_proposed;     /* commands taken and never proposed (ops.fail with
                                * RAFT_NOTLEADER): their batch raft refused, or held back
                                * (max_account_inflight_bytes) when leadership was lost */
    uint64_t raft_clamped;
    uint64_t raft_held;
    uint64_t raft_rematched; /* match indexes lowered to an installed snapshot (io.h) */
    uint64_t raft_unaddressed; /* answers not sent: no leader address (io.h) */
    uint64_t raft_cut;
    uint64_t raft_installs_held; /* leader's snapshots held while storing another (io.h) */
    uint64_t raft_timeouts_held; /* TimeoutNow held while a configuration is written (io.h) */
    uint64_t raft_timeouts_dropped; /* of those, dropped: held past half an election timeout */
};

/* Process-wide counters of the corrections and guards below raft (one process runs one
 * raft_uv): AIO contexts destroyed off the loop, open segments prefilled, peer messages and
 * connections refused. */
struct cluster_io_counters {
    uint64_t aio_destroyed_reaper; /* kernel AIO contexts destroyed by the reaper thread */
    uint64_t aio_destroyed_caller; /* ... by the caller's thread, when the reaper could not */
    uint64_t aio_destroy_failed;   /* io_destroy calls of the reaper that failed */
    uint64_t segments_filled;      /* open segments written through with zeros */
    uint64_t segments_skipped;     /* ... left as allocated (file system, or turned off) */
    uint64_t segments_failed;      /* ... whose zero write failed */
    uint64_t messages_refused;     /* peer messages refused before libraft decoded them */
    uint64_t connections_refused;  /* peer connections closed before raft had them */
    uint64_t connect_auth_failed;  /* connections to peers whose authentication failed */
};
void cluster_get_io_counters(struct cluster_io_counters *out);

/* The cluster's log lines (its warnings and errors, never a key or a token) go to stderr as
 * "idemd: <level>: ..." unless a sink is set: a daemon sends them to its own log, so that
 * they carry its time, level and node. Set it once, before the cluster starts; the sink is
 * called from any thread, `msg` (without its newline) borrowed for the call. */
enum clog_level { CLOG_INFO, CLOG_WARN, CLOG_ERROR };
typedef void (*clog_sink)(enum clog_level level, const char *msg);
void clog_set_sink(clog_sink sink);

/* Entries between two snapshots (raft_set_snapshot_threshold) after a snapshot of
 * `snapshot_bytes`, when the last `entries` applied entries held `entry_bytes` bytes.
 *
 * A snapshot holds the whole table, so a fixed threshold makes the bytes written per entry
 * grow with the table: at 1M records every 8192 entries means ~110 MB every few seconds,
 * and each such write queues the log's fsyncs behind it (measured: open-loop p99 158-630 ms
 * against 11-13 ms with snapshots 12x rarer). So, as Redis rewrites its AOF once it has grown
 * by a percentage: the next snapshot comes once the log written since this one reaches
 * `percent`% of this one's size. Snapshot writes then stay within percent% of the log's
 * own, and a restart replays at most that much log. Bounds: at least `min` entries; at
 * most `max_log_bytes` of log (raft keeps it in memory), unless `min` asks for more.
 * percent == 0, no snapshot size or no entries measured yet: `min`. */
unsigned cluster_snapshot_threshold(unsigned min, unsigned percent, uint64_t max_log_bytes,
                                    uint64_t snapshot_bytes, uint64_t entries,
                                    uint64_t entry_bytes);

/* Replicas that snapshot at the same index write to the disks at the same moment, and a
 * snapshot being written delays the log's fsyncs behind it (the leader's most). So voter k
 * of n takes its snapshots at indexes = k * threshold / n (mod threshold): returns the
 * threshold to set after a snapshot at `index`, between threshold/2 and 3*threshold/2,
 * that lands the next one on that phase (at most UINT_MAX). threshold itself when n < 2 or it
 * is too small. */
unsigned cluster_snapshot_stagger(unsigned threshold, uint64_t index, unsigned k, unsigned n);

/* The same phases when threshold is the configured minimum, which no snapshot may come
 * sooner than: the threshold to set after a snapshot at `index` (0: none yet), between
 * threshold and 2*threshold (at most UINT_MAX), that lands the next one on voter k's phase.
 * So the replicas of a young cluster do not all write their first snapshots at the same
 * moment. threshold itself when n < 2 or it is too small. */
unsigned cluster_snapshot_stagger_forward(unsigned threshold, uint64_t index, unsigned k,
                                          unsigned n);

/* The leader's snapshot write delays its own log fsyncs, on the commit path of every
 * request; a follower's delays that follower only, while the other followers' answers carry
 * the commit. So the leader lets two more intervals pass (one when only that fits within
 * max_entries, the entries that make raft.snapshot_log_max_mb of log; none when neither
 * does), which keeps its phase. Returns the leader's threshold for a follower's
 * `staggered` one. */
unsigned cluster_snapshot_leader_threshold(unsigned staggered, unsigned interval,
                                           uint64_t max_entries);

/* The entries raft is to keep after a snapshot at `index` (in memory, and on disk, where
 * lagging followers catch up from): `trailing`, but no more of them than the newest ones
 * up to `index` that `log` (raft's in-memory log) holds within `max_bytes`, and at least
 * one. libraft 0.15 counts them in entries only, so with large entries (1 MiB completes)
 * the default 2048 kept 2 GiB of log in every node's memory. */
unsigned cluster_trailing_for(const struct raft_log *log, uint64_t index, unsigned trailing,
                              uint64_t max_bytes);

struct cluster_batch;
struct cluster;

typedef void (*cluster_change_cb)(void *data, int status, const char *errmsg);
typedef void (*cluster_close_cb)(void *data);

/* Allocates a cluster object (the caller owns it; freed by cluster_close's callback path).
 * `cfg` and `ops` are copied (strings too). Opens the data dir and, when it holds nothing
 * yet and cfg->n_bootstrap > 0, bootstraps the initial configuration. Returns NULL and writes
 * a message into err on failure. */
struct cluster *cluster_new(uv_loop_t *loop, const struct cluster_config *cfg,
                            const struct cluster_ops *ops, char *err, size_t errlen);

/* Starts raft (loads the snapshot and replays the log tail first). 0 or CLUSTER_ERAFT. */
int cluster_start(struct cluster *c);

/* Stops: fails every queued waiter with RAFT_SHUTDOWN (raft fails the proposed ones),
 * closes raft and its I/O, frees the object, then calls cb(data) (cb may be NULL). */
void cluster_close(struct cluster *c, cluster_close_cb cb, void *data);

/* Queues one command (copied) for the next log entry, charged to `account` (below
 * cfg.n_accounts, or CLUSTER_ACCOUNT_NONE). Returns 0, after which the waiter is handed back
 * exactly once; or a negative cluster_rc, after which it never is (CLUSTER_EOVERLOAD:
 * max_pending_bytes; CLUSTER_ESHARE: max_account_pending_bytes). */
int cluster_propose(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter,
                    uint32_t account);

/* With tls.raft, new certificates in two steps, so that a caller that renews other TLS
 * contexts too (idemd's reload) switches none before all loaded. cluster_tls_load: reads
 * the certificate, key and CA files (borrowed for the call) into new contexts for the Raft
 * listener (*server) and connector (*client), which the caller frees with IdemTlsCtxFree
 * (libidem's tls_stream.h) unless it hands them to cluster_tls_set. CLUSTER_OK, or
 * CLUSTER_EINVAL with the reason in err (errlen bytes; "tls: cert_file /path: <OpenSSL's
 * reason>", ...) and both NULL. cluster_tls_set: the Raft connections made from now on use
 * them, as cluster_tls_load made them (taken; a cluster without tls.raft frees them); those
 * that run keep their TLS sessions. */
struct idem_tls_ctx;
int cluster_tls_load(const char *cert_file, const char *key_file, const char *ca_file,
                     struct idem_tls_ctx **server, struct idem_tls_ctx **client, char *err,
                     size_t errlen);
void cluster_tls_set(struct cluster *c, struct idem_tls_ctx *server, struct idem_tls_ctx *client);

/* Grows the accounts to n (cfg.n_accounts; never fewer): the new ones start with nothing
 * pending, the others keep their charges and queues. idemd gives a tenant added by a
 * configuration reload an account of its own. */
void cluster_add_accounts(struct cluster *c, uint32_t n);

/* An account's commands pending now (as max_pending_bytes counts them), those of them held
 * back (max_account_inflight_bytes) and its proposals refused with CLUSTER_ESHARE so far
 * (OUT, any may be NULL). 0 for an account out of range. */
void cluster_account_stats(const struct cluster *c, uint32_t account, uint64_t *pending,
                           uint64_t *queued, uint64_t *refused);

/* The same for a command of the node's own that max_pending_bytes must not keep out (the
 * leader's expire entries, one at a time): counted like the others, never refused for it,
 * so that clients that keep the budget full cannot stop leases from expiring. */
int cluster_propose_own(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter);

bool cluster_is_leader(const struct cluster *c);
/* The leader's id (0 when unknown) and RPC address (OUT, "" when unknown). */
uint64_t cluster_leader(const struct cluster *c, const char **rpc_address);
void cluster_get_status(const struct cluster *c, struct cluster_status *out);

/* Whether a node with status `st` is ready to serve (its HTTP /readyz): it is in its Raft
 * configuration and leads, or follows a leader it heard from within two election timeouts
 * (a voter that hears nothing for one to two of them starts an election, which clears the
 * leader; the margin keeps a heartbeat close to the timeout from making it flap). A node removed
 * from the cluster, or one that took a removed member's place and was sent old messages, keeps the
 * leader it last knew and is not ready; neither is a spare (said as soon as its configuration
 * makes it one), to which the leader sends nothing until it is promoted. When not, `why` (len
 * bytes) says why. */
bool cluster_ready(const struct cluster_status *st, char *why, size_t len);

/* The current configuration with each member's addresses, in ID order. Fills up to `cap`
 * entries of `out` (OUT) and returns how many members there are. */
size_t cluster_members(const struct cluster *c, struct cluster_member *out, size_t cap);

/* Membership changes (leader only). add: records the member's addresses in the log, then
 * adds it as a spare; promote: makes it a voter (raft catches it up first); remove. cb is
 * called once unless the function returns an error. */
int cluster_member_add(struct cluster *c, const struct cluster_member *m,
                       cluster_change_cb cb, void *data);
int cluster_member_promote(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data);
int cluster_member_remove(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data);
/* Leadership transfer to `id` (0: raft's pick, the voter with the most entries, when
 * every other voter was heard from within an election timeout; else the first one that
 * was). CLUSTER_EUNREACHABLE, nothing started, when `id` is a voter this
 * node has not heard from within an election timeout, or for 0 when no other voter is.
 * cb's status is 0 when leadership moved: cluster_leader() then names the new leader. */
int cluster_transfer(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data);
/* Takes a snapshot at the next applied entry (a barrier makes one on the leader). */
int cluster_snapshot_now(struct cluster *c);

const char *cluster_errmsg(const struct cluster *c);
const char *cluster_strerror(int rc);

#endif /* IDEM_CLUSTER_H */
