/* cluster_queue: the commands a leader holds back for their account's in-flight bound
 * (cluster_config.max_account_inflight_bytes): admission.c's and batch.c's functions
 * (cluster_internal.h) called directly on a cluster set up by hand as a leader: raft itself
 * is not started (integration.tenantinflight drives the whole path on a real cluster). */
#include "cluster_internal.h"

#include <stdint.h>
#include <stdlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#define CMD_LEN 100
#define COST (CMD_LEN + CLUSTER_COMMAND_OVERHEAD)

static uv_loop_t loop;
static struct cluster *C;
static int fails;
static void *failed[16];
static bool reenter;

/* ops.fail: records the waiter; when `reenter`, the first call proposes another command of
 * account 0 at once, as an answer callback that makes its next call synchronously does (the
 * HTTP proxy's complete after a failed renew) while raft still says leader (libraft 0.15
 * fails a stepping-down leader's apply requests before it changes its state). */
static void opsFail(void *data, void *waiter, int status)
{
    (void)data;
    assert_int_equal(status, RAFT_NOTLEADER);
    failed[fails++] = waiter;
    if (reenter) {
        reenter = false;
        uint8_t cmd[CMD_LEN] = {0};
        assert_int_equal(cluster_propose(C, cmd, sizeof cmd, (void *)0x77, 0), CLUSTER_OK);
    }
}

static void onClose(uv_handle_t *h)
{
    (void)h;
}

/* A leader with two accounts, each allowed 3 commands' costs less one byte in flight. */
static int setup(void **state)
{
    (void)state;
    assert_int_equal(uv_loop_init(&loop), 0);
    C = cluster_xcalloc(sizeof(*C));
    C->loop = &loop;
    C->cfg.n_accounts = 2;
    C->cfg.batch_max_bytes = 1 << 20;
    C->cfg.batch_max_commands = 256;
    C->cfg.max_pending_bytes = 64u << 20;
    C->cfg.max_account_inflight_bytes = 3 * COST - 1;
    C->acct_pending = cluster_xcalloc(2 * sizeof(*C->acct_pending));
    C->acct_refused = cluster_xcalloc(2 * sizeof(*C->acct_refused));
    C->queues = cluster_xcalloc(2 * sizeof(*C->queues));
    STAILQ_INIT(&C->queues[0].held);
    STAILQ_INIT(&C->queues[1].held);
    TAILQ_INIT(&C->pending);
    C->ops.fail = opsFail;
    C->raft.state = RAFT_LEADER;
    /* Leading as cluster_leading() sees it: a progress array (never read here: nothing is
     * handed to raft). */
    static struct raft_progress *progress_placeholder[1];
    C->raft.leader_state.progress = (struct raft_progress *)progress_placeholder;
    assert_int_equal(uv_check_init(&loop, &C->flush), 0);
    C->flush.data = C;
    fails = 0;
    reenter = false;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    admission_fail_queued(C, RAFT_NOTLEADER);
    batch_close_open(C);
    uv_close((uv_handle_t *)&C->flush, onClose);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    admission_free(C);
    free(C);
    return 0;
}

/* An account's costs in the open batch (in raft: none here), counted apart. */
static uint64_t inflight(uint32_t account)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < C->n_cmds; i++) {
        n += C->charges[i].account == account ? C->charges[i].cost : 0;
    }
    return n;
}

static void propose1(uint32_t account, uintptr_t waiter)
{
    uint8_t cmd[CMD_LEN] = {0};
    assert_int_equal(cluster_propose(C, cmd, sizeof cmd, (void *)waiter, account), CLUSTER_OK);
}

/* Past the bound an account's commands wait, in its order, and the others' do not; as room
 * comes, the accounts' waiting commands go in one of each in turn. */
