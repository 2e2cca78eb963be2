/* transport: raft's TCP transport: a listener and outgoing connections of our own (raft_uv_tcp
 * only for what raft_uv asks of a transport's life cycle), TCP_NODELAY and dead-peer
 * detection on both.
 *
 * Addresses: a member's Raft address is "host:port", the host an IPv4 address, an IPv6
 * address in brackets or a host name (server/config.h). libraft 0.15's raft_uv_tcp dials and
 * binds with uv_ip4_addr() only: no names, no IPv6. So the connector is ours: a name is
 * resolved off the loop (client/resolver.h: a thread of its own, not libuv's pool, where
 * raft_uv's disk work runs) at each connection attempt (raft_uv makes one every
 * connect_retry_delay while a peer cannot be reached), an answer at most
 * TRANSPORT_RESOLVE_REUSE_MS old taken again rather than asked anew; the addresses of an
 * answer are tried in turn. So a member whose address changed under its name is reached at
 * the first attempt after the old one failed. An attempt (lookup, connection, handshake and
 * authentication) ends after TRANSPORT_HANDSHAKE_TIMEOUT_MS. A connection whose peer
 * acknowledges nothing for TRANSPORT_TCP_USER_TIMEOUT_MS (TCP_USER_TIMEOUT, and keepalive
 * probes while it is idle) is dropped by the kernel: raft_uv then reconnects, resolving the
 * name again, where a peer that vanished (its address gone with it) would otherwise hold the
 * connection for TCP's retransmission timeout (about 15 minutes). The listener binds the
 * node's listen address (node.raft_listen, transport_set_listen), which may be a wildcard;
 * raft's own address (raft_address) is what the handshake names.
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
 * within TRANSPORT_HANDSHAKE_TIMEOUT_MS, at most TRANSPORT_HANDSHAKES_MAX at once (a new
 * connection past that closes the oldest unfinished one: whoever holds the slots open
 * cannot lock the members out, who finish theirs in a round trip); a connection that
 * breaks a rule is closed and said so on stderr (below). Then it hands the stream to
 * raft_uv, as raft_uv_tcp does, having read nothing past the handshake. Messages
 * themselves are checked by wire_check.h.
 *
 * With a secret (raft.secret_file), every connection is authenticated both ways before
 * raft has it, with HMAC-SHA256 under a key derived from the secret (K = HMAC(secret,
 * TRANSPORT_AUTH_LABEL)). A node may hold a second, older secret
 * (raft.previous_secret_file) while the members move from one to the other: it accepts
 * both, and a connection uses the newest key both ends have. A connection goes:
 *   listener  -> connector: TRANSPORT_AUTH_MAGIC (8 bytes), nonce_l (32), sent on accept;
 *   connector -> listener:  raft_uv_tcp's handshake, as without a secret;
 *   connector -> listener:  nonce_c (32), then for each of its keys, newest first,
 *                           TRANSPORT_KEYS_MAX in all (zeros where it has fewer):
 *                           HMAC(K, "connector" 0 nonce_l nonce_c id target address);
 *   listener  -> connector: HMAC(K, "listener" 0 nonce_l nonce_c id target C address),
 * where K is the listener's newest key that one of the connector's MACs was made with, id
 * (u64 little endian) and address (without its NUL) are the connector's, from the
 * handshake, target (u64 little endian) the ID of the node it means to reach, and C the
 * connector's MACs as sent (so none can be struck out on the way to force an older key).
 * Binding the target means a connection one member opened to another cannot be passed on
 * to a third (whoever took a stopped member's port could otherwise relay a member's MACs
 * to a live node). Nothing derived from a secret goes to a peer before it proved it holds
 * one: the listener's greeting is a nonce, and its MAC follows the connector's.
 *
 * A member whose configuration gives node 6 the address of node 5 (`members add 6` with
 * node 5's addresses) holds the secret, yet its MACs, made for target 6, fail at node 5;
 * the two logs would blame the secret. So nonce_c names the target in the clear (the ID
 * is no secret): TRANSPORT_TARGET_MAGIC (8 bytes), target (u64 little endian), then 16
 * random bytes. A listener none of whose keys makes one of the MACs for itself, whose
 * nonce_c names another target, checks them for that one; when one is right (the
 * connector proved it holds the secret, and asked for that node), it logs the wrong ID
 * and answers, in place of its MAC and as long:
 *   listener  -> connector: its own ID (u64 little endian), then the first 24 bytes of
 *                           HMAC(K, "refusal" 0 nonce_l nonce_c id listener C address),
 * and closes; the connector, finding that answer made with one of its keys, logs which
 * node answered at the address. A refusal goes only to a connector that proved the key,
 * and is no listener's MAC (another label): it opens nothing. A listener that cannot tell
 * (an earlier idemd's nonce_c is 32 random bytes, with TRANSPORT_TARGET_MAGIC once in 2^64)
 * closes as before, and both ends name the wrong ID as a possible cause. Nodes of the
 * earlier version interoperate unchanged: the nonce is opaque to them, and the refusal is
 * sent only to a connector whose nonce names its target, i.e. one of this version. (A
 * connector's MACs do go to whatever listens at a member's address, which could test
 * guesses of the secret against them offline: the secret must be random, at least
 * TRANSPORT_SECRET_MIN bytes.) The listener hands the stream to raft once the
 * connector's MAC is right; the connector hands it to raft (which then sends its first
 * message) once the listener's is. Whoever does not hold the secret gets no stream into
 * raft, and a connector does not send raft's messages to a listener that does not hold it.
 * A wrong MAC, a peer that closes, or no answer within TRANSPORT_HANDSHAKE_TIMEOUT_MS
 * closes the connection; raft_uv retries its connections every 100 ms, so each reason is
 * logged at most once per TRANSPORT_LOG_INTERVAL_MS per peer (node, or address for
 * incoming connections) with a count. The log names TRANSPORT_LOG_REASONS peers and reasons
 * at a time: past them (connections from many addresses, say) the others are counted
 * together and said in one line at most once per interval, so that no peer can make a node
 * log at the rate it connects. Without TLS, the messages after the exchange are
 * neither encrypted nor signed: whoever can read, divert or inject packets on the path
 * between two members still can.
 *
 * With tls.raft (transport_tls(), raft_tls.h) every connection is TLS with certificates both
 * ways from its first byte: the listener takes a client certificate signed by tls.ca_file
 * only, the connector checks the listener's against tls.ca_file and the host of the
 * member's address. All of the above (the handshake, its limits, the authentication) then
 * runs inside TLS, unchanged: what this file reads and writes is the plaintext end of a
 * socketpair that raft_tls pumps through TLS, and raft gets that end. The handshake timeout
 * and slots cover the TLS handshake too (a connection holds its slot from the accept on).
 * The authentication stays under TLS when a secret is set, and costs one round trip per
 * connection: the certificates say "signed by the CA", and one tls section serves every
 * listener, so the CA may sign RPC clients' certificates as well (mutual TLS on the RPC);
 * the secret says "a member". TLS failures are logged and counted as refusals (incoming)
 * or failed connections (outgoing). */
