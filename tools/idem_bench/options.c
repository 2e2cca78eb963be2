/* options: idem-bench's command line: the --help text, the options (as "--name value" or
 * "--name=value", the environment's IDEM_CLUSTER, IDEM_TOKEN and IDEM_TLS* for the
 * connection) and the checks of how they combine. Every problem is a usage error (exit 2,
 * with --json also a JSON object on stdout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const char *const bench_workload_names[4] = {"fresh", "replay", "claim-complete", "contention"};

static const char usageText[] =
    "Usage: idem-bench --cluster H:P,... --token T\n"
    "                  --workload fresh|replay|claim-complete|contention\n"
    "                  [--concurrency N [--threads] | --rate R [--concurrency N]]\n"
    "                  [--connections N]\n"
    "                  [--keys N]\n"
    "                  [--duration SECONDS] [--requests N] [--deadline MS]\n"
    "                  [--no-histogram] [--timeline MS] [--stall-probe] [--json]\n"
    "                  [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "                  [--tls-server-name NAME]\n"
    "\n"
    "  --cluster H:P,...   RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T           tenant bearer token (env IDEM_TOKEN)\n"
    "  --workload W        fresh: claim a new key each time (expects acquired);\n"
    "                      replay: claim one of --keys pre-completed keys (expects replay);\n"
    "                      claim-complete (or mixed): claim then complete a new key (one\n"
    "                      op per pair);\n"
    "                      contention: claim one of --keys keys with a fresh attempt id\n"
    "                      (expects acquired, then releases it, or in_progress)\n"
    "  --concurrency N     closed loop (the default mode): N operations in flight, the next\n"
    "                      sent when one is answered (default 8), from one thread. With\n"
    "                      --rate: the most operations in flight at once (default 1024).\n"
    "                      At most 1024.\n"
    "  --threads           closed loop on N threads, each with its own synchronous client\n"
    "  --rate R            open loop: schedule R operations per second whatever the answers;\n"
    "                      latency counts from each operation's scheduled time\n"
    "                      (latency figures include failed operations, in every mode);\n"
    "                      sent from one thread (libuv loop, asynchronous clients)\n"
    "  --connections N     asynchronous clients, each one pipelined connection\n"
    "                      to the leader, used round robin (default 1, at most 64)\n"
    "  --keys N            key set of replay (default 64) and contention (default 8),\n"
    "                      1..100000\n"
    "  --duration SECONDS  how long to run (default 10, at most 3600); then the calls in\n"
    "                      flight get at most 1 s more, or one --deadline if shorter (with\n"
    "                      --rate, the operations due but unsent are sent in its first\n"
    "                      half): a call without an answer by then is an error (as is\n"
    "                      a complete or release due with under 1 ms left: not sent), so\n"
    "                      the run ends by then\n"
    "  --requests N        stop after N operations (default: no limit)\n"
    "  --deadline MS       deadline of each call, retries included (default 5000); also\n"
    "                      bounds the first call, which checks the cluster, and each call of\n"
    "                      the replay workload's setup (before the run, not timed: --keys\n"
    "                      keys claimed and completed, 16 at a time)\n"
    "  --no-histogram      leave the ASCII latency distribution out of the text output\n"
    "  --timeline MS       also report latency per MS milliseconds of the run (operations\n"
    "                      counted in the interval they end in): ops, p50, p99, max;\n"
    "                      shows when a tail happened. 10..60000; not with --threads\n"
    "  --stall-probe       also measure how long the machine held this process's threads\n"
    "                      off its CPUs during the run: a thread per CPU, at SCHED_FIFO\n"
    "                      priority 1 when allowed (root or CAP_SYS_NICE), wakes every\n"
    "                      1 ms; a wake-up 1 ms or more late is a hold (a hypervisor that\n"
    "                      descheduled the virtual CPU, or, without the priority, other\n"
    "                      threads). Reports the holds per CPU, the longest, and with\n"
    "                      --timeline the longest in each interval\n"
    "  --json              print one JSON object: mode, workload, ops, ops_per_sec, errors,\n"
    "                      p50_ms, p90_ms, p99_ms, p999_ms, max_ms, outcomes, histogram\n"
    "                      (every non-empty bucket as [lo_us, hi_us, count]) and more\n"
    "  --help              print this help and exit\n"
    "TLS (nodes with tls.rpc: true):\n" CLI_TLS_HELP "\n"
    "A progress line is printed to stderr once per second when stderr is a terminal: ops\n"
    "and ops/s as the summary counts them (the expected outcome), errors apart; with --rate\n"
    "also the largest lag of a send behind its schedule.\n"
    "Exit status: 0 it ran, 2 usage error (also: a TLS file that cannot be loaded), 3\n"
    "nothing could be reached (also: every node's certificate refused by --tls-ca), 1 setup\n"
    "failed.\n";

/* The options that take a value (the next argument, unless given as --name=value), with
 * the range of the numeric ones (max 0: a string). */
