/* fuzz_config: config_parse() on an untrusted YAML text (a node's configuration file).
 *
 * Invariants (abort() on violation):
 * - a failure returns -1, leaves *out zeroed, and writes one NUL-terminated message that
 *   starts with the file name; with a 1-byte and a short buffer the message is truncated,
 *   still NUL-terminated, and the result is the same;
 * - a success fills what the header promises (a data_dir, at least one tenant with at
 *   least one token hash, heartbeat < election, default deadline <= max);
 * - config_free() zeroes the struct, and freeing twice is safe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.yaml"

static void fail(const char *what, const char *err)
{
    fprintf(stderr, "fuzz_config: invariant violated: %s\n", what);
    if (err != NULL) {
        fprintf(stderr, "message: %s\n", err);
    }
    abort();
}

static int isZero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static void checkLoaded(const struct config *c)
{
    if (c->node.data_dir == NULL || c->node.data_dir[0] == '\0') {
        fail("loaded without a data_dir", NULL);
    }
    if (c->node.id == 0) {
        fail("loaded with node id 0", NULL);
    }
    if (c->tenants == NULL || c->n_tenants == 0) {
        fail("loaded without a tenant", NULL);
    }
    for (size_t i = 0; i < c->n_tenants; i++) {
        const struct config_tenant *t = &c->tenants[i];
        size_t nl = strnlen(t->name, sizeof t->name);
        if (nl == 0 || nl > CONFIG_TENANT_NAME_MAX) {
            fail("loaded a tenant name that is empty or not NUL-terminated", NULL);
        }
        if (t->token_hashes == NULL || t->n_token_hashes == 0) {
            fail("loaded a tenant without a token hash", NULL);
        }
        if (config_tenant_by_token_hash(c, t->token_hashes[0]) == NULL) {
            fail("a tenant's own token hash does not find a tenant", NULL);
        }
        if (config_is_admin_hash(c, t->token_hashes[0])) {
            fail("a tenant token hash equals the admin hash", NULL);
        }
    }
    if (c->raft.heartbeat_timeout_ms >= c->raft.election_timeout_ms) {
        fail("heartbeat timeout not below the election timeout", NULL);
    }
    if (c->rpc.default_deadline_ms > c->rpc.max_deadline_ms) {
        fail("default deadline above the max deadline", NULL);
    }
    if (c->tls.enabled != (c->tls.cert_file != NULL)) {
        fail("tls.enabled does not match the files", NULL);
    }
    if ((c->cluster.n_bootstrap == 0) != (c->cluster.bootstrap == NULL)) {
        fail("bootstrap array and count disagree", NULL);
    }
    if (c->cluster.n_bootstrap > 0) {
        size_t self = 0;
        for (size_t i = 0; i < c->cluster.n_bootstrap; i++) {
            self += c->cluster.bootstrap[i].id == c->node.id;
        }
        if (self != 1) {
            fail("bootstrap list does not hold this node's id exactly once", NULL);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy, without a NUL: config_parse() takes a length. */
    char *text = malloc(size ? size : 1);
    if (text == NULL) {
        abort();
    }
    memcpy(text, data, size);

    struct config c;
    char err[512];
    memset(err, 'x', sizeof err);
    int rc = config_parse(NAME, text, size, &c, err, sizeof err);
    if (rc == 0) {
        checkLoaded(&c);
    } else {
        if (rc != -1) {
            fail("config_parse returned neither 0 nor -1", NULL);
        }
        if (memchr(err, '\0', sizeof err) == NULL) {
            fail("error message not NUL-terminated", NULL);
        }
        if (strncmp(err, NAME ":", strlen(NAME) + 1) != 0) {
            fail("error message does not start with the file name", err);
        }
        if (!isZero(&c, sizeof c)) {
            fail("a failed parse left *out not zeroed", err);
        }
    }
    config_free(&c);
    if (!isZero(&c, sizeof c)) {
        fail("config_free did not zero the struct", NULL);
    }
    config_free(&c);

    /* The same text with small error buffers: truncated, terminated, the same answer. */
    char small[8];
    memset(small, 'x', sizeof small);
    struct config c2;
    if (config_parse(NAME, text, size, &c2, small, sizeof small) != rc) {
        fail("the result depends on the size of the error buffer", NULL);
    }
    if (memchr(small, '\0', sizeof small) == NULL) {
        fail("short error buffer not NUL-terminated", NULL);
    }
    if (rc != 0 && strncmp(small, err, sizeof small - 1) != 0) {
        fail("short error message is not a prefix of the full one", err);
    }
    config_free(&c2);
    char one = 'x';
    if (config_parse(NAME, text, size, &c2, &one, 1) != rc || one != '\0') {
        fail("a 1-byte error buffer is not left as the empty string", NULL);
    }
    config_free(&c2);
    free(text);
    return 0;
}
