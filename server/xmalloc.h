/* xmalloc: allocation that aborts with a message on failure, for paths that cannot degrade. */
#ifndef IDEM_SERVER_XMALLOC_H
#define IDEM_SERVER_XMALLOC_H

#include <stddef.h>

/* Each returns memory the caller owns (free with free()), never NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
void *xmemdup(const void *p, size_t n);
char *xstrndup(const char *s, size_t n);

/* Big arrays (the record table's slots, the expiry index). From XBIG_MAP_MIN_BYTES on they
 * are mapped from the kernel: fresh pages are zero and faulted in as they are used, where
 * calloc may clear reused heap memory at once (3 ms for 32 MiB here), and they grow with
 * mremap(2), which moves page-table entries instead of copying (realloc: 1-5 ms at 8 MiB).
 * Below, the heap. The caller keeps the size: every call takes the current one. */
#define XBIG_MAP_MIN_BYTES ((size_t)1 << 20)
void *xbig_zalloc(size_t bytes);                            /* zeroed */
void *xbig_grow(void *p, size_t old_bytes, size_t bytes);   /* keeps the first old_bytes */
void xbig_free(void *p, size_t bytes);                      /* p may be NULL */
/* Faults in the page of mapped array p at byte *faulted, if *faulted < bytes, and moves
 * *faulted on by XBIG_PAGE: one step of getting an array ready ahead of its use. It writes
 * a zero byte (a read would map the shared zero page, and the first real write would fault
 * again), so it is only for arrays whose content is still zero or does not matter. */
#define XBIG_PAGE ((size_t)4096)
void xbig_fault_step(void *p, size_t bytes, size_t *faulted);

#endif
