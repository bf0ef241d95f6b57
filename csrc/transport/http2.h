/* gRPC server transport: HTTP/2 over cleartext TCP with prior knowledge (h2c), on nghttp2,
 * running on event loops that another transport started (the HTTP/1.1 server's). It owns
 * sockets, HTTP/2 framing, flow control and gRPC message framing; it knows nothing of V2:
 * each call (one HTTP/2 stream) hands its request messages to a handler, which answers with
 * oi_grpc_send and oi_grpc_finish on the call's loop thread.
 *
 * Wire behaviour: `content-type: application/grpc...` is required (else HTTP 415), requests
 * are POST, messages carry the 5-byte prefix and are reassembled into one buffer sized from
 * it (no copies beyond that reassembly), compressed ones (grpc-encoding gzip or deflate) are
 * inflated off the loop within max_message_bytes before the handler sees them, `grpc-timeout`
 * is honoured with DEADLINE_EXCEEDED,
 * responses are HEADERS, DATA written straight from the parts' memory (iovecs), then
 * trailers with grpc-status and a percent-encoded grpc-message, or Trailers-Only when the call
 * fails before any response message. Shutdown sends GOAWAY and lets open calls finish. */
#ifndef OI_TRANSPORT_HTTP2_H
#define OI_TRANSPORT_HTTP2_H

#include <regex.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "transport/peers.h"
#include "transport/http1.h" /* oi_iov_t */
#include "transport/loop.h"
#include "transport/peer.h"
#include "transport/tls.h"

typedef struct oi_h2_server_s oi_h2_server_t;
typedef struct oi_grpc_call_s oi_grpc_call_t;

typedef struct oi_h2_config_s {
    const char *host; /* numeric address or a name; "127.0.0.1" by default */
    int port;         /* 0 picks a free port; -1: no TCP listener (unix_path only, or none:
                       * oi_h2_server_adopt brings connections) */
    int listen_fd;    /* > 0: serve this listening TCP socket instead of binding (see
                       * oi_http_config_t.listen_fd); 0: bind */
    const char *unix_path;           /* also (or only) listen on this Unix-domain socket; NULL: none */
    unsigned unix_mode;              /* the socket file's permission bits, e.g. 0660 */
    size_t max_message_bytes;        /* largest request message (at most 4 GiB - 1) */
    oi_budget_t *message_budget;     /* request messages are charged here, as received and as
                                      * inflated (RESOURCE_EXHAUSTED when it has no room); NULL: none */
    unsigned max_inflate_ratio;      /* see oi_inflate_limit_t.max_ratio; 0: none */
    uint32_t message_min_rate;       /* bytes per second a request message must average from its
                                      * first byte, beyond message_grace_ms, else the call ends with
                                      * DEADLINE_EXCEEDED; 0: no minimum */
    uint64_t message_grace_ms;
    int max_connections;             /* when reached, the accepting loop's oldest idle connection (no
                                      * open stream) is closed to make room, else the slowest of those
                                      * whose every call is still receiving its first message; without
                                      * either the new one is refused */
    int max_connections_per_peer;    /* per client address; <= 0: no limit of its own. At the
                                      * limit the address's own oldest idle connection makes room */
    uint32_t max_concurrent_streams; /* per connection */
    uint64_t preface_timeout_ms;     /* the client preface and SETTINGS must arrive within this
                                      * (not pushed back by a trickle of bytes); 0: none */
    uint64_t idle_timeout_ms;        /* a connection with no open stream for this long gets
                                      * GOAWAY and is closed; 0: never */
    size_t max_queued_bytes;         /* response bytes a connection may have waiting for the client's
                                      * flow-control window before its request messages are held back
                                      * and no more window is granted to it; 0: 64 MiB */
    /* Metadata keys (lower-case, as HTTP/2 sends them; borrowed for the server's life) whose
     * values a handler reads with oi_grpc_call_header: only these are kept, and a call that
     * repeats one is refused. At most OI_HTTP_MAX_CAPTURED. */
    const char *const *capture_headers;
    int n_capture_headers;
    oi_tls_ctx_t *tls; /* TCP connections speak TLS with this context (ALPN "h2"; the server
                        * takes a reference); NULL: plain text (h2c). Unix-domain sockets stay plain */
    /* When set, called by oi_grpc_finish on the loop thread with the handler's ctx and the
     * status sent (the access log); calls then note when their headers came. */
    void (*on_finished)(void *ctx, struct oi_grpc_call_s *call, int grpc_status);
    /* --grpc-header-forward-pattern: metadata entries whose names it matches are kept for the
     * handler as request parameters (oi_grpc_call_t.forwarded; transport/hdr_forward.h); NULL:
     * none. Borrowed: outlives the server. */
    const regex_t *forward_headers;
} oi_h2_config_t;

