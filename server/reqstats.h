/* reqstats: the data-plane request figures of one front end, for /metrics: the HTTP
 * gateway's (http_api.c, proxy.c) and the binary RPC listener's (rpc.c), printed as one set
 * of series with a transport label (metrics.c). Each front end updates its own on the node's
 * loop thread, as it answers, and /metrics reads them there: no locks.
 *
 * What a front end counts: each answer to a client's data op (claim, complete, release, renew,
 * get) by its outcome, its unavailable answers (fail closed), and how long each claim took
 * from being taken to being answered. Admin ops are not counted. A request that another
 * node's gateway forwarded to this node's RPC listener is counted where the client sent it
 * (that gateway, transport "http"), not here again: rpc.c counts those apart
 * (rpc_stats.forwarded). Nothing of a request but its outcome is kept: no key, no token. */
#ifndef IDEM_SERVER_REQSTATS_H
#define IDEM_SERVER_REQSTATS_H

#include <stddef.h>
#include <stdint.h>

#define REQSTATS_OUTCOMES 17 /* Idem__Outcome 0 (unspecified) .. 16 (forbidden) */
#define REQSTATS_BUCKETS 13

struct reqstats {
    uint64_t outcomes[REQSTATS_OUTCOMES];     /* answers to data ops by outcome */
    uint64_t fail_closed;                     /* unavailable answers (HTTP: every 503) */
    uint64_t claim_buckets[REQSTATS_BUCKETS]; /* non-cumulative, by reqstats_bound() */
    uint64_t claim_count;                     /* claims answered (those past the last bound too) */
    double claim_sum;                         /* their durations together, in seconds */
};

/* The upper bound in seconds of claim bucket i (< REQSTATS_BUCKETS). */
static inline double reqstats_bound(size_t i)
{
    static const double bounds[REQSTATS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
    return bounds[i];
}

/* Counts an answer with outcome oc (an Idem__Outcome; out of range: not counted). */
static inline void reqstats_outcome(struct reqstats *r, unsigned oc)
{
    if (oc < REQSTATS_OUTCOMES) {
        r->outcomes[oc]++;
    }
}

/* Counts a claim answered secs seconds after it was taken. */
static inline void reqstats_claim(struct reqstats *r, double secs)
{
    r->claim_count++;
    r->claim_sum += secs;
    for (size_t i = 0; i < REQSTATS_BUCKETS; i++) {
        if (secs <= reqstats_bound(i)) {
            r->claim_buckets[i]++;
            break;
        }
    }
}

#endif
