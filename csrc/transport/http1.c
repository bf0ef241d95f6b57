#include "transport/http1.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <llhttp.h>

#include "core/cpus.h"
#include "transport/hdr_forward.h"
#include "transport/peers.h"
#include "transport/tcp_listen.h"
#include "transport/tls.h"
#include "transport/unix_listen.h"

#define READ_BUF_SIZE 16384
#define CHUNKED_INITIAL 65536
/* Stop parsing pipelined requests while this much response data waits for the socket. */
#define MAX_QUEUED_WRITE (8u << 20)
/* Stop reading a connection while this much pipelined input waits behind a busy request. */
#define MAX_PENDING (1u << 20)
/* The most non-empty chunks of a chunked request body: tritonserver's kMaxChunkedChunks. */
#define MAX_CHUNKS 65536u

typedef struct listener_s {
    oi_tcp_listener_t tcp;
    uv_pipe_t pipe; /* the Unix-domain listener, with cfg.unix_path */
    oi_loop_t loop;
    oi_http_server_t *server;
    int pipe_listening;           /* pipe is open */
    struct oi_http_conn_s *conns; /* every open connection of this loop, for shutdown */
} listener_t;

struct oi_http_server_s {
    oi_http_config_t cfg;
    char host[256];
    char unix_path[108];
    oi_unix_socket_t unix_sock; /* the socket file we created, removed when we stop accepting */
    oi_http_handler_cb handler;
    void *ctx;
    int nloops;
    listener_t *loops;
    int port;
    atomic_int inflight;
    atomic_int orphans; /* of those, requests whose connection has closed */
    atomic_int connections;
    oi_peers_t peers; /* connections per client address, across the loops */
};

struct oi_http_conn_s {
    union { /* a TCP or a Unix-domain connection: both are libuv streams */
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_stream_t stream;
        uv_handle_t handle;
    } sock;
    uv_timer_t timer;
    oi_tls_t *tls;     /* the connection's TLS, or NULL for plain text */
    uint64_t deadline; /* on the loop's clock (ms), when the current timeout ends; 0: none */
    llhttp_t parser;
    listener_t *lis;
    oi_http_conn_t *prev, *next; /* listener's list */
    oi_http_request_t req;
    oi_peer_addr_t peer;
    int peer_counted;    /* holds one count in the server's peer table */
    uint64_t idle_since; /* uv_now when the connection last became idle, for eviction */

    /* The request being read. */
    oi_sbuf_t url;
    oi_sbuf_t hfield;
    oi_sbuf_t hvalue;
    oi_sbuf_t nv_request; /* the NV-InferRequest header's value (the legacy v1 API), NUL-terminated */
    oi_sbuf_t captured;   /* the values of cfg.capture_headers, back to back */
    size_t captured_off[OI_HTTP_MAX_CAPTURED], captured_len[OI_HTTP_MAX_CAPTURED];
    unsigned captured_have; /* bit i: captured_off/len[i] hold header i's value */
    oi_sbuf_t forwarded;  /* the headers forwarded as request parameters (req.forwarded) */
    size_t header_bytes;
    const char *feed_start; /* the bytes llhttp_execute is parsing begin here (looking back for folds) */
    char parsed_last;       /* the last byte, not SP or HTAB, parsed before feed_start */
    uint64_t start_ns; /* uv_hrtime of the first byte, with cfg.on_answered only */
    uint64_t msg_start;  /* uv_now when the request's first byte came: its rate, for eviction */
    uint64_t body_start; /* uv_now when its headers were done: the body's minimum rate runs from here */
    uint32_t chunks;     /* non-empty chunks of a chunked body so far */
    int in_message;
    int in_body; /* headers done, body bytes expected: reads push the body deadline back */
    int expect_continue;
    int body_direct; /* Content-Length known: socket reads land in the body buffer */
    oi_buf_t *body;
    int error_status; /* set by a callback that rejects the request */
    const char *error_message;
    char error_text[256]; /* a message made for this connection (error_message may point here) */

    /* Unparsed bytes that arrived behind a request still being answered. */
    oi_sbuf_t pending;
    char rbuf[READ_BUF_SIZE];

    int busy;      /* a request is with the handler */
    int streaming; /* its answer is being streamed (oi_http_stream_start) */
    int stream_status;
    uint64_t stream_bytes;
    int abandoned; /* answered by oi_http_server_abandon: the handler's answer is dropped */
    int orphaned;  /* closed while a request was with the handler: counted in `orphans` */
    int served;    /* a request was read in full: from now on the idle timeout applies */
    int reading;   /* uv_read_start is in effect */
    int in_feed;   /* llhttp_execute is on the stack */
    int keep_alive;
    int http10;
    int head; /* the request being answered is HEAD: headers only, no body bytes */
    int closing;
    int close_after_write;
    int handles; /* open libuv handles (tcp, timer) */
    size_t writes;
    oi_peer_t *creds; /* the client's credentials, once a request asked (oi_http_request_peer) */
};

typedef struct write_req_s {
    uv_write_t w;
    oi_http_conn_t *conn;
    size_t nparts;
    oi_iov_t *parts;
    char head[];
} write_req_t;

static const llhttp_settings_t parser_settings;
static void pump(oi_http_conn_t *c);

/* ---- connection lifetime ---------------------------------------------------------------- */

static void conn_maybe_free(oi_http_conn_t *c)
{
    if (c->handles > 0 || c->busy || c->writes > 0)
        return;
    oi_buf_unref(c->body);
    oi_buf_unref(c->req.body);
    oi_sbuf_free(&c->url);
    oi_sbuf_free(&c->hfield);
    oi_sbuf_free(&c->hvalue);
    oi_sbuf_free(&c->nv_request);
    oi_sbuf_free(&c->captured);
    oi_sbuf_free(&c->forwarded);
    oi_sbuf_free(&c->pending);
    if (c->peer_counted)
        oi_peers_release(&c->lis->server->peers, &c->peer);
    free(c->creds);
    oi_tcp_listener_count(&c->lis->tcp, -1);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    oi_http_conn_t *c = h->data;
    c->handles--;
    conn_maybe_free(c);
}

static void conn_close(oi_http_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    /* Out of the table now, not once its handles are closed: a connection accepted in the
     * same turn of the loop as closes (many clients leaving at once) must not find it full
     * of connections that are only waiting to be freed, none of which can make room. */
    atomic_fetch_sub(&c->lis->server->connections, 1);
    listener_t *lis = c->lis;
    if (c->prev)
        c->prev->next = c->next;
    else
        lis->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close(&c->sock.handle, on_handle_closed);
    oi_tls_close(c->tls);
    /* The client of a request still with the handler is gone: the handler may drop it. */
    void (*gone)(oi_http_request_t *) = c->req.on_gone;
    c->req.on_gone = NULL;
    if (c->busy && !c->abandoned) {
        c->orphaned = 1;
        atomic_fetch_add(&lis->server->orphans, 1);
        if (gone != NULL)
            gone(&c->req);
    }
}

/* ---- writing ------------------------------------------------------------------------------ */

static void after_write(uv_write_t *w, int status)
{
    write_req_t *wr = (write_req_t *)w;
    oi_http_conn_t *c = wr->conn;
    for (size_t i = 0; i < wr->nparts; i++)
        oi_buf_unref(wr->parts[i].owner);
    free(wr);
    c->writes--;
    if (status < 0 || (c->close_after_write && c->writes == 0))
        conn_close(c);
    else if (c->pending.len > 0 && c->writes == 0)
        pump(c);
    conn_maybe_free(c);
}

/* Sends `bufs` (the bytes of `wr`), then releases `wr` through after_write: at once when the
 * socket takes everything, as nearly every answer is. Synchronous completion is safe where this
 * is called: a request in flight or a feed in progress keeps after_write from pumping. */
