/* log: one-line, timestamped log records on stderr. Never pass a key or a token: log the
 * key_digest() and the fingerprint's fp_hex12() instead (docs/contract.md). */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

#include <stdint.h>

/* Sets the node id printed on every line. */
void log_set_node(uint64_t id);

void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
