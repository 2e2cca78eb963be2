/* output: how idemctl prints: one JSON object (--json) or `key: value` lines, UTC times
 * next to Unix ms, a failed call's message with hints about TLS, and out of memory. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemctl.h"

void outOom(void)
{
    fputs("idemctl: out of memory\n", stderr);
    exit(EXIT_INTERNAL);
}

void outPrintJson(const json_t *o)
{
    char *s = json_dumps(o, JSON_PRESERVE_ORDER);
    if (s == NULL) {
        outOom();
    }
    puts(s);
    free(s);
}

void outPutSafe(const char *s, size_t len, FILE *f)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f) {
            fprintf(f, "\\x%02x", p[i]);
        } else if (p[i] == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f) {
            fprintf(f, "\\u%04x", p[i + 1]); /* a C1 control, U+0080..U+009F */
            i++;
        } else if (p[i] == '\\') {
            fputs("\\\\", f);
        } else {
            fputc(p[i], f);
        }
    }
}

static void printScalar(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        /* An empty string (an empty body, say) would look like a missing value. */
        if (json_string_length(v) > 0) {
            outPutSafe(json_string_value(v), json_string_length(v), stdout);
        } else {
            fputs("(empty)", stdout);
        }
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

/* Writes Unix ms as an RFC 3339 UTC time ("2026-11-30T07:02:11.123Z") into out (OUT). */
void outIsoTime(uint64_t ms, char *out, size_t len)
{
    time_t secs = (time_t)(ms / 1000u);
    struct tm tm;
    char buf[32];
    if (ms / 1000u > (uint64_t)INT32_MAX * 64u || gmtime_r(&secs, &tm) == NULL ||
        strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
        snprintf(out, len, "-");
        return;
    }
    snprintf(out, len, "%s.%03uZ", buf, (unsigned)(ms % 1000u));
}

/* Whether a field holds a Unix ms time, shown with its UTC time in human output. */
static bool isTimeField(const char *path)
{
    static const char *const names[] = {"created_at_ms", "lease_deadline_ms", "expires_at_ms",
                                        "since_ms"};
    size_t n = strlen(path);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t m = strlen(names[i]);
        if (n >= m && strcmp(path + n - m, names[i]) == 0 && (n == m || path[n - m - 1] == '.')) {
            return true;
        }
    }
    return false;
}

/* Human output: one `path: value` line per scalar, nested keys joined with dots. */
void outPrintFlat(const json_t *v, const char *prefix)
{
    char path[256];
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", k);
            outPrintFlat(x, path);
        }
        return;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            snprintf(path, sizeof path, "%s[%zu]", prefix, i);
            outPrintFlat(x, path);
        }
        return;
    }
    outPutSafe(prefix, strlen(prefix), stdout);
    fputs(": ", stdout);
    printScalar(v);
    if (json_is_integer(v) && json_integer_value(v) >= 1000000000000 && isTimeField(prefix)) {
        char when[40];
        outIsoTime((uint64_t)json_integer_value(v), when, sizeof when);
        printf(" (%s)", when);
    }
    putchar('\n');
}

/* The outcome of an answer printed that refused the bearer token (outNoteOutcome()). */
static const char *tokenRefused;

void outNoteOutcome(const json_t *o)
{
    const char *outcome = json_string_value(json_object_get(o, "outcome"));
    if (outcome != NULL && strcmp(outcome, "unauthenticated") == 0) {
        tokenRefused = "unauthenticated";
    } else if (outcome != NULL && strcmp(outcome, "forbidden") == 0) {
        tokenRefused = "forbidden";
    }
}

const char *outTokenRefused(void)
{
    return tokenRefused;
}

/* Prints `o` in the chosen form and frees it. */
void outEmit(const struct global *g, json_t *o)
{
    outNoteOutcome(o);
    if (g->json) {
        outPrintJson(o);
    } else {
        outPrintFlat(o, "");
    }
    json_decref(o);
}

enum {
    HINT_TLS_CERT = 1,     /* a handshake or certificate failure */
    HINT_NOT_TLS = 2,      /* --tls against a plaintext listener */
    HINT_TLS_LISTENER = 4, /* plaintext against a TLS listener */
};

/* The hints that a connection failure's text (explained) calls for. */
unsigned outHintsFor(const struct global *g, const char *msg)
{
    unsigned h = 0;
    if (cli_tls_wanted(&g->tls) && strstr(msg, "wrong version number") != NULL) {
        /* OpenSSL's words when the answer to its ClientHello is no TLS record. */
        h |= HINT_NOT_TLS;
    } else if (strstr(msg, ": tls handshake") != NULL ||
               strstr(msg, ": tls: certificate") != NULL) {
        /* Not after a read or write on an established TLS connection: a node that closed it
         * is not a certificate problem. */
        h |= HINT_TLS_CERT;
    }
    if (!cli_tls_wanted(&g->tls) && strstr(msg, "closed by the node") != NULL) {
        h |= HINT_TLS_LISTENER;
    }
    return h;
}

void outPrintHints(unsigned h)
{
    if (h & HINT_NOT_TLS) {
        fprintf(stderr, "idemctl: the node may not speak TLS (tls.rpc off): it answered the TLS "
                        "handshake with something else; drop --tls and the --tls-* options "
                        "(and IDEM_TLS*) for such nodes\n");
    }
    if (h & HINT_TLS_CERT) {
        fprintf(stderr, "idemctl: the TLS connection failed: check --tls-ca (the CA that "
                        "signed the nodes' certificates), --tls-server-name, and --tls-cert/"
                        "--tls-key where the nodes require client certificates\n");
    }
    if (h & HINT_TLS_LISTENER) {
        fprintf(stderr, "idemctl: a node closed the connection: if the nodes serve the RPC "
                        "over TLS (tls.rpc: true), pass --tls-ca\n");
    }
}

/* Reports a call that got no answer; returns the exit status. */
int outFailCall(const struct global *g, int rv, const char *why)
{
    const char *what = rv == IDEM_EUNAVAILABLE ? "unavailable" : idem_strerror(rv);
    fprintf(stderr, "idemctl: %s%s", what, why[0] ? ": " : "");
    outPutSafe(why, strlen(why), stderr); /* may carry a node's words */
    fputc('\n', stderr);
    if (rv == IDEM_EUNAVAILABLE) {
        outPrintHints(outHintsFor(g, why));
    }
    int code = EXIT_INTERNAL;
    if (rv == IDEM_EUNAVAILABLE || rv == IDEM_EPROTO) {
        code = EXIT_UNAVAILABLE;
    } else if (rv == IDEM_EINVAL || rv == IDEM_ETOOBIG || rv == IDEM_ETLS) {
        code = EXIT_USAGE;
    }
    if (g->json) {
        json_t *o = jobj();
        jset(o, "outcome", json_string(code == EXIT_UNAVAILABLE ? "unavailable" : "error"));
        jset(o, "error", jstr(why[0] ? why : idem_strerror(rv)));
        if (g->fail_extra != NULL) {
            json_object_update(o, g->fail_extra);
        }
        outPrintJson(o);
        json_decref(o);
    }
    return code;
}
