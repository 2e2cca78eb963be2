/* idemctl: the command-line client of idemd, for operators and for debugging: cluster
 * status and membership, records of any tenant (key get, resolve, purge), the quarantine
 * list, and every data operation of docs/contract.md by hand. docs/idemctl.md is its manual.
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
 * quorum, deadline passed, nothing reachable). Bearer tokens are never printed. */
#include <openssl/crypto.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>

#include "cli.h"
#include "idem_rpc.h"

#define EXIT_ANSWERED 0
#define EXIT_INTERNAL 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3
#define EXIT_MOVED (-1) /* leaderCall only: a transfer took effect after all; never an exit status */

#define DEFAULT_DEADLINE_MS 5000u
#define MAX_DEADLINE_MS 600000u         /* the server's own ceiling (rpc.max_deadline_ms) */
#define MAX_DURATION_MS 315360000000ull /* lease and ttl: at most ten years */
#define ATTEMPT_MAX 64                  /* bytes of attempt id (idem.proto ClaimCmd) */
#define TENANT_MAX 128                  /* bytes of tenant name (server/fsm.h) */
/* A node's oldest log write this old is warned of, as the node itself warns in its log
 * (CLUSTER_STUCK_APPEND_US, cluster/include/cluster.h). */
#define STUCK_WRITE_MS 5000
#define DEFAULT_MAX_LAG 1000u           /* status: entries a node may trail the leader by */
#define QUARANTINE_DEFAULT_LIMIT 100u   /* quarantine list --limit (the server's default) */
#define QUARANTINE_MAX_LIMIT 1000u      /* the server's ceiling */

static const char usageText[] =
    "Usage: idemctl [GLOBAL OPTIONS] COMMAND [SUBCOMMAND] [ARGUMENTS] [OPTIONS]\n"
    "       idemctl COMMAND [SUBCOMMAND] --help     (or: idemctl help COMMAND [SUBCOMMAND])\n"
    "\n"
    "Global options (before COMMAND):\n"
    "  --cluster H:P,H:P,...  RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T              tenant bearer token, for the data commands (env IDEM_TOKEN)\n"
    "  --admin-token T        admin bearer token, for the admin commands\n"
    "                         (env IDEM_ADMIN_TOKEN)\n"
    "  --json                 print exactly one JSON object on stdout\n"
    "  --deadline MS          time allowed for the whole call, retries included\n"
    "                         (default 5000, at most 600000)\n"
    "  --help                 print this help and exit\n"
    "TLS, for nodes whose RPC listener has tls.rpc: true (before COMMAND):\n" CLI_TLS_HELP
    "Flags win over the environment. --json and --deadline are accepted after COMMAND too.\n"
    "\n"
    "Admin commands (admin token):\n"
    "  status [--digest] [--max-lag N]\n"
    "                         every node: role, term, leader, indexes, records; warnings\n"
    "                         when a node lags or is unreachable, or there is no quorum\n"
    "  members [list | add ID RAFT_ADDR RPC_ADDR [HTTP_ADDR] | promote ID | remove ID]\n"
    "  transfer [NODE_ID]     hand leadership over (default: a voter the leader hears from)\n"
    "  snapshot [--node ADDR] take a snapshot on ADDR (default: the leader)\n"
    "  key get TENANT KEY [--reveal]\n"
    "                         one record of any tenant; the key shows as its key_digest\n"
    "  key resolve TENANT KEY (--release | --status CODE [--body TEXT])\n"
    "                         end a quarantine after checking the business system\n"
    "  key purge TENANT KEY   delete a record or tombstone outright (last resort)\n"
    "  quarantine list [--tenant T] [--limit N] [--reveal] [--lease-ended]\n"
    "                         every quarantined record (or stuck in processing), oldest first\n"
    "Data commands (tenant token):\n"
    "  claim KEY --fingerprint HEX64 [--attempt ID] [--lease MS] [--ttl MS]\n"
    "        [--policy conflict|takeover]\n"
    "  complete KEY --token N --status CODE [--body TEXT]\n"
    "        [--outcome succeeded|failed_final|unknown]\n"
    "  release KEY --token N\n"
    "  renew KEY --token N [--lease MS]\n"
    "  get KEY\n"
    "Other:\n"
    "  bench [ARGS...]        run idem-bench (next to idemctl) with ARGS\n"
    "  help [COMMAND [SUBCOMMAND]]\n"
    "Alias: resolve KEY --tenant NAME ... is key resolve NAME KEY ...\n"
    "After COMMAND, --token N is the fencing token returned by claim, not the bearer token.\n"
    "Use -- to end options, before a KEY that starts with '-' (the options go before --).\n"
    "\n"
    "Exit status:\n"
    "  0  the call was answered, whatever the outcome: not_found, forbidden, mismatch,\n"
    "     in_progress ... are answers (see \"outcome\"); status: at least one node answered\n"
    "  1  internal error (out of memory, no random source, idem-bench not found)\n"
    "  2  usage or configuration error (bad arguments, no cluster, no token, a TLS file\n"
    "     that cannot be loaded; with --json also {\"outcome\": \"usage\", \"error\"} on\n"
    "     stdout); status: every node that answered refused the admin token\n"
    "  3  unavailable: no leader, no quorum, deadline passed, nothing reachable (a node\n"
    "     whose certificate fails verification, or that refuses ours, counts as\n"
    "     unreachable: the message names the TLS failure)\n";

/* Help of one command or subcommand: `idemctl CMD [SUB] --help`. */
struct help {
    const char *name; /* "status", "key get", ... */
    const char *text;
};

static const struct help helps[] = {
    {"status",
     "Usage: idemctl status [--digest] [--max-lag N] [--json]\n"
     "\n"
     "Asks every node of --cluster, and every member those nodes know of, about itself (in\n"
     "parallel, one deadline each round) and prints one line per node: id, RPC address,\n"
     "role, membership, term, the leader it follows, commit and applied index, how far its\n"
     "applied index trails the leader's, last snapshot index, records, tombstones,\n"
     "quarantined records and bytes. Then a warning line for each problem:\n"
     "  - a node is unreachable, or refused (a wrong admin token on that node);\n"
     "  - a node's applied index trails the leader's by more than --max-lag entries\n"
     "    (default 1000);\n"
     "  - a node's oldest Raft log write has been in flight for 5 s or more (its disk\n"
     "    is slow or not answering; append_oldest_ms in --json);\n"
     "  - no leader: no majority of the reachable nodes agrees on one;\n"
     "  - no quorum: no majority of the voters is reachable (a cluster\n"
     "    without a leader may still have its quorum, and elect one);\n"
     "  - a member's rpc address is answered by another node, or its node listens for\n"
     "    Raft elsewhere than the configuration says (a wrong id or address given to\n"
     "    members add: Raft cannot reach the member; the warning says what to run);\n"
     "  - Raft authentication differs: some nodes have raft.secret_file, some not.\n"
     "With --json: {\"leader_id\", \"quorum\", \"voters\", \"reachable_voters\", \"nodes\": "
     "[...],\n"
     "\"members\": [...], \"warnings\": [...]}.\n"
     "  --digest       also ask each node for the digest of its state, shown in a DIGEST\n"
     "                 column (equal on replicas at the same applied index)\n"
     "  --max-lag N    entries a node may trail the leader's applied index by (default 1000)\n"
     "Exit status: 0 when at least one node answered (warnings included), 3 when none did,\n"
     "2 when every node that answered refused the admin token (said on stderr).\n"
     "Needs the admin token.\n"},
    {"members",
     "Usage: idemctl members [list]\n"
     "       idemctl members add ID RAFT_ADDR RPC_ADDR [HTTP_ADDR]\n"
     "       idemctl members promote ID\n"
     "       idemctl members remove ID\n"
     "\n"
     "list: the Raft configuration with every member's addresses and role (voter, standby,\n"
     "spare). add: records the new node's addresses in the log and adds it as a spare (start\n"
     "the node first, with an empty bootstrap list); promote: makes it a voter once it caught\n"
     "up; remove: takes a member out. Changes go to the leader. Needs the admin token.\n"},
    {"members list",
     "Usage: idemctl members list\n"
     "\n"
     "The Raft configuration (id, role, addresses) as the first node of --cluster that\n"
     "answers holds it, and that node: node (its address), node_id, node_role and\n"
     "leader_id, the leader it follows (none: a note on stderr says that the configuration\n"
     "may be stale). Needs the admin token.\n"},
    {"members add",
     "Usage: idemctl members add ID RAFT_ADDR RPC_ADDR [HTTP_ADDR]\n"
     "\n"
     "Adds node ID as a spare: it neither votes nor receives the log yet (status shows it at\n"
     "applied index 0); `idemctl members promote ID` then catches it up and makes it a\n"
     "voter. Start the new node first, with an empty bootstrap list. Each address as in\n"
     "the node's configuration: A.B.C.D:PORT (IPv4; names are not resolved). Needs the\n"
     "admin token.\n"},
    {"members promote", "Usage: idemctl members promote ID\n\nMakes member ID a voter (raft "
                        "catches it up first: a node that is down makes it time out). Sent to "
                        "the leader once, not retried. Needs the admin token.\n"},
    {"members remove",
     "Usage: idemctl members remove ID\n"
     "\n"
     "Takes member ID out of the Raft configuration. When ID leads, leadership is handed to\n"
     "another voter first, as `idemctl transfer` does (a leader removed while leading would\n"
     "leave the cluster without one until an election); when that fails, nothing is\n"
     "removed (exit 3). Needs the admin token.\n"},
    {"transfer",
     "Usage: idemctl transfer [NODE_ID]\n"
     "\n"
     "Hands leadership to NODE_ID, or to a voter the leader hears from when none is given,\n"
     "and prints the node that leads afterwards (leader_id). When the leader refuses NODE_ID\n"
     "(invalid), the\n"
     "error says why: already the leader, not a voter, or not a member. A voter the leader\n"
     "has not heard from within an election timeout is refused (unavailable, exit 3). Sent\n"
     "to the leader once; asked again only when the leader answers that leadership did not\n"
     "move and may next time. Needs the admin token.\n"},
    {"snapshot",
     "Usage: idemctl snapshot [--node ADDR]\n"
     "\n"
     "Takes a Raft snapshot at the next applied entry on ADDR, or on the leader, found as\n"
     "`idemctl status` finds it (without a leader: exit 3). Prints the node that took it\n"
     "(node, and node_id for the leader). --node may stand in for --cluster. Needs the\n"
     "admin token.\n"},
    {"key", "Usage: idemctl key get TENANT KEY [--reveal]\n"
            "       idemctl key resolve TENANT KEY (--release | --status CODE [--body TEXT])\n"
            "       idemctl key purge TENANT KEY\n"
            "\n"
            "One record of any tenant, by the operator. Each goes through the Raft log on the\n"
            "leader, like every operation: no answer comes from a replica that may be stale.\n"
            "Needs the admin token; a tenant's token is answered forbidden.\n"},
    {"key get",
     "Usage: idemctl key get TENANT KEY [--reveal]\n"
     "\n"
     "Shows the record of (TENANT, KEY): state, the first 12 hex of its fingerprint, fencing\n"
     "token, creation, lease deadline and expiry times, completion and the stored response's\n"
     "status and size. The key is a secret (docs/contract.md): it is shown only as its\n"
     "key_digest (what idemd's logs carry) unless --reveal, which also shows the stored body.\n"
     "Outcome ok, or not_found. Needs the admin token.\n"},
    {"key resolve",
     "Usage: idemctl key resolve TENANT KEY --release\n"
     "       idemctl key resolve TENANT KEY --status CODE [--body TEXT]\n"
     "\n"
     "Ends a quarantine (docs/contract.md, resolve) once the business system was checked:\n"
     "--release deletes the record, so the next retry runs the request again (the attempt\n"
     "had no effect); --status stores a final response that every retry replays (it had;\n"
     "CODE 200-599).\n"
     "Outcome ok, or not_found. The older form `idemctl resolve KEY --tenant TENANT ...` is\n"
     "an alias. Needs the admin token.\n"},
    {"key purge",
     "Usage: idemctl key purge TENANT KEY\n"
     "\n"
     "Deletes the record or tombstone of (TENANT, KEY) outright, on every replica (a log\n"
     "command), with its quota usage and its expiry: an operator's last resort, for instance\n"
     "after a refund on the business side. The next claim of the key runs the request again,\n"
     "with a new and larger fencing token. Answers ok with the purged record's token, or\n"
     "not_found when there is nothing to delete (so a repeated purge changes nothing).\n"
     "Needs the admin token.\n"},
    {"quarantine",
     "Usage: idemctl quarantine list [--tenant T] [--limit N] [--reveal] [--lease-ended]\n"
     "\n"
     "Quarantined records: completed with outcome unknown, answered 409\n"
     "idempotency_outcome_unknown until `idemctl key resolve`. With --lease-ended, the\n"
     "records in processing whose lease has ended instead.\n"},
    {"quarantine list",
     "Usage: idemctl quarantine list [--tenant T] [--limit N] [--reveal] [--lease-ended]\n"
     "\n"
     "Every quarantined record (of tenant T, or of all tenants), lowest token (oldest grant)\n"
     "first: tenant, key_digest, token, since. `since` is when the key was first claimed;\n"
     "a takeover keeps that time (the record keeps neither a takeover's time nor the\n"
     "completion's), and its token is the takeover's.\n"
     "Read on the leader after a read barrier through the Raft log, so the list is current;\n"
     "without a leader it fails (exit 3). At most --limit records (default 100, at most\n"
     "1000); when more exist, a last line says so (JSON: \"more\": true). --reveal adds keys.\n"
     "--lease-ended lists instead the records in processing whose lease has ended (by the\n"
     "cluster's clock), with when it ended: their holder is presumed gone, and under the\n"
     "conflict policy a retry (but the holder's own, same attempt id) answers 409\n"
     "idempotency_lease_expired until `idemctl key resolve` (or their ttl) ends them. Needs\n"
     "the admin token.\n"},
    {"resolve",
     "Usage: idemctl resolve KEY --tenant NAME (--release | --status CODE [--body TEXT])\n"
     "\n"
     "Alias of `idemctl key resolve NAME KEY ...` (see its help).\n"},
    {"claim",
     "Usage: idemctl claim KEY --fingerprint HEX64 [--attempt ID] [--lease MS] [--ttl MS]\n"
     "                     [--policy conflict|takeover]\n"
     "\n"
     "Claims KEY for the tenant of --token: acquired (fencing token, lease deadline), replay,\n"
     "in_progress, mismatch, lease_expired, outcome_unknown, expired, quota_exceeded. Without\n"
     "--attempt a random attempt id is used and printed, so the claim can be retried with it\n"
     "(--attempt takes 1-64 bytes).\n"
     "Lease and ttl default to the tenant's settings.\n"},
    {"complete",
     "Usage: idemctl complete KEY --token N --status CODE [--body TEXT]\n"
     "                        [--outcome succeeded|failed_final|unknown]\n"
     "\n"
     "Stores the response of the attempt holding fencing token N (default outcome\n"
     "succeeded); CODE is a final HTTP status, 200-599. --outcome unknown quarantines the\n"
     "record. ok, lease_lost or not_found.\n"},
    {"release", "Usage: idemctl release KEY --token N\n"
                "\n"
                "Gives KEY up after a failure that changed nothing: the next claim runs again.\n"},
    {"renew", "Usage: idemctl renew KEY --token N [--lease MS]\n\nExtends the lease of "
              "fencing token N (default: the tenant's lease).\n"},
    {"get", "Usage: idemctl get KEY\n\nThe record of KEY for the tenant of --token, read "
            "through the log.\n"},
    {"bench",
     "Usage: idemctl bench [ARGS...]\n"
     "\n"
     "Runs idem-bench from idemctl's own directory with ARGS. idemctl's --cluster, --token,\n"
     "--json, --deadline and TLS options (--tls, --tls-ca, --tls-cert, --tls-key,\n"
     "--tls-server-name), when given as flags before `bench`, are passed on first; the\n"
     "environment (IDEM_CLUSTER, IDEM_TOKEN, IDEM_TLS*) idem-bench reads itself.\n"
     "`idemctl bench --help` prints idem-bench's own help.\n"},
    {"help", "Usage: idemctl help [COMMAND [SUBCOMMAND]]\n\nPrints the help of idemctl, or of "
             "one command.\n"},
};

