/* prefault_thread: the daemon's xbig_prefaulter (xmalloc.h), which faults an array's pages
 * in on a thread of its own at the lowest CPU priority. Outside the deterministic core: the
 * service passes it to the state machine (fsm_new_with). */
#ifndef IDEM_SERVER_PREFAULT_THREAD_H
#define IDEM_SERVER_PREFAULT_THREAD_H

#include "xmalloc.h"

/* Each job is a thread at nice 19 above the caller's: it runs on what the loops leave, and
 * it takes no lock a loop waits for (a page fault takes the lock of its own mapping only,
 * and nothing else uses the array until the wait). Started with every signal blocked. When
 * the thread cannot be created the pages are faulted in at once on the caller's. */
extern const struct xbig_prefaulter prefault_thread;

#endif
