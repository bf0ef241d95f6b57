/* What the server-level fuzz targets (fuzz_http1.c, fuzz_grpc.c) share: a real server with a
 * few models, on a loop that the target runs on its own thread (http.inline_loop), and a
 * driver that hands the server one end of a socketpair, writes the input into the other end
 * as a client would, and runs the loop until the server has answered all it will (models run
 * on their executor threads, as in production). Each input gets a fresh connection; the
 * models and the server live for the whole run.
 *
 * The models are the shapes of Triton's examples, served by an echo backend written here (no
 * Python): "simple" (two INT32 [-1, 16], max_batch_size 8, dynamic batching), "simple_string"
 * (the same in BYTES, no batching), "identity_fp32" (FP32 of any length, no batch) and
 * "broken" (a model that failed to load).
 *
 * Shared memory is open, but the only key that can be opened is OI_FUZZ_SHM_KEY, which the
 * harness backs with a memfd of its own (shm_fence.h). */
#ifndef OI_FUZZ_SERVER_HARNESS_H
#define OI_FUZZ_SERVER_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <llhttp.h>
#include <nghttp2/nghttp2.h>

#include "codec/json.h"
#include "server/models/registry.h"
#include "shm_fence.h"
#include "server/server.h"

static oi_server_t *harness_server;
static int harness_verbose; /* OI_FUZZ_VERBOSE set: the server's answers go to stderr */

static void harness_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* ---- the echo backend -------------------------------------------------------------------- */

/* Output i is a view of the request's input named like the model's input i (else of its
 * first input), so that dtypes and shapes match what the model declares. */
static oi_status_t *echo_execute(void *state, const oi_request_t *req, const char *const *names, uint32_t n,
                                 oi_response_t *resp)
{
    const oi_model_t *m = state;
    resp->outputs = calloc(n ? n : 1, sizeof(*resp->outputs));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = 0;
        while (k < m->n_outputs && strcmp(m->outputs[k].name, names[i]) != 0)
            k++;
        const oi_tensor_t *src = &req->inputs[0];
        for (uint32_t j = 0; k < m->n_inputs && j < req->n_inputs; j++)
            if (strcmp(req->inputs[j].name, m->inputs[k].name) == 0)
                src = &req->inputs[j];
        oi_tensor_t *t = &resp->outputs[resp->n_outputs++];
        t->name = names[i];
        t->dtype = src->dtype;
        t->ndim = src->ndim;
        memcpy(t->shape, src->shape, sizeof(t->shape));
        t->data = src->data;
        t->byte_size = src->byte_size;
        t->owner = src->owner ? oi_buf_ref(src->owner) : NULL;
    }
    return NULL;
}

static void echo_release(void *state)
{
    (void)state;
}

static const oi_backend_t echo_backend = {"fuzz-echo", echo_execute, echo_release};

static void add_model(const char *name, int max_batch, oi_dtype_t dtype, int ndim, const int64_t *dims, int n_io,
                      const oi_batching_t *batching, const char *error)
{
    oi_io_spec_t in[2], out[2];
    static char *in_names[] = {"INPUT0", "INPUT1"}, *out_names[] = {"OUTPUT0", "OUTPUT1"};
    for (int i = 0; i < n_io; i++) {
        in[i] = (oi_io_spec_t){.name = in_names[i], .dtype = dtype, .ndim = ndim};
        memcpy(in[i].dims, dims, (size_t)ndim * sizeof(*dims));
        out[i] = in[i];
        out[i].name = out_names[i];
    }
    oi_model_t *m = oi_model_new(name, 1, max_batch, in, (uint32_t)n_io, out, (uint32_t)n_io);
    if (m == NULL)
        harness_die("out of memory");
    char meta[512];
    int len = snprintf(meta, sizeof(meta), "{\"name\":\"%s\",\"versions\":[\"1\"],\"platform\":\"fuzz\"}", name);
    m->metadata = oi_buf_new((size_t)len);
    memcpy(m->metadata->data, meta, (size_t)len);
    m->metadata->len = (size_t)len;
    if (error != NULL) {
        m->error = strdup(error);
    } else {
        char err[256];
        m->backend = &echo_backend;
        m->state = m;
        m->sched = oi_scheduler_new_batching(&echo_backend, m, 1, batching, err, sizeof(err));
        if (m->sched == NULL)
            harness_die("scheduler: %s", err);
    }
    if (oi_server_add_model(harness_server, m) != 0)
        harness_die("model %s registered twice", name);
}

/* ---- the server -------------------------------------------------------------------------- */

