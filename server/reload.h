/* reload: a running node reads its configuration file again, on SIGHUP or the admin op
 * `reload` (idemctl reload), and applies what can change without a restart
 * (config_reload.h; docs/operations.md, "Reloading the configuration"). Everything runs on
 * the node's loop, where every part reads its configuration, but the file's read and parse:
 * the new one is loaded and checked on a thread of libuv's pool (the parser and checks of a
 * start, errors "FILE:LINE:COLUMN: ..."), so that a file of many tenants does not hold the
 * loop, then, back on the loop, merged with
 * the running one (settings that change only with a restart keep their value, each one
 * named in a warning), its TLS files loaded into every part's new contexts, and only then
 * handed to the RPC listener, the gateway (and its forwarder), Raft's TLS, the service and
 * the log, which cannot fail. Any error before that
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

/* Called on the loop when a reload asked for with reloader_run ends: rc 0 and
 * "configuration reloaded", or -1 with the reason (the running configuration kept). */
typedef void (*reloader_done_fn)(void *data, int rc, const char *err);

struct reload_waiter {
    reloader_done_fn done; /* NULL: nobody waits (SIGHUP) */
    void *data;
    const char *trigger; /* static text */
    struct reload_waiter *next;
};

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
    /* The reload under way: the file loaded on the pool into `loading` (NULL: none under
     * way), for the waiters of `round`; those asked for meanwhile wait in `queued` for
     * the next one, which reads the file again. */
    uv_work_t work;
    struct config_ref *loading;
    int load_rc;
    char load_err[1024];
    const char *trigger; /* the round's first waiter's, for the log */
    struct reload_waiter *round;
    struct reload_waiter *queued;
};

/* Starts with `boot` (the configuration the node started with; a reference taken), on
 * `loop`, for the file at `path`; sets the log level from it and counts it as the last
 * successful load (idem_config_last_reload_success_timestamp_seconds). */
void reloader_init(struct reloader *r, uv_loop_t *loop, const char *path, struct config_ref *boot);

/* The parts a reload hands the new configuration to (borrowed; http may be NULL). Also makes
 * the service's admin op `reload` call reloader_run. */
void reloader_attach(struct reloader *r, struct service *svc, struct rpc_server *rpc,
                     struct http_server *http);

/* Reloads (`trigger`, static text, names the cause in the log: "SIGHUP", "admin RPC"): the
 * file is read on the pool, then applied on the loop, and done(data, ...) is called there
 * (done may be NULL). A reload asked for while another reads the file waits for it, then
 * reads the file again. While the node stops, or before the parts are attached, done is
 * called at once with -1. */
void reloader_run(struct reloader *r, const char *trigger, reloader_done_fn done, void *data);

/* Takes no more reloads (the node is stopping; one under way ends with "the node is shutting
 * down") and closes its timer on the loop. */
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
