#include "packed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *orDie(void *p)
{
    if (p == NULL) {
        fputs("bench: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

void pack_init(struct packed *p, size_t n, size_t *cap)
{
    *cap = n * 96 + 4096;
    p->buf = orDie(malloc(*cap));
    p->off = orDie(malloc((n + 1) * sizeof(size_t)));
    p->off[0] = 0;
    p->n = 0;
}

void pack_append(struct packed *p, size_t *cap, const Idem__Command *cmd)
{
    size_t need = idem__command__get_packed_size(cmd);
    size_t at = p->off[p->n];
    if (at + need > *cap) {
        while (at + need > *cap) {
            *cap *= 2;
        }
        p->buf = orDie(realloc(p->buf, *cap));
    }
    idem__command__pack(cmd, p->buf + at);
    p->n++;
    p->off[p->n] = at + need;
}

void pack_free(struct packed *p)
{
    free(p->buf);
    free(p->off);
}

void pack_key(char *out, size_t cap, size_t i)
{
    snprintf(out, cap, "order-%010zu", i);
}

void pack_claims(struct packed *p, size_t n, const uint8_t *fp)
{
    size_t cap;
    pack_init(p, n, &cap);
    char key[32];
    for (size_t i = 0; i < n; i++) {
        pack_key(key, sizeof(key), i);
        Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
        c.tenant = "bench";
        c.key.data = (uint8_t *)key;
        c.key.len = strlen(key);
        c.fingerprint.data = (uint8_t *)fp;
        c.fingerprint.len = 32;
        c.lease_ms = 30000;
        c.ttl_ms = 86400000;
        Idem__Command cmd = IDEM__COMMAND__INIT;
        cmd.now_ms = 1700000000000ull + i / 1000;
        cmd.op_case = IDEM__COMMAND__OP_CLAIM;
        cmd.claim = &c;
        pack_append(p, &cap, &cmd);
    }
}
