/* idem: libidem, the synchronous C client of idemd's binary RPC; this header is its whole
 * public API.
 *
 * A client holds a list of nodes (the seeds it was given, plus leaders it learned from
 * redirects) and at most one TCP connection to each. idem_call() sends one Idem__Request to
 * the leader and returns its Idem__Response: it finds the leader by trying the seeds in
 * order, follows OUTCOME_NOT_LEADER redirects, and on a connection failure or an
 * OUTCOME_UNAVAILABLE answer backs off (10 ms doubling to 200 ms) and retries the same
 * request (same request id, key and attempt id; only Request.deadline_ms shrinks to the
 * time left) on the next candidate, until the call's deadline passes. Every idemd
 * operation is retry-safe with the same key and attempt id (CONTRACT.md §2, §4), so a retry
 * after an ambiguous failure never runs anything twice. idem_call_node() asks one given
 * node, without redirects or retries (idemctl's `status` asks every node itself).
 *
 * Wire format (proto/idem.proto, above `message Request`): a 4-byte big-endian length,
 * then a packed Request or Response of that many bytes. The socket is a blocking TCP
 * socket; every wait on it is a poll() bounded by the call's deadline. Name resolution
 * (getaddrinfo) happens on connect and is not bounded by the deadline: use numeric
 * addresses where that matters.
 *
 * Threads. A client is not thread-safe: use one client per thread (they share nothing;
 * the library has no global state). Different clients may be used concurrently.
 *
 * Known limits: no TLS yet (DESIGN.md lists it for client/); requests are not pipelined
 * (one outstanding request per client). */
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>
#include <stdint.h>

#include "idem.pb-c.h"

/* Error codes returned by every function of this API, with their idem_strerror() text. */
#define IDEM_ERRNO_MAP(X)                                                                     \
    X(IDEM_OK, 0, "ok")                                                                       \
    X(IDEM_EINVAL, 1, "invalid argument")                                                     \
    X(IDEM_ENOMEM, 2, "out of memory")                                                        \
    X(IDEM_EUNAVAILABLE, 3, "unavailable: no answer before the deadline")                    \
    X(IDEM_EPROTO, 4, "protocol error: the peer sent a frame that does not decode")           \
    X(IDEM_ETOOBIG, 5, "message larger than IDEM_MAX_FRAME")                                  \
    X(IDEM_ESYS, 6, "system error")

enum idem_error {
#define IDEM__ERRNO_ENUM(name, value, text) name = value,
    IDEM_ERRNO_MAP(IDEM__ERRNO_ENUM)
#undef IDEM__ERRNO_ENUM
};

/* The largest frame (packed message, without the 4-byte length) the client sends or
 * accepts. A larger incoming length is a protocol error and closes the connection. */
#define IDEM_MAX_FRAME (16u << 20)

/* At most this many nodes (seeds plus learned leaders) per client. */
#define IDEM_NODES_MAX 64

/* Length of an attempt id made by idem_attempt_id_new(), without the NUL. */
#define IDEM_ATTEMPT_ID_HEX 32

struct idem_client;

/* A static description of `err` (one of enum idem_error); "unknown error" for anything
 * else. Never NULL. */
const char *idem_strerror(int err);

/* Checks a seed list without creating a client: returns IDEM_OK, or IDEM_EINVAL and a
 * description of the first problem ("entry 2 \"localhost\": missing :port") in `why`
 * (OUT, caller's buffer of `why_len` bytes, always NUL-terminated; may be NULL). `seeds`
 * is borrowed. */
int idem_seeds_check(const char *seeds, char *why, size_t why_len);

/* Creates a client. `seeds` is "host:port,host:port,..." (IPv6 as "[addr]:port"; spaces
 * around commas are ignored; at most IDEM_NODES_MAX entries); `token` is the bearer token
 * sent with every request whose own auth_token is empty (NULL or "" sends none). Both
 * strings are borrowed: the client copies what it keeps. No connection is made yet. On
 * success returns IDEM_OK and stores the client in *out (OUT; the caller owns it and frees
 * it with idem_client_close()). Returns IDEM_EINVAL for a malformed seed list (use
 * idem_seeds_check() for the reason) and IDEM_ENOMEM on allocation failure; *out is then
 * NULL. */
