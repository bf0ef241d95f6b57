/* OpenAI's API under /v1: /v1/models, /v1/completions and /v1/chat/completions over models that
 * follow Triton's LLM conventions (a STRING text_input and text_output; stream,
 * sampling_parameters, exclude_input_in_output and the return_* flags where declared, as
 * Triton's vLLM backend takes them). A request is read by codec/openai.c, mapped through the
 * generate extension's flat form onto the model's declared inputs, and submitted as /infer's
 * are; each response the model produces becomes a chunk here, on the loop thread, with no
 * Python call. Only a chat request's template runs in Python, once, on a worker thread. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <llhttp.h>

#include "codec/generate.h"
#include "codec/json.h"
#include "codec/openai.h"
#include "codec/openai_logprobs.h"
#include "server/infer.h"
#include "server/server_impl.h"

/* Appends a string literal (its length counted by the compiler). */
#define LIT(out, s) oi_sbuf_append((out), (s), sizeof(s) - 1)

#define JSON_HEADERS "Content-Type: application/json\r\n"
#define SSE_HEADERS "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
/* The most an unstreamed answer gathers (its text and log probabilities): a decoupled model
 * that streams anyway is stopped there rather than filling the server's memory. */
#define MAX_UNSTREAMED_TEXT ((size_t)64 << 20)

/* ---- errors -------------------------------------------------------------------------------- */

/* OpenAI's error type for a status code. */
static const char *error_type(int code)
{
    switch (code) {
    case 400: case 404: case 405: case 413: case 415: return "invalid_request_error";
    case 401: case 403: return "authentication_error";
    case 503: return "service_unavailable";
    default: return code >= 500 ? "server_error" : "invalid_request_error";
    }
}

static void respond_error(oi_http_request_t *r, int code, const char *message, const char *param, const char *ecode)
{
    oi_sbuf_t body = {0};
    oi_buf_t *b = oi_openai_encode_error(&body, message, error_type(code), param, ecode) == 0 ? oi_sbuf_detach(&body)
                                                                                             : NULL;
    oi_sbuf_free(&body);
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    oi_iov_t part = b ? (oi_iov_t){b->data, b->len, b} : (oi_iov_t){oom, sizeof(oom) - 1, NULL};
    oi_http_respond(r, b ? code : 500, JSON_HEADERS, &part, 1);
}

/* Answers `st` (freed) as OpenAI's error body. */
static void respond_status(oi_http_request_t *r, oi_status_t *st, const char *param)
{
    respond_error(r, st->code, st->message, param, NULL);
    oi_status_free(st);
}

