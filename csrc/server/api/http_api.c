/* The V2 REST API over the HTTP/1.1 transport: routing, JSON bodies, binary tensor data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "codec/compress.h"
#include "codec/json.h"
#include "server/infer.h"
#include "server/shm/shm_body.h"
#include "server/server_impl.h"
#include "server/observe/statistics.h"

#define JSON_HEADERS "Content-Type: application/json\r\n"
#define MAX_NAME 256

/* ---- small responses ---------------------------------------------------------------------- */

static void respond_sbuf(oi_http_request_t *r, int status, const char *headers, oi_sbuf_t *body)
{
    oi_buf_t *b = oi_sbuf_detach(body);
    if (b == NULL) {
        oi_sbuf_free(body);
        static const char oom[] = "{\"error\":\"out of memory\"}";
        oi_iov_t part = {oom, sizeof(oom) - 1, NULL};
        oi_http_respond(r, 500, JSON_HEADERS, &part, 1);
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_http_respond(r, status, headers, &part, 1);
}

static void respond_error(oi_http_request_t *r, int status, const char *message)
{
    oi_sbuf_t body = {0};
    oi_json_encode_error(&body, message);
    respond_sbuf(r, status, JSON_HEADERS, &body);
}

/* Answers with a status's code and message, and frees it. */
static void respond_status(oi_http_request_t *r, oi_status_t *st)
{
    respond_error(r, OI_HTTP_STATUS(st->code), st->message);
    oi_status_free(st);
}

static void respond_static(oi_http_request_t *r, int status, const char *json)
{
    oi_iov_t part = {json, strlen(json), NULL};
    oi_http_respond(r, status, JSON_HEADERS, &part, 1);
}

static void respond_buf(oi_http_request_t *r, oi_buf_t *b)
{
    oi_iov_t part = {b->data, b->len, oi_buf_ref(b)};
    oi_http_respond(r, 200, JSON_HEADERS, &part, 1);
}

/* ---- inference ---------------------------------------------------------------------------- */

/* Which outputs go binary: per output "binary_data", else the request's "binary_data_output".
 * Fills `binary` (one flag per output); returns whether any is set. */
static int pick_binary(const oi_request_t *req, const oi_response_t *resp, uint8_t *binary)
{
    int any = 0;
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        binary[i] = (uint8_t)(!resp->outputs[i].shm && oi_json_output_is_binary(req, resp->outputs[i].name) != 0);
        any |= binary[i];
    }
    return any;
}

/* A response being compressed on a worker thread (oi_loop_work): the parts stay alive through
 * their owner references until the compressed copy is written. */
typedef struct deflate_work_s {
    oi_work_t work;
    oi_http_request_t *r; /* waits, busy, until done answers it */
    oi_encoding_t enc;
    oi_buf_t *out; /* the compressed body, NULL when out of memory */
    char headers[512];
    size_t n;
    oi_iov_t parts[];
} deflate_work_t;

static void deflate_run(oi_work_t *w)
{
    deflate_work_t *d = (deflate_work_t *)w;
    const char *bases[d->n ? d->n : 1];
    size_t lens[d->n ? d->n : 1];
    for (size_t i = 0; i < d->n; i++) {
        bases[i] = d->parts[i].base;
        lens[i] = d->parts[i].len;
    }
    if (oi_deflate(bases, lens, d->n, d->enc, &d->out) != 0)
        d->out = NULL;
}

static void deflate_done(oi_work_t *w)
{
    deflate_work_t *d = (deflate_work_t *)w;
    for (size_t i = 0; i < d->n; i++)
        oi_buf_unref(d->parts[i].owner);
    if (d->out == NULL) {
        respond_error(d->r, OI_INTERNAL, "out of memory compressing the response");
    } else {
        oi_iov_t part = {d->out->data, d->out->len, d->out};
        oi_http_respond(d->r, 200, d->headers, &part, 1);
    }
    free(d);
}

/* Answers with the parts, compressed into one buffer when the client accepts gzip or
 * deflate (the copy compression forces), else written as they are. Compression runs on a
 * worker thread, so that a large response does not hold up the loop's other connections.
 * Takes the parts' owners. */
static void respond_parts(oi_http_request_t *r, const char *headers, oi_iov_t *parts, size_t n)
{
    oi_encoding_t enc = oi_accept_encoding(r->accept_encoding);
    if (enc == OI_ENCODING_IDENTITY) {
        oi_http_respond(r, 200, headers, parts, n);
        return;
    }
    deflate_work_t *d = malloc(sizeof(*d) + n * sizeof(oi_iov_t));
    if (d != NULL) {
        d->work = (oi_work_t){.run = deflate_run, .done = deflate_done};
        d->r = r;
        d->enc = enc;
        d->out = NULL;
        d->n = n;
        memcpy(d->parts, parts, n * sizeof(oi_iov_t));
        snprintf(d->headers, sizeof(d->headers), "%sContent-Encoding: %s\r\nVary: Accept-Encoding\r\n", headers,
                 enc == OI_ENCODING_GZIP ? "gzip" : "deflate");
        if (oi_loop_work(r->loop, &d->work) == 0)
            return;
        free(d);
    }
    for (size_t i = 0; i < n; i++)
        oi_buf_unref(parts[i].owner);
    respond_error(r, OI_INTERNAL, "cannot compress the response: out of memory");
}

/* On the loop thread: encode and write. The JSON goes first, then each binary output
 * straight from the backend's memory. */
