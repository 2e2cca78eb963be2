/* config_addr: a node's "host:port" addresses (config.h): an IPv4 literal, an IPv6 literal in
 * brackets, or a host name, each written in one canonical text so that two addresses parsed
 * here name the same endpoint when their texts are equal (a name and the address it resolves
 * to are not told apart: nothing is resolved here). */
#define _DEFAULT_SOURCE /* inet_aton */
#include "config_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Whether `host` (len bytes) is a host name as RFC 1123 takes them: dot-separated labels of
 * 1..63 letters, digits, '-' or '_' (service names use it), none starting or ending with '-',
 * an optional final dot, and a last label that is not all digits (so no numeric form, which
 * getaddrinfo would read as an address, passes as a name). */
static bool hostNameValid(const char *host, size_t len)
{
    if (len > 0 && host[len - 1] == '.') {
        len--;
    }
    if (len == 0) {
        return false;
    }
    size_t start = 0;
    bool digits = true;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || host[i] == '.') {
            size_t n = i - start;
            if (n == 0 || n > 63 || host[start] == '-' || host[i - 1] == '-') {
                return false;
            }
            if (i == len && digits) {
                return false;
            }
            start = i + 1;
            digits = true;
            continue;
        }
        unsigned char ch = (unsigned char)host[i];
        if (!isalnum(ch) && ch != '-' && ch != '_') {
            return false;
        }
        digits = digits && isdigit(ch);
    }
    return true;
}

/* Parses the port text (after the last ':'); 1..65535 without leading zeros. */
static bool portParse(const char *port, uint16_t *out)
{
    size_t len = strlen(port);
    if (len == 0 || len > 5 || strspn(port, "0123456789") != len || port[0] == '0') {
        return false;
    }
    unsigned long p = strtoul(port, NULL, 10);
    if (p < 1 || p > 65535) {
        return false;
    }
    *out = (uint16_t)p;
    return true;
}

/* The host of an unbracketed "host:port" (hostlen bytes at s) into host/out: an IPv4 literal
 * or a name (lower-cased). 0, or -1 with why. */
static int plainHost(const char *s, size_t hostlen, const char *q, struct config_addr *out,
                     char *host, char *why, size_t why_len)
{
    memcpy(host, s, hostlen);
    host[hostlen] = '\0';
    struct in_addr a;
    if (strspn(host, "0123456789.") == hostlen) {
        /* inet_pton takes no leading zeros and no short forms: one text per address. */
        if (inet_pton(AF_INET, host, &a) != 1) {
            snprintf(why, why_len, "the host is not a valid IPv4 address, got %s", q);
            return -1;
        }
        out->family = AF_INET;
        return 0;
    }
    /* Forms inet_aton reads as addresses (hexadecimal, octal, "127.1") are neither. */
    if (inet_aton(host, &a) != 0 || !hostNameValid(host, hostlen)) {
        snprintf(why, why_len,
                 "the host must be an IPv4 address, an IPv6 address in brackets or a host name, "
                 "got %s",
                 q);
        return -1;
    }
    for (size_t i = 0; i < hostlen; i++) {
        host[i] = (char)tolower((unsigned char)host[i]);
    }
    out->family = AF_UNSPEC;
    return 0;
}

/* The host of "[v6]:port" (s starts at '['); `close` is its ']'. 0, or -1 with why. */
static int bracketHost(const char *s, const char *close, const char *q, struct config_addr *out,
                       char *host, char *why, size_t why_len)
{
    size_t inner = (size_t)(close - s - 1);
    char lit[INET6_ADDRSTRLEN + 1];
    struct in6_addr a6;
    if (inner == 0 || inner >= sizeof lit) {
        snprintf(why, why_len, "the host is not a valid IPv6 address, got %s", q);
        return -1;
    }
    memcpy(lit, s + 1, inner);
    lit[inner] = '\0';
    if (inet_pton(AF_INET6, lit, &a6) != 1) {
        snprintf(why, why_len, "the host is not a valid IPv6 address%s, got %s",
                 strchr(lit, '%') != NULL ? " (zone indexes are not taken)" : "", q);
        return -1;
    }
    /* An IPv4-mapped address is the IPv4 address (a connection to either reaches it): its
     * text is the IPv4 one. Else RFC 5952's text (lower case, zeros compressed): one text
     * per address. */
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
        inet_ntop(AF_INET, &a6.s6_addr[12], host, CONFIG_HOST_MAX + 1);
        out->family = AF_INET;
        return 0;
    }
    inet_ntop(AF_INET6, &a6, host, CONFIG_HOST_MAX + 1);
    out->family = AF_INET6;
    return 0;
}

