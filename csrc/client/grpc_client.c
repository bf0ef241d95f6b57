#include "client/grpc_client.h"

#include "client/socket.h"
#include "client/tls_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "transport/grpc.h"

#define READ_BUF_SIZE (256u << 10)
/* The widest windows HTTP/2 allows: the server may send messages of up to 4 GiB, and a window
 * that needs updates in the middle of one costs a round trip each time. */
#define WINDOW ((1u << 31) - 1)
#define MAX_FRAME ((1u << 24) - 1)
/* Pieces of a DATA payload up to this size are copied into the batch instead of getting an
 * iovec of their own (the message prefix, short protobuf headers). */
#define INLINE_MAX 64
#define READS_PER_WAKEUP 16
/* A connection idle this long is checked for a GOAWAY or a close before a new call. */
#define IDLE_CHECK_MS 1000

/* One slice of bytes queued for the socket: inline bytes live in the connection's `wbuf` (at
 * offset `off`), others are borrowed from the message being sent. */
typedef struct seg_s {
    const char *ptr;
    size_t off;
    size_t len;
    int inline_;
} seg_t;

/* A request message waiting for nghttp2 to frame it: parts[0] is its 5-byte prefix. */
typedef struct out_msg_s {
    struct out_msg_s *next;
    size_t nparts;
    size_t idx; /* next part to frame */
    size_t off; /* bytes of parts[idx] already framed */
    uint8_t prefix[5];
    struct iovec parts[];
} out_msg_t;

struct oi_grpc_client_call_s {
    oi_grpc_client_t *c;
    struct oi_grpc_client_call_s *prev, *next; /* in c->calls while its stream lives */
    int linked;
    int submitted; /* the request headers were submitted: stream_id is valid */
    int32_t stream_id;
    char *method;
    int64_t deadline; /* CLOCK_MONOTONIC ms; 0: none */
    /* The request side. */
    out_msg_t *out_head, *out_tail;
    uint64_t out_bytes; /* bytes queued and not yet framed */
    int end_queued;     /* END_STREAM after the queued messages */
    int end_sent;
    /* The response side: the message being reassembled and those complete, oldest first. */
    uint8_t prefix[5];
    size_t prefix_have;
    oi_buf_t *msg;
    size_t msg_need;
    oi_buf_t **inbox;
    size_t in_head, in_len, in_cap;
    int got_headers;
    int http_status;
    int content_type_ok;
    int hdr_status; /* grpc-status as received; -1 none */
    char *hdr_message;
    uint32_t rst_code; /* the stream's RST_STREAM code, when it was reset */
    int reset;
    /* The end. */
    int ended;
    int status;
    char *message; /* NUL-terminated, owned */
    int failed;    /* the connection failed under the call: `error` says how */
    char error[256];
};