static void finish_infer(oi_infer_t *c)
{
    oi_http_request_t *r = c->ctx;
    if (c->cancelled) { /* the connection is gone: nothing to encode */
        oi_http_respond(r, OI_CLIENT_CLOSED, "", NULL, 0);
        oi_infer_free(c);
        return;
    }
    uint64_t send_start = c->trace != NULL ? oi_now_ns() : 0;
    const oi_response_t *resp = &c->job.resp;
    oi_status_t *st = c->job.status;
    c->job.status = NULL;
    uint8_t *binary = NULL;
    oi_iov_t *parts = NULL;
    oi_sbuf_t json = {0};
    if (st == NULL) {
        binary = malloc(resp->n_outputs + 1);
        parts = malloc((resp->n_outputs + 1) * sizeof(oi_iov_t));
        if (binary == NULL || parts == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
    }
    int any_binary = st == NULL && pick_binary(&c->req, resp, binary);
    if (st == NULL)
        st = oi_json_encode_infer_response(&json, c->model->name, c->model->version_str, &c->req, resp, binary);
    oi_buf_t *head = st == NULL ? oi_sbuf_detach(&json) : NULL;
    if (st == NULL && head == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st != NULL) {
        oi_sbuf_free(&json);
        respond_status(r, st);
    } else {
        size_t n = 0;
        parts[n++] = (oi_iov_t){head->data, head->len, head};
        for (uint32_t i = 0; any_binary && i < resp->n_outputs; i++) {
            const oi_tensor_t *o = &resp->outputs[i];
            if (binary[i])
                parts[n++] = (oi_iov_t){o->data, o->byte_size, o->owner ? oi_buf_ref(o->owner) : NULL};
        }
        char headers[160];
        if (any_binary)
            snprintf(headers, sizeof(headers),
                     "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %zu\r\n", head->len);
        respond_parts(r, any_binary ? headers : JSON_HEADERS, parts, n);
    }
    free(binary);
    free(parts);
    oi_infer_trace_end(c, send_start);
    oi_infer_free(c);
}

/* A raw BYTES body as its one element: the 4-byte length Triton's core prepends, then the body
 * (a copy, charged to `budget`), in t. */
static oi_status_t *raw_bytes_element(oi_buf_t *body, oi_budget_t *budget, oi_tensor_t *t)
{
    if (body->len > UINT32_MAX)
        return oi_status_new(OI_BAD_REQUEST, "raw input '%s': a BYTES element holds at most %u bytes, got %zu",
                             t->name, UINT32_MAX, body->len);
    int over = 0;
    oi_buf_t *b = oi_buf_new_charged(body->len + 4, budget, &over);
    if (b == NULL)
        return over ? oi_budget_refusal(budget, "raw BYTES input", body->len + 4)
                    : oi_status_new(OI_INTERNAL, "out of memory");
    uint32_t n = (uint32_t)body->len;
    memcpy(b->data, &n, 4); /* little-endian, as the binary tensor format has it */
    if (body->len > 0)
        memcpy(b->data + 4, body->data, body->len);
    b->len = body->len + 4;
    t->data = b->data;
    t->byte_size = b->len;
    t->owner = b;
    return NULL;
}

/* The raw binary form (Inference-Header-Content-Length: 0), as Triton's core reads it: the
 * whole body is the data of the model's only input, of the declared shape (a batch dimension
 * counts as 1) with its one variable dimension deduced from the byte size; a BYTES input
 * (declared [1]) takes the body as its one element. Outputs come back in binary, Triton's
 * default for these requests. Errors in Triton's words. */
static oi_status_t *decode_raw(const oi_model_t *m, oi_buf_t *body, oi_budget_t *budget, oi_request_t *req)
{
    if (m->n_inputs != 1)
        return oi_status_new(OI_BAD_REQUEST,
                             "Raw request must only have 1 input (found 1) to be deduced but got %u inputs in '%s' "
                             "model configuration", m->n_inputs, m->name);
    const oi_io_spec_t *spec = &m->inputs[0];
    oi_tensor_t *t = oi_tensor_push(&req->inputs, &req->n_inputs);
    if (t == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    t->name = spec->name;
    t->dtype = spec->dtype;
    req->body = oi_buf_ref(body);
    req->binary_data_output = 1;
    int open_dim = -1;
    int64_t known = 1;
    t->ndim = spec->ndim < 0 ? 1 : spec->ndim;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = spec->ndim < 0 ? -1 : i == 0 && m->max_batch_size > 0 ? 1 : spec->dims[i];
        if (d == -1 && open_dim >= 0)
            return oi_status_new(OI_BAD_REQUEST, "The shape of the raw input '%s' can not be deduced because there "
                                 "are more than one variable-sized dimension", spec->name);
        if (d == -1)
            open_dim = i;
        else if (__builtin_mul_overflow(known, d, &known))
            return oi_status_new(OI_BAD_REQUEST, "input '%s': declared shape overflows", spec->name);
        t->shape[i] = d;
    }
    if (spec->dtype == OI_TYPE_BYTES) {
        if (open_dim >= 0 || known != 1)
            return oi_status_new(OI_BAD_REQUEST,
                                 "For BYTE datatype raw input '%s', the model must have input shape [1]", spec->name);
        oi_status_t *st = raw_bytes_element(body, budget, t);
        if (st != NULL)
            return st;
    } else {
        t->data = body->data;
        t->byte_size = body->len;
        t->owner = oi_buf_ref(body);
        if (open_dim >= 0) {
            size_t unit = (size_t)known * oi_dtype_size(spec->dtype);
            t->shape[open_dim] = unit ? (int64_t)(body->len / unit) : 0;
        }
    }
    return oi_tensor_check_input(t, "raw binary body of input", spec->name);
}

static oi_status_t *unsupported_encoding(const oi_http_request_t *r)
{
    return oi_status_new(OI_UNSUPPORTED_MEDIA, "unsupported Content-Encoding '%s'; expected gzip, deflate or identity",
                         r->content_encoding);
}

/* What makes an HTTP inference request unservable before its body is even decoded. */
static oi_status_t *check_infer(const oi_http_request_t *r, const oi_model_t *m, oi_encoding_t enc)
{
    oi_status_t *st = oi_model_check_ready(m);
    if (st != NULL)
        return st;
    if (enc == OI_ENCODING_UNKNOWN)
        return unsupported_encoding(r);
    if (r->body == NULL)
        return oi_status_new(OI_BAD_REQUEST, "inference request has no body; expected a JSON inference request");
    return NULL;
}

static const oi_peer_t *request_peer(void *r) { return oi_http_request_peer(r); }

/* The connection closed before the answer: the request is dropped from the queue, or its
 * model told; finish_infer still comes, and its answer goes nowhere. */
static void infer_gone(oi_http_request_t *r)
{
    oi_infer_cancel(r->gone_arg);
}

/* Decodes `body` (the request's own or its decompression; takes the reference) and submits
 * the request to `m` (takes the reference), or answers the error. */
static void infer_body(oi_server_t *s, oi_http_request_t *r, oi_model_t *m, oi_buf_t *body)
{
    oi_infer_t *c = NULL;
    oi_status_t *st = NULL;
    if (r->inference_header_length >= 0 && (uint64_t)r->inference_header_length > body->len)
        st = oi_status_new(OI_BAD_REQUEST, "Inference-Header-Content-Length %lld exceeds the body length %zu",
                           (long long)r->inference_header_length, body->len);
    if (st == NULL && (c = oi_infer_new()) == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL && r->inference_header_length == 0) {
        st = decode_raw(m, body, s->body_budget, &c->req);
    } else if (st == NULL) {
        size_t json_len = r->inference_header_length >= 0 ? (size_t)r->inference_header_length : body->len;
        oi_json_limits_t limits = {s->cfg.max_json_depth};
        st = oi_json_decode_infer_request(body, json_len, &c->req, &limits);
    }
    oi_buf_unref(body); /* the request holds its own references */
    if (st == NULL)
        st = oi_infer_forward_headers(&c->req, r->forwarded, r->forwarded_len);
    if (st == NULL) {
        c->shm = &s->shm;
        c->shm_caller = (oi_shm_caller_t){request_peer, r};
        c->count_stats = s->cfg.statistics;
        if (s->tracer != NULL)
            (void)oi_infer_trace_begin(c, s->tracer, m, 0, r->start_ns, oi_now_ns()); /* no memory: untraced */
        st = oi_infer_submit(c, m, r->loop, finish_infer, r); /* takes m */
        m = NULL;
        if (st == NULL) {
            r->on_gone = infer_gone;
            r->gone_arg = c;
        }
    }
    if (st != NULL) {
        oi_model_unref(m);
        oi_infer_free(c);
        respond_status(r, st);
    }
}

/* A request body being inflated on a worker thread: the request waits (busy) meanwhile, and
 * holds its model. */
typedef struct inflate_work_s {
    oi_work_t work;
    oi_server_t *s;
    oi_http_request_t *r;
    oi_model_t *m;
    oi_buf_t *in; /* a reference to the compressed body */
    oi_encoding_t enc;
    size_t max_out;
    int64_t header_length; /* the request's Inference-Header-Content-Length, -1 when absent */
    oi_buf_t *out;
    oi_status_t *st;
} inflate_work_t;

static void inflate_run(oi_work_t *w)
{
    inflate_work_t *f = (inflate_work_t *)w;
    int64_t hlen = f->header_length;
    oi_inflate_limit_t lim = {.max_out = f->max_out,
                              .what = "request body",
                              .limit_name = "max_body_bytes",
                              .triton_flag = "--http-max-input-size",
                              .max_ratio = f->s->cfg.max_inflate_ratio,
                              .budget = f->s->body_budget,
                              .expect = hlen == 0 ? OI_INFLATE_ANY : OI_INFLATE_JSON, /* 0: raw tensor bytes */
                              .json_len = hlen > 0 ? (size_t)hlen : SIZE_MAX};
    f->st = oi_inflate(f->in->data, f->in->len, f->enc, &lim, &f->out);
}

static void inflate_done(oi_work_t *w)
{
    inflate_work_t *f = (inflate_work_t *)w;
    oi_buf_unref(f->in);
    if (f->st == NULL && atomic_load(&f->s->stopping)) {
        oi_buf_unref(f->out);
        f->st = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    }
    if (f->st != NULL) {
        oi_model_unref(f->m);
        respond_status(f->r, f->st);
    } else {
        infer_body(f->s, f->r, f->m, f->out);
    }
    free(f);
}

static void handle_infer(oi_server_t *s, oi_http_request_t *r, oi_model_t *m)
{
    oi_encoding_t enc = oi_content_encoding(r->content_encoding);
    oi_status_t *st = check_infer(r, m, enc);
    if (st == NULL && enc == OI_ENCODING_IDENTITY) {
        infer_body(s, r, m, oi_buf_ref(r->body));
        return;
    }
    /* Inflating may take long (up to the body limit, from a small body): off the loop. */
    inflate_work_t *f = st == NULL ? calloc(1, sizeof(*f)) : NULL;
    if (st == NULL && f != NULL) {
        *f = (inflate_work_t){.work = {.run = inflate_run, .done = inflate_done},
                              .s = s,
                              .r = r,
                              .m = m,
                              .in = oi_buf_ref(r->body),
                              .enc = enc,
                              .max_out = s->cfg.http.max_body_bytes,
                              .header_length = r->inference_header_length};
        if (oi_loop_work(r->loop, &f->work) == 0)
            return;
        oi_buf_unref(f->in);
    }
    free(f);
    if (st == NULL)
        st = oi_status_new(OI_INTERNAL, "cannot decompress the request body: out of memory");
    oi_model_unref(m);
    respond_status(r, st);
}

/* ---- routing ------------------------------------------------------------------------------ */

int oi__http_decode_segment(const char *p, const char *end, char *out, size_t cap)
{
    size_t k = 0;
    while (p < end) {
        char ch = *p++;
        if (ch == '%') {
            if (end - p < 2)
                return -1;
            char hex[3] = {p[0], p[1], 0};
            char *e;
            long v = strtol(hex, &e, 16);
            if (*e != '\0' || v == 0)
                return -1;
            ch = (char)v;
            p += 2;
        }
        if (k + 1 >= cap)
            return -1;
        out[k++] = ch;
    }
    out[k] = '\0';
    return k > 0 ? 0 : -1;
}

/* Next segment of a path: [*p, returned end). */
static const char *segment_end(const char *p)
{
    const char *e = strchr(p, '/');
    return e ? e : p + strlen(p);
}

static int seg_is(const char *p, const char *e, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(e - p) == n && memcmp(p, word, n) == 0;
}

static void method_not_allowed(oi_http_request_t *r, const char *allowed)
{
    char msg[MAX_NAME * 2];
    snprintf(msg, sizeof(msg), "method %s is not allowed for %s; use %s",
             llhttp_method_name((llhttp_method_t)r->method), r->path, allowed);
    respond_error(r, OI_METHOD_NOT_ALLOWED, msg);
}

/* GET endpoints answer HEAD alike (the transport leaves the body out). */
static int is_get(const oi_http_request_t *r)
{
    return r->method == HTTP_GET || r->method == HTTP_HEAD;
}

/* A model version's readiness: 200, or 400 with why not (`error`; NULL: ready). */
static void respond_ready(oi_http_request_t *r, const char *name, const char *version, const char *error)
{
    oi_sbuf_t body = {0};
    oi_sbuf_append(&body, "{\"name\":", 8);
    oi_json_write_string(&body, name, strlen(name));
    oi_sbuf_printf(&body, ",\"version\":\"%s\",\"ready\":%s", version, error ? "false" : "true");
    if (error) {
        oi_sbuf_append(&body, ",\"error\":", 9);
        oi_json_write_string(&body, error, strlen(error));
    }
    oi_sbuf_append(&body, "}", 1);
    respond_sbuf(r, error ? 400 : 200, JSON_HEADERS, &body);
}

/* On the loop thread that asked: the model's own answer (a failed handler: not ready). */
static void finish_ready(oi_repo_call_t *call)
{
    char version[24];
    snprintf(version, sizeof(version), "%lld", (long long)call->version);
    const char *why = call->status ? call->status->message : call->ready ? NULL : "the model reports it is not ready";
    respond_ready(call->ctx, call->model, version, why);
    oi_repo_call_free(call);
}

/* On the loop thread that asked: whether every model that answers its own readiness said yes. */
static void finish_server_ready(oi_repo_call_t *call)
{
    if (call->status == NULL && call->ready)
        respond_static(call->ctx, 200, "{\"ready\":true}");
    else
        respond_static(call->ctx, 400, "{\"ready\":false}");
    oi_repo_call_free(call);
}

/* Strict server readiness with models that answer their own: asked on a control thread. */
static void ask_server_ready(oi_server_t *s, oi_http_request_t *r)
{
    oi_repo_call_t *call = oi_repo_call_new(OI_REPO_READY);
    oi_status_t *st = call == NULL ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (st == NULL) {
        call->version = -1;
        st = oi__repo_submit(s, call, r->loop, finish_server_ready, r);
    }
    if (st != NULL) {
        oi_repo_call_free(call);
        oi_status_free(st);
        respond_static(r, 400, "{\"ready\":false}");
    }
}

/* A loaded version that answers its own readiness is asked on a control thread (a model's code
 * may take seconds; this loop never waits); any other is answered here. */
static void respond_model_ready(oi_server_t *s, oi_http_request_t *r, oi_model_t *m)
{
    if (m->error != NULL || !m->ready_probe) {
        respond_ready(r, m->name, m->version_str, m->error);
        return;
    }
    oi_repo_call_t *call = oi_repo_call_new(OI_REPO_READY);
    oi_status_t *st = call == NULL || (call->model = strdup(m->name)) == NULL
                          ? oi_status_new(OI_INTERNAL, "out of memory")
                          : NULL;
    if (st == NULL) {
        call->version = m->version;
        st = oi__repo_submit(s, call, r->loop, finish_ready, r);
    }
    if (st != NULL) {
        oi_repo_call_free(call);
        respond_ready(r, m->name, m->version_str, st->message);
        oi_status_free(st);
    }
}

/* GET /v2/models/stats and /v2/models/{name}[/versions/{v}]/stats: Triton's statistics. */
static void model_stats(oi_server_t *s, oi_http_request_t *r, const char *name, const char *version)
{
    if (r->method != HTTP_GET) {
        method_not_allowed(r, "GET");
        return;
    }
    oi_status_t *st = NULL;
    oi_buf_t *b = oi_server_statistics(s, name, version, &st);
    if (b == NULL) {
        respond_status(r, st);
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_http_respond(r, 200, JSON_HEADERS, &part, 1);
}

/* Model ready for a model or version that is not served: 400 as for one that is not ready
 * (what Triton answers), with Triton's wording of why. Takes `err`. */
static void respond_unknown_ready(oi_http_request_t *r, const char *name, oi_status_t *err)
{
    if (err->code != OI_NOT_FOUND) { /* a malformed version */
        respond_status(r, err);
        return;
    }
    oi_sbuf_t body = {0};
    oi_sbuf_append(&body, "{\"name\":", 8);
    oi_json_write_string(&body, name, strlen(name));
    static const char mid[] = ",\"ready\":false,\"error\":";
    oi_sbuf_append(&body, mid, sizeof(mid) - 1);
    oi_json_write_string(&body, err->message, strlen(err->message));
    oi_sbuf_append(&body, "}", 1);
    oi_status_free(err);
    respond_sbuf(r, 400, JSON_HEADERS, &body);
}

/* A model version's configuration in Triton's JSON, for ready versions only (as Triton). */
static void respond_model_config(oi_http_request_t *r, oi_model_t *m)
{
    if (m->error != NULL)
        respond_status(r, oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
                                        m->version_str, m->error));
    else if (m->config_json == NULL)
        respond_status(
            r, oi_status_new(OI_NOT_FOUND, "model '%s' version %s has no configuration", m->name, m->version_str));
    else
        respond_buf(r, m->config_json);
}

/* /v2/models/{name}[/versions/{v}][/ready|/infer|/generate|/generate_stream|/config|/stats] */
static void route_settings(oi_server_t *s, oi_http_request_t *r, oi_repo_op_t op, const char *model);

static void route_model(oi_server_t *s, oi_http_request_t *r, const char *p)
{
    if (strcmp(p, "stats") == 0) { /* every model's; as in Triton, it shadows a model named "stats" */
        model_stats(s, r, NULL, NULL);
        return;
    }
    char name[MAX_NAME], version[32] = "";
    const char *e = segment_end(p);
    if (oi__http_decode_segment(p, e, name, sizeof(name)) != 0) {
        respond_error(r, OI_BAD_REQUEST, "model name in the URL is empty, too long or badly percent-encoded");
        return;
    }
    p = *e ? e + 1 : e;
    e = segment_end(p);
    if (seg_is(p, e, "versions")) {
        p = *e ? e + 1 : e;
        e = segment_end(p);
        if (oi__http_decode_segment(p, e, version, sizeof(version)) != 0) {
            respond_error(r, OI_BAD_REQUEST, "model version in the URL is empty, too long or badly encoded");
            return;
        }
        p = *e ? e + 1 : e;
        e = segment_end(p);
    }
    if (seg_is(p, e, "stats") && *e == '\0') {
        model_stats(s, r, name, version);
        return;
    }
    if (version[0] == '\0' && strcmp(p, "trace/setting") == 0) {
        route_settings(s, r, OI_REPO_TRACE, name);
        return;
    }
    enum { METADATA, READY, INFER, CONFIG, GENERATE, GENERATE_STREAM } what;
    if (p == e && *e == '\0')
        what = METADATA;
    else if (seg_is(p, e, "ready") && *e == '\0')
        what = READY;
    else if (seg_is(p, e, "config") && *e == '\0')
        what = CONFIG;
    else if (seg_is(p, e, "infer") && *e == '\0')
        what = INFER;
    else if (seg_is(p, e, "generate") && *e == '\0')
        what = GENERATE;
    else if (seg_is(p, e, "generate_stream") && *e == '\0')
        what = GENERATE_STREAM;
    else {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %s", r->path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    int post = what == INFER || what == GENERATE || what == GENERATE_STREAM;
    if (post && r->method != HTTP_POST) {
        method_not_allowed(r, "POST");
        return;
    }
    if (!post && !is_get(r)) {
        method_not_allowed(r, "GET or HEAD");
        return;
    }
    oi_status_t *err = NULL;
    oi_model_t *m = oi_registry_find(&s->registry, name, version, &err);
    if (m == NULL && what == READY) {
        respond_unknown_ready(r, name, err);
        return;
    }
    if (m == NULL) {
        respond_status(r, err);
        return;
    }
    switch (what) {
    case METADATA:
        if (m->error == NULL && m->metadata != NULL)
            respond_buf(r, m->metadata);
        else {
            oi_status_t *st = oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
                                            m->version_str, m->error ? m->error : "no metadata");
            respond_status(r, st);
        }
        oi_model_unref(m);
        break;
    case READY:
        respond_model_ready(s, r, m);
        oi_model_unref(m);
        break;
    case CONFIG:
        respond_model_config(r, m);
        oi_model_unref(m);
        break;
    case INFER:
        if (m->decoupled) { /* Triton's status and words */
            oi_model_unref(m);
            respond_error(r, OI_UNIMPLEMENTED,
                          "HTTP end point doesn't support models with decoupled transaction policy");
            break;
        }
        handle_infer(s, r, m); /* takes the reference */
        break;
    case GENERATE:
    case GENERATE_STREAM:
        oi__http_generate(s, r, m, what == GENERATE_STREAM); /* takes the reference */
        break;
    }
}

/* ---- shared memory ------------------------------------------------------------------------ */

/* A request body as a JSON object slice; NULL when there is none. */
static oi_slice_t body_slice(const oi_http_request_t *r)
{
    return r->body ? (oi_slice_t){r->body->data, r->body->len} : (oi_slice_t){NULL, 0};
}

static oi_status_t *shm_register(oi_server_t *s, oi_http_request_t *r, oi_shm_kind_t kind, const char *name)
{
    oi_shm_register_body_t b;
    oi_status_t *st = oi_shm_decode_register(body_slice(r), kind, &b);
    if (st != NULL)
        return st;
    if (kind == OI_SHM_SYSTEM)
        return oi_shm_register_system(&s->shm, oi_http_request_peer(r), name, b.key, b.offset, b.byte_size);
    return oi_shm_register_cuda(&s->shm, oi_http_request_peer(r), name, b.handle, b.handle_len, (int64_t)b.device_id,
                                b.byte_size);
}

static void shm_status(oi_server_t *s, oi_http_request_t *r, oi_shm_kind_t kind, const char *name)
{
    oi_shm_region_t **regions;
    size_t n;
    oi_status_t *st = oi_shm_list(&s->shm, oi_http_request_peer(r), kind, name, &regions, &n);
    if (st != NULL) {
        respond_status(r, st);
        return;
    }
    oi_sbuf_t body = {0};
    oi_sbuf_append(&body, "[", 1);
    for (size_t i = 0; i < n; i++) {
        const oi_shm_region_t *g = regions[i];
        oi_sbuf_append(&body, i ? ",{\"name\":" : "{\"name\":", i ? 9 : 8);
        oi_json_write_string(&body, g->name, strlen(g->name));
        if (kind == OI_SHM_SYSTEM) {
            oi_sbuf_append(&body, ",\"key\":", 7);
            oi_json_write_string(&body, g->key, strlen(g->key));
            oi_sbuf_printf(&body, ",\"offset\":%llu", (unsigned long long)g->offset);
        } else {
            oi_sbuf_printf(&body, ",\"device_id\":%lld", (long long)g->device_id);
        }
        oi_sbuf_printf(&body, ",\"byte_size\":%llu}", (unsigned long long)g->byte_size);
    }
    oi_shm_release_all(regions, n);
    if (oi_sbuf_append(&body, "]", 1) != 0) {
        oi_sbuf_free(&body);
        respond_error(r, OI_INTERNAL, "out of memory");
        return;
    }
    respond_sbuf(r, 200, JSON_HEADERS, &body);
}

/* /v2/{system,cuda}sharedmemory[/region/{name}]/{status,register,unregister} */
static void route_shm(oi_server_t *s, oi_http_request_t *r, oi_shm_kind_t kind, const char *p)
{
    char name[MAX_NAME] = "";
    const char *e = segment_end(p);
    if (seg_is(p, e, "region") && *e == '/') {
        p = e + 1;
        e = segment_end(p);
        if (oi__http_decode_segment(p, e, name, sizeof(name)) != 0) {
            respond_error(r, OI_BAD_REQUEST, "region name in the URL is empty, too long or badly percent-encoded");
            return;
        }
        p = *e ? e + 1 : e;
        e = segment_end(p);
    }
    enum { STATUS, REGISTER, UNREGISTER } what;
    if (seg_is(p, e, "status") && *e == '\0')
        what = STATUS;
    else if (seg_is(p, e, "register") && *e == '\0' && name[0] != '\0')
        what = REGISTER;
    else if (seg_is(p, e, "unregister") && *e == '\0')
        what = UNREGISTER;
    else {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %.300s", r->path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    if (what == STATUS && !is_get(r)) {
        method_not_allowed(r, "GET or HEAD");
        return;
    }
    if (what != STATUS && r->method != HTTP_POST) {
        method_not_allowed(r, "POST");
        return;
    }
    if (what == STATUS) {
        shm_status(s, r, kind, name);
        return;
    }
    oi_status_t *st = what == REGISTER ? shm_register(s, r, kind, name)
                                       : oi_shm_unregister(&s->shm, oi_http_request_peer(r), kind, name);
    if (st != NULL && st->code == 409)
        st->code = OI_BAD_REQUEST; /* tritonserver answers ALREADY_EXISTS with 400 over HTTP */
    if (st != NULL)
        respond_status(r, st);
    else
        respond_static(r, 200, "{}");
}

/* ---- model repository ----------------------------------------------------------------------- */

/* On the loop thread, with the handler's outcome. */
static void finish_repository(oi_repo_call_t *call)
{
    oi_http_request_t *r = call->ctx;
    if (call->status != NULL) {
        oi_status_t *st = call->status;
        call->status = NULL;
        respond_status(r, st);
    } else if (call->op != OI_REPO_INDEX) {
        respond_static(r, 200, ""); /* as Triton: an empty 200 */
    } else {
        oi_sbuf_t body = {0};
        int bad = oi_sbuf_append(&body, "[", 1);
        for (size_t i = 0; i < call->n_entries && bad == 0; i++) {
            const oi_repo_entry_t *e = &call->entries[i];
            const char *keys[] = {"name", "version", "state", "reason"};
            const char *values[] = {e->name, e->version, e->state, e->reason};
            bad |= oi_sbuf_append(&body, i ? ",{" : "{", i ? 2 : 1);
            for (int k = 0, n = 0; k < 4; k++) {
                if (values[k] == NULL)
                    continue;
                bad |= oi_sbuf_printf(&body, "%s\"%s\":", n++ ? "," : "", keys[k]);
                bad |= oi_json_write_string(&body, values[k], strlen(values[k]));
            }
            bad |= oi_sbuf_append(&body, "}", 1);
        }
        bad |= oi_sbuf_append(&body, "]", 1);
        if (bad != 0) {
            oi_sbuf_free(&body);
            respond_error(r, OI_INTERNAL, "out of memory");
        } else {
            respond_sbuf(r, 200, JSON_HEADERS, &body);
        }
    }
    oi_repo_call_free(call);
}

/* The client closed its connection while a load ran: the handler may give it up. */
static void repository_gone(oi_http_request_t *r)
{
    oi_repo_call_stop(r->gone_arg);
}

/* Hands a control call the request's body as it came (when there is one): the control thread
 * inflates it, off this loop. NULL, or a 415 for an encoding it cannot inflate. */
static oi_status_t *attach_body(oi_server_t *s, oi_http_request_t *r, oi_repo_call_t *call)
{
    oi_encoding_t enc = oi_content_encoding(r->content_encoding);
    if (enc == OI_ENCODING_UNKNOWN)
        return unsupported_encoding(r);
    if (r->body == NULL || r->body->len == 0)
        return NULL;
    call->body = oi_buf_ref(r->body);
    call->body_encoding = enc;
    call->max_body_bytes = s->cfg.http.max_body_bytes;
    return NULL;
}

/* /v2/repository[/{repository}]/index and /v2/repository[/{repository}]/models/{name}/{load,unload},
 * as Triton routes them; the body goes to the repository handler as sent. */
static void route_repository(oi_server_t *s, oi_http_request_t *r, const char *p)
{
    char name[MAX_NAME] = "";
    const char *e = segment_end(p);
    int named_repo = 0;
    if (!seg_is(p, e, "index") && !seg_is(p, e, "models") && *e == '/') { /* a repository name */
        named_repo = 1;
        p = e + 1;
        e = segment_end(p);
    }
    oi_repo_op_t op;
    if (seg_is(p, e, "index") && *e == '\0') {
        op = OI_REPO_INDEX;
    } else if (seg_is(p, e, "models") && *e == '/') {
        p = e + 1;
        e = segment_end(p);
        if (oi__http_decode_segment(p, e, name, sizeof(name)) != 0 || *e != '/') {
            char msg[MAX_NAME * 2];
            snprintf(msg, sizeof(msg), "no endpoint at %.300s", r->path);
            respond_error(r, OI_NOT_FOUND, msg);
            return;
        }
        p = e + 1;
        e = segment_end(p);
        if (seg_is(p, e, "load") && *e == '\0')
            op = OI_REPO_LOAD;
        else if (seg_is(p, e, "unload") && *e == '\0')
            op = OI_REPO_UNLOAD;
        else
            op = (oi_repo_op_t)-1;
    } else {
        op = (oi_repo_op_t)-1;
    }
    if ((int)op < 0) {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %.300s", r->path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    if (r->method != HTTP_POST) {
        method_not_allowed(r, "POST");
        return;
    }
    if (named_repo) {
        respond_error(r, OI_UNIMPLEMENTED, "'repository_name' specification is not supported");
        return;
    }
    oi_repo_call_t *call = oi_repo_call_new(op);
    oi_status_t *st = NULL;
    if (call == NULL || (op != OI_REPO_INDEX && (call->model = strdup(name)) == NULL))
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL)
        st = attach_body(s, r, call);
    if (st == NULL)
        st = oi__repo_submit(s, call, r->loop, finish_repository, r);
    if (st != NULL) {
        oi_repo_call_free(call);
        respond_status(r, st);
    } else {
        r->on_gone = repository_gone; /* the call lives until finish_repository answers */
        r->gone_arg = call;
    }
}

