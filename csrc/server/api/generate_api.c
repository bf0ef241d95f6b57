/* Triton's generate extension over HTTP: a flat JSON request becomes a V2 request (through the
 * same decoder, validation and oi_infer_submit as /infer), and each response a flat JSON
 * answer; /generate_stream sends every response as a Server-Sent Event the moment the model
 * produces it, and an error as an event {"error": ...}. */
#include <stdlib.h>
#include <string.h>

#include "codec/generate.h"
#include "codec/json.h"
#include "server/infer.h"
#include "server/server_impl.h"

#define JSON_HEADERS "Content-Type: application/json\r\n"
#define SSE_HEADERS "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"

/* One generate request: the HTTP request it answers, and what was produced so far. */
typedef struct gen_s {
    oi_http_request_t *r; /* NULL once answered before the model ended (/generate) */
    int stream;
    int started;    /* the streamed answer's head is out */
    int responses;  /* produced so far */
    oi_buf_t *only; /* /generate: the first response's answer */
    oi_status_t *failed; /* /generate: why the first response could not be answered */
} gen_t;

static void respond_error(oi_http_request_t *r, oi_status_t *st)
{
    oi_sbuf_t body = {0};
    oi_buf_t *b = oi_json_encode_error(&body, st->message) == 0 ? oi_sbuf_detach(&body) : NULL;
    oi_sbuf_free(&body);
    static const char oom[] = "{\"error\":\"out of memory\"}";
    oi_iov_t part = b ? (oi_iov_t){b->data, b->len, b} : (oi_iov_t){oom, sizeof(oom) - 1, NULL};
    oi_http_respond(r, OI_HTTP_STATUS(st->code), JSON_HEADERS, &part, 1);
    oi_status_free(st);
}

/* The flat answer for one response (an SSE event when streaming), or NULL with *st set. */
static oi_buf_t *encode(const gen_t *g, const oi_infer_t *inf, const oi_response_t *resp, oi_status_t **st)
{
    uint8_t small[16];
    uint8_t *binary = resp->n_outputs <= 16 ? small : calloc(resp->n_outputs, 1);
    oi_sbuf_t v2 = {0}, out = {0};
    *st = binary == NULL ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (*st == NULL) {
        memset(binary, 0, resp->n_outputs < 16 ? 16 : resp->n_outputs);
        *st = oi_json_encode_infer_response(&v2, inf->model->name, inf->model->version_str, &inf->req, resp, binary);
    }
    if (*st == NULL && g->stream && oi_sbuf_append(&out, "data: ", 6) != 0)
        *st = oi_status_new(OI_INTERNAL, "out of memory");
    if (*st == NULL)
        *st = oi_generate_response(v2.data, v2.len, &out);
    if (*st == NULL && g->stream && oi_sbuf_append(&out, "\n\n", 2) != 0)
        *st = oi_status_new(OI_INTERNAL, "out of memory");
    oi_buf_t *b = *st == NULL ? oi_sbuf_detach(&out) : NULL;
    if (*st == NULL && b == NULL)
        *st = oi_status_new(OI_INTERNAL, "out of memory");
    if (binary != small)
        free(binary);
    oi_sbuf_free(&v2);
    oi_sbuf_free(&out);
    return b;
}

/* Sends one event; the first one starts the answer with `status`. */
static void send_event(gen_t *g, int status, oi_buf_t *b, oi_infer_part_t *part)
{
    if (!g->started) {
        g->started = 1;
        oi_http_stream_start(g->r, status, SSE_HEADERS);
    }
    oi_iov_t iov = {b->data, b->len, b};
    if (part != NULL)
        oi_infer_part_hold(part, &iov);
    oi_http_stream_send(g->r, &iov, 1);
}

static void send_error_event(gen_t *g, oi_status_t *st)
{
    oi_sbuf_t out = {0};
    oi_buf_t *b = NULL;
    if (oi_sbuf_append(&out, "data: ", 6) == 0 && oi_json_encode_error(&out, st->message) == 0 &&
        oi_sbuf_append(&out, "\n\n", 2) == 0)
        b = oi_sbuf_detach(&out);
    oi_sbuf_free(&out);
    if (b != NULL)
        send_event(g, OI_HTTP_STATUS(st->code), b, NULL);
    oi_status_free(st);
}

/* One response: an event now, or (/generate) kept for the end. */
static void on_response(gen_t *g, oi_infer_t *inf, const oi_response_t *resp, oi_infer_part_t *part)
{
    oi_status_t *st = NULL;
    oi_buf_t *b = encode(g, inf, resp, &st);
    g->responses++;
    if (st != NULL) {
        if (g->stream)
            send_error_event(g, st);
        else if (g->responses == 1)
            g->failed = st;
        else
            oi_status_free(st);
        return;
    }
    if (g->stream)
        send_event(g, 200, b, part);
    else if (g->only == NULL)
        g->only = b;
    else
        oi_buf_unref(b);
}

