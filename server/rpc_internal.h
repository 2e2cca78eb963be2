/* rpc_internal: what the RPC listener's two halves share: server/rpc.c (connections:
 * accept, admission, reads, writes, TLS, timeouts) and rpc_frames.c (what a connection does
 * with the frames it reads). Everything runs on the loop's thread. */
#ifndef IDEM_SERVER_RPC_INTERNAL_H
#define IDEM_SERVER_RPC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <uv.h>

#include "arena.h"
#include "rpc.h"
#include "rpc_admit.h"

#define CONN_MAX_INFLIGHT 4096      /* requests awaiting an answer */
#define CONN_MAX_QUEUED (16u << 20) /* answer bytes waiting to be written: reading pauses */
/* Answer bytes waiting to be written past which the connection is closed: reading pauses at
 * CONN_MAX_QUEUED, but the answers to requests already taken (up to CONN_MAX_INFLIGHT, each
 * up to a stored response's size) still come; a peer that does not read them is cut off
 * instead of having gigabytes buffered for it. */
#define CONN_MAX_BUFFERED (64u << 20)
/* Past rpc.max_answer_buffer_mb of answers waiting in every connection together, the
 * connection holding the most is closed (until they are back under it); from half of it, a
 * connection with CONN_OUT_BATCH or more waiting stops reading. Without it, 1024 peers
 * that do not read could make a node hold 64 GiB (CONN_MAX_BUFFERED each). */
#define SHED_WARN_EVERY_MS 10000 /* at most one warning per this for such closes */
/* After rpc_server_close, connections still draining this long are closed (a peer that does
 * not read its last answers must not hold the node's exit). */
#define CLOSE_GRACE_MS 2000
#define CONN_TLS_READ 65536         /* the TLS listener's ciphertext read buffer */
#define CONN_TLS_FEED 16384         /* ciphertext fed to a TLS engine at a time (rpc.c) */
#define CONN_BUF_MIN 65536          /* a frame buffer's first size, and what it shrinks back to */
#define CONN_READ_SLACK 16384       /* room kept past a large frame, for the next read */
#define CONN_OUT_BATCH (256u << 10) /* answer bytes gathered before a write is cut */
#define CONN_OUT_FIRST_MAX (64u << 10) /* the most a turn's output buffer starts with */
#define SWEEP_MS 250                /* how often timeouts are checked */
#define TLS_WARN_EVERY_MS 10000     /* at most one TLS failure warning per this */
#define TOKEN_KEEP_MAX 4096         /* a known token kept to compare the next ones with */

/* A connection's life. Reading and paused alternate by back-pressure (rpc_conn_flow_control);
 * draining (after a bad frame, or when the server stops) reads no more and ends in closing
 * once everything owed is written; closing is final. Every change asserts the state it
 * leaves. */
enum connState {
    CONN_READING,  /* frames are read */
    CONN_PAUSED,   /* reading stopped by back-pressure */
    CONN_DRAINING, /* no more reads; close once everything owed is written */
    CONN_CLOSING,  /* the handle is closing: no more reads, no more answers */
};

struct conn {
    uv_tcp_t tcp;
    uint64_t id; /* the server's serial number of it, for the log ("rpc-ID-REQUEST": log.h) */
    enum connState state;
    struct rpc_server *srv;
    uint8_t *buf;
    size_t len;
    size_t cap;
    int refs;             /* the open handle + requests awaiting an answer + writes + a place on the
                           * flush list */
    unsigned inflight;    /* requests awaiting an answer */
    bool backlog;         /* frames taken from the socket wait for inflight to fall below
                           * CONN_MAX_INFLIGHT (in the frame buffer, or in the TLS engine): reading
                           * stays paused, and the flush handle takes them up */
    unsigned writes;      /* answers being written */
    struct idem_tls *tls; /* NULL on a plain-TCP listener */
    bool tls_failed;      /* TLS only: no close_notify, the stream is broken */
    uint64_t skip;        /* bytes of an oversized frame still to discard */
    uint64_t accepted_ms; /* uv_now() at accept */
    uint64_t progress_ms; /* uv_now() at accept, at each complete frame, each answer written */
    uint64_t wprogress_ms; /* uv_now() when a write last completed, or when one started with
                            * none outstanding: a write stuck since is the peer's not reading */
    LIST_ENTRY(conn) link; /* in the server's conns */
    struct writeReq *out;  /* answer frames not yet written (plain TCP), out_len bytes */
    size_t out_len;
    size_t out_cap;
    size_t out_first; /* the next turn's first out_cap: this turn's, up to CONN_OUT_FIRST_MAX */
    bool queued; /* on the server's flush list (holds a reference) */
    SLIST_ENTRY(conn) flush_link;
    size_t accounted; /* its answer bytes in rpc_answer_bytes, at the last connAccount() */
    struct rpc_admit_entry admit; /* in the server's admission (from admitted to closing) */
    bool framed;  /* a frame completed or refused: rpc.first_frame_timeout_ms is over */
    bool authed;  /* a frame carried a known token */
    uint64_t cred_gen; /* the server's cred_gen when a token of this connection was last known */
    uint8_t *tok; /* the last known token it sent, tok_len bytes: the same again is not
                   * hashed again, neither to admit its frame nor to authorise its request */
    size_t tok_len;
    uint8_t tok_sha256[32]; /* tok's */
};

