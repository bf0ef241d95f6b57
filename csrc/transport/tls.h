/* TLS for the server's connections: a layer between a connection's libuv stream and the
 * protocol above it (HTTP/1.1, HTTP/2), on the connection's own loop thread. OpenSSL sees
 * memory only: ciphertext read from the socket is handed to it from the layer's read buffer,
 * and the records it makes are appended to one buffer per send, written with one write. The
 * protocol keeps its own read and write paths: it starts and stops reading, and sends, through
 * the oi_tls_* calls below, which go straight to the socket when its connection has no TLS
 * (a NULL oi_tls_t). Plain text is decrypted straight into the buffers the protocol's alloc
 * callback gives (a request body's own buffer) and encrypted straight from the iovecs it sends
 * (a tensor's memory): no copy of tensor bytes beyond encryption itself. */
#ifndef OI_TRANSPORT_TLS_H
#define OI_TRANSPORT_TLS_H

#include <stddef.h>
#include <uv.h>

/* The cipher suites offered (server) and preferred (client): AEAD with forward secrecy,
 * AES-128-GCM first. */
#define OI_TLS13_CIPHERS "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define OI_TLS12_CIPHERS "ECDHE+AES128GCM:ECDHE+AES256GCM:ECDHE+CHACHA20"

typedef struct oi_tls_ctx_s oi_tls_ctx_t;
typedef struct oi_tls_s oi_tls_t;

/* A server's certificate and what it asks of clients (tritonserver's --grpc-use-ssl... flags). */
typedef struct oi_tls_config_s {
    const char *cert_file; /* PEM: the server's certificate, then any intermediates */
    const char *key_file;  /* PEM: its private key */
    const char *ca_file;   /* PEM: the CAs whose client certificates are accepted; NULL: none */
    int mutual;            /* clients must present a certificate that ca_file's CAs signed */
    const char *alpn;      /* the protocol chosen when the client offers it ("h2", "http/1.1") */
} oi_tls_config_t;

/* A server context: loads the files (TLS 1.2 at least, no renegotiation). Shared by every loop
 * of a server (thread-safe); the caller owns the returned reference. NULL with a message in
 * `err` naming the file and OpenSSL's reason. */
oi_tls_ctx_t *oi_tls_ctx_new(const oi_tls_config_t *cfg, char *err, size_t errlen);

/* Loads the context's files again (a renewed certificate, SIGHUP): connections made from now
 * on use them, those open keep theirs. 0, or -1 with a message (the old files stay in use).
 * Safe from any thread. */
int oi_tls_ctx_reload(oi_tls_ctx_t *ctx, char *err, size_t errlen);

/* Reference counting of a context; each connection holds none (OpenSSL's SSL holds its own). */
oi_tls_ctx_t *oi_tls_ctx_ref(oi_tls_ctx_t *ctx);
void oi_tls_ctx_unref(oi_tls_ctx_t *ctx);

/* The TLS side of the accepted connection on stream `s` (on `loop`): decrypted bytes go to
 * `alloc` and `read` (the protocol's own callbacks, called with `s` as libuv would). NULL when
 * out of memory. Free it with oi_tls_close when the stream is closed. */
oi_tls_t *oi_tls_new(oi_tls_ctx_t *ctx, uv_loop_t *loop, uv_stream_t *s, uv_alloc_cb alloc, uv_read_cb read);

/* Ends the connection's TLS: call right after uv_close on its stream. Sends that wait for the
 * handshake are completed with UV_ECANCELED on a later turn of the loop, then `t` is freed.
 * NULL is ignored. */
void oi_tls_close(oi_tls_t *t);

/* Reading: with `t` NULL, uv_read_start(s, sock_alloc, sock_read); else the socket is read
 * through sock_alloc/sock_read, which must call oi_tls_on_alloc/oi_tls_on_read, and bytes
 * already decrypted or buffered are delivered on the loop's next turn. 0 or a libuv error. */
int oi_tls_read_start(oi_tls_t *t, uv_stream_t *s, uv_alloc_cb sock_alloc, uv_read_cb sock_read);

/* Stops reading (and delivering: bytes already read wait for oi_tls_read_start). */
void oi_tls_read_stop(oi_tls_t *t, uv_stream_t *s);

/* The socket's alloc and read callbacks, for a connection with TLS. */
void oi_tls_on_alloc(oi_tls_t *t, uv_buf_t *buf);
void oi_tls_on_read(oi_tls_t *t, ssize_t nread);

/* As oi_stream_send (1: sent at once, cb not called; 0: cb will be; or a libuv error): with
 * `t`, the bytes are encrypted now (or once the handshake is done) and written as one buffer;
 * cb runs once that buffer has gone to the socket, so the bufs' memory must live until then
 * as without TLS. */
int oi_tls_send(oi_tls_t *t, uv_stream_t *s, uv_write_t *req, uv_buf_t *bufs, unsigned nb, uv_write_cb cb);

#endif
