/* fsm_internal: what fsm.c shares with fsm_snapshot.c; nothing else includes it. */
#ifndef IDEM_SERVER_FSM_INTERNAL_H
#define IDEM_SERVER_FSM_INTERNAL_H

#include "arena.h"
#include "fsm.h"
#include "table.h"

#define FSM_STATES 6 /* Idem__RecordState values, UNSPECIFIED included */

/* A frozen view (fsm.h, fsm_freeze). The first part is the view, constant from the freeze
 * to the thaw and read by fsm_frozen_write on any thread; the rest belongs to the owner. */
struct fsm_frozen {
    uintptr_t *slots;        /* copy of the table's slot array at the freeze */
    size_t slots_cap;        /* slots allocated (at least mask + 1: a reused copy, fsm_freeze) */
    size_t mask;
    uint64_t count;
    char **names;            /* tenant names (the table's strings), by tenant index */
    size_t n_tenants;
    uint64_t clock;
    uint64_t last_index;
    uint64_t bytes;
    /* Owner only. */
    bool detached;           /* a restore replaced the table: no live record is the view's */
    struct rec **retired;    /* records of the view no longer in the table */
    size_t n_retired, cap_retired;
    struct table *graves;    /* tables a restore replaced during the freeze */
    size_t n_graves;
};

struct fsm {
    struct fsm_options opt;  /* as fsm_new_with was given them; hash_secret points to secret */
    uint8_t secret[TABLE_SECRET_LEN];
    struct table t;
    struct fsm_frozen *frozen; /* the view in flight, or NULL */
    uintptr_t *spare_slots;  /* the last view's slot copy, kept for the next freeze, or one
                              * made ahead of it (fsm_spare_step); xbig_zalloc'ed */
    size_t spare_n;          /* slots it has room for */
    size_t spare_faulted;    /* bytes of it faulted in, or being faulted in by spare_pf */
    struct xbig_prefault spare_pf; /* waited for before the spare is used, moved or freed */
    struct arena arena;      /* protobuf-c decoding scratch, reset per command */
    uint64_t clock;          /* max leader timestamp applied (docs/contract.md) */
    uint64_t last_index;     /* command index of the last valid command */
    uint64_t n_state[FSM_STATES];
    uint64_t bytes;          /* sum of tenants' bytes */
};

/* Called after each insert: keeps a spare slot copy (for the next fsm_freeze) as large as
 * the table's slot array, or as its next growth's when that is allocated ahead
 * (table_next_bytes), and has what it adds faulted in by the prefaulter (xbig_prefault), so
 * that the freeze copies into memory already mapped. Mapped arrays only
 * (XBIG_MAP_MIN_BYTES); none while frozen. */
void fsm_spare_step(struct fsm *f);

/* Length of the packed StoredResponse a record holds (0 when none). */
size_t fsm_rec_response_len(const struct rec *r);

/* Adds r to its tenant's usage and the state counters (fsm.c). */
void fsm_rec_count(struct fsm *f, const struct rec *r);

/* Hands a record of the view that left the table to the view, which frees it at the
 * thaw (fsm_snapshot.c). */
void fsm_frozen_retire(struct fsm_frozen *z, struct rec *r);

/* Whether a record of the live table is held by the frozen view (false when none is). */
bool fsm_rec_frozen(const struct fsm *f, const struct rec *r);

/* Whether a stored response is acceptable; *why (OUT) says why not. */
bool fsm_response_valid(const Idem__StoredResponse *resp, const char **why);

#endif
