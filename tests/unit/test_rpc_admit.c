/* Unit tests of server/rpc_admit.c: which RPC connections come in, which one is closed to
 * make room, the per-address cap, the members' slots; and its table of counts per address
 * against a plain model under random adds and removals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_admit.h"

#define ADDR(d) (0x7f000000u | (d)) /* 127.0.0.d */

/* Admits a connection from addr into e when the verdict allows; returns the verdict. */
static enum rpc_admit_verdict admit(struct rpc_admit *a, struct rpc_admit_entry *e, uint32_t addr,
                                    struct rpc_admit_entry **evicted)
{
    struct rpc_admit_entry *old = NULL;
    enum rpc_admit_verdict v = rpc_admit_decide(a, addr, &old);
    *evicted = NULL;
    if (v == RPC_ADMIT_EVICT) {
        assert_non_null(old);
        rpc_admit_remove(a, old);
        *evicted = old;
    }
    if (v == RPC_ADMIT_OK || v == RPC_ADMIT_EVICT) {
        memset(e, 0, sizeof(*e));
        rpc_admit_add(a, e, addr);
    }
    return v;
}

static void test_the_oldest_unauthenticated_connection_makes_room(void **state)
{
    (void)state;
    struct rpc_admit a;
    rpc_admit_init(&a, 8, 2, 0); /* 8 slots, 2 of them members' */
    struct rpc_admit_entry e[16];
    struct rpc_admit_entry *ev;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(admit(&a, &e[i], ADDR(2), &ev), RPC_ADMIT_OK);
    }
    /* The six slots that are not members' are full: the oldest makes room, then the next. */
    assert_int_equal(admit(&a, &e[6], ADDR(3), &ev), RPC_ADMIT_EVICT);
    assert_ptr_equal(ev, &e[0]);
    assert_int_equal(admit(&a, &e[7], ADDR(3), &ev), RPC_ADMIT_EVICT);
    assert_ptr_equal(ev, &e[1]);
    /* An authenticated connection is not evicted: e[2] authenticates, e[3] goes next. */
    rpc_admit_authenticated(&a, &e[2], false);
    assert_int_equal(admit(&a, &e[8], ADDR(3), &ev), RPC_ADMIT_EVICT);
    assert_ptr_equal(ev, &e[3]);
    /* Once every one is authenticated, a new one is refused. */
    for (int i = 4; i <= 8; i++) {
        rpc_admit_authenticated(&a, &e[i], false);
    }
    assert_int_equal(admit(&a, &e[9], ADDR(3), &ev), RPC_ADMIT_REFUSE_FULL);
    /* ... but a member's address takes the members' slots, and only those. */
    uint32_t members[] = {ADDR(1)};
    rpc_admit_set_members(&a, members, 1);
    assert_int_equal(admit(&a, &e[10], ADDR(1), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[11], ADDR(1), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[12], ADDR(1), &ev), RPC_ADMIT_REFUSE_FULL);
    /* A closed client's slot is free again for anybody. */
    rpc_admit_remove(&a, &e[4]);
    assert_int_equal(admit(&a, &e[12], ADDR(4), &ev), RPC_ADMIT_OK);
    rpc_admit_free(&a);
}

static void test_members_are_not_evicted_and_the_secret_makes_a_member(void **state)
{
    (void)state;
    struct rpc_admit a;
    rpc_admit_init(&a, 4, 100, 0); /* the reserve is at most half: 2 */
    uint32_t members[] = {ADDR(1), ADDR(1), 0, ADDR(9)};
    rpc_admit_set_members(&a, members, 4);
    struct rpc_admit_entry e[8];
    struct rpc_admit_entry *ev;
    assert_int_equal(admit(&a, &e[0], ADDR(1), &ev), RPC_ADMIT_OK); /* a member */
    assert_int_equal(admit(&a, &e[1], ADDR(2), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[2], ADDR(2), &ev), RPC_ADMIT_OK);
    /* Two connections other than members' at most: the oldest of them goes. */
    assert_int_equal(admit(&a, &e[3], ADDR(3), &ev), RPC_ADMIT_EVICT);
    assert_ptr_equal(ev, &e[1]);
    /* e[2] authenticates with the cluster secret: a member now, not evictable, and its slot
     * counts as a member's. */
    rpc_admit_authenticated(&a, &e[2], true);
    assert_int_equal(a.n_members, 2);
    assert_int_equal(admit(&a, &e[4], ADDR(3), &ev), RPC_ADMIT_OK);
    assert_int_equal(a.n, 4);
    assert_int_equal(admit(&a, &e[5], ADDR(9), &ev), RPC_ADMIT_EVICT);
    assert_ptr_equal(ev, &e[3]);
    rpc_admit_free(&a);
}

