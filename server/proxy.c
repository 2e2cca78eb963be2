/* proxy: proxy mode (issue #4 item 2): a request on a proxy listener, its claim, and its
 * answers. The service calls and the recording are in proxy_record.c, the upstream client in
 * proxy_upstream.c; the job they share is in proxy_internal.h.
 *
 * A request on a proxy listener: its path normalised or refused (400, proxy_rules.h) → route
 * by path prefix at a '/' boundary, a method no route lists passed or refused (405,
 * other_methods) → one Idempotency-Key header (400) → the caller namespace: with one of the
 * route's caller-identity headers, the key is judged here and the record's key is the
 * namespaced one (proxy_ns_key) → fingerprint → claim through service_handle_as() on
 * behalf of the route's tenant (the service judges the key: 400) → on acquired, the
 * request goes to the upstream with http1client (docs/h2o-notes.md §4) under a total
 * deadline → the upstream's answer is recorded (complete or release, docs/contract.md) and
 * then passed on.
 * Everything a job needs after the claim is copied into the job, so that it can finish
 * (and record the upstream's answer) even when h2o disposed the request first.
 *
 * Followers (proxy_call): every record op (claim, renew, complete, release) goes to the local
 * service first; a follower answers not_leader, and the op is then forwarded to the leader's
 * RPC address (forward.c, one redirect) with Request.as_tenant and the cluster secret
 * (rpc.cluster_secret_file) as its auth_token. The upstream is always called from the node
 * the caller reached. Without a secret a follower answers 503 with Retry-After.
 *
 * Retries: a claim that finds no leader (unavailable, a forward that failed) is sent again
 * with the same attempt id (so a claim that committed but whose answer was lost gets its own
 * lease back, docs/contract.md) for up to rpc.default_deadline_ms, then answered 503. A
 * complete or release after the upstream answered is retried the same way (both are
 * idempotent for one token) for up to max(lease, 3 × rpc.default_deadline_ms), so that a
 * leader change during the upstream call does not leave the record processing.
 *
 * Lease renewal: while the upstream call runs, the lease is renewed as libidem's idem_run
 * renews it (proto/renew_plan.h: a third of the lease after the last success, an eighth of
 * that after a failure, each try bounded by the lease left). If a
 * renewal answers lease_lost or not_found (the lease passed during a stall and another
 * attempt took the key over, or the record is gone), the upstream's answer is passed on to
 * the caller but not recorded: the record belongs to its new holder (docs/contract.md: only
 * the current token may complete; the fence told the upstream that this holder was stale),
 * and a retry with the same key gets the new holder's outcome. */
#include "proxy_internal.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_conv.h"
#include "log.h"
#include "proxy_rules.h"
#include "resolver.h"
#include "xmalloc.h"

h2o_req_t *proxy_take_req(struct proxyJob *j)
{
    return gateway_hold_take(&j->hold);
}

h2o_iovec_t proxy_rid(struct proxyJob *j)
{
    return h2o_iovec_init(j->rid, strlen(j->rid));
}

