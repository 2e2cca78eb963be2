/* idemctl: the command-line client of idemd, for operators and for debugging: cluster
 * status and membership, and every data operation of CONTRACT.md §2 by hand.
 *
 * Shape: global options, then one command word, then the command's arguments and options.
 * The flag --token is overloaded on purpose (it is what each side calls a token): before
 * the command it is the bearer token, after it (complete, release, renew) the fencing token.
 * Every command builds one Idem__Request, sends it with libidem (to the leader, or with
 * idem_call_node() to one given node), and prints the answer: `key: value` lines by default,
 * exactly one JSON object on stdout with --json (built with jansson).
 *
 * Exit status: 0 the call was answered, whatever the outcome; 1 internal error (out of
 * memory, no random source); 2 usage or configuration error; 3 unavailable (no leader, no
 * quorum, deadline passed, nothing reachable). Bearer tokens are never printed. */
#include <openssl/crypto.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "cli.h"
#include "idem_rpc.h"

#define EXIT_ANSWERED 0
#define EXIT_INTERNAL 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3

#define DEFAULT_DEADLINE_MS 5000u
#define MAX_DEADLINE_MS 600000u          /* the server's own ceiling (rpc.max_deadline_ms) */
#define MAX_DURATION_MS 315360000000ull  /* lease and ttl: at most ten years */
#define ATTEMPT_MAX 64                   /* bytes of attempt id (idem.proto ClaimCmd) */

static const char usageText[] =
    "Usage: idemctl [GLOBAL OPTIONS] COMMAND [ARGUMENTS] [COMMAND OPTIONS]\n"
    "\n"
    "Global options (before COMMAND):\n"
    "  --cluster H:P,H:P,...  RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T              tenant bearer token (env IDEM_TOKEN)\n"
    "  --admin-token T        admin bearer token, for status, members, transfer, snapshot\n"
    "                         and resolve (env IDEM_ADMIN_TOKEN)\n"
    "  --json                 print exactly one JSON object on stdout\n"
    "  --deadline MS          time allowed for the whole call, retries included\n"
    "                         (default 5000, at most 600000)\n"
    "  --help                 print this help and exit\n"
    "Flags win over the environment. --json and --deadline are accepted after COMMAND too.\n"
    "\n"
    "Commands:\n"
    "  status [--digest]      ask every node of --cluster about itself (--digest: and the\n"
    "                         digest of its state, equal on replicas at the same applied index)\n"
    "  claim KEY --fingerprint HEX64 [--attempt ID] [--lease MS] [--ttl MS]\n"
    "        [--policy conflict|takeover]\n"
    "                         claim KEY; without --attempt a random attempt id is used\n"
    "                         (printed, so that the claim can be retried with it)\n"
    "  complete KEY --token N --status CODE [--body TEXT]\n"
    "        [--outcome succeeded|failed_final|unknown]   (default succeeded)\n"
    "  release KEY --token N\n"
    "  renew KEY --token N [--lease MS]\n"
    "  get KEY\n"
    "  members [list | add ID RAFT_ADDR RPC_ADDR [HTTP_ADDR] | promote ID | remove ID]\n"
    "  transfer [NODE_ID]     hand leadership over (default: the most up-to-date voter)\n"
    "  snapshot [--node ADDR] take a snapshot on ADDR (default: the node that answers)\n"
    "  resolve KEY --tenant NAME (--release | --status CODE [--body TEXT])\n"
    "                         end a quarantine after checking the business system\n"
    "After COMMAND, --token N is the fencing token returned by claim, not the bearer token.\n"
    "Use -- to end options (for a key that starts with '-').\n"
    "\n"
    "Exit status: 0 the call was answered (whatever the outcome), 2 usage or configuration\n"
    "error, 3 unavailable (no leader, no quorum, deadline passed, nothing reachable),\n"
    "1 internal error.\n";

struct global {
    const char *cluster;
    const char *token;
    const char *admin_token;
    bool json;
    uint32_t deadline_ms;
};

/* The arguments after the command word. */
struct args {
    int argc;
    char **argv;
    int i;         /* next argument */
    bool dashdash; /* "--" seen: everything after it is positional */
    const char *cmd;
};

/* ---- errors -------------------------------------------------------------------------- */

static void oom(void) __attribute__((noreturn));

static void oom(void)
{
    fputs("idemctl: out of memory\n", stderr);
    exit(EXIT_INTERNAL);
}

/* ---- numbers and values -------------------------------------------------------------- */

/* ---- argument cursor ----------------------------------------------------------------- */

static bool isOption(const char *arg)
{
    return arg[0] == '-' && arg[1] != '\0';
}

/* If the current argument is `name` ("--x") or "name=value", consumes it and its value
 * (the next argument in the first form) and returns true. */
static bool optValue(struct args *a, const char *name, const char **val)
{
    if (a->dashdash) {
        return false;
    }
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) {
        return false;
    }
    if (arg[n] == '=') {
        *val = arg + n + 1;
        a->i++;
        return true;
    }
    if (arg[n] != '\0') {
        return false;
    }
    if (a->i + 1 >= a->argc) {
        cli_usage_error("%s%soption %s needs a value", a->cmd ? a->cmd : "", a->cmd ? ": " : "",
                   name);
    }
    *val = a->argv[a->i + 1];
    a->i += 2;
    return true;
}

