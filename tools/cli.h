/* cli: what idemctl and idem-bench share on their command lines: usage errors, option values,
 * the environment, numbers and the TLS flags. */
#ifndef IDEM_TOOLS_CLI_H
#define IDEM_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

struct idem_options;

#define CLI_EXIT_USAGE 2

/* The program name used in messages ("idemctl"); a static string, borrowed. */
void cli_set_prog(const char *prog);

/* Whether usage errors also print {"outcome": "usage", "error": "message"} on stdout (the
 * program's --json); off until set. */
void cli_set_json(bool on);

/* Prints "PROG: message" and a pointer to --help on stderr (and with cli_set_json(true)
 * the JSON object above on stdout), exits with CLI_EXIT_USAGE. */
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* cli_usage_error for an unknown option `arg` (of command `cmd`, NULL: a global one), named
 * without its value: "--admin-token=T" in the wrong place would show the token. */
void cli_unknown_option(const char *cmd, const char *arg) __attribute__((noreturn));

/* Prints {"outcome": OUTCOME, "error": msg} on stdout (and flushes it); bytes of msg that
 * are not UTF-8 (from an argument or an address quoted in it) are replaced by '?' in
 * place. Both borrowed. */
void cli_json_outcome(const char *outcome, char *msg);

/* Parses a plain decimal number in [min, max], or exits with a usage error naming `what`.
 * `what` and `s` are borrowed. */
uint64_t cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max);

/* If argv[*i] is `name` ("--x", its value the next argument) or "name=value", stores the
 * value in *val (borrowed from argv), advances *i past it and returns true; false (and
 * nothing consumed) otherwise, also for a longer name ("--xy"). `name` without a value
 * after it is a usage error, "option NAME needs a value", prefixed with "CMD: " when cmd
 * (the subcommand being parsed) is not NULL. */
bool cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val,
                   const char *cmd);

/* The value of environment variable `name`, or NULL when it is unset or empty. */
const char *cli_env(const char *name);

/* A bearer token read from the file at path (for option `opt`, named in errors): its first
 * line without the line end, at most 4095 bytes, of printable ASCII. Any other content, an
 * empty token or a file that cannot be read is a usage error. The result is the caller's
 * (free() it; it stays for the process's life in the tools). */
char *cli_token_file(const char *opt, const char *path);

/* TLS to the nodes' RPC listeners (tls.rpc on the nodes), the same flags and environment
 * for idemctl and idem-bench. Every string is borrowed from argv or the environment. */
struct cli_tls {
    bool on;                 /* --tls (or IDEM_TLS=1): TLS with the system CA store */
    const char *ca_file;     /* --tls-ca FILE (IDEM_TLS_CA) */
    const char *cert_file;   /* --tls-cert FILE (IDEM_TLS_CERT) */
    const char *key_file;    /* --tls-key FILE (IDEM_TLS_KEY) */
    const char *server_name; /* --tls-server-name NAME (IDEM_TLS_SERVER_NAME) */
};

/* The --help lines of the TLS flags. */
#define CLI_TLS_HELP                                                                               \
    "  --tls                  speak TLS to the nodes (implied by any --tls-* flag); the\n"         \
    "                         nodes' certificates are checked against the system CA store\n"       \
    "                         unless --tls-ca is given (env IDEM_TLS=1)\n"                         \
    "  --tls-ca FILE          CA certificate(s) (PEM) that signed the nodes' certificates\n"       \
    "                         (env IDEM_TLS_CA)\n"                                                 \
    "  --tls-cert FILE        client certificate (PEM), for nodes that require one; with\n"        \
    "                         --tls-key (env IDEM_TLS_CERT)\n"                                     \
    "  --tls-key FILE         its private key (PEM) (env IDEM_TLS_KEY)\n"                          \
    "  --tls-server-name NAME the name (or IP) every node's certificate must carry, instead\n"     \
    "                         of the host of its address (env IDEM_TLS_SERVER_NAME)\n"

/* Fills t from the environment (IDEM_TLS, IDEM_TLS_CA, IDEM_TLS_CERT, IDEM_TLS_KEY,
 * IDEM_TLS_SERVER_NAME; empty values count as unset). */
void cli_tls_from_env(struct cli_tls *t);

/* If argv[*i] is one of the TLS flags ("--tls-ca FILE" or "--tls-ca=FILE", ... or "--tls"),
 * stores it in t, advances *i past it (and its value) and returns true. A flag without its
 * value is a usage error. */
bool cli_tls_flag(struct cli_tls *t, int argc, char **argv, int *i);

/* Whether arg is a TLS flag given with its value as the next argument ("--tls-ca", ...;
 * not "--tls-ca=FILE"): for scans that skip option values. */
bool cli_tls_takes_value(const char *arg);

/* Whether TLS is on (--tls or any file or name set). */
bool cli_tls_wanted(const struct cli_tls *t);

/* Copies t into the TLS fields of o (borrowed pointers). */
void cli_tls_options(const struct cli_tls *t, struct idem_options *o);

#endif
