/* log: one-line log records on stderr, in text or as one JSON object a line (log.format),
 * filtered by level (log.level, changeable while running). Never pass a key or a token: log
 * the key_digest() and the fingerprint's fp_hex12() instead (docs/contract.md).
 *
 * text: "TIME idemd[NODE] LEVEL message" and " request_id=ID" when the line concerns a
 * request; json: {"time", "level", "node", "msg", "request_id"}. When stderr is the journal
 * (JOURNAL_STREAM names its device and inode: log_journal_detect), every line starts with
 * its syslog priority, "<7>" (debug) to "<3>" (error) as sd-daemon(3) reads them, and a text
 * line has no time of its own (the journal stamps it).
 *
 * Callable from any thread; the level and format are read atomically. The request in scope
 * (log_request_enter) is per thread. */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };

/* Sets the node id printed on every line. */
void log_set_node(uint64_t id);

/* Lines below `level` are not written (default LOG_LEVEL_INFO). */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Whether a line at `level` is written: to skip building a costly debug line. */
bool log_enabled(enum log_level level);
void log_set_format(enum log_format format); /* default LOG_FORMAT_TEXT */

/* "debug", "info", "warn", "error" (the config's names) and back: parse returns false for
 * any other name and leaves *out alone. */
const char *log_level_name(enum log_level level);
bool log_level_parse(const char *name, enum log_level *out);

/* Reads JOURNAL_STREAM ("DEV:INODE", set by systemd for a unit whose stderr is the journal)
 * and compares it with stderr's: when they match, lines carry a priority prefix and text
 * lines no time. Returns whether they do; called once at start (again in tests). */
bool log_journal_detect(void);

void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line about the request `request_id` (an X-Request-Id, or an RPC request's "rpc-CONN-ID";
 * NULL: the request in scope, if any). The id is written as it is: pass only ids the node
 * made or checked (gateway.c's requestId takes [A-Za-z0-9-]{1,64}). */
void log_at(enum log_level level, const char *request_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The request being handled on this thread, for the lines written meanwhile without an id
 * of their own (log_info, ... and the cluster's lines): enter returns the previous one (NULL
 * if none), which leave restores. `request_id` is borrowed until then. */
const char *log_request_enter(const char *request_id);
void log_request_leave(const char *previous);
/* The request in scope on this thread, or NULL. */
const char *log_request_current(void);

/* The id of an RPC request for the log: "rpc-CONN-ID", CONN the node's serial number of the
 * connection it came on, ID the request_id the client chose. */
#define LOG_RPC_ID_SIZE 48
void log_rpc_id(char out[LOG_RPC_ID_SIZE], uint64_t conn, uint64_t request_id);

#endif
