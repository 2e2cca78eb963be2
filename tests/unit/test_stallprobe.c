/* Unit tests of tools/stallprobe.c: a process whose threads are all held off the CPUs for a
 * known time (SIGSTOP from its parent, then SIGCONT) reports a hold that long, in the
 * interval (stallprobe_take) it ended in; the counters and intervals are what the header
 * says. */
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

#define WINDOW_MS 100
#define N_WINDOWS 9 /* taken every WINDOW_MS while the probe runs, then one after the stop */

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
    struct stallprobe_stats st;
    struct stallprobe_window w[N_WINDOWS + 2]; /* the last two taken after the stop */
    uint64_t end_us[N_WINDOWS];                /* when each of the others was taken */
};

/* The child runs the probe for N_WINDOWS intervals of WINDOW_MS; the parent stops it at
 * stop_at_ms for hold_ms. *cont_us: when the parent sent SIGCONT (CLOCK_MONOTONIC, which
 * both share). */
static void runStopped(unsigned stop_at_ms, unsigned hold_ms, struct report *r, uint64_t *cont_us)
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
        if (stallprobe_start(&p, err, sizeof err) != 0) {
            fprintf(stderr, "stallprobe_start: %s\n", err);
            _exit(1);
        }
        char c = 1;
        if (write(ready[1], &c, 1) != 1) {
            _exit(1);
        }
        struct report out;
        memset(&out, 0, sizeof(out));
        for (size_t i = 0; i < N_WINDOWS; i++) {
            sleepMs(WINDOW_MS);
            stallprobe_take(p, &out.w[i]);
            out.end_us[i] = nowUs();
        }
        stallprobe_stop(p, &out.st);
        stallprobe_take(p, &out.w[N_WINDOWS]);     /* what ended between the last and the stop */
        stallprobe_take(p, &out.w[N_WINDOWS + 1]); /* nothing since */
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
 * held ms per CPU at least, and a wake-up that late falls in the interval the stop ended in:
 * the first one taken after SIGCONT, or the next (the child's thread that takes them was
 * stopped too, and may run before the probe's at SIGCONT). */
static void test_stopped_process_is_a_hold(void **state)
{
    (void)state;
    struct report r;
    uint64_t cont_us;
    runStopped(250, 150, &r, &cont_us);
    unsigned cpus = allowedCpus();
    uint64_t at_least_us = (150 - 20) * 1000u;
    assert_int_equal(r.st.cpus, cpus);
    assert_true(r.st.held_max_us >= at_least_us);
    assert_true(r.st.held_us >= (uint64_t)cpus * at_least_us);
    assert_true(r.st.holds >= cpus);
    assert_true(r.st.seconds >= 0.9);
    uint64_t held_sum = 0, worst_us = 0;
    for (size_t i = 0; i <= N_WINDOWS; i++) {
        if (r.w[i].max_us > worst_us) {
            worst_us = r.w[i].max_us;
        }
        assert_true(r.w[i].held_us >= r.w[i].max_us);
        held_sum += r.w[i].held_us;
    }
    assert_int_equal(worst_us, r.st.held_max_us);
    size_t after = 0; /* the first interval taken after SIGCONT */
    while (after < N_WINDOWS && r.end_us[after] < cont_us) {
        after++;
    }
    /* The stop's hold is in that interval or the next. It need not be the run's worst: on a
     * loaded machine (a build, other tests) a thread can wake later still in another one. */
    assert_true(r.w[after].max_us >= at_least_us ||
                (after < N_WINDOWS && r.w[after + 1].max_us >= at_least_us));
    /* Every hold of the run is in exactly one interval; nothing after the last take. */
    assert_int_equal(held_sum, r.st.held_us);
    assert_int_equal(r.w[N_WINDOWS + 1].max_us, 0);
    assert_int_equal(r.w[N_WINDOWS + 1].held_us, 0);
}

/* A probe that was not stopped: each thread woke about once a period, and the holds taken
 * are the run's. */
static void test_wakeups(void **state)
{
    (void)state;
    struct stallprobe *p = NULL;
    char err[256];
    assert_int_equal(stallprobe_start(&p, err, sizeof err), 0);
    sleepMs(200);
    struct stallprobe_stats st;
    stallprobe_stop(p, &st);
    assert_int_equal(st.cpus, allowedCpus());
    /* 200 per CPU if none was late; a fifth of that at least on a busy machine (at normal
     * priority, without CAP_SYS_NICE, each late wake-up restarts the schedule). */
    assert_true(st.wakeups >= (uint64_t)st.cpus * 40);
    assert_true(st.holds <= st.wakeups);
    assert_true(st.held_max_us <= st.held_us);
    struct stallprobe_window w;
    stallprobe_take(p, &w);
    assert_int_equal(w.max_us, st.held_max_us);
    assert_int_equal(w.held_us, st.held_us);
    stallprobe_free(p);
    stallprobe_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stopped_process_is_a_hold),
        cmocka_unit_test(test_wakeups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
