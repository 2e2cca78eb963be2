/* cluster: the Raft group of one node: its lifecycle (cluster_new, cluster_start,
 * cluster_close), its status, the tick, and raft's apply callback. The group's parts and
 * the path of a proposal: cluster_internal.h. */
#include "cluster_internal.h"

#include <assert.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "aio_reap.h"
#include "clog.h"
#include "raft_tls.h"
#include "segfill.h"
#include "wire_check.h"

#define TICK_MS 100
#define DECODE_ARENA_BYTES (64u * 1024u) /* a batch of a few hundred claims decodes within it */
/* The most bytes of committed entries a follower holds to apply after its answer (fsmApply):
 * a round's entries, not a catch-up's. */
#define DEFER_MAX_BYTES (1024u * 1024u)

void cluster_set_err(struct cluster *c, const char *prefix, const char *detail)
{
    /* Cut to the buffer (the detail can be raft's own 256-byte message). */
    size_t cap = sizeof(c->errmsg);
    size_t n = strnlen(prefix, cap - 1);
    memcpy(c->errmsg, prefix, n);
    size_t d = strnlen(detail, cap - 1 - n);
    memcpy(c->errmsg + n, detail, d);
    c->errmsg[n + d] = '\0';
}

const char *cluster_errmsg(const struct cluster *c)
{
    return c->errmsg;
}

const char *cluster_strerror(int rc)
{
    switch (rc) {
    case CLUSTER_OK:
        return "ok";
    case CLUSTER_ENOTLEADER:
        return "not the leader";
    case CLUSTER_ETOOBIG:
        return "command too large for a log entry";
    case CLUSTER_ESTOPPING:
        return "node is shutting down";
    case CLUSTER_EBUSY:
        return "a membership change is already in flight";
    case CLUSTER_EINVAL:
        return "invalid argument";
    case CLUSTER_EUNREACHABLE:
        return "the node named is not reachable from the leader";
    case CLUSTER_ERAFT:
        return "raft error";
    case CLUSTER_EOVERLOAD:
        return "the leader holds batch.max_pending_mb of commands not yet committed: send it "
               "again later";
    case CLUSTER_ESETTLING:
        return "the last configuration change is not committed yet";
    case CLUSTER_ESHARE:
        return "this tenant holds its share (batch.tenant_max_pending_percent) of the commands "
               "the leader has not yet committed: send it again later";
    case CLUSTER_ETRANSFER:
        return "this leader is handing its leadership to another voter: send it again shortly";
    }
    return "unknown cluster error";
}

void *cluster_xcalloc(size_t n)
{
    void *p = calloc(1, n);
    if (p == NULL) {
        clog_error("out of memory");
        abort();
    }
    return p;
}

static char *xdup(const char *s)
{
    size_t n = strlen(s ? s : "");
    char *p = cluster_xcalloc(n + 1);
    memcpy(p, s ? s : "", n);
    return p;
}

/* Applies the committed entry at index (its bytes in buf) to the state machine. */
static void applyEntry(struct cluster *c, uint64_t index, const struct raft_buffer *buf)
{
    /* Decoded into the arena (an entry's commands are copied out of raft's buffer, up to a
     * thousand of them), which the next entry's decode reuses. */
    arena_reset(&c->decode);
    Idem__LogEntry *e = batch_entry_decode(buf, &c->decode.pb);
    if (e == NULL) {
        /* Every replica holds the same bytes and skips them alike. */
        clog_error("log entry %llu does not decode; skipped", (unsigned long long)index);
        return;
    }
    if (e->kind_case == IDEM__LOG_ENTRY__KIND_BATCH) {
        batch_apply(c, e->batch, index);
    } else if (e->kind_case == IDEM__LOG_ENTRY__KIND_MEMBER) {
        members_apply_info(c, e->member);
    }
}

unsigned long cluster_apply_deferred(struct cluster *c)
{
    unsigned long n = 0;
    struct deferred *d;
    while ((d = STAILQ_FIRST(&c->deferred)) != NULL) {
        STAILQ_REMOVE_HEAD(&c->deferred, link);
        c->deferred_bytes -= d->len;
        struct raft_buffer buf = {.base = d->data, .len = d->len};
        applyEntry(c, d->index, &buf);
        free(d);
        n++;
    }
    return n;
}

