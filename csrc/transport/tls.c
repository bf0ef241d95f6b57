#include "transport/tls.h"
#include "transport/tls_bio.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "transport/loop.h"

/* Ciphertext read from the socket at a time: several full records (16 KiB each), so that a
 * large body takes few reads. */
#define IN_BUF_SIZE (64u << 10)
/* Room for the record headers, tags and padding of one record beyond its plain text. */
#define RECORD_OVERHEAD 320u
#define RECORD_PLAIN 16384u
/* Send pieces smaller than this share a record (see encrypt_chunk). */
#define COALESCE_BELOW 2048u
/* Plain text encrypted per write of a large send (see encrypt_chunk). */
#define CHUNK (256u << 10)
/* What the protocol's alloc callback is asked for: one record's plain text fits. */
#define SUGGESTED_READ 65536u

struct oi_tls_ctx_s {
    atomic_int refs;
    pthread_mutex_t mu; /* guards ssl_ctx against a reload */
    SSL_CTX *ssl_ctx;
    char *cert_file, *key_file, *ca_file, *alpn;
    int mutual;
};

/* One write of ciphertext: the records of one send, and the send's own request to complete. */
typedef struct out_s {
    uv_write_t w;
    struct oi_tls_s *t;
    uv_write_t *req; /* the send it completes, or NULL (the handshake's records, a chunk) */
    uv_write_cb cb;
    int chunk; /* a chunk of the queued sends (see pump_out) */
    size_t len, cap;
    char data[];
} out_t;

/* A send of the protocol's, queued until its bytes are encrypted and written. */
typedef struct held_s {
    struct held_s *next;
    uv_write_t *req;
    uv_write_cb cb;
    unsigned nb, i; /* bufs[i] + off: the next byte to encrypt */
    size_t off;
    uv_buf_t bufs[];
} held_t;

struct oi_tls_s {
    SSL *ssl;
    uv_idle_t idle; /* delivers what was read before a stop, once reading starts again */
    uv_stream_t *s;
    uv_alloc_cb alloc;
    uv_read_cb read;
    char *in; /* ciphertext read from the socket: [in_off, in_len) not yet taken by OpenSSL;
               * NULL between reads (made by oi_tls_on_alloc) */
    size_t in_off, in_len;
    out_t *out;     /* records being made, NULL when none */
    held_t *held, **held_tail; /* sends not yet all encrypted, in order */
    int outs;                  /* writes of our records with libuv */
    int writing;               /* a chunk of `held` waits for the socket */
    int pumping;               /* pump_out is on the stack */
    int idle_closed;
    ssize_t sock_end; /* the socket's EOF or error, delivered after the bytes before it */
    int reading;      /* the protocol reads */
    int delivering;   /* deliver() is on the stack */
    int handshaken;
    int failed; /* the handshake or a record failed: the protocol hears UV_EPROTO */
    int http_hint; /* an HTTP/1.1 port: a plain-text request is told to use https:// */
    int closed;
};

/* ---- the memory BIO --------------------------------------------------------------------- */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

/* Appends OpenSSL's records to the send being made. */
static int bio_write(BIO *b, const char *data, int len)
{
    oi_tls_t *t = BIO_get_data(b);
    out_t *o = t->out;
    size_t need = (o ? o->len : 0) + (size_t)len;
    if (o == NULL || need > o->cap) {
        size_t cap = o ? o->cap * 2 : 4096;
        while (cap < need)
            cap *= 2;
        out_t *n = realloc(o, sizeof(*n) + cap);
        if (n == NULL)
            return -1;
        if (o == NULL)
            n->len = 0;
        n->cap = cap;
        t->out = o = n;
    }
    memcpy(o->data + o->len, data, (size_t)len);
    o->len += (size_t)len;
    return len;
}

/* Hands OpenSSL the ciphertext read from the socket; asks it to retry when none is left. */
static int bio_read(BIO *b, char *data, int len)
{
    oi_tls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    size_t have = t->in_len - t->in_off;
    if (have == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t n = have < (size_t)len ? have : (size_t)len;
    memcpy(data, t->in + t->in_off, n);
    t->in_off += n;
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

BIO_METHOD *oi_tls_bio_method_new(const char *name, int (*write)(BIO *, const char *, int),
                                  int (*read)(BIO *, char *, int))
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, name);
    if (m == NULL || !BIO_meth_set_write(m, write) || !BIO_meth_set_read(m, read) ||
        !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create)) {
        BIO_meth_free(m);
        return NULL;
    }
    return m;
}

