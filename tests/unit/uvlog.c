/* uvlog: raft_uv driven on a loop of its own (uvlog.h). */
#include "uvlog.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static bool appended, closed;

static void appendCb(struct raft_io_append *req, int status)
{
    (void)req;
    assert_int_equal(status, 0);
    appended = true;
}

static void closeCb(struct raft_io *io)
{
    (void)io;
    closed = true;
}

void uvlog_open(struct uvlog *l, const char *dir)
{
    *l = (struct uvlog){0};
    assert_int_equal(uv_loop_init(&l->loop), 0);
    assert_int_equal(raft_uv_tcp_init(&l->transport, &l->loop), 0);
    assert_int_equal(raft_uv_init(&l->io, &l->loop, dir, &l->transport), 0);
    assert_int_equal(l->io.init(&l->io, 1, "127.0.0.1:9"), 0);
    raft_term term;
    raft_id vote;
    struct raft_snapshot *snap;
    raft_index start;
    struct raft_entry *loaded;
    size_t n;
    assert_int_equal(l->io.load(&l->io, &term, &vote, &snap, &start, &loaded, &n), 0);
    assert_null(snap);
    assert_int_equal(n, 0);
}

void uvlog_append_one(struct uvlog *l, raft_term term)
{
    static uint8_t payload[8] = "command";
    struct raft_entry e = {.term = term, .type = RAFT_COMMAND};
    e.buf.base = payload;
    e.buf.len = sizeof payload;
    struct raft_io_append req = {0};
    appended = false;
    assert_int_equal(l->io.append(&l->io, &req, &e, 1, appendCb), 0);
    for (int i = 0; i < 1000 && !appended; i++) {
        uv_run(&l->loop, UV_RUN_ONCE);
    }
    assert_true(appended);
}

void uvlog_close(struct uvlog *l)
{
    closed = false;
    l->io.close(&l->io, closeCb);
    for (int i = 0; i < 1000 && !closed; i++) {
        uv_run(&l->loop, UV_RUN_ONCE);
    }
    assert_true(closed);
    raft_uv_close(&l->io);
    raft_uv_tcp_close(&l->transport);
    assert_int_equal(uv_run(&l->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&l->loop), 0);
}
