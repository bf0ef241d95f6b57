/* The V2 REST API over the HTTP/1.1 transport: routing, JSON bodies, binary tensor data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "codec/json.h"
#include "server/infer.h"
#include "server/server_impl.h"

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
    respond_error(r, st->code, st->message);
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

/* On the loop thread: encode and write. */
static void finish_infer(oi_infer_t *c)
{
    oi_http_request_t *r = c->ctx;
    if (c->job.status != NULL) {
        oi_status_t *st = c->job.status;
        c->job.status = NULL;
        respond_status(r, st);
        oi_infer_free(c);
        return;
    }
    const oi_response_t *resp = &c->job.resp;
    uint8_t binary_small[16];
    uint8_t *binary = resp->n_outputs <= 16 ? binary_small : malloc(resp->n_outputs);
    int any_binary = 0;
    for (uint32_t i = 0; binary != NULL && i < resp->n_outputs; i++) {
        binary[i] = (uint8_t)(oi_json_output_is_binary(&c->req, resp->outputs[i].name) != 0);
        any_binary |= binary[i];
    }
    oi_sbuf_t json = {0};
    oi_status_t *st = binary == NULL ? oi_status_new(OI_INTERNAL, "out of memory")
                                     : oi_json_encode_infer_response(&json, c->model->name, c->model->version_str,
                                                                     &c->req, resp, binary);
    if (st != NULL) {
        oi_sbuf_free(&json);
        respond_status(r, st);
    } else if (!any_binary) {
        respond_sbuf(r, 200, JSON_HEADERS, &json);
    } else {
        /* JSON header, then each binary output straight from the backend's memory. */
        oi_iov_t parts_small[17];
        oi_iov_t *parts = resp->n_outputs < 17 ? parts_small : malloc((resp->n_outputs + 1) * sizeof(oi_iov_t));
        oi_buf_t *head = oi_sbuf_detach(&json);
        if (parts == NULL || head == NULL) {
            oi_buf_unref(head);
            oi_sbuf_free(&json);
            if (parts != parts_small)
                free(parts);
            respond_error(r, 500, "out of memory");
        } else {
            size_t n = 0;
            parts[n++] = (oi_iov_t){head->data, head->len, head};
            for (uint32_t i = 0; i < resp->n_outputs; i++) {
                const oi_tensor_t *o = &resp->outputs[i];
                if (binary[i])
                    parts[n++] = (oi_iov_t){o->data, o->byte_size, o->owner ? oi_buf_ref(o->owner) : NULL};
            }
            char headers[160];
            snprintf(headers, sizeof(headers),
                     "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %zu\r\n",
                     head->len);
            oi_http_respond(r, 200, headers, parts, n);
            if (parts != parts_small)
                free(parts);
        }
    }
    if (binary != binary_small)
        free(binary);
    oi_infer_free(c);
}

/* What makes an HTTP inference request unservable before its body is even decoded. */
static oi_status_t *check_infer(const oi_http_request_t *r, const oi_model_t *m)
{
    oi_status_t *st = oi_model_check_ready(m);
    if (st != NULL)
        return st;
    if (r->content_encoding[0] != '\0' && strcmp(r->content_encoding, "identity") != 0)
        return oi_status_new(OI_UNSUPPORTED_MEDIA, "unsupported Content-Encoding; this server accepts identity");
    if (r->body == NULL)
        return oi_status_new(OI_BAD_REQUEST, "inference request has no body; expected a JSON inference request");
    if (r->inference_header_length >= 0 && (uint64_t)r->inference_header_length > r->body->len)
        return oi_status_new(OI_BAD_REQUEST, "Inference-Header-Content-Length %lld exceeds the body length %zu",
                             (long long)r->inference_header_length, r->body->len);
    return NULL;
}

static void handle_infer(oi_server_t *s, oi_http_request_t *r, oi_model_t *m)
{
    oi_status_t *st = check_infer(r, m);
    oi_infer_t *c = st == NULL ? oi_infer_new() : NULL;
    if (st == NULL && c == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st != NULL) {
        oi_model_unref(m);
        respond_status(r, st);
        return;
    }
    size_t json_len = r->inference_header_length >= 0 ? (size_t)r->inference_header_length : r->body->len;
    oi_json_limits_t limits = {s->cfg.max_json_depth};
    st = oi_json_decode_infer_request(r->body, json_len, &c->req, &limits);
    if (st == NULL)
        st = oi_infer_submit(c, m, r->loop, finish_infer, r);
    else
        oi_model_unref(m);
    if (st != NULL) {
        oi_infer_free(c);
        respond_status(r, st);
    }
}

