/* The legacy v1 HTTP API (TensorRT Inference Server 1.x) beside V2: /api/health/live|ready,
 * /api/status[/<model>], /api/infer/<model>[/<version>]. As 1.x answered: every failure is a
 * 400 whose NV-Status header (a text RequestStatus) says what went wrong, with no body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "codec/compress.h"
#include "codec/json.h"
#include "codec/pbtext.h"
#include "server/api/legacy.h"

#define OCTET "Content-Type: application/octet-stream\r\n"

/* The headers of an answer: NV-Status with `st` (NULL: success), then `extra`. Returns a
 * NUL-terminated string in `h` (caller frees with oi_sbuf_free), or -1. */
static int status_headers(oi_sbuf_t *h, const oi_status_t *st, uint64_t id, const char *extra)
{
    oi_legacy_status_t rs;
    oi_legacy_status_fill(&rs, st, id);
    if (oi_sbuf_append(h, "NV-Status: ", 11) != 0 || oi_pbtext_write(h, &rs.base, 1) != 0 ||
        oi_sbuf_printf(h, "\r\n%s", extra ? extra : "") != 0)
        return -1;
    return 0;
}

/* Answers `st` (taken; NULL: success) with NV-Status, `extra` headers and `body` (taken;
 * may be empty). 200 on success, else 400 as 1.x (405 stays 405). */
static void respond(oi_http_request_t *r, oi_server_t *s, oi_status_t *st, const char *extra, oi_sbuf_t *body)
{
    oi_sbuf_t h = {0};
    int code = st == NULL ? 200 : st->code == OI_METHOD_NOT_ALLOWED ? 405 : 400;
    if (status_headers(&h, st, oi_legacy_next_id(s), extra) != 0) {
        oi_sbuf_free(&h);
        oi_sbuf_free(body);
        oi_status_free(st);
        oi_http_respond(r, 500, "", NULL, 0);
        return;
    }
    oi_status_free(st);
    oi_buf_t *b = body != NULL && body->len > 0 ? oi_sbuf_detach(body) : NULL;
    if (body != NULL)
        oi_sbuf_free(body);
    oi_iov_t part = {b ? b->data : NULL, b ? b->len : 0, b};
    oi_http_respond(r, code, h.data, &part, b ? 1 : 0);
    oi_sbuf_free(&h);
}

/* The value of query parameter `key` ("format") into buf; "" when absent. */
static const char *query_param(const char *q, const char *key, char *buf, size_t cap)
{
    size_t klen = strlen(key);
    buf[0] = '\0';
    for (const char *p = q; p != NULL && *p;) {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t v = n - klen - 1 < cap - 1 ? n - klen - 1 : cap - 1;
            memcpy(buf, p + klen + 1, v);
            buf[v] = '\0';
            break;
        }
        p = amp ? amp + 1 : NULL;
    }
    return buf;
}

/* ?format=: text (the default), binary or json; -1 for anything else. */
static int format_of(const oi_http_request_t *r, int json_ok)
{
    char f[16];
    query_param(r->query, "format", f, sizeof(f));
    if (f[0] == '\0' || strcmp(f, "text") == 0)
        return OI_LEGACY_TEXT;
    if (strcmp(f, "binary") == 0)
        return OI_LEGACY_BINARY;
    if (json_ok && strcmp(f, "json") == 0)
        return OI_LEGACY_JSON;
    return -1;
}

static int is_get(const oi_http_request_t *r)
{
    return r->method == HTTP_GET || r->method == HTTP_HEAD;
}

