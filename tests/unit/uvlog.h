/* uvlog: raft_uv itself (libraft linked as idemd links it, with the wrappers of
 * cluster/CMakeLists.txt) driven on a loop of its own in a test's directory: open, append,
 * close. Failures are cmocka assertions. */
#ifndef IDEM_TESTS_UVLOG_H
#define IDEM_TESTS_UVLOG_H

#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

struct uvlog {
    uv_loop_t loop;
    struct raft_uv_transport transport;
    struct raft_io io;
};

/* raft_uv on a fresh `dir` (empty: no snapshot, no entries) as server 1. */
void uvlog_open(struct uvlog *l, const char *dir);
/* One command entry of `term`, appended and durable before it returns. */
void uvlog_append_one(struct uvlog *l, raft_term term);
/* raft_uv and its loop closed, nothing left on the loop. */
void uvlog_close(struct uvlog *l);

#endif