enum value_opt {
    OPT_CLUSTER,
    OPT_TOKEN,
    OPT_CONCURRENCY,
    OPT_RATE,
    OPT_CONNECTIONS,
    OPT_KEYS,
    OPT_DURATION,
    OPT_REQUESTS,
    OPT_DEADLINE,
    OPT_TIMELINE,
    OPT_WORKLOAD,
    OPT_N
};

static const struct {
    const char *name;
    uint64_t min, max;
} valueOptions[OPT_N] = {
    [OPT_CLUSTER] = {"--cluster", 0, 0},
    [OPT_TOKEN] = {"--token", 0, 0},
    [OPT_CONCURRENCY] = {"--concurrency", 1, MAX_CONCURRENCY},
    [OPT_RATE] = {"--rate", 1, MAX_RATE},
    [OPT_CONNECTIONS] = {"--connections", 1, MAX_CONNECTIONS},
    [OPT_KEYS] = {"--keys", 1, MAX_KEYS},
    [OPT_DURATION] = {"--duration", 1, MAX_DURATION_S},
    [OPT_REQUESTS] = {"--requests", 1, UINT64_MAX / 2},
    [OPT_DEADLINE] = {"--deadline", 1, 600000},
    [OPT_TIMELINE] = {"--timeline", 10, 60000},
    [OPT_WORKLOAD] = {"--workload", 0, 0},
};

/* What the options say before the checks of how they combine. */
struct parsed {
    const char *workload; /* --workload as given */
    bool concurrency_set; /* --concurrency given (else the mode's default) */
};

/* Whether --json is given as an option: not as another option's value (--token --json). */
static bool jsonAsked(int argc, char **argv)
{
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--json") == 0) {
            return true;
        }
        bool value = cli_tls_takes_value(argv[k]);
        for (size_t o = 0; !value && o < OPT_N; o++) {
            value = strcmp(argv[k], valueOptions[o].name) == 0;
        }
        if (value) {
            k++; /* its value */
        }
    }
    return false;
}

/* The defaults, from the environment where it has them. */
static void setDefaults(struct config *cfg)
{
    cfg->cluster = cli_env("IDEM_CLUSTER");
    cfg->token = cli_env("IDEM_TOKEN");
    cfg->concurrency = DEFAULT_CLOSED_CONCURRENCY;
    cfg->duration_s = 10;
    cfg->requests = 0;
    cfg->rate = 0;
    cfg->connections = 0;
    cfg->keys = 0;
    cfg->json = false;
    cfg->no_histogram = false;
    cfg->deadline_ms = DEFAULT_DEADLINE_MS;
    cli_tls_from_env(&cfg->tls);
}

/* Stores the value v of option o (numbers checked against its range). */
static void setValue(struct config *cfg, struct parsed *p, enum value_opt o, const char *v)
{
    uint64_t n = valueOptions[o].max ? cli_parse_u64(valueOptions[o].name, v, valueOptions[o].min,
                                                     valueOptions[o].max)
                                     : 0;
    switch (o) {
    case OPT_CLUSTER:
        cfg->cluster = v;
        break;
    case OPT_TOKEN:
        cfg->token = v;
        break;
    case OPT_CONCURRENCY:
        cfg->concurrency = (unsigned)n;
        p->concurrency_set = true;
        break;
    case OPT_RATE:
        cfg->rate = n;
        break;
    case OPT_CONNECTIONS:
        cfg->connections = (unsigned)n;
        break;
    case OPT_KEYS:
        cfg->keys = (unsigned)n;
        break;
    case OPT_DURATION:
        cfg->duration_s = (unsigned)n;
        break;
    case OPT_REQUESTS:
        cfg->requests = n;
        break;
    case OPT_DEADLINE:
        cfg->deadline_ms = (uint32_t)n;
        break;
    case OPT_TIMELINE:
        cfg->timeline_ms = (unsigned)n;
        break;
    case OPT_WORKLOAD:
        p->workload = v;
        break;
    case OPT_N:
        break;
    }
}