static void conn_send(oi_http_conn_t *c, write_req_t *wr, uv_buf_t *bufs, unsigned nb)
{
    c->writes++;
    int rc = oi_tls_send(c->tls, &c->sock.stream, &wr->w, bufs, nb, after_write);
    if (rc != 0)
        after_write(&wr->w, rc == 1 ? 0 : rc);
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

static char *put_str(char *w, const char *s, size_t n)
{
    memcpy(w, s, n);
    return w + n;
}

static char *put_decimal(char *w, size_t v)
{
    char tmp[24], *p = tmp + sizeof(tmp);
    do
        *--p = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    return put_str(w, p, (size_t)(tmp + sizeof(tmp) - p));
}

/* Writes the status line and headers into `w` (room for hlen + 160 bytes); returns the length.
 * By hand rather than snprintf: this runs for every response. */
static size_t format_head(char *w, int status, size_t body_len, const char *conn_hdr, const char *headers,
                          size_t hlen)
{
    char *start = w;
    const char *reason = reason_phrase(status);
    w = put_str(w, "HTTP/1.1 ", 9);
    w = put_decimal(w, (size_t)status);
    *w++ = ' ';
    w = put_str(w, reason, strlen(reason));
    w = put_str(w, "\r\nContent-Length: ", 18);
    w = put_decimal(w, body_len);
    w = put_str(w, "\r\n", 2);
    w = put_str(w, conn_hdr, strlen(conn_hdr));
    w = put_str(w, headers, hlen);
    w = put_str(w, "\r\n", 2);
    return (size_t)(w - start);
}

/* Queues a complete response. Takes the parts' owner references. The answer to a HEAD
 * request (`head_only`) gives its body's length and sends no body (RFC 9110, 9.3.2): its
 * client reads none, and would take any bytes sent for the next response. */
static void conn_write(oi_http_conn_t *c, int status, const char *headers, const oi_iov_t *parts,
                       size_t nparts, int head_only)
{
    if (c->closing) {
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
        return;
    }
    size_t body_len = 0;
    for (size_t i = 0; i < nparts; i++)
        body_len += parts[i].len;
    if (head_only) {
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
        nparts = 0;
    }
    size_t hlen = strlen(headers);
    /* Rounded up so that the parts array after the head is aligned for oi_iov_t. */
    size_t head_cap = (hlen + 160 + _Alignof(oi_iov_t) - 1) & ~(_Alignof(oi_iov_t) - 1);
    write_req_t *wr = malloc(sizeof(*wr) + head_cap + nparts * sizeof(oi_iov_t));
    if (wr == NULL) {
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
        conn_close(c);
        return;
    }
    const char *conn_hdr = "";
    if (c->close_after_write)
        conn_hdr = "Connection: close\r\n";
    else if (c->http10)
        conn_hdr = "Connection: keep-alive\r\n";
    size_t n = format_head(wr->head, status, body_len, conn_hdr, headers, hlen);
    wr->conn = c;
    wr->nparts = nparts;
    wr->parts = (oi_iov_t *)(wr->head + head_cap);
    if (nparts) /* a body-less answer may pass no parts at all */
        memcpy(wr->parts, parts, nparts * sizeof(oi_iov_t));

    uv_buf_t stackbufs[8];
    uv_buf_t *bufs = nparts + 1 <= 8 ? stackbufs : malloc((nparts + 1) * sizeof(uv_buf_t));
    if (bufs == NULL) {
        wr->nparts = nparts;
        c->writes++;
        after_write(&wr->w, UV_ENOMEM);
        return;
    }
    bufs[0] = uv_buf_init(wr->head, (unsigned)n);
    unsigned nb = 1;
    /* HEAD: the head says the Content-Length a GET would get; the parts are only released. */
    for (size_t i = 0; i < nparts && !c->head; i++)
        if (parts[i].len > 0)
            bufs[nb++] = uv_buf_init((char *)parts[i].base, (unsigned)parts[i].len);
    conn_send(c, wr, bufs, nb);
    if (bufs != stackbufs)
        free(bufs);
}

/* Answers a request the transport itself rejects (bad framing, limits), then closes. */
static void conn_reject(oi_http_conn_t *c, int status, const char *message)
{
    oi_sbuf_t body = {0};
    /* The message is ours (no quotes or backslashes need escaping beyond this). */
    if (oi_sbuf_printf(&body, "{\"error\":\"%s\"}", message) != 0) {
        conn_close(c);
        return;
    }
    oi_buf_t *b = oi_sbuf_detach(&body);
    c->close_after_write = 1;
    oi_iov_t part = {b ? b->data : "", b ? b->len : 0, b};
    oi_http_server_t *s = c->lis->server;
    if (s->cfg.on_answered != NULL) { /* a request the handler never saw is still one answered */
        char path[256];
        size_t n = c->url.len < sizeof(path) ? c->url.len : sizeof(path) - 1;
        memcpy(path, n ? c->url.data : "", n);
        path[n] = '\0';
        oi_http_request_t r = {.method = n ? (int)llhttp_get_method(&c->parser) : -1, .path = path, .path_len = n};
        oi_http_answer_t a = {.status = status,
                              .start_ns = c->in_message ? c->start_ns : uv_hrtime(),
                              .bytes_in = c->header_bytes,
                              .bytes_out = part.len,
                              .peer = c->peer_counted ? &c->peer : NULL};
        s->cfg.on_answered(s->ctx, &r, &a);
    }
    conn_write(c, status, "Content-Type: application/json\r\n", &part, 1, 0); /* then closes */
}

/* ---- reading ------------------------------------------------------------------------------ */

static void feed(oi_http_conn_t *c, const char *data, size_t len);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void arm_timer(oi_http_conn_t *c, uint64_t ms);
static void arm_body_deadline(oi_http_conn_t *c);
static uint64_t rate_deadline(const oi_http_conn_t *c);
static void on_timer(uv_timer_t *t);

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    oi_http_conn_t *c = h->data;
    if (c->body_direct && c->body != NULL && c->body->len < c->body->cap) {
        size_t room = c->body->cap - c->body->len;
        if (room > (1u << 30))
            room = 1u << 30;
        *buf = uv_buf_init(c->body->data + c->body->len, (unsigned)room);
    } else {
        *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
    }
}

/* The socket's callbacks: through the connection's TLS when it has one. */
static void on_sock_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    oi_http_conn_t *c = h->data;
    if (c->tls != NULL)
        oi_tls_on_alloc(c->tls, buf);
    else
        on_alloc(h, suggested, buf);
}

static void on_sock_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    oi_http_conn_t *c = s->data;
    if (c->tls != NULL)
        oi_tls_on_read(c->tls, nread);
    else
        on_read(s, nread, buf);
}

static void start_reading(oi_http_conn_t *c)
{
    if (c->closing || c->reading)
        return;
    if (oi_tls_read_start(c->tls, &c->sock.stream, on_sock_alloc, on_sock_read) != 0)
        conn_close(c);
    else
        c->reading = 1;
}

static void stop_reading(oi_http_conn_t *c)
{
    if (c->reading)
        oi_tls_read_stop(c->tls, &c->sock.stream);
    c->reading = 0;
}

/* Keeps bytes that arrive while a request is with the handler. Reading goes on (sparing two
 * epoll_ctl calls per request) until MAX_PENDING bytes wait. Returns 0 or -1. */
static int hold_pending(oi_http_conn_t *c, const char *data, size_t len)
{
    if (len > 0 && oi_sbuf_append(&c->pending, data, len) != 0)
        return -1;
    if (c->pending.len > MAX_PENDING)
        stop_reading(c);
    return 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    oi_http_conn_t *c = s->data;
    if (nread < 0) {
        /* EOF or reset: a request in flight is answered into the void and then freed. */
        conn_close(c);
        return;
    }
    if (nread > 0 && c->busy) { /* pipelined: parsed once the request in flight is answered */
        if (hold_pending(c, buf->base, (size_t)nread) != 0)
            conn_close(c);
    } else if (nread > 0) {
        feed(c, buf->base, (size_t)nread);
        if (c->in_body && !c->closing) /* the bytes counted: the body deadline moves */
            arm_body_deadline(c);
    }
}

