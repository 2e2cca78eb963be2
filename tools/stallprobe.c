/* stallprobe: see stallprobe.h. */
#define _GNU_SOURCE /* CPU_SET, pthread_setaffinity_np */
#include "stallprobe.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct probeThread {
    struct stallprobe *p;
    pthread_t th;
    int cpu;
    bool fifo;
    /* Written by the thread, read after the join. */
    uint64_t wakeups, holds, held_us, held_max_us;
};

struct stallprobe {
    atomic_bool stop;
    /* The interval stallprobe_take closes next. */
    atomic_uint_fast64_t window_max_us;
    atomic_uint_fast64_t window_held_us;
    uint64_t start_ns;
    unsigned n_threads;
    struct probeThread threads[];
};

static uint64_t nowNs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds a hold to the open interval: its sum first, then its maximum, both sequentially
 * consistent, so that stallprobe_take (maximum first, then sum) never sees the maximum of a
 * hold whose lateness went into the interval before. */
static void holdAdd(struct stallprobe *p, uint64_t late_us)
{
    atomic_fetch_add(&p->window_held_us, late_us);
    uint_fast64_t cur = atomic_load(&p->window_max_us);
    while (late_us > cur && !atomic_compare_exchange_weak(&p->window_max_us, &cur, late_us)) {
    }
}

static void *probeMain(void *arg)
{
    struct probeThread *t = arg;
    struct stallprobe *p = t->p;
    uint64_t deadline = nowNs() + STALLPROBE_PERIOD_US * 1000u;
    while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
        struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                              .tv_nsec = (long)(deadline % 1000000000u)};
        int rv = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (rv == EINTR) {
            continue;
        }
        uint64_t now = nowNs();
        t->wakeups++;
        uint64_t late_us = now > deadline ? (now - deadline) / 1000u : 0;
        if (late_us >= STALLPROBE_HOLD_US) {
            t->holds++;
            t->held_us += late_us;
            if (late_us > t->held_max_us) {
                t->held_max_us = late_us;
            }
            holdAdd(p, late_us);
        }
        deadline += STALLPROBE_PERIOD_US * 1000u;
        if (deadline <= now) { /* the periods missed while held are not owed */
            deadline = now + STALLPROBE_PERIOD_US * 1000u;
        }
    }
    return NULL;
}

/* Starts t's thread pinned to its CPU, at SCHED_FIFO 1 when allowed, else at the caller's
 * policy. 0 or an errno value. */
static int startThread(struct probeThread *t)
{
    pthread_attr_t attr;
    int rv = pthread_attr_init(&attr);
    if (rv != 0) {
        return rv;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(t->cpu, &one);
    rv = pthread_attr_setaffinity_np(&attr, sizeof(one), &one);
    if (rv == 0) {
        struct sched_param sp = {.sched_priority = 1};
        t->fifo = pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED) == 0 &&
                  pthread_attr_setschedpolicy(&attr, SCHED_FIFO) == 0 &&
                  pthread_attr_setschedparam(&attr, &sp) == 0;
        rv = t->fifo ? pthread_create(&t->th, &attr, probeMain, t) : EPERM;
        if (rv != 0) { /* EPERM: no CAP_SYS_NICE (nor RLIMIT_RTPRIO); the caller's policy */
            t->fifo = false;
            rv = pthread_attr_setinheritsched(&attr, PTHREAD_INHERIT_SCHED);
            if (rv == 0) {
                rv = pthread_create(&t->th, &attr, probeMain, t);
            }
        }
    }
    pthread_attr_destroy(&attr);
    return rv;
}

int stallprobe_start(struct stallprobe **out, char *err, size_t errlen)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        snprintf(err, errlen, "sched_getaffinity: %s", strerror(errno));
        return -1;
    }
    unsigned n = (unsigned)CPU_COUNT(&allowed);
    if (n > STALLPROBE_MAX_CPUS) {
        n = STALLPROBE_MAX_CPUS;
    }
    struct stallprobe *p = calloc(1, sizeof(*p) + n * sizeof(p->threads[0]));
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    atomic_init(&p->stop, false);
    atomic_init(&p->window_max_us, 0);
    atomic_init(&p->window_held_us, 0);
    p->start_ns = nowNs();
    int cpu = 0;
    int last_err = 0;
    for (unsigned k = 0; k < n; cpu++) {
        if (cpu >= CPU_SETSIZE) {
            break;
        }
        if (!CPU_ISSET(cpu, &allowed)) {
            continue;
        }
        struct probeThread *t = &p->threads[p->n_threads];
        t->p = p;
        t->cpu = cpu;
        k++;
        int rv = startThread(t);
        if (rv == 0) {
            p->n_threads++;
        } else {
            last_err = rv;
        }
    }
    if (p->n_threads == 0) {
        snprintf(err, errlen, "could not start a probe thread: %s", strerror(last_err));
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void stallprobe_stop(struct stallprobe *p, struct stallprobe_stats *stats)
{
    atomic_store(&p->stop, true);
    memset(stats, 0, sizeof(*stats));
    stats->fifo = true;
    for (unsigned i = 0; i < p->n_threads; i++) {
        struct probeThread *t = &p->threads[i];
        pthread_join(t->th, NULL);
        stats->wakeups += t->wakeups;
        stats->holds += t->holds;
        stats->held_us += t->held_us;
        if (t->held_max_us > stats->held_max_us) {
            stats->held_max_us = t->held_max_us;
        }
        stats->fifo = stats->fifo && t->fifo;
    }
    stats->cpus = p->n_threads;
    stats->seconds = (double)(nowNs() - p->start_ns) / 1e9;
    p->n_threads = 0; /* joined */
}

void stallprobe_take(struct stallprobe *p, struct stallprobe_window *w)
{
    w->max_us = atomic_exchange(&p->window_max_us, 0);
    w->held_us = atomic_exchange(&p->window_held_us, 0);
}

void stallprobe_print(FILE *f, const struct stallprobe_stats *st)
{
    fprintf(f,
            "held off     %.1f ms per CPU over %.1f s (%u CPUs, %" PRIu64 " of %" PRIu64
            " wake-ups 1 ms or more late, the longest %.3f ms; probe at %s priority)\n",
            (double)st->held_us / 1000.0 / st->cpus, st->seconds, st->cpus, st->holds,
            st->wakeups, (double)st->held_max_us / 1000.0, st->fifo ? "SCHED_FIFO 1" : "normal");
}

void stallprobe_free(struct stallprobe *p)
{
    free(p);
}
