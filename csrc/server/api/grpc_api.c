/* The V2 gRPC service (inference.GRPCInferenceService) over the HTTP/2 transport. Requests go
 * through the same registry, validation and oi_infer_submit as the REST API: the transports
 * differ, the request path does not. This file holds the RPC table, the dispatch, health and
 * metadata; ModelInfer and ModelStreamInfer are in grpc_infer.c (the purpose-built wire codec,
 * codec/pb_infer.h), the extensions in grpc_control.c (protobuf-c, as the messages here). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

#include "server/infer.h"
#include "server/server_impl.h"
#include "transport/grpc.h"
#include "server/api/grpc_api_impl.h"

#define SERVICE "/inference.GRPCInferenceService/"
#define HEALTH_SERVICE "/grpc.health.v1.Health/"

/* The RPCs, and the restricted-API group tritonserver files each under. */
static const struct {
    const char *name;
    int kind;
    oi_api_group_t group;
} rpcs[] = {
    {"ServerLive", RPC_SERVER_LIVE, OI_API_HEALTH},
    {"ServerReady", RPC_SERVER_READY, OI_API_HEALTH},
    {"ModelReady", RPC_MODEL_READY, OI_API_HEALTH},
    {"ServerMetadata", RPC_SERVER_METADATA, OI_API_METADATA},
    {"ModelMetadata", RPC_MODEL_METADATA, OI_API_METADATA},
    {"ModelConfig", RPC_MODEL_CONFIG, OI_API_MODEL_CONFIG},
    {"ModelInfer", RPC_MODEL_INFER, OI_API_INFERENCE},
    {"ModelStreamInfer", RPC_MODEL_STREAM_INFER, OI_API_INFERENCE},
    {"SystemSharedMemoryStatus", RPC_SYS_SHM_STATUS, OI_API_SHARED_MEMORY},
    {"SystemSharedMemoryRegister", RPC_SYS_SHM_REGISTER, OI_API_SHARED_MEMORY},
    {"SystemSharedMemoryUnregister", RPC_SYS_SHM_UNREGISTER, OI_API_SHARED_MEMORY},
    {"CudaSharedMemoryStatus", RPC_CUDA_SHM_STATUS, OI_API_SHARED_MEMORY},
    {"CudaSharedMemoryRegister", RPC_CUDA_SHM_REGISTER, OI_API_SHARED_MEMORY},
    {"CudaSharedMemoryUnregister", RPC_CUDA_SHM_UNREGISTER, OI_API_SHARED_MEMORY},
    {"RepositoryIndex", RPC_REPO_INDEX, OI_API_MODEL_REPOSITORY},
    {"RepositoryModelLoad", RPC_REPO_LOAD, OI_API_MODEL_REPOSITORY},
    {"RepositoryModelUnload", RPC_REPO_UNLOAD, OI_API_MODEL_REPOSITORY},
    {"ModelStatistics", RPC_MODEL_STATISTICS, OI_API_STATISTICS},
    {"LogSettings", RPC_LOG_SETTINGS, OI_API_LOGGING},
    {"TraceSetting", RPC_TRACE_SETTING, OI_API_TRACE},
};

/* ---- the access log ----------------------------------------------------------------------- */

static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

/* Names the model an RPC asked for in its access log line (a stream's last request's). */
void oi__grpc_note_model(const oi_server_t *s, oi_grpc_call_t *call, const char *name, const char *version)
{
    if (s->access_log == NULL)
        return;
    copy_cut(call->log_model, sizeof(call->log_model), name);
    copy_cut(call->log_version, sizeof(call->log_version), version);
}

/* ---- answering ---------------------------------------------------------------------------- */

void oi__grpc_finish_status(oi_grpc_call_t *call, oi_status_t *st)
{
    oi_grpc_finish(call, oi_grpc_status_from_http(st->code), st->message);
    oi_status_free(st);
}