/* ---- logging ------------------------------------------------------------------------------- */

/* The settings as one JSON object, in the handler's order; a LIST is an array of strings. */
static void finish_settings(oi_repo_call_t *call)
{
    oi_http_request_t *r = call->ctx;
    if (call->status != NULL) {
        oi_status_t *st = call->status;
        call->status = NULL;
        respond_status(r, st);
        oi_repo_call_free(call);
        return;
    }
    oi_sbuf_t body = {0};
    int bad = oi_sbuf_append(&body, "{", 1);
    for (size_t i = 0; i < call->n_results && bad == 0; i++) {
        const oi_repo_param_t *p = &call->results[i];
        if (i > 0)
            bad |= oi_sbuf_append(&body, ",", 1);
        bad |= oi_json_write_string(&body, p->name, strlen(p->name));
        bad |= oi_sbuf_append(&body, ":", 1);
        if (p->kind == OI_REPO_PARAM_BOOL)
            bad |= oi_sbuf_printf(&body, "%s", p->number ? "true" : "false");
        else if (p->kind == OI_REPO_PARAM_INT)
            bad |= oi_sbuf_printf(&body, "%lld", (long long)p->number);
        else if (p->kind == OI_REPO_PARAM_LIST) {
            bad |= oi_sbuf_append(&body, "[", 1);
            for (size_t at = 0; at < p->len; at += strlen(p->data + at) + 1) {
                if (at > 0)
                    bad |= oi_sbuf_append(&body, ",", 1);
                bad |= oi_json_write_string(&body, p->data + at, strlen(p->data + at));
            }
            bad |= oi_sbuf_append(&body, "]", 1);
        } else
            bad |= oi_json_write_string(&body, p->data, p->len);
    }
    bad |= oi_sbuf_append(&body, "}", 1);
    if (bad != 0) {
        oi_sbuf_free(&body);
        respond_error(r, OI_INTERNAL, "out of memory");
    } else {
        respond_sbuf(r, 200, JSON_HEADERS, &body);
    }
    oi_repo_call_free(call);
}

