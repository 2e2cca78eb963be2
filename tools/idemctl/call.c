/* call: sending one request with libidem, to the leader or to one given node, with the
 * tenant's or the admin token, and reporting a call that got no answer. */
#include <stdio.h>
#include <time.h>

#include "idemctl.h"

/* The monotonic clock in ms. */
uint64_t callNowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void callSleepMs(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A client of `seeds` with `token` and the TLS options; why (OUT) on failure. */
int callClientOpen(const struct global *g, const char *seeds, const char *token,
                   struct idem_client **c, char *why, size_t why_len)
{
    struct idem_options o = {0};
    o.seeds = seeds;
    o.token = token;
    cli_tls_options(&g->tls, &o);
    return idem_client_open(&o, c, why, why_len);
}

const char *callBearer(const struct global *g, bool admin)
{
    return admin ? g->admin_token : g->token;
}

/* Sends `req` to the leader, or to `node` when it is not NULL, with the tenant or the admin
 * token. On an answer returns EXIT_ANSWERED with *resp (OUT, caller frees it with
 * idem__response__free_unpacked) and, when `from` is not NULL, the address of the node that
 * answered in from (OUT, "" if unknown); otherwise reports the failure and returns the exit
 * status. */
int callFrom(const struct global *g, bool admin, const char *node, const Idem__Request *req,
             Idem__Response **resp, char *from, size_t from_len)
{
    *resp = NULL;
    if (from != NULL && from_len > 0) {
        from[0] = '\0';
    }
    struct idem_client *c = NULL;
    char why[256];
    int rv = callClientOpen(g, g->cluster, callBearer(g, admin), &c, why, sizeof why);
    if (rv != IDEM_OK) {
        return outFailCall(g, rv, why[0] ? why : "cannot create the client");
    }
    if (node != NULL) {
        rv = idem_call_node(c, node, req, g->deadline_ms, resp);
    } else {
        rv = idem_call(c, req, g->deadline_ms, resp);
    }
    int code = EXIT_ANSWERED;
    if (rv != IDEM_OK) {
        code = outFailCall(g, rv, idem_client_errmsg(c));
    } else if (from != NULL && from_len > 0) {
        const char *addr = node != NULL ? node : idem_client_leader(c);
        snprintf(from, from_len, "%s", addr != NULL ? addr : "");
    }
    idem_client_close(c);
    return code;
}

int callSend(const struct global *g, bool admin, const char *node, const Idem__Request *req,
             Idem__Response **resp)
{
    return callFrom(g, admin, node, req, resp, NULL, 0);
}

/* Prints the generic view of an answer (plus `extra`, taken, may be NULL). */
int callAndEmit(const struct global *g, bool admin, const char *node, const Idem__Request *req,
                json_t *extra)
{
    Idem__Response *resp = NULL;
    int code = callSend(g, admin, node, req, &resp);
    if (code != EXIT_ANSWERED) {
        json_decref(extra);
        return code;
    }
    json_t *o = jResult(resp);
    if (extra != NULL) {
        json_object_update(o, extra);
        json_decref(extra);
    }
    outEmit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}
