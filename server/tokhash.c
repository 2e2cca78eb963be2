/* tokhash: bearer tokens' SHA-256, the last few kept (tokhash.h). */
#include "tokhash.h"

#include <openssl/crypto.h>
#include <string.h>

bool tokhash_init(struct tokhash *t)
{
    memset(t, 0, sizeof(*t));
    t->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    t->ctx = EVP_MD_CTX_new();
    if (t->sha256 == NULL || t->ctx == NULL) {
        tokhash_close(t);
        return false;
    }
    return true;
}

void tokhash_close(struct tokhash *t)
{
    EVP_MD_CTX_free(t->ctx);
    EVP_MD_free(t->sha256);
    OPENSSL_cleanse(t, sizeof(*t));
}

/* The slot holding the token whose TOKHASH_TOKEN_MAX bytes, zero-padded, are `padded` and
 * whose length is len, or -1. Every slot's whole buffer is compared whatever the lengths,
 * so the time taken tells neither which bytes match nor how long the kept tokens are. */
static int keptSlot(const struct tokhash *t, const uint8_t padded[TOKHASH_TOKEN_MAX], size_t len)
{
    int found = -1;
    for (int i = 0; i < TOKHASH_SLOTS; i++) {
        const struct tokhash_slot *s = &t->slot[i];
        int diff = CRYPTO_memcmp(s->tok, padded, TOKHASH_TOKEN_MAX) | (s->len != len);
        found = diff == 0 ? i : found;
    }
    return found;
}

bool tokhash_sha256(struct tokhash *t, const uint8_t *tok, size_t len, uint8_t digest[32])
{
    if (len == 0 || tok == NULL) {
        return false;
    }
    uint8_t padded[TOKHASH_TOKEN_MAX] = {0};
    if (len <= TOKHASH_TOKEN_MAX) {
        memcpy(padded, tok, len);
        int i = keptSlot(t, padded, len);
        if (i >= 0) {
            memcpy(digest, t->slot[i].digest, 32);
            t->kept++;
            OPENSSL_cleanse(padded, sizeof padded);
            return true;
        }
    }
    unsigned int hl = 0;
    if (EVP_DigestInit_ex2(t->ctx, t->sha256, NULL) != 1 ||
        EVP_DigestUpdate(t->ctx, tok, len) != 1 || EVP_DigestFinal_ex(t->ctx, digest, &hl) != 1 ||
        hl != 32) {
        OPENSSL_cleanse(padded, sizeof padded);
        return false;
    }
    if (len <= TOKHASH_TOKEN_MAX) {
        struct tokhash_slot *s = &t->slot[t->next];
        t->next = (t->next + 1) % TOKHASH_SLOTS;
        memcpy(s->tok, padded, TOKHASH_TOKEN_MAX); /* zeros past len, as keptSlot compares */
        s->len = len;
        memcpy(s->digest, digest, 32);
    }
    OPENSSL_cleanse(padded, sizeof padded);
    return true;
}
