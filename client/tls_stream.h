/* tls_stream: the one TLS layer of idemd and libidem: TLS over any byte stream with OpenSSL 3
 * memory BIOs, below the RPC's frames, for the daemon's RPC listener (server role) and
 * libidem's synchronous and asynchronous clients (client role; the gateway's forwarder is
 * the asynchronous one). Part of libidem but not of its API: not installed, hidden in the
 * shared library; the daemon links the static library.
 *
 * The socket stays the caller's (a libuv stream, a non-blocking fd polled with a deadline,
 * anything): a stream never touches it. The caller moves bytes:
 *
 *     network bytes received  --IdemTlsFeed()-->   [SSL]  --IdemTlsRead()-->  plaintext
 *     plaintext to send       --IdemTlsWrite()-->  [SSL]  --IdemTlsTake()-->  network
 *
 * and after every feed, read or write sends whatever IdemTlsTake() hands out (handshake
 * messages, alerts, records, session tickets). The handshake runs by itself inside
 * IdemTlsRead() and IdemTlsWrite() (a server's first read answers the ClientHello); a
 * client drives it with IdemTlsHandshake(), whose first call produces the ClientHello.
 * Nothing blocks, nothing is logged, and nothing aborts: errors carry OpenSSL's reason in
 * IdemTlsErrmsg().
 *
 * Contexts: one per role and configuration, shared by many streams (a stream holds a
 * reference, so the context may be freed first). Both roles: TLS 1.2 or later, no
 * renegotiation. Server: cert_file and key_file (checked against each other); with ca_file
 * every client must present a certificate signed by it (or, client_cert_optional, may
 * present none); no session cache or tickets.
 * Client: verifies the server's certificate against ca_file, or without one against the
 * system's default CA store (OpenSSL's default paths, which the SSL_CERT_FILE /
 * SSL_CERT_DIR environment variables override), presents cert_file/key_file when given
 * (sent only when the server asks for a client certificate), and checks the peer's name:
 * an IP address must be an IP subjectAltName of the certificate and is not sent as SNI; a
 * host name is sent as SNI and must match a DNS name (no partial wildcards like n*.test).
 *
 * Not thread-safe per stream; a context may be shared between threads for making streams. */
#ifndef IDEM_CLIENT_TLS_STREAM_H
#define IDEM_CLIENT_TLS_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem.h"

enum idem_tls_role { IDEM_TLS_SERVER, IDEM_TLS_CLIENT };

/* What a context is made of; every string borrowed for the call (files are read then). A
 * NULL or empty string is "not given". */
struct idem_tls_params {
    enum idem_tls_role role;
    const char *cert_file; /* server: required; client: optional, with key_file */
    const char *key_file;
    const char *ca_file;     /* server: client certificates required; client: trust */
    const char *server_name; /* client: the name every server's certificate must carry,
                              * instead of the one given to IdemTlsNew() */
    bool client_cert_optional; /* server with ca_file: a client certificate is asked for and
                                * one given must verify, but a client without one is let in */
};

struct idem_tls_ctx;
struct idem_tls;

/* Results of IdemTlsRead(), IdemTlsHandshake() and the others (negative: the stream is
 * finished; a number >= 0 from IdemTlsRead() is a byte count). */
enum {
    IDEM_TLS_WANT = -1,   /* nothing more until more network bytes are fed */
    IDEM_TLS_CLOSED = -2, /* the peer sent close_notify: a clean end of stream */
    IDEM_TLS_ERROR = -3,  /* protocol or verification failure: see IdemTlsErrmsg(); close */
};

/* Makes a context from p into *out (OUT; the caller frees it with IdemTlsCtxFree()).
 * Returns IDEM_OK, or with *out NULL and the reason in err (errlen bytes): IDEM_EINVAL (a
 * server without cert_file and key_file, a client with one of them only), IDEM_ENOMEM, or
 * IDEM_ETLS (a file cannot be loaded, the key does not match the certificate, no system CA
 * store). The files are named as their settings are where each role is configured: a
 * server's as the daemon's tls: section ("tls: cert_file /path: <OpenSSL's reason>",
 * key_file, ca_file), a client's as libidem's options ("tls: CA file /path: ...",
 * certificate file, key file). */
int IdemTlsCtxNew(const struct idem_tls_params *p, struct idem_tls_ctx **out, char *err,
                  size_t errlen);