static void harness_init(void)
{
    harness_verbose = getenv("OI_FUZZ_VERBOSE") != NULL;
    fence_init();
    /* One restricted group per protocol, so that inputs reach the header capture and the
     * check: model configuration, with key x-fuzz-key: fuzz (gRPC: its Triton prefix). */
    static oi_restricted_t http_restricted, grpc_restricted;
    if (oi_restricted_set(&http_restricted, OI_API_MODEL_CONFIG, "X-Fuzz-Key", "fuzz") != 0 ||
        oi_restricted_set(&grpc_restricted, OI_API_MODEL_CONFIG, "triton-grpc-protocol-x-fuzz-key", "fuzz") != 0)
        harness_die("out of memory");
    oi_server_config_t cfg = {
        .http_restricted = &http_restricted,
        .grpc_restricted = &grpc_restricted,
        .http =
            {
                .max_body_bytes = 64 << 10, /* small, so that inputs reach the limits */
                .max_header_bytes = 8192,
                .max_connections = 64,
                /* Long enough never to fire within one input: timers are not what is fuzzed. */
                .first_byte_timeout_ms = 600000,
                .header_timeout_ms = 600000,
                .body_timeout_ms = 600000,
                .idle_timeout_ms = 600000,
                .inline_loop = 1,
            },
        .max_json_depth = 64,
        .grpc_port = 0,
        .grpc_max_message_bytes = 64 << 10,
        .allow_shared_memory = 1,
    };
    harness_server = oi_server_new(&cfg);
    if (harness_server == NULL)
        harness_die("oi_server_new failed");
    static const int64_t batch16[] = {-1, 16}, any[] = {-1};
    oi_batching_t batching = {.max_batch_size = 8, .max_queue_delay_us = 100, .preferred = {4}, .n_preferred = 1};
    add_model("simple", 8, OI_TYPE_INT32, 2, batch16, 2, &batching, NULL);
    add_model("simple_string", 8, OI_TYPE_BYTES, 2, batch16, 2, NULL, NULL);
    add_model("identity_fp32", 0, OI_TYPE_FP32, 1, any, 1, NULL, NULL);
    add_model("broken", 0, OI_TYPE_FP32, 1, any, 1, NULL, "failed to load: the fuzz harness says so");
    static const char meta[] = "{\"name\":\"openinfer\",\"version\":\"fuzz\",\"extensions\":[]}";
    oi_server_set_metadata(harness_server, meta, sizeof(meta) - 1);
    char err[256];
    if (oi_server_start(harness_server, err, sizeof(err)) != 0)
        harness_die("oi_server_start: %s", err);
}

/* ---- what a client would make of the answers (HTTP/1.1) ------------------------------------ */

typedef struct oracle_s {
    int methods[256]; /* of the input's complete requests, in order */
    int nrequests;
    int nresponses; /* final (non-1xx) responses */
    int status;
    oi_sbuf_t body;    /* of the response being read */
    oi_sbuf_t field;   /* the header name being read */
    long json_len;     /* Inference-Header-Content-Length, -1 when absent */
} oracle_t;

static int oracle_on_request(llhttp_t *p)
{
    oracle_t *o = p->data;
    if (o->nrequests < 256)
        o->methods[o->nrequests] = p->method;
    o->nrequests++;
    return 0;
}

static int oracle_on_response_headers(llhttp_t *p)
{
    oracle_t *o = p->data;
    o->status = p->status_code;
    if (p->status_code < 200)
        return 0;
    /* A response to HEAD has no body, whatever its Content-Length says: 1 tells llhttp so. */
    int i = o->nresponses;
    return i < o->nrequests && i < 256 && o->methods[i] == HTTP_HEAD ? 1 : 0;
}

static int oracle_on_field(llhttp_t *p, const char *at, size_t n)
{
    oracle_t *o = p->data;
    return oi_sbuf_append(&o->field, at, n);
}

static int oracle_on_value(llhttp_t *p, const char *at, size_t n)
{
    oracle_t *o = p->data;
    static const char name[] = "inference-header-content-length";
    if (o->field.len == sizeof(name) - 1 && strncasecmp(o->field.data, name, sizeof(name) - 1) == 0)
        o->json_len = strtol(at, NULL, 10); /* the value ends with CRLF */
    (void)n;
    return 0;
}

static int oracle_on_value_complete(llhttp_t *p)
{
    ((oracle_t *)p->data)->field.len = 0;
    return 0;
}

