/* Unit tests of server/deadlines.c: the heap the proposed ops' deadlines share one timer
 * through. Checked against a plain array: after every push and every removal, the heap's
 * earliest is the array's, and each entry's position is where the heap holds it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "deadlines.h"

#define N 2000

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The earliest time among the held ones (UINT64_MAX: none). */
static uint64_t modelMin(const struct deadline *d, size_t n)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if (deadline_held(&d[i]) && d[i].at < m) {
            m = d[i].at;
        }
    }
    return m;
}

static void checkHeap(const struct deadlines *h, const struct deadline *d, size_t n)
{
    size_t held = 0;
    for (size_t i = 0; i < n; i++) {
        if (deadline_held(&d[i])) {
            held++;
            assert_true(d[i].pos < h->n);
            assert_ptr_equal(h->v[d[i].pos], &d[i]);
        }
    }
    assert_int_equal(held, h->n);
    for (size_t i = 1; i < h->n; i++) {
        assert_true(h->v[(i - 1) / 2]->at <= h->v[i]->at);
    }
    struct deadline *m = deadlines_min(h);
    if (held == 0) {
        assert_null(m);
    } else {
        assert_non_null(m);
        assert_int_equal(m->at, modelMin(d, n));
    }
}

static void test_empty(void **state)
{
    (void)state;
    struct deadlines h;
    deadlines_init(&h);
    assert_null(deadlines_min(&h));
    struct deadline d;
    deadline_init(&d);
    deadlines_remove(&h, &d); /* not held: nothing */
    assert_false(deadline_held(&d));
    assert_null(deadlines_min(&h));
    deadlines_free(&h);
}

/* Deadlines in the order they were taken, each the same length: what a node sees most. */
static void test_in_order(void **state)
{
    (void)state;
    static struct deadline d[N];
    struct deadlines h;
    deadlines_init(&h);
    for (size_t i = 0; i < N; i++) {
        deadline_init(&d[i]);
        deadlines_push(&h, &d[i], 5000 + i);
    }
    checkHeap(&h, d, N);
    /* answered in order: the earliest each time */
    for (size_t i = 0; i < N / 2; i++) {
        assert_ptr_equal(deadlines_min(&h), &d[i]);
        deadlines_remove(&h, &d[i]);
        assert_false(deadline_held(&d[i]));
    }
    checkHeap(&h, d, N);
    /* then from the latest back */
    for (size_t i = N; i-- > N / 2;) {
        deadlines_remove(&h, &d[i]);
        checkHeap(&h, d, N);
    }
    assert_null(deadlines_min(&h));
    deadlines_free(&h);
}

/* Pushes and removals at random, equal times included; every step checked. */
static void test_random(void **state)
{
    (void)state;
    static struct deadline d[N];
    for (size_t i = 0; i < N; i++) {
        deadline_init(&d[i]);
    }
    struct deadlines h;
    deadlines_init(&h);
    uint64_t s = 88172645463325252u;
    for (int step = 0; step < 20 * N; step++) {
        struct deadline *x = &d[rnd(&s) % N];
        if (deadline_held(x)) {
            deadlines_remove(&h, x);
        } else {
            deadlines_push(&h, x, rnd(&s) % 64);
        }
        if (step % 97 == 0) {
            checkHeap(&h, d, N);
        } else {
            assert_int_equal(deadlines_min(&h) != NULL ? deadlines_min(&h)->at : UINT64_MAX,
                             modelMin(d, N));
        }
    }
    /* Drained by always taking the earliest, as the timer does: times never go back. */
    uint64_t last = 0;
    struct deadline *m;
    while ((m = deadlines_min(&h)) != NULL) {
        assert_true(m->at >= last);
        last = m->at;
        deadlines_remove(&h, m);
    }
    checkHeap(&h, d, N);
    deadlines_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_in_order),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
