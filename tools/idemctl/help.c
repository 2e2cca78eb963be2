/* help: idemctl's --help text and the help of each command and subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemctl.h"

static const char usageText[] =
    "Usage: idemctl [GLOBAL OPTIONS] COMMAND [SUBCOMMAND] [ARGUMENTS] [OPTIONS]\n"
    "       idemctl COMMAND [SUBCOMMAND] --help     (or: idemctl help COMMAND [SUBCOMMAND])\n"
    "\n"
    "Global options (before COMMAND):\n"
    "  --cluster H:P,H:P,...  RPC addresses of the nodes (env IDEM_CLUSTER)\n"
    "  --token T              tenant bearer token, for the data commands (env IDEM_TOKEN)\n"
    "  --admin-token T        admin bearer token, for the admin commands\n"
    "                         (env IDEM_ADMIN_TOKEN)\n"
    "  --token-file F, --admin-token-file F\n"
    "                         the same tokens read from the first line of file F;\n"
    "                         a token given on the command line is visible to other\n"
    "                         users of the host (ps), and idemctl warns about it\n"
    "  --json, -o json        print exactly one JSON object on stdout (-o text: the\n"
    "                         default, lines and tables; the last of these wins)\n"
    "  --deadline MS          time allowed for the whole call, retries included\n"
    "                         (default 5000, at most 600000)\n"
    "  --help                 print this help and exit\n"
    "  --version              print idemctl's version and exit\n"
    "TLS, for nodes whose RPC listener has tls.rpc: true (before COMMAND):\n" CLI_TLS_HELP
    "Flags win over the environment. --json, -o and --deadline are accepted after COMMAND\n"
    "too.\n"
    "\n"
    "Admin commands (admin token):\n"
    "  status [--digest] [--max-lag-entries N] [--check [--max-lag-ms T]]\n"
    "                         every node: role, term, leader, indexes, records; warnings\n"
    "                         when a node lags or is unreachable, or there is no quorum;\n"
    "                         --check: exit 5 unless every voter answers, a leader is\n"
    "                         known and no voter lags\n"
    "  version [--client]     idemctl's version and every node's\n"
    "  members [list | add ID RAFT_ADDR RPC_ADDR [HTTP_ADDR] | promote ID | remove ID]\n"
    "  transfer [NODE_ID]     hand leadership over (default: a voter the leader hears from)\n"
    "  snapshot [--node ADDR] take a snapshot on ADDR (default: the leader)\n"
    "  reload [--node ADDR | --all]\n"
    "                         nodes read their configuration file again, as on SIGHUP\n"
    "                         (default: every node of --cluster; --all: every member)\n"
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
    "  claim KEY --tenant NAME [--request-body FILE|-] [--method M] [--path P]\n"
    "        [--content-type TYPE] [--fingerprint-field PTR]... [--fingerprint-ignore PTR]...\n"
    "        [OPTIONS]                the fingerprint computed as the gateway does\n"
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
    "  0  the call was answered, whatever the outcome: acquired, replay, not_found,\n"
    "     mismatch, in_progress ... are answers (see \"outcome\"); status: at least one\n"
    "     node answered (without --check); reload: every node asked reloaded\n"
    "  1  internal error (out of memory, no random source, idem-bench not found)\n"
    "  2  usage or configuration error (bad arguments, no cluster, a TLS file that cannot\n"
    "     be loaded; with --json also {\"outcome\": \"usage\", \"error\"} on stdout);\n"
    "     reload: a node refused its configuration file\n"
    "  3  unavailable: no leader, no quorum, deadline passed, nothing reachable (a node\n"
    "     whose certificate fails verification, or that refuses ours, counts as\n"
    "     unreachable: the message names the TLS failure)\n"
    "  4  the bearer token was refused (outcome unauthenticated, or forbidden: a tenant's\n"
    "     token on an admin command, the admin token on a data command) or not given;\n"
    "     status and version: by every node that answered\n"
    "  5  status --check: the cluster answered, and a check failed (stderr says which)\n"
    "bench exits as idem-bench does.\n";

/* Help of one command or subcommand: `idemctl CMD [SUB] --help`. */
struct help {
    const char *name; /* "status", "key get", ... */
    const char *text;
};

