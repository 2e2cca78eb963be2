/* Unit tests of server/proc_self.c (the process_* series of /metrics): /proc/<pid>/stat
 * parsing, command names with spaces and parentheses included, and this process's own
 * figures read for real. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proc_self.h"

/* A line of a real /proc/<pid>/stat with the command name given (fields 14, 15: 7 and 3
 * ticks; 22: start 3279784; 23: vsize 3133440; 24: rss 360 pages); tty_nr and tpgid are
 * negative as they are for a process without a terminal. */
static size_t statLine(char *buf, size_t cap, const char *comm)
{
    int n = snprintf(buf, cap,
                     "742 (%s) R 739 739 24356 0 -1 4194304 99 0 0 0 7 3 0 0 20 0 1 0 3279784 "
                     "3133440 360 18446744073709551615 94648326213632 94648326233513 0 0 0 0 "
                     "0 0 0 0 0 0 17 1 0 0 0 0 0\n",
                     comm);
    assert_true(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

static void test_parse(void **state)
{
    (void)state;
    static const char *const names[] = {"idemd", "a b", ") 1 2 3 (", "x)", "((", ""};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char buf[512];
        size_t len = statLine(buf, sizeof(buf), names[i]);
        struct proc_stat_fields f;
        assert_true(proc_stat_parse(buf, len, &f));
        assert_int_equal(f.utime, 7);
        assert_int_equal(f.stime, 3);
        assert_int_equal(f.starttime, 3279784);
        assert_int_equal(f.vsize, 3133440);
        assert_int_equal(f.rss, 360);
    }
}

static void test_parse_refuses(void **state)
{
    (void)state;
    struct proc_stat_fields f;
    static const char *const bad[] = {
        "",
        "742 idemd R 1 2 3",                                   /* no name in parentheses */
        "742 (idemd) R 739 739 24356 0 -1 4194304 99 0 0 0 7", /* cut before stime */
        "742 (idemd) R 739 739 24356 0 -1 4194304 99 0 0 0 x 3 0 0 20 0 1 0 1 2 3\n",
        "742 (idemd) R 739 739 24356 0 -1 4194304 99 0 0 0 7 3 0 0 20 0 1 0 -1 2 3\n",
        ("742 (idemd) R 739 739 24356 0 -1 4194304 99 0 0 0 7 3 0 0 20 0 1 0 1 2 "
         "99999999999999999999\n"), /* past 64 bits */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_false(proc_stat_parse(bad[i], strlen(bad[i]), &f));
    }
    /* The length given is what counts: the same line cut short by it is refused. */
    char buf[512];
    size_t len = statLine(buf, sizeof(buf), "idemd");
    assert_true(proc_stat_parse(buf, len, &f));
    assert_false(proc_stat_parse(buf, 60, &f));
}

/* This process, read for real: plausible figures, and a descriptor opened is counted. */
static void test_self(void **state)
{
    (void)state;
    struct proc_self a, b;
    proc_self_read(&a);
    assert_true(a.stat_ok);
    assert_true(a.fds_ok);
    assert_true(a.max_fds_ok);
    assert_true(a.resident_bytes > 0);
    assert_true(a.virtual_bytes >= a.resident_bytes);
    assert_true(a.cpu_seconds >= 0);
    assert_true(a.open_fds >= 3); /* stdin, stdout, stderr */
    assert_true(a.max_fds >= a.open_fds);
    double now = (double)time(NULL);
    assert_true(a.start_time_seconds <= now + 1);
    assert_true(a.start_time_seconds > now - 600); /* this test started moments ago */

    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    proc_self_read(&b);
    assert_int_equal(b.open_fds, a.open_fds + 1);
    close(fd);
    /* The start time is the same whenever it is read (within the clocks' rounding). */
    assert_true(b.start_time_seconds - a.start_time_seconds < 0.05);
    assert_true(a.start_time_seconds - b.start_time_seconds < 0.05);
    assert_true(b.cpu_seconds >= a.cpu_seconds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_self),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
