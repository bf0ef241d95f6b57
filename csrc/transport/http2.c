#include "transport/http2.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "codec/compress.h"
#include "transport/grpc.h"
#include "transport/peers.h"
#include "transport/tcp_listen.h"
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

static void conn_flush(h2_conn_t *c);
static void conn_close(h2_conn_t *c);
static void conn_idle(h2_conn_t *c);
static void on_conn_timer(uv_timer_t *t);

/* ---- calls ------------------------------------------------------------------------------ */

static void out_msg_free(out_msg_t *m)
{
    for (size_t i = m->idx; i < m->nparts; i++)
        oi_buf_unref(m->parts[i].owner);
    free(m);
}

void oi_grpc_call_ref(oi_grpc_call_t *call) { call->refs++; }

static void drop_held(oi_grpc_call_t *call)
{
    while (call->held_head) {
        held_msg_t *h = call->held_head;
        call->held_head = h->next;
        oi_buf_unref(h->msg);
        free(h);
    }
    call->held_tail = NULL;
}

void oi_grpc_call_unref(oi_grpc_call_t *call)
{
    if (--call->refs > 0)
        return;
    drop_held(call);
    while (call->out_head) {
        out_msg_t *m = call->out_head;
        call->out_head = m->next;
        out_msg_free(m);
    }
    oi_buf_unref(call->msg);
    free(call->path);
    free(call->status_message);
    free(call);
}

int oi_grpc_call_open(const oi_grpc_call_t *call) { return call->conn != NULL && !call->finished; }

const oi_peer_addr_t *oi_grpc_call_addr(const oi_grpc_call_t *call)
{
    return call->conn != NULL && call->conn->peer_counted ? &call->conn->peer : NULL;
}

const oi_peer_t *oi_grpc_call_peer(oi_grpc_call_t *call)
{
    static const oi_peer_t gone = {.error = ENOTCONN};
    h2_conn_t *c = call->conn;
    if (c == NULL || c->closing) /* the socket is being closed */
        return &gone;
    int fd = -1;
    uv_fileno(&c->sock.handle, &fd);
    return oi_peer_cached(&c->creds, fd);
}

static void on_timer_closed(uv_handle_t *h)
{
    oi_grpc_call_t *call = h->data;
    free(h);
    oi_grpc_call_unref(call);
}

static void stop_timer(oi_grpc_call_t *call)
{
    if (call->timer != NULL) {
        uv_close((uv_handle_t *)call->timer, on_timer_closed); /* holds a call reference */
        call->timer = NULL;
    }
}

/* Tells the handler, once, that nobody waits for the call's answer any more. */
static void call_gone(oi_h2_server_t *s, oi_grpc_call_t *call)
{
    if (call->gone_told)
        return;
    call->gone_told = 1;
    if (s->handler.on_gone != NULL)
        s->handler.on_gone(s->ctx, call);
}

/* The stream is gone (closed, reset, or its connection died): no more I/O for this call. */
static void call_detach(oi_grpc_call_t *call)
{
    h2_conn_t *c = call->conn;
    if (c == NULL)
        return;
    if (!call->finished) /* cut before the handler answered */
        call_gone(c->lp->server, call);
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    call->conn = NULL;
    stop_timer(call);
    /* Its queued responses will never be framed, and its held bytes are given back to the
     * connection window (the stream's own window went with the stream). */
    uint64_t mine = call->out_bytes + call->pending_bytes;
    c->queued -= mine < c->queued ? mine : c->queued;
    drop_held(call);
    if (c->session) {
        if (call->unconsumed > 0)
            nghttp2_session_consume_connection(c->session, call->unconsumed);
        nghttp2_session_set_stream_user_data(c->session, call->stream_id, NULL);
    }
    call->unconsumed = 0;
    oi_grpc_call_unref(call); /* the stream's reference */
    if (c->calls == NULL && !c->closing)
        conn_idle(c);
}

static oi_grpc_call_t *call_of(nghttp2_session *session, int32_t stream_id)
{
    return nghttp2_session_get_stream_user_data(session, stream_id);
}

/* Sends what the call or the transport queued, unless nghttp2 is reading (then the caller of
 * mem_recv sends when it returns). */
static void call_kick(oi_grpc_call_t *call)
{
    h2_conn_t *c = call->conn;
    if (c != NULL && !c->in_recv)
        conn_flush(c);
}

/* ---- the response side ------------------------------------------------------------------ */

static ssize_t read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data);

