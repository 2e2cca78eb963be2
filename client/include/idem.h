/* idem: libidem, the C client of idemd; this header is its whole public API.
 *
 * Link with `pkg-config --cflags --libs idem` (libidem.so; outside the linker's default
 * paths, add `-Wl,-rpath,$(pkg-config --variable=libdir idem)` or set LD_LIBRARY_PATH). For
 * a static link name the archive instead of -lidem: `$(pkg-config --variable=libdir
 * idem)/libidem.a` followed by `pkg-config --static --libs idem` without its -lidem (the
 * linker takes libidem.so for -lidem whenever both exist; examples/README.md shows both).
 * The header needs no other header than the C library's: the asynchronous API takes
 * libuv's loop as `struct uv_loop_s *` (uv_loop_t), so only programs that use it include
 * <uv.h> themselves.
 *
 * What a client does for every call (synchronous and asynchronous alike):
 * - It holds a list of nodes: the seeds it was given, plus leaders it learned from
 *   redirects. It sends each request to the node it believes leads, trying the seeds in
 *   order until one answers, and follows `not_leader` redirects to the leader's address.
 * - Every call has a deadline (milliseconds, relative; 0 takes the client's default). A
 *   connection failure or an `unavailable` answer (no quorum, no leader, election) is
 *   retried after a bounded backoff (10 ms doubling to 200 ms, jittered), always with the
 *   same request: same key, same attempt id, same bearer token. Every idemd operation is
 *   retry-safe that way (docs/contract.md), so a retry after an ambiguous failure never
 *   runs anything twice, and a claim whose answer was lost gets its own lease back
 *   (`acquired`, same token) instead of `in_progress`.
 * - An `unavailable` answer with a retry time (a leader refusing the request for load: its
 *   batch.max_pending_mb of commands not yet committed, or the tenant's share of them; a
 *   leader refusing it while it hands its leadership to another node, which then answers
 *   `not_leader` and the request follows the new leader; or,
 *   through idem_call(), a membership change or transfer that may succeed again) is not a
 *   failed node: that request goes to the same node again, on the same connection,
 *   after that time at least (the backoff when longer); the asynchronous client's other
 *   requests go on meanwhile. At the deadline, IDEM_EUNAVAILABLE with the refusal in
 *   `detail`.
 * - A node that accepts the connection but does not answer (a stopped or frozen process, a
 *   blackholed host) is given one attempt's share of the time left -- a third of it, at
 *   least 250 ms -- for connect, TLS handshake and answer; then the client closes that
 *   connection and tries the next seed with the same request. So such a leader costs part
 *   of a call's deadline, and calls reach the new leader once one is elected.
 * - An answer with request id 0 says that the node could not read the request frame (it
 *   does not decode; proto/idem.proto, above `message Request`): the node applied nothing
 *   it could not read and closes the connection. The client takes it as a broken
 *   connection: the same request again, to the next seed after a backoff (the
 *   asynchronous client resends every request that was written on that connection and not
 *   answered, since it cannot tell which frame the node could not read); at the deadline
 *   IDEM_EUNAVAILABLE, with the node's refusal in `detail`.
 * - When the deadline passes without an answer from a leader, the call fails with
 *   IDEM_EUNAVAILABLE. The request may or may not have been applied: retry it with the same
 *   key (and, for a claim, the same attempt id).
 * - An answer to the request that carries no result (idemd always sends one) fails the
 *   call with IDEM_EPROTO: the outcome is unknown, the request may have been applied;
 *   retrying with the same key (and attempt id) is safe.
 *
 * Errors. Functions return IDEM_OK (0) or a negative IDEM_E* code; idem_strerror() names
 * it. An answer from the cluster, whatever its outcome (acquired, replay, mismatch,
 * lease_lost, unauthenticated, quota_exceeded, ...), is IDEM_OK with the outcome in
 * `struct idem_result`: branch on `result.outcome`.
 *
 * Threads. A `struct idem_client` is thread-safe: any number of threads may call it at once.
 * It keeps a pool of connection sets (one TCP or TLS connection per node in each); a call
 * takes a free set from the pool (or opens a new one) for its duration and puts it back
 * afterwards, so concurrent calls run in parallel over separate connections and share what
 * the client learned about the leader. The pool grows to the largest number of concurrent
 * calls seen; its connections stay open until idem_client_close(). A `struct idem_async`
 * belongs to its libuv loop: call it only from the loop's thread.
 *
 * Ownership, in short: strings and buffers passed in are borrowed for the duration of the
 * call (the library copies what it keeps); results are filled into caller-provided structs
 * whose inner pointers belong to the library until idem_result_free().
 *
 * Wire: idemd's binary RPC (proto/idem.proto): a 4-byte big-endian length, then a packed
 * protobuf message, over TCP or (struct idem_options.tls_*) TLS 1.2+. In the synchronous
 * client, name resolution (getaddrinfo) is not bounded by the deadline: use numeric
 * addresses where that matters (the asynchronous client resolves off the loop, and its
 * deadlines do bound it). */
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define IDEM_API __attribute__((visibility("default")))
#else
#define IDEM_API
#endif