int idem_client_new(const char *seeds, const char *token, struct idem_client **out);

/* Closes every connection and frees the client. Accepts NULL. */
void idem_client_close(struct idem_client *c);

/* Sends `req` to the leader and waits for its answer, for at most `deadline_ms` (> 0)
 * milliseconds in all. `req` is borrowed for the duration of the call and not modified;
 * the client fills request_id, deadline_ms and (when req->auth_token is empty) auth_token
 * in its own copy. Returns:
 * - IDEM_OK with *resp (OUT) set to the answer, whatever its outcome (acquired, replay,
 *   mismatch, unauthenticated, ...) except the two below. The caller owns *resp and frees
 *   it with idem__response__free_unpacked(*resp, NULL). (*resp)->result may be NULL if
 *   the server sent none: use idem_response_outcome().
 * - IDEM_EUNAVAILABLE when no leader answered before the deadline: every candidate failed
 *   to connect, answered OUTCOME_UNAVAILABLE or OUTCOME_NOT_LEADER without a usable
 *   leader address, or stayed silent. *resp is NULL. The request may or may not have been
 *   applied: retry it with the same key and attempt id (CONTRACT.md §4).
 * - IDEM_EINVAL (bad arguments), IDEM_ETOOBIG (request too large), IDEM_ENOMEM.
 * idem_client_errmsg() says what happened last, and where. */
int idem_call(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
              Idem__Response **resp);

/* Sends `req` to the node at `addr` ("host:port", borrowed) only: no redirects, no
 * retries, apart from one immediate reconnect when a kept-alive connection turns out to
 * be closed. The node does not need to be one of the seeds. Same ownership and result
 * rules as idem_call(), except that every answer is returned with IDEM_OK (including
 * OUTCOME_NOT_LEADER and OUTCOME_UNAVAILABLE); IDEM_EUNAVAILABLE means the node could not
 * be reached or did not answer before the deadline, IDEM_EPROTO that it sent bytes that
 * do not decode (the connection is closed). */
int idem_call_node(struct idem_client *c, const char *addr, const Idem__Request *req,
                   uint32_t deadline_ms, Idem__Response **resp);

/* A description of the last failure on this client, naming the node ("127.0.0.1:7001:
 * connect: Connection refused"); "" when there was none. Borrowed: valid until the next
 * call on the client. Never contains the bearer token. */
const char *idem_client_errmsg(const struct idem_client *c);

/* The address of the node that answered the last successful idem_call() (the leader, as
 * far as the client knows), or NULL before any. Borrowed: valid until the client is
 * closed. */
const char *idem_client_leader(const struct idem_client *c);

/* The outcome of a response: resp->result->outcome, or OUTCOME_UNSPECIFIED when resp or
 * its result is NULL. `resp` is borrowed. */
Idem__Outcome idem_response_outcome(const Idem__Response *resp);

/* The name of an outcome as idemctl --json prints it: "acquired", "replay",
 * "in_progress", "mismatch", "lease_expired", "outcome_unknown", "expired", "ok",
 * "lease_lost", "not_found", "quota_exceeded", "invalid", "unavailable", "not_leader",
 * "unauthenticated", "forbidden"; "unspecified" for 0 and "unrecognized" for values this
 * library does not know. A static string, never NULL. */
const char *idem_outcome_name(int outcome);

/* Writes a fresh random attempt id (IDEM_ATTEMPT_ID_HEX lowercase hex characters and a
 * NUL) into `out` (OUT). Returns IDEM_OK, or IDEM_ESYS when the random source failed. */
int idem_attempt_id_new(char out[IDEM_ATTEMPT_ID_HEX + 1]);

#endif /* IDEM_H */