/* If the current argument is the flag `name`, consumes it and returns true. */
static bool optFlag(struct args *a, const char *name)
{
    if (a->dashdash) {
        return false;
    }
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) {
        return false;
    }
    if (arg[n] == '=') {
        cli_usage_error("%s%soption %s takes no value", a->cmd ? a->cmd : "", a->cmd ? ": " : "",
                   name);
    }
    if (arg[n] != '\0') {
        return false;
    }
    a->i++;
    return true;
}

static void printHelp(void) __attribute__((noreturn));

static void printHelp(void)
{
    fputs(usageText, stdout);
    exit(EXIT_ANSWERED);
}

/* Options every command accepts after the command word: --json, --deadline, --help. */
static bool commonOpt(struct global *g, struct args *a)
{
    const char *v;
    if (optFlag(a, "--json")) {
        g->json = true;
        return true;
    }
    if (optValue(a, "--deadline", &v)) {
        g->deadline_ms = (uint32_t)cli_parse_u64("--deadline", v, 1, MAX_DEADLINE_MS);
        return true;
    }
    if (optFlag(a, "--help") || optFlag(a, "-h")) {
        printHelp();
    }
    return false;
}

/* Takes the current argument as positional number *n (of at most `max`), or exits on an
 * unknown option or one argument too many. */
static void positional(struct args *a, const char **slots, size_t max, size_t *n)
{
    const char *arg = a->argv[a->i];
    if (!a->dashdash && strcmp(arg, "--") == 0) {
        a->dashdash = true;
        a->i++;
        return;
    }
    if (!a->dashdash && isOption(arg)) {
        cli_usage_error("%s: unknown option %s", a->cmd, arg);
    }
    if (*n >= max) {
        cli_usage_error("%s: unexpected argument \"%s\"", a->cmd, arg);
    }
    slots[(*n)++] = arg;
    a->i++;
}

/* ---- JSON ---------------------------------------------------------------------------- */

static void jset(json_t *o, const char *k, json_t *v)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        oom();
    }
}

static json_t *jobj(void)
{
    json_t *o = json_object();
    if (o == NULL) {
        oom();
    }
    return o;
}

static json_t *jarr(void)
{
    json_t *a = json_array();
    if (a == NULL) {
        oom();
    }
    return a;
}

static void jpush(json_t *arr, json_t *v)
{
    if (v == NULL || json_array_append_new(arr, v) != 0) {
        oom();
    }
}

static json_t *jstr(const char *s)
{
    json_t *v = json_string(s != NULL ? s : "");
    if (v == NULL) {
        /* Not valid UTF-8: say so rather than print bytes. */
        v = json_string("(not UTF-8)");
    }
    return v;
}

static json_t *ju64(uint64_t v)
{
    /* jansson integers are signed 64-bit; no idemd counter comes near 2^63. */
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *jhex(const uint8_t *d, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char *s = malloc(2 * n + 1);
    if (s == NULL) {
        oom();
    }
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = hex[d[i] >> 4];
        s[2 * i + 1] = hex[d[i] & 15];
    }
    s[2 * n] = '\0';
    json_t *v = json_string(s);
    free(s);
    return v;
}

static json_t *jbase64(const uint8_t *d, size_t n)
{
    if (n > (size_t)INT32_MAX / 2) {
        return json_null();
    }
    char *s = malloc(4 * ((n + 2) / 3) + 1);
    if (s == NULL) {
        oom();
    }
    EVP_EncodeBlock((unsigned char *)s, d, (int)n);
    json_t *v = json_string(s);
    free(s);
    return v;
}

/* Puts bytes under `key` as a string when they are UTF-8, else under `key`_base64 (and
 * `key` is null). */
static void jsetBytes(json_t *o, const char *key, const uint8_t *d, size_t n)
{
    json_t *v = json_stringn((const char *)d, n);
    if (v != NULL) {
        jset(o, key, v);
        return;
    }
    char alt[64];
    snprintf(alt, sizeof alt, "%s_base64", key);
    jset(o, key, json_null());
    jset(o, alt, jbase64(d, n));
}

static const char *stateName(Idem__RecordState s)
{
    switch (s) {
    case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING:
        return "processing";
    case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED:
        return "completed";
    case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED:
        return "quarantined";
    case IDEM__RECORD_STATE__RECORD_STATE_TOMBSTONE:
        return "tombstone";
    case IDEM__RECORD_STATE__RECORD_STATE_RELEASED:
        return "released";
    default:
        return "unspecified";
    }
}

static json_t *completionJson(Idem__Completion c)
{
    switch (c) {
    case IDEM__COMPLETION__COMPLETION_SUCCEEDED:
        return json_string("succeeded");
    case IDEM__COMPLETION__COMPLETION_FAILED_FINAL:
        return json_string("failed_final");
    case IDEM__COMPLETION__COMPLETION_UNKNOWN:
        return json_string("unknown");
    default:
        return json_null();
    }
}

static json_t *storedResponseJson(const Idem__StoredResponse *sr)
{
    json_t *o = jobj();
    jset(o, "status", ju64(sr->status));
    jsetBytes(o, "body", sr->body.data, sr->body.len);
    if (sr->n_headers > 0) {
        json_t *hs = jarr();
        for (size_t i = 0; i < sr->n_headers; i++) {
            json_t *h = jobj();
            jset(h, "name", jstr(sr->headers[i]->name));
            jsetBytes(h, "value", sr->headers[i]->value.data, sr->headers[i]->value.len);
            jpush(hs, h);
        }
        jset(o, "headers", hs);
    }
    if (sr->body_ref != NULL && sr->body_ref[0] != '\0') {
        jset(o, "body_ref", jstr(sr->body_ref));
    }
    if (sr->body_sha256.len > 0) {
        jset(o, "body_sha256", jhex(sr->body_sha256.data, sr->body_sha256.len));
    }
    return o;
}

