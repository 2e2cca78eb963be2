/* niced: runs CPU work that must not take the cores the event loops need at a lower CPU
 * priority. Snapshots are that work: serialising one and copying it into the page cache is a
 * second or more of one core at a million records, and at normal priority it took a share of
 * the two cores from the three nodes' loops, whose requests waited (README, Limits). At
 * nice 19 it runs on what the loops leave. */
#ifndef IDEM_CLUSTER_NICED_H
#define IDEM_CLUSTER_NICED_H

/* Runs fn(arg) on a thread of its own whose nice value is the caller's plus `nice` (the
 * increment at most 19, the result at most 19, the lowest priority; Linux keeps a nice value
 * per thread, and the caller's stays as it is), and waits for it; on the calling thread when
 * `nice` is 0 or no thread can be started. Returns fn's value. */
int niced_run(unsigned nice, int (*fn)(void *arg), void *arg);

#endif