/* GET /v2/logging and /v2/[models/{model}/]trace/setting read the log or trace settings, POST
 * changes those its JSON body names; the application's handler judges the body. `model` (trace
 * only; NULL: the global settings) must be ready, as Triton checks. */
static void route_settings(oi_server_t *s, oi_http_request_t *r, oi_repo_op_t op, const char *model)
{
    if (r->method != HTTP_GET && r->method != HTTP_POST) {
        method_not_allowed(r, "GET or POST");
        return;
    }
    if (model != NULL) {
        oi_status_t *err = NULL;
        oi_model_t *m = oi_registry_find(&s->registry, model, NULL, &err);
        int ready = m != NULL && m->error == NULL;
        oi_model_unref(m);
        oi_status_free(err);
        if (!ready) {
            respond_status(r, oi_status_new(OI_BAD_REQUEST, "Request for unknown model : %s", model));
            return;
        }
    }
    oi_repo_call_t *call = oi_repo_call_new(op);
    oi_status_t *st = call == NULL ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (st == NULL && model != NULL && (call->model = strdup(model)) == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL && r->method == HTTP_POST)
        st = attach_body(s, r, call);
    if (st == NULL)
        st = oi__repo_submit(s, call, r->loop, finish_settings, r);
    if (st != NULL) {
        oi_repo_call_free(call);
        respond_status(r, st);
    }
}