/* The I/O wrapper's call after an AppendEntries result went to raft_uv's send (answered),
 * and after each of raft's callbacks through it returns (io.h, io_settle).
 *
 * After an answer sent over plain TCP, the entries held are applied only once this thread
 * yielded its CPU: the answer just woke the leader, which commits with it and answers its
 * clients, and the kernel tends to wake a process on the CPU of the one that woke it.
 * Applying at once would keep the leader waiting there for the application's time (tens of
 * microseconds for an entry of 64 claims) whenever nodes share cores; the yield lets it run
 * first, and costs a system call where nothing else is waiting for the CPU. Over Raft's TLS
 * the answer has only reached the local TLS pump, which sends it on a later loop turn: no
 * leader is awake yet, and the yield would only delay it.
 *
 * A yield that takes over YIELD_LONG_NS gave the CPU to other work than the leader's round
 * (a busy machine's processes, a time slice each): then none for YIELD_OFF_NS, so that a
 * follower beside CPU-bound processes keeps its share of the CPU and keeps up with its
 * leader instead of giving a slice away after every answer. */
#define YIELD_LONG_NS (1000u * 1000u)
#define YIELD_OFF_NS (1000u * 1000u * 1000u)

static void ioSettled(void *data, bool answered)
{
    struct cluster *c = data;
    if (answered && !STAILQ_EMPTY(&c->deferred) && c->cfg.raft_tls_cert_file == NULL) {
        uint64_t t0 = uv_hrtime();
        if (t0 >= c->yield_off_until_ns) {
            (void)sched_yield();
            if (uv_hrtime() - t0 > YIELD_LONG_NS) {
                c->yield_off_until_ns = t0 + YIELD_OFF_NS;
            }
        }
    }
    unsigned long n = cluster_apply_deferred(c);
    if (answered) {
        c->deferred_applies += n;
    }
}

/* raft's apply callback, on every node for every committed entry, in log order.
 *
 * A follower answers an append only after applying what that append committed (libraft
 * 0.15's order), so the application would delay the answer, and with it the leader's
 * commit of the next entry. A follower with no command of its own waiting (none proposed
 * that is not answered) keeps a copy of the entry instead, up to DEFER_MAX_BYTES of them
 * (a follower catching up applies at once), and applies it right after the answer is sent
 * (once it yielded its CPU to the leader the answer woke, ioSettled), or else as raft's
 * callback that applied it returns (ioSettled; batch_flush_cb at the end
 * of the loop turn as well), and before anything that reads or replaces the state from
 * within raft: the next entry applied at once, a snapshot taken or restored, the close. So
 * the state is never behind raft's applied index outside that one raft callback. */
static int fsmApply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct cluster *c = fsm->data;
    /* raft advances last_applied after this call returns. */
    uint64_t index = raft_last_applied(&c->raft) + 1;
    *result = NULL;
    snapshot_note_applied(c, buf->len);
    if (raft_state(&c->raft) == RAFT_FOLLOWER && TAILQ_EMPTY(&c->pending) && !c->stopping &&
        c->deferred_bytes + buf->len <= DEFER_MAX_BYTES) {
        struct deferred *d = malloc(sizeof(*d) + buf->len);
        if (d == NULL) {
            clog_error("out of memory");
            abort();
        }
        d->index = index;
        d->len = buf->len;
        memcpy(d->data, buf->base, buf->len);
        STAILQ_INSERT_TAIL(&c->deferred, d, link);
        c->deferred_bytes += buf->len;
        uv_check_start(&c->flush, batch_flush_cb);
        return 0;
    }
    cluster_apply_deferred(c);
    applyEntry(c, index, buf);
    return 0;
}

struct leaderBarrier {
    struct raft_barrier req;
    struct cluster *c;
    raft_term term;
};

static void leaderBarrierCb(struct raft_barrier *req, int status)
{
    struct leaderBarrier *lb = req->data;
    if (status != 0 && lb->c->barrier_term == lb->term) {
        lb->c->barrier_term = 0; /* the next tick proposes another while still leader */
    }
    free(lb);
}

/* ---- tick: leader changes, health, the leader's barrier (snapshot.c and members.c add theirs) */

/* Said at most every 10 s (the stuck-write warning's period): a leader with no other
 * voter to hand over to would repeat it every attempt. */