static json_t *recordJson(const Idem__Record *r)
{
    json_t *o = jobj();
    jset(o, "tenant", jstr(r->tenant));
    jsetBytes(o, "key", r->key.data, r->key.len);
    jset(o, "state", json_string(stateName(r->state)));
    jset(o, "fingerprint", jhex(r->fingerprint.data, r->fingerprint.len));
    jset(o, "token", ju64(r->token));
    jset(o, "created_at_ms", ju64(r->created_at_ms));
    jset(o, "lease_deadline_ms", ju64(r->lease_deadline_ms));
    jset(o, "expires_at_ms", ju64(r->expires_at_ms));
    jset(o, "completion", completionJson(r->completion));
    jset(o, "tombstone_ttl_ms", ju64(r->tombstone_ttl_ms));
    if (r->response.len > 0) {
        Idem__StoredResponse *sr =
            idem__stored_response__unpack(NULL, r->response.len, r->response.data);
        if (sr != NULL) {
            jset(o, "response", storedResponseJson(sr));
            idem__stored_response__free_unpacked(sr, NULL);
        } else {
            jset(o, "response", json_null());
            jset(o, "response_error", json_string("stored response does not decode"));
        }
    } else {
        jset(o, "response", json_null());
    }
    return o;
}

/* The generic view of an answer: outcome and whatever the outcome carries. */
static json_t *resultJson(const Idem__Response *resp)
{
    json_t *o = jobj();
    Idem__Outcome outcome = idem_response_outcome(resp);
    const Idem__Result *res = resp->result;
    jset(o, "outcome", json_string(idem_outcome_name((int)outcome)));
    if (res != NULL) {
        switch (outcome) {
        case IDEM__OUTCOME__OUTCOME_ACQUIRED:
            jset(o, "token", ju64(res->token));
            jset(o, "lease_deadline_ms", ju64(res->lease_deadline_ms));
            jset(o, "takeover", json_boolean(res->takeover));
            jset(o, "previous_token", res->takeover ? ju64(res->previous_token) : json_null());
            if (res->expires_at_ms != 0) {
                jset(o, "expires_at_ms", ju64(res->expires_at_ms));
            }
            break;
        case IDEM__OUTCOME__OUTCOME_IN_PROGRESS:
            jset(o, "retry_after_ms", ju64(res->retry_after_ms));
            break;
        case IDEM__OUTCOME__OUTCOME_REPLAY:
            jset(o, "response",
                 res->response != NULL ? storedResponseJson(res->response) : json_null());
            if (res->expires_at_ms != 0) {
                jset(o, "expires_at_ms", ju64(res->expires_at_ms));
            }
            break;
        case IDEM__OUTCOME__OUTCOME_OK:
            if (res->lease_deadline_ms != 0) {
                jset(o, "lease_deadline_ms", ju64(res->lease_deadline_ms)); /* renew */
            }
            break;
        default:
            break;
        }
        if (res->record != NULL) {
            jset(o, "record", recordJson(res->record));
        }
        if (res->detail != NULL && res->detail[0] != '\0') {
            jset(o, "detail", jstr(res->detail));
        }
    }
    if (resp->leader_rpc_address != NULL && resp->leader_rpc_address[0] != '\0') {
        jset(o, "leader_rpc_address", jstr(resp->leader_rpc_address));
    }
    if (resp->error != NULL && resp->error[0] != '\0') {
        /* Response.error is the node's human-readable detail; with ok it is only a note
         * ("snapshot scheduled ..."), so it is not called an error there. */
        jset(o, outcome == IDEM__OUTCOME__OUTCOME_OK ? "message" : "error", jstr(resp->error));
    }
    return o;
}

static json_t *memberJson(const Idem__Member *m)
{
    json_t *o = jobj();
    jset(o, "id", ju64(m->id));
    jset(o, "raft_address", jstr(m->raft_address));
    jset(o, "rpc_address", jstr(m->rpc_address));
    jset(o, "http_address", jstr(m->http_address));
    jset(o, "role", jstr(m->role));
    return o;
}

/* ---- output -------------------------------------------------------------------------- */

static void printJson(const json_t *o)
{
    char *s = json_dumps(o, JSON_PRESERVE_ORDER);
    if (s == NULL) {
        oom();
    }
    puts(s);
    free(s);
}

static void printScalar(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        fputs(json_string_value(v), stdout);
        break;
    case JSON_INTEGER:
        printf("%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        printf("%.0f", json_real_value(v));
        break;
    case JSON_TRUE:
        fputs("true", stdout);
        break;
    case JSON_FALSE:
        fputs("false", stdout);
        break;
    default:
        fputs("-", stdout);
        break;
    }
}

/* Human output: one `path: value` line per scalar, nested keys joined with dots. */
static void printFlat(const json_t *v, const char *prefix)
{
    char path[256];
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", k);
            printFlat(x, path);
        }
        return;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            snprintf(path, sizeof path, "%s[%zu]", prefix, i);
            printFlat(x, path);
        }
        return;
    }
    printf("%s: ", prefix);
    printScalar(v);
    putchar('\n');
}

