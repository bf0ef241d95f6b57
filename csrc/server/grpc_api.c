/* The V2 gRPC service (inference.GRPCInferenceService) over the HTTP/2 transport. Requests go
 * through the same registry, validation and oi_infer_submit as the REST API: the transports
 * differ, the request path does not. ModelInferRequest/Response use the purpose-built wire
 * codec (codec/pb_infer.h); the other messages use protobuf-c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

#include "codec/pb_infer.h"
#include "server/infer.h"
#include "server/server_impl.h"
#include "transport/grpc.h"

#define SERVICE "/inference.GRPCInferenceService/"

enum {
    RPC_UNKNOWN = 0,
    RPC_SERVER_LIVE,
    RPC_SERVER_READY,
    RPC_MODEL_READY,
    RPC_SERVER_METADATA,
    RPC_MODEL_METADATA,
    RPC_MODEL_INFER,
    RPC_MODEL_STREAM_INFER,
    RPC_SYS_SHM_STATUS,
    RPC_SYS_SHM_REGISTER,
    RPC_SYS_SHM_UNREGISTER,
    RPC_CUDA_SHM_STATUS,
    RPC_CUDA_SHM_REGISTER,
    RPC_CUDA_SHM_UNREGISTER,
};

static const struct {
    const char *name;
    int kind;
} rpcs[] = {
    {"ServerLive", RPC_SERVER_LIVE},
    {"ServerReady", RPC_SERVER_READY},
    {"ModelReady", RPC_MODEL_READY},
    {"ServerMetadata", RPC_SERVER_METADATA},
    {"ModelMetadata", RPC_MODEL_METADATA},
    {"ModelInfer", RPC_MODEL_INFER},
    {"ModelStreamInfer", RPC_MODEL_STREAM_INFER},
    {"SystemSharedMemoryStatus", RPC_SYS_SHM_STATUS},
    {"SystemSharedMemoryRegister", RPC_SYS_SHM_REGISTER},
    {"SystemSharedMemoryUnregister", RPC_SYS_SHM_UNREGISTER},
    {"CudaSharedMemoryStatus", RPC_CUDA_SHM_STATUS},
    {"CudaSharedMemoryRegister", RPC_CUDA_SHM_REGISTER},
    {"CudaSharedMemoryUnregister", RPC_CUDA_SHM_UNREGISTER},
};

/* ---- answering ---------------------------------------------------------------------------- */

static void finish_status(oi_grpc_call_t *call, oi_status_t *st)
{
    oi_grpc_finish(call, oi_grpc_status_from_http(st->code), st->message);
    oi_status_free(st);
}

/* Sends a protobuf-c message as the only response and ends the call with OK. */
static void reply(oi_grpc_call_t *call, const ProtobufCMessage *msg)
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
        reply(call, &r.base);
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
        finish_status(call, oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
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
        reply(call, &r.base);
    }
    free(tm);
    free(ptrs);
    free(platform);
    free_strings(r.versions, r.n_versions);
}

/* ModelReady and ModelMetadata: the same request shape, a model to look up. */
static void model_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    /* ModelReadyRequest and ModelMetadataRequest are the same fields: name = 1, version = 2. */
    Inference__ModelReadyRequest *req =
        inference__model_ready_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT,
                       call->kind == RPC_MODEL_READY ? "malformed ModelReadyRequest" : "malformed ModelMetadataRequest");
        return;
    }
    oi_status_t *err = NULL;
    oi_model_t *m = req->name[0] ? oi_registry_find(&s->registry, req->name, req->version, &err) : NULL;
    if (m == NULL) {
        if (err == NULL)
            err = oi_status_new(OI_BAD_REQUEST, "the request has no model name");
        finish_status(call, err);
    } else if (call->kind == RPC_MODEL_READY) {
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = m->error == NULL && m->sched != NULL;
        reply(call, &r.base);
    } else {
        model_metadata(call, m);
    }
    oi_model_unref(m);
    inference__model_ready_request__free_unpacked(req, NULL);
}

/* ---- shared memory ------------------------------------------------------------------------ */

