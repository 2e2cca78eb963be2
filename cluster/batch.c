/* batch: proposals batched into log entries, and the hand-off of their results.
 *
 * Commands taken (admission.c) wait in the open batch until this loop turn's I/O callbacks
 * ran (batch_flush_cb), or for a group commit (cluster_config.batch_delay_us, below), or
 * until it is full; batch_flush() packs them into one LogEntry and
 * raft_apply()s it, keeping it in `pending` with its commands' waiters until raft's apply
 * callback. Each waiter is handed back exactly once: to ops.apply when its command is
 * applied here (batch_apply), or to ops.fail. */
#include "cluster_internal.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "clog.h"

#define ENTRY_HEADER 8 /* batch.h: the framing */

/* A batch of this many commands goes in without waiting for more (cluster.h, batch_delay_us):
 * so many callers at once fill entries well enough, and a closed loop of them is not slowed. */
#define BATCH_WAIT_COMMANDS 32

/* After this many waits in a row that nothing joined, waits stay off for BATCH_WAIT_OFF_NS
 * (cluster.h). */
#define BATCH_WAIT_IDLE_RUN 3
#define BATCH_WAIT_OFF_NS (100u * 1000000u)

void batch_fail_waiters(struct cluster *c, void **waiters, unsigned n, int status)
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
    TAILQ_REMOVE(&c->pending, b, link);
}

static void applyCb(struct raft_apply *req, int status, void *result)
{
    (void)result;
    struct cluster_batch *b = req->data;
    struct cluster *c = b->c;
    pendingUnlink(c, b);
    c->pending_bytes -= b->cost;
    admission_uncharge(c, b->charges, b->n);
    /* On success every waiter was handed to ops.apply in fsmApply; on failure those not yet
     * applied are failed now. */
    batch_fail_waiters(c, b->waiters, b->n, status == 0 ? RAFT_SHUTDOWN : status);
    free(b->waiters);
    free(b->charges);
    free(b);
    if (c->queued_bytes != 0) {
        if (status != 0) {
            /* Leadership lost (or the node stops): the commands held back never went in. */
            admission_fail_queued(c, RAFT_NOTLEADER);
        } else if (!c->stopping) {
            /* room for held-back ones: admission_admit_queued */
            uv_check_start(&c->flush, batch_flush_cb);
        }
    }
}

/* Empties the open batch. Its charges stay on their accounts when `keep_charges` (they
 * went to a proposed batch). */
void batch_reset_open(struct cluster *c, bool keep_charges)
{
    if (!keep_charges) {
        admission_uncharge(c, c->charges, c->n_cmds);
    }
    c->n_cmds = 0;
    c->batch_bytes = 0;
    c->pending_bytes -= c->open_cost;
    c->open_cost = 0;
}

/* Empties the open batch (its charges uncharged) and frees what holds it: the cluster's
 * end, before c itself is freed, once its waiters were failed (cluster_close). */
void batch_close_open(struct cluster *c)
{
    batch_reset_open(c, false);
    free(c->cmds);
    free(c->cmd_at);
    free(c->open_buf);
    free(c->waiters);
    free(c->charges);
}