/* ---- restricted APIs ------------------------------------------------------------------------- */

#define GROUP(g) OI_API_BIT(OI_API_##g)

/* The restricted-API groups of the V2 path `p` (what follows "/v2/"), as tritonserver files
 * its handlers: generate with inference, model readiness with health. 0 for a path no
 * endpoint serves, which gets its 404 as before. */
static unsigned v2_groups(const char *p)
{
    if (*p == '\0')
        return GROUP(METADATA);
    if (strcmp(p, "health/live") == 0 || strcmp(p, "health/ready") == 0)
        return GROUP(HEALTH);
    if (strncmp(p, "repository/", 11) == 0)
        return GROUP(MODEL_REPOSITORY);
    if (strcmp(p, "logging") == 0)
        return GROUP(LOGGING);
    if (strcmp(p, "trace/setting") == 0)
        return GROUP(TRACE);
    if (strncmp(p, "systemsharedmemory/", 19) == 0 || strncmp(p, "cudasharedmemory/", 17) == 0)
        return GROUP(SHARED_MEMORY);
    if (strncmp(p, "models/", 7) != 0)
        return 0;
    p += 7;
    if (strcmp(p, "stats") == 0)
        return GROUP(STATISTICS);
    const char *e = segment_end(p); /* past the model's name, and its version */
    p = *e ? e + 1 : e;
    e = segment_end(p);
    if (seg_is(p, e, "versions")) {
        p = *e ? e + 1 : e;
        e = segment_end(p);
        p = *e ? e + 1 : e;
    }
    static const struct {
        const char *tail;
        unsigned groups;
    } tails[] = {{"", GROUP(METADATA)},       {"ready", GROUP(HEALTH)},         {"config", GROUP(MODEL_CONFIG)},
                 {"infer", GROUP(INFERENCE)}, {"generate", GROUP(INFERENCE)},   {"generate_stream", GROUP(INFERENCE)},
                 {"stats", GROUP(STATISTICS)}, {"trace/setting", GROUP(TRACE)}};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++)
        if (strcmp(p, tails[i].tail) == 0)
            return tails[i].groups;
    return 0;
}

