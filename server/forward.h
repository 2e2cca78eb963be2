/* forward: an asynchronous client of the binary RPC on the node's loop, with which a
 * follower's HTTP gateway forwards a request to the leader (DESIGN.md, runtime shape). */
#ifndef IDEM_SERVER_FORWARD_H
#define IDEM_SERVER_FORWARD_H

#include <stdint.h>
#include <uv.h>

#include "idem.pb-c.h"

struct forwarder;
struct tls_ctx;

/* Called exactly once per forward_call(), possibly before it returns: with the leader's
 * Response (resp != NULL, err == NULL; its request_id is the caller's), or with resp == NULL
 * and a static, NUL-terminated reason in err (connection failure, deadline passed, bad
 * frame, forwarder closing). `resp` is borrowed for the duration of the call. */
typedef void (*forward_cb)(void *data, const Idem__Response *resp, const char *err);

/* Creates a forwarder on `loop` (borrowed; must outlive it). Frames larger than
 * max_frame_bytes from a peer fail that connection. `tls` (taken: the forwarder frees it;
 * NULL for plain TCP) is a TLS_CLIENT context (tls.h): every connection then speaks TLS and
 * checks that the server's certificate was issued by the context's CA and carries the IP
 * address the connection goes to (an IP subjectAltName). The caller owns the result and
 * ends it with forwarder_close(). Never returns NULL (aborts on allocation failure). */
struct forwarder *forwarder_new(uv_loop_t *loop, uint32_t max_frame_bytes, struct tls_ctx *tls);

/* Sends `req` to the RPC server at addr ("a.b.c.d:port", an IPv4 literal) over one lazily
 * opened, reused and pipelined TCP (or TLS) connection per address, with the forwarder's own
 * request ids. `addr` and `req` are borrowed for the duration of the call only: the request is
 * packed before forward_call returns. `deadline_ms` bounds the whole call; the answer is then
 * "deadline passed". A NOT_LEADER answer that names another leader is followed once more,
 * within the same deadline. The request goes out with Request.forwarded set: the leader's
 * /metrics counts it apart, as its client was counted by the caller (reqstats.h). */
void forward_call(struct forwarder *f, const char *addr, const Idem__Request *req,
                  uint32_t deadline_ms, forward_cb cb, void *data);

/* Fails every pending call ("forwarder closed"), closes every connection and frees the
 * forwarder; then cb(data) runs (cb may be NULL). No forward_call() after this. */
void forwarder_close(struct forwarder *f, void (*cb)(void *data), void *data);

#endif