/* Prints `o` in the chosen form and frees it. */
static void emit(const struct global *g, json_t *o)
{
    if (g->json) {
        printJson(o);
    } else {
        printFlat(o, "");
    }
    json_decref(o);
}

/* Reports a call that got no answer; returns the exit status. */
static int failCall(const struct global *g, int rv, const char *msg)
{
    const char *what = rv == IDEM_EUNAVAILABLE ? "unavailable" : idem_strerror(rv);
    fprintf(stderr, "idemctl: %s%s%s\n", what, msg[0] ? ": " : "", msg);
    int code = EXIT_INTERNAL;
    if (rv == IDEM_EUNAVAILABLE || rv == IDEM_EPROTO) {
        code = EXIT_UNAVAILABLE;
    } else if (rv == IDEM_EINVAL || rv == IDEM_ETOOBIG) {
        code = EXIT_USAGE;
    }
    if (g->json) {
        json_t *o = jobj();
        jset(o, "outcome", json_string(code == EXIT_UNAVAILABLE ? "unavailable" : "error"));
        jset(o, "error", jstr(msg[0] ? msg : idem_strerror(rv)));
        printJson(o);
        json_decref(o);
    }
    return code;
}

/* ---- calling ------------------------------------------------------------------------- */

static const char *bearer(const struct global *g, bool admin)
{
    return admin ? g->admin_token : g->token;
}

/* Sends `req` to the leader, or to `node` when it is not NULL, with the tenant or the admin
 * token. On an answer returns EXIT_ANSWERED with *resp (OUT, caller frees it with
 * idem__response__free_unpacked); otherwise reports the failure and returns the exit
 * status. */
static int call(const struct global *g, bool admin, const char *node, const Idem__Request *req,
                Idem__Response **resp)
{
    *resp = NULL;
    struct idem_client *c = NULL;
    int rv = idem_client_new(g->cluster, bearer(g, admin), &c);
    if (rv != IDEM_OK) {
        return failCall(g, rv, "cannot create the client");
    }
    if (node != NULL) {
        rv = idem_call_node(c, node, req, g->deadline_ms, resp);
    } else {
        rv = idem_call(c, req, g->deadline_ms, resp);
    }
    int code = EXIT_ANSWERED;
    if (rv != IDEM_OK) {
        code = failCall(g, rv, idem_client_errmsg(c));
    }
    idem_client_close(c);
    return code;
}

