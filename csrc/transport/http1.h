/* HTTP/1.1 server transport on libuv and llhttp: sockets, framing, keep-alive, pipelining,
 * chunked bodies, Expect: 100-continue, limits and timeouts. It knows nothing of V2: each
 * complete request goes to one handler callback, which answers with oi_http_respond. A HEAD
 * request is answered with the head of the handler's response (its Content-Length included)
 * and no body bytes, as HTTP asks. */
#ifndef OI_TRANSPORT_HTTP1_H
#define OI_TRANSPORT_HTTP1_H

#include <stddef.h>
#include <regex.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/buf.h"
#include "transport/loop.h"
#include "transport/peer.h"
#include "transport/peers.h"
#include "transport/tls.h"

/* The most header names one server captures for its handler (oi_http_config_t.capture_headers). */
#define OI_HTTP_MAX_CAPTURED 16

typedef struct oi_http_server_s oi_http_server_t;
typedef struct oi_http_conn_s oi_http_conn_t;
typedef struct oi_http_request_s oi_http_request_t;
typedef struct oi_http_answer_s oi_http_answer_t;

typedef struct oi_http_config_s {
    const char *host; /* numeric IPv4/IPv6 address or a name; "127.0.0.1" by default */
    int port;         /* 0 picks a free port; -1: no TCP listener (unix_path only) */
    int listen_fd;    /* > 0: serve this listening TCP socket (on `port`), made by another process
                       * (`openinfer serve --workers`), instead of binding; the server uses a
                       * duplicate and the caller keeps its own. 0: bind */
    const char *unix_path; /* also (or only) listen on this Unix-domain socket; NULL: none */
    unsigned unix_mode;    /* the socket file's permission bits, e.g. 0660 */
    int threads;           /* event-loop threads; <= 0: one per usable CPU (oi_usable_cpus) */
    const char *thread_name; /* the loop threads' name; NULL: "oi-loop" */
    size_t max_body_bytes;   /* tritonserver's --http-max-input-size: the most JSON (the body, or the
                              * binary-extension header) or raw body a request brings; tensor
                              * data after a JSON header is bounded by body_budget alone */
    size_t max_header_bytes; /* request line and headers together */
    int max_connections;     /* when reached, the oldest idle connection of the accepting loop is
                              * closed to make room, else the one whose request arrives slowest
                              * (answered 503); only without either is the new one refused */
    int max_connections_per_peer;   /* per client address; <= 0: no limit of its own. At the limit
                                     * the address's own oldest idle connection makes room */
    uint64_t first_byte_timeout_ms; /* a new connection that sends nothing is closed after this;
                                     * short, so silent connections cannot hold the slots */
    uint64_t header_timeout_ms;     /* from a request's first byte to the end of its headers */
    uint64_t body_timeout_ms;       /* a request body with no bytes for this long: 408; 0: none */
    uint32_t body_min_rate;         /* bytes per second a request body must average beyond its
                                     * first body_timeout_ms, else 408 (Apache mod_reqtimeout's
                                     * MinRate): a trickle of bytes, each gap short, cannot hold a
                                     * connection for long. 0: no minimum */
    oi_budget_t *body_budget;       /* request bodies are charged here as their buffers are made
                                     * (given back with the buffer's last reference); a body it has
                                     * no room for gets 503. NULL: none */
    uint64_t idle_timeout_ms;       /* a keep-alive connection with no request */
    /* --http-header-forward-pattern: the headers whose names it matches are kept for the
     * handler as request parameters (oi_http_request_t.forwarded; transport/hdr_forward.h);
     * NULL: none. Borrowed: outlives the server. */
    const regex_t *forward_headers;
    /* When set, called on the loop thread for each answer (the access log), with the
     * handler's ctx: by oi_http_respond, and for requests the transport refuses itself (then
     * req->method is -1 when the request line was not read); requests then note when their
     * first byte came. */
    void (*on_answered)(void *ctx, const oi_http_request_t *req, const oi_http_answer_t *a);
    /* Header names (lower-case, borrowed for the server's life) whose values a handler reads
     * with oi_http_request_header: the transport keeps only these, and refuses a request that
     * repeats one (a restricted API's key header, say). At most OI_HTTP_MAX_CAPTURED. */
    const char *const *capture_headers;
    int n_capture_headers;
    oi_tls_ctx_t *tls; /* TCP connections speak TLS with this context (the server takes a
                        * reference); NULL: plain text. Unix-domain sockets stay plain */
    int inline_loop; /* for tests and fuzz targets: start sets up one loop that neither listens
                      * nor runs a thread; the caller runs it (uv_run on oi_http_server_loop(s,
                      * 0)->uv) and brings its connections with oi_http_server_adopt */
} oi_http_config_t;

/* What on_answered hears of one answer. */
struct oi_http_answer_s {
    int status;
    uint64_t start_ns;          /* uv_hrtime of the request's first byte */
    uint64_t bytes_in;          /* request line, headers and body as received */
    uint64_t bytes_out;         /* response body */
    const oi_peer_addr_t *peer; /* NULL when the socket has no IP peer */
};

/* One request, valid from the handler call until oi_http_respond. Lives inside its
 * connection, which serves one request at a time (pipelined requests wait, in order). */
