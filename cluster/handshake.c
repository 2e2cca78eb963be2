/* handshake: the bytes of a Raft connection's handshake, parsed and checked (handshake.h). */
#include "handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "wire_check.h"

uint8_t *handshake_encode(raft_id self, const char *address, size_t *len)
{
    size_t alen = (strlen(address) + 1 + 7) / 8 * 8;
    uint64_t words[3] = {TRANSPORT_HANDSHAKE_PROTOCOL, self, alen};
    *len = sizeof(words) + alen;
    uint8_t *hs = calloc(1, *len);
    if (hs == NULL) {
        return NULL;
    }
    for (size_t w = 0; w < 3; w++) {
        for (size_t i = 0; i < 8; i++) {
            hs[w * 8 + i] = (uint8_t)(words[w] >> (8 * i));
        }
    }
    memcpy(hs + sizeof(words), address, strlen(address));
    return hs;
}

void handshake_init(struct handshake *hs, bool auth)
{
    memset(hs, 0, sizeof(*hs));
    hs->part = HANDSHAKE_PRE;
    hs->auth = auth;
    hs->want = sizeof(hs->pre);
}

uint8_t *handshake_room(struct handshake *hs, size_t *len)
{
    uint8_t *base = hs->part == HANDSHAKE_PRE       ? hs->pre
                    : hs->part == HANDSHAKE_ADDRESS ? (uint8_t *)hs->addr
                                                    : hs->auth_answer;
    *len = hs->part == HANDSHAKE_DONE ? 0 : hs->want - hs->got;
    return base + hs->got;
}

enum handshake_status handshake_feed(struct handshake *hs, size_t n, const char **why)
{
    hs->got += n;
    if (hs->got < hs->want) {
        return HANDSHAKE_MORE;
    }
    switch (hs->part) {
    case HANDSHAKE_PRE: {
        uint64_t protocol = wire_le(hs->pre, 8);
        uint64_t len = wire_le(hs->pre + 16, 8);
        if (protocol != TRANSPORT_HANDSHAKE_PROTOCOL) {
            *why = "unknown handshake protocol";
            return HANDSHAKE_REFUSED;
        }
        if (len == 0 || len > sizeof(hs->addr)) {
            *why = "handshake address length out of range";
            return HANDSHAKE_REFUSED;
        }
        hs->id = wire_le(hs->pre + 8, 8);
        hs->part = HANDSHAKE_ADDRESS;
        hs->want = (size_t)len;
        hs->got = 0;
        return HANDSHAKE_MORE;
    }
    case HANDSHAKE_ADDRESS:
        if (memchr(hs->addr, '\0', hs->want) == NULL) {
            *why = "handshake address not terminated";
            return HANDSHAKE_REFUSED;
        }
        if (hs->auth) {
            hs->part = HANDSHAKE_AUTH;
            hs->want = sizeof(hs->auth_answer);
            hs->got = 0;
            return HANDSHAKE_MORE;
        }
        hs->part = HANDSHAKE_DONE;
        return HANDSHAKE_READ;
    default: /* HANDSHAKE_AUTH */
        hs->part = HANDSHAKE_DONE;
        return HANDSHAKE_READ;
    }
}

static size_t putLe64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
    return 8;
}

