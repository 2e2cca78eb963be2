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

#define ADDR(d) rpc_admit_addr_v4(0x7f000000u | (d)) /* 127.0.0.d */
#define NONE rpc_admit_addr_v4(0)

/* The IPv6 address 2001:db8:0:NET::HOST. */
static struct rpc_admit_addr v6(unsigned net, unsigned host)
{
    struct rpc_admit_addr x;
    memset(&x, 0, sizeof x);
    x.b[0] = 0x20;
    x.b[1] = 0x01;
    x.b[2] = 0x0d;
    x.b[3] = 0xb8;
    x.b[6] = (uint8_t)(net >> 8);
    x.b[7] = (uint8_t)net;
    x.b[14] = (uint8_t)(host >> 8);
    x.b[15] = (uint8_t)host;
    return x;
}

/* Admits a connection from addr into e when the verdict allows; returns the verdict. */
static enum rpc_admit_verdict admit(struct rpc_admit *a, struct rpc_admit_entry *e,
                                    struct rpc_admit_addr addr, struct rpc_admit_entry **evicted)
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
    struct rpc_admit_addr members[] = {ADDR(1)};
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
    struct rpc_admit_addr members[] = {ADDR(1), ADDR(1), NONE, ADDR(9)};
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
    struct rpc_admit_addr members[] = {ADDR(1)};
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
        assert_int_equal(admit(&a, &e[i], i < 7 ? ADDR(1) : NONE, &ev), RPC_ADMIT_OK);
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
    static int of[N]; /* e[i]'s address: model's index */
    unsigned model[ADDRS] = {0};
    srand(7);
    for (int step = 0; step < 200000; step++) {
        int i = rand() % N;
        int k = rand() % ADDRS;
        /* Half IPv4 addresses, half IPv6 ones (two per /64, counted together). */
        struct rpc_admit_addr addr =
            k < ADDRS / 2 ? rpc_admit_addr_v4((uint32_t)(k + 1) << 20) : v6((unsigned)k, 1);
        if (k >= ADDRS / 2 && rand() % 2) {
            addr = v6((unsigned)k, 2);
        }
        if (in[i]) {
            model[of[i]]--;
            rpc_admit_remove(&a, &e[i]);
            in[i] = false;
        } else {
            struct rpc_admit_entry *ev;
            assert_int_equal(admit(&a, &e[i], addr, &ev), RPC_ADMIT_OK);
            model[k]++;
            of[i] = k;
            in[i] = true;
        }
        if (step % 1000 == 0) {
            /* Each address's count as the cap sees it: refused exactly at the model's. */
            struct rpc_admit b = a;
            for (int m = 0; m < ADDRS; m++) {
                b.per_address = model[m];
                struct rpc_admit_entry *ev = NULL;
                struct rpc_admit_addr x =
                    m < ADDRS / 2 ? rpc_admit_addr_v4((uint32_t)(m + 1) << 20) : v6((unsigned)m, 3);
                enum rpc_admit_verdict v = rpc_admit_decide(&b, x, &ev);
                assert_int_equal(v, model[m] > 0 ? RPC_ADMIT_REFUSE_ADDR : RPC_ADMIT_OK);
            }
        }
    }
    rpc_admit_free(&a);
}

/* IPv6 peers: capped per /64 (the host part changes nothing), a member by its whole address;
 * an IPv4 address and another /64 are counted apart. */
static void test_ipv6_is_capped_per_64(void **state)
{
    (void)state;
    struct rpc_admit a;
    rpc_admit_init(&a, 100, 10, 2);
    struct rpc_admit_addr members[] = {v6(9, 1)};
    rpc_admit_set_members(&a, members, 1);
    struct rpc_admit_entry e[16];
    struct rpc_admit_entry *ev;
    assert_int_equal(admit(&a, &e[0], v6(1, 1), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[1], v6(1, 2), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[2], v6(1, 3), &ev), RPC_ADMIT_REFUSE_ADDR);
    assert_int_equal(admit(&a, &e[2], v6(2, 1), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[3], ADDR(1), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[4], ADDR(2), &ev), RPC_ADMIT_OK);
    /* The member's address is not capped; another address of its /64 is. */
    for (int i = 5; i < 9; i++) {
        assert_int_equal(admit(&a, &e[i], v6(9, 1), &ev), RPC_ADMIT_OK);
        assert_int_equal(e[i].cls, RPC_ADMIT_MEMBER);
    }
    assert_int_equal(admit(&a, &e[9], v6(9, 2), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[10], v6(9, 3), &ev), RPC_ADMIT_OK);
    assert_int_equal(admit(&a, &e[11], v6(9, 4), &ev), RPC_ADMIT_REFUSE_ADDR);
    rpc_admit_remove(&a, &e[0]);
    assert_int_equal(admit(&a, &e[0], v6(1, 7), &ev), RPC_ADMIT_OK);
    rpc_admit_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_oldest_unauthenticated_connection_makes_room),
        cmocka_unit_test(test_members_are_not_evicted_and_the_secret_makes_a_member),
        cmocka_unit_test(test_one_address_holds_at_most_its_cap),
        cmocka_unit_test(test_counts_per_address_follow_a_model),
        cmocka_unit_test(test_ipv6_is_capped_per_64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