static const char *captured_header(const void *r, int i, size_t *len)
{
    return oi_http_request_header(r, i, len);
}

/* Answers 403 with tritonserver's words when one of `groups` is restricted and the request
 * lacks its header or carries another value; returns whether it did. The words name the
 * header, never the value. */
static int refuse_restricted(oi_server_t *s, oi_http_request_t *r, unsigned groups, int legacy)
{
    const oi_restricted_t *t = &s->http_restricted;
    int g = groups ? oi_restricted_refuses(t, groups, captured_header, r) : -1;
    if (g < 0)
        return 0;
    char msg[MAX_NAME * 2];
    snprintf(msg, sizeof(msg), "This API is restricted, expecting header '%.300s'", t->header[g]);
    if (legacy)
        oi__legacy_http_refuse(s, r, msg);
    else
        respond_error(r, 403, msg);
    return 1;
}

/* Whether the body is over max_body_bytes when only a V2 infer request may bring that much:
 * there the binary extension's tensor data is bounded by the in-flight budget alone; any other
 * endpoint reads its body whole, as tritonserver bounds a JSON body. Answers then. */
static int refuse_oversized(const oi_server_t *s, oi_http_request_t *r)
{
    size_t max = s->cfg.http.max_body_bytes, n = r->path_len;
    if (r->body == NULL || r->body->len <= max ||
        (strncmp(r->path, "/v2/models/", 11) == 0 && n > 17 && strcmp(r->path + n - 6, "/infer") == 0))
        return 0;
    char msg[256];
    oi_http_input_too_large(msg, sizeof(msg), -1, r->body->len, 0, max);
    respond_error(r, OI_BAD_REQUEST, msg);
    return 1;
}

