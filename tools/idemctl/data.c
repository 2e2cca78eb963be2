/* data: the data commands of docs/contract.md by hand, with the tenant's token: claim (its
 * fingerprint given, or computed from a request with the gateway's code, fingerprint.c),
 * complete, release, renew and get. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "fingerprint.h"
#include "idemctl.h"

#define MAX_DURATION_MS 315360000000ull /* lease and ttl: at most ten years */
#define ATTEMPT_MAX 64                  /* bytes of attempt id (idem.proto ClaimCmd) */
#define REQUEST_BODY_MAX (1u << 20)     /* the gateway's and the proxy's body limit */

/* The bytes of FILE, or of standard input for "-", at most REQUEST_BODY_MAX of them (the
 * gateway's and the proxy's own limit); *len (OUT) their number. Exits 2 when it cannot. */
static uint8_t *readRequestBody(const char *file, size_t *len)
{
    FILE *f = strcmp(file, "-") == 0 ? stdin : fopen(file, "rb");
    if (f == NULL) {
        cli_usage_error("claim: --request-body %s: %s", file, strerror(errno));
    }
    uint8_t *buf = malloc(REQUEST_BODY_MAX + 1);
    if (buf == NULL) {
        outOom();
    }
    size_t n = fread(buf, 1, REQUEST_BODY_MAX + 1, f);
    bool err = ferror(f) != 0;
    if (f != stdin) {
        fclose(f);
    }
    if (err || n > REQUEST_BODY_MAX) {
        free(buf);
        cli_usage_error("claim: --request-body %s: %s", file,
                        err ? "cannot read it" : "over 1 MiB, the gateway's limit of a body");
    }
    *len = n;
    return buf;
}

/* The request a claim's fingerprint is computed from: --method, --path, --content-type,
 * --request-body, and the repeated --fingerprint-field and --fingerprint-ignore. */
struct requestSpec {
    const char *method, *path, *ctype, *file;
    const char *fields[FP_POINTERS_MAX], *ignore[FP_POINTERS_MAX];
    size_t n_fields, n_ignore;
};

/* Exits 2 when a pointer of list `opt` (ptrs[0..n)) breaks a rule of fp_pointer_check(). */
static void checkPointers(const char *opt, const char *const *ptrs, size_t n, bool ignore)
{
    for (size_t i = 0; i < n; i++) {
        const char *rule = fp_pointer_check(ptrs[i], strlen(ptrs[i]), ignore);
        if (rule != NULL) {
            cli_usage_error("claim: %s (number %zu): %s", opt, i + 1, rule);
        }
    }
}

/* The fingerprint of the request rs names, for tenant `tenant`, with the gateway's own code
 * (server/fingerprint.c): the fingerprint the JSON API's `request` form and proxy mode
 * compute for that request (docs/idemctl.md). */
static void requestFingerprint(const char *tenant, const struct requestSpec *rs,
                               uint8_t out[FP_LEN])
{
    if (tenant == NULL || tenant[0] == '\0') {
        cli_usage_error("claim: a request's fingerprint needs --tenant NAME (the tenant of "
                        "--token: it is part of the fingerprint)");
    }
    if (rs->method[0] == '\0' || rs->path[0] == '\0') {
        cli_usage_error("claim: --method and --path must not be empty");
    }
    checkPointers("--fingerprint-field", rs->fields, rs->n_fields, false);
    checkPointers("--fingerprint-ignore", rs->ignore, rs->n_ignore, true);
    size_t len = 0;
    uint8_t *body = rs->file != NULL ? readRequestBody(rs->file, &len) : NULL;
    struct fp_input in = {.method = rs->method,
                          .path = rs->path,
                          .tenant = tenant,
                          .content_type = body != NULL ? rs->ctype : NULL,
                          .body = body,
                          .body_len = len,
                          .fields = rs->fields,
                          .n_fields = rs->n_fields,
                          .ignore = rs->ignore,
                          .n_ignore = rs->n_ignore};
    int rc = fp_compute(&in, out);
    free(body);
    if (rc != FP_OK) {
        cli_usage_error("claim: --request-body %s: %s", rs->file ? rs->file : "", fp_strerror(rc));
    }
}

