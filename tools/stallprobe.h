/* stallprobe: how long the machine itself kept this process's threads from running.
 *
 * One thread per CPU this process may run on, pinned to it, asks to wake every
 * STALLPROBE_PERIOD_US (an absolute deadline, clock_nanosleep) and measures how late it
 * woke. The threads ask for SCHED_FIFO at the lowest real-time priority (1): then no
 * ordinary thread of the machine (idemd's, the load generator's, a compile's) can keep
 * them from a core, and a late wake-up means the CPU itself was not running for this
 * guest: a hypervisor that descheduled or throttled the virtual CPU, or the kernel
 * itself (interrupts, real-time threads). Without the privilege (CAP_SYS_NICE) they run
 * at normal priority, and a late wake-up also counts the wait for a core behind other
 * threads; stallprobe_stats.fifo says which.
 *
 * A wake-up STALLPROBE_HOLD_US or more late is a "hold": the CPU was held off for that
 * long (at most one period less than the real hold, which may have begun just after the
 * previous wake-up). Holds are summed per run and, through stallprobe_take, per interval
 * that the caller closes on its own clock, by the time they ended (as idem-bench's
 * timeline counts operations).
 *
 * The probe costs each CPU one short wake-up per period. Not for use from a signal
 * handler; start and stop from one thread. */
#ifndef IDEM_TOOLS_STALLPROBE_H
#define IDEM_TOOLS_STALLPROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define STALLPROBE_PERIOD_US 1000u
#define STALLPROBE_HOLD_US 1000u
#define STALLPROBE_MAX_CPUS 256u

struct stallprobe;

struct stallprobe_stats {
    unsigned cpus;        /* probe threads (one per CPU) */
    bool fifo;            /* every thread ran at SCHED_FIFO priority 1 */
    uint64_t wakeups;     /* all threads together */
    uint64_t holds;       /* wake-ups STALLPROBE_HOLD_US or more late */
    uint64_t held_us;     /* their lateness, summed over every CPU */
    uint64_t held_max_us; /* the longest single hold */
    double seconds;       /* from start to stop */
};

/* The holds that ended in one interval (stallprobe_take). */
struct stallprobe_window {
    uint64_t max_us;  /* the longest hold in the window, 0 when no wake-up was a hold */
    uint64_t held_us; /* the holds' lateness, summed over every CPU */
};

/* Starts the probe: its threads run until stallprobe_stop. 0, or -1 with a message in err
 * (errlen bytes) when not one thread could be started; *out is the caller's, freed by
 * stallprobe_free. */
int stallprobe_start(struct stallprobe **out, char *err, size_t errlen);

/* Stops the threads and waits for them (a period at most), then fills *stats. */
void stallprobe_stop(struct stallprobe *p, struct stallprobe_stats *stats);

/* The holds that ended since the last call (or the start) into *w, and a new interval
 * begun. A hold whose lateness counts in w->max_us counts in w->held_us too. Any thread,
 * while the probe runs or after it stopped. */
void stallprobe_take(struct stallprobe *p, struct stallprobe_window *w);

/* Prints the run's summary line to f: "held off  X ms per CPU over S s (N CPUs, H of W
 * wake-ups 1 ms or more late, the longest M ms; probe at P priority)". */
void stallprobe_print(FILE *f, const struct stallprobe_stats *st);

/* Frees a stopped probe (NULL: nothing). */
void stallprobe_free(struct stallprobe *p);

#endif