/* RFC 9110 IMF-fixdate of a Unix time in ms into out; false when unknown. */
static bool imfDate(uint64_t ms, char out[40])
{
    if (ms == 0) {
        return false;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL) {
        return false;
    }
    static const char *const wd[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const mo[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    snprintf(out, 40, "%s, %02d %s %04d %02d:%02d:%02d GMT", wd[tm.tm_wday], tm.tm_mday,
             mo[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return true;
}

/* Adds Idempotency-Expires to extra when known; returns the new count. date is the caller's.
 * A record being quarantined (an upstream call whose outcome is not known, on a route with
 * on_timeout: unknown) never expires: no date. */
static size_t pjExpires(const struct proxyJob *j, struct hdr *extra, size_t n, char date[40])
{
    if (j->idem && !j->quarantining && imfDate(j->expires_at_ms, date)) {
        extra[n++] = (struct hdr){"idempotency-expires", "Idempotency-Expires", date, strlen(date)};
    }
    return n;
}

/* pjExpires, then Idempotency-Recorded: false when the answer passed on is not known to be
 * the key's recorded result (its lease was lost during the upstream call, recording it did
 * not answer ok, or it could not be stored and its digest was recorded instead): a retry
 * may get another holder's result or a 502, and a client can tell this answer from a
 * recorded one (docs/contract.md). Adds at most two headers. */
size_t proxy_answer_headers(const struct proxyJob *j, struct hdr *extra, size_t n, char date[40])
{
    n = pjExpires(j, extra, n, date);
    if (j->unrecorded || j->digest_instead) {
        extra[n++] = (struct hdr){"idempotency-recorded", "Idempotency-Recorded", "false", 5};
    }
    return n;
}

void proxy_send_error(struct proxyJob *j, int status, const char *code, const char *message,
                      uint64_t retry_after_s)
{
    h2o_req_t *req = proxy_take_req(j);
    char date[40];
    struct hdr own[2];
    size_t n = proxy_answer_headers(j, own, 0, date);
    gateway_send_error_with(j->h, req, R_PROXY, proxy_rid(j), status, code, message, retry_after_s,
                            own, n);
}

static void pjSendReplay(struct proxyJob *j, const Idem__StoredResponse *r)
{
    if (gateway_stored_too_large(r)) {
        proxy_send_error(
            j, 502, "upstream_response_too_large",
            "the upstream's answer exceeded the route's max_inline_body and was not kept", 0);
        return;
    }
    /* Set-Cookie only where the route says so (a record kept before that rule may hold one),
     * and only to a caller its identity headers named: a request without them has the bare
     * key, which any other anonymous caller can send too. */
    static const char *const drop[] = {"idempotency-expires", "set-cookie", NULL};
    static const char *const dropExpires[] = {"idempotency-expires", NULL};
    h2o_req_t *req = proxy_take_req(j);
    char date[40];
    struct hdr own[1];
    size_t n = pjExpires(j, own, 0, date);
    gateway_send_replay(j->h, req, R_PROXY, proxy_rid(j), r, NULL,
                        j->route->replay_set_cookie && j->caller_named ? dropExpires : drop, own,
                        n);
}

static void pjClosedCb(uv_handle_t *t)
{
    struct proxyJob *j = t->data;
    struct http_server *h = j->h;
    if (--j->open_handles > 0) {
        return;
    }
    LIST_REMOVE(j, link);
    free(j->method);
    free(j->path);
    free(j->body);
    free(j->key);
    free(j->fwd);
    free(j->head);
    for (size_t i = 0; i < j->n_up_hdrs; i++) {
        free(j->up_hdrs[i].name);
        free(j->up_hdrs[i].value);
    }
    free(j->up_hdrs);
    free(j->up_body);
    EVP_MD_CTX_free(j->sha);
    if (j->call_packed != NULL) {
        OPENSSL_cleanse(j->call_packed, j->call_len);
        free(j->call_packed);
    }
    config_ref_drop(j->ref);
    free(j);
    gateway_maybe_stopped(h);
}

void proxy_finish(struct proxyJob *j)
{
    if (j->hold.req != NULL) { /* every path answers; this is a safety net */
        proxy_send_error(j, 500, "internal", "no answer", 0);
    }
    uv_timer_stop(&j->timer);
    uv_timer_stop(&j->renew_timer);
    j->open_handles = 2;
    uv_close((uv_handle_t *)&j->timer, pjClosedCb);
    uv_close((uv_handle_t *)&j->renew_timer, pjClosedCb);
}

void proxy_answer_after(struct proxyJob *j)
{
    if (j->after == PJ_AFTER_UPSTREAM) {
        proxy_send_upstream(j);
    } else {
        proxy_send_error(j, j->err_status, j->err_code, j->err_msg, 0);
    }
    proxy_finish(j);
}

static void pjClaimDoneCb(void *data, const Idem__Response *resp)
{
    struct proxyJob *j = data;
    struct http_server *h = j->h;
    const Idem__Result *res = resp->result;
    Idem__Outcome oc = res ? res->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    const char *d = res != NULL && res->detail && res->detail[0] ? res->detail : resp->error;
    reqstats_outcome(&h->m.req, (unsigned)oc);
    if (res != NULL && res->expires_at_ms != 0) {
        j->expires_at_ms = res->expires_at_ms;
    }
    struct gateway_err e;
    if (gateway_outcome_error(res, &e)) {
        if (oc == IDEM__OUTCOME__OUTCOME_IN_PROGRESS) {
            e.status = (int)j->route->in_progress_status;
        } else if (oc == IDEM__OUTCOME__OUTCOME_MISMATCH) {
            e.status = (int)j->route->mismatch_status;
        }
        proxy_send_error(j, e.status, e.code, e.message, e.retry_after_s);
        proxy_finish(j);
        return;
    }
    switch (oc) {
    case IDEM__OUTCOME__OUTCOME_ACQUIRED:
        j->token = res->token;
        /* the lease as granted (a holder's own retry gets what it has left), counted from
         * the claim's first send */
        j->lease_end = j->renew_last_ok + (res->lease_ms ? res->lease_ms : j->lease_ms);
        proxy_upstream_start(j);
        return;
    case IDEM__OUTCOME__OUTCOME_REPLAY: {
        Idem__StoredResponse *owned;
        const Idem__StoredResponse *stored = service_stored_response(res, &owned);
        if (stored != NULL) {
            pjSendReplay(j, stored);
        } else {
            proxy_send_error(j, 500, "internal", "replay without a stored response", 0);
        }
        if (owned != NULL) {
            idem__stored_response__free_unpacked(owned, NULL);
        }
        break;
    }
    case IDEM__OUTCOME__OUTCOME_INVALID:
        if (gateway_key_refusal(d) != NULL) {
            char why[112];
            http_key_why((const uint8_t *)j->key, j->key_len, j->tenant->key_max_len, why,
                         sizeof why);
            proxy_send_error(j, 400, d, why[0] ? why : gateway_key_refusal(d), 0);
        } else {
            proxy_send_error(j, 400, "invalid_request", d && d[0] ? d : "invalid request", 0);
        }
        break;
    case IDEM__OUTCOME__OUTCOME_NOT_LEADER:
        proxy_send_error(j, 503, "idempotency_unavailable",
                         h->cfg->rpc.cluster_secret.set
                             ? "the leader could not be reached; retry with the same key"
                             : "this node is not the leader and has no cluster secret "
                               "(rpc.cluster_secret_file) to forward proxy claims with; retry, "
                               "or use the leader's proxy",
                         1);
        break;
    case IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED:
    case IDEM__OUTCOME__OUTCOME_FORBIDDEN: {
        /* Locally the tenant is configured: only the leader refuses, for the secret, or for
         * a tenant none of its own proxy routes names. */
        uint64_t now = uv_now(h->loop);
        if (h->secret_warned_ms == 0 || now - h->secret_warned_ms >= 10000) {
            h->secret_warned_ms = now ? now : 1;
            log_at(LOG_LEVEL_WARN, j->rid,
                   "proxy: the leader refused this node's cluster secret (or acting for "
                   "this route's tenant); check rpc.cluster_secret_file and the proxy "
                   "routes on every node");
        }
        proxy_send_error(j, 503, "idempotency_unavailable",
                         "the leader refused this node's cluster secret; retry on another node", 1);
        break;
    }
    default:
        proxy_send_error(j, 503, "idempotency_unavailable",
                         oc == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && d != NULL && d[0] != '\0'
                             ? d
                             : "no quorum or no leader; retry with the same key",
                         1);
        break;
    }
    proxy_finish(j);
}

static char *dupMem(const char *p, size_t len)
{
    char *s = xmalloc(len + 1);
    if (len > 0) {
        memcpy(s, p, len);
    }
    s[len] = '\0';
    return s;
}

/* The route for a request (its normalised path, path_len bytes without the query). */
struct pjMatch {
    const struct config_proxy_route *route; /* NULL: no route's prefix matches (404) */
    bool idem;                              /* the route lists the method: the protocol */
    bool refused;                           /* the route refuses the method (405) */
    unsigned allow;                         /* CONFIG_M_* bits for Allow, when refused */
};

/* Whether route r lets method bit `bit` (0: a method config_method_bit does not know) pass
 * through unchecked although it does not list it (other_methods). */
static bool passesUnlisted(const struct config_proxy_route *r, unsigned bit)
{
    return r->other_methods == CONFIG_OTHER_PASS ||
           (r->other_methods == CONFIG_OTHER_PASS_SAFE &&
            (bit & (CONFIG_M_GET | CONFIG_M_HEAD | CONFIG_M_OPTIONS)) != 0);
}

/* The first route whose prefix matches at a '/' boundary and whose methods include the
 * request's takes it through the protocol; else the first whose prefix matches passes it
 * through or refuses it, as its other_methods says. */
static void proxyRoute(const struct config_proxy *p, h2o_req_t *req, const char *path,
                       size_t path_len, struct pjMatch *m)
{
    unsigned bit = config_method_bit(req->method.base, req->method.len);
    *m = (struct pjMatch){0};
    for (size_t i = 0; i < p->n_routes; i++) {
        const struct config_proxy_route *r = &p->routes[i];
        if (!proxy_path_under(path, path_len, r->path_prefix)) {
            continue;
        }
        if (bit != 0 && (r->methods & bit)) {
            *m = (struct pjMatch){r, true, false, 0};
            return;
        }
        m->allow |= r->methods;
        if (m->route == NULL) {
            m->route = r;
        }
    }
    if (m->route != NULL && !passesUnlisted(m->route, bit)) {
        m->refused = true;
        if (m->route->other_methods == CONFIG_OTHER_PASS_SAFE) {
            m->allow |= CONFIG_M_GET | CONFIG_M_HEAD | CONFIG_M_OPTIONS;
        }
    }
}

/* 405 with Allow: the methods the path's routes list, and those their fallback passes. */
static void pjSendNotAllowed(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid, unsigned allow)
{
    static const char *const names[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
    char list[64] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (allow & config_method_bit(names[i], strlen(names[i]))) {
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", names[i]);
        }
    }
    struct hdr allowHdr = {"allow", "Allow", list, n};
    gateway_send_error_with(h, req, R_PROXY, rid, 405, "method_not_allowed",
                            "the route neither lists this method nor passes it through "
                            "(other_methods)",
                            0, &allowHdr, 1);
}

/* Method-override headers: never forwarded (proxy_forward_skips), as the upstream could act
 * on a method the route did not fence; refused with method_override: refuse. */
static bool hasMethodOverride(h2o_req_t *req)
{
    static const char *const names[] = {"x-http-method-override", "x-http-method",
                                        "x-method-override"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (h2o_find_header_by_str(&req->headers, names[i], strlen(names[i]), -1) >= 0) {
            return true;
        }
    }
    return false;
}

/* A request whose record is kept under its bare key (no identity header, or a route with
 * caller_identity: none) may not send a key of the namespaced keys' form: it would name an
 * identified caller's record (and get its stored answer). Answers 400 and returns false
 * when it does. */
static bool pjBareKeyAllowed(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid,
                             h2o_iovec_t key)
{
    if (!proxy_key_reserved((const uint8_t *)key.base, key.len)) {
        return true;
    }
    gateway_send_error(h, req, R_PROXY, rid, 400, "idempotency_key_invalid",
                       "a key of '~' and 42 base64url characters is the form of an identified "
                       "caller's record key, kept for them",
                       0);
    return false;
}

/* The caller namespace (docs/configuration.md, caller_identity): when the request carries
 * one of the route's identity headers, its key becomes the record's namespaced key (written
 * into ns, *key then points there), after the caller's key is judged by the tenant's rule.
 * False when the request was answered (400, 500). */
static bool pjCallerKey(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid,
                        const struct config_proxy_route *r, h2o_iovec_t *key,
                        char ns[PROXY_NS_KEY_LEN + 1])
{
    if (r->caller_none) {
        return pjBareKeyAllowed(h, req, rid, *key);
    }
    size_t n = 0;
    struct proxy_caller_value *vals = xcalloc(req->headers.size + 1, sizeof(*vals));
    for (size_t k = 0; k < r->n_caller_headers; k++) {
        const char *name = r->caller_headers[k];
        for (ssize_t i = -1;
             (i = h2o_find_header_by_str(&req->headers, name, strlen(name), i)) >= 0;) {
            vals[n++] =
                (struct proxy_caller_value){k, (const uint8_t *)req->headers.entries[i].value.base,
                                            req->headers.entries[i].value.len};
        }
    }
    int krc = n > 0 ? key_validate((const uint8_t *)key->base, key->len,
                                   h->cfg->tenants[r->tenant].key_max_len)
                    : KEY_OK;
    uint8_t caller[PROXY_CALLER_LEN] = {0};
    bool ok = n == 0 || krc != KEY_OK ||
              (proxy_caller_digest((const char *const *)r->caller_headers, r->n_caller_headers,
                                   vals, n, caller) &&
               proxy_ns_key(caller, (const uint8_t *)key->base, key->len, ns));
    free(vals);
    OPENSSL_cleanse(caller, sizeof caller);
    if (krc != KEY_OK) {
        const char *code =
            krc == KEY_MISSING ? "idempotency_key_missing" : "idempotency_key_invalid";
        char why[112];
        http_key_why((const uint8_t *)key->base, key->len, h->cfg->tenants[r->tenant].key_max_len,
                     why, sizeof why);
        gateway_send_error(h, req, R_PROXY, rid, 400, code, why, 0);
        return false;
    }
    if (!ok) {
        gateway_send_error(h, req, R_PROXY, rid, 500, "internal", "cannot hash the caller", 0);
        return false;
    }
    if (n == 0) {
        return pjBareKeyAllowed(h, req, rid, *key);
    }
    *key = h2o_iovec_init(ns, PROXY_NS_KEY_LEN);
    return true;
}

/* Whether one of the caller's Connection headers names this header: hop-by-hop. */
static bool pjConnectionNames(h2o_req_t *req, const h2o_iovec_t *name)
{
    for (ssize_t i = -1; (i = h2o_find_header(&req->headers, H2O_TOKEN_CONNECTION, i)) >= 0;) {
        const h2o_iovec_t *v = &req->headers.entries[i].value;
        if (proxy_connection_names(v->base, v->len, name->base, name->len)) {
            return true;
        }
    }
    return false;
}

/* The caller's end-to-end headers, serialised for the upstream (into j->fwd): not the
 * hop-by-hop ones (proxy_forward_skips, and those its Connection headers name). */
static void pjForwardHeaders(struct proxyJob *j, h2o_req_t *req)
{
    struct textBuf fb;
    gateway_tb_init(&fb, 1024);
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *hd = &req->headers.entries[i];
        if (hd->name->len == 0 || proxy_forward_skips(hd->name->base, hd->name->len) ||
            pjConnectionNames(req, hd->name)) {
            continue; /* nameless (a folded header's continuation line), or hop-by-hop */
        }
        gateway_tb_printf(&fb, "%.*s: %.*s\r\n", (int)hd->name->len, hd->name->base,
                          (int)hd->value.len, hd->value.base);
    }
    j->fwd = fb.p;
    j->fwd_len = fb.len;
}

/* A job for req on route r, with everything it needs after the claim copied (the normalised
 * target, the record's key when idem), its timers, and its reference in the request's pool;
 * in h->pjobs. */
static struct proxyJob *pjNew(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid,
                              const struct config_proxy_route *r, bool idem, h2o_iovec_t target,
                              h2o_iovec_t key)
{
    const struct config_tenant *t = &h->cfg->tenants[r->tenant];
    struct proxyJob *j = xcalloc(1, sizeof(*j));
    j->h = h;
    j->ref = config_ref_hold(h->ref); /* r and t are in it: a reload does not free them */
    j->route = r;
    j->tenant = t;
    j->idem = idem;
    snprintf(j->rid, sizeof(j->rid), "%.*s", (int)rid.len, rid.base);
    j->method = dupMem(req->method.base, req->method.len);
    j->path = dupMem(target.base, target.len);
    j->has_body = req->entity.base != NULL;
    j->body_len = req->entity.len;
    j->body = (uint8_t *)dupMem(req->entity.base, req->entity.len);
    if (idem) {
        j->key = dupMem(key.base, key.len);
        j->key_len = key.len;
    }
    pjForwardHeaders(j, req);
    uv_timer_init(h->loop, &j->timer);
    j->timer.data = j;
    uv_timer_init(h->loop, &j->renew_timer);
    j->renew_timer.data = j;
    j->lease_ms = r->lease_ms ? r->lease_ms : t->lease_ms;
    gateway_hold(&j->hold, req);
    LIST_INSERT_HEAD(&h->pjobs, j, link);
    return j;
}

/* The request's fingerprint: method, normalised path with query, tenant, content type, body
 * (with the route's fingerprint_fields and fingerprint_ignore), and the route's fingerprint
 * headers. FP_OK or fp_compute's error. */
static int pjFingerprint(const struct proxyJob *j, h2o_req_t *req, uint8_t fp[FP_LEN])
{
    const struct config_proxy_route *r = j->route;
    ssize_t ci = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);
    char *ctype =
        ci >= 0 ? dupMem(req->headers.entries[ci].value.base, req->headers.entries[ci].value.len)
                : NULL;
    size_t nfh = 0;
    struct fp_header *fh = xcalloc(req->headers.size + 1, sizeof(*fh));
    for (size_t k = 0; k < r->n_fingerprint_headers; k++) {
        const char *name = r->fingerprint_headers[k];
        for (ssize_t i = -1;
             (i = h2o_find_header_by_str(&req->headers, name, strlen(name), i)) >= 0;) {
            fh[nfh++] =
                (struct fp_header){name, (const uint8_t *)req->headers.entries[i].value.base,
                                   req->headers.entries[i].value.len};
        }
    }
    struct fp_input in = {.method = j->method,
                          .path = j->path,
                          .tenant = j->tenant->name,
                          .content_type = ctype,
                          .body = j->body,
                          .body_len = j->body_len,
                          .headers = fh,
                          .n_headers = nfh,
                          .fields = (const char *const *)r->fingerprint_fields,
                          .n_fields = r->n_fingerprint_fields,
                          .ignore = (const char *const *)r->fingerprint_ignore,
                          .n_ignore = r->n_fingerprint_ignore};
    int rc = fp_compute(&in, fp);
    free(ctype);
    free(fh);
    return rc;
}

/* Claims the job's key with fingerprint fp and a new attempt id; pjClaimDoneCb goes on. j
 * may be finished before this returns. */
static void pjClaim(struct proxyJob *j, const uint8_t fp[FP_LEN])
{
    const struct config_proxy_route *r = j->route;
    uint8_t rnd[8];
    char attempt[17];
    if (!gateway_random(j->h, rnd, sizeof(rnd))) {
        proxy_send_error(j, 500, "internal", "no randomness for the attempt id", 0);
        proxy_finish(j);
        return;
    }
    gateway_hex(rnd, sizeof(rnd), attempt);
    Idem__Request rq = IDEM__REQUEST__INIT;
    Idem__ClaimRequest cl = IDEM__CLAIM_REQUEST__INIT;
    cl.key.data = (uint8_t *)j->key;
    cl.key.len = j->key_len;
    cl.fingerprint.data = (uint8_t *)fp;
    cl.fingerprint.len = FP_LEN;
    cl.attempt_id.data = (uint8_t *)attempt;
    cl.attempt_id.len = 16;
    cl.lease_ms = r->lease_ms;
    cl.ttl_ms = r->ttl_ms;
    if (r->lease_policy_set) {
        cl.policy = r->lease_policy == CONFIG_LEASE_TAKEOVER
                        ? IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER
                        : IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
    }
    rq.op_case = IDEM__REQUEST__OP_CLAIM;
    rq.claim = &cl;
    j->renew_last_ok = uv_now(j->h->loop); /* the lease starts no sooner */
    proxy_call(j, &rq, pjClaimDoneCb, j->h->cfg->rpc.default_deadline_ms);
}

/* The checks before a job: the path (400), the route (404, 405), shutdown (503), the body
 * (413), method overrides (400). The route, or NULL when the request was answered. */
static const struct config_proxy_route *pjAdmit(struct http_server *h, const struct config_proxy *p,
                                                h2o_req_t *req, h2o_iovec_t rid,
                                                h2o_iovec_t *target, bool *idem)
{
    size_t tlen = 0, plen = 0;
    char *t = h2o_mem_alloc_pool(&req->pool, req->path.len + 1);
    int prc = proxy_path_normalise(req->path.base, req->path.len, t, &tlen, &plen);
    if (prc != PROXY_PATH_OK) {
        gateway_send_error(h, req, R_PROXY, rid, 400, "invalid_path", proxy_path_strerror(prc), 0);
        return NULL;
    }
    *target = h2o_iovec_init(t, tlen);
    struct pjMatch m;
    proxyRoute(p, req, t, plen, &m);
    *idem = m.idem;
    if (m.route == NULL) {
        gateway_send_error(h, req, R_PROXY, rid, 404, "not_found", "no proxy route for this path",
                           0);
        return NULL;
    }
    if (m.refused) {
        pjSendNotAllowed(h, req, rid, m.allow);
        return NULL;
    }
    if (h->stopping) {
        gateway_send_error(h, req, R_PROXY, rid, 503, "idempotency_unavailable",
                           "node shutting down", 1);
        return NULL;
    }
    if (req->entity.len > HTTP_BODY_MAX) {
        gateway_send_error(h, req, R_PROXY, rid, 413, "payload_too_large", "the body exceeds 1 MiB",
                           0);
        return NULL;
    }
    if (m.route->method_override_refuse && hasMethodOverride(req)) {
        gateway_send_error(h, req, R_PROXY, rid, 400, "invalid_request",
                           "method-override headers (X-HTTP-Method-Override, X-HTTP-Method, "
                           "X-Method-Override) are refused on this route",
                           0);
        return NULL;
    }
    return m.route;
}

void proxy_handle(struct http_server *h, const struct config_proxy *p, h2o_req_t *req,
                  h2o_iovec_t rid)
{
    bool idem = false;
    h2o_iovec_t target;
    const struct config_proxy_route *r = pjAdmit(h, p, req, rid, &target, &idem);
    if (r == NULL) {
        return;
    }
    h2o_iovec_t key = h2o_iovec_init(NULL, 0);
    char ns[PROXY_NS_KEY_LEN + 1];
    if (idem) {
        if (!gateway_header_key(h, req, R_PROXY, rid, &key)) {
            return;
        }
        /* optional key: pass through without the protocol; a required one that is missing
         * is refused by the service's claim, which judges every key (400) */
        idem = key.len > 0 || r->key_required;
        if (idem && !pjCallerKey(h, req, rid, r, &key, ns)) {
            return;
        }
    }
    struct proxyJob *j = pjNew(h, req, rid, r, idem, target, key);
    j->caller_named = idem && key.base == ns;
    if (!idem) {
        proxy_upstream_start(j);
        return;
    }
    uint8_t fp[FP_LEN];
    int rc = pjFingerprint(j, req, fp);
    if (rc != FP_OK) {
        proxy_send_error(j,
                         rc == FP_EINVAL_JSON      ? 400
                         : rc == FP_EJSON_TOO_MANY ? 413
                                                   : 500,
                         rc == FP_EINVAL_JSON      ? "invalid_request"
                         : rc == FP_EJSON_TOO_MANY ? "payload_too_large"
                                                   : "internal",
                         fp_strerror(rc), 0);
        proxy_finish(j);
        return;
    }
    pjClaim(j, fp); /* j may be finished before this returns */
}

/* The proxy listener a request arrived on, or NULL for the gateway's own listener. */
const struct config_proxy *proxy_of(struct http_server *h, h2o_req_t *req)
{
    if (h->n_plisteners == 0 || req->conn->callbacks->get_sockname == NULL) {
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = req->conn->callbacks->get_sockname(req->conn, (struct sockaddr *)&ss);
    if (sl == 0) {
        return NULL;
    }
    /* The listener bound at the connection's local address and port, or at a wildcard and
     * its port (a dual-stack [::] listener's IPv4 connections have a mapped local address). */
    for (size_t i = 0; i < h->n_plisteners; i++) {
        if (IdemSockaddrMatches((const struct sockaddr *)&h->plisteners[i].sa,
                                (const struct sockaddr *)&ss)) {
            return &h->cfg->proxies[i]; /* a reload keeps the listeners, in order */
        }
    }
    return NULL;
}
