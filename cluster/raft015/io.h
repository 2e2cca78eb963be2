/* io: raft's disk and network I/O (raft_uv) behind a thin wrapper that corrects bugs of
 * libraft 0.15 (five, below, and one more at io_snapshot_acked) and keeps raft's close clear
 * of a crash in libraft 0.15.
 *
 * The bug (found by tests/sim, see its comment for the replay seed): a follower that accepts
 * an AppendEntries without writing anything (a heartbeat, or entries it already holds)
 * answers with last_log_index = its last *stored* index. When its log still ends with
 * entries of an older term past those the RPC covered, the leader takes them as matching
 * its own and may commit an entry that only it holds; a later leader overwrites it, and
 * replicas apply different commands at the same index. Raft's rule (Figure 2 of the paper)
 * is that a success answer vouches only for prev_log_index + the RPC's entries; the fork
 * cowsql/raft answers exactly that. This wrapper applies that rule to every answer raft
 * sends from inside its handling of an AppendEntries: those are the answers that report
 * without an append. (An answer sent after an append is right already: the append
 * truncated any conflicting suffix first.) The follower side has the same flaw when it
 * advances its commit index (min(leader_commit, last stored index)); the wrapper lowers an
 * incoming AppendEntries' leader_commit to prev_log_index + n_entries, so that a follower
 * commits only entries the RPC proved to match the leader's log.
 *
 * A second flaw of libraft 0.15, on the leader's side (the sim found it too): the leader
 * commits its last stored entry once a majority holds it, whatever that entry's term
 * (replicationQuorum has no check of the term). A new leader whose log ends with entries of
 * an older term, which it has not yet followed with one of its own, commits them by
 * counting replicas; a server whose log ends in a later term than theirs can still win the
 * next election and overwrite them: the case of Figure 8 of the Raft paper, where a
 * committed entry is lost and replicas apply different commands at one index. Raft's rule
 * (section 5.4.2) is to commit by counting replicas only entries of the current term. The
 * wrapper keeps that rule: while the last entry raft has stored is not of its current term
 * (it reads raft's log through io->raft), a successful AppendEntries result reaches raft
 * lowered to one below that entry (never below the commit index), so no follower's match
 * reaches it and raft's progress tracking still moves on; the leader's first entry (the
 * cluster proposes a barrier within a tick of the election, cluster.c) then commits the
 * older ones with it, as the paper does. libraft fixed this after 0.15 (canonical/raft
 * #220, #336).
 *
 * A third, found in review: a 0.15 leader told that a log write failed truncates those
 * entries from its log and stays leader, so its next entries take the same indexes in the
 * same term while followers may hold the first ones. A leader's failed write (outside
 * close) stops the process instead (io_disk.c, ioAppendDone).
 *
 * A fourth, on the follower's side (the sim found it as a crash in removeSuffix; the
 * integration test test_new_leader_sends_from_index_one_to_a_snapshotted_follower shows it
 * on raft_uv): a 0.15 follower handed an AppendEntries that starts below its snapshot,
 * where its log no longer holds the entries, takes them for new ones. With prev_log_index 0
 * (the only such RPC it does not reject: it has nothing to compare) it appends them after
 * its last entry and then stops raft for good ("No log entries found at index 1": the node
 * is left unavailable until restarted) or, in the sim's in-memory I/O, crashes. A leader
 * sends one whenever a send to a follower it has no match index for fails (a leader
 * elected while that follower was down): raft then restarts the follower's replication at
 * match index + 1 = 1, and on a leader that has not snapshotted yet index 1 is still in its
 * log. The wrapper cuts such an RPC (of the follower's term or later) to start at the
 * follower's snapshot: every entry up to it is committed, so the leader of that term holds
 * the same ones (Leader Completeness), and the follower's answer then vouches for the
 * snapshot's index (io_skip_snapshotted). etcd's raft, for comparison, answers an RPC that
 * starts below its commit index with that commit index and appends nothing.
 *
 * A fifth, on the follower's side (integration found it: test_idemctl's
 * test_removing_the_leader_moves_leadership_first; tests/sim builds both ways to it): a 0.15 follower
 * takes a configuration entry it received as its configuration only when the entry's write
 * ends (appendFollowerCb), and then only if it is still a follower. One that became a
 * candidate in between, by a TimeoutNow (a leadership transfer) or its election timer, holds
 * the entry in its log but never takes it, and elected, it leads with the configuration
 * before it: a promotion answered ok was undone by the next change the new leader made. A
 * leader sends TimeoutNow as soon as it has sent the follower its last entry (raft's
 * progressIsUpToDate compares next_index, not match_index), so a transfer right after a
 * change meets the change's write in flight. While a follower has an append of a
 * configuration entry in flight (one it asked as a follower: a leader takes its own when it
 * appends them), the wrapper holds its TimeoutNow (the latest) and gives raft no tick
 * (io_change_waits). Once the append has called back, raft has taken the configuration (if
 * it still holds the entry and is still a follower), the TimeoutNow goes to raft, which
 * checks it again, unless it was held longer than half an election timeout (the leader
 * gives the transfer up an election timeout after it began), and the next tick runs the
 * election timer. A follower
 * whose log write stalls with such an entry in flight does not stand for election
 * meanwhile.
 *
 * Two on raft_uv's truncation of a follower's log: a truncation that fails is only flagged,
 * and one asked while raft_uv holds a snapshot put never runs at all (canonical/raft #372);
 * both leave the entries written after it at the wrong indexes on disk. The wrapper holds a
 * truncation asked during a put, and the appends after it, until the put has called back,
 * and marks and checks every truncation (logdir.h).
 *
 * The wrapper also forwards async_work (raft runs the serialising part of an asynchronous
 * snapshot through it, on raft_uv's thread pool) and holds raft's close back until every
 * such work has called back: raft_uv would otherwise be closed, and freed by the cluster,
 * under a work still running on a pool thread.
 *
 * It holds raft's close back, too, while disk writes raft started are in flight (appends
 * and snapshot puts), for at most close_wait_ms: libraft 0.15 crashes when raft_uv is
 * closed with more than one append still queued (canonical/raft #338; io_close.c explains). Past
 * that bound it closes anyway and says so on stderr (a log write the kernel still holds is
 * then waited for all the same, by raft_uv's io_destroy of its AIO context: aio_reap.h).
 * Pool work is always waited for, without a bound: async works, and with snap_dir the paced
 * snapshot data writes, reads and deletions; the close sets snap_stop, so a write stops at
 * its next chunk and removes its file (the close would discard it anyway), and a deletion
 * stops at its next step and leaves the rest to the next snapshot's gc (snapstore.h).
 *
 * With snap_dir set, it keeps the snapshot's data in a file of its own, written paced, and
 * hands raft_uv a small reference in its place (snapstore.h says why); load and
 * snapshot_get put the data back, so raft above and raft_uv below see nothing different. */