/* Arms the idle timeout between requests (a request's own deadline starts with its first
 * byte, in on_message_begin, and is not pushed back by later bytes). */
static void finish_or_idle(oi_http_conn_t *c)
{
    /* Until a first request, bytes that begin none (blank lines) leave the first-byte
     * deadline running: they must not buy a silent connection the long idle timeout. */
    if (!c->closing && !c->busy && !c->in_message && c->served) {
        c->idle_since = uv_now(&c->lis->loop.uv);
        arm_timer(c, c->lis->server->cfg.idle_timeout_ms);
    }
}

/* Notes the last byte of data[0, n) that is not SP or HTAB (when there is one), for
 * line_starts_with_space once these bytes are behind the parser. Only for bytes parsed with no
 * message completed: a message's body may be the buffer, and gone with the message. */
static void note_parsed(oi_http_conn_t *c, const char *data, size_t n)
{
    for (const char *p = data + n; p > data; p--)
        if (p[-1] != ' ' && p[-1] != '\t') {
            c->parsed_last = p[-1];
            return;
        }
}

/* Whether only SP and HTAB stand between `at` and the line feed before it: a header line that
 * begins with whitespace. After a header field that is obsolete line folding (RFC 9112, 5.2),
 * which llhttp 8 accepts, appending the line to the value, or misreports (a folded
 * Content-Length is a "Duplicate Content-Length"). */
static int line_starts_with_space(const oi_http_conn_t *c, const char *at)
{
    const char *p = at;
    while (p > c->feed_start && (p[-1] == ' ' || p[-1] == '\t'))
        p--;
    return (p > c->feed_start ? p[-1] : c->parsed_last) == '\n';
}

static const char folded_line[] = "malformed HTTP request: a header line begins with whitespace (obsolete line "
                                  "folding is not accepted, RFC 9112 section 5.2)";

/* The message for a request llhttp refused in the bytes before `end`: ours for a header line
 * that begins with whitespace (after the request line, llhttp's HPE_UNEXPECTED_SPACE; after a
 * header, the parser stopped at that whitespace, the request line read and no body begun),
 * llhttp's reason otherwise. */
static const char *parse_error_message(oi_http_conn_t *c, const char *end, char *buf, size_t cap)
{
    const char *pos = llhttp_get_error_pos(&c->parser);
    if (llhttp_get_errno(&c->parser) == HPE_UNEXPECTED_SPACE ||
        (c->url.len > 0 && !c->in_body && pos != NULL && pos >= c->feed_start && pos < end &&
         (*pos == ' ' || *pos == '\t') && line_starts_with_space(c, pos)))
        return folded_line;
    snprintf(buf, cap, "malformed HTTP request: %s", llhttp_get_error_reason(&c->parser));
    for (char *p = buf; *p; p++)
        if (*p == '"' || *p == '\\')
            *p = '\'';
    return buf;
}

static void feed(oi_http_conn_t *c, const char *data, size_t len)
{
    c->in_feed = 1;
    c->feed_start = data;
    while (!c->closing) {
        llhttp_errno_t err = llhttp_execute(&c->parser, data, len);
        if (err == HPE_OK) {
            note_parsed(c, data, len);
            break;
        }
        if (err == HPE_PAUSED_UPGRADE) {
            /* The request asked to switch protocols (Upgrade or CONNECT). It was answered as
             * plain HTTP (or refused) with Connection: close; what follows belongs to a
             * protocol we do not speak, so it is dropped rather than parsed as requests. */
            stop_reading(c);
            c->keep_alive = 0;
            c->close_after_write = 1;
            if (!c->busy && c->writes == 0)
                conn_close(c);
            break;
        }
        if (err == HPE_PAUSED) {
            size_t used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
            c->parsed_last = '\0'; /* a message ended: the next one looks back no further */
            data += used;
            len -= used;
            if (!c->busy) { /* answered synchronously: go on with the next request */
                llhttp_resume(&c->parser);
                if (len == 0)
                    break;
                continue;
            }
            if (hold_pending(c, data, len) != 0)
                conn_close(c);
            break;
        }
        if (c->error_status) {
            conn_reject(c, c->error_status, c->error_message);
        } else {
            char msg[160];
            conn_reject(c, 400, parse_error_message(c, data + len, msg, sizeof(msg)));
        }
        stop_reading(c);
        break;
    }
    c->in_feed = 0;
    finish_or_idle(c);
}

/* Goes on with the connection once no request is with the handler: parses pipelined bytes
 * that waited, then reads again. Holds back while the client leaves too many responses
 * unread; after_write calls it again as they drain. */
static void pump(oi_http_conn_t *c)
{
    if (c->closing || c->busy || c->in_feed)
        return;
    if (c->pending.len > 0) {
        if (uv_stream_get_write_queue_size(&c->sock.stream) > MAX_QUEUED_WRITE) {
            stop_reading(c);
            return;
        }
        oi_sbuf_t p = c->pending;
        memset(&c->pending, 0, sizeof(c->pending));
        feed(c, p.data, p.len);
        oi_sbuf_free(&p);
        if (c->busy || c->closing)
            return;
    }
    start_reading(c);
}

/* Continues with pipelined bytes once the previous request is answered. */
static void resume_after_response(oi_http_conn_t *c)
{
    if (c->closing)
        return;
    if (!c->keep_alive) {
        c->close_after_write = 1;
        if (c->writes == 0)
            conn_close(c);
        return;
    }
    if (c->in_feed)
        return; /* feed() goes on by itself */
    llhttp_resume(&c->parser);
    pump(c);
    finish_or_idle(c);
}

/* ---- timers ------------------------------------------------------------------------------- */

/* A timeout is a deadline; the timer fires at the earliest one set since it last fired and
 * then looks at the deadline of the moment. A request moves the deadline four times (header,
 * body, none while it is handled, idle), nearly always later: only the first of them
 * touches the loop's timer heap, and a timer that fires early re-arms once. */
static void on_timer(uv_timer_t *t)
{
    oi_http_conn_t *c = t->data;
    if (c->deadline == 0 || c->busy || c->closing)
        return;
    uint64_t now = uv_now(t->loop);
    if (now < c->deadline) {
        uv_timer_start(t, on_timer, c->deadline - now, 0);
        return;
    }
    stop_reading(c); /* nothing more of this request is read: it is answered and closed */
    const oi_http_config_t *cfg = &c->lis->server->cfg;
    if (c->in_body && cfg->body_min_rate > 0 && now >= rate_deadline(c)) {
        snprintf(c->error_text, sizeof(c->error_text),
                 "timed out reading the request: its body arrived slower than the server's body_min_rate of %u "
                 "bytes/s (%zu bytes in %llu ms)",
                 cfg->body_min_rate, c->body ? c->body->len : 0, (unsigned long long)(now - c->body_start));
        conn_reject(c, 408, c->error_text);
    } else if (c->in_message && c->header_bytes + (c->body ? c->body->len : 0) > 0) {
        conn_reject(c, 408, "timed out reading the request");
    } else {
        conn_close(c);
    }
}

