#include "clog.h"

#include <stdarg.h>
#include <stdio.h>

static clog_sink clogSink;

void clog_set_sink(clog_sink sink)
{
    clogSink = sink;
}

void clog_line(enum clog_level level, const char *fmt, ...)
{
    char msg[1280]; /* logdir's messages take up to 1024 bytes */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (clogSink != NULL) {
        clogSink(level, msg);
        return;
    }
    static const char *const names[] = {"info", "warn", "error"};
    fprintf(stderr, "idemd: %s: %s\n", names[level], msg);
}