#ifndef IDEM_CLUSTER_IO_H
#define IDEM_CLUSTER_IO_H

#include <sys/queue.h>
#include <raft.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <uv.h>

/* Log appends timed (raft's append to raft_uv's callback: the write and its sync), in
 * buckets bounded by IO_APPEND_BOUND_US(i) = 0.5 ms << i, the last one unbounded. */
#define IO_APPEND_BUCKETS 14
#define IO_APPEND_BOUND_US(i) (500ull << (i))

/* Peers whose last message is kept (io_heard_ago_ms): more than a cluster has members. */
#define IO_PEERS_MAX 64

/* How long raft's close waits for disk writes in flight, by default. */
#define IO_CLOSE_WAIT_MS 2000

struct ioDisk; /* io_internal.h: a disk request in flight */
struct ioHeld; /* io_disk.c: a truncation or append held back */

struct io {
    struct raft_io outer; /* first member; hand &outer to raft_init */
    struct raft_io inner; /* raft_uv_init() it; raft_uv_set_*() and raft_uv_close() on it;
                           * its data is the io (io_wrap) */
    uv_loop_t *loop;      /* raft_uv's loop: the close bound's timer runs on it; NULL: none
                           * (io_wrap) */
    raft_io_tick_cb raft_tick;
    raft_io_recv_cb raft_recv;
    /* Called (with settle_data) after an AppendEntries result went to raft_uv's send, which
     * writes it to the socket at once when nothing is queued before it (answered: true; false
     * when the send failed), and
     * after each of raft's callbacks from here returns: a message received, a tick, an
     * append done (false); NULL: none (io_settle). */
    void (*settle)(void *data, bool answered);
    void *settle_data;
    raft_io_close_cb close_cb;
    bool in_append_entries;
    raft_id ae_from;
    raft_index ae_end;
    unsigned long corrected;    /* answers and commit indexes clamped so far */
    struct raft *raft;          /* set after raft_init(): the leader's hold reads its log,
                                 * io_snapshot_acked lowers a progress' match index */
    unsigned long results_held; /* AppendEntries results lowered by the hold */
    unsigned long rematched;    /* match indexes lowered to an installed snapshot */
    unsigned long unaddressed;  /* AppendEntries results not sent: io_result_unaddressed */
    unsigned long skipped;      /* AppendEntries that started below the snapshot, cut */
    unsigned long stale_votes;  /* vote requests let past a leader not heard from for an
                                 * election timeout: io_vote_past_stale_leader */
    /* An InstallSnapshot held while raft stores another snapshot (io_install_waits): the
     * message (its data and configuration owned here until raft gets it) and a copy of its
     * sender's address, non-NULL exactly while one is held; how many were held so far. */
    struct raft_message held_install;
    char *held_install_addr;
    unsigned long installs_held;
    /* Appends in flight that hold a configuration entry, and a TimeoutNow held meanwhile
     * (io_change_waits): the message and a copy of its sender's address, non-NULL exactly
     * while one is held; how many were held, and how many ticks raft was not given. */
    unsigned change_appends;
    struct raft_message held_timeout_now;
    char *held_timeout_now_addr;
    raft_time held_timeout_now_at; /* when it arrived (ms, the wrapper's clock, io.c) */
    unsigned long timeouts_held;
    unsigned long timeouts_dropped; /* held past half an election timeout: not handed over */
    unsigned long ticks_held;
    unsigned works;              /* pool work in flight: async_work, snapstore's */
    unsigned disk;               /* appends and snapshot puts in flight */
    bool closing;                /* raft called close */
    bool close_deferred;         /* ... and the inner close waits for works and disk writes */
    bool inner_closing;          /* the inner close has been called */
    bool disk_wait_over;         /* close_wait_ms passed: the close waits for works only */
    unsigned close_wait_ms;      /* IO_CLOSE_WAIT_MS unless a test sets it after io_wrap() */
    uv_timer_t *close_timer;     /* while the close waits: bounds it, then runs it */
    unsigned long late_failures; /* appends that ended failed or canceled after close */
    /* Snapshot data through snapstore (snapstore.h): set snap_dir (raft_uv's directory,
     * alive as long as the io) after io_wrap(); NULL passes snapshots to raft_uv as they
     * are. Its pool work is counted in works. */
    const char *snap_dir;
    unsigned snap_pause_us;        /* SNAPSTORE_PAUSE_US unless a test sets it */
    unsigned snap_delete_pause_us; /* SNAPSTORE_DELETE_PAUSE_US unless a test sets it */
    atomic_bool snap_stop;         /* set by raft's close: snapstore's pool work stops early */
    uint64_t snap_last;            /* index of the last snapshot stored or loaded */
    /* Index raft_uv stores the next appended entry at (its log's last + 1), 0 if not known:
     * appends asked at another index stop the node (io_disk.c, checkAppendIndex). */
    uint64_t disk_next;
    /* raft_uv's directory, where truncations are marked and checked (logdir.h); NULL: they
     * are not. Set after io_wrap(), alive as long as the io. */
    const char *log_dir;
    uint64_t trunc_last; /* the last truncation marked, until an append carries its check */
    /* Snapshot puts raft_uv holds (submitted, not called back), and what waits for them: a
     * truncation raft asks meanwhile, and every append and put after it (io_disk.c,
     * io_disk_release_held). */
    unsigned puts_inner;
    unsigned long truncs_held; /* truncations held back so far */
    bool release_queued;       /* what was held goes to raft_uv at the loop's next turn */
    TAILQ_HEAD(ioHeldOps, ioHeld) held;
    TAILQ_HEAD(ioAppends, ioDisk) appends; /* appends in flight, oldest first */
    /* The node's own snapshot puts (not installs) that ended while raft was open: how
     * many, how many of them failed, and the last one's status and message. */
    unsigned long own_puts, own_put_failures;
    int own_put_status;
    char own_put_err[256];
    uint64_t own_put_us; /* the last one's time from raft's put to its end (data written,
                          * durable, and referenced by raft_uv) */
    /* What io_snap_load took at start (µs): all of it (the start-up repairs, raft_uv's load
     * of its metadata and log, the snapshot data), and the snapshot data's part (read and
     * its hash checked); 0 before a load. */
    uint64_t load_us, load_snap_us;
    /* The snapshot data io_snap_load mapped (snapstore_map) for raft to hand the state
     * machine's restore, until io_snap_data_free/unmap releases it; NULL: none. */
    void *snap_map;
    uint64_t snap_map_len;
    struct {
        raft_id id;      /* 0: unused */
        raft_time at_ms; /* the wrapper's clock (io.c, ioNow) when a message from it last arrived */
    } heard[IO_PEERS_MAX];
    uint64_t append_buckets[IO_APPEND_BUCKETS]; /* appends that succeeded, by duration */
    uint64_t append_count;
    uint64_t append_sum_us;
    /* The last committed configuration raft had settled on (io_conf.c): a copy, and its
     * entry's index (0: none yet); rollbacks done from it, and start-ups whose last
     * configuration entry was marked uncommitted. */
    struct raft_configuration conf;
    raft_index conf_index;
    unsigned long conf_rollbacks;
    unsigned long conf_marked;
    unsigned long conf_cleared; /* uncommitted indexes a snapshot or an apply covered */
};

