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

void oi__h2_conn_close(h2_conn_t *c)
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
        oi__h2_call_detach(c->calls);
    nghttp2_session_del(c->session);
    c->session = NULL;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close(&c->sock.handle, on_handle_closed);
    oi_tls_close(c->tls);
}

/* Sends GOAWAY and lets the connection close once it is written: the client may reconnect. */
static void conn_goaway(h2_conn_t *c)
{
    if (c->closing || c->goaway)
        return;
    c->goaway = 1;
    nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->session),
                          NGHTTP2_NO_ERROR, NULL, 0);
    oi__h2_conn_flush(c);
}

void oi__h2_on_conn_timer(uv_timer_t *t)
{
    h2_conn_t *c = t->data;
    if (c->closing)
        return;
    if (!c->got_preface) {
        oi__h2_conn_close(c); /* never spoke HTTP/2: nothing to say goodbye to */
        return;
    }
    if (c->calls == NULL) {
        conn_goaway(c);
        if (!c->closing) {
            c->close_after_write = 1;
            if (c->writes == 0)
                oi__h2_conn_close(c);
        }
        return;
    }
    oi__h2_check_rates(c);
    if (!c->closing)
        oi__h2_conn_flush(c); /* the trailers of the calls it ended */
}

/* No stream is open: the idle deadline runs (once the preface is in; before, the preface
 * deadline set at accept keeps running). */
void oi__h2_conn_idle(h2_conn_t *c)
{
    if (!c->got_preface)
        return;
    c->idle_since = uv_now(&c->lp->loop->uv);
    uint64_t ms = c->lp->server->cfg.idle_timeout_ms;
    if (ms > 0)
        uv_timer_start(&c->timer, oi__h2_on_conn_timer, ms, 0);
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
        oi__h2_conn_close(c);
    else if (!c->closing && c->writes == 0 && !nghttp2_session_want_read(c->session) &&
             !nghttp2_session_want_write(c->session))
        oi__h2_conn_close(c); /* GOAWAY exchanged and every stream done */
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
        oi__h2_conn_close(c);
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
    int rc = oi_tls_send(c->tls, &c->sock.stream, &wr->w, bufs, (unsigned)n, after_write);
    if (bufs != stackbufs)
        free(bufs);
    if (rc != 0)
        after_write(&wr->w, rc == 1 ? 0 : rc);
}

/* Hands a call's held messages to the handler in order, while the connection is not
 * throttled and no message of the call is being inflated; once none is left, gives their bytes
 * back to the client's window and delivers a held END_STREAM. Runs with in_recv set. */
void oi__h2_call_drain(h2_conn_t *c, oi_grpc_call_t *call)
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
        oi__h2_deliver(c, call, m, compressed);
    }
    if (!oi_grpc_call_open(call))
        oi__h2_drop_held(call);
    if (call->held_head == NULL && !call->inflating && call->conn != NULL) {
        if (call->unconsumed > 0)
            nghttp2_session_consume(c->session, call->stream_id, call->unconsumed);
        call->unconsumed = 0;
        if (call->half_close_held) {
            call->half_close_held = 0;
            oi__h2_half_close(c, call);
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
        oi__h2_call_drain(c, call);
    c->in_recv = 0;
}

void oi__h2_conn_flush(h2_conn_t *c)
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
        oi__h2_conn_close(c);
    else if (c->writes == 0 && !nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session))
        oi__h2_conn_close(c);
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
        oi__h2_conn_close(c); /* EOF or reset: calls in flight are cut, their answers dropped */
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
        oi_tls_read_stop(c->tls, st);
        c->close_after_write = 1;
        if (c->writes == 0)
            oi__h2_conn_close(c);
        return;
    }
    oi__h2_conn_flush(c);
}

/* The socket's callbacks: through the connection's TLS when it has one. */
static void on_sock_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    h2_conn_t *c = h->data;
    if (c->tls != NULL)
        oi_tls_on_alloc(c->tls, buf);
    else
        on_alloc(h, suggested, buf);
}

