/* idem_rpc: libidem's raw-message calls, for this repository's tools (idemctl, idem-bench),
 * which speak every RPC (admin ops included) in protobuf-c messages, and for idemd's
 * gateway, which forwards requests to the leader with the asynchronous ones. Not
 * installed: it needs the generated "idem.pb-c.h" of proto/idem.proto. Applications use
 * idem.h alone.
 *
 * idem_call() follows the rules of idem.h (leader discovery, redirects, retries of
 * unavailable and connection failures with the same request, deadline) and is thread-safe
 * like every call on a struct idem_client. */
#ifndef IDEM_RPC_H
#define IDEM_RPC_H

#include "idem.h"
#include "idem.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sends `req` to the leader and waits for its answer, for at most `deadline_ms` (> 0)
 * milliseconds in all. `req` is borrowed for the duration of the call and not modified;
 * the client fills request_id, deadline_ms and (when req->auth_token is empty) auth_token
 * in its own copy. Returns:
 * - IDEM_OK with *resp (OUT) set to the answer, whatever its outcome (acquired, replay,
 *   mismatch, unauthenticated, ...) except the two below. The caller owns *resp and frees
 *   it with idem__response__free_unpacked(*resp, NULL). (*resp)->result may be NULL if
 *   the server sent none: use idem_response_outcome() (the typed calls of idem.h fail
 *   such an answer with IDEM_EPROTO). An answer with request_id 0 (the node could not read
 *   the request frame) is never returned: it counts as a broken connection, retried.
 * - IDEM_EUNAVAILABLE when no leader answered before the deadline: every candidate failed
 *   to connect, answered OUTCOME_UNAVAILABLE or OUTCOME_NOT_LEADER without a usable
 *   leader address, or stayed silent. *resp is NULL. The request may or may not have been
 *   applied: retry it with the same key and attempt id (docs/contract.md).
 * - IDEM_EINVAL (bad arguments), IDEM_ETOOBIG (request too large), IDEM_ENOMEM.
 * idem_client_errmsg() says what happened last, and where. */
int idem_call(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
              Idem__Response **resp);

/* idem_call() that also gives this call's own account of a failure, in err (errlen bytes,
 * caller-provided): what idem_client_errmsg() says only while no other thread makes a
 * call on the same client. On IDEM_OK err may hold what an attempt retried in the call
 * said. */
int idem_call_why(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                  Idem__Response **resp, char *err, size_t errlen);

/* Sends `req` to the node at `addr` ("host:port", borrowed) only: no redirects, no
 * retries, apart from one immediate reconnect when a kept-alive connection turns out to
 * be closed. The node does not need to be one of the seeds. Same ownership and result
 * rules as idem_call(), except that every answer is returned with IDEM_OK (including
 * OUTCOME_NOT_LEADER and OUTCOME_UNAVAILABLE); IDEM_EUNAVAILABLE means the node could not
 * be reached or did not answer before the deadline, IDEM_EPROTO that it sent bytes that
 * do not decode (the connection is closed). */
int idem_call_node(struct idem_client *c, const char *addr, const Idem__Request *req,
                   uint32_t deadline_ms, Idem__Response **resp);

/* ---- raw asynchronous calls to a named node (client/async_node.c) ----
 *
 * For the gateway of a follower, which forwards requests to the leader its node names,
 * on the node's loop. */

/* Called exactly once per accepted idem_async_call_node(), on the loop's thread, never from
 * within the call: status IDEM_OK with the node's answer in `resp` (borrowed for the
 * callback; its request_id is the caller's), or a negative code with resp NULL and a
 * static reason (never a key, a token or an address: it may be shown to the caller's
 * clients): IDEM_EUNAVAILABLE (the connection failed, TLS included, or the deadline
 * passed: "deadline passed"), IDEM_EPROTO (the node sent a frame that is too large or
 * does not decode), IDEM_ENOMEM, IDEM_ECANCELED (idem_async_close() ran first). The
 * callback may make new calls and may close the client. */
typedef void (*idem_async_raw_cb)(struct idem_async *a, int status, const Idem__Response *resp,
                                  const char *reason, void *data);

/* idem_async_open() for a client of raw calls: opts->seeds may be NULL, and then the typed
 * calls of idem.h fail with IDEM_EINVAL. */
