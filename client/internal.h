/* internal: what libidem's files share (addresses, request building, results, TLS, the
 * synchronous client's structures); not installed, not part of the API. */
#ifndef IDEM_CLIENT_INTERNAL_H
#define IDEM_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <uv.h>

#include "idem_rpc.h"
#include "tls_stream.h"

#define IDEM_ERRMSG_LEN 512
#define IDEM_TLS_BUF 16384 /* the synchronous client's TLS buffer (roundtrip.c) */
#define IDEM_BACKOFF_MIN_MS 10
#define IDEM_BACKOFF_MAX_MS 200
#define IDEM_REDIRECTS_FREE 1 /* redirects followed without backing off, per call */
#define IDEM_DEFAULT_DEADLINE_MS 5000u
/* The shortest time one attempt on one node (connect, TLS handshake, write, answer) gets
 * before the call moves on to another node: each attempt gets a third of what is left of
 * the call, but at least this (and never more than what is left). */
#define IDEM_ATTEMPT_MIN_MS 250u

/* ---- messages (idem.c) ---- */
void IdemWhyf(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The last word of each node tried (what was last said of it), in the order first tried, so
 * that a call no leader answered says what every node said, not only the last one tried
 * (during a quorum loss: refused connections, and a node up without a leader). The
 * synchronous client keeps one per call, the asynchronous one per client since a leader
 * last answered. At most IDEM_WORDS_MAX nodes, each cut to IDEM_WORD_LEN bytes. */
#define IDEM_WORDS_MAX 8
#define IDEM_WORD_LEN 160
struct idem_words {
    size_t n;
    size_t node[IDEM_WORDS_MAX]; /* index in the client's node table */
    char said[IDEM_WORDS_MAX][IDEM_WORD_LEN];
};
/* Notes `said` as node's last word (replacing an earlier one). */
void IdemWordsNote(struct idem_words *w, size_t node, const char *said);
/* "A; B; C" into out (len bytes), or "" when nothing was noted. */
void IdemWordsJoin(const struct idem_words *w, char *out, size_t len);

/* ---- addresses (addr.c) ---- */

/* One node. Immutable once published in a client's table (the strings are freed only
 * when the client is). */
struct idem_node {
    char *addr; /* "host:port" as given (trimmed); owned */
    char *host; /* without brackets; owned */
    char *port; /* owned */
};

/* Splits "host:port" / "[v6]:port" (len bytes at s). With host/port non-NULL stores
 * malloc'd copies (OUT). IDEM_OK, IDEM_EINVAL (why), IDEM_ENOMEM. */
int IdemAddrSplit(const char *s, size_t len, char **host, char **port, char *why,
                  size_t why_len);
/* Parses a seed list into nodes[0..*n) (OUT). On error nothing is kept. */
int IdemSeedsParse(const char *seeds, struct idem_node *nodes, size_t *n, char *why,
                   size_t why_len);
/* Fills `n` from the `len` bytes at `s`. On error `n` holds nothing. */
int IdemNodeInit(struct idem_node *n, const char *s, size_t len, char *why, size_t why_len);
void IdemNodeFree(struct idem_node *n);

/* ---- frames (idem.c) ---- */

/* The largest request body the client sends: opts->max_frame_bytes, or IDEM_MAX_FRAME
 * when 0 or larger (at least 1024). */
uint32_t IdemMaxFrame(const struct idem_options *opts);
/* Whether `m` is a node's answer that our request frame exceeded its max_frame_bytes
 * (outcome INVALID, result detail "frame_too_large"): a definite IDEM_ETOOBIG. */
bool IdemFrameTooLarge(const Idem__Response *m);
/* Says into why (why_len bytes) that node `addr` sent a frame prefix (hdr) declaring `len`
 * bytes, more than IDEM_MAX_FRAME: as "answers HTTP" when the 4 bytes are the start of an
 * HTTP status line (an address that is a node's HTTP listener, not its RPC one). */
void IdemFrameTooLargeWhy(char *why, size_t why_len, const char *addr, const uint8_t *hdr,
                          uint32_t len);

/* What the body of one answer frame holds, as both clients take it (IdemResponseDecode). */
enum idem_answer {
    IDEM_ANSWER_BAD,     /* not a Response: the connection is unusable (why says so) */
    IDEM_ANSWER_REFUSED, /* request_id 0: the node could not read a request frame of ours;
                          * it applied nothing and closes the connection */
    IDEM_ANSWER_OTHER,   /* the answer to another request than the one awaited */
    IDEM_ANSWER_MINE,    /* the answer to the request awaited (awaiting none: to a request) */
};
/* Decodes the `len`-byte body of an answer frame (at p, borrowed) from node `addr`, awaiting
 * the answer to request `expect` (0: none in particular, the caller matches the ids). *out
 * (OUT) is the Response, the caller's to free, for IDEM_ANSWER_REFUSED and IDEM_ANSWER_MINE;
 * NULL otherwise. why (why_len bytes) is written for IDEM_ANSWER_BAD only, and never with
 * the frame's bytes. */
enum idem_answer IdemResponseDecode(const uint8_t *p, size_t len, uint64_t expect, const char *addr,
                                    Idem__Response **out, char *why, size_t why_len);

/* ---- time and randomness (idem.c) ---- */
uint64_t IdemNowMs(void);                    /* CLOCK_MONOTONIC */
uint64_t IdemRemainingMs(uint64_t deadline); /* 0 once passed */
uint64_t IdemRngSeed(void);                  /* never 0 */
uint64_t IdemRngNext(uint64_t *state);
/* The jittered sleep for *backoff ms (a quarter at most shaved off), then doubles it. */
uint64_t IdemBackoffNext(uint64_t *backoff, uint64_t *rng);

/* ---- operations (ops.c) ---- */

enum idem_op_kind { IDEM_OP_CLAIM = 1, IDEM_OP_COMPLETE, IDEM_OP_RELEASE, IDEM_OP_RENEW, IDEM_OP_GET };

/* One operation, every pointer borrowed. */
struct idem_op {
    enum idem_op_kind kind;
    const char *key;
    const uint8_t *fingerprint; /* claim */
    const char *attempt_id;     /* claim */
    uint64_t lease_ms;          /* claim, renew */
    uint64_t ttl_ms;            /* claim */
    int policy;                 /* claim */
    uint64_t token;             /* complete, release, renew */
    int completion;             /* complete */
    const struct idem_response *response; /* complete */
};

/* A Request built from an op; the messages borrow the op's memory. */
struct idem_built {
    Idem__Request req;
    Idem__ClaimRequest claim;
    Idem__CompleteRequest complete;
    Idem__ReleaseRequest release;
    Idem__RenewRequest renew;
    Idem__GetRequest get;
    Idem__StoredResponse sr;
    Idem__Header *hdrs;      /* owned */
    Idem__Header **hdr_ptrs; /* owned */
};

/* Checks an op (IDEM_EINVAL with the reason in `why`) and builds its request into *b;
 * IdemBuiltFree() afterwards, also after an error. */
int IdemOpBuild(const struct idem_op *op, struct idem_built *b, char *why, size_t why_len);
void IdemBuiltFree(struct idem_built *b);
/* The claim `op` of key, fingerprint and opts (NULL: the defaults), with opts' attempt id
 * or a new random one made in `attempt` (which op then borrows, as it borrows the rest).
 * IDEM_OK, or IDEM_ESYS when no random attempt id could be made. */
int IdemClaimOp(const char *key, const uint8_t *fingerprint, const struct idem_claim_opts *opts,
                char attempt[IDEM_ATTEMPT_ID_HEX + 1], struct idem_op *op);

/* Fills *out from an answer, taking ownership of `m` (freed by idem_result_free).
 * IDEM_OK or IDEM_ENOMEM (m freed, *out zeroed). */
int IdemResultFill(struct idem_result *out, Idem__Response *m);
/* Replaces out's response by a copy of `r` (borrowed) that out owns. IDEM_OK/ENOMEM. */
int IdemResultCopyResponse(struct idem_result *out, const struct idem_response *r);
/* Zeroes *out and sets its detail. */
void IdemResultFail(struct idem_result *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- the synchronous client (idem.c, roundtrip.c) ---- */

/* One connection per node, owned by one call at a time. */
struct idem_conns {
    int fd[IDEM_NODES_MAX];               /* -1 when not connected */
    struct idem_tls *tls[IDEM_NODES_MAX]; /* with TLS: the stream on fd; else NULL */
    uint8_t *wbuf;                        /* outgoing frame; owned */
    size_t wbuf_cap;
    uint8_t *rbuf; /* incoming frame; owned */
    size_t rbuf_cap;
    uint8_t *tbuf; /* TLS: IDEM_TLS_BUF bytes of ciphertext, in or out; owned, NULL until
                    * the first TLS connection */
    char errmsg[IDEM_ERRMSG_LEN]; /* this call's last failure */
    SLIST_ENTRY(idem_conns) link; /* in the pool's free list */
};

struct idem_client {
    pthread_mutex_t mu;
    struct idem_node nodes[IDEM_NODES_MAX]; /* seeds first, then learned leaders */
    size_t n_nodes;
    size_t n_seeds; /* >= 1 */
    size_t current; /* the node to try first: the last one that answered */
    bool answered;  /* whether `current` was set by an answer (idem_client_leader) */
    uint8_t *token; /* owned; NULL when token_len == 0 */
    size_t token_len;
    uint32_t default_deadline_ms;
    uint32_t max_frame;       /* the largest request body sent */
    struct idem_tls_ctx *tls; /* NULL: plain TCP; owned */
    uint64_t next_request_id;
    uint64_t rng; /* xorshift64 state for backoff jitter; never 0 */
    SLIST_HEAD(, idem_conns) free_conns;
    char errmsg[IDEM_ERRMSG_LEN];
};

/* Formats the failure of the call that holds connection set k. */
#define connErrf(k, ...) IdemWhyf((k)->errmsg, sizeof(k)->errmsg, __VA_ARGS__)

/* What one round trip to one node came to. */
enum rt_result {
    RT_OK,      /* *resp holds the response to our request */
    RT_CONN,    /* the connection failed (connect, TLS, write, read, EOF); it is closed */
    RT_TIMEOUT, /* the deadline passed; the connection is closed */
    RT_PROTO,   /* the node sent bytes that are not a valid frame; the connection is closed */
    RT_NOMEM,
};

/* strerror_r's text for err into buf (thread-safe); returns buf. */
const char *IdemErrnoText(int err, char *buf, size_t len);

/* A connection set for one call, from c's pool or new (NULL: out of memory). */
struct idem_conns *IdemConnsGet(struct idem_client *c);
/* Puts `k` back in c's pool and publishes its last message as the client's. */
void IdemConnsPut(struct idem_client *c, struct idem_conns *k);
/* Closes k's connections and frees it, wiping the frame buffer (the token). */
void IdemConnsFree(struct idem_conns *k);
/* Packs `req` into k->wbuf as one frame, with request id `id`, the time left until
 * `deadline` and c's token (unless req has one). IDEM_OK, IDEM_ETOOBIG or IDEM_ENOMEM (the
 * reason in k->errmsg); *len (OUT) is the frame's length with its prefix. */
int IdemFrameBuild(struct idem_client *c, struct idem_conns *k, const Idem__Request *req,
                   uint64_t id, uint64_t deadline, size_t *len);
/* One request (the frame in k->wbuf, frame_len bytes), one answer (*resp, OUT, the
 * Response to `id` or one with request id 0), on node i within the deadline: connects when
 * needed, and reconnects once when a kept-alive connection turns out closed. On anything
 * but RT_OK the connection is closed, and k->errmsg says why. */
enum rt_result IdemRoundTrip(struct idem_client *c, struct idem_conns *k, size_t i,
                             size_t frame_len, uint64_t id, uint64_t deadline,
                             Idem__Response **resp);

/* ---- the asynchronous client (async.c, async_conn.c; raw calls to named nodes: async_node.c) ---- */

struct anode;

enum areqState {
    AREQ_WAITING, /* to be written when a connection is up */
    AREQ_SENT,    /* written on `sent_on`, waiting for the answer */
    AREQ_DELAYED, /* refused by a leader for load: waiting again from `retry_at` on */
    AREQ_DONE,    /* called back; its timer is closing */
    AREQ_FAILING, /* a raw call failed by a move: never written; its timer ends it */
};

struct areq {
    struct idem_async *a;
    TAILQ_ENTRY(areq) link; /* in a->reqs, in acceptance order */
    uint64_t id;
    uint8_t *body; /* packed Request without deadline_ms; owned */
    size_t body_len;
    uint64_t deadline; /* uv_now() ms */
    uint64_t retry_at; /* AREQ_DELAYED: uv_now() ms */
    char *refusal;     /* the last refusal for load it got (owned), or NULL */
    uint32_t deadline_ms;
    enum areqState state;
    struct aconn *sent_on;
    uv_timer_t timer; /* the deadline */
    idem_async_cb cb;
    /* A raw call (async_node.c): the node it goes to (NULL for a typed call), its callback,
     * the caller's request id (given back in the answer) and whether it may still follow a
     * redirect. */
    struct anode *named;
    idem_async_raw_cb raw_cb;
    uint64_t orig_id;
    bool may_redirect;
    const char *fail_reason; /* a raw call failed by a move (static), or NULL */
    void *data;
};

TAILQ_HEAD(areqs, areq);

/* A connection's life (async_conn.c); every change asserts the state it leaves. */
enum aconnState {
    ACONN_CONNECTING,  /* resolving the name or connecting TCP */
    ACONN_HANDSHAKING, /* TCP up, the TLS handshake running */
    ACONN_UP,          /* TCP up and, with TLS, the handshake done: requests may be written */
    ACONN_CLOSING,     /* its handle is closing: no reads, no writes, no requests */
};

struct aconn {
    struct idem_async *a;
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    const struct idem_node *peer; /* where it goes: a->nodes[node], or its named node's */
    size_t node;                  /* the leader connection's: its index in a->nodes */
    struct anode *named;          /* NULL: the leader connection (a->conn); else a named
                                   * node's (its `conn`) */
    enum aconnState state;
    bool resolving;       /* a lookup is outstanding (it holds a reference): a->resolver's
                           * (lookup) or else a uv_getaddrinfo (gai) */
    struct idem_lookup *lookup; /* the resolver's request, while it is outstanding */
    bool tcp_closed;      /* the TCP handle's close callback ran */
    struct idem_tls *tls; /* with TLS: the stream; owned */
    uint8_t *cbuf;        /* TLS: ciphertext read buffer; owned */
    uint8_t *rbuf;        /* plaintext read and not yet parsed; owned */
    size_t rlen, rcap;
    uint64_t quiet_since; /* uv_now() of the last byte read (or of the start, or of the
                           * last moment nothing was owed): the stall watch's reference */
    unsigned writes;      /* uv_write()s not called back yet (flush writes when none is) */
};

/* A node that raw calls named (async_node.c): its calls, waiting or sent, in acceptance
 * order, and its connection, kept open between calls. */
struct anode {
    struct idem_async *a;
    struct idem_node node; /* owned */
    struct areqs reqs;
    struct aconn *conn;     /* NULL: none */
    LIST_ENTRY(anode) link; /* in a->named */
};

struct awrite {
    uv_write_t w;
    struct aconn *conn;
    size_t len;
    uint8_t data[]; /* the frame */
};

struct idem_async {
    uv_loop_t *loop;
    struct idem_resolver *resolver; /* borrowed; NULL: names resolved on libuv's pool */
    struct idem_node nodes[IDEM_NODES_MAX]; /* seeds, then learned leaders */
    size_t n_nodes, n_seeds;
    size_t current;   /* the node to connect to next */
    size_t next_seed; /* the seed after `current` in rotation */
    uint8_t *token;
    size_t token_len;
    uint32_t default_deadline_ms;
    struct idem_tls_ctx *tls; /* NULL: plain TCP; owned */
    uint64_t next_id;
    uint64_t rng;
    uint64_t backoff;   /* the next reconnect delay after a failure */
    unsigned redirects; /* since the last answer from a leader */
    struct aconn *conn; /* NULL: none */
    uv_timer_t reconnect;
    bool reconnect_armed;
    uv_timer_t watch;   /* the stall watch; runs (unreferenced) while requests are pending */
    uv_timer_t kick;    /* zero-delay: writes the requests submitted since it was armed */
    uv_timer_t retry;   /* due at the earliest AREQ_DELAYED request's retry_at */
    uint32_t max_frame; /* the largest request body accepted */
    struct areqs reqs; /* typed calls accepted, not called back yet */
    size_t pending;    /* ... and raw ones (on their named nodes) */
    LIST_HEAD(, anode) named; /* the nodes raw calls named */
    idem_async_tls_failure_cb tls_failure_cb; /* NULL: none */
    void *tls_failure_data;
    unsigned handles; /* open uv handles we own: the reconnect, watch, kick and retry timers,
                       * request timers, conns (with a resolution pending, one more) */
    bool closing;
    idem_async_close_cb close_cb;
    void *close_data;
    char errmsg[IDEM_ERRMSG_LEN]; /* what the last connection failure was */
    struct idem_words words;      /* ... and each node's, since a leader last answered */
};

/* Frees `a` once closing and its last handle closed, after its close callback. */
void IdemAsyncMaybeFinish(struct idem_async *a);
/* Starts the deadline timer of `r` (its request packed; a new one), `on_deadline` called
 * after deadline_ms (0: the client's default) from now, and marks it waiting. IDEM_OK, or
 * IDEM_ESYS when the timer cannot be made (r is then untouched). */
int IdemAsyncReqStart(struct areq *r, uint32_t deadline_ms, uv_timer_cb on_deadline);
/* Calls the request back (exactly once) with `status` and `res` (freed afterwards unless
 * the callback moved it), and frees the request once its timer closed. */
void IdemAsyncReqFinish(struct areq *r, int status, struct idem_result *res);
/* The same for a raw call: `resp` (borrowed) with IDEM_OK, else NULL and a static reason. */
void IdemAsyncRawFinish(struct areq *r, int status, const Idem__Response *resp,
                        const char *reason);
/* IdemAsyncReqFinish with an empty result whose detail is the formatted text. */
void IdemAsyncReqFail(struct areq *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes waiting requests if the connection is up; starts one otherwise (async.c). */
void IdemAsyncFlush(struct idem_async *a);
/* Arms the zero-delay kick that writes what was submitted (typed and raw calls). */
void IdemAsyncKick(struct idem_async *a);
/* Writes the waiting requests from `*from` on (in their list, conn's) as one batch on
 * `conn` (up, no write queued); `*from` moves past them. False when the connection was
 * dropped, the batch waits in libuv's queue, or out of memory (the kick then tries again). */
bool IdemAsyncSendBatch(struct aconn *conn, struct areq **from);
/* Makes the retry timer due by `at` (uv_now() ms) at the latest. */
void IdemAsyncRetryArm(struct idem_async *a, uint64_t at);

/* Opens a connection to a->current (async_conn.c). */
void IdemAsyncConnStart(struct idem_async *a);
/* A new connection to `peer` (borrowed; it must outlive the connection's use), not yet
 * connecting: NULL (the reason in a->errmsg) when out of memory or libuv refuses a handle.
 * The caller makes it its own (a->conn, or a named node's) and then calls
 * IdemAsyncConnGo(). */
struct aconn *IdemAsyncConnNew(struct idem_async *a, const struct idem_node *peer);
/* Connects `conn`: at once for a numeric address, after resolving a name otherwise. */
void IdemAsyncConnGo(struct aconn *conn);
/* Drops `conn` (the current one): its sent requests wait again; the next connection goes
 * to node `next` after `delay` ms (0: on the next loop turn). */
void IdemAsyncConnDrop(struct idem_async *a, struct aconn *conn, size_t next, uint64_t delay);
/* What made a connection fail: what a raw call waiting on it is told (async_node.c). */
enum aconnFail {
    AFAIL_CONNECT,   /* resolve, connect, a handle */
    AFAIL_IO,        /* a read or write error */
    AFAIL_CLOSED,    /* the node closed the connection */
    AFAIL_REFUSED,   /* an answer with request id 0: the node could not read a frame */
    AFAIL_FRAME,     /* a frame too large or that does not decode */
    AFAIL_HANDSHAKE, /* the TLS handshake (certificate verification included) */
    AFAIL_TLS,       /* the TLS session, once up */
    AFAIL_NOMEM,
    AFAIL_ANSWER, /* the leader connection only: an answer that leaves this node */
};
/* Drops `conn` after a failure said in a->errmsg: the leader connection goes to the next
 * seed after a backoff; a named node's fails its calls (IdemNamedConnFail). */
void IdemAsyncConnFail(struct aconn *conn, enum aconnFail why);
/* Drops `conn` after a TLS failure (`what`: "handshake", "read", "write", "setup"), saying
 * it in a->errmsg and to the client's TLS failure callback. */
void IdemAsyncTlsFail(struct aconn *conn, const char *what);
/* Closes conn's handle (once); its memory goes once it closed and resolved. */
void IdemAsyncConnClose(struct aconn *conn);
/* What IdemAsyncConnWrite did with a write. */
enum writeResult {
    W_SENT,   /* all of it taken by the socket at once */
    W_QUEUED, /* (the rest) in libuv's queue: conn->writes counts it */
    W_FAILED, /* the connection was dropped */
};
/* Hands `wr` (taken) to conn's socket. */
enum writeResult IdemAsyncConnWrite(struct aconn *conn, struct awrite *wr);
/* TLS: writes what the session produced to the socket; false when the connection was
 * dropped. */
bool IdemAsyncTlsFlushOut(struct aconn *conn);

/* ---- raw calls to named nodes (async_node.c) ---- */

/* Writes the waiting calls of `n`, opening its connection when it has none. */
void IdemNamedFlush(struct anode *n);
/* IdemNamedFlush for every named node; frees those left without calls or a connection. */
void IdemNamedFlushAll(struct idem_async *a);
/* A named node's connection failed: it closes, and the node's calls fail (`why`). */
void IdemNamedConnFail(struct aconn *conn, enum aconnFail why);
/* An answer `m` (taken) on a named node's connection. False when the connection was
 * dropped. */
bool IdemNamedAnswer(struct aconn *conn, Idem__Response *m);
/* idem_async_close(): every raw call fails with IDEM_ECANCELED, every named connection
 * closes. */
void IdemNamedClose(struct idem_async *a);
/* Frees the named nodes (the client's memory goes). */
void IdemNamedFree(struct idem_async *a);

/* The sync client's call with its own error text (into `err`, may be NULL): the core of
 * idem_call, used by the typed calls. */
int IdemClientCall(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                   Idem__Response **resp, char *err, size_t err_len);
uint32_t IdemClientDefaultDeadline(const struct idem_client *c);

#endif /* IDEM_CLIENT_INTERNAL_H */
