/* cluster: the Raft group of one node.
 *
 * Happy path of a proposal: cluster_propose() copies the command into the open batch and
 * arms a uv_check handle; after this loop turn's I/O callbacks ran, batchFlush() packs the
 * batch into one LogEntry, raft_apply()s it and keeps it in `pending` with the waiters of
 * its commands; once committed, raft calls fsmApply() on every node, which hands each
 * command to ops.apply, with the waiter on the proposer only; then raft's apply callback
 * (applyCb) frees the pending batch.
 *
 * Failure modes: raft_apply() refuses (not leader any more) → every waiter of the batch is
 * failed at once; raft fails the request later (leadership lost, shutdown) → applyCb fails
 * the waiters not yet handed to apply; the node closes with an open batch → its waiters are
 * failed with RAFT_SHUTDOWN. A proposer's batch is recognised in fsmApply by (proposer id,
 * epoch, proposal number), never by index alone, so that an entry another leader wrote at the
 * same index can never complete our waiters. */
#include "cluster.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aio_reap.h"
#include "clog.h"
#include "idem.pb-c.h"
#include "io.h"
#include "niced.h"
#include "segfill.h"
#include "transport.h"
#include "wire_check.h"

#define TICK_MS 100
#define SLOT_BITS CLUSTER_SLOT_BITS

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
    struct queued *next;
    void *waiter;
    uint8_t *data; /* malloc'd copy of the command, handed to the open batch as it is */
    size_t len;
    uint32_t cost;
};

struct acctQueue {
    struct queued *head, *tail;
    uint64_t bytes; /* the costs of those held */
};

struct cluster_batch {
    struct raft_apply req;
    struct cluster *c;
    struct cluster_batch *next; /* pending list, oldest first */
    struct cluster_batch *prev;
    uint64_t proposal;
    uint64_t cost;              /* its commands' part of pending_bytes */
    void **waiters;             /* one per command; NULL once handed back */
    struct charge *charges;     /* one per command */
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

    /* Open batch. */
    ProtobufCBinaryData *cmds;
    void **waiters;
    unsigned n_cmds;
    unsigned cap_cmds;
    size_t batch_bytes;
    uint64_t open_cost;     /* the open batch's part of pending_bytes */
    uint64_t pending_bytes; /* commands proposed, not yet applied or failed (cluster.h) */
    uint64_t pending_refused;
    uint64_t transfer_refused; /* CLUSTER_ETRANSFER answers */
    uint64_t not_proposed;     /* commands never proposed: their batch raft_apply refused,
                                * or held back when leadership was lost (failQueued) */
    struct charge *charges; /* the open batch's, one per command */
    uint64_t *acct_pending; /* per account (cfg.n_accounts), as pending_bytes counts */
    uint64_t *acct_refused; /* per account: CLUSTER_ESHARE refusals */
    struct acctQueue *queues; /* per account: its commands held back (struct queued) */
    uint64_t queued_bytes;    /* every account's held back, together */
    uint32_t next_admit;      /* the account admitQueued looks at first (round robin) */

    /* Pending (proposed, not yet applied or failed) batches. */
    struct cluster_batch *pending_head, *pending_tail;
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
    uint64_t stuck_append_warned_us; /* when tickCb last warned of an append in flight long */
    uint64_t stuck_transfer_us;      /* when tickCb last asked another voter to lead for it */
    uint64_t stuck_refusal_logged_us; /* ... and last said that it could not */
    uint64_t snapshot_pause_us_last, snapshot_pause_us_max, snapshot_write_us_last;
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
    char errmsg[256];
};

static void setErr(struct cluster *c, const char *prefix, const char *detail)
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

static void *xcalloc1(size_t n)
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
    char *p = xcalloc1(n + 1);
    memcpy(p, s ? s : "", n);
    return p;
}

static void copyAddr(char dst[CLUSTER_ADDR_MAX], const char *src)
{
    snprintf(dst, CLUSTER_ADDR_MAX, "%s", src ? src : "");
}

/* ---- member metadata ----------------------------------------------------------------- */

static struct memberMeta *metaFind(struct cluster *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_meta; i++) {
        if (c->meta[i].m.id == id) {
            return &c->meta[i];
        }
    }
    return NULL;
}

/* A slot whose member left the configuration (the lowest such id, so that replicas that
 * applied the same entries pick the same one), or NULL. */
static struct memberMeta *metaRecycle(struct cluster *c)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    struct memberMeta *pick = NULL;
    for (size_t i = 0; i < c->n_meta; i++) {
        bool member = false;
        for (unsigned j = 0; j < conf->n; j++) {
            member = member || conf->servers[j].id == c->meta[i].m.id;
        }
        if (!member && (pick == NULL || c->meta[i].m.id < pick->m.id)) {
            pick = &c->meta[i];
        }
    }
    return pick;
}

static struct memberMeta *metaPut(struct cluster *c, uint64_t id, const char *rpc,
                                  const char *http)
{
    struct memberMeta *mm = metaFind(c, id);
    if (mm == NULL) {
        if (c->n_meta == CLUSTER_MEMBERS_MAX) {
            mm = metaRecycle(c);
            if (mm == NULL) {
                return NULL;
            }
        } else {
            mm = &c->meta[c->n_meta++];
        }
        memset(mm, 0, sizeof(*mm));
        mm->m.id = id;
        mm->m.role = -1;
    }
    copyAddr(mm->m.rpc_address, rpc);
    copyAddr(mm->m.http_address, http);
    return mm;
}

/* ---- proposals ----------------------------------------------------------------------- */

/* Takes n commands' charges (of the open batch or of a batch in raft) off their accounts. */
static void uncharge(struct cluster *c, const struct charge *ch, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (ch[i].account < c->cfg.n_accounts) {
            c->acct_pending[ch[i].account] -= ch[i].cost;
        }
    }
}

/* Hands back every command held back, with `status` (RAFT_NOTLEADER: in no log, cluster.h),
 * and takes their charges off. Every queue is emptied and every charge taken off before the
 * first ops.fail: that callback may propose again (an answer callback making its next call
 * synchronously, e.g. the HTTP proxy's complete after a failed renew), and raft still says
 * RAFT_LEADER while it fails the apply requests of a leader stepping down (applyCb), so a
 * new command may be held back meanwhile; it must find consistent queues. */
static void failQueued(struct cluster *c, int status)
{
    struct queued *all = NULL, **end = &all;
    for (uint32_t a = 0; a < c->cfg.n_accounts && c->queued_bytes != 0; a++) {
        struct acctQueue *aq = &c->queues[a];
        if (aq->head == NULL) {
            continue;
        }
        for (struct queued *q = aq->head; q != NULL; q = q->next) {
            c->queued_bytes -= q->cost;
            c->pending_bytes -= q->cost;
            c->acct_pending[a] -= q->cost;
            if (status == RAFT_NOTLEADER) {
                c->not_proposed++;
            }
        }
        *end = aq->head;
        end = &aq->tail->next;
        aq->head = aq->tail = NULL;
        aq->bytes = 0;
    }
    while (all != NULL) {
        struct queued *q = all;
        all = q->next;
        void *w = q->waiter;
        free(q->data);
        free(q);
        c->ops.fail(c->ops.data, w, status);
    }
}

static void flushCb(uv_check_t *h);

/* Frees the per-account arrays (their queues empty). */
static void accountsFree(struct cluster *c)
{
    free(c->acct_pending);
    free(c->acct_refused);
    free(c->queues);
}

static void failWaiters(struct cluster *c, void **waiters, unsigned n, int status)
{
    for (unsigned i = 0; i < n; i++) {
        if (waiters[i] != NULL) {
            void *w = waiters[i];
            waiters[i] = NULL;
            c->ops.fail(c->ops.data, w, status);
        }
    }
}

static void pendingUnlink(struct cluster *c, struct cluster_batch *b)
{
    if (b->prev) {
        b->prev->next = b->next;
    } else {
        c->pending_head = b->next;
    }
    if (b->next) {
        b->next->prev = b->prev;
    } else {
        c->pending_tail = b->prev;
    }
    b->next = b->prev = NULL;
}

