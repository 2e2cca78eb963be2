/* core_alone: a program linked against idem_core and nothing else (tests/unit/CMakeLists.txt,
 * unit.core_deps). That it links at all shows the deterministic core needs no library but
 * protobuf-c and xxhash; it uses a function of every object of the archive (fsm.c,
 * fsm_snapshot.c, key.c, and through them table.c, expiry.c, xmalloc.c), so that
 * each is pulled into the link. It then applies a claim, snapshots, restores and compares
 * digests, with time given in the command only. Exits 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"
#include "key.h"

static int fail(const char *what)
{
    fprintf(stderr, "core_alone: %s\n", what);
    return 1;
}

int main(void)
{
    static const char key[] = "order-1";
    if (key_validate((const uint8_t *)key, strlen(key), KEY_MAX_LEN) != KEY_OK) {
        return fail("key_validate refused a valid key");
    }
    uint8_t fp[FP_LEN];
    memset(fp, 7, sizeof(fp));
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    c.tenant = "t1";
    c.key.data = (uint8_t *)key;
    c.key.len = strlen(key);
    c.fingerprint.data = fp;
    c.fingerprint.len = sizeof(fp);
    c.lease_ms = 1000;
    c.ttl_ms = 10000;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = 1000;
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    uint8_t buf[256];
    size_t n = idem__command__get_packed_size(&cmd);
    if (n > sizeof(buf)) {
        return fail("command too large");
    }
    idem__command__pack(&cmd, buf);

    struct fsm *f = fsm_new();
    struct fsm_result r;
    if (fsm_apply(f, fsm_command_index(1, 0), buf, n, &r) != IDEM__OUTCOME__OUTCOME_ACQUIRED) {
        return fail("claim not acquired");
    }
    uint8_t *snap;
    size_t len;
    fsm_snapshot(f, &snap, &len);
    struct fsm *g = fsm_new();
    if (fsm_restore(g, snap, len, NULL) != 0) {
        return fail("restore failed");
    }
    uint8_t a[16], b[16];
    fsm_digest(f, a);
    fsm_digest(g, b);
    free(snap);
    fsm_close(f);
    fsm_close(g);
    return memcmp(a, b, sizeof(a)) == 0 ? 0 : fail("digests differ after a restore");
}
