/* resolver: see resolver.h. The loop side (the kept answers, the requests waiting for them)
 * is touched on the loop only; the lookups queued for the thread and those it finished are
 * shared, under one mutex, in a core that whichever of the two ends last (the resolver
 * closing, the thread leaving a lookup it was in) frees. */
#include "resolver.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

/* One lookup for the thread. */
struct job {
    TAILQ_ENTRY(job) link;
    struct entry *e; /* the name's entry (loop side; not replaced while the job is out) */
    char host[IDEM_HOST_MAX + 1];
    struct sockaddr_storage addrs[IDEM_RESOLVE_MAX];
    size_t n;
    int status;
};
TAILQ_HEAD(jobList, job);

/* What the loop and the thread share, under mu. */
struct core {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct jobList todo;
    struct jobList done;
    uv_async_t *async; /* told of finished jobs; NULL once the resolver closes */
    bool closing;
    bool thread_running;
    int refs; /* the resolver until its handle closed, and the thread while it runs */
    idem_lookup_fn fn;
};

struct idem_lookup {
    LIST_ENTRY(idem_lookup) link; /* in its entry's waiters, or the list being answered */
    uint16_t port;
    idem_resolve_cb cb;
    void *data;
};
LIST_HEAD(lookupList, idem_lookup);

/* One name: its last answer and the requests waiting for the next. */
struct entry {
    bool used;
    char host[IDEM_HOST_MAX + 1];
    bool answered;
    int status;
    struct sockaddr_storage addrs[IDEM_RESOLVE_MAX]; /* port 0 */
    size_t n;
    uint64_t at_ms;   /* when the answer came (the loop's time) */
    uint64_t used_ms; /* last asked for: the least recently used one is replaced */
    struct job *job;  /* in flight */
    struct lookupList waiters;
};

struct idem_resolver {
    uv_loop_t *loop;
    uv_async_t async;
    struct core *core;
    struct entry *entries; /* IDEM_RESOLVER_NAMES */
    size_t jobs_out;       /* lookups not answered yet: they keep the loop running */
    uint64_t lookups;
    bool closing;
};

/* ---- the thread --------------------------------------------------------------------------- */

static int gaiLookup(const char *host, struct sockaddr_storage *out, size_t cap, size_t *n)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo *res = NULL;
    *n = 0;
    int rv = getaddrinfo(host, NULL, &hints, &res);
    if (rv != 0) {
        return rv;
    }
    for (const struct addrinfo *ai = res; ai != NULL && *n < cap; ai = ai->ai_next) {
        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            ai->ai_addrlen > sizeof *out) {
            continue;
        }
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        bool seen = false;
        for (size_t i = 0; i < *n && !seen; i++) {
            seen = memcmp(&out[i], &ss, sizeof ss) == 0;
        }
        if (!seen) {
            out[(*n)++] = ss;
        }
    }
    freeaddrinfo(res);
    return *n > 0 ? 0 : EAI_NONAME;
}

static void coreUnref(struct core *c)
{
    pthread_mutex_lock(&c->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
    }
}

static void *threadMain(void *arg)
{
    struct core *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->closing && TAILQ_EMPTY(&c->todo)) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        if (c->closing) {
            break;
        }
        struct job *j = TAILQ_FIRST(&c->todo);
        TAILQ_REMOVE(&c->todo, j, link);
        idem_lookup_fn fn = c->fn;
        pthread_mutex_unlock(&c->mu);
        j->status = fn(j->host, j->addrs, IDEM_RESOLVE_MAX, &j->n);
        pthread_mutex_lock(&c->mu);
        if (c->closing) {
            free(j); /* nobody waits for it now */
            break;
        }
        TAILQ_INSERT_TAIL(&c->done, j, link);
        uv_async_send(c->async);
    }
    c->thread_running = false;
    pthread_mutex_unlock(&c->mu);
    coreUnref(c);
    return NULL;
}

