/* Unit tests of the snapshot schedule (cluster_snapshot_threshold, cluster_snapshot_stagger,
 * cluster_snapshot_stagger_forward):
 * how many entries a node lets pass between two snapshots, and at which indexes; of the
 * low-priority thread the serialisation runs on (niced_run); and of the readiness a node's
 * /readyz answers with (cluster_ready). */
#define _GNU_SOURCE /* gettid */
#include <raft.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "niced.h"

#define MIB (UINT64_C(1) << 20)

static void fixedWithoutMeasure(void **state)
{
    (void)state;
    /* percent 0: the configured threshold, whatever the sizes. */
    assert_int_equal(cluster_snapshot_threshold(8192, 0, 256 * MIB, 100 * MIB, 1000, 100000), 8192);
    /* Nothing measured yet (first snapshot, restart): the configured threshold. */
    assert_int_equal(cluster_snapshot_threshold(8192, 100, 256 * MIB, 100 * MIB, 0, 0), 8192);
    assert_int_equal(cluster_snapshot_threshold(8192, 100, 256 * MIB, 0, 1000, 100000), 8192);
}

static void logMatchesSnapshotSize(void **state)
{
    (void)state;
    /* 1000-byte entries, 100 MiB snapshot, 100%: the next one after 100 MiB of log. */
    assert_int_equal(cluster_snapshot_threshold(16, 100, 256 * MIB, 100 * MIB, 1000, 1000000),
                     (unsigned)(100 * MIB / 1000));
    /* 50%: half as many. */
    assert_int_equal(cluster_snapshot_threshold(16, 50, 256 * MIB, 100 * MIB, 1000, 1000000),
                     (unsigned)(50 * MIB / 1000));
    /* 300%: three times, as long as under the cap. */
    assert_int_equal(cluster_snapshot_threshold(16, 300, 1024 * MIB, 100 * MIB, 1000, 1000000),
                     (unsigned)(300 * MIB / 1000));
}

static void boundedBothWays(void **state)
{
    (void)state;
    /* The cap: at most max_log_bytes of log... */
    assert_int_equal(cluster_snapshot_threshold(16, 100, 10 * MIB, 100 * MIB, 1000, 1000000),
                     (unsigned)(10 * MIB / 1000));
    /* ... unless the configured minimum asks for more. */
    assert_int_equal(cluster_snapshot_threshold(20000, 100, 10 * MIB, 100 * MIB, 1000, 1000000),
                     20000);
    /* A small table: the minimum. */
    assert_int_equal(cluster_snapshot_threshold(8192, 100, 256 * MIB, 4096, 1000, 1000000), 8192);
    /* Saturates instead of wrapping. */
    assert_int_equal(cluster_snapshot_threshold(16, 10000, 0, UINT64_MAX / 2, 1000000, 1),
                     UINT_MAX);
}

static void staggerPutsEachVoterOnItsPhase(void **state)
{
    (void)state;
    const unsigned t = 65536;
    for (unsigned n = 2; n <= 5; n++) {
        for (unsigned k = 0; k < n; k++) {
            uint64_t index = 12345 + 977 * k; /* wherever the last snapshot was */
            for (int round = 0; round < 4; round++) {
                unsigned th = cluster_snapshot_stagger(t, index, k, n);
                assert_true(th >= t / 2 && th < t + t / 2);
                index += th;
                /* The next snapshot lands on the voter's phase: k * t / n (mod t). */
                assert_int_equal(index % t, (uint64_t)t * k / n);
            }
        }
    }
}

static void staggerPhasesDiffer(void **state)
{
    (void)state;
    /* Three voters that all snapshotted at 100000: their next ones fall a third of the
     * threshold apart, each on its own phase. */
    const unsigned t = 3 * 8192;
    uint64_t next[3];
    for (unsigned k = 0; k < 3; k++) {
        next[k] = 100000 + cluster_snapshot_stagger(t, 100000, k, 3);
        assert_int_equal(next[k] % t, (uint64_t)k * t / 3);
    }
    for (unsigned a = 0; a < 3; a++) {
        for (unsigned b = a + 1; b < 3; b++) {
            uint64_t gap = next[a] > next[b] ? next[a] - next[b] : next[b] - next[a];
            assert_true(gap == t / 3 || gap == 2 * t / 3);
        }
    }
}

static void staggerLeavesSmallOrAloneAsIs(void **state)
{
    (void)state;
    assert_int_equal(cluster_snapshot_stagger(8192, 777, 0, 1), 8192); /* one voter */
    assert_int_equal(cluster_snapshot_stagger(8192, 777, 0, 0), 8192); /* not a voter */
    assert_int_equal(cluster_snapshot_stagger(4, 777, 1, 3), 4);       /* too small */
}

