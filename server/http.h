/* http: the HTTP/1.1 gateway (JSON API, /metrics, /healthz, /livez, /readyz) on
 * node.http_address, and the proxy-mode listeners of cfg->proxies (docs/contract.md, proxy
 * mode), served by h2o 2.2.5 on the node's libuv loop (docs/h2o-notes.md), over TLS where
 * tls.http and tls.proxy say. The interface main.c uses; the parts are
 * gateway.c (h2o, routes, lifecycle), gateway_answer.c, http_api.c, metrics.c and proxy*.c,
 * sharing gateway_internal.h. */
#ifndef IDEM_SERVER_HTTP_H
#define IDEM_SERVER_HTTP_H

#include <stddef.h>
#include <uv.h>

#include "config.h"
#include "config_reload.h"
#include "service.h"

struct http_server;

/* Binds cfg->node.http_address (when set) and every proxy listener on `loop` and serves them,
 * cfg being ref's configuration: the server holds a reference to it (config_reload.h), and
 * each proxy request one to the configuration it started with. `loop` and `svc` are borrowed:
 * svc must stay alive until every request the gateway handed it was answered (service_close
 * does that) and is not called once http_server_stop() was called. Returns NULL with a
 * message in err on failure (a TLS file that cannot be loaded: "FILE:LINE:COLUMN: tls: ..."
 * at the tls section). */
struct http_server *http_server_new(uv_loop_t *loop, struct config_ref *ref, struct service *svc,
                                    char *err, size_t errlen);

/* A configuration reload (server/reload.c), its TLS in two steps: no part of the node switches
 * before every part has loaded its files. http_server_load_tls: with TLS on a listener
 * (tls.http, tls.proxy) the listeners' new context from cfg's certificate, key and CA files
 * into *listen, and with tls.rpc the forwarder's into *forward (each NULL when not served);
 * 0, or -1 with the reason in err ("FILE:LINE:COLUMN: tls: ..." at the tls section) and both
 * NULL. http_server_set_tls: the connections accepted (the forwarder's, opened) from now on
 * take listen and forward, as http_server_load_tls made them (taken; NULL changes nothing);
 * connections open keep their sessions.
 * http_server_set_config: serves ref's configuration from now on (its tenants, tokens and
 * proxy routes; the listeners and every other setting are the running ones,
 * config_reload_merge) and holds it instead of the one before; proxy requests in flight
 * keep theirs. */
struct idem_tls_ctx;
int http_server_load_tls(const struct http_server *h, const struct config *cfg,
                         struct idem_tls_ctx **listen, struct idem_tls_ctx **forward, char *err,
                         size_t errlen);
void http_server_set_tls(struct http_server *h, struct idem_tls_ctx *listen,
                         struct idem_tls_ctx *forward);
void http_server_set_config(struct http_server *h, struct config_ref *ref);

/* Stops (docs/h2o-notes.md §5): closes the listener, asks h2o to shut down, answers new
 * requests 503, closes the forwarder, force-closes idle keep-alive connections, and calls
 * cb(data) once no connection and no pending request is left. Pending requests are answered
 * as the service answers them (service_close answers every one). Call once. */
void http_server_stop(struct http_server *h, void (*cb)(void *data), void *data);

/* Frees the server after http_server_stop's callback ran and uv_run returned (h2o's
 * context keeps uv_run from returning: the caller uv_stop()s it). Disposes h2o's context
 * outside the loop, runs the loop until its handles are closed, then frees everything and
 * drops its configuration reference. */
void http_server_free(struct http_server *h);

#endif