/* Sends a protobuf-c message as the only response and ends the call with OK. */
void oi__grpc_reply(oi_grpc_call_t *call, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    oi_buf_t *b = oi_buf_new(n);
    if (b == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    b->len = protobuf_c_message_pack(msg, (uint8_t *)b->data);
    oi_iov_t part = {b->data, b->len, b};
    oi_grpc_send(call, &part, 1, b->len);
    oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

/* ---- the server's JSON metadata, read back ------------------------------------------------ */

/* Finds the value of top-level key `key` in a JSON object the server itself wrote (the
 * metadata bodies of GET /v2 and of model metadata); returns a pointer to it or NULL. */
static const char *json_find(const char *p, const char *end, const char *key)
{
    size_t klen = strlen(key);
    int depth = 0;
    while (p < end) {
        char ch = *p;
        if (ch == '"') {
            const char *s = ++p;
            while (p < end && *p != '"')
                p += *p == '\\' ? 2 : 1;
            if (p >= end)
                return NULL;
            const char *e = p++;
            if (depth == 1 && (size_t)(e - s) == klen && memcmp(s, key, klen) == 0 && p < end && *p == ':')
                return p + 1;
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']')
            depth--;
        p++;
    }
    return NULL;
}

/* Reads a JSON string at *pp into a new NUL-terminated string (escapes decoded; \u escapes
 * as UTF-8) and moves *pp past it; NULL when it is not a string or memory runs out. */
static char *json_string(const char **pp, const char *end)
{
    const char *p = *pp;
    if (p >= end || *p != '"')
        return NULL;
    p++;
    oi_sbuf_t o = {0};
    while (p < end && *p != '"') {
        char ch = *p++;
        if (ch == '\\' && p < end) {
            char e = *p++;
            unsigned cp = 0;
            switch (e) {
            case 'n': ch = '\n'; break;
            case 't': ch = '\t'; break;
            case 'r': ch = '\r'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'u':
                if (end - p < 4 || sscanf(p, "%4x", &cp) != 1)
                    goto fail;
                p += 4;
                char u[4];
                size_t n;
                if (cp < 0x80) {
                    u[0] = (char)cp;
                    n = 1;
                } else if (cp < 0x800) {
                    u[0] = (char)(0xc0 | cp >> 6);
                    u[1] = (char)(0x80 | (cp & 0x3f));
                    n = 2;
                } else { /* surrogates are written as they are: metadata names are BMP text */
                    u[0] = (char)(0xe0 | cp >> 12);
                    u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    u[2] = (char)(0x80 | (cp & 0x3f));
                    n = 3;
                }
                if (oi_sbuf_append(&o, u, n) != 0)
                    goto fail;
                continue;
            default: ch = e; break;
            }
        }
        if (oi_sbuf_append(&o, &ch, 1) != 0)
            goto fail;
    }
    if (p >= end || oi_sbuf_append(&o, "", 1) != 0)
        goto fail;
    *pp = p + 1;
    return o.data;
fail:
    oi_sbuf_free(&o);
    return NULL;
}

/* A top-level string value as a new string ("" when absent); NULL when out of memory. */
static char *json_get_string(const oi_buf_t *b, const char *key)
{
    const char *end = b ? b->data + b->len : NULL;
    const char *p = b ? json_find(b->data, end, key) : NULL;
    char *s = p ? json_string(&p, end) : NULL;
    return s ? s : strdup("");
}

/* A top-level array of strings as new strings in *out (free each and the array). */
static size_t json_get_strings(const oi_buf_t *b, const char *key, char ***out)
{
    *out = NULL;
    const char *end = b ? b->data + b->len : NULL;
    const char *p = b ? json_find(b->data, end, key) : NULL;
    if (p == NULL || *p != '[')
        return 0;
    p++;
    size_t n = 0;
    while (p < end && *p != ']') {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        char *s = json_string(&p, end);
        char **grown = s ? realloc(*out, (n + 1) * sizeof(char *)) : NULL;
        if (grown == NULL) {
            free(s);
            break;
        }
        *out = grown;
        (*out)[n++] = s;
    }
    return n;
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* ---- health and metadata ------------------------------------------------------------------ */

static void server_metadata(oi_server_t *s, oi_grpc_call_t *call)
{
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    char *name = s->metadata ? json_get_string(s->metadata, "name") : strdup("openinfer");
    char *version = json_get_string(s->metadata, "version");
    r.n_extensions = json_get_strings(s->metadata, "extensions", &r.extensions);
    if (name == NULL || version == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
    } else {
        r.name = name;
        r.version = version;
        oi__grpc_reply(call, &r.base);
    }
    free(name);
    free(version);
    free_strings(r.extensions, r.n_extensions);
}

static void tensor_metadata(Inference__ModelMetadataResponse__TensorMetadata *t, const oi_io_spec_t *spec,
                            int64_t *any)
{
    inference__model_metadata_response__tensor_metadata__init(t);
    t->name = spec->name;
    t->datatype = (char *)oi_dtype_name(spec->dtype);
    if (spec->ndim < 0) { /* any shape: the nearest V2 metadata can say, as over HTTP */
        t->n_shape = 1;
        t->shape = any;
    } else {
        t->n_shape = (size_t)spec->ndim;
        t->shape = (int64_t *)spec->dims;
    }
}

static void model_metadata(oi_grpc_call_t *call, oi_model_t *m)
{
    if (m->error != NULL || m->metadata == NULL) {
        oi__grpc_finish_status(call, oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
                                          m->version_str, m->error ? m->error : "no metadata"));
        return;
    }
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    uint32_t nt = m->n_inputs + m->n_outputs;
    Inference__ModelMetadataResponse__TensorMetadata *tm = calloc(nt ? nt : 1, sizeof(*tm));
    Inference__ModelMetadataResponse__TensorMetadata **ptrs = calloc(nt ? nt : 1, sizeof(*ptrs));
    char *platform = json_get_string(m->metadata, "platform");
    int64_t any = -1;
    r.n_versions = json_get_strings(m->metadata, "versions", &r.versions);
    if (tm == NULL || ptrs == NULL || platform == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
    } else {
        for (uint32_t i = 0; i < nt; i++) {
            tensor_metadata(&tm[i], i < m->n_inputs ? &m->inputs[i] : &m->outputs[i - m->n_inputs], &any);
            ptrs[i] = &tm[i];
        }
        r.name = m->name;
        r.platform = platform;
        r.n_inputs = m->n_inputs;
        r.inputs = ptrs;
        r.n_outputs = m->n_outputs;
        r.outputs = ptrs + m->n_inputs;
        oi__grpc_reply(call, &r.base);
    }
    free(tm);
    free(ptrs);
    free(platform);
    free_strings(r.versions, r.n_versions);
}

/* ModelConfigResponse { config = 1 }: the version's serialized ModelConfig, sent as it is
 * behind the field's tag and length. */
static void model_config(oi_grpc_call_t *call, oi_model_t *m)
{
    if (m->error != NULL || m->config_pb == NULL) {
        oi__grpc_finish_status(call, m->error ? oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
                                                     m->version_str, m->error)
                                     : oi_status_new(OI_NOT_FOUND, "model '%s' version %s has no configuration",
                                                     m->name, m->version_str));
        return;
    }
    oi_buf_t *head = oi_buf_new(11);
    if (head == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    uint8_t *p = (uint8_t *)head->data;
    *p++ = 0x0a; /* field 1, length-delimited */
    for (size_t n = m->config_pb->len;; n >>= 7) {
        *p++ = (uint8_t)((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
        if (n <= 0x7f)
            break;
    }
    head->len = (size_t)(p - (uint8_t *)head->data);
    oi_iov_t parts[2] = {{head->data, head->len, head},
                         {m->config_pb->data, m->config_pb->len, oi_buf_ref(m->config_pb)}};
    oi_grpc_send(call, parts, 2, head->len + m->config_pb->len);
    oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

/* ModelReady, ModelMetadata and ModelConfig: the same request shape, a model to look up. */
static void model_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    /* The three requests are the same fields: name = 1, version = 2. */
    Inference__ModelReadyRequest *req =
        inference__model_ready_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT,
                       call->kind == RPC_MODEL_READY      ? "malformed ModelReadyRequest"
                       : call->kind == RPC_MODEL_METADATA ? "malformed ModelMetadataRequest"
                                                          : "malformed ModelConfigRequest");
        return;
    }
    oi_status_t *err = NULL;
    oi__grpc_note_model(s, call, req->name, req->version);
    oi_model_t *m = req->name[0] ? oi_registry_find(&s->registry, req->name, req->version, &err) : NULL;
    if (m == NULL && call->kind == RPC_MODEL_READY && (err == NULL || err->code == OI_NOT_FOUND)) {
        /* As Triton: a model or version that is not served is simply not ready. */
        oi_status_free(err);
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        oi__grpc_reply(call, &r.base);
    } else if (m == NULL) {
        if (err == NULL)
            err = oi_status_new(OI_BAD_REQUEST, "the request has no model name");
        oi__grpc_finish_status(call, err);
    } else if (call->kind == RPC_MODEL_READY) {
        int ready = m->error == NULL && m->sched != NULL;
        if (!ready || !m->ready_probe || oi__grpc_probe_ready(s, call, m) != 0) {
            Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
            r.ready = ready && !m->ready_probe; /* a model that could not be asked is not ready */
            oi__grpc_reply(call, &r.base);
        }
    } else if (call->kind == RPC_MODEL_METADATA) {
        model_metadata(call, m);
    } else {
        model_config(call, m);
    }
    oi_model_unref(m);
    inference__model_ready_request__free_unpacked(req, NULL);
}

/* ---- the handler ------------------------------------------------------------------------ */

/* The restricted APIs' metadata: after OI_GRPC_ERROR_SLOT in what the transport keeps. */
static const char *captured_metadata(const void *call, int i, size_t *len)
{
    return oi_grpc_call_header(call, i + 1, len);
}

/* Ends the call with UNAVAILABLE and tritonserver's words when one of `groups` is restricted
 * and the call lacks its metadata or carries another value; returns whether it did. The words
 * name the header, never the value. */
static int refuse_restricted(oi_server_t *s, oi_grpc_call_t *call, unsigned groups)
{
    const oi_restricted_t *t = &s->grpc_restricted;
    int g = groups ? oi_restricted_refuses(t, groups, captured_metadata, call) : -1;
    if (g < 0)
        return 0;
    char msg[400];
    snprintf(msg, sizeof(msg), "This protocol is restricted, expecting header '%.300s'", t->header[g]);
    oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, msg);
    return 1;
}

static void on_call(void *ctx, oi_grpc_call_t *call)
{
    oi_server_t *s = ctx;
    call->data = s;
    const char *m = call->method;
    const char *rpc;
    if (oi__legacy_grpc_call(s, call)) { /* nvidia.inferenceserver.GRPCService, the legacy v1 API */
        if (refuse_restricted(s, call, oi__legacy_grpc_groups(call->kind)))
            call->kind = OI__LEGACY_RPC_BASE; /* still routed there, finished */
        return;
    }
    unsigned groups = 0;
    if (strncmp(m, HEALTH_SERVICE, sizeof(HEALTH_SERVICE) - 1) == 0) {
        rpc = m + sizeof(HEALTH_SERVICE) - 1;
        call->kind = strcmp(rpc, "Check") == 0   ? RPC_HEALTH_CHECK
                     : strcmp(rpc, "Watch") == 0 ? RPC_HEALTH_WATCH
                                                 : RPC_UNKNOWN;
        groups = OI_API_BIT(OI_API_HEALTH);
    } else if (strncmp(m, SERVICE, sizeof(SERVICE) - 1) != 0) {
        char msg[300];
        snprintf(
            msg, sizeof(msg),
            "unknown service in %.200s; this server offers inference.GRPCInferenceService and grpc.health.v1.Health",
            m);
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
        return;
    } else {
        rpc = m + sizeof(SERVICE) - 1;
        for (size_t i = 0; i < sizeof(rpcs) / sizeof(rpcs[0]); i++)
            if (strcmp(rpc, rpcs[i].name) == 0) {
                call->kind = rpcs[i].kind;
                groups = OI_API_BIT(rpcs[i].group);
            }
    }
    if (call->kind == RPC_UNKNOWN) {
        char msg[300];
        snprintf(msg, sizeof(msg), "method %.200s is not implemented by this server", rpc);
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
    } else if (refuse_restricted(s, call, groups)) {
        call->kind = RPC_UNKNOWN; /* its messages go nowhere */
    } else if (atomic_load(&s->stopping)) {
        oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, "the server is shutting down");
    } else if (call->kind == RPC_MODEL_INFER || call->kind == RPC_MODEL_STREAM_INFER) {
        /* --grpc-infer-response-compression-level: inference responses only, as tritonserver. */
        oi_grpc_call_compress(call, s->cfg.grpc_infer_compression_level);
    }
}