static void applyCb(struct raft_apply *req, int status, void *result)
{
    (void)result;
    struct cluster_batch *b = req->data;
    struct cluster *c = b->c;
    pendingUnlink(c, b);
    c->pending_bytes -= b->cost;
    uncharge(c, b->charges, b->n);
    /* On success every waiter was handed to ops.apply in fsmApply; on failure those not yet
     * applied are failed now. */
    failWaiters(c, b->waiters, b->n, status == 0 ? RAFT_SHUTDOWN : status);
    free(b->waiters);
    free(b->charges);
    free(b);
    if (c->queued_bytes != 0) {
        if (status != 0) {
            /* Leadership lost (or the node stops): the commands held back never went in. */
            failQueued(c, RAFT_NOTLEADER);
        } else if (!c->stopping) {
            uv_check_start(&c->flush, flushCb); /* room for held-back ones: admitQueued */
        }
    }
}

/* Empties the open batch. Its charges stay on their accounts when `keep_charges` (they
 * went to a proposed batch). */
static void resetOpenBatch(struct cluster *c, bool keep_charges)
{
    if (!keep_charges) {
        uncharge(c, c->charges, c->n_cmds);
    }
    for (unsigned i = 0; i < c->n_cmds; i++) {
        free(c->cmds[i].data);
    }
    c->n_cmds = 0;
    c->batch_bytes = 0;
    c->pending_bytes -= c->open_cost;
    c->open_cost = 0;
}

/* Log entry framing. raft_uv stores entries padded to 8 bytes and hands them back padded
 * after a restart (its segment format requires 8-byte multiples; canonical/raft issue
 * #189), so an entry is an 8-byte header (u32 little-endian payload length, u32 zero), the
 * packed LogEntry, and zero padding up to a multiple of 8. */
#define ENTRY_HEADER 8

static void entryEncode(const Idem__LogEntry *e, struct raft_buffer *buf)
{
    size_t n = idem__log_entry__get_packed_size(e);
    buf->len = (ENTRY_HEADER + n + 7) & ~(size_t)7;
    buf->base = raft_calloc(1, buf->len);
    if (buf->base == NULL) {
        clog_error("out of memory");
        abort();
    }
    uint8_t *p = buf->base;
    p[0] = (uint8_t)n;
    p[1] = (uint8_t)(n >> 8);
    p[2] = (uint8_t)(n >> 16);
    p[3] = (uint8_t)(n >> 24);
    idem__log_entry__pack(e, p + ENTRY_HEADER);
}

/* The packed LogEntry inside an entry, or NULL when the framing is wrong. */
static const uint8_t *entryPayload(const struct raft_buffer *buf, size_t *len)
{
    const uint8_t *p = buf->base;
    if (buf->len < ENTRY_HEADER) {
        return NULL;
    }
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (n > buf->len - ENTRY_HEADER) {
        return NULL;
    }
    *len = n;
    return p + ENTRY_HEADER;
}

/* Packs and proposes the open batch. */
static void batchFlush(struct cluster *c)
{
    if (c->n_cmds == 0) {
        return;
    }
    unsigned n = c->n_cmds;
    void **waiters = xcalloc1(n * sizeof(*waiters));
    memcpy(waiters, c->waiters, n * sizeof(*waiters));
    struct charge *charges = xcalloc1(n * sizeof(*charges));
    memcpy(charges, c->charges, n * sizeof(*charges));

    Idem__CommandBatch batch = IDEM__COMMAND_BATCH__INIT;
    batch.n_commands = n;
    batch.commands = c->cmds;
    batch.proposer = c->cfg.id;
    batch.epoch = c->epoch;
    batch.proposal = ++c->next_proposal;
    Idem__LogEntry entry = IDEM__LOG_ENTRY__INIT;
    entry.kind_case = IDEM__LOG_ENTRY__KIND_BATCH;
    entry.batch = &batch;

    struct raft_buffer buf;
    entryEncode(&entry, &buf);
    uint64_t cost = c->open_cost;
    resetOpenBatch(c, true);
    c->pending_bytes += cost; /* now the batch's, and so are the accounts' charges */

    struct cluster_batch *b = xcalloc1(sizeof(*b));
    b->c = c;
    b->cost = cost;
    b->proposal = batch.proposal;
    b->waiters = waiters;
    b->charges = charges;
    b->n = n;
    b->req.data = b;
    int rv = raft_apply(&c->raft, &b->req, &buf, 1, applyCb);
    if (rv != 0) {
        /* Not leading any more, or a transfer began since these commands were taken (a
         * transfer request read in the same loop iteration): none of them is in the log. */
        raft_free(buf.base);
        c->not_proposed += n;
        c->pending_bytes -= cost;
        uncharge(c, charges, n);
        failWaiters(c, waiters, n, rv);
        free(waiters);
        free(charges);
        free(b);
        failQueued(c, RAFT_NOTLEADER); /* taken on the same terms, never proposed either */
        return;
    }
    b->prev = c->pending_tail;
    if (c->pending_tail) {
        c->pending_tail->next = b;
    } else {
        c->pending_head = b;
    }
    c->pending_tail = b;
}

/* Whether the open batch must be proposed before a command of len bytes can join it. */
static bool openFull(const struct cluster *c, size_t len)
{
    return c->n_cmds > 0 && (c->n_cmds == c->cfg.batch_max_commands ||
                             c->batch_bytes + len > c->cfg.batch_max_bytes);
}

/* Whether this node may hand raft a batch now (raft_apply refuses one during a transfer). */
static bool mayPropose(struct cluster *c)
{
    return !c->stopping && raft_state(&c->raft) == RAFT_LEADER && c->raft.transfer == NULL;
}

/* Adds a command to the open batch, which has room for it (openFull); `data` (malloc'd) is
 * the batch's from now on. Its cost goes to its account's bytes in flight, and to
 * pending_bytes and its account's pending bytes unless it was charged when held back. */
static void openAppend(struct cluster *c, uint8_t *data, size_t len, void *waiter, uint32_t account,
                       uint32_t cost, bool charged)
{
    if (c->n_cmds == c->cap_cmds) {
        c->cap_cmds = c->cap_cmds ? c->cap_cmds * 2 : 64;
        c->cmds = realloc(c->cmds, c->cap_cmds * sizeof(*c->cmds));
        c->waiters = realloc(c->waiters, c->cap_cmds * sizeof(*c->waiters));
        c->charges = realloc(c->charges, c->cap_cmds * sizeof(*c->charges));
        if (c->cmds == NULL || c->waiters == NULL || c->charges == NULL) {
            clog_error("out of memory");
            abort();
        }
    }
    c->cmds[c->n_cmds].data = data;
    c->cmds[c->n_cmds].len = len;
    c->waiters[c->n_cmds] = waiter;
    c->charges[c->n_cmds] = (struct charge){.account = account, .cost = cost};
    if (!charged) {
        if (account != CLUSTER_ACCOUNT_NONE) {
            c->acct_pending[account] += cost;
        }
        c->pending_bytes += cost;
    }
    c->n_cmds++;
    c->batch_bytes += len;
    c->open_cost += cost;
    if (c->n_cmds == 1) {
        uv_check_start(&c->flush, flushCb);
    }
}

/* Whether a command of `cost` fits in an account's max_account_inflight_bytes: its costs in
 * the open batch and in raft, i.e. its pending ones less those held back, and this one
 * (an account with nothing in flight always sends one). */
static bool inflightRoom(const struct cluster *c, uint32_t account, uint64_t cost)
{
    uint64_t in = c->acct_pending[account] - c->queues[account].bytes;
    return in == 0 || in + cost <= c->cfg.max_account_inflight_bytes;
}

/* Whether an account's next command is held back: commands of its are held back already
 * (they go first), or there is no room for it in flight. */
static bool mustWait(const struct cluster *c, uint32_t account, uint64_t cost)
{
    if (account == CLUSTER_ACCOUNT_NONE || c->cfg.max_account_inflight_bytes == 0) {
        return false;
    }
    return c->queues[account].head != NULL || !inflightRoom(c, account, cost);
}

