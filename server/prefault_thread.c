/* gettid is not in POSIX.1-2008: glibc shows it with _GNU_SOURCE. */
#define _GNU_SOURCE

#include "prefault_thread.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

struct job {
    pthread_t thread;
    void *p;
    size_t from, bytes;
    atomic_size_t done;
};

static void *jobMain(void *arg)
{
    struct job *j = arg;
    /* A new thread starts with its creator's nice value; raising one's own needs no
     * privilege, and Linux keeps it per thread (setpriority(2), NOTES). */
    id_t self = (id_t)gettid();
    int want = getpriority(PRIO_PROCESS, self) + 19;
    (void)setpriority(PRIO_PROCESS, self, want < 19 ? want : 19);
    xbig_fault_in(j->p, j->from, j->bytes, &j->done);
    return NULL;
}

static void *jobStart(void *p, size_t from, size_t bytes)
{
    struct job *j = xcalloc(1, sizeof(*j));
    j->p = p;
    j->from = from;
    j->bytes = bytes;
    atomic_init(&j->done, 0);
    /* Started with every signal blocked: they are the loop thread's to take. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rv = pthread_create(&j->thread, NULL, jobMain, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rv != 0) {
        xbig_fault_in(p, from, bytes, NULL);
        free(j);
        return NULL;
    }
    return j;
}

static void jobWait(void *job)
{
    struct job *j = job;
    pthread_join(j->thread, NULL);
    free(j);
}

static size_t jobDone(const void *job)
{
    const struct job *j = job;
    return atomic_load_explicit(&j->done, memory_order_relaxed);
}

const struct xbig_prefaulter prefault_thread = {
    .start = jobStart,
    .wait = jobWait,
    .done = jobDone,
};
