/* What the server's HTTP/2 files share (http2.c, grpc_call.c, grpc_recv.c): the server, loop,
 * connection and message types, and the functions each calls in another; not for use outside
 * them. Each function is described where it is defined. */
#ifndef OI_TRANSPORT_HTTP2_INTERNAL_H
#define OI_TRANSPORT_HTTP2_INTERNAL_H

#include <stdatomic.h>

#include <nghttp2/nghttp2.h>

#include "transport/http2.h"
#include "transport/peers.h"
#include "transport/tcp_listen.h"
#include "transport/tls.h"
#include "transport/unix_listen.h"

#define READ_BUF_SIZE (256u << 10)
/* Flow-control windows we open: big enough that a 16 MiB tensor needs no WINDOW_UPDATE round
 * trip, and a connection can carry several of them at once. */
#define STREAM_WINDOW (64u << 20)
#define CONN_WINDOW (1u << 30)
#define MAX_PATH_LEN 1024
#define DEFAULT_MAX_QUEUED (64u << 20)

typedef struct h2_loop_s {
    oi_loop_t *loop;
    oi_tcp_listener_t tcp;
    uv_pipe_t pipe;     /* the Unix-domain listener, with cfg.unix_path */
    int pipe_listening; /* pipe is open */
    oi_h2_server_t *server;
    struct oi_h2_conn_s *conns; /* every open connection of this loop */
    char *rbuf;                 /* shared by the loop's connections: reads are consumed at once */
} h2_loop_t;

struct oi_h2_server_s {
    oi_h2_config_t cfg;
    char host[256];
    char unix_path[108];
    oi_unix_socket_t unix_sock; /* the socket file we created, removed when we stop accepting */
    oi_grpc_handler_t handler;
    void *ctx;
    h2_loop_t *loops;
    int nloops;
    int port;
    atomic_int connections;
    atomic_int working; /* (de)compressions on worker threads, not yet back on their loop */
    int draining;
    oi_peers_t peers; /* connections per client address, across the loops */
};

/* One slice of bytes queued for the socket: inline bytes live in the connection's `wbuf`
 * (offset in `off`), others are referenced where they are (one owner reference each). */
typedef struct seg_s {
    const char *ptr;
    size_t off;
    size_t len;
    oi_buf_t *owner;
    int inline_;
} seg_t;

typedef struct oi_h2_conn_s {
    union { /* a TCP or a Unix-domain connection: both are libuv streams */
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_stream_t stream;
        uv_handle_t handle;
    } sock;
    uv_timer_t timer; /* the preface deadline, then the idle deadline while no stream is open */
    oi_tls_t *tls;    /* the connection's TLS, or NULL for plain text */
    int handles;      /* open libuv handles (tcp, timer): freed at 0 */
    nghttp2_session *session;
    h2_loop_t *lp;
    struct oi_h2_conn_s *prev, *next;
    oi_grpc_call_t *calls; /* calls whose stream is open */
    int closing;
    int in_recv;    /* nghttp2_session_mem_recv is on the stack: no send from callbacks */
    int goaway;
    int close_after_write;
    int got_preface; /* the client's preface and first frame arrived */
    /* Response bytes queued by this connection's calls and not yet framed; past the server's
     * max_queued_bytes the connection is throttled: request messages are held and their
     * bytes not consumed (no WINDOW_UPDATE), until the queue drains to half of it. */
    uint64_t queued;
    int throttled;
    oi_peer_addr_t peer;
    int peer_counted;    /* holds one count in the server's peer table */
    uint64_t idle_since; /* uv_now when the last stream closed, for eviction */
    size_t writes;  /* uv_write requests in flight */
    oi_sbuf_t wbuf; /* frame headers and small frames of the batch being built */
    seg_t *segs;
    size_t nsegs, capsegs;
    oi_peer_t *creds; /* the client's credentials, once a call asked (oi_grpc_call_peer) */
} h2_conn_t;

typedef struct write_req_s {
    uv_write_t w;
    h2_conn_t *conn;
    oi_buf_t *small;
    size_t nowners;
    oi_buf_t *owners[];
} write_req_t;

/* A complete request message held back while its connection is throttled. */
typedef struct held_msg_s {
    struct held_msg_s *next;
    oi_buf_t *msg;
    int compressed; /* its prefix's flag: to be inflated before the handler sees it */
} held_msg_t;

/* A response message waiting in a call's queue: parts[0] is its 5-byte prefix. */
typedef struct out_msg_s {
    struct out_msg_s *next;
    size_t nparts;
    size_t idx; /* next part to send */
    size_t off; /* bytes of parts[idx] already sent */
    int pending;      /* waits to be compressed (then parts[1] becomes the compressed bytes) */
    size_t raw_total; /* its uncompressed length while pending */
    uint8_t prefix[5];
    oi_iov_t parts[];
} out_msg_t;

/* What this server accepts, for grpc-accept-encoding on every response. */
#define ACCEPT_ENCODINGS "identity,deflate,gzip"

/* grpc_call.c */
void oi__h2_drop_held(oi_grpc_call_t *call);
void oi__h2_call_gone(oi_h2_server_t *s, oi_grpc_call_t *call);
void oi__h2_call_detach(oi_grpc_call_t *call);
oi_grpc_call_t *oi__h2_call_of(nghttp2_session *session, int32_t stream_id);
ssize_t oi__h2_on_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags, void *user_data);
int oi__h2_on_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *user_data);
const char *oi__h2_encoding_name(int enc);
void oi__h2_submit_headers_only(oi_grpc_call_t *call, const char *http_status, int grpc_status, const char *message);

/* grpc_recv.c */
int oi__h2_on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
int oi__h2_on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data);
void oi__h2_deliver(h2_conn_t *c, oi_grpc_call_t *call, oi_buf_t *m, int compressed);
void oi__h2_check_rates(h2_conn_t *c);
int oi__h2_on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data);
void oi__h2_half_close(h2_conn_t *c, oi_grpc_call_t *call);
int oi__h2_on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
int oi__h2_on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
int oi__h2_on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data);

/* http2.c */
void oi__h2_conn_close(h2_conn_t *c);
void oi__h2_on_conn_timer(uv_timer_t *t);
void oi__h2_conn_idle(h2_conn_t *c);
void oi__h2_call_drain(h2_conn_t *c, oi_grpc_call_t *call);
void oi__h2_conn_flush(h2_conn_t *c);

#endif
