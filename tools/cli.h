/* cli: what idemctl and idem-bench share on their command lines: usage errors and numbers. */
#ifndef IDEM_TOOLS_CLI_H
#define IDEM_TOOLS_CLI_H

#include <stdint.h>

#define CLI_EXIT_USAGE 2

/* The program name used in messages ("idemctl"); a static string, borrowed. */
void cli_set_prog(const char *prog);

/* Prints "PROG: message" and a pointer to --help on stderr, exits with CLI_EXIT_USAGE. */
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Parses a plain decimal number in [min, max], or exits with a usage error naming `what`.
 * `what` and `s` are borrowed. */
uint64_t cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max);

#endif
