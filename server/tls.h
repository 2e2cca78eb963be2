/* tls: TLS over any byte stream with OpenSSL 3 memory BIOs; the pieces the RPC listener uses
 * and a TLS client (tests/unit/test_tls.c; the forwarder uses libidem's) can reuse.
 *
 * The socket stays the caller's (a libuv stream, a blocking fd, anything): a tls_conn never
 * touches it. The caller moves bytes:
 *
 *     network bytes received  --tls_conn_feed()-->  [SSL]  --tls_conn_read()-->  plaintext
 *     plaintext to send       --tls_conn_write()->  [SSL]  --tls_conn_take()-->  network
 *
 * and after every feed, read or write sends whatever tls_conn_take() hands out (handshake
 * messages, alerts, records, session tickets). The handshake runs by itself inside
 * tls_conn_read() and tls_conn_write() (a server's first read answers the ClientHello; a
 * client's first tls_conn_handshake() produces it). Nothing blocks and nothing is logged;
 * errors carry OpenSSL's reason in tls_conn_errmsg().
 *
 * Contexts: one tls_ctx per role and configuration, shared by many connections (a
 * tls_conn holds a reference, so the ctx may be freed first). Server: cert_file and key_file
 * (checked against each other), TLS 1.2 or later; with ca_file every client must present a
 * certificate signed by it. Client: verifies the server's certificate against ca_file, or
 * without one against the system's default CA store (OpenSSL's default paths, which the
 * SSL_CERT_FILE / SSL_CERT_DIR environment variables override), presents cert_file/key_file
 * when given (sent only when the server asks for a client certificate), and checks the
 * peer's name or IP address given to tls_conn_new().
 *
 * Not thread-safe per connection (like everything on the node's loop); contexts may be
 * shared between threads for creating connections. */
#ifndef IDEM_SERVER_TLS_H
#define IDEM_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

enum tls_role { TLS_SERVER, TLS_CLIENT };

struct tls_ctx;
struct tls_conn;

/* Results of tls_conn_read(), tls_conn_handshake() and tls_conn_shutdown() (negative: the
 * connection is finished; a number >= 0 from tls_conn_read() is a byte count). */
enum {
    TLS_WANT = -1,   /* nothing more until more network bytes are fed */
    TLS_CLOSED = -2, /* the peer sent close_notify: a clean end of stream */
    TLS_ERROR = -3,  /* protocol or verification failure: see tls_conn_errmsg(); close */
};

/* Creates a context from cfg (borrowed; the files are read now, not later). Returns NULL
 * with "tls: cert_file /path: <reason>" (or key_file, ca_file, "key does not match") in err
 * (caller's buffer of errlen bytes) on failure. The caller owns the result and frees it
 * with tls_ctx_free(). TLS_CLIENT without cfg->ca_file uses the system CA store. */
struct tls_ctx *tls_ctx_new(const struct config_tls *cfg, enum tls_role role, char *err,
                            size_t errlen);

/* Drops the caller's reference; connections made from it keep theirs. Accepts NULL. */
void tls_ctx_free(struct tls_ctx *ctx);

/* A new connection of ctx's role (ctx borrowed; the connection takes its own reference).
 * For a client, peer_name ("10.0.0.3" or "node2.example") is the name or address the
 * server's certificate must carry, and is sent as SNI when it is a name; NULL for a server.
 * Aborts on allocation failure (xmalloc's policy). Free with tls_conn_free(). */
struct tls_conn *tls_conn_new(struct tls_ctx *ctx, const char *peer_name);

void tls_conn_free(struct tls_conn *t);

/* Hands len bytes received from the network (borrowed) to the TLS engine. Never fails
 * (the memory BIO grows); call tls_conn_read() next. */
void tls_conn_feed(struct tls_conn *t, const uint8_t *data, size_t len);

/* Decrypts into buf (cap > 0 bytes): returns the number of plaintext bytes (> 0), TLS_WANT
 * when no full record is buffered, TLS_CLOSED or TLS_ERROR. Call it until it returns
 * TLS_WANT: one fed chunk can hold several records. */
int tls_conn_read(struct tls_conn *t, uint8_t *buf, size_t cap);

/* Encrypts len bytes of plaintext (borrowed) in full: 0, or TLS_ERROR. Valid once the
 * handshake is done (a server answers only after reading a request, so it always is). */
int tls_conn_write(struct tls_conn *t, const uint8_t *data, size_t len);

/* Client: starts or continues the handshake: 0 when done, TLS_WANT, or TLS_ERROR. */
int tls_conn_handshake(struct tls_conn *t);

/* Whether the handshake has completed. */
bool tls_conn_established(const struct tls_conn *t);

/* Queues a close_notify alert (send it with tls_conn_take()): 0, or TLS_ERROR. */
int tls_conn_shutdown(struct tls_conn *t);

/* Bytes waiting to be sent to the network. */
size_t tls_conn_pending(const struct tls_conn *t);

/* Moves up to cap of the waiting bytes into buf (OUT); returns how many. */
size_t tls_conn_take(struct tls_conn *t, uint8_t *buf, size_t cap);

/* The reason of the last TLS_ERROR ("" if none): OpenSSL's text, never peer bytes.
 * Borrowed; valid until the next call on t. */
const char *tls_conn_errmsg(const struct tls_conn *t);

#endif
