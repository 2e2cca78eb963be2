/* idemctl: the command-line client of idemd, for operators and for debugging: cluster
 * status and membership, records of any tenant (key get, resolve, purge), the quarantine
 * list, and every data operation of docs/contract.md by hand. docs/idemctl.md is its manual.
 * This file: main() (global options, the environment, the checks made before any command,
 * dispatch to the commands' files), and `bench`, which runs idem-bench.
 *
 * Shape: global options, then one command word (and for key/quarantine/members a
 * subcommand), then the command's arguments and options. The flag --token is overloaded on
 * purpose (it is what each side calls a token): before the command it is the bearer token,
 * after it (complete, release, renew) the fencing token. Every command builds one
 * Idem__Request, sends it with libidem (to the leader, or with idem_call_node() to one
 * given node), and prints the answer: `key: value` lines or a table by default, exactly one
 * JSON object on stdout with --json (built with jansson).
 *
 * Keys are secrets (docs/contract.md): the admin commands that show records of any tenant
 * (key get, quarantine list) print a record's key_digest, never its key, unless --reveal.
 *
 * Exit status: 0 the call was answered, whatever the outcome; 1 internal error (out of
 * memory, no random source); 2 usage or configuration error; 3 unavailable (no leader, no
 * quorum, deadline passed, nothing reachable); 4 the bearer token was refused
 * (unauthenticated, forbidden) or not given; 5 status --check found the cluster unhealthy.
 * Bearer tokens are never printed.
 *
 * The files: idemctl.h says what they share and which file has what. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "idemctl.h"

#define DEFAULT_DEADLINE_MS 5000u

static void execBench(const struct global *g, int argc, char **argv) __attribute__((noreturn));

/* Replaces idemctl with idem-bench from idemctl's own directory, passing idemctl's global
 * --cluster, --json and --deadline first and then argv[0..argc) unchanged; the bearer token
 * goes in IDEM_TOKEN. */
static void execBench(const struct global *g, int argc, char **argv)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "idemctl: cannot find my own directory: %s\n", strerror(errno));
        exit(EXIT_INTERNAL);
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%.*s/idem-bench", slash ? (int)(slash - self) : 0, self);
    char **av = calloc((size_t)argc + 20, sizeof *av);
    if (av == NULL) {
        outOom();
    }
    size_t k = 0;
    char deadline[16];
    av[k++] = path;
    /* From the flags only: idem-bench reads IDEM_CLUSTER and IDEM_TOKEN itself. */
    if (g->cluster != NULL && g->cluster != getenv("IDEM_CLUSTER")) {
        av[k++] = (char *)"--cluster";
        av[k++] = (char *)g->cluster;
    }
    if (g->token != NULL && g->token != getenv("IDEM_TOKEN")) {
        setenv("IDEM_TOKEN", g->token, 1); /* not on idem-bench's command line */
    }
    if (g->json) {
        av[k++] = (char *)"--json";
    }
    /* TLS: from the flags only too (idem-bench reads IDEM_TLS* itself). */
    if (g->tls_flags.on) {
        av[k++] = (char *)"--tls";
    }
    const char *tls_names[] = {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"};
    const char *tls_vals[] = {g->tls_flags.ca_file, g->tls_flags.cert_file, g->tls_flags.key_file,
                              g->tls_flags.server_name};
    for (size_t t = 0; t < 4; t++) {
        if (tls_vals[t] != NULL) {
            av[k++] = (char *)tls_names[t];
            av[k++] = (char *)tls_vals[t];
        }
    }
    if (g->deadline_set) {
        snprintf(deadline, sizeof deadline, "%" PRIu32, g->deadline_ms);
        av[k++] = (char *)"--deadline";
        av[k++] = deadline;
    }
    for (int i = 0; i < argc; i++) {
        av[k++] = argv[i];
    }
    av[k] = NULL;
    fflush(stdout);
    execv(path, av);
    fprintf(stderr, "idemctl: cannot run %s: %s\n", path, strerror(errno));
    free(av);
    exit(EXIT_INTERNAL);
}