/* A claim's request takes under 1 KiB decoded; larger ones grow the arena (arena.h). */
#define RPC_DECODE_ARENA_BYTES (16u * 1024u)

struct rpc_server {
    uv_tcp_t listener;
    uv_loop_t *loop;
    const struct config_rpc *cfg;
    uint64_t cred_gen; /* reloads so far: the known tokens may have changed at each */
    struct service *svc;
    struct idem_tls_ctx *tls; /* NULL: plain TCP */
    uint8_t *cipher; /* TLS: the CONN_TLS_READ bytes every connection's reads land in */
    LIST_HEAD(, conn) conns;
    size_t n_conns;
    uint64_t conn_serial; /* connections accepted: the next one's id */
    bool closing;
    bool listener_closed;
    uv_timer_t sweep; /* the timeouts; after rpc_server_close, the drain's grace period */
    bool sweep_closing;
    bool sweep_closed;
    uint64_t close_ms;       /* uv_now() at rpc_server_close */
    uint64_t tls_warn_ms;    /* uv_now() of the last TLS failure warning */
    uint64_t tls_suppressed; /* TLS failures not logged since then */
    bool tls_warned;
    uint64_t shed_warn_ms;    /* uv_now() of the last warning of a close for the answer cap */
    uint64_t shed_suppressed; /* such closes not logged since then */
    bool shed_warned;
    SLIST_HEAD(, conn) flush; /* connections with answers to write this loop turn */
    uv_check_t flusher;       /* writes them, after the turn's I/O callbacks */
    uv_idle_t awake;          /* active while anything waits: the poll does not block */
    int handles_closing;      /* flusher and awake, once every connection is gone */
    bool handles_closed;
    void (*close_cb)(void *data);
    void *close_data;
    struct rpc_admit admit;
    struct arena decode; /* requests are decoded into it (rpc_frames.c), reset after each;
                          * RPC_DECODE_ARENA_BYTES to begin with, grown as arena.h says */
    bool decoding;       /* a request decoded into it is being handled */
};

/* Whether c still takes frames: reading, or paused by back-pressure. */
static inline bool rpc_conn_open(const struct conn *c)
{
    return c->state == CONN_READING || c->state == CONN_PAUSED;
}

/* Every listener's figures in this process (rpc_get_stats). */
extern struct rpc_stats rpc_figures;
/* What frame buffers hold past their first CONN_BUF_MIN bytes, every connection's
 * together: what rpc.max_frame_buffer_mb bounds (rpc_frames.c: connHoldFrame). */
extern uint64_t rpc_frame_buffer_grown;
/* Answer bytes waiting to be written, every connection's together (rpc.c: connAccount). */
extern uint64_t rpc_answer_bytes;

/* ---- rpc.c ---- */

/* Packs one answer frame into c's output for this turn (written by the flush handle). */
void rpc_conn_send(struct conn *c, const Idem__Response *resp);
/* Reads no more; closes once nothing is owed (rpc_conn_maybe_finish_drain). */
void rpc_conn_drain(struct conn *c);
void rpc_conn_maybe_finish_drain(struct conn *c);
/* Closes the handle (final); takes c out of the admission. */
void rpc_conn_close(struct conn *c);
/* Stops or resumes reading by back-pressure. */
void rpc_conn_flow_control(struct conn *c);
/* Drops a reference (a request answered): frees c with its last. */
void rpc_conn_unref(struct conn *c);
/* Answer bytes waiting to be written to c. */
size_t rpc_conn_queued_bytes(struct conn *c);

/* ---- rpc_frames.c ---- */

/* Handles the complete frames in c's buffer, up to CONN_MAX_INFLIGHT requests awaiting an
 * answer (c->backlog then says that frames were left). */
void rpc_conn_process(struct conn *c);
/* Answers a frame that cannot be served INVALID under request_id (0 when unknown) with
 * `why`; the connection then drains. */
void rpc_conn_bad_frame(struct conn *c, uint64_t request_id, const char *why);
/* Gives c its frame buffer's first CONN_BUF_MIN bytes, once. */
void rpc_conn_reserve(struct conn *c);

#endif