void oi__http_api_handle(void *ctx, oi_http_request_t *r)
{
    oi_server_t *s = ctx;
    const char *path = r->path;
    if (atomic_load(&s->stopping)) {
        respond_error(r, OI_UNAVAILABLE, "the server is shutting down");
        return;
    }
    if (refuse_oversized(s, r))
        return;
    int restricted = oi_restricted_any(&s->http_restricted); /* else no route needs its groups */
    if (restricted && strncmp(path, "/api/", 5) == 0 && refuse_restricted(s, r, oi__legacy_http_groups(path + 5), 1))
        return;
    if (oi__legacy_http_handle(s, r)) /* the legacy v1 API under /api */
        return;
    if (strncmp(path, "/v1", 3) == 0 && (path[3] == '\0' || path[3] == '/')) { /* OpenAI's API */
        oi__http_openai(s, r);
        return;
    }
    if (strncmp(path, "/v2", 3) != 0 || (path[3] != '\0' && path[3] != '/')) {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %.300s; the V2 API lives under /v2", path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    const char *p = path[3] == '/' ? path + 4 : path + 3;
    if (restricted && refuse_restricted(s, r, v2_groups(p), 0))
        return;
    if (*p == '\0') {
        if (!is_get(r))
            method_not_allowed(r, "GET or HEAD");
        else if (s->metadata)
            respond_buf(r, s->metadata);
        else
            respond_static(r, 200, "{\"name\":\"openinfer\",\"version\":\"\",\"extensions\":[]}");
        return;
    }
    if (strcmp(p, "health/live") == 0 || strcmp(p, "health/ready") == 0) {
        if (!is_get(r)) {
            method_not_allowed(r, "GET or HEAD");
            return;
        }
        if (p[7] == 'l')
            respond_static(r, 200, "{\"live\":true}");
        else if (!oi__server_ready(s))
            respond_static(r, 400, "{\"ready\":false}");
        else if (!oi__server_ready_asks(s))
            respond_static(r, 200, "{\"ready\":true}");
        else
            ask_server_ready(s, r);
        return;
    }
    if (strncmp(p, "models/", 7) == 0) {
        route_model(s, r, p + 7);
        return;
    }
    if (strncmp(p, "repository/", 11) == 0) {
        route_repository(s, r, p + 11);
        return;
    }
    if (strcmp(p, "logging") == 0) {
        route_settings(s, r, OI_REPO_LOGGING, NULL);
        return;
    }
    if (strcmp(p, "trace/setting") == 0) {
        route_settings(s, r, OI_REPO_TRACE, NULL);
        return;
    }
    if (strncmp(p, "systemsharedmemory/", 19) == 0) {
        route_shm(s, r, OI_SHM_SYSTEM, p + 19);
        return;
    }
    if (strncmp(p, "cudasharedmemory/", 17) == 0) {
        route_shm(s, r, OI_SHM_CUDA, p + 17);
        return;
    }
    char msg[MAX_NAME * 2];
    snprintf(msg, sizeof(msg), "no endpoint at %.300s", path);
    respond_error(r, OI_NOT_FOUND, msg);
}

