/* logdir: what idemd reads of raft_uv's log segment names, and the marks that keep a log
 * truncation from being taken as done before it is.
 *
 * raft_uv (libraft 0.15) truncates a follower's log on a pool thread: it closes the open
 * segment, rewrites the closed segment holding the first entry to remove without it and
 * deletes that segment and every later closed one. When a step fails (a file that cannot
 * be opened, a full disk, too many open files) it only sets a flag that nothing reads: raft
 * goes on, and raft_uv writes the entries that follow in a new open segment. Its segments
 * give no entry an index of its own (the loader numbers entries in file order), so after a
 * restart those entries are taken to follow the ones that should have gone: the log then
 * holds the leader's entries at the wrong indexes and the removed ones back in place. Seen:
 * a follower whose truncation failed went on, acknowledged 60 more entries and was
 * restarted; the leader's check (same index, same term) passed where the shifted entries
 * had its term, and the follower applied entries no majority held: 186 records against the
 * others' 200 at the same applied index.
 *
 * So io_disk.c marks a truncation in the directory (an empty directory idem-truncate-<index>,
 * made durable) before raft_uv is asked for it. The first append after it is checked
 * before raft hears that it ended: no closed segment may end at or past the index, and no
 * more than one open segment may hold entries (the one written since; another would be the
 * open segment raft_uv failed to close, whose entries a successful truncation leaves in
 * place all the same). Then the mark goes. When the check fails, the node stops, and at its
 * next start, before raft_uv loads the log, logdir_recover finds the mark. It first removes
 * what a truncation stopped halfway leaves (the shorter of two closed segments from one
 * first index, closed segments from the mark on: entries there are not committed). Then with a
 * closed segment ending at or past index - 1 every open segment holds only entries past the
 * truncation point (none committed; those written after it were never acknowledged), so
 * they are moved into idem-untruncated/ and the node starts from its log as it was before
 * the truncation, which the leader asks for again. Otherwise, with more than one open
 * segment holding entries, the log cannot be put right from here and the node refuses to
 * start (remove its data directory: it rejoins from the leader's snapshot).
 *
 * All functions block (mkdir, directory fsync, a directory listing): io_disk.c and
 * io_snap.c (at load) call them on the loop thread, but only around a truncation (a
 * follower's log diverged: after a leader change) and at start. They return 0 or -1 with a
 * message in err unless said otherwise. */
#ifndef IDEM_CLUSTER_LOGDIR_H
#define IDEM_CLUSTER_LOGDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LOGDIR_MARK_PREFIX "idem-truncate-"
#define LOGDIR_UNTRUNCATED "idem-untruncated"

/* raft_uv's closed segment name: 16 digits, '-', 16 digits (first and last index). */
bool logdir_closed_segment(const char *name, uint64_t *first, uint64_t *end);

/* raft_uv's open segment name: "open-" and its counter. */
bool logdir_open_segment(const char *name);

/* fsync of the directory dir (raft_uv's, where snapstore's files are too). */
int logdir_sync(const char *dir, char *err, size_t errlen);

/* Marks a truncation of the log from index on (durable when this returns 0). */
int logdir_truncate_begin(const char *dir, uint64_t index, char *err, size_t errlen);

/* 1 when the truncation from index on is done (see above), 0 when it is not, 2 when that
 * cannot be told yet (raft_uv is closing an open segment: two hold entries, or one went
 * while listed), -1 on an error; why in err unless 1. */
int logdir_truncate_done(const char *dir, uint64_t index, char *err, size_t errlen);

/* Removes the mark of the truncation from index (0: every mark), durably. */
int logdir_truncate_end(const char *dir, uint64_t index, char *err, size_t errlen);

/* At start, before raft_uv loads: puts right a truncation that was marked and not checked
 * (above). 0 with msg "" when there was none, 0 with what it did in msg, or -1 with why the
 * node must not start in msg. */
int logdir_recover(const char *dir, char *msg, size_t msglen);

#endif