int config_addr_parse(const char *s, struct config_addr *out, char *why, size_t why_len)
{
    size_t len = strlen(s);
    char q[QUOTE_SIZE];
    config_quote(q, s, len);
    const char *colon = strrchr(s, ':');
    const char *close = s[0] == '[' ? strchr(s, ']') : NULL;
    if (colon == NULL || colon == s || colon[1] == '\0' || (s[0] == '[' && close == NULL)) {
        snprintf(why, why_len, "expected host:port (or [IPv6]:port), got %s", q);
        return -1;
    }
    if (s[0] == '[' && close + 1 != colon) {
        snprintf(why, why_len, "expected [IPv6]:port, got %s", q);
        return -1;
    }
    size_t hostlen = (size_t)(colon - s);
    if (s[0] != '[' && memchr(s, ':', hostlen) != NULL) {
        snprintf(why, why_len, "write an IPv6 address in brackets, [address]:port, got %s", q);
        return -1;
    }
    uint16_t port = 0;
    if (!portParse(colon + 1, &port)) {
        size_t plen = strlen(colon + 1);
        bool zeros = plen > 1 && colon[1] == '0' && strspn(colon + 1, "0123456789") == plen;
        snprintf(why, why_len, "the port must be 1..65535%s, got %s",
                 zeros ? " without leading zeros" : "", q);
        return -1;
    }
    if (hostlen > CONFIG_HOST_MAX) {
        snprintf(why, why_len, "the host is longer than %d bytes", CONFIG_HOST_MAX);
        return -1;
    }
    struct config_addr a;
    memset(&a, 0, sizeof a);
    int rv = s[0] == '[' ? bracketHost(s, close, q, &a, a.host, why, why_len)
                         : plainHost(s, hostlen, q, &a, a.host, why, why_len);
    if (rv != 0) {
        return -1;
    }
    a.port = port;
    snprintf(a.text, sizeof a.text, a.family == AF_INET6 ? "[%s]:%u" : "%s:%u", a.host,
             (unsigned)port);
    *out = a;
    return 0;
}

bool config_addr_same(const struct config_addr *a, const struct config_addr *b)
{
    /* A name's text keeps a final dot as written (it spares resolvers their search list),
     * and "name." is the same name as "name". */
    size_t la = strlen(a->host), lb = strlen(b->host);
    if (a->family == AF_UNSPEC && la > 0 && a->host[la - 1] == '.') {
        la--;
    }
    if (b->family == AF_UNSPEC && lb > 0 && b->host[lb - 1] == '.') {
        lb--;
    }
    return a->port == b->port && a->family == b->family && la == lb &&
           memcmp(a->host, b->host, la) == 0;
}

bool config_addr_is_name(const struct config_addr *a)
{
    return a->port != 0 && a->family == AF_UNSPEC;
}

bool config_addr_is_loopback(const char *s)
{
    struct config_addr a;
    char why[QUOTE_SIZE + 96];
    if (s == NULL || config_addr_parse(s, &a, why, sizeof why) != 0) {
        return false;
    }
    if (a.family == AF_INET) {
        struct in_addr in;
        return inet_pton(AF_INET, a.host, &in) == 1 && (ntohl(in.s_addr) >> 24) == 127;
    }
    struct in6_addr in6;
    if (a.family != AF_INET6 || inet_pton(AF_INET6, a.host, &in6) != 1) {
        return false; /* a name: it may resolve to anything, and change */
    }
    return IN6_IS_ADDR_LOOPBACK(&in6);
}
