/* raft_tls: TLS under raft_uv's connections (tls.raft), for transport.c.
 *
 * raft_uv reads and writes the stream the transport hands it itself (uv_read_start,
 * uv_write), and libraft 0.15 has no place for TLS. So with tls.raft the stream raft (and
 * transport.c's handshake and authentication before it) gets is one end of an AF_UNIX
 * socketpair, a uv_pipe_t, and a pump here moves bytes between the other end and the TCP
 * connection through a TLS stream of libidem's (client/tls_stream.h, the RPC's):
 *
 *     raft / transport.c  <->  plain | socketpair | near  <->  TLS  <->  TCP  <->  peer
 *
 * Plaintext read from `near` is encrypted and written to the TCP connection; what the TCP
 * connection brings is decrypted and written to `near`. The listener is the TLS server and
 * asks for a client certificate, which must be signed by tls.ca_file; the connector is the
 * TLS client: it presents tls.cert_file and checks the listener's certificate against
 * tls.ca_file and against the host of the member's Raft address (an IP address must be an
 * IP subjectAltName of the certificate, a host name one of its DNS names: tls_stream's peer
 * rule). TLS 1.2 or later.
 * Everything raft_uv_tcp sends goes inside TLS, its handshake (the sender's ID and address)
 * and transport.c's authentication included.
 *
 * Listener: raft_tls_accept() takes an accepted TCP connection and gives back the plaintext
 * end at once. transport.c reads the handshake from it as from a TCP connection, within
 * its handshake timeout and its slots, which so cover the TLS handshake as well: a peer
 * that does not finish it holds its slot until the timeout (or a newer connection) closes
 * the plaintext end, and the pump then closes the TCP connection. What is written to the
 * plaintext end before the TLS handshake completed (the authentication's greeting) waits
 * in the pump until it has, bounded like the rest.
 *
 * Connector: raft_tls_connect() does what raft_uv_tcp's connect does, over TLS: it connects,
 * completes the TLS handshake, writes raft_uv_tcp's handshake (protocol, ID, address) into
 * the plaintext end and hands that end to its callback, or calls it back with
 * RAFT_NOCONNECTION. The TCP connection and the TLS handshake together must finish within
 * the handshake timeout.
 *
 * Backpressure: a pump holds at most RAFT_TLS_QUEUE_MAX bytes queued towards either side
 * (plus one read): past it, it stops reading the other side until that queue drains, so
 * a peer or a raft that does not read holds the sender back, no buffer grows.
 *
 * Ends: when either side ends (EOF, an error, the peer's close_notify, a TLS failure, a
 * write that fails), the pump closes both, so that raft (or transport.c) sees its stream
 * end as with TCP; what is still queued is written if the socket takes it at once (raft's
 * messages may be lost on a broken connection in any case). When the plaintext end closes
 * first (raft or transport.c closed it), close_notify is sent the same way. A TLS failure
 * (a peer without TLS, a certificate the CA did not sign or for another address, a
 * corrupt record) and, for the connector, a peer that closes during the TLS handshake or
 * does not finish it in time, are told to the transport (raft_tls_fail_cb) for its log;
 * never a peer's bytes. raft_tls_close() ends every pump and calls back once they are
 * all gone; nothing waits for a peer then. */
#ifndef IDEM_CLUSTER_RAFT_TLS_H
#define IDEM_CLUSTER_RAFT_TLS_H

#include <netinet/in.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Bytes a pump lets wait towards one side before it stops reading the other. */
#define RAFT_TLS_QUEUE_MAX (256u * 1024u)

struct raft_tls;

/* The certificate files (tls.cert_file, key_file, ca_file), borrowed for raft_tls_new. */
struct raft_tls_files {
    const char *cert_file;
    const char *key_file;
    const char *ca_file;
};

