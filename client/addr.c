/* addr.c: node addresses and seed lists ("host:port,[v6]:port,..."). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
int IdemAddrSplit(const char *s, size_t len, char **host, char **port, char *why,
                  size_t why_len)
{
    const char *h;
    size_t h_len;
    const char *p;
    if (len == 0) {
        IdemWhyf(why, why_len, "empty address");
        return IDEM_EINVAL;
    }
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL || close + 1 >= s + len || close[1] != ':') {
            IdemWhyf(why, why_len, "\"%.*s\": expected [ipv6-address]:port", (int)len, s);
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
                    IdemWhyf(why, why_len, "\"%.*s\": write an IPv6 address as [address]:port",
                         (int)len, s);
                    return IDEM_EINVAL;
                }
                colon = s + i;
            }
        }
        if (colon == NULL) {
            IdemWhyf(why, why_len, "\"%.*s\": missing :port", (int)len, s);
            return IDEM_EINVAL;
        }
        h = s;
        h_len = (size_t)(colon - s);
        p = colon + 1;
    }
    size_t p_len = (size_t)(s + len - p);
    if (h_len == 0) {
        IdemWhyf(why, why_len, "\"%.*s\": missing host", (int)len, s);
        return IDEM_EINVAL;
    }
    unsigned long port_num = 0;
    if (p_len == 0 || p_len > 5) {
        IdemWhyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
        return IDEM_EINVAL;
    }
    for (size_t i = 0; i < p_len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            IdemWhyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
            return IDEM_EINVAL;
        }
        port_num = port_num * 10 + (unsigned long)(p[i] - '0');
    }
    if (port_num == 0 || port_num > 65535) {
        IdemWhyf(why, why_len, "\"%.*s\": port must be 1-65535", (int)len, s);
        return IDEM_EINVAL;
    }
    for (size_t i = 0; i < h_len; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch <= ' ' || ch == ',' || ch == '[' || ch == ']' || ch >= 0x7f) {
            IdemWhyf(why, why_len, "\"%.*s\": bad character in host", (int)len, s);
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
        IdemWhyf(why, why_len, "no addresses");
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
                IdemWhyf(why, why_len, "no addresses");
            } else {
                IdemWhyf(why, why_len, "address %zu is empty", index + 1);
            }
            return IDEM_EINVAL;
        }
        if (index >= IDEM_NODES_MAX) {
            IdemWhyf(why, why_len, "more than %d addresses", IDEM_NODES_MAX);
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
    return IdemAddrSplit(s, len, NULL, NULL, why, why_len);
}

int idem_seeds_check(const char *seeds, char *why, size_t why_len)
{
    IdemWhyf(why, why_len, "%s", "");
    return seedsEach(seeds, seedCheckCb, NULL, why, why_len);
}


void IdemNodeFree(struct idem_node *n)
{
    free(n->addr);
    free(n->host);
    free(n->port);
    n->addr = n->host = n->port = NULL;
}

/* Fills `n` from an address of `len` bytes. Returns IDEM_OK, IDEM_EINVAL or IDEM_ENOMEM;
 * on error `n` holds nothing. */
int IdemNodeInit(struct idem_node *n, const char *s, size_t len, char *why, size_t why_len)
{
    n->addr = n->host = n->port = NULL;
    int rv = IdemAddrSplit(s, len, &n->host, &n->port, why, why_len);
    if (rv != IDEM_OK) {
        return rv;
    }
    n->addr = dupRange(s, len);
    if (n->addr == NULL) {
        IdemNodeFree(n);
        return IDEM_ENOMEM;
    }
    return IDEM_OK;
}


struct seedsParse {
    struct idem_node *nodes;
    size_t n;
};

static int seedAddCb(void *arg, const char *s, size_t len, size_t index, char *why,
                     size_t why_len)
{
    struct seedsParse *sp = arg;
    int rv = IdemNodeInit(&sp->nodes[index], s, len, why, why_len);
    if (rv == IDEM_OK) {
        sp->n = index + 1;
    }
    return rv;
}

int IdemSeedsParse(const char *seeds, struct idem_node *nodes, size_t *n, char *why,
                   size_t why_len)
{
    struct seedsParse sp = {.nodes = nodes, .n = 0};
    int rv = seedsEach(seeds, seedAddCb, &sp, why, why_len);
    if (rv != IDEM_OK) {
        for (size_t i = 0; i < sp.n; i++) {
            IdemNodeFree(&nodes[i]);
        }
        sp.n = 0;
    }
    *n = sp.n;
    return rv;
}
