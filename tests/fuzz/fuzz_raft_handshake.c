/* fuzz_raft_handshake: the bytes of a Raft connection's handshake (cluster/handshake.h), as
 * cluster/transport.c reads them from a peer: a listener reading a connector's handshake
 * (raft_uv_tcp's preamble, the address, then with a secret the connector's answer: nonce_c
 * and its MACs), and a connector reading the listener's greeting and answer.
 *
 * Input: byte 0 holds flags: bit 0 a secret is set; bit 1 two keys (the current secret and the
 * previous one); bit 2 plant the connector's right MAC (the key by bit 3, the slot by bit 4),
 * made as transport.h says; bit 5 plant the listener's right answer (bit 6: a refusal as
 * another node instead); byte 1 seeds the sizes of the reads. The rest is what the connector
 * sends (the listener takes only the handshake's bytes, as transport.c leaves the rest in the
 * socket), then what the listener sends: the greeting, then its answer.
 *
 * Invariants (abort() on violation):
 * - the listener's reading gives the same result (read or refused, with the same reason and
 *   the same bytes taken) however the bytes arrive: in reads of random sizes or each part
 *   whole; handshake_room() offers exactly what the part lacks, inside the struct;
 * - it agrees with a reference reading of raft_uv_tcp's handshake: refused for a protocol
 *   other than 1, an address length of 0 or more than TRANSPORT_ADDRESS_MAX, an address
 *   without a NUL; else read, with the preamble's ID and the address, and the connector's
 *   answer after it when a secret is set; a refusal says which of the three rules broke,
 *   with the same text (the same pointer) however the bytes arrived;
 * - the listener's MAC check agrees with a reference HMAC of transport.h's message: it names
 *   the newest key that made one of the connector's MACs for this node, and none when none
 *   did (a planted right MAC is found); a nonce names a target exactly when it starts with
 *   TRANSPORT_TARGET_MAGIC;
 * - the connector takes a greeting exactly when it starts with TRANSPORT_AUTH_MAGIC, and
 *   judges the listener's answer as the reference does: its MAC under one of our keys, a
 *   refusal as another node (an ID other than the one asked for) under one of them, or
 *   wrong (a planted right answer is taken). */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handshake.h"
#include "wire_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SELF_ID 2 /* the listener's ID; the connector is the preamble's */

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_raft_handshake: invariant violated: %s\n", what);
    abort();
}

/* ---- the reference, from transport.h ---------------------------------------------------- */

/* HMAC(key, label 0 nonce_l nonce_c id target [macs] address) of transport.h. */
static void refMac(const uint8_t *key, const char *label, const uint8_t *nonce_l,
                   const uint8_t *nonce_c, uint64_t id, uint64_t target, const uint8_t *macs,
                   const char *address, uint8_t out[TRANSPORT_MAC_LEN])
{
    uint8_t msg[1024];
    size_t n = 0;
    memcpy(msg + n, label, strlen(label) + 1);
    n += strlen(label) + 1;
    memcpy(msg + n, nonce_l, TRANSPORT_NONCE_LEN);
    n += TRANSPORT_NONCE_LEN;
    memcpy(msg + n, nonce_c, TRANSPORT_NONCE_LEN);
    n += TRANSPORT_NONCE_LEN;
    for (int i = 0; i < 8; i++) {
        msg[n++] = (uint8_t)(id >> (8 * i));
    }
    for (int i = 0; i < 8; i++) {
        msg[n++] = (uint8_t)(target >> (8 * i));
    }
    if (macs != NULL) {
        memcpy(msg + n, macs, TRANSPORT_KEYS_MAX * TRANSPORT_MAC_LEN);
        n += TRANSPORT_KEYS_MAX * TRANSPORT_MAC_LEN;
    }
    size_t al = strnlen(address, TRANSPORT_ADDRESS_MAX);
    memcpy(msg + n, address, al);
    n += al;
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), key, TRANSPORT_MAC_LEN, msg, n, out, &len) == NULL ||
        len != TRANSPORT_MAC_LEN) {
        abort();
    }
}