/* Moves held-back commands into the open batch as far as their accounts' bounds allow, one
 * command of each account in turn (round robin, from a place that moves on at each call),
 * so that one account's backlog does not go in ahead of another's next command. */
static void admitQueued(struct cluster *c)
{
    uint32_t n = c->cfg.n_accounts;
    bool moved = true;
    while (c->queued_bytes != 0 && moved) {
        moved = false;
        for (uint32_t k = 0; k < n && c->queued_bytes != 0; k++) {
            uint32_t a = (c->next_admit + k) % n;
            struct acctQueue *aq = &c->queues[a];
            if (aq->head == NULL) {
                continue;
            }
            if (!inflightRoom(c, a, aq->head->cost)) {
                continue;
            }
            if (!mayPropose(c)) {
                return;
            }
            if (openFull(c, aq->head->len)) {
                batchFlush(c); /* on failure, every command held back was failed */
                if (aq->head == NULL || !mayPropose(c)) {
                    return;
                }
            }
            struct queued *q = aq->head;
            aq->head = q->next;
            if (aq->head == NULL) {
                aq->tail = NULL;
            }
            aq->bytes -= q->cost;
            c->queued_bytes -= q->cost;
            openAppend(c, q->data, q->len, q->waiter, a, q->cost, true);
            free(q);
            moved = true;
        }
    }
    c->next_admit = n != 0 ? (c->next_admit + 1) % n : 0;
}

static void flushCb(uv_check_t *h)
{
    struct cluster *c = h->data;
    uv_check_stop(h);
    if (c->queued_bytes != 0) {
        admitQueued(c);
    }
    batchFlush(c);
}

static int propose(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter, bool own,
                   uint32_t account);

int cluster_propose(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter,
                    uint32_t account)
{
    return propose(c, cmd, len, waiter, false, account);
}

int cluster_propose_own(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter)
{
    return propose(c, cmd, len, waiter, true, CLUSTER_ACCOUNT_NONE);
}

static int propose(struct cluster *c, const uint8_t *cmd, size_t len, void *waiter, bool own,
                   uint32_t account)
{
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (raft_state(&c->raft) != RAFT_LEADER) {
        return CLUSTER_ENOTLEADER;
    }
    if (c->raft.transfer != NULL) {
        /* raft_apply refuses every entry until the transfer ends (the new leader then
         * redirects), so taking the command would only fail it at the flush. */
        c->transfer_refused++;
        return CLUSTER_ETRANSFER;
    }
    if (len > c->cfg.batch_max_bytes) {
        return CLUSTER_ETOOBIG;
    }
    uint64_t cost = (uint64_t)len + CLUSTER_COMMAND_OVERHEAD;
    assert(account < c->cfg.n_accounts || account == CLUSTER_ACCOUNT_NONE);
    if (account >= c->cfg.n_accounts) {
        account = CLUSTER_ACCOUNT_NONE; /* a release build's answer to a caller's bug */
    }
    /* An account with nothing pending is let in whatever the bounds (its one command may be
     * larger than its share, and other accounts may hold the whole budget between them),
     * so the bytes pending are at most max_pending_bytes plus one command per account. */
    bool first = account != CLUSTER_ACCOUNT_NONE && c->acct_pending[account] == 0;
    if (!own && !first && c->pending_bytes + cost > c->cfg.max_pending_bytes) {
        c->pending_refused++;
        return CLUSTER_EOVERLOAD;
    }
    if (!own && !first && account != CLUSTER_ACCOUNT_NONE &&
        c->cfg.max_account_pending_bytes != 0 &&
        c->acct_pending[account] + cost > c->cfg.max_account_pending_bytes) {
        c->acct_refused[account]++;
        return CLUSTER_ESHARE;
    }
    bool wait = mustWait(c, account, cost);
    if (!wait && openFull(c, len)) {
        batchFlush(c);
        if (raft_state(&c->raft) != RAFT_LEADER) {
            return CLUSTER_ENOTLEADER;
        }
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        clog_error("out of memory");
        abort();
    }
    memcpy(copy, cmd, len);
    if (!wait) {
        openAppend(c, copy, len, waiter, account, (uint32_t)cost, false);
        return CLUSTER_OK;
    }
    /* Held back until its account's earlier commands commit (admitQueued), charged now. */
    struct queued *q = xcalloc1(sizeof(*q));
    q->waiter = waiter;
    q->data = copy;
    q->len = len;
    q->cost = (uint32_t)cost;
    struct acctQueue *aq = &c->queues[account];
    if (aq->tail != NULL) {
        aq->tail->next = q;
    } else {
        aq->head = q;
    }
    aq->tail = q;
    aq->bytes += cost;
    c->queued_bytes += cost;
    c->pending_bytes += cost;
    c->acct_pending[account] += cost;
    return CLUSTER_OK;
}

static void internalApplyCb(struct raft_apply *req, int status, void *result)
{
    (void)status;
    (void)result;
    free(req->data);
}

/* Proposes a cluster-level entry without a waiter. */
static int proposeInternal(struct cluster *c, const Idem__LogEntry *entry)
{
    struct raft_buffer buf;
    entryEncode(entry, &buf);
    struct internalReq *r = xcalloc1(sizeof(*r));
    r->req.data = r;
    int rv = raft_apply(&c->raft, &r->req, &buf, 1, internalApplyCb);
    if (rv != 0) {
        raft_free(buf.base);
        free(r);
    }
    return rv;
}

static int proposeMemberInfo(struct cluster *c, const struct cluster_member *m)
{
    Idem__MemberInfo mi = IDEM__MEMBER_INFO__INIT;
    mi.id = m->id;
    mi.rpc_address = (char *)m->rpc_address;
    mi.http_address = (char *)m->http_address;
    Idem__LogEntry e = IDEM__LOG_ENTRY__INIT;
    e.kind_case = IDEM__LOG_ENTRY__KIND_MEMBER;
    e.member = &mi;
    return proposeInternal(c, &e);
}

/* ---- the raft FSM -------------------------------------------------------------------- */

static struct cluster_batch *pendingFind(struct cluster *c, const Idem__CommandBatch *b)
{
    if (b->proposer != c->cfg.id || b->epoch != c->epoch) {
        return NULL;
    }
    for (struct cluster_batch *p = c->pending_head; p != NULL; p = p->next) {
        if (p->proposal == b->proposal) {
            return p;
        }
    }
    return NULL;
}

static void voterPlace(const struct cluster *c, unsigned *k, unsigned *n);

/* The log applied since the last snapshot past which this node takes one whatever the
 * entry count: snapshot_log_max_bytes, less k/2n of it on voter k of n, so that when the
 * cap is what decides (large entries) the replicas do not all write their snapshots at the
 * same index, as their phases keep them apart otherwise (cluster_snapshot_stagger). */
static uint64_t logCap(const struct cluster *c)
{
    uint64_t max = c->cfg.snapshot_log_max_bytes;
    unsigned k, n;
    voterPlace(c, &k, &n);
    return n >= 2 ? max - max / (2 * n) * k : max;
}

