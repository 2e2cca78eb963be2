/* libraft 0.15's raft_uv itself under the I/O wrapper (cluster/raft015/io*.c), in a temporary
 * directory: a truncation asked while raft_uv holds a snapshot put. raft_uv alone never
 * runs it (its barrier never fires: canonical/raft #372, fixed after 0.15) and writes the
 * next entries on, so that the next load refuses the log; the wrapper holds the truncation
 * and the appends after it until the put has called back. And raft_uv's checksums through
 * ISA-L (cluster/raft015/bytecrc.h) are libraft's own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "bytecrc.h"
#include "io.h"
#include "tmpdir.h"

/* libraft's own byteCrc32 (the linker's --wrap names it so). */
uint32_t __real_byteCrc32(const void *buf, size_t size, uint32_t init);

static char dir[64];
static uv_loop_t loop;
static struct raft_uv_transport transport;
static struct io theIo;
static int pending; /* appends and puts not called back */
static bool closed;
static raft_index loadedStart; /* the index of the first entry the last load gave */

static int setup(void **state)
{
    (void)state;
    return tmpdir_make(dir, sizeof(dir), "idem-raft-uv");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_remove(dir);
}

static void appendCb(struct raft_io_append *req, int status)
{
    assert_int_equal(status, 0);
    free(req);
    pending--;
}

static void putCb(struct raft_io_snapshot_put *req, int status)
{
    (void)req;
    assert_int_equal(status, 0);
    pending--;
}

static void closeCb(struct raft_io *io)
{
    (void)io;
    closed = true;
}

static uint8_t payload[8] = "command";
static struct raft_entry entries[32];
static int nEntries;

static void appendOne(raft_term term)
{
    struct raft_io_append *req = calloc(1, sizeof(*req));
    assert_non_null(req);
    assert_true(nEntries < 32);
    struct raft_entry *e = &entries[nEntries++];
    *e = (struct raft_entry){.term = term, .type = RAFT_COMMAND};
    e->buf.base = payload;
    e->buf.len = sizeof(payload);
    pending++;
    assert_int_equal(theIo.outer.append(&theIo.outer, req, e, 1, appendCb), 0);
}

static void runUntilDone(void)
{
    for (int i = 0; i < 5000 && pending > 0; i++) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_int_equal(pending, 0);
}

/* Opens the wrapper over raft_uv in dir and loads; the terms of the entries loaded go to
 * terms (their count returned), or -1 when the load fails. */
static int openIo(raft_term terms[], int cap)
{
    memset(&transport, 0, sizeof(transport));
    memset(&theIo, 0, sizeof(theIo));
    assert_int_equal(raft_uv_tcp_init(&transport, &loop), 0);
    assert_int_equal(raft_uv_init(&theIo.inner, &loop, dir, &transport), 0);
    io_wrap(&theIo, &loop);
    theIo.log_dir = dir;
    assert_int_equal(theIo.outer.init(&theIo.outer, 1, "127.0.0.1:9"), 0);
    raft_term term;
    raft_id vote;
    struct raft_snapshot *snap = NULL;
    raft_index start;
    struct raft_entry *loaded = NULL;
    size_t n = 0;
    if (theIo.outer.load(&theIo.outer, &term, &vote, &snap, &start, &loaded, &n) != 0) {
        print_message("load: %s\n", theIo.outer.errmsg);
        return -1;
    }
    loadedStart = start;
    int k = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        terms[k++] = loaded[i].term;
    }
    void *batch = NULL;
    for (size_t i = 0; i < n; i++) {
        if (loaded[i].batch != batch) {
            batch = loaded[i].batch;
            raft_free(batch);
        }
    }
    raft_free(loaded);
    if (snap != NULL) {
        raft_configuration_close(&snap->configuration);
        for (unsigned i = 0; i < snap->n_bufs; i++) {
            raft_free(snap->bufs[i].base);
        }
        raft_free(snap->bufs);
        raft_free(snap);
    }
    return k;
}

static void closeIo(void)
{
    closed = false;
    theIo.outer.close(&theIo.outer, closeCb);
    for (int i = 0; i < 5000 && !closed; i++) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    assert_true(closed);
    raft_uv_close(&theIo.inner);
    raft_uv_tcp_close(&transport);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
}