/* Called on the call's loop thread. A handler may answer from inside any of them. */
typedef struct oi_grpc_handler_s {
    /* The request headers are in and valid: call->method names the RPC. */
    void (*on_call)(void *ctx, oi_grpc_call_t *call);
    /* One complete request message; takes the reference to `msg`. */
    void (*on_message)(void *ctx, oi_grpc_call_t *call, oi_buf_t *msg);
    /* The client has sent its last message (END_STREAM). */
    void (*on_half_close)(void *ctx, oi_grpc_call_t *call);
    /* The call ended before the handler finished it: the client reset the stream, its
     * connection closed, or its grpc-timeout passed (the transport has answered
     * DEADLINE_EXCEEDED). Work for it may be dropped; sends and finishes are dropped from now
     * on. At most once per call; NULL: not told. */
    void (*on_gone)(void *ctx, oi_grpc_call_t *call);
} oi_grpc_handler_t;

/* One RPC. Refcounted on its loop thread only: the transport holds one reference while the
 * stream lives, and a handler takes its own (oi_grpc_call_ref) across asynchronous work. */
struct oi_grpc_call_s {
    /* Read-only for the handler. */
    const char *method;  /* the :path, e.g. "/inference.GRPCInferenceService/ModelInfer" */
    oi_loop_t *loop;     /* the call's loop thread */
    uint32_t received;   /* request messages so far */
    int half_closed;     /* the client sent END_STREAM */
    uint64_t start_ns;   /* uv_hrtime when the headers came, with cfg.on_finished only */
    uint64_t bytes_in;   /* request message bytes, prefixes included */
    uint64_t bytes_sent; /* response message bytes queued, prefixes included */
    /* The handler's own. */
    void *data;
    void *work;         /* e.g. the requests it has in flight */
    char log_model[96]; /* the model the RPC names, for the access log ("" when none) */
    char log_version[24];
    int kind;
    uint32_t pending;
    uint64_t session; /* e.g. an id for the sequences the call's requests belong to; 0: none */
    /* The metadata cfg.forward_headers matched, as JSON object members ("name":"value",...),
     * forwarded.len bytes; empty when none. Read-only for the handler. */
    oi_sbuf_t forwarded;
    /* Private to the transport. */
    int refs;
    int finished;        /* our side is done: trailers submitted */
    int gone_told;       /* the handler's on_gone was called */
    int headers_sent;
    struct oi_h2_conn_s *conn; /* NULL once the stream is gone */
    struct oi_grpc_call_s *prev, *next;
    int32_t stream_id;
    char *path;
    int content_type_ok, bad_method;
    char *forward_refused; /* a header refused (a reserved name to forward, a key given twice): the call ends with this */
    int encoding;              /* grpc-encoding of the request messages (oi_encoding_t) */
    char encoding_name[32];    /* as sent, for the error when it is unknown */
    unsigned accept_encodings; /* grpc-accept-encoding: bit 1 << oi_encoding_t per algorithm */
    uint64_t opened_ms;        /* uv_now when the headers began */
    uint64_t msg_start;        /* uv_now when the message being received began (its rate) */
    int inflating;             /* a compressed request message is being inflated off the loop:
                                * later messages and END_STREAM wait behind it, in order */
    int response_encoding;     /* oi_encoding_t the responses are compressed with (oi_grpc_call_compress) */
    int compressing;           /* response messages wait for compression (the queue's tail) */
    int discard;               /* the call ended in error while compressing: those are dropped */
    uint64_t pending_bytes;    /* their uncompressed bytes */
    char *captured[OI_HTTP_MAX_CAPTURED]; /* the values of cfg.capture_headers (NULL: absent) */
    size_t captured_len[OI_HTTP_MAX_CAPTURED];
    uint64_t timeout_ms; /* 0: none */
    void *timer;         /* uv_timer_t *, when a deadline is set */
    /* Reassembly of the request message being received. */
    uint8_t prefix[5];
    size_t prefix_have;
    oi_buf_t *msg;
    size_t msg_need;
    /* Complete request messages held back while the connection's responses wait for a client
     * that does not read (see max_queued_bytes), the DATA bytes not yet given back to the
     * client's flow-control window, and an END_STREAM that must follow the held messages. */
    struct held_msg_s *held_head, *held_tail;
    size_t unconsumed;
    int half_close_held;
    /* Response messages waiting for the socket, and the trailers to send after them. */
    struct out_msg_s *out_head, *out_tail;
    uint64_t out_bytes;
    int status;
    char *status_message;
};

