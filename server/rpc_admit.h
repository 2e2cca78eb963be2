/* rpc_admit: which connections the RPC listener (server/rpc.c) admits, and which one it
 * closes to make room: the bookkeeping of rpc.max_connections, rpc.member_connections and
 * rpc.max_connections_per_address, without sockets (rpc.c closes what it is told to).
 *
 * Every connection open (not closing) has an entry, in one of three classes:
 * - a member's: from a member's address (rpc_admit_set_members: the addresses of the
 *   cluster's members), or authenticated with the cluster secret (rpc_admit_member());
 * - an authenticated client's: it sent a known token (a tenant's or the admin's);
 * - an unauthenticated one: connected from elsewhere and no known token yet.
 * Admission (rpc_admit_decide):
 * - from an address other than a member's, at most max_connections_per_address at once
 *   (0: no cap); an IPv6 address is counted by its /64 prefix (one host commonly has a whole
 *   /64 to pick addresses from), an IPv4 one by itself;
 * - connections other than members' take at most max_connections - reserve slots, where
 *   reserve is member_connections but at most half of max_connections; members' take any
 *   slot;
 * - when the slots a new connection may take are full, the oldest unauthenticated
 *   connection (not a member's) is closed to admit it; when there is none, the new one is
 *   refused.
 * So idle or hostile sockets cannot lock out clients or members: an unauthenticated one
 * holds its slot only until newer ones need it (and rpc.first_frame_timeout_ms, rpc.c), and
 * authenticated clients cannot take the members' slots. */
#ifndef IDEM_SERVER_RPC_ADMIT_H
#define IDEM_SERVER_RPC_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

/* Members' addresses kept at most (each member has three: Raft, RPC, HTTP, and a name may
 * resolve to several). */
#define RPC_ADMIT_MEMBER_ADDRS 256

/* A peer's address: an IPv6 address, an IPv4 one as its IPv4-mapped IPv6 form (::ffff:a.b.c.d,
 * as a dual-stack listener sees it; client/resolver.h IdemSockaddrKey); all zeros: unknown. */
struct rpc_admit_addr {
    uint8_t b[16];
};

/* The IPv4 address `v4` (host order) as an rpc_admit_addr; 0 gives the unknown one. */
struct rpc_admit_addr rpc_admit_addr_v4(uint32_t v4);

enum rpc_admit_class {
    RPC_ADMIT_UNAUTHENTICATED,
    RPC_ADMIT_CLIENT,
    RPC_ADMIT_MEMBER,
};

/* One connection's entry, in its struct (rpc.c's struct conn). */
struct rpc_admit_entry {
    TAILQ_ENTRY(rpc_admit_entry) link; /* unauthenticated ones, oldest first */
    struct rpc_admit_addr addr;        /* the peer's; zeros: unknown */
    enum rpc_admit_class cls;
    bool counted; /* in the address's count (an address other than a member's) */
    bool in;      /* admitted and not removed */
};

struct rpc_admit {
    uint32_t max;                                  /* rpc.max_connections */
    uint32_t reserve;                              /* slots only members take */
    uint32_t per_address;                          /* 0: no cap */
    size_t n;                                      /* entries in */
    size_t n_members;                              /* of which members' */
    TAILQ_HEAD(, rpc_admit_entry) unauthenticated; /* oldest first */
    struct rpc_admit_count *counts; /* per address (other than members'): open addressing */
    size_t counts_cap;              /* a power of two, more than twice the entries' */
    struct rpc_admit_addr members[RPC_ADMIT_MEMBER_ADDRS];
    size_t n_member_addrs;
};

/* Sets up a for max connections, reserve for members, per_address (see above). */
void rpc_admit_init(struct rpc_admit *a, uint32_t max, uint32_t member_connections,
                    uint32_t per_address);
void rpc_admit_free(struct rpc_admit *a);

/* The members' addresses (n of them, the first RPC_ADMIT_MEMBER_ADDRS kept; unknown ones
 * skipped). Connections already in keep their class. */
void rpc_admit_set_members(struct rpc_admit *a, const struct rpc_admit_addr *addrs, size_t n);

enum rpc_admit_verdict {
    RPC_ADMIT_OK,          /* add it */
    RPC_ADMIT_EVICT,       /* close *evict (rpc_admit_remove), then add it */
    RPC_ADMIT_REFUSE_ADDR, /* its address holds max_connections_per_address */
    RPC_ADMIT_REFUSE_FULL, /* every slot it may take is held, none by an unauthenticated one */
};

/* Whether a connection from addr (zeros: unknown) may come in; with RPC_ADMIT_EVICT, *evict
 * is the entry to close first. */
enum rpc_admit_verdict rpc_admit_decide(const struct rpc_admit *a, struct rpc_admit_addr addr,
                                        struct rpc_admit_entry **evict);

/* Adds e for a connection from addr that rpc_admit_decide() let in. */
void rpc_admit_add(struct rpc_admit *a, struct rpc_admit_entry *e, struct rpc_admit_addr addr);

/* e sent a known token: a client's (member false) or the cluster secret (member true). A
 * member's entry stays a member's. */
void rpc_admit_authenticated(struct rpc_admit *a, struct rpc_admit_entry *e, bool member);

/* Takes e out (its connection closes); nothing when it is not in. */
void rpc_admit_remove(struct rpc_admit *a, struct rpc_admit_entry *e);

#endif