/* libraft 0.15's rollback of an uncommitted configuration (io_conf.c, docs/raft-0.15.md
 * 32). io_conf_init: in io_wrap; io_conf_free: when the close ends. io_conf_note: clears an
 * uncommitted index a snapshot installed or an apply covered (0.15's snapshotRestore
 * leaves it), then copies raft's configuration when none is uncommitted and it changed
 * (after each callback, and before a snapshot is taken). io_conf_snapshot_loaded: the configuration of the snapshot
 * loaded at start. io_conf_rollback: before raft handles an AppendEntries; rolls back
 * itself, from the copy, when the AppendEntries overwrites the uncommitted entry and the
 * committed one is no longer in raft's log; true if it did. io_conf_after_start: after
 * raft_start, marks a last configuration entry past the snapshot uncommitted. */
void io_conf_init(struct io *io);
void io_conf_free(struct io *io);
void io_conf_note(struct io *io);
void io_conf_snapshot_loaded(struct io *io, const struct raft_snapshot *s);
bool io_conf_rollback(struct io *io, const struct raft_append_entries *ae);
void io_conf_after_start(struct io *io);

/* The follower's commit rule (above), on one incoming AppendEntries: lowers its
 * leader_commit to prev_log_index + n_entries. Returns true if it lowered it. The wrapper
 * applies it to every AppendEntries. */