/* 1 + the newest key whose connector MAC for (id, target) is among the answer's; 0: none. */
static size_t refConnectorKey(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                              const uint8_t *nonce_l, const uint8_t *answer, uint64_t id,
                              uint64_t target, const char *address)
{
    for (size_t k = 0; k < n_keys; k++) {
        uint8_t mac[TRANSPORT_MAC_LEN];
        refMac(keys[k], "connector", nonce_l, answer, id, target, NULL, address, mac);
        for (size_t j = 0; j < TRANSPORT_KEYS_MAX; j++) {
            if (memcmp(mac, answer + TRANSPORT_NONCE_LEN + j * TRANSPORT_MAC_LEN, sizeof mac) ==
                0) {
                return k + 1;
            }
        }
    }
    return 0;
}

/* ---- the listener ----------------------------------------------------------------------- */

struct reading {
    enum handshake_status st;
    const char *why;
    size_t taken;
    struct handshake hs;
};

/* Reads a handshake from the n bytes at p as transport.c does (the room, a read, feed):
 * reads of sizes drawn from *rng (each part whole when rng is NULL). */
static void readHandshake(const uint8_t *p, size_t n, bool auth, uint32_t *rng, struct reading *r)
{
    handshake_init(&r->hs, auth);
    r->st = HANDSHAKE_MORE;
    r->why = NULL;
    r->taken = 0;
    const uint8_t *lo = (const uint8_t *)&r->hs, *hi = lo + sizeof r->hs;
    while (r->st == HANDSHAKE_MORE && r->taken < n) {
        size_t room = 0;
        uint8_t *at = handshake_room(&r->hs, &room);
        if (room == 0 || room != r->hs.want - r->hs.got || at < lo || at + room > hi) {
            fail("handshake_room offers other than what the part lacks, or outside the struct");
        }
        size_t chunk = n - r->taken < room ? n - r->taken : room;
        if (rng != NULL) {
            *rng = *rng * 1103515245u + 12345u;
            chunk = 1 + (*rng >> 16) % chunk;
        }
        memcpy(at, p + r->taken, chunk);
        r->taken += chunk;
        r->st = handshake_feed(&r->hs, chunk, &r->why);
    }
}

/* The reference reading of the whole handshake; checks `r` against it. */
static void checkReading(const uint8_t *p, size_t n, bool auth, const struct reading *r)
{
    static const char *const reasons[] = {"unknown handshake protocol",
                                          "handshake address length out of range",
                                          "handshake address not terminated"};
    const char *why = NULL;
    size_t need = HANDSHAKE_PREAMBLE_LEN;
    if (n >= need) {
        uint64_t addr_len = wire_le(p + 16, 8);
        if (wire_le(p, 8) != TRANSPORT_HANDSHAKE_PROTOCOL) {
            why = reasons[0];
        } else if (addr_len == 0 || addr_len > TRANSPORT_ADDRESS_MAX) {
            why = reasons[1];
        } else {
            need += (size_t)addr_len;
            if (n >= need && memchr(p + HANDSHAKE_PREAMBLE_LEN, '\0', (size_t)addr_len) == NULL) {
                why = reasons[2];
            } else if (auth) {
                need += TRANSPORT_ANSWER_LEN;
            }
        }
    }
    if (why != NULL) {
        if (r->st != HANDSHAKE_REFUSED || r->why == NULL || strcmp(r->why, why) != 0) {
            fail("the handshake was not refused for the reference's reason");
        }
        return;
    }
    if (n < need) {
        if (r->st != HANDSHAKE_MORE || r->taken != n) {
            fail("a handshake cut short was not left waiting for more, every byte taken");
        }
        return;
    }
    if (r->st != HANDSHAKE_READ || r->taken != need) {
        fail("a right handshake was not read, or not exactly its bytes taken");
    }
    size_t addr_len = (size_t)wire_le(p + 16, 8);
    if (r->hs.id != wire_le(p + 8, 8) || memcmp(r->hs.addr, p + 24, addr_len) != 0 ||
        memchr(r->hs.addr, '\0', sizeof r->hs.addr) == NULL) {
        fail("the handshake's ID or address is not the bytes sent");
    }
    if (auth && memcmp(r->hs.auth_answer, p + 24 + addr_len, TRANSPORT_ANSWER_LEN) != 0) {
        fail("the connector's answer is not the bytes sent");
    }
}

