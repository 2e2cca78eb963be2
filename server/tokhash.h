/* tokhash: the SHA-256 of bearer tokens, which the service compares with the configuration's
 * (tenants' token_sha256, the admin's, the cluster secret's) for every request.
 *
 * The digests of the last few tokens are kept with the tokens: a client sends the same one
 * with each request, and a request of a token kept costs a comparison instead of a digest.
 * Each kept token is compared as TOKHASH_TOKEN_MAX bytes, zero-padded, in constant time,
 * so the time taken tells neither which one matches, if any, nor how long they are; no
 * token longer than TOKHASH_TOKEN_MAX is kept. Tokens and digests are wiped at the close.
 * One thread at a time (the service's loop). */
#ifndef IDEM_SERVER_TOKHASH_H
#define IDEM_SERVER_TOKHASH_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOKHASH_SLOTS 8
#define TOKHASH_TOKEN_MAX 128

struct tokhash {
    EVP_MD *sha256; /* fetched once */
    EVP_MD_CTX *ctx; /* reused: no allocation per digest */
    struct tokhash_slot {
        size_t len; /* 0: empty */
        uint8_t tok[TOKHASH_TOKEN_MAX]; /* zeros past len */
        uint8_t digest[32];
    } slot[TOKHASH_SLOTS];
    unsigned next;  /* the slot the next new token takes (round robin) */
    uint64_t kept;  /* digests answered from a kept token (tests) */
};

/* false: no SHA-256 in the crypto library, or no memory. */
bool tokhash_init(struct tokhash *t);
void tokhash_close(struct tokhash *t);

/* The SHA-256 of the len bytes at tok into digest; false for an empty token or a failed
 * digest. */
bool tokhash_sha256(struct tokhash *t, const uint8_t *tok, size_t len, uint8_t digest[32]);

#endif