struct global {
    const char *cluster;
    const char *token;
    const char *admin_token;
    bool json;
    uint32_t deadline_ms;
    bool deadline_set;
    struct cli_tls tls;       /* flags and IDEM_TLS* */
    struct cli_tls tls_flags; /* the flags alone (passed on to idem-bench) */
    json_t *fail_extra;       /* borrowed, may be NULL: added to a failed call's --json
                               * object (a claim's attempt id) */
};

/* The arguments after the command word. */
struct args {
    int argc;
    char **argv;
    int i;         /* next argument */
    bool dashdash; /* "--" seen: everything after it is positional */
    const char *cmd;
    int first; /* argv index of the first argument after the command word */
    /* Commands with a KEY operand: their operands (as "TENANT KEY"), and how a KEY that
     * starts with '-' is given. NULL for the others. A KEY is a secret (docs/contract.md):
     * where one may stand, usage errors name the argument's position, never its text. */
    const char *key_operands, *key_form;
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

static const char *findHelp(const char *cmd, const char *sub)
{
    char name[64];
    if (cmd == NULL) {
        return NULL;
    }
    if (sub != NULL) {
        snprintf(name, sizeof name, "%s %s", cmd, sub);
        for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
            if (strcmp(helps[i].name, name) == 0) {
                return helps[i].text;
            }
        }
    }
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        if (strcmp(helps[i].name, cmd) == 0) {
            return helps[i].text;
        }
    }
    return NULL;
}

static void printHelp(const char *cmd, const char *sub) __attribute__((noreturn));

/* Prints the help of `cmd sub`, of `cmd`, or idemctl's (cmd NULL or unknown) on stdout,
 * and exits 0. */
static void printHelp(const char *cmd, const char *sub)
{
    const char *text = findHelp(cmd, sub);
    fputs(text != NULL ? text : usageText, stdout);
    if (text != NULL) {
        fputs("\nGlobal options, environment and exit status: idemctl --help\n", stdout);
    }
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
        g->deadline_set = true;
        return true;
    }
    if (optFlag(a, "--help") || optFlag(a, "-h")) {
        printHelp(a->cmd, NULL);
    }
    return false;
}

/* Takes the current argument as positional number *n (of at most `max`), or exits on an
 * unknown option or one argument too many; where a KEY may stand (a->key_operands), the
 * message names the argument by its position (1: the first after the command word). */