static void make_bio_method(void)
{
    bio_method = oi_tls_bio_method_new("openinfer connection", bio_write, bio_read);
}

/* ---- contexts ------------------------------------------------------------------------------ */

static void ssl_error(char *err, size_t errlen, const char *what, const char *path)
{
    unsigned long e = ERR_peek_last_error();
    char reason[256] = "unknown error";
    if (e != 0)
        ERR_error_string_n(e, reason, sizeof(reason));
    ERR_clear_error();
    snprintf(err, errlen, "%s '%s': %s", what, path, reason);
}

/* Picks the context's protocol when the client offers it; without it the handshake goes on with
 * none (a client that offers only another protocol is answered in ours and finds out there). */
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg)
{
    (void)ssl;
    const char *want = arg;
    size_t wlen = strlen(want);
    for (unsigned i = 0; i < inlen; i += 1u + in[i])
        if (i + 1u + in[i] <= inlen && in[i] == wlen && memcmp(in + i + 1, want, wlen) == 0) {
            *out = in + i + 1;
            *outlen = in[i];
            return SSL_TLSEXT_ERR_OK;
        }
    return SSL_TLSEXT_ERR_NOACK;
}

/* Whether `path` can be read; else says why in `err` (OpenSSL's own reason is "system lib"). */
static int readable(const char *path, const char *what, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read the %s '%s': %s", what, path, strerror(errno));
        return 0;
    }
    fclose(f);
    return 1;
}

static SSL_CTX *load_ctx(const oi_tls_ctx_t *c, char *err, size_t errlen)
{
    if (!readable(c->cert_file, "server certificate", err, errlen) ||
        !readable(c->key_file, "server key", err, errlen) ||
        (c->ca_file != NULL && !readable(c->ca_file, "root certificate", err, errlen)))
        return NULL;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        snprintf(err, errlen, "cannot make a TLS context: out of memory");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* AEAD ciphers with forward secrecy only, AES-128-GCM first: fewer rounds per byte than
     * AES-256-GCM (OpenSSL's first choice); with AES-NI only ~4% faster (`openssl speed` on
     * the EPYC of benchmarks/results/tls.md), more where the instructions are missing. */
    SSL_CTX_set_ciphersuites(ctx, OI_TLS13_CIPHERS);
    SSL_CTX_set_cipher_list(ctx, OI_TLS12_CIPHERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, c->cert_file) != 1) {
        ssl_error(err, errlen, "cannot load the server certificate", c->cert_file);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, c->key_file, SSL_FILETYPE_PEM) != 1) {
        ssl_error(err, errlen, "cannot load the server key (or it is not the certificate's)", c->key_file);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ssl_error(err, errlen, "the server key does not match the certificate", c->key_file);
        goto fail;
    }
    if (c->ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(ctx, c->ca_file, NULL) != 1) {
            ssl_error(err, errlen, "cannot load the root certificate", c->ca_file);
            goto fail;
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(c->ca_file);
        if (names != NULL) /* the CAs a client may pick its certificate by */
            SSL_CTX_set_client_CA_list(ctx, names);
    }
    if (c->mutual)
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    if (c->alpn != NULL)
        SSL_CTX_set_alpn_select_cb(ctx, select_alpn, c->alpn);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

