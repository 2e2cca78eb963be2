/* resolver: host names resolved off a libuv loop, and the socket address helpers that go with
 * them, for the daemon: its Raft transport dials members by name (cluster/transport.c), its
 * RPC listener knows members' connections by the addresses their names resolve to
 * (server/rpc.c). Part of libidem's sources but not of its API, like tls_stream.h: not
 * installed, hidden in the shared library; the daemon links the static library.
 *
 * Lookups run on a thread of the resolver's own (started at the first lookup: a node whose
 * addresses are all IP addresses has none), one at a time, with getaddrinfo(). Not on
 * libuv's thread pool: raft_uv's disk work runs there, and a lookup waits for the name
 * servers' timeouts (seconds each, when they do not answer): four such lookups would stop
 * the log's writes. One thread bounds what a slow resolver costs to the lookups themselves,
 * which queue (one in flight per name: a second ask for a name joins the first).
 *
 * Each name's last answer is kept (up to IDEM_RESOLVER_NAMES names, the least recently used
 * one replaced), with its time: a caller may take it when it is recent enough
 * (IdemResolverCached) instead of asking again, and may ask for a new lookup in the
 * background (IdemResolverRefresh). Answers are the addresses getaddrinfo() gives (IPv4 and
 * IPv6, in its order of preference, up to IDEM_RESOLVE_MAX).
 *
 * Everything but the lookups runs on the loop's thread. */
#ifndef IDEM_CLIENT_RESOLVER_H
#define IDEM_CLIENT_RESOLVER_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#define IDEM_RESOLVE_MAX 8      /* addresses kept of one answer */
#define IDEM_RESOLVER_NAMES 256 /* names whose answers are kept */
#define IDEM_HOST_MAX 253       /* the longest host name */

struct idem_resolver;
struct idem_lookup;

/* A lookup's answer, on the loop: status 0 and n >= 1 addresses (borrowed for the call, each
 * with the port asked for), or a getaddrinfo() error code (IdemResolveStrerror) and n 0. */
typedef void (*idem_resolve_cb)(void *data, int status, const struct sockaddr_storage *addrs,
                                size_t n);

/* What the thread calls to look a name up (getaddrinfo() unless a test replaces it): up to
 * cap addresses into out (port 0), their count in *n; 0 or a getaddrinfo() error code. */
typedef int (*idem_lookup_fn)(const char *host, struct sockaddr_storage *out, size_t cap,
                              size_t *n);

/* A resolver on loop; NULL when out of memory. */
struct idem_resolver *IdemResolverNew(uv_loop_t *loop);

/* Replaces the lookup function (tests), before the first lookup. */
void IdemResolverSetLookup(struct idem_resolver *r, idem_lookup_fn fn);

/* Looks `host` up anew (or joins the lookup of it in flight) and calls cb(data, ...) on the
 * loop with the answer, never before this returns; the answer is kept. *out (OUT) is the
 * request, until its callback or IdemResolveCancel(). 0, or -1 (out of memory, or the
 * resolver closing) and no callback. */
int IdemResolve(struct idem_resolver *r, const char *host, uint16_t port, idem_resolve_cb cb,
                void *data, struct idem_lookup **out);

/* Withdraws a request: its callback is not called. */
void IdemResolveCancel(struct idem_lookup *l);

/* The kept answer for host, when one is there that is at most max_age_ms old and found
 * addresses: up to cap of them into out (with `port`), their count; 0 otherwise. Asks
 * nothing. */
size_t IdemResolverCached(struct idem_resolver *r, const char *host, uint16_t port,
                          uint64_t max_age_ms, struct sockaddr_storage *out, size_t cap);

/* Starts a lookup of host in the background (its answer kept, nobody called) when the kept
 * one is older than max_age_ms or there is none, and none is in flight. */
void IdemResolverRefresh(struct idem_resolver *r, const char *host, uint64_t max_age_ms);

/* Lookups started since IdemResolverNew (tests, logs). */
uint64_t IdemResolverLookups(const struct idem_resolver *r);

/* Ends the resolver: requests not called back yet are dropped (their callbacks never come),
 * its handle closes on the loop's next turn, and its memory goes once the handle is closed
 * and its thread (when it is in a lookup, which cannot be interrupted) has ended. NULL is
 * accepted. */
void IdemResolverClose(struct idem_resolver *r);

/* What a getaddrinfo() error code says. */
const char *IdemResolveStrerror(int status);

/* ---- socket addresses ---------------------------------------------------------------------- */

/* "host:port" or "[v6]:port" (text, NUL-terminated) split into host (without brackets; cap
 * bytes with its NUL) and port (1..65535). False when it is neither. */
bool IdemHostPortSplit(const char *text, char *host, size_t cap, uint16_t *port);

/* Whether host is an IPv4 or IPv6 address (not a name); fills *out with it and port. */
bool IdemSockaddrLiteral(const char *host, uint16_t port, struct sockaddr_storage *out);

/* host's address with port into *out: a literal as is, a name with getaddrinfo(), blocking
 * (for a listener's address at start, before the loop serves anything), its first answer.
 * 0, or -1 with why. */
int IdemSockaddrResolveNow(const char *host, uint16_t port, struct sockaddr_storage *out, char *why,
                           size_t why_len);

/* "A.B.C.D:P" or "[v6]:P" of an IPv4 or IPv6 socket address into buf ("?" for others). */
void IdemSockaddrText(const struct sockaddr *sa, char *buf, size_t len);

/* Longest IdemSockaddrText(): "[" INET6_ADDRSTRLEN "]:65535". */
#define IDEM_SOCKADDR_TEXT_MAX (INET6_ADDRSTRLEN + 8)

/* An IPv4 or IPv6 socket address's host as 16 bytes: IPv6 as is, IPv4 as its IPv4-mapped
 * IPv6 address (::ffff:a.b.c.d, which is also what a dual-stack listener sees of an IPv4
 * peer), so that both forms of one peer are one key. False (key zeroed) for other families. */
bool IdemSockaddrKey(const struct sockaddr *sa, uint8_t key[16]);

/* Whether two socket addresses are the same host and port (IPv4 and its IPv4-mapped IPv6
 * form alike); a wildcard host (0.0.0.0, ::) in `listener` matches any host. */
bool IdemSockaddrMatches(const struct sockaddr *listener, const struct sockaddr *local);

#endif