struct oi_grpc_client_s {
    char host[256];
    int port;
    char authority[300];
    int fd; /* -1 when not connected */
    oi_ctls_config_t *tls_cfg; /* grpcs: what the connections check and show; NULL: h2c */
    oi_ctls_t *tls;            /* the open connection's TLS */
    nghttp2_session *session;
    int reused; /* a call completed on this connection: a failure may be a stale connection */
    int rcvtimeo_ms; /* the socket's SO_RCVTIMEO (oi_client_recv_slice) */
    oi_grpc_client_call_t *calls;
    /* The write batch: frames nghttp2 produced, written with sendmsg. */
    oi_sbuf_t wbuf;
    seg_t *segs;
    size_t nsegs, capsegs, seg_idx, seg_off;
    size_t borrowed; /* segments that point at a caller's memory */
    int cb_failed;   /* out of memory inside an nghttp2 callback */
    /* Frame boundaries of what the server sent, tracked so that DATA payload continuing a
     * message can be received straight into that message's buffer. */
    uint8_t fh[9];
    size_t fh_have;
    uint32_t f_left;
    uint8_t f_type, f_flags;
    int32_t f_stream;
    char error[256]; /* why the connection last failed */
    int64_t last_io; /* when the connection last read (CLOCK_MONOTONIC ms) */
    char *rbuf;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- calls ------------------------------------------------------------------------------ */

static void out_clear(oi_grpc_client_call_t *call)
{
    while (call->out_head) {
        out_msg_t *m = call->out_head;
        call->out_head = m->next;
        free(m);
    }
    call->out_tail = NULL;
    call->out_bytes = 0;
}

static void unlink_call(oi_grpc_client_call_t *call)
{
    oi_grpc_client_t *c = call->c;
    if (!call->linked)
        return;
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    call->prev = call->next = NULL;
    call->linked = 0;
    if (c->session != NULL && call->submitted)
        nghttp2_session_set_stream_user_data(c->session, call->stream_id, NULL);
}

/* Ends the call with a status of our own (not the server's); later statuses are ignored. */
static void call_end(oi_grpc_client_call_t *call, int status, const char *message)
{
    if (call->ended)
        return;
    call->ended = 1;
    call->status = status;
    call->message = strdup(message ? message : "");
}

/* The gRPC status of an HTTP status without grpc-status (gRPC's HTTP-to-gRPC mapping). */
static int status_from_http(int http)
{
    switch (http) {
    case 400: return OI_GRPC_INTERNAL;
    case 401: return OI_GRPC_UNAUTHENTICATED;
    case 403: return OI_GRPC_PERMISSION_DENIED;
    case 404: return OI_GRPC_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504: return OI_GRPC_UNAVAILABLE;
    default: return OI_GRPC_UNKNOWN;
    }
}

/* The status of a stream the server reset without sending one (gRPC's RST_STREAM mapping). */
static int status_from_rst(uint32_t code)
{
    switch (code) {
    case NGHTTP2_REFUSED_STREAM: return OI_GRPC_UNAVAILABLE;
    case NGHTTP2_CANCEL: return OI_GRPC_CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM: return OI_GRPC_RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY: return OI_GRPC_PERMISSION_DENIED;
    default: return OI_GRPC_INTERNAL;
    }
}

/* The server's side of the stream is over: settle the status from what arrived. */
static void call_settle(oi_grpc_client_call_t *call)
{
    if (call->ended)
        return;
    char msg[160];
    if (call->hdr_status >= 0) {
        if (call->hdr_status == OI_GRPC_OK && (call->msg != NULL || call->prefix_have > 0))
            call_end(call, OI_GRPC_INTERNAL, "the response ended inside a message (truncated gRPC message)");
        else
            call_end(call, call->hdr_status, call->hdr_message);
    } else if (call->reset && !call->got_headers) {
        snprintf(msg, sizeof(msg), "the server reset the stream (HTTP/2 error %s) before answering",
                 nghttp2_http2_strerror(call->rst_code));
        call_end(call, status_from_rst(call->rst_code), msg);
    } else if (call->got_headers && call->http_status != 200) {
        snprintf(msg, sizeof(msg), "the server answered HTTP %d without a gRPC status", call->http_status);
        call_end(call, status_from_http(call->http_status), msg);
    } else if (call->reset) {
        snprintf(msg, sizeof(msg), "the server reset the stream (HTTP/2 error %s) before its status",
                 nghttp2_http2_strerror(call->rst_code));
        call_end(call, status_from_rst(call->rst_code), msg);
    } else {
        call_end(call, OI_GRPC_INTERNAL, "the stream ended without a grpc-status");
    }
}

static int inbox_push(oi_grpc_client_call_t *call, oi_buf_t *m)
{
    if (call->in_len == call->in_cap) {
        size_t cap = call->in_cap ? call->in_cap * 2 : 8;
        oi_buf_t **p = malloc(cap * sizeof(*p));
        if (p == NULL)
            return -1;
        for (size_t i = 0; i < call->in_len; i++)
            p[i] = call->inbox[(call->in_head + i) % call->in_cap];
        free(call->inbox);
        call->inbox = p;
        call->in_cap = cap;
        call->in_head = 0;
    }
    call->inbox[(call->in_head + call->in_len) % call->in_cap] = m;
    call->in_len++;
    return 0;
}

static oi_buf_t *inbox_pop(oi_grpc_client_call_t *call)
{
    if (call->in_len == 0)
        return NULL;
    oi_buf_t *m = call->inbox[call->in_head];
    call->in_head = (call->in_head + 1) % call->in_cap;
    call->in_len--;
    return m;
}

/* Fails a call from inside an nghttp2 callback: reset the stream, end with `status`. */
static void call_abort(oi_grpc_client_call_t *call, int status, const char *message)
{
    oi_grpc_client_t *c = call->c;
    call_end(call, status, message);
    out_clear(call);
    if (call->linked) {
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
        unlink_call(call);
    }
}

/* ---- the connection ----------------------------------------------------------------------- */

static int batch_pending(const oi_grpc_client_t *c)
{
    return c->seg_idx < c->nsegs;
}

static void batch_reset(oi_grpc_client_t *c)
{
    c->nsegs = c->seg_idx = c->seg_off = c->borrowed = 0;
    c->wbuf.len = 0;
}

/* Closes the connection: calls still open on it fail with the reason, and the next call
 * reconnects. Never called from inside an nghttp2 callback. */
static void conn_fail(oi_grpc_client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_fail(oi_grpc_client_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char why[sizeof(c->error)]; /* the arguments may be c->error itself ("%s", c->error) */
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    memcpy(c->error, why, sizeof(why));
    while (c->calls) {
        oi_grpc_client_call_t *call = c->calls;
        unlink_call(call);
        out_clear(call);
        if (!call->ended) {
            call->failed = 1;
            set_err(call->error, sizeof(call->error), "%s", c->error);
        }
    }
    if (c->session != NULL)
        nghttp2_session_del(c->session);
    c->session = NULL;
    oi_ctls_free(c->tls);
    c->tls = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->rcvtimeo_ms = 0;
    c->reused = 0;
    c->fh_have = 0;
    c->f_left = 0;
    batch_reset(c);
}

static int push_seg(oi_grpc_client_t *c, seg_t s)
{
    if (s.inline_ && c->nsegs > c->seg_idx && c->segs[c->nsegs - 1].inline_ &&
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
    c->borrowed += !s.inline_;
    return 0;
}

static int push_inline(oi_grpc_client_t *c, const void *p, size_t n)
{
    size_t off = c->wbuf.len;
    if (oi_sbuf_append(&c->wbuf, p, n) != 0)
        return -1;
    return push_seg(c, (seg_t){NULL, off, n, 1});
}

/* Writes what the batch holds until done or the socket is full: 0, or -1 (errno kept). */
static int batch_write(oi_grpc_client_t *c)
{
    while (c->seg_idx < c->nsegs) {
        struct iovec iov[64];
        int n = 0;
        for (size_t i = c->seg_idx; i < c->nsegs && n < 64; i++, n++) {
            const seg_t *s = &c->segs[i];
            const char *p = s->inline_ ? c->wbuf.data + s->off : s->ptr;
            size_t skip = i == c->seg_idx ? c->seg_off : 0;
            iov[n] = (struct iovec){(char *)p + skip, s->len - skip};
        }
        ssize_t w = oi_ctls_sendmsg(c->tls, c->fd, iov, n, MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR && !oi_client_interrupted())
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        size_t left = (size_t)w;
        while (left > 0) {
            size_t rest = c->segs[c->seg_idx].len - c->seg_off;
            if (left < rest) {
                c->seg_off += left;
                break;
            }
            left -= rest;
            c->seg_idx++;
            c->seg_off = 0;
        }
    }
    batch_reset(c);
    return 0;
}

/* Non-DATA frames (HEADERS, SETTINGS, WINDOW_UPDATE, ...) and DATA that nghttp2 copied (an
 * empty END_STREAM frame): small, copied into the batch. */
static ssize_t on_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags, void *user_data)
{
    (void)session, (void)flags;
    oi_grpc_client_t *c = user_data;
    if (push_inline(c, data, length) != 0) {
        c->cb_failed = 1;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    return (ssize_t)length;
}

static ssize_t read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length, uint32_t *data_flags,
                         nghttp2_data_source *source, void *user_data)
{
    (void)session, (void)stream_id, (void)buf, (void)user_data;
    oi_grpc_client_call_t *call = source->ptr;
    if (call == NULL || !call->linked)
        return NGHTTP2_ERR_DEFERRED;
    if (call->out_bytes == 0 && !call->end_queued)
        return NGHTTP2_ERR_DEFERRED;
    size_t n = call->out_bytes < length ? (size_t)call->out_bytes : length;
    if (n > 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (n == call->out_bytes && call->end_queued) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        call->end_sent = 1;
    }
    return (ssize_t)n;
}

/* A DATA frame: its 9-byte header copied, its payload borrowed from the queued message. */
static int on_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *user_data)
{
    (void)session, (void)frame; /* no padding: no select_padding callback is installed */
    oi_grpc_client_t *c = user_data;
    oi_grpc_client_call_t *call = source->ptr;
    if (push_inline(c, framehd, 9) != 0)
        goto oom;
    while (length > 0) {
        out_msg_t *m = call->out_head;
        struct iovec *p = &m->parts[m->idx];
        size_t take = p->iov_len - m->off < length ? p->iov_len - m->off : length;
        const char *src = (const char *)p->iov_base + m->off;
        /* Small pieces are copied: cheaper than an iovec, and the prefix lives in `m`, which is
         * freed below. */
        if (take <= INLINE_MAX ? push_inline(c, src, take) != 0 : push_seg(c, (seg_t){src, 0, take, 0}) != 0)
            goto oom;
        m->off += take;
        length -= take;
        call->out_bytes -= take;
        if (m->off == p->iov_len) {
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
oom:
    c->cb_failed = 1;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
}

static int header_is(const uint8_t *name, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(name, want, n) == 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    (void)flags, (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    oi_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (call == NULL)
        return 0;
    if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE && header_is(name, namelen, ":status")) {
        call->got_headers = 1;
        call->http_status = 0;
        for (size_t i = 0; i < valuelen && value[i] >= '0' && value[i] <= '9'; i++)
            call->http_status = call->http_status * 10 + (value[i] - '0');
    } else if (header_is(name, namelen, "grpc-status")) {
        int v = 0;
        for (size_t i = 0; i < valuelen && i < 6 && value[i] >= '0' && value[i] <= '9'; i++)
            v = v * 10 + (value[i] - '0');
        call->hdr_status = v;
    } else if (header_is(name, namelen, "grpc-message")) {
        char *m = malloc(valuelen + 1);
        if (m != NULL) {
            oi_grpc_percent_decode((const char *)value, valuelen, m);
            free(call->hdr_message);
            call->hdr_message = m;
        }
    }
    return 0;
}

/* DATA payload for a call: into the message being reassembled (unless it was received there
 * already), each complete message into the call's inbox. */
static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data)
{
    (void)flags, (void)user_data;
    oi_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(session, stream_id);
    while (call != NULL && !call->ended && len > 0) {
        if (call->msg == NULL) {
            size_t take = 5 - call->prefix_have < len ? 5 - call->prefix_have : len;
            memcpy(call->prefix + call->prefix_have, data, take);
            call->prefix_have += take;
            data += take;
            len -= take;
            if (call->prefix_have < 5)
                return 0;
            if (call->prefix[0] != 0) {
                call_abort(call, OI_GRPC_INTERNAL,
                           call->prefix[0] == 1
                               ? "the server sent a compressed message, which this client never asks for"
                               : "malformed gRPC message prefix: flag byte is not 0 or 1");
                return 0;
            }
            size_t n = (size_t)call->prefix[1] << 24 | (size_t)call->prefix[2] << 16 | (size_t)call->prefix[3] << 8 |
                       call->prefix[4];
            call->msg = oi_buf_new(n);
            if (call->msg == NULL) {
                char m[96];
                snprintf(m, sizeof(m), "out of memory for a response message of %zu bytes", n);
                call_abort(call, OI_GRPC_RESOURCE_EXHAUSTED, m);
                return 0;
            }
            call->msg_need = n;
        }
        size_t take = call->msg_need < len ? call->msg_need : len;
        char *dst = call->msg->data + call->msg->len;
        if ((const char *)data != dst && take > 0)
            memcpy(dst, data, take);
        call->msg->len += take;
        call->msg_need -= take;
        data += take;
        len -= take;
        if (call->msg_need == 0) {
            if (inbox_push(call, call->msg) != 0) {
                oi_buf_unref(call->msg);
                call->msg = NULL;
                call_abort(call, OI_GRPC_RESOURCE_EXHAUSTED, "out of memory queueing a response message");
                return 0;
            }
            call->msg = NULL;
            call->prefix_have = 0;
        }
    }
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    (void)user_data;
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    oi_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (call != NULL)
        call_settle(call); /* the server's side is over, whatever ours does */
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
{
    (void)user_data;
    oi_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (call == NULL)
        return 0;
    if (error_code != NGHTTP2_NO_ERROR) {
        call->reset = 1;
        call->rst_code = error_code;
    }
    call_settle(call);
    out_clear(call);
    unlink_call(call);
    return 0;
}

/* Advances the frame tracker over `n` bytes the server sent. */
static void track_frames(oi_grpc_client_t *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        if (c->fh_have < 9) {
            size_t take = 9 - c->fh_have < n ? 9 - c->fh_have : n;
            memcpy(c->fh + c->fh_have, p, take);
            c->fh_have += take;
            p += take;
            n -= take;
            if (c->fh_have == 9) {
                c->f_left = (uint32_t)c->fh[0] << 16 | (uint32_t)c->fh[1] << 8 | c->fh[2];
                c->f_type = c->fh[3];
                c->f_flags = c->fh[4];
                c->f_stream = (int32_t)(((uint32_t)c->fh[5] << 24 | (uint32_t)c->fh[6] << 16 | (uint32_t)c->fh[7] << 8 |
                                         c->fh[8]) &
                                        0x7fffffffu);
                if (c->f_left == 0)
                    c->fh_have = 0;
            }
        } else {
            size_t take = c->f_left < n ? c->f_left : n;
            c->f_left -= (uint32_t)take;
            p += take;
            n -= take;
            if (c->f_left == 0)
                c->fh_have = 0;
        }
    }
}

/* Where the next recv should land: the middle of a message when the bytes coming are DATA
 * payload that continues it (no copy), else the read buffer. */
static char *recv_target(oi_grpc_client_t *c, size_t *room)
{
    if (c->fh_have == 9 && c->f_left > 0 && c->f_type == NGHTTP2_DATA && !(c->f_flags & NGHTTP2_FLAG_PADDED)) {
        oi_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(c->session, c->f_stream);
        if (call != NULL && !call->ended && call->msg != NULL && call->msg_need > 0) {
            *room = call->msg_need < c->f_left ? call->msg_need : c->f_left;
            return call->msg->data + call->msg->len;
        }
    }
    *room = READ_BUF_SIZE;
    return c->rbuf;
}

/* Reads what the socket holds and feeds it to nghttp2; with `block`, the first read waits for
 * bytes (the socket is blocking: every other read and write passes MSG_DONTWAIT). Returns the
 * bytes read (0: none yet), or -1 with the reason in c->error (the connection must be
 * failed). */
static ssize_t conn_read(oi_grpc_client_t *c, int block)
{
    ssize_t total = 0;
    c->last_io = oi_client_now_ms();
    for (int k = 0; k < READS_PER_WAKEUP && c->session != NULL; k++) {
        size_t room;
        char *dst = recv_target(c, &room);
        ssize_t n = oi_ctls_recv(c->tls, c->fd, dst, room, k == 0 && block ? 0 : MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR && !oi_client_interrupted())
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return total;
            set_err(c->error, sizeof(c->error), "receiving from %s:%d: %s", c->host, c->port,
                    errno == EPROTO && c->tls ? oi_ctls_error(c->tls) : strerror(errno));
            return -1;
        }
        if (n == 0) {
            set_err(c->error, sizeof(c->error), "%s:%d closed the connection", c->host, c->port);
            return -1;
        }
        ssize_t rc = nghttp2_session_mem_recv(c->session, (const uint8_t *)dst, (size_t)n);
        if (rc < 0) {
            set_err(c->error, sizeof(c->error),
                    c->cb_failed ? "out of memory receiving from %s:%d: %s" : "HTTP/2 error from %s:%d: %s", c->host,
                    c->port, nghttp2_strerror((int)rc));
            return -1;
        }
        track_frames(c, (const uint8_t *)dst, (size_t)n);
        total += n;
        if ((size_t)n < room)
            return total; /* the socket is drained */
    }
    return total;
}

static int connect_to(oi_grpc_client_t *c, int64_t deadline, char *err, size_t errlen)
{
    int rc = oi_client_connect(c->host, c->port, deadline, &c->fd, err, errlen);
    if (rc == 0 && c->tls_cfg != NULL && (rc = oi_ctls_connect(c->tls_cfg, c->host, c->fd, deadline, &c->tls, err,
                                                               errlen)) != 0) {
        close(c->fd);
        c->fd = -1;
    }
    return rc == 0 ? 0 : rc == -2 ? OI_GRPC_CLIENT_TIMEOUT : OI_GRPC_CLIENT_ERROR;
}

static int session_open(oi_grpc_client_t *c)
{
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return -1;
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_send_data_callback(cb, on_send_data);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    int rc = nghttp2_session_client_new(&c->session, cb, c);
    nghttp2_session_callbacks_del(cb);
    if (rc != 0) {
        c->session = NULL;
        return -1;
    }
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, MAX_FRAME},
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) != 0 ||
        nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, WINDOW) != 0) {
        nghttp2_session_del(c->session);
        c->session = NULL;
        return -1;
    }
    return 0;
}