static void staggerForwardNeverComesSooner(void **state)
{
    (void)state;
    const unsigned t = 8192;
    for (unsigned n = 2; n <= 5; n++) {
        for (unsigned k = 0; k < n; k++) {
            uint64_t index = k == 1 ? 5000 : 0; /* no snapshot yet, or one off phase */
            for (int round = 0; round < 4; round++) {
                unsigned th = cluster_snapshot_stagger_forward(t, index, k, n);
                /* Never under the configured minimum, and at most one interval later. */
                assert_true(th >= t && th < 2 * t);
                index += th;
                assert_int_equal(index % t, (uint64_t)t * k / n);
                if (round > 0) {
                    assert_int_equal(th, t); /* once on its phase, every t entries */
                }
            }
        }
    }
    /* A young three-voter cluster: the first snapshots are a third of t apart, not at the
     * same index on every replica. */
    assert_int_equal(cluster_snapshot_stagger_forward(t, 0, 0, 3), t);
    assert_int_equal(cluster_snapshot_stagger_forward(t, 0, 1, 3), t + t / 3);
    assert_int_equal(cluster_snapshot_stagger_forward(t, 0, 2, 3), t + 2 * t / 3);
    assert_int_equal(cluster_snapshot_stagger_forward(t, 777, 0, 1), t); /* one voter */
    assert_int_equal(cluster_snapshot_stagger_forward(4, 777, 1, 3), 4); /* too small */
    /* Near the largest threshold the config takes, the result saturates instead of
     * wrapping around to a threshold smaller than the minimum. */
    assert_int_equal(cluster_snapshot_stagger_forward(3000000000u, 0, 2, 3), UINT_MAX);
    assert_int_equal(cluster_snapshot_stagger(3000000000u, 1500000001u, 0, 3), UINT_MAX);
    assert_true(cluster_snapshot_stagger_forward(3000000000u, 0, 0, 3) == 3000000000u);
}

static void leaderWaitsTwoIntervalsMore(void **state)
{
    (void)state;
    /* Room for two more intervals: both, so the leader keeps its phase. */
    assert_int_equal(cluster_snapshot_leader_threshold(40000, 32768, UINT64_MAX), 40000 + 65536);
    /* Room for one only. */
    assert_int_equal(cluster_snapshot_leader_threshold(40000, 32768, 80000), 40000 + 32768);
    /* None: as a follower. */
    assert_int_equal(cluster_snapshot_leader_threshold(40000, 32768, 50000), 40000);
    /* Saturation guard. */
    assert_int_equal(cluster_snapshot_leader_threshold(UINT_MAX - 5, 32768, UINT64_MAX),
                     UINT_MAX - 5);
}

struct prioProbe {
    pid_t tid;
    int nice;
    int calls;
    int rv;
};

static int probePriority(void *arg)
{
    struct prioProbe *p = arg;
    p->tid = gettid();
    p->nice = getpriority(PRIO_PROCESS, (id_t)p->tid);
    p->calls++;
    return p->rv;
}

/* The nice value fn must run at: the caller's plus the increment, at most 19. */
static int expectedNice(int before, unsigned inc)
{
    int want = before + (int)(inc < 19 ? inc : 19);
    return want < 19 ? want : 19;
}

static void nicedRunsOnItsOwnThreadAtTheIncrement(void **state)
{
    (void)state;
    int before = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (before >= 19) {
        skip(); /* run at the lowest priority already: nothing to lower */
    }
    struct prioProbe p = {.rv = 42};
    int ran_at = -100;
    assert_int_equal(niced_run(19, &ran_at, probePriority, &p), 42);
    assert_int_equal(p.calls, 1);
    assert_int_not_equal(p.tid, gettid());
    assert_int_equal(p.nice, expectedNice(before, 19));
    assert_int_equal(ran_at, p.nice);
    /* The caller (raft_uv's pool thread, in idemd) keeps its priority. */
    assert_int_equal(getpriority(PRIO_PROCESS, (id_t)gettid()), before);

    p.rv = -1; /* fn's failure comes back as it is */
    assert_int_equal(niced_run(5, &ran_at, probePriority, &p), -1);
    assert_int_equal(p.nice, expectedNice(before, 5));
    assert_int_equal(ran_at, p.nice);
    assert_int_equal(niced_run(1000, NULL, probePriority, &p), -1);
    assert_int_equal(p.nice, expectedNice(before, 1000));
    assert_int_equal(niced_run(0, &ran_at, probePriority, &p), -1);
    assert_int_equal(p.nice, before);
    assert_int_equal(ran_at, before);
    assert_int_equal(p.tid, gettid()); /* nothing to lower: no thread */
    assert_int_equal(p.calls, 4);
}

