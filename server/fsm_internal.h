/* fsm_internal: what fsm.c shares with fsm_snapshot.c; nothing else includes it. */
#ifndef IDEM_SERVER_FSM_INTERNAL_H
#define IDEM_SERVER_FSM_INTERNAL_H

#include "arena.h"
#include "fsm.h"
#include "table.h"

#define FSM_STATES 6 /* Idem__RecordState values, UNSPECIFIED included */

struct fsm {
    struct table t;
    struct arena arena;      /* protobuf-c decoding scratch, reset per command */
    uint64_t clock;          /* max leader timestamp applied (CONTRACT.md §2) */
    uint64_t last_index;     /* command index of the last valid command */
    uint64_t n_state[FSM_STATES];
    uint64_t bytes;          /* sum of tenants' bytes */
};

/* Length of the packed StoredResponse a record holds (0 when none). */
size_t fsm_rec_response_len(const struct rec *r);

/* Adds r to its tenant's usage and the state counters (fsm.c). */
void fsm_rec_count(struct fsm *f, const struct rec *r);

/* Whether a stored response is acceptable; *why (OUT) says why not. */
bool fsm_response_valid(const Idem__StoredResponse *resp, const char **why);

#endif
