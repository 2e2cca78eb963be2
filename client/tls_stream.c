/* tls_stream: see tls_stream.h. One SSL per stream between two memory BIOs: rbio holds what
 * the network sent and the SSL has not consumed yet, wbio what the SSL produced for the
 * network. Both are owned by the SSL (SSL_set_bio). */
#include "tls_stream.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

struct idem_tls_ctx {
    SSL_CTX *ssl_ctx;
    enum idem_tls_role role;
    char *server_name; /* client: owned; NULL: each stream's peer name */
};

struct idem_tls {
    SSL *ssl;
    BIO *rbio;
    BIO *wbio;
    char errmsg[256];
};

static bool given(const char *s)
{
    return s != NULL && s[0] != '\0';
}

/* snprintf into err, which may be NULL (libidem's why). */
static void errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* OpenSSL's text of the earliest queued error (the cause; what follows it says where it
 * surfaced) into buf, or `none`; clears the queue. Returns buf. */
static const char *sslReason(char *buf, size_t len, const char *none)
{
    unsigned long e = ERR_peek_error();
    if (e != 0) {
        ERR_error_string_n(e, buf, len);
    } else {
        snprintf(buf, len, "%s", none);
    }
    ERR_clear_error();
    return buf;
}

/* ---- contexts ---------------------------------------------------------------------------- */

/* How a role's errors name the files: as they are configured (see tls_stream.h). */
struct fileWords {
    const char *cert, *key, *ca;
};
static const struct fileWords serverWords = {"cert_file", "key_file", "ca_file"};
static const struct fileWords clientWords = {"certificate file", "key file", "CA file"};

/* "tls: <what> <path>: <OpenSSL's reason>" into err; returns IDEM_ETLS. */
static int ctxFail(char *err, size_t errlen, const char *what, const char *path)
{
    char reason[200];
    sslReason(reason, sizeof reason, "unknown error");
    errf(err, errlen, "tls: %s%s%s: %s", what, path ? " " : "", path ? path : "", reason);
    return IDEM_ETLS;
}

/* Loads p's certificate, key and trust into c. IDEM_OK or IDEM_ETLS (err). */
static int ctxLoad(SSL_CTX *c, const struct idem_tls_params *p, char *err, size_t errlen)
{
    const struct fileWords *w = p->role == IDEM_TLS_SERVER ? &serverWords : &clientWords;
    if (given(p->cert_file)) {
        if (SSL_CTX_use_certificate_chain_file(c, p->cert_file) != 1) {
            return ctxFail(err, errlen, w->cert, p->cert_file);
        }
        if (SSL_CTX_use_PrivateKey_file(c, p->key_file, SSL_FILETYPE_PEM) != 1) {
            return ctxFail(err, errlen, w->key, p->key_file);
        }
        if (SSL_CTX_check_private_key(c) != 1) {
            ERR_clear_error();
            errf(err, errlen, "tls: %s %s does not match %s %s", w->key, p->key_file, w->cert,
                 p->cert_file);
            return IDEM_ETLS;
        }
    }
    if (given(p->ca_file)) {
        if (SSL_CTX_load_verify_locations(c, p->ca_file, NULL) != 1) {
            return ctxFail(err, errlen, w->ca, p->ca_file);
        }
        if (p->role == IDEM_TLS_SERVER) {
            SSL_CTX_set_verify(c,
                               SSL_VERIFY_PEER |
                                   (p->client_cert_optional ? 0 : SSL_VERIFY_FAIL_IF_NO_PEER_CERT),
                               NULL);
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(p->ca_file);
            if (names != NULL) {
                SSL_CTX_set_client_CA_list(c, names);
            }
        }
    } else if (p->role == IDEM_TLS_CLIENT && SSL_CTX_set_default_verify_paths(c) != 1) {
        return ctxFail(err, errlen, "system CA store", NULL);
    }
    if (p->role == IDEM_TLS_CLIENT) {
        SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
    }
    return IDEM_OK;
}