static int oracle_on_body(llhttp_t *p, const char *at, size_t n)
{
    oracle_t *o = p->data;
    if (oi_sbuf_append(&o->body, at, n) != 0)
        harness_die("out of memory");
    return 0;
}

static int oracle_on_response(llhttp_t *p)
{
    oracle_t *o = p->data;
    if (p->status_code >= 200)
        o->nresponses++;
    /* An error's JSON body must be well-formed JSON: its message quotes what the client sent.
     * (Answers with tensor data may hold the NaN and Infinity tokens that README.md allows,
     * which a strict reader refuses.) */
    oi_json_param_t v;
    char none[1];
    size_t n = o->json_len >= 0 && (size_t)o->json_len < o->body.len ? (size_t)o->json_len : o->body.len;
    if (p->status_code >= 400 && n > 0 && o->body.data[0] == '{' && oi_json_param((oi_slice_t){o->body.data, n}, "\x01", &v, none, 1) != 0)
        harness_die("answer %d (status %d) has a malformed JSON body: %.*s", o->nresponses, p->status_code,
                    (int)(o->body.len < 300 ? o->body.len : 300), o->body.data);
    o->body.len = 0;
    o->json_len = -1;
    return 0;
}

/* The server's answers to `in` must read as a client reads them: well-formed HTTP/1.1
 * responses, each complete, at most one per request (one more for a request the server
 * refuses to parse), no body after an answer to HEAD, JSON object bodies well-formed. Aborts
 * with the reason otherwise: a client would misread every answer that follows. */
static void harness_check_http(const uint8_t *in, size_t in_len, const char *out, size_t out_len)
{
    oracle_t o = {.json_len = -1};
    llhttp_settings_t rs, ps;
    llhttp_settings_init(&rs);
    llhttp_settings_init(&ps);
    rs.on_message_complete = oracle_on_request;
    ps.on_headers_complete = oracle_on_response_headers;
    ps.on_body = oracle_on_body;
    ps.on_header_field = oracle_on_field;
    ps.on_header_value = oracle_on_value;
    ps.on_header_value_complete = oracle_on_value_complete;
    ps.on_message_complete = oracle_on_response;
    llhttp_t req, resp;
    llhttp_init(&req, HTTP_REQUEST, &rs);
    req.data = &o;
    if (in_len > 0)
        llhttp_execute(&req, (const char *)in, in_len); /* up to the first malformed byte */
    llhttp_init(&resp, HTTP_RESPONSE, &ps);
    resp.data = &o;
    llhttp_errno_t err = out_len > 0 ? llhttp_execute(&resp, out, out_len) : HPE_OK;
    if (err != HPE_OK)
        harness_die("the server's answers do not parse as HTTP/1.1 responses after %d of them: %s (%s)",
                    o.nresponses, llhttp_errno_name(err), llhttp_get_error_reason(&resp));
    if (llhttp_finish(&resp) != HPE_OK)
        harness_die("the server's last answer is cut short (after %d complete ones)", o.nresponses);
    if (o.nresponses > o.nrequests + 1)
        harness_die("the server gave %d answers to %d requests", o.nresponses, o.nrequests);
    oi_sbuf_free(&o.body);
    oi_sbuf_free(&o.field);
}

/* ---- what a client would make of the answers (gRPC) ------------------------------------------ */

typedef struct grpc_stream_s {
    int32_t id;
    int state;         /* 1: response headers came, 2: ended (END_STREAM or RST_STREAM) */
    uint64_t msg_left; /* bytes of the response message being read; prefix bytes below */
    int prefix_have;
    uint8_t prefix[5];
} grpc_stream_t;

static grpc_stream_t *grpc_stream(grpc_stream_t *streams, int *n, int32_t id)
{
    for (int i = 0; i < *n; i++)
        if (streams[i].id == id)
            return &streams[i];
    if (*n == 1024)
        harness_die("more than 1024 streams in one answer");
    streams[*n] = (grpc_stream_t){.id = id};
    return &streams[(*n)++];
}