static void positional(struct args *a, const char **slots, size_t max, size_t *n)
{
    const char *arg = a->argv[a->i];
    int at = a->i - a->first + 1;
    if (!a->dashdash && strcmp(arg, "--") == 0) {
        a->dashdash = true;
        a->i++;
        return;
    }
    if (!a->dashdash && isOption(arg)) {
        if (a->key_operands != NULL) {
            cli_usage_error("%s: argument %d after the command is no option of %s (not shown: "
                            "it may be a KEY); a KEY that starts with '-' goes after --, with "
                            "every option before it: idemctl %s",
                            a->cmd, at, a->cmd, a->key_form);
        }
        cli_usage_error("%s: unknown option %s", a->cmd, arg);
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

/* Puts bytes under `key` as a string when they are UTF-8 (no bytes: ""), else under
 * `key`_base64 (and `key` is null). */
static void jsetBytes(json_t *o, const char *key, const uint8_t *d, size_t n)
{
    /* protobuf-c leaves no pointer for empty bytes, and json_stringn(NULL, 0) fails. */
    json_t *v = n == 0 ? json_string("") : json_stringn((const char *)d, n);
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

/* A stored response as JSON: status, headers, body reference and digest; the body itself
 * when `body`, its length when `size`. */
static json_t *storedResponseJsonAs(const Idem__StoredResponse *sr, bool body, bool size)
{
    json_t *o = jobj();
    jset(o, "status", ju64(sr->status));
    if (size) {
        jset(o, "body_bytes", ju64(sr->body.len));
    }
    if (body) {
        jsetBytes(o, "body", sr->body.data, sr->body.len);
    }
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

static json_t *storedResponseJson(const Idem__StoredResponse *sr)
{
    return storedResponseJsonAs(sr, true, false);
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
        /* An empty string (an empty body, say) would look like a missing value. */
        fputs(json_string_length(v) > 0 ? json_string_value(v) : "(empty)", stdout);
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
static void isoTime(uint64_t ms, char *out, size_t len)
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
    if (json_is_integer(v) && json_integer_value(v) >= 1000000000000 && isTimeField(prefix)) {
        char when[40];
        isoTime((uint64_t)json_integer_value(v), when, sizeof when);
        printf(" (%s)", when);
    }
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

enum {
    HINT_TLS_CERT = 1,     /* a handshake or certificate failure */
    HINT_NOT_TLS = 2,      /* --tls against a plaintext listener */
    HINT_TLS_LISTENER = 4, /* plaintext against a TLS listener */
};

/* The hints that a connection failure's text (explained) calls for. */
static unsigned hintsFor(const struct global *g, const char *msg)
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

static void printHints(unsigned h)
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
static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int failCall(const struct global *g, int rv, const char *why)
{
    const char *what = rv == IDEM_EUNAVAILABLE ? "unavailable" : idem_strerror(rv);
    fprintf(stderr, "idemctl: %s%s%s\n", what, why[0] ? ": " : "", why);
    if (rv == IDEM_EUNAVAILABLE) {
        printHints(hintsFor(g, why));
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
        printJson(o);
        json_decref(o);
    }
    return code;
}

/* ---- calling ------------------------------------------------------------------------- */

/* A client of `seeds` with `token` and the TLS options; why (OUT) on failure. */
static int clientOpen(const struct global *g, const char *seeds, const char *token,
                      struct idem_client **c, char *why, size_t why_len)
{
    struct idem_options o = {0};
    o.seeds = seeds;
    o.token = token;
    cli_tls_options(&g->tls, &o);
    return idem_client_open(&o, c, why, why_len);
}

static const char *bearer(const struct global *g, bool admin)
{
    return admin ? g->admin_token : g->token;
}

/* Sends `req` to the leader, or to `node` when it is not NULL, with the tenant or the admin
 * token. On an answer returns EXIT_ANSWERED with *resp (OUT, caller frees it with
 * idem__response__free_unpacked) and, when `from` is not NULL, the address of the node that
 * answered in from (OUT, "" if unknown); otherwise reports the failure and returns the exit
 * status. */
static int callFrom(const struct global *g, bool admin, const char *node, const Idem__Request *req,
                    Idem__Response **resp, char *from, size_t from_len)
{
    *resp = NULL;
    if (from != NULL && from_len > 0) {
        from[0] = '\0';
    }
    struct idem_client *c = NULL;
    char why[256];
    int rv = clientOpen(g, g->cluster, bearer(g, admin), &c, why, sizeof why);
    if (rv != IDEM_OK) {
        return failCall(g, rv, why[0] ? why : "cannot create the client");
    }
    if (node != NULL) {
        rv = idem_call_node(c, node, req, g->deadline_ms, resp);
    } else {
        rv = idem_call(c, req, g->deadline_ms, resp);
    }
    int code = EXIT_ANSWERED;
    if (rv != IDEM_OK) {
        code = failCall(g, rv, idem_client_errmsg(c));
    } else if (from != NULL && from_len > 0) {
        const char *addr = node != NULL ? node : idem_client_leader(c);
        snprintf(from, from_len, "%s", addr != NULL ? addr : "");
    }
    idem_client_close(c);
    return code;
}

static int call(const struct global *g, bool admin, const char *node, const Idem__Request *req,
                Idem__Response **resp)
{
    return callFrom(g, admin, node, req, resp, NULL, 0);
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

/* A node ID: 1..INT64_MAX, the IDs a JSON integer (and status) can show. */
static uint64_t parseNodeId(const char *what, const char *s)
{
    return cli_parse_u64(what, s, 1, (uint64_t)INT64_MAX);
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
static void storedResponseFill(Idem__StoredResponse *sr, const char *cmd, const char *status,
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

static int cmdComplete(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *token = NULL, *status = NULL, *body = NULL, *outcome = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--token", &token) || optValue(a, "--status", &status) ||
            optValue(a, "--body", &body) || optValue(a, "--outcome", &outcome)) {
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
        cli_usage_error(
            "complete: --outcome must be succeeded, failed_final or unknown, got \"%s\"", outcome);
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
        if (commonOpt(g, a) || optValue(a, "--token", &token) || optValue(a, "--lease", &lease)) {
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

/* Sends a resolve of (tenant, key): --release, or a final response from --status/--body
 * (all borrowed). `cmd` names the command in usage errors. */
static int resolveCall(struct global *g, const char *cmd, const char *tenant, const char *key,
                       bool release, const char *status, const char *body)
{
    if (release == (status != NULL)) {
        cli_usage_error("%s: give exactly one of --release and --status CODE", cmd);
    }
    if (release && body != NULL) {
        cli_usage_error("%s: --body goes with --status, not --release", cmd);
    }
    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__ResolveRequest rr = IDEM__RESOLVE_REQUEST__INIT;
    rr.tenant = (char *)tenant;
    rr.key.data = (uint8_t *)key;
    rr.key.len = strlen(key);
    rr.release = release;
    if (!release) {
        storedResponseFill(&sr, cmd, status, body);
        rr.response = &sr;
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_RESOLVE;
    req.resolve = &rr;
    return callAndEmit(g, true, NULL, &req, NULL);
}

static void requireTenant(const char *cmd, const char *tenant);

/* resolve KEY --tenant NAME ...: the older spelling of `key resolve NAME KEY ...`. */
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
    requireTenant("resolve --tenant", tenant);
    return resolveCall(g, "resolve", tenant, pos[0], release, status, body);
}

static void printMembersTable(const Idem__Response *resp)
{
    printf("%-6s %-8s %-22s %-22s %s\n", "ID", "ROLE", "RAFT_ADDRESS", "RPC_ADDRESS",
           "HTTP_ADDRESS");
    for (size_t i = 0; i < resp->n_members; i++) {
        const Idem__Member *m = resp->members[i];
        /* An address not known yet (a member just added, whose addresses this node has
         * not applied) is "-", as one not given. */
        printf("%-6" PRIu64 " %-8s %-22s %-22s %s\n", m->id, m->role, m->raft_address,
               m->rpc_address[0] ? m->rpc_address : "-",
               m->http_address[0] ? m->http_address : "-");
    }
}

struct discovery;
static int leaderCall(const struct global *g, const char *what, uint64_t promotee,
                      const Idem__Request *req, Idem__Response **resp, uint64_t *node_id,
                      const struct discovery *pre);

static void explainRefusal(const struct global *g, json_t *o, uint64_t id, bool transfer);
static int leadershipAway(struct global *g, uint64_t id, uint64_t *moved_to,
                          struct discovery **pre);
static void discoveryFree(struct discovery *d);

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
        mr.id = parseNodeId("members add ID", pos[1]);
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
        mr.id = parseNodeId("members ID", pos[1]);
    } else {
        cli_usage_error("members: unknown action \"%s\" (list, add, promote or remove)", action);
    }
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_MEMBERS;
    req.members = &mr;
    Idem__StatusRequest sr = IDEM__STATUS_REQUEST__INIT;
    bool is_list = mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_LIST;
    if (is_list) {
        /* Any node answers the list with its own configuration, a lone candidate's too: the
         * node's status carries the same list (the nodes answer both from one place) and who
         * the node is and whom it follows, so that the output can say so. */
        req.op_case = IDEM__REQUEST__OP_STATUS;
        req.status = &sr;
    }
    Idem__Response *resp = NULL;
    uint64_t leader_id = 0, moved_to = 0;
    char from[256];
    struct discovery *pre = NULL; /* remove: the one leadershipAway() made, when kept */
    json_t *moved = NULL;
    if (mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE) {
        int code = leadershipAway(g, mr.id, &moved_to, &pre);
        if (code != EXIT_ANSWERED) {
            return code;
        }
        if (moved_to != 0) { /* said with a failure of the removal too */
            moved = jobj();
            jset(moved, "leader_moved_to", ju64(moved_to));
            g->fail_extra = moved;
        }
    }
    int code =
        is_list ? callFrom(g, true, NULL, &req, &resp, from, sizeof from)
                : leaderCall(g, "members",
                             mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE ? mr.id : 0,
                             &req, &resp, &leader_id, pre);
    if (pre != NULL) {
        discoveryFree(pre);
        free(pre);
    }
    if (moved != NULL) {
        g->fail_extra = NULL;
        json_decref(moved);
    }
    if (code != EXIT_ANSWERED) {
        if (moved_to != 0) {
            fprintf(stderr,
                    "idemctl: leadership moved to node %" PRIu64 " first, then the removal of "
                    "node %" PRIu64 " failed (it may still take effect after a timeout): see "
                    "`idemctl members list`, then remove it again if need be\n",
                    moved_to, mr.id);
        }
        return code;
    }
    json_t *o = resultJson(resp);
    if ((mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE ||
         mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_REMOVE) &&
        idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_INVALID) {
        explainRefusal(g, o, mr.id, false);
    }
    if (!is_list && idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_OK &&
        json_object_get(o, "message") == NULL) {
        /* What it did, and the next step. */
        char msg[200];
        if (mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD) {
            snprintf(msg, sizeof msg,
                     "node %" PRIu64
                     " is a spare now; once it runs, `idemctl members promote %" PRIu64
                     "` makes it a voter",
                     mr.id, mr.id);
        } else if (mr.action == IDEM__MEMBERS_REQUEST__ACTION__ACTION_PROMOTE) {
            snprintf(msg, sizeof msg, "node %" PRIu64 " is a voter now", mr.id);
        } else if (moved_to != 0) {
            snprintf(msg, sizeof msg,
                     "node %" PRIu64 " is out of the configuration; it can be stopped "
                     "(leadership moved to node %" PRIu64 " first)",
                     mr.id, moved_to);
        } else {
            snprintf(msg, sizeof msg,
                     "node %" PRIu64 " is out of the configuration; it can be stopped", mr.id);
        }
        jset(o, "message", jstr(msg));
    }
    if (moved_to != 0) {
        jset(o, "leader_moved_to", ju64(moved_to));
    }
    /* The list is the answer to `list`; add, promote and remove answer only an outcome
     * (an empty list there would read as "no members"). */
    bool list = is_list && idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_OK;
    const Idem__NodeStatus *st = list ? resp->status : NULL;
    if (st != NULL) {
        const char *node = from[0] ? from : st->rpc_address;
        jset(o, "node", jstr(node));
        jset(o, "node_id", ju64(st->id));
        jset(o, "node_role", jstr(st->role));
        jset(o, "leader_id", st->leader_id ? ju64(st->leader_id) : json_null());
        if (st->leader_id == 0) {
            fprintf(stderr,
                    "idemctl: note: node %" PRIu64 " (%s) knows no leader (role %s): this is "
                    "its own configuration, which may be stale; `idemctl status` asks every "
                    "node\n",
                    st->id, node, st->role);
        }
    }
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

/* ---- status -------------------------------------------------------------------------- */

/* status: every address of --cluster is asked in parallel, each by its own client (a
 * client is not thread-safe), so that a silent node costs one deadline, not one each. A
 * second round asks the members those answers name that --cluster did not list, so that
 * the report covers the whole cluster. */
#define ADDR_MAX 256 /* a node's address, with its NUL */

struct probe {
    char addr[ADDR_MAX];
    const struct global *g;
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
    char why[256];
    p->rv = clientOpen(p->g, p->addr, p->token, &c, why, sizeof why);
    if (p->rv != IDEM_OK) {
        snprintf(p->err, sizeof p->err, "%s: %s", idem_strerror(p->rv), why);
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

/* Asks probes[from..to) in parallel and waits for every answer. */
static void probeAll(struct probe *probes, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        probes[i].started = pthread_create(&probes[i].thread, NULL, probeRun, &probes[i]) == 0;
        if (!probes[i].started) {
            probeRun(&probes[i]); /* no thread: ask it from here */
        }
    }
    for (size_t i = from; i < to; i++) {
        if (probes[i].started) {
            pthread_join(probes[i].thread, NULL);
        }
    }
}

/* Whether probes[0..n) list the address of `len` bytes at addr. */
static bool addrListed(const struct probe *probes, size_t n, const char *addr, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(probes[i].addr) == len && memcmp(probes[i].addr, addr, len) == 0) {
            return true;
        }
    }
    return false;
}

/* Splits the (checked) cluster list into trimmed addresses, each once (an address listed
 * twice would count twice); returns how many. */
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
        size_t len = (size_t)(e - b);
        if (len >= sizeof probes[n].addr) {
            cli_usage_error("--cluster: address too long");
        }
        if (!addrListed(probes, n, b, len)) {
            memcpy(probes[n].addr, b, len);
            probes[n].addr[len] = '\0';
            n++;
        }
        if (*end == '\0') {
            break;
        }
        s = end + 1;
    }
    return n;
}

/* The node's own status when it answered one, else NULL. */
static const Idem__NodeStatus *probeStatus(const struct probe *p)
{
    if (p->rv != IDEM_OK || p->resp == NULL || p->resp->status == NULL) {
        return NULL;
    }
    Idem__Outcome o = idem_response_outcome(p->resp);
    return o == IDEM__OUTCOME__OUTCOME_OK || o == IDEM__OUTCOME__OUTCOME_UNSPECIFIED
               ? p->resp->status
               : NULL;
}

/* Whether the node answered, refusing the admin token (unauthenticated or forbidden). */
static bool probeRefused(const struct probe *p)
{
    if (p->rv != IDEM_OK || p->resp == NULL) {
        return false;
    }
    Idem__Outcome o = idem_response_outcome(p->resp);
    return o == IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED || o == IDEM__OUTCOME__OUTCOME_FORBIDDEN;
}

/* Keeps one probe per node ID, since two addresses can name one node ("localhost:7001"
 * and "127.0.0.1:7001"): the one at the node's own rpc_address, else the first. Frees the
 * others' answers; returns how many are left. */
static size_t dropDuplicateIds(struct probe *probes, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *si = probeStatus(&probes[i]);
        size_t j = 0;
        while (si != NULL && j < k &&
               (probeStatus(&probes[j]) == NULL || probeStatus(&probes[j])->id != si->id)) {
            j++;
        }
        if (si == NULL || j == k) {
            if (k != i) {
                probes[k] = probes[i];
            }
            k++;
            continue;
        }
        if (strcmp(probes[j].addr, probeStatus(&probes[j])->rpc_address) != 0 &&
            strcmp(probes[i].addr, si->rpc_address) == 0) {
            struct probe keep = probes[i];
            probes[i] = probes[j];
            probes[j] = keep;
        }
        if (probes[i].resp != NULL) {
            idem__response__free_unpacked(probes[i].resp, NULL);
            probes[i].resp = NULL;
        }
    }
    return k;
}

/* Splits "host:port" or "[v6]:port" into host and port (OUT); false when it is neither. */
static bool splitHostPort(const char *addr, char *host, size_t hlen, char *port, size_t plen)
{
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon[1] == '\0') {
        return false;
    }
    const char *h = addr;
    size_t len = (size_t)(colon - addr);
    if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len == 0 || len >= hlen || strlen(colon + 1) >= plen) {
        return false;
    }
    memcpy(host, h, len);
    host[len] = '\0';
    snprintf(port, plen, "%s", colon + 1);
    return true;
}

/* Whether two sockaddrs are the same IP address and port. */
static bool sameSockaddr(const struct sockaddr *x, const struct sockaddr *y)
{
    if (x->sa_family != y->sa_family) {
        return false;
    }
    if (x->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)x;
        const struct sockaddr_in *b = (const struct sockaddr_in *)(const void *)y;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (x->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)x;
        const struct sockaddr_in6 *b = (const struct sockaddr_in6 *)(const void *)y;
        return a->sin6_port == b->sin6_port &&
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
    }
    return false;
}

/* Whether the addresses a and b ("host:port") name a common endpoint, as getaddrinfo()
 * resolves them ("localhost:7003" and "127.0.0.1:7003"; numeric IPs as they are). */
static bool sameEndpoint(const char *a, const char *b)
{
    char ha[ADDR_MAX], pa[16], hb[ADDR_MAX], pb[16];
    if (!splitHostPort(a, ha, sizeof ha, pa, sizeof pa) ||
        !splitHostPort(b, hb, sizeof hb, pb, sizeof pb)) {
        return false;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *ra = NULL, *rb = NULL;
    bool same = false;
    if (getaddrinfo(ha, pa, &hints, &ra) == 0 && getaddrinfo(hb, pb, &hints, &rb) == 0) {
        for (const struct addrinfo *x = ra; x != NULL && !same; x = x->ai_next) {
            for (const struct addrinfo *y = rb; y != NULL && !same; y = y->ai_next) {
                same = sameSockaddr(x->ai_addr, y->ai_addr);
            }
        }
    }
    if (ra != NULL) {
        freeaddrinfo(ra);
    }
    if (rb != NULL) {
        freeaddrinfo(rb);
    }
    return same;
}

/* Whether `addr` is the rpc_address of a member in any status of probes[0..n). */
static bool memberAddress(const struct probe *probes, size_t n, const char *addr)
{
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        for (size_t k = 0; st != NULL && k < st->n_members; k++) {
            if (strcmp(st->members[k]->rpc_address, addr) == 0) {
                return true;
            }
        }
    }
    return false;
}

/* Drops each probe that got no status (a node that is down, or refused the token) at an
 * address that is no member's rpc_address but names the same endpoint as a member's that
 * was asked too: "localhost:7003" in --cluster for the member at "127.0.0.1:7003" (the
 * second round asks that one). No node ID tells that they are one node, and it would show
 * twice. The member's probe is kept; a refusal is not dropped for a probe that got no
 * answer. Frees the dropped answers; returns how many are left. */
static size_t dropAliases(struct probe *probes, size_t n)
{
    bool *drop = calloc(n ? n : 1, sizeof *drop);
    if (drop == NULL) {
        oom();
    }
    for (size_t i = 0; i < n; i++) {
        const struct probe *p = &probes[i];
        if (probeStatus(p) != NULL || memberAddress(probes, n, p->addr)) {
            continue;
        }
        for (size_t j = 0; j < n && !drop[i]; j++) {
            const struct probe *q = &probes[j];
            drop[i] = j != i && !drop[j] && !(probeRefused(p) && q->rv != IDEM_OK) &&
                      memberAddress(probes, n, q->addr) && sameEndpoint(p->addr, q->addr);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (drop[i]) {
            if (probes[i].resp != NULL) {
                idem__response__free_unpacked(probes[i].resp, NULL);
                probes[i].resp = NULL;
            }
            continue;
        }
        if (k != i) {
            probes[k] = probes[i];
        }
        k++;
    }
    free(drop);
    return k;
}

/* What status concluded about the cluster. */
struct clusterView {
    uint64_t leader;                    /* agreed by a majority of reachable nodes, and it
                                         * answered as leader (or refused the token); 0: none */
    uint64_t unreachable_leader;        /* agreed on, but it did not answer as leader */
    const Idem__NodeStatus *leader_st;  /* the leader's own status, when it answered */
    const Idem__NodeStatus *members_of; /* whose member list is the configuration shown */
    size_t voters, reachable_voters;    /* reachable: answered, with a status or a refusal */
};

static const Idem__Member *viewMember(const struct clusterView *v, uint64_t id,
                                      const char *rpc_address)
{
    if (v->members_of == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if ((id != 0 && m->id == id) ||
            (id == 0 && rpc_address != NULL && strcmp(m->rpc_address, rpc_address) == 0)) {
            return m;
        }
    }
    return NULL;
}

/* A probe's node ID: from its status answer, else (a node that refused the admin token,
 * or did not answer) from its address in the configuration; 0 when neither tells. */
static uint64_t probeId(const struct probe *p, const struct clusterView *v)
{
    const Idem__NodeStatus *st = probeStatus(p);
    if (st != NULL) {
        return st->id;
    }
    const Idem__Member *m = viewMember(v, 0, p->addr);
    return m != NULL ? m->id : 0;
}

/* The probe of node `id` that answered, with its status or refusing the admin token; NULL
 * when none did (or `id` is 0). */
static const struct probe *nodeProbe(const struct probe *probes, size_t n,
                                     const struct clusterView *v, uint64_t id)
{
    for (size_t i = 0; id != 0 && i < n; i++) {
        const struct probe *p = &probes[i];
        if ((probeStatus(p) != NULL || probeRefused(p)) && probeId(p, v) == id) {
            return p;
        }
    }
    return NULL;
}

static void buildView(const struct probe *probes, size_t n, struct clusterView *v)
{
    memset(v, 0, sizeof *v);
    /* The leader is the id that a majority of the reachable nodes report. */
    size_t reachable = 0;
    for (size_t i = 0; i < n; i++) {
        reachable += probeStatus(&probes[i]) != NULL;
    }
    for (size_t i = 0; i < n && v->leader == 0; i++) {
        const Idem__NodeStatus *si = probeStatus(&probes[i]);
        if (si == NULL || si->leader_id == 0) {
            continue;
        }
        size_t votes = 0;
        for (size_t j = 0; j < n; j++) {
            const Idem__NodeStatus *sj = probeStatus(&probes[j]);
            votes += sj != NULL && sj->leader_id == si->leader_id;
        }
        if (2 * votes > reachable) {
            v->leader = si->leader_id;
        }
    }
    /* The configuration: the leader's, else the most advanced reachable node's. */
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        if (st == NULL) {
            continue;
        }
        if (v->leader != 0 && st->id == v->leader) {
            v->leader_st = st;
        }
        if (v->members_of == NULL || st->term > v->members_of->term ||
            (st->term == v->members_of->term && st->applied_index > v->members_of->applied_index)) {
            v->members_of = st;
        }
    }
    if (v->leader_st != NULL && strcmp(v->leader_st->role, "leader") == 0) {
        v->members_of = v->leader_st;
    } else if (v->leader_st == NULL && nodeProbe(probes, n, v, v->leader) != NULL) {
        /* It refused the token: the others follow it and it is up, but it cannot be asked
         * with this token. */
    } else {
        /* Followers remember a leader for an election timeout after it died. */
        v->unreachable_leader = v->leader;
        v->leader = 0;
        v->leader_st = NULL;
    }
    if (v->members_of == NULL) {
        return;
    }
    for (size_t i = 0; i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if (strcmp(m->role, "voter") != 0) {
            continue;
        }
        v->voters++;
        /* By address, not by probeId(): two members may share an RPC address (members add
         * refuses it now, but a cluster configured before may have them), and a refusal
         * there counts for both. */
        for (size_t j = 0; j < n; j++) {
            const Idem__NodeStatus *st = probeStatus(&probes[j]);
            if ((st != NULL && st->id == m->id) ||
                (probeRefused(&probes[j]) && strcmp(probes[j].addr, m->rpc_address) == 0)) {
                v->reachable_voters++;
                break;
            }
        }
    }
}

/* The status of the node that answers at `rpc`: asked at that address, else one that
 * names it as its own rpc_address (asked at another spelling of it); NULL when none did. */
static const Idem__NodeStatus *answerAt(const struct probe *probes, size_t n, const char *rpc)
{
    for (size_t i = 0; i < n; i++) {
        if (probeStatus(&probes[i]) != NULL && strcmp(probes[i].addr, rpc) == 0) {
            return probeStatus(&probes[i]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        if (st != NULL && strcmp(st->rpc_address, rpc) == 0) {
            return st;
        }
    }
    return NULL;
}

/* `idemctl members add ID RAFT RPC [HTTP]` with node st's own addresses, into out. */
static void addCommand(const Idem__NodeStatus *st, char *out, size_t len)
{
    snprintf(out, len, "idemctl members add %" PRIu64 " %s %s%s%s", st->id, st->raft_address,
             st->rpc_address, st->http_address[0] ? " " : "", st->http_address);
}

/* Whether a member's configured raft address reaches a node that says it listens at `own`:
 * the same, or the same port when the node listens on every interface (0.0.0.0). */
static bool raftAddressReaches(const char *configured, const char *own)
{
    const char *c = strrchr(configured, ':');
    return strcmp(configured, own) == 0 ||
           (c != NULL && strncmp(own, "0.0.0.0:", 8) == 0 && strcmp(c, own + 7) == 0);
}

/* Whether member m's addresses are wrong, as the node answering at its rpc address tells:
 * it is another node (the ID given to `members add`, or the address, is wrong), or it
 * listens for Raft at another address than m's (a wrong raft address). Either way Raft
 * does not reach m, and a promote of m times out: what is wrong and what to do go to why
 * (OUT). Nothing when no node answers there (status says that it is unreachable), nor when
 * the node follows the leader: then Raft reaches it, whatever its raft address reads (an
 * address translated on the way). */
static bool memberMismatch(const struct probe *probes, size_t n, const struct clusterView *v,
                           const Idem__Member *m, char *why, size_t len)
{
    const Idem__NodeStatus *st = answerAt(probes, n, m->rpc_address);
    if (st == NULL) {
        return false;
    }
    char add[4 * ADDR_MAX];
    addCommand(st, add, sizeof add);
    if (st->id != m->id && viewMember(v, st->id, NULL) != NULL) {
        snprintf(why, len,
                 "member %" PRIu64 "'s rpc address %s is answered by node %" PRIu64
                 ", another member: member %" PRIu64 "'s addresses are wrong, and Raft cannot "
                 "reach member %" PRIu64 " there (a promote times out); `idemctl members remove "
                 "%" PRIu64 "`, then add the node meant for it with its own id and addresses",
                 m->id, m->rpc_address, st->id, m->id, m->id, m->id);
        return true;
    }
    if (st->id != m->id) {
        snprintf(why, len,
                 "member %" PRIu64 "'s rpc address %s is answered by node %" PRIu64
                 ": the id given to `members add` (or the address) is wrong, and Raft cannot "
                 "reach member %" PRIu64 " there (a promote times out); `idemctl members "
                 "remove %" PRIu64 "`, then `%s` (node %" PRIu64 "'s own addresses)",
                 m->id, m->rpc_address, st->id, m->id, m->id, add, st->id);
        return true;
    }
    bool follows = v->leader != 0 && st->leader_id == v->leader;
    if (!raftAddressReaches(m->raft_address, st->raft_address) && !follows) {
        snprintf(why, len,
                 "member %" PRIu64 "'s raft address is %s in the Raft configuration, but node "
                 "%" PRIu64 " (%s) listens for Raft at %s: the raft address given to `members "
                 "add` is wrong, and Raft cannot reach member %" PRIu64 " (a promote times "
                 "out); `idemctl members remove %" PRIu64 "`, then `%s`",
                 m->id, m->raft_address, st->id, m->rpc_address, st->raft_address, m->id, m->id,
                 add);
        return true;
    }
    return false;
}

/* What status found: every node asked (d.probes[0..n)) and the view built from them. */
struct discovery {
    struct probe *probes;
    size_t n;
    struct clusterView v;
};

/* Asks every node of --cluster (each address once), then the members their answers name
 * that --cluster did not list, for its status (with its digest when `digest`), keeps one
 * answer per node ID and builds the view. Free with discoveryFree(). */
static void discover(const struct global *g, bool digest, struct discovery *d)
{
    struct probe *probes = calloc(IDEM_NODES_MAX, sizeof *probes);
    if (probes == NULL) {
        oom();
    }
    size_t n = splitCluster(g->cluster, probes, IDEM_NODES_MAX);
    for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
        probes[i].g = g;
        probes[i].token = g->admin_token;
        probes[i].digest = digest;
        probes[i].deadline_ms = g->deadline_ms;
    }
    probeAll(probes, 0, n);
    /* Second round: members the answers name that --cluster did not list. */
    size_t listed = n;
    for (size_t i = 0; i < listed; i++) {
        const Idem__NodeStatus *st = probeStatus(&probes[i]);
        for (size_t k = 0; st != NULL && k < st->n_members && n < IDEM_NODES_MAX; k++) {
            const char *addr = st->members[k]->rpc_address;
            size_t len = strlen(addr);
            if (len > 0 && len < sizeof probes[n].addr && !addrListed(probes, n, addr, len)) {
                snprintf(probes[n++].addr, sizeof probes[0].addr, "%s", addr);
            }
        }
    }
    probeAll(probes, listed, n);
    d->probes = probes;
    n = dropDuplicateIds(probes, n);
    d->n = dropAliases(probes, n);
    buildView(probes, d->n, &d->v);
}

static void discoveryFree(struct discovery *d)
{
    for (size_t i = 0; i < d->n; i++) {
        if (d->probes[i].resp != NULL) {
            idem__response__free_unpacked(d->probes[i].resp, NULL);
        }
    }
    free(d->probes);
    d->probes = NULL;
    d->n = 0;
}

static json_t *nodeJson(const struct probe *p, const struct clusterView *v)
{
    json_t *o = jobj();
    const Idem__NodeStatus *st = probeStatus(p);
    const Idem__Member *m = viewMember(v, st ? st->id : 0, p->addr);
    uint64_t id = probeId(p, v);
    jset(o, "id", id ? ju64(id) : json_null());
    jset(o, "rpc_address", jstr(p->addr));
    jset(o, "role", jstr(st ? st->role : "unreachable"));
    jset(o, "member_role", m ? jstr(m->role) : json_null());
    jset(o, "term", st ? ju64(st->term) : json_null());
    jset(o, "commit_index", st ? ju64(st->commit_index) : json_null());
    jset(o, "applied_index", st ? ju64(st->applied_index) : json_null());
    jset(o, "records", st ? ju64(st->records) : json_null());
    if (st != NULL) {
        jset(o, "leader_id", st->leader_id ? ju64(st->leader_id) : json_null());
        if (v->leader_st != NULL) {
            uint64_t la = v->leader_st->applied_index;
            jset(o, "lag", ju64(la > st->applied_index ? la - st->applied_index : 0));
        } else {
            jset(o, "lag", json_null());
        }
        jset(o, "last_snapshot_index", ju64(st->last_snapshot_index));
        jset(o, "snapshot_threshold", ju64(st->snapshot_threshold));
        jset(o, "snapshot_bytes", ju64(st->snapshot_bytes));
        jset(o, "raft_authenticated", json_boolean(st->raft_authenticated));
        jset(o, "raft_connections_refused", ju64(st->raft_connections_refused));
        jset(o, "raft_connect_auth_failures", ju64(st->raft_connect_auth_failures));
        jset(o, "append_oldest_ms", ju64(st->append_oldest_ms));
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
        Idem__Outcome outcome = idem_response_outcome(p->resp);
        char msg[640];
        const char *detail = p->resp->error != NULL ? p->resp->error : "";
        snprintf(msg, sizeof msg, "%s%s%s",
                 p->resp->status == NULL && outcome == IDEM__OUTCOME__OUTCOME_OK
                     ? "answered without a status"
                     : idem_outcome_name((int)outcome),
                 detail[0] ? ": " : "", detail);
        jset(o, "role", jstr("refused"));
        jset(o, "error", jstr(msg));
    } else {
        jset(o, "error", jstr(p->err[0] ? p->err : idem_strerror(p->rv)));
    }
    return o;
}

/* A line of status: a node's JSON (nodeJson()) and the probe it shows. */
struct statusRow {
    json_t *node;
    const struct probe *p;
};

/* Sorts rows by node id, nodes without one last (by address). */
static int nodeCmp(const void *a, const void *b)
{
    const json_t *x = ((const struct statusRow *)a)->node;
    const json_t *y = ((const struct statusRow *)b)->node;
    json_int_t ix = json_integer_value(json_object_get(x, "id"));
    json_int_t iy = json_integer_value(json_object_get(y, "id"));
    if ((ix == 0) != (iy == 0)) {
        return ix == 0 ? 1 : -1;
    }
    if (ix != iy) {
        return ix < iy ? -1 : 1;
    }
    return strcmp(json_string_value(json_object_get(x, "rpc_address")),
                  json_string_value(json_object_get(y, "rpc_address")));
}

static void addWarning(json_t *warnings, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void addWarning(json_t *warnings, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    jpush(warnings, jstr(buf));
}

/* A node's name in warnings: "node 2 (127.0.0.1:7002)" or "the node at 127.0.0.1:7002". */
static void nodeName(const json_t *node, char *out, size_t len)
{
    const char *addr = json_string_value(json_object_get(node, "rpc_address"));
    json_int_t id = json_integer_value(json_object_get(node, "id"));
    if (id != 0) {
        snprintf(out, len, "node %" JSON_INTEGER_FORMAT " (%s)", id, addr);
    } else {
        snprintf(out, len, "the node at %s", addr);
    }
}

/* For a node that answers (st) but is not a member: the member with another ID whose
 * addresses it holds, and which (OUT: "rpc", covered by memberMismatch()'s warning, or
 * "raft" or "http"); NULL when none. `members add` refuses the node's addresses while that
 * member has them. */
static const Idem__Member *addressHolder(const struct probe *probes, size_t n,
                                         const struct clusterView *v, const Idem__NodeStatus *st,
                                         const char **which)
{
    const Idem__Member *held = NULL;
    for (size_t i = 0; v->members_of != NULL && i < v->members_of->n_members; i++) {
        const Idem__Member *m = v->members_of->members[i];
        if (m->id == st->id) {
            continue;
        }
        if (answerAt(probes, n, m->rpc_address) == st) {
            *which = "rpc";
            return m;
        }
        if (held == NULL && strcmp(m->raft_address, st->raft_address) == 0) {
            held = m;
            *which = "raft";
        } else if (held == NULL && st->http_address[0] != '\0' &&
                   strcmp(m->http_address, st->http_address) == 0) {
            held = m;
            *which = "http";
        }
    }
    return held;
}

static void statusWarnings(const struct statusRow *rows, size_t n, const struct probe *probes,
                           size_t n_probes, const struct clusterView *v, uint64_t max_lag,
                           json_t *warnings)
{
    char name[320];
    for (size_t i = 0; i < n; i++) {
        const json_t *x = rows[i].node;
        nodeName(x, name, sizeof name);
        const char *role = json_string_value(json_object_get(x, "role"));
        const char *err = json_string_value(json_object_get(x, "error"));
        if (strcmp(role, "unreachable") == 0) {
            addWarning(warnings, "%s is unreachable: %s", name, err ? err : "no answer");
        } else if (strcmp(role, "refused") == 0) {
            addWarning(warnings, "%s %s: %s", name,
                       probeRefused(rows[i].p) ? "refused the admin token" : "refused status",
                       err ? err : "");
        } else {
            json_t *lag = json_object_get(x, "lag");
            json_t *stuck = json_object_get(x, "append_oldest_ms");
            if (json_is_integer(stuck) && json_integer_value(stuck) >= STUCK_WRITE_MS) {
                addWarning(warnings,
                           "%s: a Raft log write has been in flight for %.1f s: its disk is "
                           "slow or not answering (%s)",
                           name, (double)json_integer_value(stuck) / 1000.0,
                           strcmp(role, "leader") == 0
                               ? "the leader: nothing commits meanwhile"
                               : "the others commit without it, if they are a majority");
            }
            /* A spare gets no log until it is promoted (raft replicates to voters and
             * standbys only): its lag is expected, not a warning. */
            const char *member = json_string_value(json_object_get(x, "member_role"));
            bool spare = member != NULL && strcmp(member, "spare") == 0;
            /* A node that answers but is not in the configuration (removed and still
             * running, or started and not added yet) keeps calling elections nobody
             * answers, and is easy to take for a member in the table. */
            /* Unless a member holds its addresses (`members add` with a wrong ID): then
             * adding it is refused until that member is removed. */
            bool non_member = member == NULL && v->members_of != NULL;
            const Idem__NodeStatus *st = probeStatus(rows[i].p);
            const char *which = NULL;
            const Idem__Member *holder = member == NULL && st != NULL
                                             ? addressHolder(probes, n_probes, v, st, &which)
                                             : NULL;
            if (non_member && holder == NULL) {
                addWarning(warnings,
                           "%s answers but is not a member of the Raft configuration "
                           "(removed, or not added yet): stop it, or `idemctl members add` it",
                           name);
            } else if (holder != NULL && strcmp(which, "rpc") != 0) {
                char add[4 * ADDR_MAX];
                addCommand(st, add, sizeof add);
                addWarning(warnings,
                           "%s answers but is not a member of the Raft configuration, and its "
                           "%s address %s is member %" PRIu64 "'s there: the id (or address) "
                           "given to `members add` for member %" PRIu64 " is wrong; `idemctl "
                           "members remove %" PRIu64 "`, then `%s`",
                           name, which,
                           strcmp(which, "raft") == 0 ? st->raft_address : st->http_address,
                           holder->id, holder->id, holder->id, add);
            }
            /* Nor is a non-member's (its warning above says what to do): the leader sends
             * it nothing. */
            if (!spare && !non_member && json_is_integer(lag) &&
                (uint64_t)json_integer_value(lag) > max_lag) {
                addWarning(warnings,
                           "%s lags: applied index %" JSON_INTEGER_FORMAT
                           " is %" JSON_INTEGER_FORMAT " entr%s behind the leader's %" PRIu64
                           " (more than --max-lag %" PRIu64 ")",
                           name, json_integer_value(json_object_get(x, "applied_index")),
                           json_integer_value(lag), json_integer_value(lag) == 1 ? "y" : "ies",
                           v->leader_st->applied_index, max_lag);
            }
        }
    }
    /* Members whose rpc address is answered by another node, or who listen for Raft
     * elsewhere than the configuration says: Raft cannot reach them. */
    for (size_t i = 0; v->members_of != NULL && i < v->members_of->n_members; i++) {
        char why[2048];
        if (memberMismatch(probes, n_probes, v, v->members_of->members[i], why, sizeof why)) {
            addWarning(warnings, "%s", why);
        }
    }
    /* Members with raft.secret_file and members without it cannot talk at all. */
    char with[160] = "", without[160] = "";
    for (size_t i = 0; i < n; i++) {
        const json_t *auth = json_object_get(rows[i].node, "raft_authenticated");
        const json_t *id = json_object_get(rows[i].node, "id");
        if (!json_is_boolean(auth) || !json_is_integer(id)) {
            continue;
        }
        char *list = json_is_true(auth) ? with : without;
        size_t len = strlen(list);
        if (len + 24 < sizeof with) {
            snprintf(list + len, sizeof with - len, "%s%" JSON_INTEGER_FORMAT, len ? ", " : "",
                     json_integer_value(id));
        }
    }
    if (with[0] != '\0' && without[0] != '\0') {
        addWarning(warnings,
                   "Raft authentication differs: node(s) %s authenticate their Raft connections "
                   "(raft.secret_file) and node(s) %s do not; those cannot talk to each other",
                   with, without);
    }
    if (v->members_of == NULL) {
        addWarning(warnings, "cluster state unknown: no node answered with its status");
        return;
    }
    if (v->unreachable_leader != 0) {
        addWarning(warnings,
                   "no leader: the reachable nodes follow node %" PRIu64 ", which does not "
                   "answer as leader; requests answer unavailable until one is elected",
                   v->unreachable_leader);
    } else if (v->leader == 0) {
        addWarning(warnings, "no leader: no majority of the reachable nodes agrees on one; "
                             "requests answer unavailable until one is elected");
    }
    if (2 * v->reachable_voters <= v->voters) {
        addWarning(warnings,
                   "no quorum: %zu of %zu voters reachable; the cluster cannot commit, "
                   "requests answer unavailable",
                   v->reachable_voters, v->voters);
    }
}

/* A cell's text: an integer, a string, or "-" for anything else (null, absent). */
static const char *cellText(const json_t *v, char *buf, size_t len)
{
    if (json_is_integer(v)) {
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    }
    return json_is_string(v) ? json_string_value(v) : "-";
}

/* `digest`: the nodes were asked for their digests (status --digest), shown last. */
static void printStatusTable(const json_t *o, bool digest)
{
    json_t *leader = json_object_get(o, "leader_id");
    json_t *voters = json_object_get(o, "voters");
    if (json_is_integer(leader)) {
        printf("leader: %" JSON_INTEGER_FORMAT, json_integer_value(leader));
    } else {
        printf("leader: none");
    }
    printf("   quorum: %s", json_is_true(json_object_get(o, "quorum")) ? "yes" : "NO");
    if (json_is_integer(voters)) {
        printf(" (%" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT " voters reachable)",
               json_integer_value(json_object_get(o, "reachable_voters")),
               json_integer_value(voters));
    }
    putchar('\n');
    static const struct {
        const char *title, *field;
    } cols[] = {
        {"ID", "id"},
        {"RPC_ADDRESS", "rpc_address"},
        {"ROLE", "role"},
        {"MEMBER", "member_role"},
        {"TERM", "term"},
        {"LEADER", "leader_id"},
        {"COMMIT", "commit_index"},
        {"APPLIED", "applied_index"},
        {"LAG", "lag"},
        {"SNAPSHOT", "last_snapshot_index"},
        {"RECORDS", "records"},
        {"TOMBSTONES", "tombstones"},
        {"QUARANTINED", "quarantined"},
        {"BYTES", "bytes"},
        {"DIGEST", "digest"},
    };
    enum { NCOLS = sizeof cols / sizeof cols[0], ERR_AFTER = 4 };
    size_t ncols = digest ? NCOLS : NCOLS - 1;
    /* Each column as wide as its widest cell; a node that did not answer shows its error
     * after its first ERR_AFTER cells, which alone count for the widths. */
    int width[NCOLS];
    for (size_t c = 0; c < ncols; c++) {
        width[c] = (int)strlen(cols[c].title);
    }
    const json_t *nodes = json_object_get(o, "nodes");
    size_t i;
    json_t *x;
    char buf[32];
    json_array_foreach(nodes, i, x)
    {
        bool err = json_object_get(x, "error") != NULL;
        for (size_t c = 0; c < ncols && (!err || c < ERR_AFTER); c++) {
            size_t w = strlen(cellText(json_object_get(x, cols[c].field), buf, sizeof buf));
            width[c] = w > (size_t)width[c] ? (int)w : width[c];
        }
    }
    for (size_t c = 0; c < ncols; c++) {
        if (c + 1 < ncols) {
            printf("%-*s ", width[c], cols[c].title);
        } else {
            printf("%s\n", cols[c].title);
        }
    }
    json_array_foreach(nodes, i, x)
    {
        const char *err = json_string_value(json_object_get(x, "error"));
        for (size_t c = 0; c < ncols; c++) {
            if (err != NULL && c >= ERR_AFTER) {
                printf("%s", err);
                break;
            }
            const char *t = cellText(json_object_get(x, cols[c].field), buf, sizeof buf);
            if (c + 1 < ncols) {
                printf("%-*s ", width[c], t);
            } else {
                printf("%s", t);
            }
        }
        putchar('\n');
    }
    json_array_foreach(json_object_get(o, "warnings"), i, x)
    {
        printf("warning: %s\n", json_string_value(x));
    }
}

/* status when every node that answered refused the admin token: says so on stderr (with
 * --json also as {"outcome", "error", "nodes"} on stdout) and returns EXIT_USAGE, a
 * credential error. Takes `nodes`. */
static int statusRefused(const struct global *g, json_t *nodes, size_t n, size_t refused,
                         size_t unauthenticated)
{
    const char *why = unauthenticated == refused ? "unauthenticated"
                      : unauthenticated == 0     ? "forbidden"
                                                 : "unauthenticated or forbidden";
    char msg[256];
    if (refused == n) {
        snprintf(msg, sizeof msg, "the admin token was refused by every node (%s)", why);
    } else {
        snprintf(msg, sizeof msg,
                 "the admin token was refused by every node that answered, %zu of %zu (%s); "
                 "the others are unreachable",
                 refused, n, why);
    }
    fprintf(stderr, "idemctl: status: %s\n", msg);
    fprintf(stderr, "idemctl: %s\n",
            unauthenticated == 0
                ? "that is a tenant's token: status needs the admin token (--admin-token or "
                  "IDEM_ADMIN_TOKEN)"
                : "check --admin-token (or IDEM_ADMIN_TOKEN): the nodes know the admin token "
                  "by its SHA-256 (admin.token_sha256)");
    if (g->json) {
        json_t *o = jobj();
        jset(o, "outcome", json_string(unauthenticated > 0 ? "unauthenticated" : "forbidden"));
        jset(o, "error", jstr(msg));
        jset(o, "nodes", nodes);
        printJson(o);
        json_decref(o);
    } else {
        json_decref(nodes);
    }
    return EXIT_USAGE;
}

static int cmdStatus(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    bool digest = false;
    const char *lag = NULL;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--max-lag", &lag)) {
            continue;
        }
        if (optFlag(a, "--digest")) {
            digest = true;
            continue;
        }
        positional(a, pos, 0, &npos);
    }
    uint64_t max_lag = lag ? cli_parse_u64("--max-lag", lag, 0, UINT64_MAX) : DEFAULT_MAX_LAG;
    struct discovery d;
    discover(g, digest, &d);
    struct probe *probes = d.probes;
    size_t n = d.n;
    struct clusterView v = d.v;
    struct statusRow *rows = calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        oom();
    }
    size_t answered = 0, refused = 0, unauthenticated = 0;
    for (size_t i = 0; i < n; i++) {
        rows[i].node = nodeJson(&probes[i], &v);
        rows[i].p = &probes[i];
        answered += probes[i].rv == IDEM_OK;
        refused += probeRefused(&probes[i]);
        unauthenticated += probeRefused(&probes[i]) && idem_response_outcome(probes[i].resp) ==
                                                           IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED;
    }
    qsort(rows, n, sizeof *rows, nodeCmp);
    json_t *nodes = jarr();
    for (size_t i = 0; i < n; i++) {
        jpush(nodes, rows[i].node);
    }
    if (refused > 0 && refused == answered) {
        /* Nothing is known of the cluster but that the token is wrong: not "no quorum". */
        free(rows);
        discoveryFree(&d);
        return statusRefused(g, nodes, n, refused, unauthenticated);
    }
    json_t *warnings = jarr();
    statusWarnings(rows, n, probes, n, &v, max_lag, warnings);
    free(rows);

    json_t *o = jobj();
    jset(o, "leader_id", v.leader ? ju64(v.leader) : json_null());
    /* Quorum: a majority of the voters answered (with a status, or refusing the token). A
     * cluster between two leaders has one (it can elect the next); the leader's absence is
     * leader_id and the "no leader" warning. Without any status the voters are unknown. */
    jset(o, "quorum", json_boolean(v.members_of != NULL && 2 * v.reachable_voters > v.voters));
    jset(o, "voters", v.members_of ? ju64(v.voters) : json_null());
    jset(o, "reachable_voters", ju64(v.reachable_voters));
    jset(o, "max_lag", ju64(max_lag));
    jset(o, "nodes", nodes);
    json_t *ms = jarr();
    for (size_t i = 0; v.members_of != NULL && i < v.members_of->n_members; i++) {
        jpush(ms, memberJson(v.members_of->members[i]));
    }
    jset(o, "members", ms);
    jset(o, "warnings", warnings);
    if (g->json) {
        printJson(o);
    } else {
        printStatusTable(o, digest);
    }
    json_decref(o);
    if (answered == 0) {
        /* What the failures have in common (a TLS mismatch, say) is worth a hint. */
        unsigned hints = 0;
        for (size_t i = 0; i < n; i++) {
            hints |= hintsFor(g, probes[i].err);
        }
        printHints(hints);
    }
    discoveryFree(&d);
    /* Answered when any node answered, even with a refusal; 3 when none was reachable. */
    return answered > 0 ? EXIT_ANSWERED : EXIT_UNAVAILABLE;
}

/* ---- commands that find the leader first ------------------------------------------- */

/* snapshot without --node when status found no leader: the nodes' refusal of the token is
 * the answer (exit 0, as for every admin command); otherwise exit 3. */
/* No leader in a discovery: the refusal when every node that answered refused the token,
 * else exit 3 with why (`what`: the command; `hint`: what to do instead, or ""). */
/* The probe of a node that refused the token, when no node answered with a status; NULL
 * otherwise. */
static const struct probe *everyNodeRefused(const struct discovery *d)
{
    size_t statuses = 0;
    const struct probe *refused = NULL;
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        statuses += probeStatus(p) != NULL;
        refused = refused == NULL && probeRefused(p) ? p : refused;
    }
    return statuses == 0 ? refused : NULL;
}