static void stuckRefusal(struct cluster *c, const char *what, const char *why)
{
    uint64_t now = uv_hrtime() / 1000u;
    if (now - c->stuck_refusal_logged_us < CLUSTER_STUCK_APPEND_US * 2) {
        return;
    }
    c->stuck_refusal_logged_us = now;
    clog_warn("%s (this leader's log write is stuck): %s; asking again", what,
              why[0] != '\0' ? why : "no reason given");
}

static void stuckTransferCb(void *data, int status, const char *errmsg)
{
    struct cluster *c = data;
    if (c->stopping) {
        return; /* raft_close ends a pending transfer: nothing to say, nothing to retry */
    }
    raft_id lid = 0;
    const char *addr = NULL;
    raft_leader(&c->raft, &lid, &addr);
    if (status == 0) {
        clog_warn("leadership moved to node %llu (this node's log write is stuck)",
                  (unsigned long long)lid);
    } else {
        stuckRefusal(c, "the handover failed", errmsg);
    }
}

/* The leader's own log write has been in flight for raft.stuck_write_step_down_ms: ask
 * another voter to take over (cluster.h). Its followers hold every entry it sent them, so
 * one of them can lead; while the stuck write is this node's first entry of its term it
 * commits nothing (that entry must be stored first, io.h), and its heartbeats would keep
 * every other node from taking over. At most once per two election timeouts, while it
 * lasts. */
static void maybeStepDown(struct cluster *c, uint64_t now, uint64_t age_us)
{
    if (raft_state(&c->raft) != RAFT_LEADER || c->raft.transfer != NULL || c->stopping ||
        now - c->stuck_transfer_us < (uint64_t)c->cfg.election_timeout_ms * 2000u) {
        return;
    }
    c->stuck_transfer_us = now;
    if (cluster_transfer(c, 0, stuckTransferCb, c) != CLUSTER_OK) {
        stuckRefusal(c, "cannot hand leadership over", c->errmsg);
        return;
    }
    clog_warn("this leader's log write has been in flight for %.1f s "
              "(raft.stuck_write_step_down_ms): asking another voter to take over",
              (double)age_us / 1e6);
}

/* Tells ops.leader_changed when the known leader changed since the last tick. */
static void tickLeader(struct cluster *c)
{
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    if (lid != c->seen_leader) {
        if (lid != 0) {
            c->leader_changes++;
        }
        c->seen_leader = lid;
        if (c->ops.leader_changed != NULL) {
            c->ops.leader_changed(c->ops.data, lid, lid == c->cfg.id);
        }
    }
}

/* raft stopped for good, or this node's log write is stuck: says so, and acts. */
static void tickHealth(struct cluster *c)
{
    if (raft_state(&c->raft) == RAFT_UNAVAILABLE && !c->stopping) {
        /* raft gave up on an error (libraft stops taking part rather than crash: a term or
         * vote it could not store, say) and only a restart brings it back. A node that stayed
         * up so would answer status and nothing else, and count as a voter that never
         * votes: with another node down, the cluster had no leader until someone restarted
         * it. Stop, so that a supervisor restarts it (Restart=on-failure). */
        /* raft does not always set its message when it stops: it may be empty or older;
         * the I/O's last message (a failed write of the term, say) tells more then. */
        const char *m = raft_errmsg(&c->raft);
        const char *iom = c->io.outer.errmsg;
        clog_error("raft stopped on this node (raft's last error message: %s; its I/O's: "
                   "%s); stopping: restarted, it resumes from what its disk holds",
                   m[0] != '\0' ? m : "none", iom[0] != '\0' ? iom : "none");
        abort();
    }
    uint64_t oldest = io_oldest_append_us(&c->io), now = uv_hrtime() / 1000u;
    if (oldest != 0 && now - oldest >= CLUSTER_STUCK_APPEND_US &&
        now - c->stuck_append_warned_us >= CLUSTER_STUCK_APPEND_US * 2) {
        /* A disk that does not answer holds every commit of this node (of the cluster, on
         * the leader: its heartbeats still go out, so no other node takes over until it
         * hands over, maybeStepDown); raft_uv gives no time-out. Said every 10 s while it
         * lasts; idem_raft_append_oldest_seconds has it at any time. */
        c->stuck_append_warned_us = now;
        clog_warn("a Raft log write has been in flight for %.1f s on this node (%s): its "
                  "disk is slow or not answering",
                  (double)(now - oldest) / 1e6,
                  raft_state(&c->raft) == RAFT_LEADER ? "the leader: nothing commits meanwhile"
                                                      : "a follower");
    }
    if (oldest != 0 && c->cfg.stuck_write_step_down_ms != 0 &&
        now - oldest >= (uint64_t)c->cfg.stuck_write_step_down_ms * 1000u) {
        maybeStepDown(c, now, now - oldest);
    }
}

