/* config_reload: what a running node takes from its configuration file read again (SIGHUP,
 * `idemctl reload`; the daemon's side is server/reload.c, the list for operators
 * docs/operations.md, *Reloading the configuration*).
 *
 * A reload applies the tenants (names, tokens, quotas, leases, ttls, policies), the admin
 * token, the proxy routes, the TLS files (tls.cert_file, key_file, ca_file and
 * http_client_certs) and log.level. Everything else takes effect only at a restart: the
 * node, cluster, raft, rpc, batch, http and expiry sections, the TLS switches (tls.rpc,
 * http, proxy, raft) and the proxy listeners (their number and addresses). A file that
 * changes one of those is not refused: the running value is kept and each such key named.
 *
 * Configuration references (config_ref): one configuration shared by the parts of a node
 * that read it, freed when the last one lets go of it. A reload swaps the current reference
 * for a new one; a request in flight (a proxy job) keeps the one it started with. */
#ifndef IDEM_SERVER_CONFIG_RELOAD_H
#define IDEM_SERVER_CONFIG_RELOAD_H

#include <stddef.h>

#include "config.h"

/* Called by config_reload_merge() once per setting whose new value is not taken: `key` is
 * its dotted name ("node.id", "raft.election_timeout_ms", "proxy[1].address"). */
typedef void (*config_kept_fn)(void *arg, const char *key);

/* Makes `next` (just loaded from the file `name` by config_load) the configuration a node
 * running with `cur` switches to: every setting that changes only with a restart takes
 * cur's value, kept(arg, key) naming each one whose value in next differed. Then checks what
 * the kept values and the new ones must satisfy together (a TLS switch kept on needs the TLS
 * files, a secret kept must differ from every new token, a proxy route kept must name a
 * tenant still configured). Returns 0, or -1 with "FILE[:LINE:COLUMN]: why" in err (errlen
 * bytes), never with a token hash or secret in it; next is then to be freed by the caller
 * (config_free) and cur is untouched either way. cur and name are borrowed for the call. */
int config_reload_merge(struct config *next, const struct config *cur, const char *name,
                        config_kept_fn kept, void *arg, char *err, size_t errlen);

/* A configuration shared by reference: `cfg` first, so that the config a part holds is
 * found from its reference and the other way round. */
struct config_ref {
    struct config cfg;
    unsigned refs;
};

/* A new reference (refs 1) to a zeroed configuration, for config_load() to fill. */
struct config_ref *config_ref_new(void);

/* Takes one more reference to r; returns r. */
struct config_ref *config_ref_hold(struct config_ref *r);

/* Drops one reference; the last frees the configuration (config_free) and r. Accepts NULL. */
void config_ref_drop(struct config_ref *r);

#endif