static int noLeader(const struct global *g, const struct discovery *d, const char *what,
                    const char *hint)
{
    size_t answered = 0;
    const struct probe *refused = everyNodeRefused(d), *silent = NULL;
    for (size_t i = 0; i < d->n; i++) {
        const struct probe *p = &d->probes[i];
        answered += p->rv == IDEM_OK;
        silent = silent == NULL && p->rv != IDEM_OK ? p : silent;
    }
    if (refused != NULL) {
        emit(g, resultJson(refused->resp));
        return EXIT_ANSWERED;
    }
    char msg[600];
    if (answered == 0 && silent != NULL) {
        snprintf(msg, sizeof msg, "no node answered (%s)",
                 silent->err[0] ? silent->err : idem_strerror(silent->rv));
    } else {
        snprintf(msg, sizeof msg, "%s: no leader (as status shows)%s%s", what,
                 hint[0] ? "; " : "", hint);
    }
    return failCall(g, IDEM_EUNAVAILABLE, msg);
}

/* After a transfer answered "did not move" by the leader `asked` (0: its ID unknown): waits,
 * until `end` (ms), for status to show a leader. A leader other than `asked` means the
 * transfer took effect after all: EXIT_MOVED with *node_id that leader. `asked` itself:
 * EXIT_ANSWERED with its address in addr (the request may go to it again). Otherwise
 * (no leader by the end, or `asked` unknown so that a move cannot be told apart) the
 * failure is reported and its exit status returned. */
