/* transport: raft's TCP transport with TCP_NODELAY on every connection.
 *
 * raft_uv_tcp leaves Nagle's algorithm on. Raft's small AppendEntries replies then wait for
 * the peer's delayed ACK (40 ms on Linux), which measured as a 40 ms p99 on every claim
 * here. This wraps raft_uv_tcp and turns Nagle off on each accepted and connected stream. */
#ifndef IDEM_CLUSTER_TRANSPORT_H
#define IDEM_CLUSTER_TRANSPORT_H

#include <raft/uv.h>
#include <uv.h>

struct transport {
    struct raft_uv_transport outer; /* first member; hand &outer to raft_uv_init */
    struct raft_uv_transport inner; /* raft_uv_tcp */
    raft_uv_accept_cb accept_cb;
    raft_uv_transport_close_cb close_cb;
    char address[64]; /* this node's Raft address, for listen's error message */
};

/* Initialises both layers on `loop`. 0 or a RAFT_* code. */
int transport_init(struct transport *t, uv_loop_t *loop);
/* Releases raft_uv_tcp's memory (after raft_uv closed the transport). */
void transport_close(struct transport *t);

#endif