/* Sets the deadline to `at` (the loop's clock, ms; a past one fires at once). */
static void arm_at(oi_http_conn_t *c, uint64_t at)
{
    uint64_t now = uv_now(&c->lis->loop.uv), ms = at > now ? at - now : 0;
    c->deadline = at > 0 ? at : 1;
    if (!uv_is_active((uv_handle_t *)&c->timer) || uv_timer_get_due_in(&c->timer) > ms)
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

static void arm_timer(oi_http_conn_t *c, uint64_t ms)
{
    if (ms == 0)
        return;
    arm_at(c, uv_now(&c->lis->loop.uv) + ms);
}

/* When the body falls below the minimum rate: body_timeout_ms past its start, plus a second
 * for every body_min_rate bytes received. */
static uint64_t rate_deadline(const oi_http_conn_t *c)
{
    const oi_http_config_t *cfg = &c->lis->server->cfg;
    uint64_t got = c->body ? c->body->len : 0;
    return c->body_start + cfg->body_timeout_ms + got * 1000 / cfg->body_min_rate;
}

/* The body's deadline after bytes came: body_timeout_ms of silence, or the minimum rate's,
 * whichever is first. Apache's mod_reqtimeout does the same (body=20,MinRate=500); nginx's
 * client_body_timeout bounds only the gaps, which a client that sends a byte a gap defeats. */
static void arm_body_deadline(oi_http_conn_t *c)
{
    const oi_http_config_t *cfg = &c->lis->server->cfg;
    if (cfg->body_timeout_ms == 0)
        return;
    uint64_t at = uv_now(&c->lis->loop.uv) + cfg->body_timeout_ms;
    if (cfg->body_min_rate > 0 && rate_deadline(c) < at)
        at = rate_deadline(c);
    arm_at(c, at);
}

static void disarm_timer(oi_http_conn_t *c) { c->deadline = 0; }

/* ---- llhttp callbacks --------------------------------------------------------------------- */

static oi_http_conn_t *conn_of(llhttp_t *p) { return p->data; }

static int reject_in_parser(oi_http_conn_t *c, int status, const char *message)
{
    c->error_status = status;
    c->error_message = message;
    return -1;
}

void oi_http_input_too_large(char *buf, size_t cap, int64_t header_length, uint64_t n, int more, size_t max)
{
    if (header_length == 0)
        snprintf(buf, cap,
                 "Raw input has a byte_size (%s%" PRIu64 " bytes) that exceeds the maximum allowed value of %zu "
                 "bytes. Use --http-max-input-size to increase the limit.", more ? "at least " : "", n, max);
    else
        snprintf(buf, cap,
                 "request JSON size of %s%" PRIu64 " bytes exceeds the maximum allowed input size of %zu bytes. "
                 "Use --http-max-input-size to increase the limit.", more ? "at least " : "", n, max);
}

/* The most body bytes the request may bring: max_body_bytes (tritonserver's
 * --http-max-input-size), which bounds what is read as JSON or taken whole as one tensor,
 * unless a binary-extension JSON header (Inference-Header-Content-Length > 0) is followed by
 * tensor data: that is bounded by the in-flight body budget alone, so that tritonserver's
 * 2 GB binary payloads are served where memory allows. */
static size_t body_bound(const oi_http_conn_t *c)
{
    return c->req.inference_header_length > 0 ? SIZE_MAX : c->lis->server->cfg.max_body_bytes;
}

/* Refuses, with tritonserver's 400 and words, a request whose JSON (the body, or the header
 * the Inference-Header-Content-Length gives) or raw body is over max_body_bytes: `n` body
 * bytes (`more`: a chunked body still arriving). 0 when within. */
static int check_input_size(oi_http_conn_t *c, uint64_t n, int more)
{
    size_t max = c->lis->server->cfg.max_body_bytes;
    int64_t hlen = c->req.inference_header_length;
    if (hlen > 0 ? (uint64_t)hlen <= max : n <= max)
        return 0;
    oi_http_input_too_large(c->error_text, sizeof(c->error_text), hlen, hlen > 0 ? (uint64_t)hlen : n,
                            hlen <= 0 && more, max);
    return reject_in_parser(c, 400, c->error_text);
}

/* Refuses a body the server's budget has no room for: 503. */
static int reject_over_budget(oi_http_conn_t *c, size_t n)
{
    oi_status_t *st = oi_budget_refusal(c->lis->server->cfg.body_budget, "request body", n);
    snprintf(c->error_text, sizeof(c->error_text), "%s", st->message);
    oi_status_free(st);
    return reject_in_parser(c, 503, c->error_text);
}

static int count_header_bytes(oi_http_conn_t *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->lis->server->cfg.max_header_bytes)
        return reject_in_parser(c, 431, "request line and headers exceed the server's max_header_bytes");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    oi_http_conn_t *c = conn_of(p);
    c->in_message = 1;
    c->in_body = 0;
    c->head = 0;
    c->url.len = 0;
    c->hfield.len = 0;
    c->hvalue.len = 0;
    c->header_bytes = 0;
    c->expect_continue = 0;
    c->body_direct = 0;
    c->chunks = 0;
    c->req.inference_header_length = -1;
    c->req.content_encoding[0] = '\0';
    c->req.accept_encoding[0] = '\0';
    c->req.nv_infer_request = NULL;
    c->nv_request.len = 0;
    c->captured.len = 0;
    c->captured_have = 0;
    c->forwarded.len = 0;
    if (c->lis->server->cfg.on_answered != NULL)
        c->start_ns = uv_hrtime();
    c->req.start_ns = c->start_ns;
    c->msg_start = uv_now(&c->lis->loop.uv);
    arm_timer(c, c->lis->server->cfg.header_timeout_ms);
    return 0;
}

static int append_counted(oi_http_conn_t *c, oi_sbuf_t *s, const char *at, size_t n)
{
    if (count_header_bytes(c, n) != 0)
        return -1;
    return oi_sbuf_append(s, at, n) == 0 ? 0 : reject_in_parser(c, 500, "out of memory");
}

static int on_url(llhttp_t *p, const char *at, size_t n) { return append_counted(conn_of(p), &conn_of(p)->url, at, n); }

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    return append_counted(conn_of(p), &conn_of(p)->hfield, at, n);
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    oi_http_conn_t *c = conn_of(p);
    /* Bytes of a value on a line of their own: the value was folded onto it. (An empty span
     * marks the end of an empty value: it begins the next line, and is no fold.) */
    if (n > 0 && line_starts_with_space(c, at))
        return reject_in_parser(c, 400, folded_line);
    return append_counted(c, &c->hvalue, at, n);
}

static int header_is(const oi_sbuf_t *f, const char *name)
{
    size_t n = strlen(name);
    return f->len == n && strncasecmp(f->data, name, n) == 0;
}

static void copy_lower(char *dst, size_t cap, const oi_sbuf_t *v)
{
    size_t n = v->len < cap - 1 ? v->len : cap - 1;
    for (size_t i = 0; i < n; i++)
        dst[i] = (char)tolower((unsigned char)v->data[i]);
    dst[n] = '\0';
}

/* Keeps the value of a header the handler asked for. Returns 1 when `f` is such a header
 * (restricted-API keys: never forwarded to a model), 0 when not, -1 out of memory, -2 when it
 * came before: which of two keys counts is not for the server to guess (a proxy may have
 * added one), so the request is refused. */
static int capture_header(oi_http_conn_t *c, const oi_sbuf_t *f, const oi_sbuf_t *v)
{
    const oi_http_config_t *cfg = &c->lis->server->cfg;
    for (int i = 0; i < cfg->n_capture_headers; i++) {
        if (!header_is(f, cfg->capture_headers[i]))
            continue;
        if (c->captured_have & (1u << i))
            return -2;
        c->captured_off[i] = c->captured.len;
        c->captured_len[i] = v->len;
        c->captured_have |= 1u << i;
        if (v->len > 0 && oi_sbuf_append(&c->captured, v->data, v->len) != 0)
            return -1;
        return 1;
    }
    return 0;
}

const char *oi_http_request_header(const oi_http_request_t *req, int i, size_t *len)
{
    const oi_http_conn_t *c = req->conn;
    if (i < 0 || i >= OI_HTTP_MAX_CAPTURED || !(c->captured_have & (1u << i)))
        return NULL;
    *len = c->captured_len[i];
    return c->captured_len[i] ? c->captured.data + c->captured_off[i] : "";
}