static void shm_status(oi_server_t *s, oi_grpc_call_t *call, oi_shm_kind_t kind, const char *name)
{
    oi_shm_region_t **regions;
    size_t n;
    oi_status_t *st = oi_shm_list(&s->shm, oi_grpc_call_peer(call), kind, name, &regions, &n);
    if (st != NULL) {
        finish_status(call, st);
        return;
    }
    size_t one = kind == OI_SHM_SYSTEM ? sizeof(Inference__SystemSharedMemoryStatusResponse__RegionsEntry) +
                                             sizeof(Inference__SystemSharedMemoryStatusResponse__RegionStatus)
                                       : sizeof(Inference__CudaSharedMemoryStatusResponse__RegionsEntry) +
                                             sizeof(Inference__CudaSharedMemoryStatusResponse__RegionStatus);
    void **ptrs = calloc(n ? n : 1, sizeof(void *));
    char *mem = calloc(n ? n : 1, one);
    if (ptrs == NULL || mem == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
    } else if (kind == OI_SHM_SYSTEM) {
        Inference__SystemSharedMemoryStatusResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__INIT;
        for (size_t i = 0; i < n; i++) {
            Inference__SystemSharedMemoryStatusResponse__RegionsEntry *e = (void *)(mem + i * one);
            Inference__SystemSharedMemoryStatusResponse__RegionStatus *v = (void *)(e + 1);
            inference__system_shared_memory_status_response__regions_entry__init(e);
            inference__system_shared_memory_status_response__region_status__init(v);
            v->name = e->key = regions[i]->name;
            v->key = regions[i]->key;
            v->offset = regions[i]->offset;
            v->byte_size = regions[i]->byte_size;
            e->value = v;
            ptrs[i] = e;
        }
        r.n_regions = n;
        r.regions = (Inference__SystemSharedMemoryStatusResponse__RegionsEntry **)ptrs;
        reply(call, &r.base);
    } else {
        Inference__CudaSharedMemoryStatusResponse r = INFERENCE__CUDA_SHARED_MEMORY_STATUS_RESPONSE__INIT;
        for (size_t i = 0; i < n; i++) {
            Inference__CudaSharedMemoryStatusResponse__RegionsEntry *e = (void *)(mem + i * one);
            Inference__CudaSharedMemoryStatusResponse__RegionStatus *v = (void *)(e + 1);
            inference__cuda_shared_memory_status_response__regions_entry__init(e);
            inference__cuda_shared_memory_status_response__region_status__init(v);
            v->name = e->key = regions[i]->name;
            v->device_id = (uint64_t)regions[i]->device_id;
            v->byte_size = regions[i]->byte_size;
            e->value = v;
            ptrs[i] = e;
        }
        r.n_regions = n;
        r.regions = (Inference__CudaSharedMemoryStatusResponse__RegionsEntry **)ptrs;
        reply(call, &r.base);
    }
    free(ptrs);
    free(mem);
    oi_shm_release_all(regions, n);
}

/* Answers a register or unregister call: its empty response, or the status. */
static void shm_done(oi_grpc_call_t *call, oi_status_t *st, const ProtobufCMessage *empty)
{
    if (st != NULL)
        finish_status(call, st);
    else
        reply(call, empty);
}

/* The six shared-memory RPCs. Their requests are small: protobuf-c unpacks them. */
static void shm_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    const uint8_t *data = (const uint8_t *)msg->data;
    switch (call->kind) {
    case RPC_SYS_SHM_STATUS:
    case RPC_CUDA_SHM_STATUS:
    case RPC_SYS_SHM_UNREGISTER:
    case RPC_CUDA_SHM_UNREGISTER: {
        /* The four requests are the same message: name = 1. */
        Inference__SystemSharedMemoryStatusRequest *q =
            inference__system_shared_memory_status_request__unpack(NULL, msg->len, data);
        if (q == NULL) {
            oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed shared-memory request message");
            return;
        }
        oi_shm_kind_t kind = call->kind == RPC_SYS_SHM_STATUS || call->kind == RPC_SYS_SHM_UNREGISTER ? OI_SHM_SYSTEM
                                                                                                      : OI_SHM_CUDA;
        if (call->kind == RPC_SYS_SHM_STATUS || call->kind == RPC_CUDA_SHM_STATUS) {
            shm_status(s, call, kind, q->name);
        } else if (kind == OI_SHM_SYSTEM) {
            Inference__SystemSharedMemoryUnregisterResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
            shm_done(call, oi_shm_unregister(&s->shm, oi_grpc_call_peer(call), kind, q->name), &r.base);
        } else {
            Inference__CudaSharedMemoryUnregisterResponse r = INFERENCE__CUDA_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
            shm_done(call, oi_shm_unregister(&s->shm, oi_grpc_call_peer(call), kind, q->name), &r.base);
        }
        inference__system_shared_memory_status_request__free_unpacked(q, NULL);
        return;
    }
    case RPC_SYS_SHM_REGISTER: {
        Inference__SystemSharedMemoryRegisterRequest *q =
            inference__system_shared_memory_register_request__unpack(NULL, msg->len, data);
        if (q == NULL) {
            oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed SystemSharedMemoryRegisterRequest");
            return;
        }
        Inference__SystemSharedMemoryRegisterResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
        shm_done(call, oi_shm_register_system(&s->shm, oi_grpc_call_peer(call), q->name, q->key, q->offset,
                                        q->byte_size), &r.base);
        inference__system_shared_memory_register_request__free_unpacked(q, NULL);
        return;
    }
    case RPC_CUDA_SHM_REGISTER: {
        Inference__CudaSharedMemoryRegisterRequest *q =
            inference__cuda_shared_memory_register_request__unpack(NULL, msg->len, data);
        if (q == NULL) {
            oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed CudaSharedMemoryRegisterRequest");
            return;
        }
        Inference__CudaSharedMemoryRegisterResponse r = INFERENCE__CUDA_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
        shm_done(call,
                 oi_shm_register_cuda(&s->shm, oi_grpc_call_peer(call), q->name, q->raw_handle.data,
                                      q->raw_handle.len, q->device_id, q->byte_size),
                 &r.base);
        inference__cuda_shared_memory_register_request__free_unpacked(q, NULL);
        return;
    }
    default:
        return;
    }
}