static void submit_trailers(oi_grpc_call_t *call)
{
    char code[12];
    snprintf(code, sizeof(code), "%d", call->status);
    oi_sbuf_t enc = {0};
    nghttp2_nv nv[2] = {
        {(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE},
    };
    size_t n = 1;
    if (call->status_message && call->status_message[0] && oi_grpc_percent_encode(&enc, call->status_message) == 0) {
        nv[1] = (nghttp2_nv){(uint8_t *)"grpc-message", (uint8_t *)enc.data, 12, enc.len, NGHTTP2_NV_FLAG_NONE};
        n = 2;
    }
    nghttp2_submit_trailer(call->conn->session, call->stream_id, nv, n); /* copies nv */
    oi_sbuf_free(&enc);
}

static ssize_t read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    (void)session, (void)stream_id, (void)buf, (void)user_data;
    oi_grpc_call_t *call = source->ptr;
    if (call == NULL || call->conn == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    /* Messages still being compressed come before the trailers. */
    if (call->out_bytes == 0 && (!call->finished || call->compressing))
        return NGHTTP2_ERR_DEFERRED;
    size_t n = call->out_bytes < length ? (size_t)call->out_bytes : length;
    if (n > 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (n == call->out_bytes && call->finished && !call->compressing) {
        /* The last bytes: trailers follow, and they carry END_STREAM. */
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        submit_trailers(call);
    }
    return (ssize_t)n;
}

static int push_seg(h2_conn_t *c, seg_t s)
{
    if (s.inline_ && c->nsegs > 0 && c->segs[c->nsegs - 1].inline_ &&
        c->segs[c->nsegs - 1].off + c->segs[c->nsegs - 1].len == s.off) {
        c->segs[c->nsegs - 1].len += s.len; /* contiguous in wbuf: one iovec */
        return 0;
    }
    if (c->nsegs == c->capsegs) {
        size_t cap = c->capsegs ? c->capsegs * 2 : 64;
        seg_t *p = realloc(c->segs, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        c->segs = p;
        c->capsegs = cap;
    }
    c->segs[c->nsegs++] = s;
    return 0;
}

static int push_inline(h2_conn_t *c, const void *p, size_t n)
{
    size_t off = c->wbuf.len;
    if (oi_sbuf_append(&c->wbuf, p, n) != 0)
        return -1;
    return push_seg(c, (seg_t){NULL, off, n, NULL, 1});
}

/* Non-DATA frames (HEADERS, SETTINGS, WINDOW_UPDATE, ...): small, copied into the batch. */
static ssize_t on_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags, void *user_data)
{
    (void)session, (void)flags;
    h2_conn_t *c = user_data;
    return push_inline(c, data, length) == 0 ? (ssize_t)length : NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* A DATA frame: its 9-byte header copied, its payload referenced from the queued parts. */
static int on_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *user_data)
{
    (void)session;
    h2_conn_t *c = user_data;
    oi_grpc_call_t *call = source->ptr;
    if (push_inline(c, framehd, 9) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    (void)frame; /* no padding: we install no select_padding callback */
    while (length > 0) {
        out_msg_t *m = call->out_head;
        oi_iov_t *p = &m->parts[m->idx];
        size_t take = p->len - m->off < length ? p->len - m->off : length;
        if (take > 0 && take <= 64) {
            /* Small pieces (the message prefix, which lives in `m`, and short headers) are
             * copied into the batch: cheaper than an iovec, and `m` may be freed below. */
            if (push_inline(c, p->base + m->off, take) != 0)
                return NGHTTP2_ERR_CALLBACK_FAILURE;
        } else if (take > 0) {
            oi_buf_t *owner = p->owner ? oi_buf_ref(p->owner) : NULL;
            if (push_seg(c, (seg_t){p->base + m->off, 0, take, owner, 0}) != 0) {
                oi_buf_unref(owner);
                return NGHTTP2_ERR_CALLBACK_FAILURE;
            }
        }
        m->off += take;
        length -= take;
        call->out_bytes -= take;
        c->queued -= take;
        if (m->off == p->len) { /* part done: the queue's reference goes */
            oi_buf_unref(p->owner);
            p->owner = NULL;
            m->idx++;
            m->off = 0;
            if (m->idx == m->nparts) {
                call->out_head = m->next;
                if (call->out_head == NULL)
                    call->out_tail = NULL;
                free(m);
            }
        }
    }
    return 0;
}

/* The gRPC name of an encoding, for grpc-encoding. */
static const char *encoding_name(int enc)
{
    return enc == OI_ENCODING_GZIP ? "gzip" : "deflate";
}

/* What this server accepts, for grpc-accept-encoding on every response. */
#define ACCEPT_ENCODINGS "identity,deflate,gzip"

void oi_grpc_call_compress(oi_grpc_call_t *call, int level)
{
    int order[2], n = 0; /* gRPC's ranking: gzip, then deflate, of those the client accepts */
    if (call->accept_encodings & (1u << OI_ENCODING_GZIP))
        order[n++] = OI_ENCODING_GZIP;
    if (call->accept_encodings & (1u << OI_ENCODING_DEFLATE))
        order[n++] = OI_ENCODING_DEFLATE;
    if (level <= 0 || n == 0 || call->headers_sent)
        return;
    call->response_encoding = level == 1 ? order[0] : level == 2 ? order[n / 2] : order[n - 1];
}

/* A response message being compressed on a worker thread. It stays in its call's queue (the
 * call is kept by a reference), pending, so that the messages behind it wait their turn. */
typedef struct compress_work_s {
    oi_work_t work;
    oi_grpc_call_t *call; /* loop thread only: the worker reads `m` and `enc` */
    oi_h2_server_t *server;
    out_msg_t *m;
    int enc;
    oi_buf_t *out; /* NULL: out of memory */
} compress_work_t;

static void compress_run(oi_work_t *w)
{
    compress_work_t *cw = (compress_work_t *)w;
    out_msg_t *m = cw->m;
    size_t n = m->nparts - 1; /* parts[0] is the prefix */
    const char *bases[n ? n : 1];
    size_t lens[n ? n : 1];
    for (size_t i = 0; i < n; i++) {
        bases[i] = m->parts[i + 1].base;
        lens[i] = m->parts[i + 1].len;
    }
    if (oi_deflate(bases, lens, n, (oi_encoding_t)cw->enc, &cw->out) != 0)
        cw->out = NULL;
}

static void compress_done(oi_work_t *w);

static void drop_pending(oi_grpc_call_t *call);

/* Starts compressing `m`, the first pending message of the call; on failure the call ends
 * with INTERNAL (and its pending messages, `m` among them, are freed). */
static void compress_start(oi_grpc_call_t *call, out_msg_t *m)
{
    compress_work_t *cw = malloc(sizeof(*cw));
    call->compressing = 1;
    if (cw != NULL && call->conn != NULL) {
        *cw = (compress_work_t){.work = {.run = compress_run, .done = compress_done},
                                .call = call,
                                .server = call->conn->lp->server,
                                .m = m,
                                .enc = call->response_encoding};
        oi_grpc_call_ref(call);
        atomic_fetch_add(&cw->server->working, 1);
        if (oi_loop_work(call->loop, &cw->work) == 0)
            return;
        atomic_fetch_sub(&cw->server->working, 1);
        oi_grpc_call_unref(call);
    }
    free(cw);
    drop_pending(call);
    oi_grpc_finish(call, OI_GRPC_INTERNAL, "cannot compress the response: out of memory");
}

/* Unlinks and frees the call's pending messages (they are the tail of its queue). */
static void drop_pending(oi_grpc_call_t *call)
{
    out_msg_t **pp = &call->out_head, *last = NULL;
    while (*pp != NULL && !(*pp)->pending) {
        last = *pp;
        pp = &(*pp)->next;
    }
    for (out_msg_t *m = *pp, *next; m != NULL; m = next) {
        next = m->next;
        out_msg_free(m);
    }
    *pp = NULL;
    call->out_tail = last;
    if (call->conn != NULL)
        call->conn->queued -= call->pending_bytes < call->conn->queued ? call->pending_bytes : call->conn->queued;
    call->pending_bytes = 0;
    call->compressing = 0;
}

static void compress_done(oi_work_t *w)
{
    compress_work_t *cw = (compress_work_t *)w;
    oi_grpc_call_t *call = cw->call;
    oi_h2_server_t *server = cw->server;
    out_msg_t *m = cw->m;
    oi_buf_t *out = cw->out;
    free(cw);
    if (call->discard) { /* the call ended with an error meanwhile: nothing more is sent */
        oi_buf_unref(out);
        oi_grpc_call_unref(call);
        atomic_fetch_sub(&server->working, 1);
        return;
    }
    call->compressing = 0;
    if (out == NULL || out->len > UINT32_MAX) {
        oi_buf_unref(out);
        drop_pending(call);
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "cannot compress the response: out of memory");
        oi_grpc_call_unref(call);
        atomic_fetch_sub(&server->working, 1);
        return;
    }
    for (size_t i = 1; i < m->nparts; i++)
        oi_buf_unref(m->parts[i].owner);
    m->parts[1] = (oi_iov_t){out->data, out->len, out};
    m->nparts = 2;
    oi_grpc_put_prefix(m->prefix, (uint32_t)out->len);
    m->prefix[0] = 1; /* compressed, with the call's grpc-encoding */
    m->pending = 0;
    call->pending_bytes -= m->raw_total;
    call->out_bytes += 5 + out->len;
    call->bytes_sent += 5 + out->len;
    h2_conn_t *c = call->conn;
    if (c != NULL)
        c->queued = c->queued - (m->raw_total < c->queued ? m->raw_total : c->queued) + 5 + out->len;
    if (m->next != NULL && c != NULL)
        compress_start(call, m->next);
    if (c != NULL && !c->closing) {
        nghttp2_session_resume_data(c->session, call->stream_id);
        call_kick(call);
    }
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&server->working, 1); /* last: a stop may free the server once it is 0 */
}

void oi_grpc_send(oi_grpc_call_t *call, const oi_iov_t *parts, size_t nparts, size_t total)
{
    out_msg_t *m = NULL;
    if (oi_grpc_call_open(call) && total <= UINT32_MAX)
        m = malloc(sizeof(*m) + (nparts + 2) * sizeof(oi_iov_t)); /* room for prefix and compressed part */
    if (m == NULL) {
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
        if (oi_grpc_call_open(call))
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory queueing a response");
        return;
    }
    m->next = NULL;
    m->idx = 0;
    m->off = 0;
    m->pending = call->response_encoding != OI_ENCODING_IDENTITY;
    m->raw_total = total;
    oi_grpc_put_prefix(m->prefix, (uint32_t)total);
    m->parts[0] = (oi_iov_t){(const char *)m->prefix, 5, NULL};
    size_t n = 1;
    for (size_t i = 0; i < nparts; i++) {
        if (parts[i].len > 0)
            m->parts[n++] = parts[i];
        else
            oi_buf_unref(parts[i].owner);
    }
    m->nparts = n;
    if (call->out_tail)
        call->out_tail->next = m;
    else
        call->out_head = m;
    call->out_tail = m;

    h2_conn_t *c = call->conn;
    int start = m->pending && !call->compressing;
    if (m->pending) {
        call->pending_bytes += total;
        c->queued += total;
    } else {
        call->out_bytes += 5 + total;
        call->bytes_sent += 5 + total;
        c->queued += 5 + total;
    }
    if (c->queued > c->lp->server->cfg.max_queued_bytes)
        c->throttled = 1; /* the client is not reading: stop taking its requests */
    if (!call->headers_sent) {
        call->headers_sent = 1;
        nghttp2_nv nv[] = {
            {(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)"grpc-accept-encoding", (uint8_t *)ACCEPT_ENCODINGS, 20, sizeof(ACCEPT_ENCODINGS) - 1,
             NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)"grpc-encoding", (uint8_t *)"", 13, 0, NGHTTP2_NV_FLAG_NONE},
        };
        size_t nnv = 3;
        if (call->response_encoding != OI_ENCODING_IDENTITY) {
            const char *e = encoding_name(call->response_encoding);
            nv[3].value = (uint8_t *)e;
            nv[3].valuelen = strlen(e);
            nnv = 4;
        }
        nghttp2_data_provider prd = {.source.ptr = call, .read_callback = read_data};
        nghttp2_submit_response(c->session, call->stream_id, nv, nnv, &prd);
    } else if (!m->pending) {
        nghttp2_session_resume_data(c->session, call->stream_id);
    }
    if (start)
        compress_start(call, m); /* last: on failure it frees m and ends the call */
    call_kick(call);
}