static void handle_health(oi_server_t *s, oi_http_request_t *r, const char *mode)
{
    if (!is_get(r)) {
        respond(r, s, oi_status_new(OI_METHOD_NOT_ALLOWED, "health: use GET"), "Allow: GET, HEAD\r\n", NULL);
        return;
    }
    int ready = strcmp(mode, "ready") == 0;
    if (!ready && strcmp(mode, "live") != 0) {
        respond(r, s, oi_status_new(OI_BAD_REQUEST, "unknown health mode '%.64s'; expected live or ready", mode), NULL,
                NULL);
        return;
    }
    if (oi_legacy_health(s, ready))
        respond(r, s, NULL, NULL, NULL);
    else
        respond(r, s,
                oi_status_new(OI_UNAVAILABLE, ready ? "the server is not ready: a model is not available"
                                                    : "the server is shutting down"),
                NULL, NULL);
}

static void handle_status(oi_server_t *s, oi_http_request_t *r, const char *model)
{
    if (!is_get(r)) {
        respond(r, s, oi_status_new(OI_METHOD_NOT_ALLOWED, "status: use GET"), "Allow: GET, HEAD\r\n", NULL);
        return;
    }
    int fmt = format_of(r, 1);
    if (fmt < 0) {
        respond(r, s, oi_status_new(OI_BAD_REQUEST, "format: expected text, binary or json"), NULL, NULL);
        return;
    }
    oi_sbuf_t body = {0};
    oi_status_t *st = oi_legacy_server_status(s, model, (oi_legacy_format_t)fmt, &body);
    if (st != NULL) {
        oi_sbuf_free(&body);
        respond(r, s, st, NULL, NULL);
        return;
    }
    respond(r, s, NULL,
            fmt == OI_LEGACY_BINARY ? OCTET
            : fmt == OI_LEGACY_JSON ? "Content-Type: application/json\r\n"
                                    : "Content-Type: text/plain\r\n",
            &body);
}

/* ---- inference ---------------------------------------------------------------------------- */

typedef struct http_infer_s {
    oi_legacy_infer_t *li;
    oi_http_request_t *r;
    oi_server_t *s;
    int binary; /* ?format=binary: the response header at the end of the body serialized */
} http_infer_t;

static void respond_infer_error(oi_http_request_t *r, oi_server_t *s, const oi_legacy_infer_t *li, oi_status_t *st)
{
    oi_sbuf_t extra = {0};
    if (oi_sbuf_append(&extra, "NV-InferResponse: ", 18) != 0 || oi_legacy_error_header(li, &extra) != 0 ||
        oi_sbuf_append(&extra, "\r\n" OCTET, 2 + sizeof(OCTET) - 1) != 0 || oi_sbuf_append(&extra, "", 1) != 0) {
        oi_sbuf_free(&extra);
        respond(r, s, st, NULL, NULL);
        return;
    }
    respond(r, s, st, extra.data, NULL);
    oi_sbuf_free(&extra);
}

static void infer_done(oi_infer_t *inf)
{
    oi_legacy_infer_t *li = inf->ctx;
    http_infer_t *h = li->transport;
    oi_http_request_t *r = h->r;
    if (inf->cancelled) {
        oi_http_respond(r, OI_CLIENT_CLOSED, "", NULL, 0);
        goto out;
    }
    oi_status_t *st = inf->job.status;
    inf->job.status = NULL;
    const oi_response_t *resp = &inf->job.resp;
    oi_sbuf_t head = {0}, tail = {0};
    oi_iov_t *parts = st == NULL ? malloc((resp->n_outputs + 1) * sizeof(*parts)) : NULL;
    if (st == NULL &&
        (parts == NULL || oi_sbuf_append(&head, "NV-InferResponse: ", 18) != 0 ||
         oi_legacy_response_header(li, h->binary ? OI_LEGACY_BINARY : OI_LEGACY_TEXT, &tail, &head) != 0 ||
         oi_sbuf_append(&head, "\r\n" OCTET, 2 + sizeof(OCTET) - 1) != 0 || oi_sbuf_append(&head, "", 1) != 0))
        st = oi_status_new(OI_INTERNAL, "out of memory");
    oi_buf_t *tail_buf = st == NULL ? oi_sbuf_detach(&tail) : NULL;
    if (st == NULL && tail_buf == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st != NULL) {
        oi_sbuf_free(&head);
        oi_sbuf_free(&tail);
        free(parts);
        respond_infer_error(r, h->s, li, st);
        goto out;
    }
    size_t n = 0;
    for (uint32_t i = 0; i < resp->n_outputs && i < li->hdr->n_output; i++) {
        const oi_tensor_t *o = &resp->outputs[i];
        if (li->cls[i] == 0 && !o->shm && o->byte_size > 0) /* shared-memory outputs: in their region */
            parts[n++] = (oi_iov_t){o->data, o->byte_size, o->owner ? oi_buf_ref(o->owner) : NULL};
    }
    parts[n++] = (oi_iov_t){tail_buf->data, tail_buf->len, tail_buf};
    oi_sbuf_t hdrs = {0};
    if (status_headers(&hdrs, NULL, li->request_id, head.data) != 0) {
        for (size_t i = 0; i < n; i++)
            oi_buf_unref(parts[i].owner);
        respond_infer_error(r, h->s, li, oi_status_new(OI_INTERNAL, "out of memory"));
    } else {
        oi_http_respond(r, 200, hdrs.data, parts, n);
    }
    oi_sbuf_free(&hdrs);
    oi_sbuf_free(&head);
    free(parts);
out:
    oi_legacy_infer_free(li);
    free(h);
}