/* If argv[*i] is a flag without a value, sets it, consumes it and returns true. */
static bool flagOption(struct config *cfg, int *i, const char *arg)
{
    bool *flag = strcmp(arg, "--json") == 0            ? &cfg->json
                 : strcmp(arg, "--threads") == 0       ? &cfg->threads
                 : strcmp(arg, "--no-histogram") == 0  ? &cfg->no_histogram
                 : strcmp(arg, "--stall-probe") == 0   ? &cfg->stall_probe
                                                       : NULL;
    if (flag == NULL) {
        return false;
    }
    *flag = true;
    (*i)++;
    return true;
}

/* If argv[*i] is an option with a value, stores it, consumes both and returns true. */
static bool valueOption(struct config *cfg, struct parsed *p, int argc, char **argv, int *i)
{
    for (size_t o = 0; o < OPT_N; o++) {
        const char *v;
        if (cli_opt_value(argc, argv, i, valueOptions[o].name, &v, NULL)) {
            setValue(cfg, p, (enum value_opt)o, v);
            return true;
        }
    }
    return false;
}

/* The workload named `name` (also "mixed", the name claim-complete has in the docs' list). */
static enum workload parseWorkload(const char *name)
{
    if (name == NULL) {
        cli_usage_error("missing --workload fresh|replay|claim-complete|contention");
    }
    for (size_t w = 0; w < sizeof bench_workload_names / sizeof bench_workload_names[0]; w++) {
        if (strcmp(name, bench_workload_names[w]) == 0) {
            return (enum workload)w;
        }
    }
    if (strcmp(name, "mixed") == 0) {
        return WL_CLAIM_COMPLETE;
    }
    cli_usage_error("--workload must be fresh, replay, claim-complete or contention, "
                    "got \"%s\"",
                    name);
}

/* The checks of how the options combine, and the defaults that depend on the mode. */
static void checkCombination(struct config *cfg, const struct parsed *p)
{
    if (cfg->keys != 0 && !bench_uses_key_set(cfg)) {
        cli_usage_error("--keys applies to the replay and contention workloads only");
    }
    if (cfg->keys == 0) {
        cfg->keys = cfg->workload == WL_CONTENTION ? DEFAULT_CONTENTION_KEYS : DEFAULT_REPLAY_KEYS;
    }
    if (cfg->rate != 0 && !p->concurrency_set) {
        cfg->concurrency = DEFAULT_OPEN_CONCURRENCY;
    }
    if (cfg->threads && cfg->rate != 0) {
        cli_usage_error("--threads applies to the closed loop only (not with --rate)");
    }
    if (cfg->timeline_ms != 0 && cfg->threads) {
        cli_usage_error("--timeline does not apply with --threads");
    }
    if (cfg->connections != 0 && cfg->threads) {
        cli_usage_error("--connections does not apply with --threads (one client per thread)");
    }
    if (cfg->connections == 0) {
        cfg->connections = DEFAULT_CONNECTIONS;
    }
}

/* The cluster, the token and the TLS files: given, and well formed. */
static void checkConnection(const struct config *cfg)
{
    if (cfg->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    char why[160];
    if (idem_seeds_check(cfg->cluster, why, sizeof why) != IDEM_OK) {
        cli_usage_error("bad --cluster: %s", why);
    }
    if (cfg->token == NULL) {
        cli_usage_error("no token: pass --token T or set IDEM_TOKEN");
    }
    if ((cfg->tls.cert_file == NULL) != (cfg->tls.key_file == NULL)) {
        cli_usage_error("--tls-cert and --tls-key go together");
    }
}

void options_parse(int argc, char **argv, struct config *cfg)
{
    struct parsed p = {0};
    setDefaults(cfg);
    /* --json anywhere: usage errors found before it is reached print JSON too. */
    cli_set_json(jsonAsked(argc, argv));
    int i = 1;
    while (i < argc) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usageText, stdout);
            exit(EXIT_RAN);
        } else if (flagOption(cfg, &i, arg) || valueOption(cfg, &p, argc, argv, &i) ||
                   cli_tls_flag(&cfg->tls, argc, argv, &i)) {
            continue;
        } else if (arg[0] == '-') {
            cli_usage_error("unknown option %s", arg);
        } else {
            cli_usage_error("unexpected argument \"%s\"", arg);
        }
    }
    cfg->workload = parseWorkload(p.workload);
    checkCombination(cfg, &p);
    checkConnection(cfg);
}
