/* reload: a running node reads its configuration file again, on SIGHUP or the admin op
 * `reload` (idemctl reload), and applies what can change without a restart
 * (config_reload.h; docs/operations.md, "Reloading the configuration"). Everything runs on
 * the node's loop, where every part reads its configuration: the new one is loaded and
 * checked (the parser and checks of a start, errors "FILE:LINE:COLUMN: ..."), merged with
 * the running one (settings that change only with a restart keep their value, each one
 * named in a warning), its TLS files loaded, and only then handed to the RPC listener, the
 * gateway (and its forwarder), Raft's TLS, the service and the log. Any error before that
 * keeps the running configuration whole and is logged (never with a token or a secret).
 * The configuration replaced is freed on a later loop turn, once no proxy request holds it. */
#ifndef IDEM_SERVER_RELOAD_H
#define IDEM_SERVER_RELOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config_reload.h"
#include "http.h"
#include "rpc.h"
#include "service.h"

struct reloader {
    uv_loop_t *loop;
    const char *path;        /* the configuration file (borrowed: main's argv) */
    struct config_ref *boot; /* held until reloader_free: parts made at start borrow from it */
    struct config_ref *cur;  /* held: the configuration served now */
    struct service *svc;
    struct rpc_server *rpc;
    struct http_server *http; /* NULL without a gateway or proxy listener */
    uv_timer_t drop;          /* drops `retired` on a later loop turn */
    struct config_ref **retired;
    size_t n_retired;
    bool stopping;
};

/* Starts with `boot` (the configuration the node started with; a reference taken), on
 * `loop`, for the file at `path`; sets the log level from it and counts it as the last
 * successful load (idem_config_last_reload_success_timestamp_seconds). */
void reloader_init(struct reloader *r, uv_loop_t *loop, const char *path, struct config_ref *boot);

/* The parts a reload hands the new configuration to (borrowed; http may be NULL). Also makes
 * the service's admin op `reload` call reloader_run. */
void reloader_attach(struct reloader *r, struct service *svc, struct rpc_server *rpc,
                     struct http_server *http);

/* Reloads now (on the loop; `trigger` names the cause in the log: "SIGHUP", "admin RPC").
 * 0, or -1 with the reason in err (errlen bytes) and the running configuration kept. */
int reloader_run(struct reloader *r, const char *trigger, char *err, size_t errlen);

/* Takes no more reloads (the node is stopping) and closes its timer on the loop. */
void reloader_close(struct reloader *r);

/* After the loop ended: drops every configuration still held. */
void reloader_free(struct reloader *r);

/* For /metrics (read on the loop's thread): reloads that succeeded and failed since the start,
 * and the Unix time in seconds of the last successful load (the start's, or a reload's). */
struct reload_stats {
    uint64_t ok;
    uint64_t error;
    uint64_t last_success_s;
};
void reload_get_stats(struct reload_stats *out);

#endif