static void respond_json(oi_http_request_t *r, oi_sbuf_t *body)
{
    oi_buf_t *b = oi_sbuf_detach(body);
    oi_sbuf_free(body);
    if (b == NULL) {
        respond_error(r, 500, "out of memory", NULL, NULL);
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_http_respond(r, 200, JSON_HEADERS, &part, 1);
}

static void model_not_found(oi_http_request_t *r, const char *name)
{
    char msg[400];
    snprintf(msg, sizeof(msg), "The model `%.300s` does not exist.", name);
    respond_error(r, 404, msg, "model", "model_not_found");
}

/* ---- which models answer -------------------------------------------------------------------- */

static const oi_io_spec_t *find_spec(const oi_io_spec_t *specs, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

/* The model's name for the conventions' tensor `convention` (its config.pbtxt's
 * openai_<convention> parameter), else the convention's own. */
static const char *named(const oi_model_t *m, const char *convention)
{
    for (uint32_t i = 0; i < m->n_openai_names; i++)
        if (strcmp(m->openai_names[2 * i], convention) == 0)
            return m->openai_names[2 * i + 1];
    return convention;
}

static const oi_io_spec_t *input_spec(const oi_model_t *m, const char *convention)
{
    return find_spec(m->inputs, m->n_inputs, named(m, convention));
}

static const oi_io_spec_t *output_spec(const oi_model_t *m, const char *convention)
{
    return find_spec(m->outputs, m->n_outputs, named(m, convention));
}

static int has_input(const oi_model_t *m, const char *convention) { return input_spec(m, convention) != NULL; }

static int has_output(const oi_model_t *m, const char *convention) { return output_spec(m, convention) != NULL; }

/* A model that gives log probabilities as Triton's vLLM backend does: asked by its
 * return_logprobs input and sampling_parameters' "logprobs", given as a STRING logprobs output. */
static int gives_logprobs(const oi_model_t *m)
{
    const oi_io_spec_t *out = output_spec(m, "logprobs");
    return has_input(m, "return_logprobs") && has_input(m, "sampling_parameters") && out != NULL &&
           out->dtype == OI_TYPE_BYTES;
}

/* A text model by Triton's LLM conventions. */
static int is_text_model(const oi_model_t *m)
{
    const oi_io_spec_t *in = input_spec(m, "text_input");
    const oi_io_spec_t *out = output_spec(m, "text_output");
    return in != NULL && out != NULL && in->dtype == OI_TYPE_BYTES && out->dtype == OI_TYPE_BYTES;
}

/* A model that gives embeddings: text_input in, an FP32 "embedding" out. */
static int is_embedding_model(const oi_model_t *m)
{
    const oi_io_spec_t *in = input_spec(m, "text_input");
    const oi_io_spec_t *out = output_spec(m, "embedding");
    return in != NULL && out != NULL && in->dtype == OI_TYPE_BYTES && out->dtype == OI_TYPE_FP32;
}

/* The models /v1/models lists: those that answer one of the endpoints. */
static int answers(const oi_model_t *m) { return is_text_model(m) || is_embedding_model(m); }

/* The Unix time the server started: what a model's "created" says (versions carry no wall time). */
static int64_t started_at(const oi_server_t *s)
{
    return (int64_t)time(NULL) - (int64_t)((oi_now_ns() - s->start_ns) / 1000000000u);
}

typedef struct list_s {
    oi_sbuf_t *out;
    int64_t created;
    int n, bad;
    const char *last; /* the name written last: versions of one model come together */
} list_t;

static int write_model(list_t *l, const char *name)
{
    return LIT(l->out, "{\"id\":") || oi_json_write_string(l->out, name, strlen(name)) ||
           oi_sbuf_printf(l->out, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"openinfer\"}",
                          (long long)l->created);
}

static int list_one(void *ctx, oi_model_t *m)
{
    list_t *l = ctx;
    if (!answers(m) || (l->last != NULL && strcmp(l->last, m->name) == 0))
        return 0;
    l->bad |= (l->n++ > 0 && LIT(l->out, ",")) || write_model(l, m->name);
    l->last = m->name;
    return 0;
}

static void list_models(oi_server_t *s, oi_http_request_t *r)
{
    oi_sbuf_t body = {0};
    list_t l = {&body, started_at(s), 0, 0, NULL};
    l.bad = LIT(&body, "{\"object\":\"list\",\"data\":[");
    oi_registry_visit_ready(&s->registry, NULL, list_one, &l);
    if (l.bad || LIT(&body, "]}") != 0)
        body.len = 0, l.bad = 1;
    if (l.bad) {
        oi_sbuf_free(&body);
        respond_error(r, 500, "out of memory", NULL, NULL);
        return;
    }
    respond_json(r, &body);
}

static void show_model(oi_server_t *s, oi_http_request_t *r, const char *name)
{
    oi_status_t *err = NULL;
    oi_model_t *m = oi_registry_find(&s->registry, name, NULL, &err);
    oi_status_free(err);
    if (m == NULL || m->error != NULL || !answers(m)) {
        oi_model_unref(m);
        model_not_found(r, name);
        return;
    }
    oi_sbuf_t body = {0};
    list_t l = {&body, started_at(s), 0, 0, NULL};
    int bad = write_model(&l, m->name);
    oi_model_unref(m);
    if (bad) {
        oi_sbuf_free(&body);
        respond_error(r, 500, "out of memory", NULL, NULL);
        return;
    }
    respond_json(r, &body);
}

/* ---- completions --------------------------------------------------------------------------- */

/* One completion request from its body to its last chunk. */
typedef struct oai_s {
    oi_work_t work; /* chat: the template's rendering */
    oi_server_t *s;
    oi_http_request_t *r;
    oi_model_t *m;     /* until submitted */
    oi_buf_t *body;    /* the request's body: req.messages points into it */
    oi_openai_request_t req;
    oi_sbuf_t prompt;  /* chat: the rendered prompt (completions: req.prompt) */
    oi_status_t *render_st;
    char id[48];
    oi_openai_meta_t meta;
    int started;       /* the stream's head is out */
    int finished;      /* a chunk carried a finish reason */
    int overflow;      /* the unstreamed answer passed MAX_UNSTREAMED_TEXT: the request was cancelled */
    oi_sbuf_t text;    /* unstreamed: the text so far */
    oi_openai_logprobs_t lp;   /* asked: the log probabilities not yet written */
    oi_status_t *model_error;  /* the model's logprobs were missing or malformed: the request fails */
    char finish[16];   /* the model's finish reason, when it gives one */
} oai_t;

static void oai_free(oai_t *g)
{
    oi_model_unref(g->m);
    oi_buf_unref(g->body);
    oi_openai_request_free(&g->req);
    oi_sbuf_free(&g->prompt);
    oi_status_free(g->render_st);
    oi_sbuf_free(&g->text);
    oi_openai_logprobs_free(&g->lp);
    oi_status_free(g->model_error);
    free(g);
}

/* The STRING output's element at *off (its 4-byte length, then its bytes), *off moved past
 * it; -1 when no whole element is left. */
static int next_string(const oi_tensor_t *t, size_t *off, const char **s, size_t *len)
{
    uint32_t n;
    if (t->data == NULL || *off + 4 > t->byte_size)
        return -1;
    memcpy(&n, t->data + *off, 4);
    if (n > t->byte_size - *off - 4)
        return -1;
    *s = t->data + *off + 4;
    *len = n;
    *off += 4 + (size_t)n;
    return 0;
}

/* The text of a STRING output's elements, one after the other. */
static int append_text(oi_sbuf_t *to, const oi_tensor_t *t)
{
    const char *s;
    size_t len, off = 0;
    while (next_string(t, &off, &s, &len) == 0)
        if (oi_sbuf_append(to, s, len) != 0)
            return -1;
    return 0;
}

/* The response's output for the conventions' tensor `convention`, by the model's name for it. */
static const oi_tensor_t *output(const oi_model_t *m, const oi_response_t *resp, const char *convention)
{
    const char *name = named(m, convention);
    for (uint32_t i = 0; i < resp->n_outputs; i++)
        if (strcmp(resp->outputs[i].name, name) == 0)
            return &resp->outputs[i];
    return NULL;
}

/* A count output's first element (num_input_tokens, num_output_tokens), or -1. */
static int64_t count_of(const oi_model_t *m, const oi_response_t *resp, const char *convention)
{
    const oi_tensor_t *t = output(m, resp, convention);
    if (t == NULL || t->data == NULL)
        return -1;
    switch (t->dtype) {
    case OI_TYPE_UINT32:
    case OI_TYPE_INT32: {
        uint32_t v;
        if (t->byte_size < 4)
            return -1;
        memcpy(&v, t->data, 4);
        return t->dtype == OI_TYPE_INT32 ? (int64_t)(int32_t)v : (int64_t)v;
    }
    case OI_TYPE_UINT64:
    case OI_TYPE_INT64: {
        int64_t v;
        if (t->byte_size < 8)
            return -1;
        memcpy(&v, t->data, 8);
        return v;
    }
    default:
        return -1;
    }
}

/* Sends an event; `part` (may be NULL): the model's response it came from, whose credit
 * against the decoupled bound comes back once the event is written, so that a client that
 * does not read holds the model back. */
static void send_event(oai_t *g, oi_sbuf_t *ev, oi_infer_part_t *part)
{
    oi_buf_t *b = oi_sbuf_detach(ev);
    oi_sbuf_free(ev);
    if (b == NULL)
        return; /* out of memory: the chunk is lost, the stream goes on */
    if (!g->started) {
        g->started = 1;
        oi_http_stream_start(g->r, 200, SSE_HEADERS);
    }
    oi_iov_t iov = {b->data, b->len, b};
    if (part != NULL)
        oi_infer_part_hold(part, &iov);
    oi_http_stream_send(g->r, &iov, 1);
}

/* Adds the response's log probabilities (its text: text_len bytes) to g->lp. Text without
 * them, or them malformed, fails the request: g->model_error says why. */
static void add_logprobs(oai_t *g, const oi_model_t *m, const oi_response_t *resp, size_t text_len)
{
    const oi_tensor_t *t = output(m, resp, "logprobs");
    const char *json;
    size_t len;
    int none = 1;
    oi_status_t *st = NULL;
    size_t first = 0;
    if (t != NULL && t->dtype == OI_TYPE_BYTES && next_string(t, &first, &json, &len) == 0)
        st = oi_openai_logprobs_add(&g->lp, json, len, &none);
    if (st == NULL && none && text_len > 0)
        st = oi_status_new(OI_INTERNAL, "the response has text but no log probabilities (the output is missing, "
                           "empty or null although return_logprobs was sent)");
    if (st != NULL) {
        g->model_error = oi_status_new(OI_INTERNAL, "model '%s' gave a bad '%s' output: %s", m->name,
                                       named(m, "logprobs"), st->message);
        oi_status_free(st);
    }
}

/* One response of the model: its text, log probabilities, counts and finish reason (`part`:
 * NULL for a model of one response). */
static void on_response(oai_t *g, const oi_model_t *m, const oi_response_t *resp, oi_infer_part_t *part)
{
    if (g->model_error != NULL)
        return; /* failed: the request is being cancelled */
    const oi_tensor_t *t = output(m, resp, "text_output");
    int64_t in = count_of(m, resp, "num_input_tokens"), out = count_of(m, resp, "num_output_tokens");
    if (in >= 0)
        g->meta.prompt_tokens = in;
    if (out >= 0)
        g->meta.completion_tokens = (g->meta.completion_tokens < 0 ? 0 : g->meta.completion_tokens) + out;
    const oi_tensor_t *why = output(m, resp, "finish_reason");
    oi_sbuf_t reason = {0};
    if (why != NULL && append_text(&reason, why) == 0 && reason.len > 0 && reason.len < sizeof(g->finish)) {
        memcpy(g->finish, reason.data, reason.len);
        g->finish[reason.len] = '\0';
    }
    oi_sbuf_free(&reason);
    /* Unstreamed, the text gathers in g->text; streamed, each response's is its chunk's. */
    oi_sbuf_t piece = {0}, *text = g->req.stream ? &piece : &g->text;
    size_t before = text->len;
    if (t != NULL)
        (void)append_text(text, t); /* out of memory: the answer is short */
    if (g->req.logprobs)
        add_logprobs(g, m, resp, text->len - before);
    int final = g->finish[0] != '\0';
    if (g->req.stream && g->model_error == NULL && (piece.len > 0 || g->lp.n > 0 || final || !g->started)) {
        oi_sbuf_t ev = {0};
        if (oi_openai_encode_chunk(&ev, &g->meta, piece.data ? piece.data : "", piece.len,
                                   g->lp.n > 0 ? &g->lp : NULL, !g->started, final ? g->finish : NULL,
                                   g->req.include_usage) == 0)
            send_event(g, &ev, part);
        oi_sbuf_free(&ev);
        oi_openai_logprobs_clear(&g->lp);
        g->finished |= final;
    }
    oi_sbuf_free(&piece);
}

static void on_part(oi_infer_t *inf, oi_infer_part_t *part)
{
    oai_t *g = inf->ctx;
    on_response(g, inf->model, &part->resp, part);
    int overflow = !g->req.stream && g->text.len + oi_openai_logprobs_size(&g->lp) > MAX_UNSTREAMED_TEXT;
    if ((overflow || g->model_error != NULL) && !inf->cancelled) {
        g->overflow = overflow;
        oi_infer_cancel(inf);
    }
}

/* The finish reason when the model gives none: "length" when it produced max_tokens. */
static const char *finish_reason(const oai_t *g)
{
    if (g->finish[0] != '\0')
        return g->finish;
    return g->req.max_tokens > 0 && g->meta.completion_tokens >= g->req.max_tokens ? "length" : "stop";
}

static void end_stream(oai_t *g, oi_status_t *st)
{
    oi_sbuf_t ev = {0};
    int bad = 0;
    if (st != NULL)
        bad = LIT(&ev, "data: ") ||
              oi_openai_encode_error(&ev, st->message, error_type(st->code), NULL, NULL) ||
              LIT(&ev, "\n\n");
    else if (!g->finished)
        bad = oi_openai_encode_chunk(&ev, &g->meta, "", 0, NULL, !g->started, finish_reason(g),
                                     g->req.include_usage);
    if (!bad && st == NULL && g->req.include_usage)
        bad = oi_openai_encode_usage_chunk(&ev, &g->meta);
    if (!bad && LIT(&ev, "data: [DONE]\n\n") == 0)
        send_event(g, &ev, NULL);
    oi_sbuf_free(&ev);
    oi_http_stream_end(g->r);
}

/* The end of the request, on its loop thread. */
static void on_done(oi_infer_t *inf)
{
    oai_t *g = inf->ctx;
    oi_http_request_t *r = g->r;
    uint64_t send_start = inf->trace != NULL ? oi_now_ns() : 0;
    oi_status_t *st = inf->job.status;
    inf->job.status = NULL;
    if (st == NULL && inf->ds == NULL) /* a model of one response */
        on_response(g, inf->model, &inf->job.resp, NULL);
    int failed = g->model_error != NULL;
    if (failed) { /* what the request ends with: its cancellation's status says less */
        oi_status_free(st);
        st = g->model_error;
        g->model_error = NULL;
    }
    if (g->overflow) {
        oi_status_free(st);
        respond_error(r, 500, "the model's answer passed 64 MiB; ask for it with \"stream\": true", NULL, NULL);
    } else if (inf->cancelled && !failed) { /* the client is gone: nothing more to say */
        if (g->started)
            oi_http_stream_end(r);
        else
            oi_http_respond(r, OI_CLIENT_CLOSED, "", NULL, 0);
        oi_status_free(st);
    } else if (g->started) {
        end_stream(g, st);
        oi_status_free(st);
    } else if (st != NULL) {
        respond_status(r, st, NULL);
    } else if (g->req.stream) {
        end_stream(g, NULL);
    } else {
        oi_sbuf_t body = {0};
        if (oi_openai_encode_completion(&body, &g->meta, g->text.data ? g->text.data : "", g->text.len,
                                        g->req.logprobs ? &g->lp : NULL, finish_reason(g)) != 0)
            body.len = 0;
        respond_json(r, &body);
    }
    oai_free(g);
    oi_infer_trace_end(inf, send_start);
    oi_infer_free(inf);
}

static void on_gone(oi_http_request_t *r)
{
    oi_infer_cancel(r->gone_arg);
}

/* Appends "name":<value> to the flat request when the model declares input `name`. */
static int flat_member(oi_sbuf_t *flat, const oi_model_t *m, const char *convention, const char *value, size_t n,
                       int quote)
{
    if (!has_input(m, convention))
        return 0;
    const char *name = named(m, convention);
    return (flat->len > 1 && LIT(flat, ",")) || oi_json_write_string(flat, name, strlen(name)) || LIT(flat, ":") ||
           (quote ? oi_json_write_string(flat, value, n) : oi_sbuf_append(flat, value, n));
}

/* The generate extension's flat request for the model: the prompt and the conventions' flags. */
static oi_status_t *flat_request(const oai_t *g, const char *prompt, size_t len, oi_sbuf_t *flat)
{
    const oi_model_t *m = g->m;
    const oi_openai_request_t *q = &g->req;
    const char *sampling = q->sampling.len ? q->sampling.data : "{}";
    size_t sampling_len = q->sampling.len ? q->sampling.len : 2;
    int exclude = q->kind == OI_OPENAI_CHAT || !q->echo;
    int bad = LIT(flat, "{") || flat_member(flat, m, "text_input", prompt, len, 1) ||
              flat_member(flat, m, "stream", q->stream ? "true" : "false", q->stream ? 4 : 5, 0) ||
              flat_member(flat, m, "sampling_parameters", sampling, sampling_len, 1) ||
              flat_member(flat, m, "exclude_input_in_output", exclude ? "true" : "false", exclude ? 4 : 5, 0) ||
              flat_member(flat, m, "return_finish_reason", "true", 4, 0) ||
              flat_member(flat, m, "return_num_input_tokens", "true", 4, 0) ||
              flat_member(flat, m, "return_num_output_tokens", "true", 4, 0) ||
              (q->logprobs && flat_member(flat, m, "return_logprobs", "true", 4, 0)) || LIT(flat, "}");
    return bad ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
}

static void on_embedded(oi_infer_t *inf);

/* Submits the request made of `flat` (the generate extension's form; `st`: why it could not
 * be made) and answers on failure. Frees g unless submitted. */
static void submit(oai_t *g, oi_sbuf_t *flat, oi_status_t *st)
{
    oi_http_request_t *r = g->r;
    oi_sbuf_t v2 = {0};
    if (st == NULL)
        st = oi_generate_request(flat->data, flat->len, g->m->inputs, g->m->n_inputs, &v2);
    oi_sbuf_free(flat);
    oi_buf_t *body = st == NULL ? oi_sbuf_detach(&v2) : NULL;
    oi_sbuf_free(&v2);
    oi_infer_t *inf = st == NULL ? oi_infer_new() : NULL;
    if (st == NULL && (body == NULL || inf == NULL))
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL) {
        oi_json_limits_t limits = {g->s->cfg.max_json_depth};
        st = oi_json_decode_infer_request(body, body->len, &inf->req, &limits);
    }
    oi_buf_unref(body);
    if (st == NULL) {
        inf->count_stats = g->s->cfg.statistics;
        if (g->m->decoupled)
            inf->part = on_part;
        /* Traced as /infer is (a stream's send points: its last response's). */
        if (g->s->tracer != NULL)
            (void)oi_infer_trace_begin(inf, g->s->tracer, g->m, 0, r->start_ns, oi_now_ns()); /* no memory: untraced */
        oi_model_t *m = g->m;
        g->m = NULL;
        st = oi_infer_submit(inf, m, r->loop, g->req.kind == OI_OPENAI_EMBEDDING ? on_embedded : on_done, g);
        if (st == NULL) {
            r->on_gone = on_gone;
            r->gone_arg = inf;
            return;
        }
    }
    oi_infer_free(inf);
    oai_free(g);
    respond_status(r, st, NULL);
}

static void submit_prompt(oai_t *g, const char *prompt, size_t len)
{
    oi_sbuf_t flat = {0};
    oi_status_t *st = flat_request(g, prompt, len, &flat);
    submit(g, &flat, st);
}

static void render_run(oi_work_t *w)
{
    oai_t *g = (oai_t *)w;
    g->render_st = g->s->chat_fn(g->s->chat_ctx, g->m->name, g->m->version, g->req.messages.ptr,
                                 g->req.messages.len, &g->prompt);
}

static void render_done(oi_work_t *w)
{
    oai_t *g = (oai_t *)w;
    if (g->render_st == NULL && atomic_load(&g->s->stopping))
        g->render_st = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    if (g->render_st != NULL) {
        oi_status_t *st = g->render_st;
        g->render_st = NULL;
        oi_http_request_t *r = g->r;
        oai_free(g);
        respond_status(r, st, st->code == OI_BAD_REQUEST ? "messages" : NULL);
        return;
    }
    submit_prompt(g, g->prompt.data ? g->prompt.data : "", g->prompt.len);
}

/* What the model cannot honour of the request, refused by name. */
static oi_status_t *check_model(const oi_model_t *m, const oi_openai_request_t *q, const char **param)
{
    if (q->logprobs && !gives_logprobs(m)) {
        *param = "logprobs";
        return oi_status_new(OI_BAD_REQUEST, "Unsupported parameter: model '%s' gives no log probabilities (it has "
                             "no return_logprobs input, STRING logprobs output and sampling_parameters input).",
                             m->name);
    }
    if (q->sampling_first != NULL && !has_input(m, "sampling_parameters")) {
        *param = q->sampling_first;
        return oi_status_new(OI_BAD_REQUEST, "Unsupported parameter: model '%s' takes no sampling parameters (it "
                             "has no sampling_parameters input), so '%s' cannot be honoured.", m->name, *param);
    }
    if (q->echo && !has_input(m, "exclude_input_in_output")) {
        *param = "echo";
        return oi_status_new(OI_BAD_REQUEST, "Unsupported parameter: model '%s' cannot echo the prompt (it has no "
                             "exclude_input_in_output input).", m->name);
    }
    if (q->include_usage && (!has_output(m, "num_input_tokens") || !has_output(m, "num_output_tokens"))) {
        *param = "stream_options";
        return oi_status_new(OI_BAD_REQUEST, "Unsupported parameter: model '%s' does not count tokens (it has no "
                             "num_input_tokens and num_output_tokens outputs), so it cannot report usage.", m->name);
    }
    return oi_model_check_ready(m);
}

/* The embeddings of the request's strings: the model's "embedding" output, one row each. */
static void on_embedded(oi_infer_t *inf)
{
    oai_t *g = inf->ctx;
    oi_http_request_t *r = g->r;
    uint64_t send_start = inf->trace != NULL ? oi_now_ns() : 0;
    oi_status_t *st = inf->job.status;
    inf->job.status = NULL;
    const oi_tensor_t *e = st == NULL ? output(inf->model, &inf->job.resp, "embedding") : NULL;
    size_t n = g->req.n_inputs, count = e != NULL ? e->byte_size / 4 : 0;
    if (st == NULL && (e == NULL || e->dtype != OI_TYPE_FP32 || count == 0 || count % n != 0))
        st = oi_status_new(OI_INTERNAL, "model '%s' gave no FP32 'embedding' of one row per input (%zu inputs, "
                           "%zu values)", inf->model->name, n, count);
    if (inf->cancelled) {
        oi_status_free(st);
        oi_http_respond(r, OI_CLIENT_CLOSED, "", NULL, 0);
    } else if (st != NULL) {
        respond_status(r, st, NULL);
    } else {
        oi_sbuf_t body = {0};
        if (oi_openai_encode_embeddings(&body, inf->model->name, e->data, n, count / n, g->req.base64,
                                        count_of(inf->model, &inf->job.resp, "num_input_tokens")) != 0)
            body.len = 0;
        respond_json(r, &body);
    }
    oai_free(g);
    oi_infer_trace_end(inf, send_start);
    oi_infer_free(inf);
}

/* What the model cannot honour of an embeddings request. */
static oi_status_t *check_embedder(const oi_model_t *m, const char **param)
{
    *param = "model";
    if (!is_embedding_model(m))
        return oi_status_new(OI_BAD_REQUEST, "model '%s' gives no embeddings (it has no FP32 'embedding' output)",
                             m->name);
    if (m->decoupled)
        return oi_status_new(OI_BAD_REQUEST, "model '%s' is decoupled: embeddings come from a model of one response",
                             m->name);
    *param = NULL;
    return oi_model_check_ready(m);
}

/* The embeddings request for the model: its strings as text_input. */
static void submit_embedding(oai_t *g)
{
    oi_sbuf_t flat = {0};
    int bad = LIT(&flat, "{") || flat_member(&flat, g->m, "text_input", g->req.input.ptr, g->req.input.len, 0) ||
              flat_member(&flat, g->m, "return_num_input_tokens", "true", 4, 0) || LIT(&flat, "}");
    submit(g, &flat, bad ? oi_status_new(OI_INTERNAL, "out of memory") : NULL);
}

/* /v1/completions, /v1/chat/completions and /v1/embeddings: read, checked against the model,
 * then submitted (a chat's prompt rendered first). */
static void start(oi_server_t *s, oi_http_request_t *r, oi_openai_kind_t kind)
{
    oai_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        respond_error(r, 500, "out of memory", NULL, NULL);
        return;
    }
    g->s = s;
    g->r = r;
    g->body = r->body ? oi_buf_ref(r->body) : NULL;
    if (r->content_encoding[0] != '\0' && strcmp(r->content_encoding, "identity") != 0) {
        oai_free(g);
        respond_error(r, 415, "Unsupported Content-Encoding: only identity is accepted here.", NULL, NULL);
        return;
    }
    oi_status_t *st = oi_openai_parse(g->body ? g->body->data : "", g->body ? g->body->len : 0, kind, &g->req);
    g->lp = (oi_openai_logprobs_t){.kind = kind, .top = g->req.top_logprobs};
    if (st != NULL) {
        respond_status(r, st, g->req.param);
        oai_free(g);
        return;
    }
    oi_status_t *err = NULL;
    g->m = oi_registry_find(&s->registry, g->req.model, NULL, &err);
    oi_status_free(err);
    if (g->m == NULL || !answers(g->m)) {
        model_not_found(r, g->req.model);
        oai_free(g);
        return;
    }
    const char *param = NULL;
    if (kind == OI_OPENAI_EMBEDDING)
        st = check_embedder(g->m, &param);
    else if (!is_text_model(g->m))
        st = oi_status_new(OI_BAD_REQUEST, "model '%s' is not a text model (it has no STRING text_output)",
                           (param = "model", g->m->name));
    else
        st = check_model(g->m, &g->req, &param);
    if (st == NULL && kind == OI_OPENAI_CHAT && s->chat_fn == NULL) {
        param = "model";
        st = oi_status_new(OI_BAD_REQUEST, "model '%s' has no chat template here; use /v1/completions", g->m->name);
    }
    if (st != NULL) {
        respond_status(r, st, param);
        oai_free(g);
        return;
    }
    uint64_t seq = (uint64_t)(uintptr_t)g ^ oi_now_ns();
    snprintf(g->id, sizeof(g->id), "%s%016llx", kind == OI_OPENAI_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)seq);
    g->meta = (oi_openai_meta_t){kind, g->id, (int64_t)time(NULL), g->m->name, -1, -1};
    if (kind == OI_OPENAI_EMBEDDING) {
        submit_embedding(g);
    } else if (kind == OI_OPENAI_COMPLETION) {
        submit_prompt(g, g->req.prompt.data ? g->req.prompt.data : "", g->req.prompt.len);
    } else {
        /* The template is Python (Jinja): off the loop, on libuv's worker threads. */
        g->work = (oi_work_t){.run = render_run, .done = render_done};
        if (oi_loop_work(r->loop, &g->work) != 0) {
            oai_free(g);
            respond_error(r, 503, "cannot render the chat template: no worker thread", NULL, NULL);
        }
    }
}