/* ---- errors -------------------------------------------------------------------------- */

/* Error codes (negative; IDEM_OK is 0), with their idem_strerror() text. */
#define IDEM_ERRNO_MAP(X)                                                                     \
    X(IDEM_OK, 0, "ok")                                                                       \
    X(IDEM_EINVAL, -1, "invalid argument")                                                    \
    X(IDEM_ENOMEM, -2, "out of memory")                                                       \
    X(IDEM_EUNAVAILABLE, -3, "unavailable: no answer from a leader before the deadline")     \
    X(IDEM_EPROTO, -4, "protocol error: an answer that does not decode or has no result")     \
    X(IDEM_ETOOBIG, -5, "request larger than the frame limit (client's or node's)")          \
    X(IDEM_ESYS, -6, "system error")                                                          \
    X(IDEM_ECANCELED, -7, "canceled: the client was closed before an answer")                 \
    X(IDEM_ETLS, -8, "TLS setup failed (certificate, key or CA file)")                        \
    X(IDEM_ECLOSED, -9, "the client is closing")

enum idem_error {
#define IDEM__ERRNO_ENUM(name, value, text) name = value,
    IDEM_ERRNO_MAP(IDEM__ERRNO_ENUM)
#undef IDEM__ERRNO_ENUM
};

/* A static description of `err` (one of enum idem_error); "unknown error" for anything
 * else. Never NULL. */
IDEM_API const char *idem_strerror(int err);

/* ---- limits -------------------------------------------------------------------------- */

/* The largest frame (packed message, without the 4-byte length) the client sends or
 * accepts. A larger incoming length is a protocol error and closes the connection. */
#define IDEM_MAX_FRAME (16u << 20)

/* The result detail (with IDEM_OUTCOME_INVALID) of a node's answer to a request frame
 * larger than its max_frame_bytes. The node skips that frame and keeps the connection;
 * libidem turns the answer into IDEM_ETOOBIG for that request only: it is definite, the
 * same request will never fit. */
#define IDEM_FRAME_TOO_LARGE "frame_too_large"

/* At most this many nodes (seeds plus learned leaders) per client. Once the table is full,
 * redirects to further unknown addresses are ignored (the call keeps trying the seeds). */
#define IDEM_NODES_MAX 64

/* Length of an attempt id made by idem_attempt_id_new(), without the NUL. */
#define IDEM_ATTEMPT_ID_HEX 32

/* Length of a fingerprint: SHA-256. */
#define IDEM_FINGERPRINT_LEN 32

/* ---- outcomes and enums (numbered as in proto/idem.proto) ----------------------------- */

