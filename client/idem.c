/* idem.c: libidem, the synchronous client of idemd's binary RPC (see include/idem.h).
 *
 * One call, the happy path: pack the Request behind a 4-byte big-endian length, connect
 * (or reuse the connection to) the node the client believes leads, write the frame, read
 * frames until the Response with our request id arrives, hand it to the caller.
 *
 * Failure modes, and what idem_call() does about each:
 * - connect refused, reset, EOF, write error, a frame that does not decode: the
 *   connection is closed; the client backs off and tries the next candidate.
 * - a kept-alive connection that the server closed while idle: noticed on the first
 *   write or read of the call; the client reconnects to the same node once, at once.
 * - OUTCOME_NOT_LEADER with leader_rpc_address: the leader becomes the next candidate
 *   (learned as a node if it is not a seed), without backing off the first time; repeated
 *   redirects back off, so that two nodes pointing at each other cannot spin.
 * - OUTCOME_NOT_LEADER without an address, OUTCOME_UNAVAILABLE: back off, next seed.
 * - no answer: the call's deadline bounds every poll(); when it passes, the connection
 *   (which still has our request outstanding) is closed and the call returns
 *   IDEM_EUNAVAILABLE.
 * Every loop is bounded by the call's deadline. Backoff: 10 ms doubling to 200 ms, each
 * sleep shortened by up to a quarter at random so that clients do not retry in lockstep,
 * and never past the deadline. */
#include "idem.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#define IDEM_BACKOFF_MIN_MS 10
#define IDEM_BACKOFF_MAX_MS 200
#define IDEM_REDIRECTS_FREE 1 /* redirects followed without backing off, per call */
#define IDEM_ERRMSG_LEN 512

struct idem_node {
    char *addr; /* "host:port" as given (trimmed); owned */
    char *host; /* without brackets; owned */
    char *port; /* owned */
    int fd;     /* -1 when not connected */
};

struct idem_client {
    struct idem_node nodes[IDEM_NODES_MAX];
    size_t n_nodes;  /* seeds first, then learned leaders */
    size_t n_seeds;  /* >= 1 */
    size_t current;  /* the node to try first: the last one that answered idem_call() */
    bool answered;   /* whether `current` was set by an answer (idem_client_leader) */
    uint8_t *token;  /* owned; NULL when token_len == 0 */
    size_t token_len;
    uint64_t next_request_id;
    uint64_t rng;    /* xorshift64 state for backoff jitter; never 0 */
    uint8_t *wbuf;   /* outgoing frame; owned */
    size_t wbuf_cap;
    uint8_t *rbuf;   /* incoming frame; owned */
    size_t rbuf_cap;
    char errmsg[IDEM_ERRMSG_LEN];
};

/* What one round trip to one node came to. */
enum rt_result {
    RT_OK,      /* *resp holds the response to our request */
    RT_CONN,    /* the connection failed (connect, write, read, EOF); it is closed */
    RT_TIMEOUT, /* the deadline passed; the connection is closed */
    RT_PROTO,   /* the node sent bytes that are not a valid frame; the connection is closed */
    RT_NOMEM,
};

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
    switch (outcome) {
    case IDEM__OUTCOME__OUTCOME_UNSPECIFIED:
        return "unspecified";
    case IDEM__OUTCOME__OUTCOME_ACQUIRED:
        return "acquired";
    case IDEM__OUTCOME__OUTCOME_REPLAY:
        return "replay";
    case IDEM__OUTCOME__OUTCOME_IN_PROGRESS:
        return "in_progress";
    case IDEM__OUTCOME__OUTCOME_MISMATCH:
        return "mismatch";
    case IDEM__OUTCOME__OUTCOME_LEASE_EXPIRED:
        return "lease_expired";
    case IDEM__OUTCOME__OUTCOME_OUTCOME_UNKNOWN:
        return "outcome_unknown";
    case IDEM__OUTCOME__OUTCOME_EXPIRED:
        return "expired";
    case IDEM__OUTCOME__OUTCOME_OK:
        return "ok";
    case IDEM__OUTCOME__OUTCOME_LEASE_LOST:
        return "lease_lost";
    case IDEM__OUTCOME__OUTCOME_NOT_FOUND:
        return "not_found";
    case IDEM__OUTCOME__OUTCOME_QUOTA_EXCEEDED:
        return "quota_exceeded";
    case IDEM__OUTCOME__OUTCOME_INVALID:
        return "invalid";
    case IDEM__OUTCOME__OUTCOME_UNAVAILABLE:
        return "unavailable";
    case IDEM__OUTCOME__OUTCOME_NOT_LEADER:
        return "not_leader";
    case IDEM__OUTCOME__OUTCOME_UNAUTHENTICATED:
        return "unauthenticated";
    case IDEM__OUTCOME__OUTCOME_FORBIDDEN:
        return "forbidden";
    default:
        return "unrecognized";
    }
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