bool io_clamp_commit(struct raft_append_entries *ae);

/* The leader's commit rule (above), on one AppendEntries result about to reach the raft r
 * of a leader: while the last entry r has stored is not of its current term, a success
 * answer is lowered to one below that entry, or to r's commit index if higher. Returns true
 * if it lowered it. io_wrap's wrapper applies it once io->raft is set. */
bool io_hold_result(const struct raft *r, struct raft_append_entries_result *res);

/* A leader's view of a follower that lost its data (a wiped data directory): libraft 0.15
 * keeps the match index that follower reported before, sends it the snapshot it now needs
 * (the follower's log is empty), and then ignores the follower's acknowledgement of that
 * snapshot when the snapshot is at or below the old match index (progressMaybeUpdate sees
 * nothing new, so the progress stays in snapshot mode and every later answer is ignored
 * too), until raft's install-snapshot timeout (30 s) sends it back to probing. On one
 * success result from `from` about to reach the leader r: when r's progress of `from` is in
 * snapshot mode and the result acknowledges exactly that snapshot, at or below the match
 * index, the match index is lowered to one below it, so that raft takes the
 * acknowledgement and resumes replication from the snapshot at once. Lowering a match index
 * never commits anything (a commit index never goes back, and fewer replicas are counted).
 * Returns true if it lowered it. io_wrap's wrapper applies it once io->raft is set. */