struct command {
    const char *name;
    int (*run)(struct global *g, struct args *a);
    bool admin;
    const char *key_operands, *key_form; /* struct args; NULL: no KEY operand */
};

static const struct command commands[] = {
    {"status", statusCmd, true, NULL, NULL},
    {"claim", dataCmdClaim, false, "KEY", "claim --fingerprint HEX64 [OPTIONS] -- KEY"},
    {"complete", dataCmdComplete, false, "KEY",
     "complete --token N --status CODE [OPTIONS] -- KEY"},
    {"release", dataCmdRelease, false, "KEY", "release --token N -- KEY"},
    {"renew", dataCmdRenew, false, "KEY", "renew --token N [--lease MS] -- KEY"},
    {"get", dataCmdGet, false, "KEY", "get -- KEY"},
    {"members", membersCmd, true, NULL, NULL},
    {"transfer", membersCmdTransfer, true, NULL, NULL},
    {"snapshot", membersCmdSnapshot, true, NULL, NULL},
    {"reload", reloadCmd, true, NULL, NULL},
    {"resolve", recordsCmdResolve, true, "KEY",
     "resolve --tenant NAME (--release | --status CODE [--body TEXT]) -- KEY"},
    {"key", recordsCmdKey, true, "get|resolve|purge TENANT KEY",
     "key get|resolve|purge TENANT [OPTIONS] -- KEY"},
    {"quarantine", recordsCmdQuarantine, true, NULL, NULL},
    {"version", versionCmd, true, NULL, NULL}, /* calls mainConfigCheck() itself */
};

/* Options that take a value as the next argument (any command's, and the global ones):
 * what follows them is a value, not --help nor a subcommand. */
static bool takesValue(const char *arg)
{
    static const char *const names[] = {
        "--cluster",
        "--token",
        "--admin-token",
        "--deadline",
        "--tenant",
        "--status",
        "--body",
        "--fingerprint",
        "--attempt",
        "--lease",
        "--ttl",
        "--policy",
        "--outcome",
        "--node",
        "--max-lag",
        "--limit",
        "-o",
        "--max-lag-entries",
        "--max-lag-ms",
        "--request-body",
        "--method",
        "--path",
        "--content-type",
        "--fingerprint-field",
        "--fingerprint-ignore",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(arg, names[i]) == 0) {
            return true;
        }
    }
    return cli_tls_takes_value(arg);
}

/* If --help or -h comes as an option before "--" in argv[from..), prints the help of `cmd`
 * (and of its subcommand, the first argument that is not an option nor an option's value)
 * and exits 0. */
static void helpIfAsked(const char *cmd, int argc, char **argv, int from)
{
    const char *sub = NULL;
    bool asked = false;
    for (int i = from; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            asked = true;
        } else if (takesValue(argv[i])) {
            i++; /* its value */
        } else if (sub == NULL && !argsIsOption(argv[i])) {
            sub = argv[i];
        }
    }
    if (asked) {
        helpPrint(cmd, sub);
    }
}

/* Whether --json (or -o json, and not a -o text after it) comes as an option anywhere in
 * argv[1..): before "--", not as an option's value, and before `bench` (whose arguments are
 * idem-bench's). Set before anything is parsed, so that every usage error (and a TLS file
 * that cannot be loaded) prints its JSON object, also one found before --json itself, or
 * after the command's --json was given. */
static bool jsonAsked(int argc, char **argv)
{
    bool command = false, json = false;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-o=json") == 0 ||
            (strcmp(argv[i], "-o") == 0 && i + 1 < argc && strcmp(argv[i + 1], "json") == 0)) {
            json = true;
        } else if (strcmp(argv[i], "-o=text") == 0 || (strcmp(argv[i], "-o") == 0 && i + 1 < argc &&
                                                       strcmp(argv[i + 1], "text") == 0)) {
            json = false;
        }
        if (takesValue(argv[i])) {
            i++; /* its value */
        } else if (!command && !argsIsOption(argv[i])) {
            if (strcmp(argv[i], "bench") == 0) {
                return false;
            }
            command = true;
        }
    }
    return json;
}