bool handshake_mac(const uint8_t key[TRANSPORT_MAC_LEN], const char *label, const uint8_t *nonce_l,
                   const uint8_t *nonce_c, raft_id id, raft_id target, const uint8_t *macs,
                   const char *address, uint8_t mac[TRANSPORT_MAC_LEN])
{
    uint8_t msg[16 + 2 * TRANSPORT_NONCE_LEN + 16 + HANDSHAKE_MACS_LEN + TRANSPORT_ADDRESS_MAX];
    size_t label_len = strlen(label) + 1; /* with its NUL */
    size_t addr_len = strnlen(address, TRANSPORT_ADDRESS_MAX);
    size_t n = 0;
    memcpy(msg, label, label_len);
    n += label_len;
    memcpy(msg + n, nonce_l, TRANSPORT_NONCE_LEN);
    n += TRANSPORT_NONCE_LEN;
    memcpy(msg + n, nonce_c, TRANSPORT_NONCE_LEN);
    n += TRANSPORT_NONCE_LEN;
    n += putLe64(msg + n, id);
    n += putLe64(msg + n, target);
    if (macs != NULL) {
        memcpy(msg + n, macs, HANDSHAKE_MACS_LEN);
        n += HANDSHAKE_MACS_LEN;
    }
    memcpy(msg + n, address, addr_len);
    n += addr_len;
    unsigned int len = 0;
    return HMAC(EVP_sha256(), key, TRANSPORT_MAC_LEN, msg, n, mac, &len) != NULL &&
           len == TRANSPORT_MAC_LEN;
}

bool handshake_nonce_target(const uint8_t nonce_c[TRANSPORT_NONCE_LEN], raft_id *target)
{
    if (memcmp(nonce_c, TRANSPORT_TARGET_MAGIC, 8) != 0) {
        return false;
    }
    *target = wire_le(nonce_c + 8, 8);
    return true;
}

size_t handshake_connector_key(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                               const uint8_t nonce_l[TRANSPORT_NONCE_LEN],
                               const uint8_t answer[TRANSPORT_ANSWER_LEN], raft_id id,
                               raft_id target, const char *address)
{
    const uint8_t *nonce_c = answer;
    const uint8_t *macs = answer + TRANSPORT_NONCE_LEN;
    for (size_t k = 0; k < n_keys; k++) {
        uint8_t want[TRANSPORT_MAC_LEN];
        if (!handshake_mac(keys[k], "connector", nonce_l, nonce_c, id, target, NULL, address,
                           want)) {
            return 0;
        }
        bool found = false;
        for (size_t j = 0; j < TRANSPORT_KEYS_MAX; j++) {
            found |= CRYPTO_memcmp(want, macs + j * TRANSPORT_MAC_LEN, sizeof(want)) == 0;
        }
        if (found) {
            return k + 1;
        }
    }
    return 0;
}

bool handshake_greeting(const uint8_t greeting[TRANSPORT_GREETING_LEN],
                        uint8_t nonce_l[TRANSPORT_NONCE_LEN])
{
    if (memcmp(greeting, TRANSPORT_AUTH_MAGIC, 8) != 0) {
        return false;
    }
    memcpy(nonce_l, greeting + 8, TRANSPORT_NONCE_LEN);
    return true;
}

enum handshake_answer
handshake_listener_answer(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                          const uint8_t nonce_l[TRANSPORT_NONCE_LEN],
                          const uint8_t nonce_c[TRANSPORT_NONCE_LEN], raft_id id, raft_id peer,
                          const uint8_t *macs, const char *address,
                          const uint8_t answer[TRANSPORT_MAC_LEN], raft_id *other)
{
    /* Made with one of our keys: the newest the listener has. */
    for (size_t k = 0; k < n_keys; k++) {
        uint8_t want[TRANSPORT_MAC_LEN];
        if (handshake_mac(keys[k], "listener", nonce_l, nonce_c, id, peer, macs, address, want) &&
            CRYPTO_memcmp(want, answer, sizeof(want)) == 0) {
            return HANDSHAKE_ANSWER_OK;
        }
    }
    /* A refusal as another node (transport.h): its ID, then 24 bytes of its MAC. */
    *other = wire_le(answer, 8);
    for (size_t k = 0; k < n_keys && *other != peer; k++) {
        uint8_t want[TRANSPORT_MAC_LEN];
        if (handshake_mac(keys[k], "refusal", nonce_l, nonce_c, id, *other, macs, address, want) &&
            CRYPTO_memcmp(want, answer + 8, TRANSPORT_MAC_LEN - 8) == 0) {
            return HANDSHAKE_ANSWER_REFUSED;
        }
    }
    return HANDSHAKE_ANSWER_WRONG;
}
