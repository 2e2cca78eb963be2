/* tls: see tls.h. One SSL per connection between two memory BIOs: rbio holds what the
 * network sent and the SSL has not consumed yet, wbio what the SSL produced for the network.
 * Both are owned by the SSL (SSL_set_bio). */
#include "tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "xmalloc.h"

struct tls_ctx {
    SSL_CTX *ssl_ctx;
    enum tls_role role;
};

struct tls_conn {
    SSL *ssl;
    BIO *rbio;
    BIO *wbio;
    enum tls_role role;
    char errmsg[256];
};

/* Writes "tls: what path: <OpenSSL's first queued reason>" into err and clears the queue. */
static void ctxFail(char *err, size_t errlen, const char *what, const char *path)
{
    unsigned long e = ERR_peek_last_error();
    char reason[200];
    if (e != 0) {
        ERR_error_string_n(e, reason, sizeof reason);
    } else {
        snprintf(reason, sizeof reason, "unknown error");
    }
    ERR_clear_error();
    snprintf(err, errlen, "tls: %s%s%s: %s", what, path ? " " : "", path ? path : "", reason);
}

struct tls_ctx *tls_ctx_new(const struct config_tls *cfg, enum tls_role role, char *err,
                            size_t errlen)
{
    ERR_clear_error();
    if (role == TLS_SERVER && (cfg->cert_file == NULL || cfg->key_file == NULL)) {
        snprintf(err, errlen, "tls: a TLS listener needs cert_file and key_file");
        return NULL;
    }
    SSL_CTX *c = SSL_CTX_new(role == TLS_SERVER ? TLS_server_method() : TLS_client_method());
    if (c == NULL) {
        ctxFail(err, errlen, "context", NULL);
        return NULL;
    }
    if (SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1) {
        ctxFail(err, errlen, "context", NULL);
        goto fail;
    }
    if (cfg->cert_file != NULL) {
        if (SSL_CTX_use_certificate_chain_file(c, cfg->cert_file) != 1) {
            ctxFail(err, errlen, "cert_file", cfg->cert_file);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(c, cfg->key_file, SSL_FILETYPE_PEM) != 1) {
            ctxFail(err, errlen, "key_file", cfg->key_file);
            goto fail;
        }
        if (SSL_CTX_check_private_key(c) != 1) {
            ERR_clear_error();
            snprintf(err, errlen, "tls: key_file %s does not match cert_file %s", cfg->key_file,
                     cfg->cert_file);
            goto fail;
        }
    }
    if (cfg->ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(c, cfg->ca_file, NULL) != 1) {
            ctxFail(err, errlen, "ca_file", cfg->ca_file);
            goto fail;
        }
        int mode = SSL_VERIFY_PEER;
        if (role == TLS_SERVER) {
            mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
        }
        SSL_CTX_set_verify(c, mode, NULL);
        if (role == TLS_SERVER) {
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(cfg->ca_file);
            if (names != NULL) {
                SSL_CTX_set_client_CA_list(c, names);
            }
        }
    } else if (role == TLS_CLIENT) {
        /* No ca_file: the server is verified against the system's default CA store
         * (OpenSSL's default paths; the SSL_CERT_FILE and SSL_CERT_DIR environment
         * variables override them). */
        if (SSL_CTX_set_default_verify_paths(c) != 1) {
            ctxFail(err, errlen, "system CA store", NULL);
            goto fail;
        }
        SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
    }
    /* No session resumption state to keep between connections: RPC connections are long
     * lived, and this keeps memory use flat under connection churn. */
    if (role == TLS_SERVER) {
        SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(c, 0);
    }
    /* TLS 1.2 renegotiation would let a write wait for a read; refuse it (TLS 1.3 has
     * none). */
    SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(c, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    ERR_clear_error();
    struct tls_ctx *ctx = xmalloc(sizeof *ctx);
    ctx->ssl_ctx = c;
    ctx->role = role;
    return ctx;
fail:
    SSL_CTX_free(c);
    return NULL;
}

void tls_ctx_free(struct tls_ctx *ctx)
{
    if (ctx == NULL) {
        return;
    }
    SSL_CTX_free(ctx->ssl_ctx); /* connections hold their own reference (SSL_new) */
    free(ctx);
}