/* Triton's answer to /generate on a model that does not produce exactly one response. */
static oi_status_t *not_one_response(void)
{
    return oi_status_new(OI_INTERNAL, "generate expects model to produce exactly 1 response, use generate stream for "
                                      "model that generates various number of responses");
}

static void on_part(oi_infer_t *inf, oi_infer_part_t *part)
{
    gen_t *g = inf->ctx;
    if (!g->stream && g->responses == 1) {
        /* /generate gets a second response: the answer can only be Triton's error, which it
         * gives at the end; given now, and the model is cancelled rather than left to run
         * (a generator of 2^31 tokens would hold its instance for hours). */
        g->responses++;
        respond_error(g->r, not_one_response());
        g->r = NULL;
        oi_infer_cancel(inf);
        return;
    }
    on_response(g, inf, &part->resp, part);
}

static void gen_free(gen_t *g)
{
    oi_buf_unref(g->only);
    oi_status_free(g->failed);
    free(g);
}

/* The end of the request, on its loop thread. */
static void on_done(oi_infer_t *inf)
{
    gen_t *g = inf->ctx;
    oi_http_request_t *r = g->r;
    uint64_t send_start = inf->trace != NULL ? oi_now_ns() : 0;
    oi_status_t *st = inf->job.status;
    inf->job.status = NULL;
    if (inf->cancelled) { /* the connection is gone (or the answer went): nothing more to say */
        oi_status_free(st);
        if (r != NULL && g->started)
            oi_http_stream_end(r);
        else if (r != NULL)
            oi_http_respond(r, OI_CLIENT_CLOSED, "", NULL, 0);
    } else if (g->stream) {
        if (st == NULL && inf->ds == NULL) /* a model of one response */
            on_response(g, inf, &inf->job.resp, NULL);
        if (st != NULL)
            send_error_event(g, st);
        if (!g->started) { /* no response at all: an empty stream */
            g->started = 1;
            oi_http_stream_start(r, 200, SSE_HEADERS);
        }
        oi_http_stream_end(r);
    } else {
        if (st == NULL && inf->ds == NULL)
            on_response(g, inf, &inf->job.resp, NULL);
        if (st == NULL && g->responses == 1 && g->failed != NULL) { /* its own error, not a count */
            st = g->failed;
            g->failed = NULL;
        }
        if (st == NULL && (g->responses != 1 || g->only == NULL))
            st = not_one_response();
        if (st != NULL) {
            respond_error(r, st);
        } else {
            oi_iov_t part = {g->only->data, g->only->len, g->only};
            g->only = NULL;
            oi_http_respond(r, 200, JSON_HEADERS, &part, 1);
        }
    }
    gen_free(g);
    oi_infer_trace_end(inf, send_start);
    oi_infer_free(inf);
}

static void on_gone(oi_http_request_t *r)
{
    oi_infer_cancel(r->gone_arg);
}

void oi__http_generate(oi_server_t *s, oi_http_request_t *r, oi_model_t *m, int stream)
{
    oi_status_t *st = oi_model_check_ready(m);
    if (st == NULL && r->content_encoding[0] != '\0' && strcmp(r->content_encoding, "identity") != 0)
        st = oi_status_new(OI_BAD_REQUEST, "Unsupported content-encoding, only 'identity' is supported.");
    oi_sbuf_t v2 = {0};
    if (st == NULL)
        st = oi_generate_request(r->body ? r->body->data : "", r->body ? r->body->len : 0, m->inputs, m->n_inputs, &v2);
    oi_buf_t *body = st == NULL ? oi_sbuf_detach(&v2) : NULL;
    oi_sbuf_free(&v2);
    oi_infer_t *inf = st == NULL ? oi_infer_new() : NULL;
    gen_t *g = inf != NULL ? calloc(1, sizeof(*g)) : NULL;
    if (st == NULL && (body == NULL || g == NULL))
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL) {
        oi_json_limits_t limits = {s->cfg.max_json_depth};
        st = oi_json_decode_infer_request(body, body->len, &inf->req, &limits);
    }
    oi_buf_unref(body);
    if (st == NULL) {
        g->r = r;
        g->stream = stream;
        inf->count_stats = s->cfg.statistics;
        if (m->decoupled)
            inf->part = on_part;
        /* Traced as /infer is (a stream's send points: its last response's). */
        if (s->tracer != NULL)
            (void)oi_infer_trace_begin(inf, s->tracer, m, 0, r->start_ns, oi_now_ns()); /* no memory: untraced */
        st = oi_infer_submit(inf, m, r->loop, on_done, g); /* takes m */
        m = NULL;
        if (st == NULL) {
            r->on_gone = on_gone;
            r->gone_arg = inf;
            return;
        }
    }
    oi_model_unref(m);
    free(g);
    oi_infer_free(inf);
    respond_error(r, st);
}