static int settledLeader(const struct global *g, uint64_t end, uint64_t asked, char *addr,
                         size_t addr_len, uint64_t *node_id)
{
    for (;;) {
        struct global probe = *g;
        probe.deadline_ms = (uint32_t)(end > nowMs() + 1 ? end - nowMs() : 1);
        struct discovery d;
        discover(&probe, false, &d);
        const struct probe *lp = nodeProbe(d.probes, d.n, &d.v, d.v.leader);
        uint64_t leader = lp != NULL ? d.v.leader : 0;
        if (lp != NULL) {
            snprintf(addr, addr_len, "%s", lp->addr);
        }
        discoveryFree(&d);
        if (leader != 0 && asked != 0 && leader != asked) {
            *node_id = leader;
            return EXIT_MOVED;
        }
        if (leader != 0 && leader == asked) {
            return EXIT_ANSWERED;
        }
        if (leader != 0) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "the leader answered that leadership did not move; status now shows node "
                     "%" PRIu64 " as leader, which may be a move: see status before sending "
                     "it again",
                     leader);
            return failCall(g, IDEM_EUNAVAILABLE, msg);
        }
        if (nowMs() + 200 >= end) {
            return failCall(g, IDEM_EUNAVAILABLE,
                            "leadership did not move before the "
                            "deadline");
        }
        struct timespec ts = {0, 200 * 1000000L}; /* an election is under way: wait for it */
        nanosleep(&ts, NULL);
    }
}