/* A response with headers only and END_STREAM: Trailers-Only, or a plain HTTP error. */
static void submit_headers_only(oi_grpc_call_t *call, const char *http_status, int grpc_status, const char *message)
{
    char code[12];
    snprintf(code, sizeof(code), "%d", grpc_status);
    oi_sbuf_t enc = {0};
    int grpc = strcmp(http_status, "200") == 0;
    nghttp2_nv nv[5] = {
        {(uint8_t *)":status", (uint8_t *)http_status, 7, strlen(http_status), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)(grpc ? "application/grpc" : "text/plain"), 12, grpc ? 16 : 10,
         NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-accept-encoding", (uint8_t *)ACCEPT_ENCODINGS, 20, sizeof(ACCEPT_ENCODINGS) - 1,
         NGHTTP2_NV_FLAG_NONE},
    };
    size_t n = 4;
    if (message && message[0] && oi_grpc_percent_encode(&enc, message) == 0)
        nv[n++] = (nghttp2_nv){(uint8_t *)"grpc-message", (uint8_t *)enc.data, 12, enc.len, NGHTTP2_NV_FLAG_NONE};
    nghttp2_submit_response(call->conn->session, call->stream_id, nv, n, NULL);
    oi_sbuf_free(&enc);
}

void oi_grpc_finish(oi_grpc_call_t *call, int grpc_status, const char *message)
{
    if (!oi_grpc_call_open(call))
        return;
    call->finished = 1;
    stop_timer(call);
    oi_h2_server_t *s = call->conn->lp->server;
    if (s->cfg.on_finished != NULL)
        s->cfg.on_finished(s->ctx, call, grpc_status);
    /* A message still arriving is of no use now. */
    oi_buf_unref(call->msg);
    call->msg = NULL;
    if (!call->headers_sent) {
        call->headers_sent = 1;
        submit_headers_only(call, "200", grpc_status, message);
    } else {
        call->status = grpc_status;
        call->status_message = message && message[0] ? strdup(message) : NULL;
        if (grpc_status != OI_GRPC_OK && call->compressing) {
            /* An error ends the call now: the responses still being compressed are dropped
             * (compress_done sees `discard`) rather than waited for. */
            call->compressing = 0;
            call->discard = 1;
        }
        nghttp2_session_resume_data(call->conn->session, call->stream_id);
    }
    call_kick(call);
}

/* ---- the request side ------------------------------------------------------------------- */

static void on_deadline(uv_timer_t *t)
{
    oi_grpc_call_t *call = t->data;
    char msg[96];
    snprintf(msg, sizeof(msg), "deadline exceeded: the call's grpc-timeout of %llu ms passed",
             (unsigned long long)call->timeout_ms);
    oi_h2_server_t *s = call->conn ? call->conn->lp->server : NULL;
    oi_grpc_call_ref(call); /* finishing may close the stream */
    oi_grpc_finish(call, OI_GRPC_DEADLINE_EXCEEDED, msg);
    if (s != NULL)
        call_gone(s, call);
    oi_grpc_call_unref(call);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    h2_conn_t *c = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    oi_grpc_call_t *call = calloc(1, sizeof(*call));
    if (call == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* nghttp2 resets the stream */
    call->refs = 1; /* the stream's */
    call->conn = c;
    if (c->calls == NULL)
        uv_timer_stop(&c->timer); /* not idle while a stream is open (with others open, the timer
                                   * is the messages' minimum rate: it stays) */
    call->opened_ms = uv_now(&c->lp->loop->uv);
    call->loop = c->lp->loop;
    call->stream_id = frame->hd.stream_id;
    call->method = "";
    if (c->lp->server->cfg.on_finished != NULL)
        call->start_ns = uv_hrtime();
    call->next = c->calls;
    if (c->calls)
        c->calls->prev = call;
    c->calls = call;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
    return 0;
}

static int header_is(const uint8_t *name, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(name, want, n) == 0;
}

/* The algorithms named in a grpc-accept-encoding value ("identity, deflate, gzip"), as bits
 * 1 << oi_encoding_t. */
static unsigned accept_encodings(const char *v, size_t n)
{
    unsigned bits = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == ','))
            i++;
        size_t j = i;
        while (j < n && v[j] != ',' && v[j] != ' ')
            j++;
        if (j - i == 4 && memcmp(v + i, "gzip", 4) == 0)
            bits |= 1u << OI_ENCODING_GZIP;
        else if (j - i == 7 && memcmp(v + i, "deflate", 7) == 0)
            bits |= 1u << OI_ENCODING_DEFLATE;
        i = j;
    }
    return bits;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    (void)flags, (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* the client's trailers, if any, say nothing we need */
    oi_grpc_call_t *call = call_of(session, frame->hd.stream_id);
    if (call == NULL)
        return 0;
    if (header_is(name, namelen, ":path")) {
        if (valuelen > MAX_PATH_LEN || call->path != NULL)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        call->path = strndup((const char *)value, valuelen);
        if (call->path == NULL)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        call->method = call->path;
    } else if (header_is(name, namelen, ":method")) {
        call->bad_method = !(valuelen == 4 && memcmp(value, "POST", 4) == 0);
    } else if (header_is(name, namelen, "content-type")) {
        /* application/grpc, optionally +proto or ;params */
        call->content_type_ok = valuelen >= 16 && strncasecmp((const char *)value, "application/grpc", 16) == 0 &&
                                (valuelen == 16 || value[16] == '+' || value[16] == ';');
    } else if (header_is(name, namelen, "grpc-timeout")) {
        uint64_t ms;
        if (oi_grpc_parse_timeout((const char *)value, valuelen, &ms) == 0)
            call->timeout_ms = ms > 0 ? ms : 1;
    } else if (header_is(name, namelen, "grpc-encoding")) {
        size_t n = valuelen < sizeof(call->encoding_name) - 1 ? valuelen : sizeof(call->encoding_name) - 1;
        memcpy(call->encoding_name, value, n);
        call->encoding_name[n] = '\0';
        call->encoding = n == valuelen ? (int)oi_content_encoding(call->encoding_name) : OI_ENCODING_UNKNOWN;
        if (strcmp(call->encoding_name, "x-gzip") == 0) /* an HTTP name, not a gRPC one */
            call->encoding = OI_ENCODING_UNKNOWN;
    } else if (header_is(name, namelen, "grpc-accept-encoding")) {
        call->accept_encodings |= accept_encodings((const char *)value, valuelen);
    }
    return 0;
}