/* Drops the caller's reference; streams made from it keep theirs. Accepts NULL. */
void IdemTlsCtxFree(struct idem_tls_ctx *ctx);

/* ctx's OpenSSL context (an SSL_CTX), for a TLS layer that is not a stream of this file: the
 * daemon's HTTP listeners, whose TLS is h2o's. Borrowed: valid until IdemTlsCtxFree(ctx);
 * each SSL made from it (SSL_new) holds a reference of its own. */
struct ssl_ctx_st *IdemTlsCtxSsl(const struct idem_tls_ctx *ctx);

/* A new stream of ctx's role (ctx borrowed; the stream takes its own reference). For a
 * client, peer_name ("10.0.0.3" or "node2.example", not empty) is the address or name the
 * server's certificate must carry unless ctx has a server_name; NULL for a server. NULL
 * when out of memory. Free with IdemTlsFree() (no close_notify: see IdemTlsShutdown()). */
struct idem_tls *IdemTlsNew(struct idem_tls_ctx *ctx, const char *peer_name);

/* Accepts NULL. */
void IdemTlsFree(struct idem_tls *t);

/* Hands len bytes received from the network (borrowed) to the stream: 0, or
 * IDEM_TLS_ERROR when out of memory. Call IdemTlsRead() (or IdemTlsHandshake()) next. */
int IdemTlsFeed(struct idem_tls *t, const uint8_t *data, size_t len);

/* The network stream ended (the socket read 0): once what was fed is consumed, the stream
 * reads as ended without close_notify, an IDEM_TLS_ERROR ("unexpected eof while reading"),
 * unless the peer's close_notify came first. */
void IdemTlsFeedEof(struct idem_tls *t);

/* Decrypts into buf (cap > 0 bytes): the number of plaintext bytes (> 0), IDEM_TLS_WANT
 * when no full record is buffered, IDEM_TLS_CLOSED or IDEM_TLS_ERROR. Call it until it
 * returns IDEM_TLS_WANT: one fed chunk can hold several records. */
int IdemTlsRead(struct idem_tls *t, uint8_t *buf, size_t cap);

/* Encrypts len bytes of plaintext (borrowed) in full: 0, or IDEM_TLS_ERROR. Valid once the
 * handshake is done (a server answers only after reading a request, so it always is). */
int IdemTlsWrite(struct idem_tls *t, const uint8_t *data, size_t len);

/* Client: starts or continues the handshake: 0 when done, IDEM_TLS_WANT, or
 * IDEM_TLS_ERROR. Send what IdemTlsTake() gives after each call, also after 0 (the
 * client's Finished) and IDEM_TLS_ERROR (an alert). */
int IdemTlsHandshake(struct idem_tls *t);

/* Whether the handshake has completed. */
bool IdemTlsEstablished(const struct idem_tls *t);

/* Queues a close_notify alert (send it with IdemTlsTake()): 0, or IDEM_TLS_ERROR. Nothing
 * is queued before the handshake completed. */
int IdemTlsShutdown(struct idem_tls *t);

/* Bytes waiting to be sent to the network. */
size_t IdemTlsPending(const struct idem_tls *t);

/* Moves up to cap of the waiting bytes into buf (OUT); returns how many. */
size_t IdemTlsTake(struct idem_tls *t, uint8_t *buf, size_t cap);

/* The reason of the last IDEM_TLS_ERROR ("" if none): OpenSSL's text, with
 * " (certificate: <why>)" when the peer's certificate failed verification; never peer
 * bytes. Borrowed; valid until the next call on t. */
const char *IdemTlsErrmsg(const struct idem_tls *t);

/* Why the peer's certificate failed verification (X509_verify_cert_error_string: "unable
 * to get local issuer certificate", "hostname mismatch", ...), or NULL when it did not
 * fail (or was not checked yet). Static text. */
const char *IdemTlsVerifyError(const struct idem_tls *t);

/* ---- libidem's options (idem.h) ---- */

/* Whether opts ask for TLS (tls set, or any TLS file or the server name given). */
bool IdemTlsWanted(const struct idem_options *opts);

/* The client context of opts (IdemTlsCtxNew with opts' files and server name): IDEM_OK,
 * IDEM_EINVAL, IDEM_ENOMEM or IDEM_ETLS with the reason in why. */
int IdemTlsContext(const struct idem_options *opts, struct idem_tls_ctx **out, char *why,
                   size_t why_len);

#endif