/* ---- the loop side ------------------------------------------------------------------------ */

static void withPort(struct sockaddr_storage *ss, uint16_t port)
{
    if (ss->ss_family == AF_INET) {
        ((struct sockaddr_in *)ss)->sin_port = htons(port);
    } else if (ss->ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
    }
}

static size_t copyAnswer(const struct entry *e, uint16_t port, struct sockaddr_storage *out,
                         size_t cap)
{
    size_t n = e->n < cap ? e->n : cap;
    for (size_t i = 0; i < n; i++) {
        out[i] = e->addrs[i];
        withPort(&out[i], port);
    }
    return n;
}

/* Calls back every request waiting for e's answer (which may ask again, or cancel others). */
static void answerWaiters(struct idem_resolver *r, struct entry *e)
{
    struct lookupList now;
    LIST_INIT(&now);
    struct idem_lookup *l;
    while ((l = LIST_FIRST(&e->waiters)) != NULL) {
        LIST_REMOVE(l, link);
        LIST_INSERT_HEAD(&now, l, link);
    }
    while ((l = LIST_FIRST(&now)) != NULL) {
        LIST_REMOVE(l, link);
        idem_resolve_cb cb = l->cb;
        void *data = l->data;
        uint16_t port = l->port;
        free(l);
        if (r->closing) {
            continue; /* closed by an earlier callback: nobody is called any more */
        }
        struct sockaddr_storage addrs[IDEM_RESOLVE_MAX];
        size_t n = e->status == 0 ? copyAnswer(e, port, addrs, IDEM_RESOLVE_MAX) : 0;
        cb(data, e->status, addrs, n);
    }
}

static void asyncCb(uv_async_t *h)
{
    struct idem_resolver *r = h->data;
    struct jobList done;
    TAILQ_INIT(&done);
    pthread_mutex_lock(&r->core->mu);
    TAILQ_CONCAT(&done, &r->core->done, link);
    pthread_mutex_unlock(&r->core->mu);
    struct job *j;
    while ((j = TAILQ_FIRST(&done)) != NULL) {
        TAILQ_REMOVE(&done, j, link);
        struct entry *e = j->e;
        e->job = NULL;
        if (--r->jobs_out == 0) {
            uv_unref((uv_handle_t *)&r->async);
        }
        e->answered = true;
        e->status = j->status;
        e->n = j->status == 0 ? j->n : 0;
        memcpy(e->addrs, j->addrs, sizeof e->addrs);
        e->at_ms = uv_now(r->loop);
        free(j);
        if (!r->closing) {
            answerWaiters(r, e);
        }
    }
}

struct idem_resolver *IdemResolverNew(uv_loop_t *loop)
{
    struct idem_resolver *r = calloc(1, sizeof *r);
    struct core *c = calloc(1, sizeof *c);
    struct entry *entries = calloc(IDEM_RESOLVER_NAMES, sizeof *entries);
    if (r == NULL || c == NULL || entries == NULL || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(r);
        free(c);
        free(entries);
        return NULL;
    }
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(r);
        free(c);
        free(entries);
        return NULL;
    }
    TAILQ_INIT(&c->todo);
    TAILQ_INIT(&c->done);
    c->refs = 1;
    c->fn = gaiLookup;
    c->async = &r->async;
    r->loop = loop;
    r->core = c;
    r->entries = entries;
    uv_async_init(loop, &r->async, asyncCb);
    r->async.data = r;
    uv_unref((uv_handle_t *)&r->async); /* only lookups in flight keep the loop running */
    return r;
}

void IdemResolverSetLookup(struct idem_resolver *r, idem_lookup_fn fn)
{
    pthread_mutex_lock(&r->core->mu);
    r->core->fn = fn;
    pthread_mutex_unlock(&r->core->mu);
}

/* host's entry; made (replacing the least recently used idle one) when `make`. NULL when
 * there is none, or no room. */