static int on_header_value_complete(llhttp_t *p)
{
    oi_http_conn_t *c = conn_of(p);
    oi_sbuf_t *f = &c->hfield, *v = &c->hvalue;
    int captured = 0;
    /* A field value has no whitespace at its ends (RFC 9112, 5.1): llhttp drops the leading. */
    while (v->len > 0 && (v->data[v->len - 1] == ' ' || v->data[v->len - 1] == '\t'))
        v->len--;
    if (header_is(f, "expect")) {
        if (v->len == 12 && strncasecmp(v->data, "100-continue", 12) == 0)
            c->expect_continue = 1;
        else
            return reject_in_parser(c, 417, "unsupported Expect header; only 100-continue is known");
    } else if (header_is(f, "inference-header-content-length")) {
        char tmp[24];
        copy_lower(tmp, sizeof(tmp), v);
        char *end;
        errno = 0;
        long long n = strtoll(tmp, &end, 10);
        if (v->len == 0 || v->len >= sizeof(tmp) || *end != '\0' || n < 0 || errno != 0)
            return reject_in_parser(c, 400, "Inference-Header-Content-Length must be a non-negative integer");
        c->req.inference_header_length = n;
    } else if (header_is(f, "content-encoding")) {
        copy_lower(c->req.content_encoding, sizeof(c->req.content_encoding), v);
    } else if (header_is(f, "accept-encoding")) {
        copy_lower(c->req.accept_encoding, sizeof(c->req.accept_encoding), v);
    } else if (header_is(f, "nv-inferrequest")) {
        c->nv_request.len = 0;
        if (oi_sbuf_append(&c->nv_request, v->data, v->len) != 0 || oi_sbuf_append(&c->nv_request, "", 1) != 0)
            return reject_in_parser(c, 500, "out of memory");
        c->req.nv_infer_request_len = v->len;
    } else if ((captured = capture_header(c, f, v)) == -2) {
        int shown = f->len < 128 ? (int)f->len : 128;
        snprintf(c->error_text, sizeof(c->error_text),
                 "header '%.*s' appears more than once; it carries a restricted-API key and is given once", shown,
                 f->data);
        return reject_in_parser(c, 400, c->error_text);
    } else if (captured < 0) {
        return reject_in_parser(c, 500, "out of memory");
    }
    const regex_t *fwd = c->lis->server->cfg.forward_headers;
    if (fwd != NULL && captured == 0) {
        int rc = oi_hdr_forward(fwd, &c->forwarded, f->data, f->len, v->data, v->len, c->error_text,
                                sizeof(c->error_text));
        if (rc == OI_HDR_RESERVED)
            return reject_in_parser(c, 400, c->error_text);
        if (rc == OI_HDR_NOMEM)
            return reject_in_parser(c, 500, "out of memory");
    }
    f->len = 0;
    v->len = 0;
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    oi_http_conn_t *c = conn_of(p);
    const oi_http_config_t *cfg = &c->lis->server->cfg;
    if (p->method == HTTP_CONNECT)
        return reject_in_parser(c, 405, "CONNECT is not supported: this server is not a proxy");
    int over = 0;
    if (check_input_size(c, p->flags & F_CONTENT_LENGTH ? p->content_length : 0, 0) != 0)
        return -1;
    if (p->flags & F_CHUNKED) {
        c->body = oi_buf_new_charged(CHUNKED_INITIAL, cfg->body_budget, &over);
        if (c->body == NULL)
            return over ? reject_over_budget(c, CHUNKED_INITIAL) : reject_in_parser(c, 500, "out of memory");
    } else if (p->flags & F_CONTENT_LENGTH) {
        if (p->content_length > 0) {
            c->body = oi_buf_new_charged((size_t)p->content_length, cfg->body_budget, &over);
            if (c->body == NULL)
                return over ? reject_over_budget(c, (size_t)p->content_length)
                            : reject_in_parser(c, 500, "out of memory for the request body");
            c->body_direct = 1;
        }
    }
    if (c->expect_continue && c->body != NULL) {
        /* A bare interim response: written straight, ahead of the final one. */
        static char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        write_req_t *wr = malloc(sizeof(*wr));
        if (wr == NULL)
            return reject_in_parser(c, 500, "out of memory");
        wr->conn = c;
        wr->nparts = 0;
        wr->parts = NULL;
        uv_buf_t b = uv_buf_init(cont, sizeof(cont) - 1);
        conn_send(c, wr, &b, 1);
    }
    if (c->body != NULL) {
        /* From here the header deadline no longer applies: the body is timed on silence and
         * on its average rate. */
        c->in_body = 1;
        c->body_start = uv_now(&c->lis->loop.uv);
        arm_body_deadline(c);
        if (cfg->body_timeout_ms == 0)
            disarm_timer(c);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    oi_http_conn_t *c = conn_of(p);
    oi_buf_t *b = c->body;
    if (b == NULL)
        return reject_in_parser(c, 400, "unexpected body");
    if (at == b->data + b->len) { /* read straight into the body: nothing to copy */
        b->len += n;
        return 0;
    }
    size_t want = b->len + n; /* chunked bodies grow; Content-Length ones were checked up front */
    if (check_input_size(c, want, 1) != 0)
        return -1;
    if (b->cap - b->len < n) {
        size_t cap = b->cap * 2 > want ? b->cap * 2 : want;
        if (cap > body_bound(c))
            cap = body_bound(c);
        oi_budget_t *budget = c->lis->server->cfg.body_budget;
        if (oi_budget_take(budget, cap - b->cap) != 0) /* the buffer's charge grows with it */
            return reject_over_budget(c, cap);
        oi_buf_t *nb = oi_buf_grow(b, cap);
        if (nb == NULL) {
            oi_budget_give(budget, cap - b->cap);
            return reject_in_parser(c, 500, "out of memory for the request body");
        }
        c->body = b = nb;
    }
    memcpy(b->data + b->len, at, n);
    b->len += n;
    return 0;
}

/* A chunked body's chunks are counted, as tritonserver counts them: past MAX_CHUNKS non-empty
 * ones it is refused (a body of one-byte chunks costs the parser per chunk). */
static int on_chunk_header(llhttp_t *p)
{
    oi_http_conn_t *c = conn_of(p);
    if (p->content_length > 0 && ++c->chunks > MAX_CHUNKS) {
        snprintf(c->error_text, sizeof(c->error_text),
                 "Chunked request body exceeds maximum of %u non-empty chunks. Send fewer or larger HTTP chunks.",
                 MAX_CHUNKS);
        return reject_in_parser(c, 400, c->error_text);
    }
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    oi_http_conn_t *c = conn_of(p);
    oi_http_server_t *s = c->lis->server;
    disarm_timer(c);
    c->in_message = 0;
    c->in_body = 0;
    c->served = 1;
    /* An upgrade is refused by answering the request as plain HTTP and closing: the client
     * may already have sent bytes of the other protocol behind it. */
    c->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    c->http10 = p->http_major == 1 && p->http_minor == 0;
    c->head = p->method == HTTP_HEAD;

    if (oi_sbuf_append(&c->url, "", 1) != 0) /* NUL-terminate */
        return reject_in_parser(c, 500, "out of memory");
    c->url.len--;
    char *q = memchr(c->url.data, '?', c->url.len);
    size_t path_len = q ? (size_t)(q - c->url.data) : c->url.len;
    c->url.data[path_len] = '\0';

    oi_http_request_t *r = &c->req;
    r->method = p->method;
    r->path = c->url.data;
    r->path_len = path_len;
    r->query = q ? q + 1 : "";
    r->nv_infer_request = c->nv_request.len ? c->nv_request.data : NULL;
    r->forwarded = c->forwarded.len ? c->forwarded.data : NULL;
    r->forwarded_len = c->forwarded.len;
    oi_buf_unref(r->body);
    r->body = c->body;
    c->body = NULL;
    c->body_direct = 0;
    r->loop = &c->lis->loop;
    r->conn = c;
    r->on_gone = NULL;
    r->gone_arg = NULL;

    c->busy = 1;
    atomic_fetch_add(&s->inflight, 1);
    s->handler(s->ctx, r);
    return HPE_PAUSED; /* one request at a time; feed() or the response goes on */
}

static const llhttp_settings_t parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_chunk_header = on_chunk_header,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- responding --------------------------------------------------------------------------- */

const oi_peer_t *oi_http_request_peer(oi_http_request_t *req)
{
    oi_http_conn_t *c = req->conn;
    int fd = -1;
    uv_fileno(&c->sock.handle, &fd);
    return oi_peer_cached(&c->creds, fd);
}

static void request_done(oi_http_conn_t *c);

/* Queues `pre`, the parts and `post` as one write (copies of pre and post; takes the parts'
 * owner references). */
static void write_pieces(oi_http_conn_t *c, const char *pre, size_t plen, const oi_iov_t *parts, size_t nparts,
                         const char *post, size_t postlen)
{
    size_t head_cap = (plen + postlen + _Alignof(oi_iov_t)) & ~(_Alignof(oi_iov_t) - 1);
    write_req_t *wr = c->closing || c->abandoned ? NULL : malloc(sizeof(*wr) + head_cap + nparts * sizeof(oi_iov_t));
    uv_buf_t stackbufs[8];
    uv_buf_t *bufs = wr == NULL ? NULL : nparts + 2 <= 8 ? stackbufs : malloc((nparts + 2) * sizeof(uv_buf_t));
    if (bufs == NULL) {
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
        free(wr);
        if (!c->closing && !c->abandoned)
            conn_close(c); /* out of memory: the answer cannot be whole */
        return;
    }
    memcpy(wr->head, pre, plen);
    memcpy(wr->head + plen, post, postlen);
    wr->conn = c;
    wr->nparts = nparts;
    wr->parts = (oi_iov_t *)(wr->head + head_cap);
    if (nparts > 0)
        memcpy(wr->parts, parts, nparts * sizeof(oi_iov_t));
    unsigned nb = 0;
    if (plen > 0)
        bufs[nb++] = uv_buf_init(wr->head, (unsigned)plen);
    for (size_t i = 0; i < nparts; i++)
        if (parts[i].len > 0)
            bufs[nb++] = uv_buf_init((char *)parts[i].base, (unsigned)parts[i].len);
    if (postlen > 0)
        bufs[nb++] = uv_buf_init(wr->head + plen, (unsigned)postlen);
    conn_send(c, wr, bufs, nb);
    if (bufs != stackbufs)
        free(bufs);
}

void oi_http_stream_start(oi_http_request_t *req, int status, const char *headers)
{
    oi_http_conn_t *c = req->conn;
    c->streaming = 1;
    c->stream_status = status;
    c->stream_bytes = 0;
    if (c->http10)
        c->keep_alive = 0; /* no chunked coding: the body ends with the connection */
    char head[512];
    int n = snprintf(head, sizeof(head), "HTTP/1.1 %d %s\r\n%s%s\r\n", status, reason_phrase(status),
                     c->http10 ? "Connection: close\r\n" : "Transfer-Encoding: chunked\r\n", headers);
    if (n < 0 || (size_t)n >= sizeof(head)) {
        conn_close(c);
        return;
    }
    write_pieces(c, head, (size_t)n, NULL, 0, "", 0);
}

void oi_http_stream_send(oi_http_request_t *req, const oi_iov_t *parts, size_t nparts)
{
    oi_http_conn_t *c = req->conn;
    size_t total = 0;
    for (size_t i = 0; i < nparts; i++)
        total += parts[i].len;
    c->stream_bytes += total;
    char size[24]; /* the chunk-size line, in hex, by hand: this runs for every event */
    size_t n = 0;
    if (!c->http10 && total > 0) {
        char tmp[16], *p = tmp + sizeof(tmp);
        for (size_t v = total; v != 0; v >>= 4)
            *--p = "0123456789abcdef"[v & 15];
        n = (size_t)(tmp + sizeof(tmp) - p);
        memcpy(size, p, n);
        memcpy(size + n, "\r\n", 2);
        n += 2;
    }
    write_pieces(c, size, n, parts, nparts, "\r\n", n > 0 ? 2 : 0);
}

void oi_http_stream_end(oi_http_request_t *req)
{
    oi_http_conn_t *c = req->conn;
    oi_http_server_t *s = c->lis->server;
    if (s->cfg.on_answered != NULL) {
        oi_http_answer_t a = {.status = c->stream_status,
                              .start_ns = c->start_ns,
                              .bytes_out = c->stream_bytes,
                              .peer = c->peer_counted ? &c->peer : NULL};
        a.bytes_in = c->header_bytes + (req->body ? req->body->len : 0);
        s->cfg.on_answered(s->ctx, req, &a);
    }
    oi_buf_unref(req->body);
    req->body = NULL;
    req->on_gone = NULL;
    if (!c->http10)
        write_pieces(c, "0\r\n\r\n", 5, NULL, 0, "", 0);
    if (!c->keep_alive)
        c->close_after_write = 1;
    request_done(c);
}

void oi_http_respond(oi_http_request_t *req, int status, const char *headers, const oi_iov_t *parts,
                     size_t nparts)
{
    oi_http_conn_t *c = req->conn;
    oi_http_server_t *s = c->lis->server;
    if (s->cfg.on_answered != NULL) {
        oi_http_answer_t a = {.status = status, .start_ns = c->start_ns, .peer = c->peer_counted ? &c->peer : NULL};
        a.bytes_in = c->header_bytes + (req->body ? req->body->len : 0);
        for (size_t i = 0; i < nparts; i++)
            a.bytes_out += parts[i].len;
        s->cfg.on_answered(s->ctx, req, &a);
    }
    oi_buf_unref(req->body);
    req->body = NULL;
    req->on_gone = NULL; /* answered: a close from here on cancels nothing */
    if (!c->keep_alive)
        c->close_after_write = 1;
    if (c->abandoned) { /* the 503 of a shutdown went instead */
        for (size_t i = 0; i < nparts; i++)
            oi_buf_unref(parts[i].owner);
    } else {
        conn_write(c, status, headers, parts, nparts, req->method == HTTP_HEAD);
    }
    request_done(c);
}

/* The request is answered: the connection goes on with the next one. */
static void request_done(oi_http_conn_t *c)
{
    oi_http_server_t *s = c->lis->server;
    c->busy = 0;
    c->streaming = 0;
    atomic_fetch_sub(&s->inflight, 1);
    if (c->orphaned) {
        c->orphaned = 0;
        atomic_fetch_sub(&s->orphans, 1);
    }
    if (c->closing)
        conn_maybe_free(c);
    else
        resume_after_response(c);
}

/* ---- accepting ---------------------------------------------------------------------------- */

/* The connection of this loop (of `peer` only, unless NULL) that has waited longest for a
 * request, with nothing in flight, or NULL. Only this loop's connections may be touched from
 * its thread, so a full table evicts from the accepting loop (the loops share one accept
 * queue, so each holds a fair share of the connections). */
static oi_http_conn_t *oldest_idle(listener_t *lis, oi_http_conn_t *except, const oi_peer_addr_t *peer)
{
    oi_http_conn_t *best = NULL;
    for (oi_http_conn_t *c = lis->conns; c != NULL; c = c->next)
        if (c != except && (peer == NULL || (c->peer_counted && memcmp(&c->peer, peer, sizeof(*peer)) == 0)) &&
            !c->closing && !c->busy && !c->in_message && c->writes == 0 && c->pending.len == 0 &&
            (best == NULL || c->idle_since <= best->idle_since))
            best = c;
    return best;
}

/* The connection of this loop whose request (headers or body, nothing with the handler yet)
 * has arrived slowest on average since its first byte, or NULL. A second is the least time
 * counted, so that a request just begun is not taken for a slow one. */
static oi_http_conn_t *slowest_reading(listener_t *lis, oi_http_conn_t *except, uint64_t now)
{
    oi_http_conn_t *best = NULL;
    double best_rate = 0;
    for (oi_http_conn_t *c = lis->conns; c != NULL; c = c->next) {
        if (c == except || c->closing || c->busy || !c->in_message)
            continue;
        uint64_t ms = now - c->msg_start < 1000 ? 1000 : now - c->msg_start;
        double rate = (double)(c->header_bytes + (c->body ? c->body->len : 0)) * 1000.0 / (double)ms;
        if (best == NULL || rate < best_rate || (rate == best_rate && c->msg_start < best->msg_start)) {
            best = c;
            best_rate = rate;
        }
    }
    return best;
}

/* Makes room in a full table for a new connection: the oldest idle connection is closed, or
 * else the slowest to send its request is answered 503 and closed. -1 when neither exists
 * (every connection has a request with the handler). */
static int make_room(oi_http_conn_t *newc)
{
    listener_t *lis = newc->lis;
    oi_http_conn_t *victim = oldest_idle(lis, newc, NULL);
    if (victim != NULL) {
        conn_close(victim);
        return 0;
    }
    uint64_t now = uv_now(&lis->loop.uv);
    if ((victim = slowest_reading(lis, newc, now)) == NULL)
        return -1;
    snprintf(victim->error_text, sizeof(victim->error_text),
             "the server's connections are all in use (max_connections %d) and this request was the slowest "
             "to arrive (%zu bytes in %llu ms); retry later",
             lis->server->cfg.max_connections, victim->header_bytes + (victim->body ? victim->body->len : 0),
             (unsigned long long)(now - victim->msg_start));
    stop_reading(victim);
    conn_reject(victim, 503, victim->error_text);
    return 0;
}

/* Counts the new connection against its address's limit: 0, or -1 to refuse it. */
static int admit_peer(oi_http_conn_t *c)
{
    int fd = -1;
    if (uv_fileno(&c->sock.handle, &fd) != 0 || oi_peer_addr_of(fd, &c->peer) != 0)
        return 0; /* no IP peer to count */
    c->peer_counted = 1;
    if (oi_peers_acquire(&c->lis->server->peers, &c->peer) == 0)
        return 0;
    /* The address is at its limit: its own oldest idle connection gives way, handing its
     * count to the new one, so a client only ever displaces itself; with none idle, refuse. */
    oi_http_conn_t *victim = oldest_idle(c->lis, c, &c->peer);
    if (victim == NULL) {
        c->peer_counted = 0;
        return -1;
    }
    victim->peer_counted = 0;
    conn_close(victim);
    return 0;
}

/* A new connection of `lis` (on a Unix-domain socket when `pipe`), linked and counted, its
 * handles initialised but no socket yet; NULL when out of memory. */
static oi_http_conn_t *conn_new(listener_t *lis, int pipe)
{
    oi_http_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->lis = lis;
    if (pipe)
        uv_pipe_init(&lis->loop.uv, &c->sock.pipe, 0);
    else
        uv_tcp_init(&lis->loop.uv, &c->sock.tcp);
    uv_timer_init(&lis->loop.uv, &c->timer);
    c->sock.handle.data = c->timer.data = c;
    c->handles = 2;
    c->keep_alive = 1;
    c->idle_since = uv_now(&lis->loop.uv);
    atomic_fetch_add(&lis->server->connections, 1);
    oi_tcp_listener_count(&lis->tcp, 1);
    c->next = lis->conns;
    if (lis->conns)
        lis->conns->prev = c;
    lis->conns = c;
    return c;
}

/* Starts reading a connection that has its socket, under the first-byte deadline. */
static void conn_start(oi_http_conn_t *c)
{
    if (c->sock.handle.type == UV_TCP)
        uv_tcp_nodelay(&c->sock.tcp, 1);
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
    c->parser.data = c;
    c->req.inference_header_length = -1;
    start_reading(c);
    arm_timer(c, c->lis->server->cfg.first_byte_timeout_ms);
}

/* A connection that has its socket: admitted (or closed) and started. */
static void conn_accepted(oi_http_conn_t *c)
{
    oi_http_server_t *s = c->lis->server;
    if (admit_peer(c) != 0) {
        conn_close(c);
        return;
    }
    if (atomic_load(&s->connections) > s->cfg.max_connections && make_room(c) != 0) {
        /* Full: a connection that waits for nothing, or else the one whose request trickles
         * in slowest, gives way to one that just came, so that clients that hold connections
         * silent or sending a byte now and then cannot lock others out. */
        conn_close(c);
        return;
    }
    conn_start(c);
}

static void on_unix_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    oi_http_conn_t *c = conn_new(server->data, 1);
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
    oi_http_conn_t *c = conn_new(l->data, 0);
    if (c == NULL) {
        close(fd);
        return;
    }
    if (uv_tcp_open(&c->sock.tcp, fd) != 0) {
        close(fd);
        conn_close(c);
        return;
    }
    oi_tls_ctx_t *tls = c->lis->server->cfg.tls;
    if (tls != NULL && (c->tls = oi_tls_new(tls, &c->lis->loop.uv, &c->sock.stream, on_alloc, on_read)) == NULL) {
        conn_close(c);
        return;
    }
    conn_accepted(c);
}

