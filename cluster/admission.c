/* admission: whether a proposed command is taken, and when it goes in: max_pending_bytes
 * (CLUSTER_EOVERLOAD), the accounts' max_account_pending_bytes (CLUSTER_ESHARE) and
 * max_account_inflight_bytes, past which an account's commands are held back on the leader
 * and go into the open batch (batch.c) as its earlier ones commit (cluster.h). */
#include "cluster_internal.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"

void admission_init(struct cluster *c)
{
    if (c->cfg.n_accounts != 0) {
        c->acct_pending = cluster_xcalloc(c->cfg.n_accounts * sizeof(*c->acct_pending));
        c->acct_refused = cluster_xcalloc(c->cfg.n_accounts * sizeof(*c->acct_refused));
        c->queues = cluster_xcalloc(c->cfg.n_accounts * sizeof(*c->queues));
        for (uint32_t i = 0; i < c->cfg.n_accounts; i++) {
            STAILQ_INIT(&c->queues[i].held);
        }
    }
}

void cluster_add_accounts(struct cluster *c, uint32_t n)
{
    if (n <= c->cfg.n_accounts) {
        return;
    }
    uint32_t old = c->cfg.n_accounts;
    uint64_t *pending = cluster_xcalloc(n * sizeof(*pending));
    uint64_t *refused = cluster_xcalloc(n * sizeof(*refused));
    struct acctQueue *queues = cluster_xcalloc(n * sizeof(*queues));
    for (uint32_t i = 0; i < n; i++) {
        STAILQ_INIT(&queues[i].held);
        if (i < old) { /* a queue's last pointer may point into its head: moved, not copied */
            pending[i] = c->acct_pending[i];
            refused[i] = c->acct_refused[i];
            queues[i].bytes = c->queues[i].bytes;
            STAILQ_CONCAT(&queues[i].held, &c->queues[i].held);
        }
    }
    admission_free(c);
    c->acct_pending = pending;
    c->acct_refused = refused;
    c->queues = queues;
    c->cfg.n_accounts = n;
}

/* Takes n commands' charges (of the open batch or of a batch in raft) off their accounts. */
void admission_uncharge(struct cluster *c, const struct charge *ch, unsigned n)
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
 * RAFT_LEADER while it fails the apply requests of a leader stepping down (batch.c, applyCb),
 * so a new command may be held back meanwhile; it must find consistent queues. */
void admission_fail_queued(struct cluster *c, int status)
{
    struct queuedList all = STAILQ_HEAD_INITIALIZER(all);
    for (uint32_t a = 0; a < c->cfg.n_accounts && c->queued_bytes != 0; a++) {
        struct acctQueue *aq = &c->queues[a];
        if (STAILQ_EMPTY(&aq->held)) {
            continue;
        }
        struct queued *q;
        STAILQ_FOREACH(q, &aq->held, link)
        {
            c->queued_bytes -= q->cost;
            c->pending_bytes -= q->cost;
            c->acct_pending[a] -= q->cost;
            if (status == RAFT_NOTLEADER) {
                c->not_proposed++;
            }
        }
        STAILQ_CONCAT(&all, &aq->held); /* empties aq->held */
        aq->bytes = 0;
    }
    while (!STAILQ_EMPTY(&all)) {
        struct queued *q = STAILQ_FIRST(&all);
        STAILQ_REMOVE_HEAD(&all, link);
        void *w = q->waiter;
        free(q->data);
        free(q);
        c->ops.fail(c->ops.data, w, status);
    }
}

/* Frees the per-account arrays (their queues empty). */
void admission_free(struct cluster *c)
{
    free(c->acct_pending);
    free(c->acct_refused);
    free(c->queues);
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
    return !STAILQ_EMPTY(&c->queues[account].held) || !inflightRoom(c, account, cost);
}

/* Moves held-back commands into the open batch as far as their accounts' bounds allow, one
 * command of each account in turn (round robin, from a place that moves on at each call),
 * so that one account's backlog does not go in ahead of another's next command. */
void admission_admit_queued(struct cluster *c)
{
    uint32_t n = c->cfg.n_accounts;
    bool moved = true;
    while (c->queued_bytes != 0 && moved) {
        moved = false;
        for (uint32_t k = 0; k < n && c->queued_bytes != 0; k++) {
            uint32_t a = (c->next_admit + k) % n;
            struct acctQueue *aq = &c->queues[a];
            struct queued *q = STAILQ_FIRST(&aq->held);
            if (q == NULL || !inflightRoom(c, a, q->cost)) {
                continue;
            }
            if (!batch_may_propose(c)) {
                return;
            }
            if (batch_open_full(c, q->len)) {
                batch_flush(c); /* on failure, every command held back was failed */
                q = STAILQ_FIRST(&aq->held);
                if (q == NULL || !batch_may_propose(c)) {
                    return;
                }
            }
            STAILQ_REMOVE_HEAD(&aq->held, link);
            aq->bytes -= q->cost;
            c->queued_bytes -= q->cost;
            batch_open_append(c, q->data, q->len, q->waiter, a, q->cost, true);
            free(q->data);
            free(q);
            moved = true;
        }
    }
    c->next_admit = n != 0 ? (c->next_admit + 1) % n : 0;
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
    if (!cluster_leading(c)) {
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
    if (!wait && batch_open_full(c, len)) {
        batch_flush(c);
        if (!cluster_leading(c)) {
            return CLUSTER_ENOTLEADER;
        }
    }
    if (!wait) {
        batch_open_append(c, cmd, len, waiter, account, (uint32_t)cost, false);
        return CLUSTER_OK;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        clog_error("out of memory");
        abort();
    }
    memcpy(copy, cmd, len);
    /* Held back until its account's earlier commands commit (admission_admit_queued),
     * charged now. */
    struct queued *q = cluster_xcalloc(sizeof(*q));
    q->waiter = waiter;
    q->data = copy;
    q->len = len;
    q->cost = (uint32_t)cost;
    struct acctQueue *aq = &c->queues[account];
    STAILQ_INSERT_TAIL(&aq->held, q, link);
    aq->bytes += cost;
    c->queued_bytes += cost;
    c->pending_bytes += cost;
    c->acct_pending[account] += cost;
    return CLUSTER_OK;
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
