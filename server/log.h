/* log: one-line, timestamped log records on stderr. Never pass a key or a token: log the
 * key_digest() and the fingerprint's fp_hex12() instead (docs/contract.md). */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

#include <stdint.h>

/* Sets the node id printed on every line. */
void log_set_node(uint64_t id);

/* The least severe level written (config log.level); lines below it are dropped. A minimal
 * hook for reloading the level (server/reload.c); LOG_LEVEL_INFO until set. */
enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };
void log_set_level(enum log_level level);

void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
