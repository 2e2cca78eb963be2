/* Unit tests of tools/hist.c (idem-bench's latency histogram): bucket bounds and
 * percentiles against known distributions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hist.h"

/* Every value lies within its bucket, buckets are contiguous and at most 1/64 wide. */
static void test_bounds(void **state)
{
    (void)state;
    uint64_t prev_hi = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        assert_true(lo <= hi);
        if (i > 0) {
            assert_int_equal(lo, prev_hi + 1);
        }
        if (lo >= HIST_SUB) {
            assert_true((hi - lo + 1) * 64 <= lo);
        }
        assert_int_equal(hist_index(lo), i);
        assert_int_equal(hist_index(hi), i);
        prev_hi = hi;
    }
    assert_int_equal(prev_hi, (1ull << HIST_MAX_EXP) - 1);
    /* Beyond the range: the last bucket. */
    assert_int_equal(hist_index(UINT64_MAX), HIST_BUCKETS - 1);
}

/* Below 128 every value is its own bucket: percentiles are exact. */
static void test_exact_small(void **state)
{
    (void)state;
    struct hist h;
    hist_init(&h);
    for (uint64_t v = 1; v <= 100; v++) {
        hist_record(&h, v);
    }
    assert_int_equal(h.total, 100);
    assert_int_equal(hist_percentile(&h, 50), 50);
    assert_int_equal(hist_percentile(&h, 90), 90);
    assert_int_equal(hist_percentile(&h, 99), 99);
    assert_int_equal(hist_percentile(&h, 99.9), 100);
    assert_int_equal(hist_percentile(&h, 100), 100);
    assert_int_equal(hist_percentile(&h, 0.001), 1);
    assert_true(hist_mean(&h) > 50.49 && hist_mean(&h) < 50.51);
}

/* p99.9 of exactly 1000 (10^4, 10^5) samples is the 999th (9990th, ...) value, not the
 * maximum: the rank is computed without floating-point rounding up (99.9 / 100 * 1000 is
 * 999.0000000000001 in doubles). */
static void test_rank_of_round_totals(void **state)
{
    (void)state;
    for (uint64_t total = 1000; total <= 100000; total *= 10) {
        struct hist h;
        hist_init(&h);
        uint64_t slow = total / 1000;
        for (uint64_t i = 0; i < total - slow; i++) {
            hist_record(&h, 10);
        }
        for (uint64_t i = 0; i < slow; i++) {
            hist_record(&h, 100);
        }
        assert_int_equal(hist_percentile(&h, 99.9), 10);
        assert_int_equal(hist_percentile(&h, 99.95), 100);
        assert_int_equal(hist_percentile(&h, 100), 100);
    }
}

/* The reported value v for a true percentile t obeys t <= v <= t + t/64. */
static void assertNear(uint64_t got, uint64_t truth)
{
    if (!(got >= truth && got <= truth + truth / 64)) {
        fail_msg("percentile %llu, true value %llu", (unsigned long long)got,
                 (unsigned long long)truth);
    }
}

static void test_uniform(void **state)
{
    (void)state;
    struct hist *h = malloc(sizeof *h);
    assert_non_null(h);
    hist_init(h);
    /* 1..1,000,000 once each, recorded in a scrambled order. */
    const uint64_t n = 1000000;
    for (uint64_t i = 0; i < n; i++) {
        hist_record(h, (i * 7919) % n + 1);
    }
    assert_int_equal(h->min, 1);
    assert_int_equal(h->max, n);
    assertNear(hist_percentile(h, 50), 500000);
    assertNear(hist_percentile(h, 90), 900000);
    assertNear(hist_percentile(h, 99), 990000);
    assertNear(hist_percentile(h, 99.9), 999000);
    assert_int_equal(hist_percentile(h, 100), n);
    free(h);
}