/* ---- routing ------------------------------------------------------------------------------ */

/* Copies a path segment [p, end) percent-decoded into out (NUL-terminated). -1 when it is
 * too long or badly encoded. */
static int decode_segment(const char *p, const char *end, char *out, size_t cap)
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

static void respond_model_ready(oi_http_request_t *r, oi_model_t *m)
{
    oi_sbuf_t body = {0};
    oi_sbuf_append(&body, "{\"name\":", 8);
    oi_json_write_string(&body, m->name, strlen(m->name));
    oi_sbuf_printf(&body, ",\"version\":\"%s\",\"ready\":%s", m->version_str, m->error ? "false" : "true");
    if (m->error) {
        oi_sbuf_append(&body, ",\"error\":", 9);
        oi_json_write_string(&body, m->error, strlen(m->error));
    }
    oi_sbuf_append(&body, "}", 1);
    respond_sbuf(r, m->error ? 400 : 200, JSON_HEADERS, &body);
}

/* /v2/models/{name}[/versions/{v}][/ready|/infer] */
static void route_model(oi_server_t *s, oi_http_request_t *r, const char *p)
{
    char name[MAX_NAME], version[32] = "";
    const char *e = segment_end(p);
    if (decode_segment(p, e, name, sizeof(name)) != 0) {
        respond_error(r, OI_BAD_REQUEST, "model name in the URL is empty, too long or badly percent-encoded");
        return;
    }
    p = *e ? e + 1 : e;
    e = segment_end(p);
    if (seg_is(p, e, "versions")) {
        p = *e ? e + 1 : e;
        e = segment_end(p);
        if (decode_segment(p, e, version, sizeof(version)) != 0) {
            respond_error(r, OI_BAD_REQUEST, "model version in the URL is empty, too long or badly encoded");
            return;
        }
        p = *e ? e + 1 : e;
        e = segment_end(p);
    }
    enum { METADATA, READY, INFER } what;
    if (p == e && *e == '\0')
        what = METADATA;
    else if (seg_is(p, e, "ready") && *e == '\0')
        what = READY;
    else if (seg_is(p, e, "infer") && *e == '\0')
        what = INFER;
    else {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %s", r->path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    if (what == INFER && r->method != HTTP_POST) {
        method_not_allowed(r, "POST");
        return;
    }
    if (what != INFER && r->method != HTTP_GET) {
        method_not_allowed(r, "GET");
        return;
    }
    oi_status_t *err = NULL;
    oi_model_t *m = oi_registry_find(&s->registry, name, version, &err);
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
        respond_model_ready(r, m);
        oi_model_unref(m);
        break;
    case INFER:
        handle_infer(s, r, m); /* takes the reference */
        break;
    }
}

void oi__http_api_handle(void *ctx, oi_http_request_t *r)
{
    oi_server_t *s = ctx;
    const char *path = r->path;
    if (atomic_load(&s->stopping)) {
        respond_error(r, OI_UNAVAILABLE, "the server is shutting down");
        return;
    }
    if (strncmp(path, "/v2", 3) != 0 || (path[3] != '\0' && path[3] != '/')) {
        char msg[MAX_NAME * 2];
        snprintf(msg, sizeof(msg), "no endpoint at %.300s; the V2 API lives under /v2", path);
        respond_error(r, OI_NOT_FOUND, msg);
        return;
    }
    const char *p = path[3] == '/' ? path + 4 : path + 3;
    if (*p == '\0') {
        if (r->method != HTTP_GET)
            method_not_allowed(r, "GET");
        else if (s->metadata)
            respond_buf(r, s->metadata);
        else
            respond_static(r, 200, "{\"name\":\"openinfer\",\"version\":\"\",\"extensions\":[]}");
        return;
    }
    if (strcmp(p, "health/live") == 0 || strcmp(p, "health/ready") == 0) {
        if (r->method != HTTP_GET) {
            method_not_allowed(r, "GET");
            return;
        }
        if (p[7] == 'l')
            respond_static(r, 200, "{\"live\":true}");
        else if (oi_registry_all_ready(&s->registry))
            respond_static(r, 200, "{\"ready\":true}");
        else
            respond_static(r, 400, "{\"ready\":false}");
        return;
    }
    if (strncmp(p, "models/", 7) == 0) {
        route_model(s, r, p + 7);
        return;
    }
    char msg[MAX_NAME * 2];
    snprintf(msg, sizeof(msg), "no endpoint at %.300s", path);
    respond_error(r, OI_NOT_FOUND, msg);
}