/* Sends `req` (admin) once to the leader that status finds, following one redirect should
 * leadership move in between, and without retries: a membership change or a transfer
 * that failed or timed out is not started again behind the operator's back (a transfer to
 * a node that cannot take over cost the cluster an election each time). On an answer
 * returns EXIT_ANSWERED with *resp (OUT; free with idem__response__free_unpacked), and
 * *node_id (OUT) the leader's ID as status found it; an `unavailable` answer is reported
 * as exit 3 with the leader's own words, except that a transfer answered "did not move"
 * which leadership then left all the same returns EXIT_MOVED with *node_id the new
 * leader. `promotee` (0: none) is a node to be promoted:
 * when it did not answer idemctl either, a warning says so before the request goes.
 * A membership change answered `unavailable` with retry_after_ms (raft refused it before
 * starting anything: the last change is not committed yet, as on a leader elected a moment
 * ago) is sent again after that long, within the deadline. `pre` (NULL: none): a discovery
 * just made, used instead of a new one (borrowed), so that a node that does not answer
 * costs one deadline, not two. */
static int leaderCall(const struct global *g, const char *what, uint64_t promotee,
                      const Idem__Request *req, Idem__Response **resp, uint64_t *node_id,
                      const struct discovery *pre)
{
    *resp = NULL;
    *node_id = 0;
    if (g->cluster == NULL) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    char addr[ADDR_MAX];
    struct discovery d;
    if (pre != NULL) {
        d = *pre; /* a shallow copy: freed by the caller, never here */
    } else {
        discover(g, false, &d);
    }
    /* The leader answered as leader, or refused the token (buildView()). */
    const struct probe *lp = nodeProbe(d.probes, d.n, &d.v, d.v.leader);
    if (lp == NULL) {
        /* A token every node refused: that node's answer to the request itself (forbidden
         * or unauthenticated, nothing changed). */
        lp = everyNodeRefused(&d);
    }
    if (lp == NULL) {
        int code = noLeader(g, &d, what, "");
        if (pre == NULL) {
            discoveryFree(&d);
        }
        return code;
    }
    snprintf(addr, sizeof addr, "%s", lp->addr);
    *node_id = probeStatus(lp) != NULL ? d.v.leader : 0;
    for (size_t i = 0; promotee != 0 && i < d.n; i++) {
        const struct probe *p = &d.probes[i];
        if (p->rv != IDEM_OK && probeId(p, &d.v) == promotee) {
            fprintf(stderr,
                    "idemctl: warning: node %" PRIu64 " (%s) did not answer: %s; Raft catches a "
                    "node up before it votes, so a node that is down makes the promote time "
                    "out\n",
                    promotee, p->addr, p->err[0] ? p->err : idem_strerror(p->rv));
        }
    }
    const Idem__Member *pm = promotee != 0 ? viewMember(&d.v, promotee, NULL) : NULL;
    char why[2048];
    if (pm != NULL && memberMismatch(d.probes, d.n, &d.v, pm, why, sizeof why)) {
        fprintf(stderr, "idemctl: warning: %s\n", why);
    }
    if (pre == NULL) {
        discoveryFree(&d);
    }
    uint64_t end = nowMs() + g->deadline_ms;
    struct global once = *g;
    bool redirected = false, resent = false;
    for (;;) {
        int code = call(&once, true, addr, req, resp);
        if (code != EXIT_ANSWERED) {
            return code;
        }
        Idem__Outcome out = idem_response_outcome(*resp);
        uint64_t wait = (*resp)->result != NULL ? (*resp)->result->retry_after_ms : 0;
        const char *redirect = (*resp)->leader_rpc_address;
        bool later =
            out == IDEM__OUTCOME__OUTCOME_UNAVAILABLE && wait > 0 && nowMs() + wait + 1 < end;
        if (later && req->op_case == IDEM__REQUEST__OP_MEMBERS) {
            /* Refused before anything started (the last change not committed yet): the
             * same leader is asked again; a move in between answers not_leader below. */
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            once.deadline_ms = (uint32_t)(end > nowMs() + 1 ? end - nowMs() : 1);
            continue;
        }
        bool not_moved = later && req->op_case == IDEM__REQUEST__OP_TRANSFER;
        if (not_moved || (resent && out == IDEM__OUTCOME__OUTCOME_NOT_LEADER)) {
            /* A transfer that did not move leadership (to a voter the leader hears from),
             * or, sent again, found that it had moved since. The election may still end
             * with a new leader after raft's timeout: status tells, and the request goes
             * again only to a leader that status shows is still the one asked (a new one
             * would move leadership a second time, or refuse NODE_ID as already the
             * leader); never to a redirect. */
            if (not_moved) {
                struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            uint64_t asked = *node_id;
            code = settledLeader(g, end, asked, addr, sizeof addr, node_id);
            if (code != EXIT_ANSWERED) {
                return code;
            }
            once.deadline_ms = (uint32_t)(end > nowMs() + 1 ? end - nowMs() : 1);
            resent = true;
            continue;
        }
        if (out == IDEM__OUTCOME__OUTCOME_NOT_LEADER && !redirected && !resent &&
            redirect != NULL && redirect[0] != '\0' && strlen(redirect) < sizeof addr) {
            /* Leadership moved between status and the request: the new leader's ID, if
             * status already shows it there, so that a "did not move" answer from it can
             * be told from a move. */
            snprintf(addr, sizeof addr, "%s", redirect);
            redirected = true;
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            struct global probe = *g;
            probe.deadline_ms = (uint32_t)(end > nowMs() + 1 ? end - nowMs() : 1);
            discover(&probe, false, &d);
            const Idem__Member *m = viewMember(&d.v, 0, addr); /* *resp, redirect: freed */
            *node_id = m != NULL && m->id == d.v.leader ? m->id : 0;
            discoveryFree(&d);
            continue;
        }
        if (out == IDEM__OUTCOME__OUTCOME_UNAVAILABLE || out == IDEM__OUTCOME__OUTCOME_NOT_LEADER) {
            const char *said = (*resp)->error != NULL ? (*resp)->error : "";
            char msg[600];
            snprintf(msg, sizeof msg, "%s: %s%s", addr,
                     out == IDEM__OUTCOME__OUTCOME_NOT_LEADER ? "leadership moved twice: " : "",
                     said[0] ? said : "unavailable");
            idem__response__free_unpacked(*resp, NULL);
            *resp = NULL;
            return failCall(g, IDEM_EUNAVAILABLE, msg);
        }
        return EXIT_ANSWERED;
    }
}

/* Why the leader refused to hand leadership to `id`, or (transfer false) to promote or
 * remove it (it answered invalid, and raft says only "server ID is not valid"): what status
 * shows of the node, in why (OUT). False when status does not tell. */
static bool idRefusal(const struct global *g, uint64_t id, bool transfer, char *why, size_t len)
{
    struct discovery d;
    discover(g, false, &d);
    const struct clusterView *v = &d.v;
    const Idem__Member *m = viewMember(v, id, NULL);
    bool known = v->members_of != NULL;
    if (!known) {
        /* nothing to say */
    } else if (m == NULL) {
        size_t k = (size_t)snprintf(why, len, "node %" PRIu64 " is not a member (members:", id);
        for (size_t i = 0; i < v->members_of->n_members && k < len; i++) {
            k += (size_t)snprintf(why + k, len - k, "%s %" PRIu64, i ? "," : "",
                                  v->members_of->members[i]->id);
        }
        if (k < len) {
            snprintf(why + k, len - k, ")");
        }
    } else if (!transfer) {
        known = false;
    } else if (id == v->leader) {
        snprintf(why, len, "node %" PRIu64 " is already the leader", id);
    } else if (strcmp(m->role, "voter") != 0) {
        snprintf(why, len, "node %" PRIu64 " is not a voter (role %s)", id, m->role);
    } else {
        known = false;
    }
    discoveryFree(&d);
    return known;
}

/* An invalid answer about node `id` (o: its JSON) whose reason status can tell: "error"
 * becomes that reason, and the leader's own words move to "node_error". */
static void explainRefusal(const struct global *g, json_t *o, uint64_t id, bool transfer)
{
    char why[256];
    if (!idRefusal(g, id, transfer, why, sizeof why)) {
        return;
    }
    json_t *said = json_object_get(o, "error");
    if (said != NULL) {
        jset(o, "node_error", json_copy(said));
    }
    jset(o, "error", jstr(why));
}

/* The leader as status shows it (one that answered as leader), 0 when none does. */
static uint64_t statusLeader(const struct global *g)
{
    struct discovery d;
    discover(g, false, &d);
    uint64_t leader = nodeProbe(d.probes, d.n, &d.v, d.v.leader) != NULL ? d.v.leader : 0;
    discoveryFree(&d);
    return leader;
}

/* Before `members remove ID`: when ID leads and another voter exists, leadership is handed
 * to a voter the leader hears from first, as `transfer` does. Removed while leading, the
 * node steps down only once the change commits, and the cluster has no leader (every
 * request unavailable) until the others time out and elect one: an election timeout or
 * two. *moved_to (OUT): the new leader, 0 when nothing moved; then *pre (OUT) is the
 * discovery made here, for the removal's leaderCall (free with discoveryFree() and free()),
 * else NULL. EXIT_ANSWERED to go on with the removal; otherwise the failure was reported
 * (nothing removed) and its exit status is returned. A last voter is left to the node,
 * which refuses its removal. */
static int leadershipAway(struct global *g, uint64_t id, uint64_t *moved_to, struct discovery **pre)
{
    *moved_to = 0;
    *pre = NULL;
    if (g->cluster == NULL) {
        return EXIT_ANSWERED; /* leaderCall says what is missing */
    }
    struct discovery *d = calloc(1, sizeof *d);
    if (d == NULL) {
        oom();
    }
    discover(g, false, d);
    bool leads = d->v.leader == id && nodeProbe(d->probes, d->n, &d->v, d->v.leader) != NULL;
    if (!leads || d->v.voters < 2) {
        *pre = d;
        return EXIT_ANSWERED;
    }
    discoveryFree(d);
    free(d);
    fprintf(stderr,
            "idemctl: note: node %" PRIu64 " leads: handing leadership to another voter before "
            "removing it (removed while leading, it would leave the cluster without a leader "
            "until an election)\n",
            id);
    Idem__TransferRequest tr = IDEM__TRANSFER_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    Idem__Response *resp = NULL;
    uint64_t leader_id = 0;
    json_t *extra = jobj();
    jset(extra, "removed", json_false());
    g->fail_extra = extra;
    int code =
        leaderCall(g, "members remove: moving leadership first", 0, &req, &resp, &leader_id, NULL);
    if (code == EXIT_MOVED) {
        *moved_to = leader_id;
        code = EXIT_ANSWERED;
    } else if (code == EXIT_ANSWERED) {
        Idem__Outcome out = idem_response_outcome(resp);
        if (out == IDEM__OUTCOME__OUTCOME_OK) {
            *moved_to = resp->leader_id;
            if (*moved_to == 0) { /* a node older than that field: as status shows it */
                uint64_t now = statusLeader(g);
                *moved_to = now != id ? now : 0;
            }
        } else {
            char msg[400];
            snprintf(msg, sizeof msg,
                     "members remove: node %" PRIu64 " leads, and handing leadership over "
                     "first was refused (%s: %s); nothing was removed",
                     id, idem_outcome_name(out),
                     resp->error != NULL && resp->error[0] ? resp->error : "no reason given");
            code = failCall(g, IDEM_EUNAVAILABLE, msg);
        }
        idem__response__free_unpacked(resp, NULL);
    }
    g->fail_extra = NULL;
    json_decref(extra);
    if (code != EXIT_ANSWERED) {
        fprintf(stderr, "idemctl: node %" PRIu64 " was not removed\n", id);
    }
    return code;
}

/* transfer [NODE_ID]: sent to the leader; a refusal of NODE_ID is explained from status. */
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
    tr.id = npos ? parseNodeId("transfer NODE_ID", pos[0]) : 0;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    Idem__Response *resp = NULL;
    uint64_t leader_id = 0;
    int code = leaderCall(g, "transfer", 0, &req, &resp, &leader_id, NULL);
    if (code == EXIT_MOVED) {
        json_t *o = jobj();
        jset(o, "outcome", jstr("ok"));
        jset(o, "leader_id", ju64(leader_id));
        char msg[160];
        snprintf(msg, sizeof msg,
                 "leadership moved to node %" PRIu64 " after the leader had answered that it "
                 "did not",
                 leader_id);
        jset(o, "message", jstr(msg));
        emit(g, o);
        return EXIT_ANSWERED;
    }
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = resultJson(resp);
    Idem__Outcome out = idem_response_outcome(resp);
    if (tr.id != 0 && out == IDEM__OUTCOME__OUTCOME_INVALID) {
        explainRefusal(g, o, tr.id, true);
    }
    if (out == IDEM__OUTCOME__OUTCOME_OK) {
        /* The node that leads now, as the old leader saw it when the transfer ended (a
         * node older than this field says 0: status is asked instead). */
        uint64_t now_leader = resp->leader_id != 0 ? resp->leader_id : statusLeader(g);
        jset(o, "leader_id", now_leader != 0 ? ju64(now_leader) : json_null());
        if (now_leader != 0 && json_object_get(o, "message") == NULL) {
            char msg[96];
            snprintf(msg, sizeof msg, "node %" PRIu64 " leads now", now_leader);
            jset(o, "message", jstr(msg));
        }
    }
    emit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* snapshot [--node ADDR]: on ADDR, else on the leader that status finds. */
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
    /* Any node takes a snapshot when asked: find the leader as status does. */
    char leader_addr[ADDR_MAX];
    uint64_t leader_id = 0;
    if (node == NULL) {
        struct discovery d;
        discover(g, false, &d);
        /* The leader answered as leader, or refused the token (buildView()). */
        const struct probe *lp = nodeProbe(d.probes, d.n, &d.v, d.v.leader);
        if (lp == NULL) {
            int code = noLeader(g, &d, "snapshot", "pass --node ADDR to take a snapshot on one node");
            discoveryFree(&d);
            return code;
        }
        snprintf(leader_addr, sizeof leader_addr, "%s", lp->addr);
        leader_id = d.v.leader;
        discoveryFree(&d);
        node = leader_addr;
    }
    Idem__SnapshotRequest sn = IDEM__SNAPSHOT_REQUEST__INIT;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_SNAPSHOT;
    req.snapshot = &sn;
    json_t *extra = jobj();
    jset(extra, "node", jstr(node));
    if (leader_id != 0) {
        jset(extra, "node_id", ju64(leader_id));
    }
    return callAndEmit(g, true, node, &req, extra);
}