/* What the cluster answered (docs/contract.md). */
enum idem_outcome {
    IDEM_OUTCOME_UNSPECIFIED = 0,
    IDEM_OUTCOME_ACQUIRED = 1,        /* claim: run the business now (token, lease) */
    IDEM_OUTCOME_REPLAY = 2,          /* claim: the stored response (result.response) */
    IDEM_OUTCOME_IN_PROGRESS = 3,     /* claim: another attempt holds the lease (retry_after) */
    IDEM_OUTCOME_MISMATCH = 4,        /* claim: same key, different fingerprint */
    IDEM_OUTCOME_LEASE_EXPIRED = 5,   /* claim: the holder's lease passed, policy conflict */
    IDEM_OUTCOME_OUTCOME_UNKNOWN = 6, /* claim: quarantined until an operator resolves it */
    IDEM_OUTCOME_EXPIRED = 7,         /* claim: the key's record expired (tombstone) */
    IDEM_OUTCOME_OK = 8,              /* complete, release, renew */
    IDEM_OUTCOME_LEASE_LOST = 9,      /* complete, release, renew: not the holder's token */
    IDEM_OUTCOME_NOT_FOUND = 10,      /* complete, release, renew, get */
    IDEM_OUTCOME_QUOTA_EXCEEDED = 11, /* claim, complete: the tenant's quota */
    IDEM_OUTCOME_INVALID = 12,        /* the request is malformed (result.detail says why) */
    IDEM_OUTCOME_UNAVAILABLE = 13,    /* never in a result: retried, then IDEM_EUNAVAILABLE */
    IDEM_OUTCOME_NOT_LEADER = 14,     /* never in a result: redirects are followed */
    IDEM_OUTCOME_UNAUTHENTICATED = 15,
    IDEM_OUTCOME_FORBIDDEN = 16,
};

/* The name of an outcome: "acquired", "replay", "in_progress", "mismatch",
 * "lease_expired", "outcome_unknown", "expired", "ok", "lease_lost", "not_found",
 * "quota_exceeded", "invalid", "unavailable", "not_leader", "unauthenticated",
 * "forbidden"; "unspecified" for 0 and "unrecognized" for values this library does not
 * know. A static string, never NULL. */
IDEM_API const char *idem_outcome_name(int outcome);

/* How an attempt ended, for idem_complete() (docs/contract.md). */
enum idem_completion {
    IDEM_COMPLETION_SUCCEEDED = 1,    /* replayed to every retry */
    IDEM_COMPLETION_FAILED_FINAL = 2, /* a failure with side effects: replayed as well */
    IDEM_COMPLETION_UNKNOWN = 3,      /* side effects unknown: quarantined until resolved */
};

/* What a claim does when it finds a processing record whose lease passed. */
enum idem_policy {
    IDEM_POLICY_DEFAULT = 0, /* the server's default: conflict */
    IDEM_POLICY_CONFLICT = 1,
    IDEM_POLICY_TAKEOVER = 2,
};

/* The state of a record (idem_get). */
enum idem_state {
    IDEM_STATE_UNSPECIFIED = 0,
    IDEM_STATE_PROCESSING = 1,
    IDEM_STATE_COMPLETED = 2,
    IDEM_STATE_QUARANTINED = 3,
    IDEM_STATE_TOMBSTONE = 4,
    IDEM_STATE_RELEASED = 5,
};

/* ---- plain data ---------------------------------------------------------------------- */

/* One stored response header. Names are lower case. */
struct idem_header {
    const char *name;
    const uint8_t *value;
    size_t value_len;
};

/* A response as the cluster stores and replays it. As an input (idem_complete, idem_run's
 * business function) every pointer is the caller's and is only read; in a result every
 * pointer belongs to the result (see idem_result_free). */
struct idem_response {
    uint32_t status;                   /* e.g. an HTTP status */
    const struct idem_header *headers; /* n_headers entries; NULL when 0 */
    size_t n_headers;
    const uint8_t *body; /* inline body; NULL when body_len is 0 */
    size_t body_len;
    const char *body_ref;       /* where a large body lives instead; NULL or "" when none */
    const uint8_t *body_sha256; /* 32 bytes, or NULL */
};

