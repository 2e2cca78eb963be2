/* MAP_ANONYMOUS and mremap are not in POSIX.1-2008: glibc shows them with _GNU_SOURCE. */
#define _GNU_SOURCE

#include "xmalloc.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

static void *mapped(void *p, size_t bytes)
{
    if (p == MAP_FAILED) {
        fprintf(stderr, "idemd: out of memory mapping %zu bytes\n", bytes);
        abort();
    }
    return p;
}

void *xbig_zalloc(size_t bytes)
{
    if (bytes < XBIG_MAP_MIN_BYTES) {
        return xcalloc(1, bytes);
    }
    return mapped(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
                  bytes);
}

void *xbig_grow(void *p, size_t old_bytes, size_t bytes)
{
    if (bytes < XBIG_MAP_MIN_BYTES) {
        return xrealloc(p, bytes);
    }
    if (old_bytes >= XBIG_MAP_MIN_BYTES) {
        return mapped(mremap(p, old_bytes, bytes, MREMAP_MAYMOVE), bytes);
    }
    void *q = xbig_zalloc(bytes);
    if (old_bytes > 0) {
        memcpy(q, p, old_bytes);
    }
    free(p);
    return q;
}

void xbig_fault_in(void *p, size_t from, size_t bytes, atomic_size_t *done)
{
    volatile unsigned char *b = p;
    for (size_t at = from; at < bytes; at += XBIG_PAGE) {
        b[at] = 0;
        if (done != NULL) {
            size_t end = bytes - at > XBIG_PAGE ? at + XBIG_PAGE : bytes;
            atomic_store_explicit(done, end - from, memory_order_relaxed);
        }
    }
}

void xbig_prefault_start(struct xbig_prefault *pf, void *p, size_t from, size_t bytes)
{
    assert(pf->job == NULL);
    if (from >= bytes) {
        return;
    }
    if (pf->with == NULL) {
        xbig_fault_in(p, from, bytes, NULL);
        return;
    }
    pf->job = pf->with->start(p, from, bytes);
}

void xbig_prefault_wait(struct xbig_prefault *pf)
{
    if (pf->job != NULL) {
        pf->with->wait(pf->job);
        pf->job = NULL;
    }
}

size_t xbig_prefault_done(const struct xbig_prefault *pf)
{
    return pf->job != NULL ? pf->with->done(pf->job) : 0;
}

bool xbig_prefault_running(const struct xbig_prefault *pf)
{
    return pf->job != NULL;
}

void xbig_free(void *p, size_t bytes)
{
    if (bytes < XBIG_MAP_MIN_BYTES) {
        free(p);
    } else {
        munmap(p, bytes);
    }
}