oi_tls_ctx_t *oi_tls_ctx_new(const oi_tls_config_t *cfg, char *err, size_t errlen)
{
    pthread_once(&bio_once, make_bio_method);
    if (bio_method == NULL) {
        snprintf(err, errlen, "cannot make a TLS context: out of memory");
        return NULL;
    }
    if (cfg->cert_file == NULL || cfg->key_file == NULL || (cfg->mutual && cfg->ca_file == NULL)) {
        snprintf(err, errlen, "%s", cfg->cert_file == NULL ? "TLS needs a server certificate"
                                    : cfg->key_file == NULL ? "TLS needs a server key"
                                                            : "mutual TLS needs a root certificate to verify clients");
        return NULL;
    }
    oi_tls_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    c->mutual = cfg->mutual;
    c->cert_file = strdup(cfg->cert_file);
    c->key_file = strdup(cfg->key_file);
    c->ca_file = dup_or_null(cfg->ca_file);
    c->alpn = dup_or_null(cfg->alpn);
    if (c->cert_file == NULL || c->key_file == NULL || (cfg->ca_file && c->ca_file == NULL) ||
        (cfg->alpn && c->alpn == NULL)) {
        snprintf(err, errlen, "out of memory");
        oi_tls_ctx_unref(c);
        return NULL;
    }
    if ((c->ssl_ctx = load_ctx(c, err, errlen)) == NULL) {
        oi_tls_ctx_unref(c);
        return NULL;
    }
    return c;
}

int oi_tls_ctx_reload(oi_tls_ctx_t *c, char *err, size_t errlen)
{
    SSL_CTX *fresh = load_ctx(c, err, errlen);
    if (fresh == NULL)
        return -1;
    pthread_mutex_lock(&c->mu);
    SSL_CTX *old = c->ssl_ctx;
    c->ssl_ctx = fresh;
    pthread_mutex_unlock(&c->mu);
    SSL_CTX_free(old); /* the connections made from it hold their own references */
    return 0;
}

oi_tls_ctx_t *oi_tls_ctx_ref(oi_tls_ctx_t *c)
{
    if (c != NULL)
        atomic_fetch_add(&c->refs, 1);
    return c;
}

void oi_tls_ctx_unref(oi_tls_ctx_t *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    SSL_CTX_free(c->ssl_ctx);
    pthread_mutex_destroy(&c->mu);
    free(c->cert_file);
    free(c->key_file);
    free(c->ca_file);
    free(c->alpn);
    free(c);
}

/* ---- connections ------------------------------------------------------------------------- */

static void on_idle(uv_idle_t *idle);

oi_tls_t *oi_tls_new(oi_tls_ctx_t *ctx, uv_loop_t *loop, uv_stream_t *s, uv_alloc_cb alloc, uv_read_cb read)
{
    oi_tls_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    pthread_mutex_lock(&ctx->mu);
    t->ssl = SSL_new(ctx->ssl_ctx);
    pthread_mutex_unlock(&ctx->mu);
    BIO *bio = t->ssl ? BIO_new(bio_method) : NULL;
    if (bio == NULL) {
        SSL_free(t->ssl);
        free(t);
        return NULL;
    }
    BIO_set_data(bio, t);
    SSL_set_bio(t->ssl, bio, bio); /* the SSL takes the reference */
    SSL_set_accept_state(t->ssl);
    t->s = s;
    t->alloc = alloc;
    t->read = read;
    t->held_tail = &t->held;
    t->http_hint = ctx->alpn != NULL && strcmp(ctx->alpn, "http/1.1") == 0;
    uv_idle_init(loop, &t->idle);
    t->idle.data = t;
    return t;
}

static void maybe_free(oi_tls_t *t);

static void on_idle_closed(uv_handle_t *h)
{
    oi_tls_t *t = h->data;
    held_t *held = t->held;
    t->held = NULL;
    for (held_t *next; held != NULL; held = next) {
        next = held->next;
        held->cb(held->req, UV_ECANCELED);
        free(held);
    }
    t->idle_closed = 1;
    maybe_free(t);
}

