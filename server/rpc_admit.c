/* rpc_admit: the RPC listener's admission of connections (see rpc_admit.h). The count of
 * connections per address (IPv4) or /64 (IPv6) is an open-addressing table (linear probing,
 * deletion by backward shift) with room for twice max_connections addresses: no allocation after
 * rpc_admit_init, and an accept costs a probe or two, not a walk over the connections. */
#include "rpc_admit.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "xmalloc.h"

struct rpc_admit_count {
    struct rpc_admit_addr key; /* zeros: an empty slot */
    uint32_t count;
};

static const struct rpc_admit_addr unknownAddr;

static bool addrEq(struct rpc_admit_addr x, struct rpc_admit_addr y)
{
    return memcmp(x.b, y.b, sizeof x.b) == 0;
}

static bool addrKnown(struct rpc_admit_addr x)
{
    return !addrEq(x, unknownAddr);
}

struct rpc_admit_addr rpc_admit_addr_v4(uint32_t v4)
{
    struct rpc_admit_addr x = unknownAddr;
    if (v4 != 0) {
        x.b[10] = x.b[11] = 0xff;
        for (int i = 0; i < 4; i++) {
            x.b[12 + i] = (uint8_t)(v4 >> (24 - 8 * i));
        }
    }
    return x;
}

/* What an address is counted as: an IPv4 address itself, an IPv6 one its /64 prefix. */
static struct rpc_admit_addr countKey(struct rpc_admit_addr x)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(x.b, mapped, sizeof mapped) != 0) {
        memset(x.b + 8, 0, 8);
        x.b[15] = 1; /* never all zeros (::/64 would be) */
    }
    return x;
}

static size_t slotOf(const struct rpc_admit *a, struct rpc_admit_addr key)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof key.b; i++) {
        h = (h ^ key.b[i]) * 0x100000001B3ull;
    }
    h ^= h >> 29;
    return (size_t)h & (a->counts_cap - 1);
}

/* The slot of key, or of the empty one where it would go. */
static size_t findSlot(const struct rpc_admit *a, struct rpc_admit_addr key)
{
    size_t i = slotOf(a, key);
    while (addrKnown(a->counts[i].key) && !addrEq(a->counts[i].key, key)) {
        i = (i + 1) & (a->counts_cap - 1);
    }
    return i;
}

static void countAdd(struct rpc_admit *a, struct rpc_admit_addr key)
{
    size_t i = findSlot(a, key);
    a->counts[i].key = key;
    a->counts[i].count++;
}

static void countDrop(struct rpc_admit *a, struct rpc_admit_addr key)
{
    size_t mask = a->counts_cap - 1;
    size_t i = findSlot(a, key);
    assert(addrEq(a->counts[i].key, key) && a->counts[i].count > 0);
    if (--a->counts[i].count > 0) {
        return;
    }
    /* Backward shift: the entries after the hole that probed past it move into it. */
    size_t j = i;
    for (;;) {
        a->counts[i].key = unknownAddr;
        a->counts[i].count = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (!addrKnown(a->counts[j].key)) {
                return;
            }
            size_t home = slotOf(a, a->counts[j].key);
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

static uint32_t countOf(const struct rpc_admit *a, struct rpc_admit_addr key)
{
    return a->counts[findSlot(a, key)].count;
}

static bool isMemberAddr(const struct rpc_admit *a, struct rpc_admit_addr addr)
{
    for (size_t i = 0; i < a->n_member_addrs; i++) {
        if (addrEq(a->members[i], addr)) {
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

void rpc_admit_set_members(struct rpc_admit *a, const struct rpc_admit_addr *addrs, size_t n)
{
    a->n_member_addrs = 0;
    for (size_t i = 0; i < n && a->n_member_addrs < RPC_ADMIT_MEMBER_ADDRS; i++) {
        if (addrKnown(addrs[i]) && !isMemberAddr(a, addrs[i])) {
            a->members[a->n_member_addrs++] = addrs[i];
        }
    }
}

enum rpc_admit_verdict rpc_admit_decide(const struct rpc_admit *a, struct rpc_admit_addr addr,
                                        struct rpc_admit_entry **evict)
{
    bool known = addrKnown(addr);
    bool member = known && isMemberAddr(a, addr);
    if (!member && known && a->per_address > 0 && countOf(a, countKey(addr)) >= a->per_address) {
        return RPC_ADMIT_REFUSE_ADDR;
    }
    size_t others = a->n - a->n_members;
    if (a->n < a->max && (member || others < (size_t)(a->max - a->reserve))) {
        return RPC_ADMIT_OK;
    }
    *evict = TAILQ_FIRST(&a->unauthenticated);
    return *evict != NULL ? RPC_ADMIT_EVICT : RPC_ADMIT_REFUSE_FULL;
}

void rpc_admit_add(struct rpc_admit *a, struct rpc_admit_entry *e, struct rpc_admit_addr addr)
{
    assert(!e->in);
    e->addr = addr;
    e->in = true;
    a->n++;
    if (addrKnown(addr) && isMemberAddr(a, addr)) {
        e->cls = RPC_ADMIT_MEMBER;
        e->counted = false;
        a->n_members++;
        return;
    }
    e->cls = RPC_ADMIT_UNAUTHENTICATED;
    TAILQ_INSERT_TAIL(&a->unauthenticated, e, link);
    e->counted = addrKnown(addr);
    if (e->counted) {
        countAdd(a, countKey(addr));
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
        countDrop(a, countKey(e->addr));
    }
}
