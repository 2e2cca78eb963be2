#include "xmalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "idemd: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        oom(n);
    }
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        oom(n * size);
    }
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        oom(n);
    }
    return q;
}

void *xmemdup(const void *p, size_t n)
{
    void *q = xmalloc(n);
    if (n > 0) {
        memcpy(q, p, n);
    }
    return q;
}

char *xstrndup(const char *s, size_t n)
{
    char *q = xmalloc(n + 1);
    memcpy(q, s, n);
    q[n] = '\0';
    return q;
}
