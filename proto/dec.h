/* dec: an unsigned integer's decimal digits, written by hand where a request or an answer
 * needs one (a log's request id, a fencing token's string): printf's machinery costs more
 * than the rest of the formatting. */
#ifndef IDEM_PROTO_DEC_H
#define IDEM_PROTO_DEC_H

#include <stddef.h>
#include <stdint.h>

#define DEC_U64_MAX 20 /* digits of UINT64_MAX */

/* Writes v's decimal digits (no sign, no leading zero, no NUL) at out, which has room for
 * DEC_U64_MAX; returns how many. */
static inline size_t dec_u64(char *out, uint64_t v)
{
    char rev[DEC_U64_MAX];
    size_t n = 0;
    do {
        rev[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++) {
        out[i] = rev[n - 1 - i];
    }
    return n;
}

#endif