static void on_sock_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    h2_conn_t *c = st->data;
    if (c->tls != NULL)
        oi_tls_on_read(c->tls, nread);
    else
        on_read(st, nread, buf);
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
    nghttp2_session_callbacks_set_send_callback(cb, oi__h2_on_send);
    nghttp2_session_callbacks_set_send_data_callback(cb, oi__h2_on_send_data);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, oi__h2_on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, oi__h2_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, oi__h2_on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, oi__h2_on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, oi__h2_on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, oi__h2_on_stream_close);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, data_length);
    /* Window updates are ours to give (nghttp2_session_consume): a client that does not read
     * its responses is not granted room for more requests (see max_queued_bytes). */
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return -1;
    }
    nghttp2_option_set_no_auto_window_update(opt, 1);
#if NGHTTP2_VERSION_NUM >= 0x013200
    /* A header value with leading or trailing whitespace is taken, as gRPC C++ (Triton's
     * front) takes it, not refused by nghttp2's RFC 9113 check (option since 1.50). */
    nghttp2_option_set_no_rfc9113_leading_and_trailing_ws_validation(opt, 1);
#endif
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
    oi__h2_conn_close(victim);
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
        uv_timer_start(&c->timer, oi__h2_on_conn_timer, s->cfg.preface_timeout_ms, 0);
    if (c->sock.handle.type == UV_TCP)
        uv_tcp_nodelay(&c->sock.tcp, 1);
    if (oi_tls_read_start(c->tls, &c->sock.stream, on_sock_alloc, on_sock_read) != 0) {
        oi__h2_conn_close(c);
        return;
    }
    oi__h2_conn_flush(c); /* our SETTINGS and connection WINDOW_UPDATE go first */
}

/* A connection that has its socket: admitted (or closed) and started. */
static void conn_accepted(h2_conn_t *c)
{
    oi_h2_server_t *s = c->lp->server;
    if (admit_peer(c) != 0 || conn_init_session(c) != 0) {
        oi__h2_conn_close(c);
        return;
    }
    if (atomic_load(&s->connections) > s->cfg.max_connections) {
        /* Full: an idle connection gives way to the new one (see oldest_idle), else one that
         * only trickles request bytes in. */
        h2_conn_t *victim = oldest_idle(c->lp, c, NULL);
        if (victim == NULL)
            victim = slowest_receiving(c->lp, c);
        if (victim == NULL) {
            oi__h2_conn_close(c);
            return;
        }
        oi__h2_conn_close(victim);
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
        oi__h2_conn_close(c);
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
        oi__h2_conn_close(c);
        return;
    }
    oi_tls_ctx_t *tls = c->lp->server->cfg.tls;
    if (tls != NULL && (c->tls = oi_tls_new(tls, &c->lp->loop->uv, &c->sock.stream, on_alloc, on_read)) == NULL) {
        oi__h2_conn_close(c);
        return;
    }
    conn_accepted(c);
}

int oi_h2_server_adopt(oi_h2_server_t *s, int fd)
{
    h2_conn_t *c = conn_new(&s->loops[0], 0);
    if (c == NULL)
        return UV_ENOMEM;
    oi_tls_ctx_t *tls = s->cfg.tls;
    if (tls != NULL && (c->tls = oi_tls_new(tls, &s->loops[0].loop->uv, &c->sock.stream, on_alloc, on_read)) == NULL) {
        oi__h2_conn_close(c);
        return UV_ENOMEM;
    }
    int rc = conn_init_session(c) != 0 ? UV_ENOMEM : uv_tcp_open(&c->sock.tcp, fd);
    if (rc != 0) {
        oi__h2_conn_close(c); /* the socket stays the caller's */
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
    s->cfg.tls = oi_tls_ctx_ref(cfg->tls);
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
        oi__h2_conn_close(lp->conns);
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
                    oi__h2_call_gone(c->lp->server, call);
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
            oi__h2_conn_flush(c);
            if (!c->closing) {
                c->close_after_write = 1;
                if (c->writes == 0)
                    oi__h2_conn_close(c);
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
    oi_tls_ctx_unref(s->cfg.tls);
    free(s);
}