int IdemTlsCtxNew(const struct idem_tls_params *p, struct idem_tls_ctx **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    ERR_clear_error();
    if (p->role == IDEM_TLS_SERVER && (!given(p->cert_file) || !given(p->key_file))) {
        errf(err, errlen, "tls: a TLS listener needs cert_file and key_file");
        return IDEM_EINVAL;
    }
    if (given(p->cert_file) != given(p->key_file)) {
        errf(err, errlen, "tls: a client certificate needs both cert and key files");
        return IDEM_EINVAL;
    }
    struct idem_tls_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL || (p->role == IDEM_TLS_CLIENT && given(p->server_name) &&
                        (ctx->server_name = strdup(p->server_name)) == NULL)) {
        free(ctx);
        errf(err, errlen, "out of memory");
        return IDEM_ENOMEM;
    }
    ctx->role = p->role;
    ctx->ssl_ctx =
        SSL_CTX_new(p->role == IDEM_TLS_SERVER ? TLS_server_method() : TLS_client_method());
    if (ctx->ssl_ctx == NULL) {
        char reason[200];
        errf(err, errlen, "tls: %s", sslReason(reason, sizeof reason, "out of memory"));
        IdemTlsCtxFree(ctx);
        return IDEM_ENOMEM;
    }
    SSL_CTX *c = ctx->ssl_ctx;
    int rv = IDEM_OK;
    if (SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1) {
        rv = ctxFail(err, errlen, "context", NULL);
    }
    if (rv == IDEM_OK) {
        rv = ctxLoad(c, p, err, errlen);
    }
    if (rv != IDEM_OK) {
        IdemTlsCtxFree(ctx);
        return rv;
    }
    /* No session resumption state to keep between connections: RPC connections are long
     * lived, and this keeps memory use flat under connection churn. */
    if (p->role == IDEM_TLS_SERVER) {
        SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(c, 0);
    }
    /* TLS 1.2 renegotiation would let a write wait for a read; refuse it (TLS 1.3 has
     * none). */
    SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
    /* RELEASE_BUFFERS: the engine's record buffers (about 34 KiB) are freed while a stream
     * has nothing in them, so that an idle connection does not hold them. */
    SSL_CTX_set_mode(c, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    ERR_clear_error();
    *out = ctx;
    return IDEM_OK;
}

void IdemTlsCtxFree(struct idem_tls_ctx *ctx)
{
    if (ctx == NULL) {
        return;
    }
    SSL_CTX_free(ctx->ssl_ctx); /* streams hold their own reference (SSL_new) */
    free(ctx->server_name);
    free(ctx);
}

struct ssl_ctx_st *IdemTlsCtxSsl(const struct idem_tls_ctx *ctx)
{
    return ctx->ssl_ctx;
}

/* ---- streams ----------------------------------------------------------------------------- */

/* The peer rule: `name` (the server's address or host name) is what its certificate must
 * carry. An address must be an IP subjectAltName and is not sent as SNI (RFC 6066 §3
 * allows host names only); a name is sent as SNI and checked against the DNS names, no
 * partial wildcards. False when out of memory. */
static bool setPeer(SSL *ssl, const char *name)
{
    unsigned char tmp[16];
    if (inet_pton(AF_INET, name, tmp) == 1 || inet_pton(AF_INET6, name, tmp) == 1) {
        return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
    }
    if (SSL_set_tlsext_host_name(ssl, name) != 1) {
        return false;
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return SSL_set1_host(ssl, name) == 1;
}

struct idem_tls *IdemTlsNew(struct idem_tls_ctx *ctx, const char *peer_name)
{
    struct idem_tls *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return NULL;
    }
    t->ssl = SSL_new(ctx->ssl_ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->rbio == NULL || t->wbio == NULL) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        goto fail;
    }
    /* An empty rbio means "retry later", not end of file (until IdemTlsFeedEof). */
    BIO_set_mem_eof_return(t->rbio, -1);
    BIO_set_mem_eof_return(t->wbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    if (ctx->role == IDEM_TLS_SERVER) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        const char *name = ctx->server_name != NULL ? ctx->server_name : peer_name;
        if (!given(name) || !setPeer(t->ssl, name)) {
            goto fail; /* an empty name would check no name at all: refused */
        }
    }
    return t;
fail:
    ERR_clear_error();
    SSL_free(t->ssl); /* frees the BIOs once set */
    free(t);
    return NULL;
}

void IdemTlsFree(struct idem_tls *t)
{
    if (t == NULL) {
        return;
    }
    SSL_free(t->ssl); /* frees both BIOs */
    free(t);
}