/* The record of a key, as idem_get returns it. */
struct idem_record {
    int state; /* enum idem_state */
    uint64_t token;
    uint64_t created_at_ms;     /* Unix ms, leader's clock */
    uint64_t lease_deadline_ms; /* Unix ms */
    uint64_t expires_at_ms;     /* Unix ms */
    int completion;             /* enum idem_completion, or 0 */
    uint8_t fingerprint[IDEM_FINGERPRINT_LEN];
    size_t fingerprint_len; /* 32, or 0 when the record carries none */
};

/* The answer to one call. The caller provides the struct (e.g. on its stack); the library
 * fills it and owns what its pointers point to; idem_result_free() releases that. A
 * function that fails (returns a negative code) leaves the result zeroed, with `detail`
 * describing the failure where there is one. */
struct idem_result {
    int outcome;                /* enum idem_outcome */
    uint64_t token;             /* acquired: the fencing token (strictly increasing) */
    uint64_t lease_deadline_ms; /* acquired, renew: the lease's end, Unix ms */
    uint64_t lease_ms;          /* acquired, renew: the lease granted, ms (0: the node did
                                 * not say); unlike lease_deadline_ms, free of clock skew */
    uint64_t retry_after_ms;    /* in_progress: when a retry may succeed */
    uint64_t expires_at_ms;     /* when the record's ttl ends, Unix ms */
    int takeover;               /* acquired by takeover of an expired lease */
    uint64_t previous_token;    /* with takeover: the token that was fenced off */
    int has_response;           /* replay, get, idem_run: `response` is set */
    struct idem_response response;
    int has_record; /* get: `record` is set */
    struct idem_record record;
    /* idem_run only: whether the business function ran, what it said (enum
     * idem_run_class) and the outcome of the complete or release that followed. */
    int ran;
    int run_class;
    int finish_outcome;
    /* The server's or the library's explanation ("" when none). Never contains the key. */
    char detail[256];
    void *priv_; /* the library's; do not touch */
};

/* Frees what `r` points to and zeroes it. Accepts NULL and a zeroed or already freed
 * result. */
IDEM_API void idem_result_free(struct idem_result *r);

/* Moves a result: *dst takes everything `src` owned and `src` is zeroed. Used in an async
 * callback to keep the result beyond the callback. Neither may be NULL. */
IDEM_API void idem_result_move(struct idem_result *dst, struct idem_result *src);

/* ---- helpers ------------------------------------------------------------------------- */

/* Writes a fresh random attempt id (IDEM_ATTEMPT_ID_HEX lowercase hex characters and a
 * NUL) into `out` (OUT). Returns IDEM_OK, or IDEM_ESYS when the random source failed. */
IDEM_API int idem_attempt_id_new(char out[IDEM_ATTEMPT_ID_HEX + 1]);

/* out (OUT) = SHA-256 of the `len` bytes at `data` (borrowed): a fingerprint of whatever
 * canonical form of the business request the caller chooses (every retry of one intent
 * must produce the same bytes). Returns IDEM_OK, or IDEM_EINVAL when data is NULL and len
 * is not 0. */
IDEM_API int idem_fingerprint(const void *data, size_t len,
                              uint8_t out[IDEM_FINGERPRINT_LEN]);

/* Checks a seed list without creating a client: returns IDEM_OK, or IDEM_EINVAL and a
 * description of the first problem ("entry 2 \"localhost\": missing :port") in `why`
 * (OUT, caller's buffer of `why_len` bytes, always NUL-terminated; may be NULL). `seeds`
 * is borrowed. */
IDEM_API int idem_seeds_check(const char *seeds, char *why, size_t why_len);

/* ---- clients ------------------------------------------------------------------------- */

/* How to reach the cluster. Every string is borrowed by idem_client_open() and
 * idem_async_open(), which copy or load what they keep; NULL means "not set". */