static const oi_peer_t *peer_of(void *r)
{
    return oi_http_request_peer(r);
}

static void infer_gone(oi_http_request_t *r)
{
    http_infer_t *h = r->gone_arg;
    oi_infer_cancel(h->li->inf);
}

/* "<model>[/<version>]" into name and version ("" when none). -1 when malformed. */
static int split_model(const char *p, char *name, size_t ncap, char *version, size_t vcap)
{
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n >= ncap)
        return -1;
    memcpy(name, p, n);
    name[n] = '\0';
    version[0] = '\0';
    if (slash == NULL)
        return 0;
    const char *v = slash + 1;
    size_t vn = strlen(v);
    if (vn == 0 || vn >= vcap || strspn(v, "0123456789") != vn)
        return -1;
    memcpy(version, v, vn + 1);
    return 0;
}

static void handle_infer(oi_server_t *s, oi_http_request_t *r, const char *rest)
{
    if (r->method != HTTP_POST) {
        respond(r, s, oi_status_new(OI_METHOD_NOT_ALLOWED, "infer: use POST"), "Allow: POST\r\n", NULL);
        return;
    }
    char name[256], version[24];
    if (split_model(rest, name, sizeof(name), version, sizeof(version)) != 0) {
        respond(r, s,
                oi_status_new(OI_BAD_REQUEST,
                              "expected /api/infer/<model name>[/<version number>], got /api/infer/%.200s", rest),
                NULL, NULL);
        return;
    }
    int fmt = format_of(r, 0);
    if (fmt < 0) {
        respond(r, s, oi_status_new(OI_BAD_REQUEST, "format: expected text or binary"), NULL, NULL);
        return;
    }
    if (r->nv_infer_request == NULL) {
        respond_infer_error(r, s, NULL,
                            oi_status_new(OI_BAD_REQUEST, "missing NV-InferRequest header: expected a text "
                                                          "InferRequestHeader, e.g. 'batch_size: 1 input { name: "
                                                          "\"INPUT0\" } output { name: \"OUTPUT0\" }'"));
        return;
    }
    char err[256];
    ProtobufCMessage *msg = oi_pbtext_parse(&nvidia__inferenceserver__infer_request_header__descriptor,
                                            r->nv_infer_request, r->nv_infer_request_len, err, sizeof(err));
    if (msg == NULL) {
        respond_infer_error(r, s, NULL, oi_status_new(OI_BAD_REQUEST, "NV-InferRequest: %s", err));
        return;
    }
    http_infer_t *h = calloc(1, sizeof(*h));
    oi_legacy_infer_t *li = oi_legacy_infer_new((oi_legacy_req_header_t *)msg, oi_legacy_next_id(s));
    if (h == NULL || li == NULL) {
        free(h);
        oi_legacy_infer_free(li);
        respond(r, s, oi_status_new(OI_INTERNAL, "out of memory"), NULL, NULL);
        return;
    }
    *h = (http_infer_t){li, r, s, fmt == OI_LEGACY_BINARY};
    li->transport = h;
    oi_status_t *st = NULL;
    oi_model_t *m = oi_registry_find(&s->registry, name, version, &st);
    if (m != NULL && oi_content_encoding(r->content_encoding) != OI_ENCODING_IDENTITY)
        st = oi_status_new(OI_UNSUPPORTED_MEDIA, "Content-Encoding '%s' is not accepted by the legacy API",
                           r->content_encoding);
    if (m != NULL && st == NULL)
        st = oi_model_check_ready(m);
    if (st == NULL)
        st = oi_legacy_decode(li, m, r->body, r->body ? r->body->data : NULL, r->body ? r->body->len : 0, NULL, 0);
    if (st == NULL) {
        oi_infer_t *inf = li->inf;
        inf->shm = &s->shm;
        inf->shm_caller = (oi_shm_caller_t){peer_of, r};
        inf->count_stats = s->cfg.statistics;
        if (s->tracer != NULL)
            (void)oi_infer_trace_begin(inf, s->tracer, m, 0, r->start_ns, oi_now_ns());
        st = oi_infer_submit(inf, m, r->loop, infer_done, li); /* takes m */
        m = NULL;
        if (st == NULL) {
            r->on_gone = infer_gone;
            r->gone_arg = h;
            return;
        }
    }
    oi_model_unref(m);
    respond_infer_error(r, s, li, st);
    oi_legacy_infer_free(li);
    free(h);
}