struct tls_conn *tls_conn_new(struct tls_ctx *ctx, const char *peer_name)
{
    struct tls_conn *t = xcalloc(1, sizeof *t);
    t->role = ctx->role;
    t->ssl = SSL_new(ctx->ssl_ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->rbio == NULL || t->wbio == NULL) {
        fputs("tls: out of memory\n", stderr);
        abort();
    }
    /* An empty rbio means "retry later", not end of file. */
    BIO_set_mem_eof_return(t->rbio, -1);
    BIO_set_mem_eof_return(t->wbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    if (ctx->role == TLS_SERVER) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        if (peer_name != NULL && peer_name[0] != '\0') {
            X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
            if (X509_VERIFY_PARAM_set1_ip_asc(vp, peer_name) != 1) {
                /* Not an IP literal: a host name, checked and sent as SNI. */
                ERR_clear_error();
                SSL_set_tlsext_host_name(t->ssl, peer_name);
                SSL_set1_host(t->ssl, peer_name);
            }
        }
    }
    return t;
}

void tls_conn_free(struct tls_conn *t)
{
    if (t == NULL) {
        return;
    }
    SSL_free(t->ssl); /* frees both BIOs */
    free(t);
}

void tls_conn_feed(struct tls_conn *t, const uint8_t *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int n = BIO_write(t->rbio, data, chunk);
        if (n <= 0) {
            fputs("tls: out of memory\n", stderr);
            abort();
        }
        data += n;
        len -= (size_t)n;
    }
}

/* Turns an SSL_* result <= 0 into TLS_WANT, TLS_CLOSED or TLS_ERROR (with the reason). */
static int connResult(struct tls_conn *t, int rv)
{
    int e = SSL_get_error(t->ssl, rv);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return TLS_WANT;
    case SSL_ERROR_ZERO_RETURN:
        return TLS_CLOSED;
    default: {
        unsigned long q = ERR_peek_last_error();
        if (q != 0) {
            char reason[200];
            ERR_error_string_n(q, reason, sizeof reason);
            snprintf(t->errmsg, sizeof t->errmsg, "%s", reason);
        } else if (e == SSL_ERROR_SYSCALL) {
            snprintf(t->errmsg, sizeof t->errmsg, "unexpected end of the TLS stream");
        } else {
            snprintf(t->errmsg, sizeof t->errmsg, "TLS error %d", e);
        }
        long vr = SSL_get_verify_result(t->ssl);
        if (vr != X509_V_OK) {
            size_t n = strlen(t->errmsg);
            snprintf(t->errmsg + n, sizeof t->errmsg - n, " (certificate: %s)",
                     X509_verify_cert_error_string(vr));
        }
        ERR_clear_error();
        return TLS_ERROR;
    }
    }
}

int tls_conn_read(struct tls_conn *t, uint8_t *buf, size_t cap)
{
    ERR_clear_error();
    int want = cap > (size_t)INT32_MAX ? INT32_MAX : (int)cap;
    int n = SSL_read(t->ssl, buf, want);
    if (n > 0) {
        return n;
    }
    return connResult(t, n);
}

int tls_conn_write(struct tls_conn *t, const uint8_t *data, size_t len)
{
    ERR_clear_error();
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int n = SSL_write(t->ssl, data, chunk);
        if (n <= 0) {
            int r = connResult(t, n);
            if (r == TLS_WANT) {
                /* With memory BIOs a write only waits for the handshake to finish. */
                snprintf(t->errmsg, sizeof t->errmsg, "write before the handshake finished");
            }
            return TLS_ERROR;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int tls_conn_handshake(struct tls_conn *t)
{
    ERR_clear_error();
    int rv = SSL_do_handshake(t->ssl);
    if (rv == 1) {
        return 0;
    }
    int r = connResult(t, rv);
    return r == TLS_CLOSED ? TLS_ERROR : r;
}

bool tls_conn_established(const struct tls_conn *t)
{
    return SSL_is_init_finished(t->ssl) == 1;
}

int tls_conn_shutdown(struct tls_conn *t)
{
    ERR_clear_error();
    if (!SSL_is_init_finished(t->ssl)) {
        return 0; /* nothing to close cleanly */
    }
    int rv = SSL_shutdown(t->ssl);
    if (rv >= 0) {
        return 0; /* 0: our close_notify is queued; the peer's may follow */
    }
    return connResult(t, rv) == TLS_WANT ? 0 : TLS_ERROR;
}

size_t tls_conn_pending(const struct tls_conn *t)
{
    return BIO_ctrl_pending(t->wbio);
}

size_t tls_conn_take(struct tls_conn *t, uint8_t *buf, size_t cap)
{
    int want = cap > (size_t)INT32_MAX ? INT32_MAX : (int)cap;
    int n = BIO_read(t->wbio, buf, want);
    return n > 0 ? (size_t)n : 0;
}

const char *tls_conn_errmsg(const struct tls_conn *t)
{
    return t->errmsg;
}
