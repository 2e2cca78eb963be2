/* niced: CPU work on a thread of its own at a lower priority (niced.h). */
#define _GNU_SOURCE /* gettid */
#include "niced.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

struct run {
    unsigned nice;
    int ran_at;
    int (*fn)(void *arg);
    void *arg;
    int rv;
};

static void *runMain(void *arg)
{
    struct run *r = arg;
    /* A new thread starts with its creator's nice value. Raising one's own needs no
     * privilege: setpriority fails only on a bad thread id or value, neither possible. */
    id_t self = (id_t)gettid();
    int now = getpriority(PRIO_PROCESS, self);
    int want = now + (int)(r->nice < 19 ? r->nice : 19);
    (void)setpriority(PRIO_PROCESS, self, want < 19 ? want : 19);
    r->ran_at = getpriority(PRIO_PROCESS, self);
    r->rv = r->fn(r->arg);
    return NULL;
}

int niced_run(unsigned nice, int *ran_at, int (*fn)(void *arg), void *arg)
{
    struct run r = {.nice = nice, .fn = fn, .arg = arg, .rv = -1};
    pthread_t th;
    if (nice == 0 || pthread_create(&th, NULL, runMain, &r) != 0) {
        if (ran_at != NULL) {
            *ran_at = getpriority(PRIO_PROCESS, (id_t)gettid());
        }
        return fn(arg);
    }
    pthread_join(th, NULL);
    if (ran_at != NULL) {
        *ran_at = r.ran_at;
    }
    return r.rv;
}
