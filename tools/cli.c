#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem.h"

static const char *cliProg = "idem";
static bool cliJson = false;

void cli_set_prog(const char *prog)
{
    cliProg = prog;
}

void cli_set_json(bool on)
{
    cliJson = on;
}

void cli_json_outcome(const char *outcome, char *msg)
{
    json_t *s = json_string(msg);
    if (s == NULL) {
        for (char *p = msg; *p; p++) {
            if ((unsigned char)*p >= 0x80) {
                *p = '?';
            }
        }
        s = json_string(msg);
    }
    json_t *o = json_object();
    char *text = NULL;
    if (o != NULL && s != NULL && json_object_set_new(o, "outcome", json_string(outcome)) == 0 &&
        json_object_set(o, "error", s) == 0) {
        text = json_dumps(o, JSON_PRESERVE_ORDER);
    }
    if (text != NULL) {
        puts(text);
        fflush(stdout);
    }
    free(text);
    json_decref(s);
    json_decref(o);
}

void cli_usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\nTry '%s --help'.\n", cliProg, msg, cliProg);
    if (cliJson) {
        cli_json_outcome("usage", msg);
    }
    exit(CLI_EXIT_USAGE);
}

void cli_unknown_option(const char *cmd, const char *arg)
{
    cli_usage_error("%s%sunknown option %.*s%s", cmd != NULL ? cmd : "", cmd != NULL ? ": " : "",
                    (int)strcspn(arg, "="), arg,
                    strchr(arg, '=') != NULL ? "=... (its value not shown)" : "");
}

uint64_t cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
    uint64_t v = 0;
    if (s[0] == '\0') {
        cli_usage_error("%s: expected a number, got an empty value", what);
    }
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') {
            /* Not shown: a value typed for another option may be a token. */
            cli_usage_error("%s: not a number (decimal digits only; the value is not shown)",
                            what);
        }
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) {
            cli_usage_error("%s: %s is out of range (%" PRIu64 "..%" PRIu64 ")", what, s, min, max);
        }
        v = v * 10 + d;
    }
    if (v < min || v > max) {
        cli_usage_error("%s: %s is out of range (%" PRIu64 "..%" PRIu64 ")", what, s, min, max);
    }
    return v;
}

bool cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val,
                   const char *cmd)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) {
        return false;
    }
    if (arg[n] == '=') {
        *val = arg + n + 1;
        (*i)++;
        return true;
    }
    if (arg[n] != '\0') {
        return false;
    }
    if (*i + 1 >= argc) {
        cli_usage_error("%s%soption %s needs a value", cmd ? cmd : "", cmd ? ": " : "", name);
    }
    *val = argv[*i + 1];
    *i += 2;
    return true;
}

const char *cli_env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

char *cli_token_file(const char *opt, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        cli_usage_error("%s %s: %s", opt, path, strerror(errno));
    }
    char *buf = calloc(1, 4097);
    if (buf == NULL) {
        cli_usage_error("%s: out of memory", opt);
    }
    size_t n = fread(buf, 1, 4096, f);
    bool err = ferror(f) != 0;
    fclose(f);
    if (err) {
        cli_usage_error("%s %s: cannot be read", opt, path);
    }
    size_t len = strcspn(buf, "\r\n"); /* the first line */
    if (len == n && n == 4096) {
        cli_usage_error("%s %s: the token is longer than 4095 bytes", opt, path);
    }
    for (size_t i = 0; i < len; i++) {
        if (buf[i] < 0x21 || buf[i] > 0x7e) {
            cli_usage_error("%s %s: the token has a byte that is not printable ASCII", opt, path);
        }
    }
    if (len == 0) {
        cli_usage_error("%s %s: no token on its first line", opt, path);
    }
    buf[len] = '\0';
    return buf;
}

void cli_tls_from_env(struct cli_tls *t)
{
    const char *on = cli_env("IDEM_TLS");
    t->on = on != NULL && strcmp(on, "0") != 0 && strcmp(on, "false") != 0 && strcmp(on, "no") != 0;
    t->ca_file = cli_env("IDEM_TLS_CA");
    t->cert_file = cli_env("IDEM_TLS_CERT");
    t->key_file = cli_env("IDEM_TLS_KEY");
    t->server_name = cli_env("IDEM_TLS_SERVER_NAME");
}

/* The TLS flags that take a value, in the order of their slots in cli_tls_flag. */
static const char *const tlsValueNames[] = {"--tls-ca", "--tls-cert", "--tls-key",
                                            "--tls-server-name"};

bool cli_tls_takes_value(const char *arg)
{
    for (size_t k = 0; k < sizeof tlsValueNames / sizeof tlsValueNames[0]; k++) {
        if (strcmp(arg, tlsValueNames[k]) == 0) {
            return true;
        }
    }
    return false;
}

bool cli_tls_flag(struct cli_tls *t, int argc, char **argv, int *i)
{
    const char **slots[] = {&t->ca_file, &t->cert_file, &t->key_file, &t->server_name};
    const char *arg = argv[*i];
    if (strcmp(arg, "--tls") == 0) {
        t->on = true;
        (*i)++;
        return true;
    }
    for (size_t k = 0; k < sizeof tlsValueNames / sizeof tlsValueNames[0]; k++) {
        const char *v;
        if (!cli_opt_value(argc, argv, i, tlsValueNames[k], &v, NULL)) {
            continue;
        }
        if (v[0] == '\0') {
            cli_usage_error("%s: empty value", tlsValueNames[k]);
        }
        *slots[k] = v;
        return true;
    }
    return false;
}

bool cli_tls_wanted(const struct cli_tls *t)
{
    return t->on || t->ca_file != NULL || t->cert_file != NULL || t->key_file != NULL ||
           t->server_name != NULL;
}

void cli_tls_options(const struct cli_tls *t, struct idem_options *o)
{
    o->tls = cli_tls_wanted(t) ? 1 : 0;
    o->tls_ca_file = t->ca_file;
    o->tls_cert_file = t->cert_file;
    o->tls_key_file = t->key_file;
    o->tls_server_name = t->server_name;
}