/* The client's IP address, or NULL when the socket has none or the stream is gone. */
const oi_peer_addr_t *oi_grpc_call_addr(const oi_grpc_call_t *call);

/* The value of the call's metadata cfg.capture_headers[i] (*len bytes, not NUL-terminated),
 * or NULL when the client did not send it. Valid for the call's life. */
const char *oi_grpc_call_header(const oi_grpc_call_t *call, int i, size_t *len);

/* Takes and drops a reference (loop thread only). The last drop frees the call. */
void oi_grpc_call_ref(oi_grpc_call_t *call);
void oi_grpc_call_unref(oi_grpc_call_t *call);

/* 1 while the call can still answer: its stream is open and oi_grpc_finish was not called. */
int oi_grpc_call_open(const oi_grpc_call_t *call);

/* The credentials of the client on the other end of the call's connection (see
 * transport/peer.h), looked up on first use and kept for the connection's life; an unknown
 * peer (error set) once the stream is gone. Loop thread only. */
const oi_peer_t *oi_grpc_call_peer(oi_grpc_call_t *call);

/* Compresses this call's response messages from now on, at gRPC compression level `level`
 * (1 low, 2 medium, 3 high; as tritonserver's --grpc-infer-response-compression-level) with
 * an algorithm the client accepts (its grpc-accept-encoding), picked the way gRPC's levels
 * pick: of gzip and deflate, in that order, those accepted; low takes the first, medium the
 * middle one, high the last. Nothing when the client accepts neither. Call before the first
 * oi_grpc_send. Compression runs on a worker thread (oi_loop_work); messages stay in order. */
void oi_grpc_call_compress(oi_grpc_call_t *call, int level);

/* Queues one response message of `total` bytes, the concatenation of parts[0 .. nparts),
 * sent from the parts' memory (or compressed first, see oi_grpc_call_compress). Takes every
 * part's owner reference, also when the call can no longer answer (the parts are then
 * dropped). */
void oi_grpc_send(oi_grpc_call_t *call, const oi_iov_t *parts, size_t nparts, size_t total);

/* Ends the call with a gRPC status and message (NULL or "" for none): trailers after the
 * queued messages, or Trailers-Only when none was sent. Later sends are dropped. */
void oi_grpc_finish(oi_grpc_call_t *call, int grpc_status, const char *message);

/* Returns a new server (not yet listening), or NULL when out of memory. */
oi_h2_server_t *oi_h2_server_new(const oi_h2_config_t *cfg, const oi_grpc_handler_t *handler, void *ctx);

/* Binds and listens on each of the `nloops` running loops (which must outlive the server's
 * connections: see oi_h2_server_close). 0, or a libuv error with a message in `err`. */
int oi_h2_server_start(oi_h2_server_t *s, oi_loop_t **loops, int nloops, char *err, size_t errlen);

/* Serves the connected stream socket `fd` (one end of a socketpair, say) on the first loop as
 * if accepted there, outside the connection limits: how tests and fuzz targets drive a
 * connection from memory. Takes `fd` on success. Call on that loop's thread. 0 or a libuv
 * error code. */
int oi_h2_server_adopt(oi_h2_server_t *s, int fd);

/* The bound port, 0 before start. */
int oi_h2_server_port(const oi_h2_server_t *s);

/* Messages being (de)compressed on worker threads: a stop waits for them like for requests
 * in flight (their completions run on the loops). */
int oi_h2_server_working(const oi_h2_server_t *s);

/* Closes the listeners and sends GOAWAY on every connection: calls in progress go on, new
 * ones are refused. Call from outside the loops. */
void oi_h2_server_stop_accepting(oi_h2_server_t *s);

/* For a shutdown whose time is up: ends every open call with UNAVAILABLE and `message`
 * (later sends and finishes of the handler are dropped) and lets the connections close once
 * that is written. Call from outside the loops, while they still run. */
void oi_h2_server_abandon(oi_h2_server_t *s, const char *message);

/* Closes every connection (calls still waiting for an answer are cut). Call from outside
 * the loops, while they still run. */
void oi_h2_server_close(oi_h2_server_t *s);

/* Frees the server once its loops have ended (every handle closed). */
void oi_h2_server_free(oi_h2_server_t *s);

#endif