/* Outgoing connections whose peer closed them are made anew now (transport.h), not when the
 * next message, a vote perhaps, is lost on them. A leader only shuts them: its next
 * heartbeat, within a heartbeat timeout, fails at once and raft_uv connects again. Poked
 * from a leader, a follower wiped and restarted in between was not sent the snapshot it
 * needed until raft's install timeout (30 s; integration.wipedfollower). */
static void tickConnections(struct cluster *c)
{
    raft_id ids[TRANSPORT_WATCHED_MAX];
    size_t n = transport_dead_outgoing(&c->transport, ids, TRANSPORT_WATCHED_MAX);
    for (size_t i = 0; i < n && !c->stopping && raft_state(&c->raft) != RAFT_LEADER; i++) {
        io_poke(&c->io, ids[i]);
    }
}

/* A new leader proposes a barrier in its term (below). */
static void tickBarrier(struct cluster *c)
{
    if (raft_state(&c->raft) == RAFT_LEADER && c->barrier_term != c->raft.current_term) {
        /* A new leader's first entry of its own term: until it is stored, no follower's
         * answer counts towards a commit (io.h: libraft 0.15's Figure 8 flaw), and once it
         * commits, the entries of older terms before it commit with it, with or without
         * client traffic. Tried again on the next tick if raft refuses it (a leadership
         * transfer pending) or it fails. */
        struct leaderBarrier *lb = cluster_xcalloc(sizeof(*lb));
        lb->req.data = lb;
        lb->c = c;
        lb->term = c->raft.current_term;
        if (raft_barrier(&c->raft, &lb->req, leaderBarrierCb) == 0) {
            c->barrier_term = lb->term;
        } else {
            free(lb);
        }
    }
}

static void tickCb(uv_timer_t *t)
{
    struct cluster *c = t->data;
    if (c->queued_bytes != 0) {
        /* Held-back commands go in as their accounts' batches apply (batch.c, applyCb); one held
         * while a transfer paused the proposals goes in now, and a node that no longer
         * leads hands them back (a batch failed by the lost leadership does at once). */
        if (raft_state(&c->raft) != RAFT_LEADER) {
            admission_fail_queued(c, RAFT_NOTLEADER);
        } else {
            admission_admit_queued(c);
        }
    }
    tickLeader(c);
    tickHealth(c);
    tickConnections(c);
    tickBarrier(c);
    snapshot_tick(c);
    if (raft_state(&c->raft) == RAFT_LEADER) {
        members_tick(c);
    }
}

/* ---- lifecycle ----------------------------------------------------------------------- */

/* Whether cluster_new may take cfg and ops (cluster.h). */
static bool configValid(const struct cluster_config *cfg, const struct cluster_ops *ops)
{
    unsigned async_ops = (ops->snapshot_freeze != NULL) + (ops->snapshot_write != NULL) +
                         (ops->snapshot_release != NULL);
    return !(cfg->id == 0 || cfg->batch_max_commands == 0 ||
             cfg->batch_max_commands > ((1u << BATCH_SLOT_BITS) - 1) ||
             cfg->batch_max_bytes == 0 ||
             cfg->max_pending_bytes < cfg->batch_max_bytes + CLUSTER_COMMAND_OVERHEAD ||
             (async_ops != 0 && async_ops != 3) || (async_ops == 0 && ops->snapshot == NULL));
}

/* Opens the transport (with cfg's secrets, and TLS when cfg names its files) and raft_uv on
 * it, wrapped (io.h). 0, or -1 with a message in err and nothing left open. */