static struct entry *entryFind(struct idem_resolver *r, const char *host, bool make)
{
    struct entry *free_e = NULL, *lru = NULL;
    for (size_t i = 0; i < IDEM_RESOLVER_NAMES; i++) {
        struct entry *e = &r->entries[i];
        if (!e->used) {
            free_e = free_e != NULL ? free_e : e;
        } else if (strcmp(e->host, host) == 0) {
            e->used_ms = uv_now(r->loop);
            return e;
        } else if (e->job == NULL && LIST_EMPTY(&e->waiters) &&
                   (lru == NULL || e->used_ms < lru->used_ms)) {
            lru = e;
        }
    }
    struct entry *e = free_e != NULL ? free_e : lru;
    if (!make || e == NULL || strlen(host) > IDEM_HOST_MAX) {
        return NULL;
    }
    memset(e, 0, sizeof *e);
    e->used = true;
    snprintf(e->host, sizeof e->host, "%s", host);
    LIST_INIT(&e->waiters);
    e->used_ms = uv_now(r->loop);
    return e;
}

/* Queues a lookup of e's name for the thread (starting it the first time). */
static bool jobStart(struct idem_resolver *r, struct entry *e)
{
    struct job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        return false;
    }
    j->e = e;
    memcpy(j->host, e->host, sizeof j->host);
    struct core *c = r->core;
    pthread_mutex_lock(&c->mu);
    if (!c->thread_running) {
        pthread_t th;
        pthread_attr_t attr;
        bool ok = pthread_attr_init(&attr) == 0;
        ok = ok && pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
             pthread_create(&th, &attr, threadMain, c) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) {
            pthread_mutex_unlock(&c->mu);
            free(j);
            return false;
        }
        c->thread_running = true;
        c->refs++;
    }
    TAILQ_INSERT_TAIL(&c->todo, j, link);
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    e->job = j;
    r->lookups++;
    if (r->jobs_out++ == 0) {
        uv_ref((uv_handle_t *)&r->async);
    }
    return true;
}

int IdemResolve(struct idem_resolver *r, const char *host, uint16_t port, idem_resolve_cb cb,
                void *data, struct idem_lookup **out)
{
    if (r->closing) {
        return -1;
    }
    struct entry *e = entryFind(r, host, true);
    struct idem_lookup *l = e != NULL ? calloc(1, sizeof *l) : NULL;
    if (l == NULL || (e->job == NULL && !jobStart(r, e))) {
        free(l);
        return -1;
    }
    l->port = port;
    l->cb = cb;
    l->data = data;
    LIST_INSERT_HEAD(&e->waiters, l, link);
    *out = l;
    return 0;
}

void IdemResolveCancel(struct idem_lookup *l)
{
    LIST_REMOVE(l, link);
    free(l);
}

size_t IdemResolverCached(struct idem_resolver *r, const char *host, uint16_t port,
                          uint64_t max_age_ms, struct sockaddr_storage *out, size_t cap)
{
    struct entry *e = entryFind(r, host, false);
    if (e == NULL || !e->answered || e->status != 0 || uv_now(r->loop) - e->at_ms > max_age_ms) {
        return 0;
    }
    return copyAnswer(e, port, out, cap);
}

void IdemResolverRefresh(struct idem_resolver *r, const char *host, uint64_t max_age_ms)
{
    if (r->closing) {
        return;
    }
    struct entry *e = entryFind(r, host, true);
    if (e == NULL || e->job != NULL || (e->answered && uv_now(r->loop) - e->at_ms <= max_age_ms)) {
        return;
    }
    (void)jobStart(r, e); /* out of memory or threads: asked again at the next refresh */
}

uint64_t IdemResolverLookups(const struct idem_resolver *r)
{
    return r->lookups;
}

static void resolverClosedCb(uv_handle_t *h)
{
    struct idem_resolver *r = h->data;
    coreUnref(r->core);
    free(r->entries);
    free(r);
}

