#include "cli.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static const char *cliProg = "idem";

void cli_set_prog(const char *prog)
{
    cliProg = prog;
}

void cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", cliProg);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", cliProg);
    exit(CLI_EXIT_USAGE);
}

uint64_t cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
    uint64_t v = 0;
    if (s[0] == '\0') {
        cli_usage_error("%s: expected a number, got an empty value", what);
    }
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') {
            cli_usage_error("%s: \"%s\" is not a number", what, s);
        }
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) {
            cli_usage_error("%s: %s is out of range (%" PRIu64 "..%" PRIu64 ")", what, s, min,
                            max);
        }
        v = v * 10 + d;
    }
    if (v < min || v > max) {
        cli_usage_error("%s: %s is out of range (%" PRIu64 "..%" PRIu64 ")", what, s, min, max);
    }
    return v;
}