#ifndef IDEM_CLUSTER_TRANSPORT_H
#define IDEM_CLUSTER_TRANSPORT_H

#include <sys/queue.h>
#include <raft/uv.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define TRANSPORT_HANDSHAKE_PROTOCOL 1      /* raft_uv_tcp's */
/* A peer's address in the handshake, NUL-terminated and padded to 8 bytes: the longest
 * address a config takes (host:port, 259 bytes) fits. */
#define TRANSPORT_ADDRESS_MAX 264
#define TRANSPORT_HANDSHAKE_TIMEOUT_MS 10000
#define TRANSPORT_HANDSHAKES_MAX 64
#define TRANSPORT_AUTH_MAGIC "IDRAFTA1"  /* 8 bytes, no NUL on the wire */
#define TRANSPORT_AUTH_LABEL "idemd raft transport 1"
#define TRANSPORT_TARGET_MAGIC "IDTARGET" /* nonce_c's first 8 bytes: the target follows */
#define TRANSPORT_NONCE_LEN 32
#define TRANSPORT_MAC_LEN 32
#define TRANSPORT_KEYS_MAX 2 /* the current secret and the previous one */
#define TRANSPORT_SECRET_MIN 32 /* bytes; cluster.h's CLUSTER_SECRET_MIN equals it */
#define TRANSPORT_GREETING_LEN (8 + TRANSPORT_NONCE_LEN)
#define TRANSPORT_ANSWER_LEN (TRANSPORT_NONCE_LEN + TRANSPORT_KEYS_MAX * TRANSPORT_MAC_LEN)
#define TRANSPORT_LOG_INTERVAL_MS 10000
#define TRANSPORT_RESOLVE_REUSE_MS 1000 /* a name's answer this recent is not asked again */
#define TRANSPORT_TCP_USER_TIMEOUT_MS 10000
#define TRANSPORT_KEEPALIVE_S 5  /* idle seconds before the first keepalive probe */
#define TRANSPORT_LOG_REASONS 32 /* reasons x peers; a full table reuses a slot logged over an
                                  * interval ago, else counts the new one in `others` */

struct incoming;
struct outgoing;
struct raft_tls;
struct raft_tls_files;
struct idem_resolver;

/* The outgoing connections handed to raft_uv that are watched (transport_dead_outgoing): one
 * per peer, more than a cluster has members. */
#define TRANSPORT_WATCHED_MAX 16

/* One outgoing connection raft_uv holds: its descriptor, and the socket's inode, which tells
 * whether the descriptor still names that socket (raft_uv closes it when a write fails). */
struct transport_watched {
    int fd; /* -1: a free slot */
    uint64_t ino;
    raft_id peer;
};

/* A secret's bytes, borrowed for transport_init only. */
struct transport_secret {
    const uint8_t *value;
    size_t len;
};