static int fsmApply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct cluster *c = fsm->data;
    /* raft advances last_applied after this call returns. */
    uint64_t index = raft_last_applied(&c->raft) + 1;
    *result = NULL;
    c->applied_entries++;
    c->applied_bytes += buf->len;
    c->log_since_snapshot += buf->len;
    if (c->cfg.snapshot_log_max_bytes != 0 && c->log_since_snapshot > logCap(c) &&
        c->saved_threshold == 0) {
        /* The log since the last snapshot (raft holds all of it in memory) reached
         * snapshot_log_max_bytes (this voter's share of it) before the threshold's count
         * of entries (at least snapshot_threshold, 8192 by default: 8 GiB of 1 MiB
         * entries): a snapshot at the next apply raft can take one, as
         * cluster_snapshot_now() asks for one. Counted from when the last one was taken
         * (fsmSnapshot), not stored, so that one still being written does not make the
         * next come at once; one whose write fails is not asked for again before another
         * cap's worth of entries. */
        c->saved_threshold = c->raft.snapshot.threshold;
        raft_set_snapshot_threshold(&c->raft, 1);
    }
    size_t plen = 0;
    const uint8_t *payload = entryPayload(buf, &plen);
    Idem__LogEntry *e = payload ? idem__log_entry__unpack(NULL, plen, payload) : NULL;
    if (e == NULL) {
        /* Every replica holds the same bytes and skips them alike. */
        clog_error("log entry %llu does not decode; skipped", (unsigned long long)index);
        return 0;
    }
    if (e->kind_case == IDEM__LOG_ENTRY__KIND_BATCH) {
        const Idem__CommandBatch *b = e->batch;
        struct cluster_batch *p = pendingFind(c, b);
        size_t n = b->n_commands;
        if (n > ((size_t)1 << SLOT_BITS)) {
            clog_error("log entry %llu holds too many commands; skipped",
                       (unsigned long long)index);
            n = 0;
        }
        for (size_t i = 0; i < n; i++) {
            void *w = NULL;
            if (p != NULL && i < p->n) {
                w = p->waiters[i];
                p->waiters[i] = NULL;
            }
            c->ops.apply(c->ops.data, (index << SLOT_BITS) | i, b->commands[i].data,
                         b->commands[i].len, w);
        }
    } else if (e->kind_case == IDEM__LOG_ENTRY__KIND_MEMBER) {
        struct memberMeta *mm = metaPut(c, e->member->id, e->member->rpc_address,
                                        e->member->http_address);
        if (mm != NULL) {
            mm->logged = true;
            mm->proposed = false;
        }
    }
    idem__log_entry__free_unpacked(e, NULL);
    return 0;
}

static void putBE32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint64_t monoUs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static bool snapshotAsync(const struct cluster *c)
{
    return c->ops.snapshot_freeze != NULL;
}

unsigned cluster_snapshot_threshold(unsigned min, unsigned percent, uint64_t max_log_bytes,
                                    uint64_t snapshot_bytes, uint64_t entries, uint64_t entry_bytes)
{
    if (percent == 0 || snapshot_bytes == 0 || entries == 0 || entry_bytes == 0) {
        return min;
    }
    /* Doubles: no overflow, and the threshold is each node's own, not replicated state. */
    double log_bytes = (double)snapshot_bytes * (double)percent / 100.0;
    if (max_log_bytes != 0 && log_bytes > (double)max_log_bytes) {
        log_bytes = (double)max_log_bytes;
    }
    double n = log_bytes * (double)entries / (double)entry_bytes;
    if (n < (double)min) {
        return min;
    }
    return n >= (double)UINT_MAX ? UINT_MAX : (unsigned)n;
}

/* This node's place among the n voters of the configuration (the same order on every node):
 * *k in 0..n-1, or n = 0 when it is not a voter. */
static void voterPlace(const struct cluster *c, unsigned *k, unsigned *n)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned seen = 0;
    bool me = false;
    *k = 0;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].role != RAFT_VOTER) {
            continue;
        }
        if (conf->servers[i].id == c->cfg.id) {
            *k = seen;
            me = true;
        }
        seen++;
    }
    *n = me ? seen : 0;
}

/* The entries from index to the first index at or after j0 on voter k of n's phase of
 * interval t (k * t / n, mod t), as a threshold: at most UINT_MAX. */
static unsigned onPhase(uint64_t t, uint64_t index, uint64_t j0, unsigned k, unsigned n)
{
    uint64_t phase = t * k / n;
    uint64_t th = j0 + (phase + t - j0 % t) % t - index;
    return th > UINT_MAX ? UINT_MAX : (unsigned)th;
}

unsigned cluster_snapshot_stagger(unsigned threshold, uint64_t index, unsigned k, unsigned n)
{
    if (n < 2 || threshold < 2 * n) {
        return threshold;
    }
    return onPhase(threshold, index, index + threshold / 2, k, n);
}

unsigned cluster_snapshot_stagger_forward(unsigned threshold, uint64_t index, unsigned k,
                                          unsigned n)
{
    if (n < 2 || threshold < 2 * n) {
        return threshold;
    }
    return onPhase(threshold, index, index + threshold, k, n);
}

unsigned cluster_trailing_for(const struct raft_log *l, uint64_t index, unsigned trailing,
                              uint64_t max_bytes)
{
    size_t held = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
    uint64_t bytes = 0;
    for (unsigned k = 0; k < trailing; k++) {
        uint64_t i = index - k; /* the k-th entry back from index */
        if (i == 0 || i <= l->offset || i - l->offset > held) {
            return trailing; /* no more held: nothing more to keep or free */
        }
        bytes += l->entries[(l->front + (size_t)(i - l->offset - 1)) % l->size].buf.len;
        if (bytes > max_bytes) {
            return k > 0 ? k : 1;
        }
    }
    return trailing;
}

unsigned cluster_snapshot_leader_threshold(unsigned staggered, unsigned interval,
                                           uint64_t max_entries)
{
    for (unsigned extra = 2; extra > 0; extra--) {
        uint64_t th = (uint64_t)staggered + (uint64_t)extra * interval;
        if (th <= max_entries && th <= UINT_MAX) {
            return (unsigned)th;
        }
    }
    return staggered;
}

/* Sets raft's threshold from the schedule adaptThreshold() computed: this voter's phase of
 * the interval, and on the leader two intervals more when the log cap allows. Called again
 * when this node becomes or stops being the leader. */
static void applyThreshold(struct cluster *c)
{
    unsigned t = c->interval;
    c->threshold_as_leader = raft_state(&c->raft) == RAFT_LEADER;
    if (c->cfg.snapshot_log_percent != 0) {
        unsigned k, n;
        voterPlace(c, &k, &n);
        /* At the configured minimum (a young or small table), phases that only ever come
         * later: no snapshot sooner than that minimum. */
        t = t <= c->cfg.snapshot_threshold
                ? cluster_snapshot_stagger_forward(t, c->interval_from, k, n)
                : cluster_snapshot_stagger(t, c->interval_from, k, n);
        if (t < c->cfg.snapshot_threshold) {
            t = c->cfg.snapshot_threshold; /* an interval under twice the minimum, staggered */
        }
        if (c->threshold_as_leader && n >= 2 && c->interval > c->cfg.snapshot_threshold) {
            /* Entries that make snapshot_log_max_bytes of log, at the measured entry size
             * (measured: an interval above snapshot_threshold needs it). */
            double cap = (double)c->cfg.snapshot_log_max_bytes * (double)c->entries_measured /
                         (double)c->bytes_measured;
            t = cluster_snapshot_leader_threshold(
                t, c->interval, cap >= (double)UINT64_MAX ? UINT64_MAX : (uint64_t)cap);
        }
    }
    c->threshold = t;
    unsigned withRetry = t > UINT_MAX - c->retry_extra ? UINT_MAX : t + c->retry_extra;
    if (c->saved_threshold != 0) {
        c->saved_threshold = withRetry; /* a forced snapshot is pending: set after it */
    } else {
        raft_set_snapshot_threshold(&c->raft, withRetry);
    }
}

/* After a snapshot of `bytes` at `index` was taken or restored: the next one comes after
 * cluster_snapshot_threshold() entries (the interval), measured on the entries applied
 * since the threshold was last set (or, with too few of those, on the window measured
 * before), at this node's own phase (cluster_snapshot_stagger). The interval is rounded
 * down to a power of two so that replicas, whose measures differ a little, agree on it and
 * so on the phases. */
static void adaptThreshold(struct cluster *c, uint64_t bytes, uint64_t index)
{
    c->snapshot_bytes_last = bytes;
    if (c->applied_entries >= 64 || c->entries_measured == 0) {
        c->entries_measured = c->applied_entries;
        c->bytes_measured = c->applied_bytes;
    }
    c->applied_entries = 0;
    c->applied_bytes = 0;
    unsigned t = cluster_snapshot_threshold(c->cfg.snapshot_threshold, c->cfg.snapshot_log_percent,
                                            c->cfg.snapshot_log_max_bytes, bytes,
                                            c->entries_measured, c->bytes_measured);
    if (c->cfg.snapshot_log_percent != 0 && t > c->cfg.snapshot_threshold) {
        unsigned p = 1;
        while (p <= t / 2) {
            p *= 2;
        }
        t = p > c->cfg.snapshot_threshold ? p : c->cfg.snapshot_threshold;
    }
    c->interval = t;
    c->interval_from = index;
    applyThreshold(c);
}