/* The request headers are complete: check them, arm the deadline, tell the handler. */
static void start_call(h2_conn_t *c, oi_grpc_call_t *call)
{
    oi_h2_server_t *s = c->lp->server;
    if (call->bad_method) {
        call->finished = 1;
        call->headers_sent = 1;
        submit_headers_only(call, "405", OI_GRPC_UNIMPLEMENTED, "gRPC calls are POST requests");
        return;
    }
    if (!call->content_type_ok) {
        call->finished = 1;
        call->headers_sent = 1;
        submit_headers_only(call, "415", OI_GRPC_INVALID_ARGUMENT,
                            "unsupported content-type; this gRPC endpoint expects application/grpc");
        return;
    }
    if (call->path == NULL) {
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, "the request has no :path naming a method");
        return;
    }
    if (call->timeout_ms > 0) {
        uv_timer_t *t = malloc(sizeof(*t));
        if (t != NULL) {
            uv_timer_init(&c->lp->loop->uv, t);
            t->data = call;
            call->timer = t;
            oi_grpc_call_ref(call); /* the timer's, until closed */
            uv_timer_start(t, on_deadline, call->timeout_ms, 0);
        }
    }
    s->handler.on_call(s->ctx, call);
}

/* A compressed request message being inflated on a worker thread; its call waits (inflating)
 * and is kept by a reference. */
typedef struct inflate_work_s {
    oi_work_t work;
    oi_grpc_call_t *call;
    oi_h2_server_t *server;
    oi_buf_t *in;
    int enc;
    size_t max_out;
    oi_buf_t *out;
    oi_status_t *st;
} inflate_work_t;

static void inflate_run(oi_work_t *w)
{
    inflate_work_t *f = (inflate_work_t *)w;
    const oi_h2_config_t *cfg = &f->server->cfg;
    oi_inflate_limit_t lim = {.max_out = f->max_out,
                              .what = "request message",
                              .limit_name = "grpc_max_message_bytes",
                              .max_ratio = cfg->max_inflate_ratio,
                              .budget = cfg->message_budget,
                              .expect = OI_INFLATE_PROTOBUF};
    f->st = oi_inflate(f->in->data, f->in->len, (oi_encoding_t)f->enc, &lim, &f->out);
}

static void call_drain(h2_conn_t *c, oi_grpc_call_t *call);

static void inflate_done(oi_work_t *w)
{
    inflate_work_t *f = (inflate_work_t *)w;
    oi_grpc_call_t *call = f->call;
    oi_h2_server_t *server = f->server;
    oi_buf_unref(f->in);
    call->inflating = 0;
    h2_conn_t *c = call->conn;
    if (f->st != NULL) {
        /* Too large, or no room in the budget: RESOURCE_EXHAUSTED, as for an uncompressed
         * message over the limit; corrupt or truncated data, or bytes that cannot start a
         * message: INTERNAL, as gRPC answers a message it cannot inflate. */
        int big = f->st->code == OI_TOO_LARGE || f->st->code == OI_UNAVAILABLE;
        oi_grpc_finish(call, big ? OI_GRPC_RESOURCE_EXHAUSTED : OI_GRPC_INTERNAL, f->st->message);
        oi_status_free(f->st);
    } else if (c != NULL && !c->closing && oi_grpc_call_open(call)) {
        oi_h2_server_t *s = c->lp->server;
        c->in_recv = 1; /* answers given from inside only queue: one flush below */
        s->handler.on_message(s->ctx, call, f->out);
        call_drain(c, call);
        c->in_recv = 0;
    } else {
        oi_buf_unref(f->out);
    }
    free(f);
    if (c != NULL && !c->closing)
        conn_flush(c);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&server->working, 1); /* last: a stop may free the server once it is 0 */
}

/* Hands a complete request message to the handler; a compressed one is inflated off the loop
 * first, and the call's later messages wait behind it. */
static void deliver(h2_conn_t *c, oi_grpc_call_t *call, oi_buf_t *m, int compressed)
{
    oi_h2_server_t *s = c->lp->server;
    if (!compressed) {
        s->handler.on_message(s->ctx, call, m);
        return;
    }
    inflate_work_t *f = malloc(sizeof(*f));
    if (f != NULL) {
        *f = (inflate_work_t){.work = {.run = inflate_run, .done = inflate_done},
                              .call = call,
                              .server = s,
                              .in = m,
                              .enc = call->encoding,
                              .max_out = s->cfg.max_message_bytes};
        call->inflating = 1;
        oi_grpc_call_ref(call);
        atomic_fetch_add(&s->working, 1);
        if (oi_loop_work(call->loop, &f->work) == 0)
            return;
        atomic_fetch_sub(&s->working, 1);
        call->inflating = 0;
        oi_grpc_call_unref(call);
        free(f);
    }
    oi_buf_unref(m);
    oi_grpc_finish(call, OI_GRPC_RESOURCE_EXHAUSTED, "out of memory for the request message");
}

/* ---- slow messages: a minimum rate ------------------------------------------------------ */

/* When the message `call` is receiving falls below the minimum rate: message_grace_ms past its
 * first byte, plus a second for every message_min_rate bytes of it received (as HTTP/1.1's
 * body_min_rate). 0 when it receives none. */
static uint64_t message_deadline(const oi_h2_server_t *s, const oi_grpc_call_t *call)
{
    if (!oi_grpc_call_open(call) || (call->msg == NULL && call->prefix_have == 0))
        return 0;
    uint64_t got = call->prefix_have + (call->msg ? call->msg->len : 0);
    return call->msg_start + s->cfg.message_grace_ms + got * 1000 / s->cfg.message_min_rate;
}

/* The connection's timer, while streams are open, fires at the earliest of their messages'
 * deadlines (at least that early: a timer that fires early looks again). */
static void arm_rate_timer(h2_conn_t *c, uint64_t at)
{
    uint64_t now = uv_now(&c->lp->loop->uv), ms = at > now ? at - now : 0;
    if (!uv_is_active((uv_handle_t *)&c->timer) || uv_timer_get_due_in(&c->timer) > ms)
        uv_timer_start(&c->timer, on_conn_timer, ms, 0);
}

static void message_begins(h2_conn_t *c, oi_grpc_call_t *call)
{
    oi_h2_server_t *s = c->lp->server;
    call->msg_start = uv_now(&c->lp->loop->uv);
    if (s->cfg.message_min_rate > 0)
        arm_rate_timer(c, call->msg_start + s->cfg.message_grace_ms);
}

/* Ends the calls whose message arrives below the minimum rate, and sets the timer for the
 * next deadline. A trickle of DATA, each frame soon after the last, cannot hold a stream (and
 * so its connection, which is never idle then) for long. */
static void check_rates(h2_conn_t *c)
{
    oi_h2_server_t *s = c->lp->server;
    if (s->cfg.message_min_rate == 0)
        return;
    uint64_t now = uv_now(&c->lp->loop->uv), next = 0;
    for (oi_grpc_call_t *call = c->calls, *after; call != NULL && !c->closing; call = after) {
        after = call->next; /* finishing may close the stream and unlink it (only it) */
        uint64_t at = message_deadline(s, call);
        if (at == 0)
            continue;
        if (c->throttled || call->held_head != NULL || call->inflating) {
            /* We hold the client's window back: its message waits on us, not it. Its time
             * starts again (the bytes it sent still count) and is looked at later. */
            call->msg_start = now;
            at = message_deadline(s, call);
        }
        if (at > now) {
            next = next == 0 || at < next ? at : next;
            continue;
        }
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the request message arrived slower than the server's body_min_rate of %u bytes/s (%zu bytes in "
                 "%llu ms)",
                 s->cfg.message_min_rate, call->prefix_have + (call->msg ? call->msg->len : 0),
                 (unsigned long long)(now - call->msg_start));
        oi_grpc_call_ref(call);
        oi_grpc_finish(call, OI_GRPC_DEADLINE_EXCEEDED, msg);
        call_gone(s, call);
        oi_grpc_call_unref(call);
    }
    if (next != 0 && !c->closing)
        arm_rate_timer(c, next);
}