/* ---- routing ------------------------------------------------------------------------------- */

static void method_not_allowed(oi_http_request_t *r, const char *allowed)
{
    char msg[400];
    snprintf(msg, sizeof(msg), "Method %s is not allowed for %.300s; use %s.",
             llhttp_method_name((llhttp_method_t)r->method), r->path, allowed);
    respond_error(r, 405, msg, NULL, NULL);
}

static const char *captured_header(const void *r, int i, size_t *len) { return oi_http_request_header(r, i, len); }

/* The restricted group "openai" (--openai-api-key restricts it to "Authorization: Bearer
 * KEY"): answers as OpenAI does (401, an API key) or as the other groups (403, another
 * header) and returns 1 when the request may not pass. */
static int refuse_unauthorized(oi_server_t *s, oi_http_request_t *r)
{
    const oi_restricted_t *t = &s->http_restricted;
    if (!oi_restricted_any(t) || oi_restricted_refuses(t, OI_API_BIT(OI_API_OPENAI), captured_header, r) < 0)
        return 0;
    if (strcasecmp(t->header[OI_API_OPENAI], "authorization") != 0) {
        char msg[400];
        snprintf(msg, sizeof(msg), "This API is restricted, expecting header '%.300s'", t->header[OI_API_OPENAI]);
        respond_error(r, 403, msg, NULL, NULL);
    } else if (oi_http_request_header(r, t->slot[OI_API_OPENAI], &(size_t){0}) == NULL) {
        respond_error(r, 401, "You didn't provide an API key. You need to provide your API key in an Authorization "
                      "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).", NULL, NULL);
    } else {
        respond_error(r, 401, "Incorrect API key provided.", NULL, "invalid_api_key");
    }
    return 1;
}

