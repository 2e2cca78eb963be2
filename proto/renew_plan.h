/* renew_plan.h: when a lease holder renews its lease, and how long it waits for the answer.
 * One rule for every holder that renews: libidem's idem_run (client/run.c) and the proxy
 * while its upstream works (server/proxy_record.c); the Python client's port of it
 * (client/python/idem/_renew.py) is checked against this header by its unit test.
 * Header-only, no clock: times are the caller's milliseconds of one monotonic clock.
 *
 * Given the time now, the lease (ms), the time by which it ends and when the last renewal
 * that succeeded was sent, whether the last try failed and whether none has succeeded yet
 * (`first`: the lease is the claim's): the time of the next renewal (*at: a third of the
 * lease after the last success, at least RENEW_MIN_INTERVAL_MS; an eighth of that after a
 * failure, since the lease may have only that long left; at once when the claim's lease has
 * less than RENEW_MIN_INTERVAL_MS left) and its deadline (*deadline_ms: the lease left then
 * less that eighth, or all of it when less; at most a third of the lease and
 * RENEW_ATTEMPT_MAX_MS, at least RENEW_MIN_DEADLINE_MS: a node that does not answer costs
 * one short attempt, and the next one goes elsewhere in time). */
#ifndef IDEM_PROTO_RENEW_PLAN_H
#define IDEM_PROTO_RENEW_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#define RENEW_MIN_INTERVAL_MS 20
#define RENEW_ATTEMPT_MAX_MS 2000
#define RENEW_MIN_DEADLINE_MS 100

static inline void renew_plan(uint64_t now, uint64_t lease_ms, uint64_t lease_end,
                              uint64_t last_ok, bool failed, bool first, uint64_t *at,
                              uint32_t *deadline_ms)
{
    uint64_t interval = lease_ms / 3 < RENEW_MIN_INTERVAL_MS ? RENEW_MIN_INTERVAL_MS : lease_ms / 3;
    uint64_t retry = interval / 8 < RENEW_MIN_INTERVAL_MS ? RENEW_MIN_INTERVAL_MS : interval / 8;
    uint64_t when = failed ? now + retry : last_ok + interval;
    if (first && !failed && (lease_end <= now || lease_end - now < RENEW_MIN_INTERVAL_MS)) {
        /* The claim left less than the floor (a holder's own retry of its claim answers
         * with the lease it has left): renew at once, not after the lease ended. Only for
         * the claim's lease: a granted lease that short would have us renew back to back. */
        when = now;
    }
    *at = when < now ? now : when;
    uint64_t left = lease_end > *at ? lease_end - *at : 0;
    uint64_t dl = left > retry ? left - retry : left;
    dl = dl < interval ? dl : interval;
    dl = dl < RENEW_ATTEMPT_MAX_MS ? dl : RENEW_ATTEMPT_MAX_MS;
    dl = dl > RENEW_MIN_DEADLINE_MS ? dl : RENEW_MIN_DEADLINE_MS;
    *deadline_ms = (uint32_t)dl;
}

#endif