void batch_entry_encode(const Idem__LogEntry *e, struct raft_buffer *buf)
{
    size_t n = idem__log_entry__get_packed_size(e);
    buf->len = (ENTRY_HEADER + n + 7) & ~(size_t)7;
    buf->base = raft_malloc(buf->len);
    if (buf->base == NULL) {
        clog_error("out of memory");
        abort();
    }
    uint8_t *p = buf->base;
    /* Every byte written (the log holds them): the length, zeros to the header's end, the
     * payload, zeros to the 8-byte boundary. */
    memset(p, 0, ENTRY_HEADER);
    p[0] = (uint8_t)n;
    p[1] = (uint8_t)(n >> 8);
    p[2] = (uint8_t)(n >> 16);
    p[3] = (uint8_t)(n >> 24);
    size_t packed = idem__log_entry__pack(e, p + ENTRY_HEADER);
    assert(packed == n);
    (void)packed;
    memset(p + ENTRY_HEADER + n, 0, buf->len - ENTRY_HEADER - n);
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

Idem__LogEntry *batch_entry_decode(const struct raft_buffer *buf, ProtobufCAllocator *a)
{
    size_t plen = 0;
    const uint8_t *payload = entryPayload(buf, &plen);
    return payload != NULL ? idem__log_entry__unpack(a, plen, payload) : NULL;
}

void batch_encode(ProtobufCBinaryData *cmds, size_t n, uint64_t proposer, uint64_t epoch,
                  uint64_t proposal, struct raft_buffer *buf)
{
    Idem__CommandBatch batch = IDEM__COMMAND_BATCH__INIT;
    batch.n_commands = n;
    batch.commands = cmds;
    batch.proposer = proposer;
    batch.epoch = epoch;
    batch.proposal = proposal;
    Idem__LogEntry entry = IDEM__LOG_ENTRY__INIT;
    entry.kind_case = IDEM__LOG_ENTRY__KIND_BATCH;
    entry.batch = &batch;
    batch_entry_encode(&entry, buf);
}

void batch_apply_commands(const Idem__CommandBatch *b, uint64_t index, void **waiters,
                          unsigned n_waiters, batch_apply_fn apply, void *data)
{
    size_t n = b->n_commands;
    if (n > ((size_t)1 << BATCH_SLOT_BITS)) {
        clog_error("log entry %llu holds too many commands; skipped", (unsigned long long)index);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        void *w = NULL;
        if (waiters != NULL && i < n_waiters) {
            w = waiters[i];
            waiters[i] = NULL;
        }
        apply(data, (index << BATCH_SLOT_BITS) | i, b->commands[i].data, b->commands[i].len, w);
    }
}

static struct cluster_batch *pendingFind(struct cluster *c, const Idem__CommandBatch *b)
{
    if (b->proposer != c->cfg.id || b->epoch != c->epoch) {
        return NULL;
    }
    struct cluster_batch *p;
    TAILQ_FOREACH (p, &c->pending, link) {
        if (p->proposal == b->proposal) {
            return p;
        }
    }
    return NULL;
}

void batch_apply(struct cluster *c, const Idem__CommandBatch *b, uint64_t index)
{
    struct cluster_batch *p = pendingFind(c, b);
    batch_apply_commands(b, index, p != NULL ? p->waiters : NULL, p != NULL ? p->n : 0,
                         c->ops.apply, c->ops.data);
}

/* Arms (ns > 0) or disarms (0) the batch's timerfd. */
static void delaySet(struct cluster *c, uint64_t ns)
{
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = (time_t)(ns / 1000000000u);
    its.it_value.tv_nsec = (long)(ns % 1000000000u);
    (void)timerfd_settime(c->delay_fd, 0, &its, NULL);
}

/* After raft_apply refused buf with rv: frees buf if raft did not. libraft 0.15 refuses
 * RAFT_NOTLEADER before it takes the entry, and RAFT_NOMEM where it may have (out of
 * memory ends the node, as everywhere here); any other refusal comes from the log write it
 * started after appending the entry, and raft freed the entry's buffer when it discarded
 * it: freeing it here too was a double free. */
static void applyRefused(struct raft_buffer *buf, int rv)
{
    if (rv == RAFT_NOMEM) {
        clog_error("out of memory");
        abort();
    }
    if (rv == RAFT_NOTLEADER) {
        raft_free(buf->base);
    }
    buf->base = NULL;
}

/* Packs and proposes the open batch. */
void batch_flush(struct cluster *c)
{
    if (c->delay_armed) {
        delaySet(c, 0);
        c->delay_armed = false;
    }
    if (c->n_cmds == 0) {
        return;
    }
    c->last_proposed_ns = uv_hrtime();
    unsigned n = c->n_cmds;
    void **waiters = cluster_xcalloc(n * sizeof(*waiters));
    memcpy(waiters, c->waiters, n * sizeof(*waiters));
    struct charge *charges = cluster_xcalloc(n * sizeof(*charges));
    memcpy(charges, c->charges, n * sizeof(*charges));

    for (unsigned i = 0; i < n; i++) {
        c->cmds[i].data = c->open_buf + c->cmd_at[i];
    }
    struct raft_buffer buf;
    uint64_t proposal = ++c->next_proposal;
    batch_encode(c->cmds, n, c->cfg.id, c->epoch, proposal, &buf);
    uint64_t cost = c->open_cost;
    batch_reset_open(c, true);
    c->pending_bytes += cost; /* now the batch's, and so are the accounts' charges */

    struct cluster_batch *b = cluster_xcalloc(sizeof(*b));
    b->c = c;
    b->cost = cost;
    b->proposal = proposal;
    b->waiters = waiters;
    b->charges = charges;
    b->n = n;
    b->req.data = b;
    int rv = cluster_leading(c) ? raft_apply(&c->raft, &b->req, &buf, 1, applyCb)
                                : RAFT_NOTLEADER;
    if (rv != 0) {
        /* Not leading any more, or a transfer began since these commands were taken (a
         * transfer request read in the same loop iteration), or the log write could not
         * start: none of them is in the log. */
        applyRefused(&buf, rv);
        c->not_proposed += n;
        c->pending_bytes -= cost;
        admission_uncharge(c, charges, n);
        batch_fail_waiters(c, waiters, n, rv);
        free(waiters);
        free(charges);
        free(b);
        /* taken on the same terms, never proposed either */
        admission_fail_queued(c, RAFT_NOTLEADER);
        return;
    }
    TAILQ_INSERT_TAIL(&c->pending, b, link);
}

/* Whether the open batch must be proposed before a command of len bytes can join it. */
bool batch_open_full(const struct cluster *c, size_t len)
{
    return c->n_cmds > 0 && (c->n_cmds == c->cfg.batch_max_commands ||
                             c->batch_bytes + len > c->cfg.batch_max_bytes);
}

/* Whether this node may hand raft a batch now (raft_apply refuses one during a transfer). */
bool batch_may_propose(struct cluster *c)
{
    return !c->stopping && cluster_leading(c) && c->raft.transfer == NULL;
}

/* Adds a copy of a command (len bytes at data) to the open batch, which has room for it
 * (batch_open_full). Its cost goes to its account's bytes in flight, and to pending_bytes
 * and its account's pending bytes unless it was charged when held back. */
void batch_open_append(struct cluster *c, const uint8_t *data, size_t len, void *waiter,
                       uint32_t account, uint32_t cost, bool charged)
{
    if (c->n_cmds == c->cap_cmds) {
        c->cap_cmds = c->cap_cmds ? c->cap_cmds * 2 : 64;
        c->cmds = realloc(c->cmds, c->cap_cmds * sizeof(*c->cmds));
        c->cmd_at = realloc(c->cmd_at, c->cap_cmds * sizeof(*c->cmd_at));
        c->waiters = realloc(c->waiters, c->cap_cmds * sizeof(*c->waiters));
        c->charges = realloc(c->charges, c->cap_cmds * sizeof(*c->charges));
        if (c->cmds == NULL || c->cmd_at == NULL || c->waiters == NULL || c->charges == NULL) {
            clog_error("out of memory");
            abort();
        }
    }
    if (c->open_cap - c->batch_bytes < len) {
        /* Grown by doubling as the batches need, and kept: batch_max_bytes bounds a batch's
         * bytes, so it stays under twice that. */
        size_t want = c->open_cap ? c->open_cap : 4096;
        while (want - c->batch_bytes < len) {
            want *= 2;
        }
        c->open_buf = realloc(c->open_buf, want);
        if (c->open_buf == NULL) {
            clog_error("out of memory");
            abort();
        }
        c->open_cap = want;
    }
    if (len != 0) {
        memcpy(c->open_buf + c->batch_bytes, data, len);
    }
    c->cmd_at[c->n_cmds] = c->batch_bytes;
    c->cmds[c->n_cmds].data = NULL;
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
    if (c->n_cmds == 1 || (c->delay_armed && c->n_cmds == BATCH_WAIT_COMMANDS)) {
        uv_check_start(&c->flush, batch_flush_cb);
    }
}

void batch_delay_cb(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct cluster *c = h->data;
    uint64_t expirations;
    (void)!read(c->delay_fd, &expirations, sizeof(expirations));
    if (!c->delay_armed) {
        return; /* proposed meanwhile (the batch filled) */
    }
    c->delay_armed = false;
    if (c->n_cmds > c->delay_from_cmds) {
        c->waits_idle_run = 0;
    } else if (++c->waits_idle_run == BATCH_WAIT_IDLE_RUN) {
        /* Nothing joined the last waits: their callers wait for these answers before they
         * send more (a closed loop), and waiting only slows them. None for a while. */
        c->wait_off_until_ns = uv_hrtime() + BATCH_WAIT_OFF_NS;
        c->waits_idle_run = 0;
        c->waits_off++;
    }
    if (c->queued_bytes != 0) {
        admission_admit_queued(c);
    }
    batch_flush(c);
}

void batch_flush_cb(uv_check_t *h)
{
    struct cluster *c = h->data;
    uv_check_stop(h);
    cluster_apply_deferred(c); /* a follower's entries whose answer was not sent (fsmApply) */
    if (c->queued_bytes != 0) {
        admission_admit_queued(c);
    }
    if (c->delay_armed && !c->stopping && c->n_cmds < BATCH_WAIT_COMMANDS) {
        return; /* the wait began in an earlier turn: batch_delay_cb proposes */
    }
    uint64_t now = uv_hrtime(), delay = (uint64_t)c->cfg.batch_delay_us * 1000u;
    if (delay != 0 && c->delay_fd >= 0 && !c->stopping && c->n_cmds != 0 &&
        c->n_cmds < BATCH_WAIT_COMMANDS && now - c->last_proposed_ns < delay &&
        now >= c->wait_off_until_ns) {
        /* The last entry went in less than batch_delay_us ago: this turn's commands wait for
         * more (cluster.h), until then, or until the batch fills (admission.c). */
        c->delay_from_cmds = c->n_cmds;
        c->delay_armed = true;
        c->waits++;
        delaySet(c, c->last_proposed_ns + delay - now);
        return;
    }
    batch_flush(c);
}

static void internalApplyCb(struct raft_apply *req, int status, void *result)
{
    (void)status;
    (void)result;
    free(req->data);
}

/* Proposes a cluster-level entry without a waiter. */
int batch_propose_internal(struct cluster *c, const Idem__LogEntry *entry)
{
    struct raft_buffer buf;
    batch_entry_encode(entry, &buf);
    struct internalReq *r = cluster_xcalloc(sizeof(*r));
    r->req.data = r;
    int rv = cluster_leading(c) ? raft_apply(&c->raft, &r->req, &buf, 1, internalApplyCb)
                                : RAFT_NOTLEADER;
    if (rv != 0) {
        applyRefused(&buf, rv);
        free(r);
    }
    return rv;
}