/* ---- records of any tenant (admin) --------------------------------------------------- */

static void requireTenant(const char *cmd, const char *tenant)
{
    if (tenant == NULL) {
        cli_usage_error("%s: missing TENANT", cmd);
    }
    if (tenant[0] == '\0' || strlen(tenant) > TENANT_MAX) {
        cli_usage_error("%s: TENANT must be 1-%d bytes", cmd, TENANT_MAX);
    }
}

/* A record as an operator sees it: the key only with `reveal`, the fingerprint as the
 * 12-hex prefix logs carry, the stored response's status and size (its body only with
 * `reveal`), and no stored response at all when `with_response` is false. */
static json_t *adminRecordJson(const Idem__AdminRecord *ar, bool reveal, bool with_response)
{
    json_t *o = jobj();
    const Idem__Record *r = ar->record;
    if (r == NULL) {
        jset(o, "key_digest", jstr(ar->key_digest));
        return o;
    }
    jset(o, "tenant", jstr(r->tenant));
    jset(o, "key_digest", jstr(ar->key_digest));
    if (reveal) {
        jsetBytes(o, "key", r->key.data, r->key.len);
    }
    jset(o, "state", json_string(stateName(r->state)));
    jset(o, "fingerprint_prefix",
         jhex(r->fingerprint.data, r->fingerprint.len < 6 ? r->fingerprint.len : 6));
    jset(o, "token", ju64(r->token));
    jset(o, "created_at_ms", ju64(r->created_at_ms));
    jset(o, "lease_deadline_ms", ju64(r->lease_deadline_ms));
    jset(o, "expires_at_ms", ju64(r->expires_at_ms));
    jset(o, "completion", completionJson(r->completion));
    if (!with_response) {
        return o;
    }
    Idem__StoredResponse *sr =
        r->response.len > 0 ? idem__stored_response__unpack(NULL, r->response.len, r->response.data)
                            : NULL;
    if (sr == NULL) {
        jset(o, "response", json_null());
        if (r->response.len > 0) {
            jset(o, "response_error", json_string("stored response does not decode"));
        }
        return o;
    }
    json_t *rj = storedResponseJsonAs(sr, reveal, true);
    idem__stored_response__free_unpacked(sr, NULL);
    jset(o, "response", rj);
    return o;
}

/* The outcome, and the node's note or refusal if any (never a record: no key bytes). */
static json_t *outcomeJson(const Idem__Response *resp)
{
    json_t *o = jobj();
    Idem__Outcome outcome = idem_response_outcome(resp);
    jset(o, "outcome", json_string(idem_outcome_name((int)outcome)));
    if (resp->result != NULL && resp->result->detail != NULL && resp->result->detail[0] != '\0') {
        jset(o, "detail", jstr(resp->result->detail));
    }
    if (resp->error != NULL && resp->error[0] != '\0') {
        jset(o, outcome == IDEM__OUTCOME__OUTCOME_OK ? "message" : "error", jstr(resp->error));
    }
    return o;
}