int idem_async_open_raw(struct uv_loop_s *loop, const struct idem_options *opts,
                        struct idem_async **out, char *why, size_t why_len);

/* Has the client look host names up on `r`'s thread (client/resolver.h: the daemon's own,
 * borrowed, closed only after the client) instead of libuv's thread pool, from its next
 * connection on. The daemon's log writes run on that pool: lookups waiting out name
 * servers that do not answer (seconds each) would hold them there. */
struct idem_resolver;
void idem_async_use_resolver(struct idem_async *a, struct idem_resolver *r);

/* Sends `req` (borrowed, packed before this returns) to the node at `addr` ("host:port",
 * borrowed) and hands its answer, whatever the outcome, to cb, within deadline_ms (0: the
 * client's default). One connection per named node, opened for its first call and kept
 * for the next ones, pipelined, written with the calls of the same loop turn in one
 * batch. The request goes out as given except for request_id (the client's own, unique on
 * the connection), auth_token (the client's token when req has none) and, when req has
 * none, deadline_ms (the time the call has left). An answer OUTCOME_NOT_LEADER naming
 * another node moves the call there, once, within the same deadline. No other retries: a
 * failed connection fails every call waiting on it, and the next call opens a new one.
 * Returns IDEM_OK (cb will be called), or IDEM_EINVAL (NULL argument, or addr is not a
 * "host:port"), IDEM_ECLOSED (after idem_async_close()), IDEM_ETOOBIG (larger than the
 * client's max_frame_bytes), IDEM_ENOMEM or IDEM_ESYS, and cb is never called. */
int idem_async_call_node(struct idem_async *a, const char *addr, const Idem__Request *req,
                         uint32_t deadline_ms, idem_async_raw_cb cb, void *data);

/* What idem_async_move_calls does with one raw call, by its caller's `data`: send it again
 * to the new node, or fail it (its callback gets IDEM_EUNAVAILABLE, "the node it was sent to
 * no longer leads", on the next loop turn, never within the move). */
enum idem_move { IDEM_MOVE_SEND, IDEM_MOVE_FAIL };
typedef enum idem_move (*idem_move_fn)(void *data, void *arg);

/* For a caller that learned that the node at `to` ("host:port", borrowed) leads now: every
 * raw call still without an answer from another named node is, as decide(data, arg) says,
 * moved to `to` (on its connection, within its own deadline, its request sent again as it
 * was packed; a late answer from the node it left is dropped) or failed; the connections
 * to the nodes left are closed. A request sent again must be safe to send twice: idemd's
 * data operations are (a claim carries its attempt id, the others their token), with the
 * caveats the caller's decide weighs. No callback runs within the call. Returns how many
 * calls moved (0 when the client is closing, or `to` is not a "host:port": then nothing
 * changes). */
size_t idem_async_move_calls(struct idem_async *a, const char *to, idem_move_fn decide,
                             void *arg);

/* Called when a TLS handshake or session of the client fails, before the calls waiting
 * on that connection hear of it, for the caller's log (libidem logs nothing): the node's
 * address, what failed ("handshake", "read", "write", "setup") and OpenSSL's reason (with
 * the certificate verification result when that failed; never bytes from the node). All
 * borrowed for the call. It must not call the client. */
typedef void (*idem_async_tls_failure_cb)(void *data, const char *addr, const char *what,
                                          const char *reason);

/* Sets (cb NULL: clears) the client's TLS failure callback. */
void idem_async_on_tls_failure(struct idem_async *a, idem_async_tls_failure_cb cb, void *data);

/* Hands a client opened with TLS a new client context (tls_stream.h's, made by its
 * IdemTlsContext(); taken) for the connections opened from now on; those open keep their
 * sessions. It cannot fail, so that the daemon's forwarder can take a renewed client
 * certificate on a configuration reload only once every other part of the node has loaded
 * its new files too. A client opened without TLS stays without it (ctx is freed); ctx NULL
 * changes nothing. */
struct idem_tls_ctx;
void idem_async_set_tls(struct idem_async *a, struct idem_tls_ctx *ctx);

/* The outcome of a response: resp->result->outcome, or OUTCOME_UNSPECIFIED when resp or
 * its result is NULL. `resp` is borrowed. */
Idem__Outcome idem_response_outcome(const Idem__Response *resp);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_RPC_H */
