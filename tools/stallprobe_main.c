/* idem-stallprobe: how long this machine keeps a process's threads off its CPUs, with no
 * cluster and no load of its own (tools/stallprobe.h). Run it alone to see what a host
 * does to an idle guest, or beside a load (a cluster, fio, a compile) to see what that
 * load costs the guest as a whole; idem-bench --stall-probe measures the same during a
 * benchmark run.
 *
 *   idem-stallprobe [--duration SECONDS] [--interval MS] [--json]
 *
 * Exit status: 0 it ran; 2 usage error; 1 not one probe thread could be started. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "stallprobe.h"

static const char usageText[] =
    "Usage: idem-stallprobe [--duration SECONDS] [--interval MS] [--json]\n"
    "\n"
    "Measures how long the machine keeps this process's threads off its CPUs: one thread\n"
    "per CPU, pinned to it, at SCHED_FIFO priority 1 when allowed (root or CAP_SYS_NICE;\n"
    "else at normal priority, and other threads' use of the CPU counts too), wakes every\n"
    "1 ms; a wake-up 1 ms or more late is a hold. With SCHED_FIFO, a hold is time the CPU\n"
    "did not run this system at all: a hypervisor that descheduled or throttled the\n"
    "virtual CPU, or the kernel itself.\n"
    "\n"
    "  --duration SECONDS  how long to measure (default 10, 1..3600)\n"
    "  --interval MS       also report each interval of MS (default 1000; 0: none,\n"
    "                      10..60000)\n"
    "  --json              print one JSON object: cpus, scheduling, seconds, wakeups,\n"
    "                      holds, held_ms_per_cpu, held_max_ms and intervals (end_ms,\n"
    "                      held_ms summed over the CPUs, held_max_ms)\n"
    "  --help              print this help and exit\n"
    "Exit status: 0 it ran, 2 usage error, 1 the probe could not start.\n";

static double ms(uint64_t us)
{
    return (double)us / 1000.0;
}

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleepMs(uint64_t n)
{
    struct timespec ts = {.tv_sec = (time_t)(n / 1000), .tv_nsec = (long)(n % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* What the command line asks for. */
struct options {
    unsigned duration_s;
    unsigned interval_ms; /* 0: no intervals */
    bool json;
};

/* Parses the command line (--name value or --name=value); prints the help and exits 0 for
 * --help, exits 2 on a usage error. */
static void parseArgs(int argc, char **argv, struct options *o)
{
    *o = (struct options){.duration_s = 10, .interval_ms = 1000};
    /* --json anywhere: usage errors found before it is reached print JSON too. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
            cli_set_json(true);
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strncmp(a, "--duration=", 11) == 0 || strncmp(a, "--interval=", 11) == 0) {
            v = a + 11; /* the --name=value form, as idem-bench takes it */
        } else if ((strcmp(a, "--duration") == 0 || strcmp(a, "--interval") == 0) &&
                   i + 1 < argc) {
            v = argv[++i];
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usageText, stdout);
            exit(0);
        } else if (strcmp(a, "--json") == 0) {
            continue;
        } else if (v != NULL && strncmp(a, "--duration", 10) == 0) {
            o->duration_s = (unsigned)cli_parse_u64("--duration", v, 1, 3600);
        } else if (v != NULL) {
            o->interval_ms = (unsigned)cli_parse_u64("--interval", v, 0, 60000);
            if (o->interval_ms != 0 && o->interval_ms < 10) {
                cli_usage_error("--interval must be 0 or 10..60000");
            }
        } else if (strcmp(a, "--duration") == 0 || strcmp(a, "--interval") == 0) {
            cli_usage_error("%s needs a value", a);
        } else {
            cli_usage_error("unknown argument '%s'", a);
        }
    }
}

/* One interval: when it ended (ms since the start) and the holds that ended in it. */
struct row {
    uint64_t end_ms;
    struct stallprobe_window w;
};

/* Runs the probe for the duration, closing an interval into rows[i] every interval_ms (n
 * rows); fills *st. 0, or -1 (reported) when the probe could not start. */
