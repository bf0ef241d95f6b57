/* A blocking HTTP/1.1 client connection for the Python client and the benchmarks: one
 * request at a time, keep-alive, request bodies sent with writev from the caller's memory,
 * response bodies read from the socket straight into one buffer. Not thread-safe: one
 * thread uses a connection at a time (the Python Client pools them). */
#ifndef OI_CLIENT_HTTP_CLIENT_H
#define OI_CLIENT_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "client/tls_client.h"
#include "core/buf.h"

typedef struct oi_http_client_s oi_http_client_t;

typedef struct oi_http_client_response_s {
    int status;
    oi_buf_t *body;                  /* the whole body (one reference), or NULL when empty */
    int64_t inference_header_length; /* -1 when absent */
} oi_http_client_response_t;

/* Returns a new connection to host:port (connected on first use), or NULL (out of memory).
 * `host` is a numeric address or a name. */
oi_http_client_t *oi_http_client_new(const char *host, int port);

/* Sends `method path` with `headers` (extra lines, each ending "\r\n") and a body made of
 * `nparts` iovecs, then reads the whole response. A connection the server closed while idle
 * is reopened once. timeout_ms <= 0 waits forever. Returns 0 with *out filled, or -1 with a
 * message in `err` (the connection is then closed; a later call reconnects); -2 on timeout. */
int oi_http_client_request(oi_http_client_t *c, const char *method, const char *path, const char *headers,
                           const struct iovec *parts, int nparts, int64_t timeout_ms, oi_http_client_response_t *out,
                           char *err, size_t errlen);

/* Speaks TLS (https) with `cfg` (copied; ALPN http/1.1) from the next connection on. 0 or -1
 * (out of memory). */
int oi_http_client_set_tls(oi_http_client_t *c, const oi_ctls_config_t *cfg);

/* Closes and frees the connection. */
void oi_http_client_free(oi_http_client_t *c);

#endif
