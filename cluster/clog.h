/* clog: the cluster's log lines. The daemon sends them to its own log (clog_set_sink, in
 * cluster.h with the levels), so that they carry the time, the level and the node like every
 * other line; without a sink (the tests and benchmarks that link the cluster alone) they go
 * to stderr as "idemd: <level>: ...". Callable from any thread: the sink is set once, before
 * the cluster starts. Never pass a key or a token. */
#ifndef IDEM_CLUSTER_CLOG_H
#define IDEM_CLUSTER_CLOG_H

#include "cluster.h" /* enum clog_level, clog_set_sink */

void clog_line(enum clog_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define clog_info(...) clog_line(CLOG_INFO, __VA_ARGS__)
#define clog_warn(...) clog_line(CLOG_WARN, __VA_ARGS__)
#define clog_error(...) clog_line(CLOG_ERROR, __VA_ARGS__)

#endif