/* The global options (before the command word) from a->argv[a->i..) into g, up to the
 * command word; then each TLS flag wins over its variable. */
static void globalOptions(struct global *g, struct args *a)
{
    while (a->i < a->argc && argsIsOption(a->argv[a->i])) {
        const char *v;
        if (argsValue(a, "--cluster", &v)) {
            g->cluster = v;
        } else if (argsValue(a, "--token", &v)) {
            g->token = v;
            g->token_on_argv = true;
        } else if (argsValue(a, "--admin-token", &v)) {
            g->admin_token = v;
            g->admin_token_on_argv = true;
        } else if (argsValue(a, "--token-file", &v)) {
            free(g->token_owned);
            g->token = g->token_owned = cli_token_file("--token-file", v);
            g->token_on_argv = false;
        } else if (argsValue(a, "--admin-token-file", &v)) {
            free(g->admin_token_owned);
            g->admin_token = g->admin_token_owned = cli_token_file("--admin-token-file", v);
            g->admin_token_on_argv = false;
        } else if (cli_tls_flag(&g->tls_flags, a->argc, a->argv, &a->i)) {
            continue;
        } else if (strcmp(a->argv[a->i], "--version") == 0) {
            printf("idemctl %s\n", IDEMCTL_VERSION);
            exit(EXIT_ANSWERED);
        } else if (!argsCommon(g, a)) {
            cli_unknown_option(NULL, a->argv[a->i]);
        }
    }
    /* Each TLS flag wins over its variable. */
    g->tls.on = g->tls.on || g->tls_flags.on;
    g->tls.ca_file = g->tls_flags.ca_file ? g->tls_flags.ca_file : g->tls.ca_file;
    g->tls.cert_file = g->tls_flags.cert_file ? g->tls_flags.cert_file : g->tls.cert_file;
    g->tls.key_file = g->tls_flags.key_file ? g->tls_flags.key_file : g->tls.key_file;
    g->tls.server_name = g->tls_flags.server_name ? g->tls_flags.server_name : g->tls.server_name;
}

/* The checks made before the command's own arguments are parsed (but for version's, which
 * makes them itself), of what does not depend on them: the cluster list (snapshot's and
 * reload's --node may stand in for --cluster), the TLS files, the bearer token command `name` needs (the admin
 * token when `admin`). EXIT_ANSWERED to go on; a TLS file that cannot be loaded, or no
 * token, is reported and its exit status returned; usage errors exit. */
int mainConfigCheck(const struct global *g, const char *name, bool admin)
{
    if (g->cluster != NULL) {
        char why[160];
        if (idem_seeds_check(g->cluster, why, sizeof why) != IDEM_OK) {
            cli_usage_error("bad --cluster: %s", why);
        }
    } else if (strcmp(name, "snapshot") != 0 && strcmp(name, "reload") != 0) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    if ((g->tls.cert_file == NULL) != (g->tls.key_file == NULL)) {
        cli_usage_error("--tls-cert and --tls-key go together");
    }
    if (cli_tls_wanted(&g->tls)) {
        /* A TLS file that cannot be loaded is a configuration error (exit 2), reported
         * before anything is sent; opening a client connects to nothing (so any address
         * stands in for --cluster where a command takes --node alone). */
        struct idem_client *c = NULL;
        char why[256];
        int rv = callClientOpen(g, g->cluster != NULL ? g->cluster : "127.0.0.1:1", "-", &c, why,
                                sizeof why);
        idem_client_close(c);
        if (rv != IDEM_OK) {
            return outFailCall(g, rv, why);
        }
    }
    const char *tok = callBearer(g, admin);
    if (tok == NULL || tok[0] == '\0') {
        /* A credential problem, as a refused token is (exit 4); nothing was sent. */
        char msg[256];
        snprintf(msg, sizeof msg,
                 admin ? "%s needs the admin token: set IDEM_ADMIN_TOKEN, or pass "
                         "--admin-token-file F (or --admin-token T, which other users of the "
                         "host can read) before the command"
                       : "%s needs a bearer token: set IDEM_TOKEN, or pass --token-file F (or "
                         "--token T, which other users of the host can read) before the "
                         "command",
                 name);
        fprintf(stderr, "idemctl: %s\n", msg);
        if (g->json) {
            cli_json_outcome("unauthenticated", msg);
        }
        return EXIT_AUTH;
    }
    return EXIT_ANSWERED;
}

