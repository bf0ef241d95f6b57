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
#include "transport/hdr_forward.h"
#include "transport/grpc.h"
#include "transport/peers.h"
#include "transport/tcp_listen.h"
#include "transport/unix_listen.h"

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
        oi__h2_call_gone(s, call);
    oi_grpc_call_unref(call);
}

int oi__h2_on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
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

/* Keeps the value of a metadata key the handler asked for. Returns 1 when `name` is such a key
 * (restricted-API keys: never forwarded to a model), 0 when not, -1 out of memory, -2 when it
 * came before (which of two keys counts is not for the server to guess: the call is refused). */
static int capture_header(const h2_conn_t *c, oi_grpc_call_t *call, const uint8_t *name, size_t namelen,
                          const uint8_t *value, size_t valuelen)
{
    const oi_h2_config_t *cfg = &c->lp->server->cfg;
    for (int i = 0; i < cfg->n_capture_headers; i++) {
        if (!header_is(name, namelen, cfg->capture_headers[i]))
            continue;
        if (call->captured[i] != NULL)
            return -2;
        call->captured[i] = malloc(valuelen + 1);
        if (call->captured[i] == NULL)
            return -1;
        memcpy(call->captured[i], value, valuelen);
        call->captured[i][valuelen] = '\0';
        call->captured_len[i] = valuelen;
        return 1;
    }
    return 0;
}

int oi__h2_on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    (void)flags;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* the client's trailers, if any, say nothing we need */
    oi_grpc_call_t *call = oi__h2_call_of(session, frame->hd.stream_id);
    if (call == NULL)
        return 0;
    int captured = 0;
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
    } else if ((captured = capture_header(user_data, call, name, namelen, value, valuelen)) == -2) {
        char err[256];
        snprintf(err, sizeof(err), "metadata '%.*s' appears more than once; it carries a restricted-API key and is "
                 "given once", namelen < 128 ? (int)namelen : 128, (const char *)name);
        if (call->forward_refused == NULL && (call->forward_refused = strdup(err)) == NULL)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    } else if (captured < 0) {
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    const regex_t *fwd = call->conn != NULL ? call->conn->lp->server->cfg.forward_headers : NULL;
    if (fwd != NULL && captured == 0 && namelen > 0 && name[0] != ':' && call->forward_refused == NULL) {
        char err[256];
        int rc = oi_hdr_forward(fwd, &call->forwarded, (const char *)name, namelen, (const char *)value, valuelen,
                                err, sizeof(err));
        if (rc == OI_HDR_NOMEM)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        if (rc == OI_HDR_RESERVED && (call->forward_refused = strdup(err)) == NULL)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
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
        oi__h2_submit_headers_only(call, "405", OI_GRPC_UNIMPLEMENTED, "gRPC calls are POST requests");
        return;
    }
    if (!call->content_type_ok) {
        call->finished = 1;
        call->headers_sent = 1;
        oi__h2_submit_headers_only(call, "415", OI_GRPC_INVALID_ARGUMENT,
                            "unsupported content-type; this gRPC endpoint expects application/grpc");
        return;
    }
    if (call->path == NULL) {
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, "the request has no :path naming a method");
        return;
    }
    if (call->forward_refused != NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, call->forward_refused);
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
        oi__h2_call_drain(c, call);
        c->in_recv = 0;
    } else {
        oi_buf_unref(f->out);
    }
    free(f);
    if (c != NULL && !c->closing)
        oi__h2_conn_flush(c);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&server->working, 1); /* last: a stop may free the server once it is 0 */
}

/* Hands a complete request message to the handler; a compressed one is inflated off the loop
 * first, and the call's later messages wait behind it. */
void oi__h2_deliver(h2_conn_t *c, oi_grpc_call_t *call, oi_buf_t *m, int compressed)
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
        uv_timer_start(&c->timer, oi__h2_on_conn_timer, ms, 0);
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
void oi__h2_check_rates(h2_conn_t *c)
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
        oi__h2_call_gone(s, call);
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
                char msg[200];
                snprintf(msg, sizeof(msg),
                         "request message of %u bytes is over the server's limit of %zu bytes (grpc_max_message_bytes)."
                         " Use --grpc-max-message-bytes to increase the limit.",
                         n, s->cfg.max_message_bytes);
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
                oi__h2_deliver(c, call, m, compressed);
            }
        }
    }
}

int oi__h2_on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data)
{
    (void)flags;
    h2_conn_t *c = user_data;
    oi_grpc_call_t *call = oi__h2_call_of(session, stream_id);
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
void oi__h2_half_close(h2_conn_t *c, oi_grpc_call_t *call)
{
    call->half_closed = 1;
    if (oi_grpc_call_open(call)) {
        if (call->msg != NULL || call->prefix_have > 0)
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "the request ended inside a message (truncated gRPC message)");
        else
            c->lp->server->handler.on_half_close(c->lp->server->ctx, call);
    }
}

int oi__h2_on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    h2_conn_t *c = user_data;
    if (!c->got_preface) { /* nghttp2 checked the magic; the first frame is the SETTINGS */
        c->got_preface = 1;
        if (c->calls == NULL)
            oi__h2_conn_idle(c);
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    oi_grpc_call_t *call = oi__h2_call_of(session, frame->hd.stream_id);
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
        oi__h2_half_close(c, call);
    }
    oi_grpc_call_unref(call);
    return 0;
}

int oi__h2_on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    (void)user_data;
    /* Our side ended before the client's: tell it to stop sending (gRPC's RST_STREAM
     * NO_ERROR), so that a rejected large message is not read to its end. */
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        oi_grpc_call_t *call = oi__h2_call_of(session, frame->hd.stream_id);
        if (call != NULL && !call->half_closed && !call->half_close_held)
            nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

int oi__h2_on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
{
    (void)error_code, (void)user_data;
    oi_grpc_call_t *call = oi__h2_call_of(session, stream_id);
    if (call != NULL)
        oi__h2_call_detach(call);
    return 0;
}