struct idem_options {
    /* "host:port,host:port,...": the seeds (IPv6 as "[addr]:port"; spaces around commas
     * ignored; at most IDEM_NODES_MAX). Required. */
    const char *seeds;
    /* The tenant's (or admin's) bearer token, sent with every request. */
    const char *token;
    /* Deadline of calls that pass 0; 0 here means 5000 ms. */
    uint32_t default_deadline_ms;
    /* TLS: on when `tls` is non-zero or any tls_* file is set. The server certificate is
     * verified against tls_ca_file (PEM; NULL: the system's default CA store) and its name
     * against the node's host (DNS name or IP address), or against tls_server_name when set.
     * tls_cert_file + tls_key_file (PEM) present a client certificate. */
    int tls;
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_server_name;
    /* The largest request (packed, without the 4-byte length) the client sends; larger
     * ones fail at once with IDEM_ETOOBIG. 0: IDEM_MAX_FRAME (also the cap; at least 1024).
     * Set it to the servers' rpc.max_frame_bytes to refuse such requests without a round
     * trip; a node refusing one answers with IDEM_FRAME_TOO_LARGE, which libidem reports
     * as IDEM_ETOOBIG too. A command must also fit one log entry: a complete within the
     * frame limit but larger than the leader's batch.max_bytes (default 1 MiB, against
     * rpc.max_frame_bytes' 4 MiB + 128 KiB) is answered with outcome invalid ("command too
     * large for a log entry"), definite as well. */
    uint32_t max_frame_bytes;
};

struct idem_client;

/* Creates a thread-safe synchronous client from `opts` (borrowed). No connection is made
 * yet. On success returns IDEM_OK and stores the client in *out (OUT; the caller owns it
 * and frees it with idem_client_close()). Returns IDEM_EINVAL for a malformed seed list
 * (idem_seeds_check() says why) or options, IDEM_ETLS when a TLS file cannot be loaded,
 * IDEM_ENOMEM, IDEM_ESYS when the client's mutex cannot be initialised
 * (pthread_mutex_init); *out is then NULL, and `why` (may be NULL) receives the reason,
 * always NUL-terminated. */
IDEM_API int idem_client_open(const struct idem_options *opts, struct idem_client **out,
                              char *why, size_t why_len);

/* Shorthand for idem_client_open() with only seeds and token (plain TCP). */
IDEM_API int idem_client_new(const char *seeds, const char *token, struct idem_client **out);

/* Closes every connection and frees the client. No call may be running on it. Accepts
 * NULL. */
IDEM_API void idem_client_close(struct idem_client *c);

/* A description of the last failure on this client, naming the node ("127.0.0.1:7001:
 * connect: Connection refused"); "" when there was none. A copy in a buffer of the calling
 * thread's own, taken under the client's lock (safe while other threads make calls):
 * valid until this thread calls idem_client_errmsg() again. With several threads it may
 * describe another thread's call (each call's own explanation is in its result's
 * `detail`). Never contains the bearer token. */
IDEM_API const char *idem_client_errmsg(const struct idem_client *c);

/* The address of the node that answered the last successful call (the leader, as far as
 * the client knows), or NULL before any, and again once that node let a later call's
 * attempt time out (the client then tries other nodes). Borrowed: valid until the client
 * is closed. */
IDEM_API const char *idem_client_leader(const struct idem_client *c);

/* ---- synchronous calls --------------------------------------------------------------- */
/* Each returns IDEM_OK with `*out` (OUT, caller-provided, need not be initialised) filled
 * with the cluster's answer, or a negative code with *out zeroed (detail set): IDEM_EINVAL
 * (NULL client/key/out, an empty key or attempt id, a missing fingerprint or response),
 * IDEM_EUNAVAILABLE (no leader answered before the deadline: retry with the same key and
 * attempt id), IDEM_ETOOBIG (larger than the client's max_frame_bytes, or refused as
 * larger than the node's: definite, do not retry), IDEM_ENOMEM, IDEM_EPROTO (the node's
 * answer carries no result, or, idem_get, a stored response that does not decode; the
 * request may have been applied: retry with the same key), IDEM_ESYS (idem_claim without
 * an attempt id: the random source failed). After IDEM_OK the caller
 * frees *out with idem_result_free(). `key` is a NUL-terminated string of 1-255 bytes (the server
 * checks its alphabet and answers IDEM_OUTCOME_INVALID). Keys never appear in `detail` or
 * idem_client_errmsg(). */