void oi_tls_close(oi_tls_t *t)
{
    if (t == NULL || t->closed)
        return;
    t->closed = 1;
    t->reading = 0;
    uv_close((uv_handle_t *)&t->idle, on_idle_closed);
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Frees `t` once it is closed and no write of its records is with libuv (a stream's pending
 * writes are cancelled when the stream closes, possibly after our idle handle has closed). */
static void maybe_free(oi_tls_t *t)
{
    if (!t->idle_closed || t->outs > 0)
        return;
    SSL_free(t->ssl);
    free(t->out);
    free(t->in);
    free(t);
}

static int pump_out(oi_tls_t *t, held_t *mine);

static void after_out(uv_write_t *w, int status)
{
    out_t *o = (out_t *)w;
    oi_tls_t *t = o->t;
    uv_write_t *req = o->req;
    uv_write_cb cb = o->cb;
    int chunk = o->chunk;
    free(o);
    t->outs--;
    if (chunk)
        t->writing = 0;
    if (status < 0)
        t->failed = 1;
    if (cb != NULL)
        cb(req, status);
    if (!t->closed)
        pump_out(t, NULL);
    maybe_free(t);
}

/* Writes the records made so far as one buffer; `h` (NULL for records of the handshake's or
 * of a chunk that ends no send) is the send it completes. 1 written at once, 0 queued (then
 * after_out completes `h`), or a libuv error. */
static int flush_out(oi_tls_t *t, const held_t *h, int chunk)
{
    out_t *o = t->out;
    if (o == NULL || o->len == 0)
        return 1;
    t->out = NULL;
    o->t = t;
    o->req = h ? h->req : NULL;
    o->cb = h ? h->cb : NULL;
    o->chunk = chunk;
    uv_buf_t b = uv_buf_init(o->data, (unsigned)o->len);
    int rc = oi_stream_send(t->s, &o->w, &b, 1, after_out);
    if (rc != 0) {
        free(o);
        return rc;
    }
    t->outs++;
    if (chunk)
        t->writing = 1;
    return 0;
}

/* Makes room for the records of `plain` bytes, so that encrypting appends without
 * reallocating. 0 or -1. */
static int reserve_out(oi_tls_t *t, size_t plain)
{
    size_t need = (t->out ? t->out->len : 0) + plain + (plain / RECORD_PLAIN + 1) * RECORD_OVERHEAD;
    if (t->out != NULL && t->out->cap >= need)
        return 0;
    out_t *n = realloc(t->out, sizeof(*n) + need);
    if (n == NULL)
        return -1;
    if (t->out == NULL)
        n->len = 0;
    n->cap = need;
    t->out = n;
    return 0;
}

static int write_plain(oi_tls_t *t, const char *p, size_t n)
{
    ERR_clear_error();
    if (n > 0 && SSL_write(t->ssl, p, (int)n) <= 0) {
        ERR_clear_error();
        return -1;
    }
    return 0;
}

/* Encrypts the next CHUNK bytes or so of send `h` into t->out: 1 when `h` is all encrypted,
 * 0 when more is left, -1 on failure. A large answer goes out a chunk at a time, each
 * encrypted once the one before has gone to the socket, so the peer decrypts one while we
 * encrypt the next, and the loop serves its other connections in between. Pieces under
 * COALESCE_BELOW bytes (HTTP heads, HTTP/2 frame headers, gRPC prefixes) are gathered into
 * one record with their neighbours rather than each making a record of its own; larger ones,
 * a tensor's bytes, are encrypted from where they are. */
static int encrypt_chunk(oi_tls_t *t, held_t *h)
{
    char small[RECORD_PLAIN];
    size_t left = 0; /* what this chunk will hold: the send's rest, up to a chunk (and the
                      * small pieces gathered past its end) */
    for (unsigned j = h->i; j < h->nb && left <= CHUNK; j++)
        left += h->bufs[j].len - (j == h->i ? h->off : 0);
    if (reserve_out(t, left <= CHUNK ? left : CHUNK + sizeof(small)) != 0)
        return -1;
    size_t nsmall = 0, done = 0;
    int rc = 0;
    while (h->i < h->nb && done < CHUNK && rc == 0) {
        const char *p = h->bufs[h->i].base + h->off;
        size_t n = h->bufs[h->i].len - h->off;
        if (n < COALESCE_BELOW && nsmall + n <= sizeof(small)) {
            memcpy(small + nsmall, p, n);
            nsmall += n;
            done += n;
            h->i++;
            h->off = 0;
            continue;
        }
        if (nsmall > 0) { /* what was gathered goes first; then this piece */
            rc = write_plain(t, small, nsmall);
            nsmall = 0;
            continue;
        }
        size_t take = n < CHUNK - done ? n : CHUNK - done;
        rc = write_plain(t, p, take);
        done += take;
        if ((h->off += take) == h->bufs[h->i].len) {
            h->i++;
            h->off = 0;
        }
    }
    if (rc == 0 && nsmall > 0)
        rc = write_plain(t, small, nsmall);
    if (rc != 0) {
        free(t->out);
        t->out = NULL;
        t->failed = 1;
        return -1;
    }
    return h->i == h->nb;
}

/* Encrypts and writes the queued sends, a chunk at a time, while no chunk waits for the
 * socket. Completes each send as libuv would: its callback runs once its last chunk has been
 * written; for `mine` (the send being made) a completion at once is returned instead (1, or
 * an error), as oi_stream_send does. 0: `mine` completes later, through its callback. */
static int pump_out(oi_tls_t *t, held_t *mine)
{
    if (t->pumping)
        return 0;
    t->pumping = 1;
    int result = 0;
    while (t->held != NULL && !t->writing && !t->closed && t->handshaken) {
        held_t *h = t->held;
        int fin = t->failed ? -1 : encrypt_chunk(t, h);
        int rc = fin < 0 ? UV_EPIPE : flush_out(t, fin ? h : NULL, 1);
        if (rc < 0)
            t->failed = 1;
        if (fin == 0 && rc >= 0)
            continue; /* more of h: the next chunk, now or once this one is written */
        t->held = h->next;
        if (t->held == NULL)
            t->held_tail = &t->held;
        if (rc != 0 && h == mine)
            result = rc;
        else if (rc != 0)
            h->cb(h->req, rc == 1 ? 0 : rc);
        free(h);
    }
    t->pumping = 0;
    return result;
}

int oi_tls_send(oi_tls_t *t, uv_stream_t *s, uv_write_t *req, uv_buf_t *bufs, unsigned nb, uv_write_cb cb)
{
    if (t == NULL)
        return oi_stream_send(s, req, bufs, nb, cb);
    if (t->closed || t->failed)
        return UV_EPIPE;
    /* Queued, in order: encrypted at once when nothing waits (nearly always), else once the
     * handshake is done (HTTP/2's SETTINGS go out first) or the chunk before has gone. */
    held_t *h = malloc(sizeof(*h) + nb * sizeof(uv_buf_t));
    if (h == NULL)
        return UV_ENOMEM;
    h->next = NULL;
    h->req = req;
    h->cb = cb;
    h->nb = nb;
    h->i = 0;
    h->off = 0;
    memcpy(h->bufs, bufs, nb * sizeof(uv_buf_t));
    *t->held_tail = h;
    t->held_tail = &h->next;
    return pump_out(t, h);
}

/* ---- reading ------------------------------------------------------------------------------ */

static int buffered(const oi_tls_t *t) { return t->in_off < t->in_len || SSL_has_pending(t->ssl); }

/* Gives the protocol the end of the stream: the socket's, or UV_EPROTO for a failed handshake
 * or record (a plain-text client, a certificate refused, bytes that are not TLS). */
static void deliver_end(oi_tls_t *t, ssize_t end)
{
    uv_buf_t b = uv_buf_init(NULL, 0);
    t->reading = 0;
    t->read(t->s, end, &b);
}

/* A handshake that failed because the client spoke plain HTTP (`curl http://` on an https
 * port) is answered in plain HTTP, saying so, as nginx does, rather than only closed. */
static void answer_plain_http(oi_tls_t *t)
{
    static const char *const methods[] = {"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH "};
    int http = 0;
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        http |= t->in_len >= strlen(methods[i]) && memcmp(t->in, methods[i], strlen(methods[i])) == 0;
    if (!t->http_hint || !http)
        return;
    static const char answer[] = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                                 "Connection: close\r\nContent-Length: 80\r\n\r\n"
                                 "{\"error\":\"this port serves HTTPS: the request came in plain text; use https://\"}";
    uv_buf_t b = uv_buf_init((char *)answer, sizeof(answer) - 1);
    uv_try_write(t->s, &b, 1); /* best effort: the connection closes next */
}

static int stopped(const oi_tls_t *t) { return !t->reading || t->closed || uv_is_closing((uv_handle_t *)t->s); }

/* Runs the handshake, then decrypts what was read into the protocol's buffers, while it reads. */
static void deliver(oi_tls_t *t)
{
    if (t->delivering)
        return;
    t->delivering = 1;
    while (!stopped(t)) {
        ERR_clear_error();
        if (!t->handshaken) {
            int rc = SSL_do_handshake(t->ssl);
            int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, rc);
            flush_out(t, NULL, 0); /* the handshake's own records */
            if (rc == 1) {
                t->handshaken = 1;
                pump_out(t, NULL);
                continue;
            }
            if (e == SSL_ERROR_WANT_READ && t->sock_end == 0)
                break;
            t->failed = 1;
            if (t->sock_end == 0)
                answer_plain_http(t);
            deliver_end(t, t->sock_end ? t->sock_end : UV_EPROTO);
            break;
        }
        uv_buf_t b = uv_buf_init(NULL, 0);
        t->alloc((uv_handle_t *)t->s, SUGGESTED_READ, &b);
        if (b.base == NULL || b.len == 0) {
            deliver_end(t, UV_ENOBUFS);
            break;
        }
        /* As many records as the buffer takes, handed over at once as a socket read would
         * be: one callback (and one answer from HTTP/2, its WINDOW_UPDATEs) per read rather
         * than per 16 KiB record. */
        size_t cap = b.len > (1u << 30) ? 1u << 30 : b.len, got = 0;
        int e = SSL_ERROR_NONE;
        while (got < cap) {
            int n = SSL_read(t->ssl, b.base + got, (int)(cap - got));
            if (n <= 0) {
                e = SSL_get_error(t->ssl, n);
                break;
            }
            got += (size_t)n;
        }
        if (t->out != NULL && t->out->len > 0)
            flush_out(t, NULL, 0); /* a TLS 1.3 key update's answer */
        if (got > 0) {
            t->read(t->s, (ssize_t)got, &b);
            if (e != SSL_ERROR_WANT_READ || t->sock_end != 0)
                continue; /* the buffer is full, or the end comes next */
            break;
        }
        if (e == SSL_ERROR_WANT_READ && t->sock_end == 0)
            break;
        if (e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_WANT_READ) {
            deliver_end(t, t->sock_end ? t->sock_end : UV_EOF);
            break;
        }
        t->failed = 1;
        deliver_end(t, UV_EPROTO);
        break;
    }
    ERR_clear_error();
    if (t->in_off == t->in_len) { /* all taken: an idle connection holds no read buffer */
        free(t->in);
        t->in = NULL;
        t->in_off = t->in_len = 0;
    }
    t->delivering = 0;
}