void oi__http_openai(oi_server_t *s, oi_http_request_t *r)
{
    const char *p = r->path + 3; /* past "/v1" */
    if (refuse_unauthorized(s, r))
        return;
    int get = r->method == HTTP_GET || r->method == HTTP_HEAD;
    if (strcmp(p, "/models") == 0 || strncmp(p, "/models/", 8) == 0) {
        char name[256];
        if (!get)
            method_not_allowed(r, "GET");
        else if (p[7] == '\0')
            list_models(s, r);
        else if (oi__http_decode_segment(p + 8, p + strlen(p), name, sizeof(name)) != 0)
            model_not_found(r, p + 8);
        else
            show_model(s, r, name);
        return;
    }
    int chat = strcmp(p, "/chat/completions") == 0, embed = strcmp(p, "/embeddings") == 0;
    if (chat || embed || strcmp(p, "/completions") == 0) {
        if (r->method != HTTP_POST)
            method_not_allowed(r, "POST");
        else
            start(s, r, chat ? OI_OPENAI_CHAT : embed ? OI_OPENAI_EMBEDDING : OI_OPENAI_COMPLETION);
        return;
    }
    char msg[400];
    snprintf(msg, sizeof(msg), "Invalid URL (%s %.300s)", llhttp_method_name((llhttp_method_t)r->method), r->path);
    respond_error(r, 404, msg, NULL, NULL);
}
