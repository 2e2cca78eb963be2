/* idem_rpc: libidem's raw-message calls, for this repository's tools (idemctl, idem-bench),
 * which speak every RPC (admin ops included) in protobuf-c messages. Not installed: it needs
 * the generated "idem.pb-c.h" of proto/idem.proto. Applications use idem.h alone.
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

/* The outcome of a response: resp->result->outcome, or OUTCOME_UNSPECIFIED when resp or
 * its result is NULL. `resp` is borrowed. */
Idem__Outcome idem_response_outcome(const Idem__Response *resp);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_RPC_H */