static int ioOpen(struct cluster *c, const struct cluster_config *cfg, char *err, size_t errlen)
{
    struct transport_secret secrets[TRANSPORT_KEYS_MAX];
    size_t n_secrets = 0;
    if (cfg->raft_secret != NULL) {
        secrets[n_secrets++] = (struct transport_secret){cfg->raft_secret, cfg->raft_secret_len};
        if (cfg->raft_previous_secret != NULL) {
            secrets[n_secrets++] = (struct transport_secret){cfg->raft_previous_secret,
                                                             cfg->raft_previous_secret_len};
        }
    }
    int rv = transport_init(&c->transport, c->loop, secrets, n_secrets);
    if (rv != 0) {
        snprintf(err, errlen, "raft transport: %s", raft_strerror(rv));
        return -1;
    }
    transport_set_listen(&c->transport, cfg->raft_listen);
    transport_set_resolver(&c->transport, cfg->resolver);
    if (cfg->raft_tls_cert_file != NULL) {
        struct raft_tls_files files = {cfg->raft_tls_cert_file, cfg->raft_tls_key_file,
                                       cfg->raft_tls_ca_file};
        char why[400];
        if (transport_tls(&c->transport, &files, why, sizeof(why)) != 0) {
            snprintf(err, errlen, "raft transport: %s", why);
            transport_close(&c->transport);
            return -1;
        }
    }
    segfill_set_enabled(!cfg->segment_prefill_off); /* before raft_uv prepares a segment */
    rv = raft_uv_init(&c->io.inner, c->loop, c->data_dir, &c->transport.outer);
    if (rv != 0) {
        snprintf(err, errlen, "raft storage in %s: %s", c->data_dir,
                 c->io.inner.errmsg[0] ? c->io.inner.errmsg : raft_strerror(rv));
        transport_close(&c->transport);
        return -1;
    }
    raft_uv_set_connect_retry_delay(&c->io.inner, 100);
    /* raft_uv's snapshot files hold only snapstore's 48-byte reference (io.h): an LZ4 frame
     * would only make it larger. Snapshots that raft_uv compressed before snapstore still
     * load: raft_uv recognises an LZ4 frame by its magic whatever this setting. */
    raft_uv_set_snapshot_compression(&c->io.inner, false);
    /* raft_uv destroys a segment's AIO context when it closes the segment; io_destroy(2)
     * waits 30-40 ms here, off the loop since aio_reap.h, and bigger segments close less
     * often. */
    if (cfg->segment_size != 0) {
        raft_uv_set_segment_size(&c->io.inner, cfg->segment_size);
    }
    io_wrap(&c->io, c->loop);
    c->io.settle = ioSettled;
    c->io.settle_data = c;
    c->io.snap_dir = c->data_dir; /* snapshot data paced, in files of our own (snapstore.h) */
    c->io.log_dir = c->data_dir;  /* truncations marked and checked (logdir.h) */
    return 0;
}

/* Bootstraps cfg's voters when the data dir holds nothing yet (raft refuses otherwise:
 * RAFT_CANTBOOTSTRAP). 0, or -1 with a message in err. */
static int bootstrap(struct cluster *c, const struct cluster_config *cfg, char *err,
                     size_t errlen)
{
    if (cfg->n_bootstrap == 0) {
        return 0;
    }
    struct raft_configuration conf;
    raft_configuration_init(&conf);
    for (size_t i = 0; i < cfg->n_bootstrap; i++) {
        int rv = raft_configuration_add(&conf, cfg->bootstrap[i].id,
                                        cfg->bootstrap[i].raft_address, RAFT_VOTER);
        if (rv != 0) {
            snprintf(err, errlen, "bootstrap configuration: %s", raft_strerror(rv));
            raft_configuration_close(&conf);
            return -1;
        }
    }
    int rv = raft_bootstrap(&c->raft, &conf);
    raft_configuration_close(&conf);
    if (rv != 0 && rv != RAFT_CANTBOOTSTRAP) {
        snprintf(err, errlen, "bootstrap: %s", raft_errmsg(&c->raft));
        return -1;
    }
    return 0;
}


/* A poll handle that could not start: its timerfd goes with it, and batches do not wait. */
static void delayUnused(uv_handle_t *h)
{
    struct cluster *c = h->data;
    close(c->delay_fd);
    c->delay_fd = -1;
}

