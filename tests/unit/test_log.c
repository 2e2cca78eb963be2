/* Unit tests of server/log.c: the text and JSON lines, the journal's priority prefixes when
 * JOURNAL_STREAM names stderr, the level filter, and the request ids. stderr is a temporary
 * file during each test; what the test wrote is read back from it. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

struct capture {
    FILE *file;
    int saved; /* the real stderr */
    char text[16384];
};

static int setup(void **state)
{
    struct capture *c = calloc(1, sizeof(*c));
    c->file = tmpfile();
    assert_non_null(c->file);
    fflush(stderr);
    c->saved = dup(STDERR_FILENO);
    assert_true(dup2(fileno(c->file), STDERR_FILENO) >= 0);
    unsetenv("JOURNAL_STREAM");
    log_journal_detect();
    log_set_node(7);
    log_set_level(LOG_LEVEL_INFO);
    log_set_format(LOG_FORMAT_TEXT);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct capture *c = *state;
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    fclose(c->file);
    free(c);
    unsetenv("JOURNAL_STREAM");
    log_journal_detect();
    return 0;
}

/* What was written to stderr since the test began; stderr is the real one again after it,
 * so that the assertions' messages are seen. */
static const char *captured(struct capture *c)
{
    fflush(stderr);
    long end = lseek(STDERR_FILENO, 0, SEEK_CUR);
    dup2(c->saved, STDERR_FILENO);
    assert_true(end >= 0 && end < (long)sizeof c->text);
    ssize_t n = pread(fileno(c->file), c->text, (size_t)end, 0);
    assert_int_equal(n, end);
    c->text[n] = '\0';
    return c->text;
}

static size_t countLines(const char *s)
{
    size_t n = 0;
    for (; *s; s++) {
        n += *s == '\n';
    }
    return n;
}

/* JOURNAL_STREAM set to stderr's own device and inode, as systemd sets it. */
static void journalIsStderr(void)
{
    struct stat st;
    assert_int_equal(fstat(STDERR_FILENO, &st), 0);
    char v[64];
    snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", v, 1);
}

static void test_text_line(void **state)
{
    struct capture *c = *state;
    log_info("leader is now node %d", 3);
    log_info("two\nlines\r");
    log_at(LOG_LEVEL_WARN, "abc-123", "proxy: %s", "lease lost");
    const char *t = captured(c);
    /* 2024-01-02T03:04:05.678Z idemd[7] info leader is now node 3 */
    const char *first = strstr(t, " idemd[7] info leader is now node 3\n");
    assert_non_null(first);
    assert_int_equal(first - t, 24);
    assert_true(t[4] == '-' && t[10] == 'T' && t[19] == '.' && t[23] == 'Z');
    assert_non_null(strstr(t, " idemd[7] warn proxy: lease lost request_id=abc-123\n"));
    assert_non_null(strstr(t, " idemd[7] info two lines \n"));
    assert_int_equal(countLines(t), 3);
}

static void test_json_line(void **state)
{
    struct capture *c = *state;
    log_set_format(LOG_FORMAT_JSON);
    log_at(LOG_LEVEL_ERROR, "rid-1", "a \"quoted\" %s\twith a tab", "word");
    log_info("no request");
    const char *scope = log_request_enter("rpc-4-9");
    assert_null(scope);
    log_warn("in scope");
    log_request_leave(scope);
    log_info("bytes \xff\xfe and more"); /* not UTF-8 */
    const char *t = captured(c);
    assert_int_equal(countLines(t), 4);

    const char *line = t;
    const char *want_msg[] = {"a \"quoted\" word\twith a tab", "no request", "in scope",
                              "bytes ?? and more"};
    const char *want_level[] = {"error", "info", "warn", "info"};
    const char *want_rid[] = {"rid-1", NULL, "rpc-4-9", NULL};
    for (int i = 0; i < 4; i++) {
        const char *nl = strchr(line, '\n');
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)(nl - line), 0, &jerr);
        if (o == NULL) {
            fail_msg("line %d does not parse: %s", i, jerr.text);
        }
        assert_true(json_is_object(o));
        assert_string_equal(json_string_value(json_object_get(o, "msg")), want_msg[i]);
        assert_string_equal(json_string_value(json_object_get(o, "level")), want_level[i]);
        assert_int_equal(json_integer_value(json_object_get(o, "node")), 7);
        const char *when = json_string_value(json_object_get(o, "time"));
        assert_non_null(when);
        assert_int_equal(strlen(when), 24);
        assert_int_equal(when[23], 'Z');
        json_t *rid = json_object_get(o, "request_id");
        if (want_rid[i] == NULL) {
            assert_null(rid);
        } else {
            assert_string_equal(json_string_value(rid), want_rid[i]);
        }
        json_decref(o);
        line = nl + 1;
    }
}

static void test_journal_prefix(void **state)
{
    struct capture *c = *state;
    journalIsStderr();
    assert_true(log_journal_detect());
    log_set_level(LOG_LEVEL_DEBUG);
    log_debug("d");
    log_info("i");
    log_warn("w");
    log_error("e");
    log_at(LOG_LEVEL_INFO, "x-1", "r");
    log_set_format(LOG_FORMAT_JSON);
    log_warn("j");
    const char *t = captured(c);
    /* The priority, and no time of the line's own: the journal stamps it. */
    const char *want = "<7>idemd[7] debug d\n"
                       "<6>idemd[7] info i\n"
                       "<4>idemd[7] warn w\n"
                       "<3>idemd[7] error e\n"
                       "<6>idemd[7] info r request_id=x-1\n"
                       "<4>{\"time\":\"";
    assert_memory_equal(t, want, strlen(want));
    assert_non_null(strstr(t + strlen(want), "\",\"level\":\"warn\",\"node\":7,\"msg\":\"j\"}\n"));
}

