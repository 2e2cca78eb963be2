/* transport: raft's TCP transport: raft_uv_tcp for outgoing connections, a listener of
 * our own for incoming ones, and TCP_NODELAY on both.
 *
 * raft_uv_tcp leaves Nagle's algorithm on. Raft's small AppendEntries replies then wait for
 * the peer's delayed ACK (40 ms on Linux), which measured as a 40 ms p99 on every claim
 * here. This turns Nagle off on each accepted and connected stream.
 *
 * raft_uv_tcp's listener reads each connection's handshake (protocol, sender ID, address
 * length, address) and allocates the address length the peer declares (2^40 bytes taken
 * as given), with no time limit and no cap on connections that have not finished one:
 * anyone who reached the Raft port could hold memory and file descriptors. Ours reads the
 * same handshake with the address at most TRANSPORT_ADDRESS_MAX bytes and NUL-terminated,
 * within TRANSPORT_HANDSHAKE_TIMEOUT_MS, at most TRANSPORT_HANDSHAKES_MAX at once; a
 * connection that breaks a rule is closed (and said so on stderr, 100 times at most).
 * Then it hands the stream to raft_uv, as raft_uv_tcp does, having read nothing past the
 * handshake. Messages themselves are checked by wire_check.h. */
#ifndef IDEM_CLUSTER_TRANSPORT_H
#define IDEM_CLUSTER_TRANSPORT_H

#include <raft/uv.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define TRANSPORT_HANDSHAKE_PROTOCOL 1      /* raft_uv_tcp's */
#define TRANSPORT_ADDRESS_MAX 256           /* a peer's address in the handshake, padded */
#define TRANSPORT_HANDSHAKE_TIMEOUT_MS 10000
#define TRANSPORT_HANDSHAKES_MAX 64

struct incoming;

struct transport {
    struct raft_uv_transport outer; /* first member; hand &outer to raft_uv_init */
    struct raft_uv_transport inner; /* raft_uv_tcp: outgoing connections */
    uv_loop_t *loop;
    raft_uv_accept_cb accept_cb;
    raft_uv_transport_close_cb close_cb;
    char address[64]; /* this node's Raft address */
    uv_tcp_t listener;
    bool listener_open;
    struct incoming *incoming; /* handshakes being read */
    size_t n_incoming;
    size_t n_closing_incoming; /* ended, their handles closing */
    uint64_t refused;          /* connections closed for breaking the handshake's rules */
    bool closing;
    bool inner_closed;
};

/* Initialises both layers on `loop`. 0 or a RAFT_* code. */
int transport_init(struct transport *t, uv_loop_t *loop);
/* Releases raft_uv_tcp's memory (after raft_uv closed the transport). */
void transport_close(struct transport *t);

#endif