struct oi_http_request_s {
    int method;       /* llhttp_method_t: HTTP_GET, HTTP_POST, ... */
    const char *path; /* NUL-terminated URL path, query stripped, not percent-decoded */
    size_t path_len;
    const char *query;            /* NUL-terminated, what follows '?' in the URL (not decoded); "" when none */
    const char *nv_infer_request; /* the NV-InferRequest header's value (the legacy v1 API),
                                   * NUL-terminated, nv_infer_request_len bytes; NULL when absent */
    size_t nv_infer_request_len;
    oi_buf_t *body;   /* the whole body in one buffer (len bytes) or NULL; the request owns one
                       * reference: take your own with oi_buf_ref to keep it */
    int64_t inference_header_length; /* Inference-Header-Content-Length, -1 when absent */
    char content_encoding[32];       /* lower-cased, "" when absent */
    char accept_encoding[128];       /* lower-cased, "" when absent */
    /* The headers cfg.forward_headers matched, as JSON object members ("name":"value",...),
     * forwarded_len bytes; NULL when none. Valid as long as the request. */
    const char *forwarded;
    size_t forwarded_len;
    oi_loop_t *loop;                 /* post completions here: oi_http_respond runs on it */
    uint64_t start_ns;               /* uv_hrtime of the first byte, with cfg.on_answered only (else 0) */
    /* Set by a handler that answers later: called once (loop thread) when the connection
     * closes before oi_http_respond, so that the work can be dropped. oi_http_respond must
     * still follow; what it sends goes nowhere. Cleared for each request. */
    void (*on_gone)(struct oi_http_request_s *req);
    void *gone_arg;
    oi_http_conn_t *conn;            /* private to the transport */
};

/* Called on a loop thread for each complete request; must lead to exactly one
 * oi_http_respond on the same loop thread, now or later. */
typedef void (*oi_http_handler_cb)(void *ctx, oi_http_request_t *req);

/* A slice of response body whose owner reference the transport takes and drops once the
 * bytes are written (owner may be NULL for static data). */
typedef struct oi_iov_s {
    const char *base;
    size_t len;
    oi_buf_t *owner;
} oi_iov_t;

/* Answers `req` (on its loop thread). `headers` holds extra header lines, each ending in
 * "\r\n" (Content-Type, ...); Content-Length and Connection are added here. Takes every
 * part's owner reference, also when the connection is already gone. */
void oi_http_respond(oi_http_request_t *req, int status, const char *headers, const oi_iov_t *parts,
                     size_t nparts);

/* A streamed answer instead of oi_http_respond (Server-Sent Events, say): the status line and
 * `headers` (each line ending in "\r\n") go now with Transfer-Encoding: chunked (an HTTP/1.0
 * client gets a body that ends with the connection), each oi_http_stream_send is one chunk
 * written from the parts' memory (owner references taken, also when the connection is gone),
 * and oi_http_stream_end closes the body and answers the request as oi_http_respond would.
 * The request's on_gone still tells of a client that closes meanwhile. Loop thread. */
void oi_http_stream_start(oi_http_request_t *req, int status, const char *headers);
void oi_http_stream_send(oi_http_request_t *req, const oi_iov_t *parts, size_t nparts);
void oi_http_stream_end(oi_http_request_t *req);

/* The credentials of the client on the other end of the request's connection (see
 * transport/peer.h), looked up on first use and kept for the connection's life. Valid until
 * oi_http_respond; loop thread only. */
const oi_peer_t *oi_http_request_peer(oi_http_request_t *req);

/* The value of the request's header cfg.capture_headers[i] (not NUL-terminated; *len bytes),
 * or NULL when the request did not carry it. Valid until oi_http_respond. */
const char *oi_http_request_header(const oi_http_request_t *req, int i, size_t *len);

/* tritonserver's words for an input over --http-max-input-size (`max` bytes): the raw body
 * (`header_length` 0) or the request JSON (otherwise) of `n` bytes (`more`: at least n, a chunked body still arriving). */
void oi_http_input_too_large(char *buf, size_t cap, int64_t header_length, uint64_t n, int more, size_t max);

/* Returns a new server (not yet listening), or NULL when out of memory. */
oi_http_server_t *oi_http_server_new(const oi_http_config_t *cfg, oi_http_handler_cb handler, void *ctx);

/* Binds every loop's listener and starts the loop threads. Returns 0, or a libuv error code
 * with a message in `err`. */
int oi_http_server_start(oi_http_server_t *s, char *err, size_t errlen);

/* Serves the connected stream socket `fd` (one end of a socketpair, say) on the first loop as
 * if accepted there, outside the connection limits: how tests and fuzz targets drive a
 * connection from memory. Takes `fd` on success. Call on that loop's thread (an inline_loop
 * server's, on the caller's). 0 or a libuv error code. */
int oi_http_server_adopt(oi_http_server_t *s, int fd);

/* The bound port, 0 before start or without TCP. */
int oi_http_server_port(const oi_http_server_t *s);

/* The event loops the started server runs (0 before start), which other transports share:
 * loop i lives until oi_http_server_free. */
int oi_http_server_nloops(const oi_http_server_t *s);
oi_loop_t *oi_http_server_loop(oi_http_server_t *s, int i);

/* Requests handed to the handler and not yet answered. */
int oi_http_server_inflight(const oi_http_server_t *s);

/* Of those, the ones whose connection has closed: nobody waits for their answer. */
int oi_http_server_orphans(const oi_http_server_t *s);

/* Closes the listeners (no new connections) and removes the Unix socket file; existing
 * connections go on. */
void oi_http_server_stop_accepting(oi_http_server_t *s);

/* For a shutdown whose time is up: answers every request still with the handler with
 * `status` and {"error": message} (no quotes or backslashes in it) and closes every
 * connection once written. The handler's own answer, when it comes, is dropped; such
 * requests still count in oi_http_server_inflight until it comes. Call from outside the loops. */
void oi_http_server_abandon(oi_http_server_t *s, int status, const char *message);

/* Closes every connection, ends the loop threads and frees the server. Requests still in
 * flight must have been answered (their completions could not run any more). */
void oi_http_server_free(oi_http_server_t *s);

#endif
