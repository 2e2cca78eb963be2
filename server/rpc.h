/* rpc: the binary RPC front end: a TCP listener speaking length-prefixed protobuf frames
 * (idem.proto, above `message Request`), pipelined, answered out of order by request id.
 * A frame's bytes are checked (rpc_scan.h) and its token known before protobuf-c decodes it;
 * every decoded request goes to service_handle(); bad frames are answered with INVALID and
 * the connection is closed without touching any other connection. Which connections come
 * in, and which one makes room for them, is rpc_admit.h's. */
#ifndef IDEM_SERVER_RPC_H
#define IDEM_SERVER_RPC_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "reqstats.h"
#include "service.h"

struct rpc_server;

/* Binds host:port on `loop` and serves requests to `svc` (borrowed; must outlive the RPC
 * server). `cfg` is borrowed and must outlive it. `tls` (borrowed for the call; may be NULL)
 * with tls->rpc set makes the listener speak TLS (libidem's client/tls_stream.h); its files
 * are read here, so a missing file, a bad certificate or a key that does not match fail
 * here. NULL with a message in err on failure. */
struct rpc_server *rpc_server_new(uv_loop_t *loop, const struct config_addr *addr,
                                  const struct config_rpc *cfg, const struct config_tls *tls,
                                  struct service *svc, char *err, size_t errlen);

/* A configuration reload (server/reload.c), its TLS in two steps: no part of the node switches
 * before every part has loaded its files. rpc_server_load_tls: a listener that serves TLS
 * makes a new context from tls's files (borrowed for the call) into *out (NULL without TLS);
 * 0, or -1 with the reason in err ("FILE:LINE:COLUMN: tls: cert_file /path: ... (tls.rpc)")
 * and *out NULL. rpc_server_set_tls: the connections accepted from now on take ctx, as
 * rpc_server_load_tls made it (taken; NULL changes nothing); those open keep theirs.
 * rpc_server_set_config: the listener reads `cfg` from now on (borrowed as in
 * rpc_server_new; its values are the running ones, as rpc settings change only with a
 * restart). */
struct idem_tls_ctx;
int rpc_server_load_tls(const struct rpc_server *r, const struct config_tls *tls,
                        struct idem_tls_ctx **out, char *err, size_t errlen);
void rpc_server_set_tls(struct rpc_server *r, struct idem_tls_ctx *ctx);
void rpc_server_set_config(struct rpc_server *r, const struct config_rpc *cfg);

/* Figures of every RPC listener in this process, for /metrics. Read them on the loop's
 * thread (the listeners update them there). */
struct rpc_stats {
    uint64_t connections;        /* connections open */
    uint64_t inflight;           /* requests taken that await their answer */
    uint64_t frame_buffer_bytes; /* memory held by the connections' frame buffers */
    uint64_t frames_refused;     /* frames answered unavailable: rpc.max_frame_buffer_mb */
    uint64_t answer_buffer_bytes;    /* answers waiting to be written, every connection's */
    uint64_t answer_cuts_connection; /* connections closed past 64 MiB of answers waiting */
    uint64_t answer_cuts_node;       /* closed as the one holding the most, the answers of
                                      * all together past rpc.max_answer_buffer_mb */
    /* Frames refused before protobuf-c decoded them (server/rpc_scan.h): answered
     * unauthenticated (no known token; past rpc.unauthenticated_max_frame_bytes, none in
     * their first bytes), and answered invalid for more than RPC_SCAN_MAX_FIELDS fields, a
     * field number idem.proto does not have, bytes that are not a Request (before or in
     * the decode), or a decode past its memory budget. */
    uint64_t rejected_unauthenticated;
    uint64_t rejected_fields;
    uint64_t rejected_unknown_field;
    uint64_t rejected_malformed;
    uint64_t rejected_decode_memory;
    /* Connections closed at their accept (server/rpc_admit.h): their address held
     * rpc.max_connections_per_address, or every slot they may take was held by members
     * and authenticated clients. */
    uint64_t refused_address;
    uint64_t refused_connections;
    /* Connections closed after it: the oldest unauthenticated one, to admit a new one;
     * no frame nor known token within rpc.first_frame_timeout_ms. */
    uint64_t dropped_evicted;
    uint64_t dropped_first_frame;
    /* Clients' data ops (claim, complete, release, renew, get) answered, by outcome, with
     * claim durations (from the frame's decoding to its answer); fail_closed: their
     * unavailable answers, and those of frames refused unread (frames_refused). Admin ops
     * are not counted; nor are requests another node's gateway forwarded (Request.forwarded,
     * or as_tenant): their client is counted by that gateway. */
    struct reqstats requests;
    uint64_t forwarded[REQSTATS_OUTCOMES]; /* the forwarded data ops answered, by outcome */
};
void rpc_get_stats(struct rpc_stats *out);

/* Stops accepting and reading; every connection closes once the answers it is owed are
 * written (call service_close() next: it answers every waiting request). The server is
 * freed once its last connection is; then cb(data) runs. */
void rpc_server_close(struct rpc_server *r, void (*cb)(void *data), void *data);

#endif