void IdemResolverClose(struct idem_resolver *r)
{
    if (r == NULL || r->closing) {
        return;
    }
    r->closing = true;
    struct core *c = r->core;
    struct jobList drop;
    TAILQ_INIT(&drop);
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    c->async = NULL;
    TAILQ_CONCAT(&drop, &c->todo, link);
    TAILQ_CONCAT(&drop, &c->done, link);
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    struct job *j;
    while ((j = TAILQ_FIRST(&drop)) != NULL) {
        TAILQ_REMOVE(&drop, j, link);
        free(j);
    }
    for (size_t i = 0; i < IDEM_RESOLVER_NAMES; i++) {
        struct idem_lookup *l;
        while ((l = LIST_FIRST(&r->entries[i].waiters)) != NULL) {
            LIST_REMOVE(l, link);
            free(l);
        }
        r->entries[i].job = NULL; /* the thread frees the one it is in */
    }
    uv_close((uv_handle_t *)&r->async, resolverClosedCb);
}

const char *IdemResolveStrerror(int status)
{
    return gai_strerror(status);
}

/* ---- socket addresses ---------------------------------------------------------------------- */

bool IdemHostPortSplit(const char *text, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(text, ':');
    const char *h = text;
    size_t hlen;
    if (colon == NULL) {
        return false;
    }
    if (text[0] == '[') {
        if (colon == text || colon[-1] != ']') {
            return false;
        }
        h = text + 1;
        hlen = (size_t)(colon - 1 - h);
    } else {
        hlen = (size_t)(colon - text);
        if (memchr(text, ':', hlen) != NULL) {
            return false;
        }
    }
    const char *p = colon + 1;
    size_t plen = strlen(p);
    if (hlen == 0 || hlen >= cap || plen == 0 || plen > 5 || strspn(p, "0123456789") != plen) {
        return false;
    }
    unsigned long v = strtoul(p, NULL, 10);
    if (v == 0 || v > 65535) {
        return false;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return true;
}

bool IdemSockaddrLiteral(const char *host, uint16_t port, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    struct sockaddr_in *in = (struct sockaddr_in *)out;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        return true;
    }
    memset(out, 0, sizeof *out);
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        return true;
    }
    memset(out, 0, sizeof *out);
    return false;
}

int IdemSockaddrResolveNow(const char *host, uint16_t port, struct sockaddr_storage *out, char *why,
                           size_t why_len)
{
    if (IdemSockaddrLiteral(host, port, out)) {
        return 0;
    }
    struct sockaddr_storage addrs[1];
    size_t n = 0;
    int rv = gaiLookup(host, addrs, 1, &n);
    if (rv != 0) {
        snprintf(why, why_len, "cannot resolve %s: %s", host, gai_strerror(rv));
        return -1;
    }
    *out = addrs[0];
    withPort(out, port);
    return 0;
}

void IdemSockaddrText(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
        snprintf(buf, len, "[%s]:%u", ip, (unsigned)ntohs(in6->sin6_port));
    } else {
        snprintf(buf, len, "?");
    }
}

bool IdemSockaddrKey(const struct sockaddr *sa, uint8_t key[16])
{
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &in->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        memcpy(key, &in6->sin6_addr, 16);
        return true;
    }
    return false;
}

static uint16_t portOf(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET
               ? ntohs(((const struct sockaddr_in *)(const void *)sa)->sin_port)
               : ntohs(((const struct sockaddr_in6 *)(const void *)sa)->sin6_port);
}

bool IdemSockaddrMatches(const struct sockaddr *listener, const struct sockaddr *local)
{
    static const uint8_t any6[16] = {0};
    static const uint8_t any4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
    uint8_t a[16], b[16];
    if (!IdemSockaddrKey(listener, a) || !IdemSockaddrKey(local, b) ||
        portOf(listener) != portOf(local)) {
        return false;
    }
    return memcmp(a, b, 16) == 0 || memcmp(a, any6, 16) == 0 || memcmp(a, any4, 16) == 0;
}