static int keyGet(struct global *g, const char *tenant, const char *key, bool reveal)
{
    Idem__KeyGetRequest kg = IDEM__KEY_GET_REQUEST__INIT;
    kg.tenant = (char *)tenant;
    kg.key.data = (uint8_t *)key;
    kg.key.len = strlen(key);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_KEY_GET;
    req.key_get = &kg;
    Idem__Response *resp = NULL;
    int code = call(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = outcomeJson(resp);
    if (resp->n_records > 0 && resp->records[0] != NULL) {
        json_t *rec = adminRecordJson(resp->records[0], reveal, true);
        json_object_update(o, rec);
        json_decref(rec);
    }
    emit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

static int keyPurge(struct global *g, const char *tenant, const char *key)
{
    Idem__PurgeRequest pr = IDEM__PURGE_REQUEST__INIT;
    pr.tenant = (char *)tenant;
    pr.key.data = (uint8_t *)key;
    pr.key.len = strlen(key);
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_PURGE;
    req.purge = &pr;
    Idem__Response *resp = NULL;
    int code = call(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = outcomeJson(resp);
    if (idem_response_outcome(resp) == IDEM__OUTCOME__OUTCOME_OK && resp->result != NULL) {
        jset(o, "purged_token", ju64(resp->result->token));
    }
    emit(g, o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* key get|resolve|purge TENANT KEY [options] */
static int cmdKey(struct global *g, struct args *a)
{
    const char *pos[3];
    size_t npos = 0;
    const char *status = NULL, *body = NULL;
    bool release = false, reveal = false;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--status", &status) || optValue(a, "--body", &body)) {
            continue;
        }
        if (optFlag(a, "--release")) {
            release = true;
            continue;
        }
        if (optFlag(a, "--reveal")) {
            reveal = true;
            continue;
        }
        positional(a, pos, 3, &npos);
    }
    if (npos == 0) {
        cli_usage_error("key: missing subcommand (get, resolve or purge)");
    }
    const char *sub = pos[0];
    char cmd[32];
    snprintf(cmd, sizeof cmd, "key %s", sub);
    bool is_get = strcmp(sub, "get") == 0, is_resolve = strcmp(sub, "resolve") == 0,
         is_purge = strcmp(sub, "purge") == 0;
    if (!is_get && !is_resolve && !is_purge) {
        cli_usage_error("key: unknown subcommand \"%s\" (get, resolve or purge)", sub);
    }
    requireTenant(cmd, npos > 1 ? pos[1] : NULL);
    requireKey(cmd, npos > 2 ? pos[2] : NULL);
    if (reveal && !is_get) {
        cli_usage_error("%s: --reveal goes with key get", cmd);
    }
    if (!is_resolve && (release || status != NULL || body != NULL)) {
        cli_usage_error("%s: --release, --status and --body go with key resolve", cmd);
    }
    if (is_get) {
        return keyGet(g, pos[1], pos[2], reveal);
    }
    if (is_purge) {
        return keyPurge(g, pos[1], pos[2]);
    }
    return resolveCall(g, cmd, pos[1], pos[2], release, status, body);
}

/* quarantine [list] [--tenant T] [--limit N] [--reveal] [--lease-ended] */
static int cmdQuarantine(struct global *g, struct args *a)
{
    const char *pos[1];
    size_t npos = 0;
    const char *tenant = NULL, *limit = NULL;
    bool reveal = false, lease_ended = false;
    while (a->i < a->argc) {
        if (commonOpt(g, a) || optValue(a, "--tenant", &tenant) || optValue(a, "--limit", &limit)) {
            continue;
        }
        if (optFlag(a, "--reveal")) {
            reveal = true;
            continue;
        }
        if (optFlag(a, "--lease-ended")) {
            lease_ended = true;
            continue;
        }
        positional(a, pos, 1, &npos);
    }
    if (npos > 0 && strcmp(pos[0], "list") != 0) {
        cli_usage_error("quarantine: unknown subcommand \"%s\" (list)", pos[0]);
    }
    if (tenant != NULL) {
        requireTenant("quarantine list --tenant", tenant);
    }
    Idem__QuarantineListRequest ql = IDEM__QUARANTINE_LIST_REQUEST__INIT;
    ql.tenant = (char *)(tenant ? tenant : "");
    ql.limit = limit ? (uint32_t)cli_parse_u64("--limit", limit, 1, QUARANTINE_MAX_LIMIT)
                     : QUARANTINE_DEFAULT_LIMIT;
    ql.lease_ended = lease_ended;
    Idem__Request req = IDEM__REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_QUARANTINE_LIST;
    req.quarantine_list = &ql;
    Idem__Response *resp = NULL;
    int code = call(g, true, NULL, &req, &resp);
    if (code != EXIT_ANSWERED) {
        return code;
    }
    json_t *o = outcomeJson(resp);
    if (idem_response_outcome(resp) != IDEM__OUTCOME__OUTCOME_OK) {
        emit(g, o);
        idem__response__free_unpacked(resp, NULL);
        return EXIT_ANSWERED;
    }
    json_t *recs = jarr();
    for (size_t i = 0; i < resp->n_records; i++) {
        json_t *r = adminRecordJson(resp->records[i], reveal, false);
        /* The record keeps no quarantine time: since is when the key was first claimed
         * (a takeover keeps created_at); a lease ended at its deadline. */
        json_t *since = json_object_get(r, lease_ended ? "lease_deadline_ms" : "created_at_ms");
        if (since != NULL) {
            jset(r, "since_ms", json_copy(since));
        }
        jpush(recs, r);
    }
    jset(o, "count", ju64(resp->n_records));
    jset(o, "lease_ended", json_boolean(lease_ended));
    jset(o, "more", json_boolean(resp->more));
    jset(o, "limit", ju64(ql.limit));
    jset(o, "records", recs);
    if (g->json) {
        printJson(o);
    } else {
        const char *what =
            lease_ended ? "records in processing whose lease has ended" : "quarantined records";
        if (resp->n_records == 0) {
            printf("no %s%s%s\n", what, tenant ? " of tenant " : "", tenant ? tenant : "");
        } else {
            printf("%-20s %-12s %-20s %-24s%s\n", "TENANT", "KEY_DIGEST", "TOKEN",
                   lease_ended ? "LEASE ENDED (UTC)" : "SINCE (claimed, UTC)",
                   reveal ? " KEY" : "");
        }
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r)
        {
            char when[40];
            isoTime((uint64_t)json_integer_value(json_object_get(r, "since_ms")), when,
                    sizeof when);
            printf("%-20s %-12s %-20" JSON_INTEGER_FORMAT " %-24s",
                   json_string_value(json_object_get(r, "tenant")),
                   json_string_value(json_object_get(r, "key_digest")),
                   json_integer_value(json_object_get(r, "token")), when);
            if (reveal) {
                const char *k = json_string_value(json_object_get(r, "key"));
                printf(" %s", k ? k : "(not UTF-8)");
            }
            putchar('\n');
        }
        if (resp->more) {
            printf("... more %s than --limit %" PRIu32 " (not shown)\n", what, ql.limit);
        }
    }
    json_decref(o);
    idem__response__free_unpacked(resp, NULL);
    return EXIT_ANSWERED;
}

/* ---- bench and help ------------------------------------------------------------------ */

static void execBench(const struct global *g, int argc, char **argv) __attribute__((noreturn));

/* Replaces idemctl with idem-bench from idemctl's own directory, passing idemctl's global
 * --cluster, --token, --json and --deadline first and then argv[0..argc) unchanged. */
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
        oom();
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
        av[k++] = (char *)"--token";
        av[k++] = (char *)g->token;
    }
    if (g->json) {
        av[k++] = (char *)"--json";
    }
    /* TLS: from the flags only too (idem-bench reads IDEM_TLS* itself). */
    if (g->tls_flags.on) {
        av[k++] = (char *)"--tls";
    }
    const char *tls_names[] = {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"};
    const char *tls_vals[] = {g->tls_flags.ca_file, g->tls_flags.cert_file,
                              g->tls_flags.key_file, g->tls_flags.server_name};
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

/* ---- main ---------------------------------------------------------------------------- */

struct command {
    const char *name;
    int (*run)(struct global *g, struct args *a);
    bool admin;
    const char *key_operands, *key_form; /* struct args; NULL: no KEY operand */
};

static const struct command commands[] = {
    {"status", cmdStatus, true, NULL, NULL},
    {"claim", cmdClaim, false, "KEY", "claim --fingerprint HEX64 [OPTIONS] -- KEY"},
    {"complete", cmdComplete, false, "KEY", "complete --token N --status CODE [OPTIONS] -- KEY"},
    {"release", cmdRelease, false, "KEY", "release --token N -- KEY"},
    {"renew", cmdRenew, false, "KEY", "renew --token N [--lease MS] -- KEY"},
    {"get", cmdGet, false, "KEY", "get -- KEY"},
    {"members", cmdMembers, true, NULL, NULL},
    {"transfer", cmdTransfer, true, NULL, NULL},
    {"snapshot", cmdSnapshot, true, NULL, NULL},
    {"resolve", cmdResolve, true, "KEY",
     "resolve --tenant NAME (--release | --status CODE [--body TEXT]) -- KEY"},
    {"key", cmdKey, true, "get|resolve|purge TENANT KEY",
     "key get|resolve|purge TENANT [OPTIONS] -- KEY"},
    {"quarantine", cmdQuarantine, true, NULL, NULL},
};

static const char *envOrNull(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* Options that take a value as the next argument (any command's, and the global ones):
 * what follows them is a value, not --help nor a subcommand. */
static bool takesValue(const char *arg)
{
    static const char *const names[] = {
        "--cluster", "--token",       "--admin-token", "--deadline", "--tenant", "--status",
        "--body",    "--fingerprint", "--attempt",     "--lease",    "--ttl",    "--policy",
        "--outcome", "--node",        "--max-lag",     "--limit",
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
        } else if (sub == NULL && !isOption(argv[i])) {
            sub = argv[i];
        }
    }
    if (asked) {
        printHelp(cmd, sub);
    }
}

/* Whether --json comes as an option anywhere in argv[1..): before "--", not as an option's
 * value, and before `bench` (whose arguments are idem-bench's). Set before anything is
 * parsed, so that every usage error (and a TLS file that cannot be loaded) prints its JSON
 * object, also one found before --json itself, or after the command's --json was given. */
static bool jsonAsked(int argc, char **argv)
{
    bool command = false;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            return true;
        }
        if (takesValue(argv[i])) {
            i++; /* its value */
        } else if (!command && !isOption(argv[i])) {
            if (strcmp(argv[i], "bench") == 0) {
                return false;
            }
            command = true;
        }
    }
    return false;
}

int main(int argc, char **argv)
{
    cli_set_prog("idemctl");
    bool json = jsonAsked(argc, argv);
    cli_set_json(json);
    struct global g = {
        .cluster = envOrNull("IDEM_CLUSTER"),
        .token = envOrNull("IDEM_TOKEN"),
        .admin_token = envOrNull("IDEM_ADMIN_TOKEN"),
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
    while (a.i < argc && isOption(argv[a.i])) {
        const char *v;
        if (optValue(&a, "--cluster", &v)) {
            g.cluster = v;
        } else if (optValue(&a, "--token", &v)) {
            g.token = v;
        } else if (optValue(&a, "--admin-token", &v)) {
            g.admin_token = v;
        } else if (cli_tls_flag(&g.tls_flags, argc, argv, &a.i)) {
            continue;
        } else if (!commonOpt(&g, &a)) {
            cli_usage_error("unknown option %s", argv[a.i]);
        }
    }
    /* Each TLS flag wins over its variable. */
    g.tls.on = g.tls.on || g.tls_flags.on;
    g.tls.ca_file = g.tls_flags.ca_file ? g.tls_flags.ca_file : g.tls.ca_file;
    g.tls.cert_file = g.tls_flags.cert_file ? g.tls_flags.cert_file : g.tls.cert_file;
    g.tls.key_file = g.tls_flags.key_file ? g.tls_flags.key_file : g.tls.key_file;
    g.tls.server_name = g.tls_flags.server_name ? g.tls_flags.server_name : g.tls.server_name;
    if (a.i >= argc) {
        cli_usage_error("no command given");
    }
    const char *word = argv[a.i++];
    if (strcmp(word, "help") == 0) {
        if (a.i < argc && (strcmp(argv[a.i], "--help") == 0 || strcmp(argv[a.i], "-h") == 0)) {
            printHelp(NULL, NULL);
        }
        if (a.i < argc && findHelp(argv[a.i], NULL) == NULL) {
            cli_usage_error("help: unknown command \"%s\"", argv[a.i]);
        }
        printHelp(a.i < argc ? argv[a.i] : NULL, a.i + 1 < argc ? argv[a.i + 1] : NULL);
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

    /* Configuration errors are reported before the command's own arguments are parsed
     * only where they do not depend on them (snapshot --node may stand in for --cluster). */
    if (g.cluster != NULL) {
        char why[160];
        if (idem_seeds_check(g.cluster, why, sizeof why) != IDEM_OK) {
            cli_usage_error("bad --cluster: %s", why);
        }
    } else if (strcmp(cmd->name, "snapshot") != 0) {
        cli_usage_error("no cluster: pass --cluster H:P,... or set IDEM_CLUSTER");
    }
    if ((g.tls.cert_file == NULL) != (g.tls.key_file == NULL)) {
        cli_usage_error("--tls-cert and --tls-key go together");
    }
    if (g.cluster != NULL && cli_tls_wanted(&g.tls)) {
        /* A TLS file that cannot be loaded is a configuration error (exit 2), reported
         * before anything is sent; opening a client connects to nothing. */
        struct idem_client *c = NULL;
        char why[256];
        int rv = clientOpen(&g, g.cluster, "-", &c, why, sizeof why);
        idem_client_close(c);
        if (rv != IDEM_OK) {
            return failCall(&g, rv, why);
        }
    }
    const char *tok = bearer(&g, cmd->admin);
    if (tok == NULL || tok[0] == '\0') {
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
