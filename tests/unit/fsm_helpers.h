/* fsm_helpers: builds, packs and applies state-machine commands for the unit tests, so that
 * every test goes through fsm_apply()'s byte decoding exactly as the cluster will. */
#ifndef IDEM_TESTS_FSM_HELPERS_H
#define IDEM_TESTS_FSM_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "fsm.h"

/* A state machine plus the next command index to apply at. */
struct th {
    struct fsm *f;
    uint64_t index;
    struct fsm_result r; /* the last result */
};

void th_init(struct th *h);
void th_close(struct th *h);

/* Options of a claim; zero values mean: lease 1000 ms, ttl 10000 ms, conflict, no attempt,
 * no tombstone ttl override, no limits. */
struct th_claim {
    const char *tenant;   /* default "t1" */
    const char *attempt;  /* NULL: none */
    uint64_t lease_ms;
    uint64_t ttl_ms;
    uint64_t tombstone_ttl_ms;
    Idem__LeasePolicy policy;
    uint64_t max_records;
    uint64_t max_bytes;
};

/* A 32-byte fingerprint whose bytes are all `b`. */
void th_fp(uint8_t out[32], uint8_t b);

/* Each packs one command with the leader time `now`, applies it at the next index and
 * returns the outcome; the full result is in h->r. `opt` may be NULL. */
Idem__Outcome th_claim(struct th *h, uint64_t now, const char *key, uint8_t fp,
                       const struct th_claim *opt);
Idem__Outcome th_complete(struct th *h, uint64_t now, const char *tenant, const char *key,
                          uint64_t token, Idem__Completion outcome, uint32_t status,
                          const char *body, uint64_t max_bytes);
Idem__Outcome th_release(struct th *h, uint64_t now, const char *tenant, const char *key,
                         uint64_t token);
Idem__Outcome th_renew(struct th *h, uint64_t now, const char *tenant, const char *key,
                       uint64_t token, uint64_t lease_ms);
Idem__Outcome th_get(struct th *h, uint64_t now, const char *tenant, const char *key);
Idem__Outcome th_resolve(struct th *h, uint64_t now, const char *tenant, const char *key,
                         int release, uint32_t status, const char *body);
/* th_resolve as today's leaders propose it (ResolveCmd.unsettled_only set). */
Idem__Outcome th_resolve_unsettled(struct th *h, uint64_t now, const char *tenant, const char *key,
                                   int release, uint32_t status, const char *body);
Idem__Outcome th_expire(struct th *h, uint64_t now, uint32_t max_batch);
/* th_expire with ExpireCmd.keep_live_leases (set by today's leaders). */
Idem__Outcome th_expire_as(struct th *h, uint64_t now, uint32_t max_batch, bool keep_live_leases);

/* Packs cmd and applies it (the lower layer of the functions above). */
Idem__Outcome th_apply(struct th *h, const Idem__Command *cmd);

/* The body of a packed StoredResponse as a NUL-terminated string in a static buffer. */
const char *th_body(const uint8_t *resp, size_t len);

#endif
