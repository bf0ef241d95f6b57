/* libFuzzer target for the TLS record path of the server's connections (transport/tls.c): a
 * socketpair whose server end is read through oi_tls_* on a libuv loop, as http1.c and
 * http2.c read theirs, with a protocol above that echoes what it reads (so the write path
 * runs too) and stops and restarts reading as the input says (the delivery of what was read
 * before a stop). The input's first byte picks what the client end writes:
 *   0: the rest, raw, from the first byte (ClientHellos, alerts, records of any kind);
 *   1: a real handshake (an OpenSSL client in memory), then the rest raw (forged records);
 *   2: a real handshake, then the rest as application data, in records of the sizes its
 *      bytes give, each byte of which must come back in the echo.
 * Bit 7 of that byte makes the protocol stop reading after each delivery and start again on
 * the next turn of the loop. The certificate is made at start (an EC key, self-signed).
 *
 *   make fuzz FUZZ_TARGETS=fuzz_tls     (builds with clang -fsanitize=fuzzer,address,undefined)
 *
 * Built with -DOI_FUZZ_MAIN it replays files and corpus directories instead, with gcc too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <uv.h>

#include "transport/tls.h"

static uv_loop_t loop;
static oi_tls_ctx_t *ctx;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_tls: %s\n", what);
    abort();
}

/* A key and a self-signed certificate for "localhost", in files (oi_tls_ctx_new reads files). */
static void make_identity(char *cert_path, char *key_path)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    if (key == NULL || x == NULL)
        die("cannot make a key");
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, name);
    if (X509_sign(x, key, EVP_sha256()) == 0)
        die("cannot sign");
    int cfd = mkstemp(cert_path), kfd = mkstemp(key_path);
    FILE *cf = cfd >= 0 ? fdopen(cfd, "w") : NULL, *kf = kfd >= 0 ? fdopen(kfd, "w") : NULL;
    if (cf == NULL || kf == NULL || !PEM_write_X509(cf, x) || !PEM_write_PrivateKey(kf, key, NULL, NULL, 0, NULL, NULL))
        die("cannot write the certificate");
    fclose(cf);
    fclose(kf);
    X509_free(x);
    EVP_PKEY_free(key);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char cert[] = "/tmp/fuzz_tls_cert_XXXXXX", key[] = "/tmp/fuzz_tls_key_XXXXXX", err[512];
    make_identity(cert, key);
    oi_tls_config_t cfg = {.cert_file = cert, .key_file = key, .alpn = "http/1.1"};
    ctx = oi_tls_ctx_new(&cfg, err, sizeof(err));
    unlink(cert);
    unlink(key);
    if (ctx == NULL)
        die(err);
    if (uv_loop_init(&loop) != 0)
        die("uv_loop_init");
    return 0;
}

/* ---- the server end: a protocol that echoes ------------------------------------------------ */

typedef struct conn_s {
    uv_pipe_t pipe;
    oi_tls_t *tls;
    char rbuf[4096];
    int closed, stop_each, stopped;
    size_t echoed;
} conn_t;

typedef struct echo_s {
    uv_write_t w;
    conn_t *c;
    char data[];
} echo_t;

static void conn_close(conn_t *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    uv_close((uv_handle_t *)&c->pipe, NULL);
    oi_tls_close(c->tls);
}

static void after_echo(uv_write_t *w, int status)
{
    echo_t *e = (echo_t *)w;
    if (status < 0)
        conn_close(e->c);
    free(e);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    echo_t *e = malloc(sizeof(*e) + (size_t)nread);
    if (e == NULL)
        die("out of memory");
    e->c = c;
    memcpy(e->data, buf->base, (size_t)nread);
    /* Two pieces, as the protocols send a head and a body: the small one is gathered. */
    size_t head = (size_t)nread < 16 ? (size_t)nread : 16;
    uv_buf_t bufs[2] = {uv_buf_init(e->data, (unsigned)head), uv_buf_init(e->data + head, (unsigned)(nread - head))};
    c->echoed += (size_t)nread;
    int rc = oi_tls_send(c->tls, s, &e->w, bufs, 2, after_echo);
    if (rc != 0)
        after_echo(&e->w, rc == 1 ? 0 : rc);
    if (c->stop_each && !c->closed) {
        oi_tls_read_stop(c->tls, s);
        c->stopped = 1;
    }
}

static void on_sock_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    oi_tls_on_alloc(((conn_t *)h->data)->tls, buf);
}

static void on_sock_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    oi_tls_on_read(((conn_t *)s->data)->tls, nread);
}

