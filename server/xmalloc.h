/* xmalloc: allocation that aborts with a message on failure, for paths that cannot degrade.
 * Part of the deterministic core (idem_core): it starts no thread (see xbig_prefaulter). */
#ifndef IDEM_SERVER_XMALLOC_H
#define IDEM_SERVER_XMALLOC_H

#include <stdatomic.h>
#include <stdbool.h>
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
/* Faulting an array in ahead of its use, off the event loop. Fresh pages cost 1-4 us each
 * to fault in on the 2-core VM; done on the loop (one page per insert, as before), the
 * 12,288 pages a 2M-slot table's next growth and snapshot spare need came within 0.25 s of
 * claims on all three nodes at once, and an open loop at 30-40k claims/s had a p99 of
 * 38-265 ms for 0.2-0.6 s there (docs/latency.md). A zero byte is written to each page: a
 * write, not a read, which would map the shared zero page and fault again at the first real
 * write; so only for arrays whose content is still zero or does not matter, and that nothing
 * else reads or writes until xbig_prefault_wait.
 *
 * The state machine starts no thread: who faults the pages in is the owner's choice, a
 * struct xbig_prefaulter it passes in (fsm_new_with, table_init). The daemon's runs a thread
 * at the lowest CPU priority (prefault_thread.h). Without one (NULL), or when it cannot
 * start a job, the pages are faulted in at once on the caller's. */
#define XBIG_PAGE ((size_t)4096)
struct xbig_prefaulter {
    /* Starts faulting in bytes [from, bytes) of p (from < bytes); returns the job, or NULL
     * when it has done so already, at once. */
    void *(*start)(void *p, size_t from, size_t bytes);
    /* Waits until the job is done and frees it. */
    void (*wait)(void *job);
    /* Bytes the job has faulted in so far from its `from` on: read from any thread. */
    size_t (*done)(const void *job);
};
struct xbig_prefault {
    const struct xbig_prefaulter *with; /* NULL: at once, on the caller's */
    void *job;                          /* NULL when none is running */
};
/* Writes a zero byte to each page of bytes [from, bytes) of p, storing how many bytes from
 * `from` on are done in *done (may be NULL) after each page. What a prefaulter runs. */
void xbig_fault_in(void *p, size_t from, size_t bytes, atomic_size_t *done);
/* Starts faulting in bytes [from, bytes) of mapped array p; pf must have none running
 * (waited for, or just set up). The struct may be moved (copied) while it runs. */
void xbig_prefault_start(struct xbig_prefault *pf, void *p, size_t from, size_t bytes);
/* Waits until the running one, if any, is done and frees it. Before p is used, grown,
 * moved or freed. */
void xbig_prefault_wait(struct xbig_prefault *pf);
/* Bytes faulted in so far by the running one from its `from` on (0 when none runs): read
 * from any thread. */
size_t xbig_prefault_done(const struct xbig_prefault *pf);
bool xbig_prefault_running(const struct xbig_prefault *pf);

#endif