/* Options of a claim; a NULL pointer means all defaults. */
struct idem_claim_opts {
    /* The attempt id (1-64 bytes, NUL-terminated; "" is IDEM_EINVAL: without one a retry
     * could not get its own lease back). NULL: the call makes a fresh one and keeps it
     * across its own retries; pass your own (idem_attempt_id_new) to retry the claim
     * yourself after IDEM_EUNAVAILABLE and get the same lease back. */
    const char *attempt_id;
    uint64_t lease_ms; /* 0: the tenant's default */
    uint64_t ttl_ms;   /* 0: the tenant's default */
    int policy;        /* enum idem_policy */
    uint32_t deadline_ms;
};

/* Claims `key` for a request whose fingerprint is `fingerprint` (32 bytes, borrowed).
 * Outcomes: acquired (token, lease_deadline_ms; takeover/previous_token), replay
 * (response), in_progress (retry_after_ms), mismatch, lease_expired, outcome_unknown,
 * expired, quota_exceeded, invalid, unauthenticated, forbidden. */
IDEM_API int idem_claim(struct idem_client *c, const char *key,
                        const uint8_t fingerprint[IDEM_FINGERPRINT_LEN],
                        const struct idem_claim_opts *opts, struct idem_result *out);

/* Completes the attempt holding `token` with `completion` (enum idem_completion) and the
 * response to store (`response`, borrowed; required, except with IDEM_COMPLETION_UNKNOWN,
 * where NULL or a response whose status is 0 stores none: the record is quarantined with
 * no response). Outcomes: ok, lease_lost, not_found, quota_exceeded, invalid. Repeating it
 * with the same token answers ok. */
IDEM_API int idem_complete(struct idem_client *c, const char *key, uint64_t token,
                           int completion, const struct idem_response *response,
                           uint32_t deadline_ms, struct idem_result *out);

/* Releases the attempt holding `token` (its failure changed nothing; the next claim runs
 * the business again). Outcomes: ok, lease_lost, not_found. */
IDEM_API int idem_release(struct idem_client *c, const char *key, uint64_t token,
                          uint32_t deadline_ms, struct idem_result *out);

/* Extends the lease of `token` to now + lease_ms (0: the tenant's default). Outcomes: ok
 * (lease_deadline_ms), lease_lost, not_found. */
IDEM_API int idem_renew(struct idem_client *c, const char *key, uint64_t token,
                        uint64_t lease_ms, uint32_t deadline_ms, struct idem_result *out);

/* Reads the record of `key` (linearizable: through the leader's log). Outcomes: ok
 * (record, and response when one is stored), not_found. */
IDEM_API int idem_get(struct idem_client *c, const char *key, uint32_t deadline_ms,
                      struct idem_result *out);

/* ---- running a business function under a claim ----------------------------------------- */

/* How the business function classifies what it did (docs/contract.md). */
enum idem_run_class {
    IDEM_RUN_SUCCEEDED = 1,    /* complete(succeeded): retries replay the response */
    IDEM_RUN_FAILED_FINAL = 2, /* complete(failed_final): a failure with side effects */
    IDEM_RUN_RETRYABLE = 3,    /* release: nothing happened; the next try runs again */
    IDEM_RUN_UNKNOWN = 4,      /* complete(unknown): quarantined until resolved */
};