/* A connection that failed for a reason worth the log. */
struct raft_tls_failure {
    bool incoming;                  /* accepted (the listener's) or connected */
    raft_id peer;                   /* connected: the node it was for */
    const struct sockaddr *from;    /* accepted: the peer's address (IPv4 or IPv6), or NULL */
    const char *why;                /* one of raft_tls.c's string constants, one per reason */
    const char *text;               /* what to say: the reason, OpenSSL's text, a hint */
};

struct raft_tls_cbs {
    void *data;
    /* A connection failed (transport.c logs it, rate-limited, and counts it). */
    void (*fail)(void *data, const struct raft_tls_failure *f);
    /* After raft_tls_close(): the last pump is gone. Never from inside raft_tls_close. */
    void (*closed)(void *data);
};

/* Makes the TLS contexts from `files` (cert_file, key_file and ca_file all given). 0, or -1
 * with the reason in err ("tls: cert_file /path: <OpenSSL's reason>", ...). */
int raft_tls_new(uv_loop_t *loop, const struct raft_tls_files *files, uint64_t handshake_timeout_ms,
                 const struct raft_tls_cbs *cbs, struct raft_tls **out, char *err, size_t errlen);

/* New certificates in two steps, so that a reload that renews other contexts too switches
 * none before all loaded. raft_tls_load: the listener's and the connector's contexts of
 * `files` (as raft_tls_new makes them) into *server and *client (IdemTlsCtxFree frees them);
 * 0, or -1 with the reason in err (as raft_tls_new) and both NULL. raft_tls_set: the
 * connections made from now on use them (taken; both as raft_tls_load made them); the pumps
 * that run keep theirs. */
struct idem_tls_ctx;
int raft_tls_load(const struct raft_tls_files *files, struct idem_tls_ctx **server,
                  struct idem_tls_ctx **client, char *err, size_t errlen);
void raft_tls_set(struct raft_tls *rt, struct idem_tls_ctx *server, struct idem_tls_ctx *client);

/* Listener: puts `tcp` (accepted; raft_malloc'd) under TLS. 0 with the plaintext end in
 * *plain (raft_malloc'd, its data NULL; whoever has it closes and raft_frees it), tcp now
 * the pump's; or a libuv error code (UV_EMFILE, ...), tcp left to the caller. */
int raft_tls_accept(struct raft_tls *rt, uv_tcp_t *tcp, uv_stream_t **plain);

/* Connector: connects to node `id` at `addr` (an address of the member's Raft address,
 * resolved by the caller) as raft_uv_tcp's connect does, over TLS, the listener's certificate
 * checked against `peer_name` (the host of the member's Raft address), its handshake naming
 * `self` and `self_address` (all borrowed for the call). 0, then cb(req, stream, 0) with the
 * plaintext end (raft_malloc'd, the handshake written) or cb(req, NULL, RAFT_NOCONNECTION),
 * or cb(req, NULL, RAFT_CANCELED) once raft_tls_close() was called; or a RAFT_* code and no
 * callback. */
int raft_tls_connect(struct raft_tls *rt, struct raft_uv_connect *req, raft_id id,
                     const struct sockaddr *addr, const char *peer_name, raft_id self,
                     const char *self_address, raft_uv_connect_cb cb);

/* Ends every pump (connections being made are called back RAFT_CANCELED) and takes no new
 * one; cbs.closed follows once all are gone. */
void raft_tls_close(struct raft_tls *rt);

/* Whether raft_tls_close() was called and every pump is gone. */
bool raft_tls_closed(const struct raft_tls *rt);

/* Frees the contexts (after raft_tls_closed(), or before any pump). Accepts NULL. */
void raft_tls_free(struct raft_tls *rt);

/* Pumps alive, and the bytes they hold: queued towards either side, and plaintext waiting
 * for a TLS handshake (for tests). */
size_t raft_tls_pumps(const struct raft_tls *rt);
size_t raft_tls_buffered(const struct raft_tls *rt);

#endif
