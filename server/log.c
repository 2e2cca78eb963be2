#include "log.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dec.h"

static _Atomic uint64_t logNode;
static _Atomic int logLevel = LOG_LEVEL_INFO;
static _Atomic int logFormat = LOG_FORMAT_TEXT;
static _Atomic bool logJournal;
static _Thread_local const char *logRequest;

static const char *const levelNames[] = {"debug", "info", "warn", "error"};
/* syslog(3) priorities, as journald reads them from a "<N>" prefix (sd-daemon(3)). */
static const int levelPriorities[] = {7, 6, 4, 3};

void log_set_node(uint64_t id)
{
    atomic_store(&logNode, id);
}

void log_set_level(enum log_level level)
{
    if (level >= LOG_LEVEL_DEBUG && level <= LOG_LEVEL_ERROR) {
        atomic_store(&logLevel, (int)level);
    }
}

enum log_level log_get_level(void)
{
    return (enum log_level)atomic_load(&logLevel);
}

bool log_enabled(enum log_level level)
{
    return (int)level >= atomic_load(&logLevel);
}

void log_set_format(enum log_format format)
{
    atomic_store(&logFormat, (int)format);
}

const char *log_level_name(enum log_level level)
{
    return level >= LOG_LEVEL_DEBUG && level <= LOG_LEVEL_ERROR ? levelNames[level] : "?";
}

bool log_level_parse(const char *name, enum log_level *out)
{
    for (int i = LOG_LEVEL_DEBUG; i <= LOG_LEVEL_ERROR; i++) {
        if (strcmp(name, levelNames[i]) == 0) {
            *out = (enum log_level)i;
            return true;
        }
    }
    return false;
}

bool log_journal_detect(void)
{
    bool on = false;
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    if (js != NULL && fstat(STDERR_FILENO, &st) == 0) {
        char *end;
        unsigned long long dev = strtoull(js, &end, 10);
        if (end != js && *end == ':') {
            const char *p = end + 1;
            unsigned long long ino = strtoull(p, &end, 10);
            on = end != p && *end == '\0' && dev == (unsigned long long)st.st_dev &&
                 ino == (unsigned long long)st.st_ino;
        }
    }
    atomic_store(&logJournal, on);
    return on;
}

const char *log_request_enter(const char *request_id)
{
    const char *prev = logRequest;
    logRequest = request_id;
    return prev;
}

void log_request_leave(const char *previous)
{
    logRequest = previous;
}

const char *log_request_current(void)
{
    return logRequest;
}

void log_rpc_id(char out[LOG_RPC_ID_SIZE], uint64_t conn, uint64_t request_id)
{
    /* One per RPC request: by hand, not through printf's machinery. "rpc-", two numbers of
     * at most DEC_U64_MAX digits, '-' and the NUL fit LOG_RPC_ID_SIZE. */
    _Static_assert(LOG_RPC_ID_SIZE >= 4 + 2 * DEC_U64_MAX + 2, "LOG_RPC_ID_SIZE");
    memcpy(out, "rpc-", 4);
    size_t n = 4;
    n += dec_u64(out + n, conn);
    out[n++] = '-';
    n += dec_u64(out + n, request_id);
    out[n] = '\0';
}

/* A JSON string of s, which may not be UTF-8 (a file name, a message cut by its buffer):
 * then every byte outside ASCII becomes '?'. */
static json_t *jsonText(char *s)
{
    json_t *j = json_string(s);
    if (j == NULL) {
        for (char *p = s; *p; p++) {
            if ((unsigned char)*p >= 0x80) {
                *p = '?';
            }
        }
        j = json_string(s);
    }
    return j;
}

static void writeJson(const char *prefix, const char *when, enum log_level level, char *msg,
                      const char *rid)
{
    json_t *o = json_object();
    json_object_set_new(o, "time", json_string(when));
    json_object_set_new(o, "level", json_string(levelNames[level]));
    json_object_set_new(o, "node", json_integer((json_int_t)atomic_load(&logNode)));
    json_object_set_new(o, "msg", jsonText(msg));
    if (rid != NULL) {
        char r[80];
        snprintf(r, sizeof r, "%s", rid);
        json_object_set_new(o, "request_id", jsonText(r));
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s == NULL) {
        return;
    }
    size_t np = strlen(prefix), ns = strlen(s);
    char *line = malloc(np + ns + 2);
    if (line != NULL) {
        memcpy(line, prefix, np);
        memcpy(line + np, s, ns);
        line[np + ns] = '\n';
        fwrite(line, 1, np + ns + 1, stderr);
        free(line);
    }
    free(s);
}

static void logLine(enum log_level level, const char *rid, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void logLine(enum log_level level, const char *rid, const char *fmt, va_list ap)
{
    if (!log_enabled(level)) {
        return;
    }
    if (rid == NULL) {
        rid = logRequest;
    }
    char msg[1536]; /* the cluster's longest (clog.c) fit whole */
    vsnprintf(msg, sizeof(msg), fmt, ap);
    for (char *p = msg; *p; p++) { /* one record, one line (the journal splits at newlines) */
        if (*p == '\n' || *p == '\r') {
            *p = ' ';
        }
    }
    bool journal = atomic_load(&logJournal);
    char prefix[8] = "";
    if (journal) {
        snprintf(prefix, sizeof prefix, "<%d>", levelPriorities[level]);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof(when) - n, ".%03ldZ", ts.tv_nsec / 1000000);
    if (atomic_load(&logFormat) == LOG_FORMAT_JSON) {
        writeJson(prefix, when, level, msg, rid);
        return;
    }
    char line[sizeof msg + 256];
    int len =
        snprintf(line, sizeof line, "%s%s%sidemd[%" PRIu64 "] %s %s%s%s\n", prefix,
                 journal ? "" : when, journal ? "" : " ", atomic_load(&logNode), levelNames[level],
                 msg, rid != NULL ? " request_id=" : "", rid != NULL ? rid : "");
    if (len >= (int)sizeof line) { /* cut: still one line */
        len = (int)sizeof line - 1;
        line[len - 1] = '\n';
    }
    if (len > 0) {
        fwrite(line, 1, (size_t)len, stderr);
    }
}

void log_at(enum log_level level, const char *request_id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    logLine(level, request_id, fmt, ap);
    va_end(ap);
}

#define LOG_FN(name, level)                                                                        \
    void name(const char *fmt, ...)                                                                \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        logLine(level, NULL, fmt, ap);                                                             \
        va_end(ap);                                                                                \
    }

LOG_FN(log_debug, LOG_LEVEL_DEBUG)
LOG_FN(log_info, LOG_LEVEL_INFO)
LOG_FN(log_warn, LOG_LEVEL_WARN)
LOG_FN(log_error, LOG_LEVEL_ERROR)