/* The business function: does the work and fills `response` (OUT, zeroed on entry) with
 * what retries should get back (ignored for IDEM_RUN_RETRYABLE; for IDEM_RUN_UNKNOWN it may
 * be left as it is, status 0: the record is then quarantined with no response). The memory
 * the response points to is the function's (e.g. in `arg`) and must stay valid until
 * idem_run() returns; idem_run() copies it into its result. `token` is the fencing token, to pass to
 * downstream systems that reject stale holders. Returns an enum idem_run_class; anything
 * else counts as IDEM_RUN_UNKNOWN. It runs on the thread that called idem_run(). */
typedef int (*idem_run_fn)(void *arg, uint64_t token, struct idem_response *response);

/* Runs `fn` at most once per key, across every process that uses the same key:
 * claim (opts as in idem_claim; lease_ms 0 means the tenant's default) →
 * - acquired: calls fn while a background thread renews the lease every third of it (so
 *   a slow fn keeps its claim): the first renewal a third of the lease the claim answered
 *   with (lease_ms; on a holder's own retry of a claim, with the same attempt id, what is
 *   left of its lease), at once when that is under 20 ms; the next ones a third of the
 *   lease the last renewal granted. A renewal that fails is tried again an eighth of that
 *   later, each try bounded by the lease left and 2 s; if a renewal answers lease_lost, or
 *   none was answered before the lease ended, the result's detail says so, also when the
 *   complete or release that follows fails or answers otherwise); then, by fn's
 *   class, complete (succeeded / failed_final / unknown, with fn's response) or release
 *   (retryable). out->ran = 1, run_class, finish_outcome (ok; lease_lost when another
 *   holder took over; or what else the complete answered, e.g. quota_exceeded when the
 *   tenant's bytes quota has no room for the response: anything but ok means fn's response
 *   was not recorded, and detail gives the cluster's reason), response = fn's (copied),
 *   outcome acquired, token.
 * - replay: fn is not called; out holds the stored response (outcome replay).
 * - any other outcome (in_progress, mismatch, ...): fn is not called; returned as is.
 * Returns IDEM_OK, or a negative code: before fn ran, as idem_claim (fn did not run);
 * IDEM_ESYS when the claim was acquired but the lease renewal thread cannot be started
 * (pthread_create): fn does not run (out->ran = 0) and the claim is released (detail says
 * whether the release succeeded; if not, the key is held until its lease ends); after fn
 * ran, the error of the complete or release (IDEM_EUNAVAILABLE once retried until
 * the deadline), with out->ran = 1, out->token and out->response (fn's) filled: the record
 * stays processing until the caller retries idem_complete() / idem_release() with that
 * token, or its lease expires. A response from fn that cannot be stored (a NULL or empty
 * header name, NULL data with a non-zero length) gives IDEM_EINVAL after fn ran: nothing
 * is copied or completed (out->ran = 1, out->token set, detail says why), and the record
 * stays processing as above. So does a complete (or release) that the cluster answers
 * `invalid` (nothing changed: e.g. a complete larger than the leader's batch.max_bytes,
 * 1 MiB by default, lets a log entry be): IDEM_EINVAL, out->finish_outcome invalid,
 * out->response fn's, detail the cluster's reason. The deadline of opts applies to each
 * call separately.
 * Call idem_result_free(out) in every case. */
IDEM_API int idem_run(struct idem_client *c, const char *key,
                      const uint8_t fingerprint[IDEM_FINGERPRINT_LEN],
                      const struct idem_claim_opts *opts, idem_run_fn fn, void *arg,
                      struct idem_result *out);

/* ---- asynchronous calls on a libuv loop ------------------------------------------------- */

struct uv_loop_s; /* uv_loop_t */
struct idem_async;

/* Called exactly once per accepted request, on the loop's thread: status IDEM_OK with
 * `result` set (as for the synchronous call), or a negative code (IDEM_EUNAVAILABLE when
 * the deadline passed, IDEM_ECANCELED when idem_async_close() ran first, IDEM_ETOOBIG when
 * the node refused the request as larger than its max_frame_bytes, IDEM_EPROTO as for the
 * synchronous calls, ...) with
 * `result` zeroed and its detail set. `result` belongs to the library and is freed after
 * the callback returns, unless the callback moves it out with idem_result_move(). The
 * callback may issue new requests, and may call idem_async_close(). */