/* Another stream than stderr (stderr redirected under a unit), or a malformed value: no
 * prefix. */
static void test_journal_other_stream(void **state)
{
    struct capture *c = *state;
    struct stat st;
    assert_int_equal(fstat(STDERR_FILENO, &st), 0);
    char v[64];
    snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", v, 1);
    assert_false(log_journal_detect());
    setenv("JOURNAL_STREAM", "garbage", 1);
    assert_false(log_journal_detect());
    snprintf(v, sizeof v, "%llu:%llux", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", v, 1);
    assert_false(log_journal_detect());
    log_info("plain");
    const char *t = captured(c);
    assert_true(t[0] >= '0' && t[0] <= '9');
    assert_non_null(strstr(t, "Z idemd[7] info plain\n"));
}

static void test_levels(void **state)
{
    struct capture *c = *state;
    assert_int_equal(log_get_level(), LOG_LEVEL_INFO);
    assert_false(log_enabled(LOG_LEVEL_DEBUG));
    assert_true(log_enabled(LOG_LEVEL_INFO));
    log_debug("hidden 1");
    log_info("shown 1");
    log_set_level(LOG_LEVEL_WARN);
    log_info("hidden 2");
    log_at(LOG_LEVEL_INFO, "r", "hidden 3");
    log_warn("shown 2");
    log_set_level(LOG_LEVEL_ERROR);
    log_warn("hidden 4");
    log_error("shown 3");
    log_set_level(LOG_LEVEL_DEBUG);
    assert_true(log_enabled(LOG_LEVEL_DEBUG));
    log_debug("shown 4");
    log_set_level((enum log_level)42); /* ignored */
    assert_int_equal(log_get_level(), LOG_LEVEL_DEBUG);
    const char *t = captured(c);
    assert_int_equal(countLines(t), 4);
    assert_null(strstr(t, "hidden"));
    assert_non_null(strstr(t, " info shown 1\n"));
    assert_non_null(strstr(t, " warn shown 2\n"));
    assert_non_null(strstr(t, " error shown 3\n"));
    assert_non_null(strstr(t, " debug shown 4\n"));

    enum log_level l = LOG_LEVEL_ERROR;
    assert_true(log_level_parse("debug", &l));
    assert_int_equal(l, LOG_LEVEL_DEBUG);
    assert_true(log_level_parse("warn", &l));
    assert_int_equal(l, LOG_LEVEL_WARN);
    assert_false(log_level_parse("warning", &l));
    assert_false(log_level_parse("", &l));
    assert_int_equal(l, LOG_LEVEL_WARN);
    assert_string_equal(log_level_name(LOG_LEVEL_INFO), "info");
    assert_string_equal(log_level_name(LOG_LEVEL_ERROR), "error");
}

static void test_rpc_id_and_scope(void **state)
{
    struct capture *c = *state;
    char id[LOG_RPC_ID_SIZE];
    log_rpc_id(id, 12, UINT64_MAX);
    assert_string_equal(id, "rpc-12-18446744073709551615");
    log_rpc_id(id, 0, 0);
    assert_string_equal(id, "rpc-0-0");
    log_rpc_id(id, UINT64_MAX, 1000000007);
    assert_string_equal(id, "rpc-18446744073709551615-1000000007");
    log_rpc_id(id, UINT64_MAX, UINT64_MAX); /* the longest: fits LOG_RPC_ID_SIZE */
    assert_string_equal(id, "rpc-18446744073709551615-18446744073709551615");
    const char *outer = log_request_enter("a");
    const char *inner = log_request_enter("b");
    assert_string_equal(inner, "a");
    assert_string_equal(log_request_current(), "b");
    log_info("in b");
    log_at(LOG_LEVEL_INFO, "z", "explicit");
    log_request_leave(inner);
    log_info("in a");
    log_request_leave(outer);
    assert_null(log_request_current());
    log_info("none");
    const char *t = captured(c);
    assert_non_null(strstr(t, " in b request_id=b\n"));
    assert_non_null(strstr(t, " explicit request_id=z\n"));
    assert_non_null(strstr(t, " in a request_id=a\n"));
    assert_non_null(strstr(t, " none\n"));
}

/* A message longer than the buffer is cut, and still one line. */
static void test_long_message(void **state)
{
    struct capture *c = *state;
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    log_at(LOG_LEVEL_INFO, "r-1", "%s", big);
    log_set_format(LOG_FORMAT_JSON);
    log_info("%s", big);
    const char *t = captured(c);
    assert_int_equal(countLines(t), 2);
    const char *second = strchr(t, '\n') + 1;
    json_error_t jerr;
    json_t *o = json_loadb(second, strlen(second) - 1, 0, &jerr);
    assert_non_null(o);
    assert_true(strlen(json_string_value(json_object_get(o, "msg"))) < sizeof big - 1);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_text_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal_other_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_levels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rpc_id_and_scope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_message, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