static void test_one_address_holds_at_most_its_cap(void **state)
{
    (void)state;
    struct rpc_admit a;
    rpc_admit_init(&a, 100, 10, 3);
    uint32_t members[] = {ADDR(1)};
    rpc_admit_set_members(&a, members, 1);
    struct rpc_admit_entry e[16];
    struct rpc_admit_entry *ev;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(admit(&a, &e[i], ADDR(2), &ev), RPC_ADMIT_OK);
    }
    assert_int_equal(admit(&a, &e[3], ADDR(2), &ev), RPC_ADMIT_REFUSE_ADDR);
    rpc_admit_authenticated(&a, &e[0], false); /* authenticated ones count as well */
    assert_int_equal(admit(&a, &e[3], ADDR(2), &ev), RPC_ADMIT_REFUSE_ADDR);
    assert_int_equal(admit(&a, &e[3], ADDR(3), &ev), RPC_ADMIT_OK);
    /* A member's address is not capped; an unknown one (0) neither. */
    for (int i = 4; i < 10; i++) {
        assert_int_equal(admit(&a, &e[i], i < 7 ? ADDR(1) : 0, &ev), RPC_ADMIT_OK);
    }
    rpc_admit_remove(&a, &e[1]);
    rpc_admit_remove(&a, &e[1]); /* twice: nothing more */
    assert_int_equal(admit(&a, &e[1], ADDR(2), &ev), RPC_ADMIT_OK);
    rpc_admit_free(&a);
}

/* The counts per address against a model, with addresses chosen to collide in the table. */
static void test_counts_per_address_follow_a_model(void **state)
{
    (void)state;
    enum { N = 512, ADDRS = 40 };
    struct rpc_admit a;
    rpc_admit_init(&a, N + 1, 0, 1000);
    static struct rpc_admit_entry e[N];
    static bool in[N];
    unsigned model[ADDRS] = {0};
    srand(7);
    for (int step = 0; step < 200000; step++) {
        int i = rand() % N;
        uint32_t addr = (uint32_t)(rand() % ADDRS + 1) << 20; /* multiples collide */
        if (in[i]) {
            model[(e[i].addr >> 20) - 1]--;
            rpc_admit_remove(&a, &e[i]);
            in[i] = false;
        } else {
            struct rpc_admit_entry *ev;
            assert_int_equal(admit(&a, &e[i], addr, &ev), RPC_ADMIT_OK);
            model[(addr >> 20) - 1]++;
            in[i] = true;
        }
        if (step % 1000 == 0) {
            /* Each address's count as the cap sees it: refused exactly at the model's. */
            struct rpc_admit b = a;
            for (int k = 0; k < ADDRS; k++) {
                b.per_address = model[k];
                struct rpc_admit_entry *ev = NULL;
                enum rpc_admit_verdict v = rpc_admit_decide(&b, (uint32_t)(k + 1) << 20, &ev);
                assert_int_equal(v, model[k] > 0 ? RPC_ADMIT_REFUSE_ADDR : RPC_ADMIT_OK);
            }
        }
    }
    rpc_admit_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_oldest_unauthenticated_connection_makes_room),
        cmocka_unit_test(test_members_are_not_evicted_and_the_secret_makes_a_member),
        cmocka_unit_test(test_one_address_holds_at_most_its_cap),
        cmocka_unit_test(test_counts_per_address_follow_a_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