/* Prints the generic view of an answer (plus `extra`, taken, may be NULL). */
static int callAndEmit(const struct global *g, bool admin, const char *node,
                       const Idem__Request *req, json_t *extra)
{
    Idem__Response *resp = NULL;
    int code = call(g, admin, node, req, &resp);
    if (code != EXIT_ANSWERED) {
        json_decref(extra);
        return code;
    }
    json_t *o = resultJson(resp);
    if (extra != NULL) {
        json_object_update(o, extra);
        json_decref(extra);
    }
    emit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

static void requireKey(const char *cmd, const char *key)
{
    if (key == NULL) {
        cli_usage_error("%s: missing KEY", cmd);
    }
    if (key[0] == '\0') {
        cli_usage_error("%s: KEY is empty", cmd);
    }
}

/* ---- data commands ------------------------------------------------------------------- */

static int cmdClaim(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *fp = NULL, *attempt = NULL, *lease = NULL, *ttl = NULL, *policy = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--fingerprint", &fp) ||
            optValue(a, "--attempt", &attempt) || optValue(a, "--lease", &lease) ||
            optValue(a, "--ttl", &ttl) || optValue(a, "--policy", &policy)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("claim", npos ? pos[0] : NULL);
    if (fp == NULL) {
        cli_usage_error("claim: missing --fingerprint HEX64");
    }
    uint8_t fpb[32];
    if (strlen(fp) != 64) {
        cli_usage_error("claim: --fingerprint must be 64 hex digits (SHA-256), got %zu characters",
                   strlen(fp));
    }
    for (size_t i = 0; i < 32; i++) {
        int hi = OPENSSL_hexchar2int((unsigned char)fp[2 * i]);
        int lo = OPENSSL_hexchar2int((unsigned char)fp[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            cli_usage_error("claim: --fingerprint must be 64 hex digits (SHA-256)");
        }
        fpb[i] = (uint8_t)(hi << 4 | lo);
    }
    char attempt_buf[IDEM_ATTEMPT_ID_HEX + 1];
    if (attempt == NULL) {
        if (idem_attempt_id_new(attempt_buf) != IDEM_OK) {
            fputs("idemctl: no random source for an attempt id; pass --attempt\n", stderr);
            return EXIT_INTERNAL;
        }
        attempt = attempt_buf;
    } else if (strlen(attempt) > ATTEMPT_MAX) {
        cli_usage_error("claim: --attempt is longer than %d bytes", ATTEMPT_MAX);
    }
    Idem__ClaimRequest cr = IDEM__CLAIM_REQUEST__INIT;
    cr.key.data = (uint8_t *)pos[0];
    cr.key.len = strlen(pos[0]);
    cr.fingerprint.data = fpb;
    cr.fingerprint.len = sizeof fpb;
    cr.attempt_id.data = (uint8_t *)attempt;
    cr.attempt_id.len = strlen(attempt);
    cr.lease_ms = lease ? cli_parse_u64("--lease", lease, 1, MAX_DURATION_MS) : 0;
    cr.ttl_ms = ttl ? cli_parse_u64("--ttl", ttl, 1, MAX_DURATION_MS) : 0;
    if (policy == NULL) {
        cr.policy = IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED;
    } else if (strcmp(policy, "conflict") == 0) {
        cr.policy = IDEM__LEASE_POLICY__LEASE_POLICY_CONFLICT;
    } else if (strcmp(policy, "takeover") == 0) {
        cr.policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER;
    } else {
        cli_usage_error("claim: --policy must be conflict or takeover, got \"%s\"", policy);
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_CLAIM;
    req.claim = &cr;
    json_t *extra = jobj();
    jset(extra, "attempt_id", jstr(attempt));
    return callAndEmit(g, false, NULL, &req, extra);
}

/* Fills a stored response from --status and --body (both borrowed). */
static void storedResponseFill(Idem__StoredResponse *sr, const char *cmd, const char *status,
                               const char *body)
{
    (void)cmd;
    sr->status = (uint32_t)cli_parse_u64("--status", status, 100, 599);
    if (body != NULL) {
        sr->body.data = (uint8_t *)body;
        sr->body.len = strlen(body);
    }
}

static int cmdComplete(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *token = NULL, *status = NULL, *body = NULL, *outcome = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--token", &token) ||
            optValue(a, "--status", &status) || optValue(a, "--body", &body) ||
            optValue(a, "--outcome", &outcome)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("complete", npos ? pos[0] : NULL);
    if (token == NULL) {
        cli_usage_error("complete: missing --token N (the fencing token from claim)");
    }
    if (status == NULL) {
        cli_usage_error("complete: missing --status CODE");
    }
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    storedResponseFill(&sr, "complete", status, body);
    Idem__CompleteRequest cr = IDEM__COMPLETE_REQUEST__INIT;
    cr.key.data = (uint8_t *)pos[0];
    cr.key.len = strlen(pos[0]);
    cr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    cr.response = &sr;
    if (outcome == NULL || strcmp(outcome, "succeeded") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    } else if (strcmp(outcome, "failed_final") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    } else if (strcmp(outcome, "unknown") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_UNKNOWN;
    } else {
        cli_usage_error("complete: --outcome must be succeeded, failed_final or unknown, got \"%s\"",
                   outcome);
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_COMPLETE;
    req.complete = &cr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

static int cmdRelease(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *token = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--token", &token)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("release", npos ? pos[0] : NULL);
    if (token == NULL) {
        cli_usage_error("release: missing --token N (the fencing token from claim)");
    }
    Idem__ReleaseRequest rr = IDEM__RELEASE_REQUEST__INIT;
    rr.key.data = (uint8_t *)pos[0];
    rr.key.len = strlen(pos[0]);
    rr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RELEASE;
    req.release = &rr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

static int cmdRenew(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *token = NULL, *lease = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--token", &token) ||
            optValue(a, "--lease", &lease)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("renew", npos ? pos[0] : NULL);
    if (token == NULL) {
        cli_usage_error("renew: missing --token N (the fencing token from claim)");
    }
    Idem__RenewRequest rr = IDEM__RENEW_REQUEST__INIT;
    rr.key.data = (uint8_t *)pos[0];
    rr.key.len = strlen(pos[0]);
    rr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    rr.lease_ms = lease ? cli_parse_u64("--lease", lease, 1, MAX_DURATION_MS) : 0;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RENEW;
    req.renew = &rr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

static int cmdGet(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    while (a->i < a->argc) {
        if (commonOpt(g, a)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("get", npos ? pos[0] : NULL);
    Idem__GetRequest gr = IDEM__GET_REQUEST__INIT;
    gr.key.data = (uint8_t *)pos[0];
    gr.key.len = strlen(pos[0]);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &gr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

/* ---- admin commands ------------------------------------------------------------------ */

static int cmdResolve(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *tenant = NULL, *status = NULL, *body = NULL;
    bool release = false;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--tenant", &tenant) ||
            optValue(a, "--status", &status) || optValue(a, "--body", &body)) {
            continue;
        }
        if (optFlag(a, "--release")) {
            release = true;
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    requireKey("resolve", npos ? pos[0] : NULL);
    if (tenant == NULL || tenant[0] == '\0') {
        cli_usage_error("resolve: missing --tenant NAME");
    }
    if (release == (status != NULL)) {
        cli_usage_error("resolve: give exactly one of --release and --status CODE");
    }
    if (release && body != NULL) {
        cli_usage_error("resolve: --body goes with --status, not --release");
    }
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__ResolveRequest rr = IDEM__RESOLVE_REQUEST__INIT;
    rr.tenant = (char *)tenant;
    rr.key.data = (uint8_t *)pos[0];
    rr.key.len = strlen(pos[0]);
    rr.release = release;
    if (!release) {
        storedResponseFill(&sr, "resolve", status, body);
        rr.response = &sr;
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RESOLVE;
    req.resolve = &rr;
    return callAndEmit(g, true, NULL, &req, NULL);
}

static int cmdTransfer(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    while (a->i < a->argc) {
        if (commonOpt(g, a)) {
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    Idem__TransferRequest tr = IDEM__TRANSFER_REQUEST__INIT;
    tr.id = npos ? cli_parse_u64("transfer NODE_ID", pos[0], 1, UINT64_MAX) : 0;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    return callAndEmit(g, true, NULL, &req, NULL);
}

static int cmdSnapshot(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *node = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--node", &node)) {
            continue;
        }
        positional(a, pos, 0, &npos);
    }
    if (node != NULL) {
        char why[160];
        if (idem_seeds_check(node, why, sizeof why) != IDEM_OK || strchr(node, ',') != NULL) {
            cli_usage_error("snapshot: bad --node address: %s",
                       strchr(node, ',') ? "give one address" : why);
        }
        if (g->cluster == NULL) {
            g->cluster = node;
        }
    }
    if (g->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    Idem__SnapshotRequest sn = IDEM__SNAPSHOT_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_SNAPSHOT;
    req.snapshot = &sn;
    json_t *extra = NULL;
    if (node != NULL) {
        extra = jobj();
        jset(extra, "node", jstr(node));
    }
    return callAndEmit(g, true, node, &req, extra);
}

static void printMembersTable(const Idem__Response *resp)
{
    printf("%-6s %-8s %-22s %-22s %s\n", "ID", "ROLE", "RAFT_ADDRESS", "RPC_ADDRESS",
           "HTTP_ADDRESS");
    for (size_t i = 0; i < resp->n_members; i++) {
        const Idem__Member *m = resp->members[i];
        printf("%-6" PRIu64 " %-8s %-22s %-22s %s\n", m->id, m->role, m->raft_address,
               m->rpc_address, m->http_address[0] ? m->http_address : "-");
    }
}

static int cmdMembers(struct global *g, struct args *a)
{
    const char *pos[5];
    size_t npos = 0;
    while (a->i < a->argc) {
        if (commonOpt(g, a)) {
            continue;
        }
        positional(a, pos, 5, &npos);
    }
    const char *action = npos ? pos[0] : "list";
    Idem__MembersRequest mr = IDEM__MEMBERS_REQUEST__INIT;
    if (strcmp(action, "list") == 0) {
        if (npos > 1) {
            cli_usage_error("members list: unexpected argument \"%s\"", pos[1]);
        }
        mr.action = IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST;
    } else if (strcmp(action, "add") == 0) {
        if (npos < 4) {
            cli_usage_error("members add: expected ID RAFT_ADDR RPC_ADDR [HTTP_ADDR]");
        }
        mr.action = IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD;
        mr.id = cli_parse_u64("members add ID", pos[1], 1, (uint64_t)INT64_MAX + 1);
        char why[160];
        for (size_t i = 2; i < npos; i++) {
            if (idem_seeds_check(pos[i], why, sizeof why) != IDEM_OK ||
                strchr(pos[i], ',') != NULL) {
                cli_usage_error("members add: bad address %s",
                           strchr(pos[i], ',') ? "(one address each)" : why);
            }
        }
        mr.raft_address = (char *)pos[2];
        mr.rpc_address = (char *)pos[3];
        if (npos > 4) {
            mr.http_address = (char *)pos[4];
        }
    } else if (strcmp(action, "promote") == 0 || strcmp(action, "remove") == 0) {
        if (npos != 2) {
            cli_usage_error("members %s: expected ID", action);
        }
        mr.action = action[1] == 'r' ? IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE
                                     : IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE;
        mr.id = cli_parse_u64("members ID", pos[1], 1, (uint64_t)INT64_MAX + 1);
    } else {
        cli_usage_error("members: unknown action \"%s\" (list, add, promote or remove)", action);
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_MEMBERS;
    req.members = &mr;
    Idem__Response *resp = NULL;
    int code = call(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = resultJson(resp);
    /* The list is the answer to `list`; add, promote and remove answer only an outcome
     * (an empty list there would read as "no members"). */
    bool list = mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST &&
                idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_OK;
    if (list || resp->n_members > 0) {
        json_t *ms = jarr();
        for (size_t i = 0; i < resp->n_members; i++) {
            jpush(ms, memberJson(resp->members[i]));
        }
        jset(o, "members", ms);
    }
    if (!g->json && resp->n_members > 0) {
        json_object_del(o, "members");
        printFlat(o, "");
        printMembersTable(resp);
        json_decref(o);
    } else {
        emit(g, o);
    }
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* status: every address of --cluster is asked in parallel, each by its own client (a
 * client is not thread-safe), so that a silent node costs one deadline, not one each. */
struct probe {
    char addr[256];
    const char *token;
    bool digest;
    uint32_t deadline_ms;
    int rv;
    Idem__Response *resp;
    char err[512];
    pthread_t thread;
    bool started;
};

static void *probeRun(void *arg)
{
    struct probe *p = arg;
    struct idem_client *c = NULL;
    p->rv = idem_client_new(p->addr, p->token, &c);
    if (p->rv != IDEM_OK) {
        snprintf(p->err, sizeof p->err, "%s", idem_strerror(p->rv));
        return NULL;
    }
    Idem__StatusRequest sr = IDEM__STATUS_REQUEST__INIT;
    sr.digest = p->digest;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_STATUS;
    req.status = &sr;
    p->rv = idem_call_node(c, p->addr, &req, p->deadline_ms, &p->resp);
    snprintf(p->err, sizeof p->err, "%s", idem_client_errmsg(c));
    idem_client_close(c);
    return NULL;
}

/* Splits the (checked) cluster list into trimmed addresses; returns how many. */
static size_t splitCluster(const char *cluster, struct probe *probes, size_t max)
{
    size_t n = 0;
    const char *s = cluster;
    while (n < max) {
        const char *end = strchr(s, ',');
        if (end == NULL) {
            end = s + strlen(s);
        }
        const char *b = s, *e = end;
        while (b < e && (*b == ' ' || *b == '\t')) {
            b++;
        }
        while (e > b && (e[-1] == ' ' || e[-1] == '\t')) {
            e--;
        }
        if ((size_t)(e - b) >= sizeof probes[n].addr) {
            cli_usage_error("--cluster: address too long");
        }
        memcpy(probes[n].addr, b, (size_t)(e - b));
        probes[n].addr[e - b] = '\0';
        n++;
        if (*end == '\0') {
            break;
        }
        s = end + 1;
    }
    return n;
}

static json_t *nodeJson(const struct probe *p, bool *reachable, uint64_t *leader_seen)
{
    json_t *o = jobj();
    const Idem__NodeStatus *st = p->resp != NULL ? p->resp->status : NULL;
    Idem__Outcome outcome = idem_response_outcome(p->resp);
    bool ok = p->rv == IDEM_OK && st != NULL &&
              (outcome == IDEM__OUTCOME__OUTCOME_OK ||
               outcome == IDEM__OUTCOME__OUTCOME_UNSPECIFIED);
    *reachable = ok;
    *leader_seen = ok ? st->leader_id : 0;
    jset(o, "id", ok ? ju64(st->id) : json_null());
    jset(o, "rpc_address", jstr(p->addr));
    jset(o, "role", jstr(ok ? st->role : "unreachable"));
    jset(o, "term", ok ? ju64(st->term) : json_null());
    jset(o, "commit_index", ok ? ju64(st->commit_index) : json_null());
    jset(o, "applied_index", ok ? ju64(st->applied_index) : json_null());
    jset(o, "records", ok ? ju64(st->records) : json_null());
    if (ok) {
        jset(o, "leader_id", st->leader_id ? ju64(st->leader_id) : json_null());
        jset(o, "last_snapshot_index", ju64(st->last_snapshot_index));
        jset(o, "processing", ju64(st->processing));
        jset(o, "completed", ju64(st->completed));
        jset(o, "quarantined", ju64(st->quarantined));
        jset(o, "tombstones", ju64(st->tombstones));
        jset(o, "bytes", ju64(st->bytes));
        jset(o, "raft_address", jstr(st->raft_address));
        jset(o, "http_address", jstr(st->http_address));
        jset(o, "version", jstr(st->version));
        if (st->digest != NULL && st->digest[0] != '\0') {
            jset(o, "digest", jstr(st->digest));
        }
    } else if (p->rv == IDEM_OK) {
        /* Reached, but it refused (e.g. a wrong admin token) or sent no status. */
        char msg[640];
        const char *detail = p->resp->error != NULL ? p->resp->error : "";
        snprintf(msg, sizeof msg, "%s%s%s",
                 st == NULL && outcome == IDEM__OUTCOME__OUTCOME_OK
                     ? "answered without a status"
                     : idem_outcome_name((int)outcome),
                 detail[0] ? ": " : "", detail);
        jset(o, "error", jstr(msg));
    } else {
        jset(o, "error", jstr(p->err[0] ? p->err : idem_strerror(p->rv)));
    }
    return o;
}

static int cmdStatus(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    bool digest = false;
    while (a->i < a->argc) {
        if (commonOpt(g, a)) {
            continue;
        }
        if (strcmp(a->argv[a->i], "--digest") == 0) {
            digest = true;
            a->i++;
            continue;
        }
        positional(a, pos, 0, &npos);
    }
    struct probe *probes = calloc(IDEM_NODES_MAX, sizeof *probes);
    if (probes == NULL) {
        oom();
    }
    size_t n = splitCluster(g->cluster, probes, IDEM_NODES_MAX);
    for (size_t i = 0; i < n; i++) {
        probes[i].token = g->admin_token;
        probes[i].digest = digest;
        probes[i].deadline_ms = g->deadline_ms;
        probes[i].started = pthread_create(&probes[i].thread, NULL, probeRun, &probes[i]) == 0;
        if (!probes[i].started) {
            probeRun(&probes[i]); /* no thread: ask it from here */
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (probes[i].started) {
            pthread_join(probes[i].thread, NULL);
        }
    }

    json_t *nodes = jarr();
    uint64_t seen[IDEM_NODES_MAX];
    size_t reachable = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        bool ok;
        jpush(nodes, nodeJson(&probes[i], &ok, &seen[reachable]));
        if (ok) {
            reachable++;
        } else if (probes[i].rv == IDEM_OK) {
            refused++;
        }
    }
    /* The leader is the id that a majority of the reachable nodes report. */
    uint64_t leader = 0;
    for (size_t i = 0; i < reachable && leader == 0; i++) {
        size_t votes = 0;
        for (size_t j = 0; j < reachable; j++) {
            votes += seen[j] == seen[i];
        }
        if (seen[i] != 0 && 2 * votes > reachable) {
            leader = seen[i];
        }
    }
    json_t *o = jobj();
    jset(o, "leader_id", leader ? ju64(leader) : json_null());
    jset(o, "nodes", nodes);

    if (g->json) {
        printJson(o);
    } else {
        if (leader) {
            printf("leader: %" PRIu64 "\n", leader);
        } else {
            printf("leader: none (no majority of reachable nodes agrees on one)\n");
        }
        printf("%-6s %-22s %-11s %-6s %-10s %-10s %-9s %s\n", "ID", "RPC_ADDRESS", "ROLE",
               "TERM", "COMMIT", "APPLIED", "RECORDS", "NOTE");
        size_t i;
        json_t *x;
        json_array_foreach(nodes, i, x)
        {
            json_t *id = json_object_get(x, "id");
            if (json_is_null(id)) {
                printf("%-6s %-22s %-11s %s\n", "-",
                       json_string_value(json_object_get(x, "rpc_address")), "unreachable",
                       json_string_value(json_object_get(x, "error")));
                continue;
            }
            printf("%-6" JSON_INTEGER_FORMAT " %-22s %-11s %-6" JSON_INTEGER_FORMAT
                   " %-10" JSON_INTEGER_FORMAT " %-10" JSON_INTEGER_FORMAT
                   " %-9" JSON_INTEGER_FORMAT " %s\n",
                   json_integer_value(id), json_string_value(json_object_get(x, "rpc_address")),
                   json_string_value(json_object_get(x, "role")),
                   json_integer_value(json_object_get(x, "term")),
                   json_integer_value(json_object_get(x, "commit_index")),
                   json_integer_value(json_object_get(x, "applied_index")),
                   json_integer_value(json_object_get(x, "records")),
                   json_string_value(json_object_get(x, "version")));
        }
    }
    json_decref(o);
    for (size_t i = 0; i < n; i++) {
        if (probes[i].rv != IDEM_OK) {
            if (probes[i].err[0] != '\0') {
                fprintf(stderr, "idemctl: %s\n", probes[i].err); /* names the address */
            } else {
                fprintf(stderr, "idemctl: %s: %s\n", probes[i].addr, idem_strerror(probes[i].rv));
            }
        } else if (probes[i].resp != NULL && probes[i].resp->status == NULL) {
            fprintf(stderr, "idemctl: %s refused status: %s%s%s\n", probes[i].addr,
                    idem_outcome_name((int)idem_response_outcome(probes[i].resp)),
                    probes[i].resp->error[0] ? ": " : "", probes[i].resp->error);
        }
        if (probes[i].resp != NULL) {
            idem__response__free_unpacked(probes[i].resp, NULL);
        }
    }
    free(probes);
    /* Answered when any node answered, even with a refusal; 3 when none was reachable. */
    return reachable + refused > 0 ? EXIT_ANSWERED : EXIT_UNAVAILABLE;
}

/* ---- main ---------------------------------------------------------------------------- */

struct command {
    const char *name;
    int (*run)(struct global *g, struct args *a);
    bool admin;
};

static const struct command commands[] = {
    {"status", cmdStatus, true},     {"claim", cmdClaim, false},
    {"complete", cmdComplete, false}, {"release", cmdRelease, false},
    {"renew", cmdRenew, false},       {"get", cmdGet, false},
    {"members", cmdMembers, true},    {"transfer", cmdTransfer, true},
    {"snapshot", cmdSnapshot, true},  {"resolve", cmdResolve, true},
};

static const char *envOrNull(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

int main(int argc, char **argv)
{
    cli_set_prog("idemctl");
    struct global g = {
        .cluster = envOrNull("IDEM_CLUSTER"),
        .token = envOrNull("IDEM_TOKEN"),
        .admin_token = envOrNull("IDEM_ADMIN_TOKEN"),
        .json = false,
        .deadline_ms = DEFAULT_DEADLINE_MS,
    };
    struct args a = {.argc = argc, .argv = argv, .i = 1, .dashdash = false, .cmd = NULL};
    while (a.i < argc && isOption(argv[a.i])) {
        const char *v;
        if (optValue(&a, "--cluster", &v)) {
            g.cluster = v;
        } else if (optValue(&a, "--token", &v)) {
            g.token = v;
        } else if (optValue(&a, "--admin-token", &v)) {
            g.admin_token = v;
        } else if (!commonOpt(&g, &a)) {
            cli_usage_error("unknown option %s", argv[a.i]);
        }
    }
    if (a.i >= argc) {
        cli_usage_error("no command given");
    }
    const char *word = argv[a.i++];
    const struct command *cmd = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(word, commands[i].name) == 0) {
            cmd = &commands[i];
        }
    }
    if (cmd == NULL) {
        cli_usage_error("unknown command \"%s\"", word);
    }
    a.cmd = cmd->name;

    /* Configuration errors are reported before the command's own arguments are parsed
     * only where they do not depend on them (snapshot --node may stand in for --cluster). */
    if (g.cluster != NULL) {
        char why[160];
        if (idem_seeds_check(g.cluster, why, sizeof why) != IDEM_OK) {
            cli_usage_error("bad --cluster: %s", why);
        }
    } else if (strcmp(cmd->name, "snapshot") != 0) {
        /* Let --help after the command still work without a cluster. */
        for (int i = a.i; i < argc && strcmp(argv[i], "--") != 0; i++) {
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                printHelp();
            }
        }
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    const char *tok = bearer(&g, cmd->admin);
    if (tok == NULL || tok[0] == '\0') {
        for (int i = a.i; i < argc && strcmp(argv[i], "--") != 0; i++) {
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                printHelp();
            }
        }
        cli_usage_error(cmd->admin ? "%s needs the admin token: pass --admin-token T (before the "
                                "command) or set IDEM_ADMIN_TOKEN"
                              : "%s needs a bearer token: pass --token T (before the "
                                "command) or set IDEM_TOKEN",
                   cmd->name);
    }
    int code = cmd->run(&g, &a);
    fflush(stdout);
    return code;
}