/* raft calls this on the loop. Synchronous: the whole snapshot. Asynchronous: the member
 * metadata (small) and a frozen view of the application state; the application's bytes
 * are written by fsmSnapshotAsync. */
static int fsmSnapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    uint64_t t0 = monoUs();
    c->puts_before = c->io.own_puts;
    Idem__ClusterSnapshot cs = IDEM__CLUSTER_SNAPSHOT__INIT;
    Idem__MemberInfo infos[CLUSTER_MEMBERS_MAX];
    Idem__MemberInfo *ptrs[CLUSTER_MEMBERS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < c->n_meta; i++) {
        if (!c->meta[i].logged) {
            continue;
        }
        idem__member_info__init(&infos[n]);
        infos[n].id = c->meta[i].m.id;
        infos[n].rpc_address = c->meta[i].m.rpc_address;
        infos[n].http_address = c->meta[i].m.http_address;
        ptrs[n] = &infos[n];
        n++;
    }
    cs.n_members = n;
    cs.members = ptrs;
    size_t meta_len = idem__cluster_snapshot__get_packed_size(&cs);

    struct raft_buffer *b = raft_calloc(2, sizeof(*b));
    if (b == NULL) {
        return RAFT_NOMEM;
    }
    b[0].len = 4 + meta_len;
    b[0].base = raft_malloc(b[0].len);
    if (b[0].base == NULL) {
        raft_free(b);
        return RAFT_NOMEM;
    }
    putBE32(b[0].base, (uint32_t)meta_len);
    idem__cluster_snapshot__pack(&cs, (uint8_t *)b[0].base + 4);
    if (snapshotAsync(c)) {
        void *view = NULL;
        if (c->snap.view != NULL || c->ops.snapshot_freeze(c->ops.data, &view) != 0) {
            raft_free(b[0].base);
            raft_free(b);
            return RAFT_BUSY; /* raft takes it as transient and retries later */
        }
        memset(&c->snap, 0, sizeof(c->snap));
        c->snap.view = view;
        c->snap.index = raft_last_applied(&c->raft);
        b[1].base = NULL; /* fsmSnapshotAsync fills it */
        b[1].len = 0;
    } else {
        uint8_t *app = NULL;
        size_t app_len = 0;
        if (c->ops.snapshot(c->ops.data, &app, &app_len) != 0) {
            raft_free(b[0].base);
            raft_free(b);
            return RAFT_IOERR;
        }
        b[1].base = app;
        b[1].len = app_len;
    }
    *bufs = b;
    *n_bufs = 2;
    c->last_snapshot_index = raft_last_applied(&c->raft);
    c->log_since_snapshot = 0;
    /* raft keeps this many entries once the snapshot is stored (its put reads it after this
     * returns), in memory and on disk. */
    raft_set_snapshot_trailing(&c->raft, cluster_trailing_for(&c->raft.log, c->last_snapshot_index,
                                                              c->cfg.snapshot_trailing,
                                                              c->cfg.snapshot_trailing_max_bytes));
    uint64_t pause = monoUs() - t0;
    c->snap.pause_us = pause;
    c->snapshots++;
    c->snapshot_pause_us_last = pause;
    if (pause > c->snapshot_pause_us_max) {
        c->snapshot_pause_us_max = pause;
    }
    if (c->saved_threshold != 0) {
        raft_set_snapshot_threshold(&c->raft, c->saved_threshold);
        c->saved_threshold = 0;
    }
    return 0;
}

struct snapshotWriteRun {
    struct cluster *c;
    uint8_t *app;
    size_t len;
};

static int snapshotWriteMain(void *arg)
{
    struct snapshotWriteRun *w = arg;
    return w->c->ops.snapshot_write(w->c->snap.view, &w->app, &w->len);
}

/* raft calls this on a thread of raft_uv's pool (io->async_work), after fsmSnapshot
 * succeeded, while the loop goes on. It touches the view and c->snap's write fields only.
 * The serialisation itself runs niced by cfg.snapshot_nice, the pool thread waiting for it. */
static int fsmSnapshotAsync(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    if (*bufs == NULL || *n_bufs != 2 || c->snap.view == NULL) {
        return RAFT_INVALID;
    }
    uint64_t t0 = monoUs();
    struct snapshotWriteRun w = {.c = c};
    if (niced_run(c->cfg.snapshot_nice, &c->snap.nice, snapshotWriteMain, &w) != 0) {
        return RAFT_IOERR;
    }
    (*bufs)[1].base = w.app;
    (*bufs)[1].len = w.len;
    c->snap.write_us = monoUs() - t0;
    c->snap.bytes = w.len;
    c->snap.written = true;
    return 0;
}

/* A buffer freed on the loop's thread pool (freeOffLoop). */
struct reap {
    uv_work_t req;
    void *p;
};

static void reapWork(uv_work_t *req)
{
    struct reap *r = req->data;
    free(r->p);
}

static void reapDone(uv_work_t *req, int status)
{
    struct reap *r = req->data;
    if (status != 0) { /* cancelled (nothing cancels it today): reapWork did not run */
        free(r->p);
    }
    free(r);
}

/* Frees p on the loop's thread pool. For a snapshot's data (about 110 bytes a record, so
 * ~100 MB at a million records): handing that back to the kernel took 2-7 ms, a pause of
 * the loop every snapshot, when it was freed there. uv_run keeps going until it is done. */
static void freeOffLoop(uv_loop_t *loop, void *p)
{
    struct reap *r = malloc(sizeof(*r));
    if (r == NULL) {
        free(p);
        return;
    }
    r->p = p;
    r->req.data = r;
    if (uv_queue_work(loop, &r->req, reapWork, reapDone) != 0) {
        free(p);
        free(r);
    }
}

/* raft calls this on the loop once it is done with the snapshot's buffers, whether they
 * were stored or not (and after a failed fsmSnapshotAsync or async_work). */
static int fsmSnapshotFinalize(struct raft_fsm *fsm, struct raft_buffer *bufs[],
                               unsigned *n_bufs)
{
    struct cluster *c = fsm->data;
    /* Whether raft_uv stored it: finalize comes after the put's end (takeSnapshotCb). */
    bool put_ended = c->io.own_puts != c->puts_before;
    bool stored = put_ended && c->io.own_put_status == 0;
    if (put_ended) {
        /* Stored: as scheduled. Not stored: the next attempt a whole threshold after this
         * one, not at once (raft counts from its last stored snapshot, which is older). */
        uint64_t from = c->raft.log.snapshot.last_index;
        uint64_t extra = stored || c->last_snapshot_index <= from ? 0 : c->last_snapshot_index - from;
        c->retry_extra = extra > UINT_MAX ? UINT_MAX : (unsigned)extra;
    }
    if (*bufs != NULL) {
        if (*n_bufs == 2 && (*bufs)[1].base != NULL) {
            adaptThreshold(c, (*bufs)[0].len + (*bufs)[1].len, c->last_snapshot_index);
        }
        raft_free((*bufs)[0].base);
        if ((*bufs)[1].base != NULL) { /* the application's, malloc'd (NULL if not written) */
            freeOffLoop(c->loop, (*bufs)[1].base);
        }
        raft_free(*bufs);
        *bufs = NULL;
        *n_bufs = 0;
    }
    if (c->snap.view != NULL) {
        struct cluster_snapshot_info info = {
            .index = c->snap.index,
            .pause_us = c->snap.pause_us,
            .write_us = c->snap.write_us,
            .bytes = c->snap.bytes,
            .written = c->snap.written,
            .put_ended = put_ended,
            .stored = stored,
            .store_error = stored ? "" : c->io.own_put_err,
            .nice = c->snap.nice,
            .next_threshold = c->threshold,
        };
        void *view = c->snap.view;
        c->snap.view = NULL;
        c->snapshot_write_us_last = info.write_us;
        c->ops.snapshot_release(c->ops.data, view, &info);
    }
    return 0;
}

