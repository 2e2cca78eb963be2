#include "notify.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "log.h"
#include "service.h"
#include "xmalloc.h"

/* How often the leader is looked at for READY and STATUS. */
#define NOTIFY_POLL_MS 100

struct notifier {
    uv_timer_t poll;
    uv_timer_t watchdog;
    int open; /* handles not yet closed */
    struct service *svc;
    uint64_t self;
    bool ready;    /* READY=1 sent */
    bool stopping; /* STOPPING=1 sent */
    char status[96];
};

/* Sends one notification; a failure is logged once (a socket gone would fail every ping). */
static void notifySend(const char *what)
{
    static bool warned;
    int rc = sd_notify(0, what);
    if (rc < 0 && !warned) {
        warned = true;
        log_warn("systemd notification failed: %s (not logged again)", strerror(-rc));
    }
}

static void pollCb(uv_timer_t *t)
{
    struct notifier *n = t->data;
    if (n->stopping) {
        return;
    }
    struct service_info si;
    service_get_info(n->svc, &si);
    char status[sizeof n->status];
    if (si.cluster.leader_id == 0) {
        snprintf(status, sizeof status, "waiting for a leader (term %" PRIu64 ")", si.cluster.term);
    } else {
        snprintf(status, sizeof status, "leader %" PRIu64 "%s, term %" PRIu64, si.cluster.leader_id,
                 si.cluster.leader_id == n->self ? " (this node)" : "", si.cluster.term);
    }
    bool ready = !n->ready && si.cluster.leader_id != 0;
    if (!ready && strcmp(status, n->status) == 0) {
        return;
    }
    memcpy(n->status, status, sizeof status);
    char msg[sizeof status + 32];
    snprintf(msg, sizeof msg, "%sSTATUS=%s", ready ? "READY=1\n" : "", status);
    n->ready = n->ready || ready;
    notifySend(msg);
}

static void watchdogCb(uv_timer_t *t)
{
    (void)t;
    notifySend("WATCHDOG=1");
}

struct notifier *notifier_start(uv_loop_t *loop, struct service *svc, uint64_t self)
{
    const char *sock = getenv("NOTIFY_SOCKET");
    if (sock == NULL || sock[0] == '\0') {
        return NULL;
    }
    struct notifier *n = xcalloc(1, sizeof(*n));
    n->svc = svc;
    n->self = self;
    uv_timer_init(loop, &n->poll);
    uv_timer_init(loop, &n->watchdog);
    n->poll.data = n;
    n->watchdog.data = n;
    n->open = 2;
    /* Neither keeps the loop running: the node's other handles do while it serves. */
    uv_unref((uv_handle_t *)&n->poll);
    uv_unref((uv_handle_t *)&n->watchdog);
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t every = usec / 2000; /* half the interval, in ms */
        uv_timer_start(&n->watchdog, watchdogCb, 0, every > 0 ? every : 1);
        log_info("systemd watchdog: a ping every %" PRIu64 " ms", every > 0 ? every : 1);
    }
    snprintf(n->status, sizeof n->status, "starting");
    notifySend("STATUS=starting");
    uv_timer_start(&n->poll, pollCb, 0, NOTIFY_POLL_MS);
    return n;
}

void notifier_stopping(struct notifier *n)
{
    if (n == NULL || n->stopping) {
        return;
    }
    n->stopping = true;
    uv_timer_stop(&n->poll);
    notifySend("STOPPING=1\nSTATUS=shutting down");
}

static void closedCb(uv_handle_t *h)
{
    struct notifier *n = h->data;
    if (--n->open == 0) {
        free(n);
    }
}

void notifier_close(struct notifier *n)
{
    if (n == NULL) {
        return;
    }
    uv_close((uv_handle_t *)&n->poll, closedCb);
    uv_close((uv_handle_t *)&n->watchdog, closedCb);
}