static void on_message(void *ctx, oi_grpc_call_t *call, oi_buf_t *msg)
{
    oi_server_t *s = ctx;
    if (call->kind >= OI__LEGACY_RPC_BASE) {
        oi__legacy_grpc_message(s, call, msg);
        return;
    }
    if (call->kind != RPC_MODEL_STREAM_INFER && call->received > 1) {
        oi_buf_unref(msg);
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "a unary call carries one request message; got a second");
        return;
    }
    if (atomic_load(&s->stopping)) {
        oi_buf_unref(msg);
        oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, "the server is shutting down");
        return;
    }
    switch (call->kind) {
    case RPC_SERVER_LIVE: {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live = 1;
        oi__grpc_reply(call, &r.base);
        break;
    }
    case RPC_SERVER_READY: {
        int ready = oi__server_ready(s) != 0, asks = ready && oi__server_ready_asks(s);
        if (!asks || oi__grpc_probe_ready(s, call, NULL) != 0) {
            Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
            r.ready = ready && !asks; /* one that could not be asked is not ready */
            oi__grpc_reply(call, &r.base);
        }
        break;
    }
    case RPC_SERVER_METADATA:
        server_metadata(s, call);
        break;
    case RPC_MODEL_READY:
    case RPC_MODEL_METADATA:
    case RPC_MODEL_CONFIG:
        model_rpc(s, call, msg);
        break;
    case RPC_HEALTH_CHECK:
    case RPC_HEALTH_WATCH:
        oi__health_rpc(s, call, msg);
        break;
    case RPC_MODEL_INFER:
    case RPC_MODEL_STREAM_INFER:
        oi__grpc_handle_infer(s, call, msg); /* takes msg */
        return;
    case RPC_SYS_SHM_STATUS:
    case RPC_SYS_SHM_REGISTER:
    case RPC_SYS_SHM_UNREGISTER:
    case RPC_CUDA_SHM_STATUS:
    case RPC_CUDA_SHM_REGISTER:
    case RPC_CUDA_SHM_UNREGISTER:
        oi__grpc_shm_rpc(s, call, msg);
        break;
    case RPC_REPO_INDEX:
    case RPC_REPO_LOAD:
    case RPC_REPO_UNLOAD: oi__grpc_repo_rpc(s, call, msg); break;
    case RPC_LOG_SETTINGS: oi__grpc_log_settings_rpc(s, call, msg); break;
    case RPC_TRACE_SETTING: oi__grpc_trace_setting_rpc(s, call, msg); break;
    case RPC_MODEL_STATISTICS:
        oi__grpc_model_statistics(s, call, msg);
        break;
    default:
        break;
    }
    oi_buf_unref(msg);
}

