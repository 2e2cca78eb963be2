/* args: idemctl's argument cursor: options with and without values, the options every
 * command takes (--json or -o, --deadline, --help), and positional arguments, with usage errors
 * that never show a KEY. */
#include <stdio.h>
#include <string.h>

#include "idemctl.h"

#define MAX_DEADLINE_MS 600000u /* the server's own ceiling (rpc.max_deadline_ms) */

bool argsIsOption(const char *arg)
{
    return arg[0] == '-' && arg[1] != '\0';
}

/* What follows `name` in the current argument ("" for the name alone, "=value"), or NULL
 * when the argument is no such option (or comes after "--"). */
static const char *argsAfterName(const struct args *a, const char *name)
{
    if (a->dashdash) {
        return NULL;
    }
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '=' && arg[n] != '\0')) {
        return NULL;
    }
    return arg + n;
}

/* If the current argument is `name` ("--x") or "name=value", consumes it and its value
 * (the next argument in the first form) and returns true (cli_opt_value, before "--"). */
bool argsValue(struct args *a, const char *name, const char **val)
{
    return !a->dashdash && cli_opt_value(a->argc, a->argv, &a->i, name, val, a->cmd);
}

/* If the current argument is the flag `name`, consumes it and returns true. */
static bool argsFlag(struct args *a, const char *name)
{
    const char *rest = argsAfterName(a, name);
    if (rest == NULL) {
        return false;
    }
    if (rest[0] == '=') {
        cli_usage_error("%s%soption %s takes no value", a->cmd ? a->cmd : "", a->cmd ? ": " : "",
                        name);
    }
    a->i++;
    return true;
}

/* Options every command accepts after the command word: --json (-o json, -o text),
 * --deadline, --help. */
bool argsCommon(struct global *g, struct args *a)
{
    const char *v;
    if (argsFlag(a, "--json")) {
        g->json = true;
        return true;
    }
    if (argsValue(a, "-o", &v)) {
        if (strcmp(v, "json") != 0 && strcmp(v, "text") != 0) {
            cli_usage_error("%s%s-o: expected json or text, got \"%s\"", a->cmd ? a->cmd : "",
                            a->cmd ? ": " : "", v);
        }
        g->json = strcmp(v, "json") == 0;
        return true;
    }
    if (argsValue(a, "--deadline", &v)) {
        g->deadline_ms = (uint32_t)cli_parse_u64("--deadline", v, 1, MAX_DEADLINE_MS);
        g->deadline_set = true;
        return true;
    }
    if (argsFlag(a, "--help") || argsFlag(a, "-h")) {
        helpPrint(a->cmd, NULL);
    }
    return false;
}

/* Takes the current argument as positional number *n (of at most `max`), or exits on an
 * unknown option or one argument too many; where a KEY may stand (a->key_operands), the
 * message names the argument by its position (1: the first after the command word). */
static void argsPositional(struct args *a, const char **slots, size_t max, size_t *n)
{
    const char *arg = a->argv[a->i];
    int at = a->i - a->first + 1;
    if (!a->dashdash && strcmp(arg, "--") == 0) {
        a->dashdash = true;
        a->i++;
        return;
    }
    if (!a->dashdash && argsIsOption(arg)) {
        if (a->key_operands != NULL) {
            cli_usage_error("%s: argument %d after the command is no option of %s (not shown: "
                            "it may be a KEY); a KEY that starts with '-' goes after --, with "
                            "every option before it: idemctl %s",
                            a->cmd, at, a->cmd, a->key_form);
        }
        cli_unknown_option(a->cmd, arg);
    }
    if (*n >= max) {
        if (a->key_operands != NULL) {
            cli_usage_error("%s: argument %d after the command is one argument too many (not "
                            "shown: it may be a KEY): %s takes %s%s",
                            a->cmd, at, a->cmd, a->key_operands,
                            a->dashdash ? "; after -- every argument is an operand, so the "
                                          "options go before --"
                                        : "");
        }
        cli_usage_error("%s: unexpected argument \"%s\"", a->cmd, arg);
    }
    slots[(*n)++] = arg;
    a->i++;
}

void argsRequireKey(const char *cmd, const char *key)
{
    if (key == NULL) {
        cli_usage_error("%s: missing KEY", cmd);
    }
    if (key[0] == '\0') {
        cli_usage_error("%s: KEY is empty", cmd);
    }
}

/* If the current argument is one of the repeatable options reps[0..n), consumes it and its
 * value and returns true. */
static bool argsRepeated(struct args *a, const struct argsRepeat *reps, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        const char *v;
        if (argsValue(a, reps[r].name, &v)) {
            if (*reps[r].n >= reps[r].max) {
                cli_usage_error("%s: %s is given more than %zu times", a->cmd, reps[r].name,
                                reps[r].max);
            }
            reps[r].values[(*reps[r].n)++] = v;
            return true;
        }
    }
    return false;
}

/* Parses the arguments after the command word: the options every command takes
 * (argsCommon()), the command's own (opts[0..n_opts), may be NULL; reps[0..n_reps), may be
 * NULL, those it takes several times), and at most `max` positional arguments into
 * pos[0..*npos) (OUT). Anything else is a usage error. */
void argsParseRepeat(struct global *g, struct args *a, const struct argsOpt *opts, size_t n_opts,
                     const struct argsRepeat *reps, size_t n_reps, const char **pos, size_t max,
                     size_t *npos)
{
    *npos = 0;
    for (size_t r = 0; r < n_reps; r++) {
        *reps[r].n = 0;
    }
    while (a->i < a->argc) {
        bool taken = argsCommon(g, a);
        for (size_t k = 0; !taken && k < n_opts; k++) {
            if (opts[k].value != NULL) {
                taken = argsValue(a, opts[k].name, opts[k].value);
            } else if (argsFlag(a, opts[k].name)) {
                *opts[k].flag = true;
                taken = true;
            }
        }
        if (!taken) {
            taken = argsRepeated(a, reps, n_reps);
        }
        if (!taken) {
            argsPositional(a, pos, max, npos);
        }
    }
}

void argsParse(struct global *g, struct args *a, const struct argsOpt *opts, size_t n_opts,
               const char **pos, size_t max, size_t *npos)
{
    argsParseRepeat(g, a, opts, n_opts, NULL, 0, pos, max, npos);
}