/* The tokens read from files, wiped and freed. */
static void freeTokens(struct global *g)
{
    char *owned[] = {g->token_owned, g->admin_token_owned};
    for (size_t i = 0; i < 2; i++) {
        if (owned[i] != NULL) {
            OPENSSL_cleanse(owned[i], strlen(owned[i]));
            free(owned[i]);
        }
    }
    g->token_owned = g->admin_token_owned = NULL;
}

int main(int argc, char **argv)
{
    cli_set_prog("idemctl");
    bool json = jsonAsked(argc, argv);
    cli_set_json(json);
    struct global g = {
        .cluster = cli_env("IDEM_CLUSTER"),
        .token = cli_env("IDEM_TOKEN"),
        .admin_token = cli_env("IDEM_ADMIN_TOKEN"),
        .json = json,
        .deadline_ms = DEFAULT_DEADLINE_MS,
        .deadline_set = false,
    };
    cli_tls_from_env(&g.tls);
    struct args a = {.argc = argc,
                     .argv = argv,
                     .i = 1,
                     .dashdash = false,
                     .cmd = NULL,
                     .first = 1,
                     .key_operands = NULL,
                     .key_form = NULL};
    globalOptions(&g, &a);
    if (a.i >= argc) {
        cli_usage_error("no command given");
    }
    const char *word = argv[a.i++];
    if (strcmp(word, "help") == 0) {
        if (a.i < argc && (strcmp(argv[a.i], "--help") == 0 || strcmp(argv[a.i], "-h") == 0)) {
            helpPrint(NULL, NULL);
        }
        if (a.i < argc && helpFind(argv[a.i], NULL) == NULL) {
            cli_usage_error("help: unknown command \"%s\"", argv[a.i]);
        }
        helpPrint(a.i < argc ? argv[a.i] : NULL, a.i + 1 < argc ? argv[a.i + 1] : NULL);
    }
    if (strcmp(word, "bench") == 0) {
        execBench(&g, argc - a.i, argv + a.i);
    }
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
    a.first = a.i;
    a.key_operands = cmd->key_operands;
    a.key_form = cmd->key_form;
    /* --help after the command works without a cluster or a token. */
    helpIfAsked(cmd->name, argc, argv, a.i);
    /* version --client needs no cluster nor token: version checks what it needs itself. */
    int code = cmd->run == versionCmd ? EXIT_ANSWERED : mainConfigCheck(&g, cmd->name, cmd->admin);
    if (code != EXIT_ANSWERED) {
        freeTokens(&g);
        return code;
    }
    code = cmd->run(&g, &a);
    fflush(stdout);
    if ((code == EXIT_ANSWERED || code == EXIT_AUTH) && outTokenRefused() != NULL) {
        /* The answer (printed) refused the token: a credential problem, for scripts. */
        fprintf(stderr, "idemctl: %s: the %s was refused (%s)\n", cmd->name,
                cmd->admin ? "admin token" : "bearer token", outTokenRefused());
        code = EXIT_AUTH;
    }
    /* After the command (its usage errors come first). Any user of the host can read a
     * process's arguments (ps, /proc): either token there is exposed, used or not. */
    for (int admin = 1; admin >= 0; admin--) {
        if (admin ? g.admin_token_on_argv : g.token_on_argv) {
            fprintf(stderr,
                    "idemctl: warning: a bearer token on the command line is visible to "
                    "other users of this host; use %s or %s\n",
                    admin ? "--admin-token-file F" : "--token-file F",
                    admin ? "IDEM_ADMIN_TOKEN" : "IDEM_TOKEN");
        }
    }
    freeTokens(&g);
    return code;
}
