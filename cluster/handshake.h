/* handshake: the bytes of a Raft connection's handshake (transport.h describes the exchange),
 * parsed and checked without libuv: what transport.c reads from a peer goes through here, and
 * tests/fuzz/fuzz_raft_handshake drives the same functions.
 *
 * The listener reads a connector's handshake in parts, each exactly as long as what is left
 * of it (so that nothing past the handshake is taken from the socket): raft_uv_tcp's
 * preamble (protocol, sender ID, address length: u64 little endian each), the address
 * (1..TRANSPORT_ADDRESS_MAX bytes, NUL-terminated, padded), then with a secret the
 * connector's answer (nonce_c and its MACs, TRANSPORT_ANSWER_LEN bytes). Nothing a peer sends
 * is taken as a length before it is bounded; a refusal's reason is a string constant, never
 * the peer's bytes. */
#ifndef IDEM_CLUSTER_HANDSHAKE_H
#define IDEM_CLUSTER_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define HANDSHAKE_PREAMBLE_LEN 24
/* The connector's MACs, one per key it has (zeros past them), as it sends them. */
#define HANDSHAKE_MACS_LEN (TRANSPORT_KEYS_MAX * TRANSPORT_MAC_LEN)

/* A listener's reading of one connector's handshake. */
struct handshake {
    enum { HANDSHAKE_PRE, HANDSHAKE_ADDRESS, HANDSHAKE_AUTH, HANDSHAKE_DONE } part;
    bool auth;   /* a secret is set: the connector's answer follows the address */
    size_t want; /* bytes of the part being read */
    size_t got;
    uint8_t pre[HANDSHAKE_PREAMBLE_LEN];
    char addr[TRANSPORT_ADDRESS_MAX];          /* the address as sent (want bytes of it) */
    uint8_t auth_answer[TRANSPORT_ANSWER_LEN]; /* nonce_c, then the connector's MACs */
    raft_id id;                                /* the connector's, once the preamble is read */
};

/* What handshake_feed() made of the bytes so far. */
enum handshake_status {
    HANDSHAKE_MORE,    /* the part is not complete yet, or the next one starts: read more */
    HANDSHAKE_READ,    /* the handshake is read: id, addr (NUL-terminated), auth_answer */
    HANDSHAKE_REFUSED, /* the connector broke a rule: close (why says which) */
};

/* The connector's side: raft_uv_tcp's handshake naming `self` at `address`: protocol, ID,
 * the address's length padded to 8 bytes (u64 little endian each), the address,
 * NUL-terminated and zero-padded. malloc'd (the caller frees), its length in *len; NULL when
 * out of memory. */
uint8_t *handshake_encode(raft_id self, const char *address, size_t *len);

/* Starts reading a handshake; `auth`: a secret is set (the connector's answer follows). */
void handshake_init(struct handshake *hs, bool auth);

/* Where the next bytes go: *len (OUT) bytes at the returned pointer, exactly what the part
 * being read still lacks (never 0 before HANDSHAKE_READ or HANDSHAKE_REFUSED). */
uint8_t *handshake_room(struct handshake *hs, size_t *len);

/* Takes `n` bytes (1..the room's length) just read into the room. On HANDSHAKE_REFUSED *why
 * is set (a string constant) and the handshake is not to be fed again. */
enum handshake_status handshake_feed(struct handshake *hs, size_t n, const char **why);

/* mac = HMAC(key, label 0 nonce_l nonce_c id target macs address): the connector's proof
 * (label "connector", macs NULL), the listener's ("listener", macs the connector's as sent)
 * or a listener's refusal as another node ("refusal", target the listener's own ID); address
 * up to its NUL (at most TRANSPORT_ADDRESS_MAX bytes). False when OpenSSL failed. */
bool handshake_mac(const uint8_t key[TRANSPORT_MAC_LEN], const char *label, const uint8_t *nonce_l,
                   const uint8_t *nonce_c, raft_id id, raft_id target, const uint8_t *macs,
                   const char *address, uint8_t mac[TRANSPORT_MAC_LEN]);

/* The node a connector's nonce_c names (TRANSPORT_TARGET_MAGIC, then its ID) in *target
 * (OUT); false when it names none (an earlier idemd's nonce is random). */
bool handshake_nonce_target(const uint8_t nonce_c[TRANSPORT_NONCE_LEN], raft_id *target);

/* 1 + the index of the newest of the n_keys keys with which one of the connector's MACs in
 * `answer` (nonce_c, then TRANSPORT_KEYS_MAX MACs) was made for a connection from `id` at
 * `address` to `target` under the listener's nonce_l; 0 when none was. */
size_t handshake_connector_key(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                               const uint8_t nonce_l[TRANSPORT_NONCE_LEN],
                               const uint8_t answer[TRANSPORT_ANSWER_LEN], raft_id id,
                               raft_id target, const char *address);

/* A connector's reading of the listener's greeting (TRANSPORT_GREETING_LEN bytes): true with
 * its nonce in nonce_l (OUT) when it starts with TRANSPORT_AUTH_MAGIC. */
bool handshake_greeting(const uint8_t greeting[TRANSPORT_GREETING_LEN],
                        uint8_t nonce_l[TRANSPORT_NONCE_LEN]);

/* What a connector makes of the listener's answer (TRANSPORT_MAC_LEN bytes). */
enum handshake_answer {
    HANDSHAKE_ANSWER_OK,      /* the listener's MAC under one of our keys */
    HANDSHAKE_ANSWER_REFUSED, /* a refusal as another node, made with one of our keys */
    HANDSHAKE_ANSWER_WRONG,   /* neither */
};

/* Judges the listener's `answer` to connector `id` at `address` (its own), which meant to
 * reach node `peer`, sent nonce_c and `macs` (as sent) after the greeting's nonce_l. On
 * HANDSHAKE_ANSWER_REFUSED the ID the listener gave is in *other (OUT). */
enum handshake_answer
handshake_listener_answer(const uint8_t (*keys)[TRANSPORT_MAC_LEN], size_t n_keys,
                          const uint8_t nonce_l[TRANSPORT_NONCE_LEN],
                          const uint8_t nonce_c[TRANSPORT_NONCE_LEN], raft_id id, raft_id peer,
                          const uint8_t *macs, const char *address,
                          const uint8_t answer[TRANSPORT_MAC_LEN], raft_id *other);

#endif
