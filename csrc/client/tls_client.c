#include "client/tls_client.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "client/socket.h"
#include "transport/tls.h"

/* Ciphertext read from the socket at a time: several records. */
#define IN_BUF_SIZE (64u << 10)
#define RECORD_PLAIN 16384u
#define RECORD_OVERHEAD 320u
/* Send pieces smaller than this share a record with their neighbours (a request's head, a
 * frame header); larger ones are encrypted from the caller's memory. */
#define COALESCE_BELOW 2048u
/* Plain text encrypted per call of a large send: the server decrypts one chunk while we
 * encrypt the next, rather than waiting for all of a 16 MiB request. */
#define CHUNK (256u << 10)

struct oi_ctls_s {
    SSL *ssl;
    char *in; /* ciphertext read: [in_off, in_len) not yet taken by OpenSSL */
    size_t in_off, in_len;
    char *out; /* records made: [out_off, out_len) not yet sent */
    size_t out_off, out_len, out_cap;
    size_t owed; /* plain-text bytes of the send whose records are in `out` */
    char why[256]; /* oi_ctls_error */
};

/* ---- the memory BIO, as the server's (transport/tls.c) ---------------------------------- */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_write(BIO *b, const char *data, int len)
{
    oi_ctls_t *t = BIO_get_data(b);
    size_t need = t->out_len + (size_t)len;
    if (need > t->out_cap) {
        size_t cap = t->out_cap ? t->out_cap * 2 : 4096;
        while (cap < need)
            cap *= 2;
        char *n = realloc(t->out, cap);
        if (n == NULL)
            return -1;
        t->out = n;
        t->out_cap = cap;
    }
    memcpy(t->out + t->out_len, data, (size_t)len);
    t->out_len += (size_t)len;
    return len;
}

static int bio_read(BIO *b, char *data, int len)
{
    oi_ctls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    size_t have = t->in_len - t->in_off;
    if (have == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t n = have < (size_t)len ? have : (size_t)len;
    memcpy(data, t->in + t->in_off, n);
    t->in_off += n;
    if (t->in_off == t->in_len)
        t->in_off = t->in_len = 0;
    return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static void make_bio_method(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "openinfer client connection");
    if (m == NULL || !BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) ||
        !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create)) {
        BIO_meth_free(m);
        return;
    }
    bio_method = m;
}

/* ---- configuration ----------------------------------------------------------------------- */

oi_ctls_config_t *oi_ctls_config_copy(const oi_ctls_config_t *cfg)
{
    oi_ctls_config_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    *c = *cfg;
    c->ca_file = cfg->ca_file ? strdup(cfg->ca_file) : NULL;
    c->cert_file = cfg->cert_file ? strdup(cfg->cert_file) : NULL;
    c->key_file = cfg->key_file ? strdup(cfg->key_file) : NULL;
    if ((cfg->ca_file && !c->ca_file) || (cfg->cert_file && !c->cert_file) || (cfg->key_file && !c->key_file)) {
        oi_ctls_config_free(c);
        return NULL;
    }
    return c;
}

void oi_ctls_config_free(oi_ctls_config_t *cfg)
{
    if (cfg == NULL)
        return;
    free(cfg->ca_file);
    free(cfg->cert_file);
    free(cfg->key_file);
    free(cfg);
}

/* ---- connecting ---------------------------------------------------------------------------- */

static int fail(char *err, size_t errlen, const char *what, const char *path)
{
    unsigned long e = ERR_peek_last_error();
    char reason[256] = "unknown error";
    if (e != 0)
        ERR_error_string_n(e, reason, sizeof(reason));
    ERR_clear_error();
    if (path != NULL)
        snprintf(err, errlen, "%s '%s': %s", what, path, reason);
    else
        snprintf(err, errlen, "%s: %s", what, reason);
    return -1;
}

