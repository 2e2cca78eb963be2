/* tls.c: the client's TLS context (OpenSSL 3): TLS 1.2 or later, the server's certificate
 * verified against the configured CA file (or the system store) and its name against the
 * node's host or the configured server name; an optional client certificate. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "internal.h"

static bool set(const char *s)
{
    return s != NULL && s[0] != '\0';
}

bool IdemTlsWanted(const struct idem_options *opts)
{
    return opts->tls != 0 || set(opts->tls_ca_file) || set(opts->tls_cert_file) ||
           set(opts->tls_key_file) || set(opts->tls_server_name);
}

const char *IdemTlsError(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e == 0) {
        snprintf(buf, len, "unknown TLS error");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

int IdemTlsContext(const struct idem_options *opts, SSL_CTX **out, char *why, size_t why_len)
{
    char ebuf[256];
    *out = NULL;
    if (set(opts->tls_cert_file) != set(opts->tls_key_file)) {
        IdemWhyf(why, why_len, "tls: a client certificate needs both cert and key files");
        return IDEM_EINVAL;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        IdemWhyf(why, why_len, "tls: %s", IdemTlsError(ebuf, sizeof ebuf));
        return IDEM_ENOMEM;
    }
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        IdemWhyf(why, why_len, "tls: %s", IdemTlsError(ebuf, sizeof ebuf));
        goto err;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (set(opts->tls_ca_file)) {
        if (SSL_CTX_load_verify_locations(ctx, opts->tls_ca_file, NULL) != 1) {
            IdemWhyf(why, why_len, "tls: CA file %s: %s", opts->tls_ca_file,
                     IdemTlsError(ebuf, sizeof ebuf));
            goto err;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        IdemWhyf(why, why_len, "tls: system CA store: %s", IdemTlsError(ebuf, sizeof ebuf));
        goto err;
    }
    if (set(opts->tls_cert_file)) {
        if (SSL_CTX_use_certificate_chain_file(ctx, opts->tls_cert_file) != 1) {
            IdemWhyf(why, why_len, "tls: certificate file %s: %s", opts->tls_cert_file,
                     IdemTlsError(ebuf, sizeof ebuf));
            goto err;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, opts->tls_key_file, SSL_FILETYPE_PEM) != 1) {
            IdemWhyf(why, why_len, "tls: key file %s: %s", opts->tls_key_file,
                     IdemTlsError(ebuf, sizeof ebuf));
            goto err;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            IdemWhyf(why, why_len, "tls: key file %s does not match the certificate",
                     opts->tls_key_file);
            goto err;
        }
    }
    *out = ctx;
    return IDEM_OK;

err:
    SSL_CTX_free(ctx);
    return IDEM_ETLS;
}

bool IdemTlsSetPeer(SSL *ssl, const char *host)
{
    unsigned char tmp[16];
    bool is_ip = inet_pton(AF_INET, host, tmp) == 1 || inet_pton(AF_INET6, host, tmp) == 1;
    if (is_ip) {
        /* An address: the certificate must list it as an IP subjectAltName. No SNI (RFC
         * 6066 §3 allows host names only). */
        X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
        return X509_VERIFY_PARAM_set1_ip_asc(param, host) == 1;
    }
    if (SSL_set_tlsext_host_name(ssl, host) != 1) {
        return false;
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return SSL_set1_host(ssl, host) == 1;
}