/* Decodes one header block; reports whether it has :status and grpc-status. */
static void grpc_headers(nghttp2_hd_inflater *inf, const uint8_t *in, size_t len, int *status, int *grpc_status)
{
    *status = *grpc_status = 0;
    for (;;) {
        nghttp2_nv nv;
        int flags = 0;
        ssize_t n = nghttp2_hd_inflate_hd2(inf, &nv, &flags, in, len, 1);
        if (n < 0)
            harness_die("the server's header block does not decode (HPACK): %s", nghttp2_strerror((int)n));
        in += n, len -= (size_t)n;
        if (flags & NGHTTP2_HD_INFLATE_EMIT) {
            *status |= nv.namelen == 7 && memcmp(nv.name, ":status", 7) == 0;
            *grpc_status |= nv.namelen == 11 && memcmp(nv.name, "grpc-status", 11) == 0;
            if (nv.namelen == 12 && memcmp(nv.name, "grpc-message", 12) == 0) /* percent-encoded */
                for (size_t i = 0; i < nv.valuelen; i++)
                    if (nv.value[i] < 0x20 || nv.value[i] > 0x7e)
                        harness_die("grpc-message has byte 0x%02x: not percent-encoded", nv.value[i]);
        }
        if (flags & NGHTTP2_HD_INFLATE_FINAL) {
            nghttp2_hd_inflate_end_headers(inf);
            return;
        }
        if (n == 0 && len == 0)
            harness_die("a header block ends inside a header");
    }
}

/* The server's side of a gRPC connection must read as a client reads it: whole frames; per
 * call one response (HEADERS, DATA holding whole length-prefixed messages, trailers with
 * grpc-status, or Trailers-Only) and nothing after its end. Aborts with the reason otherwise. */
static void harness_check_grpc(const uint8_t *p, size_t len)
{
    static grpc_stream_t streams[1024];
    int nstreams = 0;
    nghttp2_hd_inflater *inf;
    if (nghttp2_hd_inflate_new(&inf) != 0)
        harness_die("out of memory");
    oi_sbuf_t block = {0}; /* a header block spread over HEADERS and CONTINUATION */
    int32_t block_stream = 0;
    int block_end_stream = 0;
    while (len > 0) {
        if (len < 9)
            harness_die("the server's answer ends inside a frame header");
        size_t flen = (size_t)p[0] << 16 | (size_t)p[1] << 8 | p[2];
        uint8_t type = p[3], flags = p[4];
        int32_t id = (int32_t)(((uint32_t)p[5] << 24 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 8 | p[8]) & 0x7fffffffu);
        if (len - 9 < flen)
            harness_die("the server's answer ends inside a frame");
        const uint8_t *payload = p + 9;
        p += 9 + flen, len -= 9 + flen;
        if (block_stream != 0 && type != NGHTTP2_CONTINUATION)
            harness_die("a header block is interrupted by a frame of type %u", type);
        grpc_stream_t *st = id != 0 ? grpc_stream(streams, &nstreams, id) : NULL;
        if (type == NGHTTP2_DATA) {
            if (st == NULL || st->state != 1)
                harness_die("DATA on stream %d %s", id, st && st->state == 2 ? "after its end" : "before its headers");
            if (flags & NGHTTP2_FLAG_END_STREAM)
                harness_die("stream %d ends with DATA: no trailers, no grpc-status", id);
            for (size_t i = 0; i < flen; i++) { /* whole length-prefixed messages */
                if (st->prefix_have < 5) {
                    st->prefix[st->prefix_have++] = payload[i];
                    if (st->prefix_have == 5)
                        st->msg_left = (uint64_t)st->prefix[1] << 24 | (uint64_t)st->prefix[2] << 16 |
                                       (uint64_t)st->prefix[3] << 8 | st->prefix[4];
                } else {
                    size_t take = flen - i < st->msg_left ? flen - i : (size_t)st->msg_left;
                    st->msg_left -= take;
                    i += take - 1;
                }
                if (st->prefix_have == 5 && st->msg_left == 0)
                    st->prefix_have = 0;
            }
        } else if (type == NGHTTP2_HEADERS || type == NGHTTP2_CONTINUATION) {
            if (type == NGHTTP2_HEADERS) {
                if (st == NULL || st->state == 2)
                    harness_die("HEADERS on stream %d after its end: a second answer to one call", id);
                block_stream = id;
                block_end_stream = (flags & NGHTTP2_FLAG_END_STREAM) != 0;
                block.len = 0;
            } else if (id != block_stream) {
                harness_die("CONTINUATION on stream %d outside a header block", id);
            }
            if (oi_sbuf_append(&block, payload, flen) != 0)
                harness_die("out of memory");
            if (!(flags & NGHTTP2_FLAG_END_HEADERS))
                continue;
            block_stream = 0;
            int status, grpc_status;
            grpc_headers(inf, (const uint8_t *)block.data, block.len, &status, &grpc_status);
            if (st->state == 0 && !status)
                harness_die("the first HEADERS of stream %d has no :status", id);
            if (st->state == 1 && (status || !block_end_stream))
                harness_die("stream %d: headers after the response headers are not trailers", id);
            if (block_end_stream && !grpc_status)
                harness_die("stream %d ends without grpc-status", id);
            if (block_end_stream && st->prefix_have > 0)
                harness_die("stream %d ends inside a response message", id);
            st->state = block_end_stream ? 2 : 1;
        } else if (type == NGHTTP2_RST_STREAM && st != NULL) {
            st->state = 2;
        } else if (type == NGHTTP2_PUSH_PROMISE) {
            harness_die("the server pushed (PUSH_PROMISE)");
        }
    }
    oi_sbuf_free(&block);
    nghttp2_hd_inflate_del(inf);
}