/* ---- messages ------------------------------------------------------------------------ */

static void clientErrf(struct idem_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void clientErrf(struct idem_client *c, const char *fmt, ...)
{
    char tmp[IDEM_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap); /* tmp: fmt's arguments may point into errmsg */
    va_end(ap);
    memcpy(c->errmsg, tmp, sizeof tmp);
}

static void whyf(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void whyf(char *why, size_t why_len, const char *fmt, ...)
{
    if (why == NULL || why_len == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

/* strerror() is not thread-safe; this uses the XSI strerror_r into the caller's buffer. */
static const char *errnoText(int err, char *buf, size_t len)
{
    if (strerror_r(err, buf, len) != 0) {
        snprintf(buf, len, "error %d", err);
    }
    return buf;
}

/* ---- addresses ----------------------------------------------------------------------- */

static char *dupRange(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Splits the `len` bytes at `s` ("host:port" or "[v6]:port") into host and port. With
 * host/port non-NULL, stores malloc'd copies (OUT, caller frees). Returns IDEM_OK,
 * IDEM_EINVAL with a reason in `why`, or IDEM_ENOMEM. */
static int addrSplit(const char *s, size_t len, char **host, char **port, char *why,
                     size_t why_len)
{
    const char *h;
    size_t h_len;
    const char *p;
    if (len == 0) {
        whyf(why, why_len, "empty address");
        return IDEM_EINVAL;
    }
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL || close + 1 >= s + len || close[1] != ':') {
            whyf(why, why_len, "\"%.*s\": expected [ipv6-address]:port", (int)len, s);
            return IDEM_EINVAL;
        }
        h = s + 1;
        h_len = (size_t)(close - h);
        p = close + 2;
    } else {
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++) {
            if (s[i] == ':') {
                if (colon != NULL) {
                    whyf(why, why_len, "\"%.*s\": write an IPv6 address as [address]:port",
                         (int)len, s);
                    return IDEM_EINVAL;
                }
                colon = s + i;
            }
        }
        if (colon == NULL) {
            whyf(why, why_len, "\"%.*s\": missing :port", (int)len, s);
            return IDEM_EINVAL;
        }
        h = s;
        h_len = (size_t)(colon - s);
        p = colon + 1;
    }
    size_t p_len = (size_t)(s + len - p);
    if (h_len == 0) {
        whyf(why, why_len, "\"%.*s\": missing host", (int)len, s);
        return IDEM_EINVAL;
    }
    unsigned long port_num = 0;
    if (p_len == 0 || p_len > 5) {
        whyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
        return IDEM_EINVAL;
    }
    for (size_t i = 0; i < p_len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            whyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
            return IDEM_EINVAL;
        }
        port_num = port_num * 10 + (unsigned long)(p[i] - '0');
    }
    if (port_num == 0 || port_num > 65535) {
        whyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
        return IDEM_EINVAL;
    }
    for (size_t i = 0; i < h_len; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch <= ' ' || ch == ',' || ch == '[' || ch == ']' || ch >= 0x7f) {
            whyf(why, why_len, "\"%.*s\": bad character in host", (int)len, s);
            return IDEM_EINVAL;
        }
    }
    if (host != NULL) {
        *host = dupRange(h, h_len);
        *port = dupRange(p, p_len);
        if (*host == NULL || *port == NULL) {
            free(*host);
            free(*port);
            *host = *port = NULL;
            return IDEM_ENOMEM;
        }
    }
    return IDEM_OK;
}

