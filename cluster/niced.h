/* niced: runs CPU work that must not take the cores the event loops need at a lower CPU
 * priority. A snapshot's serialisation is that work: a second or more of one core at a
 * million records, and at normal priority it took a share of the two cores from the three
 * nodes' loops, whose requests waited (docs/benchmarks.md). At nice 19 it runs on what the loops
 * leave. Only for work that takes no lock the loops may wait for: a thread at nice 19 can
 * wait long for a core while holding it (the snapshot's disk writes, which take the
 * filesystem's locks and journal, are not run this way). */
#ifndef IDEM_CLUSTER_NICED_H
#define IDEM_CLUSTER_NICED_H

/* Runs fn(arg) on a thread of its own whose nice value is the caller's plus `nice` (the
 * increment at most 19, the result at most 19, the lowest priority; Linux keeps a nice value
 * per thread, and the caller's stays as it is), and waits for it; on the calling thread when
 * `nice` is 0 or no thread can be started. *ran_at (when not NULL) gets the nice value fn
 * ran at, read back. Returns fn's value. */
int niced_run(unsigned nice, int *ran_at, int (*fn)(void *arg), void *arg);

#endif