/* Feeds DATA bytes to the message reassembly: each complete message goes to the handler. */
static void call_feed(h2_conn_t *c, oi_grpc_call_t *call, const uint8_t *data, size_t len)
{
    oi_h2_server_t *s = c->lp->server;
    while (oi_grpc_call_open(call)) {
        if (call->msg == NULL) {
            if (len == 0)
                return;
            if (call->prefix_have == 0)
                message_begins(c, call);
            size_t take = 5 - call->prefix_have < len ? 5 - call->prefix_have : len;
            memcpy(call->prefix + call->prefix_have, data, take);
            call->prefix_have += take;
            data += take;
            len -= take;
            if (call->prefix_have < 5)
                return;
            uint32_t n = (uint32_t)call->prefix[1] << 24 | (uint32_t)call->prefix[2] << 16 |
                         (uint32_t)call->prefix[3] << 8 | call->prefix[4];
            if (call->prefix[0] > 1) {
                oi_grpc_finish(call, OI_GRPC_INTERNAL, "malformed gRPC message prefix: flag byte is not 0 or 1");
                return;
            }
            if (call->prefix[0] == 1 && (call->encoding == OI_ENCODING_IDENTITY)) {
                /* The gRPC spec: a compressed flag without an encoding is INTERNAL. */
                oi_grpc_finish(call, OI_GRPC_INTERNAL,
                               "the message's compressed flag is set but the call has no "
                               "grpc-encoding (expected gzip or deflate)");
                return;
            }
            if (call->prefix[0] == 1 && call->encoding == OI_ENCODING_UNKNOWN) {
                /* UNIMPLEMENTED, with grpc-accept-encoding saying what is (gRPC compression spec). */
                char msg[160];
                snprintf(msg, sizeof(msg), "grpc-encoding '%s' is not supported; this server accepts " ACCEPT_ENCODINGS,
                         call->encoding_name);
                oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
                return;
            }
            if (n > s->cfg.max_message_bytes) {
                char msg[160];
                snprintf(msg, sizeof(msg), "request message of %u bytes is over the server's limit of %zu bytes", n,
                         s->cfg.max_message_bytes);
                oi_grpc_finish(call, OI_GRPC_RESOURCE_EXHAUSTED, msg);
                return;
            }
            int over = 0;
            call->msg = oi_buf_new_charged(n, s->cfg.message_budget, &over);
            if (call->msg == NULL) {
                oi_status_t *st = over ? oi_budget_refusal(s->cfg.message_budget, "request message", n) : NULL;
                oi_grpc_finish(call, OI_GRPC_RESOURCE_EXHAUSTED,
                               st ? st->message : "out of memory for the request message");
                oi_status_free(st);
                return;
            }
            call->msg_need = n;
        }
        if (call->msg_need > 0 && len == 0)
            return;
        size_t take = call->msg_need < len ? call->msg_need : len;
        memcpy(call->msg->data + call->msg->len, data, take);
        call->msg->len += take;
        call->msg_need -= take;
        data += take;
        len -= take;
        if (call->msg_need == 0) {
            oi_buf_t *m = call->msg;
            int compressed = call->prefix[0] == 1;
            call->msg = NULL;
            call->prefix_have = 0;
            call->received++;
            call->bytes_in += 5 + m->len;
            if (c->throttled || call->held_head != NULL || call->inflating) {
                held_msg_t *h = malloc(sizeof(*h));
                if (h == NULL) {
                    oi_buf_unref(m);
                    oi_grpc_finish(call, OI_GRPC_RESOURCE_EXHAUSTED, "out of memory for the request message");
                    return;
                }
                h->next = NULL;
                h->msg = m;
                h->compressed = compressed;
                if (call->held_tail)
                    call->held_tail->next = h;
                else
                    call->held_head = h;
                call->held_tail = h;
            } else {
                deliver(c, call, m, compressed);
            }
        }
    }
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data)
{
    (void)flags;
    h2_conn_t *c = user_data;
    oi_grpc_call_t *call = call_of(session, stream_id);
    /* The window is given back as bytes are taken, except while the connection is throttled
     * (or the call still has held messages): then the client runs out of window and stops. */
    if (call != NULL && (c->throttled || call->held_head != NULL || call->inflating))
        call->unconsumed += len;
    else
        nghttp2_session_consume(session, stream_id, len);
    if (call != NULL) {
        oi_grpc_call_ref(call); /* the handler may finish and the stream close under us */
        call_feed(user_data, call, data, len);
        oi_grpc_call_unref(call);
    }
    return 0;
}

/* The client sent END_STREAM and every message before it was handed over. */
static void half_close(h2_conn_t *c, oi_grpc_call_t *call)
{
    call->half_closed = 1;
    if (oi_grpc_call_open(call)) {
        if (call->msg != NULL || call->prefix_have > 0)
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "the request ended inside a message (truncated gRPC message)");
        else
            c->lp->server->handler.on_half_close(c->lp->server->ctx, call);
    }
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    h2_conn_t *c = user_data;
    if (!c->got_preface) { /* nghttp2 checked the magic; the first frame is the SETTINGS */
        c->got_preface = 1;
        if (c->calls == NULL)
            conn_idle(c);
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    oi_grpc_call_t *call = call_of(session, frame->hd.stream_id);
    if (call == NULL)
        return 0;
    oi_grpc_call_ref(call);
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        start_call(c, call);
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) && !call->half_closed && !call->half_close_held) {
        if (call->held_head != NULL || call->inflating) {
            call->half_close_held = 1; /* told after the held messages, in order */
            oi_grpc_call_unref(call);
            return 0;
        }
        half_close(c, call);
    }
    oi_grpc_call_unref(call);
    return 0;
}

static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    (void)user_data;
    /* Our side ended before the client's: tell it to stop sending (gRPC's RST_STREAM
     * NO_ERROR), so that a rejected large message is not read to its end. */
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        oi_grpc_call_t *call = call_of(session, frame->hd.stream_id);
        if (call != NULL && !call->half_closed && !call->half_close_held)
            nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
{
    (void)error_code, (void)user_data;
    oi_grpc_call_t *call = call_of(session, stream_id);
    if (call != NULL)
        call_detach(call);
    return 0;
}

/* ---- connections ------------------------------------------------------------------------ */

static void conn_maybe_free(h2_conn_t *c)
{
    if (!c->closing || c->writes > 0 || c->handles > 0)
        return;
    for (size_t i = 0; i < c->nsegs; i++)
        oi_buf_unref(c->segs[i].owner);
    free(c->segs);
    oi_sbuf_free(&c->wbuf);
    if (c->peer_counted)
        oi_peers_release(&c->lp->server->peers, &c->peer);
    free(c->creds);
    oi_tcp_listener_count(&c->lp->tcp, -1);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    h2_conn_t *c = h->data;
    c->handles--;
    conn_maybe_free(c);
}

static void conn_close(h2_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    atomic_fetch_sub(&c->lp->server->connections, 1); /* out of the table now (see http1.c) */
    h2_loop_t *lp = c->lp;
    if (c->prev)
        c->prev->next = c->next;
    else
        lp->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    while (c->calls)
        call_detach(c->calls);
    nghttp2_session_del(c->session);
    c->session = NULL;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close(&c->sock.handle, on_handle_closed);
}