/* --fingerprint HEX64 into out. */
static void hexFingerprint(const char *fp, uint8_t out[FP_LEN])
{
    if (strlen(fp) != 64) {
        cli_usage_error("claim: --fingerprint must be 64 hex digits (SHA-256), got %zu characters",
                        strlen(fp));
    }
    for (size_t i = 0; i < FP_LEN; i++) {
        int hi = OPENSSL_hexchar2int((unsigned char)fp[2 * i]);
        int lo = OPENSSL_hexchar2int((unsigned char)fp[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            cli_usage_error("claim: --fingerprint must be 64 hex digits (SHA-256)");
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
}

int dataCmdClaim(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *fp = NULL, *attempt = NULL, *lease = NULL, *ttl = NULL, *policy = NULL;
    const char *file = NULL, *method = NULL, *path = NULL, *ctype = NULL, *tenant = NULL;
    struct requestSpec rs = {0};
    const struct argsOpt opts[] = {
        {"--fingerprint", &fp, NULL},     {"--attempt", &attempt, NULL},
        {"--lease", &lease, NULL},        {"--ttl", &ttl, NULL},
        {"--policy", &policy, NULL},      {"--request-body", &file, NULL},
        {"--method", &method, NULL},      {"--path", &path, NULL},
        {"--content-type", &ctype, NULL}, {"--tenant", &tenant, NULL}};
    const struct argsRepeat reps[] = {
        {"--fingerprint-field", rs.fields, FP_POINTERS_MAX, &rs.n_fields},
        {"--fingerprint-ignore", rs.ignore, FP_POINTERS_MAX, &rs.n_ignore}};
    argsParseRepeat(g, a, opts, sizeof opts / sizeof opts[0], reps, 2, pos, 1, &npos);
    argsRequireKey("claim", npos ? pos[0] : NULL);
    bool request = file != NULL || method != NULL || path != NULL || ctype != NULL ||
                   rs.n_fields > 0 || rs.n_ignore > 0;
    if (fp != NULL && request) {
        cli_usage_error("claim: --fingerprint or a request (--request-body, --method, --path, "
                        "--content-type, --fingerprint-field, --fingerprint-ignore), not both");
    }
    /* --tenant alone names a request too: POST / with an empty body, the defaults. */
    if (fp == NULL && !request && tenant == NULL) {
        cli_usage_error("claim: missing --fingerprint HEX64, or --tenant NAME and the request "
                        "(--request-body FILE|-, --method, --path: POST / without a body by "
                        "default)");
    }
    if (fp == NULL && ctype != NULL && file == NULL) {
        cli_usage_error("claim: --content-type needs --request-body");
    }
    uint8_t fpb[FP_LEN];
    if (fp != NULL) {
        hexFingerprint(fp, fpb);
    } else {
        rs.method = method ? method : "POST";
        rs.path = path ? path : "/";
        rs.ctype = ctype ? ctype : "application/json";
        rs.file = file;
        requestFingerprint(tenant, &rs, fpb);
    }
    char attempt_buf[IDEM_ATTEMPT_ID_HEX + 1];
    if (attempt == NULL) {
        if (idem_attempt_id_new(attempt_buf) != IDEM_OK) {
            fputs("idemctl: no random source for an attempt id; pass --attempt\n", stderr);
            return EXIT_INTERNAL;
        }
        attempt = attempt_buf;
    } else if (attempt[0] == '\0') {
        /* An empty attempt id makes the claim not retry-safe: refused like other empty
         * values. */
        cli_usage_error("claim: --attempt is empty (leave it out for a random attempt id)");
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
    if (fp == NULL) { /* computed here: shown, so that it can be passed as --fingerprint */
        jset(extra, "fingerprint", jhex(fpb, FP_LEN));
    }
    /* Unanswered, the claim may still have been applied: only its attempt id gets that
     * lease back, so it is printed with the failure too. */
    g->fail_extra = json_incref(extra);
    int code = callAndEmit(g, false, NULL, &req, extra);
    json_decref(g->fail_extra);
    g->fail_extra = NULL;
    if (code == EXIT_UNAVAILABLE) {
        fprintf(stderr,
                "idemctl: the claim may have been applied: send it again with --attempt %s to "
                "get its lease back\n",
                attempt);
    }
    return code;
}

/* Fills a stored response from --status and --body (both borrowed). The status must be a
 * final one, 200-599, as the nodes require of a stored response (1xx answer invalid). */
void dataStoredResponseFill(Idem__StoredResponse *sr, const char *cmd, const char *status,
                            const char *body)
{
    char what[48];
    snprintf(what, sizeof what, "%s --status", cmd);
    sr->status = (uint32_t)cli_parse_u64(what, status, 200, 599);
    if (body != NULL) {
        sr->body.data = (uint8_t *)body;
        sr->body.len = strlen(body);
    }
}

/* The arguments of a command on the claim of KEY: KEY, --token N (both required; the
 * token's text in *token, OUT) and the command's other options (opts, at most 3).
 * Returns KEY. */
static const char *keyAndToken(struct global *g, struct args *a, const char *cmd,
                               const struct argsOpt *opts, size_t n_opts, const char **token)
{
    struct argsOpt all[4] = {{"--token", token, NULL}};
    for (size_t i = 0; i < n_opts && i + 1 < sizeof all / sizeof all[0]; i++) {
        all[i + 1] = opts[i];
    }
    const char *pos[1];
    size_t npos = 0;
    *token = NULL;
    argsParse(g, a, all, 1 + n_opts, pos, 1, &npos);
    argsRequireKey(cmd, npos ? pos[0] : NULL);
    if (*token == NULL) {
        cli_usage_error("%s: missing --token N (the fencing token from claim)", cmd);
    }
    return pos[0];
}

int dataCmdComplete(struct global *g, struct args *a)
{
    const char *token, *status = NULL, *body = NULL, *outcome = NULL;
    const struct argsOpt opts[] = {
        {"--status", &status, NULL}, {"--body", &body, NULL}, {"--outcome", &outcome, NULL}};
    const char *key = keyAndToken(g, a, "complete", opts, sizeof opts / sizeof opts[0], &token);
    if (status == NULL) {
        cli_usage_error("complete: missing --status CODE");
    }
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    dataStoredResponseFill(&sr, "complete", status, body);
    Idem__CompleteRequest cr = IDEM__COMPLETE_REQUEST__INIT;
    cr.key.data = (uint8_t *)key;
    cr.key.len = strlen(key);
    cr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    cr.response = &sr;
    if (outcome == NULL || strcmp(outcome, "succeeded") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    } else if (strcmp(outcome, "failed_final") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_FAILED_FINAL;
    } else if (strcmp(outcome, "unknown") == 0) {
        cr.outcome = IDEM__COMPLETION__COMPLETION_UNKNOWN;
    } else {
        cli_usage_error(
            "complete: --outcome must be succeeded, failed_final or unknown, got \"%s\"", outcome);
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_COMPLETE;
    req.complete = &cr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

int dataCmdRelease(struct global *g, struct args *a)
{
    const char *token;
    const char *key = keyAndToken(g, a, "release", NULL, 0, &token);
    Idem__ReleaseRequest rr = IDEM__RELEASE_REQUEST__INIT;
    rr.key.data = (uint8_t *)key;
    rr.key.len = strlen(key);
    rr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RELEASE;
    req.release = &rr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

int dataCmdRenew(struct global *g, struct args *a)
{
    const char *token, *lease = NULL;
    const struct argsOpt opts[] = {{"--lease", &lease, NULL}};
    const char *key = keyAndToken(g, a, "renew", opts, 1, &token);
    Idem__RenewRequest rr = IDEM__RENEW_REQUEST__INIT;
    rr.key.data = (uint8_t *)key;
    rr.key.len = strlen(key);
    rr.token = cli_parse_u64("--token", token, 1, UINT64_MAX);
    rr.lease_ms = lease ? cli_parse_u64("--lease", lease, 1, MAX_DURATION_MS) : 0;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RENEW;
    req.renew = &rr;
    return callAndEmit(g, false, NULL, &req, NULL);
}

int dataCmdGet(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    argsParse(g, a, NULL, 0, pos, 1, &npos);
    argsRequireKey("get", npos ? pos[0] : NULL);
    Idem__GetRequest gr = IDEM__GET_REQUEST__INIT;
    gr.key.data = (uint8_t *)pos[0];
    gr.key.len = strlen(pos[0]);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &gr;
    return callAndEmit(g, false, NULL, &req, NULL);
}
