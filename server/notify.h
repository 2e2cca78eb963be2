/* notify: systemd's service notifications (sd_notify(3)) for a unit of Type=notify. Without
 * NOTIFY_SOCKET in the environment nothing is sent and no handle is made.
 *
 * READY=1 once a leader is known (this node or another: the node then serves), with
 * STATUS= lines as the leader changes ("leader 2, term 5", "leader 1 (this node), term 5",
 * "waiting for a leader"); WATCHDOG=1 every half of WATCHDOG_USEC when systemd asks for it
 * (WatchdogSec=), from a timer on the node's loop, so that a loop that stops turning stops
 * the pings and systemd restarts the node; STOPPING=1 when the node begins to shut down. */
#ifndef IDEM_SERVER_NOTIFY_H
#define IDEM_SERVER_NOTIFY_H

#include <stdint.h>
#include <uv.h>

struct service;
struct notifier;

/* Starts the notifications on `loop` about `svc` (borrowed until notifier_close), whose node
 * id is `self`. Returns NULL, having done nothing, when NOTIFY_SOCKET is not set. */
struct notifier *notifier_start(uv_loop_t *loop, struct service *svc, uint64_t self);

/* Sends STOPPING=1: no READY or STATUS follows, the watchdog pings go on until
 * notifier_close. Accepts NULL. */
void notifier_stopping(struct notifier *n);

/* Closes its handles; freed once they are closed (the loop must run). Accepts NULL. */
void notifier_close(struct notifier *n);

#endif