static int fsmRestore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct cluster *c = fsm->data;
    const uint8_t *p = buf->base;
    if (buf->len < 4) {
        return RAFT_MALFORMED;
    }
    uint32_t meta_len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (meta_len > buf->len - 4) {
        return RAFT_MALFORMED;
    }
    Idem__ClusterSnapshot *cs = idem__cluster_snapshot__unpack(NULL, meta_len, p + 4);
    if (cs == NULL) {
        return RAFT_MALFORMED;
    }
    if (c->ops.restore(c->ops.data, p + 4 + meta_len, buf->len - 4 - meta_len) != 0) {
        idem__cluster_snapshot__free_unpacked(cs, NULL);
        return RAFT_MALFORMED;
    }
    for (size_t i = 0; i < cs->n_members; i++) {
        struct memberMeta *mm = metaPut(c, cs->members[i]->id, cs->members[i]->rpc_address,
                                        cs->members[i]->http_address);
        if (mm != NULL) {
            mm->logged = true;
        }
    }
    idem__cluster_snapshot__free_unpacked(cs, NULL);
    c->last_snapshot_index = raft_last_applied(&c->raft);
    c->log_since_snapshot = 0;
    c->retry_extra = 0; /* a snapshot of the leader's stands for this node's */
    c->saved_threshold = 0; /* and for one forced or asked for: adaptThreshold sets raft's */
    adaptThreshold(c, buf->len, raft_last_applied(&c->raft));
    raft_free(buf->base);
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

/* ---- tick: leader changes and member metadata ---------------------------------------- */

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

static void tickCb(uv_timer_t *t)
{
    struct cluster *c = t->data;
    if (c->queued_bytes != 0) {
        /* Held-back commands go in as their accounts' batches apply (applyCb); one held
         * while a transfer paused the proposals goes in now, and a node that no longer
         * leads hands them back (a batch failed by the lost leadership does at once). */
        if (raft_state(&c->raft) != RAFT_LEADER) {
            failQueued(c, RAFT_NOTLEADER);
        } else {
            admitQueued(c);
        }
    }
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
    if (raft_state(&c->raft) == RAFT_LEADER && c->barrier_term != c->raft.current_term) {
        /* A new leader's first entry of its own term: until it is stored, no follower's
         * answer counts towards a commit (io.h: libraft 0.15's Figure 8 flaw), and once it
         * commits, the entries of older terms before it commit with it, with or without
         * client traffic. Tried again on the next tick if raft refuses it (a leadership
         * transfer pending) or it fails. */
        struct leaderBarrier *lb = xcalloc1(sizeof(*lb));
        lb->req.data = lb;
        lb->c = c;
        lb->term = c->raft.current_term;
        if (raft_barrier(&c->raft, &lb->req, leaderBarrierCb) == 0) {
            c->barrier_term = lb->term;
        } else {
            free(lb);
        }
    }
    if (c->interval == 0 && c->cfg.snapshot_log_percent != 0 &&
        raft_state(&c->raft) != RAFT_UNAVAILABLE) {
        /* No snapshot taken nor restored yet: once this node is one of two or more voters
         * (a spare waits for its promotion), the first one comes at this voter's phase
         * too, not at the same index on every replica. */
        unsigned k, n;
        voterPlace(c, &k, &n);
        if (n >= 2) {
            c->interval = c->cfg.snapshot_threshold;
            c->interval_from = 0;
            applyThreshold(c);
        }
    } else if ((raft_state(&c->raft) == RAFT_LEADER) != c->threshold_as_leader &&
               c->interval != 0) {
        applyThreshold(c);
    }
    if (raft_state(&c->raft) != RAFT_LEADER) {
        return;
    }
    /* The leader makes sure every member's addresses are in the log, so that any node
     * (including one that joins later and replays the log) can redirect to any member. */
    for (size_t i = 0; i < c->n_meta; i++) {
        struct memberMeta *mm = &c->meta[i];
        if (!mm->logged && !mm->proposed && mm->m.rpc_address[0] != '\0') {
            if (proposeMemberInfo(c, &mm->m) == 0) {
                mm->proposed = true;
            }
        }
    }
}

/* ---- lifecycle ----------------------------------------------------------------------- */