static bool isSpace(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Calls `fn` on every trimmed comma-separated entry of `seeds`. Stops at the first
 * error, which it returns. */
typedef int (*seedFn)(void *arg, const char *s, size_t len, size_t index, char *why,
                      size_t why_len);

static int seedsEach(const char *seeds, seedFn fn, void *arg, char *why, size_t why_len)
{
    if (seeds == NULL) {
        whyf(why, why_len, "no addresses");
        return IDEM_EINVAL;
    }
    size_t index = 0;
    const char *s = seeds;
    for (;;) {
        const char *end = strchr(s, ',');
        if (end == NULL) {
            end = s + strlen(s);
        }
        const char *a = s;
        const char *b = end;
        while (a < b && isSpace(*a)) {
            a++;
        }
        while (b > a && isSpace(b[-1])) {
            b--;
        }
        if (a == b) {
            if (index == 0 && *end == '\0') {
                whyf(why, why_len, "no addresses");
            } else {
                whyf(why, why_len, "address %zu is empty", index + 1);
            }
            return IDEM_EINVAL;
        }
        if (index >= IDEM_NODES_MAX) {
            whyf(why, why_len, "more than %d addresses", IDEM_NODES_MAX);
            return IDEM_EINVAL;
        }
        int rv = fn(arg, a, (size_t)(b - a), index, why, why_len);
        if (rv != IDEM_OK) {
            return rv;
        }
        index++;
        if (*end == '\0') {
            return IDEM_OK;
        }
        s = end + 1;
    }
}

static int seedCheckCb(void *arg, const char *s, size_t len, size_t index, char *why,
                       size_t why_len)
{
    (void)arg;
    (void)index;
    return addrSplit(s, len, NULL, NULL, why, why_len);
}

int idem_seeds_check(const char *seeds, char *why, size_t why_len)
{
    whyf(why, why_len, "%s", "");
    return seedsEach(seeds, seedCheckCb, NULL, why, why_len);
}

static void nodeClose(struct idem_node *n)
{
    if (n->fd >= 0) {
        close(n->fd);
        n->fd = -1;
    }
}

static void nodeFree(struct idem_node *n)
{
    nodeClose(n);
    free(n->addr);
    free(n->host);
    free(n->port);
    n->addr = n->host = n->port = NULL;
}

/* Fills `n` from an address of `len` bytes. Returns IDEM_OK, IDEM_EINVAL or IDEM_ENOMEM;
 * on error `n` holds nothing. */
static int nodeInit(struct idem_node *n, const char *s, size_t len, char *why, size_t why_len)
{
    n->fd = -1;
    n->addr = n->host = n->port = NULL;
    int rv = addrSplit(s, len, &n->host, &n->port, why, why_len);
    if (rv != IDEM_OK) {
        return rv;
    }
    n->addr = dupRange(s, len);
    if (n->addr == NULL) {
        nodeFree(n);
        return IDEM_ENOMEM;
    }
    return IDEM_OK;
}

static int seedAddCb(void *arg, const char *s, size_t len, size_t index, char *why,
                     size_t why_len)
{
    struct idem_client *c = arg;
    int rv = nodeInit(&c->nodes[index], s, len, why, why_len);
    if (rv == IDEM_OK) {
        c->n_nodes = index + 1;
    }
    return rv;
}

/* The index of the node whose address is `addr`, adding it (as a learned node) if
 * needed. Returns IDEM_NODES_MAX when the address is malformed or there is no room (the
 * caller then ignores it) and sets *nomem on allocation failure. When the table is full,
 * the last learned node is replaced. */
static size_t nodeFindOrAdd(struct idem_client *c, const char *addr, bool *nomem)
{
    size_t len = strlen(addr);
    for (size_t i = 0; i < c->n_nodes; i++) {
        if (strcmp(c->nodes[i].addr, addr) == 0) {
            return i;
        }
    }
    size_t slot = c->n_nodes;
    if (slot == IDEM_NODES_MAX) {
        if (c->n_seeds == IDEM_NODES_MAX) {
            return IDEM_NODES_MAX;
        }
        slot = IDEM_NODES_MAX - 1;
        nodeFree(&c->nodes[slot]);
        c->n_nodes--;
        if (c->current == slot) {
            c->current = 0;
            c->answered = false;
        }
    }
    char why[128];
    int rv = nodeInit(&c->nodes[slot], addr, len, why, sizeof why);
    if (rv != IDEM_OK) {
        if (rv == IDEM_ENOMEM) {
            *nomem = true;
        }
        return IDEM_NODES_MAX;
    }
    c->n_nodes++;
    return slot;
}

/* ---- client lifecycle ---------------------------------------------------------------- */

int idem_client_new(const char *seeds, const char *token, struct idem_client **out)
{
    if (out == NULL) {
        return IDEM_EINVAL;
    }
    *out = NULL;
    struct idem_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return IDEM_ENOMEM;
    }
    for (size_t i = 0; i < IDEM_NODES_MAX; i++) {
        c->nodes[i].fd = -1;
    }
    char why[128];
    int rv = seedsEach(seeds, seedAddCb, c, why, sizeof why);
    if (rv != IDEM_OK) {
        goto err;
    }
    c->n_seeds = c->n_nodes;
    if (token != NULL && token[0] != '\0') {
        c->token_len = strlen(token);
        c->token = malloc(c->token_len);
        if (c->token == NULL) {
            rv = IDEM_ENOMEM;
            goto err;
        }
        memcpy(c->token, token, c->token_len);
    }
    c->next_request_id = 1;
    if (RAND_bytes((unsigned char *)&c->rng, (int)sizeof c->rng) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        c->rng = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    if (c->rng == 0) {
        c->rng = 0x9e3779b97f4a7c15ull;
    }
    *out = c;
    return IDEM_OK;

err:
    idem_client_close(c);
    return rv;
}

void idem_client_close(struct idem_client *c)
{
    if (c == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_nodes; i++) {
        nodeFree(&c->nodes[i]);
    }
    if (c->token != NULL) {
        /* The token is a credential: do not leave it in freed memory. */
        volatile uint8_t *p = c->token;
        for (size_t i = 0; i < c->token_len; i++) {
            p[i] = 0;
        }
    }
    free(c->token);
    free(c->wbuf);
    free(c->rbuf);
    free(c);
}

const char *idem_client_errmsg(const struct idem_client *c)
{
    return c == NULL ? "" : c->errmsg;
}

const char *idem_client_leader(const struct idem_client *c)
{
    if (c == NULL || !c->answered) {
        return NULL;
    }
    return c->nodes[c->current].addr;
}

/* ---- time ---------------------------------------------------------------------------- */

static uint64_t nowMs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Milliseconds left until `deadline`, 0 once it passed. */
static uint64_t remainingMs(uint64_t deadline)
{
    uint64_t now = nowMs();
    return now >= deadline ? 0 : deadline - now;
}

static int pollTimeout(uint64_t deadline)
{
    uint64_t rem = remainingMs(deadline);
    return rem > 60000 ? 60000 : (int)rem;
}

static uint64_t rngNext(struct idem_client *c)
{
    uint64_t x = c->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c->rng = x;
    return x;
}

/* Sleeps for about *backoff ms (never past the deadline) and doubles *backoff. */
static void backoffSleep(struct idem_client *c, uint64_t *backoff, uint64_t deadline)
{
    uint64_t ms = *backoff - rngNext(c) % (*backoff / 4 + 1);
    uint64_t rem = remainingMs(deadline);
    if (ms > rem) {
        ms = rem;
    }
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    *backoff *= 2;
    if (*backoff > IDEM_BACKOFF_MAX_MS) {
        *backoff = IDEM_BACKOFF_MAX_MS;
    }
}

/* ---- one connection ------------------------------------------------------------------ */

/* Connects `n` within the deadline, trying every address the name resolves to. */
static enum rt_result nodeConnect(struct idem_client *c, struct idem_node *n, uint64_t deadline)
{
    char ebuf[128];
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(n->host, n->port, &hints, &res);
    if (gai != 0) {
        clientErrf(c, "%s: resolve: %s", n->addr, gai_strerror(gai));
        return RT_CONN;
    }
    enum rt_result result = RT_CONN;
    clientErrf(c, "%s: connect: no address", n->addr);
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            clientErrf(c, "%s: socket: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            continue;
        }
        int flags = fcntl(fd, F_GETFL);
        if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || flags < 0 ||
            fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
            clientErrf(c, "%s: fcntl: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            close(fd);
            continue;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                int pr;
                do {
                    pr = poll(&pfd, 1, pollTimeout(deadline));
                } while (pr < 0 && errno == EINTR && remainingMs(deadline) > 0);
                if (pr == 0 || (pr < 0 && errno == EINTR)) {
                    clientErrf(c, "%s: connect: timed out", n->addr);
                    close(fd);
                    result = RT_TIMEOUT;
                    break;
                }
                socklen_t elen = sizeof err;
                if (pr < 0) {
                    err = errno;
                } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                    err = errno;
                }
            }
        }
        if (err != 0) {
            clientErrf(c, "%s: connect: %s", n->addr, errnoText(err, ebuf, sizeof ebuf));
            close(fd);
            continue;
        }
        /* Back to a blocking socket: every wait is a poll() bounded by the deadline, and
         * send/recv use MSG_DONTWAIT so that none of them can block past it. */
        if (fcntl(fd, F_SETFL, flags) != 0) {
            clientErrf(c, "%s: fcntl: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            close(fd);
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        n->fd = fd;
        result = RT_OK;
        break;
    }
    freeaddrinfo(res);
    return result;
}