/* 99% fast, 1% slow: p99 is still fast, p99.9 the slow mode, max exact. */
static void test_bimodal(void **state)
{
    (void)state;
    struct hist h;
    hist_init(&h);
    for (int i = 0; i < 9900; i++) {
        hist_record(&h, 1000);
    }
    for (int i = 0; i < 100; i++) {
        hist_record(&h, 250000 + (uint64_t)i);
    }
    assertNear(hist_percentile(&h, 50), 1000);
    assertNear(hist_percentile(&h, 99), 1000);
    assertNear(hist_percentile(&h, 99.01), 250000);
    assertNear(hist_percentile(&h, 99.9), 250089);
    assert_int_equal(hist_percentile(&h, 100), 250099);
    assert_int_equal(h.max, 250099);
}

/* An exponential-ish distribution from a fixed seed: the histogram's percentiles match
 * the sorted samples' within the bucket precision. */
static int cmpU64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_against_sorted(void **state)
{
    (void)state;
    const size_t n = 20000;
    uint64_t *v = malloc(n * sizeof *v);
    struct hist *a = malloc(sizeof *a), *b = malloc(sizeof *b), *all = malloc(sizeof *all);
    assert_true(v && a && b && all);
    hist_init(a);
    hist_init(b);
    hist_init(all);
    uint64_t s = 42;
    printf("seed %llu\n", (unsigned long long)s);
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        unsigned e = (unsigned)(s >> 59) % 24; /* 0..23 */
        uint64_t x = (1ull << e) + ((s >> 20) & ((1ull << e) - 1));
        v[i] = x;
        hist_record(i % 2 ? a : b, x);
        hist_record(all, x);
    }
    hist_merge(a, b); /* the merge of two halves equals the whole */
    assert_memory_equal(a->counts, all->counts, sizeof a->counts);
    assert_int_equal(a->total, n);
    assert_int_equal(a->max, all->max);
    assert_int_equal(a->min, all->min);
    qsort(v, n, sizeof *v, cmpU64);
    static const double ps[] = {1, 10, 50, 90, 99, 99.9, 99.99};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        size_t rank = (size_t)(ps[k] / 100.0 * (double)n + 0.999999);
        assertNear(hist_percentile(a, ps[k]), v[rank - 1]);
    }
    assert_int_equal(hist_percentile(a, 100), v[n - 1]);
    free(v);
    free(a);
    free(b);
    free(all);
}

static void test_empty_and_clamp(void **state)
{
    (void)state;
    struct hist h;
    hist_init(&h);
    assert_int_equal(hist_percentile(&h, 50), 0);
    assert_true(hist_mean(&h) == 0);
    hist_record(&h, UINT64_MAX / 2); /* beyond the range: last bucket, max exact */
    assert_int_equal(hist_percentile(&h, 50), (1ull << HIST_MAX_EXP) - 1);
    assert_int_equal(h.max, UINT64_MAX / 2);
    hist_record(&h, 0);
    assert_int_equal(hist_percentile(&h, 50), 0);
}

static void test_ascii(void **state)
{
    (void)state;
    struct hist h;
    hist_init(&h);
    for (int i = 0; i < 90; i++) {
        hist_record(&h, 300);
    }
    for (int i = 0; i < 10; i++) {
        hist_record(&h, 5000);
    }
    char buf[4096] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    hist_print_ascii(f, &h, 1000.0, "ms", 40);
    fclose(f);
    /* Rows from [256, 512) to [4096, 8192): five rows, the first with 90% and a full bar,
     * the last with 10% and cumulative 100%. */
    int rows = 0;
    for (const char *p = buf; *p; p++) {
        rows += *p == '\n';
    }
    assert_int_equal(rows, 5);
    assert_non_null(strstr(buf, "90.00%  90.000% |########################################\n"));
    assert_non_null(strstr(buf, "10.00% 100.000% |####\n"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),         cmocka_unit_test(test_exact_small),
        cmocka_unit_test(test_uniform),        cmocka_unit_test(test_bimodal),
        cmocka_unit_test(test_against_sorted), cmocka_unit_test(test_empty_and_clamp),
        cmocka_unit_test(test_ascii),
        cmocka_unit_test(test_rank_of_round_totals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