struct cluster *cluster_new(uv_loop_t *loop, const struct cluster_config *cfg,
                            const struct cluster_ops *ops, char *err, size_t errlen)
{
    unsigned async_ops = (ops->snapshot_freeze != NULL) + (ops->snapshot_write != NULL) +
                         (ops->snapshot_release != NULL);
    if (cfg->id == 0 || cfg->batch_max_commands == 0 ||
        cfg->batch_max_commands > ((1u << SLOT_BITS) - 1) || cfg->batch_max_bytes == 0 ||
        cfg->max_pending_bytes < cfg->batch_max_bytes + CLUSTER_COMMAND_OVERHEAD ||
        (async_ops != 0 && async_ops != 3) || (async_ops == 0 && ops->snapshot == NULL)) {
        snprintf(err, errlen, "cluster: invalid configuration");
        return NULL;
    }
    struct cluster *c = xcalloc1(sizeof(*c));
    c->loop = loop;
    c->cfg = *cfg;
    c->raft_address = xdup(cfg->raft_address);
    c->rpc_address = xdup(cfg->rpc_address);
    c->http_address = xdup(cfg->http_address);
    c->data_dir = xdup(cfg->data_dir);
    if (cfg->n_accounts != 0) {
        c->acct_pending = xcalloc1(cfg->n_accounts * sizeof(*c->acct_pending));
        c->acct_refused = xcalloc1(cfg->n_accounts * sizeof(*c->acct_refused));
        c->queues = xcalloc1(cfg->n_accounts * sizeof(*c->queues));
    }
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
    metaPut(c, cfg->id, cfg->rpc_address, cfg->http_address);
    for (size_t i = 0; i < cfg->n_bootstrap; i++) {
        metaPut(c, cfg->bootstrap[i].id, cfg->bootstrap[i].rpc_address,
                cfg->bootstrap[i].http_address);
    }

    struct transport_secret secrets[TRANSPORT_KEYS_MAX];
    size_t n_secrets = 0;
    if (cfg->raft_secret != NULL) {
        secrets[n_secrets++] = (struct transport_secret){cfg->raft_secret, cfg->raft_secret_len};
        if (cfg->raft_previous_secret != NULL) {
            secrets[n_secrets++] = (struct transport_secret){cfg->raft_previous_secret,
                                                             cfg->raft_previous_secret_len};
        }
    }
    int rv = transport_init(&c->transport, loop, secrets, n_secrets);
    if (rv != 0) {
        snprintf(err, errlen, "raft transport: %s", raft_strerror(rv));
        goto err_free;
    }
    segfill_set_enabled(!cfg->segment_prefill_off); /* before raft_uv prepares a segment */
    rv = raft_uv_init(&c->io.inner, loop, c->data_dir, &c->transport.outer);
    if (rv != 0) {
        snprintf(err, errlen, "raft storage in %s: %s", c->data_dir,
                 c->io.inner.errmsg[0] ? c->io.inner.errmsg : raft_strerror(rv));
        goto err_transport;
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
    io_wrap(&c->io, loop);
    c->io.snap_dir = c->data_dir; /* snapshot data paced, in files of our own (snapstore.h) */
    c->io.log_dir = c->data_dir;  /* truncations marked and checked (logdir.h) */

    c->fsm.version = 2;
    c->fsm.data = c;
    c->fsm.apply = fsmApply;
    c->fsm.snapshot = fsmSnapshot;
    c->fsm.restore = fsmRestore;
    c->fsm.snapshot_finalize = fsmSnapshotFinalize;
    if (snapshotAsync(c)) {
        c->fsm.version = 3;
        c->fsm.snapshot_async = fsmSnapshotAsync;
    }
    rv = raft_init(&c->raft, &c->io.outer, &c->fsm, cfg->id, c->raft_address);
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

    if (cfg->n_bootstrap > 0) {
        struct raft_configuration conf;
        raft_configuration_init(&conf);
        for (size_t i = 0; i < cfg->n_bootstrap; i++) {
            rv = raft_configuration_add(&conf, cfg->bootstrap[i].id,
                                        cfg->bootstrap[i].raft_address, RAFT_VOTER);
            if (rv != 0) {
                snprintf(err, errlen, "bootstrap configuration: %s", raft_strerror(rv));
                raft_configuration_close(&conf);
                goto err_raft;
            }
        }
        rv = raft_bootstrap(&c->raft, &conf);
        raft_configuration_close(&conf);
        if (rv != 0 && rv != RAFT_CANTBOOTSTRAP) {
            snprintf(err, errlen, "bootstrap: %s", raft_errmsg(&c->raft));
            goto err_raft;
        }
    }
    uv_check_init(loop, &c->flush);
    c->flush.data = c;
    uv_timer_init(loop, &c->tick);
    c->tick.data = c;
    c->handles_open = 2;
    return c;

err_raft:
    /* raft_close is asynchronous; the loop has not run, so run it to completion here. */
    raft_close(&c->raft, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
err_io:
    raft_uv_close(&c->io.inner);
err_transport:
    transport_close(&c->transport);
err_free:
    accountsFree(c);
    free(c->raft_address);
    free(c->rpc_address);
    free(c->http_address);
    free(c->data_dir);
    free(c);
    return NULL;
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
        setErr(c, "raft start: ", m != NULL && m[0] != '\0' ? m : raft_strerror(rv));
        return CLUSTER_ERAFT;
    }
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
    resetOpenBatch(c, false);
    free(c->cmds);
    free(c->waiters);
    free(c->charges);
    failQueued(c, RAFT_SHUTDOWN); /* none: cluster_close failed them */
    accountsFree(c);
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
    c->stopping = true;
    c->close_cb = cb;
    c->close_data = data;
    failWaiters(c, c->waiters, c->n_cmds, RAFT_SHUTDOWN);
    resetOpenBatch(c, false);
    failQueued(c, RAFT_SHUTDOWN);
    if (c->snap.view != NULL) {
        /* raft's I/O closes once the pool thread is done with it (io.c), then raft
         * finalizes the snapshot and the view is released. */
        clog_info("closing with a snapshot in flight (index %llu); waiting for it",
                  (unsigned long long)c->snap.index);
    }
    uv_check_stop(&c->flush);
    uv_timer_stop(&c->tick);
    uv_close((uv_handle_t *)&c->flush, handleClosed);
    uv_close((uv_handle_t *)&c->tick, handleClosed);
    raft_close(&c->raft, raftClosed);
}

/* ---- queries ------------------------------------------------------------------------- */

bool cluster_is_leader(const struct cluster *c)
{
    return raft_state((struct raft *)&c->raft) == RAFT_LEADER;
}

uint64_t cluster_leader(const struct cluster *c, const char **rpc_address)
{
    raft_id id = 0;
    const char *addr = NULL;
    raft_leader((struct raft *)&c->raft, &id, &addr);
    *rpc_address = "";
    if (id != 0) {
        for (size_t i = 0; i < c->n_meta; i++) {
            if (c->meta[i].m.id == id) {
                *rpc_address = c->meta[i].m.rpc_address;
            }
        }
    }
    return id;
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

void cluster_account_stats(const struct cluster *c, uint32_t account, uint64_t *pending,
                           uint64_t *queued, uint64_t *refused)
{
    bool in = account < c->cfg.n_accounts;
    if (pending != NULL) {
        *pending = in ? c->acct_pending[account] : 0;
    }
    if (queued != NULL) {
        *queued = in ? c->queues[account].bytes : 0;
    }
    if (refused != NULL) {
        *refused = in ? c->acct_refused[account] : 0;
    }
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
    memcpy(out->append_buckets, c->io.append_buckets, sizeof(out->append_buckets));
    out->append_count = c->io.append_count;
    out->append_sum_us = c->io.append_sum_us;
    uint64_t oldest = io_oldest_append_us(&c->io), now = uv_hrtime() / 1000u;
    out->append_oldest_us = oldest != 0 && now > oldest ? now - oldest : 0;
    out->pending_bytes = c->pending_bytes;
    out->pending_refused = c->pending_refused;
    out->transfer_refused = c->transfer_refused;
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
}

static int memberIdCmp(const void *a, const void *b)
{
    uint64_t x = ((const struct cluster_member *)a)->id, y = ((const struct cluster_member *)b)->id;
    return x < y ? -1 : x > y;
}

size_t cluster_members(const struct cluster *c, struct cluster_member *out, size_t cap)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned i;
    for (i = 0; i < conf->n && i < cap; i++) {
        const struct raft_server *s = &conf->servers[i];
        struct cluster_member *m = &out[i];
        memset(m, 0, sizeof(*m));
        m->id = s->id;
        copyAddr(m->raft_address, s->address);
        m->role = s->role;
        for (size_t j = 0; j < c->n_meta; j++) {
            if (c->meta[j].m.id == s->id) {
                copyAddr(m->rpc_address, c->meta[j].m.rpc_address);
                copyAddr(m->http_address, c->meta[j].m.http_address);
            }
        }
    }
    /* Raft keeps them in the order they were added: a member added again comes last. */
    qsort(out, i, sizeof(*out), memberIdCmp);
    return conf->n;
}

/* ---- membership and leadership ------------------------------------------------------- */

static void changeCb(struct raft_change *req, int status)
{
    struct changeReq *cr = req->data;
    struct cluster *c = cr->c;
    c->change_in_flight = false;
    cr->cb(cr->data, status, status == 0 ? "" : raft_strerror(status));
    free(cr);
}

static struct changeReq *changeNew(struct cluster *c, cluster_change_cb cb, void *data)
{
    struct changeReq *cr = xcalloc1(sizeof(*cr));
    cr->c = c;
    cr->cb = cb;
    cr->data = data;
    cr->req.data = cr;
    return cr;
}

static int changeCheck(struct cluster *c)
{
    c->errmsg[0] = '\0';
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (!cluster_is_leader(c)) {
        return CLUSTER_ENOTLEADER;
    }
    if (c->change_in_flight) {
        return CLUSTER_EBUSY;
    }
    return CLUSTER_OK;
}

/* Raft's refusals that are the caller's mistake, not the cluster's state. */
static int raftRefusal(int rv)
{
    switch (rv) {
    case RAFT_BADID:
    case RAFT_DUPLICATEID:
    case RAFT_DUPLICATEADDRESS:
    case RAFT_BADROLE:
    case RAFT_NOTFOUND:
    case RAFT_INVALID:
        return CLUSTER_EINVAL;
    case RAFT_NOTLEADER:
        return CLUSTER_ENOTLEADER;
    case RAFT_CANTCHANGE:
        /* Not a change of this leader's (changeCheck() refused those): one raft has not
         * committed yet, such as the last change when this node has only just been
         * elected; it commits with the leader's first entry. */
        return CLUSTER_ESETTLING;
    default:
        return CLUSTER_ERAFT;
    }
}

/* libraft 0.15 sets its error message on some refusals only, and never clears it: called
 * before a raft_* call whose refusal is reported with raftCallErr(), so that a refusal that
 * set none is not reported with an earlier call's message ("server is already voter" for a
 * remove of an unknown ID after a promote). */
static void raftErrClear(struct cluster *c)
{
    c->raft.errmsg[0] = '\0';
}

/* What the raft_* call after raftErrClear() said when it refused with rv. */
static const char *raftCallErr(struct cluster *c, int rv)
{
    return c->raft.errmsg[0] != '\0' ? raft_errmsg(&c->raft) : raft_strerror(rv);
}

static int changeStarted(struct cluster *c, struct changeReq *cr, int rv)
{
    if (rv != 0) {
        setErr(c, "", raftCallErr(c, rv));
        free(cr);
        return raftRefusal(rv);
    }
    c->change_in_flight = true;
    return CLUSTER_OK;
}

int cluster_member_add(struct cluster *c, const struct cluster_member *m,
                       cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    if (m->id == 0 || m->raft_address[0] == '\0' || m->rpc_address[0] == '\0') {
        return CLUSTER_EINVAL;
    }
    /* Addresses are compared as text: the service takes only those a node's configuration
     * takes (config_addr_parse: IPv4 address and port, neither with leading zeros), whose
     * texts are equal exactly when they name the same endpoint.
     *
     * Refuse what raft would refuse before the addresses reach the log: a MemberInfo for
     * an existing member would overwrite its addresses everywhere. */
    const struct raft_configuration *conf = &c->raft.configuration;
    for (unsigned i = 0; i < conf->n; i++) {
        bool same_id = conf->servers[i].id == m->id;
        if (same_id || strcmp(conf->servers[i].address, m->raft_address) == 0) {
            char why[sizeof c->errmsg];
            snprintf(why, sizeof why, "member %llu has this %s already",
                     (unsigned long long)conf->servers[i].id, same_id ? "id" : "raft address");
            setErr(c, "", why);
            return CLUSTER_EINVAL;
        }
    }
    /* And any address of the new member that is already one of a member's (or another of
     * its own): clients sent to that RPC address would reach the other node, and status,
     * which finds nodes by address, would not show the new one. */
    const char *mine[3] = {m->raft_address, m->rpc_address, m->http_address};
    for (unsigned a = 0; a < 3; a++) {
        for (unsigned b = a + 1; b < 3; b++) {
            if (mine[a][0] != '\0' && strcmp(mine[a], mine[b]) == 0) {
                setErr(c, "", "the new member's raft, rpc and http addresses must differ");
                return CLUSTER_EINVAL;
            }
        }
    }
    for (unsigned i = 0; i < conf->n; i++) {
        /* Every member's addresses are in the metadata (this node's own put at start);
         * one whose MemberInfo was never applied is compared by its raft address only. */
        const struct memberMeta *om = metaFind(c, conf->servers[i].id);
        const char *theirs[3] = {conf->servers[i].address, om != NULL ? om->m.rpc_address : "",
                                 om != NULL ? om->m.http_address : ""};
        for (unsigned a = 0; a < 3; a++) {
            for (unsigned b = 0; b < 3; b++) {
                if (mine[a][0] != '\0' && strcmp(mine[a], theirs[b]) == 0) {
                    char why[sizeof c->errmsg];
                    snprintf(why, sizeof why, "address %.200s is member %llu's already", mine[a],
                             (unsigned long long)conf->servers[i].id);
                    setErr(c, "", why);
                    return CLUSTER_EINVAL;
                }
            }
        }
    }
    struct memberMeta *mm = metaPut(c, m->id, m->rpc_address, m->http_address);
    if (mm == NULL) {
        setErr(c, "", "too many members");
        return CLUSTER_EINVAL;
    }
    /* The addresses go in the log first, so that the new member is known everywhere by
     * the time it is part of the configuration. */
    if (proposeMemberInfo(c, m) == 0) {
        mm->proposed = true;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_add(&c->raft, &cr->req, m->id, m->raft_address, changeCb));
}

int cluster_member_promote(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_assign(&c->raft, &cr->req, id, RAFT_VOTER, changeCb));
}