static int measure(const struct options *o, struct row *rows, size_t n,
                   struct stallprobe_stats *st)
{
    struct stallprobe *p = NULL;
    char err[256];
    uint64_t t0 = nowMs();
    if (stallprobe_start(&p, err, sizeof err) != 0) {
        fprintf(stderr, "idem-stallprobe: %s\n", err);
        return -1;
    }
    /* Each interval ends on its own schedule from the start (a late wake-up of this thread
     * shortens the next one), the last one with the run. */
    uint64_t end = t0 + (uint64_t)o->duration_s * 1000u;
    for (size_t i = 0; i < n; i++) {
        uint64_t until = t0 + (uint64_t)(i + 1) * o->interval_ms;
        until = until < end ? until : end;
        uint64_t now = nowMs();
        if (until > now) {
            sleepMs(until - now);
        }
        stallprobe_take(p, &rows[i].w);
        rows[i].end_ms = nowMs() - t0;
    }
    if (n == 0) {
        sleepMs((uint64_t)o->duration_s * 1000u);
    }
    stallprobe_stop(p, st);
    stallprobe_free(p);
    return 0;
}

/* The JSON object (--json) on stdout; 0, or 1 when out of memory. */
static int printJson(const struct stallprobe_stats *st, const struct row *rows, size_t n)
{
    json_t *o = json_object();
    json_t *ja = json_array();
    if (o == NULL || ja == NULL) {
        fputs("idem-stallprobe: out of memory\n", stderr);
        return 1;
    }
    json_object_set_new(o, "cpus", json_integer((json_int_t)st->cpus));
    json_object_set_new(o, "scheduling", json_string(st->fifo ? "fifo" : "normal"));
    json_object_set_new(o, "seconds", json_real(st->seconds));
    json_object_set_new(o, "wakeups", json_integer((json_int_t)st->wakeups));
    json_object_set_new(o, "holds", json_integer((json_int_t)st->holds));
    json_object_set_new(o, "held_ms_per_cpu", json_real(ms(st->held_us) / st->cpus));
    json_object_set_new(o, "held_max_ms", json_real(ms(st->held_max_us)));
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_object();
        if (r == NULL) {
            return 1;
        }
        json_object_set_new(r, "end_ms", json_integer((json_int_t)rows[i].end_ms));
        json_object_set_new(r, "held_ms", json_real(ms(rows[i].w.held_us)));
        json_object_set_new(r, "held_max_ms", json_real(ms(rows[i].w.max_us)));
        json_array_append_new(ja, r);
    }
    json_object_set_new(o, "intervals", ja);
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s == NULL) {
        return 1;
    }
    puts(s);
    free(s);
    json_decref(o);
    return 0;
}

/* The summary line and the table of intervals on stdout. */
static void printText(const struct stallprobe_stats *st, const struct row *rows, size_t n)
{
    stallprobe_print(stdout, st);
    if (n > 0) {
        printf("  %10s %14s %14s\n", "until ms", "held ms (sum)", "longest ms");
        for (size_t i = 0; i < n; i++) {
            printf("  %10" PRIu64 " %14.3f %14.3f\n", rows[i].end_ms, ms(rows[i].w.held_us),
                   ms(rows[i].w.max_us));
        }
    }
}

int main(int argc, char **argv)
{
    cli_set_prog("idem-stallprobe");
    struct options o;
    parseArgs(argc, argv, &o);
    size_t n_rows =
        o.interval_ms ? ((size_t)o.duration_s * 1000u + o.interval_ms - 1) / o.interval_ms : 0;
    struct row *rows = calloc(n_rows ? n_rows : 1, sizeof(*rows));
    if (rows == NULL) {
        fputs("idem-stallprobe: out of memory\n", stderr);
        return 1;
    }
    struct stallprobe_stats st;
    if (measure(&o, rows, n_rows, &st) != 0) {
        free(rows);
        return 1;
    }
    int code = 0;
    if (o.json) {
        code = printJson(&st, rows, n_rows);
    } else {
        printText(&st, rows, n_rows);
    }
    free(rows);
    return code;
}