static const uint8_t nonceL[TRANSPORT_NONCE_LEN] = "listener nonce, 32 bytes long..";

/* The listener's checks of the connector's answer, as transport.c makes them. */
static void checkListenerAuth(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                              const struct handshake *hs)
{
    size_t k =
        handshake_connector_key(keys, n_keys, nonceL, hs->auth_answer, hs->id, SELF_ID, hs->addr);
    if (k != refConnectorKey(keys, n_keys, nonceL, hs->auth_answer, hs->id, SELF_ID, hs->addr)) {
        fail("the connector's key found is not the reference's");
    }
    raft_id asked = 0;
    bool named = handshake_nonce_target(hs->auth_answer, &asked);
    if (named != (memcmp(hs->auth_answer, TRANSPORT_TARGET_MAGIC, 8) == 0) ||
        (named && asked != wire_le(hs->auth_answer + 8, 8))) {
        fail("the nonce's target is not the reference's");
    }
    if (k == 0 && named && asked != SELF_ID &&
        handshake_connector_key(keys, n_keys, nonceL, hs->auth_answer, hs->id, asked, hs->addr) !=
            refConnectorKey(keys, n_keys, nonceL, hs->auth_answer, hs->id, asked, hs->addr)) {
        fail("the key found for the named target is not the reference's");
    }
}

/* ---- the connector ---------------------------------------------------------------------- */

/* The connector (ID 1, at its address, asking for SELF_ID) reads the listener's greeting and
 * answer from the n bytes at p. */