static void test_truncation_during_a_snapshot_put(void **state)
{
    (void)state;
    assert_int_equal(uv_loop_init(&loop), 0);
    raft_term terms[32];
    struct raft_configuration conf;
    raft_configuration_init(&conf);
    assert_int_equal(raft_configuration_add(&conf, 1, "127.0.0.1:9", RAFT_VOTER), 0);

    assert_int_equal(openIo(terms, 32), 0);
    assert_int_equal(theIo.outer.bootstrap(&theIo.outer, &conf), 0); /* entry 1 */
    closeIo();
    assert_int_equal(openIo(terms, 32), 1);
    nEntries = 0;
    for (int i = 0; i < 7; i++) { /* 2..8, term 1 */
        appendOne(1);
        runUntilDone();
    }
    /* A snapshot at 6, keeping 2 entries (raft's own: raft_uv puts a barrier on the open
     * segments), then entry 9 while the put waits; then raft learns that the leader's log
     * differs from 8 on: truncation from 8, entries 8 and 9 of term 2. */
    static char data[16] = "snapshot";
    struct raft_buffer buf = {.base = data, .len = sizeof(data)};
    struct raft_snapshot snap = {.index = 6,
                                 .term = 1,
                                 .configuration = conf,
                                 .configuration_index = 1,
                                 .bufs = &buf,
                                 .n_bufs = 1};
    struct raft_io_snapshot_put put;
    memset(&put, 0, sizeof(put));
    pending++;
    assert_int_equal(theIo.outer.snapshot_put(&theIo.outer, 2, &put, &snap, putCb), 0);
    appendOne(1);
    assert_int_equal(theIo.outer.truncate(&theIo.outer, 8), 0);
    assert_int_equal(theIo.truncs_held, 1);
    appendOne(2);
    appendOne(2);
    runUntilDone();
    closeIo();

    /* The log as raft has it: entries up to 7 of term 1 (raft_uv keeps some the snapshot
     * covers), then 8 and 9 of term 2. */
    int n = openIo(terms, 32);
    assert_true(n >= 3);
    assert_int_equal(loadedStart + (raft_index)n - 1, 9);
    assert_int_equal(terms[n - 3], 1);
    assert_int_equal(terms[n - 2], 2);
    assert_int_equal(terms[n - 1], 2);
    closeIo();
    raft_configuration_close(&conf);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* The CRC bit by bit, as its definition says: non-reflected, polynomial 0x04C11DB7, the
 * initial value given, no final inversion. */
static uint32_t crcBitwise(const uint8_t *p, size_t n, uint32_t crc)
{
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint32_t)p[i] << 24;
        for (int b = 0; b < 8; b++) {
            crc = crc & 0x80000000u ? crc << 1 ^ 0x04C11DB7u : crc << 1;
        }
    }
    return crc;
}

/* Segments and snapshot files written by libraft's checksum load with ISA-L's, and back:
 * every length 0..300 and some long ones, at every alignment mod 8, with initial values
 * 0, all ones and random ones (raft_uv chains them over a batch's buffers). */
static void test_checksums_are_libraft_s(void **state)
{
    (void)state;
    size_t cap = (1u << 20) + 64;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < cap; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    assert_int_equal(__wrap_byteCrc32("123456789", 9, 0xffffffffu), 0x0376E6E7u);
    for (size_t len = 0; len <= 300; len++) {
        uint32_t init = len % 3 == 0 ? 0 : len % 3 == 1 ? 0xffffffffu : (uint32_t)(x >> len % 32);
        const uint8_t *p = buf + len % 8;
        uint32_t want = __real_byteCrc32(p, len, init);
        assert_int_equal(__wrap_byteCrc32(p, len, init), want);
        assert_int_equal(crcBitwise(p, len, init), want);
    }
    static const size_t longs[] = {4095, 4096, 65536 + 3, 1u << 20};
    for (size_t i = 0; i < sizeof(longs) / sizeof(longs[0]); i++) {
        uint32_t want = __real_byteCrc32(buf + i, longs[i], (uint32_t)i * 0x01010101u);
        assert_int_equal(__wrap_byteCrc32(buf + i, longs[i], (uint32_t)i * 0x01010101u), want);
        /* Chained over two pieces, as over a header and its data. */
        uint32_t half = __wrap_byteCrc32(buf + i, longs[i] / 2, (uint32_t)i * 0x01010101u);
        assert_int_equal(__wrap_byteCrc32(buf + i + longs[i] / 2, longs[i] - longs[i] / 2, half),
                         want);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_truncation_during_a_snapshot_put, setup, teardown),
        cmocka_unit_test(test_checksums_are_libraft_s),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