/* Entries kept after a snapshot: snapshot_trailing, but only as many of the newest ones up
 * to the snapshot's index as fit in max_bytes (at least one); entries the log does not hold
 * do not count (nothing to free). The fake log holds entries 11..20 (offset 10) in a ring
 * of 16 slots starting at slot 12, entry i being i KiB. */
static void trailingKeepsBytesBounded(void **state)
{
    (void)state;
    struct raft_entry entries[16] = {0};
    struct raft_log l = {0};
    l.entries = entries;
    l.size = 16;
    l.front = 12;
    l.back = (12 + 10) % 16;
    l.offset = 10;
    for (uint64_t i = 11; i <= 20; i++) {
        entries[(l.front + (size_t)(i - 11)) % l.size].buf.len = (size_t)i << 10;
    }
    /* Up to 20: 20 + 19 + 18 = 57 KiB; a fourth (17) makes 74. */
    assert_int_equal(cluster_trailing_for(&l, 20, 2048, 60 << 10), 3);
    assert_int_equal(cluster_trailing_for(&l, 20, 2, 60 << 10), 2);      /* the count binds */
    assert_int_equal(cluster_trailing_for(&l, 20, 2048, 1 << 20), 2048); /* all fit */
    assert_int_equal(cluster_trailing_for(&l, 20, 2048, 1), 1);          /* at least one */
    /* A snapshot at 15: 15 + 14 + 13 + 12 = 54 KiB, 11 more = 65. */
    assert_int_equal(cluster_trailing_for(&l, 15, 2048, 60 << 10), 4);
    assert_int_equal(cluster_trailing_for(&l, 15, 3, 60 << 10), 3);
}

static void readyOnlyInTouchWithALeader(void **state)
{
    (void)state;
    char why[128];
    struct cluster_status st = {.state = RAFT_FOLLOWER,
                                .leader_id = 2,
                                .leader_heard_ms = 100,
                                .role = RAFT_VOTER,
                                .election_timeout_ms = 600};
    assert_true(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "");
    st.role = RAFT_STANDBY; /* the leader sends it the log */
    assert_true(cluster_ready(&st, why, sizeof why));
    st.leader_heard_ms = 1200;
    assert_true(cluster_ready(&st, why, sizeof why));
    /* A follower that heard nothing for over two election timeouts: a leader that is gone, or
     * a node that was removed and kept the leader it last knew. */
    st.leader_heard_ms = 1201;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "no word from leader 2 for 1201 ms");
    st.leader_heard_ms = 90000;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "no word from leader 2 for 90000 ms");
    /* A spare is sent nothing: not ready from the moment it is one, though it heard the
     * leader a moment ago (a voter just demoted). */
    st.role = RAFT_SPARE;
    st.leader_heard_ms = 100;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why,
                        "this node is a spare: the leader sends it nothing until it is promoted");
    st.role = RAFT_VOTER;
    st.leader_heard_ms = UINT64_MAX;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "no word from leader 2 since this node started");
    /* Not in its own configuration. */
    st.role = -1;
    st.leader_heard_ms = 0;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "this node is not in its Raft configuration");
    /* No leader, or electing one. */
    st.role = RAFT_VOTER;
    st.leader_id = 0;
    assert_false(cluster_ready(&st, why, sizeof why));
    assert_string_equal(why, "no leader known");
    st.leader_id = 2;
    st.state = RAFT_CANDIDATE;
    assert_false(cluster_ready(&st, why, sizeof why));
    /* The leader itself (leader_heard_ms 0). */
    st = (struct cluster_status){
        .state = RAFT_LEADER, .leader_id = 1, .role = RAFT_VOTER, .election_timeout_ms = 600};
    assert_true(cluster_ready(&st, why, sizeof why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixedWithoutMeasure),
        cmocka_unit_test(logMatchesSnapshotSize),
        cmocka_unit_test(boundedBothWays),
        cmocka_unit_test(staggerPutsEachVoterOnItsPhase),
        cmocka_unit_test(staggerPhasesDiffer),
        cmocka_unit_test(staggerLeavesSmallOrAloneAsIs),
        cmocka_unit_test(staggerForwardNeverComesSooner),
        cmocka_unit_test(leaderWaitsTwoIntervalsMore),
        cmocka_unit_test(trailingKeepsBytesBounded),
        cmocka_unit_test(nicedRunsOnItsOwnThreadAtTheIncrement),
        cmocka_unit_test(readyOnlyInTouchWithALeader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