int cluster_member_remove(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    int rc = changeCheck(c);
    if (rc != CLUSTER_OK) {
        return rc;
    }
    /* libraft 0.15 removes the last voter too: the cluster could then never elect a leader
     * again, restarts included, and every record would be out of reach for good. */
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned voters = 0;
    bool target_votes = false;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].role == RAFT_VOTER) {
            voters++;
            target_votes = target_votes || conf->servers[i].id == id;
        }
    }
    if (target_votes && voters == 1) {
        char why[160];
        snprintf(why, sizeof why,
                 "node %llu is the last voter: the cluster would have none (add and promote "
                 "another node first)",
                 (unsigned long long)id);
        setErr(c, "", why);
        return CLUSTER_EINVAL;
    }
    struct changeReq *cr = changeNew(c, cb, data);
    raftErrClear(c);
    return changeStarted(c, cr, raft_remove(&c->raft, &cr->req, id, changeCb));
}

static void transferCb(struct raft_transfer *req)
{
    struct transferReq *tr = req->data;
    struct cluster *c = tr->c;
    raft_id lid = 0;
    const char *addr = NULL;
    raft_leader(&c->raft, &lid, &addr);
    bool moved = lid != 0 && lid != c->cfg.id;
    tr->cb(tr->data, moved ? 0 : RAFT_NOTLEADER, moved ? "" : "leadership did not move");
    free(tr);
}

int cluster_transfer(struct cluster *c, uint64_t id, cluster_change_cb cb, void *data)
{
    c->errmsg[0] = '\0';
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (!cluster_is_leader(c)) {
        return CLUSTER_ENOTLEADER;
    }
    if (c->raft.transfer != NULL) {
        /* raft_transfer would answer RAFT_NOTLEADER, which a client takes for a redirect
         * to this very node, over and over until its deadline. */
        setErr(c, "", "a leadership transfer is already in progress");
        return CLUSTER_EBUSY;
    }
    /* libraft 0.15 starts a transfer to a voter that is down, too (and picks one for "any"
     * when it holds the most entries): the leader then takes no proposals until the
     * transfer times out, and the cluster was seen without a leader for an election
     * timeout after it (test_transfer_to_a_down_node_is_refused). Only a voter
     * this node has heard from within an election timeout is asked to take over. For
     * "any", raft's own pick (the one with the most entries) while every other voter is
     * heard from, else the first one that is. */
    const struct raft_configuration *conf = &c->raft.configuration;
    uint64_t fresh_ms = c->cfg.election_timeout_ms;
    if (id == 0) {
        raft_id first_fresh = 0;
        bool all_fresh = true;
        for (unsigned i = 0; i < conf->n; i++) {
            const struct raft_server *sv = &conf->servers[i];
            if (sv->role != RAFT_VOTER || sv->id == c->cfg.id) {
                continue;
            }
            bool fresh = io_heard_ago_ms(&c->io, sv->id) <= fresh_ms;
            all_fresh = all_fresh && fresh;
            if (fresh && first_fresh == 0) {
                first_fresh = sv->id;
            }
        }
        id = all_fresh ? 0 : first_fresh;
        if (first_fresh == 0) {
            char why[160];
            snprintf(why, sizeof why,
                     "no other voter has been heard from in the last %llu ms",
                     (unsigned long long)fresh_ms);
            setErr(c, "", why);
            return CLUSTER_EUNREACHABLE;
        }
    } else if (id != c->cfg.id) {
        uint64_t ago = io_heard_ago_ms(&c->io, id);
        for (unsigned i = 0; i < conf->n; i++) {
            if (conf->servers[i].id == id && conf->servers[i].role == RAFT_VOTER &&
                ago > fresh_ms) {
                char why[200];
                if (ago == UINT64_MAX) {
                    snprintf(why, sizeof why,
                             "node %llu has not been heard from since this node started: it "
                             "looks down or unreachable",
                             (unsigned long long)id);
                } else {
                    snprintf(why, sizeof why,
                             "node %llu has not been heard from for %llu ms: it looks down "
                             "or unreachable",
                             (unsigned long long)id, (unsigned long long)ago);
                }
                setErr(c, "", why);
                return CLUSTER_EUNREACHABLE;
            }
        }
    }
    struct transferReq *tr = xcalloc1(sizeof(*tr));
    tr->c = c;
    tr->cb = cb;
    tr->data = data;
    tr->req.data = tr;
    raftErrClear(c);
    int rv = raft_transfer(&c->raft, &tr->req, id, transferCb);
    if (rv != 0) {
        setErr(c, "", raftCallErr(c, rv));
        free(tr);
        return raftRefusal(rv);
    }
    return CLUSTER_OK;
}

static void barrierCb(struct raft_barrier *req, int status)
{
    (void)status;
    free(req);
}

int cluster_snapshot_now(struct cluster *c)
{
    if (c->stopping) {
        return CLUSTER_ESTOPPING;
    }
    if (c->saved_threshold == 0) {
        c->saved_threshold = c->raft.snapshot.threshold;
        raft_set_snapshot_threshold(&c->raft, 1);
    }
    if (cluster_is_leader(c)) {
        struct raft_barrier *b = xcalloc1(sizeof(*b));
        if (raft_barrier(&c->raft, b, barrierCb) != 0) {
            free(b);
        }
    }
    return CLUSTER_OK;
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
