/* idem.c: libidem's synchronous transport (see include/idem.h and include/idem_rpc.h):
 * the client object, its pool of connection sets, one round trip over TCP or TLS, and the
 * leader-following retry loop that every synchronous call goes through.
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
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

/* One connection per node, owned by one call at a time. */
struct idem_conns {
    int fd[IDEM_NODES_MAX];    /* -1 when not connected */
    SSL *ssl[IDEM_NODES_MAX];  /* with TLS: the session on fd; else NULL */
    uint8_t *wbuf;             /* outgoing frame; owned */
    size_t wbuf_cap;
    uint8_t *rbuf;             /* incoming frame; owned */
    size_t rbuf_cap;
    char errmsg[IDEM_ERRMSG_LEN]; /* this call's last failure */
    struct idem_conns *next;   /* in the pool's free list */
};

struct idem_client {
    pthread_mutex_t mu;
    struct idem_node nodes[IDEM_NODES_MAX]; /* seeds first, then learned leaders */
    size_t n_nodes;
    size_t n_seeds;  /* >= 1 */
    size_t current;  /* the node to try first: the last one that answered */
    bool answered;   /* whether `current` was set by an answer (idem_client_leader) */
    uint8_t *token;  /* owned; NULL when token_len == 0 */
    size_t token_len;
    uint32_t default_deadline_ms;
    uint32_t max_frame;    /* the largest request body sent */
    SSL_CTX *tls;          /* NULL: plain TCP */
    char *tls_server_name; /* owned; NULL: each node's host */
    uint64_t next_request_id;
    uint64_t rng; /* xorshift64 state for backoff jitter; never 0 */
    struct idem_conns *free_conns;
    char errmsg[IDEM_ERRMSG_LEN];
};

/* What one round trip to one node came to. */
enum rt_result {
    RT_OK,      /* *resp holds the response to our request */
    RT_CONN,    /* the connection failed (connect, TLS, write, read, EOF); it is closed */
    RT_TIMEOUT, /* the deadline passed; the connection is closed */
    RT_PROTO,   /* the node sent bytes that are not a valid frame; the connection is closed */
    RT_NOMEM,
};

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

#define connErrf(k, ...) IdemWhyf((k)->errmsg, sizeof (k)->errmsg, __VA_ARGS__)

