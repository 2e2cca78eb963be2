/* Unit tests of proto/arena.c: the bump allocator messages are decoded into (the state
 * machine's commands, the cluster's log entries, the RPC listener's requests). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "arena.h"
#include "idem.pb-c.h"

/* Under AddressSanitizer, a malloc that cannot be served returns NULL (as glibc's does)
 * instead of ending the test: test_a_soft_arena_refuses_what_malloc_refuses needs one. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

/* A packed Command whose key is n bytes long: a message that needs about n bytes decoded. */
static uint8_t *packedCommand(size_t n, size_t *len)
{
    Idem__Command cmd = IDEM__COMMAND__INIT;
    Idem__ClaimCmd claim = IDEM__CLAIM_CMD__INIT;
    uint8_t *key = test_malloc(n);
    memset(key, 'k', n);
    claim.key.data = key;
    claim.key.len = n;
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &claim;
    *len = idem__command__get_packed_size(&cmd);
    uint8_t *buf = test_malloc(*len);
    idem__command__pack(&cmd, buf);
    test_free(key);
    return buf;
}

static void decodeOnce(struct arena *a, size_t key_len)
{
    size_t len;
    uint8_t *buf = packedCommand(key_len, &len);
    arena_reset(a);
    Idem__Command *cmd = idem__command__unpack(&a->pb, len, buf);
    assert_non_null(cmd);
    assert_int_equal(cmd->claim->key.len, key_len);
    assert_int_equal(cmd->claim->key.data[key_len - 1], 'k');
    test_free(buf);
}

/* Within the buffer: every allocation comes from it, and nothing grows. */
static void test_small_messages_stay_in_the_buffer(void **state)
{
    (void)state;
    struct arena a;
    arena_init(&a, 4096);
    for (int i = 0; i < 100; i++) {
        decodeOnce(&a, 100);
        assert_null(a.big);
        assert_true(a.used > 100);
    }
    arena_reset(&a);
    assert_int_equal(a.cap, 4096);
    arena_close(&a);
}

/* A message larger than the buffer decodes through blocks of its own, freed at the reset,
 * which grows the buffer (doubling) so that the next one fits; never past 1 MiB. */
static void test_a_large_message_grows_the_buffer(void **state)
{
    (void)state;
    struct arena a;
    arena_init(&a, 4096);
    decodeOnce(&a, 20000);
    assert_non_null(a.big);
    arena_reset(&a);
    assert_null(a.big);
    assert_int_equal(a.cap, 32768);
    decodeOnce(&a, 20000);
    assert_null(a.big); /* it fits now */
    decodeOnce(&a, 3u << 20);
    assert_non_null(a.big);
    arena_reset(&a);
    assert_int_equal(a.cap, 1u << 20);
    decodeOnce(&a, 3u << 20);
    arena_reset(&a);
    assert_int_equal(a.cap, 1u << 20);
    arena_close(&a);
    assert_null(a.buf);
}

/* A soft arena (the RPC listener's) answers NULL for what malloc refuses, or what does not
 * fit a size_t, and keeps working; its buffer stays as it was. */
static void test_a_soft_arena_refuses_what_malloc_refuses(void **state)
{
    (void)state;
    struct arena a;
    arena_init(&a, 4096);
    a.soft = true;
    void *p = a.pb.alloc(a.pb.allocator_data, 100);
    assert_non_null(p);
    assert_null(a.pb.alloc(a.pb.allocator_data, (size_t)1 << 62));
    assert_null(a.pb.alloc(a.pb.allocator_data, SIZE_MAX));
    assert_null(a.pb.alloc(a.pb.allocator_data, SIZE_MAX - 8));
    assert_null(a.big);
    arena_reset(&a);
    assert_int_equal(a.cap, 4096);
    decodeOnce(&a, 100); /* still decodes */
    arena_close(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_messages_stay_in_the_buffer),
        cmocka_unit_test(test_a_large_message_grows_the_buffer),
        cmocka_unit_test(test_a_soft_arena_refuses_what_malloc_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