static void checkConnector(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys, uint8_t flags,
                           const uint8_t *p, size_t n)
{
    static const char address[] = "127.0.0.1:9001";
    if (n < TRANSPORT_GREETING_LEN) {
        return;
    }
    uint8_t nonce_l[TRANSPORT_NONCE_LEN];
    memset(nonce_l, 0xee, sizeof nonce_l);
    bool greeted = handshake_greeting(p, nonce_l);
    if (greeted != (memcmp(p, TRANSPORT_AUTH_MAGIC, 8) == 0) ||
        (greeted && memcmp(nonce_l, p + 8, sizeof nonce_l) != 0)) {
        fail("the greeting is not taken as the reference takes it");
    }
    if (!greeted || n < TRANSPORT_GREETING_LEN + TRANSPORT_MAC_LEN) {
        return;
    }
    uint8_t nonce_c[TRANSPORT_NONCE_LEN] = TRANSPORT_TARGET_MAGIC "\x02";
    uint8_t macs[TRANSPORT_KEYS_MAX * TRANSPORT_MAC_LEN] = {0};
    for (size_t k = 0; k < n_keys; k++) {
        refMac(keys[k], "connector", nonce_l, nonce_c, 1, SELF_ID, NULL, address,
               macs + k * TRANSPORT_MAC_LEN);
    }
    uint8_t answer[TRANSPORT_MAC_LEN];
    memcpy(answer, p + TRANSPORT_GREETING_LEN, sizeof answer);
    size_t key = (flags >> 3) & 1 && n_keys > 1 ? 1 : 0;
    if (flags & 0x20) {
        if (flags & 0x40) {
            uint64_t other = wire_le(answer, 8);
            uint8_t mac[TRANSPORT_MAC_LEN];
            refMac(keys[key], "refusal", nonce_l, nonce_c, 1, other, macs, address, mac);
            memcpy(answer + 8, mac, sizeof answer - 8);
        } else {
            refMac(keys[key], "listener", nonce_l, nonce_c, 1, SELF_ID, macs, address, answer);
        }
    }
    raft_id other = 0;
    enum handshake_answer an = handshake_listener_answer(keys, n_keys, nonce_l, nonce_c, 1, SELF_ID,
                                                         macs, address, answer, &other);
    /* The reference. */
    enum handshake_answer want = HANDSHAKE_ANSWER_WRONG;
    for (size_t k = 0; k < n_keys && want == HANDSHAKE_ANSWER_WRONG; k++) {
        uint8_t mac[TRANSPORT_MAC_LEN];
        refMac(keys[k], "listener", nonce_l, nonce_c, 1, SELF_ID, macs, address, mac);
        if (memcmp(mac, answer, sizeof mac) == 0) {
            want = HANDSHAKE_ANSWER_OK;
        }
    }
    uint64_t id = wire_le(answer, 8);
    for (size_t k = 0; k < n_keys && want == HANDSHAKE_ANSWER_WRONG && id != SELF_ID; k++) {
        uint8_t mac[TRANSPORT_MAC_LEN];
        refMac(keys[k], "refusal", nonce_l, nonce_c, 1, id, macs, address, mac);
        if (memcmp(mac, answer + 8, sizeof mac - 8) == 0) {
            want = HANDSHAKE_ANSWER_REFUSED;
        }
    }
    if (an != want || (an == HANDSHAKE_ANSWER_REFUSED && other != id)) {
        fail("the listener's answer is not judged as the reference judges it");
    }
    if ((flags & 0x20) && an == HANDSHAKE_ANSWER_WRONG && !((flags & 0x40) && id == SELF_ID)) {
        fail("a right answer planted was not taken");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    uint8_t flags = data[0];
    uint32_t rng = data[1];
    bool auth = flags & 1;
    size_t n_keys = flags & 2 ? 2 : 1;
    /* Keys as transport_init derives them, from two fixed secrets. */
    static uint8_t keys[TRANSPORT_KEYS_MAX][TRANSPORT_MAC_LEN];
    static bool keyed;
    if (!keyed) {
        for (int k = 0; k < TRANSPORT_KEYS_MAX; k++) {
            uint8_t secret[TRANSPORT_SECRET_MIN];
            memset(secret, 'a' + k, sizeof secret);
            unsigned int len = 0;
            HMAC(EVP_sha256(), secret, sizeof secret, (const uint8_t *)TRANSPORT_AUTH_LABEL,
                 strlen(TRANSPORT_AUTH_LABEL), keys[k], &len);
        }
        keyed = true;
    }
    /* A private copy (ASan sees reads past it), with the planted MAC when asked. */
    size_t n = size - 2;
    uint8_t *p = malloc(n ? n : 1);
    if (p == NULL) {
        abort();
    }
    memcpy(p, data + 2, n);

    struct reading whole, pieces;
    readHandshake(p, n, auth, NULL, &whole);
    if (auth && (flags & 4) && whole.st == HANDSHAKE_READ) {
        size_t key = (flags >> 3) & 1 && n_keys > 1 ? 1 : 0;
        size_t slot = (flags >> 4) & 1;
        uint8_t *ans = p + whole.taken - TRANSPORT_ANSWER_LEN;
        refMac(keys[key], "connector", nonceL, ans, whole.hs.id, SELF_ID, NULL, whole.hs.addr,
               ans + TRANSPORT_NONCE_LEN + slot * TRANSPORT_MAC_LEN);
        readHandshake(p, n, auth, NULL, &whole);
    }
    readHandshake(p, n, auth, &rng, &pieces);
    if (pieces.st != whole.st || pieces.why != whole.why || pieces.taken != whole.taken ||
        (whole.st == HANDSHAKE_READ && memcmp(&pieces.hs, &whole.hs, sizeof whole.hs) != 0)) {
        fail("the reading depends on how the bytes arrive");
    }
    checkReading(p, n, auth, &whole);
    if (whole.st == HANDSHAKE_READ && auth) {
        checkListenerAuth(keys, n_keys, &whole.hs);
        if ((flags & 4) && handshake_connector_key(keys, n_keys, nonceL, whole.hs.auth_answer,
                                                   whole.hs.id, SELF_ID, whole.hs.addr) == 0) {
            fail("a right connector MAC planted was not found");
        }
    }
    if (whole.st == HANDSHAKE_READ) {
        checkConnector(keys, n_keys, flags, p + whole.taken, n - whole.taken);
    }
    free(p);
    return 0;
}
