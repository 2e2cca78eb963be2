/* idemctl.h: what the files of idemctl share (private to tools/idemctl/): exit statuses,
 * the global options and the argument cursor (args.c), help (help.c), JSON building and
 * the JSON views of answers (json.c), printing and failures (output.c), calls to one node
 * or the leader (call.c), status discovery (probe.c), calls to the leader that status finds
 * (leader.c), and the commands (data.c, records.c, members.c, status.c, health.c, reload.c) that
 * main.c dispatches to. */
#ifndef IDEM_TOOLS_IDEMCTL_H
#define IDEM_TOOLS_IDEMCTL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cli.h"
#include "idem_rpc.h"

#define EXIT_ANSWERED 0
#define EXIT_INTERNAL 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 3
#define EXIT_AUTH 4  /* the bearer token was refused (unauthenticated, forbidden) or missing */
#define EXIT_CHECK 5 /* status --check: the cluster answered, and a check failed */
/* leaderCall only: a transfer took effect after all; never an exit status */
#define EXIT_MOVED (-1)

#define ADDR_MAX 256 /* a node's address, with its NUL */

struct global {
    const char *cluster;
    const char *token;
    const char *admin_token;
    bool token_on_argv, admin_token_on_argv; /* given as --token T / --admin-token T */
    char *token_owned, *admin_token_owned;   /* read from --token-file / --admin-token-file */
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

/* ---- the argument cursor (args.c) ---- */

bool argsIsOption(const char *arg);
bool argsValue(struct args *a, const char *name, const char **val);
bool argsCommon(struct global *g, struct args *a);
void argsRequireKey(const char *cmd, const char *key);

/* An option of one command: one with a value (stored in *value) or a flag (*flag set to
 * true); exactly one of value and flag is not NULL. */
struct argsOpt {
    const char *name;
    const char **value;
    bool *flag;
};
void argsParse(struct global *g, struct args *a, const struct argsOpt *opts, size_t n_opts,
               const char **pos, size_t max, size_t *npos);
/* An option that may be given several times (--fingerprint-field PTR): its values, in the
 * order given, into values[0..*n) (at most max; one more is a usage error). */
struct argsRepeat {
    const char *name;
    const char **values;
    size_t max;
    size_t *n;
};
/* argsParse(), and the repeatable options reps[0..n_reps) (may be NULL). */
void argsParseRepeat(struct global *g, struct args *a, const struct argsOpt *opts, size_t n_opts,
                     const struct argsRepeat *reps, size_t n_reps, const char **pos, size_t max,
                     size_t *npos);

/* ---- help (help.c) ---- */

const char *helpFind(const char *cmd, const char *sub);
void helpPrint(const char *cmd, const char *sub) __attribute__((noreturn));

/* ---- JSON (json.c) ---- */

void jset(json_t *o, const char *k, json_t *v);
json_t *jobj(void);
json_t *jarr(void);
void jpush(json_t *arr, json_t *v);
json_t *jstr(const char *s);
json_t *ju64(uint64_t v);
json_t *jhex(const uint8_t *d, size_t n);
void jsetBytes(json_t *o, const char *key, const uint8_t *d, size_t n);
json_t *jResult(const Idem__Response *resp);
json_t *jMember(const Idem__Member *m);
json_t *jAdminRecord(const Idem__AdminRecord *ar, bool reveal, bool with_response);
json_t *jOutcome(const Idem__Response *resp);

/* ---- output (output.c) ---- */

void outOom(void) __attribute__((noreturn));
void outPrintJson(const json_t *o);
void outIsoTime(uint64_t ms, char *out, size_t len);
void outPrintFlat(const json_t *v, const char *prefix);
/* Writes len bytes of s to f for a human: what a terminal would act on (C0 controls, DEL,
 * the C1 controls U+0080..U+009F in UTF-8) as \xNN or \u00NN, a backslash doubled, so a
 * value a tenant stored (a header, a body) cannot move the cursor or recolour the screen. */
void outPutSafe(const char *s, size_t len, FILE *f);
void outEmit(const struct global *g, json_t *o);
/* Notes the outcome of an answer about to be printed (outEmit() does it): an answer that
 * refused the bearer token makes idemctl exit EXIT_AUTH. outTokenRefused(): that outcome
 * ("unauthenticated", "forbidden"), NULL when no answer printed refused it. */
void outNoteOutcome(const json_t *o);
const char *outTokenRefused(void);
unsigned outHintsFor(const struct global *g, const char *msg);
void outPrintHints(unsigned h);
int outFailCall(const struct global *g, int rv, const char *why);

/* ---- calls (call.c) ---- */

uint64_t callNowMs(void);
void callSleepMs(uint64_t ms);
int callClientOpen(const struct global *g, const char *seeds, const char *token,
                   struct idem_client **c, char *why, size_t why_len);
const char *callBearer(const struct global *g, bool admin);
int callFrom(const struct global *g, bool admin, const char *node, const Idem__Request *req,
             Idem__Response **resp, char *from, size_t from_len);
int callSend(const struct global *g, bool admin, const char *node, const Idem__Request *req,
             Idem__Response **resp);
int callAndEmit(const struct global *g, bool admin, const char *node, const Idem__Request *req,
                json_t *extra);

/* ---- status discovery (probe.c) ---- */

/* One node asked for its status, by its own thread. */
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

/* What status concluded about the cluster. */
struct clusterView {
    uint64_t leader;                    /* agreed by a majority of reachable nodes, and it
                                         * answered as leader (or refused the token); 0: none */
    uint64_t unreachable_leader;        /* agreed on, but it did not answer as leader */
    const Idem__NodeStatus *leader_st;  /* the leader's own status, when it answered */
    const Idem__NodeStatus *members_of; /* whose member list is the configuration shown */
    size_t voters, reachable_voters;    /* reachable: answered, with a status or a refusal */
};

/* What status found: every node asked (d.probes[0..n)) and the view built from them. */
struct discovery {
    struct probe *probes;
    size_t n;
    struct clusterView v;
};

/* Splits the (checked) --cluster list into its addresses, trimmed of the spaces around the
 * commas, each once (an address listed twice would count twice), into addrs; returns how
 * many (at most max). */
size_t probeClusterAddrs(const char *cluster, char addrs[][ADDR_MAX], size_t max);

const Idem__NodeStatus *probeStatus(const struct probe *p);
bool probeRefused(const struct probe *p);
const Idem__Member *probeViewMember(const struct clusterView *v, uint64_t id,
                                    const char *rpc_address);
uint64_t probeId(const struct probe *p, const struct clusterView *v);
const struct probe *probeOfNode(const struct probe *probes, size_t n, const struct clusterView *v,
                                uint64_t id);
const Idem__NodeStatus *probeAnswerAt(const struct probe *probes, size_t n, const char *rpc);
void probeAddCommand(const Idem__NodeStatus *st, char *out, size_t len);
bool probeMemberMismatch(const struct probe *probes, size_t n, const struct clusterView *v,
                         const Idem__Member *m, char *why, size_t len);
void probeDiscover(const struct global *g, bool digest, struct discovery *d);
/* Asks probes[0..n) (their addr set) for their status again, in parallel, each within
 * deadline_ms; earlier answers are freed. Free the answers with probeDiscoveryFree() or
 * idem__response__free_unpacked(). */
void probeAgain(const struct global *g, struct probe *probes, size_t n, uint32_t deadline_ms);
void probeDiscoveryFree(struct discovery *d);

/* ---- calls to the leader that status finds (leader.c) ---- */

int leaderNone(const struct global *g, const struct discovery *d, const char *what,
               const char *hint);
int leaderCall(const struct global *g, const char *what, uint64_t promotee,
               const Idem__Request *req, Idem__Response **resp, uint64_t *node_id,
               const struct discovery *pre);
bool leaderDiscoverSettled(const struct global *g, struct discovery *d);
void leaderExplainRefusal(const struct global *g, json_t *o, uint64_t id, bool transfer);
uint64_t leaderOfStatus(const struct global *g);

/* ---- commands: each parses the arguments after its word and returns the exit status ---- */

/* data.c */
int dataCmdClaim(struct global *g, struct args *a);
int dataCmdComplete(struct global *g, struct args *a);
int dataCmdRelease(struct global *g, struct args *a);
int dataCmdRenew(struct global *g, struct args *a);
int dataCmdGet(struct global *g, struct args *a);
void dataStoredResponseFill(Idem__StoredResponse *sr, const char *cmd, const char *status,
                            const char *body);
/* records.c */
int recordsCmdResolve(struct global *g, struct args *a);
int recordsCmdKey(struct global *g, struct args *a);
int recordsCmdQuarantine(struct global *g, struct args *a);
/* members.c */
int membersCmd(struct global *g, struct args *a);
int membersCmdTransfer(struct global *g, struct args *a);
int membersCmdSnapshot(struct global *g, struct args *a);
/* status.c */
int statusCmd(struct global *g, struct args *a);
/* health.c: status --check's checks of a discovery (a JSON array of the failed ones, empty
 * when the cluster is healthy; voters that trail the leader are asked again for up to
 * max_ms), and `version` */
json_t *healthCheck(const struct global *g, const struct discovery *d, uint64_t max_entries,
                    uint64_t max_ms);
int versionCmd(struct global *g, struct args *a);
/* main.c: the checks made before a command is sent (the cluster list, the TLS files, the
 * bearer token it needs); EXIT_ANSWERED to go on, else reported and its exit status */
int mainConfigCheck(const struct global *g, const char *cmd, bool admin);
/* reload.c */
int reloadCmd(struct global *g, struct args *a);

#endif