struct transport {
    struct raft_uv_transport outer; /* first member; hand &outer to raft_uv_init */
    struct raft_uv_transport inner; /* raft_uv_tcp: outgoing connections */
    uv_loop_t *loop;
    raft_uv_accept_cb accept_cb;
    raft_uv_transport_close_cb close_cb;
    char address[TRANSPORT_ADDRESS_MAX]; /* this node's Raft address */
    char listen[TRANSPORT_ADDRESS_MAX];  /* the address bound; "": address */
    struct idem_resolver *resolver;      /* borrowed; NULL: peers' names are not resolved */
    uv_tcp_t listener;
    bool listener_open;
    TAILQ_HEAD(incomingList, incoming) incoming; /* handshakes being read, oldest first */
    size_t n_incoming;
    size_t n_closing_incoming; /* ended, their handles closing */
    TAILQ_HEAD(outgoingList, outgoing) outgoing; /* connected, authenticating */
    size_t n_closing_outgoing; /* ended, their handles closing */
    size_t n_closing_handles;  /* sockets of failed attempts, closing */
    raft_id id;                /* this node's */
    bool auth;                 /* a secret was given */
    size_t n_keys;             /* 1..TRANSPORT_KEYS_MAX when auth, newest first */
    uint8_t key[TRANSPORT_KEYS_MAX][TRANSPORT_MAC_LEN];
    struct {
        const char *why;       /* a string constant of transport.c; NULL: free */
        raft_id peer;          /* the node we connected to; 0 for incoming connections */
        uint8_t ip[16];        /* incoming: the peer's address (IdemSockaddrKey), or 0s */
        uint64_t log_ms;       /* uv_now when it was last logged */
        uint64_t unlogged;     /* refusals for it since */
    } logged[TRANSPORT_LOG_REASONS];
    uint64_t others;        /* refusals and failures not named: every slot was in use */
    uint64_t others_log_ms; /* uv_now when they were last said */
    struct raft_tls *tls; /* NULL: plain TCP (tls.raft off) */
    bool closing;
    bool inner_closed;
    struct transport_watched watched[TRANSPORT_WATCHED_MAX]; /* cluster/outwatch.c */
};

/* Initialises both layers on `loop`. n_secrets (0..TRANSPORT_KEYS_MAX) secrets, newest
 * first, turn authentication on: a connector offers a MAC under each, a listener answers
 * under its newest that matches. 0 or a RAFT_* code. */
int transport_init(struct transport *t, uv_loop_t *loop, const struct transport_secret *secrets,
                   size_t n_secrets);
/* The address the listener binds ("host:port" as config_addr_parse takes it; a name is
 * resolved when raft starts listening, blocking), and the resolver of peers' names
 * (borrowed; it outlives the transport). Both before raft_uv starts; without them the
 * listener binds the node's Raft address and names are not resolved. */
void transport_set_listen(struct transport *t, const char *listen);
void transport_set_resolver(struct transport *t, struct idem_resolver *resolver);

/* TCP_NODELAY, keepalive and TCP_USER_TIMEOUT (above) on a Raft connection (raft_tls.c's
 * too); failures only cost what they would have brought. */
void transport_tcp_tune(uv_tcp_t *tcp);

/* Puts every connection under TLS with `files` (all three given), after transport_init and
 * before raft_uv has the transport. 0, or -1 with the reason in err (a file that cannot be
 * loaded, a key that does not match its certificate). */
int transport_tls(struct transport *t, const struct raft_tls_files *files, char *err,
                  size_t errlen);
/* With TLS: the connections made from now on use server and client, as raft_tls_load made
 * them (taken: raft_tls_set); without, they are freed. */
struct idem_tls_ctx;
void transport_tls_set(struct transport *t, struct idem_tls_ctx *server,
                       struct idem_tls_ctx *client);
/* Releases raft_uv_tcp's memory and the TLS contexts (after raft_uv closed the transport). */
void transport_close(struct transport *t);

/* cluster/outwatch.c. raft_uv never reads an outgoing connection, so it learns that the
 * peer closed it (the peer stopped or restarted) only when a write fails; the first message
 * after the close goes into a connection nobody reads any more and is lost, and only the
 * next one fails and makes raft_uv connect again. Between followers the only messages are
 * votes: with a stale connection, a vote answer is lost, and electing a leader after one
 * fails takes another election timeout.
 * transport_watch notes the connection `stream` just handed to raft_uv for `peer` (the one
 * before it, to that peer, is forgotten). transport_dead_outgoing looks at each one noted
 * (a peek, reading nothing): one whose peer closed it is shut for writing, so that raft_uv's
 * next write to it fails at once, and forgotten, and its peer goes into ids (at most cap).
 * The caller then makes raft_uv write to each (io_poke), so that it connects anew before
 * raft has anything to say there. Returns how many. */
void transport_watch(struct transport *t, raft_id peer, uv_stream_t *stream);
size_t transport_dead_outgoing(struct transport *t, raft_id *ids, size_t cap);

/* Since start: incoming connections closed for breaking the handshake's rules or failing
 * authentication or TLS (or meant for another node), and outgoing ones whose peer failed it
 * or TLS (or never answered it, or refused as another node). */
uint64_t transport_refused_total(void);
uint64_t transport_auth_failed_total(void);

#endif