typedef void (*idem_async_cb)(struct idem_async *a, int status, struct idem_result *result,
                              void *data);

/* Called once when idem_async_close() finished: every handle is closed; the memory of `a`
 * is freed right after this returns. */
typedef void (*idem_async_close_cb)(struct idem_async *a, void *data);

/* Creates an asynchronous client on `loop` (borrowed; must outlive the client), with the
 * same options as idem_client_open() (`opts` borrowed; TLS included). Requests are
 * pipelined over one connection to the leader and answered out of order (the requests
 * submitted before the loop next runs its timers are written together), with the same
 * leader-following, retry and deadline rules as the synchronous calls. Host names are
 * resolved on libuv's thread pool (uv_getaddrinfo; the first address is used). No
 * connection is made before the first request. Returns IDEM_OK and *out (OUT; freed
 * through idem_async_close()), or IDEM_EINVAL / IDEM_ETLS / IDEM_ENOMEM / IDEM_ESYS (one
 * of its libuv timers cannot be created: uv_timer_init) with `why` (may be NULL)
 * describing the problem and *out NULL. After IDEM_ESYS the timers made before the one
 * that failed are closing on `loop`: run it (e.g. uv_run(loop, UV_RUN_NOWAIT)) before
 * uv_loop_close(), which frees them. Its connection, once made, keeps `loop` alive (as
 * any open libuv handle does) until idem_async_close() has finished: uv_run(loop,
 * UV_RUN_DEFAULT) does not return when the last callback has run while the client is
 * open; close it from that callback, or drive the loop with UV_RUN_ONCE. */
IDEM_API int idem_async_open(struct uv_loop_s *loop, const struct idem_options *opts,
                             struct idem_async **out, char *why, size_t why_len);

/* The asynchronous calls. Arguments as for the synchronous ones (borrowed, copied before
 * return). Return IDEM_OK when the request was accepted (cb will be called exactly once,
 * never from within this call), or a negative code (IDEM_EINVAL, IDEM_ENOMEM,
 * IDEM_ETOOBIG, IDEM_ECLOSED after idem_async_close, IDEM_ESYS when the random source (a
 * claim without an attempt id) or the request's timer failed) and cb is never called. */
IDEM_API int idem_async_claim(struct idem_async *a, const char *key,
                              const uint8_t fingerprint[IDEM_FINGERPRINT_LEN],
                              const struct idem_claim_opts *opts, idem_async_cb cb,
                              void *data);
IDEM_API int idem_async_complete(struct idem_async *a, const char *key, uint64_t token,
                                 int completion, const struct idem_response *response,
                                 uint32_t deadline_ms, idem_async_cb cb, void *data);
IDEM_API int idem_async_release(struct idem_async *a, const char *key, uint64_t token,
                                uint32_t deadline_ms, idem_async_cb cb, void *data);
IDEM_API int idem_async_renew(struct idem_async *a, const char *key, uint64_t token,
                              uint64_t lease_ms, uint32_t deadline_ms, idem_async_cb cb,
                              void *data);
IDEM_API int idem_async_get(struct idem_async *a, const char *key, uint32_t deadline_ms,
                            idem_async_cb cb, void *data);

/* The number of requests accepted and not yet called back. */
IDEM_API size_t idem_async_pending(const struct idem_async *a);

/* Starts closing: every pending request's callback is called with IDEM_ECANCELED (exactly
 * once; before this function returns), then the connection and timers close on the loop
 * and close_cb (may be NULL) is called; `a` is freed after it. New requests are refused
 * with IDEM_ECLOSED from now on. Calling it twice is a no-op. */
IDEM_API void idem_async_close(struct idem_async *a, idem_async_close_cb close_cb,
                               void *data);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_H */