static void on_idle(uv_idle_t *idle)
{
    oi_tls_t *t = idle->data;
    uv_idle_stop(idle);
    deliver(t);
}

int oi_tls_read_start(oi_tls_t *t, uv_stream_t *s, uv_alloc_cb sock_alloc, uv_read_cb sock_read)
{
    if (t == NULL)
        return uv_read_start(s, sock_alloc, sock_read);
    if (t->closed)
        return UV_EINVAL;
    int rc = t->sock_end != 0 ? 0 : uv_read_start(s, sock_alloc, sock_read);
    if (rc != 0 && rc != UV_EALREADY)
        return rc;
    t->reading = 1;
    /* Bytes read before a stop are not announced by the socket again. */
    if (buffered(t) || t->sock_end != 0)
        uv_idle_start(&t->idle, on_idle);
    return 0;
}

void oi_tls_read_stop(oi_tls_t *t, uv_stream_t *s)
{
    uv_read_stop(s);
    if (t != NULL) {
        t->reading = 0;
        uv_idle_stop(&t->idle);
    }
}

void oi_tls_on_alloc(oi_tls_t *t, uv_buf_t *buf)
{
    if (t->in == NULL && (t->in = malloc(IN_BUF_SIZE)) == NULL) {
        *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS: the connection ends */
        return;
    }
    if (t->in_off > 0) { /* bytes OpenSSL has not taken yet move to the front */
        memmove(t->in, t->in + t->in_off, t->in_len - t->in_off);
        t->in_len -= t->in_off;
        t->in_off = 0;
    }
    *buf = uv_buf_init(t->in + t->in_len, (unsigned)(IN_BUF_SIZE - t->in_len));
}

void oi_tls_on_read(oi_tls_t *t, ssize_t nread)
{
    if (nread == 0 || t->closed)
        return;
    if (nread < 0)
        t->sock_end = nread;
    else
        t->in_len += (size_t)nread;
    deliver(t);
}