static SSL_CTX *make_ctx(const oi_ctls_config_t *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        fail(err, errlen, "cannot make a TLS context", NULL);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_ciphersuites(ctx, OI_TLS13_CIPHERS); /* the server's choices (transport/tls.h) */
    if (cfg->verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (cfg->ca_file ? SSL_CTX_load_verify_locations(ctx, cfg->ca_file, NULL) != 1
                         : SSL_CTX_set_default_verify_paths(ctx) != 1) {
            fail(err, errlen, "cannot load the CA certificates", cfg->ca_file ? cfg->ca_file : "(system)");
            goto bad;
        }
    }
    if (cfg->cert_file != NULL) {
        const char *key = cfg->key_file ? cfg->key_file : cfg->cert_file;
        if (SSL_CTX_use_certificate_chain_file(ctx, cfg->cert_file) != 1) {
            fail(err, errlen, "cannot load the client certificate", cfg->cert_file);
            goto bad;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
            fail(err, errlen, "cannot load the client key (or it is not the certificate's)", key);
            goto bad;
        }
    }
    if (cfg->alpn != NULL) {
        unsigned char proto[32];
        size_t n = strlen(cfg->alpn);
        proto[0] = (unsigned char)n;
        memcpy(proto + 1, cfg->alpn, n);
        SSL_CTX_set_alpn_protos(ctx, proto, (unsigned)(n + 1));
    }
    return ctx;
bad:
    SSL_CTX_free(ctx);
    return NULL;
}

