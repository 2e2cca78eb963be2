/* tokhash: the SHA-256 of bearer tokens, which the service compares with the configuration's
 * (tenants' token_sha256, the admin's, the cluster secret's) for every request.
 *
 * One digest context, fetched and allocated once, serves every request: no allocation and no
 * algorithm lookup per digest. Nothing of a token is kept after its digest (the digest's own
 * block buffer is wiped by the library at its end). One thread at a time (the service's
 * loop). */
#ifndef IDEM_SERVER_TOKHASH_H
#define IDEM_SERVER_TOKHASH_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokhash {
    EVP_MD *sha256;  /* fetched once */
    EVP_MD_CTX *ctx; /* reused: no allocation per digest */
};

/* false: no SHA-256 in the crypto library, or no memory. */
bool tokhash_init(struct tokhash *t);
void tokhash_close(struct tokhash *t);

/* The SHA-256 of the len bytes at tok into digest; false for an empty token or a failed
 * digest. */
bool tokhash_sha256(struct tokhash *t, const uint8_t *tok, size_t len, uint8_t digest[32]);

#endif
