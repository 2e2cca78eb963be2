/* Unit tests of tools/stallprobe.c: a process whose threads are all held off the CPUs for a
 * known time (SIGSTOP from its parent, then SIGCONT) reports a hold that long, in the
 * interval it ended in; the counters and intervals are what the header says. */
#define _GNU_SOURCE /* CPU_COUNT */
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "stallprobe.h"

#define BIN_MS 100
#define N_BINS 12

static void sleepMs(unsigned n)
{
    struct timespec ts = {.tv_sec = n / 1000, .tv_nsec = (long)(n % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static uint64_t nowUs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static unsigned allowedCpus(void)
{
    cpu_set_t s;
    assert_int_equal(sched_getaffinity(0, sizeof(s), &s), 0);
    unsigned n = (unsigned)CPU_COUNT(&s);
    return n < STALLPROBE_MAX_CPUS ? n : STALLPROBE_MAX_CPUS;
}

/* What the child reports through the pipe. */
struct report {
    uint64_t start_us;           /* the child's clock just before stallprobe_start */
    uint64_t take1_us, take2_us; /* stallprobe_take_max_us after the stop, twice */
    struct stallprobe_stats st;
    uint64_t bin_max_us[N_BINS + 1];
    uint64_t bin_held_us[N_BINS + 1];
};

/* The child runs the probe for run_ms with 100 ms intervals; the parent stops it at stop_at_ms
 * for hold_ms. *cont_us: when the parent sent SIGCONT (CLOCK_MONOTONIC, which both share). */
static void runStopped(unsigned run_ms, unsigned stop_at_ms, unsigned hold_ms, struct report *r,
                       uint64_t *cont_us)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        close(ready[0]);
        struct stallprobe *p = NULL;
        char err[256];
        uint64_t start_us = nowUs();
        if (stallprobe_start(&p, BIN_MS, N_BINS, err, sizeof err) != 0) {
            fprintf(stderr, "stallprobe_start: %s\n", err);
            _exit(1);
        }
        char c = 1;
        if (write(ready[1], &c, 1) != 1) {
            _exit(1);
        }
        sleepMs(run_ms);
        struct report out;
        memset(&out, 0, sizeof(out));
        stallprobe_stop(p, &out.st);
        out.start_us = start_us;
        out.take1_us = stallprobe_take_max_us(p);
        out.take2_us = stallprobe_take_max_us(p);
        for (size_t i = 0; i <= N_BINS; i++) { /* N_BINS itself: past the last, reads 0 */
            out.bin_max_us[i] = stallprobe_bin_max_us(p, i);
            out.bin_held_us[i] = stallprobe_bin_held_us(p, i);
        }
        stallprobe_free(p);
        _exit(write(fds[1], &out, sizeof(out)) == (ssize_t)sizeof(out) ? 0 : 1);
    }
    close(fds[1]);
    close(ready[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1); /* the probe runs from here */
    close(ready[0]);
    sleepMs(stop_at_ms);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    sleepMs(hold_ms);
    *cont_us = nowUs();
    assert_int_equal(kill(pid, SIGCONT), 0);
    size_t got = 0;
    while (got < sizeof(*r)) {
        ssize_t n = read(fds[0], (char *)r + got, sizeof(*r) - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Stopped for 150 ms from ~250 ms: every CPU's thread woke about that late (one period
 * less than the stop at most, and a little for the signals to take effect), so as many
 * held ms per CPU at least, and the latest wake-up falls in the interval the stop ended in
 * (the one of SIGCONT, or the next if the threads ran only after its end). */
static void test_stopped_process_is_a_hold(void **state)
{
    (void)state;
    struct report r;
    uint64_t cont_us;
    runStopped(900, 250, 150, &r, &cont_us);
    unsigned cpus = allowedCpus();
    uint64_t at_least_us = (150 - 20) * 1000u;
    assert_int_equal(r.st.cpus, cpus);
    assert_true(r.st.held_max_us >= at_least_us);
    assert_true(r.st.held_us >= (uint64_t)cpus * at_least_us);
    assert_true(r.st.holds >= cpus);
    assert_true(r.st.seconds >= 0.9);
    size_t worst = 0;
    uint64_t held_sum = 0;
    for (size_t i = 0; i < N_BINS; i++) {
        if (r.bin_max_us[i] > r.bin_max_us[worst]) {
            worst = i;
        }
        assert_true(r.bin_held_us[i] >= r.bin_max_us[i]);
        held_sum += r.bin_held_us[i];
    }
    assert_int_equal(r.bin_max_us[worst], r.st.held_max_us);
    /* The intervals count from the probe's start, a little after start_us; the threads wake
     * a little after SIGCONT. */
    size_t cont_bin = (size_t)((cont_us - r.start_us) / (BIN_MS * 1000u));
    assert_true(worst + 1 >= cont_bin && worst <= cont_bin + 1);
    /* Never taken before: the first take is the run's latest wake-up, the next nothing. */
    assert_int_equal(r.take1_us, r.st.held_max_us);
    assert_int_equal(r.take2_us, 0);
    /* Every hold of the run ended within the intervals (0.9 s of 1.2 s). */
    assert_int_equal(held_sum, r.st.held_us);
    assert_int_equal(r.bin_max_us[N_BINS], 0);
    assert_int_equal(r.bin_held_us[N_BINS], 0);
}

/* A probe that was not stopped: each thread woke about once a period (half of them at
 * least, whatever else the machine does), and without intervals every bin reads 0. */
static void test_wakeups_and_no_bins(void **state)
{
    (void)state;
    struct stallprobe *p = NULL;
    char err[256];
    assert_int_equal(stallprobe_start(&p, 0, 0, err, sizeof err), 0);
    sleepMs(200);
    struct stallprobe_stats st;
    stallprobe_stop(p, &st);
    assert_int_equal(st.cpus, allowedCpus());
    /* 200 per CPU if none was late; a fifth of that at least on a busy machine (at normal
     * priority, without CAP_SYS_NICE, each late wake-up restarts the schedule). */
    assert_true(st.wakeups >= (uint64_t)st.cpus * 40);
    assert_true(st.holds <= st.wakeups);
    assert_true(st.held_max_us <= st.held_us);
    assert_int_equal(stallprobe_bin_max_us(p, 0), 0);
    assert_int_equal(stallprobe_bin_held_us(p, 0), 0);
    stallprobe_free(p);
    stallprobe_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stopped_process_is_a_hold),
        cmocka_unit_test(test_wakeups_and_no_bins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