static const struct help helps[] = {
    {"status",
     "Usage: idemctl status [--digest] [--max-lag-entries N] [--check [--max-lag-ms T]]\n"
     "                      [--json]\n"
     "\n"
     "Asks every node of --cluster, and every member those nodes know of, about itself (in\n"
     "parallel, one deadline each round) and prints one line per node: id, RPC address,\n"
     "role, membership, term, the leader it follows, commit and applied index, how far its\n"
     "applied index trails the leader's, last snapshot index, records, tombstones,\n"
     "quarantined records and bytes. Then a warning line for each problem:\n"
     "  - a node is unreachable, or refused (a wrong admin token on that node);\n"
     "  - a node's applied index trails the leader's by more than --max-lag-entries\n"
     "    (default 1000);\n"
     "  - a node's oldest Raft log write has been in flight for 5 s or more (its disk\n"
     "    is slow or not answering; append_oldest_ms in --json);\n"
     "  - no leader: no majority of the reachable voters agrees on one;\n"
     "  - no quorum: no majority of the voters is reachable (a cluster\n"
     "    without a leader may still have its quorum, and elect one);\n"
     "  - a member's rpc address is answered by another node, or its node listens for\n"
     "    Raft elsewhere than the configuration says (a wrong id or address given to\n"
     "    members add: Raft cannot reach the member; the warning says what to run);\n"
     "  - Raft authentication differs: some nodes have raft.secret_file, some not.\n"
     "With --json: {\"leader_id\", \"quorum\", \"voters\", \"reachable_voters\", \"nodes\": "
     "[...],\n"
     "\"members\": [...], \"warnings\": [...]} (and \"check\" with --check).\n"
     "  --digest       also ask each node for the digest of its state, shown in a DIGEST\n"
     "                 column (equal on replicas at the same applied index)\n"
     "  --max-lag-entries N\n"
     "                 entries a node may trail the leader's applied index by (default\n"
     "                 1000; --max-lag N is the older name)\n"
     "  --check        a health check for scripts and probes: exit 5, with one line on\n"
     "                 stderr per failed check, unless a majority of the voters is\n"
     "                 reachable, a leader is known, every voter answers (unreachable or\n"
     "                 refusing the admin token fails) and no voter lags: trails the\n"
     "                 leader's applied index by more than --max-lag-entries, or has not\n"
     "                 applied the index the leader had within --max-lag-ms\n"
     "  --max-lag-ms T with --check: how long a voter that trails the leader may take to\n"
     "                 apply the leader's applied index of the first look (default 5000,\n"
     "                 1..600000); idemctl asks it again meanwhile, every 200 ms\n"
     "Exit status: 0 when at least one node answered (warnings included), 3 when none did,\n"
     "4 when every node that answered refused the admin token (said on stderr); with\n"
     "--check, 5 when a check failed. Needs the admin token.\n"},
    {"version",
     "Usage: idemctl version [--client] [--json]\n"
     "\n"
     "Prints idemctl's version (client) and the version each node reports in its status\n"
     "(nodes: id, rpc_address, version, or error when it did not answer), found as status\n"
     "finds them. --client: idemctl's version alone, without a cluster or a token.\n"
     "With --json: {\"client\", \"nodes\": [...]}. Exit status as for status: 0 when a node\n"
     "answered, 3 when none did, 4 when every node that answered refused the admin token.\n"
     "Needs the admin token (but with --client).\n"},
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
     "the node's configuration (its advertised address, not a *_listen one): A.B.C.D:PORT,\n"
     "[IPV6]:PORT or NAME:PORT (a host name, resolved by the members). Needs the admin\n"
     "token.\n"},
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
    {"reload",
     "Usage: idemctl reload [--node ADDR | --all]\n"
     "\n"
     "Asks nodes to read their configuration file again and apply what a running node can\n"
     "change (tenants, tokens, quotas, proxy routes, TLS files, log.level), as a SIGHUP does:\n"
     "ADDR; with --all every member that `idemctl status` finds; else every node of\n"
     "--cluster, one after the other. Each answers ok, or why it kept its running\n"
     "configuration (the file's error, FILE:LINE:COLUMN). --node may stand in for --cluster.\n"
     "Needs the admin token. Exit 0 when every node reloaded, 2 when one refused its file,\n"
     "4 when one refused the token, 3 when one did not answer.\n"},
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
     "       idemctl claim KEY --tenant NAME [--request-body FILE|-] [--method M] [--path P]\n"
     "                     [--content-type TYPE] [--fingerprint-field PTR]...\n"
     "                     [--fingerprint-ignore PTR]... [--attempt ID] [--lease MS]\n"
     "                     [--ttl MS] [--policy conflict|takeover]\n"
     "\n"
     "Claims KEY for the tenant of --token: acquired (fencing token, lease deadline), replay,\n"
     "in_progress, mismatch, lease_expired, outcome_unknown, expired, quota_exceeded. Without\n"
     "--attempt a random attempt id is used and printed, so the claim can be retried with it\n"
     "(--attempt takes 1-64 bytes).\n"
     "Lease and ttl default to the tenant's settings.\n"
     "\n"
     "The second form computes the fingerprint as the gateway does (and prints it): of the\n"
     "request M (default POST) on P (default /, with its query) with the body read from FILE\n"
     "(- for standard input; none: an empty body, at most 1 MiB), for tenant NAME, the tenant\n"
     "of --token (its name is part of the fingerprint). A JSON --content-type (the default,\n"
     "application/json, or */*+json) hashes the body's canonical JSON, as the JSON API's\n"
     "`request` form hashes a JSON value in `body` and proxy mode a JSON request; another\n"
     "(text/plain) hashes its raw bytes, as the JSON API hashes a string `body`.\n"
     "--fingerprint-ignore PTR (repeatable, at most 32) removes what the JSON Pointer PTR\n"
     "(RFC 6901, e.g. /ts, /items/0/note) names from a JSON body before it is hashed;\n"
     "--fingerprint-field PTR (repeatable, at most 32) hashes only the values the pointers\n"
     "name: the `request` members fingerprint_ignore and fingerprint_fields, and a proxy\n"
     "route's keys of those names (docs/contract.md). A body that is not JSON is hashed raw.\n"},
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

const char *helpFind(const char *cmd, const char *sub)
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

/* Prints the help of `cmd sub`, of `cmd`, or idemctl's (cmd NULL or unknown) on stdout,
 * and exits 0. */
void helpPrint(const char *cmd, const char *sub)
{
    const char *text = helpFind(cmd, sub);
    fputs(text != NULL ? text : usageText, stdout);
    if (text != NULL) {
        fputs("\nGlobal options, environment and exit status: idemctl --help\n", stdout);
    }
    exit(EXIT_ANSWERED);
}