/* Makes sure the connection is open and can take a new stream. */
static int conn_ready(oi_grpc_client_t *c, int64_t deadline, char *err, size_t errlen)
{
    if (c->session != NULL && oi_client_now_ms() - c->last_io > IDLE_CHECK_MS) {
        /* Notice a GOAWAY or a close that arrived while the connection sat idle. (A busy
         * connection skips the syscall: a stream the server refused is retried anyway.) */
        if (conn_read(c, 0) < 0)
            conn_fail(c, "%s", c->error);
        else if (!nghttp2_session_check_request_allowed(c->session) ||
                 nghttp2_session_get_next_stream_id(c->session) > (1u << 31) - 16) {
            if (c->calls != NULL) {
                set_err(err, errlen, "%s:%d is closing this connection and calls are still open on it", c->host,
                        c->port);
                return OI_GRPC_CLIENT_ERROR;
            }
            conn_fail(c, "%s:%d closed the connection", c->host, c->port);
        }
    }
    if (c->session != NULL)
        return 0;
    int rc = connect_to(c, deadline, err, errlen);
    if (rc != 0)
        return rc;
    if (session_open(c) != 0) {
        oi_ctls_free(c->tls);
        c->tls = NULL;
        close(c->fd);
        c->fd = -1;
        set_err(err, errlen, "out of memory");
        return OI_GRPC_CLIENT_ERROR;
    }
    c->last_io = oi_client_now_ms();
    return 0;
}