bool io_snapshot_acked(struct raft *r, raft_id from, const struct raft_append_entries_result *res);

/* libraft 0.15 answers an append or a snapshot install that a follower started once it
 * completes, to r->follower_state.current_leader, without checking that r is still a
 * follower (a snapshot install's answer only checks that r is not shut down, and some
 * append paths likewise): a node that became a candidate or leader meanwhile (leader churn)
 * sends to the address field of a union member it no longer is, whose bytes are then the
 * candidate's flags or the leader's promotee ID (a reviewer's flood crashed followers in
 * raft_uv's UvSend, in strlen), and a follower that knows no leader sends to NULL. True
 * for such an answer (r's state not follower and its address that very field, or no
 * address at all), which the wrapper then does not send (RAFT_NOCONNECTION; raft frees
 * the request); an answer to a message, addressed from that message, is not affected and
 * must stay so: as libraft's sources around 0.15 read, recvAppendEntries frees the entries
 * of a message it answers at once, and recv() frees them again when that send fails (a
 * double free). */
bool io_result_unaddressed(const struct raft *r, const struct raft_message *m);

/* The follower's rule for entries its snapshot covers (above), on one incoming
 * AppendEntries about to reach the raft r: when the RPC starts below r's last snapshot
 * index (and is of r's term or later), its entries up to that index are dropped (their
 * batches freed) and prev_log_index/prev_log_term become that index and the leader's term
 * for it (the snapshot's own term when the RPC ends before it). Returns true if it changed the
 * RPC. io_wrap's wrapper applies it once io->raft is set. */
bool io_skip_snapshotted(const struct raft *r, struct raft_append_entries *ae);

/* libraft 0.15's follower drops an InstallSnapshot that arrives while it is storing a
 * snapshot ("already taking or installing snapshot"), without an answer: its leader's
 * progress stays in snapshot mode, ignoring every later answer of that follower (an answer
 * for an older snapshot included), until raft's install-snapshot timeout (30 s) sends the
 * snapshot again. Seen, a follower restarted behind the leader's log lagging 30 s (with one
 * more node down, the cluster would have had no quorum for that long): (a) it took its own
 * snapshot of what it had replayed just as the leader's arrived; (b) the leader's older
 * snapshot, queued while the follower was down, was being installed when the newer one the
 * leader then waited for arrived. True for such a message: an InstallSnapshot reaching r
 * while r is storing a snapshot, libraft's own test (its own: r->snapshot.pending is set from
 * the take until its put called back; an install: the put is set until it called back).
 * The wrapper then holds the message (at most one, the newest) and hands it to raft at the
 * first tick after the snapshot is stored, as a message delayed on the network (one no newer
 * than what was stored is answered as done); at the close a message still held is freed. */
bool io_install_waits(const struct raft *r, const struct raft_message *m);

/* Whether raft, a follower with an append of a configuration entry in flight, must get
 * neither a TimeoutNow nor a tick yet (the fifth flaw, above). */
bool io_change_waits(const struct io *io);

/* The interval of raft's tick that the wrapper asks raft_uv for, at most: libraft 0.15 ticks
 * once a heartbeat timeout, so a follower noticed its leader gone up to a heartbeat late
 * and a leader sent its heartbeats up to twice that far apart. */
#define IO_TICK_MAX_MS 10

/* libraft 0.15 refuses a vote, a pre-vote included, as long as a follower knows a leader,
 * that is until the follower's own randomised election timer fires: after a leader fails,
 * the survivors elect only once the later of their timers fires. The thesis (§4.2.3)
 * refuses only within the minimum election timeout of hearing from the leader. This
 * wrapper refuses within io_stale_leader_ms: a candidate asks only after an election
 * timeout without its leader, and the voter's last heartbeat can be a little more recent
 * than the candidate's (they are sent one by one, and arrive as each node is scheduled),
 * which with the whole timeout made the first candidate lose often near it.
 * When the RequestVote `m` reaches a follower `r` whose leader has not been heard from for
 * io_stale_leader_ms(r) (since r->election_timer_start, at `now` in raft's clock), this
 * marks it disrupt_leader, which libraft reads for nothing but that refusal; the vote is
 * then decided on terms, the vote already given and the logs, as any other. Returns
 * whether it did. Not while the follower stores a snapshot (later libraft refuses votes
 * then). Safety does not depend on when a vote is granted; a leader that is alive
 * reaches its followers every heartbeat, so they still refuse a node that returns from a
 * partition or lost its link to the leader alone. */
