/* idem.c: libidem's synchronous client (see include/idem.h and include/idem_rpc.h): the
 * client object and the leader-following retry loop that every synchronous call goes
 * through; one round trip to one node (connect, TLS, write, read) is roundtrip.c's. Also
 * what every part of libidem shares: error and outcome names, messages, time, backoff.
 *
 * One call, the happy path: take a connection set from the pool, pack the Request behind
 * a 4-byte big-endian length, connect (or reuse the connection to) the node the client
 * believes leads, write the frame, read frames until the Response with our request id
 * arrives, put the set back, hand the answer to the caller.
 *
 * Failure modes, and what the call does about each:
 * - connect refused, reset, EOF, write error, a TLS handshake or verification failure, a
 *   frame that does not decode, an answer with request id 0 (the node could not read our
 *   frame, applied nothing and closes the connection): the connection is closed; the call
 *   backs off and tries the next candidate.
 * - a kept-alive connection that the server closed while idle: noticed on the first
 *   write or read of the call; the call reconnects to the same node once, at once.
 * - OUTCOME_NOT_LEADER with leader_rpc_address: the leader becomes the next candidate
 *   (learned as a node if it is not a seed), without backing off the first time; repeated
 *   redirects back off, so that two nodes pointing at each other cannot spin.
 * - OUTCOME_NOT_LEADER without an address, OUTCOME_UNAVAILABLE: back off, next seed.
 * - OUTCOME_UNAVAILABLE with retry_after_ms (a leader refusing for load: batch.max_pending_mb
 *   or the tenant's share of it; a leader handing its leadership on; a membership change
 *   or transfer that may succeed again):
 *   back off at least that long (never past the deadline), then the same node again.
 * - no answer: each attempt on one node (connect, TLS handshake, write, answer) gets
 *   min(remaining, max(remaining / 3, IDEM_ATTEMPT_MIN_MS)) of the call's time. When that
 *   passes, the connection (which still has our request outstanding) is closed and the
 *   next seed is tried with the same request (same request id, same attempt id), and the
 *   client stops starting calls on that node; so a leader that accepts connections but
 *   does not answer (stopped, frozen, blackholed) costs a third of a call, not all of it.
 *   When the call's deadline passes, it returns IDEM_EUNAVAILABLE.
 * - an answer that our frame exceeded the node's max_frame_bytes (IDEM_FRAME_TOO_LARGE):
 *   IDEM_ETOOBIG at once (definite); the connection stays.
 * Every loop is bounded by the call's deadline. Backoff: 10 ms doubling to 200 ms, each
 * sleep shortened by up to a quarter at random so that clients do not retry in lockstep,
 * and never past the deadline.
 *
 * Threads: the client's mutex guards its node table (append-only: a published node never
 * changes until the client is freed), the leader hint, the request id counter, the jitter
 * state, the last error message (idem_client_errmsg copies it out under the mutex) and the
 * pool. Frame buffers that held the bearer token are wiped before they are freed. Sockets
 * and buffers belong to a connection set, which belongs to one call at a time, so no I/O
 * happens under the mutex. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

/* ---- names --------------------------------------------------------------------------- */

#define IDEM__ERRNO_STRERROR(name, value, text)                                              \
    case name:                                                                                \
        return text;

const char *idem_strerror(int err)
{
    switch (err) {
        IDEM_ERRNO_MAP(IDEM__ERRNO_STRERROR)
    default:
        return "unknown error";
    }
}

const char *idem_outcome_name(int outcome)
{
    static const char *const names[] = {
        "unspecified", "acquired",       "replay",     "in_progress",    "mismatch",
        "lease_expired", "outcome_unknown", "expired", "ok",             "lease_lost",
        "not_found",   "quota_exceeded", "invalid",    "unavailable",    "not_leader",
        "unauthenticated", "forbidden",
    };
    if (outcome < 0 || (size_t)outcome >= sizeof names / sizeof names[0]) {
        return "unrecognized";
    }
    return names[outcome];
}