/* Writes all `len` bytes within the deadline. */
static enum rt_result nodeWrite(struct idem_client *c, struct idem_node *n, const uint8_t *buf,
                                size_t len, uint64_t deadline)
{
    char ebuf[128];
    size_t done = 0;
    while (done < len) {
        struct pollfd pfd = {.fd = n->fd, .events = POLLOUT};
        int pr = poll(&pfd, 1, pollTimeout(deadline));
        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr == 0) {
            clientErrf(c, "%s: write: timed out", n->addr);
            return RT_TIMEOUT;
        }
        if (pr < 0) {
            clientErrf(c, "%s: poll: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        ssize_t w = send(n->fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
                continue;
            }
            clientErrf(c, "%s: write: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        done += (size_t)w;
    }
    return RT_OK;
}

/* Reads exactly `len` bytes within the deadline. *got (OUT, may be NULL) counts bytes
 * read, so that the caller can tell "closed before answering" from "closed mid-frame". */
static enum rt_result nodeRead(struct idem_client *c, struct idem_node *n, uint8_t *buf,
                               size_t len, uint64_t deadline, size_t *got)
{
    char ebuf[128];
    size_t done = 0;
    while (done < len) {
        struct pollfd pfd = {.fd = n->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, pollTimeout(deadline));
        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr == 0) {
            clientErrf(c, "%s: no answer before the deadline", n->addr);
            return RT_TIMEOUT;
        }
        if (pr < 0) {
            clientErrf(c, "%s: poll: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        ssize_t r = recv(n->fd, buf + done, len - done, MSG_DONTWAIT);
        if (r == 0) {
            clientErrf(c, "%s: connection closed by the node", n->addr);
            return RT_CONN;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
                continue;
            }
            clientErrf(c, "%s: read: %s", n->addr, errnoText(errno, ebuf, sizeof ebuf));
            return RT_CONN;
        }
        done += (size_t)r;
        if (got != NULL) {
            *got += (size_t)r;
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
    uint8_t *p = realloc(*buf, n);
    if (p == NULL) {
        return false;
    }
    *buf = p;
    *cap = n;
    return true;
}

/* Reads frames until the Response to `id` arrives; skips answers to earlier requests
 * that a previous call gave up on. */
static enum rt_result nodeAwait(struct idem_client *c, struct idem_node *n, uint64_t id,
                                uint64_t deadline, Idem__Response **resp, size_t *got)
{
    for (;;) {
        uint8_t hdr[4];
        enum rt_result r = nodeRead(c, n, hdr, sizeof hdr, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
                       (uint32_t)hdr[2] << 8 | (uint32_t)hdr[3];
        if (len > IDEM_MAX_FRAME) {
            clientErrf(c, "%s: frame of %u bytes exceeds the limit of %u", n->addr, len,
                       IDEM_MAX_FRAME);
            return RT_PROTO;
        }
        if (!bufReserve(&c->rbuf, &c->rbuf_cap, len)) {
            clientErrf(c, "%s: out of memory reading a %u-byte frame", n->addr, len);
            return RT_NOMEM;
        }
        r = nodeRead(c, n, c->rbuf, len, deadline, got);
        if (r != RT_OK) {
            return r;
        }
        Idem__Response *m = idem__response__unpack(NULL, len, c->rbuf);
        if (m == NULL) {
            clientErrf(c, "%s: a %u-byte response does not decode", n->addr, len);
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

/* Packs `req` into c->wbuf as one frame, with our request id, the time left and the
 * client's token. Returns IDEM_OK, IDEM_ETOOBIG or IDEM_ENOMEM; *len (OUT) is the frame
 * length including the 4-byte prefix. */
static int frameBuild(struct idem_client *c, const Idem__Request *req, uint64_t id,
                      uint64_t deadline, size_t *len)
{
    Idem__Request r = *req; /* shallow: borrows every field of req */
    r.request_id = id;
    uint64_t rem = remainingMs(deadline);
    r.deadline_ms = rem == 0 ? 1 : (rem > UINT32_MAX ? UINT32_MAX : (uint32_t)rem);
    if (r.auth_token.len == 0 && c->token_len > 0) {
        r.auth_token.data = c->token;
        r.auth_token.len = c->token_len;
    }
    size_t body = idem__request__get_packed_size(&r);
    if (body > IDEM_MAX_FRAME) {
        clientErrf(c, "request of %zu bytes exceeds the limit of %u", body, IDEM_MAX_FRAME);
        return IDEM_ETOOBIG;
    }
    if (!bufReserve(&c->wbuf, &c->wbuf_cap, body + 4)) {
        clientErrf(c, "out of memory packing a %zu-byte request", body);
        return IDEM_ENOMEM;
    }
    c->wbuf[0] = (uint8_t)(body >> 24);
    c->wbuf[1] = (uint8_t)(body >> 16);
    c->wbuf[2] = (uint8_t)(body >> 8);
    c->wbuf[3] = (uint8_t)body;
    idem__request__pack(&r, c->wbuf + 4);
    *len = body + 4;
    return IDEM_OK;
}

/* One request, one answer, on node `n`. The frame must already be in c->wbuf. A
 * kept-alive connection that turns out to be closed before a byte of the answer arrived
 * is reopened once. On anything but RT_OK the connection is closed. */
static enum rt_result nodeRoundTrip(struct idem_client *c, struct idem_node *n,
                                    size_t frame_len, uint64_t id, uint64_t deadline,
                                    Idem__Response **resp)
{
    for (int attempt = 0;; attempt++) {
        bool reused = n->fd >= 0;
        if (!reused) {
            enum rt_result r = nodeConnect(c, n, deadline);
            if (r != RT_OK) {
                return r;
            }
        }
        size_t got = 0;
        enum rt_result r = nodeWrite(c, n, c->wbuf, frame_len, deadline);
        if (r == RT_OK) {
            r = nodeAwait(c, n, id, deadline, resp, &got);
        }
        if (r == RT_OK) {
            if ((*resp)->request_id == 0) {
                nodeClose(n); /* the node closes it too after an unreadable request */
            }
            return RT_OK;
        }
        nodeClose(n);
        if (r == RT_CONN && reused && got == 0 && attempt == 0 && remainingMs(deadline) > 0) {
            continue;
        }
        return r;
    }
}

/* ---- calls --------------------------------------------------------------------------- */

static int checkArgs(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
                     Idem__Response **resp)
{
    if (resp != NULL) {
        *resp = NULL;
    }
    if (c == NULL || req == NULL || resp == NULL) {
        return IDEM_EINVAL;
    }
    if (deadline_ms == 0) {
        clientErrf(c, "deadline must be > 0 ms");
        return IDEM_EINVAL;
    }
    if (req->op_case == IDEM__REQUEST__OP__NOT_SET) {
        clientErrf(c, "request has no operation");
        return IDEM_EINVAL;
    }
    c->errmsg[0] = '\0';
    return IDEM_OK;
}

int idem_call(struct idem_client *c, const Idem__Request *req, uint32_t deadline_ms,
              Idem__Response **resp)
{
    int rv = checkArgs(c, req, deadline_ms, resp);
    if (rv != IDEM_OK) {
        return rv;
    }
    uint64_t deadline = nowMs() + deadline_ms;
    uint64_t id = c->next_request_id++;
    size_t cand = c->current < c->n_nodes ? c->current : 0;
    size_t next_seed = cand < c->n_seeds ? (cand + 1) % c->n_seeds : 0;
    uint64_t backoff = IDEM_BACKOFF_MIN_MS;
    unsigned redirects = 0;
    char last[IDEM_ERRMSG_LEN] = "";

    while (remainingMs(deadline) > 0) {
        size_t frame_len;
        rv = frameBuild(c, req, id, deadline, &frame_len);
        if (rv != IDEM_OK) {
            return rv;
        }
        struct idem_node *n = &c->nodes[cand];
        Idem__Response *m = NULL;
        enum rt_result r = nodeRoundTrip(c, n, frame_len, id, deadline, &m);
        if (r == RT_NOMEM) {
            return IDEM_ENOMEM;
        }
        if (r == RT_TIMEOUT) {
            memcpy(last, c->errmsg, sizeof last);
            break;
        }
        bool follow = false;
        if (r == RT_OK) {
            Idem__Outcome outcome = idem_response_outcome(m);
            if (outcome != IDEM__OUTCOME__OUTCOME_NOT_LEADER &&
                outcome != IDEM__OUTCOME__OUTCOME_UNAVAILABLE) {
                c->current = cand;
                c->answered = true;
                c->errmsg[0] = '\0';
                *resp = m;
                return IDEM_OK;
            }
            const char *detail = m->error != NULL ? m->error : "";
            if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER && m->leader_rpc_address != NULL &&
                m->leader_rpc_address[0] != '\0' && strcmp(m->leader_rpc_address, n->addr) != 0) {
                bool nomem = false;
                size_t to = nodeFindOrAdd(c, m->leader_rpc_address, &nomem);
                if (nomem) {
                    idem__response__free_unpacked(m, NULL);
                    return IDEM_ENOMEM;
                }
                if (to < IDEM_NODES_MAX) {
                    clientErrf(c, "%s: not the leader; redirected to %s", n->addr,
                               c->nodes[to].addr);
                    follow = true;
                    cand = to;
                } else {
                    clientErrf(c, "%s: not the leader; unusable leader address", n->addr);
                }
            } else if (outcome == IDEM__OUTCOME__OUTCOME_NOT_LEADER) {
                clientErrf(c, "%s: not the leader, and no leader known%s%s", n->addr,
                           detail[0] ? ": " : "", detail);
            } else {
                clientErrf(c, "%s: unavailable%s%s", n->addr, detail[0] ? ": " : "", detail);
            }
            idem__response__free_unpacked(m, NULL);
        }
        memcpy(last, c->errmsg, sizeof last);
        if (follow) {
            if (redirects++ >= IDEM_REDIRECTS_FREE) {
                backoffSleep(c, &backoff, deadline);
            }
            continue;
        }
        /* Connection failure, bad frame, unavailable or leaderless: next seed. */
        backoffSleep(c, &backoff, deadline);
        cand = next_seed;
        next_seed = (next_seed + 1) % c->n_seeds;
    }
    clientErrf(c, "no leader answered within %u ms (last: %s)", deadline_ms,
               last[0] ? last : "deadline passed before a node was tried");
    return IDEM_EUNAVAILABLE;
}

int idem_call_node(struct idem_client *c, const char *addr, const Idem__Request *req,
                   uint32_t deadline_ms, Idem__Response **resp)
{
    int rv = checkArgs(c, req, deadline_ms, resp);
    if (rv != IDEM_OK) {
        return rv;
    }
    if (addr == NULL) {
        return IDEM_EINVAL;
    }
    char why[128];
    if (addrSplit(addr, strlen(addr), NULL, NULL, why, sizeof why) != IDEM_OK) {
        clientErrf(c, "bad node address %s", why);
        return IDEM_EINVAL;
    }
    uint64_t deadline = nowMs() + deadline_ms;
    bool nomem = false;
    size_t i = nodeFindOrAdd(c, addr, &nomem);
    if (nomem) {
        return IDEM_ENOMEM;
    }
    if (i == IDEM_NODES_MAX) {
        clientErrf(c, "%s: too many nodes on one client", addr);
        return IDEM_EINVAL;
    }
    uint64_t id = c->next_request_id++;
    size_t frame_len;
    rv = frameBuild(c, req, id, deadline, &frame_len);
    if (rv != IDEM_OK) {
        return rv;
    }
    enum rt_result r = nodeRoundTrip(c, &c->nodes[i], frame_len, id, deadline, resp);
    switch (r) {
    case RT_OK:
        c->errmsg[0] = '\0';
        return IDEM_OK;
    case RT_PROTO:
        return IDEM_EPROTO;
    case RT_NOMEM:
        return IDEM_ENOMEM;
    case RT_CONN:
    case RT_TIMEOUT:
    default:
        return IDEM_EUNAVAILABLE;
    }
}