struct cluster *cluster_new(uv_loop_t *loop, const struct cluster_config *cfg,
                            const struct cluster_ops *ops, char *err, size_t errlen)
{
    if (!configValid(cfg, ops)) {
        snprintf(err, errlen, "cluster: invalid configuration");
        return NULL;
    }
    struct cluster *c = cluster_xcalloc(sizeof(*c));
    c->loop = loop;
    c->cfg = *cfg;
    c->raft_address = xdup(cfg->raft_address);
    c->rpc_address = xdup(cfg->rpc_address);
    c->http_address = xdup(cfg->http_address);
    c->data_dir = xdup(cfg->data_dir);
    TAILQ_INIT(&c->pending);
    STAILQ_INIT(&c->deferred);
    arena_init(&c->decode, DECODE_ARENA_BYTES);
    admission_init(c);
    c->cfg.raft_address = c->raft_address;
    c->cfg.rpc_address = c->rpc_address;
    c->cfg.http_address = c->http_address;
    c->cfg.data_dir = c->data_dir;
    c->cfg.bootstrap = NULL;
    c->cfg.n_bootstrap = 0;
    c->ops = *ops;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->epoch = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;

    /* Our own addresses, and those of the bootstrap members, are known from the config
     * until the leader puts them in the log (tickCb). */
    members_put(c, cfg->id, cfg->rpc_address, cfg->http_address);
    for (size_t i = 0; i < cfg->n_bootstrap; i++) {
        members_put(c, cfg->bootstrap[i].id, cfg->bootstrap[i].rpc_address,
                    cfg->bootstrap[i].http_address);
    }

    if (ioOpen(c, cfg, err, errlen) != 0) {
        goto err_free;
    }
    c->fsm.data = c;
    c->fsm.apply = fsmApply;
    snapshot_fsm_init(c);
    int rv = raft_init(&c->raft, &c->io.outer, &c->fsm, cfg->id, c->raft_address);
    if (rv != 0) {
        snprintf(err, errlen, "raft: %s", raft_errmsg(&c->raft));
        goto err_io;
    }
    c->io.raft = &c->raft; /* the leader's commit rule (io.h) */
    c->raft.data = c;
    c->raft_open = true;
    raft_set_election_timeout(&c->raft, cfg->election_timeout_ms);
    raft_set_heartbeat_timeout(&c->raft, cfg->heartbeat_timeout_ms);
    raft_set_snapshot_threshold(&c->raft, cfg->snapshot_threshold);
    c->threshold = cfg->snapshot_threshold;
    raft_set_snapshot_trailing(&c->raft, cfg->snapshot_trailing);
    raft_set_pre_vote(&c->raft, cfg->pre_vote);

    if (bootstrap(c, cfg, err, errlen) != 0) {
        goto err_raft;
    }
    uv_check_init(loop, &c->flush);
    c->flush.data = c;
    uv_timer_init(loop, &c->tick);
    c->tick.data = c;
    c->handles_open = 2;
    c->delay_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (c->delay_fd >= 0 && uv_poll_init(loop, &c->delay, c->delay_fd) == 0) {
        c->delay.data = c;
        c->handles_open = 3;
        if (uv_poll_start(&c->delay, UV_READABLE, batch_delay_cb) != 0) {
            /* No wait then: closed as at the node's close, the timerfd with it. */
            c->handles_open = 2;
            uv_close((uv_handle_t *)&c->delay, delayUnused);
        }
    } else if (c->delay_fd >= 0) {
        close(c->delay_fd);
        c->delay_fd = -1; /* batches do not wait: each loop turn's go in at its end */
    }
    return c;

err_raft:
    /* raft_close is asynchronous; the loop has not run, so run it to completion here. */
    raft_close(&c->raft, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
err_io:
    raft_uv_close(&c->io.inner);
    transport_close(&c->transport);
err_free:
    arena_close(&c->decode);
    admission_free(c);
    free(c->raft_address);
    free(c->rpc_address);
    free(c->http_address);
    free(c->data_dir);
    free(c);
    return NULL;
}

int cluster_tls_load(const char *cert_file, const char *key_file, const char *ca_file,
                     struct idem_tls_ctx **server, struct idem_tls_ctx **client, char *err,
                     size_t errlen)
{
    struct raft_tls_files files = {cert_file, key_file, ca_file};
    return raft_tls_load(&files, server, client, err, errlen) == 0 ? CLUSTER_OK : CLUSTER_EINVAL;
}

void cluster_tls_set(struct cluster *c, struct idem_tls_ctx *server, struct idem_tls_ctx *client)
{
    transport_tls_set(&c->transport, server, client);
}

int cluster_start(struct cluster *c)
{
    c->transport.outer.errmsg[0] = '\0';
    int rv = raft_start(&c->raft);
    if (rv != 0) {
        /* libraft 0.15 does not pass on why its io failed to start, and its own message
         * may be empty or left over from loading ("metadata contains term 2"): a failed
         * listen says why in the transport's message (transport.c; a Raft address in use,
         * say), then the io's, then raft's. raft says nothing when the state machine
         * refused the snapshot (it logged why). */
        const char *m = c->transport.outer.errmsg;
        if (m[0] == '\0' && c->raft.io != NULL) {
            m = c->raft.io->errmsg;
        }
        if (m[0] == '\0') {
            m = raft_errmsg(&c->raft);
        }
        cluster_set_err(c, "raft start: ", m != NULL && m[0] != '\0' ? m : raft_strerror(rv));
        return CLUSTER_ERAFT;
    }
    io_conf_after_start(&c->io); /* the last configuration entry is not known committed */
    uv_timer_start(&c->tick, tickCb, TICK_MS, TICK_MS);
    return CLUSTER_OK;
}

static void clusterFree(struct cluster *c)
{
    raft_uv_close(&c->io.inner);
    aio_reap_stop(); /* raft_uv's AIO contexts, destroyed off the loop, are gone */
    transport_close(&c->transport);
    cluster_close_cb cb = c->close_cb;
    void *data = c->close_data;
    batch_close_open(c);
    arena_close(&c->decode);
    admission_fail_queued(c, RAFT_SHUTDOWN); /* none: cluster_close failed them */
    admission_free(c);
    free(c->raft_address);
    free(c->rpc_address);
    free(c->http_address);
    free(c->data_dir);
    free(c);
    if (cb != NULL) {
        cb(data);
    }
}

static void maybeFree(struct cluster *c)
{
    if (c->handles_open == 0 && !c->raft_open) {
        clusterFree(c);
    }
}

static void handleClosed(uv_handle_t *h);

/* The batch's timerfd goes once its poll handle is closed. */
static void delayClosed(uv_handle_t *h)
{
    struct cluster *c = h->data;
    close(c->delay_fd);
    c->delay_fd = -1;
    handleClosed(h);
}

static void handleClosed(uv_handle_t *h)
{
    struct cluster *c = h->data;
    c->handles_open--;
    maybeFree(c);
}

static void raftClosed(struct raft *r)
{
    struct cluster *c = r->data;
    c->raft_open = false; /* raft and its I/O are closed */
    maybeFree(c);
}

void cluster_close(struct cluster *c, cluster_close_cb cb, void *data)
{
    assert(!c->stopping);
    cluster_apply_deferred(c);
    c->stopping = true;
    c->close_cb = cb;
    c->close_data = data;
    batch_fail_waiters(c, c->waiters, c->n_cmds, RAFT_SHUTDOWN);
    batch_reset_open(c, false);
    admission_fail_queued(c, RAFT_SHUTDOWN);
    if (c->snap.view != NULL) {
        /* raft's I/O closes once the pool thread is done with it (io_close.c), then raft
         * finalizes the snapshot and the view is released. */
        clog_info("closing with a snapshot in flight (index %llu); waiting for it",
                  (unsigned long long)c->snap.index);
    }
    uv_check_stop(&c->flush);
    uv_timer_stop(&c->tick);
    c->delay_armed = false;
    uv_close((uv_handle_t *)&c->flush, handleClosed);
    uv_close((uv_handle_t *)&c->tick, handleClosed);
    if (c->delay_fd >= 0) {
        uv_poll_stop(&c->delay);
        uv_close((uv_handle_t *)&c->delay, delayClosed);
    }
    raft_close(&c->raft, raftClosed);
}

/* ---- queries ------------------------------------------------------------------------- */

bool cluster_is_leader(const struct cluster *c)
{
    return cluster_leading(c);
}

bool cluster_ready(const struct cluster_status *st, char *why, size_t len)
{
    if (st->role < 0) {
        snprintf(why, len, "this node is not in its Raft configuration");
        return false;
    }
    if (st->role == RAFT_SPARE) { /* sent nothing, not even heartbeats, until promoted */
        snprintf(why, len,
                 "this node is a spare: the leader sends it nothing until it is promoted");
        return false;
    }
    if (st->leader_id == 0 || (st->state != RAFT_LEADER && st->state != RAFT_FOLLOWER)) {
        snprintf(why, len, "no leader known");
        return false;
    }
    if (st->state == RAFT_FOLLOWER && st->leader_heard_ms > 2 * (uint64_t)st->election_timeout_ms) {
        if (st->leader_heard_ms == UINT64_MAX) {
            snprintf(why, len, "no word from leader %llu since this node started",
                     (unsigned long long)st->leader_id);
        } else {
            snprintf(why, len, "no word from leader %llu for %llu ms",
                     (unsigned long long)st->leader_id, (unsigned long long)st->leader_heard_ms);
        }
        return false;
    }
    why[0] = '\0';
    return true;
}

void cluster_get_status(const struct cluster *c, struct cluster_status *out)
{
    struct raft *r = (struct raft *)&c->raft;
    memset(out, 0, sizeof(*out));
    out->state = raft_state(r);
    out->term = r->current_term;
    out->leader_id = cluster_leader(c, &out->leader_rpc_address);
    out->leader_heard_ms = out->leader_id == 0           ? UINT64_MAX
                           : out->leader_id == c->cfg.id ? 0
                                                         : io_heard_ago_ms(&c->io, out->leader_id);
    out->role = -1;
    for (unsigned i = 0; i < r->configuration.n; i++) {
        if (r->configuration.servers[i].id == c->cfg.id) {
            out->role = r->configuration.servers[i].role;
        }
    }
    out->election_timeout_ms = c->cfg.election_timeout_ms;
    out->commit_index = r->commit_index;
    out->applied_index = raft_last_applied(r);
    const struct raft_log *l = &r->log;
    out->log_entries = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    out->last_snapshot_index = c->io.snap_last; /* stored (or loaded), not only taken */
    out->snapshot_store_failures = c->io.own_put_failures;
    out->leader_changes = c->leader_changes;
    out->snapshots = c->snapshots;
    out->snapshot_pause_us_last = c->snapshot_pause_us_last;
    out->snapshot_pause_us_max = c->snapshot_pause_us_max;
    out->snapshot_write_us_last = c->snapshot_write_us_last;
    out->snapshot_threshold = c->threshold;
    out->snapshot_bytes_last = c->snapshot_bytes_last;
    out->load_us = c->io.load_us;
    out->load_snapshot_us = c->io.load_snap_us;
    out->restore_us_last = c->restore_us_last;
    memcpy(out->append_buckets, c->io.append_buckets, sizeof(out->append_buckets));
    out->append_count = c->io.append_count;
    out->append_sum_us = c->io.append_sum_us;
    uint64_t oldest = io_oldest_append_us(&c->io), now = uv_hrtime() / 1000u;
    out->append_oldest_us = oldest != 0 && now > oldest ? now - oldest : 0;
    out->pending_bytes = c->pending_bytes;
    out->pending_refused = c->pending_refused;
    out->transfer_refused = c->transfer_refused;
    out->batch_waits = c->waits;
    out->batch_waits_off = c->waits_off;
    out->applied_after_answer = c->deferred_applies;
    out->queued_bytes = c->queued_bytes;
    out->not_proposed = c->not_proposed;
    out->share_refused = 0;
    for (uint32_t i = 0; i < c->cfg.n_accounts; i++) {
        out->share_refused += c->acct_refused[i];
    }
    out->raft_clamped = c->io.corrected;
    out->raft_held = c->io.results_held;
    out->raft_rematched = c->io.rematched;
    out->raft_unaddressed = c->io.unaddressed;
    out->raft_cut = c->io.skipped;
    out->raft_installs_held = c->io.installs_held;
    out->raft_timeouts_held = c->io.timeouts_held;
    out->raft_timeouts_dropped = c->io.timeouts_dropped;
}

_Static_assert(CLUSTER_SECRET_MIN == TRANSPORT_SECRET_MIN, "one minimum for Raft secrets");

void cluster_get_io_counters(struct cluster_io_counters *out)
{
    struct aio_reap_stats ar;
    struct segfill_stats sf;
    aio_reap_get_stats(&ar);
    segfill_get_stats(&sf);
    *out = (struct cluster_io_counters){
        .aio_destroyed_reaper = ar.destroyed,
        .aio_destroyed_caller = ar.inline_runs,
        .aio_destroy_failed = ar.failed,
        .segments_filled = sf.filled,
        .segments_skipped = sf.skipped_fs + sf.skipped_off,
        .segments_failed = sf.failed,
        .messages_refused = wire_check_refused(),
        .connections_refused = transport_refused_total(),
        .connect_auth_failed = transport_auth_failed_total(),
    };
}