static void test_held_back_in_order_and_taken_in_turn(void **state)
{
    (void)state;
    for (uintptr_t w = 1; w <= 5; w++) {
        propose1(0, w); /* 1 and 2 fit; 3 (3 * COST) would pass the bound */
    }
    propose1(1, 11);
    propose1(1, 12);
    propose1(1, 13);
    propose1(1, 14);
    assert_int_equal(C->n_cmds, 4);
    assert_ptr_equal(C->waiters[0], (void *)1);
    assert_ptr_equal(C->waiters[1], (void *)2);
    assert_ptr_equal(C->waiters[2], (void *)11);
    assert_ptr_equal(C->waiters[3], (void *)12);
    assert_int_equal(C->queues[0].bytes, 3 * COST);
    assert_int_equal(C->queues[1].bytes, 2 * COST);
    assert_int_equal(C->queued_bytes, 5 * COST);
    assert_int_equal(C->pending_bytes, 9 * COST); /* held back ones are charged too */
    assert_int_equal(C->acct_pending[0], 5 * COST);
    assert_int_equal(inflight(0), 2 * COST);
    for (uint32_t a = 0; a < 2; a++) { /* what admission.c's inflightRoom derives */
        assert_int_equal(C->acct_pending[a] - C->queues[a].bytes, inflight(a));
    }

    /* Both accounts' batches applied: the open batch emptied with its charges (as batch.c's
     * applyCb takes them off), then the waiting ones go in, 0 and 1 in turn. */
    batch_reset_open(C, false);
    assert_int_equal(inflight(0), 0);
    assert_int_equal(inflight(1), 0);
    C->next_admit = 0;
    admission_admit_queued(C);
    void *order[] = {(void *)3, (void *)13, (void *)4, (void *)14};
    assert_int_equal(C->n_cmds, 4);
    for (unsigned i = 0; i < 4; i++) {
        assert_ptr_equal(C->waiters[i], order[i]);
    }
    assert_int_equal(C->queues[0].bytes, COST); /* 5 still waits: 0 has 2 in flight */
    assert_ptr_equal(STAILQ_FIRST(&C->queues[0].held)->waiter, (void *)5);
    assert_true(STAILQ_EMPTY(&C->queues[1].held));
    assert_int_equal(C->queued_bytes, COST);
    assert_int_equal(C->pending_bytes, 5 * COST);
    /* A new command of account 0 waits behind 5, though there would be room after it. */
    batch_reset_open(C, false);
    propose1(0, 6);
    assert_int_equal(C->n_cmds, 0);
    struct queued *last = STAILQ_FIRST(&C->queues[0].held);
    while (STAILQ_NEXT(last, link) != NULL) {
        last = STAILQ_NEXT(last, link);
    }
    assert_ptr_equal(last->waiter, (void *)6);
}

/* Leadership lost: every held-back command handed back and uncharged, including when the
 * callback proposes again meanwhile (before, that command was written through the freed
 * tail of the queue being emptied and then lost, with its charge kept for good). */
static void test_failed_while_a_callback_proposes_again(void **state)
{
    (void)state;
    propose1(0, 1);
    propose1(0, 2);
    propose1(0, 3);
    propose1(0, 4);
    assert_int_equal(C->queued_bytes, 2 * COST);
    reenter = true;
    admission_fail_queued(C, RAFT_NOTLEADER);
    assert_int_equal(fails, 2);
    assert_ptr_equal(failed[0], (void *)3);
    assert_ptr_equal(failed[1], (void *)4);
    assert_int_equal(C->not_proposed, 2);
    /* The one proposed from the callback waits, counted once, with a consistent queue. */
    struct queued *only = STAILQ_FIRST(&C->queues[0].held);
    assert_non_null(only);
    assert_null(STAILQ_NEXT(only, link));
    assert_ptr_equal(only->waiter, (void *)0x77);
    assert_int_equal(C->queues[0].bytes, COST);
    assert_int_equal(C->queued_bytes, COST);
    assert_int_equal(C->acct_pending[0], 3 * COST); /* 1 and 2 in flight, 0x77 held back */
    assert_int_equal(C->pending_bytes, 3 * COST);
    admission_fail_queued(C, RAFT_NOTLEADER); /* the tick's, once raft says follower */
    assert_int_equal(fails, 3);
    assert_int_equal(C->queued_bytes, 0);
    batch_reset_open(C, false);
    assert_int_equal(C->pending_bytes, 0);
    assert_int_equal(C->acct_pending[0], 0);
    assert_int_equal(inflight(0), 0);
}

/* Accounts added (a tenant new to a reloaded configuration): the held-back commands of the
 * accounts there were stay queued in order with their charges (their queues moved to the
 * new arrays), and the new account takes commands and is held back by its own bound. */
static void test_accounts_added(void **state)
{
    (void)state;
    for (uintptr_t w = 1; w <= 4; w++) {
        propose1(0, w); /* 3 and 4 held back (the last queue's tail pointer is moved too) */
    }
    cluster_add_accounts(C, 1); /* never fewer */
    assert_int_equal(C->cfg.n_accounts, 2);
    cluster_add_accounts(C, 5);
    assert_int_equal(C->cfg.n_accounts, 5);
    assert_int_equal(C->acct_pending[0], 4 * COST);
    assert_int_equal(C->queues[0].bytes, 2 * COST);
    propose1(0, 5); /* appended behind 4 through the moved queue */
    struct queued *q = STAILQ_FIRST(&C->queues[0].held);
    for (uintptr_t w = 3; w <= 5; w++, q = STAILQ_NEXT(q, link)) {
        assert_non_null(q);
        assert_ptr_equal(q->waiter, (void *)w);
    }
    assert_null(q);
    for (uintptr_t w = 41; w <= 43; w++) {
        propose1(4, w);
    }
    assert_int_equal(C->acct_pending[4], 3 * COST);
    assert_int_equal(C->queues[4].bytes, COST); /* its third waits for its own room */
    uint64_t pending = 0;
    cluster_account_stats(C, 4, &pending, NULL, NULL);
    assert_int_equal(pending, 3 * COST);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_held_back_in_order_and_taken_in_turn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_while_a_callback_proposes_again, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_accounts_added, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
