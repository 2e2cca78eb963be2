#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static uint64_t logNode;
static enum log_level logLevel = LOG_LEVEL_INFO; /* the loop's thread sets it, at start and on
                                                  * a reload (server/reload.c) */

void log_set_node(uint64_t id)
{
    logNode = id;
}

void log_set_level(enum log_level level)
{
    logLevel = level;
}

static void logLine(const char *level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void logLine(const char *level, const char *fmt, va_list ap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    char msg[1536]; /* the cluster's longest (clog.c) fit whole */
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "%s.%03ldZ idemd[%llu] %s %s\n", when, ts.tv_nsec / 1000000,
            (unsigned long long)logNode, level, msg);
}

#define LOG_FN(name, level, rank)                                                                  \
    void name(const char *fmt, ...)                                                                \
    {                                                                                              \
        if ((rank) < logLevel) {                                                                   \
            return;                                                                                \
        }                                                                                          \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        logLine(level, fmt, ap);                                                                   \
        va_end(ap);                                                                                \
    }

LOG_FN(log_info, "info", LOG_LEVEL_INFO)
LOG_FN(log_warn, "warn", LOG_LEVEL_WARN)
LOG_FN(log_error, "error", LOG_LEVEL_ERROR)