/* Sends GOAWAY and lets the connection close once it is written: the client may reconnect. */
static void conn_goaway(h2_conn_t *c)
{
    if (c->closing || c->goaway)
        return;
    c->goaway = 1;
    nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->session),
                          NGHTTP2_NO_ERROR, NULL, 0);
    conn_flush(c);
}

static void on_conn_timer(uv_timer_t *t)
{
    h2_conn_t *c = t->data;
    if (c->closing)
        return;
    if (!c->got_preface) {
        conn_close(c); /* never spoke HTTP/2: nothing to say goodbye to */
        return;
    }
    if (c->calls == NULL) {
        conn_goaway(c);
        if (!c->closing) {
            c->close_after_write = 1;
            if (c->writes == 0)
                conn_close(c);
        }
        return;
    }
    check_rates(c);
    if (!c->closing)
        conn_flush(c); /* the trailers of the calls it ended */
}

/* No stream is open: the idle deadline runs (once the preface is in; before, the preface
 * deadline set at accept keeps running). */
static void conn_idle(h2_conn_t *c)
{
    if (!c->got_preface)
        return;
    c->idle_since = uv_now(&c->lp->loop->uv);
    uint64_t ms = c->lp->server->cfg.idle_timeout_ms;
    if (ms > 0)
        uv_timer_start(&c->timer, on_conn_timer, ms, 0);
    else
        uv_timer_stop(&c->timer);
}

static void after_write(uv_write_t *w, int status)
{
    write_req_t *wr = (write_req_t *)w;
    h2_conn_t *c = wr->conn;
    for (size_t i = 0; i < wr->nowners; i++)
        oi_buf_unref(wr->owners[i]);
    oi_buf_unref(wr->small);
    free(wr);
    c->writes--;
    if (status < 0 || (c->close_after_write && c->writes == 0))
        conn_close(c);
    else if (!c->closing && c->writes == 0 && !nghttp2_session_want_read(c->session) &&
             !nghttp2_session_want_write(c->session))
        conn_close(c); /* GOAWAY exchanged and every stream done */
    conn_maybe_free(c);
}

/* Turns the batch of segments into one uv_write. */
static void conn_write_batch(h2_conn_t *c)
{
    if (c->nsegs == 0)
        return;
    size_t nowners = 0;
    for (size_t i = 0; i < c->nsegs; i++)
        nowners += c->segs[i].owner != NULL;
    write_req_t *wr = malloc(sizeof(*wr) + nowners * sizeof(oi_buf_t *));
    uv_buf_t stackbufs[16];
    uv_buf_t *bufs = c->nsegs <= 16 ? stackbufs : malloc(c->nsegs * sizeof(uv_buf_t));
    oi_buf_t *small = c->wbuf.len > 0 ? oi_sbuf_detach(&c->wbuf) : NULL;
    if (wr == NULL || bufs == NULL || (c->wbuf.len > 0 && small == NULL)) {
        free(wr);
        if (bufs != stackbufs)
            free(bufs);
        oi_buf_unref(small);
        for (size_t i = 0; i < c->nsegs; i++)
            oi_buf_unref(c->segs[i].owner);
        c->nsegs = 0;
        conn_close(c);
        return;
    }
    wr->conn = c;
    wr->small = small;
    wr->nowners = 0;
    for (size_t i = 0; i < c->nsegs; i++) {
        seg_t *sg = &c->segs[i];
        const char *p = sg->inline_ ? small->data + sg->off : sg->ptr;
        bufs[i] = uv_buf_init((char *)p, (unsigned)sg->len);
        if (sg->owner)
            wr->owners[wr->nowners++] = sg->owner;
    }
    size_t n = c->nsegs;
    c->nsegs = 0;
    c->writes++;
    /* Written at once when the socket takes it all (as nearly every answer is), then released
     * here; callers check `closing` afterwards, as they must after a failed write. */
    int rc = oi_stream_send(&c->sock.stream, &wr->w, bufs, (unsigned)n, after_write);
    if (bufs != stackbufs)
        free(bufs);
    if (rc != 0)
        after_write(&wr->w, rc == 1 ? 0 : rc);
}

/* Hands a call's held messages to the handler in order, while the connection is not
 * throttled and no message of the call is being inflated; once none is left, gives their bytes
 * back to the client's window and delivers a held END_STREAM. Runs with in_recv set. */
static void call_drain(h2_conn_t *c, oi_grpc_call_t *call)
{
    oi_grpc_call_ref(call);
    while (call->held_head != NULL && !c->throttled && !call->inflating && oi_grpc_call_open(call)) {
        held_msg_t *h = call->held_head;
        call->held_head = h->next;
        if (call->held_head == NULL)
            call->held_tail = NULL;
        oi_buf_t *m = h->msg;
        int compressed = h->compressed;
        free(h);
        deliver(c, call, m, compressed);
    }
    if (!oi_grpc_call_open(call))
        drop_held(call);
    if (call->held_head == NULL && !call->inflating && call->conn != NULL) {
        if (call->unconsumed > 0)
            nghttp2_session_consume(c->session, call->stream_id, call->unconsumed);
        call->unconsumed = 0;
        if (call->half_close_held) {
            call->half_close_held = 0;
            half_close(c, call);
        }
    }
    oi_grpc_call_unref(call);
}

/* The queue drained: hands the held messages to the handler (in order, stopping if the
 * connection throttles again) and gives their bytes back to the client's window. Runs with
 * in_recv set, so that answers given from inside only queue; the caller sends. */
static void conn_release(h2_conn_t *c)
{
    c->throttled = 0;
    c->in_recv = 1;
    for (oi_grpc_call_t *call = c->calls; call != NULL && !c->throttled; call = call->next)
        call_drain(c, call);
    c->in_recv = 0;
}

static void conn_flush(h2_conn_t *c)
{
    if (c->closing)
        return;
    int rc = nghttp2_session_send(c->session);
    conn_write_batch(c);
    while (rc == 0 && !c->closing && c->throttled && c->queued <= c->lp->server->cfg.max_queued_bytes / 2) {
        conn_release(c);
        rc = nghttp2_session_send(c->session);
        conn_write_batch(c);
    }
    if (c->closing)
        return;
    if (rc != 0)
        conn_close(c);
    else if (c->writes == 0 && !nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session))
        conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    h2_conn_t *c = h->data;
    *buf = uv_buf_init(c->lp->rbuf, READ_BUF_SIZE);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    h2_conn_t *c = st->data;
    if (nread < 0) {
        conn_close(c); /* EOF or reset: calls in flight are cut, their answers dropped */
        return;
    }
    if (nread == 0 || c->closing)
        return;
    c->in_recv = 1;
    ssize_t rc = nghttp2_session_mem_recv(c->session, (const uint8_t *)buf->base, (size_t)nread);
    c->in_recv = 0;
    if (rc < 0) {
        /* A protocol error: nghttp2 queued a GOAWAY where it could; send it, then close. */
        if (rc != NGHTTP2_ERR_BAD_CLIENT_MAGIC)
            nghttp2_session_send(c->session);
        conn_write_batch(c);
        uv_read_stop(st);
        c->close_after_write = 1;
        if (c->writes == 0)
            conn_close(c);
        return;
    }
    conn_flush(c);
}