/* Moves every call on the connection forward until done(arg) holds, the deadline passes
 * (OI_GRPC_CLIENT_TIMEOUT) or, with `nowait`, nothing more is ready (OI_GRPC_CLIENT_AGAIN).
 * Returns 0 when done, OI_GRPC_CLIENT_ERROR when the connection failed (message in err). */
static int pump(oi_grpc_client_t *c, int64_t deadline, int nowait, int (*done)(void *), void *arg, char *err,
                size_t errlen)
{
    int tried = 0;
    for (;;) {
        if (c->session == NULL) {
            if (done(arg))
                return 0;
            set_err(err, errlen, "%s", c->error);
            return OI_GRPC_CLIENT_ERROR;
        }
        int rc = nghttp2_session_want_write(c->session) ? nghttp2_session_send(c->session) : 0;
        if (rc != 0) {
            conn_fail(c, c->cb_failed ? "out of memory sending to %s:%d" : "HTTP/2 error sending to %s:%d: %s", c->host,
                      c->port, nghttp2_strerror(rc));
            continue;
        }
        if (batch_pending(c) && batch_write(c) != 0) {
            conn_fail(c, "sending to %s:%d: %s", c->host, c->port, strerror(errno));
            continue;
        }
        if (done(arg))
            return 0;
        if (!batch_pending(c) && !nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session)) {
            conn_fail(c, "%s:%d closed the connection (GOAWAY)", c->host, c->port);
            continue;
        }
        if (!nowait && !batch_pending(c)) {
            /* Nothing to write: wait in recv itself, a slice at a time (SO_RCVTIMEO) when
             * there is a deadline or Ctrl-C to look at between slices. */
            if (oi_client_recv_slice(c->fd, deadline, &c->rcvtimeo_ms) != 0)
                return OI_GRPC_CLIENT_TIMEOUT;
            ssize_t n = conn_read(c, 1);
            if (n < 0)
                conn_fail(c, "%s", c->error);
            else if (n == 0 && oi_client_interrupted())
                conn_fail(c, "interrupted");
            continue;
        }
        short events = POLLIN | (batch_pending(c) ? POLLOUT : 0);
        int ms = -1;
        if (nowait) {
            if (tried)
                return OI_GRPC_CLIENT_AGAIN;
            tried = 1;
            ms = 0;
        } else if (deadline > 0) {
            int64_t left = deadline - oi_client_now_ms();
            if (left <= 0)
                return OI_GRPC_CLIENT_TIMEOUT;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd p = {c->fd, events, 0};
        int slice = oi_client_poll_ms(ms);
        /* Records already read from the socket are not announced by it again. */
        int buffered = oi_ctls_buffered(c->tls);
        int n = poll(&p, 1, buffered ? 0 : slice);
        if (buffered) {
            n = 1;
            p.revents |= POLLIN;
        }
        if ((n < 0 && errno != EINTR) || (n <= 0 && slice != ms && oi_client_interrupted())) {
            conn_fail(c, "waiting on %s:%d: %s", c->host, c->port, strerror(errno));
            continue;
        }
        if (n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) && conn_read(c, 0) < 0)
            conn_fail(c, "%s", c->error);
    }
}