bool io_vote_past_stale_leader(const struct raft *r, raft_time now, struct raft_message *m);

/* Half the election timeout, but at least two heartbeat timeouts (two heartbeats missed),
 * and at most the election timeout. */
raft_time io_stale_leader_ms(const struct raft *r);

/* libraft 0.15 draws a follower's randomised election timeout only when the node becomes a
 * follower, and keeps it while it stays one, through later terms too. The survivor whose
 * timer lost the last election keeps that late draw, and the faults that take a leader
 * (the node with the earlier timer) leave it beside the old leader's fresh draw: the next
 * failover waits for the later of two timers more often than two fresh draws would make
 * it (in five chaos runs the first vote request came a median 436 ms after the leader's last
 * message, over 42 elections, where two fresh draws in 300-600 ms give 388 ms). As the
 * thesis (§3.4) does, the wrapper draws again whenever the leader resets the timer:
 * whether an AppendEntries that raft just handled reset follower r's timer (it came from
 * the leader of r's term: the timer's start is no longer `start_before`, its value before
 * raft had the message); the caller then draws r's timeout anew. */
bool io_timer_reset_by_leader(const struct raft *r, raft_time start_before);

/* Makes raft_uv write to server `id` (at its address in raft's configuration; nothing when
 * it has none there, or raft is not set): a vote answer that grants nothing, in raft's
 * current term, which no raft acts on. Called for a peer whose connection was found closed
 * (transport_dead_outgoing): the write fails on the connection shut for writing, and
 * raft_uv connects again at once (then every connect_retry_delay until the peer answers),
 * so the connection is new when raft next sends there. Only on a node that does not lead
 * (cluster.c, tickConnections). */
void io_poke(struct io *io, raft_id id);

/* The data of a snapshot raft hands the state machine to restore (raft_fsm.restore, which
 * owns it): io_snap_data_free releases it, unmapped when it is the one io_snap_load mapped
 * (io->snap_map), raft_free()d otherwise (a snapshot the leader sent). After a restore that
 * failed, raft frees the buffer itself with raft_free(): io_snap_data_unmap unmaps it first
 * if it was mapped and returns true, and the caller then sets the buffer's base to NULL. */
void io_snap_data_free(struct io *io, void *base);
bool io_snap_data_unmap(struct io *io, const void *base);

/* Fills io->outer with methods that delegate to io->inner. Call after raft_uv_init(), with
 * the loop raft_uv runs on (the io does not own it). It sets io->inner.data to io: the
 * inner io's callbacks find the wrapper through the data of the raft_io they are handed.
 *
 * The simulation (tests/sim) wraps raft_fixture's in-memory raft_io the same way, with loop
 * NULL: a copy of the fixture's raft_io as inner (its impl is the fixture's), whose data,
 * and that of the fixture's own raft_io (which the fixture hands its tick and receive
 * callbacks), is the io.
 * With no loop, the clock (io_heard_ago_ms) is the inner io's time(), what is held back for
 * a snapshot put goes to the inner io as soon as the put has called back (the fixture has
 * no barrier to wait for), and the close waits for nothing but async works (the fixture
 * completes every request before it closes); snap_dir must stay NULL (snapstore's writes
 * run on the loop's pool). */
/* Calls io->settle(io->settle_data, answered) if set (struct io). */
void io_settle(struct io *io, bool answered);

void io_wrap(struct io *io, uv_loop_t *loop);

/* Milliseconds since the last raft message from server `id` arrived, or UINT64_MAX when
 * none has since this node started (or since IO_PEERS_MAX other servers were heard from
 * after it). The leader hears from every follower at least once a heartbeat while that
 * follower is up and connected. */
uint64_t io_heard_ago_ms(const struct io *io, raft_id id);

/* When (uv_hrtime() in µs) the oldest log append still in flight was asked for, 0 when none
 * is. A disk that stops answering shows here: such an append never reaches the histogram. */
uint64_t io_oldest_append_us(const struct io *io);

#endif