/* ---- inference ---------------------------------------------------------------------------- */

/* A streamed request failed: one ModelStreamInferResponse with error_message, and the
 * stream goes on. */
static void stream_error(oi_grpc_call_t *call, const char *message, const oi_model_t *m, const oi_request_t *req)
{
    oi_sbuf_t out = {0};
    if (oi_pb_encode_stream_error(&out, message, m ? m->name : NULL, m ? m->version_str : NULL,
                                  req ? req->id : NULL, req ? req->id_len : 0) != 0) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    oi_buf_t *b = oi_sbuf_detach(&out);
    if (b == NULL) {
        oi_sbuf_free(&out);
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_grpc_send(call, &part, 1, b->len);
}

/* A request failed: the status ends a unary call; a stream answers it and goes on. */
static void infer_failed(oi_grpc_call_t *call, oi_status_t *st, const oi_model_t *m, const oi_request_t *req)
{
    if (call->kind == RPC_MODEL_STREAM_INFER) {
        stream_error(call, st->message, m, req);
        oi_status_free(st);
    } else {
        finish_status(call, st);
    }
}

/* A stream ends once the client has sent its last request and every answer is out. */
static void maybe_end_stream(oi_grpc_call_t *call)
{
    if (call->kind == RPC_MODEL_STREAM_INFER && call->half_closed && call->pending == 0)
        oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

/* On the call's loop thread once the backend has run: encode and send. */
static void finish_infer(oi_infer_t *inf)
{
    oi_grpc_call_t *call = inf->ctx;
    oi_server_t *s = call->data;
    call->pending--;
    if (oi_grpc_call_open(call)) {
        oi_status_t *st = inf->job.status;
        inf->job.status = NULL;
        oi_pb_iov_t small[9];
        size_t cap = OI_PB_RESPONSE_PARTS(inf->job.resp.n_outputs), n = 0, total = 0;
        oi_pb_iov_t *parts = cap <= 9 ? small : malloc(cap * sizeof(*parts));
        if (st == NULL && parts == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        if (st == NULL)
            st = oi_pb_encode_infer_response(inf->model->name, inf->model->version_str, &inf->req, &inf->job.resp,
                                             call->kind == RPC_MODEL_STREAM_INFER, parts, &n, &total);
        if (st != NULL) {
            infer_failed(call, st, inf->model, &inf->req);
        } else {
            /* oi_pb_iov_t and oi_iov_t have one layout; the copy keeps the codec free of the
             * transport's types. */
            oi_iov_t iov_small[9];
            oi_iov_t *iov = n <= 9 ? iov_small : malloc(n * sizeof(*iov));
            if (iov == NULL) {
                for (size_t i = 0; i < n; i++)
                    oi_buf_unref(parts[i].owner);
                oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
            } else {
                for (size_t i = 0; i < n; i++)
                    iov[i] = (oi_iov_t){parts[i].base, parts[i].len, parts[i].owner};
                oi_grpc_send(call, iov, n, total);
                if (call->kind == RPC_MODEL_INFER)
                    oi_grpc_finish(call, OI_GRPC_OK, NULL);
                if (iov != iov_small)
                    free(iov);
            }
        }
        if (parts != small)
            free(parts);
        maybe_end_stream(call);
    }
    oi_infer_free(inf);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

static const oi_peer_t *call_peer(void *call) { return oi_grpc_call_peer(call); }

static void handle_infer(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg)
{
    oi_infer_t *inf = oi_infer_new();
    if (inf == NULL) {
        oi_buf_unref(msg);
        infer_failed(call, oi_status_new(OI_INTERNAL, "out of memory"), NULL, NULL);
        return;
    }
    oi_slice_t name, version;
    oi_status_t *st = oi_pb_decode_infer_request(msg, &inf->req, &name, &version);
    if (st != NULL) {
        /* The request is cleared; a stream's answer still names it by its id. */
        oi_request_t id_only = {0};
        oi_slice_t id;
        if (oi_pb_peek_request_id(msg->data, msg->len, &id) == 0) {
            id_only.id = id.ptr;
            id_only.id_len = id.len;
        }
        infer_failed(call, st, NULL, &id_only);
        oi_buf_unref(msg);
        oi_infer_free(inf);
        return;
    }
    oi_buf_unref(msg); /* the request holds its own reference */
    oi_model_t *m = oi_registry_find(&s->registry, name.ptr, version.ptr, &st);
    if (st != NULL) {
        infer_failed(call, st, NULL, &inf->req);
        oi_infer_free(inf);
        return;
    }
    oi_grpc_call_ref(call);
    call->pending++;
    atomic_fetch_add(&s->grpc_inflight, 1);
    inf->shm = &s->shm;
    inf->shm_caller = (oi_shm_caller_t){call_peer, call};
    st = oi_infer_submit(inf, m, call->loop, finish_infer, call); /* takes the model reference */
    if (st != NULL) {
        call->pending--;
        atomic_fetch_sub(&s->grpc_inflight, 1);
        infer_failed(call, st, m, &inf->req);
        oi_infer_free(inf);
        oi_grpc_call_unref(call);
    }
}

/* ---- the handler ------------------------------------------------------------------------ */

static void on_call(void *ctx, oi_grpc_call_t *call)
{
    oi_server_t *s = ctx;
    call->data = s;
    const char *m = call->method;
    if (strncmp(m, SERVICE, sizeof(SERVICE) - 1) != 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "unknown service in %.200s; this server offers inference.GRPCInferenceService", m);
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
        return;
    }
    const char *rpc = m + sizeof(SERVICE) - 1;
    for (size_t i = 0; i < sizeof(rpcs) / sizeof(rpcs[0]); i++)
        if (strcmp(rpc, rpcs[i].name) == 0)
            call->kind = rpcs[i].kind;
    if (call->kind == RPC_UNKNOWN) {
        char msg[300];
        snprintf(msg, sizeof(msg), "method %.200s is not implemented by this server", rpc);
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
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
        reply(call, &r.base);
        break;
    }
    case RPC_SERVER_READY: {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready = oi_registry_all_ready(&s->registry) != 0;
        reply(call, &r.base);
        break;
    }
    case RPC_SERVER_METADATA:
        server_metadata(s, call);
        break;
    case RPC_MODEL_READY:
    case RPC_MODEL_METADATA:
        model_rpc(s, call, msg);
        break;
    case RPC_MODEL_INFER:
    case RPC_MODEL_STREAM_INFER:
        handle_infer(s, call, msg); /* takes msg */
        return;
    case RPC_SYS_SHM_STATUS:
    case RPC_SYS_SHM_REGISTER:
    case RPC_SYS_SHM_UNREGISTER:
    case RPC_CUDA_SHM_STATUS:
    case RPC_CUDA_SHM_REGISTER:
    case RPC_CUDA_SHM_UNREGISTER:
        shm_rpc(s, call, msg);
        break;
    default:
        break;
    }
    oi_buf_unref(msg);
}

static void on_half_close(void *ctx, oi_grpc_call_t *call)
{
    (void)ctx;
    if (call->kind == RPC_MODEL_STREAM_INFER)
        maybe_end_stream(call);
    else if (call->received == 0)
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "the call ended without a request message");
}

const oi_grpc_handler_t oi__grpc_api_handler = {on_call, on_message, on_half_close};