int oi_http_server_adopt(oi_http_server_t *s, int fd)
{
    oi_http_conn_t *c = conn_new(&s->loops[0], 0);
    if (c == NULL)
        return UV_ENOMEM;
    oi_tls_ctx_t *tls = s->cfg.tls;
    if (tls != NULL && (c->tls = oi_tls_new(tls, &s->loops[0].loop.uv, &c->sock.stream, on_alloc, on_read)) == NULL) {
        conn_close(c);
        return UV_ENOMEM;
    }
    int rc = uv_tcp_open(&c->sock.tcp, fd);
    if (rc != 0) {
        conn_close(c); /* the socket stays the caller's */
        return rc;
    }
    conn_start(c);
    return 0;
}

static int resolve(const char *host, int port, struct sockaddr_storage *out, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        return UV_EINVAL;
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static int listen_error(listener_t *lis, int rc, char *err, size_t errlen)
{
    snprintf(err, errlen, "cannot listen on %s:%d: %s", lis->server->host, lis->server->cfg.port,
             uv_strerror(rc));
    return rc;
}

/* The first loop binds and listens (or takes the socket it was given); the others watch
 * duplicates of its socket, so the loops share one accept queue (see oi_tcp_listen). */
static int open_listener(listener_t *lis, const struct sockaddr_storage *addr, const listener_t *first,
                         char *err, size_t errlen)
{
    int rc = oi_tcp_listen(&lis->loop.uv, &lis->tcp, addr, first ? &first->tcp : NULL, lis->server->cfg.listen_fd,
                           on_tcp_connection, lis);
    return rc == 0 ? 0 : listen_error(lis, rc, err, errlen);
}

/* The Unix-domain listener of one loop: the first binds the path, the others listen on
 * duplicates of its socket (as open_listener does for TCP). */
static int open_unix_listener(listener_t *lis, const listener_t *first, char *err, size_t errlen)
{
    oi_http_server_t *s = lis->server;
    int rc = first == NULL ? oi_unix_listen_open(&lis->loop.uv, &lis->pipe, s->unix_path, s->cfg.unix_mode,
                                                 &s->unix_sock, err, errlen)
                           : oi_unix_listen_dup(&lis->loop.uv, &lis->pipe, &first->pipe);
    if (rc != 0) {
        if (first != NULL)
            snprintf(err, errlen, "cannot listen on %s: %s", s->unix_path, uv_strerror(rc));
        return rc;
    }
    lis->pipe_listening = 1;
    lis->pipe.data = lis;
    rc = uv_listen((uv_stream_t *)&lis->pipe, 1024, on_unix_connection);
    if (rc != 0)
        snprintf(err, errlen, "cannot listen on %s: %s", s->unix_path, uv_strerror(rc));
    return rc;
}

oi_http_server_t *oi_http_server_new(const oi_http_config_t *cfg, oi_http_handler_cb handler, void *ctx)
{
    oi_http_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cfg = *cfg;
    s->cfg.tls = oi_tls_ctx_ref(cfg->tls);
    snprintf(s->host, sizeof(s->host), "%s", cfg->host ? cfg->host : "127.0.0.1");
    s->cfg.host = s->host;
    snprintf(s->unix_path, sizeof(s->unix_path), "%s", cfg->unix_path ? cfg->unix_path : "");
    s->cfg.unix_path = s->unix_path[0] ? s->unix_path : NULL;
    if (s->cfg.threads <= 0) {
        s->cfg.threads = oi_usable_cpus(); /* what affinity and the cgroup quota allow */
    }
    if (s->cfg.inline_loop)
        s->cfg.threads = 1;
    if (s->cfg.first_byte_timeout_ms == 0) /* none of its own: the idle timeout covers it */
        s->cfg.first_byte_timeout_ms = s->cfg.idle_timeout_ms;
    oi_peers_init(&s->peers, s->cfg.max_connections_per_peer);
    s->handler = handler;
    s->ctx = ctx;
    return s;
}

int oi_http_server_start(oi_http_server_t *s, char *err, size_t errlen)
{
    struct sockaddr_storage addr = {0};
    int tcp = s->cfg.port >= 0, rc = tcp ? resolve(s->host, s->cfg.port, &addr, err, errlen) : 0;
    if (rc != 0)
        return rc;
    s->loops = calloc((size_t)s->cfg.threads, sizeof(*s->loops));
    if (s->loops == NULL) {
        snprintf(err, errlen, "out of memory");
        return UV_ENOMEM;
    }
    for (int i = 0; i < s->cfg.threads; i++) {
        listener_t *lis = &s->loops[i];
        lis->server = s;
        if ((rc = oi_loop_init(&lis->loop)) != 0) {
            snprintf(err, errlen, "cannot create an event loop: %s", uv_strerror(rc));
            return rc;
        }
        s->nloops++;
        if (s->cfg.inline_loop)
            return 0; /* the caller runs it and brings the connections */
        if (tcp && (rc = open_listener(lis, &addr, i ? &s->loops[0] : NULL, err, errlen)) != 0)
            return rc;
        if (s->cfg.unix_path && (rc = open_unix_listener(lis, i ? &s->loops[0] : NULL, err, errlen)) != 0)
            return rc;
    }
    if (tcp)
        s->port = oi_tcp_bound_port(&s->loops[0].tcp);
    for (int i = 0; i < s->nloops; i++)
        if ((rc = oi_loop_start(&s->loops[i].loop, s->cfg.thread_name ? s->cfg.thread_name : "oi-loop")) != 0) {
            snprintf(err, errlen, "cannot start a loop thread: %s", uv_strerror(rc));
            return rc;
        }
    return 0;
}

int oi_http_server_port(const oi_http_server_t *s) { return s->port; }

int oi_http_server_nloops(const oi_http_server_t *s) { return s->nloops; }

oi_loop_t *oi_http_server_loop(oi_http_server_t *s, int i) { return &s->loops[i].loop; }

int oi_http_server_inflight(const oi_http_server_t *s) { return atomic_load(&((oi_http_server_t *)s)->inflight); }

int oi_http_server_orphans(const oi_http_server_t *s)
{
    return atomic_load(&((oi_http_server_t *)s)->orphans);
}

typedef struct loop_task_s {
    oi_task_t task;
    listener_t *lis;
    int final;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} loop_task_t;

static void close_listener(listener_t *lis)
{
    oi_tcp_listener_close(&lis->tcp);
    if (lis->pipe_listening) {
        lis->pipe_listening = 0;
        uv_close((uv_handle_t *)&lis->pipe, NULL);
    }
}

static void run_loop_task(oi_task_t *t)
{
    loop_task_t *lt = (loop_task_t *)t;
    listener_t *lis = lt->lis;
    close_listener(lis);
    if (lt->final) {
        while (lis->conns)
            conn_close(lis->conns);
        oi_loop_close_wake(&lis->loop);
    }
    pthread_mutex_lock(&lt->mu);
    lt->done = 1;
    pthread_cond_signal(&lt->cv);
    pthread_mutex_unlock(&lt->mu);
}

/* Runs close_listener (and for `final`, the closing of everything) on each loop's thread
 * and waits for it: the loops' handles may only be touched there. */
static void on_each_loop(oi_http_server_t *s, int final)
{
    for (int i = 0; i < s->nloops; i++) {
        listener_t *lis = &s->loops[i];
        loop_task_t lt = {.lis = lis, .final = final};
        lt.task.run = run_loop_task;
        if (!lis->loop.started) { /* start failed half-way: nothing else runs this loop */
            run_loop_task(&lt.task);
            continue;
        }
        pthread_mutex_init(&lt.mu, NULL);
        pthread_cond_init(&lt.cv, NULL);
        oi_loop_post(&lis->loop, &lt.task);
        pthread_mutex_lock(&lt.mu);
        while (!lt.done)
            pthread_cond_wait(&lt.cv, &lt.mu);
        pthread_mutex_unlock(&lt.mu);
        pthread_cond_destroy(&lt.cv);
        pthread_mutex_destroy(&lt.mu);
    }
}

void oi_http_server_stop_accepting(oi_http_server_t *s)
{
    on_each_loop(s, 0);
    oi_unix_listen_unlink(&s->unix_sock); /* no listener behind it now */
}

typedef struct abandon_arg_s {
    listener_t *lis;
    int status;
    const char *message;
} abandon_arg_t;

static void abandon_loop(void *arg)
{
    abandon_arg_t *a = arg;
    for (oi_http_conn_t *c = a->lis->conns, *next; c != NULL; c = next) {
        next = c->next; /* closing unlinks c */
        stop_reading(c);
        c->keep_alive = 0;
        if (c->busy && !c->abandoned && c->streaming) {
            /* An answer half streamed cannot take another: the client sees it cut. */
            conn_close(c);
            c->abandoned = 1;
        } else if (c->busy && !c->abandoned) {
            /* The request stays counted (and the connection alive) until the handler
             * answers; the client gets its answer now. */
            conn_reject(c, a->status, a->message);
            c->abandoned = 1;
        } else if (c->writes > 0) {
            c->close_after_write = 1; /* an answer is on its way out: let it finish */
        } else {
            conn_close(c);
        }
    }
}

void oi_http_server_abandon(oi_http_server_t *s, int status, const char *message)
{
    for (int i = 0; i < s->nloops; i++) {
        abandon_arg_t a = {&s->loops[i], status, message};
        oi_loop_call(&s->loops[i].loop, abandon_loop, &a);
    }
}

void oi_http_server_free(oi_http_server_t *s)
{
    if (s == NULL)
        return;
    on_each_loop(s, 1);
    oi_unix_listen_unlink(&s->unix_sock);
    for (int i = 0; i < s->nloops; i++)
        oi_loop_join(&s->loops[i].loop);
    free(s->loops);
    oi_peers_destroy(&s->peers);
    oi_tls_ctx_unref(s->cfg.tls);
    free(s);
}