/* Copies the path segment at p (up to '/' or the end) into out; returns its end, or NULL when
 * it is empty or too long. */
static const char *segment(const char *p, char *out, size_t cap)
{
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= cap)
        return NULL;
    memcpy(out, p, n);
    out[n] = '\0';
    return p + n;
}

static int parse_u64(const char *p, uint64_t *v)
{
    if (*p == '\0' || strspn(p, "0123456789") != strlen(p) || strlen(p) > 19)
        return -1;
    *v = strtoull(p, NULL, 10);
    return 0;
}

/* /api/sharedmemorycontrol/register/<name>/<key>/<offset>/<byte_size> (the key with its
 * leading '/', as 1.x's client sends it), unregister/<name>, unregisterall, status. */
static void handle_shm(oi_server_t *s, oi_http_request_t *r, const char *rest)
{
    if (r->method != HTTP_POST && !(is_get(r) && strcmp(rest, "status") == 0)) {
        respond(r, s, oi_status_new(OI_METHOD_NOT_ALLOWED, "sharedmemorycontrol: use POST"), "Allow: POST\r\n", NULL);
        return;
    }
    const oi_peer_t *peer = oi_http_request_peer(r);
    char name[256], key[256], off[32], size[32];
    const char *p;
    oi_status_t *st;
    if (strncmp(rest, "register/", 9) == 0) {
        uint64_t offset, byte_size;
        key[0] = '/';
        if ((p = segment(rest + 9, name, sizeof(name))) == NULL || strncmp(p, "//", 2) != 0 ||
            (p = segment(p + 2, key + 1, sizeof(key) - 1)) == NULL || *p++ != '/' ||
            (p = segment(p, off, sizeof(off))) == NULL || *p++ != '/' || (p = segment(p, size, sizeof(size))) == NULL ||
            *p != '\0' || parse_u64(off, &offset) != 0 || parse_u64(size, &byte_size) != 0)
            st = oi_status_new(OI_BAD_REQUEST, "expected /api/sharedmemorycontrol/register/<name>/<key>/<offset>/"
                                               "<byte size>, the key with its leading '/'");
        else
            st = oi_shm_register_system(&s->shm, peer, name, key, offset, byte_size);
    } else if (strncmp(rest, "unregister/", 11) == 0) {
        if ((p = segment(rest + 11, name, sizeof(name))) == NULL || *p != '\0')
            st = oi_status_new(OI_BAD_REQUEST, "expected /api/sharedmemorycontrol/unregister/<name>");
        else
            st = oi_shm_unregister(&s->shm, peer, OI_SHM_SYSTEM, name);
    } else if (strcmp(rest, "unregisterall") == 0) {
        st = oi_shm_unregister(&s->shm, peer, OI_SHM_SYSTEM, NULL);
    } else if (strcmp(rest, "status") == 0) {
        int fmt = format_of(r, 1);
        oi_sbuf_t body = {0};
        st = fmt < 0 ? oi_status_new(OI_BAD_REQUEST, "format: expected text, binary or json")
                     : oi_legacy_shm_status(s, peer, (oi_legacy_format_t)fmt, &body, 0);
        if (st == NULL) {
            respond(r, s, NULL, fmt == OI_LEGACY_BINARY ? OCTET : "Content-Type: text/plain\r\n", &body);
            return;
        }
        oi_sbuf_free(&body);
    } else {
        st = oi_status_new(OI_BAD_REQUEST,
                           "unknown shared memory action in %.200s; expected register, unregister, "
                           "unregisterall or status",
                           r->path);
    }
    respond(r, s, st, NULL, NULL);
}