static size_t unread_bytes(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0 ? (size_t)n : 0;
}

/* Serves `data` to a fresh connection (gRPC when `grpc`), as one client writing it and reading
 * whatever comes back, until the server has nothing more to do for it; then hangs up and lets
 * the connection go. With `chunk` > 0 the client writes `chunk` bytes at a time and the
 * server reads each before the next arrives, so that every parser meets its input split at
 * every place; 0 writes all at once. Returns the response bytes. */
static size_t harness_drive(const uint8_t *data, size_t size, int grpc, size_t chunk)
{
    uv_loop_t *loop = &oi_server_inline_loop(harness_server)->uv;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        harness_die("socketpair: %s", strerror(errno));
    int client = sv[0], server_fd = sv[1];
    if (oi_server_adopt(harness_server, server_fd, grpc) != 0)
        harness_die("adopt failed");
    size_t sent = 0, got = 0;
    oi_sbuf_t answers = {0}; /* what the server wrote, for the client's-eye checks */
    int idle_rounds = 0, eof = 0;
    char rbuf[65536];
    while (!eof) {
        int progress = 0;
        if (sent < size) {
            size_t n = chunk > 0 && size - sent > chunk ? chunk : size - sent;
            ssize_t w = send(client, data + sent, n, MSG_NOSIGNAL);
            if (w > 0) {
                sent += (size_t)w;
                progress = 1;
            } else if (w < 0 && errno != EAGAIN) {
                sent = size; /* the server hung up: what is left goes nowhere */
            }
        }
        size_t before = unread_bytes(server_fd);
        uv_run(loop, UV_RUN_NOWAIT);
        for (;;) {
            ssize_t r = recv(client, rbuf, sizeof(rbuf), 0);
            if (r > 0) {
                if (harness_verbose)
                    fwrite(rbuf, 1, (size_t)r, stderr);
                if (oi_sbuf_append(&answers, rbuf, (size_t)r) != 0)
                    harness_die("out of memory");
                got += (size_t)r;
                progress = 1;
                continue;
            }
            if (r == 0 || (r < 0 && errno != EAGAIN))
                eof = 1; /* the server closed the connection */
            break;
        }
        if (eof)
            break;
        size_t left = unread_bytes(server_fd);
        if (left != before)
            progress = 1;
        if (oi_server_inflight(harness_server) > 0) {
            if (!progress)
                uv_run(loop, UV_RUN_ONCE); /* a model is running: wait for its completion */
            idle_rounds = 0;
        } else if (progress) {
            idle_rounds = 0;
        } else if (sent == size && ++idle_rounds >= 3) {
            break; /* answered everything it will: the rest waits for bytes that never come */
        }
    }
    close(client);
    /* The server sees EOF, closes, and frees the connection once its handles are closed. */
    for (int i = 0; i < 4; i++)
        uv_run(loop, UV_RUN_NOWAIT);
    if (grpc)
        harness_check_grpc((const uint8_t *)answers.data, answers.len);
    else
        harness_check_http(data, size, answers.data, answers.len);
    oi_sbuf_free(&answers);
    return got;
}

/* Unregisters every region an input registered, so that each input starts from the same
 * state (the regions are the only state a request leaves behind in the server). */
static void harness_reset(void)
{
    int verbose = harness_verbose;
    harness_verbose = 0;
    static const char req[] = "POST /v2/systemsharedmemory/unregister HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
                              "POST /v2/cudasharedmemory/unregister HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    harness_drive((const uint8_t *)req, sizeof(req) - 1, 0, 0);
    harness_verbose = verbose;
}

/* The first byte of a server target's input: how the rest is written (see harness_drive):
 * 0 all at once, else in pieces of that many bytes. */
static size_t harness_chunk(const uint8_t **data, size_t *size)
{
    if (*size == 0)
        return 0;
    size_t chunk = (*data)[0];
    (*data)++, (*size)--;
    return chunk;
}

#endif
