#include "transport/http2.h"
#include "transport/http2_internal.h"

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

/* ---- calls ------------------------------------------------------------------------------ */

static void out_msg_free(out_msg_t *m)
{
    for (size_t i = m->idx; i < m->nparts; i++)
        oi_buf_unref(m->parts[i].owner);
    free(m);
}

void oi_grpc_call_ref(oi_grpc_call_t *call) { call->refs++; }

void oi__h2_drop_held(oi_grpc_call_t *call)
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
    oi__h2_drop_held(call);
    while (call->out_head) {
        out_msg_t *m = call->out_head;
        call->out_head = m->next;
        out_msg_free(m);
    }
    oi_buf_unref(call->msg);
    free(call->path);
    free(call->status_message);
    for (int i = 0; i < OI_HTTP_MAX_CAPTURED; i++)
        free(call->captured[i]);
    free(call->forward_refused);
    oi_sbuf_free(&call->forwarded);
    free(call);
}

const char *oi_grpc_call_header(const oi_grpc_call_t *call, int i, size_t *len)
{
    if (i < 0 || i >= OI_HTTP_MAX_CAPTURED || call->captured[i] == NULL)
        return NULL;
    *len = call->captured_len[i];
    return call->captured[i];
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
void oi__h2_call_gone(oi_h2_server_t *s, oi_grpc_call_t *call)
{
    if (call->gone_told)
        return;
    call->gone_told = 1;
    if (s->handler.on_gone != NULL)
        s->handler.on_gone(s->ctx, call);
}

/* The stream is gone (closed, reset, or its connection died): no more I/O for this call. */
void oi__h2_call_detach(oi_grpc_call_t *call)
{
    h2_conn_t *c = call->conn;
    if (c == NULL)
        return;
    if (!call->finished) /* cut before the handler answered */
        oi__h2_call_gone(c->lp->server, call);
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
    oi__h2_drop_held(call);
    if (c->session) {
        if (call->unconsumed > 0)
            nghttp2_session_consume_connection(c->session, call->unconsumed);
        nghttp2_session_set_stream_user_data(c->session, call->stream_id, NULL);
    }
    call->unconsumed = 0;
    oi_grpc_call_unref(call); /* the stream's reference */
    if (c->calls == NULL && !c->closing)
        oi__h2_conn_idle(c);
}

oi_grpc_call_t *oi__h2_call_of(nghttp2_session *session, int32_t stream_id)
{
    return nghttp2_session_get_stream_user_data(session, stream_id);
}

/* Sends what the call or the transport queued, unless nghttp2 is reading (then the caller of
 * mem_recv sends when it returns). */
static void call_kick(oi_grpc_call_t *call)
{
    h2_conn_t *c = call->conn;
    if (c != NULL && !c->in_recv)
        oi__h2_conn_flush(c);
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
ssize_t oi__h2_on_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags, void *user_data)
{
    (void)session, (void)flags;
    h2_conn_t *c = user_data;
    return push_inline(c, data, length) == 0 ? (ssize_t)length : NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* A DATA frame: its 9-byte header copied, its payload referenced from the queued parts. */
int oi__h2_on_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
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
const char *oi__h2_encoding_name(int enc)
{
    return enc == OI_ENCODING_GZIP ? "gzip" : "deflate";
}


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
            const char *e = oi__h2_encoding_name(call->response_encoding);
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
void oi__h2_submit_headers_only(oi_grpc_call_t *call, const char *http_status, int grpc_status, const char *message)
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
        oi__h2_submit_headers_only(call, "200", grpc_status, message);
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
