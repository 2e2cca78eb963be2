/* rpc_admit: the RPC listener's admission of connections (see rpc_admit.h). The count of
 * connections per address is an open-addressing table (linear probing, deletion by
 * backward shift) with room for twice max_connections addresses: no allocation after
 * rpc_admit_init, and an accept costs a probe or two, not a walk over the connections. */
#include "rpc_admit.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "xmalloc.h"

struct rpc_admit_count {
    uint32_t addr; /* 0: an empty slot */
    uint32_t count;
};

static size_t slotOf(const struct rpc_admit *a, uint32_t addr)
{
    uint32_t h = addr * 0x9E3779B1u;
    h ^= h >> 15;
    return (size_t)h & (a->counts_cap - 1);
}

/* The slot of addr, or of the empty one where it would go. */
static size_t findSlot(const struct rpc_admit *a, uint32_t addr)
{
    size_t i = slotOf(a, addr);
    while (a->counts[i].addr != 0 && a->counts[i].addr != addr) {
        i = (i + 1) & (a->counts_cap - 1);
    }
    return i;
}

static void countAdd(struct rpc_admit *a, uint32_t addr)
{
    size_t i = findSlot(a, addr);
    a->counts[i].addr = addr;
    a->counts[i].count++;
}

static void countDrop(struct rpc_admit *a, uint32_t addr)
{
    size_t mask = a->counts_cap - 1;
    size_t i = findSlot(a, addr);
    assert(a->counts[i].addr == addr && a->counts[i].count > 0);
    if (--a->counts[i].count > 0) {
        return;
    }
    /* Backward shift: the entries after the hole that probed past it move into it. */
    size_t j = i;
    for (;;) {
        a->counts[i].addr = 0;
        a->counts[i].count = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (a->counts[j].addr == 0) {
                return;
            }
            size_t home = slotOf(a, a->counts[j].addr);
            /* j's entry stays when its home lies cyclically in (i, j]. */
            bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays) {
                break;
            }
        }
        a->counts[i] = a->counts[j];
        i = j;
    }
}

static uint32_t countOf(const struct rpc_admit *a, uint32_t addr)
{
    return a->counts[findSlot(a, addr)].count;
}

static bool isMemberAddr(const struct rpc_admit *a, uint32_t addr)
{
    for (size_t i = 0; i < a->n_member_addrs; i++) {
        if (a->members[i] == addr) {
            return true;
        }
    }
    return false;
}

void rpc_admit_init(struct rpc_admit *a, uint32_t max, uint32_t member_connections,
                    uint32_t per_address)
{
    memset(a, 0, sizeof(*a));
    a->max = max;
    a->reserve = member_connections < max / 2 ? member_connections : max / 2;
    a->per_address = per_address;
    TAILQ_INIT(&a->unauthenticated);
    a->counts_cap = 16;
    while (a->counts_cap < 2 * (size_t)max + 2) {
        a->counts_cap *= 2;
    }
    a->counts = xcalloc(a->counts_cap, sizeof(*a->counts));
}

void rpc_admit_free(struct rpc_admit *a)
{
    free(a->counts);
    a->counts = NULL;
}

void rpc_admit_set_members(struct rpc_admit *a, const uint32_t *addrs, size_t n)
{
    a->n_member_addrs = 0;
    for (size_t i = 0; i < n && a->n_member_addrs < RPC_ADMIT_MEMBER_ADDRS; i++) {
        if (addrs[i] != 0 && !isMemberAddr(a, addrs[i])) {
            a->members[a->n_member_addrs++] = addrs[i];
        }
    }
}

enum rpc_admit_verdict rpc_admit_decide(const struct rpc_admit *a, uint32_t addr,
                                        struct rpc_admit_entry **evict)
{
    bool member = addr != 0 && isMemberAddr(a, addr);
    if (!member && addr != 0 && a->per_address > 0 && countOf(a, addr) >= a->per_address) {
        return RPC_ADMIT_REFUSE_ADDR;
    }
    size_t others = a->n - a->n_members;
    if (a->n < a->max && (member || others < (size_t)(a->max - a->reserve))) {
        return RPC_ADMIT_OK;
    }
    *evict = TAILQ_FIRST(&a->unauthenticated);
    return *evict != NULL ? RPC_ADMIT_EVICT : RPC_ADMIT_REFUSE_FULL;
}

void rpc_admit_add(struct rpc_admit *a, struct rpc_admit_entry *e, uint32_t addr)
{
    assert(!e->in);
    e->addr = addr;
    e->in = true;
    a->n++;
    if (addr != 0 && isMemberAddr(a, addr)) {
        e->cls = RPC_ADMIT_MEMBER;
        e->counted = false;
        a->n_members++;
        return;
    }
    e->cls = RPC_ADMIT_UNAUTHENTICATED;
    TAILQ_INSERT_TAIL(&a->unauthenticated, e, link);
    e->counted = addr != 0;
    if (e->counted) {
        countAdd(a, addr);
    }
}

void rpc_admit_authenticated(struct rpc_admit *a, struct rpc_admit_entry *e, bool member)
{
    if (!e->in || e->cls == RPC_ADMIT_MEMBER || (e->cls == RPC_ADMIT_CLIENT && !member)) {
        return;
    }
    if (e->cls == RPC_ADMIT_UNAUTHENTICATED) {
        TAILQ_REMOVE(&a->unauthenticated, e, link);
    }
    e->cls = member ? RPC_ADMIT_MEMBER : RPC_ADMIT_CLIENT;
    if (member) {
        a->n_members++;
    }
}

void rpc_admit_remove(struct rpc_admit *a, struct rpc_admit_entry *e)
{
    if (!e->in) {
        return;
    }
    e->in = false;
    a->n--;
    if (e->cls == RPC_ADMIT_MEMBER) {
        a->n_members--;
    } else if (e->cls == RPC_ADMIT_UNAUTHENTICATED) {
        TAILQ_REMOVE(&a->unauthenticated, e, link);
    }
    if (e->counted) {
        countDrop(a, e->addr);
    }
}
