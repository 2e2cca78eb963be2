/* aio_reap: corrects raft_uv 0.15's io_destroy(2) of a segment's AIO context on the loop (a
 * 32 ms pause of the node at every segment close): its UvOsIoDestroy calls come here through
 * the linker's --wrap, and a thread of our own destroys the contexts (aio_reap.h explains). */
#define _GNU_SOURCE /* syscall, gettid */
#include "aio_reap.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Contexts waiting for the thread. raft_uv has one segment writer open at a time per node
 * and closes one every few seconds at most, so a handful would do; beyond this many the
 * caller destroys its own. */
#define QUEUE_CAP 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;    /* the thread: work, or stop */
static pthread_cond_t stopped = PTHREAD_COND_INITIALIZER; /* a second aio_reap_stop */
static aio_context_t queue[QUEUE_CAP];
static unsigned head, count;
static bool running;     /* the thread exists (and is not joined yet) */
static bool stopping;    /* aio_reap_stop waits for it to empty the queue and exit */
static bool inline_only; /* aio_reap_set_inline */
static pthread_t thread;
static struct aio_reap_stats stats;

static int destroyNow(aio_context_t ctx)
{
    return syscall(SYS_io_destroy, ctx) == 0 ? 0 : -errno;
}

static void *reaper(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "idem-aio-reap", 0, 0, 0);
    pthread_mutex_lock(&mu);
    for (;;) {
        while (count == 0 && !stopping) {
            pthread_cond_wait(&wake, &mu);
        }
        if (count == 0) {
            break; /* stopping, and nothing left */
        }
        aio_context_t ctx = queue[head];
        head = (head + 1) % QUEUE_CAP;
        count--;
        pthread_mutex_unlock(&mu);
        int rv = destroyNow(ctx);
        pthread_mutex_lock(&mu);
        stats.destroyed++;
        stats.last_tid = gettid();
        if (rv != 0) {
            stats.failed++;
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Starts the thread with every signal blocked (they are the loop thread's to take).
 * Called with mu held. */
static bool startLocked(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rv = pthread_create(&thread, NULL, reaper, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    running = rv == 0;
    return running;
}

int __wrap_UvOsIoDestroy(aio_context_t ctx)
{
    pthread_mutex_lock(&mu);
    bool queued = !inline_only && !stopping && count < QUEUE_CAP && (running || startLocked());
    if (queued) {
        queue[(head + count) % QUEUE_CAP] = ctx;
        count++;
        stats.queued++;
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&mu);
        return 0;
    }
    pthread_mutex_unlock(&mu);
    int rv = destroyNow(ctx);
    pthread_mutex_lock(&mu);
    stats.inline_runs++;
    stats.last_tid = gettid();
    pthread_mutex_unlock(&mu);
    return rv;
}

void aio_reap_set_inline(bool on)
{
    pthread_mutex_lock(&mu);
    inline_only = on;
    pthread_mutex_unlock(&mu);
}

void aio_reap_stop(void)
{
    pthread_mutex_lock(&mu);
    if (stopping) {
        /* Another caller joins the thread: wait for it to have. */
        while (stopping) {
            pthread_cond_wait(&stopped, &mu);
        }
    }
    if (!running) {
        pthread_mutex_unlock(&mu);
        return;
    }
    stopping = true;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    pthread_mutex_lock(&mu);
    running = false;
    stopping = false;
    pthread_cond_broadcast(&stopped);
    pthread_mutex_unlock(&mu);
}

bool aio_reap_inline(void)
{
    pthread_mutex_lock(&mu);
    bool on = inline_only;
    pthread_mutex_unlock(&mu);
    return on;
}

void aio_reap_get_stats(struct aio_reap_stats *s)
{
    pthread_mutex_lock(&mu);
    *s = stats;
    pthread_mutex_unlock(&mu);
}
