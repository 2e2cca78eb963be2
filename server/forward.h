/* forward: how a follower's HTTP gateway forwards a request to the leader over the binary
 * RPC, on the node's loop (docs/architecture.md): libidem's raw asynchronous calls to a
 * named node (client/include/idem_rpc.h), with the node's TLS settings. */
#ifndef IDEM_SERVER_FORWARD_H
#define IDEM_SERVER_FORWARD_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "idem.pb-c.h"

struct forwarder;

/* Called exactly once per forward_call(), possibly before it returns: with the leader's
 * Response (resp != NULL, err == NULL; its request_id is the caller's; or, for a request
 * larger than an RPC frame may be, an `invalid` one made here), or with resp == NULL
 * and a static, NUL-terminated reason in err (connection failure, deadline passed, bad
 * frame, forwarder closed), which never holds a key, a token or an address. `resp` is
 * borrowed for the duration of the call. */
typedef void (*forward_cb)(void *data, const Idem__Response *resp, const char *err);

/* Whether a call may be sent again to a new leader (forwarder_move), by its caller's data;
 * NULL: never (it fails, and its caller retries as it does after a failed call). */
typedef bool (*forward_resend_fn)(void *data);

/* Creates a forwarder on `loop` (borrowed; must outlive it). With `tls` (borrowed: the files
 * are read now; NULL for plain TCP) every connection speaks TLS: the leader's certificate
 * is verified against tls->ca_file, or without one against the system CA store, and must
 * carry the address it is reached at (an IP subjectAltName); tls->cert_file and key_file
 * are this node's client certificate, sent where the leader asks for one. A TLS failure is
 * logged with OpenSSL's reason. Returns NULL with the reason in err (errlen bytes) when a
 * TLS file cannot be loaded (or out of memory). The caller owns the result and ends it with
 * forwarder_close(). */
struct forwarder *forwarder_new(uv_loop_t *loop, const struct config_tls *tls, char *err,
                                size_t errlen);

/* A configuration reload of a forwarder made with TLS, in two steps (server/reload.c: no part
 * of the node switches before every part has loaded its files). forwarder_load_tls: the
 * client context of tls's files (borrowed for the call) into *out, as forwarder_new makes
 * it; 0, or -1 with the reason in err ("tls: certificate file /path: ...") and *out NULL.
 * forwarder_set_tls: the connections opened from now on take ctx (taken; NULL changes
 * nothing); those open go on. */
struct idem_tls_ctx;
int forwarder_load_tls(const struct config_tls *tls, struct idem_tls_ctx **out, char *err,
                       size_t errlen);
void forwarder_set_tls(struct forwarder *f, struct idem_tls_ctx *ctx);

/* Sends `req` to the RPC server at addr ("host:port") over one lazily opened, reused and
 * pipelined TCP (or TLS) connection per address; the requests of one loop turn are written
 * together. `addr` and `req` are borrowed for the duration of the call only: the request
 * is packed before forward_call returns. `deadline_ms` bounds the whole call; the answer
 * is then "deadline passed". A NOT_LEADER answer that names another leader is followed
 * once more, within the same deadline. The request goes out with Request.forwarded set:
 * the leader's /metrics counts it apart, as its client was counted by the caller
 * (reqstats.h). */
void forward_call(struct forwarder *f, const char *addr, const Idem__Request *req,
                  uint32_t deadline_ms, forward_resend_fn resend, forward_cb cb, void *data);

/* The node at `to` leads now: every call sent to another node and not answered yet is
 * sent again to `to` within its deadline when its resend function says so, and fails at
 * once otherwise ("the node it was sent to no longer leads", on the next loop turn); the
 * connections to the other nodes close (a leader cut off from the cluster may never
 * answer). Returns how many were sent again. */
size_t forwarder_move(struct forwarder *f, const char *to);

/* Fails every pending call ("forwarder closed"), closes every connection and frees the
 * forwarder; then cb(data) runs (cb may be NULL). No forward_call() after this. */
void forwarder_close(struct forwarder *f, void (*cb)(void *data), void *data);

#endif