/* ---- calls ------------------------------------------------------------------------------ */

oi_grpc_client_t *oi_grpc_client_new(const char *host, int port)
{
    oi_grpc_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->rbuf = malloc(READ_BUF_SIZE);
    if (c->rbuf == NULL) {
        free(c);
        return NULL;
    }
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = port;
    if (host[0] == '/') /* a Unix socket: the authority gRPC uses there */
        snprintf(c->authority, sizeof(c->authority), "localhost");
    else if (strchr(host, ':') != NULL)
        snprintf(c->authority, sizeof(c->authority), "[%s]:%d", host, port);
    else
        snprintf(c->authority, sizeof(c->authority), "%s:%d", host, port);
    c->fd = -1;
    return c;
}

int oi_grpc_client_set_tls(oi_grpc_client_t *c, const oi_ctls_config_t *cfg)
{
    oi_ctls_config_t copy = *cfg;
    copy.alpn = "h2";
    oi_ctls_config_t *n = oi_ctls_config_copy(&copy);
    if (n == NULL)
        return -1;
    oi_ctls_config_free(c->tls_cfg);
    c->tls_cfg = n;
    return 0;
}

void oi_grpc_client_free(oi_grpc_client_t *c)
{
    if (c == NULL)
        return;
    conn_fail(c, "the connection was closed");
    oi_ctls_config_free(c->tls_cfg);
    oi_sbuf_free(&c->wbuf);
    free(c->segs);
    free(c->rbuf);
    free(c);
}