void oi__legacy_http_refuse(oi_server_t *s, oi_http_request_t *r, const char *message)
{
    oi_status_t st = {.code = OI_UNAVAILABLE, .message = (char *)message}; /* borrowed */
    oi_sbuf_t h = {0}, body = {0};
    if (status_headers(&h, &st, oi_legacy_next_id(s), "Content-Type: application/json\r\n") != 0 ||
        oi_json_encode_error(&body, message) != 0) {
        oi_sbuf_free(&h);
        oi_sbuf_free(&body);
        oi_http_respond(r, 500, "", NULL, 0);
        return;
    }
    oi_buf_t *b = oi_sbuf_detach(&body);
    oi_sbuf_free(&body);
    oi_iov_t part = {b ? b->data : NULL, b ? b->len : 0, b};
    oi_http_respond(r, 403, h.data, &part, b ? 1 : 0);
    oi_sbuf_free(&h);
}

unsigned oi__legacy_http_groups(const char *p)
{
    if (strncmp(p, "health/", 7) == 0)
        return OI_API_BIT(OI_API_HEALTH);
    if (strncmp(p, "status", 6) == 0 && (p[6] == '\0' || p[6] == '/'))
        return OI_API_BIT(OI_API_METADATA) | OI_API_BIT(OI_API_MODEL_CONFIG) | OI_API_BIT(OI_API_STATISTICS);
    if (strncmp(p, "infer/", 6) == 0)
        return OI_API_BIT(OI_API_INFERENCE);
    if (strncmp(p, "sharedmemorycontrol/", 20) == 0)
        return OI_API_BIT(OI_API_SHARED_MEMORY);
    return 0;
}

int oi__legacy_http_handle(oi_server_t *s, oi_http_request_t *r)
{
    const char *p = r->path;
    if (strncmp(p, "/api/", 5) != 0)
        return 0;
    p += 5;
    if (strncmp(p, "health/", 7) == 0)
        handle_health(s, r, p + 7);
    else if (strcmp(p, "status") == 0 || strcmp(p, "status/") == 0)
        handle_status(s, r, NULL);
    else if (strncmp(p, "status/", 7) == 0)
        handle_status(s, r, p + 7);
    else if (strncmp(p, "infer/", 6) == 0)
        handle_infer(s, r, p + 6);
    else if (strncmp(p, "sharedmemorycontrol/", 20) == 0)
        handle_shm(s, r, p + 20);
    else
        respond(r, s, oi_status_new(OI_BAD_REQUEST, "no legacy endpoint at %.200s", r->path), NULL, NULL);
    return 1;
}