/* DATA frames as large as the client allows: fewer frame headers and iovecs per tensor. */
static ssize_t data_length(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                           int32_t session_remote_window_size, int32_t stream_remote_window_size,
                           uint32_t remote_max_frame_size, void *user_data)
{
    (void)session, (void)frame_type, (void)stream_id, (void)user_data;
    int32_t w = session_remote_window_size < stream_remote_window_size ? session_remote_window_size
                                                                         : stream_remote_window_size;
    if (w <= 0)
        return 1; /* nghttp2 defers the stream until a WINDOW_UPDATE */
    return (ssize_t)((uint32_t)w < remote_max_frame_size ? (uint32_t)w : remote_max_frame_size);
}

static int conn_init_session(h2_conn_t *c)
{
    oi_h2_server_t *s = c->lp->server;
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return -1;
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_send_data_callback(cb, on_send_data);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, data_length);
    /* Window updates are ours to give (nghttp2_session_consume): a client that does not read
     * its responses is not granted room for more requests (see max_queued_bytes). */
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return -1;
    }
    nghttp2_option_set_no_auto_window_update(opt, 1);
    int rc = nghttp2_session_server_new2(&c->session, cb, c, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (rc != 0)
        return -1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, s->cfg.max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, (1u << 24) - 1},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 64u << 10},
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) != 0 ||
        nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW) != 0)
        return -1;
    return 0;
}

/* This loop's connection (of `peer` only, unless NULL) with no open stream that has been idle
 * longest, or NULL (only this loop's connections may be touched from its thread). */
static h2_conn_t *oldest_idle(h2_loop_t *lp, h2_conn_t *except, const oi_peer_addr_t *peer)
{
    h2_conn_t *best = NULL;
    for (h2_conn_t *c = lp->conns; c != NULL; c = c->next)
        if (c != except && (peer == NULL || (c->peer_counted && memcmp(&c->peer, peer, sizeof(*peer)) == 0)) &&
            !c->closing && c->calls == NULL && c->writes == 0 && (best == NULL || c->idle_since <= best->idle_since))
            best = c;
    return best;
}

/* This loop's connection whose every call is still receiving its first request message (none
 * has reached the handler), that has received least per second since its oldest call began
 * (a second at least), or NULL: with the table full, it gives way to a new connection. */
static h2_conn_t *slowest_receiving(h2_loop_t *lp, h2_conn_t *except)
{
    uint64_t now = uv_now(&lp->loop->uv);
    h2_conn_t *best = NULL;
    double best_rate = 0;
    for (h2_conn_t *c = lp->conns; c != NULL; c = c->next) {
        if (c == except || c->closing || c->calls == NULL)
            continue;
        uint64_t got = 0, first = now;
        oi_grpc_call_t *call = c->calls;
        for (; call != NULL; call = call->next) {
            if (call->received > 0 || call->half_closed || call->finished)
                break;
            got += call->prefix_have + (call->msg ? call->msg->len : 0);
            first = call->opened_ms < first ? call->opened_ms : first;
        }
        if (call != NULL)
            continue;
        double rate = (double)got * 1000.0 / (double)(now - first < 1000 ? 1000 : now - first);
        if (best == NULL || rate < best_rate) {
            best = c;
            best_rate = rate;
        }
    }
    return best;
}

/* Counts the new connection against its address's limit: 0, or -1 to refuse it. */
static int admit_peer(h2_conn_t *c)
{
    int fd = -1;
    if (uv_fileno(&c->sock.handle, &fd) != 0 || oi_peer_addr_of(fd, &c->peer) != 0)
        return 0; /* no IP peer to count */
    c->peer_counted = 1;
    if (oi_peers_acquire(&c->lp->server->peers, &c->peer) == 0)
        return 0;
    /* The address is at its limit: its own oldest idle connection gives way, handing its
     * count to the new one, so a client only ever displaces itself; with none idle, refuse. */
    h2_conn_t *victim = oldest_idle(c->lp, c, &c->peer);
    if (victim == NULL) {
        c->peer_counted = 0;
        return -1;
    }
    victim->peer_counted = 0;
    conn_close(victim);
    return 0;
}

/* A new connection of `lp` (on a Unix-domain socket when `pipe`), linked and counted, its
 * handles initialised but no socket yet; NULL when out of memory. */
static h2_conn_t *conn_new(h2_loop_t *lp, int pipe)
{
    h2_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->lp = lp;
    if (pipe)
        uv_pipe_init(&lp->loop->uv, &c->sock.pipe, 0);
    else
        uv_tcp_init(&lp->loop->uv, &c->sock.tcp);
    uv_timer_init(&lp->loop->uv, &c->timer);
    c->sock.handle.data = c->timer.data = c;
    c->handles = 2;
    c->idle_since = uv_now(&lp->loop->uv);
    atomic_fetch_add(&lp->server->connections, 1);
    oi_tcp_listener_count(&lp->tcp, 1);
    c->next = lp->conns;
    if (lp->conns)
        lp->conns->prev = c;
    lp->conns = c;
    return c;
}

