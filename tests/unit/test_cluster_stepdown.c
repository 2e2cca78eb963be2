/* The cluster layer while libraft 0.15 steps a leader down: raft still says RAFT_LEADER
 * while it fails the stepping-down leader's apply requests (convertClearLeader), after it
 * freed its progress array. A failure callback that proposes again at once (an answer
 * callback making its next call, as proxy mode's complete after a failed renew) found the
 * open batch full, batch_flush() handed raft the batch, and raft read the freed array: the
 * node crashed (SIGSEGV). Now such a proposal is refused as "not the leader" at once
 * (cluster_leading), and every waiter is handed back exactly once.
 *
 * Two voters on 127.0.0.1 with free ports, each in a process of its own (the second one
 * forked, with an election timeout long enough that the first one leads). The leader
 * proposes two commands; the follower is killed, so they never commit and the leader steps
 * down (check-quorum) and fails them; each failure proposes 600 KiB again. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "cluster.h"
#include "tmpdir.h"

#define BIG (600u * 1024u) /* two fill the default batch (1 MiB): the second flushes it */

static struct cluster *me;
static uint8_t big[BIG];
static unsigned fails, refused, proposed_again, handed_back[8];
static int phase;
static unsigned ticks;
static pid_t child;
static bool stepped_down;

static void applyCb(void *d, uint64_t idx, const uint8_t *cmd, size_t len, void *w)
{
    (void)d;
    (void)idx;
    (void)cmd;
    (void)len;
    (void)w;
}

/* A waiter handed back: counted by its number; and the caller's next call, at once. */
static void failCb(void *d, void *w, int status)
{
    (void)d;
    (void)status;
    uintptr_t k = (uintptr_t)w;
    assert_true(k >= 1 && k < 8);
    handed_back[k]++;
    fails++;
    if (k <= 2) { /* the first two: their callers propose again */
        int rc = cluster_propose(me, big, sizeof big, (void *)(uintptr_t)(k + 2),
                                 CLUSTER_ACCOUNT_NONE);
        if (rc == CLUSTER_OK) {
            proposed_again++; /* taken: handed back later (3 and 4), as not proposed */
        } else {
            refused++;
        }
    }
}

static int snapCb(void *d, uint8_t **b, size_t *l)
{
    (void)d;
    *b = malloc(1);
    *l = 0;
    return *b != NULL ? 0 : -1;
}

static int restoreCb(void *d, const uint8_t *b, size_t l)
{
    (void)d;
    (void)b;
    (void)l;
    return 0;
}

static struct cluster_member boot[2];
static char dirs[2][256];

static unsigned freePort(uv_loop_t *loop)
{
    uv_tcp_t tcp;
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    uv_tcp_init(loop, &tcp);
    assert_int_equal(uv_tcp_bind(&tcp, (const struct sockaddr *)&sa, 0), 0);
    int len = sizeof(sa);
    uv_tcp_getsockname(&tcp, (struct sockaddr *)&sa, &len);
    uv_close((uv_handle_t *)&tcp, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return ntohs(sa.sin_port);
}

static struct cluster *startNode(uv_loop_t *loop, int i, unsigned election_ms)
{
    struct cluster_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.id = (uint64_t)i + 1;
    cfg.raft_address = boot[i].raft_address;
    cfg.rpc_address = boot[i].rpc_address;
    cfg.http_address = boot[i].http_address;
    cfg.data_dir = dirs[i];
    cfg.bootstrap = boot;
    cfg.n_bootstrap = 2;
    cfg.election_timeout_ms = election_ms;
    cfg.heartbeat_timeout_ms = 50;
    cfg.snapshot_threshold = 8192;
    cfg.snapshot_trailing = 2048;
    cfg.snapshot_trailing_max_bytes = 256u << 20;
    cfg.snapshot_log_max_bytes = 256u << 20;
    cfg.segment_size = 8u << 20;
    cfg.pre_vote = true;
    cfg.batch_max_commands = 256;
    cfg.batch_max_bytes = 1u << 20;
    cfg.batch_delay_us = 0;
    cfg.max_pending_bytes = 64u << 20;
    struct cluster_ops ops = {
        .apply = applyCb, .fail = failCb, .snapshot = snapCb, .restore = restoreCb};
    char err[256];
    struct cluster *c = cluster_new(loop, &cfg, &ops, err, sizeof err);
    if (c == NULL || cluster_start(c) != 0) {
        fprintf(stderr, "node %d: %s\n", i + 1, err);
        return NULL;
    }
    return c;
}

static void closedCb(void *data)
{
    *(bool *)data = true;
}

static void tickCb(uv_timer_t *t)
{
    ticks++;
    if (phase == 0 && cluster_is_leader(me)) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = 0;
        /* Two commands, each its own entry (one per loop turn); never committed. */
        assert_int_equal(cluster_propose(me, (const uint8_t *)"x", 1, (void *)1,
                                         CLUSTER_ACCOUNT_NONE),
                         CLUSTER_OK);
        phase = 1;
    } else if (phase == 1) {
        assert_int_equal(cluster_propose(me, (const uint8_t *)"y", 1, (void *)2,
                                         CLUSTER_ACCOUNT_NONE),
                         CLUSTER_OK);
        phase = 2;
    } else if (phase == 2 && !cluster_is_leader(me)) {
        stepped_down = true;
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
        return;
    }
    if (ticks > 1500) { /* 30 s: never led, or never stepped down */
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
    }
}

static void test_a_failure_callback_proposing_again_while_raft_steps_down(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    for (int i = 0; i < 2; i++) {
        boot[i].id = (uint64_t)i + 1;
        snprintf(boot[i].raft_address, CLUSTER_ADDR_MAX, "127.0.0.1:%u", freePort(&loop));
        snprintf(boot[i].rpc_address, CLUSTER_ADDR_MAX, "127.0.0.1:%u", 1000u + (unsigned)i);
        snprintf(boot[i].http_address, CLUSTER_ADDR_MAX, "127.0.0.1:%u", 2000u + (unsigned)i);
        boot[i].role = RAFT_VOTER;
        assert_int_equal(tmpdir_make(dirs[i], sizeof dirs[i], "idem-stepdown"), 0);
    }
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* The follower: slow to stand for election, so that node 1 leads. */
        uv_loop_t l;
        uv_loop_init(&l);
        if (startNode(&l, 1, 5000) == NULL) {
            _exit(2);
        }
        uv_run(&l, UV_RUN_DEFAULT);
        _exit(0);
    }
    me = startNode(&loop, 0, 300);
    assert_non_null(me);
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, tickCb, 20, 20);
    while (!uv_is_closing((uv_handle_t *)&t)) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    assert_true(stepped_down);
    /* Both commands handed back once; their callers' next calls refused as "not the
     * leader" at once, or taken and handed back once in their turn. */
    assert_int_equal(handed_back[1], 1);
    assert_int_equal(handed_back[2], 1);
    assert_int_equal(refused + proposed_again, 2);
    bool closed = false;
    cluster_close(me, closedCb, &closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_true(closed);
    assert_int_equal(handed_back[3], proposed_again >= 1 ? 1 : 0);
    assert_int_equal(handed_back[4], proposed_again >= 2 ? 1 : 0);
    assert_int_equal(uv_loop_close(&loop), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tmpdir_remove(dirs[i]), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_failure_callback_proposing_again_while_raft_steps_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