/* ---- the client end -------------------------------------------------------------------- */

typedef struct client_s {
    int fd;
    SSL *ssl; /* NULL: raw bytes only */
    BIO *rbio, *wbio;
    int server_gone;
} client_t;

/* Writes what the client's TLS made, reads what the server sent into it, and turns the loop
 * until nothing moves. */
static void pump(client_t *cl, conn_t *c)
{
    char buf[16384];
    for (int idle = 0; idle < 3;) {
        int moved = 0;
        if (cl->ssl != NULL) {
            int n;
            while (!cl->server_gone && (n = BIO_read(cl->wbio, buf, sizeof(buf))) > 0)
                for (int off = 0; off < n;) {
                    ssize_t w = send(cl->fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
                    if (w < 0 && errno == EAGAIN) {
                        uv_run(&loop, UV_RUN_NOWAIT);
                        continue;
                    }
                    if (w <= 0) {
                        cl->server_gone = 1;
                        break;
                    }
                    off += (int)w;
                    moved = 1;
                }
        }
        if (c->stopped && !c->closed) {
            c->stopped = 0;
            if (oi_tls_read_start(c->tls, (uv_stream_t *)&c->pipe, on_sock_alloc, on_sock_read) != 0)
                conn_close(c);
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        ssize_t r;
        while ((r = recv(cl->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
            moved = 1;
            if (cl->ssl != NULL)
                BIO_write(cl->rbio, buf, (int)r);
        }
        if (r == 0)
            cl->server_gone = 1;
        idle = moved ? 0 : idle + 1;
    }
}

static void send_raw(client_t *cl, conn_t *c, const uint8_t *data, size_t size)
{
    while (size > 0 && !cl->server_gone) {
        ssize_t w = send(cl->fd, data, size, MSG_NOSIGNAL);
        if (w > 0) {
            data += w;
            size -= (size_t)w;
        } else if (w < 0 && errno != EAGAIN) {
            cl->server_gone = 1;
        }
        pump(cl, c);
    }
    pump(cl, c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int mode = data[0] & 3, stop_each = (data[0] & 0x80) != 0;
    data++, size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL || uv_pipe_init(&loop, &c->pipe, 0) != 0 || uv_pipe_open(&c->pipe, sv[1]) != 0)
        die("pipe");
    c->pipe.data = c;
    c->stop_each = stop_each;
    c->tls = oi_tls_new(ctx, &loop, (uv_stream_t *)&c->pipe, on_alloc, on_read);
    if (c->tls == NULL || oi_tls_read_start(c->tls, (uv_stream_t *)&c->pipe, on_sock_alloc, on_sock_read) != 0)
        die("oi_tls_new");
    client_t cl = {.fd = sv[0]};
    SSL_CTX *cctx = NULL;
    if (mode != 0) {
        cctx = SSL_CTX_new(TLS_client_method());
        cl.ssl = cctx ? SSL_new(cctx) : NULL;
        cl.rbio = BIO_new(BIO_s_mem());
        cl.wbio = BIO_new(BIO_s_mem());
        if (cl.ssl == NULL || cl.rbio == NULL || cl.wbio == NULL)
            die("client");
        SSL_set_bio(cl.ssl, cl.rbio, cl.wbio);
        SSL_set_connect_state(cl.ssl);
        for (int i = 0; i < 16 && SSL_do_handshake(cl.ssl) != 1 && !cl.server_gone; i++)
            pump(&cl, c);
        if (!SSL_is_init_finished(cl.ssl))
            die("the handshake did not finish");
    }
    if (mode == 0 || mode == 1) {
        send_raw(&cl, c, data, size);
    } else {
        size_t sent = 0, back = 0;
        char buf[16384];
        while (size > 0 && !cl.server_gone) {
            size_t n = (size_t)data[0] * 64 + 1; /* a record of 1 .. 16321 bytes */
            if (n > size)
                n = size;
            if (SSL_write(cl.ssl, data, (int)n) != (int)n)
                die("client write");
            data += n, size -= n, sent += n;
            pump(&cl, c);
            int r;
            while ((r = SSL_read(cl.ssl, buf, sizeof(buf))) > 0)
                back += (size_t)r;
        }
        if (cl.server_gone || back != sent || c->echoed != sent) /* valid records, all echoed */
            die("the echo lost bytes");
    }
    close(cl.fd);
    pump(&cl, c);
    conn_close(c);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_run(&loop, UV_RUN_NOWAIT);
    free(c);
    SSL_free(cl.ssl);
    SSL_CTX_free(cctx);
    return 0;
}

#include "replay_main.h"