Idem__Outcome idem_response_outcome(const Idem__Response *resp)
{
    if (resp == NULL || resp->result == NULL) {
        return IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    }
    return resp->result->outcome;
}

int idem_attempt_id_new(char out[IDEM_ATTEMPT_ID_HEX + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[IDEM_ATTEMPT_ID_HEX / 2];
    if (RAND_bytes(raw, (int)sizeof raw) != 1) {
        out[0] = '\0';
        return IDEM_ESYS;
    }
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[IDEM_ATTEMPT_ID_HEX] = '\0';
    return IDEM_OK;
}

int idem_fingerprint(const void *data, size_t len, uint8_t out[IDEM_FINGERPRINT_LEN])
{
    if (out == NULL || (data == NULL && len != 0)) {
        return IDEM_EINVAL;
    }
    unsigned int n = 0;
    if (EVP_Digest(len ? data : "", len, out, &n, EVP_sha256(), NULL) != 1 ||
        n != IDEM_FINGERPRINT_LEN) {
        return IDEM_ESYS;
    }
    return IDEM_OK;
}

/* ---- messages ------------------------------------------------------------------------ */

void IdemWhyf(char *why, size_t why_len, const char *fmt, ...)
{
    if (why == NULL || why_len == 0) {
        return;
    }
    char tmp[IDEM_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap); /* tmp: fmt's arguments may point into why */
    va_end(ap);
    snprintf(why, why_len, "%s", tmp);
}

/* ---- frames -------------------------------------------------------------------------- */

uint32_t IdemMaxFrame(const struct idem_options *opts)
{
    uint32_t m = opts != NULL ? opts->max_frame_bytes : 0;
    if (m == 0 || m > IDEM_MAX_FRAME) {
        return IDEM_MAX_FRAME;
    }
    return m < 1024 ? 1024 : m;
}

bool IdemFrameTooLarge(const Idem__Response *m)
{
    return m != NULL && m->result != NULL &&
           m->result->outcome == IDEM__OUTCOME__OUTCOME_INVALID && m->result->detail != NULL &&
           strcmp(m->result->detail, IDEM_FRAME_TOO_LARGE) == 0;
}

void IdemFrameTooLargeWhy(char *why, size_t why_len, const char *addr, const uint8_t *hdr,
                          uint32_t len)
{
    if (hdr[0] == 'H' && hdr[1] == 'T' && hdr[2] == 'T' && hdr[3] == 'P') {
        IdemWhyf(why, why_len,
                 "%s answers HTTP, not the idemd binary RPC (an http_address? seeds are the "
                 "nodes' rpc_address)",
                 addr);
    } else {
        IdemWhyf(why, why_len, "%s: frame of %u bytes exceeds the limit of %u", addr, len,
                 IDEM_MAX_FRAME);
    }
}

enum idem_answer IdemResponseDecode(const uint8_t *p, size_t len, uint64_t expect, const char *addr,
                                    Idem__Response **out, char *why, size_t why_len)
{
    *out = NULL;
    Idem__Response *m = idem__response__unpack(NULL, len, p);
    if (m == NULL) {
        IdemWhyf(why, why_len, "%s: a %zu-byte response does not decode", addr, len);
        return IDEM_ANSWER_BAD;
    }
    if (m->request_id == 0) {
        *out = m;
        return IDEM_ANSWER_REFUSED;
    }
    if (expect != 0 && m->request_id != expect) {
        idem__response__free_unpacked(m, NULL);
        return IDEM_ANSWER_OTHER;
    }
    *out = m;
    return IDEM_ANSWER_MINE;
}

/* ---- time and randomness ------------------------------------------------------------- */

uint64_t IdemNowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t IdemRemainingMs(uint64_t deadline)
{
    uint64_t now = IdemNowMs();
    return now >= deadline ? 0 : deadline - now;
}

uint64_t IdemRngSeed(void)
{
    uint64_t x = 0;
    if (RAND_bytes((unsigned char *)&x, (int)sizeof x) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    return x == 0 ? 0x9e3779b97f4a7c15ull : x;
}

uint64_t IdemRngNext(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

uint64_t IdemBackoffNext(uint64_t *backoff, uint64_t *rng)
{
    uint64_t ms = *backoff - IdemRngNext(rng) % (*backoff / 4 + 1);
    *backoff *= 2;
    if (*backoff > IDEM_BACKOFF_MAX_MS) {
        *backoff = IDEM_BACKOFF_MAX_MS;
    }
    return ms;
}

/* Sleeps for about *backoff ms, or `at_least` ms when longer (never past the deadline),
 * and doubles *backoff. */
static void backoffSleepAtLeast(struct idem_client *c, uint64_t *backoff, uint64_t deadline,
                                uint64_t at_least)
{
    pthread_mutex_lock(&c->mu);
    uint64_t ms = IdemBackoffNext(backoff, &c->rng);
    pthread_mutex_unlock(&c->mu);
    if (ms < at_least) {
        ms = at_least;
    }
    uint64_t rem = IdemRemainingMs(deadline);
    if (ms > rem) {
        ms = rem;
    }
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Sleeps for about *backoff ms (never past the deadline) and doubles *backoff. */
static void backoffSleep(struct idem_client *c, uint64_t *backoff, uint64_t deadline)
{
    backoffSleepAtLeast(c, backoff, deadline, 0);
}

/* ---- the node table ------------------------------------------------------------------ */

/* The index of the node whose address is `addr`, adding it (as a learned node) if
 * needed. Returns IDEM_NODES_MAX when the address is malformed or the table is full (the
 * caller then ignores it) and sets *nomem on allocation failure. */
static size_t nodeFindOrAdd(struct idem_client *c, const char *addr, bool *nomem)
{
    size_t found = IDEM_NODES_MAX;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_nodes; i++) {
        if (strcmp(c->nodes[i].addr, addr) == 0) {
            found = i;
            break;
        }
    }
    if (found == IDEM_NODES_MAX && c->n_nodes < IDEM_NODES_MAX) {
        char why[128];
        int rv = IdemNodeInit(&c->nodes[c->n_nodes], addr, strlen(addr), why, sizeof why);
        if (rv == IDEM_OK) {
            found = c->n_nodes++;
        } else if (rv == IDEM_ENOMEM) {
            *nomem = true;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* ---- client lifecycle ---------------------------------------------------------------- */

int idem_client_open(const struct idem_options *opts, struct idem_client **out, char *why,
                     size_t why_len)
{
    IdemWhyf(why, why_len, "%s", "");
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    *out = NULL;
    if (opts == NULL) {
        IdemWhyf(why, why_len, "no options");
        return IDEM_EINVAL;
    }
    struct idem_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        IdemWhyf(why, why_len, "out of memory");
        return IDEM_ENOMEM;
    }
    SLIST_INIT(&c->free_conns);
    int mrv = pthread_mutex_init(&c->mu, NULL);
    if (mrv != 0) {
        free(c);
        char ebuf[128];
        IdemWhyf(why, why_len, "cannot initialise the client's mutex: %s",
                 IdemErrnoText(mrv, ebuf, sizeof ebuf));
        return IDEM_ESYS;
    }
    int rv = IdemSeedsParse(opts->seeds, c->nodes, &c->n_nodes, why, why_len);
    if (rv != IDEM_OK) {
        goto err;
    }
    c->n_seeds = c->n_nodes;
    if (opts->token != NULL && opts->token[0] != '\0') {
        c->token_len = strlen(opts->token);
        c->token = malloc(c->token_len);
        if (c->token == NULL) {
            IdemWhyf(why, why_len, "out of memory");
            rv = IDEM_ENOMEM;
            goto err;
        }
        memcpy(c->token, opts->token, c->token_len);
    }
    c->default_deadline_ms =
        opts->default_deadline_ms ? opts->default_deadline_ms : IDEM_DEFAULT_DEADLINE_MS;
    c->max_frame = IdemMaxFrame(opts);
    if (IdemTlsWanted(opts)) {
        rv = IdemTlsContext(opts, &c->tls, why, why_len);
        if (rv != IDEM_OK) {
            goto err;
        }
    }
    c->next_request_id = 1;
    c->rng = IdemRngSeed();
    *out = c;
    return IDEM_OK;

err:
    idem_client_close(c);
    return rv;
}

int idem_client_new(const char *seeds, const char *token, struct idem_client **out)
{
    struct idem_options o = {.seeds = seeds, .token = token};
    return idem_client_open(&o, out, NULL, 0);
}

void idem_client_close(struct idem_client *c)
{
    if (c == NULL) {
        return;
    }
    while (!SLIST_EMPTY(&c->free_conns)) {
        struct idem_conns *k = SLIST_FIRST(&c->free_conns);
        SLIST_REMOVE_HEAD(&c->free_conns, link);
        IdemConnsFree(k);
    }
    for (size_t i = 0; i < c->n_nodes; i++) {
        IdemNodeFree(&c->nodes[i]);
    }
    if (c->token != NULL) {
        /* The token is a credential: do not leave it in freed memory. */
        OPENSSL_cleanse(c->token, c->token_len);
    }
    free(c->token);
    IdemTlsCtxFree(c->tls);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *idem_client_errmsg(const struct idem_client *cc)
{
    /* Calls on other threads write c->errmsg (under the mutex): hand out a copy taken
     * under it, in a buffer of the calling thread's own. */
    static _Thread_local char copy[IDEM_ERRMSG_LEN];
    if (cc == NULL) {
        return "";
    }
    struct idem_client *c = (struct idem_client *)cc; /* the mutex is not state */
    pthread_mutex_lock(&c->mu);
    memcpy(copy, c->errmsg, sizeof copy);
    pthread_mutex_unlock(&c->mu);
    return copy;
}

const char *idem_client_leader(const struct idem_client *cc)
{
    if (cc == NULL) {
        return NULL;
    }
    struct idem_client *c = (struct idem_client *)cc; /* the mutex is not state */
    pthread_mutex_lock(&c->mu);
    const char *addr = c->answered ? c->nodes[c->current].addr : NULL;
    pthread_mutex_unlock(&c->mu);
    return addr;
}

uint32_t IdemClientDefaultDeadline(const struct idem_client *c)
{
    return c->default_deadline_ms;
}

/* ---- calls --------------------------------------------------------------------------- */

static int checkArgs(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                     Idem__Response **resp, char *err, size_t err_len)
{
    if (resp != NULL) {
        *resp = NULL;
    }
    if (c == NULL || req == NULL || resp == NULL) {
        IdemWhyf(err, err_len, "NULL argument");
        return IDEM_EINVAL;
    }
    if (deadline_ms == 0) {
        IdemWhyf(err, err_len, "deadline must be > 0 ms");
        return IDEM_EINVAL;
    }
    if (req->op_case == IDEM__REQUEST__OP__NOT_SET) {
        IdemWhyf(err, err_len, "request has no operation");
        return IDEM_EINVAL;
    }
    return IDEM_OK;
}

/* The deadline of one attempt (connect, TLS handshake, write, read) on one node: a share
 * of what is left, so that a node that accepts but never answers costs only part of the
 * call: min(remaining, max(remaining / 3, IDEM_ATTEMPT_MIN_MS)). */
static uint64_t attemptDeadline(uint64_t deadline)
{
    uint64_t now = IdemNowMs();
    uint64_t rem = deadline > now ? deadline - now : 0;
    uint64_t share = rem / 3 > IDEM_ATTEMPT_MIN_MS ? rem / 3 : IDEM_ATTEMPT_MIN_MS;
    return now + (share < rem ? share : rem);
}

/* The last word of each node (what was last said of it), in the order first noted. */
void IdemWordsNote(struct idem_words *w, size_t node, const char *said)
{
    size_t i = 0;
    while (i < w->n && w->node[i] != node) {
        i++;
    }
    if (i == w->n) {
        if (w->n == IDEM_WORDS_MAX) {
            return;
        }
        w->node[w->n++] = node;
    }
    snprintf(w->said[i], sizeof w->said[i], "%s", said);
}

void IdemWordsJoin(const struct idem_words *w, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < w->n && used + 1 < len; i++) {
        int m = snprintf(out + used, len - used, "%s%s", i ? "; " : "", w->said[i]);
        if (m < 0) {
            break;
        }
        used += (size_t)m;
    }
}

/* One call's way through the nodes (clientCall). */
struct callPath {
    size_t cand;      /* the node to try next */
    size_t next_seed; /* the seed after it in rotation */
    size_t n_seeds;
    uint64_t backoff;
    unsigned redirects;
    char last[IDEM_ERRMSG_LEN]; /* the last failure (a copy of k->errmsg) */
    struct idem_words words;    /* and each node's */
};

/* Moves the call on to the next seed in rotation. */
static void pathNextSeed(struct callPath *p)
{
    p->cand = p->next_seed;
    p->next_seed = (p->next_seed + 1) % p->n_seeds;
}

/* Notes the call's last failure (k->errmsg) as node's last word. */
static void pathNote(struct callPath *p, size_t node, const struct idem_conns *k)
{
    memcpy(p->last, k->errmsg, sizeof p->last);
    IdemWordsNote(&p->words, node, p->last);
}

/* What clientCall does after one answer (judgeAnswer). */
enum verdict {
    V_ANSWER, /* a leader's answer: the call returns it */
    V_RETURN, /* the call ends with *rv (IDEM_ETOOBIG, IDEM_ENOMEM) */
    V_FOLLOW, /* redirected: p->cand is now the leader named */
    V_BUSY,   /* refused for load: the same node again after *busy ms at least */
    V_NEXT,   /* unavailable, leaderless, or a refused frame: the next seed after a backoff */
};

/* Judges the answer `m` of node p->cand (taken: freed unless V_ANSWER, when it is the
 * call's and the node becomes the client's current one), saying why in k->errmsg. */
static enum verdict judgeAnswer(struct idem_client *c, struct idem_conns *k, struct callPath *p,
                                Idem__Response *m, uint64_t *busy, int *rv)
{
    const char *addr = c->nodes[p->cand].addr;
    Idem__Outcome outcome = idem_response_outcome(m);
    enum verdict v = V_NEXT;
    const char *detail = m->error != NULL ? m->error : "";
    if (m->request_id == 0) {
        /* The node could not read our request frame (idem.proto, above `message Request`):
         * it applied nothing and closes the connection (IdemRoundTrip closed ours). As a
         * broken connection: the same request again, to the next seed. */
        connErrf(k, "%s: refused a request frame: %.200s", addr, detail);
    } else if (IdemFrameTooLarge(m)) {
        connErrf(k, "%s: the request is larger than the node's max_frame_bytes", addr);
        *rv = IDEM_ETOOBIG;
        v = V_RETURN;
    } else if (outcome != IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
               outcome != IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
        pthread_mutex_lock(&c->mu);
        c->current = p->cand;
        c->answered = true;
        pthread_mutex_unlock(&c->mu);
        k->errmsg[0] = '\0';
        return V_ANSWER;
    } else if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER && m->leader_rpc_address != NULL &&
               m->leader_rpc_address[0] != '\0' && strcmp(m->leader_rpc_address, addr) != 0) {
        bool nomem = false;
        size_t to = nodeFindOrAdd(c, m->leader_rpc_address, &nomem);
        if (nomem) {
            *rv = IDEM_ENOMEM;
            v = V_RETURN;
        } else if (to < IDEM_NODES_MAX) {
            connErrf(k, "%s: not the leader; redirected to %s", addr, c->nodes[to].addr);
            p->cand = to;
            v = V_FOLLOW;
        } else {
            connErrf(k, "%s: not the leader; unusable leader address", addr);
        }
    } else if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER) {
        connErrf(k, "%s: not the leader, and no leader known%s%s", addr, detail[0] ? ": " : "",
                 detail);
    } else {
        connErrf(k, "%s: unavailable%s%s", addr, detail[0] ? ": " : "", detail);
        *busy = m->result != NULL ? m->result->retry_after_ms : 0;
        v = *busy > 0 ? V_BUSY : V_NEXT;
    }
    idem__response__free_unpacked(m, NULL);
    return v;
}

/* The node `node` accepted but did not answer within its attempt (stopped, frozen,
 * blackholed): the client stops starting calls on it, and this call moves to the next seed
 * with the same request id. */
static void pathLeave(struct idem_client *c, struct callPath *p, size_t node)
{
    pthread_mutex_lock(&c->mu);
    if (c->current == node) {
        c->current = p->next_seed;
        c->answered = false;
    }
    pthread_mutex_unlock(&c->mu);
    pathNextSeed(p);
}

/* The leader-following loop; `k` is this call's connection set. */
static int clientCall(struct idem_client *c, struct idem_conns *k, const Idem__Request *req,
                      uint32_t deadline_ms, Idem__Response **resp)
{
    uint64_t deadline = IdemNowMs() + deadline_ms;
    struct callPath p = {.backoff = IDEM_BACKOFF_MIN_MS};
    pthread_mutex_lock(&c->mu);
    uint64_t id = c->next_request_id++;
    p.cand = c->current < c->n_nodes ? c->current : 0;
    p.n_seeds = c->n_seeds;
    pthread_mutex_unlock(&c->mu);
    p.next_seed = p.cand < p.n_seeds ? (p.cand + 1) % p.n_seeds : 0;

    while (IdemRemainingMs(deadline) > 0) {
        size_t frame_len;
        int rv = IdemFrameBuild(c, k, req, id, deadline, &frame_len);
        if (rv != IDEM_OK) {
            return rv;
        }
        size_t tried = p.cand; /* p.cand moves on a redirect */
        Idem__Response *m = NULL;
        enum rt_result r = IdemRoundTrip(c, k, tried, frame_len, id, attemptDeadline(deadline), &m);
        if (r == RT_NOMEM) {
            return IDEM_ENOMEM;
        }
        if (r == RT_TIMEOUT && IdemRemainingMs(deadline) == 0) {
            /* The call's deadline cut this attempt short: an earlier attempt's failure
             * (refused, certificate, unavailable) says more about why nothing answered. */
            if (p.last[0] == '\0') {
                pathNote(&p, tried, k);
            }
            break;
        }
        if (r == RT_TIMEOUT) {
            /* The connection (our request still outstanding on it) is closed. */
            pathNote(&p, tried, k);
            pathLeave(c, &p, tried);
            continue;
        }
        uint64_t busy = 0; /* a leader's retry_after_ms for a refusal for load */
        enum verdict v = r == RT_OK ? judgeAnswer(c, k, &p, m, &busy, &rv) : V_NEXT;
        if (v == V_ANSWER) {
            *resp = m;
            return IDEM_OK;
        }
        if (v == V_RETURN) {
            return rv;
        }
        pathNote(&p, tried, k);
        if (v == V_FOLLOW) {
            if (p.redirects++ >= IDEM_REDIRECTS_FREE) {
                backoffSleep(c, &p.backoff, deadline);
            }
        } else if (v == V_BUSY) {
            /* The node leads and refused the request for load (its pending budget, or the
             * tenant's share of it) or while it hands its leadership on: the same request
             * to the same node, on the same connection, after its retry_after_ms at least
             * (the backoff, growing as after a failure, when longer). Another node would
             * only send it back (after a transfer, this one redirects). */
            backoffSleepAtLeast(c, &p.backoff, deadline, busy);
        } else {
            /* Connection failure, bad frame, unavailable or leaderless: next seed. */
            backoffSleep(c, &p.backoff, deadline);
            pathNextSeed(&p);
        }
    }
    char said[IDEM_ERRMSG_LEN];
    IdemWordsJoin(&p.words, said, sizeof said);
    connErrf(k, "no leader answered within %u ms (%s%s)", deadline_ms,
             p.words.n > 1 ? "each node's last answer: " : "last: ",
             said[0] ? said : "deadline passed before a node was tried");
    return IDEM_EUNAVAILABLE;
}

int IdemClientCall(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                   Idem__Response **resp, char *err, size_t err_len)
{
    int rv = checkArgs(c, req, deadline_ms, resp, err, err_len);
    if (rv != IDEM_OK) {
        if (c != NULL) {
            pthread_mutex_lock(&c->mu);
            IdemWhyf(c->errmsg, sizeof c->errmsg, "%s", err != NULL ? err : "invalid argument");
            pthread_mutex_unlock(&c->mu);
        }
        return rv;
    }
    struct idem_conns *k = IdemConnsGet(c);
    if (k == NULL) {
        IdemWhyf(err, err_len, "out of memory");
        return IDEM_ENOMEM;
    }
    rv = clientCall(c, k, req, deadline_ms, resp);
    IdemWhyf(err, err_len, "%s", k->errmsg);
    IdemConnsPut(c, k);
    return rv;
}

int idem_call(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
              Idem__Response **resp)
{
    char err[IDEM_ERRMSG_LEN];
    return IdemClientCall(c, req, deadline_ms, resp, err, sizeof err);
}

int idem_call_why(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                  Idem__Response **resp, char *err, size_t errlen)
{
    return IdemClientCall(c, req, deadline_ms, resp, err, errlen);
}

int idem_call_node(struct idem_client *c, const char *addr, const Idem__Request *req,
                   uint32_t deadline_ms, Idem__Response **resp)
{
    char err[IDEM_ERRMSG_LEN];
    int rv = checkArgs(c, req, deadline_ms, resp, err, sizeof err);
    if (rv == IDEM_OK && addr == NULL) {
        rv = IDEM_EINVAL;
        IdemWhyf(err, sizeof err, "no node address");
    }
    char why[128];
    if (rv == IDEM_OK && IdemAddrSplit(addr, strlen(addr), NULL, NULL, why, sizeof why) != IDEM_OK) {
        rv = IDEM_EINVAL;
        IdemWhyf(err, sizeof err, "bad node address %s", why);
    }
    if (rv != IDEM_OK) {
        if (c != NULL) {
            pthread_mutex_lock(&c->mu);
            IdemWhyf(c->errmsg, sizeof c->errmsg, "%s", err);
            pthread_mutex_unlock(&c->mu);
        }
        return rv;
    }
    uint64_t deadline = IdemNowMs() + deadline_ms;
    bool nomem = false;
    size_t i = nodeFindOrAdd(c, addr, &nomem);
    if (nomem) {
        return IDEM_ENOMEM;
    }
    struct idem_conns *k = IdemConnsGet(c);
    if (k == NULL) {
        return IDEM_ENOMEM;
    }
    if (i == IDEM_NODES_MAX) {
        connErrf(k, "%s: too many nodes on one client", addr);
        IdemConnsPut(c, k);
        return IDEM_EINVAL;
    }
    pthread_mutex_lock(&c->mu);
    uint64_t id = c->next_request_id++;
    pthread_mutex_unlock(&c->mu);
    size_t frame_len;
    rv = IdemFrameBuild(c, k, req, id, deadline, &frame_len);
    if (rv == IDEM_OK) {
        switch (IdemRoundTrip(c, k, i, frame_len, id, deadline, resp)) {
        case RT_OK:
            k->errmsg[0] = '\0';
            rv = IDEM_OK;
            break;
        case RT_PROTO:
            rv = IDEM_EPROTO;
            break;
        case RT_NOMEM:
            rv = IDEM_ENOMEM;
            break;
        case RT_CONN:
        case RT_TIMEOUT:
        default:
            rv = IDEM_EUNAVAILABLE;
            break;
        }
    }
    IdemConnsPut(c, k);
    return rv;
}