/* strerror() is not thread-safe; this uses the XSI strerror_r into the caller's buffer. */
static const char *errnoText(int err, char *buf, size_t len)
{
    if (strerror_r(err, buf, len) != 0) {
        snprintf(buf, len, "error %d", err);
    }
    return buf;
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

static int pollTimeout(uint64_t deadline)
{
    uint64_t rem = IdemRemainingMs(deadline);
    return rem > 60000 ? 60000 : (int)rem;
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

/* ---- connection sets ----------------------------------------------------------------- */

static struct idem_conns *connsGet(struct idem_client *c)
{
    pthread_mutex_lock(&c->mu);
    struct idem_conns *k = c->free_conns;
    if (k != NULL) {
        c->free_conns = k->next;
    }
    pthread_mutex_unlock(&c->mu);
    if (k == NULL) {
        k = calloc(1, sizeof *k);
        if (k == NULL) {
            return NULL;
        }
        for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
            k->fd[i] = -1;
        }
    }
    k->next = NULL;
    k->errmsg[0] = '\0';
    return k;
}

/* Puts `k` back and publishes its last message as the client's. */
static void connsPut(struct idem_client *c, struct idem_conns *k)
{
    pthread_mutex_lock(&c->mu);
    memcpy(c->errmsg, k->errmsg, sizeof c->errmsg);
    k->next = c->free_conns;
    c->free_conns = k;
    pthread_mutex_unlock(&c->mu);
}

static void connClose(struct idem_conns *k, size_t i)
{
    if (k->ssl[i] != NULL) {
        /* No close_notify: the peer may be gone, and the call must not block on it. */
        SSL_free(k->ssl[i]);
        k->ssl[i] = NULL;
    }
    if (k->fd[i] >= 0) {
        close(k->fd[i]);
        k->fd[i] = -1;
    }
}

static void connsFree(struct idem_conns *k)
{
    for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
        connClose(k, i);
    }
    if (k->wbuf != NULL) {
        OPENSSL_cleanse(k->wbuf, k->wbuf_cap); /* the last frame carried the token */
    }
    free(k->wbuf);
    free(k->rbuf);
    free(k);
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
    int mrv = pthread_mutex_init(&c->mu, NULL);
    if (mrv != 0) {
        free(c);
        char ebuf[128];
        IdemWhyf(why, why_len, "cannot initialise the client's mutex: %s",
                 errnoText(mrv, ebuf, sizeof ebuf));
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
        if (opts->tls_server_name != NULL && opts->tls_server_name[0] != '\0') {
            c->tls_server_name = strdup(opts->tls_server_name);
            if (c->tls_server_name == NULL) {
                IdemWhyf(why, why_len, "out of memory");
                rv = IDEM_ENOMEM;
                goto err;
            }
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
    while (c->free_conns != NULL) {
        struct idem_conns *k = c->free_conns;
        c->free_conns = k->next;
        connsFree(k);
    }
    for (size_t i = 0; i < c->n_nodes; i++) {
        IdemNodeFree(&c->nodes[i]);
    }
    if (c->token != NULL) {
        /* The token is a credential: do not leave it in freed memory. */
        OPENSSL_cleanse(c->token, c->token_len);
    }
    free(c->token);
    SSL_CTX_free(c->tls);
    free(c->tls_server_name);
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

/* ---- one connection ------------------------------------------------------------------ */

/* Waits until fd is ready for `events` or the deadline passes. 1 ready, 0 timed out, -1
 * error (errno). */
static int waitFd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int pr = poll(&pfd, 1, pollTimeout(deadline));
        if ((pr < 0 && errno == EINTR) || pr == 0) {
            /* Interrupted, or a wait of pollTimeout's most (60 s) over with the deadline
             * still ahead: wait again. */
            if (IdemRemainingMs(deadline) == 0) {
                return 0;
            }
            continue;
        }
        return pr > 0 ? 1 : pr;
    }
}

/* SIGPIPE around OpenSSL's socket I/O. OpenSSL's socket BIO writes with write(2), and a
 * write to a connection whose reset came back (a node that closed it) raises SIGPIPE, which
 * kills a program that does not ignore it; the plain path sends with MSG_NOSIGNAL instead.
 * So around each TLS call SIGPIPE is blocked in this thread, and one that the call raised
 * (it is sent to the writing thread) is taken back before the old mask returns, unless one
 * was already pending before (as libpq does). */
struct pipeGuard {
    sigset_t old;
    bool blocked;
    bool pending_before;
};

static bool pipePending(void)
{
    sigset_t pending;
    return sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

static void pipeBlock(struct pipeGuard *g)
{
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    g->pending_before = pipePending();
    g->blocked = pthread_sigmask(SIG_BLOCK, &pipe, &g->old) == 0;
}

static void pipeRestore(struct pipeGuard *g)
{
    if (!g->blocked) {
        return;
    }
    int saved = errno;
    if (!g->pending_before && pipePending()) {
        sigset_t pipe;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    errno = saved;
}

/* Runs the TLS handshake on node i's fresh socket within the deadline. */
static enum rt_result tlsHandshake(struct idem_client *c, struct idem_conns *k, size_t i,
                                   uint64_t deadline)
{
    const struct idem_node *n = &c->nodes[i];
    char ebuf[256];
    SSL *ssl = SSL_new(c->tls);
    if (ssl == NULL || SSL_set_fd(ssl, k->fd[i]) != 1 ||
        !IdemTlsSetPeer(ssl, c->tls_server_name ? c->tls_server_name : n->host)) {
        connErrf(k, "%s: tls setup: %s", n->addr, IdemTlsError(ebuf, sizeof ebuf));
        SSL_free(ssl);
        return RT_NOMEM;
    }
    k->ssl[i] = ssl;
    for (;;) {
        ERR_clear_error();
        struct pipeGuard g;
        pipeBlock(&g);
        int r = SSL_connect(ssl);
        pipeRestore(&g);
        if (r == 1) {
            return RT_OK;
        }
        int e = SSL_get_error(ssl, r);
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (ev == 0) {
            long vr = SSL_get_verify_result(ssl);
            if (vr != X509_V_OK) {
                connErrf(k, "%s: tls: certificate verification failed: %s", n->addr,
                         X509_verify_cert_error_string(vr));
            } else {
                connErrf(k, "%s: tls handshake: %s", n->addr, IdemTlsError(ebuf, sizeof ebuf));
            }
            return RT_CONN;
        }
        int w = waitFd(k->fd[i], ev, deadline);
        if (w == 0) {
            connErrf(k, "%s: tls handshake: timed out", n->addr);
            return RT_TIMEOUT;
        }
        if (w < 0) {
            connErrf(k, "%s: poll: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
    }
}

/* Connects node i within the deadline, trying every address the name resolves to; the
 * socket stays non-blocking, and every wait on it is a poll() bounded by the deadline. */
static enum rt_result nodeConnect(struct idem_client *c, struct idem_conns *k, size_t i,
                                  uint64_t deadline)
{
    const struct idem_node *n = &c->nodes[i];
    char ebuf[128];
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(n->host, n->port, &hints, &res);
    if (gai != 0) {
        connErrf(k, "%s: resolve: %s", n->addr, gai_strerror(gai));
        return RT_CONN;
    }
    enum rt_result result = RT_CONN;
    connErrf(k, "%s: connect: no address", n->addr);
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);
        if (fd < 0) {
            connErrf(k, "%s: socket: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            continue;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                int w = waitFd(fd, POLLOUT, deadline);
                if (w == 0) {
                    connErrf(k, "%s: connect: timed out", n->addr);
                    close(fd);
                    result = RT_TIMEOUT;
                    break;
                }
                socklen_t elen = sizeof err;
                if (w < 0) {
                    err = errno;
                } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                    err = errno;
                }
            }
        }
        if (err != 0) {
            connErrf(k, "%s: connect: %s", n->addr, errnoText(err, ebuf, sizeof ebuf));
            close(fd);
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        k->fd[i] = fd;
        result = RT_OK;
        break;
    }
    freeaddrinfo(res);
    if (result == RT_OK && c->tls != NULL) {
        result = tlsHandshake(c, k, i, deadline);
        if (result != RT_OK) {
            connClose(k, i);
        }
    }
    return result;
}

/* Writes all `len` bytes within the deadline. */
static enum rt_result nodeWrite(struct idem_client *c, struct idem_conns *k, size_t i,
                                const uint8_t *buf, size_t len, uint64_t deadline)
{
    const char *addr = c->nodes[i].addr;
    char ebuf[256];
    size_t done = 0;
    while (done < len) {
        short want = POLLOUT;
        if (k->ssl[i] != NULL) {
            ERR_clear_error();
            size_t w = 0;
            struct pipeGuard g;
            pipeBlock(&g);
            int r = SSL_write_ex(k->ssl[i], buf + done, len - done, &w);
            pipeRestore(&g);
            if (r == 1) {
                done += w;
                continue;
            }
            int e = SSL_get_error(k->ssl[i], r);
            if (e == SSL_ERROR_WANT_READ) {
                want = POLLIN;
            } else if (e != SSL_ERROR_WANT_WRITE) {
                connErrf(k, "%s: tls write: %s", addr, IdemTlsError(ebuf, sizeof ebuf));
                return RT_CONN;
            }
        } else {
            ssize_t w = send(k->fd[i], buf + done, len - done, MSG_NOSIGNAL);
            if (w >= 0) {
                done += (size_t)w;
                continue;
            }
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                connErrf(k, "%s: write: %s", addr, errnoText(errno, ebuf, sizeof ebuf));
                return RT_CONN;
            }
        }
        int pr = waitFd(k->fd[i], want, deadline);
        if (pr == 0) {
            connErrf(k, "%s: write: timed out", addr);
            return RT_TIMEOUT;
        }
        if (pr < 0) {
            connErrf(k, "%s: poll: %s", addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
    }
    return RT_OK;
}

/* Reads exactly `len` bytes within the deadline. *got counts bytes read, so that the
 * caller can tell "closed before answering" from "closed mid-frame". */
static enum rt_result nodeRead(struct idem_client *c, struct idem_conns *k, size_t i,
                               uint8_t *buf, size_t len, uint64_t deadline, size_t *got)
{
    const char *addr = c->nodes[i].addr;
    char ebuf[256];
    size_t done = 0;
    while (done < len) {
        short want = POLLIN;
        size_t r = 0;
        if (k->ssl[i] != NULL) {
            ERR_clear_error();
            struct pipeGuard g; /* a read may write too (TLS 1.3 key updates) */
            pipeBlock(&g);
            int ok = SSL_read_ex(k->ssl[i], buf + done, len - done, &r);
            pipeRestore(&g);
            if (ok != 1) {
                int e = SSL_get_error(k->ssl[i], ok);
                if (e == SSL_ERROR_ZERO_RETURN) {
                    connErrf(k, "%s: connection closed by the node", addr);
                    return RT_CONN;
                }
                if (e == SSL_ERROR_WANT_WRITE) {
                    want = POLLOUT;
                } else if (e != SSL_ERROR_WANT_READ) {
                    connErrf(k, "%s: tls read: %s", addr, IdemTlsError(ebuf, sizeof ebuf));
                    return RT_CONN;
                }
                r = 0;
            }
        } else {
            ssize_t n = recv(k->fd[i], buf + done, len - done, 0);
            if (n == 0) {
                connErrf(k, "%s: connection closed by the node", addr);
                return RT_CONN;
            }
            if (n < 0) {
                if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                    connErrf(k, "%s: read: %s", addr, errnoText(errno, ebuf, sizeof ebuf));
                    return RT_CONN;
                }
                n = 0;
            }
            r = (size_t)n;
        }
        if (r > 0) {
            done += r;
            *got += r;
            continue;
        }
        int pr = waitFd(k->fd[i], want, deadline);
        if (pr == 0) {
            connErrf(k, "%s: no answer before the deadline", addr);
            return RT_TIMEOUT;
        }
        if (pr < 0) {
            connErrf(k, "%s: poll: %s", addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
    }
    return RT_OK;
}

static bool bufReserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) {
        return true;
    }
    size_t n = *cap < 4096 ? 4096 : *cap;
    while (n < need) {
        n *= 2;
    }
    /* Not realloc: the old block may hold a frame with the bearer token, wiped before it
     * is freed. */
    uint8_t *p = malloc(n);
    if (p == NULL) {
        return false;
    }
    if (*buf != NULL) {
        memcpy(p, *buf, *cap);
        OPENSSL_cleanse(*buf, *cap);
        free(*buf);
    }
    *buf = p;
    *cap = n;
    return true;
}

/* Reads frames until the Response to `id` arrives; skips answers to earlier requests
 * that a previous call gave up on. */
static enum rt_result nodeAwait(struct idem_client *c, struct idem_conns *k, size_t i,
                                uint64_t id, uint64_t deadline, Idem__Response **resp,
                                size_t *got)
{
    const char *addr = c->nodes[i].addr;
    for (;;) {
        uint8_t hdr[4];
        enum rt_result r = nodeRead(c, k, i, hdr, sizeof hdr, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
                       (uint32_t)hdr[2] << 8 | (uint32_t)hdr[3];
        if (len > IDEM_MAX_FRAME) {
            if (IdemLooksHttp(hdr)) {
                connErrf(k,
                         "%s answers HTTP, not the idemd binary RPC (an http_address? "
                         "seeds are the nodes' rpc_address)",
                         addr);
            } else {
                connErrf(k, "%s: frame of %u bytes exceeds the limit of %u", addr, len,
                         IDEM_MAX_FRAME);
            }
            return RT_PROTO;
        }
        if (!bufReserve(&k->rbuf, &k->rbuf_cap, len)) {
            connErrf(k, "%s: out of memory reading a %u-byte frame", addr, len);
            return RT_NOMEM;
        }
        r = nodeRead(c, k, i, k->rbuf, len, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        Idem__Response *m = idem__response__unpack(NULL, len, k->rbuf);
        if (m == NULL) {
            connErrf(k, "%s: a %u-byte response does not decode", addr, len);
            return RT_PROTO;
        }
        /* request_id 0: the node could not read our request (idem.proto, above
         * `message Request`); we have only one request outstanding, so it is ours. */
        if (m->request_id == id || m->request_id == 0) {
            *resp = m;
            return RT_OK;
        }
        idem__response__free_unpacked(m, NULL);
    }
}

/* Packs `req` into k->wbuf as one frame, with our request id, the time left and the
 * client's token. Returns IDEM_OK, IDEM_ETOOBIG or IDEM_ENOMEM; *len (OUT) is the frame
 * length including the 4-byte prefix. */
static int frameBuild(struct idem_client *c, struct idem_conns *k, const Idem__Request *req,
                      uint64_t id, uint64_t deadline, size_t *len)
{
    Idem__Request r = *req; /* shallow: borrows every field of req */
    r.request_id = id;
    uint64_t rem = IdemRemainingMs(deadline);
    r.deadline_ms = rem == 0 ? 1 : (rem > UINT32_MAX ? UINT32_MAX : (uint32_t)rem);
    if (r.auth_token.len == 0 && c->token_len > 0) {
        r.auth_token.data = c->token;
        r.auth_token.len = c->token_len;
    }
    size_t body = idem__request__get_packed_size(&r);
    if (body > c->max_frame) {
        connErrf(k, "request of %zu bytes exceeds the limit of %u", body, c->max_frame);
        return IDEM_ETOOBIG;
    }
    if (!bufReserve(&k->wbuf, &k->wbuf_cap, body + 4)) {
        connErrf(k, "out of memory packing a %zu-byte request", body);
        return IDEM_ENOMEM;
    }
    k->wbuf[0] = (uint8_t)(body >> 24);
    k->wbuf[1] = (uint8_t)(body >> 16);
    k->wbuf[2] = (uint8_t)(body >> 8);
    k->wbuf[3] = (uint8_t)body;
    idem__request__pack(&r, k->wbuf + 4);
    *len = body + 4;
    return IDEM_OK;
}

/* One request, one answer, on node i. The frame must already be in k->wbuf. A
 * kept-alive connection that turns out to be closed before a byte of the answer arrived
 * is reopened once. On anything but RT_OK the connection is closed. */
static enum rt_result nodeRoundTrip(struct idem_client *c, struct idem_conns *k, size_t i,
                                    size_t frame_len, uint64_t id, uint64_t deadline,
                                    Idem__Response **resp)
{
    for (int attempt = 0;; attempt++) {
        bool reused = k->fd[i] >= 0;
        if (!reused) {
            enum rt_result r = nodeConnect(c, k, i, deadline);
            if (r != RT_OK) {
                return r;
            }
        }
        size_t got = 0;
        enum rt_result r = nodeWrite(c, k, i, k->wbuf, frame_len, deadline);
        if (r == RT_OK) {
            r = nodeAwait(c, k, i, id, deadline, resp, &got);
        }
        if (r == RT_OK) {
            if ((*resp)->request_id == 0) {
                connClose(k, i); /* the node closes it too after an unreadable request */
            }
            return RT_OK;
        }
        connClose(k, i);
        if (r == RT_CONN && reused && got == 0 && attempt == 0 &&
            IdemRemainingMs(deadline) > 0) {
            continue;
        }
        return r;
    }
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

/* The leader-following loop; `k` is this call's connection set. */
static int clientCall(struct idem_client *c, struct idem_conns *k, const Idem__Request *req,
                      uint32_t deadline_ms, Idem__Response **resp)
{
    uint64_t deadline = IdemNowMs() + deadline_ms;
    pthread_mutex_lock(&c->mu);
    uint64_t id = c->next_request_id++;
    size_t cand = c->current < c->n_nodes ? c->current : 0;
    size_t n_seeds = c->n_seeds;
    pthread_mutex_unlock(&c->mu);
    size_t next_seed = cand < n_seeds ? (cand + 1) % n_seeds : 0;
    uint64_t backoff = IDEM_BACKOFF_MIN_MS;
    unsigned redirects = 0;
    char last[IDEM_ERRMSG_LEN] = "";
    struct idem_words words = {.n = 0};

    while (IdemRemainingMs(deadline) > 0) {
        size_t frame_len;
        int rv = frameBuild(c, k, req, id, deadline, &frame_len);
        if (rv != IDEM_OK) {
            return rv;
        }
        const char *addr = c->nodes[cand].addr;
        size_t cand_tried = cand; /* cand moves on a redirect */
        Idem__Response *m = NULL;
        uint64_t attempt_deadline = attemptDeadline(deadline);
        enum rt_result r = nodeRoundTrip(c, k, cand, frame_len, id, attempt_deadline, &m);
        if (r == RT_NOMEM) {
            return IDEM_ENOMEM;
        }
        if (r == RT_TIMEOUT) {
            if (IdemRemainingMs(deadline) == 0) {
                /* The call's deadline cut this attempt short: an earlier attempt's
                 * failure (refused, certificate, unavailable) says more about why
                 * nothing answered. */
                if (last[0] == '\0') {
                    memcpy(last, k->errmsg, sizeof last);
                    IdemWordsNote(&words, cand, last);
                }
                break;
            }
            /* The node accepted but did not answer in time (stopped, frozen, blackholed):
             * the connection is closed; try the next seed with the same request id, and
             * stop starting calls on this node. */
            memcpy(last, k->errmsg, sizeof last);
            IdemWordsNote(&words, cand, last);
            pthread_mutex_lock(&c->mu);
            if (c->current == cand) {
                c->current = next_seed;
                c->answered = false;
            }
            pthread_mutex_unlock(&c->mu);
            cand = next_seed;
            next_seed = (next_seed + 1) % n_seeds;
            continue;
        }
        bool follow = false;
        uint64_t busy = 0; /* a leader's retry_after_ms for a refusal for load */
        if (r == RT_OK && m->request_id == 0) {
            /* The node could not read our request frame (idem.proto, above `message
             * Request`): it applied nothing and closes the connection (nodeRoundTrip closed
             * ours). As a broken connection: the same request again, to the next seed. */
            connErrf(k, "%s: refused a request frame: %.200s", addr,
                     m->error != NULL ? m->error : "");
            idem__response__free_unpacked(m, NULL);
            r = RT_PROTO;
        }
        if (r == RT_OK && IdemFrameTooLarge(m)) {
            connErrf(k, "%s: the request is larger than the node's max_frame_bytes", addr);
            idem__response__free_unpacked(m, NULL);
            return IDEM_ETOOBIG;
        }
        if (r == RT_OK) {
            Idem__Outcome outcome = idem_response_outcome(m);
            if (outcome != IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
                outcome != IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
                pthread_mutex_lock(&c->mu);
                c->current = cand;
                c->answered = true;
                pthread_mutex_unlock(&c->mu);
                k->errmsg[0] = '\0';
                *resp = m;
                return IDEM_OK;
            }
            const char *detail = m->error != NULL ? m->error : "";
            if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER && m->leader_rpc_address != NULL &&
                m->leader_rpc_address[0] != '\0' && strcmp(m->leader_rpc_address, addr) != 0) {
                bool nomem = false;
                size_t to = nodeFindOrAdd(c, m->leader_rpc_address, &nomem);
                if (nomem) {
                    idem__response__free_unpacked(m, NULL);
                    return IDEM_ENOMEM;
                }
                if (to < IDEM_NODES_MAX) {
                    connErrf(k, "%s: not the leader; redirected to %s", addr,
                             c->nodes[to].addr);
                    follow = true;
                    cand = to;
                } else {
                    connErrf(k, "%s: not the leader; unusable leader address", addr);
                }
            } else if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER) {
                connErrf(k, "%s: not the leader, and no leader known%s%s", addr,
                         detail[0] ? ": " : "", detail);
            } else {
                connErrf(k, "%s: unavailable%s%s", addr, detail[0] ? ": " : "", detail);
                busy = m->result != NULL ? m->result->retry_after_ms : 0;
            }
            idem__response__free_unpacked(m, NULL);
        }
        memcpy(last, k->errmsg, sizeof last);
        IdemWordsNote(&words, cand_tried, last);
        if (follow) {
            if (redirects++ >= IDEM_REDIRECTS_FREE) {
                backoffSleep(c, &backoff, deadline);
            }
            continue;
        }
        if (busy > 0) {
            /* The node leads and refused the request for load (its pending budget, or the
             * tenant's share of it) or while it hands its leadership on: the same request
             * to the same node, on the same connection, after its retry_after_ms at least
             * (the backoff, growing as after a failure, when longer). Another node would
             * only send it back (after a transfer, this one redirects). */
            backoffSleepAtLeast(c, &backoff, deadline, busy);
            continue;
        }
        /* Connection failure, bad frame, unavailable or leaderless: next seed. */
        backoffSleep(c, &backoff, deadline);
        cand = next_seed;
        next_seed = (next_seed + 1) % n_seeds;
    }
    char said[IDEM_ERRMSG_LEN];
    IdemWordsJoin(&words, said, sizeof said);
    connErrf(k, "no leader answered within %u ms (%s%s)", deadline_ms,
             words.n > 1 ? "each node's last answer: " : "last: ",
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
    struct idem_conns *k = connsGet(c);
    if (k == NULL) {
        IdemWhyf(err, err_len, "out of memory");
        return IDEM_ENOMEM;
    }
    rv = clientCall(c, k, req, deadline_ms, resp);
    IdemWhyf(err, err_len, "%s", k->errmsg);
    connsPut(c, k);
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
    struct idem_conns *k = connsGet(c);
    if (k == NULL) {
        return IDEM_ENOMEM;
    }
    if (i == IDEM_NODES_MAX) {
        connErrf(k, "%s: too many nodes on one client", addr);
        connsPut(c, k);
        return IDEM_EINVAL;
    }
    pthread_mutex_lock(&c->mu);
    uint64_t id = c->next_request_id++;
    pthread_mutex_unlock(&c->mu);
    size_t frame_len;
    rv = frameBuild(c, k, req, id, deadline, &frame_len);
    if (rv == IDEM_OK) {
        switch (nodeRoundTrip(c, k, i, frame_len, id, deadline, resp)) {
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
    connsPut(c, k);
    return rv;
}