static void on_half_close(void *ctx, oi_grpc_call_t *call)
{
    if (call->kind >= OI__LEGACY_RPC_BASE)
        oi__legacy_grpc_half_close(ctx, call);
    else if (call->kind == RPC_MODEL_STREAM_INFER)
        oi__grpc_maybe_end_stream(call);
    else if (call->received == 0)
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "the call ended without a request message");
}

static int release_session(void *ctx, oi_model_t *m)
{
    oi_seq_release_session(m->seq, *(const uint64_t *)ctx);
    return 0;
}

/* The client reset the stream, closed its connection or ran out of time: what the call has
 * queued is dropped, a running model is told. Each request still comes to finish_infer. The
 * sequences a stream started and still owns are released too, as if idle: nobody is left to
 * end them, and they would hold their slots (or places in the backlog) until then. */
static void on_gone(void *ctx, oi_grpc_call_t *call)
{
    oi_server_t *s = ctx;
    if (call->kind >= OI__LEGACY_RPC_BASE) {
        oi__legacy_grpc_gone(s, call);
        return;
    }
    if (call->kind == RPC_REPO_INDEX || call->kind == RPC_REPO_LOAD || call->kind == RPC_REPO_UNLOAD) {
        if (call->work != NULL) /* a load under way may give up */
            oi_repo_call_stop(call->work);
        return;
    }
    for (oi_infer_t *inf = call->work; inf != NULL; inf = inf->next)
        if (!inf->cancelled) {
            atomic_fetch_add(&s->grpc_orphans, 1);
            oi_infer_cancel(inf);
        }
    if (call->session != 0)
        (void)oi_registry_visit_ready(&s->registry, NULL, release_session, &call->session);
}

const oi_grpc_handler_t oi__grpc_api_handler = {on_call, on_message, on_half_close, on_gone};