int IdemTlsFeed(struct idem_tls *t, const uint8_t *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int n = BIO_write(t->rbio, data, chunk);
        if (n <= 0) {
            ERR_clear_error();
            snprintf(t->errmsg, sizeof t->errmsg, "out of memory");
            return IDEM_TLS_ERROR;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

void IdemTlsFeedEof(struct idem_tls *t)
{
    BIO_set_mem_eof_return(t->rbio, 0); /* empty now reads as the end of the stream */
}

/* Turns an SSL_* result <= 0 into IDEM_TLS_WANT, IDEM_TLS_CLOSED or IDEM_TLS_ERROR (with
 * the reason). */
static int sslResult(struct idem_tls *t, int rv)
{
    int e = SSL_get_error(t->ssl, rv);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return IDEM_TLS_WANT;
    case SSL_ERROR_ZERO_RETURN:
        return IDEM_TLS_CLOSED;
    default: {
        char none[48];
        if (e == SSL_ERROR_SYSCALL) {
            snprintf(none, sizeof none, "unexpected end of the TLS stream");
        } else {
            snprintf(none, sizeof none, "TLS error %d", e);
        }
        sslReason(t->errmsg, sizeof t->errmsg, none);
        const char *vr = IdemTlsVerifyError(t);
        if (vr != NULL) {
            size_t n = strlen(t->errmsg);
            snprintf(t->errmsg + n, sizeof t->errmsg - n, " (certificate: %s)", vr);
        }
        return IDEM_TLS_ERROR;
    }
    }
}

int IdemTlsRead(struct idem_tls *t, uint8_t *buf, size_t cap)
{
    ERR_clear_error();
    int want = cap > (size_t)INT32_MAX ? INT32_MAX : (int)cap;
    int n = SSL_read(t->ssl, buf, want);
    if (n > 0) {
        return n;
    }
    return sslResult(t, n);
}

int IdemTlsWrite(struct idem_tls *t, const uint8_t *data, size_t len)
{
    ERR_clear_error();
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int n = SSL_write(t->ssl, data, chunk);
        if (n <= 0) {
            if (sslResult(t, n) == IDEM_TLS_WANT) {
                /* With memory BIOs a write only waits for the handshake to finish. */
                snprintf(t->errmsg, sizeof t->errmsg, "write before the handshake finished");
            }
            return IDEM_TLS_ERROR;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int IdemTlsHandshake(struct idem_tls *t)
{
    ERR_clear_error();
    int rv = SSL_do_handshake(t->ssl);
    if (rv == 1) {
        return 0;
    }
    int r = sslResult(t, rv);
    if (r == IDEM_TLS_CLOSED) {
        snprintf(t->errmsg, sizeof t->errmsg, "the peer closed the TLS stream in the handshake");
        return IDEM_TLS_ERROR;
    }
    return r;
}

bool IdemTlsEstablished(const struct idem_tls *t)
{
    return SSL_is_init_finished(t->ssl) == 1;
}

int IdemTlsShutdown(struct idem_tls *t)
{
    ERR_clear_error();
    if (!SSL_is_init_finished(t->ssl)) {
        return 0; /* nothing to close cleanly */
    }
    int rv = SSL_shutdown(t->ssl);
    if (rv >= 0) {
        return 0; /* 0: our close_notify is queued; the peer's may follow */
    }
    return sslResult(t, rv) == IDEM_TLS_WANT ? 0 : IDEM_TLS_ERROR;
}

size_t IdemTlsPending(const struct idem_tls *t)
{
    return BIO_ctrl_pending(t->wbio);
}

size_t IdemTlsTake(struct idem_tls *t, uint8_t *buf, size_t cap)
{
    int want = cap > (size_t)INT32_MAX ? INT32_MAX : (int)cap;
    int n = BIO_read(t->wbio, buf, want);
    return n > 0 ? (size_t)n : 0;
}

const char *IdemTlsErrmsg(const struct idem_tls *t)
{
    return t->errmsg;
}

const char *IdemTlsVerifyError(const struct idem_tls *t)
{
    long vr = SSL_get_verify_result(t->ssl);
    return vr == X509_V_OK ? NULL : X509_verify_cert_error_string(vr);
}

/* ---- libidem's options ------------------------------------------------------------------- */

bool IdemTlsWanted(const struct idem_options *opts)
{
    return opts->tls != 0 || given(opts->tls_ca_file) || given(opts->tls_cert_file) ||
           given(opts->tls_key_file) || given(opts->tls_server_name);
}

int IdemTlsContext(const struct idem_options *opts, struct idem_tls_ctx **out, char *why,
                   size_t why_len)
{
    struct idem_tls_params p = {
        .role = IDEM_TLS_CLIENT,
        .cert_file = opts->tls_cert_file,
        .key_file = opts->tls_key_file,
        .ca_file = opts->tls_ca_file,
        .server_name = opts->tls_server_name,
    };
    return IdemTlsCtxNew(&p, out, why, why_len);
}