/* Sends every byte of `out`, waiting for the socket before `deadline`: 0, -1 or -2. */
static int flush_blocking(oi_ctls_t *t, int fd, int64_t deadline)
{
    while (t->out_off < t->out_len) {
        ssize_t w = send(fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        if (w < 0) {
            int rc = oi_client_wait_fd(fd, POLLOUT, deadline);
            if (rc != 0)
                return rc;
            continue;
        }
        t->out_off += (size_t)w;
    }
    t->out_off = t->out_len = 0;
    return 0;
}

int oi_ctls_connect(const oi_ctls_config_t *cfg, const char *host, int fd, int64_t deadline, oi_ctls_t **out,
                    char *err, size_t errlen)
{
    pthread_once(&bio_once, make_bio_method);
    *out = NULL;
    oi_ctls_t *t = calloc(1, sizeof(*t));
    SSL_CTX *ctx = t && bio_method ? make_ctx(cfg, err, errlen) : NULL;
    if (ctx == NULL) {
        if (t == NULL || bio_method == NULL)
            snprintf(err, errlen, "out of memory");
        free(t);
        return -1;
    }
    t->ssl = SSL_new(ctx);
    SSL_CTX_free(ctx); /* the SSL holds its own reference */
    BIO *bio = t->ssl ? BIO_new(bio_method) : NULL;
    t->in = bio ? malloc(IN_BUF_SIZE) : NULL;
    if (t->in == NULL) {
        BIO_free(bio);
        oi_ctls_free(t);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    BIO_set_data(bio, t);
    SSL_set_bio(t->ssl, bio, bio);
    SSL_set_connect_state(t->ssl);
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    if (!is_ip)
        SSL_set_tlsext_host_name(t->ssl, host);
    if (cfg->verify) {
        X509_VERIFY_PARAM *param = SSL_get0_param(t->ssl);
        if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host) != 1 : SSL_set1_host(t->ssl, host) != 1) {
            oi_ctls_free(t);
            return fail(err, errlen, "cannot check the server's name", host);
        }
    }
    for (;;) {
        ERR_clear_error();
        int rc = SSL_do_handshake(t->ssl);
        int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, rc);
        int sent = flush_blocking(t, fd, deadline);
        if (rc == 1 && sent == 0)
            break;
        if (sent != 0 || e == SSL_ERROR_WANT_READ) {
            int w = sent != 0 ? sent : oi_client_wait_fd(fd, POLLIN, deadline);
            ssize_t n = w == 0 ? recv(fd, t->in + t->in_len, IN_BUF_SIZE - t->in_len, MSG_DONTWAIT) : -1;
            if (n > 0) {
                t->in_len += (size_t)n;
                continue;
            }
            if (n < 0 && w == 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                continue;
            oi_ctls_free(t);
            if (w == -2) {
                snprintf(err, errlen, "timed out in the TLS handshake with %s", host);
                return -2;
            }
            snprintf(err, errlen, "%s closed the connection in the TLS handshake%s%s", host, n < 0 ? ": " : "",
                     n < 0 ? strerror(errno) : " (is it serving TLS, and did it accept our certificate?)");
            return -1;
        }
        long v = SSL_get_verify_result(t->ssl);
        if (v != X509_V_OK) {
            snprintf(err, errlen, "TLS handshake with %s: certificate verify failed: %s", host,
                     X509_verify_cert_error_string(v));
            ERR_clear_error();
        } else {
            char what[300];
            snprintf(what, sizeof(what), "TLS handshake with %s", host);
            fail(err, errlen, what, NULL);
        }
        oi_ctls_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void oi_ctls_free(oi_ctls_t *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl);
    free(t->in);
    free(t->out);
    free(t);
}

/* ---- sending and receiving --------------------------------------------------------------- */

static int write_plain(oi_ctls_t *t, const char *p, size_t n)
{
    ERR_clear_error();
    if (n > 0 && SSL_write(t->ssl, p, (int)n) <= 0) {
        ERR_clear_error();
        return -1;
    }
    return 0;
}

/* Encrypts the iovecs' first `total` bytes into `out`, small pieces gathered into shared
 * records. */
static int encrypt(oi_ctls_t *t, const struct iovec *iov, int n, size_t total)
{
    size_t need = t->out_len + total + (total / RECORD_PLAIN + 1) * RECORD_OVERHEAD;
    if (need > t->out_cap) {
        char *p = realloc(t->out, need);
        if (p == NULL)
            return -1;
        t->out = p;
        t->out_cap = need;
    }
    char small[RECORD_PLAIN];
    size_t nsmall = 0;
    for (int i = 0; i < n && total > 0; i++) {
        size_t len = iov[i].iov_len < total ? iov[i].iov_len : total;
        total -= len;
        if (len < COALESCE_BELOW && nsmall + len <= sizeof(small)) {
            memcpy(small + nsmall, iov[i].iov_base, len);
            nsmall += len;
            continue;
        }
        if (nsmall > 0 && write_plain(t, small, nsmall) != 0)
            return -1;
        nsmall = 0;
        if (len < COALESCE_BELOW) {
            memcpy(small, iov[i].iov_base, len);
            nsmall = len;
        } else if (write_plain(t, iov[i].iov_base, len) != 0) {
            return -1;
        }
    }
    return nsmall > 0 ? write_plain(t, small, nsmall) : 0;
}

ssize_t oi_ctls_sendmsg(oi_ctls_t *t, int fd, const struct iovec *iov, int n, int flags)
{
    if (t == NULL) {
        struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
        return sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
    }
    if (t->out_off == t->out_len) { /* a new send: its first CHUNK bytes become records now */
        size_t total = 0;
        for (int i = 0; i < n && total < CHUNK; i++)
            total += iov[i].iov_len;
        if (total > CHUNK)
            total = CHUNK;
        t->out_off = t->out_len = 0;
        if (encrypt(t, iov, n, total) != 0) {
            t->out_off = t->out_len = 0;
            errno = ENOMEM;
            return -1;
        }
        t->owed = total;
    }
    while (t->out_off < t->out_len) {
        ssize_t w = send(fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL | flags);
        if (w < 0)
            return -1; /* EAGAIN: the caller waits and comes back with the same bytes */
        t->out_off += (size_t)w;
    }
    t->out_off = t->out_len = 0;
    ssize_t done = (ssize_t)t->owed;
    t->owed = 0;
    return done;
}

ssize_t oi_ctls_recv(oi_ctls_t *t, int fd, void *buf, size_t len, int flags)
{
    if (t == NULL)
        return recv(fd, buf, len, flags);
    size_t got = 0;
    for (;;) {
        while (got < len) {
            ERR_clear_error();
            size_t want = len - got > (1u << 30) ? 1u << 30 : len - got;
            int n = SSL_read(t->ssl, (char *)buf + got, (int)want);
            if (n > 0) {
                got += (size_t)n;
                continue;
            }
            int e = SSL_get_error(t->ssl, n);
            unsigned long reason = ERR_peek_last_error();
            if (reason != 0)
                ERR_error_string_n(reason, t->why, sizeof(t->why));
            else
                snprintf(t->why, sizeof(t->why), "TLS error %d", e);
            ERR_clear_error();
            if (e == SSL_ERROR_WANT_READ)
                break;
            if (e == SSL_ERROR_ZERO_RETURN) /* the server's close_notify: the end */
                return (ssize_t)got;
            if (got > 0)
                return (ssize_t)got; /* the error again on the next call */
            errno = EPROTO;
            return -1;
        }
        if (got > 0)
            return (ssize_t)got;
        ssize_t r = recv(fd, t->in + t->in_len, IN_BUF_SIZE - t->in_len, flags);
        if (r <= 0)
            return r;
        t->in_len += (size_t)r;
    }
}

const char *oi_ctls_error(const oi_ctls_t *t) { return t->why; }

int oi_ctls_buffered(const oi_ctls_t *t)
{
    return t != NULL && (t->in_off < t->in_len || SSL_pending(t->ssl) > 0);
}