oi_grpc_client_call_t *oi_grpc_client_call_start(oi_grpc_client_t *c, const char *method, int64_t timeout_ms, int *rc,
                                                 char *err, size_t errlen)
{
    int64_t deadline = timeout_ms > 0 ? oi_client_now_ms() + timeout_ms : 0;
    oi_grpc_client_call_t *call = calloc(1, sizeof(*call));
    if (call == NULL || (call->method = strdup(method)) == NULL) {
        free(call);
        *rc = OI_GRPC_CLIENT_ERROR;
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    call->c = c;
    call->deadline = deadline;
    call->hdr_status = -1;
    call->status = -1;
    if ((*rc = conn_ready(c, deadline, err, errlen)) != 0) {
        oi_grpc_client_call_free(call);
        return NULL;
    }
    return call;
}

/* Submits the request headers; the data provider then sends the queued messages. */
static int call_submit(oi_grpc_client_call_t *call, char *err, size_t errlen)
{
    oi_grpc_client_t *c = call->c;
    if (c->session == NULL) {
        set_err(err, errlen, "%s", c->error[0] ? c->error : "not connected");
        return OI_GRPC_CLIENT_ERROR;
    }
    nghttp2_nv nv[8];
    size_t n = 0;
#define NV(k, v, vl) nv[n++] = (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), sizeof(k) - 1, (vl), NGHTTP2_NV_FLAG_NONE}
    NV(":method", "POST", 4);
    NV(":scheme", "http", 4);
    NV(":path", call->method, strlen(call->method));
    NV(":authority", c->authority, strlen(c->authority));
    NV("content-type", "application/grpc", 16);
    NV("te", "trailers", 8);
    NV("user-agent", "openinfer-grpc-c", 16);
    char tmo[24];
    if (call->deadline > 0) {
        int64_t left = call->deadline - oi_client_now_ms();
        if (left <= 0) {
            set_err(err, errlen, "timed out before the call to %s:%d started", c->host, c->port);
            return OI_GRPC_CLIENT_TIMEOUT;
        }
        /* grpc-timeout takes at most 8 digits: seconds beyond that. */
        int k = left <= 99999999
                    ? snprintf(tmo, sizeof(tmo), "%lldm", (long long)left)
                    : snprintf(tmo, sizeof(tmo), "%lldS", (long long)(left / 1000 > 99999999 ? 99999999 : left / 1000));
        NV("grpc-timeout", tmo, (size_t)k);
    }
#undef NV
    nghttp2_data_provider prd = {.source.ptr = call, .read_callback = read_data};
    int32_t id = nghttp2_submit_request(c->session, NULL, nv, n, &prd, call);
    if (id < 0) {
        set_err(err, errlen, "cannot start a stream to %s:%d: %s", c->host, c->port, nghttp2_strerror(id));
        return OI_GRPC_CLIENT_ERROR;
    }
    call->stream_id = id;
    call->submitted = 1;
    call->linked = 1;
    call->next = c->calls;
    if (c->calls)
        c->calls->prev = call;
    c->calls = call;
    return 0;
}

/* The call's deadline passed: cancel the stream, and close the connection if bytes of the
 * caller's memory are still queued for the socket (they must not outlive the call). */
static int call_timed_out(oi_grpc_client_call_t *call, char *err, size_t errlen)
{
    oi_grpc_client_t *c = call->c;
    call_end(call, OI_GRPC_DEADLINE_EXCEEDED, "timed out");
    out_clear(call);
    if (call->linked) {
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
        unlink_call(call);
    }
    if (c->session != NULL && nghttp2_session_send(c->session) != 0)
        conn_fail(c, "HTTP/2 error sending to %s:%d", c->host, c->port);
    if (c->session != NULL && batch_pending(c) && batch_write(c) != 0)
        conn_fail(c, "sending to %s:%d: %s", c->host, c->port, strerror(errno));
    if (c->session != NULL && c->borrowed > 0)
        conn_fail(c, "a request to %s:%d timed out while being sent", c->host, c->port);
    set_err(err, errlen, "timed out waiting for %s:%d", c->host, c->port);
    return OI_GRPC_CLIENT_TIMEOUT;
}

static int sent_all(void *arg)
{
    oi_grpc_client_call_t *call = arg;
    oi_grpc_client_t *c = call->c;
    if (batch_pending(c))
        return 0;
    return call->ended || !call->linked || (call->out_head == NULL && (!call->end_queued || call->end_sent));
}

static int call_send(oi_grpc_client_call_t *call, const struct iovec *parts, int nparts, int has_msg, int last,
                     char *err, size_t errlen)
{
    oi_grpc_client_t *c = call->c;
    if (call->failed) {
        set_err(err, errlen, "%s", call->error);
        return OI_GRPC_CLIENT_ERROR;
    }
    if (call->ended || call->end_queued)
        return OI_GRPC_CLIENT_ENDED;
    if (has_msg) {
        uint64_t total = 0;
        for (int i = 0; i < nparts; i++)
            total += parts[i].iov_len;
        if (total > UINT32_MAX) {
            set_err(err, errlen, "a request message of %llu bytes is over gRPC's 4 GiB limit",
                    (unsigned long long)total);
            return OI_GRPC_CLIENT_ERROR;
        }
        out_msg_t *m = malloc(sizeof(*m) + (size_t)(nparts + 1) * sizeof(struct iovec));
        if (m == NULL) {
            set_err(err, errlen, "out of memory");
            return OI_GRPC_CLIENT_ERROR;
        }
        m->next = NULL;
        m->idx = m->off = 0;
        oi_grpc_put_prefix(m->prefix, (uint32_t)total);
        m->parts[0] = (struct iovec){m->prefix, 5};
        size_t k = 1;
        for (int i = 0; i < nparts; i++)
            if (parts[i].iov_len > 0)
                m->parts[k++] = parts[i];
        m->nparts = k;
        if (call->out_tail)
            call->out_tail->next = m;
        else
            call->out_head = m;
        call->out_tail = m;
        call->out_bytes += 5 + total;
    }
    call->end_queued = last;
    int rc = 0;
    if (!call->submitted)
        rc = call_submit(call, err, errlen);
    else if (call->linked)
        nghttp2_session_resume_data(c->session, call->stream_id);
    if (rc == 0)
        rc = pump(c, call->deadline, 0, sent_all, call, err, errlen);
    if (rc == OI_GRPC_CLIENT_TIMEOUT)
        return call_timed_out(call, err, errlen);
    int complete = call->out_head == NULL && (!last || call->end_sent);
    if (!complete) {
        /* The stream ended (or the connection failed) before the message went: nothing may
         * point at the caller's memory once we return. */
        out_clear(call);
        if (call->linked) {
            nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
            unlink_call(call);
        }
    }
    if (rc == OI_GRPC_CLIENT_ERROR && !call->ended) {
        call->failed = 1;
        set_err(call->error, sizeof(call->error), "%s", err);
    }
    if (call->failed) {
        set_err(err, errlen, "%s", call->error);
        return OI_GRPC_CLIENT_ERROR;
    }
    return complete ? 0 : OI_GRPC_CLIENT_ENDED;
}

int oi_grpc_client_call_send(oi_grpc_client_call_t *call, const struct iovec *parts, int nparts, int last, char *err,
                             size_t errlen)
{
    return call_send(call, parts, nparts, 1, last, err, errlen);
}

int oi_grpc_client_call_close_send(oi_grpc_client_call_t *call, char *err, size_t errlen)
{
    return call_send(call, NULL, 0, 0, 1, err, errlen);
}

static int has_news(void *arg)
{
    oi_grpc_client_call_t *call = arg;
    return call->in_len > 0 || call->ended || call->failed;
}

int oi_grpc_client_call_recv(oi_grpc_client_call_t *call, int nowait, oi_buf_t **msg, char *err, size_t errlen)
{
    oi_grpc_client_t *c = call->c;
    *msg = NULL;
    if (!call->submitted && !call->ended && !call->failed) {
        int rc = call_submit(call, err, errlen);
        if (rc != 0)
            return rc == OI_GRPC_CLIENT_TIMEOUT ? call_timed_out(call, err, errlen) : rc;
    }
    int rc = has_news(call) ? 0 : pump(c, call->deadline, nowait, has_news, call, err, errlen);
    if ((*msg = inbox_pop(call)) != NULL)
        return 0;
    if (rc == OI_GRPC_CLIENT_TIMEOUT)
        return call_timed_out(call, err, errlen);
    if (rc == OI_GRPC_CLIENT_AGAIN)
        return rc;
    if (call->ended)
        return OI_GRPC_CLIENT_ENDED;
    if (rc == OI_GRPC_CLIENT_ERROR) {
        call->failed = 1;
        set_err(call->error, sizeof(call->error), "%s", err);
    }
    set_err(err, errlen, "%s", call->error);
    return OI_GRPC_CLIENT_ERROR;
}

int oi_grpc_client_call_status(const oi_grpc_client_call_t *call, const char **message)
{
    *message = call->ended && call->message ? call->message : "";
    return call->ended ? call->status : -1;
}

void oi_grpc_client_call_free(oi_grpc_client_call_t *call)
{
    if (call == NULL)
        return;
    oi_grpc_client_t *c = call->c;
    out_clear(call);
    if (call->linked) {
        /* Still open: tell the server to stop, sent now if the socket takes it, else with the
         * connection's next writes. */
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
        unlink_call(call);
        if (nghttp2_session_send(c->session) != 0)
            conn_fail(c, "HTTP/2 error sending to %s:%d", c->host, c->port);
        else if (batch_pending(c) && batch_write(c) != 0)
            conn_fail(c, "sending to %s:%d: %s", c->host, c->port, strerror(errno));
    }
    while (call->in_len > 0)
        oi_buf_unref(inbox_pop(call));
    free(call->inbox);
    oi_buf_unref(call->msg);
    free(call->hdr_message);
    free(call->message);
    free(call->method);
    free(call);
}

int oi_grpc_client_unary(oi_grpc_client_t *c, const char *method, const struct iovec *parts, int nparts,
                         int64_t timeout_ms, oi_buf_t **response, int *grpc_status, char **message, char *err,
                         size_t errlen)
{
    *response = NULL;
    *message = NULL;
    int rc = OI_GRPC_CLIENT_ERROR;
    for (int attempt = 0; attempt < 2; attempt++) {
        int reused = c->session != NULL && c->reused;
        oi_grpc_client_call_t *call = oi_grpc_client_call_start(c, method, timeout_ms, &rc, err, errlen);
        if (call == NULL)
            return rc;
        rc = oi_grpc_client_call_send(call, parts, nparts, 1, err, errlen);
        oi_buf_t *msg = NULL;
        int extra_msg = 0;
        if (rc == 0 || rc == OI_GRPC_CLIENT_ENDED) {
            rc = oi_grpc_client_call_recv(call, 0, &msg, err, errlen);
            if (rc == 0) { /* then the trailers */
                oi_buf_t *extra = NULL;
                while ((rc = oi_grpc_client_call_recv(call, 0, &extra, err, errlen)) == 0) {
                    oi_buf_unref(extra);
                    extra_msg = 1;
                }
            }
        }
        /* Refused before any answer by a connection that was going away: once more. */
        int refused = !call->got_headers &&
                      ((rc == OI_GRPC_CLIENT_ERROR && reused) ||
                       (rc == OI_GRPC_CLIENT_ENDED && call->reset && call->rst_code == NGHTTP2_REFUSED_STREAM));
        if (rc == OI_GRPC_CLIENT_ENDED) {
            const char *m;
            *grpc_status = oi_grpc_client_call_status(call, &m);
            if (*grpc_status == OI_GRPC_OK && (msg == NULL || extra_msg)) {
                *grpc_status = OI_GRPC_INTERNAL;
                m = msg == NULL ? "the server ended a unary call without a response message"
                                : "the server sent more than one message for a unary call";
            }
            if (m[0] && (*message = strdup(m)) == NULL) {
                rc = OI_GRPC_CLIENT_ERROR;
                set_err(err, errlen, "out of memory");
            }
            if (*grpc_status == OI_GRPC_OK) {
                *response = msg;
                msg = NULL;
                c->reused = 1;
            }
            if (rc == OI_GRPC_CLIENT_ENDED)
                rc = 0;
        }
        oi_buf_unref(msg);
        oi_grpc_client_call_free(call);
        if (!(refused && attempt == 0))
            break;
        free(*message);
        *message = NULL;
        if (c->calls == NULL && c->session != NULL)
            conn_fail(c, "%s:%d refused a stream", c->host, c->port);
    }
    return rc;
}