/* Starts reading a connection that has its socket and session, under the preface deadline. */
static void conn_start(h2_conn_t *c)
{
    oi_h2_server_t *s = c->lp->server;
    if (s->cfg.preface_timeout_ms > 0)
        uv_timer_start(&c->timer, on_conn_timer, s->cfg.preface_timeout_ms, 0);
    if (c->sock.handle.type == UV_TCP)
        uv_tcp_nodelay(&c->sock.tcp, 1);
    if (uv_read_start(&c->sock.stream, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    conn_flush(c); /* our SETTINGS and connection WINDOW_UPDATE go first */
}

/* A connection that has its socket: admitted (or closed) and started. */
static void conn_accepted(h2_conn_t *c)
{
    oi_h2_server_t *s = c->lp->server;
    if (admit_peer(c) != 0 || conn_init_session(c) != 0) {
        conn_close(c);
        return;
    }
    if (atomic_load(&s->connections) > s->cfg.max_connections) {
        /* Full: an idle connection gives way to the new one (see oldest_idle), else one that
         * only trickles request bytes in. */
        h2_conn_t *victim = oldest_idle(c->lp, c, NULL);
        if (victim == NULL)
            victim = slowest_receiving(c->lp, c);
        if (victim == NULL) {
            conn_close(c);
            return;
        }
        conn_close(victim);
    }
    conn_start(c);
}

static void on_unix_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    h2_conn_t *c = conn_new(server->data, 1);
    if (c == NULL)
        return;
    if (uv_accept(server, &c->sock.stream) != 0) {
        conn_close(c);
        return;
    }
    conn_accepted(c);
}

static void on_tcp_connection(oi_tcp_listener_t *l, int fd)
{
    h2_conn_t *c = conn_new(l->data, 0);
    if (c == NULL) {
        close(fd);
        return;
    }
    if (uv_tcp_open(&c->sock.tcp, fd) != 0) {
        close(fd);
        conn_close(c);
        return;
    }
    conn_accepted(c);
}

int oi_h2_server_adopt(oi_h2_server_t *s, int fd)
{
    h2_conn_t *c = conn_new(&s->loops[0], 0);
    if (c == NULL)
        return UV_ENOMEM;
    int rc = conn_init_session(c) != 0 ? UV_ENOMEM : uv_tcp_open(&c->sock.tcp, fd);
    if (rc != 0) {
        conn_close(c); /* the socket stays the caller's */
        return rc;
    }
    conn_start(c);
    return 0;
}

/* ---- server ------------------------------------------------------------------------------- */

oi_h2_server_t *oi_h2_server_new(const oi_h2_config_t *cfg, const oi_grpc_handler_t *handler, void *ctx)
{
    oi_h2_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cfg = *cfg;
    snprintf(s->host, sizeof(s->host), "%s", cfg->host ? cfg->host : "127.0.0.1");
    s->cfg.host = s->host;
    snprintf(s->unix_path, sizeof(s->unix_path), "%s", cfg->unix_path ? cfg->unix_path : "");
    s->cfg.unix_path = s->unix_path[0] ? s->unix_path : NULL;
    if (s->cfg.max_message_bytes == 0 || s->cfg.max_message_bytes > UINT32_MAX)
        s->cfg.max_message_bytes = UINT32_MAX;
    if (s->cfg.max_queued_bytes == 0)
        s->cfg.max_queued_bytes = DEFAULT_MAX_QUEUED;
    if (s->cfg.max_concurrent_streams == 0)
        s->cfg.max_concurrent_streams = 1024;
    if (s->cfg.max_connections <= 0)
        s->cfg.max_connections = 4096;
    oi_peers_init(&s->peers, s->cfg.max_connections_per_peer);
    s->handler = *handler;
    s->ctx = ctx;
    return s;
}

typedef struct listen_arg_s {
    h2_loop_t *lp;
    const struct sockaddr_storage *addr;
    h2_loop_t *first;
    int rc;
} listen_arg_t;

/* On the loop's thread: the first loop binds (or takes the socket it was given), the others
 * watch duplicates of its socket (as in http1.c: one accept queue, see oi_tcp_listen). */
static void open_listener(void *arg)
{
    listen_arg_t *a = arg;
    h2_loop_t *lp = a->lp;
    a->rc = oi_tcp_listen(&lp->loop->uv, &lp->tcp, a->addr, a->first ? &a->first->tcp : NULL, lp->server->cfg.listen_fd,
                          on_tcp_connection, lp);
}

typedef struct unix_arg_s {
    h2_loop_t *lp;
    h2_loop_t *first;
    char *err;
    size_t errlen;
    int rc;
} unix_arg_t;

/* On the loop's thread: the Unix-domain listener, bound by the first loop and shared by
 * duplicates of its socket as for TCP. */
static void open_unix_listener(void *arg)
{
    unix_arg_t *a = arg;
    h2_loop_t *lp = a->lp;
    oi_h2_server_t *s = lp->server;
    int rc = a->first == NULL ? oi_unix_listen_open(&lp->loop->uv, &lp->pipe, s->unix_path, s->cfg.unix_mode,
                                                    &s->unix_sock, a->err, a->errlen)
                              : oi_unix_listen_dup(&lp->loop->uv, &lp->pipe, &a->first->pipe);
    if (rc == 0) {
        lp->pipe_listening = 1;
        lp->pipe.data = lp;
        rc = uv_listen((uv_stream_t *)&lp->pipe, 1024, on_unix_connection);
    }
    if (rc != 0 && (a->first != NULL || !a->err[0]))
        snprintf(a->err, a->errlen, "cannot listen for gRPC on %s: %s", s->unix_path, uv_strerror(rc));
    a->rc = rc;
}

int oi_h2_server_start(oi_h2_server_t *s, oi_loop_t **loops, int nloops, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", s->cfg.port);
    int tcp = s->cfg.port >= 0, rc = tcp ? getaddrinfo(s->host, portstr, &hints, &res) : 0;
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", s->host, gai_strerror(rc));
        return UV_EINVAL;
    }
    struct sockaddr_storage addr = {0};
    if (tcp) {
        memcpy(&addr, res->ai_addr, res->ai_addrlen);
        freeaddrinfo(res);
    }
    s->loops = calloc((size_t)nloops, sizeof(*s->loops));
    if (s->loops == NULL) {
        snprintf(err, errlen, "out of memory");
        return UV_ENOMEM;
    }
    for (int i = 0; i < nloops; i++) {
        h2_loop_t *lp = &s->loops[i];
        lp->loop = loops[i];
        lp->server = s;
        lp->rbuf = malloc(READ_BUF_SIZE);
        s->nloops++;
        if (lp->rbuf == NULL) {
            snprintf(err, errlen, "out of memory");
            return UV_ENOMEM;
        }
        listen_arg_t a = {lp, &addr, i ? &s->loops[0] : NULL, 0};
        if (tcp)
            oi_loop_call(lp->loop, open_listener, &a);
        if (a.rc != 0) {
            snprintf(err, errlen, "cannot listen for gRPC on %s:%d: %s", s->host, s->cfg.port, uv_strerror(a.rc));
            return a.rc;
        }
        err[0] = '\0';
        unix_arg_t u = {lp, i ? &s->loops[0] : NULL, err, errlen, 0};
        if (s->cfg.unix_path)
            oi_loop_call(lp->loop, open_unix_listener, &u);
        if (u.rc != 0)
            return u.rc;
    }
    if (tcp)
        s->port = oi_tcp_bound_port(&s->loops[0].tcp);
    return 0;
}

int oi_h2_server_port(const oi_h2_server_t *s) { return s->port; }

int oi_h2_server_working(const oi_h2_server_t *s)
{
    return atomic_load(&((oi_h2_server_t *)s)->working);
}

static void close_listener(h2_loop_t *lp)
{
    oi_tcp_listener_close(&lp->tcp);
    if (lp->pipe_listening) {
        lp->pipe_listening = 0;
        uv_close((uv_handle_t *)&lp->pipe, NULL);
    }
}

static void stop_loop(void *arg)
{
    h2_loop_t *lp = arg;
    close_listener(lp);
    for (h2_conn_t *c = lp->conns, *next; c != NULL; c = next) {
        next = c->next; /* conn_flush may close c */
        conn_goaway(c);
    }
}

static void close_loop(void *arg)
{
    h2_loop_t *lp = arg;
    close_listener(lp);
    while (lp->conns)
        conn_close(lp->conns);
}

void oi_h2_server_stop_accepting(oi_h2_server_t *s)
{
    for (int i = 0; i < s->nloops; i++)
        oi_loop_call(s->loops[i].loop, stop_loop, &s->loops[i]);
    oi_unix_listen_unlink(&s->unix_sock); /* no listener behind it now */
}

typedef struct abandon_arg_s {
    h2_loop_t *lp;
    const char *message;
} abandon_arg_t;

static void abandon_loop(void *arg)
{
    abandon_arg_t *a = arg;
    for (h2_conn_t *c = a->lp->conns, *next; c != NULL; c = next) {
        next = c->next; /* conn_flush may close c */
        c->in_recv = 1; /* finish only queues: one flush below */
        for (oi_grpc_call_t *call = c->calls; call != NULL; call = call->next) {
            if (!call->finished || !call->compressing) {
                /* Its work is told to stop (a streaming model would otherwise run on). */
                if (!call->finished)
                    call_gone(c->lp->server, call);
                oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, a->message);
                continue;
            }
            /* Answered, but its answer is still being compressed: UNAVAILABLE instead. */
            free(call->status_message);
            call->status = OI_GRPC_UNAVAILABLE;
            call->status_message = strdup(a->message);
            call->compressing = 0;
            call->discard = 1;
            nghttp2_session_resume_data(c->session, call->stream_id);
        }
        c->in_recv = 0;
        conn_goaway(c);
        if (!c->closing) {
            conn_flush(c);
            if (!c->closing) {
                c->close_after_write = 1;
                if (c->writes == 0)
                    conn_close(c);
            }
        }
    }
}

void oi_h2_server_abandon(oi_h2_server_t *s, const char *message)
{
    for (int i = 0; i < s->nloops; i++) {
        abandon_arg_t a = {&s->loops[i], message};
        oi_loop_call(s->loops[i].loop, abandon_loop, &a);
    }
}

void oi_h2_server_close(oi_h2_server_t *s)
{
    for (int i = 0; i < s->nloops; i++)
        oi_loop_call(s->loops[i].loop, close_loop, &s->loops[i]);
    oi_unix_listen_unlink(&s->unix_sock);
}

void oi_h2_server_free(oi_h2_server_t *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < s->nloops; i++)
        free(s->loops[i].rbuf);
    free(s->loops);
    oi_peers_destroy(&s->peers);
    free(s);
}
